//! The data of the HTML explorer: memory over time in bands by call site, and the state at a
//! few moments, precomputed from the engine so that the page only draws.
//!
//! [`ExplorerData::build`] follows the engine walk's own states
//! (`vramscope_engine::Reconstruction`): the bands change where the walk's live blocks change
//! ([`Reconstruction::block_changes_back`]) and the moments are its states there, with live
//! blocks grouped by the engine's [`SiteGroups`]. So every figure on the page is the
//! report's, even on a trace that contradicts itself: allocated bytes are block sizes, memory
//! from before the trace counts under its site or under "before the trace", and the band
//! values of every column sum to its allocated bytes (at the peak, to the peak). The size of
//! the result is bounded whatever the trace's length: at most [`MAX_BUCKETS`] columns of at
//! most [`MAX_SERIES`] sites plus "other" and "before the trace", and a few [`Moment`]s (the
//! peak, the peak of reserved bytes, the end and evenly spaced ones between) whose block lists
//! are capped and whose segment maps keep the [`MAX_SEGMENT_ROWS`] rows the page draws, in
//! the compact form of [`compact`], so that the page does not grow with the number of
//! segments; the blocks name at most [`MAX_BLOCK_GROUPS`] groups, and the page carries at
//! most [`MAX_STEPS`] step marks.
//!
//! What the memory is made of (issue 46): [`ExplorerData::categories`] holds the allocated bytes
//! of every column by `vramscope_model::Category` (the model view's classification, read at
//! each column's position, so each column's categories sum to its allocated bytes), and each
//! [`Moment`] the live bytes by the user's call tree there (`crate::call_tree`, at most
//! [`MAX_TREE_NODES`] nodes), which the page draws as an icicle.

pub mod compact;

use rustc_hash::FxHashMap;
use serde::Serialize;
use vramscope_model::{Category, CategoryBytes, Event, Pool, Snapshot};

use crate::call_tree::CallTree;
use crate::categories::Categories;
use crate::model_view::ModelView;
use vramscope_engine::{
    GroupId, GroupKind, LiveBlock, MemoryState, Reconstruction, SiteGroups, Usage,
};

/// The most columns of the chart: positions are gathered into at most this many buckets.
pub const MAX_BUCKETS: usize = 16_384;

/// The most call sites drawn as their own band; the rest are one "other" band.
pub const MAX_SERIES: usize = 12;

/// The most rows of a moment's site table; the rest are summed into one row.
const MAX_SITE_ROWS: usize = 150;

/// The most live blocks kept for a moment's segment map at the peaks and the end.
const MAX_KEY_BLOCKS: usize = 50_000;

/// The most live blocks kept for the segment map of a moment between them.
const MAX_OTHER_BLOCKS: usize = 8_000;

/// The most segments of a moment's map: the rows the page draws. Blocks in the segments past
/// them still count against the moment's block limit, as when the page drew this many of all.
pub const MAX_SEGMENT_ROWS: usize = 2_000;

/// The most step marks the page carries: past it, only the steps whose number is a multiple
/// of the smallest of 2, 5, 10, 20, 50… that brings them under it (the marks the chart draws
/// zoomed out; zoomed in, the others are missing).
pub const MAX_STEPS: usize = 100_000;

/// Evenly spaced moments between the start and the end, besides the peaks and the end.
const SPACED_MOMENTS: usize = 8;

/// The most frames of a stack kept for hover.
const MAX_FRAMES: usize = 24;

/// The most groups named before the blocks of segment maps name one group for all the
/// sites past them: each named group costs the page its label and function, and a trace
/// with a distinct site for each of 50,000 live blocks would otherwise add megabytes.
pub const MAX_BLOCK_GROUPS: usize = 10_000;

/// The most nodes of a moment's call tree (the rest summed into "other" nodes).
pub const MAX_TREE_NODES: usize = 150;

/// The most groups whose stacks are kept.
const MAX_STACKS: usize = 400;

/// One band of the chart.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Series {
    /// `site`, `other`, `before` or `unknown`.
    pub kind: &'static str,
    /// Index into [`ExplorerData::groups`] (`None` for "other").
    pub group: Option<u32>,
    /// The label shown.
    pub label: String,
    /// The highest bytes the band reaches at any position.
    pub max: u64,
}

/// A call-site group as the page names it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct GroupInfo {
    /// `file:line`, `(unknown site)` or `(before the trace)`.
    pub label: String,
    /// The function at the site.
    pub function: String,
    /// The stack of the group's first site, innermost frame first, as `function file:line`.
    pub stack: Vec<String>,
}

/// A step as the chart marks it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct StepPos {
    /// Step number.
    pub step: u64,
    /// Position of its first event (the state before it).
    pub pos: u64,
    /// The mark's label.
    pub label: String,
}

/// One segment (or mapped run) of a moment's segment map. The page carries rows in the
/// compact form of [`compact`]; as JSON (the form the browser test compares the
/// page's decoded rows with) the address is `0x…`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct SegmentRow {
    /// Address.
    #[serde(serialize_with = "hex")]
    pub addr: u64,
    /// Size in bytes.
    pub size: u64,
    /// `s` (small pool) or `L` (large pool).
    pub pool: &'static str,
    /// Whether it is a mapped run of an expandable segment.
    pub expandable: bool,
    /// Live blocks, four numbers each: offset in the segment, size, state (0 allocated, 1
    /// waiting to be freed) and index into [`ExplorerData::groups`].
    pub blocks: Vec<u64>,
}

/// One category's band of the chart of what the memory is made of.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct CategoryBand {
    /// The category's name in JSON (`optimizer_state`).
    pub name: &'static str,
    /// Its label (`optimizer state`).
    pub label: &'static str,
    /// Allocated bytes of the category at each column's position
    /// ([`ExplorerData::bucket_pos`]).
    pub values: Vec<u64>,
}

/// One node of a moment's call tree, in pre-order: `[label, parent, bytes, blocks, category]`
/// as JSON, the parent an index into the list (-1 for the root) and the category the one
/// holding most of the node's bytes, as its index in `Category::ALL` (-1 for none).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct TreeNode(pub String, pub i64, pub u64, pub u64, pub i64);

/// The state at one position: the site table and the segment map.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Moment {
    /// What the moment is (`peak allocated`, `end`, `start`, `peak reserved`, `event N`).
    pub name: String,
    /// Position: the state after this many events.
    pub pos: u64,
    /// Allocated bytes.
    pub allocated: u64,
    /// Reserved bytes (0 when unknown).
    pub reserved: u64,
    /// Per group: `[group index, bytes, blocks]`, largest first; sums to `allocated` with
    /// [`Moment::rest`].
    pub sites: Vec<[u64; 3]>,
    /// The groups left out of `sites`: `[groups, bytes, blocks]`.
    pub rest: [u64; 3],
    /// The segments the map draws: the first [`MAX_SEGMENT_ROWS`] in address order. In the
    /// page, the string [`compact::encode`] makes of them, named `map`.
    #[serde(rename = "map", serialize_with = "compact::serialize")]
    pub segments: Vec<SegmentRow>,
    /// Segments at the moment, drawn or not.
    pub segment_count: u64,
    /// Live blocks left out of the segment map to bound its size.
    pub blocks_left_out: u64,
    /// Live bytes in no segment the state knows (traces without segment data).
    pub orphan_bytes: u64,
    /// The live bytes by the user's call tree, at most [`MAX_TREE_NODES`] nodes; the root
    /// holds the allocated blocks (memory from before the trace that no block describes is
    /// not in it).
    pub tree: Vec<TreeNode>,
}

/// Everything the explorer draws. See the module documentation.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ExplorerData {
    /// Events in the trace; positions run from 0 (before the first) to `events`.
    pub events: u64,
    /// Whether events carry time stamps (the x axis can be time).
    pub has_time: bool,
    /// Whether the trace records reserved memory.
    pub reserved_known: bool,
    /// Device capacity, when known.
    pub capacity: Option<u64>,
    /// Peak allocated bytes (the report's figure).
    pub peak_allocated: u64,
    /// The position where allocated bytes first reach the peak.
    pub peak_pos: u64,
    /// Peak reserved bytes (when known).
    pub peak_reserved: Option<u64>,
    /// The position where reserved bytes first reach their peak.
    pub peak_reserved_pos: Option<u64>,
    /// The bands, bottom first.
    pub series: Vec<Series>,
    /// The groups named by the series and the moments.
    pub groups: Vec<GroupInfo>,
    /// First position of each bucket.
    pub bucket_start: Vec<u64>,
    /// The position each bucket shows: its highest allocated bytes, first reached.
    pub bucket_pos: Vec<u64>,
    /// Nanoseconds since the first event at each bucket's start (empty without times).
    pub bucket_time: Vec<u64>,
    /// Nanoseconds from the first event to the last.
    pub duration_ns: u64,
    /// Allocated bytes at each bucket's position.
    pub allocated: Vec<u64>,
    /// The highest reserved bytes within each bucket (empty when unknown).
    pub reserved: Vec<u64>,
    /// Band values: `values[series][bucket]`.
    pub values: Vec<Vec<u64>>,
    /// The allocated bytes of each column by category, bottom band first in the order of
    /// `Category::ALL`; categories with no byte in any column are left out.
    pub categories: Vec<CategoryBand>,
    /// Steps numbered 1 or more, with their first position. The page carries them as the
    /// string [`compact::encode_steps`] makes (their labels, which it does not show,
    /// left out), thinned to [`MAX_STEPS`] marks.
    #[serde(serialize_with = "compact::serialize_steps")]
    pub steps: Vec<StepPos>,
    /// Positions of OOM events.
    pub ooms: Vec<u64>,
    /// Positions of the host's waits for the device (`Sync` events: a profiler trace's runtime
    /// syncs), thinned to [`MAX_WAIT_MARKS`] evenly spread; absent from the page when none.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub waits: Vec<u64>,
    /// Moments with a site table and a segment map, in position order.
    pub moments: Vec<Moment>,
}

/// A change of one group's bytes at one position.
#[derive(Clone, Copy)]
struct Delta {
    pos: u32,
    group: GroupId,
    bytes: i64,
}

/// A moment to take from the walk's own state there (`Reconstruction::state_walked`): its
/// position, its name, and the most live blocks its segment map keeps.
struct PlannedMoment {
    pos: u64,
    name: String,
    max_blocks: usize,
}

impl ExplorerData {
    /// Builds the explorer's data of `view`'s snapshot, with `capacity` as the device's.
    pub fn build(view: &ModelView<'_>, capacity: Option<u64>) -> ExplorerData {
        let snapshot = view.snapshot();
        let walk = Reconstruction::with_states(snapshot);
        let groups = view.site_groups();
        let events: &[Event] = &snapshot.events;
        let n = events.len();
        let peak_pos = walk.peak_allocated.event.map_or(0, |e| u64::from(e) + 1);
        let peak_reserved_pos = walk
            .reserved_known
            .then(|| walk.peak_reserved.event.map_or(0, |e| u64::from(e) + 1));
        let planned = plan_moments(n, peak_pos, peak_reserved_pos);

        // The order matters: groups get their index as the moments, then the bands, name them.
        // The bands' groups are known first, so that their blocks keep their own group (and
        // colour) past the blocks' limit of groups.
        let mut indexer = GroupIndexer::new(snapshot, groups);
        let start_bytes = bytes_by_group(&walk.start, groups);
        let deltas = group_deltas(snapshot, &walk, groups);
        indexer.banded = Bands::ranked(&start_bytes, &deltas)
            .into_iter()
            .take(MAX_SERIES)
            .map(|(g, _)| g)
            .chain([SiteGroups::BEFORE_TRACE])
            .collect();
        let moments = take_moments(
            snapshot,
            &walk,
            groups,
            &planned,
            &mut indexer,
            view.categories(),
        );
        let bands = Bands::choose(&start_bytes, &deltas, groups, &mut indexer);
        let clock = Clock::over(events);
        let columns = Columns::gather(&walk, &bands, &start_bytes, &deltas, &clock);

        let categories = category_bands(view, &columns.bucket_pos);
        ExplorerData {
            events: n as u64,
            has_time: clock.has_time,
            reserved_known: walk.reserved_known,
            capacity,
            peak_allocated: walk.peak_allocated.bytes,
            peak_pos,
            peak_reserved: walk.reserved_known.then_some(walk.peak_reserved.bytes),
            peak_reserved_pos,
            series: bands.series,
            groups: indexer.infos,
            bucket_start: columns.bucket_start,
            bucket_pos: columns.bucket_pos,
            bucket_time: columns.bucket_time,
            duration_ns: clock.time_at(n),
            allocated: columns.allocated,
            reserved: columns.reserved,
            values: columns.values,
            categories,
            steps: step_positions(view),
            ooms: view.ooms().iter().map(|&e| u64::from(e) + 1).collect(),
            waits: wait_positions(view.snapshot()),
            moments,
        }
    }

    /// The positions a finding from step `first` to step `last` spans, as the page shades
    /// them: from the first step numbered `first` or more (the start when none) to the first
    /// numbered past `last` (the end when none); `None` without a first step.
    pub fn step_range(&self, first: Option<u64>, last: Option<u64>) -> Option<[u64; 2]> {
        let first = first?;
        let last = last.unwrap_or(first);
        let start = self
            .steps
            .iter()
            .find(|s| s.step >= first)
            .map_or(0, |s| s.pos);
        let end = self
            .steps
            .iter()
            .find(|s| s.step > last)
            .map_or(self.events, |s| s.pos);
        Some([start, end])
    }

    /// The moment at the peak of allocated bytes.
    pub fn peak_moment(&self) -> Option<&Moment> {
        self.moments.iter().find(|m| m.pos == self.peak_pos)
    }
}

/// The call tree of `state` as the page carries it.
fn tree_of(snapshot: &Snapshot, state: &MemoryState, categories: &Categories) -> Vec<TreeNode> {
    let tree = CallTree::at(snapshot, state, Some(categories), MAX_TREE_NODES);
    tree.nodes
        .iter()
        .map(|n| {
            TreeNode(
                n.label.clone(),
                n.parent.map_or(-1, i64::from),
                n.bytes,
                n.blocks,
                n.main_category().map_or(-1, |c| c.index() as i64),
            )
        })
        .collect()
}

/// The bytes by category at each position of `positions` (the state after that many events).
fn category_bands(view: &ModelView<'_>, positions: &[u64]) -> Vec<CategoryBand> {
    let mut after: Vec<u32> = positions
        .iter()
        .filter(|&&p| p > 0)
        .map(|&p| (p - 1) as u32)
        .collect();
    after.sort_unstable();
    after.dedup();
    let read = view.categories_after(&after);
    let start = view.categories_at_start();
    let at: Vec<CategoryBytes> = positions
        .iter()
        .map(|&p| match p.checked_sub(1) {
            None => start,
            Some(e) => after
                .binary_search(&(e as u32))
                .ok()
                .and_then(|k| read.get(k).copied())
                .unwrap_or(start),
        })
        .collect();
    Category::ALL
        .iter()
        .map(|&c| CategoryBand {
            name: c.as_str(),
            label: c.label(),
            values: at.iter().map(|b| b[c]).collect(),
        })
        .filter(|band| band.values.iter().any(|&v| v > 0))
        .collect()
}

/// The moments to take, in position order, for a trace of `n` events: the peaks, the end, the
/// start and evenly spaced ones. Moments at one position are one: the first name given to it
/// wins over a spaced moment's, and named moments that meet are named together.
fn plan_moments(n: usize, peak_pos: u64, peak_reserved_pos: Option<u64>) -> Vec<PlannedMoment> {
    let planned = |pos: u64, name: String, max_blocks: usize| PlannedMoment {
        pos,
        name,
        max_blocks,
    };
    let mut wanted: Vec<PlannedMoment> = vec![
        planned(peak_pos, "peak allocated".to_string(), MAX_KEY_BLOCKS),
        planned(n as u64, "end".to_string(), MAX_KEY_BLOCKS),
        planned(0, "start".to_string(), MAX_OTHER_BLOCKS),
    ];
    if let Some(p) = peak_reserved_pos {
        wanted.push(planned(p, "peak reserved".to_string(), MAX_KEY_BLOCKS));
    }
    for k in 1..=SPACED_MOMENTS {
        let p = (n * k / (SPACED_MOMENTS + 1)) as u64;
        wanted.push(planned(p, format!("event {p}"), MAX_OTHER_BLOCKS));
    }
    wanted.sort_by_key(|w| w.pos);
    // The first name given to a position wins (the peak over a spaced moment).
    let mut keep: Vec<PlannedMoment> = Vec::new();
    for w in wanted {
        match keep.iter_mut().find(|k| k.pos == w.pos) {
            Some(k) => {
                if !k.name.starts_with("event") && w.name.starts_with("event") {
                    continue;
                }
                if k.name.starts_with("event") {
                    *k = w;
                } else {
                    k.name = format!("{} = {}", k.name, w.name);
                    k.max_blocks = k.max_blocks.max(w.max_blocks);
                }
            }
            None => keep.push(w),
        }
    }
    keep
}

/// The bytes each group holds in `state` (pending frees left out), with the state's
/// unattributed bytes under "before the trace".
fn bytes_by_group(state: &MemoryState, groups: &SiteGroups) -> FxHashMap<GroupId, u64> {
    let mut bytes: FxHashMap<GroupId, u64> = FxHashMap::default();
    for (_, block) in state.blocks.unordered().filter(|(_, b)| !b.pending) {
        let e = bytes.entry(groups.of_block(block)).or_default();
        *e = e.saturating_add(block.size);
    }
    if state.unattributed.allocated > 0 {
        let e = bytes.entry(SiteGroups::BEFORE_TRACE).or_default();
        *e = e.saturating_add(state.unattributed.allocated);
    }
    bytes
}

/// The `planned` moments, each the engine's own state at its position
/// ([`Reconstruction::state_walked`]), as the model view's "at peak" holdings are, so that its
/// table adds up to the figures the walk found even on a trace that contradicts itself.
fn take_moments(
    snapshot: &Snapshot,
    walk: &Reconstruction,
    groups: &SiteGroups,
    planned: &[PlannedMoment],
    indexer: &mut GroupIndexer,
    categories: &Categories,
) -> Vec<Moment> {
    let events: &[Event] = &snapshot.events;
    let mut moments = Vec::with_capacity(planned.len());
    for at_one_position in planned.chunk_by(|a, b| a.pos == b.pos) {
        let pos = at_one_position[0].pos;
        let state = walk.state_walked(events, pos as usize);
        let tree = tree_of(snapshot, &state, categories);
        for plan in at_one_position {
            let mut m = moment(
                plan.name.clone(),
                pos,
                &state,
                groups,
                walk.reserved_known,
                Limits {
                    blocks: plan.max_blocks,
                    rows: MAX_SEGMENT_ROWS,
                },
                indexer,
            );
            m.tree = tree.clone();
            moments.push(m);
        }
    }
    moments
}

/// The change of each group's bytes at every position where one changes, in position order.
/// They are the changes between the engine walk's own states
/// ([`Reconstruction::block_changes_back`]), so the bands at every position sum to the
/// allocated bytes the walk found there, even on a trace that contradicts itself (where a walk
/// forwards from the start differs).
fn group_deltas(snapshot: &Snapshot, walk: &Reconstruction, groups: &SiteGroups) -> Vec<Delta> {
    let contribution = |block: Option<&LiveBlock>| {
        block
            .filter(|b| !b.pending)
            .map(|b| (groups.of_block(b), b.size))
    };
    let mut backwards: Vec<Delta> = Vec::new();
    walk.block_changes_back(&snapshot.events, |i, after, before| {
        let (after, before) = (contribution(after), contribution(before));
        if before == after {
            return;
        }
        let pos = i as u32 + 1;
        // The list is turned round at the end: what the event adds goes in first, so that
        // what it takes away comes first at its position.
        if let Some((group, bytes)) = after {
            backwards.push(Delta {
                pos,
                group,
                bytes: signed(bytes),
            });
        }
        if let Some((group, bytes)) = before {
            backwards.push(Delta {
                pos,
                group,
                bytes: -signed(bytes),
            });
        }
    });
    backwards.reverse();
    backwards
}

/// The bands of the chart and which band each group is drawn in.
struct Bands {
    /// The bands, bottom first: "before the trace", the largest sites, then "other".
    series: Vec<Series>,
    /// The band of each group drawn on its own.
    series_of: FxHashMap<GroupId, usize>,
    /// The "other" band, when there are more sites than bands.
    other: Option<usize>,
}

impl Bands {
    /// Picks the bands: the [`MAX_SERIES`] groups with the highest bytes of their own at any
    /// position, "before the trace" below them and the rest as "other".
    fn choose(
        start_bytes: &FxHashMap<GroupId, u64>,
        deltas: &[Delta],
        groups: &SiteGroups,
        indexer: &mut GroupIndexer,
    ) -> Bands {
        let max = highest_bytes(start_bytes, deltas);
        let ranked = Bands::ranked(start_bytes, deltas);
        let has_other = ranked.len() > MAX_SERIES;
        let other_max = ranked.iter().skip(MAX_SERIES).map(|r| r.1).max();
        let before_max = max.get(&SiteGroups::BEFORE_TRACE).copied().unwrap_or(0);

        let mut series = Vec::new();
        let mut series_of: FxHashMap<GroupId, usize> = FxHashMap::default();
        if before_max > 0 {
            series_of.insert(SiteGroups::BEFORE_TRACE, series.len());
            series.push(Series {
                kind: "before",
                group: Some(indexer.index_with_stack(SiteGroups::BEFORE_TRACE)),
                label: groups.get(SiteGroups::BEFORE_TRACE).label().to_string(),
                max: before_max,
            });
        }
        for &(g, m) in ranked.iter().take(MAX_SERIES) {
            series_of.insert(g, series.len());
            series.push(Series {
                kind: match groups.get(g).kind {
                    GroupKind::Site => "site",
                    GroupKind::Unknown => "unknown",
                    GroupKind::BeforeTrace => "before",
                },
                group: Some(indexer.index_with_stack(g)),
                label: groups.get(g).label().to_string(),
                max: m,
            });
        }
        let other = has_other.then(|| {
            series.push(Series {
                kind: "other",
                group: None,
                label: format!("other ({} sites)", ranked.len() - MAX_SERIES),
                max: other_max.unwrap_or(0),
            });
            series.len() - 1
        });
        Bands {
            series,
            series_of,
            other,
        }
    }

    /// The groups other than "before the trace" with bytes of their own at some position, by
    /// their highest bytes, largest first: the first [`MAX_SERIES`] get a band.
    fn ranked(start_bytes: &FxHashMap<GroupId, u64>, deltas: &[Delta]) -> Vec<(GroupId, u64)> {
        let mut ranked: Vec<(GroupId, u64)> = highest_bytes(start_bytes, deltas)
            .into_iter()
            .filter(|&(g, m)| m > 0 && g != SiteGroups::BEFORE_TRACE)
            .collect();
        ranked.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        ranked
    }

    /// The band group `g` is drawn in.
    fn band_of(&self, g: GroupId) -> Option<usize> {
        self.series_of.get(&g).copied().or(self.other)
    }
}

/// Each group's own highest bytes at any position, from its bytes at the start and the
/// deltas.
fn highest_bytes(
    start_bytes: &FxHashMap<GroupId, u64>,
    deltas: &[Delta],
) -> FxHashMap<GroupId, u64> {
    let mut current = start_bytes.clone();
    let mut max = start_bytes.clone();
    for d in deltas {
        let v = current.entry(d.group).or_default();
        *v = v.saturating_add_signed(d.bytes);
        let m = max.entry(d.group).or_default();
        *m = (*m).max(*v);
    }
    max
}

/// The times of positions, counted from the first event's time stamp.
struct Clock<'e> {
    events: &'e [Event],
    /// The first event's time stamp.
    t0: u64,
    /// Whether any event's time differs from the first's (the x axis can be time).
    has_time: bool,
}

impl<'e> Clock<'e> {
    fn over(events: &'e [Event]) -> Clock<'e> {
        let t0 = events.first().map_or(0, |e| e.time_ns);
        let has_time = events.iter().any(|e| e.time_ns != t0);
        Clock {
            events,
            t0,
            has_time,
        }
    }

    /// Nanoseconds from the first event to position `p` (the state after `p` events).
    fn time_at(&self, p: usize) -> u64 {
        self.events
            .get(p.saturating_sub(1))
            .map_or(0, |e| e.time_ns.saturating_sub(self.t0))
    }
}

/// The columns of the chart, as [`ExplorerData`] lists them.
struct Columns {
    bucket_start: Vec<u64>,
    bucket_pos: Vec<u64>,
    bucket_time: Vec<u64>,
    allocated: Vec<u64>,
    reserved: Vec<u64>,
    values: Vec<Vec<u64>>,
}

/// The column being gathered: where it starts, and its position with the highest allocated
/// bytes so far (first reached), with the bands' values there.
struct OpenColumn {
    start: usize,
    best: Vec<u64>,
    best_pos: usize,
    best_alloc: u64,
    max_reserved: u64,
}

impl OpenColumn {
    /// Starts the column again at position `p`, whose bands are `now`.
    fn restart(&mut self, p: usize, now: &[u64], usage: Usage) {
        self.start = p;
        self.best.copy_from_slice(now);
        self.best_pos = p;
        self.best_alloc = usage.allocated;
        self.max_reserved = usage.reserved;
    }

    /// Takes in position `p`, whose bands are `now`: it is the column's best when its
    /// allocated bytes are higher than any before.
    fn take(&mut self, p: usize, now: &[u64], usage: Usage) {
        if usage.allocated > self.best_alloc {
            self.best.copy_from_slice(now);
            self.best_pos = p;
            self.best_alloc = usage.allocated;
        }
        self.max_reserved = self.max_reserved.max(usage.reserved);
    }
}

impl Columns {
    /// Gathers the positions into at most [`MAX_BUCKETS`] columns, each showing the position of
    /// its highest allocated bytes.
    fn gather(
        walk: &Reconstruction,
        bands: &Bands,
        start_bytes: &FxHashMap<GroupId, u64>,
        deltas: &[Delta],
        clock: &Clock,
    ) -> Columns {
        let positions = clock.events.len() + 1;
        let buckets = positions.min(MAX_BUCKETS);
        let bucket_of = |p: usize| (p as u128 * buckets as u128 / positions as u128) as usize;
        let mut columns = Columns {
            bucket_start: Vec::with_capacity(buckets),
            bucket_pos: Vec::with_capacity(buckets),
            bucket_time: Vec::new(),
            allocated: Vec::with_capacity(buckets),
            reserved: Vec::new(),
            values: vec![Vec::with_capacity(buckets); bands.series.len()],
        };
        let mut now = vec![0u64; bands.series.len()];
        for (&g, &b) in start_bytes {
            if let Some(s) = bands.band_of(g) {
                now[s] = now[s].saturating_add(b);
            }
        }
        let mut column = OpenColumn {
            start: 0,
            best: now.clone(),
            best_pos: 0,
            best_alloc: walk.start.allocated,
            max_reserved: walk.start.reserved,
        };
        let mut current_bucket = 0usize;
        let mut next_delta = 0usize;
        for p in 1..positions {
            while next_delta < deltas.len() && deltas[next_delta].pos as usize == p {
                let d = deltas[next_delta];
                if let Some(s) = bands.band_of(d.group) {
                    now[s] = now[s].saturating_add_signed(d.bytes);
                }
                next_delta += 1;
            }
            let usage = walk.usage_at(p);
            let b = bucket_of(p);
            if b != current_bucket {
                columns.close(&column, clock, walk.reserved_known);
                current_bucket = b;
                column.restart(p, &now, usage);
            } else {
                column.take(p, &now, usage);
            }
        }
        columns.close(&column, clock, walk.reserved_known);
        columns
    }

    /// Adds `column` as the next column.
    fn close(&mut self, column: &OpenColumn, clock: &Clock, reserved_known: bool) {
        self.bucket_start.push(column.start as u64);
        self.bucket_pos.push(column.best_pos as u64);
        if clock.has_time {
            self.bucket_time.push(clock.time_at(column.start));
        }
        self.allocated.push(column.best_alloc);
        if reserved_known {
            self.reserved.push(column.max_reserved);
        }
        for (s, v) in self.values.iter_mut().enumerate() {
            v.push(column.best[s]);
        }
    }
}

/// The steps numbered 1 or more that have events, with their first position.
fn step_positions(view: &ModelView<'_>) -> Vec<StepPos> {
    view.steps()
        .iter()
        .filter(|s| s.step >= 1)
        .filter_map(|s| {
            s.first_event.map(|e| StepPos {
                step: s.step,
                pos: u64::from(e),
                label: s.label.clone(),
            })
        })
        .collect()
}

/// Writes `value` as `0x…`, as the page shows addresses.
fn hex<S: serde::Serializer>(value: &u64, serializer: S) -> Result<S::Ok, S::Error> {
    serializer.collect_str(&format_args!("{value:#x}"))
}

/// `bytes` as a delta (sizes past `i64::MAX`, which no importer lets through, saturate).
fn signed(bytes: u64) -> i64 {
    i64::try_from(bytes).unwrap_or(i64::MAX)
}

/// Gives groups their index in [`ExplorerData::groups`] as they are first named.
struct GroupIndexer<'a> {
    snapshot: &'a Snapshot,
    groups: &'a SiteGroups,
    index: FxHashMap<GroupId, u32>,
    infos: Vec<GroupInfo>,
    /// The groups drawn as bands, which blocks name whatever the count.
    banded: rustc_hash::FxHashSet<GroupId>,
    /// The index of the group that stands for the sites of blocks past [`MAX_BLOCK_GROUPS`].
    past_limit: Option<u32>,
}

impl<'a> GroupIndexer<'a> {
    fn new(snapshot: &'a Snapshot, groups: &'a SiteGroups) -> GroupIndexer<'a> {
        GroupIndexer {
            snapshot,
            groups,
            index: FxHashMap::default(),
            infos: Vec::new(),
            banded: Default::default(),
            past_limit: None,
        }
    }

    /// The index of the group of a block in a segment map: `g`'s own while fewer than
    /// [`MAX_BLOCK_GROUPS`] groups are named (and always for a band's group), else that of
    /// one group standing for the sites past the limit, drawn in the "other" colour.
    fn index_of_block(&mut self, g: GroupId) -> u32 {
        if let Some(&i) = self.index.get(&g) {
            return i;
        }
        if self.infos.len() < MAX_BLOCK_GROUPS || self.banded.contains(&g) {
            return self.index(g);
        }
        if let Some(i) = self.past_limit {
            return i;
        }
        let i = self.infos.len() as u32;
        self.infos.push(GroupInfo {
            label: format!("(a site past the first {MAX_BLOCK_GROUPS} named)"),
            function: String::new(),
            stack: Vec::new(),
        });
        self.past_limit = Some(i);
        i
    }

    /// The index of `g`; the first [`MAX_STACKS`] groups named carry their stack.
    fn index(&mut self, g: GroupId) -> u32 {
        if let Some(&i) = self.index.get(&g) {
            return i;
        }
        let group = self.groups.get(g);
        let stack = if self.infos.len() < MAX_STACKS {
            self.stack(g)
        } else {
            Vec::new()
        };
        let i = self.infos.len() as u32;
        self.infos.push(GroupInfo {
            label: group.label().to_string(),
            function: group.function.clone(),
            stack,
        });
        self.index.insert(g, i);
        i
    }

    /// The index of `g`, with its stack whatever the count (the bands' groups).
    fn index_with_stack(&mut self, g: GroupId) -> u32 {
        let i = self.index(g);
        if self.infos[i as usize].stack.is_empty() {
            self.infos[i as usize].stack = self.stack(g);
        }
        i
    }

    /// The stack of the group's first site, innermost frame first.
    fn stack(&self, g: GroupId) -> Vec<String> {
        self.groups
            .get(g)
            .sites
            .first()
            .and_then(|&s| self.snapshot.sites.get(s as usize))
            .map(|site| {
                site.frames
                    .iter()
                    .take(MAX_FRAMES)
                    .map(|f| format!("{} {}:{}", f.function, f.file, f.line))
                    .collect()
            })
            .unwrap_or_default()
    }
}

/// How much of a moment's segment map is kept.
#[derive(Clone, Copy)]
struct Limits {
    /// The most live blocks, counted in address order over all segments.
    blocks: usize,
    /// The most segments (rows).
    rows: usize,
}

/// The site table and segment map of `state`: the first `limits.rows` segments with their
/// live blocks, of the first `limits.blocks` in address order.
fn moment(
    name: String,
    pos: u64,
    state: &MemoryState,
    groups: &SiteGroups,
    reserved_known: bool,
    limits: Limits,
    indexer: &mut GroupIndexer,
) -> Moment {
    let mut by_group: FxHashMap<GroupId, (u64, u64)> = FxHashMap::default();
    for (_, block) in state.blocks.unordered().filter(|(_, b)| !b.pending) {
        let e = by_group.entry(groups.of_block(block)).or_default();
        e.0 = e.0.saturating_add(block.size);
        e.1 += 1;
    }
    if state.unattributed.allocated > 0 {
        let e = by_group.entry(SiteGroups::BEFORE_TRACE).or_default();
        e.0 = e.0.saturating_add(state.unattributed.allocated);
    }
    let mut list: Vec<(GroupId, u64, u64)> =
        by_group.into_iter().map(|(g, (b, n))| (g, b, n)).collect();
    list.sort_by(|a, b| b.1.cmp(&a.1).then(b.2.cmp(&a.2)).then(a.0.cmp(&b.0)));
    let mut rest = [0u64; 3];
    let mut sites = Vec::new();
    for (i, &(g, bytes, blocks)) in list.iter().enumerate() {
        if i < MAX_SITE_ROWS {
            sites.push([u64::from(indexer.index(g)), bytes, blocks]);
        } else {
            rest[0] += 1;
            rest[1] = rest[1].saturating_add(bytes);
            rest[2] += blocks;
        }
    }
    let mut segments = Vec::with_capacity(state.segments.len().min(limits.rows));
    let mut kept = 0usize;
    let mut left_out = 0u64;
    for (row, (&addr, s)) in state.segments.iter().enumerate() {
        if row >= limits.rows {
            // Not drawn, but its blocks count against the limit all the same.
            let n = state.blocks_in(addr, s.size).count();
            let taken = n.min(limits.blocks.saturating_sub(kept));
            kept += taken;
            left_out += (n - taken) as u64;
            continue;
        }
        let mut blocks = Vec::new();
        for (&a, b) in state.blocks_in(addr, s.size) {
            if kept >= limits.blocks {
                left_out += 1;
                continue;
            }
            kept += 1;
            blocks.extend_from_slice(&[
                a - addr,
                b.size,
                u64::from(b.pending),
                u64::from(indexer.index_of_block(groups.of_block(b))),
            ]);
        }
        segments.push(SegmentRow {
            addr,
            size: s.size,
            pool: match s.pool {
                Pool::Small => "s",
                Pool::Large => "L",
            },
            expandable: s.expandable,
            blocks,
        });
    }
    Moment {
        name,
        pos,
        allocated: state.allocated,
        reserved: if reserved_known { state.reserved } else { 0 },
        sites,
        rest,
        segments,
        segment_count: state.segments.len() as u64,
        blocks_left_out: left_out,
        orphan_bytes: state.orphan_bytes(),
        tree: Vec::new(),
    }
}

/// The most host waits the page marks: beyond it, the marks are thinned evenly (a mark is a
/// pixel wide, and the page stays small).
pub const MAX_WAIT_MARKS: usize = 4096;

/// The positions of the snapshot's `Sync` events, as the page counts positions (one past the
/// event's index), thinned to [`MAX_WAIT_MARKS`].
fn wait_positions(snapshot: &vramscope_model::Snapshot) -> Vec<u64> {
    let all: Vec<u64> = snapshot
        .events
        .iter()
        .enumerate()
        .filter(|(_, e)| e.kind == vramscope_model::EventKind::Sync)
        .map(|(i, _)| i as u64 + 1)
        .collect();
    if all.len() <= MAX_WAIT_MARKS {
        return all;
    }
    (0..MAX_WAIT_MARKS)
        .map(|k| all[k * all.len() / MAX_WAIT_MARKS])
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use vramscope_testkit::{Trace, MIB};

    /// Many sites, a leak and a free of a block from before the trace: more sites than bands
    /// and more positions than columns.
    fn busy() -> Snapshot {
        let mut t = Trace::new();
        let sites: Vec<_> = (0..20)
            .map(|i| t.site("model.py", 10 + i, "forward"))
            .collect();
        t.free(0x9000_0000, 3 * MIB);
        let mut kept = Vec::new();
        for step in 0..1_200u64 {
            t.step();
            let mut live = Vec::new();
            for (i, &s) in sites.iter().enumerate() {
                live.push((t.alloc(s, (1 + i as u64 + step % 5) * MIB), i));
            }
            for (addr, i) in live.drain(..) {
                t.free(addr, (1 + i as u64 + step % 5) * MIB);
            }
            kept.push(t.alloc(sites[0], 4096));
        }
        t.finish()
    }

    /// Downsampling keeps each column's highest position: every spike of a trace with more
    /// positions than columns is a column at the spike's height, at the spike's place, and the
    /// peak's column is the peak.
    #[test]
    fn every_spike_keeps_its_height_and_place_in_the_columns() {
        let (snapshot, spikes) = vramscope_testkit::spiky_run();
        let view = ModelView::new(&snapshot);
        let data = ExplorerData::build(&view, None);
        assert!(
            data.events as usize + 1 > MAX_BUCKETS,
            "more positions than columns"
        );
        assert_eq!(view.peak_allocated(), 134 * MIB);
        for &p in &spikes {
            assert_eq!(
                view.usage_at(p as u32 - 1).0,
                134 * MIB,
                "the spike is at {p}"
            );
            let k = data.bucket_start.partition_point(|&start| start <= p) - 1;
            assert_eq!(data.allocated[k], 134 * MIB, "the spike's column {k}");
            assert_eq!(
                data.bucket_pos[k], p,
                "the column shows the spike's position"
            );
            let sum: u64 = data.values.iter().map(|v| v[k]).sum();
            assert_eq!(sum, 134 * MIB, "the bands reach the spike");
        }
        // Between the spikes, the columns stay at the base and its one block of work.
        let flat = data.allocated.iter().filter(|&&a| a <= 37 * MIB).count();
        assert_eq!(flat, data.allocated.len() - spikes.len());
        let k = data.bucket_pos.iter().position(|&p| p == data.peak_pos);
        assert_eq!(
            data.allocated[k.expect("a column shows the peak")],
            134 * MIB
        );
    }

    #[test]
    fn the_page_marks_the_host_waits_thinned_evenly() {
        let mut t = Trace::new();
        let site = t.site("train.py", 44, "train");
        let a = t.alloc(site, MIB);
        t.sync(site);
        t.free(a, MIB);
        t.sync(site);
        let snapshot = t.finish();
        // Positions count one past the event's index.
        assert_eq!(wait_positions(&snapshot), vec![2, 5]);
        let view = ModelView::new(&snapshot);
        let json = serde_json::to_string(&ExplorerData::build(&view, None)).unwrap();
        assert!(json.contains("\"waits\":[2,5]"), "{json}");

        let mut t = Trace::new();
        let site = t.site("train.py", 44, "train");
        for _ in 0..3 * MAX_WAIT_MARKS {
            t.sync(site);
        }
        let marks = wait_positions(&t.finish());
        assert_eq!(marks.len(), MAX_WAIT_MARKS);
        assert_eq!(
            (marks[0], marks[1], marks[MAX_WAIT_MARKS - 1]),
            (1, 4, 3 * MAX_WAIT_MARKS as u64 - 2)
        );
        // A trace without waits leaves the key out, so such pages are unchanged.
        let json =
            serde_json::to_string(&ExplorerData::build(&ModelView::new(&busy()), None)).unwrap();
        assert!(!json.contains("\"waits\""));
    }

    #[test]
    fn bands_and_tables_sum_to_the_figures() {
        let snapshot = busy();
        let view = ModelView::new(&snapshot);
        let data = ExplorerData::build(&view, None);
        assert_eq!(data.peak_allocated, view.peak_allocated());
        assert!(data.bucket_start.len() <= MAX_BUCKETS);
        assert!(
            data.events as usize + 1 > MAX_BUCKETS,
            "more positions than columns"
        );
        assert!(data.series.len() <= MAX_SERIES + 2);
        assert!(data.series.iter().any(|s| s.kind == "other"));
        assert!(data.series.iter().any(|s| s.kind == "before"));
        // Every column's bands sum to its allocated bytes, and the peak's column is the peak.
        for k in 0..data.bucket_start.len() {
            let sum: u64 = data.values.iter().map(|v| v[k]).sum();
            assert_eq!(sum, data.allocated[k], "column {k}");
        }
        let k = data.bucket_pos.iter().position(|&p| p == data.peak_pos);
        let k = k.expect("a column shows the peak");
        assert_eq!(data.allocated[k], view.peak_allocated());
        // The tables at the peak and at the end sum to the report's figures.
        let total = |m: &Moment| m.sites.iter().map(|r| r[1]).sum::<u64>() + m.rest[1];
        let peak = data.peak_moment().expect("a moment at the peak");
        assert_eq!(total(peak), view.peak_allocated());
        let end = data.moments.iter().find(|m| m.pos == data.events).unwrap();
        assert_eq!(total(end), view.end_allocated());
        assert_eq!(end.allocated, view.end_allocated());
    }

    /// On a trace that frees blocks twice, the walk forwards from the start and the engine's
    /// walk disagree on what was live at the peak: the explorer's table at the peak and the
    /// model view's "at peak" holdings both come from the engine's walk, and both add up to
    /// the peak it found.
    #[test]
    fn the_peak_table_adds_up_on_a_trace_that_contradicts_itself() {
        let mut t = Trace::new();
        let s = t.site("train.py", 7, "step");
        let (a, b) = (0x10_0000, 0x20_0000);
        t.alloc_at(s, a, MIB);
        t.free(a, MIB);
        t.alloc_at(s, b, 2 * MIB);
        // The first block again, freed already: walking back from the end, it was live until
        // here, from before the trace.
        t.free(a, MIB);
        t.free(b, 2 * MIB);
        let snapshot = t.finish();
        let view = ModelView::new(&snapshot);
        let data = ExplorerData::build(&view, None);
        let peak = data.peak_moment().expect("a moment at the peak");
        let total = peak.sites.iter().map(|r| r[1]).sum::<u64>() + peak.rest[1];
        assert_eq!(total, view.peak_allocated());
        let held: u64 = view.live_at_peak().iter().map(|h| h.bytes).sum();
        assert_eq!(held, view.peak_allocated());
        // A walk forwards from the start, as a viewer stepping through the trace would take.
        let mut forwards = Reconstruction::from_snapshot(&snapshot).start;
        for (i, e) in snapshot.events.iter().enumerate().take(peak.pos as usize) {
            forwards.apply(e, i as u32);
        }
        assert_ne!(
            forwards.allocated,
            view.peak_allocated(),
            "the trace contradicts itself"
        );
        // The bands of every column (one per position here) are the walk's state too.
        assert_eq!(data.bucket_start.len(), snapshot.events.len() + 1);
        for k in 0..data.bucket_start.len() {
            let sum: u64 = data.values.iter().map(|v| v[k]).sum();
            assert_eq!(sum, data.allocated[k], "column {k}");
        }
    }

    proptest::proptest! {
    #![proptest_config(vramscope_testkit::props::config(256))]
        /// Whatever the trace, consistent or not (blocks freed twice or never allocated,
        /// allocations over live blocks, free requests repeated), with or without dump-time
        /// blocks, every column's bands sum to the allocated bytes the engine's walk found
        /// there, and the bands and the peak's table agree with the report.
        #[test]
        fn the_bands_of_any_trace_sum_to_the_walks_figures(
            ops in vramscope_testkit::generated::ops(1..5, 1..80),
            live_at_dump in vramscope_testkit::generated::live_at_dump(),
        ) {
            let snapshot = vramscope_testkit::generated::trace_of_ops(&ops, &live_at_dump);
            let view = ModelView::new(&snapshot);
            let data = ExplorerData::build(&view, None);
            let walk = Reconstruction::from_snapshot(&snapshot);
            proptest::prop_assert_eq!(data.bucket_start.len(), snapshot.events.len() + 1);
            for k in 0..data.bucket_start.len() {
                let sum: u64 = data.values.iter().map(|v| v[k]).sum();
                proptest::prop_assert_eq!(sum, data.allocated[k], "column {}", k);
                // And those bytes are the walk's own state's there, summed block by block.
                let state = walk.state_walked(&snapshot.events, data.bucket_pos[k] as usize);
                let held: u64 = state
                    .blocks
                    .unordered()
                    .filter(|(_, b)| !b.pending)
                    .map(|(_, b)| b.size)
                    .sum::<u64>()
                    + state.unattributed.allocated;
                proptest::prop_assert_eq!(data.allocated[k], held, "column {}", k);
            }
            let peak = data.peak_moment().expect("a moment at the peak");
            let total = peak.sites.iter().map(|r| r[1]).sum::<u64>() + peak.rest[1];
            proptest::prop_assert_eq!(total, view.peak_allocated());
        }
    }

    /// A moment keeps the segments the page draws, and they are the first rows of the map
    /// it kept before it was cut to them: the same rows, blocks and groups, and the same
    /// count of blocks left out, wherever the block limit falls.
    #[test]
    fn the_map_keeps_the_rows_the_page_draws() {
        let mut t = Trace::new();
        let s = t.site("model.py", 1, "forward");
        let u = t.site("model.py", 2, "backward");
        for i in 0..2_500u64 {
            let segment = t.segment_alloc(Some(s), 2 * MIB);
            for k in 0..3 {
                t.alloc_at(
                    if (i + k) % 4 == 0 { u } else { s },
                    segment + k * 4096,
                    4096,
                );
            }
        }
        let snapshot = t.finish();
        let view = ModelView::new(&snapshot);
        let data = ExplorerData::build(&view, None);
        let end = data.moments.iter().find(|m| m.pos == data.events).unwrap();
        assert_eq!(end.segment_count, 2_500);
        assert_eq!(end.segments.len(), MAX_SEGMENT_ROWS);
        assert!(data
            .moments
            .iter()
            .all(|m| m.segments.len() <= MAX_SEGMENT_ROWS));

        let walk = Reconstruction::with_states(&snapshot);
        let state = walk.state_walked(&snapshot.events, snapshot.events.len());
        for blocks in [1_000, 6_000, 6_500, 7_500, usize::MAX] {
            let mut indexer = GroupIndexer::new(&snapshot, view.site_groups());
            let mut take = |rows: usize| {
                let limits = Limits { blocks, rows };
                let groups = view.site_groups();
                moment("end".into(), 0, &state, groups, true, limits, &mut indexer)
            };
            let drawn = take(MAX_SEGMENT_ROWS);
            let all = take(usize::MAX);
            assert_eq!(
                drawn.segments[..],
                all.segments[..MAX_SEGMENT_ROWS],
                "{blocks}"
            );
            assert_eq!(drawn.segment_count, all.segments.len() as u64);
            assert_eq!(drawn.blocks_left_out, all.blocks_left_out, "{blocks}");
            assert_eq!(
                drawn.blocks_left_out,
                7_500u64.saturating_sub(blocks as u64),
                "{blocks}"
            );
            assert_eq!((drawn.sites, drawn.rest), (all.sites, all.rest));
        }
    }

    /// Blocks of more sites than [`MAX_BLOCK_GROUPS`] name one group for those past it, but
    /// a band's blocks keep their own group, even when the band is too small at the moment
    /// for its site table and its blocks come after the limit.
    #[test]
    fn blocks_name_a_bounded_number_of_groups() {
        let mut t = Trace::new();
        // The weights' one big block, allocated and freed before any moment but the start:
        // it makes their band.
        let weights = t.site("model.py", 1, "weights");
        let big = t.segment_alloc(None, 1 << 30);
        t.alloc_at(weights, big, 1 << 30);
        t.free(big, 1 << 30);
        for row in 0..1_996u32 {
            let segment = t.segment_alloc(None, 20 * MIB);
            for k in 0..6 {
                let site = t.site("many.py", row * 6 + k + 1, "f");
                t.alloc_at(site, segment + u64::from(k) * 2 * MIB, MIB);
            }
        }
        // Three small blocks of the weights, last in the map.
        for _ in 0..3 {
            let segment = t.segment_alloc(None, 2 * MIB);
            t.alloc_at(weights, segment, 512);
        }
        let snapshot = t.finish();
        let view = ModelView::new(&snapshot);
        let data = ExplorerData::build(&view, None);
        let limit = MAX_BLOCK_GROUPS + data.moments.len() * MAX_SITE_ROWS + MAX_SERIES + 2;
        assert!(data.groups.len() <= limit, "{} groups", data.groups.len());
        let past = data
            .groups
            .iter()
            .position(|g| g.label.starts_with("(a site past"))
            .expect("a group for the sites past the limit") as u64;
        let band = data
            .series
            .iter()
            .find(|s| s.label == "model.py:1")
            .expect("the weights are a band");
        let band = u64::from(band.group.expect("a band of a site"));
        let end = data.moments.iter().find(|m| m.pos == data.events).unwrap();
        assert!(end.name.contains("peak allocated"), "{}", end.name);
        let named: Vec<u64> = end
            .segments
            .iter()
            .flat_map(|r| r.blocks.chunks(4).map(|b| b[3]))
            .collect();
        assert_eq!(named.len(), 1_996 * 6 + 3);
        assert!(named.contains(&past));
        assert_eq!(named.iter().filter(|&&g| g == band).count(), 3);
    }
}
