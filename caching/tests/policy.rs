//! One test per rule of PyTorch's caching policy, on the simulated device.

use vramscope_caching::{AllocError, CachingAllocator, SimDevice, StreamId};
use vramscope_model::{AllocatorConfig, BlockState, EventKind, Pool};

const MIB: u64 = 1 << 20;

fn phantom(capacity: u64, conf: &str) -> (SimDevice, CachingAllocator<SimDevice>) {
    let device = SimDevice::phantom(capacity);
    let alloc = CachingAllocator::new(device.clone(), AllocatorConfig::parse(conf).unwrap());
    (device, alloc)
}

fn segment_sizes(alloc: &CachingAllocator<SimDevice>) -> Vec<u64> {
    alloc
        .snapshot()
        .segments
        .iter()
        .map(|s| s.total_size)
        .collect()
}

#[test]
fn small_requests_share_a_2_mib_segment_and_round_to_512() {
    let (_, alloc) = phantom(1 << 30, "");
    let a = alloc.alloc(1).unwrap();
    let b = alloc.alloc(700).unwrap();
    assert_eq!(
        b.addr() - a.addr(),
        512,
        "a 1-byte request takes one 512-byte block"
    );
    let stats = alloc.stats();
    assert_eq!(stats.allocated_bytes.small_pool.current, 512 + 1024);
    assert_eq!(stats.requested_bytes.all.current, 701);
    assert_eq!(segment_sizes(&alloc), vec![2 * MIB]);
    alloc.check_invariants().unwrap();
}

#[test]
fn large_requests_get_20_mib_or_rounded_segments() {
    let (_, alloc) = phantom(1 << 30, "");
    let _a = alloc.alloc(MIB + 1).unwrap();
    // 11 MiB fits in the 19 MiB left of the first segment: no new segment.
    let _b = alloc.alloc(11 * MIB).unwrap();
    assert_eq!(segment_sizes(&alloc), vec![20 * MIB]);
    // 21 MiB gets a segment of its own, rounded up to 2 MiB.
    let _c = alloc.alloc(21 * MIB).unwrap();
    assert_eq!(segment_sizes(&alloc), vec![20 * MIB, 22 * MIB]);
    let stats = alloc.stats();
    assert_eq!(stats.reserved_bytes.large_pool.current, 42 * MIB);
    assert_eq!(stats.segment.all.current, 2);
    assert_eq!(stats.num_device_alloc, 2);
}

#[test]
fn blocks_never_move_between_pools() {
    let (_, alloc) = phantom(1 << 30, "");
    let big = alloc.alloc(3 * MIB).unwrap();
    drop(big);
    // A small request must not be carved out of the cached 20 MiB large segment.
    let _small = alloc.alloc(4096).unwrap();
    assert_eq!(alloc.stats().segment.all.current, 2);
    assert_eq!(alloc.stats().segment.small_pool.current, 1);
}

#[test]
fn best_fit_takes_the_smallest_block_that_fits() {
    let (_, alloc) = phantom(1 << 30, "");
    let a = alloc.alloc(12 * MIB).unwrap();
    let b = alloc.alloc(16 * MIB).unwrap();
    let (a_addr, b_addr) = (a.addr(), b.addr());
    drop(a);
    drop(b);
    let c = alloc.alloc(11 * MIB).unwrap();
    assert_eq!(
        c.addr(),
        a_addr,
        "the 12 MiB segment is the smallest that fits"
    );
    let d = alloc.alloc(13 * MIB).unwrap();
    assert_eq!(d.addr(), b_addr);
    assert_eq!(alloc.stats().num_device_alloc, 2);
}

#[test]
fn free_blocks_are_reused_only_on_the_same_stream() {
    let (device, alloc) = phantom(1 << 30, "");
    let side = vramscope_caching::Backend::create_stream(&device).unwrap();
    let a = alloc.alloc(4096).unwrap();
    drop(a);
    let b = alloc.alloc_on(4096, side).unwrap();
    assert_eq!(
        alloc.stats().segment.all.current,
        2,
        "other stream gets its own segment"
    );
    assert_eq!(b.stream(), side);
}

#[test]
fn small_pool_splits_remainders_of_512_bytes() {
    let (_, alloc) = phantom(1 << 30, "");
    let a = alloc.alloc(MIB).unwrap();
    let _b = alloc.alloc(MIB - 512).unwrap();
    let c = alloc.alloc(512).unwrap();
    assert_eq!(c.addr(), a.addr() + 2 * MIB - 512);
    assert_eq!(alloc.stats().segment.all.current, 1);
}

#[test]
fn large_pool_keeps_remainders_of_1_mib_or_less_inside_the_block() {
    let (_, alloc) = phantom(1 << 30, "");
    // 19 MiB from a 20 MiB segment leaves exactly 1 MiB: not split, so the block is 20 MiB.
    let a = alloc.alloc(19 * MIB).unwrap();
    assert_eq!(alloc.stats().allocated_bytes.all.current, 20 * MIB);
    assert_eq!(alloc.stats().requested_bytes.all.current, 19 * MIB);
    drop(a);
    // 18 MiB leaves 2 MiB: split.
    let _b = alloc.alloc(18 * MIB).unwrap();
    assert_eq!(alloc.stats().allocated_bytes.all.current, 18 * MIB);
    assert_eq!(alloc.stats().inactive_split_bytes.all.current, 2 * MIB);
    alloc.check_invariants().unwrap();
}

#[test]
fn max_split_size_stops_splitting_and_limits_oversize_waste() {
    let (_, alloc) = phantom(1 << 30, "max_split_size_mb:20");
    let a = alloc.alloc(40 * MIB).unwrap();
    drop(a);
    // A small request may not take the cached 40 MiB oversize block.
    let _b = alloc.alloc(2 * MIB).unwrap();
    assert_eq!(alloc.stats().segment.all.current, 2);
    // A 21 MiB request may take it whole (unsplit) since it wastes less than 20 MiB.
    let c = alloc.alloc(21 * MIB).unwrap();
    assert_eq!(alloc.stats().segment.all.current, 2);
    assert_eq!(
        alloc.stats().allocated_bytes.all.current,
        2 * MIB + 40 * MIB
    );
    drop(c);
    // A 30 MiB request on a fresh allocator with a cached 60 MiB block gets a new segment.
    let (_, alloc) = phantom(1 << 30, "max_split_size_mb:20");
    drop(alloc.alloc(60 * MIB).unwrap());
    let _d = alloc.alloc(30 * MIB).unwrap();
    assert_eq!(alloc.stats().segment.all.current, 2);
    assert_eq!(alloc.stats().oversize_segments.current, 2);
}

#[test]
fn frees_merge_with_free_neighbours_inside_the_segment_only() {
    let (_, alloc) = phantom(1 << 30, "");
    let a = alloc.alloc(4096).unwrap();
    let b = alloc.alloc(4096).unwrap();
    let c = alloc.alloc(4096).unwrap();
    drop(a);
    drop(c);
    alloc.check_invariants().unwrap();
    let snap = alloc.snapshot();
    assert_eq!(snap.segments[0].blocks.len(), 3, "a | b | c+rest");
    drop(b);
    let snap = alloc.snapshot();
    assert_eq!(snap.segments[0].blocks.len(), 1, "everything merged back");
    assert_eq!(snap.segments[0].blocks[0].state, BlockState::Inactive);
    assert_eq!(alloc.stats().inactive_split.all.current, 0);
    // Never released on a plain free.
    assert_eq!(alloc.stats().num_device_free, 0);
    assert_eq!(alloc.stats().reserved_bytes.all.current, 2 * MIB);
}

#[test]
fn record_stream_defers_reuse_until_the_event_completes() {
    let (device, alloc) = phantom(1 << 30, "");
    device.set_manual_events(true);
    let side = vramscope_caching::Backend::create_stream(&device).unwrap();
    let a = alloc.alloc(4096).unwrap();
    let addr = a.addr();
    a.record_stream(side).unwrap();
    drop(a);
    assert_eq!(
        alloc.stats().active.all.current,
        1,
        "pending free is still active"
    );
    assert_eq!(
        alloc.snapshot().segments[0].blocks[0].state,
        BlockState::ActivePendingFree
    );
    let b = alloc.alloc(4096).unwrap();
    assert_ne!(b.addr(), addr, "the pending block is not reused");
    device.complete_stream(side);
    drop(b);
    let c = alloc.alloc(4096).unwrap();
    assert_eq!(
        c.addr(),
        addr,
        "after the event completes the block is reused"
    );
    alloc.check_invariants().unwrap();
}

#[test]
fn empty_cache_releases_only_segments_without_live_blocks() {
    let (device, alloc) = phantom(1 << 30, "");
    let keep = alloc.alloc(4096).unwrap();
    let big = alloc.alloc(30 * MIB).unwrap();
    let small2 = alloc.alloc(MIB).unwrap();
    drop(big);
    drop(small2);
    let released = alloc.empty_cache();
    assert_eq!(released, 30 * MIB);
    let stats = alloc.stats();
    assert_eq!(stats.reserved_bytes.all.current, 2 * MIB);
    assert_eq!(stats.num_device_free, 1);
    assert_eq!(stats.inactive_split_bytes.all.current, 2 * MIB - 4096);
    drop(keep);
    alloc.empty_cache();
    assert_eq!(device.counters().outstanding_bytes, 0);
    let snap = alloc.snapshot();
    assert!(snap.events.iter().any(|e| e.kind == EventKind::EmptyCache));
}

#[test]
fn oom_frees_the_cache_and_retries_before_failing() {
    let (_, alloc) = phantom(64 * MIB, "");
    drop(alloc.alloc(40 * MIB).unwrap());
    // 40 MiB is cached; a 50 MiB request only fits after it is released.
    let b = alloc.alloc(50 * MIB).unwrap();
    let stats = alloc.stats();
    assert_eq!(stats.num_alloc_retries, 1);
    assert_eq!(stats.num_device_free, 1);
    assert_eq!(stats.num_ooms, 0);
    drop(b);
}

#[test]
fn oom_error_names_request_capacity_holders_and_a_setting() {
    let (_, alloc) = phantom(100 * MIB, "");
    let mut keep = Vec::new();
    for _ in 0..4 {
        keep.push(alloc.tagged("weights").alloc(18 * MIB).unwrap());
    }
    let err = alloc.alloc(30 * MIB).unwrap_err();
    let AllocError::OutOfMemory(report) = &err else {
        panic!("expected OOM, got {err}");
    };
    assert_eq!(report.requested, 30 * MIB);
    assert_eq!(report.capacity, 100 * MIB);
    assert_eq!(report.allocated, 72 * MIB);
    assert_eq!(report.reserved_unallocated(), 0);
    assert_eq!(report.top_sites.len(), 1);
    assert!(report.top_sites[0].0.contains("tests/policy.rs"));
    let text = err.to_string();
    assert!(text.contains("30.0 MiB"), "{text}");
    assert!(text.contains("100 MiB in total"), "{text}");
    assert!(text.contains("policy.rs"), "{text}");
    let stats = alloc.stats();
    assert_eq!(stats.num_ooms, 1);
    let snap = alloc.snapshot();
    let oom = snap
        .events
        .iter()
        .find(|e| e.kind == EventKind::Oom)
        .unwrap();
    assert_eq!(oom.size, 30 * MIB);
    // Fragmentation: lots reserved but unallocated gets a setting named.
    let (_, alloc) = phantom(100 * MIB, "");
    let mut held = Vec::new();
    let mut freed_later = Vec::new();
    for _ in 0..5 {
        // Each 2 MiB block pins a 20 MiB segment whose other 18 MiB is freed below.
        held.push(alloc.alloc(2 * MIB).unwrap());
        freed_later.push(alloc.alloc(17 * MIB).unwrap());
    }
    drop(freed_later);
    assert_eq!(alloc.stats().reserved_bytes.all.current, 100 * MIB);
    let err = alloc.alloc(30 * MIB).unwrap_err().to_string();
    assert!(err.contains("expandable_segments:True"), "{err}");
}

/// An OOM under the memory limit with the device's memory free names the limit, not
/// fragmentation (`vramscope_model::oom`, the rule the inspector's report shares).
#[test]
fn oom_under_the_memory_limit_names_the_limit() {
    let (_, alloc) = phantom(1 << 30, "");
    alloc.set_memory_limit(Some(100 * MIB));
    let held = alloc.alloc(90 * MIB).unwrap();
    let err = alloc.alloc(30 * MIB).unwrap_err().to_string();
    assert!(err.contains("memory cap of 100 MiB"), "{err}");
    assert!(err.contains("CachingAllocator::set_memory_limit"), "{err}");
    assert!(!err.contains("fragmentation"), "{err}");
    assert!(!err.contains("max_split_size_mb"), "{err}");
    drop(held);
}

#[test]
fn misuse_is_an_error_not_a_crash() {
    let (_, alloc) = phantom(1 << 30, "");
    let a = alloc.alloc_ptr(4096, StreamId::DEFAULT).unwrap();
    alloc.free_ptr(a).unwrap();
    assert!(matches!(
        alloc.free_ptr(a),
        Err(AllocError::DoubleFree { .. })
    ));
    assert!(matches!(
        alloc.free_ptr(0xdead_beef),
        Err(AllocError::UnknownPointer { .. })
    ));
    let b = alloc.alloc_ptr(4096, StreamId::DEFAULT).unwrap();
    assert!(matches!(
        alloc.free_ptr_on(b, 3),
        Err(AllocError::WrongDevice {
            expected: 0,
            found: 3
        })
    ));
    alloc.free_ptr_on(b, 0).unwrap();
    let mut buf = alloc.alloc(16).unwrap();
    assert!(matches!(
        buf.copy_from_host(&[0; 32]),
        Err(AllocError::OutOfBounds { .. })
    ));
    alloc.check_invariants().unwrap();
}

#[test]
fn zero_sized_allocations_hold_nothing() {
    let (_, alloc) = phantom(1 << 30, "");
    let a = alloc.alloc(0).unwrap();
    assert!(a.is_empty());
    assert_eq!(alloc.stats().allocation.all.current, 0);
}

#[test]
fn roundup_power2_divisions_rounds_large_requests() {
    let (_, alloc) = phantom(1 << 34, "roundup_power2_divisions:4");
    let _a = alloc.alloc(1200 * MIB).unwrap();
    assert_eq!(alloc.stats().allocated_bytes.all.current, 1280 * MIB);
}

#[test]
fn garbage_collection_threshold_frees_idle_segments_early() {
    let (_, alloc) = phantom(100 * MIB, "garbage_collection_threshold:0.5");
    drop(alloc.alloc(30 * MIB).unwrap());
    drop(alloc.alloc(34 * MIB).unwrap());
    // 64 MiB reserved > 50 MiB: the next miss frees the idle segments at least as old as the
    // average (ages 2 and 1 in large-pool lookups: only the 30 MiB one).
    let _c = alloc.alloc(40 * MIB).unwrap();
    let stats = alloc.stats();
    assert_eq!(stats.num_device_free, 1);
    assert_eq!(stats.num_alloc_retries, 0);
    assert_eq!(stats.reserved_bytes.all.current, 74 * MIB);
}

#[test]
fn garbage_collection_frees_every_segment_of_average_age_past_its_target() {
    // PyTorch's rule, not least-recently-used-until-under: one pass frees every idle segment at
    // least as old as the average, even past the bytes it had to reclaim.
    let (_, alloc) = phantom(100 * MIB, "garbage_collection_threshold:0.5");
    let a = alloc.alloc(12 * MIB).unwrap();
    let b = alloc.alloc(14 * MIB).unwrap();
    let _c = alloc.alloc(16 * MIB).unwrap();
    drop(a);
    drop(b);
    // An 18 MiB segment reused five times: its lookups age the 12 and 14 MiB segments.
    for _ in 0..6 {
        drop(alloc.alloc(18 * MIB).unwrap());
    }
    assert_eq!(alloc.stats().reserved_bytes.all.current, 60 * MIB);
    // 60 MiB reserved > 50: 10 MiB must go. Ages 7, 7 and 1 average 5, so both old segments
    // go (26 MiB); least recently used first would have stopped after the 12 MiB one.
    let _d = alloc.alloc(30 * MIB).unwrap();
    let stats = alloc.stats();
    assert_eq!(stats.num_device_free, 2);
    assert_eq!(stats.num_alloc_retries, 0);
    assert_eq!(stats.reserved_bytes.all.current, (16 + 18 + 30) * MIB);
    alloc.check_invariants().unwrap();
}

#[test]
fn expandable_segments_grow_in_place_and_trim() {
    // PyTorch maps an expandable segment of the large pool in 20 MiB pages (as seen on an H200
    // with torch 2.11: its segment_map events are multiples of 20 MiB), and the `compact`
    // policy in the device's 2 MiB granularity.
    for (conf, mapped, maps, after_trim) in [
        ("expandable_segments:True", 20 * MIB, 1, 20 * MIB),
        ("policy:compact", 8 * MIB, 2, 4 * MIB),
    ] {
        let (device, alloc) = phantom(1 << 30, conf);
        let a = alloc.alloc(3 * MIB).unwrap();
        let b = alloc.alloc(5 * MIB).unwrap();
        assert_eq!(
            b.addr(),
            a.addr() + 3 * MIB,
            "{conf}: contiguous in one segment"
        );
        let snap = alloc.snapshot();
        let large: Vec<_> = snap
            .segments
            .iter()
            .filter(|s| s.pool == Pool::Large)
            .collect();
        assert_eq!(large.len(), 1, "{conf}");
        assert!(large[0].expandable, "{conf}");
        assert_eq!(large[0].total_size, mapped, "{conf}: mapped bytes");
        assert_eq!(alloc.stats().num_device_alloc, maps, "{conf}: map calls");
        assert!(snap.events.iter().any(|e| e.kind == EventKind::SegmentMap));
        alloc.check_invariants().unwrap();
        drop(b);
        // Only whole free pages at the tail are unmapped.
        alloc.empty_cache();
        assert_eq!(
            alloc.stats().reserved_bytes.all.current,
            after_trim,
            "{conf}: after the tail's free pages are unmapped"
        );
        drop(a);
        alloc.empty_cache();
        assert_eq!(alloc.stats().reserved_bytes.all.current, 0, "{conf}");
        assert_eq!(alloc.stats().segment.all.current, 0, "{conf}");
        alloc.check_invariants().unwrap();
        assert_eq!(device.counters().outstanding_bytes, 0, "{conf}");
    }
}

#[test]
fn best_fit_passes_over_the_free_end_of_an_expandable_segment() {
    // PyTorch sizes the free block at an expandable segment's end by what it could grow to, so
    // a request that fits both it and a larger free block elsewhere takes the larger one.
    let (_, alloc) = phantom(1 << 30, "expandable_segments:True");
    let a = alloc.alloc(6 * MIB).unwrap();
    let base = a.addr();
    let _b = alloc.alloc(10 * MIB).unwrap();
    // One 20 MiB page: [a 6][b 10][free end 4].
    drop(a);
    let c = alloc.alloc(3 * MIB).unwrap();
    assert_eq!(c.addr(), base, "the 6 MiB hole, not the 4 MiB free end");
    assert_eq!(alloc.stats().reserved_bytes.all.current, 20 * MIB);
    alloc.check_invariants().unwrap();
}

#[test]
fn releasing_unmaps_free_pages_inside_an_expandable_segment_and_maps_holes_first() {
    // PyTorch's `unmap_block`: a release unmaps the whole free pages of every free block, in
    // the middle of a segment too, and growth fills the lowest unmapped range first.
    let (device, alloc) = phantom(1 << 30, "expandable_segments:True");
    let a = alloc.alloc(20 * MIB).unwrap();
    let base = a.addr();
    let b = alloc.alloc(20 * MIB).unwrap();
    let c = alloc.alloc(20 * MIB).unwrap();
    drop(b);
    alloc.empty_cache();
    let stats = alloc.stats();
    assert_eq!(
        stats.reserved_bytes.all.current,
        40 * MIB,
        "the middle page is unmapped"
    );
    assert_eq!(stats.num_device_free, 1);
    let runs: Vec<(u64, u64)> = alloc
        .snapshot()
        .segments
        .iter()
        .filter(|s| s.pool == Pool::Large)
        .map(|s| (s.address - base, s.total_size))
        .collect();
    assert_eq!(
        runs,
        [(0, 20 * MIB), (40 * MIB, 20 * MIB)],
        "one segment per mapped run"
    );
    alloc.check_invariants().unwrap();
    // The hole is mapped again before the end grows.
    let d = alloc.alloc(10 * MIB).unwrap();
    assert_eq!(d.addr(), base + 20 * MIB);
    assert_eq!(alloc.stats().reserved_bytes.all.current, 60 * MIB);
    alloc.check_invariants().unwrap();
    // Free pages at the end leave the segment; a segment with nothing mapped is released.
    drop(d);
    drop(c);
    alloc.empty_cache();
    assert_eq!(alloc.stats().reserved_bytes.all.current, 20 * MIB);
    alloc.check_invariants().unwrap();
    drop(a);
    alloc.empty_cache();
    let stats = alloc.stats();
    assert_eq!(stats.reserved_bytes.all.current, 0);
    assert_eq!(stats.segment.all.current, 0);
    // Four maps (three pages, then the hole again); three unmaps (the hole, the last two
    // pages at once, the first page).
    assert_eq!((stats.num_device_alloc, stats.num_device_free), (4, 3));
    alloc.check_invariants().unwrap();
    assert_eq!(device.counters().outstanding_bytes, 0);
}

#[test]
fn a_free_block_keeps_its_partial_pages_when_the_whole_ones_are_unmapped() {
    let (device, alloc) = phantom(1 << 30, "expandable_segments:True");
    let a = alloc.alloc(30 * MIB).unwrap();
    let base = a.addr();
    // [a 30][b 30]: 60 MiB in three pages.
    let b = alloc.alloc(30 * MIB).unwrap();
    assert_eq!(b.addr(), base + 30 * MIB);
    drop(a);
    alloc.empty_cache();
    // [hole 20][free 10][b 30]: only the first page was wholly free.
    assert_eq!(alloc.stats().reserved_bytes.all.current, 40 * MIB);
    alloc.check_invariants().unwrap();
    // 25 MiB: the hole is mapped again and merges with the free 10 MiB after it.
    let c = alloc.alloc(25 * MIB).unwrap();
    assert_eq!(c.addr(), base);
    assert_eq!(alloc.stats().reserved_bytes.all.current, 60 * MIB);
    assert_eq!(alloc.stats().num_device_alloc, 3);
    alloc.check_invariants().unwrap();
    drop(b);
    drop(c);
    drop(alloc);
    assert_eq!(
        device.counters().outstanding_bytes,
        0,
        "dropping unmaps every run"
    );
}

#[test]
fn expandable_segments_reserve_address_space_beyond_the_holes() {
    // Address space for 9/8 of the capacity, as PyTorch reserves: after a hole of 40 MiB the
    // end still has room for 50 MiB on a 100 MiB device.
    let (_, alloc) = phantom(100 * MIB, "expandable_segments:True");
    let a = alloc.alloc(40 * MIB).unwrap();
    let _b = alloc.alloc(20 * MIB).unwrap();
    let c = alloc.alloc(20 * MIB).unwrap();
    drop(a);
    drop(c);
    alloc.empty_cache();
    assert_eq!(alloc.stats().reserved_bytes.all.current, 20 * MIB);
    let d = alloc.alloc(50 * MIB);
    assert!(d.is_ok(), "{:?}", d.err());
    assert_eq!(alloc.stats().reserved_bytes.all.current, 80 * MIB);
    let runs = alloc
        .snapshot()
        .segments
        .iter()
        .filter(|s| s.pool == Pool::Large)
        .count();
    assert_eq!(
        runs, 1,
        "one mapped run, in the same segment's address space"
    );
    // Like PyTorch, the `segment` statistic leaves expandable segments out.
    assert_eq!(alloc.stats().segment.all.current, 0);
    alloc.check_invariants().unwrap();
}

#[test]
fn a_second_expandable_segment_is_reserved_when_the_first_has_no_room() {
    let (device, alloc) = phantom(2048 * MIB, "expandable_segments:True");
    let a = alloc.alloc(1000 * MIB).unwrap();
    let b = alloc.alloc(1000 * MIB).unwrap();
    drop(a);
    alloc.empty_cache();
    // The hole holds 1000 MiB and the end 304 MiB of the 2304 MiB reserved: 1040 MiB goes to
    // a new segment.
    let c = alloc.alloc(1040 * MIB).unwrap();
    let starts: Vec<u64> = alloc
        .snapshot()
        .segments
        .iter()
        .map(|s| s.address)
        .collect();
    assert_eq!(starts.len(), 2);
    assert!(
        starts.contains(&c.addr()) && starts.contains(&b.addr()),
        "two mapped runs: b after the first segment's hole, c at the second's start"
    );
    assert_eq!(alloc.stats().reserved_bytes.all.current, 2040 * MIB);
    alloc.check_invariants().unwrap();
    drop(b);
    drop(c);
    alloc.empty_cache();
    assert!(alloc.snapshot().segments.is_empty());
    assert_eq!(device.counters().outstanding_bytes, 0);
}

#[test]
fn expandable_segments_check_the_cap_against_a_whole_segment_like_pytorch() {
    // PyTorch's `alloc_block` refuses when reserved + the request's segment size passes the
    // cap, before it looks for room. [a 4][free 16] is mapped; 30 MiB more needs only one more
    // 20 MiB page (40 MiB mapped, under the 45 MiB cap), but is checked as 20 + 30 > 45.
    for (conf, fits) in [
        ("expandable_segments:True", false),
        ("policy:compact", true),
    ] {
        let (_, alloc) = phantom(45 * MIB, conf);
        let _a = alloc.alloc(4 * MIB).unwrap();
        assert_eq!(alloc.alloc(30 * MIB).is_ok(), fits, "{conf}");
        alloc.check_invariants().unwrap();
    }
}

#[test]
fn a_memory_limit_is_checked_like_pytorchs_memory_fraction() {
    // Checked when a segment is needed, against a plain segment's size: with expandable
    // segments the page then mapped may pass the limit, as in PyTorch.
    let (_, alloc) = phantom(1 << 30, "expandable_segments:True");
    alloc.set_memory_limit(Some(35 * MIB));
    let _a = alloc.alloc(20 * MIB).unwrap();
    // 20 + 12 <= 35 passes the check; one more 20 MiB page makes 40 MiB reserved.
    let _b = alloc.alloc(12 * MIB).unwrap();
    assert_eq!(alloc.stats().reserved_bytes.all.current, 40 * MIB);
    // 40 + 20 > 35: refused, after freeing the cache and retrying.
    assert!(alloc.alloc(20 * MIB).is_err());
    assert_eq!(alloc.stats().num_alloc_retries, 1);
    // Plain segments: the same check, and their segments are what is reserved.
    let (_, plain) = phantom(1 << 30, "");
    plain.set_memory_limit(Some(35 * MIB));
    let _c = plain.alloc(20 * MIB).unwrap();
    assert!(plain.alloc(20 * MIB).is_err());
    plain.set_memory_limit(None);
    assert!(plain.alloc(20 * MIB).is_ok(), "the limit lifted");
}

#[test]
fn compact_fits_where_20_mib_segments_and_pages_do_not() {
    // On a 16 MiB device a 3 MiB request needs a 20 MiB segment without expandable segments,
    // and a 20 MiB page with them; the `compact` policy maps only the 8 MiB it needs.
    for (conf, should_fit) in [
        ("", false),
        ("expandable_segments:True", false),
        ("policy:compact", true),
    ] {
        let (device, alloc) = phantom(16 * MIB, conf);
        let fits = alloc.alloc(3 * MIB).is_ok() && alloc.alloc(5 * MIB).is_ok();
        assert_eq!(fits, should_fit, "conf {conf:?}");
        alloc.check_invariants().unwrap();
        drop(alloc);
        assert_eq!(device.counters().outstanding_bytes, 0);
    }
}

#[test]
fn provenance_records_site_tag_scope_step_and_thread() {
    let (_, alloc) = phantom(1 << 30, "");
    alloc.mark_step();
    let _weights = {
        let _s = alloc.scope("model");
        let _inner = alloc.scope("layer1");
        alloc.tagged("weight").alloc(4096).unwrap()
    };
    let line = line!() - 2;
    let _other = alloc.alloc(4096).unwrap();
    let snap = alloc.snapshot();
    let block = snap.segments[0]
        .blocks
        .iter()
        .find(|b| b.tag.is_some())
        .unwrap();
    let site = snap.site(block.site).unwrap();
    assert!(site.file.ends_with("policy.rs"));
    assert_eq!(site.line, line);
    assert_eq!(snap.tag(block.tag), Some("weight"));
    assert_eq!(snap.scope(block.scope), Some("model/layer1"));
    assert_eq!(block.step, 1);
    assert!(block.thread > 0);
    let other = snap.segments[0]
        .blocks
        .iter()
        .find(|b| b.state == BlockState::ActiveAllocated && b.tag.is_none())
        .unwrap();
    assert_eq!(other.scope, None, "the scope closed with its guard");
    assert_eq!(snap.steps.len(), 1);
}

#[test]
fn sampled_backtraces_are_symbolized_in_snapshots() {
    let device = SimDevice::phantom(1 << 30);
    let alloc = CachingAllocator::new(device, AllocatorConfig::parse("backtraces:all").unwrap());
    let _a = alloc.alloc(4096).unwrap();
    let snap = alloc.snapshot();
    let site = &snap.sites[0];
    assert!(!site.frames.is_empty(), "a backtrace was captured");
    assert!(
        site.frames
            .iter()
            .any(|f| f.function.contains("sampled_backtraces")),
        "{:?}",
        site.frames
    );
}

#[test]
fn events_record_kinds_in_order_and_the_ring_is_bounded() {
    let device = SimDevice::backed(1 << 30);
    let alloc = CachingAllocator::new(device, AllocatorConfig::parse("max_entries:8").unwrap());
    let mut a = alloc.alloc(4096).unwrap();
    a.copy_from_host(&[1; 16]).unwrap();
    let mut back = [0u8; 4];
    a.copy_to_host(&mut back).unwrap();
    assert_eq!(back, [1; 4]);
    drop(a);
    let snap = alloc.snapshot();
    let kinds: Vec<&str> = snap.events.iter().map(|e| e.kind.name()).collect();
    assert_eq!(
        kinds,
        [
            "segment_alloc",
            "alloc",
            "transfer_h2d",
            "transfer_d2h",
            "free_requested",
            "free_completed",
            "snapshot"
        ]
    );
    for _ in 0..10 {
        drop(alloc.alloc(512).unwrap());
    }
    let snap = alloc.snapshot();
    assert_eq!(snap.events.len(), 8);
    assert!(snap.dropped_events > 0);
    assert!(snap.events.windows(2).all(|w| w[1].seq == w[0].seq + 1));
}

#[test]
fn snapshots_round_trip_through_json() {
    let (_, alloc) = phantom(1 << 30, "");
    let _a = alloc.tagged("x").alloc(12345).unwrap();
    alloc.mark_step();
    let snap = alloc.snapshot();
    let dir = std::env::temp_dir().join(format!("vramscope-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("snap.json");
    snap.save(&path).unwrap();
    let back = vramscope_model::Snapshot::load(&path).unwrap();
    assert_eq!(back, snap);
    std::fs::write(&path, b"{\"format_version\": 1, \"source\": ").unwrap();
    let err = vramscope_model::Snapshot::load(&path)
        .unwrap_err()
        .to_string();
    assert!(err.contains("snap.json"), "{err}");
    std::fs::write(&path, b"{\"format_version\": 99}").unwrap();
    let err = vramscope_model::Snapshot::load(&path)
        .unwrap_err()
        .to_string();
    assert!(err.contains("version 99"), "{err}");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn memory_summary_is_an_aligned_table() {
    let (_, alloc) = phantom(1 << 30, "");
    let _a = alloc.alloc(5 * MIB).unwrap();
    let text = alloc.memory_summary();
    assert!(text.contains("Allocated memory"));
    assert!(text.contains("GPU reserved memory"));
    assert!(text.lines().all(|l| l.chars().count() <= 80));
    alloc.reset_peak_stats();
    assert_eq!(alloc.stats().allocated_bytes.all.peak, 5 * MIB);
}

#[test]
fn dropping_the_allocator_returns_every_segment() {
    let device = SimDevice::phantom(1 << 30);
    {
        let alloc = CachingAllocator::new(device.clone(), AllocatorConfig::default());
        let _a = alloc.alloc(4096).unwrap();
        let leaked = alloc.alloc(30 * MIB).unwrap().into_raw();
        assert!(leaked != 0);
    }
    assert_eq!(device.counters().outstanding_bytes, 0);
}

#[test]
fn events_since_pulls_by_sequence_and_counts_missed() {
    let device = SimDevice::phantom(1 << 30);
    let alloc = CachingAllocator::new(device, AllocatorConfig::parse("max_entries:4").unwrap());
    let a = alloc.alloc(512).unwrap();
    let batch = alloc.events_since(0, 100);
    assert_eq!(batch.events.len(), 2, "segment_alloc and alloc");
    assert_eq!(batch.next_seq, 2);
    assert_eq!(batch.missed, 0);
    assert_eq!(batch.stats.allocation.all.current, 1);
    drop(a);
    for _ in 0..3 {
        drop(alloc.alloc(512).unwrap());
    }
    let later = alloc.events_since(batch.next_seq, 100);
    assert!(later.missed > 0, "the 4-entry ring overwrote events");
    assert_eq!(later.events.len(), 4);
    assert!(later.events.windows(2).all(|w| w[1].seq == w[0].seq + 1));
    let tables = alloc.site_tables();
    let site = &tables.sites[later.events[0].site().unwrap() as usize];
    assert!(site.file.ends_with("policy.rs"));
    assert_eq!(alloc.events_since(later.next_seq, 10).events.len(), 0);
}

#[test]
fn seventy_thousand_streams_never_share_a_free_block() {
    // More (stream, pool) free lists than a 16-bit index counts: stream 65,537 once got
    // stream 1's list, and with it blocks another stream might still be using on a GPU.
    let (_, alloc) = phantom(1 << 40, "");
    let streams = 70_000u64;
    let mut first = vec![0u64; streams as usize + 1];
    for s in 1..=streams {
        let p = alloc.alloc_ptr(512, StreamId(s)).unwrap();
        first[s as usize] = p;
        alloc.free_ptr(p).unwrap();
    }
    alloc.check_invariants().unwrap();
    let segments = alloc.stats().num_device_alloc;
    assert_eq!(segments, streams, "one small segment per stream");
    for s in [
        1u64, 2, 65_534, 65_535, 65_536, 65_537, 65_538, 69_999, 70_000,
    ] {
        let p = alloc.alloc_ptr(512, StreamId(s)).unwrap();
        assert_eq!(
            p, first[s as usize],
            "stream {s} reuses its own cached block"
        );
        alloc.free_ptr(p).unwrap();
    }
    assert_eq!(alloc.stats().num_device_alloc, segments, "no new segment");
    alloc.check_invariants().unwrap();
}

#[test]
fn table_additions_are_the_tables_past_what_is_known() {
    let alloc = CachingAllocator::new(
        SimDevice::phantom(1 << 30),
        AllocatorConfig::parse("backtraces:all").unwrap(),
    );
    let _a = alloc.tagged("weights").alloc(512).unwrap();
    let known = alloc.site_tables();
    let _scope = alloc.scope("forward");
    let _b = alloc.tagged("activation").alloc(1024).unwrap();
    let all = alloc.site_tables();
    let added = alloc.site_tables_since(known.sites.len(), known.tags.len(), known.scopes.len());
    assert!(!added.sites.is_empty() && !added.tags.is_empty() && !added.scopes.is_empty());
    assert_eq!(added.sites, all.sites[known.sites.len()..]);
    assert_eq!(added.tags, all.tags[known.tags.len()..]);
    assert_eq!(added.scopes, all.scopes[known.scopes.len()..]);
    let nothing = alloc.site_tables_since(all.sites.len(), all.tags.len(), all.scopes.len());
    assert!(nothing.sites.is_empty() && nothing.tags.is_empty() && nothing.scopes.is_empty());
}

#[test]
fn buffers_and_raw_pointers_do_not_free_each_other() {
    let (_, alloc) = phantom(1 << 30, "");
    let buffer = alloc.alloc(4096).unwrap();
    assert!(matches!(
        alloc.free_ptr(buffer.addr()),
        Err(AllocError::OwnedByBuffer { .. })
    ));
    alloc.check_invariants().unwrap();
    // Handing the buffer over to the raw API makes the pointer freeable there, once.
    let raw = buffer.into_raw();
    alloc.check_invariants().unwrap();
    alloc.free_ptr(raw).unwrap();
    assert!(matches!(
        alloc.free_ptr(raw),
        Err(AllocError::DoubleFree { .. })
    ));
    let buffer = alloc.alloc(4096).unwrap();
    buffer.free().unwrap();
    assert_eq!(alloc.stats().allocation.all.current, 0);
    alloc.check_invariants().unwrap();
}

#[test]
fn compact_policy_grows_segments_in_place() {
    let (_, alloc) = phantom(1 << 30, "policy:compact");
    assert!(alloc.config().uses_expandable_segments());
    let a = alloc.alloc(3 * MIB).unwrap();
    let b = alloc.alloc(5 * MIB).unwrap();
    assert_eq!(b.addr(), a.addr() + 3 * MIB);
    assert_eq!(alloc.stats().reserved_bytes.all.current, 8 * MIB);
    alloc.check_invariants().unwrap();
}

#[test]
fn device_level_events_carry_no_call_site_of_their_own() {
    let (_, alloc) = phantom(1 << 30, "");
    let _a = alloc.tagged("weights").alloc(4096).unwrap();
    let snapshot = alloc.snapshot();
    for event in &snapshot.events {
        match event.kind {
            EventKind::SegmentAlloc | EventKind::Snapshot => {
                assert_eq!(event.site, None, "{event:?}");
                assert_eq!(event.tag, None, "{event:?}");
            }
            EventKind::Alloc => assert!(event.site.is_some()),
            _ => {}
        }
    }
}

#[test]
fn snapshots_can_carry_only_recent_history() {
    let (_, alloc) = phantom(1 << 30, "");
    for _ in 0..10 {
        drop(alloc.alloc(512).unwrap());
    }
    let full = alloc.snapshot();
    let recent = alloc.snapshot_with_history(5);
    assert_eq!(recent.events.len(), 5);
    assert_eq!(recent.events.last().unwrap().kind, EventKind::Snapshot);
    assert!(full.events.len() > 20);
    assert_eq!(recent.segments, full.segments);
}

#[test]
fn block_handles_under_the_held_lock_follow_the_same_policy_and_books() {
    let (_, alloc) = phantom(1 << 30, "");
    let (first, second) = {
        let mut exclusive = alloc.exclusive();
        let first = exclusive.alloc_block(3000, StreamId::DEFAULT).unwrap();
        let second = exclusive.alloc_ptr(5000, StreamId::DEFAULT).unwrap();
        assert_eq!(
            first.addr() + 3072,
            second,
            "rounded to 512 and split in one segment"
        );
        let stats = exclusive.stats();
        assert_eq!(stats.allocated_bytes.all.current, 3072 + 5120);
        assert_eq!(stats.requested_bytes.all.current, 8000);
        (first, second)
    };
    // The guard has dropped: the thread-safe API works again, on the same books.
    assert_eq!(alloc.live_blocks(), 2);
    alloc.free_ptr(second).unwrap();
    let address = first.addr();
    alloc.free_block(first).unwrap();
    assert_eq!(alloc.stats().allocated_bytes.all.current, 0);
    let again = alloc.alloc_block(3000, StreamId::DEFAULT).unwrap();
    assert_eq!(again.addr(), address, "the freed block is reused first");
    alloc.check_invariants().unwrap();
    assert_eq!(alloc.alloc_block(0, StreamId::DEFAULT).unwrap().addr(), 0);
    alloc.free_block(again).unwrap();
}

#[test]
fn a_block_handle_freed_on_the_wrong_allocator_is_refused() {
    let (_, mine) = phantom(1 << 30, "");
    let (_, other) = phantom(1 << 30, "");
    let handle = mine.alloc_block(4096, StreamId::DEFAULT).unwrap();
    let keep = other.alloc_block(8192, StreamId::DEFAULT).unwrap();
    let err = other.free_block(handle).unwrap_err();
    assert!(
        matches!(
            err,
            AllocError::UnknownPointer { .. } | AllocError::DoubleFree { .. }
        ),
        "{err}"
    );
    assert_eq!(
        other.live_blocks(),
        1,
        "the other allocator's block stays live"
    );
    other.free_block(keep).unwrap();
    assert_eq!(mine.live_blocks(), 1);
}

#[test]
fn active_counts_pending_frees_with_their_own_peaks_and_totals() {
    let (device, alloc) = phantom(1 << 30, "");
    device.set_manual_events(true);
    let side = vramscope_caching::Backend::create_stream(&device).unwrap();
    let a = alloc.alloc(4096).unwrap();
    a.record_stream(side).unwrap();
    drop(a);
    let b = alloc.alloc(8192).unwrap();
    let stats = alloc.stats();
    // Allocated: only b. Active: b and the pending a.
    assert_eq!(stats.allocation.all.current, 1);
    assert_eq!(stats.allocation.all.peak, 1);
    assert_eq!(stats.active.all.current, 2);
    assert_eq!(stats.active.all.peak, 2);
    assert_eq!(stats.active_bytes.small_pool.current, 4096 + 8192);
    assert_eq!(stats.active_bytes.all.peak, 4096 + 8192);
    assert_eq!(stats.allocated_bytes.all.peak, 8192);
    assert_eq!(stats.active.all.allocated, 2);
    assert_eq!(
        stats.active.all.freed, 0,
        "the pending free has not completed"
    );
    assert_eq!(stats.allocation.all.freed, 1);
    assert_eq!(
        stats.requested_bytes.all.current,
        4096 + 8192,
        "requested bytes count until the free completes, as in PyTorch"
    );
    device.complete_stream(side);
    drop(b);
    // Completed events are collected lazily, by the next allocation or here.
    alloc.empty_cache();
    let stats = alloc.stats();
    assert_eq!(stats.active.all.current, 0);
    assert_eq!(stats.requested_bytes.all.current, 0);
    assert_eq!(stats.active.all.freed, 2);
    assert_eq!(
        stats.active.all.peak, 2,
        "the peak outlives the pending block"
    );
    assert_eq!(stats.active_bytes.large_pool, Default::default());
    alloc.reset_peak_stats();
    let stats = alloc.stats();
    assert_eq!(stats.active.all.peak, 0);
    assert_eq!(stats.active_bytes.all.peak, 0);
    assert_eq!(
        stats.allocation.all.allocated, 2,
        "totals survive a peak reset"
    );
    alloc.check_invariants().unwrap();
}

#[test]
fn inactive_split_counts_net_changes_like_pytorch() {
    let (_, alloc) = phantom(1 << 30, "");
    let a = alloc.alloc(4096).unwrap();
    let stats = alloc.stats();
    // One split remainder of the 2 MiB segment is inactive.
    assert_eq!(stats.inactive_split.all.current, 1);
    assert_eq!(stats.inactive_split_bytes.all.current, (2 << 20) - 4096);
    let b = alloc.alloc(4096).unwrap();
    let stats = alloc.stats();
    // Shrinking the already split remainder is one decrease of 4096 bytes, no count change.
    assert_eq!(stats.inactive_split.all.current, 1);
    assert_eq!(stats.inactive_split.all.allocated, 1);
    assert_eq!(stats.inactive_split_bytes.all.freed, 4096);
    drop(a);
    drop(b);
    let stats = alloc.stats();
    // Everything merged back into one unsplit block: nothing is inactive split.
    assert_eq!(stats.inactive_split.all.current, 0);
    assert_eq!(stats.inactive_split_bytes.all.current, 0);
    alloc.check_invariants().unwrap();
}

#[test]
#[should_panic(expected = "holds an Exclusive guard")]
fn using_the_allocator_beside_its_exclusive_guard_on_one_thread_panics_instead_of_hanging() {
    let (_, alloc) = phantom(1 << 30, "");
    let _exclusive = alloc.exclusive();
    let _ = alloc.stats();
}

#[test]
fn another_thread_waits_for_the_exclusive_guard() {
    let (_, alloc) = phantom(1 << 30, "");
    let mut exclusive = alloc.exclusive();
    let handle = exclusive.alloc_block(4096, StreamId::DEFAULT).unwrap();
    std::thread::scope(|scope| {
        let waiter = scope.spawn(|| alloc.stats().allocated_bytes.all.current);
        std::thread::sleep(std::time::Duration::from_millis(20));
        exclusive.free_block(handle).unwrap();
        drop(exclusive);
        assert_eq!(
            waiter.join().unwrap(),
            0,
            "it saw the state after the guard dropped"
        );
    });
    // The guard is gone: the same thread may lock again.
    assert_eq!(alloc.stats().allocation.all.allocated, 1);
}

#[test]
fn requests_too_large_to_round_are_out_of_memory() {
    let (_, alloc) = phantom(1 << 30, "");
    for size in [u64::MAX, u64::MAX - 100, 1 << 63] {
        let err = alloc.alloc_ptr(size, StreamId::DEFAULT).unwrap_err();
        assert!(matches!(err, AllocError::OutOfMemory(_)), "{err}");
        let err = alloc
            .exclusive()
            .alloc_block(size, StreamId::DEFAULT)
            .unwrap_err();
        assert!(matches!(err, AllocError::OutOfMemory(_)), "{err}");
    }
    alloc.check_invariants().unwrap();
}

#[test]
fn expandable_segments_stay_out_of_inactive_split_like_pytorch() {
    let (_, alloc) = phantom(1 << 30, "expandable_segments:True");
    let a = alloc.alloc(4096).unwrap();
    let b = alloc.alloc(3 * MIB).unwrap();
    drop(a);
    let stats = alloc.stats();
    assert_eq!(stats.inactive_split.all.current, 0);
    assert_eq!(stats.inactive_split_bytes.all.current, 0);
    assert!(stats.reserved_bytes.all.current > stats.allocated_bytes.all.current);
    drop(b);
    alloc.check_invariants().unwrap();
}

#[test]
fn thousands_of_equal_free_blocks_keep_best_fit_order() {
    // Every other block of 4,000 equal 64 KiB blocks is freed in a scrambled order: 2,000
    // free blocks of one size that cannot merge fill one bin of the free index, far past the
    // point where it moves most of them into its overflow's radix tree. Best fit among equal
    // sizes is the lowest address (PyTorch's (size, address) order), so the reallocations must
    // come back in address order whatever order the frees came in; then everything is freed in
    // another scrambled order and the books must balance.
    let (_, alloc) = phantom(1 << 34, "");
    let size = 64 * 1024;
    let mut buffers: Vec<Option<_>> = (0..4_000)
        .map(|_| Some(alloc.alloc(size).unwrap()))
        .collect();
    let mut freed_addrs = Vec::new();
    let mut seed = 0x5eed_u64;
    let mut scramble = |n: usize| -> Vec<usize> {
        let mut order: Vec<usize> = (0..n).collect();
        for i in (1..n).rev() {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            order.swap(i, (seed % (i as u64 + 1)) as usize);
        }
        order
    };
    for i in scramble(2_000) {
        let buffer = buffers[2 * i + 1].take().unwrap();
        freed_addrs.push(buffer.addr());
        drop(buffer);
    }
    alloc.check_invariants().unwrap();
    assert_eq!(alloc.stats().inactive_split.small_pool.current, 2_000);
    freed_addrs.sort_unstable();
    let again: Vec<_> = (0..2_000).map(|_| alloc.alloc(size).unwrap()).collect();
    let again_addrs: Vec<u64> = again.iter().map(|b| b.addr()).collect();
    assert_eq!(
        again_addrs, freed_addrs,
        "best fit among equal sizes is lowest address first"
    );
    alloc.check_invariants().unwrap();
    let mut all: Vec<Option<_>> = buffers
        .into_iter()
        .flatten()
        .chain(again)
        .map(Some)
        .collect();
    for i in scramble(all.len()) {
        all[i].take();
    }
    alloc.check_invariants().unwrap();
    let stats = alloc.stats();
    assert_eq!(stats.allocated_bytes.all.current, 0);
    assert_eq!(stats.inactive_split.all.current, 0);
    assert_eq!(stats.segment.all.current, 4_000 * size / (2 * MIB));
}

#[test]
fn the_holders_an_oom_names_follow_every_allocation_and_free_between_ooms() {
    // Worked out once per change of the live blocks, not once per failed request.
    let (_, alloc) = phantom(100 * MIB, "");
    let mut keep = Vec::new();
    for _ in 0..2 {
        keep.push(alloc.alloc(40 * MIB).unwrap());
    }
    let holders = |alloc: &CachingAllocator<SimDevice>| match alloc.alloc(60 * MIB).unwrap_err() {
        AllocError::OutOfMemory(report) => report.top_sites.clone(),
        other => panic!("expected OOM, got {other}"),
    };
    let total = |rows: &[(String, u64, u64)]| {
        rows.iter().fold((0, 0), |(bytes, blocks), row| {
            (bytes + row.1, blocks + row.2)
        })
    };
    let first = holders(&alloc);
    assert_eq!(first.len(), 1);
    assert_eq!(total(&first), (80 * MIB, 2));
    assert_eq!(holders(&alloc), first, "nothing changed in between");
    drop(keep.pop());
    keep.push(alloc.alloc(30 * MIB).unwrap());
    let after = holders(&alloc);
    assert_eq!(after.len(), 2, "{after:?}");
    assert_eq!(
        total(&after),
        (70 * MIB, 2),
        "a free and an allocation later"
    );
}

#[test]
fn a_release_that_found_nothing_runs_again_once_a_block_is_freed() {
    // Failed requests with nothing freed in between skip a release that would find nothing
    // again; a free in between makes the next one release the freed segment, as PyTorch does.
    let (_, alloc) = phantom(100 * MIB, "");
    let _a = alloc.alloc(60 * MIB).unwrap();
    let b = alloc.alloc(30 * MIB).unwrap();
    for _ in 0..3 {
        assert!(matches!(
            alloc.alloc(50 * MIB),
            Err(AllocError::OutOfMemory(_))
        ));
    }
    assert_eq!(alloc.stats().num_device_free, 0);
    drop(b);
    assert!(matches!(
        alloc.alloc(50 * MIB),
        Err(AllocError::OutOfMemory(_))
    ));
    let stats = alloc.stats();
    assert_eq!(stats.num_device_free, 1, "the freed segment went back");
    assert_eq!(stats.num_ooms, 4);
}

/// Each stream's expandable segment reserves address space for 9/8 of the device's memory, so
/// a device of 2^62 bytes has room for three such ranges in its 2^64 addresses: the fourth
/// stream's request fails with memory to spare, and the report names the address space, not
/// a memory cap that the free memory would otherwise suggest. A later failure for want of
/// memory is diagnosed as memory again.
#[test]
fn a_refused_address_range_is_reported_as_the_address_space() {
    use vramscope_model::oom::OomCause;
    let (_, alloc) = phantom(1 << 62, "expandable_segments:True");
    let mut held = Vec::new();
    for stream in 1..=3 {
        held.push(alloc.alloc_ptr(4 * MIB, StreamId(stream)).unwrap());
    }
    let err = alloc.alloc_ptr(4 * MIB, StreamId(4)).unwrap_err();
    let AllocError::OutOfMemory(report) = &err else {
        panic!("{err}");
    };
    assert_eq!(report.cause, OomCause::AddressSpace);
    let hint = report.hint.as_deref().unwrap_or_default();
    assert!(hint.contains("address range"), "{hint}");
    assert!(hint.contains("fewer streams"), "{hint}");
    assert!(!hint.contains("cap"), "{hint}");
    // Streams that have their range still allocate.
    held.push(alloc.alloc_ptr(4 * MIB, StreamId(2)).unwrap());
    // Under a memory limit, the same device runs out of memory on a stream with a range.
    alloc.set_memory_limit(Some(64 * MIB));
    let err = alloc.alloc_ptr(128 * MIB, StreamId(1)).unwrap_err();
    let AllocError::OutOfMemory(report) = &err else {
        panic!("{err}");
    };
    assert_eq!(report.cause, OomCause::Cap { known: true });
    for ptr in held {
        alloc.free_ptr(ptr).unwrap();
    }
}

#[test]
fn a_free_records_its_request_and_completion_alike_or_apart_when_deferred() {
    let (device, alloc) = phantom(1 << 30, "");
    device.set_manual_events(true);
    let side = vramscope_caching::Backend::create_stream(&device).unwrap();
    alloc.mark_step();
    let a = alloc.tagged("a").alloc(3000).unwrap();
    let b = alloc.alloc(5000).unwrap();
    let (a_addr, b_addr) = (a.addr(), b.addr());
    b.record_stream(side).unwrap();
    let from = alloc.next_event_seq();
    drop(a);
    drop(b);
    let freed = alloc.events_since(from, usize::MAX).events;
    let kinds: Vec<(EventKind, u64)> = freed.iter().map(|e| (e.kind, e.addr)).collect();
    assert_eq!(
        kinds,
        vec![
            (EventKind::FreeRequested, a_addr),
            (EventKind::FreeCompleted, a_addr),
            (EventKind::FreeRequested, b_addr),
        ],
        "a's free completes at once, b's waits for the side stream"
    );
    let (request, completion) = (&freed[0], &freed[1]);
    assert_eq!(completion.seq, request.seq + 1);
    assert_eq!(
        (
            completion.time_ns,
            completion.size,
            completion.requested,
            completion.stream
        ),
        (request.time_ns, 3072, 3000, 0),
        "the completion has the request's time stamp and block"
    );
    assert_eq!(
        (
            request.size,
            request.requested,
            request.stream,
            request.step
        ),
        (3072, 3000, 0, 1)
    );
    assert_eq!(
        (
            completion.site,
            completion.tag,
            completion.scope,
            completion.step
        ),
        (request.site, request.tag, request.scope, request.step)
    );
    assert!(
        request.tag.is_some(),
        "the tagged block's events carry its tag"
    );
    assert_eq!((freed[2].size, freed[2].requested), (5120, 5000));

    // Once the side stream's work completes, the next allocation completes b's free first.
    device.complete_stream(side);
    let from = alloc.next_event_seq();
    let c = alloc.alloc(512).unwrap();
    let later = alloc.events_since(from, usize::MAX).events;
    let kinds: Vec<(EventKind, u64)> = later.iter().map(|e| (e.kind, e.addr)).collect();
    assert_eq!(
        kinds,
        vec![
            (EventKind::FreeCompleted, b_addr),
            (EventKind::Alloc, c.addr())
        ]
    );
    assert_eq!((later[0].size, later[0].requested), (5120, 5000));
    assert!(later[0].time_ns >= freed[2].time_ns);
    assert!(later[1].time_ns >= later[0].time_ns);
}
