//! Fidelity against PyTorch's own allocator, measured on a GPU: the traces in
//! `testkit/data/torch_h200` were recorded by `scripts/torch_fidelity.py` on an NVIDIA H200 with
//! torch 2.11 (a small transformer trained with varied batch shapes, in nine cases: allocator
//! settings, caps set with `set_per_process_memory_fraction`, a side stream with
//! `record_stream`), and `expected.json` holds what PyTorch's `memory_stats()` said at the end
//! of each run. Replaying a trace through the `pytorch` policy with the same settings and cap
//! must reproduce every one of those numbers.
//! The stack frames were dropped from the pickles to keep them small.

use serde_json::Value;
use vramscope_import as import;
use vramscope_model::AllocatorConfig;
use vramscope_replay::{
    block_sizing, render_text, replay, BlockSizing, ReplayOptions, ReplayResult,
};

use vramscope_testkit::torch_h200::{data, expected};

/// Replays a recording with its settings (and `policy`, if given) and cap, comparing device
/// calls too (`verify`).
fn replay_case(case: &str, policy: Option<&str>) -> (ReplayResult, Value) {
    let expected = expected()[case].clone();
    let mut conf = expected["conf"].as_str().unwrap().to_string();
    if let Some(policy) = policy {
        conf = format!("{conf},policy:{policy}")
            .trim_start_matches(',')
            .to_string();
    }
    let snapshot = import::load(data().join(format!("{case}.pickle.gz"))).unwrap();
    let mut options = ReplayOptions::default();
    options.config = AllocatorConfig::parse(&conf).unwrap();
    options.capacity = expected["cap"].as_u64();
    options.verify = true;
    (replay(&snapshot, &options, &mut |_, _| {}), expected)
}

fn assert_reproduces_pytorch(case: &str) {
    let (result, expected) = replay_case(case, None);
    let theirs = |key: &str| expected[key].as_u64().unwrap();
    let figures = &result.figures;
    assert_eq!(
        result.restored_segments, 0,
        "{case}: recorded from an empty device"
    );
    assert_eq!(result.unmatched_frees, 0, "{case}");
    assert_eq!(result.trace_ooms_served, 0, "{case}");
    let pairs = [
        ("max_memory_reserved", figures.peak_reserved),
        ("max_memory_allocated", figures.peak_allocated),
        ("num_device_alloc", figures.segment_allocs),
        ("num_device_free", figures.segment_frees),
        ("num_alloc_retries", figures.num_alloc_retries),
        ("num_ooms", figures.num_ooms),
    ];
    for (key, ours) in pairs {
        assert_eq!(ours, Some(theirs(key)), "{case}: {key}");
    }
    // The trace's own record agrees with PyTorch's counters where it can tell.
    assert_eq!(
        result.original.peak_reserved,
        Some(theirs("max_memory_reserved")),
        "{case}"
    );
    assert_eq!(
        result.original.segment_allocs,
        Some(theirs("num_device_alloc")),
        "{case}"
    );
}

#[test]
fn default_settings_reproduce_pytorch() {
    assert_reproduces_pytorch("default");
}

#[test]
fn a_memory_fraction_cap_reproduces_pytorchs_frees_and_retries() {
    assert_reproduces_pytorch("default_capped");
}

#[test]
fn expandable_segments_map_like_pytorch() {
    assert_reproduces_pytorch("expandable");
}

#[test]
fn expandable_segments_under_a_cap_run_out_of_memory_like_pytorch() {
    // PyTorch ran out of memory once, after freeing its cache and retrying; its retry unmapped
    // free pages in the middle of an expandable segment as well as at its end (3 unmaps).
    assert_reproduces_pytorch("expandable_capped");
    let (result, expected) = replay_case("expandable_capped", None);
    assert_eq!(expected["num_ooms"], 1);
    let oom = result.first_oom.expect("the replay runs out of memory too");
    assert_eq!(oom.requested, 128 << 20);
}

#[test]
fn max_split_size_reproduces_pytorch() {
    assert_reproduces_pytorch("split64");
}

#[test]
fn max_split_size_and_garbage_collection_reproduce_pytorch() {
    assert_reproduces_pytorch("split64_gc");
}

#[test]
fn garbage_collection_under_a_cap_reproduces_pytorch() {
    assert_reproduces_pytorch("gc80_capped");
}

#[test]
fn a_side_stream_with_record_stream_reproduces_pytorch() {
    assert_reproduces_pytorch("streams");
}

#[test]
fn roundup_power2_divisions_reproduce_pytorch() {
    assert_reproduces_pytorch("roundup4");
}

#[test]
fn compact_reserves_no_more_than_pytorch_on_the_h200_traces() {
    for case in ["default", "roundup4"] {
        let (ours, _) = replay_case(case, None);
        let (compact, _) = replay_case(case, Some("compact"));
        assert!(
            compact.figures.peak_reserved <= ours.figures.peak_reserved,
            "{case}: compact {:?} > pytorch {:?}",
            compact.figures.peak_reserved,
            ours.figures.peak_reserved
        );
    }
}

#[test]
fn every_device_call_comes_in_pytorchs_order_with_pytorchs_size() {
    // Stronger than the counts: replayed with `verify`, the allocator makes the same raw
    // allocations, frees, maps and unmaps as PyTorch did, one for one and in order.
    for case in expected().keys() {
        let check = replay_case(case, None)
            .0
            .device_calls
            .expect("verify compares device calls");
        assert!(check.trace_calls > 0, "{case}");
        assert_eq!(check.first_difference, None, "{case}");
        assert_eq!(check.replay_calls, check.trace_calls, "{case}");
    }
}

#[test]
fn verify_names_where_other_settings_part_from_pytorch() {
    // The garbage-collected run replayed without its settings: the replay keeps a segment
    // that PyTorch freed.
    let expected = expected()["split64_gc"].clone();
    let snapshot = import::load(data().join("split64_gc.pickle.gz")).unwrap();
    let mut options = ReplayOptions::default();
    options.capacity = expected["cap"].as_u64();
    options.verify = true;
    let check = replay(&snapshot, &options, &mut |_, _| {})
        .device_calls
        .unwrap();
    let difference = check.first_difference.expect("the runs part");
    assert_eq!(difference.index, check.matching);
    assert!(check.matching > 0 && check.matching < check.trace_calls);
    let theirs = difference.trace.expect("the trace has a call there");
    assert_eq!(theirs.action, "segment_free");
    assert!(difference.trace_seq.is_some());
    assert_ne!(Some(theirs), difference.replay);
}

#[test]
fn the_recorded_settings_are_replayed_when_none_are_given() {
    // `allocator_settings` in each pickle names the settings it ran with: replayed with them
    // (and its cap), every figure is PyTorch's, without the settings being given.
    for (case, expected) in expected() {
        let snapshot = import::load(data().join(format!("{case}.pickle.gz"))).unwrap();
        let mut options = ReplayOptions::default();
        options.trace_settings = true;
        options.capacity = expected["cap"].as_u64();
        options.verify = true;
        let result = replay(&snapshot, &options, &mut |_, _| {});
        let conf = AllocatorConfig::parse(expected["conf"].as_str().unwrap()).unwrap();
        assert_eq!(result.config, conf.to_string(), "{case}");
        assert_eq!(result.trace_settings.as_deref(), Some(&*result.config));
        assert_eq!(
            result.figures.peak_reserved,
            expected["max_memory_reserved"].as_u64(),
            "{case}"
        );
        let check = result.device_calls.unwrap();
        assert!(!check.differs(), "{case}: {check:?}");
    }
}

#[test]
fn the_trace_column_marks_an_estimated_peak() {
    // Where the importer's replay (with the trace's settings and no cap) did not make the
    // trace's device calls, block sizes are requests rounded: the trace's peak allocated is
    // an estimate and says so; elsewhere it is PyTorch's own figure.
    let mut estimated = 0;
    for (case, expected) in expected() {
        let snapshot = import::load(data().join(format!("{case}.pickle.gz"))).unwrap();
        let sizing = block_sizing(&snapshot).expect("a PyTorch snapshot");
        let mut options = ReplayOptions::default();
        options.capacity = expected["cap"].as_u64();
        let result = replay(&snapshot, &options, &mut |_, _| {});
        let theirs = expected["max_memory_allocated"].as_u64();
        let text = render_text(case.as_str(), &result);
        let json = serde_json::to_value(&result).unwrap();
        match sizing {
            BlockSizing::Replayed => {
                assert!(!result.original.peak_allocated_estimated, "{case}");
                assert_eq!(result.original.peak_allocated, theirs, "{case}");
                assert!(!text.contains('~'), "{case}: {text}");
                assert!(json["original"].get("peak_allocated_estimated").is_none());
            }
            BlockSizing::Rounded => {
                estimated += 1;
                assert!(result.original.peak_allocated_estimated, "{case}");
                let line = text.lines().find(|l| l.contains("peak allocated")).unwrap();
                assert!(
                    line.trim_end().ends_with(" GiB") && line.contains(" ~"),
                    "{line}"
                );
                assert!(text.contains("~ estimated: the trace records requests"));
                assert_eq!(json["original"]["peak_allocated_estimated"], true);
            }
        }
    }
    // The capped run is one: its importer's replay had no cap and freed no segment.
    assert!(estimated > 0);
    let capped = import::load(data().join("default_capped.pickle.gz")).unwrap();
    assert_eq!(block_sizing(&capped), Some(BlockSizing::Rounded));
}

#[test]
fn a_capped_run_implies_its_cap_and_replays_on_it() {
    // Without --capacity, the runs under a cap that freed their cache to retry (or ran out)
    // say what they had: the cap lies within the bounds they imply, and a replay there makes
    // PyTorch's device calls, call for call. The runs without pressure imply nothing.
    for (case, expected) in expected() {
        let snapshot = import::load(data().join(format!("{case}.pickle.gz"))).unwrap();
        let mut options = ReplayOptions::default();
        options.trace_settings = true;
        options.verify = true;
        options.infer_capacity = true;
        let result = replay(&snapshot, &options, &mut |_, _| {});
        let pressured = expected["num_alloc_retries"].as_u64() > Some(0);
        let Some(inferred) = &result.inferred_capacity else {
            assert!(!pressured, "{case}: {result:?}");
            continue;
        };
        assert!(pressured, "{case}: {inferred:?}");
        let cap = expected["cap"].as_u64().expect("a capped run");
        assert!(
            inferred.lower <= cap && cap <= inferred.upper,
            "{case}: {inferred:?}"
        );
        assert!(
            !inferred.exact,
            "{case}: a cap, not the device, refused the memory"
        );
        assert_eq!(result.capacity, inferred.bytes);
        let check = result.device_calls.unwrap();
        assert!(!check.differs(), "{case}: {check:?}");
        assert_eq!(
            result.figures.num_ooms,
            expected["num_ooms"].as_u64(),
            "{case}"
        );
    }
}
