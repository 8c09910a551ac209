//! vramscope-allocator: a PyTorch-compatible caching GPU allocator that records where every
//! allocation came from.
//!
//! The crate is layered bottom-up: [`Backend`] defines the raw device primitives and
//! [`SimDevice`] implements them without a GPU ([`cuda::CudaBackend`] with one);
//! [`CachingAllocator`] applies PyTorch's caching policy on top of any backend and keeps
//! PyTorch's statistics, [`provenance`] and an event ring; [`DeviceBuffer`] is the memory it
//! hands out; [`Telemetry`] publishes its events to dashboards. Each item has one public path:
//! the crate root, or the public module it lives in (`cuda`, `provenance`, `debug`,
//! `metrics`). The data it fills
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

mod any;
mod backend;
mod buffer;
mod caching;
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
mod sim;
mod stats;
mod sync;

// The data model lives in its own crate (`vramscope-model`) that readers of snapshots use
// without this allocator. The allocator's modules name it by two short crate-internal paths,
// `crate::model` for snapshots and events and `crate::config` for the settings; neither is
// public, so every model item keeps the one public path `vramscope_model::Item`.
use vramscope_model as config;
use vramscope_model as model;
use vramscope_model::oom;
mod telemetry;

// Every item of the modules above that are not public has its one public path here, at the
// crate root; the public modules (`cuda`, `provenance`, `debug`, `metrics`) are namespaces
// whose items are reached only through them.
pub use any::{doctor, DeviceBackend, DoctorReport, BACKEND_ENV, DEFAULT_SIM_CAPACITY};
pub use backend::{Backend, BackendError, EventId, MemInfo, StreamId};
pub use buffer::DeviceBuffer;
pub use caching::{
    pool_for, round_size, segment_size_for, AllocError, BlockHandle, CachingAllocator, EventBatch,
    Exclusive, OomReport, ScopeGuard, ScopeStats, SiteTables, Tagged, LARGE_BUFFER, MIN_BLOCK_SIZE,
    MIN_LARGE_ALLOC, ROUND_LARGE, SMALL_BUFFER, SMALL_SIZE,
};
pub use sim::{SimCounters, SimDevice, SIM_ALIGNMENT, SIM_GRANULARITY};
pub use telemetry::{pull_tables, IdleWatch, PublisherStats, ServeOptions, Telemetry};
