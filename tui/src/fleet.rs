//! One dashboard for several processes: `vramscope top ADDR ADDR...`, one address per rank or
//! process.
//!
//! A [`Fleet`] holds one `crate::app::App` per process, each with its own source and analyzer,
//! and ticks them all on every turn of the loop, so every process's data keeps arriving whether
//! it is shown or not. At first it shows a table, one [`Row`] per process: its label, the
//! program behind it, the link state (`up`, `connecting…`, `down: <reason>`, `ended`), the step,
//! allocated, reserved and peak allocated bytes, OOMs, the findings count once analysed, and how
//! long ago it last sent anything. The arrows move the selection, Enter opens the selected
//! process's full dashboard, and Esc or `q` there comes back to the table; `q` at the table
//! quits. A process that goes away is shown as down with the reason, and its
//! `crate::source::LiveSource` keeps retrying, so it comes back by itself. Nothing here touches
//! the terminal (`crate::term::run_fleet` does), so tests drive a fleet directly and draw it
//! with `crate::ui::fleet`, which reads the [`Row`]s and the open dashboard's view model through
//! `crate::view::FleetView` and imports nothing from here.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use ratatui::crossterm::event::{
    KeyCode, KeyEvent, KeyEventKind, KeyModifiers, MouseButton, MouseEvent, MouseEventKind,
};
use ratatui::layout::{Position, Rect};
use vramscope_model::{DeviceInfo, Snapshot, SnapshotSource};
use vramscope_telemetry::TelemetryAddr;

use crate::app::App;
use crate::data::{Dataset, Link, Origin};
use crate::source::{unix_now_ns, LiveSource, Source, Update};
use crate::theme::Theme;
use crate::ui;
pub use crate::view::ProcessRow as Row;
use crate::view::{FleetSource, FleetView};

/// How often a live member retries a process that is away.
const RETRY: Duration = Duration::from_millis(500);

/// One process of the fleet: its dashboard and what the table needs beyond it.
pub struct Member {
    /// The process's full dashboard, ticked whether it is open or not.
    pub app: App,
    /// When this member last received anything (Unix nanoseconds), if it ever did.
    pub last_update_unix_ns: Option<u64>,
    /// The program as its publisher introduced itself ("train.py (pid 4242) on H200").
    program: Arc<Mutex<Option<String>>>,
}

impl Member {
    /// A member showing `app`.
    pub fn new(app: App) -> Member {
        Member {
            app,
            last_update_unix_ns: None,
            program: Arc::new(Mutex::new(None)),
        }
    }

    /// A member over `source`, whose `Update::Connected` names the program in the table.
    pub fn with_source(data: Dataset, source: Box<dyn Source>) -> Member {
        let program = Arc::new(Mutex::new(None));
        let source = Named {
            inner: source,
            program: Arc::clone(&program),
        };
        Member {
            app: App::new(data).with_source(Box::new(source)),
            last_update_unix_ns: None,
            program,
        }
    }

    /// The program behind this member, once its publisher said hello.
    pub fn program(&self) -> Option<String> {
        self.program.lock().ok().and_then(|p| p.clone())
    }
}

/// A source that remembers the name in the last `Update::Connected` it passed on.
struct Named {
    inner: Box<dyn Source>,
    program: Arc<Mutex<Option<String>>>,
}

impl Source for Named {
    fn poll(&mut self, out: &mut Vec<Update>) {
        let from = out.len();
        self.inner.poll(out);
        for u in &out[from..] {
            if let Update::Connected(who) = u {
                if let Ok(mut p) = self.program.lock() {
                    *p = Some(who.clone());
                }
            }
        }
    }

    fn set_paused(&mut self, paused: bool) {
        self.inner.set_paused(paused);
    }

    fn snapshot(&mut self) -> Option<Snapshot> {
        self.inner.snapshot()
    }

    fn stop(&mut self) {
        self.inner.stop();
    }
}

/// Several processes' dashboards behind one table. See the module documentation.
pub struct Fleet {
    /// The processes, in the order they were given.
    pub members: Vec<Member>,
    /// The selected row.
    pub selected: usize,
    /// The member whose full dashboard is open, if one is.
    pub open: Option<usize>,
    /// The user asked to quit.
    pub quit: bool,
    /// Colours or not (the members keep their own).
    pub theme: Theme,
    /// The time, in Unix nanoseconds (set by the loop; fixed in tests).
    pub now_unix_ns: u64,
    /// The terminal area of the last frame, for the mouse.
    pub area: Rect,
}

impl Fleet {
    /// A fleet of `members`, showing the table.
    pub fn new(members: Vec<Member>) -> Fleet {
        Fleet {
            members,
            selected: 0,
            open: None,
            quit: false,
            theme: Theme::from_env(),
            now_unix_ns: unix_now_ns(),
            area: Rect::new(0, 0, 80, 24),
        }
    }

    /// A fleet of live programs, one per address, each read by a [`LiveSource`] that
    /// reconnects, and each analysed on its own background thread.
    pub fn live(addrs: Vec<TelemetryAddr>) -> Fleet {
        let members = addrs
            .into_iter()
            .map(|addr| {
                let empty = Snapshot::empty(SnapshotSource::Vramscope, DeviceInfo::default());
                let mut data = Dataset::new(empty, Origin::Live(addr.to_string()));
                data.link_state = Link::Connecting;
                let source = LiveSource::connect(addr, RETRY);
                let mut member = Member::with_source(data, Box::new(source));
                member.app = member.app.with_analyzer();
                member
            })
            .collect();
        Fleet::new(members)
    }

    /// Sets the time for the fleet and every member.
    pub fn set_now(&mut self, now_unix_ns: u64) {
        self.now_unix_ns = now_unix_ns;
        for m in &mut self.members {
            m.app.now_unix_ns = now_unix_ns;
        }
    }

    /// Takes in what every member's source sent. Returns whether anything changed.
    pub fn tick(&mut self) -> bool {
        let now = self.now_unix_ns;
        let mut changed = false;
        for m in &mut self.members {
            let before = (m.app.data.version(), m.app.data.link_state.clone());
            let ticked = m.app.tick();
            if ticked {
                changed = true;
                if (m.app.data.version(), m.app.data.link_state.clone()) != before
                    || m.last_update_unix_ns.is_none()
                {
                    m.last_update_unix_ns = Some(now);
                }
            }
        }
        changed
    }

    /// Whether a member's last tick stopped at its bound with updates left
    /// (`App::saturated`).
    pub fn saturated(&self) -> bool {
        self.members.iter().any(|m| m.app.saturated())
    }

    /// Runs every member's analysis now, on this thread (tests).
    pub fn analyze_now(&mut self) {
        for m in &mut self.members {
            m.app.analyze_now();
        }
    }

    /// What the table shows, one row per member.
    pub fn rows(&self) -> Vec<Row> {
        self.members.iter().map(|m| self.row(m)).collect()
    }

    fn row(&self, m: &Member) -> Row {
        let data = &m.app.data;
        let end = data.len();
        let mut usage = data.usage_at(end);
        if usage.reserved == 0 {
            usage.reserved = data.snapshot().stats.reserved_bytes.all.current;
        }
        let (link, down) = match &data.link_state {
            Link::Up => ("up".to_string(), false),
            Link::Connecting => ("connecting…".to_string(), false),
            Link::Down { reason, .. } => (format!("down: {reason}"), true),
            Link::Ended => ("ended".to_string(), false),
        };
        let step = if data.live.stats.is_some() {
            data.live.step.max(data.step_at(end))
        } else {
            data.step_at(end)
        };
        Row {
            label: data.origin().label().to_string(),
            // "train.py (pid 4242) on H200": the device is in the process's own dashboard.
            program: m.program().map(|p| {
                p.rsplit_once(" on ")
                    .map_or(p.clone(), |(who, _)| who.to_string())
            }),
            link,
            down,
            step,
            allocated: usage.allocated,
            reserved: usage.reserved,
            peak_allocated: data.peak_at(end).allocated,
            ooms: data.ooms().len(),
            findings: m
                .app
                .analysis
                .as_ref()
                .filter(|a| a.cut.is_none())
                .map(|a| a.findings.len()),
            last_update_s: m
                .last_update_unix_ns
                .map(|t| self.now_unix_ns.saturating_sub(t) / 1_000_000_000),
        }
    }

    /// The member whose dashboard is open.
    pub fn open_app(&self) -> Option<&App> {
        self.open.and_then(|i| self.members.get(i)).map(|m| &m.app)
    }

    /// Opens the selected member's full dashboard.
    pub fn open_selected(&mut self) {
        let count = self.members.len();
        if let Some(m) = self.members.get_mut(self.selected) {
            m.app.quit = false;
            m.app
                .set_status(format!("Esc or q: back to the {count} processes"));
            self.open = Some(self.selected);
        }
    }

    /// Prepares the next frame of `area`: the open dashboard's view, as the single dashboard's
    /// loop does, or nothing more for the table.
    pub fn prepare(&mut self, area: Rect) {
        self.area = area;
        if let Some(m) = self.open.and_then(|i| self.members.get_mut(i)) {
            m.app.prepare_frame(area);
        }
    }

    /// Reacts to one key press: at the table, the selection, Enter and quitting; in an open
    /// dashboard, that dashboard's keys, where quitting comes back to the table.
    pub fn handle_key(&mut self, key: KeyEvent) {
        if key.kind == KeyEventKind::Release {
            return;
        }
        let ctrl = key.modifiers.contains(KeyModifiers::CONTROL);
        if ctrl && matches!(key.code, KeyCode::Char('c') | KeyCode::Char('q')) {
            self.quit = true;
            return;
        }
        if let Some(i) = self.open {
            if let Some(m) = self.members.get_mut(i) {
                m.app.handle_key(key);
                if m.app.quit {
                    m.app.quit = false;
                    self.open = None;
                }
            } else {
                self.open = None;
            }
            return;
        }
        let last = self.members.len().saturating_sub(1);
        match key.code {
            KeyCode::Char('q') | KeyCode::Esc => self.quit = true,
            KeyCode::Up | KeyCode::Char('k') => self.selected = self.selected.saturating_sub(1),
            KeyCode::Down | KeyCode::Char('j') => self.selected = (self.selected + 1).min(last),
            KeyCode::Home | KeyCode::Char('g') => self.selected = 0,
            KeyCode::End | KeyCode::Char('G') => self.selected = last,
            KeyCode::Enter | KeyCode::Right => self.open_selected(),
            _ => {}
        }
    }

    /// Reacts to the mouse: in an open dashboard, that dashboard's reaction; at the table, a
    /// click selects a row (a click on the selected row opens it) and the wheel moves the
    /// selection.
    pub fn handle_mouse(&mut self, mouse: MouseEvent) {
        if let Some(i) = self.open {
            if let Some(m) = self.members.get_mut(i) {
                m.app.handle_mouse(mouse);
            }
            return;
        }
        let last = self.members.len().saturating_sub(1);
        match mouse.kind {
            MouseEventKind::ScrollUp => self.selected = self.selected.saturating_sub(1),
            MouseEventKind::ScrollDown => self.selected = (self.selected + 1).min(last),
            MouseEventKind::Down(MouseButton::Left) => {
                let table = ui::fleet::table_area(self.area);
                let at = Position::new(mouse.column, mouse.row);
                if !table.contains(at) {
                    return;
                }
                let first = ui::fleet::first_row(self.selected, table);
                let row = usize::from(mouse.row.saturating_sub(table.y + 2)) + first;
                if mouse.row >= table.y + 2 && row <= last {
                    if row == self.selected {
                        self.open_selected();
                    } else {
                        self.selected = row;
                    }
                }
            }
            _ => {}
        }
    }

    /// Stops every member's source (on quit).
    pub fn shutdown(&mut self) {
        for m in &mut self.members {
            m.app.shutdown();
        }
    }
}

impl FleetSource for Fleet {
    fn fleet_view(&self) -> FleetView<'_> {
        match self.open_app() {
            Some(app) => FleetView::Open(app.view_model()),
            None => FleetView::Table {
                rows: self.rows(),
                selected: self.selected,
                theme: self.theme,
            },
        }
    }
}
