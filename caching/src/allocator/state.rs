//! The allocator's books under the device lock: block and segment metadata, the free lists of
//! each (stream, pool) pair, and the operations that keep their links consistent.
//!
//! [`State`] is what the device mutex guards. Blocks of a segment form a doubly linked list in
//! address order (`prev`, `next`, ids into the block slab of `super::slab`); free blocks are also
//! in their (stream, pool) free list (`crate::free_index`), keyed by size then address. The
//! methods here split, merge, link and (un)index blocks and push events into the ring
//! (`crate::ring`); they know nothing of the settings. What to split and when to ask the device
//! for memory is the policy's (`super::policy::Books`), which holds the state borrowed together
//! with the settings and backend; expandable segments add their own linking
//! (`super::expandable`).

use std::collections::{BTreeMap, VecDeque};

use rustc_hash::FxHashMap;

use super::slab::Slab;
use crate::backend::{EventId, StreamId};
use crate::clock::Clock;
use crate::debug::FreedOwners;
use crate::free_index::FreeIndex;
use crate::model::{EventKind, Pool, StepMark, Violation};
use crate::provenance::{ProvenanceTables, NIL};
use crate::ring::{EventRing, RawEvent};
use crate::stats::StatsBook;

/// The block is handed out (to a raw pointer, a `DeviceBuffer` or a `BlockHandle`).
pub(super) const ALLOCATED: u8 = 1;
/// The block was freed and waits for events on the streams that used it.
pub(super) const PENDING_FREE: u8 = 2;
/// The allocated block belongs to a `DeviceBuffer`, which frees it by block id; it has no
/// entry in the raw-pointer map.
pub(super) const BUFFER_OWNED: u8 = 4;
/// An unmapped page range inside an expandable segment (after a release unmapped the free
/// pages there): neither free nor allocated, in no free list.
pub(super) const UNMAPPED: u8 = 8;

/// Allocator-side metadata of one block: 48 bytes.
#[derive(Clone, Copy, Debug)]
pub(super) struct BlockMeta {
    pub(super) addr: u64,
    pub(super) size: u64,
    pub(super) requested: u64,
    pub(super) prev: u32,
    pub(super) next: u32,
    pub(super) segment: u32,
    pub(super) provenance: u32,
    pub(super) step: u32,
    /// Index of the segment's free list in `State::free_lists`, or [`LIST_IN_SEGMENT`] when
    /// the index does not fit in 16 bits (then `SegmentMeta::list` has it): the common case
    /// reads it here, on the block's own cache line, and a program with more than 65,534 free
    /// lists (streams × pools) still finds the right one.
    pub(super) list: u16,
    pub(super) flags: u8,
    /// The segment's pool (also known through `list`, kept here for the hot path).
    pub(super) pool: Pool,
}

impl BlockMeta {
    /// A free block of `size` bytes at `addr` in `segment`, not yet linked to any neighbour.
    pub(super) fn new_free(addr: u64, size: u64, segment: u32, list: u32, pool: Pool) -> BlockMeta {
        BlockMeta {
            addr,
            size,
            requested: 0,
            prev: NIL,
            next: NIL,
            segment,
            provenance: NIL,
            step: 0,
            list: compact_list(list),
            flags: 0,
            pool,
        }
    }
    /// Handed out (not free, pending or unmapped).
    pub(super) fn is_allocated(&self) -> bool {
        self.flags & ALLOCATED != 0
    }
    /// Free: in its free list (not allocated, pending or unmapped).
    pub(super) fn is_free(&self) -> bool {
        self.flags == 0
    }
    /// Not the whole of its segment: it has a neighbour.
    pub(super) fn is_split(&self) -> bool {
        self.prev != NIL || self.next != NIL
    }
}

/// `BlockMeta::list` of a block whose free list's index does not fit in 16 bits.
const LIST_IN_SEGMENT: u16 = u16::MAX;

/// A free-list index as `BlockMeta::list` keeps it (index 65,535 itself reads as
/// [`LIST_IN_SEGMENT`], which sends the lookup to the segment: still the right list).
#[inline]
fn compact_list(list: u32) -> u16 {
    u16::try_from(list).unwrap_or(LIST_IN_SEGMENT)
}

/// Allocator-side metadata of one segment.
#[derive(Clone, Copy, Debug)]
pub(super) struct SegmentMeta {
    pub(super) addr: u64,
    /// Bytes backed by memory (for expandable segments, the mapped prefix).
    pub(super) size: u64,
    /// Address space reserved (expandable segments only).
    pub(super) reserved: u64,
    /// Bytes of `UNMAPPED` blocks inside `size` (expandable segments only): the segment's
    /// blocks cover `size` bytes, of which `size - holes` are mapped.
    pub(super) holes: u64,
    pub(super) stream: StreamId,
    pub(super) pool: Pool,
    /// Index of the free list of (`stream`, `pool`) in `State::free_lists`.
    pub(super) list: u32,
    pub(super) expandable: bool,
    pub(super) first: u32,
    pub(super) last: u32,
    /// `State::large_lookups` when the segment last became wholly free: garbage collection's
    /// age of the segment is the lookups since. A segment is wholly free when its one block is
    /// free: free neighbours always merge, so a segment without live blocks is a single free
    /// block (`State::is_idle`).
    pub(super) idle_since: u64,
}

/// The free blocks of one (stream, pool) pair, ordered like PyTorch's `BlockComparatorSize`
/// within a stream: by size, then address, packed into one `u128` key for cheap comparisons.
pub(super) struct FreeList {
    pub(super) stream: StreamId,
    pub(super) pool: Pool,
    pub(super) blocks: FreeIndex,
}

/// The key of a free block in its free list: size, then address.
#[inline]
pub(super) fn free_key(size: u64, addr: u64) -> u128 {
    ((size as u128) << 64) | addr as u128
}

/// No free list: an empty entry of `State::first_stream_lists`.
const NO_LIST: u32 = u32::MAX;

/// The top sites of an out-of-memory report (label, live bytes, live blocks), with the
/// number of allocations and frees they were worked out at and how many rows were asked for.
pub(super) type TopSitesCache = ((u64, usize), Vec<(String, u64, u64)>);

/// Everything the allocator knows about one device, guarded by its mutex
/// (`super::Shared::state`). Aligned to 128 bytes (a pair of cache lines, which x86 fetches
/// together) so that the mutex's lock word, just before it, has its lines to itself: threads
/// waiting for the lock read that word, and the holder's writes to the first fields here
/// would otherwise have to win the line back from them each time.
#[repr(align(128))]
pub(super) struct State {
    /// Every block, free, allocated, pending or unmapped, by id.
    pub(super) blocks: Slab<BlockMeta>,
    /// Every segment by id.
    pub(super) segments: Slab<SegmentMeta>,
    /// Segment ids by base address, for address lookups and address-ordered walks.
    pub(super) segments_by_addr: BTreeMap<u64, u32>,
    /// Block ids of the raw-pointer API's live blocks, by address.
    pub(super) live: FxHashMap<u64, u32>,
    /// The free lists, one per (stream, pool) pair in use, in order of creation.
    pub(super) free_lists: Vec<FreeList>,
    /// The stream of the first free list made, whose lists [`State::find_list`] reads
    /// without a search (a program on one stream never searches).
    pub(super) first_stream: StreamId,
    /// The free lists of `first_stream` by `Pool as usize`, or `NO_LIST` before they exist.
    pub(super) first_stream_lists: [u32; 2],
    /// The free lists of the other streams, by (stream, pool).
    pub(super) other_lists: FxHashMap<(u64, Pool), u32>,
    /// The expandable segments as (stream, pool, segment id).
    pub(super) expandable: Vec<(StreamId, Pool, u32)>,
    /// The other streams that used each live block (`record_stream`), by block id.
    pub(super) stream_uses: FxHashMap<u32, Vec<StreamId>>,
    /// Events still to complete before each pending block is free, by block id.
    pub(super) pending_events: FxHashMap<u32, u32>,
    /// Recorded stream events and the block each one holds, oldest first.
    pub(super) outstanding: VecDeque<(EventId, u32)>,
    /// Completed events kept for reuse.
    pub(super) spare_events: Vec<EventId>,
    /// The statistics.
    pub(super) stats: StatsBook,
    /// The event ring.
    pub(super) ring: EventRing,
    /// The clock reading of the last event recorded.
    pub(super) last_ticks: u64,
    /// Interned call sites, tags, scopes and their combinations.
    pub(super) provenance: ProvenanceTables,
    /// The current step number.
    pub(super) step: u64,
    /// The step number as events and blocks keep it: `step`, saturated to `u32::MAX`.
    pub(super) event_step: u32,
    /// Where each step began.
    pub(super) steps: Vec<StepMark>,
    /// Free-block lookups in the large pool so far: PyTorch's `get_free_blocks_call_count`, the
    /// clock by which garbage collection ages whole free segments.
    pub(super) large_lookups: u64,
    /// PyTorch's `set_per_process_memory_fraction`, in bytes: see
    /// [`CachingAllocator::set_memory_limit`](super::CachingAllocator::set_memory_limit).
    pub(super) memory_limit: Option<u64>,
    /// Last owners of freed ranges (with `debug`).
    pub(super) freed: FreedOwners,
    /// Violations found by the debug checks.
    pub(super) violations: Vec<Violation>,
    /// The top sites of the last out-of-memory report, with the number of allocations and
    /// frees (`CounterArray::changes`) they were worked out at and how many were asked for.
    pub(super) top_sites_cache: Option<TopSitesCache>,
    /// The [`State::free_blocks_generation`] at the end of the last release of cached blocks
    /// that released nothing, while nothing has changed since.
    pub(super) fruitless_release: Option<[u64; 6]>,
    /// Whether the backend refused the address range of a new expandable segment in the latest
    /// attempt at a new block: cleared at each attempt, taken by the out-of-memory report that
    /// follows a failed one (which then names the address space, not memory).
    pub(super) address_space_refused: bool,
}

impl State {
    /// The books of a device with nothing allocated yet, with an event ring of
    /// `ring_capacity` entries.
    pub(super) fn new(ring_capacity: usize) -> State {
        State {
            blocks: Slab::new(),
            segments: Slab::new(),
            segments_by_addr: BTreeMap::new(),
            live: FxHashMap::default(),
            free_lists: Vec::new(),
            first_stream: StreamId(0),
            first_stream_lists: [NO_LIST; 2],
            other_lists: FxHashMap::default(),
            expandable: Vec::new(),
            stream_uses: FxHashMap::default(),
            pending_events: FxHashMap::default(),
            top_sites_cache: None,
            fruitless_release: None,
            address_space_refused: false,
            outstanding: VecDeque::new(),
            spare_events: Vec::new(),
            stats: StatsBook::default(),
            ring: EventRing::new(ring_capacity),
            last_ticks: 0,
            provenance: ProvenanceTables::default(),
            step: 0,
            event_step: 0,
            steps: Vec::new(),
            large_lookups: 0,
            memory_limit: None,
            freed: FreedOwners::default(),
            violations: Vec::new(),
        }
    }

    /// The free list of (stream, pool), created on first use.
    pub(super) fn list_index(&mut self, stream: StreamId, pool: Pool) -> u32 {
        if let Some(i) = self.find_list(stream, pool) {
            return i;
        }
        if self.free_lists.is_empty() {
            self.first_stream = stream;
        }
        self.free_lists.push(FreeList {
            stream,
            pool,
            blocks: FreeIndex::new(),
        });
        let index = (self.free_lists.len() - 1) as u32;
        if stream == self.first_stream {
            self.first_stream_lists[pool as usize] = index;
        } else {
            self.other_lists.insert((stream.0, pool), index);
        }
        index
    }

    /// The free list of (stream, pool), if it exists: read from `first_stream_lists` for the
    /// first stream, searched for the others.
    #[inline]
    pub(super) fn find_list(&self, stream: StreamId, pool: Pool) -> Option<u32> {
        if stream == self.first_stream {
            let list = self.first_stream_lists[pool as usize];
            return (list != NO_LIST).then_some(list);
        }
        self.find_other_list(stream, pool)
    }

    /// [`State::find_list`] for a stream other than the first.
    #[cold]
    #[inline(never)]
    fn find_other_list(&self, stream: StreamId, pool: Pool) -> Option<u32> {
        self.other_lists.get(&(stream.0, pool)).copied()
    }

    /// The index of block `b`'s free list.
    #[inline(always)]
    pub(super) fn list_of(&self, b: &BlockMeta) -> usize {
        if b.list != LIST_IN_SEGMENT {
            b.list as usize
        } else {
            self.segments.get(b.segment).list as usize
        }
    }

    /// Merges the free block `id` (in no free list) with its free neighbours and puts the
    /// result in its free list; returns the merged block.
    pub(super) fn merge_into_free(&mut self, id: u32) -> u32 {
        let b = *self.blocks.get(id);
        if b.prev != NIL && self.blocks.get(b.prev).is_free() {
            self.absorb_prev(id, b.prev);
        }
        let next = self.blocks.get(id).next;
        if next != NIL && self.blocks.get(next).is_free() {
            self.absorb_next(id, next);
        }
        self.insert_free(id);
        id
    }

    /// Links a new block made of `meta` (its links aside) into `at`'s segment just before `at`;
    /// returns its id.
    pub(super) fn insert_before(&mut self, at: u32, meta: BlockMeta) -> u32 {
        self.insert_between(self.blocks.get(at).prev, at, meta)
    }

    /// Links a new block made of `meta` (its links aside) into `at`'s segment just after `at`;
    /// returns its id.
    pub(super) fn insert_after(&mut self, at: u32, meta: BlockMeta) -> u32 {
        self.insert_between(at, self.blocks.get(at).next, meta)
    }

    /// Links a new block made of `meta` (its links aside) between the neighbours `prev` and
    /// `next` of `meta.segment` (`NIL` for the segment's start or end; both for an empty
    /// segment); returns its id.
    pub(super) fn insert_between(&mut self, prev: u32, next: u32, meta: BlockMeta) -> u32 {
        let id = self.blocks.insert(BlockMeta { prev, next, ..meta });
        if prev != NIL {
            self.blocks.get_mut(prev).next = id;
        } else {
            self.segments.get_mut(meta.segment).first = id;
        }
        if next != NIL {
            self.blocks.get_mut(next).prev = id;
        } else {
            self.segments.get_mut(meta.segment).last = id;
        }
        id
    }

    /// Whether reserving `more` bytes would pass the memory limit (never without one).
    pub(super) fn over_memory_limit(&self, more: u64) -> bool {
        let reserved = self.stats.reserved_bytes.all().current;
        self.memory_limit
            .is_some_and(|limit| reserved.saturating_add(more) > limit)
    }

    /// Whether a segment has no live (allocated or pending) block: it is one free block.
    pub(super) fn is_idle(&self, segment: &SegmentMeta) -> bool {
        segment.first == NIL
            || (segment.first == segment.last && self.blocks.get(segment.first).is_free())
    }

    /// The stream a block's segment belongs to.
    #[inline]
    pub(super) fn stream_of(&self, block: u32) -> StreamId {
        self.free_lists[self.list_of(self.blocks.get(block))].stream
    }

    /// Cuts block `id` (not in a free list) after its first `keep` bytes; the rest becomes a
    /// new free block, not yet in a free list, whose id is returned.
    #[inline]
    pub(super) fn split_off(&mut self, id: u32, keep: u64) -> u32 {
        let b = *self.blocks.get(id);
        let remainder = self.blocks.insert(BlockMeta {
            addr: b.addr + keep,
            size: b.size - keep,
            requested: 0,
            prev: id,
            next: b.next,
            segment: b.segment,
            provenance: NIL,
            step: 0,
            list: b.list,
            flags: 0,
            pool: b.pool,
        });
        if b.next != NIL {
            self.blocks.get_mut(b.next).prev = remainder;
        } else {
            self.segments.get_mut(b.segment).last = remainder;
        }
        let block = self.blocks.get_mut(id);
        block.size = keep;
        block.next = remainder;
        remainder
    }

    /// Merges the free block `prev`, just before block `id`, into `id` (out of its free list and
    /// the slab); returns the bytes merged.
    #[inline]
    pub(super) fn absorb_prev(&mut self, id: u32, prev: u32) -> u64 {
        self.unindex_free(prev);
        let n = self.blocks.remove(prev);
        let block = self.blocks.get_mut(id);
        block.addr = n.addr;
        block.size += n.size;
        block.prev = n.prev;
        if n.prev != NIL {
            self.blocks.get_mut(n.prev).next = id;
        } else {
            self.segments.get_mut(n.segment).first = id;
        }
        n.size
    }

    /// Merges the free block `next`, just after block `id`, into `id`; returns the bytes merged.
    #[inline]
    pub(super) fn absorb_next(&mut self, id: u32, next: u32) -> u64 {
        self.unindex_free(next);
        let n = self.blocks.remove(next);
        let block = self.blocks.get_mut(id);
        block.size += n.size;
        block.next = n.next;
        if n.next != NIL {
            self.blocks.get_mut(n.next).prev = id;
        } else {
            self.segments.get_mut(n.segment).last = id;
        }
        n.size
    }

    /// Puts a free block into its free list and counts it as inactive split if split (outside
    /// expandable segments, which PyTorch leaves out of that statistic).
    #[inline]
    pub(super) fn insert_free(&mut self, id: u32) {
        self.index_free(id);
        let b = *self.blocks.get(id);
        if b.is_split() && self.counts_inactive_split(b.segment) {
            self.stats.inactive_split.increase(b.pool, 1);
            self.stats.inactive_split_bytes.increase(b.pool, b.size);
        }
    }

    /// Whether free split blocks of `segment` count as inactive split: PyTorch leaves
    /// expandable segments out (their free pages can always be released).
    #[inline]
    pub(super) fn counts_inactive_split(&self, segment: u32) -> bool {
        !self.segments.get(segment).expandable
    }

    /// Puts a free block into its free list without counting it (the caller counts the net
    /// change).
    #[inline(always)]
    pub(super) fn index_free(&mut self, id: u32) {
        let b = self.blocks.get(id);
        let list = self.list_of(b);
        self.free_lists[list]
            .blocks
            .insert(free_key(b.size, b.addr), id);
    }

    /// Takes a free block out of its free list without counting it, undoing
    /// [`State::index_free`].
    #[inline(always)]
    pub(super) fn unindex_free(&mut self, id: u32) {
        let b = self.blocks.get(id);
        let list = self.list_of(b);
        let removed = self.free_lists[list]
            .blocks
            .remove(free_key(b.size, b.addr));
        debug_assert_eq!(removed, Some(id), "free block was in its list");
    }

    /// Takes a free block out of its free list, undoing [`State::insert_free`].
    #[inline]
    pub(super) fn remove_free(&mut self, id: u32) {
        self.unindex_free(id);
        let b = *self.blocks.get(id);
        if b.is_split() && self.counts_inactive_split(b.segment) {
            self.stats.inactive_split.decrease(b.pool, 1);
            self.stats.inactive_split_bytes.decrease(b.pool, b.size);
        }
    }

    /// The parts of the events of a free (the request and its completion alike): `original` is
    /// the block as the program freed it, before any merge.
    #[inline(always)]
    pub(super) fn free_parts(&self, original: &BlockMeta) -> RawEventParts {
        RawEventParts {
            addr: original.addr,
            size: original.size,
            requested: original.requested,
            // The block's free list, and so its stream, is its segment's: a merge keeps it.
            stream: self.free_lists[self.list_of(original)].stream.0,
            provenance: original.provenance,
        }
    }

    /// Records an event stamped now.
    #[inline(always)]
    pub(super) fn record(&mut self, clock: &Clock, kind: EventKind, event: RawEventParts) {
        let ticks = clock.ticks();
        self.last_ticks = ticks;
        self.record_at(ticks, kind, event);
    }

    /// Records an event with a time stamp already read (reading the time stamp counter costs
    /// about as much as the rest of an event: one read per operation is enough).
    #[inline(always)]
    pub(super) fn record_at(&mut self, time_ns: u64, kind: EventKind, event: RawEventParts) {
        let step = self.event_step;
        self.ring.push_with(|| RawEvent {
            time_ns,
            addr: event.addr,
            size: event.size,
            requested: event.requested,
            stream: event.stream,
            provenance: event.provenance,
            step,
            kind,
        });
    }
}

/// The variable parts of an event.
#[derive(Clone, Copy)]
pub(super) struct RawEventParts {
    pub(super) addr: u64,
    pub(super) size: u64,
    pub(super) requested: u64,
    pub(super) stream: u64,
    pub(super) provenance: u32,
}

impl Default for RawEventParts {
    /// No address, size or stream, and no provenance (not provenance id 0).
    fn default() -> Self {
        RawEventParts {
            addr: 0,
            size: 0,
            requested: 0,
            stream: 0,
            provenance: NIL,
        }
    }
}
