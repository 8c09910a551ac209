//! `vramscope ranks` printed: a comparison of ranks (`vramscope_analysis::ranks`) as text for a
//! terminal, markdown, JSON or one HTML page. Text from the files (site names, file names,
//! errors) is escaped for the terminal by `vramscope_model::terminal`, for markdown by
//! [`crate::markdown`] and for HTML by [`crate::html::escape`].

use std::fmt::Write as _;

use vramscope_analysis::ranks::{
    FailedRank, RankComparison, RankRow, SKIPPED_EMPTY, SKIPPED_UNREADABLE,
};
use vramscope_model::format_bytes;

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
    match skipped.as_slice() {
        [] => format!("{all} ranks"),
        parts => format!("{all} ranks ({})", parts.join(", ")),
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

/// The comparison as text for a terminal.
pub fn render_text(comparison: &RankComparison) -> String {
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
    let _ = writeln!(
        out,
        "{:>5}  {:>11}  {:>11}  {:>6}  {:>5}  {:>10}  top site at the peak",
        "rank", "peak alloc", "peak resv", "frag", "OOMs", "findings"
    );
    for r in rows_in_order(comparison) {
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
            "\n[WARNING] rank_imbalance: {}",
            vramscope_model::terminal::sanitize(&f.summary)
        );
        for s in &f.sites {
            let _ = writeln!(
                out,
                "    +{:>10}  {} ({} here, {} on rank {})",
                format_bytes(s.bytes - s.median_bytes),
                vramscope_model::terminal::sanitize(&s.site),
                format_bytes(s.bytes),
                format_bytes(s.median_bytes),
                f.median_rank
            );
        }
        let _ = writeln!(out, "    fix: {}", f.fix);
    }
    out
}

/// The comparison as a markdown table and findings.
pub fn render_markdown(comparison: &RankComparison) -> String {
    let mut out = String::new();
    if comparison.numbering != "file names" {
        let _ = writeln!(
            out,
            "Ranks numbered {}.\n",
            markdown::escape(&comparison.numbering)
        );
    }
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
    for f in &comparison.findings {
        let _ = writeln!(
            out,
            "\n**rank_imbalance**: {}\n",
            markdown::escape(&f.summary)
        );
        for s in &f.sites {
            let _ = writeln!(
                out,
                "- {}: {} more ({} here, {} on rank {})",
                markdown::code_span(&s.site, false),
                format_bytes(s.bytes - s.median_bytes),
                format_bytes(s.bytes),
                format_bytes(s.median_bytes),
                f.median_rank
            );
        }
        let _ = writeln!(out, "\nFix: {}", f.fix);
    }
    out
}

/// The comparison as JSON (schema [`RANKS_FORMAT_VERSION`]).
pub fn render_json(comparison: &RankComparison) -> String {
    serde_json::to_string_pretty(comparison).unwrap_or_default()
}

/// The comparison as one self-contained HTML page.
pub fn render_html(comparison: &RankComparison) -> String {
    let escape = crate::html::escape;
    let mut out = String::from(
        "<!doctype html><html><head><meta charset=\"utf-8\"><title>vramscope ranks</title><style>body{font:14px system-ui,sans-serif;margin:2em}table{border-collapse:collapse}td,th{padding:.3em .8em;border-bottom:1px solid #ddd;text-align:right}td.site{text-align:left;font-family:monospace}.bar{background:#4a7;height:.8em;display:inline-block}.hot{background:#d54}</style></head><body><h1>vramscope ranks</h1>",
    );
    if comparison.numbering != "file names" {
        let _ = write!(
            out,
            "<p>Ranks numbered {}.</p>",
            escape(&comparison.numbering)
        );
    }
    out.push_str("<table><tr><th>rank</th><th>peak allocated</th><th></th><th>peak reserved</th><th>fragmentation at peak</th><th>OOMs</th><th>findings</th><th>top site at the peak</th></tr>");
    let most = comparison
        .ranks
        .iter()
        .map(|r| r.peak_allocated)
        .max()
        .unwrap_or(1)
        .max(1);
    for r in rows_in_order(comparison) {
        let r = match r {
            Ok(r) => r,
            Err(f) => {
                let _ = write!(
                    out,
                    "<tr><td>{}</td><td colspan=\"7\" class=\"site\">{}: {}</td></tr>",
                    f.rank,
                    f.what(),
                    escape(&f.error)
                );
                continue;
            }
        };
        let hot = comparison.findings.iter().any(|f| f.rank == r.rank);
        let _ = write!(
            out,
            "<tr><td>{}</td><td>{}</td><td><span class=\"bar{}\" style=\"width:{}px\"></span></td><td>{}</td><td>{}</td><td>{}</td><td>{} / {} / {}</td><td class=\"site\">{}</td></tr>",
            r.rank,
            format_bytes(r.peak_allocated),
            if hot { " hot" } else { "" },
            (r.peak_allocated as f64 / most as f64 * 200.0).round() as u64,
            crate::bytes_or_na(r.peak_reserved),
            percent(r.fragmentation_at_peak),
            r.ooms,
            r.findings.0,
            r.findings.1,
            r.findings.2,
            escape(&top_site(r)),
        );
    }
    out.push_str("</table>");
    for f in &comparison.findings {
        let _ = write!(
            out,
            "<h2>rank_imbalance</h2><p>{}</p><ul>",
            escape(&f.summary)
        );
        for s in &f.sites {
            let _ = write!(
                out,
                "<li><code>{}</code>: {} more ({} here, {} on rank {})</li>",
                escape(&s.site),
                format_bytes(s.bytes - s.median_bytes),
                format_bytes(s.bytes),
                format_bytes(s.median_bytes),
                f.median_rank
            );
        }
        let _ = write!(out, "</ul><p>Fix: {}</p>", escape(&f.fix));
    }
    out.push_str("</body></html>\n");
    out
}
