//! Data sources of the dashboard: a live program over telemetry, and an allocator in this
//! process.
//!
//! A source turns whatever it reads into [`Update`]s that `crate::app` applies to its
//! `crate::data::Dataset`: a full snapshot to start from (and again after lost events), then
//! events, call-site table additions and statistics as they come. [`LiveSource`] reads frames
//! with the allocator crate's `TelemetryClient` on a background thread and reconnects when the
//! program goes away; [`InProcessSource`] pulls from a `CachingAllocator` handle directly with
//! `events_since`, for `vramscope demo`, and can pause and stop the workload through
//! [`Control`]. Files need no source: they are loaded once.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, SyncSender};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use vramscope_allocator::pull_tables;
use vramscope_allocator::{Backend, CachingAllocator};
use vramscope_model::{Event, MemoryStats, Snapshot};
use vramscope_telemetry::{Frame, KnownTables, TablesFrame};
use vramscope_telemetry::{TelemetryAddr, TelemetryClient};

/// Something that happened at a source.
#[derive(Clone, Debug, PartialEq)]
pub enum Update {
    /// Start over from this state; its events are the history before `next_seq`.
    Reset(Box<Snapshot>),
    /// New events, oldest first.
    Events(Vec<Event>),
    /// Call-site, tag and scope table additions.
    Tables(TablesFrame),
    /// Statistics.
    Stats {
        /// The allocator's statistics.
        stats: Box<MemoryStats>,
        /// The current step.
        step: u64,
        /// Events the source lost so far.
        dropped_events: u64,
    },
    /// Connected to a program (its name).
    Connected(String),
    /// The connection was lost at this time (Unix nanoseconds).
    Disconnected {
        /// When.
        since_unix_ns: u64,
        /// Why.
        reason: String,
    },
    /// The program or workload finished.
    Ended,
}

/// A source of updates, polled by the dashboard's loop without blocking.
pub trait Source: Send {
    /// Appends what happened since the last call to `out`.
    fn poll(&mut self, out: &mut Vec<Update>);

    /// Pauses or resumes the workload, where the source controls one.
    fn set_paused(&mut self, _paused: bool) {}

    /// A complete snapshot for `s` (save), where the source can make one better than the
    /// dashboard's own data.
    fn snapshot(&mut self) -> Option<Snapshot> {
        None
    }

    /// Stops the workload, where the source controls one; called when the dashboard quits.
    fn stop(&mut self) {}
}

/// Nanoseconds since the Unix epoch, now.
pub fn unix_now_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

/// A live program, read over telemetry on a background thread that reconnects.
pub struct LiveSource {
    updates: Receiver<Update>,
    stop: Arc<AtomicBool>,
}

impl LiveSource {
    /// Starts reading from `addr`, retrying every `retry` while the program is away.
    pub fn connect(addr: TelemetryAddr, retry: Duration) -> LiveSource {
        // A bounded queue: when the dashboard falls behind, the reader waits, the socket fills
        // and the publisher drops and counts events instead of the program waiting.
        let (tx, updates) = mpsc::sync_channel(256);
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        std::thread::Builder::new()
            .name("vramscope-live".to_string())
            .spawn(move || read_loop(addr, retry, tx, flag))
            .ok();
        LiveSource { updates, stop }
    }
}

impl Drop for LiveSource {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

impl Source for LiveSource {
    fn poll(&mut self, out: &mut Vec<Update>) {
        while let Ok(u) = self.updates.try_recv() {
            out.push(u);
            // Enough for one frame; the rest waits in the queue (and, past it, in the socket).
            if out.len() >= 64 {
                return;
            }
        }
    }
}

fn read_loop(addr: TelemetryAddr, retry: Duration, tx: SyncSender<Update>, stop: Arc<AtomicBool>) {
    let mut down_reported = false;
    while !stop.load(Ordering::Relaxed) {
        let mut client = match TelemetryClient::connect(&addr) {
            Ok(c) => c,
            Err(e) => {
                if !down_reported {
                    down_reported = true;
                    let u = Update::Disconnected {
                        since_unix_ns: unix_now_ns(),
                        reason: e.to_string(),
                    };
                    if tx.send(u).is_err() {
                        return;
                    }
                }
                std::thread::sleep(retry);
                continue;
            }
        };
        let reason = loop {
            if stop.load(Ordering::Relaxed) {
                return;
            }
            let update = match client.next_frame() {
                Ok(Frame::Hello(h)) => Update::Connected(format!(
                    "{} (pid {}) on {}",
                    if h.program.is_empty() {
                        "program"
                    } else {
                        &h.program
                    },
                    h.pid,
                    h.device.name
                )),
                Ok(Frame::Snapshot { snapshot, .. }) => Update::Reset(snapshot),
                Ok(Frame::Events(events)) => Update::Events(events),
                Ok(Frame::Tables(t)) => Update::Tables(t),
                Ok(Frame::Stats(s)) => Update::Stats {
                    stats: Box::new(s.stats),
                    step: s.step,
                    dropped_events: s.dropped_events,
                },
                Ok(Frame::Bye) => break "the program ended".to_string(),
                Err(e) => break e.to_string(),
            };
            if tx.send(update).is_err() {
                return;
            }
        };
        // Report this loss once; failed reconnections stay quiet until a connection works.
        down_reported = true;
        let u = Update::Disconnected {
            since_unix_ns: unix_now_ns(),
            reason,
        };
        if tx.send(u).is_err() {
            return;
        }
        std::thread::sleep(retry);
    }
}

/// Lets a workload running beside the dashboard pause and stop when the dashboard says so.
#[derive(Clone, Debug, Default)]
pub struct Control {
    inner: Arc<ControlInner>,
}

#[derive(Debug, Default)]
struct ControlInner {
    state: Mutex<(bool, bool)>,
    changed: Condvar,
}

impl Control {
    /// A control that is running and not stopped.
    pub fn new() -> Control {
        Control::default()
    }

    /// Waits while paused; returns false once the dashboard has quit (the workload should
    /// stop). Call it once per step.
    pub fn proceed(&self) -> bool {
        let mut state = self.inner.state.lock().unwrap_or_else(|e| e.into_inner());
        while state.0 && !state.1 {
            state = self
                .inner
                .changed
                .wait(state)
                .unwrap_or_else(|e| e.into_inner());
        }
        !state.1
    }

    /// Sleeps for `pace` unless the dashboard quits first; returns false once it has.
    pub fn pace(&self, pace: Duration) -> bool {
        let deadline = Instant::now() + pace;
        let mut state = self.inner.state.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if state.1 {
                return false;
            }
            let now = Instant::now();
            if now >= deadline && !state.0 {
                return true;
            }
            let wait = if state.0 {
                Duration::from_millis(100)
            } else {
                deadline - now
            };
            state = self
                .inner
                .changed
                .wait_timeout(state, wait)
                .map(|(s, _)| s)
                .unwrap_or_else(|e| e.into_inner().0);
        }
    }

    /// Whether the dashboard has quit.
    pub fn stopped(&self) -> bool {
        self.inner.state.lock().map(|s| s.1).unwrap_or(true)
    }

    /// Pauses or resumes.
    pub fn set_paused(&self, paused: bool) {
        if let Ok(mut s) = self.inner.state.lock() {
            s.0 = paused;
        }
        self.inner.changed.notify_all();
    }

    /// Tells the workload to stop.
    pub fn stop(&self) {
        if let Ok(mut s) = self.inner.state.lock() {
            s.1 = true;
        }
        self.inner.changed.notify_all();
    }
}

/// An allocator in this process, pulled directly; optionally with the workload that uses it.
pub struct InProcessSource<B: Backend> {
    alloc: CachingAllocator<B>,
    next_seq: u64,
    known: KnownTables,
    started: bool,
    control: Control,
    workload: Option<JoinHandle<()>>,
    finished: bool,
    ended: bool,
    dropped: u64,
    last_stats: Option<Instant>,
    /// The most events taken in one poll.
    pub batch: usize,
}

impl<B: Backend> InProcessSource<B> {
    /// A source over `alloc`.
    pub fn new(alloc: CachingAllocator<B>) -> InProcessSource<B> {
        InProcessSource {
            alloc,
            next_seq: 0,
            known: KnownTables::default(),
            started: false,
            control: Control::new(),
            workload: None,
            finished: false,
            ended: false,
            dropped: 0,
            last_stats: None,
            batch: 262_144,
        }
    }

    /// Runs `workload` on its own thread with this source's [`Control`].
    pub fn with_workload(mut self, workload: impl FnOnce(Control) + Send + 'static) -> Self {
        let control = self.control.clone();
        self.workload = std::thread::Builder::new()
            .name("vramscope-workload".to_string())
            .spawn(move || workload(control))
            .ok();
        self
    }

    /// The control shared with the workload.
    pub fn control(&self) -> &Control {
        &self.control
    }

    fn reset(&mut self, out: &mut Vec<Update>) {
        let snapshot = self.alloc.snapshot();
        self.next_seq = snapshot.events.last().map_or(self.next_seq, |e| e.seq + 1);
        self.known = KnownTables::default();
        self.known.include(&snapshot);
        out.push(Update::Reset(Box::new(snapshot)));
    }
}

impl<B: Backend> Source for InProcessSource<B> {
    fn poll(&mut self, out: &mut Vec<Update>) {
        if !self.started {
            self.started = true;
            self.reset(out);
        }
        let batch = self.alloc.events_since(self.next_seq, self.batch);
        if batch.missed > 0 {
            // The ring overwrote events before the dashboard read them: start over.
            self.dropped += batch.missed;
            self.reset(out);
        } else if !batch.events.is_empty() {
            if self.known.lacks_any(&batch.events) {
                out.push(Update::Tables(pull_tables(&mut self.known, &self.alloc)));
            }
            self.next_seq = batch.next_seq;
            out.push(Update::Events(batch.events));
        }
        if self
            .last_stats
            .is_none_or(|t| t.elapsed() >= Duration::from_millis(100))
        {
            self.last_stats = Some(Instant::now());
            out.push(Update::Stats {
                stats: Box::new(batch.stats),
                step: batch.step,
                dropped_events: self.dropped,
            });
        }
        let finished = self.finished || self.workload.as_ref().is_some_and(|w| w.is_finished());
        if !self.ended && finished {
            self.ended = true;
            out.push(Update::Ended);
        }
    }

    fn set_paused(&mut self, paused: bool) {
        self.control.set_paused(paused);
    }

    fn snapshot(&mut self) -> Option<Snapshot> {
        Some(self.alloc.snapshot())
    }

    fn stop(&mut self) {
        self.control.stop();
        if let Some(w) = self.workload.take() {
            let _ = w.join();
            self.finished = true;
        }
    }
}
