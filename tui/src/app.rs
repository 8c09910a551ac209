//! The dashboard's state and its reactions to keys, the mouse and data.
//!
//! [`App`] owns the `crate::data::Dataset`, the optional live or in-process source
//! (`crate::source`), the background analysis (`crate::analysis`), and everything the user
//! chose: the panel, the time cursor, zoom, filters, sort orders, pause. The terminal loop of
//! `crate::term` calls [`App::tick`] to take in new data, [`App::prepare`] to compute what the
//! panels need at the cursor, and draws with `crate::ui`; keys go to [`App::handle_key`] and the
//! mouse to [`App::handle_mouse`]. Nothing here touches the terminal, so tests drive it directly.

use std::collections::{BTreeSet, HashMap};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use ratatui::crossterm::event::{
    KeyCode, KeyEvent, KeyEventKind, KeyModifiers, MouseButton, MouseEvent, MouseEventKind,
};
use ratatui::layout::{Position, Rect};
use rustc_hash::FxHashMap;
use vramscope_inspector::import::sites::{is_framework_frame, DEFAULT_FRAMEWORK_PATHS};
use vramscope_model::{EventKind, SiteId, Snapshot};

use crate::analysis::{self, Analysis, Analyzer, Job};
use crate::data::{Dataset, Link, Origin};
use crate::source::{unix_now_ns, Source, Update};
use crate::ui::{self, Theme};

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
}

impl Panel {
    /// Every panel, in tab order (keys 1 to 6).
    pub const ALL: [Panel; 6] = [
        Panel::Overview,
        Panel::Timeline,
        Panel::Segments,
        Panel::Sites,
        Panel::Findings,
        Panel::Events,
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
        }
    }

    fn index(self) -> usize {
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

    fn next(self) -> SiteSort {
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

    fn next(self) -> KindFilter {
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
    /// Hide framework frames in stacks and the tree.
    pub hide_framework: bool,
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

/// What the panels show at the cursor, computed by [`App::prepare`].
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
    /// Indices of events passing the event log's filters.
    pub events: Vec<usize>,
    /// Indices into the analysis findings passing the findings filter.
    pub findings: Vec<usize>,
    /// Figures about the segments at the cursor.
    pub segments: SegmentFigures,
    /// Key of the choices it was computed with.
    key: String,
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
    pub fn of(state: &vramscope_engine::MemoryState) -> SegmentFigures {
        let mut f = SegmentFigures {
            count: state.segments.len() as u64,
            ..SegmentFigures::default()
        };
        for (&addr, seg) in &state.segments {
            let mut live = 0;
            let mut cursor = addr;
            for (&a, b) in state.blocks_in(addr, seg.size) {
                live += b.size;
                f.largest_free = f.largest_free.max(a.saturating_sub(cursor));
                cursor = cursor.max(a + b.size);
            }
            f.largest_free = f.largest_free.max((addr + seg.size).saturating_sub(cursor));
            if live > 0 {
                f.split_bytes += seg.size.saturating_sub(live);
            }
        }
        f
    }
}

/// The dashboard. See the module documentation.
pub struct App {
    /// The data.
    pub data: Dataset,
    /// A snapshot of several devices, whose parts `D` switches between; `None` otherwise.
    pub devices: Option<DeviceSwitch>,
    source: Option<Box<dyn Source>>,
    analyzer: Option<Analyzer>,
    /// The latest analysis.
    pub analysis: Option<Analysis>,
    /// The panel shown.
    pub panel: Panel,
    /// Time cursor position; `None` follows the newest data.
    pub cursor: Option<usize>,
    /// Paused: live data is taken in but the view stays put.
    pub paused: bool,
    /// Timeline zoom: the window shows `1 / 2^zoom` of the events.
    pub zoom: u32,
    /// Scale the timeline to the device capacity instead of the data.
    pub capacity_scale: bool,
    /// The help overlay is open.
    pub help: bool,
    /// A filter being typed.
    pub input: Option<Input>,
    /// Call-site panel choices.
    pub sites: SitesView,
    /// Findings panel choices.
    pub findings: FindingsView,
    /// Event log choices.
    pub events: EventsView,
    /// First segment row shown.
    pub segment_scroll: usize,
    /// A message for the help bar, with the time it was set.
    pub status: Option<(String, u64)>,
    /// The time, in Unix nanoseconds (set by the loop; fixed in tests).
    pub now_unix_ns: u64,
    /// Colours or not.
    pub theme: Theme,
    /// The user asked to quit.
    pub quit: bool,
    /// Where `s` saves snapshots.
    pub save_dir: PathBuf,
    /// The terminal area of the last frame, for the mouse.
    pub area: Rect,
    view: CursorView,
    framework_paths: Vec<String>,
    last_request: Option<(Option<usize>, u64, Instant)>,
    cursor_moved: Option<Instant>,
    /// Rows visible in the last drawn list, for page keys.
    pub page_rows: usize,
    /// One line saying what is running and what to look at (the demo's), shown in the help
    /// bar until the first key.
    pub intro: Option<String>,
}

impl App {
    /// A dashboard over `data`, with no source.
    pub fn new(data: Dataset) -> App {
        App {
            data,
            devices: None,
            source: None,
            analyzer: None,
            analysis: None,
            panel: Panel::Overview,
            cursor: None,
            paused: false,
            zoom: 0,
            capacity_scale: false,
            help: false,
            input: None,
            sites: SitesView {
                selected: 0,
                sort: SiteSort::Bytes,
                tree: false,
                hide_framework: false,
                filter: String::new(),
                detail: false,
                collapsed: BTreeSet::new(),
            },
            findings: FindingsView::default(),
            events: EventsView {
                selected: None,
                kind: KindFilter::All,
                filter: String::new(),
            },
            segment_scroll: 0,
            status: None,
            now_unix_ns: unix_now_ns(),
            theme: Theme::from_env(),
            quit: false,
            save_dir: PathBuf::from("."),
            area: Rect::new(0, 0, 80, 24),
            view: CursorView::default(),
            framework_paths: DEFAULT_FRAMEWORK_PATHS
                .iter()
                .map(|s| s.to_string())
                .collect(),
            last_request: None,
            cursor_moved: None,
            page_rows: 10,
            intro: None,
        }
    }

    /// Adds a live or in-process source.
    pub fn with_source(mut self, source: Box<dyn Source>) -> App {
        self.source = Some(source);
        self
    }

    /// Analyses on a background thread from now on.
    pub fn with_analyzer(mut self) -> App {
        self.analyzer = Some(Analyzer::spawn());
        self
    }

    /// Runs the analysis now, on this thread (tests, and before the first screen).
    pub fn analyze_now(&mut self) {
        let job = self.job();
        self.analysis = Some(analysis::analyze(&job));
    }

    /// The cursor position: events applied.
    pub fn pos(&self) -> usize {
        self.cursor.unwrap_or(self.data.len()).min(self.data.len())
    }

    /// Whether the view follows new data.
    pub fn following(&self) -> bool {
        self.cursor.is_none()
    }

    /// What the panels show at the cursor (after [`App::prepare`]).
    pub fn view(&self) -> &CursorView {
        &self.view
    }

    /// The state at the cursor, as [`App::prepare`] left it (the end state before that).
    pub fn state_for_draw(&self) -> &vramscope_engine::MemoryState {
        let pos = self.pos();
        self.data
            .cached_state(pos)
            .unwrap_or_else(|| self.data.head())
    }

    /// Whether the data comes from a source that keeps sending.
    pub fn is_live(&self) -> bool {
        !matches!(self.data.origin(), Origin::File(_))
    }

    /// Takes in what the source sent, and starts or collects analyses. Returns whether
    /// anything changed.
    pub fn tick(&mut self) -> bool {
        let mut changed = false;
        if let Some(source) = self.source.as_mut() {
            let mut updates = Vec::new();
            source.poll(&mut updates);
            changed |= !updates.is_empty();
            for u in updates {
                self.apply(u);
            }
        }
        if let Some(analyzer) = self.analyzer.as_mut() {
            if let Some(a) = analyzer.latest() {
                self.analysis = Some(a);
                self.view.key.clear();
                changed = true;
            }
        }
        self.schedule_analysis();
        changed
    }

    fn apply(&mut self, update: Update) {
        match update {
            Update::Reset(snapshot) => {
                self.data.reset(*snapshot);
                self.data.link_state = match self.data.link_state {
                    Link::Ended => Link::Ended,
                    _ => Link::Up,
                };
                if self.cursor.is_some_and(|c| c > self.data.len()) {
                    self.cursor = Some(self.data.len());
                }
            }
            Update::Events(events) => self.data.append(&events),
            Update::Tables(t) => self.data.apply_tables(&t),
            Update::Stats {
                stats,
                step,
                dropped_events,
            } => self.data.set_live(*stats, step, dropped_events),
            Update::Connected(who) => {
                self.data.link_state = Link::Up;
                self.set_status(format!("connected to {who}"));
            }
            Update::Disconnected {
                since_unix_ns,
                reason,
            } => {
                if !matches!(self.data.link_state, Link::Down { .. }) {
                    self.data.link_state = Link::Down {
                        since_unix_ns,
                        reason,
                    };
                }
            }
            Update::Ended => self.data.link_state = Link::Ended,
        }
    }

    fn job(&mut self) -> Job {
        let cut = self.cursor.filter(|&c| c < self.data.len());
        let version = self.data.version();
        let snapshot = match cut {
            Some(pos) => std::sync::Arc::new(self.data.snapshot_at(pos)),
            None => self.data.shared_snapshot(),
        };
        Job {
            snapshot,
            cut,
            version,
        }
    }

    /// Asks for a new analysis when the data or the cursor changed and the last one is old
    /// enough: live data at most once a second, cursor moves once the cursor rests.
    fn schedule_analysis(&mut self) {
        let Some(analyzer) = self.analyzer.as_ref() else {
            return;
        };
        if analyzer.busy() {
            return;
        }
        let cut = self.cursor.filter(|&c| c < self.data.len());
        let version = self.data.version();
        let due = match self.last_request {
            None => true,
            Some((last_cut, last_version, at)) => {
                if last_cut != cut {
                    self.cursor_moved
                        .is_none_or(|t| t.elapsed() >= Duration::from_millis(150))
                } else {
                    last_version != version
                        && cut.is_none()
                        && at.elapsed() >= Duration::from_millis(1000)
                }
            }
        };
        if !due {
            return;
        }
        let job = self.job();
        if let Some(analyzer) = self.analyzer.as_mut() {
            analyzer.request(job);
        }
        self.last_request = Some((cut, version, Instant::now()));
    }

    /// Waits up to `timeout` for the first analysis (so the first screen has findings).
    pub fn wait_for_analysis(&mut self, timeout: Duration) {
        self.schedule_analysis();
        if let Some(a) = self.analyzer.as_mut().and_then(|an| an.wait(timeout)) {
            self.analysis = Some(a);
        }
    }

    /// Shows `message` in the help bar for a few seconds.
    pub fn set_status(&mut self, message: impl Into<String>) {
        self.status = Some((message.into(), self.now_unix_ns));
    }

    /// The status message, while it is fresh.
    pub fn status_text(&self) -> Option<&str> {
        self.status.as_ref().and_then(|(m, at)| {
            (self.now_unix_ns.saturating_sub(*at) < 5_000_000_000).then_some(m.as_str())
        })
    }

    /// Stops the source's workload (on quit).
    pub fn shutdown(&mut self) {
        if let Some(s) = self.source.as_mut() {
            s.stop();
        }
    }

    // ---------------------------------------------------------------------------------------
    // The view at the cursor.

    fn view_key(&self) -> String {
        format!(
            "{:?}|{:?}|{}|{:?}|{}|{}|{}|{:?}|{}|{}|{:?}",
            self.panel == Panel::Events,
            self.sites.sort,
            self.sites.tree,
            self.sites.collapsed,
            self.sites.hide_framework,
            self.sites.filter,
            self.events.filter,
            self.events.kind,
            self.findings.filter,
            self.analysis.as_ref().map_or(0, |a| a.version),
            self.analysis.as_ref().map(|a| a.cut),
        )
    }

    /// Prepares a frame of `area`: remembers the area (for the mouse), the rows a page of the
    /// panel's list holds (for the page keys), and computes the view with [`App::prepare`].
    pub fn prepare_frame(&mut self, area: Rect) {
        self.area = area;
        let layout = ui::layout(area, self.panel);
        self.page_rows = usize::from(layout.body.height.saturating_sub(3)).max(1);
        self.prepare();
    }

    /// Computes what the panels need at the cursor, when the data, the cursor or a choice
    /// changed since the last call.
    pub fn prepare(&mut self) {
        let pos = self.pos();
        // Keep the state at the cursor at hand for drawing, even when nothing else changed.
        let _ = self.data.state_at(pos);
        let version = self.data.version();
        let key = self.view_key();
        if self.view.pos == pos && self.view.version == version && self.view.key == key {
            return;
        }
        let growth = self.analysis.as_ref().map(|a| &a.growth);
        let groups = self.data.groups().clone();
        let state = self.data.state_at(pos);
        // Live blocks by group and by site.
        let mut by_group: FxHashMap<u32, SiteRow> = FxHashMap::default();
        let mut by_site: FxHashMap<Option<SiteId>, (u64, u64)> = FxHashMap::default();
        let mut live_blocks = 0u64;
        for b in state.blocks.values() {
            live_blocks += 1;
            let g = groups.of_block(b);
            let row = by_group.entry(g).or_insert(SiteRow {
                group: g,
                bytes: 0,
                blocks: 0,
                requested: 0,
                first_step: b.step,
                last_step: b.step,
                growth: None,
            });
            row.bytes += b.size;
            row.blocks += 1;
            row.requested += b.requested;
            row.first_step = row.first_step.min(b.step);
            row.last_step = row.last_step.max(b.step);
            if self.sites.tree {
                let s = by_site.entry(b.site).or_insert((0, 0));
                s.0 += b.size;
                s.1 += 1;
            }
        }
        let filter = self.sites.filter.to_lowercase();
        let mut sites: Vec<SiteRow> = by_group
            .into_values()
            .filter(|r| {
                filter.is_empty() || {
                    let g = groups.get(r.group);
                    g.label().to_lowercase().contains(&filter)
                        || g.function.to_lowercase().contains(&filter)
                }
            })
            .map(|mut r| {
                r.growth = growth.and_then(|m| m.get(&r.group).copied());
                r
            })
            .collect();
        let label = |r: &SiteRow| groups.get(r.group).label().to_string();
        match self.sites.sort {
            SiteSort::Bytes => {
                sites.sort_by(|a, b| b.bytes.cmp(&a.bytes).then(label(a).cmp(&label(b))))
            }
            SiteSort::Blocks => {
                sites.sort_by(|a, b| b.blocks.cmp(&a.blocks).then(label(a).cmp(&label(b))))
            }
            SiteSort::Growth => sites.sort_by(|a, b| {
                let ga = a.growth.unwrap_or(f64::MIN);
                let gb = b.growth.unwrap_or(f64::MIN);
                gb.total_cmp(&ga).then(b.bytes.cmp(&a.bytes))
            }),
            SiteSort::Name => sites.sort_by_key(label),
        }
        let segments = SegmentFigures::of(state);
        let tree = if self.sites.tree {
            self.build_tree(&by_site, &filter)
        } else {
            Vec::new()
        };
        // The event log's rows cost a pass over every event: only while it is shown.
        let events = if self.panel == Panel::Events {
            self.filtered_events()
        } else {
            Vec::new()
        };
        let findings = self.filtered_findings();
        self.view = CursorView {
            pos,
            version,
            sites,
            tree,
            live_blocks,
            events,
            findings,
            segments,
            key,
        };
        let rows = if self.sites.tree {
            self.view.tree.len()
        } else {
            self.view.sites.len()
        };
        self.sites.selected = self.sites.selected.min(rows.saturating_sub(1));
        self.findings.selected = self
            .findings
            .selected
            .min(self.view.findings.len().saturating_sub(1));
    }

    fn build_tree(
        &self,
        by_site: &FxHashMap<Option<SiteId>, (u64, u64)>,
        filter: &str,
    ) -> Vec<TreeRow> {
        #[derive(Default)]
        struct Node {
            bytes: u64,
            blocks: u64,
            framework: bool,
            children: HashMap<String, Node>,
        }
        let snapshot = self.data.snapshot();
        let mut root = Node::default();
        for (site, &(bytes, blocks)) in by_site {
            let mut path: Vec<(String, bool)> = Vec::new();
            match snapshot.site(*site) {
                Some(s) if !s.frames.is_empty() => {
                    for f in s.frames.iter().rev() {
                        let framework = is_framework_frame(f, &self.framework_paths);
                        if framework && self.sites.hide_framework {
                            continue;
                        }
                        let name = if f.function.is_empty() {
                            "?"
                        } else {
                            &f.function
                        };
                        path.push((format!("{name} ({}:{})", f.file, f.line), framework));
                    }
                }
                Some(s) if s.function.is_empty() => path.push((s.file_line(), false)),
                Some(s) => path.push((format!("{} ({})", s.function, s.file_line()), false)),
                None => path.push(("(unknown site)".to_string(), false)),
            }
            if !filter.is_empty() && !path.iter().any(|(l, _)| l.to_lowercase().contains(filter)) {
                continue;
            }
            let mut node = &mut root;
            for (label, framework) in path {
                node = node.children.entry(label).or_default();
                node.framework = framework;
                node.bytes += bytes;
                node.blocks += blocks;
            }
        }
        fn flatten(
            node: &Node,
            depth: usize,
            parent: &str,
            collapsed: &BTreeSet<String>,
            out: &mut Vec<TreeRow>,
        ) {
            let mut kids: Vec<(&String, &Node)> = node.children.iter().collect();
            kids.sort_by(|a, b| b.1.bytes.cmp(&a.1.bytes).then(a.0.cmp(b.0)));
            for (label, child) in kids {
                let path = if parent.is_empty() {
                    label.clone()
                } else {
                    format!("{parent}\u{1f}{label}")
                };
                let folded = collapsed.contains(&path);
                out.push(TreeRow {
                    depth,
                    label: label.clone(),
                    bytes: child.bytes,
                    blocks: child.blocks,
                    framework: child.framework,
                    path: path.clone(),
                    has_children: !child.children.is_empty(),
                    collapsed: folded,
                });
                if !folded {
                    flatten(child, depth + 1, &path, collapsed, out);
                }
            }
        }
        let mut out = Vec::new();
        flatten(&root, 0, "", &self.sites.collapsed, &mut out);
        out
    }

    fn filtered_events(&self) -> Vec<usize> {
        let filter = self.events.filter.to_lowercase();
        let kind = self.events.kind;
        let snapshot = self.data.snapshot();
        let groups = self.data.groups();
        let site_match: Vec<bool> = if filter.is_empty() {
            Vec::new()
        } else {
            groups
                .all()
                .iter()
                .map(|g| {
                    g.label().to_lowercase().contains(&filter)
                        || g.function.to_lowercase().contains(&filter)
                })
                .collect()
        };
        snapshot
            .events
            .iter()
            .enumerate()
            .filter(|(_, e)| kind.accepts(e.kind))
            .filter(|(_, e)| {
                filter.is_empty()
                    || e.kind.name().contains(&filter)
                    || site_match[groups.of(e.site) as usize]
            })
            .map(|(i, _)| i)
            .collect()
    }

    fn filtered_findings(&self) -> Vec<usize> {
        let Some(a) = &self.analysis else {
            return Vec::new();
        };
        let filter = self.findings.filter.to_lowercase();
        a.findings
            .iter()
            .enumerate()
            .filter(|(_, f)| {
                filter.is_empty()
                    || f.kind.as_str().contains(&filter)
                    || f.site_label().to_lowercase().contains(&filter)
                    || f.summary.to_lowercase().contains(&filter)
            })
            .map(|(i, _)| i)
            .collect()
    }

    // ---------------------------------------------------------------------------------------
    // The time cursor.

    /// Moves the cursor to `pos` (clamped), leaving follow mode.
    pub fn set_cursor(&mut self, pos: usize) {
        let pos = pos.min(self.data.len());
        if self.is_live() && pos == self.data.len() && !self.paused {
            self.cursor = None;
        } else {
            self.cursor = Some(pos);
        }
        self.cursor_moved = Some(Instant::now());
    }

    /// Events per timeline column at the current zoom, for a chart `width` columns wide.
    pub fn window(&self, width: usize) -> (usize, usize) {
        let n = self.data.len();
        let width = width.max(1);
        let span = (n >> self.zoom.min(40)).max(width.min(n)).max(1);
        if span >= n {
            return (0, n);
        }
        let pos = self.pos();
        if self.following() {
            return (n - span, n);
        }
        let start = pos.saturating_sub(span / 2).min(n - span);
        (start, start + span)
    }

    fn move_by_columns(&mut self, columns: i64) {
        let width = usize::from(self.area.width.saturating_sub(12)).max(1);
        let (a, b) = self.window(width);
        let per = ((b - a) as f64 / width as f64).max(1.0);
        let delta = (per * columns as f64).round() as i64;
        let pos = self.pos() as i64 + delta;
        self.set_cursor(pos.max(0) as usize);
    }

    fn step_jump(&mut self, forward: bool) {
        let pos = self.pos();
        let starts = self.data.step_starts();
        let target = if forward {
            starts.iter().map(|&(_, i)| i).find(|&i| i > pos)
        } else {
            starts.iter().map(|&(_, i)| i).rev().find(|&i| i < pos)
        };
        match target {
            Some(t) => self.set_cursor(t),
            None if forward => self.set_cursor(self.data.len()),
            None => self.set_cursor(0),
        }
    }

    /// Moves the cursor to where allocated (or, with `reserved`, reserved) bytes first reach
    /// their peak, and says so in the help bar.
    pub fn go_to_peak(&mut self, reserved: bool) {
        let (pos, what) = if reserved {
            (self.data.peak_reserved_pos(), "reserved")
        } else {
            (self.data.peak_allocated_pos(), "allocated")
        };
        self.set_cursor(pos);
        let usage = self.data.usage_at(pos);
        let bytes = if reserved {
            usage.reserved
        } else {
            usage.allocated
        };
        self.set_status(format!(
            "peak {what} {} after {} events",
            vramscope_model::format_bytes(bytes),
            pos
        ));
    }

    /// Shows the next device of a multi-device snapshot (`D`): its part becomes the data, the
    /// cursor goes to its peak and its findings are worked out afresh.
    pub fn next_device(&mut self) {
        let Some(switch) = self.devices.as_mut() else {
            self.set_status("one device in this file");
            return;
        };
        switch.current = (switch.current + 1) % switch.devices.len();
        let device = switch.devices[switch.current];
        let (current, count) = (switch.current, switch.devices.len());
        let part = vramscope_inspector::devices::only_device(&switch.full, device);
        self.data.reset(part);
        self.analysis = None;
        self.cursor = Some(self.data.peak_allocated_pos());
        self.set_status(format!(
            "cuda:{device} (device {} of {count}), at its peak",
            current + 1
        ));
    }

    /// Which peak the cursor is at, for the header: `Some("at peak")` at the peak of allocated
    /// bytes, `Some("at peak reserved")` at that of reserved bytes.
    pub fn at_peak(&self) -> Option<&'static str> {
        if self.following() && self.is_live() {
            return None;
        }
        let pos = self.pos();
        if pos == self.data.peak_allocated_pos() {
            Some("at peak")
        } else if pos == self.data.peak_reserved_pos() {
            Some("at peak reserved")
        } else {
            None
        }
    }

    fn zoom_in(&mut self) {
        let n = self.data.len().max(1);
        if (n >> (self.zoom + 1)) >= 16 {
            self.zoom += 1;
        }
    }

    fn toggle_pause(&mut self) {
        self.paused = !self.paused;
        if self.paused {
            if self.cursor.is_none() {
                self.cursor = Some(self.data.len());
            }
            self.set_status("paused: the view stays here (p resumes)");
        } else {
            if self.cursor == Some(self.data.len()) || self.is_live() {
                self.cursor = None;
            }
            self.set_status("resumed");
        }
        if let Some(s) = self.source.as_mut() {
            s.set_paused(self.paused);
        }
    }

    /// Saves a snapshot of the state at the cursor as JSON in [`App::save_dir`].
    pub fn save_snapshot(&mut self) {
        let pos = self.pos();
        let snapshot = if pos == self.data.len() {
            self.source
                .as_mut()
                .and_then(|s| s.snapshot())
                .unwrap_or_else(|| self.data.snapshot_at(pos))
        } else {
            self.data.snapshot_at(pos)
        };
        let secs = self.now_unix_ns / 1_000_000_000;
        let mut path = self.save_dir.join(format!("vramscope-{secs}.json"));
        let mut n = 1;
        while path.exists() {
            n += 1;
            path = self.save_dir.join(format!("vramscope-{secs}-{n}.json"));
        }
        match snapshot.save(&path) {
            Ok(()) => self.set_status(format!(
                "saved {} events and {} segments to {}",
                snapshot.events.len(),
                snapshot.segments.len(),
                path.display()
            )),
            Err(e) => self.set_status(format!("could not save: {e}")),
        }
    }

    // ---------------------------------------------------------------------------------------
    // Keys.

    /// Reacts to one key press.
    pub fn handle_key(&mut self, key: KeyEvent) {
        if key.kind == KeyEventKind::Release {
            return;
        }
        self.intro = None;
        let ctrl = key.modifiers.contains(KeyModifiers::CONTROL);
        if ctrl && matches!(key.code, KeyCode::Char('c') | KeyCode::Char('q')) {
            self.quit = true;
            return;
        }
        if let Some(input) = self.input.as_mut() {
            match key.code {
                KeyCode::Esc => self.input = None,
                KeyCode::Enter => {
                    let Input { target, text } = self.input.take().unwrap_or(Input {
                        target: self.panel,
                        text: String::new(),
                    });
                    self.set_filter(target, text);
                }
                KeyCode::Backspace => {
                    input.text.pop();
                    let (t, text) = (input.target, input.text.clone());
                    self.set_filter(t, text);
                }
                KeyCode::Char(c) if !ctrl => {
                    input.text.push(c);
                    let (t, text) = (input.target, input.text.clone());
                    self.set_filter(t, text);
                }
                _ => {}
            }
            return;
        }
        if self.help {
            // Any key closes the help; q still quits.
            self.help = false;
            if key.code == KeyCode::Char('q') {
                self.quit = true;
            }
            return;
        }
        match key.code {
            KeyCode::Char('q') => self.quit = true,
            KeyCode::Esc => {
                if self.sites.detail && self.panel == Panel::Sites {
                    self.sites.detail = false;
                } else if !self.current_filter().is_empty() {
                    self.set_filter(self.panel, String::new());
                } else {
                    self.quit = true;
                }
            }
            KeyCode::Char('?') | KeyCode::F(1) => self.help = true,
            KeyCode::Tab => self.panel = Panel::ALL[(self.panel.index() + 1) % 6],
            KeyCode::BackTab => self.panel = Panel::ALL[(self.panel.index() + 5) % 6],
            KeyCode::Char(c @ '1'..='6') => {
                self.panel = Panel::ALL[(c as u8 - b'1') as usize];
            }
            KeyCode::Char('p') | KeyCode::Char(' ') => self.toggle_pause(),
            KeyCode::Char('s') => self.save_snapshot(),
            KeyCode::Char('/') => {
                let target = match self.panel {
                    Panel::Sites | Panel::Findings | Panel::Events => self.panel,
                    _ => Panel::Events,
                };
                self.panel = target;
                self.input = Some(Input {
                    target,
                    text: self.filter_of(target).to_string(),
                });
            }
            KeyCode::Char('+') | KeyCode::Char('=') => self.zoom_in(),
            KeyCode::Char('-') | KeyCode::Char('_') => self.zoom = self.zoom.saturating_sub(1),
            KeyCode::Char('[') => self.step_jump(false),
            KeyCode::Char(']') => self.step_jump(true),
            KeyCode::Char(',') => self.set_cursor(self.pos().saturating_sub(1)),
            KeyCode::Char('.') => self.set_cursor(self.pos() + 1),
            KeyCode::Home | KeyCode::Char('g') => self.set_cursor(0),
            KeyCode::End | KeyCode::Char('G') => {
                self.cursor = None;
                if !self.is_live() || self.paused {
                    self.cursor = Some(self.data.len());
                }
            }
            KeyCode::Char('c') => self.capacity_scale = !self.capacity_scale,
            KeyCode::Char('P') => self.go_to_peak(false),
            KeyCode::Char('R') => self.go_to_peak(true),
            KeyCode::Char('D') => self.next_device(),
            KeyCode::Left | KeyCode::Char('h') => self.horizontal(-1, key.modifiers),
            KeyCode::Right | KeyCode::Char('l') => self.horizontal(1, key.modifiers),
            KeyCode::Char('H') => self.horizontal(-10, key.modifiers),
            KeyCode::Char('L') => self.horizontal(10, key.modifiers),
            KeyCode::Up | KeyCode::Char('k') => self.vertical(-1),
            KeyCode::Down | KeyCode::Char('j') => self.vertical(1),
            KeyCode::PageUp => self.vertical(-(self.page_rows.max(1) as i64)),
            KeyCode::PageDown => self.vertical(self.page_rows.max(1) as i64),
            KeyCode::Enter => self.enter(),
            KeyCode::Char('o') if self.panel == Panel::Sites => {
                self.sites.sort = self.sites.sort.next();
            }
            KeyCode::Char('t') if self.panel == Panel::Sites => {
                self.sites.tree = !self.sites.tree;
                self.sites.detail = false;
                self.sites.selected = 0;
            }
            KeyCode::Char('f') if self.panel == Panel::Sites => {
                self.sites.hide_framework = !self.sites.hide_framework;
            }
            KeyCode::Char('e') if self.panel == Panel::Events => {
                self.events.kind = self.events.kind.next();
                self.events.selected = None;
            }
            _ => {}
        }
    }

    fn filter_of(&self, panel: Panel) -> &str {
        match panel {
            Panel::Sites => &self.sites.filter,
            Panel::Findings => &self.findings.filter,
            _ => &self.events.filter,
        }
    }

    fn current_filter(&self) -> &str {
        match self.panel {
            Panel::Sites | Panel::Findings | Panel::Events => self.filter_of(self.panel),
            _ => "",
        }
    }

    fn set_filter(&mut self, panel: Panel, text: String) {
        match panel {
            Panel::Sites => {
                self.sites.filter = text;
                self.sites.selected = 0;
            }
            Panel::Findings => {
                self.findings.filter = text;
                self.findings.selected = 0;
            }
            _ => {
                self.events.filter = text;
                self.events.selected = None;
            }
        }
    }

    fn horizontal(&mut self, dir: i64, modifiers: KeyModifiers) {
        let fine = matches!(self.panel, Panel::Overview | Panel::Timeline);
        if fine || modifiers.contains(KeyModifiers::SHIFT) {
            self.move_by_columns(dir);
        } else if dir < 0 {
            self.step_jump(false);
        } else {
            self.step_jump(true);
        }
    }

    fn vertical(&mut self, delta: i64) {
        let clamp = |v: usize, d: i64, len: usize| -> usize {
            let v = v as i64 + d;
            v.clamp(0, len.saturating_sub(1) as i64) as usize
        };
        match self.panel {
            Panel::Sites => {
                let len = if self.sites.tree {
                    self.view.tree.len()
                } else {
                    self.view.sites.len()
                };
                self.sites.selected = clamp(self.sites.selected, delta, len);
            }
            Panel::Findings => {
                self.findings.selected =
                    clamp(self.findings.selected, delta, self.view.findings.len());
            }
            Panel::Events => {
                let list = &self.view.events;
                if list.is_empty() {
                    return;
                }
                let current = self
                    .events
                    .selected
                    .and_then(|s| list.iter().position(|&i| i == s))
                    .unwrap_or_else(|| ui::events::cursor_row(list, self.pos()));
                let row = clamp(current, delta, list.len());
                self.events.selected = Some(list[row]);
            }
            Panel::Segments => {
                let len = self.data.state_at(self.pos()).segments.len();
                self.segment_scroll = clamp(self.segment_scroll, delta, len);
            }
            Panel::Overview | Panel::Timeline => {
                if delta < 0 {
                    self.zoom_in();
                } else {
                    self.zoom = self.zoom.saturating_sub(1);
                }
            }
        }
    }

    fn enter(&mut self) {
        match self.panel {
            Panel::Sites if !self.sites.tree => self.sites.detail = !self.sites.detail,
            Panel::Sites => {
                // Fold or unfold the selected node of the stack tree.
                if let Some(row) = self.view.tree.get(self.sites.selected) {
                    if row.has_children && !self.sites.collapsed.remove(&row.path) {
                        self.sites.collapsed.insert(row.path.clone());
                    }
                    // The rows below moved: the next key of the same batch must see them.
                    self.prepare();
                }
            }
            Panel::Events => {
                if let Some(i) = self.events.selected {
                    self.set_cursor(i + 1);
                    self.set_status(format!("time cursor at event {}", i + 1));
                }
            }
            Panel::Findings => {
                // Jump to the finding's site in the call-site panel.
                let finding = self
                    .view
                    .findings
                    .get(self.findings.selected)
                    .and_then(|&i| self.analysis.as_ref()?.findings.get(i));
                if let Some(site) = finding.and_then(|f| f.site.clone()) {
                    self.panel = Panel::Sites;
                    self.sites.tree = false;
                    self.sites.filter = site;
                    self.sites.selected = 0;
                    self.sites.detail = true;
                }
            }
            _ => {}
        }
    }

    // ---------------------------------------------------------------------------------------
    // The mouse.

    /// Reacts to a mouse event: clicks on tabs, rows and the timeline; the wheel scrolls.
    pub fn handle_mouse(&mut self, mouse: MouseEvent) {
        let at = Position::new(mouse.column, mouse.row);
        let layout = ui::layout(self.area, self.panel);
        match mouse.kind {
            MouseEventKind::ScrollUp => self.vertical(-3),
            MouseEventKind::ScrollDown => self.vertical(3),
            MouseEventKind::Down(MouseButton::Left) => {
                if layout.tabs.contains(at) {
                    if let Some(p) = ui::tab_at(layout.tabs, mouse.column) {
                        self.panel = p;
                    }
                    return;
                }
                if let Some(chart) = layout.timeline.filter(|r| r.contains(at)) {
                    let plot = ui::timeline::plot_area(chart);
                    if plot.width > 0 {
                        let (a, b) = self.window(plot.width as usize);
                        let col = mouse.column.saturating_sub(plot.x).min(plot.width - 1);
                        let pos = a + (b - a) * (col as usize + 1) / plot.width as usize;
                        self.set_cursor(pos);
                    }
                    return;
                }
                if layout.body.contains(at) {
                    let row = mouse.row.saturating_sub(layout.body.y + 2) as usize;
                    match self.panel {
                        Panel::Sites => self.sites.selected = self.sites_scroll_base() + row,
                        Panel::Findings => self.findings.selected = row,
                        _ => {}
                    }
                }
            }
            _ => {}
        }
    }

    fn sites_scroll_base(&self) -> usize {
        self.sites
            .selected
            .saturating_sub(self.page_rows.saturating_sub(1))
    }
}

/// The devices of a multi-device snapshot, for [`App::next_device`].
#[derive(Debug)]
pub struct DeviceSwitch {
    /// The whole snapshot, every device's data.
    pub full: Snapshot,
    /// The devices with data, in increasing order.
    pub devices: Vec<u32>,
    /// Index into `devices` of the device shown.
    pub current: usize,
}
