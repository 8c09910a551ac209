//! Planted `torch.cuda.empty_cache()` churn and OOMs, with their clean twins.
//!
//! A training loop that calls `empty_cache()` every step gives a `cache_churn` warning at the
//! line that calls it, counting the calls, with a fix that says to remove it; the same loop
//! without the call is silent. The replay performs each call where the trace made it, so the
//! trace replays call for call under `verify`. A replay against a small capacity names the
//! call site of its first OOM. An offloading loader whose ten shards each run on their own
//! stream churns because one stream's cached blocks cannot serve another: the warning says
//! so and gives the per-stream fix, while churn on one stream near capacity keeps its advice.

mod common;

use common::pytorch_like::{alloc_frames, py, Model, Torch, MIB};
use vramscope_analysis::detect::{detect, DetectOptions, FindingKind, Severity};
use vramscope_analysis::model_view::ModelView;
use vramscope_model::{Frame, Snapshot};
use vramscope_replay::{replay, ReplayOptions};

const TRAIN: &str = "/home/user/project/train.py";

fn at(line: u32) -> Vec<Frame> {
    vec![
        py(TRAIN, line, "train"),
        py(TRAIN, 120, "main"),
        py(TRAIN, 124, "<module>"),
    ]
}

/// Weights, then `steps` steps of large activations, calling `empty_cache()` at line 70 after
/// each step when `empty` is set.
fn churning(steps: usize, empty: bool) -> Snapshot {
    let mut t = Torch::new();
    let model = Model::new(2, 30 * MIB);
    let mut weights = alloc_frames("empty_strided");
    weights.extend(at(20));
    let _w = t.alloc(&weights, 64 * MIB);
    for _ in 0..steps {
        let mut input = alloc_frames("_to_copy");
        input.extend(at(55));
        let x = t.alloc(&input, 8 * MIB);
        let acts = model.forward(&mut t, &at(57));
        model.backward(&mut t, acts);
        t.free(x);
        t.annotate("Optimizer.step#AdamW.step", "START");
        t.annotate("Optimizer.step#AdamW.step", "END");
        if empty {
            t.empty_cache(&at(70));
        }
    }
    t.finish()
}

#[test]
fn empty_cache_in_the_loop_is_named_at_its_line_and_counted() {
    let snapshot = churning(8, true);
    let view = ModelView::new(&snapshot);
    assert_eq!(view.empty_cache_calls().len(), 8);
    let findings = detect(&snapshot, &DetectOptions::default());
    let churn: Vec<_> = findings
        .iter()
        .filter(|f| f.kind == FindingKind::CacheChurn)
        .collect();
    assert_eq!(churn.len(), 1, "{findings:#?}");
    let f = churn[0];
    assert_eq!(f.severity, Severity::Warning);
    assert_eq!(f.site_label(), format!("{TRAIN}:70"));
    // Every call follows an optimizer step, so all eight are in the loop.
    let calls = f
        .evidence
        .get("empty_cache_calls")
        .map(|v| v.to_string())
        .unwrap();
    assert_eq!(calls, "8");
    assert!(f.fix.contains("remove"), "{}", f.fix);
    assert!(f.fix.contains(&format!("{TRAIN}:70")), "{}", f.fix);
    let serious: Vec<_> = findings
        .iter()
        .filter(|f| f.severity >= Severity::Warning)
        .collect();
    assert_eq!(serious.len(), 1, "{serious:#?}");
    // The report's statistics count the same calls as the finding (they said 0: PyTorch
    // records no event of its own for a call, only the segment frees).
    let report = vramscope_analysis::report::build_report(&snapshot, &Default::default());
    assert_eq!(report.stats.empty_cache_calls, Some(8));
}

#[test]
fn the_loop_without_empty_cache_is_silent() {
    let snapshot = churning(8, false);
    assert!(ModelView::new(&snapshot).empty_cache_calls().is_empty());
    let findings = detect(&snapshot, &DetectOptions::default());
    let serious: Vec<_> = findings
        .iter()
        .filter(|f| f.severity >= Severity::Warning)
        .collect();
    assert!(serious.is_empty(), "{serious:#?}");
}

#[test]
fn a_trace_that_calls_empty_cache_replays_call_for_call() {
    let snapshot = churning(6, true);
    let mut options = ReplayOptions::default();
    options.config = snapshot.config.clone();
    options.verify = true;
    let result = replay(&snapshot, &options, &mut |_, _| {});
    assert_eq!(result.empty_cache_calls, 6);
    let check = result.device_calls.expect("verified");
    assert!(check.trace_calls > 12, "{check:?}");
    assert_eq!(check.first_difference, None, "{check:?}");
    assert_eq!(check.matching, check.trace_calls);
}

#[test]
fn a_replay_that_runs_out_names_the_call_site_of_its_first_oom() {
    let snapshot = churning(4, false);
    let mut options = ReplayOptions::default();
    options.capacity = Some(200 * MIB);
    let result = replay(&snapshot, &options, &mut |_, _| {});
    let oom = result.first_oom.expect("an OOM at 200 MiB");
    let site = oom.site.expect("a site");
    assert!(
        site == format!("{}:31", "/home/user/project/model.py")
            || site == format!("{}:32", "/home/user/project/model.py")
            || site == format!("{}:33", "/home/user/project/model.py"),
        "{site}"
    );
}

/// An offloading loader: each step runs ten model shards, each loaded (96 MiB) and run (a
/// 32 MiB activation) on CUDA stream `1 + shard % streams`, on a 1 GiB device that holds a
/// few shards' caches but not ten.
fn offloading(steps: usize, streams: u64) -> Snapshot {
    let mut t = Torch::on_device("", 1 << 30);
    let mut weights = alloc_frames("empty_strided");
    weights.extend(at(20));
    let _w = t.alloc(&weights, 64 * MIB);
    let mut load = alloc_frames("_to_copy");
    load.extend(at(40));
    let mut act = alloc_frames("addmm");
    act.extend(at(42));
    for _ in 0..steps {
        t.annotate("Optimizer.step#AdamW.step", "START");
        for shard in 0..10u64 {
            let stream = 1 + shard % streams;
            let w = t.alloc_on(&load, 96 * MIB, stream);
            let a = t.alloc_on(&act, 32 * MIB, stream);
            t.free(a);
            t.free(w);
        }
        t.annotate("Optimizer.step#AdamW.step", "END");
    }
    t.finish()
}

/// A loop on one stream that churns near capacity: a 180 MiB block and then forty 512 KiB
/// tensors (the small pool's 2 MiB segments) each step, on a 256 MiB device that holds
/// either cache but not both.
fn one_stream_near_capacity(steps: usize) -> Snapshot {
    let mut t = Torch::on_device("", 256 * MIB);
    let mut weights = alloc_frames("empty_strided");
    weights.extend(at(20));
    let _w = t.alloc(&weights, 64 * MIB);
    let mut big = alloc_frames("addmm");
    big.extend(at(57));
    let mut small = alloc_frames("mul");
    small.extend(at(58));
    for _ in 0..steps {
        t.annotate("Optimizer.step#AdamW.step", "START");
        let b = t.alloc(&big, 180 * MIB);
        t.free(b);
        let held: Vec<u64> = (0..40).map(|_| t.alloc(&small, MIB / 2)).collect();
        for h in held {
            t.free(h);
        }
        t.annotate("Optimizer.step#AdamW.step", "END");
    }
    t.finish()
}

fn churn_of(snapshot: &Snapshot) -> Vec<vramscope_analysis::detect::Finding> {
    detect(snapshot, &DetectOptions::default())
        .into_iter()
        .filter(|f| f.kind == FindingKind::CacheChurn)
        .collect()
}

#[test]
fn churn_on_ten_streams_names_the_per_stream_caches() {
    let churn = churn_of(&offloading(6, 10));
    assert_eq!(churn.len(), 1, "{churn:#?}");
    let f = &churn[0];
    assert_eq!(f.severity, Severity::Warning);
    assert_eq!(
        f.evidence.get("streams").map(|v| v.to_string()).as_deref(),
        Some("10"),
        "{f:#?}"
    );
    assert!(
        f.summary.contains("spread over 10 streams"),
        "{}",
        f.summary
    );
    assert!(
        f.summary
            .contains("released from each stream's cache per step"),
        "{}",
        f.summary
    );
    assert!(f.fix.contains("fewer streams"), "{}", f.fix);
    assert!(f.fix.contains("record_stream"), "{}", f.fix);
    assert!(!f.fix.contains("expandable_segments"), "{}", f.fix);
    assert!(!f.fix.contains("lower the peak"), "{}", f.fix);
    // The same loader on one stream reuses its one cache: nothing churns.
    assert!(churn_of(&offloading(6, 1)).is_empty());
}

#[test]
fn churn_on_one_stream_keeps_the_single_stream_advice() {
    let churn = churn_of(&one_stream_near_capacity(6));
    assert_eq!(churn.len(), 1, "{churn:#?}");
    let f = &churn[0];
    assert!(f.evidence.get("streams").is_none(), "{f:#?}");
    assert!(f.fix.contains("expandable_segments:True"), "{}", f.fix);
    assert!(!f.fix.contains("record_stream"), "{}", f.fix);
}
