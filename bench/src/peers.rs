//! The allocators under test behind one small trait, each with a fake device that only keeps
//! books: how many raw allocations it was asked for and how many bytes it held at most.
//!
//! Every adapter returns its own handle type (an address, an offset allocation, a memory
//! block, a reference-counted handle, a host pointer); the replay loop keeps them per slot.

use std::alloc::{GlobalAlloc, Layout};
use std::cell::Cell;
use std::sync::Arc;

use cubecl_ir::MemoryDeviceProperties;
use cubecl_server::logging::ServerLogger;
use cubecl_server::memory_management::{
    ErrorGraph, ManagedMemoryHandle, MemoryConfiguration, MemoryManagement,
    MemoryManagementOptions, PageUpdate,
};
use cubecl_server::server::IoError;
use cubecl_server::storage::{ComputeStorage, StorageHandle, StorageId, StorageUtilization};
use gpu_alloc::{
    AllocationFlags, Config, DeviceMapError, DeviceProperties, GpuAllocator, MappedMemoryRange,
    MemoryBlock, MemoryDevice, MemoryHeap, MemoryPropertyFlags, MemoryType, OutOfMemory, Request,
    UsageFlags,
};
use vramscope_allocator::{BlockHandle, CachingAllocator, Exclusive, SimDevice, StreamId};
use vramscope_model::{AllocatorConfig, MemoryStats};

/// What an allocator held from its device over a replay.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Footprint {
    /// Raw allocations asked of the device (segments, chunks, pages, memory objects);
    /// `None` where the allocator has no device (the host reference).
    pub raw_allocs: Option<u64>,
    /// Most bytes held from the device at once; `None` where not measured.
    pub peak_reserved: Option<u64>,
}

impl Footprint {
    /// What a vramscope allocator's statistics say it held.
    fn of_vramscope(stats: &MemoryStats) -> Footprint {
        Footprint {
            raw_allocs: Some(stats.num_device_alloc),
            peak_reserved: Some(stats.reserved_bytes.all.peak),
        }
    }
}

/// An allocator that one trace replay drives.
pub trait DeviceAllocator {
    /// What an allocation returns and a free takes back.
    type Handle;
    /// Allocates `size` bytes for `stream`; `None` when the allocator is out of memory.
    fn alloc(&mut self, size: u64, stream: u64) -> Option<Self::Handle>;
    /// Frees an allocation.
    fn free(&mut self, handle: Self::Handle);
    /// The device books so far (`&mut` because cubecl's storage is only reachable so).
    fn footprint(&mut self) -> Footprint;
}

/// Capacity of every fake device that has one (an 80 GiB accelerator).
pub const DEVICE_CAPACITY: u64 = 80 << 30;

/// vramscope's caching allocator on a phantom simulated device, through its raw-pointer API.
pub struct Vramscope {
    /// The allocator (cloneable: clones share the state).
    pub inner: CachingAllocator<SimDevice>,
}

impl Vramscope {
    /// A fresh allocator with `config` on an 80 GiB phantom device.
    pub fn new(config: AllocatorConfig) -> Vramscope {
        Vramscope {
            inner: CachingAllocator::new(SimDevice::phantom(DEVICE_CAPACITY), config),
        }
    }
}

impl DeviceAllocator for Vramscope {
    type Handle = u64;

    #[inline]
    fn alloc(&mut self, size: u64, stream: u64) -> Option<u64> {
        self.inner.alloc_ptr(size, StreamId(stream)).ok()
    }

    #[inline]
    fn free(&mut self, handle: u64) {
        // Every handle came from `alloc`, so this cannot fail.
        let _ = self.inner.free_ptr(handle);
    }

    fn footprint(&mut self) -> Footprint {
        Footprint::of_vramscope(&self.inner.stats())
    }
}

/// vramscope's caching allocator with its device lock held for the whole replay
/// (`CachingAllocator::exclusive`), through the handle API: the same contract as the peers'
/// `&mut self` APIs, whose handles also free without an address lookup.
pub struct VramscopeExclusive<'a> {
    /// The guard every operation goes through.
    pub inner: Exclusive<'a, SimDevice>,
}

impl DeviceAllocator for VramscopeExclusive<'_> {
    type Handle = BlockHandle;

    #[inline]
    fn alloc(&mut self, size: u64, stream: u64) -> Option<BlockHandle> {
        self.inner.alloc_block(size, StreamId(stream)).ok()
    }

    #[inline]
    fn free(&mut self, handle: BlockHandle) {
        // Every handle came from `alloc`, so this cannot fail.
        let _ = self.inner.free_block(handle);
    }

    fn footprint(&mut self) -> Footprint {
        Footprint::of_vramscope(&self.inner.stats())
    }
}

/// Bytes per offset-allocator unit. Its offsets and sizes are `u32`, so the arena is counted
/// in 256-byte units (CUDA's allocation alignment) to reach past 4 GiB.
pub const OFFSET_UNIT: u64 = 256;

/// offset-allocator 0.2 over one fixed arena allocated up front.
pub struct Offset {
    inner: offset_allocator::Allocator<u32>,
    arena_bytes: u64,
    /// Highest end (in units) of any placement: the smallest arena that would have served.
    high_water: u32,
}

impl Offset {
    /// An allocator over an arena of `arena_bytes` (rounded down to whole units) that can hold
    /// up to `max_allocs` live allocations.
    pub fn new(arena_bytes: u64, max_allocs: u32) -> Offset {
        let units = (arena_bytes / OFFSET_UNIT).min(u32::MAX as u64) as u32;
        Offset {
            inner: offset_allocator::Allocator::with_max_allocs(units, max_allocs),
            arena_bytes: units as u64 * OFFSET_UNIT,
            high_water: 0,
        }
    }

    /// The highest byte any placement reached.
    pub fn high_water_bytes(&self) -> u64 {
        self.high_water as u64 * OFFSET_UNIT
    }
}

impl DeviceAllocator for Offset {
    type Handle = offset_allocator::Allocation<u32>;

    #[inline]
    fn alloc(&mut self, size: u64, _stream: u64) -> Option<Self::Handle> {
        let units = size.div_ceil(OFFSET_UNIT).min(u32::MAX as u64) as u32;
        let allocation = self.inner.allocate(units)?;
        self.high_water = self.high_water.max(allocation.offset + units);
        Some(allocation)
    }

    #[inline]
    fn free(&mut self, handle: Self::Handle) {
        self.inner.free(handle);
    }

    fn footprint(&mut self) -> Footprint {
        Footprint {
            raw_allocs: Some(1),
            peak_reserved: Some(self.arena_bytes),
        }
    }
}

/// A device memory object of the fake `MemoryDevice`.
#[derive(Debug)]
pub struct FakeMemory {
    size: u64,
}

/// A `gpu-alloc` device that hands out nothing but books.
#[derive(Debug, Default)]
pub struct FakeDevice {
    allocs: Cell<u64>,
    held: Cell<u64>,
    peak: Cell<u64>,
}

impl MemoryDevice<FakeMemory> for FakeDevice {
    unsafe fn allocate_memory(
        &self,
        size: u64,
        _memory_type: u32,
        _flags: AllocationFlags,
    ) -> Result<FakeMemory, OutOfMemory> {
        if self.held.get() + size > DEVICE_CAPACITY {
            return Err(OutOfMemory::OutOfDeviceMemory);
        }
        self.allocs.set(self.allocs.get() + 1);
        self.held.set(self.held.get() + size);
        self.peak.set(self.peak.get().max(self.held.get()));
        Ok(FakeMemory { size })
    }

    unsafe fn deallocate_memory(&self, memory: FakeMemory) {
        self.held.set(self.held.get() - memory.size);
    }

    unsafe fn map_memory(
        &self,
        _memory: &mut FakeMemory,
        _offset: u64,
        _size: u64,
    ) -> Result<std::ptr::NonNull<u8>, DeviceMapError> {
        // Only device-local memory is requested, which is never mapped.
        Err(DeviceMapError::MapFailed)
    }

    unsafe fn unmap_memory(&self, _memory: &mut FakeMemory) {}

    unsafe fn invalidate_memory_ranges(
        &self,
        _ranges: &[MappedMemoryRange<'_, FakeMemory>],
    ) -> Result<(), OutOfMemory> {
        Ok(())
    }

    unsafe fn flush_memory_ranges(
        &self,
        _ranges: &[MappedMemoryRange<'_, FakeMemory>],
    ) -> Result<(), OutOfMemory> {
        Ok(())
    }
}

/// gpu-alloc 0.6 with its documented starting configuration (`Config::i_am_prototyping`) on a
/// fake device with one device-local memory type in one 80 GiB heap.
pub struct GpuAlloc {
    inner: GpuAllocator<FakeMemory>,
    device: FakeDevice,
}

impl GpuAlloc {
    /// A fresh allocator and device.
    pub fn new() -> GpuAlloc {
        let properties = DeviceProperties {
            memory_types: vec![MemoryType {
                heap: 0,
                props: MemoryPropertyFlags::DEVICE_LOCAL,
            }]
            .into(),
            memory_heaps: vec![MemoryHeap {
                size: DEVICE_CAPACITY,
            }]
            .into(),
            max_memory_allocation_count: u32::MAX,
            max_memory_allocation_size: DEVICE_CAPACITY,
            non_coherent_atom_size: 64,
            buffer_device_address: false,
        };
        GpuAlloc {
            inner: GpuAllocator::new(Config::i_am_prototyping(), properties),
            device: FakeDevice::default(),
        }
    }
}

impl Default for GpuAlloc {
    fn default() -> Self {
        GpuAlloc::new()
    }
}

impl DeviceAllocator for GpuAlloc {
    type Handle = MemoryBlock<FakeMemory>;

    #[inline]
    fn alloc(&mut self, size: u64, _stream: u64) -> Option<Self::Handle> {
        let request = Request {
            size,
            align_mask: 255,
            usage: UsageFlags::FAST_DEVICE_ACCESS,
            memory_types: 1,
        };
        // SAFETY: the same device is used for every call on this allocator, and it is the one
        // whose properties the allocator was built with.
        unsafe { self.inner.alloc(&self.device, request).ok() }
    }

    #[inline]
    fn free(&mut self, handle: Self::Handle) {
        // SAFETY: the block came from this allocator and this device, and is freed once.
        unsafe { self.inner.dealloc(&self.device, handle) }
    }

    fn footprint(&mut self) -> Footprint {
        Footprint {
            raw_allocs: Some(self.device.allocs.get()),
            peak_reserved: Some(self.device.peak.get()),
        }
    }
}

/// A `ComputeStorage` with no memory behind it: ids and books only. Deallocations wait for
/// `flush`, as the trait allows, and count as held until then.
#[derive(Debug, Default)]
pub struct NullStorage {
    sizes: std::collections::HashMap<StorageId, u64>,
    pending: Vec<StorageId>,
    allocs: u64,
    held: u64,
    peak: u64,
}

impl ComputeStorage for NullStorage {
    type Resource = ();

    fn alignment(&self) -> usize {
        256
    }

    fn get(&mut self, handle: &StorageHandle) -> Result<(), IoError> {
        debug_assert!(self.sizes.contains_key(&handle.id));
        Ok(())
    }

    fn alloc(&mut self, size: u64) -> Result<StorageHandle, IoError> {
        let id = StorageId::new();
        self.sizes.insert(id, size);
        self.allocs += 1;
        self.held += size;
        self.peak = self.peak.max(self.held);
        Ok(StorageHandle::new(
            id,
            StorageUtilization { offset: 0, size },
        ))
    }

    fn dealloc(&mut self, id: StorageId) {
        self.pending.push(id);
    }

    fn flush(&mut self) {
        for id in self.pending.drain(..) {
            if let Some(size) = self.sizes.remove(&id) {
                self.held -= size;
            }
        }
    }

    fn bytes_allocated(&self) -> u64 {
        self.held
    }
}

/// cubecl-server 0.11's `MemoryManagement` (default adaptive pools, automatic mode) over
/// [`NullStorage`]. A free is the drop of the handle; the pools notice it on later
/// reservations.
pub struct Cubecl {
    inner: MemoryManagement<NullStorage>,
    failures: ErrorGraph,
}

impl Cubecl {
    /// A fresh memory manager for an 80 GiB device whose largest page is `max_page_size`.
    pub fn new(max_page_size: u64) -> Cubecl {
        let properties =
            MemoryDeviceProperties::new(max_page_size, 256).with_max_memory(DEVICE_CAPACITY);
        Cubecl {
            inner: MemoryManagement::from_configuration(
                NullStorage::default(),
                &properties,
                MemoryConfiguration::default(),
                Arc::new(ServerLogger::default()),
                MemoryManagementOptions::new("bench"),
            ),
            failures: ErrorGraph::default(),
        }
    }
}

impl DeviceAllocator for Cubecl {
    type Handle = ManagedMemoryHandle;

    #[inline]
    fn alloc(&mut self, size: u64, _stream: u64) -> Option<ManagedMemoryHandle> {
        self.inner
            .reserve(size, PageUpdate::Allow, &mut self.failures)
            .ok()
    }

    #[inline]
    fn free(&mut self, handle: ManagedMemoryHandle) {
        drop(handle);
    }

    fn footprint(&mut self) -> Footprint {
        let storage = self.inner.storage();
        Footprint {
            raw_allocs: Some(storage.allocs),
            peak_reserved: Some(storage.peak),
        }
    }
}

/// mimalloc as a host reference: `malloc`/`free` of the same sizes (16-byte alignment), the
/// memory never touched.
#[derive(Default)]
pub struct Mimalloc;

impl DeviceAllocator for Mimalloc {
    type Handle = (*mut u8, Layout);

    #[inline]
    fn alloc(&mut self, size: u64, _stream: u64) -> Option<Self::Handle> {
        let layout = Layout::from_size_align(size as usize, 16).ok()?;
        // SAFETY: the layout has a non-zero size (trace sizes are at least 1).
        let ptr = unsafe { mimalloc::MiMalloc.alloc(layout) };
        (!ptr.is_null()).then_some((ptr, layout))
    }

    #[inline]
    fn free(&mut self, (ptr, layout): Self::Handle) {
        // SAFETY: `ptr` came from `MiMalloc.alloc` with this layout and is freed once.
        unsafe { mimalloc::MiMalloc.dealloc(ptr, layout) }
    }

    fn footprint(&mut self) -> Footprint {
        Footprint::default()
    }
}
