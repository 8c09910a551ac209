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

use rustc_hash::FxHashMap;
use serde_json::json;
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

/// Nanoseconds as the microseconds Chrome's trace format counts, exactly (three decimals).
fn micros(ns: u64) -> serde_json::Value {
    let text = format!("{}.{:03}", ns / 1000, ns % 1000);
    serde_json::Value::Number(
        text.parse::<serde_json::Number>()
            .unwrap_or_else(|_| serde_json::Number::from(ns / 1000)),
    )
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
    let mut writer = TraceWriter::new(snapshot, out);
    writer.open()?;
    let (mut intervals, last) = writer.write_counters()?;
    writer.write_allocations(&mut intervals)?;
    drop(intervals);
    writer.write_steps(last)?;
    writer.close()
}

/// Track 0 holds the steps; allocation tracks follow, per stream.
const STEPS_TID: u64 = 0;

/// What every step of [`write_perfetto`] shares: the output and whether an event was written
/// yet, the snapshot, its process id and its clock.
struct TraceWriter<'s, W: Write> {
    out: BufWriter<W>,
    /// Whether no event has been written yet (the first has no separator before it).
    first: bool,
    snapshot: &'s Snapshot,
    /// The process id of the device's tracks.
    pid: u64,
    /// Whether any event has a time stamp.
    timed: bool,
}

impl<'s, W: Write> TraceWriter<'s, W> {
    fn new(snapshot: &'s Snapshot, out: W) -> TraceWriter<'s, W> {
        TraceWriter {
            out: BufWriter::new(out),
            first: true,
            snapshot,
            pid: snapshot.device.index as u64,
            timed: snapshot.events.iter().any(|e| e.time_ns > 0),
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

    /// Writes one trace event, after a separator when it is not the first.
    fn emit(&mut self, event: serde_json::Value) -> Result<(), ExportError> {
        self.out
            .write_all(if self.first { b"\n" } else { b",\n" })?;
        self.first = false;
        serde_json::to_writer(&mut self.out, &event).map_err(std::io::Error::from)?;
        Ok(())
    }

    /// How a slice or an instant names its call site: its file, line and function, names cut
    /// to [`vramscope_model::LABEL_CHARS`] characters, as the label is written once per event
    /// (one 200 KB function name made a 6 GB trace of a 1 MB file).
    fn site_label(&self, site: Option<SiteId>) -> String {
        use vramscope_model::{elide_end, elide_start, LABEL_CHARS};
        self.snapshot
            .site(site)
            .map(|s| {
                let file_line = format!("{}:{}", elide_start(&s.file, LABEL_CHARS), s.line);
                if s.function.is_empty() {
                    file_line
                } else {
                    format!("{file_line} ({})", elide_end(&s.function, LABEL_CHARS))
                }
            })
            .unwrap_or_else(|| "(unknown site)".to_string())
    }

    /// Opens the document and names the process.
    fn open(&mut self) -> Result<(), ExportError> {
        self.out
            .write_all(b"{\"displayTimeUnit\":\"ms\",\"traceEvents\":[")?;
        let device = &self.snapshot.device;
        let name = format!("{} ({})", device.name, self.snapshot.source);
        self.emit(json!({
            "ph": "M", "name": "process_name", "pid": self.pid,
            "args": {"name": name}
        }))
    }

    /// Writes one `memory` counter sample at time `t`.
    fn write_counter(
        &mut self,
        t: u64,
        usage: Usage,
        reserved_known: bool,
    ) -> Result<(), ExportError> {
        let mut args = json!({"allocated": usage.allocated});
        if reserved_known {
            args["reserved"] = json!(usage.reserved);
        }
        self.emit(
            json!({"ph": "C", "pid": self.pid, "ts": micros(t), "name": "memory", "args": args}),
        )
    }

    /// Writes the `memory` counter at the start and at every change, and the OOMs, in event
    /// order, and collects the allocations as intervals. Returns them with the time of the last
    /// event.
    fn write_counters(&mut self) -> Result<(Vec<Interval>, u64), ExportError> {
        let snapshot = self.snapshot;
        let pid = self.pid;
        check_sizes(snapshot)?;
        let walk = Reconstruction::from_snapshot(snapshot);
        let mut intervals: Vec<Interval> = Vec::new();
        // The interval of each allocation event, by the event's index.
        let mut interval_of: FxHashMap<u32, usize> = FxHashMap::default();
        let mut last = 0u64;
        // The state before the first event, at the time of the first event (at 0 without
        // events: the dump-time state alone).
        let mut shown = walk.start.usage();
        let t0 = snapshot
            .events
            .first()
            .map_or(0, |first| self.ts(first.seq, first.time_ns));
        self.write_counter(t0, shown, walk.reserved_known)?;
        for ((k, event), usage) in snapshot.events.iter().enumerate().zip(walk.usage.iter()) {
            let t = self.ts(event.seq, event.time_ns);
            last = last.max(t);
            match event.kind {
                EventKind::Alloc => {
                    // An allocation over a block the trace had not freed (a lost free) ends
                    // that block's slice here, where the engine's walk replaces it.
                    let replaced = FreeLink::unpack(walk.links[k]).alloc;
                    if let Some(&i) = replaced.and_then(|a| interval_of.get(&a)) {
                        intervals[i].end = t.max(intervals[i].start);
                        intervals[i].live_at_end = false;
                    }
                    interval_of.insert(k as u32, intervals.len());
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
                    if let Some(&i) = link.alloc.and_then(|a| interval_of.get(&a)) {
                        // A clock that went backwards gives an empty slice, not a negative one.
                        intervals[i].end = t.max(intervals[i].start);
                        intervals[i].live_at_end = false;
                    }
                }
                EventKind::Oom => {
                    let site = self.site_label(event.site());
                    self.emit(json!({
                        "ph": "i", "s": "p", "pid": pid, "ts": micros(t), "name": "OOM",
                        "args": {"requested": event.size, "device_free": event.device_free, "site": site}
                    }))?;
                }
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

    /// Names the steps' track and the allocation tracks, then writes every allocation as a
    /// slice on its track, in start order (a longer one first when two start together).
    fn write_allocations(&mut self, intervals: &mut [Interval]) -> Result<(), ExportError> {
        let pid = self.pid;
        let mut next_tid = STEPS_TID + 1;
        let tracks = assign_tracks(intervals, &mut next_tid);
        self.emit(
            json!({"ph": "M", "name": "thread_name", "pid": pid, "tid": STEPS_TID, "args": {"name": "steps"}}),
        )?;
        for (tid, stream, lane) in tracks {
            self.emit(
                json!({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid,
                       "args": {"name": format!("stream {stream:#x} · allocations {}", lane + 1)}}),
            )?;
            self.emit(
                json!({"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid, "args": {"sort_index": tid}}),
            )?;
        }
        intervals.sort_by_key(|v| (v.start, Reverse(v.end), v.index));
        for v in intervals.iter() {
            let mut args = json!({"site": self.site_label(v.site), "size": v.size, "addr": format!("{:#x}", v.addr), "step": v.step, "stream": v.stream});
            if v.live_at_end {
                args["live_at_end"] = json!(true);
            }
            self.emit(json!({
                "ph": "X", "pid": pid, "tid": v.tid, "ts": micros(v.start), "dur": micros(v.end - v.start),
                "name": vramscope_model::format_bytes(v.size), "args": args
            }))?;
        }
        Ok(())
    }

    /// Writes the steps on their track, in time order, each until the next begins (the last
    /// until `last`, the time of the last event).
    fn write_steps(&mut self, last: u64) -> Result<(), ExportError> {
        let pid = self.pid;
        let snapshot = self.snapshot;
        let mut marks: Vec<(u64, u64, &str)> = snapshot
            .steps
            .iter()
            .map(|m| (self.ts(m.seq, m.time_ns), m.step, m.label.as_str()))
            .collect();
        marks.sort_by_key(|&(t, step, _)| (t, step));
        for (i, &(start, step, label)) in marks.iter().enumerate() {
            let end = marks.get(i + 1).map_or(last, |next| next.0).max(start);
            self.emit(json!({
                "ph": "X", "pid": pid, "tid": STEPS_TID, "ts": micros(start), "dur": micros(end - start),
                "name": format!("step {step}"), "args": {"label": label}
            }))?;
        }
        Ok(())
    }

    /// Closes the document and flushes the output.
    fn close(mut self) -> Result<(), ExportError> {
        self.out.write_all(b"\n]}\n")?;
        self.out.flush()?;
        Ok(())
    }
}
