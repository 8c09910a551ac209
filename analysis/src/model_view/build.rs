//! The one pass that builds a [`ModelView`]: a [`ModelViewBuilder`] owns every accumulator and
//! is fed the snapshot's events one by one.
//!
//! The builder starts from the step plan of `steps` and the call-site groups.
//! [`ModelViewBuilder::push`] takes one event: it numbers it into a step, pairs it with its
//! allocation (`Pairing`), opens or closes an [`Interval`], and adds it to the tally of its
//! group and step. The engine's walk of the snapshot (`Reconstruction`: the memory state at the
//! start, the end and the peaks, and the usage after every event) does not depend on that pass,
//! so the parent module runs it on a second thread meanwhile. Once every event is in,
//! [`ModelViewBuilder::summarize`] derives what needs every event but not the walk (retained
//! bytes per step, the per-group indexes, the segment summary) while the walk, the longer of
//! the two, finishes; then [`ModelViewBuilder::finish`] keeps the walk's usage after every event
//! (the view's timeline is read from it, not copied), works out the holdings at the end and at
//! the peak, and hands the result to the parent module's [`ModelView`]. A new figure of the
//! view is a new field here, a line in the `record_*` method of its event kind, and a line in
//! `summarize` or `finish`.

use rustc_hash::FxHashMap;
use vramscope_engine::{
    empty_cache_calls, GroupId, Pair, Pairing, Reconstruction, Runs, SiteGroups,
};
use vramscope_model::{BlockState, Event, EventKind, Id, Snapshot, TransferDirection};

use super::steps::{collect_steps, StepPlan};
use super::{ByGroup, Interval, ModelView, SegmentSummary, StepInfo, StepTally, TraceTotals};
use crate::categories::Categories;
use vramscope_engine::MemoryState;

/// Builds a [`ModelView`] from the events of its snapshot, fed in order with
/// [`ModelViewBuilder::push`]. See the module documentation.
pub(super) struct ModelViewBuilder<'a> {
    /// The snapshot whose events are fed in.
    snapshot: &'a Snapshot,
    /// The call-site groups.
    groups: SiteGroups,
    /// How events are numbered into steps.
    plan: StepPlan,
    /// Every step number, in order; a number's position here is its step index.
    step_numbers: Vec<u64>,
    /// The step index of the last event, where the search for the next one starts.
    step_hint: usize,
    /// The steps, by step index.
    steps: Vec<StepInfo>,
    /// The step index of every event fed so far.
    event_step: Runs<u32>,
    /// Pairs frees with their allocations.
    pairing: Pairing,
    /// Every allocation so far, in allocation order.
    intervals: Vec<Interval>,
    /// The open intervals (allocations not freed yet), by the index of their `Alloc` event.
    open_intervals: FxHashMap<u32, u32>,
    /// What each group did in each step, by `(group, step index)`.
    tallies: FxHashMap<(GroupId, u32), StepTally>,
    /// `(group, event index)` of every event a group owns besides its allocations.
    group_extra_events: Vec<(GroupId, u32)>,
    /// Totals over the events fed so far.
    totals: TraceTotals,
    /// Indices of the `Oom` events.
    ooms: Vec<u32>,
}

impl<'a> ModelViewBuilder<'a> {
    /// A builder for the view of `snapshot`, before any event: groups its call sites and
    /// numbers its steps by `plan`.
    pub(super) fn new(snapshot: &'a Snapshot, plan: StepPlan) -> ModelViewBuilder<'a> {
        let groups = SiteGroups::from_sites(&snapshot.sites);
        let (step_numbers, steps) = collect_steps(snapshot, &plan);
        ModelViewBuilder {
            snapshot,
            groups,
            plan,
            step_numbers,
            step_hint: 0,
            steps,
            event_step: Runs::new(),
            pairing: Pairing::new(),
            intervals: Vec::new(),
            open_intervals: FxHashMap::default(),
            tallies: FxHashMap::default(),
            group_extra_events: Vec::new(),
            totals: TraceTotals {
                events: snapshot.events.len() as u64,
                ..TraceTotals::default()
            },
            ooms: Vec::new(),
        }
    }

    /// Takes in event `index` of the snapshot, `event`. The events must come in order, each
    /// once, starting at 0.
    pub(super) fn push(&mut self, index: usize, event: &Event) {
        debug_assert_eq!(index, self.event_step.len(), "events are fed in order");
        let event_index = index as u32;
        let step = self.step_index(self.plan.step_of(index, event));
        self.event_step.push(step);
        let first_event = &mut self.steps[step as usize].first_event;
        if first_event.is_none() {
            *first_event = Some(event_index);
        }
        let group = self.groups.group_of(event.site());
        match (event.kind, self.pairing.push(event_index, event)) {
            (EventKind::Alloc, Pair::Alloc { replaced, .. }) => {
                self.record_alloc(event_index, event, group, step, replaced);
            }
            (_, Pair::Free(link)) if link.ends_allocation => {
                self.record_free(event_index, event, step, link.alloc);
            }
            _ => self.record_other(event_index, event, group, step),
        }
    }

    /// The step index of step number `step`. Consecutive events mostly share a step, so the
    /// last answer is tried before a search.
    fn step_index(&mut self, step: u64) -> u32 {
        if self.step_numbers.get(self.step_hint) != Some(&step) {
            self.step_hint = self.step_numbers.binary_search(&step).unwrap_or(0);
        }
        self.step_hint as u32
    }

    /// An allocation opens an interval; `replaced` is the open allocation at the same address
    /// whose free the trace lost, which this one closes.
    fn record_alloc(
        &mut self,
        event_index: u32,
        event: &Event,
        group: GroupId,
        step: u32,
        replaced: Option<u32>,
    ) {
        if let Some(old) = replaced.and_then(|a| self.open_intervals.remove(&a)) {
            // The trace lost the free of the previous block at this address.
            let old = &mut self.intervals[old as usize];
            old.free_event = Id::new(event_index);
        }
        self.open_intervals
            .insert(event_index, self.intervals.len() as u32);
        self.intervals.push(Interval {
            group,
            alloc_event: event_index,
            free_event: None,
            alloc_step: step,
        });
        let tally = self.tallies.entry((group, step)).or_default();
        tally.allocs += 1;
        tally.alloc_bytes = tally.alloc_bytes.saturating_add(event.size);
        self.totals.allocs += 1;
    }

    /// A free that ends an allocation closes its interval, or, when the trace does not have
    /// the allocation (`alloc` is `None` or already closed), counts as unmatched.
    fn record_free(&mut self, event_index: u32, event: &Event, step: u32, alloc: Option<u32>) {
        match alloc.and_then(|a| self.open_intervals.remove(&a)) {
            Some(at) => {
                let interval = &mut self.intervals[at as usize];
                interval.free_event = Id::new(event_index);
                let tally = self.tallies.entry((interval.group, step)).or_default();
                tally.frees += 1;
                let size = interval.alloc(&self.snapshot.events).size;
                tally.free_bytes = tally.free_bytes.saturating_add(size);
                self.totals.frees += 1;
            }
            None => {
                self.totals.unmatched_frees += 1;
                self.totals.unmatched_free_bytes =
                    self.totals.unmatched_free_bytes.saturating_add(event.size);
            }
        }
    }

    /// Segment events, `empty_cache()` calls, OOMs, transfers and syncs: each counts in its
    /// group's tally and the totals, and joins the group's events. Other events (a free
    /// completion after its request, an allocation the pairing refused) count nowhere.
    fn record_other(&mut self, event_index: u32, event: &Event, group: GroupId, step: u32) {
        let totals = &mut self.totals;
        match event.kind {
            EventKind::SegmentAlloc | EventKind::SegmentMap => {
                let tally = self.tallies.entry((group, step)).or_default();
                tally.segment_allocs += 1;
                tally.segment_alloc_bytes = tally.segment_alloc_bytes.saturating_add(event.size);
                totals.segment_allocs += 1;
            }
            EventKind::SegmentFree | EventKind::SegmentUnmap => {
                let tally = self.tallies.entry((group, step)).or_default();
                tally.segment_frees += 1;
                tally.segment_free_bytes = tally.segment_free_bytes.saturating_add(event.size);
                totals.segment_frees += 1;
            }
            EventKind::EmptyCache => {
                self.tallies.entry((group, step)).or_default().empty_cache += 1;
                totals.empty_cache += 1;
            }
            EventKind::Oom => {
                self.tallies.entry((group, step)).or_default().ooms += 1;
                totals.ooms += 1;
                self.ooms.push(event_index);
            }
            EventKind::Transfer(direction) => {
                let tally = self.tallies.entry((group, step)).or_default();
                count_transfer(direction, event.size, tally, totals);
            }
            EventKind::Sync => {
                self.tallies.entry((group, step)).or_default().syncs += 1;
                totals.syncs += 1;
            }
            _ => return,
        }
        self.group_extra_events.push((group, event_index));
    }

    /// What the view derives from every event without the engine's walk, once all the
    /// snapshot's events are in: the part of the view that can be worked out while the walk is
    /// still going on another thread ([`ModelView::new`] calls it before it waits for the
    /// walk).
    pub(super) fn summarize(&mut self) -> Summaries {
        self.totals.lost_frees = self.pairing.lost_frees();
        self.count_retained();
        let group_intervals = self.intervals_by_group();
        let group_events = self.extra_events_by_group();
        let (step_totals, group_steps) = self.tallies_by_step_and_group();
        Summaries {
            group_intervals,
            group_events,
            step_totals,
            group_steps,
            empty_cache_calls: empty_cache_calls(self.snapshot),
            segments: summarize_segments(self.snapshot),
        }
    }

    /// The view of every event fed so far, from `summaries` ([`ModelViewBuilder::summarize`])
    /// and `walk`, the engine's walk of the same snapshot.
    pub(super) fn finish(
        self,
        summaries: Summaries,
        walk: Reconstruction,
        categories: Categories,
    ) -> ModelView<'a> {
        let Summaries {
            group_intervals,
            group_events,
            step_totals,
            group_steps,
            empty_cache_calls,
            segments,
        } = summaries;
        // The walk's own state at the peak, whose blocks add up to the peak it found.
        let at_peak = walk
            .peak_allocated
            .event
            .map(|at| walk.state_walked(&self.snapshot.events, at as usize + 1));
        let known_reserved = |bytes: u64| if walk.reserved_known { bytes } else { 0 };
        let group_categories_at_peak =
            categories.by_group_in_state(at_peak.as_ref().unwrap_or(&walk.start), &self.groups);
        let group_categories_at_end = categories.by_group_in_state(&walk.end, &self.groups);
        let mut view = ModelView {
            snapshot: self.snapshot,
            groups: self.groups,
            intervals: self.intervals,
            group_intervals,
            group_events,
            steps: self.steps,
            event_step: self.event_step,
            step_totals,
            group_steps,
            usage: walk.usage,
            start_usage: walk.start.usage(),
            reserved_known: walk.reserved_known,
            peak_allocated: walk.peak_allocated.bytes,
            peak_allocated_event: walk.peak_allocated.event,
            peak_reserved: known_reserved(walk.peak_reserved.bytes),
            peak_reserved_event: walk.peak_reserved.event,
            end_allocated: walk.end.allocated,
            end_reserved: known_reserved(walk.end.reserved),
            totals: self.totals,
            ooms: self.ooms,
            live_end: Vec::new(),
            live_peak: Vec::new(),
            segments,
            step_source: self.plan.source,
            empty_cache_calls,
            categories_at_peak: categories.in_state(at_peak.as_ref().unwrap_or(&walk.start)),
            categories_at_end: categories.in_state(&walk.end),
            group_categories_at_peak,
            group_categories_at_end,
            categories,
            start: MemoryState::default(),
            disagreements: Default::default(),
        };
        view.live_end = view.holdings_in(&walk.end);
        view.live_peak = view.holdings_in(at_peak.as_ref().unwrap_or(&walk.start));
        view.start = walk.start;
        view.disagreements = walk.disagreements;
        view
    }

    /// Blocks still live at the end count as retained by the step that allocated them.
    fn count_retained(&mut self) {
        for interval in self.intervals.iter().filter(|iv| iv.is_live_at_end()) {
            let tally = self
                .tallies
                .entry((interval.group, interval.alloc_step))
                .or_default();
            tally.retained += 1;
            let size = interval.alloc(&self.snapshot.events).size;
            tally.retained_bytes = tally.retained_bytes.saturating_add(size);
        }
    }

    /// Indices into the intervals of each group's allocations, in order, by group id.
    fn intervals_by_group(&self) -> ByGroup {
        ByGroup::new(self.groups.len(), || {
            self.intervals
                .iter()
                .enumerate()
                .map(|(i, interval)| (interval.group, i as u32))
        })
    }

    /// Indices of each group's events besides its allocations, in order, by group id.
    fn extra_events_by_group(&mut self) -> ByGroup {
        let extra = std::mem::take(&mut self.group_extra_events);
        ByGroup::new(self.groups.len(), || extra.iter().copied())
    }

    /// The tallies summed per step (by step index), and per group as `(step index, tally)`
    /// in step order (by group id).
    fn tallies_by_step_and_group(&mut self) -> (Vec<StepTally>, Vec<Vec<(u32, StepTally)>>) {
        let mut step_totals = vec![StepTally::default(); self.steps.len()];
        let mut group_steps: Vec<Vec<(u32, StepTally)>> = vec![Vec::new(); self.groups.len()];
        for ((group, step), tally) in std::mem::take(&mut self.tallies) {
            step_totals[step as usize].add(&tally);
            group_steps[group as usize].push((step, tally));
        }
        for list in &mut group_steps {
            list.sort_unstable_by_key(|(step, _)| *step);
        }
        (step_totals, group_steps)
    }
}

/// What [`ModelViewBuilder::summarize`] derives before the engine's walk is needed, for
/// [`ModelViewBuilder::finish`].
pub(super) struct Summaries {
    group_intervals: ByGroup,
    group_events: ByGroup,
    step_totals: Vec<StepTally>,
    group_steps: Vec<Vec<(u32, StepTally)>>,
    empty_cache_calls: Vec<vramscope_engine::EmptyCacheCall>,
    segments: SegmentSummary,
}

/// Counts one transfer of `bytes` in `direction` in a group's step tally and in the totals.
fn count_transfer(
    direction: TransferDirection,
    bytes: u64,
    tally: &mut StepTally,
    totals: &mut TraceTotals,
) {
    match direction {
        TransferDirection::HostToDevice => {
            tally.h2d += 1;
            tally.h2d_bytes = tally.h2d_bytes.saturating_add(bytes);
            totals.h2d_bytes = totals.h2d_bytes.saturating_add(bytes);
        }
        TransferDirection::DeviceToHost => {
            tally.d2h += 1;
            tally.d2h_bytes = tally.d2h_bytes.saturating_add(bytes);
            totals.d2h_bytes = totals.d2h_bytes.saturating_add(bytes);
        }
        TransferDirection::DeviceToDevice => {
            tally.d2d += 1;
            tally.d2d_bytes = tally.d2d_bytes.saturating_add(bytes);
        }
    }
    totals.transfers += 1;
}

/// Figures about the segments of `snapshot` at the time it was taken.
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
