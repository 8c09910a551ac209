//! Importer for PyTorch's `torch.cuda.memory._dump_snapshot()` pickles.
//!
//! The pickle is read by the safe reader of `vramscope_pickle`. Its `device_traces` entries, by
//! far the most of a big file, are streamed (`stream`): each becomes an event as soon as it is
//! read and is then dropped (those of the shape Python writes decoded by the reader's fast
//! path, `vramscope_pickle::FastEntry`, and converted by `read_fast_entry` through the same
//! code as `read_entry`), and a file is read by a second thread in pieces, so that neither
//! the file nor a document of its entries is ever held. The rest of the pickle is read into a
//! [`Document`], whose values are converted here, without building a tree of them. A pickle
//! that cannot be streamed faithfully is read whole into a document and converted the same way
//! ([`from_document`]), which gives the same snapshot. The result is a
//! `vramscope_model::Snapshot` with source `Pytorch`:
//!
//! - every segment of every device with its blocks (pool from `segment_type`, stream,
//!   expandable flag; blocks of older files without `address` are placed one after another);
//! - every `device_traces` entry as an `Event`, keeping its `device`; the kinds `alloc`,
//!   `free_requested`, `free_completed`, `segment_alloc`, `segment_free`, `segment_map`,
//!   `segment_unmap`, `snapshot` and `oom` are read and other actions are skipped. PyTorch
//!   records what the program asked for: that is a block event's `requested`, and its `size`
//!   is the block's size, found by `vramscope_replay::size_blocks` (PyTorch's own blocks when a
//!   replay with the trace's settings makes PyTorch's device calls, the request rounded
//!   otherwise), so that allocated bytes are PyTorch's `allocated_bytes` in every view. For
//!   `oom`, `device_free` is the device's free memory, as PyTorch records it. Entries without `time_us` (older files) get time 0. Frees of blocks
//!   allocated before recording began are kept as they are.
//! - each stack (`frames`, innermost first) as a call site of `Snapshot::sites`, chosen and
//!   deduplicated by `super::sites` (`stacks` converts each shared list, frame and string once);
//! - `external_annotations` as `Snapshot::annotations`, whose `START`s (or a step-marker
//!   function, see `super::ImportOptions`) number the training steps of `Snapshot::steps` and
//!   of every event and live block;
//! - statistics: current values from the segments, peaks and totals from replaying the trace
//!   with the block sizes above (`vramscope_engine::stats`, which `vramscope_engine::devices` calls for each device too);
//! - settings from `allocator_settings` (unknown keys ignored).
//!
//! Times are nanoseconds since the earliest time in the file, which becomes
//! `Snapshot::epoch_unix_ns`. `Snapshot::device` is the lowest device that has data; its
//! capacity is unknown (0). A dict key set twice counts with its last value, as in Python.

use std::fmt;

use rustc_hash::FxHashMap;
use vramscope_model::{
    overlapping_segment, AllocatorConfig, Annotation, Block, BlockPlacement, BlockState,
    DeviceInfo, Event, EventKind, Id, MemoryStats, Pool, Segment, SiteId, Snapshot, SnapshotSource,
    StepMark, FORMAT_VERSION,
};

use super::timeline;
use super::{ImportError, ImportErrorKind, ImportOptions, Stage};
use vramscope_pickle::{Document, FastEntry, FastValue, Limits, Seq, Value, ValueRef};

mod assemble;
mod collect;
mod entry;
use entry::*;
mod keep;
pub use keep::{is_model_key, EntryShape, KeptSource, KeptValue, SourceSlot, MODEL_ENTRY_KEYS};
mod stacks;
mod stream;

use assemble::finish;
use stacks::Stacks;
use vramscope_engine::stats::{compute_stats, SegmentPools, StatsPass};

/// Parses a snapshot pickle and converts it; `origin` names the data in errors.
pub fn from_pickle_bytes(
    bytes: &[u8],
    origin: &str,
    options: &ImportOptions,
) -> Result<Snapshot, ImportError> {
    if let Some(ready) = stream::read(bytes, options) {
        return ready.convert(origin, options);
    }
    let doc = parse(bytes, origin, options)?;
    from_document(&doc, origin, options)
}

/// [`from_pickle_bytes`] with every trace entry read by the pickle reader's generic machine,
/// without the fast path that decodes the entries of the shape Python writes
/// (`vramscope_pickle::FastEntry`): the reference the fast path is checked against, which
/// gives the same snapshot or the same error.
pub fn from_pickle_bytes_generic(
    bytes: &[u8],
    origin: &str,
    options: &ImportOptions,
) -> Result<Snapshot, ImportError> {
    if let Some(ready) = stream::read_bytes(bytes, options, false) {
        return ready.convert(origin, options);
    }
    let doc = parse(bytes, origin, options)?;
    from_document(&doc, origin, options)
}

/// Like [`from_pickle_bytes`], but frees the bytes once they are read and before the
/// conversion, so that the two never occupy memory together.
pub(crate) fn from_pickle_vec(
    bytes: Vec<u8>,
    origin: &str,
    options: &ImportOptions,
) -> Result<Snapshot, ImportError> {
    if let Some(ready) = stream::read(&bytes, options) {
        drop(bytes);
        return ready.convert(origin, options);
    }
    let doc = parse(&bytes, origin, options)?;
    drop(bytes);
    from_document(&doc, origin, options)
}

/// Reads the snapshot pickle of `size` bytes in `file` as it is read, never holding the file
/// whole (a second thread reads it while this one parses and converts it); `None` when the
/// file must be read whole and given to [`from_pickle_bytes`] instead, which then gives the
/// same snapshot or reports what is wrong. `origin` names the file in errors.
pub(crate) fn from_pickle_file(
    file: &std::fs::File,
    size: u64,
    origin: &str,
    options: &ImportOptions,
) -> Option<Result<Snapshot, ImportError>> {
    let started = std::time::Instant::now();
    let timed = std::env::var_os(IMPORT_TIMES_ENV).is_some();
    let ready = stream::read_file(file, size, options)?;
    let parsed = started.elapsed();
    let parse_memory = if timed { phase_memory() } else { String::new() };
    let (entries, fast_entries) = (ready.entries, ready.fast_entries);
    let snapshot = ready.convert(origin, options);
    if timed {
        let assembled = started.elapsed() - parsed;
        eprintln!(
            "{origin}: parse and entry conversion {:.3} s ({:.0} MB/s of {size} bytes; {fast_entries} of {entries} trace entries by the fast path{parse_memory}), assembly {:.3} s{}",
            parsed.as_secs_f64(),
            size as f64 / 1e6 / parsed.as_secs_f64(),
            assembled.as_secs_f64(),
            phase_memory()
        );
    }
    Some(snapshot)
}

/// The process's memory as a phase ends, for the phase timings of [`IMPORT_TIMES_ENV`]: the
/// CPU time all its threads spent since the phase before (`, cpu C s`: against the phase's
/// wall time, how many cores it kept busy), its resident memory now and its peak since the
/// phase before (`, rss N MiB, peak M MiB`), the peak being reset after it is read so that the
/// next phase's is its own; empty where `/proc/self/status` cannot be read. A reset peak is
/// also what `getrusage` reports at exit: a run that prints phases is not one to take the
/// process's peak from.
pub fn phase_memory() -> String {
    let Ok(status) = std::fs::read_to_string("/proc/self/status") else {
        return String::new();
    };
    let cpu = process_cpu_ticks().map_or(String::new(), |ticks| {
        let before = CPU_TICKS_AT_PHASE.swap(ticks, std::sync::atomic::Ordering::Relaxed);
        // The kernel's clock ticks, 100 a second on Linux (`USER_HZ`).
        format!(", cpu {:.2} s", ticks.saturating_sub(before) as f64 / 100.0)
    });
    let mib = |key: &str| {
        status
            .lines()
            .find_map(|line| line.strip_prefix(key))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .map(|kib| kib / 1024)
    };
    let _ = std::fs::write("/proc/self/clear_refs", "5");
    match (mib("VmRSS:"), mib("VmHWM:")) {
        (Some(rss), Some(peak)) => format!("{cpu}, rss {rss} MiB, peak {peak} MiB"),
        _ => cpu,
    }
}

/// The process's CPU time at the end of the phase before, in clock ticks ([`phase_memory`]).
static CPU_TICKS_AT_PHASE: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// The user and system time of every thread of this process so far, in clock ticks: the 14th
/// and 15th fields of `/proc/self/stat`, counted after the command name, which is in
/// parentheses and may hold spaces.
fn process_cpu_ticks() -> Option<u64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    let after_name = &stat[stat.rfind(')')? + 1..];
    let mut fields = after_name.split_whitespace().skip(11);
    let user: u64 = fields.next()?.parse().ok()?;
    let system: u64 = fields.next()?.parse().ok()?;
    Some(user + system)
}

/// The environment variable that, set, makes the import of a PyTorch snapshot file print on
/// standard error how long its phases took: the parse with the trace entries' conversion
/// (the parser's core; a second thread reads the file and a third collects the events), and
/// the assembly of the snapshot after it (block sizes, statistics, steps). `vramscope report`
/// then prints its own phases after the import (the analysis, the output). For benchmarks.
pub const IMPORT_TIMES_ENV: &str = "VRAMSCOPE_IMPORT_TIMES";

/// Imports the snapshot pickle that `open` reads, whose length is not known until it ends
/// (what gzip data unpacks to), never holding it whole: its trace entries are streamed as it
/// is read ([`stream`]), else it is read again into a document
/// ([`Document::parse_read`]), which gives the snapshot or the error; either read stops at
/// the pickle's first error. The bounds that scale with a pickle's size follow the bytes read
/// so far. `open` gives the input from its start, each time it is called; `failed` is asked
/// after each read whether the input itself failed (corrupt gzip data, the size limit),
/// which is then the error.
pub(crate) fn from_pickle_reads<'r>(
    open: &mut dyn FnMut() -> Box<dyn std::io::Read + 'r>,
    failed: &dyn Fn() -> Option<ImportError>,
    origin: &str,
    options: &ImportOptions,
) -> Result<Snapshot, ImportError> {
    let ready = stream::read_unsized(&mut *open(), options);
    if let Some(e) = failed() {
        return Err(e);
    }
    if let Some(ready) = ready {
        return ready.convert(origin, options);
    }
    let doc = Document::parse_read(open, &limits(options));
    if let Some(e) = failed() {
        return Err(e);
    }
    let doc = doc.map_err(|e| ImportError::new(origin, ImportErrorKind::Pickle(e)))?;
    from_document(&doc, origin, options)
}

/// The reader's limits for a file read with `options`: the largest input is the larger of
/// the file and unpacked-data limits (a pickle may come out of gzip data); the bounds on
/// memory scale with the input (`Limits::memory_budget`).
pub fn limits(options: &ImportOptions) -> Limits {
    let max_input = options.max_file_bytes.max(options.max_decompressed_bytes);
    Limits::default().with_max_input_bytes(usize::try_from(max_input).unwrap_or(usize::MAX))
}

fn parse(bytes: &[u8], origin: &str, options: &ImportOptions) -> Result<Document, ImportError> {
    Document::parse_with_limits(bytes, &limits(options))
        .map_err(|e| ImportError::new(origin, ImportErrorKind::Pickle(e)))
}

/// The most trace entries a pickle of `input_bytes` bytes may hold: one per 8 bytes of input,
/// and 65,536 more for small files. PyTorch writes 40 bytes or more per entry (a dict of at
/// least four keys); a file of entries that share one dict through its memo, 2 bytes each,
/// would otherwise make 40 bytes of events per byte of input.
pub fn max_trace_entries(input_bytes: usize) -> usize {
    input_bytes / 8 + 65_536
}

/// Fails when the traces of `root` hold more entries, its segments and their blocks more
/// records, or its annotations more, than [`max_trace_entries`] allows. PyTorch writes each
/// as a dict of four keys or more; a file whose lists share one dict through the memo (a
/// segment listed many times, each sharing one list of blocks) would otherwise make a record
/// of every reference, and a block of every pair of them.
fn check_entries(root: ValueRef<'_>, input_bytes: usize) -> Result<(), Fault> {
    let limit = max_trace_entries(input_bytes);
    let count = |list: Option<ValueRef<'_>>, inner: &dyn Fn(ValueRef<'_>) -> Option<usize>| {
        list.and_then(ValueRef::as_seq)
            .into_iter()
            .flat_map(|seq| seq.iter())
            .filter_map(inner)
            .fold(0usize, usize::saturating_add)
    };
    let entries = count(root.get("device_traces"), &|trace| {
        trace.as_seq().map(Seq::len)
    });
    if entries > limit {
        return Err(Fault {
            path: "device_traces".to_string(),
            message: format!(
                "{entries} trace entries in a {input_bytes}-byte pickle, more than the limit of {limit} (one per 8 bytes of input; PyTorch writes 40 bytes or more per entry, so these entries share dicts through the memo and are not a recorded trace)"
            ),
        });
    }
    // Very old files are a bare list of segments.
    let segments = if root.is_dict() {
        root.get("segments")
    } else {
        Some(root)
    };
    let segment_count = segments.and_then(ValueRef::as_seq).map_or(0, Seq::len);
    let blocks = count(segments, &|segment| {
        segment
            .get("blocks")
            .and_then(ValueRef::as_seq)
            .map(Seq::len)
    });
    let records = blocks.saturating_add(segment_count);
    if records > limit {
        return Err(Fault {
            path: "segments".to_string(),
            message: format!(
                "{segment_count} segments and {blocks} blocks in a {input_bytes}-byte pickle, more than the limit of {limit} together (one per 8 bytes of input; PyTorch writes 40 bytes or more per block or segment, so these share dicts through the memo and are not a memory snapshot)"
            ),
        });
    }
    let annotations = root
        .get("external_annotations")
        .and_then(ValueRef::as_seq)
        .map_or(0, Seq::len);
    if annotations > limit {
        return Err(Fault {
            path: "external_annotations".to_string(),
            message: format!(
                "{annotations} annotations in a {input_bytes}-byte pickle, more than the limit of {limit} (one per 8 bytes of input; PyTorch writes 20 bytes or more per annotation, so these share dicts through the memo and are not recorded annotations)"
            ),
        });
    }
    Ok(())
}

/// Converts an already read snapshot pickle; `origin` names the data in errors.
pub fn from_document(
    doc: &Document,
    origin: &str,
    options: &ImportOptions,
) -> Result<Snapshot, ImportError> {
    check_entries(doc.root(), doc.input_bytes())
        .and_then(|()| convert(doc.root(), doc.input_bytes(), options))
        .map_err(|fault| {
            ImportError::new(
                origin,
                ImportErrorKind::Structure {
                    path: fault.path,
                    message: fault.message,
                },
            )
        })
}

/// A structural problem at a path of the pickle.
struct Fault {
    path: String,
    message: String,
}

/// Where in the pickle a value lies, for error paths.
#[derive(Clone, Copy)]
enum Loc {
    Root,
    Segment(usize),
    Block(usize, usize),
    Entry(usize, usize),
    Annotation(usize),
}

impl fmt::Display for Loc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Loc::Root => Ok(()),
            Loc::Segment(i) => write!(f, "segments[{i}]"),
            Loc::Block(i, j) => write!(f, "segments[{i}].blocks[{j}]"),
            Loc::Entry(d, i) => write!(f, "device_traces[{d}][{i}]"),
            Loc::Annotation(i) => write!(f, "external_annotations[{i}]"),
        }
    }
}

impl Loc {
    fn key(self, key: &str) -> String {
        match self {
            Loc::Root => key.to_string(),
            _ => format!("{self}.{key}"),
        }
    }

    fn fault(self, key: &str, message: impl Into<String>) -> Fault {
        Fault {
            path: self.key(key),
            message: message.into(),
        }
    }

    fn wrong<'d>(self, key: &str, expected: &str, found: impl EntryValue<'d>) -> Fault {
        self.fault(
            key,
            format!("expected {expected}, found {}", found.type_name()),
        )
    }
}

/// Checks that `value` at `loc` is a dict.
fn dict(value: ValueRef<'_>, loc: Loc) -> Result<ValueRef<'_>, Fault> {
    if value.is_dict() {
        Ok(value)
    } else {
        Err(Fault {
            path: loc.to_string(),
            message: format!("expected a dict, found {}", value.type_name()),
        })
    }
}

/// The values under `keys` in the dict `obj`, in the order of `keys`, with `None` values
/// treated as absent. A key set twice counts with its last value, as in Python.
fn fields<'d, const N: usize>(obj: ValueRef<'d>, keys: [&str; N]) -> [Option<ValueRef<'d>>; N] {
    let mut found = [None; N];
    if let Some(pairs) = obj.dict_items() {
        for (k, v) in pairs {
            if let Some(i) = k
                .as_str()
                .and_then(|k| keys.iter().position(|&key| key == k))
            {
                found[i] = Some(v);
            }
        }
    }
    found.map(|v| v.filter(|v| !v.is_none()))
}

/// An annotation before its time is made relative.
struct RawAnnotation {
    name: String,
    stage: String,
    device: u32,
    time_us: Option<u64>,
}

/// Reads the annotation at `loc`, adding the bytes of its text to `text_bytes`, which may not
/// pass `max_text_bytes`: a file that shares one long name among many annotations through
/// the memo would otherwise make a copy of it per annotation (and per step it starts).
fn read_annotation(
    value: ValueRef<'_>,
    loc: Loc,
    text_bytes: &mut usize,
    max_text_bytes: usize,
) -> Result<RawAnnotation, Fault> {
    let value = dict(value, loc)?;
    let [name, stage, device, time_us] = fields(value, ["name", "stage", "device", "time_us"]);
    let name = opt_str(name, "name", loc)?.unwrap_or_default();
    let stage = opt_str(stage, "stage", loc)?.unwrap_or_default();
    *text_bytes = text_bytes.saturating_add(name.len() + stage.len());
    if *text_bytes > max_text_bytes {
        return Err(loc.fault(
            "name",
            format!(
                "the annotations' names hold more than {} MiB (the limit for this file: 64 MiB and 8 bytes per byte of the file; a name the file shares is copied into every annotation that holds it)",
                max_text_bytes >> 20
            ),
        ));
    }
    Ok(RawAnnotation {
        name: name.to_string(),
        stage: stage.to_string(),
        device: device_index(opt_u64(device, "device", loc)?.unwrap_or(0), "device", loc)?,
        time_us: opt_time_us(time_us, "time_us", loc)?,
    })
}

fn block_state(text: &str) -> Option<BlockState> {
    match text {
        "active_allocated" => Some(BlockState::ActiveAllocated),
        "active_pending_free" => Some(BlockState::ActivePendingFree),
        "inactive" => Some(BlockState::Inactive),
        _ => None,
    }
}

/// Checks that the blocks of `segment` (sorted by address), the segment at `loc`, lie inside
/// it and apart ([`Segment::misplaced_block`]).
fn check_blocks_placed(segment: &Segment, loc: Loc) -> Result<(), Fault> {
    let Some((i, placement)) = segment.misplaced_block() else {
        return Ok(());
    };
    let block = &segment.blocks[i];
    let why = match placement {
        BlockPlacement::OutsideSegment => format!(
            "lies outside its segment, {:#x} to {:#x}",
            segment.address,
            segment.address.saturating_add(segment.total_size)
        ),
        BlockPlacement::Overlaps { previous_end } => {
            format!("overlaps the block before it, which ends at {previous_end:#x}")
        }
    };
    Err(loc.fault(
        "blocks",
        format!(
            "the block at {:#x} ({} bytes) {why}; the file is inconsistent",
            block.address, block.size
        ),
    ))
}

/// Checks that no two segments of a device (sorted by device and address) overlap; `places`
/// gives each segment's place in the file, for the error.
fn check_segments_apart(segments: &[Segment], places: &[usize]) -> Result<(), Fault> {
    let Some(i) = overlapping_segment(segments) else {
        return Ok(());
    };
    let (before, after) = (&segments[i - 1], &segments[i]);
    Err(Loc::Segment(places[i]).fault(
        "address",
        format!(
            "the segment at {:#x} overlaps segments[{}] ({:#x} to {:#x}) on device {}; the file is inconsistent",
            after.address,
            places[i - 1],
            before.address,
            before.address.saturating_add(before.total_size),
            after.device
        ),
    ))
}

/// Where and when each live block was last allocated in the trace, by device and address (a
/// map seeded per process: the addresses are the file's, `vramscope_engine::AddrState`).
type LastAlloc =
    std::collections::HashMap<(u32, u64), (Option<SiteId>, u64), vramscope_engine::AddrState>;

fn read_segment(
    value: ValueRef<'_>,
    i: usize,
    stacks: &mut Stacks,
    last_alloc: &LastAlloc,
    figures: &mut Figures,
) -> Result<Segment, Fault> {
    let loc = Loc::Segment(i);
    let value = dict(value, loc)?;
    let [device, address, total_size, segment_type, is_expandable, blocks, stream] = fields(
        value,
        [
            "device",
            "address",
            "total_size",
            "segment_type",
            "is_expandable",
            "blocks",
            "stream",
        ],
    );
    let device = device_index(opt_u64(device, "device", loc)?.unwrap_or(0), "device", loc)?;
    let address = need_u64(address, "address", loc)?;
    let total_size = need_u64(total_size, "total_size", loc)?;
    figures.range(address, total_size, loc, "address", "total_size")?;
    let pool = match opt_str(segment_type, "segment_type", loc)? {
        Some("small") => Pool::Small,
        Some(_) => Pool::Large,
        None if total_size == vramscope_model::pytorch::SMALL_BUFFER => Pool::Small,
        None => Pool::Large,
    };
    let expandable = match is_expandable {
        None => false,
        Some(v) => v
            .as_bool()
            .ok_or_else(|| loc.wrong("is_expandable", "a bool", v))?,
    };
    let mut blocks_out = Vec::new();
    let mut next_address = address;
    for (j, block) in elements(opt_seq(blocks, "blocks", loc)?).enumerate() {
        let loc = Loc::Block(i, j);
        let block = dict(block, loc)?;
        let [size, block_address, state, requested_size, frames, history] = fields(
            block,
            [
                "size",
                "address",
                "state",
                "requested_size",
                "frames",
                "history",
            ],
        );
        let size = need_u64(size, "size", loc)?;
        // Blocks of older files have no address: they follow one another from the segment's.
        let block_address = opt_u64(block_address, "address", loc)?.unwrap_or(next_address);
        figures.range(block_address, size, loc, "address", "size")?;
        next_address = block_address.saturating_add(size);
        let state_text = need_str(state, "state", loc)?;
        let state = block_state(state_text)
            .ok_or_else(|| loc.fault("state", format!("unknown block state `{state_text}`")))?;
        let requested_size = match opt_u64(requested_size, "requested_size", loc)? {
            Some(r) => r,
            None if state == BlockState::Inactive => 0,
            None => size,
        };
        // Older files keep the stack in the last entry of `history`.
        let frames = match frames {
            Some(frames) => Some(frames),
            None => opt_seq(history, "history", loc)?
                .and_then(Seq::last)
                .and_then(|h| h.get("frames")),
        };
        let mut site = stacks.site(frames, loc)?;
        let mut step = 0;
        if state != BlockState::Inactive {
            if let Some(&(alloc_site, alloc_step)) = last_alloc.get(&(device, block_address)) {
                site = site.or(alloc_site);
                step = alloc_step;
            }
        }
        blocks_out.push(Block {
            address: block_address,
            size,
            requested_size,
            state,
            site,
            tag: None,
            scope: None,
            step,
            thread: 0,
        });
    }
    blocks_out.sort_by_key(|b| b.address);
    let segment = Segment {
        device,
        address,
        total_size,
        stream: opt_stream(stream, "stream", loc)?,
        pool,
        expandable,
        blocks: blocks_out,
    };
    check_blocks_placed(&segment, loc)?;
    Ok(segment)
}

/// Reads `allocator_settings` on top of the defaults, ignoring unknown keys and values.
fn read_config(settings: Option<&Value>) -> AllocatorConfig {
    let mut config = AllocatorConfig::default();
    let Some(settings) = settings.filter(|s| s.as_dict().is_some()) else {
        return config;
    };
    if let Some(text) = settings
        .get("PYTORCH_CUDA_ALLOC_CONF")
        .and_then(Value::as_str)
    {
        for entry in text.split(',') {
            if let Some((key, value)) = entry.split_once(':') {
                // PyTorch accepts keys vramscope does not model (`backend`, ...): skip them.
                let _ = config.set(key.trim(), value.trim());
            }
        }
    }
    if let Some(v) = settings.get("max_split_size").and_then(Value::as_i64) {
        // PyTorch reports "unlimited" as -1 (SIZE_MAX).
        config.max_split_size = (v > 0).then_some(v as u64);
    }
    if let Some(t) = settings
        .get("garbage_collection_threshold")
        .and_then(Value::as_f64)
    {
        config.garbage_collection_threshold = (t > 0.0 && t < 1.0).then_some(t);
    }
    if let Some(b) = settings.get("expandable_segments").and_then(Value::as_bool) {
        config.expandable_segments = b;
    }
    let divisions = match settings.get("roundup_power2_divisions") {
        Some(Value::Int(i)) => Some(*i),
        // Per-size divisions: vramscope keeps one figure, the largest.
        Some(Value::Dict(pairs)) => pairs.iter().filter_map(|(_, v)| v.as_i64()).max(),
        _ => None,
    };
    if let Some(d) = divisions.and_then(|d| u32::try_from(d).ok()) {
        if d == 0 || (d.is_power_of_two() && d <= 64) {
            config.roundup_power2_divisions = d;
        }
    }
    config
}

/// Picks the annotation family that marks steps and returns its `START` times.
fn annotation_steps(annotations: &[Annotation], chosen: Option<&str>) -> Vec<(u64, String)> {
    let is_start = |a: &&Annotation| a.stage.eq_ignore_ascii_case("START");
    let family: Option<String> = match chosen {
        Some(name) => Some(name.to_string()),
        None => vramscope_model::pytorch::STEP_ANNOTATIONS
            .iter()
            .find(|p| {
                annotations
                    .iter()
                    .filter(is_start)
                    .any(|a| a.name.starts_with(**p))
            })
            .map(|p| p.to_string())
            // vramscope's own marks (`attach()`'s module calls and phases) are no steps.
            .or_else(|| {
                annotations
                    .iter()
                    .filter(is_start)
                    .find(|a| !vramscope_model::marks::is_mark(&a.name))
                    .map(|a| a.name.clone())
            }),
    };
    let Some(family) = family else {
        return Vec::new();
    };
    annotations
        .iter()
        .filter(is_start)
        .filter(|a| a.name.starts_with(&family))
        .map(|a| (a.time_ns, a.name.clone()))
        .collect()
}

/// Step starts at allocations whose stack enters `marker` after one whose stack did not.
fn marker_steps(events: &[Event], stacks: &Stacks, marker: &str) -> Vec<(usize, String)> {
    let mut memo: FxHashMap<SiteId, bool> = FxHashMap::default();
    let mut inside = false;
    let mut starts = Vec::new();
    for (i, e) in events.iter().enumerate() {
        if e.kind != EventKind::Alloc {
            continue;
        }
        let has = e.site().is_some_and(|id| {
            *memo.entry(id).or_insert_with(|| {
                stacks
                    .table
                    .get(id)
                    .is_some_and(|s| s.frames.iter().any(|f| f.function == marker))
            })
        });
        if has && !inside {
            starts.push((i, marker.to_string()));
        }
        inside = has;
    }
    starts
}

/// The top-level parts of a snapshot pickle.
struct Parts<'d> {
    segments: Option<Seq<'d>>,
    traces: Option<Seq<'d>>,
    settings: Option<ValueRef<'d>>,
    annotations: Option<Seq<'d>>,
}

/// Finds the parts of the snapshot `root`: a dict with `segments` and `device_traces`, or a
/// bare list of segments (very old files).
fn parts(root: ValueRef<'_>) -> Result<Parts<'_>, Fault> {
    if root.type_name() == "list" {
        return Ok(Parts {
            segments: root.as_seq(),
            traces: None,
            settings: None,
            annotations: None,
        });
    }
    if !root.is_dict() {
        return Err(Fault {
            path: String::new(),
            message: format!(
                "not a PyTorch memory snapshot: expected a dict with `segments` and `device_traces`, found {}",
                root.type_name()
            ),
        });
    }
    let [segments, traces, settings, annotations] = fields(
        root,
        [
            "segments",
            "device_traces",
            "allocator_settings",
            "external_annotations",
        ],
    );
    if root.get("segments").is_none() && root.get("device_traces").is_none() {
        return Err(Fault {
            path: String::new(),
            message:
                "not a PyTorch memory snapshot: the dict has neither `segments` nor `device_traces`"
                    .to_string(),
        });
    }
    Ok(Parts {
        segments: opt_seq(segments, "segments", Loc::Root)?,
        traces: opt_seq(traces, "device_traces", Loc::Root)?,
        settings,
        annotations: opt_seq(annotations, "external_annotations", Loc::Root)?,
    })
}

/// The events of every device's trace, in file order, their times not yet relative (see
/// [`read_entry`]).
struct TraceEvents {
    events: Vec<Event>,
    /// The earliest time of an event that has one (see [`read_entry`]), noted as each is read.
    earliest_us: Option<u64>,
    /// How many devices have a trace entry.
    devices_with_events: usize,
    /// The lowest device that has one.
    first_device: Option<u32>,
    /// The events' pairs and last allocations, worked out while they were read when all are
    /// on one device (`collect`).
    one_device: Option<collect::OneDevice>,
}

/// Reads the entries of `device_traces`, one list per device.
fn read_traces(
    traces: Option<Seq<'_>>,
    stacks: &mut Stacks,
    figures: &mut Figures,
) -> Result<TraceEvents, Fault> {
    let mut keys = EntryKeys::default();
    let mut out = TraceEvents {
        events: Vec::new(),
        earliest_us: None,
        devices_with_events: 0,
        first_device: None,
        one_device: None,
    };
    for (d, trace) in elements(traces).enumerate() {
        let entries = trace.as_seq().ok_or_else(|| Fault {
            path: format!("device_traces[{d}]"),
            message: format!("expected a list, found {}", trace.type_name()),
        })?;
        if entries.is_empty() {
            continue;
        }
        let device = vramscope_model::event_device(d as u64).ok_or_else(|| Fault {
            path: format!("device_traces[{d}]"),
            message: vramscope_model::device_refusal(d as u64),
        })?;
        out.devices_with_events += 1;
        let index = u32::from(device);
        out.first_device = Some(out.first_device.map_or(index, |f| f.min(index)));
        out.events.reserve(entries.len());
        for (i, entry) in entries.iter().enumerate() {
            let loc = Loc::Entry(d, i);
            if let Some(e) = read_entry(entry, device, loc, &mut keys, stacks, figures)? {
                note_time(&mut out.earliest_us, &e);
                out.events.push(e);
            }
        }
    }
    Ok(out)
}

fn convert(
    root: ValueRef<'_>,
    input_bytes: usize,
    options: &ImportOptions,
) -> Result<Snapshot, Fault> {
    let parts = parts(root)?;
    let mut stacks = Stacks::new(&options.framework_paths, input_bytes);
    let mut figures = Figures::default();
    let traces = read_traces(parts.traces, &mut stacks, &mut figures)?;
    finish(parts, traces, stacks, figures, options)
}

/// Gives every event of a snapshot with several devices' traces its block size by sizing
/// each device's events and segments on their own (`vramscope_replay::size_blocks_visiting`),
/// as PyTorch keeps an allocator per device: a free on one device never pairs with an
/// allocation at the same address on another, and each device's replay can make that
/// device's own calls. Each device's events are copied for its sizing and their sizes written
/// back, so a file of several devices takes their events' memory once more while it is sized.
fn size_blocks_per_device(snapshot: &mut Snapshot, report: &mut dyn FnMut(usize, usize)) {
    // The snapshot has events, so these are the devices with events.
    for device in vramscope_engine::devices::devices_with_data(snapshot) {
        let positions = vramscope_engine::devices::event_indices(snapshot, device);
        let mut part = Snapshot::empty(
            snapshot.source,
            DeviceInfo {
                index: device,
                ..snapshot.device.clone()
            },
        );
        part.config = snapshot.config.clone();
        part.segments = snapshot
            .segments
            .iter()
            .filter(|s| s.device == device)
            .cloned()
            .collect();
        part.events = positions.iter().map(|&i| snapshot.events[i]).collect();
        vramscope_replay::size_blocks_visiting(&mut part, None, report, &mut |_, _, _| {});
        for (sized, &i) in part.events.iter().zip(&positions) {
            let e = &mut snapshot.events[i];
            e.size = sized.size;
            e.requested = sized.requested;
        }
    }
}

#[cfg(test)]
mod tests;
