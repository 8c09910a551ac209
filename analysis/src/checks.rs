//! Assertions for users' tests: "this training loop leaks nothing" and "this stays under a
//! memory budget".
//!
//! A test takes a snapshot from vramscope's allocator after a few steps and calls
//! [`check_no_leaks`] / [`check_peak_below`], which return `Err(CheckError)` carrying a
//! readable report, or the panicking [`assert_no_leaks`] / [`assert_peak_below`], which fail the
//! test with that report. Leaks are what `crate::detect::retained_per_step` finds; the peak comes
//! from the timeline of `crate::model_view` (or the snapshot's statistics, whichever is higher),
//! and the report names the call sites that held the most at the peak.
//!
//! Two checks serve unit tests, which run no training loop: [`check_nothing_kept_since`]
//! (nothing a test allocated is still live when it returns, memray's `limit_leaks` meaning) and
//! [`check_syncs_per_step`] (the host waits for the device at most so often in any one step, by
//! the `sync_in_loop` detector's own rule of what a wait is: `crate::detect::sync::wait_of`).

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
        let function = in_function(&f.function);
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
            let function = in_function(&group.function);
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

/// Checks that nothing allocated at event sequence number `since` or later is still live at the
/// end of `snapshot`: what a unit test that marks no steps means by "no leaks". The report
/// names, per call site (the user's line, as findings name it), the bytes and blocks kept.
pub fn check_nothing_kept_since(snapshot: &Snapshot, since: u64) -> Result<(), CheckError> {
    let view = ModelView::new(snapshot);
    let events = &snapshot.events;
    // Per group id: (bytes, blocks).
    let mut by_group = vec![(0u64, 0u64); view.groups().len()];
    for interval in view.intervals() {
        let alloc = interval.alloc(events);
        if interval.free_event().is_some() || alloc.seq < since {
            continue;
        }
        let kept = &mut by_group[interval.group as usize];
        kept.0 = kept.0.saturating_add(alloc.size);
        kept.1 += 1;
    }
    let mut kept: Vec<(u32, u64, u64)> = (0u32..)
        .zip(by_group)
        .filter(|(_, (_, blocks))| *blocks > 0)
        .map(|(group, (bytes, blocks))| (group, bytes, blocks))
        .collect();
    if kept.is_empty() {
        return Ok(());
    }
    kept.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    let bytes: u64 = kept.iter().map(|k| k.1).fold(0, u64::saturating_add);
    let blocks: u64 = kept.iter().map(|k| k.2).sum();
    let mut report = String::new();
    for &(group, group_bytes, group_blocks) in &kept {
        let group = view.group(group);
        let function = in_function(&group.function);
        let _ = writeln!(
            report,
            "  {} in {} still live, made at {}{}",
            format_bytes(group_bytes),
            vramscope_model::plural(group_blocks, "block"),
            group.label(),
            function
        );
    }
    let _ = writeln!(
        report,
        "    fix: drop the references the test keeps (a global list, a cache, a closure) or \
         free them before it returns"
    );
    Err(CheckError {
        check: format!(
            "nothing kept ({} in {} allocated by the test still live after it returned)",
            format_bytes(bytes),
            vramscope_model::plural(blocks, "block")
        ),
        findings: Vec::new(),
        report,
    })
}

/// Checks that in no step does the host wait for the device more than `limit` times, counting
/// waits as the `sync_in_loop` detector does (explicit syncs, and device-to-host copies of at
/// most `options.sync_max_bytes`), in every step, setup included. The report names the step
/// with the most waits and the call site that waited most in it.
pub fn check_syncs_per_step(
    snapshot: &Snapshot,
    limit: u64,
    options: &DetectOptions,
) -> Result<(), CheckError> {
    let view = ModelView::new(snapshot);
    let events = &snapshot.events;
    // Waits per (step index, group), and per step index.
    let mut by_step_group: rustc_hash::FxHashMap<(u32, u32), u64> = Default::default();
    let mut by_step: std::collections::BTreeMap<u32, u64> = Default::default();
    for group in 0..view.groups().len() as u32 {
        for &i in view.group_events(group) {
            if detect::sync::wait_of(&events[i as usize], snapshot.source, options).is_none() {
                continue;
            }
            let step = view.event_step(i);
            *by_step_group.entry((step, group)).or_default() += 1;
            *by_step.entry(step).or_default() += 1;
        }
    }
    // The step with the most waits, the earliest of equals.
    let Some((&step, &total)) = by_step
        .iter()
        .max_by_key(|(step, total)| (**total, std::cmp::Reverse(**step)))
    else {
        return Ok(());
    };
    if total <= limit {
        return Ok(());
    }
    let (group, count) = by_step_group
        .iter()
        .filter(|((s, _), _)| *s == step)
        .map(|(&(_, group), &count)| (group, count))
        .max_by_key(|&(group, count)| (count, std::cmp::Reverse(group)))
        .expect("a step with waits has a group");
    let group = view.group(group);
    let place = if group.function.is_empty() {
        group.label().to_string()
    } else {
        format!("{} in {}", group.label(), group.function)
    };
    let report = format!(
        "  step {} waited for the device {total} times (limit {limit}), {count} of them at {place}\n    \
         fix: keep values on the device inside the loop and read them once per step \
         (accumulate, then one .item())\n",
        view.step_number(step)
    );
    Err(CheckError {
        check: format!("at most {limit} syncs per step"),
        findings: Vec::new(),
        report,
    })
}

/// ` (function)` after a site in a report line, or nothing for a site without a function name.
fn in_function(function: &str) -> String {
    if function.is_empty() {
        String::new()
    } else {
        format!(" ({function})")
    }
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
