//! The view model: the user's choices and what the panels show, as plain data.
//!
//! The widgets of `crate::ui` draw from a [`ViewModel`], which holds references to the dataset
//! (`crate::data`), the latest analysis (`crate::analysis`), the [`CursorView`] computed at the
//! time cursor, and copies of the choices (panel, zoom, filters, sort orders); they never see
//! the dashboard itself. `crate::app::App` owns the choices, computes the [`CursorView`] in
//! `App::prepare` and hands a [`ViewModel`] to `crate::ui::draw` through [`ViewSource`];
//! `crate::fleet::Fleet` does the same with a [`FleetView`] for its table. So the imports run
//! one way: `app` and `fleet` import `ui` (for the layout and the mouse) and this module, `ui`
//! imports only this module, `data`, `analysis` and `theme`, and this module imports none of
//! `app`, `fleet` or `ui`.

use std::collections::BTreeSet;

use vramscope_engine::MemoryState;
use vramscope_model::EventKind;

use crate::analysis::Analysis;
use crate::data::Dataset;
use crate::theme::Theme;

/// The panels, in tab order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Panel {
    /// Timeline, findings and top call sites together.
    Overview,
    /// Allocated, reserved and capacity over time.
    Timeline,
    /// Every segment as a row of cells.
    Segments,
    /// Live memory by call site.
    Sites,
    /// What the detectors found.
    Findings,
    /// Every event.
    Events,
    /// What the memory at the cursor is made of: the categories as a bar, and the live bytes
    /// by the user's call tree.
    Memory,
}

impl Panel {
    /// Every panel, in tab order (keys 1 to 6).
    pub const ALL: [Panel; 7] = [
        Panel::Overview,
        Panel::Timeline,
        Panel::Segments,
        Panel::Sites,
        Panel::Findings,
        Panel::Events,
        Panel::Memory,
    ];

    /// The tab title.
    pub fn title(self) -> &'static str {
        match self {
            Panel::Overview => "Overview",
            Panel::Timeline => "Timeline",
            Panel::Segments => "Segments",
            Panel::Sites => "Call sites",
            Panel::Findings => "Findings",
            Panel::Events => "Events",
            Panel::Memory => "Memory",
        }
    }

    /// The panel's place in [`Panel::ALL`].
    pub fn index(self) -> usize {
        Panel::ALL.iter().position(|&p| p == self).unwrap_or(0)
    }
}

/// How the call-site table is ordered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SiteSort {
    /// Live bytes, largest first.
    Bytes,
    /// Live blocks, most first.
    Blocks,
    /// Growth per step, fastest first.
    Growth,
    /// `file:line`.
    Name,
}

impl SiteSort {
    /// The column name.
    pub fn name(self) -> &'static str {
        match self {
            SiteSort::Bytes => "bytes",
            SiteSort::Blocks => "blocks",
            SiteSort::Growth => "growth",
            SiteSort::Name => "name",
        }
    }

    /// The order after this one, as `o` cycles them.
    pub fn next(self) -> SiteSort {
        match self {
            SiteSort::Bytes => SiteSort::Blocks,
            SiteSort::Blocks => SiteSort::Growth,
            SiteSort::Growth => SiteSort::Name,
            SiteSort::Name => SiteSort::Bytes,
        }
    }
}

/// Which events the event log shows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KindFilter {
    /// Everything.
    All,
    /// Allocations and frees.
    Blocks,
    /// Segment allocations, frees and (un)maps, and `empty_cache`.
    Segments,
    /// Copies and syncs.
    Transfers,
    /// Step marks and snapshots.
    Steps,
    /// Failed allocations.
    Ooms,
}

impl KindFilter {
    /// The filter's name.
    pub fn name(self) -> &'static str {
        match self {
            KindFilter::All => "all",
            KindFilter::Blocks => "alloc/free",
            KindFilter::Segments => "segments",
            KindFilter::Transfers => "transfers",
            KindFilter::Steps => "steps",
            KindFilter::Ooms => "ooms",
        }
    }

    /// The filter after this one, as `e` cycles them.
    pub fn next(self) -> KindFilter {
        match self {
            KindFilter::All => KindFilter::Blocks,
            KindFilter::Blocks => KindFilter::Segments,
            KindFilter::Segments => KindFilter::Transfers,
            KindFilter::Transfers => KindFilter::Steps,
            KindFilter::Steps => KindFilter::Ooms,
            KindFilter::Ooms => KindFilter::All,
        }
    }

    /// Whether `kind` passes.
    pub fn accepts(self, kind: EventKind) -> bool {
        match self {
            KindFilter::All => true,
            KindFilter::Blocks => matches!(
                kind,
                EventKind::Alloc | EventKind::FreeRequested | EventKind::FreeCompleted
            ),
            KindFilter::Segments => matches!(
                kind,
                EventKind::SegmentAlloc
                    | EventKind::SegmentFree
                    | EventKind::SegmentMap
                    | EventKind::SegmentUnmap
                    | EventKind::EmptyCache
            ),
            KindFilter::Transfers => matches!(kind, EventKind::Transfer(_) | EventKind::Sync),
            KindFilter::Steps => matches!(kind, EventKind::Step | EventKind::Snapshot),
            KindFilter::Ooms => kind == EventKind::Oom,
        }
    }
}

/// The call-site panel's choices.
#[derive(Clone, Debug, PartialEq)]
pub struct SitesView {
    /// Selected row.
    pub selected: usize,
    /// Sort order of the table.
    pub sort: SiteSort,
    /// Show the stacks as a tree instead of the table.
    pub tree: bool,
    /// Hide framework frames in the stack tree (`f` in the table or the tree).
    pub hide_framework: bool,
    /// Show every frame of the stacks in the detail view (`f` there); otherwise each run of
    /// framework frames is folded into one line (`crate::ui::stack`), so that the user's own
    /// frames are on screen.
    pub all_frames: bool,
    /// Only rows whose text contains this (case-insensitive).
    pub filter: String,
    /// Showing the selected site's stack and blocks.
    pub detail: bool,
    /// Stack-tree nodes folded by the user (Enter on a node), by [`TreeRow::path`]: their
    /// frames below are hidden.
    pub collapsed: BTreeSet<String>,
}

/// The findings panel's choices.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FindingsView {
    /// Selected finding.
    pub selected: usize,
    /// Filter text.
    pub filter: String,
}

/// The event log's choices.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EventsView {
    /// Selected event index, `None` to follow the time cursor.
    pub selected: Option<usize>,
    /// Kind filter.
    pub kind: KindFilter,
    /// Text filter on kind names and call sites.
    pub filter: String,
}

/// The memory panel's choices: the selected row of the call tree and the nodes the user folded
/// or opened (by their path of labels), which stay so as the cursor moves.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MemoryView {
    /// The selected row.
    pub selected: usize,
    /// Nodes whose folding the user turned from its default (the largest nodes open while
    /// their rows fit the panel, the rest folded), by [`MemoryRow::path`].
    pub toggled: BTreeSet<String>,
}

/// One visible row of the memory panel's call tree.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemoryRow {
    /// Depth below the root's children (0 for them).
    pub depth: usize,
    /// The node's label (`model.py:31 forward`, `GPT.h.3.attn`).
    pub label: String,
    /// Live bytes under the node.
    pub bytes: u64,
    /// Live blocks under the node.
    pub blocks: u64,
    /// The category holding most of the node's bytes.
    pub main: Option<vramscope_model::Category>,
    /// The labels from the root's child down to this node, joined by `\u{1f}`.
    pub path: String,
    /// Whether the node has children.
    pub has_children: bool,
    /// Whether its children are hidden.
    pub folded: bool,
}

/// A text field being typed into.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Input {
    /// The panel whose filter it edits.
    pub target: Panel,
    /// The text so far.
    pub text: String,
}

/// One call-site group's holdings at the cursor.
#[derive(Clone, Debug, PartialEq)]
pub struct SiteRow {
    /// The group (`crate::data::Groups`).
    pub group: u32,
    /// Live bytes.
    pub bytes: u64,
    /// Live blocks.
    pub blocks: u64,
    /// Bytes requested in them.
    pub requested: u64,
    /// Lowest step the blocks were allocated in.
    pub first_step: u64,
    /// Highest step.
    pub last_step: u64,
    /// Bytes per step lately, from the analysis.
    pub growth: Option<f64>,
}

/// One node of the stack tree, flattened in display order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TreeRow {
    /// Nesting depth (0 for outermost frames).
    pub depth: usize,
    /// `function (file:line)`.
    pub label: String,
    /// Live bytes under this frame.
    pub bytes: u64,
    /// Live blocks under this frame.
    pub blocks: u64,
    /// Whether the frame is framework code.
    pub framework: bool,
    /// The labels from the outermost frame down to this one, joined by a unit separator: the
    /// node's name in [`SitesView::collapsed`].
    pub path: String,
    /// Whether the node has frames below it.
    pub has_children: bool,
    /// Whether those frames are folded away.
    pub collapsed: bool,
}

/// What the panels show at the cursor, computed by `crate::app::App::prepare`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CursorView {
    /// Position the view describes.
    pub pos: usize,
    /// Dataset version it was computed from.
    pub version: u64,
    /// Call-site rows, filtered and sorted.
    pub sites: Vec<SiteRow>,
    /// The stack tree, when the tree view is on.
    pub tree: Vec<TreeRow>,
    /// Live blocks at the cursor.
    pub live_blocks: u64,
    /// Indices of events passing the event log's filters, ascending (kept up to date while the
    /// event log is shown; the cursor does not change them): four bytes each, as a trace's
    /// event indices are.
    pub events: Vec<u32>,
    /// Indices into the analysis findings passing the findings filter.
    pub findings: Vec<usize>,
    /// Figures about the segments at the cursor.
    pub segments: SegmentFigures,
    /// Allocated bytes at the cursor by category (the memory panel's bar; zero elsewhere).
    pub categories: vramscope_model::CategoryBytes,
    /// The memory panel's visible tree rows (empty elsewhere).
    pub memory: Vec<MemoryRow>,
    /// Key of the choices it was computed with.
    pub(crate) key: String,
}

/// Figures about the segments at the cursor, for the segment map's title.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SegmentFigures {
    /// Number of segments.
    pub count: u64,
    /// Free bytes in segments that hold live blocks.
    pub split_bytes: u64,
    /// The largest free range inside any segment.
    pub largest_free: u64,
}

impl SegmentFigures {
    /// Computes the figures of `state` in one pass over its segments and blocks.
    pub fn from_state(state: &MemoryState) -> SegmentFigures {
        let mut f = SegmentFigures {
            count: state.segments.len() as u64,
            ..SegmentFigures::default()
        };
        for (&addr, seg) in &state.segments {
            let (split, largest_free) = SegmentFigures::of_segment(state, addr, seg.size);
            f.largest_free = f.largest_free.max(largest_free);
            f.split_bytes = f.split_bytes.wrapping_add(split);
        }
        f
    }

    /// One segment's part of the figures, the segment at `addr` of `size` bytes: its free
    /// bytes when it holds live blocks (else 0), and its largest free range.
    pub fn of_segment(state: &MemoryState, addr: u64, size: u64) -> (u64, u64) {
        let mut live = 0u64;
        let mut largest_free = 0;
        let mut cursor = addr;
        for (a, len) in state.block_extents_in(addr, size) {
            live = live.wrapping_add(len);
            largest_free = largest_free.max(a.saturating_sub(cursor));
            cursor = cursor.max(a + len);
        }
        largest_free = largest_free.max((addr + size).saturating_sub(cursor));
        let split = if live > 0 {
            size.saturating_sub(live)
        } else {
            0
        };
        (split, largest_free)
    }
}

/// The time window a timeline `width` columns wide shows: `len` events at `zoom` (the window
/// holds `1 / 2^zoom` of them, at least one per column), around `pos`, or ending at the newest
/// event when `following`.
pub fn window(len: usize, zoom: u32, pos: usize, following: bool, width: usize) -> (usize, usize) {
    let n = len;
    let width = width.max(1);
    let span = (n >> zoom.min(40)).max(width.min(n)).max(1);
    if span >= n {
        return (0, n);
    }
    if following {
        return (n - span, n);
    }
    let start = pos.saturating_sub(span / 2).min(n - span);
    (start, start + span)
}

/// Everything one frame of the dashboard shows, by reference: what `crate::ui::draw` reads.
#[derive(Clone, Copy, Debug)]
pub struct ViewModel<'a> {
    /// Colours or not.
    pub theme: Theme,
    /// The panel shown.
    pub panel: Panel,
    /// The data.
    pub data: &'a Dataset,
    /// The memory state at the cursor (the end state when it is not at hand).
    pub state: &'a MemoryState,
    /// What the panels show at the cursor.
    pub view: &'a CursorView,
    /// The latest analysis, once there is one.
    pub analysis: Option<&'a Analysis>,
    /// The findings of the whole file, for a file (shown beside the cursor's).
    pub file_findings: Option<&'a [vramscope_analysis::detect::Finding]>,
    /// The cursor position: events applied.
    pub pos: usize,
    /// Whether the view follows new data.
    pub following: bool,
    /// Whether the data comes from a source that keeps sending.
    pub live: bool,
    /// Live data is taken in but the view stays put.
    pub paused: bool,
    /// `Some("at peak")` or `Some("at peak reserved")` when the cursor is at that peak.
    pub at_peak: Option<&'static str>,
    /// Timeline zoom: the window shows `1 / 2^zoom` of the events.
    pub zoom: u32,
    /// Scale the timeline to the device capacity instead of the data.
    pub capacity_scale: bool,
    /// The help overlay is open.
    pub help: bool,
    /// A filter being typed.
    pub input: Option<&'a Input>,
    /// The status message, while it is fresh.
    pub status: Option<&'a str>,
    /// The line saying what runs, until the first key.
    pub intro: Option<&'a str>,
    /// The time, in Unix nanoseconds.
    pub now_unix_ns: u64,
    /// Call-site panel choices.
    pub sites: &'a SitesView,
    /// Findings panel choices.
    pub findings: &'a FindingsView,
    /// Event log choices.
    pub events: &'a EventsView,
    /// First segment row shown.
    pub segment_scroll: usize,
    /// The memory panel's choices.
    pub memory: &'a MemoryView,
}

impl ViewModel<'_> {
    /// The events a timeline `width` columns wide shows (see [`window`]).
    pub fn window(&self, width: usize) -> (usize, usize) {
        window(self.data.len(), self.zoom, self.pos, self.following, width)
    }
}

/// Anything a dashboard screen can be drawn from: `crate::app::App`, or a [`ViewModel`] itself.
pub trait ViewSource {
    /// The view model of the next frame.
    fn view_model(&self) -> ViewModel<'_>;
}

impl ViewSource for ViewModel<'_> {
    fn view_model(&self) -> ViewModel<'_> {
        *self
    }
}

/// What the fleet's table shows of one process (`crate::fleet::Row`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProcessRow {
    /// The address or name the process was given by.
    pub label: String,
    /// The program, as its publisher introduced itself, without the device.
    pub program: Option<String>,
    /// The link state: `up`, `connecting…`, `down: <reason>` or `ended`.
    pub link: String,
    /// Whether the link is down.
    pub down: bool,
    /// The latest step.
    pub step: u64,
    /// Allocated bytes now.
    pub allocated: u64,
    /// Reserved bytes now.
    pub reserved: u64,
    /// The most bytes allocated at once so far.
    pub peak_allocated: u64,
    /// Out-of-memory errors seen.
    pub ooms: usize,
    /// Findings of the latest analysis; `None` until the first one.
    pub findings: Option<usize>,
    /// Seconds since the process last sent anything; `None` if it never did.
    pub last_update_s: Option<u64>,
}

/// What a fleet's screen shows: one process's dashboard, or the table of them all.
#[derive(Clone, Debug)]
pub enum FleetView<'a> {
    /// The open process's dashboard.
    Open(ViewModel<'a>),
    /// The table.
    Table {
        /// One row per process.
        rows: Vec<ProcessRow>,
        /// The selected row.
        selected: usize,
        /// Colours or not.
        theme: Theme,
    },
}

/// Anything a fleet's screen can be drawn from: `crate::fleet::Fleet`.
pub trait FleetSource {
    /// The view of the next frame.
    fn fleet_view(&self) -> FleetView<'_>;
}
