//! The detectors give the same findings, in the same order, on one thread and on many (issue
//! 47): `run_all_view` runs them on `DetectOptions::threads` threads, each into a list of its
//! own, joined in the detectors' order before the sort. Checked on the shared traces and on
//! generated loops that plant many findings of every kind, for the findings and for `report`'s
//! JSON and text as the command line prints them.

use std::path::Path;

use proptest::prelude::*;
use vramscope_analysis::detect::{
    self, detect, detector_threads, DetectOptions, Finding, FindingKind, DETECTORS,
    PARALLEL_MIN_EVENTS,
};
use vramscope_analysis::model_view::ModelView;
use vramscope_analysis::report::{build_report, ReportOptions};
use vramscope_model::{Snapshot, TransferDirection};
use vramscope_render::{render, Format};
use vramscope_testkit::{clean_loop, MIB};

/// The thread counts compared with one: two (this machine's cores), an odd split, one thread
/// a detector, and more than there are detectors.
const SPLITS: [usize; 4] = [2, 3, 6, 16];

fn options(threads: usize) -> DetectOptions {
    let mut options = DetectOptions::default();
    options.threads = Some(threads);
    options
}

fn findings_on(snapshot: &Snapshot, threads: usize) -> Vec<Finding> {
    detect(snapshot, &options(threads))
}

/// `report`'s JSON and text of `snapshot` with the detectors on `threads` threads.
fn report_on(snapshot: &Snapshot, threads: usize) -> (String, String) {
    let mut report_options = ReportOptions::default();
    report_options.detect = options(threads);
    let report = build_report(snapshot, &report_options);
    (
        render(&report, Format::Json, false),
        render(&report, Format::Text, false),
    )
}

/// Asserts that every split gives the findings and the report of one thread, byte for byte.
fn assert_same_on_every_split(snapshot: &Snapshot) -> Vec<Finding> {
    let one = findings_on(snapshot, 1);
    let (json, text) = report_on(snapshot, 1);
    for threads in SPLITS {
        assert_eq!(findings_on(snapshot, threads), one, "{threads} threads");
        let (json_n, text_n) = report_on(snapshot, threads);
        assert!(
            json_n == json,
            "the JSON report differs on {threads} threads"
        );
        assert!(
            text_n == text,
            "the text report differs on {threads} threads"
        );
    }
    assert_eq!(detect(snapshot, &DetectOptions::default()), one);
    one
}

fn shared(name: &str) -> Option<Snapshot> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let path = vramscope_testkit::shared_trace(&root, name)?;
    Some(vramscope_import::load(&path).expect("the shared trace imports"))
}

#[test]
fn shared_traces_give_the_same_findings_on_one_thread_and_many() {
    for name in [
        "decomfl_opt125m_zo_fedlearn.pickle",
        "cs336_medium_ctx512_train_step.pickle",
        "hta_ddp_rank1_v100_profile_memory.trace.json.gz",
    ] {
        let Some(snapshot) = shared(name) else {
            continue;
        };
        let found = assert_same_on_every_split(&snapshot);
        assert!(!found.is_empty(), "{name}: every trace has its holders");
    }
}

/// What a generated loop plants in each of its steps.
#[derive(Clone, Debug)]
struct Plan {
    steps: u64,
    /// Sites (by line) that keep a block of this many KiB every step.
    leaks: Vec<(u32, u64)>,
    /// Sites that wait for the device this many times a step, by explicit syncs or tiny copies.
    waits: Vec<(u32, u32, bool)>,
    /// Sites that upload this many MiB every step.
    uploads: Vec<(u32, u64)>,
    /// Sites that call `empty_cache()` every step after a segment of its own.
    churn: Vec<u32>,
    /// A failed allocation of this many MiB at the end, beside segments split by small blocks
    /// kept alive.
    oom: Option<u64>,
}

fn plans() -> impl Strategy<Value = Plan> {
    (
        3u64..9,
        prop::collection::vec((0u32..40, 1u64..4096), 0..5),
        prop::collection::vec((0u32..40, 0u32..30, any::<bool>()), 0..4),
        prop::collection::vec((0u32..40, 1u64..16), 0..3),
        prop::collection::vec(0u32..40, 0..3),
        prop::option::of(8u64..200),
    )
        .prop_map(|(steps, leaks, waits, uploads, churn, oom)| Plan {
            steps,
            leaks,
            waits,
            uploads,
            churn,
            oom,
        })
}

/// A clean training loop with `plan`'s findings planted in it.
fn busy_loop(plan: &Plan) -> Snapshot {
    let mut t = clean_loop(0);
    let act = t.site("model.py", 55, "Model.forward");
    let kept = t.site("model.py", 5, "build");
    let leaks: Vec<_> = plan
        .leaks
        .iter()
        .map(|&(line, kib)| (t.site("train.py", 100 + line, "train"), kib << 10))
        .collect();
    let waits: Vec<_> = plan
        .waits
        .iter()
        .map(|&(line, n, explicit)| (t.site("log.py", 200 + line, "log"), n, explicit))
        .collect();
    let uploads: Vec<_> = plan
        .uploads
        .iter()
        .map(|&(line, mib)| (t.site("data.py", 300 + line, "load"), mib * MIB))
        .collect();
    let churn: Vec<_> = plan
        .churn
        .iter()
        .map(|&line| t.site("train.py", 400 + line, "train"))
        .collect();
    for _ in 0..plan.steps {
        t.step();
        let a = t.alloc(act, 2 * MIB);
        for &(site, bytes) in &leaks {
            t.alloc(site, bytes);
        }
        for &(site, n, explicit) in &waits {
            for _ in 0..n {
                if explicit {
                    t.sync(site);
                } else {
                    t.transfer(site, TransferDirection::DeviceToHost, 4);
                }
            }
        }
        for &(site, bytes) in &uploads {
            t.transfer(site, TransferDirection::HostToDevice, bytes);
        }
        t.free(a, 2 * MIB);
        for &site in &churn {
            let seg = t.segment_alloc(Some(act), 20 * MIB);
            let b = t.alloc(act, 12 * MIB);
            t.free(b, 12 * MIB);
            t.segment_free(seg, 20 * MIB);
            t.empty_cache(site, 20 * MIB);
        }
    }
    if let Some(mib) = plan.oom {
        let mut segments = Vec::new();
        for _ in 0..4 {
            let seg = t.segment_alloc(Some(act), 20 * MIB);
            t.alloc_at(kept, seg, 2 * MIB);
            t.alloc_at(act, seg + 2 * MIB, 18 * MIB);
            t.free(seg + 2 * MIB, 18 * MIB);
            segments.push(seg);
        }
        t.oom(act, mib * MIB, 10 * MIB);
        for seg in segments {
            t.add_segment(
                seg,
                &[(0, 2 * MIB, true), (2 * MIB, 18 * MIB, false)],
                20 * MIB,
            );
        }
    }
    t.finish()
}

#[test]
fn a_busy_loop_gives_every_kind_of_finding_on_one_thread_and_many() {
    let plan = Plan {
        steps: 8,
        leaks: vec![(1, 512), (2, 2048), (3, 64)],
        waits: vec![(1, 20, false), (2, 3, true)],
        uploads: vec![(1, 12), (2, 9)],
        churn: vec![1, 2],
        oom: Some(40),
    };
    let found = assert_same_on_every_split(&busy_loop(&plan));
    // The property test below is worth something only if its loops give findings of every
    // detector: this one does.
    for kind in [
        FindingKind::RetainedPerStep,
        FindingKind::SyncInLoop,
        FindingKind::TransferHeavy,
        FindingKind::CacheChurn,
        FindingKind::Fragmentation,
        FindingKind::TopHolders,
    ] {
        assert!(
            found.iter().any(|f| f.kind == kind),
            "no {kind} finding in {found:#?}"
        );
    }
}

#[test]
fn the_thread_count_is_the_options_else_one_for_a_small_trace() {
    let snapshot = busy_loop(&Plan {
        steps: 4,
        leaks: vec![(1, 512)],
        waits: Vec::new(),
        uploads: Vec::new(),
        churn: Vec::new(),
        oom: None,
    });
    let view = ModelView::new(&snapshot);
    assert!(view.totals().events < PARALLEL_MIN_EVENTS);
    assert_eq!(detector_threads(&view, &DetectOptions::default()), 1);
    assert_eq!(detector_threads(&view, &options(0)), 1);
    assert_eq!(detector_threads(&view, &options(3)), 3);
    assert_eq!(detector_threads(&view, &options(99)), DETECTORS.len());
    // A sink receives the findings in the order `detect` returns them, on any split.
    let mut sunk = Vec::new();
    detect::run_all_view(&view, &options(4), &mut sunk);
    assert_eq!(sunk, findings_on(&snapshot, 1));
}

proptest! {
    #![proptest_config(vramscope_testkit::props::config(24))]

    #[test]
    fn generated_loops_give_the_same_findings_on_one_thread_and_many(plan in plans()) {
        let snapshot = busy_loop(&plan);
        let one = findings_on(&snapshot, 1);
        let (json, text) = report_on(&snapshot, 1);
        for threads in SPLITS {
            prop_assert_eq!(&findings_on(&snapshot, threads), &one, "{} threads", threads);
            let (json_n, text_n) = report_on(&snapshot, threads);
            prop_assert!(json_n == json, "the JSON report differs on {} threads", threads);
            prop_assert!(text_n == text, "the text report differs on {} threads", threads);
        }
    }
}
