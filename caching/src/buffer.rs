//! [`DeviceBuffer`]: device memory handed out by a [`CachingAllocator`], freed on drop.
//!
//! A buffer remembers its allocator, address, length and stream. Its copies go through the
//! backend and are recorded as transfer events with the caller's call site (a device→host copy
//! is also a sync of the stream, which is what the inspector's `sync_in_loop` detector looks
//! for). Dropping the buffer returns its block to the allocator's cache.

use std::fmt;
use std::panic::Location;

use crate::allocator::{AllocError, CachingAllocator};
use crate::backend::{Backend, StreamId};
use vramscope_model::{EventKind, TransferDirection};

/// Device memory from a [`CachingAllocator`]. Returns to the cache when dropped.
pub struct DeviceBuffer<B: Backend> {
    allocator: CachingAllocator<B>,
    addr: u64,
    len: u64,
    stream: StreamId,
    /// The allocator's id of the block, so that drop frees it without a pointer lookup.
    block: u32,
}

impl<B: Backend> DeviceBuffer<B> {
    pub(crate) fn new(
        allocator: CachingAllocator<B>,
        addr: u64,
        len: u64,
        stream: StreamId,
        block: u32,
    ) -> Self {
        DeviceBuffer {
            allocator,
            addr,
            len,
            stream,
            block,
        }
    }

    /// Device address (0 for an empty buffer).
    pub fn addr(&self) -> u64 {
        self.addr
    }

    /// Bytes requested.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether the buffer has no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The stream the buffer was allocated for.
    pub fn stream(&self) -> StreamId {
        self.stream
    }

    /// The allocator the buffer came from.
    pub fn allocator(&self) -> &CachingAllocator<B> {
        &self.allocator
    }

    fn check_len(&self, wanted: usize) -> Result<(), AllocError> {
        if wanted as u64 > self.len {
            Err(AllocError::OutOfBounds {
                len: self.len,
                wanted: wanted as u64,
            })
        } else {
            Ok(())
        }
    }

    /// Copies `src` to the start of the buffer, recorded as a host→device transfer.
    #[track_caller]
    pub fn copy_from_host(&mut self, src: &[u8]) -> Result<(), AllocError> {
        let location = Location::caller();
        self.check_len(src.len())?;
        self.allocator
            .backend_ref()
            .copy_host_to_device(self.addr, src, self.stream)?;
        self.allocator.record_transfer(
            EventKind::Transfer(TransferDirection::HostToDevice),
            self.addr,
            src.len() as u64,
            self.stream,
            location,
        );
        Ok(())
    }

    /// Copies the start of the buffer into `dst`, recorded as a device→host transfer (and so a
    /// sync of the buffer's stream).
    #[track_caller]
    pub fn copy_to_host(&self, dst: &mut [u8]) -> Result<(), AllocError> {
        let location = Location::caller();
        self.check_len(dst.len())?;
        self.allocator
            .backend_ref()
            .copy_device_to_host(dst, self.addr, self.stream)?;
        self.allocator.record_transfer(
            EventKind::Transfer(TransferDirection::DeviceToHost),
            self.addr,
            dst.len() as u64,
            self.stream,
            location,
        );
        Ok(())
    }

    /// Copies `len` bytes from the start of `src` to the start of this buffer.
    #[track_caller]
    pub fn copy_from_device(&mut self, src: &DeviceBuffer<B>, len: u64) -> Result<(), AllocError> {
        let location = Location::caller();
        if len > self.len || len > src.len {
            return Err(AllocError::OutOfBounds {
                len: self.len.min(src.len),
                wanted: len,
            });
        }
        self.allocator.backend_ref().copy_device_to_device(
            self.addr,
            src.addr,
            len,
            self.stream,
        )?;
        self.allocator.record_transfer(
            EventKind::Transfer(TransferDirection::DeviceToDevice),
            self.addr,
            len,
            self.stream,
            location,
        );
        Ok(())
    }

    /// Sets every byte of the buffer to `value`.
    pub fn fill(&mut self, value: u8) -> Result<(), AllocError> {
        self.allocator
            .backend_ref()
            .memset(self.addr, value, self.len, self.stream)?;
        Ok(())
    }

    /// Marks the buffer as used on `stream` as well (`Tensor.record_stream`).
    pub fn record_stream(&self, stream: StreamId) -> Result<(), AllocError> {
        if self.len == 0 {
            return Ok(());
        }
        self.allocator
            .record_stream_block(self.block, self.addr, stream)
    }

    /// Frees the buffer now, reporting any error instead of ignoring it as drop must.
    pub fn free(self) -> Result<(), AllocError> {
        let this = std::mem::ManuallyDrop::new(self);
        let result = this.allocator.deallocate_buffer(this.block, this.addr);
        // SAFETY: `this` is never used again and its destructor does not run, so reading the
        // allocator handle out of it moves it exactly once and releases its reference count.
        drop(unsafe { std::ptr::read(&this.allocator) });
        result
    }

    /// Gives up ownership: the block stays allocated until
    /// [`CachingAllocator::free_ptr`] is called with the returned address.
    pub fn into_raw(self) -> u64 {
        let this = std::mem::ManuallyDrop::new(self);
        let addr = this.addr;
        this.allocator.disown_buffer(this.block, addr);
        // SAFETY: as in `free`, the handle is moved out once and `this` is never used again.
        drop(unsafe { std::ptr::read(&this.allocator) });
        addr
    }
}

impl<B: Backend> Drop for DeviceBuffer<B> {
    fn drop(&mut self) {
        // A buffer owns its block, so this free cannot be a double free unless the raw API
        // freed the same address; that misuse is reported there, and ignored here.
        let _ = self.allocator.deallocate_buffer(self.block, self.addr);
    }
}

impl<B: Backend> fmt::Debug for DeviceBuffer<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeviceBuffer")
            .field("addr", &format_args!("{:#x}", self.addr))
            .field("len", &self.len)
            .field("stream", &self.stream)
            .finish()
    }
}
