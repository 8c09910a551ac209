//! The capacity a trace implies: a run that was short of memory says how much it had.
//!
//! A replay without a capacity runs on an unlimited device, and a trace that ran under pressure
//! then parts from it where PyTorch freed its cache to retry or ran out. Two kinds of event tell
//! the limit the recorded allocator ran under (the device, or a cap set with
//! `set_per_process_memory_fraction`):
//!
//! - **An OOM** whose request the device could not hold: its entry carries the device's free
//!   bytes, so reserved plus free is the limit, exactly as the driver saw it. When the device
//!   had room for the request, a cap refused it, and reserved plus what the request would
//!   have added is an upper bound.
//! - **A free-and-retry burst**: segment frees that no `empty_cache()` call made, right before
//!   a segment allocation that then succeeds. The allocator frees its cache only when a new
//!   segment would pass the limit, so the reserved bytes before the burst plus the new segment
//!   exceed it (an upper bound), and those after the burst plus the segment do not.
//!
//! Every reserved figure the trace reached is a lower bound. [`infer_capacity`] combines them:
//! an exact figure where an OOM gives one inside the bounds, otherwise the interval, replayed
//! at its middle, where any value repeats the trace's decisions. A trace with
//! `garbage_collection_threshold` frees its cache before it needs to, so its bursts bound
//! nothing; a trace whose bounds contradict each other (another process's use changed) gives
//! no capacity.

use serde::Serialize;
use vramscope_engine::Reconstruction;
use vramscope_model::oom::{cap_need, device_need};
use vramscope_model::{EventKind, Snapshot};

/// What the trace says of the capacity it ran under, and the figure a replay takes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct InferredCapacity {
    /// The capacity a replay runs under: the exact figure, or the middle of the bounds.
    pub bytes: u64,
    /// Whether `bytes` is the figure an OOM gave (reserved plus the device's free bytes);
    /// otherwise only `lower..=upper` is known.
    pub exact: bool,
    /// The least capacity the trace allows: the most it reserved.
    pub lower: u64,
    /// The greatest capacity the trace allows.
    pub upper: u64,
    /// The event that gave `bytes` or `upper`: the OOM (its sequence number), or the first
    /// free-and-retry burst's first segment free.
    pub source_seq: u64,
    /// Whether `source_seq` is an OOM (true) or a free-and-retry burst.
    pub source_is_oom: bool,
    /// Free-and-retry bursts found.
    pub retry_bursts: u64,
}

impl InferredCapacity {
    /// The sentence that says where the capacity comes from, as the replay's text prints it.
    pub fn describe(&self) -> String {
        let bytes = vramscope_model::format_bytes;
        let source = if self.source_is_oom {
            format!("the OOM at event {}", self.source_seq)
        } else {
            format!(
                "{} (the first at event {})",
                vramscope_model::plural(self.retry_bursts, "free-and-retry burst"),
                self.source_seq
            )
        };
        if self.exact {
            format!(
                "capacity {}, from {source} (reserved plus the device's free bytes)",
                bytes(self.bytes)
            )
        } else {
            format!(
                "capacity between {} and {}, from {source} and the peak reserved; replayed at {}, the middle",
                bytes(self.lower),
                bytes(self.upper),
                bytes(self.bytes)
            )
        }
    }
}

/// The capacity `snapshot` implies (the module documentation says how), from the walk
/// `walk` of its events; `None` where nothing limited it or its bounds contradict each other.
pub fn infer_capacity(snapshot: &Snapshot, walk: &Reconstruction) -> Option<InferredCapacity> {
    if !walk.reserved_known {
        return None;
    }
    let config = crate::trace_settings(snapshot);
    let events: &[vramscope_model::Event] = &snapshot.events;
    let device = snapshot.device.index;
    let reserved_before = |i: usize| walk.usage_at(i).reserved;
    let lower = walk.peak_reserved.bytes.max(walk.start.usage().reserved);
    let mut upper = u64::MAX;
    // The OOM that gives the figure, or the event of the tightest upper bound.
    let mut exact: Option<(u64, u64)> = None;
    let mut first_source: Option<(u64, bool)> = None;
    let mut bursts = 0u64;
    let empty_cache: rustc_hash::FxHashSet<u32> = vramscope_engine::empty_cache_calls(snapshot)
        .iter()
        .map(|c| c.first_event)
        .collect();
    let bursts_bound = config.garbage_collection_threshold.is_none();
    let is_release = |e: &vramscope_model::Event| {
        matches!(e.kind, EventKind::SegmentFree | EventKind::SegmentUnmap)
    };
    let mut i = 0;
    while i < events.len() {
        let e = &events[i];
        if u32::from(e.device) != device {
            i += 1;
            continue;
        }
        if e.kind == EventKind::Oom {
            let reserved = reserved_before(i);
            if e.device_free < device_need(&config, e.size) && e.device_free > 0 {
                // The device itself had no room: the limit is what it had.
                if exact.is_none() {
                    exact = Some((reserved.saturating_add(e.device_free), e.seq));
                }
                first_source.get_or_insert((e.seq, true));
            } else {
                // The device had room: a cap refused the request.
                let bound = reserved
                    .saturating_add(cap_need(&config, e.size))
                    .saturating_sub(1);
                if bound < upper {
                    upper = bound;
                }
                first_source.get_or_insert((e.seq, true));
            }
            i += 1;
            continue;
        }
        if !is_release(e) || empty_cache.contains(&(i as u32)) {
            i += 1;
            continue;
        }
        let start = i;
        while i < events.len() && is_release(&events[i]) && events[i].device == e.device {
            i += 1;
        }
        let Some(next) = events[i..].iter().position(|n| n.device == e.device) else {
            break;
        };
        let next = i + next;
        let grows = match events[next].kind {
            EventKind::SegmentAlloc => Some(cap_need(&config, events[next].size)),
            EventKind::SegmentMap => events[next..]
                .iter()
                .find(|n| n.device == e.device && n.kind == EventKind::Alloc)
                .map(|alloc| cap_need(&config, alloc.size).max(events[next].size)),
            _ => None,
        };
        if let (Some(grows), true) = (grows, bursts_bound) {
            bursts += 1;
            let bound = reserved_before(start)
                .saturating_add(grows)
                .saturating_sub(1);
            upper = upper.min(bound);
            first_source.get_or_insert((events[start].seq, false));
        }
    }
    let (source_seq, source_is_oom) = first_source?;
    if let Some((bytes, seq)) = exact {
        if bytes >= lower && bytes <= upper {
            return Some(InferredCapacity {
                bytes,
                exact: true,
                lower,
                upper: upper.min(bytes),
                source_seq: seq,
                source_is_oom: true,
                retry_bursts: bursts,
            });
        }
    }
    if upper == u64::MAX || lower > upper {
        return None;
    }
    Some(InferredCapacity {
        bytes: lower + (upper - lower) / 2,
        exact: false,
        lower,
        upper,
        source_seq,
        source_is_oom,
        retry_bursts: bursts,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{replay, ReplayOptions};
    use vramscope_caching::{CachingAllocator, SimDevice};
    use vramscope_model::AllocatorConfig;

    const MIB: u64 = 1 << 20;

    /// A run on a device of `capacity` bytes that holds 64 MiB of weights, caches 20 MiB and
    /// then keeps
    /// 40 MiB activations until one does not fit (an OOM), frees them and goes on.
    fn ran_out(capacity: u64) -> Snapshot {
        let alloc = CachingAllocator::new(SimDevice::phantom(capacity), AllocatorConfig::default());
        let _weights = alloc.alloc(64 * MIB).unwrap();
        // A cached segment, which the allocator frees before it gives up.
        drop(alloc.alloc(20 * MIB).unwrap());
        let mut held = Vec::new();
        while let Ok(block) = alloc.alloc(40 * MIB) {
            held.push(block);
        }
        held.clear();
        drop(alloc.alloc(30 * MIB).unwrap());
        alloc.snapshot()
    }

    /// A run that, on a small device, frees its cache to retry three times: each block is
    /// cached when the next, larger one is asked for (100, 150, 160 and 170 MiB).
    fn retried(capacity: u64) -> Snapshot {
        let alloc = CachingAllocator::new(SimDevice::phantom(capacity), AllocatorConfig::default());
        for size in [100, 150, 160, 170] {
            drop(alloc.alloc(size * MIB).unwrap());
        }
        alloc.snapshot()
    }

    fn inferred(snapshot: &Snapshot) -> Option<InferredCapacity> {
        infer_capacity(snapshot, &Reconstruction::from_snapshot(snapshot))
    }

    #[test]
    fn an_oom_gives_the_device_exactly() {
        let snapshot = ran_out(250 * MIB);
        let capacity = inferred(&snapshot).expect("the OOM says");
        assert!(capacity.exact);
        assert!(capacity.source_is_oom);
        assert_eq!(capacity.bytes, 250 * MIB);
        let oom = snapshot
            .events
            .iter()
            .find(|e| e.kind == EventKind::Oom)
            .unwrap();
        assert_eq!(capacity.source_seq, oom.seq);
        assert!(capacity.describe().starts_with(&format!(
            "capacity 250 MiB, from the OOM at event {}",
            oom.seq
        )));
    }

    #[test]
    fn retry_bursts_bound_the_device() {
        let snapshot = retried(200 * MIB);
        let capacity = inferred(&snapshot).expect("the retries say");
        assert!(!capacity.exact);
        assert_eq!(capacity.retry_bursts, 3);
        assert_eq!(snapshot.stats.num_alloc_retries, 3);
        assert_eq!(capacity.lower, 170 * MIB, "the most it reserved");
        assert_eq!(
            capacity.upper,
            250 * MIB - 1,
            "100 MiB cached and 150 more failed"
        );
        assert!((capacity.lower..=capacity.upper).contains(&(200 * MIB)));
        assert!(
            capacity.describe().contains("between"),
            "{}",
            capacity.describe()
        );
    }

    #[test]
    fn a_trace_without_pressure_implies_nothing() {
        let snapshot = retried(1 << 40);
        assert_eq!(snapshot.stats.num_alloc_retries, 0);
        assert_eq!(inferred(&snapshot), None);
    }

    #[test]
    fn replays_under_the_inferred_capacity_make_the_traces_calls() {
        for snapshot in [ran_out(250 * MIB), retried(200 * MIB)] {
            let mut options = ReplayOptions {
                trace_settings: true,
                verify: true,
                ..ReplayOptions::default()
            };
            // On an unlimited device the replay parts from the trace.
            let unlimited = replay(&snapshot, &options, &mut |_, _| {});
            assert!(unlimited.device_calls.as_ref().unwrap().differs());
            options.infer_capacity = true;
            let result = replay(&snapshot, &options, &mut |_, _| {});
            let check = result.device_calls.as_ref().unwrap();
            assert!(!check.differs(), "{check:?}");
            assert_eq!(result.figures.num_ooms, result.original.num_ooms);
            let inferred = result.inferred_capacity.clone().expect("inferred");
            assert_eq!(result.capacity, inferred.bytes);
            // A capacity given wins, and nothing is inferred.
            options.capacity = Some(1 << 40);
            let given = replay(&snapshot, &options, &mut |_, _| {});
            assert_eq!(given.inferred_capacity, None);
            assert_eq!(given.capacity, 1 << 40);
        }
    }
}
