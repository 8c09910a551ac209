//! What the Python face asks of a snapshot: the inspector's findings (as the inspector's values,
//! which `crate::report` turns into Python objects, or as JSON), its text report, and the
//! checks of the pytest marker (peak, leaks, syncs per step), each failure a sentence that
//! names the call site.
//!
//! The findings are the inspector's, with its default settings: `sync_in_loop` reports
//! explicit syncs (those PyTorch's sync debug mode reported, recorded by `crate::host`) from two
//! per step, as a warning (one per step is no finding), by the same rule as `vramscope report`.

use vramscope_analysis::checks;
use vramscope_analysis::detect::{detect, DetectOptions, Finding};
use vramscope_analysis::report::{build_report, ReportOptions};
use vramscope_model::{format_bytes, Snapshot};
use vramscope_render::{render, Format};

/// The inspector's findings on `snapshot` with its default settings, most severe first.
pub fn findings(snapshot: &Snapshot) -> Vec<Finding> {
    detect(snapshot, &DetectOptions::default())
}

/// The inspector's text report on `snapshot`, as `vramscope report` prints it (built, as the
/// command line builds it for text, without the HTML explorer's data).
pub fn report_text(snapshot: &Snapshot) -> String {
    let mut options = ReportOptions::default();
    options.explorer = false;
    let text = render(&build_report(snapshot, &options), Format::Text, false);
    // Escaped as the command line's door escapes it: printed in a CI log, no line of it is a
    // workflow command.
    vramscope_model::terminal::sanitize_output(&text, false).into_owned()
}

/// The inspector's text report on a file whose devices' parts are `parts`, as `vramscope
/// report` prints it: opening with the whole file's verdict.
pub fn report_text_of_parts(parts: &[Snapshot]) -> String {
    let mut options = ReportOptions::default();
    options.explorer = false;
    let reports: Vec<_> = parts.iter().map(|p| build_report(p, &options)).collect();
    let text = vramscope_render::render_file(&reports, Format::Text, false);
    vramscope_model::terminal::sanitize_output(&text, false).into_owned()
}

/// What the pytest marker checks.
#[derive(Clone, Copy, Debug, Default)]
pub struct Limits {
    /// Peak allocated bytes allowed.
    pub max_peak: Option<u64>,
    /// Fail on memory the test keeps: with `since`, and when the test marked no steps, any
    /// block allocated from `since` on and still live (a unit test's meaning); otherwise any
    /// `retained_per_step` finding (a training loop's).
    pub no_leaks: bool,
    /// Device waits (explicit syncs and tiny device-to-host copies, by the `sync_in_loop`
    /// detector's rule) allowed in any one step.
    pub max_syncs_per_step: Option<u64>,
    /// The allocator's next event sequence number when the test began.
    pub since: Option<u64>,
}

impl Limits {
    /// The limits of the pytest marker's arguments, as the faces receive them.
    pub fn new(
        max_peak: Option<u64>,
        no_leaks: bool,
        max_syncs_per_step: Option<u64>,
        since: Option<u64>,
    ) -> Limits {
        Limits {
            max_peak,
            no_leaks,
            max_syncs_per_step,
            since,
        }
    }
}

/// Whether the events from sequence number `since` on span as many steps as the per-step
/// leak rule needs (`DetectOptions::min_steps`): the test is a training loop. A test with
/// fewer (one `optimizer.step()`, marked by `attach()` or `use_allocator()`) is a unit test,
/// judged by what it keeps.
fn marked_steps_since(snapshot: &Snapshot, since: u64) -> bool {
    let wanted = DetectOptions::default().min_steps.max(2);
    let mut steps: Vec<u32> = Vec::new();
    for event in snapshot.events.iter().filter(|e| e.seq >= since) {
        if !steps.contains(&event.step) {
            steps.push(event.step);
            if steps.len() as u64 >= wanted {
                return true;
            }
        }
    }
    false
}

/// Whether `no_leaks` takes the per-step rule: without `since` (a whole run), or when the test
/// marked enough steps to be a training loop ([`marked_steps_since`]).
fn per_step_rule(snapshot: &Snapshot, limits: Limits) -> bool {
    limits
        .since
        .is_none_or(|since| marked_steps_since(snapshot, since))
}

/// The checks of `limits` that `snapshot` fails, one message each (empty when all pass).
pub fn check(snapshot: &Snapshot, limits: Limits) -> Vec<String> {
    check_by(snapshot, limits, per_step_rule(snapshot, limits))
}

/// [`check`], with the leak rule decided by the caller (`per_step`).
fn check_by(snapshot: &Snapshot, limits: Limits, per_step: bool) -> Vec<String> {
    let mut failures = Vec::new();
    if let Some(budget) = limits.max_peak {
        if let Err(e) = checks::check_peak_below(snapshot, budget) {
            failures.push(format!("max_peak: {e}"));
        }
    }
    if limits.no_leaks {
        let kept = match limits.since {
            Some(since) if !per_step => checks::check_nothing_kept_since(snapshot, since),
            _ => checks::check_no_leaks(snapshot),
        };
        if let Err(e) = kept {
            failures.push(format!("no_leaks: {e}"));
        }
    }
    if let Some(limit) = limits.max_syncs_per_step {
        if let Err(e) = checks::check_syncs_per_step(snapshot, limit, &DetectOptions::default()) {
            failures.push(format!("max_syncs_per_step: {e}"));
        }
    }
    failures
}

/// [`check`], with the per-step leak check also run on `at_step`, a snapshot taken at the
/// latest step mark (what earlier steps left alive before a test's locals went away); the
/// first leak found is reported.
pub fn check_with_step(
    snapshot: &Snapshot,
    at_step: Option<&Snapshot>,
    limits: Limits,
) -> Vec<String> {
    let per_step = per_step_rule(snapshot, limits);
    let mut failures = check_by(snapshot, limits, per_step);
    if limits.no_leaks && per_step && !failures.iter().any(|f| f.starts_with("no_leaks:")) {
        if let Some(at_step) = at_step {
            if let Err(e) = checks::check_no_leaks(at_step) {
                failures.push(format!("no_leaks (at the last step mark): {e}"));
            }
        }
    }
    failures
}

/// `bytes` as a human figure (`"1.50 GiB"`).
pub fn human(bytes: u64) -> String {
    format_bytes(bytes)
}
