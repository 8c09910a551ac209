//! The one analysis engine: memory state from events, the same in every view.
//!
//! Every question vramscope answers about a trace (allocated and reserved bytes after any
//! event, the peak and what was live then, which free releases which allocation, which call
//! sites hold what) is answered here once, with one set of rules:
//!
//! - `state`: [`MemoryState`], segments (mapped runs) and live blocks ([`LiveBlocks`]), with
//!   `apply` and `undo` for every event kind;
//! - `addr`: [`AddrMap`], the hash maps keyed by device address that the walk and the pairing
//!   use, seeded per process so that a file cannot choose addresses that collide;
//! - `pairing`: [`Pairing`], which allocation each free releases;
//! - `groups`: [`SiteGroups`], call sites grouped by the name a reader sees (`naming`,
//!   [`name_call_site`]: `file:line`, or the autograd node of a C++-only stack) under stable
//!   ids, plus the "unknown site" and "before the trace" groups;
//! - `empty_cache`: the `empty_cache()` calls of a trace ([`empty_cache_calls`]);
//! - `runs`: [`Runs`], a figure per event kept as runs of equal values;
//! - `usage`: [`UsageSeries`], the allocated and reserved bytes after every event, compactly;
//! - [`Reconstruction`] (this file): the state at the start of the trace, rebuilt once from
//!   the dump-time state by undoing every event, the usage after every event, and the peaks;
//! - [`stats`]: PyTorch's `memory_stats()` figures replayed from a trace ([`stats::compute_stats`]);
//! - [`devices`]: the devices of a snapshot, and one device's part with its own statistics.
//!
//! The analysis crate's `ModelView` (and through it the detectors, reports, diff and the HTML
//! page), the importers' statistics, the replay (`vramscope-replay`: its starting state and the trace's own figures) and
//! the dashboard's dataset (`vramscope_tui::data`) are built on this crate and on nothing else
//! that derives state from events. It reads the data model (`vramscope-model`) and nothing
//! else of vramscope. Every item has one path: the crate root's, or its module's for `stats` and `devices`. The figures follow ARCHITECTURE.md's definitions: allocated bytes are
//! block sizes, as PyTorch's `allocated_bytes` counts them; memory from before the trace is
//! part of every figure, under its site when the dump-time state names one.

mod addr;
pub mod devices;
mod empty_cache;
mod groups;
mod naming;
mod pairing;
mod runs;
mod state;
pub mod stats;
mod usage;

pub use addr::{AddrHasher, AddrMap, AddrSet, AddrState};
pub use empty_cache::{empty_cache_calls, stack_calls_empty_cache, EmptyCacheCall};
pub use groups::{GroupId, GroupKind, SiteGroup, SiteGroups};
pub use naming::{
    autograd_node, frame_label, is_compiled_frame, is_generated_frame, is_native_frame,
    is_system_source, name_call_site, notebook_cell, short_function, SiteName,
};
pub use pairing::{FreeLink, Pair, Pairing};
pub use runs::Runs;
pub use state::{LiveBlock, LiveBlocks, MemoryState, SegmentInfo, Usage, NO_EVENT};
pub use usage::UsageSeries;

use std::borrow::Cow;

use vramscope_model::{Event, EventKind, Snapshot};

/// The highest value of one figure and the event after which it was first reached.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Peak {
    /// The highest value.
    pub bytes: u64,
    /// Index of the event after which it was first reached; `None` when the state before the
    /// first event already held it.
    pub event: Option<u32>,
}

/// A trace walked once: its start state, end state, the usage after every event and the link
/// of every free. See the module documentation.
#[derive(Clone, Debug)]
pub struct Reconstruction {
    /// The state before the first event.
    pub start: MemoryState,
    /// The state after the last event.
    pub end: MemoryState,
    /// Allocated and reserved bytes after each event.
    pub usage: UsageSeries,
    /// The packed [`FreeLink`] of each event (see [`FreeLink::pack`]); empty from
    /// [`Reconstruction::without_links`].
    pub links: Vec<u32>,
    /// The pairing after the last event, for appending events later.
    pub pairing: Pairing,
    /// Peak allocated bytes.
    pub peak_allocated: Peak,
    /// Peak reserved bytes.
    pub peak_reserved: Peak,
    /// Whether the trace says anything about reserved bytes (segments, segment events or a
    /// reserved statistic).
    pub reserved_known: bool,
    /// States kept by the walk, `(position, state after that many events)` in increasing
    /// position, from which [`Reconstruction::state_walked`] undoes events instead of from the
    /// end; empty except from [`Reconstruction::without_links`] and
    /// [`Reconstruction::with_states`] (see [`Checkpoints`]).
    checkpoints: Vec<(usize, MemoryState)>,
    /// The pairing after the first `k` events, `(k, pairing)` in increasing `k`, kept by a walk
    /// that lets go of its links ([`Reconstruction::without_links`]), so that finding links
    /// again ([`Reconstruction::state_walked`]) pairs from the nearest of them rather than
    /// from the first event (see [`Pairings`]).
    pairings: Vec<(usize, Pairing)>,
    /// The events where a walk forwards from the walk's own states would part from it
    /// ([`MemoryState::undo_checked`]).
    pub disagreements: Disagreements,
}

/// How many events a walk back that lets go of its links passes between two releases of those
/// behind it ([`Reconstruction::without_links`], [`Reconstruction::states_after`]).
const RELEASE_LINKS_EVERY: usize = 1 << 20;

/// The events of a trace at which the walk back found the state other than applying the
/// event leaves it ([`MemoryState::undo_checked`]): a walk forwards from a state of the walk
/// back reaches the walk's own state at a later position exactly when no such event lies
/// between the two. The dashboard steps forwards where that holds and undoes from a later
/// state where it does not, so that what it shows is always the walk's state. A trace that
/// contradicts itself at more than [`Disagreements::MAX_NOTED`] events counts as
/// contradicting itself everywhere.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Disagreements {
    /// The events, in increasing order.
    at: Vec<u32>,
    everywhere: bool,
}

impl Disagreements {
    /// The most events noted one by one.
    pub const MAX_NOTED: usize = 1 << 16;

    /// Notes event `event`; the walk goes backwards, so the events come in decreasing order
    /// ([`Disagreements::finish_backwards`] turns them round).
    fn note(&mut self, event: usize) {
        if self.everywhere {
            return;
        }
        if self.at.len() >= Self::MAX_NOTED {
            self.everywhere = true;
            self.at = Vec::new();
        } else {
            self.at.push(event as u32);
        }
    }

    fn finish_backwards(&mut self) {
        self.at.reverse();
    }

    /// Whether no event in `from..to` was noted: walking forwards over them keeps to the
    /// walk's states.
    pub fn none_in(&self, from: usize, to: usize) -> bool {
        if from >= to {
            return true;
        }
        if self.everywhere {
            return false;
        }
        let first = self.at.partition_point(|&e| (e as usize) < from);
        self.at.get(first).is_none_or(|&e| e as usize >= to)
    }

    /// Whether none was noted.
    pub fn is_empty(&self) -> bool {
        !self.everywhere && self.at.is_empty()
    }
}

/// The states [`Reconstruction::without_links`] keeps on its way back, so that the walk's
/// state at any event (the peak's, which the model view asks for) is a short walk back from
/// one of them rather than from the end ([`Reconstruction::state_walked`]). A state is kept
/// when the events between it and the last one kept (or the end) are at least a sixteenth of
/// the trace (and at least [`Checkpoints::MIN_GAP`]) and at least
/// [`Checkpoints::EVENTS_PER_ITEM`] times its blocks and segments: at most sixteen states,
/// holding together at most one item per 16 events of the trace, so that what they add to a
/// big trace's memory is a small fraction of its events'.
///
/// For a caller that asks only for the state at the peak of allocated bytes (the model view:
/// [`Checkpoints::for_the_peak`]), only the one kept state that the peak's walk starts from
/// stays: each is held until the walk has passed the events it serves (those between it and
/// the next state kept below), and let go unless their most allocated bytes are the most so
/// far (the earlier of equals, as the peak is the first event to reach them). At most two
/// states are held at once, against up to sixteen; the walk to the peak is as short.
struct Checkpoints {
    kept: Vec<(usize, MemoryState)>,
    /// The position of the last state kept, or the end (the walk goes backwards).
    above: usize,
    /// The fewest events between two kept states.
    gap: usize,
    /// Keeping only the state the peak's walk starts from.
    for_the_peak: bool,
    /// With `for_the_peak`: the most allocated bytes after any event since the last state
    /// kept (the events it serves, walked back from it), and the most of the events served by
    /// the state held in `kept` (by the end while `kept` is empty).
    since: u64,
    best: u64,
    /// With `for_the_peak`: the last state kept, whose events are still being walked.
    pending: Option<(usize, MemoryState)>,
}

impl Checkpoints {
    /// The events each kept item (block or segment) must stand for.
    const EVENTS_PER_ITEM: usize = 16;
    /// The fewest events between two kept states, and how often the walk offers one.
    const MIN_GAP: usize = 16_384;

    fn new(events: usize) -> Checkpoints {
        Checkpoints {
            kept: Vec::new(),
            above: events,
            gap: Self::gap_for(events),
            for_the_peak: false,
            since: 0,
            best: 0,
            pending: None,
        }
    }

    /// Checkpoints that keep only the state the walk to the peak of allocated bytes starts
    /// from (see [`Checkpoints`]).
    fn for_the_peak(events: usize) -> Checkpoints {
        Checkpoints {
            for_the_peak: true,
            ..Checkpoints::new(events)
        }
    }

    /// The fewest events between two kept states of a trace of `events` events: a sixteenth
    /// of it, and at least [`Checkpoints::MIN_GAP`] (the walk's [`Pairings`] are spaced alike).
    fn gap_for(events: usize) -> usize {
        (events / 16).max(Self::MIN_GAP)
    }

    /// Keeps `state`, the state after `pos` events, when it is far enough from the last;
    /// `allocated` is the most allocated bytes after any event walked since the last offer.
    fn offer(&mut self, pos: usize, state: &MemoryState, allocated: u64) {
        self.since = self.since.max(allocated);
        let items = state.blocks.len() + state.segments.len();
        let gap = items.saturating_mul(Self::EVENTS_PER_ITEM).max(self.gap);
        if self.above.saturating_sub(pos) < gap {
            return;
        }
        self.above = pos;
        if !self.for_the_peak {
            self.kept.push((pos, state.clone()));
            return;
        }
        self.settle();
        self.pending = Some((pos, state.clone()));
    }

    /// With `for_the_peak`: the events served by the pending state (or by the end, before
    /// any) are all walked; keeps it in place of the best so far where they reach as many
    /// allocated bytes or more.
    fn settle(&mut self) {
        match self.pending.take() {
            Some(pending) if self.since >= self.best => {
                self.kept = vec![pending];
                self.best = self.since;
            }
            Some(_) => {}
            // The events above the first state kept are served by the end.
            None => self.best = self.since,
        }
        self.since = 0;
    }

    /// The kept states in increasing position; `allocated` is the most allocated bytes after
    /// any event walked since the last offer.
    fn into_increasing(mut self, allocated: u64) -> Vec<(usize, MemoryState)> {
        if self.for_the_peak {
            self.since = self.since.max(allocated);
            if self.pending.is_some() {
                self.settle();
            }
        }
        self.kept.reverse();
        self.kept
    }
}

impl Reconstruction {
    /// Walks `snapshot`: pairs its frees, takes the end state from its segments (or, for a
    /// format without them, from its events and its statistics' current figures), and undoes
    /// every event to reach the start. `checkpoint` is called during the backward walk with
    /// `(position, state)` for every position that is a multiple of `checkpoint_every`
    /// (position `k` is the state after `k` events), last first, and never for `0` or the end.
    pub fn new(
        snapshot: &Snapshot,
        checkpoint_every: usize,
        checkpoint: &mut dyn FnMut(usize, &MemoryState),
    ) -> Reconstruction {
        Reconstruction::walk(
            snapshot,
            checkpoint_every,
            &mut |pos, state, _| checkpoint(pos, state),
            None,
        )
        .0
    }

    /// The walk of `snapshot` without its links (`links` is empty), for a caller that reads
    /// the states, the usage and the peaks and nothing else (the inspector's `ModelView`): the
    /// walk lets go of each stretch of links once it has undone those events, so that at the
    /// peak of a big trace's memory they are not beside the usage (four bytes an event).
    pub fn without_links(snapshot: &Snapshot) -> Reconstruction {
        Reconstruction::keeping_states(
            snapshot,
            Checkpoints::for_the_peak(snapshot.events.len()),
            Some(RELEASE_LINKS_EVERY),
        )
    }

    /// [`Reconstruction::from_snapshot`], also keeping a few states on the way back, for a caller that
    /// asks for the walk's state at several events ([`Reconstruction::state_walked`]: the
    /// HTML explorer's moments).
    pub fn with_states(snapshot: &Snapshot) -> Reconstruction {
        Reconstruction::keeping_states(snapshot, Checkpoints::new(snapshot.events.len()), None)
    }

    /// The walk, keeping states as `checkpoints` choose them.
    fn keeping_states(
        snapshot: &Snapshot,
        mut checkpoints: Checkpoints,
        release_links_every: Option<usize>,
    ) -> Reconstruction {
        let (mut walk, allocated) = Reconstruction::walk(
            snapshot,
            Checkpoints::MIN_GAP,
            &mut |pos, state, allocated| checkpoints.offer(pos, state, allocated),
            release_links_every,
        );
        walk.checkpoints = checkpoints.into_increasing(allocated);
        walk
    }

    /// [`Reconstruction::new`], keeping the links, or, with `release_links_every`, letting go
    /// of those behind the walk every so many events and of all of them at the start.
    /// `checkpoint` also gets the most allocated bytes after any event walked since its last
    /// call (the event just before its position not among them: it is the state's own), and
    /// the walk returns the most after any event walked since the last call.
    fn walk(
        snapshot: &Snapshot,
        checkpoint_every: usize,
        checkpoint: &mut dyn FnMut(usize, &MemoryState, u64),
        release_links_every: Option<usize>,
    ) -> (Reconstruction, u64) {
        let events: &[Event] = &snapshot.events;
        let n = events.len();
        let EndOfTrace {
            mut links,
            pairing,
            end,
            reserved_known,
            pairings,
        } = EndOfTrace::from_snapshot(snapshot, release_links_every.is_some());
        let mut state = end.clone();
        let mut disagreements = Disagreements::default();
        let mut most_since = 0;
        let usage = UsageSeries::from_last(n, |i| {
            let after = state.usage();
            if checkpoint_every > 0 && (i + 1).is_multiple_of(checkpoint_every) && i + 1 < n {
                checkpoint(i + 1, &state, most_since);
                most_since = 0;
            }
            most_since = most_since.max(after.allocated);
            if !undo(&mut state, events, &links, i) {
                disagreements.note(i);
            }
            if release_links_every.is_some_and(|every| i.is_multiple_of(every)) {
                // The walk goes backwards: the links from `i` on are done with.
                links.truncate(i);
                links.shrink_to_fit();
            }
            after
        });
        let start = state;
        disagreements.finish_backwards();
        let peak = |key: fn(&Usage) -> u64| {
            let mut best = Peak {
                bytes: key(&start.usage()),
                event: None,
            };
            for (i, u) in usage.iter().enumerate() {
                if key(&u) > best.bytes {
                    best = Peak {
                        bytes: key(&u),
                        event: Some(i as u32),
                    };
                }
            }
            best
        };
        let peak_allocated = peak(|u| u.allocated);
        let peak_reserved = peak(|u| u.reserved);
        let walk = Reconstruction {
            start,
            end,
            usage,
            links,
            pairing,
            peak_allocated,
            peak_reserved,
            reserved_known,
            checkpoints: Vec::new(),
            pairings,
            disagreements,
        };
        (walk, most_since)
    }

    /// The walk of `snapshot` without checkpoints.
    pub fn from_snapshot(snapshot: &Snapshot) -> Reconstruction {
        Reconstruction::walk(snapshot, 0, &mut |_, _, _| {}, None).0
    }

    /// Only the state before the first event: the same backward walk as [`Reconstruction::from_snapshot`]
    /// without keeping the usage after every event, for callers (the replay's block sizing)
    /// that need where the trace started and nothing else.
    pub fn start_of(snapshot: &Snapshot) -> MemoryState {
        Reconstruction::start_of_paired(snapshot, &PairedEvents::pair(&snapshot.events))
    }

    /// [`Reconstruction::start_of`] with the events already paired (all of them, in order);
    /// the same state. Events paired otherwise (a count that is not the trace's) are paired
    /// again here.
    pub fn start_of_paired(snapshot: &Snapshot, paired: &PairedEvents) -> MemoryState {
        let events: &[Event] = &snapshot.events;
        if paired.len() != events.len() {
            return Reconstruction::start_of(snapshot);
        }
        let (mut state, _) = end_state(snapshot, &paired.pairing);
        for i in (0..events.len()).rev() {
            undo(&mut state, events, &paired.links, i);
        }
        state
    }

    /// The state after the first `pos` events as the walk back from the end had it: the state
    /// whose figures [`Reconstruction::usage`] holds, so that what it holds adds up to them
    /// (the peak's holdings to the peak). On a consistent trace it is the state a walk forwards
    /// from [`Reconstruction::start`] reaches; where the trace contradicts itself (a block
    /// freed twice, a free request repeated), walking forwards from the start can differ, so
    /// the engine hands out no forward walk.
    ///
    /// Architecture Invariant: this, [`Reconstruction::states_after`] and
    /// [`Reconstruction::block_changes_back`] are the only ways to a state at an event, and all
    /// give the walk's own states. It is undone from
    /// the nearest state the walk kept at or after `pos`, or from the end, with the events'
    /// links, found again by pairing the events before them when the walk let go of its own.
    pub fn state_walked(&self, events: &[Event], pos: usize) -> MemoryState {
        let n = events.len();
        let pos = pos.min(n);
        let above = self.checkpoints.partition_point(|(k, _)| *k < pos);
        let (from, mut state) = match self.checkpoints.get(above) {
            Some((k, state)) => (*k, state.clone()),
            None => (n, self.end.clone()),
        };
        if from == pos {
            return state;
        }
        let links = self.links_between(events, pos, from);
        for i in (pos..from).rev() {
            undo_linked(&mut state, events, links[i - pos], i);
        }
        state
    }

    /// The packed links of events `from..to` of `events`: the walk's own when it kept them,
    /// else found again by pairing the events up to `to`, from the nearest pairing the walk
    /// kept.
    fn links_between(&self, events: &[Event], from: usize, to: usize) -> Cow<'_, [u32]> {
        if self.links.len() == events.len() {
            Cow::Borrowed(&self.links[from..to])
        } else {
            // The nearest pairing kept at or before `from`, else none (the first event).
            let kept = self.pairings.partition_point(|(k, _)| *k <= from);
            let (start, mut pairing) = match kept.checked_sub(1) {
                Some(at) => (self.pairings[at].0, self.pairings[at].1.clone()),
                None => (0, Pairing::new()),
            };
            Cow::Owned(pair_links(&mut pairing, events, start, from, to))
        }
    }

    /// The walk's own state after each of the events at `after_events` (indices into the
    /// trace; others are left out), told to `visit` from the last of them to the first. These
    /// are the states whose figures [`Reconstruction::usage`] holds, so what a reader finds in
    /// them agrees with those figures even on a trace that contradicts itself (where a walk
    /// forwards from the start can differ). The walk goes back from the end only as far as
    /// the first of them, without keeping the usage, and lets go of the links behind it as
    /// [`Reconstruction::without_links`] does.
    pub fn states_after(
        snapshot: &Snapshot,
        after_events: &[u32],
        mut visit: impl FnMut(u32, &MemoryState),
    ) {
        let events: &[Event] = &snapshot.events;
        let mut wanted: Vec<u32> = after_events
            .iter()
            .copied()
            .filter(|&i| (i as usize) < events.len())
            .collect();
        wanted.sort_unstable();
        wanted.dedup();
        let Some(&first) = wanted.first() else {
            return;
        };
        let EndOfTrace { mut links, end, .. } = EndOfTrace::from_snapshot(snapshot, false);
        let mut state = end;
        let mut next = wanted.iter().rev().peekable();
        for i in (first as usize..events.len()).rev() {
            if next.next_if(|&&w| w as usize == i).is_some() {
                visit(i as u32, &state);
            }
            undo(&mut state, events, &links, i);
            if i.is_multiple_of(RELEASE_LINKS_EVERY) {
                // The walk goes backwards: the links from `i` on are done with.
                links.truncate(i);
                links.shrink_to_fit();
            }
        }
    }

    /// Undoes the events from the end as the walk did, telling `changed`, at every allocation
    /// and free from the last event to the first, its index and the block at its address in
    /// the walk's state after the event and before it. Undoing an event changes no other
    /// block, so these are every change of the walk's live blocks: what a reader that sums
    /// blocks by some key (the HTML explorer's bands by call site) needs to follow the walk's
    /// own states, which on a trace that contradicts itself a walk forwards from the start
    /// does not.
    pub fn block_changes_back(
        &self,
        events: &[Event],
        mut changed: impl FnMut(usize, Option<&LiveBlock>, Option<&LiveBlock>),
    ) {
        use vramscope_model::EventKind::{Alloc, FreeCompleted, FreeRequested};
        let n = events.len();
        let links = self.links_between(events, 0, n);
        let mut state = self.end.clone();
        for i in (0..n).rev() {
            let e = &events[i];
            let touches = matches!(e.kind, Alloc | FreeRequested | FreeCompleted);
            let after = if touches {
                state.blocks.get(e.addr).copied()
            } else {
                None
            };
            undo_linked(&mut state, events, links[i], i);
            if touches {
                changed(i, after.as_ref(), state.blocks.get(e.addr));
            }
        }
    }

    /// Allocated and reserved bytes after the first `pos` events.
    pub fn usage_at(&self, pos: usize) -> Usage {
        match pos.min(self.usage.len()).checked_sub(1) {
            Some(i) => self.usage.get(i).unwrap_or_default(),
            None => self.start.usage(),
        }
    }
}

/// Whether `e` changes reserved memory.
pub fn is_segment_event(e: &Event) -> bool {
    use vramscope_model::EventKind::*;
    matches!(
        e.kind,
        SegmentAlloc | SegmentFree | SegmentMap | SegmentUnmap
    )
}

/// Undoes event `i` of `events` on `state`, with the allocation its packed link names;
/// whether the state was the one applying the event leaves ([`MemoryState::undo_checked`]).
pub fn undo(state: &mut MemoryState, events: &[Event], links: &[u32], i: usize) -> bool {
    undo_linked(state, events, links[i], i)
}

/// [`undo`] with event `i`'s packed link `link` at hand.
fn undo_linked(state: &mut MemoryState, events: &[Event], link: u32, i: usize) -> bool {
    let link = FreeLink::unpack(link);
    let alloc = link.alloc.map(|a| (&events[a as usize], a));
    state.undo_checked(&events[i], i as u32, alloc, link.requested_before)
}

/// Pairs `events[start..upto]` on `pairing` (the pairing after the first `start` events),
/// returning the packed links ([`Pair::link`]) of those from `keep_from` on.
fn pair_links(
    pairing: &mut Pairing,
    events: &[Event],
    start: usize,
    keep_from: usize,
    upto: usize,
) -> Vec<u32> {
    let mut links = Vec::with_capacity(upto.saturating_sub(keep_from));
    for (i, e) in events.iter().enumerate().take(upto).skip(start) {
        let link = pairing.push(i as u32, e).link();
        if i >= keep_from {
            links.push(link.pack());
        }
    }
    links
}

/// What the backward walk starts from: the link of every free, the pairing after the last
/// event, the state at the end of the trace, and whether the trace says anything about
/// reserved bytes.
struct EndOfTrace {
    links: Vec<u32>,
    pairing: Pairing,
    end: MemoryState,
    reserved_known: bool,
    /// The pairings kept on the way, when asked for ([`Pairings`]).
    pairings: Vec<(usize, Pairing)>,
}

impl EndOfTrace {
    /// Pairs the frees of `snapshot` (keeping pairings on the way as [`Pairings`] chooses
    /// them when `keep_pairings`) and takes its end state from its segments (or, for a
    /// format without them, from its events and its statistics' current figures).
    fn from_snapshot(snapshot: &Snapshot, keep_pairings: bool) -> EndOfTrace {
        let events: &[Event] = &snapshot.events;
        let mut paired = PairedEvents::with_capacity(events.len());
        let mut pairings = Pairings::new(events.len());
        // Paired in stretches, a pairing offered between two of them.
        let stretch = if keep_pairings {
            pairings.gap
        } else {
            events.len().max(1)
        };
        for (n, part) in events.chunks(stretch).enumerate() {
            let first = n * stretch;
            if keep_pairings && first > 0 {
                pairings.offer(first, &paired.pairing);
            }
            for (k, e) in part.iter().enumerate() {
                paired.push((first + k) as u32, e);
            }
        }
        let PairedEvents { pairing, links, .. } = paired;
        let (end, reserved_known) = end_state(snapshot, &pairing);
        EndOfTrace {
            links,
            pairing,
            end,
            reserved_known,
            pairings: pairings.kept,
        }
    }
}

/// The pairings a walk that lets go of its links keeps on its way forwards, so that links
/// found again for a stretch of events (the walk's state at the peak, which the model view
/// asks for) pair from the nearest of them rather than from the first event. One is offered
/// every sixteenth of the trace (and at least every [`Checkpoints::MIN_GAP`] events) and kept
/// when its open allocations are at most one per [`Checkpoints::EVENTS_PER_ITEM`] events of
/// that gap: at most sixteen pairings, together no larger than the states [`Checkpoints`]
/// keeps.
struct Pairings {
    kept: Vec<(usize, Pairing)>,
    /// The events between two offers.
    gap: usize,
}

impl Pairings {
    fn new(events: usize) -> Pairings {
        Pairings {
            kept: Vec::new(),
            gap: Checkpoints::gap_for(events),
        }
    }

    /// Keeps `pairing`, the pairing after `pos` events, when it is small enough.
    fn offer(&mut self, pos: usize, pairing: &Pairing) {
        if pairing
            .open_len()
            .saturating_mul(Checkpoints::EVENTS_PER_ITEM)
            <= self.gap
        {
            self.kept.push((pos, pairing.clone()));
        }
    }
}

/// The state at the end of `snapshot`, whose events `pairing` paired, and whether the trace
/// says anything about reserved bytes: the dump-time state of its segments, each live block
/// with the allocation the trace has for it, or for a format without segments the blocks its
/// events leave and what its statistics' current figures say was there beyond them.
fn end_state(snapshot: &Snapshot, pairing: &Pairing) -> (MemoryState, bool) {
    let events: &[Event] = &snapshot.events;
    let dump_time_state = !snapshot.segments.is_empty();
    let end = if dump_time_state {
        let mut end = MemoryState::from_segments(&snapshot.segments);
        for (addr, alloc) in pairing.open_allocations() {
            if let Some(block) = end.blocks.get_mut(addr) {
                block.alloc_event = alloc;
                if block.site.is_none() {
                    block.site = events[alloc as usize].site();
                }
            }
        }
        end
    } else {
        let mut end = MemoryState::default();
        for (i, e) in events.iter().enumerate() {
            end.apply(e, i as u32);
        }
        let stats = &snapshot.stats;
        end.add_unattributed(Usage {
            allocated: stats
                .allocated_bytes
                .all
                .current
                .saturating_sub(end.allocated),
            reserved: stats
                .reserved_bytes
                .all
                .current
                .saturating_sub(end.reserved),
        });
        end
    };
    let reserved_known = dump_time_state
        || snapshot.stats.reserved_bytes.all.current > 0
        || snapshot.stats.reserved_bytes.all.peak > 0
        || events.iter().any(is_segment_event);
    (end, reserved_known)
}

/// A trace's events paired in order as the engine's walk pairs them (`Pairing`), with the
/// link of each ([`Pair::link`], packed): what a caller that pairs the trace anyway (the
/// replay's block sizing) hands to [`Reconstruction::start_of_paired`], so that the walk to
/// the start does not pair it again.
#[derive(Clone, Debug, Default)]
pub struct PairedEvents {
    pairing: Pairing,
    links: Vec<u32>,
    /// The free requests that repeated one already made for the same block (they end no
    /// allocation), in increasing order: the one thing about a pair that its packed link does
    /// not say ([`PairedEvents::pair_at`]). A consistent trace has none.
    repeated_requests: Vec<u32>,
}

impl PairedEvents {
    /// Nothing paired yet, with room for `events` links.
    pub fn with_capacity(events: usize) -> PairedEvents {
        PairedEvents {
            pairing: Pairing::new(),
            links: Vec::with_capacity(events),
            repeated_requests: Vec::new(),
        }
    }

    /// Every event of `events` paired, in order.
    pub fn pair(events: &[Event]) -> PairedEvents {
        let mut paired = PairedEvents::with_capacity(events.len());
        for (i, e) in events.iter().enumerate() {
            paired.push(i as u32, e);
        }
        paired
    }

    /// Pairs `e`, the event at `index`, which must be the next one of the trace.
    #[inline]
    pub fn push(&mut self, index: u32, e: &Event) -> Pair {
        debug_assert_eq!(
            index as usize,
            self.links.len(),
            "events are paired in order"
        );
        let pair = self.pairing.push(index, e);
        let link = pair.link();
        self.links.push(link.pack());
        if !link.ends_allocation && e.kind == EventKind::FreeRequested {
            self.repeated_requests.push(index);
        }
        pair
    }

    /// What pairing found for event `index` (of kind `kind`), as [`PairedEvents::push`]
    /// returned it, without pairing again: a caller that walks the paired events once more
    /// (the block sizing's last pass) reads each pair here. `kind_of(j)` is the kind of event
    /// `j`, which tells the allocation a lost free replaced from the free request that
    /// described a block from before the trace.
    #[inline]
    pub fn pair_at(
        &self,
        index: u32,
        kind: EventKind,
        kind_of: impl FnOnce(u32) -> EventKind,
    ) -> Pair {
        let link = FreeLink::unpack(self.links[index as usize]);
        match kind {
            EventKind::Alloc => {
                let (replaced, replaced_request) = match link.alloc {
                    Some(event) if kind_of(event) == EventKind::Alloc => (Some(event), None),
                    Some(event) => (None, Some(event)),
                    None => (None, None),
                };
                Pair::Alloc {
                    replaced,
                    replaced_requested: link.requested_before,
                    replaced_request,
                }
            }
            EventKind::FreeRequested => Pair::Free(FreeLink {
                ends_allocation: self.repeated_requests.binary_search(&index).is_err(),
                ..link
            }),
            EventKind::FreeCompleted => Pair::Free(FreeLink {
                ends_allocation: !link.requested_before,
                ..link
            }),
            _ => Pair::Other,
        }
    }

    /// How many events were paired.
    pub fn len(&self) -> usize {
        self.links.len()
    }

    /// The pairing after the last event paired (its open allocations, its lost frees).
    pub fn pairing(&self) -> &Pairing {
        &self.pairing
    }

    /// Whether none were.
    pub fn is_empty(&self) -> bool {
        self.links.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The state after the first `pos` events, walked forwards from the walk's start: what a
    /// forward walk (the dashboard's) reaches, which the tests compare with the walk's own.
    fn forwards(walk: &Reconstruction, events: &[Event], pos: usize) -> MemoryState {
        let mut state = walk.start.clone();
        for (i, e) in events.iter().enumerate().take(pos) {
            state.apply(e, i as u32);
        }
        state
    }
    use crate::state::tests::ev as event;
    use vramscope_model::EventKind;

    /// Allocations that overlap in time, each freed (requested, then completed) a few events
    /// later, some from before the trace: every kind of link the walk undoes.
    fn trace() -> Snapshot {
        let mut snapshot = Snapshot::empty(Default::default(), Default::default());
        for k in 0..60u64 {
            let addr = 0x1000 * (k % 9);
            if k % 3 != 0 {
                snapshot
                    .events
                    .push(event(EventKind::Alloc, addr, 512 * (k + 1)));
            }
            snapshot
                .events
                .push(event(EventKind::FreeRequested, addr, 512 * (k + 1)));
            snapshot
                .events
                .push(event(EventKind::FreeCompleted, addr, 512 * (k + 1)));
        }
        for (i, e) in snapshot.events.iter_mut().enumerate() {
            e.seq = i as u64;
        }
        snapshot
    }

    /// An allocation over a block the trace had not freed (a lost free) replaces it going
    /// forwards, and undoing it brings the block back going backwards, pending or not: the
    /// two directions agree at every position.
    #[test]
    fn a_lost_free_is_undone_as_it_was_applied() {
        for pending in [false, true] {
            let mut snapshot = Snapshot::empty(Default::default(), Default::default());
            snapshot.events.push(event(EventKind::Alloc, 0x1000, 512));
            if pending {
                snapshot
                    .events
                    .push(event(EventKind::FreeRequested, 0x1000, 512));
            }
            snapshot.events.push(event(EventKind::Alloc, 0x1000, 2048));
            snapshot.events.push(event(EventKind::Alloc, 0x9000, 1024));
            snapshot.events.push(event(EventKind::Alloc, 0x1000, 4096));
            snapshot
                .events
                .push(event(EventKind::FreeRequested, 0x9000, 1024));
            let walk = Reconstruction::from_snapshot(&snapshot);
            assert_eq!(
                walk.start.allocated, 0,
                "pending {pending}: nothing before the trace"
            );
            for pos in 0..=snapshot.events.len() {
                let forwards = forwards(&walk, &snapshot.events, pos);
                assert_eq!(
                    forwards.usage(),
                    walk.usage_at(pos),
                    "pending {pending}, position {pos}"
                );
            }
            let mut pairing = Pairing::new();
            for (i, e) in snapshot.events.iter().enumerate() {
                pairing.push(i as u32, e);
            }
            assert_eq!(pairing.lost_frees(), 2, "pending {pending}");
        }
    }

    /// A block from before the trace whose free was requested in it and never completed,
    /// then allocated over, is brought back by undoing the allocation, pending, as it was
    /// before it: the states walked backwards are those walked forwards at every position.
    #[test]
    fn a_lost_free_of_a_block_from_before_the_trace_is_undone_as_it_was_applied() {
        let mut snapshot = Snapshot::empty(Default::default(), Default::default());
        snapshot
            .events
            .push(event(EventKind::FreeRequested, 0x1000, 512));
        snapshot.events.push(event(EventKind::Alloc, 0x1000, 2048));
        snapshot.events.push(event(EventKind::Alloc, 0x9000, 1024));
        snapshot
            .events
            .push(event(EventKind::FreeRequested, 0x1000, 2048));
        snapshot
            .events
            .push(event(EventKind::FreeCompleted, 0x1000, 2048));
        let mut backwards = Vec::new();
        let walk = Reconstruction::new(&snapshot, 1, &mut |pos, state| {
            backwards.push((pos, state.clone()));
        });
        assert_eq!(backwards.len(), snapshot.events.len() - 1);
        for (pos, state) in &backwards {
            assert_eq!(
                &forwards(&walk, &snapshot.events, *pos),
                state,
                "position {pos}"
            );
        }
        let pending = forwards(&walk, &snapshot.events, 1);
        let block = pending.blocks.get(0x1000).unwrap();
        assert!(block.pending && block.predates_trace());
        let lean = Reconstruction::without_links(&snapshot);
        assert_eq!(lean.start, walk.start);
        let mut pairing = Pairing::new();
        for (i, e) in snapshot.events.iter().enumerate() {
            pairing.push(i as u32, e);
        }
        assert_eq!(pairing.lost_frees(), 1);
    }

    /// Letting go of the links behind the walk, however often, changes nothing it finds.
    #[test]
    fn a_walk_that_lets_go_of_its_links_finds_the_same() {
        let snapshot = trace();
        let kept = Reconstruction::from_snapshot(&snapshot);
        assert_eq!(kept.links.len(), snapshot.events.len());
        for every in [1, 7, 64, 1 << 20] {
            let (lean, _) = Reconstruction::walk(&snapshot, 0, &mut |_, _, _| {}, Some(every));
            assert!(lean.links.is_empty(), "every {every}");
            assert_eq!(lean.start, kept.start, "every {every}");
            assert_eq!(lean.end, kept.end, "every {every}");
            assert_eq!(lean.usage, kept.usage, "every {every}");
            assert_eq!(lean.peak_allocated, kept.peak_allocated, "every {every}");
        }
        assert!(
            kept.start.allocated > 0,
            "the trace frees blocks from before it"
        );
    }

    /// 60,000 events cycling through `addresses` addresses and the `kinds` (0 an allocation,
    /// 1 a free request, 2 a completed free), of `size(k)` bytes for the `k`-th: long enough
    /// for the lean walk to keep a few states.
    fn cycling_trace(addresses: u64, kinds: &[u8], size: impl Fn(u64) -> u64) -> Snapshot {
        let mut snapshot = Snapshot::empty(Default::default(), Default::default());
        for k in 0..60_000u64 {
            let addr = 0x10_0000 + 0x1000 * (k % addresses);
            let kind = match kinds[(k % kinds.len() as u64) as usize] {
                0 => EventKind::Alloc,
                1 => EventKind::FreeRequested,
                _ => EventKind::FreeCompleted,
            };
            snapshot.events.push(event(kind, addr, size(k)));
        }
        snapshot
    }

    /// The walk's own state at any event, from the states the lean walk keeps and the links
    /// it finds again, is the one the full walk has there, on a trace with blocks from before
    /// it; and the lean walk keeps one state at most.
    #[test]
    fn the_states_kept_on_the_way_back_give_the_walks_state_at_any_event() {
        let snapshot = cycling_trace(37, &[0, 1, 2], |k| 512 * (1 + k % 11));
        let every = 997;
        let mut backwards = Vec::new();
        let full = Reconstruction::new(&snapshot, every, &mut |pos, state| {
            backwards.push((pos, state.clone()));
        });
        let lean = Reconstruction::without_links(&snapshot);
        assert!(
            lean.checkpoints.len() <= 1,
            "{} states kept",
            lean.checkpoints.len()
        );
        let kept = Reconstruction::with_states(&snapshot).checkpoints.len();
        assert!((2..=16).contains(&kept), "{kept} states kept");
        assert!(full.checkpoints.is_empty());
        // The links found again start from the pairings the lean walk kept.
        assert_eq!(
            lean.pairings.iter().map(|(k, _)| *k).collect::<Vec<_>>(),
            [16_384, 32_768, 49_152]
        );
        assert!(full.pairings.is_empty());
        for (pos, state) in &backwards {
            assert_eq!(&lean.state_walked(&snapshot.events, *pos), state, "{pos}");
            assert_eq!(&full.state_walked(&snapshot.events, *pos), state, "{pos}");
        }
        let n = snapshot.events.len();
        let mut positions = vec![0, 1, n - 1, n];
        for (k, _) in &lean.checkpoints {
            positions.extend([k - 1, *k, k + 1]);
        }
        for (k, _) in &lean.pairings {
            positions.extend([k - 1, *k, k + 1]);
        }
        for pos in positions {
            let walked = lean.state_walked(&snapshot.events, pos);
            assert_eq!(walked, full.state_walked(&snapshot.events, pos), "{pos}");
            // A consistent trace: forwards from the start gives the same.
            assert_eq!(walked, forwards(&full, &snapshot.events, pos), "{pos}");
        }
        assert_eq!(lean.state_walked(&snapshot.events, 0), lean.start);
        assert_eq!(lean.state_walked(&snapshot.events, n), lean.end);
    }

    /// The lean walk keeps only the state the walk to the peak of allocated bytes starts from:
    /// the one the walk keeping every state would start it from, wherever the peak falls
    /// (after the last state kept, the end serves and none is kept), and the earliest of equal
    /// stretches, as the peak is the first event to reach its bytes.
    #[test]
    fn the_lean_walk_keeps_the_state_the_peak_is_walked_from() {
        for large_at in [4_998u64, 19_998, 39_999, 54_999] {
            // With `again`, a second large block 189 periods of the trace's cycle (111
            // events) later: the same bytes again, exactly.
            for again in [None, Some(large_at + 111 * 189)] {
                let large = |k: u64| k == large_at || Some(k) == again;
                let size = |k: u64| if large(k) { 512 << 16 } else { 512 };
                let snapshot = cycling_trace(37, &[0, 1, 2], size);
                let full = Reconstruction::with_states(&snapshot);
                let lean = Reconstruction::without_links(&snapshot);
                let peak = lean.peak_allocated.event.expect("a peak") as usize;
                assert!(
                    (large_at as usize..large_at as usize + 111).contains(&peak),
                    "{large_at}: {peak}"
                );
                assert!(lean.checkpoints.len() <= 1, "{large_at}");
                let at = peak + 1;
                let from = |walk: &Reconstruction| {
                    walk.checkpoints.iter().map(|(k, _)| *k).find(|&k| k >= at)
                };
                assert_eq!(from(&lean), from(&full), "{large_at} {again:?}");
                assert_eq!(
                    lean.state_walked(&snapshot.events, at),
                    full.state_walked(&snapshot.events, at)
                );
            }
        }
    }

    /// On a trace that contradicts itself (blocks freed twice, free requests repeated), the
    /// walk's own state at every event adds up to the usage the walk found there, wherever
    /// the kept states fall, while the walk forwards from the start does not.
    #[test]
    fn the_walks_state_adds_up_to_its_usage_on_a_trace_that_contradicts_itself() {
        let snapshot = cycling_trace(13, &[0, 1, 1, 2, 2], |_| 512);
        let lean = Reconstruction::without_links(&snapshot);
        assert!(lean.checkpoints.len() <= 1);
        let n = snapshot.events.len();
        let mut forwards_differ = false;
        for pos in (0..=n).step_by(211).chain([n]) {
            let walked = lean.state_walked(&snapshot.events, pos);
            assert_eq!(walked.usage(), lean.usage_at(pos), "{pos}");
            forwards_differ |= forwards(&lean, &snapshot.events, pos).usage() != walked.usage();
        }
        assert!(forwards_differ, "the trace does contradict itself");
    }

    /// The states after the events asked for, in any order, with repeats and indices past
    /// the end, are the walk's own states there, told once each from the last to the first,
    /// on a consistent trace and on one that contradicts itself.
    #[test]
    fn the_states_after_events_are_the_walks_own() {
        for snapshot in [trace(), cycling_trace(13, &[0, 1, 1, 2, 2], |_| 512)] {
            let n = snapshot.events.len() as u32;
            let walk = Reconstruction::with_states(&snapshot);
            let asked = [n / 2, 3, n - 1, n / 2, n + 5, 0, n / 3];
            let mut told = Vec::new();
            Reconstruction::states_after(&snapshot, &asked, |i, state| {
                assert_eq!(
                    *state,
                    walk.state_walked(&snapshot.events, i as usize + 1),
                    "{i}"
                );
                told.push(i);
            });
            assert_eq!(told, [n - 1, n / 2, n / 3, 3, 0]);
        }
    }

    /// The block changes told from the end, each applied to the blocks of the walk's state
    /// after its event, give the walk's own state before it, on a consistent trace and on one
    /// that contradicts itself, whether or not the walk kept its links.
    #[test]
    fn the_block_changes_back_lead_through_the_walks_own_states() {
        use rustc_hash::FxHashMap;
        for snapshot in [trace(), cycling_trace(13, &[0, 1, 1, 2, 2], |_| 512)] {
            let events: &[Event] = &snapshot.events;
            let n = events.len();
            for walk in [
                Reconstruction::from_snapshot(&snapshot),
                Reconstruction::without_links(&snapshot),
            ] {
                let blocks_at = |pos: usize| -> FxHashMap<u64, LiveBlock> {
                    let state = walk.state_walked(events, pos);
                    state.blocks.unordered().map(|(&a, &b)| (a, b)).collect()
                };
                let mut blocks = blocks_at(n);
                let mut told = Vec::new();
                walk.block_changes_back(events, |i, after, before| {
                    assert_eq!(blocks.get(&events[i].addr), after, "event {i}");
                    match before {
                        Some(&b) => blocks.insert(events[i].addr, b),
                        None => blocks.remove(&events[i].addr),
                    };
                    if i % 401 == 0 {
                        assert_eq!(blocks, blocks_at(i), "before event {i}");
                    }
                    told.push(i);
                });
                assert_eq!(blocks, blocks_at(0));
                assert_eq!(
                    blocks_at(0),
                    walk.start
                        .blocks
                        .unordered()
                        .map(|(&a, &b)| (a, b))
                        .collect()
                );
                assert!(told.windows(2).all(|w| w[0] > w[1]));
                let block_events = events
                    .iter()
                    .filter(|e| {
                        matches!(
                            e.kind,
                            EventKind::Alloc | EventKind::FreeRequested | EventKind::FreeCompleted
                        )
                    })
                    .count();
                assert_eq!(told.len(), block_events);
            }
        }
    }

    /// The walk to the start with the events paired by the caller (as the replay's sizing
    /// pairs them) reaches the state the walk that pairs them itself reaches, on a trace with
    /// every kind of link and on one that contradicts itself; pairs of another trace are not
    /// taken.
    #[test]
    fn the_start_from_events_paired_elsewhere_is_the_walks_own() {
        for snapshot in [trace(), cycling_trace(13, &[0, 1, 1, 2, 2], |_| 512)] {
            let paired = PairedEvents::pair(&snapshot.events);
            // The full walk's start, which pairs the events itself.
            let own = Reconstruction::from_snapshot(&snapshot).start;
            assert!(!own.blocks.is_empty());
            assert_eq!(Reconstruction::start_of_paired(&snapshot, &paired), own);
            assert_eq!(Reconstruction::start_of(&snapshot), own);
            let mut short = PairedEvents::with_capacity(1);
            short.push(0, &snapshot.events[0]);
            assert_eq!(Reconstruction::start_of_paired(&snapshot, &short), own);
        }
    }

    /// The pair read back for every event ([`PairedEvents::pair_at`]) is the one pairing found
    /// for it, on traces with every kind of pair: allocations over blocks not freed (pending
    /// or not, from the trace or from before it), frees of blocks from before the trace, and
    /// free requests repeated for one block.
    #[test]
    fn every_pair_read_back_is_the_one_pairing_found() {
        let mut repeated = Snapshot::empty(Default::default(), Default::default());
        for kind in [
            EventKind::FreeRequested,
            EventKind::FreeRequested,
            EventKind::Alloc,
            EventKind::FreeRequested,
            EventKind::FreeRequested,
            EventKind::FreeCompleted,
            EventKind::FreeCompleted,
            EventKind::Alloc,
            EventKind::Alloc,
            EventKind::SegmentAlloc,
        ] {
            repeated.events.push(event(kind, 0x1000, 512));
        }
        let traces = [
            repeated,
            trace(),
            cycling_trace(13, &[0, 1, 1, 2, 2], |_| 512),
            cycling_trace(5, &[0, 0, 1, 2], |k| 512 * (1 + k % 3)),
            cycling_trace(7, &[1, 0, 1, 0, 2, 1, 2], |_| 512),
        ];
        for (n, snapshot) in traces.iter().enumerate() {
            let events: &[Event] = &snapshot.events;
            let mut paired = PairedEvents::with_capacity(events.len());
            let found: Vec<Pair> = events
                .iter()
                .enumerate()
                .map(|(i, e)| paired.push(i as u32, e))
                .collect();
            for (i, e) in events.iter().enumerate() {
                let read = paired.pair_at(i as u32, e.kind, |j| events[j as usize].kind);
                assert_eq!(read, found[i], "trace {n}, event {i}");
            }
            let kinds = |pair: &Pair| match pair {
                Pair::Alloc {
                    replaced,
                    replaced_request,
                    ..
                } => (replaced.is_some(), replaced_request.is_some(), false),
                Pair::Free(link) => (false, false, !link.ends_allocation),
                Pair::Other => (false, false, false),
            };
            if n == 0 {
                // The first trace holds a lost free of each kind and repeated requests.
                let seen = found.iter().map(kinds).fold((false, false, false), |a, b| {
                    (a.0 || b.0, a.1 || b.1, a.2 || b.2)
                });
                assert_eq!(seen, (true, true, true));
            }
        }
    }

    /// Every event the walk back did not note as a disagreement is one that applying to the
    /// walk's state before it gives the walk's state after it, so that stepping forwards over
    /// such events keeps to the walk's states; a consistent trace has none noted, and one that
    /// frees blocks twice has some.
    #[test]
    fn forwards_agrees_with_the_walk_wherever_no_disagreement_is_noted() {
        // Blocks from before the trace freed in it, a segment made and released, and blocks
        // allocated and freed at their own addresses: a consistent trace.
        let mut consistent = Snapshot::empty(Default::default(), Default::default());
        let mut push = |kind, addr, size| consistent.events.push(event(kind, addr, size));
        push(EventKind::SegmentAlloc, 0x100_0000, 1 << 20);
        for k in 0..200u64 {
            let addr = 0x1000 * (k % 9);
            push(EventKind::Alloc, addr, 512 * (k + 1));
            if k % 4 == 0 {
                push(EventKind::FreeRequested, 0x20_0000 + 0x1000 * k, 1024);
                push(EventKind::FreeCompleted, 0x20_0000 + 0x1000 * k, 1024);
            }
            push(EventKind::FreeRequested, addr, 512 * (k + 1));
            push(EventKind::FreeCompleted, addr, 512 * (k + 1));
        }
        push(EventKind::SegmentFree, 0x100_0000, 1 << 20);
        let cases = [
            (consistent, false),
            // Frees of blocks at addresses the trace freed already.
            (trace(), true),
            (cycling_trace(7, &[0, 1, 2], |k| 512 * (1 + k % 5)), false),
            (cycling_trace(13, &[0, 1, 1, 2, 2], |_| 512), true),
            // Allocations over blocks not freed yet (lost frees): both ways agree by design.
            (
                cycling_trace(5, &[0, 0, 1, 2], |k| 512 * (1 + k % 3)),
                false,
            ),
        ];
        for (n, (mut snapshot, contradicts)) in cases.into_iter().enumerate() {
            snapshot.events.truncate(3_000);
            let events: &[Event] = &snapshot.events;
            let walk = Reconstruction::from_snapshot(&snapshot);
            // The walk's state after every position, found the way the walk finds them.
            let mut states = vec![walk.end.clone()];
            let mut state = walk.end.clone();
            for i in (0..events.len()).rev() {
                undo(&mut state, events, &walk.links, i);
                states.push(state.clone());
            }
            states.reverse();
            assert_eq!(states[0], walk.start, "case {n}");
            let mut noted = 0;
            for i in 0..events.len() {
                if walk.disagreements.none_in(i, i + 1) {
                    let mut forwards = states[i].clone();
                    forwards.apply(&events[i], i as u32);
                    assert_eq!(forwards, states[i + 1], "case {n}, event {i}");
                } else {
                    noted += 1;
                }
            }
            assert_eq!(noted > 0, contradicts, "case {n}: {noted} noted");
            assert_eq!(walk.disagreements.is_empty(), !contradicts, "case {n}");
        }
    }
}
