//! Conversions that stream (issue 36): the pickle streamed in chunks is the pickle written
//! whole, and a range of steps converts to the part of the trace it names with the figures of
//! the whole trace.
//!
//! A Perfetto window of a range of steps starts its counter at what the whole trace held
//! before the window and draws only the allocations and steps of the range; a slice of the
//! snapshot written as a PyTorch pickle imports again to the same usage at the window's start
//! and end as the whole trace has there. Step ranges parse as `A..B` (both ends included),
//! `A..`, `..B` and `N`, and a range the trace does not have is an error naming the steps it
//! has.

use std::path::{Path, PathBuf};

use vramscope_caching::{CachingAllocator, SimDevice};
use vramscope_engine::Reconstruction;
use vramscope_export::{
    export_pytorch, read_source, slice, to_perfetto, to_pytorch_pickle, write_perfetto_window,
    PytorchExtras, PytorchPlan, StepRange,
};
use vramscope_import as import;
use vramscope_model::{AllocatorConfig, Snapshot};

fn trace(name: &str) -> Option<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    vramscope_testkit::shared_trace(&root, name)
}

/// Six steps: a block kept from before the first, one allocated in step 2 and freed in step 5,
/// and a block allocated and freed in every step.
fn stepped() -> Snapshot {
    let alloc = CachingAllocator::new(SimDevice::phantom(1 << 34), AllocatorConfig::default());
    let _keep = alloc.alloc(3 << 20).unwrap();
    let mut held = None;
    for step in 1..=6 {
        alloc.mark_step();
        drop(alloc.alloc(4000 * step).unwrap());
        if step == 2 {
            held = Some(alloc.alloc(5 << 20).unwrap());
        }
        if step == 5 {
            held = None;
        }
        let _ = &held;
    }
    alloc.snapshot()
}

#[test]
fn the_streamed_pickle_is_the_pickle_written_whole() {
    let snapshot = stepped();
    let whole = export_pytorch(&snapshot, None).unwrap();
    let plan = PytorchPlan::new(&snapshot).unwrap();
    assert_eq!(plan.not_carried(), &whole.not_carried[..]);
    let mut streamed = Vec::new();
    let len = plan.write(None, &mut streamed).unwrap();
    assert_eq!(len as usize, streamed.len());
    assert!(streamed == whole.bytes, "the streamed pickle differs");

    // A PyTorch pickle with what the model does not keep read again from it.
    let Some(path) = trace("decomfl_opt125m_zo_fedlearn.pickle") else {
        vramscope_testkit::skip_notice("shared PyTorch traces absent");
        return;
    };
    let snapshot = import::load(&path).unwrap();
    let doc = read_source(&path, &Default::default()).unwrap().unwrap();
    let extras = PytorchExtras::from_document(&doc);
    let whole = export_pytorch(&snapshot, extras.as_ref()).unwrap();
    let mut streamed = Vec::new();
    PytorchPlan::new(&snapshot)
        .unwrap()
        .write(extras.as_ref(), &mut streamed)
        .unwrap();
    assert!(
        streamed.len() > 4 << 16,
        "the trace spans several chunks ({} bytes)",
        streamed.len()
    );
    assert!(streamed == whole.bytes, "the streamed pickle differs");
}

#[test]
fn a_window_of_every_event_is_the_whole_perfetto_trace() {
    let snapshot = stepped();
    let mut out = Vec::new();
    write_perfetto_window(&snapshot, 0..snapshot.events.len(), &mut out).unwrap();
    assert_eq!(
        String::from_utf8(out).unwrap(),
        to_perfetto(&snapshot).unwrap()
    );
}

#[test]
fn step_ranges_parse_with_both_ends_included() {
    let range = |text: &str| text.parse::<StepRange>();
    assert_eq!(range("3..5"), Ok(StepRange { first: 3, last: 5 }));
    assert_eq!(range("3..=5"), Ok(StepRange { first: 3, last: 5 }));
    assert_eq!(
        range("3.."),
        Ok(StepRange {
            first: 3,
            last: u64::MAX
        })
    );
    assert_eq!(range("..5"), Ok(StepRange { first: 0, last: 5 }));
    assert_eq!(range("4"), Ok(StepRange { first: 4, last: 4 }));
    assert!(range("5..3").unwrap_err().contains("starts after it ends"));
    assert!(range("x..3")
        .unwrap_err()
        .contains("`x` is not a step number"));
    assert!(range("").is_err());
    assert!(StepRange { first: 3, last: 5 }.contains(5));
}

#[test]
fn a_range_the_trace_does_not_have_names_the_steps_it_has() {
    let snapshot = stepped();
    let e = StepRange {
        first: 40,
        last: 50,
    }
    .window(&snapshot)
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("no event of the trace is in steps 40..50"),
        "{e}"
    );
    assert!(e.contains("its events are in steps 0..6"), "{e}");
}

#[test]
fn a_perfetto_window_starts_at_what_the_whole_trace_held_before_it() {
    let snapshot = stepped();
    let range = StepRange { first: 3, last: 4 };
    let window = range.window(&snapshot).unwrap();
    assert!(window.start > 0 && window.end < snapshot.events.len());
    let mut out = Vec::new();
    write_perfetto_window(&snapshot, window.clone(), &mut out).unwrap();
    let value: serde_json::Value = serde_json::from_slice(&out).unwrap();
    let events = value["traceEvents"].as_array().unwrap();
    let walk = Reconstruction::from_snapshot(&snapshot);
    let before = walk.usage.get(window.start - 1).unwrap();
    let first = events.iter().find(|e| e["ph"] == "C").unwrap();
    assert_eq!(first["args"]["allocated"], before.allocated);
    assert!(
        before.allocated >= (3 << 20) + (5 << 20),
        "the blocks held from before step 3 are counted"
    );
    let slices: Vec<_> = events
        .iter()
        .filter(|e| e["ph"] == "X" && e["tid"] != 0)
        .collect();
    assert!(!slices.is_empty());
    for slice in slices {
        let step = slice["args"]["step"].as_u64().unwrap();
        assert!(range.contains(step), "a slice of step {step}");
    }
    let steps: Vec<&str> = events
        .iter()
        .filter(|e| e["ph"] == "X" && e["tid"] == 0)
        .map(|e| e["name"].as_str().unwrap())
        .collect();
    assert_eq!(steps, ["step 3", "step 4"]);
}

/// The usage before the first and after the last event of `snapshot`.
fn ends(snapshot: &Snapshot) -> (u64, u64) {
    let walk = Reconstruction::from_snapshot(snapshot);
    let last = walk.usage.get(snapshot.events.len() - 1).unwrap();
    (walk.start.usage().allocated, last.allocated)
}

/// Slices `snapshot` at `range`, writes the slice as a PyTorch pickle and imports it again:
/// the usage at its start and its end is the whole trace's before and after the window.
fn assert_slice_keeps_the_usage(snapshot: &Snapshot, range: StepRange) {
    let window = range.window(snapshot).unwrap();
    let part = slice(snapshot, window.clone()).unwrap();
    assert_eq!(part.events.len(), window.len());
    let walk = Reconstruction::from_snapshot(snapshot);
    let before = match window.start {
        0 => walk.start.usage(),
        start => walk.usage.get(start - 1).unwrap(),
    };
    let after = walk.usage.get(window.end - 1).unwrap();
    assert_eq!(ends(&part), (before.allocated, after.allocated));
    let pickle = to_pytorch_pickle(&part).unwrap();
    let back = import::load_bytes(&pickle, "slice", &Default::default()).unwrap();
    assert_eq!(
        ends(&back),
        (before.allocated, after.allocated),
        "the pickle of {range} imports with the whole trace's usage"
    );
}

#[test]
fn a_slice_imports_again_with_the_usage_of_the_whole_trace() {
    assert_slice_keeps_the_usage(&stepped(), StepRange { first: 3, last: 4 });
    assert_slice_keeps_the_usage(&stepped(), StepRange { first: 2, last: 2 });
    let Some(path) = trace("cs336_medium_ctx512_train_step.pickle") else {
        vramscope_testkit::skip_notice("shared PyTorch traces absent");
        return;
    };
    let mut snapshot = import::load(&path).unwrap();
    vramscope_analysis::model_view::record_inferred_steps(&mut snapshot);
    let highest = snapshot.events.iter().map(|e| e.step).max().unwrap_or(0);
    let middle = u64::from(highest / 2).max(1);
    assert_slice_keeps_the_usage(
        &snapshot,
        StepRange {
            first: middle,
            last: middle,
        },
    );
}
