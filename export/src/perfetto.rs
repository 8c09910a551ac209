//! The Perfetto export: a snapshot as Chrome trace JSON that ui.perfetto.dev opens, streamed
//! one event at a time.
//!
//! [`write_perfetto`] makes three passes, each a named step: the events in order (a `memory`
//! counter at the start and at every change of allocated or reserved bytes, OOMs as instants,
//! and each allocation collected as an [`Interval`] from its allocation to its free), the
//! allocations (each interval assigned a track of its stream where it nests, by
//! [`assign_tracks`], then written as a complete slice in start order), and the steps on a
//! track of their own. A
//! [`TraceWriter`] holds what every step shares: the output, the separator state, the process
//! id and the clock. The parent module (`crate::export`) re-exports the two public functions.
//! The engine's sums saturate, so before it walks the snapshot every size it could add up is
//! added with the parent module's checked addition: no state can hold more than all of them
//! together, and a snapshot whose sizes pass 2^64 bytes is an [`ExportError`] naming the field
//! where they do.
//!
//! The counter's figures are the engine's (`vramscope_engine::Reconstruction`): its start
//! state, memory held before the trace included, and its usage after every event, so that the
//! counter's highest values are the peaks `vramscope report` prints; which free ends which
//! allocation is the engine's pairing too. Where the format does not record reserved memory,
//! the counter has no `reserved` series rather than one of zeros.

use std::cmp::Reverse;
use std::collections::{BTreeSet, BinaryHeap};
use std::io::{BufWriter, Write};
use std::ops::Range;

use serde_json::ser::{CompactFormatter, Formatter};
use vramscope_engine::{FreeLink, Reconstruction, Usage};
use vramscope_model::{EventKind, SiteId, Snapshot};

use super::{add, ExportError};

/// Fails when the sizes the engine could add up (the dump-time segments and blocks, every
/// event's size, and the statistics' current totals that stand for memory no block describes)
/// pass 2^64 bytes together: below that bound none of the engine's saturating sums can
/// saturate.
fn check_sizes(snapshot: &Snapshot) -> Result<(), ExportError> {
    const WHAT: &str = "the sizes of the snapshot's segments, blocks and events together";
    let mut total = 0u64;
    for (i, segment) in snapshot.segments.iter().enumerate() {
        total = add(
            total,
            segment.total_size,
            || format!("segments[{i}].total_size"),
            WHAT,
        )?;
        for b in &segment.blocks {
            total = add(total, b.size, || format!("segments[{i}].blocks"), WHAT)?;
        }
    }
    for (k, e) in snapshot.events.iter().enumerate() {
        total = add(total, e.size, || format!("events[{k}].size"), WHAT)?;
    }
    let stats = &snapshot.stats;
    for current in [
        stats.allocated_bytes.all.current,
        stats.reserved_bytes.all.current,
    ] {
        total = add(total, current, || "stats".to_string(), WHAT)?;
    }
    Ok(())
}

/// An allocation as the Perfetto export draws it: a slice from its allocation to its free
/// (or the end of the trace), in nanoseconds.
struct Interval {
    start: u64,
    end: u64,
    /// Position of the allocation among all of them, which breaks ties.
    index: usize,
    size: u64,
    addr: u64,
    stream: u64,
    site: Option<SiteId>,
    step: u64,
    live_at_end: bool,
    /// The track it is drawn on, once assigned.
    tid: u64,
}

/// An open interval in the order its end comes: its end, its start and position reversed (an
/// inner slice ends first on a tie), its index and its lane.
type OpenEnd = (u64, Reverse<(u64, usize)>, usize, usize);

/// Assigns each interval a track where it nests: on one stream, a lane is a stack of slices
/// each inside the one below; an interval goes on top of the lane whose top ends soonest at
/// or after it ends (best fit), else on an empty lane, else on a new lane. Ends are taken in
/// time order (an inner slice first when two end together), so a slice that ends is always
/// the top of its lane. Each step is a logarithmic search, so many allocations that overlap
/// without nesting cost `n log n`, not `n` per allocation.
fn assign_tracks(intervals: &mut [Interval], next_tid: &mut u64) -> Vec<(u64, u64, usize)> {
    // Start order: by start, the longer first, then by position.
    let mut order: Vec<usize> = (0..intervals.len()).collect();
    order.sort_by_key(|&i| {
        let v = &intervals[i];
        (v.stream, v.start, Reverse(v.end), v.index)
    });
    let mut tracks = Vec::new();
    let mut at = 0;
    while at < order.len() {
        let stream = intervals[order[at]].stream;
        let run = order[at..]
            .iter()
            .take_while(|&&i| intervals[i].stream == stream)
            .count();
        let group = &order[at..at + run];
        at += run;
        // Per lane, the stack of open intervals; the lanes by the end of their top, and the
        // empty ones.
        let mut lanes: Vec<Vec<usize>> = Vec::new();
        let mut tops: BTreeSet<(u64, usize)> = BTreeSet::new();
        let mut empty: BTreeSet<usize> = BTreeSet::new();
        // Open intervals by end: the earliest end first, an inner (later) one first on a tie.
        let mut open: BinaryHeap<Reverse<OpenEnd>> = BinaryHeap::new();
        let mut lane_tid: Vec<u64> = Vec::new();
        for &i in group {
            let (start, end) = (intervals[i].start, intervals[i].end);
            while let Some(Reverse((e, _, j, lane))) = open.peek().copied() {
                if e > start {
                    break;
                }
                open.pop();
                debug_assert_eq!(lanes[lane].last(), Some(&j));
                lanes[lane].pop();
                tops.remove(&(e, lane));
                match lanes[lane].last() {
                    Some(&below) => {
                        tops.insert((intervals[below].end, lane));
                    }
                    None => {
                        empty.insert(lane);
                    }
                }
            }
            let lane = match tops.range((end, 0)..).next().copied() {
                Some((top_end, lane)) => {
                    tops.remove(&(top_end, lane));
                    lane
                }
                None => match empty.pop_first() {
                    Some(lane) => lane,
                    None => {
                        lanes.push(Vec::new());
                        lane_tid.push(*next_tid);
                        tracks.push((*next_tid, stream, lanes.len() - 1));
                        *next_tid += 1;
                        lanes.len() - 1
                    }
                },
            };
            lanes[lane].push(i);
            tops.insert((end, lane));
            intervals[i].tid = lane_tid[lane];
            open.push(Reverse((
                end,
                Reverse((start, intervals[i].index)),
                i,
                lane,
            )));
        }
    }
    tracks
}

/// The bytes of JSON text the Chrome trace format is written with: a buffered output and
/// typed pieces (numbers, escaped strings, times), written as `serde_json` writes the same
/// values, so that the output is byte for byte what a document of `serde_json::Value`s gave,
/// without building one per event.
struct JsonOut<W: Write> {
    out: BufWriter<W>,
}

impl<W: Write> JsonOut<W> {
    /// Writes bytes as they are (keys, punctuation).
    #[inline]
    fn raw(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.out.write_all(bytes)
    }

    /// Writes an unsigned integer as `serde_json` does.
    #[inline]
    fn uint(&mut self, value: u64) -> std::io::Result<()> {
        CompactFormatter.write_u64(&mut self.out, value)
    }

    /// Writes a string, quoted and escaped as `serde_json` escapes it (quotes, backslashes and
    /// control characters; everything else as it is).
    fn str(&mut self, value: &str) -> std::io::Result<()> {
        let plain = value.bytes().all(|b| b >= 0x20 && b != b'"' && b != b'\\');
        if plain {
            self.out.write_all(b"\"")?;
            self.out.write_all(value.as_bytes())?;
            self.out.write_all(b"\"")
        } else {
            serde::Serializer::serialize_str(&mut serde_json::Serializer::new(&mut self.out), value)
                .map_err(std::io::Error::from)
        }
    }

    /// Writes nanoseconds as the microseconds Chrome's trace format counts: the number
    /// `serde_json` reads from their exact decimal text (`ns / 1000` with three decimals),
    /// which is `ns as f64 / 1000.0` (its reader divides the digits, read as an integer, by
    /// 1000) while the digits fit the integer it reads them into; past that, the text itself
    /// is read.
    #[inline]
    fn micros(&mut self, ns: u64) -> std::io::Result<()> {
        const EXACT_DIGITS_BELOW: u64 = 10_000_000_000_000_000_000;
        let value = if ns < EXACT_DIGITS_BELOW {
            ns as f64 / 1000.0
        } else {
            format!("{}.{:03}", ns / 1000, ns % 1000)
                .parse::<serde_json::Number>()
                .ok()
                .and_then(|n| n.as_f64())
                .unwrap_or((ns / 1000) as f64)
        };
        CompactFormatter.write_f64(&mut self.out, value)
    }
}

/// The snapshot as Chrome trace JSON for ui.perfetto.dev, as one string (see
/// [`write_perfetto`]).
pub fn to_perfetto(snapshot: &Snapshot) -> Result<String, ExportError> {
    let mut out = Vec::new();
    write_perfetto(snapshot, &mut out)?;
    Ok(String::from_utf8(out).unwrap_or_default())
}

/// Streams the snapshot as Chrome trace JSON for ui.perfetto.dev into `out`, one event at a
/// time: process and track names, a `memory` counter (allocated and reserved bytes, as the
/// engine counts them: memory from before the trace included, reserved left out where the
/// format does not record it) at the start and at every change, each allocation as a complete
/// slice on a track of its stream where it nests, OOMs as instants, and the steps on their own
/// track. Slices are written in start order, a longer one first when two start together, as
/// trace viewers expect of nested slices.
pub fn write_perfetto(snapshot: &Snapshot, out: impl Write) -> Result<(), ExportError> {
    write_perfetto_window(snapshot, 0..snapshot.events.len(), out)
}

/// [`write_perfetto`] for the events at `window` (indices into the snapshot's events, as
/// [`super::StepRange::window`] finds those of a range of steps): the counter starts at the
/// engine's usage before the window's first event (memory allocated before it included) and
/// changes with the window's events; the allocations made in the window are slices, those
/// still live at its last event ending there (`live_at_end`); OOMs and steps are those in the
/// window. The whole trace is `0..events.len()`.
pub fn write_perfetto_window(
    snapshot: &Snapshot,
    window: Range<usize>,
    out: impl Write,
) -> Result<(), ExportError> {
    let n = snapshot.events.len();
    let window = window.start.min(n)..window.end.min(n);
    let mut writer = TraceWriter::new(snapshot, out);
    writer.open()?;
    let (mut intervals, last) = writer.write_counters(window.clone())?;
    writer.write_allocations(&mut intervals)?;
    drop(intervals);
    writer.write_steps(last, window)?;
    writer.close()
}

/// About how many bytes [`write_perfetto_window`] writes for the events at `window`, from
/// the events alone (one pass over their kinds and call sites, no engine walk), so that a
/// caller can say before writing that the file passes what a viewer opens: about
/// [`COUNTER_BYTES`] for the counter sample after each event that changes the memory in use,
/// and [`SLICE_BYTES`] and the length of its call site's label for each allocation's slice.
pub fn perfetto_size_estimate(snapshot: &Snapshot, window: Range<usize>) -> u64 {
    let mut sizes = EventSizes::new(snapshot);
    let n = snapshot.events.len();
    let window = window.start.min(n)..window.end.min(n).max(window.start.min(n));
    snapshot.events[window]
        .iter()
        .fold(0u64, |total, e| total.saturating_add(sizes.of(e)))
}

/// The last step `last` such that steps `first..=last` of `snapshot` make a Perfetto trace of
/// at most about `limit` bytes ([`perfetto_size_estimate`]), with its size; `None` when step
/// `first` alone passes it or the trace has no events from step `first` on. Events are taken
/// in order, as steps come in runs.
pub fn perfetto_steps_within(snapshot: &Snapshot, first: u64, limit: u64) -> Option<(u64, u64)> {
    let mut sizes = EventSizes::new(snapshot);
    let mut total = 0u64;
    let mut within = None;
    let mut current: Option<u64> = None;
    for e in snapshot
        .events
        .iter()
        .skip_while(|e| u64::from(e.step) < first)
    {
        let step = u64::from(e.step);
        if current != Some(step) {
            // Every event of the step before is counted: it fits.
            if let Some(done) = current {
                within = Some((done, total));
            }
            current = Some(step);
        }
        total = total.saturating_add(sizes.of(e));
        if total > limit {
            return within;
        }
    }
    current.map(|last| (last, total))
}

/// The bytes each event adds to a Perfetto trace, about ([`perfetto_size_estimate`]), with
/// the length of each call site's label made once.
struct EventSizes<'s> {
    snapshot: &'s Snapshot,
    label_len: Vec<Option<u64>>,
}

impl<'s> EventSizes<'s> {
    fn new(snapshot: &'s Snapshot) -> EventSizes<'s> {
        EventSizes {
            snapshot,
            label_len: vec![None; snapshot.sites.len()],
        }
    }

    /// About the bytes `e` adds.
    fn of(&mut self, e: &vramscope_model::Event) -> u64 {
        match e.kind {
            EventKind::Alloc => {
                let sites = &self.snapshot.sites;
                let label = match e.site().map(|id| id as usize) {
                    Some(id) if id < sites.len() => *self.label_len[id].get_or_insert_with(|| {
                        let chars = |text: &str| text.len().min(vramscope_model::LABEL_CHARS);
                        (chars(&sites[id].file) + chars(&sites[id].function) + 12) as u64
                    }),
                    _ => 14,
                };
                COUNTER_BYTES + SLICE_BYTES + label
            }
            EventKind::FreeCompleted
            | EventKind::SegmentAlloc
            | EventKind::SegmentFree
            | EventKind::SegmentMap
            | EventKind::SegmentUnmap => COUNTER_BYTES,
            _ => 0,
        }
    }
}

/// About the bytes of the counter sample after an event that changes the memory in use
/// (`{"args":{"allocated":…,"reserved":…},"name":"memory",…}`).
pub const COUNTER_BYTES: u64 = 100;
/// About the bytes of an allocation's slice beside its call site's label.
pub const SLICE_BYTES: u64 = 150;

/// Track 0 holds the steps; allocation tracks follow, per stream.
const STEPS_TID: u64 = 0;

/// What every step of [`write_perfetto`] shares: the output and whether an event was written
/// yet, the snapshot, its process id, its clock and the call sites' labels made so far.
struct TraceWriter<'s, W: Write> {
    out: JsonOut<W>,
    /// Whether no event has been written yet (the first has no separator before it).
    first: bool,
    snapshot: &'s Snapshot,
    /// The process id of the device's tracks.
    pid: u64,
    /// Whether any event has a time stamp.
    timed: bool,
    /// The label of each call site once made (a few hundred sites serve millions of slices),
    /// and the label of an event without a site.
    labels: Vec<Option<String>>,
}

impl<'s, W: Write> TraceWriter<'s, W> {
    fn new(snapshot: &'s Snapshot, out: W) -> TraceWriter<'s, W> {
        TraceWriter {
            out: JsonOut {
                out: BufWriter::with_capacity(1 << 16, out),
            },
            first: true,
            snapshot,
            pid: snapshot.device.index as u64,
            timed: snapshot.events.iter().any(|e| e.time_ns > 0),
            labels: Vec::new(),
        }
    }

    /// The time of an event or mark in nanoseconds. Without timestamps (older PyTorch files),
    /// event order stands in for time: 1 µs each.
    fn ts(&self, seq: u64, time_ns: u64) -> u64 {
        if self.timed {
            time_ns
        } else {
            seq.saturating_mul(1000)
        }
    }

    /// Starts one trace event: a separator when it is not the first, then `{`.
    #[inline]
    fn begin(&mut self) -> std::io::Result<()> {
        self.out.raw(if self.first { b"\n{" } else { b",\n{" })?;
        self.first = false;
        Ok(())
    }

    /// Writes how a slice or an instant names its call site, quoted: its file, line and
    /// function, names cut to [`vramscope_model::LABEL_CHARS`] characters, as the label is
    /// written once per event (one 200 KB function name made a 6 GB trace of a 1 MB file).
    /// Each site's label is made once.
    fn site_label(&mut self, site: Option<SiteId>) -> std::io::Result<()> {
        use vramscope_model::{elide_end, elide_start, LABEL_CHARS};
        let Some((id, s)) = site.and_then(|id| Some((id as usize, self.snapshot.site(Some(id))?)))
        else {
            return self.out.str("(unknown site)");
        };
        if self.labels.len() <= id {
            self.labels.resize(id + 1, None);
        }
        let label = self.labels[id].get_or_insert_with(|| {
            let file_line = format!("{}:{}", elide_start(&s.file, LABEL_CHARS), s.line);
            if s.function.is_empty() {
                file_line
            } else {
                format!("{file_line} ({})", elide_end(&s.function, LABEL_CHARS))
            }
        });
        let label: &str = label;
        // The label is borrowed from `labels` while `out` writes it: two fields of `self`.
        let out = &mut self.out;
        out.str(label)
    }

    /// Opens the document and names the process.
    fn open(&mut self) -> Result<(), ExportError> {
        self.out
            .raw(b"{\"displayTimeUnit\":\"ms\",\"traceEvents\":[")?;
        let device = &self.snapshot.device;
        let name = format!("{} ({})", device.name, self.snapshot.source);
        self.begin()?;
        self.out.raw(b"\"args\":{\"name\":")?;
        self.out.str(&name)?;
        self.out
            .raw(b"},\"name\":\"process_name\",\"ph\":\"M\",\"pid\":")?;
        self.out.uint(self.pid)?;
        self.out.raw(b"}")?;
        Ok(())
    }

    /// Writes one `memory` counter sample at time `t`.
    fn write_counter(
        &mut self,
        t: u64,
        usage: Usage,
        reserved_known: bool,
    ) -> Result<(), ExportError> {
        self.begin()?;
        self.out.raw(b"\"args\":{\"allocated\":")?;
        self.out.uint(usage.allocated)?;
        if reserved_known {
            self.out.raw(b",\"reserved\":")?;
            self.out.uint(usage.reserved)?;
        }
        self.out
            .raw(b"},\"name\":\"memory\",\"ph\":\"C\",\"pid\":")?;
        self.out.uint(self.pid)?;
        self.out.raw(b",\"ts\":")?;
        self.out.micros(t)?;
        self.out.raw(b"}")?;
        Ok(())
    }

    /// Writes an OOM as an instant at time `t`.
    fn write_oom(&mut self, t: u64, event: &vramscope_model::Event) -> Result<(), ExportError> {
        self.begin()?;
        self.out.raw(b"\"args\":{\"device_free\":")?;
        self.out.uint(event.device_free)?;
        self.out.raw(b",\"requested\":")?;
        self.out.uint(event.size)?;
        self.out.raw(b",\"site\":")?;
        self.site_label(event.site())?;
        self.out.raw(b"},\"name\":\"OOM\",\"ph\":\"i\",\"pid\":")?;
        self.out.uint(self.pid)?;
        self.out.raw(b",\"s\":\"p\",\"ts\":")?;
        self.out.micros(t)?;
        self.out.raw(b"}")?;
        Ok(())
    }

    /// Writes the `memory` counter at the start of `window` and at every change, and the
    /// OOMs, in event order, and collects the window's allocations as intervals. Returns them
    /// with the time of the window's last event.
    fn write_counters(
        &mut self,
        window: Range<usize>,
    ) -> Result<(Vec<Interval>, u64), ExportError> {
        let snapshot = self.snapshot;
        check_sizes(snapshot)?;
        let walk = Reconstruction::from_snapshot(snapshot);
        let mut intervals: Vec<Interval> = Vec::new();
        // The interval of each allocation event of the window, by the event's index less the
        // window's start (`NO_INTERVAL` for other events).
        const NO_INTERVAL: u32 = u32::MAX;
        let mut interval_of: Vec<u32> = Vec::new();
        let interval_at = |interval_of: &[u32], event: Option<u32>| {
            event
                .and_then(|a| (a as usize).checked_sub(window.start))
                .and_then(|k| interval_of.get(k).copied())
                .filter(|&i| i != NO_INTERVAL)
                .map(|i| i as usize)
        };
        let mut last = 0u64;
        // The state before the window's first event, at the time of that event (at 0 without
        // events: the dump-time state alone).
        let mut shown = match window.start.checked_sub(1) {
            Some(before) => walk.usage.get(before).unwrap_or_else(|| walk.start.usage()),
            None => walk.start.usage(),
        };
        let t0 = snapshot
            .events
            .get(window.start)
            .map_or(0, |first| self.ts(first.seq, first.time_ns));
        self.write_counter(t0, shown, walk.reserved_known)?;
        let events = snapshot.events[window.clone()].iter();
        let usages = walk.usage.iter().skip(window.start);
        for ((k, event), usage) in (window.start..).zip(events).zip(usages) {
            let t = self.ts(event.seq, event.time_ns);
            last = last.max(t);
            match event.kind {
                EventKind::Alloc => {
                    // An allocation over a block the trace had not freed (a lost free) ends
                    // that block's slice here, where the engine's walk replaces it.
                    let replaced = FreeLink::unpack(walk.links[k]).alloc;
                    if let Some(i) = interval_at(&interval_of, replaced) {
                        intervals[i].end = t.max(intervals[i].start);
                        intervals[i].live_at_end = false;
                    }
                    interval_of.resize(k - window.start, NO_INTERVAL);
                    interval_of.push(intervals.len() as u32);
                    intervals.push(Interval {
                        start: t,
                        end: t,
                        index: intervals.len(),
                        size: event.size,
                        addr: event.addr,
                        stream: event.stream,
                        site: event.site(),
                        step: u64::from(event.step),
                        live_at_end: true,
                        tid: 0,
                    });
                }
                EventKind::FreeCompleted => {
                    // The engine's pairing names the allocation this free releases.
                    let link = FreeLink::unpack(walk.links[k]);
                    if let Some(i) = interval_at(&interval_of, link.alloc) {
                        // A clock that went backwards gives an empty slice, not a negative one.
                        intervals[i].end = t.max(intervals[i].start);
                        intervals[i].live_at_end = false;
                    }
                }
                EventKind::Oom => self.write_oom(t, event)?,
                _ => {}
            }
            if usage != shown {
                self.write_counter(t, usage, walk.reserved_known)?;
                shown = usage;
            }
        }
        drop(interval_of);
        // Blocks still live at the end stay open until the last event.
        for v in intervals.iter_mut().filter(|v| v.live_at_end) {
            v.end = last.max(v.start);
        }
        Ok((intervals, last))
    }

    /// Names a track: a `thread_name` metadata event.
    fn write_track_name(&mut self, tid: u64, name: &str) -> Result<(), ExportError> {
        self.begin()?;
        self.out.raw(b"\"args\":{\"name\":")?;
        self.out.str(name)?;
        self.out
            .raw(b"},\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":")?;
        self.out.uint(self.pid)?;
        self.out.raw(b",\"tid\":")?;
        self.out.uint(tid)?;
        self.out.raw(b"}")?;
        Ok(())
    }

    /// Names the steps' track and the allocation tracks, then writes every allocation as a
    /// slice on its track, in start order (a longer one first when two start together).
    fn write_allocations(&mut self, intervals: &mut [Interval]) -> Result<(), ExportError> {
        let pid = self.pid;
        let mut next_tid = STEPS_TID + 1;
        let tracks = assign_tracks(intervals, &mut next_tid);
        self.write_track_name(STEPS_TID, "steps")?;
        for (tid, stream, lane) in tracks {
            self.write_track_name(
                tid,
                &format!("stream {stream:#x} · allocations {}", lane + 1),
            )?;
            self.begin()?;
            self.out.raw(b"\"args\":{\"sort_index\":")?;
            self.out.uint(tid)?;
            self.out
                .raw(b"},\"name\":\"thread_sort_index\",\"ph\":\"M\",\"pid\":")?;
            self.out.uint(pid)?;
            self.out.raw(b",\"tid\":")?;
            self.out.uint(tid)?;
            self.out.raw(b"}")?;
        }
        intervals.sort_unstable_by_key(|v| (v.start, Reverse(v.end), v.index));
        let mut name = String::new();
        let mut named_size = None;
        for v in intervals.iter() {
            self.begin()?;
            self.out.raw(b"\"args\":{\"addr\":\"")?;
            write!(self.out.out, "{:#x}", v.addr)?;
            self.out.raw(b"\",")?;
            if v.live_at_end {
                self.out.raw(b"\"live_at_end\":true,")?;
            }
            self.out.raw(b"\"site\":")?;
            self.site_label(v.site)?;
            self.out.raw(b",\"size\":")?;
            self.out.uint(v.size)?;
            self.out.raw(b",\"step\":")?;
            self.out.uint(v.step)?;
            self.out.raw(b",\"stream\":")?;
            self.out.uint(v.stream)?;
            self.out.raw(b"},\"dur\":")?;
            self.out.micros(v.end - v.start)?;
            self.out.raw(b",\"name\":")?;
            // Sizes repeat from one slice to the next: the last one's name is kept.
            if named_size != Some(v.size) {
                name = vramscope_model::format_bytes(v.size);
                named_size = Some(v.size);
            }
            self.out.str(&name)?;
            self.out.raw(b",\"ph\":\"X\",\"pid\":")?;
            self.out.uint(pid)?;
            self.out.raw(b",\"tid\":")?;
            self.out.uint(v.tid)?;
            self.out.raw(b",\"ts\":")?;
            self.out.micros(v.start)?;
            self.out.raw(b"}")?;
        }
        Ok(())
    }

    /// Writes the steps of `window` on their track, in time order, each until the next begins
    /// (the last until `last`, the time of the window's last event). A step is in the window
    /// when its number is one of the window's events' steps (all of them for the whole
    /// trace).
    fn write_steps(&mut self, last: u64, window: Range<usize>) -> Result<(), ExportError> {
        let pid = self.pid;
        let snapshot = self.snapshot;
        let whole = window == (0..snapshot.events.len());
        let in_window = |step: u64| {
            whole || {
                let events = &snapshot.events[window.clone()];
                let first = events.first().map_or(0, |e| u64::from(e.step));
                let last = events.last().map_or(0, |e| u64::from(e.step));
                (first..=last).contains(&step)
            }
        };
        let mut marks: Vec<(u64, u64, &str)> = snapshot
            .steps
            .iter()
            .filter(|m| in_window(m.step))
            .map(|m| (self.ts(m.seq, m.time_ns), m.step, m.label.as_str()))
            .collect();
        marks.sort_by_key(|&(t, step, _)| (t, step));
        for (i, &(start, step, label)) in marks.iter().enumerate() {
            let end = marks.get(i + 1).map_or(last, |next| next.0).max(start);
            self.begin()?;
            self.out.raw(b"\"args\":{\"label\":")?;
            self.out.str(label)?;
            self.out.raw(b"},\"dur\":")?;
            self.out.micros(end - start)?;
            self.out.raw(b",\"name\":\"step ")?;
            self.out.uint(step)?;
            self.out.raw(b"\",\"ph\":\"X\",\"pid\":")?;
            self.out.uint(pid)?;
            self.out.raw(b",\"tid\":")?;
            self.out.uint(STEPS_TID)?;
            self.out.raw(b",\"ts\":")?;
            self.out.micros(start)?;
            self.out.raw(b"}")?;
        }
        Ok(())
    }

    /// Closes the document and flushes the output.
    fn close(mut self) -> Result<(), ExportError> {
        self.out.raw(b"\n]}\n")?;
        self.out.out.flush()?;
        Ok(())
    }
}
