//! Reading the allocator out: snapshots in the one data model (`crate::model`), and the live
//! pulls that a consumer repeats (events since a sequence number, new call-site tables,
//! statistics).
//!
//! Everything here takes the device lock only to copy: the state's segments and blocks
//! (`super::state`), raw ring entries and provenance tuples; converting events and symbolizing
//! call sites happens after the lock is released, so that a dashboard (`crate::telemetry`, the
//! `tui` crate) or a metrics scrape (`crate::metrics`) holds the program up for a copy, not a
//! conversion.

use super::state::{RawEventParts, State, ALLOCATED, PENDING_FREE, UNMAPPED};
use super::CachingAllocator;
use crate::backend::Backend;
use crate::model::{
    Block, BlockState, DeviceInfo, EventKind, Id, Segment, Snapshot, SnapshotSource, StepMark,
};
use crate::provenance::{Provenance, NIL};
use crate::ring::RawEvent;
use crate::stats::MemoryStats;

/// A batch of events pulled from the ring by [`CachingAllocator::events_since`].
#[derive(Clone, Debug, PartialEq)]
pub struct EventBatch {
    /// The events, oldest first.
    pub events: Vec<crate::model::Event>,
    /// The sequence number to ask for next.
    pub next_seq: u64,
    /// Events after the requested sequence number that were overwritten before this pull.
    pub missed: u64,
    /// Statistics at the time of the pull.
    pub stats: MemoryStats,
    /// The current step number.
    pub step: u64,
}

/// The tables that events and blocks index by id.
#[derive(Clone, Debug, PartialEq)]
pub struct SiteTables {
    /// Call sites by `SiteId`.
    pub sites: Vec<crate::model::CallSite>,
    /// Tags by `TagId`.
    pub tags: Vec<String>,
    /// Scope paths by `ScopeId`.
    pub scopes: Vec<String>,
}

/// The model's event for ring entry `raw`, number `seq`, its provenance read in
/// `provenances` (by id).
fn event_of(
    seq: u64,
    raw: &RawEvent,
    provenances: &[Provenance],
    ns_per_tick: f64,
    device: u32,
) -> crate::model::Event {
    let p = provenances
        .get(raw.provenance as usize)
        .copied()
        .unwrap_or(Provenance {
            site: NIL,
            tag: NIL,
            scope: NIL,
            thread: 0,
        });
    // `NIL` is `u32::MAX`, the one index an `Id` cannot hold, so `Id::new` reads it as none.
    const _: () = assert!(Id::new(NIL).is_none());
    // The ring keeps an out-of-memory event's free device memory in its address slot (such an
    // event has no block); the model gives it a field of its own.
    let oom = raw.kind == crate::model::EventKind::Oom;
    crate::model::Event {
        seq,
        time_ns: (raw.time_ns as f64 * ns_per_tick) as u64,
        kind: raw.kind,
        // A device ordinal is far below 2^16 (CUDA numbers its devices from 0, and a snapshot
        // holds at most `MAX_DEVICES`); one past it reads as 65535, which every importer and
        // the telemetry reader refuse as out of range.
        device: u16::try_from(device).unwrap_or(u16::MAX),
        stream: raw.stream,
        addr: if oom { 0 } else { raw.addr },
        size: raw.size,
        requested: raw.requested,
        site: Id::new(p.site),
        tag: Id::new(p.tag),
        scope: Id::new(p.scope),
        step: raw.step,
        thread: p.thread,
        device_free: if oom { raw.addr } else { 0 },
    }
}

impl<B: Backend> CachingAllocator<B> {
    /// Current statistics.
    pub fn stats(&self) -> MemoryStats {
        self.shared.lock().stats.memory_stats()
    }

    /// Resets every peak statistic to its current value.
    pub fn reset_peak_stats(&self) {
        self.shared.lock().stats.reset_peak();
    }

    /// The statistics as PyTorch's `memory_summary()` table.
    pub fn memory_summary(&self) -> String {
        self.stats().summary()
    }

    /// Events recorded so far that the ring overwrote.
    pub fn dropped_events(&self) -> u64 {
        self.shared.lock().ring.overwritten()
    }

    /// Bytes the event ring occupies when full.
    pub fn event_ring_bytes(&self) -> usize {
        self.shared.lock().ring.max_bytes()
    }

    /// The largest free block in the allocator's free lists, in bytes (0 when none is free):
    /// what the largest request served without a new segment can be. One look per free list.
    pub fn largest_free_block(&self) -> u64 {
        let state = self.shared.lock();
        state
            .free_lists
            .iter()
            .filter_map(|list| list.blocks.last_key())
            .map(|key| (key >> 64) as u64)
            .max()
            .unwrap_or(0)
    }

    /// Number of live (allocated or pending) blocks.
    pub fn live_blocks(&self) -> usize {
        let state = self.shared.lock();
        state.stats.allocation.all().current as usize + state.pending_events.len()
    }

    /// Everything the allocator knows, as the one data model: device, settings, statistics,
    /// segments with blocks, events, call sites (symbolized now), tags, scopes and steps.
    pub fn snapshot(&self) -> Snapshot {
        self.snapshot_with_history(usize::MAX)
    }

    /// A snapshot that carries only the newest `max_events` events of the ring: what a live
    /// consumer that already has the older ones needs, converted in time proportional to what
    /// it asks for (the device lock is held while converting).
    pub fn snapshot_with_history(&self, max_events: usize) -> Snapshot {
        let shared = &*self.shared;
        let mut guard = shared.lock();
        let state = &mut *guard;
        if shared.config.record_events {
            state.record(&shared.clock, EventKind::Snapshot, RawEventParts::default());
        }
        let info = shared.backend.mem_info();
        let mut snapshot = Snapshot::empty(
            SnapshotSource::Vramscope,
            DeviceInfo {
                index: shared.device,
                name: shared.backend.name(),
                backend: shared.backend.kind().to_string(),
                capacity: info.total,
            },
        );
        snapshot.config = shared.config.clone();
        snapshot.stats = state.stats.memory_stats();
        snapshot.epoch_unix_ns = shared.epoch_unix_ns;
        snapshot.dropped_events = state.ring.overwritten();
        snapshot.violations = state.violations.clone();
        let ns_per_tick = shared.clock.ns_per_tick();
        let to_ns = |ticks: u64| (ticks as f64 * ns_per_tick) as u64;
        snapshot.steps = state
            .steps
            .iter()
            .map(|m| StepMark {
                time_ns: to_ns(m.time_ns),
                ..m.clone()
            })
            .collect();
        state.push_segments(&mut snapshot, shared.device);
        // Under the lock only copies: the raw events (56 bytes each), the provenance tuples and
        // the unsymbolized sites. Converting and symbolizing them waits for the lock's release,
        // so that a dashboard attaching to a program holds it up for a copy, not a conversion.
        let first = state.ring.next_seq().saturating_sub(max_events as u64);
        let first_seq = first.max(state.ring.oldest_seq());
        let raw: Vec<RawEvent> = state
            .ring
            .since(first, usize::MAX)
            .map(|(_, e)| *e)
            .collect();
        let provenances = state.provenance.provenances().to_vec();
        let unresolved = state.provenance.sites_since(0);
        snapshot.tags = state.provenance.tags.strings.clone();
        snapshot.scopes = state.provenance.scopes.paths_since(0);
        drop(guard);

        let device = shared.device;
        snapshot.events = raw
            .iter()
            .zip(first_seq..)
            .map(|(e, seq)| event_of(seq, e, &provenances, ns_per_tick, device))
            .collect();
        snapshot.sites = unresolved.into_iter().map(|s| s.resolve()).collect();
        shared.lock().provenance.keep_resolved(0, &snapshot.sites);
        snapshot
    }

    /// The sequence number the next event will get: a mark to ask later what happened since
    /// (the pytest plugin's "what did this test allocate and keep").
    pub fn next_event_seq(&self) -> u64 {
        self.shared.lock().ring.next_seq()
    }

    /// Events with sequence number `from_seq` or later that the ring still holds, at most
    /// `limit` of them, with the current statistics: what a live consumer (the telemetry
    /// publisher, the in-process dashboard) pulls. `missed` counts events from `from_seq` on
    /// that the ring overwrote before this call.
    pub fn events_since(&self, from_seq: u64, limit: usize) -> EventBatch {
        let state = self.shared.lock();
        let ns_per_tick = self.shared.clock.ns_per_tick();
        let oldest = state.ring.oldest_seq();
        let events: Vec<crate::model::Event> = state
            .ring
            .since(from_seq, limit)
            .map(|(seq, e)| {
                event_of(
                    seq,
                    e,
                    state.provenance.provenances(),
                    ns_per_tick,
                    self.shared.device,
                )
            })
            .collect();
        let next_seq = events
            .last()
            .map(|e| e.seq + 1)
            .unwrap_or_else(|| from_seq.max(oldest));
        EventBatch {
            events,
            next_seq,
            missed: oldest.saturating_sub(from_seq),
            stats: state.stats.memory_stats(),
            step: state.step,
        }
    }

    /// The call-site, tag and scope tables that events index, symbolizing new backtraces
    /// after the device lock is released (as [`CachingAllocator::site_tables_since`] does).
    /// Ids are stable: the tables only grow.
    pub fn site_tables(&self) -> SiteTables {
        let tables = self.site_tables_since(0, 0, 0);
        self.shared
            .lock()
            .provenance
            .keep_resolved(0, &tables.sites);
        tables
    }

    /// The entries of the call-site, tag and scope tables from the given lengths on (the
    /// tables only grow, so a consumer that knows the first `sites` sites asks for the rest).
    /// Only the new entries are copied under the device lock, and call sites are symbolized
    /// after it is released: a live consumer (the telemetry publisher) never holds the program
    /// up while backtraces are resolved.
    pub fn site_tables_since(&self, sites: usize, tags: usize, scopes: usize) -> SiteTables {
        let (new_sites, tags, scopes) = {
            let state = self.shared.lock();
            let tables = &state.provenance;
            (
                tables.sites_since(sites),
                tables.tags.strings.get(tags..).unwrap_or_default().to_vec(),
                tables.scopes.paths_since(scopes),
            )
        };
        SiteTables {
            sites: new_sites.into_iter().map(|s| s.resolve()).collect(),
            tags,
            scopes,
        }
    }

    /// Wall-clock time of event time zero, in nanoseconds since the Unix epoch.
    pub fn epoch_unix_ns(&self) -> u64 {
        self.shared.epoch_unix_ns
    }
}

impl State {
    /// Adds the segments of device `device` to `snapshot` in address order, with their blocks
    /// and the provenance of the live ones.
    fn push_segments(&self, snapshot: &mut Snapshot, device: u32) {
        let prov = |id: u32| {
            self.provenance.get(id).unwrap_or(Provenance {
                site: NIL,
                tag: NIL,
                scope: NIL,
                thread: 0,
            })
        };
        let opt = |id: u32| (id != NIL).then_some(id);
        for &segment in self.segments_by_addr.values() {
            let seg = self.segments.get(segment);
            // Like PyTorch, an expandable segment with unmapped holes shows as one segment per
            // mapped run (an expandable segment with nothing mapped shows not at all).
            let push_run = |snapshot: &mut Snapshot, blocks: Vec<Block>| {
                if let Some(first) = blocks.first() {
                    snapshot.segments.push(Segment {
                        device,
                        address: first.address,
                        total_size: blocks.iter().map(|b| b.size).sum(),
                        stream: seg.stream.0,
                        pool: seg.pool,
                        expandable: seg.expandable,
                        blocks,
                    });
                }
            };
            let mut blocks = Vec::new();
            let mut id = seg.first;
            while id != NIL {
                let b = self.blocks.get(id);
                if b.flags & UNMAPPED != 0 {
                    push_run(snapshot, std::mem::take(&mut blocks));
                    id = b.next;
                    continue;
                }
                let p = prov(b.provenance);
                let block_state = if b.flags & ALLOCATED != 0 {
                    BlockState::ActiveAllocated
                } else if b.flags & PENDING_FREE != 0 {
                    BlockState::ActivePendingFree
                } else {
                    BlockState::Inactive
                };
                let owned = block_state != BlockState::Inactive;
                blocks.push(Block {
                    address: b.addr,
                    size: b.size,
                    requested_size: if owned { b.requested } else { 0 },
                    state: block_state,
                    site: if owned { opt(p.site) } else { None },
                    tag: if owned { opt(p.tag) } else { None },
                    scope: if owned { opt(p.scope) } else { None },
                    step: if owned { b.step as u64 } else { 0 },
                    thread: if owned { p.thread } else { 0 },
                });
                id = b.next;
            }
            // A plain segment is one run: its blocks cover it from its address.
            push_run(snapshot, blocks);
        }
    }
}
