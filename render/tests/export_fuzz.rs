//! The bodies of the `replay`, `report`, `summary` and `export` fuzz targets (FUZZING.md) as
//! proptests inside `cargo test`, where overflow checks are on: PyTorch-shaped snapshots are
//! generated with hostile figures (sizes and addresses near 2^64, frees of blocks never
//! allocated, segments that overlap, blocks larger than their segments), written with the
//! project's pickle writer, mutated byte by byte, imported, and taken through every command
//! that reads an imported snapshot. Nothing may panic; an export that fails must say why.

use proptest::prelude::*;
use vramscope_analysis::report::{build_report, ReportOptions};
use vramscope_export::{to_perfetto, to_pytorch_pickle, to_pytorch_pickle_with, PytorchExtras};
use vramscope_import::{load_bytes, ImportOptions};
use vramscope_model::{AllocatorConfig, Snapshot};
use vramscope_pickle::{Document, PickleWriter};
use vramscope_render::{render, render_summary, Format};
use vramscope_replay::{render_text, replay, ReplayOptions};

/// What every file command does with an imported snapshot, as the fuzz targets do it.
fn every_command(snapshot: &Snapshot, input: &[u8]) {
    for (capacity, conf, verify) in [
        (None, "", true),
        (Some(64 << 20), "", false),
        (None, "expandable_segments:True", false),
    ] {
        let mut options = ReplayOptions::default();
        options.capacity = capacity;
        options.config = AllocatorConfig::parse(conf).unwrap();
        options.reconstruct_start = true;
        options.verify = verify;
        let result = replay(snapshot, &options, &mut |_, _| {});
        let _ = render_text("fuzz", &result);
    }
    let report = build_report(snapshot, &ReportOptions::default());
    for format in [Format::Text, Format::Markdown, Format::Json] {
        let _ = render(&report, format, false);
    }
    let _ = render_summary(&report);
    let options = ImportOptions::default();
    if let Ok(bytes) = to_pytorch_pickle(snapshot) {
        load_bytes(&bytes, "export", &options).expect("an exported pickle imports again");
    }
    let doc = Document::parse(input).ok();
    let extras = doc.as_ref().and_then(PytorchExtras::from_document);
    if let Ok(bytes) = to_pytorch_pickle_with(snapshot, extras.as_ref()) {
        vramscope_pickle::parse(&bytes).expect("the export is a pickle");
    }
    if let Ok(json) = to_perfetto(snapshot) {
        serde_json::from_str::<serde_json::Value>(&json).expect("the export is JSON");
    }
}

/// Sizes and addresses worth trying: small, PyTorch-like, and near the ends of 64 bits.
fn figure() -> impl Strategy<Value = u64> {
    prop_oneof![
        0u64..4096,
        Just(512u64),
        Just(2 << 20),
        Just(20 << 20),
        (1u64..64).prop_map(|k| k << 20),
        Just(1u64 << 49),
        Just(1u64 << 63),
        Just(u64::MAX - 511),
        Just(u64::MAX),
        any::<u64>(),
    ]
}

const ACTIONS: [&str; 10] = [
    "alloc",
    "free_requested",
    "free_completed",
    "segment_alloc",
    "segment_free",
    "segment_map",
    "segment_unmap",
    "snapshot",
    "oom",
    "unknown_action",
];

/// A trace entry: action, address (one of a few, so that frees find allocations), size,
/// stream, time.
type Entry = (usize, u64, u64, i64, u64);
/// A segment: address, size, and its blocks' sizes and states.
type Seg = (u64, u64, Vec<(u64, usize)>);

fn entries() -> impl Strategy<Value = Vec<Entry>> {
    prop::collection::vec(
        (
            0usize..ACTIONS.len(),
            prop_oneof![
                (0u64..4).prop_map(|k| 0x7f00_0000_0000 + (k << 21)),
                figure()
            ],
            figure(),
            prop_oneof![Just(0i64), Just(7), Just(-1), any::<i64>()],
            prop_oneof![
                Just(0u64),
                1_700_000_000_000_000u64..1_700_000_000_001_000,
                any::<u64>()
            ],
        ),
        0..40,
    )
}

fn segments() -> impl Strategy<Value = Vec<Seg>> {
    prop::collection::vec(
        (
            prop_oneof![
                (0u64..4).prop_map(|k| 0x7f00_0000_0000 + (k << 21)),
                figure()
            ],
            figure(),
            prop::collection::vec((figure(), 0usize..3), 0..5),
        ),
        0..4,
    )
}

/// The snapshot pickle of `entries` and `segments`.
fn snapshot_pickle(entries: &[Entry], segments: &[Seg]) -> Vec<u8> {
    let states = ["active_allocated", "active_pending_free", "inactive"];
    let mut w = PickleWriter::new();
    let mut strings = rustc_hash::FxHashMap::default();
    w.begin_dict();
    w.str("segments");
    w.begin_list();
    for (address, total, blocks) in segments {
        w.begin_dict();
        w.shared_str("address", &mut strings);
        w.uint(*address);
        w.shared_str("total_size", &mut strings);
        w.uint(*total);
        w.shared_str("segment_type", &mut strings);
        w.str(if *total == 2 << 20 { "small" } else { "large" });
        w.shared_str("blocks", &mut strings);
        w.begin_list();
        for (size, state) in blocks {
            w.begin_dict();
            w.shared_str("size", &mut strings);
            w.uint(*size);
            w.shared_str("state", &mut strings);
            w.shared_str(states[*state], &mut strings);
            w.end_dict();
        }
        w.end_list();
        w.end_dict();
    }
    w.end_list();
    w.str("device_traces");
    w.begin_list();
    w.begin_list();
    for &(action, addr, size, stream, time_us) in entries {
        w.begin_dict();
        w.shared_str("action", &mut strings);
        w.shared_str(ACTIONS[action], &mut strings);
        w.shared_str("addr", &mut strings);
        w.uint(addr);
        w.shared_str("size", &mut strings);
        w.uint(size);
        w.shared_str("stream", &mut strings);
        w.int(stream);
        w.shared_str("time_us", &mut strings);
        w.uint(time_us);
        w.shared_str("frames", &mut strings);
        w.begin_list();
        w.begin_dict();
        w.shared_str("filename", &mut strings);
        w.shared_str("train.py", &mut strings);
        w.shared_str("line", &mut strings);
        w.uint(size % 1000);
        w.shared_str("name", &mut strings);
        w.shared_str("step", &mut strings);
        w.end_dict();
        w.end_list();
        w.end_dict();
    }
    w.end_list();
    w.end_list();
    w.str("allocator_settings");
    w.begin_dict();
    w.str("expandable_segments");
    w.bool(false);
    w.end_dict();
    w.end_dict();
    w.finish()
}

proptest! {
    #![proptest_config(vramscope_testkit::props::config(1500))]

    #[test]
    fn generated_snapshots_go_through_every_command(entries in entries(), segments in segments()) {
        let bytes = snapshot_pickle(&entries, &segments);
        if let Ok(snapshot) = load_bytes(&bytes, "generated", &ImportOptions::default()) {
            every_command(&snapshot, &bytes);
        }
    }

    #[test]
    fn mutated_snapshots_go_through_every_command(
        entries in entries(),
        segments in segments(),
        edits in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>(), 0u8..3), 1..6),
    ) {
        let mut bytes = snapshot_pickle(&entries, &segments);
        for (at, byte, how) in edits {
            let i = at.index(bytes.len());
            match how {
                0 => bytes[i] = byte,
                1 => bytes.insert(i, byte),
                _ => {
                    bytes.remove(i);
                }
            }
            if bytes.is_empty() {
                return Ok(());
            }
        }
        if let Ok(snapshot) = load_bytes(&bytes, "mutated", &ImportOptions::default()) {
            every_command(&snapshot, &bytes);
        }
    }
}

#[test]
fn figures_that_no_sum_can_hold_are_errors_naming_the_field() {
    // Found by the proptests above: a free of 2^63 bytes made the HTML timeline's sums
    // overflow; segments near 2^64 made the statistics' and the replay's.
    let cases: [(Vec<Entry>, Vec<Seg>, &str); 3] = [
        (
            vec![(1, 0x7f00_0000_0000, 1 << 63, 0, 0)],
            vec![],
            "device_traces[0][0].addr",
        ),
        (
            vec![],
            vec![(u64::MAX - 511, 512, vec![])],
            "segments[0].address",
        ),
        (
            vec![
                (0, 0x1000, 1 << 59, 0, 0),
                (0, 0x1000, 1 << 59, 0, 0),
                (0, 0x1000, 1 << 59, 0, 0),
            ],
            vec![],
            "device_traces[0][2].size",
        ),
    ];
    for (entries, segments, path) in cases {
        let bytes = snapshot_pickle(&entries, &segments);
        let e = load_bytes(&bytes, "inconsistent.pickle", &ImportOptions::default()).unwrap_err();
        match &e.kind {
            vramscope_import::ImportErrorKind::Structure { path: at, .. } => {
                assert_eq!(at, path, "{e}")
            }
            other => panic!("{other:?}"),
        }
        assert!(e.to_string().contains("inconsistent"), "{e}");
    }
}

/// A torch.profiler Chrome trace of `[memory]` events (address, signed size, total allocated)
/// and one step slice.
fn chrome_trace(events: &[(u64, i64, u64)]) -> Vec<u8> {
    let memory: Vec<serde_json::Value> = events
        .iter()
        .enumerate()
        .map(|(i, &(addr, bytes, total))| {
            serde_json::json!({"ph": "i", "name": "[memory]", "ts": 10 + i, "pid": 1, "tid": 1,
                "args": {"Addr": addr, "Bytes": bytes, "Total Allocated": total,
                         "Total Reserved": total, "Device Type": 1, "Device Id": 0}})
        })
        .chain([serde_json::json!({"ph": "X", "name": "ProfilerStep#1", "ts": 5, "dur": 100, "pid": 1, "tid": 1})])
        .collect();
    serde_json::to_vec(&serde_json::json!({ "traceEvents": memory })).unwrap()
}

proptest! {
    #![proptest_config(vramscope_testkit::props::config(1000))]

    #[test]
    fn generated_chrome_traces_go_through_every_command(
        events in prop::collection::vec(
            (
                prop_oneof![(0u64..4).prop_map(|k| 0x7f00_0000_0000 + (k << 21)), figure()],
                prop_oneof![-4096i64..4096, Just(i64::MIN), Just(i64::MAX), Just(1 << 62), any::<i64>()],
                figure(),
            ),
            0..30,
        )
    ) {
        let bytes = chrome_trace(&events);
        if let Ok(snapshot) = load_bytes(&bytes, "trace.json", &ImportOptions::default()) {
            every_command(&snapshot, &bytes);
        }
    }
}

#[test]
fn chrome_trace_figures_that_no_sum_can_hold_are_errors_naming_the_field() {
    // Five allocations of 2^62 bytes add up past 2^64.
    let events: Vec<(u64, i64, u64)> = (0..5).map(|k| (0x1000 + (k << 40), 1 << 62, 0)).collect();
    let e = load_bytes(
        &chrome_trace(&events),
        "huge.json",
        &ImportOptions::default(),
    )
    .unwrap_err();
    match &e.kind {
        vramscope_import::ImportErrorKind::Structure { path, .. } => {
            assert_eq!(path, "[memory] event 0 of the file, args.Bytes", "{e}")
        }
        other => panic!("{other:?}"),
    }
    assert!(e.to_string().contains("inconsistent"), "{e}");
}
