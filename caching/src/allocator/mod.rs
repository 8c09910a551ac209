//! The caching allocator: PyTorch's CUDA caching policy over any [`Backend`], with statistics,
//! provenance and an event ring.
//!
//! [`CachingAllocator`] is a cheap handle (an `Arc`) to one device's state behind one
//! `parking_lot` mutex. Requests are rounded, routed to the small or large pool, served by the
//! smallest cached block on the same stream, split, and merged back with free neighbours on free,
//! exactly as `c10/cuda/CUDACachingAllocator.cpp` does; new segments come from the backend
//! (`crate::backend`), and `crate::sim` stands in for a GPU. Every operation updates the
//! statistics (a `crate::stats::StatsBook`, read out as
//! [`MemoryStats`](crate::stats::MemoryStats)) and, when tracking is on, pushes an event into
//! the ring (`crate::ring`) with an interned provenance id (`crate::provenance`). Handed-out memory
//! is a [`DeviceBuffer`](crate::buffer::DeviceBuffer) that frees itself on drop; the raw
//! pointer API serves the C ABI, and [`BlockHandle`]s free by id without an address lookup. An
//! [`Exclusive`] guard holds the device lock across a run of operations (trace replay, a
//! single-threaded program) so that each skips the lock round-trip. Free blocks are indexed by
//! `crate::free_index`.
//!
//! This file holds the allocator handle, its settings as decided at construction (`Shared`),
//! the lock, and the entry points that take it. The rest is split along the policy's seams:
//! `state` is what the lock guards (block and segment metadata in a `slab`, free lists, block
//! linking); `policy` is PyTorch's rules, on a `policy::Books` that borrows the locked state with
//! the settings and backend, so that each rule is a method of it; `expandable` (expandable
//! segments), `streams` (frees deferred on other streams' events) and `release` (empty cache,
//! oversize release, garbage collection) add their rules to `Books`; `snapshot` reads the state
//! out; `invariants` checks it; `guards` holds the handles and guards handed out, and `errors`
//! what goes wrong.

use std::num::NonZeroU32;
use std::panic::Location;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use crate::backend::{Backend, StreamId};
use crate::clock::Clock;
use crate::config::AllocatorConfig;
use crate::model::{EventKind, StepMark};
use crate::provenance::{self, NIL};
use crate::sync::{Mutex, MutexGuard};

mod errors;
mod expandable;
mod guards;
mod invariants;
mod policy;
mod release;
mod slab;
mod snapshot;
mod state;
mod streams;

pub use errors::{AllocError, OomReport};
pub use guards::{BlockHandle, Exclusive, ScopeGuard, ScopeStats, Tagged};
pub(crate) use policy::Origin;
pub use policy::{
    pool_for, round_size, segment_size_for, LARGE_BUFFER, MIN_BLOCK_SIZE, MIN_LARGE_ALLOC,
    ROUND_LARGE, SMALL_BUFFER, SMALL_SIZE,
};
pub use snapshot::{EventBatch, SiteTables};

use policy::Books;
use state::{RawEventParts, State, ALLOCATED, BUFFER_OWNED, UNMAPPED};

static NEXT_ALLOCATOR_ID: AtomicU64 = AtomicU64::new(1);

/// What an allocator's clones share: the settings, decided once at construction, the backend,
/// and the state behind the device lock.
struct Shared<B: Backend> {
    id: u64,
    /// vramscope's number of the thread holding an [`Exclusive`] guard (0: none), so that the
    /// same thread locking again is refused with a message instead of deadlocking.
    exclusive_thread: AtomicU64,
    /// Call sites or events are recorded (`config.record_sites || config.record_events`,
    /// without `config.record_events` for an allocator that records device calls only).
    tracking: bool,
    /// Allocations and frees are recorded as events (`config.record_events`, unless the
    /// allocator records device calls only: [`CachingAllocator::recording_device_calls`]).
    record_blocks: bool,
    /// Allocations may take a backtrace: call sites are recorded and `config.backtraces` is
    /// not off, so that with backtraces off an allocation does not look at the setting.
    takes_backtraces: bool,
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

impl<B: Backend> CachingAllocator<B> {
    /// An allocator for `device` with `config`.
    pub fn new(device: B, config: AllocatorConfig) -> CachingAllocator<B> {
        let record_blocks = config.record_events;
        Self::build(device, config, record_blocks)
    }

    /// An allocator for `device` with `config` whose event ring records what the device is
    /// asked for (segments allocated, freed, mapped and unmapped) and out-of-memory failures,
    /// `empty_cache()` calls and steps, but no allocation or free: the ring of a replay that
    /// only compares device calls, which would otherwise hold two or more block events per
    /// call. Events are recorded only if `config.record_events` is set; call sites only if
    /// `config.record_sites` is. The policy, the statistics and the device calls are those of
    /// [`CachingAllocator::new`].
    pub fn recording_device_calls(device: B, config: AllocatorConfig) -> CachingAllocator<B> {
        Self::build(device, config, false)
    }

    fn build(device: B, config: AllocatorConfig, record_blocks: bool) -> CachingAllocator<B> {
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
                tracking: config.record_sites || record_blocks,
                record_blocks,
                takes_backtraces: config.record_sites
                    && config.backtraces != crate::config::BacktraceMode::Off,
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
                state: Mutex::new(State::new(ring_capacity)),
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

    /// Allocates a `DeviceBuffer` of `size` bytes on `stream`, attributed to `location` and
    /// `tag`.
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

    /// Frees a block from [`CachingAllocator::alloc_block`].
    pub fn free_block(&self, handle: BlockHandle) -> Result<(), AllocError> {
        self.check_handle(&handle)?;
        self.deallocate_buffer(handle.block(), handle.addr)
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
        // Who is asking is read before the lock: the critical section holds the policy only.
        let caller = self.shared.caller();
        let mut guard = self.shared.lock();
        Books::new(&self.shared, &mut guard).allocate(size, stream, origin, caller, for_buffer)
    }

    /// Frees a block of the raw-pointer API by address.
    pub(crate) fn deallocate(&self, addr: u64) -> Result<(), AllocError> {
        if addr == 0 {
            return Ok(());
        }
        let mut guard = self.shared.lock();
        Books::new(&self.shared, &mut guard).deallocate(addr)
    }

    /// Frees the block a `DeviceBuffer` owns, by id; `addr` guards against a stale id.
    pub(crate) fn deallocate_buffer(&self, block: u32, addr: u64) -> Result<(), AllocError> {
        if addr == 0 {
            return Ok(());
        }
        let mut guard = self.shared.lock();
        Books::new(&self.shared, &mut guard).deallocate_owned(block, addr)
    }

    /// Turns a buffer-owned block into a raw-pointer block (`DeviceBuffer::into_raw`).
    pub(crate) fn disown_buffer(&self, block: u32, addr: u64) {
        if addr == 0 {
            return;
        }
        let mut state = self.shared.lock();
        if state
            .blocks
            .slot(block)
            .is_some_and(|b| b.flags == ALLOCATED | BUFFER_OWNED)
        {
            state.blocks.get_mut(block).flags = ALLOCATED;
            state.live.insert(addr, block);
        }
    }

    #[cfg(any(test, feature = "replay"))]
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
        pool: crate::model::Pool,
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
        let mut books = Books::new(shared, &mut guard);
        let addr = match shared.backend.malloc(size) {
            Ok(addr) => addr,
            Err(_) => {
                let origin = Origin {
                    location: Location::caller(),
                    tag: None,
                };
                return Err(books.out_of_memory(stream, size, size, &origin));
            }
        };
        let first = books.register_segment(addr, size, stream, pool);
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
            let rest = (i + 1 < pieces.len()).then(|| books.state.split_off(id, piece_size));
            match requested {
                Some(requested) => {
                    books.mark_allocated(id, pool, requested, NIL, 0, false);
                }
                None => books.state.insert_free(id),
            }
            if let Some(rest) = rest {
                id = rest;
            }
        }
        Ok(addr)
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

    /// Starts a new training step: later allocations carry the new step number.
    #[track_caller]
    pub fn mark_step(&self) -> u64 {
        let location = Location::caller();
        let shared = &*self.shared;
        let mut guard = shared.lock();
        let state = &mut *guard;
        state.step += 1;
        state.event_step = state.step.min(u32::MAX as u64) as u32;
        let step = state.step;
        let seq = state.ring.next_seq();
        let time_ns = shared.clock.ticks();
        state.steps.push(StepMark {
            step,
            seq,
            time_ns,
            label: "mark_step".to_string(),
        });
        Books::new(shared, state).record_for_site(
            EventKind::Step,
            location,
            RawEventParts::default(),
        );
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
        Books::new(&self.shared, &mut guard).record_for_site(
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

    /// Blocks until all work on `stream` is done, recorded as a sync at the caller's site.
    #[track_caller]
    pub fn synchronize(&self, stream: StreamId) -> Result<(), AllocError> {
        self.shared.backend.synchronize_stream(stream)?;
        self.record_transfer(EventKind::Sync, 0, 0, stream, Location::caller());
        Ok(())
    }

    /// The backend, for the buffers this allocator hands out (`crate::buffer`).
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

#[cfg(test)]
mod tests {
    use super::state::BlockMeta;
    use super::*;
    use crate::config::MIB;
    use crate::SimDevice;

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
    fn a_handle_keeps_its_block_and_allocator_apart() {
        let alloc = CachingAllocator::new(SimDevice::phantom(1 << 30), AllocatorConfig::default());
        let other = CachingAllocator::new(SimDevice::phantom(1 << 30), AllocatorConfig::default());
        for block in [0, 1, 0x1234_5678, u32::MAX - 1] {
            let handle = alloc.handle((0x7f00_0000_0200, block));
            assert_eq!(handle.block(), block);
            assert_eq!(handle.addr(), 0x7f00_0000_0200);
            assert!(alloc.check_handle(&handle).is_ok());
            assert!(matches!(
                other.check_handle(&handle),
                Err(AllocError::UnknownPointer {
                    addr: 0x7f00_0000_0200
                })
            ));
            drop(handle);
        }
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
}
