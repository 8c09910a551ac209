//! The entry points trace replay uses and a program does not (`restore_segment`), built with
//! the crate's `replay` feature, which `vramscope-replay` turns on (and so `cargo test
//! --workspace` too).
#![cfg(feature = "replay")]

use vramscope_caching::{CachingAllocator, SimDevice, StreamId};
use vramscope_model::{AllocatorConfig, Pool, MIB};

fn phantom(capacity: u64, conf: &str) -> (SimDevice, CachingAllocator<SimDevice>) {
    let device = SimDevice::phantom(capacity);
    let alloc = CachingAllocator::new(device.clone(), AllocatorConfig::parse(conf).unwrap());
    (device, alloc)
}

#[test]
fn restored_segments_hold_their_blocks_and_serve_the_gaps() {
    let (device, alloc) = phantom(1 << 30, "");
    let base = alloc
        .restore_segment(
            20 * MIB,
            StreamId::DEFAULT,
            Pool::Large,
            &[(4 * MIB, 2 * MIB, 2 * MIB - 100), (0, MIB + 512, MIB + 1)],
        )
        .unwrap();
    alloc.check_invariants().unwrap();
    let stats = alloc.stats();
    assert_eq!(stats.allocation.all.current, 2);
    assert_eq!(stats.allocated_bytes.all.current, 3 * MIB + 512);
    assert_eq!(stats.reserved_bytes.all.current, 20 * MIB);
    assert_eq!(device.counters().outstanding_bytes, 20 * MIB);
    // The 14 MiB gap after the second block serves a 12 MiB request without a new segment.
    let c = alloc.alloc(12 * MIB).unwrap();
    assert_eq!(c.addr(), base + 6 * MIB);
    assert_eq!(alloc.stats().segment.all.current, 1);
    alloc.free_ptr(base).unwrap();
    alloc.free_ptr(base + 4 * MIB).unwrap();
    alloc.check_invariants().unwrap();
    assert!(alloc
        .restore_segment(MIB, StreamId::DEFAULT, Pool::Small, &[(0, 2 * MIB, 1)])
        .is_err());
}
