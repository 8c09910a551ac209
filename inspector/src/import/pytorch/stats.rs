//! The statistics of a PyTorch snapshot: current values from its segments, peaks and totals
//! from replaying its trace with PyTorch's block sizes and pools.
//!
//! `super::convert` calls [`compute_stats`] once the events have their block sizes
//! (`vramscope_replay::size_blocks`), and `crate::devices` calls it again for each device of a
//! multi-device file. The pools follow PyTorch's rules: requests up to 1 MiB are small, a
//! segment's size or page size names its pool; `super::super::timeline::TrackArray` keeps each
//! statistic's current value, peak and totals.

use vramscope_engine::{Pair, Pairing};
use vramscope_model::{
    AllocatorConfig, BlockState, Event, EventKind, MemoryStats, Pool, Segment, Stat, StatArray,
};

use super::super::timeline::TrackArray;
use super::SMALL_SEGMENT;

/// Requests up to this size are served from the small pool.
const SMALL_REQUEST: u64 = 1 << 20;

/// PyTorch's rounding of a request to a block size (multiples of 512 bytes, at least 512).
fn round_block(size: u64) -> u64 {
    if size < 512 {
        512
    } else {
        size.div_ceil(512).saturating_mul(512)
    }
}

fn request_pool(size: u64) -> Pool {
    if size <= SMALL_REQUEST {
        Pool::Small
    } else {
        Pool::Large
    }
}

/// The pool of the segment or mapped range an event allocates or frees. A plain segment's
/// size says it: the small pool allocates 2 MiB segments and the large pool never does (its
/// smallest is 20 MiB, or a request of 10 MiB or more rounded to 2 MiB), so no lookup is needed,
/// and none could be right for a segment freed in the trace whose address a later segment of
/// the other pool took. A mapped range belongs to the expandable segment whose reserved
/// addresses hold it, among the final segments (sorted by device and address), else its page
/// size says it.
fn segment_pool(segments: &[Segment], e: &Event) -> Pool {
    let (device, addr, size) = (u32::from(e.device), e.addr, e.size);
    if matches!(e.kind, EventKind::SegmentAlloc | EventKind::SegmentFree) {
        return if size <= SMALL_SEGMENT {
            Pool::Small
        } else {
            Pool::Large
        };
    }
    let at = segments.partition_point(|s| (s.device, s.address) <= (device, addr));
    if at > 0 {
        let s = &segments[at - 1];
        if s.device == device && addr < s.address.saturating_add(s.total_size.max(1)) {
            return s.pool;
        }
    }
    // The large pool maps 20 MiB pages, the small pool 2 MiB ones.
    if size.is_multiple_of(20 << 20) {
        Pool::Large
    } else {
        Pool::Small
    }
}

/// A statistic of which only the current value is known (from the dump-time segments): the
/// peak and the running totals repeat it, as placeholders that the summary table prints as
/// `n/a` (`vramscope_model::Recorded::current_only`).
fn current_only(value: StatArray) -> StatArray {
    let fix = |s: Stat| Stat {
        current: s.current,
        peak: s.current,
        allocated: s.current,
        freed: 0,
    };
    StatArray {
        all: fix(value.all),
        small_pool: fix(value.small_pool),
        large_pool: fix(value.large_pool),
    }
}

/// Statistics of `device`: current values from its segments, the rest from replaying its
/// events. A block stops counting as allocated when its free is requested, or, for a free the
/// trace records only as completed (a trace written by a tool that records frees once), when
/// it completes: the engine's pairing (`vramscope_engine::Pairing`) says which.
pub(crate) fn compute_stats(
    segments: &[Segment],
    events: &[Event],
    device: u32,
    config: &AllocatorConfig,
) -> MemoryStats {
    let mut end = MemoryStats::default();
    for seg in segments.iter().filter(|s| s.device == device) {
        let pool = seg.pool;
        end.reserved_bytes.increase(pool, seg.total_size);
        // PyTorch leaves expandable segments out of its `segment` statistic.
        if !seg.expandable {
            end.segment.increase(pool, 1);
        }
        let split_free = seg.blocks.iter().any(|b| b.state != BlockState::Inactive);
        if let Some(limit) = config.max_split_size {
            if seg.total_size >= limit {
                end.oversize_segments.increase(1);
            }
        }
        for b in &seg.blocks {
            match b.state {
                BlockState::ActiveAllocated => {
                    end.allocated_bytes.increase(pool, b.size);
                    end.allocation.increase(pool, 1);
                    end.requested_bytes.increase(pool, b.requested_size);
                    end.active_bytes.increase(pool, b.size);
                    end.active.increase(pool, 1);
                    if config.max_split_size.is_some_and(|limit| b.size >= limit) {
                        end.oversize_allocations.increase(1);
                    }
                }
                BlockState::ActivePendingFree => {
                    end.active_bytes.increase(pool, b.size);
                    end.active.increase(pool, 1);
                }
                BlockState::Inactive if split_free => {
                    end.inactive_split_bytes.increase(pool, b.size);
                    end.inactive_split.increase(pool, 1);
                }
                BlockState::Inactive => {}
            }
        }
    }

    let mut allocated = TrackArray::default();
    let mut requested = TrackArray::default();
    let mut allocation = TrackArray::default();
    let mut active_bytes = TrackArray::default();
    let mut active = TrackArray::default();
    let mut reserved = TrackArray::default();
    let mut segment = TrackArray::default();
    let mut stats = MemoryStats::default();
    let mut pairing = Pairing::new();
    for (i, e) in events
        .iter()
        .enumerate()
        .filter(|(_, e)| u32::from(e.device) == device)
    {
        let pool = request_pool(e.size);
        let block = round_block(e.size);
        // Whether this free ends the block's life as an allocation: its request, or its
        // completion when the trace has no request for it.
        let ends_allocation = match pairing.push(i as u32, e) {
            Pair::Free(link) => link.ends_allocation,
            _ => false,
        };
        if ends_allocation {
            allocated.remove(pool, block);
            requested.remove(pool, e.requested);
            allocation.remove(pool, 1);
        }
        match e.kind {
            EventKind::Alloc => {
                allocated.add(pool, block);
                requested.add(pool, e.requested);
                allocation.add(pool, 1);
                active_bytes.add(pool, block);
                active.add(pool, 1);
            }
            EventKind::FreeCompleted => {
                active_bytes.remove(pool, block);
                active.remove(pool, 1);
            }
            EventKind::SegmentAlloc | EventKind::SegmentMap => {
                let pool = segment_pool(segments, e);
                reserved.add(pool, e.size);
                if e.kind == EventKind::SegmentAlloc {
                    segment.add(pool, 1);
                }
                stats.num_device_alloc += 1;
            }
            EventKind::SegmentFree | EventKind::SegmentUnmap => {
                let pool = segment_pool(segments, e);
                reserved.remove(pool, e.size);
                if e.kind == EventKind::SegmentFree {
                    segment.remove(pool, 1);
                }
                stats.num_device_free += 1;
            }
            EventKind::Oom => stats.num_ooms += 1,
            _ => {}
        }
    }
    stats.allocated_bytes = allocated.finish(Some(&end.allocated_bytes));
    stats.requested_bytes = requested.finish(Some(&end.requested_bytes));
    stats.allocation = allocation.finish(Some(&end.allocation));
    stats.active_bytes = active_bytes.finish(Some(&end.active_bytes));
    stats.active = active.finish(Some(&end.active));
    stats.reserved_bytes = reserved.finish(Some(&end.reserved_bytes));
    stats.segment = segment.finish(Some(&end.segment));
    stats.inactive_split_bytes = current_only(end.inactive_split_bytes);
    stats.inactive_split = current_only(end.inactive_split);
    stats.oversize_allocations = end.oversize_allocations;
    stats.oversize_segments = end.oversize_segments;
    stats
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounds_like_pytorch() {
        assert_eq!(round_block(1), 512);
        assert_eq!(round_block(512), 512);
        assert_eq!(round_block(513), 1024);
        assert_eq!(round_block(u64::MAX), u64::MAX);
        assert_eq!(request_pool(1 << 20), Pool::Small);
        assert_eq!(request_pool((1 << 20) + 1), Pool::Large);
    }

    #[test]
    fn a_freed_small_segment_stays_small_when_a_large_one_takes_its_address() {
        let event = |kind, addr, size| Event {
            seq: 0,
            time_ns: 0,
            kind,
            device: 0,
            stream: 0,
            addr,
            size,
            requested: 0,
            site: None,
            tag: None,
            scope: None,
            step: 0,
            thread: 0,
            device_free: 0,
        };
        let mib = 1u64 << 20;
        // `empty_cache()` releases a 2 MiB small-pool segment; a 20 MiB large-pool segment then
        // gets the same address and is still there at the end.
        let events = [
            event(EventKind::SegmentAlloc, 0x7000_0000, 2 * mib),
            event(EventKind::SegmentFree, 0x7000_0000, 2 * mib),
            event(EventKind::SegmentAlloc, 0x7000_0000, 20 * mib),
        ];
        let segments = [Segment {
            device: 0,
            address: 0x7000_0000,
            total_size: 20 * mib,
            stream: 0,
            pool: Pool::Large,
            expandable: false,
            blocks: Vec::new(),
        }];
        let stats = compute_stats(&segments, &events, 0, &AllocatorConfig::default());
        let reserved = stats.reserved_bytes;
        assert_eq!(
            (reserved.small_pool.allocated, reserved.small_pool.freed),
            (2 * mib, 2 * mib)
        );
        assert_eq!(
            (reserved.large_pool.allocated, reserved.large_pool.freed),
            (20 * mib, 0)
        );
        assert_eq!(stats.num_device_free, 1);
    }

    #[test]
    fn a_free_recorded_only_as_completed_ends_the_allocation() {
        let event = |kind, addr, size, requested| {
            vramscope_testkit::event(kind)
                .addr(addr)
                .size(size)
                .requested(requested)
                .build()
        };
        let mib = 1u64 << 20;
        // Two blocks of 4 MiB, one after the other, each freed with a completion alone (as a
        // profiler trace records frees); then one freed as PyTorch records it, request first.
        let events = [
            event(EventKind::Alloc, 0x1000_0000, 4 * mib, 4 * mib - 100),
            event(
                EventKind::FreeCompleted,
                0x1000_0000,
                4 * mib,
                4 * mib - 100,
            ),
            event(EventKind::Alloc, 0x2000_0000, 4 * mib, 4 * mib - 100),
            event(
                EventKind::FreeCompleted,
                0x2000_0000,
                4 * mib,
                4 * mib - 100,
            ),
            event(EventKind::Alloc, 0x3000_0000, 4 * mib, 4 * mib),
            event(EventKind::FreeRequested, 0x3000_0000, 4 * mib, 4 * mib),
            event(EventKind::FreeCompleted, 0x3000_0000, 4 * mib, 4 * mib),
        ];
        let stats = compute_stats(&[], &events, 0, &AllocatorConfig::default());
        let a = stats.allocated_bytes;
        assert_eq!(
            (a.all.current, a.all.peak, a.all.allocated, a.all.freed),
            (0, 4 * mib, 12 * mib, 12 * mib)
        );
        assert_eq!((a.large_pool.peak, a.large_pool.freed), (4 * mib, 12 * mib));
        let r = stats.requested_bytes.all;
        assert_eq!((r.current, r.peak, r.freed), (0, 4 * mib, 12 * mib - 200));
        let n = stats.allocation.all;
        assert_eq!((n.current, n.peak, n.allocated, n.freed), (0, 1, 3, 3));
        let active = stats.active.all;
        assert_eq!((active.current, active.peak, active.freed), (0, 1, 3));
    }
}
