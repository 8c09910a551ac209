//! vramscope: a GPU memory debugger and allocator inspector.
//!
//! This facade re-exports the workspace's library crates so that a program can depend on one
//! crate: [`model`] (the one data model: snapshots, events, call sites, statistics, settings),
//! [`allocator`] (the link-in caching allocator, simulated and CUDA backends, provenance and
//! telemetry), the inspector's four crates: [`import`] (the readers), [`analysis`] (the model
//! view, detectors, report data, diff), [`render`] (every printer) and [`export`] (writers to
//! other tools' formats), and [`engine`], [`replay`], [`kernels`] (kernels and the tensor
//! layer) and [`tui`] (the terminal dashboard).
//! The command line ([`cli`], run by the `vramscope` binary in `src/main.rs` and by the Python
//! package's `vramscope` command) is glue over these libraries.
//!
//! The README's quickstart, kept compiling here:
//!
//! ```
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use vramscope::{AllocatorConfig, CachingAllocator, SimDevice};
//!
//! let alloc = CachingAllocator::new(SimDevice::backed(1 << 30), AllocatorConfig::from_env()?);
//! let _weights = alloc.tagged("weights").alloc(64 << 20)?; // call site captured
//! for _ in 0..10 {
//!     alloc.mark_step();
//!     let _forward = alloc.scope("forward");
//!     let mut activations = alloc.alloc(8 << 20)?;
//!     activations.copy_from_host(&[0u8; 1024])?; // recorded as a transfer
//! } // buffers free themselves on drop
//! println!("{}", alloc.memory_summary());
//! let path = std::env::temp_dir().join("vramscope-quickstart.json");
//! alloc.snapshot().save(&path)?; // then: vramscope report run.json
//! vramscope::analysis::checks::assert_no_leaks(&vramscope::Snapshot::load(&path)?);
//! # std::fs::remove_file(path).ok();
//!
//! use vramscope::StreamId;
//! let mut exclusive = alloc.exclusive(); // until it drops, use only the guard
//! let handle = exclusive.alloc_block(4096, StreamId::DEFAULT)?;
//! exclusive.free_block(handle)?; // by block id: no address lookup
//! # Ok(())
//! # }
//! ```

pub mod cli;

pub use vramscope_allocator as allocator;
pub use vramscope_analysis as analysis;
pub use vramscope_engine as engine;
pub use vramscope_export as export;
pub use vramscope_import as import;
pub use vramscope_kernels as kernels;
pub use vramscope_model as model;
pub use vramscope_render as render;
pub use vramscope_replay as replay;
pub use vramscope_tui as tui;

pub use vramscope_allocator::{
    AllocError, Backend, CachingAllocator, DeviceBuffer, SimDevice, StreamId,
};
pub use vramscope_model::{AllocatorConfig, MemoryStats, Snapshot};
