//! The phantom device's page maps cost per mapped run, not per 2 MiB page (issue 17): an
//! expandable segment of 2^49 bytes, the size one line of a hostile trace can ask a replay
//! for, is mapped, used and released through the caching allocator without an entry per page.

use vramscope_caching::{Backend, CachingAllocator, SimDevice};
use vramscope_model::AllocatorConfig;

#[test]
fn an_expandable_segment_of_2_pow_49_bytes_maps_and_releases_at_once() {
    for conf in ["expandable_segments:True", "policy:compact"] {
        let config = AllocatorConfig::parse(conf).unwrap();
        let device = SimDevice::phantom(1 << 50);
        let alloc = CachingAllocator::new(device.clone(), config);
        let block = alloc.alloc(1 << 49).unwrap();
        assert!(device.counters().outstanding_bytes >= 1 << 49, "{conf}");
        assert_eq!(device.mem_info().total, 1 << 50);
        alloc.check_invariants().unwrap();
        drop(block);
        alloc.empty_cache();
        assert_eq!(device.counters().outstanding_bytes, 0, "{conf}");
        let counters = device.counters();
        assert_eq!(counters.raw_allocs, counters.raw_frees, "{conf}");
    }
}
