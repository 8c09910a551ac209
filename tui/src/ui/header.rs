//! The header: what is shown, its state, and the memory figures at the time cursor.
//!
//! Three rows: the source, device, capacity, step, cursor position and connection state (live,
//! paused, disconnected since when and why, ended); then allocated, reserved and peak bytes as bars on
//! the most the trace uses (the capacity is text in the first row), with their values in
//! absolute units; then retries, OOMs and events the dashboard did not receive. Figures come
//! from `crate::data::Dataset` at the cursor, through the `crate::view::ViewModel`.

use ratatui::buffer::Buffer;
use ratatui::layout::Rect;
use ratatui::style::Style;
use ratatui::widgets::Widget;
use vramscope_model::format_bytes;

use super::{clock, put, thousands, Theme};
use crate::data::{Link, Origin};
use crate::view::ViewModel;

/// The header widget.
pub struct Header<'a> {
    /// What the frame shows.
    pub model: &'a ViewModel<'a>,
}

/// A bar of `width` cells filled `value / scale`, in eighths.
pub fn bar(value: u64, scale: u64, width: usize) -> (String, String) {
    const PARTS: [char; 8] = [' ', '▏', '▎', '▍', '▌', '▋', '▊', '▉'];
    if width == 0 {
        return (String::new(), String::new());
    }
    let eighths = if scale == 0 {
        0
    } else {
        ((value as f64 / scale as f64).clamp(0.0, 1.0) * (width * 8) as f64).round() as usize
    };
    let full = eighths / 8;
    let mut filled: String = "█".repeat(full);
    let mut rest = width - full;
    if full < width && eighths % 8 > 0 {
        filled.push(PARTS[eighths % 8]);
        rest -= 1;
    }
    (filled, "·".repeat(rest))
}

impl Header<'_> {
    /// The state in the first row, and for a lost connection the reason, which comes from
    /// the publisher or the protocol check (shown with control characters escaped, in the
    /// room the row has left: see `render`).
    fn state(&self) -> (String, Option<String>, Style) {
        let model = self.model;
        let theme = model.theme;
        let (state, style) = match &model.data.link_state {
            Link::Down {
                since_unix_ns,
                reason,
            } => {
                let ago = model.now_unix_ns.saturating_sub(*since_unix_ns) / 1_000_000_000;
                let reason = vramscope_model::terminal::sanitize(reason).into_owned();
                return (
                    format!(
                        "disconnected since {} ({ago}s ago), retrying",
                        clock(*since_unix_ns)
                    ),
                    Some(reason),
                    theme.alert(),
                );
            }
            Link::Connecting => ("connecting…".to_string(), theme.pending()),
            Link::Ended if model.following => ("ended".to_string(), theme.dim()),
            _ if model.paused => ("PAUSED".to_string(), theme.cursor()),
            _ if model.live && model.following => ("LIVE".to_string(), theme.allocated()),
            _ => (
                format!(
                    "event {}/{}",
                    thousands(model.pos as u64),
                    thousands(model.data.len() as u64)
                ),
                theme.cursor(),
            ),
        };
        (state, None, style)
    }
}

/// `text` cut to `room` characters, ending in `…` where it was cut.
fn fit_text(text: &str, room: usize) -> String {
    if text.chars().count() <= room {
        text.to_string()
    } else {
        text.chars()
            .take(room.saturating_sub(1))
            .collect::<String>()
            + "…"
    }
}

/// The fewest characters of a lost connection's reason the first row shows: past what the
/// row has left, the source's name gives way to it first.
const REASON_ROOM: usize = 24;

impl Widget for Header<'_> {
    fn render(self, area: Rect, buf: &mut Buffer) {
        let model = self.model;
        let theme: Theme = model.theme;
        let data = &model.data;
        let snapshot = data.snapshot();
        let pos = model.pos;
        let y = area.y;
        // Row 1: identity and state.
        let kind = match data.origin() {
            Origin::File(_) => "file",
            Origin::Live(_) => "live",
            Origin::InProcess(_) => "in-process",
        };
        let capacity = snapshot.device.capacity;
        let (mut state, reason, style) = self.state();
        if let Some(peak) = model.at_peak {
            state.push(' ');
            state.push_str(peak);
        }
        let device = if snapshot.device.name.is_empty() {
            snapshot.device.backend.clone()
        } else {
            snapshot.device.name.clone()
        };
        let cap = if capacity > 0 {
            format!("cap {}", format_bytes(capacity))
        } else {
            "cap ?".to_string()
        };
        let step = if model.following && data.live.stats.is_some() {
            data.live.step.max(data.step_at(pos))
        } else {
            data.step_at(pos)
        };
        let step = format!("│ step {step} ");
        let mut events = format!("│ {} events", thousands(data.len() as u64));
        // The words stay; the name of the source gives way first (its file name, then its
        // end), then the event count, then the device's name.
        let width = usize::from(area.width);
        let len = |s: &str| s.chars().count();
        let fixed = " vramscope ".len() + len(&state) + len(" │ ") + kind.len() + 2;
        let total = |name: &str, device: &str, events: &str| {
            fixed + len(name) + len(&format!("│ {device} {cap} ")) + len(&step) + len(events)
        };
        let label = data.origin().label();
        let mut name = label.to_string();
        let mut device = device;
        let showing_reason = reason.is_some();
        if let Some(reason) = reason {
            // The reason takes the room the row has left, and at least `REASON_ROOM`.
            let left = width.saturating_sub(total(&name, &device, &events) + 2);
            let reason = fit_text(&reason, left.max(REASON_ROOM));
            state.push_str(": ");
            state.push_str(&reason);
        }
        let fixed = " vramscope ".len() + len(&state) + len(" │ ") + kind.len() + 2;
        let total = |name: &str, device: &str, events: &str| {
            fixed + len(name) + len(&format!("│ {device} {cap} ")) + len(&step) + len(events)
        };
        if showing_reason && total(&name, &device, &events) > width {
            // With a reason to show, the event count gives way before the name.
            events.clear();
        }
        if total(&name, &device, &events) > width {
            let over = total(&name, &device, &events) - width;
            name = fit_name(label, len(label).saturating_sub(over).max(10));
        }
        if total(&name, &device, &events) > width {
            events.clear();
        }
        if total(&name, &device, &events) > width {
            let over = total(&name, &device, &events) - width;
            let keep = len(&device).saturating_sub(over + 1).max(3);
            if keep < len(&device) {
                device = device.chars().take(keep).collect::<String>() + "…";
            }
        }
        let device = format!("│ {device} {cap} ");
        let mut x = put(buf, area, area.x, y, " vramscope ", theme.title());
        x = put(buf, area, x, y, &state, style);
        x = put(buf, area, x, y, " │ ", theme.dim());
        x = put(buf, area, x, y, &format!("{kind} {name} "), Style::new());
        x = put(buf, area, x, y, &device, theme.dim());
        x = put(buf, area, x, y, &step, theme.dim());
        put(buf, area, x, y, &events, theme.dim());

        self.figure_rows(area, buf);
    }
}

impl Header<'_> {
    /// Rows 2 and 3: allocated, reserved and peak bytes as bars, then retries, OOMs, dropped
    /// events, lost frees (when the trace lost any) and live blocks.
    fn figure_rows(&self, area: Rect, buf: &mut Buffer) {
        let model = self.model;
        let theme: Theme = model.theme;
        let data = &model.data;
        let snapshot = data.snapshot();
        let pos = model.pos;
        let y = area.y;
        let mut usage = data.usage_at(pos);
        // The engine's peak up to the cursor, as the report states it (memory from before the
        // trace included).
        let peak = data.peak_at(pos).allocated;
        let stats = &snapshot.stats;
        if pos == data.len() && usage.reserved == 0 {
            // At the end the recorded statistics know the reserved bytes of traces without
            // segments.
            usage.reserved = stats.reserved_bytes.all.current;
        }
        // The bars scale to what the trace uses at most (the capacity is in the first row as
        // text), so that a few MiB on an 80 GiB device still show.
        let most = data.peak_at(data.len());
        let scale = most.reserved.max(most.allocated).max(usage.reserved).max(1);
        let width = usize::from(area.width);
        let label_w = 11usize;
        let value_w = 11usize;
        let bar_w = (width.saturating_sub(2 * (label_w + value_w + 3)) / 2).clamp(4, 40);
        let mut draw_bar = |x: u16, y: u16, label: &str, value: u64, style: Style| -> u16 {
            let x = put(
                buf,
                area,
                x,
                y,
                &format!(" {label:<w$}", w = label_w - 1),
                Style::new(),
            );
            let x = put(buf, area, x, y, "▕", theme.dim());
            let (filled, rest) = bar(value, scale, bar_w);
            let x = put(buf, area, x, y, &filled, style);
            let x = put(buf, area, x, y, &rest, theme.dim());
            let x = put(buf, area, x, y, "▏", theme.dim());
            put(
                buf,
                area,
                x,
                y,
                &format!("{:>9}  ", format_bytes(value)),
                Style::new(),
            )
        };
        let x = draw_bar(
            area.x,
            y + 1,
            "Allocated",
            usage.allocated,
            theme.allocated(),
        );
        draw_bar(x, y + 1, "Reserved", usage.reserved, theme.reserved());
        let x = draw_bar(area.x, y + 2, "Peak", peak, theme.allocated());
        let ooms_here = data.ooms().partition_point(|&i| i < pos) as u64;
        let ooms = if model.following {
            ooms_here.max(stats.num_ooms)
        } else {
            ooms_here
        };
        let dropped = data.live.dropped_events.max(snapshot.dropped_events);
        let x = put(
            buf,
            area,
            x,
            y + 2,
            &format!("retries {}  ", stats.num_alloc_retries),
            Style::new(),
        );
        let x = put(
            buf,
            area,
            x,
            y + 2,
            // The file's OOMs beside those up to the cursor, when some come later.
            &match data.ooms().len() as u64 {
                total if total > ooms => format!("OOMs {ooms} of {total}"),
                _ => format!("OOMs {ooms}"),
            },
            if ooms > 0 || data.ooms().len() as u64 > ooms {
                theme.alert()
            } else {
                Style::new()
            },
        );
        let x = put(buf, area, x, y + 2, "  ", Style::new());
        let mut x = put(
            buf,
            area,
            x,
            y + 2,
            &format!("dropped {}", thousands(dropped)),
            if dropped > 0 {
                theme.pending()
            } else {
                Style::new()
            },
        );
        // A trace that allocated over live blocks lost their frees: said only when it did.
        let lost = data.lost_frees();
        if lost > 0 {
            x = put(
                buf,
                area,
                x,
                y + 2,
                &format!("  lost frees {}", thousands(lost)),
                theme.pending(),
            );
        }
        put(
            buf,
            area,
            x,
            y + 2,
            &format!("  {} blocks", thousands(model.view.live_blocks)),
            theme.dim(),
        );
    }
}

/// `name` in at most `room` characters: whole, else its file name, else the file name's end
/// after an ellipsis.
pub fn fit_name(name: &str, room: usize) -> String {
    if name.chars().count() <= room {
        return name.to_string();
    }
    let file = name.rsplit('/').next().unwrap_or(name);
    let n = file.chars().count();
    if n <= room {
        return file.to_string();
    }
    let keep = room.saturating_sub(1);
    let tail: String = file.chars().skip(n - keep).collect();
    format!("…{tail}")
}

#[cfg(test)]
mod tests {
    use super::{bar, fit_name};

    #[test]
    fn names_give_way_from_the_front() {
        assert_eq!(fit_name("/a/b/run.json", 40), "/a/b/run.json");
        assert_eq!(fit_name("/a/b/run.json", 9), "run.json");
        assert_eq!(fit_name("/a/b/long_trace_name.pickle", 8), "….pickle");
        assert_eq!(fit_name("x", 0), "…");
    }

    #[test]
    fn bars_fill_in_eighths() {
        assert_eq!(bar(0, 100, 4), (String::new(), "····".to_string()));
        assert_eq!(bar(100, 100, 4), ("████".to_string(), String::new()));
        assert_eq!(bar(50, 100, 4), ("██".to_string(), "··".to_string()));
        assert_eq!(bar(5, 100, 4).0, "▎");
        assert_eq!(bar(500, 100, 2).0, "██");
        assert_eq!(bar(5, 0, 2).0, "");
    }
}
