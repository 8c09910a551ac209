//! Host-side events seen from Python: the synchronizing calls PyTorch reports under
//! `torch.cuda.set_sync_debug_mode("warn")` and the steps Python marks, merged into a snapshot
//! as `Sync` events and step marks so that the inspector's `sync_in_loop` detector and the
//! pytest marker's sync check find them at the Python line.
//!
//! Neither PyTorch's allocator nor vramscope's under `CUDAPluggableAllocator` sees a sync: the
//! warning is the only place one shows. The Python package turns each warning into
//! [`HostLog::sync`] (the warning's `file:line`, with the calling thread's Python stack from
//! there outwards as the site's frames) and each step mark into [`HostLog::mark_step`], both
//! stamped with the wall clock. [`merge`] adds them to a snapshot taken later: each sync
//! becomes an event at its time, in the step the snapshot itself numbers there
//! ([`Numbering`]); a snapshot without steps of its own takes Python's marks. Syncs older than
//! the snapshot's first event lie outside what it recorded and are left out. The log keeps the
//! latest [`MAX_RECORDS`] syncs and marks.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

use pyo3::prelude::*;
use rustc_hash::FxHashMap;
use vramscope_import::sites::{is_framework_frame, primary_frame};
use vramscope_model::{
    event_step, CallSite, DeviceInfo, Event, EventKind, Frame, Id, Snapshot, SnapshotSource,
    StepMark,
};

use crate::analysis;
use crate::stack;

/// Syncs, and step marks, a log keeps (the oldest go first).
pub const MAX_RECORDS: usize = 1 << 20;

/// Distinct sync sites kept with their whole stack; beyond, a new one keeps its line alone.
const MAX_SITES: usize = 1 << 16;

/// How long after Python marked a step the snapshot's own mark for it may come, in
/// nanoseconds: the two are made by one call, on clocks that may differ by this much.
const MARK_SLACK_NS: u64 = 2_000_000;

/// One synchronizing call.
#[derive(Clone, Copy, Debug)]
struct SyncRecord {
    /// Wall-clock time, nanoseconds since the Unix epoch.
    unix_ns: u64,
    /// Python's step number at the time.
    step: u64,
    site: &'static CallSite,
}

/// What a [`HostLog`] holds.
#[derive(Clone, Debug, Default)]
pub struct LogData {
    syncs: VecDeque<SyncRecord>,
    /// `(step, wall-clock nanoseconds)` of each step mark, oldest first.
    steps: VecDeque<(u64, u64)>,
    step: u64,
    dropped: u64,
}

/// How the steps of the snapshot a log is merged into relate to Python's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Numbering {
    /// The snapshot's step numbers are Python's (vramscope's allocator, marked by the same
    /// call): a sync keeps Python's step.
    Same,
    /// The snapshot numbers its own steps (PyTorch's annotations): a sync takes the snapshot's
    /// step in force just after the Python step it was made in began, or at its own time,
    /// whichever is later.
    ByTime,
}

fn now_unix_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

/// Sync sites by (the captured stack's address, the warning's file and line).
type SiteKey = (usize, String, u32);

static SITES: Mutex<Option<FxHashMap<SiteKey, &'static CallSite>>> = Mutex::new(None);

/// The site of a sync that the warning put at `file:line`, with `stack` (the Python stack
/// where the warning was shown, innermost first) as its frames from that line outwards.
fn sync_site(stack: Option<&'static CallSite>, file: &str, line: u32) -> &'static CallSite {
    let mut guard = SITES.lock().unwrap_or_else(|e| e.into_inner());
    let sites = guard.get_or_insert_with(FxHashMap::default);
    let full = sites.len() < MAX_SITES;
    let stack = stack.filter(|_| full);
    let key = (
        stack.map_or(0, |s| s as *const CallSite as usize),
        file.to_string(),
        line,
    );
    if let Some(&site) = sites.get(&key) {
        return site;
    }
    let paths = stack::framework_paths();
    let own = Frame {
        file: file.to_string(),
        line,
        function: String::new(),
    };
    let frames: Vec<Frame> = match stack {
        Some(stack) => match stack
            .frames
            .iter()
            .position(|f| f.file == file && f.line == line)
        {
            Some(at) => stack.frames[at..].to_vec(),
            // The warning names a line that is not on the stack: it comes first, then the
            // stack without the frames that showed the warning (this package, `warnings`).
            None => std::iter::once(own)
                .chain(
                    stack
                        .frames
                        .iter()
                        .skip_while(|f| is_framework_frame(f, &paths))
                        .cloned(),
                )
                .collect(),
        },
        None => vec![own],
    };
    let primary = primary_frame(&frames, &paths).unwrap_or(0);
    let top = frames[primary].clone();
    let site: &'static CallSite = Box::leak(Box::new(CallSite {
        file: top.file,
        line: top.line,
        column: 0,
        function: top.function,
        frames,
    }));
    sites.insert(key, site);
    site
}

impl LogData {
    fn push_sync(&mut self, record: SyncRecord) {
        if self.syncs.len() >= MAX_RECORDS {
            self.syncs.pop_front();
            self.dropped += 1;
        }
        self.syncs.push_back(record);
    }

    fn push_step(&mut self, step: u64, unix_ns: u64) {
        if self.steps.len() >= MAX_RECORDS {
            self.steps.pop_front();
        }
        self.steps.push_back((step, unix_ns));
        self.step = step;
    }

    /// The earliest time the log holds.
    fn earliest(&self) -> Option<u64> {
        let syncs = self.syncs.iter().map(|s| s.unix_ns);
        syncs.chain(self.steps.iter().map(|s| s.1)).min()
    }

    /// A snapshot that holds only this log: its syncs and its step marks.
    pub fn alone(&self) -> Snapshot {
        let mut snapshot = Snapshot::empty(SnapshotSource::Vramscope, DeviceInfo::default());
        merge(&mut snapshot, self, Numbering::Same);
        snapshot
    }
}

/// Adds `log`'s syncs (as `Sync` events with their sites) and, when `snapshot` has no steps
/// of its own, its step marks to `snapshot`; see the module documentation. Events keep their
/// order and are renumbered from the first one's sequence number; step marks move with them.
pub fn merge(snapshot: &mut Snapshot, log: &LogData, numbering: Numbering) {
    if log.syncs.is_empty() && log.steps.is_empty() {
        return;
    }
    if snapshot.events.is_empty() && snapshot.steps.is_empty() && snapshot.epoch_unix_ns == 0 {
        snapshot.epoch_unix_ns = log.earliest().unwrap_or(0);
    }
    let epoch = snapshot.epoch_unix_ns;
    let rel = |unix_ns: u64| unix_ns.saturating_sub(epoch);
    let marked = !snapshot.steps.is_empty() || snapshot.events.iter().any(|e| e.step > 0);
    let python_marks: Vec<(u64, u64)> = log.steps.iter().map(|&(s, t)| (s, rel(t))).collect();
    let take_marks = !marked && !python_marks.is_empty();
    if take_marks {
        for e in &mut snapshot.events {
            // A program marks fewer than 4 billion steps, which an event holds.
            e.step = event_step(step_at(&python_marks, e.time_ns)).unwrap_or(u32::MAX);
        }
    }
    let window_start = snapshot.events.first().map(|e| e.time_ns);
    let mut ids: FxHashMap<usize, u32> = FxHashMap::default();
    let mut syncs: Vec<Event> = Vec::with_capacity(log.syncs.len());
    for record in &log.syncs {
        let time_ns = rel(record.unix_ns);
        if window_start.is_some_and(|start| time_ns < start) {
            continue;
        }
        let step = if !marked || numbering == Numbering::Same {
            record.step
        } else {
            snapshot_step(snapshot, &python_marks, record.step, time_ns)
        };
        let site = *ids
            .entry(record.site as *const CallSite as usize)
            .or_insert_with(|| site_id(&mut snapshot.sites, record.site));
        syncs.push(Event {
            seq: 0,
            time_ns,
            kind: EventKind::Sync,
            // A CUDA device ordinal; one past 2^16 would read as 65535, out of range.
            device: u16::try_from(snapshot.device.index).unwrap_or(u16::MAX),
            stream: 0,
            addr: 0,
            size: 0,
            requested: 0,
            site: Id::new(site),
            tag: None,
            scope: None,
            step: event_step(step).unwrap_or(u32::MAX),
            thread: 0,
            device_free: 0,
        });
    }
    if syncs.is_empty() && !take_marks {
        return;
    }
    syncs.sort_by_key(|e| e.time_ns);
    let old = std::mem::take(&mut snapshot.events);
    let base = old.first().map_or(0, |e| e.seq);
    let old_seqs: Vec<u64> = old.iter().map(|e| e.seq).collect();
    let mut moved_to = Vec::with_capacity(old.len());
    let mut merged = Vec::with_capacity(old.len() + syncs.len());
    let mut pending = syncs.into_iter().peekable();
    for e in old {
        while let Some(sync) = pending.next_if(|s| s.time_ns < e.time_ns) {
            merged.push(sync);
        }
        moved_to.push(merged.len() as u64);
        merged.push(e);
    }
    merged.extend(pending);
    for (i, e) in merged.iter_mut().enumerate() {
        e.seq = base + i as u64;
    }
    let end = base + merged.len() as u64;
    for mark in &mut snapshot.steps {
        let first = old_seqs.partition_point(|&seq| seq < mark.seq);
        mark.seq = moved_to.get(first).map_or(end, |&at| base + at);
    }
    if take_marks {
        snapshot.steps = python_marks
            .iter()
            .map(|&(step, time_ns)| StepMark {
                step,
                seq: base + merged.partition_point(|e| e.time_ns < time_ns) as u64,
                time_ns,
                label: "mark_step".to_string(),
            })
            .collect();
    }
    snapshot.events = merged.into();
}

/// The step in force at `time_ns` by `marks` (`(step, time)`, oldest first): 0 before them.
fn step_at(marks: &[(u64, u64)], time_ns: u64) -> u64 {
    match marks.partition_point(|m| m.1 <= time_ns) {
        0 => 0,
        i => marks[i - 1].0,
    }
}

/// The snapshot's step for a sync at `time_ns` made in Python's step `python_step`, by time:
/// see [`Numbering::ByTime`].
fn snapshot_step(
    snapshot: &Snapshot,
    python_marks: &[(u64, u64)],
    python_step: u64,
    time_ns: u64,
) -> u64 {
    let at = python_marks.partition_point(|m| m.0 < python_step);
    let anchor = match python_marks.get(at).filter(|m| m.0 == python_step) {
        Some(&(_, began)) => {
            let settled = match python_marks.get(at + 1) {
                Some(&(_, next)) => began + MARK_SLACK_NS.min(next.saturating_sub(began) / 2),
                None => began + MARK_SLACK_NS,
            };
            time_ns.max(settled)
        }
        None => time_ns,
    };
    if !snapshot.steps.is_empty() {
        return match snapshot.steps.partition_point(|m| m.time_ns <= anchor) {
            0 => 0,
            i => snapshot.steps[i - 1].step,
        };
    }
    match snapshot.events.partition_point(|e| e.time_ns <= anchor) {
        0 => 0,
        i => u64::from(snapshot.events[i - 1].step),
    }
}

/// The index of `site` in `sites`, appended when no equal site is there.
fn site_id(sites: &mut Vec<CallSite>, site: &CallSite) -> u32 {
    match sites.iter().position(|s| s == site) {
        Some(at) => at as u32,
        None => {
            sites.push(site.clone());
            (sites.len() - 1) as u32
        }
    }
}

/// The synchronizing calls and step marks of one watched program, as Python reports them.
#[pyclass(module = "vramscope._native", frozen)]
#[derive(Default)]
pub struct HostLog {
    data: Mutex<LogData>,
}

impl HostLog {
    /// A copy of what the log holds.
    pub fn data(&self) -> LogData {
        self.data.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

#[pymethods]
impl HostLog {
    /// An empty log.
    #[new]
    fn new() -> HostLog {
        HostLog::default()
    }

    /// Records a synchronizing call that a warning put at `file:line`, with the calling
    /// thread's Python stack (call it where the warning is shown). Returns the site as
    /// `(file, line, function)`: the innermost frame of the user's own code from that line
    /// outwards.
    fn sync(&self, py: Python<'_>, file: &str, line: u32) -> (String, u32, String) {
        let _ = py;
        // SAFETY: a method called from Python runs with the GIL held (`py` proves it).
        let stack = unsafe { stack::capture() };
        let site = sync_site(stack, file, line);
        let mut data = self.data.lock().unwrap_or_else(|e| e.into_inner());
        let step = data.step;
        data.push_sync(SyncRecord {
            unix_ns: now_unix_ns(),
            step,
            site,
        });
        (site.file.clone(), site.line, site.function.clone())
    }

    /// Records the start of Python's step `step`.
    fn mark_step(&self, step: u64) {
        let mut data = self.data.lock().unwrap_or_else(|e| e.into_inner());
        data.push_step(step, now_unix_ns());
    }

    /// Syncs held.
    #[getter]
    fn syncs(&self) -> usize {
        self.data
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .syncs
            .len()
    }

    /// Syncs dropped to keep the log bounded.
    #[getter]
    fn dropped(&self) -> u64 {
        self.data.lock().unwrap_or_else(|e| e.into_inner()).dropped
    }

    /// The inspector's findings on the log's syncs and steps alone.
    fn findings(&self) -> Vec<crate::report::Finding> {
        let data = self.data();
        crate::report::findings_of(&data.alone())
    }

    /// The sync check of the pytest marker on the log alone: the failure, if any.
    fn check(&self, max_syncs_per_step: u64) -> Vec<String> {
        let data = self.data();
        analysis::check(
            &data.alone(),
            analysis::Limits {
                max_syncs_per_step: Some(max_syncs_per_step),
                ..analysis::Limits::default()
            },
        )
    }
}

/// `snapshot` with `log` merged in, when there is a log.
pub fn with_log(mut snapshot: Snapshot, log: Option<&HostLog>, numbering: Numbering) -> Snapshot {
    if let Some(log) = log {
        merge(&mut snapshot, &log.data(), numbering);
    }
    snapshot
}
