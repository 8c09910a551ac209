//! vramscope: a GPU memory debugger and allocator inspector.
//!
//! This facade re-exports the workspace's library crates so that a program can depend on one
//! crate: [`allocator`] (the link-in caching allocator, simulated and CUDA backends, statistics,
//! provenance, telemetry and the one data model), [`inspector`] (importers, detectors, reports,
//! diff, replay, export), [`kernels`] (kernels and the tensor layer) and [`tui`] (the terminal
//! dashboard).
//! The `vramscope` binary in `src/main.rs` is command-line glue over these libraries.

pub use vramscope_allocator as allocator;
pub use vramscope_inspector as inspector;
pub use vramscope_kernels as kernels;
pub use vramscope_tui as tui;

pub use vramscope_allocator::{
    AllocError, AllocatorConfig, Backend, CachingAllocator, DeviceBuffer, MemoryStats, SimDevice,
    Snapshot, StreamId,
};
