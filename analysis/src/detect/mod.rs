//! Detectors: pure functions from the model to findings.
//!
//! Each detector reads a [`ModelView`] (built once per snapshot by `crate::model_view`) and
//! reports [`Finding`]s into a [`FindingSink`]; none of them prints, reads a clock or touches a
//! file, so the same snapshot always gives the same findings. [`run_all`] runs every detector
//! in a fixed order and hands the findings to the sink sorted by [`sort_findings`];
//! `crate::report` renders them, `crate::checks` turns them into test assertions, and the
//! dashboard lights them up as they appear.
//!
//! The detectors and their stable ids: [`retained_per_step`] (`retained_per_step`),
//! [`sync_in_loop`] (`sync_in_loop`), [`transfer_heavy`] (`transfer_heavy`),
//! [`cache_churn`] (`cache_churn`), [`fragmentation`] (`fragmentation` and `oom`) and
//! [`top_holders`] (`top_holders`). Their thresholds live in [`DetectOptions`].

mod churn;
mod fragmentation;
mod holders;
mod retained;
pub mod sync;
mod transfer;

use std::cmp::Ordering;
use std::fmt;
use std::str::FromStr;

use serde::ser::SerializeMap;
use serde::{Serialize, Serializer};
use vramscope_model::{Snapshot, SnapshotSource};

use crate::model_view::ModelView;
use vramscope_engine::GroupId;

pub use churn::cache_churn;
pub use fragmentation::fragmentation;
pub use holders::top_holders;
pub use retained::retained_per_step;
pub use sync::sync_in_loop;
pub use transfer::transfer_heavy;

/// How serious a finding is. Ordered: `Info < Warning < Error`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Severity {
    /// Worth knowing; not a bug (long-lived weights, a same-size upload every step).
    Info,
    /// Costs time or memory; fix it when convenient.
    Warning,
    /// Will run out of memory or already did.
    Error,
}

impl Severity {
    /// The lower-case name used in reports and on the command line.
    pub fn as_str(self) -> &'static str {
        match self {
            Severity::Info => "info",
            Severity::Warning => "warning",
            Severity::Error => "error",
        }
    }
}

impl fmt::Display for Severity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A severity name that is not `info`, `warning` or `error`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParseSeverityError(pub String);

impl fmt::Display for ParseSeverityError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "unknown severity `{}` (expected info, warning or error)",
            self.0
        )
    }
}

impl std::error::Error for ParseSeverityError {}

impl FromStr for Severity {
    type Err = ParseSeverityError;

    fn from_str(s: &str) -> Result<Severity, ParseSeverityError> {
        match s.to_ascii_lowercase().as_str() {
            "info" => Ok(Severity::Info),
            "warning" | "warn" => Ok(Severity::Warning),
            "error" => Ok(Severity::Error),
            _ => Err(ParseSeverityError(s.to_string())),
        }
    }
}

/// What a finding is about; [`FindingKind::as_str`] gives the stable id used in reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FindingKind {
    /// A call site keeps allocations alive once per step (`losses.append(loss)`).
    RetainedPerStep,
    /// A call site waits for the device many times per step (`.item()` in a loop).
    SyncInLoop,
    /// Host/device copies dominate the loop, or the same upload repeats every step.
    TransferHeavy,
    /// Segments are allocated and released every step (`empty_cache()` in a loop).
    CacheChurn,
    /// Reserved memory the program cannot use (split blocks), or an OOM it explains.
    Fragmentation,
    /// An allocation failed and fragmentation does not explain it.
    Oom,
    /// What holds memory at the end (or at the peak).
    TopHolders,
}

impl FindingKind {
    /// The stable id (`"retained_per_step"`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            FindingKind::RetainedPerStep => "retained_per_step",
            FindingKind::SyncInLoop => "sync_in_loop",
            FindingKind::TransferHeavy => "transfer_heavy",
            FindingKind::CacheChurn => "cache_churn",
            FindingKind::Fragmentation => "fragmentation",
            FindingKind::Oom => "oom",
            FindingKind::TopHolders => "top_holders",
        }
    }

    /// Every kind, in the order [`run_all`] runs their detectors.
    pub const ALL: [FindingKind; 7] = [
        FindingKind::RetainedPerStep,
        FindingKind::SyncInLoop,
        FindingKind::TransferHeavy,
        FindingKind::CacheChurn,
        FindingKind::Fragmentation,
        FindingKind::Oom,
        FindingKind::TopHolders,
    ];
}

impl fmt::Display for FindingKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One evidence value: a count, a measured quantity, or a word.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(untagged)]
pub enum EvidenceValue {
    /// A count or a byte figure.
    Int(u64),
    /// A ratio, an average or an estimate (rounded to three decimals).
    Float(f64),
    /// A word or a setting.
    Text(String),
}

impl fmt::Display for EvidenceValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EvidenceValue::Int(v) => write!(f, "{v}"),
            EvidenceValue::Float(v) => write!(f, "{v}"),
            EvidenceValue::Text(v) => f.write_str(v),
        }
    }
}

/// The numbers behind a finding: ordered `key → value` pairs, in the order the detector added
/// them. Keys carry their unit (`bytes_per_step`, `assumed_us_per_device_call`).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Evidence(Vec<(String, EvidenceValue)>);

impl Evidence {
    /// No evidence yet.
    pub fn new() -> Evidence {
        Evidence(Vec::new())
    }

    /// Adds an integer.
    pub fn int(mut self, key: &str, value: u64) -> Evidence {
        self.0.push((key.to_string(), EvidenceValue::Int(value)));
        self
    }

    /// Adds a float, rounded to three decimals (non-finite values become 0).
    pub fn float(mut self, key: &str, value: f64) -> Evidence {
        self.0
            .push((key.to_string(), EvidenceValue::Float(round3(value))));
        self
    }

    /// Adds a word.
    pub fn text(mut self, key: &str, value: impl Into<String>) -> Evidence {
        self.0
            .push((key.to_string(), EvidenceValue::Text(value.into())));
        self
    }

    /// The pairs, in order.
    pub fn entries(&self) -> &[(String, EvidenceValue)] {
        &self.0
    }

    /// The value of `key`, if present.
    pub fn get(&self, key: &str) -> Option<&EvidenceValue> {
        self.0.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }

    /// Whether there are no pairs.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl Serialize for Evidence {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(self.0.len()))?;
        for (k, v) in &self.0 {
            map.serialize_entry(k, v)?;
        }
        map.end()
    }
}

/// Rounds to three decimals; NaN and infinities become 0 so that output stays valid JSON.
pub(crate) fn round3(value: f64) -> f64 {
    if value.is_finite() {
        (value * 1000.0).round() / 1000.0
    } else {
        0.0
    }
}

/// A rate per step.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct PerStep {
    /// Bytes per step.
    pub bytes: f64,
    /// Events (blocks, copies, calls) per step.
    pub count: f64,
}

impl PerStep {
    /// A rate, rounded to three decimals.
    pub fn new(bytes: f64, count: f64) -> PerStep {
        PerStep {
            bytes: round3(bytes),
            count: round3(count),
        }
    }
}

/// One diagnosis: what, where, how much, the evidence, and a one-line fix.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Finding {
    /// What the finding is about.
    pub kind: FindingKind,
    /// How serious it is.
    pub severity: Severity,
    /// The call site as `file:line`, when the finding has one.
    pub site: Option<String>,
    /// The function at the call site (may be empty).
    pub function: String,
    /// Where the memory was made, as `file:line`, for findings about kept memory: `site` is the
    /// line that keeps it (the loop line that called the model), `made_at` the line that
    /// allocated it (the model's own); the two are equal for a plain leak.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub made_at: Option<String>,
    /// The user's frames from `site` in to `made_at`, outermost first, as
    /// `file:line (function)`.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub frames: Vec<String>,
    /// The bytes concerned (retained, copied, released, held, requested; see the summary).
    pub bytes: u64,
    /// The events concerned (blocks, copies, calls, OOMs).
    pub count: u64,
    /// The rate per step, for per-step findings.
    pub per_step: Option<PerStep>,
    /// First step number involved.
    pub first_step: Option<u64>,
    /// Last step number involved.
    pub last_step: Option<u64>,
    /// One sentence saying what was seen.
    pub summary: String,
    /// The numbers behind it.
    pub evidence: Evidence,
    /// One line saying what to do.
    pub fix: String,
    /// The sites inside the finding, largest first, when it gathers several (a graph kept
    /// alive by one reference, the holders of one kind of memory).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub sites: Vec<FindingSite>,
}

/// One site inside a finding that gathers several.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct FindingSite {
    /// The site as a reader names it (`file:line`, `MmBackward0 (backward)`).
    pub site: String,
    /// The function there (may be empty).
    pub function: String,
    /// Bytes of the site in the finding.
    pub bytes: u64,
    /// Blocks of the site in the finding.
    pub blocks: u64,
}

impl Finding {
    /// A finding of `kind` and `severity` at `group` of `view`, with everything else empty.
    pub fn at_group(
        view: &ModelView<'_>,
        kind: FindingKind,
        severity: Severity,
        group: Option<GroupId>,
    ) -> Finding {
        let (site, function) = match group.map(|g| view.group(g)) {
            Some(g) => (g.file_line.clone(), g.function.clone()),
            None => (None, String::new()),
        };
        Finding {
            kind,
            severity,
            site,
            function,
            made_at: None,
            frames: Vec::new(),
            bytes: 0,
            count: 0,
            per_step: None,
            first_step: None,
            last_step: None,
            summary: String::new(),
            evidence: Evidence::new(),
            fix: String::new(),
            sites: Vec::new(),
        }
    }

    /// `file:line` or `"(unknown site)"`, for display.
    pub fn site_label(&self) -> &str {
        self.site.as_deref().unwrap_or("(unknown site)")
    }

    /// The finding's details as sentences a person reads, for the text report, markdown and
    /// the dashboard (the `evidence` map is for JSON): the user's call path from the line that
    /// keeps the memory to the line that made it, and the sites the finding gathers with
    /// their bytes, largest first.
    pub fn details(&self) -> Vec<String> {
        let mut out = Vec::new();
        if self.frames.len() > 1 {
            out.push(format!("Call path: {}.", self.frames.join(" → ")));
        }
        const LISTED: usize = 5;
        if self.sites.len() > 1
            || self.sites.first().map(|s| s.site.as_str()) != self.site.as_deref()
        {
            let mut listed: Vec<String> = self
                .sites
                .iter()
                .take(LISTED)
                .map(|s| {
                    format!(
                        "{} ({} in {})",
                        s.site,
                        vramscope_model::format_bytes(s.bytes),
                        vramscope_model::plural(s.blocks, "block")
                    )
                })
                .collect();
            // A detector keeps only the largest sites of a long list; its evidence says how
            // many there were.
            let total = match self.evidence.get("sites") {
                Some(EvidenceValue::Int(n)) => (*n as usize).max(self.sites.len()),
                _ => self.sites.len(),
            };
            if total > LISTED {
                listed.push(format!("and {} more", total - LISTED.min(self.sites.len())));
            }
            if !listed.is_empty() {
                out.push(format!("From: {}.", listed.join(", ")));
            }
        }
        out
    }
}

/// Where detectors put their findings.
///
/// Detectors never print; they call [`FindingSink::report`] once per finding. A report
/// collects findings in a [`Vec`]; the dashboard can forward them to its panels.
pub trait FindingSink {
    /// Receives one finding.
    fn report(&mut self, finding: Finding);
}

impl FindingSink for Vec<Finding> {
    fn report(&mut self, finding: Finding) {
        self.push(finding);
    }
}

/// A sink that collects findings in order.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct VecSink {
    /// The findings received so far.
    pub findings: Vec<Finding>,
}

impl VecSink {
    /// An empty sink.
    pub fn new() -> VecSink {
        VecSink::default()
    }

    /// The findings received.
    pub fn into_findings(self) -> Vec<Finding> {
        self.findings
    }
}

impl FindingSink for VecSink {
    fn report(&mut self, finding: Finding) {
        self.findings.push(finding);
    }
}

/// A sink that calls a closure for each finding.
pub struct FnSink<F: FnMut(Finding)>(pub F);

impl<F: FnMut(Finding)> FindingSink for FnSink<F> {
    fn report(&mut self, finding: Finding) {
        (self.0)(finding)
    }
}

/// Thresholds and assumptions of the detectors. [`DetectOptions::default`] holds the values
/// documented on each field.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct DetectOptions {
    /// Fewest steps a per-step pattern must span before it is reported (3).
    pub min_steps: u64,
    /// `retained_per_step`: at least this many bytes retained per step make it an error rather
    /// than a warning (1 MiB).
    pub retained_error_bytes_per_step: u64,
    /// `retained_per_step`: at most this many steps until the device is full make it an error
    /// rather than a warning (1,000,000).
    pub retained_error_steps_until_oom: u64,
    /// `sync_in_loop`: device-to-host copies up to this size count as a sync (64 B).
    pub sync_max_bytes: u64,
    /// `sync_in_loop`: average syncs per active step (tiny device-to-host copies and explicit
    /// syncs together) at or above this are reported (8): a tiny copy is only a guess at a
    /// sync.
    pub sync_per_step: f64,
    /// `sync_in_loop`: average explicit syncs per active step (`Sync` events: each one a wait
    /// that the program or PyTorch reported) at or above this are reported (1).
    pub explicit_sync_per_step: f64,
    /// `transfer_heavy`: host/device bytes per step below this are never reported (1 MiB).
    pub transfer_min_bytes_per_step: u64,
    /// `transfer_heavy`: host/device bytes per step at or above this fraction of the bytes
    /// allocated per step are reported (0.5).
    pub transfer_ratio: f64,
    /// `transfer_heavy`: assumed effective host/device bandwidth for the time estimate, in
    /// bytes per second (12 GB/s, PCIe 4.0 x16 in practice).
    pub assumed_transfer_bytes_per_s: f64,
    /// `cache_churn`: assumed cost of one raw device allocation or free, in microseconds (20;
    /// published cudaMalloc/cudaFree figures are 14–50 µs).
    pub assumed_us_per_device_call: f64,
    /// `fragmentation`: free bytes in split segments below this are not reported (64 MiB).
    pub fragmentation_min_bytes: u64,
    /// `fragmentation`: free bytes in split segments below this fraction of the reserved bytes
    /// are not reported (0.25).
    pub fragmentation_ratio: f64,
    /// `top_holders`: how many call sites to report (5).
    pub top_holders: usize,
    /// Device capacity in bytes to assume when the snapshot does not know it.
    pub capacity: Option<u64>,
    /// How many threads the detectors run on: `None` (the default) chooses as
    /// [`detector_threads`] says; `Some(n)` runs them on `n` threads whatever the trace's size
    /// (at least one, at most one a detector). The findings are the same either way.
    pub threads: Option<usize>,
}

impl Default for DetectOptions {
    fn default() -> DetectOptions {
        DetectOptions {
            min_steps: 3,
            retained_error_bytes_per_step: 1 << 20,
            retained_error_steps_until_oom: 1_000_000,
            sync_max_bytes: 64,
            sync_per_step: 8.0,
            explicit_sync_per_step: 1.0,
            transfer_min_bytes_per_step: 1 << 20,
            transfer_ratio: 0.5,
            assumed_transfer_bytes_per_s: 12e9,
            assumed_us_per_device_call: 20.0,
            fragmentation_min_bytes: 64 << 20,
            fragmentation_ratio: 0.25,
            top_holders: 5,
            capacity: None,
            threads: None,
        }
    }
}

/// A detector: a pure function of the view that reports into a sink.
pub type Detector = fn(&ModelView<'_>, &DetectOptions, &mut dyn FindingSink);

/// Every detector, in the order [`run_all`] runs them.
pub const DETECTORS: [(&str, Detector); 6] = [
    ("retained_per_step", retained_per_step),
    ("sync_in_loop", sync_in_loop),
    ("transfer_heavy", transfer_heavy),
    ("cache_churn", cache_churn),
    ("fragmentation", fragmentation),
    ("top_holders", top_holders),
];

/// Runs every detector on `snapshot` and reports the findings, sorted, into `sink`.
pub fn run_all(snapshot: &Snapshot, options: &DetectOptions, sink: &mut dyn FindingSink) {
    let view = ModelView::new(snapshot);
    run_all_view(&view, options, sink);
}

/// Runs every detector on a view built earlier and reports the findings, sorted, into `sink`.
///
/// The detectors run on [`detector_threads`] threads, each into a list of its own; the lists
/// are joined in the order of [`DETECTORS`] before the sort, so the findings are the same, in
/// the same order, on one thread and on many.
pub fn run_all_view(view: &ModelView<'_>, options: &DetectOptions, sink: &mut dyn FindingSink) {
    let mut findings = match detector_threads(view, options) {
        0 | 1 => {
            let mut findings = Vec::new();
            for (_, detector) in DETECTORS {
                detector(view, options, &mut findings);
            }
            findings
        }
        threads => run_split(view, options, threads),
    };
    sort_findings(&mut findings);
    for finding in findings {
        sink.report(finding);
    }
}

/// The environment variable that caps the threads the detectors run on when
/// [`DetectOptions::threads`] is `None` (`VRAMSCOPE_THREADS=1`: one thread). It is read once
/// per process; a value that is not a positive number is ignored.
pub const THREADS_ENV: &str = "VRAMSCOPE_THREADS";

/// Traces with fewer events than this run their detectors on one thread when
/// [`DetectOptions::threads`] is `None`. The detectors are a small part of the analysis and one
/// of them takes most of their time (measured on 2026-12-06, release build: 7.6 ms at 1M
/// generated events, 6.9 of them `sync_in_loop`; at 10M, 76 ms on the bench generator's shape,
/// 69 of them `sync_in_loop`, and 191 ms on a replica of decomfl, 169 of them
/// `retained_per_step`), so a split saves at most the others' time: under a millisecond below
/// 1M events, 7–22 ms at 10M.
pub const PARALLEL_MIN_EVENTS: u64 = 1_000_000;

/// How many threads [`run_all_view`] runs the detectors on: [`DetectOptions::threads`] when
/// set; else one for a trace of fewer than [`PARALLEL_MIN_EVENTS`] events, and otherwise the
/// machine's cores, capped by [`THREADS_ENV`] when set. Never more than there are detectors.
pub fn detector_threads(view: &ModelView<'_>, options: &DetectOptions) -> usize {
    let wanted = match options.threads {
        Some(n) => n,
        None if view.totals().events < PARALLEL_MIN_EVENTS => 1,
        None => {
            let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
            env_threads().map_or(cores, |cap| cap.min(cores))
        }
    };
    wanted.clamp(1, DETECTORS.len())
}

/// The value of [`THREADS_ENV`], read once.
fn env_threads() -> Option<usize> {
    static THREADS: std::sync::OnceLock<Option<usize>> = std::sync::OnceLock::new();
    *THREADS.get_or_init(|| {
        std::env::var(THREADS_ENV)
            .ok()
            .and_then(|text| text.trim().parse::<usize>().ok())
            .filter(|&n| n > 0)
    })
}

/// Runs the detectors on `threads` threads (this one and `threads - 1` more): each thread takes
/// the next detector not yet taken and reports into a list of its own, and the lists are joined
/// in the order of [`DETECTORS`], whichever thread ran which. When no thread can be started,
/// this one runs them all.
fn run_split(view: &ModelView<'_>, options: &DetectOptions, threads: usize) -> Vec<Finding> {
    let next = std::sync::atomic::AtomicUsize::new(0);
    let work = || {
        let mut done = Vec::new();
        loop {
            let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let Some((_, detector)) = DETECTORS.get(i) else {
                return done;
            };
            let mut findings = Vec::new();
            detector(view, options, &mut findings);
            done.push((i, findings));
        }
    };
    let mut parts: Vec<Vec<Finding>> = vec![Vec::new(); DETECTORS.len()];
    std::thread::scope(|scope| {
        let helpers: Vec<_> = (1..threads)
            .filter_map(|k| {
                std::thread::Builder::new()
                    .name(format!("vramscope-detect-{k}"))
                    .spawn_scoped(scope, work)
                    .ok()
            })
            .collect();
        let mut done = work();
        for helper in helpers {
            done.extend(
                helper
                    .join()
                    .unwrap_or_else(|panic| std::panic::resume_unwind(panic)),
            );
        }
        for (i, findings) in done {
            parts[i] = findings;
        }
    });
    parts.into_iter().flatten().collect()
}

/// Runs every detector and returns the sorted findings.
pub fn detect(snapshot: &Snapshot, options: &DetectOptions) -> Vec<Finding> {
    let mut findings = Vec::new();
    run_all(snapshot, options, &mut findings);
    findings
}

/// Sorts findings deterministically: most severe first, then by kind (in detector order), then
/// by bytes (largest first), site, count and summary.
pub fn sort_findings(findings: &mut [Finding]) {
    findings.sort_by(compare_findings);
}

fn compare_findings(a: &Finding, b: &Finding) -> Ordering {
    b.severity
        .cmp(&a.severity)
        .then(a.kind.cmp(&b.kind))
        .then(b.bytes.cmp(&a.bytes))
        .then(a.site.cmp(&b.site))
        .then(b.count.cmp(&a.count))
        .then(a.summary.cmp(&b.summary))
}

/// Whether any finding is at least as severe as `level` (for `--fail-on`).
pub fn reaches(findings: &[Finding], level: Severity) -> bool {
    findings.iter().any(|f| f.severity >= level)
}

/// A rate as a reader counts it: a whole number without decimals (`32`), else one decimal
/// (`2.5`).
pub fn count_text(value: f64) -> String {
    if (value - value.round()).abs() < 0.05 {
        format!("{}", value.round() as i64)
    } else {
        format!("{value:.1}")
    }
}

/// Adds up byte figures without overflowing (imported files may hold absurd sizes).
pub(crate) fn sat_sum(values: impl IntoIterator<Item = u64>) -> u64 {
    values.into_iter().fold(0, u64::saturating_add)
}

/// The environment variable that holds allocator settings for data from `source`.
pub(crate) fn config_env_var(source: SnapshotSource) -> &'static str {
    match source {
        SnapshotSource::Vramscope => "VRAMSCOPE_ALLOC_CONF",
        SnapshotSource::Pytorch | SnapshotSource::ChromeTrace => "PYTORCH_CUDA_ALLOC_CONF",
    }
}
