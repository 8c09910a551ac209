//! One step numbering for every view, and the findings at a cursor are the report's findings on
//! the trace cut there.
//!
//! A trace without step marks has its steps inferred from the loop in its allocations. The
//! dashboard analyses the part of the trace before its time cursor; inferring a loop of its own
//! from that part found one where the report does not (a prefix that ends inside a step shows
//! the model's layers repeating, and the shared GPT trace's peak cursor showed an ERROR for a
//! leak "in 24 steps", its 24 layers). The file's dashboard writes the report's steps into the
//! trace (`record_inferred_steps`), so the property below holds on generated traces: at any
//! cursor, the dashboard's findings are the detectors' on the trace cut there with the whole
//! trace's step numbering, a clean loop is silent at every cursor, and at the end the findings
//! and the step count are the report's.

use std::sync::Arc;

use proptest::prelude::*;
use vramscope_analysis::detect::{detect, DetectOptions, Severity};
use vramscope_analysis::model_view::{record_inferred_steps, ModelView, StepSource};
use vramscope_model::Snapshot;
use vramscope_testkit::{Trace, MIB};
use vramscope_tui::data::cut_snapshot;
use vramscope_tui::{App, Dataset, Origin};

/// An evaluation loop of `steps` iterations without marks, with PyTorch-like stacks: each
/// iteration loads its input at `eval.py:55`, then calls a model at `eval.py:57` whose
/// `layers` layers each allocate two activations at `model.py:31` and `model.py:32` (the same
/// lines every layer, as a real model's do), keeping the output's graph when `keep` is set,
/// else freeing it as a backward pass would. A cursor inside the first iteration's forward
/// pass sees the layers' lines repeat: the part of the trace before it looks like a loop of
/// layers, whose activations are all still live.
fn evaluation(steps: usize, layers: usize, keep: bool) -> Snapshot {
    let mut t = Trace::new();
    let input = t.site("eval.py", 55, "evaluate");
    let linear = t.site("model.py", 31, "forward");
    let gelu = t.site("model.py", 32, "forward");
    for _ in 0..steps {
        let x = t.alloc(input, MIB);
        let mut acts = Vec::new();
        for _ in 0..layers {
            acts.push(t.alloc(linear, 2 * MIB));
            acts.push(t.alloc(gelu, 2 * MIB));
        }
        if !keep {
            for a in acts.into_iter().rev() {
                t.free(a, 2 * MIB);
            }
        }
        t.free(x, MIB);
    }
    let mut snapshot = t.finish();
    let frame = |file: &str, line: u32, function: &str| vramscope_model::Frame {
        file: file.to_string(),
        line,
        function: function.to_string(),
    };
    let outer = [frame("eval.py", 90, "<module>")];
    snapshot.sites[input as usize].frames = [frame("eval.py", 55, "evaluate")]
        .into_iter()
        .chain(outer.clone())
        .collect();
    for (site, line) in [(linear, 31), (gelu, 32)] {
        snapshot.sites[site as usize].frames = [
            frame("model.py", line, "forward"),
            frame("model.py", 201, "forward"),
            frame("eval.py", 57, "evaluate"),
        ]
        .into_iter()
        .chain(outer.clone())
        .collect();
    }
    snapshot
}

/// The dashboard of a file as `vramscope view` builds it, with the cursor at `pos`, analysed.
fn dashboard_at(snapshot: &Snapshot, pos: usize) -> App {
    let mut shown = snapshot.clone();
    record_inferred_steps(&mut shown);
    let mut app = App::new(Dataset::new(shown, Origin::File("f".into())));
    app.cursor = Some(pos);
    app.analyze_now();
    app
}

fn problems(findings: &[vramscope_analysis::detect::Finding]) -> usize {
    findings
        .iter()
        .filter(|f| f.severity >= Severity::Warning)
        .count()
}

proptest! {
    #![proptest_config(vramscope_testkit::props::config(48))]

    #[test]
    fn findings_at_any_cursor_are_the_reports_on_the_trace_cut_there(
        steps in 3usize..10,
        layers in 2usize..8,
        keep in proptest::bool::ANY,
        at in 0.0f64..=1.0,
    ) {
        let original = evaluation(steps, layers, keep);
        let report_view = ModelView::new(&original);
        let inferred = matches!(report_view.step_source(), StepSource::Inferred { .. });
        prop_assert!(inferred);
        let report_steps = report_view.loop_steps().len();
        prop_assert_eq!(report_steps, steps);
        let mut recorded = original.clone();
        prop_assert_eq!(record_inferred_steps(&mut recorded), steps);
        // The whole trace: the same steps and the same findings as the report's.
        prop_assert_eq!(ModelView::new(&recorded).loop_steps().len(), report_steps);
        let report = detect(&original, &DetectOptions::default());
        prop_assert_eq!(&detect(&recorded, &DetectOptions::default()), &report);

        let n = original.events.len();
        let pos = ((n as f64) * at).round() as usize;
        let mut app = dashboard_at(&original, pos.min(n));
        let shown = app.analysis.clone().expect("analysed").findings;
        let (snapshot, segments) = app.data.cut_at(pos.min(n));
        let cut = cut_snapshot(&Arc::clone(&snapshot), pos.min(n), segments);
        prop_assert_eq!(&shown, &detect(&cut, &DetectOptions::default()));
        // The cut keeps the whole trace's numbering: never more steps than began before it.
        prop_assert!(ModelView::new(&cut).loop_steps().len() <= report_steps);
        // A clean loop is silent at every cursor, as the report on it is.
        if !keep {
            prop_assert_eq!(problems(&report), 0);
            prop_assert_eq!(problems(&shown), 0, "{:#?}", shown);
        }
        if pos >= n {
            prop_assert_eq!(problems(&shown), problems(&report));
        }
    }
}

/// Without the recorded steps the part before a cursor at the end of the first forward pass
/// looked like a loop of layers, all of whose activations are live: the dashboard raised a
/// leak the report did not.
#[test]
fn a_cursor_inside_a_step_does_not_take_layers_for_steps() {
    let original = evaluation(4, 6, false);
    // The first iteration's input and its twelve activations, before any is freed.
    let pos = 13;
    let app = dashboard_at(&original, pos);
    let shown = app.analysis.expect("analysed").findings;
    assert_eq!(problems(&shown), 0, "{shown:#?}");
}

/// Step marks in a warm-up only (six marked steps, each keeping a block), then a long run
/// without Python: the report says the trace has no steps (the marks cover only a warm-up).
/// A cursor at the end of the warm-up cuts a part that the marks do cover; analysed alone it
/// would count steps that each kept memory. The dashboard numbers the part as the whole
/// trace is numbered: no steps, and no finding the report does not make.
#[test]
fn a_cursor_inside_a_marked_warm_up_keeps_the_whole_traces_no_steps() {
    let mut t = Trace::new();
    let warm = t.site("train.py", 40, "warmup");
    let replay = t.site("train.py", 52, "run");
    for _ in 0..6 {
        t.step();
        let _kept = t.alloc(warm, 8 * MIB);
        let a = t.alloc(warm, MIB);
        t.free(a, MIB);
    }
    let warm_up_end = 18;
    for _ in 0..800 {
        let a = t.alloc(replay, 4096);
        t.free(a, 4096);
    }
    let original = t.finish();
    let whole = ModelView::new(&original);
    assert!(
        matches!(whole.step_source(), StepSource::PrefixMarks { .. }),
        "{:?}",
        whole.step_source()
    );
    assert!(whole.loop_steps().is_empty());

    let mut app = dashboard_at(&original, warm_up_end);
    let shown = app.analysis.clone().expect("analysed").findings;
    let (snapshot, segments) = app.data.cut_at(warm_up_end);
    let cut = cut_snapshot(&Arc::clone(&snapshot), warm_up_end, segments);
    // Alone, the part has marked steps, each keeping 8 MiB: the dashboard would show that
    // site growing per step, which the report on the whole file does not say.
    let alone = ModelView::new(&cut);
    assert!(matches!(alone.step_source(), StepSource::Recorded { .. }));
    assert!(alone.loop_steps().len() >= 2);
    // As a part of the whole trace, it has none, and the dashboard's findings are those.
    let part = ModelView::new_part(&cut, whole.step_source());
    assert_eq!(part.step_source(), whole.step_source());
    assert!(part.loop_steps().is_empty());
    let mut expected = Vec::new();
    vramscope_analysis::detect::run_all_view(&part, &DetectOptions::default(), &mut expected);
    assert_eq!(shown, expected);
    assert_eq!(problems(&shown), 0, "{shown:#?}");
    // No growth per step either: the whole trace has no steps to grow over.
    assert!(app.analysis.expect("analysed").growth.is_empty());
}
