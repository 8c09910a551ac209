//! Answers that used to mislead (issue 32, item 8), end to end through the binary: `convert
//! -o -` and `report -o -` write to standard output rather than a file named `-`; a replay
//! whose start state alone exceeds the capacity says so and what fits; a sweep recommends a
//! setting only when it changes the outcome; `diff` states both runs' peaks and compares
//! what each held at its peak with `--at peak`; the HTML page opens on the verdict.
//!
//! Every trace is built here with `vramscope_testkit::Trace` (or the allocator itself).

use std::path::PathBuf;
use std::process::{Command, Output};

use vramscope_testkit::{Trace, MIB};

const GIB: u64 = 1 << 30;

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

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// A path in the temporary folder, unique to this test process.
fn temp(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("vramscope-plain-{}-{name}", std::process::id()))
}

/// Runs `vramscope` in `dir` (so that a file named `-` would land there).
fn vramscope_in(dir: &std::path::Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_vramscope"))
        .args(args)
        .current_dir(dir)
        .env("NO_COLOR", "1")
        .output()
        .expect("vramscope runs")
}

/// A small trace: 8 MiB kept and five steps of 4 MiB allocated and freed.
fn small_trace(path: &std::path::Path) {
    let mut t = Trace::new();
    let weights = t.site("model.py", 3, "Model.__init__");
    let step = t.site("train.py", 9, "train");
    t.alloc(weights, 8 * MIB);
    for _ in 0..5 {
        t.step();
        let a = t.alloc(step, 4 * MIB);
        t.free(a, 4 * MIB);
    }
    t.finish().save(path).unwrap();
}

/// `-` is standard output for every format of `convert` (and `report -o -`): the bytes on
/// standard output are the file's, and no file named `-` appears.
#[test]
fn dash_is_standard_output() {
    let dir = temp("dash");
    std::fs::create_dir_all(&dir).unwrap();
    let source = dir.join("trace.json");
    small_trace(&source);
    let src = source.to_str().unwrap();
    for target in ["pytorch", "perfetto", "json", "events", "html"] {
        let file = dir.join(format!("out.{target}"));
        let to_file = vramscope_in(
            &dir,
            &["convert", src, "--to", target, "-o", file.to_str().unwrap()],
        );
        assert!(to_file.status.success(), "{target}: {}", stderr(&to_file));
        let to_stdout = vramscope_in(&dir, &["convert", src, "--to", target, "-o", "-"]);
        assert!(
            to_stdout.status.success(),
            "{target}: {}",
            stderr(&to_stdout)
        );
        assert!(
            !dir.join("-").exists(),
            "{target}: convert -o - wrote a file named -"
        );
        let written = std::fs::read(&file).unwrap();
        assert!(!written.is_empty(), "{target}");
        assert_eq!(
            to_stdout.stdout, written,
            "{target}: standard output holds the file's bytes"
        );
        assert!(
            !stderr(&to_stdout).contains("wrote"),
            "{target}: {}",
            stderr(&to_stdout)
        );
    }
    let report = vramscope_in(&dir, &["report", src, "-o", "-"]);
    assert!(report.status.success(), "{}", stderr(&report));
    assert!(!dir.join("-").exists(), "report -o - wrote a file named -");
    assert_eq!(stdout(&report), stdout(&vramscope(&["report", src])));
    std::fs::remove_dir_all(dir).ok();
}

/// A run that keeps 64 MiB of weights and, in each of three steps, makes `activations` bytes at
/// `model.py:50` and frees them, keeping `kept` bytes at `train.py:20` in the last.
fn run_with(path: &std::path::Path, activations: u64, kept: u64) {
    let mut t = Trace::new();
    let weights = t.site("model.py", 10, "Model.__init__");
    let act = t.site("model.py", 50, "Model.forward");
    let keep = t.site("train.py", 20, "train");
    t.alloc(weights, 64 * MIB);
    for step in 0..3 {
        t.step();
        let a = t.alloc(act, activations);
        t.free(a, activations);
        if step == 2 {
            t.alloc(keep, kept);
        }
    }
    t.finish().save(path).unwrap();
}

/// Two configurations whose peaks differ by 1 GiB and whose ends differ by 392 KiB: `diff`
/// states both peaks in its header in every mode, and `--at peak` names the site behind the
/// difference.
#[test]
fn diff_states_both_peaks_and_compares_them_at_peak() {
    let (small, large) = (temp("diff-small.json"), temp("diff-large.json"));
    run_with(&small, GIB, 8 * MIB);
    run_with(&large, 2 * GIB, 8 * MIB + 392 * 1024);
    let (a, b) = (small.to_str().unwrap(), large.to_str().unwrap());

    let end = vramscope(&["diff", a, b]);
    assert!(end.status.success(), "{}", stderr(&end));
    let text = stdout(&end);
    let first = text.lines().next().unwrap_or_default();
    assert_eq!(
        first, "peak allocated: 1.06 GiB -> 2.06 GiB (+1.00 GiB)",
        "{text}"
    );
    assert!(text.contains("live at the end: "), "{text}");
    assert!(text.contains("+392 KiB"), "{text}");
    assert!(
        !text.contains("model.py:50"),
        "nothing of it is live at the end: {text}"
    );

    let peak = vramscope(&["diff", a, b, "--at", "peak"]);
    assert!(peak.status.success(), "{}", stderr(&peak));
    let text = stdout(&peak);
    assert!(
        text.starts_with("peak allocated: 1.06 GiB -> 2.06 GiB (+1.00 GiB)\n"),
        "{text}"
    );
    assert!(
        text.contains("held at each run's peak: 1.06 GiB in 2 blocks -> 2.06 GiB in 2 blocks"),
        "{text}"
    );
    let grew = text
        .lines()
        .find(|l| l.contains("model.py:50"))
        .unwrap_or_else(|| panic!("the activations' site grew: {text}"));
    assert!(grew.contains("+1.00 GiB"), "{grew}");
    assert!(!text.contains("train.py:20"), "kept after the peak: {text}");

    let json = vramscope(&["diff", a, b, "--at", "peak", "--format", "json"]);
    let value: serde_json::Value = serde_json::from_str(&stdout(&json)).unwrap();
    assert_eq!(value["at"], "peak");
    assert_eq!(value["before_peak_bytes"], 64 * MIB + GIB);
    assert_eq!(value["after_peak_bytes"], 64 * MIB + 2 * GIB);
    assert_eq!(value["delta_peak_bytes"], GIB);
    // At the peak, each side's column sums to its run's peak.
    assert_eq!(value["before_bytes"], value["before_peak_bytes"]);
    assert_eq!(value["after_bytes"], value["after_peak_bytes"]);
    assert_eq!(value["grew"][0]["site"], "model.py:50");
    assert_eq!(value["grew"][0]["delta_bytes"], GIB);

    let json = vramscope(&["diff", a, b, "--format", "json"]);
    let value: serde_json::Value = serde_json::from_str(&stdout(&json)).unwrap();
    assert_eq!(value["at"], "end");
    assert_eq!(value["delta_peak_bytes"], GIB);
    assert_eq!(
        value["after_bytes"].as_u64().unwrap() - value["before_bytes"].as_u64().unwrap(),
        392 * 1024
    );

    let bad = vramscope(&["diff", a, b, "--at", "middle"]);
    assert_eq!(bad.status.code(), Some(2));
    for path in [small, large] {
        std::fs::remove_file(path).ok();
    }
}

/// A trace that starts late, with 11.6 GiB allocated before it in a 12 GiB segment, then five
/// steps of 100 MiB allocated and freed.
fn late_trace(path: &std::path::Path) {
    let mut t = Trace::new();
    let step = t.site("train.py", 10, "train");
    let before = 11_878 * MIB; // 11.6 GiB
    t.add_segment(0x7e00_0000_0000, &[(0, before, true)], 12 * GIB);
    for _ in 0..5 {
        t.step();
        let a = t.alloc(step, 100 * MIB);
        t.free(a, 100 * MIB);
    }
    t.finish().save(path).unwrap();
}

/// On an 8 GiB capacity, a trace whose start state alone is 11.6 GiB does not fit, whatever
/// the settings: `replay` and `replay --sweep` say so plainly, in text and JSON, and say what
/// fits (what the replay needs with no limit), which does run the trace.
#[test]
fn a_start_state_over_the_capacity_is_said_plainly_with_what_fits() {
    let trace = temp("late.json");
    late_trace(&trace);
    let path = trace.to_str().unwrap();

    let text = stdout(&vramscope(&["replay", path, "--capacity", "8GiB"]));
    assert!(
        text.contains(
            "does not fit: the start state alone exceeds the 8.00 GiB capacity: 11.6 GiB allocated before the trace, in 12.0 GiB of segments that hold it"
        ),
        "{text}"
    );
    assert!(
        text.contains("what fits: 12.0 GiB, what this replay reserves at its peak with no limit"),
        "{text}"
    );
    assert!(!text.contains("no OOM at this capacity"), "{text}");
    assert!(
        text.contains("no limit"),
        "the column says what it is: {text}"
    );

    let json = vramscope(&["replay", path, "--capacity", "8GiB", "--format", "json"]);
    let value: serde_json::Value = serde_json::from_str(&stdout(&json)).unwrap();
    let over = &value["start_over_capacity"];
    assert_eq!(over["allocated"], 11_878 * MIB, "{value:#}");
    assert_eq!(over["reserved"], 12 * GIB, "{value:#}");
    assert_eq!(over["needed"], value["peak_reserved"], "{value:#}");
    let needed = over["needed"].as_u64().unwrap();
    assert!(needed >= 12 * GIB, "{value:#}");
    assert_eq!(value["capacity"], 8 * GIB);

    // What fits does fit: replayed on it, the start state is within it and nothing fails.
    let fits = needed.to_string();
    let json = vramscope(&["replay", path, "--capacity", &fits, "--format", "json"]);
    let value: serde_json::Value = serde_json::from_str(&stdout(&json)).unwrap();
    assert!(value.get("start_over_capacity").is_none(), "{value:#}");
    assert_eq!(value["num_ooms"], 0, "{value:#}");
    assert!(value["first_oom"].is_null(), "{value:#}");
    // A capacity the start state fits is not said to be exceeded.
    let text = stdout(&vramscope(&["replay", path, "--capacity", "13GiB"]));
    assert!(!text.contains("start state alone"), "{text}");

    // Under --fail-on-oom a run that cannot start is a failure.
    let status = vramscope(&["replay", path, "--capacity", "8GiB", "--fail-on-oom"]).status;
    assert_eq!(status.code(), Some(1));

    let sweep = stdout(&vramscope(&[
        "replay",
        path,
        "--capacity",
        "8GiB",
        "--sweep",
    ]));
    assert!(
        sweep.contains("no setting fits: the start state alone exceeds the 8.00 GiB capacity: 11.6 GiB allocated before the trace"),
        "{sweep}"
    );
    assert!(
        sweep.contains("what fits: 12.0 GiB with the defaults"),
        "{sweep}"
    );
    assert!(!sweep.contains("PYTORCH_CUDA_ALLOC_CONF"), "{sweep}");
    assert!(!sweep.contains(" yes "), "{sweep}");
    let json = vramscope(&[
        "replay",
        path,
        "--capacity",
        "8GiB",
        "--sweep",
        "--format",
        "json",
    ]);
    let rows: serde_json::Value = serde_json::from_str(&stdout(&json)).unwrap();
    let rows = rows.as_array().unwrap();
    assert!(!rows.is_empty());
    for row in rows {
        assert_eq!(row["fits"], false, "{row:#}");
        let over = &row["result"]["start_over_capacity"];
        assert_eq!(over["allocated"], 11_878 * MIB, "{row:#}");
        assert_eq!(over["needed"], row["result"]["peak_reserved"], "{row:#}");
    }
    std::fs::remove_file(trace).ok();
}

/// A sweep recommends a setting only when it changes the outcome: where the defaults fit and
/// nothing reserves materially less it says so and recommends nothing; where expandable
/// segments save most of the reserve it recommends them; where the defaults run out of memory
/// and another setting does not, it recommends that one.
#[test]
fn a_sweep_recommends_a_change_only_when_it_changes_the_outcome() {
    let sweep = |path: &str, capacity: &str| {
        let text = stdout(&vramscope(&[
            "replay",
            path,
            "--capacity",
            capacity,
            "--sweep",
        ]));
        let json = vramscope(&[
            "replay",
            path,
            "--capacity",
            capacity,
            "--sweep",
            "--format",
            "json",
        ]);
        let rows: serde_json::Value = serde_json::from_str(&stdout(&json)).unwrap();
        let recommended: Vec<String> = rows
            .as_array()
            .unwrap()
            .iter()
            .filter(|r| r["recommended"] == true)
            .map(|r| r["config"].as_str().unwrap().to_string())
            .collect();
        let baseline: Vec<String> = rows
            .as_array()
            .unwrap()
            .iter()
            .filter(|r| r["baseline"] == true)
            .map(|r| r["config"].as_str().unwrap().to_string())
            .collect();
        assert_eq!(baseline, ["(defaults)"], "{rows:#}");
        (text, recommended)
    };

    // Defaults that fit, with nothing reserving materially less.
    let small = temp("sweep-small.json");
    small_trace(&small);
    let (text, recommended) = sweep(small.to_str().unwrap(), "1GiB");
    assert!(
        text.contains("the defaults fit at a peak of 20.0 MiB reserved: no setting tried reserves materially less (at least 10% and 256 MiB)"),
        "{text}"
    );
    assert!(!text.contains("PYTORCH_CUDA_ALLOC_CONF"), "{text}");
    assert!(recommended.is_empty(), "{recommended:?}");

    // Activations that grow every step: the defaults cache every size (4.50 GiB reserved for
    // a 1 GiB peak); expandable segments reserve 1 GiB.
    let grow = temp("sweep-grow.json");
    {
        let mut t = Trace::new();
        let site = t.site("train.py", 10, "train");
        for i in 1..=8u64 {
            t.step();
            let a = t.alloc(site, i * 128 * MIB);
            t.free(a, i * 128 * MIB);
        }
        t.finish().save(&grow).unwrap();
    }
    let (text, recommended) = sweep(grow.to_str().unwrap(), "8GiB");
    assert!(
        text.contains(
            "the defaults fit at a peak of 4.50 GiB reserved; expandable_segments:True reserves"
        ),
        "{text}"
    );
    assert!(
        text.contains("PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"),
        "{text}"
    );
    assert_eq!(recommended, ["expandable_segments:True"]);

    // A block kept in a split segment leaves no room for a larger request under the defaults
    // at 1 GiB: expandable segments avoid the OOM.
    let split = temp("sweep-split.json");
    {
        let mut t = Trace::new();
        let site = t.site("train.py", 10, "train");
        let kept = t.site("train.py", 12, "train");
        t.step();
        let a = t.alloc(site, 500 * MIB);
        t.free(a, 500 * MIB);
        t.alloc(kept, 300 * MIB);
        t.step();
        let b = t.alloc(site, 600 * MIB);
        t.free(b, 600 * MIB);
        t.finish().save(&split).unwrap();
    }
    let (text, recommended) = sweep(split.to_str().unwrap(), "1GiB");
    assert!(
        text.contains("the defaults do not fit; fits with "),
        "{text}"
    );
    assert_eq!(recommended.len(), 1, "{text}");
    assert!(
        text.contains(&format!("PYTORCH_CUDA_ALLOC_CONF={}", recommended[0])),
        "{text}"
    );
    for path in [small, grow, split] {
        std::fs::remove_file(path).ok();
    }
}
