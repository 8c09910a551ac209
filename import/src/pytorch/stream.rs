//! The streaming import of a PyTorch snapshot: its `device_traces` entries become events
//! while the pickle is read, so that no document of them is ever held.
//!
//! [`read`] runs `vramscope_pickle::parse_streaming` with an [`EntryStream`] that converts each
//! entry with `super::read_entry`, as the whole-document import does, into events and call
//! sites (`super::stacks`); the entries of the shape Python writes reach it decoded by the
//! reader's fast path instead (`vramscope_pickle::FastEntry`), which `super::read_fast_entry`
//! converts through the same code, so that both give the same events, sites and faults
//! ([`read_bytes`] turns the fast path off, for the tests that compare the two). It then checks that the lists it streamed are where the snapshot's
//! `device_traces` has them, once each, and that no other trace list has entries. [`Ready`]
//! converts the rest of the document (`super::finish`) into the snapshot. When the pickle
//! cannot be streamed faithfully, or anything fails while it is read, [`read`] returns `None`
//! and `super::from_pickle_bytes` reads the pickle whole, which gives the same snapshot, or
//! the error, as before streaming existed; an entry that does not convert is one such case,
//! so that errors keep the order and wording of the whole-document import. [`read_unsized`]
//! streams a pickle whose length is not known until it ends (gzip data as it is unpacked),
//! its bounds following the bytes read so far.

use std::cell::Cell;
use std::fs::File;
use std::io::Read;
use std::sync::mpsc;

use rustc_hash::FxHashSet;
use vramscope_model::{Event, Snapshot};

use super::collect::{collecting, Collected, EventOut};
use super::keep::Capture;
use super::stacks::Stacks;
use super::{
    check_entries, finish, limits, max_trace_entries, parts, read_entry, read_fast_entry,
    read_traces, EntryKeys, Fault, Figures, Loc, TraceEvents,
};
use crate::{ImportError, ImportErrorKind, ImportOptions};
use vramscope_pickle::{
    parse_streaming, parse_streaming_chunks, parse_streaming_read, Document, EntrySink, FastEntry,
    Standin, Streamed, StreamedList, ValueRef,
};

/// The key of the root dict whose lists are streamed.
const TRACES: &str = "device_traces";

/// Converts streamed trace entries into events and call sites.
struct EntryStream<'a> {
    keys: EntryKeys,
    stacks: Stacks,
    figures: Figures,
    /// Where the events go, their times not yet relative (see `super::read_entry`).
    events: &'a mut EventOut,
    /// Entries read so far, and the most a pickle of this size may hold
    /// (`super::max_trace_entries`).
    entries: usize,
    limit: usize,
    /// For an input whose length is not known until it ends (gzip data as it is unpacked),
    /// the bytes read so far, which `limit` and the stacks' bound follow.
    arrived: Option<&'a Cell<usize>>,
    /// Whether entries of the shape Python writes are decoded by the pickle reader's fast
    /// path (`vramscope_pickle::FastEntry`) rather than read into its document first.
    fast: bool,
    /// What is kept of each entry beyond its event, when the import keeps the source
    /// (`super::keep`).
    capture: Option<Capture>,
}

impl EntryStream<'_> {
    /// Converts the `index`-th entry of device `list` with `read` (`super::read_entry` or
    /// `super::read_fast_entry`) and keeps its event; `false` to stop streaming.
    #[inline]
    fn convert(
        &mut self,
        list: usize,
        index: usize,
        transient_from: usize,
        read: impl FnOnce(
            u16,
            Loc,
            &mut EntryKeys,
            &mut Stacks,
            &mut Figures,
        ) -> Result<Option<Event>, Fault>,
    ) -> bool {
        self.entries += 1;
        if let Some(arrived) = self.arrived {
            self.limit = max_trace_entries(arrived.get());
            self.stacks.max_bytes = Stacks::max_bytes(arrived.get());
        }
        // A device past the limit is the whole document's error to name.
        let Some(device) = vramscope_model::event_device(list as u64) else {
            return false;
        };
        if self.entries > self.limit {
            return false;
        }
        self.stacks.transient_from = Some(transient_from);
        let event = read(
            device,
            Loc::Entry(list, index),
            &mut self.keys,
            &mut self.stacks,
            &mut self.figures,
        );
        self.stacks.transient_from = None;
        match event {
            Ok(Some(e)) => {
                self.events.push(e);
                true
            }
            Ok(None) => true,
            Err(_) => false,
        }
    }
}

impl EntrySink for EntryStream<'_> {
    fn entry(
        &mut self,
        entry: ValueRef<'_>,
        list: usize,
        index: usize,
        transient_from: usize,
    ) -> bool {
        let converted = self.convert(
            list,
            index,
            transient_from,
            |device, loc, keys, stacks, figures| {
                read_entry(entry, device, loc, keys, stacks, figures)
            },
        );
        if let (true, Some(capture)) = (converted, self.capture.as_mut()) {
            capture.entry(entry, list, index);
        }
        converted
    }

    fn takes_fast_entries(&self) -> bool {
        self.fast
    }

    fn fast_entry(
        &mut self,
        entry: &FastEntry<'_>,
        list: usize,
        index: usize,
        transient_from: usize,
    ) -> bool {
        let converted = self.convert(
            list,
            index,
            transient_from,
            |device, loc, keys, stacks, figures| {
                read_fast_entry(entry, device, loc, keys, stacks, figures)
            },
        );
        if let (true, Some(capture)) = (converted, self.capture.as_mut()) {
            capture.fast_entry(entry, list, index);
        }
        converted
    }

    fn read(&mut self) -> &mut Vec<usize> {
        &mut self.stacks.read
    }

    fn standins(&mut self) -> &mut Vec<(usize, Standin)> {
        &mut self.stacks.standins
    }

    fn memory(&self) -> usize {
        // What the collector keeps for each event: the event, its pair link (four bytes) and,
        // for the maps by address (the pairing's open allocations, the last allocations),
        // 24 bytes, as the reader counts an entry of its memo.
        self.events.len() * (std::mem::size_of::<Event>() + 4 + 24)
            + self.stacks.bytes
            + self.stacks.memory()
            + self.keys.memory()
            + self.capture.as_ref().map_or(0, Capture::memory)
    }
}

/// A snapshot pickle read with its trace entries streamed, checked to convert as the whole
/// document would.
pub(super) struct Ready {
    doc: Document,
    stacks: Stacks,
    figures: Figures,
    /// The streamed entries' events, and what the collector made of them.
    collected: Collected,
    /// Where each device's events are, when entries were streamed: how many devices have
    /// entries and the lowest of them.
    traces: Option<(usize, Option<u32>)>,
    /// The entries streamed, and how many of them the pickle reader's fast path decoded.
    pub(super) entries: usize,
    pub(super) fast_entries: usize,
    /// What was kept of the streamed entries beyond their events, when the import keeps the
    /// source.
    capture: Option<Capture>,
}

/// Reads the snapshot pickle `bytes` with `options`, streaming its trace entries; `None` when
/// it must be read whole instead.
pub(super) fn read(bytes: &[u8], options: &ImportOptions) -> Option<Ready> {
    read_bytes(bytes, options, true)
}

/// [`read`], with the fast path for the entries of the shape Python writes when `fast`, or
/// with every entry read by the pickle reader's generic machine when not: the two give the
/// same result.
pub(super) fn read_bytes(bytes: &[u8], options: &ImportOptions, fast: bool) -> Option<Ready> {
    read_with_path(bytes.len(), None, options, fast, |sink| {
        parse_streaming(bytes, &limits(options), TRACES, sink)
    })
}

/// The bytes read from a file at a time.
const PIECE: usize = 1 << 20;

/// Like [`read`] for the `size` bytes of `file`, which a second thread reads in pieces of
/// [`PIECE`] bytes while this one parses them, so that the file is never held whole.
pub(super) fn read_file(file: &File, size: u64, options: &ImportOptions) -> Option<Ready> {
    let total = usize::try_from(size).ok()?;
    std::thread::scope(|scope| {
        // One piece waits for the parser while the next is read: reading a piece from the
        // page cache takes a fraction of parsing it, so more in flight would only hold memory
        // (two more 1 MiB pieces each).
        let (pieces, received) = mpsc::sync_channel::<Vec<u8>>(1);
        let (give_back, returned) = mpsc::channel::<Vec<u8>>();
        let progress = options.progress.clone();
        scope.spawn(move || {
            let mut file = file;
            loop {
                // Made at its full size, so that reading it never doubles it past a piece.
                let mut piece = returned
                    .try_recv()
                    .unwrap_or_else(|_| Vec::with_capacity(PIECE));
                piece.clear();
                match (&mut file).take(PIECE as u64).read_to_end(&mut piece) {
                    // An error ends the pieces early: the sizes disagree and the caller reads
                    // the file again, which reports it.
                    Ok(0) | Err(_) => break,
                    Ok(read) => {
                        // The parser is at most the channel's one piece behind.
                        if let Some(progress) = &progress {
                            progress.add(read as u64);
                        }
                        if pieces.send(piece).is_err() {
                            break;
                        }
                    }
                }
            }
        });
        let mut next = |window: &mut Vec<u8>| match received.recv() {
            Ok(piece) => {
                window.extend_from_slice(&piece);
                let _ = give_back.send(piece);
                true
            }
            Err(_) => false,
        };
        let ready = read_with(total, None, options, |sink| {
            parse_streaming_chunks(total, &mut next, &limits(options), TRACES, sink)
        });
        // Stops the reader if the pickle ended before the file.
        drop(received);
        ready
    })
}

/// Like [`read`] for a pickle whose length is not known until it ends, read from `input` (gzip
/// data as it is unpacked), which is never held whole and is read no further once the pickle
/// fails. The bounds that scale with the input's size (the reader's memory budget, the trace
/// entries, the call sites' text) are those of the bytes read so far while it is read, and
/// those of the whole input once it has ended. The caller, who owns `input`, reports a read
/// error first.
pub(super) fn read_unsized(input: &mut dyn Read, options: &ImportOptions) -> Option<Ready> {
    let arrived = Cell::new(0);
    let mut counted = Counted {
        input,
        arrived: &arrived,
    };
    read_with(0, Some(&arrived), options, |sink| {
        parse_streaming_read(&mut counted, &limits(options), TRACES, sink)
    })
}

/// A reader that counts the bytes it gives.
struct Counted<'a, 'c> {
    input: &'a mut dyn Read,
    arrived: &'c Cell<usize>,
}

impl Read for Counted<'_, '_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.input.read(buf)?;
        self.arrived.set(self.arrived.get() + n);
        Ok(n)
    }
}

/// Streams a snapshot pickle of `input_bytes` bytes (or, with `arrived`, of the bytes read so
/// far) with `parse` into a new sink and checks where its lists are.
fn read_with(
    input_bytes: usize,
    arrived: Option<&Cell<usize>>,
    options: &ImportOptions,
    parse: impl FnOnce(&mut EntryStream<'_>) -> Option<Streamed>,
) -> Option<Ready> {
    read_with_path(input_bytes, arrived, options, true, parse)
}

/// [`read_with`], with the pickle reader's fast path when `fast`.
fn read_with_path(
    input_bytes: usize,
    arrived: Option<&Cell<usize>>,
    options: &ImportOptions,
    fast: bool,
    parse: impl FnOnce(&mut EntryStream<'_>) -> Option<Streamed>,
) -> Option<Ready> {
    let ((streamed, stacks, figures, capture), collected) = collecting(|events| {
        let mut sink = EntryStream {
            keys: EntryKeys::default(),
            stacks: Stacks::new(&options.framework_paths, input_bytes),
            figures: Figures::default(),
            events,
            entries: 0,
            limit: max_trace_entries(input_bytes),
            arrived,
            fast,
            capture: options.keep_source.as_ref().map(|_| Capture::default()),
        };
        let streamed = parse(&mut sink);
        (streamed, sink.stacks, sink.figures, sink.capture)
    });
    let streamed = streamed?;
    let mut stacks = stacks;
    if arrived.is_some() {
        // The whole input's bound, as for a pickle of that size.
        stacks.max_bytes = Stacks::max_bytes(streamed.doc.input_bytes());
    }
    let traces = if streamed.lists.is_empty() {
        None
    } else {
        Some(placed(streamed.doc.root(), &streamed.lists)?)
    };
    Some(Ready {
        entries: streamed.lists.iter().map(|l| l.entries).sum(),
        fast_entries: streamed.fast_entries,
        doc: streamed.doc,
        stacks,
        figures,
        collected,
        traces,
        capture,
    })
}

/// Checks that the streamed `lists` are the lists of `root["device_traces"]` at the positions
/// they were streamed for, once each, in order, and that no other list there has entries;
/// returns how many devices have entries and the lowest of them.
fn placed(root: ValueRef<'_>, lists: &[StreamedList]) -> Option<(usize, Option<u32>)> {
    if lists.windows(2).any(|w| w[0].position >= w[1].position) {
        return None;
    }
    let traces = root.get(TRACES)?.as_seq()?;
    let streamed: FxHashSet<usize> = lists.iter().map(|l| l.list).collect();
    let mut next = lists.iter().peekable();
    let mut devices = 0;
    let mut first = None;
    for (d, trace) in traces.iter().enumerate() {
        let seq = trace.as_seq()?;
        let list = trace.container_index();
        let entries = match next.peek() {
            Some(l) if l.position == d => {
                if list != Some(l.list) || !seq.is_empty() {
                    return None;
                }
                next.next().map_or(0, |l| l.entries)
            }
            // A streamed list out of its place, or entries the document holds beside
            // streamed ones.
            _ if list.is_some_and(|c| streamed.contains(&c)) || !seq.is_empty() => return None,
            _ => 0,
        };
        if entries > 0 {
            devices += 1;
            first = first.or(u32::try_from(d).ok());
        }
    }
    next.peek().is_none().then_some((devices, first))
}

impl Ready {
    /// Converts the snapshot; `origin` names the data in errors.
    pub(super) fn convert(
        self,
        origin: &str,
        options: &ImportOptions,
    ) -> Result<Snapshot, ImportError> {
        self.snapshot(options).map_err(|fault| {
            ImportError::new(
                origin,
                ImportErrorKind::Structure {
                    path: fault.path,
                    message: fault.message,
                },
            )
        })
    }

    fn snapshot(self, options: &ImportOptions) -> Result<Snapshot, Fault> {
        let Ready {
            doc,
            mut stacks,
            mut figures,
            collected,
            traces,
            capture,
            ..
        } = self;
        let streamed = traces.is_some();
        let snapshot = {
            let root = doc.root();
            // Streamed entries are within the limit (the sink stops past it) and `placed`
            // found no others; without them, the document holds all.
            if traces.is_none() {
                check_entries(root, doc.input_bytes())?;
            }
            let parts = parts(root)?;
            let traces = match traces {
                Some((devices_with_events, first_device)) => TraceEvents {
                    events: collected.events,
                    earliest_us: collected.earliest_us,
                    devices_with_events,
                    first_device,
                    one_device: collected.one_device,
                },
                None => read_traces(parts.traces, &mut stacks, &mut figures)?,
            };
            finish(parts, traces, stacks, figures, options)?
        };
        // The document and what was kept of the entries, for a writer of PyTorch's format.
        if let (Some(slot), Some(capture)) = (&options.keep_source, capture) {
            let lists = streamed.then(|| {
                doc.root()
                    .get(TRACES)
                    .and_then(ValueRef::as_seq)
                    .map_or(0, |s| s.len())
            });
            if let Some(kept) = capture.finish(doc, lists) {
                slot.put(kept);
            }
        }
        Ok(snapshot)
    }
}

#[cfg(test)]
mod tests {
    use rustc_hash::FxHashMap;

    use super::*;
    use vramscope_model::EventKind;
    use vramscope_pickle::{MemoRef, PickleWriter};

    /// What an entry's `frames` is.
    #[derive(Clone, Copy)]
    enum Frames {
        /// A new list of the frame dicts `0..n`, each written out where first used.
        Fresh(usize),
        /// The list of the entry this many entries before, through the memo.
        Earlier(usize),
        /// The list of the segment's block, from before the traces.
        Block,
    }

    /// Writes snapshot pickles as Python's pickler would, sharing strings, frame dicts and
    /// lists through the memo.
    struct Writer {
        w: PickleWriter,
        strings: FxHashMap<String, MemoRef>,
        frame_dicts: FxHashMap<usize, MemoRef>,
        lists: Vec<MemoRef>,
        entries: Vec<MemoRef>,
        block_frames: Option<MemoRef>,
    }

    impl Writer {
        fn new() -> Writer {
            Writer {
                w: PickleWriter::new(),
                strings: FxHashMap::default(),
                frame_dicts: FxHashMap::default(),
                lists: Vec::new(),
                entries: Vec::new(),
                block_frames: None,
            }
        }

        fn key(&mut self, key: &str) {
            self.w.shared_str(key, &mut self.strings);
        }

        fn frame(&mut self, i: usize) {
            if let Some(&slot) = self.frame_dicts.get(&i) {
                self.w.get(slot);
                return;
            }
            self.w.begin_dict();
            self.key("filename");
            self.key(&format!("/home/u/model{}.py", i % 3));
            self.key("line");
            self.w.int(10 + i as i64);
            self.key("name");
            self.key(&format!("f{i}"));
            self.w.end_dict();
            let slot = self.w.memoize();
            self.frame_dicts.insert(i, slot);
        }

        fn frames(&mut self, frames: Frames) {
            match frames {
                Frames::Fresh(n) => {
                    self.w.begin_list();
                    for i in 0..n {
                        self.frame(i);
                    }
                    self.w.end_list();
                    let slot = self.w.memoize();
                    self.lists.push(slot);
                }
                Frames::Earlier(back) => {
                    let slot = self.lists[self.lists.len() - back];
                    self.w.get(slot);
                    self.lists.push(slot);
                }
                Frames::Block => {
                    let slot = self.block_frames.unwrap_or_else(|| unreachable!());
                    self.w.get(slot);
                    self.lists.push(slot);
                }
            }
        }

        fn entry(&mut self, action: &str, addr: u64, time_us: u64, frames: Frames) {
            self.entry_of_size(action, addr, 4096, time_us, frames);
        }

        fn entry_of_size(
            &mut self,
            action: &str,
            addr: u64,
            size: u64,
            time_us: u64,
            frames: Frames,
        ) {
            self.w.begin_dict();
            self.key("action");
            self.key(action);
            self.key("addr");
            self.w.uint(addr);
            self.key("size");
            self.w.uint(size);
            self.key("stream");
            self.w.int(0);
            self.key("time_us");
            self.w.uint(time_us);
            self.key("frames");
            self.frames(frames);
            self.w.end_dict();
            let slot = self.w.memoize();
            self.entries.push(slot);
        }

        /// The root dict's `segments` pair: one segment whose block has a frames list.
        fn segments(&mut self) {
            self.key("segments");
            self.w.begin_list();
            self.w.begin_dict();
            self.key("device");
            self.w.int(0);
            self.key("address");
            self.w.uint(1 << 32);
            self.key("total_size");
            self.w.uint(2 << 20);
            self.key("blocks");
            self.w.begin_list();
            self.w.begin_dict();
            self.key("address");
            self.w.uint(1 << 32);
            self.key("size");
            self.w.uint(4096);
            self.key("state");
            self.key("active_allocated");
            self.key("frames");
            self.w.begin_list();
            self.frame(5);
            self.frame(1);
            self.w.end_list();
            self.block_frames = Some(self.w.memoize());
            self.w.end_dict();
            self.w.end_list();
            self.w.end_dict();
            self.w.end_list();
        }

        /// The pairs after the traces: settings and annotations that share keys with them.
        fn tail(&mut self) {
            self.key("allocator_settings");
            self.w.begin_dict();
            self.key("expandable_segments");
            self.w.bool(false);
            self.w.end_dict();
            self.key("external_annotations");
            self.w.begin_list();
            for (stage, time) in [("START", 1_000_010), ("END", 1_000_020)] {
                self.w.begin_dict();
                self.key("name");
                self.key("ProfilerStep#1");
                self.key("stage");
                self.key(stage);
                self.key("device");
                self.w.int(0);
                self.key("time_us");
                self.w.uint(time);
                self.w.end_dict();
            }
            self.w.end_list();
        }
    }

    impl Writer {
        /// Opens the root dict, writes the segments and opens `device_traces`.
        fn begin_traces(&mut self) {
            self.w.begin_dict();
            self.segments();
            self.key("device_traces");
            self.w.begin_list();
        }

        /// Closes `device_traces` and writes the pairs after it.
        fn end_traces(&mut self) {
            self.w.end_list();
            self.tail();
        }
    }

    /// A snapshot with `devices` traces of `entries` entries each (none for device 1 when
    /// there are several), with every kind of frames list.
    fn snapshot(devices: usize, entries: usize) -> Vec<u8> {
        let mut w = Writer::new();
        w.begin_traces();
        for d in 0..devices {
            w.w.begin_list();
            let n = if devices > 1 && d == 1 { 0 } else { entries };
            for i in 0..n {
                let frames = match i % 5 {
                    0 | 1 => Frames::Fresh(1 + i % 7),
                    2 | 3 if i >= 2 => Frames::Earlier(1 + i % 2),
                    _ => Frames::Block,
                };
                let action = ["alloc", "free_requested", "free_completed", "segment_map"][i % 4];
                w.entry(
                    action,
                    (1 << 32) + 4096 * (i as u64 % 9),
                    1_000_000 + i as u64,
                    frames,
                );
            }
            w.w.end_list();
        }
        w.end_traces();
        w.w.end_dict();
        w.w.finish()
    }

    /// The snapshot of `bytes` read whole, as before streaming existed.
    fn whole(bytes: &[u8]) -> Result<Snapshot, String> {
        let options = ImportOptions::default();
        let doc = super::super::parse(bytes, "t", &options).map_err(|e| e.to_string())?;
        super::super::from_document(&doc, "t", &options).map_err(|e| e.to_string())
    }

    /// The snapshot of `bytes` as the importer reads it, and whether it streamed entries.
    fn streamed(bytes: &[u8]) -> (Result<Snapshot, String>, bool) {
        let options = ImportOptions::default();
        let streamed = read(bytes, &options).is_some_and(|r| r.traces.is_some());
        let result =
            super::super::from_pickle_bytes(bytes, "t", &options).map_err(|e| e.to_string());
        (result, streamed)
    }

    fn assert_same(bytes: &[u8], should_stream: bool) -> Snapshot {
        let (result, streamed) = streamed(bytes);
        assert_eq!(streamed, should_stream);
        let expected = whole(bytes);
        assert_eq!(result, expected);
        match result {
            Ok(s) => s,
            Err(e) => panic!("{e}"),
        }
    }

    /// The pickle reader's fast path decodes the entries whose keys and frame dicts its memo
    /// already holds, and they convert into what the generic machine gives, whole or in the
    /// pieces of a file (a piece that ends inside an entry leaves it to the generic machine).
    #[test]
    fn the_fast_path_reads_most_entries_into_what_the_generic_machine_gives() {
        let options = ImportOptions::default();
        for bytes in [snapshot(1, 40), snapshot(3, 300), snapshot(2, 2000)] {
            let fast = read_bytes(&bytes, &options, true).expect("it streams");
            let generic = read_bytes(&bytes, &options, false).expect("it streams");
            assert_eq!(generic.fast_entries, 0);
            assert!(
                fast.fast_entries * 10 >= fast.entries * 8,
                "{} of {} entries by the fast path",
                fast.fast_entries,
                fast.entries
            );
            let expected = generic.convert("t", &options).map_err(|e| e.to_string());
            assert_eq!(
                fast.convert("t", &options).map_err(|e| e.to_string()),
                expected
            );
            for piece in [1, 7, 100, 4096] {
                assert_eq!(in_pieces(&bytes, piece), Some(expected.clone()), "{piece}");
            }
        }
    }

    #[test]
    fn entries_stream_into_the_events_the_whole_document_gives() {
        let bytes = snapshot(1, 40);
        let s = assert_same(&bytes, true);
        assert_eq!(s.events.len(), 40);
        assert!(s.events.iter().all(|e| e.site.is_some()));
        assert_eq!(s.steps.len(), 1);
        // Fresh lists, lists shared with earlier entries and the block's list all make sites.
        assert!(s.sites.len() > 3, "{}", s.sites.len());
    }

    #[test]
    fn several_devices_stream_each_at_its_position() {
        let bytes = snapshot(3, 25);
        let s = assert_same(&bytes, true);
        let devices: Vec<u32> = s.events.iter().map(|e| u32::from(e.device)).collect();
        assert_eq!(devices.iter().filter(|&&d| d == 0).count(), 25);
        assert_eq!(devices.iter().filter(|&&d| d == 2).count(), 25);
        assert!(!devices.contains(&1));
    }

    /// Entries over many of the collector's batches give the whole document's snapshot: the
    /// events in order, paired on the second thread for the block sizing.
    #[test]
    fn entries_over_many_batches_stream_into_the_whole_documents_snapshot() {
        let bytes = snapshot(1, 20_000);
        let s = assert_same(&bytes, true);
        assert_eq!(s.events.len(), 20_000);
    }

    /// On one device, the import takes the pairs and last allocations the collector made on
    /// its thread rather than working them out again. Through them, an allocation still live
    /// at the dump gets the dump-time block's size, and the block the allocation's step.
    /// Pairs made for another address leave the allocation its rounded request; last
    /// allocations without the block leave the block in no step.
    #[test]
    fn the_collectors_pairs_and_last_allocations_are_what_the_import_uses() {
        let mut w = Writer::new();
        w.begin_traces();
        w.w.begin_list();
        // The dump's block is 4,096 bytes at 1 << 32; this request rounds to 512. The time is
        // within the tail's step 1.
        w.entry_of_size("alloc", 1 << 32, 100, 1_000_015, Frames::Fresh(2));
        w.w.end_list();
        w.end_traces();
        w.w.end_dict();
        let bytes = w.w.finish();
        let options = ImportOptions::default();
        let read_bytes = || read(&bytes, &options).expect("the entries stream");
        let honest = read_bytes().convert("t", &options).unwrap();
        assert_eq!(honest, whole(&bytes).unwrap());
        let alloc = honest.events[0];
        assert_eq!(
            (alloc.kind, alloc.size, alloc.step),
            (EventKind::Alloc, 4096, 1)
        );
        assert_eq!(honest.segments[0].blocks[0].step, 1);

        let mut ready = read_bytes();
        let one = ready.collected.one_device.as_mut().expect("one device");
        let mut elsewhere = ready.collected.events.clone();
        elsewhere[0].addr += 1 << 20;
        one.paired = vramscope_engine::PairedEvents::pair(&elsewhere);
        one.last_alloc.clear();
        let misled = ready.convert("t", &options).unwrap();
        assert_eq!((misled.events[0].size, misled.events[0].step), (512, 1));
        assert_eq!(misled.segments[0].blocks[0].step, 0);
    }

    /// Each device's events are sized on their own, as PyTorch keeps an allocator per device:
    /// a free on device 1 at an address where device 0 has an open allocation keeps its own
    /// size, rather than taking the size of device 0's block.
    #[test]
    fn each_devices_events_are_sized_on_their_own() {
        let at = (1 << 32) + (1 << 20);
        let mut w = Writer::new();
        w.begin_traces();
        w.w.begin_list();
        w.entry_of_size("alloc", at, 1 << 20, 1_000_000, Frames::Fresh(1));
        w.w.end_list();
        w.w.begin_list();
        w.entry_of_size("free_requested", at, 3 << 20, 1_000_005, Frames::Fresh(2));
        w.entry_of_size("free_completed", at, 3 << 20, 1_000_006, Frames::Fresh(2));
        w.w.end_list();
        w.end_traces();
        w.w.end_dict();
        let s = assert_same(&w.w.finish(), true);
        let sizes: Vec<(u16, EventKind, u64)> = s
            .events
            .iter()
            .map(|e| (e.device, e.kind, e.size))
            .collect();
        assert_eq!(
            sizes,
            [
                (0, EventKind::Alloc, 1 << 20),
                (1, EventKind::FreeRequested, 3 << 20),
                (1, EventKind::FreeCompleted, 3 << 20),
            ]
        );
    }

    /// A second device whose entries are none of them events still has the devices' events
    /// merged by time, which reorders them here: the pairs made in file order are not used.
    /// (Merged, some allocations are open at the end, among them one at the address of the
    /// dump-time block, whose size, unlike the requests', it takes.)
    #[test]
    fn events_merged_by_time_are_paired_in_their_merged_order() {
        let mut w = Writer::new();
        w.begin_traces();
        w.w.begin_list();
        for i in 0..3_000u64 {
            let action = ["alloc", "free_requested", "free_completed"][i as usize % 3];
            // Times fall back every 7 entries, so that the merge moves events across pairs.
            let time = 1_000_000 + (i / 3) * 3 + (7 - i % 7) * 5;
            let addr = (1 << 32) + 4096 * (i / 3 % 5);
            w.entry_of_size(action, addr, 1024, time, Frames::Fresh(1 + i as usize % 4));
        }
        w.w.end_list();
        w.w.begin_list();
        w.entry("weird_new_action", 0, 1_000_001, Frames::Fresh(2));
        w.w.end_list();
        w.end_traces();
        w.w.end_dict();
        let s = assert_same(&w.w.finish(), true);
        assert!(s.events.windows(2).all(|p| p[0].time_ns <= p[1].time_ns));
        assert!(s
            .events
            .iter()
            .any(|e| e.kind == EventKind::Alloc && e.size == 4096));
    }

    #[test]
    fn an_unknown_action_streams_when_nothing_uses_its_frames_again() {
        let mut w = Writer::new();
        w.begin_traces();
        w.w.begin_list();
        w.entry("alloc", 1 << 32, 1_000_000, Frames::Fresh(2));
        w.entry("weird_new_action", 0, 1_000_001, Frames::Fresh(3));
        w.entry("alloc", 1 << 33, 1_000_002, Frames::Block);
        w.w.end_list();
        w.end_traces();
        w.w.end_dict();
        let s = assert_same(&w.w.finish(), true);
        assert_eq!(s.events.len(), 2);
    }

    /// A snapshot whose last root pair is written by `last` after the traces.
    fn with_tail(last: impl FnOnce(&mut Writer)) -> Vec<u8> {
        let mut w = Writer::new();
        w.begin_traces();
        w.w.begin_list();
        w.entry("alloc", 1 << 32, 1_000_000, Frames::Fresh(2));
        w.entry("weird_new_action", 0, 1_000_001, Frames::Fresh(3));
        w.entry("free_requested", 1 << 32, 1_000_002, Frames::Fresh(2));
        w.w.end_list();
        w.end_traces();
        w.key("extra");
        last(&mut w);
        w.w.end_dict();
        w.w.finish()
    }

    #[test]
    fn what_streaming_cannot_keep_makes_the_document_be_read_whole() {
        // The tail alone streams.
        let s = assert_same(&with_tail(|w| w.w.int(5)), true);
        assert_eq!(s.events.len(), 2);
        // An entry used again after it was consumed.
        assert_same(&with_tail(|w| w.w.get(w.entries[0])), false);
        // A frames list converted with its entry, used again outside the traces.
        assert_same(&with_tail(|w| w.w.get(w.lists[0])), false);
        // The frames list of the entry that was not converted, used again.
        let dropped = |w: &mut Writer| {
            w.w.begin_list();
            w.frames(Frames::Earlier(2));
            w.w.end_list();
        };
        assert_same(&with_tail(dropped), false);
        // A frame dict from the segments that the entries' stacks use, changed afterwards:
        // Python's snapshot has the changed line everywhere the dict is used.
        let changed = |w: &mut Writer| {
            let slot = w.frame_dicts[&1];
            w.w.get(slot);
            w.w.begin_frozenset();
            w.key("line");
            w.w.int(777);
            w.w.end_dict();
        };
        let s = assert_same(&with_tail(changed), false);
        assert!(s
            .sites
            .iter()
            .any(|site| site.frames.iter().any(|f| f.line == 777)));
    }

    /// A frames list from before the traces with the same frames as one an earlier entry's
    /// stack came from (the reader stores the two once) is read by its own entry too:
    /// changed afterwards, it makes the document be read whole, as the entry's stack in the
    /// document has the frame added.
    #[test]
    fn a_list_equal_to_a_converted_one_and_changed_later_is_read_whole() {
        let mut w = Writer::new();
        w.w.begin_dict();
        w.segments();
        w.key("other");
        w.w.begin_list();
        w.frame(5);
        w.frame(1);
        w.w.end_list();
        let twin = w.w.memoize();
        w.key("device_traces");
        w.w.begin_list();
        w.w.begin_list();
        w.entry("alloc", 1 << 32, 1_000_000, Frames::Block);
        w.lists.push(twin);
        w.entry("alloc", 1 << 33, 1_000_001, Frames::Earlier(1));
        w.w.end_list();
        w.end_traces();
        w.key("extra");
        // The twin, one frame longer: `MARK`, the frame, `APPENDS`.
        w.w.get(twin);
        w.w.begin_tuple();
        w.frame(2);
        w.w.end_list();
        w.w.end_dict();
        let s = assert_same(&w.w.finish(), false);
        assert_eq!(s.events.len(), 2);
        let depth = |e: &Event| s.sites[e.site().unwrap() as usize].frames.len();
        assert_eq!((depth(&s.events[0]), depth(&s.events[1])), (2, 3));
    }

    #[test]
    fn a_list_appended_twice_is_read_whole() {
        let mut w = Writer::new();
        w.begin_traces();
        w.w.begin_list();
        w.entry("alloc", 1 << 32, 1_000_000, Frames::Fresh(2));
        w.entry("alloc", 1 << 33, 1_000_001, Frames::Fresh(2));
        w.w.end_list();
        let list = w.w.memoize();
        w.w.get(list);
        w.end_traces();
        w.w.end_dict();
        let s = assert_same(&w.w.finish(), false);
        assert_eq!(s.events.len(), 4);
    }

    #[test]
    fn errors_are_those_of_the_whole_document() {
        let bytes = snapshot(1, 12);
        // Cut inside the traces, and a bad entry (an address that is a string).
        let (result, _) = streamed(&bytes[..bytes.len() / 2]);
        assert_eq!(result, whole(&bytes[..bytes.len() / 2]));
        let mut w = Writer::new();
        w.w.begin_dict();
        w.key("device_traces");
        w.w.begin_list();
        w.w.begin_list();
        w.entry("alloc", 1 << 32, 1_000_000, Frames::Fresh(2));
        w.w.begin_dict();
        w.key("action");
        w.key("alloc");
        w.key("addr");
        w.key("x");
        w.w.end_dict();
        w.w.end_list();
        w.w.end_list();
        w.w.end_dict();
        let bytes = w.w.finish();
        let (result, streamed) = streamed(&bytes);
        assert!(!streamed);
        let e = result.expect_err("a string address");
        assert!(e.contains("device_traces[0][1].addr"), "{e}");
        assert_eq!(Err(e), whole(&bytes));
    }

    /// The snapshot of `bytes` read in pieces of `piece` bytes, as a file is; `None` when it
    /// must be read whole.
    fn in_pieces(bytes: &[u8], piece: usize) -> Option<Result<Snapshot, String>> {
        let options = ImportOptions::default();
        let mut chunks = bytes.chunks(piece);
        let mut next = |window: &mut Vec<u8>| match chunks.next() {
            Some(chunk) => {
                window.extend_from_slice(chunk);
                true
            }
            None => false,
        };
        let ready = read_with(bytes.len(), None, &options, |sink| {
            parse_streaming_chunks(bytes.len(), &mut next, &limits(&options), TRACES, sink)
        })?;
        Some(ready.convert("t", &options).map_err(|e| e.to_string()))
    }

    #[test]
    fn pieces_of_any_size_give_the_same_snapshot() {
        let bytes = snapshot(3, 30);
        let expected = whole(&bytes);
        assert!(expected.is_ok());
        for piece in [1, 2, 3, 7, 64, 4096, bytes.len()] {
            assert_eq!(in_pieces(&bytes, piece), Some(expected.clone()), "{piece}");
        }
        // Not streamable, or not whole: the caller reads it whole.
        assert_eq!(in_pieces(&with_tail(|w| w.w.get(w.entries[0])), 5), None);
        assert_eq!(in_pieces(&bytes[..bytes.len() - 1], 5), None);
    }

    #[test]
    fn a_pickle_of_unknown_length_streams_into_the_snapshot_its_bytes_give() {
        let options = ImportOptions::default();
        for bytes in [snapshot(1, 5), snapshot(3, 30), snapshot(2, 2000)] {
            let expected = whole(&bytes);
            assert!(expected.is_ok());
            let ready = read_unsized(&mut &bytes[..], &options).expect("streams");
            assert!(ready.traces.is_some(), "entries were streamed");
            assert_eq!(
                ready.convert("t", &options).map_err(|e| e.to_string()),
                expected
            );
            // Through the importer, gzipped: the same snapshot.
            let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
            std::io::Write::write_all(&mut gz, &bytes).unwrap();
            let packed = gz.finish().unwrap();
            let loaded = crate::load_bytes(&packed, "t", &options);
            assert_eq!(loaded.map_err(|e| e.to_string()), expected);
        }
        // What cannot stream, or is cut short, is read whole or refused as the bytes are.
        let tail = with_tail(|w| w.w.get(w.entries[0]));
        assert!(read_unsized(&mut &tail[..], &options).is_none());
        let bytes = snapshot(3, 30);
        assert!(read_unsized(&mut &bytes[..bytes.len() - 1], &options).is_none());
    }

    #[test]
    fn a_file_streams_into_the_snapshot_its_bytes_give() {
        let bytes = snapshot(2, 30);
        let path = std::env::temp_dir().join(format!(
            "vramscope-stream-test-{}.pickle",
            std::process::id()
        ));
        std::fs::write(&path, &bytes).expect("a temporary file");
        let file = File::open(&path).expect("the file");
        let options = ImportOptions::default();
        let ready = read_file(&file, bytes.len() as u64, &options).expect("it streams");
        let from_file = ready.convert("t", &options).map_err(|e| e.to_string());
        // A size that is not the file's: the caller reads it whole.
        let wrong = read_file(&file, bytes.len() as u64 + 1, &options);
        let _ = std::fs::remove_file(&path);
        assert_eq!(from_file, whole(&bytes));
        assert!(wrong.is_none());
    }

    mod fuzz {
        use proptest::prelude::*;

        use super::*;

        proptest! {
            #![proptest_config(vramscope_testkit::props::config(300))]

            #[test]
            fn streaming_gives_what_the_whole_document_gives(
                edits in proptest::collection::vec((any::<usize>(), any::<u8>()), 1..4),
                piece in 1usize..50,
            ) {
                let mut bytes = snapshot(2, 9);
                for (at, byte) in edits {
                    let i = at % bytes.len();
                    bytes[i] = byte;
                }
                let expected = whole(&bytes);
                let (result, _) = streamed(&bytes);
                prop_assert_eq!(&result, &expected);
                if let Some(result) = in_pieces(&bytes, piece) {
                    prop_assert_eq!(result, expected);
                }
            }
        }
    }
}
