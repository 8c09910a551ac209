//! Tests of the planted cases themselves: every block has its truth, the truth adds up to the
//! engine's allocated bytes at every moment, and each case holds what it says it holds, with
//! stacks shaped as PyTorch records them.

use proptest::prelude::*;
use vramscope_engine::Reconstruction;
use vramscope_model::{BlockState, Category, CategoryBytes, EventKind, Snapshot};

use super::cases::{self, Shape, STEP_ANNOTATION};
use super::frames::{MODEL, TRAIN};
use super::{BlockKey, Planted, StackMode};

use crate::MIB;

/// Checks what every planted case must hold; returns the truth after each event.
fn check_consistent(case: &Planted) -> Vec<CategoryBytes> {
    let snap = &case.snapshot;
    let name = &case.name;
    // Every allocation has a truth, and the truth names nothing else.
    let allocs: Vec<usize> = snap
        .events
        .iter()
        .enumerate()
        .filter(|(_, e)| e.kind == EventKind::Alloc)
        .map(|(i, _)| i)
        .collect();
    let known: Vec<usize> = case.truth.allocs.keys().copied().collect();
    assert_eq!(known, allocs, "{name}: a truth for every allocation");
    for &i in case.truth.allocs.keys() {
        assert!(case.truth.category(BlockKey::Alloc(i)).is_some());
    }
    assert!(
        case.truth
            .hidden
            .iter()
            .all(|i| case.truth.allocs.contains_key(i)),
        "{name}: a hidden block is an allocation"
    );
    assert!(
        case.truth
            .allocs
            .values()
            .all(|&c| c != Category::BeforeTrace && c != Category::Unknown),
        "{name}: an allocation in the trace is never before-trace or unknown"
    );
    // The truth adds up to the engine's allocated bytes at the start and after every event.
    let walk = Reconstruction::from_snapshot(snap);
    assert!(walk.disagreements.is_empty(), "{name}: a consistent trace");
    assert_eq!(
        case.truth.at_start().total(),
        walk.start.allocated,
        "{name}: at the start"
    );
    let series = case.truth.after_each(snap);
    assert_eq!(series.len(), snap.events.len());
    for (i, bytes) in series.iter().enumerate() {
        assert_eq!(
            bytes.total(),
            walk.usage_at(i + 1).allocated,
            "{name}: after event {i} ({:?})",
            snap.events[i].kind
        );
    }
    // The blocks live at the end are the segments' allocated blocks.
    let mut at_end: Vec<(u64, u64)> = snap
        .segments
        .iter()
        .flat_map(|s| &s.blocks)
        .filter(|b| b.state == BlockState::ActiveAllocated)
        .map(|b| (b.address, b.size))
        .collect();
    at_end.sort_unstable();
    let live: Vec<(u64, u64)> = case
        .truth
        .live_at_end(snap)
        .iter()
        .map(|&(_, addr, size, _)| (addr, size))
        .collect();
    assert_eq!(live, at_end, "{name}: the live blocks at the end");
    // Steps and times as the importer gives them.
    assert!(snap
        .events
        .iter()
        .enumerate()
        .all(|(i, e)| e.seq == i as u64));
    assert!(snap.events.windows(2).all(|w| w[0].time_ns < w[1].time_ns));
    assert!(snap.steps.windows(2).all(|w| w[0].seq <= w[1].seq));
    series
}

/// Bytes per category at the end of a case.
fn at_end(case: &Planted) -> CategoryBytes {
    case.truth
        .live_at_end(&case.snapshot)
        .into_iter()
        .map(|(_, _, size, category)| (category, size))
        .collect()
}

/// The bytes of the default model's parameters (each a block of its own size: both sizes
/// are multiples of 512).
fn param_bytes() -> u64 {
    let shape = Shape::default();
    shape.layers as u64 * (shape.weight + shape.bias)
}

#[test]
fn every_case_is_consistent_in_both_stack_modes() {
    for mode in [StackMode::All, StackMode::Python] {
        for case in cases::all_cases(mode) {
            check_consistent(&case);
        }
    }
}

#[test]
fn a_training_run_ends_with_parameters_gradients_and_optimizer_state() {
    let case = cases::adamw_training(StackMode::All, 3);
    let series = check_consistent(&case);
    let end = at_end(&case);
    let params = param_bytes();
    assert_eq!(end[Category::Parameters], params);
    assert_eq!(end[Category::Gradients], params);
    assert_eq!(end[Category::OptimizerState], 2 * params);
    assert_eq!(end.total(), 4 * params, "nothing else outlives the step");
    assert_eq!(series.last(), Some(&end));
    // Three steps, numbered from the optimizer's annotations.
    assert_eq!(case.snapshot.steps.len(), 3);
    assert!(case
        .snapshot
        .steps
        .iter()
        .all(|s| s.label == STEP_ANNOTATION));
    // At the peak of activations every layer's two are live, and the loss's saved
    // `log_softmax` (a quarter of one).
    let most = series.iter().map(|b| b[Category::Activations]).max();
    assert_eq!(most, Some(2 * 4 * 8 * MIB + 2 * MIB));
    // Every category the program makes is there at some moment.
    for category in [
        Category::Activations,
        Category::Temporaries,
        Category::Inputs,
    ] {
        assert!(series.iter().any(|b| b[category] > 0), "{category}");
    }
}

#[test]
fn gradient_accumulation_makes_gradients_once_per_step() {
    let case = cases::gradient_accumulation(StackMode::All, 2, 3);
    check_consistent(&case);
    let grads = case
        .truth
        .allocs
        .values()
        .filter(|&&c| c == Category::Gradients)
        .count();
    // Two steps, each making every parameter's gradient once (8 parameters).
    assert_eq!(grads, 2 * 8);
    assert_eq!(at_end(&case)[Category::Gradients], param_bytes());
}

/// Whether the event at `i` lies inside an `Optimizer.step` annotation's window.
fn in_step_window(snap: &Snapshot, i: usize) -> bool {
    let t = snap.events[i].time_ns;
    let starts = snap
        .annotations
        .iter()
        .filter(|a| a.name == STEP_ANNOTATION && a.stage == "START");
    let ends = snap
        .annotations
        .iter()
        .filter(|a| a.name == STEP_ANNOTATION && a.stage == "END");
    starts
        .zip(ends)
        .any(|(s, e)| s.time_ns <= t && t <= e.time_ns)
}

#[test]
fn a_closure_makes_activations_and_gradients_inside_the_optimizer_step() {
    let case = cases::step_with_closure(StackMode::All, 2);
    check_consistent(&case);
    let snap = &case.snapshot;
    let inside: Vec<Category> = case
        .truth
        .allocs
        .iter()
        .filter(|(&i, _)| in_step_window(snap, i))
        .map(|(_, &c)| c)
        .collect();
    for category in [
        Category::Activations,
        Category::Gradients,
        Category::Temporaries,
        Category::OptimizerState,
    ] {
        assert!(inside.contains(&category), "{category} inside the step");
    }
    // The closure's forward stacks hold the optimizer's frames and the user's closure.
    let act = case
        .truth
        .allocs
        .iter()
        .find(|(_, &c)| c == Category::Activations)
        .map(|(&i, _)| i)
        .unwrap();
    let site = snap.site(snap.events[act].site()).unwrap();
    let functions: Vec<&str> = site.frames.iter().map(|f| f.function.as_str()).collect();
    assert!(functions.contains(&"closure"));
    assert!(site
        .frames
        .iter()
        .any(|f| f.file.ends_with("torch/optim/adamw.py") && f.function == "step"));
    assert_eq!((site.file.as_str(), site.line), (MODEL, 31));
    assert_eq!(at_end(&case)[Category::OptimizerState], 2 * param_bytes());
}

#[test]
fn a_dump_mid_forward_holds_the_forward_activations() {
    let case = cases::mid_forward(StackMode::All, 2);
    check_consistent(&case);
    let end = at_end(&case);
    // Two of four layers ran: two activations each.
    assert_eq!(end[Category::Activations], 2 * 2 * 8 * MIB);
    assert_eq!(end[Category::Inputs], 2 * MIB);
    assert_eq!(end[Category::Gradients], 0, "zero_grad freed them");
    assert_eq!(end[Category::OptimizerState], 2 * param_bytes());
    assert_eq!(end[Category::Temporaries], 0);
}

#[test]
fn inference_under_no_grad_keeps_nothing_but_parameters() {
    let case = cases::inference_no_grad(StackMode::All, 3);
    let series = check_consistent(&case);
    assert!(series.iter().all(|b| b[Category::Activations] == 0
        && b[Category::Gradients] == 0
        && b[Category::OptimizerState] == 0));
    assert!(series.iter().any(|b| b[Category::Temporaries] > 0));
    assert_eq!(at_end(&case).total(), param_bytes());
    assert!(
        case.snapshot.steps.is_empty(),
        "no optimizer, no step marks"
    );
}

#[test]
fn a_late_recording_starts_with_blocks_from_before_the_trace() {
    let case = cases::late_recording(StackMode::All, 2, 2);
    let series = check_consistent(&case);
    let params = param_bytes();
    // Parameters, gradients and optimizer state were live when recording began.
    assert_eq!(case.truth.at_start()[Category::BeforeTrace], 4 * params);
    assert_eq!(case.truth.before_trace.len(), 4 * 8);
    // The first recorded zero_grad frees the old gradients: frees with no allocation before.
    let snap = &case.snapshot;
    let freed_before: Vec<u64> = snap
        .events
        .iter()
        .enumerate()
        .filter(|(i, e)| {
            e.kind == EventKind::FreeRequested
                && !snap.events[..*i]
                    .iter()
                    .any(|a| a.kind == EventKind::Alloc && a.addr == e.addr)
        })
        .map(|(_, e)| e.addr)
        .collect();
    assert_eq!(freed_before.len(), 8);
    assert!(freed_before
        .iter()
        .all(|a| case.truth.category(BlockKey::BeforeTrace(*a)) == Some(Category::BeforeTrace)));
    let end = at_end(&case);
    assert_eq!(end[Category::BeforeTrace], 3 * params);
    assert_eq!(end[Category::Gradients], params);
    // The trace opens with that zero_grad freeing an old gradient.
    let first = &snap.events[0];
    assert_eq!(first.kind, EventKind::FreeRequested);
    assert_eq!(series[0][Category::BeforeTrace], 4 * params - first.size);
    // The recorded part begins at time 0 with two steps.
    assert_eq!(snap.steps.len(), 2);
    assert_eq!(snap.events[0].time_ns.min(snap.annotations[0].time_ns), 0);
}

#[test]
fn stacks_look_as_pytorch_records_them() {
    let all = cases::adamw_training(StackMode::All, 2);
    let python = cases::adamw_training(StackMode::Python, 1);
    let name_of = |case: &Planted, category: Category| {
        let snap = &case.snapshot;
        let i = case
            .truth
            .allocs
            .iter()
            .find(|(_, &c)| c == category)
            .map(|(&i, _)| i)
            .unwrap();
        snap.site(snap.events[i].site()).cloned()
    };
    // The parameters come from `Module.to`, named at the user's line that called it.
    let params = name_of(&all, Category::Parameters).unwrap();
    assert_eq!((params.file.as_str(), params.line), (TRAIN, 20));
    assert!(params.frames.iter().any(|f| f.function == "_apply"));
    assert!(params.frames[0].function.starts_with("torch::unwind"));
    // Python frames are followed by the interpreter's, and the script's frame comes last.
    let last = params.frames.last().unwrap();
    assert_eq!((last.function.as_str(), last.line), ("<module>", 118));
    // The gradients' stacks are the autograd thread's, C++ only.
    let grads = name_of(&all, Category::Gradients).unwrap();
    assert!(grads.frames.iter().all(|f| f.line == 0));
    assert!(grads
        .frames
        .iter()
        .any(|f| f.function.contains("Engine::thread_main")));
    // Some gradients are a backward node's output that AccumulateGrad keeps, others its copy.
    let grad_sites: Vec<&str> = all
        .truth
        .allocs
        .iter()
        .filter(|(_, &c)| c == Category::Gradients)
        .filter_map(|(&i, _)| all.snapshot.site(all.snapshot.events[i].site()))
        .flat_map(|s| s.frames.iter().map(|f| f.function.as_str()))
        .collect();
    for node in ["MmBackward0::apply", "AccumulateGrad::apply"] {
        assert!(grad_sites.iter().any(|f| f.contains(node)), "{node}");
    }
    // A free carries the stack of the free: the backward releasing what the forward saved,
    // zero_grad dropping the gradients.
    let snap = &all.snapshot;
    let free_of = |category: Category| {
        let (&i, _) = all
            .truth
            .allocs
            .iter()
            .find(|(_, &c)| c == category)
            .unwrap();
        let addr = snap.events[i].addr;
        let free = snap.events[i + 1..]
            .iter()
            .find(|e| e.kind == EventKind::FreeRequested && e.addr == addr)
            .unwrap();
        snap.site(free.site()).unwrap()
    };
    let released = free_of(Category::Activations);
    assert!(released
        .frames
        .iter()
        .any(|f| f.function.contains("release_variables")));
    assert!(
        released.frames.iter().all(|f| f.line == 0),
        "the autograd thread"
    );
    let dropped = free_of(Category::Gradients);
    assert!(dropped
        .frames
        .iter()
        .any(|f| f.function == "zero_grad" && f.file.ends_with("torch/optim/optimizer.py")));
    assert!(dropped.frames[0].function.starts_with("torch::unwind"));
    // With Python stacks only, the backward has none, and the rest only Python frames.
    assert!(name_of(&python, Category::Gradients).is_none());
    let py_params = name_of(&python, Category::Parameters).unwrap();
    assert!(py_params.frames.iter().all(|f| f.line > 0));
    assert_eq!(py_params.frames[0].function, "convert");
    let state = name_of(&python, Category::OptimizerState).unwrap();
    assert_eq!(state.frames[0].function, "_init_group");
    assert!(state.frames[0].file.ends_with("torch/optim/adamw.py"));
}

proptest! {
    #![proptest_config(crate::props::config(24))]

    /// On random programs every allocation has its truth and the truth adds up to the
    /// engine's allocated bytes at every moment.
    #[test]
    fn random_programs_are_consistent(spec in cases::programs(6)) {
        let case = spec.run();
        check_consistent(&case);
    }
}

#[test]
fn an_optimizer_that_replaces_its_state_makes_state_in_every_step() {
    let case = cases::custom_optimizer(StackMode::All, 3);
    check_consistent(&case);
    let snap = &case.snapshot;
    let made_in_step: Vec<usize> = case
        .truth
        .allocs
        .iter()
        .filter(|(&i, &c)| c == Category::OptimizerState && in_step_window(snap, i))
        .map(|(&i, _)| i)
        .collect();
    // Two states per parameter, in each of three steps, all inside the step annotation.
    assert_eq!(made_in_step.len(), 3 * 2 * 8);
    let states = case
        .truth
        .allocs
        .values()
        .filter(|&&c| c == Category::OptimizerState)
        .count();
    assert_eq!(states, made_in_step.len());
    assert_eq!(at_end(&case)[Category::OptimizerState], 2 * param_bytes());
    // The user's optimizer names the line; torch's wrapper is outside it, and no torch/optim
    // file of AdamW's own is on the stack.
    let site = snap.site(snap.events[made_in_step[0]].site()).unwrap();
    assert_eq!(site.function, "step");
    assert!(site.file.ends_with("/project/optimizer.py"));
    assert!(site
        .frames
        .iter()
        .any(|f| f.file.ends_with("torch/optim/optimizer.py") && f.function == "wrapper"));
    assert!(!site.frames.iter().any(|f| f.file.ends_with("adamw.py")));
}

#[test]
fn a_marked_program_annotates_its_modules_and_phases_as_attach_does() {
    let mut p = cases::Program::new(StackMode::Python, Shape::default()).with_marks();
    p.load_model();
    p.train_step(1);
    p.inference_step();
    let marked = p.finish("marked");
    let unmarked = cases::adamw_training(StackMode::Python, 1);
    check_consistent(&marked);
    let snap = &marked.snapshot;
    let names: Vec<(&str, &str)> = snap
        .annotations
        .iter()
        .map(|a| (a.name.as_str(), a.stage.as_str()))
        .filter(|(n, _)| vramscope_model::marks::is_mark(n))
        .collect();
    let mut expected = Vec::new();
    for phase in ["forward", "forward_no_grad"] {
        let phase = format!("vramscope.phase#{phase}");
        let mut one = vec![
            (phase.clone(), "START"),
            ("vramscope.module#Model".into(), "START"),
        ];
        for layer in 0..4 {
            let module = format!("vramscope.module#Model.layers.{layer}");
            one.push((module.clone(), "START"));
            one.push((module, "END"));
        }
        one.push(("vramscope.module#Model".into(), "END"));
        one.push((phase, "END"));
        expected.push(one);
    }
    let backward = [
        ("vramscope.phase#backward".to_string(), "START"),
        ("vramscope.phase#backward".to_string(), "END"),
    ];
    let want: Vec<(String, &str)> = expected[0]
        .iter()
        .cloned()
        .chain(backward)
        .chain(expected[1].iter().cloned())
        .collect();
    let got: Vec<(String, &str)> = names.iter().map(|&(n, s)| (n.to_string(), s)).collect();
    assert_eq!(got, want);
    // Each layer's allocations lie inside its module's window.
    let window = |name: &str| {
        let at = |stage: &str| {
            snap.annotations
                .iter()
                .find(|a| a.name == name && a.stage == stage)
                .unwrap()
                .time_ns
        };
        (at("START"), at("END"))
    };
    let (start, end) = window("vramscope.module#Model.layers.2");
    let inside: Vec<Category> = marked
        .truth
        .allocs
        .iter()
        .filter(|(&i, _)| (start..=end).contains(&snap.events[i].time_ns))
        .map(|(_, &c)| c)
        .collect();
    assert_eq!(
        inside,
        [
            Category::Activations,
            Category::Temporaries,
            Category::Activations
        ]
    );
    // The marks change no step: the optimizer's annotations number them.
    assert_eq!(snap.steps.len(), unmarked.snapshot.steps.len());
    assert_eq!(snap.steps[0].label, STEP_ANNOTATION);
}

#[test]
fn the_truth_says_which_blocks_the_trace_cannot_show() {
    // With C++ frames every block shows what it is; with Python frames only, a batch's copy to
    // the device does not (the user's line alone).
    let all = cases::adamw_training(StackMode::All, 3);
    assert!(all.truth.hidden.is_empty());
    let python = cases::adamw_training(StackMode::Python, 3);
    let hidden: Vec<Category> = python
        .truth
        .hidden
        .iter()
        .map(|i| python.truth.allocs[i])
        .collect();
    assert_eq!(hidden, [Category::Inputs; 3]);
    // A forward interrupted at call sites that completed steps before is shown by them; one
    // with no step before is not.
    assert!(cases::mid_forward(StackMode::All, 2)
        .truth
        .hidden
        .is_empty());
    let first = cases::mid_forward(StackMode::All, 0);
    let hidden: Vec<Category> = first
        .truth
        .hidden
        .iter()
        .map(|i| first.truth.allocs[i])
        .collect();
    assert_eq!(hidden, [Category::Activations; 4], "two layers of two");
}
