//! vramscope-caching: PyTorch's caching GPU allocator policy over any device backend, with the
//! statistics, event ring and call-site provenance it keeps, and a simulated device.
//!
//! The crate is layered bottom-up: [`Backend`] defines the raw device primitives and
//! [`SimDevice`] implements them without a GPU; [`CachingAllocator`] applies PyTorch's caching
//! policy on top of any backend and keeps PyTorch's statistics, [`provenance`] and an event
//! ring; [`DeviceBuffer`] is the memory it hands out. It links no driver and opens no socket:
//! `vramscope-allocator` adds the CUDA backend, the telemetry publisher and the `/metrics`
//! server on top of it and re-exports this crate's items, and `vramscope-replay` drives it over
//! a simulated device to replay recorded traces. The data it fills (snapshots, segments,
//! blocks, events, call sites, statistics, settings) is the data model of `vramscope-model`.
//! Nothing here touches files other than `Snapshot::save`/`load`, terminals or pickles.
//!
//! ```
//! use vramscope_caching::{CachingAllocator, SimDevice};
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

mod allocator;
mod backend;
mod buffer;
mod clock;
pub mod debug;
mod free_index;
pub mod provenance;
mod ring;
mod sim;
mod stats;
mod sync;

// The data model lives in its own crate (`vramscope-model`) that readers of snapshots use
// without this allocator. The modules here name it by two short crate-internal paths,
// `crate::model` for snapshots and events and `crate::config` for the settings; neither is
// public, so every model item keeps the one public path `vramscope_model::Item`.
use vramscope_model as config;
use vramscope_model as model;
use vramscope_model::oom;

// Every item of the modules above that are not public has its one public path here, at the
// crate root; the public modules (`provenance`, `debug`) are namespaces whose items are
// reached only through them.
pub use allocator::{
    pool_for, round_size, segment_size_for, AllocError, BlockHandle, CachingAllocator, EventBatch,
    Exclusive, OomReport, ScopeGuard, ScopeStats, SiteTables, Tagged, LARGE_BUFFER, MIN_BLOCK_SIZE,
    MIN_LARGE_ALLOC, ROUND_LARGE, SMALL_BUFFER, SMALL_SIZE,
};
pub use backend::{Backend, BackendError, EventId, MemInfo, StreamId};
pub use buffer::DeviceBuffer;
pub use sim::{SimCounters, SimDevice, SIM_ALIGNMENT, SIM_GRANULARITY};
