//! vramscope-render: every printer of what the analysis found, and nothing else.
//!
//! The analysis crate (`vramscope_analysis`) returns plain data: a [`Report`] per device, a
//! rank comparison, a diff. This crate formats it and never analyses: [`render`] and
//! [`render_file`] print a file's reports as text (optionally coloured), markdown, JSON, one
//! HTML page ([`html`], the explorer), a SARIF log ([`render_sarif`]) or GitHub workflow
//! commands ([`render_github`]); [`ranks`] prints a comparison of ranks. The words every format
//! shares (the verdict, the headline, the evidence sentences) are written once, in `text`, and
//! each table once, in [`table`], with a writer per format.
//! Every text that comes from a file goes through `vramscope_model::terminal` (text) or
//! [`markdown`] (markdown) or the page templates' [`html::Line`] (HTML) on its way out.
//!
//! Architecture invariant: no printer computes a figure. What a page or a table shows is a
//! field of what the analysis returned, so every format says the same thing.

use std::str::FromStr;

use serde::Serialize;
use vramscope_analysis::report::{worst_first, Report, REPORT_FORMAT_VERSION};

mod github;
pub mod html;
mod location;
pub mod markdown;
pub mod ranks;
mod sarif;
pub mod table;
mod text;

pub use github::{escape_data, escape_property, render_github};
pub use location::{path_ref, source_line, AnnotationOptions, PathRef, SourceLine};
pub use sarif::{render_sarif, sarif_level, SARIF_SCHEMA_URI, SOURCE_ROOT_BASE_ID};
pub use text::{
    activity_line, bytes_or_na, device_label, device_label_of, evidence_sentence, gap_sentences,
    headline, render_markdown, render_summary, render_text, verdict,
};

/// An output format of `vramscope report`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// Plain text for a terminal (optionally coloured).
    Text,
    /// GitHub-flavoured markdown.
    Markdown,
    /// JSON with the schema of [`REPORT_FORMAT_VERSION`].
    Json,
    /// One self-contained HTML page.
    Html,
    /// A SARIF 2.1.0 log for code scanning (see [`render_sarif`]).
    Sarif,
    /// GitHub Actions workflow commands, one annotation per finding (see [`render_github`]).
    Github,
}

impl FromStr for Format {
    type Err = String;

    fn from_str(s: &str) -> Result<Format, String> {
        match s.to_ascii_lowercase().as_str() {
            "text" | "txt" => Ok(Format::Text),
            "markdown" | "md" => Ok(Format::Markdown),
            "json" => Ok(Format::Json),
            "html" => Ok(Format::Html),
            "sarif" => Ok(Format::Sarif),
            "github" => Ok(Format::Github),
            _ => Err(format!(
                "unknown report format `{s}` (expected text, markdown, json, html, sarif or github)"
            )),
        }
    }
}

/// Renders `report` in `format`; `color` adds ANSI colours to text. SARIF and GitHub's
/// commands are rendered with the default [`AnnotationOptions`] (paths as the trace names
/// them); [`render_sarif`] and [`render_github`] take others, and several devices' reports.
/// The report is a file of one device: [`render_file`] renders the reports of several.
pub fn render(report: &Report, format: Format, color: bool) -> String {
    render_file(std::slice::from_ref(report), format, color)
}

/// Renders the reports of one file, one per device with data in device order, in `format`:
/// one report opening with the whole file's verdict ([`file_verdict`]), the devices' parts
/// after it. One report renders as the report of that device alone; JSON has one shape for
/// one device or many ([`REPORT_FORMAT_VERSION`]); HTML is one page with a device picker,
/// the worst device first ([`crate::html::render_html_file`]). Nothing at all is an empty
/// string.
pub fn render_file(reports: &[Report], format: Format, color: bool) -> String {
    match (format, reports) {
        (_, []) => String::new(),
        (Format::Text, [one]) => render_text(one, color),
        (Format::Markdown, [one]) => render_markdown(one),
        (Format::Html, [one]) => crate::html::render_html(one),
        (Format::Json, all) => render_file_json(all),
        (Format::Sarif, all) => render_sarif(all, &AnnotationOptions::default()),
        (Format::Github, all) => render_github(all, &AnnotationOptions::default()),
        (Format::Text, many) => text::render_text_devices(many, color),
        (Format::Markdown, many) => text::render_markdown_devices(many),
        (Format::Html, many) => crate::html::render_html_file(many),
    }
}

/// The one-line verdict of a whole file: [`verdict`] for one device; for several, every
/// device's problems, each with its device (`1 problem found: oom on cuda:1 at
/// models.py:181 (error)`), or that none of the devices has one.
pub fn file_verdict(reports: &[Report]) -> String {
    match reports {
        [one] => verdict(one),
        many => text::verdict_devices(many),
    }
}

/// One device's entry of the JSON report: its own verdict, then its report's keys.
#[derive(Serialize)]
struct DeviceJson<'a> {
    verdict: String,
    #[serde(flatten)]
    report: &'a Report,
}

/// The JSON report of a file ([`REPORT_FORMAT_VERSION`]).
#[derive(Serialize)]
struct FileJson<'a> {
    format_version: u32,
    source: &'a str,
    input: Option<&'a str>,
    verdict: String,
    worst_device: Option<u32>,
    devices: Vec<DeviceJson<'a>>,
}

/// The report as pretty-printed JSON: the file shape of [`REPORT_FORMAT_VERSION`], with one
/// device.
pub fn render_json(report: &Report) -> String {
    render_file_json(std::slice::from_ref(report))
}

/// The reports of one file's devices as one pretty-printed JSON document, the one shape of
/// [`REPORT_FORMAT_VERSION`] for one device or many.
pub fn render_file_json(reports: &[Report]) -> String {
    let first = reports.first();
    let document = FileJson {
        format_version: REPORT_FORMAT_VERSION,
        source: first.map_or("", |r| r.source.as_str()),
        input: first.and_then(|r| r.input.as_deref()),
        verdict: file_verdict(reports),
        worst_device: worst_first(reports)
            .first()
            .map(|&i| reports[i].device.index),
        devices: reports
            .iter()
            .map(|report| DeviceJson {
                verdict: verdict(report),
                report,
            })
            .collect(),
    };
    let mut text = serde_json::to_string_pretty(&document).unwrap_or_else(|e| {
        // Serializing plain data into a string cannot fail; say so if it ever does.
        format!("{{\"error\": \"could not serialize the report: {e}\"}}")
    });
    text.push('\n');
    text
}
