//! Findings linear in the trace (issue 44, item 2): every list a finding carries is bounded
//! (the largest entries, then how many more), so a trace of thousands of sites that each keep a
//! block every step makes a report and a peak of memory a constant times its size. Each
//! `retained_per_step` finding used to list every other site retained in the same steps:
//! 5,000 sites over 10 steps (a 306 KB pickle) made a 297 MB text report.
//!
//! The traces are generated here; the input's size is that of the PyTorch pickle the exporter
//! writes for them, the form in which such a file reaches a user. A counting allocator measures
//! the peak of heap memory while the report is built and rendered.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

use proptest::prelude::*;
use vramscope_analysis::report::{build_report, ReportOptions};
use vramscope_export::to_pytorch_pickle;
use vramscope_model::Snapshot;
use vramscope_render::{render, Format};
use vramscope_testkit::Trace;

/// The system allocator, counting the bytes live and their high mark.
struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static HIGH: AtomicUsize = AtomicUsize::new(0);

/// One test at a time: the counters are the process's, and the tests of this binary run on
/// threads of their own, so a measurement taken beside another test would count both.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Holds the process's counters for the calling test until the guard drops.
fn alone() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

// SAFETY: every call is forwarded to the system allocator with its own arguments; the
// counters are plain atomics.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's layout is passed through unchanged.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            let now = LIVE.fetch_add(layout.size(), Ordering::Relaxed) + layout.size();
            HIGH.fetch_max(now, Ordering::Relaxed);
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `alloc` with this layout.
        unsafe { System.dealloc(ptr, layout) };
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// `sites` lines of one loop that each keep a block every step for `steps` steps (a list per
/// line), the block of line `k` being `512 << (k % sizes)` bytes.
fn many_sites(sites: u32, steps: u32, sizes: u32) -> Snapshot {
    let mut t = Trace::new();
    let ids: Vec<_> = (0..sites)
        .map(|k| t.site("train.py", 100 + k, "train"))
        .collect();
    for _ in 0..steps {
        t.step();
        for (k, &id) in ids.iter().enumerate() {
            t.alloc(id, 512 << (k as u32 % sizes.max(1)));
        }
    }
    t.finish()
}

/// The input's size, the report's size in every text format, and the heap's high mark above
/// its level before the report, for `snapshot`.
fn measure(snapshot: &Snapshot) -> (usize, usize, usize, usize) {
    let input = to_pytorch_pickle(snapshot)
        .expect("the trace exports")
        .len();
    let before = LIVE.load(Ordering::Relaxed);
    HIGH.store(before, Ordering::Relaxed);
    let report = build_report(snapshot, &ReportOptions::default());
    let text = render(&report, Format::Text, false).len();
    let json = render(&report, Format::Json, false).len();
    let markdown = render(&report, Format::Markdown, false).len();
    let output = text.max(json).max(markdown);
    let high = HIGH.load(Ordering::Relaxed).saturating_sub(before);
    for f in &report.findings {
        assert!(
            f.sites.len() <= 10,
            "{} sites in one finding",
            f.sites.len()
        );
        if let Some(list) = f.evidence.get("same_steps_as") {
            let named = list.to_string().matches("train.py:").count();
            assert!(named <= 5, "{named} sites named in one list");
        }
    }
    (input, output, high, report.findings.len())
}

/// The attack of the issue: 5,000 sites over 10 steps. The report stays within a small
/// multiple of the file, where it was a thousand times the file.
#[test]
fn five_thousand_sites_over_ten_steps_make_a_report_linear_in_the_file() {
    let _alone = alone();
    let snapshot = many_sites(5_000, 10, 1);
    let (input, output, high, findings) = measure(&snapshot);
    assert!(findings >= 5_000, "{findings} findings");
    assert!(
        output <= 8 * input,
        "report of {output} bytes for a {input}-byte file"
    );
    assert!(
        high <= 64 * input,
        "{high} bytes of memory for a {input}-byte file"
    );
}

proptest! {
    #![proptest_config(vramscope_testkit::props::config(6))]

    /// Whatever the number of sites, steps and sizes, the report and the memory it takes are
    /// bounded by a constant times the input.
    #[test]
    fn findings_are_linear_in_the_trace(
        sites in 50u32..1_500,
        steps in 4u32..12,
        sizes in 1u32..6,
    ) {
        let _alone = alone();
        let snapshot = many_sites(sites, steps, sizes);
        let (input, output, high, _) = measure(&snapshot);
        prop_assert!(output <= 8 * input, "report of {} bytes for a {}-byte file", output, input);
        prop_assert!(high <= 64 * input, "{} bytes of memory for a {}-byte file", high, input);
    }
}
