//! The call-site panel: allocated memory at the time cursor by `file:line`, as a sortable
//! table, a detail view of one site (its stacks and blocks), or a tree of all stacks. The
//! table's rows are the report's "at peak" and "at end" columns at any position: pending frees
//! are left out, and memory from before the trace that only totals record is a row of its own,
//! "(before the trace)"; the tree holds the same bytes, a block without a stack under its
//! group's name.
//!
//! The rows come from `crate::view::CursorView::sites` (grouped, filtered and sorted by
//! `crate::app::App::prepare`, read through the `crate::view::ViewModel`), growth per step from
//! the analysis of `crate::analysis`. Enter opens the selected site: every stack recorded for
//! it, innermost frame first, the user's frames shown and each run of framework frames folded
//! into one line (`super::stack`; `f` shows every frame, framework ones dimmed), then its live
//! blocks. `t` switches to the tree of stacks, with the bytes under every frame (framework
//! frames left out with `f`); Enter there folds or unfolds the selected frame (`▸` folded,
//! `▾` open).

use ratatui::buffer::Buffer;
use ratatui::layout::Rect;
use ratatui::style::Style;
use ratatui::widgets::Widget;
use vramscope_engine::LiveBlock;
use vramscope_import::sites::DEFAULT_FRAMEWORK_PATHS;
use vramscope_model::format_bytes;

use super::stack::{folded_text, stack_lines, StackLine};
use super::{clip, clip_left, inside_border, panel_block, put, thousands};
use crate::view::{Panel, ViewModel};

/// The call-site panel.
pub struct SitesPanel<'a> {
    /// What the frame shows.
    pub model: &'a ViewModel<'a>,
    /// Drawn inside the overview.
    pub compact: bool,
}

/// Bytes per step as text (`+2.0 MiB`, `-512 B`, `—`).
pub fn growth_text(growth: Option<f64>) -> String {
    match growth {
        None => "—".to_string(),
        Some(g) if g.abs() < 0.5 => "0".to_string(),
        Some(g) if g > 0.0 => format!("+{}", format_bytes(g.round() as u64)),
        Some(g) => format!("-{}", format_bytes((-g).round() as u64)),
    }
}

/// The first row to show so that `selected` is visible in `rows` rows.
pub fn scroll_for(selected: usize, rows: usize) -> usize {
    if rows == 0 {
        0
    } else {
        selected.saturating_sub(rows - 1)
    }
}

impl Widget for SitesPanel<'_> {
    fn render(self, area: Rect, buf: &mut Buffer) {
        let model = self.model;
        let theme = model.theme;
        let view = model.view;
        let mut title = format!(" Call sites · {} ", thousands(view.sites.len() as u64));
        if !self.compact {
            title.push_str(&format!("· sort {} ", model.sites.sort.name()));
            if model.sites.tree {
                title.push_str("· tree ");
            }
            if model.sites.detail && !model.sites.tree {
                if model.sites.all_frames {
                    title.push_str("· all frames ");
                }
            } else if model.sites.hide_framework {
                title.push_str("· framework hidden ");
            }
        }
        if !model.sites.filter.is_empty() {
            title.push_str(&format!("· /{} ", model.sites.filter));
        }
        let focused = model.panel == Panel::Sites;
        panel_block(title, theme, focused).render(area, buf);
        let inner = inside_border(area);
        if inner.height == 0 || inner.width < 20 {
            return;
        }
        if !self.compact && model.sites.tree {
            self.tree(inner, buf);
        } else if !self.compact && model.sites.detail {
            self.detail(inner, buf);
        } else {
            self.table(inner, buf);
        }
    }
}

/// The header of the bytes column: where the holdings are counted.
fn live_header(model: &ViewModel) -> &'static str {
    if model.pos >= model.data.len() {
        "At end"
    } else {
        "At cursor"
    }
}

impl SitesPanel<'_> {
    fn table(&self, inner: Rect, buf: &mut Buffer) {
        let model = self.model;
        let theme = model.theme;
        let view = model.view;
        let groups = model.data.groups();
        let wide = inner.width >= 110;
        let live = live_header(model);
        let header = if wide {
            format!(
                "{:>10} {:>8} {:>10} {:>11} {:>9}  {:<40} {}",
                live, "Blocks", "Requested", "Growth/step", "Steps", "Call site", "Function"
            )
        } else {
            format!(
                "{:>10} {:>7} {:>11} {:>7}  {}",
                live, "Blocks", "Growth/step", "Steps", "Call site"
            )
        };
        put(buf, inner, inner.x, inner.y, &header, theme.header());
        let rows = usize::from(inner.height - 1);
        if view.sites.is_empty() {
            let text = if model.sites.filter.is_empty() {
                "no live blocks at the cursor"
            } else {
                "no call site matches the filter (Esc clears it)"
            };
            put(buf, inner, inner.x, inner.y + 1, text, theme.dim());
            return;
        }
        let selected = if model.panel == Panel::Sites && !self.compact {
            Some(model.sites.selected)
        } else {
            None
        };
        let first = scroll_for(selected.unwrap_or(0), rows);
        for (row, r) in view.sites.iter().enumerate().skip(first).take(rows) {
            let y = inner.y + 1 + (row - first) as u16;
            let g = groups.get(r.group);
            let steps = if r.first_step == r.last_step {
                format!("{}", r.first_step)
            } else {
                format!("{}–{}", r.first_step, r.last_step)
            };
            let fixed = if wide {
                format!(
                    "{:>10} {:>8} {:>10} {:>11} {:>9}  ",
                    format_bytes(r.bytes),
                    thousands(r.blocks),
                    format_bytes(r.requested),
                    growth_text(r.growth),
                    steps
                )
            } else {
                format!(
                    "{:>10} {:>7} {:>11} {:>7}  ",
                    format_bytes(r.bytes),
                    thousands(r.blocks),
                    growth_text(r.growth),
                    steps
                )
            };
            let rest = usize::from(inner.width).saturating_sub(fixed.chars().count());
            let site = if wide {
                let label = clip_left(g.label(), 40.min(rest));
                format!("{label:<40} {}", g.function)
            } else {
                clip_left(g.label(), rest)
            };
            let style = if selected == Some(row) {
                theme.selected()
            } else {
                Style::new()
            };
            let line = clip(&format!("{fixed}{site}"), usize::from(inner.width));
            let line = format!("{line:<w$}", w = usize::from(inner.width));
            put(buf, inner, inner.x, y, &line, style);
            if r.growth.is_some_and(|g| g >= 512.0) && selected != Some(row) {
                // Growth that never stops is what a leak looks like.
                let gx = inner.x + if wide { 32 } else { 19 };
                put(
                    buf,
                    inner,
                    gx,
                    y,
                    &format!("{:>11}", growth_text(r.growth)),
                    theme.alert(),
                );
            }
        }
    }

    fn detail(&self, inner: Rect, buf: &mut Buffer) {
        let model = self.model;
        let theme = model.theme;
        let view = model.view;
        let Some(row) = view.sites.get(model.sites.selected) else {
            put(
                buf,
                inner,
                inner.x,
                inner.y,
                "nothing selected",
                theme.dim(),
            );
            return;
        };
        let groups = model.data.groups();
        let g = groups.get(row.group);
        let snapshot = model.data.snapshot();
        let mut y = inner.y;
        let bottom = inner.bottom();
        let mut line = |y: &mut u16, text: &str, style: Style| {
            if *y < bottom {
                put(buf, inner, inner.x, *y, text, style);
                *y += 1;
            }
        };
        line(
            &mut y,
            &format!(
                "{}  {}  ·  {} in {} blocks  ·  growth {}/step  (Esc back)",
                g.label(),
                g.function,
                format_bytes(row.bytes),
                thousands(row.blocks),
                growth_text(row.growth)
            ),
            theme.header(),
        );
        let framework: Vec<String> = DEFAULT_FRAMEWORK_PATHS
            .iter()
            .map(|s| s.to_string())
            .collect();
        let blocks_room = usize::from(inner.height / 3).max(3);
        for (n, &site) in g.sites.iter().enumerate().take(4) {
            let Some(s) = snapshot.sites.get(site as usize) else {
                continue;
            };
            line(
                &mut y,
                &format!("stack {} of {}:", n + 1, g.sites.len()),
                theme.dim(),
            );
            if s.frames.is_empty() {
                line(&mut y, &format!("  {}  {}", s, s.function), Style::new());
            }
            let lines = stack_lines(&s.frames, &framework, model.sites.all_frames);
            let mut left: usize = lines.iter().map(StackLine::frames).sum();
            for (i, l) in lines.iter().enumerate() {
                let room = usize::from(bottom.saturating_sub(y));
                if room <= blocks_room {
                    break;
                }
                if room == blocks_room + 1 && i + 1 < lines.len() {
                    // The last row for this stack: say what is cut rather than cut silently.
                    line(
                        &mut y,
                        &format!("  … {} more frames", thousands(left as u64)),
                        theme.dim(),
                    );
                    break;
                }
                left -= l.frames();
                let (text, style) = match l {
                    StackLine::Frame {
                        frame: f,
                        framework,
                        node,
                    } => (
                        format!("  {}:{}  {}", f.file, f.line, f.function),
                        if *framework && !*node {
                            theme.dim()
                        } else {
                            Style::new()
                        },
                    ),
                    StackLine::Folded(n) => (format!("  {}", folded_text(*n)), theme.dim()),
                };
                line(&mut y, &text, style);
            }
        }
        line(&mut y, "", Style::new());
        line(
            &mut y,
            &format!(
                "{:>16} {:>10} {:>10} {:>6}  {:<8} tag / scope",
                "Address", "Size", "Requested", "Step", "State"
            ),
            theme.header(),
        );
        let state = model.state;
        let total = row.blocks as usize;
        // The group's blocks in address order, as many as the panel can show: the lowest
        // addresses are picked out first, so that a group of many blocks is not sorted whole.
        let mut blocks: Vec<(u64, &LiveBlock)> = state
            .blocks
            .unordered()
            .filter(|(_, b)| groups.of_block(b) == row.group)
            .map(|(&addr, b)| (addr, b))
            .collect();
        let room = usize::from(bottom.saturating_sub(y)) + 1;
        if blocks.len() > room {
            blocks.select_nth_unstable_by_key(room, |&(addr, _)| addr);
            blocks.truncate(room);
        }
        blocks.sort_unstable_by_key(|&(addr, _)| addr);
        for (shown, (addr, b)) in blocks.into_iter().enumerate() {
            if y + 1 >= bottom && shown + 1 < total {
                line(
                    &mut y,
                    &format!("… {} more blocks", thousands((total - shown) as u64)),
                    theme.dim(),
                );
                break;
            }
            let tag = snapshot.tag(b.tag).unwrap_or("");
            let scope = snapshot.scope(b.scope).unwrap_or("");
            let text = format!(
                "{:>#16x} {:>10} {:>10} {:>6}  {:<8} {}{}{}",
                addr,
                format_bytes(b.size),
                format_bytes(b.requested),
                b.step,
                if b.pending { "pending" } else { "live" },
                tag,
                if tag.is_empty() || scope.is_empty() {
                    ""
                } else {
                    " / "
                },
                scope
            );
            line(&mut y, &text, Style::new());
        }
    }

    fn tree(&self, inner: Rect, buf: &mut Buffer) {
        let model = self.model;
        let theme = model.theme;
        let view = model.view;
        put(
            buf,
            inner,
            inner.x,
            inner.y,
            &format!(
                "{:>10} {:>8}  Stack (outermost frame first)",
                live_header(model),
                "Blocks"
            ),
            theme.header(),
        );
        let rows = usize::from(inner.height - 1);
        if view.tree.is_empty() {
            put(
                buf,
                inner,
                inner.x,
                inner.y + 1,
                "no live blocks at the cursor",
                theme.dim(),
            );
            return;
        }
        let selected = (model.panel == Panel::Sites).then_some(model.sites.selected);
        let first = scroll_for(selected.unwrap_or(0), rows);
        for (i, r) in view.tree.iter().enumerate().skip(first).take(rows) {
            let y = inner.y + 1 + (i - first) as u16;
            let indent = "  ".repeat(r.depth.min(20));
            let text = format!(
                "{:>10} {:>8}  {indent}{} {}",
                format_bytes(r.bytes),
                thousands(r.blocks),
                match (r.has_children, r.collapsed) {
                    (true, false) => "▾",
                    (true, true) => "▸",
                    (false, _) => "·",
                },
                r.label
            );
            let style = if selected == Some(i) {
                theme.selected()
            } else if r.framework {
                theme.dim()
            } else {
                Style::new()
            };
            let text = clip(&text, usize::from(inner.width));
            put(
                buf,
                inner,
                inner.x,
                y,
                &format!("{text:<w$}", w = usize::from(inner.width)),
                style,
            );
        }
    }
}
