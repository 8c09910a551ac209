//! Replay and what-if: run a trace's allocations and frees through vramscope's caching
//! allocator on a phantom simulated device, under any settings and capacity.
//!
//! The input is the one model (`vramscope_model::Snapshot`, from any importer). A trace
//! that started after its program had allocated (PyTorch's recording usually does) is replayed
//! from the allocator state it started in: [`initial_state`] walks the trace backwards from the
//! segments at the end, as PyTorch's own memory visualizer does, and the allocator's
//! `restore_segment` recreates those segments and their live blocks; memory that the trace's
//! format records only as totals (a profiler trace's) is restored too ([`HeldBeforeTrace`]).
//! The settings are the caller's, or the trace's own ([`trace_settings`]). [`replay`] then
//! reports peak allocated and reserved bytes, allocations and frees, raw segment allocations
//! and frees, retries, OOMs (with the step and request of the first) and fragmentation, beside
//! the same figures read from the trace itself (its peak allocated marked where its block sizes
//! are estimates, [`block_sizing`]); [`sweep`] repeats it over a set of settings to answer
//! "will this run fit in 24 GiB, and with what setting". The CLI's `vramscope replay` is glue
//! over these functions.
//!
//! Two answers are plain where figures alone would mislead. A late trace whose start state
//! alone (the segments holding memory from before the trace) exceeds the capacity cannot run
//! on it whatever follows: the replay then says so ([`StartOverCapacity`]) and runs without the
//! limit, so that its figures are what the trace needs. And a sweep recommends a setting
//! ([`recommend`]) only when it changes the outcome: an OOM avoided, or a peak reserved
//! materially lower ([`MATERIAL_SAVING_PERCENT`], [`MATERIAL_SAVING_BYTES`]) than the
//! trace's own settings' (PyTorch's defaults for a trace that records none).

use rustc_hash::FxHashMap;
use serde::Serialize;
use vramscope_model::pytorch::{pool_for, round_size};

use vramscope_caching::{AllocError, CachingAllocator, SimDevice, StreamId};
use vramscope_engine::{
    is_segment_event, AddrMap, AddrSet, MemoryState, Pair, PairedEvents, Pairing, Reconstruction,
    Usage,
};
use vramscope_model::{
    AllocatorConfig, BlockState, Event, EventKind, Policy, Pool, Snapshot, SnapshotSource,
};

mod calls;
mod capacity;
mod plan;
mod render;
mod sizing;
mod sweep;

use calls::*;
pub use calls::{CallDifference, DeviceCall, DeviceCallCheck};
pub use capacity::{infer_capacity, InferredCapacity};
pub use plan::{ReplayOutcome, ReplayPlan, ReplayRequest};
pub use render::{render_sweep_text, render_text};
pub use sizing::{
    block_sizing, estimated_before_trace_blocks, estimated_before_trace_blocks_from, size_blocks,
    size_blocks_visiting, size_blocks_with_progress, BlockSizing,
};
use sweep::*;
pub use sweep::{
    material_saving, recommend, sweep, sweep_configs, sweep_with, SettingsOrigin, SweepRow,
    MATERIAL_SAVING_BYTES, MATERIAL_SAVING_PERCENT,
};

/// Capacity used when neither the caller nor the snapshot names one: large enough that nothing
/// fails (1 PiB of addresses, no memory behind them).
pub const UNLIMITED_CAPACITY: u64 = 1 << 50;

/// How to replay.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct ReplayOptions {
    /// Device capacity; `None` means unlimited.
    pub capacity: Option<u64>,
    /// Allocator settings (tracking is switched off for speed whatever this says).
    pub config: AllocatorConfig,
    /// Replay with the settings the trace recorded ([`trace_settings`]) in place of
    /// `config`.
    pub trace_settings: bool,
    /// A placement policy in place of the settings' own (`config`'s or the trace's; PyTorch
    /// records none).
    pub policy: Option<Policy>,
    /// Start from the state reconstructed from the segments at the end (true), or from an
    /// empty device (false).
    pub reconstruct_start: bool,
    /// Record the replay's events and compare its device calls with the trace's, call by call
    /// ([`ReplayResult::device_calls`]); slower.
    pub verify: bool,
    /// Without a `capacity`, replay under the capacity the trace implies, where it implies one
    /// ([`infer_capacity`]: an OOM's free bytes, free-and-retry bursts), and say so
    /// ([`ReplayResult::inferred_capacity`]).
    pub infer_capacity: bool,
}

impl Default for ReplayOptions {
    fn default() -> Self {
        ReplayOptions {
            capacity: None,
            config: AllocatorConfig::default(),
            trace_settings: false,
            policy: None,
            reconstruct_start: true,
            verify: false,
            infer_capacity: false,
        }
    }
}

/// The figures a replay produces, and the same figures read from the trace where it has them.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Figures {
    /// Events: for the replay, the trace's events it went through (allocations, completed
    /// frees, failed requests and `empty_cache()` calls); for the trace, all its events (free
    /// requests, segment calls, steps and the rest too). The two count different things:
    /// [`Figures::allocs`] and [`Figures::frees`] compare like with like.
    pub events: u64,
    /// Allocations: for the replay, those it served; for the trace, its allocation events.
    pub allocs: u64,
    /// Frees: for the replay, those it performed; for the trace, its completed frees (the
    /// events the replay performs as frees).
    pub frees: u64,
    /// Highest allocated bytes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub peak_allocated: Option<u64>,
    /// Whether `peak_allocated` is an estimate: the trace records requests, and the block
    /// sizes behind the figure are the requests rounded as PyTorch rounds them
    /// ([`BlockSizing::Rounded`]), not PyTorch's own blocks. Never so for the replay.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub peak_allocated_estimated: bool,
    /// Highest reserved bytes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub peak_reserved: Option<u64>,
    /// Raw segment allocations during the trace (including expandable page maps; segments
    /// restored to recreate the state a late trace started in are not counted).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub segment_allocs: Option<u64>,
    /// Raw segment frees (including expandable page unmaps).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub segment_frees: Option<u64>,
    /// Retries after freeing the cache.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub num_alloc_retries: Option<u64>,
    /// Allocations that failed for good.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub num_ooms: Option<u64>,
}

/// The first allocation that failed in a replay.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct FirstOom {
    /// Sequence number of the trace event.
    pub seq: u64,
    /// Training step of the event.
    pub step: u64,
    /// The call site of the request as a reader names it (`file:line`, never `??:0`), when
    /// the trace records one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub site: Option<String>,
    /// Bytes requested.
    pub requested: u64,
    /// Bytes allocated when it failed.
    pub allocated: u64,
    /// Bytes reserved when it failed.
    pub reserved: u64,
    /// Whether the simulated device ran out of address space rather than memory: with
    /// expandable segments every stream and pool that allocates reserves addresses for 9/8 of
    /// the device's memory, and a trace of many thousands of streams uses them all up.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub address_space: bool,
}

/// What one replay found.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ReplayResult {
    /// Figures of the replay (every field present).
    #[serde(flatten)]
    pub figures: Figures,
    /// The settings replayed, in `PYTORCH_CUDA_ALLOC_CONF` syntax.
    pub config: String,
    /// The settings the trace recorded, when the replay used them
    /// ([`ReplayOptions::trace_settings`]; empty for the defaults, or a trace that records
    /// none).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub trace_settings: Option<String>,
    /// The capacity replayed against.
    pub capacity: u64,
    /// Where no capacity was given, the one the trace implies, which the replay ran under
    /// ([`ReplayOptions::infer_capacity`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub inferred_capacity: Option<InferredCapacity>,
    /// The first failed allocation, if any.
    pub first_oom: Option<FirstOom>,
    /// Peak reserved minus peak allocated: memory the policy held without using it at worst.
    pub fragmentation: u64,
    /// Free bytes inside partly used segments at the end.
    pub inactive_split_bytes: u64,
    /// Segments recreated at the start (trace started late).
    pub restored_segments: u64,
    /// Live blocks recreated at the start.
    pub restored_blocks: u64,
    /// Memory the trace records only as totals from before it, as the replay restored it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub held_before_trace: Option<HeldBeforeTrace>,
    /// Frees of blocks allocated before the trace that its start state does not hold (they
    /// were skipped).
    pub unmatched_frees: u64,
    /// Frees of allocations that failed in the replay (out of memory); they were skipped.
    pub failed_frees: u64,
    /// Requests that failed in the trace (its OOM events) but were served in the replay, which
    /// freed them at once: the program that failed there would have run on. They are tried
    /// only against a capacity.
    pub trace_ooms_served: u64,
    /// The same figures read from the trace.
    pub original: Figures,
    /// `empty_cache()` calls performed where the trace made them (see
    /// `vramscope_engine::empty_cache_calls`).
    pub empty_cache_calls: u64,
    /// The replay's device calls against the trace's, with [`ReplayOptions::verify`].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub device_calls: Option<DeviceCallCheck>,
    /// Set when the start state alone exceeds the capacity: the trace cannot run on it, and
    /// the replay's figures ([`ReplayResult::figures`], `first_oom`, the fragmentation) are
    /// those of a replay without the limit, what the trace needs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub start_over_capacity: Option<StartOverCapacity>,
}

/// The start state of a late trace holds more than the capacity: the segments that hold its
/// live blocks (which no setting can release, since the memory in them is in use) and the
/// memory it records only as totals come to more than the device may reserve, before the
/// trace's first event. No setting runs the trace on that capacity; [`StartOverCapacity::needed`]
/// says what does.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct StartOverCapacity {
    /// Bytes allocated before the trace: the start state's live blocks and the allocated
    /// bytes it records only as a total.
    pub allocated: u64,
    /// Bytes of the segments that hold them (the allocated total from before the trace
    /// counted as its own segment), which exceed the capacity.
    pub reserved: u64,
    /// What fits: the peak reserved bytes of the replay without a limit, a capacity that runs
    /// the trace with these settings.
    pub needed: u64,
}

/// The start state's memory that no setting can release, when it exceeds `capacity`: the
/// segments (mapped runs) of `segments` that hold a live block, and `held` bytes allocated
/// before the trace that its format records only as a total.
fn start_over(segments: &[StartSegment], held: u64, capacity: u64) -> Option<StartOverCapacity> {
    let in_use = segments.iter().filter(|s| !s.blocks.is_empty());
    let reserved = in_use
        .clone()
        .fold(held, |sum, s| sum.saturating_add(s.size));
    let allocated = in_use
        .flat_map(|s| &s.blocks)
        .fold(held, |sum, &(_, size, _)| sum.saturating_add(size));
    (reserved > capacity).then_some(StartOverCapacity {
        allocated,
        reserved,
        needed: 0,
    })
}

/// Memory from before the trace that its format records only as totals (a profiler trace's
/// `Total Allocated` and `Total Reserved` beyond its blocks: the engine's
/// `MemoryState::unattributed`), as the replay restored it. The allocated bytes are live the
/// whole trace: one live block that fills a segment of its size, which the allocator can
/// neither reuse nor release, and which counts against a capacity. The reserved bytes beyond
/// them were cached and free, in segments the trace does not describe. Without a capacity
/// they are restored as one free segment that the trace's allocations may split, so that the
/// replay with the trace's settings reserves what the trace did; against a capacity they are
/// left out, since a capped allocator sizes its cache itself and releases it to retry, and a
/// cache of a made-up layout, pinned once split, could fail requests the run would serve.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct HeldBeforeTrace {
    /// Bytes allocated before the trace that no block names.
    pub allocated: u64,
    /// Bytes reserved beyond them (cached, free).
    pub cached: u64,
    /// Whether the cached bytes were restored (only without a capacity).
    pub cached_restored: bool,
}

/// A segment and its live blocks at the start of a trace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StartSegment {
    /// Address in the trace.
    pub address: u64,
    /// Size in bytes.
    pub size: u64,
    /// Stream.
    pub stream: u64,
    /// Pool.
    pub pool: Pool,
    /// Live blocks: (address in the trace, block size, requested size).
    pub blocks: Vec<(u64, u64, u64)>,
}

/// The device a replay works on: the snapshot's own.
fn device_of(snapshot: &Snapshot) -> u32 {
    snapshot.device.index
}

/// The segments and live blocks at the start of the trace, on the snapshot's device: the
/// engine's start state (`vramscope_engine::Reconstruction`), which undoes the trace's events,
/// last first, from the segments at the end. An expandable segment shows as its mapped runs.
pub fn initial_state(snapshot: &Snapshot) -> Vec<StartSegment> {
    start_segments(
        &Reconstruction::from_snapshot(snapshot).start,
        device_of(snapshot),
    )
}

/// The segments of `state` on `device`, each with the live blocks that lie inside it.
fn start_segments(state: &MemoryState, device: u32) -> Vec<StartSegment> {
    let mut start = Vec::new();
    for (&address, segment) in state.segments.iter().filter(|(_, s)| s.device == device) {
        let end = address.saturating_add(segment.size);
        let mut blocks: Vec<(u64, u64, u64)> = Vec::new();
        for (&addr, block) in state.blocks_in(address, segment.size) {
            let end_of_previous = blocks.last().map_or(0, |&(a, s, _)| a + s);
            if addr.saturating_add(block.size) <= end && addr >= end_of_previous {
                let requested = if block.requested > 0 {
                    block.requested
                } else {
                    block.size
                };
                blocks.push((addr, block.size, requested));
            }
        }
        start.push(StartSegment {
            address,
            size: segment.size,
            stream: segment.stream,
            pool: segment.pool,
            blocks,
        });
    }
    start
}

/// The trace's own figures, as every other view reads them (`crate::engine`): events, peaks,
/// segment calls and OOMs; and the allocations and frees on `device`, which the replay
/// performs.
fn original_figures(snapshot: &Snapshot, walk: &Reconstruction, device: u32) -> Figures {
    let on_device = |kind: EventKind| {
        snapshot
            .events
            .iter()
            .filter(|e| u32::from(e.device) == device && e.kind == kind)
            .count() as u64
    };
    let mut figures = Figures {
        events: snapshot.events.len() as u64,
        allocs: on_device(EventKind::Alloc),
        frees: on_device(EventKind::FreeCompleted),
        peak_allocated: Some(walk.peak_allocated.bytes),
        num_ooms: Some(
            snapshot
                .events
                .iter()
                .filter(|e| e.kind == EventKind::Oom)
                .count() as u64,
        ),
        ..Figures::default()
    };
    let segment_calls = |kinds: [EventKind; 2]| {
        snapshot
            .events
            .iter()
            .filter(|e| kinds.contains(&e.kind))
            .count() as u64
    };
    if walk.reserved_known {
        figures.peak_reserved = Some(walk.peak_reserved.bytes);
    }
    if snapshot.events.iter().any(is_segment_event) || !snapshot.segments.is_empty() {
        figures.segment_allocs = Some(segment_calls([
            EventKind::SegmentAlloc,
            EventKind::SegmentMap,
        ]));
        figures.segment_frees = Some(segment_calls([
            EventKind::SegmentFree,
            EventKind::SegmentUnmap,
        ]));
    }
    if snapshot.stats.num_alloc_retries > 0 {
        figures.num_alloc_retries = Some(snapshot.stats.num_alloc_retries);
    }
    figures
}

/// Replays `snapshot`'s allocations and frees under `options`. `progress` is called now and
/// then with (events done, events in all).
pub fn replay(
    snapshot: &Snapshot,
    options: &ReplayOptions,
    progress: &mut dyn FnMut(usize, usize),
) -> ReplayResult {
    let estimated = block_sizing(snapshot) == Some(BlockSizing::Rounded);
    replay_recording(
        snapshot,
        options,
        progress,
        &mut Keep::TraceFigures { estimated },
    )
}

/// The placement settings `snapshot` records (`Snapshot::config`: for a PyTorch snapshot its
/// `allocator_settings`), without the tracking and checking settings, which change what a run
/// records and not where its blocks go. The defaults for a trace that records none.
pub fn trace_settings(snapshot: &Snapshot) -> AllocatorConfig {
    placement(&snapshot.config)
}

/// The placement settings of `recorded`, every other setting the default.
fn placement(recorded: &AllocatorConfig) -> AllocatorConfig {
    AllocatorConfig {
        policy: recorded.policy,
        max_split_size: recorded.max_split_size,
        roundup_power2_divisions: recorded.roundup_power2_divisions,
        garbage_collection_threshold: recorded.garbage_collection_threshold,
        expandable_segments: recorded.expandable_segments,
        ..AllocatorConfig::default()
    }
}

/// The settings a replay under `options` uses: `options.config`, or with
/// [`ReplayOptions::trace_settings`] the trace's own, with [`ReplayOptions::policy`] if any.
fn settings_of(snapshot: &Snapshot, options: &ReplayOptions) -> AllocatorConfig {
    let mut config = if options.trace_settings {
        trace_settings(snapshot)
    } else {
        options.config.clone()
    };
    if let Some(policy) = options.policy {
        config.policy = policy;
    }
    config
}

/// The device calls a verifying replay makes, taken out of the allocator's event ring every
/// [`CallLog::EVERY`] trace events, so that the ring holds [`CallLog::RING`] events rather
/// than all of them. The replay's allocator records device calls and no allocation or free
/// (`CachingAllocator::recording_device_calls`): those would be two or more events per trace
/// event, 64 bytes each, pushed only to be passed over here.
struct CallLog {
    /// The first event not taken out yet.
    next_seq: u64,
    calls: Vec<(u64, DeviceCall)>,
    /// Whether the ring overwrote events before they were taken out (a burst of more than
    /// `RING` events, such as an `empty_cache()` of that many segments).
    lost: bool,
}

impl CallLog {
    /// A log of the calls `alloc` makes from now on (none are taken unless `verify`): the
    /// calls that recreated the start state come before it.
    fn after_start(alloc: &CachingAllocator<SimDevice>, verify: bool) -> CallLog {
        CallLog {
            next_seq: if verify {
                alloc.events_since(0, usize::MAX).next_seq
            } else {
                0
            },
            calls: Vec::new(),
            lost: false,
        }
    }

    /// Trace events replayed between two takes.
    const EVERY: usize = 1024;
    /// The ring's size in events: room for the events of `EVERY` trace events many times
    /// over.
    const RING: usize = 1 << 16;

    /// Takes the new events out of the ring of `alloc`, keeping their device calls.
    fn take(&mut self, alloc: &CachingAllocator<SimDevice>) {
        let batch = alloc.events_since(self.next_seq, usize::MAX);
        self.lost |= batch.missed > 0;
        self.calls.extend(device_calls(batch.events.iter()));
        self.next_seq = batch.next_seq;
    }
}

/// What a replay keeps beside its own figures.
enum Keep<'a> {
    /// The trace's own figures ([`ReplayResult::original`]), its peak allocated marked as an
    /// estimate when `estimated`.
    TraceFigures {
        /// Whether the trace's block sizes are estimates ([`BlockSizing::Rounded`]).
        estimated: bool,
    },
    /// The size of the block each replayed allocation got, by its index in the snapshot's
    /// events, where that is not the event's own (rounded) size ([`size_blocks`]); the trace's
    /// own figures stay empty. The trace's start state is walked already (the sizing needs it
    /// first).
    BlockSizes(&'a mut FxHashMap<u32, u64>, &'a MemoryState),
    /// Nothing more: the replay's device calls are all that is wanted ([`block_sizing`]).
    Nothing,
    /// The trace's own figures and its start, walked once for all the replays of a sweep
    /// ([`sweep_with`]): the walk through every event does not depend on the settings, and
    /// took a sixth of each replay of 100,000 streams.
    Walked {
        /// The state at the trace's start ([`Reconstruction::start`]).
        start: &'a MemoryState,
        /// The trace's own figures, as [`Keep::TraceFigures`] keeps them.
        original: &'a Figures,
    },
}

/// [`replay`], keeping what `keep` asks for.
fn replay_recording(
    snapshot: &Snapshot,
    options: &ReplayOptions,
    progress: &mut dyn FnMut(usize, usize),
    keep: &mut Keep<'_>,
) -> ReplayResult {
    let (result, lost) = replay_with_ring(snapshot, options, progress, keep, CallLog::RING);
    if !lost {
        return result;
    }
    // A burst outgrew the ring: replay again keeping every event.
    replay_with_ring(snapshot, options, progress, keep, usize::MAX).0
}

/// [`replay_recording`] with an event ring of `ring` events when verifying; also returns
/// whether the ring lost events, which makes the device-call check wrong.
fn replay_with_ring(
    snapshot: &Snapshot,
    options: &ReplayOptions,
    progress: &mut dyn FnMut(usize, usize),
    keep: &mut Keep<'_>,
    ring: usize,
) -> (ReplayResult, bool) {
    let device = device_of(snapshot);
    let settings = settings_of(snapshot, options);
    let config = replay_config(&settings, options.verify, ring);
    // A capped PyTorch run has a whole device behind its cap (`set_per_process_memory_fraction`),
    // whose pages expandable segments may map past the cap: the cap is the allocator's memory
    // limit, on a device without one.
    let sim = SimDevice::phantom(UNLIMITED_CAPACITY);
    // Its ring is read for device calls only: allocations and frees are not recorded.
    let alloc = CachingAllocator::recording_device_calls(sim.clone(), config);
    let ((start, original, inferred_capacity), chosen) =
        start_and_events(snapshot, options, keep, device);
    // A capacity given wins over the one the trace implies.
    let limit = options
        .capacity
        .or(inferred_capacity.as_ref().map(|c| c.bytes));
    let capacity = limit.unwrap_or(UNLIMITED_CAPACITY);
    alloc.set_memory_limit(limit);

    // The trace's addresses to the replay's, keyed by addresses a file chooses: `AddrMap` is
    // seeded against collisions.
    let mut addresses: AddrMap<u64> = AddrMap::default();
    let mut first_oom = None;
    let mut restored = restore(
        &alloc,
        start.as_ref(),
        device,
        limit,
        &mut addresses,
        &mut first_oom,
    );
    // Raw allocations that recreated the start, which the replay's own figures leave out.
    let start_allocations = alloc.stats().num_device_alloc;

    let (events, empty_cache_at, theirs) =
        (chosen.events, chosen.empty_cache_at, chosen.device_calls);
    // New segments take the addresses the recorded run's got while the two runs agree, so that
    // equal free blocks are told apart by address as they were there.
    sim.plan_addresses(chosen.plan);

    let total = events.len();
    let (mut allocs, mut frees, mut unmatched_frees, mut failed_frees) = (0, 0, 0, 0);
    // The trace's addresses whose allocation failed here: their frees are skipped.
    let mut failed: AddrSet = AddrSet::default();
    let mut trace_ooms_served = 0;
    let mut empty_cache_calls = 0;
    // The replay's own calls start after the reconstructed start's.
    let mut calls = CallLog::after_start(&alloc, options.verify);
    // The replay is the allocator's only user: hold its lock for the whole sequence.
    let mut exclusive = alloc.exclusive();
    for (i, &index) in events.iter().enumerate() {
        let index = index as usize;
        let event = &snapshot.events[index];
        if i % 8192 == 0 {
            progress(i, total);
        }
        if options.verify && i % CallLog::EVERY == 0 {
            // The guard holds the device lock, which reading the ring takes itself.
            drop(exclusive);
            calls.take(&alloc);
            exclusive = alloc.exclusive();
        }
        match event.kind {
            EventKind::Alloc => {
                let served = serve_alloc(
                    &mut exclusive,
                    snapshot,
                    index,
                    keep,
                    &mut addresses,
                    &mut failed,
                    &mut first_oom,
                );
                allocs += u64::from(served);
            }
            // A request that failed in the trace (`size` is the request rounded, `device_free`
            // the device's free memory then) is tried here too: it frees cached memory and retries
            // as it did there, and fails or is served and given back.
            // Without a capacity every such request would be served, and its memory would stay
            // cached for the rest of the replay: they are tried only against a capacity.
            EventKind::Oom if restored.limit.is_none() => {}
            EventKind::Oom => {
                trace_ooms_served += u64::from(retry_failed_request(
                    &mut exclusive,
                    snapshot,
                    event,
                    &mut first_oom,
                ));
            }
            _ if empty_cache_at.contains(&index) => {
                // The guard holds the device lock, which `empty_cache` takes itself.
                drop(exclusive);
                alloc.empty_cache();
                exclusive = alloc.exclusive();
                empty_cache_calls += 1;
            }
            _ => match addresses.remove(&event.addr) {
                Some(ours) => {
                    // The replay frees only what it allocated, so this cannot fail.
                    let _ = exclusive.free_ptr(ours);
                    frees += 1;
                }
                None if failed.remove(&event.addr) => failed_frees += 1,
                None => unmatched_frees += 1,
            },
        }
    }
    progress(total, total);
    let stats = exclusive.stats();
    drop(exclusive);
    let device_calls = theirs.map(|theirs| {
        calls.take(&alloc);
        compare_calls(&theirs, &calls.calls)
    });
    let peak_allocated = stats.allocated_bytes.all.peak;
    let peak_reserved = stats.reserved_bytes.all.peak;
    if let Some(over) = &mut restored.over {
        over.needed = peak_reserved;
    }
    let result = ReplayResult {
        figures: Figures {
            allocs,
            frees,
            ..replayed_figures(&stats, total as u64, start_allocations)
        },
        config: settings.to_string(),
        trace_settings: options
            .trace_settings
            .then(|| trace_settings(snapshot).to_string()),
        capacity,
        inferred_capacity,
        first_oom,
        fragmentation: peak_reserved.saturating_sub(peak_allocated),
        inactive_split_bytes: stats.inactive_split_bytes.all.current,
        restored_segments: restored.segments,
        restored_blocks: restored.blocks,
        held_before_trace: restored.held,
        unmatched_frees,
        failed_frees,
        trace_ooms_served,
        empty_cache_calls,
        original,
        device_calls,
        start_over_capacity: restored.over,
    };
    (result, calls.lost)
}

/// Tries a request that failed in the trace (`event`: its `size` is the request rounded) in
/// the replay: it frees cached memory and retries as it did there, and fails (noting the
/// first OOM) or is served and given back. Whether it was served.
fn retry_failed_request(
    exclusive: &mut vramscope_caching::Exclusive<'_, SimDevice>,
    snapshot: &Snapshot,
    event: &Event,
    first_oom: &mut Option<FirstOom>,
) -> bool {
    match exclusive.alloc_ptr(event.size, StreamId(event.stream)) {
        Ok(ours) => {
            let _ = exclusive.free_ptr(ours);
            true
        }
        Err(AllocError::OutOfMemory(report)) => {
            first_oom.get_or_insert(failure_at(snapshot, event, event.size, &report));
            false
        }
        Err(_) => false,
    }
}

/// Serves the trace's allocation at `index` in the replay's allocator: its address is noted
/// in `addresses` (or in `failed`, with the first OOM, when the request fails), and its block
/// size in `keep` when that asks for block sizes. Whether the request was served.
fn serve_alloc(
    exclusive: &mut vramscope_caching::Exclusive<'_, SimDevice>,
    snapshot: &Snapshot,
    index: usize,
    keep: &mut Keep<'_>,
    addresses: &mut AddrMap<u64>,
    failed: &mut AddrSet,
    first_oom: &mut Option<FirstOom>,
) -> bool {
    let event = &snapshot.events[index];
    let requested = if event.requested > 0 {
        event.requested
    } else {
        event.size
    };
    match exclusive.alloc_ptr(requested, StreamId(event.stream)) {
        Ok(ours) => {
            addresses.insert(event.addr, ours);
            failed.remove(&event.addr);
            if let Keep::BlockSizes(sizes, _) = keep {
                match exclusive.block_size_of(ours) {
                    Some(size) if size != event.size => {
                        sizes.insert(index as u32, size);
                    }
                    _ => {}
                }
            }
            true
        }
        Err(error) => {
            addresses.remove(&event.addr);
            failed.insert(event.addr);
            if let AllocError::OutOfMemory(report) = error {
                first_oom.get_or_insert(failure_at(snapshot, event, requested, &report));
            }
            false
        }
    }
}

/// What recreating the trace's start state in the replay's allocator did.
struct Restored {
    /// Segments recreated.
    segments: u64,
    /// Live blocks recreated in them.
    blocks: u64,
    /// Memory from before the trace known only as totals, restored.
    held: Option<HeldBeforeTrace>,
    /// Where the start state alone exceeds the capacity.
    over: Option<StartOverCapacity>,
    /// The limit the replay runs under: the capacity, unless the start state alone exceeds
    /// it, when no setting can run the trace there and the replay says what fits instead.
    limit: Option<u64>,
}

/// Recreates `start` (the trace's start state, if reconstructed) on `device` in `alloc`, under
/// `capacity`, noting the replay's address of each live block in `addresses`.
fn restore(
    alloc: &CachingAllocator<SimDevice>,
    start: Option<&MemoryState>,
    device: u32,
    capacity: Option<u64>,
    addresses: &mut AddrMap<u64>,
    first_oom: &mut Option<FirstOom>,
) -> Restored {
    let mut restored = Restored {
        segments: 0,
        blocks: 0,
        held: None,
        over: None,
        limit: capacity,
    };
    let Some(start) = start else {
        return restored;
    };
    let segments = start_segments(start, device);
    if let Some(capacity) = capacity {
        restored.over = start_over(&segments, start.unattributed.allocated, capacity);
        if restored.over.is_some() {
            restored.limit = None;
            alloc.set_memory_limit(None);
        }
    }
    let (count, blocks) = restore_start(alloc, &segments, addresses, first_oom);
    restored.segments = count;
    restored.blocks = blocks;
    // The cache a capped allocator would size itself stays out of what fits, too.
    restored.held = restore_unattributed(alloc, start.unattributed, capacity);
    restored
}

/// Where the replay starts (the trace's start state, when the options ask for it) with the
/// trace's own figures (when `keep` asks for them), and the events to replay. The walk back to
/// the trace's start and the choice of the events each go through every event, and neither
/// needs the other: the choice runs on a second thread.
fn start_and_events(
    snapshot: &Snapshot,
    options: &ReplayOptions,
    keep: &Keep<'_>,
    device: u32,
) -> (
    (Option<MemoryState>, Figures, Option<InferredCapacity>),
    ChosenEvents,
) {
    std::thread::scope(|scope| {
        // The other thread also lists what the walk does not need either: the trace's
        // segment allocations (for the addresses of new segments) and, to check the replay
        // against, its device calls.
        let chosen = scope.spawn(|| replayed_events(snapshot, device, options.verify));
        // A replay without the trace's own figures needs only where the trace started: the
        // start-only walk keeps no usage per event.
        let start = match keep {
            Keep::TraceFigures { estimated } => {
                let walk = Reconstruction::from_snapshot(snapshot);
                let mut original = original_figures(snapshot, &walk, device);
                original.peak_allocated_estimated = *estimated;
                let inferred = (options.infer_capacity && options.capacity.is_none())
                    .then(|| infer_capacity(snapshot, &walk))
                    .flatten();
                (
                    options.reconstruct_start.then_some(walk.start),
                    original,
                    inferred,
                )
            }
            Keep::BlockSizes(_, start) => (
                options.reconstruct_start.then(|| (*start).clone()),
                Figures::default(),
                None,
            ),
            Keep::Nothing => (
                options
                    .reconstruct_start
                    .then(|| Reconstruction::start_of(snapshot)),
                Figures::default(),
                None,
            ),
            Keep::Walked { start, original } => (
                options.reconstruct_start.then(|| (*start).clone()),
                (*original).clone(),
                None,
            ),
        };
        let chosen = chosen
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
        (start, chosen)
    })
}

/// The replay's own figures, from the allocator's statistics at its end: `events` replayed,
/// and the device allocations less the `restored` ones that recreated the start state.
fn replayed_figures(stats: &vramscope_model::MemoryStats, events: u64, restored: u64) -> Figures {
    Figures {
        events,
        peak_allocated: Some(stats.allocated_bytes.all.peak),
        peak_reserved: Some(stats.reserved_bytes.all.peak),
        segment_allocs: Some(stats.num_device_alloc.saturating_sub(restored)),
        segment_frees: Some(stats.num_device_free),
        num_alloc_retries: Some(stats.num_alloc_retries),
        num_ooms: Some(stats.num_ooms),
        ..Figures::default()
    }
}

/// The allocator settings of a replay: `settings` without tracking, or, when the device calls
/// are verified, with events only (no call sites) in a ring of `ring` entries (the ring takes
/// memory as it fills).
fn replay_config(settings: &AllocatorConfig, verify: bool, ring: usize) -> AllocatorConfig {
    let mut config = settings.clone().untracked();
    if verify {
        config.record_events = true;
        config.max_entries = ring;
    }
    config
}

/// The out-of-memory failure of a request of `requested` bytes for `event`.
fn failure_at(
    snapshot: &Snapshot,
    event: &Event,
    requested: u64,
    report: &vramscope_caching::OomReport,
) -> FirstOom {
    FirstOom {
        seq: event.seq,
        step: u64::from(event.step),
        site: site_of(snapshot, event.site()),
        requested,
        allocated: report.allocated,
        reserved: report.reserved,
        address_space: report.cause == vramscope_model::oom::OomCause::AddressSpace,
    }
}

/// Recreates the segments (and their live blocks) the trace started with, recording where each
/// block of the trace now lives in `addresses`, and a segment that does not fit as the first
/// out-of-memory failure. Returns the segments and blocks restored.
fn restore_start(
    alloc: &CachingAllocator<SimDevice>,
    start: &[StartSegment],
    addresses: &mut AddrMap<u64>,
    first_oom: &mut Option<FirstOom>,
) -> (u64, u64) {
    let (mut restored_segments, mut restored_blocks) = (0, 0);
    for segment in start {
        let offsets: Vec<(u64, u64, u64)> = segment
            .blocks
            .iter()
            .map(|&(addr, size, requested)| (addr - segment.address, size, requested))
            .collect();
        match alloc.restore_segment(
            segment.size,
            StreamId(segment.stream),
            segment.pool,
            &offsets,
        ) {
            Ok(base) => {
                restored_segments += 1;
                for &(addr, _, _) in &segment.blocks {
                    addresses.insert(addr, base + (addr - segment.address));
                    restored_blocks += 1;
                }
            }
            Err(err) => {
                let stats = alloc.stats();
                first_oom.get_or_insert(FirstOom {
                    seq: 0,
                    step: 0,
                    site: None,
                    requested: segment.size,
                    allocated: stats.allocated_bytes.all.current,
                    reserved: stats.reserved_bytes.all.current,
                    address_space: matches!(
                        &err,
                        vramscope_caching::AllocError::OutOfMemory(report)
                            if report.cause == vramscope_model::oom::OomCause::AddressSpace
                    ),
                });
            }
        }
    }
    (restored_segments, restored_blocks)
}

/// Recreates the memory from before the trace that its format records only as totals
/// (`unattributed`), as [`HeldBeforeTrace`] describes: the allocated bytes as one live block
/// filling a segment of their size, and, without a `capacity`, the reserved bytes beyond them
/// as one free segment. `None` when there is none.
fn restore_unattributed(
    alloc: &CachingAllocator<SimDevice>,
    unattributed: Usage,
    capacity: Option<u64>,
) -> Option<HeldBeforeTrace> {
    if unattributed == Usage::default() {
        return None;
    }
    let allocated = unattributed.allocated;
    let cached = unattributed.reserved.saturating_sub(allocated);
    // The replay's device has no limit, so these restorations cannot fail; a start that
    // passes the capacity makes the next segment the replay needs fail instead.
    if allocated > 0 {
        let pool = pool_for(allocated);
        let _ = alloc.restore_segment(allocated, StreamId(0), pool, &[(0, allocated, allocated)]);
    }
    let cached_restored = cached > 0
        && capacity.is_none()
        && alloc
            .restore_segment(cached, StreamId(0), Pool::Large, &[])
            .is_ok();
    Some(HeldBeforeTrace {
        allocated,
        cached,
        cached_restored,
    })
}

/// What a replay of one device's events takes from the trace besides the walk to its start
/// ([`replayed_events`]).
struct ChosenEvents {
    /// The indices of the events it performs, in order. Indices take four bytes: a big trace
    /// has millions of these, and the engine numbers events in `u32`.
    events: Vec<u32>,
    /// The indices at which `empty_cache()` was called (an explicit event, or the first of a
    /// burst of segment frees that no allocation asked for).
    empty_cache_at: rustc_hash::FxHashSet<usize>,
    /// The trace's segment allocations (size, address), whose addresses new segments take.
    plan: Vec<(u64, u64)>,
    /// When verifying, the trace's device calls, to check the replay's against.
    device_calls: Option<Vec<(u64, DeviceCall)>>,
}

/// What the replay of `device`'s events takes from the trace ([`ChosenEvents`]): the events
/// it performs (allocations, completed frees, failed requests and the first event of each
/// `empty_cache()` call), and with `verify` the trace's device calls.
fn replayed_events(snapshot: &Snapshot, device: u32, verify: bool) -> ChosenEvents {
    let empty_cache_at: rustc_hash::FxHashSet<usize> =
        vramscope_engine::empty_cache_calls(snapshot)
            .iter()
            .filter(|c| u32::from(snapshot.events[c.first_event as usize].device) == device)
            .map(|c| c.first_event as usize)
            .collect();
    // One pass for the rest, which a big trace's size (80 bytes an event) makes worth it.
    let mut events = Vec::new();
    let mut plan = Vec::new();
    let mut calls = Vec::new();
    for (i, e) in snapshot.events.iter().enumerate() {
        if u32::from(e.device) != device {
            continue;
        }
        if matches!(
            e.kind,
            EventKind::Alloc | EventKind::FreeCompleted | EventKind::Oom
        ) || empty_cache_at.contains(&i)
        {
            events.push(i as u32);
        }
        if e.kind == EventKind::SegmentAlloc {
            plan.push((e.size, e.addr));
        }
        if verify {
            calls.extend(device_call(e));
        }
    }
    ChosenEvents {
        events,
        empty_cache_at,
        plan,
        device_calls: verify.then_some(calls),
    }
}

/// The call site of an event as a reader names it.
fn site_of(snapshot: &Snapshot, site: Option<vramscope_model::SiteId>) -> Option<String> {
    let site = snapshot.sites.get(site? as usize)?;
    Some(vramscope_engine::name_call_site(site).label)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn traced_run(config: &str) -> Snapshot {
        let alloc = CachingAllocator::new(
            SimDevice::phantom(1 << 40),
            AllocatorConfig::parse(config).unwrap(),
        );
        let _weights = alloc.alloc(100 << 20).unwrap();
        for _ in 0..5 {
            alloc.mark_step();
            let a = alloc.alloc(30 << 20).unwrap();
            let _b = alloc.alloc(3 << 20).unwrap();
            drop(a);
            let _c = alloc.alloc(50 << 20).unwrap();
        }
        alloc.snapshot()
    }

    #[test]
    fn replaying_our_own_trace_reproduces_its_figures() {
        let snapshot = traced_run("");
        let result = replay(&snapshot, &ReplayOptions::default(), &mut |_, _| {});
        assert_eq!(
            result.figures.segment_allocs,
            result.original.segment_allocs
        );
        assert_eq!(result.figures.peak_reserved, result.original.peak_reserved);
        assert_eq!(
            result.figures.peak_reserved,
            Some(snapshot.stats.reserved_bytes.all.peak)
        );
        assert_eq!(result.unmatched_frees, 0);
        assert_eq!(
            result.restored_segments, 0,
            "the trace starts from an empty device"
        );
    }

    #[test]
    fn device_calls_taken_as_the_replay_goes_are_those_of_a_full_ring() {
        // Enough events for several takes, with segments made and freed between them.
        let alloc = CachingAllocator::new(SimDevice::phantom(1 << 40), AllocatorConfig::default());
        for i in 0..3000u64 {
            let block = alloc.alloc((1 + i % 40) << 20).unwrap();
            drop(block);
            if i % 700 == 0 {
                alloc.empty_cache();
            }
        }
        let snapshot = alloc.snapshot();
        let options = ReplayOptions {
            verify: true,
            ..ReplayOptions::default()
        };
        let (full, lost) = replay_with_ring(
            &snapshot,
            &options,
            &mut |_, _| {},
            &mut Keep::TraceFigures { estimated: false },
            usize::MAX,
        );
        assert!(!lost);
        let check = full.device_calls.clone().expect("verified");
        assert!(check.trace_calls > 4, "{check:?}");
        let (bounded, lost) = replay_with_ring(
            &snapshot,
            &options,
            &mut |_, _| {},
            &mut Keep::TraceFigures { estimated: false },
            CallLog::RING,
        );
        assert!(!lost);
        assert_eq!(bounded, full);
        // A ring too small for the events between two takes says so, and the replay is then
        // done again with a full one.
        let (_, lost) = replay_with_ring(
            &snapshot,
            &options,
            &mut |_, _| {},
            &mut Keep::TraceFigures { estimated: false },
            2,
        );
        assert!(lost);
        assert_eq!(replay(&snapshot, &options, &mut |_, _| {}), full);
    }

    #[test]
    fn a_small_capacity_names_the_first_oom() {
        let snapshot = traced_run("");
        let options = ReplayOptions {
            capacity: Some(150 << 20),
            ..ReplayOptions::default()
        };
        let result = replay(&snapshot, &options, &mut |_, _| {});
        let oom = result.first_oom.clone().expect("150 MiB is too small");
        assert!(oom.step >= 1);
        assert!(result.figures.num_ooms.unwrap() >= 1);
        let json = serde_json::to_value(&result).unwrap();
        for key in [
            "events",
            "peak_allocated",
            "peak_reserved",
            "segment_allocs",
            "segment_frees",
            "num_alloc_retries",
            "num_ooms",
            "original",
        ] {
            assert!(json.get(key).is_some(), "{key}");
        }
    }

    #[test]
    fn late_traces_start_from_the_reconstructed_state() {
        // Record only the second half of a run: drop the events of the first half.
        let mut snapshot = traced_run("");
        let cut = snapshot
            .events
            .iter()
            .position(|e| e.kind == EventKind::Step && e.step >= 3)
            .unwrap();
        snapshot.events.drain(..cut);
        let start = initial_state(&snapshot);
        assert!(!start.is_empty());
        assert!(
            start.iter().any(|s| !s.blocks.is_empty()),
            "the weights were live"
        );
        let result = replay(&snapshot, &ReplayOptions::default(), &mut |_, _| {});
        assert_eq!(result.unmatched_frees, 0);
        assert_eq!(result.figures.segment_allocs, Some(0));
        assert_eq!(result.original.segment_allocs, Some(0));
    }

    #[test]
    fn sweep_ranks_fitting_settings_first() {
        let snapshot = traced_run("");
        let rows = sweep(&snapshot, Some(400 << 20), &mut |_, _| {});
        assert_eq!(rows.len(), sweep_configs().len());
        assert!(rows[0].fits || rows.iter().all(|r| !r.fits));
        let fits_then_not = rows.windows(2).all(|w| w[0].fits || !w[1].fits);
        assert!(fits_then_not);
    }
}
