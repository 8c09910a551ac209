//! Block sizing: a PyTorch trace records requested sizes; the block each request took is
//! found by replaying the trace through the caching allocator with the trace's own settings
//! ([`size_blocks`]), by the dump-time state for blocks still live at the end or freed from
//! before the trace, and by rounding where nothing says better ([`BlockSizing`]).

use super::*;

/// Where the block sizes of a trace's allocations came from ([`size_blocks`], [`block_sizing`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BlockSizing {
    /// From a replay with the trace's own settings whose device calls were the trace's, call
    /// for call: the sizes PyTorch's allocator gave the blocks.
    Replayed,
    /// Each request rounded as PyTorch rounds it (512 bytes, or the power-of-two divisions of
    /// the settings): an estimate, short of the truth where a whole free block was given to a
    /// smaller request.
    Rounded,
}

/// Gives every allocation and free of a trace that records requested sizes (PyTorch's) its
/// block size, the figure PyTorch's `allocated_bytes` counts, so that every view of the trace
/// shows PyTorch's own allocated bytes. The trace is replayed with its own settings; when the
/// replay's device calls are the trace's, call for call, the replay's blocks are PyTorch's
/// and their sizes are taken, else each request is rounded. A block still allocated at the
/// end takes its size from the dump-time state, which records it. `Event::requested` keeps
/// the request. Frees take the size of the allocation they release.
pub fn size_blocks(snapshot: &mut Snapshot) -> BlockSizing {
    size_blocks_with_progress(snapshot, &mut |_, _| {})
}

/// How the block sizes of an imported snapshot were found: `None` when they are the trace's
/// own record (a snapshot that is not PyTorch's), else what [`size_blocks`] decided when the
/// snapshot was imported, found again. A freed block whose size is not its request rounded
/// can only come from the replay; otherwise the trace is replayed with its own settings, as
/// [`size_blocks`] did, and its device calls decide.
pub fn block_sizing(snapshot: &Snapshot) -> Option<BlockSizing> {
    if snapshot.source != SnapshotSource::Pytorch {
        return None;
    }
    let divisions = snapshot.config.roundup_power2_divisions;
    let mut pairing = Pairing::new();
    for (i, e) in snapshot.events.iter().enumerate() {
        if let Pair::Free(link) = pairing.push(i as u32, e) {
            let alloc = link.alloc.map(|a| &snapshot.events[a as usize]);
            if alloc.is_some_and(|a| a.size != round_size(a.requested, divisions)) {
                return Some(BlockSizing::Replayed);
            }
        }
    }
    let options = ReplayOptions {
        trace_settings: true,
        verify: true,
        ..ReplayOptions::default()
    };
    let result = replay_recording(snapshot, &options, &mut |_, _| {}, &mut Keep::Nothing);
    Some(sizing_of(result.device_calls.as_ref()))
}

/// What a replay's device-call check says of the blocks it served: PyTorch's own when the
/// trace has device calls and the replay made them all alike.
pub(crate) fn sizing_of(check: Option<&DeviceCallCheck>) -> BlockSizing {
    match check {
        Some(check) if check.trace_calls > 0 && check.first_difference.is_none() => {
            BlockSizing::Replayed
        }
        _ => BlockSizing::Rounded,
    }
}

/// [`size_blocks`], calling `progress(done, total)` as the replay goes through the trace's
/// events (as [`replay`] calls its own).
pub fn size_blocks_with_progress(
    snapshot: &mut Snapshot,
    progress: &mut dyn FnMut(usize, usize),
) -> BlockSizing {
    size_blocks_visiting(snapshot, None, progress, &mut |_, _, _| {})
}

/// [`size_blocks_with_progress`], handing every event, in order and once it has its block
/// size, to `visit` with what the engine's pairing (`vramscope_engine::Pairing`, over all
/// the snapshot's events) found for it and, for an allocation that replaced a block the trace
/// did not free, the sized event that describes that block ([`Pair::link`]): the sizing's last
/// pass reads every event's pair ([`PairedEvents::pair_at`]), and a caller that needs the
/// sized events paired (the importer's statistics) need not pair them again. `paired` is the snapshot's events paired
/// already, in their order (the importer pairs them on a second core while it reads them), or
/// `None` to pair them here. They must be the pairs of these events in this order: only pairs
/// of another number of events are refused (with a panic).
pub fn size_blocks_visiting(
    snapshot: &mut Snapshot,
    paired: Option<PairedEvents>,
    progress: &mut dyn FnMut(usize, usize),
    visit: &mut (dyn FnMut(&Event, Pair, Option<&Event>) + Send),
) -> BlockSizing {
    // Until the replay says better, every block is its request rounded (which is also what
    // the replay's starting state needs of blocks from before the trace).
    let divisions = snapshot.config.roundup_power2_divisions;
    // The pairs (found here, or by the caller) are also the walk's to the trace's start (they
    // do not depend on sizes): it takes them rather than pairing the trace again.
    let paired = paired.unwrap_or_else(|| PairedEvents::pair(&snapshot.events));
    assert_eq!(
        paired.len(),
        snapshot.events.len(),
        "the pairs given are those of the snapshot's events"
    );
    // The allocations and frees of either kind: the events the pairing links (`Pair::Alloc`
    // and `Pair::Free`).
    for e in snapshot.events.iter_mut() {
        if matches!(
            e.kind,
            EventKind::Alloc | EventKind::FreeRequested | EventKind::FreeCompleted
        ) {
            if e.requested == 0 {
                e.requested = e.size;
            }
            e.size = round_size(e.requested, divisions);
        }
    }
    let options = ReplayOptions {
        trace_settings: true,
        verify: true,
        ..ReplayOptions::default()
    };
    // Blocks from before the trace that it frees take the size PyTorch's rule leaves them
    // in the segments around them at the start ([`BeforeTraceSizes`]); where that is not the
    // request rounded, their frees are sized before the replay, whose start state then holds
    // them as PyTorch did, and the start is walked again.
    let mut start = Reconstruction::start_of_paired(snapshot, &paired);
    let before_trace = BeforeTraceSizes::new(snapshot, Some(&start));
    if before_trace.resizes(&start, divisions) {
        let mut pairing = Pairing::new();
        for (i, e) in snapshot.events.iter_mut().enumerate() {
            if let Pair::Free(link) = pairing.push(i as u32, e) {
                if link.alloc.is_none() {
                    e.size = before_trace.size(i as u32, e, divisions);
                }
            }
        }
        start = Reconstruction::start_of_paired(snapshot, &paired);
    }
    // The replay notes the block size of each allocation it served where that is not the
    // rounded request; that becomes the block size of the allocation below. Only those are
    // kept: a list of every event's block size sat beside the events, eight bytes each.
    let mut served = FxHashMap::default();
    let result = replay_recording(
        snapshot,
        &options,
        progress,
        &mut Keep::BlockSizes(&mut served, &start),
    );
    if sizing_of(result.device_calls.as_ref()) == BlockSizing::Rounded {
        served.clear();
    }
    // A block still allocated at the end is in the dump-time state with its true size: that
    // beats any estimate, and keeps the walk forwards from the start equal to that state.
    let at_end: AddrMap<u64> = snapshot
        .segments
        .iter()
        .flat_map(|s| s.blocks.iter())
        .filter(|b| b.state != BlockState::Inactive)
        .map(|b| (b.address, b.size))
        .collect();
    for (addr, alloc) in paired.pairing().open_allocations() {
        if let Some(&size) = at_end.get(&addr) {
            served.insert(alloc, size);
        }
    }
    let block_size =
        |i: usize, e: &Event, pair: Pair, alloc_size: &dyn Fn(u32) -> u64| match (e.kind, pair) {
            (EventKind::Alloc, _) => Some(
                served
                    .get(&(i as u32))
                    .copied()
                    .unwrap_or_else(|| round_size(e.requested, divisions)),
            ),
            (_, Pair::Free(link)) => Some(match link.alloc {
                Some(alloc) => alloc_size(alloc),
                None => before_trace.size(i as u32, e, divisions),
            }),
            _ => None,
        };
    size_then_visit(&mut snapshot.events, &paired, &block_size, visit);
    drop(paired);
    sizing_of(result.device_calls.as_ref())
}

/// Events sized at a time before they are handed to the visitor ([`size_then_visit`]): 5 MiB
/// of events, which the visitor reads while the next ones are sized.
const SIZED_CHUNK: usize = 1 << 16;

/// Chunks handed to the visitor and not yet visited, at most, before the sizing waits.
const SIZED_QUEUE: usize = 4;

/// The events sized so far, as the chunks they were sized in (each [`SIZED_CHUNK`] long but
/// the last): read by index while later events are being sized.
#[derive(Default)]
struct SizedEvents<'a> {
    chunks: Vec<&'a [Event]>,
}

impl<'a> SizedEvents<'a> {
    fn get(&self, index: usize) -> &'a Event {
        &self.chunks[index / SIZED_CHUNK][index % SIZED_CHUNK]
    }
}

/// The block size of the event at an index, with its pair and the sizes of earlier
/// allocations by index, or `None` when it keeps its size ([`size_then_visit`]).
type BlockSizeOf<'a> = dyn Fn(usize, &Event, Pair, &dyn Fn(u32) -> u64) -> Option<u64> + 'a;

/// The sizing's last pass: gives every event its block size (`block_size(index, event, pair,
/// size of an earlier allocation)`, or `None` to keep it) in order, each free taking the size
/// its allocation has by then, and hands every sized event to `visit` with its pair and the
/// sized event that describes the block it replaced. The sizes are given on this thread and
/// the events visited on a second one, a chunk behind (on this one, once all are sized, when
/// no second thread can be started): the visitor (the importer's statistics) costs as much as
/// the sizing and needs nothing of it but the sized events.
fn size_then_visit(
    events: &mut [Event],
    paired: &PairedEvents,
    block_size: &BlockSizeOf<'_>,
    visit: &mut (dyn FnMut(&Event, Pair, Option<&Event>) + Send),
) {
    let visit_chunk =
        |sized: &SizedEvents<'_>,
         first: usize,
         chunk: &[Event],
         visit: &mut (dyn FnMut(&Event, Pair, Option<&Event>) + Send)| {
            for (k, e) in chunk.iter().enumerate() {
                let pair =
                    paired.pair_at((first + k) as u32, e.kind, |j| sized.get(j as usize).kind);
                // An allocation over a block the trace did not free replaces it: the event that
                // describes that block (sized already, as it comes earlier) goes with it.
                let replaced = pair.replaced().map(|r| sized.get(r as usize));
                visit(e, pair, replaced);
            }
        };
    // Lent to the visitor thread for as long as it runs, and back here if none started.
    let visit = std::sync::Mutex::new(visit);
    let visited_here = std::thread::scope(|scope| {
        let (to_visitor, received) = std::sync::mpsc::sync_channel::<&[Event]>(SIZED_QUEUE);
        let visitor = std::thread::Builder::new()
            .name("vramscope-visit".to_string())
            .spawn_scoped(scope, || {
                let mut visit = visit
                    .lock()
                    .unwrap_or_else(|poisoned| poisoned.into_inner());
                let mut sized = SizedEvents::default();
                for chunk in received {
                    let first = sized.chunks.len() * SIZED_CHUNK;
                    sized.chunks.push(chunk);
                    visit_chunk(&sized, first, chunk, &mut **visit);
                }
            });
        let mut sized = SizedEvents::default();
        let mut rest = events;
        while !rest.is_empty() {
            let first = sized.chunks.len() * SIZED_CHUNK;
            let (chunk, tail) = rest.split_at_mut(SIZED_CHUNK.min(rest.len()));
            for k in 0..chunk.len() {
                // The kind and size of an earlier event: in this chunk, or sized before it.
                let earlier = |j: u32| {
                    let e = match (j as usize).checked_sub(first) {
                        Some(at) => &chunk[at],
                        None => sized.get(j as usize),
                    };
                    (e.kind, e.size)
                };
                let e = &chunk[k];
                let pair = paired.pair_at((first + k) as u32, e.kind, |j| earlier(j).0);
                if let Some(size) = block_size(first + k, e, pair, &|j| earlier(j).1) {
                    chunk[k].size = size;
                }
            }
            let chunk: &[Event] = chunk;
            sized.chunks.push(chunk);
            if visitor.is_ok() {
                // The visitor ends only after the sender is dropped, or by panicking, which
                // joining it reports.
                let _ = to_visitor.send(chunk);
            }
            rest = tail;
        }
        drop(to_visitor);
        match visitor {
            Ok(handle) => {
                handle
                    .join()
                    .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
                None
            }
            Err(_) => Some(sized),
        }
    });
    if let Some(sized) = visited_here {
        let visit = visit
            .into_inner()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        for (n, chunk) in sized.chunks.iter().enumerate() {
            visit_chunk(&sized, n * SIZED_CHUNK, chunk, visit);
        }
    }
}

/// The sizes of blocks from before the trace that the trace frees. Their events carry the
/// request only; the block may be larger (a 3 MiB request takes a whole 4 MiB free block when
/// the 1 MiB left is too small to split off; a 31.25 MiB request gets a 32 MiB segment it does
/// not split). Where the dump-time state still shows the freed block, an inactive block at its
/// address that nothing allocated at after the free, and its size is one PyTorch could have
/// handed that request unsplit, that size is the block's. Else the segments at the trace's
/// start say it where PyTorch's rule leaves one size ([`size_in_room`]): the room from the
/// block to the next live block or its segment's end, with the pools' split rules and
/// `max_split_size_mb`. Where two sizes remain possible, the request rounded is the estimate.
pub(crate) struct BeforeTraceSizes {
    /// Size of each inactive block at the dump, by address.
    free_at_end: AddrMap<u64>,
    /// Index of the last allocation at each address.
    last_alloc: AddrMap<u32>,
    /// The room each block from before the trace had at its start ([`Room`]), by address.
    room: AddrMap<Room>,
    /// `max_split_size_mb` of the trace's settings.
    max_split_size: Option<u64>,
}

/// Where a block from before the trace lay at the trace's start: the bytes from its address
/// to the next live block or its segment's end, and its segment's kind.
#[derive(Clone, Copy, Debug)]
struct Room {
    bytes: u64,
    pool: Pool,
    expandable: bool,
}

/// The one size PyTorch's rule leaves a block whose request rounds to `rounded` and which
/// had `room` at the trace's start, or `None` where two remain possible. Every block of a
/// large pool's plain segment is over 1 MiB (smaller requests use the small pool, and a split
/// leaves more than 1 MiB), so a gap of 1 MiB or less after the request is part of its block;
/// a larger gap may be a free block of its own or the block handed whole, an estimate. The
/// small pool and expandable segments split off any 512 bytes, so their blocks are the request
/// rounded. A request of `max_split_size` or more is never split, and takes a block less than
/// 20 MiB larger.
fn size_in_room(rounded: u64, room: Room, max_split_size: Option<u64>) -> Option<u64> {
    use vramscope_model::pytorch::{LARGE_BUFFER, MIN_BLOCK_SIZE, SMALL_SIZE};
    let gap = room.bytes.checked_sub(rounded)?;
    if room.pool == Pool::Small || room.expandable {
        return (gap < MIN_BLOCK_SIZE || gap.is_multiple_of(MIN_BLOCK_SIZE)).then(|| {
            if gap < MIN_BLOCK_SIZE {
                rounded + gap
            } else {
                rounded
            }
        });
    }
    if gap == 0 {
        return Some(rounded);
    }
    if gap > SMALL_SIZE {
        return None;
    }
    let size = rounded + gap;
    let oversize = |bytes: u64| max_split_size.is_some_and(|limit| bytes >= limit);
    // A request under the split limit never takes a block at or over it; one at or over it
    // takes a block less than 20 MiB larger.
    let possible = if oversize(rounded) {
        gap < LARGE_BUFFER
    } else {
        !oversize(size)
    };
    possible.then_some(size)
}

impl BeforeTraceSizes {
    /// The inactive blocks of `snapshot`'s dump and where it allocates last, and the room
    /// each block from before the trace had in `start`, the trace's start state, if given.
    pub(crate) fn new(snapshot: &Snapshot, start: Option<&MemoryState>) -> BeforeTraceSizes {
        let mut sizes = BeforeTraceSizes::from_dump(snapshot);
        sizes.max_split_size = snapshot.config.max_split_size;
        if let Some(start) = start {
            sizes.room = rooms(start);
        }
        sizes
    }

    /// Whether any block from before the trace in `start` takes a size here other than the
    /// one it has there (its request rounded, before the sizing).
    fn resizes(&self, start: &MemoryState, divisions: u32) -> bool {
        start.blocks.unordered().any(|(&addr, block)| {
            block.predates_trace()
                && self.room.get(&addr).is_some_and(|&room| {
                    size_in_room(
                        round_size(block.requested, divisions),
                        room,
                        self.max_split_size,
                    )
                    .is_some_and(|size| size != block.size)
                })
        })
    }

    /// The inactive blocks of `snapshot`'s dump and where it allocates last.
    fn from_dump(snapshot: &Snapshot) -> BeforeTraceSizes {
        let free_at_end: AddrMap<u64> = snapshot
            .segments
            .iter()
            .flat_map(|s| s.blocks.iter())
            .filter(|b| b.state == BlockState::Inactive)
            .map(|b| (b.address, b.size))
            .collect();
        let mut last_alloc = AddrMap::default();
        if !free_at_end.is_empty() {
            for (i, e) in snapshot.events.iter().enumerate() {
                if e.kind == EventKind::Alloc {
                    last_alloc.insert(e.addr, i as u32);
                }
            }
        }
        BeforeTraceSizes {
            free_at_end,
            last_alloc,
            room: AddrMap::default(),
            max_split_size: None,
        }
    }

    /// The block size of free `e` (at index `index`) of a block from before the trace.
    fn size(&self, index: u32, e: &Event, divisions: u32) -> u64 {
        let requested = if e.requested == 0 {
            e.size
        } else {
            e.requested
        };
        let rounded = round_size(requested, divisions);
        self.known_size(index, e, rounded).unwrap_or(rounded)
    }

    /// The size of the block free `e` (at index `index`) releases where the dump shows it or
    /// the room it had at the start leaves one size; `None` where it is an estimate.
    fn known_size(&self, index: u32, e: &Event, rounded: u64) -> Option<u64> {
        self.dump_size(index, e, rounded).or_else(|| {
            let room = *self.room.get(&e.addr)?;
            size_in_room(rounded, room, self.max_split_size)
        })
    }

    /// Whether the size of the block free `e` (at index `index`) releases is known, not an
    /// estimate.
    fn shown(&self, index: u32, e: &Event, divisions: u32) -> bool {
        let requested = if e.requested == 0 {
            e.size
        } else {
            e.requested
        };
        self.known_size(index, e, round_size(requested, divisions))
            .is_some()
    }

    /// The size of the dump's inactive block at the address of free `e` (at index `index`),
    /// when nothing allocated there after the free and a request rounded to `rounded` could
    /// have taken that block whole.
    fn dump_size(&self, index: u32, e: &Event, rounded: u64) -> Option<u64> {
        let reused = self.last_alloc.get(&e.addr).is_some_and(|&a| a > index);
        match self.free_at_end.get(&e.addr) {
            Some(&size) if !reused && handed_unsplit(rounded, size) => Some(size),
            _ => None,
        }
    }
}

/// The room of every block from before the trace in `start` ([`Room`]), by address.
fn rooms(start: &MemoryState) -> AddrMap<Room> {
    let mut rooms = AddrMap::default();
    for (&address, segment) in &start.segments {
        let end = address.saturating_add(segment.size);
        let mut blocks = start.blocks.in_range(address, end).peekable();
        while let Some((&addr, block)) = blocks.next() {
            let next = blocks.peek().map_or(end, |&(&next, _)| next);
            if block.predates_trace() {
                rooms.insert(
                    addr,
                    Room {
                        bytes: next.saturating_sub(addr),
                        pool: segment.pool,
                        expandable: segment.expandable,
                    },
                );
            }
        }
    }
    rooms
}

/// How many blocks from before the trace that the trace frees have an estimated size: a
/// PyTorch trace records their requests only, and neither the dump-time state nor the room
/// each had at the trace's start leaves one size (see `BeforeTraceSizes`), so each counts as
/// its request rounded, where PyTorch may have handed the request a larger block whole. 0 for
/// a trace that is not PyTorch's, whose events carry block sizes.
pub fn estimated_before_trace_blocks(snapshot: &Snapshot) -> u64 {
    if snapshot.source != SnapshotSource::Pytorch {
        return 0;
    }
    // The walk to the start is taken only where the dump leaves some unknown: the room a
    // block had at the start only ever makes a size known.
    match count_estimated(snapshot, &BeforeTraceSizes::new(snapshot, None)) {
        0 => 0,
        _ => estimated_before_trace_blocks_from(snapshot, &Reconstruction::start_of(snapshot)),
    }
}

/// [`estimated_before_trace_blocks`] with the trace's start state at hand (`start`, the
/// engine walk's state before the first event, as [`Reconstruction::start_of`] gives it): one
/// pass over the events, without the walk back to the start and its links (four bytes an
/// event), which a caller that has walked the trace already need not pay again.
pub fn estimated_before_trace_blocks_from(snapshot: &Snapshot, start: &MemoryState) -> u64 {
    if snapshot.source != SnapshotSource::Pytorch {
        return 0;
    }
    count_estimated(snapshot, &BeforeTraceSizes::new(snapshot, Some(start)))
}

/// The frees of blocks from before the trace whose size `known` does not show.
fn count_estimated(snapshot: &Snapshot, known: &BeforeTraceSizes) -> u64 {
    let divisions = snapshot.config.roundup_power2_divisions;
    let mut pairing = Pairing::new();
    let mut estimated = 0;
    for (i, e) in snapshot.events.iter().enumerate() {
        if let Pair::Free(link) = pairing.push(i as u32, e) {
            if link.alloc.is_none() && link.ends_allocation && !known.shown(i as u32, e, divisions)
            {
                estimated += 1;
            }
        }
    }
    estimated
}

/// Whether PyTorch's allocator could hand a request rounded to `rounded` bytes a free block of
/// `size` bytes whole: it splits a small-pool block when 512 bytes or more would be left, and a
/// large-pool block when more than 1 MiB would be (`should_split`).
pub(crate) fn handed_unsplit(rounded: u64, size: u64) -> bool {
    use vramscope_model::pytorch::{MIN_BLOCK_SIZE, SMALL_SIZE};
    if size < rounded {
        return false;
    }
    let left = size - rounded;
    if rounded <= SMALL_SIZE {
        left < MIN_BLOCK_SIZE
    } else {
        left <= SMALL_SIZE
    }
}
