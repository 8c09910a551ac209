//! `retained_per_step`: a call site whose live allocations grow with the step count.
//!
//! This is the classic `losses.append(loss)` bug: every step leaves one more device block alive.
//! The detector reads the live intervals of `crate::model_view` and, for each call-site group,
//! the blocks allocated in each loop step that are still live at the end of the trace. A group
//! is reported when such blocks come from at least `min_steps` steps that cover at least half of
//! their span, *and* the group's live blocks really grew over that span (so a group that keeps
//! the last few steps' blocks in a sliding window, a holder allocated once, activations freed
//! within their step, and a buffer replaced every step are all left alone).

use super::{sat_sum, DetectOptions, Finding, FindingKind, FindingSink, PerStep, Severity};
use crate::model_view::ModelView;
use vramscope_allocator::format_bytes;

/// Reports call sites that keep one or more blocks alive per step.
pub fn retained_per_step(
    view: &ModelView<'_>,
    options: &DetectOptions,
    sink: &mut dyn FindingSink,
) {
    let loop_steps = view.loop_steps();
    if loop_steps.is_empty() {
        return;
    }
    let last_step = loop_steps.end - 1;
    let min_steps = options.min_steps.max(1);
    for group in 0..view.groups().len() as u32 {
        // (step index, blocks retained, bytes retained) for the loop steps with retention.
        let retained: Vec<(u32, u64, u64)> = view
            .group_steps(group)
            .iter()
            .filter(|(s, t)| loop_steps.contains(s) && t.retained > 0)
            .map(|(s, t)| (*s, t.retained, t.retained_bytes))
            .collect();
        if (retained.len() as u64) < min_steps {
            continue;
        }
        let first = retained[0].0;
        let last = retained[retained.len() - 1].0;
        let span = u64::from(last - first) + 1;
        if (retained.len() as u64).saturating_mul(2) < span {
            continue;
        }
        let total_blocks = sat_sum(retained.iter().map(|r| r.1));
        let total_bytes = sat_sum(retained.iter().map(|r| r.2));
        let (before_blocks, _) = match first.checked_sub(1) {
            Some(prev) => view.live_after_step(group, prev),
            None => (0, 0),
        };
        let (end_blocks, end_bytes) = view.live_at_end_in_trace(group);
        let growth = end_blocks.saturating_sub(before_blocks);
        if growth < min_steps || growth.saturating_mul(2) < total_blocks {
            continue;
        }

        // The rate: the trace's last step may have been cut short by the snapshot, with blocks
        // still in flight, so leave it out when enough other steps remain.
        let rate_steps: &[(u32, u64, u64)] =
            if last == last_step && retained.len() as u64 > min_steps {
                &retained[..retained.len() - 1]
            } else {
                &retained
            };
        let rate_span = f64::from(rate_steps[rate_steps.len() - 1].0 - first + 1);
        let blocks_per_step = sat_sum(rate_steps.iter().map(|r| r.1)) as f64 / rate_span;
        let bytes_per_step = sat_sum(rate_steps.iter().map(|r| r.2)) as f64 / rate_span;

        let capacity = view.capacity(options.capacity);
        let steps_until_oom = capacity.map(|c| {
            let headroom = c.saturating_sub(view.peak_allocated());
            if bytes_per_step > 0.0 {
                (headroom as f64 / bytes_per_step).floor() as u64
            } else {
                u64::MAX
            }
        });
        let severity = if bytes_per_step >= options.retained_error_bytes_per_step as f64
            || steps_until_oom.is_some_and(|s| s <= options.retained_error_steps_until_oom)
        {
            Severity::Error
        } else {
            Severity::Warning
        };

        let first_step = view.step_number(first);
        let last_step_number = view.step_number(last);
        let mut f = Finding::at_group(view, FindingKind::RetainedPerStep, severity, Some(group));
        f.bytes = total_bytes;
        f.count = total_blocks;
        f.per_step = Some(PerStep::new(bytes_per_step, blocks_per_step));
        f.first_step = Some(first_step);
        f.last_step = Some(last_step_number);
        f.summary = format!(
            "keeps {} block(s) ({}) alive per step over {} steps ({}..{}); {} in {} blocks are still live at the end",
            trim_float(blocks_per_step),
            format_bytes(bytes_per_step.round() as u64),
            retained.len(),
            first_step,
            last_step_number,
            format_bytes(end_bytes),
            end_blocks
        );
        let mut evidence = f
            .evidence
            .float("retained_bytes_per_step", bytes_per_step)
            .float("retained_blocks_per_step", blocks_per_step)
            .int("steps_with_retention", retained.len() as u64)
            .int("first_step", first_step)
            .int("last_step", last_step_number)
            .int("retained_blocks", total_blocks)
            .int("retained_bytes", total_bytes)
            .int("live_blocks_before_first_step", before_blocks)
            .int("live_blocks_at_end", end_blocks);
        if let (Some(c), Some(s)) = (capacity, steps_until_oom) {
            evidence = evidence
                .int("device_capacity_bytes", c)
                .int("peak_allocated_bytes", view.peak_allocated())
                .int("steps_until_oom", s);
        }
        f.evidence = evidence;
        f.fix = "do not keep per-step device tensors alive: store loss.item() or t.detach().cpu() instead of the tensor, or drop the reference each step".to_string();
        sink.report(f);
    }
}

/// Formats a small rate without trailing zeros (`1`, `0.5`, `2.25`).
fn trim_float(value: f64) -> String {
    let text = format!("{:.2}", value);
    text.trim_end_matches('0').trim_end_matches('.').to_string()
}
