//! Model checking with loom: every interleaving of two threads allocating and freeing through
//! one allocator while a consumer pulls events from the ring by sequence number (as the
//! telemetry publisher does). Run with
//! `RUSTFLAGS="--cfg loom" cargo test -p vramscope-caching --test loom --release`;
//! in normal builds this file is empty.
#![cfg(loom)]

use vramscope_caching::{CachingAllocator, SimDevice};
use vramscope_model::{AllocatorConfig, EventKind};

/// Pulls everything after `next`; returns the new cursor, adding what was seen and missed.
fn pull(
    alloc: &CachingAllocator<SimDevice>,
    next: u64,
    seen: &mut Vec<u64>,
    missed: &mut u64,
) -> u64 {
    let batch = alloc.events_since(next, usize::MAX);
    *missed += batch.missed;
    for (i, event) in batch.events.iter().enumerate() {
        if i > 0 {
            assert_eq!(
                event.seq,
                batch.events[i - 1].seq + 1,
                "a batch is contiguous"
            );
        }
        seen.push(event.seq);
    }
    batch.next_seq
}

#[test]
fn a_consumer_sees_every_event_once_or_counts_it_missed() {
    loom::model(|| {
        // A ring of 4 entries overflows in some interleavings, so `missed` is exercised too.
        let alloc = CachingAllocator::new(
            SimDevice::phantom(1 << 30),
            AllocatorConfig::parse("max_entries:4").unwrap(),
        );
        let other = alloc.clone();
        let worker = loom::thread::spawn(move || {
            let buffer = other.alloc(512).unwrap();
            drop(buffer);
        });
        let mut seen = Vec::new();
        let mut missed = 0;
        let mut next = pull(&alloc, 0, &mut seen, &mut missed);
        let mine = alloc.alloc(1024).unwrap();
        next = pull(&alloc, next, &mut seen, &mut missed);
        drop(mine);
        worker.join().unwrap();
        let end = pull(&alloc, next, &mut seen, &mut missed);

        // Cursors only move forward, nothing is seen twice, and every event up to the end
        // was either seen or counted as missed.
        assert!(seen.windows(2).all(|w| w[0] < w[1]));
        assert_eq!(seen.len() as u64 + missed, end);
        alloc.check_invariants().unwrap();
        let stats = alloc.stats();
        assert_eq!(stats.allocation.all.current, 0);
        assert_eq!(stats.allocation.all.allocated, 2);
        let kinds: Vec<EventKind> = alloc.snapshot().events.iter().map(|e| e.kind).collect();
        assert!(kinds.contains(&EventKind::Snapshot));
    });
}
