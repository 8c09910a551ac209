//! The event log: every event, scrollable, filterable by kind (`e`) and by text on kind names
//! and call sites (`/`).
//!
//! The rows are the indices `crate::app::App::prepare` kept in
//! `crate::view::CursorView::events`, read from the `crate::view::ViewModel` like everything
//! else here. The row of the last event before the time cursor is highlighted and kept in view,
//! so scrolling the timeline scrolls the log; selecting a row with the arrows and pressing Enter
//! moves the time cursor to that event.

use ratatui::buffer::Buffer;
use ratatui::layout::Rect;
use ratatui::style::Style;
use ratatui::widgets::Widget;
use vramscope_model::{format_bytes, Event, EventKind};

use super::{clip, clip_left, inside_border, panel_block, put, seconds, thousands};
use crate::view::{Panel, ViewModel};

/// The row of `list` (event indices, ascending) for the last event before position `pos`.
pub fn cursor_row(list: &[u32], pos: usize) -> usize {
    list.partition_point(|&i| (i as usize) < pos)
        .saturating_sub(1)
}

/// The event log panel.
pub struct EventsPanel<'a> {
    /// What the frame shows.
    pub model: &'a ViewModel<'a>,
}

fn size_text(e: &Event) -> String {
    match e.kind {
        EventKind::Step | EventKind::Snapshot | EventKind::Sync => String::new(),
        _ => format_bytes(e.size),
    }
}

impl Widget for EventsPanel<'_> {
    fn render(self, area: Rect, buf: &mut Buffer) {
        let model = self.model;
        let theme = model.theme;
        let view = model.view;
        let data = &model.data;
        let events = data.events();
        let mut title = format!(
            " Events · {} of {} · kind {} ",
            thousands(view.events.len() as u64),
            thousands(events.len() as u64),
            model.events.kind.name()
        );
        if !model.events.filter.is_empty() {
            title.push_str(&format!("· /{} ", model.events.filter));
        }
        panel_block(title, theme, model.panel == Panel::Events).render(area, buf);
        let inner = inside_border(area);
        if inner.height < 2 || inner.width < 30 {
            return;
        }
        let wide = inner.width >= 110;
        let header = if wide {
            format!(
                "{:>9} {:>10} {:>5} {:<15} {:>9} {:>16}  {:<40} {}",
                "#", "time", "step", "kind", "size", "address", "call site", "tag / scope"
            )
        } else {
            format!(
                "{:>7} {:>9} {:>4} {:<14} {:>9}  {}",
                "#", "time", "step", "kind", "size", "call site"
            )
        };
        put(buf, inner, inner.x, inner.y, &header, theme.header());
        let rows = usize::from(inner.height - 1);
        if view.events.is_empty() {
            put(
                buf,
                inner,
                inner.x,
                inner.y + 1,
                "no events match",
                theme.dim(),
            );
            return;
        }
        let pos = model.pos;
        let cursor = cursor_row(&view.events, pos);
        let selected = model
            .events
            .selected
            .and_then(|s| u32::try_from(s).ok())
            .and_then(|s| view.events.binary_search(&s).ok());
        let focus = selected.unwrap_or(cursor);
        let first = focus
            .saturating_sub(rows / 2)
            .min(view.events.len().saturating_sub(rows));
        let snapshot = data.snapshot();
        let groups = data.groups();
        let width = usize::from(inner.width);
        for (row, &i) in view.events.iter().enumerate().skip(first).take(rows) {
            let e = &events[i as usize];
            let y = inner.y + 1 + (row - first) as u16;
            let site = snapshot
                .site(e.site())
                .map(|_| groups.get(groups.group_of(e.site())).label().to_string())
                .unwrap_or_default();
            let text = if wide {
                let tag = snapshot.tag(e.tag()).unwrap_or("");
                let scope = snapshot.scope(e.scope()).unwrap_or("");
                format!(
                    "{:>9} {:>10} {:>5} {:<15} {:>9} {:>#16x}  {:<40} {}{}{}",
                    i + 1,
                    seconds(e.time_ns),
                    e.step,
                    e.kind.name(),
                    size_text(e),
                    e.addr,
                    clip_left(&site, 40),
                    tag,
                    if tag.is_empty() || scope.is_empty() {
                        ""
                    } else {
                        " / "
                    },
                    scope
                )
            } else {
                let fixed = format!(
                    "{:>7} {:>9} {:>4} {:<14} {:>9}  ",
                    i + 1,
                    seconds(e.time_ns),
                    e.step,
                    e.kind.name(),
                    size_text(e),
                );
                let rest = width.saturating_sub(fixed.chars().count());
                format!("{fixed}{}", clip_left(&site, rest))
            };
            let style = if selected == Some(row) {
                theme.selected()
            } else if row == cursor && (i as usize) < pos {
                theme.cursor()
            } else {
                match e.kind {
                    EventKind::Oom => theme.alert(),
                    EventKind::Step => theme.title(),
                    EventKind::SegmentAlloc | EventKind::SegmentFree => theme.reserved(),
                    _ => Style::new(),
                }
            };
            let text = clip(&text, width);
            put(buf, inner, inner.x, y, &format!("{text:<width$}"), style);
        }
    }
}
