//! The bounded event ring: every allocator event, in order, in fixed memory.
//!
//! `crate::allocator` pushes a compact [`RawEvent`] under its device lock; when the ring is full
//! the oldest entry is overwritten and counted as dropped, so recording never allocates past the
//! configured `max_entries` and never waits for a reader. Snapshots and the telemetry publisher
//! read the ring by sequence number and convert entries into the model's `Event`.

use vramscope_model::EventKind;

/// One event as the ring stores it: 56 bytes, provenance as an interned id. Its sequence
/// number is not stored: it is the slot's, which [`EventRing::since`] hands out beside it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct RawEvent {
    pub time_ns: u64,
    pub addr: u64,
    pub size: u64,
    pub requested: u64,
    pub stream: u64,
    pub provenance: u32,
    pub step: u32,
    pub kind: EventKind,
}

/// Events per chunk of the ring's storage (256 KiB of events).
const CHUNK_BITS: u32 = 12;
const CHUNK: usize = 1 << CHUNK_BITS;

/// A ring of at most `capacity` events, stored in fixed chunks of [`CHUNK`] events that are
/// allocated as the ring fills and never moved: growing costs no copy of what is already
/// recorded, and chunks of one size are what the system allocator recycles best when a
/// program makes allocators one after another.
pub(crate) struct EventRing {
    chunks: Vec<Vec<RawEvent>>,
    capacity: usize,
    /// Events held (at most `capacity`).
    len: usize,
    /// The slot the next event goes to.
    next_slot: usize,
    next_seq: u64,
    overwritten: u64,
}

impl EventRing {
    /// An empty ring that holds up to `capacity` events (at least one).
    pub fn new(capacity: usize) -> EventRing {
        EventRing {
            chunks: Vec::new(),
            capacity: capacity.max(1),
            len: 0,
            next_slot: 0,
            next_seq: 0,
            overwritten: 0,
        }
    }

    /// Appends an event, returning its sequence number; overwrites the oldest when full.
    #[cfg(test)]
    pub fn push(&mut self, event: RawEvent) -> u64 {
        self.push_with(|| event)
    }

    /// Appends the event `make` builds, returning its sequence number; overwrites the oldest
    /// when full. The event is built where it is stored, so on the hot path its fields go from
    /// registers straight into the ring's slot.
    #[inline(always)]
    pub fn push_with(&mut self, make: impl FnOnce() -> RawEvent) -> u64 {
        let seq = self.next_seq;
        self.next_seq += 1;
        let slot = self.next_slot;
        self.next_slot = if slot + 1 == self.capacity {
            0
        } else {
            slot + 1
        };
        if self.len < self.capacity {
            self.len += 1;
            // Only the last chunk can have room, and the ring is not full, so a chunk shorter
            // than `CHUNK` takes the event. A chunk is made with room for every event it will
            // hold, so the room is there without growing the vector.
            match self.chunks.last_mut() {
                Some(chunk) if chunk.len() < CHUNK && chunk.len() < chunk.capacity() => {
                    let len = chunk.len();
                    chunk.spare_capacity_mut()[0].write(make());
                    // SAFETY: the element at `len`, within the capacity, was just written.
                    unsafe { chunk.set_len(len + 1) };
                }
                _ => self.append_slow(make()),
            }
        } else {
            self.chunks[slot >> CHUNK_BITS][slot & (CHUNK - 1)] = make();
            self.overwritten += 1;
        }
        seq
    }

    /// Stores an event while the ring fills when the last chunk has no room: in a new chunk.
    #[cold]
    #[inline(never)]
    fn append_slow(&mut self, event: RawEvent) {
        match self.chunks.last_mut() {
            // A chunk shorter than `CHUNK` at its capacity cannot occur while the ring is not
            // full (every chunk is made with the room it will hold); should it, the vector
            // grows, and the slot arithmetic stays right.
            Some(chunk) if chunk.len() < CHUNK => chunk.push(event),
            _ => {
                let room = (self.capacity - self.chunks.len() * CHUNK).min(CHUNK);
                let mut chunk = Vec::with_capacity(room);
                prefault::populate(chunk.spare_capacity_mut());
                chunk.push(event);
                self.chunks.push(chunk);
            }
        }
    }

    /// Events overwritten before anyone read them from the ring.
    pub fn overwritten(&self) -> u64 {
        self.overwritten
    }

    /// The sequence number the next event will get.
    pub fn next_seq(&self) -> u64 {
        self.next_seq
    }

    /// The oldest sequence number still held.
    pub fn oldest_seq(&self) -> u64 {
        self.next_seq - self.len as u64
    }

    /// Events with sequence number ≥ `from` still held, oldest first, at most `limit` of them,
    /// each with its sequence number.
    pub fn since(&self, from: u64, limit: usize) -> impl Iterator<Item = (u64, &RawEvent)> + '_ {
        let start = from.max(self.oldest_seq());
        let cap = self.capacity as u64;
        (start..self.next_seq).take(limit).map(move |seq| {
            let slot = (seq % cap) as usize;
            (seq, &self.chunks[slot >> CHUNK_BITS][slot & (CHUNK - 1)])
        })
    }

    /// Bytes the ring can occupy when full.
    pub fn max_bytes(&self) -> usize {
        self.capacity * std::mem::size_of::<RawEvent>()
    }
}

/// Faulting in a new chunk's pages before the hot path writes them. A chunk of 256 KiB is fresh
/// memory from the system (64 pages): written one event at a time, each page's first write
/// traps into the kernel, which on a virtual machine costs microseconds, more than the events
/// that fill the page. Asking the kernel to populate the whole range in one call does the same
/// work without the traps. Where the kernel cannot (before Linux 5.14, or elsewhere), nothing
/// happens and the pages fault in as they are written, as before.
mod prefault {
    use std::mem::MaybeUninit;

    /// Populates, writable, the whole pages inside `memory`.
    #[cfg(target_os = "linux")]
    pub(super) fn populate<T>(memory: &mut [MaybeUninit<T>]) {
        // SAFETY: sysconf reads a constant of the system and touches no memory of ours.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        let Ok(page) = usize::try_from(page) else {
            return;
        };
        if page == 0 {
            return;
        }
        let start = memory.as_mut_ptr() as usize;
        let end = start + std::mem::size_of_val(memory);
        let first = start.div_ceil(page) * page;
        let last = end / page * page;
        if last <= first {
            return;
        }
        // SAFETY: [first, last) lies inside `memory`, which we borrow mutably and which is
        // mapped and writable (it is the spare capacity of a vector). MADV_POPULATE_WRITE only
        // faults those pages in, as a write to each would, without changing a byte; an error
        // (an old kernel that does not know it) leaves the memory as it was.
        unsafe {
            libc::madvise(
                first as *mut libc::c_void,
                last - first,
                libc::MADV_POPULATE_WRITE,
            );
        }
    }

    /// Elsewhere the pages fault in as they are written.
    #[cfg(not(target_os = "linux"))]
    pub(super) fn populate<T>(_memory: &mut [MaybeUninit<T>]) {}
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(size: u64) -> RawEvent {
        RawEvent {
            time_ns: 0,
            addr: 0,
            size,
            requested: 0,
            stream: 0,
            provenance: 0,
            step: 0,
            kind: EventKind::Alloc,
        }
    }

    #[test]
    fn raw_event_is_56_bytes() {
        assert_eq!(std::mem::size_of::<RawEvent>(), 56);
    }

    #[test]
    fn ring_overwrites_oldest_and_counts() {
        let mut ring = EventRing::new(3);
        for i in 0..5 {
            assert_eq!(ring.push(event(i)), i);
        }
        assert_eq!(ring.overwritten(), 2);
        assert_eq!(ring.oldest_seq(), 2);
        let sizes: Vec<u64> = ring.since(0, usize::MAX).map(|(_, e)| e.size).collect();
        assert_eq!(sizes, vec![2, 3, 4]);
        let seqs: Vec<u64> = ring.since(3, 1).map(|(seq, _)| seq).collect();
        assert_eq!(seqs, vec![3]);
        assert_eq!(ring.since(5, 10).count(), 0);
    }

    #[test]
    fn ring_spanning_several_chunks_wraps_in_order() {
        let capacity = CHUNK * 2 + 100;
        let mut ring = EventRing::new(capacity);
        let total = (capacity * 3 + 17) as u64;
        for i in 0..total {
            assert_eq!(ring.push(event(i)), i);
            if i == (CHUNK + 5) as u64 {
                let sizes: Vec<u64> = ring
                    .since(CHUNK as u64 - 2, 4)
                    .map(|(_, e)| e.size)
                    .collect();
                let first = CHUNK as u64 - 2;
                assert_eq!(sizes, vec![first, first + 1, first + 2, first + 3]);
            }
        }
        assert_eq!(ring.chunks.len(), 3, "storage never exceeds the capacity");
        assert_eq!(
            ring.chunks.iter().map(Vec::capacity).sum::<usize>(),
            capacity
        );
        assert_eq!(ring.overwritten(), total - capacity as u64);
        assert_eq!(ring.oldest_seq(), total - capacity as u64);
        let held: Vec<u64> = ring.since(0, usize::MAX).map(|(_, e)| e.size).collect();
        assert_eq!(held.len(), capacity);
        assert!(held.iter().copied().eq(total - capacity as u64..total));
    }
}
