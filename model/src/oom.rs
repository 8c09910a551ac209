//! The one rule for "this out-of-memory error is fragmentation", shared by the allocator's own
//! `OomReport` hint (`vramscope_allocator::caching`) and the inspector's `fragmentation` detector,
//! so that a live program and a report on its snapshot never disagree about the same failure.
//!
//! A request failed for fragmentation when the memory was there, in pieces: the cache held reserved
//! but unallocated bytes, and those plus the device's free bytes would have covered the request.
//! The setting that helps is `expandable_segments:True` (segments that grow in place instead of
//! splitting), or, where that is already on, a `max_split_size_mb` at the request's size (so that
//! large free blocks are not split by small requests).

use crate::AllocatorConfig;

/// Whether a request of `request` bytes that failed with `cached` bytes reserved but
/// unallocated and `device_free` bytes free on the device failed for fragmentation.
pub fn is_fragmentation(request: u64, cached: u64, device_free: u64) -> bool {
    cached > 0 && cached.saturating_add(device_free) >= request
}

/// The allocator setting (in `PYTORCH_CUDA_ALLOC_CONF` syntax) that helps against
/// fragmentation under `config`, sized for a request of `request` bytes.
pub fn fragmentation_setting(config: &AllocatorConfig, request: u64) -> String {
    if config.expandable_segments {
        format!("max_split_size_mb:{}", (request >> 20).max(20))
    } else {
        "expandable_segments:True".to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_in_pieces_is_fragmentation_and_memory_in_use_is_not() {
        let mib = 1 << 20;
        assert!(is_fragmentation(100 * mib, 80 * mib, 30 * mib));
        assert!(!is_fragmentation(100 * mib, 0, 200 * mib), "nothing cached");
        assert!(
            !is_fragmentation(100 * mib, 10 * mib, 30 * mib),
            "not enough anywhere"
        );
        let mut config = AllocatorConfig::default();
        assert_eq!(
            fragmentation_setting(&config, 100 * mib),
            "expandable_segments:True"
        );
        config.expandable_segments = true;
        assert_eq!(
            fragmentation_setting(&config, 100 * mib),
            "max_split_size_mb:100"
        );
        assert_eq!(fragmentation_setting(&config, mib), "max_split_size_mb:20");
    }
}
