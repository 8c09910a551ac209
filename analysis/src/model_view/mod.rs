//! A precomputed analysis view of one [`Snapshot`], built once and shared by every detector,
//! the reports and the diff.
//!
//! The snapshot itself is a flat list of events plus the segments at the end. Most questions the
//! detectors ask ("which allocations of this call site were still live at the end?", "how many
//! tiny device-to-host copies did this site make in step 7?", "how much was allocated and
//! reserved when the OOM happened?") need the same reconstruction: allocations paired with their
//! frees (live intervals), call sites grouped by `file:line`, tallies per step and per group, and
//! a timeline of allocated and reserved bytes. [`ModelView::new`] does all of that in one pass
//! over the events (a few milliseconds for the ~23k-event traces in `shared/traces`), so that
//! `crate::detect` can stay a set of small pure functions. `crate::report` draws its timeline and
//! top sites from the same view, and `crate::diff` compares the live-at-end holdings of two views.
//!
//! Imported traces are often incomplete: a PyTorch trace may start after the process allocated,
//! so frees without a matching allocation are counted and otherwise ignored, and the timeline is
//! lifted by a baseline inferred from the segments at the end. Nothing here fails on odd input.
//!
//! This file holds the view's data types and its queries. The one pass lives in `build`, whose
//! `ModelViewBuilder` owns every accumulator and is fed the events one by one; `steps` decides
//! how events are numbered into steps (the trace's marks, an inferred loop, or a
//! `--step-marker` applied afterwards); `holdings` sums blocks into per-group [`Holding`]s; and
//! `stacks` finds the user's own frames in a call stack.

mod build;
mod holdings;
mod stacks;
mod steps;

pub(crate) use stacks::default_framework_paths;
pub use stacks::{common_caller, is_module_call, kept_line, KeptLine};
pub use steps::{
    apply_step_marker, record_inferred_steps, restep, step_marker_candidates, step_source_of,
    StepMarkerError, StepSource,
};

use vramscope_engine::{
    name_call_site, Disagreements, EmptyCacheCall, GroupId, LiveBlock, MemoryState, Reconstruction,
    Runs, SiteGroup, SiteGroups, SiteName, Usage, UsageSeries, NO_EVENT,
};
use vramscope_model::{CategoryBytes, Event, Id, SiteId, Snapshot};

use crate::categories::Categories;

use build::ModelViewBuilder;
pub use holdings::{holdings_of, HoldingSums};

/// One allocation paired with its free, if the trace has one. Its allocation event holds its
/// size, requested bytes, device and address ([`ModelView::interval_size`] reads them): a
/// view keeps an interval for every allocation, millions in a big trace.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Interval {
    /// Call-site group of the allocation.
    pub group: GroupId,
    /// Index of the `Alloc` event in [`Snapshot::events`].
    pub alloc_event: u32,
    /// Index of the first free event of the block, `None` when it is live at the end
    /// ([`Interval::free_event`] reads it; four bytes, as a big trace keeps millions).
    pub free_event: Option<Id>,
    /// Step index (into [`ModelView::steps`]) of the allocation. The free's is that of its
    /// event ([`ModelView::free_step`]): kept here it was four bytes more an allocation.
    pub alloc_step: u32,
}

impl Interval {
    /// Its allocation event in `events` (the snapshot's), which holds its size, requested
    /// bytes, device and address.
    pub fn alloc<'e>(&self, events: &'e [Event]) -> &'e Event {
        &events[self.alloc_event as usize]
    }

    /// Index of the first free event of the block, `None` when it is live at the end.
    pub fn free_event(&self) -> Option<u32> {
        self.free_event.map(Id::get)
    }

    /// Whether the block is still allocated at the end of the trace.
    pub fn is_live_at_end(&self) -> bool {
        self.free_event.is_none()
    }
}

/// What happened in one step, for one group or for the whole trace.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StepTally {
    /// Allocations made.
    pub allocs: u64,
    /// Bytes allocated (block sizes).
    pub alloc_bytes: u64,
    /// Frees of allocations the trace saw.
    pub frees: u64,
    /// Bytes freed by those frees.
    pub free_bytes: u64,
    /// Allocations made in this step that are still live at the end of the trace.
    pub retained: u64,
    /// Bytes of those allocations.
    pub retained_bytes: u64,
    /// Host-to-device copies.
    pub h2d: u64,
    /// Bytes copied host to device.
    pub h2d_bytes: u64,
    /// Device-to-host copies.
    pub d2h: u64,
    /// Bytes copied device to host.
    pub d2h_bytes: u64,
    /// Device-to-device copies.
    pub d2d: u64,
    /// Bytes copied device to device.
    pub d2d_bytes: u64,
    /// Explicit host waits (`Sync` events).
    pub syncs: u64,
    /// `empty_cache()` calls.
    pub empty_cache: u64,
    /// Raw device allocations (new segments or mapped pages).
    pub segment_allocs: u64,
    /// Bytes of those raw allocations.
    pub segment_alloc_bytes: u64,
    /// Raw device frees (released segments or unmapped pages).
    pub segment_frees: u64,
    /// Bytes of those raw frees.
    pub segment_free_bytes: u64,
    /// Failed allocations.
    pub ooms: u64,
}

impl StepTally {
    fn add(&mut self, other: &StepTally) {
        self.allocs = self.allocs.saturating_add(other.allocs);
        self.alloc_bytes = self.alloc_bytes.saturating_add(other.alloc_bytes);
        self.frees = self.frees.saturating_add(other.frees);
        self.free_bytes = self.free_bytes.saturating_add(other.free_bytes);
        self.retained = self.retained.saturating_add(other.retained);
        self.retained_bytes = self.retained_bytes.saturating_add(other.retained_bytes);
        self.h2d = self.h2d.saturating_add(other.h2d);
        self.h2d_bytes = self.h2d_bytes.saturating_add(other.h2d_bytes);
        self.d2h = self.d2h.saturating_add(other.d2h);
        self.d2h_bytes = self.d2h_bytes.saturating_add(other.d2h_bytes);
        self.d2d = self.d2d.saturating_add(other.d2d);
        self.d2d_bytes = self.d2d_bytes.saturating_add(other.d2d_bytes);
        self.syncs = self.syncs.saturating_add(other.syncs);
        self.empty_cache = self.empty_cache.saturating_add(other.empty_cache);
        self.segment_allocs = self.segment_allocs.saturating_add(other.segment_allocs);
        self.segment_alloc_bytes = self
            .segment_alloc_bytes
            .saturating_add(other.segment_alloc_bytes);
        self.segment_frees = self.segment_frees.saturating_add(other.segment_frees);
        self.segment_free_bytes = self
            .segment_free_bytes
            .saturating_add(other.segment_free_bytes);
        self.ooms = self.ooms.saturating_add(other.ooms);
    }
}

/// One step of the trace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StepInfo {
    /// Step number (0 is everything before the first mark).
    pub step: u64,
    /// Index of the first event of the step, if the trace has one.
    pub first_event: Option<u32>,
    /// Label of the step mark (`"mark_step"`, a profiler slice name), or empty.
    pub label: String,
}

/// Allocated and reserved bytes just after one event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TimelinePoint {
    /// Index of the event in [`Snapshot::events`], which holds its sequence number and time;
    /// its step is `view.step_number(view.event_step(event))` ([`ModelView::event_step`]; the
    /// point copies neither: a 10M-event trace has millions of points).
    pub event: u32,
    /// Bytes allocated to the program, including the inferred baseline.
    pub allocated: u64,
    /// Bytes reserved from the device, including the inferred baseline (0 when unknown).
    pub reserved: u64,
}

/// What one group holds at one moment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Holding {
    /// The group.
    pub group: GroupId,
    /// Bytes held (block sizes).
    pub bytes: u64,
    /// Blocks held.
    pub blocks: u64,
    /// Bytes the program asked for in those blocks.
    pub requested: u64,
    /// Lowest step number at which one of the blocks was allocated.
    pub first_step: u64,
    /// Highest step number at which one of the blocks was allocated.
    pub last_step: u64,
}

/// Figures about the segments at the time of the snapshot.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SegmentSummary {
    /// Number of segments.
    pub segments: u64,
    /// Bytes reserved in segments.
    pub reserved: u64,
    /// Bytes in allocated blocks.
    pub allocated: u64,
    /// Bytes in allocated or pending-free blocks.
    pub active: u64,
    /// Free bytes inside segments that also hold an active block (cannot be released).
    pub inactive_split_bytes: u64,
    /// Free blocks inside segments that also hold an active block.
    pub inactive_split_blocks: u64,
    /// Free bytes in segments with no active block (`empty_cache()` would release them).
    pub releasable_bytes: u64,
    /// The largest free block in any segment.
    pub largest_free_block: u64,
    /// The largest segment.
    pub largest_segment: u64,
}

/// Totals over the whole trace.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TraceTotals {
    /// Events in the trace.
    pub events: u64,
    /// `Alloc` events.
    pub allocs: u64,
    /// Frees matched to an allocation in the trace.
    pub frees: u64,
    /// Frees whose allocation is not in the trace (allocated before recording began).
    pub unmatched_frees: u64,
    /// Bytes of those unmatched frees.
    pub unmatched_free_bytes: u64,
    /// Allocations at an address whose block the trace had not freed (its free not
    /// completed): frees the trace lost, as the engine's `Pairing::lost_frees` counts them.
    pub lost_frees: u64,
    /// Host-to-device bytes copied.
    pub h2d_bytes: u64,
    /// Device-to-host bytes copied.
    pub d2h_bytes: u64,
    /// Transfers of any direction.
    pub transfers: u64,
    /// `Sync` events.
    pub syncs: u64,
    /// Raw device allocations.
    pub segment_allocs: u64,
    /// Raw device frees.
    pub segment_frees: u64,
    /// `empty_cache()` calls.
    pub empty_cache: u64,
    /// Failed allocations.
    pub ooms: u64,
}

/// The step index of event `event` in `runs` (the last event's past the end; 0 when there is
/// none).
fn step_of_event(runs: &Runs<u32>, event: u32) -> u32 {
    runs.get(event as usize).or(runs.last()).unwrap_or(0)
}

/// Indices listed by call-site group, in one flat list: each group's indices, in the order
/// they were given, lie together, and `starts` says where each group's begin. A big trace has
/// millions of allocations; a list of its own per group grew each by doubling (up to twice the
/// indices, plus a header per group), where this holds four bytes an index and a group.
#[derive(Clone, Debug, Default)]
pub(crate) struct ByGroup {
    /// Where each group's indices begin in `items`, by group id, and the end of the last.
    starts: Vec<u32>,
    /// The indices, group after group.
    items: Vec<u32>,
}

impl ByGroup {
    /// The indices of `entries` (each `(group, index)`, in order) by group, for `groups`
    /// groups: `entries` is walked twice, once to count each group's indices and once to place
    /// them. A group id at or past `groups` is a fault of the caller (a panic).
    pub(crate) fn new<I>(groups: usize, entries: impl Fn() -> I) -> ByGroup
    where
        I: Iterator<Item = (GroupId, u32)>,
    {
        let mut starts = vec![0u32; groups + 1];
        for (group, _) in entries() {
            starts[group as usize + 1] += 1;
        }
        for g in 0..groups {
            starts[g + 1] += starts[g];
        }
        let mut next = starts.clone();
        let mut items = vec![0u32; starts[groups] as usize];
        for (group, index) in entries() {
            let at = &mut next[group as usize];
            items[*at as usize] = index;
            *at += 1;
        }
        ByGroup { starts, items }
    }

    /// The indices of `group`, in the order they were given; none for a group it does not
    /// have.
    pub(crate) fn of(&self, group: GroupId) -> &[u32] {
        let g = group as usize;
        match (self.starts.get(g), self.starts.get(g + 1)) {
            (Some(&a), Some(&b)) => &self.items[a as usize..b as usize],
            _ => &[],
        }
    }
}

/// The analysis view of one snapshot. See the module documentation.
#[derive(Clone, Debug)]
pub struct ModelView<'a> {
    snapshot: &'a Snapshot,
    groups: SiteGroups,
    intervals: Vec<Interval>,
    group_intervals: ByGroup,
    group_events: ByGroup,
    steps: Vec<StepInfo>,
    /// The step index of every event, as runs: events come a step at a time, so a trace of
    /// millions of events has as many runs as steps (a list of every event's step index was
    /// four bytes an event).
    event_step: Runs<u32>,
    step_totals: Vec<StepTally>,
    group_steps: Vec<Vec<(u32, StepTally)>>,
    /// Allocated and reserved bytes after every event: the engine's walk's own series, kept
    /// rather than copied into points (the timeline is read from it).
    usage: UsageSeries,
    /// The usage before the first event, as the walk has it (reserved bytes even when unknown,
    /// which the baseline accessors report as 0).
    start_usage: Usage,
    reserved_known: bool,
    peak_allocated: u64,
    peak_allocated_event: Option<u32>,
    peak_reserved: u64,
    peak_reserved_event: Option<u32>,
    end_allocated: u64,
    end_reserved: u64,
    totals: TraceTotals,
    ooms: Vec<u32>,
    live_end: Vec<Holding>,
    live_peak: Vec<Holding>,
    segments: SegmentSummary,
    step_source: StepSource,
    empty_cache_calls: Vec<EmptyCacheCall>,
    /// What every allocation is made of (`crate::categories`).
    categories: Categories,
    /// The engine's state before the first event, where a walk of the categories starts.
    start: MemoryState,
    /// Where a walk forwards from `start` would part from the engine's states.
    disagreements: Disagreements,
    /// Bytes per category at the peak of allocated bytes and at the end, from the engine's
    /// own states there: they add up to [`ModelView::peak_allocated`] and
    /// [`ModelView::end_allocated`].
    categories_at_peak: CategoryBytes,
    categories_at_end: CategoryBytes,
    /// The same per call-site group: what each [`Holding`] of `live_peak` and `live_end` is
    /// made of.
    group_categories_at_peak: rustc_hash::FxHashMap<GroupId, CategoryBytes>,
    group_categories_at_end: rustc_hash::FxHashMap<GroupId, CategoryBytes>,
}

impl<'a> ModelView<'a> {
    /// Builds the view of `snapshot`: one walk of the engine (`crate::engine`) for the state at
    /// every event and one pass over the events for pairing, groups and tallies. The two do not
    /// depend on each other, so the walk runs on a second thread while this one makes the pass.
    pub fn new(snapshot: &'a Snapshot) -> ModelView<'a> {
        Self::with_plan(snapshot, steps::StepPlan::from_snapshot(snapshot))
    }

    /// The view of a part of a trace (the events before a dashboard's cursor) that numbers
    /// steps as the whole trace does: `whole` is the whole trace's [`step_source_of`]. The part
    /// alone could show a loop the whole does not have (a prefix that ends inside a step shows
    /// the model's layers repeating) or marks that cover it where the whole's cover only a
    /// warm-up; with the whole's decision every view of any prefix agrees with the report.
    pub fn new_part(snapshot: &'a Snapshot, whole: &StepSource) -> ModelView<'a> {
        Self::with_plan(snapshot, steps::StepPlan::for_part(snapshot, whole))
    }

    /// The view of `snapshot` with its steps numbered by `plan`.
    fn with_plan(snapshot: &'a Snapshot, plan: steps::StepPlan) -> ModelView<'a> {
        std::thread::scope(|scope| {
            let walk = scope.spawn(|| Reconstruction::without_links(snapshot));
            let mut builder = ModelViewBuilder::new(snapshot, plan);
            for (index, event) in snapshot.events.iter().enumerate() {
                builder.push(index, event);
            }
            // The walk takes longer than the pass (at 10M events, 1.0 s and 0.5 s): what
            // needs no walk is worked out meanwhile. The classification first: its pass over
            // the allocations (eight bytes each) ends before the summaries' lists by group
            // are made, which stay to the end, so the two are never held at once (the
            // analysis's peak on a 10M-event trace).
            let categories = Categories::classify(snapshot);
            let summaries = builder.summarize();
            let walk = walk
                .join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
            builder.finish(summaries, walk, categories)
        })
    }

    /// Where the steps of this view came from: the trace's own marks, a repeating call-site
    /// sequence found in its allocations, or nowhere.
    pub fn step_source(&self) -> &StepSource {
        &self.step_source
    }

    /// The trace's `empty_cache()` calls: its `EmptyCache` events, or, in a trace that records
    /// none (PyTorch's), the bursts of segment frees that one call makes (see
    /// [`vramscope_engine::empty_cache_calls`]).
    pub fn empty_cache_calls(&self) -> &[EmptyCacheCall] {
        &self.empty_cache_calls
    }

    /// How a reader should name call site `site`: its `file:line`, or for a stack without a
    /// source line of its own (C++ frames only, as on PyTorch's autograd thread) the innermost
    /// frame with a source line, else its autograd node (`MmBackward0`), else its innermost
    /// C++ function. Never `??:0`.
    pub fn site_name(&self, site: SiteId) -> SiteName {
        match self.snapshot.sites.get(site as usize) {
            Some(s) => name_call_site(s),
            None => SiteName {
                label: "(unknown site)".to_string(),
                function: String::new(),
                native: false,
            },
        }
    }

    /// What each group holds in `state`, a state of this view's trace (the engine walk's own
    /// state at some event: `Reconstruction::state_walked`, `Reconstruction::states_after`),
    /// largest first, as the "at peak" and "at end" columns are summed: memory from before
    /// the trace included, pending frees left out.
    pub fn holdings_in(&self, state: &MemoryState) -> Vec<Holding> {
        let step_of = |block: &LiveBlock| match self.snapshot.events.get(block.alloc_event as usize)
        {
            Some(_) if block.alloc_event != NO_EVENT => {
                self.steps[self.event_step(block.alloc_event) as usize].step
            }
            _ => block.step,
        };
        holdings_of(state, &self.groups, &step_of)
    }

    /// The snapshot this view describes.
    pub fn snapshot(&self) -> &'a Snapshot {
        self.snapshot
    }

    /// The call-site groups, by id.
    pub fn groups(&self) -> &[SiteGroup] {
        self.groups.all()
    }

    /// The grouping itself (to group blocks and sites the same way elsewhere).
    pub fn site_groups(&self) -> &SiteGroups {
        &self.groups
    }

    /// One group.
    pub fn group(&self, group: GroupId) -> &SiteGroup {
        self.groups.get(group)
    }

    /// The group a site id belongs to (`None` for ids outside the site table).
    pub fn group_of_site(&self, site: SiteId) -> Option<GroupId> {
        self.groups.of_site(site)
    }

    /// Every allocation of the trace with its free, in allocation order.
    pub fn intervals(&self) -> &[Interval] {
        &self.intervals
    }

    /// Step index (into [`ModelView::steps`]) of the free of `interval`, one of this view's
    /// intervals: the step of its free event; `None` when it is live at the end.
    pub fn free_step(&self, interval: &Interval) -> Option<u32> {
        interval
            .free_event()
            .map(|event| step_of_event(&self.event_step, event))
    }

    /// Indices into [`ModelView::intervals`] of one group's allocations, in order.
    pub fn group_intervals(&self, group: GroupId) -> &[u32] {
        self.group_intervals.of(group)
    }

    /// Indices into [`Snapshot::events`] of one group's transfers, syncs, `empty_cache()` calls,
    /// segment events and OOMs, in order.
    pub fn group_events(&self, group: GroupId) -> &[u32] {
        self.group_events.of(group)
    }

    /// The steps in increasing order; positions in this list are "step indices".
    pub fn steps(&self) -> &[StepInfo] {
        &self.steps
    }

    /// Step indices of the steps numbered 1 or more (the training loop, not the setup).
    pub fn loop_steps(&self) -> std::ops::Range<u32> {
        let first = self.steps.iter().position(|s| s.step >= 1);
        match first {
            Some(f) => f as u32..self.steps.len() as u32,
            None => 0..0,
        }
    }

    /// Step number of a step index.
    pub fn step_number(&self, index: u32) -> u64 {
        self.steps[index as usize].step
    }

    /// The block size of an interval's allocation, in bytes.
    pub fn interval_size(&self, interval: &Interval) -> u64 {
        interval.alloc(&self.snapshot.events).size
    }

    /// Step index of the event at `event`.
    pub fn event_step(&self, event: u32) -> u32 {
        step_of_event(&self.event_step, event)
    }

    /// Tallies of the whole trace, one per step index.
    pub fn step_totals(&self) -> &[StepTally] {
        &self.step_totals
    }

    /// Tallies of one group: `(step index, tally)` for the steps where it did something.
    pub fn group_steps(&self, group: GroupId) -> &[(u32, StepTally)] {
        &self.group_steps[group as usize]
    }

    /// Blocks and bytes of `group` live at the end of the step with index `step`.
    pub fn live_after_step(&self, group: GroupId, step: u32) -> (u64, u64) {
        let mut blocks = 0;
        let mut bytes = 0u64;
        for &i in self.group_intervals(group) {
            let iv = &self.intervals[i as usize];
            if iv.alloc_step <= step && self.free_step(iv).is_none_or(|f| f > step) {
                blocks += 1;
                bytes = bytes.saturating_add(self.interval_size(iv));
            }
        }
        (blocks, bytes)
    }

    /// Blocks and bytes of `group` allocated in the trace and live at its end.
    pub fn live_at_end_in_trace(&self, group: GroupId) -> (u64, u64) {
        let mut blocks = 0;
        let mut bytes = 0u64;
        for &i in self.group_intervals(group) {
            let iv = &self.intervals[i as usize];
            if iv.is_live_at_end() {
                blocks += 1;
                bytes = bytes.saturating_add(self.interval_size(iv));
            }
        }
        (blocks, bytes)
    }

    /// Allocated and reserved bytes after every event that changed them, in event order
    /// (reserved bytes are 0 when unknown).
    pub fn timeline(&self) -> impl Iterator<Item = TimelinePoint> + '_ {
        let mut last = self.start_usage;
        self.usage
            .iter()
            .enumerate()
            .filter_map(move |(event, usage)| {
                if usage == last {
                    return None;
                }
                last = usage;
                Some(TimelinePoint {
                    event: event as u32,
                    allocated: usage.allocated,
                    reserved: self.known_reserved(usage.reserved),
                })
            })
    }

    /// Allocated and reserved bytes just after event `event` (the baseline before the first
    /// event; the end for an index past the last event; reserved bytes are 0 when unknown).
    pub fn usage_at(&self, event: u32) -> (u64, u64) {
        let index = (event as usize).min(self.usage.len().saturating_sub(1));
        match self.usage.get(index) {
            Some(usage) => (usage.allocated, self.known_reserved(usage.reserved)),
            None => (self.baseline_allocated(), self.baseline_reserved()),
        }
    }

    /// `bytes` of reserved memory as the view reports them: 0 when reserved bytes are unknown.
    fn known_reserved(&self, bytes: u64) -> u64 {
        if self.reserved_known {
            bytes
        } else {
            0
        }
    }

    /// Whether reserved bytes are known (the trace has segment events or segments).
    pub fn reserved_known(&self) -> bool {
        self.reserved_known
    }

    /// Bytes allocated before the trace began: the engine's start state (blocks the trace
    /// frees or the dump-time state shows, and what the statistics say beyond them).
    pub fn baseline_allocated(&self) -> u64 {
        self.start_usage.allocated
    }

    /// Bytes reserved before the trace began (0 when unknown).
    pub fn baseline_reserved(&self) -> u64 {
        self.known_reserved(self.start_usage.reserved)
    }

    /// The highest allocated bytes on the timeline.
    pub fn peak_allocated(&self) -> u64 {
        self.peak_allocated
    }

    /// The event after which allocated bytes peaked.
    pub fn peak_allocated_event(&self) -> Option<u32> {
        self.peak_allocated_event
    }

    /// The highest reserved bytes on the timeline (0 when unknown).
    pub fn peak_reserved(&self) -> u64 {
        self.peak_reserved
    }

    /// The event after which reserved bytes peaked (`None` when the start held the peak).
    pub fn peak_reserved_event(&self) -> Option<u32> {
        self.peak_reserved_event
    }

    /// Allocated bytes at the end of the trace.
    pub fn end_allocated(&self) -> u64 {
        self.end_allocated
    }

    /// Reserved bytes at the end of the trace (0 when unknown).
    pub fn end_reserved(&self) -> u64 {
        self.end_reserved
    }

    /// Totals over the whole trace.
    pub fn totals(&self) -> &TraceTotals {
        &self.totals
    }

    /// Indices of the `Oom` events.
    pub fn ooms(&self) -> &[u32] {
        &self.ooms
    }

    /// What each group holds at the end, largest first; the bytes sum to
    /// [`ModelView::end_allocated`] (memory from before the trace under its site, or under
    /// [`SiteGroups::BEFORE_TRACE`]).
    pub fn live_at_end(&self) -> &[Holding] {
        &self.live_end
    }

    /// What each group holds at the peak of allocated bytes, largest first; the bytes sum to
    /// [`ModelView::peak_allocated`] (memory from before the trace included, as at the end).
    pub fn live_at_peak(&self) -> &[Holding] {
        &self.live_peak
    }

    /// Figures about the segments of the snapshot.
    pub fn segments(&self) -> &SegmentSummary {
        &self.segments
    }

    /// What every allocation of the trace is made of: one pass of `crate::categories`.
    pub fn categories(&self) -> &Categories {
        &self.categories
    }

    /// Bytes per category at the peak of allocated bytes; they add up to
    /// [`ModelView::peak_allocated`].
    pub fn categories_at_peak(&self) -> &CategoryBytes {
        &self.categories_at_peak
    }

    /// What `group`'s holding at the peak (`at_peak`) or at the end is made of: its bytes per
    /// category, adding up to the holding's bytes (none for a group that holds nothing).
    pub fn group_categories(&self, group: GroupId, at_peak: bool) -> CategoryBytes {
        let by = if at_peak {
            &self.group_categories_at_peak
        } else {
            &self.group_categories_at_end
        };
        by.get(&group).copied().unwrap_or_default()
    }

    /// Bytes per category at the end; they add up to [`ModelView::end_allocated`].
    pub fn categories_at_end(&self) -> &CategoryBytes {
        &self.categories_at_end
    }

    /// Bytes per category just after each event of `events` (indices in increasing order),
    /// from one walk from the engine's start state that stops after the last of them.
    ///
    /// Where the trace contradicts itself before the last of them (the engine's
    /// `Disagreements`), a walk forwards would part from the engine's own states, so the
    /// bytes are read from those states instead (`Reconstruction::states_after`, a walk back
    /// from the end): either way they add up to the allocated bytes the view reports there.
    pub fn categories_after(&self, events: &[u32]) -> Vec<CategoryBytes> {
        let last = events.last().map_or(0, |&e| e as usize + 1);
        if self.disagreements.none_in(0, last) {
            return self
                .categories
                .after_events(self.snapshot, &self.start, events);
        }
        let mut at: rustc_hash::FxHashMap<u32, CategoryBytes> = Default::default();
        Reconstruction::states_after(self.snapshot, events, |i, state| {
            at.insert(i, self.categories.in_state(state));
        });
        events
            .iter()
            .map(|e| at.get(e).copied().unwrap_or(self.categories_at_end))
            .collect()
    }

    /// The engine walk's state before the first event (the one
    /// `vramscope_engine::Reconstruction::start_of` gives).
    pub fn start_state(&self) -> &MemoryState {
        &self.start
    }

    /// Bytes per category before the first event: all from before the trace (the
    /// parameters among them where the trace shows which they are).
    pub fn categories_at_start(&self) -> CategoryBytes {
        self.categories.at_start(&self.start)
    }

    /// Device capacity in bytes: `override_bytes` if given, else the snapshot's, else `None`.
    pub fn capacity(&self, override_bytes: Option<u64>) -> Option<u64> {
        override_bytes
            .or(Some(self.snapshot.device.capacity))
            .filter(|&c| c > 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vramscope_testkit::{Trace, MIB};

    proptest::proptest! {
        #![proptest_config(vramscope_testkit::props::config(64))]

        /// The flat index by group gives each group the indices a list per group would hold,
        /// in the order given; a group past the last has none.
        #[test]
        fn by_group_lists_each_groups_indices_in_order(
            groups in 1usize..12,
            picks in proptest::collection::vec((0usize..64, 0u32..1_000_000), 0..300),
        ) {
            let entries: Vec<(GroupId, u32)> = picks
                .iter()
                .map(|&(g, i)| ((g % groups) as GroupId, i))
                .collect();
            let flat = ByGroup::new(groups, || entries.iter().copied());
            let mut lists = vec![Vec::new(); groups];
            for &(g, i) in &entries {
                lists[g as usize].push(i);
            }
            for (g, list) in lists.iter().enumerate() {
                proptest::prop_assert_eq!(flat.of(g as GroupId), list.as_slice());
            }
            proptest::prop_assert!(flat.of(groups as GroupId).is_empty());
        }
    }

    #[test]
    fn step_runs_give_every_events_step() {
        let plain = [0u32, 0, 0, 1, 1, 2, 0, 0, 5];
        let mut runs = Runs::new();
        for &step in &plain {
            runs.push(step);
        }
        assert_eq!(runs.len(), plain.len());
        for (i, &step) in plain.iter().enumerate() {
            assert_eq!(step_of_event(&runs, i as u32), step, "event {i}");
        }
        assert_eq!(
            step_of_event(&runs, 100),
            5,
            "past the end: the last event's"
        );
        assert_eq!(step_of_event(&Runs::new(), 0), 0);
    }

    /// The view keeps an interval per allocation, a third of a big trace's events: 48 bytes
    /// each until the free's event and step took four bytes each and the size and requested
    /// bytes were read from the allocation event, 20 until the free's step was read from its
    /// event; a field that grows it shows here.
    #[test]
    fn an_interval_takes_16_bytes() {
        assert_eq!(std::mem::size_of::<Interval>(), 16);
    }

    #[test]
    fn pairs_allocations_with_their_frees() {
        let mut t = Trace::new();
        let a = t.site("a.py", 1, "f");
        let b = t.site("b.py", 2, "g");
        let x = t.alloc(a, MIB);
        t.step();
        let y = t.alloc(b, 2 * MIB);
        t.free(x, MIB);
        // Address reuse after the free is a new interval.
        t.alloc_at(b, x, 512);
        let snapshot = t.finish();
        let view = ModelView::new(&snapshot);
        let iv = view.intervals();
        assert_eq!(iv.len(), 3);
        assert_eq!(view.free_step(&iv[0]), Some(1));
        assert_eq!(view.free_step(&iv[1]), None);
        assert!(iv[1].is_live_at_end());
        assert!(iv[2].is_live_at_end());
        let addr_of = |interval: &Interval| interval.alloc(&snapshot.events).addr;
        assert_eq!(addr_of(&iv[0]), addr_of(&iv[2]));
        assert_eq!(view.totals().frees, 1);
        assert_eq!(view.totals().unmatched_frees, 0);
        assert_eq!(view.peak_allocated(), 3 * MIB);
        assert_eq!(view.end_allocated(), 2 * MIB + 512);
        assert_eq!(view.live_at_end()[0].bytes, 2 * MIB + 512);
        assert_eq!(view.live_at_end()[0].blocks, 2);
        let _ = y;
    }

    #[test]
    fn missing_free_closes_the_older_block() {
        let mut t = Trace::new();
        let a = t.site("a.py", 1, "f");
        t.alloc_at(a, 0x1000, 512);
        t.alloc_at(a, 0x1000, 512);
        let snapshot = t.finish();
        let view = ModelView::new(&snapshot);
        assert_eq!(view.totals().lost_frees, 1);
        assert_eq!(view.end_allocated(), 512);
    }

    #[test]
    fn segments_before_the_trace_lift_the_timeline() {
        let mut t = Trace::new();
        let a = t.site("a.py", 1, "f");
        // A segment reserved before recording holds an old block and a new one.
        t.add_segment(
            0x10_0000,
            &[
                (0, MIB, true),
                (MIB, MIB, false),
                (2 * MIB, 18 * MIB, false),
            ],
            20 * MIB,
        );
        t.alloc_at(a, 0x10_0000 + MIB, MIB);
        t.snap.segments[0].blocks[1].state = vramscope_model::BlockState::ActiveAllocated;
        let snapshot = t.finish();
        let view = ModelView::new(&snapshot);
        assert_eq!(view.baseline_allocated(), MIB);
        assert_eq!(view.baseline_reserved(), 20 * MIB);
        assert!(view.reserved_known());
        assert_eq!(view.usage_at(0), (2 * MIB, 20 * MIB));
        // The old block shows under the unknown site, the new one under its own.
        let live = view.live_at_end();
        assert_eq!(live.len(), 2);
        assert!(live
            .iter()
            .any(|h| view.group(h.group).file_line.is_none() && h.bytes == MIB));
        assert_eq!(view.segments().inactive_split_bytes, 18 * MIB);
        assert_eq!(view.segments().largest_free_block, 18 * MIB);
    }

    #[test]
    fn free_requested_then_completed_counts_once() {
        let mut t = Trace::new();
        t.free(0x5000, 4096);
        let snapshot = t.finish();
        let view = ModelView::new(&snapshot);
        assert_eq!(view.totals().unmatched_frees, 1);
        assert_eq!(view.baseline_allocated(), 4096);
        assert_eq!(view.end_allocated(), 0);
    }

    #[test]
    fn steps_are_indexed_in_order() {
        let mut t = Trace::new();
        let a = t.site("a.py", 1, "f");
        t.alloc(a, 512);
        t.step();
        t.step();
        t.alloc(a, 512);
        let snapshot = t.finish();
        let view = ModelView::new(&snapshot);
        let numbers: Vec<u64> = view.steps().iter().map(|s| s.step).collect();
        assert_eq!(numbers, vec![0, 1, 2]);
        assert_eq!(view.loop_steps(), 1..3);
        assert_eq!(view.steps()[2].label, "mark_step");
        assert_eq!(view.step_totals()[2].allocs, 1);
        let group = view.group_of_site(a).unwrap();
        assert_eq!(view.live_after_step(group, 0), (1, 512));
    }
}
