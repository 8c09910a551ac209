//! Live telemetry for `attach()`: PyTorch's own allocator, published in vramscope's telemetry
//! protocol (`vramscope_telemetry::wire`: the same frames, so `vramscope top` reads it).
//!
//! PyTorch's allocator has no event ring to read, so a [`LivePublisher`] is fed from Python
//! (`vramscope._torch`, from a background thread, only while a dashboard is attached):
//! `torch.cuda.memory_stats()` figures ten times a second ([`LivePublisher::stats`]), and the
//! allocation history at a bounded cost: `torch.cuda.memory._snapshot()` pickled, converted by
//! the inspector's importer without the GIL, and cut to the trace entries newer than those
//! already published ([`LivePublisher::history`]; entries are told apart by their time and
//! their order within one microsecond). The Python side spaces the history calls so that they
//! take at most a small share of the wall time. Python's step marks ([`LivePublisher::mark_step`])
//! number the steps of the events, by time.
//!
//! The publisher keeps the latest picture (segments, statistics, settings, step marks, the call
//! sites published so far) and a bounded history of events ([`HISTORY_EVENTS`]) numbered by
//! its own sequence. That is a [`Source`] of `vramscope_telemetry::publish`, whose one
//! publisher loop (the allocator's publisher's too) serves dashboards on a Unix socket (mode
//! 0600, a stale socket of a dead process replaced) or a loopback TCP port: `Hello`, a
//! snapshot with its history on attach (once the next history call has come, or after
//! [`ATTACH_WAIT`]: `ServeOptions::attach_wait`, this publisher's one setting of its own),
//! `Tables` before the events that need them, `Events`, `Stats` ten times a second, `Bye` at
//! the end, `Refused` past [`MAX_CLIENTS`]. Each client has a bounded queue
//! ([`CLIENT_QUEUE_BYTES`], every frame counted) and a non-blocking socket: a client that falls
//! behind loses events, which are counted in its statistics, and is sent a fresh snapshot once
//! its queue has drained (at most once a second); one that takes nothing for a second with a
//! full queue is treated the same; one that reads nothing for [`IDLE_TIMEOUT`] is closed, and
//! one that has read nothing for a second gives up its place to a dashboard that connects while
//! all are taken. The program's threads never wait for a dashboard: feeding, and the serving
//! thread's reads, take the publisher's lock only to copy data in or out.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyDict;
use rustc_hash::FxHashMap;
use vramscope_import::{pytorch, ImportOptions};
use vramscope_model::{
    event_step, AllocatorConfig, CallSite, DeviceInfo, Event, Id, MemoryStats, Snapshot,
    SnapshotSource, Stat, StatArray, StepMark,
};
use vramscope_telemetry::publish::{
    hello, Attach, Batch, Publisher, Reading, ServeOptions, Source,
};
use vramscope_telemetry::serve::Listener;
use vramscope_telemetry::{
    Frame as TelemetryFrame, Hello, KnownTables, TablesFrame, TelemetryAddr, TelemetryClient,
    TelemetryError,
};

/// Events the publisher keeps for attaching dashboards and for clients that lag.
pub const HISTORY_EVENTS: usize = 1 << 18;
/// The most bytes of frames waiting for one client (`ServeOptions::client_queue_bytes`).
pub const CLIENT_QUEUE_BYTES: usize = 32 << 20;
/// The most dashboards attached at once (`ServeOptions::max_clients`).
pub const MAX_CLIENTS: usize = 16;
/// How long an attaching client waits for fresh history before it gets what there is
/// (`ServeOptions::attach_wait`).
pub const ATTACH_WAIT: Duration = Duration::from_secs(1);
/// How long a client may read nothing while bytes wait for it before it is closed, so that
/// connections that never read cannot hold every place a dashboard could take (as the
/// allocator's publisher does, `ServeOptions::idle_timeout`).
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(10);

fn now_unix_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

/// What the feeding side has published.
struct State {
    /// Statistics, settings, segments, steps and the call-site table; no events.
    picture: Snapshot,
    site_ids: FxHashMap<CallSite, u32>,
    history: VecDeque<Event>,
    next_seq: u64,
    step: u64,
    /// The newest trace entry published: its absolute time and how many entries of that time.
    cursor: Option<(u64, usize)>,
    /// Whether statistics came from `memory_stats()` (they then win over the importer's).
    stats_fed: bool,
    /// History calls so far.
    version: u64,
}

/// What the feeding side has published, shared by the Python methods that feed it and the
/// serving thread that reads it.
type Fed = Arc<Mutex<State>>;

/// The fed state, locked (a panic while it was held leaves it as it was).
fn lock(fed: &Fed) -> MutexGuard<'_, State> {
    fed.lock().unwrap_or_else(|e| e.into_inner())
}

/// Live telemetry of PyTorch's allocator on one device, fed from Python; see the module
/// documentation. Closing it (or dropping it) says goodbye to the dashboards.
#[pyclass(module = "vramscope._native", frozen)]
pub struct LivePublisher {
    fed: Fed,
    publisher: Publisher,
    addr: String,
    device: u32,
}

/// `memory_stats()`'s flat figures (`"allocated_bytes.all.current"`, ...) as [`MemoryStats`].
pub fn stats_from_flat(figures: impl IntoIterator<Item = (String, u64)>) -> MemoryStats {
    let mut stats = MemoryStats::default();
    for (key, value) in figures {
        let mut parts = key.split('.');
        let (Some(name), pool, field) = (parts.next(), parts.next(), parts.next()) else {
            continue;
        };
        let array: Option<&mut StatArray> = match name {
            "allocated_bytes" => Some(&mut stats.allocated_bytes),
            "reserved_bytes" => Some(&mut stats.reserved_bytes),
            "active_bytes" => Some(&mut stats.active_bytes),
            "inactive_split_bytes" => Some(&mut stats.inactive_split_bytes),
            "requested_bytes" => Some(&mut stats.requested_bytes),
            "allocation" => Some(&mut stats.allocation),
            "segment" => Some(&mut stats.segment),
            "active" => Some(&mut stats.active),
            "inactive_split" => Some(&mut stats.inactive_split),
            _ => None,
        };
        let stat: Option<&mut Stat> = match (array, pool, field) {
            (Some(a), Some(pool), Some(_)) => match pool {
                "all" => Some(&mut a.all),
                "small_pool" => Some(&mut a.small_pool),
                "large_pool" => Some(&mut a.large_pool),
                _ => None,
            },
            (None, Some(_), None) => match name {
                "oversize_allocations" => Some(&mut stats.oversize_allocations),
                "oversize_segments" => Some(&mut stats.oversize_segments),
                _ => None,
            },
            _ => None,
        };
        let field = if stat.is_some() && field.is_none() {
            pool
        } else {
            field
        };
        match (stat, field) {
            (Some(stat), Some("current")) => stat.current = value,
            (Some(stat), Some("peak")) => stat.peak = value,
            (Some(stat), Some("allocated")) => stat.allocated = value,
            (Some(stat), Some("freed")) => stat.freed = value,
            (Some(_), _) => {}
            (None, _) => match key.as_str() {
                "num_alloc_retries" => stats.num_alloc_retries = value,
                "num_ooms" => stats.num_ooms = value,
                "num_sync_all_streams" => stats.num_sync_all_streams = value,
                "num_device_alloc" => stats.num_device_alloc = value,
                "num_device_free" => stats.num_device_free = value,
                _ => {}
            },
        }
    }
    stats
}

impl State {
    /// The id of `site` in the published table, added at its end on first sight.
    fn site_id(&mut self, site: &CallSite) -> u32 {
        if let Some(&id) = self.site_ids.get(site) {
            return id;
        }
        let id = self.picture.sites.len() as u32;
        self.picture.sites.push(site.clone());
        self.site_ids.insert(site.clone(), id);
        id
    }

    /// The step in force at `time_ns` by Python's marks.
    fn step_at(&self, time_ns: u64) -> u64 {
        let marks = &self.picture.steps;
        match marks.partition_point(|m| m.time_ns <= time_ns) {
            0 => 0,
            i => marks[i - 1].step,
        }
    }

    /// Publishes what `snapshot` (the importer's reading of `_snapshot()`) holds for `device`
    /// beyond the cursor; returns the events added.
    fn absorb(&mut self, snapshot: Snapshot, device: u32) -> usize {
        let epoch = self.picture.epoch_unix_ns;
        let mut site_map: Vec<Option<u32>> = vec![None; snapshot.sites.len()];
        let (after, mut skip_at_time) = match self.cursor {
            Some((time, count)) => (Some(time), count),
            None => (None, 0),
        };
        let mut newest: Option<(u64, usize)> = None;
        let first_new = self.next_seq;
        let mut added = 0;
        for e in snapshot
            .events
            .iter()
            .filter(|e| u32::from(e.device) == device)
        {
            let absolute = snapshot.epoch_unix_ns.saturating_add(e.time_ns);
            newest = match newest {
                Some((time, count)) if time == absolute => Some((time, count + 1)),
                Some((time, _)) if time > absolute => newest,
                _ => Some((absolute, 1)),
            };
            if let Some(after) = after {
                if absolute < after {
                    continue;
                }
                if absolute == after && skip_at_time > 0 {
                    skip_at_time -= 1;
                    continue;
                }
            }
            let mut event = *e;
            event.seq = self.next_seq;
            self.next_seq += 1;
            event.time_ns = absolute.saturating_sub(epoch);
            // A program marks fewer than 4 billion steps, which an event holds.
            event.step = event_step(self.step_at(event.time_ns)).unwrap_or(u32::MAX);
            event.site = Id::pack(e.site().and_then(|id| {
                let slot = site_map.get_mut(id as usize)?;
                if slot.is_none() {
                    *slot = Some(self.site_id(&snapshot.sites[id as usize]));
                }
                *slot
            }));
            event.tag = None;
            event.scope = None;
            if self.history.len() >= HISTORY_EVENTS {
                self.history.pop_front();
            }
            self.history.push_back(event);
            added += 1;
        }
        // The count restarts at each newer time, so it holds the entries of the newest time in
        // this window, those published before included.
        if newest.is_some() {
            self.cursor = newest;
        }
        // Step marks made since the last call begin at the first event published after them.
        for mark in self.picture.steps.iter_mut().filter(|m| m.seq >= first_new) {
            let first = self
                .history
                .iter()
                .find(|e| e.seq >= first_new && e.time_ns >= mark.time_ns);
            mark.seq = first.map_or(self.next_seq, |e| e.seq);
        }
        let mut segments: Vec<_> = snapshot
            .segments
            .into_iter()
            .filter(|s| s.device == device)
            .collect();
        for block in segments.iter_mut().flat_map(|s| s.blocks.iter_mut()) {
            block.site = block.site.and_then(|id| {
                let site = snapshot.sites.get(id as usize)?;
                Some(self.site_id(site))
            });
            block.tag = None;
            block.scope = None;
        }
        self.picture.segments = segments;
        self.picture.config = snapshot.config;
        if !self.stats_fed {
            self.picture.stats = snapshot.stats;
        }
        self.version += 1;
        added
    }
}

#[pymethods]
impl LivePublisher {
    /// Starts publishing on `listen` (`unix:PATH` or `tcp:127.0.0.1:PORT`) for device `device`
    /// named `name`, of `capacity` bytes.
    #[new]
    #[pyo3(signature = (listen, device = 0, name = String::new(), capacity = 0))]
    fn new(listen: &str, device: u32, name: String, capacity: u64) -> PyResult<LivePublisher> {
        let addr =
            TelemetryAddr::parse(listen).map_err(|e| PyValueError::new_err(e.to_string()))?;
        let listener = Listener::bind(&addr, false).map_err(|e| match e {
            TelemetryError::NotLoopback(_) => PyValueError::new_err(format!(
                "{addr} is not a loopback address: live telemetry stays on this machine"
            )),
            e => PyRuntimeError::new_err(format!("cannot listen on {addr}: {e}")),
        })?;
        let bound = listener.addr().clone();
        let info = DeviceInfo {
            index: device,
            name: if name.is_empty() {
                format!("cuda:{device}")
            } else {
                name
            },
            backend: "cuda (PyTorch's allocator)".to_string(),
            capacity,
        };
        let epoch_unix_ns = now_unix_ns();
        let mut picture = Snapshot::empty(SnapshotSource::Pytorch, info.clone());
        picture.epoch_unix_ns = epoch_unix_ns;
        let fed: Fed = Arc::new(Mutex::new(State {
            picture,
            site_ids: FxHashMap::default(),
            history: VecDeque::new(),
            next_seq: 0,
            step: 0,
            cursor: None,
            stats_fed: false,
            version: 0,
        }));
        let source = FedSource {
            fed: Arc::clone(&fed),
            hello: hello(info, epoch_unix_ns, AllocatorConfig::default()),
        };
        let mut options = ServeOptions::default();
        options.client_queue_bytes = CLIENT_QUEUE_BYTES;
        options.max_clients = MAX_CLIENTS;
        options.idle_timeout = IDLE_TIMEOUT;
        options.attach_wait = ATTACH_WAIT;
        // A thread that cannot start drops the listener, which removes its socket.
        let publisher = Publisher::start(source, listener, options)
            .map_err(|e| PyRuntimeError::new_err(e.to_string()))?;
        Ok(LivePublisher {
            fed,
            publisher,
            addr: bound.to_string(),
            device,
        })
    }

    /// The address dashboards connect to (`vramscope top ADDR`).
    #[getter]
    fn addr(&self) -> String {
        self.addr.clone()
    }

    /// Dashboards attached now.
    #[getter]
    fn clients(&self) -> u64 {
        self.publisher.stats().clients
    }

    /// Counters: clients attached now and in all, events sent and dropped, snapshots sent,
    /// clients refused, clients closed for reading nothing (`idle`), events published.
    fn counters(&self) -> std::collections::HashMap<&'static str, u64> {
        let c = self.publisher.stats();
        let published = lock(&self.fed).next_seq;
        [
            ("clients", c.clients),
            ("clients_total", c.clients_total),
            ("events_sent", c.events_sent),
            ("events_dropped", c.events_dropped),
            ("snapshots", c.snapshots),
            ("refused", c.clients_refused),
            ("idle", c.clients_idle),
            ("events_published", published),
        ]
        .into_iter()
        .collect()
    }

    /// Publishes `torch.cuda.memory_stats()`'s figures (`stats`) and the step number.
    fn stats(&self, py: Python<'_>, stats: &Bound<'_, PyDict>, step: u64) {
        let figures: Vec<(String, u64)> = stats
            .iter()
            .filter_map(|(k, v)| {
                let key = k.extract::<String>().ok()?;
                let value = v
                    .extract::<u64>()
                    .ok()
                    .or_else(|| v.extract::<i64>().ok().map(|x| x.max(0) as u64))
                    .or_else(|| v.extract::<f64>().ok().map(|x| x.max(0.0) as u64))?;
                Some((key, value))
            })
            .collect();
        let parsed = stats_from_flat(figures);
        py.detach(|| {
            let mut state = lock(&self.fed);
            state.picture.stats = parsed;
            state.stats_fed = true;
            state.step = state.step.max(step);
        });
    }

    /// Publishes the allocation history in `pickle` (`torch.cuda.memory._snapshot()` pickled)
    /// that is newer than what was published; returns the events added. Converted without the
    /// GIL.
    fn history(&self, py: Python<'_>, pickle: &[u8]) -> PyResult<usize> {
        let device = self.device;
        py.detach(|| {
            let snapshot =
                pytorch::from_pickle_bytes(pickle, "_snapshot()", &ImportOptions::default())
                    .map_err(|e| PyValueError::new_err(e.to_string()))?;
            Ok(lock(&self.fed).absorb(snapshot, device))
        })
    }

    /// Marks the start of Python's step `step` (events after it belong to it).
    fn mark_step(&self, step: u64) {
        let mut state = lock(&self.fed);
        let time_ns = now_unix_ns().saturating_sub(state.picture.epoch_unix_ns);
        let seq = state.next_seq;
        state.picture.steps.push(StepMark {
            step,
            seq,
            time_ns,
            label: format!("ProfilerStep#{step}"),
        });
        state.step = step;
    }

    /// Says goodbye to the dashboards, stops serving and removes the socket.
    fn close(&self, py: Python<'_>) {
        py.detach(|| self.publisher.close());
    }
}

/// The fed state as the publisher loop reads it: each call copies what it needs under the lock.
struct FedSource {
    fed: Fed,
    hello: Hello,
}

impl Source for FedSource {
    fn hello(&mut self) -> Hello {
        self.hello.clone()
    }

    fn snapshot(&mut self, history: usize) -> Attach {
        let state = lock(&self.fed);
        let picture = state.picture.clone();
        Attach::from_ring(picture, &state.history, state.next_seq, history)
    }

    fn events_since(&mut self, seq: u64, max: usize) -> Batch {
        let state = lock(&self.fed);
        Batch::from_ring(&state.history, state.next_seq, seq, max)
    }

    fn tables_since(&mut self, mut known: KnownTables) -> TablesFrame {
        // PyTorch's allocator has call sites; its events carry no tags or scopes.
        let sites = lock(&self.fed)
            .picture
            .sites
            .get(known.sites..)
            .unwrap_or_default()
            .to_vec();
        known.advance(sites, Vec::new(), Vec::new())
    }

    fn stats(&mut self) -> Reading {
        let state = lock(&self.fed);
        Reading {
            stats: state.picture.stats,
            step: state.step,
        }
    }

    fn generation(&self) -> u64 {
        lock(&self.fed).version
    }
}

/// Test support: connects to the publisher at `addr` as `vramscope top` does and reads frames
/// for up to `seconds` (or until `Bye`), keeping a snapshot's state as the dashboard does;
/// returns a JSON summary of what arrived: the hello, each snapshot, the statistics frames,
/// every event with its call site as `file:line` (and its index in `sites`, as `site_id`),
/// and the call-site table as it stood at the end (`sites`, each site with its frames).
#[pyfunction]
pub fn read_telemetry(py: Python<'_>, addr: &str, seconds: f64) -> PyResult<String> {
    let addr = TelemetryAddr::parse(addr).map_err(|e| PyValueError::new_err(e.to_string()))?;
    py.detach(|| {
        let mut client =
            TelemetryClient::connect(&addr).map_err(|e| PyRuntimeError::new_err(e.to_string()))?;
        let deadline = Instant::now() + Duration::from_secs_f64(seconds.max(0.0));
        let mut sites: Vec<CallSite> = Vec::new();
        let mut out = serde_json::Map::new();
        let mut snapshots = Vec::new();
        let mut stats = Vec::new();
        let mut events = Vec::new();
        let mut ended = None;
        let site_of = |sites: &[CallSite], e: &Event| {
            e.site()
                .and_then(|s| sites.get(s as usize))
                .map(|s| s.file_line())
        };
        while Instant::now() < deadline {
            let left = deadline.saturating_duration_since(Instant::now());
            let _ = client.set_read_timeout(Some(left.max(Duration::from_millis(10))));
            match client.next_frame() {
                Ok(TelemetryFrame::Hello(h)) => {
                    out.insert("hello".into(), serde_json::to_value(&h).unwrap_or_default());
                }
                Ok(TelemetryFrame::Snapshot { next_seq, snapshot }) => {
                    sites = snapshot.sites.clone();
                    for e in &snapshot.events {
                        events.push(serde_json::json!({
                            "seq": e.seq, "kind": e.kind, "size": e.size, "step": e.step,
                            "site": site_of(&sites, e), "site_id": e.site, "in_snapshot": true,
                        }));
                    }
                    snapshots.push(serde_json::json!({
                        "next_seq": next_seq,
                        "history": snapshot.events.len(),
                        "segments": snapshot.segments.len(),
                        "steps": snapshot.steps.iter().map(|m| m.step).collect::<Vec<_>>(),
                        "allocated": snapshot.stats.allocated_bytes.all.current,
                    }));
                }
                Ok(TelemetryFrame::Tables(t)) => {
                    let mut s = Snapshot::empty(SnapshotSource::Pytorch, DeviceInfo::default());
                    s.sites = std::mem::take(&mut sites);
                    t.apply_to(&mut s);
                    sites = s.sites;
                }
                Ok(TelemetryFrame::Events(batch)) => {
                    for e in &batch {
                        events.push(serde_json::json!({
                            "seq": e.seq, "kind": e.kind, "size": e.size, "step": e.step,
                            "site": site_of(&sites, e), "site_id": e.site, "in_snapshot": false,
                        }));
                    }
                }
                Ok(TelemetryFrame::Stats(s)) => stats.push(serde_json::json!({
                    "allocated": s.stats.allocated_bytes.all.current,
                    "reserved": s.stats.reserved_bytes.all.current,
                    "peak": s.stats.allocated_bytes.all.peak,
                    "step": s.step,
                    "dropped": s.dropped_events,
                })),
                Ok(TelemetryFrame::Bye) => {
                    ended = Some("bye".to_string());
                    break;
                }
                Err(e) => {
                    if Instant::now() < deadline {
                        ended = Some(e.to_string());
                    }
                    break;
                }
            }
        }
        out.insert(
            "sites".into(),
            serde_json::to_value(&sites).unwrap_or_default(),
        );
        out.insert("snapshots".into(), snapshots.into());
        out.insert("stats".into(), stats.into());
        out.insert("events".into(), events.into());
        out.insert("ended".into(), ended.into());
        Ok(serde_json::Value::Object(out).to_string())
    })
}
