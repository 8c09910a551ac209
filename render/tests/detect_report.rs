//! Tests of what users read: the report formats (text, markdown, JSON schema, HTML), the
//! `--fail-on` decision, the diff of two snapshots, and the assertions for users' tests.

use vramscope_analysis::checks::{
    assert_no_leaks, assert_peak_below, check_no_leaks, check_nothing_kept_since, check_peak_below,
    check_syncs_per_step,
};
use vramscope_analysis::detect::Severity;
use vramscope_analysis::diff::{self, diff};
use vramscope_analysis::report::{build_report, Report, ReportOptions};
use vramscope_model::{Id, Snapshot, TransferDirection};
use vramscope_render::{render, verdict, Format};
use vramscope_testkit::{clean_loop, Trace, MIB};

fn leaky(steps: u64) -> Snapshot {
    let mut t = clean_loop(0);
    let leak = t.site("train.py", 33, "train");
    let item = t.site("train.py", 44, "log");
    for _ in 0..steps {
        t.step();
        t.alloc(leak, 512);
        for _ in 0..20 {
            t.transfer(item, TransferDirection::DeviceToHost, 4);
        }
    }
    t.finish()
}

fn report_of(snapshot: &Snapshot) -> Report {
    let mut options = ReportOptions::default();
    options.input = Some("run.json".to_string());
    build_report(snapshot, &options)
}

#[test]
fn json_report_has_the_stable_schema() {
    let report = report_of(&leaky(10));
    let text = render(&report, Format::Json, false);
    let file: serde_json::Value = serde_json::from_str(&text).expect("valid JSON");
    for key in [
        "format_version",
        "source",
        "input",
        "verdict",
        "worst_device",
        "devices",
    ] {
        assert!(file.get(key).is_some(), "missing top-level key {key}");
    }
    assert_eq!(file["format_version"], 3);
    assert_eq!(file["source"], "vramscope");
    assert_eq!(file["input"], "run.json");
    assert_eq!(file["verdict"], verdict(&report));
    // One device's file has one entry, with the keys of every device's.
    assert_eq!(file["devices"].as_array().map(Vec::len), Some(1));
    let json = &file["devices"][0];
    for key in [
        "verdict",
        "device",
        "steps",
        "step_source",
        "stats",
        "findings",
        "top_sites",
    ] {
        assert!(json.get(key).is_some(), "missing device key {key}");
    }
    for key in ["name", "index", "backend", "capacity_bytes"] {
        assert!(json["device"].get(key).is_some(), "missing device.{key}");
    }
    assert_eq!(file["worst_device"], json["device"]["index"]);
    assert_eq!(json["steps"], 10);
    for key in [
        "peak_allocated_bytes",
        "allocations",
        "events",
        "live_blocks",
    ] {
        assert!(json["stats"].get(key).is_some(), "missing stats key {key}");
    }
    let findings = json["findings"].as_array().expect("findings array");
    assert!(!findings.is_empty());
    for f in findings {
        for key in [
            "kind", "severity", "site", "function", "bytes", "count", "per_step", "evidence", "fix",
        ] {
            assert!(f.get(key).is_some(), "finding lacks {key}: {f}");
        }
        assert!(f["evidence"].is_object());
    }
    let leak = findings
        .iter()
        .find(|f| f["kind"] == "retained_per_step")
        .expect("leak");
    assert_eq!(leak["site"], "train.py:33");
    assert_eq!(leak["severity"], "warning");
    assert_eq!(leak["per_step"]["count"], 1.0);
    assert_eq!(leak["evidence"]["retained_bytes_per_step"], 512.0);
    // Evidence keeps the detector's order.
    let first_key = text
        .split("\"evidence\": {")
        .nth(1)
        .and_then(|rest| rest.split('"').nth(1));
    assert_eq!(first_key, Some("retained_bytes_per_step"));
    let top = json["top_sites"].as_array().expect("top_sites array");
    assert_eq!(top[0]["site"], "model.py:10");
    for key in ["function", "live_bytes", "live_blocks", "peak_bytes"] {
        assert!(top[0].get(key).is_some(), "top site lacks {key}");
    }
}

#[test]
fn reports_are_deterministic() {
    let snapshot = leaky(10);
    for format in [Format::Text, Format::Markdown, Format::Json, Format::Html] {
        assert_eq!(
            render(&report_of(&snapshot), format, true),
            render(&report_of(&snapshot), format, true)
        );
    }
}

#[test]
fn text_report_names_findings_sites_and_fixes() {
    let report = report_of(&leaky(10));
    let plain = render(&report, Format::Text, false);
    assert!(
        plain.contains("retained_per_step at train.py:33 (train)"),
        "{plain}"
    );
    assert!(
        plain.contains("sync_in_loop at train.py:44 (log)"),
        "{plain}"
    );
    assert!(plain.contains("fix: "));
    assert!(plain.contains("Top sites"));
    assert!(!plain.contains('\x1b'));
    let coloured = render(&report, Format::Text, true);
    assert!(coloured.contains("\x1b[1;33m"));
}

#[test]
fn markdown_report_has_tables_and_escapes_pipes() {
    let mut t = clean_loop(0);
    let leak = t.site("we|ird_name.py", 3, "f");
    for _ in 0..5 {
        t.step();
        t.alloc(leak, 512);
    }
    let md = render(&report_of(&t.finish()), Format::Markdown, false);
    assert!(md.starts_with("# vramscope report"));
    assert!(md.contains("| severity | kind | site | summary | fix |"));
    assert!(md.contains("we\\|ird\\_name.py:3"), "{md}");
}

#[test]
fn html_report_is_self_contained_and_escaped() {
    let mut t = clean_loop(0);
    let evil = t.site("<script>alert(1)</script>.py", 1, "a&b");
    for _ in 0..5 {
        t.step();
        t.alloc(evil, 512);
    }
    let act = t.site("model.py", 55, "forward");
    t.oom(act, 1 << 40, 0);
    let report = report_of(&t.finish());
    let html = render(&report, Format::Html, false);
    assert!(html.starts_with("<!DOCTYPE html>"));
    assert!(
        html.contains("<canvas id=\"chart\""),
        "the explorer's chart"
    );
    // The explorer's data marks the five steps and the OOM.
    let explorer = report.timeline.explorer.as_ref().expect("explorer data");
    assert_eq!(explorer.steps.len(), 5);
    assert_eq!(explorer.ooms.len(), 1);
    assert!(html.contains("OOM"));
    assert!(!html.contains("http://"));
    assert!(!html.contains("https://"));
    // The page's own scripts (its data, the findings, its code) and no markup from the file.
    assert_eq!(
        html.matches("<script").count(),
        3,
        "only the page's own scripts"
    );
    assert!(!html.contains("<script>alert"));
    assert!(html.contains("&lt;script&gt;alert(1)&lt;/script&gt;.py:1"));
    assert!(html.contains("a&amp;b"));
}

#[test]
fn fail_on_compares_severities() {
    let clean = report_of(&clean_loop(10).finish());
    assert!(clean.fails_on(Severity::Info));
    assert!(!clean.fails_on(Severity::Warning));
    assert!(!clean.fails_on(Severity::Error));
    let leaky = report_of(&leaky(10));
    assert!(leaky.fails_on(Severity::Warning));
    assert!(!leaky.fails_on(Severity::Error));
    assert_eq!("warning".parse::<Severity>(), Ok(Severity::Warning));
    assert!("fatal".parse::<Severity>().is_err());
    assert_eq!("md".parse::<Format>(), Ok(Format::Markdown));
}

#[test]
fn diff_shows_what_grew_and_shrank() {
    let before = leaky(5);
    let mut after = leaky(10);
    // Different site ids for the same file:line must still match.
    after.sites.reverse();
    let n = after.sites.len() as u32;
    for e in &mut after.events {
        e.site = Id::pack(e.site().map(|s| n - 1 - s));
    }
    let d = diff(&before, &after);
    assert_eq!(d.grew.len(), 1, "{}", diff::render_text(&d));
    assert_eq!(d.grew[0].site.as_deref(), Some("train.py:33"));
    assert_eq!(d.grew[0].delta_blocks, 5);
    assert_eq!(d.grew[0].delta_bytes, 5 * 512);
    assert!(d.shrank.is_empty());
    assert_eq!(d.unchanged, 1);
    let reverse = diff(&after, &before);
    assert_eq!(reverse.shrank[0].delta_bytes, -5 * 512);
    let text = diff::render_text(&d);
    assert!(text.contains("+2.50 KiB"), "{text}");
    let json: serde_json::Value = serde_json::from_str(&diff::render_json(&d)).unwrap();
    assert_eq!(json["grew"][0]["site"], "train.py:33");
    assert_eq!(json["format_version"], 1);
}

#[test]
fn leak_checks_pass_on_clean_loops_and_fail_with_a_report() {
    let clean = clean_loop(10).finish();
    assert!(check_no_leaks(&clean).is_ok());
    assert_no_leaks(&clean);
    let err = check_no_leaks(&leaky(10)).expect_err("leaky loop");
    let text = err.to_string();
    assert!(text.contains("train.py:33"), "{text}");
    assert!(text.contains("fix:"), "{text}");
    let panic = std::panic::catch_unwind(|| assert_no_leaks(&leaky(10)));
    assert!(panic.is_err());
}

#[test]
fn peak_budget_checks() {
    let mut t = Trace::new();
    let big = t.site("model.py", 1, "build");
    let a = t.alloc(big, 100 * MIB);
    t.free(a, 100 * MIB);
    let snapshot = t.finish();
    assert!(check_peak_below(&snapshot, 100 * MIB).is_ok());
    assert_peak_below(&snapshot, 200 * MIB);
    let err = check_peak_below(&snapshot, 64 * MIB).expect_err("over budget");
    assert!(err.report.contains("model.py:1"), "{}", err.report);
    assert!(err.report.contains("36.0 MiB over"), "{}", err.report);
    let panic = std::panic::catch_unwind(|| assert_peak_below(&snapshot, MIB));
    assert!(panic.is_err());
}

/// Memory from before the trace that the dump-time state names no site for is listed among
/// what was held at the peak by the name every table gives it.
#[test]
fn a_peak_budget_names_memory_from_before_the_trace() {
    let mut t = Trace::new();
    let step = t.site("train.py", 7, "step");
    t.add_segment(0x7e00_0000_0000, &[(0, 96 * MIB, true)], 128 * MIB);
    t.alloc(step, 8 * MIB);
    let err = check_peak_below(&t.finish(), 64 * MIB).expect_err("over budget");
    assert!(err.report.contains("(before the trace)"), "{}", err.report);
    assert!(!err.report.contains("(unknown site)"), "{}", err.report);
}

#[test]
fn summary_and_empty_snapshot_render() {
    let empty = Trace::new().finish();
    let report = report_of(&empty);
    assert!(report.findings.is_empty());
    for format in [Format::Text, Format::Markdown, Format::Json, Format::Html] {
        assert!(!render(&report, format, false).is_empty());
    }
    // Six steps: the leak's blocks of steps 1 to 4 outlived a completed step.
    let summary = vramscope_render::render_summary(&report_of(&leaky(6)));
    assert!(
        summary.contains("findings: 0 errors, 2 warnings, "),
        "{summary}"
    );
    let one = vramscope_analysis::report::severity_counts(1, 1, 1);
    assert_eq!(one, "1 error, 1 warning, 1 info");
}

#[test]
fn the_summary_says_when_a_leak_runs_out_of_memory() {
    let report = report_of(&leaky(10));
    let leak = report
        .findings
        .iter()
        .find(|f| f.kind == vramscope_analysis::detect::FindingKind::RetainedPerStep)
        .expect("the planted leak");
    let Some(vramscope_analysis::detect::EvidenceValue::Int(steps)) =
        leak.evidence.get("steps_until_oom")
    else {
        panic!("the leak's evidence has steps_until_oom on a device of known capacity");
    };
    let summary = vramscope_render::render_summary(&report);
    assert!(
        summary.contains(&format!(
            "runs out of device memory in about {}",
            vramscope_model::plural(*steps, "step")
        )),
        "{summary}"
    );
    assert!(summary.contains("train.py:33"), "{summary}");
}

/// A trace that allocates twice at one address without freeing it between lost that free:
/// the report says so, with the count, in text and JSON, and a trace that lost none says
/// nothing of it.
#[test]
fn a_report_names_the_frees_a_trace_lost() {
    let mut t = Trace::new();
    let site = t.site("train.py", 12, "step");
    t.alloc_at(site, 0x1000_0000, MIB);
    t.alloc_at(site, 0x1000_0000, MIB);
    t.alloc_at(site, 0x1000_0000, MIB);
    t.free(0x1000_0000, MIB);
    let report = report_of(&t.finish());
    assert_eq!(report.stats.lost_frees, 2);
    let text = render(&report, Format::Text, false);
    assert!(
        text.contains("2 allocations were made at an address whose block the trace had not freed"),
        "{text}"
    );
    let json: serde_json::Value =
        serde_json::from_str(&render(&report, Format::Json, false)).expect("valid JSON");
    assert_eq!(json["devices"][0]["stats"]["lost_frees"], 2);
    let html = render(&report, Format::Html, false);
    assert!(
        html.contains("<li>2 allocations were made at an address"),
        "the HTML says it too"
    );

    let clean = report_of(&clean_loop(3).finish());
    assert_eq!(clean.stats.lost_frees, 0);
    assert!(!render(&clean, Format::Text, false).contains("had not freed"));
}

/// A trace with more sites than the table has rows: a 768 MiB activation freed before the end
/// (large at the peak only) is listed before small blocks still live, and the table ends
/// with an "N other sites" row, so each column sums to its figure in every format.
#[test]
fn a_cut_top_sites_table_ends_with_the_rest_and_sums_to_the_figures() {
    let mut t = Trace::new();
    let big = t.site("model.py", 201, "forward");
    let small: Vec<_> = (0..14)
        .map(|i| t.site("train.py", 100 + i, "train"))
        .collect();
    t.step();
    for (i, &s) in small.iter().enumerate() {
        t.alloc(s, 512 * (i as u64 + 1));
    }
    let activation = t.alloc(big, 768 * MIB);
    t.free(activation, 768 * MIB);
    let report = report_of(&t.finish());
    assert_eq!(report.top_sites.len(), 10);
    assert_eq!(report.top_sites[0].label, "model.py:201");
    let other = report.other_sites.clone().expect("a remainder row");
    assert_eq!(other.sites, 5);
    let live: u64 = report.top_sites.iter().map(|s| s.live_bytes).sum::<u64>() + other.live_bytes;
    let peak: u64 = report.top_sites.iter().map(|s| s.peak_bytes).sum::<u64>() + other.peak_bytes;
    assert_eq!(live, report.stats.allocated_bytes);
    assert_eq!(peak, report.stats.peak_allocated_bytes);
    let text = render(&report, Format::Text, false);
    assert!(text.contains("5 other sites"), "{text}");
    let markdown = render(&report, Format::Markdown, false);
    assert!(markdown.contains("| 5 other sites |"), "{markdown}");
    let html = render(&report, Format::Html, false);
    assert!(html.contains("5 other sites"));
    let json: serde_json::Value =
        serde_json::from_str(&render(&report, Format::Json, false)).unwrap();
    assert_eq!(json["devices"][0]["other_sites"]["sites"], 5);
    assert_eq!(
        json["devices"][0]["other_sites"]["live_bytes"],
        other.live_bytes
    );
    let summary = vramscope_render::render_summary(&report);
    assert!(summary.contains("10 other sites"), "{summary}");
    // A table that lists every site has no remainder.
    let mut t = Trace::new();
    let s = t.site("train.py", 1, "train");
    t.alloc(s, 512);
    assert_eq!(report_of(&t.finish()).other_sites, None);
}

#[test]
fn a_unit_test_leak_is_what_it_allocated_and_kept_and_nothing_else() {
    let mut t = Trace::new();
    let weights = t.site("conftest.py", 5, "model");
    let kept = t.site("test_cache.py", 12, "test_cache");
    let scratch = t.site("test_cache.py", 14, "test_cache");
    t.alloc(weights, 64 * MIB); // before the test: never its leak
    let since = t.next_seq();
    t.alloc(kept, 10 * MIB);
    t.alloc(kept, 6 * MIB);
    let temp = t.alloc(scratch, 4 * MIB);
    t.free(temp, 4 * MIB);
    let snapshot = t.finish();
    let err = check_nothing_kept_since(&snapshot, since).expect_err("16 MiB kept");
    let text = err.to_string();
    assert!(
        text.contains("16.0 MiB in 2 blocks allocated by the test"),
        "{text}"
    );
    assert!(text.contains("made at test_cache.py:12"), "{text}");
    assert!(
        !text.contains("conftest.py") && !text.contains(":14"),
        "{text}"
    );
    // From after the kept blocks on, the test kept nothing.
    let end = snapshot.events.last().map_or(0, |e| e.seq + 1);
    assert!(check_nothing_kept_since(&snapshot, end).is_ok());
}

#[test]
fn the_sync_check_counts_waits_by_the_detectors_rule_in_every_step() {
    let options = vramscope_analysis::detect::DetectOptions::default();
    let mut t = Trace::new();
    let item = t.site("train.py", 44, "log");
    let copy = t.site("train.py", 50, "save");
    // Setup (step 0) waits too, and a unit test never leaves it.
    for _ in 0..3 {
        t.sync(item);
    }
    // A large copy to the host is a transfer, not a wait.
    t.transfer(copy, TransferDirection::DeviceToHost, 64 * MIB);
    let snapshot = t.finish();
    assert!(check_syncs_per_step(&snapshot, 3, &options).is_ok());
    let err = check_syncs_per_step(&snapshot, 2, &options).expect_err("3 waits over 2");
    let text = err.to_string();
    assert!(
        text.contains("waited for the device 3 times (limit 2), 3 of them at train.py:44"),
        "{text}"
    );
}

/// What the memory is made of (issue 46): the text and markdown reports say it at the peak
/// and at the end in one line each, and the JSON has `memory_by_category` with `peak`,
/// `end` and the series, every category named, each moment adding up to its allocated bytes.
#[test]
fn every_format_says_what_the_memory_is_made_of() {
    let mut t = Trace::new();
    let site = t.site("train.py", 3, "main");
    let weights = t.alloc(site, 4 * MIB);
    let _ = weights;
    let scratch = t.alloc(site, 2 * MIB);
    t.free(scratch, 2 * MIB);
    let mut snap = t.finish();
    snap.tags = vec!["weights".to_string(), "activations".to_string()];
    snap.events.to_mut()[0].tag = Id::new(0);
    snap.events.to_mut()[1].tag = Id::new(1);
    let report = report_of(&snap);
    let text = render(&report, Format::Text, false);
    assert!(
        text.contains("at the peak 6.00 MiB: activations 2.0, parameters 4.0\n"),
        "{text}"
    );
    assert!(
        text.contains("at the end 4.00 MiB: parameters 4.0\n"),
        "{text}"
    );
    let markdown = render(&report, Format::Markdown, false);
    assert!(
        markdown.contains("at the peak 6.00 MiB: activations 2.0, parameters 4.0"),
        "{markdown}"
    );
    let file: serde_json::Value =
        serde_json::from_str(&render(&report, Format::Json, false)).expect("valid JSON");
    let by = &file["devices"][0]["memory_by_category"];
    assert_eq!(by["peak"]["activations"], 2 * MIB);
    assert_eq!(by["peak"]["parameters"], 4 * MIB);
    assert_eq!(by["end"]["activations"], 0);
    assert_eq!(by["end"]["parameters"], 4 * MIB);
    assert_eq!(by["end"].as_object().map(|o| o.len()), Some(8));
    let series = &by["series"];
    assert_eq!(series["event"], serde_json::json!([0, 1, 2]));
    assert_eq!(
        series["parameters"],
        serde_json::json!([4 * MIB, 4 * MIB, 4 * MIB])
    );
    assert_eq!(series["activations"], serde_json::json!([0, 2 * MIB, 0]));
    assert_eq!(series["unknown"], serde_json::json!([0, 0, 0]));
}

/// A trace that says nothing of what any of its memory is (no tags, no stacks) gets no line
/// of categories in text or markdown, where "unknown 6.0" would tell a reader nothing; the
/// JSON keeps the figures.
#[test]
fn memory_that_is_all_unknown_gets_no_line() {
    let mut t = Trace::new();
    let site = t.site("train.py", 3, "main");
    let _kept = t.alloc(site, 4 * MIB);
    let _also = t.alloc(site, 2 * MIB);
    let report = report_of(&t.finish());
    let peak = &report.memory_by_category.peak;
    assert_eq!(peak.get(vramscope_model::Category::Unknown), 6 * MIB);
    assert_eq!(peak.total(), 6 * MIB);
    for format in [Format::Text, Format::Markdown] {
        let out = render(&report, format, false);
        assert!(!out.contains("at the peak 6.00 MiB:"), "{out}");
        assert!(!out.contains("unknown"), "{out}");
    }
    let file: serde_json::Value =
        serde_json::from_str(&render(&report, Format::Json, false)).expect("valid JSON");
    assert_eq!(
        file["devices"][0]["memory_by_category"]["peak"]["unknown"],
        6 * MIB
    );
}
