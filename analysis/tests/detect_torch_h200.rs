//! The `fragmentation` and `oom` findings on real PyTorch recordings: the nine traces in
//! `testkit/data/torch_h200` (PyTorch 2.11 on an H200; `expected.json` says how each was made and
//! what PyTorch counted). A capped run (`set_per_process_memory_fraction`) that fails with the
//! device's memory free must get the cap's diagnosis, never fragmentation; the replay agrees,
//! since without the cap the same request is served; and free memory inside expandable
//! segments is not reported as split memory to fix with `max_split_size_mb`.

use vramscope_analysis::detect::{detect, DetectOptions, Finding, FindingKind, Severity};
use vramscope_import as import;
use vramscope_model::{AllocatorConfig, EventKind, Snapshot};
use vramscope_replay::{replay, ReplayOptions};

use vramscope_testkit::torch_h200::{data, expected};

fn load(case: &str) -> Snapshot {
    import::load(data().join(format!("{case}.pickle.gz"))).unwrap()
}

fn describe(findings: &[&Finding]) -> String {
    findings
        .iter()
        .map(|f| format!("{} {} {}", f.severity, f.kind, f.summary))
        .collect::<Vec<_>>()
        .join("\n")
}

fn evidence(f: &Finding, key: &str) -> Option<String> {
    f.evidence.get(key).map(|v| v.to_string())
}

/// Every recording: its OOMs are PyTorch's count; a capped one's OOMs are the cap's, one with
/// no OOM has no `oom` finding, and none is diagnosed as fragmentation at error severity (no
/// recording failed for fragmentation: each OOM came with the device's memory free).
#[test]
fn each_recordings_oom_gets_its_true_cause() {
    let mut capped_ooms = 0;
    for (case, expected) in expected() {
        let snapshot = load(&case);
        let ooms: Vec<_> = snapshot
            .events
            .iter()
            .filter(|e| e.kind == EventKind::Oom)
            .collect();
        assert_eq!(
            ooms.len() as u64,
            expected["num_ooms"].as_u64().unwrap(),
            "{case}"
        );
        let found = detect(&snapshot, &DetectOptions::default());
        let oom_findings: Vec<&Finding> = found
            .iter()
            .filter(|f| {
                f.kind == FindingKind::Oom
                    || (f.kind == FindingKind::Fragmentation && f.severity == Severity::Error)
            })
            .collect();
        if ooms.is_empty() {
            assert!(
                oom_findings.is_empty(),
                "{case}: {}",
                describe(&oom_findings)
            );
            continue;
        }
        let cap = expected["cap"].as_u64();
        assert!(cap.is_some(), "{case}: an OOM without a cap");
        // The device had far more free than the cap allows the whole process.
        assert!(
            ooms.iter().all(|e| e.device_free > 10 * cap.unwrap()),
            "{case}"
        );
        assert_eq!(oom_findings.len(), 1, "{case}: {}", describe(&oom_findings));
        let f = oom_findings[0];
        assert_eq!(f.kind, FindingKind::Oom, "{case}: {}", f.summary);
        assert_eq!(f.severity, Severity::Error, "{case}");
        assert_eq!(f.count, ooms.len() as u64, "{case}");
        assert_eq!(
            evidence(f, "cause").as_deref(),
            Some("memory_cap"),
            "{case}"
        );
        assert!(f.summary.contains("memory cap"), "{case}: {}", f.summary);
        assert!(
            f.fix.contains("torch.cuda.set_per_process_memory_fraction"),
            "{case}: {}",
            f.fix
        );
        assert!(!f.fix.contains("max_split_size_mb"), "{case}: {}", f.fix);
        capped_ooms += 1;
    }
    assert!(capped_ooms > 0, "no recording has an OOM to check");
}

/// The audit's case in full: `expandable_capped` failed on 128 MiB with 43.8 MiB cached and
/// 138 GiB free on the device.
#[test]
fn expandable_capped_is_the_cap_and_the_replay_agrees() {
    let snapshot = load("expandable_capped");
    let found = detect(&snapshot, &DetectOptions::default());
    assert!(
        !found.iter().any(|f| f.kind == FindingKind::Fragmentation),
        "{}",
        describe(&found.iter().collect::<Vec<_>>())
    );
    let f = found
        .iter()
        .find(|f| f.kind == FindingKind::Oom)
        .expect("the OOM");
    assert_eq!(f.bytes, 128 << 20);
    assert!(
        f.summary
            .starts_with("an allocation of 128 MiB failed: the device had 138 GiB free"),
        "{}",
        f.summary
    );
    assert!(!f.summary.contains("pieces"), "{}", f.summary);
    // The largest free block the request could use at the OOM was smaller than it: the
    // engine's state there agrees that the cache could not serve it.
    let largest: u64 = evidence(f, "largest_usable_free_block_bytes_at_oom")
        .expect("largest usable free block")
        .parse()
        .unwrap();
    assert!(largest < 128 << 20, "{largest}");
    assert_eq!(
        evidence(f, "reserved_unallocated_bytes_at_oom").as_deref(),
        Some("45943808")
    );

    // The replay agrees: under the cap the request fails whatever the split limit; with twice
    // the cap it is served.
    let cap = expected()["expandable_capped"]["cap"].as_u64().unwrap();
    let run = |conf: &str, capacity: u64| {
        let mut options = ReplayOptions::default();
        options.config = AllocatorConfig::parse(conf).unwrap();
        options.capacity = Some(capacity);
        replay(&snapshot, &options, &mut |_, _| {})
    };
    let split = run("expandable_segments:True,max_split_size_mb:128", cap);
    assert!(split.first_oom.is_some(), "max_split_size_mb fixed it");
    let uncapped = run("expandable_segments:True", 2 * cap);
    assert!(uncapped.first_oom.is_none(), "{:?}", uncapped.first_oom);
    assert_eq!(uncapped.trace_ooms_served, 1);
}

/// An expandable-segments run without an OOM: its free memory sits in expandable segments,
/// which PyTorch does not count as split (`inactive_split_bytes`), so no fragmentation finding
/// and no `max_split_size_mb` to set.
#[test]
fn expandable_runs_have_no_split_memory_finding() {
    for case in ["expandable", "expandable_capped"] {
        let snapshot = load(case);
        assert!(snapshot.segments.iter().all(|s| s.expandable), "{case}");
        let found = detect(&snapshot, &DetectOptions::default());
        assert!(
            !found.iter().any(
                |f| f.kind == FindingKind::Fragmentation || f.fix.contains("max_split_size_mb")
            ),
            "{case}: {}",
            describe(&found.iter().collect::<Vec<_>>())
        );
    }
}
