//! `cache_churn`: segments obtained from and released to the device every step.
//!
//! A caching allocator pays for `cudaMalloc`/`cudaFree` once and then reuses its segments. When
//! the cache is emptied inside the loop (`torch.cuda.empty_cache()` every step) or the program
//! runs so close to capacity that the allocator must flush and refill its cache, every step pays
//! for raw device calls again, and each of those synchronizes the device. The detector reads the
//! per-step segment tallies of `crate::model_view`; it reports a warning when at least
//! `min_steps` loop steps, and at least half of them, both allocate and release segments, with
//! the estimated cost at `assumed_us_per_device_call`. `empty_cache()` called every step while
//! releasing nothing is reported as information (the call still synchronizes). The calls come
//! from `vramscope_engine::empty_cache_calls` (PyTorch records each as a burst of segment
//! frees whose stack shows `emptyCache`): the finding names the Python line that made them,
//! counts them, and says to remove the call.

use vramscope_model::{format_bytes, EventKind};

use super::{sat_sum, DetectOptions, Finding, FindingKind, FindingSink, PerStep, Severity};
use crate::model_view::ModelView;
use vramscope_engine::GroupId;

/// Reports segments allocated and released every step.
pub fn cache_churn(view: &ModelView<'_>, options: &DetectOptions, sink: &mut dyn FindingSink) {
    let loop_steps = view.loop_steps();
    let n_steps = loop_steps.len() as u64;
    let min_steps = options.min_steps.max(1);
    if n_steps < min_steps {
        return;
    }
    let totals = &view.step_totals()[loop_steps.start as usize..loop_steps.end as usize];
    let churn_steps = totals
        .iter()
        .filter(|t| t.segment_allocs > 0 && t.segment_frees > 0)
        .count() as u64;
    // `empty_cache()` calls: explicit events, or PyTorch's bursts of segment frees.
    let calls: Vec<_> = view
        .empty_cache_calls()
        .iter()
        .filter(|c| loop_steps.contains(&view.event_step(c.first_event)))
        .collect();
    let mut call_steps: Vec<u32> = calls
        .iter()
        .map(|c| view.event_step(c.first_event))
        .collect();
    call_steps.dedup();
    let empty_cache_steps = call_steps.len() as u64;
    let device_allocs = sat_sum(totals.iter().map(|t| t.segment_allocs));
    let device_frees = sat_sum(totals.iter().map(|t| t.segment_frees));
    let released = sat_sum(totals.iter().map(|t| t.segment_free_bytes));
    let empty_calls = calls.len() as u64;

    // The line that called it most often.
    let mut by_line: Vec<(String, String, u64)> = Vec::new();
    for call in &calls {
        let Some(site) = call.site else { continue };
        let name = view.site_name(site);
        match by_line.iter_mut().find(|(l, _, _)| *l == name.label) {
            Some(entry) => entry.2 += 1,
            None => by_line.push((name.label, name.function, 1)),
        }
    }
    by_line.sort_by(|a, b| b.2.cmp(&a.2).then(a.0.cmp(&b.0)));
    let empty_cache_line = by_line.first().map(|(l, f, _)| (l.clone(), f.clone()));
    let churning = churn_steps >= min_steps && churn_steps * 2 >= n_steps;
    let emptied_every_step = empty_cache_steps >= min_steps && empty_cache_steps * 2 >= n_steps;
    if !churning && !emptied_every_step {
        return;
    }
    let first = view.step_number(loop_steps.start);
    let last = view.step_number(loop_steps.end - 1);
    let per_step = |v: u64| v as f64 / n_steps as f64;

    if churning {
        let site = if empty_cache_line.is_some() {
            None
        } else {
            busiest_group(view, |kind| {
                matches!(kind, EventKind::SegmentAlloc | EventKind::SegmentMap)
            })
        };
        let calls = device_allocs.saturating_add(device_frees);
        let cost_us = per_step(calls) * options.assumed_us_per_device_call;
        let mut f = Finding::at_group(view, FindingKind::CacheChurn, Severity::Warning, site);
        if let Some((line, function)) = &empty_cache_line {
            f.site = Some(line.clone());
            f.function = function.clone();
        }
        f.bytes = released;
        f.count = calls;
        f.per_step = Some(PerStep::new(per_step(released), per_step(calls)));
        f.first_step = Some(first);
        f.last_step = Some(last);
        let called = if empty_calls > 0 {
            format!(
                "empty_cache() is called {} and ",
                vramscope_model::plural(empty_calls, "time")
            )
        } else {
            String::new()
        };
        f.summary = format!(
            "{called}the loop allocates and releases device segments in {} of {} steps ({:.1} raw calls, {} released per step; about {:.0} µs per step at {} µs per call)",
            churn_steps,
            n_steps,
            per_step(calls),
            format_bytes(per_step(released).round() as u64),
            cost_us,
            options.assumed_us_per_device_call
        );
        f.evidence = f
            .evidence
            .int("churn_steps", churn_steps)
            .int("steps", n_steps)
            .float("device_allocs_per_step", per_step(device_allocs))
            .float("device_frees_per_step", per_step(device_frees))
            .float("released_bytes_per_step", per_step(released))
            .float("empty_cache_calls_per_step", per_step(empty_calls))
            .int("empty_cache_calls", empty_calls)
            .float(
                "assumed_us_per_device_call",
                options.assumed_us_per_device_call,
            )
            .float("est_us_per_step", cost_us);
        f.fix = if empty_calls > 0 {
            format!(
                "remove the torch.cuda.empty_cache() call{} from the loop (call it once after training, if at all): each call hands the cache back to the device and the next step pays cudaMalloc for it again",
                empty_cache_line
                    .as_ref()
                    .map(|(l, _)| format!(" at {l}"))
                    .unwrap_or_default()
            )
        } else {
            "the cache is flushed and refilled every step: lower the peak (smaller batch, activation checkpointing) or set expandable_segments:True".to_string()
        };
        sink.report(f);
    } else {
        let mut f = Finding::at_group(view, FindingKind::CacheChurn, Severity::Info, None);
        if let Some((line, function)) = &empty_cache_line {
            f.site = Some(line.clone());
            f.function = function.clone();
        }
        f.count = empty_calls;
        f.per_step = Some(PerStep::new(0.0, per_step(empty_calls)));
        f.first_step = Some(first);
        f.last_step = Some(last);
        f.summary = format!(
            "calls empty_cache() in {} of {} steps; it releases nothing here but still synchronizes the device",
            empty_cache_steps, n_steps
        );
        f.evidence = f
            .evidence
            .int("empty_cache_steps", empty_cache_steps)
            .int("steps", n_steps)
            .float("empty_cache_calls_per_step", per_step(empty_calls))
            .int("empty_cache_calls", empty_calls)
            .int("device_frees", device_frees);
        f.fix = "remove the torch.cuda.empty_cache() call from the loop".to_string();
        sink.report(f);
    }
}

/// The group with the most loop-step events of the kinds `wanted` selects (lowest id on ties).
fn busiest_group(view: &ModelView<'_>, wanted: impl Fn(EventKind) -> bool) -> Option<GroupId> {
    let loop_steps = view.loop_steps();
    let events = &view.snapshot().events;
    let mut best: Option<(u64, GroupId)> = None;
    for group in 0..view.groups().len() as u32 {
        let n = view
            .group_events(group)
            .iter()
            .filter(|&&i| {
                wanted(events[i as usize].kind) && loop_steps.contains(&view.event_step(i))
            })
            .count() as u64;
        if n > 0 && best.is_none_or(|(m, _)| n > m) {
            best = Some((n, group));
        }
    }
    best.map(|(_, g)| g)
}
