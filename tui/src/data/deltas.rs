//! The changes between the states of the engine's walk at evenly spaced positions (bounds),
//! kept so that a jump of the cursor across many events replays what changed between the
//! bounds instead of every event.
//!
//! On a replica of a real trace (issue 47: 10M events, 172,000 live blocks) a jump from the
//! nearest checkpoint replayed up to a million events, 16-20 ms, though most of them allocate
//! and free blocks that live a few hundred events: between two positions 65,536 events
//! apart, at most 1,721 blocks differ, and 210,000 over the whole trace. [`Deltas`] keeps, for
//! every stretch between two bounds, each address whose block differs at its ends (the block
//! before and after), each segment that differs, and the totals at every bound. Applying a
//! stretch's changes to the state at one end gives the state at the other exactly, in either
//! direction: the changes are taken from the walk's own states, so they hold on a trace that
//! contradicts itself too, where applying its events forwards would part from the walk.
//!
//! The changes are gathered during the walk that loads the dataset ([`DeltaBuilder`]): at
//! each bound, the blocks at the addresses the events of the two stretches beside it touch,
//! and the segments where those stretches have segment events.

use std::collections::BTreeMap;
use std::sync::Arc;

use rustc_hash::{FxHashMap, FxHashSet};
use vramscope_engine::{LiveBlock, MemoryState, SegmentInfo};
use vramscope_model::{Event, EventKind};

use super::sums::Batch;

/// A block's change at an address between two bounds: its address, the block before and the
/// block after.
type BlockChange = (u64, Option<LiveBlock>, Option<LiveBlock>);

/// A segment's change between two bounds: its address, the segment before and after.
type SegmentChange = (u64, Option<SegmentInfo>, Option<SegmentInfo>);

/// The changes of one stretch: its blocks' and its segments'.
type Stretch = (Box<[BlockChange]>, Box<[SegmentChange]>);

/// The totals of a state that its blocks and segments do not give back by themselves (they
/// are kept as the events left them, saturating where a trace contradicts itself).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Totals {
    allocated: u64,
    active: u64,
    reserved: u64,
    requested: u64,
}

impl Totals {
    fn of(state: &MemoryState) -> Totals {
        Totals {
            allocated: state.allocated,
            active: state.active,
            reserved: state.reserved,
            requested: state.requested,
        }
    }

    fn put(self, state: &mut MemoryState) {
        state.allocated = self.allocated;
        state.active = self.active;
        state.reserved = self.reserved;
        state.requested = self.requested;
    }
}

/// The changes between the walk's states at the bounds. See the module documentation.
#[derive(Clone, Debug, Default)]
pub struct Deltas {
    /// The positions the changes are kept between, ascending: `0`, a multiple of the spacing
    /// after another, and the last loaded position. Empty when there are none.
    bounds: Vec<usize>,
    /// The totals at each bound.
    totals: Vec<Totals>,
    /// The blocks that differ between each bound and the next.
    blocks: Vec<Box<[BlockChange]>>,
    /// The segments that differ between each bound and the next.
    segments: Vec<Box<[SegmentChange]>>,
    /// How many changes the stretches before each bound hold together: what crossing from
    /// one bound to another costs.
    before: Vec<usize>,
}

impl Deltas {
    /// The bounds at or just below and at or just above `pos` (one index twice where `pos`
    /// is a bound), as indices; `None` beyond the last bound.
    pub fn around(&self, pos: usize) -> Option<[usize; 2]> {
        let above = self.bounds.partition_point(|&b| b < pos);
        if above == self.bounds.len() {
            return None;
        }
        if self.bounds[above] == pos {
            return Some([above, above]);
        }
        Some([above.checked_sub(1)?, above])
    }

    /// How many bounds there are.
    #[cfg(test)]
    pub fn bounds(&self) -> usize {
        self.bounds.len()
    }

    /// The position of bound `i`.
    pub fn bound(&self, i: usize) -> usize {
        self.bounds[i]
    }

    /// How many changes going from bound `i` to bound `j` applies.
    pub fn changes(&self, i: usize, j: usize) -> usize {
        self.before[i.max(j)] - self.before[i.min(j)]
    }

    /// Brings `state`, the state at bound `from`, to the state at bound `to`, noting what it
    /// changes in `batch` (for the sums moved with it) where there is one.
    pub fn cross(
        &self,
        state: &mut MemoryState,
        mut batch: Option<&mut Batch>,
        from: usize,
        to: usize,
    ) {
        if from == to {
            return;
        }
        let forwards = from < to;
        let stretches: Box<dyn Iterator<Item = usize>> = if forwards {
            Box::new(from..to)
        } else {
            Box::new((to..from).rev())
        };
        for s in stretches {
            for &(addr, before, after) in self.blocks[s].iter() {
                let block = if forwards { after } else { before };
                match batch.as_deref_mut() {
                    Some(batch) => batch.set_block(state, addr, block),
                    None => state.blocks.set(addr, block),
                }
            }
            for &(addr, before, after) in self.segments[s].iter() {
                let segment = if forwards { after } else { before };
                if let Some(batch) = batch.as_deref_mut() {
                    batch.segment_changed(addr);
                }
                match segment {
                    Some(segment) => state.segments.insert(addr, segment),
                    None => state.segments.remove(&addr),
                };
            }
        }
        self.totals[to].put(state);
    }
}

/// A stretch between two bounds while its changes are gathered.
#[derive(Default)]
struct Open {
    /// The addresses its block events touch: every block that can differ at its ends.
    addrs: Vec<u64>,
    /// The blocks at `addrs` at its start and end, once seen.
    before: Option<Vec<Option<LiveBlock>>>,
    after: Option<Vec<Option<LiveBlock>>>,
    /// Whether any of its events is about segments, and then the segments at its ends.
    segment_events: bool,
    segments_before: Option<Arc<BTreeMap<u64, SegmentInfo>>>,
    segments_after: Option<Arc<BTreeMap<u64, SegmentInfo>>>,
}

/// Gathers [`Deltas`] from the walk's states at the bounds, seen in any order (the walk goes
/// backwards; its start and end come last). See the module documentation.
pub struct DeltaBuilder<'a> {
    events: &'a [Event],
    every: usize,
    bounds: Vec<usize>,
    totals: Vec<Option<Totals>>,
    open: FxHashMap<usize, Open>,
    done: Vec<Option<Stretch>>,
}

impl<'a> DeltaBuilder<'a> {
    /// A builder for the changes of `events` between bounds `every` events apart; none where
    /// that would make fewer than two stretches.
    pub fn new(events: &'a [Event], every: usize) -> DeltaBuilder<'a> {
        let n = events.len();
        let every = every.max(1);
        let mut bounds: Vec<usize> = (0..n).step_by(every).collect();
        bounds.push(n);
        if bounds.len() < 3 {
            bounds.clear();
        }
        let stretches = bounds.len().saturating_sub(1);
        DeltaBuilder {
            events,
            every,
            totals: vec![None; bounds.len()],
            done: (0..stretches).map(|_| None).collect(),
            bounds,
            open: FxHashMap::default(),
        }
    }

    /// Whether the walk's state at `pos` is one this builder takes.
    pub fn wants(&self, pos: usize) -> bool {
        !self.bounds.is_empty() && (pos.is_multiple_of(self.every) || pos == self.events.len())
    }

    /// Takes the walk's state at `pos`, a bound ([`DeltaBuilder::wants`]).
    pub fn observe(&mut self, pos: usize, state: &MemoryState) {
        if !self.wants(pos) {
            return;
        }
        let Ok(b) = self.bounds.binary_search(&pos) else {
            return;
        };
        self.totals[b] = Some(Totals::of(state));
        let stretches = self.done.len();
        let below = b.checked_sub(1);
        let above = (b < stretches).then_some(b);
        let mut segments = None;
        for s in below.into_iter().chain(above) {
            let open = self.open.entry(s).or_insert_with(|| {
                let (from, to) = (self.bounds[s], self.bounds[s + 1]);
                open_stretch(&self.events[from..to])
            });
            let blocks = open
                .addrs
                .iter()
                .map(|&a| state.blocks.get(a).copied())
                .collect();
            let segs = open.segment_events.then(|| {
                Arc::clone(segments.get_or_insert_with(|| Arc::new(state.segments.clone())))
            });
            if Some(s) == above {
                open.before = Some(blocks);
                open.segments_before = segs;
            } else {
                open.after = Some(blocks);
                open.segments_after = segs;
            }
            if open.before.is_some() && open.after.is_some() {
                let open = self.open.remove(&s).unwrap_or_default();
                self.done[s] = Some(close(open));
            }
        }
    }

    /// The changes gathered; none unless every bound was seen.
    pub fn finish(self) -> Deltas {
        let totals: Option<Vec<Totals>> = self.totals.into_iter().collect();
        let done: Option<Vec<_>> = self.done.into_iter().collect();
        let (Some(totals), Some(done)) = (totals, done) else {
            return Deltas::default();
        };
        if self.bounds.is_empty() {
            return Deltas::default();
        }
        let mut before = Vec::with_capacity(self.bounds.len());
        let mut held = 0;
        before.push(0);
        let (mut blocks, mut segments) = (Vec::new(), Vec::new());
        for (b, s) in done {
            held += b.len() + s.len();
            before.push(held);
            blocks.push(b);
            segments.push(s);
        }
        Deltas {
            bounds: self.bounds,
            totals,
            blocks,
            segments,
            before,
        }
    }
}

/// A stretch of `events`, its changes yet to be gathered: the addresses of its block events,
/// and whether it has segment events.
fn open_stretch(events: &[Event]) -> Open {
    let mut addrs = FxHashSet::default();
    let mut segment_events = false;
    for e in events {
        match e.kind {
            EventKind::Alloc | EventKind::FreeRequested | EventKind::FreeCompleted => {
                addrs.insert(e.addr);
            }
            EventKind::SegmentAlloc
            | EventKind::SegmentFree
            | EventKind::SegmentMap
            | EventKind::SegmentUnmap => segment_events = true,
            _ => {}
        }
    }
    Open {
        addrs: addrs.into_iter().collect(),
        segment_events,
        ..Open::default()
    }
}

/// The changes of a stretch whose ends were both seen.
fn close(open: Open) -> Stretch {
    let (before, after) = (
        open.before.unwrap_or_default(),
        open.after.unwrap_or_default(),
    );
    let blocks = open
        .addrs
        .iter()
        .zip(before)
        .zip(after)
        .filter(|((_, b), a)| b != a)
        .map(|((&addr, b), a)| (addr, b, a))
        .collect();
    let segments = match (&open.segments_before, &open.segments_after) {
        (Some(b), Some(a)) => segment_changes(b, a),
        _ => Vec::new(),
    };
    (blocks, segments.into_boxed_slice())
}

/// The segments that differ between `before` and `after`, by a merge of the two.
fn segment_changes(
    before: &BTreeMap<u64, SegmentInfo>,
    after: &BTreeMap<u64, SegmentInfo>,
) -> Vec<SegmentChange> {
    let mut out = Vec::new();
    let mut b = before.iter().peekable();
    let mut a = after.iter().peekable();
    loop {
        match (b.peek(), a.peek()) {
            (None, None) => break,
            (Some(&(&kb, &sb)), Some(&(&ka, &sa))) if kb == ka => {
                if sb != sa {
                    out.push((kb, Some(sb), Some(sa)));
                }
                b.next();
                a.next();
            }
            (Some(&(&kb, &sb)), Some(&(&ka, _))) if kb < ka => {
                out.push((kb, Some(sb), None));
                b.next();
            }
            (Some(&(&kb, &sb)), None) => {
                out.push((kb, Some(sb), None));
                b.next();
            }
            (_, Some(&(&ka, &sa))) => {
                out.push((ka, None, Some(sa)));
                a.next();
            }
        }
    }
    out
}
