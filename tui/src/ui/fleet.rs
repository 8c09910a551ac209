//! The fleet's table: one row per process of `crate::fleet::Fleet`, or the open process's full
//! dashboard.
//!
//! [`draw`] shows, when no process is open, a title row (how many processes, how many are up
//! and down, and the allocated and reserved bytes of them all), a bordered table with one row
//! per process (the selected row reversed, a process that is down in the alert style), and a
//! help bar with the keys; when one is open it draws that process's dashboard with
//! [`super::draw`]. It reads a `crate::view::FleetView`, which the fleet makes with
//! `crate::fleet::Fleet::rows`, and never the fleet itself. Like every widget here it only
//! reads, so the screen tests draw any fleet state into ratatui's `TestBackend`.

use ratatui::buffer::Buffer;
use ratatui::layout::Rect;
use ratatui::style::Style;
use ratatui::widgets::Widget;
use ratatui::Frame;
use vramscope_model::format_bytes;

use super::{clip, clip_left, panel_block, put, Theme};
use crate::view::{FleetSource, FleetView, ProcessRow as Row};

/// The table's area in a screen of `area`: everything but the title row and the help bar.
pub fn table_area(area: Rect) -> Rect {
    Rect::new(
        area.x,
        area.y.saturating_add(1).min(area.bottom()),
        area.width,
        area.height.saturating_sub(2),
    )
}

/// The first process shown in `table`, so that the `selected` one is visible.
pub fn first_row(selected: usize, table: Rect) -> usize {
    let visible = usize::from(table.height.saturating_sub(3)).max(1);
    selected.saturating_sub(visible - 1)
}

/// Draws a fleet (`crate::fleet::Fleet`, or its [`FleetView`]): the table, or the open
/// process's dashboard.
pub fn draw<S: FleetSource + ?Sized>(frame: &mut Frame<'_>, fleet: &S) {
    match fleet.fleet_view() {
        FleetView::Open(model) => super::draw(frame, &model),
        FleetView::Table {
            rows,
            selected,
            theme,
        } => {
            let area = frame.area();
            FleetTable {
                rows: &rows,
                selected,
                theme,
            }
            .render(area, frame.buffer_mut());
        }
    }
}

/// The table of processes, with its title row and help bar.
pub struct FleetTable<'a> {
    /// One row per process.
    pub rows: &'a [Row],
    /// The selected row.
    pub selected: usize,
    /// Colours or not.
    pub theme: Theme,
}

/// The widths of the columns that do not stretch, in order after the label, program and link.
const FIXED: [(&str, usize); 7] = [
    ("step", 6),
    ("allocated", 9),
    ("reserved", 9),
    ("peak alloc", 10),
    ("OOMs", 4),
    ("findings", 8),
    ("updated", 8),
];

fn cells(row: &Row) -> [String; 7] {
    [
        row.step.to_string(),
        format_bytes(row.allocated),
        format_bytes(row.reserved),
        format_bytes(row.peak_allocated),
        row.ooms.to_string(),
        row.findings.map_or("…".to_string(), |n| n.to_string()),
        row.last_update_s
            .map_or("never".to_string(), |s| format!("{s}s ago")),
    ]
}

impl Widget for FleetTable<'_> {
    fn render(self, area: Rect, buf: &mut Buffer) {
        let theme = self.theme;
        if area.height == 0 || area.width == 0 {
            return;
        }
        let rows = self.rows;
        // The title row.
        let up = rows
            .iter()
            .filter(|r| !r.down && r.link != "connecting…")
            .count();
        let down = rows.iter().filter(|r| r.down).count();
        let allocated: u64 = rows.iter().map(|r| r.allocated).sum();
        let reserved: u64 = rows.iter().map(|r| r.reserved).sum();
        let x = put(buf, area, area.x, area.y, " vramscope top ", theme.title());
        let x = put(
            buf,
            area,
            x,
            area.y,
            &format!("│ {} processes, {up} up", rows.len()),
            Style::new(),
        );
        let x = if down > 0 {
            let x = put(buf, area, x, area.y, ", ", Style::new());
            put(buf, area, x, area.y, &format!("{down} down"), theme.alert())
        } else {
            x
        };
        put(
            buf,
            area,
            x,
            area.y,
            &format!(
                " │ in all: {} allocated, {} reserved",
                format_bytes(allocated),
                format_bytes(reserved)
            ),
            theme.dim(),
        );

        self.table(area, buf);

        // The help bar.
        let y = area.bottom() - 1;
        if y > area.y {
            let mut x = area.x;
            for (key, what) in [
                ("q", "quit"),
                ("↑↓", "select"),
                ("Enter", "open"),
                ("Esc", "back from a process"),
            ] {
                x = put(buf, area, x, y, &format!(" {key} "), theme.key());
                x = put(buf, area, x, y, what, Style::new());
                x = put(buf, area, x, y, " │", theme.dim());
            }
        }
    }
}

impl FleetTable<'_> {
    /// The bordered table of processes in its part of `area` (`table_area`): a header row,
    /// then one row per process from the first that keeps the selected one in view.
    fn table(&self, area: Rect, buf: &mut Buffer) {
        let theme = self.theme;
        let rows = self.rows;
        let table = table_area(area);
        let block = panel_block("Processes".to_string(), theme, true);
        let inner = block.inner(table);
        block.render(table, buf);
        if inner.height > 0 && inner.width > 0 {
            let width = usize::from(inner.width);
            let fixed: usize = FIXED.iter().map(|(_, w)| w + 1).sum::<usize>() + 4;
            let flexible = width.saturating_sub(fixed);
            // The program column is there once a publisher introduced itself.
            let programs = rows.iter().any(|r| r.program.is_some());
            let need = |header: &str, text: &dyn Fn(&Row) -> usize| {
                rows.iter().map(text).max().unwrap_or(0).max(header.len())
            };
            let mut widths = [
                need("process", &|r| r.label.chars().count()),
                if programs {
                    need("program", &|r| {
                        r.program.as_deref().map_or(0, |p| p.chars().count())
                    })
                } else {
                    0
                },
                need("link", &|r| r.link.chars().count()),
            ];
            // Each column as wide as its widest text; while they do not fit, the wider of the
            // label and the program gives way down to ten characters, then the widest of all
            // three down to six: the link's reason is what matters when a process is down.
            let room = flexible.saturating_sub(2 + usize::from(programs));
            let mut floor = 10;
            while widths.iter().sum::<usize>() > room {
                let candidates = if floor == 10 { 2 } else { 3 };
                let (i, w) = widths[..candidates]
                    .iter()
                    .copied()
                    .enumerate()
                    .max_by_key(|&(_, w)| w)
                    .unwrap_or((0, 0));
                if w <= floor {
                    if floor == 6 {
                        break;
                    }
                    floor = 6;
                    continue;
                }
                widths[i] = w - 1;
            }
            // What is left goes to the label.
            widths[0] += room.saturating_sub(widths.iter().sum::<usize>());
            let [label_w, program_w, link_w] = widths;
            let line = |index: &str, texts: [&str; 3], figures: &[String]| -> Vec<(String, bool)> {
                let mut out = vec![(format!("{index:>3} "), false)];
                // Addresses differ at their end (rank0.sock, rank1.sock): cut their start.
                out.push((
                    format!("{:<label_w$} ", clip_left(texts[0], label_w)),
                    false,
                ));
                if programs {
                    out.push((format!("{:<program_w$} ", clip(texts[1], program_w)), false));
                }
                out.push((format!("{:<link_w$} ", clip(texts[2], link_w)), true));
                for ((_, w), f) in FIXED.iter().zip(figures) {
                    out.push((format!("{:>w$} ", clip(f, *w)), false));
                }
                out
            };
            let titles: Vec<String> = FIXED.iter().map(|(t, _)| t.to_string()).collect();
            let mut x = inner.x;
            for (text, _) in line("#", ["process", "program", "link"], &titles) {
                x = put(buf, inner, x, inner.y, &text, theme.header());
            }
            let first = first_row(self.selected, table);
            for (i, row) in rows.iter().enumerate().skip(first) {
                let y = inner.y + 1 + (i - first) as u16;
                if y >= inner.bottom() {
                    break;
                }
                let selected = i == self.selected;
                let base = if selected {
                    theme.selected()
                } else {
                    Style::new()
                };
                let link_style = if row.down {
                    theme.alert()
                } else if row.link == "connecting…" {
                    theme.pending()
                } else {
                    Style::new()
                };
                let program = row.program.clone().unwrap_or_default();
                let mut x = inner.x;
                for (text, is_link) in line(
                    &(i + 1).to_string(),
                    [&row.label, &program, &row.link],
                    &cells(row),
                ) {
                    let style = if is_link {
                        base.patch(link_style)
                    } else {
                        base
                    };
                    x = put(buf, inner, x, y, &text, style);
                }
                if selected && x < inner.right() {
                    put(
                        buf,
                        inner,
                        x,
                        y,
                        &" ".repeat(usize::from(inner.right() - x)),
                        base,
                    );
                }
            }
        }
    }
}
