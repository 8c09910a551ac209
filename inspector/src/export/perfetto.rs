//! The Perfetto export: a snapshot as Chrome trace JSON that ui.perfetto.dev opens, streamed
//! one event at a time.
//!
//! [`write_perfetto`] makes three passes, each a named step: the events in order (a `memory`
//! counter at every change of allocated or reserved bytes, OOMs as instants, and each
//! allocation collected as an [`Interval`] from its allocation to its free), the allocations
//! (each interval assigned a track of its stream where it nests, by [`assign_tracks`], then
//! written as a complete slice in start order), and the steps on a track of their own. A
//! [`TraceWriter`] holds what every step shares: the output, the separator state, the process
//! id and the clock. The parent module (`crate::export`) re-exports the two public functions
//! and lends its checked addition, so a sum past 2^64 bytes is an [`ExportError`] here too.

use std::cmp::Reverse;
use std::collections::{BTreeSet, BinaryHeap};
use std::io::{BufWriter, Write};

use rustc_hash::FxHashMap;
use serde_json::json;
use vramscope_model::{EventKind, SiteId, Snapshot};

use super::{add, ExportError};

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
/// time: process and track names, a `memory` counter (allocated and reserved bytes) at every
/// change, each allocation as a complete slice on a track of its stream where it nests, OOMs
/// as instants, and the steps on their own track. Slices are written in start order, a longer
/// one first when two start together, as trace viewers expect of nested slices.
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

    /// How a slice or an instant names its call site.
    fn site_label(&self, site: Option<SiteId>) -> String {
        self.snapshot
            .site(site)
            .map(|s| {
                if s.function.is_empty() {
                    s.file_line()
                } else {
                    format!("{} ({})", s.file_line(), s.function)
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

    /// Writes the `memory` counter at every change and the OOMs, in event order, and collects
    /// the allocations as intervals. Returns them with the time of the last event.
    fn write_counters(&mut self) -> Result<(Vec<Interval>, u64), ExportError> {
        let snapshot = self.snapshot;
        let pid = self.pid;
        let mut intervals: Vec<Interval> = Vec::new();
        let mut open: FxHashMap<(u32, u64), usize> = FxHashMap::default();
        let (mut allocated, mut reserved) = (0u64, 0u64);
        let mut last = 0u64;
        for (k, event) in snapshot.events.iter().enumerate() {
            let t = self.ts(event.seq, event.time_ns);
            last = last.max(t);
            let path = || format!("events[{k}].size");
            let counters_changed = match event.kind {
                EventKind::Alloc => {
                    open.insert((event.device, event.addr), intervals.len());
                    intervals.push(Interval {
                        start: t,
                        end: t,
                        index: intervals.len(),
                        size: event.size,
                        addr: event.addr,
                        stream: event.stream,
                        site: event.site,
                        step: event.step,
                        live_at_end: true,
                        tid: 0,
                    });
                    allocated = add(allocated, event.size, path, "the allocated bytes")?;
                    true
                }
                EventKind::FreeCompleted => {
                    if let Some(i) = open.remove(&(event.device, event.addr)) {
                        // A clock that went backwards gives an empty slice, not a negative one.
                        intervals[i].end = t.max(intervals[i].start);
                        intervals[i].live_at_end = false;
                    }
                    // A block from before the trace was never counted: the figure stays at 0.
                    allocated = allocated.saturating_sub(event.size);
                    true
                }
                EventKind::SegmentAlloc | EventKind::SegmentMap => {
                    reserved = add(reserved, event.size, path, "the reserved bytes")?;
                    true
                }
                EventKind::SegmentFree | EventKind::SegmentUnmap => {
                    reserved = reserved.saturating_sub(event.size);
                    true
                }
                EventKind::Oom => {
                    let site = self.site_label(event.site);
                    self.emit(json!({
                        "ph": "i", "s": "p", "pid": pid, "ts": micros(t), "name": "OOM",
                        "args": {"requested": event.size, "device_free": event.device_free, "site": site}
                    }))?;
                    false
                }
                _ => false,
            };
            if counters_changed {
                self.emit(json!({
                    "ph": "C", "pid": pid, "ts": micros(t), "name": "memory",
                    "args": {"allocated": allocated, "reserved": reserved}
                }))?;
            }
        }
        drop(open);
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
