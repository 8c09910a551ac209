//! The simulated device: a [`Backend`] that needs no GPU.
//!
//! `SimDevice::phantom` hands out addresses with no memory behind them, so traces that needed
//! terabytes can be replayed on a laptop; `SimDevice::backed` puts real, 512-byte aligned host
//! memory behind every address so copies, CPU kernels and poison checks work. Both enforce the
//! capacity like `cudaMalloc`, can be told to fail raw allocations (fault injection), count what
//! they hand out so tests can prove nothing leaked, and complete stream events either at once or
//! only when a test says so (to test `record_stream` deferral in `crate::allocator`).

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;

use parking_lot::Mutex;
use rustc_hash::FxHashMap;

use crate::backend::{Backend, BackendError, EventId, MemInfo, StreamId};

/// Alignment of every simulated device address and of the host memory behind it.
pub const SIM_ALIGNMENT: u64 = 512;
/// Page size of the simulated virtual-memory API.
pub const SIM_GRANULARITY: u64 = 2 << 20;
/// First address the simulated device hands out.
const BASE_ADDRESS: u64 = 0x7f00_0000_0000;

/// 512 bytes of host memory aligned to 512 bytes: the unit of backed storage.
#[derive(Clone, Copy)]
#[repr(C, align(512))]
struct Chunk([u8; 512]);

// SAFETY: `Chunk` is a byte array with no padding (size 512 = alignment 512), so the all-zero
// bit pattern is valid.
unsafe impl bytemuck::Zeroable for Chunk {}
// SAFETY: `Chunk` is `Copy`, `repr(C)`, has no padding and holds only bytes, so every bit
// pattern is valid and it may be viewed as bytes.
unsafe impl bytemuck::Pod for Chunk {}

/// Host memory behind one device range.
struct Storage {
    chunks: Vec<Chunk>,
}

impl Storage {
    fn zeroed(size: u64) -> Storage {
        let count = size.div_ceil(SIM_ALIGNMENT) as usize;
        Storage {
            chunks: vec![Chunk([0; 512]); count],
        }
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        bytemuck::cast_slice_mut(&mut self.chunks)
    }

    /// Splits off the memory from byte `at` (a multiple of [`SIM_ALIGNMENT`]) to the end.
    fn split_off(&mut self, at: u64) -> Storage {
        let tail = self.chunks.split_off((at / SIM_ALIGNMENT) as usize);
        self.chunks.shrink_to_fit();
        Storage { chunks: tail }
    }
}

/// One live raw allocation, or one run of pages mapped by a single `map` (a later `unmap` of
/// part of a run splits it).
struct Region {
    size: u64,
    storage: Option<Storage>,
}

/// How raw allocations are made to fail.
#[derive(Clone, Copy, Debug, PartialEq)]
enum FaultPlan {
    None,
    /// The raw allocation attempt with this ordinal (1-based, counted from the plan) fails.
    Nth {
        remaining: u64,
    },
    /// Each attempt fails with this probability, from a seeded generator.
    Random {
        probability: f64,
        state: u64,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum EventState {
    Created,
    Pending(StreamId),
    Complete,
}

struct SimState {
    next_address: u64,
    used: u64,
    segments: BTreeMap<u64, Region>,
    /// Mapped runs of pages by start address: one entry per `map` call (or per piece of one
    /// that was partly unmapped), whatever its size, so that mapping terabytes of address
    /// space on a phantom device costs one entry.
    pages: BTreeMap<u64, Region>,
    reservations: BTreeMap<u64, u64>,
    next_stream: u64,
    next_event: u64,
    events: FxHashMap<u64, EventState>,
    manual_events: bool,
    faults: FaultPlan,
    counters: SimCounters,
    /// Addresses another run's raw allocations got, in order, with their sizes: see
    /// [`SimDevice::plan_addresses`].
    address_plan: VecDeque<(u64, u64)>,
}

/// How many planned raw allocations a `malloc` may skip to find one of its size: the other run
/// made allocations this one did not.
const PLAN_LOOKAHEAD: usize = 16;

/// The highest end a planned range may have: far above any GPU virtual address (they use 47 to
/// 57 bits), far below where fresh addresses above the plan would overflow.
#[cfg(any(test, feature = "replay"))]
const PLAN_LIMIT: u64 = 1 << 60;

/// What a simulated device has handed out, for leak checks in tests.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SimCounters {
    /// Successful raw allocations (`malloc` and page maps).
    pub raw_allocs: u64,
    /// Raw frees (`free` and page unmaps).
    pub raw_frees: u64,
    /// Bytes currently allocated or mapped.
    pub outstanding_bytes: u64,
    /// Raw allocation attempts that failed (capacity or injected faults).
    pub failed_allocs: u64,
    /// Attempts failed by fault injection.
    pub injected_failures: u64,
}

/// A simulated GPU. Cloning gives another handle to the same device.
#[derive(Clone)]
pub struct SimDevice {
    inner: Arc<SimInner>,
}

struct SimInner {
    index: u32,
    capacity: u64,
    backed: bool,
    state: Mutex<SimState>,
}

impl SimDevice {
    /// A device with addresses only: nothing behind them, so capacities of terabytes are fine.
    pub fn phantom(capacity: u64) -> SimDevice {
        SimDevice::new(capacity, false)
    }

    /// A device with real host memory behind every address (512-byte aligned, zeroed).
    pub fn backed(capacity: u64) -> SimDevice {
        SimDevice::new(capacity, true)
    }

    fn new(capacity: u64, backed: bool) -> SimDevice {
        SimDevice {
            inner: Arc::new(SimInner {
                index: 0,
                capacity,
                backed,
                state: Mutex::new(SimState {
                    next_address: BASE_ADDRESS,
                    used: 0,
                    segments: BTreeMap::new(),
                    pages: BTreeMap::new(),
                    reservations: BTreeMap::new(),
                    next_stream: 1,
                    next_event: 1,
                    events: FxHashMap::default(),
                    manual_events: false,
                    faults: FaultPlan::None,
                    counters: SimCounters::default(),
                    address_plan: VecDeque::new(),
                }),
            }),
        }
    }

    /// A device that reports ordinal `index` (for multi-device and wrong-device tests).
    pub fn with_index(capacity: u64, backed: bool, index: u32) -> SimDevice {
        let mut device = SimDevice::new(capacity, backed);
        if let Some(inner) = Arc::get_mut(&mut device.inner) {
            inner.index = index;
        }
        device
    }

    #[cfg(any(test, feature = "replay"))]
    /// Makes raw allocations take the addresses another run's got: `plan` lists that run's
    /// `(size, address)` in order. A `malloc` of a size the plan has among its next entries takes
    /// that entry's address (dropping the entries before it), unless the range is still in use
    /// here; otherwise it takes a fresh address above every planned one. Replay uses this so
    /// that ties between equal free blocks, which PyTorch breaks by address, are broken as on
    /// the recorded run. Only phantom devices follow a plan (a backed device's addresses are its
    /// host memory's), and only plain raw allocations, not expandable segments' pages.
    pub fn plan_addresses(&self, plan: impl IntoIterator<Item = (u64, u64)>) {
        if self.inner.backed {
            return;
        }
        let mut state = self.inner.state.lock();
        // Entries beyond any real address space (a damaged trace) are dropped, so that fresh
        // addresses above the plan stay representable.
        state.address_plan = plan
            .into_iter()
            .filter(|&(size, addr)| addr.checked_add(size).is_some_and(|end| end <= PLAN_LIMIT))
            .collect();
        let above = state
            .address_plan
            .iter()
            .map(|&(size, addr)| addr.saturating_add(size))
            .max()
            .unwrap_or(0);
        state.next_address = state
            .next_address
            .max(above.saturating_add(SIM_ALIGNMENT - 1) / SIM_ALIGNMENT * SIM_ALIGNMENT);
    }

    /// Whether host memory stands behind the addresses.
    pub fn is_backed(&self) -> bool {
        self.inner.backed
    }

    /// The device's capacity in bytes.
    pub fn capacity(&self) -> u64 {
        self.inner.capacity
    }

    /// What the device has handed out so far.
    pub fn counters(&self) -> SimCounters {
        self.inner.state.lock().counters
    }

    /// Makes the `n`th raw allocation attempt from now fail (1 = the next one).
    pub fn fail_nth_raw_alloc(&self, n: u64) {
        self.inner.state.lock().faults = FaultPlan::Nth {
            remaining: n.max(1),
        };
    }

    /// Makes each raw allocation attempt fail with `probability`, reproducibly from `seed`.
    pub fn fail_raw_allocs_randomly(&self, probability: f64, seed: u64) {
        self.inner.state.lock().faults = FaultPlan::Random {
            probability: probability.clamp(0.0, 1.0),
            state: seed | 1,
        };
    }

    /// Stops injecting faults.
    pub fn clear_faults(&self) {
        self.inner.state.lock().faults = FaultPlan::None;
    }

    /// With `true`, recorded events stay pending until [`SimDevice::complete_stream`],
    /// [`SimDevice::complete_all_events`] or a synchronize; with `false` (the default) they
    /// complete at once.
    pub fn set_manual_events(&self, manual: bool) {
        self.inner.state.lock().manual_events = manual;
    }

    /// Completes every pending event recorded on `stream`.
    pub fn complete_stream(&self, stream: StreamId) {
        let mut state = self.inner.state.lock();
        for event in state.events.values_mut() {
            if *event == EventState::Pending(stream) {
                *event = EventState::Complete;
            }
        }
    }

    /// Completes every pending event.
    pub fn complete_all_events(&self) {
        let mut state = self.inner.state.lock();
        for event in state.events.values_mut() {
            if matches!(event, EventState::Pending(_)) {
                *event = EventState::Complete;
            }
        }
    }

    /// Number of events still pending.
    pub fn pending_events(&self) -> usize {
        self.inner
            .state
            .lock()
            .events
            .values()
            .filter(|e| matches!(e, EventState::Pending(_)))
            .count()
    }

    /// Runs `f` over the host memory behind `[addr, addr + len)`, which must lie inside one
    /// raw allocation or a run of mapped pages.
    fn with_range<R>(
        &self,
        addr: u64,
        len: u64,
        mut f: impl FnMut(&mut [u8], u64) -> R,
    ) -> Result<(), BackendError> {
        if !self.inner.backed {
            return Err(BackendError::NoBackingMemory);
        }
        if len == 0 {
            return Ok(());
        }
        let end = addr
            .checked_add(len)
            .ok_or(BackendError::OutOfBounds { addr, len })?;
        let mut state = self.inner.state.lock();
        // A raw segment holds the whole range, or consecutive pages do.
        if let Some((&base, region)) = state.segments.range_mut(..=addr).next_back() {
            if end <= base + region.size {
                let storage = region.storage.as_mut().expect("backed device has storage");
                let start = (addr - base) as usize;
                f(&mut storage.bytes_mut()[start..start + len as usize], 0);
                return Ok(());
            }
        }
        let mut cursor = addr;
        let mut done = 0u64;
        while cursor < end {
            let (&run, region) = state
                .pages
                .range_mut(..=cursor)
                .next_back()
                .filter(|(&run, region)| cursor < run + region.size)
                .ok_or(BackendError::OutOfBounds { addr, len })?;
            let storage = region.storage.as_mut().expect("backed device has storage");
            let start = (cursor - run) as usize;
            let take = (region.size - (cursor - run)).min(end - cursor) as usize;
            f(&mut storage.bytes_mut()[start..start + take], done);
            cursor += take as u64;
            done += take as u64;
        }
        Ok(())
    }

    fn read(&self, addr: u64, len: u64) -> Result<Vec<u8>, BackendError> {
        let mut out = vec![0u8; len as usize];
        self.with_range(addr, len, |bytes, offset| {
            out[offset as usize..offset as usize + bytes.len()].copy_from_slice(bytes);
        })?;
        Ok(out)
    }

    fn check_stream(state: &SimState, stream: StreamId) -> Result<(), BackendError> {
        if stream.0 < state.next_stream {
            Ok(())
        } else {
            Err(BackendError::InvalidHandle {
                kind: "stream",
                id: stream.0,
            })
        }
    }
}

impl SimState {
    /// Decides whether the next raw allocation of `size` bytes may proceed.
    fn admit(&mut self, size: u64, capacity: u64) -> Result<(), BackendError> {
        let injected = match &mut self.faults {
            FaultPlan::None => false,
            FaultPlan::Nth { remaining } => {
                *remaining -= 1;
                if *remaining == 0 {
                    self.faults = FaultPlan::None;
                    true
                } else {
                    false
                }
            }
            FaultPlan::Random { probability, state } => {
                // xorshift64*: a small, seeded, reproducible generator.
                *state ^= *state >> 12;
                *state ^= *state << 25;
                *state ^= *state >> 27;
                let draw = state.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 11;
                (draw as f64 / (1u64 << 53) as f64) < *probability
            }
        };
        let free = capacity.saturating_sub(self.used);
        if injected || size > free {
            self.counters.failed_allocs += 1;
            if injected {
                self.counters.injected_failures += 1;
            }
            return Err(BackendError::OutOfMemory {
                requested: size,
                free,
            });
        }
        Ok(())
    }

    /// The planned address for a raw allocation of `size` bytes, when the plan has one of that
    /// size among its next entries and its range is not in use; the entries before it are
    /// dropped.
    fn planned_address(&mut self, size: u64) -> Option<u64> {
        let at = self
            .address_plan
            .iter()
            .take(PLAN_LOOKAHEAD)
            .position(|&(planned, _)| planned == size)?;
        let (_, addr) = self.address_plan.drain(..=at).next_back()?;
        // `plan_addresses` kept only ranges that end at or below `PLAN_LIMIT`.
        let end = addr + size;
        // Only raw allocations are checked against: expandable segments' reservations and pages
        // lie above every planned address (`plan_addresses` moves fresh addresses there).
        let overlaps_below = self
            .segments
            .range(..=addr)
            .next_back()
            .is_some_and(|(&start, region)| start + region.size > addr);
        let overlaps_above = self.segments.range(addr..end).next().is_some();
        (!overlaps_below && !overlaps_above).then_some(addr)
    }

    fn take_addresses(&mut self, size: u64, alignment: u64) -> u64 {
        let addr = self.next_address.div_ceil(alignment) * alignment;
        self.next_address = addr + size.max(SIM_ALIGNMENT);
        addr
    }
}

impl Backend for SimDevice {
    fn name(&self) -> String {
        if self.inner.backed {
            "sim (backed)".to_string()
        } else {
            "sim (phantom)".to_string()
        }
    }

    fn kind(&self) -> &'static str {
        "sim"
    }

    fn device_index(&self) -> u32 {
        self.inner.index
    }

    fn malloc(&self, size: u64) -> Result<u64, BackendError> {
        let mut state = self.inner.state.lock();
        state.admit(size, self.inner.capacity)?;
        let addr = match state.planned_address(size) {
            Some(addr) => addr,
            None => state.take_addresses(size, SIM_ALIGNMENT),
        };
        let storage = self.inner.backed.then(|| Storage::zeroed(size));
        state.segments.insert(addr, Region { size, storage });
        state.used += size;
        state.counters.raw_allocs += 1;
        state.counters.outstanding_bytes += size;
        Ok(addr)
    }

    fn free(&self, addr: u64) -> Result<(), BackendError> {
        let mut state = self.inner.state.lock();
        let region = state
            .segments
            .remove(&addr)
            .ok_or(BackendError::InvalidAddress {
                addr,
                operation: "free",
            })?;
        state.used -= region.size;
        state.counters.raw_frees += 1;
        state.counters.outstanding_bytes -= region.size;
        Ok(())
    }

    fn mem_info(&self) -> MemInfo {
        let state = self.inner.state.lock();
        MemInfo {
            free: self.inner.capacity.saturating_sub(state.used),
            total: self.inner.capacity,
        }
    }

    fn create_stream(&self) -> Result<StreamId, BackendError> {
        let mut state = self.inner.state.lock();
        let id = state.next_stream;
        state.next_stream += 1;
        Ok(StreamId(id))
    }

    fn create_event(&self) -> Result<EventId, BackendError> {
        let mut state = self.inner.state.lock();
        let id = state.next_event;
        state.next_event += 1;
        state.events.insert(id, EventState::Created);
        Ok(EventId(id))
    }

    fn destroy_event(&self, event: EventId) -> Result<(), BackendError> {
        let mut state = self.inner.state.lock();
        state
            .events
            .remove(&event.0)
            .map(|_| ())
            .ok_or(BackendError::InvalidHandle {
                kind: "event",
                id: event.0,
            })
    }

    fn record_event(&self, event: EventId, stream: StreamId) -> Result<(), BackendError> {
        let mut state = self.inner.state.lock();
        SimDevice::check_stream(&state, stream)?;
        let manual = state.manual_events;
        let slot = state
            .events
            .get_mut(&event.0)
            .ok_or(BackendError::InvalidHandle {
                kind: "event",
                id: event.0,
            })?;
        *slot = if manual {
            EventState::Pending(stream)
        } else {
            EventState::Complete
        };
        Ok(())
    }

    fn query_event(&self, event: EventId) -> Result<bool, BackendError> {
        let state = self.inner.state.lock();
        match state.events.get(&event.0) {
            Some(EventState::Pending(_)) => Ok(false),
            Some(_) => Ok(true),
            None => Err(BackendError::InvalidHandle {
                kind: "event",
                id: event.0,
            }),
        }
    }

    fn stream_wait_event(&self, stream: StreamId, event: EventId) -> Result<(), BackendError> {
        let state = self.inner.state.lock();
        SimDevice::check_stream(&state, stream)?;
        if state.events.contains_key(&event.0) {
            Ok(())
        } else {
            Err(BackendError::InvalidHandle {
                kind: "event",
                id: event.0,
            })
        }
    }

    fn synchronize_stream(&self, stream: StreamId) -> Result<(), BackendError> {
        SimDevice::check_stream(&self.inner.state.lock(), stream)?;
        self.complete_stream(stream);
        Ok(())
    }

    fn synchronize(&self) -> Result<(), BackendError> {
        self.complete_all_events();
        Ok(())
    }

    fn memset(
        &self,
        addr: u64,
        value: u8,
        len: u64,
        _stream: StreamId,
    ) -> Result<(), BackendError> {
        self.with_range(addr, len, |bytes, _| bytes.fill(value))
    }

    fn copy_host_to_device(
        &self,
        dst: u64,
        src: &[u8],
        _stream: StreamId,
    ) -> Result<(), BackendError> {
        self.with_range(dst, src.len() as u64, |bytes, offset| {
            bytes.copy_from_slice(&src[offset as usize..offset as usize + bytes.len()]);
        })
    }

    fn copy_device_to_host(
        &self,
        dst: &mut [u8],
        src: u64,
        _stream: StreamId,
    ) -> Result<(), BackendError> {
        self.with_range(src, dst.len() as u64, |bytes, offset| {
            dst[offset as usize..offset as usize + bytes.len()].copy_from_slice(bytes);
        })
    }

    fn copy_device_to_device(
        &self,
        dst: u64,
        src: u64,
        len: u64,
        _stream: StreamId,
    ) -> Result<(), BackendError> {
        let data = self.read(src, len)?;
        self.with_range(dst, len, |bytes, offset| {
            bytes.copy_from_slice(&data[offset as usize..offset as usize + bytes.len()]);
        })
    }

    fn vm_granularity(&self) -> u64 {
        SIM_GRANULARITY
    }

    fn reserve_address_range(&self, size: u64) -> Result<u64, BackendError> {
        let mut state = self.inner.state.lock();
        let too_large = BackendError::OutOfMemory {
            requested: size,
            free: self.inner.capacity.saturating_sub(state.used),
        };
        let size = size
            .checked_next_multiple_of(SIM_GRANULARITY)
            .ok_or(too_large.clone())?;
        let room = state
            .next_address
            .checked_next_multiple_of(SIM_GRANULARITY)
            .and_then(|addr| addr.checked_add(size));
        if room.is_none() {
            return Err(too_large);
        }
        let addr = state.take_addresses(size, SIM_GRANULARITY);
        state.reservations.insert(addr, size);
        Ok(addr)
    }

    fn release_address_range(&self, addr: u64, size: u64) -> Result<(), BackendError> {
        let mut state = self.inner.state.lock();
        match state.reservations.get(&addr) {
            Some(&reserved) if reserved >= size => {
                // Runs never cross a reservation's bounds, so any run inside starts inside.
                if state.pages.range(addr..addr + reserved).next().is_some() {
                    return Err(BackendError::InvalidAddress {
                        addr,
                        operation: "release_address_range (pages still mapped)",
                    });
                }
                state.reservations.remove(&addr);
                Ok(())
            }
            _ => Err(BackendError::InvalidAddress {
                addr,
                operation: "release_address_range",
            }),
        }
    }

    fn map(&self, addr: u64, size: u64) -> Result<(), BackendError> {
        let end = addr.checked_add(size);
        if !addr.is_multiple_of(SIM_GRANULARITY)
            || !size.is_multiple_of(SIM_GRANULARITY)
            || size == 0
            || end.is_none()
        {
            return Err(BackendError::InvalidAddress {
                addr,
                operation: "map (range not page aligned)",
            });
        }
        let end = end.unwrap_or(u64::MAX);
        let mut state = self.inner.state.lock();
        let inside = state
            .reservations
            .range(..=addr)
            .next_back()
            .is_some_and(|(&base, &len)| end <= base + len);
        let overlaps_below = state
            .pages
            .range(..addr)
            .next_back()
            .is_some_and(|(&run, region)| run + region.size > addr);
        let overlaps = overlaps_below || state.pages.range(addr..end).next().is_some();
        if !inside || overlaps {
            return Err(BackendError::InvalidAddress {
                addr,
                operation: "map",
            });
        }
        state.admit(size, self.inner.capacity)?;
        // One entry for the whole run: a phantom device's cost does not grow with its size.
        let storage = self.inner.backed.then(|| Storage::zeroed(size));
        state.pages.insert(addr, Region { size, storage });
        state.used += size;
        state.counters.raw_allocs += 1;
        state.counters.outstanding_bytes += size;
        Ok(())
    }

    fn unmap(&self, addr: u64, size: u64) -> Result<(), BackendError> {
        let invalid = BackendError::InvalidAddress {
            addr,
            operation: "unmap",
        };
        let aligned = addr.is_multiple_of(SIM_GRANULARITY) && size.is_multiple_of(SIM_GRANULARITY);
        let end = match addr.checked_add(size) {
            Some(end) if size > 0 && aligned => end,
            _ => return Err(invalid),
        };
        let mut state = self.inner.state.lock();
        // The runs that hold the range, which must follow one another without a gap: the one
        // holding `addr`, then those starting inside the range.
        let first = state
            .pages
            .range(..=addr)
            .next_back()
            .filter(|(&run, region)| addr < run + region.size)
            .map(|(&run, _)| run);
        let Some(first) = first else {
            return Err(invalid);
        };
        let mut runs = vec![first];
        let mut covered = first + state.pages[&first].size;
        for (&run, region) in state.pages.range(first + 1..end) {
            if run != covered {
                return Err(invalid);
            }
            runs.push(run);
            covered = run + region.size;
        }
        if covered < end {
            return Err(invalid);
        }
        // Split the first and last runs where the range cuts them; the parts outside stay
        // mapped.
        let last = *runs.last().unwrap_or(&first);
        if covered > end {
            let region = state.pages.get_mut(&last).ok_or(invalid.clone())?;
            let keep = end - last;
            let storage = region.storage.as_mut().map(|s| s.split_off(keep));
            let after = region.size - keep;
            region.size = keep;
            state.pages.insert(
                end,
                Region {
                    size: after,
                    storage,
                },
            );
        }
        if first < addr {
            let region = state.pages.get_mut(&first).ok_or(invalid.clone())?;
            let keep = addr - first;
            let storage = region.storage.as_mut().map(|s| s.split_off(keep));
            let inside = region.size - keep;
            region.size = keep;
            state.pages.insert(
                addr,
                Region {
                    size: inside,
                    storage,
                },
            );
            runs[0] = addr;
        }
        for run in &runs {
            state.pages.remove(run);
        }
        state.used -= size;
        state.counters.raw_frees += 1;
        state.counters.outstanding_bytes -= size;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn planned_addresses_are_followed_while_free_and_skipped_ahead() {
        const MIB: u64 = 1 << 20;
        let dev = SimDevice::phantom(1 << 40);
        let base = 0x9000_0000_0000;
        dev.plan_addresses([
            (20 * MIB, base + 100 * MIB),
            (2 * MIB, base),
            (20 * MIB, base + 40 * MIB),
            (20 * MIB, base + 100 * MIB),
            (4 * MIB, base + 200 * MIB),
        ]);
        // In order, and the order need not be ascending.
        let first = dev.malloc(20 * MIB).unwrap();
        assert_eq!(first, base + 100 * MIB);
        assert_eq!(dev.malloc(2 * MIB).unwrap(), base);
        assert_eq!(dev.malloc(20 * MIB).unwrap(), base + 40 * MIB);
        // Planned where a live allocation still is: a fresh address above every planned one.
        let fresh = dev.malloc(20 * MIB).unwrap();
        assert!(fresh >= base + 204 * MIB, "{fresh:#x}");
        // A size the plan does not have: fresh, and the plan is kept.
        let other = dev.malloc(6 * MIB).unwrap();
        assert!(other >= fresh + 20 * MIB);
        assert_eq!(dev.malloc(4 * MIB).unwrap(), base + 200 * MIB);
        // The plan is used up.
        assert!(dev.malloc(2 * MIB).unwrap() > other);
        dev.free(first).unwrap();
    }

    #[test]
    fn a_planned_range_past_the_address_space_is_not_followed() {
        let dev = SimDevice::phantom(1 << 40);
        dev.plan_addresses([(4096, u64::MAX - 100), (4096, 0x9000_0000_0000)]);
        // The impossible entry is dropped; the next one is followed, and fresh addresses still
        // come after it.
        let first = dev.malloc(4096).unwrap();
        assert_eq!(first, 0x9000_0000_0000);
        assert!(dev.malloc(4096).unwrap() > first);
        dev.free(first).unwrap();
    }

    #[test]
    fn a_plan_skips_entries_of_other_sizes_within_its_lookahead() {
        let dev = SimDevice::phantom(1 << 40);
        let mut plan: Vec<(u64, u64)> = (0..PLAN_LOOKAHEAD as u64)
            .map(|i| (512, 0x9000_0000_0000 + i * 4096))
            .collect();
        plan.push((8192, 0xa000_0000_0000));
        dev.plan_addresses(plan.clone());
        // The 8 KiB entry is one past the lookahead: not found.
        assert_ne!(dev.malloc(8192).unwrap(), 0xa000_0000_0000);
        plan.remove(0);
        dev.plan_addresses(plan);
        assert_eq!(dev.malloc(8192).unwrap(), 0xa000_0000_0000);
        // The skipped entries are gone.
        assert!(dev.malloc(512).unwrap() > 0xa000_0000_0000);
    }

    #[test]
    fn raw_allocation_over_capacity_fails_like_cuda_malloc() {
        let dev = SimDevice::phantom(10 << 20);
        let a = dev.malloc(8 << 20).unwrap();
        assert!(matches!(
            dev.malloc(4 << 20),
            Err(BackendError::OutOfMemory { requested, free }) if requested == 4 << 20 && free == 2 << 20
        ));
        dev.free(a).unwrap();
        assert_eq!(dev.counters().outstanding_bytes, 0);
        assert!(dev.free(a).is_err());
    }

    #[test]
    fn phantom_device_holds_terabytes() {
        let dev = SimDevice::phantom(4 << 40);
        let a = dev.malloc(3 << 40).unwrap();
        assert_eq!(a % SIM_ALIGNMENT, 0);
        assert_eq!(dev.mem_info().free, 1 << 40);
        assert_eq!(
            dev.copy_host_to_device(a, &[1], StreamId::DEFAULT),
            Err(BackendError::NoBackingMemory)
        );
    }

    #[test]
    fn backed_device_copies_round_trip() {
        let dev = SimDevice::backed(1 << 20);
        let a = dev.malloc(4096).unwrap();
        assert_eq!(a % SIM_ALIGNMENT, 0);
        dev.copy_host_to_device(a + 10, b"hello", StreamId::DEFAULT)
            .unwrap();
        let b = dev.malloc(4096).unwrap();
        dev.copy_device_to_device(b, a + 10, 5, StreamId::DEFAULT)
            .unwrap();
        dev.memset(b + 5, b'!', 2, StreamId::DEFAULT).unwrap();
        let mut out = [0u8; 7];
        dev.copy_device_to_host(&mut out, b, StreamId::DEFAULT)
            .unwrap();
        assert_eq!(&out, b"hello!!");
        assert!(dev
            .copy_device_to_host(&mut out, a + 4093, StreamId::DEFAULT)
            .is_err());
    }

    #[test]
    fn injected_faults_fail_the_nth_attempt_only() {
        let dev = SimDevice::phantom(1 << 30);
        dev.fail_nth_raw_alloc(2);
        assert!(dev.malloc(512).is_ok());
        assert!(dev.malloc(512).is_err());
        assert!(dev.malloc(512).is_ok());
        assert_eq!(dev.counters().injected_failures, 1);
    }

    #[test]
    fn random_faults_are_reproducible() {
        let run = || {
            let dev = SimDevice::phantom(1 << 40);
            dev.fail_raw_allocs_randomly(0.3, 42);
            (0..200)
                .map(|_| dev.malloc(512).is_ok())
                .collect::<Vec<_>>()
        };
        let first = run();
        assert_eq!(first, run());
        let failures = first.iter().filter(|ok| !**ok).count();
        assert!((30..=90).contains(&failures), "{failures} failures");
    }

    #[test]
    fn manual_events_complete_when_told() {
        let dev = SimDevice::phantom(1 << 20);
        let s = dev.create_stream().unwrap();
        let e = dev.create_event().unwrap();
        dev.record_event(e, s).unwrap();
        assert!(dev.query_event(e).unwrap());
        dev.set_manual_events(true);
        dev.record_event(e, s).unwrap();
        assert!(!dev.query_event(e).unwrap());
        dev.complete_stream(StreamId::DEFAULT);
        assert!(!dev.query_event(e).unwrap());
        dev.complete_stream(s);
        assert!(dev.query_event(e).unwrap());
        assert!(dev.record_event(e, StreamId(99)).is_err());
    }

    #[test]
    fn virtual_memory_maps_pages_and_copies_across_them() {
        let dev = SimDevice::backed(16 << 20);
        let base = dev.reserve_address_range(8 << 20).unwrap();
        dev.map(base, 4 << 20).unwrap();
        assert_eq!(dev.mem_info().free, 12 << 20);
        let data: Vec<u8> = (0..=255).cycle().take(4096).collect();
        let at = base + SIM_GRANULARITY - 2048;
        dev.copy_host_to_device(at, &data, StreamId::DEFAULT)
            .unwrap();
        let mut back = vec![0; 4096];
        dev.copy_device_to_host(&mut back, at, StreamId::DEFAULT)
            .unwrap();
        assert_eq!(back, data);
        assert!(dev.map(base, 2 << 20).is_err(), "double map");
        assert!(dev.release_address_range(base, 8 << 20).is_err());
        dev.unmap(base + (2 << 20), 2 << 20).unwrap();
        dev.unmap(base, 2 << 20).unwrap();
        dev.release_address_range(base, 8 << 20).unwrap();
        assert_eq!(dev.counters().outstanding_bytes, 0);
    }

    #[test]
    fn a_huge_map_costs_one_entry_not_one_per_page() {
        // 2^40 bytes are 524,288 pages of 2 MiB: kept as one run.
        let dev = SimDevice::phantom(1 << 41);
        let base = dev.reserve_address_range(1 << 40).unwrap();
        dev.map(base, 1 << 40).unwrap();
        assert_eq!(dev.inner.state.lock().pages.len(), 1);
        assert_eq!(dev.mem_info().free, 1 << 40);
        // Unmapping the middle splits the run in two, whatever the sizes.
        dev.unmap(base + (1 << 39), 1 << 38).unwrap();
        assert_eq!(dev.inner.state.lock().pages.len(), 2);
        assert_eq!(dev.counters().outstanding_bytes, (1 << 40) - (1 << 38));
        // The hole maps again; overlapping what is mapped does not.
        assert!(dev
            .map(base + (1 << 39) - SIM_GRANULARITY, 1 << 30)
            .is_err());
        dev.map(base + (1 << 39), 1 << 38).unwrap();
        assert_eq!(dev.inner.state.lock().pages.len(), 3);
        // One unmap may span several runs that follow one another.
        dev.unmap(base, 1 << 40).unwrap();
        assert!(dev.inner.state.lock().pages.is_empty());
        assert_eq!(dev.counters().outstanding_bytes, 0);
        dev.release_address_range(base, 1 << 40).unwrap();
    }

    #[test]
    fn a_map_of_2_pow_49_bytes_is_cheap() {
        // The size a hostile trace asked for (issue 17): one entry, at once.
        let dev = SimDevice::phantom(1 << 50);
        let base = dev.reserve_address_range(1 << 49).unwrap();
        dev.map(base, 1 << 49).unwrap();
        dev.unmap(base + SIM_GRANULARITY, (1 << 49) - 2 * SIM_GRANULARITY)
            .unwrap();
        assert_eq!(dev.inner.state.lock().pages.len(), 2);
        assert_eq!(dev.counters().outstanding_bytes, 2 * SIM_GRANULARITY);
        // Address space that cannot exist is refused, not wrapped around.
        assert!(dev.reserve_address_range(u64::MAX - 5).is_err());
        assert!(dev.map(base, u64::MAX - SIM_GRANULARITY + 1).is_err());
    }

    #[test]
    fn unmap_needs_whole_mapped_pages_without_gaps() {
        let dev = SimDevice::backed(64 << 20);
        let base = dev.reserve_address_range(16 << 20).unwrap();
        dev.map(base, 4 << 20).unwrap();
        dev.map(base + (6 << 20), 4 << 20).unwrap();
        // A gap between the runs, a range past the end, or a range not page aligned.
        assert!(dev.unmap(base, 10 << 20).is_err());
        assert!(dev.unmap(base + (8 << 20), 4 << 20).is_err());
        assert!(dev.unmap(base + 4096, 2 << 20).is_err());
        assert!(dev.unmap(base, 0).is_err());
        assert_eq!(dev.counters().outstanding_bytes, 8 << 20);
        // Data on either side of a cut survives the split.
        dev.copy_host_to_device(base + (4 << 20) - 3, b"abc", StreamId::DEFAULT)
            .unwrap();
        dev.copy_host_to_device(base + (6 << 20), b"xyz", StreamId::DEFAULT)
            .unwrap();
        dev.unmap(base, 2 << 20).unwrap();
        dev.unmap(base + (8 << 20), 2 << 20).unwrap();
        let mut out = [0u8; 3];
        dev.copy_device_to_host(&mut out, base + (4 << 20) - 3, StreamId::DEFAULT)
            .unwrap();
        assert_eq!(&out, b"abc");
        dev.copy_device_to_host(&mut out, base + (6 << 20), StreamId::DEFAULT)
            .unwrap();
        assert_eq!(&out, b"xyz");
        assert!(dev
            .copy_device_to_host(&mut out, base + (2 << 20) - 1, StreamId::DEFAULT)
            .is_err());
        dev.unmap(base + (2 << 20), 2 << 20).unwrap();
        dev.unmap(base + (6 << 20), 2 << 20).unwrap();
        assert_eq!(dev.counters().outstanding_bytes, 0);
        dev.release_address_range(base, 16 << 20).unwrap();
    }
}
