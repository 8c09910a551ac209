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

use rustc_hash::FxHashMap;
use vramscope_engine::{
    empty_cache_calls, is_native_frame, name_call_site, EmptyCacheCall, GroupId, MemoryState, Pair,
    Pairing, Reconstruction, SiteGroup, SiteGroups, SiteName,
};
use vramscope_model::{
    BlockState, CallSite, Event, EventKind, Frame, SiteId, Snapshot, TransferDirection,
};

/// One allocation paired with its free, if the trace has one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Interval {
    /// Call-site group of the allocation.
    pub group: GroupId,
    /// Device ordinal.
    pub device: u32,
    /// Device address.
    pub addr: u64,
    /// Block size in bytes.
    pub size: u64,
    /// Bytes the program asked for.
    pub requested: u64,
    /// Index of the `Alloc` event in [`Snapshot::events`].
    pub alloc_event: u32,
    /// Index of the first free event of the block, `None` when it is live at the end.
    pub free_event: Option<u32>,
    /// Step index (into [`ModelView::steps`]) of the allocation.
    pub alloc_step: u32,
    /// Step index of the free.
    pub free_step: Option<u32>,
}

impl Interval {
    /// Whether the block is still allocated at the end of the trace.
    pub fn is_live_at_end(&self) -> bool {
        self.free_event.is_none()
    }

    /// Whether the block is allocated just after event `event` has happened.
    pub fn is_live_after(&self, event: u32) -> bool {
        self.alloc_event <= event && self.free_event.is_none_or(|f| f > event)
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
    /// Index of the event in [`Snapshot::events`].
    pub event: u32,
    /// Sequence number of the event.
    pub seq: u64,
    /// Time of the event in nanoseconds since the snapshot's epoch.
    pub time_ns: u64,
    /// Step number of the event.
    pub step: u64,
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
    /// Allocations whose address was allocated again without a free in between.
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

/// The analysis view of one snapshot. See the module documentation.
#[derive(Clone, Debug)]
pub struct ModelView<'a> {
    snapshot: &'a Snapshot,
    groups: SiteGroups,
    intervals: Vec<Interval>,
    group_intervals: Vec<Vec<u32>>,
    group_events: Vec<Vec<u32>>,
    steps: Vec<StepInfo>,
    event_step: Vec<u32>,
    step_totals: Vec<StepTally>,
    group_steps: Vec<Vec<(u32, StepTally)>>,
    timeline: Vec<TimelinePoint>,
    reserved_known: bool,
    baseline_allocated: u64,
    baseline_reserved: u64,
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
}

impl<'a> ModelView<'a> {
    /// Builds the view of `snapshot`: one walk of the engine (`crate::engine`) for the state at
    /// every event, then one pass over the events for pairing, groups and tallies.
    pub fn new(snapshot: &'a Snapshot) -> ModelView<'a> {
        let walk = Reconstruction::of(snapshot);
        let groups = SiteGroups::from_sites(&snapshot.sites);
        let plan = StepPlan::of(snapshot);
        let (numbers, mut steps) = collect_steps(snapshot, &plan);
        let step_index = |step: u64, hint: &mut usize| -> u32 {
            if numbers.get(*hint) != Some(&step) {
                *hint = numbers.binary_search(&step).unwrap_or(0);
            }
            *hint as u32
        };

        let mut intervals: Vec<Interval> = Vec::new();
        let mut interval_of: FxHashMap<u32, u32> = FxHashMap::default();
        let mut pairing = Pairing::new();
        let mut tallies: FxHashMap<(GroupId, u32), StepTally> = FxHashMap::default();
        let mut group_extra_events: Vec<(GroupId, u32)> = Vec::new();
        let mut event_step = Vec::with_capacity(snapshot.events.len());
        let mut timeline = Vec::new();
        let mut totals = TraceTotals {
            events: snapshot.events.len() as u64,
            ..TraceTotals::default()
        };
        let mut ooms = Vec::new();
        let mut hint = 0usize;
        let mut last_usage = walk.start.usage();

        for (i, e) in snapshot.events.iter().enumerate() {
            let idx = i as u32;
            let s = step_index(plan.step_of(i, e), &mut hint);
            event_step.push(s);
            if steps[s as usize].first_event.is_none() {
                steps[s as usize].first_event = Some(idx);
            }
            let g = groups.of(e.site);
            match (e.kind, pairing.push(idx, e)) {
                (EventKind::Alloc, Pair::Alloc { replaced }) => {
                    if let Some(old) = replaced.and_then(|a| interval_of.remove(&a)) {
                        // The trace lost the free of the previous block at this address.
                        let old = &mut intervals[old as usize];
                        old.free_event = Some(idx);
                        old.free_step = Some(s);
                        totals.lost_frees += 1;
                    }
                    interval_of.insert(idx, intervals.len() as u32);
                    intervals.push(Interval {
                        group: g,
                        device: e.device,
                        addr: e.addr,
                        size: e.size,
                        requested: e.requested,
                        alloc_event: idx,
                        free_event: None,
                        alloc_step: s,
                        free_step: None,
                    });
                    let t = tallies.entry((g, s)).or_default();
                    t.allocs += 1;
                    t.alloc_bytes = t.alloc_bytes.saturating_add(e.size);
                    totals.allocs += 1;
                }
                (_, Pair::Free(link)) if link.ends_allocation => {
                    match link.alloc.and_then(|a| interval_of.remove(&a)) {
                        Some(at) => {
                            let interval = &mut intervals[at as usize];
                            interval.free_event = Some(idx);
                            interval.free_step = Some(s);
                            let t = tallies.entry((interval.group, s)).or_default();
                            t.frees += 1;
                            t.free_bytes = t.free_bytes.saturating_add(interval.size);
                            totals.frees += 1;
                        }
                        None => {
                            totals.unmatched_frees += 1;
                            totals.unmatched_free_bytes =
                                totals.unmatched_free_bytes.saturating_add(e.size);
                        }
                    }
                }
                (EventKind::SegmentAlloc | EventKind::SegmentMap, _) => {
                    let t = tallies.entry((g, s)).or_default();
                    t.segment_allocs += 1;
                    t.segment_alloc_bytes = t.segment_alloc_bytes.saturating_add(e.size);
                    totals.segment_allocs += 1;
                    group_extra_events.push((g, idx));
                }
                (EventKind::SegmentFree | EventKind::SegmentUnmap, _) => {
                    let t = tallies.entry((g, s)).or_default();
                    t.segment_frees += 1;
                    t.segment_free_bytes = t.segment_free_bytes.saturating_add(e.size);
                    totals.segment_frees += 1;
                    group_extra_events.push((g, idx));
                }
                (EventKind::EmptyCache, _) => {
                    tallies.entry((g, s)).or_default().empty_cache += 1;
                    totals.empty_cache += 1;
                    group_extra_events.push((g, idx));
                }
                (EventKind::Oom, _) => {
                    tallies.entry((g, s)).or_default().ooms += 1;
                    totals.ooms += 1;
                    ooms.push(idx);
                    group_extra_events.push((g, idx));
                }
                (EventKind::Transfer(direction), _) => {
                    let t = tallies.entry((g, s)).or_default();
                    match direction {
                        TransferDirection::HostToDevice => {
                            t.h2d += 1;
                            t.h2d_bytes = t.h2d_bytes.saturating_add(e.size);
                            totals.h2d_bytes = totals.h2d_bytes.saturating_add(e.size);
                        }
                        TransferDirection::DeviceToHost => {
                            t.d2h += 1;
                            t.d2h_bytes = t.d2h_bytes.saturating_add(e.size);
                            totals.d2h_bytes = totals.d2h_bytes.saturating_add(e.size);
                        }
                        TransferDirection::DeviceToDevice => {
                            t.d2d += 1;
                            t.d2d_bytes = t.d2d_bytes.saturating_add(e.size);
                        }
                    }
                    totals.transfers += 1;
                    group_extra_events.push((g, idx));
                }
                (EventKind::Sync, _) => {
                    tallies.entry((g, s)).or_default().syncs += 1;
                    totals.syncs += 1;
                    group_extra_events.push((g, idx));
                }
                _ => {}
            }
            let usage = walk.usage[i];
            if usage != last_usage {
                last_usage = usage;
                timeline.push(TimelinePoint {
                    event: idx,
                    seq: e.seq,
                    time_ns: e.time_ns,
                    step: plan.step_of(i, e),
                    allocated: usage.allocated,
                    reserved: if walk.reserved_known {
                        usage.reserved
                    } else {
                        0
                    },
                });
            }
        }

        // Blocks still live at the end count as retained by the step that allocated them.
        for interval in intervals.iter().filter(|iv| iv.is_live_at_end()) {
            let t = tallies
                .entry((interval.group, interval.alloc_step))
                .or_default();
            t.retained += 1;
            t.retained_bytes = t.retained_bytes.saturating_add(interval.size);
        }

        // Per-group indexes.
        let n_groups = groups.len();
        let mut group_intervals = vec![Vec::new(); n_groups];
        for (i, iv) in intervals.iter().enumerate() {
            group_intervals[iv.group as usize].push(i as u32);
        }
        let mut group_events = vec![Vec::new(); n_groups];
        for (g, idx) in group_extra_events {
            group_events[g as usize].push(idx);
        }
        let mut step_totals = vec![StepTally::default(); steps.len()];
        let mut group_steps: Vec<Vec<(u32, StepTally)>> = vec![Vec::new(); n_groups];
        for ((g, s), t) in tallies {
            step_totals[s as usize].add(&t);
            group_steps[g as usize].push((s, t));
        }
        for list in &mut group_steps {
            list.sort_unstable_by_key(|(s, _)| *s);
        }

        let known_reserved = |bytes: u64| if walk.reserved_known { bytes } else { 0 };
        let block_step = |block: &vramscope_engine::LiveBlock| match snapshot
            .events
            .get(block.alloc_event as usize)
        {
            Some(e) if block.alloc_event != vramscope_engine::NO_EVENT => {
                plan.step_of(block.alloc_event as usize, e)
            }
            _ => block.step,
        };
        let live_end = holdings_of(&walk.end, &groups, &block_step);
        let live_peak = match walk.peak_allocated.event {
            Some(at) => holdings_of(
                &walk.state_at(&snapshot.events, at as usize + 1),
                &groups,
                &block_step,
            ),
            None => holdings_of(&walk.start, &groups, &block_step),
        };
        let empty_cache_calls = empty_cache_calls(snapshot);
        ModelView {
            snapshot,
            groups,
            intervals,
            group_intervals,
            group_events,
            steps,
            event_step,
            step_totals,
            group_steps,
            timeline,
            reserved_known: walk.reserved_known,
            baseline_allocated: walk.start.allocated,
            baseline_reserved: known_reserved(walk.start.reserved),
            peak_allocated: walk.peak_allocated.bytes,
            peak_allocated_event: walk.peak_allocated.event,
            peak_reserved: known_reserved(walk.peak_reserved.bytes),
            peak_reserved_event: walk.peak_reserved.event,
            end_allocated: walk.end.allocated,
            end_reserved: known_reserved(walk.end.reserved),
            totals,
            ooms,
            live_end,
            live_peak,
            segments: summarize_segments(snapshot),
            step_source: plan.source,
            empty_cache_calls,
        }
    }

    /// Where the steps of this view came from: the trace's own marks, a repeating call-site
    /// sequence found in its allocations, or nowhere.
    pub fn step_source(&self) -> &StepSource {
        &self.step_source
    }

    /// The trace's `empty_cache()` calls: its `EmptyCache` events, or, in a trace that records
    /// none (PyTorch's), the bursts of segment frees that one call makes (see
    /// [`empty_cache_calls`]).
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

    /// What each group holds just after event `event` (blocks allocated inside the trace),
    /// largest first.
    pub fn live_after_event(&self, event: u32) -> Vec<Holding> {
        self.holdings(|iv| iv.is_live_after(event))
    }

    /// Holdings by group of the intervals selected by `keep`, largest first.
    fn holdings(&self, keep: impl Fn(&Interval) -> bool) -> Vec<Holding> {
        let mut by_group: FxHashMap<GroupId, Holding> = FxHashMap::default();
        for iv in self.intervals.iter().filter(|iv| keep(iv)) {
            let step = self.steps[iv.alloc_step as usize].step;
            add_holding(&mut by_group, iv.group, iv.size, iv.requested, step);
        }
        sorted_holdings(by_group)
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

    /// Indices into [`ModelView::intervals`] of one group's allocations, in order.
    pub fn group_intervals(&self, group: GroupId) -> &[u32] {
        &self.group_intervals[group as usize]
    }

    /// Indices into [`Snapshot::events`] of one group's transfers, syncs, `empty_cache()` calls,
    /// segment events and OOMs, in order.
    pub fn group_events(&self, group: GroupId) -> &[u32] {
        &self.group_events[group as usize]
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

    /// Step index of the event at `event`.
    pub fn event_step(&self, event: u32) -> u32 {
        self.event_step[event as usize]
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
            if iv.alloc_step <= step && iv.free_step.is_none_or(|f| f > step) {
                blocks += 1;
                bytes = bytes.saturating_add(iv.size);
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
                bytes = bytes.saturating_add(iv.size);
            }
        }
        (blocks, bytes)
    }

    /// Allocated and reserved bytes after every event that changed them.
    pub fn timeline(&self) -> &[TimelinePoint] {
        &self.timeline
    }

    /// Allocated and reserved bytes just after event `event` (the baseline before any change).
    pub fn usage_at(&self, event: u32) -> (u64, u64) {
        let n = self.timeline.partition_point(|p| p.event <= event);
        match n.checked_sub(1).map(|i| &self.timeline[i]) {
            Some(p) => (p.allocated, p.reserved),
            None => (
                self.baseline_allocated,
                if self.reserved_known {
                    self.baseline_reserved
                } else {
                    0
                },
            ),
        }
    }

    /// Whether reserved bytes are known (the trace has segment events or segments).
    pub fn reserved_known(&self) -> bool {
        self.reserved_known
    }

    /// Bytes allocated before the trace began: the engine's start state (blocks the trace
    /// frees or the dump-time state shows, and what the statistics say beyond them).
    pub fn baseline_allocated(&self) -> u64 {
        self.baseline_allocated
    }

    /// Bytes reserved before the trace began (0 when unknown).
    pub fn baseline_reserved(&self) -> u64 {
        self.baseline_reserved
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

    /// Device capacity in bytes: `override_bytes` if given, else the snapshot's, else `None`.
    pub fn capacity(&self, override_bytes: Option<u64>) -> Option<u64> {
        override_bytes
            .or(Some(self.snapshot.device.capacity))
            .filter(|&c| c > 0)
    }
}

/// Every step number seen in events or marks (or inferred), in order, with the label of its
/// mark.
fn collect_steps(snapshot: &Snapshot, plan: &StepPlan) -> (Vec<u64>, Vec<StepInfo>) {
    if let Some(inferred) = &plan.inferred {
        let n = inferred.starts.len() as u64;
        let numbers: Vec<u64> = (0..=n).collect();
        let steps = numbers
            .iter()
            .map(|&step| StepInfo {
                step,
                first_event: None,
                label: if step == 0 {
                    String::new()
                } else {
                    inferred.opener.clone()
                },
            })
            .collect();
        return (numbers, steps);
    }
    let mut numbers: Vec<u64> = snapshot.events.iter().map(|e| e.step).collect();
    numbers.extend(snapshot.steps.iter().map(|m| m.step));
    numbers.sort_unstable();
    numbers.dedup();
    let mut steps: Vec<StepInfo> = numbers
        .iter()
        .map(|&step| StepInfo {
            step,
            first_event: None,
            label: String::new(),
        })
        .collect();
    for mark in &snapshot.steps {
        if let Ok(i) = numbers.binary_search(&mark.step) {
            if steps[i].label.is_empty() {
                steps[i].label = mark.label.clone();
            }
        }
    }
    (numbers, steps)
}

fn add_holding(
    by_group: &mut FxHashMap<GroupId, Holding>,
    group: GroupId,
    bytes: u64,
    requested: u64,
    step: u64,
) {
    let h = by_group.entry(group).or_insert(Holding {
        group,
        bytes: 0,
        blocks: 0,
        requested: 0,
        first_step: step,
        last_step: step,
    });
    h.bytes = h.bytes.saturating_add(bytes);
    h.blocks += 1;
    h.requested = h.requested.saturating_add(requested);
    h.first_step = h.first_step.min(step);
    h.last_step = h.last_step.max(step);
}

/// What each group holds in `state` (pending frees left out, as from the allocated figure),
/// with the state's unattributed bytes under [`SiteGroups::BEFORE_TRACE`].
fn holdings_of(
    state: &MemoryState,
    groups: &SiteGroups,
    step_of: &dyn Fn(&vramscope_engine::LiveBlock) -> u64,
) -> Vec<Holding> {
    let mut by_group: FxHashMap<GroupId, Holding> = FxHashMap::default();
    for block in state.blocks.values().filter(|b| !b.pending) {
        add_holding(
            &mut by_group,
            groups.of_block(block),
            block.size,
            block.requested,
            step_of(block),
        );
    }
    if state.unattributed.allocated > 0 {
        let h = by_group.entry(SiteGroups::BEFORE_TRACE).or_insert(Holding {
            group: SiteGroups::BEFORE_TRACE,
            bytes: 0,
            blocks: 0,
            requested: 0,
            first_step: 0,
            last_step: 0,
        });
        h.bytes = h.bytes.saturating_add(state.unattributed.allocated);
    }
    sorted_holdings(by_group)
}

fn sorted_holdings(by_group: FxHashMap<GroupId, Holding>) -> Vec<Holding> {
    let mut list: Vec<Holding> = by_group.into_values().collect();
    list.sort_unstable_by(|a, b| {
        b.bytes
            .cmp(&a.bytes)
            .then(b.blocks.cmp(&a.blocks))
            .then(a.group.cmp(&b.group))
    });
    list
}

fn summarize_segments(snapshot: &Snapshot) -> SegmentSummary {
    let mut s = SegmentSummary::default();
    for segment in &snapshot.segments {
        s.segments += 1;
        s.reserved = s.reserved.saturating_add(segment.total_size);
        s.largest_segment = s.largest_segment.max(segment.total_size);
        // Sums are saturating: an imported file may hold absurd sizes.
        let (mut allocated, mut active, mut free_blocks, mut largest_free) =
            (0u64, 0u64, 0u64, 0u64);
        for block in &segment.blocks {
            match block.state {
                BlockState::ActiveAllocated => {
                    allocated = allocated.saturating_add(block.size);
                    active = active.saturating_add(block.size);
                }
                BlockState::ActivePendingFree => active = active.saturating_add(block.size),
                BlockState::Inactive => {
                    free_blocks += 1;
                    largest_free = largest_free.max(block.size);
                }
            }
        }
        s.allocated = s.allocated.saturating_add(allocated);
        s.active = s.active.saturating_add(active);
        let free_bytes = segment.total_size.saturating_sub(active);
        if active > 0 {
            s.inactive_split_bytes = s.inactive_split_bytes.saturating_add(free_bytes);
            s.inactive_split_blocks += free_blocks;
        } else {
            s.releasable_bytes = s.releasable_bytes.saturating_add(free_bytes);
        }
        s.largest_free_block = s.largest_free_block.max(largest_free);
    }
    s
}

/// Re-derives the steps of `snapshot` from marks whose name contains `marker`.
///
/// Step marks ([`Snapshot::steps`]) whose label contains `marker` are used first: each starts a
/// step at its sequence number. Failing those, annotations ([`Snapshot::annotations`]) whose
/// name contains `marker` and whose stage is `START` (or empty) start a step at their time.
/// Every event's `step` and the snapshot's step marks are rewritten; the function returns the
/// number of steps found, and leaves the snapshot unchanged when it finds none.
///
/// The importers (`crate::import::ImportOptions`) recognise steps while reading a file, by a
/// function in the allocation stacks or by an annotation family; this function re-steps a
/// snapshot that is already loaded, for example to pick one family of profiler slices.
pub fn apply_step_marker(snapshot: &mut Snapshot, marker: &str) -> usize {
    use vramscope_model::StepMark;

    let by_label: Vec<(u64, u64, String)> = snapshot
        .steps
        .iter()
        .filter(|m| m.label.contains(marker))
        .map(|m| (m.seq, m.time_ns, m.label.clone()))
        .collect();
    if !by_label.is_empty() {
        let mut marks = by_label;
        marks.sort_by_key(|m| m.0);
        for e in &mut snapshot.events {
            e.step = marks.partition_point(|m| m.0 <= e.seq) as u64;
        }
        snapshot.steps = marks
            .iter()
            .enumerate()
            .map(|(i, (seq, time_ns, label))| StepMark {
                step: i as u64 + 1,
                seq: *seq,
                time_ns: *time_ns,
                label: label.clone(),
            })
            .collect();
        return snapshot.steps.len();
    }

    let mut times: Vec<(u64, String)> = snapshot
        .annotations
        .iter()
        .filter(|a| {
            a.name.contains(marker) && (a.stage.is_empty() || a.stage.eq_ignore_ascii_case("start"))
        })
        .map(|a| (a.time_ns, a.name.clone()))
        .collect();
    if times.is_empty() {
        return 0;
    }
    times.sort();
    times.dedup_by_key(|t| t.0);
    for e in &mut snapshot.events {
        e.step = times.partition_point(|t| t.0 <= e.time_ns) as u64;
    }
    let next_seq = snapshot.events.last().map(|e| e.seq + 1).unwrap_or(0);
    let mut marks = Vec::with_capacity(times.len());
    let mut cursor = 0;
    for (i, (time_ns, label)) in times.into_iter().enumerate() {
        while cursor < snapshot.events.len() && snapshot.events[cursor].time_ns < time_ns {
            cursor += 1;
        }
        marks.push(StepMark {
            step: i as u64 + 1,
            seq: snapshot
                .events
                .get(cursor)
                .map(|e| e.seq)
                .unwrap_or(next_seq),
            time_ns,
            label,
        });
    }
    snapshot.steps = marks;
    snapshot.steps.len()
}

/// Where the steps of a view came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StepSource {
    /// The trace's own step marks (`mark_step`, an annotation such as
    /// `Optimizer.step#AdamW.step`, a profiler slice); `label` is the first mark's label.
    Recorded {
        /// The label of the first mark.
        label: String,
    },
    /// No marks: each step begins where the loop's first allocating line runs again (the
    /// repeating call-site sequence of the allocations).
    Inferred {
        /// `file:line` of the line that opens each iteration.
        opener: String,
    },
    /// Neither marks nor a repeating sequence: the whole trace is one step.
    None,
}

impl StepSource {
    /// A phrase for reports: where the steps came from.
    pub fn describe(&self) -> String {
        match self {
            StepSource::Recorded { label } if label.is_empty() => {
                "steps from the trace's step marks".to_string()
            }
            StepSource::Recorded { label } => {
                format!("steps from the trace's step marks (`{label}`)")
            }
            StepSource::Inferred { opener } => {
                format!("steps inferred from the repeating allocations (each begins at {opener})")
            }
            StepSource::None => "no steps (no marks and no repeating loop found)".to_string(),
        }
    }
}

/// Steps found from the repeating call-site sequence of a trace without marks.
#[derive(Clone, Debug, PartialEq, Eq)]
struct InferredSteps {
    /// Event indices that begin steps 1, 2, ...
    starts: Vec<u32>,
    /// `file:line` of the line that opens each iteration.
    opener: String,
}

/// How the view numbers steps: the events' own step numbers, or inferred ones.
struct StepPlan {
    source: StepSource,
    inferred: Option<InferredSteps>,
}

impl StepPlan {
    fn of(snapshot: &Snapshot) -> StepPlan {
        let marked = !snapshot.steps.is_empty() || snapshot.events.iter().any(|e| e.step > 0);
        if marked {
            let label = snapshot
                .steps
                .first()
                .map(|m| m.label.clone())
                .unwrap_or_default();
            return StepPlan {
                source: StepSource::Recorded { label },
                inferred: None,
            };
        }
        match infer_steps(snapshot) {
            Some(inferred) => StepPlan {
                source: StepSource::Inferred {
                    opener: inferred.opener.clone(),
                },
                inferred: Some(inferred),
            },
            None => StepPlan {
                source: StepSource::None,
                inferred: None,
            },
        }
    }

    /// The step number of event `index`.
    fn step_of(&self, index: usize, event: &Event) -> u64 {
        match &self.inferred {
            Some(inferred) => inferred.starts.partition_point(|&s| s as usize <= index) as u64,
            None => event.step,
        }
    }
}

/// Fewest iterations a repeating sequence must show to be taken for a loop.
const MIN_INFERRED_STEPS: usize = 3;

/// Finds the loop of a trace without step marks from its allocations' stacks.
///
/// Each allocation's Python frames that are the user's own (outermost first) say which line
/// of each function it came from. Starting at the outermost frame, the walk descends while one
/// line holds most allocations in one unbroken run (`main()` calling `train()` once); at the
/// first level where no line does, that level is the loop body: the number of runs of a line
/// there is the number of times the line ran, the most common such number (at least
/// [`MIN_INFERRED_STEPS`]) is the iteration count, and the line with that count that runs
/// first opens each iteration. Traces whose sites have no stacks use each allocation's own
/// `file:line` at a single level. Stacks with no user frame (C++ only, as on the autograd
/// thread) take no part.
fn infer_steps(snapshot: &Snapshot) -> Option<InferredSteps> {
    let framework = default_framework_paths();
    let with_frames = snapshot.sites.iter().any(|s| !s.frames.is_empty());
    // The user frames of each site, outermost first, as (file, line) keys.
    let mut site_keys: Vec<Vec<(String, u32)>> = Vec::with_capacity(snapshot.sites.len());
    for site in &snapshot.sites {
        let keys = if with_frames {
            site.frames
                .iter()
                .rev()
                .filter(|f| !crate::import::sites::is_framework_frame(f, &framework))
                .map(|f| (f.file.clone(), f.line))
                .collect()
        } else if site.file.is_empty() || site.file == "??" {
            Vec::new()
        } else {
            vec![(site.file.clone(), site.line)]
        };
        site_keys.push(keys);
    }
    let allocs: Vec<(u32, &[(String, u32)])> = snapshot
        .events
        .iter()
        .enumerate()
        .filter(|(_, e)| e.kind == EventKind::Alloc)
        .filter_map(|(i, e)| {
            let keys = site_keys.get(e.site? as usize)?;
            (!keys.is_empty()).then_some((i as u32, keys.as_slice()))
        })
        .collect();
    if allocs.len() < MIN_INFERRED_STEPS {
        return None;
    }
    let mut prefix: Vec<(String, u32)> = Vec::new();
    loop {
        let depth = prefix.len();
        // (key, events, runs, first event index, run starts)
        let mut stats: Vec<((String, u32), usize, Vec<u32>)> = Vec::new();
        let mut index: FxHashMap<(String, u32), usize> = FxHashMap::default();
        let mut previous: Option<usize> = None;
        let mut members = 0usize;
        for &(event, keys) in &allocs {
            if keys.len() <= depth || keys[..depth] != prefix[..] {
                continue;
            }
            members += 1;
            let key = &keys[depth];
            let k = match index.get(key) {
                Some(&k) => k,
                None => {
                    index.insert(key.clone(), stats.len());
                    stats.push((key.clone(), 0, Vec::new()));
                    stats.len() - 1
                }
            };
            stats[k].1 += 1;
            if previous != Some(k) {
                stats[k].2.push(event);
            }
            previous = Some(k);
        }
        if members < MIN_INFERRED_STEPS {
            return None;
        }
        if let Some(dominant) = stats
            .iter()
            .find(|(_, events, runs)| runs.len() <= 2 && events * 2 > members)
        {
            prefix.push(dominant.0.clone());
            continue;
        }
        // The loop level: the most common run count among lines that ran often enough.
        let mut by_count: FxHashMap<usize, usize> = FxHashMap::default();
        for (_, _, runs) in &stats {
            if runs.len() >= MIN_INFERRED_STEPS {
                *by_count.entry(runs.len()).or_default() += 1;
            }
        }
        let (&count, _) = by_count
            .iter()
            .max_by(|a, b| a.1.cmp(b.1).then(a.0.cmp(b.0)))?;
        let opener = stats
            .iter()
            .filter(|(_, _, runs)| runs.len() == count)
            .min_by_key(|(_, _, runs)| runs[0])?;
        return Some(InferredSteps {
            starts: opener.2.clone(),
            opener: format!("{}:{}", opener.0 .0, opener.0 .1),
        });
    }
}

/// The framework path fragments the importers use by default.
pub(crate) fn default_framework_paths() -> Vec<String> {
    crate::import::sites::DEFAULT_FRAMEWORK_PATHS
        .iter()
        .map(|s| s.to_string())
        .collect()
}

/// The innermost frame of the user's own code common to every stack in `sites` (compared
/// from the outermost frame in), or `None` when the stacks have no frames or share no user
/// frame. Stacks without a Python frame (C++ only) take no part.
pub fn common_caller(sites: &[&CallSite]) -> Option<Frame> {
    let framework = default_framework_paths();
    let stacks: Vec<Vec<&Frame>> = sites
        .iter()
        .map(|s| {
            s.frames
                .iter()
                .rev()
                .filter(|f| !is_native_frame(f))
                .collect::<Vec<_>>()
        })
        .filter(|f: &Vec<&Frame>| !f.is_empty())
        .collect();
    let first = stacks.first()?;
    let mut common = first.len();
    for other in &stacks[1..] {
        common = common.min(first.iter().zip(other).take_while(|(a, b)| a == b).count());
    }
    first[..common]
        .iter()
        .rev()
        .find(|f| !crate::import::sites::is_framework_frame(f, &framework))
        .map(|f| (*f).clone())
}

/// A `--step-marker` that matches nothing in the trace, with what the trace offers instead.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StepMarkerError {
    /// The marker asked for.
    pub marker: String,
    /// Names that would work: step-mark labels, annotation names, and the functions seen most
    /// often in the allocations' stacks.
    pub candidates: Vec<String>,
}

impl std::fmt::Display for StepMarkerError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "--step-marker `{}` matches nothing in the trace",
            self.marker
        )?;
        if self.candidates.is_empty() {
            write!(
                f,
                " (it has no annotations, step marks or named frames to choose from)"
            )
        } else {
            write!(f, "; candidates: {}", self.candidates.join(", "))
        }
    }
}

impl std::error::Error for StepMarkerError {}

/// Re-derives the steps of `snapshot` from `marker`: step-mark labels or annotation names that
/// contain it ([`apply_step_marker`]), else a function of that name in the allocations'
/// stacks (each allocation whose stack enters it after one whose stack did not begins a
/// step). Returns the number of steps, or the candidates when nothing matches.
pub fn restep(snapshot: &mut Snapshot, marker: &str) -> Result<usize, StepMarkerError> {
    let found = apply_step_marker(snapshot, marker);
    if found > 0 {
        return Ok(found);
    }
    // A function in the stacks.
    let has: Vec<bool> = snapshot
        .sites
        .iter()
        .map(|s| s.function == marker || s.frames.iter().any(|f| f.function == marker))
        .collect();
    let mut starts: Vec<usize> = Vec::new();
    let mut inside = false;
    for (i, e) in snapshot.events.iter().enumerate() {
        if e.kind != EventKind::Alloc {
            continue;
        }
        let now = e.site.is_some_and(|s| has.get(s as usize) == Some(&true));
        if now && !inside {
            starts.push(i);
        }
        inside = now;
    }
    if !starts.is_empty() {
        let mut marks = Vec::with_capacity(starts.len());
        for (k, &at) in starts.iter().enumerate() {
            let e = &snapshot.events[at];
            marks.push(vramscope_model::StepMark {
                step: k as u64 + 1,
                seq: e.seq,
                time_ns: e.time_ns,
                label: marker.to_string(),
            });
        }
        for (i, e) in snapshot.events.iter_mut().enumerate() {
            e.step = starts.partition_point(|&s| s <= i) as u64;
        }
        snapshot.steps = marks;
        return Ok(starts.len());
    }
    Err(StepMarkerError {
        marker: marker.to_string(),
        candidates: step_marker_candidates(snapshot),
    })
}

/// Names a `--step-marker` could take in `snapshot`: step-mark labels and annotation names
/// (up to 8 distinct), then the user's functions that appear in the most allocation stacks
/// (up to 8).
pub fn step_marker_candidates(snapshot: &Snapshot) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for name in snapshot
        .steps
        .iter()
        .map(|m| &m.label)
        .chain(snapshot.annotations.iter().map(|a| &a.name))
    {
        if !name.is_empty() && !out.contains(name) && out.len() < 8 {
            out.push(name.clone());
        }
    }
    let framework = default_framework_paths();
    let mut counts: FxHashMap<&str, u64> = FxHashMap::default();
    let mut per_site: Vec<Vec<&str>> = Vec::with_capacity(snapshot.sites.len());
    for site in &snapshot.sites {
        let mut names: Vec<&str> = site
            .frames
            .iter()
            .filter(|f| {
                !f.function.is_empty() && !crate::import::sites::is_framework_frame(f, &framework)
            })
            .map(|f| f.function.as_str())
            .collect();
        if site.frames.is_empty() && !site.function.is_empty() {
            names.push(site.function.as_str());
        }
        names.sort_unstable();
        names.dedup();
        per_site.push(names);
    }
    for e in snapshot
        .events
        .iter()
        .filter(|e| e.kind == EventKind::Alloc)
    {
        if let Some(names) = e.site.and_then(|s| per_site.get(s as usize)) {
            for name in names {
                *counts.entry(name).or_default() += 1;
            }
        }
    }
    let mut functions: Vec<(&str, u64)> = counts.into_iter().collect();
    functions.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
    for (name, _) in functions.into_iter().take(8) {
        if !out.iter().any(|o| o == name) {
            out.push(name.to_string());
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use vramscope_testkit::{Trace, MIB};

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
        assert_eq!(iv[0].free_step, Some(1));
        assert!(iv[1].is_live_at_end());
        assert!(iv[2].is_live_at_end());
        assert_eq!(iv[0].addr, iv[2].addr);
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
