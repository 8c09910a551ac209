//! What the dashboard's panels sum over the live blocks of a state, kept beside the states of
//! `super::Dataset` (its checkpoints, the head and the state at the cursor) and moved with
//! them event by event.
//!
//! Summing every live block at each cursor move cost a pass over 172,000 blocks on a replica
//! of a real trace (issue 47). A [`Sums`] is made whole once for a checkpoint, the first time a
//! move starts from it; a move then changes the sums by the blocks its events add, replace or
//! take out, and works out again only the segments those blocks lie in and those its segment
//! events add, free, map or unmap (all of them where two segments overlap). A run of events (a
//! jump of the cursor) is gathered first ([`Batch`]), so the sums take each address's change
//! once, however many of its events touched it. Every figure is a sum or a least or greatest
//! over blocks or segments, kept so that a block or segment taken out takes its part out
//! exactly (sums in 128 bits, extremes as multisets), so the figures equal those summed from
//! the state itself, in any order of moves: the tests compare them at random cursors.

use std::collections::BTreeMap;
use std::ops::Bound;
use std::sync::Arc;

use rustc_hash::FxHashMap;
use vramscope_analysis::call_tree::{TreeKeys, TreeSums};
use vramscope_analysis::categories::Categories;
use vramscope_analysis::model_view::HoldingSums;
use vramscope_engine::{LiveBlock, MemoryState};
use vramscope_model::{Event, EventKind};

use crate::view::SegmentFigures;

/// Past this many blocks and segments changed since the segment figures were brought up to
/// date, beyond a quarter of the live blocks, the figures are worked out again whole rather
/// than segment by segment.
const DIRTY_MAX: usize = 4096;

/// Past this many changes noted one event at a time ([`Sums::track`]), they are no longer
/// noted and the figures are worked out again whole: a bound on the list's memory.
const NOTED_MAX: usize = 1 << 16;

/// What the memory panel's call tree is summed with: the keys of the snapshot's tables and
/// the classification of its allocations, made together (`crate::app` makes them when it
/// classifies). Sums made with other ones are worked out again.
#[derive(Debug)]
pub struct TreeContext {
    /// The snapshot's marks, tags and sites, as the tree reads them.
    pub keys: TreeKeys,
    /// What each block is, or `None` (blocks from before the trace `before_trace`, the rest
    /// `unknown`).
    pub categories: Option<Arc<Categories>>,
}

/// The sums of one state. See the module documentation.
#[derive(Clone, Debug, Default)]
pub struct Sums {
    holdings: HoldingSums,
    /// The call tree's sums, with the context they were made with, once asked for.
    tree: Option<(Arc<TreeContext>, TreeSums)>,
    segments: SegmentSums,
    /// Addresses whose block changed since the segment figures were brought up to date.
    dirty: Vec<u64>,
    /// The addresses of segments that an event about segments may have added, removed or
    /// changed since then.
    touched: Vec<u64>,
    /// Whether every figure is to be worked out again (too many changes to go one by one).
    whole: bool,
}

/// The segment figures of a state, by segment.
#[derive(Clone, Debug, Default)]
struct SegmentSums {
    /// Each segment's part: its split bytes and largest free range
    /// ([`SegmentFigures::of_segment`]).
    by_segment: FxHashMap<u64, (u64, u64)>,
    /// How many segments have each largest free range.
    largest: BTreeMap<u64, u64>,
    /// The split bytes of every segment, wrapping as [`SegmentFigures::from_state`] sums them.
    split: u64,
    /// Whether two segments overlap (a trace that contradicts itself): then a block may lie
    /// in more than one, and the figures are worked out whole.
    overlap: bool,
}

impl SegmentSums {
    fn of_state(state: &MemoryState) -> SegmentSums {
        let mut sums = SegmentSums::default();
        let mut end = None;
        for (&addr, seg) in &state.segments {
            sums.overlap |= end.is_some_and(|e: u64| e > addr);
            end = Some(addr.saturating_add(seg.size));
            sums.put(addr, SegmentFigures::of_segment(state, addr, seg.size));
        }
        sums
    }

    /// Sets the part of the segment at `addr`, replacing the one it had.
    fn put(&mut self, addr: u64, part: (u64, u64)) {
        self.remove(addr);
        self.by_segment.insert(addr, part);
        self.split = self.split.wrapping_add(part.0);
        *self.largest.entry(part.1).or_insert(0) += 1;
    }

    /// Takes out the part of the segment at `addr`, if it has one.
    fn remove(&mut self, addr: u64) {
        if let Some(old) = self.by_segment.remove(&addr) {
            self.split = self.split.wrapping_sub(old.0);
            if let Some(n) = self.largest.get_mut(&old.1) {
                *n -= 1;
                if *n == 0 {
                    self.largest.remove(&old.1);
                }
            }
        }
    }
}

impl Sums {
    /// The sums of `state`: a pass over its blocks and segments.
    pub fn of_state(state: &MemoryState) -> Sums {
        Sums {
            holdings: HoldingSums::of_state(state),
            tree: None,
            segments: SegmentSums::of_state(state),
            dirty: Vec::new(),
            touched: Vec::new(),
            whole: false,
        }
    }

    /// Notes the addresses of the segments an event about the range `[addr, addr + size)`
    /// can add, remove or change (`MemoryState`'s segment events and their undoing): the
    /// segment below `addr`, which a mapped range joins or an unmapped one cuts, and every
    /// one from `addr` to the end of the range, where a segment is freed or a run joins.
    fn touch_segments(&mut self, state: &MemoryState, addr: u64, size: u64) {
        touch_segments(&mut self.touched, state, addr, size);
    }

    /// Whether the changes noted are too many to go one by one: then every figure is
    /// worked out again at [`Sums::settle`], and no more are noted.
    fn too_many(&mut self) {
        if self.dirty.len() + self.touched.len() > NOTED_MAX {
            self.whole = true;
            self.dirty = Vec::new();
            self.touched = Vec::new();
        }
    }

    /// Runs `step` (event `e` applied to `state` or undone from it; `events` are the trace's,
    /// `e` among them) and takes its change into the sums: the block at the event's address
    /// before and after it (an allocation, a free request or a free changes that block
    /// alone), or, for an event about segments, the segments it may change (it changes no
    /// block).
    pub fn track(
        &mut self,
        state: &mut MemoryState,
        events: &[Event],
        e: &Event,
        step: impl FnOnce(&mut MemoryState),
    ) {
        match e.kind {
            EventKind::Alloc | EventKind::FreeRequested | EventKind::FreeCompleted => {
                let before = state.blocks.get(e.addr).copied();
                step(state);
                let after = state.blocks.get(e.addr).copied();
                if before != after {
                    self.holdings.change(before.as_ref(), after.as_ref());
                    if let Some((context, tree)) = &mut self.tree {
                        Sums::change_tree(context, tree, events, e.addr, before, after);
                    }
                    if !self.whole {
                        self.dirty.push(e.addr);
                        self.too_many();
                    }
                }
            }
            EventKind::SegmentAlloc
            | EventKind::SegmentFree
            | EventKind::SegmentMap
            | EventKind::SegmentUnmap => {
                if self.whole {
                    step(state);
                } else {
                    self.touch_segments(state, e.addr, e.size);
                    step(state);
                    self.touch_segments(state, e.addr, e.size);
                    self.too_many();
                }
            }
            EventKind::EmptyCache
            | EventKind::Oom
            | EventKind::Transfer(_)
            | EventKind::Sync
            | EventKind::Step
            | EventKind::Snapshot => step(state),
        }
    }

    /// Brings the segment figures up to date with `state`, the state the sums are of: the
    /// segments holding the blocks that changed, or all of them after the segments changed.
    pub fn settle(&mut self, state: &MemoryState) {
        let changed = !self.dirty.is_empty() || !self.touched.is_empty();
        let many = self.dirty.len() + self.touched.len() > state.blocks.len() / 4 + DIRTY_MAX;
        if self.whole || many || (changed && (self.segments.overlap || self.overlaps(state))) {
            self.segments = SegmentSums::of_state(state);
        } else if changed {
            // The segments noted, as they are now: each worked out again, or gone.
            let mut redo = std::mem::take(&mut self.touched);
            redo.sort_unstable();
            redo.dedup();
            for &addr in &redo {
                match state.segments.get(&addr) {
                    Some(seg) => {
                        let part = SegmentFigures::of_segment(state, addr, seg.size);
                        self.segments.put(addr, part);
                    }
                    None => self.segments.remove(addr),
                }
            }
            // The segments holding the blocks that changed (no two segments overlap, so
            // each block lies in one at most).
            let mut dirty = std::mem::take(&mut self.dirty);
            dirty.sort_unstable();
            let mut done = None;
            for a in dirty {
                let Some((&addr, seg)) = state.segments.range(..=a).next_back() else {
                    continue;
                };
                if addr.saturating_add(seg.size) <= a
                    || done == Some(addr)
                    || redo.binary_search(&addr).is_ok()
                {
                    continue;
                }
                done = Some(addr);
                let part = SegmentFigures::of_segment(state, addr, seg.size);
                self.segments.put(addr, part);
            }
        }
        self.dirty.clear();
        self.touched.clear();
        self.whole = false;
    }

    /// Whether a segment noted as touched overlaps the one before or after it now.
    fn overlaps(&self, state: &MemoryState) -> bool {
        self.touched.iter().any(|&addr| {
            let Some(seg) = state.segments.get(&addr) else {
                return false;
            };
            let before = state.segments.range(..addr).next_back();
            let after = state
                .segments
                .range((Bound::Excluded(addr), Bound::Unbounded))
                .next();
            before.is_some_and(|(&b, s)| b.saturating_add(s.size) > addr)
                || after.is_some_and(|(&a, _)| addr.saturating_add(seg.size) > a)
        })
    }

    /// Takes in the changes `batch` gathered, the events it saw having brought the state these
    /// sums are of to `state` (`events` are the trace's): each address's block before the
    /// first of them against its block now.
    pub fn take(&mut self, batch: Batch, state: &MemoryState, events: &[Event]) {
        for (addr, before) in batch.before {
            let after = state.blocks.get(addr).copied();
            if before == after {
                continue;
            }
            self.holdings.change(before.as_ref(), after.as_ref());
            if let Some((context, tree)) = &mut self.tree {
                Sums::change_tree(context, tree, events, addr, before, after);
            }
            if !self.whole {
                self.dirty.push(addr);
            }
        }
        if !self.whole {
            self.touched.extend(batch.segments);
        }
        self.too_many();
    }

    /// Replaces `before` with `after`, the block at `addr`, in the call tree's sums.
    fn change_tree(
        context: &TreeContext,
        tree: &mut TreeSums,
        events: &[Event],
        addr: u64,
        before: Option<LiveBlock>,
        after: Option<LiveBlock>,
    ) {
        let categories = context.categories.as_deref();
        if let Some(b) = &before {
            tree.remove(&context.keys, categories, events, addr, b);
        }
        if let Some(a) = &after {
            tree.add(&context.keys, categories, events, addr, a);
        }
    }

    /// Makes the call tree's sums of `state` (a state of the trace of `events`, the one these
    /// sums are of) with `context`, unless they were made with it.
    pub fn ensure_tree(
        &mut self,
        context: &Arc<TreeContext>,
        events: &[Event],
        state: &MemoryState,
    ) {
        if matches!(&self.tree, Some((c, _)) if Arc::ptr_eq(c, context)) {
            return;
        }
        let categories = context.categories.as_deref();
        let tree = TreeSums::of_state(&context.keys, categories, events, state);
        self.tree = Some((Arc::clone(context), tree));
    }

    /// The call tree's sums and the context they were made with, once made
    /// ([`Sums::ensure_tree`]).
    pub fn tree(&self) -> Option<(&TreeContext, &TreeSums)> {
        self.tree.as_ref().map(|(c, t)| (&**c, t))
    }

    /// Whether [`Sums::settle`] has nothing left to do.
    pub fn settled(&self) -> bool {
        self.dirty.is_empty() && self.touched.is_empty() && !self.whole
    }

    /// The allocated blocks by site.
    pub fn holdings(&self) -> &HoldingSums {
        &self.holdings
    }

    /// The segment figures of `state`, the state the sums are of, once settled: equal to
    /// [`SegmentFigures::from_state`].
    pub fn segment_figures(&self, state: &MemoryState) -> SegmentFigures {
        debug_assert!(self.settled(), "the sums were not settled");
        SegmentFigures {
            count: state.segments.len() as u64,
            split_bytes: self.segments.split,
            largest_free: self
                .segments
                .largest
                .keys()
                .next_back()
                .copied()
                .unwrap_or(0),
        }
    }
}

/// Notes in `touched` the addresses of the segments an event about the range
/// `[addr, addr + size)` can add, remove or change ([`Sums::track`]).
fn touch_segments(touched: &mut Vec<u64>, state: &MemoryState, addr: u64, size: u64) {
    let below = state.segments.range(..addr).next_back().map(|(&a, _)| a);
    let from = state
        .segments
        .range(addr..=addr.saturating_add(size))
        .map(|(&a, _)| a);
    touched.extend(below.into_iter().chain(from));
}

/// The changes a run of events makes to a state, gathered while they are applied or undone
/// and taken into its sums once at the end ([`Sums::take`]): the block each address held
/// before the first event that touched it, and the segments the segment events touched. A
/// long run (a jump of the cursor) touches the same addresses again and again; this costs a
/// lookup in a small map per event and the sums' work once per address.
#[derive(Debug, Default)]
pub struct Batch {
    before: FxHashMap<u64, Option<LiveBlock>>,
    segments: Vec<u64>,
}

impl Batch {
    /// Runs `step` (event `e` applied to `state` or undone from it), noting what it changes.
    pub fn step(
        &mut self,
        state: &mut MemoryState,
        e: &Event,
        step: impl FnOnce(&mut MemoryState),
    ) {
        match e.kind {
            EventKind::Alloc | EventKind::FreeRequested | EventKind::FreeCompleted => {
                self.before
                    .entry(e.addr)
                    .or_insert_with(|| state.blocks.get(e.addr).copied());
                step(state);
            }
            EventKind::SegmentAlloc
            | EventKind::SegmentFree
            | EventKind::SegmentMap
            | EventKind::SegmentUnmap => {
                touch_segments(&mut self.segments, state, e.addr, e.size);
                step(state);
                touch_segments(&mut self.segments, state, e.addr, e.size);
            }
            EventKind::EmptyCache
            | EventKind::Oom
            | EventKind::Transfer(_)
            | EventKind::Sync
            | EventKind::Step
            | EventKind::Snapshot => step(state),
        }
    }

    /// Puts `block` at `addr` in `state` (or takes the block there out), a change recorded
    /// between two states (`super::deltas`), noting the block it replaces.
    pub fn set_block(&mut self, state: &mut MemoryState, addr: u64, block: Option<LiveBlock>) {
        self.before
            .entry(addr)
            .or_insert_with(|| state.blocks.get(addr).copied());
        state.blocks.set(addr, block);
    }

    /// Notes that the segment at `addr` was added, removed or changed.
    pub fn segment_changed(&mut self, addr: u64) {
        self.segments.push(addr);
    }
}
