//! The host's waits for the device in a torch.profiler trace, and the Python lines that made
//! them and the memory events.
//!
//! While `traceEvents` is read, [`Gathered`] keeps the few events this needs: the host slices
//! (`cpu_op`, the 2021 format's `Operator`, and `python_function`), the runtime calls that wait
//! or copy (`cuda_runtime`, the 2021 format's `Runtime`), the device copies (`gpu_memcpy`,
//! 2021: `Memcpy`) and the `ac2g` flows that link a runtime call to its device work where the
//! events carry no `correlation`. [`Gathered::resolve`] then turns them into `Sync` and
//! `Transfer` events of the model, each with the stack that enclosed it on its thread.
//!
//! What a wait is, from what the trace shows: a call of `cudaStreamSynchronize`,
//! `cudaDeviceSynchronize` or `cudaEventSynchronize` (or their driver forms), and a copy whose
//! call blocks the host without one: a synchronous `cudaMemcpy` to or from the host, or a
//! `cudaMemcpyAsync` from the device into pageable host memory. A copy followed by a sync in
//! the same operator (`.item()` is `cudaMemcpyAsync` then `cudaStreamSynchronize`) is one wait,
//! which lasts both calls. `cudaStreamWaitEvent` is not one: it makes a stream wait for
//! another on the device and returns at once. An operator that runs no such call (`.item()`
//! on a CPU tensor) is no wait, whatever its name. Device-to-device copies are not transfers
//! between host and device and are left out.
//!
//! A stack is built innermost first: the operators enclosing the call on its thread (as frames
//! without a source line, so that they never name a site but say what caused a wait), then the
//! Python frames, from the enclosing `python_function` slices (`file.py(143): forward`) or, in
//! the 2021 format, from the innermost operator's `Call stack` argument.

use rustc_hash::FxHashMap;
use vramscope_model::{Event, EventKind, Frame, Id, SiteId, TransferDirection};

use super::super::sites::SiteTable;
use super::{Num, RawEvent};

/// The place of categories in `super::CATEGORIES`.
const CAT_CPU_OP: usize = 0;
const CAT_OPERATOR: usize = 1;
const CAT_PYTHON: usize = 2;
const CAT_RUNTIME: usize = 3;
const CAT_RUNTIME_2021: usize = 4;
const CAT_DRIVER: usize = 5;
const CAT_COPY: usize = 6;
const CAT_COPY_2021: usize = 7;
const CAT_FLOW: usize = 8;

/// Runtime and driver calls that block the host until the device (or a stream, or an event)
/// is done.
const SYNC_CALLS: &[&str] = &[
    "cudaStreamSynchronize",
    "cudaDeviceSynchronize",
    "cudaEventSynchronize",
    "cuStreamSynchronize",
    "cuCtxSynchronize",
    "cuEventSynchronize",
];

/// Runtime and driver calls that copy, and whether the call itself blocks the host.
const COPY_CALLS: &[(&str, bool)] = &[
    ("cudaMemcpy", true),
    ("cudaMemcpyAsync", false),
    ("cudaMemcpy2D", true),
    ("cudaMemcpy2DAsync", false),
    ("cuMemcpyDtoH_v2", true),
    ("cuMemcpyHtoD_v2", true),
    ("cuMemcpyDtoHAsync_v2", false),
    ("cuMemcpyHtoDAsync_v2", false),
];

/// What a runtime call of interest does.
#[derive(Clone, Copy, PartialEq, Eq)]
enum CallKind {
    /// Waits for the device.
    Sync,
    /// Copies; `blocking` when the call itself waits for the copy.
    Copy { blocking: bool },
}

/// A host slice: an operator or a Python function.
struct Slice {
    thread: u32,
    start: f64,
    end: f64,
    python: bool,
    /// The name, interned.
    name: u32,
    /// The 2021 format's `Call stack`, interned.
    stack: Option<u32>,
}

/// A runtime call that waits or copies.
struct Call {
    thread: u32,
    start: f64,
    dur: f64,
    kind: CallKind,
    correlation: Option<i128>,
}

/// A copy on the device.
struct DeviceCopy {
    correlation: Option<i128>,
    thread: u32,
    ts: f64,
    direction: TransferDirection,
    /// Whether the host side is pageable memory (a copy into it blocks the host).
    pageable: bool,
    bytes: u64,
}

/// A point in time on a thread whose enclosing slices are wanted.
#[derive(Clone, Copy)]
pub(crate) struct Query {
    pub(crate) thread: u32,
    pub(crate) ts: f64,
}

/// Strings kept once.
#[derive(Default)]
struct Interner {
    ids: FxHashMap<Box<str>, u32>,
    list: Vec<Box<str>>,
}

impl Interner {
    fn intern(&mut self, s: &str) -> u32 {
        if let Some(&id) = self.ids.get(s) {
            return id;
        }
        let id = self.list.len() as u32;
        self.list.push(s.into());
        self.ids.insert(s.into(), id);
        id
    }

    fn get(&self, id: u32) -> &str {
        &self.list[id as usize]
    }
}

/// What the trace's activity adds to the snapshot: its waits and copies as events (times in
/// the trace's microseconds, not yet relative), and the site of each memory query.
pub(crate) struct Resolved {
    /// `Sync` and `Transfer` events, with their trace time in microseconds; `time_ns` and
    /// `seq` are filled by the caller.
    pub(crate) events: Vec<(f64, Event)>,
    /// The site of each memory event, in the order of the queries given; only stacks with a
    /// Python frame name one.
    pub(crate) memory_sites: Vec<Option<SiteId>>,
}

/// The events kept while the trace is read.
#[derive(Default)]
pub(crate) struct Gathered {
    threads: FxHashMap<(i128, i128), u32>,
    names: Interner,
    slices: Vec<Slice>,
    calls: Vec<Call>,
    copies: Vec<DeviceCopy>,
    /// A flow's start (`ph` `s`) by thread and time bits: its id.
    flow_starts: FxHashMap<(u32, u64), i128>,
    /// A flow's end (`ph` `f`) by thread and time bits: its id.
    flow_ends: FxHashMap<(u32, u64), i128>,
}

impl Gathered {
    /// The number of the thread `(pid, tid)`.
    pub(crate) fn thread(&mut self, pid: Num, tid: Num) -> u32 {
        let key = (pid.int().unwrap_or(-1), tid.int().unwrap_or(-1));
        let next = self.threads.len() as u32;
        *self.threads.entry(key).or_insert(next)
    }

    /// Keeps `e`, named `name`, when it is an event the waits or the stacks need.
    pub(crate) fn add(&mut self, name: &str, e: &RawEvent<'_>) {
        let Some(cat) = e.cat else { return };
        let Some(ts) = e.ts.float() else { return };
        let dur = e.dur.float().unwrap_or(0.0).max(0.0);
        match cat {
            CAT_CPU_OP | CAT_OPERATOR | CAT_PYTHON if e.ph == b'X' => {
                let python = cat == CAT_PYTHON;
                if python && parse_frame(name).is_none() {
                    // `nn.Module: Linear_0`, `<built-in method item of Tensor object at
                    // 0x7f..>`: no line of their own.
                    return;
                }
                let thread = self.thread(e.pid, e.tid);
                let stack = e
                    .args
                    .call_stack
                    .0
                    .as_deref()
                    .filter(|s| !s.is_empty())
                    .map(|s| self.names.intern(s));
                let name = self.names.intern(name);
                self.slices.push(Slice {
                    thread,
                    start: ts,
                    end: ts + dur,
                    python,
                    name,
                    stack,
                });
            }
            CAT_RUNTIME | CAT_RUNTIME_2021 | CAT_DRIVER if e.ph == b'X' => {
                let kind = if SYNC_CALLS.contains(&name) {
                    CallKind::Sync
                } else if let Some(&(_, blocking)) = COPY_CALLS.iter().find(|(n, _)| *n == name) {
                    CallKind::Copy { blocking }
                } else {
                    return;
                };
                let thread = self.thread(e.pid, e.tid);
                self.calls.push(Call {
                    thread,
                    start: ts,
                    dur,
                    kind,
                    correlation: e.args.correlation.int(),
                });
            }
            CAT_COPY | CAT_COPY_2021 if e.ph == b'X' => {
                let Some((direction, pageable)) = copy_direction(name) else {
                    return;
                };
                let thread = self.thread(e.pid, e.tid);
                self.copies.push(DeviceCopy {
                    correlation: e.args.correlation.int(),
                    thread,
                    ts,
                    direction,
                    pageable,
                    bytes: e
                        .args
                        .copy_bytes
                        .int()
                        .and_then(|b| u64::try_from(b).ok())
                        .unwrap_or(0),
                });
            }
            CAT_FLOW if matches!(e.ph, b's' | b'f') => {
                let Some(id) = e.id.int() else { return };
                let thread = self.thread(e.pid, e.tid);
                let map = if e.ph == b's' {
                    &mut self.flow_starts
                } else {
                    &mut self.flow_ends
                };
                map.insert((thread, ts.to_bits()), id);
            }
            _ => {}
        }
    }

    /// The waits and copies as events, and the sites of the memory events at `memory`,
    /// interned into `sites`; `device` is the device the snapshot describes.
    pub(crate) fn resolve(&self, memory: &[Query], sites: &mut SiteTable, device: u16) -> Resolved {
        let links = self.copy_links();
        let call_queries: Vec<Query> = self
            .calls
            .iter()
            .map(|c| Query {
                thread: c.thread,
                ts: c.start,
            })
            .collect();
        let (parent, call_inner, memory_inner) = self.enclosing(&call_queries, memory);
        let mut stacks: FxHashMap<Option<usize>, (Option<SiteId>, bool)> = FxHashMap::default();
        let mut site_of = |inner: Option<usize>| {
            *stacks
                .entry(inner)
                .or_insert_with(|| self.site(inner, &parent, sites))
        };

        // The calls of one operator (the innermost slice around them) together make its
        // waits: its syncs, or without one the copies that block by themselves.
        let mut order: Vec<usize> = (0..self.calls.len()).collect();
        order.sort_by(|&a, &b| {
            (call_inner[a], self.calls[a].thread)
                .cmp(&(call_inner[b], self.calls[b].thread))
                .then(self.calls[a].start.total_cmp(&self.calls[b].start))
        });
        let mut events = Vec::new();
        let mut at = 0;
        while at < order.len() {
            let first = order[at];
            let mut end = at + 1;
            while end < order.len()
                && call_inner[order[end]].is_some()
                && call_inner[order[end]] == call_inner[first]
                && self.calls[order[end]].thread == self.calls[first].thread
            {
                end += 1;
            }
            let group = &order[at..end];
            at = end;
            let (site, _) = site_of(call_inner[first]);
            let site = site.and_then(Id::new);
            let event = |kind: EventKind, size: u64, waited_us: f64| Event {
                seq: 0,
                time_ns: 0,
                kind,
                device,
                stream: 0,
                addr: 0,
                size,
                requested: 0,
                site,
                tag: None,
                scope: None,
                step: 0,
                thread: 0,
                device_free: (waited_us * 1000.0).round().max(0.0) as u64,
            };
            let has_sync = group.iter().any(|&c| self.calls[c].kind == CallKind::Sync);
            // Time spent in copy calls that a later sync of the operator completes.
            let mut pending_us = 0.0;
            for &c in group {
                let call = &self.calls[c];
                match call.kind {
                    CallKind::Sync => {
                        let waited = call.dur + std::mem::take(&mut pending_us);
                        events.push((call.start, event(EventKind::Sync, 0, waited)));
                    }
                    CallKind::Copy { blocking } => {
                        let Some(copy) = links[c].map(|k| &self.copies[k]) else {
                            continue;
                        };
                        events.push((
                            call.start,
                            event(EventKind::Transfer(copy.direction), copy.bytes, 0.0),
                        ));
                        let blocks = blocking
                            || (copy.direction == TransferDirection::DeviceToHost && copy.pageable);
                        if has_sync {
                            pending_us += call.dur;
                        } else if blocks {
                            events.push((call.start, event(EventKind::Sync, 0, call.dur)));
                        }
                    }
                }
            }
        }
        let memory_sites = memory_inner
            .iter()
            .map(|&inner| match site_of(inner) {
                (site, true) => site,
                _ => None,
            })
            .collect();
        Resolved {
            events,
            memory_sites,
        }
    }

    /// For each call, the host-device copy it made, by `correlation` or else by its `ac2g`
    /// flow.
    fn copy_links(&self) -> Vec<Option<usize>> {
        let mut by_id: FxHashMap<i128, usize> = FxHashMap::default();
        for (k, copy) in self.copies.iter().enumerate() {
            let id = copy.correlation.or_else(|| {
                self.flow_ends
                    .get(&(copy.thread, copy.ts.to_bits()))
                    .copied()
            });
            if let Some(id) = id {
                by_id.insert(id, k);
            }
        }
        self.calls
            .iter()
            .map(|call| {
                if call.kind == CallKind::Sync {
                    return None;
                }
                let id = call.correlation.or_else(|| {
                    self.flow_starts
                        .get(&(call.thread, call.start.to_bits()))
                        .copied()
                })?;
                by_id.get(&id).copied()
            })
            .collect()
    }

    /// The innermost slice enclosing each query on its thread, for `calls` and `memory`, and
    /// the parent of every slice (the slice that encloses it).
    #[allow(clippy::type_complexity)]
    fn enclosing(
        &self,
        calls: &[Query],
        memory: &[Query],
    ) -> (Vec<Option<usize>>, Vec<Option<usize>>, Vec<Option<usize>>) {
        let mut slices: Vec<usize> = (0..self.slices.len()).collect();
        slices.sort_by(|&a, &b| {
            let (x, y) = (&self.slices[a], &self.slices[b]);
            x.thread
                .cmp(&y.thread)
                .then(x.start.total_cmp(&y.start))
                .then(y.end.total_cmp(&x.end))
                .then(a.cmp(&b))
        });
        // Queries: (thread, time, which list, index).
        let mut queries: Vec<(u32, f64, bool, usize)> = calls
            .iter()
            .enumerate()
            .map(|(i, q)| (q.thread, q.ts, false, i))
            .chain(
                memory
                    .iter()
                    .enumerate()
                    .map(|(i, q)| (q.thread, q.ts, true, i)),
            )
            .collect();
        queries.sort_by(|a, b| a.0.cmp(&b.0).then(a.1.total_cmp(&b.1)));
        let mut parent = vec![None; self.slices.len()];
        let mut call_inner = vec![None; calls.len()];
        let mut memory_inner = vec![None; memory.len()];
        let mut stack: Vec<usize> = Vec::new();
        let mut next = 0;
        let mut thread = u32::MAX;
        for (q_thread, t, is_memory, i) in queries {
            if q_thread != thread {
                thread = q_thread;
                stack.clear();
                while next < slices.len() && self.slices[slices[next]].thread < thread {
                    next += 1;
                }
            }
            while next < slices.len() {
                let s = &self.slices[slices[next]];
                if s.thread != thread || s.start > t {
                    break;
                }
                while stack
                    .last()
                    .is_some_and(|&top| self.slices[top].end <= s.start && s.end > s.start)
                {
                    stack.pop();
                }
                parent[slices[next]] = stack.last().copied();
                stack.push(slices[next]);
                next += 1;
            }
            while stack.last().is_some_and(|&top| self.slices[top].end < t) {
                stack.pop();
            }
            let inner = stack.last().copied();
            if is_memory {
                memory_inner[i] = inner;
            } else {
                call_inner[i] = inner;
            }
        }
        (parent, call_inner, memory_inner)
    }

    /// The site of the stack whose innermost slice is `inner`, and whether it has a Python
    /// frame.
    fn site(
        &self,
        inner: Option<usize>,
        parent: &[Option<usize>],
        sites: &mut SiteTable,
    ) -> (Option<SiteId>, bool) {
        let mut frames = Vec::new();
        let mut python = Vec::new();
        let mut call_stack = None;
        let mut at = inner;
        while let Some(s) = at {
            let slice = &self.slices[s];
            let name = self.names.get(slice.name);
            if slice.python {
                python.extend(parse_frame(name));
            } else if python.is_empty() {
                frames.push(Frame {
                    file: String::new(),
                    line: 0,
                    function: name.to_string(),
                });
                if call_stack.is_none() {
                    call_stack = slice.stack;
                }
            }
            at = parent[s];
        }
        if python.is_empty() {
            if let Some(stack) = call_stack {
                python = parse_call_stack(self.names.get(stack));
            }
        }
        let has_python = !python.is_empty();
        frames.extend(python);
        (sites.intern(frames), has_python)
    }
}

/// The direction of a device copy from its name (`Memcpy DtoH (Device -> Pageable)`), and
/// whether its host side is pageable memory; `None` for a copy within the device.
fn copy_direction(name: &str) -> Option<(TransferDirection, bool)> {
    let pageable = name.contains("Pageable");
    if name.contains("DtoH") {
        Some((TransferDirection::DeviceToHost, pageable))
    } else if name.contains("HtoD") {
        Some((TransferDirection::HostToDevice, pageable))
    } else {
        None
    }
}

/// A Python frame from the profiler's `file.py(143): forward` (or `file.py(143)`).
fn parse_frame(text: &str) -> Option<Frame> {
    let text = text.trim();
    let (head, function) = match text.split_once("): ") {
        Some((head, function)) => (head, function),
        None => (text.strip_suffix(')')?, ""),
    };
    let (file, line) = head.rsplit_once('(')?;
    let line: u32 = line.parse().ok()?;
    if file.is_empty() {
        return None;
    }
    Some(Frame {
        file: file.to_string(),
        line,
        function: function.to_string(),
    })
}

/// The frames of a 2021 `Call stack` argument: `file.py(12): f;file.py(30): g`, innermost
/// first, entries that are not Python frames left out.
fn parse_call_stack(text: &str) -> Vec<Frame> {
    text.split(';').filter_map(parse_frame).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_python_frames() {
        let f = parse_frame("/w/train.py(143): forward").unwrap();
        assert_eq!(
            (f.file.as_str(), f.line, f.function.as_str()),
            ("/w/train.py", 143, "forward")
        );
        let f = parse_frame("\r\n/w/a (x).py(7)").unwrap();
        assert_eq!((f.file.as_str(), f.line), ("/w/a (x).py", 7));
        assert!(parse_frame("nn.Module: Linear_0").is_none());
        assert!(parse_frame("<built-in method item of Tensor object at 0x7f00>").is_none());
        let frames = parse_call_stack("a.py(1): f;\r\nb.py(2): g;\r\n<built-in>;");
        assert_eq!(frames.len(), 2);
        assert_eq!(frames[1].line, 2);
    }

    #[test]
    fn tells_copy_directions() {
        assert_eq!(
            copy_direction("Memcpy DtoH (Device -> Pageable)"),
            Some((TransferDirection::DeviceToHost, true))
        );
        assert_eq!(
            copy_direction("Memcpy HtoD (Pinned -> Device)"),
            Some((TransferDirection::HostToDevice, false))
        );
        assert_eq!(copy_direction("Memcpy DtoD (Device -> Device)"), None);
    }
}
