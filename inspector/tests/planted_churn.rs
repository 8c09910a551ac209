//! Planted `torch.cuda.empty_cache()` churn and OOMs, with their clean twins.
//!
//! A training loop that calls `empty_cache()` every step gives a `cache_churn` warning at the
//! line that calls it, counting the calls, with a fix that says to remove it; the same loop
//! without the call is silent. The replay performs each call where the trace made it, so the
//! trace replays call for call under `verify`. A replay against a small capacity names the
//! call site of its first OOM.

mod common;

use common::pytorch_like::{alloc_frames, py, Model, Torch, MIB};
use vramscope_inspector::detect::{detect, DetectOptions, FindingKind, Severity};
use vramscope_inspector::model_view::ModelView;
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
    let report = vramscope_inspector::report::build_report(&snapshot, &Default::default());
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
