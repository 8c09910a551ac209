//! The report as people read it: the text report (with colour on a terminal), markdown,
//! and the short summary of `vramscope summary`, with the verdict and headline they open with.
//! `super` builds the [`Report`] these render; JSON and HTML are rendered there and in
//! `crate::html`. The tables (top sites; markdown's findings) are `crate::table`'s, written
//! once for every format. Every text that comes from a file goes through
//! `vramscope_model::terminal` (text) or `crate::markdown` (markdown) on its way out.

use std::fmt::Write as _;

use vramscope_model::format_bytes;

use vramscope_analysis::detect::{Finding, Severity};
use vramscope_analysis::report::{Report, ReportStats};

use crate::table::Table;

const RESET: &str = "\x1b[0m";
const BOLD: &str = "\x1b[1m";
const DIM: &str = "\x1b[2m";

fn severity_colour(severity: Severity) -> &'static str {
    match severity {
        Severity::Error => "\x1b[1;31m",
        Severity::Warning => "\x1b[1;33m",
        Severity::Info => "\x1b[36m",
    }
}

/// One line naming the data and the device.
pub fn headline(report: &Report) -> String {
    let mut line = format!("{} trace", report.source);
    if let Some(input) = &report.input {
        let _ = write!(line, " {input}");
    }
    if !report.device.name.is_empty() {
        let _ = write!(line, " on {}", report.device.name);
    }
    if let Some(capacity) = report.device.capacity_bytes {
        let _ = write!(line, " ({} capacity)", format_bytes(capacity));
    }
    line
}

/// A byte figure, or `n/a` when the data does not record it.
pub fn bytes_or_na(bytes: Option<u64>) -> String {
    bytes.map_or_else(|| "n/a".to_string(), format_bytes)
}

/// A count with its noun, or `n/a` when the data does not record it (`1 OOM`, `3 OOMs`, `n/a OOMs`).
fn counted(count: Option<u64>, one: &str, many: &str) -> String {
    match count {
        Some(1) => format!("1 {one}"),
        Some(n) => format!("{n} {many}"),
        None => format!("n/a {many}"),
    }
}

/// The sentence of copies, host waits, device calls and OOMs (`12 transfers (1.00 MiB to
/// device, 4 B to host), ...`), with `n/a` for each figure the format does not record; `None`
/// when none of them is recorded or all that are are 0. The text, markdown and HTML reports
/// print it.
pub fn activity_line(s: &ReportStats) -> Option<String> {
    let known = [s.transfers, s.syncs, s.device_allocs, s.ooms];
    if known.iter().flatten().all(|&n| n == 0) {
        return None;
    }
    Some(activity_sentence(s))
}

/// [`activity_line`]'s sentence, whatever the figures. A group the format records none of is
/// said once (`transfers and host waits n/a`).
pub(crate) fn activity_sentence(s: &ReportStats) -> String {
    let copies = if s.transfers.is_none() && s.host_waits.is_none() {
        "transfers and host waits n/a".to_string()
    } else {
        format!(
            "{} ({} to device, {} to host), {} ({}, {})",
            counted(s.transfers, "transfer", "transfers"),
            bytes_or_na(s.h2d_bytes),
            bytes_or_na(s.d2h_bytes),
            match s.host_wait_ns {
                Some(ns) => format!(
                    "{} ({} in all)",
                    counted(s.host_waits, "host wait", "host waits"),
                    vramscope_analysis::detect::sync::duration_text(ns)
                ),
                None => counted(s.host_waits, "host wait", "host waits"),
            },
            counted(s.syncs, "sync", "syncs"),
            counted(
                s.host_waits.zip(s.syncs).map(|(w, n)| w.saturating_sub(n)),
                "copy to host",
                "copies to host"
            )
        )
    };
    let device = if s.device_allocs.is_none() && s.ooms.is_none() {
        "device allocs and OOMs n/a".to_string()
    } else {
        format!(
            "{}, {}, {}",
            counted(s.device_allocs, "device alloc", "device allocs"),
            counted(s.device_frees, "device free", "device frees"),
            counted(s.ooms, "OOM", "OOMs")
        )
    };
    format!("{copies}, {device}")
}

/// The first line of headline statistics, the same in every format: events, steps,
/// allocations and frees, with the frees of blocks from before the trace said apart.
pub(crate) fn counts_line(report: &Report) -> String {
    let s = &report.stats;
    format!(
        "{} events, {}, {} allocations, {} frees{}",
        s.events,
        vramscope_model::plural(report.steps, "step"),
        s.allocations,
        s.frees,
        if s.unmatched_frees > 0 {
            format!(
                " (and {} of blocks allocated before the trace)",
                vramscope_model::plural(s.unmatched_frees, "free")
            )
        } else {
            String::new()
        }
    )
}

/// Lines of headline statistics, shared by the text, markdown and HTML renderers.
pub(crate) fn stat_lines(report: &Report) -> Vec<String> {
    let s = &report.stats;
    let mut lines = vec![counts_line(report)];
    if !report.step_source.is_empty() {
        lines.push(report.step_source.clone());
    }
    lines.extend(report.caveats.iter().map(|c| format!("note: {c}")));
    let mut peak = format!("peak allocated {}", format_bytes(s.peak_allocated_bytes));
    if let Some(event) = s.peak_allocated_event {
        let _ = write!(peak, " (after event {event})");
    }
    let _ = write!(
        peak,
        ", peak reserved {}",
        bytes_or_na(s.peak_reserved_bytes)
    );
    let _ = write!(
        peak,
        "; at the end {} live blocks, {} allocated",
        s.live_blocks,
        format_bytes(s.allocated_bytes)
    );
    let _ = write!(peak, ", {} reserved", bytes_or_na(s.reserved_bytes));
    lines.push(peak);
    lines.extend(category_lines(report));
    if let Some(line) = activity_line(s) {
        lines.push(line);
    }
    lines.extend(gap_sentences(s));
    lines
}

/// What the memory is made of at the peak and at the end, a line each
/// (`at the peak 12.4 GiB: activations 7.1, parameters 1.9, ...`), the same in the text,
/// markdown and summary reports; none for a moment with no bytes, and none at all when the
/// trace says nothing of what any of its memory is (every byte `unknown`: a line that reads
/// "unknown 1.9" tells a reader nothing; the JSON keeps the figures).
pub fn category_lines(report: &Report) -> Vec<String> {
    let by = &report.memory_by_category;
    let known = |bytes: &vramscope_model::CategoryBytes| {
        bytes.total() > bytes.get(vramscope_model::Category::Unknown)
    };
    if !known(&by.peak) && !known(&by.end) {
        return Vec::new();
    }
    [("at the peak", &by.peak), ("at the end", &by.end)]
        .into_iter()
        .filter(|(_, bytes)| bytes.total() > 0)
        .map(|(moment, bytes)| format!("{moment} {}", bytes.summary()))
        .collect()
}

/// What the trace is missing, in sentences for a reader: events the recorder dropped, and
/// frees the trace lost (an address allocated again while its block was live). Empty for a
/// whole trace. The text, markdown and HTML reports all say these.
pub fn gap_sentences(s: &ReportStats) -> Vec<String> {
    let mut lines = Vec::new();
    if s.dropped_events > 0 {
        lines.push(format!(
            "{} events were dropped by the recorder; figures are lower bounds",
            s.dropped_events
        ));
    }
    if s.baseline_estimated_blocks > 0 {
        lines.push(format!(
            "the memory allocated before the trace ({} at its start) is an estimate: {} from \
             before it, freed in it, {} only by {} request and neither the dump nor the segments \
             around {} leave one size, so each counts as its \
             request rounded, and PyTorch may have handed each up to 1 MiB more",
            format_bytes(s.baseline_allocated_bytes),
            vramscope_model::plural(s.baseline_estimated_blocks, "block"),
            if s.baseline_estimated_blocks == 1 {
                "is known"
            } else {
                "are known"
            },
            if s.baseline_estimated_blocks == 1 {
                "its"
            } else {
                "their"
            },
            if s.baseline_estimated_blocks == 1 {
                "it"
            } else {
                "them"
            },
        ));
    }
    if s.lost_frees > 0 {
        let made = if s.lost_frees == 1 {
            "1 allocation was made".to_string()
        } else {
            format!("{} allocations were made", s.lost_frees)
        };
        lines.push(format!(
            "{made} at an address whose block the trace had not freed: the trace lost those \
             frees (events dropped, or the file edited), and each such block is taken as freed \
             when its address is allocated again"
        ));
    }
    lines
}

/// A site with its function (`train.py:33 (forward)`), escaped for a terminal; the function
/// is left out where the site already names it.
pub(crate) fn site_with_function(site: Option<&str>, function: &str) -> String {
    let site = vramscope_model::terminal::sanitize(site.unwrap_or("(unknown site)"));
    // A name that already says the function (an autograd node, a C++ function) needs it
    // once.
    let short = vramscope_engine::short_function(function);
    let names_it = site == short
        || site == format!("{short} (backward)")
        || site == format!("[{short}]")
        || site.ends_with(&format!("::{short}]"));
    if function.is_empty() || names_it {
        site.into_owned()
    } else {
        format!("{site} ({})", vramscope_model::terminal::sanitize(function))
    }
}

/// The evidence of a finding as one sentence for a reader (`retained bytes per step 68.5 KiB;
/// steps with retention 20; ...`): keys as words, byte figures as bytes, whole numbers
/// without decimals. JSON keeps the map.
pub fn evidence_sentence(finding: &Finding) -> String {
    use vramscope_analysis::detect::EvidenceValue;
    let parts: Vec<String> = finding
        .evidence
        .entries()
        .iter()
        .map(|(k, v)| {
            let words = k.replace('_', " ");
            let bytes = k.ends_with("_bytes") || k.contains("_bytes_");
            let value = match v {
                EvidenceValue::Int(n) if bytes => format_bytes(*n),
                EvidenceValue::Int(n) => n.to_string(),
                EvidenceValue::Float(x) if bytes => format_bytes(x.round().max(0.0) as u64),
                // A share is a fraction: a percentage, as the finding's sentence writes it.
                EvidenceValue::Float(x) if k.starts_with("share_") => percent_text(*x),
                EvidenceValue::Float(x) => vramscope_analysis::detect::count_text(*x),
                EvidenceValue::Text(t) => t.clone(),
            };
            let words = words.replace(" bytes", "");
            format!("{words} {value}")
        })
        .collect();
    let mut sentence = parts.join("; ");
    if let Some(first) = sentence.get(..1) {
        sentence = first.to_uppercase() + &sentence[1..];
    }
    sentence.push('.');
    sentence
}

/// A fraction as a whole percentage (`85%`), `<1%` for a sliver, as findings write shares.
fn percent_text(fraction: f64) -> String {
    if fraction > 0.0 && fraction < 0.005 {
        "<1%".to_string()
    } else {
        format!("{:.0}%", fraction * 100.0)
    }
}

/// The one-line verdict a report opens with: how many problems (warnings and errors) and
/// where, or that none was found.
pub fn verdict(report: &Report) -> String {
    problems_verdict(
        report
            .findings
            .iter()
            .filter(|f| f.severity >= Severity::Warning)
            .map(|f| (f, None))
            .collect(),
        "",
    )
}

/// The verdict of a file of several devices: every device's problems, each with the device
/// it is on, or that none of them has one.
pub(super) fn verdict_devices(reports: &[Report]) -> String {
    let problems: Vec<(&Finding, Option<String>)> = reports
        .iter()
        .flat_map(|r| {
            r.findings
                .iter()
                .filter(|f| f.severity >= Severity::Warning)
                .map(|f| (f, Some(device_label(r))))
        })
        .collect();
    let on = format!(
        " on {}",
        vramscope_model::plural(reports.len() as u64, "device")
    );
    problems_verdict(problems, &on)
}

/// `N problems found: kind [on device] at site (severity); ...`, or that none was found
/// (followed by `none_suffix`).
fn problems_verdict(problems: Vec<(&Finding, Option<String>)>, none_suffix: &str) -> String {
    if problems.is_empty() {
        return format!("no leaks, sync or churn problems found{none_suffix}");
    }
    let list = problems
        .iter()
        .map(|(f, device)| match device {
            Some(device) => format!(
                "{} on {device} at {} ({})",
                f.kind,
                f.site_label(),
                f.severity
            ),
            None => format!("{} at {} ({})", f.kind, f.site_label(), f.severity),
        })
        .collect::<Vec<_>>()
        .join("; ");
    let noun = if problems.len() == 1 {
        "problem"
    } else {
        "problems"
    };
    format!("{} {noun} found: {list}", problems.len())
}

/// The name of a report's device among a file's several: its name when that names the device
/// (`cuda:1`), else `device N` (a simulated device's name is the same for every index).
pub fn device_label(report: &Report) -> String {
    device_label_of(&report.device.name, report.device.index)
}

/// [`device_label`] of a device named `name` with index `index`.
pub fn device_label_of(name: &str, index: u32) -> String {
    if name.starts_with("cuda:") || name.ends_with(&format!(":{index}")) {
        name.to_string()
    } else {
        format!("device {index}")
    }
}

/// The report of a file of several devices as text: the file's verdict, then each device's
/// report, in device order, opening with that device's verdict.
pub(super) fn render_text_devices(reports: &[Report], color: bool) -> String {
    let mut out = String::new();
    let verdict = verdict_devices(reports);
    let verdict = vramscope_model::terminal::sanitize(&verdict);
    if color {
        let _ = writeln!(out, "{BOLD}{verdict}{RESET}");
    } else {
        let _ = writeln!(out, "{verdict}");
    }
    for report in reports {
        let first = format!("{}: {}", device_label(report), self::verdict(report));
        out.push('\n');
        out.push_str(&render_text_opening(report, color, &first));
    }
    out
}

/// The report of a file of several devices as markdown: the file's verdict, then a section
/// per device, in device order, opening with that device's verdict.
pub(super) fn render_markdown_devices(reports: &[Report]) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "# vramscope report\n");
    let _ = writeln!(out, "**{}**\n", md_escape(&verdict_devices(reports)));
    for report in reports {
        let _ = writeln!(out, "## {}\n", md_escape(&device_label(report)));
        out.push_str(&markdown_body(report, "##"));
    }
    out
}

/// Directories a prefix shared by every site must have before the text says it once
/// ([`shared_site_prefix`]): `/mnt/data3/alice/` is long enough, `/home/` is not.
const SHARED_PREFIX_DIRECTORIES: usize = 3;

/// The directory every site of `report` that names a file lies under, when that is a long
/// absolute path (at least [`SHARED_PREFIX_DIRECTORIES`] directories, a separator at its end) and
/// there are two sites or more: the text and markdown say it once beside the figures and show
/// the sites relative to it. JSON, SARIF and GitHub annotations keep the full paths, which
/// resolve.
pub fn shared_site_prefix(report: &Report) -> Option<String> {
    let labels = report
        .findings
        .iter()
        .filter_map(|f| f.site.as_deref())
        .chain(report.top_sites.iter().map(|t| t.label.as_str()));
    let mut files = labels.filter_map(|label| crate::location::source_line(label).map(|s| s.file));
    // Unix paths and Windows ones (`C:\\research\\...`) alike.
    const SEPARATORS: [char; 2] = ['/', '\\'];
    let first = files.next()?;
    let mut prefix = &first[..=first.rfind(SEPARATORS)?];
    let mut count = 1;
    for file in files {
        count += 1;
        while !file.starts_with(prefix) {
            let shorter = prefix[..prefix.len() - 1].rfind(SEPARATORS)?;
            prefix = &prefix[..=shorter];
        }
    }
    let b = prefix.as_bytes();
    let absolute = prefix.starts_with(SEPARATORS)
        || (b.len() >= 3
            && b[0].is_ascii_alphabetic()
            && b[1] == b':'
            && SEPARATORS.contains(&(b[2] as char)));
    let directories = prefix.matches(SEPARATORS).count().saturating_sub(1);
    (count >= 2 && absolute && directories >= SHARED_PREFIX_DIRECTORIES).then(|| prefix.to_string())
}

/// The stat line that says the sites' shared directory ([`shared_site_prefix`]).
fn prefix_line(prefix: &str) -> String {
    format!("sites are under {prefix} and shown relative to it")
}

/// `text` (sites and sentences that quote them) with the shared directory left out.
fn relative_to(text: String, prefix: Option<&str>) -> String {
    match prefix {
        Some(prefix) => text.replace(prefix, ""),
        None => text,
    }
}

/// The report as text for a terminal; `color` adds ANSI colours.
pub fn render_text(report: &Report, color: bool) -> String {
    render_text_opening(report, color, &verdict(report))
}

/// The text report opening with `first_line` (its verdict).
fn render_text_opening(report: &Report, color: bool, first_line: &str) -> String {
    let paint = |code: &str, text: &str| {
        if color {
            format!("{code}{text}{RESET}")
        } else {
            text.to_string()
        }
    };
    // Text from the file (sites, functions, summaries that quote them, the device name) is
    // escaped on its way to the terminal: `vramscope_model::terminal`.
    let clean = |text: &str| vramscope_model::terminal::sanitize(text).into_owned();
    let prefix = shared_site_prefix(report);
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{}",
        paint(
            BOLD,
            &clean(&relative_to(first_line.to_string(), prefix.as_deref()))
        )
    );
    let _ = writeln!(
        out,
        "{}",
        paint(
            BOLD,
            &format!("vramscope report: {}", clean(&headline(report)))
        )
    );
    for line in stat_lines(report) {
        let _ = writeln!(out, "  {line}");
    }
    if let Some(prefix) = &prefix {
        let _ = writeln!(out, "  {}", clean(&prefix_line(prefix)));
    }
    let header = out;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "\n{}",
        paint(BOLD, &format!("Findings: {}", report.counts_phrase()))
    );
    if report.findings.is_empty() {
        let _ = writeln!(out, "  none");
    }
    for f in &report.findings {
        let tag = format!("[{}]", f.severity.as_str().to_ascii_uppercase());
        let _ = writeln!(
            out,
            "  {} {} at {}",
            paint(severity_colour(f.severity), &format!("{tag:<9}")),
            paint(BOLD, f.kind.as_str()),
            site_with_function(f.site.as_deref(), &f.function)
        );
        let _ = writeln!(out, "            {}", clean(&f.summary));
        for detail in f.details() {
            let _ = writeln!(out, "            {}", paint(DIM, &clean(&detail)));
        }
        let _ = writeln!(out, "            fix: {}", clean(&f.fix));
    }
    if !report.top_sites.is_empty() {
        let _ = writeln!(
            out,
            "\n{}",
            paint(BOLD, "Top sites (live at the end, at the peak)")
        );
        out.push_str(&Table::top_sites(report).text("  "));
    }
    header + &relative_to(out, prefix.as_deref())
}

/// Escapes text for a markdown table cell or paragraph: the shared `crate::markdown::escape`.
fn md_escape(text: &str) -> String {
    crate::markdown::escape(text)
}

/// The report as GitHub-flavoured markdown.
pub fn render_markdown(report: &Report) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "# vramscope report\n");
    let prefix = shared_site_prefix(report);
    let _ = writeln!(
        out,
        "**{}**\n",
        md_escape(&relative_to(verdict(report), prefix.as_deref()))
    );
    out.push_str(&markdown_body(report, "#"));
    out
}

/// The markdown report after its verdict, with headings one level below `level`.
fn markdown_body(report: &Report, level: &str) -> String {
    let mut out = String::new();
    let prefix = shared_site_prefix(report);
    if level != "#" {
        let _ = writeln!(
            out,
            "**{}**\n",
            md_escape(&relative_to(verdict(report), prefix.as_deref()))
        );
    }
    let _ = writeln!(out, "{}\n", md_escape(&headline(report)));
    for line in stat_lines(report) {
        let _ = writeln!(out, "- {}", md_escape(&line));
    }
    if let Some(prefix) = &prefix {
        let _ = writeln!(out, "- {}", md_escape(&prefix_line(prefix)));
    }
    let header = out;
    // Sites are escaped in the cells: the prefix is left out as the cells spell it.
    let escaped_prefix = prefix.as_deref().map(md_escape);
    let mut out = String::new();
    let _ = writeln!(out, "\n{level}# Findings ({})\n", report.counts_phrase());
    if report.findings.is_empty() {
        let _ = writeln!(out, "None.");
    } else {
        out.push_str(&Table::findings(report).markdown());
        let detailed: Vec<(&Finding, Vec<String>)> = report
            .findings
            .iter()
            .map(|f| (f, f.details()))
            .filter(|(_, d)| !d.is_empty())
            .collect();
        if !detailed.is_empty() {
            let _ = writeln!(out, "\n{level}## Details\n");
        }
        for (i, (f, details)) in detailed.iter().enumerate() {
            let _ = writeln!(
                out,
                "{}. **{}** at {}: {}",
                i + 1,
                f.kind,
                md_escape(f.site_label()),
                md_escape(&details.join(" "))
            );
        }
    }
    if !report.top_sites.is_empty() {
        let _ = writeln!(out, "\n{level}# Top sites\n");
        out.push_str(&Table::top_sites(report).markdown());
    }
    header + &relative_to(out, escaped_prefix.as_deref())
}

/// A short summary for `vramscope summary`: the headline, the finding counts, the five largest
/// holders and, when the snapshot has statistics, PyTorch's `memory_summary()` table.
pub fn render_summary(report: &Report) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{}",
        vramscope_model::terminal::sanitize(&headline(report))
    );
    for line in stat_lines(report) {
        let _ = writeln!(out, "  {line}");
    }
    let _ = writeln!(
        out,
        "  findings: {} (run `vramscope report` for details)",
        report.counts_phrase()
    );
    // The leak that runs out of memory first, said as a sentence.
    let soonest = report
        .findings
        .iter()
        .filter_map(|f| match f.evidence.get("steps_until_oom") {
            Some(vramscope_analysis::detect::EvidenceValue::Int(steps)) => Some((*steps, f)),
            _ => None,
        })
        .min_by_key(|(steps, _)| *steps);
    if let Some((steps, f)) = soonest {
        let _ = writeln!(
            out,
            "  at this rate the run runs out of device memory in about {} ({} kept per step at {})",
            vramscope_model::plural(steps, "step"),
            f.per_step.map_or_else(
                || "memory".to_string(),
                |p| format_bytes(p.bytes.round().max(0.0) as u64)
            ),
            site_with_function(f.site.as_deref(), &f.function)
        );
    }
    const SUMMARY_ROWS: usize = 5;
    for t in report.top_sites.iter().take(SUMMARY_ROWS) {
        let _ = writeln!(
            out,
            "  {:>10} live, {:>10} at peak  {}",
            format_bytes(t.live_bytes),
            format_bytes(t.peak_bytes),
            site_with_function(Some(&t.label), &t.function)
        );
    }
    // The rows left out, so that each column sums to its figure.
    let mut rest = report.other_sites.clone().unwrap_or_default();
    for t in report.top_sites.iter().skip(SUMMARY_ROWS) {
        rest.sites += 1;
        rest.live_bytes = rest.live_bytes.saturating_add(t.live_bytes);
        rest.peak_bytes = rest.peak_bytes.saturating_add(t.peak_bytes);
    }
    if rest.sites > 0 {
        let _ = writeln!(
            out,
            "  {:>10} live, {:>10} at peak  {}",
            format_bytes(rest.live_bytes),
            format_bytes(rest.peak_bytes),
            rest.label()
        );
    }
    if let Some(table) = &report.memory_summary {
        let _ = writeln!(out);
        out.push_str(table);
    }
    out
}
