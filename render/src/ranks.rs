//! `vramscope ranks` printed: a comparison of ranks (`vramscope_analysis::ranks`) as text for a
//! terminal, markdown, JSON or one HTML page. Text from the files (site names, file names,
//! errors) is escaped for the terminal by `vramscope_model::terminal`, for markdown by
//! [`crate::markdown`] and for HTML by the page's template ([`crate::html::Line`]).
//!
//! Up to [`ROWS_UP_TO`] ranks, every face prints a row per rank. Past that, a row per rank
//! says the same thing hundreds of times: the faces print which ranks are alike and which
//! stand out ("ranks 0–199 alike but 17 and 143"), the distribution of each figure (min,
//! median, p95, max of the peak and of the top sites) and the findings; `--all` prints
//! every row anyway, and the JSON always holds every rank.

use std::fmt::Write as _;

use vramscope_analysis::ranks::{
    FailedRank, RankComparison, RankRow, Spread, SKIPPED_EMPTY, SKIPPED_UNREADABLE,
};
use vramscope_model::format_bytes;

use maud::{html, PreEscaped, DOCTYPE};

use crate::html::Line;
use crate::markdown;

/// The rows of `comparison` in rank order: each read rank's figures, or a failed file.
fn rows_in_order(comparison: &RankComparison) -> Vec<Result<&RankRow, &FailedRank>> {
    let mut rows: Vec<Result<&RankRow, &FailedRank>> = comparison
        .ranks
        .iter()
        .map(Ok)
        .chain(comparison.failed.iter().map(Err))
        .collect();
    rows.sort_by_key(|row| match row {
        Ok(r) => r.rank,
        Err(f) => f.rank,
    });
    rows
}

/// The count of ranks said in a heading: `8 ranks`, or `8 ranks (1 could not be read, 1
/// empty)`.
fn rank_count(comparison: &RankComparison) -> String {
    let all = comparison.ranks.len() + comparison.failed.len();
    let count = |kind: &str| {
        comparison
            .failed
            .iter()
            .filter(|f| f.skipped == kind)
            .count()
    };
    let skipped: Vec<String> = [
        (count(SKIPPED_UNREADABLE), "could not be read"),
        (count(SKIPPED_EMPTY), "empty"),
    ]
    .iter()
    .filter(|(n, _)| *n > 0)
    .map(|(n, what)| format!("{n} {what}"))
    .collect();
    let ranks = if all == 1 { "rank" } else { "ranks" };
    match skipped.as_slice() {
        [] => format!("{all} {ranks}"),
        parts => format!("{all} {ranks} ({})", parts.join(", ")),
    }
}

fn percent(share: Option<f64>) -> String {
    share.map_or_else(|| "n/a".to_string(), |s| format!("{:.0} %", s * 100.0))
}

fn top_site(row: &RankRow) -> String {
    row.top_site_at_peak.as_ref().map_or_else(
        || "-".to_string(),
        |(site, bytes)| format!("{site} ({})", format_bytes(*bytes)),
    )
}

/// The most ranks printed a row each unless every row is asked for.
pub const ROWS_UP_TO: usize = 8;

/// Whether the faces print a row per rank: up to [`ROWS_UP_TO`] ranks, or when `all`.
fn every_row(comparison: &RankComparison, all: bool) -> bool {
    all || comparison.ranks.len() + comparison.failed.len() <= ROWS_UP_TO
}

/// Rank numbers as ranges: `0–16, 18–142, 144–199`.
fn ranges(ranks: &[u32]) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut i = 0;
    while i < ranks.len() {
        let mut j = i;
        while j + 1 < ranks.len() && ranks[j + 1] == ranks[j] + 1 {
            j += 1;
        }
        parts.push(if j == i {
            ranks[i].to_string()
        } else {
            format!("{}–{}", ranks[i], ranks[j])
        });
        i = j + 1;
    }
    parts.join(", ")
}

/// Rank numbers as a list said in words: `17`, `17 and 143`, `3, 17 and 143`.
fn listed(ranks: &[u32]) -> String {
    let words: Vec<String> = ranks.iter().map(u32::to_string).collect();
    match words.as_slice() {
        [] => String::new(),
        [one] => one.clone(),
        [rest @ .., last] => format!("{} and {last}", rest.join(", ")),
    }
}

/// Which ranks are alike, in one line: `ranks 0–199 alike but 17 and 143` (the ones that
/// stand out), with the skipped ones after (`; 50 skipped`).
pub fn alike_phrase(comparison: &RankComparison) -> String {
    let mut every: Vec<u32> = comparison
        .ranks
        .iter()
        .map(|r| r.rank)
        .chain(comparison.failed.iter().map(|f| f.rank))
        .collect();
    every.sort_unstable();
    every.dedup();
    let out = comparison.stand_out();
    let skipped: Vec<u32> = comparison.failed.iter().map(|f| f.rank).collect();
    let mut phrase = if comparison.alike().is_empty() {
        format!("ranks {}: none alike", ranges(&every))
    } else if out.is_empty() {
        format!("ranks {} alike", ranges(&every))
    } else {
        format!("ranks {} alike but {}", ranges(&every), listed(&out))
    };
    if !skipped.is_empty() {
        let _ = write!(phrase, "; {} skipped", listed(&skipped));
    }
    phrase
}

/// The distribution's lines: `(figure, spread)`, the figures first, then the top sites at
/// the peak and at the end (labels as they are: each face escapes them).
fn spread_lines(comparison: &RankComparison) -> Vec<(String, Spread)> {
    let Some(d) = &comparison.distribution else {
        return Vec::new();
    };
    let mut lines = vec![("peak allocated".to_string(), d.peak_allocated)];
    if let Some(reserved) = d.peak_reserved {
        lines.push(("peak reserved".to_string(), reserved));
    }
    lines.push(("allocated at the end".to_string(), d.allocated_at_end));
    for s in &d.sites_at_peak {
        lines.push((format!("at the peak: {}", s.site), s.spread));
    }
    for s in &d.sites_at_end {
        lines.push((format!("at the end: {}", s.site), s.spread));
    }
    lines
}

/// The OOMs' spread, said in words when any rank had one.
fn oom_line(comparison: &RankComparison) -> Option<String> {
    let d = comparison.distribution.as_ref()?;
    (d.ooms.max > 0).then(|| {
        let with = comparison.ranks.iter().filter(|r| r.ooms > 0).count();
        format!(
            "OOMs: {with} of {} ranks ran out of memory (median {}, max {})",
            comparison.ranks.len(),
            d.ooms.median,
            d.ooms.max
        )
    })
}

/// The comparison as text for a terminal: a row per rank up to [`ROWS_UP_TO`] ranks, else
/// the ranks alike and the distribution.
pub fn render_text(comparison: &RankComparison) -> String {
    render_text_rows(comparison, false)
}

/// The comparison as text for a terminal, with every rank's row when `all`.
pub fn render_text_rows(comparison: &RankComparison, all: bool) -> String {
    let mut out = String::new();
    let flagged = comparison.findings.len();
    let _ = writeln!(
        out,
        "vramscope ranks: {}; {}",
        rank_count(comparison),
        match flagged {
            0 => "no rank stands out".to_string(),
            1 => "1 rank stands out".to_string(),
            n => format!("{n} ranks stand out"),
        }
    );
    if comparison.numbering != "file names" {
        let _ = writeln!(
            out,
            "ranks numbered {}",
            vramscope_model::terminal::sanitize(&comparison.numbering)
        );
    }
    if !every_row(comparison, all) {
        let sanitize = vramscope_model::terminal::sanitize;
        let _ = writeln!(out, "{}", alike_phrase(comparison));
        let _ = writeln!(
            out,
            "\n{:>11}  {:>11}  {:>11}  {:>11}  over the ranks",
            "min", "median", "p95", "max"
        );
        for (figure, s) in spread_lines(comparison) {
            let _ = writeln!(
                out,
                "{:>11}  {:>11}  {:>11}  {:>11}  {}",
                format_bytes(s.min),
                format_bytes(s.median),
                format_bytes(s.p95),
                format_bytes(s.max),
                sanitize(&figure),
            );
        }
        if let Some(line) = oom_line(comparison) {
            let _ = writeln!(out, "{line}");
        }
        for f in &comparison.failed {
            let error = sanitize(&f.error);
            let _ = writeln!(out, "rank {} {}: {error}", f.rank, f.what());
        }
        let _ = writeln!(out, "(every rank's row: --all or --format json)");
    }
    let rows: Vec<_> = if every_row(comparison, all) {
        rows_in_order(comparison)
    } else {
        Vec::new()
    };
    if !rows.is_empty() {
        let _ = writeln!(
            out,
            "{:>5}  {:>11}  {:>11}  {:>6}  {:>5}  {:>10}  top site at the peak",
            "rank", "peak alloc", "peak resv", "frag", "OOMs", "findings"
        );
    }
    for r in rows {
        let r = match r {
            Ok(r) => r,
            Err(f) => {
                let error = vramscope_model::terminal::sanitize(&f.error);
                let _ = writeln!(out, "{:>5}  {}: {error}", f.rank, f.what());
                continue;
            }
        };
        let _ = writeln!(
            out,
            "{:>5}  {:>11}  {:>11}  {:>6}  {:>5}  {:>10}  {}",
            r.rank,
            format_bytes(r.peak_allocated),
            crate::bytes_or_na(r.peak_reserved),
            percent(r.fragmentation_at_peak),
            r.ooms,
            format!("{}E {}W {}I", r.findings.0, r.findings.1, r.findings.2),
            vramscope_model::terminal::sanitize(&top_site(r)),
        );
    }
    for f in &comparison.findings {
        let _ = writeln!(
            out,
            "\n[WARNING] {}: {}",
            f.kind,
            vramscope_model::terminal::sanitize(&f.summary)
        );
        for (when, sites) in [("at the peak", &f.sites), ("at the end", &f.sites_at_end)] {
            if sites.is_empty() {
                continue;
            }
            let _ = writeln!(out, "  {when}:");
            for s in sites {
                let _ = writeln!(
                    out,
                    "    +{:>10}  {} ({} here, median {})",
                    format_bytes(s.bytes - s.median_bytes),
                    vramscope_model::terminal::sanitize(&s.site),
                    format_bytes(s.bytes),
                    format_bytes(s.median_bytes),
                );
            }
        }
        let _ = writeln!(out, "    fix: {}", f.fix);
    }
    out
}

/// The comparison as a markdown table and findings: a row per rank up to [`ROWS_UP_TO`]
/// ranks, else the ranks alike and the distribution.
pub fn render_markdown(comparison: &RankComparison) -> String {
    render_markdown_rows(comparison, false)
}

/// The comparison as markdown, with every rank's row when `all`.
pub fn render_markdown_rows(comparison: &RankComparison, all: bool) -> String {
    let mut out = String::new();
    if comparison.numbering != "file names" {
        let _ = writeln!(
            out,
            "Ranks numbered {}.\n",
            markdown::escape(&comparison.numbering)
        );
    }
    if !every_row(comparison, all) {
        let _ = writeln!(out, "{}.\n", markdown::escape(&alike_phrase(comparison)));
        out.push_str("| over the ranks | min | median | p95 | max |\n|---|---:|---:|---:|---:|\n");
        for (figure, s) in spread_lines(comparison) {
            let figure = match figure.split_once(": ") {
                Some((when, site)) => format!("{when}: {}", markdown::code_span(site, true)),
                None => figure,
            };
            let _ = writeln!(
                out,
                "| {figure} | {} | {} | {} | {} |",
                format_bytes(s.min),
                format_bytes(s.median),
                format_bytes(s.p95),
                format_bytes(s.max)
            );
        }
        if let Some(line) = oom_line(comparison) {
            let _ = writeln!(out, "\n{line}");
        }
        for f in &comparison.failed {
            let _ = writeln!(
                out,
                "\n- rank {} {}: {}",
                f.rank,
                f.what(),
                markdown::escape(&f.error)
            );
        }
    } else {
        markdown_rows(comparison, &mut out);
    }
    markdown_findings(comparison, &mut out);
    out
}

/// The markdown table of every rank.
fn markdown_rows(comparison: &RankComparison, out: &mut String) {
    out.push_str(
        "| rank | peak allocated | peak reserved | fragmentation at peak | OOMs | findings | top site at the peak |\n|---:|---:|---:|---:|---:|---|---|\n",
    );
    for r in rows_in_order(comparison) {
        let r = match r {
            Ok(r) => r,
            Err(f) => {
                let error = markdown::escape(&f.error);
                let _ = writeln!(out, "| {} | {}: {error} | | | | | |", f.rank, f.what());
                continue;
            }
        };
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} | {} |",
            r.rank,
            format_bytes(r.peak_allocated),
            crate::bytes_or_na(r.peak_reserved),
            percent(r.fragmentation_at_peak),
            r.ooms,
            vramscope_analysis::report::severity_counts(r.findings.0, r.findings.1, r.findings.2),
            markdown::code_span(&top_site(r), true),
        );
    }
}

/// The findings in markdown.
fn markdown_findings(comparison: &RankComparison, out: &mut String) {
    for f in &comparison.findings {
        let _ = writeln!(out, "\n**{}**: {}\n", f.kind, markdown::escape(&f.summary));
        for (when, sites) in [("at the peak", &f.sites), ("at the end", &f.sites_at_end)] {
            for s in sites {
                let _ = writeln!(
                    out,
                    "- {when}, {}: {} more ({} here, median {})",
                    markdown::code_span(&s.site, false),
                    format_bytes(s.bytes - s.median_bytes),
                    format_bytes(s.bytes),
                    format_bytes(s.median_bytes),
                );
            }
        }
        let _ = writeln!(out, "\nFix: {}", f.fix);
    }
}

/// The comparison as JSON (schema [`vramscope_analysis::ranks::RANKS_FORMAT_VERSION`]).
pub fn render_json(comparison: &RankComparison) -> String {
    serde_json::to_string_pretty(comparison).unwrap_or_default()
}

/// The comparison as one self-contained HTML page: a row per rank up to [`ROWS_UP_TO`]
/// ranks, else the ranks alike and the distribution.
pub fn render_html(comparison: &RankComparison) -> String {
    render_html_rows(comparison, false)
}

/// The comparison as one HTML page, with every rank's row when `all`.
pub fn render_html_rows(comparison: &RankComparison, all: bool) -> String {
    let every = every_row(comparison, all);
    let most = comparison
        .ranks
        .iter()
        .map(|r| r.peak_allocated)
        .max()
        .unwrap_or(1)
        .max(1);
    // A `maud` template: text from the files is given as `Line`, escaped by construction.
    let page = html! {
        (DOCTYPE)
        html {
            head {
                meta charset="utf-8";
                title { "vramscope ranks" }
                style { (PreEscaped(STYLE)) }
            }
            body {
                h1 { "vramscope ranks" }
                @if comparison.numbering != "file names" {
                    p { "Ranks numbered " (Line(&comparison.numbering)) "." }
                }
                @if !every {
                    p { (Line(&alike_phrase(comparison))) "." }
                    table {
                        tr { th { "over the ranks" } th { "min" } th { "median" } th { "p95" } th { "max" } }
                        @for (figure, s) in spread_lines(comparison) {
                            tr {
                                td class="site" { (Line(&figure)) }
                                td { (format_bytes(s.min)) }
                                td { (format_bytes(s.median)) }
                                td { (format_bytes(s.p95)) }
                                td { (format_bytes(s.max)) }
                            }
                        }
                    }
                    @if let Some(line) = oom_line(comparison) {
                        p { (Line(&line)) }
                    }
                }
                table {
                    tr {
                        th { "rank" } th { "peak allocated" } th {} th { "peak reserved" }
                        th { "fragmentation at peak" } th { "OOMs" } th { "findings" }
                        th { "top site at the peak" }
                    }
                    @for row in rows_in_order(comparison) {
                        @match row {
                            Ok(_) if !every => {}
                            Err(f) => {
                                tr {
                                    td { (f.rank) }
                                    td colspan="7" class="site" { (f.what()) ": " (Line(&f.error)) }
                                }
                            }
                            Ok(r) => {
                                @let hot = comparison.findings.iter().any(|f| f.rank == r.rank);
                                @let width = (r.peak_allocated as f64 / most as f64 * 200.0).round() as u64;
                                tr {
                                    td { (r.rank) }
                                    td { (format_bytes(r.peak_allocated)) }
                                    td {
                                        span class=(if hot { "bar hot" } else { "bar" })
                                            style=(format!("width:{width}px")) {}
                                    }
                                    td { (crate::bytes_or_na(r.peak_reserved)) }
                                    td { (percent(r.fragmentation_at_peak)) }
                                    td { (r.ooms) }
                                    td { (r.findings.0) " / " (r.findings.1) " / " (r.findings.2) }
                                    td class="site" { (Line(&top_site(r))) }
                                }
                            }
                        }
                    }
                }
                @for f in &comparison.findings {
                    h2 { (f.kind) }
                    p { (Line(&f.summary)) }
                    ul {
                        @for (when, sites) in [("at the peak", &f.sites), ("at the end", &f.sites_at_end)] {
                            @for s in sites {
                                li {
                                    (when) ", " code { (Line(&s.site)) } ": "
                                    (format_bytes(s.bytes - s.median_bytes)) " more ("
                                    (format_bytes(s.bytes)) " here, median "
                                    (format_bytes(s.median_bytes)) ")"
                                }
                            }
                        }
                    }
                    p { "Fix: " (Line(&f.fix)) }
                }
            }
        }
    };
    let mut out = page.into_string();
    out.push('\n');
    out
}

/// The styles of the ranks page.
const STYLE: &str = "body{font:14px system-ui,sans-serif;margin:2em}table{border-collapse:collapse}td,th{padding:.3em .8em;border-bottom:1px solid #ddd;text-align:right}td.site{text-align:left;font-family:monospace}.bar{background:#4a7;height:.8em;display:inline-block}.hot{background:#d54}";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rank_numbers_are_said_as_ranges_and_lists() {
        assert_eq!(ranges(&[0, 1, 2, 3, 5, 7, 8]), "0–3, 5, 7–8");
        assert_eq!(ranges(&[]), "");
        assert_eq!(listed(&[17]), "17");
        assert_eq!(listed(&[17, 143]), "17 and 143");
        assert_eq!(listed(&[3, 17, 143]), "3, 17 and 143");
    }
}
