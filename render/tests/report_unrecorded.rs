//! Figures a format does not record are `n/a` in text and `null` in JSON, never 0 or a copy of
//! another figure (ARCHITECTURE.md, "The figures, defined"): PyTorch snapshots record no
//! retries, copies, syncs or capacity, and their non-releasable memory only at dump time; a
//! profiler trace records no device calls, OOMs or copies.

use vramscope_analysis::report::{build_report, Report, ReportOptions};
use vramscope_import::{self as import, load_bytes, ImportOptions};
use vramscope_model::Snapshot;
use vramscope_render::{render, render_summary, Format};
use vramscope_testkit::{clean_loop, MIB};

fn report_of(snapshot: &Snapshot) -> Report {
    let mut options = ReportOptions::default();
    options.explorer = false;
    build_report(snapshot, &options)
}

/// The one device's entry of the JSON report of `snapshot`.
fn json_of(snapshot: &Snapshot) -> serde_json::Value {
    let file: serde_json::Value =
        serde_json::from_str(&render(&report_of(snapshot), Format::Json, false)).unwrap();
    file["devices"][0].clone()
}

/// The H200 recording capped below its need: PyTorch counted 3 allocation retries.
fn capped_pickle() -> Snapshot {
    let path = vramscope_testkit::torch_h200::data().join("default_capped.pickle.gz");
    import::load(&path).unwrap()
}

/// A profiler trace with two memory events and its totals.
fn chrome_trace() -> Snapshot {
    let json = r#"{"deviceProperties": [{"id": 0, "name": "Test GPU", "totalGlobalMem": 1073741824}],
      "traceEvents": [
        {"ph": "i", "name": "[memory]", "ts": 10, "args": {"Device Type": 1, "Device Id": 0,
          "Addr": 4096, "Bytes": 2097152, "Total Allocated": 4194304, "Total Reserved": 8388608}},
        {"ph": "i", "name": "[memory]", "ts": 20, "args": {"Device Type": 1, "Device Id": 0,
          "Addr": 4096, "Bytes": -2097152, "Total Allocated": 2097152, "Total Reserved": 8388608}}
      ]}"#;
    load_bytes(json.as_bytes(), "t.json", &ImportOptions::default()).unwrap()
}

/// The cells of the first summary-table row whose label is `label`.
fn row(table: &str, label: &str) -> Vec<String> {
    let line = table
        .lines()
        .find(|l| l.trim_start_matches('|').trim_start().starts_with(label))
        .unwrap_or_else(|| panic!("no row {label:?} in\n{table}"));
    line.split('|')
        .map(|c| c.trim().to_string())
        .filter(|c| !c.is_empty())
        .collect()
}

/// The rows after the row `label` that belong to it (its two pools).
fn pool_rows(table: &str, label: &str) -> Vec<Vec<String>> {
    table
        .lines()
        .skip_while(|l| !l.trim_start_matches('|').trim_start().starts_with(label))
        .skip(1)
        .take(2)
        .map(|l| {
            l.split('|')
                .map(|c| c.trim().to_string())
                .filter(|c| !c.is_empty())
                .collect()
        })
        .collect()
}

#[test]
fn the_summary_of_a_pytorch_pickle_makes_up_no_retries_or_non_releasable_history() {
    let summary = render_summary(&report_of(&capped_pickle()));
    // PyTorch counted 3 retries (expected.json); its snapshot has no entry for them.
    assert_eq!(
        row(&summary, "Alloc retries"),
        ["Alloc retries", "n/a", "OOMs", "0"]
    );
    // Non-releasable memory is known at dump time only: its current value, nothing else.
    for label in ["Non-releasable memory", "Non-releasable allocs"] {
        let cells = row(&summary, label);
        assert_ne!(cells[1], "n/a", "{label}: the current value is recorded");
        assert_eq!(cells[2..], ["n/a", "n/a", "n/a"], "{label}: {cells:?}");
        for pool in pool_rows(&summary, label) {
            assert_eq!(pool[2..], ["n/a", "n/a", "n/a"], "{label}: {pool:?}");
        }
    }
    // What the trace does record stays a figure.
    assert_eq!(
        row(&summary, "Device allocs"),
        ["Device allocs", "83", "Device frees", "44"]
    );
    assert_ne!(row(&summary, "Allocated memory")[2], "n/a");
    // The activity line says which figures are not recorded instead of printing zeros.
    assert!(
        summary.contains("transfers and host waits n/a, 83 device allocs, 44 device frees, 0 OOMs"),
        "{summary}"
    );
}

#[test]
fn json_has_null_for_what_a_pytorch_pickle_does_not_record() {
    let json = json_of(&capped_pickle());
    assert!(
        json["device"]["capacity_bytes"].is_null(),
        "{}",
        json["device"]
    );
    let stats = &json["stats"];
    for key in ["transfers", "h2d_bytes", "d2h_bytes", "syncs", "host_waits"] {
        assert!(stats[key].is_null(), "{key}: {}", stats[key]);
    }
    assert_eq!(stats["device_allocs"], 83);
    assert_eq!(stats["device_frees"], 44);
    assert_eq!(stats["ooms"], 0);
    assert!(stats["empty_cache_calls"].is_u64());
}

/// The report's figures that only a recorder that sees every copy, sync and device call can
/// count: null for a profiler trace, numbers for vramscope's own snapshots.
const COUNTED_FIGURES: [&str; 9] = [
    "transfers",
    "h2d_bytes",
    "d2h_bytes",
    "syncs",
    "host_waits",
    "device_allocs",
    "device_frees",
    "empty_cache_calls",
    "ooms",
];

#[test]
fn json_has_null_for_what_a_profiler_trace_does_not_record() {
    let snapshot = chrome_trace();
    let json = json_of(&snapshot);
    assert_eq!(json["device"]["capacity_bytes"], 1u64 << 30);
    let stats = &json["stats"];
    for key in COUNTED_FIGURES {
        assert!(stats.get(key).is_some(), "the key {key} stays");
        assert!(stats[key].is_null(), "{key}: {}", stats[key]);
    }
    // What it records stays a figure.
    assert_eq!(stats["peak_allocated_bytes"], 4 * MIB);
    assert_eq!(stats["peak_reserved_bytes"], 8 * MIB);
    // The text leaves the line of figures it does not have out, and the table says n/a.
    let report = report_of(&snapshot);
    let text = render(&report, Format::Text, false);
    assert!(!text.contains("device allocs"), "{text}");
    let summary = render_summary(&report);
    assert_eq!(
        row(&summary, "Device allocs"),
        ["Device allocs", "n/a", "Device frees", "n/a"]
    );
}

#[test]
fn json_keeps_figures_vramscope_records() {
    let json = json_of(&clean_loop(3).finish());
    assert_eq!(json["device"]["capacity_bytes"], 16u64 << 30);
    let stats = &json["stats"];
    for key in COUNTED_FIGURES {
        assert!(stats[key].is_u64(), "{key}: {}", stats[key]);
    }
    assert!(stats["transfers"].as_u64().unwrap() > 0);
}
