//! Memory state at one moment of a trace: segments (or the mapped runs of expandable ones) and
//! live blocks, rebuilt from events in either direction.
//!
//! A snapshot gives the segments and blocks at one moment, the end, plus the events that led
//! there. [`MemoryState`] applies an event forwards and undoes it backwards, so that
//! `super::Reconstruction` can walk from the dump-time state back to the start of the trace
//! once, and every view (the inspector's `ModelView`, the dashboard's time cursor, the replay's
//! starting state) can then walk forwards from there and see the same state at every event.
//!
//! Imported traces can be incomplete or inconsistent (a free without an allocation, an
//! allocation over a live block); every operation here tolerates that and keeps the totals
//! consistent with the blocks and segments it holds. Memory that a format says was allocated or
//! reserved before the trace, but whose blocks it does not describe, is the state's
//! [`MemoryState::unattributed`] figure, part of every total.

use std::collections::BTreeMap;
use std::sync::OnceLock;

use crate::AddrMap;

use vramscope_model::pytorch::{mapping_pool, segment_pool};
use vramscope_model::{Block, BlockState, Event, EventKind, Pool, ScopeId, Segment, SiteId, TagId};

/// Index value meaning "no event".
pub const NO_EVENT: u32 = u32::MAX;

/// A block that is allocated or waiting to be freed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LiveBlock {
    /// Block size in bytes.
    pub size: u64,
    /// Bytes the program asked for.
    pub requested: u64,
    /// Call site of the allocation (`None` when unknown, as for a block the trace only saw
    /// freed: a free's stack is not where the block came from).
    pub site: Option<SiteId>,
    /// Tag of the allocation.
    pub tag: Option<TagId>,
    /// Scope of the allocation.
    pub scope: Option<ScopeId>,
    /// Step number at allocation time.
    pub step: u64,
    /// Stream of the allocation.
    pub stream: u64,
    /// Freed by the program, waiting for other streams (`active_pending_free`).
    pub pending: bool,
    /// Index of the allocation event in the trace's events, or [`NO_EVENT`] for a block
    /// allocated before the trace began.
    pub alloc_event: u32,
}

impl LiveBlock {
    /// The model's block for this live block at `address`, of `size` bytes of which the
    /// program asked for `requested`: allocated, or pending free.
    pub fn to_block(&self, address: u64, size: u64, requested: u64) -> Block {
        Block {
            address,
            size,
            requested_size: requested,
            state: if self.pending {
                BlockState::ActivePendingFree
            } else {
                BlockState::ActiveAllocated
            },
            site: self.site,
            tag: self.tag,
            scope: self.scope,
            step: self.step,
            thread: 0,
        }
    }

    /// The block an allocation event made.
    pub fn from_alloc(e: &Event, alloc_event: u32, pending: bool) -> LiveBlock {
        LiveBlock {
            size: e.size,
            requested: e.requested,
            site: e.site(),
            tag: e.tag(),
            scope: e.scope(),
            step: u64::from(e.step),
            stream: e.stream,
            pending,
            alloc_event,
        }
    }

    /// The block that event `e` (at index `index`) describes: the one an allocation made, or
    /// one from before the trace that a free made known.
    fn described_by(e: &Event, index: u32, pending: bool) -> LiveBlock {
        if e.kind == EventKind::Alloc {
            LiveBlock::from_alloc(e, index, pending)
        } else {
            LiveBlock::before_trace(e, pending)
        }
    }

    /// A block allocated before the trace, known only from the free event `e`.
    fn before_trace(e: &Event, pending: bool) -> LiveBlock {
        LiveBlock {
            size: e.size,
            requested: e.requested,
            site: None,
            tag: None,
            scope: None,
            step: 0,
            stream: e.stream,
            pending,
            alloc_event: NO_EVENT,
        }
    }

    /// Whether the block was allocated before the trace began.
    pub fn predates_trace(&self) -> bool {
        self.alloc_event == NO_EVENT
    }
}

/// The live blocks of a [`MemoryState`] by address: a hash map (`crate::AddrMap`), since a
/// walk over a trace inserts or removes a block at nearly every event and an ordered map made
/// each of those a search of a tree. Order is asked for where it matters:
/// [`LiveBlocks::by_address`] and [`LiveBlocks::in_range`] go through the addresses sorted,
/// which are sorted once after the set of addresses last changed and kept until it changes
/// again (a walk never asks for them; a state that is drawn or summarized asks for them once).
/// A state drawn, then moved by a few events and drawn again (the dashboard's cursor) keeps
/// the old list and the addresses changed since, and merges them instead of sorting again.
/// [`LiveBlocks::unordered`] is for sums and tallies that do not depend on order.
#[derive(Default)]
pub struct LiveBlocks {
    map: AddrMap<LiveBlock>,
    /// The addresses of `map` with each block's size, sorted by address, once asked for;
    /// emptied whenever a block is added, replaced or removed (a block's size never changes
    /// in place).
    order: OnceLock<Vec<(u64, u64)>>,
    /// The last order computed and the addresses added, replaced or removed since, while they
    /// are few: what the next order is merged from.
    since_order: Option<Box<SinceOrder>>,
}

/// An earlier order of [`LiveBlocks`] and the addresses changed after it.
#[derive(Clone, Default)]
struct SinceOrder {
    base: Vec<(u64, u64)>,
    touched: Vec<u64>,
}

/// A copy of `map` in a table sized for the blocks it holds. The hash table's own copy keeps
/// the source's buckets, and a walk's state keeps the buckets of the most blocks it ever held:
/// the dashboard's checkpoints of a 10M-event replica of decomfl, taken on the walk back from
/// an end of 172,000 blocks, each cost that end's 19 MB table, 402 MB for 21 of them that held
/// far fewer blocks (issue 47). A table at least half full is copied as it is.
fn compact_copy(map: &AddrMap<LiveBlock>) -> AddrMap<LiveBlock> {
    if map.len() >= map.capacity() / 2 {
        return map.clone();
    }
    let mut copy = AddrMap::with_capacity_and_hasher(map.len(), Default::default());
    copy.extend(map.iter().map(|(&addr, block)| (addr, *block)));
    copy
}

impl Clone for LiveBlocks {
    /// The blocks and their current order; not the earlier order kept for a merge, which a
    /// copy (a checkpoint taken, a state cached to draw) would only carry as dead weight: a
    /// copy changed before it is drawn sorts once.
    fn clone(&self) -> LiveBlocks {
        LiveBlocks {
            map: compact_copy(&self.map),
            order: self.order.clone(),
            since_order: None,
        }
    }

    /// The same copy, made in the memory `self` already holds where it is large enough: a
    /// state of 172,000 blocks copied into fresh memory spent more time faulting its pages in
    /// than copying (the dashboard's jumps copy a checkpoint into the state at the cursor).
    fn clone_from(&mut self, source: &LiveBlocks) {
        self.map.clone_from(&source.map);
        let mut spare = self
            .order
            .take()
            .or_else(|| self.since_order.take().map(|since| since.base))
            .unwrap_or_default();
        self.since_order = None;
        if let Some(order) = source.order.get() {
            spare.clear();
            spare.extend_from_slice(order);
            let _ = self.order.set(spare);
        }
    }
}

/// Past this many blocks the address order is sorted by radix rather than by comparison.
const RADIX_FROM: usize = 1024;

/// Sorts `order` by address (addresses are distinct): for a large one a least significant
/// digit radix sort, a byte per pass, skipping the bytes every address shares (the high
/// bytes of a device's addresses and the low bytes of aligned ones). On 172,000 blocks it
/// took 2 ms where the comparison sort took 8 (issue 47).
fn sort_by_address(order: &mut Vec<(u64, u64)>) {
    if order.len() < RADIX_FROM {
        order.sort_unstable_by_key(|&(addr, _)| addr);
        return;
    }
    let mut counts = vec![[0usize; 256]; 8];
    for &(addr, _) in order.iter() {
        for (byte, count) in counts.iter_mut().enumerate() {
            count[((addr >> (8 * byte)) & 0xff) as usize] += 1;
        }
    }
    let n = order.len();
    let mut other = vec![(0u64, 0u64); n];
    for (byte, count) in counts.iter().enumerate() {
        if count.contains(&n) {
            continue;
        }
        let mut at = [0usize; 256];
        let mut sum = 0;
        for (slot, &c) in at.iter_mut().zip(count.iter()) {
            *slot = sum;
            sum += c;
        }
        for &entry in order.iter() {
            let digit = ((entry.0 >> (8 * byte)) & 0xff) as usize;
            other[at[digit]] = entry;
            at[digit] += 1;
        }
        std::mem::swap(order, &mut other);
    }
}

impl PartialEq for LiveBlocks {
    fn eq(&self, other: &LiveBlocks) -> bool {
        self.map == other.map
    }
}

impl Eq for LiveBlocks {}

impl std::fmt::Debug for LiveBlocks {
    /// The blocks in address order, so that two equal states print alike.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_map().entries(self.by_address()).finish()
    }
}

impl LiveBlocks {
    /// How many blocks there are.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// The block at `addr`.
    pub fn get(&self, addr: u64) -> Option<&LiveBlock> {
        self.map.get(&addr)
    }

    /// The block at `addr`, to change in place. Its size and whether it is pending must not
    /// change: the state's totals count them.
    pub fn get_mut(&mut self, addr: u64) -> Option<&mut LiveBlock> {
        self.map.get_mut(&addr)
    }

    /// Every block with its address, in no particular order (it differs from run to run):
    /// for sums and tallies only.
    pub fn unordered(&self) -> impl Iterator<Item = (&u64, &LiveBlock)> {
        self.map.iter()
    }

    /// Every block, in no particular order, to change in place; as for
    /// [`LiveBlocks::get_mut`], sizes and pending flags must not change.
    pub fn unordered_mut(&mut self) -> impl Iterator<Item = &mut LiveBlock> {
        self.map.values_mut()
    }

    /// Every block with its address, in address order.
    pub fn by_address(&self) -> impl Iterator<Item = (&u64, &LiveBlock)> {
        self.with_addresses(self.order())
    }

    /// The blocks at addresses in `[start, end)`, in address order: a search of the sorted
    /// addresses, then the blocks in the range.
    pub fn in_range(&self, start: u64, end: u64) -> impl Iterator<Item = (&u64, &LiveBlock)> {
        self.with_addresses(self.order_in(start, end))
    }

    /// The `(address, size)` of the blocks at addresses in `[start, end)`, in address order,
    /// read from the sorted addresses alone: no block is looked up, so a pass over every
    /// block of a large state (the segments' figures, a segment map) costs a scan of one array
    /// instead of a hash lookup per block.
    pub fn extents_in(&self, start: u64, end: u64) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.order_in(start, end).iter().copied()
    }

    /// The part of the sorted `(address, size)` list with addresses in `[start, end)`.
    fn order_in(&self, start: u64, end: u64) -> &[(u64, u64)] {
        let order = self.order();
        let from = order.partition_point(|&(a, _)| a < start);
        let to = order.partition_point(|&(a, _)| a < end).max(from);
        &order[from..to]
    }

    /// The addresses with their blocks' sizes, sorted (once after they last changed): merged
    /// from the last order and the addresses changed since when there is one, else sorted.
    fn order(&self) -> &[(u64, u64)] {
        self.order.get_or_init(|| match &self.since_order {
            Some(since) => self.merged(since),
            None => {
                let mut order: Vec<(u64, u64)> =
                    self.map.iter().map(|(&addr, b)| (addr, b.size)).collect();
                sort_by_address(&mut order);
                order
            }
        })
    }

    /// The order now, from `since`: the earlier order without the changed addresses, merged
    /// with the changed addresses that hold a block now.
    fn merged(&self, since: &SinceOrder) -> Vec<(u64, u64)> {
        let mut touched = since.touched.clone();
        touched.sort_unstable();
        touched.dedup();
        let current: Vec<(u64, u64)> = touched
            .iter()
            .filter_map(|addr| self.map.get(addr).map(|b| (*addr, b.size)))
            .collect();
        let mut out = Vec::with_capacity(self.map.len());
        let mut changed = touched.iter().peekable();
        let mut fresh = current.iter().peekable();
        for &(addr, size) in &since.base {
            while let Some(&&(a, _)) = fresh.peek() {
                if a >= addr {
                    break;
                }
                out.extend(fresh.next());
            }
            while changed.next_if(|&&a| a < addr).is_some() {}
            if changed.peek() == Some(&&addr) {
                continue;
            }
            out.push((addr, size));
        }
        out.extend(fresh);
        out
    }

    /// Notes that the block at `addr` is added, replaced or removed: the order is kept as the
    /// base of the next one, with `addr` among the changes, while the changes stay few.
    fn touch(&mut self, addr: u64) {
        if let Some(order) = self.order.take() {
            let since = self.since_order.get_or_insert_with(Box::default);
            since.base = order;
            since.touched.clear();
        }
        if let Some(since) = &mut self.since_order {
            since.touched.push(addr);
            // Past a quarter of the blocks a sort is as cheap as the merge, and the list of
            // changes stops growing.
            if since.touched.len() > since.base.len() / 4 + 64 {
                self.since_order = None;
            }
        }
    }

    /// Puts `block` at `addr`, or takes the block there out for `None`: a change recorded
    /// between two states, replayed as a whole (the dashboard's jumps). The state's totals
    /// are the caller's to set; the address order follows as for any other change.
    pub fn set(&mut self, addr: u64, block: Option<LiveBlock>) {
        match block {
            Some(block) => {
                self.insert(addr, block);
            }
            None => {
                self.remove(addr);
            }
        }
    }

    /// The blocks at the addresses of `order` (all of them in the map).
    fn with_addresses<'a>(
        &'a self,
        order: &'a [(u64, u64)],
    ) -> impl Iterator<Item = (&'a u64, &'a LiveBlock)> {
        order
            .iter()
            .filter_map(move |(addr, _)| self.map.get_key_value(addr))
    }

    fn insert(&mut self, addr: u64, block: LiveBlock) -> Option<LiveBlock> {
        // Always: a block replaced at its address may have another size.
        self.touch(addr);
        self.map.insert(addr, block)
    }

    fn remove(&mut self, addr: u64) -> Option<LiveBlock> {
        let removed = self.map.remove(&addr)?;
        self.touch(addr);
        Some(removed)
    }
}

/// One segment: a raw device allocation, or one mapped run of an expandable segment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SegmentInfo {
    /// Size in bytes.
    pub size: u64,
    /// Device ordinal.
    pub device: u32,
    /// Stream the segment serves.
    pub stream: u64,
    /// Pool of the segment.
    pub pool: Pool,
    /// Whether it is (a mapped run of) an expandable segment.
    pub expandable: bool,
}

/// Byte totals of a state.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    /// Bytes in allocated blocks (PyTorch's `allocated_bytes`: block sizes).
    pub allocated: u64,
    /// Bytes in segments (PyTorch's `reserved_bytes`).
    pub reserved: u64,
}

/// Segments and live blocks at one moment, with their totals.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct MemoryState {
    /// Segments (mapped runs) by address.
    pub segments: BTreeMap<u64, SegmentInfo>,
    /// Allocated and pending-free blocks by address.
    pub blocks: LiveBlocks,
    /// Bytes in allocated (not pending) blocks, the unattributed bytes included.
    pub allocated: u64,
    /// Bytes in allocated and pending blocks, the unattributed bytes included.
    pub active: u64,
    /// Bytes in segments, the unattributed bytes included.
    pub reserved: u64,
    /// Bytes requested in allocated blocks.
    pub requested: u64,
    /// Bytes allocated and reserved before the trace that no block or segment of the state
    /// describes (a format that records totals but not the dump-time state).
    pub unattributed: Usage,
}

impl Clone for MemoryState {
    fn clone(&self) -> MemoryState {
        MemoryState {
            segments: self.segments.clone(),
            blocks: self.blocks.clone(),
            allocated: self.allocated,
            active: self.active,
            reserved: self.reserved,
            requested: self.requested,
            unattributed: self.unattributed,
        }
    }

    /// The same copy, the blocks made in the memory `self` already holds
    /// (`LiveBlocks::clone_from`).
    fn clone_from(&mut self, source: &MemoryState) {
        self.segments.clone_from(&source.segments);
        self.blocks.clone_from(&source.blocks);
        self.allocated = source.allocated;
        self.active = source.active;
        self.reserved = source.reserved;
        self.requested = source.requested;
        self.unattributed = source.unattributed;
    }
}

impl MemoryState {
    /// The state a snapshot's segments describe (its end state).
    pub fn from_segments(segments: &[Segment]) -> MemoryState {
        let mut state = MemoryState::default();
        for s in segments {
            state.add_segment(
                s.address,
                SegmentInfo {
                    size: s.total_size,
                    device: s.device,
                    stream: s.stream,
                    pool: s.pool,
                    expandable: s.expandable,
                },
            );
            for b in &s.blocks {
                if b.state == BlockState::Inactive {
                    continue;
                }
                state.insert_block(
                    b.address,
                    LiveBlock {
                        size: b.size,
                        requested: b.requested_size,
                        site: b.site,
                        tag: b.tag,
                        scope: b.scope,
                        step: b.step,
                        stream: s.stream,
                        pending: b.state == BlockState::ActivePendingFree,
                        alloc_event: NO_EVENT,
                    },
                );
            }
        }
        state
    }

    /// Allocated and reserved bytes.
    pub fn usage(&self) -> Usage {
        Usage {
            allocated: self.allocated,
            reserved: self.reserved,
        }
    }

    /// Adds memory from before the trace that no block or segment describes.
    pub fn add_unattributed(&mut self, usage: Usage) {
        self.unattributed.allocated = self.unattributed.allocated.saturating_add(usage.allocated);
        self.unattributed.reserved = self.unattributed.reserved.saturating_add(usage.reserved);
        self.allocated = self.allocated.saturating_add(usage.allocated);
        self.active = self.active.saturating_add(usage.allocated);
        self.reserved = self.reserved.saturating_add(usage.reserved);
    }

    /// Puts `block` at `addr`, replacing the block there, if any, in one search of the map.
    fn insert_block(&mut self, addr: u64, block: LiveBlock) -> Option<LiveBlock> {
        let (size, requested, pending) = (block.size, block.requested, block.pending);
        let replaced = self.blocks.insert(addr, block);
        if let Some(replaced) = &replaced {
            self.uncount_block(replaced);
        }
        self.active = self.active.saturating_add(size);
        if !pending {
            self.allocated = self.allocated.saturating_add(size);
            self.requested = self.requested.saturating_add(requested);
        }
        replaced
    }

    fn remove_block(&mut self, addr: u64) -> Option<LiveBlock> {
        let block = self.blocks.remove(addr)?;
        self.uncount_block(&block);
        Some(block)
    }

    /// Takes the bytes of `block`, which has left the map, out of the totals.
    fn uncount_block(&mut self, block: &LiveBlock) {
        self.active = self.active.saturating_sub(block.size);
        if !block.pending {
            self.allocated = self.allocated.saturating_sub(block.size);
            self.requested = self.requested.saturating_sub(block.requested);
        }
    }

    /// Marks the block at `addr` pending (or not); whether it was pending before, or `None`
    /// when there is no block there.
    fn set_pending(&mut self, addr: u64, pending: bool) -> Option<bool> {
        let block = self.blocks.get_mut(addr)?;
        let was = block.pending;
        if was != pending {
            block.pending = pending;
            if pending {
                self.allocated = self.allocated.saturating_sub(block.size);
                self.requested = self.requested.saturating_sub(block.requested);
            } else {
                self.allocated = self.allocated.saturating_add(block.size);
                self.requested = self.requested.saturating_add(block.requested);
            }
        }
        Some(was)
    }

    fn add_segment(&mut self, addr: u64, info: SegmentInfo) {
        self.remove_segment(addr);
        self.reserved = self.reserved.saturating_add(info.size);
        self.segments.insert(addr, info);
    }

    fn remove_segment(&mut self, addr: u64) -> Option<SegmentInfo> {
        let info = self.segments.remove(&addr)?;
        self.reserved = self.reserved.saturating_sub(info.size);
        Some(info)
    }

    /// The plain segment a `SegmentAlloc` or `SegmentFree` event describes.
    fn plain_segment(e: &Event) -> SegmentInfo {
        SegmentInfo {
            size: e.size,
            device: u32::from(e.device),
            stream: e.stream,
            pool: segment_pool(e.size),
            expandable: false,
        }
    }

    /// Maps `[addr, addr + size)`: the range joins the runs that end where it begins and begin
    /// where it ends, and takes their pool; alone, the nearest run of the same stream (in the
    /// same segment's address space, most likely) says the pool, and with none a multiple of
    /// the large pool's 20 MiB pages is taken for the large pool.
    fn map(&mut self, e: &Event) {
        let (addr, size, stream) = (e.addr, e.size, e.stream);
        let end = addr.saturating_add(size);
        let left = self
            .segments
            .range(..addr)
            .next_back()
            .filter(|(&base, s)| base.saturating_add(s.size) == addr)
            .map(|(&base, &s)| (base, s));
        let right = self.segments.get(&end).map(|&s| (end, s));
        let nearest = || {
            let below = self
                .segments
                .range(..addr)
                .rev()
                .find(|(_, s)| s.stream == stream)
                .map(|(&base, s)| (addr - base.saturating_add(s.size).min(addr), s.pool));
            let above = self
                .segments
                .range(end..)
                .find(|(_, s)| s.stream == stream)
                .map(|(&base, s)| (base - end, s.pool));
            match (below, above) {
                (Some(b), Some(a)) => Some(if b.0 <= a.0 { b.1 } else { a.1 }),
                (b, a) => b.or(a).map(|(_, pool)| pool),
            }
        };
        let pool = left
            .or(right)
            .map(|(_, s)| s.pool)
            .or_else(nearest)
            .unwrap_or_else(|| mapping_pool(size));
        let mut start = addr;
        let mut stop = end;
        if let Some((base, _)) = left {
            self.remove_segment(base);
            start = base;
        }
        if let Some((base, s)) = right {
            self.remove_segment(base);
            stop = base.saturating_add(s.size);
        }
        self.add_segment(
            start,
            SegmentInfo {
                size: stop - start,
                device: u32::from(e.device),
                stream,
                pool,
                expandable: true,
            },
        );
    }

    /// Unmaps `[addr, addr + size)`: the run holding it loses that range, at an end or, where
    /// the unmap opens a hole, in the middle.
    fn unmap(&mut self, e: &Event) {
        let Some((&base, &run)) = self.segments.range(..=e.addr).next_back() else {
            return;
        };
        let end = base.saturating_add(run.size);
        if e.addr >= end {
            return;
        }
        let unmap_end = e.addr.saturating_add(e.size).min(end);
        self.remove_segment(base);
        if e.addr > base {
            self.add_segment(
                base,
                SegmentInfo {
                    size: e.addr - base,
                    ..run
                },
            );
        }
        if unmap_end < end {
            self.add_segment(
                unmap_end,
                SegmentInfo {
                    size: end - unmap_end,
                    ..run
                },
            );
        }
    }

    /// Applies event `e` (at index `index` of the trace) going forwards.
    pub fn apply(&mut self, e: &Event, index: u32) {
        match e.kind {
            EventKind::Alloc => {
                self.insert_block(e.addr, LiveBlock::from_alloc(e, index, false));
            }
            EventKind::FreeRequested => {
                self.set_pending(e.addr, true);
            }
            EventKind::FreeCompleted => {
                self.remove_block(e.addr);
            }
            EventKind::SegmentAlloc => {
                self.add_segment(e.addr, MemoryState::plain_segment(e));
            }
            EventKind::SegmentFree => {
                self.remove_segment(e.addr);
            }
            EventKind::SegmentMap => self.map(e),
            EventKind::SegmentUnmap => self.unmap(e),
            EventKind::EmptyCache
            | EventKind::Oom
            | EventKind::Transfer(_)
            | EventKind::Sync
            | EventKind::Step
            | EventKind::Snapshot => {}
        }
    }

    /// Undoes event `e` going backwards. `alloc` is the allocation event that a free releases,
    /// with its index, when the trace has it; `pending_before` says whether the block was
    /// pending just before a `FreeCompleted` (the trace also has the free request). For an
    /// `Alloc` that replaced a block the trace had not freed, `alloc` is that block's
    /// allocation (or, for a block from before the trace, its free request) and
    /// `pending_before` whether it was pending: undoing brings it back, as applying forwards
    /// replaced it.
    pub fn undo(&mut self, e: &Event, alloc: Option<(&Event, u32)>, pending_before: bool) {
        self.undo_checked(e, NO_EVENT, alloc, pending_before);
    }

    /// [`MemoryState::undo`] of event `e` at index `index`, saying whether the state before
    /// it was exactly the one applying `e` leaves ([`MemoryState::apply`]): then applying
    /// `e` to the result gives that state back, and a walk forwards through the event agrees
    /// with the walk back. `false` where the trace contradicts itself there (a block freed
    /// twice, a free request repeated, an allocation whose block is not the one the trace
    /// ends with) and, to be safe, for every map and unmap, whose runs a walk forwards joins
    /// differently.
    pub fn undo_checked(
        &mut self,
        e: &Event,
        index: u32,
        alloc: Option<(&Event, u32)>,
        pending_before: bool,
    ) -> bool {
        let recreate = |pending: bool| match alloc {
            Some((a, i)) => LiveBlock::described_by(a, i, pending),
            None => LiveBlock::before_trace(e, pending),
        };
        match e.kind {
            // The block the allocation replaced comes back in its place; else the address
            // is empty again.
            EventKind::Alloc => {
                let found = match alloc {
                    Some(_) => self.insert_block(e.addr, recreate(pending_before)),
                    None => self.remove_block(e.addr),
                };
                found == Some(LiveBlock::from_alloc(e, index, false))
            }
            EventKind::FreeRequested => {
                let was_pending = self.set_pending(e.addr, false);
                if was_pending.is_none() {
                    self.insert_block(e.addr, recreate(false));
                }
                was_pending == Some(true)
            }
            EventKind::FreeCompleted => self
                .insert_block(e.addr, recreate(pending_before))
                .is_none(),
            EventKind::SegmentAlloc => {
                self.remove_segment(e.addr) == Some(MemoryState::plain_segment(e))
            }
            EventKind::SegmentFree => {
                let had = self.segments.contains_key(&e.addr);
                self.add_segment(e.addr, MemoryState::plain_segment(e));
                !had
            }
            EventKind::SegmentMap => {
                self.unmap(e);
                false
            }
            EventKind::SegmentUnmap => {
                self.map(e);
                false
            }
            EventKind::EmptyCache
            | EventKind::Oom
            | EventKind::Transfer(_)
            | EventKind::Sync
            | EventKind::Step
            | EventKind::Snapshot => true,
        }
    }

    /// The live blocks inside the segment at `addr` of `size` bytes, in address order.
    pub fn blocks_in(&self, addr: u64, size: u64) -> impl Iterator<Item = (&u64, &LiveBlock)> {
        self.blocks.in_range(addr, addr.saturating_add(size))
    }

    /// The `(address, size)` of the live blocks inside the segment at `addr` of `size` bytes,
    /// in address order, without looking any block up ([`LiveBlocks::extents_in`]).
    pub fn block_extents_in(&self, addr: u64, size: u64) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.blocks.extents_in(addr, addr.saturating_add(size))
    }

    /// Live blocks that lie in no known segment (traces without segment data), the
    /// unattributed bytes included.
    pub fn orphan_bytes(&self) -> u64 {
        let mut in_segments = 0u64;
        for (&a, s) in &self.segments {
            let inside = self
                .block_extents_in(a, s.size)
                .fold(0u64, |sum, (_, size)| sum.saturating_add(size));
            in_segments = in_segments.saturating_add(inside);
        }
        self.active.saturating_sub(in_segments)
    }

    /// The state as the model's segments, free space filled with inactive blocks.
    pub fn to_segments(&self) -> Vec<Segment> {
        let mut out = Vec::with_capacity(self.segments.len());
        for (&addr, s) in &self.segments {
            let mut blocks = Vec::new();
            let mut cursor = addr;
            let end = addr.saturating_add(s.size);
            for (&a, b) in self.blocks_in(addr, s.size) {
                if a < cursor {
                    // Overlaps the block before (an inconsistent trace): shown once.
                    continue;
                }
                if a > cursor {
                    blocks.push(free_block(cursor, a - cursor));
                }
                let size = b.size.min(end - a);
                blocks.push(b.to_block(a, size, b.requested));
                cursor = a + size;
            }
            if cursor < end {
                blocks.push(free_block(cursor, end - cursor));
            }
            out.push(Segment {
                device: s.device,
                address: addr,
                total_size: s.size,
                stream: s.stream,
                pool: s.pool,
                expandable: s.expandable,
                blocks,
            });
        }
        out
    }
}

fn free_block(address: u64, size: u64) -> Block {
    Block {
        address,
        size,
        requested_size: 0,
        state: BlockState::Inactive,
        site: None,
        tag: None,
        scope: None,
        step: 0,
        thread: 0,
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use vramscope_model::Id;

    /// An event of `kind` at `addr` of `size` bytes (requested as much), at call site 1.
    pub(crate) fn ev(kind: EventKind, addr: u64, size: u64) -> Event {
        Event {
            seq: 0,
            time_ns: 0,
            kind,
            device: 0,
            stream: 0,
            addr,
            size,
            requested: size,
            site: Id::new(1),
            tag: None,
            scope: None,
            step: 0,
            thread: 0,
            device_free: 0,
        }
    }

    /// The blocks in address order and in a range, and their extents, asked for between
    /// changes of every kind (a new address, a block replaced at its address, one removed, one
    /// made pending), are those of an ordered map that went through the same changes.
    #[test]
    fn blocks_by_address_follow_every_change() {
        let mut blocks = LiveBlocks::default();
        let mut model: BTreeMap<u64, LiveBlock> = BTreeMap::new();
        let block = |size: u64| LiveBlock::described_by(&ev(EventKind::Alloc, 0, size), 0, false);
        let mut x = 0x2545_f491_4f6c_dd1du64;
        for step in 0..4000u64 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let addr = (x % 97) << 9;
            match x % 5 {
                0 | 1 => {
                    assert_eq!(
                        blocks.insert(addr, block(step)),
                        model.insert(addr, block(step))
                    );
                }
                2 | 3 => assert_eq!(blocks.remove(addr), model.remove(&addr)),
                _ => {
                    if let (Some(b), Some(m)) = (blocks.get_mut(addr), model.get_mut(&addr)) {
                        b.step = step;
                        m.step = step;
                    }
                }
            }
            // Asked for now and then, so that the sorted addresses are kept across changes and
            // merged with them: often at first (few changes between asks), then rarely (more
            // changes than the merge keeps, so the order is sorted afresh).
            let every = if step < 2000 { 3 } else { 150 };
            if step % every == 0 {
                let ours: Vec<(u64, LiveBlock)> =
                    blocks.by_address().map(|(&a, &b)| (a, b)).collect();
                let theirs: Vec<(u64, LiveBlock)> = model.iter().map(|(&a, &b)| (a, b)).collect();
                assert_eq!(ours, theirs, "step {step}");
                let (from, to) = (((x >> 8) % 60) << 9, ((x >> 16) % 60) << 9);
                let ours: Vec<u64> = blocks.in_range(from, to).map(|(&a, _)| a).collect();
                let theirs: Vec<u64> = model.range(from..to.max(from)).map(|(&a, _)| a).collect();
                assert_eq!(ours, theirs, "step {step}: [{from:#x}, {to:#x})");
                // The sizes read from the sorted list alone follow a block replaced at its
                // address by one of another size.
                let ours: Vec<(u64, u64)> = blocks.extents_in(from, to).collect();
                let theirs: Vec<(u64, u64)> = model
                    .range(from..to.max(from))
                    .map(|(&a, b)| (a, b.size))
                    .collect();
                assert_eq!(ours, theirs, "step {step}: extents in [{from:#x}, {to:#x})");
            }
            assert_eq!(blocks.len(), model.len());
        }
    }

    /// The radix sort of the address order agrees with a comparison sort, on addresses that
    /// share their high and low bytes (as a device's aligned addresses do) and on any.
    #[test]
    fn the_radix_sort_orders_as_a_comparison_sort_does() {
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for (len, mask, base) in [
            (RADIX_FROM, u64::MAX, 0),
            (5000, 0xff_ffff << 9, 0x7f00_0000_0000),
            (3000, 0xffff_ffff, 0),
        ] {
            let mut seen = std::collections::HashSet::new();
            let mut order = Vec::new();
            while order.len() < len {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let addr = base | (x & mask);
                if seen.insert(addr) {
                    order.push((addr, x >> 40));
                }
            }
            let mut expect = order.clone();
            expect.sort_unstable_by_key(|&(a, _)| a);
            sort_by_address(&mut order);
            assert_eq!(order, expect, "{len} addresses under {mask:#x}");
        }
    }

    /// A state copied into another, larger or smaller, in turn, is the state copied, its
    /// blocks in the same address order.
    #[test]
    fn a_copy_into_a_state_of_any_size_is_the_state() {
        let sized = |n: u64| {
            let mut state = MemoryState::default();
            for i in 0..n {
                state.apply(
                    &ev(EventKind::Alloc, 0x10_0000 + (i * 7919 % n) * 512, 512),
                    0,
                );
            }
            state
        };
        let states = [sized(3000), sized(10), sized(500), sized(3000), sized(0)];
        let mut copy = MemoryState::default();
        for (i, state) in states.iter().enumerate() {
            if i % 2 == 0 {
                // Sorted already, so that the copy takes its order too.
                let _ = state.blocks.by_address().count();
            }
            copy.clone_from(state);
            assert_eq!(&copy, state, "copy {i}");
            let ours: Vec<u64> = copy.blocks.by_address().map(|(&a, _)| a).collect();
            let theirs: Vec<u64> = state.blocks.by_address().map(|(&a, _)| a).collect();
            assert_eq!(ours, theirs, "copy {i}");
            copy.apply(&ev(EventKind::Alloc, 0x1000, 64), 1);
            assert_eq!(
                copy.blocks.by_address().next().map(|(&a, _)| a),
                Some(0x1000)
            );
        }
    }

    #[test]
    fn forwards_then_backwards_returns_to_the_start() {
        let events = [
            ev(EventKind::SegmentAlloc, 0x1000, 4096),
            ev(EventKind::Alloc, 0x1000, 1024),
            ev(EventKind::Alloc, 0x1400, 512),
            ev(EventKind::FreeRequested, 0x1000, 1024),
            ev(EventKind::FreeCompleted, 0x1000, 1024),
            ev(EventKind::SegmentMap, 0x9000, 2048),
            ev(EventKind::SegmentMap, 0x9800, 2048),
            ev(EventKind::SegmentUnmap, 0x9800, 2048),
        ];
        let mut state = MemoryState::default();
        let mut seen = vec![state.clone()];
        for (i, e) in events.iter().enumerate() {
            state.apply(e, i as u32);
            seen.push(state.clone());
        }
        assert_eq!(state.allocated, 512);
        assert_eq!(state.reserved, 4096 + 2048);
        for i in (0..events.len()).rev() {
            let alloc = (events[i].kind == EventKind::FreeCompleted
                || events[i].kind == EventKind::FreeRequested)
                .then(|| (&events[1], 1));
            state.undo(&events[i], alloc, true);
            assert_eq!(state, seen[i], "after undoing event {i}");
        }
    }

    #[test]
    fn segments_round_trip_through_the_model() {
        let mut state = MemoryState::default();
        state.apply(&ev(EventKind::SegmentAlloc, 0, 8192), 0);
        state.apply(&ev(EventKind::Alloc, 1024, 1024), 1);
        state.apply(&ev(EventKind::Alloc, 4096, 512), 2);
        state.apply(&ev(EventKind::FreeRequested, 4096, 512), 3);
        let segments = state.to_segments();
        assert_eq!(segments.len(), 1);
        let states: Vec<BlockState> = segments[0].blocks.iter().map(|b| b.state).collect();
        assert_eq!(
            states,
            [
                BlockState::Inactive,
                BlockState::ActiveAllocated,
                BlockState::Inactive,
                BlockState::ActivePendingFree,
                BlockState::Inactive
            ]
        );
        let mut back = MemoryState::from_segments(&segments);
        for b in back.blocks.unordered_mut() {
            b.alloc_event = NO_EVENT;
        }
        let mut expect = state.clone();
        for b in expect.blocks.unordered_mut() {
            b.alloc_event = NO_EVENT;
        }
        assert_eq!(back, expect);
    }

    #[test]
    fn inconsistent_traces_never_underflow() {
        let mut state = MemoryState::default();
        state.apply(&ev(EventKind::FreeCompleted, 5, 100), 0);
        state.apply(&ev(EventKind::FreeRequested, 5, 100), 1);
        state.apply(&ev(EventKind::SegmentFree, 5, 100), 2);
        state.apply(&ev(EventKind::SegmentUnmap, 5, 100), 3);
        state.undo(&ev(EventKind::Alloc, 5, 100), None, false);
        assert_eq!(state, MemoryState::default());
        state.apply(&ev(EventKind::Alloc, 5, 100), 0);
        state.apply(&ev(EventKind::Alloc, 5, 200), 1);
        assert_eq!(state.allocated, 200);
    }

    const MIB: u64 = 1 << 20;

    fn mapped(kind: EventKind, addr: u64, size: u64, stream: u64) -> Event {
        Event {
            stream,
            ..ev(kind, addr, size)
        }
    }

    fn runs(state: &MemoryState) -> Vec<(u64, u64, Pool)> {
        state
            .segments
            .iter()
            .map(|(&a, s)| (a, s.size, s.pool))
            .collect()
    }

    fn run(size: u64, pool: Pool) -> SegmentInfo {
        SegmentInfo {
            size,
            device: 0,
            stream: 7,
            pool,
            expandable: true,
        }
    }

    #[test]
    fn undoing_a_map_that_filled_a_hole_splits_the_run() {
        let mut state = MemoryState::default();
        state.add_segment(0, run(60 * MIB, Pool::Large));
        state.undo(
            &mapped(EventKind::SegmentMap, 20 * MIB, 20 * MIB, 7),
            None,
            false,
        );
        assert_eq!(
            runs(&state),
            [
                (0, 20 * MIB, Pool::Large),
                (40 * MIB, 20 * MIB, Pool::Large)
            ]
        );
        assert_eq!(state.reserved, 40 * MIB);
        let mut state = MemoryState::default();
        state.add_segment(0, run(40 * MIB, Pool::Large));
        state.undo(
            &mapped(EventKind::SegmentMap, 20 * MIB, 20 * MIB, 7),
            None,
            false,
        );
        state.undo(&mapped(EventKind::SegmentMap, 0, 20 * MIB, 7), None, false);
        assert!(
            state.segments.is_empty(),
            "mapped from nothing: no run at the start"
        );
        assert_eq!(state.reserved, 0);
    }

    #[test]
    fn undoing_an_unmap_joins_the_runs_on_both_sides() {
        let mut state = MemoryState::default();
        state.add_segment(0, run(20 * MIB, Pool::Small));
        state.add_segment(24 * MIB, run(4 * MIB, Pool::Small));
        state.undo(
            &mapped(EventKind::SegmentUnmap, 20 * MIB, 4 * MIB, 7),
            None,
            false,
        );
        assert_eq!(runs(&state), [(0, 28 * MIB, Pool::Small)]);
        // Alone, the size says the pool: 2 MiB pages are the small pool's.
        let mut state = MemoryState::default();
        state.undo(
            &mapped(EventKind::SegmentUnmap, 100 * MIB, 4 * MIB, 7),
            None,
            false,
        );
        state.undo(
            &mapped(EventKind::SegmentUnmap, 200 * MIB, 40 * MIB, 8),
            None,
            false,
        );
        let pools: Vec<Pool> = state.segments.values().map(|s| s.pool).collect();
        assert_eq!(pools, [Pool::Small, Pool::Large]);
        // Near a run of the same stream, that run's pool: ten small-pool pages are 20 MiB.
        let mut state = MemoryState::default();
        state.add_segment(100 * MIB, run(4 * MIB, Pool::Small));
        state.undo(
            &mapped(EventKind::SegmentUnmap, 110 * MIB, 20 * MIB, 7),
            None,
            false,
        );
        assert_eq!(state.segments[&(110 * MIB)].pool, Pool::Small);
    }
}
