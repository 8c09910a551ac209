//! The dashboard's state, and its intake of data and analyses.
//!
//! [`App`] owns the `crate::data::Dataset`, the optional live or in-process source
//! (`crate::source`), the background analysis (`crate::analysis`), and everything the user
//! chose: the panel, the time cursor, zoom, filters, sort orders, pause. The terminal loop of
//! `crate::term` calls [`App::tick`] to take in new data, [`App::prepare`] to compute what the
//! panels need at the cursor, and draws with `crate::ui::draw`, which reads the app only through
//! the plain view model of `crate::view` ([`App::view_model`]); keys go to [`App::handle_key`]
//! and the mouse to [`App::handle_mouse`]. Nothing here touches the terminal, so tests drive it
//! directly.
//!
//! The submodules add to [`App`]: `prepare` computes the view at the cursor (call-site rows, the
//! stack tree, the filtered finding list, and through `event_rows` the event log's rows, kept
//! across cursor moves), `cursor` moves the time cursor (steps, peaks, zoom, pause, the device
//! switch) and `input` turns keys and the mouse into those moves and choices. The choice types
//! live in `crate::view` and are re-exported here.

mod cursor;
mod event_rows;
mod input;
mod prepare;

use std::collections::{BTreeSet, VecDeque};
use std::path::PathBuf;
use std::sync::mpsc::{self, Receiver, TryRecvError};
use std::time::{Duration, Instant};

use ratatui::layout::Rect;
use vramscope_engine::MemoryState;
use vramscope_import::sites::DEFAULT_FRAMEWORK_PATHS;
use vramscope_model::Snapshot;

use crate::analysis::{self, Analysis, Analyzer, Job};
use crate::data::{Dataset, Link, Origin};
use crate::source::{unix_now_ns, Source, Update};
use crate::theme::Theme;
pub use crate::view::{
    CursorView, EventsView, FindingsView, Input, KindFilter, MemoryRow, MemoryView, Panel,
    SegmentFigures, SiteRow, SiteSort, SitesView, TreeRow,
};
use crate::view::{ViewModel, ViewSource};

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
    /// The findings of the whole file (the device shown), which the findings panel shows
    /// beside the cursor's; `None` for live data.
    pub file_findings: Option<Vec<vramscope_analysis::detect::Finding>>,
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
    /// Memory panel choices.
    pub memory: MemoryView,
    /// What every allocation of the data is (`vramscope_analysis::categories`), made while
    /// the memory panel is shown, with the data's version and epoch and when it was made.
    categories: Option<prepare::Classified>,
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
    /// What `view.events` was computed from (`event_rows`), if it was.
    event_rows_key: Option<event_rows::RowsKey>,
    framework_paths: Vec<String>,
    last_request: Option<(Option<usize>, u64, Instant)>,
    cursor_moved: Option<Instant>,
    /// Rows visible in the last drawn list, for page keys.
    pub page_rows: usize,
    /// One line saying what is running and what to look at (the demo's), shown in the help
    /// bar until the first key.
    pub intro: Option<String>,
    /// Updates the source sent that [`App::tick`] has not applied yet: each tick applies at
    /// most [`TICK_WORK`] of them (large ones in pieces), so that the loop draws and reads
    /// keys between ticks however fast the source sends.
    backlog: VecDeque<Update>,
    /// Whether the last tick stopped at its bound with updates left (see [`App::saturated`]).
    saturated: bool,
    /// A snapshot too large for one tick being loaded on a thread of its own.
    loading: Option<Receiver<Dataset>>,
}

/// The most work one [`App::tick`] does on the source's updates before the terminal loop
/// draws and reads keys again, in units of one event appended or one call-site, tag or scope
/// entry added (each about a microsecond in a release build); a re-synchronising snapshot
/// costs its events and entries together, anything else one. An `Events` or `Tables` update
/// larger than what is left of it is applied in pieces over several ticks; a snapshot ends
/// the tick, and one larger than this bound is loaded on a thread of its own while the
/// dashboard goes on drawing and reading keys (nothing else is taken in meanwhile).
/// About 10 ms of work in a release build: while updates wait, the loop ticks again at once
/// after reading keys (`App::saturated`), so the bound costs no throughput and `q` answers
/// under any flood.
pub const TICK_WORK: usize = 8192;

impl App {
    /// A dashboard over `data`, with no source.
    pub fn new(data: Dataset) -> App {
        App {
            data,
            devices: None,
            source: None,
            analyzer: None,
            analysis: None,
            file_findings: None,
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
                all_frames: false,
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
            memory: MemoryView::default(),
            categories: None,
            status: None,
            now_unix_ns: unix_now_ns(),
            theme: Theme::from_env(),
            quit: false,
            save_dir: PathBuf::from("."),
            area: Rect::new(0, 0, 80, 24),
            view: CursorView::default(),
            event_rows_key: None,
            framework_paths: DEFAULT_FRAMEWORK_PATHS
                .iter()
                .map(|s| s.to_string())
                .collect(),
            last_request: None,
            cursor_moved: None,
            page_rows: 10,
            intro: None,
            backlog: VecDeque::new(),
            saturated: false,
            loading: None,
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
    pub fn state_for_draw(&self) -> &MemoryState {
        let pos = self.pos();
        self.data
            .cached_state(pos)
            .unwrap_or_else(|| self.data.head())
    }

    /// Whether the data comes from a source that keeps sending.
    pub fn is_live(&self) -> bool {
        !matches!(self.data.origin(), Origin::File(_))
    }

    /// Takes in what the source sent (at most [`TICK_WORK`] of it: the rest waits for the
    /// next tick), and starts or collects analyses. Returns whether anything changed.
    pub fn tick(&mut self) -> bool {
        let mut changed = false;
        self.saturated = false;
        let mut intake = self.source.is_some();
        if let Some(loading) = &self.loading {
            match loading.try_recv() {
                Ok(data) => {
                    self.loading = None;
                    self.data.adopt(data);
                    self.after_reset();
                    changed = true;
                }
                Err(TryRecvError::Empty) => intake = false,
                Err(TryRecvError::Disconnected) => self.loading = None,
            }
        }
        if intake {
            let mut budget = TICK_WORK;
            while budget > 0 {
                if self.backlog.is_empty() {
                    let mut updates = Vec::new();
                    if let Some(source) = self.source.as_mut() {
                        source.poll(&mut updates);
                    }
                    if updates.is_empty() {
                        break;
                    }
                    self.backlog.extend(updates);
                }
                let Some(update) = self.backlog.pop_front() else {
                    break;
                };
                let (piece, rest) = split_update(update, budget);
                if let Some(rest) = rest {
                    self.backlog.push_front(rest);
                }
                let work = work_of(&piece).max(1);
                budget = budget.saturating_sub(work);
                changed = true;
                if let Update::Reset(snapshot) = piece {
                    if work > TICK_WORK {
                        self.load_aside(snapshot);
                        break;
                    }
                    self.apply(Update::Reset(snapshot));
                    budget = 0;
                    continue;
                }
                self.apply(piece);
            }
            self.saturated = budget == 0;
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

    /// Whether the last [`App::tick`] stopped at its bound ([`TICK_WORK`]) rather than for
    /// want of updates: the terminal loop then reads keys without waiting and ticks again.
    pub fn saturated(&self) -> bool {
        self.saturated
    }

    /// Updates received and not applied yet (see [`App::tick`]).
    pub fn backlog(&self) -> usize {
        self.backlog.len()
    }

    /// What follows a new snapshot: the link is up, and the cursor within the data.
    fn after_reset(&mut self) {
        self.data.link_state = match self.data.link_state {
            Link::Ended => Link::Ended,
            _ => Link::Up,
        };
        if self.cursor.is_some_and(|c| c > self.data.len()) {
            self.cursor = Some(self.data.len());
        }
    }

    /// Loads a snapshot too large for one tick on a thread of its own; [`App::tick`] takes
    /// the dataset in once it is made, and takes in nothing else meanwhile (what the source
    /// sends after the snapshot waits, and behind it the socket).
    fn load_aside(&mut self, snapshot: Box<Snapshot>) {
        let (tx, rx) = mpsc::channel();
        let origin = self.data.origin().clone();
        let events = snapshot.events.len();
        let spawned = std::thread::Builder::new()
            .name("vramscope-load".to_string())
            .spawn(move || {
                let _ = tx.send(Dataset::new(*snapshot, origin));
            });
        if spawned.is_ok() {
            self.loading = Some(rx);
            self.set_status(format!("taking in a snapshot of {events} events…"));
        }
    }

    fn apply(&mut self, update: Update) {
        match update {
            Update::Reset(snapshot) => {
                self.data.reset(*snapshot);
                self.after_reset();
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
        // The cut at the cursor (a prefix of the shared events, and a copy of the tables) is the
        // analysis thread's to make.
        let (snapshot, cut) = match cut {
            Some(pos) => {
                let (snapshot, state) = self.data.cut_state_at(pos);
                (snapshot, Some((pos, state)))
            }
            None => (self.data.shared_snapshot(), None),
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

    /// What the next frame shows, for `crate::ui::draw` (after [`App::prepare`]).
    pub fn view_model(&self) -> ViewModel<'_> {
        ViewModel {
            theme: self.theme,
            panel: self.panel,
            data: &self.data,
            state: self.state_for_draw(),
            view: &self.view,
            analysis: self.analysis.as_ref(),
            file_findings: self.file_findings.as_deref(),
            pos: self.pos(),
            following: self.following(),
            live: self.is_live(),
            paused: self.paused,
            at_peak: self.at_peak(),
            zoom: self.zoom,
            capacity_scale: self.capacity_scale,
            help: self.help,
            input: self.input.as_ref(),
            status: self.status_text(),
            intro: self.intro.as_deref(),
            now_unix_ns: self.now_unix_ns,
            sites: &self.sites,
            findings: &self.findings,
            events: &self.events,
            segment_scroll: self.segment_scroll,
            memory: &self.memory,
        }
    }
}

impl ViewSource for App {
    fn view_model(&self) -> ViewModel<'_> {
        App::view_model(self)
    }
}

/// The work of applying `update`, in the units of [`TICK_WORK`].
pub fn work_of(update: &Update) -> usize {
    match update {
        Update::Events(events) => events.len(),
        Update::Tables(t) => t.sites.len() + t.tags.len() + t.scopes.len(),
        Update::Reset(s) => s.events.len() + s.sites.len() + s.tags.len() + s.scopes.len(),
        _ => 1,
    }
}

/// `update`, or the first piece of it that fits in `budget` work units and the rest, for
/// updates that split: events by count, table additions by entries (the rest starting at
/// the index after the piece's last entry).
fn split_update(update: Update, budget: usize) -> (Update, Option<Update>) {
    match update {
        Update::Events(mut events) if events.len() > budget.max(1) => {
            let rest = events.split_off(budget.max(1));
            (Update::Events(events), Some(Update::Events(rest)))
        }
        Update::Tables(mut t) if t.sites.len() + t.tags.len() + t.scopes.len() > budget.max(1) => {
            let mut room = budget.max(1);
            let mut rest = vramscope_telemetry::TablesFrame::default();
            let sites = t.sites.len().min(room);
            room -= sites;
            rest.sites_from = t.sites_from.saturating_add(sites as u32);
            rest.sites = t.sites.split_off(sites);
            let tags = t.tags.len().min(room);
            room -= tags;
            rest.tags_from = t.tags_from.saturating_add(tags as u32);
            rest.tags = t.tags.split_off(tags);
            let scopes = t.scopes.len().min(room);
            rest.scopes_from = t.scopes_from.saturating_add(scopes as u32);
            rest.scopes = t.scopes.split_off(scopes);
            (Update::Tables(t), Some(Update::Tables(rest)))
        }
        other => (other, None),
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
