//! PyTorch-style statistics of a trace (`memory_stats()`): current values from the dump-time
//! segments, peaks and totals from replaying the events with PyTorch's block sizes and pools.
//!
//! The PyTorch importer (`vramscope_import`) feeds a [`StatsPass`] from the block sizing's last
//! pass, once the events have their block sizes (`vramscope_replay::size_blocks_visiting`);
//! [`compute_stats`] runs a pass of its own, which [`crate::devices`] calls for each device of
//! a multi-device file and the profiler importer's [`TrackArray`]s share. The pools follow
//! PyTorch's rules: requests up to 1 MiB are small, a segment's size or page size names its
//! pool. A recorded trace often starts after the program allocated, so a [`Track`] replays
//! additions and removals and then anchors them to a known final value (from the snapshot's
//! segments) or, without one, to the smallest start that never goes negative. Which free ends
//! a block is the engine's pairing ([`crate::Pairing`]), so these figures agree with every
//! other view of the same trace.

use crate::{Pair, Pairing};
use vramscope_model::pytorch::{self, mapping_pool, pool_for, round_size};
use vramscope_model::{
    AllocatorConfig, BlockState, Event, EventKind, MemoryStats, Pool, Segment, Stat, StatArray,
};

/// A statistic replayed over a trace whose starting value is unknown.
#[derive(Clone, Copy, Debug, Default)]
pub struct Track {
    net: i128,
    low: i128,
    high: i128,
    added: u128,
    removed: u128,
}

impl Track {
    /// Adds `amount`.
    pub fn add(&mut self, amount: u64) {
        self.net += amount as i128;
        self.added += amount as u128;
        self.high = self.high.max(self.net);
    }

    /// Removes `amount`.
    pub fn remove(&mut self, amount: u64) {
        self.net -= amount as i128;
        self.removed += amount as u128;
        self.low = self.low.min(self.net);
    }

    /// The statistic, anchored so that it ends at `end` when that is known (but never goes
    /// below zero), or starts at the smallest value that keeps it non-negative otherwise.
    pub fn finish(&self, end: Option<u64>) -> Stat {
        let floor = -self.low;
        let start = match end {
            Some(end) => (end as i128 - self.net).max(floor),
            None => floor,
        };
        let replayed_end = start + self.net;
        let current = end.map(|e| e as i128).unwrap_or(replayed_end);
        let clamp = |v: i128| v.clamp(0, u64::MAX as i128) as u64;
        Stat {
            current: clamp(current),
            peak: clamp((start + self.high).max(current).max(start)),
            allocated: clamp(start + self.added as i128),
            freed: clamp(self.removed as i128),
        }
    }
}

/// A [`Track`] for all pools together and for each pool.
#[derive(Clone, Copy, Debug, Default)]
pub struct TrackArray {
    all: Track,
    small: Track,
    large: Track,
}

impl TrackArray {
    /// Adds `amount` in `pool`.
    pub fn add(&mut self, pool: Pool, amount: u64) {
        self.all.add(amount);
        self.pool(pool).add(amount);
    }

    /// Removes `amount` from `pool`.
    pub fn remove(&mut self, pool: Pool, amount: u64) {
        self.all.remove(amount);
        self.pool(pool).remove(amount);
    }

    fn pool(&mut self, pool: Pool) -> &mut Track {
        match pool {
            Pool::Small => &mut self.small,
            Pool::Large => &mut self.large,
        }
    }

    /// The statistics, anchored to the current values of `end` when given.
    pub fn finish(&self, end: Option<&StatArray>) -> StatArray {
        StatArray {
            all: self.all.finish(end.map(|e| e.all.current)),
            small_pool: self.small.finish(end.map(|e| e.small_pool.current)),
            large_pool: self.large.finish(end.map(|e| e.large_pool.current)),
        }
    }
}

/// Where the final segments lie, by device and address, with their pools: what
/// a [`StatsPass`] looks a mapped range up in. A copy of four fields per segment, so that the
/// statistics can be worked out while the events they read are still being sized
/// (by the importer, as it sizes them).
pub struct SegmentPools(Vec<(u32, u64, u64, Pool)>);

impl SegmentPools {
    /// The pools of `segments` (sorted by device and address, as a snapshot keeps them).
    pub fn from_segments(segments: &[Segment]) -> SegmentPools {
        SegmentPools(
            segments
                .iter()
                .map(|s| (s.device, s.address, s.total_size, s.pool))
                .collect(),
        )
    }
}

/// The pool of the segment or mapped range an event allocates or frees. A plain segment's
/// size says it: the small pool allocates 2 MiB segments and the large pool never does (its
/// smallest is 20 MiB, or a request of 10 MiB or more rounded to 2 MiB), so no lookup is needed,
/// and none could be right for a segment freed in the trace whose address a later segment of
/// the other pool took. A mapped range belongs to the expandable segment whose reserved
/// addresses hold it, among the final segments (sorted by device and address), else its page
/// size says it.
fn segment_pool(segments: &SegmentPools, e: &Event) -> Pool {
    let (device, addr, size) = (u32::from(e.device), e.addr, e.size);
    if matches!(e.kind, EventKind::SegmentAlloc | EventKind::SegmentFree) {
        return pytorch::segment_pool(size);
    }
    let segments = &segments.0;
    let at = segments.partition_point(|&(d, a, _, _)| (d, a) <= (device, addr));
    if at > 0 {
        let (d, address, total_size, pool) = segments[at - 1];
        if d == device && addr < address.saturating_add(total_size.max(1)) {
            return pool;
        }
    }
    // The large pool maps 20 MiB pages, the small pool 2 MiB ones.
    mapping_pool(size)
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
pub fn compute_stats(
    segments: &[Segment],
    events: &[Event],
    device: u32,
    config: &AllocatorConfig,
) -> MemoryStats {
    let mut pass = StatsPass::new(SegmentPools::from_segments(segments));
    let mut pairing = Pairing::new();
    for (i, e) in events
        .iter()
        .enumerate()
        .filter(|(_, e)| u32::from(e.device) == device)
    {
        let pair = pairing.push(i as u32, e);
        pass.push(e, pair, pair.replaced().map(|r| &events[r as usize]));
    }
    pass.finish(segments, device, config)
}

/// The statistics of one device's events, fed one event at a time with what the engine's
/// pairing found for it: [`compute_stats`] pairs them itself, and the PyTorch importer feeds it
/// from the block sizing's own last pass (`vramscope_replay::size_blocks_visiting`), which pairs
/// every event just after giving it its block size, so that a big trace is not paired again.
pub struct StatsPass {
    pools: SegmentPools,
    allocated: TrackArray,
    requested: TrackArray,
    allocation: TrackArray,
    active_bytes: TrackArray,
    active: TrackArray,
    reserved: TrackArray,
    segment: TrackArray,
    /// The plain segments allocated in the trace and not freed yet, by address, with their
    /// size and pool: a segment allocated where one still is replaces it, as every view takes
    /// it (the trace lost the free).
    segments: crate::AddrMap<(u64, Pool)>,
    stats: MemoryStats,
}

impl StatsPass {
    /// A pass with nothing fed yet, looking mapped ranges up in `pools`.
    pub fn new(pools: SegmentPools) -> StatsPass {
        StatsPass {
            pools,
            allocated: TrackArray::default(),
            requested: TrackArray::default(),
            allocation: TrackArray::default(),
            active_bytes: TrackArray::default(),
            active: TrackArray::default(),
            reserved: TrackArray::default(),
            segment: TrackArray::default(),
            segments: crate::AddrMap::default(),
            stats: MemoryStats::default(),
        }
    }

    /// Counts event `e` (with its block size), which pairing found to be `pair`; for an
    /// allocation over a block the trace did not free, `replaced` is the event that describes
    /// that block (its allocation, or for a block from before the trace its free request).
    #[inline]
    pub fn push(&mut self, e: &Event, pair: Pair, replaced: Option<&Event>) {
        let pool = pool_for(e.size);
        // A block size as PyTorch rounds it (sized events keep theirs).
        let block = round_size(e.size, 0);
        // The replaced block is taken as freed, as every view takes it (its allocation ended
        // already when its free was requested).
        if let (
            Pair::Alloc {
                replaced_requested, ..
            },
            Some(old),
        ) = (pair, replaced)
        {
            let (old_pool, old_block) = (pool_for(old.size), round_size(old.size, 0));
            if !replaced_requested {
                self.allocated.remove(old_pool, old_block);
                self.requested.remove(old_pool, old.requested);
                self.allocation.remove(old_pool, 1);
            }
            self.active_bytes.remove(old_pool, old_block);
            self.active.remove(old_pool, 1);
        }
        // Whether this free ends the block's life as an allocation: its request, or its
        // completion when the trace has no request for it.
        let ends_allocation = match pair {
            Pair::Free(link) => link.ends_allocation,
            _ => false,
        };
        if ends_allocation {
            self.allocated.remove(pool, block);
            self.requested.remove(pool, e.requested);
            self.allocation.remove(pool, 1);
        }
        match e.kind {
            EventKind::Alloc => {
                self.allocated.add(pool, block);
                self.requested.add(pool, e.requested);
                self.allocation.add(pool, 1);
                self.active_bytes.add(pool, block);
                self.active.add(pool, 1);
            }
            EventKind::FreeCompleted => {
                self.active_bytes.remove(pool, block);
                self.active.remove(pool, 1);
            }
            EventKind::SegmentAlloc | EventKind::SegmentMap => {
                let pool = segment_pool(&self.pools, e);
                if e.kind == EventKind::SegmentAlloc {
                    if let Some((size, pool)) = self.segments.insert(e.addr, (e.size, pool)) {
                        self.reserved.remove(pool, size);
                        self.segment.remove(pool, 1);
                    }
                    self.segment.add(pool, 1);
                }
                self.reserved.add(pool, e.size);
                self.stats.num_device_alloc += 1;
            }
            EventKind::SegmentFree | EventKind::SegmentUnmap => {
                let pool = segment_pool(&self.pools, e);
                self.reserved.remove(pool, e.size);
                if e.kind == EventKind::SegmentFree {
                    self.segments.remove(&e.addr);
                    self.segment.remove(pool, 1);
                }
                self.stats.num_device_free += 1;
            }
            EventKind::Oom => self.stats.num_ooms += 1,
            _ => {}
        }
    }

    /// The statistics of `device`, with the current values of its dump-time `segments`.
    pub fn finish(
        self,
        segments: &[Segment],
        device: u32,
        config: &AllocatorConfig,
    ) -> MemoryStats {
        let end = end_stats(segments, device, config);
        let mut stats = self.stats;
        stats.allocated_bytes = self.allocated.finish(Some(&end.allocated_bytes));
        stats.requested_bytes = self.requested.finish(Some(&end.requested_bytes));
        stats.allocation = self.allocation.finish(Some(&end.allocation));
        stats.active_bytes = self.active_bytes.finish(Some(&end.active_bytes));
        stats.active = self.active.finish(Some(&end.active));
        stats.reserved_bytes = self.reserved.finish(Some(&end.reserved_bytes));
        stats.segment = self.segment.finish(Some(&end.segment));
        stats.inactive_split_bytes = current_only(end.inactive_split_bytes);
        stats.inactive_split = current_only(end.inactive_split);
        stats.oversize_allocations = end.oversize_allocations;
        stats.oversize_segments = end.oversize_segments;
        stats
    }
}

/// The current values of `device`'s statistics in its dump-time `segments`.
fn end_stats(segments: &[Segment], device: u32, config: &AllocatorConfig) -> MemoryStats {
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
    end
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A dump-time large-pool segment on device 0 with nothing allocated in it.
    fn large_segment(address: u64, total_size: u64) -> Segment {
        Segment {
            device: 0,
            address,
            total_size,
            stream: 0,
            pool: Pool::Large,
            expandable: false,
            blocks: Vec::new(),
        }
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
        let segments = [large_segment(0x7000_0000, 20 * mib)];
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

    /// A trace that lost frees allocates where a block, or a segment, still is: the block or
    /// segment it replaces counts as freed there, as every view takes it, so the statistics'
    /// peaks and totals are the engine's rather than the sum of both. The importer's pass fed
    /// by the sizing (through a pickle) gives the same as a pass of its own.
    #[test]
    fn a_block_or_segment_allocated_over_a_live_one_replaces_it() {
        let mib = 1u64 << 20;
        let (segments, events) = vramscope_testkit::lost_frees();
        let stats = compute_stats(&segments, &events, 0, &AllocatorConfig::default());
        let a = stats.allocated_bytes.all;
        assert_eq!(
            (a.current, a.peak, a.allocated, a.freed),
            (0, 6 * mib, 10 * mib, 10 * mib)
        );
        let n = stats.allocation.all;
        assert_eq!((n.current, n.peak, n.allocated, n.freed), (0, 1, 2, 2));
        let r = stats.reserved_bytes.all;
        assert_eq!(
            (r.current, r.peak, r.allocated, r.freed),
            (20 * mib, 20 * mib, 40 * mib, 20 * mib)
        );
        assert_eq!((stats.segment.all.current, stats.segment.all.peak), (1, 1));
    }
    #[test]
    fn track_anchors_to_known_end() {
        let mut t = Track::default();
        t.remove(100); // freed something allocated before the trace
        t.add(50);
        t.add(70);
        t.remove(20);
        let s = t.finish(Some(300));
        // Net change is 0, so the trace started at 300 and peaked at 300 - 100 + 120.
        assert_eq!(s.current, 300);
        assert_eq!(s.peak, 320);
        assert_eq!(s.freed, 120);
        assert_eq!(s.allocated, 420);
        let s = t.finish(None);
        assert_eq!((s.current, s.peak), (100, 120));
        // An end that would make the replay negative is raised to the floor.
        let s = t.finish(Some(0));
        assert_eq!(s.current, 0);
        assert_eq!(s.peak, 120);
    }
}
