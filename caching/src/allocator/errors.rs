//! Why an allocation or a free failed: [`AllocError`], and the [`OomReport`] that an
//! out-of-memory error carries.
//!
//! The policy (`super::policy`) builds these: an out-of-memory report when a request fails for
//! good, and, through `State::classify_bad_free` there, the error of a free that finds no block
//! (a double free, a buffer's pointer, an unknown pointer). Nothing here reads the allocator's
//! state: the report is filled in under the device lock and then stands on its own.

use std::fmt;

use crate::backend::BackendError;
use crate::stats::format_bytes;

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
    /// Why it failed, by the one rule (`vramscope_model::oom::diagnose`).
    pub cause: crate::oom::OomCause,
    /// Why it failed and what helps (`vramscope_model::oom::OomDiagnosis::hint`), unless the
    /// memory was simply in use.
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
