//! One truth: every view of a trace gives the same figures.
//!
//! For each shared trace, for planted cases built here (a run recorded from its start, the
//! same run recorded late, and the same run without its dump-time state, as a profiler trace
//! gives it) and for generated traces of any shape, consistent or not, the report's JSON,
//! `summary`, `diff` of the trace against itself, the dashboard's timeline and call-site panel
//! at the same cursor, the replay's "trace" column and the HTML report must agree on:
//! allocated and reserved bytes at the end, peak allocated bytes and its event, the bytes each
//! site holds at the end and at the peak, and the event and step counts. The "at peak" column
//! sums to the peak.

use std::collections::BTreeMap;

use serde_json::Value;
use vramscope::analysis::model_view::ModelView;
use vramscope::analysis::{diff, report};
use vramscope::import;
use vramscope::model::{format_bytes, Snapshot};
use vramscope::render::{self, html};
use vramscope::replay;
use vramscope::tui::data::{Dataset, Origin};
use vramscope::tui::App;
use vramscope_testkit::shared_trace;

/// Bytes per site label.
type BySite = BTreeMap<String, u64>;

fn holdings(view: &ModelView<'_>, at_peak: bool) -> BySite {
    let list = if at_peak {
        view.live_at_peak()
    } else {
        view.live_at_end()
    };
    let mut out = BySite::new();
    for h in list {
        *out.entry(view.group(h.group).label().to_string())
            .or_default() += h.bytes;
    }
    out
}

/// What the dashboard's call-site panel shows per site with the time cursor after `pos`
/// events (sites holding nothing left out, as the report's columns leave them out).
/// Its tree of stacks holds the same bytes in all (its outermost frames).
fn dashboard_sites(app: &mut App, pos: usize) -> BySite {
    app.cursor = Some(pos);
    app.sites.tree = false;
    app.prepare();
    let groups = app.data.groups().clone();
    let mut out = BySite::new();
    for row in app.view().sites.iter().filter(|r| r.bytes > 0) {
        *out.entry(groups.get(row.group).label().to_string())
            .or_default() += row.bytes;
    }
    app.sites.tree = true;
    app.prepare();
    let in_tree: u64 = app
        .view()
        .tree
        .iter()
        .filter(|r| r.depth == 0)
        .map(|r| r.bytes)
        .sum();
    assert_eq!(
        in_tree,
        out.values().sum::<u64>(),
        "the tree's total at {pos}"
    );
    out
}

/// Checks that every view agrees on `snapshot`, a trace that does not contradict itself, so
/// that walking forwards from the start reaches the dump-time state.
fn check(name: &str, snapshot: &Snapshot) {
    check_views(name, snapshot, true);
}

/// Checks that every view agrees on `snapshot`; `consistent` when it does not contradict
/// itself.
fn check_views(name: &str, snapshot: &Snapshot, consistent: bool) {
    let view = ModelView::new(snapshot);
    let built = report::build_report_view(&view, &report::ReportOptions::default());
    let file: Value = serde_json::from_str(&render::render_json(&built)).expect("report JSON");
    let json = &file["devices"][0];
    let stats = &json["stats"];
    let events = snapshot.events.len() as u64;
    let peak = view.peak_allocated();
    let peak_event = view.peak_allocated_event();
    let end_allocated = view.end_allocated();
    let end_reserved = view.reserved_known().then(|| view.end_reserved());

    // The engine's walk forwards from the start reaches the dump-time end state.
    let walk = vramscope::engine::Reconstruction::from_snapshot(snapshot);
    if consistent {
        // These traces are consistent: walking forwards from any of the walk's states keeps to
        // them, so the dashboard steps forwards over them (`Dataset::state_at`).
        assert!(
            walk.disagreements.is_empty(),
            "{name}: {:?}",
            walk.disagreements
        );
        let mut forwards = walk.start.clone();
        for (i, e) in snapshot.events.iter().enumerate() {
            forwards.apply(e, i as u32);
        }
        assert_eq!(
            forwards.usage(),
            walk.end.usage(),
            "{name}: forwards to the end"
        );
        assert_eq!(
            forwards.blocks.len(),
            walk.end.blocks.len(),
            "{name}: blocks at the end"
        );
    }
    // The view's walk, which lets go of its links as it goes, is the same walk.
    let lean = vramscope::engine::Reconstruction::without_links(snapshot);
    assert!(lean.links.is_empty(), "{name}: no links kept");
    assert_eq!(lean.start, walk.start, "{name}: the lean walk's start");
    assert_eq!(lean.end, walk.end, "{name}: the lean walk's end");
    assert_eq!(lean.usage, walk.usage, "{name}: the lean walk's usage");
    assert_eq!(
        (lean.peak_allocated, lean.peak_reserved),
        (walk.peak_allocated, walk.peak_reserved),
        "{name}: the lean walk's peaks"
    );
    // The start-only walk (the replay's block sizing) starts where the full walk does.
    let start = vramscope::engine::Reconstruction::start_of(snapshot);
    assert_eq!(start.usage(), walk.start.usage(), "{name}: start usage");
    assert_eq!(
        start
            .blocks
            .by_address()
            .map(|(a, _)| *a)
            .collect::<Vec<_>>(),
        walk.start
            .blocks
            .by_address()
            .map(|(a, _)| *a)
            .collect::<Vec<_>>(),
        "{name}: start blocks"
    );

    // The report's JSON.
    assert_eq!(stats["events"], events, "{name}: events");
    assert_eq!(stats["peak_allocated_bytes"], peak, "{name}: peak");
    assert_eq!(
        stats["peak_allocated_event"].as_u64(),
        peak_event.map(u64::from),
        "{name}: peak event"
    );
    assert_eq!(
        stats["allocated_bytes"], end_allocated,
        "{name}: end allocated"
    );
    assert_eq!(
        stats["reserved_bytes"].as_u64(),
        end_reserved,
        "{name}: end reserved"
    );
    assert_eq!(
        json["steps"],
        view.loop_steps().len() as u64,
        "{name}: steps"
    );

    // The "at peak" and "at end" columns sum to the figures.
    let at_peak = holdings(&view, true);
    let at_end = holdings(&view, false);
    assert_eq!(
        at_peak.values().sum::<u64>(),
        peak,
        "{name}: at-peak column"
    );
    assert_eq!(
        at_end.values().sum::<u64>(),
        end_allocated,
        "{name}: at-end column"
    );
    for site in json["top_sites"].as_array().expect("top sites") {
        let label = site["label"].as_str().expect("label");
        assert_eq!(
            site["live_bytes"],
            at_end.get(label).copied().unwrap_or(0),
            "{name}: {label} at the end"
        );
        assert_eq!(
            site["peak_bytes"],
            at_peak.get(label).copied().unwrap_or(0),
            "{name}: {label} at the peak"
        );
    }

    // `summary`: the allocated row of the table is the same figures.
    let summary = render::render_summary(&built);
    let row = summary
        .lines()
        .find(|l| l.starts_with("| Allocated memory"))
        .unwrap_or_else(|| panic!("{name}: no allocated row in\n{summary}"));
    let cells: Vec<&str> = row.split('|').map(str::trim).collect();
    assert_eq!(
        cells[2],
        format_bytes(end_allocated),
        "{name}: summary current"
    );
    assert_eq!(cells[3], format_bytes(peak), "{name}: summary peak");

    // `diff A A`: nothing moved, and both sides hold the end figure.
    let same = diff::diff_views(&view, &view);
    assert!(
        same.grew.is_empty() && same.shrank.is_empty(),
        "{name}: diff"
    );
    assert_eq!(same.before_bytes, end_allocated, "{name}: diff total");

    // The dashboard at the end and at the peak.
    let data = Dataset::new(snapshot.clone(), Origin::File(name.to_string()));
    assert_eq!(data.len() as u64, events, "{name}: dashboard events");
    assert_eq!(
        data.lost_frees(),
        stats["lost_frees"],
        "{name}: lost frees, dashboard and report"
    );
    let end = data.usage_at(data.len());
    assert_eq!(end.allocated, end_allocated, "{name}: dashboard end");
    if let Some(reserved) = end_reserved {
        assert_eq!(end.reserved, reserved, "{name}: dashboard reserved");
    }
    let peak_pos = peak_event.map_or(0, |e| e as usize + 1);
    assert_eq!(
        data.peak_at(data.len()).allocated,
        peak,
        "{name}: dashboard peak"
    );
    assert_eq!(
        data.usage_at(peak_pos).allocated,
        peak,
        "{name}: dashboard at peak"
    );
    if let Some(before) = peak_pos.checked_sub(1) {
        assert!(
            data.usage_at(before).allocated < peak,
            "{name}: the peak is first reached at its event"
        );
    }
    let last = data.len();
    let mut app = App::new(data);
    assert_eq!(
        dashboard_sites(&mut app, peak_pos),
        at_peak,
        "{name}: dashboard sites at peak"
    );
    assert_eq!(
        dashboard_sites(&mut app, last),
        at_end,
        "{name}: dashboard sites at end"
    );

    // The replay's "trace" column.
    let replayed = replay::replay(snapshot, &replay::ReplayOptions::default(), &mut |_, _| {});
    assert_eq!(replayed.original.events, events, "{name}: replay events");
    assert_eq!(
        replayed.original.peak_allocated,
        Some(peak),
        "{name}: replay peak"
    );

    // The HTML report states the same peak and end figures.
    let page = html::render_html(&built);
    for figure in [format_bytes(peak), format_bytes(end_allocated)] {
        assert!(
            page.contains(&figure),
            "{name}: the HTML report lacks {figure}"
        );
    }
}

/// A run with weights, a leak and per-step activations, recorded by vramscope.
fn planted_run() -> Snapshot {
    vramscope_testkit::fixture::training_snapshot_with(12)
}

#[test]
fn a_run_recorded_from_its_start_agrees_everywhere() {
    check("planted", &planted_run());
}

#[test]
fn a_run_recorded_late_agrees_everywhere() {
    let mut late = planted_run();
    let cut = late.events.len() / 3;
    late.events.drain(..cut);
    check("planted, recorded late", &late);
}

#[test]
fn a_run_that_lost_frees_agrees_everywhere() {
    // The frees between reuses of eight addresses: the recorder lost them.
    let mut lossy = planted_run();
    let dropped = vramscope_testkit::fixture::lose_frees(&mut lossy, 8);
    assert!(dropped > 0, "the run frees and reuses addresses");
    let report = report::build_report(&lossy, &report::ReportOptions::default());
    assert!(
        report.stats.lost_frees > 0,
        "the report names the lost frees"
    );
    check("planted, frees lost", &lossy);
}

#[test]
fn a_run_without_its_dump_time_state_agrees_everywhere() {
    // What a profiler trace gives: events and the statistics' totals, no segments.
    let mut bare = planted_run();
    let cut = bare.events.len() / 4;
    bare.events.drain(..cut);
    bare.segments.clear();
    check("planted, no segments", &bare);
    let view = ModelView::new(&bare);
    assert_eq!(view.end_allocated(), bare.stats.allocated_bytes.all.current);
}

#[test]
fn the_shared_traces_agree_everywhere() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    for name in [
        "decomfl_opt125m_zo_fedlearn.pickle",
        "cs336_medium_ctx512_train_step.pickle",
        "hta_ddp_rank1_v100_profile_memory.trace.json.gz",
    ] {
        let Some(path) = shared_trace(root, name) else {
            continue;
        };
        let snapshot = import::load(&path).expect("the shared traces load");
        check(name, &snapshot);
    }
}

proptest::proptest! {
    #![proptest_config(vramscope_testkit::props::config(64))]

    /// Any trace, consistent or not (blocks freed twice or never allocated, allocations over
    /// live blocks, free requests repeated or never completed), with or without dump-time
    /// blocks, gives the same figures in every view.
    #[test]
    fn any_trace_agrees_everywhere(
        ops in vramscope_testkit::generated::ops(1..5, 1..120),
        live_at_dump in vramscope_testkit::generated::live_at_dump(),
    ) {
        let snapshot = vramscope_testkit::generated::trace_of_ops(&ops, &live_at_dump);
        check_views("any trace", &snapshot, false);
    }
}
