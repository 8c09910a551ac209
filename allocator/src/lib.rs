//! vramscope-allocator: a PyTorch-compatible caching GPU allocator that records where every
//! allocation came from.
//!
//! The crate is layered bottom-up: [`backend`] defines the raw device primitives and [`sim`]
//! implements them without a GPU; [`caching`] applies PyTorch's caching policy on top of any
//! backend and keeps [`stats`], [`provenance`] and an event ring; [`buffer`] is the memory it
//! hands out; [`model`] is the one data model (snapshots, segments, blocks, events, call sites)
//! that every other vramscope crate reads; [`config`] parses `PYTORCH_CUDA_ALLOC_CONF`-style
//! settings. Nothing here touches files other than `Snapshot::save`/`load`, terminals or pickles.
//!
//! ```
//! use vramscope_allocator::{AllocatorConfig, CachingAllocator, SimDevice};
//!
//! let alloc = CachingAllocator::new(SimDevice::backed(1 << 30), AllocatorConfig::default());
//! let mut buf = alloc.alloc(4096).unwrap();
//! buf.copy_from_host(&[1, 2, 3]).unwrap();
//! alloc.mark_step();
//! drop(buf);
//! assert_eq!(alloc.stats().allocated_bytes.all.current, 0);
//! assert_eq!(alloc.stats().reserved_bytes.all.current, 2 << 20); // cached
//! let snapshot = alloc.snapshot();
//! assert_eq!(snapshot.segments.len(), 1);
//! ```

pub mod any;
pub mod backend;
pub mod buffer;
pub mod caching;
mod clock;
pub mod config;
#[cfg(feature = "cuda")]
pub mod cuda;
#[cfg(not(feature = "cuda"))]
#[path = "cuda_absent.rs"]
pub mod cuda;
pub mod debug;
mod driver_info;
mod free_index;
#[cfg(feature = "metrics")]
pub mod metrics;
pub mod model;
pub mod oom;
pub mod provenance;
mod ring;
pub mod sim;
pub mod stats;
mod sync;
pub mod telemetry;
pub mod testing;

pub use any::{doctor, DeviceBackend, DoctorReport};
pub use backend::{Backend, BackendError, EventId, MemInfo, StreamId};
pub use buffer::DeviceBuffer;
pub use caching::{
    AllocError, BlockHandle, CachingAllocator, EventBatch, Exclusive, OomReport, ScopeGuard,
    SiteTables, Tagged,
};
pub use config::{AllocatorConfig, BacktraceMode, ConfigError, Policy};
pub use cuda::CudaBackend;
pub use model::*;
pub use sim::{SimCounters, SimDevice};
pub use stats::{format_bytes, MemoryStats, Recorded, Stat, StatArray};
pub use telemetry::{
    PublisherStats, ServeOptions, Telemetry, TelemetryAddr, TelemetryClient, TelemetryError,
};
