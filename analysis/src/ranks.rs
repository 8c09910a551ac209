//! Ranks side by side: one snapshot per rank of a distributed job, compared.
//!
//! When rank 3 of a DDP or FSDP job dies of OOM and the others do not, the user has one
//! snapshot per rank. [`compare`] takes them (already loaded, see [`load_all`], which reads
//! them on every core) and builds, for each rank, the figures that tell ranks apart: peak
//! allocated and reserved, fragmentation at the peak, OOMs, the site holding the most at the
//! peak and the number of findings; all of them from the same engine and `ModelView` as
//! `report`, so a rank's row says what `report` says of its file. Then a `rank_imbalance`
//! finding for every rank whose peak exceeds the median rank's by more than
//! [`IMBALANCE_THRESHOLD`], naming the sites that account for the difference: what each site
//! held at that rank's peak against what it held at the median rank's peak (the extra
//! optimizer shard, the uneven batch). The comparison is data: the render crate
//! (`vramscope_render::ranks`) prints it as text, markdown, JSON or HTML for `vramscope ranks`.
//!
//! A file that cannot be read, or an empty dump, does not stop the others: [`compare_results`]
//! skips it with a row of its own that says why ([`RankComparison::failed`]), and the command
//! exits with 1. A file of several devices is its devices, a row each ([`RankRow::device`]),
//! never one rank whose peak sums theirs.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Serialize;
use vramscope_model::{format_bytes, Snapshot};

use crate::model_view::ModelView;
use crate::report::{self, ReportOptions};
use vramscope_import::ImportError;

/// A rank is imbalanced when its peak exceeds the median rank's by more than this share.
pub const IMBALANCE_THRESHOLD: f64 = 0.10;

/// The most sites a `rank_imbalance` finding names.
const IMBALANCE_SITES: usize = 5;

/// Version of the JSON schema of `vramscope ranks` (2: `numbering`).
pub const RANKS_FORMAT_VERSION: u32 = 2;

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
    /// OOM events.
    pub ooms: u64,
    /// The site holding the most at the peak, and its bytes.
    pub top_site_at_peak: Option<(String, u64)>,
    /// Findings of the rank's own report, by severity: errors, warnings, infos.
    pub findings: (usize, usize, usize),
    /// Bytes each site held at the peak, by label (not printed; the imbalance reads it).
    #[serde(skip)]
    pub at_peak: BTreeMap<String, u64>,
}

/// One site's share of a rank's excess over the median rank.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct SiteExcess {
    /// The site's label (`file:line`, `(unknown site)`, `(before the trace)`).
    pub site: String,
    /// Bytes the site held at this rank's peak.
    pub bytes: u64,
    /// Bytes it held at the median rank's peak.
    pub median_bytes: u64,
}

/// A rank whose peak exceeds the median rank's by more than [`IMBALANCE_THRESHOLD`].
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct RankImbalance {
    /// Always `rank_imbalance`.
    pub kind: &'static str,
    /// The rank.
    pub rank: u32,
    /// Its peak allocated bytes.
    pub peak: u64,
    /// The median rank.
    pub median_rank: u32,
    /// The median rank's peak allocated bytes.
    pub median_peak: u64,
    /// The sites that hold more at this rank's peak than at the median rank's, largest
    /// difference first.
    pub sites: Vec<SiteExcess>,
    /// One sentence saying what was seen.
    pub summary: String,
    /// One line saying what to do.
    pub fix: String,
}

/// The comparison of a job's ranks.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct RankComparison {
    /// [`RANKS_FORMAT_VERSION`].
    pub format_version: u32,
    /// How the ranks were numbered: `"file names"`, or a sentence saying why they are the
    /// files' places in the list instead.
    pub numbering: String,
    /// One row per rank, in rank order.
    pub ranks: Vec<RankRow>,
    /// The ranks whose peak stands out.
    pub findings: Vec<RankImbalance>,
    /// The files that could not be read, in rank order: they have no figures and take no
    /// part in the comparison (absent from the JSON when every file was read).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub failed: Vec<FailedRank>,
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
    let named: Vec<Option<u32>> = paths.iter().map(|p| rank_from_name(p)).collect();
    let by_place = || (0..paths.len() as u32).collect::<Vec<u32>>();
    if let Some(i) = named.iter().position(Option::is_none) {
        let why = format!(
            "by place in the list: {} does not name a rank (rank3, mem_3.pickle)",
            paths[i].display()
        );
        return (by_place(), why);
    }
    let ranks: Vec<u32> = named.into_iter().flatten().collect();
    let mut seen = BTreeMap::new();
    for (i, &rank) in ranks.iter().enumerate() {
        if let Some(first) = seen.insert(rank, i) {
            let why = format!(
                "by place in the list: {} and {} both name rank {rank}",
                paths[first].display(),
                paths[i].display()
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
/// again (the same file, by any path).
pub fn expand_inputs(inputs: &[PathBuf]) -> std::io::Result<(Vec<PathBuf>, Vec<String>)> {
    let mut files = Vec::new();
    let mut left_out = Vec::new();
    let mut seen = std::collections::BTreeSet::new();
    let mut take = |path: PathBuf, left_out: &mut Vec<String>| {
        let identity = std::fs::canonicalize(&path).unwrap_or_else(|_| path.clone());
        if seen.insert(identity) {
            files.push(path);
        } else {
            left_out.push(format!("{}: named more than once", shown(&path)));
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

/// Loads every file, on as many threads as the machine has cores; `progress` is called with
/// (files done, files in all) as they finish. The results are in the files' order.
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

/// One rank's row, from its snapshot (`device`: which device of a file of several it is).
fn row(rank: u32, file: &str, device: Option<u32>, snapshot: &Snapshot) -> RankRow {
    let view = ModelView::new(snapshot);
    let options = ReportOptions {
        explorer: false,
        ..ReportOptions::default()
    };
    let built = report::build_report_view(&view, &options);
    let mut at_peak = BTreeMap::new();
    for h in view.live_at_peak() {
        *at_peak
            .entry(view.group(h.group).label().to_string())
            .or_insert(0u64) += h.bytes;
    }
    let top_site_at_peak = view
        .live_at_peak()
        .first()
        .map(|h| (view.group(h.group).label().to_string(), h.bytes));
    let fragmentation_at_peak = view.reserved_known().then(|| {
        let (allocated, reserved) = match view.peak_allocated_event() {
            Some(event) => view.usage_at(event),
            None => (view.baseline_allocated(), view.baseline_reserved()),
        };
        if reserved == 0 {
            0.0
        } else {
            reserved.saturating_sub(allocated) as f64 / reserved as f64
        }
    });
    RankRow {
        rank,
        file: file.to_string(),
        device,
        events: snapshot.events.len() as u64,
        peak_allocated: view.peak_allocated(),
        peak_reserved: view.reserved_known().then(|| view.peak_reserved()),
        fragmentation_at_peak,
        ooms: view.totals().ooms.max(snapshot.stats.num_ooms),
        top_site_at_peak,
        findings: built.counts(),
        at_peak,
    }
}

/// Compares the ranks of `snapshots` (`(file, snapshot)`, in any order).
pub fn compare(snapshots: &[(PathBuf, Snapshot)]) -> RankComparison {
    let entries: Vec<(&Path, Result<&Snapshot, String>)> = snapshots
        .iter()
        .map(|(path, snapshot)| (path.as_path(), Ok(snapshot)))
        .collect();
    compare_entries(&entries)
}

/// Compares the ranks of `results` (`(file, what loading it gave)`, in any order, as
/// [`load_all`] returns them beside its files): a file that could not be read is numbered
/// as the others are and listed in [`RankComparison::failed`] with its error; the others are
/// compared among themselves.
pub fn compare_results(results: &[(PathBuf, Result<Snapshot, ImportError>)]) -> RankComparison {
    let entries: Vec<(&Path, Result<&Snapshot, String>)> = results
        .iter()
        .map(|(path, result)| (path.as_path(), result.as_ref().map_err(|e| e.to_string())))
        .collect();
    compare_entries(&entries)
}

/// What one file gives the comparison: a row per device with data, or why it was skipped.
enum Entry<'a> {
    /// Each device's part: its index (`None` for a file of one device) and snapshot (the
    /// file's own, not a copy, for a file of one device).
    Devices(Vec<(Option<u32>, std::borrow::Cow<'a, Snapshot>)>),
    /// The file was skipped: the reason ([`FailedRank::skipped`]) and the sentence.
    Skipped(&'static str, String),
}

fn compare_entries(entries: &[(&Path, Result<&Snapshot, String>)]) -> RankComparison {
    // A file of several devices is its devices, a row each (not one rank whose peak sums
    // them); a file with nothing in it is skipped in the words every face says.
    let expanded: Vec<Entry> = entries
        .iter()
        .map(|(path, result)| match result {
            Err(error) => Entry::Skipped(SKIPPED_UNREADABLE, error.clone()),
            Ok(snapshot) => {
                let file = path.display().to_string();
                if let Some(message) = report::nothing_to_analyse(snapshot, &file) {
                    return Entry::Skipped(SKIPPED_EMPTY, message);
                }
                let devices = vramscope_engine::devices::devices_with_data(snapshot);
                if devices.len() > 1 {
                    Entry::Devices(
                        devices
                            .iter()
                            .map(|&d| {
                                let part = vramscope_engine::devices::only_device(snapshot, d);
                                (Some(d), std::borrow::Cow::Owned(part))
                            })
                            .collect(),
                    )
                } else {
                    Entry::Devices(vec![(None, std::borrow::Cow::Borrowed(*snapshot))])
                }
            }
        })
        .collect();
    let paths: Vec<&Path> = entries.iter().map(|(p, _)| *p).collect();
    let multi = entries
        .iter()
        .zip(&expanded)
        .find(|(_, e)| matches!(e, Entry::Devices(parts) if parts.len() > 1));
    // Ranks come from the file names unless a file holds several devices: then every row is
    // numbered by its place, the devices of a file in device order.
    let (numbers, numbering): (Vec<Vec<u32>>, String) = match multi {
        None => {
            let (numbers, numbering) = number_ranks(&paths);
            (numbers.into_iter().map(|n| vec![n]).collect(), numbering)
        }
        Some(((path, _), Entry::Devices(parts))) => {
            let mut next = 0u32;
            let numbers = expanded
                .iter()
                .map(|e| {
                    let n = match e {
                        Entry::Devices(parts) => parts.len().max(1),
                        Entry::Skipped(..) => 1,
                    } as u32;
                    let these = (next..next + n).collect();
                    next += n;
                    these
                })
                .collect();
            let listed = parts
                .iter()
                .filter_map(|(d, _)| d.map(|d| d.to_string()))
                .collect::<Vec<_>>()
                .join(", ");
            let why = format!(
                "by place in the list: {} holds devices {listed}, each a row of its own",
                path.display()
            );
            (numbers, why)
        }
        Some(_) => unreachable!("only a file of several devices is found"),
    };
    let mut ranks = Vec::new();
    let mut failed = Vec::new();
    for (((path, _), entry), numbers) in entries.iter().zip(expanded).zip(numbers) {
        let file = path.display().to_string();
        match entry {
            Entry::Devices(parts) => {
                for ((device, snapshot), rank) in parts.iter().zip(numbers) {
                    ranks.push(row(rank, &file, *device, snapshot));
                }
            }
            Entry::Skipped(skipped, error) => failed.push(FailedRank {
                rank: numbers[0],
                file,
                error,
                skipped,
            }),
        }
    }
    ranks.sort_by_key(|r| r.rank);
    failed.sort_by_key(|f| f.rank);
    let findings = imbalances(&ranks);
    RankComparison {
        format_version: RANKS_FORMAT_VERSION,
        numbering,
        ranks,
        findings,
        failed,
    }
}

/// The `rank_imbalance` findings of `ranks`, largest excess first.
fn imbalances(ranks: &[RankRow]) -> Vec<RankImbalance> {
    if ranks.len() < 2 {
        return Vec::new();
    }
    let mut by_peak: Vec<&RankRow> = ranks.iter().collect();
    by_peak.sort_by_key(|r| (r.peak_allocated, r.rank));
    // The lower median: with an even count, the smaller of the two middle ranks, so that one
    // heavy rank of two is still measured against the other.
    let median = by_peak[(by_peak.len() - 1) / 2];
    let limit = median.peak_allocated as f64 * (1.0 + IMBALANCE_THRESHOLD);
    let mut findings: Vec<RankImbalance> = ranks
        .iter()
        .filter(|r| r.peak_allocated as f64 > limit && r.rank != median.rank)
        .map(|r| {
            let mut sites: Vec<SiteExcess> = r
                .at_peak
                .iter()
                .map(|(site, &bytes)| SiteExcess {
                    site: site.clone(),
                    bytes,
                    median_bytes: median.at_peak.get(site).copied().unwrap_or(0),
                })
                .filter(|s| s.bytes > s.median_bytes)
                .collect();
            sites.sort_by(|a, b| {
                (b.bytes - b.median_bytes)
                    .cmp(&(a.bytes - a.median_bytes))
                    .then(a.site.cmp(&b.site))
            });
            sites.truncate(IMBALANCE_SITES);
            let excess = r.peak_allocated - median.peak_allocated;
            let share = excess as f64 / median.peak_allocated.max(1) as f64 * 100.0;
            let named = sites
                .first()
                .map(|s| {
                    format!(
                        "; most of it at {} ({} more than on rank {})",
                        s.site,
                        format_bytes(s.bytes - s.median_bytes),
                        median.rank
                    )
                })
                .unwrap_or_default();
            RankImbalance {
                kind: "rank_imbalance",
                rank: r.rank,
                peak: r.peak_allocated,
                median_rank: median.rank,
                median_peak: median.peak_allocated,
                summary: format!(
                    "rank {} peaks at {}, {} ({share:.0} %) above the median rank {} ({}){named}",
                    r.rank,
                    format_bytes(r.peak_allocated),
                    format_bytes(excess),
                    median.rank,
                    format_bytes(median.peak_allocated),
                ),
                fix: "give every rank the same share: check the sites above for an uneven \
                      shard (optimizer state, parameters) or an uneven batch or sequence length \
                      on this rank"
                    .to_string(),
                sites,
            }
        })
        .collect();
    findings.sort_by(|a, b| b.peak.cmp(&a.peak).then(a.rank.cmp(&b.rank)));
    findings
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
        let _ = std::fs::remove_dir_all(&dir);
    }
}
