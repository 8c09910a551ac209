//! The timeline: allocated and reserved bytes over the events, with the device capacity, step
//! marks, the host's waits for the device, OOMs and the time cursor.
//!
//! Each column of the plot covers a range of events of the zoom window that
//! `crate::view::window` chooses; it shows the highest allocated bytes in the range as solid
//! blocks (in eighths of a cell) and the highest reserved bytes above them as shade. The y axis
//! is in absolute units and scales to the data, or to the capacity with `c`; the capacity is a
//! line when it is on the scale. The bottom row marks step starts with their numbers and the
//! cursor with `▲`. Data comes from `crate::data::Dataset`: each column's highest bytes from its
//! min/max pyramid (`Dataset::usage_extremes`, O(log n) a column), the OOMs and step starts in
//! the window by binary search, so a frame costs the same at ten million events as at ten
//! thousand.

use ratatui::buffer::Buffer;
use ratatui::layout::Rect;
use ratatui::style::{Modifier, Style};
use ratatui::widgets::Widget;
use vramscope_model::format_bytes;

use super::{inside_border, panel_block, put, thousands};
use crate::data::Dataset;
use crate::view::{Panel, ViewModel};
use vramscope_engine::Usage;

/// Width of the y-axis labels.
const AXIS_W: u16 = 10;

/// The plot inside a timeline panel's area: without border, axis labels and the step row.
pub fn plot_area(area: Rect) -> Rect {
    let inner = inside_border(area);
    Rect::new(
        inner.x + AXIS_W.min(inner.width),
        inner.y,
        inner.width.saturating_sub(AXIS_W),
        inner.height.saturating_sub(1),
    )
}

/// The highest allocated and reserved bytes in each of `columns` ranges of the usage after
/// events `a..b` (zero for a column past the data).
pub fn columns(data: &Dataset, a: usize, b: usize, columns: usize) -> Vec<Usage> {
    let mut out = Vec::with_capacity(columns);
    if b <= a || columns == 0 {
        return out;
    }
    let span = b - a;
    for j in 0..columns {
        let lo = a + span * j / columns;
        let hi = (a + span * (j + 1) / columns).max(lo + 1).min(b);
        out.push(
            data.usage_extremes(lo, hi)
                .map_or_else(Usage::default, |e| e.max),
        );
    }
    out
}

/// The timeline panel.
pub struct TimelinePanel<'a> {
    /// What the frame shows.
    pub model: &'a ViewModel<'a>,
    /// Drawn inside the overview.
    pub compact: bool,
}

impl Widget for TimelinePanel<'_> {
    fn render(self, area: Rect, buf: &mut Buffer) {
        let model = self.model;
        let theme = model.theme;
        let data = &model.data;
        let plot = plot_area(area);
        let (a, b) = model.window(usize::from(plot.width));
        let n = data.len();
        let zoom = if model.zoom > 0 && b - a < n {
            format!(" · zoom ×{}", n / (b - a).max(1))
        } else {
            String::new()
        };
        // The window in seconds since the first event, when the trace has time stamps.
        let events = data.events();
        let t0 = events.first().map_or(0, |e| e.time_ns);
        let time_at = |pos: usize| {
            events
                .get(pos.min(n).saturating_sub(1))
                .map_or(0, |e| e.time_ns.saturating_sub(t0))
        };
        let seconds = if events.last().is_some_and(|e| e.time_ns > t0) {
            let (ta, tb) = (time_at(a), time_at(b));
            format!(
                " · {} – {}",
                seconds_label(ta, tb - ta),
                seconds_label(tb, tb - ta)
            )
        } else {
            String::new()
        };
        let title = format!(
            " Timeline · events {}–{}{seconds}{zoom} ",
            thousands(a as u64),
            thousands(b as u64)
        );
        let focused = model.panel == Panel::Timeline || !self.compact;
        panel_block(title, theme, focused).render(area, buf);
        if plot.width < 2 || plot.height < 1 {
            return;
        }
        let inner_x = area.x + 1;
        // Legend on the bottom border.
        let legend = [
            ("█ allocated ", theme.allocated()),
            ("░ reserved ", theme.reserved()),
            ("─ capacity ", theme.capacity()),
        ];
        let mut lx = area.x + 2;
        for (text, style) in legend {
            lx = put(buf, area, lx, area.bottom() - 1, text, style);
        }
        if !data.waits().is_empty() {
            put(
                buf,
                area,
                lx,
                area.bottom() - 1,
                "╷ host wait ",
                theme.alert(),
            );
        }
        if n == 0 {
            put(buf, plot, plot.x, plot.y, "no events yet", theme.dim());
            return;
        }
        let w = usize::from(plot.width);
        let h = usize::from(plot.height);
        let cols = columns(data, a, b, w);
        let capacity = data.snapshot().device.capacity;
        let data_max = cols
            .iter()
            .map(|u| u.allocated.max(u.reserved))
            .max()
            .unwrap_or(0);
        let ymax = if model.capacity_scale && capacity > 0 {
            capacity.max(data_max)
        } else {
            (data_max + data_max / 10).max(1)
        };
        // Axis labels.
        let label = |v: u64| format!("{:>9} ", format_bytes(v));
        put(buf, area, inner_x, plot.y, &label(ymax), theme.dim());
        if h >= 3 {
            put(
                buf,
                area,
                inner_x,
                plot.y + plot.height / 2,
                &label(ymax / 2),
                theme.dim(),
            );
        }
        put(
            buf,
            area,
            inner_x,
            plot.bottom() - 1,
            &label(0),
            theme.dim(),
        );
        let cap_row = (capacity > 0 && capacity <= ymax)
            .then(|| h - 1 - ((capacity as f64 / ymax as f64 * h as f64) as usize).min(h - 1));
        const PARTS: [&str; 9] = [" ", "▁", "▂", "▃", "▄", "▅", "▆", "▇", "█"];
        let scale = |v: u64| ((v as f64 / ymax as f64) * (h * 8) as f64).round() as usize;
        let pos = model.pos;
        let cursor_col =
            (pos >= a && pos <= b && b > a).then(|| ((pos - a) * w / (b - a)).min(w - 1));
        for (j, u) in cols.iter().enumerate() {
            let x = plot.x + j as u16;
            let ha = scale(u.allocated);
            let hr = scale(u.reserved);
            for r in 0..h {
                let y = plot.bottom() - 1 - r as u16;
                let base = r * 8;
                let (sym, style) = if ha >= base + 8 {
                    ("█", theme.allocated())
                } else if ha > base {
                    (PARTS[ha - base], theme.allocated())
                } else if hr > base {
                    ("░", theme.reserved())
                } else if cap_row == Some(h - 1 - r) {
                    ("─", theme.capacity())
                } else if cursor_col == Some(j) && j + 1 < w {
                    ("│", theme.cursor())
                } else {
                    (" ", Style::new())
                };
                let style = if cursor_col == Some(j) && sym != "│" {
                    style.add_modifier(Modifier::BOLD)
                } else {
                    style
                };
                buf[(x, y)].set_symbol(sym).set_style(style);
            }
        }
        if cap_row.is_none() && capacity > 0 && h >= 2 {
            let note = format!(" capacity {} is off the scale (c) ", format_bytes(capacity));
            let x = plot.right().saturating_sub(note.chars().count() as u16);
            put(buf, plot, x.max(plot.x), plot.y, &note, theme.capacity());
        }
        // Host waits on the top row, under the OOMs.
        for &i in in_window(data.waits(), |&i| i, a, b) {
            let j = (i - a) * w / (b - a);
            buf[(plot.x + j as u16, plot.y)]
                .set_symbol("╷")
                .set_style(theme.alert());
        }
        // OOMs on the top row.
        for &i in in_window(data.ooms(), |&i| i, a, b) {
            let j = (i - a) * w / (b - a);
            buf[(plot.x + j as u16, plot.y)]
                .set_symbol("X")
                .set_style(theme.alert());
        }
        if plot.bottom() < area.bottom() - 1 {
            self.step_row(area, plot, (a, b), cursor_col, buf);
        }
    }
}

impl TimelinePanel<'_> {
    /// The row under the plot of `area`: step starts in the window `a..b` as marks, labelled
    /// as often as they fit, and the cursor's column (`cursor_col`) as `▲`.
    fn step_row(
        &self,
        area: Rect,
        plot: Rect,
        (a, b): (usize, usize),
        cursor_col: Option<usize>,
        buf: &mut Buffer,
    ) {
        let theme = self.model.theme;
        let w = usize::from(plot.width);
        let axis_y = plot.bottom();
        let axis = Rect::new(plot.x, axis_y, plot.width, 1);
        let marks: Vec<(u64, u16)> = in_window(self.model.data.step_starts(), |s| s.1, a, b)
            .iter()
            .map(|&(step, i)| (step, plot.x + ((i - a) * w / (b - a)) as u16))
            .collect();
        for &(_, x) in &marks {
            buf[(x, axis_y)].set_symbol("╵").set_style(theme.dim());
        }
        let every = label_every(&marks, axis.right());
        for &(step, x) in marks.iter().filter(|m| m.0 % every == 0) {
            put(buf, axis, x + 1, axis_y, &step.to_string(), theme.dim());
        }
        put(buf, area, area.x + 1, axis_y, "     step ", theme.dim());
        if let Some(j) = cursor_col {
            buf[(plot.x + j as u16, axis_y)]
                .set_symbol("▲")
                .set_style(theme.cursor());
        }
    }
}

/// The items of `sorted` (ascending by `index`) whose index is in `a..b`, by binary search.
fn in_window<T>(sorted: &[T], index: impl Fn(&T) -> usize, a: usize, b: usize) -> &[T] {
    let from = sorted.partition_point(|t| index(t) < a);
    let to = sorted.partition_point(|t| index(t) < b);
    &sorted[from..to.max(from)]
}

/// `ns` as seconds with as many decimals as a window of `span_ns` needs (three significant
/// digits of the span): `12.5 s`, `0.0342 s`.
pub fn seconds_label(ns: u64, span_ns: u64) -> String {
    let span = (span_ns.max(1) as f64) / 1e9;
    let decimals = (2.0 - span.log10().floor()).clamp(0.0, 9.0) as usize;
    format!("{:.*} s", decimals, ns as f64 / 1e9)
}

/// The smallest k of 1, 2, 5, 10, 20, 50… such that labelling the steps numbered a multiple of
/// k (each just after its mark) leaves a space between labels and ends every label before
/// `right`: step labels never run into each other, whatever the width and the step count.
pub fn label_every(marks: &[(u64, u16)], right: u16) -> u64 {
    let fits = |k: u64| {
        let mut free = 0u32;
        for &(step, x) in marks.iter().filter(|m| m.0 % k == 0) {
            let start = u32::from(x) + 1;
            let end = start + step.to_string().len() as u32;
            if start < free || end > u32::from(right) {
                return false;
            }
            free = end + 1;
        }
        true
    };
    let mut base = 1u64;
    loop {
        for m in [1, 2, 5] {
            let k = base.saturating_mul(m);
            if k >= u64::MAX / 10 || fits(k) {
                return k;
            }
        }
        base = base.saturating_mul(10);
    }
}

#[cfg(test)]
mod tests {
    use super::label_every;

    #[test]
    fn seconds_have_the_decimals_the_window_needs() {
        use super::seconds_label;
        assert_eq!(seconds_label(12_500_000_000, 30_000_000_000), "12.5 s");
        assert_eq!(seconds_label(34_200_000, 50_000_000), "0.0342 s");
        assert_eq!(seconds_label(3_000_000_000, 500_000_000_000), "3 s");
    }

    #[test]
    fn step_labels_never_run_into_each_other() {
        // Ten steps one column apart: labels need every other step.
        let marks: Vec<(u64, u16)> = (1..=10).map(|s| (s, s as u16)).collect();
        assert_eq!(label_every(&marks, 100), 2);
        // Room enough: every step.
        let marks: Vec<(u64, u16)> = (1..=9).map(|s| (s, s as u16 * 4)).collect();
        assert_eq!(label_every(&marks, 100), 1);
        // 300 steps in 80 columns: every 10th or more, three digits each.
        let marks: Vec<(u64, u16)> = (1..=300).map(|s| (s, (s * 80 / 300) as u16)).collect();
        let k = label_every(&marks, 80);
        assert!(k >= 20, "{k}");
        // A label that would be cut at the right edge is left out: the first k that skips 12.
        assert_eq!(label_every(&[(1, 10), (12, 79)], 80), 5);
    }
}
