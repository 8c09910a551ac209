//! The help bar at the bottom (the keys that apply now, or a status message, or the filter being
//! typed) and the help overlay that `?` opens.
//!
//! [`keys_for`] is the single list of context keys, so that the bar, the overlay and the tests
//! agree with `crate::app::App::handle_key`.

use ratatui::buffer::Buffer;
use ratatui::layout::Rect;
use ratatui::style::Style;
use ratatui::widgets::{Clear, Widget};

use super::{panel_block, put, Theme};
use crate::view::{Panel, ViewModel, ViewSource};

/// The keys that apply in the panel shown (with a detail or tree view open or not), most useful
/// first; `source` is a `crate::app::App` or its [`ViewModel`].
pub fn keys_for<S: ViewSource + ?Sized>(source: &S) -> Vec<(&'static str, &'static str)> {
    let model = source.view_model();
    let mut keys = vec![("q", "quit"), ("?", "help"), ("Tab", "panel")];
    match model.panel {
        Panel::Overview | Panel::Timeline => {
            keys.extend([
                ("P", "peak"),
                ("←→", "time"),
                ("[ ]", "step"),
                ("+-", "zoom"),
                ("c", "scale"),
            ]);
        }
        Panel::Segments => keys.extend([
            ("P", "peak"),
            ("↑↓", "scroll"),
            ("[ ]", "step"),
            ("←→", "step"),
        ]),
        Panel::Sites if model.sites.detail => {
            let f = if model.sites.all_frames {
                "fold frames"
            } else {
                "all frames"
            };
            keys.extend([("Esc", "back"), ("f", f), ("[ ]", "step")]);
        }
        Panel::Sites => keys.extend([
            ("↑↓", "select"),
            ("Enter", if model.sites.tree { "fold" } else { "stack" }),
            ("o", "sort"),
            ("t", "tree"),
            ("f", "framework"),
            ("/", "search"),
        ]),
        Panel::Findings => keys.extend([("↑↓", "select"), ("Enter", "site"), ("/", "filter")]),
        Panel::Memory => keys.extend([
            ("↑↓", "select"),
            ("Enter", "fold"),
            ("P", "peak"),
            ("←→", "step"),
            ("[ ]", "step"),
        ]),
        Panel::Events => keys.extend([
            ("↑↓", "select"),
            ("Enter", "go to"),
            ("e", "kind"),
            ("/", "filter"),
        ]),
    }
    if model.live {
        keys.push(("p", if model.paused { "resume" } else { "pause" }));
    }
    keys.extend([("End", "now"), ("s", "save")]);
    keys
}

/// The help bar.
pub struct HelpBar<'a> {
    /// What the frame shows.
    pub model: &'a ViewModel<'a>,
}

impl Widget for HelpBar<'_> {
    fn render(self, area: Rect, buf: &mut Buffer) {
        let model = self.model;
        let theme = model.theme;
        if area.height == 0 {
            return;
        }
        if let Some(input) = model.input {
            let x = put(buf, area, area.x, area.y, " / ", theme.key());
            let x = put(buf, area, x, area.y, &input.text, Style::new());
            let x = put(buf, area, x, area.y, "▏", theme.cursor());
            put(
                buf,
                area,
                x,
                area.y,
                "  Enter apply · Esc cancel",
                theme.dim(),
            );
            return;
        }
        let mut x = area.x;
        if let Some(status) = model.status {
            x = put(buf, area, x, area.y, &format!(" {status} "), theme.cursor());
            x = put(buf, area, x, area.y, "│", theme.dim());
        } else if let Some(intro) = model.intro {
            // Until the first key: what is running, then the two keys everyone needs.
            x = put(buf, area, x, area.y, " ?", theme.key());
            x = put(buf, area, x, area.y, " help", theme.dim());
            x = put(buf, area, x, area.y, " q", theme.key());
            x = put(buf, area, x, area.y, " quit ", theme.dim());
            put(buf, area, x, area.y, &format!("│ {intro}"), theme.cursor());
            return;
        }
        for (key, what) in keys_for(model) {
            let needed = (key.chars().count() + what.chars().count() + 2) as u16;
            if x + needed > area.right() {
                break;
            }
            x = put(buf, area, x, area.y, &format!(" {key}"), theme.key());
            x = put(buf, area, x, area.y, &format!(" {what}"), theme.dim());
        }
    }
}

/// Every key, for the overlay.
pub const ALL_KEYS: &[(&str, &str)] = &[
    ("q  Ctrl-C", "quit (Esc too, when nothing is open)"),
    ("?  F1", "this help; any key closes it"),
    ("Tab  1-7", "next panel; go to panel 1 to 7"),
    (
        "← → h l",
        "time cursor: a column in the timeline, a step elsewhere",
    ),
    ("H L", "move the time cursor ten columns"),
    ("P  R", "go to the peak of allocated / reserved bytes"),
    ("D", "next device of a multi-device file"),
    ("[ ]", "previous / next step start"),
    (", .", "one event back / forward"),
    (
        "Home g  End G",
        "first event; the newest (follow live data)",
    ),
    ("+ -", "zoom the timeline in / out (↑ ↓ there too)"),
    ("c", "timeline scaled to the device capacity / to the data"),
    ("↑ ↓ j k PgUp PgDn", "select a row; scroll"),
    (
        "Enter",
        "site: stack; tree: fold; finding: its events; event: go to",
    ),
    (
        "o t f",
        "call sites: sort; tree; show / fold framework frames",
    ),
    ("e", "event log: cycle the kind filter"),
    ("/", "filter call sites, findings or events; Esc clears"),
    (
        "p  Space",
        "pause (live data keeps coming; the view stays put)",
    ),
    ("s", "save a snapshot of the state at the cursor (JSON)"),
    ("mouse", "click a tab, a row or the timeline; wheel scrolls"),
];

/// The width of the overlay's key column.
const KEY_COLUMN: u16 = 18;

/// The help overlay.
pub struct HelpPopup {
    /// The theme.
    pub theme: Theme,
}

impl Widget for HelpPopup {
    fn render(self, area: Rect, buf: &mut Buffer) {
        let w = area.width.min(84);
        let h = (ALL_KEYS.len() as u16 + 4).min(area.height);
        let popup = Rect::new(
            area.x + (area.width - w) / 2,
            area.y + (area.height - h) / 2,
            w,
            h,
        );
        Clear.render(popup, buf);
        panel_block(" Keys ".to_string(), self.theme, true).render(popup, buf);
        let inner = Rect::new(
            popup.x + 2,
            popup.y + 1,
            popup.width.saturating_sub(4),
            popup.height.saturating_sub(2),
        );
        // A description wider than the popup goes on over the next lines, whole words only;
        // what does not fit below is left out whole, never cut inside a word.
        let width = usize::from(inner.width.saturating_sub(KEY_COLUMN)).max(1);
        let mut y = inner.y;
        let mut lines = 0usize;
        for (key, what) in ALL_KEYS {
            let wrapped = super::findings::wrap(what, width);
            if y + wrapped.len() as u16 > inner.bottom() {
                break;
            }
            put(
                buf,
                inner,
                inner.x,
                y,
                &format!("{key:<18}"),
                self.theme.key(),
            );
            for line in wrapped {
                put(buf, inner, inner.x + KEY_COLUMN, y, &line, Style::new());
                y += 1;
                lines += 1;
            }
        }
        let y = inner.bottom().saturating_sub(1);
        if usize::from(inner.height) > lines + 1 {
            put(
                buf,
                inner,
                inner.x,
                y,
                "Memory states: █ allocated  ▓ pending free  ▒ inactive split  · free",
                self.theme.dim(),
            );
        }
    }
}
