//! Drawing: the screen layout, the colour theme, and one widget per panel.
//!
//! [`draw`] lays the screen out with [`layout`] (header, tab bar, panel body, help bar; the
//! overview panel is a grid that grows with the terminal) and renders each part with the
//! widgets of the submodules, each an `impl Widget`: [`header`], [`timeline`], [`segments`],
//! [`sites`], [`findings`], [`events`] and [`help`]; [`fleet`] draws the table of several
//! processes that `vramscope top ADDR ADDR...` shows. Widgets read the `crate::app::App` (after
//! `App::prepare`) and the `crate::data::Dataset` and never change them, so the screen tests can
//! render any state into ratatui's `TestBackend`. [`Theme`] holds every style; with `NO_COLOR`
//! set it uses no colour at all, only bold, dim and reverse, and the panels also tell states
//! apart by their characters.

pub mod events;
pub mod findings;
pub mod fleet;
pub mod header;
pub mod help;
pub mod segments;
pub mod sites;
pub mod timeline;

use ratatui::buffer::Buffer;
use ratatui::layout::Rect;
use ratatui::style::{Color, Modifier, Style};
use ratatui::widgets::{Block, Borders, Widget};
use ratatui::Frame;
use vramscope_inspector::detect::Severity;

use crate::app::{App, Panel};

/// Every style the dashboard uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Theme {
    /// Whether to use colours.
    pub color: bool,
}

impl Theme {
    /// Colours unless `NO_COLOR` is set to a non-empty value.
    pub fn from_env() -> Theme {
        Theme {
            color: std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty()),
        }
    }

    /// A theme with colours.
    pub fn colored() -> Theme {
        Theme { color: true }
    }

    /// A theme without colours.
    pub fn plain() -> Theme {
        Theme { color: false }
    }

    fn fg(self, color: Color) -> Style {
        if self.color {
            Style::new().fg(color)
        } else {
            Style::new()
        }
    }

    /// Allocated bytes and blocks.
    pub fn allocated(self) -> Style {
        self.fg(Color::Green)
    }

    /// Reserved bytes.
    pub fn reserved(self) -> Style {
        self.fg(Color::Blue)
    }

    /// The capacity line and OOM marks.
    pub fn capacity(self) -> Style {
        self.fg(Color::Red)
    }

    /// Pending-free blocks.
    pub fn pending(self) -> Style {
        self.fg(Color::Yellow)
    }

    /// Free space in segments that hold live blocks (inactive split).
    pub fn split(self) -> Style {
        self.fg(Color::Magenta)
    }

    /// Free space in segments without live blocks.
    pub fn free(self) -> Style {
        if self.color {
            Style::new().fg(Color::DarkGray)
        } else {
            Style::new().add_modifier(Modifier::DIM)
        }
    }

    /// Panel titles.
    pub fn title(self) -> Style {
        self.fg(Color::Cyan).add_modifier(Modifier::BOLD)
    }

    /// The selected row.
    pub fn selected(self) -> Style {
        Style::new().add_modifier(Modifier::REVERSED)
    }

    /// Secondary text.
    pub fn dim(self) -> Style {
        self.free()
    }

    /// Key names in the help bar.
    pub fn key(self) -> Style {
        self.fg(Color::Yellow).add_modifier(Modifier::BOLD)
    }

    /// Column headers.
    pub fn header(self) -> Style {
        Style::new().add_modifier(Modifier::BOLD)
    }

    /// Alerts: disconnection, OOMs, errors.
    pub fn alert(self) -> Style {
        self.fg(Color::Red).add_modifier(Modifier::BOLD)
    }

    /// The time cursor.
    pub fn cursor(self) -> Style {
        self.fg(Color::Yellow).add_modifier(Modifier::BOLD)
    }

    /// A finding's severity.
    pub fn severity(self, severity: Severity) -> Style {
        match severity {
            Severity::Error => self.alert(),
            Severity::Warning => self.fg(Color::Yellow).add_modifier(Modifier::BOLD),
            Severity::Info => self.fg(Color::Blue),
        }
    }
}

/// Where everything goes on the screen.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Layout {
    /// The header (three rows).
    pub header: Rect,
    /// The tab bar.
    pub tabs: Rect,
    /// The panel area.
    pub body: Rect,
    /// The help bar.
    pub help: Rect,
    /// The panels inside the body, with their areas.
    pub panels: Vec<(Panel, Rect)>,
    /// The timeline's area, when one is shown.
    pub timeline: Option<Rect>,
}

/// Whether the overview has room for its four-panel grid.
pub fn is_large(area: Rect) -> bool {
    area.width >= 120 && area.height >= 36
}

/// Lays the screen out for `panel`.
pub fn layout(area: Rect, panel: Panel) -> Layout {
    let header_h = 3.min(area.height);
    let header = Rect::new(area.x, area.y, area.width, header_h);
    let tabs = Rect::new(
        area.x,
        area.y + header_h,
        area.width,
        1.min(area.height - header_h),
    );
    let used = header_h + tabs.height;
    let help_h = 1.min(area.height - used);
    let help = Rect::new(area.x, area.y + area.height - help_h, area.width, help_h);
    let body = Rect::new(
        area.x,
        area.y + used,
        area.width,
        area.height - used - help_h,
    );
    let panels = match panel {
        Panel::Overview if is_large(area) => {
            let top = body.height / 2;
            let left = body.width / 2;
            let (tl, tr) = split_h(Rect::new(body.x, body.y, body.width, top), left);
            let (bl, br) = split_h(
                Rect::new(body.x, body.y + top, body.width, body.height - top),
                left,
            );
            vec![
                (Panel::Timeline, tl),
                (Panel::Segments, tr),
                (Panel::Findings, bl),
                (Panel::Sites, br),
            ]
        }
        Panel::Overview => {
            let t = (body.height * 9 / 20).max(6).min(body.height);
            let rest = body.height - t;
            let f = rest / 2;
            vec![
                (Panel::Timeline, Rect::new(body.x, body.y, body.width, t)),
                (
                    Panel::Findings,
                    Rect::new(body.x, body.y + t, body.width, f),
                ),
                (
                    Panel::Sites,
                    Rect::new(body.x, body.y + t + f, body.width, rest - f),
                ),
            ]
        }
        p => vec![(p, body)],
    };
    let timeline = panels
        .iter()
        .find(|(p, _)| *p == Panel::Timeline)
        .map(|(_, r)| *r);
    Layout {
        header,
        tabs,
        body,
        help,
        panels,
        timeline,
    }
}

fn split_h(r: Rect, left: u16) -> (Rect, Rect) {
    (
        Rect::new(r.x, r.y, left, r.height),
        Rect::new(r.x + left, r.y, r.width - left, r.height),
    )
}

/// The label of each tab and where it starts.
fn tab_spans(area: Rect) -> Vec<(Panel, u16, String)> {
    let mut x = area.x + 1;
    let mut out = Vec::new();
    for (i, p) in Panel::ALL.iter().enumerate() {
        let label = format!(" {} {} ", i + 1, p.title());
        let w = label.chars().count() as u16;
        out.push((*p, x, label));
        x += w + 1;
    }
    out
}

/// The panel whose tab is at column `x`.
pub fn tab_at(tabs: Rect, x: u16) -> Option<Panel> {
    tab_spans(tabs)
        .into_iter()
        .find(|(_, start, label)| x >= *start && x < start + label.chars().count() as u16)
        .map(|(p, _, _)| p)
}

/// The tab bar.
pub struct Tabs<'a> {
    /// The app.
    pub app: &'a App,
}

impl Widget for Tabs<'_> {
    fn render(self, area: Rect, buf: &mut Buffer) {
        let theme = self.app.theme;
        for (p, x, label) in tab_spans(area) {
            if x >= area.right() {
                break;
            }
            let style = if p == self.app.panel {
                theme.selected().add_modifier(Modifier::BOLD)
            } else {
                theme.dim()
            };
            buf.set_stringn(x, area.y, &label, usize::from(area.right() - x), style);
        }
    }
}

/// Draws the whole screen.
pub fn draw(frame: &mut Frame<'_>, app: &App) {
    let area = frame.area();
    let l = layout(area, app.panel);
    let buf = frame.buffer_mut();
    header::Header { app }.render(l.header, buf);
    Tabs { app }.render(l.tabs, buf);
    for (panel, rect) in &l.panels {
        let compact = app.panel == Panel::Overview;
        match panel {
            Panel::Timeline => timeline::TimelinePanel { app, compact }.render(*rect, buf),
            Panel::Segments => segments::SegmentsPanel { app, compact }.render(*rect, buf),
            Panel::Sites => sites::SitesPanel { app, compact }.render(*rect, buf),
            Panel::Findings => findings::FindingsPanel { app, compact }.render(*rect, buf),
            Panel::Events => events::EventsPanel { app }.render(*rect, buf),
            Panel::Overview => {}
        }
    }
    help::HelpBar { app }.render(l.help, buf);
    if app.help {
        help::HelpPopup { theme: app.theme }.render(area, buf);
    }
}

/// A bordered block with a styled title.
pub(crate) fn panel_block(title: String, theme: Theme, focused: bool) -> Block<'static> {
    let style = if focused {
        theme.title()
    } else {
        theme.title().remove_modifier(Modifier::BOLD)
    };
    Block::new()
        .borders(Borders::ALL)
        .border_style(theme.dim())
        .title(ratatui::text::Span::styled(title, style))
}

/// Writes `text` at `(x, y)`, cut to the area's right edge.
pub(crate) fn put(buf: &mut Buffer, area: Rect, x: u16, y: u16, text: &str, style: Style) -> u16 {
    if y < area.y || y >= area.bottom() || x >= area.right() {
        return x;
    }
    let (nx, _) = buf.set_stringn(x, y, text, usize::from(area.right() - x), style);
    nx
}

/// A number with thousands separators.
pub fn thousands(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::with_capacity(s.len() + s.len() / 3);
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// Cuts `text` to `width` characters, marking the cut with `…` at the start.
pub fn clip_left(text: &str, width: usize) -> String {
    let n = text.chars().count();
    if n <= width {
        return text.to_string();
    }
    if width == 0 {
        return String::new();
    }
    let skip = n - width + 1;
    let mut out = String::from("…");
    out.extend(text.chars().skip(skip));
    out
}

/// Cuts `text` to `width` characters, marking the cut with `…` at the end.
pub fn clip(text: &str, width: usize) -> String {
    let n = text.chars().count();
    if n <= width {
        return text.to_string();
    }
    if width == 0 {
        return String::new();
    }
    let mut out: String = text.chars().take(width - 1).collect();
    out.push('…');
    out
}

/// Formats seconds since the epoch of the data.
pub fn seconds(ns: u64) -> String {
    format!("{:.3}s", ns as f64 / 1e9)
}

/// Formats a Unix time as `HH:MM:SS` UTC.
pub fn clock(unix_ns: u64) -> String {
    let s = unix_ns / 1_000_000_000;
    format!("{:02}:{:02}:{:02}", (s / 3600) % 24, (s / 60) % 60, s % 60)
}
