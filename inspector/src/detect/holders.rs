//! `top_holders`: which call sites hold memory at the end of the trace (or at its peak).
//!
//! Weights, optimizer state and caches allocated once are not leaks, but they are usually most
//! of the memory, so they are reported as information: the `top_holders` largest call-site
//! groups live at the end, from `crate::model_view` (which also counts blocks that predate the
//! recording when the segments show them). When nothing is live at the end, as in a profiler
//! window that frees everything it allocates, the holders at the peak of allocated bytes are
//! reported instead.

use vramscope_allocator::format_bytes;

use super::{DetectOptions, Finding, FindingKind, FindingSink, Severity};
use crate::model_view::{GroupId, ModelView};

/// Reports the largest holders of memory, as information.
pub fn top_holders(view: &ModelView<'_>, options: &DetectOptions, sink: &mut dyn FindingSink) {
    let (holdings, when) = if view.live_at_end().iter().any(|h| h.bytes > 0) {
        (view.live_at_end(), "end")
    } else {
        (view.live_at_peak(), "peak")
    };
    let total = super::sat_sum(holdings.iter().map(|h| h.bytes));
    if total == 0 {
        return;
    }
    // Rank ties by site name, as the finding order does.
    let mut top: Vec<_> = holdings.iter().take(options.top_holders).collect();
    top.sort_by(|a, b| {
        b.bytes.cmp(&a.bytes).then_with(|| {
            view.group(a.group)
                .file_line
                .cmp(&view.group(b.group).file_line)
        })
    });
    for (rank, h) in top.into_iter().enumerate() {
        let share = h.bytes as f64 / total as f64;
        let mut f = Finding::at_group(view, FindingKind::TopHolders, Severity::Info, Some(h.group));
        f.bytes = h.bytes;
        f.count = h.blocks;
        f.first_step = Some(h.first_step);
        f.last_step = Some(h.last_step);
        let steps = if h.first_step == h.last_step {
            format!("step {}", h.first_step)
        } else {
            format!("steps {}..{}", h.first_step, h.last_step)
        };
        let share_text = if share < 0.005 {
            "<1%".to_string()
        } else {
            format!("{:.0}%", share * 100.0)
        };
        f.summary = format!(
            "holds {} in {} block(s) at the {} ({} of live memory), allocated in {}",
            format_bytes(h.bytes),
            h.blocks,
            when,
            share_text,
            steps
        );
        let mut evidence = f.evidence.text("when", when);
        if let Some(tag) = tag_of(view, h.group) {
            evidence = evidence.text("tag", tag);
        }
        f.evidence = evidence
            .int("rank", rank as u64 + 1)
            .int("live_bytes", h.bytes)
            .int("live_blocks", h.blocks)
            .int("requested_bytes", h.requested)
            .float("share_of_live", share)
            .int("first_step", h.first_step)
            .int("last_step", h.last_step);
        let loop_steps = view.loop_steps();
        let spread = loop_steps.len() > 1 && h.first_step >= 1 && h.last_step > h.first_step;
        f.fix = if spread {
            format!(
                "allocated across steps {}..{}: if it keeps growing with the step count it is a leak (see retained_per_step); otherwise free it once it is used",
                h.first_step, h.last_step
            )
        } else {
            "expected for weights and optimizer state; to shrink it, use lower precision, sharding or offloading, or free it earlier".to_string()
        };
        sink.report(f);
    }
}

/// The tag of the group's first allocation that has one (`alloc.tagged("weights")`).
fn tag_of<'a>(view: &ModelView<'a>, group: GroupId) -> Option<&'a str> {
    let snapshot = view.snapshot();
    view.group_intervals(group).iter().find_map(|&i| {
        let event = &snapshot.events[view.intervals()[i as usize].alloc_event as usize];
        snapshot.tag(event.tag)
    })
}
