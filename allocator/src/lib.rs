//! vramscope-allocator: a PyTorch-compatible caching GPU allocator that records where every
//! allocation came from.
//!
//! The crate is layered bottom-up: [`backend`] defines the raw device primitives and [`sim`]
//! implements them without a GPU; [`caching`] applies PyTorch's caching policy on top of any
//! backend and keeps PyTorch's statistics, [`provenance`] and an event ring; [`buffer`] is the
//! memory it hands out; [`telemetry`] publishes its events to dashboards. The data it fills
//! (snapshots, segments, blocks, events, call sites, statistics, settings) is the data model of
//! `vramscope-model`, which every other vramscope crate reads without linking this one. Nothing
//! here touches files other than `Snapshot::save`/`load`, terminals or pickles.
//!
//! ```
//! use vramscope_allocator::{CachingAllocator, SimDevice};
//! use vramscope_model::AllocatorConfig;
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
pub mod provenance;
mod ring;
pub mod sim;
mod stats;
mod sync;

// The data model lives in its own crate (`vramscope-model`) that readers of snapshots use
// without this allocator. The allocator's modules name it by two short crate-internal paths,
// `crate::model` for snapshots and events and `crate::config` for the settings; neither is
// public, so every model item keeps the one public path `vramscope_model::Item`.
use vramscope_model as config;
use vramscope_model as model;
use vramscope_model::oom;
pub mod telemetry;

pub use any::{doctor, DeviceBackend, DoctorReport};
pub use backend::{Backend, BackendError, EventId, MemInfo, StreamId};
pub use buffer::DeviceBuffer;
pub use caching::{
    AllocError, BlockHandle, CachingAllocator, EventBatch, Exclusive, OomReport, ScopeGuard,
    SiteTables, Tagged,
};
pub use cuda::CudaBackend;
pub use sim::{SimCounters, SimDevice};
pub use telemetry::{PublisherStats, ServeOptions, Telemetry};
