//! Memory state at any moment of a trace: segments and live blocks rebuilt from events.
//!
//! A snapshot (`vramscope_allocator::Snapshot`) gives the segments and blocks at one moment, the
//! end, plus the events that led there. The dashboard's time cursor needs the state after any
//! event, so [`MemoryState`] can apply an event forwards and undo it backwards. `crate::data`
//! starts from the end state, undoes every event once to find the state before the first one
//! (keeping checkpoints on the way), and from then on rebuilds the state at a cursor by applying
//! events forwards from the nearest checkpoint. Live sources append events and apply them to the
//! head state as they arrive.
//!
//! Imported traces can be incomplete or inconsistent (a free without an allocation, an
//! allocation over a live block); every operation here tolerates that and keeps the totals
//! consistent with the blocks and segments it holds.

use std::collections::BTreeMap;

use vramscope_allocator::{
    Block, BlockState, Event, EventKind, Pool, ScopeId, Segment, SiteId, TagId,
};

/// Index value meaning "no event".
pub const NO_EVENT: u32 = u32::MAX;

/// Segments up to this size are shown as small-pool segments when a trace does not say.
const SMALL_SEGMENT: u64 = 2 << 20;

/// A block that is allocated or waiting to be freed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LiveBlock {
    /// Block size in bytes.
    pub size: u64,
    /// Bytes the program asked for.
    pub requested: u64,
    /// Call site of the allocation.
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
    /// Index of the allocation event in the dataset's events, or [`NO_EVENT`].
    pub alloc_event: u32,
}

impl LiveBlock {
    fn from_event(e: &Event, alloc_event: u32, pending: bool) -> LiveBlock {
        LiveBlock {
            size: e.size,
            requested: e.requested,
            site: e.site,
            tag: e.tag,
            scope: e.scope,
            step: e.step,
            stream: e.stream,
            pending,
            alloc_event,
        }
    }
}

/// One segment: a raw device allocation (or the mapped part of an expandable one).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SegmentInfo {
    /// Size in bytes.
    pub size: u64,
    /// Stream the segment serves.
    pub stream: u64,
    /// Pool of the segment.
    pub pool: Pool,
    /// Whether it is an expandable segment.
    pub expandable: bool,
}

/// Byte totals of a state.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    /// Bytes in allocated blocks.
    pub allocated: u64,
    /// Bytes in segments.
    pub reserved: u64,
}

/// Segments and live blocks at one moment, with their totals.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MemoryState {
    /// Segments by address.
    pub segments: BTreeMap<u64, SegmentInfo>,
    /// Allocated and pending-free blocks by address.
    pub blocks: BTreeMap<u64, LiveBlock>,
    /// Bytes in allocated (not pending) blocks.
    pub allocated: u64,
    /// Bytes in allocated and pending blocks.
    pub active: u64,
    /// Bytes in segments.
    pub reserved: u64,
    /// Bytes requested in allocated blocks.
    pub requested: u64,
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

    fn insert_block(&mut self, addr: u64, block: LiveBlock) {
        self.remove_block(addr);
        self.active += block.size;
        if !block.pending {
            self.allocated += block.size;
            self.requested += block.requested;
        }
        self.blocks.insert(addr, block);
    }

    fn remove_block(&mut self, addr: u64) -> Option<LiveBlock> {
        let block = self.blocks.remove(&addr)?;
        self.active = self.active.saturating_sub(block.size);
        if !block.pending {
            self.allocated = self.allocated.saturating_sub(block.size);
            self.requested = self.requested.saturating_sub(block.requested);
        }
        Some(block)
    }

    fn set_pending(&mut self, addr: u64, pending: bool) -> bool {
        let Some(block) = self.blocks.get_mut(&addr) else {
            return false;
        };
        if block.pending != pending {
            block.pending = pending;
            if pending {
                self.allocated = self.allocated.saturating_sub(block.size);
                self.requested = self.requested.saturating_sub(block.requested);
            } else {
                self.allocated += block.size;
                self.requested += block.requested;
            }
        }
        true
    }

    fn add_segment(&mut self, addr: u64, info: SegmentInfo) {
        self.remove_segment(addr);
        self.reserved += info.size;
        self.segments.insert(addr, info);
    }

    fn remove_segment(&mut self, addr: u64) -> Option<SegmentInfo> {
        let info = self.segments.remove(&addr)?;
        self.reserved = self.reserved.saturating_sub(info.size);
        Some(info)
    }

    fn new_segment(e: &Event, expandable: bool) -> SegmentInfo {
        SegmentInfo {
            size: e.size,
            stream: e.stream,
            pool: if e.size <= SMALL_SEGMENT && !expandable {
                Pool::Small
            } else {
                Pool::Large
            },
            expandable,
        }
    }

    /// Maps `size` bytes at `addr`: extends the segment that ends there, or starts a new one.
    fn map(&mut self, e: &Event) {
        let before = self
            .segments
            .range(..e.addr)
            .next_back()
            .map(|(&a, s)| (a, *s));
        if let Some((a, mut s)) = before {
            if a + s.size == e.addr {
                s.size += e.size;
                self.add_segment(a, s);
                return;
            }
        }
        self.add_segment(e.addr, MemoryState::new_segment(e, true));
    }

    /// Unmaps `size` bytes at `addr`: shrinks or removes the segment that holds them.
    fn unmap(&mut self, e: &Event) {
        let found = self
            .segments
            .range(..=e.addr)
            .next_back()
            .map(|(&a, s)| (a, *s));
        let Some((a, mut s)) = found else { return };
        if e.addr >= a + s.size {
            return;
        }
        if e.addr == a && e.size >= s.size {
            self.remove_segment(a);
        } else if e.addr + e.size >= a + s.size {
            s.size = e.addr - a;
            self.add_segment(a, s);
        }
    }

    /// Applies event `e` (at index `index` of the dataset) going forwards.
    pub fn apply(&mut self, e: &Event, index: u32) {
        match e.kind {
            EventKind::Alloc => self.insert_block(e.addr, LiveBlock::from_event(e, index, false)),
            EventKind::FreeRequested => {
                self.set_pending(e.addr, true);
            }
            EventKind::FreeCompleted => {
                self.remove_block(e.addr);
            }
            EventKind::SegmentAlloc => {
                self.add_segment(e.addr, MemoryState::new_segment(e, false));
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
    /// pending just before a `FreeCompleted` (the trace also has the free request).
    pub fn undo(&mut self, e: &Event, alloc: Option<(&Event, u32)>, pending_before: bool) {
        let recreate = |pending: bool| match alloc {
            Some((a, i)) => LiveBlock::from_event(a, i, pending),
            None => LiveBlock::from_event(e, NO_EVENT, pending),
        };
        match e.kind {
            EventKind::Alloc => {
                self.remove_block(e.addr);
            }
            EventKind::FreeRequested => {
                if !self.set_pending(e.addr, false) {
                    self.insert_block(e.addr, recreate(false));
                }
            }
            EventKind::FreeCompleted => {
                self.insert_block(e.addr, recreate(pending_before));
            }
            EventKind::SegmentAlloc => {
                self.remove_segment(e.addr);
            }
            EventKind::SegmentFree => {
                self.add_segment(e.addr, MemoryState::new_segment(e, false));
            }
            EventKind::SegmentMap => self.unmap(e),
            EventKind::SegmentUnmap => self.map(e),
            EventKind::EmptyCache
            | EventKind::Oom
            | EventKind::Transfer(_)
            | EventKind::Sync
            | EventKind::Step
            | EventKind::Snapshot => {}
        }
    }

    /// The live blocks inside the segment at `addr` of `size` bytes, in address order.
    pub fn blocks_in(&self, addr: u64, size: u64) -> impl Iterator<Item = (&u64, &LiveBlock)> {
        self.blocks.range(addr..addr.saturating_add(size))
    }

    /// Live blocks that lie in no known segment (traces without segment data).
    pub fn orphan_bytes(&self) -> u64 {
        let mut in_segments = 0;
        for (&a, s) in &self.segments {
            in_segments += self.blocks_in(a, s.size).map(|(_, b)| b.size).sum::<u64>();
        }
        self.active.saturating_sub(in_segments)
    }

    /// The state as the model's segments, free space filled with inactive blocks.
    pub fn to_segments(&self, device: u32) -> Vec<Segment> {
        let mut out = Vec::with_capacity(self.segments.len());
        for (&addr, s) in &self.segments {
            let mut blocks = Vec::new();
            let mut cursor = addr;
            let end = addr + s.size;
            for (&a, b) in self.blocks_in(addr, s.size) {
                if a > cursor {
                    blocks.push(free_block(cursor, a - cursor));
                }
                let size = b.size.min(end - a);
                blocks.push(Block {
                    address: a,
                    size,
                    requested_size: b.requested,
                    state: if b.pending {
                        BlockState::ActivePendingFree
                    } else {
                        BlockState::ActiveAllocated
                    },
                    site: b.site,
                    tag: b.tag,
                    scope: b.scope,
                    step: b.step,
                    thread: 0,
                });
                cursor = a + size;
            }
            if cursor < end {
                blocks.push(free_block(cursor, end - cursor));
            }
            out.push(Segment {
                device,
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
mod tests {
    use super::*;

    fn ev(kind: EventKind, addr: u64, size: u64) -> Event {
        Event {
            seq: 0,
            time_ns: 0,
            kind,
            device: 0,
            stream: 0,
            addr,
            size,
            requested: size,
            site: Some(1),
            tag: None,
            scope: None,
            step: 0,
            thread: 0,
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
        let segments = state.to_segments(0);
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
        for b in back.blocks.values_mut() {
            b.alloc_event = NO_EVENT;
        }
        let mut expect = state.clone();
        for b in expect.blocks.values_mut() {
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
}
