//! Property tests: detectors, reports, the diff and the checks accept any snapshot an importer
//! could produce (frees without allocations, reused addresses, absurd sizes, site ids outside
//! the table, steps out of order, segments that disagree with the trace) without panicking,
//! and give the same output twice.

use proptest::prelude::*;
use vramscope_analysis::checks::{check_no_leaks, check_peak_below};
use vramscope_analysis::detect::{detect, DetectOptions};
use vramscope_analysis::diff::{diff, render_json, render_text};
use vramscope_analysis::model_view::apply_step_marker;
use vramscope_analysis::report::{build_report, ReportOptions};
use vramscope_model::{
    Annotation, Block, BlockState, CallSite, DeviceInfo, EventKind, Pool, Segment, Snapshot,
    SnapshotSource, StepMark, TransferDirection,
};
use vramscope_render::{render, Format};

fn kind() -> impl Strategy<Value = EventKind> {
    prop_oneof![
        4 => Just(EventKind::Alloc),
        2 => Just(EventKind::FreeRequested),
        2 => Just(EventKind::FreeCompleted),
        1 => Just(EventKind::SegmentAlloc),
        1 => Just(EventKind::SegmentFree),
        1 => Just(EventKind::SegmentMap),
        1 => Just(EventKind::SegmentUnmap),
        1 => Just(EventKind::EmptyCache),
        1 => Just(EventKind::Oom),
        1 => Just(EventKind::Transfer(TransferDirection::HostToDevice)),
        1 => Just(EventKind::Transfer(TransferDirection::DeviceToHost)),
        1 => Just(EventKind::Transfer(TransferDirection::DeviceToDevice)),
        1 => Just(EventKind::Sync),
        1 => Just(EventKind::Step),
        1 => Just(EventKind::Snapshot),
    ]
}

fn size() -> impl Strategy<Value = u64> {
    prop_oneof![
        4 => 0u64..4096,
        2 => Just(2u64 << 20),
        1 => Just(u64::MAX),
        1 => Just(1u64 << 63),
        1 => any::<u64>(),
    ]
}

fn event() -> impl Strategy<Value = (EventKind, u64, u64, Option<u32>, u32, u64)> {
    (
        kind(),
        prop_oneof![4 => (0u64..6).prop_map(|a| a * 0x1000), 1 => any::<u64>()],
        size(),
        prop::option::of(0u32..6),
        prop_oneof![4 => 0u32..6, 1 => any::<u32>()],
        any::<u64>(),
    )
}

fn block() -> impl Strategy<Value = (u64, u64, u8, Option<u32>)> {
    (
        (0u64..6).prop_map(|a| a * 0x1000),
        size(),
        0u8..3,
        prop::option::of(0u32..6),
    )
}

fn snapshot() -> impl Strategy<Value = Snapshot> {
    (
        prop::collection::vec(event(), 0..120),
        prop::collection::vec(prop::collection::vec(block(), 0..4), 0..3),
        prop::collection::vec(0u64..8, 0..5),
        prop_oneof![Just(0u64), Just(1u64 << 30), Just(u64::MAX)],
        any::<bool>(),
    )
        .prop_map(|(events, segments, marks, capacity, expandable)| {
            let mut s = Snapshot::empty(
                SnapshotSource::Pytorch,
                DeviceInfo {
                    index: 0,
                    name: "<fuzz & \"friends\">".to_string(),
                    backend: "sim".to_string(),
                    capacity,
                },
            );
            s.config.expandable_segments = expandable;
            for i in 0..4u32 {
                s.sites.push(CallSite {
                    file: format!("f{}.py", i % 3),
                    line: i % 2,
                    column: 0,
                    function: if i == 1 {
                        String::new()
                    } else {
                        format!("fn{i}")
                    },
                    frames: Vec::new(),
                });
            }
            for (seq, (kind, addr, size, site, step, time_ns)) in events.into_iter().enumerate() {
                s.events.push(
                    vramscope_testkit::event(kind)
                        .seq(seq as u64)
                        .time_ns(time_ns)
                        .addr(addr)
                        .size(size)
                        .requested(size)
                        .site(site)
                        .step(step)
                        .build(),
                );
            }
            for (i, blocks) in segments.into_iter().enumerate() {
                let total = blocks.iter().fold(0u64, |a, b| a.saturating_add(b.1));
                s.segments.push(Segment {
                    device: 0,
                    address: i as u64 * 0x1_0000,
                    total_size: total,
                    stream: 0,
                    pool: Pool::Large,
                    expandable: false,
                    blocks: blocks
                        .into_iter()
                        .map(|(address, size, state, site)| Block {
                            address,
                            size,
                            requested_size: size,
                            state: match state {
                                0 => BlockState::ActiveAllocated,
                                1 => BlockState::ActivePendingFree,
                                _ => BlockState::Inactive,
                            },
                            site,
                            tag: None,
                            scope: None,
                            step: 0,
                            thread: 0,
                        })
                        .collect(),
                });
            }
            for (i, &step) in marks.iter().enumerate() {
                s.annotations.push(Annotation {
                    name: format!("mark <{i}>"),
                    stage: if i % 2 == 0 { "START" } else { "" }.to_string(),
                    time_ns: step.wrapping_mul(0x9e37_79b9_7f4a_7c15),
                    device: 0,
                });
            }
            for (i, step) in marks.into_iter().enumerate() {
                s.steps.push(StepMark {
                    step,
                    seq: i as u64 * 10,
                    time_ns: 0,
                    label: format!("mark <{i}>"),
                });
            }
            s
        })
}

proptest! {
    #![proptest_config(vramscope_testkit::props::config(96))]

    #[test]
    fn any_snapshot_is_analysed_without_panicking(a in snapshot(), b in snapshot()) {
        let options = ReportOptions::default();
        let report = build_report(&a, &options);
        for format in [Format::Text, Format::Markdown, Format::Json, Format::Html] {
            let first = render(&report, format, true);
            prop_assert_eq!(&first, &render(&build_report(&a, &options), format, true));
            if format == Format::Json {
                prop_assert!(serde_json::from_str::<serde_json::Value>(&first).is_ok());
            }
            if format == Format::Html {
                prop_assert!(!first.contains("<fuzz"));
            }
        }
        prop_assert_eq!(detect(&a, &DetectOptions::default()), report.findings.clone());
        let _ = check_no_leaks(&a);
        let _ = check_peak_below(&a, 1 << 20);
        let mut restepped = a.clone();
        if apply_step_marker(&mut restepped, "mark <") > 0 {
            let _ = detect(&restepped, &DetectOptions::default());
        }
        let d = diff(&a, &b);
        let _ = render_text(&d);
        prop_assert!(serde_json::from_str::<serde_json::Value>(&render_json(&d)).is_ok());
    }
}
