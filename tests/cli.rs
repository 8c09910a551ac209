//! End-to-end tests of the `vramscope` binary: the headless demo, `report` in every format,
//! `--fail-on`, `summary`, `diff`, and clear errors with status 2 for unusable input.

use std::path::PathBuf;
use std::process::{Command, Output};

fn vramscope(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_vramscope"))
        .args(args)
        .env("NO_COLOR", "1")
        .output()
        .expect("vramscope runs")
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn temp(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("vramscope-cli-{}-{name}", std::process::id()))
}

/// The `file:line` of the first line of the demo's trainer that contains `code`.
fn demo_line(code: &str) -> String {
    let source = include_str!("../kernels/src/train.rs");
    let line = source
        .lines()
        .position(|l| l.contains(code))
        .expect("code in kernels/src/train.rs")
        + 1;
    format!("kernels/src/train.rs:{line}")
}

#[test]
fn headless_demo_reports_the_planted_bugs_at_their_lines() {
    let output = vramscope(&["demo", "--headless", "--steps", "8", "--format", "json"]);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let report: serde_json::Value = serde_json::from_str(&stdout(&output)).unwrap();
    let findings = report["devices"][0]["findings"].as_array().unwrap();
    let sites_of = |kind: &str| -> Vec<String> {
        findings
            .iter()
            .filter(|f| f["kind"] == kind)
            .filter_map(|f| f["site"].as_str())
            .map(str::to_string)
            .collect()
    };
    // The kept loss keeps its graph: the loss is the small tensor made after the hidden
    // activations and the logits in every step, so the demo's two planted bugs are exactly
    // two findings: one at the loss's line, with the graph it keeps, and the sync.
    let problems: Vec<&serde_json::Value> = findings
        .iter()
        .filter(|f| f["severity"] != "info")
        .collect();
    assert_eq!(problems.len(), 2, "{problems:#?}");
    let retained = sites_of("retained_per_step");
    assert_eq!(
        retained,
        vec![demo_line("softmax_cross_entropy(&labels)")],
        "{retained:?}"
    );
    let leak = findings
        .iter()
        .find(|f| f["kind"] == "retained_per_step")
        .unwrap();
    let summary = leak["summary"].as_str().unwrap();
    for line in [
        "let hidden = pre1.relu()?;",
        "let logits = hidden.matmul(w2v)?.add_bias(&b2.value)?;",
    ] {
        assert!(summary.contains(&demo_line(line)), "{summary}");
    }
    assert!(summary.contains("keeps its graph"), "{summary}");
    assert!(!summary.contains("retained in the same steps"), "{summary}");
    // The graph grows by tens of KiB a step: an error.
    assert_eq!(leak["severity"], "error");
    assert!(leak["fix"].as_str().unwrap().contains("item()"), "{leak}");
    assert_eq!(
        sites_of("sync_in_loop"),
        vec![demo_line("shown.push(logits.element(i)?.item()?)")]
    );
    assert_eq!(report["devices"][0]["steps"], 8);
}

#[test]
fn headless_demo_without_bugs_reports_no_warning_or_error() {
    let output = vramscope(&[
        "demo",
        "--headless",
        "--steps",
        "8",
        "--bug",
        "none",
        "--format",
        "json",
    ]);
    assert!(output.status.success());
    let report: serde_json::Value = serde_json::from_str(&stdout(&output)).unwrap();
    let serious = report["devices"][0]["findings"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["severity"] != "info")
        .count();
    assert_eq!(serious, 0, "{report:#}");
}

#[test]
fn unknown_bug_name_is_rejected() {
    let output = vramscope(&["demo", "--headless", "--bug", "typo"]);
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains("unknown bug `typo`"));
}

#[test]
fn report_formats_fail_on_summary_and_diff() {
    let leaky = temp("leaky.json");
    let clean = temp("clean.json");
    // Build two snapshots with the library: one leaking, one not.
    {
        use vramscope::{AllocatorConfig, CachingAllocator, SimDevice};
        let alloc = CachingAllocator::new(SimDevice::phantom(1 << 34), AllocatorConfig::default());
        alloc.snapshot().save(&clean).unwrap();
        let mut kept = Vec::new();
        for _ in 0..6 {
            alloc.mark_step();
            kept.push(alloc.alloc(8 << 20).unwrap());
        }
        alloc.snapshot().save(&leaky).unwrap();
    }
    let leaky_s = leaky.to_str().unwrap();
    let clean_s = clean.to_str().unwrap();

    let text = vramscope(&["report", leaky_s]);
    assert!(text.status.success());
    assert!(
        stdout(&text).contains("retained_per_step"),
        "{}",
        stdout(&text)
    );
    assert!(
        stdout(&text).contains("tests/cli.rs:"),
        "the site is this file"
    );

    let json = vramscope(&["report", leaky_s, "--format", "json"]);
    let file: serde_json::Value = serde_json::from_str(&stdout(&json)).unwrap();
    for key in ["format_version", "source", "input", "verdict", "devices"] {
        assert!(file.get(key).is_some(), "report JSON has `{key}`");
    }
    let value = &file["devices"][0];
    for key in [
        "verdict",
        "device",
        "steps",
        "stats",
        "findings",
        "top_sites",
    ] {
        assert!(value.get(key).is_some(), "a device's entry has `{key}`");
    }
    let finding = &value["findings"][0];
    for key in [
        "kind", "severity", "site", "function", "bytes", "count", "per_step", "evidence", "fix",
    ] {
        assert!(finding.get(key).is_some(), "finding JSON has `{key}`");
    }

    let markdown = vramscope(&["report", leaky_s, "--format", "markdown"]);
    assert!(stdout(&markdown).contains("retained_per_step"));

    let html_path = temp("report.html");
    let html = vramscope(&[
        "report",
        leaky_s,
        "--format",
        "html",
        "-o",
        html_path.to_str().unwrap(),
    ]);
    assert!(html.status.success());
    let page = std::fs::read_to_string(&html_path).unwrap();
    assert!(
        page.contains("<canvas id=\"chart\""),
        "the explorer's chart"
    );
    assert!(
        !page.contains("http://") && !page.contains("https://"),
        "nothing fetched"
    );

    assert_eq!(
        vramscope(&["report", leaky_s, "--fail-on", "error"])
            .status
            .code(),
        Some(1)
    );
    assert_eq!(
        vramscope(&["report", clean_s, "--fail-on", "warning"])
            .status
            .code(),
        Some(0)
    );

    let summary = vramscope(&["summary", leaky_s]);
    assert!(
        stdout(&summary).contains("Allocated memory"),
        "{}",
        stdout(&summary)
    );

    let diff = vramscope(&["diff", clean_s, leaky_s]);
    assert!(diff.status.success());
    assert!(stdout(&diff).contains("tests/cli.rs:"), "{}", stdout(&diff));

    for path in [leaky, clean, html_path] {
        std::fs::remove_file(path).ok();
    }
}

#[test]
fn unusable_input_is_status_2_with_the_file_named() {
    let missing = vramscope(&["report", "/nonexistent/snapshot.pickle"]);
    assert_eq!(missing.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&missing.stderr).contains("/nonexistent/snapshot.pickle"));

    let garbage = temp("garbage.bin");
    std::fs::write(&garbage, [0x80u8, 0x04, 0x95, 0xff, 0x00]).unwrap();
    let output = vramscope(&["report", garbage.to_str().unwrap()]);
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("garbage.bin"), "{stderr}");
    std::fs::remove_file(garbage).ok();
}

#[test]
fn replay_prints_the_figures_external_checks_read() {
    let trace = temp("replay.json");
    {
        use vramscope::{AllocatorConfig, CachingAllocator, SimDevice};
        let alloc = CachingAllocator::new(SimDevice::phantom(1 << 34), AllocatorConfig::default());
        let _weights = alloc.alloc(64 << 20).unwrap();
        for _ in 0..4 {
            alloc.mark_step();
            drop(alloc.alloc(40 << 20).unwrap());
        }
        alloc.snapshot().save(&trace).unwrap();
    }
    let path = trace.to_str().unwrap();
    let output = vramscope(&["replay", path, "--capacity", "80MiB", "--format", "json"]);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let value: serde_json::Value = serde_json::from_str(&stdout(&output)).unwrap();
    for key in [
        "events",
        "peak_allocated",
        "peak_reserved",
        "segment_allocs",
        "segment_frees",
        "num_alloc_retries",
        "num_ooms",
    ] {
        assert!(value[key].is_u64(), "`{key}` is an integer: {value:#}");
        assert!(value["original"].get(key).is_none() || value["original"][key].is_u64());
    }
    assert!(
        value["num_ooms"].as_u64().unwrap() > 0,
        "104 MiB does not fit in 80 MiB"
    );
    assert_eq!(value["original"]["segment_allocs"], 2);

    // Our own trace, replayed with its settings, makes the same device calls.
    let verified = vramscope(&["replay", path, "--verify"]);
    assert!(
        stdout(&verified).contains("2 of 2 alike, in order"),
        "{}",
        stdout(&verified)
    );
    assert_eq!(verified.status.code(), Some(0));
    // Under other settings the calls differ: the first difference is named, and the exit
    // status says so, for scripts.
    let differs = vramscope(&[
        "replay",
        path,
        "--verify",
        "--conf",
        "expandable_segments:True",
    ]);
    assert_eq!(differs.status.code(), Some(1), "{}", stdout(&differs));
    assert!(
        stdout(&differs).contains("the first 0 of the trace's 2 made alike"),
        "{}",
        stdout(&differs)
    );
    // The defaults fit 200 MiB and no setting saves much: nothing to change to.
    let sweep = vramscope(&["replay", path, "--capacity", "200MiB", "--sweep"]);
    assert!(
        stdout(&sweep).contains("the defaults fit at a peak of"),
        "{}",
        stdout(&sweep)
    );
    let bad = vramscope(&["replay", path, "--conf", "max_split_size_mb:1"]);
    assert_eq!(bad.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("max_split_size_mb"));
    std::fs::remove_file(trace).ok();
}

/// A recording of PyTorch's own allocator on an H200 (`testkit/data/torch_h200`).
fn torch_h200(case: &str) -> String {
    format!(
        "{}/testkit/data/torch_h200/{case}.pickle.gz",
        env!("CARGO_MANIFEST_DIR")
    )
}

/// A run on a 250 MiB device that ran out of memory (its OOM entry carries the device's free
/// bytes), and one on a 200 MiB device that freed its cache to retry three times, each
/// written as a PyTorch pickle.
fn pressured_traces() -> [(PathBuf, &'static str); 2] {
    use vramscope::{AllocatorConfig, CachingAllocator, SimDevice};
    const MIB: u64 = 1 << 20;
    let written = |name: &str, snapshot: vramscope::Snapshot| {
        let json = temp(&format!("{name}.json"));
        snapshot.save(&json).unwrap();
        let pickle = temp(&format!("{name}.pickle"));
        let converted = vramscope(&[
            "convert",
            json.to_str().unwrap(),
            "--to",
            "pytorch",
            "-o",
            pickle.to_str().unwrap(),
        ]);
        assert!(converted.status.success(), "{converted:?}");
        std::fs::remove_file(json).ok();
        pickle
    };
    let alloc = CachingAllocator::new(SimDevice::phantom(250 * MIB), AllocatorConfig::default());
    let weights = alloc.alloc(64 * MIB).unwrap();
    drop(alloc.alloc(20 * MIB).unwrap());
    let mut held = Vec::new();
    while let Ok(block) = alloc.alloc(40 * MIB) {
        held.push(block);
    }
    drop(held);
    drop(alloc.alloc(30 * MIB).unwrap());
    drop(weights);
    let oom = written("oom", alloc.snapshot());
    let alloc = CachingAllocator::new(SimDevice::phantom(200 * MIB), AllocatorConfig::default());
    for size in [100, 150, 160, 170, 120, 180] {
        drop(alloc.alloc(size * MIB).unwrap());
    }
    assert!(alloc.stats().num_alloc_retries >= 3);
    let retried = written("retried", alloc.snapshot());
    [(oom, "oom"), (retried, "retried")]
}

#[test]
fn replay_verify_matches_a_pressured_trace_on_the_capacity_it_implies() {
    for (trace, case) in pressured_traces() {
        let path = trace.to_str().unwrap();
        let output = vramscope(&["replay", path, "--verify"]);
        let text = stdout(&output);
        assert_eq!(output.status.code(), Some(0), "{case}: {text}");
        assert!(text.contains("alike, in order"), "{case}: {text}");
        match case {
            "oom" => {
                let seq = text
                    .split("from the OOM at event ")
                    .nth(1)
                    .unwrap_or_else(|| panic!("{text}"));
                assert!(
                    text.contains("capacity 250 MiB, from the OOM at event"),
                    "{text}"
                );
                assert!(seq.starts_with(char::is_numeric), "{text}");
                assert!(text.contains("first OOM: event"), "{text}");
            }
            _ => {
                assert!(
                    text.contains("free-and-retry bursts (the first at event"),
                    "{text}"
                );
                assert!(text.contains("capacity between"), "{text}");
            }
        }
        // The JSON says where the capacity came from, and a capacity given wins.
        let json = vramscope(&["replay", path, "--verify", "--format", "json"]);
        let value: serde_json::Value = serde_json::from_str(&stdout(&json)).unwrap();
        let inferred = &value["inferred_capacity"];
        assert_eq!(value["capacity"], inferred["bytes"], "{value:#}");
        assert_eq!(inferred["exact"], case == "oom", "{value:#}");
        let given = vramscope(&["replay", path, "--capacity", "1TiB", "--format", "json"]);
        let value: serde_json::Value = serde_json::from_str(&stdout(&given)).unwrap();
        assert!(value.get("inferred_capacity").is_none(), "{value:#}");
        assert_eq!(value["capacity"], 1u64 << 40);
        let unlimited = vramscope(&["replay", path, "--verify", "--capacity", "1TiB"]);
        assert_eq!(
            unlimited.status.code(),
            Some(1),
            "{case}: {}",
            stdout(&unlimited)
        );
        std::fs::remove_file(trace).ok();
    }
}

#[test]
fn replay_uses_the_settings_the_trace_recorded_unless_conf_is_given() {
    let path = torch_h200("expandable");
    let text = stdout(&vramscope(&["replay", &path]));
    assert!(
        text.contains("settings (from the trace: expandable_segments:True) on"),
        "{text}"
    );
    // PyTorch's own max_memory_reserved for this run (expected.json).
    let json = vramscope(&["replay", &path, "--format", "json"]);
    let value: serde_json::Value = serde_json::from_str(&stdout(&json)).unwrap();
    assert_eq!(value["peak_reserved"], 1677721600u64);
    assert_eq!(value["peak_reserved"], value["original"]["peak_reserved"]);
    assert_eq!(value["trace_settings"], "expandable_segments:True");
    // --policy replaces the trace's policy and keeps the rest of its settings.
    let text = stdout(&vramscope(&["replay", &path, "--policy", "compact"]));
    assert!(
        text.contains("settings (from the trace: expandable_segments:True) with policy:compact on"),
        "{text}"
    );
    // --conf overrides, "" being PyTorch's defaults.
    let json = vramscope(&["replay", &path, "--conf", "", "--format", "json"]);
    let value: serde_json::Value = serde_json::from_str(&stdout(&json)).unwrap();
    assert!(value["peak_reserved"].as_u64().unwrap() > 1677721600);
    assert!(value.get("trace_settings").is_none());
    // The sweep marks the trace's settings among those it tries.
    let sweep = stdout(&vramscope(&["replay", &path, "--sweep"]));
    assert!(
        sweep.contains("expandable_segments:True (the trace's)"),
        "{sweep}"
    );
}

#[test]
fn replay_marks_an_estimated_trace_peak() {
    // Replayed at import without its cap, this run's blocks are requests rounded.
    let path = torch_h200("default_capped");
    let text = stdout(&vramscope(&["replay", &path, "--capacity", "1897352533"]));
    let line = text
        .lines()
        .find(|l| l.contains("peak allocated"))
        .unwrap_or_else(|| panic!("{text}"));
    assert!(line.ends_with("~1.51 GiB"), "{line}");
    assert!(text.contains("~ estimated:"), "{text}");
    let json = vramscope(&["replay", &path, "--format", "json"]);
    let value: serde_json::Value = serde_json::from_str(&stdout(&json)).unwrap();
    assert_eq!(value["original"]["peak_allocated_estimated"], true);
    assert!(value.get("peak_allocated_estimated").is_none());
}

#[test]
fn replay_verify_of_a_trace_without_device_calls_exits_0() {
    let trace = temp("replay-no-calls.json");
    {
        use vramscope::{AllocatorConfig, CachingAllocator, SimDevice};
        let alloc = CachingAllocator::new(SimDevice::phantom(1 << 34), AllocatorConfig::default());
        for _ in 0..3 {
            drop(alloc.alloc(40 << 20).unwrap());
        }
        // Blocks only: no segments, segment events or totals, like a profiler trace without them.
        let mut snapshot = alloc.snapshot();
        snapshot
            .events
            .retain(|e| !vramscope::engine::is_segment_event(e));
        snapshot.segments.clear();
        snapshot.stats = Default::default();
        snapshot.save(&trace).unwrap();
    }
    let output = vramscope(&["replay", trace.to_str().unwrap(), "--verify"]);
    assert!(
        stdout(&output).contains("the trace records none to compare with"),
        "{}",
        stdout(&output)
    );
    assert_eq!(output.status.code(), Some(0));
    std::fs::remove_file(trace).ok();
}

#[test]
fn replay_help_names_every_policy() {
    let help = stdout(&vramscope(&["replay", "--help"]));
    let line = help
        .lines()
        .find(|l| l.contains("--policy"))
        .unwrap_or_else(|| panic!("{help}"));
    assert!(
        line.contains("pytorch") && line.contains("compact"),
        "{help}"
    );
}

#[test]
fn replay_of_a_late_profiler_trace_holds_what_it_started_with() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let Some(trace) =
        vramscope_testkit::shared_trace(root, "hta_ddp_rank1_v100_profile_memory.trace.json.gz")
    else {
        return;
    };
    let path = trace.to_str().unwrap();
    // The trace peaks at 6.17 GiB allocated, 3.82 GiB of it held before the trace.
    let text = stdout(&vramscope(&["replay", path, "--capacity", "4GiB"]));
    assert!(
        text.contains(
            "3.82 GiB held before the trace (recorded as a total, no blocks named), restored as"
        ),
        "{text}"
    );
    assert!(text.contains("first OOM:"), "{text}");
    assert!(!text.contains("no OOM at this capacity"), "{text}");
    let sweep = stdout(&vramscope(&[
        "replay",
        path,
        "--capacity",
        "4GiB",
        "--sweep",
    ]));
    assert!(sweep.contains("no PyTorch setting tried fits"), "{sweep}");
    let json = vramscope(&["replay", path, "--format", "json"]);
    let value: serde_json::Value = serde_json::from_str(&stdout(&json)).unwrap();
    let (ours, theirs) = (
        value["peak_allocated"].as_u64().unwrap(),
        value["original"]["peak_allocated"].as_u64().unwrap(),
    );
    // The replay rounds the trace's requests to blocks: a little above, never below.
    assert!(
        ours >= theirs && ours - theirs < theirs / 100,
        "{ours} vs {theirs}"
    );
}

#[test]
fn replay_says_which_frees_it_skipped_and_why() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let Some(trace) = vramscope_testkit::shared_trace(root, "decomfl_opt125m_zo_fedlearn.pickle")
    else {
        return;
    };
    // The trace starts from an empty device: what is skipped at 1 GiB are frees of
    // allocations that ran out of memory in the replay.
    let text = stdout(&vramscope(&[
        "replay",
        trace.to_str().unwrap(),
        "--capacity",
        "1GiB",
    ]));
    assert!(
        text.contains("996 frees of allocations that failed in the replay were skipped"),
        "{text}"
    );
    assert!(!text.contains("before the trace"), "{text}");
}

#[test]
fn convert_writes_pytorch_perfetto_and_json() {
    let source = temp("convert-src.json");
    {
        use vramscope::{AllocatorConfig, CachingAllocator, SimDevice};
        let alloc = CachingAllocator::new(SimDevice::phantom(1 << 34), AllocatorConfig::default());
        let _a = alloc.alloc(3 << 20).unwrap();
        alloc.mark_step();
        drop(alloc.alloc(512).unwrap());
        alloc.snapshot().save(&source).unwrap();
    }
    let src = source.to_str().unwrap();
    for (target, name) in [
        ("pytorch", "out.pickle"),
        ("perfetto", "out.trace.json"),
        ("json", "out.json"),
    ] {
        let out = temp(name);
        let output = vramscope(&["convert", src, "--to", target, "-o", out.to_str().unwrap()]);
        assert!(
            output.status.success(),
            "{target}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        // Every converted file reads back (Perfetto's is a Chrome trace with no memory events
        // of torch.profiler's kind, so it is checked as JSON instead).
        if target == "perfetto" {
            let value: serde_json::Value =
                serde_json::from_slice(&std::fs::read(&out).unwrap()).unwrap();
            assert!(value["traceEvents"]
                .as_array()
                .is_some_and(|e| !e.is_empty()));
        } else {
            let summary = vramscope(&["summary", out.to_str().unwrap()]);
            assert!(summary.status.success(), "{target} reads back");
        }
        std::fs::remove_file(out).ok();
    }
    let bad = vramscope(&["convert", src, "--to", "excel", "-o", "/tmp/x"]);
    assert_eq!(bad.status.code(), Some(2));
    std::fs::remove_file(source).ok();
}

/// `convert --to pytorch` of a PyTorch pickle parses it once (issue 47), keeping what the
/// model does not while it imports, and writes the very bytes the export writes from the
/// file's whole document read again (`to_pytorch_pickle_from_file`): on PyTorch's own
/// recordings (gzip, several streams, OOMs) and on the shared traces.
#[test]
fn convert_to_pytorch_writes_the_bytes_of_the_sources_document() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut sources: Vec<PathBuf> = ["default", "streams", "expandable_capped", "gc80_capped"]
        .iter()
        .map(|case| PathBuf::from(torch_h200(case)))
        .collect();
    for name in [
        "decomfl_opt125m_zo_fedlearn.pickle",
        "cs336_medium_ctx512_train_step.pickle",
    ] {
        sources.extend(vramscope_testkit::shared_trace(root, name));
    }
    for source in sources {
        let out = temp("convert-once.pickle");
        let output = vramscope(&[
            "convert",
            source.to_str().unwrap(),
            "--to",
            "pytorch",
            "-o",
            out.to_str().unwrap(),
        ]);
        assert!(output.status.success(), "{}", source.display());
        let snapshot = vramscope::import::load(&source).unwrap();
        let expected = vramscope::export::to_pytorch_pickle_from_file(&snapshot, &source).unwrap();
        assert!(
            std::fs::read(&out).unwrap() == expected.bytes,
            "{}: not the bytes of the source's document",
            source.display()
        );
        std::fs::remove_file(out).ok();
    }
}

/// A profiler trace that starts late: 8 MiB allocated before it, known only from its totals,
/// 20 MiB reserved, two steps labelled from 4.
const LATE_CHROME_TRACE: &str = r#"{"deviceProperties": [{"id": 0, "name": "Test GPU", "totalGlobalMem": 34359738368}],
  "traceEvents": [
    {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#4", "ts": 100, "dur": 90},
    {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#5", "ts": 200, "dur": 90},
    {"ph": "i", "name": "[memory]", "ts": 110, "args": {"Device Type": 1, "Device Id": 0,
      "Addr": 268435456, "Bytes": 4194304, "Total Allocated": 12582912, "Total Reserved": 20971520}},
    {"ph": "i", "name": "[memory]", "ts": 210, "args": {"Device Type": 1, "Device Id": 0,
      "Addr": 268435456, "Bytes": -4194304, "Total Allocated": 8388608, "Total Reserved": 20971520}}
  ]}"#;

/// `convert` carries the engine's figures into both formats: the PyTorch pickle of a profiler
/// trace reports the same peaks, end state and step labels, with a line on standard error for
/// each thing the format cannot carry; the Perfetto counters peak at the report's peaks.
#[test]
fn convert_carries_a_late_traces_figures_and_says_what_it_cannot() {
    let source = temp("late.trace.json");
    std::fs::write(&source, LATE_CHROME_TRACE).unwrap();
    let src = source.to_str().unwrap();
    let figures = |file: &str| {
        let output = vramscope(&["report", file, "--format", "json"]);
        assert!(
            output.status.success(),
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
        let json: serde_json::Value = serde_json::from_str(&stdout(&output)).unwrap();
        let s = &json["devices"][0]["stats"];
        [
            "baseline_allocated_bytes",
            "peak_allocated_bytes",
            "peak_reserved_bytes",
            "allocated_bytes",
            "reserved_bytes",
        ]
        .map(|key| {
            s[key]
                .as_u64()
                .unwrap_or_else(|| panic!("{key}: {}", s[key]))
        })
    };
    let before = figures(src);
    assert_eq!(before, [8 << 20, 12 << 20, 20 << 20, 8 << 20, 20 << 20]);

    let pickle = temp("late.pickle");
    let output = vramscope(&[
        "convert",
        src,
        "--to",
        "pytorch",
        "-o",
        pickle.to_str().unwrap(),
    ]);
    assert!(output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    let lost: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with("not carried into the PyTorch format: "))
        .collect();
    for needle in [
        "1 free recorded only as completed",
        "known only as totals",
        "Test GPU",
    ] {
        assert!(
            lost.iter().any(|l| l.contains(needle)),
            "no line about {needle:?} in\n{stderr}"
        );
    }
    assert_eq!(figures(pickle.to_str().unwrap()), before);
    let report = vramscope(&["report", pickle.to_str().unwrap()]);
    assert!(
        stdout(&report).contains("`ProfilerStep#4`"),
        "{}",
        stdout(&report)
    );

    let trace = temp("late.perfetto.json");
    let output = vramscope(&[
        "convert",
        src,
        "--to",
        "perfetto",
        "-o",
        trace.to_str().unwrap(),
    ]);
    assert!(output.status.success());
    let value: serde_json::Value = serde_json::from_slice(&std::fs::read(&trace).unwrap()).unwrap();
    let counters: Vec<&serde_json::Value> = value["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["ph"] == "C")
        .collect();
    let max = |key: &str| {
        counters
            .iter()
            .filter_map(|e| e["args"][key].as_u64())
            .max()
    };
    assert_eq!(max("allocated"), Some(before[1]));
    assert_eq!(max("reserved"), Some(before[2]));
    for path in [source, pickle, trace] {
        std::fs::remove_file(path).ok();
    }
}

#[test]
fn doctor_says_which_backend_a_program_gets() {
    let output = vramscope(&["doctor"]);
    assert!(output.status.success());
    let text = stdout(&output);
    for line in ["CUDA driver library", "devices", "NVRTC", "backend"] {
        assert!(text.contains(line), "doctor names {line}: {text}");
    }
}

#[test]
fn convert_to_an_event_log_reads_back() {
    let source = temp("events-src.json");
    {
        use vramscope::{AllocatorConfig, CachingAllocator, SimDevice};
        let alloc = CachingAllocator::new(SimDevice::phantom(1 << 34), AllocatorConfig::default());
        let mut kept = Vec::new();
        for _ in 0..5 {
            alloc.mark_step();
            kept.push(alloc.alloc(6 << 20).unwrap());
        }
        alloc.snapshot().save(&source).unwrap();
    }
    let log = temp("run.jsonl");
    let output = vramscope(&[
        "convert",
        source.to_str().unwrap(),
        "--to",
        "events",
        "-o",
        log.to_str().unwrap(),
    ]);
    assert!(output.status.success());
    assert!(std::fs::read_to_string(&log).unwrap().lines().count() > 10);
    let report = vramscope(&["report", log.to_str().unwrap()]);
    assert!(
        stdout(&report).contains("retained_per_step"),
        "{}",
        stdout(&report)
    );
    std::fs::remove_file(source).ok();
    std::fs::remove_file(log).ok();
}

/// Waits until `done` says so, failing after 20 seconds with `what` in the message.
fn wait_until(what: &str, done: &mut dyn FnMut() -> bool) {
    let started = std::time::Instant::now();
    while !done() {
        assert!(
            started.elapsed() < std::time::Duration::from_secs(20),
            "{what} within 20 s"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// A snapshot with one live 8 MiB block, saved under the temporary name `name`.
fn one_block_snapshot(name: &str) -> PathBuf {
    use vramscope::{AllocatorConfig, CachingAllocator, SimDevice};
    let path = temp(name);
    let alloc = CachingAllocator::new(SimDevice::phantom(1 << 34), AllocatorConfig::default());
    let _kept = alloc.alloc(8 << 20).unwrap();
    alloc.snapshot().save(&path).unwrap();
    path
}

/// A private tmux server, killed when dropped (whatever the test's outcome), with one
/// session `t` running a shell.
struct TmuxServer {
    socket: String,
}

impl TmuxServer {
    fn start(socket: &str) -> TmuxServer {
        let server = TmuxServer {
            socket: socket.to_string(),
        };
        server
            .run(&[
                "new-session",
                "-d",
                "-s",
                "t",
                "-x",
                "120",
                "-y",
                "40",
                "sh",
            ])
            .expect("tmux starts a session");
        server
    }

    /// Runs `command` in the session's pane (with `sh -c`), which stays on screen after the
    /// command ends.
    fn run_in_pane(&self, command: &str) {
        self.run(&["set-option", "-g", "remain-on-exit", "on"])
            .expect("tmux sets an option");
        self.run(&["respawn-pane", "-k", "-t", "t", "sh", "-c", command])
            .expect("tmux runs the command");
    }

    /// Runs `tmux` on this server with `args`, returning its standard output, or `None` when
    /// it fails.
    fn run(&self, args: &[&str]) -> Option<String> {
        let output = Command::new("tmux")
            .args(["-L", &self.socket])
            .args(args)
            .output()
            .ok()?;
        output
            .status
            .success()
            .then(|| String::from_utf8_lossy(&output.stdout).into_owned())
    }
}

impl Drop for TmuxServer {
    fn drop(&mut self) {
        self.run(&["kill-server"]);
    }
}

#[test]
fn the_dashboard_restores_the_terminal_when_killed() {
    // The dashboard needs a terminal: it runs in a tmux pane on a private server. SIGTERM
    // must end it like `q` (the terminal left raw mode and the alternate screen) with status
    // 128 + 15, instead of killing it with the terminal left raw.
    if Command::new("tmux").arg("-V").output().is_err() {
        vramscope_testkit::skip_notice("tmux is not installed");
        return;
    }
    let snapshot = one_block_snapshot("killed.json");
    // The pane's shell runs the dashboard in the foreground and writes its exit status to a
    // file: the test reads the status from there rather than from tmux, which may learn of a
    // pane process's end later than its terminal closes.
    let status_file = temp("killed.status");
    let _ = std::fs::remove_file(&status_file);
    let command = format!(
        "'{}' view '{}'; echo $? > '{}'",
        env!("CARGO_BIN_EXE_vramscope"),
        snapshot.display(),
        status_file.display()
    );
    let server = TmuxServer::start(&format!("vramscope-test-{}", std::process::id()));
    server.run_in_pane(&command);
    let pane = |format: &str| server.run(&["display-message", "-p", "-t", "t", format]);
    let screen = || {
        server
            .run(&["capture-pane", "-p", "-t", "t"])
            .unwrap_or_default()
    };
    wait_until("the dashboard draws", &mut || {
        screen().contains("Allocated")
    });
    // The dashboard is the pane shell's one child.
    let shell = pane("#{pane_pid}").unwrap().trim().to_string();
    let children = Command::new("pgrep")
        .args(["-P", &shell])
        .output()
        .expect("pgrep runs");
    let dashboard = String::from_utf8_lossy(&children.stdout).trim().to_string();
    assert!(!dashboard.is_empty(), "the dashboard process is found");
    Command::new("kill")
        .args(["-TERM", &dashboard])
        .status()
        .expect("kill runs");
    wait_until("the dashboard stops on SIGTERM", &mut || {
        std::fs::read_to_string(&status_file).is_ok_and(|s| s.ends_with('\n'))
    });
    let status = std::fs::read_to_string(&status_file)
        .unwrap()
        .trim()
        .to_string();
    let screen = screen();
    let alternate = pane("#{alternate_on}").unwrap_or_default();
    drop(server);
    let _ = std::fs::remove_file(&snapshot);
    let _ = std::fs::remove_file(&status_file);
    // A shell reports 128 + 15 for a process killed by SIGTERM too; what tells the two apart
    // is the screen: only the dashboard that handled the signal left the alternate screen.
    assert_eq!(status, "143", "exit status 128 + SIGTERM");
    assert_eq!(alternate.trim(), "0", "the alternate screen was left");
    assert!(
        !screen.contains("Allocated"),
        "the main screen shows no dashboard:\n{screen}"
    );
}

#[test]
fn a_dashboard_in_the_background_says_so_instead_of_stopping() {
    // `timeout` runs its command in a process group of its own, in the background of the
    // terminal: a dashboard there that touched the terminal would be stopped (state T) for
    // good. It must exit 2 at once, saying why (issue 17).
    if Command::new("tmux").arg("-V").output().is_err() {
        vramscope_testkit::skip_notice("tmux is not installed");
        return;
    }
    let snapshot = one_block_snapshot("background.json");
    let status_file = temp("background.status");
    let _ = std::fs::remove_file(&status_file);
    let command = format!(
        "timeout 20 '{}' view '{}' 2>&1; echo $? > '{}'",
        env!("CARGO_BIN_EXE_vramscope"),
        snapshot.display(),
        status_file.display()
    );
    let server = TmuxServer::start(&format!("vramscope-bg-{}", std::process::id()));
    server.run_in_pane(&command);
    let started = std::time::Instant::now();
    while !std::fs::read_to_string(&status_file).is_ok_and(|s| s.ends_with('\n')) {
        assert!(
            started.elapsed() < std::time::Duration::from_secs(15),
            "the dashboard neither ran nor exited: stopped in the background?"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let status = std::fs::read_to_string(&status_file).unwrap();
    let screen = server
        .run(&["capture-pane", "-p", "-J", "-t", "t"])
        .unwrap_or_default();
    drop(server);
    let _ = std::fs::remove_file(&snapshot);
    let _ = std::fs::remove_file(&status_file);
    assert_eq!(status.trim(), "2", "exit status 2:\n{screen}");
    assert!(
        screen.contains("foreground group"),
        "the reason is shown:\n{screen}"
    );
}

/// A frame file name with terminal escape sequences (retitle, clear screen) reaches the text
/// report and the summary escaped, never as the raw sequence (issue 17).
#[test]
fn escape_sequences_from_a_file_never_reach_the_terminal() {
    use vramscope::allocator::{CachingAllocator, SimDevice};
    use vramscope::model::AllocatorConfig;
    let alloc = CachingAllocator::new(SimDevice::phantom(1 << 34), AllocatorConfig::default());
    let mut kept = Vec::new();
    for _ in 0..6 {
        alloc.mark_step();
        kept.push(alloc.alloc(1 << 20).unwrap());
    }
    let mut snapshot = alloc.snapshot();
    for site in &mut snapshot.sites {
        site.file = "evil\u{1b}]0;pwned\u{7}\u{1b}[2J.py".to_string();
        site.function = "f\u{1b}[31m".to_string();
    }
    let path = std::env::temp_dir().join(format!("vramscope-escapes-{}.json", std::process::id()));
    snapshot.save(&path).unwrap();
    for command in ["report", "summary"] {
        let output = std::process::Command::new(env!("CARGO_BIN_EXE_vramscope"))
            .args([command, path.to_str().unwrap()])
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&output.stdout);
        assert!(text.contains("evil"), "{command}: {text}");
        assert!(
            !text.contains('\u{1b}') && !text.contains('\u{7}'),
            "{command} printed a raw escape sequence: {text:?}"
        );
        assert!(text.contains("\\u{1b}]0;pwned"), "{command}: shown escaped");
    }
    drop(kept);
    let _ = std::fs::remove_file(path);
}

/// Input with nothing to analyse (a profiler trace without memory events) is exit 2 with the
/// hint that records it, not a clean bill of health (issue 16).
#[test]
fn a_trace_without_memory_events_is_refused_with_a_hint() {
    let path = temp("no-memory.json");
    std::fs::write(
        &path,
        r#"{"traceEvents": [{"name": "ProfilerStep#1", "ph": "X", "ts": 1, "dur": 5}]}"#,
    )
    .unwrap();
    for command in ["report", "summary"] {
        let output = std::process::Command::new(env!("CARGO_BIN_EXE_vramscope"))
            .args([command, path.to_str().unwrap()])
            .output()
            .unwrap();
        assert_eq!(output.status.code(), Some(2), "{command}");
        let message = String::from_utf8_lossy(&output.stderr);
        assert!(
            message.contains("profile_memory=True"),
            "{command}: {message}"
        );
    }
    let _ = std::fs::remove_file(path);
}

/// The headless demo's header counts the host waits that its `sync_in_loop` finding counts
/// (issue 16: it said "0 syncs" beside a finding of 32 per step).
#[test]
fn the_demo_header_counts_the_waits_the_finding_counts() {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_vramscope"))
        .args(["demo", "--headless", "--steps", "6", "--format", "json"])
        .output()
        .unwrap();
    assert!(output.status.success());
    let json: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    let json = &json["devices"][0];
    let waits = json["stats"]["host_waits"].as_u64().unwrap();
    let finding = json["findings"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["kind"] == "sync_in_loop")
        .expect("the planted .item() loop is found");
    let counted = finding["count"].as_u64().unwrap();
    assert!(
        counted > 0 && waits >= counted,
        "{waits} waits, {counted} in the finding"
    );
}

/// `convert --to html` writes the same explorer page as `report --format html` (issue 20).
#[test]
fn convert_to_html_writes_the_explorer() {
    use vramscope::{AllocatorConfig, CachingAllocator, SimDevice};
    let alloc = CachingAllocator::new(SimDevice::phantom(1 << 34), AllocatorConfig::default());
    let _kept = alloc.alloc(8 << 20).unwrap();
    let snapshot = temp("convert-html.json");
    alloc.snapshot().save(&snapshot).unwrap();
    let (converted, reported) = (temp("converted.html"), temp("reported.html"));
    let run = |args: &[&str]| {
        let status = std::process::Command::new(env!("CARGO_BIN_EXE_vramscope"))
            .args(args)
            .output()
            .unwrap()
            .status;
        assert!(status.success(), "{args:?}");
    };
    let file = snapshot.to_str().unwrap();
    run(&[
        "convert",
        file,
        "--to",
        "html",
        "-o",
        converted.to_str().unwrap(),
    ]);
    run(&[
        "report",
        file,
        "--format",
        "html",
        "-o",
        reported.to_str().unwrap(),
    ]);
    let page = std::fs::read_to_string(&converted).unwrap();
    assert!(page.contains("<canvas id=\"chart\""), "the explorer");
    assert_eq!(page, std::fs::read_to_string(&reported).unwrap());
    for path in [snapshot, converted, reported] {
        let _ = std::fs::remove_file(path);
    }
}

/// A file that takes long to read shows that it is loading, and `q` gives up at once,
/// restoring the terminal (issue 17: `view` ignored `q` during a slow import). The slow file is
/// gzip members of zeros, concatenated: gigabytes unpacked from a few megabytes, which the
/// importer unpacks up to its input limit before it refuses them, seconds of work. (A named
/// pipe nobody writes to served here once; the importer now refuses what is not a regular
/// file, issue 44.)
#[test]
fn q_gives_up_a_slow_load() {
    if Command::new("tmux").arg("-V").output().is_err() {
        vramscope_testkit::skip_notice("tmux is not installed");
        return;
    }
    let slow = temp("slow.json.gz");
    {
        use std::io::Write;
        let mut member = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        member.write_all(&vec![0u8; 64 << 20]).unwrap();
        let member = member.finish().unwrap();
        let mut out = std::fs::File::create(&slow).unwrap();
        for _ in 0..128 {
            out.write_all(&member).unwrap();
        }
    }
    let status_file = temp("slow.status");
    let _ = std::fs::remove_file(&status_file);
    let command = format!(
        "'{}' view '{}'; echo $? > '{}'",
        env!("CARGO_BIN_EXE_vramscope"),
        slow.display(),
        status_file.display()
    );
    let server = TmuxServer::start(&format!("vramscope-slow-{}", std::process::id()));
    server.run_in_pane(&command);
    wait_until("the loading line", &mut || {
        server
            .run(&["capture-pane", "-p", "-t", "t"])
            .is_some_and(|screen| screen.contains("Loading") && screen.contains("q, Esc"))
    });
    server.run(&["send-keys", "-t", "t", "q"]).unwrap();
    wait_until("q ends it", &mut || {
        std::fs::read_to_string(&status_file).is_ok_and(|s| s.ends_with('\n'))
    });
    let status = std::fs::read_to_string(&status_file).unwrap();
    let alternate = server
        .run(&["display-message", "-p", "-t", "t", "#{alternate_on}"])
        .unwrap_or_default();
    drop(server);
    let _ = std::fs::remove_file(&slow);
    let _ = std::fs::remove_file(&status_file);
    assert_eq!(status.trim(), "0", "giving up is not an error");
    assert_eq!(alternate.trim(), "0", "the terminal was restored");
}

#[test]
fn the_input_ceiling_belongs_to_the_commands_that_read_files() {
    let file = temp("ceiling.json");
    let demo = vramscope(&["demo", "--headless", "--steps", "2", "--format", "json"]);
    std::fs::write(&file, &demo.stdout).unwrap();
    // Not in the help of the commands that read no file.
    for command in ["demo", "top", "doctor"] {
        let help = stdout(&vramscope(&[command, "--help"]));
        assert!(!help.contains("--max-input"), "{command}: {help}");
    }
    // A file command takes it, and a file past it is exit 2 naming both ways to raise it.
    for command in ["report", "summary", "replay"] {
        let help = stdout(&vramscope(&[command, "--help"]));
        assert!(help.contains("--max-input"), "{command}: {help}");
        let output = vramscope(&[command, "--max-input", "16B", file.to_str().unwrap()]);
        assert_eq!(output.status.code(), Some(2), "{command}");
        let error = String::from_utf8_lossy(&output.stderr);
        assert!(
            error.contains("larger than the limit of 16 bytes"),
            "{error}"
        );
        assert!(error.contains("--max-input SIZE"), "{error}");
    }
    let _ = std::fs::remove_file(&file);
}
