//! Exporters: the one model out to the formats other tools read.
//!
//! [`to_pytorch_pickle`] writes a `torch.cuda.memory._dump_snapshot()`-shaped pickle (keys and
//! value types as PyTorch writes them), so PyTorch's memory_viz page and
//! `python -m torch.cuda._memory_viz` open vramscope snapshots; steps become
//! `ProfilerStep#N` annotations. The model does not keep everything a PyTorch snapshot holds
//! (segment `frames`, `compile_context` and `user_metadata` on trace entries, entries of kinds
//! it does not read, every `allocator_settings` key with its original type, the original
//! times): [`PytorchExtras`] finds those in what the import kept of the source pickle while
//! it streamed it ([`PytorchExtras::from_kept`], so that the file is parsed once) or in the
//! source's whole document ([`PytorchExtras::from_document`]), and [`to_pytorch_pickle_with`]
//! writes the model's values with them, so that a PyTorch pickle converted to PyTorch's format
//! comes back key for key and value for value.
//!
//! A snapshot from another source is written so that the pickle imports again to the same
//! figures (start state, usage and peaks, end state, step labels): without a dump-time state of
//! its own, the engine's end state is written as the `segments` (memory from before the trace
//! that the source knows only as totals included, as one block in a segment of its own); frees
//! recorded only as completions are written as PyTorch writes every free, a `free_requested`
//! and a `free_completed`; steps keep their labels where the importer takes them back.
//! [`export_pytorch`] also says, one line each, what the pickle cannot carry (copies, syncs, the
//! device's capacity, what it had to make up, ...), which `vramscope convert` prints; the
//! `carry` submodule holds those rules.
//!
//! [`write_perfetto`] (in the `perfetto` submodule) streams Chrome trace JSON that
//! ui.perfetto.dev opens, one event at a time (memory is the allocations' intervals, never a
//! document of the output): a counter track for allocated and reserved bytes, each allocation
//! a slice on a track of its stream where it nests (a slice starts after and ends before the
//! slice it sits in; allocations that overlap without nesting go to another lane of the
//! stream), step slices on their own track, call sites in the args. Our own JSON is
//! `Snapshot::save`. The CLI's `vramscope convert` is glue over these functions.
//!
//! Every figure that comes from a file is added with checked arithmetic: a sum past 2^64 bytes
//! is an [`ExportError`] naming the field, never a wrapped number or a panic.

use std::fmt;

use rustc_hash::FxHashMap;
use vramscope_model::pytorch::action_name;
use vramscope_model::{
    AllocatorConfig, BlockState, CallSite, Event, EventKind, Pool, Segment, SiteId, Snapshot,
    SnapshotSource,
};

use vramscope_import::pytorch::{EntryShape, KeptValue};
use vramscope_pickle::{Document, MemoRef, PickleWriter, ValueRef};

/// Why an export failed: a figure of the snapshot out of range (with the field's path), or
/// writing the output failed.
#[derive(Debug)]
pub enum ExportError {
    /// A figure, or a sum of figures, does not fit in 64 bits.
    Overflow {
        /// Where, as a path into the snapshot (`segments[3].blocks`, `events[17].size`).
        path: String,
        /// What overflowed.
        what: &'static str,
    },
    /// Writing the output failed.
    Io(std::io::Error),
    /// Reading the source file again for what the model does not keep failed.
    Source(vramscope_import::ImportError),
    /// The snapshot does not fit the limits within which a PyTorch snapshot pickle is read
    /// back (the importer's), said as a sentence.
    Limit {
        /// What does not fit.
        what: String,
    },
    /// A range of steps to convert that the trace does not have, said as a sentence.
    Steps {
        /// What is wrong, with the steps the trace has.
        what: String,
    },
}

impl fmt::Display for ExportError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ExportError::Overflow { path, what } => write!(
                f,
                "at {path}: {what} passes 2^64 bytes; the snapshot's figures are inconsistent"
            ),
            ExportError::Io(e) => write!(f, "cannot write: {e}"),
            ExportError::Source(e) => write!(f, "{e}"),
            ExportError::Limit { what } => {
                write!(f, "cannot be written as a PyTorch snapshot: {what}")
            }
            ExportError::Steps { what } => write!(f, "{what}"),
        }
    }
}

impl std::error::Error for ExportError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ExportError::Io(e) => Some(e),
            ExportError::Source(e) => Some(e),
            ExportError::Overflow { .. }
            | ExportError::Limit { .. }
            | ExportError::Steps { .. } => None,
        }
    }
}

impl From<std::io::Error> for ExportError {
    fn from(e: std::io::Error) -> Self {
        ExportError::Io(e)
    }
}

/// `a + b`, or an overflow error about `what` at `path`.
fn add(
    a: u64,
    b: u64,
    path: impl FnOnce() -> String,
    what: &'static str,
) -> Result<u64, ExportError> {
    a.checked_add(b)
        .ok_or_else(|| ExportError::Overflow { path: path(), what })
}

/// Writes stacks once and shares them through the memo afterwards.
struct Frames<'a> {
    sites: &'a [CallSite],
    written: FxHashMap<SiteId, MemoRef>,
    strings: FxHashMap<String, MemoRef>,
    empty: Option<MemoRef>,
}

impl Frames<'_> {
    fn write(&mut self, w: &mut PickleWriter, site: Option<SiteId>) {
        let Some(call_site) = site.and_then(|id| self.sites.get(id as usize)) else {
            match self.empty {
                Some(slot) => w.get(slot),
                None => {
                    w.begin_list();
                    w.end_list();
                    self.empty = Some(w.memoize());
                }
            }
            return;
        };
        let id = site.unwrap_or_default();
        if let Some(&slot) = self.written.get(&id) {
            w.get(slot);
            return;
        }
        w.begin_list();
        if call_site.frames.is_empty() {
            self.frame(w, &call_site.file, call_site.line, &call_site.function);
        } else {
            for frame in &call_site.frames {
                self.frame(w, &frame.file, frame.line, &frame.function);
            }
        }
        w.end_list();
        let slot = w.memoize();
        self.written.insert(id, slot);
    }

    fn frame(&mut self, w: &mut PickleWriter, file: &str, line: u32, name: &str) {
        // In PyTorch's order of keys.
        w.begin_dict();
        w.shared_str("name", &mut self.strings);
        w.shared_str(name, &mut self.strings);
        w.shared_str("filename", &mut self.strings);
        w.shared_str(file, &mut self.strings);
        w.shared_str("line", &mut self.strings);
        w.uint(line as u64);
        w.end_dict();
    }
}

/// Writes values of a source pickle, sharing the containers the source shares (by identity)
/// and repeated strings through the memo.
#[derive(Default)]
struct Values {
    containers: FxHashMap<usize, MemoRef>,
    /// The memo slot of each source string written, by its identity: the slot `shared_str`
    /// finds by its text, found without hashing the text.
    strings: FxHashMap<usize, MemoRef>,
}

impl Values {
    fn write(
        &mut self,
        w: &mut PickleWriter,
        strings: &mut FxHashMap<String, MemoRef>,
        v: ValueRef<'_>,
    ) {
        let kind = v.type_name();
        let container = matches!(kind, "list" | "tuple" | "dict" | "set" | "frozenset");
        let identity = if container { v.identity() } else { None };
        if let Some(&slot) = identity.and_then(|id| self.containers.get(&id)) {
            w.get(slot);
            return;
        }
        match kind {
            "None" => w.none(),
            "bool" => w.bool(v.as_bool().unwrap_or(false)),
            "int" => match (v.as_i64(), v.big_int_bytes()) {
                (Some(i), _) => w.int(i),
                (None, Some(bytes)) => w.long_bytes(bytes),
                (None, None) => w.uint(v.as_u64().unwrap_or(0)),
            },
            "float" => w.float(v.as_float().unwrap_or(0.0)),
            "str" => match v.identity() {
                Some(id) => match self.strings.get(&id) {
                    Some(&slot) => w.get(slot),
                    None => {
                        let slot = w.shared_str_slot(v.as_str().unwrap_or(""), strings);
                        self.strings.insert(id, slot);
                    }
                },
                None => w.shared_str(v.as_str().unwrap_or(""), strings),
            },
            "bytes" => w.bytes(v.as_bytes().unwrap_or(&[])),
            "dict" => {
                w.begin_dict();
                for (key, value) in v.dict_items().into_iter().flatten() {
                    self.write(w, strings, key);
                    self.write(w, strings, value);
                }
                w.end_dict();
            }
            _ => {
                let items = v.elements().into_iter().flat_map(|s| s.iter());
                match kind {
                    "list" => w.begin_list(),
                    "tuple" => w.begin_tuple(),
                    "set" => w.begin_set(),
                    _ => w.begin_frozenset(),
                }
                for item in items {
                    self.write(w, strings, item);
                }
                match kind {
                    "list" => w.end_list(),
                    "tuple" => w.end_tuple(),
                    "set" => w.end_set(),
                    _ => w.end_frozenset(),
                }
            }
        }
        if let Some(id) = identity {
            let slot = w.memoize();
            self.containers.insert(id, slot);
        }
    }
}

/// A segment of the source: its dict and its blocks' dicts by address.
struct SourceSegment<'d> {
    value: ValueRef<'d>,
    blocks: vramscope_engine::AddrMap<ValueRef<'d>>,
}

/// One entry of a source trace: an event the model kept, or one it did not read, to be
/// written again in its place.
#[derive(Clone, Copy)]
struct Entry<'d> {
    value: ValueRef<'d>,
    event: bool,
}

/// What a PyTorch snapshot pickle holds that the model does not keep, found again in the
/// source's [`Document`] so that [`to_pytorch_pickle_with`] writes it back: every dict's keys
/// in their order and the values the model has no place for (segment and block `frames`,
/// `segment_pool_id`, `compile_context`, `user_metadata`, unknown keys and trace entries of
/// unknown kinds, all of `allocator_settings` with their original types) and the epoch the
/// file's times count from. It refers to the document's values without copying them: a few
/// bytes per trace entry beside the document.
pub struct PytorchExtras<'d> {
    root: ValueRef<'d>,
    segments: std::collections::HashMap<(u64, u64), SourceSegment<'d>, vramscope_engine::AddrState>,
    /// Per device, the trace's entries in order.
    traces: SourceTraces<'d>,
    annotations: Vec<ValueRef<'d>>,
    /// The earliest time in the file in microseconds, which the model's times count from.
    epoch_us: u64,
}

/// The trace entries of a source: as values of its document, or as the shapes the import kept
/// of them ([`vramscope_import::pytorch::KeptSource`]), each an entry the importer read.
enum SourceTraces<'d> {
    Doc(Vec<Vec<Entry<'d>>>),
    Kept(&'d [Vec<u32>], &'d vramscope_import::pytorch::KeptSource),
}

impl SourceTraces<'_> {
    /// The number of trace lists.
    fn len(&self) -> usize {
        match self {
            SourceTraces::Doc(t) => t.len(),
            SourceTraces::Kept(t, _) => t.len(),
        }
    }
}

/// A source entry to write an event with: a value of the source's document, or the shape the
/// import kept of it.
#[derive(Clone, Copy)]
enum Source<'a> {
    Doc(ValueRef<'a>),
    Kept(&'a EntryShape),
}

/// Whether a trace entry is one the importer reads into an event.
fn read_action(entry: ValueRef<'_>) -> bool {
    entry
        .get("action")
        .and_then(ValueRef::as_str)
        .and_then(vramscope_model::pytorch::action_kind)
        .is_some()
}

/// A time in microseconds as the importer reads it (an integer or a float; negative is 0).
fn time_us_of(v: ValueRef<'_>) -> Option<u64> {
    let v = v.get("time_us")?;
    if let Some(i) = v.as_i64() {
        return Some(i.max(0) as u64);
    }
    match v.as_float() {
        Some(f) if f.is_finite() => Some(f.max(0.0) as u64),
        _ => v.as_u64(),
    }
}

/// The elements of the list under `key` in `v`, if any.
fn list_at<'d>(v: ValueRef<'d>, key: &str) -> impl Iterator<Item = ValueRef<'d>> {
    v.get(key)
        .and_then(ValueRef::as_seq)
        .into_iter()
        .flat_map(|s| s.iter())
}

impl<'d> PytorchExtras<'d> {
    /// Finds the extras in a PyTorch snapshot pickle, or `None` when `doc` is not one (a dict
    /// with `segments` or `device_traces`).
    pub fn from_document(doc: &'d Document) -> Option<PytorchExtras<'d>> {
        Self::from_parts(doc, None)
    }

    /// Finds the extras in what the import kept of a PyTorch snapshot pickle it streamed
    /// (`ImportOptions::keep_source`), without reading the file again: the same extras as
    /// [`PytorchExtras::from_document`] of the file's whole document, so that the same pickle
    /// is written.
    pub fn from_kept(kept: &'d vramscope_import::pytorch::KeptSource) -> Option<PytorchExtras<'d>> {
        Self::from_parts(kept.document(), Some(kept))
    }

    fn from_parts(
        doc: &'d Document,
        kept: Option<&'d vramscope_import::pytorch::KeptSource>,
    ) -> Option<PytorchExtras<'d>> {
        let root = doc.root();
        if !root.is_dict()
            || (root.get("segments").is_none() && root.get("device_traces").is_none())
        {
            return None;
        }
        let mut segments = std::collections::HashMap::default();
        for seg in list_at(root, "segments").filter(|s| s.is_dict()) {
            let field = |key| seg.get(key).and_then(ValueRef::as_u64);
            let key = (field("device").unwrap_or(0), field("address").unwrap_or(0));
            let mut blocks = vramscope_engine::AddrMap::default();
            let mut next = key.1;
            for block in list_at(seg, "blocks").filter(|b| b.is_dict()) {
                let field = |key| block.get(key).and_then(ValueRef::as_u64);
                let address = field("address").unwrap_or(next);
                next = address.saturating_add(field("size").unwrap_or(0));
                blocks.insert(address, block);
            }
            segments.insert(key, SourceSegment { value: seg, blocks });
        }
        let mut epoch: Option<u64> = None;
        let mut earliest = |t: Option<u64>| {
            if let Some(t) = t {
                epoch = Some(epoch.map_or(t, |e| e.min(t)));
            }
        };
        let traces = match kept.and_then(|k| k.traces().map(|t| (t, k))) {
            Some((lists, kept)) => {
                earliest(kept.earliest_us());
                SourceTraces::Kept(lists, kept)
            }
            None => {
                let mut traces = Vec::new();
                for trace in list_at(root, "device_traces") {
                    let mut entries = Vec::new();
                    for value in trace.as_seq().into_iter().flat_map(|s| s.iter()) {
                        let event = value.is_dict() && read_action(value);
                        if event {
                            earliest(time_us_of(value));
                        }
                        entries.push(Entry { value, event });
                    }
                    traces.push(entries);
                }
                SourceTraces::Doc(traces)
            }
        };
        let mut annotations = Vec::new();
        for a in list_at(root, "external_annotations") {
            if a.is_dict() {
                earliest(time_us_of(a));
            }
            annotations.push(a);
        }
        Some(PytorchExtras {
            root,
            segments,
            traces,
            annotations,
            epoch_us: epoch.unwrap_or(0),
        })
    }
}

/// Reads the file at `path` again as a pickle document when it is a PyTorch snapshot pickle
/// (plain or gzip), within the limits of `options`; `Ok(None)` for any other format.
pub fn read_source(
    path: &std::path::Path,
    options: &vramscope_import::ImportOptions,
) -> Result<Option<Document>, vramscope_import::ImportError> {
    use vramscope_import::{ImportError, ImportErrorKind};
    let origin = path.display().to_string();
    let io = |e| ImportError::new(&origin, ImportErrorKind::Io(e));
    let bytes = std::fs::read(path).map_err(io)?;
    let bytes = if bytes.starts_with(&[0x1f, 0x8b]) {
        let mut out = Vec::new();
        let limit = options.max_decompressed_bytes;
        std::io::Read::read_to_end(
            &mut std::io::Read::take(flate2::read::MultiGzDecoder::new(&bytes[..]), limit),
            &mut out,
        )
        .map_err(|e| ImportError::new(&origin, ImportErrorKind::Gzip(e)))?;
        out
    } else {
        bytes
    };
    if bytes.first() != Some(&0x80) {
        return Ok(None);
    }
    let doc = Document::parse_with_limits(&bytes, &vramscope_import::pytorch::limits(options))
        .map_err(|e| ImportError::new(&origin, ImportErrorKind::Pickle(e)))?;
    Ok(Some(doc))
}

/// Writes a dict whose keys are `source`'s, in its order and each once (as Python holds it),
/// when there is a source dict, else `model_keys`. A key the model writes takes the model's
/// value (`write_model` writes it); any other key of the source keeps the source's value.
fn write_fields(
    out: &mut Out<'_>,
    source: Option<ValueRef<'_>>,
    model_keys: &[&str],
    write_model: &mut WriteModel<'_>,
) -> Result<(), ExportError> {
    out.w.begin_dict();
    // Each key once, as Python holds the dict: a key the model writes is written once even
    // when a hostile file repeats it thousands of times.
    match source.and_then(ValueRef::python_dict_items) {
        Some(items) => {
            for (key, value) in items {
                match key.as_str() {
                    Some(k) if model_keys.contains(&k) => {
                        out.w.shared_str(k, out.strings);
                        write_model(out, k)?;
                    }
                    _ => {
                        out.values.write(out.w, out.strings, key);
                        out.values.write(out.w, out.strings, value);
                    }
                }
            }
        }
        None => {
            for key in model_keys {
                out.w.shared_str(key, out.strings);
                write_model(out, key)?;
            }
        }
    }
    out.w.end_dict();
    Ok(())
}

/// What writing a pickle needs at hand: the writer, and the memo slots of the values and
/// strings written so far.
struct Out<'a> {
    w: &'a mut PickleWriter,
    values: &'a mut Values,
    strings: &'a mut FxHashMap<String, MemoRef>,
    /// Where a streaming export passes the bytes on, every [`PickleWriter::CHUNK`] or so.
    sink: Option<&'a mut dyn std::io::Write>,
}

impl Out<'_> {
    /// Passes the bytes written so far on to the sink once there are a chunk of them.
    #[inline]
    fn spill(&mut self) -> Result<(), ExportError> {
        if let Some(sink) = self.sink.as_mut() {
            if self.w.pending() >= PickleWriter::CHUNK {
                self.w.drain_into(&mut **sink)?;
            }
        }
        Ok(())
    }
}

/// Writes the model's value of a key.
type WriteModel<'a> = dyn FnMut(&mut Out<'_>, &str) -> Result<(), ExportError> + 'a;

fn write_settings(w: &mut PickleWriter, config: &AllocatorConfig) {
    w.begin_dict();
    w.str("PYTORCH_CUDA_ALLOC_CONF");
    w.str(&config.to_string());
    w.str("max_split_size");
    match config.max_split_size {
        Some(bytes) => w.uint(bytes),
        None => w.int(-1),
    }
    w.str("garbage_collection_threshold");
    w.float(config.garbage_collection_threshold.unwrap_or(0.0));
    w.str("expandable_segments");
    w.bool(config.expandable_segments);
    w.str("roundup_power2_divisions");
    w.uint(config.roundup_power2_divisions as u64);
    w.end_dict();
}

/// The size PyTorch records for an event: what was requested for a block event (the model's
/// `size` is the block's), the size itself for segment events.
fn recorded_size(event: &Event) -> u64 {
    match event.kind {
        EventKind::Alloc | EventKind::FreeRequested | EventKind::FreeCompleted
            if event.requested > 0 =>
        {
            event.requested
        }
        _ => event.size,
    }
}

/// The snapshot as a PyTorch snapshot pickle (protocol 4): `segments`, `device_traces` (one
/// list per device), `allocator_settings` and `external_annotations`, from the model alone.
pub fn to_pytorch_pickle(snapshot: &Snapshot) -> Result<Vec<u8>, ExportError> {
    to_pytorch_pickle_with(snapshot, None)
}

/// Like [`to_pytorch_pickle`], with what the model does not keep taken from `extras`, the
/// source pickle's: a snapshot imported from a PyTorch pickle is written back as it was.
pub fn to_pytorch_pickle_with(
    snapshot: &Snapshot,
    extras: Option<&PytorchExtras<'_>>,
) -> Result<Vec<u8>, ExportError> {
    export_pytorch(snapshot, extras).map(|export| export.bytes)
}

/// A PyTorch snapshot pickle and what it could not carry of the snapshot.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PytorchExport {
    /// The pickle.
    pub bytes: Vec<u8>,
    /// What the pickle cannot carry, or carries only in a form the writer made up, one
    /// sentence each (`3 transfer events: PyTorch snapshots record no host/device copies`);
    /// empty when it carries everything.
    pub not_carried: Vec<String>,
}

/// Writes `snapshot` as a PyTorch snapshot pickle (see [`to_pytorch_pickle_with`]) and says
/// what the pickle cannot carry: events PyTorch has no entry for, figures it does not record,
/// and what was made up to carry the rest (segments around live blocks, memory from before the
/// trace known only as totals, frees written as a request and a completion).
pub fn export_pytorch(
    snapshot: &Snapshot,
    extras: Option<&PytorchExtras<'_>>,
) -> Result<PytorchExport, ExportError> {
    let plan = PytorchPlan::new(snapshot)?;
    let mut w = PickleWriter::new();
    plan.write_with(extras, &mut w, None)?;
    Ok(PytorchExport {
        bytes: w.finish(),
        not_carried: plan.not_carried,
    })
}

/// A PyTorch snapshot pickle about to be streamed: what the writer makes for a snapshot
/// without a dump-time state of its own, checked against the limits the importer reads a file
/// within, and what the pickle cannot carry, known before a byte is written
/// ([`PytorchPlan::not_carried`]), so that `vramscope convert` says it first and then streams
/// the pickle into its output ([`PytorchPlan::write`]) without holding it whole.
pub struct PytorchPlan<'s> {
    snapshot: &'s Snapshot,
    dump: Option<carry::DumpState>,
    pairs: bool,
    not_carried: Vec<String>,
}

impl<'s> PytorchPlan<'s> {
    /// The plan for `snapshot`, or an error when what the pickle would hold passes the limits
    /// within which a PyTorch snapshot pickle is read back.
    pub fn new(snapshot: &'s Snapshot) -> Result<PytorchPlan<'s>, ExportError> {
        let dump = carry::DumpState::from_snapshot(snapshot)?;
        let pairs = carry::completions_only(snapshot);
        if dump.is_some() || pairs {
            // What was made must stay within the limits the importer reads a file with.
            let events = snapshot
                .events
                .iter()
                .filter(|e| action_name(e.kind).is_some())
                .flat_map(|e| {
                    let twice = pairs && e.kind == EventKind::FreeCompleted;
                    std::iter::repeat_n(recorded_size(e), if twice { 2 } else { 1 })
                });
            let segments = dump
                .as_ref()
                .map_or(&snapshot.segments[..], |d| &d.segments);
            carry::check_total(events, segments)?;
        }
        let not_carried = carry::not_carried(snapshot, dump.as_ref());
        Ok(PytorchPlan {
            snapshot,
            dump,
            pairs,
            not_carried,
        })
    }

    /// The plan for a range of steps of a snapshot ([`slice()`]), which is written from the model
    /// alone: for a PyTorch source, what the model does not keep of the source pickle (read
    /// again only for the whole trace, [`PytorchExtras`]) is one more line of
    /// [`PytorchPlan::not_carried`].
    pub fn for_range(part: &'s Snapshot) -> Result<PytorchPlan<'s>, ExportError> {
        let mut plan = PytorchPlan::new(part)?;
        if part.source == SnapshotSource::Pytorch {
            plan.not_carried.push(
                "what the model does not keep of the source pickle (segment frames, compile_context, user_metadata, entries of other kinds): a range of steps is written from the model alone"
                    .to_string(),
            );
        }
        Ok(plan)
    }

    /// What the pickle cannot carry, one sentence each (see [`PytorchExport::not_carried`]).
    pub fn not_carried(&self) -> &[String] {
        &self.not_carried
    }

    /// Streams the pickle into `out` in chunks of about [`PickleWriter::CHUNK`] bytes
    /// with what the model does not keep taken from `extras`, and flushes it; returns the
    /// number of bytes written. On an error, what was written before it stays in `out`.
    pub fn write(
        &self,
        extras: Option<&PytorchExtras<'_>>,
        out: &mut dyn std::io::Write,
    ) -> Result<u64, ExportError> {
        let mut w = PickleWriter::new();
        self.write_with(extras, &mut w, Some(&mut *out))?;
        Ok(w.finish_into(out)?)
    }

    /// Writes the pickle with `w` (not finished), passing the bytes on to `sink` as they
    /// come when there is one, then checks the layout of its segments.
    fn write_with(
        &self,
        extras: Option<&PytorchExtras<'_>>,
        w: &mut PickleWriter,
        sink: Option<&mut dyn std::io::Write>,
    ) -> Result<(), ExportError> {
        let dump = self.dump.as_ref();
        write_pytorch(self.snapshot, extras, dump, self.pairs, w, sink)?;
        // After writing, so that a sum past 2^64 is named by its field first.
        carry::check_layout(dump.map_or(&self.snapshot.segments[..], |d| &d.segments))
    }
}

/// `sink` with the lifetime of what it writes to shortened to the borrow's, so that it fits
/// in an [`Out`] beside shorter-lived locals.
fn shorten<'a>(sink: &'a mut (dyn std::io::Write + '_)) -> &'a mut dyn std::io::Write {
    sink
}

/// Writes the pickle with `w`: `dump` is the dump-time state made for a snapshot without one,
/// `pairs` whether each completed free is written after a request of its own.
fn write_pytorch(
    snapshot: &Snapshot,
    extras: Option<&PytorchExtras<'_>>,
    dump: Option<&carry::DumpState>,
    pairs: bool,
    w: &mut PickleWriter,
    sink: Option<&mut dyn std::io::Write>,
) -> Result<(), ExportError> {
    let mut frames = Frames {
        sites: &snapshot.sites,
        written: FxHashMap::default(),
        strings: FxHashMap::default(),
        empty: None,
    };
    let mut values = Values::default();
    let mut strings: FxHashMap<String, MemoRef> = FxHashMap::default();
    let mut out = Out {
        w,
        values: &mut values,
        strings: &mut strings,
        sink: sink.map(shorten),
    };
    // Times as the file has them: microseconds since its epoch, or since the snapshot's.
    let epoch_us = match extras {
        Some(x) => x.epoch_us,
        None => snapshot.epoch_unix_ns / 1000,
    };
    let time_us = |ns: u64, path: &dyn Fn() -> String| {
        add(epoch_us, ns / 1000, path, "the time in microseconds")
    };
    let root_order: Vec<String> = match extras {
        Some(x) => x
            .root
            .python_dict_items()
            .into_iter()
            .flatten()
            .filter_map(|(k, _)| k.as_str().map(str::to_string))
            .collect(),
        None => [
            "segments",
            "device_traces",
            "allocator_settings",
            "external_annotations",
        ]
        .iter()
        .map(|k| k.to_string())
        .collect(),
    };
    let source_value = |key: &str| extras.and_then(|x| x.root.get(key));
    out.w.begin_dict();
    for key in &root_order {
        out.w.shared_str(key, out.strings);
        match key.as_str() {
            "segments" => {
                let segments = dump.map_or(&snapshot.segments[..], |d| &d.segments);
                write_segments(&mut out, segments, extras, &mut frames)?
            }
            "device_traces" => {
                write_traces(&mut out, snapshot, extras, &mut frames, &time_us, pairs)?
            }
            "allocator_settings" => match source_value(key) {
                Some(v) => out.values.write(out.w, out.strings, v),
                None => write_settings(out.w, &snapshot.config),
            },
            "external_annotations" => write_annotations(&mut out, snapshot, extras, &time_us)?,
            _ => match source_value(key) {
                Some(v) => out.values.write(out.w, out.strings, v),
                None => out.w.none(),
            },
        }
    }
    out.w.end_dict();
    Ok(())
}

fn write_segments(
    out: &mut Out<'_>,
    segments: &[Segment],
    extras: Option<&PytorchExtras<'_>>,
    frames: &mut Frames<'_>,
) -> Result<(), ExportError> {
    out.w.begin_list();
    for (i, segment) in segments.iter().enumerate() {
        let path = || format!("segments[{i}].blocks");
        let (mut allocated, mut active, mut requested) = (0u64, 0u64, 0u64);
        for b in &segment.blocks {
            if b.state == BlockState::ActiveAllocated {
                allocated = add(allocated, b.size, path, "the allocated size")?;
            }
            if b.state != BlockState::Inactive {
                active = add(active, b.size, path, "the active size")?;
                requested = add(requested, b.requested_size, path, "the requested size")?;
            }
        }
        let source = extras.and_then(|x| x.segments.get(&(segment.device as u64, segment.address)));
        // With a source, the keys whose values the model cannot give back keep the source's.
        let model_keys: &[&str] = if source.is_some() {
            &[
                "device",
                "address",
                "total_size",
                "stream",
                "segment_type",
                "is_expandable",
                "blocks",
            ]
        } else {
            &[
                "device",
                "address",
                "total_size",
                "allocated_size",
                "active_size",
                "requested_size",
                "stream",
                "segment_type",
                "segment_pool_id",
                "is_expandable",
                "frames",
                "blocks",
            ]
        };
        let mut write = |out: &mut Out<'_>, key: &str| -> Result<(), ExportError> {
            match key {
                "device" => out.w.uint(segment.device as u64),
                "address" => out.w.uint(segment.address),
                "total_size" => out.w.uint(segment.total_size),
                "allocated_size" => out.w.uint(allocated),
                "active_size" => out.w.uint(active),
                "requested_size" => out.w.uint(requested),
                "stream" => out.w.uint(segment.stream),
                "segment_type" => out.w.str(match segment.pool {
                    Pool::Small => "small",
                    Pool::Large => "large",
                }),
                "segment_pool_id" => {
                    out.w.begin_tuple();
                    out.w.int(0);
                    out.w.int(0);
                    out.w.end_tuple();
                }
                "is_expandable" => out.w.bool(segment.expandable),
                "frames" => frames.write(out.w, None),
                _ => {
                    out.w.begin_list();
                    for block in &segment.blocks {
                        let block_source =
                            source.and_then(|s| s.blocks.get(&block.address).copied());
                        let block_keys: &[&str] = if block_source.is_some() {
                            &["address", "size", "requested_size", "state"]
                        } else {
                            &["address", "size", "requested_size", "state", "frames"]
                        };
                        let mut write_block =
                            |out: &mut Out<'_>, key: &str| -> Result<(), ExportError> {
                                match key {
                                    "address" => out.w.uint(block.address),
                                    "size" => out.w.uint(block.size),
                                    "requested_size" => out.w.uint(block.requested_size),
                                    "state" => out.w.str(block.state.as_str()),
                                    _ => frames.write(out.w, block.site),
                                }
                                Ok(())
                            };
                        write_fields(out, block_source, block_keys, &mut write_block)?;
                        out.spill()?;
                    }
                    out.w.end_list();
                }
            }
            Ok(())
        };
        write_fields(out, source.map(|s| s.value), model_keys, &mut write)?;
    }
    out.w.end_list();
    Ok(())
}

/// The snapshot as a PyTorch pickle, with what the model does not keep read again from
/// `source`, the file it was imported from, when that is a PyTorch pickle
/// ([`PytorchExtras::from_document`] of its pickle), and what the pickle cannot carry
/// ([`export_pytorch`]); what `vramscope convert --to pytorch` writes and prints.
pub fn to_pytorch_pickle_from_file(
    snapshot: &Snapshot,
    source: &std::path::Path,
) -> Result<PytorchExport, ExportError> {
    let options = vramscope_import::ImportOptions::default();
    let doc = read_source(source, &options).map_err(ExportError::Source)?;
    let extras = doc.as_ref().and_then(PytorchExtras::from_document);
    export_pytorch(snapshot, extras.as_ref())
}

type TimeUs<'a> = dyn Fn(u64, &dyn Fn() -> String) -> Result<u64, ExportError> + 'a;

/// Writes `device_traces`: per device, the source's entries in order where there is a source
/// (each entry the model read takes the model's values), then the model's events; with
/// `pairs`, each completed free after a `free_requested` of its own.
fn write_traces(
    out: &mut Out<'_>,
    snapshot: &Snapshot,
    extras: Option<&PytorchExtras<'_>>,
    frames: &mut Frames<'_>,
    time_us: &TimeUs<'_>,
    pairs: bool,
) -> Result<(), ExportError> {
    let devices = snapshot
        .events
        .iter()
        .map(|e| e.device as usize + 1)
        .chain(snapshot.segments.iter().map(|s| s.device as usize + 1))
        .chain(std::iter::once(snapshot.device.index as usize + 1))
        .chain(extras.map(|x| x.traces.len()))
        .max()
        .unwrap_or(1);
    // The events of each device, in order, by their positions in the model: one pass over
    // all of them for a trace of one device, lists of positions (four bytes an event) for
    // more.
    let recorded = |e: &&Event| action_name(e.kind).is_some();
    let single = snapshot
        .events
        .iter()
        .filter(recorded)
        .all(|e| e.device == 0);
    let by_device: Vec<Vec<u32>> = if single {
        Vec::new()
    } else {
        let mut by_device = vec![Vec::new(); devices];
        for (i, e) in snapshot.events.iter().enumerate() {
            if action_name(e.kind).is_some() {
                by_device[e.device as usize].push(i as u32);
            }
        }
        by_device
    };
    let mut entries = EntryWriter::default();
    // An event, after a request of its own for a completed free with `pairs`.
    let mut write_event =
        |out: &mut Out<'_>, i: usize, source: Option<Source<'_>>| -> Result<(), ExportError> {
            let event = &snapshot.events[i];
            let mut write = |out: &mut Out<'_>, kind, source| {
                entries.write(out, frames, time_us, (i, event), kind, source)
            };
            if pairs && event.kind == EventKind::FreeCompleted {
                write(out, EventKind::FreeRequested, None)?;
            }
            write(out, event.kind, source)
        };
    out.w.begin_list();
    for device in 0..devices {
        let mut events: Box<dyn Iterator<Item = usize>> = if single {
            let all = snapshot.events.iter().enumerate();
            match device {
                0 => Box::new(all.filter(|(_, e)| recorded(e)).map(|(i, _)| i)),
                _ => Box::new(std::iter::empty()),
            }
        } else {
            Box::new(
                by_device
                    .get(device)
                    .into_iter()
                    .flatten()
                    .map(|&i| i as usize),
            )
        };
        out.w.begin_list();
        match extras.map(|x| &x.traces) {
            Some(SourceTraces::Doc(traces)) => {
                for entry in traces.get(device).into_iter().flatten() {
                    if !entry.event {
                        out.values.write(out.w, out.strings, entry.value);
                        out.spill()?;
                        continue;
                    }
                    match events.next() {
                        Some(i) => write_event(out, i, Some(Source::Doc(entry.value)))?,
                        None => break,
                    }
                    out.spill()?;
                }
            }
            // Every kept entry is one the importer read into an event.
            Some(SourceTraces::Kept(lists, kept)) => {
                for &shape in lists.get(device).into_iter().flatten() {
                    match events.next() {
                        Some(i) => write_event(out, i, Some(Source::Kept(kept.shape(shape))))?,
                        None => break,
                    }
                    out.spill()?;
                }
            }
            None => {}
        }
        for i in events {
            write_event(out, i, None)?;
            out.spill()?;
        }
        out.w.end_list();
    }
    out.w.end_list();
    Ok(())
}

/// The keys of a trace entry the model writes, in the order PyTorch writes them (an OOM has
/// `device_free` where the others have `addr`).
const ENTRY_KEYS: [&str; 7] = vramscope_import::pytorch::MODEL_ENTRY_KEYS;

/// Writes trace entries, one dict each, with what repeats from one entry to the next known
/// once: the memo slots of the keys, and the shape of the source's entries (the identities of
/// their keys, which PyTorch memoizes), so that an entry of the same shape as the one before
/// is written from its items as they come, without the check for repeated keys.
#[derive(Default)]
struct EntryWriter {
    /// The memo slot of each of [`ENTRY_KEYS`], once written.
    slots: [Option<MemoRef>; ENTRY_KEYS.len()],
    /// The identities of the keys of the last source entry found to repeat no key.
    shape: Vec<usize>,
}

impl EntryWriter {
    /// Writes the key at `ENTRY_KEYS[k]`.
    #[inline]
    fn key(&mut self, out: &mut Out<'_>, k: usize) {
        match self.slots[k] {
            Some(slot) => out.w.get(slot),
            None => self.slots[k] = Some(out.w.shared_str_slot(ENTRY_KEYS[k], out.strings)),
        }
    }

    /// Whether `source`'s keys are those of the last entry that repeated none: all strings,
    /// with the same identities.
    fn same_shape(&self, source: ValueRef<'_>) -> bool {
        let Some(items) = source.dict_items() else {
            return false;
        };
        items.len() == self.shape.len()
            && items
                .zip(&self.shape)
                .all(|((key, _), &id)| key.as_str().is_some() && key.identity() == Some(id))
    }

    /// Writes the entry of the event at `i` as an entry of `kind`, with `source`'s keys and
    /// the values the model has no place for when there is one (see [`write_fields`]).
    fn write(
        &mut self,
        out: &mut Out<'_>,
        frames: &mut Frames<'_>,
        time_us: &TimeUs<'_>,
        (i, event): (usize, &Event),
        kind: EventKind,
        source: Option<Source<'_>>,
    ) -> Result<(), ExportError> {
        // PyTorch writes an OOM's free device memory in place of its address.
        let oom = event.kind == EventKind::Oom;
        let model_key = |key: &str| {
            let k = ENTRY_KEYS.iter().position(|&k| k == key)?;
            let other = if oom { "addr" } else { "device_free" };
            (key != other).then_some(k)
        };
        let mut write_value =
            |this: &mut Self, out: &mut Out<'_>, k: usize, negative_stream: bool| {
                this.key(out, k);
                match ENTRY_KEYS[k] {
                    "action" => out.w.str(action_name(kind).unwrap_or("alloc")),
                    "addr" => out.w.uint(event.addr),
                    "device_free" => out.w.uint(event.device_free),
                    "size" => out.w.uint(recorded_size(event)),
                    // A negative stream handle is kept as its two's complement bits.
                    "stream" if negative_stream => out.w.int(event.stream as i64),
                    "stream" => out.w.uint(event.stream),
                    "time_us" => out
                        .w
                        .uint(time_us(event.time_ns, &|| format!("events[{i}].time_ns"))?),
                    _ => frames.write(out.w, event.site()),
                }
                Ok::<(), ExportError>(())
            };
        let negative = |value: ValueRef<'_>| value.as_i64().is_some_and(|v| v < 0);
        out.w.begin_dict();
        match source {
            // What the import kept: the keys once each, in Python's order, and the values the
            // model has no place for, written as the source's values are.
            Some(Source::Kept(shape)) => {
                for (key, value) in shape.items() {
                    match (model_key(key), value) {
                        (Some(k), &KeptValue::Model { negative }) => {
                            write_value(self, out, k, negative)?
                        }
                        // Kept as the model's but not the model's for this event: an OOM
                        // matched with an entry that is not one, which the importer never
                        // gives. The model's value then.
                        (None, KeptValue::Model { .. }) => {
                            out.w.shared_str(key, out.strings);
                            out.w.none();
                        }
                        (Some(k), _) => write_value(self, out, k, false)?,
                        (None, value) => {
                            out.w.shared_str(key, out.strings);
                            write_kept(out, value);
                        }
                    }
                }
            }
            // The same keys as the entry before, which repeated none: as they come.
            Some(Source::Doc(source)) if self.same_shape(source) => {
                for (key, value) in source.dict_items().into_iter().flatten() {
                    match key.as_str().and_then(model_key) {
                        Some(k) => write_value(self, out, k, negative(value))?,
                        None => {
                            out.values.write(out.w, out.strings, key);
                            out.values.write(out.w, out.strings, value);
                        }
                    }
                }
            }
            // Each key once, as Python holds the dict: a key the model writes is written
            // once even when a hostile file repeats it thousands of times.
            Some(Source::Doc(source)) => {
                let items = source.python_dict_items().unwrap_or_default();
                for &(key, value) in &items {
                    match key.as_str().and_then(model_key) {
                        Some(k) => write_value(self, out, k, negative(value))?,
                        None => {
                            out.values.write(out.w, out.strings, key);
                            out.values.write(out.w, out.strings, value);
                        }
                    }
                }
                let all = source.dict_items().map_or(0, |items| items.len());
                if items.len() == all {
                    self.shape.clear();
                    for (key, _) in &items {
                        match key.identity() {
                            Some(id) if key.as_str().is_some() => self.shape.push(id),
                            _ => {
                                self.shape.clear();
                                break;
                            }
                        }
                    }
                }
            }
            None => {
                let place = if oom { 2 } else { 1 };
                for k in [0, place, 3, 4, 5, 6] {
                    write_value(self, out, k, false)?;
                }
            }
        }
        out.w.end_dict();
        Ok(())
    }
}

/// Writes a value the import kept of a source entry, as [`Values::write`] writes the same
/// value of the source's document.
fn write_kept(out: &mut Out<'_>, value: &KeptValue) {
    match value {
        KeptValue::Model { .. } | KeptValue::None => out.w.none(),
        KeptValue::Bool(b) => out.w.bool(*b),
        KeptValue::Int(i) => out.w.int(*i),
        KeptValue::UInt(u) => out.w.uint(*u),
        KeptValue::BigInt(b) => out.w.long_bytes(b),
        KeptValue::Float(f) => out.w.float(*f),
        KeptValue::Str(s) => out.w.shared_str(s, out.strings),
        KeptValue::Bytes(b) => out.w.bytes(b),
    }
}

fn write_annotations(
    out: &mut Out<'_>,
    snapshot: &Snapshot,
    extras: Option<&PytorchExtras<'_>>,
    time_us: &TimeUs<'_>,
) -> Result<(), ExportError> {
    out.w.begin_list();
    for (i, annotation) in snapshot.annotations.iter().enumerate() {
        let source = extras.and_then(|x| x.annotations.get(i).copied());
        let mut write = |out: &mut Out<'_>, key: &str| -> Result<(), ExportError> {
            match key {
                "device" => out.w.uint(annotation.device as u64),
                "name" => out.w.str(&annotation.name),
                "stage" => out.w.str(&annotation.stage),
                _ => out.w.uint(time_us(annotation.time_ns, &|| {
                    format!("annotations[{i}].time_ns")
                })?),
            }
            Ok(())
        };
        write_fields(
            out,
            source,
            &["device", "name", "stage", "time_us"],
            &mut write,
        )?;
        out.spill()?;
    }
    if snapshot.annotations.is_empty() {
        let (names, _) = carry::step_names(&snapshot.steps);
        for (mark, name) in snapshot.steps.iter().zip(&names) {
            let w = &mut *out.w;
            w.begin_dict();
            w.str("device");
            w.uint(snapshot.device.index as u64);
            w.str("name");
            w.str(name);
            w.str("stage");
            w.str("START");
            w.str("time_us");
            w.uint(time_us(mark.time_ns, &|| {
                format!("steps[{}].time_ns", mark.step)
            })?);
            w.end_dict();
        }
    }
    out.w.end_list();
    Ok(())
}

mod carry;
mod perfetto;
mod perfetto_size;
mod steps;

pub use perfetto::{
    perfetto_size_estimate, perfetto_steps_within, to_perfetto, write_perfetto,
    write_perfetto_window, COUNTER_BYTES, SLICE_BYTES,
};
pub use perfetto_size::{
    perfetto_size_warning, PerfettoSizeWarning, StepsWithin, PERFETTO_UI_BYTES,
};
pub use steps::{slice, StepRange};

#[cfg(test)]
mod tests {
    use super::*;
    use vramscope_caching::{CachingAllocator, SimDevice};

    fn sample() -> Snapshot {
        let alloc = CachingAllocator::new(SimDevice::phantom(1 << 34), AllocatorConfig::default());
        let _keep = alloc.alloc(3 << 20).unwrap();
        for _ in 0..3 {
            alloc.mark_step();
            drop(alloc.alloc(4096).unwrap());
        }
        alloc.snapshot()
    }

    #[test]
    fn a_range_of_a_pytorch_source_says_what_the_model_alone_leaves_out() {
        let ours = sample();
        let whole = PytorchPlan::new(&ours).unwrap().not_carried().to_vec();
        assert_eq!(PytorchPlan::for_range(&ours).unwrap().not_carried(), whole);
        let mut theirs = sample();
        theirs.source = SnapshotSource::Pytorch;
        let whole = PytorchPlan::new(&theirs).unwrap().not_carried().to_vec();
        let range = PytorchPlan::for_range(&theirs)
            .unwrap()
            .not_carried()
            .to_vec();
        assert_eq!(range.len(), whole.len() + 1);
        assert_eq!(range[..whole.len()], whole[..]);
        assert!(range[whole.len()].contains("a range of steps is written from the model alone"));
    }

    #[test]
    fn pytorch_pickle_round_trips_through_the_importer() {
        let snapshot = sample();
        let bytes = to_pytorch_pickle(&snapshot).unwrap();
        let back = vramscope_import::load_bytes(&bytes, "export", &Default::default()).unwrap();
        assert_eq!(back.segments.len(), snapshot.segments.len());
        for (a, b) in back.segments.iter().zip(&snapshot.segments) {
            assert_eq!(
                (a.address, a.total_size, a.pool),
                (b.address, b.total_size, b.pool)
            );
            assert_eq!(a.blocks.len(), b.blocks.len());
        }
        let kinds = |s: &Snapshot| {
            s.events
                .iter()
                .filter(|e| action_name(e.kind).is_some() && e.kind != EventKind::Snapshot)
                .map(|e| (e.kind, e.addr, e.size))
                .collect::<Vec<_>>()
        };
        assert_eq!(kinds(&back), kinds(&snapshot));
        assert_eq!(
            back.steps.len(),
            3,
            "steps come back from the ProfilerStep annotations"
        );
        let site = back.site(
            back.events
                .iter()
                .find(|e| e.kind == EventKind::Alloc)
                .unwrap()
                .site(),
        );
        assert!(site.unwrap().file.ends_with("lib.rs"));
    }

    #[test]
    fn perfetto_output_has_counters_slices_and_steps() {
        let text = to_perfetto(&sample()).unwrap();
        let value: serde_json::Value = serde_json::from_str(&text).unwrap();
        let events = value["traceEvents"].as_array().unwrap();
        let count = |ph: &str| events.iter().filter(|e| e["ph"] == ph).count();
        assert!(count("C") >= 6);
        assert!(events
            .iter()
            .any(|e| e["ph"] == "X" && e["name"] == "step 2"));
        assert!(events.iter().any(|e| e["ph"] == "X"
            && e["args"]["site"]
                .as_str()
                .is_some_and(|s| s.contains("lib.rs"))));
        assert!(count("M") >= 2);
    }
}
