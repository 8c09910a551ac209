//! vramscope-allocator: a PyTorch-compatible caching GPU allocator that records where every
//! allocation came from, linked into a program.
//!
//! The caching policy itself, its statistics, event ring, provenance and the simulated device
//! are `vramscope-caching`, whose items this crate re-exports at its root; this crate adds what
//! a running program needs around them: the CUDA backend ([`cuda::CudaBackend`], cudarc loaded
//! at run time) and [`DeviceBackend`], which picks it or the simulated device; [`Telemetry`],
//! which publishes the allocator's events to dashboards; and the Prometheus `/metrics` server
//! ([`metrics`]). Each item has one public path: the crate root, or the public module it lives
//! in (`cuda`, `provenance`, `debug`, `metrics`). The data it fills is the data model of
//! `vramscope-model`, which every other vramscope crate reads without linking this one.
//!
//! ```
//! use vramscope_allocator::{CachingAllocator, SimDevice};
//! use vramscope_model::AllocatorConfig;
//!
//! let alloc = CachingAllocator::new(SimDevice::backed(1 << 30), AllocatorConfig::default());
//! let buf = alloc.alloc(4096).unwrap();
//! drop(buf);
//! assert_eq!(alloc.stats().allocated_bytes.all.current, 0);
//! ```

mod any;
#[cfg(feature = "cuda")]
pub mod cuda;
#[cfg(not(feature = "cuda"))]
#[path = "cuda_absent.rs"]
pub mod cuda;
mod driver_info;
#[cfg(feature = "metrics")]
pub mod metrics;
mod telemetry;

// The caching core's items keep their public paths here too (`vramscope_allocator::Item`), so a
// program names one crate; `provenance` and `debug` are its public namespaces.
pub use vramscope_caching::{
    debug, pool_for, provenance, round_size, segment_size_for, AllocError, Backend, BackendError,
    BlockHandle, CachingAllocator, DeviceBuffer, EventBatch, EventId, Exclusive, MemInfo,
    OomReport, ScopeGuard, ScopeStats, SimCounters, SimDevice, SiteTables, StreamId, Tagged,
    LARGE_BUFFER, MIN_BLOCK_SIZE, MIN_LARGE_ALLOC, ROUND_LARGE, SIM_ALIGNMENT, SIM_GRANULARITY,
    SMALL_BUFFER, SMALL_SIZE,
};

// Every item of the modules above that are not public has its one public path here, at the
// crate root; the public modules (`cuda`, `metrics`) are namespaces whose items are reached
// only through them.
pub use any::{doctor, DeviceBackend, DoctorReport, BACKEND_ENV, DEFAULT_SIM_CAPACITY};
pub use telemetry::{pull_tables, IdleWatch, PublisherStats, ServeOptions, Telemetry};
