//! The HTML report: one self-contained page, the explorer, with memory over time stacked by
//! call site, the live blocks and segments at a cursor, the findings and the top call sites.
//! The page opens on the answer: the report's one-line verdict (`crate::text::verdict`) and the
//! errors and warnings, each with its line and fix, stand above the figures and the chart.
//!
//! The analysis crate (`vramscope_analysis::report`) builds the [`Report`]; it carries the
//! explorer's data ([`explorer::ExplorerData`], bands and moments precomputed from the engine).
//! This module writes the page around it: the data as JSON in a `<script type="application/json">`
//! element (each moment's segment map as the base64 string of [`explorer::compact`], which the script
//! decodes when the cursor first shows the moment), and a hand-written script
//! (`html/explorer.js`, about 800 lines, no library) that draws on canvas. The data keeps each
//! column's highest position, and the script draws the columns that share a device pixel as
//! one, with the bands of the highest (`poolColumns`), so that every spike and the peak are
//! drawn at their height, where they are. The page loads nothing from the network. Every string that came from a
//! file (paths, function names, device names, labels) is escaped with [`escape`] in HTML, and
//! `<` is escaped in the embedded JSON; the script sets text, never markup. A report without
//! explorer data (built by hand) gets the static inline SVG timeline instead.

use std::fmt::Write as _;

use vramscope_analysis::explorer;

use serde::Serialize;

use vramscope_model::format_bytes;

use crate::text::{bytes_or_na, headline};
use vramscope_analysis::detect::Severity;
use vramscope_analysis::report::{Report, Timeline};

/// Escapes `&`, `<`, `>`, `"` and `'` for HTML text and attribute values, and writes line
/// breaks and `[` as character references (which a browser shows as they were), so that text
/// from a file is one line of the page's source and holds no `##[`: printed to a CI log, no
/// line of it is a workflow command (`vramscope_model::terminal`).
pub fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
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

/// The most errors and warnings listed above the chart; the rest are in the findings table.
const PROBLEMS_SHOWN: usize = 10;

/// Renders the report as one self-contained HTML page.
pub fn render_html(report: &Report) -> String {
    let mut out = String::new();
    out.push_str("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n");
    let _ = writeln!(
        out,
        "<title>vramscope report: {}</title>",
        escape(&headline(report))
    );
    let _ = writeln!(out, "<style>{STYLE}</style>\n</head>\n<body>");
    let _ = writeln!(out, "<h1>vramscope report</h1>");
    let _ = writeln!(
        out,
        "<div class=\"muted\">{}</div>",
        escape(&headline(report))
    );
    out.push_str(&verdict_section(report));

    let s = &report.stats;
    out.push_str("<ul class=\"stats\">\n");
    let _ = writeln!(out, "<li>{}</li>", crate::text::counts_line(report));
    let _ = writeln!(
        out,
        "<li>peak allocated {}, peak reserved {}; at the end {} live blocks, {} allocated, {} reserved</li>",
        format_bytes(s.peak_allocated_bytes),
        bytes_or_na(s.peak_reserved_bytes),
        s.live_blocks,
        format_bytes(s.allocated_bytes),
        bytes_or_na(s.reserved_bytes)
    );
    let _ = writeln!(
        out,
        "<li>{}</li>",
        escape(&crate::text::activity_sentence(s))
    );
    for gap in crate::text::gap_sentences(s) {
        let _ = writeln!(out, "<li>{}</li>", escape(&gap));
    }
    out.push_str("</ul>\n");

    match &report.timeline.explorer {
        Some(data) => out.push_str(&explorer_section(data)),
        None => {
            out.push_str("<h2>Timeline</h2>\n");
            out.push_str(&timeline_svg(&report.timeline));
        }
    }

    let _ = writeln!(out, "<h2>Findings ({})</h2>", report.counts_phrase());
    if report.findings.is_empty() {
        out.push_str("<p>None.</p>\n");
    } else {
        out.push_str(
            "<table id=\"findings\">\n<tr><th>severity</th><th>kind</th><th>site</th><th>what</th></tr>\n",
        );
        for (i, f) in report.findings.iter().enumerate() {
            let evidence = f
                .evidence
                .entries()
                .iter()
                .map(|(k, v)| format!("{}={}", escape(k), escape(&v.to_string())))
                .collect::<Vec<_>>()
                .join(", ");
            let _ = writeln!(
                out,
                "<tr id=\"finding-{i}\" data-finding=\"{i}\"><td><span class=\"sev sev-{sev}\">{sev}</span></td><td><code>{kind}</code></td><td><code>{site}</code><br><span class=\"muted\">{function}</span></td><td>{summary}<div class=\"ev\">{evidence}</div><div><b>fix:</b> {fix}</div></td></tr>",
                sev = severity_class(f.severity),
                kind = escape(f.kind.as_str()),
                site = escape(f.site_label()),
                function = escape(&f.function),
                summary = escape(&f.summary),
                fix = escape(&f.fix),
            );
        }
        out.push_str("</table>\n");
    }

    out.push_str("<h2>Top sites</h2>\n");
    if report.top_sites.is_empty() {
        out.push_str("<p>Nothing is live.</p>\n");
    } else {
        out.push_str("<table>\n<tr><th>live</th><th>blocks</th><th>at peak</th><th>blocks</th><th>allocations</th><th>site</th></tr>\n");
        for t in &report.top_sites {
            let _ = writeln!(
                out,
                "<tr><td class=\"num\">{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td><td><code>{}</code> <span class=\"muted\">{}</span></td></tr>",
                format_bytes(t.live_bytes),
                t.live_blocks,
                format_bytes(t.peak_bytes),
                t.peak_blocks,
                t.allocations,
                escape(&t.label),
                escape(&t.function)
            );
        }
        if let Some(o) = &report.other_sites {
            let _ = writeln!(
                out,
                "<tr><td class=\"num\">{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td><td class=\"muted\">{}</td></tr>",
                format_bytes(o.live_bytes),
                o.live_blocks,
                format_bytes(o.peak_bytes),
                o.peak_blocks,
                o.allocations,
                escape(&o.label())
            );
        }
        out.push_str("</table>\n");
    }
    if let Some(data) = &report.timeline.explorer {
        out.push_str(&explorer_scripts(report, data));
    }
    out.push_str("</body>\n</html>\n");
    out
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
    let mut out = String::new();
    out.push_str("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n");
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
    let _ = writeln!(out, "<title>{}</title>", escape(&title));
    let _ = writeln!(
        out,
        "<style>{STYLE}#devices{{display:flex;flex-wrap:wrap;gap:6px;margin:8px 0}}\
#devices button{{font:inherit;padding:4px 10px;border:1px solid #bbb;border-radius:4px;background:#fafafa;cursor:pointer;text-align:left}}\
#devices button[aria-pressed=true]{{border-color:#222;background:#fff;font-weight:600}}\
iframe.device{{width:100%;height:1400px;border:1px solid #ddd;border-radius:4px;display:block}}</style>\n</head>\n<body>"
    );
    let _ = writeln!(out, "<h1>vramscope report</h1>");
    let _ = writeln!(out, "<div class=\"muted\">{}</div>", escape(&title));
    let _ = writeln!(
        out,
        "<div id=\"verdict\" class=\"verdict-{worst}\">{}</div>",
        escape(&file_verdict)
    );
    out.push_str("<div id=\"devices\" role=\"tablist\">\n");
    for (place, &i) in order.iter().enumerate() {
        let r = &reports[i];
        let _ = writeln!(
            out,
            "<button role=\"tab\" data-device=\"{index}\" aria-pressed=\"{pressed}\"><b>{name}</b> <span class=\"muted\">{verdict}</span></button>",
            index = r.device.index,
            pressed = place == 0,
            name = escape(&crate::text::device_label(r)),
            verdict = escape(&crate::text::verdict(r)),
        );
    }
    out.push_str("</div>\n");
    for (place, &i) in order.iter().enumerate() {
        let r = &reports[i];
        // A `srcdoc` page resolves links against its parent's address: a `<base>` of
        // `about:srcdoc` keeps the page's links to its own findings in the frame.
        let page = render_html(r).replacen("<head>\n", "<head>\n<base href=\"about:srcdoc\">\n", 1);
        let _ = writeln!(
            out,
            "<iframe class=\"device\" data-device=\"{index}\" title=\"{title}\"{hidden} srcdoc=\"{page}\"></iframe>",
            index = r.device.index,
            title = escape(&format!("{}: {}", crate::text::device_label(r), crate::text::verdict(r))),
            hidden = if place == 0 { "" } else { " hidden" },
            page = escape(&page),
        );
    }
    out.push_str("<script>\n");
    out.push_str(DEVICE_PICKER_SCRIPT);
    out.push_str("</script>\n</body>\n</html>\n");
    out
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
fn verdict_section(report: &Report) -> String {
    let mut out = String::new();
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
    let _ = writeln!(
        out,
        "<div id=\"verdict\" class=\"verdict-{worst}\">{}</div>",
        escape(&crate::text::verdict(report))
    );
    if problems.is_empty() {
        return out;
    }
    out.push_str("<ul id=\"problems\">\n");
    for (i, f) in problems.iter().take(PROBLEMS_SHOWN) {
        let _ = writeln!(
            out,
            "<li><span class=\"sev sev-{sev}\">{sev}</span> <code>{site}</code> {summary} <a href=\"#finding-{i}\">details</a><div class=\"fix\"><b>fix:</b> {fix}</div></li>",
            sev = severity_class(f.severity),
            site = escape(f.site_label()),
            summary = escape(&f.summary),
            fix = escape(&f.fix),
        );
    }
    if problems.len() > PROBLEMS_SHOWN {
        let _ = writeln!(
            out,
            "<li class=\"muted\">and {} more in the findings below</li>",
            problems.len() - PROBLEMS_SHOWN
        );
    }
    out.push_str("</ul>\n");
    out
}

/// Styles of the explorer.
const EXPLORER_STYLE: &str = include_str!("html/explorer.css");

/// The explorer's script.
const EXPLORER_SCRIPT: &str = include_str!("html/explorer.js");

/// The explorer's markup: toolbar, chart, legend, site table and segment map.
fn explorer_section(data: &explorer::ExplorerData) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "<style>{EXPLORER_STYLE}</style>");
    out.push_str("<h2>Active memory over time, by call site</h2>\n");
    let _ = writeln!(
        out,
        "<div class=\"toolbar\"><button id=\"go-peak\" title=\"P\">Peak (P)</button>\
<button id=\"go-end\" title=\"E\">End (E)</button><button id=\"reset-zoom\" title=\"0\">Whole trace (0)</button>\
<button id=\"toggle-axis\" title=\"T\">x axis: <span id=\"axis-mode\">events</span> (T)</button>\
<span class=\"muted\">hover: site and stack · click: pin a site and move the cursor · wheel or +/-: zoom · drag or [ ]: pan · ←/→: cursor · R: peak reserved · Esc: unpin</span></div>"
    );
    let _ = writeln!(
        out,
        "<div class=\"stats-line\">peak allocated <b id=\"peak-figure\" data-bytes=\"\">{}</b> after {} events \
· <span id=\"band-count\" data-count=\"\">{}</span> bands · {} columns for {} events · drawn in <span id=\"draw-ms\"></span> ms</div>",
        format_bytes(data.peak_allocated),
        data.peak_pos,
        data.series.len(),
        data.bucket_start.len(),
        data.events
    );
    out.push_str("<div id=\"chart-wrap\"><canvas id=\"chart\" aria-label=\"allocated bytes over the trace, stacked by call site\"></canvas></div>\n");
    out.push_str("<div id=\"legend\"></div>\n");
    out.push_str("<div class=\"panes\"><div class=\"pane\"><h3 id=\"table-title\">Live at the peak</h3>\
<table id=\"site-table\"><thead><tr><th>site</th><th>bytes</th><th>blocks</th></tr></thead><tbody></tbody><tfoot></tfoot></table></div>\
<div class=\"pane\"><h3 id=\"segmap-title\">Segments</h3><div class=\"seg-legend\"><span><i class=\"swatch\" style=\"background:#4e79a7\"></i>allocated (site colour)</span>\
<span><i class=\"swatch\" style=\"background:#6d4c41\"></i>waiting to be freed</span><span><i class=\"swatch\" style=\"background:#f3b3b3\"></i>inactive split (free in a segment in use)</span>\
<span><i class=\"swatch\" style=\"background:#e4e4e4\"></i>free segment</span><span>s/L: small/large pool, e: expandable (a mapped run)</span></div>\
<div id=\"segmap-wrap\"><canvas id=\"segmap\"></canvas></div><div id=\"segmap-note\" class=\"muted\"></div></div></div>\n");
    out.push_str(
        "<pre id=\"tip\" hidden></pre>\n<ul id=\"errors\" hidden></ul>\n<div id=\"selftest\" hidden></div>\n",
    );
    out
}

/// What the script needs of a finding.
#[derive(Serialize)]
struct FindingLink<'a> {
    site: Option<&'a str>,
    /// The positions of its steps, from the whole list of steps
    /// ([`explorer::ExplorerData::step_range`]), which the page may carry thinned.
    range: Option<[u64; 2]>,
}

/// JSON for a `<script>` element: `<` escaped, so that no `</script>` can end it.
fn script_json(value: &impl Serialize) -> String {
    serde_json::to_string(value)
        .unwrap_or_else(|_| "null".to_string())
        .replace('<', "\\u003c")
}

/// The data and the script, placed last so the page's elements exist when it runs.
fn explorer_scripts(report: &Report, data: &explorer::ExplorerData) -> String {
    let findings: Vec<FindingLink<'_>> = report
        .findings
        .iter()
        .map(|f| FindingLink {
            site: f.site.as_deref(),
            range: data.step_range(f.first_step, f.last_step),
        })
        .collect();
    format!(
        "<script type=\"application/json\" id=\"vs-data\">{}</script>\n\
<script type=\"application/json\" id=\"vs-findings\">{}</script>\n<script>{}</script>\n",
        script_json(data),
        script_json(&findings),
        EXPLORER_SCRIPT
    )
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

/// The timeline of allocated and reserved bytes as inline SVG, with step marks and OOMs.
fn timeline_svg(t: &Timeline) -> String {
    let mut out = String::new();
    if t.points.is_empty() {
        out.push_str("<p class=\"muted\">No allocation events to draw.</p>\n");
        return out;
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

    let _ = writeln!(
        out,
        "<svg viewBox=\"0 0 {WIDTH} {HEIGHT}\" width=\"100%\" role=\"img\" aria-label=\"allocated and reserved bytes over the trace\">"
    );
    // Grid and y labels.
    for i in 0..=ticks {
        let bytes = i.saturating_mul(step);
        let yy = y(bytes);
        let _ = writeln!(
            out,
            "<line x1=\"{LEFT}\" x2=\"{:.1}\" y1=\"{yy:.1}\" y2=\"{yy:.1}\" stroke=\"#e6e6e6\"/><text x=\"{:.1}\" y=\"{:.1}\" font-size=\"11\" text-anchor=\"end\" fill=\"#555\">{}</text>",
            WIDTH - RIGHT,
            LEFT - 6.0,
            yy + 4.0,
            escape(&format_bytes(bytes))
        );
    }
    // Step marks, labelled sparsely when there are many.
    let every = t.steps.len().div_ceil(30).max(1);
    for (i, tick) in t.steps.iter().enumerate() {
        let xx = x(tick.event);
        let _ = write!(
            out,
            "<line x1=\"{xx:.1}\" x2=\"{xx:.1}\" y1=\"{TOP}\" y2=\"{:.1}\" stroke=\"#9e9e9e\" stroke-dasharray=\"3,3\"><title>step {} {}</title></line>",
            TOP + plot_h,
            tick.step,
            escape(&tick.label)
        );
        if i % every == 0 {
            let _ = write!(
                out,
                "<text x=\"{:.1}\" y=\"{:.1}\" font-size=\"10\" fill=\"#777\">{}</text>",
                xx + 2.0,
                TOP + 10.0,
                tick.step
            );
        }
        out.push('\n');
    }
    if let Some(c) = capacity {
        let yy = y(c);
        let _ = writeln!(
            out,
            "<line x1=\"{LEFT}\" x2=\"{:.1}\" y1=\"{yy:.1}\" y2=\"{yy:.1}\" stroke=\"#c62828\" stroke-dasharray=\"6,3\"/><text x=\"{:.1}\" y=\"{:.1}\" font-size=\"11\" text-anchor=\"end\" fill=\"#c62828\">capacity</text>",
            WIDTH - RIGHT,
            WIDTH - RIGHT - 4.0,
            yy - 4.0
        );
    }
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
    if t.reserved_known {
        let _ = writeln!(
            out,
            "<path d=\"{}\" fill=\"none\" stroke=\"#ef8a17\" stroke-width=\"1.5\"/>",
            path(&|p| p.reserved, t.start.1)
        );
    }
    let _ = writeln!(
        out,
        "<path d=\"{}\" fill=\"none\" stroke=\"#1e6fb8\" stroke-width=\"1.5\"/>",
        path(&|p| p.allocated, t.start.0)
    );
    for &oom in &t.ooms {
        let xx = x(oom);
        let _ = writeln!(
            out,
            "<line x1=\"{xx:.1}\" x2=\"{xx:.1}\" y1=\"{TOP}\" y2=\"{:.1}\" stroke=\"#c62828\" stroke-width=\"2\"><title>OOM</title></line><text x=\"{:.1}\" y=\"{:.1}\" font-size=\"11\" fill=\"#c62828\">OOM</text>",
            TOP + plot_h,
            xx + 3.0,
            TOP + 24.0
        );
    }
    // Axes.
    let _ = writeln!(
        out,
        "<line x1=\"{LEFT}\" x2=\"{LEFT}\" y1=\"{TOP}\" y2=\"{:.1}\" stroke=\"#888\"/><line x1=\"{LEFT}\" x2=\"{:.1}\" y1=\"{:.1}\" y2=\"{:.1}\" stroke=\"#888\"/>",
        TOP + plot_h,
        WIDTH - RIGHT,
        TOP + plot_h,
        TOP + plot_h
    );
    let _ = writeln!(
        out,
        "<text x=\"{LEFT}\" y=\"{:.1}\" font-size=\"11\" fill=\"#555\">event 0</text><text x=\"{:.1}\" y=\"{:.1}\" font-size=\"11\" text-anchor=\"end\" fill=\"#555\">event {}</text>",
        TOP + plot_h + 16.0,
        WIDTH - RIGHT,
        TOP + plot_h + 16.0,
        t.events.saturating_sub(1)
    );
    out.push_str("</svg>\n");
    let _ = writeln!(
        out,
        "<div class=\"legend muted\"><span style=\"color:#1e6fb8\">&#9632; allocated</span>{}<span style=\"color:#9e9e9e\">&#9482; step start</span>{}</div>",
        if t.reserved_known {
            "<span style=\"color:#ef8a17\">&#9632; reserved</span>"
        } else {
            ""
        },
        if t.ooms.is_empty() {
            ""
        } else {
            "<span style=\"color:#c62828\">&#9474; OOM</span>"
        }
    );
    out
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
}
