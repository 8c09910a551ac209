//! Stream deferral: a block used on other streams besides its own (`record_stream`) is reused
//! only after the work queued on those streams when it was freed has completed.
//!
//! PyTorch's `record_stream`, `insert_events`, `process_events` and
//! `synchronize_and_free_events`. [`CachingAllocator::record_stream_ptr`] notes the extra
//! streams in the state (`super::state::State::stream_uses`); the free path of the policy
//! (`super::policy::Books::release_allocated`) hands such a block to [`Books::defer_free`],
//! which records an event per stream and leaves the block pending; each later allocation first
//! returns the blocks whose events have completed to the cache, and releasing the cache
//! (`super::release`) waits for all of them.

use super::errors::AllocError;
use super::policy::Books;
use super::state::{State, ALLOCATED, BUFFER_OWNED, PENDING_FREE};
use super::CachingAllocator;
use crate::backend::{Backend, StreamId};

impl<B: Backend> CachingAllocator<B> {
    /// Marks the block at `addr` as used by `stream` too: when freed, it is reused only after
    /// the work queued on `stream` so far has completed.
    pub fn record_stream_ptr(&self, addr: u64, stream: StreamId) -> Result<(), AllocError> {
        let mut state = self.shared.lock();
        let Some(&id) = state.live.get(&addr) else {
            return Err(state.classify_bad_free(addr));
        };
        state.add_stream_use(id, stream);
        Ok(())
    }

    /// `record_stream` for a buffer's block, by id.
    pub(crate) fn record_stream_block(
        &self,
        block: u32,
        addr: u64,
        stream: StreamId,
    ) -> Result<(), AllocError> {
        let mut state = self.shared.lock();
        let owned = state
            .blocks
            .slot(block)
            .is_some_and(|b| b.addr == addr && b.flags == ALLOCATED | BUFFER_OWNED);
        if !owned {
            return Err(state.classify_bad_free(addr));
        }
        state.add_stream_use(block, stream);
        Ok(())
    }
}

impl State {
    /// Notes that live block `id` is used on `stream` too, unless that is its own stream.
    fn add_stream_use(&mut self, id: u32, stream: StreamId) {
        let own = self.stream_of(id);
        if own != stream {
            let uses = self.stream_uses.entry(id).or_default();
            if !uses.contains(&stream) {
                uses.push(stream);
            }
        }
    }
}

impl<B: Backend> Books<'_, B> {
    /// Records an event on each stream that used the block; the block waits for all of them.
    /// Returns whether any event was recorded (if none could be, the block is freed at once).
    #[cold]
    #[inline(never)]
    pub(super) fn defer_free(self, id: u32, streams: &[StreamId]) -> bool {
        let backend = &self.shared.backend;
        let state = &mut *self.state;
        let mut count = 0;
        for &stream in streams {
            let event = match state.spare_events.pop() {
                Some(e) => Ok(e),
                None => backend.create_event(),
            };
            let Ok(event) = event else { continue };
            if backend.record_event(event, stream).is_err() {
                state.spare_events.push(event);
                continue;
            }
            state.outstanding.push_back((event, id));
            count += 1;
        }
        if count == 0 {
            return false;
        }
        let block = state.blocks.get_mut(id);
        block.flags = PENDING_FREE;
        let (pool, size) = (block.pool, block.size);
        state.stats.count_pending(pool, size);
        state.pending_events.insert(id, count);
        true
    }

    /// Frees blocks whose stream events have completed, in the order they were recorded.
    #[cold]
    #[inline(never)]
    pub(super) fn process_events(mut self) {
        let backend = &self.shared.backend;
        while let Some(&(event, block)) = self.state.outstanding.front() {
            if !backend.query_event(event).unwrap_or(true) {
                break;
            }
            self.state.outstanding.pop_front();
            self.state.spare_events.push(event);
            self.event_done(block);
        }
    }

    /// One of the events that pending `block` waits for has completed: with the last one, the
    /// block goes back to the cache.
    fn event_done(&mut self, block: u32) {
        let remaining = self
            .state
            .pending_events
            .get_mut(&block)
            .map(|c| {
                *c -= 1;
                *c
            })
            .unwrap_or(0);
        if remaining == 0 {
            self.state.pending_events.remove(&block);
            let original = *self.state.blocks.get(block);
            self.state
                .stats
                .count_pending_done(original.pool, original.size);
            self.return_to_cache(block, original, false);
        }
    }

    /// Waits for every outstanding stream event and frees the blocks behind them.
    pub(super) fn synchronize_and_free_events(&mut self) {
        if self.state.outstanding.is_empty() {
            return;
        }
        self.state.stats.num_sync_all_streams += 1;
        let _ = self.shared.backend.synchronize();
        while let Some((event, block)) = self.state.outstanding.pop_front() {
            self.state.spare_events.push(event);
            self.event_done(block);
        }
    }
}
