//! vramscope-model: the ground floor every other vramscope crate stands on. It holds the data
//! that describes device memory, and nothing that produces or analyses it.
//!
//! - snapshots, segments, blocks, events, call sites, steps and annotations (the snapshot
//!   module), saved and loaded as JSON with a format version; a snapshot's events are an
//!   [`Events`] list, whose memory its prefixes can share (the events module);
//! - PyTorch's statistics under PyTorch's names ([`MemoryStats`]) and its `memory_summary()`
//!   table, with byte sizes formatted and parsed the way every view prints them;
//! - allocator settings in `PYTORCH_CUDA_ALLOC_CONF` syntax ([`AllocatorConfig`]);
//! - what memory is made of: the [`Category`] of a block (parameters, gradients, optimizer
//!   state, activations, ...), [`CategoryBytes`] per moment and its one text line, and the
//!   categories a program's tags name; and what the Python face's `attach()` marks in a
//!   recorded history, the module and phase of each allocation ([`marks`]);
//! - the one rule for why an out-of-memory error happened (the process's memory cap,
//!   fragmentation, memory in use, ...) and what helps ([`oom`]);
//! - PyTorch's caching-allocator constants and rounding, which the allocator runs on and every
//!   reader of a trace sizes blocks and picks pools with ([`pytorch`]);
//! - the one sanitizer of text from a file on its way to a terminal or a CI log ([`terminal`]),
//!   and output files written new and renamed into place, never through a link ([`files`]).
//!
//! The caching allocator (`vramscope-allocator`) fills these types; the inspector's importers
//! build them from PyTorch pickles and Chrome traces; the engine, detectors, replay, telemetry
//! and the dashboard read them. This crate depends on serde alone, so that reading a snapshot
//! never links a GPU driver. Every item has one path: the root re-exports below (`oom`,
//! `pytorch`, `terminal`, `files` and `marks`, whose items read best with their module's name, are the public modules).
//!
//! ```
//! use vramscope_model::{format_bytes, parse_bytes, AllocatorConfig};
//!
//! assert_eq!(parse_bytes("1.5 GiB"), Ok(3 << 29));
//! assert_eq!(format_bytes(3 << 29), "1.50 GiB");
//! let config = AllocatorConfig::parse("expandable_segments:True").unwrap();
//! assert!(config.expandable_segments);
//! ```

mod category;
mod config;
mod events;
pub mod files;
pub mod marks;
pub mod oom;
pub mod pytorch;
mod snapshot;
mod stats;
pub mod terminal;

pub use category::{Category, CategoryBytes};
pub use config::{AllocatorConfig, BacktraceMode, ConfigError, Policy, CONFIG_ENV_VAR, MIB};
pub use events::Events;
pub use snapshot::{
    device_refusal, event_device, event_step, overlapping_segment, step_after, step_refusal,
    Annotation, Block, BlockPlacement, BlockState, CallSite, DeviceInfo, Event, EventKind, Frame,
    Id, Owner, Pool, ScopeId, Segment, SiteId, Snapshot, SnapshotError, SnapshotSource, StepMark,
    TagId, TransferDirection, Violation, ViolationKind, EVENT_LOG_COUNT_KEY, FORMAT_VERSION,
    FORMAT_VERSION_OOM_IN_ADDR, MAX_DEVICES,
};
pub use stats::{
    elide_end, elide_start, format_bytes, parse_bytes, plural, thousands, MemoryStats, Recorded,
    Stat, StatArray, LABEL_CHARS,
};
