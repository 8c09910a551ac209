//! What the Python face asks of a snapshot: the inspector's findings (as the inspector's values,
//! which `crate::report` turns into Python objects, or as JSON), its text report, and the
//! checks of the pytest marker (peak, leaks, syncs per step), each failure a sentence that
//! names the call site.
//!
//! The findings are the inspector's, with its default settings: `sync_in_loop` reports
//! explicit syncs (those PyTorch's sync debug mode reported, recorded by `crate::host`) from one
//! per step, `info` at one and a warning above, by the same rule as `vramscope report`.

use std::collections::BTreeMap;

use vramscope_inspector::checks;
use vramscope_inspector::detect::{detect, DetectOptions, Finding};
use vramscope_inspector::report::{build_report, render, Format, ReportOptions};
use vramscope_model::{format_bytes, EventKind, Snapshot, TransferDirection};

/// The inspector's findings on `snapshot` with its default settings, most severe first.
pub fn findings(snapshot: &Snapshot) -> Vec<Finding> {
    detect(snapshot, &DetectOptions::default())
}

/// The inspector's findings on `snapshot`, as the JSON array of its `Finding`s: what the
/// callers that have not moved to the typed findings of `crate::report` still read.
pub fn findings_json(snapshot: &Snapshot) -> String {
    serde_json::to_string(&findings(snapshot)).unwrap_or_else(|_| "[]".to_string())
}

/// The inspector's text report on `snapshot`, as `vramscope report` prints it (built, as the
/// command line builds it for text, without the HTML explorer's data).
pub fn report_text(snapshot: &Snapshot) -> String {
    let mut options = ReportOptions::default();
    options.explorer = false;
    render(&build_report(snapshot, &options), Format::Text, false)
}

/// What the pytest marker checks.
#[derive(Clone, Copy, Debug, Default)]
pub struct Limits {
    /// Peak allocated bytes allowed.
    pub max_peak: Option<u64>,
    /// Fail on any `retained_per_step` finding.
    pub no_leaks: bool,
    /// Device waits (syncs and device-to-host copies) allowed in any one step.
    pub max_syncs_per_step: Option<u64>,
}

/// The checks of `limits` that `snapshot` fails, one message each (empty when all pass).
pub fn check(snapshot: &Snapshot, limits: Limits) -> Vec<String> {
    let mut failures = Vec::new();
    if let Some(budget) = limits.max_peak {
        if let Err(e) = checks::check_peak_below(snapshot, budget) {
            failures.push(format!("max_peak: {e}"));
        }
    }
    if limits.no_leaks {
        if let Err(e) = checks::check_no_leaks(snapshot) {
            failures.push(format!("no_leaks: {e}"));
        }
    }
    if let Some(limit) = limits.max_syncs_per_step {
        if let Some(message) = check_syncs(snapshot, limit) {
            failures.push(message);
        }
    }
    failures
}

/// [`check`], with the leak check also run on `at_step`, a snapshot taken at the latest step
/// mark (what earlier steps left alive before a test's locals went away); the first leak
/// found is reported.
pub fn check_with_step(
    snapshot: &Snapshot,
    at_step: Option<&Snapshot>,
    limits: Limits,
) -> Vec<String> {
    let mut failures = check(snapshot, limits);
    if limits.no_leaks && !failures.iter().any(|f| f.starts_with("no_leaks:")) {
        if let Some(at_step) = at_step {
            if let Err(e) = checks::check_no_leaks(at_step) {
                failures.push(format!("no_leaks (at the last step mark): {e}"));
            }
        }
    }
    failures
}

/// The step with the most device waits, when it has more than `limit`, as a sentence naming
/// the site that waited most in it.
fn check_syncs(snapshot: &Snapshot, limit: u64) -> Option<String> {
    let mut by_step: BTreeMap<u64, BTreeMap<Option<u32>, u64>> = BTreeMap::new();
    for event in &snapshot.events {
        let waits = matches!(
            event.kind,
            EventKind::Sync | EventKind::Transfer(TransferDirection::DeviceToHost)
        );
        if waits {
            *by_step
                .entry(u64::from(event.step))
                .or_default()
                .entry(event.site())
                .or_default() += 1;
        }
    }
    let (step, sites) = by_step
        .iter()
        .max_by_key(|(step, sites)| (sites.values().sum::<u64>(), std::cmp::Reverse(**step)))?;
    let total: u64 = sites.values().sum();
    if total <= limit {
        return None;
    }
    let (site, count) = sites.iter().max_by_key(|(_, count)| **count)?;
    let place = site
        .and_then(|id| snapshot.sites.get(id as usize))
        .map(|s| {
            if s.function.is_empty() {
                s.file_line()
            } else {
                format!("{} in {}", s.file_line(), s.function)
            }
        })
        .unwrap_or_else(|| "an unknown site".to_string());
    Some(format!(
        "max_syncs_per_step: step {step} waited for the device {total} times (limit {limit}), \
         {count} of them at {place}; fix: keep values on the device inside the loop and read \
         them once per step (accumulate, then one .item())"
    ))
}

/// `bytes` as a human figure (`"1.50 GiB"`).
pub fn human(bytes: u64) -> String {
    format_bytes(bytes)
}
