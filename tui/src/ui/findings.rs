//! The findings panel: what the inspector's detectors say about the data up to the time cursor.
//!
//! The list shows each finding's severity, kind, call site and summary, most severe first (the
//! order of `vramscope_analysis::detect::sort_findings`); below it, the selected finding's
//! evidence and its one-line fix. The findings come from `crate::analysis`, recomputed as live
//! data arrives and when the cursor rests somewhere new.

use ratatui::buffer::Buffer;
use ratatui::layout::Rect;
use ratatui::style::Style;
use ratatui::widgets::Widget;
use vramscope_analysis::detect::{Finding, Severity};

use super::{clip, clip_left, inside_border, panel_block, put, Theme};
use crate::ui::sites::scroll_for;
use crate::view::{Panel, ViewModel};

/// The findings panel.
pub struct FindingsPanel<'a> {
    /// What the frame shows.
    pub model: &'a ViewModel<'a>,
    /// Drawn inside the overview.
    pub compact: bool,
}

fn badge(severity: Severity) -> &'static str {
    match severity {
        Severity::Error => "ERROR",
        Severity::Warning => "WARN ",
        Severity::Info => "info ",
    }
}

/// Splits `text` into lines of at most `width` characters at spaces.
pub fn wrap(text: &str, width: usize) -> Vec<String> {
    let mut lines = Vec::new();
    let mut line = String::new();
    for word in text.split_whitespace() {
        let len = line.chars().count();
        if len > 0 && len + 1 + word.chars().count() > width {
            lines.push(std::mem::take(&mut line));
        }
        if !line.is_empty() {
            line.push(' ');
        }
        line.push_str(word);
    }
    if !line.is_empty() {
        lines.push(line);
    }
    lines
}

/// The whole file's errors and warnings, when the dashboard shows a file.
fn file_problems(model: &ViewModel<'_>) -> Option<(usize, usize)> {
    let findings = model.file_findings?;
    let n = |s| findings.iter().filter(|f| f.severity == s).count();
    Some((n(Severity::Error), n(Severity::Warning)))
}

impl Widget for FindingsPanel<'_> {
    fn render(self, area: Rect, buf: &mut Buffer) {
        let model = self.model;
        let theme = model.theme;
        let view = model.view;
        let analysis = model.analysis;
        // Where the findings were evaluated: up to the cursor, or over the whole trace.
        let at = match analysis.map(|a| a.cut) {
            Some(Some(_)) => " at the cursor",
            Some(None) => " at the end",
            None => "",
        };
        let mut title = match analysis {
            Some(a) => {
                let shown: Vec<&Finding> = view
                    .findings
                    .iter()
                    .filter_map(|&i| a.findings.get(i))
                    .collect();
                let n = |s| shown.iter().filter(|f| f.severity == s).count();
                format!(
                    " Findings{at} · {} · {} · {} info ",
                    vramscope_model::plural(n(Severity::Error) as u64, "error"),
                    vramscope_model::plural(n(Severity::Warning) as u64, "warning"),
                    n(Severity::Info)
                )
            }
            None => " Findings ".to_string(),
        };
        // The whole file's errors and warnings, beside the cursor's when they differ: a file
        // whose OOM or churn happens elsewhere does not read as clean at the cursor.
        let file_note = file_problems(model).filter(|&(e, w)| {
            let here =
                |s| analysis.map_or(0, |a| a.findings.iter().filter(|f| f.severity == s).count());
            analysis.is_some_and(|a| a.cut.is_some())
                && (e, w) != (here(Severity::Error), here(Severity::Warning))
        });
        if let Some((e, w)) = file_note {
            title.push_str(&format!("· file: {e} errors · {w} warnings "));
        }
        if !model.findings.filter.is_empty() {
            title.push_str(&format!("· /{} ", model.findings.filter));
        }
        let focused = model.panel == Panel::Findings;
        panel_block(title, theme, focused).render(area, buf);
        let inner = inside_border(area);
        if inner.height == 0 || inner.width < 20 {
            return;
        }
        let Some(analysis) = analysis else {
            put(buf, inner, inner.x, inner.y, "analysing…", theme.dim());
            return;
        };
        if view.findings.is_empty() {
            let text = match file_note {
                _ if !analysis.findings.is_empty() => {
                    "no finding matches the filter (Esc clears it)".to_string()
                }
                Some((e, w)) if e + w > 0 => format!(
                    "none up to the cursor; the file has {e} errors and {w} warnings (End: the whole file)"
                ),
                _ => "no findings: nothing retained per step, no syncs in loops, no churn"
                    .to_string(),
            };
            put(buf, inner, inner.x, inner.y, &text, theme.dim());
            return;
        }
        let selected = (!self.compact || focused).then_some(model.findings.selected);
        // The list takes the top, the selected finding's details the rest.
        let details = !self.compact && inner.height >= 8;
        // Every error and warning fits in the list when the panel can hold them.
        let serious = view
            .findings
            .iter()
            .filter(|&&i| analysis.findings[i].severity != Severity::Info)
            .count() as u16;
        let list_rows = if details {
            (view.findings.len() as u16)
                .clamp(1, (inner.height / 2).max(serious.min(inner.height - 4)))
        } else {
            inner.height
        };
        let first = scroll_for(selected.unwrap_or(0), usize::from(list_rows));
        let width = usize::from(inner.width);
        for (row, &i) in view
            .findings
            .iter()
            .enumerate()
            .skip(first)
            .take(usize::from(list_rows))
        {
            let f = &analysis.findings[i];
            let y = inner.y + (row - first) as u16;
            let is_sel = selected == Some(row) && !self.compact;
            let base = if is_sel {
                theme.selected()
            } else {
                Style::new()
            };
            let x = put(
                buf,
                inner,
                inner.x,
                y,
                badge(f.severity),
                if is_sel {
                    base
                } else {
                    theme.severity(f.severity)
                },
            );
            // The site first, then what was seen; the kind comes last, where the width allows.
            let site = clip_left(f.site_label(), 24);
            let text = format!(" {:<24} {}  ({})", site, f.summary, f.kind.as_str());
            let text = clip(&text, width.saturating_sub(5));
            put(
                buf,
                inner,
                x,
                y,
                &format!("{text:<w$}", w = width.saturating_sub(5)),
                base,
            );
        }
        if !details {
            return;
        }
        let Some(f) = selected
            .and_then(|s| view.findings.get(s))
            .and_then(|&i| analysis.findings.get(i))
        else {
            return;
        };
        let below = Rect::new(
            inner.x,
            inner.y + list_rows,
            inner.width,
            inner.height - list_rows,
        );
        draw_details(f, below, buf, theme);
    }
}

/// The selected finding in full below the list, in `area`: a rule, then its headline, summary,
/// fix and evidence, each wrapped to the width.
fn draw_details(f: &Finding, area: Rect, buf: &mut Buffer, theme: Theme) {
    let width = usize::from(area.width);
    let mut y = area.y;
    put(buf, area, area.x, y, &"─".repeat(width), theme.dim());
    y += 1;
    let bottom = area.bottom();
    let mut line = |y: &mut u16, text: &str, style: Style| {
        if *y < bottom {
            put(buf, area, area.x, *y, text, style);
            *y += 1;
        }
    };
    let head = format!(
        "{} {} at {} {}",
        badge(f.severity).trim(),
        f.kind.as_str(),
        f.site_label(),
        f.function
    );
    line(&mut y, &head, theme.severity(f.severity));
    for l in wrap(&f.summary, width) {
        line(&mut y, &l, Style::new());
    }
    for (n, l) in wrap(&f.fix, width.saturating_sub(5)).iter().enumerate() {
        let prefix = if n == 0 { "fix: " } else { "     " };
        line(&mut y, &format!("{prefix}{l}"), theme.allocated());
    }
    // Sentences a person reads; the evidence map is the JSON report's.
    for detail in f.details() {
        for l in wrap(&detail, width) {
            line(&mut y, &l, theme.dim());
        }
    }
    line(
        &mut y,
        "(Enter: show this call site's stacks and blocks)",
        theme.dim(),
    );
}
