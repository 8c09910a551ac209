//! Assertions for users' tests: "this training loop leaks nothing" and "this stays under a
//! memory budget".
//!
//! A test takes a snapshot from vramscope's allocator after a few steps and calls
//! [`check_no_leaks`] / [`check_peak_below`], which return `Err(CheckError)` carrying a
//! readable report, or the panicking [`assert_no_leaks`] / [`assert_peak_below`], which fail the
//! test with that report. Leaks are what `crate::detect::retained_per_step` finds; the peak comes
//! from the timeline of `crate::model_view` (or the snapshot's statistics, whichever is higher),
//! and the report names the call sites that held the most at the peak.

use std::fmt;
use std::fmt::Write as _;

use vramscope_model::{format_bytes, Snapshot};

use crate::detect::{self, DetectOptions, Finding};
use crate::model_view::ModelView;

/// A failed check, with the report that explains it.
#[derive(Clone, Debug, PartialEq)]
pub struct CheckError {
    /// What was checked (`"no leaks"`, `"peak below 1.00 GiB"`).
    pub check: String,
    /// The findings behind the failure (empty for a budget check).
    pub findings: Vec<Finding>,
    /// The readable report.
    pub report: String,
}

impl fmt::Display for CheckError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "vramscope check failed: {}\n{}", self.check, self.report)
    }
}

impl std::error::Error for CheckError {}

/// Checks that no call site keeps memory alive step after step, with default thresholds.
pub fn check_no_leaks(snapshot: &Snapshot) -> Result<(), CheckError> {
    check_no_leaks_with(snapshot, &DetectOptions::default())
}

/// Checks that no call site keeps memory alive step after step, with `options`.
pub fn check_no_leaks_with(snapshot: &Snapshot, options: &DetectOptions) -> Result<(), CheckError> {
    let view = ModelView::new(snapshot);
    let mut findings = Vec::new();
    detect::retained_per_step(&view, options, &mut findings);
    if findings.is_empty() {
        return Ok(());
    }
    detect::sort_findings(&mut findings);
    let mut report = String::new();
    for f in &findings {
        let function = if f.function.is_empty() {
            String::new()
        } else {
            format!(" ({})", f.function)
        };
        let _ = writeln!(
            report,
            "  {} at {}{}: {}",
            f.severity,
            f.site_label(),
            function,
            f.summary
        );
        let _ = writeln!(report, "    fix: {}", f.fix);
    }
    Err(CheckError {
        check: format!(
            "no leaks ({} call site(s) retain memory every step)",
            findings.len()
        ),
        findings,
        report,
    })
}

/// Checks that allocated bytes never went above `budget` bytes.
pub fn check_peak_below(snapshot: &Snapshot, budget: u64) -> Result<(), CheckError> {
    let view = ModelView::new(snapshot);
    let peak = view
        .peak_allocated()
        .max(snapshot.stats.allocated_bytes.all.peak);
    if peak <= budget {
        return Ok(());
    }
    let mut report = format!(
        "  peak allocated {} ({} bytes) is {} over the budget of {} ({} bytes)\n",
        format_bytes(peak),
        peak,
        format_bytes(peak - budget),
        format_bytes(budget),
        budget
    );
    let holders = view.live_at_peak();
    if !holders.is_empty() {
        let _ = writeln!(report, "  held at the peak:");
        for h in holders.iter().take(5) {
            let group = view.group(h.group);
            let function = if group.function.is_empty() {
                String::new()
            } else {
                format!(" ({})", group.function)
            };
            let _ = writeln!(
                report,
                "    {:>10} in {:>5} blocks  {}{}",
                format_bytes(h.bytes),
                h.blocks,
                group.label(),
                function
            );
        }
    }
    if view.baseline_allocated() > 0 {
        let _ = writeln!(
            report,
            "  {} was allocated before the trace began",
            format_bytes(view.baseline_allocated())
        );
    }
    Err(CheckError {
        check: format!("peak below {}", format_bytes(budget)),
        findings: Vec::new(),
        report,
    })
}

/// Panics with a report if any call site keeps memory alive step after step.
#[track_caller]
pub fn assert_no_leaks(snapshot: &Snapshot) {
    if let Err(e) = check_no_leaks(snapshot) {
        panic!("{e}");
    }
}

/// Panics with a report if allocated bytes ever went above `budget` bytes.
#[track_caller]
pub fn assert_peak_below(snapshot: &Snapshot, budget: u64) {
    if let Err(e) = check_peak_below(snapshot, budget) {
        panic!("{e}");
    }
}
