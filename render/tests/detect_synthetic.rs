//! Detector tests on synthetic snapshots built in code: each scenario (a leaky loop, `.item()`
//! in a loop, `empty_cache()` in a loop, a fragmented OOM, a clean loop...) must produce exactly
//! the findings an expert would name, and nothing else at warning or above.

use vramscope_analysis::detect::{
    self, detect, DetectOptions, Finding, FindingKind, FindingSink, Severity, VecSink,
};
use vramscope_analysis::model_view::{apply_step_marker, ModelView};
use vramscope_model::{Annotation, Snapshot, SnapshotSource, TransferDirection};
use vramscope_testkit::{clean_loop, Trace, MIB};

fn findings(snapshot: &Snapshot) -> Vec<Finding> {
    detect(snapshot, &DetectOptions::default())
}

fn serious(findings: &[Finding]) -> Vec<&Finding> {
    findings
        .iter()
        .filter(|f| f.severity >= Severity::Warning)
        .collect()
}

fn describe(findings: &[Finding]) -> String {
    findings
        .iter()
        .map(|f| format!("{} {} {} {}", f.severity, f.kind, f.site_label(), f.summary))
        .collect::<Vec<_>>()
        .join("\n")
}

/// A clean loop plus one site that appends its block to a list every step.
fn leaky_loop(steps: u64) -> Snapshot {
    let mut t = clean_loop(0);
    let leak = t.site("train.py", 33, "train");
    let act = t.site("model.py", 55, "Model.forward");
    for _ in 0..steps {
        t.step();
        let a = t.alloc(act, 2 * MIB);
        t.alloc(leak, 512);
        t.free(a, 2 * MIB);
    }
    t.finish()
}

#[test]
fn clean_loop_has_no_warning_or_error() {
    let snapshot = clean_loop(10).finish();
    let found = findings(&snapshot);
    assert!(serious(&found).is_empty(), "{}", describe(&found));
    // The weights and the optimizer state are reported as holders, as information: one
    // finding for memory allocated once, listing both sites with their bytes.
    let holders: Vec<_> = found
        .iter()
        .filter(|f| f.kind == FindingKind::TopHolders)
        .collect();
    assert_eq!(holders.len(), 1, "{}", describe(&found));
    assert_eq!(holders[0].site.as_deref(), Some("model.py:10"));
    assert_eq!(holders[0].severity, Severity::Info);
    assert_eq!(holders[0].sites[0].site, "model.py:10");
    assert_eq!(holders[0].sites[0].bytes, 32 * MIB);
    assert!(holders[0].sites.iter().any(|s| s.site == "optim.py:40"));
    assert_eq!(
        holders[0].bytes,
        holders[0].sites.iter().map(|s| s.bytes).sum::<u64>()
    );
}

#[test]
fn leaky_loop_gives_exactly_one_retained_per_step() {
    let snapshot = leaky_loop(10);
    let found = findings(&snapshot);
    let serious = serious(&found);
    assert_eq!(serious.len(), 1, "{}", describe(&found));
    let f = serious[0];
    assert_eq!(f.kind, FindingKind::RetainedPerStep);
    assert_eq!(f.site.as_deref(), Some("train.py:33"));
    assert_eq!(f.function, "train");
    // Steps 9 and 10 count for nothing: the last one is the step in progress at the dump,
    // and step 9's block outlived no step that completed.
    assert_eq!(f.count, 8);
    assert_eq!(f.bytes, 4096);
    assert_eq!(f.first_step, Some(1));
    assert_eq!(f.last_step, Some(8));
    let per_step = f.per_step.expect("per-step rate");
    assert_eq!(per_step.count, 1.0);
    assert_eq!(per_step.bytes, 512.0);
    assert!(f.evidence.get("steps_until_oom").is_some());
    assert!(f.fix.contains("item()"));
    // 512 B per step on a 16 GiB device takes millions of steps to fill it.
    assert_eq!(f.severity, Severity::Warning);
}

#[test]
fn large_leak_is_an_error_with_steps_until_oom() {
    let mut t = Trace::new().capacity(1 << 30);
    let leak = t.site("train.py", 7, "train");
    for _ in 0..5 {
        t.step();
        t.alloc(leak, 8 * MIB);
    }
    let found = findings(&t.finish());
    let f = &found[0];
    assert_eq!(f.kind, FindingKind::RetainedPerStep);
    assert_eq!(f.severity, Severity::Error);
    // (1 GiB - 40 MiB peak) / 8 MiB per step.
    assert_eq!(
        f.evidence.get("steps_until_oom").map(|v| v.to_string()),
        Some("123".to_string())
    );
}

#[test]
fn leak_starting_mid_run_is_found_and_short_leaks_are_not() {
    let mut t = clean_loop(5);
    let leak = t.site("eval.py", 3, "evaluate");
    for _ in 0..5 {
        t.step();
        t.alloc(leak, 4096);
    }
    let found = findings(&t.finish());
    let leaks: Vec<_> = found
        .iter()
        .filter(|f| f.kind == FindingKind::RetainedPerStep)
        .collect();
    assert_eq!(leaks.len(), 1, "{}", describe(&found));
    assert_eq!(leaks[0].first_step, Some(6));

    let mut t = clean_loop(5);
    let leak = t.site("eval.py", 3, "evaluate");
    for _ in 0..2 {
        t.step();
        t.alloc(leak, 4096);
    }
    let found = findings(&t.finish());
    assert!(serious(&found).is_empty(), "{}", describe(&found));
}

#[test]
fn sliding_window_and_replaced_buffers_are_not_leaks() {
    // Keeps the last four steps' blocks (a moving average), freeing older ones.
    let mut t = clean_loop(0);
    let window = t.site("metrics.py", 12, "Window.push");
    let mut kept = std::collections::VecDeque::new();
    for _ in 0..12 {
        t.step();
        kept.push_back(t.alloc(window, 4096));
        if kept.len() > 4 {
            let old = kept.pop_front().unwrap();
            t.free(old, 4096);
        }
    }
    let found = findings(&t.finish());
    assert!(serious(&found).is_empty(), "{}", describe(&found));
}

#[test]
fn site_ids_with_the_same_file_line_are_one_group() {
    let mut t = clean_loop(0);
    let a = t.site("train.py", 33, "train");
    let b = t.site("train.py", 33, "");
    for step in 0..8 {
        t.step();
        t.alloc(if step % 2 == 0 { a } else { b }, 512);
    }
    let found = findings(&t.finish());
    let leaks: Vec<_> = found
        .iter()
        .filter(|f| f.kind == FindingKind::RetainedPerStep)
        .collect();
    assert_eq!(leaks.len(), 1, "{}", describe(&found));
    // Eight steps retain; the last two outlive no completed step.
    assert_eq!(leaks[0].count, 6);
    assert_eq!(leaks[0].function, "train");
}

#[test]
fn item_in_loop_gives_sync_in_loop() {
    let mut t = clean_loop(0);
    let item = t.site("train.py", 44, "log_metrics");
    let act = t.site("model.py", 55, "Model.forward");
    for _ in 0..10 {
        t.step();
        let a = t.alloc(act, 2 * MIB);
        for _ in 0..100 {
            t.transfer(item, TransferDirection::DeviceToHost, 4);
        }
        t.free(a, 2 * MIB);
    }
    let found = findings(&t.finish());
    let serious = serious(&found);
    assert_eq!(serious.len(), 1, "{}", describe(&found));
    let f = serious[0];
    assert_eq!(f.kind, FindingKind::SyncInLoop);
    assert_eq!(f.site.as_deref(), Some("train.py:44"));
    assert_eq!(f.count, 1000);
    assert_eq!(f.per_step.unwrap().count, 100.0);
    assert_eq!(
        f.evidence.get("syncs_per_step").map(|v| v.to_string()),
        Some("100".to_string())
    );
}

#[test]
fn explicit_syncs_count_and_large_copies_do_not() {
    let mut t = clean_loop(0);
    let sync = t.site("train.py", 50, "train");
    let copy = t.site("train.py", 51, "train");
    for _ in 0..5 {
        t.step();
        for _ in 0..10 {
            t.sync(sync);
            t.transfer(copy, TransferDirection::DeviceToHost, 4096);
        }
    }
    let found = findings(&t.finish());
    let syncs: Vec<_> = found
        .iter()
        .filter(|f| f.kind == FindingKind::SyncInLoop)
        .collect();
    assert_eq!(syncs.len(), 1, "{}", describe(&found));
    assert_eq!(syncs[0].site.as_deref(), Some("train.py:50"));
}

#[test]
fn empty_cache_in_loop_gives_cache_churn() {
    let mut t = clean_loop(0);
    let empty = t.site("train.py", 60, "train");
    let act = t.site("model.py", 55, "Model.forward");
    for _ in 0..10 {
        t.step();
        let seg = t.segment_alloc(Some(act), 20 * MIB);
        let a = t.alloc(act, 12 * MIB);
        t.free(a, 12 * MIB);
        t.segment_free(seg, 20 * MIB);
        t.empty_cache(empty, 20 * MIB);
    }
    let found = findings(&t.finish());
    let serious = serious(&found);
    assert_eq!(serious.len(), 1, "{}", describe(&found));
    let f = serious[0];
    assert_eq!(f.kind, FindingKind::CacheChurn);
    assert_eq!(f.site.as_deref(), Some("train.py:60"));
    assert_eq!(f.count, 20);
    assert_eq!(
        f.evidence
            .get("assumed_us_per_device_call")
            .map(|v| v.to_string()),
        Some("20".to_string())
    );
    assert_eq!(
        f.evidence.get("est_us_per_step").map(|v| v.to_string()),
        Some("40".to_string())
    );
    assert!(f.fix.contains("empty_cache()"));
}

#[test]
fn empty_cache_releasing_nothing_is_information() {
    let mut t = clean_loop(0);
    let empty = t.site("train.py", 60, "train");
    for _ in 0..6 {
        t.step();
        t.empty_cache(empty, 0);
    }
    let found = findings(&t.finish());
    assert!(serious(&found).is_empty(), "{}", describe(&found));
    assert!(found
        .iter()
        .any(|f| f.kind == FindingKind::CacheChurn && f.severity == Severity::Info));
}

#[test]
fn transfer_heavy_loop_is_reported() {
    let mut t = clean_loop(0);
    let upload = t.site("data.py", 80, "to_device");
    let act = t.site("model.py", 55, "Model.forward");
    for _ in 0..6 {
        t.step();
        t.transfer(upload, TransferDirection::HostToDevice, 64 * MIB);
        let a = t.alloc(act, 8 * MIB);
        t.free(a, 8 * MIB);
    }
    let found = findings(&t.finish());
    let serious = serious(&found);
    assert_eq!(serious.len(), 1, "{}", describe(&found));
    assert_eq!(serious[0].kind, FindingKind::TransferHeavy);
    assert_eq!(serious[0].site.as_deref(), Some("data.py:80"));
    assert_eq!(serious[0].per_step.unwrap().bytes, (64 * MIB) as f64);
}

#[test]
fn oom_with_enough_free_cache_is_fragmentation() {
    let mut t = Trace::new().capacity(1 << 30);
    let model = t.site("model.py", 5, "build");
    let act = t.site("model.py", 9, "forward");
    let mut segs = Vec::new();
    for _ in 0..4 {
        let seg = t.segment_alloc(Some(act), 20 * MIB);
        segs.push(seg);
        // Each segment keeps a small block alive after the activations are freed.
        t.alloc_at(model, seg, 2 * MIB);
        t.alloc_at(act, seg + 2 * MIB, 18 * MIB);
        t.free(seg + 2 * MIB, 18 * MIB);
    }
    t.step();
    t.oom(act, 40 * MIB, 10 * MIB);
    for seg in segs {
        t.add_segment(
            seg,
            &[(0, 2 * MIB, true), (2 * MIB, 18 * MIB, false)],
            20 * MIB,
        );
    }
    let found = findings(&t.finish());
    let serious = serious(&found);
    assert_eq!(serious.len(), 1, "{}", describe(&found));
    let f = serious[0];
    assert_eq!(f.kind, FindingKind::Fragmentation);
    assert_eq!(f.severity, Severity::Error);
    assert_eq!(f.bytes, 40 * MIB);
    assert_eq!(f.site.as_deref(), Some("model.py:9"));
    let evidence = |key: &str| f.evidence.get(key).map(|v| v.to_string());
    assert_eq!(evidence("cause").as_deref(), Some("fragmentation"));
    assert_eq!(
        evidence("reserved_unallocated_bytes_at_oom"),
        Some((72 * MIB).to_string())
    );
    // The largest free block at the OOM, from the engine's state there.
    assert_eq!(
        evidence("largest_usable_free_block_bytes_at_oom"),
        Some((18 * MIB).to_string())
    );
    assert!(
        f.summary.contains("72.0 MiB was reserved but unallocated")
            && f.summary.contains("the largest it could use 18.0 MiB")
            && f.summary.contains("only 10.0 MiB free"),
        "{}",
        f.summary
    );
    assert!(f.fix.contains("expandable_segments:True"), "{}", f.fix);
    // Byte figures read as bytes in the text report.
    let sentence = vramscope_render::evidence_sentence(f);
    assert!(
        sentence.contains("reserved unallocated at oom 72.0 MiB")
            && sentence.contains("largest usable free block at oom 18.0 MiB"),
        "{sentence}"
    );
}

/// With expandable segments on, `max_split_size_mb` does not limit splitting and whole free
/// pages already go back to the device before an allocation fails: no setting is offered.
#[test]
fn fragmentation_with_expandable_segments_offers_no_split_limit() {
    let mut t = Trace::new();
    t.snap.config.expandable_segments = true;
    let act = t.site("model.py", 9, "forward");
    let seg = t.segment_alloc(Some(act), 200 * MIB);
    // Live 1 MiB blocks every 50 MiB leave four free pieces of 49 MiB.
    for i in 0..4 {
        t.alloc_at(act, seg + i * 50 * MIB, MIB);
    }
    t.oom(act, 100 * MIB, 10 * MIB);
    let found = findings(&t.finish());
    let f = found
        .iter()
        .find(|f| f.kind == FindingKind::Fragmentation)
        .unwrap_or_else(|| panic!("no fragmentation: {}", describe(&found)));
    assert_eq!(f.severity, Severity::Error);
    assert!(
        f.summary.contains("the largest it could use 49.0 MiB"),
        "{}",
        f.summary
    );
    assert!(!f.fix.contains("max_split_size_mb"), "{}", f.fix);
    assert!(!f.fix.contains("expandable_segments:True"), "{}", f.fix);
    assert!(f.fix.contains("lower the peak"), "{}", f.fix);
    assert!(f.evidence.get("setting").is_none());
}

#[test]
fn oom_without_free_memory_is_an_oom_with_the_largest_holder() {
    let mut t = Trace::new().capacity(100 * MIB);
    let model = t.site("model.py", 5, "build");
    let act = t.site("model.py", 9, "forward");
    t.segment_alloc(Some(model), 90 * MIB);
    t.alloc(model, 90 * MIB);
    t.oom(act, 40 * MIB, 10 * MIB);
    let found = findings(&t.finish());
    let f = found
        .iter()
        .find(|f| f.kind == FindingKind::Oom)
        .expect("oom finding");
    assert_eq!(f.severity, Severity::Error);
    assert_eq!(
        f.evidence.get("cause").map(|v| v.to_string()).as_deref(),
        Some("memory_in_use")
    );
    assert_eq!(
        f.evidence.get("largest_holder").map(|v| v.to_string()),
        Some("model.py:5".to_string())
    );
    assert!(f.fix.contains("lower the peak"), "{}", f.fix);
    assert!(!found.iter().any(|f| f.kind == FindingKind::Fragmentation));
}

/// In a trace recorded late, memory allocated before the recording began is held at the OOM
/// like any other: the largest holder is named among all that was held there, as the "at
/// peak" column names it (by the dump-time block's site, or as "(before the trace)" when it
/// has none), and the figure is what the walk's state held, not only what the trace's own
/// allocations held.
#[test]
fn the_largest_holder_at_an_oom_counts_memory_from_before_the_trace() {
    for (named, label) in [(true, "model.py:5"), (false, "(before the trace)")] {
        let mut t = Trace::new().capacity(100 * MIB);
        let weights = t.site("model.py", 5, "build");
        let act = t.site("model.py", 9, "forward");
        // The dump-time state: 80 MiB of weights from before the trace, and the activation's
        // block.
        let seg = 0x7e00_0000_0000;
        t.add_segment(
            seg,
            &[(0, 80 * MIB, true), (80 * MIB, 8 * MIB, true)],
            90 * MIB,
        );
        t.snap.segments[0].blocks[0].site = named.then_some(weights);
        t.alloc_at(act, seg + 80 * MIB, 8 * MIB);
        t.oom(act, 40 * MIB, 10 * MIB);
        let found = findings(&t.finish());
        let f = found
            .iter()
            .find(|f| f.kind == FindingKind::Oom)
            .unwrap_or_else(|| panic!("no oom: {}", describe(&found)));
        assert_eq!(
            f.evidence.get("largest_holder").map(|v| v.to_string()),
            Some(label.to_string()),
            "{}",
            f.summary
        );
        assert_eq!(
            f.evidence
                .get("largest_holder_bytes")
                .map(|v| v.to_string()),
            Some((80 * MIB).to_string())
        );
        let sentence = format!("the largest holder is {label} with 80.0 MiB");
        assert!(f.summary.contains(&sentence), "{}", f.summary);
    }
}

/// A capped run: the device has far more free than the request, so the process's cap refused
/// it, whatever the cache holds; it is an `oom` naming the cap, never fragmentation.
#[test]
fn oom_with_room_on_the_device_is_the_memory_cap() {
    for cached_pieces in [false, true] {
        let mut t = Trace::new().capacity(140 << 30);
        t.snap.source = SnapshotSource::Pytorch;
        let model = t.site("model.py", 5, "build");
        let act = t.site("model.py", 9, "forward");
        let seg = t.segment_alloc(Some(model), 400 * MIB);
        t.alloc_at(model, seg, 100 * MIB);
        if cached_pieces {
            // 200 MiB free in the segment's middle, pinned by a live block after it.
            t.alloc_at(model, seg + 300 * MIB, 100 * MIB);
        } else {
            t.alloc_at(model, seg + 100 * MIB, 300 * MIB);
        }
        t.oom(act, 128 * MIB, 138 << 30);
        let found = findings(&t.finish());
        let serious = serious(&found);
        assert_eq!(serious.len(), 1, "{}", describe(&found));
        let f = serious[0];
        assert_eq!(f.kind, FindingKind::Oom, "{}", describe(&found));
        assert_eq!(
            f.evidence.get("cause").map(|v| v.to_string()).as_deref(),
            Some("memory_cap")
        );
        assert!(
            f.summary.contains("138 GiB free") && f.summary.contains("memory cap"),
            "{}",
            f.summary
        );
        assert!(
            f.fix.contains("torch.cuda.set_per_process_memory_fraction"),
            "{}",
            f.fix
        );
        assert!(!f.fix.contains("max_split_size_mb"), "{}", f.fix);
        // Cached pieces that would have covered the request are named, and the setting that
        // frees them is offered beside the cap.
        assert_eq!(
            f.summary
                .contains("200 MiB of the reserved memory was unallocated"),
            cached_pieces,
            "{}",
            f.summary
        );
        assert_eq!(
            f.fix.contains("expandable_segments:True"),
            cached_pieces,
            "{}",
            f.fix
        );
    }
}

/// A usable free block large enough, kept from a smaller request by `max_split_size_mb`.
#[test]
fn oom_beside_an_oversize_free_block_is_the_split_limit() {
    let mut t = Trace::new();
    t.snap.config.max_split_size = Some(64 * MIB);
    let model = t.site("model.py", 5, "build");
    let act = t.site("model.py", 9, "forward");
    let seg = t.segment_alloc(Some(model), 300 * MIB);
    t.alloc_at(model, seg, MIB);
    t.oom(act, 30 * MIB, 0);
    let found = findings(&t.finish());
    let f = found
        .iter()
        .find(|f| f.severity == Severity::Error)
        .unwrap_or_else(|| panic!("no error: {}", describe(&found)));
    assert_eq!(f.kind, FindingKind::Oom);
    assert_eq!(
        f.evidence.get("cause").map(|v| v.to_string()).as_deref(),
        Some("max_split_size")
    );
    assert!(
        f.summary.contains("a cached free block of 299 MiB"),
        "{}",
        f.summary
    );
    assert!(f.fix.contains("max_split_size_mb"), "{}", f.fix);
}

/// OOMs of different causes are one finding per cause.
#[test]
fn ooms_of_different_causes_are_reported_apart() {
    let mut t = Trace::new().capacity(1 << 30);
    let act = t.site("model.py", 9, "forward");
    let seg = t.segment_alloc(Some(act), 100 * MIB);
    t.alloc_at(act, seg, 100 * MIB);
    t.oom(act, 40 * MIB, 10 * MIB);
    t.oom(act, 50 * MIB, 10 * MIB);
    t.oom(act, 60 * MIB, 500 * MIB);
    let found = findings(&t.finish());
    let ooms: Vec<_> = found
        .iter()
        .filter(|f| f.kind == FindingKind::Oom)
        .collect();
    assert_eq!(ooms.len(), 2, "{}", describe(&found));
    let by_cause = |cause: &str| {
        ooms.iter()
            .find(|f| f.evidence.get("cause").map(|v| v.to_string()).as_deref() == Some(cause))
            .unwrap_or_else(|| panic!("no {cause}: {}", describe(&found)))
    };
    let in_use = by_cause("memory_in_use");
    assert_eq!((in_use.count, in_use.bytes), (2, 50 * MIB));
    let cap = by_cause("memory_cap");
    assert_eq!((cap.count, cap.bytes), (1, 60 * MIB));
}

#[test]
fn split_free_memory_without_pressure_is_at_most_information() {
    let mut t = Trace::new();
    let model = t.site("model.py", 5, "build");
    let seg = t.segment_alloc(Some(model), 512 * MIB);
    t.alloc_at(model, seg, MIB);
    t.add_segment(seg, &[(0, MIB, true), (MIB, 511 * MIB, false)], 512 * MIB);
    let found = findings(&t.finish());
    assert!(serious(&found).is_empty(), "{}", describe(&found));
    let f = found
        .iter()
        .find(|f| f.kind == FindingKind::Fragmentation && f.severity == Severity::Info)
        .unwrap_or_else(|| panic!("no information: {}", describe(&found)));
    assert!(f.fix.contains("expandable_segments:True"), "{}", f.fix);
    // Byte figures read as bytes in the text report, the largest free block too.
    let sentence = vramscope_render::evidence_sentence(f);
    assert!(
        sentence.contains("largest free block 511 MiB"),
        "{sentence}"
    );
}

/// Free memory inside expandable segments is not split memory (PyTorch's own
/// `inactive_split_bytes` leaves it out): its whole pages go back to the device on demand, and
/// `max_split_size_mb` does not apply there.
#[test]
fn free_memory_in_expandable_segments_is_not_reported_as_split() {
    let mut t = Trace::new();
    t.snap.config.expandable_segments = true;
    let model = t.site("model.py", 5, "build");
    let seg = t.segment_alloc(Some(model), 512 * MIB);
    t.alloc_at(model, seg, MIB);
    t.add_segment(seg, &[(0, MIB, true), (MIB, 511 * MIB, false)], 512 * MIB);
    t.snap.segments.last_mut().unwrap().expandable = true;
    let found = findings(&t.finish());
    assert!(
        !found.iter().any(|f| f.kind == FindingKind::Fragmentation),
        "{}",
        describe(&found)
    );

    // A plain segment beside expandable ones (made before the setting took effect) still
    // counts, and its fix names neither setting.
    let mut t = Trace::new();
    t.snap.config.expandable_segments = true;
    let model = t.site("model.py", 5, "build");
    let seg = t.segment_alloc(Some(model), 512 * MIB);
    t.alloc_at(model, seg, MIB);
    t.add_segment(seg, &[(0, MIB, true), (MIB, 511 * MIB, false)], 512 * MIB);
    let found = findings(&t.finish());
    let f = found
        .iter()
        .find(|f| f.kind == FindingKind::Fragmentation)
        .unwrap_or_else(|| panic!("no fragmentation: {}", describe(&found)));
    assert_eq!(f.severity, Severity::Info);
    assert!(
        f.summary.contains("plain (not expandable) segments"),
        "{}",
        f.summary
    );
    assert!(!f.fix.contains("max_split_size_mb"), "{}", f.fix);
    assert!(!f.fix.contains("expandable_segments:True"), "{}", f.fix);
}

#[test]
fn frees_of_blocks_allocated_before_the_trace_are_ignored() {
    let mut t = Trace::new();
    let site = t.site("x.py", 1, "f");
    // Blocks allocated before recording: only their frees are in the trace.
    t.free(0xdead_0000, 4 * MIB);
    t.free(0xbeef_0000, 4 * MIB);
    for _ in 0..4 {
        t.step();
        let a = t.alloc(site, MIB);
        t.free(a, MIB);
    }
    let snapshot = t.finish();
    let view = ModelView::new(&snapshot);
    assert_eq!(view.totals().unmatched_frees, 2);
    assert_eq!(view.baseline_allocated(), 8 * MIB);
    assert_eq!(view.peak_allocated(), 8 * MIB);
    assert_eq!(view.end_allocated(), 0);
    assert!(serious(&findings(&snapshot)).is_empty());
}

#[test]
fn findings_are_deterministic_and_sorted() {
    let snapshot = leaky_loop(10);
    let a = findings(&snapshot);
    let b = findings(&snapshot);
    assert_eq!(a, b);
    for pair in a.windows(2) {
        assert!(pair[0].severity >= pair[1].severity);
    }
    // The sink receives them in the same order.
    let mut sink = VecSink::new();
    detect::run_all(&snapshot, &DetectOptions::default(), &mut sink);
    assert_eq!(sink.findings, a);
    struct Counter(usize);
    impl FindingSink for Counter {
        fn report(&mut self, _: Finding) {
            self.0 += 1;
        }
    }
    let mut counter = Counter(0);
    detect::run_all(&snapshot, &DetectOptions::default(), &mut counter);
    assert_eq!(counter.0, a.len());
}

#[test]
fn no_steps_means_no_per_step_findings() {
    let mut t = Trace::new();
    let site = t.site("x.py", 1, "f");
    for _ in 0..50 {
        t.alloc(site, 512);
        t.transfer(site, TransferDirection::DeviceToHost, 4);
    }
    let found = findings(&t.finish());
    assert!(serious(&found).is_empty(), "{}", describe(&found));
}

#[test]
fn step_marker_rebuilds_steps_from_annotations() {
    let mut t = Trace::new();
    let leak = t.site("train.py", 3, "train");
    for _ in 0..5 {
        t.alloc(leak, 512);
        t.alloc(leak, 512);
    }
    let mut snapshot = t.finish();
    // One annotation before every pair of allocations (events are 1 µs apart).
    for i in 0..5u64 {
        snapshot.annotations.push(Annotation {
            name: "Optimizer.step#AdamW.step".to_string(),
            stage: "START".to_string(),
            time_ns: i * 2000,
            device: 0,
        });
        snapshot.annotations.push(Annotation {
            name: "Optimizer.step#AdamW.step".to_string(),
            stage: "END".to_string(),
            time_ns: i * 2000 + 500,
            device: 0,
        });
    }
    assert!(serious(&findings(&snapshot)).is_empty());
    assert_eq!(apply_step_marker(&mut snapshot, "nothing like it"), 0);
    assert_eq!(apply_step_marker(&mut snapshot, "AdamW"), 5);
    assert_eq!(snapshot.last_step(), 5);
    let found = findings(&snapshot);
    assert_eq!(found[0].kind, FindingKind::RetainedPerStep);
    assert_eq!(found[0].per_step.unwrap().count, 2.0);
}

#[test]
fn options_change_thresholds() {
    let mut t = clean_loop(0);
    let item = t.site("train.py", 44, "log");
    for _ in 0..5 {
        t.step();
        for _ in 0..4 {
            t.transfer(item, TransferDirection::DeviceToHost, 4);
        }
    }
    let snapshot = t.finish();
    assert!(!findings(&snapshot)
        .iter()
        .any(|f| f.kind == FindingKind::SyncInLoop));
    let mut options = DetectOptions::default();
    options.sync_per_step = 4.0;
    assert!(detect(&snapshot, &options)
        .iter()
        .any(|f| f.kind == FindingKind::SyncInLoop));
}

#[test]
fn explicit_syncs_count_from_one_per_step_and_tiny_copies_from_eight() {
    // One rule for every face (`vramscope report`, `vramscope.report()`): an explicit sync is a
    // wait that was reported as such, so more than one per step names the site; one per step
    // is the advice itself and no finding (issue 43: its cost goes in the header); a tiny copy
    // is only a guess at a sync, so it takes `sync_per_step` (8) of them.
    let sync_finding = |explicit: usize, copies: usize| {
        let mut t = clean_loop(0);
        let site = t.site("train.py", 44, "log");
        for _ in 0..5 {
            t.step();
            for _ in 0..explicit {
                t.sync(site);
            }
            for _ in 0..copies {
                t.transfer(site, TransferDirection::DeviceToHost, 4);
            }
        }
        findings(&t.finish())
            .into_iter()
            .find(|f| f.kind == FindingKind::SyncInLoop)
            .map(|f| (f.severity, f.per_step.map(|p| p.count)))
    };
    assert_eq!(sync_finding(1, 0), None);
    assert_eq!(sync_finding(3, 0), Some((Severity::Warning, Some(3.0))));
    assert_eq!(sync_finding(0, 1), None);
    assert_eq!(sync_finding(0, 7), None);
    assert_eq!(sync_finding(0, 8), Some((Severity::Warning, Some(8.0))));
    assert_eq!(sync_finding(1, 2), Some((Severity::Warning, Some(3.0))));
}
