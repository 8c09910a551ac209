//! What a PyTorch snapshot pickle can carry of a snapshot from another source, and what it
//! cannot.
//!
//! A PyTorch pickle holds the dump-time state (`segments`), the trace (`device_traces`:
//! allocations, frees as a request and a completion, segment events, OOMs), the allocator
//! settings and the annotations that mark steps. The parent module writes a snapshot into that
//! shape so that the pickle imports again to the same start state, usage, peaks, end state and
//! step labels; this module holds what that needs beyond a plain copy:
//!
//! - [`DumpState::from_snapshot`]: the dump-time state of a snapshot that has none (a profiler trace, a
//!   device's part of a vramscope snapshot), from the engine's end state
//!   (`vramscope_engine::Reconstruction`): its segments and blocks as they are, each live
//!   block outside any segment in a segment of its own, and the memory from before the trace
//!   that a format records only as totals (`MemoryState::unattributed`) as one block in a
//!   segment past every address of the trace;
//! - [`completions_only`]: whether the snapshot records frees only as completions (a profiler
//!   trace), so that each is written as PyTorch writes a free, a request and then a completion;
//! - [`step_names`]: the annotation names that give the steps back with their labels;
//! - [`not_carried`]: one line for each thing the pickle cannot carry, for `vramscope convert`
//!   to print.

use vramscope_engine::{MemoryState, Reconstruction, Usage, NO_EVENT};
use vramscope_model::pytorch::{pool_for, SMALL_BUFFER};
use vramscope_model::{
    format_bytes, overlapping_segment, plural, Block, BlockPlacement, BlockState, EventKind,
    Segment, Snapshot, SnapshotSource, StepMark,
};

use super::ExportError;
use vramscope_model::pytorch::STEP_ANNOTATIONS;

/// Made segments start on this alignment (a small-pool segment's size).
const SEGMENT_ALIGNMENT: u64 = SMALL_BUFFER;
/// Where every address range of a file must end for the importer to read it.
const ADDRESS_END: u64 = 1 << 63;
/// The most all the sizes of a file may add up to for the importer to read it.
const MAX_TOTAL: u64 = 1 << 60;

/// The dump-time state written for a snapshot without one. See the module documentation.
#[derive(Debug)]
pub(crate) struct DumpState {
    /// The segments to write, sorted by device and address.
    pub segments: Vec<Segment>,
    /// How many of them were made around a live block that no segment of the end state holds.
    pub around_blocks: usize,
    /// Memory from before the trace that the source records only as totals.
    pub unattributed: Usage,
    /// The segment made for that memory: its address and size.
    pub unattributed_segment: Option<(u64, u64)>,
    /// Reserved bytes at the end, as the source records them.
    pub end_reserved: u64,
    /// Reserved bytes the written segments hold beyond that (live blocks outside segments that
    /// need more room than the source reserves).
    pub extra_reserved: u64,
    /// Whether the source records reserved memory at all.
    pub reserved_known: bool,
}

/// An allocated block from before the trace (or made by it) at `address`.
fn active_block(address: u64, size: u64, requested: u64) -> Block {
    Block {
        address,
        size,
        requested_size: requested,
        state: BlockState::ActiveAllocated,
        site: None,
        tag: None,
        scope: None,
        step: 0,
        thread: 0,
    }
}

impl DumpState {
    /// The dump-time state of `snapshot` when it has none and there is something to carry;
    /// `None` when its own segments are the dump-time state or its end state is empty. An
    /// error when the segments would not fit the limits the importer reads files within.
    pub(crate) fn from_snapshot(snapshot: &Snapshot) -> Result<Option<DumpState>, ExportError> {
        if !snapshot.segments.is_empty() {
            return Ok(None);
        }
        let walk = Reconstruction::from_snapshot(snapshot);
        DumpState::from_state(snapshot, &walk.end, walk.reserved_known)
    }

    /// The dump-time state that holds `end`, a state of `snapshot`'s trace (its end state, or
    /// the state after the last event of a range of steps), with `reserved_known` whether the
    /// source records reserved memory; `None` when `end` holds nothing. An error when the
    /// segments would not fit the limits the importer reads files within.
    pub(crate) fn from_state(
        snapshot: &Snapshot,
        end: &MemoryState,
        reserved_known: bool,
    ) -> Result<Option<DumpState>, ExportError> {
        if end.blocks.is_empty() && end.segments.is_empty() && end.unattributed == Usage::default()
        {
            return Ok(None);
        }
        let mut segments = end.to_segments();
        // Each live block outside every segment gets a segment of its own size; blocks that
        // overlap (an inconsistent trace) share one.
        let inside = |addr: u64| {
            end.segments
                .range(..=addr)
                .next_back()
                .is_some_and(|(&base, s)| addr < base.saturating_add(s.size))
        };
        let mut made: Vec<Segment> = Vec::new();
        for (&addr, b) in end.blocks.by_address().filter(|(&a, _)| !inside(a)) {
            let device = if b.alloc_event == NO_EVENT {
                snapshot.device.index
            } else {
                snapshot
                    .events
                    .get(b.alloc_event as usize)
                    .map_or(snapshot.device.index, |e| u32::from(e.device))
            };
            let block = b.to_block(addr, b.size, b.requested);
            let block_end = addr.saturating_add(b.size);
            match made.last_mut() {
                Some(last) if last.device == device && addr < last.address + last.total_size => {
                    last.total_size = block_end.max(last.address + last.total_size) - last.address;
                    last.blocks.push(block);
                }
                _ => made.push(Segment {
                    device,
                    address: addr,
                    total_size: b.size,
                    stream: b.stream,
                    pool: pool_for(b.size),
                    expandable: false,
                    blocks: vec![block],
                }),
            }
        }
        let around_blocks = made.len();
        let around: u64 = made
            .iter()
            .map(|s| s.total_size)
            .fold(0, u64::saturating_add);
        segments.extend(made);
        // A source that records block sizes only has no requests: each is its block's size, as
        // the trace's events are written.
        for b in segments.iter_mut().flat_map(|s| s.blocks.iter_mut()) {
            if b.state != BlockState::Inactive && b.requested_size == 0 {
                b.requested_size = b.size;
            }
        }

        // The memory known only as totals: one block in a segment that holds, with the
        // segments made around blocks, what the source says was reserved beyond its segments.
        let unattributed = end.unattributed;
        let size = unattributed
            .allocated
            .max(unattributed.reserved.saturating_sub(around));
        let mut unattributed_segment = None;
        if size > 0 {
            let highest = snapshot
                .events
                .iter()
                .map(|e| e.addr.saturating_add(e.size))
                .chain(
                    segments
                        .iter()
                        .map(|s| s.address.saturating_add(s.total_size)),
                )
                .max()
                .unwrap_or(0);
            let address = highest
                .max(1)
                .checked_next_multiple_of(SEGMENT_ALIGNMENT)
                .filter(|a| a.checked_add(size).is_some_and(|e| e <= ADDRESS_END))
                .ok_or_else(|| ExportError::Limit {
                    what: format!(
                        "no room past the trace's highest address ({highest:#x}) for a segment of {size} bytes holding the memory from before the trace"
                    ),
                })?;
            let mut blocks = Vec::new();
            if unattributed.allocated > 0 {
                let a = unattributed.allocated;
                blocks.push(active_block(address, a, a));
            }
            if size > unattributed.allocated {
                blocks.push(Block {
                    requested_size: 0,
                    state: BlockState::Inactive,
                    ..active_block(
                        address + unattributed.allocated,
                        size - unattributed.allocated,
                        0,
                    )
                });
            }
            segments.push(Segment {
                device: snapshot.device.index,
                address,
                total_size: size,
                stream: 0,
                pool: pool_for(unattributed.allocated.max(1)),
                expandable: false,
                blocks,
            });
            unattributed_segment = Some((address, size));
        }
        segments.sort_by_key(|s| (s.device, s.address));
        for s in &segments {
            if s.address
                .checked_add(s.total_size)
                .is_none_or(|e| e > ADDRESS_END)
            {
                return Err(ExportError::Limit {
                    what: format!(
                        "a segment made for the live block at {:#x} ({} bytes) ends past 2^63",
                        s.address, s.total_size
                    ),
                });
            }
        }
        let written = segments
            .iter()
            .map(|s| s.total_size)
            .fold(0u64, u64::saturating_add);
        Ok(Some(DumpState {
            segments,
            around_blocks,
            unattributed,
            unattributed_segment,
            end_reserved: end.reserved,
            extra_reserved: written.saturating_sub(end.reserved),
            reserved_known,
        }))
    }
}

/// Fails when `segments` would not import again: two segments of a device that overlap, or a
/// block outside its segment or over another ([`Segment::misplaced_block`]). Only an
/// inconsistent trace leaves live blocks so, and the importer refuses such a file.
pub(crate) fn check_layout(segments: &[Segment]) -> Result<(), ExportError> {
    let mut order: Vec<&Segment> = segments.iter().collect();
    order.sort_by_key(|s| (s.device, s.address));
    if let Some(i) = overlapping_segment(&order) {
        let (before, after) = (order[i - 1], order[i]);
        return Err(ExportError::Limit {
            what: format!(
                "the segment at {:#x} overlaps the one at {:#x} ({} bytes) on device {}: the trace is inconsistent, and a pickle cannot hold memory that overlaps",
                after.address, before.address, before.total_size, after.device
            ),
        });
    }
    for segment in segments {
        if let Some((i, placement)) = segment.misplaced_block() {
            let block = &segment.blocks[i];
            let how = match placement {
                BlockPlacement::OutsideSegment => "lies outside its segment",
                BlockPlacement::Overlaps { .. } => "overlaps another block",
            };
            return Err(ExportError::Limit {
                what: format!(
                    "the live block at {:#x} ({} bytes) {how} in the segment at {:#x}: the trace is inconsistent, and a pickle cannot hold memory that overlaps",
                    block.address, block.size, segment.address
                ),
            });
        }
    }
    Ok(())
}

/// Fails when the sizes a pickle holds add up past what the importer reads: `events` (each
/// event's size as written), and the segments and blocks of `segments`.
pub(crate) fn check_total(
    events: impl Iterator<Item = u64>,
    segments: &[Segment],
) -> Result<(), ExportError> {
    let mut total = 0u64;
    let sizes = events.chain(
        segments
            .iter()
            .flat_map(|s| std::iter::once(s.total_size).chain(s.blocks.iter().map(|b| b.size))),
    );
    for size in sizes {
        total = total
            .checked_add(size)
            .filter(|&t| t <= MAX_TOTAL)
            .ok_or_else(|| ExportError::Limit {
                what: "the sizes of the pickle's trace and segments add up past 2^60 bytes, more than PyTorch's format is read with".to_string(),
            })?;
    }
    Ok(())
}

/// Whether `snapshot` records frees only as completions (as a profiler trace does): it has
/// completed frees and no free requests. Such frees are written as PyTorch writes every free,
/// a `free_requested` and then a `free_completed`.
pub(crate) fn completions_only(snapshot: &Snapshot) -> bool {
    let has = |kind| snapshot.events.iter().any(|e| e.kind == kind);
    has(EventKind::FreeCompleted) && !has(EventKind::FreeRequested)
}

/// The names of the `START` annotations that mark `steps` in a pickle, and whether they are
/// the steps' own labels. They are when the PyTorch importer would take them all for steps
/// again (`vramscope_import::pytorch`: the first family of step annotations any name starts with,
/// else the first name as the family); otherwise each step is `ProfilerStep#N`, the name
/// PyTorch's profiler gives steps.
pub(crate) fn step_names(steps: &[StepMark]) -> (Vec<String>, bool) {
    let labels: Vec<&str> = steps.iter().map(|m| m.label.as_str()).collect();
    let family = STEP_ANNOTATIONS
        .iter()
        .copied()
        .find(|p| labels.iter().any(|l| l.starts_with(p)))
        .or_else(|| labels.first().copied().filter(|l| !l.is_empty()));
    let carried = family.is_some_and(|f| labels.iter().all(|l| l.starts_with(f)));
    if carried {
        (labels.iter().map(|l| l.to_string()).collect(), true)
    } else {
        let names = steps
            .iter()
            .map(|m| format!("ProfilerStep#{}", m.step))
            .collect();
        (names, steps.is_empty())
    }
}

/// What the pickle written for `snapshot` cannot carry, one line each (empty when it carries
/// everything): events PyTorch has no entry for, figures it does not record, and what the
/// writer made up to carry the rest (`dump`, the dump-time state made for a snapshot without
/// one; frees written as two entries).
pub(crate) fn not_carried(snapshot: &Snapshot, dump: Option<&DumpState>) -> Vec<String> {
    let mut lines = Vec::new();
    let count = |kind: fn(&EventKind) -> bool| {
        snapshot.events.iter().filter(|e| kind(&e.kind)).count() as u64
    };
    let transfers = count(|k| matches!(k, EventKind::Transfer(_)));
    if transfers > 0 {
        lines.push(format!(
            "{}: PyTorch snapshots record no host/device copies",
            plural(transfers, "transfer event")
        ));
    }
    let syncs = count(|k| *k == EventKind::Sync);
    if syncs > 0 {
        lines.push(format!(
            "{}: PyTorch snapshots record no synchronizations",
            plural(syncs, "sync event")
        ));
    }
    let empty_cache = count(|k| *k == EventKind::EmptyCache);
    if empty_cache > 0 {
        lines.push(format!(
            "{}: PyTorch records only the segment frees an empty_cache() makes",
            plural(empty_cache, "empty_cache() event")
        ));
    }
    if completions_only(snapshot) {
        let frees = count(|k| *k == EventKind::FreeCompleted);
        lines.push(format!(
            "{} recorded only as completed: each is written as PyTorch records a free, a free_requested and a free_completed, so the pickle has {frees} more events and those after the first free are numbered differently",
            plural(frees, "free"),
        ));
    }
    let block_events = snapshot.events.iter().filter(|e| {
        matches!(
            e.kind,
            EventKind::Alloc | EventKind::FreeRequested | EventKind::FreeCompleted
        )
    });
    if snapshot.source == SnapshotSource::ChromeTrace {
        lines.push(
            "device allocations and frees, empty_cache() calls and OOMs: the source does not record them, and the result reads as a trace without any".to_string(),
        );
    }
    if block_events.clone().next().is_some() && block_events.clone().all(|e| e.requested == 0) {
        lines.push(
            "requested sizes: the source records block sizes only; each request is written as its block's size".to_string(),
        );
    }
    if let Some(dump) = dump {
        lines.extend(dump_lines(dump));
    }
    if snapshot.annotations.is_empty() {
        let (names, carried) = step_names(&snapshot.steps);
        if !carried {
            let first = &snapshot.steps[0];
            lines.push(format!(
                "step labels (`{}` for step {}): written as {}, the name PyTorch's profiler gives steps",
                first.label,
                first.step,
                names[0]
            ));
        }
    }
    let fine = snapshot
        .events
        .iter()
        .map(|e| e.time_ns)
        .chain(snapshot.steps.iter().map(|m| m.time_ns))
        .chain(snapshot.annotations.iter().map(|a| a.time_ns))
        .filter(|t| t % 1000 != 0)
        .count() as u64;
    if fine > 0 {
        lines.push(format!(
            "times finer than a microsecond ({}): PyTorch records whole microseconds",
            plural(fine, "event or mark")
        ));
    }
    if snapshot.source == SnapshotSource::Vramscope && snapshot.stats != Default::default() {
        lines.push(format!(
            "allocation retries ({}) and synchronizations of all streams ({}): PyTorch snapshots do not record them",
            snapshot.stats.num_alloc_retries, snapshot.stats.num_sync_all_streams
        ));
    }
    let device = &snapshot.device;
    if device.capacity > 0 || device.name != format!("cuda:{}", device.index) {
        let capacity = if device.capacity > 0 {
            format_bytes(device.capacity)
        } else {
            "unknown".to_string()
        };
        lines.push(format!(
            "the device's name ({}) and capacity ({capacity}): a PyTorch snapshot names a device by its number and records no capacity",
            device.name
        ));
    }
    let labelled = snapshot
        .events
        .iter()
        .filter(|e| e.tag.is_some() || e.scope.is_some())
        .count() as u64;
    if labelled > 0 {
        lines.push(format!(
            "the tags and scopes of {}: PyTorch snapshots have neither",
            plural(labelled, "event")
        ));
    }
    let threaded = snapshot.events.iter().filter(|e| e.thread != 0).count() as u64;
    if threaded > 0 {
        lines.push(format!(
            "the threads of {}: PyTorch snapshots do not record them",
            plural(threaded, "event")
        ));
    }
    if snapshot.dropped_events > 0 {
        lines.push(format!(
            "the count of events the recorder dropped ({})",
            snapshot.dropped_events
        ));
    }
    if !snapshot.violations.is_empty() {
        lines.push(format!(
            "{}: PyTorch snapshots have no place for them",
            plural(snapshot.violations.len() as u64, "debug-check violation")
        ));
    }
    lines
}

/// What the dump-time state a snapshot without one is given cannot carry: segments around live
/// blocks the source does not record, memory from before the trace known only as totals, and
/// reserved memory the source does not know.
fn dump_lines(dump: &DumpState) -> Vec<String> {
    let mut lines = Vec::new();
    if dump.around_blocks > 0 {
        lines.push(format!(
            "the segments around {}: the source records none; each is written in a segment of its own size, which the result's segment counts and free blocks count",
            plural(dump.around_blocks as u64, "live block")
        ));
    }
    if let Some((address, size)) = dump.unattributed_segment {
        let free = size.saturating_sub(dump.unattributed.allocated);
        lines.push(format!(
            "memory from before the trace known only as totals ({} allocated, {} reserved): written as one block of {} under no call site, in a segment of {} at {address:#x}{}",
            format_bytes(dump.unattributed.allocated),
            format_bytes(dump.unattributed.reserved),
            format_bytes(dump.unattributed.allocated),
            format_bytes(size),
            if free > 0 && dump.unattributed.allocated > 0 {
                format!(" whose free {} the result counts as non-releasable", format_bytes(free))
            } else {
                String::new()
            }
        ));
    }
    if !dump.reserved_known {
        lines.push(format!(
            "reserved memory: the source does not record it; the pickle's segments reserve what is live at the end ({}), which the result shows as reserved",
            format_bytes(dump.end_reserved.saturating_add(dump.extra_reserved))
        ));
    } else if dump.extra_reserved > 0 {
        lines.push(format!(
            "reserved memory at the end: the source records {}, less than its live blocks need; the pickle's segments reserve {}",
            format_bytes(dump.end_reserved),
            format_bytes(dump.end_reserved.saturating_add(dump.extra_reserved))
        ));
    }
    lines
}
