//! The report as GitHub Actions workflow commands (`vramscope report FILE --format github`):
//! one `::error`, `::warning` or `::notice` line per finding, so that a CI job's findings land
//! as annotations on the lines of the pull request.
//!
//! A finding whose site is a source line (`crate::location`) names it with `file=` (relative
//! to the checkout when it lies under it) and `line=`; one that names none (an autograd node,
//! memory from before the trace) is an annotation without a file. The title names the detector
//! and the bytes (the waits, for a sync in a loop); the message is the fix, then what was seen,
//! then the call path and the sites the finding gathers.
//!
//! Nothing from the trace reaches the log raw: every text goes first through
//! `vramscope_model::terminal::sanitize` (a control, bidi or separator character becomes a visible
//! `\u{..}`), and then through the workflow commands' own escaping, which the runner undoes:
//! `%`, CR and LF in the message ([`escape_data`]), and `:` and `,` as well in a property
//! ([`escape_property`]). So a file name can neither end the command's line and start a
//! command of its own (`::add-mask::`, `::stop-commands::`) nor end a property early.

use std::fmt::Write as _;

use vramscope_model::{format_bytes, plural};

use crate::location::{path_ref, source_line, AnnotationOptions, PathRef};
use vramscope_analysis::detect::{Finding, FindingKind, Severity};
use vramscope_analysis::report::Report;
use vramscope_model::terminal::sanitize;

/// The workflow command of a severity: `error`, `warning`, or `notice` for information.
pub fn command_name(severity: Severity) -> &'static str {
    match severity {
        Severity::Error => "error",
        Severity::Warning => "warning",
        Severity::Info => "notice",
    }
}

/// `text` escaped as a workflow command's message: `%` as `%25`, CR as `%0D`, LF as `%0A`.
pub fn escape_data(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '%' => out.push_str("%25"),
            '\r' => out.push_str("%0D"),
            '\n' => out.push_str("%0A"),
            c => out.push(c),
        }
    }
    out
}

/// `text` escaped as a workflow command's property value: as [`escape_data`], and `:` as
/// `%3A` and `,` as `%2C`, which would otherwise end the property or the properties.
pub fn escape_property(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in escape_data(text).chars() {
        match c {
            ':' => out.push_str("%3A"),
            ',' => out.push_str("%2C"),
            c => out.push(c),
        }
    }
    out
}

/// The one line of `finding`, ending in a newline.
fn command(finding: &Finding, device: Option<&str>, options: &AnnotationOptions) -> String {
    let mut properties = Vec::new();
    if let Some(at) = finding.site.as_deref().and_then(source_line) {
        if let Some(path) = path_ref(at.file, options.source_root.as_deref()) {
            let (PathRef::Relative(file) | PathRef::Absolute(file)) = path;
            properties.push(format!("file={}", escape_property(&sanitize(&file))));
            properties.push(format!("line={}", at.line));
        }
    }
    // The figure that measures it: the waits of a sync in a loop, else the bytes.
    let mut title = format!("vramscope {}", finding.kind);
    if finding.kind == FindingKind::SyncInLoop && finding.count > 0 {
        let _ = write!(title, " ({})", plural(finding.count, "wait"));
    } else if finding.bytes > 0 {
        let _ = write!(title, " ({})", format_bytes(finding.bytes));
    }
    if properties.is_empty() {
        // No line to put it on: the annotation names the site in its title.
        let _ = write!(title, " at {}", finding.site_label());
    }
    if let Some(device) = device {
        let _ = write!(title, " on {device}");
    }
    properties.push(format!("title={}", escape_property(&sanitize(&title))));
    let mut message: Vec<String> = Vec::new();
    for text in [&finding.fix, &finding.summary] {
        if !text.trim().is_empty() {
            message.push(sanitize(text).into_owned());
        }
    }
    message.extend(finding.details().iter().map(|d| sanitize(d).into_owned()));
    if message.is_empty() {
        message.push(finding.kind.to_string());
    }
    format!(
        "::{} {}::{}\n",
        command_name(finding.severity),
        properties.join(","),
        escape_data(&message.join("\n"))
    )
}

/// The workflow commands of `reports` (one per device of one trace): one line per finding,
/// most severe first within each device, whose title names the device when there are
/// several; nothing when there are no findings.
pub fn render_github(reports: &[Report], options: &AnnotationOptions) -> String {
    let mut out = String::new();
    for (i, report) in reports.iter().enumerate() {
        let device = options.device_label(i, reports);
        for finding in &report.findings {
            out.push_str(&command(finding, device.as_deref(), options));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escaping_is_what_the_runner_undoes() {
        assert_eq!(escape_data("50% a\r\nb:c,d"), "50%25 a%0D%0Ab:c,d");
        assert_eq!(escape_property("50% a\r\nb:c,d"), "50%25 a%0D%0Ab%3Ac%2Cd");
        // `%3A` in the text is itself escaped, so that it reads back as written.
        assert_eq!(escape_property("%3A"), "%253A");
    }
}
