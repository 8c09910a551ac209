//! What a replay says must be true of the trace: memory held before a trace that its format
//! records only as totals is held in the replay too, the trace's own settings are replayed
//! unless others are given, skipped frees are counted by why they were skipped, a trace
//! without device calls has nothing to differ from, and the allocations and frees compared
//! are like with like.

use vramscope_caching::{CachingAllocator, SimDevice};
use vramscope_engine::{is_segment_event, Reconstruction};
use vramscope_model::{AllocatorConfig, EventKind, Policy, Snapshot, SnapshotSource};
use vramscope_replay::{
    render_sweep_text, render_text, replay, sweep, sweep_configs, sweep_with, ReplayOptions,
    SettingsOrigin,
};

const MIB: u64 = 1 << 20;

/// Four steps that each allocate 30 and 40 MiB and free both.
fn four_steps(alloc: &CachingAllocator<SimDevice>) {
    for _ in 0..4 {
        alloc.mark_step();
        let a = alloc.alloc(30 * MIB).unwrap();
        let b = alloc.alloc(40 * MIB).unwrap();
        drop(a);
        drop(b);
    }
}

/// A run recorded by vramscope under `config`: 100 MiB of weights, then four steps that each
/// allocate 30 and 40 MiB and free both.
fn recorded(config: &str) -> Snapshot {
    let alloc = CachingAllocator::new(
        SimDevice::phantom(1 << 40),
        AllocatorConfig::parse(config).unwrap(),
    );
    let _weights = alloc.alloc(100 * MIB).unwrap();
    four_steps(&alloc);
    alloc.snapshot()
}

/// A trace as a profiler writes it: started after 100 MiB of weights were allocated and 60 MiB
/// more were cached, no segments and no segment events, only totals (allocated 100 MiB and
/// reserved 200 MiB at the end, which the trace never changes as far as it records). Its peak
/// allocated is 170 MiB.
fn totals_only_trace() -> Snapshot {
    let alloc = CachingAllocator::new(SimDevice::phantom(1 << 40), AllocatorConfig::default());
    let _weights = alloc.alloc(100 * MIB).unwrap();
    drop(alloc.alloc(60 * MIB).unwrap());
    let before = alloc.snapshot().events.len();
    four_steps(&alloc);
    let mut snapshot = alloc.snapshot();
    snapshot.events.drain(..before);
    snapshot.events.retain(|e| !is_segment_event(e));
    snapshot.segments.clear();
    snapshot.source = SnapshotSource::ChromeTrace;
    snapshot
}

#[test]
fn memory_recorded_only_as_totals_is_held_from_the_start() {
    let snapshot = totals_only_trace();
    let start = Reconstruction::from_snapshot(&snapshot).start;
    assert_eq!(
        start.unattributed.allocated,
        100 * MIB,
        "the fixture's premise"
    );
    assert_eq!(
        start.unattributed.reserved,
        200 * MIB,
        "the fixture's premise"
    );

    let result = replay(&snapshot, &ReplayOptions::default(), &mut |_, _| {});
    assert_eq!(result.original.peak_allocated, Some(170 * MIB));
    assert_eq!(
        result.figures.peak_allocated, result.original.peak_allocated,
        "the weights are held through the replay"
    );
    // The cached 100 MiB serve the steps, as they did in the run.
    assert_eq!(result.figures.peak_reserved, Some(200 * MIB));
    assert_eq!(result.figures.segment_allocs, Some(0));
    let held = result.held_before_trace.clone().expect("restored");
    assert_eq!((held.allocated, held.cached), (100 * MIB, 100 * MIB));
    assert!(held.cached_restored);
    let text = render_text("trace", &result);
    assert!(
        text.contains("100 MiB held before the trace (recorded as a total, no blocks named), restored as one live block"),
        "{text}"
    );
    assert!(
        text.contains(
            "100 MiB more reserved before the trace (cached, free), restored as one free segment"
        ),
        "{text}"
    );
}

#[test]
fn memory_held_before_the_trace_counts_against_the_capacity() {
    let snapshot = totals_only_trace();
    // The steps need 70 MiB beside the 100 MiB held: 150 MiB is too little.
    let mut options = ReplayOptions::default();
    options.capacity = Some(150 * MIB);
    let result = replay(&snapshot, &options, &mut |_, _| {});
    let oom = result.first_oom.clone().expect("170 MiB do not fit in 150");
    assert_eq!(oom.requested, 40 * MIB);
    assert!(result.figures.num_ooms.unwrap() >= 1);
    // Against a capacity the allocator's cache is its own.
    let held = result.held_before_trace.clone().unwrap();
    assert!(!held.cached_restored);
    assert!(
        render_text("trace", &result)
            .contains("100 MiB more reserved before the trace (cached, free) left out"),
        "{}",
        render_text("trace", &result)
    );
    let rows = sweep(&snapshot, Some(150 * MIB), &mut |_, _| {});
    assert!(rows.iter().all(|row| !row.fits), "{rows:#?}");
    assert!(render_sweep_text("trace", 150 * MIB, &rows).contains("no PyTorch setting tried fits"));
    // 170 MiB hold the weights and the steps' blocks: the cache left out is not needed.
    let rows = sweep(&snapshot, Some(170 * MIB), &mut |_, _| {});
    assert!(rows[0].fits, "{rows:#?}");
    assert!(rows[0].result.figures.peak_reserved <= Some(170 * MIB));
}

#[test]
fn the_trace_settings_are_replayed_when_asked_for() {
    let snapshot = recorded("expandable_segments:True");
    let mut options = ReplayOptions::default();
    options.trace_settings = true;
    options.verify = true;
    let result = replay(&snapshot, &options, &mut |_, _| {});
    assert_eq!(result.config, "expandable_segments:True");
    assert_eq!(
        result.trace_settings.as_deref(),
        Some("expandable_segments:True")
    );
    let check = result.device_calls.clone().unwrap();
    assert!(check.trace_calls > 0);
    assert!(!check.differs(), "{check:?}");
    assert_eq!(result.figures.peak_reserved, result.original.peak_reserved);
    let text = render_text("trace", &result);
    assert!(
        text.contains("settings (from the trace: expandable_segments:True) on"),
        "{text}"
    );

    // A policy given still applies, and the text says so.
    options.policy = Some(Policy::Compact);
    let result = replay(&snapshot, &options, &mut |_, _| {});
    assert_eq!(result.config, "policy:compact,expandable_segments:True");
    assert!(
        render_text("trace", &result)
            .contains("settings (from the trace: expandable_segments:True) with policy:compact on"),
        "{}",
        render_text("trace", &result)
    );

    // Settings given in place of the trace's are the ones replayed: here the calls differ.
    let mut given = ReplayOptions::default();
    given.verify = true;
    let result = replay(&snapshot, &given, &mut |_, _| {});
    assert_eq!(result.trace_settings, None);
    assert!(result.device_calls.as_ref().unwrap().differs());
    assert!(render_text("trace", &result).contains("settings (defaults) on"));
}

#[test]
fn a_sweep_marks_the_trace_settings_and_the_given_ones() {
    // Settings of the sweep's own list are marked where they stand.
    let expandable = recorded("expandable_segments:True");
    let rows = sweep(&expandable, None, &mut |_, _| {});
    assert_eq!(rows.len(), sweep_configs().len());
    let marked: Vec<_> = rows.iter().filter(|r| r.origin.is_some()).collect();
    assert_eq!(marked.len(), 1);
    assert_eq!(marked[0].config, "expandable_segments:True");
    assert_eq!(marked[0].origin, Some(SettingsOrigin::Recorded));

    // Others are rows of their own.
    let collected = recorded("garbage_collection_threshold:0.5");
    let given = AllocatorConfig::parse("max_split_size_mb:32").unwrap();
    let rows = sweep_with(&collected, None, Some(&given), &mut |_, _| {});
    assert_eq!(rows.len(), sweep_configs().len() + 2);
    let origin_of = |config: &str| rows.iter().find(|r| r.config == config).unwrap().origin;
    assert_eq!(
        origin_of("garbage_collection_threshold:0.5"),
        Some(SettingsOrigin::Recorded)
    );
    assert_eq!(
        origin_of("max_split_size_mb:32"),
        Some(SettingsOrigin::Given)
    );
    assert_eq!(origin_of("(defaults)"), None);
    let text = render_sweep_text("trace", 1 << 40, &rows);
    assert!(
        text.contains("garbage_collection_threshold:0.5 (the trace's)"),
        "{text}"
    );
    assert!(text.contains("max_split_size_mb:32 (given)"), "{text}");
}

#[test]
fn frees_of_allocations_that_failed_are_not_called_frees_from_before_the_trace() {
    // Recorded from an empty device; 120 MiB hold the weights but no step.
    let snapshot = recorded("");
    let mut options = ReplayOptions::default();
    options.capacity = Some(120 * MIB);
    let result = replay(&snapshot, &options, &mut |_, _| {});
    assert_eq!(result.unmatched_frees, 0, "the trace started empty");
    assert_eq!(
        result.failed_frees, 8,
        "every step's two allocations failed"
    );
    let text = render_text("trace", &result);
    assert!(
        text.contains("8 frees of allocations that failed in the replay were skipped"),
        "{text}"
    );
    assert!(!text.contains("before the trace"), "{text}");
}

#[test]
fn frees_of_blocks_from_before_the_trace_are_still_named_so() {
    // The weights' allocation is cut off and no state at the end names them: their free is
    // one of a block from before the trace.
    let mut snapshot = recorded("");
    let weights = snapshot
        .events
        .iter()
        .position(|e| e.kind == EventKind::Alloc)
        .unwrap();
    let addr = snapshot.events[weights].addr;
    snapshot.events.drain(..=weights);
    let last = *snapshot.events.last().unwrap();
    snapshot.events.push(vramscope_model::Event {
        kind: EventKind::FreeCompleted,
        seq: last.seq + 1,
        addr,
        size: 100 * MIB,
        ..last
    });
    snapshot.segments.clear();
    let result = replay(&snapshot, &ReplayOptions::default(), &mut |_, _| {});
    assert_eq!((result.unmatched_frees, result.failed_frees), (1, 0));
    assert!(render_text("trace", &result)
        .contains("1 free of a block allocated before the trace was skipped"));
}

#[test]
fn allocations_and_frees_are_compared_like_with_like() {
    let snapshot = recorded("");
    let result = replay(&snapshot, &ReplayOptions::default(), &mut |_, _| {});
    assert_eq!(result.original.allocs, 9);
    assert_eq!(result.original.frees, 8);
    assert_eq!(result.figures.allocs, result.original.allocs);
    assert_eq!(result.figures.frees, result.original.frees);
    // The trace's events include its segment calls, free requests and steps.
    assert!(result.original.events > result.figures.events);
    let text = render_text("trace", &result);
    let row = |name: &str| {
        text.lines()
            .find(|l| l.trim_start().starts_with(name))
            .unwrap_or_else(|| panic!("no {name} row: {text}"))
            .split_whitespace()
            .rev()
            .take(2)
            .collect::<Vec<_>>()
    };
    assert_eq!(row("allocations"), ["9", "9"]);
    assert_eq!(row("frees"), ["8", "8"]);
    assert!(!text.contains("  events "), "{text}");

    // Out of memory, the replay serves fewer than the trace did.
    let mut options = ReplayOptions::default();
    options.capacity = Some(120 * MIB);
    let result = replay(&snapshot, &options, &mut |_, _| {});
    assert_eq!((result.figures.allocs, result.figures.frees), (1, 0));
    assert_eq!(result.original.allocs, 9);
}

#[test]
fn a_trace_without_device_calls_has_nothing_to_differ_from() {
    // A format that records blocks and nothing of segments, not even totals.
    let mut snapshot = recorded("");
    snapshot.events.retain(|e| !is_segment_event(e));
    snapshot.segments.clear();
    snapshot.stats = Default::default();
    let mut options = ReplayOptions::default();
    options.verify = true;
    let result = replay(&snapshot, &options, &mut |_, _| {});
    let check = result.device_calls.clone().unwrap();
    assert_eq!(check.trace_calls, 0);
    assert!(check.replay_calls > 0);
    assert!(!check.differs());
    assert!(render_text("trace", &result).contains("the trace records none to compare with"));
}

/// With expandable segments, every stream that allocates reserves addresses for 9/8 of the
/// device's memory, and the replay's unlimited device (1 PiB) has room in its 2^64 addresses
/// for about 14,500 of them: a trace of 15,000 streams runs out of address space with almost
/// nothing allocated, and the replay says so instead of calling it a shortage of memory.
#[test]
fn a_replay_that_runs_out_of_address_space_says_so() {
    const STREAMS: u64 = 15_000;
    let alloc = CachingAllocator::new(
        SimDevice::phantom(1 << 40),
        AllocatorConfig::parse("expandable_segments:True").unwrap(),
    );
    for stream in 1..=STREAMS {
        let ptr = alloc
            .alloc_ptr(4 * MIB, vramscope_caching::StreamId(stream))
            .unwrap();
        alloc.free_ptr(ptr).unwrap();
    }
    let snapshot = alloc.snapshot();
    let mut options = ReplayOptions::default();
    options.trace_settings = true;
    let result = replay(&snapshot, &options, &mut |_, _| {});
    let oom = result.first_oom.clone().expect("the replay ran out");
    assert!(oom.address_space, "{oom:?}");
    assert!(oom.reserved < 1 << 40, "{oom:?}");
    let text = render_text("trace", &result);
    assert!(
        text.contains("ran out of address space, not memory"),
        "{text}"
    );
    // The same trace without expandable segments reserves no address ranges and fits.
    options.trace_settings = false;
    options.config = AllocatorConfig::default();
    let plain = replay(&snapshot, &options, &mut |_, _| {});
    assert_eq!(plain.first_oom, None);
    assert!(!render_text("trace", &plain).contains("address space"));
}

/// A start state that alone exceeds the capacity (here 100 MiB held before the trace, recorded
/// as a total, on 90 MiB) is said to, and the replay runs without the limit to say what fits:
/// replayed on that, the trace runs without an OOM.
#[test]
fn a_start_state_over_the_capacity_says_what_fits() {
    let snapshot = totals_only_trace();
    let mut options = ReplayOptions::default();
    options.capacity = Some(90 * MIB);
    let result = replay(&snapshot, &options, &mut |_, _| {});
    let over = result
        .start_over_capacity
        .expect("100 MiB held exceed 90 MiB");
    assert_eq!((over.allocated, over.reserved), (100 * MIB, 100 * MIB));
    assert_eq!(Some(over.needed), result.figures.peak_reserved);
    assert!(over.needed >= 170 * MIB, "{over:?}");
    assert!(result.first_oom.is_none(), "{result:#?}");
    assert_eq!(result.capacity, 90 * MIB);
    let text = render_text("trace", &result);
    assert!(
        text.contains("does not fit: the start state alone exceeds the 90.0 MiB capacity: 100 MiB allocated before the trace"),
        "{text}"
    );
    assert!(!text.contains("no OOM at this capacity"), "{text}");

    options.capacity = Some(over.needed);
    let fitting = replay(&snapshot, &options, &mut |_, _| {});
    assert!(fitting.start_over_capacity.is_none());
    assert!(fitting.first_oom.is_none(), "{fitting:#?}");
    assert_eq!(fitting.figures.num_ooms, Some(0));

    // A segment that holds the weights at the start, over the capacity, is the same case.
    let mut late = recorded("");
    let cut = late
        .events
        .iter()
        .position(|e| e.kind == EventKind::Step)
        .unwrap();
    late.events.drain(..cut);
    options.capacity = Some(64 * MIB);
    let result = replay(&late, &options, &mut |_, _| {});
    let over = result
        .start_over_capacity
        .expect("100 MiB of weights on 64 MiB");
    assert_eq!(over.allocated, 100 * MIB);
    assert!(over.reserved >= 100 * MIB);
    // And a sweep says no setting fits, and what fits.
    let rows = sweep(&late, Some(64 * MIB), &mut |_, _| {});
    assert!(rows
        .iter()
        .all(|r| !r.fits && r.result.start_over_capacity.is_some()));
    let text = render_sweep_text("trace", 64 * MIB, &rows);
    assert!(
        text.contains("no setting fits: the start state alone exceeds"),
        "{text}"
    );
    assert!(text.contains("what fits: "), "{text}");
}

/// A saving is material at 10 % of the baseline and 256 MiB, both.
#[test]
fn a_material_saving_is_a_tenth_and_256_mib() {
    use vramscope_replay::{material_saving, MATERIAL_SAVING_BYTES, MATERIAL_SAVING_PERCENT};
    assert_eq!(
        (MATERIAL_SAVING_PERCENT, MATERIAL_SAVING_BYTES),
        (10, 256 * MIB)
    );
    let gib = 1024 * MIB;
    assert!(material_saving(4 * gib, 3 * gib));
    assert!(material_saving(10 * gib, 9 * gib), "exactly 10 %");
    assert!(!material_saving(10 * gib, 9 * gib + MIB), "just under 10 %");
    assert!(
        !material_saving(2 * gib, 2 * gib - 200 * MIB),
        "10 % but under 256 MiB"
    );
    assert!(!material_saving(40 * gib, 39 * gib), "1 GiB but 2.5 %");
    assert!(!material_saving(gib, 2 * gib), "more is no saving");
}
