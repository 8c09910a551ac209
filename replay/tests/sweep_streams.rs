//! A sweep over a trace of many streams: one allocation and free on each of thousands of streams
//! (issue 33). The sweep replays the trace under every setting of `sweep_configs`, so work
//! per event that grew with the number of streams would be paid once per stream per setting,
//! and work that does not depend on the setting (the walk through the trace for its own
//! figures and start) is done once. The test checks the answers; docs/history/benchmarks.md has the time.

use vramscope_caching::{CachingAllocator, SimDevice, StreamId};
use vramscope_model::{AllocatorConfig, EventKind, Snapshot};
use vramscope_replay::{replay, sweep, sweep_configs, ReplayOptions};

/// The streams of the trace: enough that work per event growing with the streams would show
/// in the benchmark (docs/history/benchmarks.md runs 100,000), few enough that a debug build of the suite
/// runs it in seconds.
const STREAMS: u64 = 4_000;

/// A trace recorded by vramscope of one 512-byte allocation and its free on each of
/// `streams` streams, one after another: each stream reserves a small segment of its own,
/// which stays cached.
fn one_block_per_stream(streams: u64) -> Snapshot {
    let alloc = CachingAllocator::new(SimDevice::phantom(1 << 50), AllocatorConfig::default());
    for stream in 0..streams {
        let ptr = alloc.alloc_ptr(512, StreamId(stream)).unwrap();
        alloc.free_ptr(ptr).unwrap();
    }
    alloc.snapshot()
}

#[test]
fn a_sweep_over_a_hundred_thousand_streams_answers_for_every_setting() {
    let snapshot = one_block_per_stream(STREAMS);
    let allocs = snapshot
        .events
        .iter()
        .filter(|e| e.kind == EventKind::Alloc)
        .count() as u64;
    assert_eq!(allocs, STREAMS, "every allocation is in the trace");
    let rows = sweep(&snapshot, None, &mut |_, _| {});
    assert_eq!(rows.len(), sweep_configs().len());
    for row in &rows {
        let (figures, original) = (&row.result.figures, &row.result.original);
        // The trace's own figures, walked once for all the settings, are each row's.
        assert_eq!(original.allocs, STREAMS, "{}", row.config);
        assert_eq!(original.segment_allocs, Some(STREAMS), "{}", row.config);
        assert_eq!(original.peak_reserved, Some(STREAMS * (2 << 20)));
        assert_eq!(figures.peak_allocated, Some(512), "{}", row.config);
        if row.config.contains("expandable_segments") || row.config.contains("compact") {
            // Each stream reserves address space for 9/8 of the device: with enough streams
            // the simulated device runs out of addresses, which the row says; either way every
            // request is answered, served or refused.
            if let Some(oom) = row.result.first_oom.as_ref() {
                assert!(oom.address_space, "{}", row.config);
                assert!(!row.fits, "{}", row.config);
            }
            assert_eq!(
                figures.allocs + figures.num_ooms.unwrap(),
                STREAMS,
                "{}",
                row.config
            );
        } else {
            assert!(row.fits, "{}", row.config);
            assert_eq!(figures.allocs, STREAMS, "{}", row.config);
            assert_eq!(figures.frees, STREAMS, "{}", row.config);
            assert_eq!(figures.num_ooms, Some(0), "{}", row.config);
            // A 2 MiB small segment per stream, cached.
            assert_eq!(figures.segment_allocs, Some(STREAMS), "{}", row.config);
            assert_eq!(figures.peak_reserved, Some(STREAMS * (2 << 20)));
        }
    }
    // The defaults' row is the replay on its own.
    let defaults = rows.iter().find(|r| r.config == "(defaults)").unwrap();
    let alone = replay(&snapshot, &ReplayOptions::default(), &mut |_, _| {});
    assert_eq!(defaults.result.figures, alone.figures);
    assert_eq!(defaults.result.original, alone.original);
}
