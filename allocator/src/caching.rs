//! The caching allocator: PyTorch's CUDA caching policy over any [`Backend`], with statistics,
//! provenance and an event ring.
//!
//! [`CachingAllocator`] is a cheap handle (an `Arc`) to one device's state behind one
//! `parking_lot` mutex. Requests are rounded, routed to the small or large pool, served by the
//! smallest cached block on the same stream, split, and merged back with free neighbours on free,
//! exactly as `c10/cuda/CUDACachingAllocator.cpp` does; new segments come from the backend
//! (`crate::backend`), and `crate::sim` stands in for a GPU. Every operation updates the
//! statistics (a `crate::stats::StatsBook`, read out as
//! [`MemoryStats`]) and, when tracking is on, pushes an event into
//! the ring (`crate::ring`) with an interned provenance id (`crate::provenance`). Handed-out memory
//! is a [`DeviceBuffer`](crate::buffer::DeviceBuffer) that frees itself on drop; the raw
//! pointer API serves the C ABI, and [`BlockHandle`]s free by id without an address lookup. An
//! [`Exclusive`] guard holds the device lock across a run of operations (trace replay, a
//! single-threaded program) so that each skips the lock round-trip. Free blocks are indexed by
//! `crate::free_index`.

use std::collections::{BTreeMap, VecDeque};
use std::fmt;
use std::num::NonZeroU32;
use std::panic::Location;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use rustc_hash::FxHashMap;

use crate::backend::{Backend, BackendError, EventId, StreamId};
use crate::clock::Clock;
use crate::config::{AllocatorConfig, BacktraceMode, Policy, MIB};
use crate::debug::{self, FreedOwners, FreedRange};
use crate::free_index::FreeIndex;
use crate::model::{
    Block, BlockState, DeviceInfo, EventKind, Owner, Pool, Segment, Snapshot, SnapshotSource,
    StepMark, Violation, ViolationKind,
};
use crate::provenance::{self, Provenance, ProvenanceTables, NIL};
use crate::ring::{EventRing, RawEvent};
use crate::stats::{format_bytes, MemoryStats, StatsBook};
use crate::sync::{Mutex, MutexGuard};

/// Requests are rounded up to a multiple of this (and never below it).
pub const MIN_BLOCK_SIZE: u64 = 512;
/// Rounded requests up to this size use the small pool.
pub const SMALL_SIZE: u64 = MIB;
/// Segment size for small-pool requests.
pub const SMALL_BUFFER: u64 = 2 * MIB;
/// Segment size for large-pool requests under [`MIN_LARGE_ALLOC`]; also the most an oversize
/// request may waste when `max_split_size` is set.
pub const LARGE_BUFFER: u64 = 20 * MIB;
/// Large requests from this size get a segment of their own size, rounded to [`ROUND_LARGE`].
pub const MIN_LARGE_ALLOC: u64 = 10 * MIB;
/// Rounding of large segments.
pub const ROUND_LARGE: u64 = 2 * MIB;

static NEXT_ALLOCATOR_ID: AtomicU64 = AtomicU64::new(1);

/// The largest rounded request the allocator asks a device for (2^62 bytes); larger ones are
/// out of memory at once, before computing a segment size could overflow.
const MAX_REQUEST: u64 = 1 << 62;

const ALLOCATED: u8 = 1;
const PENDING_FREE: u8 = 2;
/// The allocated block belongs to a `DeviceBuffer`, which frees it by block id; it has no
/// entry in the raw-pointer map.
const BUFFER_OWNED: u8 = 4;
/// An unmapped page range inside an expandable segment (after a release unmapped the free
/// pages there): neither free nor allocated, in no free list.
const UNMAPPED: u8 = 8;

/// Allocator-side metadata of one block: 48 bytes.
#[derive(Clone, Copy, Debug)]
struct BlockMeta {
    addr: u64,
    size: u64,
    requested: u64,
    prev: u32,
    next: u32,
    segment: u32,
    provenance: u32,
    step: u32,
    /// Index of the segment's free list in `State::free_lists`, or [`LIST_IN_SEGMENT`] when
    /// the index does not fit in 16 bits (then `SegmentMeta::list` has it): the common case
    /// reads it here, on the block's own cache line, and a program with more than 65,534 free
    /// lists (streams × pools) still finds the right one.
    list: u16,
    flags: u8,
    /// The segment's pool (also known through `list`, kept here for the hot path).
    pool: Pool,
}

impl BlockMeta {
    /// A free block of `size` bytes at `addr` in `segment`, not yet linked to any neighbour.
    fn new_free(addr: u64, size: u64, segment: u32, list: u32, pool: Pool) -> BlockMeta {
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
    fn is_allocated(&self) -> bool {
        self.flags & ALLOCATED != 0
    }
    fn is_free(&self) -> bool {
        self.flags == 0
    }
    fn is_split(&self) -> bool {
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
struct SegmentMeta {
    addr: u64,
    /// Bytes backed by memory (for expandable segments, the mapped prefix).
    size: u64,
    /// Address space reserved (expandable segments only).
    reserved: u64,
    /// Bytes of `UNMAPPED` blocks inside `size` (expandable segments only): the segment's
    /// blocks cover `size` bytes, of which `size - holes` are mapped.
    holes: u64,
    stream: StreamId,
    pool: Pool,
    /// Index of the free list of (`stream`, `pool`) in `State::free_lists`.
    list: u32,
    expandable: bool,
    first: u32,
    last: u32,
    /// `State::large_lookups` when the segment last became wholly free: garbage collection's
    /// age of the segment is the lookups since. A segment is wholly free when its one block is
    /// free: free neighbours always merge, so a segment without live blocks is a single free
    /// block (`State::is_idle`).
    idle_since: u64,
}

/// A vector of slots with a free list, addressed by `u32` ids. Vacant slots keep their last
/// value (debug builds check that only live slots are read). `slots` only grows, so an id once
/// handed out stays in bounds: `get` and `get_mut` skip the bounds check, which the block
/// metadata reads of every operation would otherwise repeat (about 5 % of the instructions of
/// an allocation and free).
struct Slab<T> {
    slots: Vec<T>,
    vacant: Vec<u32>,
    #[cfg(debug_assertions)]
    live: Vec<bool>,
}

impl<T: Copy> Slab<T> {
    fn new() -> Self {
        Slab {
            slots: Vec::new(),
            vacant: Vec::new(),
            #[cfg(debug_assertions)]
            live: Vec::new(),
        }
    }
    #[inline]
    fn insert(&mut self, value: T) -> u32 {
        let id = if let Some(id) = self.vacant.pop() {
            self.slots[id as usize] = value;
            id
        } else {
            self.slots.push(value);
            #[cfg(debug_assertions)]
            self.live.push(false);
            (self.slots.len() - 1) as u32
        };
        #[cfg(debug_assertions)]
        {
            self.live[id as usize] = true;
        }
        id
    }
    #[inline]
    fn remove(&mut self, id: u32) -> T {
        #[cfg(debug_assertions)]
        {
            assert!(self.live[id as usize], "slab slot {id} removed twice");
            self.live[id as usize] = false;
        }
        self.vacant.push(id);
        self.slots[id as usize]
    }
    #[inline]
    fn get(&self, id: u32) -> &T {
        #[cfg(debug_assertions)]
        debug_assert!(self.live[id as usize], "slab slot {id} is vacant");
        // SAFETY: ids come from `insert`, which returns an index below `slots.len()`, and
        // `slots` never shrinks; ids from outside the allocator (a `BlockHandle` or a
        // `DeviceBuffer`) are checked against `slots.len()` before they reach here. Debug
        // builds (all tests) also index `live` above, which panics on any id out of bounds.
        unsafe { self.slots.get_unchecked(id as usize) }
    }
    #[inline]
    fn get_mut(&mut self, id: u32) -> &mut T {
        #[cfg(debug_assertions)]
        debug_assert!(self.live[id as usize], "slab slot {id} is vacant");
        // SAFETY: as in `get`.
        unsafe { self.slots.get_unchecked_mut(id as usize) }
    }
    fn iter(&self) -> impl Iterator<Item = (u32, &T)> {
        let mut vacant = vec![false; self.slots.len()];
        for &id in &self.vacant {
            vacant[id as usize] = true;
        }
        self.slots
            .iter()
            .enumerate()
            .filter(move |(i, _)| !vacant[*i])
            .map(|(i, v)| (i as u32, v))
    }
    fn len(&self) -> usize {
        self.slots.len() - self.vacant.len()
    }
}

/// The free blocks of one (stream, pool) pair, ordered like PyTorch's `BlockComparatorSize`
/// within a stream: by size, then address, packed into one `u128` key for cheap comparisons.
struct FreeList {
    stream: StreamId,
    pool: Pool,
    blocks: FreeIndex,
}

#[inline]
fn free_key(size: u64, addr: u64) -> u128 {
    ((size as u128) << 64) | addr as u128
}

/// Why an allocation or free failed.
#[derive(Debug)]
#[non_exhaustive]
pub enum AllocError {
    /// The device could not supply the memory even after freeing the cache.
    OutOfMemory(Box<OomReport>),
    /// The pointer was already freed.
    DoubleFree {
        /// The pointer.
        addr: u64,
    },
    /// The pointer was never handed out by this allocator (or is not the start of a block).
    UnknownPointer {
        /// The pointer.
        addr: u64,
    },
    /// The pointer belongs to a live `DeviceBuffer`, which frees it when dropped.
    OwnedByBuffer {
        /// The pointer.
        addr: u64,
    },
    /// The pointer or stream belongs to another device.
    WrongDevice {
        /// This allocator's device.
        expected: u32,
        /// The device named by the caller.
        found: u32,
    },
    /// A copy does not fit the buffer.
    OutOfBounds {
        /// Buffer length.
        len: u64,
        /// Bytes the copy wanted.
        wanted: u64,
    },
    /// The backend failed.
    Backend(BackendError),
}

impl fmt::Display for AllocError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AllocError::OutOfMemory(report) => report.fmt(f),
            AllocError::DoubleFree { addr } => {
                write!(f, "double free: the block at {addr:#x} is already free")
            }
            AllocError::UnknownPointer { addr } => write!(
                f,
                "free of unknown pointer {addr:#x}: it was not allocated by this allocator"
            ),
            AllocError::OwnedByBuffer { addr } => write!(
                f,
                "free of {addr:#x} through the pointer API, but a live DeviceBuffer owns it and frees it when dropped"
            ),
            AllocError::WrongDevice { expected, found } => write!(
                f,
                "wrong device: this allocator serves device {expected}, the call named device {found}"
            ),
            AllocError::OutOfBounds { len, wanted } => write!(
                f,
                "copy of {wanted} bytes does not fit a buffer of {len} bytes"
            ),
            AllocError::Backend(e) => write!(f, "device error: {e}"),
        }
    }
}

impl std::error::Error for AllocError {}

impl From<BackendError> for AllocError {
    fn from(e: BackendError) -> Self {
        AllocError::Backend(e)
    }
}

/// Everything known when an allocation fails for good.
#[derive(Clone, Debug, PartialEq)]
pub struct OomReport {
    /// Bytes the program asked for.
    pub requested: u64,
    /// The request after rounding.
    pub rounded: u64,
    /// Device ordinal.
    pub device: u32,
    /// Device capacity.
    pub capacity: u64,
    /// Free device memory at the time.
    pub device_free: u64,
    /// Bytes allocated by this allocator.
    pub allocated: u64,
    /// Bytes reserved by this allocator.
    pub reserved: u64,
    /// The call sites holding the most live memory: (site, bytes, blocks).
    pub top_sites: Vec<(String, u64, u64)>,
    /// A setting that would help, when fragmentation is the likely cause.
    pub hint: Option<String>,
}

impl OomReport {
    /// Reserved but unallocated bytes (the cache).
    pub fn reserved_unallocated(&self) -> u64 {
        self.reserved.saturating_sub(self.allocated)
    }
}

impl fmt::Display for OomReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "out of memory: tried to allocate {} ({} bytes requested) on device {}; the device has {} in total, {} free; vramscope has {} allocated and {} reserved but unallocated",
            format_bytes(self.rounded),
            self.requested,
            self.device,
            format_bytes(self.capacity),
            format_bytes(self.device_free),
            format_bytes(self.allocated),
            format_bytes(self.reserved_unallocated()),
        )?;
        if !self.top_sites.is_empty() {
            f.write_str("; largest live call sites:")?;
            for (site, bytes, blocks) in &self.top_sites {
                write!(f, " {site} ({}, {blocks} blocks);", format_bytes(*bytes))?;
            }
        }
        if let Some(hint) = &self.hint {
            write!(f, " {hint}")?;
        }
        Ok(())
    }
}

/// Where an allocation came from, gathered before the lock is taken.
pub(crate) struct Origin<'a> {
    pub location: &'static Location<'static>,
    pub tag: Option<&'a str>,
}

/// A block found for a request, and how it was found.
struct Found {
    block: u32,
    /// Taken out of a free list without counting it out of the inactive-split statistics;
    /// `use_block` counts the net change of the removal and the split together, as PyTorch does.
    uncounted: bool,
}

/// No free list: an empty entry of `State::first_stream_lists`.
const NO_LIST: u32 = u32::MAX;

struct State {
    blocks: Slab<BlockMeta>,
    segments: Slab<SegmentMeta>,
    segments_by_addr: BTreeMap<u64, u32>,
    live: FxHashMap<u64, u32>,
    free_lists: Vec<FreeList>,
    /// The stream of the first free list made, whose lists [`State::find_list`] reads
    /// without a search (a program on one stream never searches).
    first_stream: StreamId,
    /// The free lists of `first_stream` by `Pool as usize`, or `NO_LIST` before they exist.
    first_stream_lists: [u32; 2],
    /// The free lists of the other streams, by (stream, pool).
    other_lists: FxHashMap<(u64, Pool), u32>,
    expandable: Vec<(StreamId, Pool, u32)>,
    stream_uses: FxHashMap<u32, Vec<StreamId>>,
    pending_events: FxHashMap<u32, u32>,
    outstanding: VecDeque<(EventId, u32)>,
    spare_events: Vec<EventId>,
    stats: StatsBook,
    ring: EventRing,
    /// The clock reading of the last event recorded.
    last_ticks: u64,
    provenance: ProvenanceTables,
    step: u64,
    steps: Vec<StepMark>,
    /// Free-block lookups in the large pool so far: PyTorch's `get_free_blocks_call_count`, the
    /// clock by which garbage collection ages whole free segments.
    large_lookups: u64,
    /// PyTorch's `set_per_process_memory_fraction`, in bytes: see
    /// [`CachingAllocator::set_memory_limit`].
    memory_limit: Option<u64>,
    /// Last owners of freed ranges (with `debug`).
    freed: FreedOwners,
    /// Violations found by the debug checks.
    violations: Vec<Violation>,
}

struct Shared<B: Backend> {
    id: u64,
    /// vramscope's number of the thread holding an [`Exclusive`] guard (0: none), so that the
    /// same thread locking again is refused with a message instead of deadlocking.
    exclusive_thread: AtomicU64,
    /// Call sites or events are recorded (`config.record_sites || config.record_events`).
    tracking: bool,
    /// Handed-out blocks are checked (`config.debug || config.guard_bytes > 0`).
    checks: bool,
    /// `config.max_split_size`, or `u64::MAX` when unset (no block is oversize).
    max_split: u64,
    /// New segments are expandable (`config.uses_expandable_segments()`): blocks of every
    /// pool split any remainder of 512 bytes or more.
    expandable_segments: bool,
    /// Requests above this many bytes round to a power-of-two division
    /// (`roundup_power2_divisions`); `u64::MAX` when that setting is off.
    round_power2_above: u64,
    /// `id` folded into a non-zero `u32` for [`BlockHandle`]s.
    handle_tag: NonZeroU32,
    backend: B,
    device: u32,
    capacity: u64,
    config: AllocatorConfig,
    clock: Clock,
    epoch_unix_ns: u64,
    state: Mutex<State>,
}

/// A PyTorch-compatible caching allocator for one device. Clones share the same state.
pub struct CachingAllocator<B: Backend> {
    shared: Arc<Shared<B>>,
}

impl<B: Backend> Clone for CachingAllocator<B> {
    fn clone(&self) -> Self {
        CachingAllocator {
            shared: Arc::clone(&self.shared),
        }
    }
}

/// The model's event for ring entry `raw`, its provenance read in `provenances` (by id).
fn event_of(
    raw: &RawEvent,
    provenances: &[Provenance],
    ns_per_tick: f64,
    device: u32,
) -> crate::model::Event {
    let p = provenances
        .get(raw.provenance as usize)
        .copied()
        .unwrap_or(Provenance {
            site: NIL,
            tag: NIL,
            scope: NIL,
            thread: 0,
        });
    let opt = |id: u32| (id != NIL).then_some(id);
    crate::model::Event {
        seq: raw.seq,
        time_ns: (raw.time_ns as f64 * ns_per_tick) as u64,
        kind: raw.kind,
        device,
        stream: raw.stream,
        addr: raw.addr,
        size: raw.size,
        requested: raw.requested,
        site: opt(p.site),
        tag: opt(p.tag),
        scope: opt(p.scope),
        step: raw.step as u64,
        thread: p.thread,
    }
}

/// Rounds a request as PyTorch's `round_size` does.
#[inline]
pub fn round_size(size: u64, roundup_power2_divisions: u32) -> u64 {
    let divisions = roundup_power2_divisions as u64;
    if divisions > 1 && size > MIN_BLOCK_SIZE * divisions {
        return roundup_power2_next_division(size, divisions);
    }
    // Requests below `MIN_BLOCK_SIZE` (zero too) round up to it: `max(1)` makes that a
    // select instead of a branch. Saturating: a request within 511 bytes of `u64::MAX` rounds
    // down to the last multiple of 512, which no cached block matches and `grow` refuses as
    // too large.
    size.max(1).saturating_add(MIN_BLOCK_SIZE - 1) & !(MIN_BLOCK_SIZE - 1)
}

fn roundup_power2_next_division(size: u64, divisions: u64) -> u64 {
    if size.is_power_of_two() {
        return size;
    }
    let floor = 1u64 << (63 - size.leading_zeros());
    let division = floor >> (63 - divisions.leading_zeros());
    if division == 0 {
        return floor.saturating_mul(2);
    }
    let rounded_floor = size & !(division - 1);
    if rounded_floor == size {
        size
    } else {
        rounded_floor.saturating_add(division)
    }
}

/// The pool a rounded request belongs to.
pub fn pool_for(rounded: u64) -> Pool {
    if rounded <= SMALL_SIZE {
        Pool::Small
    } else {
        Pool::Large
    }
}

/// The size of a new segment for a rounded request (PyTorch's `get_allocation_size`).
pub fn segment_size_for(rounded: u64) -> u64 {
    if rounded <= SMALL_SIZE {
        SMALL_BUFFER
    } else if rounded < MIN_LARGE_ALLOC {
        LARGE_BUFFER
    } else {
        rounded.div_ceil(ROUND_LARGE) * ROUND_LARGE
    }
}

impl State {
    /// The free list of (stream, pool), created on first use.
    fn list_index(&mut self, stream: StreamId, pool: Pool) -> u32 {
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
    fn find_list(&self, stream: StreamId, pool: Pool) -> Option<u32> {
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
    fn list_of(&self, b: &BlockMeta) -> usize {
        if b.list != LIST_IN_SEGMENT {
            b.list as usize
        } else {
            self.segments.get(b.segment).list as usize
        }
    }

    /// PyTorch's `find_expandable_block` within expandable `segment`: where room for `size`
    /// bytes starts. Unmapped ranges are tried lowest first (holes, then the unmapped rest at
    /// the end); the room starts at the free block just before the range if there is one, and
    /// runs on over free and unmapped ranges. Returns the block it starts at, `NIL` for the
    /// unmapped rest at the end, or `None` when nothing has room.
    fn expandable_room(&self, segment: u32, size: u64) -> Option<u32> {
        let seg = self.segments.get(segment);
        let end_room = seg.reserved - seg.size;
        // Holes are looked for only where there are some: walking the blocks of a segment
        // without holes on every growth made the compact policy's first pass 2× slower.
        let mut id = if seg.holes > 0 { seg.first } else { NIL };
        while id != NIL {
            let b = self.blocks.get(id);
            if b.flags & UNMAPPED != 0 {
                let start = if b.prev != NIL && self.blocks.get(b.prev).is_free() {
                    b.prev
                } else {
                    id
                };
                if self.room_from(start, end_room) >= size {
                    return Some(start);
                }
            }
            id = b.next;
        }
        let start = if seg.last != NIL && self.blocks.get(seg.last).is_free() {
            seg.last
        } else {
            NIL
        };
        let room = if start == NIL {
            end_room
        } else {
            self.blocks.get(start).size + end_room
        };
        (room >= size).then_some(start)
    }

    /// Bytes of free and unmapped address space from block `start` on, through the end's
    /// `end_room` when the run reaches it.
    fn room_from(&self, start: u32, end_room: u64) -> u64 {
        let mut room = 0;
        let mut id = start;
        while id != NIL {
            let b = self.blocks.get(id);
            if !b.is_free() && b.flags & UNMAPPED == 0 {
                return room;
            }
            room += b.size;
            id = b.next;
        }
        room + end_room
    }

    /// Bytes of unmapped address space right after block `id`, which a best fit counts as
    /// room the block can grow into: `None` outside expandable segments.
    fn unmapped_after(&self, id: u32) -> Option<u64> {
        let b = self.blocks.get(id);
        let seg = self.segments.get(b.segment);
        if !seg.expandable {
            return None;
        }
        Some(if b.next == NIL {
            seg.reserved - seg.size
        } else {
            let next = self.blocks.get(b.next);
            if next.flags & UNMAPPED != 0 {
                next.size
            } else {
                0
            }
        })
    }

    /// Merges the free block `id` (in no free list) with its free neighbours and puts the
    /// result in its free list; returns the merged block.
    fn merge_into_free(&mut self, id: u32) -> u32 {
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
    fn insert_before(&mut self, at: u32, meta: BlockMeta) -> u32 {
        self.insert_between(self.blocks.get(at).prev, at, meta)
    }

    /// Links a new block made of `meta` (its links aside) into `at`'s segment just after `at`;
    /// returns its id.
    fn insert_after(&mut self, at: u32, meta: BlockMeta) -> u32 {
        self.insert_between(at, self.blocks.get(at).next, meta)
    }

    /// Links a new block made of `meta` (its links aside) between the neighbours `prev` and
    /// `next` of `meta.segment` (`NIL` for the segment's start or end; both for an empty
    /// segment); returns its id.
    fn insert_between(&mut self, prev: u32, next: u32, meta: BlockMeta) -> u32 {
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

    /// Merges the unmapped block `other`, a neighbour of the unmapped block `id`, into `id`.
    fn absorb_unmapped(&mut self, id: u32, other: u32) {
        let o = self.blocks.remove(other);
        let b = self.blocks.get_mut(id);
        b.size += o.size;
        if o.addr < b.addr {
            b.addr = o.addr;
            b.prev = o.prev;
            if o.prev != NIL {
                self.blocks.get_mut(o.prev).next = id;
            } else {
                self.segments.get_mut(o.segment).first = id;
            }
        } else {
            b.next = o.next;
            if o.next != NIL {
                self.blocks.get_mut(o.next).prev = id;
            } else {
                self.segments.get_mut(o.segment).last = id;
            }
        }
    }

    /// Whether reserving `more` bytes would pass the memory limit (never without one).
    fn over_memory_limit(&self, more: u64) -> bool {
        let reserved = self.stats.reserved_bytes.all().current;
        self.memory_limit
            .is_some_and(|limit| reserved.saturating_add(more) > limit)
    }

    /// Whether a segment has no live (allocated or pending) block: it is one free block.
    fn is_idle(&self, segment: &SegmentMeta) -> bool {
        segment.first == NIL
            || (segment.first == segment.last && self.blocks.get(segment.first).is_free())
    }

    /// The stream a block's segment belongs to.
    #[inline]
    fn stream_of(&self, block: u32) -> StreamId {
        self.free_lists[self.list_of(self.blocks.get(block))].stream
    }

    /// Cuts block `id` (not in a free list) after its first `keep` bytes; the rest becomes a
    /// new free block, not yet in a free list, whose id is returned.
    #[inline]
    fn split_off(&mut self, id: u32, keep: u64) -> u32 {
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
    fn absorb_prev(&mut self, id: u32, prev: u32) -> u64 {
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
    fn absorb_next(&mut self, id: u32, next: u32) -> u64 {
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
    fn insert_free(&mut self, id: u32) {
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
    fn counts_inactive_split(&self, segment: u32) -> bool {
        !self.segments.get(segment).expandable
    }

    /// Puts a free block into its free list without counting it (the caller counts the net
    /// change).
    #[inline(always)]
    fn index_free(&mut self, id: u32) {
        let b = self.blocks.get(id);
        let list = self.list_of(b);
        self.free_lists[list]
            .blocks
            .insert(free_key(b.size, b.addr), id);
    }

    /// Takes a free block out of its free list without counting it, undoing
    /// [`State::index_free`].
    #[inline(always)]
    fn unindex_free(&mut self, id: u32) {
        let b = self.blocks.get(id);
        let list = self.list_of(b);
        let removed = self.free_lists[list]
            .blocks
            .remove(free_key(b.size, b.addr));
        debug_assert_eq!(removed, Some(id), "free block was in its list");
    }

    /// Takes a free block out of its free list, undoing [`State::insert_free`].
    #[inline]
    fn remove_free(&mut self, id: u32) {
        self.unindex_free(id);
        let b = *self.blocks.get(id);
        if b.is_split() && self.counts_inactive_split(b.segment) {
            self.stats.inactive_split.decrease(b.pool, 1);
            self.stats.inactive_split_bytes.decrease(b.pool, b.size);
        }
    }

    /// Records an event stamped now.
    #[inline(always)]
    fn record(&mut self, clock: &Clock, kind: EventKind, event: RawEventParts) {
        let ticks = clock.ticks();
        self.last_ticks = ticks;
        self.record_at(ticks, kind, event);
    }

    /// Records an event with a time stamp already read (reading the time stamp counter costs
    /// about as much as the rest of an event: one read per operation is enough).
    #[inline(always)]
    fn record_at(&mut self, time_ns: u64, kind: EventKind, event: RawEventParts) {
        let step = self.step.min(u32::MAX as u64) as u32;
        self.ring.push_with(|seq| RawEvent {
            seq,
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
struct RawEventParts {
    addr: u64,
    size: u64,
    requested: u64,
    stream: u64,
    provenance: u32,
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

impl<B: Backend> CachingAllocator<B> {
    /// An allocator for `device` with `config`.
    pub fn new(device: B, config: AllocatorConfig) -> CachingAllocator<B> {
        let info = device.mem_info();
        let epoch_unix_ns = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
        let id = NEXT_ALLOCATOR_ID.fetch_add(1, Ordering::Relaxed);
        let ring_capacity = if config.record_events {
            config.max_entries
        } else {
            1
        };
        CachingAllocator {
            shared: Arc::new(Shared {
                id,
                exclusive_thread: AtomicU64::new(0),
                tracking: config.record_sites || config.record_events,
                checks: config.debug || config.guard_bytes > 0,
                max_split: config.max_split_size.unwrap_or(u64::MAX),
                expandable_segments: config.uses_expandable_segments(),
                round_power2_above: match config.roundup_power2_divisions as u64 {
                    0 | 1 => u64::MAX,
                    divisions => MIN_BLOCK_SIZE * divisions,
                },
                handle_tag: NonZeroU32::new(id as u32).unwrap_or(NonZeroU32::MAX),
                device: device.device_index(),
                capacity: info.total,
                backend: device,
                clock: Clock::new(),
                epoch_unix_ns,
                state: Mutex::new(State {
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
                    outstanding: VecDeque::new(),
                    spare_events: Vec::new(),
                    stats: StatsBook::default(),
                    ring: EventRing::new(ring_capacity),
                    last_ticks: 0,
                    provenance: ProvenanceTables::default(),
                    step: 0,
                    steps: Vec::new(),
                    large_lookups: 0,
                    memory_limit: None,
                    freed: FreedOwners::default(),
                    violations: Vec::new(),
                }),
                config,
            }),
        }
    }

    /// The backend this allocator draws from.
    pub fn backend(&self) -> &B {
        &self.shared.backend
    }

    /// The settings in force.
    pub fn config(&self) -> &AllocatorConfig {
        &self.shared.config
    }

    /// Device ordinal.
    pub fn device(&self) -> u32 {
        self.shared.device
    }

    /// Allocates `size` bytes on the default stream.
    #[track_caller]
    pub fn alloc(&self, size: u64) -> Result<crate::DeviceBuffer<B>, AllocError> {
        self.alloc_from(size, StreamId::DEFAULT, None, Location::caller())
    }

    /// Allocates `size` bytes for use on `stream`.
    #[track_caller]
    pub fn alloc_on(
        &self,
        size: u64,
        stream: StreamId,
    ) -> Result<crate::DeviceBuffer<B>, AllocError> {
        self.alloc_from(size, stream, None, Location::caller())
    }

    /// A handle whose allocations carry `tag` (`alloc.tagged("loss").alloc(n)`).
    pub fn tagged<'a>(&'a self, tag: &'a str) -> Tagged<'a, B> {
        Tagged {
            allocator: self,
            tag,
        }
    }

    pub(crate) fn alloc_from(
        &self,
        size: u64,
        stream: StreamId,
        tag: Option<&str>,
        location: &'static Location<'static>,
    ) -> Result<crate::DeviceBuffer<B>, AllocError> {
        let (addr, block) = self.allocate(size, stream, Origin { location, tag }, true)?;
        Ok(crate::DeviceBuffer::new(
            self.clone(),
            addr,
            size,
            stream,
            block,
        ))
    }

    /// Allocates through the raw pointer API; free it with [`CachingAllocator::free_ptr`].
    #[track_caller]
    pub fn alloc_ptr(&self, size: u64, stream: StreamId) -> Result<u64, AllocError> {
        self.allocate(
            size,
            stream,
            Origin {
                location: Location::caller(),
                tag: None,
            },
            false,
        )
        .map(|(addr, _)| addr)
    }

    /// Frees a pointer from [`CachingAllocator::alloc_ptr`] (or a leaked buffer's address).
    pub fn free_ptr(&self, addr: u64) -> Result<(), AllocError> {
        self.deallocate(addr)
    }

    /// Frees a pointer, checking that the caller means this allocator's device.
    pub fn free_ptr_on(&self, addr: u64, device: u32) -> Result<(), AllocError> {
        if device != self.shared.device {
            return Err(AllocError::WrongDevice {
                expected: self.shared.device,
                found: device,
            });
        }
        self.deallocate(addr)
    }

    /// Allocates through the handle API: the returned [`BlockHandle`] frees the block by id,
    /// with no address lookup, through [`CachingAllocator::free_block`].
    #[track_caller]
    pub fn alloc_block(&self, size: u64, stream: StreamId) -> Result<BlockHandle, AllocError> {
        let origin = Origin {
            location: Location::caller(),
            tag: None,
        };
        self.allocate(size, stream, origin, true)
            .map(|found| self.handle(found))
    }

    /// The handle of an allocated block (address and block id).
    #[inline]
    fn handle(&self, (addr, block): (u64, u32)) -> BlockHandle {
        BlockHandle {
            addr,
            block,
            allocator: self.shared.handle_tag,
        }
    }

    /// Refuses a handle that another allocator handed out.
    #[inline]
    fn check_handle(&self, handle: &BlockHandle) -> Result<(), AllocError> {
        if handle.allocator == self.shared.handle_tag {
            Ok(())
        } else {
            Err(AllocError::UnknownPointer { addr: handle.addr })
        }
    }

    /// Frees a block from [`CachingAllocator::alloc_block`].
    pub fn free_block(&self, handle: BlockHandle) -> Result<(), AllocError> {
        self.check_handle(&handle)?;
        self.deallocate_buffer(handle.block, handle.addr)
    }

    /// Takes the device lock for a run of operations, as the single-owner allocators
    /// (`&mut self` APIs) work: each operation through the guard skips the lock round-trip.
    /// Other threads using this device wait until the guard drops, so hold it only for work
    /// that does not wait on them (replaying a trace, a batch of frees). While it lives, this
    /// thread must use the allocator only through the guard: any other call on the same
    /// allocator (`stats()`, `alloc()`, dropping one of its `DeviceBuffer`s) panics with a
    /// message instead of deadlocking.
    pub fn exclusive(&self) -> Exclusive<'_, B> {
        let state = self.shared.lock();
        let me = provenance::thread_number() as u64;
        self.shared.exclusive_thread.store(me, Ordering::Relaxed);
        Exclusive {
            allocator: self,
            state,
        }
    }

    /// Opens a named scope on this thread; allocations until the guard drops carry it.
    pub fn scope(&self, name: &str) -> ScopeGuard {
        let owner = self.shared.id;
        let parent = provenance::current_scope(owner);
        let id = {
            let mut state = self.shared.lock();
            let path = if parent == NIL {
                name.to_string()
            } else {
                format!(
                    "{}/{name}",
                    state.provenance.scopes.strings[parent as usize]
                )
            };
            state.provenance.scopes.intern(&path)
        };
        provenance::push_scope(owner, id);
        ScopeGuard {
            owner,
            id,
            _not_send: std::marker::PhantomData,
        }
    }

    fn provenance_for(
        &self,
        state: &mut State,
        origin: &Origin<'_>,
        backtrace: Option<Vec<usize>>,
    ) -> u32 {
        let config = &self.shared.config;
        if !config.record_sites && !config.record_events {
            return NIL;
        }
        let tag = origin
            .tag
            .map(|t| state.provenance.tags.intern(t))
            .unwrap_or(NIL);
        let scope = provenance::current_scope(self.shared.id);
        let thread = provenance::thread_number();
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

    fn wants_backtrace(&self) -> bool {
        match self.shared.config.backtraces {
            BacktraceMode::Off => false,
            BacktraceMode::All => true,
            BacktraceMode::Sampled(n) => provenance::sample_backtrace(n),
        }
    }

    /// Allocates a block; `for_buffer` marks it as owned by a `DeviceBuffer` (freed by id)
    /// instead of entering it in the raw-pointer map. Returns the address and block id.
    pub(crate) fn allocate(
        &self,
        size: u64,
        stream: StreamId,
        origin: Origin<'_>,
        for_buffer: bool,
    ) -> Result<(u64, u32), AllocError> {
        if size == 0 {
            return Ok((0, NIL));
        }
        let backtrace = self.backtrace_for_request();
        let mut guard = self.shared.lock();
        self.allocate_in(&mut guard, size, stream, origin, backtrace, for_buffer)
    }

    /// A backtrace for the next allocation, when call sites are on and sampling picks it.
    #[inline]
    fn backtrace_for_request(&self) -> Option<Vec<usize>> {
        if self.shared.config.record_sites && self.wants_backtrace() {
            Some(provenance::capture_backtrace())
        } else {
            None
        }
    }

    /// The body of [`CachingAllocator::allocate`] under the device lock (`size` > 0).
    #[inline]
    fn allocate_in(
        &self,
        state: &mut State,
        size: u64,
        stream: StreamId,
        origin: Origin<'_>,
        backtrace: Option<Vec<usize>>,
        for_buffer: bool,
    ) -> Result<(u64, u32), AllocError> {
        let shared = &*self.shared;
        let config = &shared.config;
        if !state.outstanding.is_empty() {
            self.process_events(state);
        }
        let padded = size.saturating_add(config.guard_bytes);
        // `round_size`, with the power-of-two rounding's threshold decided at construction.
        let rounded = if padded > shared.round_power2_above {
            round_size(padded, config.roundup_power2_divisions)
        } else {
            round_size(padded, 0)
        };
        let pool = pool_for(rounded);
        state.large_lookups += (pool == Pool::Large) as u64;
        let found = match self.get_free_block(state, pool, stream, rounded) {
            Some(found) => found,
            None => match self.grow(state, pool, stream, rounded, size, &origin)? {
                Some(found) => found,
                None => unreachable!("grow returns a block or an error"),
            },
        };
        let provenance = if shared.tracking {
            self.provenance_for(state, &origin, backtrace)
        } else {
            NIL
        };
        let id = found.block;
        let (addr, block_size) =
            self.use_block(state, found, rounded, size, provenance, for_buffer);
        if shared.checks {
            let block = *state.blocks.get(id);
            self.check_reused(state, &block, size);
        }
        if config.record_events {
            state.record(
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

    /// The owner recorded for a provenance id and step.
    fn owner(state: &State, provenance: u32, step: u32) -> Owner {
        let p = state.provenance.get(provenance);
        let opt = |id: u32| (id != NIL).then_some(id);
        Owner {
            site: p.and_then(|p| opt(p.site)),
            tag: p.and_then(|p| opt(p.tag)),
            step: step as u64,
        }
    }

    /// Debug checks when a block is handed out: the poison over the whole block must be
    /// intact; then the guard bytes after the request are laid down.
    #[cold]
    #[inline(never)]
    fn check_reused(&self, state: &mut State, block: &BlockMeta, requested: u64) {
        let backend = &self.shared.backend;
        let config = &self.shared.config;
        if config.debug {
            if let Some((at, bytes)) =
                debug::first_difference(backend, block.addr, block.size, debug::POISON)
            {
                let previous = state
                    .freed
                    .owner_of(at)
                    .map(|r| Self::owner(state, r.provenance, r.step));
                let new_owner = Self::owner(state, block.provenance, block.step);
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
    fn check_guard(&self, state: &mut State, id: u32) {
        let b = *state.blocks.get(id);
        let guard_at = b.addr + b.requested;
        if let Some((at, bytes)) = debug::first_difference(
            &self.shared.backend,
            guard_at,
            self.shared.config.guard_bytes,
            debug::GUARD,
        ) {
            let owner = Self::owner(state, b.provenance, b.step);
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

    /// Use-after-free and overflow violations found so far by the `debug` and `guard_bytes`
    /// checks.
    pub fn violations(&self) -> Vec<Violation> {
        self.shared.lock().violations.clone()
    }

    /// PyTorch's `get_free_block`: the smallest free block on the same stream that fits.
    #[inline]
    fn get_free_block(
        &self,
        state: &mut State,
        pool: Pool,
        stream: StreamId,
        rounded: u64,
    ) -> Option<Found> {
        let max_split = self.shared.max_split;
        let list = state.find_list(stream, pool)?;
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
        &self,
        state: &mut State,
        pool: Pool,
        stream: StreamId,
        rounded: u64,
        requested: u64,
        origin: &Origin<'_>,
    ) -> Result<Option<Found>, AllocError> {
        if rounded > MAX_REQUEST {
            return Err(self.out_of_memory(state, stream, rounded, requested, origin));
        }
        if let Some(threshold) = self.shared.config.garbage_collection_threshold {
            self.garbage_collect(state, threshold);
        }
        if let Some(found) = self.new_block(state, pool, stream, rounded) {
            return Ok(Some(found));
        }
        if self.release_available_cached_blocks(state, pool, stream, rounded) {
            if let Some(found) = self.new_block(state, pool, stream, rounded) {
                return Ok(Some(found));
            }
        }
        self.release_cached_blocks(state);
        state.stats.num_alloc_retries += 1;
        if let Some(found) = self.new_block(state, pool, stream, rounded) {
            return Ok(Some(found));
        }
        Err(self.out_of_memory(state, stream, rounded, requested, origin))
    }

    #[cold]
    #[inline(never)]
    fn out_of_memory(
        &self,
        state: &mut State,
        stream: StreamId,
        rounded: u64,
        requested: u64,
        origin: &Origin<'_>,
    ) -> AllocError {
        let shared = &*self.shared;
        state.stats.num_ooms += 1;
        let info = shared.backend.mem_info();
        let provenance = self.provenance_for(state, origin, None);
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
        let cached = reserved.saturating_sub(allocated);
        let hint = crate::oom::is_fragmentation(rounded, cached, info.free).then(|| {
            format!(
                "{} is reserved but unallocated: the memory is there, in pieces (fragmentation); try VRAMSCOPE_ALLOC_CONF={} to reduce it.",
                format_bytes(cached),
                crate::oom::fragmentation_setting(&shared.config, rounded)
            )
        });
        AllocError::OutOfMemory(Box::new(OomReport {
            requested,
            rounded,
            device: shared.device,
            capacity: info.total,
            device_free: info.free,
            allocated,
            reserved,
            top_sites: self.top_sites(state, 5),
            hint,
        }))
    }

    /// Live bytes and blocks by call site, largest first.
    fn top_sites(&self, state: &State, limit: usize) -> Vec<(String, u64, u64)> {
        let mut by_site: FxHashMap<u32, (u64, u64)> = FxHashMap::default();
        for (_, b) in state.blocks.iter().filter(|(_, b)| b.is_allocated()) {
            let site = state
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
                let label = state
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

    /// Gets a new block from the device: a raw segment, or pages mapped into an expandable one.
    fn new_block(
        &self,
        state: &mut State,
        pool: Pool,
        stream: StreamId,
        rounded: u64,
    ) -> Option<Found> {
        if self.shared.config.uses_expandable_segments() {
            // PyTorch's `alloc_block` checks its cap before it looks for room, against the size
            // a plain segment for the request would have, whatever needs mapping (the
            // `compact` policy maps only what it needs, and checks only that).
            let reserved = state.stats.reserved_bytes.all().current;
            if self.shared.config.policy == Policy::Pytorch
                && reserved.saturating_add(segment_size_for(rounded)) > self.cap(state)
            {
                return None;
            }
            return self.grow_expandable(state, pool, stream, rounded);
        }
        let shared = &*self.shared;
        let size = segment_size_for(rounded);
        if state.over_memory_limit(size) {
            return None;
        }
        let addr = shared.backend.malloc(size).ok()?;
        let block = self.register_segment(state, addr, size, stream, pool);
        Some(Found {
            block,
            uncounted: false,
        })
    }

    /// Books a new raw segment of `size` bytes at `addr` (poisoned with `debug`): one block
    /// spanning it, not yet in a free list, whose id is returned; statistics and the
    /// `segment_alloc` event.
    fn register_segment(
        &self,
        state: &mut State,
        addr: u64,
        size: u64,
        stream: StreamId,
        pool: Pool,
    ) -> u32 {
        let shared = &*self.shared;
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

    /// PyTorch's `try_allocate_expandable_block`: room for `rounded` bytes in the (stream,
    /// pool) expandable segment, mapping pages where it is unmapped. The room starts at the
    /// lowest unmapped range (a hole a release left, else the unmapped rest at the segment's
    /// end), or at the free block just before it, and runs on over free and unmapped ranges;
    /// the unmapped parts of it are mapped, in pages, and merge with the free blocks around.
    fn grow_expandable(
        &self,
        state: &mut State,
        pool: Pool,
        stream: StreamId,
        rounded: u64,
    ) -> Option<Found> {
        let page = self.expandable_page(pool);
        // Every expandable segment of this stream and pool is tried, lowest address first (a
        // segment's unmapped ranges come in address order in PyTorch's search); a new one is
        // reserved when none has room.
        let mut segments: Vec<u32> = state
            .expandable
            .iter()
            .filter(|(s, p, _)| *s == stream && *p == pool)
            .map(|(_, _, id)| *id)
            .collect();
        segments.sort_unstable_by_key(|&id| state.segments.get(id).addr);
        let found = segments
            .iter()
            .find_map(|&id| state.expandable_room(id, rounded).map(|start| (id, start)));
        let (segment, mut candidate) = match found {
            Some(found) => found,
            None => {
                // Like PyTorch, address space for 9/8 of the device's memory: pages unmapped in
                // the middle leave holes that the end must make up for.
                let capacity = self.shared.capacity;
                let reserve = capacity
                    .saturating_add(capacity / 8)
                    .max(page)
                    .div_ceil(page)
                    .saturating_mul(page);
                if rounded > reserve {
                    return None;
                }
                let addr = self.shared.backend.reserve_address_range(reserve).ok()?;
                let list = state.list_index(stream, pool);
                let id = state.segments.insert(SegmentMeta {
                    addr,
                    size: 0,
                    reserved: reserve,
                    holes: 0,
                    stream,
                    pool,
                    list,
                    expandable: true,
                    first: NIL,
                    last: NIL,
                    idle_since: state.large_lookups,
                });
                state.segments_by_addr.insert(addr, id);
                // PyTorch leaves expandable segments out of its `segment` statistic.
                state.expandable.push((stream, pool, id));
                (id, state.expandable_room(id, rounded)?)
            }
        };
        if candidate == NIL {
            // The room starts in the unmapped rest at the end.
            candidate = self.map_expandable_end(state, segment, rounded)?;
        } else if state.blocks.get(candidate).flags & UNMAPPED != 0 {
            let want = state.blocks.get(candidate).size.min(rounded);
            candidate = self.map_expandable_hole(state, candidate, want)?;
        }
        // Invariant: `candidate` is free, and what follows it is unmapped.
        loop {
            let have = state.blocks.get(candidate).size;
            if have >= rounded {
                break;
            }
            let next = state.blocks.get(candidate).next;
            candidate = if next == NIL {
                self.map_expandable_end(state, segment, rounded - have)?
            } else {
                let want = state.blocks.get(next).size.min(rounded - have);
                self.map_expandable_hole(state, next, want)?
            };
        }
        state.remove_free(candidate);
        Some(Found {
            block: candidate,
            uncounted: false,
        })
    }

    /// Maps the pages that hold `want` bytes at the start of the unmapped block `hole`; they
    /// become a free block, merged with free neighbours. Returns that free block.
    fn map_expandable_hole(&self, state: &mut State, hole: u32, want: u64) -> Option<u32> {
        let h = *state.blocks.get(hole);
        let page = self.expandable_page(h.pool);
        let length = want.div_ceil(page).saturating_mul(page).min(h.size);
        self.map_pages(state, h.segment, h.addr, length)?;
        state.segments.get_mut(h.segment).holes -= length;
        let mapped = if length == h.size {
            state.blocks.get_mut(hole).flags = 0;
            hole
        } else {
            // The mapped pages become a block of their own before the rest of the hole.
            let rest = state.blocks.get_mut(hole);
            rest.addr += length;
            rest.size -= length;
            state.insert_before(
                hole,
                BlockMeta {
                    size: length,
                    flags: 0,
                    ..h
                },
            )
        };
        Some(state.merge_into_free(mapped))
    }

    /// Maps pages for `want` more bytes at the end of expandable `segment`; they join its last
    /// block if that is free, or become a free block of their own. Returns that free block.
    fn map_expandable_end(&self, state: &mut State, segment: u32, want: u64) -> Option<u32> {
        let seg = *state.segments.get(segment);
        let page = self.expandable_page(seg.pool);
        let length = want.div_ceil(page).saturating_mul(page);
        if length > seg.reserved - seg.size {
            return None;
        }
        let at = seg.addr + seg.size;
        self.map_pages(state, segment, at, length)?;
        state.segments.get_mut(segment).size += length;
        let meta = BlockMeta::new_free(at, length, segment, seg.list, seg.pool);
        // After the last block, or as the only block of an empty segment.
        let id = state.insert_between(seg.last, NIL, meta);
        Some(state.merge_into_free(id))
    }

    /// Maps `[at, at + length)` of expandable `segment` on the device, with its statistics and
    /// event (one device allocation, as PyTorch counts a map).
    fn map_pages(&self, state: &mut State, segment: u32, at: u64, length: u64) -> Option<()> {
        let shared = &*self.shared;
        if shared.config.policy == Policy::Compact && state.over_memory_limit(length) {
            return None;
        }
        shared.backend.map(at, length).ok()?;
        if shared.config.debug {
            debug::fill(&shared.backend, at, length, debug::POISON);
        }
        let seg = *state.segments.get(segment);
        state.stats.reserved_bytes.increase(seg.pool, length);
        state.stats.num_device_alloc += 1;
        if shared.config.record_events {
            state.record(
                &shared.clock,
                EventKind::SegmentMap,
                RawEventParts {
                    addr: at,
                    size: length,
                    stream: seg.stream.0,
                    ..RawEventParts::default()
                },
            );
        }
        Some(())
    }

    /// [`State::counts_inactive_split`], without looking at the segment when the settings
    /// make no segment expandable.
    #[inline]
    fn counts_inactive_split(&self, state: &State, segment: u32) -> bool {
        !self.shared.expandable_segments || state.counts_inactive_split(segment)
    }

    /// PyTorch's `should_split`.
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
        &self,
        state: &mut State,
        found: Found,
        rounded: u64,
        requested: u64,
        provenance: u32,
        for_buffer: bool,
    ) -> (u64, u64) {
        let id = found.block;
        let b = *state.blocks.get(id);
        let pool = b.pool;
        // The net change of inactive split blocks, applied once (PyTorch's
        // `alloc_found_block`): a split free block leaves, its split remainder comes back.
        let (mut split_blocks, mut split_bytes) = (0i64, 0i64);
        if found.uncounted && b.is_split() {
            split_blocks -= 1;
            split_bytes -= b.size as i64;
        }
        if self.should_split(pool, b.size, rounded) {
            let remainder = state.split_off(id, rounded);
            state.index_free(remainder);
            split_blocks += 1;
            split_bytes += (b.size - rounded) as i64;
        }
        if self.counts_inactive_split(state, b.segment) {
            state.stats.inactive_split.apply(pool, split_blocks);
            state.stats.inactive_split_bytes.apply(pool, split_bytes);
        }
        let step = state.step.min(u32::MAX as u64) as u32;
        self.mark_allocated(state, id, pool, requested, provenance, step, for_buffer)
    }

    /// Marks a block (out of any free list) as handed out, with its provenance, and counts it;
    /// returns its address and size.
    #[allow(clippy::too_many_arguments)]
    #[inline]
    fn mark_allocated(
        &self,
        state: &mut State,
        id: u32,
        pool: Pool,
        requested: u64,
        provenance: u32,
        step: u32,
        for_buffer: bool,
    ) -> (u64, u64) {
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

    /// Frees a block of the raw-pointer API by address.
    pub(crate) fn deallocate(&self, addr: u64) -> Result<(), AllocError> {
        if addr == 0 {
            return Ok(());
        }
        let mut guard = self.shared.lock();
        self.deallocate_in(&mut guard, addr)
    }

    /// The body of [`CachingAllocator::deallocate`] under the device lock (`addr` ≠ 0).
    #[inline]
    fn deallocate_in(&self, state: &mut State, addr: u64) -> Result<(), AllocError> {
        let Some(id) = state.live.remove(&addr) else {
            return Err(self.classify_bad_free(state, addr));
        };
        self.release_allocated(state, id)
    }

    /// Frees the block a `DeviceBuffer` owns, by id; `addr` guards against a stale id.
    pub(crate) fn deallocate_buffer(&self, block: u32, addr: u64) -> Result<(), AllocError> {
        if addr == 0 {
            return Ok(());
        }
        let mut guard = self.shared.lock();
        self.deallocate_owned_in(&mut guard, block, addr)
    }

    /// Frees a block owned by a `DeviceBuffer` or a [`BlockHandle`], under the device lock.
    #[inline]
    fn deallocate_owned_in(
        &self,
        state: &mut State,
        block: u32,
        addr: u64,
    ) -> Result<(), AllocError> {
        let owned = (block as usize) < state.blocks.slots.len() && {
            let b = &state.blocks.slots[block as usize];
            b.addr == addr && b.flags == ALLOCATED | BUFFER_OWNED
        };
        if !owned {
            return Err(self.classify_bad_free(state, addr));
        }
        self.release_allocated(state, block)
    }

    /// Turns a buffer-owned block into a raw-pointer block (`DeviceBuffer::into_raw`).
    pub(crate) fn disown_buffer(&self, block: u32, addr: u64) {
        if addr == 0 {
            return;
        }
        let mut state = self.shared.lock();
        if (block as usize) < state.blocks.slots.len()
            && state.blocks.slots[block as usize].flags == ALLOCATED | BUFFER_OWNED
        {
            state.blocks.get_mut(block).flags = ALLOCATED;
            state.live.insert(addr, block);
        }
    }

    /// The common part of a free: statistics, the event, deferral or return to the cache.
    #[inline]
    fn release_allocated(&self, state: &mut State, id: u32) -> Result<(), AllocError> {
        let shared = &*self.shared;
        if shared.config.guard_bytes > 0 {
            self.check_guard(state, id);
        }
        // The block's flags change once it is deferred or back in the cache.
        let b = *state.blocks.get(id);
        let (addr, pool) = (b.addr, b.pool);
        let stats = &mut state.stats;
        stats.count_free(pool, b.size);
        if b.size >= shared.max_split {
            stats.oversize_allocations.decrease(1);
        }
        if shared.config.record_events {
            state.record(
                &shared.clock,
                EventKind::FreeRequested,
                RawEventParts {
                    addr,
                    size: b.size,
                    requested: b.requested,
                    stream: state.stream_of(id).0,
                    provenance: b.provenance,
                },
            );
        }
        if !state.stream_uses.is_empty() {
            if let Some(streams) = state.stream_uses.remove(&id) {
                if self.defer_free(state, id, &streams) {
                    return Ok(());
                }
            }
        }
        self.return_to_cache(state, id, b, true);
        Ok(())
    }

    /// Records an event on each stream that used the block; the block waits for all of them.
    #[cold]
    #[inline(never)]
    fn defer_free(&self, state: &mut State, id: u32, streams: &[StreamId]) -> bool {
        let backend = &self.shared.backend;
        let mut count = 0;
        for &stream in streams {
            let event = match state.spare_events.pop() {
                Some(e) => Ok(e),
                None => backend.create_event(),
            };
            let Ok(event) = event else { continue };
            if backend.record_event(event, stream).is_err() {
                state.spare_events.push(event);
                continue;
            }
            state.outstanding.push_back((event, id));
            count += 1;
        }
        if count == 0 {
            return false;
        }
        let block = state.blocks.get_mut(id);
        block.flags = PENDING_FREE;
        let (pool, size) = (block.pool, block.size);
        state.stats.count_pending(pool, size);
        state.pending_events.insert(id, count);
        true
    }

    /// Frees blocks whose stream events have completed, in the order they were recorded.
    #[cold]
    #[inline(never)]
    fn process_events(&self, state: &mut State) {
        let backend = &self.shared.backend;
        while let Some(&(event, block)) = state.outstanding.front() {
            if !backend.query_event(event).unwrap_or(true) {
                break;
            }
            state.outstanding.pop_front();
            state.spare_events.push(event);
            self.event_done(state, block);
        }
    }

    fn event_done(&self, state: &mut State, block: u32) {
        let remaining = state
            .pending_events
            .get_mut(&block)
            .map(|c| {
                *c -= 1;
                *c
            })
            .unwrap_or(0);
        if remaining == 0 {
            state.pending_events.remove(&block);
            let original = *state.blocks.get(block);
            state.stats.count_pending_done(original.pool, original.size);
            self.return_to_cache(state, block, original, false);
        }
    }

    /// Waits for every outstanding stream event and frees the blocks behind them.
    fn synchronize_and_free_events(&self, state: &mut State) {
        if state.outstanding.is_empty() {
            return;
        }
        state.stats.num_sync_all_streams += 1;
        let _ = self.shared.backend.synchronize();
        while let Some((event, block)) = state.outstanding.pop_front() {
            state.spare_events.push(event);
            self.event_done(state, block);
        }
    }

    /// PyTorch's `free_block`: merge with free neighbours in the segment, return to the pool.
    /// `original` is the block as the program freed it (read when the free was requested, or
    /// when its stream events completed); `immediate` says the free was requested in this same
    /// operation (not deferred on stream events), so its completion shares the request's time
    /// stamp.
    #[inline]
    fn return_to_cache(&self, state: &mut State, id: u32, original: BlockMeta, immediate: bool) {
        let shared = &*self.shared;
        let pool = original.pool;
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
        if self.counts_inactive_split(state, original.segment) {
            state.stats.inactive_split.apply(pool, split_blocks);
            state.stats.inactive_split_bytes.apply(pool, split_bytes);
        }
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
        if shared.config.record_events {
            let parts = RawEventParts {
                addr: original.addr,
                size: original.size,
                requested: original.requested,
                stream: state.stream_of(id).0,
                provenance: original.provenance,
            };
            if immediate {
                // The free was requested in this same operation, which just read the clock.
                state.record_at(state.last_ticks, EventKind::FreeCompleted, parts);
            } else {
                state.record(&shared.clock, EventKind::FreeCompleted, parts);
            }
        }
    }

    /// Releases one whole free segment back to the device.
    fn release_segment(&self, state: &mut State, segment: u32) {
        let shared = &*self.shared;
        let seg = *state.segments.get(segment);
        debug_assert!(!seg.expandable && seg.first == seg.last);
        let block = seg.first;
        state.remove_free(block);
        state.blocks.remove(block);
        state.segments.remove(segment);
        state.segments_by_addr.remove(&seg.addr);
        if shared.backend.free(seg.addr).is_err() {
            // The device refused the free; the memory is lost to the device but not to our
            // books, which must reflect what the program can use.
        }
        state.stats.segment.decrease(seg.pool, 1);
        state.stats.reserved_bytes.decrease(seg.pool, seg.size);
        state.stats.num_device_free += 1;
        if let Some(max_split) = shared.config.max_split_size {
            if seg.size >= max_split {
                state.stats.oversize_segments.decrease(1);
            }
        }
        if shared.config.record_events {
            state.record(
                &shared.clock,
                EventKind::SegmentFree,
                RawEventParts {
                    addr: seg.addr,
                    size: seg.size,
                    stream: seg.stream.0,
                    ..RawEventParts::default()
                },
            );
        }
    }

    /// The unit in which an expandable segment of `pool` maps and unmaps memory. PyTorch maps
    /// in its segment sizes, 2 MiB pages in the small pool and 20 MiB in the large (rounded up
    /// to the device's mapping granularity here); the `compact` policy maps in the device's
    /// granularity.
    fn expandable_page(&self, pool: Pool) -> u64 {
        let granularity = self.shared.backend.vm_granularity().max(1);
        let page = match (self.shared.config.policy, pool) {
            (Policy::Compact, _) => return granularity,
            (Policy::Pytorch, Pool::Small) => SMALL_BUFFER,
            (Policy::Pytorch, Pool::Large) => LARGE_BUFFER,
        };
        page.div_ceil(granularity) * granularity
    }

    /// Releases expandable `segment` when nothing of it is left mapped (PyTorch's
    /// `release_expandable_segment`, after an unmap leaves a lone unmapped block).
    fn release_if_unmapped(&self, state: &mut State, segment: u32) {
        let seg = *state.segments.get(segment);
        if seg.first == NIL {
            let _ = self
                .shared
                .backend
                .release_address_range(seg.addr, seg.reserved);
            state.segments.remove(segment);
            state.segments_by_addr.remove(&seg.addr);
            state.expandable.retain(|(_, _, id)| *id != segment);
        }
    }

    /// Unmaps the whole pages inside the free block `id` of expandable `segment`; returns the
    /// bytes unmapped (0 when the block holds no whole page).
    fn unmap_block(&self, state: &mut State, segment: u32, id: u32) -> u64 {
        let shared = &*self.shared;
        let seg = *state.segments.get(segment);
        let page = self.expandable_page(seg.pool);
        let b = *state.blocks.get(id);
        // Pages are counted from the segment's base.
        let low = seg.addr + (b.addr - seg.addr).div_ceil(page) * page;
        let high = seg.addr + (b.addr + b.size - seg.addr) / page * page;
        if high <= low || shared.backend.unmap(low, high - low).is_err() {
            return 0;
        }
        let length = high - low;
        state.remove_free(id);
        // The free parts of pages on either side stay free blocks.
        if low > b.addr {
            let before = state.insert_before(
                id,
                BlockMeta {
                    size: low - b.addr,
                    ..b
                },
            );
            state.insert_free(before);
        }
        if high < b.addr + b.size {
            let after = state.insert_after(
                id,
                BlockMeta {
                    addr: high,
                    size: b.addr + b.size - high,
                    ..b
                },
            );
            state.insert_free(after);
        }
        let hole = state.blocks.get_mut(id);
        hole.addr = low;
        hole.size = length;
        hole.flags = UNMAPPED;
        hole.requested = 0;
        hole.provenance = NIL;
        state.segments.get_mut(segment).holes += length;
        let prev = state.blocks.get(id).prev;
        if prev != NIL && state.blocks.get(prev).flags & UNMAPPED != 0 {
            state.absorb_unmapped(id, prev);
        }
        let next = state.blocks.get(id).next;
        if next != NIL && state.blocks.get(next).flags & UNMAPPED != 0 {
            state.absorb_unmapped(id, next);
        }
        let hole = *state.blocks.get(id);
        if hole.next == NIL {
            // An unmapped end is the segment's unmapped rest, not a block.
            if hole.prev != NIL {
                state.blocks.get_mut(hole.prev).next = NIL;
            } else {
                state.segments.get_mut(segment).first = NIL;
            }
            let s = state.segments.get_mut(segment);
            s.last = hole.prev;
            s.size -= hole.size;
            s.holes -= hole.size;
            state.blocks.remove(id);
        }
        state.stats.reserved_bytes.decrease(seg.pool, length);
        state.stats.num_device_free += 1;
        if shared.config.record_events {
            state.record(
                &shared.clock,
                EventKind::SegmentUnmap,
                RawEventParts {
                    addr: low,
                    size: length,
                    stream: seg.stream.0,
                    ..RawEventParts::default()
                },
            );
        }
        length
    }

    /// PyTorch's `release_available_cached_blocks`: with `max_split_size` set, frees oversize
    /// cached segments on the stream, the smallest that covers the request or else the largest
    /// ones until enough is freed.
    fn release_available_cached_blocks(
        &self,
        state: &mut State,
        pool: Pool,
        stream: StreamId,
        rounded: u64,
    ) -> bool {
        let Some(max_split) = self.shared.config.max_split_size else {
            return false;
        };
        let key_size = rounded.max(max_split);
        let Some(list) = state.find_list(stream, pool) else {
            return false;
        };
        let candidates: Vec<(u64, u32)> = state.free_lists[list as usize]
            .blocks
            .all_from(free_key(max_split, 0))
            .into_iter()
            .map(|(key, id)| ((key >> 64) as u64, id))
            .collect();
        let whole = |state: &State, id: u32| {
            let b = state.blocks.get(id);
            !b.is_split() && !state.segments.get(b.segment).expandable
        };
        if let Some(&(_, id)) = candidates.iter().find(|(size, _)| *size >= key_size) {
            if whole(state, id) {
                let segment = state.blocks.get(id).segment;
                self.release_segment(state, segment);
                return true;
            }
            return false;
        }
        let mut released = 0;
        for &(size, id) in candidates.iter().rev() {
            if released >= key_size {
                break;
            }
            if whole(state, id) {
                let segment = state.blocks.get(id).segment;
                self.release_segment(state, segment);
                released += size;
            }
        }
        released >= key_size
    }

    /// PyTorch's `release_cached_blocks`: wait for pending frees, then, pool by pool (large,
    /// then small), go through the free blocks in (stream, size, address) order, releasing each
    /// plain segment that is one free block as it comes and then unmapping the whole free pages
    /// of each free block of an expandable segment (`release_blocks`), so that the device calls
    /// come in PyTorch's order. Returns the bytes released.
    fn release_cached_blocks(&self, state: &mut State) -> u64 {
        self.synchronize_and_free_events(state);
        let before = state.stats.reserved_bytes.all().current;
        for pool in [Pool::Large, Pool::Small] {
            let mut lists: Vec<usize> = (0..state.free_lists.len())
                .filter(|&i| state.free_lists[i].pool == pool)
                .collect();
            lists.sort_by_key(|&i| state.free_lists[i].stream.0);
            let mut whole = Vec::new();
            let mut to_unmap = Vec::new();
            for list in lists {
                for (_, id) in state.free_lists[list].blocks.all_from(0) {
                    let b = state.blocks.get(id);
                    if state.segments.get(b.segment).expandable {
                        to_unmap.push(id);
                    } else if !b.is_split() {
                        whole.push(b.segment);
                    }
                }
            }
            for segment in whole {
                self.release_segment(state, segment);
            }
            for id in to_unmap {
                let segment = state.blocks.get(id).segment;
                if self.unmap_block(state, segment, id) > 0 {
                    self.release_if_unmapped(state, segment);
                }
            }
        }
        // An expandable segment whose first map failed holds no block: only its address
        // space, which goes back too.
        let empty: Vec<u32> = state
            .expandable
            .iter()
            .map(|&(_, _, id)| id)
            .filter(|&id| state.segments.get(id).first == NIL)
            .collect();
        for segment in empty {
            self.release_if_unmapped(state, segment);
        }
        before - state.stats.reserved_bytes.all().current
    }

    /// PyTorch's `garbage_collect_cached_blocks`: once reserved memory is over `threshold` of
    /// the capacity, frees the whole cached segments of the large pool that have been idle for
    /// at least the average idle age (counted in large-pool lookups), and repeats with the
    /// average of those left until the excess is reclaimed or nothing more can be freed. A pass
    /// frees every segment at or above its average, past the target, so that collection is not
    /// triggered again at once. Expandable segments take no part: in PyTorch their free block
    /// borders the unmapped rest, so it counts as split.
    fn garbage_collect(&self, state: &mut State, threshold: f64) {
        let limit = (self.cap(state) as f64 * threshold) as u64;
        let reserved = state.stats.reserved_bytes.all().current;
        if reserved <= limit {
            return;
        }
        let target = reserved - limit;
        let now = state.large_lookups;
        // (age, segment) of every wholly free segment of the large pool.
        let mut idle: Vec<(u64, u32)> = state
            .segments
            .iter()
            .filter(|(_, s)| s.pool == Pool::Large && !s.expandable && state.is_idle(s))
            .map(|(id, s)| (now - s.idle_since, id))
            .collect();
        // In PyTorch's free-block order, (stream, size, address), so that the frees come in
        // its order.
        idle.sort_unstable_by_key(|&(_, id)| {
            let s = state.segments.get(id);
            (s.stream.0, s.size, s.addr)
        });
        let mut total_age: u64 = idle.iter().map(|&(age, _)| age).sum();
        let mut candidates = idle.len() as u64;
        let mut reclaimed = 0;
        let mut freed_one = true;
        while reclaimed < target && freed_one && candidates > 0 {
            let average = total_age as f64 / candidates as f64;
            freed_one = false;
            let mut kept = Vec::with_capacity(idle.len());
            for (age, segment) in idle {
                if age as f64 >= average {
                    freed_one = true;
                    reclaimed += state.segments.get(segment).size;
                    total_age -= age;
                    candidates -= 1;
                    self.release_segment(state, segment);
                } else {
                    kept.push((age, segment));
                }
            }
            idle = kept;
        }
    }

    #[cold]
    #[inline(never)]
    fn classify_bad_free(&self, state: &State, addr: u64) -> AllocError {
        if let Some((_, &segment)) = state.segments_by_addr.range(..=addr).next_back() {
            let seg = state.segments.get(segment);
            if addr < seg.addr + seg.size {
                let mut id = seg.first;
                while id != NIL {
                    let b = state.blocks.get(id);
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

    /// Recreates a segment as it stood at some moment of another run: one raw allocation of
    /// `size` bytes for `stream` in `pool`, with a live block of `(offset, size, requested)` at
    /// each given offset and free blocks in between. Returns the segment's new base address; a
    /// block's new address is that base plus its offset. Replay uses this to start a trace that
    /// began after its program allocated from the state it started in.
    ///
    /// Blocks must lie inside the segment, in any order, without overlapping.
    pub fn restore_segment(
        &self,
        size: u64,
        stream: StreamId,
        pool: Pool,
        blocks: &[(u64, u64, u64)],
    ) -> Result<u64, AllocError> {
        let mut sorted: Vec<(u64, u64, u64)> = blocks.to_vec();
        sorted.sort_unstable();
        let mut end = 0;
        for &(offset, block_size, _) in &sorted {
            if offset < end || block_size == 0 || offset.saturating_add(block_size) > size {
                return Err(AllocError::OutOfBounds {
                    len: size,
                    wanted: offset.saturating_add(block_size),
                });
            }
            end = offset + block_size;
        }
        let shared = &*self.shared;
        let mut guard = shared.lock();
        let state = &mut *guard;
        let addr = match shared.backend.malloc(size) {
            Ok(addr) => addr,
            Err(_) => {
                let origin = Origin {
                    location: Location::caller(),
                    tag: None,
                };
                return Err(self.out_of_memory(state, stream, size, size, &origin));
            }
        };
        let first = self.register_segment(state, addr, size, stream, pool);
        // Cut the spanning block into live blocks and the free gaps between them.
        let mut pieces: Vec<(u64, Option<u64>)> = Vec::new();
        let mut cursor = 0;
        for &(offset, block_size, requested) in &sorted {
            if offset > cursor {
                pieces.push((offset - cursor, None));
            }
            pieces.push((block_size, Some(requested)));
            cursor = offset + block_size;
        }
        if cursor < size {
            pieces.push((size - cursor, None));
        }
        let mut id = first;
        for (i, &(piece_size, requested)) in pieces.iter().enumerate() {
            let rest = (i + 1 < pieces.len()).then(|| state.split_off(id, piece_size));
            match requested {
                Some(requested) => {
                    self.mark_allocated(state, id, pool, requested, NIL, 0, false);
                }
                None => state.insert_free(id),
            }
            if let Some(rest) = rest {
                id = rest;
            }
        }
        Ok(addr)
    }

    /// Marks the block at `addr` as used by `stream` too: when freed, it is reused only after
    /// the work queued on `stream` so far has completed.
    pub fn record_stream_ptr(&self, addr: u64, stream: StreamId) -> Result<(), AllocError> {
        let mut state = self.shared.lock();
        let Some(&id) = state.live.get(&addr) else {
            return Err(self.classify_bad_free(&state, addr));
        };
        Self::add_stream_use(&mut state, id, stream);
        Ok(())
    }

    /// `record_stream` for a buffer's block, by id.
    pub(crate) fn record_stream_block(
        &self,
        block: u32,
        addr: u64,
        stream: StreamId,
    ) -> Result<(), AllocError> {
        let mut state = self.shared.lock();
        let owned = (block as usize) < state.blocks.slots.len()
            && state.blocks.slots[block as usize].addr == addr
            && state.blocks.slots[block as usize].flags == ALLOCATED | BUFFER_OWNED;
        if !owned {
            return Err(self.classify_bad_free(&state, addr));
        }
        Self::add_stream_use(&mut state, block, stream);
        Ok(())
    }

    fn add_stream_use(state: &mut State, id: u32, stream: StreamId) {
        let own = state.stream_of(id);
        if own != stream {
            let uses = state.stream_uses.entry(id).or_default();
            if !uses.contains(&stream) {
                uses.push(stream);
            }
        }
    }

    /// Releases every cached segment that holds no live block (`torch.cuda.empty_cache()`).
    /// Returns the bytes given back to the device.
    #[track_caller]
    pub fn empty_cache(&self) -> u64 {
        let location = Location::caller();
        let shared = &*self.shared;
        let mut guard = shared.lock();
        let state = &mut *guard;
        let released = self.release_cached_blocks(state);
        self.record_for_site(
            state,
            EventKind::EmptyCache,
            location,
            RawEventParts {
                size: released,
                ..RawEventParts::default()
            },
        );
        released
    }

    /// Caps what the allocator may reserve, as PyTorch's `set_per_process_memory_fraction`
    /// does (`None` lifts the cap). Like PyTorch, the cap is checked when a segment is needed,
    /// against the size a plain segment for the request would have; with expandable segments
    /// the pages then mapped may pass it (the `compact` policy checks what it maps instead).
    /// Garbage collection's threshold is a share of the cap. Without a cap, the device's
    /// capacity stands in for it. Replay sets the cap it is given here, on a device without
    /// limit, as a capped PyTorch run has a whole device behind its cap.
    pub fn set_memory_limit(&self, limit: Option<u64>) {
        self.shared.lock().memory_limit = limit;
    }

    /// The reservation cap: the memory limit, or the device's capacity.
    fn cap(&self, state: &State) -> u64 {
        state.memory_limit.unwrap_or(self.shared.capacity)
    }

    /// Starts a new training step: later allocations carry the new step number.
    #[track_caller]
    pub fn mark_step(&self) -> u64 {
        let location = Location::caller();
        let shared = &*self.shared;
        let mut guard = shared.lock();
        let state = &mut *guard;
        state.step += 1;
        let step = state.step;
        let seq = state.ring.next_seq();
        let time_ns = shared.clock.ticks();
        state.steps.push(StepMark {
            step,
            seq,
            time_ns,
            label: "mark_step".to_string(),
        });
        self.record_for_site(state, EventKind::Step, location, RawEventParts::default());
        step
    }

    /// The current step number (0 before the first `mark_step`).
    pub fn step(&self) -> u64 {
        self.shared.lock().step
    }

    /// Records a transfer or sync event for the caller's site.
    pub(crate) fn record_transfer(
        &self,
        kind: EventKind,
        addr: u64,
        bytes: u64,
        stream: StreamId,
        location: &'static Location<'static>,
    ) {
        if !self.shared.config.record_events {
            return;
        }
        let mut guard = self.shared.lock();
        self.record_for_site(
            &mut guard,
            kind,
            location,
            RawEventParts {
                addr,
                size: bytes,
                stream: stream.0,
                ..RawEventParts::default()
            },
        );
    }

    /// Records an event attributed to `location` (with no tag), when events are on.
    fn record_for_site(
        &self,
        state: &mut State,
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
        let provenance = self.provenance_for(state, &origin, None);
        state.record(
            &self.shared.clock,
            kind,
            RawEventParts {
                provenance,
                ..parts
            },
        );
    }

    /// Blocks until all work on `stream` is done, recorded as a sync at the caller's site.
    #[track_caller]
    pub fn synchronize(&self, stream: StreamId) -> Result<(), AllocError> {
        self.shared.backend.synchronize_stream(stream)?;
        self.record_transfer(EventKind::Sync, 0, 0, stream, Location::caller());
        Ok(())
    }

    /// Current statistics.
    pub fn stats(&self) -> MemoryStats {
        self.shared.lock().stats.memory_stats()
    }

    /// Resets every peak statistic to its current value.
    pub fn reset_peak_stats(&self) {
        self.shared.lock().stats.reset_peak();
    }

    /// The statistics as PyTorch's `memory_summary()` table.
    pub fn memory_summary(&self) -> String {
        self.stats().summary()
    }

    /// Events recorded so far that the ring overwrote.
    pub fn dropped_events(&self) -> u64 {
        self.shared.lock().ring.overwritten()
    }

    /// Bytes the event ring occupies when full.
    pub fn event_ring_bytes(&self) -> usize {
        self.shared.lock().ring.max_bytes()
    }

    /// Number of live (allocated or pending) blocks.
    pub fn live_blocks(&self) -> usize {
        let state = self.shared.lock();
        state.stats.allocation.all().current as usize + state.pending_events.len()
    }

    /// Everything the allocator knows, as the one data model: device, settings, statistics,
    /// segments with blocks, events, call sites (symbolized now), tags, scopes and steps.
    pub fn snapshot(&self) -> Snapshot {
        self.snapshot_with_history(usize::MAX)
    }

    /// A snapshot that carries only the newest `max_events` events of the ring: what a live
    /// consumer that already has the older ones needs, converted in time proportional to what
    /// it asks for (the device lock is held while converting).
    pub fn snapshot_with_history(&self, max_events: usize) -> Snapshot {
        let shared = &*self.shared;
        let mut guard = shared.lock();
        let state = &mut *guard;
        if shared.config.record_events {
            state.record(&shared.clock, EventKind::Snapshot, RawEventParts::default());
        }
        let info = shared.backend.mem_info();
        let mut snapshot = Snapshot::empty(
            SnapshotSource::Vramscope,
            DeviceInfo {
                index: shared.device,
                name: shared.backend.name(),
                backend: shared.backend.kind().to_string(),
                capacity: info.total,
            },
        );
        snapshot.config = shared.config.clone();
        snapshot.stats = state.stats.memory_stats();
        snapshot.epoch_unix_ns = shared.epoch_unix_ns;
        snapshot.dropped_events = state.ring.overwritten();
        snapshot.violations = state.violations.clone();
        let ns_per_tick = shared.clock.ns_per_tick();
        let to_ns = |ticks: u64| (ticks as f64 * ns_per_tick) as u64;
        snapshot.steps = state
            .steps
            .iter()
            .map(|m| StepMark {
                time_ns: to_ns(m.time_ns),
                ..m.clone()
            })
            .collect();
        let prov = |state: &State, id: u32| {
            state.provenance.get(id).unwrap_or(Provenance {
                site: NIL,
                tag: NIL,
                scope: NIL,
                thread: 0,
            })
        };
        let opt = |id: u32| (id != NIL).then_some(id);
        for &segment in state.segments_by_addr.values() {
            let seg = state.segments.get(segment);
            // Like PyTorch, an expandable segment with unmapped holes shows as one segment per
            // mapped run (an expandable segment with nothing mapped shows not at all).
            let push_run = |snapshot: &mut Snapshot, blocks: Vec<Block>| {
                if let Some(first) = blocks.first() {
                    snapshot.segments.push(Segment {
                        device: shared.device,
                        address: first.address,
                        total_size: blocks.iter().map(|b| b.size).sum(),
                        stream: seg.stream.0,
                        pool: seg.pool,
                        expandable: seg.expandable,
                        blocks,
                    });
                }
            };
            let mut blocks = Vec::new();
            let mut id = seg.first;
            while id != NIL {
                let b = state.blocks.get(id);
                if b.flags & UNMAPPED != 0 {
                    push_run(&mut snapshot, std::mem::take(&mut blocks));
                    id = b.next;
                    continue;
                }
                let p = prov(state, b.provenance);
                let block_state = if b.flags & ALLOCATED != 0 {
                    BlockState::ActiveAllocated
                } else if b.flags & PENDING_FREE != 0 {
                    BlockState::ActivePendingFree
                } else {
                    BlockState::Inactive
                };
                let owned = block_state != BlockState::Inactive;
                blocks.push(Block {
                    address: b.addr,
                    size: b.size,
                    requested_size: if owned { b.requested } else { 0 },
                    state: block_state,
                    site: if owned { opt(p.site) } else { None },
                    tag: if owned { opt(p.tag) } else { None },
                    scope: if owned { opt(p.scope) } else { None },
                    step: if owned { b.step as u64 } else { 0 },
                    thread: if owned { p.thread } else { 0 },
                });
                id = b.next;
            }
            // A plain segment is one run: its blocks cover it from its address.
            push_run(&mut snapshot, blocks);
        }
        // Under the lock only copies: the raw events (64 bytes each), the provenance tuples and
        // the unsymbolized sites. Converting and symbolizing them waits for the lock's release,
        // so that a dashboard attaching to a program holds it up for a copy, not a conversion.
        let first = state.ring.next_seq().saturating_sub(max_events as u64);
        let raw: Vec<RawEvent> = state.ring.since(first, usize::MAX).copied().collect();
        let provenances = state.provenance.provenances().to_vec();
        let unresolved = state.provenance.sites_since(0);
        snapshot.tags = state.provenance.tags.strings.clone();
        snapshot.scopes = state.provenance.scopes.strings.clone();
        drop(guard);

        let device = shared.device;
        snapshot.events = raw
            .iter()
            .map(|e| event_of(e, &provenances, ns_per_tick, device))
            .collect();
        snapshot.sites = unresolved.into_iter().map(|s| s.resolve()).collect();
        shared.lock().provenance.keep_resolved(0, &snapshot.sites);
        snapshot
    }

    /// Converts a ring entry into the model's event.
    fn to_event(&self, state: &State, raw: &RawEvent, ns_per_tick: f64) -> crate::model::Event {
        event_of(
            raw,
            state.provenance.provenances(),
            ns_per_tick,
            self.shared.device,
        )
    }

    /// Events with sequence number `from_seq` or later that the ring still holds, at most
    /// `limit` of them, with the current statistics: what a live consumer (the telemetry
    /// publisher, the in-process dashboard) pulls. `missed` counts events from `from_seq` on
    /// that the ring overwrote before this call.
    pub fn events_since(&self, from_seq: u64, limit: usize) -> EventBatch {
        let state = self.shared.lock();
        let ns_per_tick = self.shared.clock.ns_per_tick();
        let oldest = state.ring.oldest_seq();
        let events: Vec<crate::model::Event> = state
            .ring
            .since(from_seq, limit)
            .map(|e| self.to_event(&state, e, ns_per_tick))
            .collect();
        let next_seq = events
            .last()
            .map(|e| e.seq + 1)
            .unwrap_or_else(|| from_seq.max(oldest));
        EventBatch {
            events,
            next_seq,
            missed: oldest.saturating_sub(from_seq),
            stats: state.stats.memory_stats(),
            step: state.step,
        }
    }

    /// The call-site, tag and scope tables that events index, symbolizing new backtraces.
    /// Ids are stable: the tables only grow.
    pub fn site_tables(&self) -> SiteTables {
        let mut state = self.shared.lock();
        SiteTables {
            sites: state.provenance.call_sites(),
            tags: state.provenance.tags.strings.clone(),
            scopes: state.provenance.scopes.strings.clone(),
        }
    }

    /// The entries of the call-site, tag and scope tables from the given lengths on (the
    /// tables only grow, so a consumer that knows the first `sites` sites asks for the rest).
    /// Only the new entries are copied under the device lock, and call sites are symbolized
    /// after it is released: a live consumer (the telemetry publisher) never holds the program
    /// up while backtraces are resolved.
    pub fn site_tables_since(&self, sites: usize, tags: usize, scopes: usize) -> SiteTables {
        let (new_sites, tags, scopes) = {
            let state = self.shared.lock();
            let tables = &state.provenance;
            (
                tables.sites_since(sites),
                tables.tags.strings.get(tags..).unwrap_or_default().to_vec(),
                tables
                    .scopes
                    .strings
                    .get(scopes..)
                    .unwrap_or_default()
                    .to_vec(),
            )
        };
        SiteTables {
            sites: new_sites.into_iter().map(|s| s.resolve()).collect(),
            tags,
            scopes,
        }
    }

    /// Wall-clock time of event time zero, in nanoseconds since the Unix epoch.
    pub fn epoch_unix_ns(&self) -> u64 {
        self.shared.epoch_unix_ns
    }

    /// Checks the allocator's books against its blocks: blocks tile their segments without
    /// overlap, free sets hold exactly the free blocks, and every statistic equals the sum over
    /// the block map. Returns what is wrong, for tests and debugging.
    pub fn check_invariants(&self) -> Result<(), String> {
        let state = self.shared.lock();
        let mut expect = MemoryStats::default();
        let mut free_count = 0usize;
        let mut live_count = 0usize;
        let mut mapped_count = 0usize;
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
                let b = state.blocks.get(id);
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
                    let page = self.expandable_page(seg.pool);
                    if !seg.expandable
                        || b.next == NIL
                        || (prev != NIL && state.blocks.get(prev).flags & UNMAPPED != 0)
                        || !(b.addr - seg.addr).is_multiple_of(page)
                        || !b.size.is_multiple_of(page)
                    {
                        return Err(format!("unmapped block {id} at {:#x} is misplaced", b.addr));
                    }
                    holes += b.size;
                    prev = id;
                    id = b.next;
                    continue;
                }
                if b.is_free() {
                    free_count += 1;
                    let list = &state.free_lists[state.list_of(b)];
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
                    if b.prev != NIL && state.blocks.get(b.prev).is_free() {
                        return Err(format!(
                            "free block {id} was not merged with its free neighbour"
                        ));
                    }
                    if b.is_split() && !seg.expandable {
                        expect.inactive_split.increase(seg.pool, 1);
                        expect.inactive_split_bytes.increase(seg.pool, b.size);
                    }
                } else {
                    active += 1;
                    expect.active.increase(seg.pool, 1);
                    expect.active_bytes.increase(seg.pool, b.size);
                    // Like PyTorch, requested bytes count until the free completes.
                    expect.requested_bytes.increase(seg.pool, b.requested);
                    if b.is_allocated() {
                        live_count += 1;
                        mapped_count += usize::from(b.flags & BUFFER_OWNED == 0);
                        let in_map = state.live.get(&b.addr) == Some(&id);
                        let buffer_owned = b.flags & BUFFER_OWNED != 0;
                        if in_map == buffer_owned {
                            return Err(format!(
                                "allocated block {id} must be either buffer-owned or in the pointer map"
                            ));
                        }
                        expect.allocation.increase(seg.pool, 1);
                        expect.allocated_bytes.increase(seg.pool, b.size);
                    }
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
            if !seg.expandable && (active == 0) != state.is_idle(seg) {
                return Err(format!(
                    "segment at {addr:#x} has no live block but is not one free block"
                ));
            }
        }
        // Every entry of every free list must be a free block of that list under its own key,
        // and the lists' counts must match their entries: a stale entry left behind by a
        // removal would otherwise go unseen as long as the counts were kept.
        for (index, list) in state.free_lists.iter().enumerate() {
            let entries = list.blocks.all_from(0);
            if entries.len() != list.blocks.len() {
                return Err(format!(
                    "free list {index} counts {} blocks but holds {}",
                    list.blocks.len(),
                    entries.len()
                ));
            }
            for (key, id) in entries {
                let b = state.blocks.get(id);
                if !b.is_free() || state.list_of(b) != index || free_key(b.size, b.addr) != key {
                    return Err(format!(
                        "free list {index} holds block {id} at {:#x} under a stale key",
                        b.addr
                    ));
                }
            }
        }
        let pools: usize = state.free_lists.iter().map(|l| l.blocks.len()).sum();
        if pools != free_count || state.live.len() != mapped_count {
            return Err(format!(
                "{pools} pooled blocks for {free_count} free ones; {} pointer-map entries for {mapped_count} raw-pointer blocks",
                state.live.len()
            ));
        }
        if state.blocks.len() < live_count + free_count {
            return Err("block slab lost blocks".to_string());
        }
        let s = state.stats.memory_stats();
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
        if allocated > reserved || (self.shared.capacity > 0 && reserved > self.shared.capacity) {
            return Err(format!(
                "allocated {allocated} ≤ reserved {reserved} ≤ capacity {} does not hold",
                self.shared.capacity
            ));
        }
        Ok(())
    }

    pub(crate) fn backend_ref(&self) -> &B {
        &self.shared.backend
    }
}

impl<B: Backend> Shared<B> {
    /// Takes the device lock. Waiting for an [`Exclusive`] guard that this same thread holds
    /// would never end, so that is refused with a panic that says what to do instead.
    #[inline]
    fn lock(&self) -> MutexGuard<'_, State> {
        if let Some(guard) = self.state.try_lock() {
            return guard;
        }
        let me = provenance::thread_number() as u64;
        if self.exclusive_thread.load(Ordering::Relaxed) == me {
            panic!(
                "vramscope: this thread holds an Exclusive guard on this allocator \
                 (CachingAllocator::exclusive); use the guard's methods, or drop it first"
            );
        }
        self.state.lock()
    }
}

impl<B: Backend> Drop for Shared<B> {
    /// Returns every segment to the device, so dropping the allocator leaks nothing.
    fn drop(&mut self) {
        let mut guard = self.state.lock();
        let state = &mut *guard;
        let _ = self.backend.synchronize();
        for (_, seg) in state.segments.iter() {
            if seg.expandable {
                // Unmap each mapped run between the unmapped holes.
                let mut run: Option<(u64, u64)> = None;
                let mut id = seg.first;
                while id != NIL {
                    let b = state.blocks.get(id);
                    if b.flags & UNMAPPED != 0 {
                        if let Some((start, len)) = run.take() {
                            let _ = self.backend.unmap(start, len);
                        }
                    } else {
                        let (start, len) = run.unwrap_or((b.addr, 0));
                        run = Some((start, len + b.size));
                    }
                    id = b.next;
                }
                if let Some((start, len)) = run {
                    let _ = self.backend.unmap(start, len);
                }
                let _ = self.backend.release_address_range(seg.addr, seg.reserved);
            } else {
                let _ = self.backend.free(seg.addr);
            }
        }
        for (event, _) in state.outstanding.drain(..) {
            let _ = self.backend.destroy_event(event);
        }
        for event in state.spare_events.drain(..) {
            let _ = self.backend.destroy_event(event);
        }
    }
}

/// A batch of events pulled from the ring by [`CachingAllocator::events_since`].
#[derive(Clone, Debug, PartialEq)]
pub struct EventBatch {
    /// The events, oldest first.
    pub events: Vec<crate::model::Event>,
    /// The sequence number to ask for next.
    pub next_seq: u64,
    /// Events after the requested sequence number that were overwritten before this pull.
    pub missed: u64,
    /// Statistics at the time of the pull.
    pub stats: MemoryStats,
    /// The current step number.
    pub step: u64,
}

/// The tables that events and blocks index by id.
#[derive(Clone, Debug, PartialEq)]
pub struct SiteTables {
    /// Call sites by `SiteId`.
    pub sites: Vec<crate::model::CallSite>,
    /// Tags by `TagId`.
    pub tags: Vec<String>,
    /// Scope paths by `ScopeId`.
    pub scopes: Vec<String>,
}

/// A block from the handle API ([`CachingAllocator::alloc_block`], [`Exclusive::alloc_block`]).
/// It frees by block id, so a free costs no address lookup; it is neither `Copy` nor `Clone`,
/// so safe code cannot free it twice. Dropping it without freeing leaks the block (it stays
/// allocated and shows in snapshots, as a leak should).
#[derive(Debug, PartialEq, Eq)]
#[must_use = "a block handle that is dropped without `free_block` leaks its block"]
pub struct BlockHandle {
    addr: u64,
    block: u32,
    /// The handle tag of the allocator that handed it out, so that another allocator refuses
    /// it (a `NonZeroU32`, which keeps `Option<BlockHandle>` at 16 bytes).
    allocator: NonZeroU32,
}

impl BlockHandle {
    /// The device address of the block (0 for a zero-byte allocation).
    pub fn addr(&self) -> u64 {
        self.addr
    }
}

/// The device lock held for a run of operations ([`CachingAllocator::exclusive`]). Every
/// operation is the same as the allocator's own, with the same policy, statistics and events;
/// only the lock round-trip per operation is gone.
pub struct Exclusive<'a, B: Backend> {
    allocator: &'a CachingAllocator<B>,
    state: MutexGuard<'a, State>,
}

impl<B: Backend> Drop for Exclusive<'_, B> {
    fn drop(&mut self) {
        // Cleared while the lock is still held (the guard field drops after this).
        self.allocator
            .shared
            .exclusive_thread
            .store(0, Ordering::Relaxed);
    }
}

impl<B: Backend> Exclusive<'_, B> {
    /// [`CachingAllocator::stats`] under the held lock.
    pub fn stats(&self) -> MemoryStats {
        self.state.stats.memory_stats()
    }

    /// [`CachingAllocator::alloc_ptr`] under the held lock.
    #[track_caller]
    #[inline]
    pub fn alloc_ptr(&mut self, size: u64, stream: StreamId) -> Result<u64, AllocError> {
        self.allocate(size, stream, Location::caller(), false)
            .map(|handle| handle.addr)
    }

    /// The size of the block that the raw pointer `addr` (from [`Exclusive::alloc_ptr`])
    /// points to, while it is allocated: what PyTorch's `allocated_bytes` counts for it (the
    /// request rounded, or a whole free block that was not worth splitting).
    pub fn block_size_of(&self, addr: u64) -> Option<u64> {
        let id = *self.state.live.get(&addr)?;
        Some(self.state.blocks.slots[id as usize].size)
    }

    /// [`CachingAllocator::free_ptr`] under the held lock.
    #[inline]
    pub fn free_ptr(&mut self, addr: u64) -> Result<(), AllocError> {
        if addr == 0 {
            return Ok(());
        }
        self.allocator.deallocate_in(&mut self.state, addr)
    }

    /// [`CachingAllocator::alloc_block`] under the held lock.
    #[track_caller]
    #[inline]
    pub fn alloc_block(&mut self, size: u64, stream: StreamId) -> Result<BlockHandle, AllocError> {
        self.allocate(size, stream, Location::caller(), true)
    }

    /// [`CachingAllocator::free_block`] under the held lock.
    #[inline]
    pub fn free_block(&mut self, handle: BlockHandle) -> Result<(), AllocError> {
        self.allocator.check_handle(&handle)?;
        if handle.addr == 0 {
            return Ok(());
        }
        self.allocator
            .deallocate_owned_in(&mut self.state, handle.block, handle.addr)
    }

    #[inline]
    fn allocate(
        &mut self,
        size: u64,
        stream: StreamId,
        location: &'static Location<'static>,
        for_handle: bool,
    ) -> Result<BlockHandle, AllocError> {
        if size == 0 {
            return Ok(self.allocator.handle((0, NIL)));
        }
        let backtrace = self.allocator.backtrace_for_request();
        let origin = Origin {
            location,
            tag: None,
        };
        let allocator = self.allocator;
        allocator
            .allocate_in(&mut self.state, size, stream, origin, backtrace, for_handle)
            .map(|found| allocator.handle(found))
    }
}

/// An allocator handle whose allocations carry a tag.
pub struct Tagged<'a, B: Backend> {
    allocator: &'a CachingAllocator<B>,
    tag: &'a str,
}

impl<B: Backend> Tagged<'_, B> {
    /// Allocates `size` bytes on the default stream with the tag.
    #[track_caller]
    pub fn alloc(&self, size: u64) -> Result<crate::DeviceBuffer<B>, AllocError> {
        self.allocator
            .alloc_from(size, StreamId::DEFAULT, Some(self.tag), Location::caller())
    }

    /// Allocates `size` bytes on `stream` with the tag.
    #[track_caller]
    pub fn alloc_on(
        &self,
        size: u64,
        stream: StreamId,
    ) -> Result<crate::DeviceBuffer<B>, AllocError> {
        self.allocator
            .alloc_from(size, stream, Some(self.tag), Location::caller())
    }
}

/// Keeps a named scope open on this thread until dropped.
#[must_use = "the scope closes when the guard is dropped"]
pub struct ScopeGuard {
    owner: u64,
    id: u32,
    _not_send: std::marker::PhantomData<*const ()>,
}

impl Drop for ScopeGuard {
    fn drop(&mut self) {
        provenance::pop_scope(self.owner, self.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn block_metadata_fits_64_bytes_with_its_map_entry() {
        let per_block = std::mem::size_of::<BlockMeta>() + std::mem::size_of::<(u64, u32)>();
        assert!(per_block <= 64, "{per_block} bytes per live block");
    }

    #[test]
    fn an_optional_block_handle_is_16_bytes() {
        assert_eq!(std::mem::size_of::<Option<BlockHandle>>(), 16);
    }

    #[test]
    fn rounding_follows_pytorch() {
        assert_eq!(round_size(1, 0), 512);
        assert_eq!(round_size(512, 0), 512);
        assert_eq!(round_size(513, 0), 1024);
        assert_eq!(round_size(1_000_000, 0), 1_000_448);
        // With 4 divisions, 1200 MiB rounds to the next quarter between 1 and 2 GiB.
        assert_eq!(round_size(1200 * MIB, 4), 1280 * MIB);
        assert_eq!(round_size(1024 * MIB, 4), 1024 * MIB);
        // Small sizes below 512 * divisions round to 512 bytes as usual.
        assert_eq!(round_size(1500, 4), 1536);
    }

    #[test]
    fn pools_and_segment_sizes_follow_pytorch() {
        assert_eq!(pool_for(MIB), Pool::Small);
        assert_eq!(pool_for(MIB + 512), Pool::Large);
        assert_eq!(segment_size_for(512), 2 * MIB);
        assert_eq!(segment_size_for(MIB), 2 * MIB);
        assert_eq!(segment_size_for(MIB + 512), 20 * MIB);
        assert_eq!(segment_size_for(10 * MIB - 512), 20 * MIB);
        assert_eq!(segment_size_for(10 * MIB), 10 * MIB);
        assert_eq!(segment_size_for(11 * MIB), 12 * MIB);
    }
}
