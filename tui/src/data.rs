//! The dashboard's dataset: one snapshot that grows, and the state after any of its events.
//!
//! Every data source ends up here. A file is loaded once with the inspector's importers; a live
//! program (`crate::source::LiveSource`) and an in-process allocator
//! (`crate::source::InProcessSource`) start from a snapshot with its history and then append
//! events, table additions and statistics. [`Dataset`] keeps the events in the one data model
//! (`vramscope_model::Snapshot`, shared with the analysis thread of `crate::analysis`)
//! and derives everything else with the inspector's engine (`vramscope_engine`):
//! the start state reconstructed once, frees paired with their allocations, the allocated and
//! reserved bytes after every event, call-site groups, and the segments and live blocks at any
//! cursor position. So the dashboard shows the figures `report` prints, at every event. A
//! min/max pyramid over the usage series (`crate::pyramid`) answers the timeline's "highest
//! bytes in these events" in O(log n), however many events there are.
//!
//! Positions are counts of events applied: position `k` is the state after the first `k`
//! events, so `0` is the state before the first event and `len()` the latest. The states kept
//! along the way (checkpoints, from which a jump replays or undoes the events between) hold
//! together at most one block or segment per 16 events and one state of the largest size,
//! and the changes kept between evenly spaced states (`deltas`, which a long jump crosses
//! instead of replaying every event) at most one block per block event: the dataset's memory
//! is O(events + live blocks), whatever the trace.

use std::sync::{Arc, Mutex};

use vramscope_engine::{
    Disagreements, FreeLink, MemoryState, Pairing, SiteGroups, Usage, UsageSeries,
};
use vramscope_model::{Event, EventKind, MemoryStats, Segment, Snapshot, StepMark};
use vramscope_telemetry::TablesFrame;

use crate::pyramid::{higher, Extremes, Pyramid};

mod deltas;
mod sums;

use deltas::{DeltaBuilder, Deltas};
use sums::Batch;
pub use sums::{Sums, TreeContext};

/// Past this many checkpoints of appended events, once they hold more than one block or segment
/// per [`EVENTS_PER_ITEM`] events, every other one is dropped (a live source's memory).
const MAX_CHECKPOINTS: usize = 64;

/// The fewest events between two checkpoints.
const CHECKPOINT_MIN: usize = 16_384;

/// Events between a checkpoint and the next per block or segment in its state: a small state
/// costs little to keep, so its checkpoints come often and a jump replays few events; a large
/// one's come no further apart than the old fixed interval, unless the memory bound below
/// asks for more.
const EVENTS_PER_ITEM: usize = 16;

/// Full-size states the checkpoints may hold beyond one block or segment per
/// [`EVENTS_PER_ITEM`] events: together they hold at most [`checkpoint_budget`] blocks and
/// segments, so that the dataset's memory is O(events + live blocks) whatever the trace
/// (issue 33: a million allocations never freed once kept 48 copies of a state that grew to a
/// million blocks, 5.3 GB, and two million aborted). One since the changes kept for jumps
/// (`deltas`) took the second one's memory: a jump crosses them from a checkpoint further
/// away at the cost of the blocks that differ, not of every event (issue 47).
const FULL_STATES: usize = 1;

/// The most blocks and segments the checkpoints of `events` events hold together, when the
/// largest state among them has `largest`.
fn checkpoint_budget(events: usize, largest: usize) -> usize {
    events / EVENTS_PER_ITEM + FULL_STATES * largest
}

/// The events between a checkpoint of a state of `items` blocks and segments and the next,
/// where `every` is the interval states of any size may keep (the old fixed one) and `budget`
/// the most all checkpoints of `events` events may hold: each is as far from the next as its
/// share of the budget asks, so that they never hold more than the budget together.
fn checkpoint_gap(items: usize, every: usize, events: usize, budget: usize) -> usize {
    let by_size = (items * EVENTS_PER_ITEM).clamp(CHECKPOINT_MIN, every.max(CHECKPOINT_MIN));
    let by_budget = (items as u128 * events as u128 / budget.max(1) as u128) as usize;
    by_size.max(by_budget)
}

/// Events between the bounds of the changes kept for jumps ([`Deltas`]): a jump replays at
/// most half of them at each end, and the changes between the bounds in between. In the tests,
/// a few, so that small traces cross changes too.
const DELTA_EVERY: usize = if cfg!(test) { 16 } else { 65_536 };

/// What crossing one kept change costs a jump, counted in events replayed: a change sets a
/// block in the state and in the sums moved with it (which sum it by site and step), where
/// most events of a run touch a few addresses again and again (on the 10M-event replica of
/// decomfl, 290 ns a change against 30 ns an event). In the tests, one, so that their small
/// traces cross changes too.
const CHANGE_COST: usize = if cfg!(test) { 1 } else { 10 };

/// What summing a checkpoint the first time costs a jump that starts there, per block or
/// segment, counted in events replayed: the blocks sorted by address and summed by site
/// (14 ms for 150,000 blocks on the replica, against 2 ms to copy them). In the tests, none,
/// so that moves start from checkpoints not summed yet too.
const FIRST_SUMS_COST: usize = if cfg!(test) { 0 } else { 3 };

/// Checkpoints of at least this many blocks and segments are summed off the dashboard's loop
/// once sums are asked for ([`sum_off_the_loop`]): summed at a jump's first visit, one of
/// 150,000 blocks took the frame 14-22 ms. In the tests, every one that holds anything, so
/// that the sums made there are compared too.
const SUM_OFF_LOOP_FROM: usize = if cfg!(test) { 1 } else { 16_384 };

/// Sums made off the loop, by checkpoint position, waiting to be taken.
type MadeOffLoop = Arc<Mutex<Vec<(usize, Sums)>>>;

/// Sums the checkpoints of at least [`SUM_OFF_LOOP_FROM`] blocks and segments on a thread of
/// their own, the largest first, sorting their blocks by address on the way (kept in the
/// checkpoints, as a jump's first visit kept them), with the call tree's sums where `tree`
/// gives their context and the snapshot the checkpoints are of: what it hands back, which
/// the dataset takes at its next move. The thread stops once the dataset lets go of it.
fn sum_off_the_loop(
    checkpoints: &[(usize, Arc<MemoryState>)],
    tree: Option<(Arc<TreeContext>, Arc<Snapshot>)>,
) -> MadeOffLoop {
    let made = MadeOffLoop::default();
    let mut todo: Vec<(usize, Arc<MemoryState>)> = checkpoints
        .iter()
        .filter(|(_, s)| items(s) >= SUM_OFF_LOOP_FROM)
        .map(|(k, s)| (*k, Arc::clone(s)))
        .collect();
    if todo.is_empty() {
        return made;
    }
    todo.sort_by_key(|(k, s)| (std::cmp::Reverse(items(s)), *k));
    let sink = Arc::clone(&made);
    let spawned = std::thread::Builder::new()
        .name("vramscope-sums".into())
        .spawn(move || {
            for (k, state) in todo {
                if Arc::strong_count(&sink) == 1 {
                    return;
                }
                let mut sums = Sums::of_state(&state);
                if let Some((context, snapshot)) = &tree {
                    sums.ensure_tree(context, &snapshot.events, &state);
                }
                if let Ok(mut made) = sink.lock() {
                    made.push((k, sums));
                }
            }
        });
    // Without a thread, a jump sums a checkpoint at its first visit, as before.
    drop(spawned);
    made
}

/// Where [`Dataset::state_at`] starts from.
#[derive(Clone, Copy)]
enum Start {
    /// The state it worked out last.
    Cache,
    /// A checkpoint, by index.
    Checkpoint(usize),
    /// The state after the last event.
    Head,
}

/// How [`Dataset::state_at`] goes from where it starts to the position asked for.
#[derive(Clone, Copy)]
enum Route {
    /// Event by event.
    Events,
    /// Event by event to bound `.0` of the kept changes, across the changes to bound `.1`,
    /// then event by event.
    Across(usize, usize),
}

/// Makes `cache` a copy of `state`, the state at `pos`: in the memory of the state it held
/// where nothing else holds that one (the analysis of a cut may), so that the copy finds its
/// pages in place.
fn copy_into(cache: &mut Option<(usize, Arc<MemoryState>)>, pos: usize, state: &MemoryState) {
    if let Some((k, held)) = cache {
        if let Some(held) = Arc::get_mut(held) {
            held.clone_from(state);
            *k = pos;
            return;
        }
    }
    *cache = Some((pos, Arc::new(state.clone())));
}

/// Applies events `from..to` to `state` (the state at `from`) or undoes events `to..from`,
/// noting the changes in `batch` where there is one.
fn replay(
    state: &mut MemoryState,
    mut batch: Option<&mut Batch>,
    events: &[Event],
    link: &[u32],
    from: usize,
    to: usize,
) {
    if from > to {
        for i in (to..from).rev() {
            let undo = |s: &mut MemoryState| {
                vramscope_engine::undo(s, events, link, i);
            };
            match batch.as_deref_mut() {
                Some(batch) => batch.step(state, &events[i], undo),
                None => undo(state),
            }
        }
    } else {
        for (i, e) in events.iter().enumerate().take(to).skip(from) {
            let apply = |s: &mut MemoryState| s.apply(e, i as u32);
            match batch.as_deref_mut() {
                Some(batch) => batch.step(state, e, apply),
                None => apply(state),
            }
        }
    }
}

/// Raises `named` (one past the highest call-site, tag and scope ids seen) to the ids `e`
/// names.
fn note_ids(named: &mut [usize; 3], e: &Event) {
    for (n, id) in named.iter_mut().zip([e.site(), e.tag(), e.scope()]) {
        if let Some(id) = id {
            *n = (*n).max(id as usize + 1);
        }
    }
}

/// The blocks and segments of a state: what keeping or cloning it costs, about.
fn items(state: &MemoryState) -> usize {
    state.blocks.len() + state.segments.len()
}

/// Where the data comes from, for the header.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Origin {
    /// A file on disk.
    File(String),
    /// A live program through telemetry.
    Live(String),
    /// An allocator in this process.
    InProcess(String),
}

impl Origin {
    /// The name shown in the header.
    pub fn label(&self) -> &str {
        match self {
            Origin::File(s) | Origin::Live(s) | Origin::InProcess(s) => s,
        }
    }
}

/// The connection state of a live source.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Link {
    /// Not a live source, or connected.
    Up,
    /// Waiting for the first connection.
    Connecting,
    /// The program went away at this time (Unix nanoseconds); retrying.
    Down {
        /// When the connection was lost.
        since_unix_ns: u64,
        /// Why.
        reason: String,
    },
    /// The workload or program finished normally.
    Ended,
}

/// The latest figures a live source reported.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LiveFigures {
    /// The allocator's statistics.
    pub stats: Option<MemoryStats>,
    /// The current step.
    pub step: u64,
    /// Events the dashboard did not receive.
    pub dropped_events: u64,
}

/// The growing snapshot and everything derived from it. See the module documentation.
#[derive(Clone, Debug)]
pub struct Dataset {
    snapshot: Arc<Snapshot>,
    origin: Origin,
    head: MemoryState,
    start_usage: Usage,
    usage: UsageSeries,
    /// The extremes of `usage` by bucket, for ranges of it.
    pyramid: Pyramid,
    /// The highest allocated and reserved bytes over the start and every event, and the first
    /// positions that reach each (kept as the events come, instead of a running maximum per
    /// event: 16 bytes an event, 160 MB at 10M).
    peak: Peak,
    /// The highest allocated and reserved bytes among the events dropped from the front (a
    /// live source's oldest), and the states before them: the peak up to any position counts
    /// them, since they came before it.
    dropped_peak: Usage,
    /// The states kept along the way, shared with the thread that sums them
    /// ([`sum_off_the_loop`]).
    checkpoints: Vec<(usize, Arc<MemoryState>)>,
    checkpoint_every: usize,
    /// The changes between the walk's states at evenly spaced positions of the loaded
    /// events, which a long jump crosses instead of replaying every event.
    deltas: Deltas,
    /// How many moves crossed kept changes (the tests' evidence that they were taken).
    #[cfg(test)]
    crossings: usize,
    link: Vec<u32>,
    pairing: Pairing,
    step_starts: Vec<(u64, usize)>,
    ooms: Vec<usize>,
    /// Indices of the host's waits for the device (`Sync` events), in order.
    waits: Vec<usize>,
    /// The kind of every event, apart from the events (see [`Dataset::kinds`]).
    kinds: Vec<EventKind>,
    groups: SiteGroups,
    /// The last state [`Dataset::state_at`] worked out, and its position: shared, so that the
    /// analysis of the data cut there takes it without a copy ([`Dataset::cut_state_at`]); a
    /// move while the analysis still holds it copies it.
    cache: Option<(usize, Arc<MemoryState>)>,
    /// The sums of `cache`, once asked for ([`Dataset::sums_at`]), moved with it.
    cache_sums: Option<Sums>,
    /// The sums of the checkpoints a move started from, by position, made the first time
    /// or off the loop.
    checkpoint_sums: rustc_hash::FxHashMap<usize, Sums>,
    /// The checkpoints' sums made off the loop since the dataset was loaded, not taken yet.
    made_off_loop: MadeOffLoop,
    /// The sums of the head, once asked for, kept up to date as events are appended.
    head_sums: Option<Sums>,
    /// Whether sums were ever asked for: until then no state carries any.
    sums_wanted: bool,
    /// What the call tree's sums are made with, once set: from then on the sums of every
    /// state the dataset works out include the tree's.
    tree_context: Option<Arc<TreeContext>>,
    /// The events that came from the engine's walk (the loaded snapshot's): the state after
    /// any of them is the walk's own, found by undoing from a later state, or by applying
    /// events from an earlier one where no disagreement lies between
    /// (`vramscope_engine::Disagreements`). Events appended after them (a live source's)
    /// are walked forwards.
    loaded: usize,
    disagreements: Disagreements,
    version: u64,
    /// Changes when anything but appended events changes what the events say (see
    /// [`Dataset::epoch`]).
    epoch: u64,
    /// Whether `snapshot.segments` still describe the head state.
    segments_current: bool,
    /// One past the highest call-site, tag and scope ids the events name: table additions
    /// beyond them change nothing the events already say (see [`Dataset::apply_tables`]).
    named: [usize; 3],
    /// The most events kept; older ones are dropped in chunks (live sources).
    pub max_events: usize,
    /// What a live source reported last.
    pub live: LiveFigures,
    /// The connection state.
    pub link_state: Link,
}

/// `snapshot` to share between the dataset and the analyses that read it: its events made
/// shareable first (`Events::share`), so that a cut at any cursor copies none of them.
pub fn shared(mut snapshot: Snapshot) -> Arc<Snapshot> {
    snapshot.events.share();
    Arc::new(snapshot)
}

impl Dataset {
    /// A dataset of `snapshot`, whose segments are the state after its last event.
    pub fn new(snapshot: Snapshot, origin: Origin) -> Dataset {
        Dataset::from_shared(shared(snapshot), origin)
    }

    /// [`Dataset::new`] on a snapshot others read too (the analysis of the whole trace, on
    /// another thread while this one walks it): its events are best shared already
    /// (`Events::share`), else the analyses at a cursor copy the part they read.
    pub fn from_shared(snapshot: Arc<Snapshot>, origin: Origin) -> Dataset {
        let mut d = Dataset {
            snapshot: Arc::new(Snapshot::empty(snapshot.source, snapshot.device.clone())),
            origin,
            head: MemoryState::default(),
            start_usage: Usage::default(),
            usage: UsageSeries::new(),
            pyramid: Pyramid::default(),
            peak: Peak::default(),
            dropped_peak: Usage::default(),
            checkpoints: Vec::new(),
            checkpoint_every: 16_384,
            deltas: Deltas::default(),
            #[cfg(test)]
            crossings: 0,
            link: Vec::new(),
            pairing: Pairing::new(),
            step_starts: Vec::new(),
            ooms: Vec::new(),
            waits: Vec::new(),
            kinds: Vec::new(),
            groups: SiteGroups::new(),
            cache: None,
            cache_sums: None,
            checkpoint_sums: Default::default(),
            made_off_loop: Default::default(),
            head_sums: None,
            sums_wanted: false,
            tree_context: None,
            loaded: 0,
            disagreements: Disagreements::default(),
            version: 0,
            epoch: 0,
            segments_current: true,
            named: [0; 3],
            max_events: 4 << 20,
            live: LiveFigures::default(),
            link_state: Link::Up,
        };
        d.load(snapshot);
        d
    }

    /// Replaces everything with `snapshot` (a live source re-synchronised), keeping the origin,
    /// the live figures and the connection state.
    pub fn reset(&mut self, snapshot: Snapshot) {
        self.load(shared(snapshot));
    }

    /// [`Dataset::reset`] with a shared snapshot (see [`Dataset::from_shared`]).
    pub fn reset_shared(&mut self, snapshot: Arc<Snapshot>) {
        self.load(snapshot);
    }

    /// Takes `other`'s data, made elsewhere from a snapshot (`Dataset::new` on a thread of its
    /// own, so that a large re-synchronising snapshot never holds up the dashboard's keys), as
    /// [`Dataset::reset`] would have: keeping this dataset's origin, live figures, connection
    /// state and event limit, and moving its version and epoch on.
    pub fn adopt(&mut self, mut other: Dataset) {
        other.origin = std::mem::replace(&mut self.origin, Origin::File(String::new()));
        other.live = std::mem::take(&mut self.live);
        other.link_state = self.link_state.clone();
        other.max_events = self.max_events;
        other.version = self.version + 1;
        other.epoch = self.epoch + 1;
        *self = other;
    }

    fn load(&mut self, snapshot: Arc<Snapshot>) {
        let n = snapshot.events.len();
        self.checkpoint_every = (n / 48).clamp(CHECKPOINT_MIN, 1 << 20);
        let widest = self.checkpoint_every;
        let mut checkpoints = Vec::new();
        // The walk goes from the end backwards: a state is kept when the checkpoint above it is
        // as far as its size asks for.
        // The head stands for a checkpoint at the end (`state_at` undoes from it).
        let mut above = n;
        // The largest state so far: the budget only grows, so every checkpoint kept fits the
        // final one.
        let mut largest = 0;
        let mut deltas = DeltaBuilder::new(&snapshot.events, DELTA_EVERY);
        let step = CHECKPOINT_MIN.min(DELTA_EVERY);
        let walk = vramscope_engine::Reconstruction::new(&snapshot, step, &mut |k, s| {
            deltas.observe(k, s);
            if !k.is_multiple_of(CHECKPOINT_MIN) {
                return;
            }
            let size = items(s);
            largest = largest.max(size);
            let gap = checkpoint_gap(size, widest, n, checkpoint_budget(n, largest));
            if above - k >= gap {
                checkpoints.push((k, Arc::new(s.clone())));
                above = k;
            }
        });
        // The walk found the peaks (the first event reaching each); a pass over the usage
        // would find them again.
        self.peak = Peak::of_walk(&walk);
        deltas.observe(0, &walk.start);
        deltas.observe(n, &walk.end);
        self.deltas = deltas.finish();
        self.head = walk.end;
        self.start_usage = walk.start.usage();
        checkpoints.push((0, Arc::new(walk.start)));
        checkpoints.reverse();
        self.usage = walk.usage;
        self.pyramid = Pyramid::new(&self.usage);
        self.dropped_peak = Usage::default();
        self.checkpoints = checkpoints;
        self.link = walk.links;
        self.pairing = walk.pairing;
        self.loaded = n;
        self.disagreements = walk.disagreements;
        self.kinds = snapshot.events.iter().map(|e| e.kind).collect();
        self.named = [0; 3];
        for e in snapshot.events.iter() {
            note_ids(&mut self.named, e);
        }
        self.ooms = self
            .kinds
            .iter()
            .enumerate()
            .filter(|(_, &k)| k == EventKind::Oom)
            .map(|(i, _)| i)
            .collect();
        self.waits = self
            .kinds
            .iter()
            .enumerate()
            .filter(|(_, &k)| k == EventKind::Sync)
            .map(|(i, _)| i)
            .collect();
        self.groups = SiteGroups::from_sites(&snapshot.sites);
        self.cache = None;
        self.clear_sums();
        self.segments_current = true;
        // The analysis reads the events up to the time cursor: shared (by the caller), they
        // are not copied for it (`cut_snapshot`).
        self.snapshot = snapshot;
        self.step_starts = step_starts(&self.snapshot);
        self.version += 1;
        self.epoch += 1;
        // After the snapshot is in: the call tree's sums read the events the checkpoints'
        // blocks index, this snapshot's, not the one it replaces.
        if self.sums_wanted {
            self.made_off_loop = self.sum_checkpoints_off_the_loop();
        }
    }

    /// Appends events that happened after the last one (a live source).
    pub fn append(&mut self, events: &[Event]) {
        if events.is_empty() {
            return;
        }
        if self.len() == self.loaded && self.checkpoints.last().map(|c| c.0) != Some(self.loaded) {
            // The walk's state after the loaded events, which the head leaves behind now: the
            // state from which the loaded events are undone.
            self.checkpoints
                .push((self.loaded, Arc::new(self.head.clone())));
        }
        let snapshot = Arc::make_mut(&mut self.snapshot);
        for e in events {
            let i = snapshot.events.len();
            self.link.push(self.pairing.push(i as u32, e).link().pack());
            // The event is among the events before it is applied: the sums read the time of
            // an allocation from its event.
            snapshot.events.push(*e);
            match &mut self.head_sums {
                Some(sums) => sums.track(&mut self.head, &snapshot.events, e, |s| {
                    s.apply(e, i as u32)
                }),
                None => self.head.apply(e, i as u32),
            }
            let u = self.head.usage();
            self.usage.push(u);
            self.pyramid.push(u);
            self.peak.take(u, self.usage.len());
            match e.kind {
                EventKind::Step => {
                    snapshot.steps.push(StepMark {
                        step: u64::from(e.step),
                        seq: e.seq,
                        time_ns: e.time_ns,
                        label: "mark_step".to_string(),
                    });
                    self.step_starts.push((u64::from(e.step), i));
                }
                EventKind::Oom => self.ooms.push(i),
                EventKind::Sync => self.waits.push(i),
                _ => {}
            }
            self.kinds.push(e.kind);
            note_ids(&mut self.named, e);
            let len = i + 1;
            if len.is_multiple_of(self.checkpoint_every) {
                self.checkpoints.push((len, Arc::new(self.head.clone())));
            }
        }
        snapshot.events.share();
        // Only the appended events' checkpoints are thinned: the loaded ones are the walk's,
        // as few as it chose.
        let loaded = self.loaded;
        // Past `MAX_CHECKPOINTS` of them holding more than their share of the events, or
        // holding more than the budget (whose full-size states are the head's size), every
        // other one goes, until they fit.
        let budget = checkpoint_budget(self.len() - loaded, items(&self.head));
        loop {
            let (appended, held) = self
                .checkpoints
                .iter()
                .filter(|(k, _)| *k > loaded)
                .fold((0, 0), |(n, held), (_, s)| (n + 1, held + items(s)));
            let share = (self.len() - loaded) / EVENTS_PER_ITEM;
            let crowded = appended > MAX_CHECKPOINTS && held > share;
            if appended == 0 || !(crowded || held > budget) {
                break;
            }
            self.checkpoint_every = self.checkpoint_every.saturating_mul(2);
            let every = self.checkpoint_every;
            self.checkpoints
                .retain(|(k, _)| k.is_multiple_of(every) || *k <= loaded);
            self.checkpoint_sums
                .retain(|k, _| k.is_multiple_of(every) || *k <= loaded);
        }
        self.segments_current = false;
        self.version += 1;
        let len = self.len();
        if len > self.max_events + self.max_events / 4 {
            self.trim_front(len - self.max_events);
        }
    }

    /// Drops the oldest `count` events, keeping the state after them as the new start.
    pub fn trim_front(&mut self, count: usize) {
        let count = count.min(self.len());
        if count == 0 {
            return;
        }
        let start = self.state_at(count).clone();
        let shift = |bits: u32| -> u32 {
            let mut link = FreeLink::unpack(bits);
            link.alloc = link.alloc.and_then(|a| a.checked_sub(count as u32));
            link.pack()
        };
        let fix_blocks = |state: &mut MemoryState| {
            for b in state.blocks.unordered_mut() {
                if b.alloc_event != vramscope_engine::NO_EVENT {
                    b.alloc_event = if (b.alloc_event as usize) < count {
                        vramscope_engine::NO_EVENT
                    } else {
                        b.alloc_event - count as u32
                    };
                }
            }
        };
        self.dropped_peak = self.peak_at(count);
        let snapshot = Arc::make_mut(&mut self.snapshot);
        snapshot.events.drain(..count);
        snapshot.events.share();
        snapshot.dropped_events += count as u64;
        self.start_usage = self.usage.get(count - 1).unwrap_or_default();
        self.usage.drop_front(count);
        self.pyramid = Pyramid::new(&self.usage);
        self.peak = Peak::from_usage(self.start_usage, &self.usage);
        self.link.drain(..count);
        for l in &mut self.link {
            *l = shift(*l);
        }
        self.pairing.drop_front(count as u32);
        // A free whose allocation was dropped no longer names it, so undoing it would not
        // bring back the block it freed: from here on every state is walked forwards from the
        // new start (the state after the dropped events), as a live source's appended events
        // are.
        self.loaded = 0;
        self.disagreements = Disagreements::default();
        self.deltas = Deltas::default();
        fix_blocks(&mut self.head);
        let mut checkpoints = vec![(0, Arc::new(start))];
        for (k, mut s) in std::mem::take(&mut self.checkpoints) {
            if k > count {
                fix_blocks(Arc::make_mut(&mut s));
                checkpoints.push((k - count, s));
            }
        }
        fix_blocks(Arc::make_mut(&mut checkpoints[0].1));
        self.checkpoints = checkpoints;
        // Blocks whose allocation was dropped count from before the trace now.
        self.clear_sums();
        self.step_starts.retain(|&(_, i)| i >= count);
        for s in &mut self.step_starts {
            s.1 -= count;
        }
        self.kinds.drain(..count);
        self.ooms.retain(|&i| i >= count);
        for i in &mut self.ooms {
            *i -= count;
        }
        self.waits.retain(|&i| i >= count);
        for i in &mut self.waits {
            *i -= count;
        }
        self.cache = None;
        self.version += 1;
        self.epoch += 1;
    }

    /// Applies table additions from a live source: the work of the additions alone (their
    /// call sites are named and grouped; nothing else is gone over again). Only where an
    /// event already named an entry added now (a publisher sends the additions before the
    /// events that need them, so normally none does) do the lists derived event by event
    /// start over ([`Dataset::epoch`]).
    pub fn apply_tables(&mut self, tables: &TablesFrame) {
        let snapshot = Arc::make_mut(&mut self.snapshot);
        let before = [
            snapshot.sites.len(),
            snapshot.tags.len(),
            snapshot.scopes.len(),
        ];
        tables.apply_to(snapshot);
        self.groups.sync(&snapshot.sites);
        let after = [
            snapshot.sites.len(),
            snapshot.tags.len(),
            snapshot.scopes.len(),
        ];
        self.version += 1;
        let renamed = (0..3).any(|t| after[t] > before[t] && self.named[t] > before[t]);
        if renamed {
            self.epoch += 1;
        }
    }

    /// Records statistics from a live source.
    pub fn set_live(&mut self, stats: MemoryStats, step: u64, dropped_events: u64) {
        self.live = LiveFigures {
            stats: Some(stats),
            step,
            dropped_events,
        };
        Arc::make_mut(&mut self.snapshot).stats = stats;
        self.version += 1;
    }

    /// The snapshot (its segments describe the end state only for files; see
    /// [`Dataset::snapshot_at`]).
    pub fn snapshot(&self) -> &Snapshot {
        &self.snapshot
    }

    /// The shared snapshot, with its segments brought up to date with the head state.
    pub fn shared_snapshot(&mut self) -> Arc<Snapshot> {
        if !self.segments_current {
            let segments = self.head.to_segments();
            Arc::make_mut(&mut self.snapshot).segments = segments;
            self.segments_current = true;
        }
        Arc::clone(&self.snapshot)
    }

    /// A snapshot of the state at position `pos`: the events before it and the segments then.
    pub fn snapshot_at(&mut self, pos: usize) -> Snapshot {
        let pos = pos.min(self.len());
        if pos == self.len() {
            return (*self.shared_snapshot()).clone();
        }
        let (full, segments) = self.cut_at(pos);
        cut_snapshot(&full, pos, segments)
    }

    /// What [`Dataset::snapshot_at`] needs of the dataset itself for a position `pos` before
    /// the end, without copying events: the whole snapshot, shared, and the segments at `pos`.
    /// [`cut_snapshot`] makes the snapshot from them (sharing the events, copying the tables)
    /// wherever that does not hold up the dashboard (the analysis thread of
    /// `crate::analysis`).
    pub fn cut_at(&mut self, pos: usize) -> (Arc<Snapshot>, Vec<Segment>) {
        let segments = self.state_at(pos).to_segments();
        (Arc::clone(&self.snapshot), segments)
    }

    /// Where the data comes from.
    pub fn origin(&self) -> &Origin {
        &self.origin
    }

    /// Number of events.
    pub fn len(&self) -> usize {
        self.usage.len()
    }

    /// Whether there are no events.
    pub fn is_empty(&self) -> bool {
        self.usage.is_empty()
    }

    /// The events.
    pub fn events(&self) -> &[Event] {
        &self.snapshot.events
    }

    /// A number that changes whenever the data changes.
    pub fn version(&self) -> u64 {
        self.version
    }

    /// A number that changes when the events change other than by new ones at the end: a new
    /// snapshot, old events dropped (every index moves), new call-site tables (events may name
    /// other groups). Lists derived event by event (the event log's rows,
    /// `crate::app::App::prepare`) are only extended while it stays the same.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// The call-site groups.
    pub fn groups(&self) -> &SiteGroups {
        &self.groups
    }

    /// Allocated and reserved bytes at position `pos`.
    pub fn usage_at(&self, pos: usize) -> Usage {
        match pos.min(self.len()).checked_sub(1) {
            Some(i) => self.usage.get(i).unwrap_or_default(),
            None => self.start_usage,
        }
    }

    /// The highest allocated and reserved bytes up to position `pos` (the start's, those
    /// after the events before `pos`, and those of events already dropped from the front):
    /// from the pyramid, in O(log n).
    pub fn peak_at(&self, pos: usize) -> Usage {
        let pos = pos.min(self.len());
        let kept = if pos == self.len() {
            self.peak.bytes
        } else {
            let mut peak = self.start_usage;
            if let Some(e) = self.pyramid.range(&self.usage, 0, pos) {
                peak = higher(peak, e.max);
            }
            peak
        };
        higher(kept, self.dropped_peak)
    }

    /// The position where allocated bytes first reach their peak among the events kept (0
    /// when the state before the first kept event already held it): where `P` and a newly
    /// opened file put the cursor.
    pub fn peak_allocated_pos(&self) -> usize {
        self.peak.allocated_pos
    }

    /// The position where reserved bytes first reach their peak among the events kept (`R`).
    pub fn peak_reserved_pos(&self) -> usize {
        self.peak.reserved_pos
    }

    /// Allocated and reserved bytes after every event.
    pub fn usage(&self) -> &UsageSeries {
        &self.usage
    }

    /// The lowest and highest allocated and reserved bytes after events `a..b` (the usage
    /// series' `usage()[a..b]`), in O(log n); `None` for an empty range.
    pub fn usage_extremes(&self, a: usize, b: usize) -> Option<Extremes> {
        self.pyramid.range(&self.usage, a, b)
    }

    /// Usage before the first event.
    pub fn start_usage(&self) -> Usage {
        self.start_usage
    }

    /// `(step number, index of its first event)` for every step start, in order.
    pub fn step_starts(&self) -> &[(u64, usize)] {
        &self.step_starts
    }

    /// Indices of OOM events.
    pub fn ooms(&self) -> &[usize] {
        &self.ooms
    }

    /// Indices of the host's waits for the device (`Sync` events: a profiler trace's runtime
    /// syncs, PyTorch's sync debug mode), in order.
    pub fn waits(&self) -> &[usize] {
        &self.waits
    }

    /// The frees the trace lost: allocations at an address whose block was not freed yet, as
    /// the engine's pairing counts them for `report` too; events dropped from the front of a
    /// live session included.
    pub fn lost_frees(&self) -> u64 {
        self.pairing.lost_frees()
    }

    /// The kind of every event, in a column of its own: a pass over the kinds (the event log's
    /// kind filter) reads two bytes an event rather than the whole events.
    pub fn kinds(&self) -> &[EventKind] {
        &self.kinds
    }

    /// The step number at position `pos`: that of the next event (so that a cursor at a step
    /// mark is in the step that begins there), or of the last event at the end.
    pub fn step_at(&self, pos: usize) -> u64 {
        let events = &self.snapshot.events;
        match events.get(pos) {
            Some(e) => u64::from(e.step),
            None => events.last().map_or(0, |e| u64::from(e.step)),
        }
    }

    /// The state at position `pos` (after the first `pos` events): for a loaded event the
    /// engine walk's own state there (whose figures the usage series holds), for an appended
    /// one the state its events leave walking forwards.
    pub fn state_at(&mut self, pos: usize) -> &MemoryState {
        let n = self.len();
        let pos = pos.min(n);
        if pos == n {
            return &self.head;
        }
        // Start from the cached state, a checkpoint or the head, whichever costs least: a
        // copy of the state (but for the cached one) and the route from there. The route
        // undoes events (the walk's own step: only from a state of the walk, at or before
        // `loaded`), applies them (where that keeps to the walk's states), or goes to the
        // nearest bound of the kept changes and crosses them (within the loaded events).
        // The checkpoint at or before `pos` with the events applied is always at hand, which
        // the head (undone) beats only before any event was appended.
        if self.sums_wanted {
            self.take_sums_made_off_the_loop();
        }
        let above = self.checkpoints.partition_point(|(k, _)| *k < pos);
        let below = above
            .checked_sub(1)
            .filter(|&b| self.checkpoints[b].0 < pos);
        let mut best: Option<(usize, Start, Route)> = None;
        let mut consider = |copy: usize, from: usize, start: Start| {
            if let Some((cost, route)) = self.route(from, pos) {
                let cost = copy + cost;
                if best.is_none_or(|(c, _, _)| cost < c) {
                    best = Some((cost, start, route));
                }
            }
        };
        if let Some((k, _)) = &self.cache {
            consider(0, *k, Start::Cache);
        }
        let unsummed = |k: usize| self.sums_wanted && !self.summed(k);
        for c in [Some(above), below].into_iter().flatten() {
            if let Some((k, state)) = self.checkpoints.get(c) {
                let first = if unsummed(*k) { FIRST_SUMS_COST } else { 0 };
                consider(items(state) * (1 + first), *k, Start::Checkpoint(c));
            }
        }
        consider(items(&self.head), n, Start::Head);
        // Nothing else keeps to the walk: the first checkpoint, walked forwards (the events
        // before `loaded` agree with the walk wherever a checkpoint at or before `loaded` is
        // missing, which only a trimmed live source has, and it walks forwards throughout).
        let (_, start, route) = best.unwrap_or((0, Start::Checkpoint(0), Route::Events));
        match start {
            Start::Cache => {}
            Start::Checkpoint(c) => {
                let (k, state) = &self.checkpoints[c];
                copy_into(&mut self.cache, *k, state);
                self.cache_sums = None;
                if self.sums_wanted {
                    let (k, state) = &self.checkpoints[c];
                    let sums = self
                        .checkpoint_sums
                        .entry(*k)
                        .or_insert_with(|| Sums::of_state(state));
                    if let Some(context) = &self.tree_context {
                        sums.ensure_tree(context, &self.snapshot.events, state);
                    }
                    self.cache_sums = Some(sums.clone());
                }
            }
            Start::Head => {
                copy_into(&mut self.cache, n, &self.head);
                self.cache_sums = self.sums_wanted.then(|| self.head_sums().clone());
            }
        }
        let events = &self.snapshot.events;
        if let Some((k, state)) = self.cache.as_mut().filter(|(k, _)| *k != pos) {
            let state = Arc::make_mut(state);
            let link = &self.link;
            // The sums take the run's changes once at its end, address by address.
            let mut batch = self.cache_sums.as_ref().map(|_| Batch::default());
            match route {
                Route::Events => replay(state, batch.as_mut(), events, link, *k, pos),
                Route::Across(i, j) => {
                    let (from, to) = (self.deltas.bound(i), self.deltas.bound(j));
                    replay(state, batch.as_mut(), events, link, *k, from);
                    self.deltas.cross(state, batch.as_mut(), i, j);
                    replay(state, batch.as_mut(), events, link, to, pos);
                    #[cfg(test)]
                    {
                        self.crossings += usize::from(i != j);
                    }
                }
            }
            if let (Some(sums), Some(batch)) = (&mut self.cache_sums, batch) {
                sums.take(batch, state, events);
            }
            *k = pos;
        }
        match &self.cache {
            Some((_, state)) => state,
            None => &self.head,
        }
    }

    /// The cheapest way from the state at `from` to the state at `pos` that keeps to the
    /// states [`Dataset::state_at`] stands for, and its cost in events replayed (a kept change
    /// counts [`CHANGE_COST`]); `None` where there is none.
    fn route(&self, from: usize, pos: usize) -> Option<(usize, Route)> {
        let loaded = self.loaded;
        // Event by event: undoing only from a state of the walk, applying only where no
        // loaded event between disagrees with it.
        let walks = |a: usize, b: usize| {
            if a >= b {
                a <= loaded || a == b
            } else {
                self.forward_keeps(a, b)
            }
        };
        let mut best = walks(from, pos).then(|| (from.abs_diff(pos), Route::Events));
        if from > loaded || pos > loaded {
            return best;
        }
        let (Some(near_from), Some(near_pos)) = (self.deltas.around(from), self.deltas.around(pos))
        else {
            return best;
        };
        for i in near_from {
            for j in near_pos {
                let (a, b) = (self.deltas.bound(i), self.deltas.bound(j));
                if !walks(from, a) || !walks(b, pos) {
                    continue;
                }
                let cost = from.abs_diff(a)
                    + CHANGE_COST.saturating_mul(self.deltas.changes(i, j))
                    + b.abs_diff(pos);
                if best.is_none_or(|(c, _)| cost < c) {
                    best = Some((cost, Route::Across(i, j)));
                }
            }
        }
        best
    }

    /// Takes the checkpoints' sums made off the loop so far into `checkpoint_sums`, unless
    /// the thread holds them just now.
    fn take_sums_made_off_the_loop(&mut self) {
        let Ok(mut made) = self.made_off_loop.try_lock() else {
            return;
        };
        let made: Vec<(usize, Sums)> = made.drain(..).collect();
        for (k, sums) in made {
            // Sums made with an older tree context (or none) give way; those of the
            // current one are kept.
            match self.checkpoint_sums.get(&k) {
                Some(held) if self.current(held) || !self.current(&sums) => {}
                _ => {
                    self.checkpoint_sums.insert(k, sums);
                }
            }
        }
    }

    /// Whether `sums` hold the call tree's sums of the current context, or none where there is
    /// none: what a move from their state would otherwise make whole.
    fn current(&self, sums: &Sums) -> bool {
        match (sums.tree(), &self.tree_context) {
            (Some((made_with, _)), Some(context)) => std::ptr::eq(made_with, Arc::as_ptr(context)),
            (_, context) => context.is_none(),
        }
    }

    /// Whether the checkpoint at `k` has its sums, current ([`Dataset::current`]).
    fn summed(&self, k: usize) -> bool {
        self.checkpoint_sums
            .get(&k)
            .is_some_and(|s| self.current(s))
    }

    /// Whether applying the events from position `from` to `pos` keeps to the states
    /// [`Dataset::state_at`] stands for: no loaded event among them disagrees with the walk.
    fn forward_keeps(&self, from: usize, pos: usize) -> bool {
        self.disagreements
            .none_in(from.min(self.loaded), pos.min(self.loaded))
    }

    /// The state at `pos` if it is at hand without work (the head, or the last state
    /// [`Dataset::state_at`] computed).
    pub fn cached_state(&self, pos: usize) -> Option<&MemoryState> {
        if pos >= self.len() {
            return Some(&self.head);
        }
        match &self.cache {
            Some((k, state)) if *k == pos => Some(state),
            _ => None,
        }
    }

    /// The state at the end.
    pub fn head(&self) -> &MemoryState {
        &self.head
    }

    /// What the analysis of the data up to position `pos` needs of the dataset: the whole
    /// snapshot and the state at `pos`, both shared, so that the dashboard's loop hands them
    /// over at no cost; `crate::analysis` turns the state into segments on its own thread
    /// (the segments of 172,000 live blocks took the loop 16-20 ms, issue 47).
    pub fn cut_state_at(&mut self, pos: usize) -> (Arc<Snapshot>, Arc<MemoryState>) {
        let _ = self.state_at(pos);
        let state = match &self.cache {
            Some((k, state)) if *k == pos => Arc::clone(state),
            _ => Arc::new(self.state_at(pos).clone()),
        };
        (Arc::clone(&self.snapshot), state)
    }

    /// Forgets every state's sums (the blocks changed other than by events), those being
    /// made off the loop too.
    fn clear_sums(&mut self) {
        self.cache_sums = None;
        self.checkpoint_sums.clear();
        self.made_off_loop = MadeOffLoop::default();
        self.head_sums = None;
    }

    /// The head's sums, made the first time (settled, the tree's included once asked for).
    fn head_sums(&mut self) -> &Sums {
        let head = &self.head;
        let sums = self.head_sums.get_or_insert_with(|| Sums::of_state(head));
        sums.settle(head);
        if let Some(context) = &self.tree_context {
            sums.ensure_tree(context, &self.snapshot.events, head);
        }
        sums
    }

    /// Sets what the call tree's sums are made with: from then on [`Dataset::sums_at`]
    /// includes them ([`Sums::tree`]), each state's made again with `context` the first time.
    /// The checkpoints' sums, the tree's included, are made off the loop again with it.
    pub fn set_tree_context(&mut self, context: Arc<TreeContext>) {
        self.tree_context = Some(context);
        if self.sums_wanted {
            self.made_off_loop = self.sum_checkpoints_off_the_loop();
        }
    }

    /// [`sum_off_the_loop`] of the loaded checkpoints (a live source's later ones are summed
    /// at their first visit), with the call tree's sums once their context is set.
    fn sum_checkpoints_off_the_loop(&self) -> MadeOffLoop {
        let loaded = self.checkpoints.partition_point(|(k, _)| *k <= self.loaded);
        let tree = self
            .tree_context
            .as_ref()
            .map(|context| (Arc::clone(context), Arc::clone(&self.snapshot)));
        sum_off_the_loop(&self.checkpoints[..loaded], tree)
    }

    /// The sums of the state at position `pos` ([`Dataset::state_at`]'s): made whole the
    /// first time a move starts from a checkpoint or the head, and moved with the state
    /// after that, so that a move costs the blocks its events change (see `sums`). From the
    /// first call on, every state the dataset works out carries its sums.
    pub fn sums_at(&mut self, pos: usize) -> &Sums {
        if !self.sums_wanted {
            // From the first ask on, the checkpoints are summed off the loop: not before, so
            // that a dataset nobody draws (and the analysis of the trace, at its opening)
            // is not kept company by their sums.
            self.sums_wanted = true;
            self.made_off_loop = self.sum_checkpoints_off_the_loop();
        }
        let pos = pos.min(self.len());
        let _ = self.state_at(pos);
        if pos == self.len() {
            return self.head_sums();
        }
        let state = match &self.cache {
            Some((_, state)) => state,
            None => &self.head,
        };
        let sums = self.cache_sums.get_or_insert_with(|| Sums::of_state(state));
        sums.settle(state);
        if let Some(context) = &self.tree_context {
            sums.ensure_tree(context, &self.snapshot.events, state);
        }
        sums
    }

    /// The sums at `pos` if [`Dataset::sums_at`] left them at hand (the head's, or the last
    /// position's), settled.
    pub fn cached_sums(&self, pos: usize) -> Option<&Sums> {
        let sums = if pos >= self.len() {
            self.head_sums.as_ref()
        } else {
            match &self.cache {
                Some((k, _)) if *k == pos => self.cache_sums.as_ref(),
                _ => None,
            }
        };
        sums.filter(|s| s.settled())
    }
}

/// The snapshot of the first `pos` events of `full`, whose segments were `segments` then (see
/// [`Dataset::cut_at`]): those events (the same memory where `full`'s events are shared, as a
/// dataset's are), a copy of the tables and the step marks up to them.
pub fn cut_snapshot(full: &Snapshot, pos: usize, segments: Vec<Segment>) -> Snapshot {
    let s = full;
    let pos = pos.min(s.events.len());
    let last_seq = pos.checked_sub(1).map(|i| s.events[i].seq);
    let mut cut = Snapshot::empty(s.source, s.device.clone());
    cut.format_version = s.format_version;
    cut.config = s.config.clone();
    cut.stats = s.stats;
    cut.epoch_unix_ns = s.epoch_unix_ns;
    cut.segments = segments;
    cut.events = s.events.prefix(pos);
    cut.dropped_events = s.dropped_events;
    cut.sites = s.sites.clone();
    cut.tags = s.tags.clone();
    cut.scopes = s.scopes.clone();
    cut.steps = s
        .steps
        .iter()
        .filter(|m| last_seq.is_some_and(|q| m.seq <= q))
        .cloned()
        .collect();
    cut.annotations = s.annotations.clone();
    cut
}

/// The highest allocated and reserved bytes of a usage series and where each is first reached.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Peak {
    /// The highest figures, each on its own.
    bytes: Usage,
    /// The first position (events applied) whose allocated bytes equal `bytes.allocated`.
    allocated_pos: usize,
    /// The first position whose reserved bytes equal `bytes.reserved`.
    reserved_pos: usize,
}

impl Peak {
    /// The peak of `start` (position 0) followed by `usage` (positions 1 on).
    fn from_usage(start: Usage, usage: &UsageSeries) -> Peak {
        let mut peak = Peak {
            bytes: start,
            allocated_pos: 0,
            reserved_pos: 0,
        };
        for (i, u) in usage.iter().enumerate() {
            peak.take(u, i + 1);
        }
        peak
    }

    /// The peak the engine's walk found: the same rule (the start's figures, then the first
    /// event whose figure passes every one before it), so it equals [`Peak::from_usage`] of its usage.
    fn of_walk(walk: &vramscope_engine::Reconstruction) -> Peak {
        let pos = |peak: &vramscope_engine::Peak| peak.event.map_or(0, |e| e as usize + 1);
        Peak {
            bytes: Usage {
                allocated: walk.peak_allocated.bytes,
                reserved: walk.peak_reserved.bytes,
            },
            allocated_pos: pos(&walk.peak_allocated),
            reserved_pos: pos(&walk.peak_reserved),
        }
    }

    /// Takes in `u`, the usage at position `pos`, after every earlier one.
    fn take(&mut self, u: Usage, pos: usize) {
        if u.allocated > self.bytes.allocated {
            self.bytes.allocated = u.allocated;
            self.allocated_pos = pos;
        }
        if u.reserved > self.bytes.reserved {
            self.bytes.reserved = u.reserved;
            self.reserved_pos = pos;
        }
    }
}

/// Step starts of a snapshot: each step mark at the first event with its sequence number.
fn step_starts(snapshot: &Snapshot) -> Vec<(u64, usize)> {
    let events = &snapshot.events;
    let mut out: Vec<(u64, usize)> = snapshot
        .steps
        .iter()
        .map(|m| (m.step, events.partition_point(|e| e.seq < m.seq)))
        .filter(|&(_, i)| i < events.len())
        .collect();
    out.sort_by_key(|&(step, i)| (i, step));
    out.dedup_by_key(|s| s.1);
    out
}

#[cfg(test)]
mod tests;
