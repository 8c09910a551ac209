//! Expandable segments (`expandable_segments:True`): one reserved address range per (stream,
//! pool) that grows by mapping pages at its end or into the holes that releases left, and
//! shrinks by unmapping the whole free pages of its free blocks.
//!
//! PyTorch's `try_allocate_expandable_block`, `map_block` and `release_blocks`, as methods of the
//! policy's [`Books`] (`super::policy`), which call them when a request needs new memory
//! (`grow_expandable`) and when the cache is released (`unmap_block`, `release_if_unmapped`, from
//! `super::release`); the searches and linking of unmapped blocks inside a segment are methods
//! of [`State`] (`super::state`), whose `UNMAPPED` blocks mark the holes.

use super::policy::{Books, Found, LARGE_BUFFER, SMALL_BUFFER};
use super::state::{BlockMeta, RawEventParts, SegmentMeta, State, UNMAPPED};
use super::Shared;
use crate::backend::{Backend, StreamId};
use crate::config::Policy;
use crate::debug;
use crate::model::{EventKind, Pool};
use crate::provenance::NIL;

impl<B: Backend> Books<'_, B> {
    /// PyTorch's `try_allocate_expandable_block`: room for `rounded` bytes in the (stream,
    /// pool) expandable segment, mapping pages where it is unmapped. The room starts at the
    /// lowest unmapped range (a hole a release left, else the unmapped rest at the segment's
    /// end), or at the free block just before it, and runs on over free and unmapped ranges;
    /// the unmapped parts of it are mapped, in pages, and merge with the free blocks around.
    pub(super) fn grow_expandable(
        &mut self,
        pool: Pool,
        stream: StreamId,
        rounded: u64,
    ) -> Option<Found> {
        let page = self.shared.expandable_page(pool);
        let (segment, mut candidate) = self.expandable_room_for(pool, stream, rounded, page)?;
        if candidate == NIL {
            // The room starts in the unmapped rest at the end.
            candidate = self.map_expandable_end(segment, rounded)?;
        } else if self.state.blocks.get(candidate).flags & UNMAPPED != 0 {
            let want = self.state.blocks.get(candidate).size.min(rounded);
            candidate = self.map_expandable_hole(candidate, want)?;
        }
        // Invariant: `candidate` is free, and what follows it is unmapped.
        loop {
            let have = self.state.blocks.get(candidate).size;
            if have >= rounded {
                break;
            }
            let next = self.state.blocks.get(candidate).next;
            candidate = if next == NIL {
                self.map_expandable_end(segment, rounded - have)?
            } else {
                let want = self.state.blocks.get(next).size.min(rounded - have);
                self.map_expandable_hole(next, want)?
            };
        }
        self.state.remove_free(candidate);
        Some(Found {
            block: candidate,
            uncounted: false,
        })
    }

    /// The first part of [`Books::grow_expandable`]: the expandable segment of (`stream`,
    /// `pool`) with room for `rounded` bytes and where in it the room starts
    /// ([`State::expandable_room`]), reserving a new segment when none has room.
    fn expandable_room_for(
        &mut self,
        pool: Pool,
        stream: StreamId,
        rounded: u64,
        page: u64,
    ) -> Option<(u32, u32)> {
        let state = &mut *self.state;
        // Every expandable segment of this stream and pool is tried, lowest address first (a
        // segment's unmapped ranges come in address order in PyTorch's search); a new one is
        // reserved when none has room.
        let mut segments: Vec<u32> = state
            .expandable
            .iter()
            .filter(|(s, p, _)| *s == stream && *p == pool)
            .map(|(_, _, id)| *id)
            .collect();
        segments.sort_unstable_by_key(|&id| state.segments.get(id).addr);
        let found = segments
            .iter()
            .find_map(|&id| state.expandable_room(id, rounded).map(|start| (id, start)));
        if found.is_some() {
            return found;
        }
        // Like PyTorch, address space for 9/8 of the device's memory: pages unmapped in
        // the middle leave holes that the end must make up for.
        let capacity = self.shared.capacity;
        let reserve = capacity
            .saturating_add(capacity / 8)
            .max(page)
            .div_ceil(page)
            .saturating_mul(page);
        if rounded > reserve {
            return None;
        }
        let Ok(addr) = self.shared.backend.reserve_address_range(reserve) else {
            state.address_space_refused = true;
            return None;
        };
        let list = state.list_index(stream, pool);
        let id = state.segments.insert(SegmentMeta {
            addr,
            size: 0,
            reserved: reserve,
            holes: 0,
            stream,
            pool,
            list,
            expandable: true,
            first: NIL,
            last: NIL,
            idle_since: state.large_lookups,
        });
        state.segments_by_addr.insert(addr, id);
        // PyTorch leaves expandable segments out of its `segment` statistic.
        state.expandable.push((stream, pool, id));
        Some((id, state.expandable_room(id, rounded)?))
    }

    /// Maps the pages that hold `want` bytes at the start of the unmapped block `hole`; they
    /// become a free block, merged with free neighbours. Returns that free block.
    fn map_expandable_hole(&mut self, hole: u32, want: u64) -> Option<u32> {
        let h = *self.state.blocks.get(hole);
        let page = self.shared.expandable_page(h.pool);
        let length = want.div_ceil(page).saturating_mul(page).min(h.size);
        self.map_pages(h.segment, h.addr, length)?;
        let state = &mut *self.state;
        state.segments.get_mut(h.segment).holes -= length;
        let mapped = if length == h.size {
            state.blocks.get_mut(hole).flags = 0;
            hole
        } else {
            // The mapped pages become a block of their own before the rest of the hole.
            let rest = state.blocks.get_mut(hole);
            rest.addr += length;
            rest.size -= length;
            state.insert_before(
                hole,
                BlockMeta {
                    size: length,
                    flags: 0,
                    ..h
                },
            )
        };
        Some(state.merge_into_free(mapped))
    }

    /// Maps pages for `want` more bytes at the end of expandable `segment`; they join its last
    /// block if that is free, or become a free block of their own. Returns that free block.
    fn map_expandable_end(&mut self, segment: u32, want: u64) -> Option<u32> {
        let seg = *self.state.segments.get(segment);
        let page = self.shared.expandable_page(seg.pool);
        let length = want.div_ceil(page).saturating_mul(page);
        if length > seg.reserved - seg.size {
            return None;
        }
        let at = seg.addr + seg.size;
        self.map_pages(segment, at, length)?;
        let state = &mut *self.state;
        state.segments.get_mut(segment).size += length;
        let meta = BlockMeta::new_free(at, length, segment, seg.list, seg.pool);
        // After the last block, or as the only block of an empty segment.
        let id = state.insert_between(seg.last, NIL, meta);
        Some(state.merge_into_free(id))
    }

    /// Maps `[at, at + length)` of expandable `segment` on the device, with its statistics and
    /// event (one device allocation, as PyTorch counts a map).
    fn map_pages(&mut self, segment: u32, at: u64, length: u64) -> Option<()> {
        let shared = self.shared;
        let state = &mut *self.state;
        if shared.config.policy == Policy::Compact && state.over_memory_limit(length) {
            return None;
        }
        shared.backend.map(at, length).ok()?;
        if shared.config.debug {
            debug::fill(&shared.backend, at, length, debug::POISON);
        }
        let seg = *state.segments.get(segment);
        state.stats.reserved_bytes.increase(seg.pool, length);
        state.stats.num_device_alloc += 1;
        if shared.config.record_events {
            state.record(
                &shared.clock,
                EventKind::SegmentMap,
                RawEventParts {
                    addr: at,
                    size: length,
                    stream: seg.stream.0,
                    ..RawEventParts::default()
                },
            );
        }
        Some(())
    }

    /// Releases expandable `segment` when nothing of it is left mapped (PyTorch's
    /// `release_expandable_segment`, after an unmap leaves a lone unmapped block).
    pub(super) fn release_if_unmapped(&mut self, segment: u32) {
        let state = &mut *self.state;
        let seg = *state.segments.get(segment);
        if seg.first == NIL {
            let _ = self
                .shared
                .backend
                .release_address_range(seg.addr, seg.reserved);
            state.segments.remove(segment);
            state.segments_by_addr.remove(&seg.addr);
            state.expandable.retain(|(_, _, id)| *id != segment);
        }
    }

    /// Unmaps the whole pages inside the free block `id` of expandable `segment`; returns the
    /// bytes unmapped (0 when the block holds no whole page).
    pub(super) fn unmap_block(&mut self, segment: u32, id: u32) -> u64 {
        let shared = self.shared;
        let state = &mut *self.state;
        let seg = *state.segments.get(segment);
        let page = shared.expandable_page(seg.pool);
        let b = *state.blocks.get(id);
        // Pages are counted from the segment's base.
        let low = seg.addr + (b.addr - seg.addr).div_ceil(page) * page;
        let high = seg.addr + (b.addr + b.size - seg.addr) / page * page;
        if high <= low || shared.backend.unmap(low, high - low).is_err() {
            return 0;
        }
        let length = high - low;
        state.remove_free(id);
        state.make_hole(segment, id, low, high);
        state.stats.reserved_bytes.decrease(seg.pool, length);
        state.stats.num_device_free += 1;
        if shared.config.record_events {
            state.record(
                &shared.clock,
                EventKind::SegmentUnmap,
                RawEventParts {
                    addr: low,
                    size: length,
                    stream: seg.stream.0,
                    ..RawEventParts::default()
                },
            );
        }
        length
    }
}

impl<B: Backend> Shared<B> {
    /// The unit in which an expandable segment of `pool` maps and unmaps memory. PyTorch maps
    /// in its segment sizes, 2 MiB pages in the small pool and 20 MiB in the large (rounded up
    /// to the device's mapping granularity here); the `compact` policy maps in the device's
    /// granularity.
    pub(super) fn expandable_page(&self, pool: Pool) -> u64 {
        let granularity = self.backend.vm_granularity().max(1);
        let page = match (self.config.policy, pool) {
            (Policy::Compact, _) => return granularity,
            (Policy::Pytorch, Pool::Small) => SMALL_BUFFER,
            (Policy::Pytorch, Pool::Large) => LARGE_BUFFER,
        };
        page.div_ceil(granularity) * granularity
    }
}

impl State {
    /// PyTorch's `find_expandable_block` within expandable `segment`: where room for `size`
    /// bytes starts. Unmapped ranges are tried lowest first (holes, then the unmapped rest at
    /// the end); the room starts at the free block just before the range if there is one, and
    /// runs on over free and unmapped ranges. Returns the block it starts at, `NIL` for the
    /// unmapped rest at the end, or `None` when nothing has room.
    pub(super) fn expandable_room(&self, segment: u32, size: u64) -> Option<u32> {
        let seg = self.segments.get(segment);
        let end_room = seg.reserved - seg.size;
        // Holes are looked for only where there are some: walking the blocks of a segment
        // without holes on every growth made the compact policy's first pass 2× slower.
        let mut id = if seg.holes > 0 { seg.first } else { NIL };
        while id != NIL {
            let b = self.blocks.get(id);
            if b.flags & UNMAPPED != 0 {
                let start = if b.prev != NIL && self.blocks.get(b.prev).is_free() {
                    b.prev
                } else {
                    id
                };
                if self.room_from(start, end_room) >= size {
                    return Some(start);
                }
            }
            id = b.next;
        }
        let start = if seg.last != NIL && self.blocks.get(seg.last).is_free() {
            seg.last
        } else {
            NIL
        };
        let room = if start == NIL {
            end_room
        } else {
            self.blocks.get(start).size + end_room
        };
        (room >= size).then_some(start)
    }

    /// Bytes of free and unmapped address space from block `start` on, through the end's
    /// `end_room` when the run reaches it.
    fn room_from(&self, start: u32, end_room: u64) -> u64 {
        let mut room = 0;
        let mut id = start;
        while id != NIL {
            let b = self.blocks.get(id);
            if !b.is_free() && b.flags & UNMAPPED == 0 {
                return room;
            }
            room += b.size;
            id = b.next;
        }
        room + end_room
    }

    /// Bytes of unmapped address space right after block `id`, which a best fit counts as
    /// room the block can grow into: `None` outside expandable segments.
    pub(super) fn unmapped_after(&self, id: u32) -> Option<u64> {
        let b = self.blocks.get(id);
        let seg = self.segments.get(b.segment);
        if !seg.expandable {
            return None;
        }
        Some(if b.next == NIL {
            seg.reserved - seg.size
        } else {
            let next = self.blocks.get(b.next);
            if next.flags & UNMAPPED != 0 {
                next.size
            } else {
                0
            }
        })
    }

    /// Merges the unmapped block `other`, a neighbour of the unmapped block `id`, into `id`.
    fn absorb_unmapped(&mut self, id: u32, other: u32) {
        let o = self.blocks.remove(other);
        let b = self.blocks.get_mut(id);
        b.size += o.size;
        if o.addr < b.addr {
            b.addr = o.addr;
            b.prev = o.prev;
            if o.prev != NIL {
                self.blocks.get_mut(o.prev).next = id;
            } else {
                self.segments.get_mut(o.segment).first = id;
            }
        } else {
            b.next = o.next;
            if o.next != NIL {
                self.blocks.get_mut(o.next).prev = id;
            } else {
                self.segments.get_mut(o.segment).last = id;
            }
        }
    }

    /// Turns `[low, high)`, whole pages just unmapped inside the free block `id` (out of its
    /// free list) of expandable `segment`, into an unmapped block: the free parts on either
    /// side stay free blocks, the hole merges with unmapped neighbours, and a hole at the end
    /// becomes the segment's unmapped rest instead of a block.
    fn make_hole(&mut self, segment: u32, id: u32, low: u64, high: u64) {
        let b = *self.blocks.get(id);
        let length = high - low;
        // The free parts of pages on either side stay free blocks.
        if low > b.addr {
            let before = self.insert_before(
                id,
                BlockMeta {
                    size: low - b.addr,
                    ..b
                },
            );
            self.insert_free(before);
        }
        if high < b.addr + b.size {
            let after = self.insert_after(
                id,
                BlockMeta {
                    addr: high,
                    size: b.addr + b.size - high,
                    ..b
                },
            );
            self.insert_free(after);
        }
        let hole = self.blocks.get_mut(id);
        hole.addr = low;
        hole.size = length;
        hole.flags = UNMAPPED;
        hole.requested = 0;
        hole.provenance = NIL;
        self.segments.get_mut(segment).holes += length;
        let prev = self.blocks.get(id).prev;
        if prev != NIL && self.blocks.get(prev).flags & UNMAPPED != 0 {
            self.absorb_unmapped(id, prev);
        }
        let next = self.blocks.get(id).next;
        if next != NIL && self.blocks.get(next).flags & UNMAPPED != 0 {
            self.absorb_unmapped(id, next);
        }
        let hole = *self.blocks.get(id);
        if hole.next == NIL {
            // An unmapped end is the segment's unmapped rest, not a block.
            if hole.prev != NIL {
                self.blocks.get_mut(hole.prev).next = NIL;
            } else {
                self.segments.get_mut(segment).first = NIL;
            }
            let s = self.segments.get_mut(segment);
            s.last = hole.prev;
            s.size -= hole.size;
            s.holes -= hole.size;
            self.blocks.remove(id);
        }
    }
}
