//! Tests of the importers (`vramscope_import`) against the real traces in
//! `../shared/traces` (or `$VRAMSCOPE_TRACES`), checking the figures their README states.
//!
//! The traces are never part of the project: when the folder is absent each test prints one
//! line saying so and passes. Each test also prints how long the import took, for information
//! only (run with `--release --nocapture` for meaningful figures).

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::time::Instant;

use vramscope_import::{self as import, sites, ImportOptions};
use vramscope_model::{BlockState, Event, EventKind, Pool, Snapshot, SnapshotSource};

const MIB: u64 = 1 << 20;

/// A shared trace, or `None` (after printing one line) when it is absent; with
/// `VRAMSCOPE_REQUIRE_TRACES=1`, an absent trace fails the test instead.
fn trace(name: &str) -> Option<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    vramscope_testkit::shared_trace(&root, name)
}

/// Imports one trace, printing the time it took.
fn load(name: &str) -> Option<Snapshot> {
    let path = trace(name)?;
    let start = Instant::now();
    let snapshot = match import::load(&path) {
        Ok(s) => s,
        Err(e) => panic!("{e}"),
    };
    println!("imported {name} in {:?}", start.elapsed());
    Some(snapshot)
}

fn count(events: &[Event], kind: EventKind) -> usize {
    events.iter().filter(|e| e.kind == kind).count()
}

/// What walking the alloc and free events of one device shows.
struct Walk {
    /// Peak of the bytes allocated and not yet freed (block sizes).
    peak: u64,
    /// Peak of the bytes requested and not yet freed.
    requested_peak: u64,
    /// Frees of addresses with no live allocation.
    unmatched_frees: usize,
    /// Address, block size and requested size of the blocks still live at the end.
    live: HashMap<u64, (u64, u64)>,
}

/// Walks allocations and frees (`free` is the kind that releases a block).
fn walk(events: &[Event], free: EventKind) -> Walk {
    let mut live = HashMap::new();
    let (mut current, mut current_requested) = (0u64, 0u64);
    let (mut peak, mut requested_peak) = (0u64, 0u64);
    let mut unmatched_frees = 0;
    for e in events {
        if e.kind == EventKind::Alloc {
            live.insert(e.addr, (e.size, e.requested));
            current += e.size;
            current_requested += e.requested;
            peak = peak.max(current);
            requested_peak = requested_peak.max(current_requested);
        } else if e.kind == free {
            match live.remove(&e.addr) {
                Some((size, requested)) => {
                    assert_eq!(size, e.size, "free of {:#x} with another size", e.addr);
                    current -= size;
                    current_requested -= requested;
                }
                None => unmatched_frees += 1,
            }
        }
    }
    Walk {
        peak,
        requested_peak,
        unmatched_frees,
        live,
    }
}

/// Checks that steps never decrease along the events and that the marks agree with them.
fn check_steps(s: &Snapshot) {
    for pair in s.events.windows(2) {
        assert!(pair[0].step <= pair[1].step, "steps go backwards");
    }
    for (k, mark) in s.steps.iter().enumerate() {
        assert_eq!(mark.step, k as u64 + 1);
        if let Some(first) = s.events.iter().find(|e| u64::from(e.step) >= mark.step) {
            assert_eq!(first.seq, mark.seq);
        }
    }
}

#[test]
fn decomfl_pickle() {
    let Some(s) = load("decomfl_opt125m_zo_fedlearn.pickle") else {
        return;
    };
    assert_eq!(s.source, SnapshotSource::Pytorch);
    assert_eq!(s.device.index, 0);
    let ev = &s.events;
    assert_eq!(ev.len(), 23_105);
    assert_eq!(count(ev, EventKind::SegmentAlloc), 61);
    assert_eq!(count(ev, EventKind::SegmentFree), 0);
    let segment_bytes: u64 = ev
        .iter()
        .filter(|e| e.kind == EventKind::SegmentAlloc)
        .map(|e| e.size)
        .sum();
    assert_eq!(segment_bytes, 1_810 * MIB);
    assert_eq!(count(ev, EventKind::Alloc), 7_946);
    assert_eq!(count(ev, EventKind::FreeRequested), 7_549);
    assert_eq!(count(ev, EventKind::FreeCompleted), 7_549);

    // Every free matches an earlier alloc, and the blocks live at the end are exactly the
    // active blocks of the segments.
    let w = walk(ev, EventKind::FreeRequested);
    assert_eq!(w.unmatched_frees, 0);
    assert_eq!(w.live.len(), 397);
    let active: HashSet<u64> = s
        .segments
        .iter()
        .flat_map(|seg| &seg.blocks)
        .filter(|b| b.state != BlockState::Inactive)
        .map(|b| b.address)
        .collect();
    assert_eq!(active.len(), 397);
    assert_eq!(w.live.keys().copied().collect::<HashSet<_>>(), active);
    assert_eq!(w.requested_peak / MIB, 1_701);
    assert_eq!(s.stats.requested_bytes.all.peak, w.requested_peak);
    // Allocated bytes count whole blocks, which the trace records only as requests: the
    // importer takes them from a replay whose device calls are PyTorch's, so the peak is
    // PyTorch's own `allocated_bytes` peak.
    assert_eq!(w.peak, 1_790_894_592);
    assert_eq!(s.stats.allocated_bytes.all.peak, w.peak);

    // Segments (each with a `segment_pool_id` tuple) and statistics.
    assert_eq!(s.segments.len(), 61);
    let small = s
        .segments
        .iter()
        .filter(|seg| seg.pool == Pool::Small)
        .count();
    assert_eq!(small, 17);
    assert_eq!(s.stats.reserved_bytes.all.current, 1_810 * MIB);
    assert_eq!(s.stats.reserved_bytes.all.peak, 1_810 * MIB);
    assert_eq!(s.stats.segment.all.current, 61);
    assert_eq!(s.stats.active.all.current, 397);
    assert_eq!(s.stats.num_device_alloc, 61);
    for seg in &s.segments {
        let covered: u64 = seg.blocks.iter().map(|b| b.size).sum();
        assert_eq!(
            covered, seg.total_size,
            "blocks cover segment {:#x}",
            seg.address
        );
    }
    assert_eq!(s.config.max_split_size, None);
    assert!(!s.config.expandable_segments);

    // Real Python frames; the first event (moving the model to the GPU) is named by the
    // user's script, not by torch or transformers.
    let first = s.site(ev[0].site()).expect("the first event has a stack");
    assert_eq!(first.function, "setup_server_and_clients");
    assert!(first.file.ends_with("decomfl_main.py"), "{}", first.file);
    assert_eq!(first.line, 66);
    assert!(first.frames.len() > 3);
    assert!(ev
        .iter()
        .filter(|e| e.kind == EventKind::Alloc)
        .all(|e| e.site.is_some()));
    let distinct: HashSet<_> = s.sites.iter().map(|c| &c.frames).collect();
    assert_eq!(distinct.len(), s.sites.len(), "stacks are interned once");

    // Times and steps: two `Optimizer.zero_grad` starts.
    assert_eq!(ev[0].time_ns, 0);
    assert_eq!(s.epoch_unix_ns, 1_763_324_225_770_003_000);
    assert_eq!(s.annotations.len(), 8);
    assert_eq!(s.steps.len(), 2);
    assert!(s.steps[0].label.starts_with("Optimizer.zero_grad#"));
    check_steps(&s);
}

#[test]
fn decomfl_pickle_matches_flattened_csv() {
    let Some(csv) = trace("decomfl_opt125m_zo_fedlearn.events.csv") else {
        return;
    };
    let Some(s) = load("decomfl_opt125m_zo_fedlearn.pickle") else {
        return;
    };
    let csv = std::fs::read_to_string(csv).expect("the CSV sits next to the pickle");
    let rows: Vec<&str> = csv.lines().skip(1).filter(|l| !l.is_empty()).collect();
    assert_eq!(rows.len(), s.events.len());
    let t0: u64 = rows[0].split(',').nth(5).unwrap().parse().unwrap();
    for (row, e) in rows.iter().zip(&s.events) {
        let f: Vec<&str> = row.split(',').collect();
        assert_eq!(f[0].parse::<u64>().unwrap(), e.seq);
        assert_eq!(f[1], e.kind.name());
        assert_eq!(f[2].parse::<u64>().unwrap(), e.addr);
        // The CSV has PyTorch's recorded size: the request, for block events.
        let recorded = match e.kind {
            EventKind::Alloc | EventKind::FreeRequested | EventKind::FreeCompleted => e.requested,
            _ => e.size,
        };
        assert_eq!(f[3].parse::<u64>().unwrap(), recorded);
        assert_eq!(f[4].parse::<u64>().unwrap(), e.stream);
        assert_eq!((f[5].parse::<u64>().unwrap() - t0) * 1000, e.time_ns);
    }
}

#[test]
fn cs336_pickle() {
    let Some(s) = load("cs336_medium_ctx512_train_step.pickle") else {
        return;
    };
    let ev = &s.events;
    assert_eq!(ev.len(), 22_332);
    assert_eq!(count(ev, EventKind::Alloc), 7_591);
    assert_eq!(count(ev, EventKind::FreeRequested), 7_370);
    assert_eq!(count(ev, EventKind::FreeCompleted), 7_370);
    assert_eq!(count(ev, EventKind::SegmentAlloc), 1);

    // 438 blocks were allocated before recording began; their frees are kept.
    let w = walk(ev, EventKind::FreeRequested);
    assert_eq!(w.unmatched_frees, 438);

    // 400 segments, exactly 12,074 MiB.
    assert_eq!(s.segments.len(), 400);
    let reserved: u64 = s.segments.iter().map(|seg| seg.total_size).sum();
    assert_eq!(reserved, 12_074 * MIB);
    assert_eq!(s.stats.reserved_bytes.all.current, 12_074 * MIB);
    assert_eq!(s.stats.segment.all.current, 400);
    let active = s
        .segments
        .iter()
        .flat_map(|seg| &seg.blocks)
        .filter(|b| b.state == BlockState::ActiveAllocated)
        .count() as u64;
    assert_eq!(s.stats.allocation.all.current, active);
    // Blocks live at the end that were allocated inside the trace carry its call site.
    for (addr, _) in w.live.iter().take(50) {
        let block = s
            .segments
            .iter()
            .flat_map(|seg| &seg.blocks)
            .find(|b| b.address == *addr)
            .expect("a live block is in the segments");
        assert!(block.site.is_some());
    }

    // C++ frames are present but never chosen when a Python frame of the user exists.
    assert!(s
        .sites
        .iter()
        .any(|c| c.frames.iter().any(|f| f.file == "??" && f.line == 0)));
    let framework = ImportOptions::default().framework_paths;
    for site in &s.sites {
        let has_user = site
            .frames
            .iter()
            .any(|f| !sites::is_framework_frame(f, &framework));
        if has_user {
            assert_ne!(site.file, "??");
            assert!(site.line > 0);
            assert!(!site.file.contains("site-packages"), "{}", site.file);
        }
    }
    let first = s.site(ev[0].site()).unwrap();
    assert!(
        first.file.ends_with("cs336_basics/model.py"),
        "{}",
        first.file
    );
    assert_eq!((first.line, first.function.as_str()), (54, "forward"));

    // The optimizer step's START begins step 1.
    assert_eq!(s.annotations.len(), 2);
    assert_eq!(s.steps.len(), 1);
    assert_eq!(s.steps[0].label, "Optimizer.step#AdamW.step");
    check_steps(&s);
    let in_step = ev.iter().filter(|e| e.step == 1).count();
    assert!(in_step > 0 && in_step < ev.len());
}

#[test]
fn cs336_step_marker() {
    let Some(path) = trace("cs336_medium_ctx512_train_step.pickle") else {
        return;
    };
    let mut options = ImportOptions::default();
    options.step_marker = Some("step".to_string());
    let s = import::load_with(&path, &options).unwrap();
    assert!(!s.steps.is_empty());
    assert!(s.steps.iter().all(|m| m.label == "step"));
    check_steps(&s);
}

#[test]
fn hta_chrome_trace() {
    let Some(s) = load("hta_ddp_rank1_v100_profile_memory.trace.json.gz") else {
        return;
    };
    assert_eq!(s.source, SnapshotSource::ChromeTrace);
    assert_eq!(s.device.index, 1);
    assert_eq!(s.device.name, "Tesla V100-SXM2-32GB");
    assert_eq!(s.device.capacity, 34_089_730_048);
    let ev = &s.events;
    // The memory events and the one host wait the trace shows (its `cudaDeviceSynchronize`;
    // its 6,060 `cudaStreamWaitEvent` calls wait on the device, and its 2,040 copies stay on
    // the device).
    assert_eq!(ev.len(), 26_771);
    assert_eq!(count(ev, EventKind::Sync), 1);
    assert_eq!(count(ev, EventKind::Alloc), 13_385);
    assert_eq!(count(ev, EventKind::FreeCompleted), 13_385);
    // All paired: nothing allocated inside the window is live at its end.
    let w = walk(ev, EventKind::FreeCompleted);
    assert_eq!(w.unmatched_frees, 0);
    assert!(w.live.is_empty());
    for pair in ev.windows(2) {
        assert!(pair[0].time_ns <= pair[1].time_ns);
    }

    let labels: Vec<&str> = s.steps.iter().map(|m| m.label.as_str()).collect();
    assert_eq!(
        labels,
        [
            "ProfilerStep#2",
            "ProfilerStep#3",
            "ProfilerStep#4",
            "ProfilerStep#5",
            "ProfilerStep#6"
        ]
    );
    check_steps(&s);
    assert!(ev.iter().all(|e| (1..=5).contains(&e.step)));

    assert_eq!(s.stats.allocated_bytes.all.peak / MIB, 6_322);
    assert_eq!(s.stats.reserved_bytes.all.peak, 12_190 * MIB);
    assert!(s.stats.allocated_bytes.all.current <= s.stats.allocated_bytes.all.peak);
    assert!(s.epoch_unix_ns > 1_600_000_000 * 1_000_000_000);
}
