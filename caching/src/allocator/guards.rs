//! The handles and guards that the allocator gives out besides buffers: [`BlockHandle`]s that
//! free by block id, the [`Exclusive`] guard that holds the device lock across a run of
//! operations, [`Tagged`] handles whose allocations carry a tag, and the [`ScopeGuard`] of a
//! named scope.
//!
//! Each goes through the same policy as the allocator's own calls: the handle API and the
//! guard's operations build a `super::policy::Books` on the locked state, as
//! `super::CachingAllocator`'s entry points do; scopes live in the thread's scope stack of
//! `crate::provenance`. `crate::buffer::DeviceBuffer`, the other thing handed out, has its own
//! module.

use std::num::NonZeroU64;
use std::panic::Location;
use std::sync::atomic::Ordering;

use super::errors::AllocError;
use super::policy::{Books, Origin};
use super::state::State;
use super::CachingAllocator;
use crate::backend::{Backend, StreamId};
use crate::provenance::{self, NIL};
use crate::stats::MemoryStats;
use crate::sync::MutexGuard;

/// A block from the handle API ([`CachingAllocator::alloc_block`], [`Exclusive::alloc_block`]).
/// It frees by block id, so a free costs no address lookup; it is neither `Copy` nor `Clone`,
/// so safe code cannot free it twice. Dropping it without freeing leaks the block (it stays
/// allocated and shows in snapshots, as a leak should).
#[derive(Debug, PartialEq, Eq)]
#[must_use = "a block handle that is dropped without `free_block` leaks its block"]
pub struct BlockHandle {
    pub(super) addr: u64,
    /// The handle tag of the allocator that handed it out in the low 32 bits, so that another
    /// allocator refuses it, and the block id in the high 32. The tag is not zero, so neither
    /// is this, which keeps `Option<BlockHandle>` at 16 bytes; and two 8-byte fields make
    /// the handle a pair of registers, returned in registers: as three fields (8, 4 and 4
    /// bytes) it was returned through memory, written as three stores that a caller's one
    /// 16-byte copy of it could not take from the store buffer, and waited for them (issue
    /// 47: about 5 % of a replay's time on the peer benchmark).
    id: NonZeroU64,
}

impl BlockHandle {
    /// The device address of the block (0 for a zero-byte allocation).
    pub fn addr(&self) -> u64 {
        self.addr
    }

    /// The block's id in its allocator's slab.
    #[inline]
    pub(super) fn block(&self) -> u32 {
        (self.id.get() >> 32) as u32
    }

    /// The handle tag of the allocator that handed it out.
    #[inline]
    fn allocator(&self) -> u32 {
        self.id.get() as u32
    }
}

impl<B: Backend> CachingAllocator<B> {
    /// A handle whose allocations carry `tag` (`alloc.tagged("loss").alloc(n)`). A tag that
    /// names what the memory is made of (`weights`, `grad`, `optimizer`, `activation`,
    /// `input`, ..., or a category's own name, `alloc.tagged(Category::Gradients.as_str())`)
    /// puts its blocks in that category in every report
    /// ([`vramscope_model::Category::from_tag`]); any other tag says nothing about it.
    pub fn tagged<'a>(&'a self, tag: &'a str) -> Tagged<'a, B> {
        Tagged {
            allocator: self,
            tag,
        }
    }

    /// The handle of an allocated block (address and block id).
    #[inline]
    pub(super) fn handle(&self, (addr, block): (u64, u32)) -> BlockHandle {
        BlockHandle {
            addr,
            id: NonZeroU64::from(self.shared.handle_tag) | (block as u64) << 32,
        }
    }

    /// Refuses a handle that another allocator handed out.
    #[inline]
    pub(super) fn check_handle(&self, handle: &BlockHandle) -> Result<(), AllocError> {
        if handle.allocator() == self.shared.handle_tag.get() {
            Ok(())
        } else {
            Err(AllocError::UnknownPointer { addr: handle.addr })
        }
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

    /// Opens a named scope on this thread; allocations until the guard drops carry it, nested
    /// in the scopes the thread already has open on this allocator (`outer/inner`). A scope
    /// that would nest deeper than [`provenance::MAX_SCOPE_DEPTH`] (1024) levels is refused
    /// and counted ([`ScopeStats::refused`]), never fatal: the guard then opens nothing, and
    /// allocations keep the scope they had. [`CachingAllocator::try_scope`] says so instead.
    /// An untagged allocation inside a scope whose path names a category (`train/optimizer`)
    /// is in that category ([`vramscope_model::Category::from_scope`]).
    pub fn scope(&self, name: &str) -> ScopeGuard {
        self.try_scope(name).unwrap_or(ScopeGuard {
            owner: self.shared.id,
            id: None,
            _not_send: std::marker::PhantomData,
        })
    }

    /// [`CachingAllocator::scope`], or `None` (counted in [`ScopeStats::refused`]) when the
    /// scope would nest deeper than [`provenance::MAX_SCOPE_DEPTH`] (1024) levels. Each scope
    /// costs the table a few bytes once, however deep it nests: it is its parent's id and its
    /// own name.
    pub fn try_scope(&self, name: &str) -> Option<ScopeGuard> {
        let owner = self.shared.id;
        let parent = provenance::current_scope(owner);
        let id = self.shared.lock().provenance.scopes.open(parent, name)?;
        provenance::push_scope(owner, id);
        Some(ScopeGuard {
            owner,
            id: Some(id),
            _not_send: std::marker::PhantomData,
        })
    }

    /// The scope table's figures: scopes, scopes refused for nesting too deep, bytes held.
    pub fn scope_stats(&self) -> ScopeStats {
        let state = self.shared.lock();
        let scopes = &state.provenance.scopes;
        ScopeStats {
            scopes: scopes.len(),
            refused: scopes.refused(),
            table_bytes: scopes.bytes(),
        }
    }
}

/// The figures of an allocator's scope table ([`CachingAllocator::scope_stats`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ScopeStats {
    /// Distinct scopes (a name inside a parent) opened so far.
    pub scopes: usize,
    /// Scopes refused because they would nest deeper than [`provenance::MAX_SCOPE_DEPTH`]
    /// (1024) levels.
    pub refused: u64,
    /// Bytes the table holds: a few per scope, and each distinct name once.
    pub table_bytes: usize,
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

    #[cfg(any(test, feature = "replay"))]
    /// The size of the block that the raw pointer `addr` (from [`Exclusive::alloc_ptr`])
    /// points to, while it is allocated: what PyTorch's `allocated_bytes` counts for it (the
    /// request rounded, or a whole free block that was not worth splitting).
    pub fn block_size_of(&self, addr: u64) -> Option<u64> {
        let id = *self.state.live.get(&addr)?;
        Some(self.state.blocks.slot(id)?.size)
    }

    /// [`CachingAllocator::free_ptr`] under the held lock.
    #[inline]
    pub fn free_ptr(&mut self, addr: u64) -> Result<(), AllocError> {
        if addr == 0 {
            return Ok(());
        }
        self.books().deallocate(addr)
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
        self.books().deallocate_owned(handle.block(), handle.addr)
    }

    /// The policy over the held lock's state.
    #[inline(always)]
    fn books(&mut self) -> Books<'_, B> {
        Books::new(&self.allocator.shared, &mut self.state)
    }

    /// Allocates a block under the held lock, for a raw pointer or a handle (`for_handle`).
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
        let caller = self.allocator.shared.caller();
        let origin = Origin {
            location,
            tag: None,
        };
        let allocator = self.allocator;
        self.books()
            .allocate(size, stream, origin, caller, for_handle)
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

/// Keeps a named scope open on this thread until dropped. It belongs to the thread that
/// opened it (it is neither `Send` nor `Sync`): the scopes a thread has open are that
/// thread's own.
#[must_use = "the scope closes when the guard is dropped"]
pub struct ScopeGuard {
    owner: u64,
    /// The scope opened; `None` for a scope refused for nesting too deep.
    id: Option<u32>,
    _not_send: std::marker::PhantomData<*const ()>,
}

impl ScopeGuard {
    /// Whether the guard opened its scope (`false`: it was refused for nesting deeper than
    /// [`provenance::MAX_SCOPE_DEPTH`] (1024) levels, and closing it does nothing).
    pub fn is_open(&self) -> bool {
        self.id.is_some()
    }
}

impl Drop for ScopeGuard {
    fn drop(&mut self) {
        if let Some(id) = self.id {
            provenance::pop_scope(self.owner, id);
        }
    }
}
