//! Planted dumps of the shapes real users take, beside training loops: one forward whose
//! model loops over its 24 layers, a dump in the middle of a forward (before `backward()`, as
//! at an OOM), an offloading loader that runs 33 shards inside one forward, a Lightning-style
//! `optimizer.step(closure)` and step marks that cover only a warm-up. A step is one call of the
//! frame that drives the model, never a loop under `nn.Module.__call__`; memory counts as
//! retained per step only when it outlives a step that completed; what the step in progress
//! holds is said as such, never as a leak. The traces come from `common/pytorch_like.rs`, with
//! PyTorch's stacks and allocation policy.

mod common;

use common::pytorch_like::{alloc_frames, module_call, py, torch_py, Model, Torch, MIB};
use vramscope_analysis::detect::{detect, DetectOptions, Finding, FindingKind, Severity};
use vramscope_analysis::model_view::{ModelView, StepSource};
use vramscope_model::{Frame, Snapshot};
use vramscope_testkit::Trace;

const TRAIN: &str = "/home/user/project/train.py";
const SERVE: &str = "/home/user/project/generate.py";

/// The stack of a line of the user's `train` function, called from `main` (innermost first).
fn at(file: &str, line: u32, function: &str) -> Vec<Frame> {
    vec![
        py(file, line, function),
        py(file, 120, "main"),
        py(file, 124, "<module>"),
    ]
}

/// A stack for an op at a line of the user's loop.
fn op_at(op: &str, file: &str, line: u32) -> Vec<Frame> {
    let mut frames = alloc_frames(op);
    frames.extend(at(file, line, "train"));
    frames
}

fn problems(findings: &[Finding]) -> Vec<&Finding> {
    findings
        .iter()
        .filter(|f| f.severity >= Severity::Warning)
        .collect()
}

/// One training iteration: the input, the forward, the loss, and, unless `stop_before_backward`,
/// the backward pass that frees the activations. Returns what is still live.
fn iteration(t: &mut Torch, model: &Model, stop_before_backward: bool) -> Vec<u64> {
    let x = t.alloc(&op_at("_to_copy", TRAIN, 55), 3 * MIB);
    let acts = model.forward(t, &at(TRAIN, 57, "train"));
    if stop_before_backward {
        let mut live = acts;
        live.push(x);
        return live;
    }
    let loss = t.alloc(&op_at("mse_loss", TRAIN, 58), 4);
    model.backward(t, acts);
    t.free(loss);
    t.free(x);
    Vec::new()
}

/// One forward and backward of a 24-layer model: the layers repeat 24 times inside one call of
/// the driving frame, which is one step or none, never 24.
#[test]
fn one_forward_with_24_layers_is_not_24_steps() {
    let mut t = Torch::new();
    let model = Model::new(24, 2 * MIB);
    iteration(&mut t, &model, false);
    let snapshot = t.finish();
    let view = ModelView::new(&snapshot);
    assert_eq!(view.step_source(), &StepSource::None);
    assert!(view.loop_steps().len() <= 1, "{:?}", view.steps());
    let findings = detect(&snapshot, &DetectOptions::default());
    assert!(problems(&findings).is_empty(), "{findings:#?}");
}

/// A dump taken in the middle of a forward (before `backward()`, as at an OOM), whose model
/// loops over its 12 layers and an inner loop in each: no steps from the loops, no ERROR or
/// WARNING, and the report says the forward in progress holds the activations.
#[test]
fn a_dump_mid_forward_is_the_forward_in_progress_not_a_leak() {
    let mut t = Torch::new();
    let model = Model::new(12, 8 * MIB);
    let live = iteration(&mut t, &model, true);
    let snapshot = t.finish();
    let view = ModelView::new(&snapshot);
    assert_eq!(view.step_source(), &StepSource::None);
    let findings = detect(&snapshot, &DetectOptions::default());
    assert!(problems(&findings).is_empty(), "{findings:#?}");
    assert!(
        findings.iter().all(|f| !f.fix.contains("no_grad")),
        "{findings:#?}"
    );
    let progress = findings
        .iter()
        .find(|f| f.summary.starts_with("the forward in progress holds"))
        .unwrap_or_else(|| panic!("no word of the forward in progress: {findings:#?}"));
    assert_eq!(progress.kind, FindingKind::TopHolders);
    assert_eq!(progress.severity, Severity::Info);
    // Twelve layers of three 8 MiB activations (in PyTorch's blocks, a little more).
    assert!(progress.bytes >= 12 * 3 * 8 * MIB, "{progress:#?}");
    assert!(progress.bytes < 12 * 3 * 9 * MIB, "{progress:#?}");
    assert_eq!(progress.count, 12 * 3);
    assert!(
        progress.summary.contains(&format!("{TRAIN}:57")),
        "{}",
        progress.summary
    );
    assert!(
        !progress.summary.contains("weights"),
        "{}",
        progress.summary
    );
    assert_eq!(live.len(), 12 * 3 + 1);
}

/// Five complete iterations, then a dump in the middle of the sixth forward: six inferred
/// steps, the sixth in progress; its activations are all live by design, which is said as
/// such, never as memory retained per step.
#[test]
fn a_dump_mid_step_after_complete_steps_is_not_a_leak() {
    let mut t = Torch::new();
    let model = Model::new(12, 8 * MIB);
    for _ in 0..5 {
        iteration(&mut t, &model, false);
    }
    iteration(&mut t, &model, true);
    let snapshot = t.finish();
    let view = ModelView::new(&snapshot);
    assert_eq!(
        view.step_source(),
        &StepSource::Inferred {
            opener: format!("{TRAIN}:55")
        }
    );
    assert_eq!(view.loop_steps().len(), 6);
    let findings = detect(&snapshot, &DetectOptions::default());
    assert!(problems(&findings).is_empty(), "{findings:#?}");
    assert!(
        findings
            .iter()
            .all(|f| f.kind != FindingKind::RetainedPerStep),
        "{findings:#?}"
    );
    assert!(
        findings
            .iter()
            .any(|f| f.summary.starts_with("the forward in progress holds")),
        "{findings:#?}"
    );
}

/// An offloading loader runs 33 model shards inside one forward: each shard's weights are
/// uploaded by a hook under the module call, used and freed. One call of the driving frame is
/// no steps, not 33.
#[test]
fn offloaded_shards_in_one_forward_are_not_steps() {
    let mut t = Torch::new();
    let hooks = "/opt/conda/lib/python3.11/site-packages/accelerate/hooks.py";
    let caller = at(SERVE, 30, "generate");
    let shard_stack = |file_line: (&str, u32, &str)| {
        let mut frames = alloc_frames("_to_copy");
        frames.push(py(file_line.0, file_line.1, file_line.2));
        frames.extend(module_call());
        frames.push(py("/home/user/project/offload.py", 88, "forward"));
        frames.extend(module_call());
        frames.extend(caller.clone());
        frames
    };
    for _ in 0..33 {
        let w = t.alloc(&shard_stack((hooks, 331, "pre_forward")), 64 * MIB);
        let h = t.alloc(
            &shard_stack(("/home/user/project/offload.py", 91, "forward")),
            4 * MIB,
        );
        t.free(w);
        t.free(h);
    }
    let snapshot = t.finish();
    let view = ModelView::new(&snapshot);
    assert_eq!(view.step_source(), &StepSource::None);
    assert!(view.loop_steps().is_empty(), "{:?}", view.steps());
    let findings = detect(&snapshot, &DetectOptions::default());
    assert!(problems(&findings).is_empty(), "{findings:#?}");
}

/// Lightning runs the forward and backward inside `optimizer.step(closure)`: the activations'
/// stacks pass through the optimizer's frames, but the optimizer did not make them, so they
/// are never called optimizer state or expected.
#[test]
fn a_forward_inside_an_optimizer_closure_is_not_optimizer_state() {
    let mut t = Torch::new();
    let model = Model::new(4, 4 * MIB);
    let mut closure = vec![
        py(
            "/opt/conda/lib/python3.11/site-packages/lightning/pytorch/loops/optimization/automatic.py",
            140,
            "closure",
        ),
        torch_py("optim/adamw.py", 200, "step"),
        torch_py("optim/optimizer.py", 485, "wrapper"),
    ];
    closure.extend(at(TRAIN, 70, "fit"));
    let mut kept = Vec::new();
    for step in 0..6 {
        let acts = model.forward(&mut t, &closure);
        if step == 5 {
            // The dump is taken inside the last closure, before backward.
            kept.extend(acts);
        } else {
            model.backward(&mut t, acts);
        }
    }
    let _ = kept;
    let snapshot = t.finish();
    let findings = detect(&snapshot, &DetectOptions::default());
    assert!(problems(&findings).is_empty(), "{findings:#?}");
    for f in &findings {
        assert!(!f.summary.contains("optimizer state"), "{f:#?}");
        assert!(!f.fix.starts_with("expected"), "{f:#?}");
    }
}

/// Step marks in a warm-up only (three marked steps), then a long run without Python (a
/// CUDA-graph replay): the marks are not the steps of the rest, so the trace has no steps,
/// and the report says why.
#[test]
fn marks_covering_only_a_prefix_are_not_steps() {
    let mut t = Trace::new();
    let warm = t.site("train.py", 40, "warmup");
    let replay = t.site("train.py", 52, "run");
    for _ in 0..3 {
        t.step();
        let a = t.alloc(warm, MIB);
        t.free(a, MIB);
    }
    let mut kept = Vec::new();
    for i in 0..200 {
        let a = t.alloc(replay, 4096);
        if i % 10 == 0 {
            kept.push(a);
        } else {
            t.free(a, 4096);
        }
    }
    let snapshot: Snapshot = t.finish();
    let view = ModelView::new(&snapshot);
    match view.step_source() {
        StepSource::PrefixMarks {
            marked_steps,
            covered_events,
            events,
            ..
        } => {
            assert_eq!(*marked_steps, 3);
            assert!(covered_events < events);
        }
        other => panic!("expected marks in a prefix, got {other:?}"),
    }
    assert!(view.loop_steps().is_empty());
    assert!(view.step_source().describe().contains("cover only"));
    let findings = detect(&snapshot, &DetectOptions::default());
    assert!(problems(&findings).is_empty(), "{findings:#?}");

    // Marks that run to the end are the trace's steps.
    let mut t = Trace::new();
    let site = t.site("train.py", 40, "train");
    for _ in 0..6 {
        t.step();
        let a = t.alloc(site, MIB);
        t.free(a, MIB);
    }
    let snapshot = t.finish();
    let view = ModelView::new(&snapshot);
    assert!(matches!(view.step_source(), StepSource::Recorded { .. }));
    assert_eq!(view.loop_steps().len(), 6);
}
