//! Ranks side by side: one snapshot per rank of a distributed job, compared.
//!
//! When rank 3 of a DDP or FSDP job dies of OOM and the others do not, the user has one
//! snapshot per rank, and a big job has hundreds or thousands of them. Each file is reduced,
//! as soon as it is read, to a [`RankSummary`] of a few kilobytes ([`summarize_snapshot`]):
//! its peak allocated and reserved, the reserved bytes at the peak, its OOMs, its findings
//! (counts and kinds), the sites holding the most at the peak and at the end, and per-step
//! figures. The snapshot is then freed, so comparing a thousand ranks holds the summaries
//! and the few snapshots being read ([`summarize_all`] reads on every core, within a budget
//! of bytes in flight). The summaries come from the same engine and `ModelView` as `report`,
//! so a rank's row says what `report` says of its file. A summary is versioned JSON
//! ([`RANK_SUMMARY_FORMAT_VERSION`]): `vramscope summarize` writes one where the snapshot
//! is (the map, on a cluster's own engine) and `vramscope ranks` reads summaries and
//! snapshots alike ([`read_rank`]); the comparison of the same ranks is the same either way.
//!
//! [`compare_summaries`] numbers the ranks, gives the distribution of each figure over them
//! (min, median, p95, max of the peak and of the top sites: [`Distribution`]) and names the
//! ranks that stand out by a robust rule ([`stands_out`]): a figure stands out when it
//! exceeds the median of all ranks by more than [`OUTLIER_MADS`] scaled median absolute
//! deviations and by more than a floor (a share of the median and [`ABSOLUTE_FLOOR`]), so
//! identical ranks, or ranks that differ by noise, name none. The figures judged are the
//! peak of allocated bytes (`rank_imbalance`), the OOMs (`rank_oom`) and what each site
//! still holds at the end when the rank's allocated bytes at the end stand out too
//! (`rank_retains_more`: a leak on one rank). What a site holds at
//! the peak explains a peak that stands out but is not judged alone: it moves with the
//! moment of the peak. The comparison is data: the render crate (`vramscope_render::ranks`)
//! prints it as text, markdown, JSON or HTML for `vramscope ranks`.
//!
//! A file that cannot be read, or an empty dump, does not stop the others: its summary says
//! why ([`RankSummary::skipped`]), the comparison lists it ([`RankComparison::failed`]), and
//! the command exits with 1. A file of several devices is its devices, a row each
//! ([`RankRow::device`]), never one rank whose peak sums theirs.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Read as _;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use vramscope_model::{format_bytes, Snapshot};

use crate::model_view::ModelView;
use crate::report::{self, ReportOptions};
use vramscope_import::ImportError;

/// A rank's peak stands out only when it exceeds the median rank's by more than this share
/// (and by the robust rule of [`stands_out`]).
pub const IMBALANCE_THRESHOLD: f64 = 0.10;

/// What a site holds at the end stands out only when it exceeds the site's median by more
/// than this share of the median rank's peak (and by the robust rule of [`stands_out`]).
pub const SITE_THRESHOLD: f64 = 0.02;

/// No difference in bytes smaller than this stands out, whatever the spread (8 MiB).
pub const ABSOLUTE_FLOOR: u64 = 8 << 20;

/// A figure stands out when it exceeds the median by more than this many scaled median
/// absolute deviations (1.4826 × MAD, the standard deviation of normal noise): about 1 in
/// 3.5 million normal ranks would.
pub const OUTLIER_MADS: f64 = 5.0;

/// The most sites a finding names.
const IMBALANCE_SITES: usize = 5;

/// The sites a summary keeps at the peak and at the end, largest first.
pub const SUMMARY_SITES: usize = 16;

/// The top sites whose spread the distribution gives.
const DISTRIBUTION_SITES: usize = 5;

/// Version of the JSON schema of `vramscope ranks` (2: `numbering`; 3: `distribution`,
/// `allocated_at_end`, `top_site_at_end`, findings of kinds `rank_oom` and
/// `rank_retains_more` with `sites_at_end`, site medians over all ranks).
pub const RANKS_FORMAT_VERSION: u32 = 3;

/// Version of a [`RankSummary`]'s JSON.
pub const RANK_SUMMARY_FORMAT_VERSION: u32 = 1;

/// [`RankSummary::kind`]: how a summary's JSON is told from a snapshot's.
pub const RANK_SUMMARY_KIND: &str = "vramscope_rank_summary";

/// One rank's file reduced to what the comparison needs (kilobytes, whatever the snapshot's
/// size): what `vramscope summarize` writes and `vramscope.rank_summary()` returns.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RankSummary {
    /// Always [`RANK_SUMMARY_KIND`] (first in the JSON, so a summary is known by its start).
    pub kind: String,
    /// [`RANK_SUMMARY_FORMAT_VERSION`].
    pub format_version: u32,
    /// The snapshot's file, as it was named when summarized.
    pub file: String,
    /// The rank the file name gives (`rank3`, `mem_3.pickle`), if it gives one.
    pub rank: Option<u32>,
    /// Each device with data (one, `device` null, for a file of one device); empty when the
    /// file was skipped.
    pub devices: Vec<DeviceSummary>,
    /// Why the file was skipped, when it was: it could not be read or holds nothing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub skipped: Option<Skipped>,
}

/// Why a rank's file was skipped.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Skipped {
    /// [`SKIPPED_UNREADABLE`] or [`SKIPPED_EMPTY`].
    pub skipped: String,
    /// The importer's error, or the sentence every face says of an empty dump; each names
    /// the file.
    pub error: String,
}

/// One device's figures in a [`RankSummary`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DeviceSummary {
    /// The device of a file that holds several (null for a file of one device).
    pub device: Option<u32>,
    /// Events in the trace.
    pub events: u64,
    /// Peak allocated bytes.
    pub peak_allocated: u64,
    /// Peak reserved bytes (null when the format does not record them).
    pub peak_reserved: Option<u64>,
    /// Allocated and reserved bytes at the moment of the peak of allocated bytes (null
    /// without reserved figures): the fragmentation at the peak, in whole bytes so that it is
    /// the same from a summary as from the snapshot.
    pub usage_at_peak: Option<(u64, u64)>,
    /// Allocated bytes at the end.
    pub allocated_at_end: u64,
    /// OOM events.
    pub ooms: u64,
    /// Findings of the rank's own report, by severity: errors, warnings, infos.
    pub findings: (usize, usize, usize),
    /// Findings of the rank's own report by kind (`retained_per_step`: 2).
    pub finding_kinds: BTreeMap<String, usize>,
    /// The sites holding the most at the peak, largest first (at most [`SUMMARY_SITES`]),
    /// each `(label, bytes)`.
    pub at_peak: Vec<(String, u64)>,
    /// The sites holding the most at the end, largest first (at most [`SUMMARY_SITES`]).
    pub at_end: Vec<(String, u64)>,
    /// Per-step figures, when the trace marks two steps or more.
    pub steps: Option<StepFigures>,
    /// Bytes by memory category (parameters, activations, ...), where known: left for
    /// issue 46's categories; null until then.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub categories: Option<BTreeMap<String, u64>>,
}

/// Per-step figures of a rank: the peak of allocated bytes within each step.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StepFigures {
    /// Steps in the trace.
    pub steps: u64,
    /// The first step's peak allocated bytes.
    pub first_peak: u64,
    /// The last step's.
    pub last_peak: u64,
    /// The median step's (the lower median).
    pub median_peak: u64,
    /// The largest step peak.
    pub max_peak: u64,
}

/// One rank's figures.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct RankRow {
    /// The rank: the number the file name gives (`rank3`, `mem_3.pickle`) when every file's
    /// name gives a different one, else the file's place in the list (see
    /// [`RankComparison::numbering`]).
    pub rank: u32,
    /// The file.
    pub file: String,
    /// The device of a file that holds several, each device a row of its own (absent from
    /// the JSON for a file of one device).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub device: Option<u32>,
    /// Events in the trace.
    pub events: u64,
    /// Peak allocated bytes.
    pub peak_allocated: u64,
    /// Peak reserved bytes (null when the format does not record them).
    pub peak_reserved: Option<u64>,
    /// Reserved but unallocated bytes at the peak of allocated bytes, as a share of reserved
    /// (null without reserved figures).
    pub fragmentation_at_peak: Option<f64>,
    /// Allocated bytes at the end.
    pub allocated_at_end: u64,
    /// OOM events.
    pub ooms: u64,
    /// The site holding the most at the peak, and its bytes.
    pub top_site_at_peak: Option<(String, u64)>,
    /// The site holding the most at the end, and its bytes.
    pub top_site_at_end: Option<(String, u64)>,
    /// Findings of the rank's own report, by severity: errors, warnings, infos.
    pub findings: (usize, usize, usize),
    /// The sites holding the most at the peak (not printed; the findings read them).
    #[serde(skip)]
    pub at_peak: Vec<(String, u64)>,
    /// The sites holding the most at the end (not printed; the findings read them).
    #[serde(skip)]
    pub at_end: Vec<(String, u64)>,
}

/// One site's share of a rank's excess over the median.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct SiteExcess {
    /// The site's label (`file:line`, `(unknown site)`, `(before the trace)`).
    pub site: String,
    /// Bytes the site held on this rank (at its peak, or at its end).
    pub bytes: u64,
    /// The median over all ranks of what the site held at the same moment.
    pub median_bytes: u64,
}

/// A rank that stands out: its peak, its OOMs or what a site holds at its end exceeds the
/// median of all ranks by the robust rule of [`stands_out`].
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct RankImbalance {
    /// `rank_imbalance` (the peak stands out), `rank_oom` (the rank ran out of memory and
    /// the median rank did not) or `rank_retains_more` (a site holds more at the end).
    pub kind: &'static str,
    /// The rank.
    pub rank: u32,
    /// Its peak allocated bytes.
    pub peak: u64,
    /// The median rank (the lower median by peak).
    pub median_rank: u32,
    /// The median rank's peak allocated bytes.
    pub median_peak: u64,
    /// The sites that hold more at this rank's peak than their median over all ranks,
    /// largest difference first.
    pub sites: Vec<SiteExcess>,
    /// The sites whose bytes at this rank's end stand out, largest difference first.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub sites_at_end: Vec<SiteExcess>,
    /// One sentence saying what was seen.
    pub summary: String,
    /// One line saying what to do.
    pub fix: String,
}

/// The spread of one figure over the ranks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Spread {
    /// The smallest.
    pub min: u64,
    /// The median (the lower median).
    pub median: u64,
    /// The 95th percentile (nearest rank).
    pub p95: u64,
    /// The largest.
    pub max: u64,
}

impl Spread {
    /// The spread of `values` (none when empty).
    pub fn of(values: &[u64]) -> Option<Spread> {
        let mut sorted = values.to_vec();
        sorted.sort_unstable();
        let n = sorted.len();
        if n == 0 {
            return None;
        }
        let p95 = ((n as f64 * 0.95).ceil() as usize).clamp(1, n) - 1;
        Some(Spread {
            min: sorted[0],
            median: sorted[(n - 1) / 2],
            p95: sorted[p95],
            max: sorted[n - 1],
        })
    }
}

/// One site's spread over the ranks (a rank whose summary does not list the site counts 0).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct SiteSpread {
    /// The site's label.
    pub site: String,
    /// Its bytes over the ranks.
    #[serde(flatten)]
    pub spread: Spread,
}

/// The distribution of the figures over the compared ranks (rows).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Distribution {
    /// Peak allocated bytes.
    pub peak_allocated: Spread,
    /// Peak reserved bytes, over the ranks that record them (null when none does).
    pub peak_reserved: Option<Spread>,
    /// Allocated bytes at the end.
    pub allocated_at_end: Spread,
    /// OOM events.
    pub ooms: Spread,
    /// The sites holding the most at the peak (by median), at most 5.
    pub sites_at_peak: Vec<SiteSpread>,
    /// The sites holding the most at the end (by median), at most 5.
    pub sites_at_end: Vec<SiteSpread>,
}

/// The comparison of a job's ranks.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct RankComparison {
    /// [`RANKS_FORMAT_VERSION`].
    pub format_version: u32,
    /// How the ranks were numbered: `"file names"`, or a sentence saying why they are the
    /// files' places in the list instead.
    pub numbering: String,
    /// One row per rank, in rank order: every rank, however many.
    pub ranks: Vec<RankRow>,
    /// The distribution of each figure over the ranks (null when no rank was read).
    pub distribution: Option<Distribution>,
    /// The ranks that stand out, largest peak first.
    pub findings: Vec<RankImbalance>,
    /// The files that could not be read, in rank order: they have no figures and take no
    /// part in the comparison (absent from the JSON when every file was read).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub failed: Vec<FailedRank>,
}

impl RankComparison {
    /// The ranks that stand out, in rank order.
    pub fn stand_out(&self) -> Vec<u32> {
        let set: BTreeSet<u32> = self.findings.iter().map(|f| f.rank).collect();
        set.into_iter().collect()
    }

    /// The compared ranks that do not stand out, in rank order.
    pub fn alike(&self) -> Vec<u32> {
        let out: BTreeSet<u32> = self.findings.iter().map(|f| f.rank).collect();
        self.ranks
            .iter()
            .map(|r| r.rank)
            .filter(|r| !out.contains(r))
            .collect()
    }
}

/// A rank whose file was skipped: it could not be read, or it holds nothing to analyse.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct FailedRank {
    /// The rank, numbered as the others are.
    pub rank: u32,
    /// The file.
    pub file: String,
    /// Why it was skipped: the importer's error, or the sentence every face says of an empty
    /// dump (`report::nothing_to_analyse`); each names the file.
    pub error: String,
    /// `unreadable` or `empty`.
    pub skipped: &'static str,
}

impl FailedRank {
    /// What happened to the file, in a few words: `could not be read`, `nothing to analyse`.
    pub fn what(&self) -> &'static str {
        if self.skipped == SKIPPED_EMPTY {
            "skipped"
        } else {
            "could not be read"
        }
    }
}

/// [`FailedRank::skipped`] of a file that could not be read.
pub const SKIPPED_UNREADABLE: &str = "unreadable";

/// [`FailedRank::skipped`] of a file with nothing to analyse (no events, no segments).
pub const SKIPPED_EMPTY: &str = "empty";

/// The rank a file name gives (`rank3.pickle`, `snapshot_rank_3.json`, `mem-3.pickle`): the
/// digits after `rank` if the name has them, else the digits that end the name before its
/// extensions. Digits inside a name (`ctx512_train`, `opt125m`) are not a rank.
pub fn rank_from_name(path: &Path) -> Option<u32> {
    let name = path.file_name()?.to_str()?.to_ascii_lowercase();
    let digits_at = |at: usize| -> Option<u32> {
        let rest = name[at..].trim_start_matches(['_', '-', '.']);
        let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
        digits.parse().ok()
    };
    if let Some(at) = name.rfind("rank") {
        if let Some(rank) = digits_at(at + 4) {
            return Some(rank);
        }
    }
    let stem = name.split('.').next().unwrap_or(&name);
    let digits = stem.len() - stem.trim_end_matches(|c: char| c.is_ascii_digit()).len();
    if digits == 0 {
        return None;
    }
    stem[stem.len() - digits..].parse().ok()
}

/// The ranks of `paths`, and how they were numbered: from the file names when every name
/// gives one and no two give the same, else by place in the list, with the reason.
pub fn number_ranks(paths: &[&Path]) -> (Vec<u32>, String) {
    let named: Vec<(String, Option<u32>)> = paths
        .iter()
        .map(|p| (p.display().to_string(), rank_from_name(p)))
        .collect();
    number_named(&named)
}

/// [`number_ranks`] of files given as `(file, the rank its name gives)`.
pub fn number_named(named: &[(String, Option<u32>)]) -> (Vec<u32>, String) {
    let by_place = || (0..named.len() as u32).collect::<Vec<u32>>();
    if let Some((file, _)) = named.iter().find(|(_, rank)| rank.is_none()) {
        let why =
            format!("by place in the list: {file} does not name a rank (rank3, mem_3.pickle)");
        return (by_place(), why);
    }
    let ranks: Vec<u32> = named.iter().filter_map(|(_, rank)| *rank).collect();
    let mut seen = BTreeMap::new();
    for (i, &rank) in ranks.iter().enumerate() {
        if let Some(first) = seen.insert(rank, i) {
            let why = format!(
                "by place in the list: {} and {} both name rank {rank}",
                named[first].0, named[i].0
            );
            return (by_place(), why);
        }
    }
    (ranks, "file names".to_string())
}

/// The file name endings a folder's snapshot files have (`vramscope ranks DIR`): PyTorch's
/// pickles, our JSON and event logs, Chrome traces, plain or gzipped.
pub const SNAPSHOT_ENDINGS: [&str; 6] = [".pickle", ".pkl", ".json", ".jsonl", ".gz", ".pt"];

/// The snapshot files named by `inputs`, each once: files as they are, folders by their files
/// (sorted) whose names end like a snapshot's ([`SNAPSHOT_ENDINGS`]). Also returns what was
/// left out, each with the reason: another file of a folder (`README.md`), or a file named
/// again (the same file, by any path: a symbolic link to a file already taken says which,
/// so that a folder of links to one snapshot is seen to be one rank).
pub fn expand_inputs(inputs: &[PathBuf]) -> std::io::Result<(Vec<PathBuf>, Vec<String>)> {
    let mut files = Vec::new();
    let mut left_out = Vec::new();
    let mut seen: BTreeMap<PathBuf, PathBuf> = BTreeMap::new();
    let mut take = |path: PathBuf, left_out: &mut Vec<String>| {
        let identity = std::fs::canonicalize(&path).unwrap_or_else(|_| path.clone());
        match seen.get(&identity) {
            None => {
                seen.insert(identity, path.clone());
                files.push(path);
            }
            Some(first) if *first == path => {
                left_out.push(format!("{}: named more than once", shown(&path)));
            }
            Some(first) => left_out.push(format!(
                "{}: the same file as {}: counted once",
                shown(&path),
                shown(first)
            )),
        }
    };
    for input in inputs {
        if input.is_dir() {
            let mut inside: Vec<PathBuf> = std::fs::read_dir(input)?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.is_file())
                .collect();
            inside.sort();
            for path in inside {
                let name = path
                    .file_name()
                    .map(|n| n.to_string_lossy().to_ascii_lowercase())
                    .unwrap_or_default();
                if SNAPSHOT_ENDINGS.iter().any(|end| name.ends_with(end)) {
                    take(path, &mut left_out);
                } else {
                    left_out.push(format!(
                        "{}: not a snapshot's file name ({})",
                        shown(&path),
                        SNAPSHOT_ENDINGS.join(", ")
                    ));
                }
            }
        } else {
            take(input.clone(), &mut left_out);
        }
    }
    Ok((files, left_out))
}

/// A path as a message shows it: one line, escaped as text from a file is
/// ([`vramscope_model::terminal::sanitize`]), since a folder's file names are the folder's.
fn shown(path: &Path) -> String {
    vramscope_model::terminal::sanitize(&path.display().to_string()).into_owned()
}

/// A summary of a file that was skipped.
fn skipped_summary(file: String, rank: Option<u32>, skipped: &str, error: String) -> RankSummary {
    RankSummary {
        kind: RANK_SUMMARY_KIND.to_string(),
        format_version: RANK_SUMMARY_FORMAT_VERSION,
        file,
        rank,
        devices: Vec::new(),
        skipped: Some(Skipped {
            skipped: skipped.to_string(),
            error,
        }),
    }
}

/// The summary of `snapshot`, read from `path` (which names the file and gives the rank).
/// An empty dump gives a summary that says it was skipped, in the words every face says.
pub fn summarize_snapshot(path: &Path, snapshot: &Snapshot) -> RankSummary {
    let file = path.display().to_string();
    let rank = rank_from_name(path);
    if let Some(message) = report::nothing_to_analyse(snapshot, &file) {
        return skipped_summary(file, rank, SKIPPED_EMPTY, message);
    }
    let devices = vramscope_engine::devices::devices_with_data(snapshot);
    let devices = if devices.len() > 1 {
        devices
            .iter()
            .map(|&d| {
                let part = vramscope_engine::devices::only_device(snapshot, d);
                summarize_device(Some(d), &part)
            })
            .collect()
    } else {
        vec![summarize_device(None, snapshot)]
    };
    RankSummary {
        kind: RANK_SUMMARY_KIND.to_string(),
        format_version: RANK_SUMMARY_FORMAT_VERSION,
        file,
        rank,
        devices,
        skipped: None,
    }
}

/// The largest `(label, bytes)` of `holdings`, merged by label.
fn top_sites(view: &ModelView, holdings: &[crate::model_view::Holding]) -> Vec<(String, u64)> {
    let mut by_label: BTreeMap<String, u64> = BTreeMap::new();
    for h in holdings {
        *by_label
            .entry(view.group(h.group).label().to_string())
            .or_insert(0) += h.bytes;
    }
    let mut sites: Vec<(String, u64)> = by_label.into_iter().collect();
    sites.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    sites.truncate(SUMMARY_SITES);
    sites
}

/// One device's figures.
fn summarize_device(device: Option<u32>, snapshot: &Snapshot) -> DeviceSummary {
    let view = ModelView::new(snapshot);
    let options = ReportOptions {
        explorer: false,
        ..ReportOptions::default()
    };
    let built = report::build_report_view(&view, &options);
    let mut finding_kinds = BTreeMap::new();
    for f in &built.findings {
        *finding_kinds
            .entry(f.kind.as_str().to_string())
            .or_insert(0) += 1;
    }
    let usage_at_peak = view
        .reserved_known()
        .then(|| match view.peak_allocated_event() {
            Some(event) => view.usage_at(event),
            None => (view.baseline_allocated(), view.baseline_reserved()),
        });
    DeviceSummary {
        device,
        events: snapshot.events.len() as u64,
        peak_allocated: view.peak_allocated(),
        peak_reserved: view.reserved_known().then(|| view.peak_reserved()),
        usage_at_peak,
        allocated_at_end: view.end_allocated(),
        ooms: view.totals().ooms.max(snapshot.stats.num_ooms),
        findings: built.counts(),
        finding_kinds,
        at_peak: top_sites(&view, view.live_at_peak()),
        at_end: top_sites(&view, view.live_at_end()),
        steps: step_figures(&view),
        categories: None,
    }
}

/// The peak allocated bytes of each step, when the trace marks two or more.
fn step_figures(view: &ModelView) -> Option<StepFigures> {
    let steps = view.steps().len();
    if steps < 2 {
        return None;
    }
    let mut peaks = vec![0u64; steps];
    for point in view.timeline() {
        let step = view.event_step(point.event) as usize;
        if let Some(peak) = peaks.get_mut(step) {
            *peak = (*peak).max(point.allocated);
        }
    }
    let mut sorted = peaks.clone();
    sorted.sort_unstable();
    Some(StepFigures {
        steps: steps as u64,
        first_peak: peaks[0],
        last_peak: peaks[steps - 1],
        median_peak: sorted[(steps - 1) / 2],
        max_peak: sorted[steps - 1],
    })
}

/// Whether the file at `path` is a rank summary (JSON whose first key is `kind` with
/// [`RANK_SUMMARY_KIND`]), by its first bytes.
pub fn is_summary_file(path: &Path) -> bool {
    let mut head = [0u8; 256];
    let Ok(mut file) = std::fs::File::open(path) else {
        return false;
    };
    let mut n = 0;
    while n < head.len() {
        match file.read(&mut head[n..]) {
            Ok(0) | Err(_) => break,
            Ok(k) => n += k,
        }
    }
    let text = String::from_utf8_lossy(&head[..n]);
    let text = text.trim_start();
    let Some(rest) = text.strip_prefix('{') else {
        return false;
    };
    let rest = rest.trim_start();
    rest.strip_prefix("\"kind\"")
        .map(|r| r.trim_start().trim_start_matches(':').trim_start())
        .is_some_and(|r| r.starts_with(&format!("\"{RANK_SUMMARY_KIND}\"")))
}

/// A summary's JSON, checked: a summary of a newer version is refused with a sentence.
pub fn summary_from_json(text: &str) -> Result<RankSummary, String> {
    let summary: RankSummary =
        serde_json::from_str(text).map_err(|e| format!("not a rank summary: {e}"))?;
    if summary.kind != RANK_SUMMARY_KIND {
        return Err(format!("not a rank summary (kind {:?})", summary.kind));
    }
    if summary.format_version > RANK_SUMMARY_FORMAT_VERSION {
        return Err(format!(
            "a rank summary of format {} (this vramscope reads {} and older): summarize \
             with this version, or compare with the newer one",
            summary.format_version, RANK_SUMMARY_FORMAT_VERSION
        ));
    }
    Ok(summary)
}

/// A summary's JSON as `vramscope summarize` writes it.
pub fn summary_to_json(summary: &RankSummary) -> String {
    let mut text = serde_json::to_string_pretty(summary).unwrap_or_default();
    text.push('\n');
    text
}

/// The summary of the file at `path`: read as it is if it is a summary ([`is_summary_file`]),
/// else the snapshot loaded, summarized and freed. A file that cannot be read gives a
/// summary that says why (never an error: the other ranks are compared).
pub fn read_rank(path: &Path) -> RankSummary {
    let file = path.display().to_string();
    if is_summary_file(path) {
        let read = std::fs::read_to_string(path)
            .map_err(|e| e.to_string())
            .and_then(|text| summary_from_json(&text));
        return match read {
            Ok(summary) => summary,
            Err(error) => skipped_summary(
                file.clone(),
                rank_from_name(path),
                SKIPPED_UNREADABLE,
                format!("{file}: {error}"),
            ),
        };
    }
    match vramscope_import::load(path) {
        Ok(snapshot) => summarize_snapshot(path, &snapshot),
        Err(error) => skipped_summary(
            file,
            rank_from_name(path),
            SKIPPED_UNREADABLE,
            error.to_string(),
        ),
    }
}

/// The bytes of files being read at once by [`summarize_all`] (one file is always read,
/// however large): with a snapshot in memory a few times its file's size, about 2 GB at most
/// in flight.
pub const IN_FLIGHT_BYTES: u64 = 256 << 20;

/// The summaries of `files` ([`read_rank`]), in the files' order, read on as many threads as
/// the machine has cores while the files being read add up to at most `in_flight` bytes (at
/// least one file at a time); each snapshot is freed as soon as it is summarized. `progress`
/// is called with (files done, files in all) as they finish.
pub fn summarize_all(
    files: &[PathBuf],
    in_flight: u64,
    progress: &(dyn Fn(usize, usize) + Sync),
) -> Vec<RankSummary> {
    let workers = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(files.len().max(1));
    let next = std::sync::atomic::AtomicUsize::new(0);
    let done = std::sync::atomic::AtomicUsize::new(0);
    let budget = (std::sync::Mutex::new(0u64), std::sync::Condvar::new());
    let mut results: Vec<Option<RankSummary>> = (0..files.len()).map(|_| None).collect();
    let slots = std::sync::Mutex::new(&mut results);
    std::thread::scope(|scope| {
        for _ in 0..workers {
            scope.spawn(|| loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let Some(path) = files.get(i) else {
                    return;
                };
                let size = std::fs::metadata(path).map_or(0, |m| m.len());
                {
                    let (lock, wake) = &budget;
                    let mut used = lock.lock().unwrap_or_else(|e| e.into_inner());
                    while *used > 0 && *used + size > in_flight {
                        used = wake.wait(used).unwrap_or_else(|e| e.into_inner());
                    }
                    *used += size;
                }
                let summary = read_rank(path);
                {
                    let (lock, wake) = &budget;
                    let mut used = lock.lock().unwrap_or_else(|e| e.into_inner());
                    *used -= size;
                    wake.notify_all();
                }
                if let Ok(mut slots) = slots.lock() {
                    slots[i] = Some(summary);
                }
                let finished = done.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
                progress(finished, files.len());
            });
        }
    });
    results
        .into_iter()
        .map(|r| r.expect("every file was read by a worker"))
        .collect()
}

/// Loads every file, on as many threads as the machine has cores; `progress` is called with
/// (files done, files in all) as they finish. The results are in the files' order. Every
/// snapshot stays in memory: [`summarize_all`] is the bounded way.
pub fn load_all(
    files: &[PathBuf],
    progress: &(dyn Fn(usize, usize) + Sync),
) -> Vec<Result<Snapshot, ImportError>> {
    let workers = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(files.len().max(1));
    let next = std::sync::atomic::AtomicUsize::new(0);
    let done = std::sync::atomic::AtomicUsize::new(0);
    let mut results: Vec<Option<Result<Snapshot, ImportError>>> =
        (0..files.len()).map(|_| None).collect();
    let slots = std::sync::Mutex::new(&mut results);
    std::thread::scope(|scope| {
        for _ in 0..workers {
            scope.spawn(|| loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let Some(path) = files.get(i) else {
                    return;
                };
                let loaded = vramscope_import::load(path);
                if let Ok(mut slots) = slots.lock() {
                    slots[i] = Some(loaded);
                }
                let finished = done.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
                progress(finished, files.len());
            });
        }
    });
    results
        .into_iter()
        .map(|r| r.expect("every file was loaded by a worker"))
        .collect()
}

/// Compares the ranks of `snapshots` (`(file, snapshot)`, in any order).
pub fn compare(snapshots: &[(PathBuf, Snapshot)]) -> RankComparison {
    let summaries: Vec<RankSummary> = snapshots
        .iter()
        .map(|(path, snapshot)| summarize_snapshot(path, snapshot))
        .collect();
    compare_summaries(&summaries)
}

/// Compares the ranks of `results` (`(file, what loading it gave)`, in any order, as
/// [`load_all`] returns them beside its files): a file that could not be read is numbered
/// as the others are and listed in [`RankComparison::failed`] with its error; the others are
/// compared among themselves.
pub fn compare_results(results: &[(PathBuf, Result<Snapshot, ImportError>)]) -> RankComparison {
    let summaries: Vec<RankSummary> = results
        .iter()
        .map(|(path, result)| match result {
            Ok(snapshot) => summarize_snapshot(path, snapshot),
            Err(error) => skipped_summary(
                path.display().to_string(),
                rank_from_name(path),
                SKIPPED_UNREADABLE,
                error.to_string(),
            ),
        })
        .collect();
    compare_summaries(&summaries)
}

/// Compares the ranks of `summaries` (in any order; a rank's number comes from its file's
/// name, or from its place in the list, as [`number_ranks`] says). The same summaries give
/// the same comparison, whether they were made here or on a cluster's workers.
pub fn compare_summaries(summaries: &[RankSummary]) -> RankComparison {
    let multi = summaries.iter().find(|s| s.devices.len() > 1);
    // Ranks come from the file names unless a file holds several devices: then every row is
    // numbered by its place, the devices of a file in device order.
    let (numbers, numbering): (Vec<Vec<u32>>, String) = match multi {
        None => {
            let named: Vec<(String, Option<u32>)> =
                summaries.iter().map(|s| (s.file.clone(), s.rank)).collect();
            let (numbers, numbering) = number_named(&named);
            (numbers.into_iter().map(|n| vec![n]).collect(), numbering)
        }
        Some(several) => {
            let mut next = 0u32;
            let numbers = summaries
                .iter()
                .map(|s| {
                    let n = s.devices.len().max(1) as u32;
                    let these = (next..next + n).collect();
                    next += n;
                    these
                })
                .collect();
            let listed = several
                .devices
                .iter()
                .filter_map(|d| d.device.map(|d| d.to_string()))
                .collect::<Vec<_>>()
                .join(", ");
            let why = format!(
                "by place in the list: {} holds devices {listed}, each a row of its own",
                several.file
            );
            (numbers, why)
        }
    };
    let mut ranks = Vec::new();
    let mut failed = Vec::new();
    for (summary, numbers) in summaries.iter().zip(numbers) {
        if let Some(skip) = &summary.skipped {
            failed.push(FailedRank {
                rank: numbers[0],
                file: summary.file.clone(),
                error: skip.error.clone(),
                skipped: if skip.skipped == SKIPPED_EMPTY {
                    SKIPPED_EMPTY
                } else {
                    SKIPPED_UNREADABLE
                },
            });
            continue;
        }
        for (device, rank) in summary.devices.iter().zip(numbers) {
            ranks.push(row(rank, &summary.file, device));
        }
    }
    ranks.sort_by_key(|r| r.rank);
    failed.sort_by_key(|f| f.rank);
    let distribution = distribution(&ranks);
    let findings = outliers(&ranks);
    RankComparison {
        format_version: RANKS_FORMAT_VERSION,
        numbering,
        ranks,
        distribution,
        findings,
        failed,
    }
}

/// One rank's row, from its device's summary.
fn row(rank: u32, file: &str, d: &DeviceSummary) -> RankRow {
    RankRow {
        rank,
        file: file.to_string(),
        device: d.device,
        events: d.events,
        peak_allocated: d.peak_allocated,
        peak_reserved: d.peak_reserved,
        fragmentation_at_peak: d.usage_at_peak.map(|(allocated, reserved)| {
            if reserved == 0 {
                0.0
            } else {
                reserved.saturating_sub(allocated) as f64 / reserved as f64
            }
        }),
        allocated_at_end: d.allocated_at_end,
        ooms: d.ooms,
        top_site_at_peak: d.at_peak.first().cloned(),
        top_site_at_end: d.at_end.first().cloned(),
        findings: d.findings,
        at_peak: d.at_peak.clone(),
        at_end: d.at_end.clone(),
    }
}

/// The lower median of `values` (0 when empty).
fn median(values: &[u64]) -> u64 {
    let mut sorted = values.to_vec();
    sorted.sort_unstable();
    sorted
        .get(values.len().saturating_sub(1) / 2)
        .copied()
        .unwrap_or(0)
}

/// The least a value must exceed the median of `values` by to stand out: the larger of
/// [`OUTLIER_MADS`] scaled median absolute deviations and `floor`. With fewer than three
/// values the deviations say nothing of the spread, and the floor alone decides.
pub fn outlier_margin(values: &[u64], floor: u64) -> u64 {
    let m = median(values);
    let deviations: Vec<u64> = values.iter().map(|&v| v.abs_diff(m)).collect();
    let mad = median(&deviations) as f64 * 1.4826;
    ((mad * OUTLIER_MADS).ceil() as u64).max(floor)
}

/// Whether `value` stands out above `values` (which hold it): it exceeds their median by
/// more than [`outlier_margin`] with `floor`. Identical values never stand out (the margin is
/// the floor), and neither does noise: a value 5 scaled MADs from the median is rarer than
/// one in a million normal ranks.
pub fn stands_out(value: u64, values: &[u64], floor: u64) -> bool {
    value > median(values).saturating_add(outlier_margin(values, floor))
}

/// What each site holds over the rows. Where a rank's summary does not list a site, it held
/// 0 if the list is whole, or at most the smallest listed if the list was cut at
/// [`SUMMARY_SITES`]: `bound` takes that most (so that a site which falls just below one
/// rank's cut and just above another's is not judged against a 0 it never held), else 0
/// (the distribution says what the summaries hold).
fn site_table(
    rows: &[RankRow],
    pick: fn(&RankRow) -> &Vec<(String, u64)>,
    bound: bool,
) -> BTreeMap<&str, Vec<u64>> {
    let mut table: BTreeMap<&str, Vec<u64>> = BTreeMap::new();
    for row in rows {
        for (site, _) in pick(row) {
            table
                .entry(site.as_str())
                .or_insert_with(|| vec![0; rows.len()]);
        }
    }
    for (i, row) in rows.iter().enumerate() {
        let listed = pick(row);
        let cut = listed.len() >= SUMMARY_SITES;
        if bound && cut {
            let least = listed.iter().map(|(_, b)| *b).min().unwrap_or(0);
            for values in table.values_mut() {
                values[i] = least;
            }
        }
        for (site, bytes) in listed {
            if let Some(values) = table.get_mut(site.as_str()) {
                values[i] = *bytes;
            }
        }
    }
    table
}

/// The largest sites of `table` by median (then by max), with their spread.
fn top_spreads(table: &BTreeMap<&str, Vec<u64>>) -> Vec<SiteSpread> {
    let mut spreads: Vec<SiteSpread> = table
        .iter()
        .filter_map(|(site, values)| {
            Spread::of(values).map(|spread| SiteSpread {
                site: site.to_string(),
                spread,
            })
        })
        .collect();
    spreads.sort_by(|a, b| {
        (b.spread.median, b.spread.max)
            .cmp(&(a.spread.median, a.spread.max))
            .then_with(|| a.site.cmp(&b.site))
    });
    spreads.truncate(DISTRIBUTION_SITES);
    spreads
}

/// The distribution of the rows' figures.
fn distribution(rows: &[RankRow]) -> Option<Distribution> {
    let of = |f: fn(&RankRow) -> u64| Spread::of(&rows.iter().map(f).collect::<Vec<_>>());
    let reserved: Vec<u64> = rows.iter().filter_map(|r| r.peak_reserved).collect();
    Some(Distribution {
        peak_allocated: of(|r| r.peak_allocated)?,
        peak_reserved: Spread::of(&reserved),
        allocated_at_end: of(|r| r.allocated_at_end)?,
        ooms: of(|r| r.ooms)?,
        sites_at_peak: top_spreads(&site_table(rows, |r| &r.at_peak, false)),
        sites_at_end: top_spreads(&site_table(rows, |r| &r.at_end, false)),
    })
}

/// The ranks that stand out, largest peak first.
fn outliers(rows: &[RankRow]) -> Vec<RankImbalance> {
    if rows.len() < 2 {
        return Vec::new();
    }
    let mut by_peak: Vec<&RankRow> = rows.iter().collect();
    by_peak.sort_by_key(|r| (r.peak_allocated, r.rank));
    // The lower median: with an even count, the smaller of the two middle ranks, so that one
    // heavy rank of two is still measured against the other.
    let median_row = by_peak[(by_peak.len() - 1) / 2];
    let median_peak = median_row.peak_allocated;
    let peaks: Vec<u64> = rows.iter().map(|r| r.peak_allocated).collect();
    let peak_floor = ((median_peak as f64 * IMBALANCE_THRESHOLD) as u64).max(ABSOLUTE_FLOOR);
    let peak_margin = outlier_margin(&peaks, peak_floor);
    let ooms: Vec<u64> = rows.iter().map(|r| r.ooms).collect();
    let oom_margin = outlier_margin(&ooms, 0);
    let median_ooms = median(&ooms);
    let site_floor = ((median_peak as f64 * SITE_THRESHOLD) as u64).max(ABSOLUTE_FLOOR);
    // What the sites hold at the peak explains a peak that stands out (what the summaries
    // hold); what they hold at the end is judged (a site cut from a summary at the cut).
    let at_peak = site_table(rows, |r| &r.at_peak, false);
    let at_end = site_table(rows, |r| &r.at_end, true);
    // A site holds more at a rank's end only if the rank does: ranks whose code paths name
    // their memory differently (the same optimizer state from another line) hold the same.
    let ends: Vec<u64> = rows.iter().map(|r| r.allocated_at_end).collect();
    let end_margin = outlier_margin(&ends, site_floor);
    let median_end = median(&ends);
    let site_medians = |table: &BTreeMap<&str, Vec<u64>>| -> BTreeMap<String, (u64, u64)> {
        table
            .iter()
            .map(|(site, values)| {
                (
                    site.to_string(),
                    (median(values), outlier_margin(values, site_floor)),
                )
            })
            .collect()
    };
    let peak_medians = site_medians(&at_peak);
    let end_medians = site_medians(&at_end);
    let mut findings = Vec::new();
    for (i, r) in rows.iter().enumerate() {
        let peak_out = r.peak_allocated > median_peak.saturating_add(peak_margin);
        let oom_out = r.ooms > median_ooms.saturating_add(oom_margin);
        let end_out = r.allocated_at_end > median_end.saturating_add(end_margin);
        let mut sites_at_end: Vec<SiteExcess> = at_end
            .iter()
            .filter(|_| end_out)
            .filter_map(|(site, values)| {
                let (m, margin) = end_medians[*site];
                (values[i] > m.saturating_add(margin)).then(|| SiteExcess {
                    site: site.to_string(),
                    bytes: values[i],
                    median_bytes: m,
                })
            })
            .collect();
        if !(peak_out || oom_out || !sites_at_end.is_empty()) {
            continue;
        }
        sort_excess(&mut sites_at_end);
        let mut sites: Vec<SiteExcess> = at_peak
            .iter()
            .filter_map(|(site, values)| {
                let m = peak_medians[*site].0;
                (values[i] > m).then(|| SiteExcess {
                    site: site.to_string(),
                    bytes: values[i],
                    median_bytes: m,
                })
            })
            .collect();
        sort_excess(&mut sites);
        let kind = if peak_out {
            "rank_imbalance"
        } else if oom_out {
            "rank_oom"
        } else {
            "rank_retains_more"
        };
        let mut said = Vec::new();
        if peak_out {
            let excess = r.peak_allocated - median_peak;
            let share = excess as f64 / median_peak.max(1) as f64 * 100.0;
            let named = sites
                .first()
                .map(|s| {
                    format!(
                        "; most of it at {} ({} more than its median)",
                        s.site,
                        format_bytes(s.bytes - s.median_bytes)
                    )
                })
                .unwrap_or_default();
            said.push(format!(
                "rank {} peaks at {}, {} ({share:.0} %) above the median rank {} ({}){named}",
                r.rank,
                format_bytes(r.peak_allocated),
                format_bytes(excess),
                median_row.rank,
                format_bytes(median_peak),
            ));
        }
        if oom_out {
            said.push(format!(
                "rank {} ran out of memory {} time{} (the median rank {})",
                r.rank,
                r.ooms,
                if r.ooms == 1 { "" } else { "s" },
                match median_ooms {
                    0 => "never did".to_string(),
                    n => format!("{n} times"),
                }
            ));
        }
        if let Some(s) = sites_at_end.first() {
            let others = match sites_at_end.len() {
                1 => String::new(),
                2 => " and 1 other site".to_string(),
                n => format!(" and {} other sites", n - 1),
            };
            said.push(format!(
                "rank {} still holds {} at {} at its end, {} more than the median rank{others}",
                r.rank,
                format_bytes(s.bytes),
                s.site,
                format_bytes(s.bytes - s.median_bytes),
            ));
        }
        let fix = match kind {
            "rank_imbalance" => {
                "give every rank the same share: check the sites above for an uneven shard \
                 (optimizer state, parameters) or an uneven batch or sequence length on this \
                 rank"
            }
            "rank_oom" => {
                "run `vramscope report` on this rank's file for what filled it, and check the \
                 sites above for what this rank holds that the others do not"
            }
            _ => {
                "run `vramscope report` on this rank's file: what the sites above keep on this \
                 rank alone (a list that grows, a cache, a tensor kept for logging) is freed \
                 on the others"
            }
        };
        sites.truncate(IMBALANCE_SITES);
        sites_at_end.truncate(IMBALANCE_SITES);
        findings.push(RankImbalance {
            kind,
            rank: r.rank,
            peak: r.peak_allocated,
            median_rank: median_row.rank,
            median_peak,
            sites,
            sites_at_end,
            summary: said.join("; "),
            fix: fix.to_string(),
        });
    }
    findings.sort_by(|a, b| b.peak.cmp(&a.peak).then(a.rank.cmp(&b.rank)));
    findings
}

/// Largest difference first, then by site.
fn sort_excess(sites: &mut [SiteExcess]) {
    sites.sort_by(|a, b| {
        (b.bytes - b.median_bytes)
            .cmp(&(a.bytes - a.median_bytes))
            .then_with(|| a.site.cmp(&b.site))
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranks_come_from_file_names() {
        for (name, rank) in [
            ("rank3.pickle", Some(3)),
            ("snapshot_rank_12.json", Some(12)),
            ("run-rank-0.pickle", Some(0)),
            ("mem_7.pickle", Some(7)),
            ("/tmp/job/trace-5.json.gz", Some(5)),
            ("snapshot.pickle", None),
            // Digits inside a name are a model or a setting, not a rank.
            ("cs336_medium_ctx512_train_step.pickle", None),
            ("decomfl_opt125m_zo_fedlearn.pickle", None),
            ("hta_ddp_rank1_v100_profile_memory.trace.json.gz", Some(1)),
        ] {
            assert_eq!(rank_from_name(Path::new(name)), rank, "{name}");
        }
    }

    #[test]
    fn ranks_are_numbered_by_place_unless_every_name_gives_a_different_one() {
        let paths = |names: &[&'static str]| -> Vec<&'static Path> {
            names.iter().map(|n| Path::new(*n)).collect()
        };
        assert_eq!(
            number_ranks(&paths(&["r/mem_2.pickle", "r/mem_0.pickle"])),
            (vec![2, 0], "file names".to_string())
        );
        let (ranks, why) = number_ranks(&paths(&["a/rank1.pickle", "b/rank1.pickle"]));
        assert_eq!(ranks, [0, 1]);
        assert_eq!(
            why,
            "by place in the list: a/rank1.pickle and b/rank1.pickle both name rank 1"
        );
        let (ranks, why) = number_ranks(&paths(&["rank4.pickle", "cs336_ctx512_train.pickle"]));
        assert_eq!(ranks, [0, 1]);
        assert!(
            why.contains("cs336_ctx512_train.pickle does not name a rank"),
            "{why}"
        );
    }

    #[test]
    fn a_folder_gives_its_snapshot_files_and_each_file_counts_once() {
        let dir = std::env::temp_dir().join(format!("vramscope-ranks-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("temp dir");
        for name in ["rank0.pickle", "rank1.json.gz", "README.md"] {
            std::fs::write(dir.join(name), b"x").expect("write");
        }
        let (files, left_out) =
            expand_inputs(&[dir.clone(), dir.join("rank0.pickle")]).expect("expand");
        assert_eq!(files, [dir.join("rank0.pickle"), dir.join("rank1.json.gz")]);
        assert_eq!(left_out.len(), 2, "{left_out:?}");
        assert!(
            left_out[0].ends_with(
                "README.md: not a snapshot's file name (.pickle, .pkl, .json, .jsonl, .gz, .pt)"
            ),
            "{left_out:?}"
        );
        assert!(
            left_out[1].ends_with("rank0.pickle: named more than once"),
            "{left_out:?}"
        );
        // A link to a file already taken is that file: counted once, and said so.
        #[cfg(unix)]
        {
            std::os::unix::fs::symlink(dir.join("rank0.pickle"), dir.join("rank2.pickle"))
                .expect("symlink");
            let (files, left_out) = expand_inputs(std::slice::from_ref(&dir)).expect("expand");
            assert_eq!(files, [dir.join("rank0.pickle"), dir.join("rank1.json.gz")]);
            assert!(
                left_out.iter().any(|l| l.ends_with(&format!(
                    "rank2.pickle: the same file as {}: counted once",
                    dir.join("rank0.pickle").display()
                ))),
                "{left_out:?}"
            );
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A rank's summary with `sites` at the peak and `end` at the end; its peak is their sum.
    fn summary(rank: u32, sites: &[(&str, u64)], end: &[(&str, u64)]) -> RankSummary {
        let peak = sites.iter().map(|s| s.1).sum();
        let pairs = |list: &[(&str, u64)]| {
            let mut v: Vec<(String, u64)> = list.iter().map(|(s, b)| (s.to_string(), *b)).collect();
            v.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
            v
        };
        RankSummary {
            kind: RANK_SUMMARY_KIND.to_string(),
            format_version: RANK_SUMMARY_FORMAT_VERSION,
            file: format!("job/rank{rank}.pickle"),
            rank: Some(rank),
            devices: vec![DeviceSummary {
                device: None,
                events: 100,
                peak_allocated: peak,
                peak_reserved: Some(peak + (64 << 20)),
                usage_at_peak: Some((peak, peak + (64 << 20))),
                allocated_at_end: end.iter().map(|s| s.1).sum(),
                ooms: 0,
                findings: (0, 1, 0),
                finding_kinds: BTreeMap::from([("retained_per_step".to_string(), 1)]),
                at_peak: pairs(sites),
                at_end: pairs(end),
                steps: None,
                categories: None,
            }],
            skipped: None,
        }
    }

    /// A deterministic noise in `[-spread, spread]` for rank `rank` and figure `salt`.
    fn noise(rank: u32, salt: u64, spread: u64) -> i64 {
        let mut x = u64::from(rank).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ salt;
        x ^= x >> 29;
        x = x.wrapping_mul(0xBF58_476D_1CE4_E5B9);
        x ^= x >> 32;
        (x % (2 * spread + 1)) as i64 - spread as i64
    }

    const MIB: u64 = 1 << 20;

    /// 200 ranks of a job: 2 GiB of weights, activations about 1 GiB with a few percent of
    /// noise, optimizer state at the end; rank 17 keeps 200 MiB more at one site at its end
    /// (a leak), rank 143 runs a batch half again as large.
    fn job(leak: bool, batch: bool, spread: u64) -> Vec<RankSummary> {
        (0..200)
            .map(|rank| {
                let wobble = |salt, base: u64| (base as i64 + noise(rank, salt, spread)) as u64;
                let mut activations = wobble(1, 1024 * MIB);
                if batch && rank == 143 {
                    activations = activations * 3 / 2;
                }
                let logged = if leak && rank == 17 {
                    200 * MIB
                } else {
                    (MIB as i64 + noise(rank, 3, spread / 64)) as u64
                };
                summary(
                    rank,
                    &[
                        ("model.py:10", 2048 * MIB),
                        ("model.py:20", activations),
                        ("train.py:50", logged),
                    ],
                    &[
                        ("model.py:10", 2048 * MIB),
                        ("optim.py:5", wobble(2, 512 * MIB)),
                        ("train.py:50", logged),
                    ],
                )
            })
            .collect()
    }

    #[test]
    fn identical_ranks_name_none() {
        let c = compare_summaries(&job(false, false, 0));
        assert!(c.findings.is_empty(), "{:#?}", c.findings);
        assert_eq!(c.alike().len(), 200);
    }

    #[test]
    fn ranks_that_differ_by_noise_name_none() {
        // Up to 40 MiB of noise in activations and optimizer state: no rank stands out.
        let c = compare_summaries(&job(false, false, 40 * MIB));
        assert!(c.findings.is_empty(), "{:#?}", c.findings);
        let d = c.distribution.expect("ranks were read");
        assert!(
            d.peak_allocated.max > d.peak_allocated.min,
            "the noise is there"
        );
    }

    #[test]
    fn a_leak_and_a_larger_batch_are_named_and_nothing_else() {
        for spread in [0, 8 * MIB, 40 * MIB] {
            let c = compare_summaries(&job(true, true, spread));
            assert_eq!(c.stand_out(), [17, 143], "{spread}: {:#?}", c.findings);
            let batch = c.findings.iter().find(|f| f.rank == 143).unwrap();
            assert_eq!(batch.kind, "rank_imbalance");
            assert_eq!(batch.sites[0].site, "model.py:20");
            let leak = c.findings.iter().find(|f| f.rank == 17).unwrap();
            assert_eq!(leak.kind, "rank_retains_more", "{leak:#?}");
            assert_eq!(leak.sites_at_end.len(), 1, "{leak:#?}");
            assert_eq!(leak.sites_at_end[0].site, "train.py:50");
            assert_eq!(leak.sites_at_end[0].bytes, 200 * MIB);
            assert!(
                leak.summary.contains("still holds 200 MiB at train.py:50"),
                "{}",
                leak.summary
            );
        }
    }

    #[test]
    fn a_tiny_difference_is_no_outlier_however_tight_the_rest() {
        // Identical ranks but one that holds 4 MiB more: the MAD is 0, the floor decides.
        let mut ranks = job(false, false, 0);
        let d = &mut ranks[5].devices[0];
        d.peak_allocated += 4 * MIB;
        d.at_end[2].1 += 4 * MIB;
        d.at_peak[2].1 += 4 * MIB;
        let c = compare_summaries(&ranks);
        assert!(c.findings.is_empty(), "{:#?}", c.findings);
    }

    #[test]
    fn a_rank_that_ran_out_of_memory_stands_out() {
        let mut ranks = job(false, false, 0);
        ranks[9].devices[0].ooms = 1;
        let c = compare_summaries(&ranks);
        assert_eq!(c.stand_out(), [9]);
        assert_eq!(c.findings[0].kind, "rank_oom");
    }

    #[test]
    fn the_spread_is_min_median_p95_max() {
        let values: Vec<u64> = (1..=200).collect();
        assert_eq!(
            Spread::of(&values),
            Some(Spread {
                min: 1,
                median: 100,
                p95: 190,
                max: 200
            })
        );
        assert_eq!(
            Spread::of(&[7]),
            Some(Spread {
                min: 7,
                median: 7,
                p95: 7,
                max: 7
            })
        );
        assert_eq!(Spread::of(&[]), None);
        let c = compare_summaries(&job(false, true, 0));
        let d = c.distribution.unwrap();
        assert_eq!(d.sites_at_peak[0].site, "model.py:10");
        assert_eq!(d.sites_at_peak[1].spread.max, 1536 * MIB);
        assert_eq!(d.sites_at_peak[1].spread.median, 1024 * MIB);
    }

    #[test]
    fn a_summary_is_known_by_its_start_and_reads_back_the_same() {
        let dir = std::env::temp_dir().join(format!("vramscope-summary-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let original = job(true, false, 8 * MIB).swap_remove(17);
        let path = dir.join("rank17.json");
        std::fs::write(&path, summary_to_json(&original)).expect("write");
        assert!(is_summary_file(&path));
        assert_eq!(read_rank(&path), original);
        let mut newer = original.clone();
        newer.format_version = RANK_SUMMARY_FORMAT_VERSION + 1;
        std::fs::write(&path, summary_to_json(&newer)).expect("write");
        let refused = read_rank(&path);
        let skipped = refused.skipped.expect("a newer summary is skipped");
        assert_eq!(skipped.skipped, SKIPPED_UNREADABLE);
        assert!(
            skipped.error.contains("a rank summary of format 2"),
            "{}",
            skipped.error
        );
        std::fs::write(&path, b"{\"format_version\": 1, \"events\": []}").expect("write");
        assert!(!is_summary_file(&path), "a snapshot's JSON is no summary");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_site_cut_from_some_summaries_is_no_outlier() {
        // Forty sites of about 12 MiB at the end, each rank's noise deciding which sixteen its
        // summary keeps: a site kept by few ranks is not judged against a 0 it never held.
        let ranks: Vec<RankSummary> = (0..200)
            .map(|rank| {
                let sites: Vec<(String, u64)> = (0..40)
                    .map(|k| {
                        let bytes = (12 * MIB as i64 + noise(rank, 10 + k, MIB / 2)) as u64;
                        (format!("model.py:{k}"), bytes)
                    })
                    .collect();
                let refs: Vec<(&str, u64)> = sites.iter().map(|(s, b)| (s.as_str(), *b)).collect();
                let mut summary = summary(rank, &refs, &refs);
                let d = &mut summary.devices[0];
                d.at_peak.truncate(SUMMARY_SITES);
                d.at_end.truncate(SUMMARY_SITES);
                summary
            })
            .collect();
        let c = compare_summaries(&ranks);
        assert!(c.findings.is_empty(), "{:#?}", c.findings);
    }

    #[test]
    fn the_same_memory_from_another_line_is_no_outlier() {
        // Rank 5 keeps its optimizer state from another line (another code path): a site
        // that no other rank has holds 512 MiB at its end, but the rank holds no more.
        let mut ranks = job(false, false, 8 * MIB);
        for (site, _) in &mut ranks[5].devices[0].at_end {
            if site == "optim.py:5" {
                *site = "optim.py:6".to_string();
            }
        }
        let c = compare_summaries(&ranks);
        assert!(c.findings.is_empty(), "{:#?}", c.findings);
    }
}
