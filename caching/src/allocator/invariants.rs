//! Checks of the allocator's own work: [`CachingAllocator::check_invariants`], which holds the
//! books (`super::state`) against the blocks they describe, and the `debug` and `guard_bytes`
//! checks that the policy (`super::policy`) runs on blocks as they are handed out and freed.
//!
//! The invariant check is for tests and debugging (the policy tests and proptests call it after
//! every operation); the block checks record [`Violation`]s (use after free, overflow past the
//! request) in the state, which [`CachingAllocator::violations`] and snapshots
//! (`super::snapshot`) read out.

use super::policy::Books;
use super::state::{free_key, BlockMeta, State, BUFFER_OWNED, UNMAPPED};
use super::{CachingAllocator, Shared};
use crate::backend::Backend;
use crate::debug;
use crate::model::{Owner, Violation, ViolationKind};
use crate::provenance::NIL;
use crate::stats::MemoryStats;

/// Counts from a walk over every segment's blocks, checked afterwards against the free lists,
/// the pointer map and the block slab.
#[derive(Default)]
struct Tally {
    /// Free blocks.
    free: usize,
    /// Allocated blocks (not pending).
    live: usize,
    /// Allocated blocks of the raw-pointer API (in the pointer map).
    mapped: usize,
}

impl<B: Backend> CachingAllocator<B> {
    /// Use-after-free and overflow violations found so far by the `debug` and `guard_bytes`
    /// checks.
    pub fn violations(&self) -> Vec<Violation> {
        self.shared.lock().violations.clone()
    }

    /// Checks the allocator's books against its blocks: blocks tile their segments without
    /// overlap, free sets hold exactly the free blocks, and every statistic equals the sum over
    /// the block map. Returns what is wrong, for tests and debugging.
    pub fn check_invariants(&self) -> Result<(), String> {
        let state = self.shared.lock();
        let mut expect = MemoryStats::default();
        let mut tally = Tally::default();
        let mut last_end = 0u64;
        for (&addr, &segment) in &state.segments_by_addr {
            let seg = state.segments.get(segment);
            if seg.addr != addr {
                return Err(format!(
                    "segment {segment} is indexed at {addr:#x} but starts at {:#x}",
                    seg.addr
                ));
            }
            if addr < last_end {
                return Err(format!("segment at {addr:#x} overlaps the previous one"));
            }
            last_end = addr + seg.reserved.max(seg.size);
            state.check_segment(&self.shared, segment, &mut expect, &mut tally)?;
        }
        state.check_free_lists()?;
        let pools: usize = state.free_lists.iter().map(|l| l.blocks.len()).sum();
        if pools != tally.free || state.live.len() != tally.mapped {
            return Err(format!(
                "{pools} pooled blocks for {} free ones; {} pointer-map entries for {} raw-pointer blocks",
                tally.free,
                state.live.len(),
                tally.mapped
            ));
        }
        if state.blocks.len() < tally.live + tally.free {
            return Err("block slab lost blocks".to_string());
        }
        check_stats(&state.stats.memory_stats(), &expect, self.shared.capacity)
    }
}

impl State {
    /// The owner recorded for a provenance id and step.
    fn owner(&self, provenance: u32, step: u32) -> Owner {
        let p = self.provenance.get(provenance);
        let opt = |id: u32| (id != NIL).then_some(id);
        Owner {
            site: p.and_then(|p| opt(p.site)),
            tag: p.and_then(|p| opt(p.tag)),
            step: step as u64,
        }
    }

    /// Walks the blocks of `segment` (whose address index is already checked): they must tile
    /// it, link back and forth, and be free, live or unmapped where they may be. Adds what they
    /// hold to `expect` and `tally`.
    fn check_segment<B: Backend>(
        &self,
        shared: &Shared<B>,
        segment: u32,
        expect: &mut MemoryStats,
        tally: &mut Tally,
    ) -> Result<(), String> {
        let seg = self.segments.get(segment);
        let addr = seg.addr;
        if !seg.expandable {
            expect.segment.increase(seg.pool, 1);
        }
        expect
            .reserved_bytes
            .increase(seg.pool, seg.size - seg.holes);
        let mut cursor = seg.addr;
        let mut prev = NIL;
        let mut id = seg.first;
        let mut active = 0;
        let mut holes = 0;
        while id != NIL {
            let b = self.blocks.get(id);
            if b.addr != cursor {
                return Err(format!(
                    "block {id} at {:#x} does not follow {cursor:#x}: gap or overlap",
                    b.addr
                ));
            }
            if b.prev != prev || b.segment != segment {
                return Err(format!("block {id} has broken links"));
            }
            if b.size == 0 {
                return Err(format!("block {id} is empty"));
            }
            cursor += b.size;
            if b.flags & UNMAPPED != 0 {
                // A hole: inside an expandable segment, never at its end, never next to
                // another hole, and whole pages.
                let page = shared.expandable_page(seg.pool);
                if !seg.expandable
                    || b.next == NIL
                    || (prev != NIL && self.blocks.get(prev).flags & UNMAPPED != 0)
                    || !(b.addr - seg.addr).is_multiple_of(page)
                    || !b.size.is_multiple_of(page)
                {
                    return Err(format!("unmapped block {id} at {:#x} is misplaced", b.addr));
                }
                holes += b.size;
            } else if b.is_free() {
                self.check_free_block(segment, id, expect)?;
                tally.free += 1;
            } else {
                active += 1;
                self.check_active_block(segment, id, expect, tally)?;
            }
            prev = id;
            id = b.next;
        }
        if cursor != seg.addr + seg.size {
            return Err(format!("segment at {addr:#x} is not covered by its blocks"));
        }
        if holes != seg.holes {
            return Err(format!(
                "segment at {addr:#x} counts {} unmapped bytes but has {holes}",
                seg.holes
            ));
        }
        if seg.last != prev {
            return Err(format!("segment at {addr:#x} has a stale tail"));
        }
        if !seg.expandable && (active == 0) != self.is_idle(seg) {
            return Err(format!(
                "segment at {addr:#x} has no live block but is not one free block"
            ));
        }
        Ok(())
    }

    /// Checks the free block `id` of `segment`: in the right free list under its key, merged
    /// with a free block before it. Counts it in `expect` if it is inactive split.
    fn check_free_block(
        &self,
        segment: u32,
        id: u32,
        expect: &mut MemoryStats,
    ) -> Result<(), String> {
        let seg = self.segments.get(segment);
        let b = self.blocks.get(id);
        let list = &self.free_lists[self.list_of(b)];
        if list.stream != seg.stream || list.pool != seg.pool {
            return Err(format!(
                "free block {id} at {:#x} of a segment of stream {} ({:?} pool) is in the free list of stream {} ({:?} pool)",
                b.addr, seg.stream.0, seg.pool, list.stream.0, list.pool
            ));
        }
        let listed = list.blocks.get(free_key(b.size, b.addr));
        if listed != Some(id) {
            return Err(format!(
                "free block {id} at {:#x} is missing from its pool",
                b.addr
            ));
        }
        if b.prev != NIL && self.blocks.get(b.prev).is_free() {
            return Err(format!(
                "free block {id} was not merged with its free neighbour"
            ));
        }
        if b.is_split() && !seg.expandable {
            expect.inactive_split.increase(seg.pool, 1);
            expect.inactive_split_bytes.increase(seg.pool, b.size);
        }
        Ok(())
    }

    /// Checks the allocated or pending block `id` of `segment`: an allocated block is either
    /// buffer-owned or in the pointer map, never both. Counts it in `expect` and `tally`.
    fn check_active_block(
        &self,
        segment: u32,
        id: u32,
        expect: &mut MemoryStats,
        tally: &mut Tally,
    ) -> Result<(), String> {
        let seg = self.segments.get(segment);
        let b = self.blocks.get(id);
        expect.active.increase(seg.pool, 1);
        expect.active_bytes.increase(seg.pool, b.size);
        // Like PyTorch, requested bytes count until the free completes.
        expect.requested_bytes.increase(seg.pool, b.requested);
        if b.is_allocated() {
            tally.live += 1;
            tally.mapped += usize::from(b.flags & BUFFER_OWNED == 0);
            let in_map = self.live.get(&b.addr) == Some(&id);
            let buffer_owned = b.flags & BUFFER_OWNED != 0;
            if in_map == buffer_owned {
                return Err(format!(
                    "allocated block {id} must be either buffer-owned or in the pointer map"
                ));
            }
            expect.allocation.increase(seg.pool, 1);
            expect.allocated_bytes.increase(seg.pool, b.size);
        }
        Ok(())
    }

    /// Every entry of every free list must be a free block of that list under its own key,
    /// and the lists' counts must match their entries: a stale entry left behind by a
    /// removal would otherwise go unseen as long as the counts were kept.
    fn check_free_lists(&self) -> Result<(), String> {
        for (index, list) in self.free_lists.iter().enumerate() {
            let entries = list.blocks.all_from(0);
            if entries.len() != list.blocks.len() {
                return Err(format!(
                    "free list {index} counts {} blocks but holds {}",
                    list.blocks.len(),
                    entries.len()
                ));
            }
            for (key, id) in entries {
                let b = self.blocks.get(id);
                if !b.is_free() || self.list_of(b) != index || free_key(b.size, b.addr) != key {
                    return Err(format!(
                        "free list {index} holds block {id} at {:#x} under a stale key",
                        b.addr
                    ));
                }
            }
        }
        Ok(())
    }
}

/// Compares the statistics kept (`s`) with the sums over the blocks (`expect`), pool by pool,
/// and checks allocated ≤ reserved ≤ `capacity` (when the capacity is known).
fn check_stats(s: &MemoryStats, expect: &MemoryStats, capacity: u64) -> Result<(), String> {
    let pairs = [
        ("allocated_bytes", s.allocated_bytes, expect.allocated_bytes),
        ("reserved_bytes", s.reserved_bytes, expect.reserved_bytes),
        ("active_bytes", s.active_bytes, expect.active_bytes),
        (
            "inactive_split_bytes",
            s.inactive_split_bytes,
            expect.inactive_split_bytes,
        ),
        ("requested_bytes", s.requested_bytes, expect.requested_bytes),
        ("allocation", s.allocation, expect.allocation),
        ("segment", s.segment, expect.segment),
        ("active", s.active, expect.active),
        ("inactive_split", s.inactive_split, expect.inactive_split),
    ];
    for (name, have, want) in pairs {
        for (pool, h, w) in [
            ("all", have.all.current, want.all.current),
            (
                "small_pool",
                have.small_pool.current,
                want.small_pool.current,
            ),
            (
                "large_pool",
                have.large_pool.current,
                want.large_pool.current,
            ),
        ] {
            if h != w {
                return Err(format!("{name}.{pool} is {h} but the blocks sum to {w}"));
            }
        }
    }
    let allocated = s.allocated_bytes.all.current;
    let reserved = s.reserved_bytes.all.current;
    if allocated > reserved || (capacity > 0 && reserved > capacity) {
        return Err(format!(
            "allocated {allocated} ≤ reserved {reserved} ≤ capacity {capacity} does not hold"
        ));
    }
    Ok(())
}

impl<B: Backend> Books<'_, B> {
    /// Debug checks when a block is handed out: the poison over the whole block must be
    /// intact; then the guard bytes after the request are laid down.
    #[cold]
    #[inline(never)]
    pub(super) fn check_reused(self, block: &BlockMeta, requested: u64) {
        let backend = &self.shared.backend;
        let config = &self.shared.config;
        let state = &mut *self.state;
        if config.debug {
            if let Some((at, bytes)) =
                debug::first_difference(backend, block.addr, block.size, debug::POISON)
            {
                let previous = state
                    .freed
                    .owner_of(at)
                    .map(|r| state.owner(r.provenance, r.step));
                let new_owner = state.owner(block.provenance, block.step);
                state.violations.push(Violation {
                    kind: ViolationKind::UseAfterFree,
                    address: at,
                    bytes,
                    block_address: block.addr,
                    block_size: block.size,
                    previous_owner: previous,
                    new_owner: Some(new_owner),
                });
            }
        }
        if config.guard_bytes > 0 {
            debug::fill(
                backend,
                block.addr + requested,
                config.guard_bytes,
                debug::GUARD,
            );
        }
    }

    /// Checks the guard bytes after a block that is being freed.
    #[cold]
    #[inline(never)]
    pub(super) fn check_guard(self, id: u32) {
        let state = &mut *self.state;
        let b = *state.blocks.get(id);
        let guard_at = b.addr + b.requested;
        if let Some((at, bytes)) = debug::first_difference(
            &self.shared.backend,
            guard_at,
            self.shared.config.guard_bytes,
            debug::GUARD,
        ) {
            let owner = state.owner(b.provenance, b.step);
            state.violations.push(Violation {
                kind: ViolationKind::Overflow,
                address: at,
                bytes,
                block_address: b.addr,
                block_size: b.requested,
                previous_owner: Some(owner),
                new_owner: None,
            });
        }
    }
}
