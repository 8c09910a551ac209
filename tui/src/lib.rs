//! vramscope-tui: the terminal dashboard of vramscope.
//!
//! The dashboard shows an allocator's memory as it changes, or a recorded trace with a time
//! cursor to move through it: a header with the device and the allocated, reserved and peak
//! bytes; a timeline; a map of the segments; live memory by call site with stacks; the
//! inspector's findings; and the event log. It reads three kinds of source: a live program
//! through the allocator's telemetry ([`run_top`]; several at once behind a table with
//! [`run_top_many`]), a file that `vramscope_import` reads ([`run_view`]), and an
//! allocator in this very process ([`run_in_process`], used by `vramscope demo`). The command
//! line only calls these entry points.
//!
//! Inside, `data` keeps the growing snapshot and the state after any event (with `replay`),
//! `pyramid` answers range queries on its usage series for the timeline, `source` turns
//! telemetry frames and allocator pulls into updates, `analysis` runs the detectors off the UI
//! thread, `app` holds the user's choices, computes the view at the cursor and reacts to keys,
//! `fleet` holds one dashboard per process behind a table, `view` is the plain view model the
//! two hand to `ui`, `ui` draws one widget per panel from that view model alone, `theme` holds
//! the styles, and `term` owns the terminal. The fixed data of the screen tests and benchmarks
//! is `vramscope_testkit::fixture`.

pub mod analysis;
pub mod app;
pub mod data;

pub mod fleet;
pub mod pyramid;
pub mod source;
pub mod term;
pub mod theme;
pub mod ui;
pub mod view;

use std::fmt;
use std::path::Path;
use std::time::Duration;

use vramscope_allocator::{Backend, CachingAllocator};
use vramscope_import::{self as import, ImportError, ImportOptions, Progress, Stage};
use vramscope_model::{DeviceInfo, Snapshot, SnapshotSource};
use vramscope_telemetry::TelemetryAddr;

pub use app::{App, Panel};
pub use data::{Dataset, Origin};
pub use fleet::Fleet;
pub use source::{Control, InProcessSource, LiveSource, Source, Update};
pub use term::stop_signal;

/// Why the dashboard could not run.
#[derive(Debug)]
pub enum TuiError {
    /// The file could not be read.
    Import(ImportError),
    /// The terminal failed.
    Io(std::io::Error),
    /// `run_top` was given no address and found no publisher.
    NoPublisher(String),
    /// The dashboard cannot take the terminal: there is none, or this process runs in the
    /// background (`timeout 5 vramscope view FILE`), where using it would stop the process.
    NoTerminal(String),
    /// The file has nothing to show: no events and no segments (the sentence every face says,
    /// `vramscope_analysis::report::nothing_to_analyse`).
    Empty(String),
}

impl fmt::Display for TuiError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TuiError::Import(e) => write!(f, "{e}"),
            TuiError::Io(e) => write!(f, "terminal error: {e}"),
            TuiError::NoTerminal(why) => write!(
                f,
                "the dashboard needs a terminal in the foreground: {why}; use `vramscope report` (or `summary`) for text"
            ),
            TuiError::Empty(message) => write!(f, "{message}"),
            TuiError::NoPublisher(dir) => write!(
                f,
                "no vramscope publisher found in {dir}: start the program with \
                 VRAMSCOPE_LISTEN=unix (or unix:PATH, tcp:127.0.0.1:PORT) and pass its address"
            ),
        }
    }
}

impl std::error::Error for TuiError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            TuiError::Import(e) => Some(e),
            TuiError::Io(e) => Some(e),
            TuiError::NoPublisher(_) | TuiError::NoTerminal(_) | TuiError::Empty(_) => None,
        }
    }
}

impl From<std::io::Error> for TuiError {
    fn from(e: std::io::Error) -> TuiError {
        TuiError::Io(e)
    }
}

/// The largest file [`run_view`] reads without a terminal, to say that it is empty.
const EMPTY_CHECK_BYTES: u64 = 16 << 20;

/// How bad a trace's findings are, to open a multi-device file at its worst device: the most
/// severe error or warning, then the number of errors and of warnings.
type WorstKey = (Option<vramscope_analysis::detect::Severity>, usize, usize);

fn worst_key(findings: &[vramscope_analysis::detect::Finding]) -> WorstKey {
    use vramscope_analysis::detect::Severity;
    let n = |s| findings.iter().filter(|f| f.severity == s).count();
    let worst = findings
        .iter()
        .map(|f| f.severity)
        .filter(|&s| s >= Severity::Warning)
        .max();
    (worst, n(Severity::Error), n(Severity::Warning))
}

/// A device's part with the steps the report infers written into it (one step numbering for
/// every view: the header, the timeline's ticks and the findings at any cursor, analysed on
/// the trace cut there, number steps as `report` does), and the analysis of its whole trace.
pub(crate) fn analysed_part(part: Snapshot) -> analysis::Analysis {
    analysis::analyze(&whole_trace_job(part).1)
}

/// `part` with its inferred steps written in, shared (its events shared too, as the
/// dashboard's dataset keeps them), and the job that analyses its whole trace.
fn whole_trace_job(mut part: Snapshot) -> (std::sync::Arc<Snapshot>, analysis::Job) {
    vramscope_analysis::model_view::record_inferred_steps(&mut part);
    let shared = data::shared(part);
    let job = analysis::Job {
        snapshot: std::sync::Arc::clone(&shared),
        cut: None,
        version: 0,
    };
    (shared, job)
}

/// [`analysed_part`], and `load` given the part with its steps written in (shared, its events
/// shared too, as the dashboard's dataset keeps them), run at once on two threads: the
/// dataset's walk ([`Dataset::from_shared`]) and the analysis of the whole trace read the
/// same snapshot, so the first screen waits for the longer of the two, not for both in turn.
pub(crate) fn analysed_beside<T>(
    part: Snapshot,
    load: impl FnOnce(std::sync::Arc<Snapshot>) -> T,
) -> (T, analysis::Analysis) {
    let (shared, job) = whole_trace_job(part);
    std::thread::scope(|scope| {
        let whole = scope.spawn(move || analysis::analyze(&job));
        let loaded = load(shared);
        let whole = whole
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
        (loaded, whole)
    })
}

/// Puts the cursor of a file's dashboard where the question is, and says why when it is not
/// the peak: at the peak of allocated bytes when every error and warning of the whole trace
/// (`whole`) is found there too; else at the first OOM when the worst of them is an OOM; else
/// at the end, where they all are. The whole trace's findings stay beside the cursor's.
fn open_at_the_question(app: &mut App, whole: analysis::Analysis) {
    use vramscope_analysis::detect::{FindingKind, Severity};
    let peak = app.data.peak_allocated_pos();
    app.cursor = Some(peak);
    let serious: Vec<(FindingKind, Option<String>)> = whole
        .findings
        .iter()
        .filter(|f| f.severity >= Severity::Warning)
        .map(|f| (f.kind, f.site.clone()))
        .collect();
    app.file_findings = Some(whole.findings.clone());
    if serious.is_empty() {
        app.analyze_now();
        return;
    }
    if serious[0].0 == FindingKind::Oom {
        if let Some(&oom) = app.data.ooms().first() {
            let pos = (oom + 1).min(app.data.len());
            app.cursor = Some(pos);
            app.analyze_now();
            app.set_status(format!(
                "at the first OOM (event {pos}), the file's worst finding; P: the peak"
            ));
            return;
        }
    }
    app.analyze_now();
    let found = |(kind, site): &(FindingKind, Option<String>)| {
        app.analysis.as_ref().is_some_and(|a| {
            a.findings
                .iter()
                .any(|f| f.severity >= Severity::Warning && f.kind == *kind && f.site == *site)
        })
    };
    if serious.iter().all(found) {
        return;
    }
    app.cursor = Some(app.data.len());
    app.analysis = Some(analysis::Analysis {
        version: app.data.version(),
        ..whole
    });
    app.set_status("at the end: the file's errors and warnings are not all at its peak (P)");
}

/// The dashboard of a file (a vramscope snapshot, a PyTorch snapshot pickle or a torch.profiler
/// Chrome trace), ready to run; [`run_view`] runs it. It opens at the peak of allocated bytes,
/// unless the whole trace's errors and warnings are not found there: then at the first OOM, or
/// at the end (the findings panel shows the whole file's counts beside the cursor's).
pub fn view_app(path: &Path, options: &ImportOptions) -> Result<App, TuiError> {
    let snapshot = import::load_with(path, options).map_err(TuiError::Import)?;
    // An empty dump is said, as `report` says it, not opened as an empty dashboard.
    if let Some(message) =
        vramscope_analysis::report::nothing_to_analyse(&snapshot, &path.display().to_string())
    {
        return Err(TuiError::Empty(message));
    }
    let stage = |stage| {
        if let Some(progress) = &options.progress {
            progress.begin(stage, 0);
        }
    };
    // A snapshot of several devices opens at its worst device (the most severe finding of a
    // device's whole trace, the first device of equals); `D` shows the next.
    let devices = vramscope_engine::devices::devices_with_data(&snapshot);
    stage(Stage::Analysing);
    let origin = Origin::File(path.display().to_string());
    let (data, switch, whole) = if devices.len() > 1 {
        let mut worst: Option<(WorstKey, usize)> = None;
        for (i, &d) in devices.iter().enumerate() {
            let whole = analysed_part(vramscope_engine::devices::only_device(&snapshot, d));
            let key = worst_key(&whole.findings);
            if worst.as_ref().is_none_or(|(k, _)| key > *k) {
                worst = Some((key, i));
            }
        }
        let current = worst.map_or(0, |(_, i)| i);
        stage(Stage::BuildingTimeline);
        let (data, whole) = analysed_beside(
            vramscope_engine::devices::only_device(&snapshot, devices[current]),
            |part| Dataset::from_shared(part, origin),
        );
        let switch = app::DeviceSwitch {
            full: snapshot,
            devices,
            current,
        };
        (data, Some(switch), whole)
    } else {
        // The timeline is built while the trace is analysed.
        stage(Stage::BuildingTimeline);
        let (data, whole) = analysed_beside(snapshot, |part| Dataset::from_shared(part, origin));
        (data, None, whole)
    };
    let mut app = App::new(data).with_analyzer();
    app.devices = switch;
    open_at_the_question(&mut app, whole);
    Ok(app)
}

/// Opens a file in the dashboard with a time cursor at the peak of allocated bytes, until the
/// user quits.
pub fn run_view(path: &Path, options: &ImportOptions) -> Result<(), TuiError> {
    if let Err(why) = term::check_foreground() {
        // Without a terminal the dashboard cannot open; a small file is read first all the
        // same, so that an empty dump gets the answer every other face gives.
        let small = std::fs::metadata(path).is_ok_and(|m| m.len() <= EMPTY_CHECK_BYTES);
        if small {
            if let Ok(snapshot) = import::load_with(path, options) {
                let file = path.display().to_string();
                if let Some(message) =
                    vramscope_analysis::report::nothing_to_analyse(&snapshot, &file)
                {
                    return Err(TuiError::Empty(message));
                }
            }
        }
        return Err(TuiError::NoTerminal(why));
    }
    // A large file takes a while: the terminal says how far it has got meanwhile, and `q`
    // gives up.
    let progress = Progress::new();
    let mut opts = options.clone();
    opts.progress = Some(progress.clone());
    let file = path.to_path_buf();
    let loaded = term::wait_with_cancel(&path.display().to_string(), Some(&progress), move || {
        view_app(&file, &opts)
    })?;
    let Some(app) = loaded else {
        return Ok(());
    };
    let mut app = app?;
    term::run(&mut app)?;
    Ok(())
}

/// Attaches the dashboard to a live program's telemetry at `addr`, or at the newest socket in
/// the default folder when `addr` is `None`; reconnects whenever the program comes back.
pub fn run_top(addr: Option<TelemetryAddr>) -> Result<(), TuiError> {
    term::check_foreground().map_err(TuiError::NoTerminal)?;
    let addr = match addr {
        Some(a) => a,
        // Where the default folder lies in the shared temporary directory, it is read only
        // when it passes the publisher's own check (owner and mode); otherwise it is skipped,
        // and the error says why.
        None => {
            let dir = TelemetryAddr::default_dir().display().to_string();
            match TelemetryAddr::discover_checked() {
                Ok(found) => found.into_iter().next().ok_or(TuiError::NoPublisher(dir))?,
                Err(e) => return Err(TuiError::NoPublisher(format!("{dir} (skipped: {e})"))),
            }
        }
    };
    let empty = Snapshot::empty(SnapshotSource::Vramscope, DeviceInfo::default());
    let mut data = Dataset::new(empty, Origin::Live(addr.to_string()));
    data.link_state = data::Link::Connecting;
    let source = LiveSource::connect(addr, Duration::from_millis(500));
    let mut app = App::new(data).with_source(Box::new(source)).with_analyzer();
    term::run(&mut app)?;
    Ok(())
}

/// Attaches one dashboard to several live programs, one per address (one per rank or
/// process): a table with a row per process (link state, step, allocated, reserved and peak
/// bytes, findings), where Enter opens one in full and Esc comes back. Each process is read
/// and reconnected on its own, so one that goes away is shown as down and comes back by itself.
pub fn run_top_many(addrs: Vec<TelemetryAddr>) -> Result<(), TuiError> {
    term::check_foreground().map_err(TuiError::NoTerminal)?;
    let mut fleet = Fleet::live(addrs);
    term::run_fleet(&mut fleet)?;
    Ok(())
}

/// Shows `alloc` in the dashboard while `workload` runs on its own thread with a [`Control`]
/// that pauses it with the dashboard and tells it to stop when the user quits. `title` names
/// the workload in the header.
pub fn run_in_process<B: Backend>(
    alloc: CachingAllocator<B>,
    title: &str,
    workload: impl FnOnce(Control) + Send + 'static,
) -> Result<(), TuiError> {
    run_in_process_with_intro(alloc, title, None, workload)
}

/// [`run_in_process`] with `intro`, one line saying what runs and what to look at (which bugs
/// the demo planted, which panel shows them), in the help bar until the first key.
pub fn run_in_process_with_intro<B: Backend>(
    alloc: CachingAllocator<B>,
    title: &str,
    intro: Option<String>,
    workload: impl FnOnce(Control) + Send + 'static,
) -> Result<(), TuiError> {
    let source = InProcessSource::new(alloc.clone()).with_workload(workload);
    let empty = Snapshot::empty(SnapshotSource::Vramscope, DeviceInfo::default());
    let data = Dataset::new(empty, Origin::InProcess(title.to_string()));
    let mut app = App::new(data).with_source(Box::new(source)).with_analyzer();
    app.intro = intro;
    term::run(&mut app)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::data::{Dataset, Origin};
    use vramscope_testkit::fixture;

    /// The dataset built beside the analysis of the whole trace reads the very snapshot the
    /// analysis read (no copy), and both are what they are when made one after the other.
    #[test]
    fn the_timeline_is_built_beside_the_analysis_from_one_snapshot() {
        let snapshot = fixture::training_snapshot();
        let mut with_steps = snapshot.clone();
        vramscope_analysis::model_view::record_inferred_steps(&mut with_steps);
        let alone = analysis::analyze(&analysis::Job {
            snapshot: Arc::new(with_steps.clone()),
            cut: None,
            version: 0,
        });
        let mut apart = Dataset::new(with_steps, Origin::File("f".into()));
        let ((mut data, read), whole) = analysed_beside(snapshot, |part| {
            let read = Arc::clone(&part);
            (Dataset::from_shared(part, Origin::File("f".into())), read)
        });
        assert!(Arc::ptr_eq(&data.shared_snapshot(), &read));
        assert_eq!(whole.findings, alone.findings);
        assert_eq!(data.len(), apart.len());
        assert_eq!(data.peak_allocated_pos(), apart.peak_allocated_pos());
        for pos in [0, data.len() / 3, data.len()] {
            assert_eq!(data.usage_at(pos), apart.usage_at(pos));
        }
        assert_eq!(*data.shared_snapshot(), *apart.shared_snapshot());
    }
}
