//! `sync_in_loop`: a call site that makes the host wait for the device many times per step.
//!
//! Every device-to-host copy waits for the stream, so `.item()` or `print(t[0, 0])` inside a
//! hot loop stalls the pipeline once per element. The detector counts, per call-site group and
//! loop step, the tiny device-to-host copies (at most `sync_max_bytes`) and the explicit `Sync`
//! events recorded by `crate::model_view`, and reports groups over at least `min_steps` steps
//! that average `explicit_sync_per_step` explicit syncs or more (each one a wait that was
//! reported as such: PyTorch's sync debug mode, `CachingAllocator::synchronize`), or
//! `sync_per_step` syncs of both kinds together (a tiny copy is only a guess at a sync, so it
//! takes more of them). A site that waits at most once per step is `info` (reading a value
//! once per step is the advice itself); more often, a warning. The rule is the same wherever
//! the snapshot came from and whichever face reads it.

use rustc_hash::FxHashMap;
use vramscope_model::{EventKind, TransferDirection};

use super::{sat_sum, DetectOptions, Finding, FindingKind, FindingSink, PerStep, Severity};
use crate::model_view::ModelView;

/// What kind of wait for the device an event is, by this detector's rule.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Wait {
    /// A device-to-host copy of at most `DetectOptions::sync_max_bytes`: a guess at a sync.
    TinyCopy,
    /// A sync reported as such (PyTorch's sync debug mode, `CachingAllocator::synchronize`).
    Explicit,
}

/// The wait `event` is, if any: the one rule the detector and the test checks
/// (`crate::checks::check_syncs_per_step`) share.
pub fn wait_of(event: &vramscope_model::Event, options: &DetectOptions) -> Option<Wait> {
    match event.kind {
        EventKind::Transfer(TransferDirection::DeviceToHost)
            if event.size <= options.sync_max_bytes =>
        {
            Some(Wait::TinyCopy)
        }
        EventKind::Sync => Some(Wait::Explicit),
        _ => None,
    }
}

/// Reports call sites that synchronize with the device many times per step.
pub fn sync_in_loop(view: &ModelView<'_>, options: &DetectOptions, sink: &mut dyn FindingSink) {
    let loop_steps = view.loop_steps();
    if loop_steps.is_empty() {
        return;
    }
    let events = &view.snapshot().events;
    for group in 0..view.groups().len() as u32 {
        // Per loop step: (tiny device-to-host copies, their bytes, explicit syncs).
        let mut per_step: FxHashMap<u32, (u64, u64, u64)> = FxHashMap::default();
        for &i in view.group_events(group) {
            let e = &events[i as usize];
            let step = view.event_step(i);
            if !loop_steps.contains(&step) {
                continue;
            }
            match wait_of(e, options) {
                Some(Wait::TinyCopy) => {
                    let c = per_step.entry(step).or_default();
                    c.0 += 1;
                    c.1 += e.size;
                }
                Some(Wait::Explicit) => per_step.entry(step).or_default().2 += 1,
                None => {}
            }
        }
        let active = per_step.len() as u64;
        if active < options.min_steps.max(1) {
            continue;
        }
        let copies = sat_sum(per_step.values().map(|c| c.0));
        let bytes = sat_sum(per_step.values().map(|c| c.1));
        let syncs = sat_sum(per_step.values().map(|c| c.2));
        let total = copies + syncs;
        let average = total as f64 / active as f64;
        let explicit_average = syncs as f64 / active as f64;
        if average < options.sync_per_step && explicit_average < options.explicit_sync_per_step {
            continue;
        }
        let severity = if average <= 1.0 {
            Severity::Info
        } else {
            Severity::Warning
        };
        let most = per_step.values().map(|c| c.0 + c.2).max().unwrap_or(0);
        let first = per_step.keys().copied().min().unwrap_or(0);
        let last = per_step.keys().copied().max().unwrap_or(0);

        let mut f = Finding::at_group(view, FindingKind::SyncInLoop, severity, Some(group));
        f.bytes = bytes;
        f.count = total;
        f.per_step = Some(PerStep::new(bytes as f64 / active as f64, average));
        f.first_step = Some(view.step_number(first));
        f.last_step = Some(view.step_number(last));
        f.summary = format!(
            "waits for the device {} times per step over {} ({} tiny device-to-host copies, {} explicit syncs)",
            super::count_text(average),
            vramscope_model::plural(active, "step"),
            copies,
            syncs
        );
        f.evidence = f
            .evidence
            .float("syncs_per_step", average)
            .float("tiny_d2h_copies_per_step", copies as f64 / active as f64)
            .float("explicit_syncs_per_step", syncs as f64 / active as f64)
            .int("max_syncs_in_one_step", most)
            .int("steps", active)
            .int("tiny_d2h_copies", copies)
            .int("explicit_syncs", syncs)
            .int("tiny_copy_max_bytes", options.sync_max_bytes);
        f.fix = "accumulate on the device (total += loss.detach()) and copy to the host once per step, not per element".to_string();
        sink.report(f);
    }
}
