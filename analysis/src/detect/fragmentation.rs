//! `fragmentation` and `oom`: reserved memory the program cannot use, and failed allocations.
//!
//! Every `Oom` event is diagnosed by the allocator's own rule (`vramscope_model::oom::diagnose`,
//! so that its OOM message and this report agree) from the state around it: the allocated and
//! reserved bytes on the timeline of `crate::model_view`, the device's free memory the event
//! recorded, and the largest free block its request could have used (on its stream, in its
//! pool), read from the engine's state at that event. The OOMs of each cause are one finding,
//! named at the largest request:
//!
//! - `fragmentation` (error) when the cache's free bytes alone would have covered the request
//!   and the device could not, with the setting that helps (`expandable_segments:True`, none
//!   when segments are already expandable);
//! - `oom` (error) otherwise, with the cause's sentence and fix: the process's memory cap
//!   (`set_per_process_memory_fraction`) when the device had room for what the allocator
//!   needed, a block that `max_split_size_mb` kept from the request, or memory in use, with the
//!   largest holder at that moment.
//!
//! Without an OOM explained by fragmentation, free memory split inside plain segments matters
//! only under memory pressure: allocation retries (`num_alloc_retries`) or a peak close to
//! capacity with much free memory stuck in split segments give a warning; a large share of
//! split free memory alone is information. Expandable segments are left out, as PyTorch's own
//! `inactive_split_bytes` leaves them out: their free blocks merge with their neighbours, their
//! whole free pages go back to the device (on `empty_cache()`, or before an allocation fails),
//! and `max_split_size_mb` does not limit how they split.

use vramscope_engine::{MemoryState, Reconstruction};
use vramscope_model::oom::{diagnose, OomCause, OomDiagnosis, OomFacts, SettingNames};
use vramscope_model::{format_bytes, BlockState, Event, Pool, Snapshot, MIB};
use vramscope_model::{Category, CategoryBytes};

use super::{config_env_var, DetectOptions, Finding, FindingKind, FindingSink, Severity};
use crate::model_view::{Holding, ModelView};

/// OOMs whose largest usable free block is looked up; later ones go without it (each lookup
/// goes over every segment and live block of the state at its OOM).
const MAX_OOMS_SIZED: usize = 64;

/// One OOM event, the state around it and its diagnosis.
struct OomCase<'e> {
    index: u32,
    event: &'e Event,
    diagnosis: OomDiagnosis,
    /// What held the most memory in the walk's own state at the OOM; `None` past the first
    /// [`MAX_OOMS_SIZED`] (or with nothing held).
    holder: Option<Holding>,
}

/// Reports fragmentation and OOMs.
pub fn fragmentation(view: &ModelView<'_>, options: &DetectOptions, sink: &mut dyn FindingSink) {
    let cases = diagnose_ooms(view);
    let mut causes: Vec<OomCause> = cases.iter().map(|c| c.diagnosis.cause).collect();
    causes.sort_unstable();
    causes.dedup();
    let reported: Vec<(&OomCase<'_>, Vec<&OomCase<'_>>)> = causes
        .into_iter()
        .filter_map(|cause| {
            let same: Vec<&OomCase<'_>> = cases
                .iter()
                .filter(|c| c.diagnosis.cause == cause)
                .collect();
            largest(&same).map(|worst| (worst, same))
        })
        .collect();
    // What was live names what to lower when the peak is the problem. The holders of the
    // first OOMs were found with their free blocks; a later one's takes a walk of its own.
    let names_holder =
        |case: &OomCase<'_>| matches!(case.diagnosis.cause, OomCause::InUse | OomCause::Cap { .. });
    let without_holder: Vec<u32> = reported
        .iter()
        .filter(|(worst, _)| names_holder(worst) && worst.holder.is_none())
        .map(|(worst, _)| worst.index)
        .collect();
    let later_holders = largest_holders_after(view, &without_holder);
    for (worst, same) in &reported {
        let holder = if names_holder(worst) {
            worst.holder.clone().or_else(|| {
                later_holders
                    .iter()
                    .find(|(index, _)| *index == worst.index)
                    .map(|(_, h)| h.clone())
            })
        } else {
            None
        };
        report_oom(view, options, worst, same, holder, sink);
    }
    // An OOM explained by fragmentation says it all; without one, look for pressure, then
    // for a large share of split free memory.
    if !cases.iter().any(|c| c.diagnosis.is_fragmentation()) {
        report_split_free_memory(view, options, sink);
    }
}

/// The OOMs of the trace, each diagnosed by the allocator's rule.
fn diagnose_ooms<'e>(view: &ModelView<'e>) -> Vec<OomCase<'e>> {
    let snapshot = view.snapshot();
    let ooms = view.ooms();
    let reserved_known = view.reserved_known();
    ooms.iter()
        .zip(states_at_ooms(view, ooms))
        .map(|(&index, (largest_usable_free_block, holder))| {
            let largest_usable_free_block = largest_usable_free_block.filter(|_| reserved_known);
            let event = &snapshot.events[index as usize];
            let (allocated, reserved) = view.usage_at(index);
            let facts = OomFacts {
                request: event.size,
                allocated,
                reserved: reserved_known.then_some(reserved),
                device_free: event.device_free,
                largest_usable_free_block,
                // A snapshot does not record the process's cap; the rule infers it from the
                // device's free memory.
                cap: None,
                // Nor whether an address range was refused: only a live allocator sees that.
                address_space_refused: false,
            };
            OomCase {
                index,
                event,
                diagnosis: diagnose(&facts, &snapshot.config),
                holder,
            }
        })
        .collect()
}

/// For each OOM event at `ooms`, from one walk back (`Reconstruction::states_after`), in the
/// engine walk's own state after that event, whose allocated and reserved bytes the diagnosis
/// is given: the largest free block its request could have used (on its device and stream, in
/// its pool: small for requests up to 1 MiB), and what held the most memory there. `None`s
/// past the first [`MAX_OOMS_SIZED`].
fn states_at_ooms(view: &ModelView<'_>, ooms: &[u32]) -> Vec<(Option<u64>, Option<Holding>)> {
    let snapshot = view.snapshot();
    let mut at = vec![(None, None); ooms.len()];
    let sized = &ooms[..ooms.len().min(MAX_OOMS_SIZED)];
    Reconstruction::states_after(snapshot, sized, |index, state| {
        let e = &snapshot.events[index as usize];
        let pool = if e.size <= MIB {
            Pool::Small
        } else {
            Pool::Large
        };
        let largest = largest_free_block(state, u32::from(e.device), e.stream, pool);
        let holder = view.holdings_in(state).into_iter().next();
        for (slot, _) in sized.iter().enumerate().filter(|&(_, &i)| i == index) {
            at[slot] = (Some(largest), holder.clone());
        }
    });
    at
}

/// What held the most memory just after each event of `indices`, in the engine walk's own
/// state there, whose allocated bytes the diagnosis is given: memory from before the trace
/// counts, as in the "at peak" column.
fn largest_holders_after(view: &ModelView<'_>, indices: &[u32]) -> Vec<(u32, Holding)> {
    let mut holders = Vec::with_capacity(indices.len());
    Reconstruction::states_after(view.snapshot(), indices, |index, state| {
        if let Some(top) = view.holdings_in(state).into_iter().next() {
            holders.push((index, top));
        }
    });
    holders
}

/// The largest free block in the segments (mapped runs) of `state` on `device` and `stream`
/// in `pool`: the largest gap between live blocks, or at a segment's ends.
fn largest_free_block(state: &MemoryState, device: u32, stream: u64, pool: Pool) -> u64 {
    let mut largest = 0;
    for (&base, segment) in &state.segments {
        if segment.device != device || segment.stream != stream || segment.pool != pool {
            continue;
        }
        let end = base.saturating_add(segment.size);
        let mut cursor = base;
        for (&addr, block) in state.blocks_in(base, segment.size) {
            largest = largest.max(addr.saturating_sub(cursor));
            cursor = cursor.max(addr.saturating_add(block.size));
        }
        largest = largest.max(end.saturating_sub(cursor));
    }
    largest
}

/// Reports the OOMs of one cause, `same`, at the `worst` of them: `fragmentation` when the
/// cause is fragmentation, else `oom`.
fn report_oom(
    view: &ModelView<'_>,
    options: &DetectOptions,
    worst: &OomCase<'_>,
    same: &[&OomCase<'_>],
    top: Option<Holding>,
    sink: &mut dyn FindingSink,
) {
    let d = &worst.diagnosis;
    let facts = &d.facts;
    let kind = if d.is_fragmentation() {
        FindingKind::Fragmentation
    } else {
        FindingKind::Oom
    };
    let group = worst.event.site().and_then(|s| view.group_of_site(s));
    let mut f = Finding::at_group(view, kind, Severity::Error, group);
    f.bytes = facts.request;
    f.count = same.len() as u64;
    f.first_step = same.iter().map(|c| u64::from(c.event.step)).min();
    f.last_step = same.iter().map(|c| u64::from(c.event.step)).max();
    // A group's name as every table prints it: `file:line`, or "(before the trace)".
    let site_of = |h: &Holding| view.group(h.group).label().to_string();
    // What the memory was made of at the failing request, from the classifier over the
    // engine's state there (`crate::categories`).
    let made_of = view
        .categories_after(&[worst.index])
        .pop()
        .unwrap_or_default();
    f.summary = format!(
        "an allocation of {} failed: {}{}{}",
        format_bytes(facts.request),
        d.explanation(),
        match &top {
            Some(h) => format!(
                "; the largest holder is {} with {}",
                site_of(h),
                format_bytes(h.bytes)
            ),
            None => String::new(),
        },
        match composition(&made_of) {
            Some(text) => format!("; the memory allocated then was {text}"),
            None => String::new(),
        }
    );
    let mut evidence = f
        .evidence
        .int("ooms", same.len() as u64)
        .text("cause", d.cause.as_str())
        .int("request_bytes", facts.request)
        .int("device_free_bytes", facts.device_free)
        .int("device_need_bytes", d.device_need)
        .int("allocated_bytes_at_oom", facts.allocated);
    if let (Some(reserved), Some(cached)) = (facts.reserved, d.cached()) {
        evidence = evidence
            .int("reserved_bytes_at_oom", reserved)
            .int("reserved_unallocated_bytes_at_oom", cached);
    }
    if let Some(largest) = facts.largest_usable_free_block {
        evidence = evidence.int("largest_usable_free_block_bytes_at_oom", largest);
    }
    if let Some(c) = view.capacity(options.capacity) {
        evidence = evidence.int("device_capacity_bytes", c);
    }
    if let Some(h) = &top {
        evidence = evidence
            .text("largest_holder", site_of(h))
            .int("largest_holder_bytes", h.bytes);
    }
    if let Some(setting) = d.setting() {
        evidence = evidence.text("setting", setting);
    }
    for (category, bytes) in made_of.nonzero() {
        evidence = evidence.int(&format!("{}_bytes_at_oom", category.as_str()), bytes);
    }
    f.evidence = evidence;
    f.fix = d.fix(SettingNames::for_source(view.snapshot().source));
    // Where the memory in use is the problem, the fix follows the largest category the
    // classifier knows, when it holds a fair share; never one from unknown memory.
    let in_use = matches!(d.cause, OomCause::InUse | OomCause::Cap { .. });
    if let Some(advice) = in_use.then(|| category_advice(&made_of)).flatten() {
        f.fix = format!("{advice}; {}", f.fix);
    }
    sink.report(f);
}

/// The share of `bytes` that `part` is, as `61 %` (`<1 %` for a sliver).
fn percent(part: u64, whole: u64) -> String {
    let share = part as f64 / whole.max(1) as f64;
    if share < 0.005 {
        "<1 %".to_string()
    } else {
        format!("{:.0} %", share * 100.0)
    }
}

/// What a moment's memory was made of, the largest category first (`activations 61 %,
/// parameters 20 %, unknown 19 %`); `None` with no bytes.
fn composition(bytes: &CategoryBytes) -> Option<String> {
    let total = bytes.total();
    if total == 0 {
        return None;
    }
    let mut parts: Vec<(Category, u64)> = bytes.nonzero().collect();
    parts.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    Some(
        parts
            .iter()
            .map(|&(c, b)| format!("{} {}", c.label(), percent(b, total)))
            .collect::<Vec<_>>()
            .join(", "),
    )
}

/// The smallest share of the allocated memory the largest known category must hold for an
/// OOM's fix to follow it: below it, the category is not what filled the device.
const ADVICE_MIN_SHARE: f64 = 0.25;

/// What to do about the largest category the classifier knows in `bytes` (`activations 61 %:
/// try activation checkpointing or a smaller micro-batch`), when it holds at least
/// [`ADVICE_MIN_SHARE`] of them; never for unknown memory or memory from before the trace,
/// whose kind the trace does not show.
fn category_advice(bytes: &CategoryBytes) -> Option<String> {
    let total = bytes.total();
    let (category, held) = bytes
        .nonzero()
        .filter(|&(c, _)| !matches!(c, Category::Unknown | Category::BeforeTrace))
        .max_by(|a, b| a.1.cmp(&b.1).then(b.0.cmp(&a.0)))?;
    if (held as f64) < ADVICE_MIN_SHARE * total as f64 {
        return None;
    }
    let remedy = match category {
        Category::Activations => "try activation checkpointing or a smaller micro-batch",
        Category::Parameters => {
            "try lower-precision weights, sharding the parameters (FSDP) or offloading them"
        }
        Category::OptimizerState => {
            "try a smaller optimizer state (8-bit or factored optimizers), sharding it (ZeRO, FSDP) or offloading it"
        }
        Category::Gradients => {
            "try freeing gradients as soon as they are used (zero_grad(set_to_none=True)), lower-precision gradients or sharding them (ZeRO-2, FSDP)"
        }
        Category::Temporaries => {
            "try computing in smaller chunks (a smaller batch, chunked attention or loss) so each step's scratch is smaller"
        }
        Category::Inputs => "try a smaller batch, or copying each batch to the device just before it is used",
        Category::BeforeTrace | Category::Unknown => return None,
    };
    Some(format!(
        "{} {} of the allocated memory: {remedy}",
        category.label(),
        percent(held, total)
    ))
}

/// Free memory inside plain (not expandable) segments at the snapshot.
#[derive(Default)]
struct PlainSplit {
    /// Free bytes in plain segments that also hold an active block (PyTorch's
    /// `inactive_split_bytes`).
    bytes: u64,
    /// Free blocks in them.
    blocks: u64,
    /// The largest of those free blocks.
    largest_free_block: u64,
    /// Free bytes in plain segments without an active block (`empty_cache()` releases them).
    releasable: u64,
}

/// The free memory of the snapshot's plain segments, split or releasable.
fn plain_split(snapshot: &Snapshot) -> PlainSplit {
    let mut s = PlainSplit::default();
    for segment in snapshot.segments.iter().filter(|s| !s.expandable) {
        // Sums saturate: an imported file may hold absurd sizes.
        let active = segment
            .blocks
            .iter()
            .filter(|b| b.state != BlockState::Inactive)
            .fold(0u64, |sum, b| sum.saturating_add(b.size));
        let free = segment.total_size.saturating_sub(active);
        if active == 0 {
            s.releasable = s.releasable.saturating_add(free);
            continue;
        }
        s.bytes = s.bytes.saturating_add(free);
        for block in segment
            .blocks
            .iter()
            .filter(|b| b.state == BlockState::Inactive)
        {
            s.blocks += 1;
            s.largest_free_block = s.largest_free_block.max(block.size);
        }
    }
    s
}

/// Reports free memory stuck in split plain segments: a warning under memory pressure
/// (allocation retries, or a peak near capacity with a large share stuck), information for a
/// large share alone.
fn report_split_free_memory(
    view: &ModelView<'_>,
    options: &DetectOptions,
    sink: &mut dyn FindingSink,
) {
    let segments = view.segments();
    let split = plain_split(view.snapshot());
    let stuck = split.bytes;
    if segments.segments == 0 || stuck == 0 {
        return;
    }
    let retries = view.snapshot().stats.num_alloc_retries;
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
    let config = &view.snapshot().config;
    let expandable_on = config.uses_expandable_segments();
    let mut f = Finding::at_group(view, FindingKind::Fragmentation, severity, None);
    f.bytes = stuck;
    f.count = split.blocks;
    f.summary = format!(
        "{} of {} reserved is free but split inside {}segments that also hold live blocks (largest free block {}){}",
        format_bytes(stuck),
        format_bytes(segments.reserved),
        if expandable_on { "plain (not expandable) " } else { "" },
        format_bytes(split.largest_free_block),
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
        .int("inactive_split_blocks", split.blocks)
        .int("reserved_bytes", segments.reserved)
        .int("allocated_bytes", segments.allocated)
        .int("releasable_bytes", split.releasable)
        .int("largest_free_block_bytes", split.largest_free_block)
        .int("alloc_retries", retries)
        .int("peak_reserved_bytes", peak_reserved);
    if let Some(c) = capacity {
        evidence = evidence.int("device_capacity_bytes", c);
    }
    let var = config_env_var(view.snapshot().source);
    if expandable_on {
        f.fix = "these segments are plain although expandable segments are on (made before the setting took effect, or in a pool that does not use them): free the live blocks that pin them, and empty_cache() then releases them".to_string();
    } else {
        let setting = "expandable_segments:True";
        evidence = evidence.text("setting", setting);
        f.fix = format!(
            "set {var}={setting}: segments then grow in place, and the whole free pages of partly used ones can go back to the device"
        );
    }
    f.evidence = evidence;
    sink.report(f);
}

/// The OOM with the largest request (the first one on ties).
fn largest<'a, 'e>(cases: &[&'a OomCase<'e>]) -> Option<&'a OomCase<'e>> {
    cases
        .iter()
        .copied()
        .fold(None, |best: Option<&OomCase<'_>>, c| match best {
            Some(b) if b.event.size >= c.event.size => Some(b),
            _ => Some(c),
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use vramscope_model::EventKind;

    proptest::proptest! {
    #![proptest_config(vramscope_testkit::props::config(256))]
        /// Whatever the trace, consistent or not (blocks freed twice or never allocated,
        /// allocations over live blocks), the largest free block and the largest holder at each
        /// OOM are the ones in the engine walk's own state there, whose allocated and reserved
        /// bytes the diagnosis is given, not ones in a walk forwards from the start.
        #[test]
        fn the_largest_free_block_at_an_oom_is_in_the_walks_own_state(
            ops in vramscope_testkit::generated::ops(1..5, 1..60),
            live_at_dump in vramscope_testkit::generated::live_at_dump(),
        ) {
            let snapshot = vramscope_testkit::generated::trace_of_ops(&ops, &live_at_dump);
            let ooms: Vec<u32> = snapshot
                .events
                .iter()
                .enumerate()
                .filter(|(_, e)| e.kind == EventKind::Oom)
                .map(|(i, _)| i as u32)
                .collect();
            let view = ModelView::new(&snapshot);
            let found = states_at_ooms(&view, &ooms);
            let walk = Reconstruction::with_states(&snapshot);
            for (&index, (largest, holder)) in ooms.iter().zip(found) {
                let state = walk.state_walked(&snapshot.events, index as usize + 1);
                proptest::prop_assert_eq!(state.usage(), walk.usage_at(index as usize + 1));
                let e = &snapshot.events[index as usize];
                let pool = if e.size <= MIB { Pool::Small } else { Pool::Large };
                let expected = largest_free_block(&state, u32::from(e.device), e.stream, pool);
                proptest::prop_assert_eq!(largest, Some(expected), "OOM at {}", index);
                // The holder is the largest of what that state holds, which sums to the
                // allocated bytes the diagnosis is given.
                let held = view.holdings_in(&state);
                proptest::prop_assert_eq!(
                    held.iter().map(|h| h.bytes).sum::<u64>(),
                    view.usage_at(index).0
                );
                proptest::prop_assert_eq!(holder.as_ref(), held.first());
            }
        }
    }
}
