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
    // A slice once: indexing `Events` itself looks up its store at every event.
    let events: &[Event] = &snapshot.events;
    let is_release = |e: &Event| matches!(e.kind, EventKind::SegmentFree | EventKind::SegmentUnmap);
    // One pass finds both kinds of call, which a big trace's size (80 bytes an event) makes
    // worth a second list: the explicit events win where there are any.
    let mut explicit = Vec::new();
    let mut bursts = Vec::new();
    let mut i = 0;
    while i < events.len() {
        if events[i].kind == EventKind::EmptyCache {
            explicit.push(EmptyCacheCall {
                first_event: i as u32,
                last_event: i as u32,
                site: events[i].site(),
                segments: 0,
                bytes: events[i].size,
            });
        }
        if !is_release(&events[i]) || !explicit.is_empty() {
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
            bursts.push(EmptyCacheCall {
                first_event: start as u32,
                last_event: (i - 1) as u32,
                site: burst.iter().find_map(|e| e.site()),
                segments: burst.len() as u64,
                bytes: burst.iter().fold(0u64, |a, e| a.saturating_add(e.size)),
            });
        }
    }
    if explicit.is_empty() {
        bursts
    } else {
        explicit
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::tests::ev;
    use vramscope_model::Id;

    fn snapshot(events: Vec<Event>) -> Snapshot {
        let mut snapshot = Snapshot::empty(Default::default(), Default::default());
        snapshot.events = events.into();
        snapshot
    }

    /// A burst of segment frees without stacks is a call unless an allocation follows it (the
    /// allocator freeing its cache to retry); one on another device starts its own burst.
    #[test]
    fn bursts_of_segment_frees_are_calls_unless_an_allocation_follows() {
        let mut events = vec![
            ev(EventKind::SegmentAlloc, 0x1000, 4096),
            ev(EventKind::SegmentFree, 0x1000, 4096),
            ev(EventKind::SegmentFree, 0x2000, 2048),
            ev(EventKind::Alloc, 0x9000, 512),
            ev(EventKind::SegmentFree, 0x3000, 1024),
            ev(EventKind::SegmentAlloc, 0x4000, 8192),
            ev(EventKind::SegmentUnmap, 0x5000, 512),
            ev(EventKind::SegmentFree, 0x6000, 256),
        ];
        events[7].device = 1;
        for e in &mut events {
            e.site = None;
        }
        let calls = empty_cache_calls(&snapshot(events));
        let spans: Vec<(u32, u32, u64, u64)> = calls
            .iter()
            .map(|c| (c.first_event, c.last_event, c.segments, c.bytes))
            .collect();
        assert_eq!(spans, [(1, 2, 2, 6144), (6, 6, 1, 512), (7, 7, 1, 256)]);
    }

    /// Where the trace records its calls as events (vramscope's), those are the calls, and
    /// bursts of segment frees, before or after the first one, are not counted again.
    #[test]
    fn explicit_calls_win_over_bursts_wherever_they_are() {
        let mut call = ev(EventKind::EmptyCache, 0, 6144);
        call.site = Id::new(7);
        let events = vec![
            ev(EventKind::SegmentFree, 0x1000, 4096),
            ev(EventKind::SegmentFree, 0x2000, 2048),
            call,
            ev(EventKind::SegmentFree, 0x3000, 1024),
            ev(EventKind::EmptyCache, 0, 0),
        ];
        let calls = empty_cache_calls(&snapshot(events));
        let found: Vec<(u32, Option<u32>, u64)> = calls
            .iter()
            .map(|c| (c.first_event, c.site, c.bytes))
            .collect();
        assert_eq!(found, [(2, Some(7), 6144), (4, Some(1), 0)]);
    }
}
