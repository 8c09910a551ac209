//! Reports as data: the findings, top call sites and statistics of one snapshot (one device).
//!
//! [`build_report`] builds a `crate::model_view::ModelView` once, runs every detector of
//! `crate::detect` on it, and gathers what a reader needs next to the findings: the headline
//! statistics, the call sites holding the most memory at the end and at the peak, a
//! downsampled timeline of allocated and reserved bytes, and the HTML explorer's bands and
//! moments (`crate::explorer`). The [`Report`] is plain data: the render crate
//! (`vramscope_render`) prints it in every format and never analyses, and
//! [`Report::fails_on`] answers the CLI's `--fail-on`. The JSON schema is stable: see
//! [`REPORT_FORMAT_VERSION`].

use serde::Serialize;
use vramscope_model::{Category, CategoryBytes, Recorded, Snapshot, SnapshotSource};

use crate::detect::{self, DetectOptions, Finding, Severity};
use crate::model_view::{ModelView, TimelinePoint};
use vramscope_engine::GroupId;

/// Version of the JSON report schema. Keys are only ever added within a version.
///
/// One shape for a file of one device or of many (version 3). Top level: `format_version`,
/// `source`, `input`, `verdict` (the whole file's one-line verdict, as the text report opens
/// with it), `worst_device` (the index of the device with the most severe finding, or of the
/// first device when none has a problem) and `devices[]`, one entry per device with data in
/// device order (one entry for a single-device file). Each entry: `verdict` (that device's),
/// `device` {`name`, `index`, `backend`, `capacity_bytes`}, `steps`, `step_source`, `stats`
/// (see [`ReportStats`]), `findings[]` (each with `kind`, `severity`, `site` as
/// `"file:line"` or null, `function`, `bytes`, `count`, `per_step` {`bytes`, `count`} or
/// null, `first_step`, `last_step`, `summary`, `evidence` {key: number or string, in detector
/// order}, `fix`; a finding about kept memory also has `made_at` and `frames`, see
/// [`Finding`]), `top_sites[]` (see [`TopSite`]) and, when that table is cut, `other_sites`
/// (see [`OtherSites`]).
///
/// A figure the input's format does not record is `null`, never 0 (ARCHITECTURE.md, "The
/// figures, defined"). Version 2 made these keys null where version 1 wrote 0:
/// `device.capacity_bytes` (unknown capacity, as for every PyTorch snapshot),
/// `stats.transfers`, `stats.h2d_bytes`, `stats.d2h_bytes`, `stats.syncs` and
/// `stats.host_waits` (recorded by vramscope's own allocator only), and
/// `stats.device_allocs`, `stats.device_frees`, `stats.empty_cache_calls` and `stats.ooms`
/// (not recorded by a profiler trace), and added `stats.lost_frees`. Version 3 moved one
/// device's keys into `devices[]` (version 2 had them at the top level for one device and a
/// list of whole reports for several). Added within version 3: `memory_by_category` in each
/// device entry, what the memory is made of (see [`MemoryByCategory`]): `peak` and `end`,
/// each an object of bytes per category (`activations`, `parameters`, `optimizer_state`,
/// `gradients`, `temporaries`, `inputs`, `before_trace`, `unknown`, every one present) that
/// adds up to `stats.peak_allocated_bytes` and `stats.allocated_bytes`, and `series`, the
/// same on the positions of the report's downsampled timeline, by column: `event` (the
/// event after which each position is taken) and a list of bytes per category.
pub const REPORT_FORMAT_VERSION: u32 = 3;

/// The device a report describes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ReportDevice {
    /// Device name.
    pub name: String,
    /// Device index (the `N` of `cuda:N` and of `--device N`).
    pub index: u32,
    /// Backend kind (`sim`, `cuda`, `unknown`).
    pub backend: String,
    /// Total device memory in bytes (null when unknown).
    pub capacity_bytes: Option<u64>,
}

/// Headline statistics of a report.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ReportStats {
    /// Events in the trace.
    pub events: u64,
    /// Events the recorder lost.
    pub dropped_events: u64,
    /// Allocations.
    pub allocations: u64,
    /// Frees matched to an allocation in the trace.
    pub frees: u64,
    /// Frees of blocks allocated before the trace began.
    pub unmatched_frees: u64,
    /// Allocations at an address whose block the trace never freed: frees the trace lost
    /// (the recorder dropped them, or the file was edited). Each such block is taken as freed
    /// when its address is allocated again.
    pub lost_frees: u64,
    /// Host/device copies (null when the format does not record copies: only vramscope's own
    /// snapshots do).
    pub transfers: Option<u64>,
    /// Bytes copied host to device (null when copies are not recorded).
    pub h2d_bytes: Option<u64>,
    /// Bytes copied device to host (null when copies are not recorded).
    pub d2h_bytes: Option<u64>,
    /// Explicit syncs (null when the format does not record them).
    pub syncs: Option<u64>,
    /// Times the host waited for the device: explicit syncs plus device-to-host copies (each
    /// waits for its stream; `.item()` is one), what `sync_in_loop` counts (null when syncs
    /// and copies are not recorded).
    pub host_waits: Option<u64>,
    /// How long the host waited in all, in nanoseconds, where the recording measured its
    /// waits (a profiler trace's runtime calls); absent otherwise.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub host_wait_ns: Option<u64>,
    /// Raw device allocations (null when the format does not record them, as a profiler
    /// trace does not).
    pub device_allocs: Option<u64>,
    /// Raw device frees (null when not recorded).
    pub device_frees: Option<u64>,
    /// `empty_cache()` calls (null when neither the calls nor the segment frees they make are
    /// recorded).
    pub empty_cache_calls: Option<u64>,
    /// Failed allocations (null when the format does not record them).
    pub ooms: Option<u64>,
    /// Bytes allocated before the trace began (the engine's start state).
    pub baseline_allocated_bytes: u64,
    /// Blocks from before the trace, freed in it, whose size is an estimate (their requests
    /// rounded: the trace records requests, and neither the dump nor the segments around the
    /// blocks at the start leave one size), so that
    /// `baseline_allocated_bytes` may be low; 0 when every such block's size is known.
    pub baseline_estimated_blocks: u64,
    /// Highest allocated bytes (block sizes, as PyTorch's `allocated_bytes` counts them).
    pub peak_allocated_bytes: u64,
    /// Index of the event after which allocated bytes peaked (null: before the first event).
    pub peak_allocated_event: Option<u32>,
    /// Highest reserved bytes (null when the format does not record reserved memory).
    pub peak_reserved_bytes: Option<u64>,
    /// Allocated bytes at the end.
    pub allocated_bytes: u64,
    /// Reserved bytes at the end (null when not recorded).
    pub reserved_bytes: Option<u64>,
    /// Blocks live at the end that the trace or the dump-time state describes (bytes from
    /// before the trace known only as a total are in `allocated_bytes`, in no block).
    pub live_blocks: u64,
    /// Segments at the end (null without a dump-time state).
    pub segments: Option<u64>,
    /// Free bytes in segments that also hold live blocks (null without a dump-time state).
    pub inactive_split_bytes: Option<u64>,
    /// The largest free block in the segments (null without a dump-time state).
    pub largest_free_block: Option<u64>,
}

/// One call site's holdings, for the `top_sites` table.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct TopSite {
    /// `file:line`, or null when unknown.
    pub site: Option<String>,
    /// The site's name for a reader: `file:line`, `(unknown site)` or `(before the trace)`
    /// (memory allocated before the trace whose site nothing records).
    pub label: String,
    /// Function at the site.
    pub function: String,
    /// Bytes live at the end.
    pub live_bytes: u64,
    /// Blocks live at the end.
    pub live_blocks: u64,
    /// Bytes live at the peak of allocated bytes.
    pub peak_bytes: u64,
    /// Blocks live at the peak.
    pub peak_blocks: u64,
    /// Allocations made by the site in the trace.
    pub allocations: u64,
    /// Bytes allocated by the site in the trace.
    pub allocated_bytes: u64,
}

/// The sites a cut `top_sites` table leaves out, summed: the table's last row, so that each
/// column of the table sums to its figure (allocated at the end, allocated at the peak).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct OtherSites {
    /// How many sites the table leaves out.
    pub sites: u64,
    /// Bytes they hold at the end.
    pub live_bytes: u64,
    /// Blocks they hold at the end.
    pub live_blocks: u64,
    /// Bytes they hold at the peak of allocated bytes.
    pub peak_bytes: u64,
    /// Blocks they hold at the peak.
    pub peak_blocks: u64,
    /// Allocations they made in the trace.
    pub allocations: u64,
    /// Bytes they allocated in the trace.
    pub allocated_bytes: u64,
}

impl OtherSites {
    /// The label of the row: `3 other sites`.
    pub fn label(&self) -> String {
        if self.sites == 1 {
            "1 other site".to_string()
        } else {
            format!("{} other sites", self.sites)
        }
    }
}

/// What the memory is made of (issue 46): bytes per [`vramscope_model::Category`] at the peak
/// of allocated bytes and at the end, from the engine's own states there (so each adds up to
/// `stats.peak_allocated_bytes` and `stats.allocated_bytes`), and a series on the timeline's
/// positions.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct MemoryByCategory {
    /// Bytes per category at the peak of allocated bytes.
    pub peak: CategoryBytes,
    /// Bytes per category at the end.
    pub end: CategoryBytes,
    /// The same over time, on the downsampled timeline's positions.
    pub series: CategorySeries,
}

/// Bytes per category on the positions of a report's downsampled timeline, by column: the
/// event after which each position is taken, then one list of bytes per category, every
/// category named (`activations`, ..., `unknown`) whether or not it holds bytes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CategorySeries {
    /// The event index of each position (`Snapshot::events`).
    pub events: Vec<u32>,
    /// Bytes per category at each position, in the order of `events`.
    pub bytes: Vec<CategoryBytes>,
}

impl Serialize for CategorySeries {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        struct Column<'a>(&'a [CategoryBytes], Category);
        impl Serialize for Column<'_> {
            fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                serializer.collect_seq(self.0.iter().map(|b| b[self.1]))
            }
        }
        let mut map = serializer.serialize_map(Some(1 + Category::COUNT))?;
        map.serialize_entry("event", &self.events)?;
        for category in Category::ALL {
            map.serialize_entry(category.as_str(), &Column(&self.bytes, category))?;
        }
        map.end()
    }
}

/// A step boundary on the timeline.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StepTick {
    /// Index of the first event of the step.
    pub event: u32,
    /// Step number.
    pub step: u64,
    /// Label of the mark.
    pub label: String,
}

/// A downsampled timeline for drawing (not part of the JSON output).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Timeline {
    /// Events in the trace (the x range).
    pub events: u64,
    /// Points in event order; per bucket, the lowest and highest allocated and the highest
    /// reserved point survive.
    pub points: Vec<TimelinePoint>,
    /// Allocated and reserved bytes before the first event.
    pub start: (u64, u64),
    /// Step boundaries (loop steps only).
    pub steps: Vec<StepTick>,
    /// Event indices of OOMs.
    pub ooms: Vec<u32>,
    /// Whether reserved bytes are known.
    pub reserved_known: bool,
    /// Device capacity, when known.
    pub capacity: Option<u64>,
    /// Bytes per category after the event of each of `points`, one for each point in the
    /// same order (`crate::categories`): each adds up to its point's allocated bytes.
    pub categories: Vec<CategoryBytes>,
    /// Bytes per category before the first event (they add up to `start.0`).
    pub start_categories: CategoryBytes,
    /// The HTML explorer's bands and moments, from the engine (`crate::explorer`).
    pub explorer: Option<std::sync::Arc<crate::explorer::ExplorerData>>,
}

/// A report on one snapshot.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Report {
    /// [`REPORT_FORMAT_VERSION`] (in JSON, at the file's level: `vramscope_render::render_file_json`).
    #[serde(skip)]
    pub format_version: u32,
    /// Where the data came from (`vramscope`, `pytorch`, `chrome-trace`; in JSON, at the
    /// file's level).
    #[serde(skip)]
    pub source: String,
    /// The input file, when the caller named it (in JSON, at the file's level).
    #[serde(skip)]
    pub input: Option<String>,
    /// The device.
    pub device: ReportDevice,
    /// Number of loop steps (steps numbered 1 or more).
    pub steps: u64,
    /// Where the steps came from (the trace's marks, the repeating call-site sequence, or
    /// none), as a phrase.
    pub step_source: String,
    /// What the input cannot tell, as sentences (a profiler trace of the 2021 format records
    /// no addresses); absent in JSON when there is nothing to say.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub caveats: Vec<String>,
    /// Headline statistics.
    pub stats: ReportStats,
    /// Findings, most severe first.
    pub findings: Vec<Finding>,
    /// Call sites holding the most memory at the end or at the peak, largest first by the
    /// larger of the two.
    pub top_sites: Vec<TopSite>,
    /// The sites `top_sites` leaves out, summed; `None` when it lists them all.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub other_sites: Option<OtherSites>,
    /// What the memory is made of at the peak and at the end, and over time
    /// (`crate::categories`).
    pub memory_by_category: MemoryByCategory,
    /// The timeline for HTML.
    #[serde(skip)]
    pub timeline: Timeline,
    /// PyTorch's `memory_summary()` table of the snapshot's statistics, when it has any.
    #[serde(skip)]
    pub memory_summary: Option<String>,
}

impl Report {
    /// Whether any finding is at least as severe as `level` (the CLI's `--fail-on`).
    pub fn fails_on(&self, level: Severity) -> bool {
        detect::reaches(&self.findings, level)
    }

    /// Number of findings of each severity: `(errors, warnings, infos)`.
    pub fn counts(&self) -> (usize, usize, usize) {
        let n = |s| self.findings.iter().filter(|f| f.severity == s).count();
        (n(Severity::Error), n(Severity::Warning), n(Severity::Info))
    }

    /// The number of findings of each severity in words: `1 error, 2 warnings, 3 info`.
    pub fn counts_phrase(&self) -> String {
        let (errors, warnings, infos) = self.counts();
        severity_counts(errors, warnings, infos)
    }
}

/// Counts of findings by severity in words, with correct plurals: `1 error, 2 warnings,
/// 1 info` ("info" is the same for one or many).
pub fn severity_counts(errors: usize, warnings: usize, infos: usize) -> String {
    format!(
        "{}, {}, {infos} info",
        vramscope_model::plural(errors as u64, "error"),
        vramscope_model::plural(warnings as u64, "warning"),
    )
}

/// What to put in a report.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct ReportOptions {
    /// Detector thresholds.
    pub detect: DetectOptions,
    /// Rows of the `top_sites` table (10).
    pub top_sites: usize,
    /// The input file name to record in the report.
    pub input: Option<String>,
    /// Buckets of the downsampled timeline (600).
    pub timeline_buckets: usize,
    /// Build the HTML explorer's bands and moments (true): needed only for the HTML page, and
    /// a fifth of the work on a large trace, so the CLI asks for them only there.
    pub explorer: bool,
}

impl Default for ReportOptions {
    fn default() -> ReportOptions {
        ReportOptions {
            detect: DetectOptions::default(),
            top_sites: 10,
            input: None,
            timeline_buckets: 600,
            explorer: true,
        }
    }
}

/// Why `snapshot`, read from `file`, has nothing to analyse (no events and no segments), with
/// the call that records one, or `None` when it has data. Every face says these words for an
/// empty dump (the CLI's `report`, `summary`, `view` and `replay`, `vramscope.load()`,
/// `ranks`): a report on nothing would say "no problems found" and be believed.
pub fn nothing_to_analyse(snapshot: &Snapshot, file: &str) -> Option<String> {
    if !snapshot.events.is_empty() || !snapshot.segments.is_empty() {
        return None;
    }
    let hint = match snapshot.source {
        SnapshotSource::ChromeTrace => {
            "the profiler trace has no CUDA memory events and no CUDA runtime calls or copies: \
             record it with torch.profiler.profile(activities=[ProfilerActivity.CPU, \
             ProfilerActivity.CUDA], with_stack=True, profile_memory=True) (CUDA activity for \
             the waits, profile_memory=True for the memory, with_stack=True for the lines)"
        }
        SnapshotSource::Pytorch => {
            "the snapshot has no trace entries and no segments: call \
             torch.cuda.memory._record_memory_history() before the code to look at, then \
             torch.cuda.memory._dump_snapshot(path)"
        }
        SnapshotSource::Vramscope => {
            "the snapshot holds no events and no segments: record events (record_events:True) \
             and take the snapshot after the work"
        }
    };
    Some(format!("{file}: nothing to analyse: {hint}"))
}

/// The reports of a file's page (`vramscope report --format html`, `convert --to html`): one
/// per device with data for a snapshot of several devices, so that the page offers a device
/// picker, else one for the whole snapshot.
pub fn build_device_reports(snapshot: &Snapshot, options: &ReportOptions) -> Vec<Report> {
    use vramscope_engine::devices;
    let with_data = devices::devices_with_data(snapshot);
    if with_data.len() > 1 {
        with_data
            .iter()
            .map(|&d| build_report(&devices::only_device(snapshot, d), options))
            .collect()
    } else {
        vec![build_report(snapshot, options)]
    }
}

/// Builds the report of `snapshot`: runs every detector and gathers statistics and top sites.
pub fn build_report(snapshot: &Snapshot, options: &ReportOptions) -> Report {
    let view = ModelView::new(snapshot);
    build_report_view(&view, options)
}

/// Builds a report from a view built earlier.
pub fn build_report_view(view: &ModelView<'_>, options: &ReportOptions) -> Report {
    let snapshot = view.snapshot();
    // How many blocks from before the trace have estimated sizes takes a pass of its own over
    // the events, from the view's start state (its walk's, not walked again): a second thread
    // counts them while this one builds the rest (here, when no thread can be started).
    let count =
        || vramscope_replay::estimated_before_trace_blocks_from(snapshot, view.start_state());
    std::thread::scope(|scope| {
        let counting = std::thread::Builder::new()
            .name("vramscope-estimated".to_string())
            .spawn_scoped(scope, count);
        let mut report = build_report_parts(view, options);
        report.stats.baseline_estimated_blocks = match counting {
            Ok(handle) => handle
                .join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic)),
            Err(_) => count(),
        };
        report
    })
}

/// [`build_report_view`] but for `stats.baseline_estimated_blocks`, which it leaves 0.
fn build_report_parts(view: &ModelView<'_>, options: &ReportOptions) -> Report {
    let snapshot = view.snapshot();
    let mut findings = Vec::new();
    detect::run_all_view(view, &options.detect, &mut findings);
    let totals = view.totals();
    let segments = view.segments();
    let dump_time_state = !snapshot.segments.is_empty();
    let activity = RecordedActivity::for_snapshot(snapshot);
    let copies = |v: u64| activity.copies_and_syncs.then_some(v);
    let device = |v: u64| activity.device_calls.then_some(v);
    let stats = ReportStats {
        events: totals.events,
        dropped_events: snapshot.dropped_events,
        allocations: totals.allocs,
        frees: totals.frees,
        unmatched_frees: totals.unmatched_frees,
        lost_frees: totals.lost_frees,
        transfers: copies(totals.transfers),
        h2d_bytes: copies(totals.h2d_bytes),
        d2h_bytes: copies(totals.d2h_bytes),
        syncs: copies(totals.syncs),
        // A profiler trace records each wait as a sync; elsewhere each copy to the host is
        // one too (`detect::sync::wait_of`).
        host_waits: copies(if snapshot.source == SnapshotSource::ChromeTrace {
            totals.syncs
        } else {
            totals
                .syncs
                .saturating_add(detect::sat_sum(view.step_totals().iter().map(|t| t.d2h)))
        }),
        host_wait_ns: {
            let mut measured = snapshot
                .events
                .iter()
                .filter_map(|e| e.waited_ns())
                .peekable();
            measured.peek().is_some().then(|| detect::sat_sum(measured))
        },
        device_allocs: device(totals.segment_allocs),
        device_frees: device(totals.segment_frees),
        empty_cache_calls: device(view.empty_cache_calls().len() as u64),
        ooms: device(totals.ooms.max(snapshot.stats.num_ooms)),
        baseline_allocated_bytes: view.baseline_allocated(),
        baseline_estimated_blocks: 0,
        peak_allocated_bytes: view.peak_allocated(),
        peak_allocated_event: view.peak_allocated_event(),
        peak_reserved_bytes: view.reserved_known().then(|| view.peak_reserved()),
        allocated_bytes: view.end_allocated(),
        reserved_bytes: view.reserved_known().then(|| view.end_reserved()),
        live_blocks: detect::sat_sum(view.live_at_end().iter().map(|h| h.blocks)),
        segments: dump_time_state.then_some(segments.segments),
        inactive_split_bytes: dump_time_state.then_some(segments.inactive_split_bytes),
        largest_free_block: dump_time_state.then_some(segments.largest_free_block),
    };
    let has_data = !snapshot.events.is_empty() || !snapshot.segments.is_empty();
    let memory_summary =
        (has_data || snapshot.stats != Default::default()).then(|| summary_table(view));
    let (top_sites, other_sites) = top_sites_and_rest(view, options.top_sites);
    let timeline = timeline(view, options);
    let memory_by_category = MemoryByCategory {
        peak: *view.categories_at_peak(),
        end: *view.categories_at_end(),
        series: CategorySeries {
            events: timeline.points.iter().map(|p| p.event).collect(),
            bytes: timeline.categories.clone(),
        },
    };
    Report {
        format_version: REPORT_FORMAT_VERSION,
        source: snapshot.source.to_string(),
        input: options.input.clone(),
        device: ReportDevice {
            name: snapshot.device.name.clone(),
            index: snapshot.device.index,
            backend: snapshot.device.backend.clone(),
            capacity_bytes: (snapshot.device.capacity > 0).then_some(snapshot.device.capacity),
        },
        steps: view.loop_steps().len() as u64,
        step_source: view.step_source().describe(),
        caveats: caveats(snapshot),
        stats,
        findings,
        top_sites,
        other_sites,
        memory_by_category,
        timeline,
        memory_summary,
    }
}

/// What `snapshot`'s format leaves unknown, for [`Report::caveats`].
fn caveats(snapshot: &Snapshot) -> Vec<String> {
    let mut caveats = Vec::new();
    let unaddressed = snapshot.source == SnapshotSource::ChromeTrace
        && snapshot.events.iter().any(|e| {
            e.kind == vramscope_model::EventKind::Alloc
                && e.addr >= vramscope_import::chrome::SYNTHETIC_ADDRESS_BASE
        });
    if unaddressed {
        caveats.push(
            "the trace's memory events carry no addresses (the 2021 profiler format): the \
             allocated curve is exact, from the deltas, but which allocation each free released \
             is matched by size, so what each line holds at a moment is an estimate"
                .to_string(),
        );
    }
    caveats
}

/// Which kinds of activity a format records, so that a figure it cannot know is `null` in
/// JSON and `n/a` in text instead of a 0 that reads like a measurement.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct RecordedActivity {
    /// Host/device copies and explicit syncs: vramscope's own allocator records them; a
    /// PyTorch snapshot and a profiler trace's memory events do not.
    copies_and_syncs: bool,
    /// Raw device allocations and frees, `empty_cache()` calls (or the bursts of segment frees
    /// they make) and failed allocations: vramscope's and PyTorch's traces record them; a
    /// profiler trace records only allocations, frees and the totals.
    device_calls: bool,
}

impl RecordedActivity {
    /// What `snapshot` records: by its format, and for a profiler trace by whether it holds
    /// the device's activity (runtime calls and copies, which a trace of memory alone lacks).
    fn for_snapshot(snapshot: &Snapshot) -> RecordedActivity {
        match snapshot.source {
            SnapshotSource::Vramscope => RecordedActivity {
                copies_and_syncs: true,
                device_calls: true,
            },
            SnapshotSource::Pytorch => RecordedActivity {
                copies_and_syncs: false,
                device_calls: true,
            },
            SnapshotSource::ChromeTrace => RecordedActivity {
                copies_and_syncs: snapshot.events.iter().any(|e| {
                    matches!(
                        e.kind,
                        vramscope_model::EventKind::Sync | vramscope_model::EventKind::Transfer(_)
                    )
                }),
                device_calls: false,
            },
        }
    }
}

/// PyTorch's `memory_summary()` table of the snapshot's statistics, with the all-pools
/// allocated and reserved figures the engine gives every view, and `n/a` for what the format
/// (or a snapshot without statistics) does not record.
fn summary_table(view: &ModelView<'_>) -> String {
    let snapshot = view.snapshot();
    let known_stats = snapshot.stats != Default::default();
    let mut stats = snapshot.stats;
    stats.allocated_bytes.all.current = view.end_allocated();
    stats.allocated_bytes.all.peak = view.peak_allocated();
    if view.reserved_known() {
        stats.reserved_bytes.all.current = view.end_reserved();
        stats.reserved_bytes.all.peak = view.peak_reserved();
    }
    let engine_only = || {
        Recorded::only(if view.reserved_known() {
            vec!["Allocated memory", "GPU reserved memory"]
        } else {
            vec!["Allocated memory"]
        })
    };
    let recorded = match snapshot.source {
        // Without statistics (another device's part of a vramscope snapshot), the engine's two
        // totals are all there is.
        _ if !known_stats => engine_only(),
        SnapshotSource::Vramscope => Recorded::all(),
        // A PyTorch snapshot records neither retries nor syncs, and its non-releasable memory
        // only at dump time (its segments' free blocks), with no history.
        SnapshotSource::Pytorch => Recorded::all()
            .with_metrics(
                RECORDED_BY_PYTORCH_SNAPSHOTS
                    .iter()
                    .copied()
                    .filter(|m| view.reserved_known() || *m != "GPU reserved memory")
                    .collect(),
            )
            .with_current_only(vec!["Non-releasable memory", "Non-releasable allocs"]),
        // A profiler trace records the two totals with each event, and nothing else.
        SnapshotSource::ChromeTrace => engine_only(),
    };
    stats.summary_recorded(&recorded)
}

/// The rows of the summary table a PyTorch snapshot lets vramscope compute. Not `Alloc
/// retries` or `Sync all streams`: its trace has no entry for either.
const RECORDED_BY_PYTORCH_SNAPSHOTS: [&str; 12] = [
    "Allocated memory",
    "Active memory",
    "Requested memory",
    "GPU reserved memory",
    "Non-releasable memory",
    "Allocations",
    "Active allocs",
    "GPU reserved segments",
    "Non-releasable allocs",
    "Device allocs",
    "Device frees",
    "OOMs",
];

/// The call sites holding the most at the end or at the peak, at most `limit` of them (see
/// [`top_sites_and_rest`]).
pub fn top_sites(view: &ModelView<'_>, limit: usize) -> Vec<TopSite> {
    top_sites_and_rest(view, limit).0
}

/// The call sites holding the most at the end or at the peak, at most `limit` of them, ordered
/// by the larger of their two holdings (so that a site large at the peak and gone at the end is
/// listed before a small one still live), and the sites left out, summed.
pub fn top_sites_and_rest(
    view: &ModelView<'_>,
    limit: usize,
) -> (Vec<TopSite>, Option<OtherSites>) {
    let n = view.groups().len();
    let mut rows: Vec<Option<TopSite>> = vec![None; n];
    let row = |rows: &mut Vec<Option<TopSite>>, g: GroupId| -> usize {
        let i = g as usize;
        if rows[i].is_none() {
            let group = view.group(g);
            let (mut allocations, mut allocated_bytes) = (0, 0);
            for (_, t) in view.group_steps(g) {
                allocations += t.allocs;
                allocated_bytes = t.alloc_bytes.saturating_add(allocated_bytes);
            }
            rows[i] = Some(TopSite {
                site: group.file_line.clone(),
                label: group.label().to_string(),
                function: group.function.clone(),
                live_bytes: 0,
                live_blocks: 0,
                peak_bytes: 0,
                peak_blocks: 0,
                allocations,
                allocated_bytes,
            });
        }
        i
    };
    for h in view.live_at_end() {
        let i = row(&mut rows, h.group);
        if let Some(r) = rows[i].as_mut() {
            r.live_bytes = h.bytes;
            r.live_blocks = h.blocks;
        }
    }
    for h in view.live_at_peak() {
        let i = row(&mut rows, h.group);
        if let Some(r) = rows[i].as_mut() {
            r.peak_bytes = h.bytes;
            r.peak_blocks = h.blocks;
        }
    }
    let mut list: Vec<TopSite> = rows
        .into_iter()
        .flatten()
        .filter(|r| r.live_bytes > 0 || r.peak_bytes > 0)
        .collect();
    list.sort_by(|a, b| {
        let larger = |t: &TopSite| t.live_bytes.max(t.peak_bytes);
        larger(b)
            .cmp(&larger(a))
            .then(b.live_bytes.cmp(&a.live_bytes))
            .then(b.peak_bytes.cmp(&a.peak_bytes))
            .then(a.label.cmp(&b.label))
    });
    let rest = list.split_off(limit.min(list.len()));
    let other = (!rest.is_empty()).then(|| {
        let mut o = OtherSites {
            sites: rest.len() as u64,
            ..OtherSites::default()
        };
        for t in &rest {
            o.live_bytes = o.live_bytes.saturating_add(t.live_bytes);
            o.live_blocks += t.live_blocks;
            o.peak_bytes = o.peak_bytes.saturating_add(t.peak_bytes);
            o.peak_blocks += t.peak_blocks;
            o.allocations += t.allocations;
            o.allocated_bytes = o.allocated_bytes.saturating_add(t.allocated_bytes);
        }
        o
    });
    (list, other)
}

fn timeline(view: &ModelView<'_>, options: &ReportOptions) -> Timeline {
    let events = view.snapshot().events.len() as u64;
    let loop_steps = view.loop_steps();
    let steps = view.steps()[loop_steps.start as usize..loop_steps.end as usize]
        .iter()
        .filter_map(|s| {
            s.first_event.map(|event| StepTick {
                event,
                step: s.step,
                label: s.label.clone(),
            })
        })
        .collect();
    let points = downsample(view.timeline(), events, options.timeline_buckets.max(1));
    let at: Vec<u32> = points.iter().map(|p| p.event).collect();
    Timeline {
        events,
        categories: view.categories_after(&at),
        start_categories: view.categories_at_start(),
        points,
        start: (
            view.baseline_allocated(),
            if view.reserved_known() {
                view.baseline_reserved()
            } else {
                0
            },
        ),
        steps,
        ooms: view.ooms().to_vec(),
        reserved_known: view.reserved_known(),
        capacity: view.capacity(options.detect.capacity),
        explorer: options.explorer.then(|| {
            std::sync::Arc::new(crate::explorer::ExplorerData::build(
                view,
                view.capacity(options.detect.capacity),
            ))
        }),
    }
}

/// Keeps, per bucket of events, the points with the lowest and highest allocated bytes, the
/// point with the highest reserved bytes and the last point, in event order. The points are
/// read once, holding at most `4 * buckets + 1` of them (to return them all when there are
/// no more than `4 * buckets`) and then one bucket's at a time (a 10M-event trace has
/// millions).
fn downsample(
    points: impl IntoIterator<Item = TimelinePoint>,
    events: u64,
    buckets: usize,
) -> Vec<TimelinePoint> {
    let limit = buckets * 4;
    let mut points = points.into_iter();
    let first: Vec<TimelinePoint> = points.by_ref().take(limit + 1).collect();
    if first.len() <= limit {
        return first;
    }
    let mut out = Vec::with_capacity(limit);
    let bucket_of =
        |p: &TimelinePoint| (u64::from(p.event) * buckets as u64 / events.max(1)) as usize;
    let mut chunk: Vec<TimelinePoint> = Vec::new();
    for point in first.into_iter().chain(points) {
        if chunk
            .last()
            .is_some_and(|last| bucket_of(last) != bucket_of(&point))
        {
            keep_extremes(&chunk, &mut out);
            chunk.clear();
        }
        chunk.push(point);
    }
    keep_extremes(&chunk, &mut out);
    out
}

/// Appends to `out` the points of one bucket that [`downsample`] keeps, in event order.
fn keep_extremes(chunk: &[TimelinePoint], out: &mut Vec<TimelinePoint>) {
    let Some(last_index) = chunk.len().checked_sub(1) else {
        return;
    };
    let mut keep = [
        argmin(chunk, |p| p.allocated),
        argmax(chunk, |p| p.allocated),
        argmax(chunk, |p| p.reserved),
        last_index,
    ];
    keep.sort_unstable();
    let mut last = usize::MAX;
    for k in keep {
        if k != last {
            out.push(chunk[k]);
            last = k;
        }
    }
}

fn argmin(chunk: &[TimelinePoint], key: impl Fn(&TimelinePoint) -> u64) -> usize {
    let mut best = 0;
    for (i, p) in chunk.iter().enumerate() {
        if key(p) < key(&chunk[best]) {
            best = i;
        }
    }
    best
}

fn argmax(chunk: &[TimelinePoint], key: impl Fn(&TimelinePoint) -> u64) -> usize {
    let mut best = 0;
    for (i, p) in chunk.iter().enumerate() {
        if key(p) > key(&chunk[best]) {
            best = i;
        }
    }
    best
}

/// Whether a finding of any of `reports` is at least as severe as `level`: the exit status
/// of `--fail-on` counts every device.
pub fn file_fails_on(reports: &[Report], level: Severity) -> bool {
    reports.iter().any(|r| r.fails_on(level))
}

/// The order in which a reader should see the devices of a file: the device with the most
/// severe finding first (then the one with more errors and warnings), ties in device order.
/// Infos do not count: a device whose findings are all infos has no problem.
pub fn worst_first(reports: &[Report]) -> Vec<usize> {
    let key = |r: &Report| {
        let worst = r
            .findings
            .iter()
            .map(|f| f.severity)
            .filter(|s| *s >= Severity::Warning)
            .max();
        let (errors, warnings, _) = r.counts();
        (worst, errors, warnings)
    };
    let mut order: Vec<usize> = (0..reports.len()).collect();
    order.sort_by(|&a, &b| key(&reports[b]).cmp(&key(&reports[a])).then(a.cmp(&b)));
    order
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_page_has_a_report_per_device_with_data() {
        let three = vramscope_testkit::three_devices_oom_on_1();
        let options = ReportOptions::default();
        let reports = build_device_reports(&three, &options);
        let indices: Vec<u32> = reports.iter().map(|r| r.device.index).collect();
        assert_eq!(indices, [0, 1, 2]);
        let one = vramscope_testkit::device_run(2, 64 << 20);
        let reports = build_device_reports(&one, &options);
        assert_eq!(reports.len(), 1);
        assert_eq!(reports[0].device.index, 2);
    }

    fn point(event: u32, allocated: u64) -> TimelinePoint {
        TimelinePoint {
            event,
            allocated,
            reserved: allocated * 2,
        }
    }

    #[test]
    fn downsampling_keeps_peaks_and_order() {
        let points: Vec<TimelinePoint> = (0..10_000u32)
            .map(|i| {
                point(
                    i,
                    if i == 4321 {
                        1 << 40
                    } else {
                        u64::from(i % 97)
                    },
                )
            })
            .collect();
        let kept = downsample(points.iter().copied(), 10_000, 100);
        assert!(kept.len() <= 400);
        assert!(kept.iter().any(|p| p.allocated == 1 << 40));
        assert!(kept.windows(2).all(|w| w[0].event < w[1].event));
        assert_eq!(kept.last(), points.last());
        let few = downsample(points[..50].iter().copied(), 50, 100);
        assert_eq!(few.len(), 50);
    }
}
