//! Giving cached memory back to the device: whole free segments, the free pages of expandable
//! segments, and garbage collection of segments idle for long.
//!
//! PyTorch's `release_cached_blocks` (`torch.cuda.empty_cache()`, and the last retry before an
//! allocation fails), `release_available_cached_blocks` (oversize segments, with
//! `max_split_size`) and `garbage_collect_cached_blocks` (with
//! `garbage_collection_threshold`), as methods of the policy's [`Books`] (`super::policy`),
//! whose `grow` calls them in PyTorch's order. Expandable segments are unmapped page by page
//! through `super::expandable`; pending frees are waited for through `super::streams` first.

use std::panic::Location;

use super::policy::Books;
use super::state::{free_key, RawEventParts, State};
use super::CachingAllocator;
use crate::backend::{Backend, StreamId};
use crate::model::{EventKind, Pool};
use crate::provenance::NIL;

impl<B: Backend> CachingAllocator<B> {
    /// Releases every cached segment that holds no live block (`torch.cuda.empty_cache()`).
    /// Returns the bytes given back to the device.
    #[track_caller]
    pub fn empty_cache(&self) -> u64 {
        let location = Location::caller();
        let mut guard = self.shared.lock();
        let mut books = Books::new(&self.shared, &mut guard);
        let released = books.release_cached_blocks();
        books.record_for_site(
            EventKind::EmptyCache,
            location,
            RawEventParts {
                size: released,
                ..RawEventParts::default()
            },
        );
        released
    }
}

impl<B: Backend> Books<'_, B> {
    /// Releases one whole free segment back to the device.
    fn release_segment(&mut self, segment: u32) {
        let shared = self.shared;
        let state = &mut *self.state;
        let seg = *state.segments.get(segment);
        debug_assert!(!seg.expandable && seg.first == seg.last);
        let block = seg.first;
        state.remove_free(block);
        state.blocks.remove(block);
        state.segments.remove(segment);
        state.segments_by_addr.remove(&seg.addr);
        if shared.backend.free(seg.addr).is_err() {
            // The device refused the free; the memory is lost to the device but not to our
            // books, which must reflect what the program can use.
        }
        state.stats.segment.decrease(seg.pool, 1);
        state.stats.reserved_bytes.decrease(seg.pool, seg.size);
        state.stats.num_device_free += 1;
        if let Some(max_split) = shared.config.max_split_size {
            if seg.size >= max_split {
                state.stats.oversize_segments.decrease(1);
            }
        }
        if shared.config.record_events {
            state.record(
                &shared.clock,
                EventKind::SegmentFree,
                RawEventParts {
                    addr: seg.addr,
                    size: seg.size,
                    stream: seg.stream.0,
                    ..RawEventParts::default()
                },
            );
        }
    }

    /// PyTorch's `release_available_cached_blocks`: with `max_split_size` set, frees oversize
    /// cached segments on the stream, the smallest that covers the request or else the largest
    /// ones until enough is freed.
    pub(super) fn release_available_cached_blocks(
        &mut self,
        pool: Pool,
        stream: StreamId,
        rounded: u64,
    ) -> bool {
        let Some(max_split) = self.shared.config.max_split_size else {
            return false;
        };
        let key_size = rounded.max(max_split);
        let Some(list) = self.state.find_list(stream, pool) else {
            return false;
        };
        let candidates: Vec<(u64, u32)> = self.state.free_lists[list as usize]
            .blocks
            .all_from(free_key(max_split, 0))
            .into_iter()
            .map(|(key, id)| ((key >> 64) as u64, id))
            .collect();
        let whole = |state: &State, id: u32| {
            let b = state.blocks.get(id);
            !b.is_split() && !state.segments.get(b.segment).expandable
        };
        if let Some(&(_, id)) = candidates.iter().find(|(size, _)| *size >= key_size) {
            if whole(self.state, id) {
                let segment = self.state.blocks.get(id).segment;
                self.release_segment(segment);
                return true;
            }
            return false;
        }
        let mut released = 0;
        for &(size, id) in candidates.iter().rev() {
            if released >= key_size {
                break;
            }
            if whole(self.state, id) {
                let segment = self.state.blocks.get(id).segment;
                self.release_segment(segment);
                released += size;
            }
        }
        released >= key_size
    }

    /// PyTorch's `release_cached_blocks`: wait for pending frees, then, pool by pool (large,
    /// then small), go through the free blocks in (stream, size, address) order, releasing each
    /// plain segment that is one free block as it comes and then unmapping the whole free pages
    /// of each free block of an expandable segment (`release_blocks`), so that the device calls
    /// come in PyTorch's order. Returns the bytes released.
    ///
    /// A pass that released nothing is not repeated while the free blocks stay as they were
    /// (nothing allocated, freed, mapped or released since): it would find nothing again and
    /// make no device call, and a program (or a replayed trace) that fails request after
    /// request would otherwise go through every free block each time.
    pub(super) fn release_cached_blocks(&mut self) -> u64 {
        self.synchronize_and_free_events();
        if self.state.fruitless_release == Some(self.state.free_blocks_generation()) {
            return 0;
        }
        let before = self.state.stats.reserved_bytes.all().current;
        for pool in [Pool::Large, Pool::Small] {
            let (whole, to_unmap) = self.state.releasable(pool);
            for segment in whole {
                self.release_segment(segment);
            }
            for id in to_unmap {
                let segment = self.state.blocks.get(id).segment;
                if self.unmap_block(segment, id) > 0 {
                    self.release_if_unmapped(segment);
                }
            }
        }
        // An expandable segment whose first map failed holds no block: only its address
        // space, which goes back too.
        let empty: Vec<u32> = self
            .state
            .expandable
            .iter()
            .map(|&(_, _, id)| id)
            .filter(|&id| self.state.segments.get(id).first == NIL)
            .collect();
        for segment in empty {
            self.release_if_unmapped(segment);
        }
        let released = before - self.state.stats.reserved_bytes.all().current;
        self.state.fruitless_release = (released == 0).then(|| self.state.free_blocks_generation());
        released
    }

    /// PyTorch's `garbage_collect_cached_blocks`: once reserved memory is over `threshold` of
    /// the capacity, frees the whole cached segments of the large pool that have been idle for
    /// at least the average idle age (counted in large-pool lookups), and repeats with the
    /// average of those left until the excess is reclaimed or nothing more can be freed. A pass
    /// frees every segment at or above its average, past the target, so that collection is not
    /// triggered again at once. Expandable segments take no part: in PyTorch their free block
    /// borders the unmapped rest, so it counts as split.
    pub(super) fn garbage_collect(&mut self, threshold: f64) {
        let limit = (self.cap() as f64 * threshold) as u64;
        let reserved = self.state.stats.reserved_bytes.all().current;
        if reserved <= limit {
            return;
        }
        let target = reserved - limit;
        let mut idle = self.state.idle_large_segments();
        let mut total_age: u64 = idle.iter().map(|&(age, _)| age).sum();
        let mut candidates = idle.len() as u64;
        let mut reclaimed = 0;
        let mut freed_one = true;
        while reclaimed < target && freed_one && candidates > 0 {
            let average = total_age as f64 / candidates as f64;
            freed_one = false;
            let mut kept = Vec::with_capacity(idle.len());
            for (age, segment) in idle {
                if age as f64 >= average {
                    freed_one = true;
                    reclaimed += self.state.segments.get(segment).size;
                    total_age -= age;
                    candidates -= 1;
                    self.release_segment(segment);
                } else {
                    kept.push((age, segment));
                }
            }
            idle = kept;
        }
    }
}

impl State {
    /// Counts that change whenever the free blocks may have: with every allocation, free,
    /// completed pending free, segment made or released, and page mapped or unmapped (the
    /// counters only grow under [`CounterArray::changes`]), and the segments' numbers.
    ///
    /// [`CounterArray::changes`]: crate::stats::CounterArray::changes
    pub(super) fn free_blocks_generation(&self) -> [u64; 6] {
        let stats = &self.stats;
        [
            stats.allocation.changes(),
            stats.pending.changes(),
            stats.segment.changes(),
            stats.reserved_bytes.changes(),
            self.segments.len() as u64,
            self.expandable.len() as u64,
        ]
    }

    /// What [`Books::release_cached_blocks`] releases in `pool`, in PyTorch's order (free
    /// blocks by stream, size and address): the plain segments that are one free block, and
    /// the free blocks of expandable segments, whose whole pages are unmapped.
    fn releasable(&self, pool: Pool) -> (Vec<u32>, Vec<u32>) {
        // Only lists that hold blocks: a trace of thousands of streams has as many lists,
        // nearly all empty, and this runs at every out-of-memory.
        let mut lists: Vec<usize> = (0..self.free_lists.len())
            .filter(|&i| self.free_lists[i].pool == pool && self.free_lists[i].blocks.len() > 0)
            .collect();
        lists.sort_by_key(|&i| self.free_lists[i].stream.0);
        let mut whole = Vec::new();
        let mut to_unmap = Vec::new();
        for list in lists {
            for (_, id) in self.free_lists[list].blocks.all_from(0) {
                let b = self.blocks.get(id);
                if self.segments.get(b.segment).expandable {
                    to_unmap.push(id);
                } else if !b.is_split() {
                    whole.push(b.segment);
                }
            }
        }
        (whole, to_unmap)
    }

    /// (age, segment) of every wholly free plain segment of the large pool, in PyTorch's
    /// free-block order (stream, size, address) so that garbage collection frees them in its
    /// order; ages count large-pool lookups since the segment became free.
    fn idle_large_segments(&self) -> Vec<(u64, u32)> {
        let now = self.large_lookups;
        let mut idle: Vec<(u64, u32)> = self
            .segments
            .iter()
            .filter(|(_, s)| s.pool == Pool::Large && !s.expandable && self.is_idle(s))
            .map(|(id, s)| (now - s.idle_since, id))
            .collect();
        idle.sort_unstable_by_key(|&(_, id)| {
            let s = self.segments.get(id);
            (s.stream.0, s.size, s.addr)
        });
        idle
    }
}
