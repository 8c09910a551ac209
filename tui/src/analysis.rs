//! The findings and per-site growth behind the dashboard's panels, computed off the UI thread.
//!
//! An [`Analysis`] is what the inspector says about a snapshot: the findings of every detector
//! (`vramscope_analysis::detect`) and, for each call-site group, how many bytes it added per
//! step lately. [`analyze`] computes one from a snapshot, a pure function that tests call
//! directly; [`Analyzer`] runs it on a background thread so that the dashboard (`crate::app`)
//! keeps drawing while a large trace is analysed, and hands back the latest result. The
//! snapshot comes from `crate::data::Dataset`, shared; to analyse the data up to the time
//! cursor, [`analyze`] cuts it there itself (`crate::data::cut_snapshot`: the events before the
//! cursor are a prefix of the dataset's shared events, not a copy, and the tables are copied),
//! so that the dashboard's loop only hands over the shared snapshot and the state at the
//! cursor, whose segments it works out here too.

use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::Arc;

use rustc_hash::FxHashMap;
use vramscope_analysis::detect::{self, DetectOptions, Finding};
use vramscope_analysis::model_view::{step_source_of, ModelView, StepSource};
use vramscope_engine::GroupId;
use vramscope_engine::MemoryState;
use vramscope_model::Snapshot;

use crate::data::cut_snapshot;

/// Steps over which growth per step is averaged.
const GROWTH_WINDOW: u32 = 8;

/// What the inspector found in one snapshot.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Analysis {
    /// The position the snapshot was cut at (`None`: all the data).
    pub cut: Option<usize>,
    /// The dataset version analysed.
    pub version: u64,
    /// Findings, most severe first.
    pub findings: Vec<Finding>,
    /// Bytes added per step lately, by call-site group (the ids of
    /// `vramscope_engine::SiteGroups`, which the dataset's groups share).
    pub growth: FxHashMap<GroupId, f64>,
}

/// A request for an analysis.
#[derive(Clone, Debug)]
pub struct Job {
    /// All the data, shared with the dashboard.
    pub snapshot: Arc<Snapshot>,
    /// The position to analyse the data up to, with the state there (whose segments the cut
    /// snapshot takes); `None` analyses all of it.
    pub cut: Option<(usize, Arc<MemoryState>)>,
    /// The dataset version, passed through to the result.
    pub version: u64,
}

/// Runs every detector on `job.snapshot` (cut where the job says) and measures growth per call
/// site.
pub fn analyze(job: &Job) -> Analysis {
    analyze_with(job.clone(), &mut None)
}

/// Where the steps of a whole trace come from, kept for the analyses of its parts while the
/// trace stays the same (the same shared snapshot, number of events and dataset version).
pub struct WholeSteps {
    /// The shared snapshot's address, its number of events and the dataset version.
    key: (usize, usize, u64),
    /// The whole trace's step source.
    source: StepSource,
}

/// [`analyze`], with the whole trace's step source kept in `whole` between calls: a cut is
/// analysed with the steps of the whole trace (`ModelView::new_part`), so the findings at a
/// cursor number steps as the report on the whole file does, whatever the part alone shows.
/// The state at the cut is let go as soon as its segments are taken: the dashboard changes it
/// in place at its next move only while no one else holds it.
pub fn analyze_with(job: Job, whole: &mut Option<WholeSteps>) -> Analysis {
    let cut;
    let at = job.cut.as_ref().map(|(pos, _)| *pos);
    let view = match job.cut {
        Some((pos, state)) => {
            let key = (
                Arc::as_ptr(&job.snapshot) as usize,
                job.snapshot.events.len(),
                job.version,
            );
            let kept = match whole.take() {
                Some(w) if w.key == key => w,
                _ => WholeSteps {
                    key,
                    source: step_source_of(&job.snapshot),
                },
            };
            let kept = whole.insert(kept);
            let segments = state.to_segments();
            drop(state);
            cut = cut_snapshot(&job.snapshot, pos, segments);
            ModelView::new_part(&cut, &kept.source)
        }
        None => ModelView::new(&job.snapshot),
    };
    let mut findings = Vec::new();
    detect::run_all_view(&view, &DetectOptions::default(), &mut findings);
    Analysis {
        cut: at,
        version: job.version,
        findings,
        growth: growth(&view),
    }
}

/// Bytes each group gained per step over the last completed steps (at most
/// [`GROWTH_WINDOW`]).
fn growth(view: &ModelView<'_>) -> FxHashMap<GroupId, f64> {
    let mut out = FxHashMap::default();
    let steps = view.loop_steps();
    if steps.len() < 2 {
        return out;
    }
    // The last step may still be running: measure up to the one before it.
    let last = steps.end - 2;
    let window = (last - steps.start).clamp(1, GROWTH_WINDOW);
    let first = last.saturating_sub(window);
    for g in 0..view.groups().len() as GroupId {
        if view.group_intervals(g).is_empty() {
            continue;
        }
        let (_, before) = view.live_after_step(g, first);
        let (_, after) = view.live_after_step(g, last);
        let per_step = (after as f64 - before as f64) / f64::from(last - first);
        out.insert(g, per_step);
    }
    out
}

/// A background thread that analyses the latest snapshot it is given.
pub struct Analyzer {
    jobs: Option<Sender<Job>>,
    results: Receiver<(Analysis, usize)>,
    pending: usize,
}

impl Analyzer {
    /// Starts the thread.
    pub fn spawn() -> Analyzer {
        let (jobs, inbox) = mpsc::channel::<Job>();
        let (outbox, results) = mpsc::channel();
        let spawned = std::thread::Builder::new()
            .name("vramscope-analysis".to_string())
            .spawn(move || {
                let mut whole = None;
                while let Ok(mut job) = inbox.recv() {
                    // Only the newest request matters; the result answers all of them.
                    let mut answered = 1;
                    while let Ok(newer) = inbox.try_recv() {
                        job = newer;
                        answered += 1;
                    }
                    if outbox
                        .send((analyze_with(job, &mut whole), answered))
                        .is_err()
                    {
                        return;
                    }
                }
            });
        Analyzer {
            jobs: spawned.ok().map(|_| jobs),
            results,
            pending: 0,
        }
    }

    /// Asks for an analysis; returns false when the thread is gone.
    pub fn request(&mut self, job: Job) -> bool {
        match &self.jobs {
            Some(tx) if tx.send(job).is_ok() => {
                self.pending += 1;
                true
            }
            _ => false,
        }
    }

    /// Whether a requested analysis has not come back yet.
    pub fn busy(&self) -> bool {
        self.pending > 0
    }

    /// The newest finished analysis, if one came back since the last call.
    pub fn latest(&mut self) -> Option<Analysis> {
        let mut newest = None;
        while let Ok((a, answered)) = self.results.try_recv() {
            self.pending = self.pending.saturating_sub(answered);
            newest = Some(a);
        }
        newest
    }

    /// Waits up to `timeout` for the pending analysis (used before the first screen).
    pub fn wait(&mut self, timeout: std::time::Duration) -> Option<Analysis> {
        match self.results.recv_timeout(timeout) {
            Ok((a, answered)) => {
                self.pending = self.pending.saturating_sub(answered);
                Some(self.latest().unwrap_or(a))
            }
            Err(_) => None,
        }
    }
}
