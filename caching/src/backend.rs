//! The raw device primitives the caching allocator is built on.
//!
//! [`Backend`] is the seam between policy and hardware: `crate::allocator` asks a backend for
//! whole segments, streams, events, copies and virtual-memory pages, and never touches a device
//! any other way. `crate::sim` implements it on host memory (or on no memory at all, for trace
//! replay); a CUDA implementation sits behind the same trait, so everything above it is tested
//! on the simulated device.

use std::fmt;

/// A stream handle. Stream 0 is the device's default stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct StreamId(pub u64);

impl StreamId {
    /// The default (legacy) stream.
    pub const DEFAULT: StreamId = StreamId(0);
}

/// An event handle, recorded on a stream and queried for completion.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct EventId(pub u64);

/// Free and total device memory, as `cudaMemGetInfo` reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct MemInfo {
    /// Bytes the device could still hand out.
    pub free: u64,
    /// Total device memory.
    pub total: u64,
}

/// What a backend call can fail with.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum BackendError {
    /// The device has no room for the request (`cudaErrorMemoryAllocation`).
    OutOfMemory {
        /// Bytes requested.
        requested: u64,
        /// Bytes free on the device at the time.
        free: u64,
    },
    /// An address is not the start of a live raw allocation, or a range is not mapped.
    InvalidAddress {
        /// The address.
        addr: u64,
        /// What was being done.
        operation: &'static str,
    },
    /// A copy or memset touches memory outside any live allocation.
    OutOfBounds {
        /// Start of the range.
        addr: u64,
        /// Length of the range.
        len: u64,
    },
    /// The backend has no memory behind its addresses (a phantom simulated device).
    NoBackingMemory,
    /// An unknown stream or event handle.
    InvalidHandle {
        /// What kind of handle.
        kind: &'static str,
        /// The handle.
        id: u64,
    },
    /// A failure reported by the driver.
    Driver {
        /// The driver's message.
        message: String,
    },
}

impl fmt::Display for BackendError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BackendError::OutOfMemory { requested, free } => write!(
                f,
                "device out of memory: requested {requested} bytes with {free} bytes free"
            ),
            BackendError::InvalidAddress { addr, operation } => {
                write!(f, "{operation}: {addr:#x} is not a live device allocation")
            }
            BackendError::OutOfBounds { addr, len } => write!(
                f,
                "the range {addr:#x}..{:#x} is not inside device memory",
                addr.saturating_add(*len)
            ),
            BackendError::NoBackingMemory => {
                f.write_str("this device has no memory behind its addresses (phantom mode)")
            }
            BackendError::InvalidHandle { kind, id } => write!(f, "unknown {kind} handle {id}"),
            BackendError::Driver { message } => write!(f, "driver error: {message}"),
        }
    }
}

impl std::error::Error for BackendError {}

/// The raw device operations the caching allocator needs.
///
/// Implementations are thread-safe; the allocator calls them under its device lock only on the
/// slow path (new segments, releases, events), and copies outside it.
pub trait Backend: Send + Sync + 'static {
    /// A short description of the device (`"sim (phantom)"`, `"NVIDIA H200"`).
    fn name(&self) -> String;
    /// The backend kind: `"sim"` or `"cuda"`.
    fn kind(&self) -> &'static str;
    /// Device ordinal.
    fn device_index(&self) -> u32;

    /// Allocates a raw segment of `size` bytes (`cudaMalloc`).
    fn malloc(&self, size: u64) -> Result<u64, BackendError>;
    /// Frees a raw segment returned by [`Backend::malloc`] (`cudaFree`).
    fn free(&self, addr: u64) -> Result<(), BackendError>;
    /// Free and total memory (`cudaMemGetInfo`).
    fn mem_info(&self) -> MemInfo;

    /// Creates a stream.
    fn create_stream(&self) -> Result<StreamId, BackendError>;
    /// Creates an event.
    fn create_event(&self) -> Result<EventId, BackendError>;
    /// Destroys an event.
    fn destroy_event(&self, event: EventId) -> Result<(), BackendError>;
    /// Records `event` on `stream`: it completes when the work queued so far completes.
    fn record_event(&self, event: EventId, stream: StreamId) -> Result<(), BackendError>;
    /// Whether `event` has completed.
    fn query_event(&self, event: EventId) -> Result<bool, BackendError>;
    /// Makes `stream` wait for `event` before later work.
    fn stream_wait_event(&self, stream: StreamId, event: EventId) -> Result<(), BackendError>;
    /// Blocks the host until all work on `stream` is done.
    fn synchronize_stream(&self, stream: StreamId) -> Result<(), BackendError>;
    /// Blocks the host until all work on the device is done.
    fn synchronize(&self) -> Result<(), BackendError>;

    /// Sets `len` bytes at `addr` to `value`.
    fn memset(&self, addr: u64, value: u8, len: u64, stream: StreamId) -> Result<(), BackendError>;
    /// Copies host memory to the device.
    fn copy_host_to_device(
        &self,
        dst: u64,
        src: &[u8],
        stream: StreamId,
    ) -> Result<(), BackendError>;
    /// Copies device memory to the host; returns when the data is on the host.
    fn copy_device_to_host(
        &self,
        dst: &mut [u8],
        src: u64,
        stream: StreamId,
    ) -> Result<(), BackendError>;
    /// Copies between two device ranges.
    fn copy_device_to_device(
        &self,
        dst: u64,
        src: u64,
        len: u64,
        stream: StreamId,
    ) -> Result<(), BackendError>;

    /// The page size of the virtual-memory API (2 MiB on current GPUs).
    fn vm_granularity(&self) -> u64;
    /// Reserves `size` bytes of address space with no memory behind it.
    fn reserve_address_range(&self, size: u64) -> Result<u64, BackendError>;
    /// Releases an address range from [`Backend::reserve_address_range`] (it must be unmapped).
    fn release_address_range(&self, addr: u64, size: u64) -> Result<(), BackendError>;
    /// Creates physical memory for `[addr, addr + size)` and maps it there.
    fn map(&self, addr: u64, size: u64) -> Result<(), BackendError>;
    /// Unmaps and frees the physical memory behind `[addr, addr + size)`.
    fn unmap(&self, addr: u64, size: u64) -> Result<(), BackendError>;
}
