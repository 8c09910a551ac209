//! A report's tables, each built once from the [`Report`] and written by one writer per format:
//! [`Table::text`] (columns aligned for a terminal), [`Table::markdown`] (every cell from a file
//! escaped by [`crate::markdown`]) and [`Table::html`] (a `maud` template, every cell escaped
//! by construction). A [`Table`] is plain data: its columns (header, alignment, and which
//! formats show them: the text report leaves some out, the page merges a finding's summary,
//! evidence and fix into one column), and its rows of [`Cell`]s, each the cell's plain text and,
//! where the page shows more (a site in code type with its function beside it), the parts the
//! page shows. The text report lists its findings rather than tabling them; the ranks tables
//! are `crate::ranks`'s own.

use maud::{html, Markup};
use vramscope_analysis::detect::Severity;
use vramscope_analysis::report::Report;
use vramscope_model::format_bytes;

use crate::html::Line;

/// How a column's cells line up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Align {
    /// Text, from the left.
    Left,
    /// Figures, from the right.
    Right,
}

/// A column of a [`Table`]: its header, its alignment and the formats that show it.
#[derive(Clone, Debug)]
pub struct Column {
    /// The header in markdown and on the page.
    pub header: &'static str,
    /// How the cells line up.
    pub align: Align,
    /// The text report's header and width, or `None` where the text leaves the column out.
    pub text: Option<TextColumn>,
    /// Whether the markdown table shows the column.
    pub markdown: bool,
    /// Whether the page shows the column.
    pub html: bool,
}

/// A column as the text report writes it: a short header, and the width it pads cells to (a
/// longer cell overflows, as `format!`'s width does). The last column, on the left, is not
/// padded.
#[derive(Clone, Copy, Debug)]
pub struct TextColumn {
    /// The header.
    pub header: &'static str,
    /// The width.
    pub width: usize,
}

/// A row of a [`Table`].
#[derive(Clone, Debug, Default)]
pub struct Row {
    /// The finding the row is, when it is one: the page gives the row the anchor
    /// `finding-N` that the verdict's list links to.
    pub finding: Option<usize>,
    /// One cell per column.
    pub cells: Vec<Cell>,
}

/// A cell of a [`Table`].
#[derive(Clone, Debug, Default)]
pub struct Cell {
    /// The cell as plain text: what the text and markdown tables show.
    pub text: String,
    /// Whether `text` is a word of vramscope's own (a severity, a finding's kind) that markdown
    /// writes as it is; every other cell is escaped for markdown.
    pub own: bool,
    /// Whether the page sets the whole cell back in grey (the row of the other sites).
    pub muted: bool,
    /// What the page shows, where it shows more than `text`; empty: `text`.
    pub page: Vec<Part>,
}

/// A part of a cell on the page.
#[derive(Clone, Debug)]
pub enum Part {
    /// Text.
    Text(String),
    /// A name in code type: a site, a kind.
    Code(String),
    /// Text set back in grey: a function beside its site.
    Muted(String),
    /// A line break.
    Break,
    /// A severity, as a coloured badge.
    Severity(Severity),
    /// A finding's evidence, in small type below its summary.
    Evidence(String),
    /// A finding's fix, on a line of its own after `fix:`.
    Fix(String),
}

impl Cell {
    /// A cell of `text`, from a file or quoting one.
    fn text(text: impl Into<String>) -> Cell {
        Cell {
            text: text.into(),
            ..Cell::default()
        }
    }

    /// A cell of a figure.
    fn figure(value: impl ToString) -> Cell {
        Cell::text(value.to_string())
    }

    /// A cell of a word of vramscope's own, shown on the page as `page`.
    fn own(text: &str, page: Part) -> Cell {
        Cell {
            text: text.to_string(),
            own: true,
            page: vec![page],
            ..Cell::default()
        }
    }
}

/// A table: columns and rows of cells, written by [`Table::text`], [`Table::markdown`] and
/// [`Table::html`].
#[derive(Clone, Debug, Default)]
pub struct Table {
    /// The page's `id` of the table.
    pub id: Option<&'static str>,
    /// The columns.
    pub columns: Vec<Column>,
    /// The rows.
    pub rows: Vec<Row>,
}

/// A column shown in every format, with the text report's header and width.
fn column(header: &'static str, align: Align, text: &'static str, width: usize) -> Column {
    Column {
        header,
        align,
        text: Some(TextColumn {
            header: text,
            width,
        }),
        markdown: true,
        html: true,
    }
}

/// A column that the text report leaves out.
fn not_in_text(header: &'static str, align: Align, markdown: bool, html: bool) -> Column {
    Column {
        header,
        align,
        text: None,
        markdown,
        html,
    }
}

impl Table {
    /// The top call sites, live at the end and at the peak, and a row of the other sites.
    pub fn top_sites(report: &Report) -> Table {
        let columns = vec![
            column("live", Align::Right, "live", 10),
            column("blocks", Align::Right, "blocks", 8),
            column("at peak", Align::Right, "peak", 10),
            column("blocks", Align::Right, "blocks", 8),
            not_in_text("allocations", Align::Right, true, true),
            column("site", Align::Left, "site", 0),
        ];
        let mut rows: Vec<Row> = report
            .top_sites
            .iter()
            .map(|t| Row {
                finding: None,
                cells: vec![
                    Cell::text(format_bytes(t.live_bytes)),
                    Cell::figure(t.live_blocks),
                    Cell::text(format_bytes(t.peak_bytes)),
                    Cell::figure(t.peak_blocks),
                    Cell::figure(t.allocations),
                    Cell {
                        page: vec![
                            Part::Code(t.label.clone()),
                            Part::Text(" ".to_string()),
                            Part::Muted(t.function.clone()),
                        ],
                        ..Cell::text(crate::text::site_with_function(Some(&t.label), &t.function))
                    },
                ],
            })
            .collect();
        if let Some(o) = &report.other_sites {
            rows.push(Row {
                finding: None,
                cells: vec![
                    Cell::text(format_bytes(o.live_bytes)),
                    Cell::figure(o.live_blocks),
                    Cell::text(format_bytes(o.peak_bytes)),
                    Cell::figure(o.peak_blocks),
                    Cell::figure(o.allocations),
                    Cell {
                        muted: true,
                        ..Cell::text(o.label())
                    },
                ],
            });
        }
        Table {
            id: None,
            columns,
            rows,
        }
    }

    /// The findings: severity, kind, site, what was found, its evidence and its fix. Markdown
    /// gives the summary and the fix a column each; the page says what was found, its
    /// evidence and its fix in one. The text report lists the findings instead.
    pub fn findings(report: &Report) -> Table {
        let columns = vec![
            not_in_text("severity", Align::Left, true, true),
            not_in_text("kind", Align::Left, true, true),
            not_in_text("site", Align::Left, true, true),
            not_in_text("summary", Align::Left, true, false),
            not_in_text("fix", Align::Left, true, false),
            not_in_text("what", Align::Left, false, true),
        ];
        let rows = report
            .findings
            .iter()
            .enumerate()
            .map(|(i, f)| {
                let evidence = f
                    .evidence
                    .entries()
                    .iter()
                    .map(|(k, v)| format!("{k}={v}"))
                    .collect::<Vec<_>>()
                    .join(", ");
                Row {
                    finding: Some(i),
                    cells: vec![
                        Cell::own(f.severity.as_str(), Part::Severity(f.severity)),
                        Cell::own(f.kind.as_str(), Part::Code(f.kind.as_str().to_string())),
                        Cell {
                            page: vec![
                                Part::Code(f.site_label().to_string()),
                                Part::Break,
                                Part::Muted(f.function.clone()),
                            ],
                            ..Cell::text(crate::text::site_with_function(
                                f.site.as_deref(),
                                &f.function,
                            ))
                        },
                        Cell::text(f.summary.clone()),
                        Cell::text(f.fix.clone()),
                        Cell {
                            page: vec![
                                Part::Text(f.summary.clone()),
                                Part::Evidence(evidence.clone()),
                                Part::Fix(f.fix.clone()),
                            ],
                            ..Cell::text(format!("{}; {evidence}; fix: {}", f.summary, f.fix))
                        },
                    ],
                }
            })
            .collect();
        Table {
            id: Some("findings"),
            columns,
            rows,
        }
    }

    /// The table as text for a terminal: a line of headers, then a line per row, each
    /// opening with `indent`; figures padded on the left to their column's width, one space
    /// between columns and two before a column of text. Cells are escaped for the terminal
    /// (`vramscope_model::terminal::sanitize`).
    pub fn text(&self, indent: &str) -> String {
        let shown: Vec<(usize, &Column, TextColumn)> = self
            .columns
            .iter()
            .enumerate()
            .filter_map(|(i, c)| c.text.map(|t| (i, c, t)))
            .collect();
        let line = |cell: &dyn Fn(usize, TextColumn) -> String| {
            let mut out = indent.to_string();
            for (place, &(i, c, t)) in shown.iter().enumerate() {
                let text = cell(i, t);
                let last = place + 1 == shown.len();
                if place > 0 {
                    out.push_str(if c.align == Align::Left { "  " } else { " " });
                }
                match c.align {
                    Align::Right => out.push_str(&format!("{text:>width$}", width = t.width)),
                    Align::Left if last => out.push_str(&text),
                    Align::Left => out.push_str(&format!("{text:<width$}", width = t.width)),
                }
            }
            out.push('\n');
            out
        };
        let mut out = line(&|_, t| t.header.to_string());
        for row in &self.rows {
            out.push_str(&line(&|i, _| {
                vramscope_model::terminal::sanitize(&row.cells[i].text).into_owned()
            }));
        }
        out
    }

    /// The table in GitHub-flavoured markdown: every cell escaped by
    /// [`crate::markdown::escape`] but vramscope's own words.
    pub fn markdown(&self) -> String {
        let shown: Vec<(usize, &Column)> = self
            .columns
            .iter()
            .enumerate()
            .filter(|(_, c)| c.markdown)
            .collect();
        let line = |cells: Vec<String>| format!("| {} |\n", cells.join(" | "));
        let mut out = line(shown.iter().map(|(_, c)| c.header.to_string()).collect());
        let rule: Vec<&str> = shown
            .iter()
            .map(|(_, c)| match c.align {
                Align::Left => "---",
                Align::Right => "---:",
            })
            .collect();
        out.push_str(&format!("|{}|\n", rule.join("|")));
        for row in &self.rows {
            out.push_str(&line(
                shown
                    .iter()
                    .map(|&(i, _)| {
                        let cell = &row.cells[i];
                        if cell.own {
                            cell.text.clone()
                        } else {
                            crate::markdown::escape(&cell.text)
                        }
                    })
                    .collect(),
            ));
        }
        out
    }

    /// The table on the page: a row of headers, then the rows, figures in cells of class
    /// `num`; a finding's row has the anchor `finding-N`.
    pub fn html(&self) -> Markup {
        let shown: Vec<(usize, &Column)> = self
            .columns
            .iter()
            .enumerate()
            .filter(|(_, c)| c.html)
            .collect();
        html! {
            table id=[self.id] {
                tr { @for (_, c) in &shown { th { (c.header) } } }
                @for row in &self.rows {
                    tr id=[row.finding.map(|i| format!("finding-{i}"))] data-finding=[row.finding] {
                        @for &(i, c) in &shown {
                            @let cell = &row.cells[i];
                            @let class = if c.align == Align::Right {
                                Some("num")
                            } else if cell.muted {
                                Some("muted")
                            } else {
                                None
                            };
                            td class=[class] {
                                @if cell.page.is_empty() {
                                    (Line(&cell.text))
                                }
                                @for part in &cell.page { (part_html(part)) }
                            }
                        }
                    }
                }
            }
        }
    }
}

/// A part of a cell on the page.
fn part_html(part: &Part) -> Markup {
    html! {
        @match part {
            Part::Text(text) => { (Line(text)) }
            Part::Code(text) => { code { (Line(text)) } }
            Part::Muted(text) => { span class="muted" { (Line(text)) } }
            Part::Break => { br; }
            Part::Severity(severity) => { (crate::html::severity_badge(*severity)) }
            Part::Evidence(text) => { div class="ev" { (Line(text)) } }
            Part::Fix(text) => { div { b { "fix:" } " " (Line(text)) } }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table() -> Table {
        Table {
            id: Some("t"),
            columns: vec![
                column("bytes", Align::Right, "b", 6),
                not_in_text("count", Align::Right, true, true),
                column("name", Align::Left, "name", 0),
            ],
            rows: vec![
                Row {
                    finding: None,
                    cells: vec![
                        Cell::text("1 KiB"),
                        Cell::figure(3),
                        Cell::text("a|b <i>\n##[x]"),
                    ],
                },
                Row {
                    finding: Some(2),
                    cells: vec![
                        Cell::text("12 MiB"),
                        Cell::figure(40),
                        Cell {
                            muted: true,
                            ..Cell::text("rest")
                        },
                    ],
                },
            ],
        }
    }

    #[test]
    fn text_aligns_figures_and_escapes_names() {
        assert_eq!(
            table().text("  "),
            "       b  name\n   1 KiB  a|b <i>\\u{a}##\\u{5b}x]\n  12 MiB  rest\n"
        );
    }

    #[test]
    fn markdown_escapes_every_cell_from_a_file() {
        assert_eq!(
            table().markdown(),
            "| bytes | count | name |\n|---:|---:|---|\n| 1 KiB | 3 | a\\|b \\<i\\> ##\\[x\\] |\n| 12 MiB | 40 | rest |\n"
        );
    }

    #[test]
    fn html_escapes_every_cell_and_anchors_findings() {
        assert_eq!(
            table().html().into_string(),
            "<table id=\"t\"><tr><th>bytes</th><th>count</th><th>name</th></tr>\
<tr><td class=\"num\">1 KiB</td><td class=\"num\">3</td><td>a|b &lt;i&gt;&#10;##&#91;x]</td></tr>\
<tr id=\"finding-2\" data-finding=\"2\"><td class=\"num\">12 MiB</td><td class=\"num\">40</td><td class=\"muted\">rest</td></tr></table>"
        );
    }
}
