//! Planted leaks shaped like real PyTorch bugs, each beside a clean twin that must stay
//! silent: a kept autograd graph (one finding, at the line that keeps it), an evaluation loop
//! without step marks (steps inferred), sparse leaks (every 3rd, 5th and 10th step), a
//! gradient kept by a backward hook (C++-only stacks, named by autograd node), and three
//! clean patterns that look like growth (a bounded cache, a KV cache freed per sequence,
//! gradient accumulation). The traces come from `common/pytorch_like.rs`, which runs every
//! request through PyTorch's allocation policy and writes PyTorch's stacks.

mod common;

use common::pytorch_like::{
    alloc_frames, backward_stack, module_call, py, stack, torch_py, Model, Torch, MIB,
};
use vramscope_analysis::detect::{detect, DetectOptions, Finding, FindingKind, Severity};
use vramscope_analysis::model_view::{restep, ModelView, StepSource};
use vramscope_model::{Frame, Snapshot};

const TRAIN: &str = "/home/user/project/train.py";
const EVAL: &str = "/home/user/project/evaluate.py";
const CELL: &str = "/tmp/ipykernel_22383/3983704831.py";

/// The outer frames of the training script (outermost last).
fn outer(file: &str) -> Vec<Frame> {
    vec![py(file, 120, "main"), py(file, 124, "<module>")]
}

/// The stack of a loop line of `file` (innermost first).
fn at(file: &str, line: u32, function: &str) -> Vec<Frame> {
    let mut frames = vec![py(file, line, function)];
    frames.extend(outer(file));
    frames
}

/// A stack for an op at a loop line.
fn op_at(op: &str, file: &str, line: u32) -> Vec<Frame> {
    let mut frames = alloc_frames(op);
    frames.extend(at(file, line, "train"));
    frames
}

/// What a planted training loop does wrong.
#[derive(Clone, Copy, Default)]
struct Bugs {
    /// `running_loss = running_loss + loss` keeps every step's graph.
    keep_graph: bool,
    /// `if step % n == 0: history.append(h.detach().clone())`.
    sparse_every: Option<usize>,
    /// A backward hook appends the `MmBackward0` gradient to a list.
    hook_keeps_grad: bool,
    /// Gradient accumulation over this many micro-steps.
    accumulate: usize,
    /// `losses.append(loss)` at line 163 and `scores.append(score)` at line 168: two lists,
    /// two bugs, in the same steps.
    two_lists: bool,
    /// The dump's C++ frames carry files and lines (a conda build's symbolized stacks).
    symbolized: bool,
    /// The loop runs in a Jupyter notebook cell (`/tmp/ipykernel_<pid>/<cell>.py`).
    in_notebook: bool,
}

/// Weights and the optimizer's state, and a training loop of `steps` steps annotated with
/// `Optimizer.step#AdamW.step`.
fn training(steps: usize, bugs: Bugs) -> Snapshot {
    let file = if bugs.in_notebook { CELL } else { TRAIN };
    let mut t = if bugs.symbolized {
        Torch::new().symbolized()
    } else {
        Torch::new()
    };
    let model = Model::new(2, MIB);
    let mut weights_stack = alloc_frames("empty_strided");
    weights_stack.push(torch_py("nn/modules/module.py", 1355, "convert"));
    weights_stack.push(torch_py("nn/modules/module.py", 1340, "to"));
    weights_stack.extend(at(file, 20, "train"));
    let weights: Vec<u64> = (0..4).map(|_| t.alloc(&weights_stack, 8 * MIB)).collect();
    let mut state = Vec::new();
    let mut grads: Vec<u64> = Vec::new();
    let mut kept = Vec::new();
    let micro = bugs.accumulate.max(1);
    for step in 0..steps {
        for m in 0..micro {
            let x = t.alloc(&op_at("_to_copy", file, 55), 3 * MIB);
            let acts = model.forward(&mut t, &at(file, 57, "train"));
            let loss = t.alloc(&op_at("mse_loss", file, 58), 4);
            // The backward pass: gradients of the weights, then of the activations.
            if grads.is_empty() {
                grads = (0..4)
                    .map(|_| t.alloc(&backward_stack("AccumulateGrad"), 8 * MIB))
                    .collect();
            } else {
                // Accumulated in place after a temporary.
                let tmp = t.alloc(&backward_stack("AccumulateGrad"), 8 * MIB);
                t.free(tmp);
            }
            let g = t.alloc(&backward_stack("MmBackward0"), 4 * MIB);
            if bugs.hook_keeps_grad {
                kept.push(g);
            } else {
                t.free(g);
            }
            if bugs.keep_graph {
                let sum = t.alloc(&op_at("add", file, 59), 4);
                kept.push(x);
                kept.extend(acts);
                kept.push(loss);
                kept.push(sum);
            } else {
                model.backward(&mut t, acts);
                t.free(x);
                t.free(loss);
            }
            if bugs.two_lists {
                kept.push(t.alloc(&op_at("mse_loss", file, 163), 2 * MIB));
                let scratch = t.alloc(&op_at("softmax", file, 165), 4 * MIB);
                kept.push(t.alloc(&op_at("argmax", file, 168), MIB));
                t.free(scratch);
            }
            if let Some(n) = bugs.sparse_every {
                if step % n == 0 && m == 0 {
                    kept.push(t.alloc(&op_at("clone", file, 66), 2 * MIB));
                }
            }
        }
        t.annotate("Optimizer.step#AdamW.step", "START");
        let mut step_stack = alloc_frames("zeros_like");
        step_stack.push(torch_py("optim/adamw.py", 180, "_init_group"));
        step_stack.push(torch_py("optim/adamw.py", 230, "step"));
        step_stack.push(torch_py("optim/optimizer.py", 485, "wrapper"));
        step_stack.extend(at(file, 62, "train"));
        if state.is_empty() {
            state = (0..8).map(|_| t.alloc(&step_stack, 8 * MIB)).collect();
        }
        let tmp = t.alloc(&step_stack, 8 * MIB);
        t.free(tmp);
        t.annotate("Optimizer.step#AdamW.step", "END");
        if bugs.accumulate > 1 {
            // zero_grad(set_to_none=True) after each optimizer step.
            for g in grads.drain(..) {
                t.free(g);
            }
        }
    }
    let _ = (weights, state, kept);
    t.finish()
}

fn problems(findings: &[Finding]) -> Vec<&Finding> {
    findings
        .iter()
        .filter(|f| f.severity >= Severity::Warning)
        .collect()
}

fn retained(findings: &[Finding]) -> Vec<&Finding> {
    findings
        .iter()
        .filter(|f| f.kind == FindingKind::RetainedPerStep)
        .collect()
}

fn assert_silent(name: &str, snapshot: &Snapshot) {
    let findings = detect(snapshot, &DetectOptions::default());
    let bad = problems(&findings);
    assert!(bad.is_empty(), "{name}: expected no problem, got {bad:#?}");
    for f in &findings {
        assert!(
            !f.site_label().starts_with("??"),
            "{name}: a finding names {}",
            f.site_label()
        );
    }
}

/// `running_loss = running_loss + loss` keeps every step's graph: the input, the model's
/// activations, the loss and the sum. The sum is the small tensor made last in every step by
/// the loop that calls the model, and the model's activations come from the forward under that
/// same loop: one finding, at the line that makes and keeps the sum, with the graph's bytes as
/// what it keeps.
#[test]
fn a_kept_loss_with_its_graph_is_one_finding_at_its_line() {
    let snapshot = training(
        12,
        Bugs {
            keep_graph: true,
            ..Bugs::default()
        },
    );
    let view = ModelView::new(&snapshot);
    assert_eq!(
        view.step_source(),
        &StepSource::Recorded {
            label: "Optimizer.step#AdamW.step".to_string()
        }
    );
    let findings = detect(&snapshot, &DetectOptions::default());
    let leaks = retained(&findings);
    assert_eq!(leaks.len(), 1, "{leaks:#?}");
    let leak = leaks[0];
    assert_eq!(leak.site_label(), format!("{TRAIN}:59"));
    // Eleven of the twelve iterations outlived a completed step; each keeps the input, six
    // activations, the loss and the sum.
    assert_eq!(leak.count, 11 * 9);
    assert!(leak.bytes >= 11 * (3 + 6) * MIB, "{leak:#?}");
    assert_eq!(leak.bytes, leak.sites.iter().map(|s| s.bytes).sum::<u64>());
    assert!(
        leak.summary
            .contains(&format!("the model's tensors under {TRAIN}:57")),
        "{}",
        leak.summary
    );
    assert!(
        leak.summary.contains(&format!("{TRAIN}:55")),
        "{}",
        leak.summary
    );
    assert!(leak.summary.contains("keeps its graph"), "{}", leak.summary);
    assert!(leak.fix.contains("item()"), "{}", leak.fix);
    assert!(!leak.fix.contains("no_grad"), "{}", leak.fix);
    assert_eq!(problems(&findings).len(), 1, "{findings:#?}");
}

/// The same kept loss, run in a notebook cell: every line the finding names is a cell and a
/// line, never the kernel's temporary file (issue 42, item 7).
#[test]
fn a_kept_loss_in_a_notebook_cell_is_named_by_cell_and_line() {
    let snapshot = training(
        12,
        Bugs {
            keep_graph: true,
            in_notebook: true,
            ..Bugs::default()
        },
    );
    let findings = detect(&snapshot, &DetectOptions::default());
    let leaks = retained(&findings);
    assert_eq!(leaks.len(), 1, "{leaks:#?}");
    let leak = leaks[0];
    let text = format!("{} {}", leak.summary, leak.fix);
    assert!(text.contains("notebook cell 3983704831, line 57"), "{text}");
    assert!(!text.contains("ipykernel_"), "{text}");
}

/// An evaluation loop keeps a metric from a helper (`metrics.append(mse(out, y))`, where `mse`
/// returns `v.mean()`): the mean keeps `v` and the model's output through its graph. One
/// finding, at the loop line that calls the helper and keeps its result, made at the helper's
/// `v.mean()` line.
#[test]
fn a_metric_from_a_helper_kept_with_its_graph_is_one_finding() {
    let metrics = "/home/user/project/metrics.py";
    let mut t = Torch::new();
    let model = Model::new(2, MIB);
    let mut kept = Vec::new();
    for _ in 0..10 {
        let x = t.alloc(&op_at("_to_copy", EVAL, 55), MIB);
        let acts = model.forward(&mut t, &at(EVAL, 57, "evaluate"));
        let helper = |line: u32, op: &str| {
            let mut frames = alloc_frames(op);
            frames.push(py(metrics, line, "mse"));
            frames.extend(at(EVAL, 70, "evaluate"));
            frames
        };
        let v = t.alloc(&helper(11, "pow"), 2 * MIB);
        let mean = t.alloc(&helper(12, "mean"), 4);
        kept.extend(acts);
        kept.push(v);
        kept.push(mean);
        t.free(x);
    }
    let _ = kept;
    let snapshot = t.finish();
    let findings = detect(&snapshot, &DetectOptions::default());
    let leaks = retained(&findings);
    assert_eq!(leaks.len(), 1, "{leaks:#?}");
    let leak = leaks[0];
    assert_eq!(leak.site_label(), format!("{EVAL}:70"));
    assert_eq!(
        leak.made_at.as_deref(),
        Some(format!("{metrics}:12").as_str())
    );
    assert!(
        leak.summary
            .contains(&format!("the model's tensors under {EVAL}:57"))
            && leak.summary.contains(&format!("{metrics}:11")),
        "{}",
        leak.summary
    );
    assert_eq!(problems(&findings).len(), 1, "{findings:#?}");
}

/// Two lists filled in the same steps are two bugs: a user who fixes one still leaks at the
/// other, so each is a finding at its own line with its own bytes.
#[test]
fn two_lists_in_the_same_steps_are_two_findings() {
    for symbolized in [false, true] {
        let snapshot = training(
            10,
            Bugs {
                two_lists: true,
                symbolized,
                ..Bugs::default()
            },
        );
        let findings = detect(&snapshot, &DetectOptions::default());
        let leaks = retained(&findings);
        assert_eq!(leaks.len(), 2, "{leaks:#?}");
        let at = |line: u32| {
            leaks
                .iter()
                .find(|f| f.site_label() == format!("{TRAIN}:{line}"))
                .unwrap_or_else(|| panic!("a finding at {line}: {leaks:#?}"))
        };
        // Nine of the ten iterations outlived a completed step (the last lives only into
        // the optimizer step in progress at the dump).
        assert_eq!(at(163).bytes, 9 * 2 * MIB);
        assert_eq!(at(163).count, 9);
        assert_eq!(at(168).bytes, 9 * MIB);
        assert_eq!(at(168).count, 9);
        assert_eq!(
            at(168).made_at.as_deref(),
            Some(format!("{TRAIN}:168").as_str())
        );
        assert_eq!(problems(&findings).len(), 2, "{findings:#?}");
    }
}

#[test]
fn the_clean_training_loop_is_silent() {
    assert_silent("clean training", &training(12, Bugs::default()));
}

/// An evaluation loop without annotations or an optimizer: `outputs.append(model(x))` keeps
/// each step's graph when `keep` is set, else the output goes to the host.
fn evaluation(steps: usize, keep: bool) -> Snapshot {
    let mut t = Torch::new();
    let model = Model::new(3, 2 * MIB);
    let mut weights_stack = alloc_frames("empty_strided");
    weights_stack.push(torch_py("nn/modules/module.py", 1340, "to"));
    weights_stack.extend(at(EVAL, 40, "evaluate"));
    let _weights: Vec<u64> = (0..6).map(|_| t.alloc(&weights_stack, 4 * MIB)).collect();
    let mut kept = Vec::new();
    for _ in 0..steps {
        let x = t.alloc(&op_at("_to_copy", EVAL, 55), MIB);
        let caller = at(EVAL, 57, "evaluate");
        let acts = model.forward(&mut t, &caller);
        if keep {
            kept.extend(acts);
        } else {
            // `out.cpu()`: the graph goes with the output.
            for a in acts {
                t.free(a);
            }
        }
        t.free(x);
    }
    let _ = kept;
    t.finish()
}

#[test]
fn an_eval_loop_without_marks_gets_inferred_steps_and_one_finding() {
    let snapshot = evaluation(10, true);
    let view = ModelView::new(&snapshot);
    assert_eq!(
        view.step_source(),
        &StepSource::Inferred {
            opener: format!("{EVAL}:55")
        }
    );
    assert_eq!(view.loop_steps().len(), 10);
    let findings = detect(&snapshot, &DetectOptions::default());
    let leaks = retained(&findings);
    assert_eq!(leaks.len(), 1, "{leaks:#?}");
    assert_eq!(leaks[0].site_label(), format!("{EVAL}:57"));
    assert_eq!(leaks[0].sites.len(), 3);
    // Steps 1 to 8 outlived a completed step; step 9 only into step 10, in progress.
    assert_eq!(leaks[0].count, 8 * 9);
    assert_eq!(
        leaks[0].made_at.as_deref(),
        Some("/home/user/project/model.py:31")
    );
    assert_eq!(
        leaks[0]
            .frames
            .first()
            .map(|f| f.starts_with(&format!("{EVAL}:57"))),
        Some(true)
    );
    assert!(
        leaks[0].summary.contains(&format!(
            "made in forward at /home/user/project/model.py:31, kept through {EVAL}:57"
        )),
        "{}",
        leaks[0].summary
    );
}

/// A model nested two modules deep (`Model.forward` at line 201 calls `Block.forward`), called
/// from the evaluation loop: the finding names the loop line, never the model's own lines,
/// and says where the memory was made.
#[test]
fn a_leak_through_a_nested_model_names_the_loop_line() {
    for symbolized in [false, true] {
        let mut t = if symbolized {
            Torch::new().symbolized()
        } else {
            Torch::new()
        };
        let model = "/home/user/project/model.py";
        let mut kept = Vec::new();
        for _ in 0..8 {
            let x = t.alloc(&op_at("_to_copy", EVAL, 55), MIB);
            for (line, bytes) in [(120, 2 * MIB), (121, 4 * MIB), (140, MIB)] {
                let mut frames = alloc_frames("addmm");
                frames.push(torch_py("nn/modules/linear.py", 125, "forward"));
                frames.extend(module_call());
                frames.push(py(model, line, "forward"));
                frames.extend(module_call());
                frames.push(py(model, 201, "forward"));
                frames.extend(module_call());
                frames.extend(at(EVAL, 57, "evaluate"));
                kept.push(t.alloc(&frames, bytes));
            }
            t.free(x);
        }
        let snapshot = t.finish();
        let findings = detect(&snapshot, &DetectOptions::default());
        let leaks = retained(&findings);
        assert_eq!(leaks.len(), 1, "{leaks:#?}");
        let leak = leaks[0];
        assert_eq!(leak.site_label(), format!("{EVAL}:57"));
        // Made under the model's own `forward` line that every stack shares.
        assert_eq!(
            leak.made_at.as_deref(),
            Some(format!("{model}:201").as_str())
        );
        // Eight steps, of which the last is in progress at the dump and the one before it
        // outlived no completed step: six retain.
        assert_eq!(leak.bytes, 6 * 7 * MIB);
        assert_eq!(leak.count, 6 * 3);
        assert!(
            leak.frames
                .iter()
                .any(|f| f.starts_with(&format!("{model}:201"))),
            "{:?}",
            leak.frames
        );
        assert!(
            leak.fix.starts_with(&format!("at {EVAL}:57")),
            "{}",
            leak.fix
        );
        for f in problems(&findings) {
            assert!(!f.site_label().contains("model.py"), "{f:#?}");
        }
    }
}

/// A list kept inside the model (`self.cache.append(h)` in `forward`) leaks from one line:
/// that line is the one to change, not the loop line that called the model.
#[test]
fn a_list_inside_the_model_names_its_own_line() {
    let mut t = Torch::new();
    let model = "/home/user/project/model.py";
    for _ in 0..8 {
        let x = t.alloc(&op_at("_to_copy", EVAL, 55), MIB);
        let mut frames = alloc_frames("clone");
        frames.push(py(model, 150, "forward"));
        frames.extend(module_call());
        frames.extend(at(EVAL, 57, "evaluate"));
        t.alloc(&frames, 2 * MIB);
        t.free(x);
    }
    let findings = detect(&t.finish(), &DetectOptions::default());
    let leaks = retained(&findings);
    assert_eq!(leaks.len(), 1, "{leaks:#?}");
    assert_eq!(leaks[0].site_label(), format!("{model}:150"));
    // Six of the eight steps outlived a completed step.
    assert_eq!(leaks[0].bytes, 12 * MIB);
}

#[test]
fn the_clean_eval_loop_is_silent() {
    let snapshot = evaluation(10, false);
    assert!(matches!(
        ModelView::new(&snapshot).step_source(),
        StepSource::Inferred { .. }
    ));
    assert_silent("clean eval", &snapshot);
}

#[test]
fn a_step_marker_may_be_an_annotation_name() {
    let mut snapshot = training(6, Bugs::default());
    let steps = restep(&mut snapshot, "Optimizer.step#AdamW.step").expect("steps");
    assert_eq!(steps, 6);
    assert_eq!(ModelView::new(&snapshot).loop_steps().len(), 6);
}

#[test]
fn a_step_marker_that_matches_nothing_lists_the_candidates() {
    let mut snapshot = training(4, Bugs::default());
    let error = restep(&mut snapshot, "training_step").expect_err("no such marker");
    assert!(
        error
            .candidates
            .contains(&"Optimizer.step#AdamW.step".to_string()),
        "{error}"
    );
    assert!(error.candidates.contains(&"train".to_string()), "{error}");
    assert!(error.to_string().contains("training_step"));
    // A function of the stacks works too: the model's `forward` runs once per step.
    let mut eval = evaluation(5, false);
    assert_eq!(restep(&mut eval, "forward"), Ok(5));
}

#[test]
fn sparse_leaks_are_found_at_their_line() {
    for every in [3usize, 5, 10] {
        let steps = 4 * every;
        let snapshot = training(
            steps,
            Bugs {
                sparse_every: Some(every),
                ..Bugs::default()
            },
        );
        let findings = detect(&snapshot, &DetectOptions::default());
        let leaks = retained(&findings);
        assert_eq!(leaks.len(), 1, "every {every}: {findings:#?}");
        assert_eq!(
            leaks[0].site_label(),
            format!("{TRAIN}:66"),
            "every {every}"
        );
        assert_eq!(leaks[0].count, 4, "every {every}");
        assert_eq!(
            leaks[0]
                .evidence
                .get("retention_period_steps")
                .map(|v| v.to_string()),
            Some(every.to_string())
        );
        assert_eq!(problems(&findings).len(), 1, "every {every}: {findings:#?}");
    }
}

#[test]
fn a_gradient_kept_by_a_backward_hook_is_named_by_its_autograd_node() {
    for symbolized in [false, true] {
        let snapshot = training(
            10,
            Bugs {
                hook_keeps_grad: true,
                symbolized,
                ..Bugs::default()
            },
        );
        let findings = detect(&snapshot, &DetectOptions::default());
        let leaks = retained(&findings);
        assert_eq!(leaks.len(), 1, "{findings:#?}");
        assert_eq!(leaks[0].site_label(), "MmBackward0 (backward)");
        // Ten iterations; the tenth's gradient lives only into the last step (the optimizer
        // step in progress at the dump), which proves nothing.
        assert_eq!(leaks[0].count, 9);
        assert_eq!(leaks[0].bytes, 36 * MIB);
        assert_eq!(leaks[0].severity, Severity::Error);
        assert_no_compiled_site(&snapshot, &findings);
    }
}

/// No finding, site of a finding, or call-site group of the view is a C, C++ or CUDA file.
fn assert_no_compiled_site(snapshot: &Snapshot, findings: &[Finding]) {
    let compiled = |label: &str| {
        let file = label.rsplit_once(':').map_or(label, |(f, _)| f);
        [".cc", ".cpp", ".cu", ".h", ".c"]
            .iter()
            .any(|e| file.ends_with(e))
            || label.starts_with("??")
    };
    for f in findings {
        assert!(!compiled(f.site_label()), "{f:#?}");
        for s in &f.sites {
            assert!(!compiled(&s.site), "{f:#?}");
        }
    }
    let view = ModelView::new(snapshot);
    for g in view.groups() {
        assert!(!compiled(g.label()), "group {}", g.label());
    }
}

#[test]
fn a_symbolized_clean_training_loop_is_silent_and_names_no_cpp_file() {
    let snapshot = training(
        12,
        Bugs {
            symbolized: true,
            ..Bugs::default()
        },
    );
    assert_silent("symbolized clean training", &snapshot);
    assert_no_compiled_site(&snapshot, &detect(&snapshot, &DetectOptions::default()));
    let view = ModelView::new(&snapshot);
    assert!(view
        .groups()
        .iter()
        .any(|g| g.label() == "AccumulateGrad (backward)"));
}

/// A cache that gains one entry for each new sequence length in the first `growing` steps,
/// then is only read for `flat` steps; and a training step around it.
fn bounded_cache(growing: usize, flat: usize) -> Snapshot {
    let mut t = Torch::new();
    let model = Model::new(1, MIB);
    let mut cache = Vec::new();
    for step in 0..growing + flat {
        if step < growing {
            let mut frames = alloc_frames("cos");
            frames.push(py("/home/user/project/model.py", 80, "rope_cache"));
            frames.extend(at(TRAIN, 56, "train"));
            cache.push(t.alloc(&frames, 2 * MIB));
        }
        let acts = model.forward(&mut t, &at(TRAIN, 57, "train"));
        model.backward(&mut t, acts);
        t.annotate("Optimizer.step#AdamW.step", "START");
        t.annotate("Optimizer.step#AdamW.step", "END");
    }
    let _ = cache;
    t.finish()
}

#[test]
fn bounded_growth_is_not_a_leak() {
    assert_silent("bounded cache", &bounded_cache(8, 32));
}

/// Generation of `sequences` sequences of `tokens` tokens: the KV cache grows one block per
/// token and is freed at the end of its sequence.
fn kv_cache(sequences: usize, tokens: usize) -> Snapshot {
    let mut t = Torch::new();
    for _ in 0..sequences {
        let mut kv = Vec::new();
        for _ in 0..tokens {
            let logits = t.alloc(&op_at("addmm", EVAL, 71), 256 * 1024);
            let mut frames = alloc_frames("cat");
            frames.push(py("/home/user/project/model.py", 140, "update_kv"));
            frames.extend(at(EVAL, 72, "generate"));
            kv.push(t.alloc(&frames, MIB));
            t.free(logits);
        }
        for block in kv {
            t.free(block);
        }
    }
    t.finish()
}

#[test]
fn a_kv_cache_freed_per_sequence_is_clean() {
    assert_silent("kv cache", &kv_cache(5, 12));
}

#[test]
fn gradient_accumulation_is_clean() {
    assert_silent(
        "accumulation",
        &training(
            10,
            Bugs {
                accumulate: 4,
                ..Bugs::default()
            },
        ),
    );
}

/// AdamW state created over the first three steps as layers unfreeze, and gradients made on
/// the autograd thread: the holders say what the stacks show (optimizer state, gradients) and
/// call that memory expected, never "activations" to "free once used"; nothing is a leak.
#[test]
fn optimizer_state_made_across_steps_is_named_by_its_stacks() {
    let mut t = Torch::new();
    let mut state_stack = alloc_frames("zeros_like");
    state_stack.push(torch_py("optim/adamw.py", 180, "_init_group"));
    state_stack.push(torch_py("optim/adamw.py", 230, "step"));
    state_stack.extend(at(TRAIN, 62, "train"));
    let mut kept = Vec::new();
    for step in 0..8 {
        let x = t.alloc(&op_at("_to_copy", TRAIN, 55), MIB);
        if step < 3 {
            kept.push(t.alloc(&backward_stack("AccumulateGrad"), 4 * MIB));
        }
        t.annotate("Optimizer.step#AdamW.step", "START");
        if step < 3 {
            kept.push(t.alloc(&state_stack, 8 * MIB));
            kept.push(t.alloc(&state_stack, 8 * MIB));
        }
        t.annotate("Optimizer.step#AdamW.step", "END");
        t.free(x);
    }
    let snapshot = t.finish();
    let findings = detect(&snapshot, &DetectOptions::default());
    assert!(problems(&findings).is_empty(), "{findings:#?}");
    let holders: Vec<&Finding> = findings
        .iter()
        .filter(|f| f.kind == FindingKind::TopHolders)
        .collect();
    let spread = holders
        .iter()
        .find(|f| f.summary.contains("across steps"))
        .expect("memory made across steps");
    assert!(
        spread.summary.contains("optimizer state"),
        "{}",
        spread.summary
    );
    assert!(spread.summary.contains("gradients"), "{}", spread.summary);
    assert!(
        !spread.summary.contains("activations"),
        "{}",
        spread.summary
    );
    assert!(spread.fix.starts_with("expected"), "{}", spread.fix);
    assert!(!spread.fix.contains("free it once"), "{}", spread.fix);
}

/// Six 3 MiB requests that each take a whole 4 MiB free block (the 1 MiB left is too small to
/// split off), each beside a 4 MiB block allocated with it: `(kept, pinned)` addresses.
fn unsplit_blocks(t: &mut Torch) -> (Vec<u64>, Vec<u64>) {
    let mut kept = Vec::new();
    let mut pinned = Vec::new();
    for k in 0..6u64 {
        let four = t.alloc(&op_at("empty", TRAIN, 19), 4 * MIB);
        pinned.push(t.alloc(&op_at("empty", TRAIN, 21), 4 * MIB));
        t.free(four);
        kept.push(t.alloc(&op_at("empty", TRAIN, 20), 3 * MIB + k * 4096));
    }
    (kept, pinned)
}

/// `full` as a recording that started at its first allocation at line 55: the events before
/// it dropped, and the index of that allocation in `full`.
fn recorded_from_line_55(full: &Snapshot) -> (Snapshot, usize) {
    let start = full
        .events
        .iter()
        .position(|e| {
            e.kind == vramscope_model::EventKind::Alloc
                && full.sites[e.site().unwrap() as usize].line == 55
        })
        .unwrap();
    let mut late = full.clone();
    late.events = full.events.iter().skip(start).cloned().collect();
    (late, start)
}

/// `snapshot` written as a PyTorch pickle, whose trace entries carry requested sizes only,
/// and read back.
fn through_pickle(snapshot: &Snapshot) -> Snapshot {
    let export = vramscope_export::export_pytorch(snapshot, None).expect("export");
    vramscope_import::load_bytes(
        &export.bytes,
        "late.pickle",
        &vramscope_import::ImportOptions::default(),
    )
    .expect("import")
}

/// A recording started late: the memory from before it is the start state, and its baseline
/// is the allocated bytes the device held when the recording began, counted in blocks (a
/// 3 MiB request takes a 4 MiB block when its segment's remainder is too small to split).
#[test]
fn a_late_recording_starts_from_the_blocks_it_finds() {
    let mut t = Torch::new();
    let (kept, _pinned) = unsplit_blocks(&mut t);
    for _ in 0..6 {
        let x = t.alloc(&op_at("_to_copy", TRAIN, 55), 2 * MIB);
        t.free(x);
    }
    // Free half of the early blocks inside the recorded part.
    for &b in kept.iter().take(3) {
        t.free(b);
    }
    let full = t.finish();
    let (late, start) = recorded_from_line_55(&full);
    let truth = ModelView::new(&full).usage_at(start as u32 - 1).0;
    assert_eq!(ModelView::new(&late).baseline_allocated(), truth);
    let back = through_pickle(&late);
    assert_eq!(ModelView::new(&back).baseline_allocated(), truth);
    let report = vramscope_analysis::report::build_report(&back, &Default::default());
    assert_eq!(
        report.stats.baseline_estimated_blocks, 0,
        "the dump shows them"
    );

    // When the neighbours go too, the freed blocks merge and the dump no longer shows them:
    // their sizes are estimates, and the report says so.
    let mut t = Torch::new();
    let (kept, pinned) = unsplit_blocks(&mut t);
    let x = t.alloc(&op_at("_to_copy", TRAIN, 55), 2 * MIB);
    t.free(x);
    for b in kept.into_iter().chain(pinned) {
        t.free(b);
    }
    let (late, _) = recorded_from_line_55(&t.finish());
    let back = through_pickle(&late);
    let report = vramscope_analysis::report::build_report(&back, &Default::default());
    // The six kept blocks and their six neighbours: none is shown by the dump, but the
    // segment at the start leaves each one size (a kept block's 1 MiB remainder is too
    // small to be a block of its own; each neighbour is followed by the next kept block)
    // except the last neighbour, followed by free memory that it may have been handed whole.
    assert_eq!(report.stats.baseline_estimated_blocks, 1);
    // The report counts from its view's start state; the walk back to the start on its own
    // finds the same state, and so the same count.
    assert_eq!(vramscope_replay::estimated_before_trace_blocks(&back), 1);
    let view = ModelView::new(&back);
    assert_eq!(
        *view.start_state(),
        vramscope_engine::Reconstruction::start_of(&back)
    );
    let text = vramscope_render::render_text(&report, false);
    assert!(
        text.contains("is an estimate: 1 block from before it"),
        "{text}"
    );
}

/// A recording that began at step 6 of a run whose early blocks PyTorch made larger than
/// their requests: a 3 MiB request that took a freed 4 MiB block whole (the 1 MiB left is
/// too little to split off), and a 31.25 MiB request in its own 32 MiB segment, unsplit (the
/// 0.75 MiB left is too little). The recorded part frees both and then the cache, so the
/// dump shows neither: only the segments around them at the start say their sizes.
fn began_at_step_6() -> (Snapshot, u64) {
    let mut t = Torch::new();
    let mut weights_stack = alloc_frames("empty_strided");
    weights_stack.extend(at(TRAIN, 20, "train"));
    let _weights = t.alloc(&weights_stack, 8 * MIB);
    let four = t.alloc(&op_at("empty", TRAIN, 30), 4 * MIB);
    let pinned = t.alloc(&op_at("empty", TRAIN, 31), 4 * MIB);
    t.free(four);
    let three = t.alloc(&op_at("empty", TRAIN, 32), 3 * MIB);
    // The rest of the segment, kept to the end: the neighbour's room is its request.
    let _tail = t.alloc(&op_at("empty", TRAIN, 34), 4 * MIB);
    let big = t.alloc(&op_at("empty", TRAIN, 33), 31 * MIB + MIB / 4);
    for step in 0..10 {
        t.annotate("Optimizer.step#AdamW.step", "START");
        let line = if step == 6 { 56 } else { 55 };
        let x = t.alloc(&op_at("_to_copy", TRAIN, line), 2 * MIB);
        t.free(x);
        if step == 7 {
            for b in [three, pinned, big] {
                t.free(b);
            }
        }
        if step == 8 {
            t.empty_cache(&at(TRAIN, 70, "train"));
        }
        t.annotate("Optimizer.step#AdamW.step", "END");
    }
    let full = t.finish();
    let cut = full
        .events
        .iter()
        .position(|e| {
            e.kind == vramscope_model::EventKind::Alloc
                && full.sites[e.site().unwrap() as usize].line == 56
        })
        .unwrap();
    let truth = ModelView::new(&full).usage_at(cut as u32 - 1).0;
    let mut late = full.clone();
    late.events = full.events.iter().skip(cut).cloned().collect();
    (late, truth)
}

#[test]
fn a_late_recordings_blocks_are_sized_by_pytorchs_rule() {
    let (late, truth) = began_at_step_6();
    // 8 MiB of weights, the 4 MiB neighbour, the 3 MiB request's 4 MiB block, the 4 MiB
    // tail and the 31.25 MiB request's 32 MiB segment.
    assert_eq!(truth, (8 + 4 + 4 + 4 + 32) * MIB);
    let back = through_pickle(&late);
    assert_eq!(ModelView::new(&back).baseline_allocated(), truth);
    let report = vramscope_analysis::report::build_report(&back, &Default::default());
    assert_eq!(report.stats.baseline_allocated_bytes, truth);
    assert_eq!(
        report.stats.baseline_estimated_blocks, 0,
        "the segments around them leave one size each"
    );
    let text = vramscope_render::render_text(&report, false);
    assert!(!text.contains("is an estimate"), "{text}");
}

/// The project of the compiled model: every user site lies under this long directory.
const PROJECT: &str = "/mnt/data3/alice/CurProject/src";

/// A `torch.compile`d model called from a loop in `PROJECT`: each step's activations are
/// made in TorchInductor's generated wrapper (`/tmp/torchinductor_alice/...py`), called
/// from an FX graph's code (`<eval_with_key>.12`) under `model.py`'s `forward`; the loop
/// keeps a small tensor of each step at `train.py:163`. Weights come from a notebook cell.
fn compiled_from_a_project() -> Snapshot {
    let mut t = Torch::new();
    let train = format!("{PROJECT}/train.py");
    let model = format!("{PROJECT}/model.py");
    let mut cell = alloc_frames("empty_strided");
    cell.push(py("/tmp/ipykernel_22383/3983704831.py", 5, "<module>"));
    cell.push(torch_py(
        "../IPython/core/interactiveshell.py",
        3577,
        "run_code",
    ));
    let _weights = t.alloc(&cell, 16 * MIB);
    let mut generated = alloc_frames("empty_strided");
    generated.push(py(
        "/tmp/torchinductor_alice/7q/c7qwhx5lfkqv2nbgx3zjnm.py",
        53,
        "call",
    ));
    generated.push(torch_py("_inductor/output_code.py", 460, "__call__"));
    generated.push(py("<eval_with_key>.12", 5, "forward"));
    generated.push(torch_py("fx/graph_module.py", 784, "__call__"));
    generated.push(py("<string>", 1, "<lambda>"));
    generated.push(py(&model, 88, "forward"));
    generated.extend(module_call());
    generated.push(py(&train, 57, "train"));
    generated.push(py(&train, 300, "<module>"));
    let kept_stack = stack(
        &alloc_frames("mean"),
        &[py(&train, 163, "train"), py(&train, 300, "<module>")],
    );
    let mut kept = Vec::new();
    for _ in 0..8 {
        t.annotate("Optimizer.step#AdamW.step", "START");
        let acts: Vec<u64> = (0..3).map(|_| t.alloc(&generated, 8 * MIB)).collect();
        kept.push(t.alloc(&kept_stack, 2 * MIB));
        for a in acts {
            t.free(a);
        }
        t.annotate("Optimizer.step#AdamW.step", "END");
    }
    t.finish()
}

#[test]
fn generated_code_and_notebook_cells_are_named_as_users_read_them() {
    let snapshot = compiled_from_a_project();
    let report = vramscope_analysis::report::build_report(&snapshot, &Default::default());
    let labels: Vec<&str> = report
        .findings
        .iter()
        .filter_map(|f| f.site.as_deref())
        .chain(report.top_sites.iter().map(|t| t.label.as_str()))
        .collect();
    assert!(!labels.is_empty());
    for label in &labels {
        assert!(
            !label.contains("torchinductor")
                && !label.contains('<')
                && !label.contains("ipykernel"),
            "{labels:?}"
        );
    }
    // The generated wrapper's memory is named at the user's frame that calls it.
    let peak = &report.top_sites;
    assert!(
        peak.iter()
            .any(|t| t.label == format!("{PROJECT}/model.py:88")),
        "{labels:?}"
    );
    assert!(
        labels.contains(&"notebook cell 3983704831, line 5"),
        "{labels:?}"
    );
    // The text says the long directory once and the sites relative to it; the JSON keeps
    // the full paths.
    let text = vramscope_render::render_text(&report, false);
    assert!(
        text.contains(&format!(
            "sites are under {PROJECT}/ and shown relative to it"
        )),
        "{text}"
    );
    assert_eq!(text.matches(PROJECT).count(), 1, "{text}");
    assert!(text.contains(" model.py:88"), "{text}");
    let markdown = vramscope_render::render_markdown(&report);
    assert!(markdown.contains("model.py:88"), "{markdown}");
    assert_eq!(markdown.matches("CurProject").count(), 1, "{markdown}");
    let json = vramscope_render::render_json(&report);
    assert!(json.contains(&format!("{PROJECT}/model.py:88")), "{json}");
}
