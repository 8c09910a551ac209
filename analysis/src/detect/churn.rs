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
//!
//! A cached block serves only the stream it was allocated on. A program that runs its work on
//! many streams (an offloading loader with a stream per model shard) keeps a cache per stream,
//! and near capacity the allocator frees one stream's cached segments to allocate on another:
//! churn that no setting and no lower peak removes. When the loop's segments are spread over
//! several streams and most of its releases free one stream's cache to allocate on another
//! (`StreamCaches`), the finding says so (how many streams, the bytes released from each) and
//! gives the fix that follows: fewer streams, one copy stream shared by the shards, or
//! `record_stream` so that freed blocks return to one stream's cache.

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
        let streams = stream_caches(view);
        if let Some(s) = &streams {
            let per_stream = per_step(s.released_bytes) / s.streams as f64;
            f.summary.push_str(&format!(
                "; the segments are spread over {} streams, and {} of the {} segment releases free one stream's cached memory to allocate on another (a cached block serves only its own stream): about {} released from each stream's cache per step",
                s.streams,
                s.cross_releases,
                s.releases,
                format_bytes(per_stream.round() as u64)
            ));
            f.evidence = std::mem::take(&mut f.evidence)
                .int("streams", s.streams)
                .int("cross_stream_releases", s.cross_releases)
                .float("released_bytes_per_stream_per_step", per_stream);
        }
        f.fix = if empty_calls > 0 {
            format!(
                "remove the torch.cuda.empty_cache() call{} from the loop (call it once after training, if at all): each call hands the cache back to the device and the next step pays cudaMalloc for it again",
                empty_cache_line
                    .as_ref()
                    .map(|(l, _)| format!(" at {l}"))
                    .unwrap_or_default()
            )
        } else if let Some(s) = &streams {
            format!(
                "each of the {} streams keeps its own cache, and the device cannot hold them all: use fewer streams (one copy stream shared by every shard rather than one per shard), or allocate on one stream and call tensor.record_stream(stream) where another stream uses the tensor, so that freed blocks return to one cache",
                s.streams
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

/// What the loop's segment calls say of per-stream caches ([`stream_caches`]).
struct StreamCaches {
    /// Streams that allocate segments in the loop.
    streams: u64,
    /// The loop's segment releases, and those followed by a segment allocation on another
    /// stream (one stream's cache freed to make room on another).
    releases: u64,
    cross_releases: u64,
    /// Bytes the loop's releases freed.
    released_bytes: u64,
}

/// Whether the loop's churn comes from per-stream caches: its segments are allocated on two
/// streams or more, and at least half of its segment releases are followed by a segment
/// allocation on a stream other than the released segment's. `None` otherwise.
fn stream_caches(view: &ModelView<'_>) -> Option<StreamCaches> {
    let loop_steps = view.loop_steps();
    let events = &view.snapshot().events;
    let mut streams: Vec<u64> = Vec::new();
    let mut released_since: Vec<u64> = Vec::new();
    let (mut releases, mut cross_releases, mut released_bytes) = (0u64, 0u64, 0u64);
    for (i, e) in events.iter().enumerate() {
        let releasing = matches!(e.kind, EventKind::SegmentFree | EventKind::SegmentUnmap);
        let allocating = matches!(e.kind, EventKind::SegmentAlloc | EventKind::SegmentMap);
        if !(releasing || allocating) || !loop_steps.contains(&view.event_step(i as u32)) {
            continue;
        }
        if releasing {
            releases += 1;
            released_bytes = released_bytes.saturating_add(e.size);
            released_since.push(e.stream);
        } else {
            if let Err(at) = streams.binary_search(&e.stream) {
                streams.insert(at, e.stream);
            }
            cross_releases += released_since.drain(..).filter(|&s| s != e.stream).count() as u64;
        }
    }
    (streams.len() >= 2 && releases > 0 && cross_releases * 2 >= releases).then_some(StreamCaches {
        streams: streams.len() as u64,
        releases,
        cross_releases,
        released_bytes,
    })
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
