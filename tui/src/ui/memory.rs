//! The memory panel: what the memory at the cursor is made of (issue 46).
//!
//! On top, [`CategoryBar`]: the allocated bytes at the cursor as one bar split by
//! `vramscope_model::Category` (activations, parameters, optimizer state, gradients, ...), each
//! with its own glyph (and colour, where the theme has colours), and a legend giving each
//! category's bytes and share. Below, the live bytes by the user's call tree
//! (`vramscope_analysis::call_tree`: the driver's lines, each module's `forward`, the lines in
//! it), a folding tree whose rows `crate::app::App::prepare` computed (the largest nodes open
//! while their rows fit the panel); Enter folds or opens the selected node. Both read the view model alone, and a frame costs the rows it shows.

use ratatui::buffer::Buffer;
use ratatui::layout::Rect;
use ratatui::style::{Color, Style};
use ratatui::widgets::Widget;
use vramscope_model::{format_bytes, Category, CategoryBytes};

use super::sites::scroll_for;
use super::{clip, inside_border, panel_block, put, thousands, Theme};
use crate::view::{Panel, ViewModel};

/// The glyph that stands for `category` in the bar and the legend.
pub fn glyph(category: Category) -> &'static str {
    match category {
        Category::Activations => "█",
        Category::Parameters => "▓",
        Category::OptimizerState => "▒",
        Category::Gradients => "░",
        Category::Temporaries => "▞",
        Category::Inputs => "▪",
        Category::BeforeTrace => "▚",
        Category::Unknown => "·",
    }
}

/// The style of `category` in the bar and the legend.
pub fn style(theme: Theme, category: Category) -> Style {
    if !theme.color {
        return Style::new();
    }
    let color = match category {
        Category::Activations => Color::LightRed,
        Category::Parameters => Color::Blue,
        Category::OptimizerState => Color::Magenta,
        Category::Gradients => Color::Yellow,
        Category::Temporaries => Color::Cyan,
        Category::Inputs => Color::Green,
        Category::BeforeTrace => Color::Gray,
        Category::Unknown => Color::DarkGray,
    };
    Style::new().fg(color)
}

/// Columns of a bar `width` wide for each category of `bytes`, in chart order: proportional,
/// the columns left by rounding down given to the largest remainders (ties to the earlier
/// category), so that they add up to `width` whenever any byte is allocated.
pub fn bar_columns(bytes: &CategoryBytes, width: u16) -> [u16; Category::COUNT] {
    let mut columns = [0u16; Category::COUNT];
    let total = bytes.total();
    if total == 0 {
        return columns;
    }
    let width = u128::from(width);
    let mut remainders = [(0u128, 0usize); Category::COUNT];
    let mut used = 0u128;
    for (i, (_, b)) in bytes.iter().enumerate() {
        let exact = u128::from(b) * width;
        columns[i] = (exact / u128::from(total)) as u16;
        used += exact / u128::from(total);
        remainders[i] = (exact % u128::from(total), i);
    }
    remainders.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
    for &(_, i) in remainders.iter().take((width - used) as usize) {
        columns[i] += 1;
    }
    columns
}

/// The categories at the cursor: the bar on one row, the legend on the rows below.
pub struct CategoryBar<'a> {
    /// Bytes by category.
    pub bytes: &'a CategoryBytes,
    /// The theme.
    pub theme: Theme,
}

impl CategoryBar<'_> {
    /// Rows the legend takes in `width` columns.
    pub fn legend_rows(&self, width: u16) -> u16 {
        self.legend(width).len() as u16
    }

    /// The legend's entries, packed into rows of `width` columns.
    fn legend(&self, width: u16) -> Vec<Vec<(Category, String)>> {
        let total = self.bytes.total().max(1);
        let mut rows: Vec<Vec<(Category, String)>> = vec![Vec::new()];
        let mut used = 0usize;
        for (category, bytes) in self.bytes.nonzero() {
            let share = bytes as f64 * 100.0 / total as f64;
            let text = format!("{} {} {share:.0}%", category.label(), format_bytes(bytes));
            let w = text.chars().count() + 4;
            if used > 0 && used + w > usize::from(width) {
                rows.push(Vec::new());
                used = 0;
            }
            used += w;
            if let Some(row) = rows.last_mut() {
                row.push((category, text));
            }
        }
        rows.retain(|r| !r.is_empty());
        rows
    }
}

impl Widget for CategoryBar<'_> {
    fn render(self, area: Rect, buf: &mut Buffer) {
        if area.height == 0 || area.width == 0 {
            return;
        }
        if self.bytes.total() == 0 {
            put(
                buf,
                area,
                area.x,
                area.y,
                "nothing allocated at the cursor",
                self.theme.dim(),
            );
            return;
        }
        let columns = bar_columns(self.bytes, area.width);
        let mut x = area.x;
        for (category, &n) in Category::ALL.iter().zip(columns.iter()) {
            let text = glyph(*category).repeat(usize::from(n));
            x = put(buf, area, x, area.y, &text, style(self.theme, *category));
        }
        for (k, row) in self.legend(area.width).iter().enumerate() {
            let y = area.y + 1 + k as u16;
            let mut x = area.x;
            for (category, text) in row {
                x = put(
                    buf,
                    area,
                    x,
                    y,
                    glyph(*category),
                    style(self.theme, *category),
                );
                x = put(buf, area, x, y, &format!(" {text}   "), Style::new());
            }
        }
    }
}

/// Where the memory panel drawn in `area` puts its parts, with the legend of `bar` packed
/// into the room inside the border: the drawing and the tree's default opening
/// (`crate::app::App`, which opens as many nodes as the list has rows) both read it, so that
/// the nodes opened are the ones the rows show.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemoryGeometry {
    /// The bar and its legend; empty when the panel is too small to draw anything.
    pub bar: Rect,
    /// The call tree, its header row included; empty when no row is left for it.
    pub tree: Rect,
}

impl MemoryGeometry {
    /// The parts of a memory panel drawn in `area` (its border included) with `bar`.
    pub fn of(area: Rect, bar: &CategoryBar<'_>) -> MemoryGeometry {
        let inner = inside_border(area);
        if inner.height == 0 || inner.width < 20 {
            return MemoryGeometry::default();
        }
        let bar_h = (1 + bar.legend_rows(inner.width)).min(inner.height);
        let bar_area = Rect::new(inner.x, inner.y, inner.width, bar_h);
        // One blank row between the legend and the tree.
        let top = inner.y + bar_h + 1;
        let tree = if top < inner.bottom() {
            Rect::new(inner.x, top, inner.width, inner.bottom() - top)
        } else {
            Rect::default()
        };
        MemoryGeometry {
            bar: bar_area,
            tree,
        }
    }

    /// The tree's rows below its header: how many nodes one screen of the list shows.
    pub fn tree_list_rows(&self) -> usize {
        usize::from(self.tree.height.saturating_sub(1))
    }
}

/// The memory panel.
pub struct MemoryPanel<'a> {
    /// What the frame shows.
    pub model: &'a ViewModel<'a>,
}

impl Widget for MemoryPanel<'_> {
    fn render(self, area: Rect, buf: &mut Buffer) {
        let model = self.model;
        let theme = model.theme;
        let view = model.view;
        let at = if model.pos >= model.data.len() {
            "at the end".to_string()
        } else {
            format!("at event {}", thousands(model.pos as u64))
        };
        let title = format!(
            " Memory {at} · {} by what it is ",
            format_bytes(view.categories.total())
        );
        panel_block(title, theme, true).render(area, buf);
        let bar = CategoryBar {
            bytes: &view.categories,
            theme,
        };
        let geometry = MemoryGeometry::of(area, &bar);
        if geometry.bar.is_empty() {
            return;
        }
        bar.render(geometry.bar, buf);
        let tree = geometry.tree;
        if tree.is_empty() {
            return;
        }
        let header = format!(
            "{:>10} {:>7}  {:<17} By the call tree",
            "Bytes", "Blocks", "Mostly"
        );
        put(buf, tree, tree.x, tree.y, &header, theme.header());
        let rows = usize::from(tree.height - 1);
        if view.memory.is_empty() {
            put(
                buf,
                tree,
                tree.x,
                tree.y + 1,
                "no live blocks at the cursor",
                theme.dim(),
            );
            return;
        }
        let selected = model.memory.selected;
        let first = scroll_for(selected, rows);
        for (k, row) in view.memory.iter().skip(first).take(rows).enumerate() {
            let y = tree.y + 1 + k as u16;
            let line_style = if first + k == selected && model.panel == Panel::Memory {
                theme.selected()
            } else {
                Style::new()
            };
            let main = row.main.map_or("", |c| c.label());
            let fold = match (row.has_children, row.folded) {
                (false, _) => "  ",
                (true, true) => "▸ ",
                (true, false) => "▾ ",
            };
            let figures = format!(
                "{:>10} {:>7}  ",
                format_bytes(row.bytes),
                thousands(row.blocks)
            );
            let x = put(buf, tree, tree.x, y, &figures, line_style);
            let x = match row.main {
                Some(c) => {
                    let x = put(buf, tree, x, y, glyph(c), style(theme, c).patch(line_style));
                    put(buf, tree, x, y, &format!(" {main:<16}"), line_style)
                }
                None => put(buf, tree, x, y, &format!("{:<18}", ""), line_style),
            };
            let indent = "  ".repeat(row.depth.min(20));
            let room = usize::from(tree.right().saturating_sub(x));
            let label = clip(&format!("{indent}{fold}{}", row.label), room);
            put(buf, tree, x, y, &label, line_style);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bar_columns_add_up_to_the_width() {
        let mut bytes = CategoryBytes::new();
        bytes.add(Category::Activations, 7);
        bytes.add(Category::Parameters, 2);
        bytes.add(Category::Gradients, 1);
        let columns = bar_columns(&bytes, 80);
        assert_eq!(columns.iter().map(|&c| u32::from(c)).sum::<u32>(), 80);
        assert_eq!(columns[Category::Activations.index()], 56);
        assert_eq!(columns[Category::Parameters.index()], 16);
        assert_eq!(columns[Category::Gradients.index()], 8);
        // Thirds of 10 columns: the spare column to the first of the equal remainders.
        let mut thirds = CategoryBytes::new();
        for c in [
            Category::Activations,
            Category::Parameters,
            Category::Unknown,
        ] {
            thirds.add(c, 1);
        }
        let columns = bar_columns(&thirds, 10);
        assert_eq!(columns[Category::Activations.index()], 4);
        assert_eq!(columns[Category::Parameters.index()], 3);
        assert_eq!(columns[Category::Unknown.index()], 3);
        assert_eq!(bar_columns(&CategoryBytes::new(), 10), [0; Category::COUNT]);
    }
}
