//! The allocator's own books behind PyTorch's statistics: counters kept under the device lock
//! and turned into `vramscope_model::MemoryStats` on read.
//!
//! `crate::allocator` updates a [`StatsBook`] on every allocation, free and segment change; the
//! figures and their names (`MemoryStats`, `Stat`, `StatArray`) live in the data model crate,
//! which the inspector reads without linking this allocator.

use vramscope_model::Pool;
pub(crate) use vramscope_model::{format_bytes, MemoryStats, Stat, StatArray};

/// One statistic as the allocator keeps it under its device lock: the running total added is
/// not stored but derived on read (`allocated = current + freed`), one store fewer per change.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Counter {
    pub current: u64,
    pub peak: u64,
    pub freed: u64,
}

impl Counter {
    /// Removes `amount`. The books never take away more than they added (the proptest
    /// programs check every statistic against the blocks after each step), so there is no
    /// saturation on this path; debug builds assert it.
    #[inline]
    fn decrease(&mut self, amount: u64) {
        debug_assert!(self.current >= amount, "statistic would go negative");
        self.current = self.current.wrapping_sub(amount);
        self.freed += amount;
    }

    fn to_stat(self) -> Stat {
        Stat {
            current: self.current,
            peak: self.peak,
            allocated: self.current + self.freed,
            freed: self.freed,
        }
    }
}

/// A [`Counter`] for each pool alone (indexed by `Pool as usize`, so that choosing the pool is
/// an address computation, not a branch) and the peak of all pools together; the current
/// value and the totals of `all` are the sums of the pools'. An increase computes the new
/// all-pools value from the pool's new value, still in a register, and the other pool's
/// counter, which this operation has not written: no store-to-load round trip, and one store
/// fewer per change than keeping the sum (the same speed on the traces of `bench/`, measured
/// in alternating runs).
///
/// It is aligned to 64 bytes so that each array is one cache line: an allocation or a free
/// updates up to five of them (about 1.5 % of its time on the bench's traces, against arrays
/// that straddle two lines).
#[derive(Clone, Copy, Debug, Default)]
#[repr(align(64))]
pub(crate) struct CounterArray {
    pools: [Counter; 2],
    all_peak: u64,
}

impl CounterArray {
    /// A number that grows by one with every increase or decrease by one (an allocation or a
    /// free, for the count of allocations): equal at two moments only when nothing was
    /// counted in between.
    pub(crate) fn changes(&self) -> u64 {
        self.pools
            .iter()
            .map(|c| c.current.wrapping_add(c.freed.wrapping_mul(2)))
            .fold(0, u64::wrapping_add)
    }

    #[inline]
    fn pool_mut(&mut self, pool: Pool) -> &mut Counter {
        &mut self.pools[pool as usize]
    }

    /// The counter of one pool.
    #[inline]
    pub fn pool(&self, pool: Pool) -> &Counter {
        &self.pools[pool as usize]
    }

    /// The counter of both pools together.
    #[inline]
    pub fn all(&self) -> Counter {
        let [small, large] = self.pools;
        Counter {
            current: small.current + large.current,
            peak: self.all_peak,
            freed: small.freed + large.freed,
        }
    }

    /// Adds `amount` to `pool` (and so to `all`).
    #[inline]
    pub fn increase(&mut self, pool: Pool, amount: u64) {
        let index = pool as usize;
        let other = self.pools[index ^ 1].current;
        let counter = &mut self.pools[index];
        let current = counter.current + amount;
        counter.current = current;
        counter.peak = counter.peak.max(current);
        self.all_peak = self.all_peak.max(current + other);
    }

    /// Removes `amount` from `pool` (and so from `all`).
    #[inline]
    pub fn decrease(&mut self, pool: Pool, amount: u64) {
        self.pool_mut(pool).decrease(amount);
    }

    /// Applies a net change, as PyTorch applies the net change of a split or a merge: one
    /// increase or one decrease, or nothing when the change is zero.
    #[inline]
    pub fn apply(&mut self, pool: Pool, delta: i64) {
        if delta > 0 {
            self.increase(pool, delta as u64);
        } else if delta < 0 {
            self.decrease(pool, delta.unsigned_abs());
        }
    }

    fn reset_peak(&mut self) {
        self.all_peak = self.all().current;
        for counter in &mut self.pools {
            counter.peak = counter.current;
        }
    }

    fn to_stat_array(self) -> StatArray {
        StatArray {
            all: self.all().to_stat(),
            small_pool: self.pool(Pool::Small).to_stat(),
            large_pool: self.pool(Pool::Large).to_stat(),
        }
    }
}

/// The statistics as `crate::allocator` keeps them under its device lock, turned into PyTorch's
/// [`MemoryStats`] on read. Two things are derived instead of kept: every running total added
/// (see [`Counter`]), and the whole `active` / `active_bytes` pair, which is `allocation` /
/// `allocated_bytes` plus the blocks the program freed that still wait for stream events
/// (`pending`). An operation thus updates three arrays on allocation and free instead of five;
/// the active peaks are tracked apart only while some block is pending.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct StatsBook {
    pub allocated_bytes: CounterArray,
    pub reserved_bytes: CounterArray,
    pub inactive_split_bytes: CounterArray,
    pub requested_bytes: CounterArray,
    pub allocation: CounterArray,
    pub segment: CounterArray,
    pub inactive_split: CounterArray,
    /// Blocks freed by the program that wait for stream events: active, not allocated.
    pub pending: CounterArray,
    /// Bytes of the pending blocks.
    pub pending_bytes: CounterArray,
    /// Peaks of `active` reached while blocks were pending (only `peak` is used).
    active_peak: CounterArray,
    /// Peaks of `active_bytes` reached while blocks were pending (only `peak` is used).
    active_bytes_peak: CounterArray,
    pub num_alloc_retries: u64,
    pub num_ooms: u64,
    pub num_sync_all_streams: u64,
    pub num_device_alloc: u64,
    pub num_device_free: u64,
    pub oversize_allocations: Stat,
    pub oversize_segments: Stat,
}

impl StatsBook {
    /// Counts a block handed out of `pool`: three arrays, and the active peaks while blocks
    /// are pending.
    #[inline]
    pub fn count_allocation(&mut self, pool: Pool, size: u64, requested: u64) {
        self.allocation.increase(pool, 1);
        self.allocated_bytes.increase(pool, size);
        self.requested_bytes.increase(pool, requested);
        if self.pending.all().current != 0 {
            self.note_active_peaks(pool);
        }
    }

    /// Counts a block the program freed (whether it returns to the cache now or later; its
    /// requested bytes are counted out when it does, as PyTorch's `free_block` does).
    #[inline]
    pub fn count_free(&mut self, pool: Pool, size: u64) {
        self.allocation.decrease(pool, 1);
        self.allocated_bytes.decrease(pool, size);
    }

    /// Counts a freed block that now waits for stream events (still active).
    pub fn count_pending(&mut self, pool: Pool, size: u64) {
        self.pending.increase(pool, 1);
        self.pending_bytes.increase(pool, size);
    }

    /// Counts a pending block whose stream events have completed.
    pub fn count_pending_done(&mut self, pool: Pool, size: u64) {
        self.pending.decrease(pool, 1);
        self.pending_bytes.decrease(pool, size);
    }

    /// The active peaks with what they are made of: (peaks, allocated, pending) for `active`
    /// and for `active_bytes`.
    fn active_parts(&mut self) -> [(&mut CounterArray, &CounterArray, &CounterArray); 2] {
        [
            (&mut self.active_peak, &self.allocation, &self.pending),
            (
                &mut self.active_bytes_peak,
                &self.allocated_bytes,
                &self.pending_bytes,
            ),
        ]
    }

    /// Raises the active peaks to the current active values (allocated plus pending).
    fn note_active_peaks(&mut self, pool: Pool) {
        for (peak, allocated, pending) in self.active_parts() {
            let all = allocated.all().current + pending.all().current;
            peak.all_peak = peak.all_peak.max(all);
            let one = allocated.pool(pool).current + pending.pool(pool).current;
            let pool_peak = &mut peak.pool_mut(pool).peak;
            *pool_peak = (*pool_peak).max(one);
        }
    }

    /// The `active` and `active_bytes` arrays: allocated plus pending.
    fn active(
        &self,
        allocated: &CounterArray,
        pending: &CounterArray,
        peaks: &CounterArray,
    ) -> StatArray {
        let one = |a: &Counter, p: &Counter, peak: &Counter| Stat {
            current: a.current + p.current,
            peak: a.peak.max(peak.peak),
            allocated: a.current + a.freed,
            freed: a.freed - p.current,
        };
        let pool = |p: Pool| one(allocated.pool(p), pending.pool(p), peaks.pool(p));
        StatArray {
            all: one(&allocated.all(), &pending.all(), &peaks.all()),
            small_pool: pool(Pool::Small),
            large_pool: pool(Pool::Large),
        }
    }

    /// PyTorch's statistics.
    pub fn memory_stats(&self) -> MemoryStats {
        MemoryStats {
            allocated_bytes: self.allocated_bytes.to_stat_array(),
            reserved_bytes: self.reserved_bytes.to_stat_array(),
            active_bytes: self.active(
                &self.allocated_bytes,
                &self.pending_bytes,
                &self.active_bytes_peak,
            ),
            inactive_split_bytes: self.inactive_split_bytes.to_stat_array(),
            requested_bytes: self.requested_bytes.to_stat_array(),
            allocation: self.allocation.to_stat_array(),
            segment: self.segment.to_stat_array(),
            active: self.active(&self.allocation, &self.pending, &self.active_peak),
            inactive_split: self.inactive_split.to_stat_array(),
            num_alloc_retries: self.num_alloc_retries,
            num_ooms: self.num_ooms,
            num_sync_all_streams: self.num_sync_all_streams,
            num_device_alloc: self.num_device_alloc,
            num_device_free: self.num_device_free,
            oversize_allocations: self.oversize_allocations,
            oversize_segments: self.oversize_segments,
        }
    }

    /// Resets every peak to its current value.
    pub fn reset_peak(&mut self) {
        for array in [
            &mut self.allocated_bytes,
            &mut self.reserved_bytes,
            &mut self.inactive_split_bytes,
            &mut self.requested_bytes,
            &mut self.allocation,
            &mut self.segment,
            &mut self.inactive_split,
            &mut self.pending,
            &mut self.pending_bytes,
        ] {
            array.reset_peak();
        }
        for (peak, allocated, pending) in self.active_parts() {
            peak.all_peak = allocated.all().current + pending.all().current;
            for pool in [Pool::Small, Pool::Large] {
                peak.pool_mut(pool).peak =
                    allocated.pool(pool).current + pending.pool(pool).current;
            }
        }
        self.oversize_allocations.reset_peak();
        self.oversize_segments.reset_peak();
    }
}
