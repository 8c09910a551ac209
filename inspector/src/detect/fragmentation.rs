//! `fragmentation` and `oom`: reserved memory the program cannot use, and failed allocations.
//!
//! For every `Oom` event the detector looks up, on the timeline of `crate::model_view`, how
//! much was allocated and reserved at that moment. When the reserved-but-unallocated bytes plus
//! the device's free bytes would have covered the request, the memory was there but in pieces:
//! that is reported as `fragmentation` (error) with the allocator setting that helps
//! (`expandable_segments:True`, or `max_split_size_mb:N` when expandable segments are already
//! on). Otherwise the OOM is reported as `oom` (error) with what was live at the peak.
//!
//! Without an OOM, fragmentation matters only under memory pressure: allocation retries
//! (`num_alloc_retries`) or a peak close to capacity with much free memory stuck in split
//! segments give a warning; a large share of split free memory alone is information.

use vramscope_model::{format_bytes, Event};
use vramscope_model::{oom::fragmentation_setting, oom::is_fragmentation};

use super::{config_env_var, DetectOptions, Finding, FindingKind, FindingSink, Severity};
use crate::model_view::ModelView;

/// One OOM event and the state around it.
struct OomCase<'e> {
    index: u32,
    event: &'e Event,
    allocated: u64,
    reserved: u64,
}

impl OomCase<'_> {
    fn cache_free(&self) -> u64 {
        self.reserved.saturating_sub(self.allocated)
    }
}

/// Reports fragmentation and OOMs.
pub fn fragmentation(view: &ModelView<'_>, options: &DetectOptions, sink: &mut dyn FindingSink) {
    let (split, plain) = classify_ooms(view);
    if let Some(worst) = largest(&split) {
        report_split_oom(view, worst, &split, sink);
    }
    if let Some(worst) = largest(&plain) {
        report_plain_oom(view, options, worst, &plain, sink);
    }
    // An OOM explained by fragmentation says it all; without one, look for pressure, then
    // for a large share of split free memory.
    if split.is_empty() {
        report_split_free_memory(view, options, sink);
    }
}

/// The OOMs of the trace with the state around them: those the free memory would have
/// covered had it not been in pieces (fragmentation), and the rest.
fn classify_ooms<'e>(view: &ModelView<'e>) -> (Vec<OomCase<'e>>, Vec<OomCase<'e>>) {
    let snapshot = view.snapshot();
    let mut split: Vec<OomCase<'_>> = Vec::new();
    let mut plain: Vec<OomCase<'_>> = Vec::new();
    for &i in view.ooms() {
        let event = &snapshot.events[i as usize];
        let (allocated, reserved) = view.usage_at(i);
        let case = OomCase {
            index: i,
            event,
            allocated,
            reserved,
        };
        // The allocator's own rule, so that its OOM hint and this report agree.
        if view.reserved_known()
            && is_fragmentation(event.size, case.cache_free(), event.device_free)
        {
            split.push(case);
        } else {
            plain.push(case);
        }
    }
    (split, plain)
}

/// Reports the OOMs that fragmentation explains, at the `worst` of them.
fn report_split_oom(
    view: &ModelView<'_>,
    worst: &OomCase<'_>,
    split: &[OomCase<'_>],
    sink: &mut dyn FindingSink,
) {
    let var = config_env_var(view.snapshot().source);
    let segments = view.segments();
    let setting = setting_for(view, Some(worst.event.size));
    let group = worst.event.site.and_then(|s| view.group_of_site(s));
    let mut f = Finding::at_group(view, FindingKind::Fragmentation, Severity::Error, group);
    f.bytes = worst.event.size;
    f.count = split.len() as u64;
    f.first_step = split.iter().map(|c| c.event.step).min();
    f.last_step = split.iter().map(|c| c.event.step).max();
    f.summary = format!(
        "an allocation of {} failed although {} was reserved but unallocated and {} was free on the device: the free memory is in pieces too small for it",
        format_bytes(worst.event.size),
        format_bytes(worst.cache_free()),
        format_bytes(worst.event.device_free)
    );
    let mut evidence = f
        .evidence
        .int("ooms", split.len() as u64)
        .int("request_bytes", worst.event.size)
        .int("device_free_bytes", worst.event.device_free)
        .int("allocated_bytes_at_oom", worst.allocated)
        .int("reserved_bytes_at_oom", worst.reserved)
        .int("reserved_unallocated_at_oom", worst.cache_free());
    if segments.segments > 0 {
        evidence = evidence
            .int(
                "largest_free_block_at_snapshot",
                segments.largest_free_block,
            )
            .int(
                "inactive_split_bytes_at_snapshot",
                segments.inactive_split_bytes,
            );
    }
    f.evidence = evidence.text("setting", setting.clone());
    f.fix =
        format!("set {var}={setting} so that free pieces of the cache can serve large requests");
    sink.report(f);
}

/// Reports the OOMs that fragmentation does not explain, at the `worst` of them, with the
/// largest holder at that moment.
fn report_plain_oom(
    view: &ModelView<'_>,
    options: &DetectOptions,
    worst: &OomCase<'_>,
    plain: &[OomCase<'_>],
    sink: &mut dyn FindingSink,
) {
    let group = worst.event.site.and_then(|s| view.group_of_site(s));
    let mut f = Finding::at_group(view, FindingKind::Oom, Severity::Error, group);
    f.bytes = worst.event.size;
    f.count = plain.len() as u64;
    f.first_step = plain.iter().map(|c| c.event.step).min();
    f.last_step = plain.iter().map(|c| c.event.step).max();
    let at_oom = view.live_after_event(worst.index);
    let top = at_oom.first();
    let top_text = match top {
        Some(h) => format!(
            "; the largest holder is {} with {}",
            view.group(h.group)
                .file_line
                .as_deref()
                .unwrap_or("(unknown site)"),
            format_bytes(h.bytes)
        ),
        None => String::new(),
    };
    f.summary = format!(
        "an allocation of {} failed with {} allocated and {} free on the device{}",
        format_bytes(worst.event.size),
        format_bytes(worst.allocated),
        format_bytes(worst.event.device_free),
        top_text
    );
    let mut evidence = f
        .evidence
        .int("ooms", plain.len() as u64)
        .int("request_bytes", worst.event.size)
        .int("device_free_bytes", worst.event.device_free)
        .int("allocated_bytes_at_oom", worst.allocated);
    if view.reserved_known() {
        evidence = evidence
            .int("reserved_bytes_at_oom", worst.reserved)
            .int("reserved_unallocated_at_oom", worst.cache_free());
    }
    if let Some(c) = view.capacity(options.capacity) {
        evidence = evidence.int("device_capacity_bytes", c);
    }
    if let Some(h) = top {
        evidence = evidence
            .text(
                "largest_holder",
                view.group(h.group)
                    .file_line
                    .clone()
                    .unwrap_or_else(|| "(unknown site)".to_string()),
            )
            .int("largest_holder_bytes", h.bytes);
    }
    f.evidence = evidence;
    f.fix = "lower the peak: smaller batch, activation checkpointing or lower precision; free what the largest holders keep".to_string();
    sink.report(f);
}

/// Reports free memory stuck in split segments: a warning under memory pressure (allocation
/// retries, or a peak near capacity with a large share stuck), information for a large share
/// alone.
fn report_split_free_memory(
    view: &ModelView<'_>,
    options: &DetectOptions,
    sink: &mut dyn FindingSink,
) {
    let segments = view.segments();
    if segments.segments == 0 {
        return;
    }
    let retries = view.snapshot().stats.num_alloc_retries;
    let stuck = segments.inactive_split_bytes;
    let capacity = view.capacity(options.capacity);
    let peak_reserved = view.peak_reserved().max(segments.reserved);
    let near_capacity = capacity.is_some_and(|c| peak_reserved as f64 >= 0.9 * c as f64);
    let significant = stuck >= options.fragmentation_min_bytes
        && stuck as f64 >= options.fragmentation_ratio * segments.reserved as f64;
    let severity = if retries > 0 || (near_capacity && significant) {
        Severity::Warning
    } else if significant {
        Severity::Info
    } else {
        return;
    };
    let var = config_env_var(view.snapshot().source);
    let setting = setting_for(view, None);
    let mut f = Finding::at_group(view, FindingKind::Fragmentation, severity, None);
    f.bytes = stuck;
    f.count = segments.inactive_split_blocks;
    f.summary = format!(
        "{} of {} reserved is free but split inside segments that also hold live blocks (largest free block {}){}",
        format_bytes(stuck),
        format_bytes(segments.reserved),
        format_bytes(segments.largest_free_block),
        if retries > 0 {
            format!("; the allocator had to flush its cache and retry {retries} times")
        } else if near_capacity && significant {
            "; the peak came within 10% of the device's capacity".to_string()
        } else {
            String::new()
        }
    );
    let mut evidence = f
        .evidence
        .int("inactive_split_bytes", stuck)
        .int("inactive_split_blocks", segments.inactive_split_blocks)
        .int("reserved_bytes", segments.reserved)
        .int("allocated_bytes", segments.allocated)
        .int("releasable_bytes", segments.releasable_bytes)
        .int("largest_free_block", segments.largest_free_block)
        .int("alloc_retries", retries)
        .int("peak_reserved_bytes", peak_reserved);
    if let Some(c) = capacity {
        evidence = evidence.int("device_capacity_bytes", c);
    }
    f.evidence = evidence.text("setting", setting.clone());
    f.fix = format!(
        "set {var}={setting} to let freed pieces of segments be reused for larger requests"
    );
    sink.report(f);
}

/// The OOM with the largest request (the first one on ties).
fn largest<'a, 'e>(cases: &'a [OomCase<'e>]) -> Option<&'a OomCase<'e>> {
    cases
        .iter()
        .fold(None, |best: Option<&OomCase<'_>>, c| match best {
            Some(b) if b.event.size >= c.event.size => Some(b),
            _ => Some(c),
        })
}

/// The allocator setting to suggest: expandable segments when they are off, else a split limit
/// sized from the failed request (or from the largest free block).
fn setting_for(view: &ModelView<'_>, request: Option<u64>) -> String {
    let basis = request.unwrap_or(view.segments().largest_free_block);
    fragmentation_setting(&view.snapshot().config, basis)
}
