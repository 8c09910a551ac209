//! The HTML report: one self-contained page, the explorer, with memory over time stacked by
//! call site, the live blocks and segments at a cursor, what the memory is made of (stacked by
//! category, and an icicle of the call tree at the moment), the findings and the top call
//! sites.
//! The page opens on the answer: the report's one-line verdict (`crate::text::verdict`) and the
//! errors and warnings, each with its line and fix, stand above the figures and the chart.
//!
//! The analysis crate (`vramscope_analysis::report`) builds the [`Report`]; it carries the
//! explorer's data ([`explorer::ExplorerData`], bands and moments precomputed from the engine).
//! This module writes the page around it with `maud`'s `html!` templates: the data as JSON in a
//! `<script type="application/json">` element (each moment's segment map as the base64 string of
//! [`explorer::compact`], which the script decodes when the cursor first shows the moment), and
//! a hand-written script (`html/explorer.js`, about 950 lines, no library) that draws on canvas.
//! The data keeps each column's highest position, and the script draws the columns that share a
//! device pixel as one, with the bands of the highest (`poolColumns`), so that every spike and
//! the peak are drawn at their height, where they are. The page loads nothing from the network.
//! The findings and top-sites tables are `crate::table`'s, written once for every format.
//!
//! Escaping is by construction: a template escapes every string it is given, and a string
//! that came from a file (paths, function names, device names, labels, the sentences that
//! quote them) is given as a [`Line`], which also writes line breaks and `[` as character
//! references so that it stays one line of the page's source with no `##[` in it. The only
//! text written unescaped is the page's own constant style and scripts, and the embedded JSON,
//! whose `<` is escaped by the private `script_json`; the script sets text, never markup. A report
//! without explorer data (built by hand) gets the static inline SVG timeline instead.

use std::fmt::Write as _;

use maud::{html, Markup, PreEscaped, Render, DOCTYPE};
use vramscope_analysis::explorer;

use serde::Serialize;

use vramscope_model::format_bytes;

use crate::table::Table;
use crate::text::headline;
use vramscope_analysis::detect::Severity;
use vramscope_analysis::report::{Report, Timeline};

/// Escapes `&`, `<`, `>`, `"` and `'` for HTML text and attribute values, and writes line
/// breaks and `[` as character references (which a browser shows as they were), so that text
/// from a file is one line of the page's source and holds no `##[`: printed to a CI log, no
/// line of it is a workflow command (`vramscope_model::terminal`). The templates reach it
/// through [`Line`].
pub fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    escape_to(text, &mut out);
    out
}

/// [`escape`], appending to `out`.
fn escape_to(text: &str, out: &mut String) {
    for c in text.chars() {
        match c {
            '\n' => out.push_str("&#10;"),
            '\r' => out.push_str("&#13;"),
            '[' => out.push_str("&#91;"),
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            _ => out.push(c),
        }
    }
}

/// A text for a template, escaped by [`escape`]'s rule: markup in it stays text, and it is one
/// line of the page's source with no `##[`. Every string that came from a file reaches a page
/// as one (a plain `&str` is escaped by the template too, but keeps its line breaks).
pub struct Line<'a>(pub &'a str);

impl Render for Line<'_> {
    fn render_to(&self, buffer: &mut String) {
        escape_to(self.0, buffer);
    }
}

/// A page's markup as the string written out, with the line break that ends a file.
fn finish(page: Markup) -> String {
    let mut out = page.into_string();
    out.push('\n');
    out
}

const STYLE: &str = "body{font:14px/1.45 system-ui,sans-serif;margin:24px auto;max-width:1100px;color:#222;padding:0 16px}\
h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;margin:28px 0 8px}\
.muted{color:#666}ul.stats{margin:8px 0;padding-left:20px}\
table{border-collapse:collapse;width:100%;margin-top:6px}th,td{border-bottom:1px solid #ddd;padding:5px 8px;text-align:left;vertical-align:top}\
th{background:#f4f4f4}td.num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}\
.sev{display:inline-block;padding:1px 7px;border-radius:9px;font-size:12px;font-weight:600;color:#fff}\
.sev-error{background:#c62828}.sev-warning{background:#e08e00}.sev-info{background:#1e6fb8}\
code{font-family:ui-monospace,monospace;font-size:13px}.ev{color:#555;font-size:12px}\
svg{background:#fcfcfc;border:1px solid #e3e3e3}.legend span{margin-right:16px}\
#verdict{font-size:16px;font-weight:600;margin:12px 0 6px;padding:8px 12px;border-left:5px solid #2e7d32;background:#f1f8f1}\
#verdict.verdict-error{border-color:#c62828;background:#fdf0f0}#verdict.verdict-warning{border-color:#e08e00;background:#fff7e8}\
#problems{list-style:none;margin:0 0 10px;padding:0}#problems li{margin:6px 0;padding-left:12px}#problems .fix{color:#333}";

/// The styles [`render_html_file`] adds for its device picker and frames.
const DEVICES_STYLE: &str = "#devices{display:flex;flex-wrap:wrap;gap:6px;margin:8px 0}\
#devices button{font:inherit;padding:4px 10px;border:1px solid #bbb;border-radius:4px;background:#fafafa;cursor:pointer;text-align:left}\
#devices button[aria-pressed=true]{border-color:#222;background:#fff;font-weight:600}\
iframe.device{width:100%;height:1400px;border:1px solid #ddd;border-radius:4px;display:block}";

/// The most errors and warnings listed above the chart; the rest are in the findings table.
const PROBLEMS_SHOWN: usize = 10;

/// Renders the report as one self-contained HTML page.
pub fn render_html(report: &Report) -> String {
    finish(page(report, false))
}

/// The page of one file's reports for an `<iframe srcdoc>` (a notebook's output): one device's
/// page with a `<base>` of `about:srcdoc`, so that its links to its own findings stay in the
/// frame (a `srcdoc` page resolves links against its parent's address), or the page of
/// several devices, whose frames carry that `<base>` already.
pub fn render_html_framed(reports: &[Report]) -> String {
    match reports {
        [one] => finish(page(one, true)),
        many => render_html_file(many),
    }
}

/// The page of [`render_html`]; `in_frame` adds the `<base>` of a page shown in an
/// `<iframe srcdoc>`.
fn page(report: &Report, in_frame: bool) -> Markup {
    let headline = headline(report);
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                // A `srcdoc` page resolves links against its parent's address: a `<base>` of
                // `about:srcdoc` keeps the page's links to its own findings in the frame.
                @if in_frame { base href="about:srcdoc"; }
                meta charset="utf-8";
                title { "vramscope report: " (Line(&headline)) }
                style { (PreEscaped(STYLE)) }
            }
            body {
                h1 { "vramscope report" }
                div class="muted" { (Line(&headline)) }
                (verdict_section(report))
                // The text report's lines, one for one: where the steps came from, the
                // trace's caveats, the peak's event and what the memory is made of included.
                ul class="stats" {
                    @for line in crate::text::stat_lines(report) {
                        li { (Line(&line)) }
                    }
                }
                @match &report.timeline.explorer {
                    Some(data) => (explorer_section(data)),
                    None => {
                        h2 { "Timeline" }
                        (timeline_svg(&report.timeline))
                    }
                }
                h2 { "Findings (" (report.counts_phrase()) ")" }
                @if report.findings.is_empty() {
                    p { "None." }
                } @else {
                    (Table::findings(report).html())
                }
                h2 { "Top sites" }
                @if report.top_sites.is_empty() {
                    p { "Nothing is live." }
                } @else {
                    (Table::top_sites(report).html())
                }
                @if let Some(data) = &report.timeline.explorer {
                    (explorer_scripts(report, data))
                }
            }
        }
    }
}

/// A severity as the coloured badge the page shows it as.
pub(crate) fn severity_badge(severity: Severity) -> Markup {
    let sev = severity_class(severity);
    html! { span class=(format!("sev sev-{sev}")) { (sev) } }
}

/// Renders the reports of a file of several devices as one self-contained page: the whole
/// file's verdict (`report::file_verdict`), a device picker with each device's verdict,
/// the worst device first (`report::worst_first`), and each device's own page
/// ([`render_html`]) in an `<iframe srcdoc>`, the worst device's shown. The frames keep each
/// explorer's element ids, styles and keys apart; the picker's script only shows one frame and
/// hides the others, and copies the shown frame's `data-ready` and `data-errors` onto the
/// page's body for the browser test. One report is its own page.
pub fn render_html_file(reports: &[Report]) -> String {
    if let [one] = reports {
        return render_html(one);
    }
    let order = vramscope_analysis::report::worst_first(reports);
    let file_verdict = crate::file_verdict(reports);
    let worst = reports
        .iter()
        .flat_map(|r| r.findings.iter())
        .filter(|f| f.severity >= Severity::Warning)
        .map(|f| f.severity)
        .max()
        .map_or("ok", severity_class);
    let title = reports
        .first()
        .map(|r| {
            format!(
                "vramscope report: {} ({} devices)",
                r.input.as_deref().unwrap_or(r.source.as_str()),
                reports.len()
            )
        })
        .unwrap_or_default();
    finish(html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                title { (Line(&title)) }
                style { (PreEscaped(STYLE)) (PreEscaped(DEVICES_STYLE)) }
            }
            body {
                h1 { "vramscope report" }
                div class="muted" { (Line(&title)) }
                div id="verdict" class=(format!("verdict-{worst}")) { (Line(&file_verdict)) }
                div id="devices" role="tablist" {
                    @for (place, &i) in order.iter().enumerate() {
                        @let r = &reports[i];
                        button role="tab" data-device=(r.device.index) aria-pressed=(place == 0) {
                            b { (Line(&crate::text::device_label(r))) }
                            " "
                            span class="muted" { (Line(&crate::text::verdict(r))) }
                        }
                    }
                }
                @for (place, &i) in order.iter().enumerate() {
                    @let r = &reports[i];
                    @let frame_title = format!("{}: {}", crate::text::device_label(r), crate::text::verdict(r));
                    // The frame's page is markup of this module's own, escaped here as the
                    // value of `srcdoc` (one line, as text from a file is).
                    iframe class="device" data-device=(r.device.index) title=(Line(&frame_title))
                        hidden[place != 0] srcdoc=(Line(&finish(page(r, true)))) {}
                }
                script { "\n" (PreEscaped(DEVICE_PICKER_SCRIPT)) }
            }
        }
    })
}

/// The device picker of [`render_html_file`]: shows the frame of the button pressed, and
/// reports the shown frame's state on the page's body.
const DEVICE_PICKER_SCRIPT: &str = r##""use strict";
(function () {
  const buttons = Array.from(document.querySelectorAll("#devices button"));
  const frames = Array.from(document.querySelectorAll("iframe.device"));
  function mirror(frame) {
    try {
      const body = frame.contentDocument && frame.contentDocument.body;
      if (!body) return;
      document.body.dataset.device = frame.dataset.device;
      document.body.dataset.ready = body.dataset.ready || "";
      document.body.dataset.errors = body.dataset.errors || "0";
      document.body.dataset.paintMs = body.dataset.paintMs || "";
    } catch (e) {
      document.body.dataset.errors = String(e);
    }
  }
  function show(device) {
    for (const b of buttons) b.setAttribute("aria-pressed", String(b.dataset.device === device));
    for (const f of frames) {
      f.hidden = f.dataset.device !== device;
      if (!f.hidden) mirror(f);
    }
  }
  for (const b of buttons) b.addEventListener("click", () => show(b.dataset.device));
  for (const f of frames) f.addEventListener("load", () => { if (!f.hidden) mirror(f); });
  if (buttons.length) show(buttons[0].dataset.device);
})();
"##;

/// The verdict and the errors and warnings, for the top of the page: the report's one-line
/// verdict, coloured by the worst severity, then each error and warning with its site, what
/// it is and its fix (at most [`PROBLEMS_SHOWN`], the rest counted).
fn verdict_section(report: &Report) -> Markup {
    let problems: Vec<(usize, &vramscope_analysis::detect::Finding)> = report
        .findings
        .iter()
        .enumerate()
        .filter(|(_, f)| f.severity >= Severity::Warning)
        .collect();
    let worst = problems
        .iter()
        .map(|(_, f)| f.severity)
        .max()
        .map_or("ok", severity_class);
    html! {
        div id="verdict" class=(format!("verdict-{worst}")) { (Line(&crate::text::verdict(report))) }
        @if !problems.is_empty() {
            ul id="problems" {
                @for (i, f) in problems.iter().take(PROBLEMS_SHOWN) {
                    li {
                        (severity_badge(f.severity))
                        " "
                        code { (Line(f.site_label())) }
                        " "
                        (Line(&f.summary))
                        " "
                        a href=(format!("#finding-{i}")) { "details" }
                        div class="fix" { b { "fix:" } " " (Line(&f.fix)) }
                    }
                }
                @if problems.len() > PROBLEMS_SHOWN {
                    li class="muted" {
                        "and " (problems.len() - PROBLEMS_SHOWN) " more in the findings below"
                    }
                }
            }
        }
    }
}

/// Styles of the explorer.
const EXPLORER_STYLE: &str = include_str!("html/explorer.css");

/// The explorer's script.
const EXPLORER_SCRIPT: &str = include_str!("html/explorer.js");

/// The explorer's markup: toolbar, chart, legend, site table and segment map.
fn explorer_section(data: &explorer::ExplorerData) -> Markup {
    html! {
        style { (PreEscaped(EXPLORER_STYLE)) }
        h2 { "Active memory over time, by call site" }
        div class="toolbar" {
            button id="go-peak" title="P" { "Peak (P)" }
            button id="go-end" title="E" { "End (E)" }
            button id="reset-zoom" title="0" { "Whole trace (0)" }
            button id="toggle-axis" title="T" { "x axis: " span id="axis-mode" { "events" } " (T)" }
            span class="muted" {
                "hover: site and stack · click: pin a site and move the cursor · wheel or +/-: zoom · drag or [ ]: pan · ←/→: cursor · R: peak reserved · Esc: unpin"
            }
        }
        div class="stats-line" {
            "peak allocated " b id="peak-figure" data-bytes="" { (format_bytes(data.peak_allocated)) }
            " after " (data.peak_pos) " events · "
            span id="band-count" data-count="" { (data.series.len()) }
            " bands · " (data.bucket_start.len()) " columns for " (data.events)
            " events · drawn in " span id="draw-ms" {} " ms"
        }
        div id="chart-wrap" {
            canvas id="chart" aria-label="allocated bytes over the trace, stacked by call site" {}
        }
        div id="legend" {}
        div class="panes" {
            div class="pane" {
                h3 id="table-title" { "Live at the peak" }
                table id="site-table" {
                    thead { tr { th { "site" } th { "bytes" } th { "blocks" } } }
                    tbody {}
                    tfoot {}
                }
            }
            div class="pane" {
                h3 id="segmap-title" { "Segments" }
                div class="seg-legend" {
                    span { i class="swatch" style="background:#4e79a7" {} "allocated (site colour)" }
                    span { i class="swatch" style="background:#6d4c41" {} "waiting to be freed" }
                    span { i class="swatch" style="background:#f3b3b3" {} "inactive split (free in a segment in use)" }
                    span { i class="swatch" style="background:#e4e4e4" {} "free segment" }
                    span { "s/L: small/large pool, e: expandable (a mapped run)" }
                }
                div id="segmap-wrap" { canvas id="segmap" {} }
                div id="segmap-note" class="muted" {}
            }
        }
        h2 id="categories" { "What the memory is made of" }
        p class="muted" {
            "Allocated bytes by what they hold, from the trace alone: parameters, gradients, optimizer state, activations (kept by a forward for its backward), temporaries, inputs, memory from before the trace and unknown. The legend gives each one's bytes at the cursor."
        }
        div id="cat-wrap" {
            canvas id="cat-chart" aria-label="allocated bytes over the trace, stacked by what the memory is" {}
        }
        div id="cat-legend" {}
        h3 id="icicle-title" { "Live bytes by the call tree" }
        p class="muted" {
            "Each block of a row is a line of the program (a driver's line, a module's forward, a line in it; module names where attach() marked them), as wide as the live bytes under it and coloured by what most of them are. Hover for the path."
        }
        div id="icicle-wrap" { canvas id="icicle" aria-label="live bytes by the user's call tree" {} }
        pre id="tip" hidden {}
        ul id="errors" hidden {}
        div id="selftest" hidden {}
    }
}

/// What the script needs of a finding.
#[derive(Serialize)]
struct FindingLink<'a> {
    site: Option<&'a str>,
    /// The positions of its steps, from the whole list of steps
    /// ([`explorer::ExplorerData::step_range`]), which the page may carry thinned.
    range: Option<[u64; 2]>,
}

/// JSON for a `<script>` element: `<` escaped, so that no `</script>` can end it (and no
/// `<!--` can open a comment); the templates write it as it is ([`PreEscaped`]), as a
/// script's text is not read for character references.
fn script_json(value: &impl Serialize) -> PreEscaped<String> {
    PreEscaped(
        serde_json::to_string(value)
            .unwrap_or_else(|_| "null".to_string())
            .replace('<', "\\u003c"),
    )
}

/// The data and the script, placed last so the page's elements exist when it runs.
fn explorer_scripts(report: &Report, data: &explorer::ExplorerData) -> Markup {
    let findings: Vec<FindingLink<'_>> = report
        .findings
        .iter()
        .map(|f| FindingLink {
            site: f.site.as_deref(),
            range: data.step_range(f.first_step, f.last_step),
        })
        .collect();
    html! {
        // The JSON is safe inside the element as `script_json` writes it: no `<` in it.
        script type="application/json" id="vs-data" { (script_json(data)) }
        script type="application/json" id="vs-findings" { (script_json(&findings)) }
        script { (PreEscaped(EXPLORER_SCRIPT)) }
    }
}

fn severity_class(severity: Severity) -> &'static str {
    severity.as_str()
}

const WIDTH: f64 = 960.0;
const HEIGHT: f64 = 320.0;
const LEFT: f64 = 80.0;
const RIGHT: f64 = 16.0;
const TOP: f64 = 16.0;
const BOTTOM: f64 = 40.0;

/// The distance between y-axis ticks: the smallest power of two that needs at most six ticks to
/// reach `top`, so that labels come out round in binary units (256 MiB, 512 MiB, 1.00 GiB).
fn tick_step(top: u64) -> u64 {
    let mut step = 1u64;
    while top.div_ceil(step) > 6 && step < 1 << 62 {
        step *= 2;
    }
    step
}

/// A coordinate of the SVG, to a tenth.
fn at(v: f64) -> String {
    format!("{v:.1}")
}

/// The timeline of allocated and reserved bytes as inline SVG, with step marks and OOMs.
/// SVG's elements are closed by their end tags (`<line …></line>`), which is the same element
/// as `<line …/>`.
fn timeline_svg(t: &Timeline) -> Markup {
    if t.points.is_empty() {
        return html! { p class="muted" { "No allocation events to draw." } };
    }
    let plot_w = WIDTH - LEFT - RIGHT;
    let plot_h = HEIGHT - TOP - BOTTOM;
    let mut top = t.start.0.max(t.start.1);
    for p in &t.points {
        top = top.max(p.allocated).max(p.reserved);
    }
    let capacity = t.capacity.filter(|&c| c <= top.saturating_mul(2));
    if let Some(c) = capacity {
        top = top.max(c);
    }
    let step = tick_step(top.max(1));
    let ticks = top.max(1).div_ceil(step);
    let top = ticks.saturating_mul(step) as f64;
    let last = t.events.saturating_sub(1).max(1) as f64;
    let x = |event: u32| LEFT + f64::from(event) / last * plot_w;
    let y = |bytes: u64| TOP + plot_h - bytes as f64 / top * plot_h;
    // The two curves, drawn as steps.
    let path = |value: &dyn Fn(&vramscope_analysis::model_view::TimelinePoint) -> u64,
                start: u64| {
        let mut d = format!("M{:.1},{:.1}", LEFT, y(start));
        let mut prev = start;
        for p in &t.points {
            let xx = x(p.event);
            let v = value(p);
            let _ = write!(d, " H{xx:.1}");
            if v != prev {
                let _ = write!(d, " V{:.1}", y(v));
                prev = v;
            }
        }
        let _ = write!(d, " H{:.1}", LEFT + plot_w);
        d
    };
    // Step marks, labelled sparsely when there are many.
    let every = t.steps.len().div_ceil(30).max(1);
    let bottom = at(TOP + plot_h);
    html! {
        svg viewBox=(format!("0 0 {WIDTH} {HEIGHT}")) width="100%" role="img"
            aria-label="allocated and reserved bytes over the trace" {
            // Grid and y labels.
            @for i in 0..=ticks {
                @let bytes = i.saturating_mul(step);
                @let yy = at(y(bytes));
                line x1=(LEFT) x2=(at(WIDTH - RIGHT)) y1=(yy) y2=(yy) stroke="#e6e6e6" {}
                text x=(at(LEFT - 6.0)) y=(at(y(bytes) + 4.0)) font-size="11" text-anchor="end" fill="#555" {
                    (format_bytes(bytes))
                }
            }
            @for (i, tick) in t.steps.iter().enumerate() {
                @let xx = at(x(tick.event));
                line x1=(xx) x2=(xx) y1=(TOP) y2=(bottom) stroke="#9e9e9e" stroke-dasharray="3,3" {
                    title { "step " (tick.step) " " (Line(&tick.label)) }
                }
                @if i % every == 0 {
                    text x=(at(x(tick.event) + 2.0)) y=(at(TOP + 10.0)) font-size="10" fill="#777" { (tick.step) }
                }
            }
            @if let Some(c) = capacity {
                @let yy = at(y(c));
                line x1=(LEFT) x2=(at(WIDTH - RIGHT)) y1=(yy) y2=(yy) stroke="#c62828" stroke-dasharray="6,3" {}
                text x=(at(WIDTH - RIGHT - 4.0)) y=(at(y(c) - 4.0)) font-size="11" text-anchor="end" fill="#c62828" { "capacity" }
            }
            @if t.reserved_known {
                path d=(path(&|p| p.reserved, t.start.1)) fill="none" stroke="#ef8a17" stroke-width="1.5" {}
            }
            path d=(path(&|p| p.allocated, t.start.0)) fill="none" stroke="#1e6fb8" stroke-width="1.5" {}
            @for &oom in &t.ooms {
                @let xx = at(x(oom));
                line x1=(xx) x2=(xx) y1=(TOP) y2=(bottom) stroke="#c62828" stroke-width="2" { title { "OOM" } }
                text x=(at(x(oom) + 3.0)) y=(at(TOP + 24.0)) font-size="11" fill="#c62828" { "OOM" }
            }
            // Axes.
            line x1=(LEFT) x2=(LEFT) y1=(TOP) y2=(bottom) stroke="#888" {}
            line x1=(LEFT) x2=(at(WIDTH - RIGHT)) y1=(bottom) y2=(bottom) stroke="#888" {}
            text x=(LEFT) y=(at(TOP + plot_h + 16.0)) font-size="11" fill="#555" { "event 0" }
            text x=(at(WIDTH - RIGHT)) y=(at(TOP + plot_h + 16.0)) font-size="11" text-anchor="end" fill="#555" {
                "event " (t.events.saturating_sub(1))
            }
        }
        div class="legend muted" {
            span style="color:#1e6fb8" { "\u{25a0} allocated" }
            @if t.reserved_known {
                span style="color:#ef8a17" { "\u{25a0} reserved" }
            }
            span style="color:#9e9e9e" { "\u{250a} step start" }
            @if !t.ooms.is_empty() {
                span style="color:#c62828" { "\u{2502} OOM" }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_markup() {
        assert_eq!(
            escape("<a href=\"x\">'&'</a>"),
            "&lt;a href=&quot;x&quot;&gt;&#39;&amp;&#39;&lt;/a&gt;"
        );
    }

    #[test]
    fn tick_steps_are_round() {
        const MIB: u64 = 1 << 20;
        const GIB: u64 = 1 << 30;
        assert_eq!(tick_step(12_190 * MIB), 2 * GIB);
        assert_eq!(tick_step(1423 * MIB), 256 * MIB);
        assert_eq!(tick_step(1700 * MIB), 512 * MIB);
        assert_eq!(tick_step(800 * MIB), 256 * MIB);
        assert_eq!(tick_step(3), 1);
        assert_eq!(tick_step(1000), 256);
        for top in [1, 7, 513, 5 * MIB + 3, 77 * GIB, u64::MAX / 2] {
            let step = tick_step(top);
            assert!(
                (4..=6).contains(&top.div_ceil(step)) || top < 4,
                "{top}: {step}"
            );
        }
    }

    /// A file's names reach the explorer's data as JSON inside a `<script>`: markup in them
    /// stays text.
    #[test]
    fn the_page_escapes_what_came_from_the_file() {
        let mut snapshot = vramscope_testkit::device_run(0, 64 << 20);
        snapshot.sites.push(vramscope_model::CallSite {
            file: "</script><b>x.py".to_string(),
            line: 1,
            column: 0,
            function: "f".to_string(),
            frames: Vec::new(),
        });
        let site = vramscope_model::Id::new(snapshot.sites.len() as u32 - 1);
        for event in snapshot.events.iter_mut() {
            event.site = site;
        }
        let built = vramscope_analysis::report::build_report(&snapshot, &Default::default());
        let page = render_html(&built);
        assert!(!page.contains("</script><b>"), "no markup from the file");
        assert!(page.contains("\\u003c/script>\\u003cb>x.py"));
    }

    /// The page's own pooling of columns into pixels (`poolColumns` in `explorer.js`), run in
    /// Node on columns a tenth of a pixel wide with four one-column spikes: each pixel is drawn
    /// with its highest column, so every spike keeps its height and its pixel; the drawn
    /// columns tile the plot, and each carries its highest reserved bytes. Skipped, with a
    /// notice, where Node is not installed.
    #[test]
    fn the_page_draws_each_pixel_with_its_highest_column() {
        let script = include_str!("html/explorer.js");
        let begin = script
            .find("// pool:begin")
            .expect("the pool function's start");
        let end = script.find("// pool:end").expect("the pool function's end");
        let program = format!(
            "{}\n{}",
            &script[begin..end],
            r#"
const n = 1000, spikes = [5, 250, 251, 777];
const height = (k) => (spikes.includes(k) ? 134 : 37 + (k % 3));
const reserved = (k) => (k === 600 ? 500 : 64);
const out = {};
for (const scale of [1, 2]) {
  out[scale] = poolColumns(0, n - 1, (k) => k / 10, (k) => (k + 1) / 10, height, reserved, scale);
}
console.log(JSON.stringify(out));
"#
        );
        let run = std::process::Command::new("node")
            .args(["-e", &program])
            .output();
        let run = match run {
            Ok(run) => run,
            Err(e) => {
                eprintln!("skipped: node is not installed ({e}): the pooling test did not run");
                return;
            }
        };
        assert!(
            run.status.success(),
            "{}",
            String::from_utf8_lossy(&run.stderr)
        );
        let out: serde_json::Value = serde_json::from_slice(&run.stdout).expect("JSON");
        let height = |k: u64| {
            if [5, 250, 251, 777].contains(&k) {
                134
            } else {
                37 + k % 3
            }
        };
        for (scale, pixels) in [("1", 100u64), ("2", 200)] {
            let cols = out[scale].as_array().expect("columns");
            assert_eq!(
                cols.len() as u64,
                pixels,
                "one drawn column per device pixel"
            );
            let per = 1000 / pixels;
            for (i, c) in cols.iter().enumerate() {
                let i = i as u64;
                let k = c["k"].as_u64().unwrap();
                assert!(
                    (i * per..(i + 1) * per).contains(&k),
                    "column {i} draws {k}"
                );
                let highest = (i * per..(i + 1) * per).map(height).max().unwrap();
                assert_eq!(height(k), highest, "column {i} is drawn at its highest");
                let x0 = c["x0"].as_f64().unwrap();
                assert!(
                    (x0 - (i * per) as f64 / 10.0).abs() < 1e-9,
                    "columns tile the plot"
                );
                let r = if (i * per..(i + 1) * per).contains(&600) {
                    500
                } else {
                    64
                };
                assert_eq!(c["r"], r);
            }
            for spike in [5u64, 250, 251, 777] {
                let i = spike / per;
                assert_eq!(
                    height(cols[i as usize]["k"].as_u64().unwrap()),
                    134,
                    "spike {spike}"
                );
            }
        }
    }

    /// A page for a frame keeps its links to its own findings in the frame; a page of its own
    /// has no `<base>`.
    #[test]
    fn a_framed_page_has_the_base_of_a_srcdoc_page() {
        let snapshot = vramscope_testkit::device_run(0, 64 << 20);
        let built = vramscope_analysis::report::build_report(&snapshot, &Default::default());
        let framed = render_html_framed(std::slice::from_ref(&built));
        let head = &framed[..framed.find("</head>").expect("a head")];
        assert!(head.contains("<base href=\"about:srcdoc\">"), "{head}");
        assert!(!render_html(&built).contains("<base"));
    }
}
