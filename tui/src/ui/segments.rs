//! The segment map: every segment at the time cursor as a row of cells coloured by block state.
//!
//! A row is one segment (address, size, pool) followed by cells that each cover an equal share
//! of its bytes; a cell shows the state holding most of its bytes: allocated `█`, pending free
//! `▓`, inactive split `▒` (free space in a segment that still holds live blocks, which
//! `empty_cache()` cannot release) or free `·` (a segment with no live block). The title sums
//! the segments up. The state comes from `crate::data::Dataset::state_at` through
//! `crate::view::ViewModel::state` (which `crate::app::App` fills from its cache).

use ratatui::buffer::Buffer;
use ratatui::layout::Rect;
use ratatui::style::Style;
use ratatui::widgets::Widget;
use vramscope_model::{format_bytes, Pool};

use super::{inside_border, panel_block, put, thousands, Theme};
use crate::view::{Panel, ViewModel};
use vramscope_engine::{MemoryState, SegmentInfo};

/// The state of one cell.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cell {
    /// Mostly allocated bytes.
    Allocated,
    /// Mostly pending-free bytes.
    Pending,
    /// Mostly free bytes in a segment with live blocks.
    Split,
    /// Free bytes in a segment without live blocks.
    Free,
}

impl Cell {
    fn symbol(self) -> &'static str {
        match self {
            Cell::Allocated => "█",
            Cell::Pending => "▓",
            Cell::Split => "▒",
            Cell::Free => "·",
        }
    }

    fn style(self, theme: Theme) -> Style {
        match self {
            Cell::Allocated => theme.allocated(),
            Cell::Pending => theme.pending(),
            Cell::Split => theme.split(),
            Cell::Free => theme.free(),
        }
    }
}

/// The cells of the segment at `addr`: `width` cells, each the state with most bytes in it.
pub fn cells(state: &MemoryState, addr: u64, seg: &SegmentInfo, width: usize) -> Vec<Cell> {
    if width == 0 || seg.size == 0 {
        return Vec::new();
    }
    // Bytes per cell: allocated, pending.
    let mut alloc = vec![0u64; width];
    let mut pending = vec![0u64; width];
    let mut any = false;
    let size = seg.size as u128;
    let w = width as u128;
    for (&a, b) in state.blocks_in(addr, seg.size) {
        any = true;
        let start = (a - addr) as u128;
        let end = (start + b.size as u128).min(size);
        let first = (start * w / size) as usize;
        let last = (((end.max(start + 1)) * w).div_ceil(size) as usize).min(width);
        for c in first..last {
            let c0 = c as u128 * size / w;
            let c1 = (c as u128 + 1) * size / w;
            let overlap = end.min(c1).saturating_sub(start.max(c0)) as u64;
            if b.pending {
                pending[c] += overlap;
            } else {
                alloc[c] += overlap;
            }
        }
    }
    (0..width)
        .map(|c| {
            let cell_bytes = ((c as u128 + 1) * size / w - c as u128 * size / w) as u64;
            let free = cell_bytes.saturating_sub(alloc[c] + pending[c]);
            if alloc[c] > 0 && alloc[c] >= pending[c] && alloc[c] >= free {
                Cell::Allocated
            } else if pending[c] > 0 && pending[c] >= free {
                Cell::Pending
            } else if any {
                Cell::Split
            } else {
                Cell::Free
            }
        })
        .collect()
}

/// An address in at most 12 characters, always as `0x…`: whole when it has at most ten hex
/// digits, else `0x…` and its last nine.
pub fn short_address(addr: u64) -> String {
    if addr <= 0xff_ffff_ffff {
        format!("{addr:#x}")
    } else {
        format!("0x…{:09x}", addr & 0xf_ffff_ffff)
    }
}

/// The segment-map panel.
pub struct SegmentsPanel<'a> {
    /// What the frame shows.
    pub model: &'a ViewModel<'a>,
    /// Drawn inside the overview.
    pub compact: bool,
}

impl Widget for SegmentsPanel<'_> {
    fn render(self, area: Rect, buf: &mut Buffer) {
        let model = self.model;
        let theme = model.theme;
        let state = model.state;
        let figures = model.view.segments;
        let count = state.segments.len();
        let title = format!(
            " Segments · {} · reserved {} · allocated {} · inactive split {} · largest free {} ",
            thousands(figures.count),
            format_bytes(state.reserved),
            format_bytes(state.allocated),
            format_bytes(figures.split_bytes),
            format_bytes(figures.largest_free),
        );
        let focused = model.panel == Panel::Segments;
        panel_block(title, theme, focused).render(area, buf);
        let inner = inside_border(area);
        if inner.height == 0 || inner.width < 10 {
            return;
        }
        // Legend.
        let mut x = inner.x;
        for (cell, name) in [
            (Cell::Allocated, " allocated  "),
            (Cell::Pending, " pending free  "),
            (Cell::Split, " inactive split  "),
            (Cell::Free, " free  "),
        ] {
            x = put(buf, inner, x, inner.y, cell.symbol(), cell.style(theme));
            x = put(buf, inner, x, inner.y, name, theme.dim());
        }
        let pools = if inner.width >= 100 {
            "s/L small/large pool, x expandable"
        } else {
            "s/L small/large pool"
        };
        put(buf, inner, x, inner.y, pools, theme.dim());
        let rows = usize::from(inner.height.saturating_sub(1));
        if count == 0 {
            let orphan = state.orphan_bytes();
            let text = if orphan > 0 {
                format!(
                    "no segment data in this trace; {} in {} live blocks",
                    format_bytes(orphan),
                    thousands(state.blocks.len() as u64)
                )
            } else {
                "no segments".to_string()
            };
            put(buf, inner, inner.x, inner.y + 1, &text, theme.dim());
            return;
        }
        let wide = inner.width >= 100;
        let label_w: u16 = if wide { 34 } else { 24 };
        let cells_w = usize::from(
            inner
                .width
                .saturating_sub(label_w + if wide { 12 } else { 0 }),
        );
        let scroll = model.segment_scroll.min(count.saturating_sub(1));
        let more_below = count > scroll + rows;
        let shown = if more_below {
            rows.saturating_sub(1)
        } else {
            rows
        };
        for (row, (&addr, seg)) in state.segments.iter().skip(scroll).take(shown).enumerate() {
            let y = inner.y + 1 + row as u16;
            let pool = match seg.pool {
                Pool::Small => 's',
                Pool::Large => 'L',
            };
            let label = if wide {
                format!(
                    "{:#014x} {:>9} {pool}{} s{:<3}",
                    addr,
                    format_bytes(seg.size),
                    if seg.expandable { 'x' } else { ' ' },
                    seg.stream
                )
            } else {
                format!(
                    "{:>12} {:>9} {pool}",
                    short_address(addr),
                    format_bytes(seg.size)
                )
            };
            let x = put(
                buf,
                inner,
                inner.x,
                y,
                &format!("{label:<w$}", w = usize::from(label_w)),
                theme.dim(),
            );
            let row_cells = cells(state, addr, seg, cells_w);
            for (c, cell) in row_cells.iter().enumerate() {
                let cx = x + c as u16;
                if cx < inner.right() {
                    buf[(cx, y)]
                        .set_symbol(cell.symbol())
                        .set_style(cell.style(theme));
                }
            }
            if wide {
                // Allocated share, and the inactive-split share: free bytes in a segment that
                // holds active blocks, which empty_cache() cannot release.
                let (mut live, mut active) = (0u64, 0u64);
                for (_, b) in state.blocks_in(addr, seg.size) {
                    active += b.size;
                    if !b.pending {
                        live += b.size;
                    }
                }
                let share = |bytes: u64| bytes as f64 * 100.0 / seg.size.max(1) as f64;
                let split = if active > 0 {
                    format!("▒{:>3.0}%", share(seg.size.saturating_sub(active)))
                } else {
                    String::new()
                };
                put(
                    buf,
                    inner,
                    x + cells_w as u16,
                    y,
                    &format!(" {:>4.0}% {split}", share(live)),
                    theme.dim(),
                );
            }
        }
        if more_below {
            let y = inner.y + 1 + shown as u16;
            put(
                buf,
                inner,
                inner.x,
                y,
                &format!(
                    "↓ {} more segments (↑↓ scroll)",
                    thousands((count - scroll - shown) as u64)
                ),
                theme.dim(),
            );
        }
    }
}
