//! Drawing: the screen layout and one widget per panel.
//!
//! [`draw`] lays the screen out with [`layout`] (header, tab bar, panel body, help bar; the
//! overview panel is a grid that grows with the terminal) and renders each part with the
//! widgets of the submodules, each an `impl Widget`: [`header`], [`timeline`], [`segments`],
//! [`sites`] (its stacks folded by [`stack`]), [`findings`], [`events`], [`memory`] (the
//! categories at the cursor and the call tree) and [`help`];
//! [`fleet`] draws the table of several processes that `vramscope top ADDR ADDR...` shows.
//! Widgets read a `crate::view::ViewModel` (plain data and references to the
//! `crate::data::Dataset`, made by `crate::app::App` after `App::prepare`) and never change
//! anything, so the screen tests can render any state into ratatui's `TestBackend`. Nothing
//! here imports `crate::app` or `crate::fleet`: they import this module for the layout and the
//! mouse, never the other way round. [`Theme`] (from `crate::theme`) holds every style.

pub mod events;
pub mod findings;
pub mod fleet;
pub mod header;
pub mod help;
pub mod memory;
pub mod segments;
pub mod sites;
pub mod stack;
pub mod timeline;

use ratatui::buffer::Buffer;
use ratatui::layout::Rect;
use ratatui::style::{Modifier, Style};
use ratatui::widgets::{Block, Borders, Widget};
use ratatui::Frame;

pub use crate::theme::Theme;
use crate::view::{Panel, ViewModel, ViewSource};

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
/// Where the labels do not fit with a space either side, they go without.
fn tab_spans(area: Rect) -> Vec<(Panel, u16, String)> {
    let mut x = area.x + 1;
    let mut out = Vec::new();
    let wide: usize = Panel::ALL
        .iter()
        .enumerate()
        .map(|(i, p)| format!(" {} {} ", i + 1, p.title()).chars().count() + 1)
        .sum();
    let roomy = wide < usize::from(area.width);
    for (i, p) in Panel::ALL.iter().enumerate() {
        let label = if roomy {
            format!(" {} {} ", i + 1, p.title())
        } else {
            format!("{} {}", i + 1, p.title())
        };
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
    /// What the frame shows.
    pub model: &'a ViewModel<'a>,
}

impl Widget for Tabs<'_> {
    fn render(self, area: Rect, buf: &mut Buffer) {
        let theme = self.model.theme;
        for (p, x, label) in tab_spans(area) {
            if x >= area.right() {
                break;
            }
            let style = if p == self.model.panel {
                theme.selected().add_modifier(Modifier::BOLD)
            } else {
                theme.dim()
            };
            buf.set_stringn(x, area.y, &label, usize::from(area.right() - x), style);
        }
    }
}

/// Draws the whole screen of `source`: a `crate::app::App` (after `App::prepare`) or its
/// [`ViewModel`].
pub fn draw<S: ViewSource + ?Sized>(frame: &mut Frame<'_>, source: &S) {
    let model = &source.view_model();
    let area = frame.area();
    let l = layout(area, model.panel);
    let buf = frame.buffer_mut();
    header::Header { model }.render(l.header, buf);
    Tabs { model }.render(l.tabs, buf);
    for (panel, rect) in &l.panels {
        let compact = model.panel == Panel::Overview;
        match panel {
            Panel::Timeline => timeline::TimelinePanel { model, compact }.render(*rect, buf),
            Panel::Segments => segments::SegmentsPanel { model, compact }.render(*rect, buf),
            Panel::Sites => sites::SitesPanel { model, compact }.render(*rect, buf),
            Panel::Findings => findings::FindingsPanel { model, compact }.render(*rect, buf),
            Panel::Events => events::EventsPanel { model }.render(*rect, buf),
            Panel::Memory => memory::MemoryPanel { model }.render(*rect, buf),
            Panel::Overview => {}
        }
    }
    help::HelpBar { model }.render(l.help, buf);
    if model.help {
        help::HelpPopup { theme: model.theme }.render(area, buf);
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

/// The room inside the border of a panel drawn over `area` ([`panel_block`]): one cell in
/// from each side, none where the area is too small to hold one.
pub(crate) fn inside_border(area: Rect) -> Rect {
    Rect::new(
        area.x + 1,
        area.y + 1,
        area.width.saturating_sub(2),
        area.height.saturating_sub(2),
    )
}

/// Writes `text` at `(x, y)`, cut to the area's right edge.
pub(crate) fn put(buf: &mut Buffer, area: Rect, x: u16, y: u16, text: &str, style: Style) -> u16 {
    if y < area.y || y >= area.bottom() || x >= area.right() {
        return x;
    }
    let (nx, _) = buf.set_stringn(x, y, text, usize::from(area.right() - x), style);
    nx
}

/// A number with thousands separators (the model's, for every panel).
pub use vramscope_model::thousands;

/// Cuts `text` to `width` characters, marking the cut with `…` at the start (the model's
/// [`vramscope_model::elide_start`], as the reports cut their labels).
pub fn clip_left(text: &str, width: usize) -> String {
    vramscope_model::elide_start(text, width).into_owned()
}

/// Cuts `text` to `width` characters, marking the cut with `…` at the end (the model's
/// [`vramscope_model::elide_end`]).
pub fn clip(text: &str, width: usize) -> String {
    vramscope_model::elide_end(text, width).into_owned()
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
