//! `empty_cache()` calls found in a trace: vramscope records each as an event, PyTorch only as
//! a burst of segment releases. The model view counts them for the `empty_cache_in_loop`
//! detector and the replay explains with them what releasing the cache cost.

use vramscope_model::{CallSite, Event, EventKind, SiteId, Snapshot};

/// One `empty_cache()` call found in a trace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EmptyCacheCall {
    /// Index of the call's first event (its `EmptyCache` event or first segment free).
    pub first_event: u32,
    /// Index of the call's last event.
    pub last_event: u32,
    /// The call site recorded with it (the stack of the `empty_cache()` call), if any.
    pub site: Option<SiteId>,
    /// Segments (or page runs) released.
    pub segments: u64,
    /// Bytes released.
    pub bytes: u64,
}

/// Whether a stack shows a call of `empty_cache()` (PyTorch's `emptyCache` in C++, or
/// `torch.cuda.empty_cache` in Python).
pub fn stack_calls_empty_cache(site: &CallSite) -> bool {
    let named = |f: &str| f.contains("emptyCache") || f.contains("empty_cache");
    named(&site.function) || site.frames.iter().any(|f| named(&f.function))
}

/// The `empty_cache()` calls of `snapshot`, in order.
///
/// A trace with `EmptyCache` events (vramscope's) has one call per event. PyTorch records no
/// such event: one call shows as a burst of consecutive `segment_free` (or `segment_unmap`)
/// events. A burst is a call when its stacks show `emptyCache`, or, when none of them has a
/// stack, when it is not part of an allocation: the allocator frees cached segments itself
/// only to retry a failed `cudaMalloc` (or to collect garbage), and then the next event is a
/// segment allocation or an OOM.
pub fn empty_cache_calls(snapshot: &Snapshot) -> Vec<EmptyCacheCall> {
    let events = &snapshot.events;
    if events.iter().any(|e| e.kind == EventKind::EmptyCache) {
        return events
            .iter()
            .enumerate()
            .filter(|(_, e)| e.kind == EventKind::EmptyCache)
            .map(|(i, e)| EmptyCacheCall {
                first_event: i as u32,
                last_event: i as u32,
                site: e.site(),
                segments: 0,
                bytes: e.size,
            })
            .collect();
    }
    let is_release = |e: &Event| matches!(e.kind, EventKind::SegmentFree | EventKind::SegmentUnmap);
    let mut calls = Vec::new();
    let mut i = 0;
    while i < events.len() {
        if !is_release(&events[i]) {
            i += 1;
            continue;
        }
        let start = i;
        while i < events.len() && is_release(&events[i]) && events[i].device == events[start].device
        {
            i += 1;
        }
        let burst = &events[start..i];
        let stacks: Vec<&CallSite> = burst
            .iter()
            .filter_map(|e| snapshot.sites.get(e.site()? as usize))
            .collect();
        let with_stacks: Vec<&&CallSite> = stacks.iter().filter(|s| !s.frames.is_empty()).collect();
        let is_call = if with_stacks.is_empty() {
            !events[i..]
                .iter()
                .find(|e| e.device == events[start].device)
                .is_some_and(|e| {
                    matches!(
                        e.kind,
                        EventKind::SegmentAlloc | EventKind::SegmentMap | EventKind::Oom
                    )
                })
        } else {
            with_stacks.iter().any(|s| stack_calls_empty_cache(s))
        };
        if is_call {
            calls.push(EmptyCacheCall {
                first_event: start as u32,
                last_event: (i - 1) as u32,
                site: burst.iter().find_map(|e| e.site()),
                segments: burst.len() as u64,
                bytes: burst.iter().fold(0u64, |a, e| a.saturating_add(e.size)),
            });
        }
    }
    calls
}
