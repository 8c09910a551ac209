//! PyTorch's caching policy, rule for rule: rounding, the small and large pools, best fit on
//! the same stream, splitting, new segments with the free-and-retry sequence, and the free path
//! that merges a block back into its segment.
//!
//! Every rule runs on a [`Books`]: the device's [`State`] borrowed under the lock together with
//! the settings and backend (`super::Shared`), so that a step of the policy reads
//! `books.get_free_block(..)` and needs no state argument. The public entry points of
//! `super::CachingAllocator` take the lock and build a `Books`; `super::guards::Exclusive` builds
//! one on the lock it holds. The other seams add their own methods to `Books`: expandable
//! segments (`super::expandable`), stream deferral (`super::streams`), release and garbage
//! collection (`super::release`) and the debug checks (`super::invariants`). The block linking
//! underneath is `super::state`'s.

use std::panic::Location;

use super::errors::{AllocError, OomReport};
use rustc_hash::FxHashMap;

use super::state::{
    free_key, BlockMeta, RawEventParts, SegmentMeta, State, ALLOCATED, BUFFER_OWNED,
};
use super::Shared;
use crate::backend::{Backend, StreamId};
use crate::config::{BacktraceMode, Policy};
use crate::debug::{self, FreedRange};
use crate::model::{EventKind, Pool};
use crate::provenance::{self, Provenance, NIL};

// PyTorch's sizes and rounding, which the allocator runs on and every reader of a trace uses
// too: the model's (`vramscope_model::pytorch`), their one home.
pub use vramscope_model::pytorch::{
    pool_for, round_size, segment_size_for, LARGE_BUFFER, MIN_BLOCK_SIZE, MIN_LARGE_ALLOC,
    ROUND_LARGE, SMALL_BUFFER, SMALL_SIZE,
};

/// The largest rounded request the allocator asks a device for (2^62 bytes); larger ones are
/// out of memory at once, before computing a segment size could overflow.
const MAX_REQUEST: u64 = 1 << 62;

/// Where an allocation came from, gathered before the lock is taken.
pub(crate) struct Origin<'a> {
    pub location: &'static Location<'static>,
    pub tag: Option<&'a str>,
}

/// Who is allocating, read before the device lock is taken: the caller's scope and thread
/// (thread-local reads) and the backtrace that sampling picked, from which the allocation's
/// provenance is interned under the lock. Empty with tracking off.
pub(super) struct Caller {
    /// The caller's innermost scope on this allocator (`NIL`: none, or tracking off).
    scope: u32,
    /// vramscope's number of the calling thread (0 with tracking off).
    thread: u32,
    /// The call stack, when call sites are on and sampling picked this allocation.
    backtrace: Option<Vec<usize>>,
}

impl<B: Backend> Shared<B> {
    /// The [`Caller`] of an allocation starting now on this thread.
    #[inline]
    pub(super) fn caller(&self) -> Caller {
        if !self.tracking {
            return Caller::NOBODY;
        }
        let backtrace = if self.takes_backtraces && self.wants_backtrace() {
            Some(provenance::capture_backtrace())
        } else {
            None
        };
        Caller {
            scope: provenance::current_scope(self.id),
            thread: provenance::thread_number(),
            backtrace,
        }
    }

    /// The [`Caller`] for an event attributed to this thread without a backtrace (an
    /// out-of-memory error, a step, a transfer).
    fn caller_without_backtrace(&self) -> Caller {
        if !self.tracking {
            return Caller::NOBODY;
        }
        Caller {
            scope: provenance::current_scope(self.id),
            thread: provenance::thread_number(),
            backtrace: None,
        }
    }

    /// Whether the next allocation takes a backtrace (`backtraces` setting, sampled).
    #[inline]
    fn wants_backtrace(&self) -> bool {
        match self.config.backtraces {
            BacktraceMode::Off => false,
            BacktraceMode::All => true,
            BacktraceMode::Sampled(n) => provenance::sample_backtrace(n),
        }
    }
}

impl Caller {
    /// The caller with tracking off: nothing read.
    const NOBODY: Caller = Caller {
        scope: NIL,
        thread: 0,
        backtrace: None,
    };
}

/// A block found for a request, and how it was found.
pub(super) struct Found {
    pub(super) block: u32,
    /// Taken out of a free list without counting it out of the inactive-split statistics;
    /// `use_block` counts the net change of the removal and the split together, as PyTorch does.
    pub(super) uncounted: bool,
}

/// The device's books borrowed under the device lock, with the settings and backend that the
/// policy reads: each step of the policy is a method of this, for one operation.
pub(super) struct Books<'a, B: Backend> {
    /// Settings, backend, clock: what does not change under the lock.
    pub(super) shared: &'a Shared<B>,
    /// The books themselves.
    pub(super) state: &'a mut State,
}

impl<'a, B: Backend> Books<'a, B> {
    /// The policy over `state`, which the caller holds locked.
    #[inline(always)]
    pub(super) fn new(shared: &'a Shared<B>, state: &'a mut State) -> Books<'a, B> {
        Books { shared, state }
    }

    /// A second `Books` over the same borrow, for the length of a call. The slow and cold
    /// steps that stay out of line take their `Books` by value (two pointers, passed in
    /// registers): passing the address of the caller's own instead would keep its fields in
    /// memory for the whole of the inlined fast path, reloaded after every call (about 2 % more
    /// instructions per allocation, measured with callgrind).
    #[inline(always)]
    fn reborrow(&mut self) -> Books<'_, B> {
        Books {
            shared: self.shared,
            state: &mut *self.state,
        }
    }

    /// The interned provenance of an allocation from `origin` by `caller`, or `NIL` when
    /// neither call sites nor events are recorded. Inlined into the allocation path, which
    /// instantiates it in the caller's codegen unit.
    #[inline]
    fn provenance_for(&mut self, origin: &Origin<'_>, caller: Caller) -> u32 {
        let config = &self.shared.config;
        if !config.record_sites && !config.record_events {
            return NIL;
        }
        self.provenance_of(origin, caller)
    }

    /// [`Books::provenance_for`] when call sites or events are known to be recorded (with
    /// tracking on, `Shared::tracking`).
    #[inline]
    fn provenance_of(&mut self, origin: &Origin<'_>, caller: Caller) -> u32 {
        let config = &self.shared.config;
        let Caller {
            scope,
            thread,
            backtrace,
        } = caller;
        let state = &mut *self.state;
        let tag = origin
            .tag
            .map(|t| state.provenance.tags.intern(t))
            .unwrap_or(NIL);
        match backtrace {
            Some(ips) if config.record_sites => {
                let site = state.provenance.site(origin.location, Some(ips));
                state.provenance.provenance(Provenance {
                    site,
                    tag,
                    scope,
                    thread,
                })
            }
            _ => {
                let location = config.record_sites.then_some(origin.location);
                state.provenance.provenance_at(location, tag, scope, thread)
            }
        }
    }

    /// Allocates a block of `size` bytes (> 0): the body of
    /// [`CachingAllocator::allocate`](super::CachingAllocator::allocate) under the device lock.
    /// `for_buffer` marks it as owned by a `DeviceBuffer` (freed by id) instead of entering it in
    /// the raw-pointer map. Returns the address and block id.
    #[inline]
    pub(super) fn allocate(
        &mut self,
        size: u64,
        stream: StreamId,
        origin: Origin<'_>,
        caller: Caller,
        for_buffer: bool,
    ) -> Result<(u64, u32), AllocError> {
        let shared = self.shared;
        let config = &shared.config;
        if !self.state.outstanding.is_empty() {
            self.reborrow().process_events();
        }
        let padded = size.saturating_add(config.guard_bytes);
        // `round_size`, with the power-of-two rounding's threshold decided at construction.
        let rounded = if padded > shared.round_power2_above {
            round_size(padded, config.roundup_power2_divisions)
        } else {
            round_size(padded, 0)
        };
        let pool = pool_for(rounded);
        self.state.large_lookups += (pool == Pool::Large) as u64;
        let found = match self.get_free_block(pool, stream, rounded) {
            Some(found) => found,
            None => match self.reborrow().grow(pool, stream, rounded, size, &origin)? {
                Some(found) => found,
                None => unreachable!("grow returns a block or an error"),
            },
        };
        let provenance = if shared.tracking {
            // Tracking is on: call sites or events are recorded.
            self.provenance_of(&origin, caller)
        } else {
            NIL
        };
        let id = found.block;
        let (addr, block_size) = self.use_block(found, rounded, size, provenance, for_buffer);
        if shared.checks {
            let block = *self.state.blocks.get(id);
            self.reborrow().check_reused(&block, size);
        }
        if shared.record_blocks {
            self.state.record(
                &shared.clock,
                EventKind::Alloc,
                RawEventParts {
                    addr,
                    size: block_size,
                    requested: size,
                    stream: stream.0,
                    provenance,
                },
            );
        }
        Ok((addr, id))
    }

    /// PyTorch's `get_free_block`: the smallest free block on the same stream that fits.
    #[inline]
    fn get_free_block(&mut self, pool: Pool, stream: StreamId, rounded: u64) -> Option<Found> {
        let max_split = self.shared.max_split;
        let state = &mut *self.state;
        let list = state.find_list(stream, pool)?;
        if max_split == u64::MAX && !self.shared.expandable_segments {
            // No rule below looks at the best fit before it is taken (the split limit is
            // unset and no segment is expandable): find it and take it in one step, which
            // keeps its position in registers instead of across the checks.
            let (_, id) = state.free_lists[list as usize]
                .blocks
                .take_from(free_key(rounded, 0))?;
            return Some(Found {
                block: id,
                uncounted: true,
            });
        }
        let (mut at, mut key, mut id) = state.free_lists[list as usize]
            .blocks
            .find_from(free_key(rounded, 0))?;
        if self.shared.expandable_segments {
            // PyTorch sizes a free block in an expandable segment by what it could grow to,
            // its size plus the unmapped space right after it, and passes on to the next
            // larger free block while that one could grow to less: room to grow is kept.
            while let Some(room) = state.unmapped_after(id).filter(|&room| room > 0) {
                let grows_to = (key >> 64) as u64 + room;
                let Some(larger) = state.free_lists[list as usize].blocks.find_from(key + 1) else {
                    break;
                };
                let larger_grows_to =
                    (larger.1 >> 64) as u64 + state.unmapped_after(larger.2).unwrap_or(0);
                if larger_grows_to >= grows_to {
                    break;
                }
                (at, key, id) = larger;
            }
        }
        let blocks = &mut state.free_lists[list as usize].blocks;
        let size = (key >> 64) as u64;
        if max_split != u64::MAX {
            if rounded < max_split && size >= max_split {
                return None;
            }
            if rounded >= max_split && size >= rounded + LARGE_BUFFER {
                return None;
            }
        }
        blocks.take(at, key);
        Some(Found {
            block: id,
            uncounted: true,
        })
    }

    /// The slow path: new memory from the device, with PyTorch's free-and-retry sequence.
    #[cold]
    #[inline(never)]
    fn grow(
        mut self,
        pool: Pool,
        stream: StreamId,
        rounded: u64,
        requested: u64,
        origin: &Origin<'_>,
    ) -> Result<Option<Found>, AllocError> {
        if rounded > MAX_REQUEST {
            return Err(self.out_of_memory(stream, rounded, requested, origin));
        }
        if let Some(threshold) = self.shared.config.garbage_collection_threshold {
            self.garbage_collect(threshold);
        }
        if let Some(found) = self.new_block(pool, stream, rounded) {
            return Ok(Some(found));
        }
        if self.release_available_cached_blocks(pool, stream, rounded) {
            if let Some(found) = self.new_block(pool, stream, rounded) {
                return Ok(Some(found));
            }
        }
        self.release_cached_blocks();
        self.state.stats.num_alloc_retries += 1;
        if let Some(found) = self.new_block(pool, stream, rounded) {
            return Ok(Some(found));
        }
        Err(self.out_of_memory(stream, rounded, requested, origin))
    }

    /// Counts and records an allocation that failed for good, and reports it with the largest
    /// live call sites and, unless the memory was simply in use, why it failed and what helps
    /// (`vramscope_model::oom`: the memory limit, fragmentation, the split limit).
    #[cold]
    #[inline(never)]
    pub(super) fn out_of_memory(
        &mut self,
        stream: StreamId,
        rounded: u64,
        requested: u64,
        origin: &Origin<'_>,
    ) -> AllocError {
        let shared = self.shared;
        self.state.stats.num_ooms += 1;
        let info = shared.backend.mem_info();
        let provenance = self.provenance_for(origin, shared.caller_without_backtrace());
        let state = &mut *self.state;
        if shared.config.record_events {
            state.record(
                &shared.clock,
                EventKind::Oom,
                RawEventParts {
                    addr: info.free,
                    size: rounded,
                    requested,
                    stream: stream.0,
                    provenance,
                },
            );
        }
        let allocated = state.stats.allocated_bytes.all().current;
        let reserved = state.stats.reserved_bytes.all().current;
        let facts = crate::oom::OomFacts {
            request: rounded,
            allocated,
            reserved: Some(reserved),
            device_free: info.free,
            largest_usable_free_block: None,
            cap: state.memory_limit,
            address_space_refused: std::mem::take(&mut state.address_space_refused),
        };
        let diagnosis = crate::oom::diagnose(&facts, &shared.config);
        let hint = diagnosis.hint(crate::oom::SettingNames::VRAMSCOPE);
        AllocError::OutOfMemory(Box::new(OomReport {
            requested,
            rounded,
            device: shared.device,
            capacity: info.total,
            device_free: info.free,
            allocated,
            reserved,
            top_sites: state.top_sites_cached(5),
            cause: diagnosis.cause,
            hint,
        }))
    }

    /// Gets a new block from the device: a raw segment, or pages mapped into an expandable one.
    fn new_block(&mut self, pool: Pool, stream: StreamId, rounded: u64) -> Option<Found> {
        let shared = self.shared;
        if shared.config.uses_expandable_segments() {
            // Only this attempt's refusal explains a failure that follows it.
            self.state.address_space_refused = false;
            // PyTorch's `alloc_block` checks its cap before it looks for room, against the size
            // a plain segment for the request would have, whatever needs mapping (the
            // `compact` policy maps only what it needs, and checks only that).
            let reserved = self.state.stats.reserved_bytes.all().current;
            if shared.config.policy == Policy::Pytorch
                && reserved.saturating_add(segment_size_for(rounded)) > self.cap()
            {
                return None;
            }
            return self.grow_expandable(pool, stream, rounded);
        }
        let size = segment_size_for(rounded);
        if self.state.over_memory_limit(size) {
            return None;
        }
        let addr = shared.backend.malloc(size).ok()?;
        let block = self.register_segment(addr, size, stream, pool);
        Some(Found {
            block,
            uncounted: false,
        })
    }

    /// Books a new raw segment of `size` bytes at `addr` (poisoned with `debug`): one block
    /// spanning it, not yet in a free list, whose id is returned; statistics and the
    /// `segment_alloc` event.
    pub(super) fn register_segment(
        &mut self,
        addr: u64,
        size: u64,
        stream: StreamId,
        pool: Pool,
    ) -> u32 {
        let shared = self.shared;
        let state = &mut *self.state;
        if shared.config.debug {
            debug::fill(&shared.backend, addr, size, debug::POISON);
        }
        let list = state.list_index(stream, pool);
        let segment = state.segments.insert(SegmentMeta {
            addr,
            size,
            reserved: size,
            holes: 0,
            stream,
            pool,
            list,
            expandable: false,
            first: NIL,
            last: NIL,
            idle_since: state.large_lookups,
        });
        // The segment's only block.
        let block = state.insert_between(
            NIL,
            NIL,
            BlockMeta::new_free(addr, size, segment, list, pool),
        );
        state.segments_by_addr.insert(addr, segment);
        state.stats.segment.increase(pool, 1);
        state.stats.reserved_bytes.increase(pool, size);
        state.stats.num_device_alloc += 1;
        if let Some(max_split) = shared.config.max_split_size {
            if size >= max_split {
                state.stats.oversize_segments.increase(1);
            }
        }
        if shared.config.record_events {
            state.record(
                &shared.clock,
                EventKind::SegmentAlloc,
                RawEventParts {
                    addr,
                    size,
                    stream: stream.0,
                    ..RawEventParts::default()
                },
            );
        }
        block
    }

    /// [`State::counts_inactive_split`], without looking at the segment when the settings
    /// make no segment expandable.
    #[inline]
    pub(super) fn counts_inactive_split(&self, segment: u32) -> bool {
        !self.shared.expandable_segments || self.state.counts_inactive_split(segment)
    }

    /// PyTorch's `should_split`.
    #[inline]
    fn should_split(&self, pool: Pool, block_size: u64, rounded: u64) -> bool {
        let remaining = block_size - rounded;
        // Both rules are evaluated and one is selected (`&` and `|`, not `&&` and `||`): the
        // pool changes from one request to the next, and the select measured about 2 %
        // faster than the branches on the traces of `bench/`.
        let small_rule = remaining >= MIN_BLOCK_SIZE;
        let large_rule = (rounded < self.shared.max_split) & (remaining > SMALL_SIZE);
        let by_small_rule = (pool == Pool::Small) | self.shared.expandable_segments;
        (by_small_rule & small_rule) | (!by_small_rule & large_rule)
    }

    /// Hands out a found block (already out of the free set), splitting off the remainder;
    /// returns its address and size.
    #[inline(always)]
    fn use_block(
        &mut self,
        found: Found,
        rounded: u64,
        requested: u64,
        provenance: u32,
        for_buffer: bool,
    ) -> (u64, u64) {
        let id = found.block;
        let b = *self.state.blocks.get(id);
        let pool = b.pool;
        // The net change of inactive split blocks, applied once (PyTorch's
        // `alloc_found_block`): a split free block leaves, its split remainder comes back.
        let (mut split_blocks, mut split_bytes) = (0i64, 0i64);
        if found.uncounted && b.is_split() {
            split_blocks -= 1;
            split_bytes -= b.size as i64;
        }
        if self.should_split(pool, b.size, rounded) {
            let remainder = self.state.split_off(id, rounded);
            self.state.index_free(remainder);
            split_blocks += 1;
            split_bytes += (b.size - rounded) as i64;
        }
        if self.counts_inactive_split(b.segment) {
            self.state.stats.inactive_split.apply(pool, split_blocks);
            self.state
                .stats
                .inactive_split_bytes
                .apply(pool, split_bytes);
        }
        let step = self.state.event_step;
        self.mark_allocated(id, pool, requested, provenance, step, for_buffer)
    }

    /// Marks a block (out of any free list) as handed out, with its provenance, and counts it;
    /// returns its address and size.
    #[inline]
    pub(super) fn mark_allocated(
        &mut self,
        id: u32,
        pool: Pool,
        requested: u64,
        provenance: u32,
        step: u32,
        for_buffer: bool,
    ) -> (u64, u64) {
        let state = &mut *self.state;
        let block = state.blocks.get_mut(id);
        block.flags = if for_buffer {
            ALLOCATED | BUFFER_OWNED
        } else {
            ALLOCATED
        };
        block.requested = requested;
        block.provenance = provenance;
        block.step = step;
        let (addr, size) = (block.addr, block.size);
        let stats = &mut state.stats;
        stats.count_allocation(pool, size, requested);
        if size >= self.shared.max_split {
            stats.oversize_allocations.increase(1);
        }
        if !for_buffer {
            state.live.insert(addr, id);
        }
        (addr, size)
    }

    /// Frees the raw-pointer block at `addr` (≠ 0): the body of
    /// [`CachingAllocator::deallocate`](super::CachingAllocator::deallocate) under the device
    /// lock.
    #[inline]
    pub(super) fn deallocate(&mut self, addr: u64) -> Result<(), AllocError> {
        let Some(id) = self.state.live.remove(&addr) else {
            return Err(self.state.classify_bad_free(addr));
        };
        self.release_allocated(id)
    }

    /// Frees a block owned by a `DeviceBuffer` or a [`BlockHandle`](super::BlockHandle), by
    /// id; `addr` guards against a stale id.
    #[inline]
    pub(super) fn deallocate_owned(&mut self, block: u32, addr: u64) -> Result<(), AllocError> {
        let owned = self
            .state
            .blocks
            .slot(block)
            .is_some_and(|b| b.addr == addr && b.flags == ALLOCATED | BUFFER_OWNED);
        if !owned {
            return Err(self.state.classify_bad_free(addr));
        }
        self.release_allocated(block)
    }

    /// The common part of a free: statistics, the event, deferral or return to the cache.
    #[inline]
    fn release_allocated(&mut self, id: u32) -> Result<(), AllocError> {
        let shared = self.shared;
        if shared.config.guard_bytes > 0 {
            self.reborrow().check_guard(id);
        }
        let state = &mut *self.state;
        // The block's flags change once it is deferred or back in the cache.
        let b = *state.blocks.get(id);
        let pool = b.pool;
        let stats = &mut state.stats;
        stats.count_free(pool, b.size);
        if b.size >= shared.max_split {
            stats.oversize_allocations.decrease(1);
        }
        if shared.record_blocks {
            // The free is stamped as it is requested; its completion shares the time stamp
            // when it completes in this same operation.
            state.last_ticks = shared.clock.ticks();
        }
        if !state.stream_uses.is_empty() {
            if let Some(streams) = state.stream_uses.remove(&id) {
                self.reborrow().free_used_on_streams(id, b, &streams);
                return Ok(());
            }
        }
        self.release_to_cache(id, b);
        if shared.record_blocks {
            // Nothing records an event between the request and its completion here, so both
            // are written together: the completion's fields are the request's (the block as
            // it was freed, on the same stream, at the same time stamp), only the kind differs.
            let state = &mut *self.state;
            let parts = state.free_parts(&b);
            let ticks = state.last_ticks;
            state.record_at(ticks, EventKind::FreeRequested, parts);
            state.record_at(ticks, EventKind::FreeCompleted, parts);
        }
        Ok(())
    }

    /// The rest of a free of block `id` (`original` as the program freed it) that other
    /// streams used too (`record_stream`): the request's event, then deferral on those
    /// streams' events, or the return to the cache if none could be recorded. Out of line: the
    /// plain free path stays short.
    #[cold]
    #[inline(never)]
    fn free_used_on_streams(mut self, id: u32, original: BlockMeta, streams: &[StreamId]) {
        if self.shared.record_blocks {
            let state = &mut *self.state;
            let parts = state.free_parts(&original);
            state.record_at(state.last_ticks, EventKind::FreeRequested, parts);
        }
        if !self.reborrow().defer_free(id, streams) {
            self.return_to_cache(id, original, true);
        }
    }

    /// PyTorch's `free_block`: merge with free neighbours in the segment, return to the pool.
    /// `original` is the block as the program freed it (read when the free was requested, or
    /// when its stream events completed); `immediate` says the free was requested in this same
    /// operation (not deferred on stream events), so its completion shares the request's time
    /// stamp.
    #[inline]
    pub(super) fn return_to_cache(&mut self, id: u32, original: BlockMeta, immediate: bool) {
        let shared = self.shared;
        self.release_to_cache(id, original);
        let state = &mut *self.state;
        if shared.record_blocks {
            let parts = state.free_parts(&original);
            if immediate {
                // The free was requested in this same operation, which just read the clock.
                state.record_at(state.last_ticks, EventKind::FreeCompleted, parts);
            } else {
                state.record(&shared.clock, EventKind::FreeCompleted, parts);
            }
        }
    }

    /// [`Books::return_to_cache`] without its event: the merge, the statistics and the debug
    /// poison.
    #[inline]
    fn release_to_cache(&mut self, id: u32, original: BlockMeta) {
        let shared = self.shared;
        let pool = original.pool;
        let state = &mut *self.state;
        state.blocks.get_mut(id).flags = 0;
        // The net change of inactive split blocks, applied once (PyTorch's `free_block`): each
        // merged neighbour (split, since it has this block beside it) leaves, and the merged
        // block comes back if it is still split.
        let (mut split_blocks, mut split_bytes) = (0i64, 0i64);
        if original.prev != NIL && state.blocks.get(original.prev).is_free() {
            let merged = state.absorb_prev(id, original.prev);
            split_blocks -= 1;
            split_bytes -= merged as i64;
        }
        if original.next != NIL && state.blocks.get(original.next).is_free() {
            let merged = state.absorb_next(id, original.next);
            split_blocks -= 1;
            split_bytes -= merged as i64;
        }
        // PyTorch's `free_block` counts the requested bytes out when the free completes.
        state
            .stats
            .requested_bytes
            .decrease(pool, original.requested);
        let block = state.blocks.get_mut(id);
        block.requested = 0;
        let still_split = block.is_split();
        if still_split {
            split_blocks += 1;
            split_bytes += block.size as i64;
        } else {
            // The segment is wholly free again: its age for garbage collection starts now.
            let now = state.large_lookups;
            state.segments.get_mut(original.segment).idle_since = now;
        }
        state.index_free(id);
        if self.counts_inactive_split(original.segment) {
            let stats = &mut self.state.stats;
            stats.inactive_split.apply(pool, split_blocks);
            stats.inactive_split_bytes.apply(pool, split_bytes);
        }
        let state = &mut *self.state;
        if shared.config.debug
            && debug::fill(&shared.backend, original.addr, original.size, debug::POISON)
        {
            state.freed.record(
                original.addr,
                FreedRange {
                    end: original.addr + original.size,
                    provenance: original.provenance,
                    step: original.step,
                },
            );
        }
    }

    /// The reservation cap: the memory limit, or the device's capacity.
    pub(super) fn cap(&self) -> u64 {
        self.state.memory_limit.unwrap_or(self.shared.capacity)
    }

    /// Records an event attributed to `location` (with no tag), when events are on.
    pub(super) fn record_for_site(
        &mut self,
        kind: EventKind,
        location: &'static Location<'static>,
        parts: RawEventParts,
    ) {
        if !self.shared.config.record_events {
            return;
        }
        let origin = Origin {
            location,
            tag: None,
        };
        let provenance = self.provenance_for(&origin, self.shared.caller_without_backtrace());
        self.state.record(
            &self.shared.clock,
            kind,
            RawEventParts {
                provenance,
                ..parts
            },
        );
    }
}

impl State {
    /// Why a free of `addr` found no block to free: a double free, a pointer that a
    /// `DeviceBuffer` owns, or one this allocator never handed out.
    #[cold]
    #[inline(never)]
    pub(super) fn classify_bad_free(&self, addr: u64) -> AllocError {
        if let Some((_, &segment)) = self.segments_by_addr.range(..=addr).next_back() {
            let seg = self.segments.get(segment);
            if addr < seg.addr + seg.size {
                let mut id = seg.first;
                while id != NIL {
                    let b = self.blocks.get(id);
                    if b.addr == addr {
                        if b.flags & BUFFER_OWNED != 0 {
                            return AllocError::OwnedByBuffer { addr };
                        }
                        return AllocError::DoubleFree { addr };
                    }
                    id = b.next;
                }
            }
        }
        AllocError::UnknownPointer { addr }
    }

    /// [`State::top_sites`], worked out again only when a block was allocated or freed since
    /// the last out-of-memory: a program (or a replayed trace) that fails request after
    /// request with nothing freed in between would otherwise go through every live block
    /// each time.
    fn top_sites_cached(&mut self, limit: usize) -> Vec<(String, u64, u64)> {
        let changes = self.stats.allocation.changes();
        match &self.top_sites_cache {
            Some((at, rows)) if *at == (changes, limit) => rows.clone(),
            _ => {
                let rows = self.top_sites(limit);
                self.top_sites_cache = Some(((changes, limit), rows.clone()));
                rows
            }
        }
    }

    /// Live bytes and blocks by call site, largest first.
    fn top_sites(&self, limit: usize) -> Vec<(String, u64, u64)> {
        let mut by_site: FxHashMap<u32, (u64, u64)> = FxHashMap::default();
        for (_, b) in self.blocks.iter().filter(|(_, b)| b.is_allocated()) {
            let site = self
                .provenance
                .get(b.provenance)
                .map(|p| p.site)
                .unwrap_or(NIL);
            let entry = by_site.entry(site).or_default();
            entry.0 += b.size;
            entry.1 += 1;
        }
        let mut rows: Vec<(String, u64, u64)> = by_site
            .into_iter()
            .map(|(site, (bytes, blocks))| {
                let label = self
                    .provenance
                    .site_label(site)
                    .unwrap_or_else(|| "(untracked)".to_string());
                (label, bytes, blocks)
            })
            .collect();
        rows.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        rows.truncate(limit);
        rows
    }
}
