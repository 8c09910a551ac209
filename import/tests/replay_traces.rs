//! Replay of the real traces in `../shared/traces` (or `$VRAMSCOPE_TRACES`): PyTorch's policy
//! replayed from the state each trace started in must reproduce PyTorch's own segment
//! allocations. Skipped with one printed line when the traces are absent.

use std::path::{Path, PathBuf};

use vramscope_import as import;
use vramscope_replay::{replay, sweep, ReplayOptions};

fn trace(name: &str) -> Option<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    vramscope_testkit::shared_trace(&root, name)
}

const MIB: u64 = 1 << 20;

#[test]
fn decomfl_replay_matches_pytorch() {
    let Some(path) = trace("decomfl_opt125m_zo_fedlearn.pickle") else {
        return;
    };
    let snapshot = import::load(&path).unwrap();
    let result = replay(&snapshot, &ReplayOptions::default(), &mut |_, _| {});
    assert_eq!(
        result.restored_segments, 0,
        "recording started from an empty device"
    );
    assert_eq!(result.figures.segment_allocs, Some(61));
    assert_eq!(result.original.segment_allocs, Some(61));
    assert_eq!(result.figures.peak_reserved, Some(1810 * MIB));
    assert_eq!(result.figures.peak_reserved, result.original.peak_reserved);
    assert_eq!(result.figures.events, 7946 + 7549);
    assert_eq!(result.unmatched_frees, 0);
}

#[test]
fn cs336_replay_starts_late_and_still_matches_pytorch() {
    let Some(path) = trace("cs336_medium_ctx512_train_step.pickle") else {
        return;
    };
    let snapshot = import::load(&path).unwrap();
    let result = replay(&snapshot, &ReplayOptions::default(), &mut |_, _| {});
    assert_eq!(
        result.restored_segments, 399,
        "400 segments at the end, 1 allocated in the trace"
    );
    assert_eq!(result.original.segment_allocs, Some(1));
    assert_eq!(result.figures.segment_allocs, Some(1), "{result:#?}");
    assert_eq!(result.unmatched_frees, 0);
}

#[test]
fn sweep_on_decomfl_finds_settings_that_fit_2_gib() {
    let Some(path) = trace("decomfl_opt125m_zo_fedlearn.pickle") else {
        return;
    };
    let snapshot = import::load(&path).unwrap();
    let rows = sweep(&snapshot, Some(2 << 30), &mut |_, _| {});
    assert!(rows[0].fits);
    let expandable = rows
        .iter()
        .find(|r| r.config.contains("expandable_segments"))
        .unwrap();
    assert!(expandable.result.figures.peak_reserved < Some(1810 * MIB));
}

#[test]
fn compact_policy_reserves_within_3_percent_and_never_more_than_pytorch() {
    use vramscope_model::AllocatorConfig;
    for (name, bound) in [
        ("decomfl_opt125m_zo_fedlearn.pickle", Some(1.03)),
        ("cs336_medium_ctx512_train_step.pickle", Some(1.03)),
        ("hta_ddp_rank1_v100_profile_memory.trace.json.gz", None),
    ] {
        let Some(path) = trace(name) else {
            continue;
        };
        let snapshot = import::load(&path).unwrap();
        let run = |conf: &str| {
            let mut options = ReplayOptions::default();
            options.config = AllocatorConfig::parse(conf).unwrap();
            replay(&snapshot, &options, &mut |_, _| {})
        };
        let pytorch = run("");
        let compact = run("policy:compact");
        let reserved = compact.figures.peak_reserved.unwrap();
        assert!(
            reserved <= pytorch.figures.peak_reserved.unwrap(),
            "{name}: compact reserves {reserved}, pytorch {:?}",
            pytorch.figures.peak_reserved
        );
        if let Some(bound) = bound {
            let allocated = compact.original.peak_allocated.unwrap() as f64;
            let ratio = reserved as f64 / allocated;
            assert!(
                ratio <= bound,
                "{name}: {ratio:.4}× the trace's peak allocated"
            );
        }
    }
}
