//! The bounded event ring: every allocator event, in order, in fixed memory.
//!
//! `crate::allocator` pushes a compact [`RawEvent`] under its device lock; when the ring is full
//! the oldest entry is overwritten and counted as dropped, so recording never allocates past the
//! configured `max_entries` and never waits for a reader. Snapshots and the telemetry publisher
//! read the ring by sequence number and convert entries into the model's `Event`.

use std::mem::MaybeUninit;

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

/// Events in each of the ring's first chunks (224 KiB of events), in small pages.
const SMALL_BITS: u32 = 12;
const SMALL: usize = 1 << SMALL_BITS;
/// The first chunks: a ring that records fewer than `SMALL_CHUNKS * SMALL` (65,536) events
/// (3.5 MiB) takes its memory 224 KiB at a time, as before huge pages: a huge page is filled
/// only where the ring has already held almost twice as much, and the peer benchmark's
/// passes over the realistic traces (15,000 to 45,000 events) run as they did.
const SMALL_CHUNKS: usize = 16;
/// Slots in the small chunks.
const FIRST: usize = SMALL_CHUNKS * SMALL;
/// Bytes of every later chunk: one huge page of the processor (2 MiB on x86-64 and arm64).
const HUGE_BYTES: usize = 2 << 20;
/// Events in every later chunk: as many as fill [`HUGE_BYTES`].
const HUGE: usize = HUGE_BYTES / std::mem::size_of::<RawEvent>();

/// A chunk after the small ones, aligned to its size, so that the kernel can back it with
/// one huge page: one fault and one zeroing of 2 MiB instead of 512 of 4 KiB each, which on a
/// virtual machine costs a quarter as much (issue 47: 5.6 against 23 ms per 64 MiB). Where
/// the kernel compacts memory to find a huge page (`defrag` set to `madvise`), that fault can
/// wait for it: once a chunk, at most `capacity / HUGE` times in a ring's life (27 at the
/// default capacity), where small pages fault 512 times a chunk.
#[repr(C, align(2097152))]
struct HugeChunk([MaybeUninit<RawEvent>; HUGE]);

/// The storage of a chunk: a slice of the system allocator's alignment (the small chunks and
/// the last, when the capacity ends inside it), or a [`HugeChunk`].
enum Chunk {
    Small(Box<[MaybeUninit<RawEvent>]>),
    Huge(Box<HugeChunk>),
}

impl Chunk {
    /// A chunk of `room` slots, its pages populated.
    fn new(room: usize) -> Chunk {
        if room == HUGE {
            let memory = Box::<HugeChunk>::new_uninit();
            // A `MaybeUninit` array needs no initialisation, so the uninitialised box is one.
            // SAFETY: every bit pattern, uninitialised ones included, is a valid
            // `[MaybeUninit<RawEvent>; HUGE]`, and `HugeChunk` is that array alone.
            let mut memory = unsafe { memory.assume_init() };
            prefault::populate(&mut *memory, true);
            Chunk::Huge(memory)
        } else {
            let mut memory = Box::new_uninit_slice(room);
            prefault::populate(&mut *memory, false);
            Chunk::Small(memory)
        }
    }

    fn slots(&self) -> &[MaybeUninit<RawEvent>] {
        match self {
            Chunk::Small(memory) => memory,
            Chunk::Huge(memory) => &memory.0,
        }
    }

    fn slots_mut(&mut self) -> &mut [MaybeUninit<RawEvent>] {
        match self {
            Chunk::Small(memory) => memory,
            Chunk::Huge(memory) => &mut memory.0,
        }
    }
}

/// The chunk of a slot and its index there: [`SMALL`] slots a chunk for the first
/// [`FIRST`], then [`HUGE`] slots a chunk.
#[inline]
fn locate(slot: usize) -> (usize, usize) {
    match slot.checked_sub(FIRST) {
        None => (slot >> SMALL_BITS, slot & (SMALL - 1)),
        Some(later) => (SMALL_CHUNKS + later / HUGE, later % HUGE),
    }
}

/// The first slot of chunk `chunk`, and how many slots it has when the ring does not end
/// inside it.
fn chunk_span(chunk: usize) -> (usize, usize) {
    match chunk.checked_sub(SMALL_CHUNKS) {
        None => (chunk * SMALL, SMALL),
        Some(later) => (FIRST + later * HUGE, HUGE),
    }
}

/// A ring of at most `capacity` events, stored in chunks that are allocated as the ring
/// fills and never moved: growing costs no copy of what is already recorded. The first chunks
/// are small, so that a ring that records little takes little; the later ones are a huge
/// page each, which the kernel faults in cheapest.
///
/// A push writes at a cursor into the current chunk and moves it on, with one comparison
/// against the end of the run of slots it may write without looking further (the end of the
/// chunk, or of the ring). Only when the cursor reaches that end does a push work out where
/// the next slot is: in the next chunk, made then if the ring is still filling, or back at
/// the first slot once it is full. How many events the ring holds and how many it overwrote
/// follow from the sequence number alone.
pub(crate) struct EventRing {
    /// The chunks, of the slots [`locate`] puts in them, the last one cut at `capacity`.
    /// A slot is written before it is read: [`EventRing::since`] reads only the slots of the
    /// sequence numbers still held, each written by its push.
    chunks: Vec<Chunk>,
    capacity: usize,
    next_seq: u64,
    /// The slot the next event goes to, while it lies before `end`: a pointer into the
    /// current chunk (dangling, and equal to `end`, before the first push).
    cursor: *mut MaybeUninit<RawEvent>,
    /// One past the last slot of the current chunk.
    end: *mut MaybeUninit<RawEvent>,
}

// SAFETY: `cursor` and `end` point into the ring's own chunks (heap memory it owns and never
// shares), so moving the ring to another thread moves what they point to with it; they are
// only used through `&mut self`.
unsafe impl Send for EventRing {}

impl EventRing {
    /// An empty ring that holds up to `capacity` events (at least one).
    pub fn new(capacity: usize) -> EventRing {
        EventRing {
            chunks: Vec::new(),
            capacity: capacity.max(1),
            next_seq: 0,
            cursor: std::ptr::null_mut(),
            end: std::ptr::null_mut(),
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
        self.next_seq = seq + 1;
        if self.cursor == self.end {
            self.next_run();
        }
        let slot = self.cursor;
        // SAFETY: `cursor` lies before `end` (`next_run` made it so if it did not), inside the
        // current chunk, which the ring owns and `&mut self` borrows exclusively.
        unsafe {
            (*slot).write(make());
            self.cursor = slot.add(1);
        }
        seq
    }

    /// Moves the cursor to the slot of sequence number `next_seq - 1` (the event being pushed)
    /// when the current run of slots is used up: the start of the next chunk, made now while
    /// the ring fills, or the first slot once the ring wraps.
    #[cold]
    #[inline(never)]
    fn next_run(&mut self) {
        let slot = ((self.next_seq - 1) % self.capacity as u64) as usize;
        let (chunk, index) = locate(slot);
        if chunk == self.chunks.len() {
            let (start, full) = chunk_span(chunk);
            let room = (self.capacity - start).min(full);
            self.chunks.push(Chunk::new(room));
        }
        let range = self.chunks[chunk].slots_mut().as_mut_ptr_range();
        // SAFETY: `index` is below the chunk's length: every chunk but the last holds all
        // the slots `locate` puts in it, and the last holds those up to `capacity`, above
        // `slot`.
        self.cursor = unsafe { range.start.add(index) };
        self.end = range.end;
    }

    /// Events held (at most `capacity`).
    fn len(&self) -> usize {
        self.next_seq.min(self.capacity as u64) as usize
    }

    /// Events overwritten before anyone read them from the ring.
    pub fn overwritten(&self) -> u64 {
        self.next_seq - self.len() as u64
    }

    /// The sequence number the next event will get.
    pub fn next_seq(&self) -> u64 {
        self.next_seq
    }

    /// The oldest sequence number still held.
    pub fn oldest_seq(&self) -> u64 {
        self.next_seq - self.len() as u64
    }

    /// Events with sequence number ≥ `from` still held, oldest first, at most `limit` of them,
    /// each with its sequence number.
    pub fn since(&self, from: u64, limit: usize) -> impl Iterator<Item = (u64, &RawEvent)> + '_ {
        let start = from.max(self.oldest_seq());
        let cap = self.capacity as u64;
        (start..self.next_seq).take(limit).map(move |seq| {
            let (chunk, index) = locate((seq % cap) as usize);
            let memory = &self.chunks[chunk].slots()[index];
            // SAFETY: `seq` is held (from the oldest held to the last pushed), so its push
            // wrote this slot, and no later push has reused it yet.
            (seq, unsafe { memory.assume_init_ref() })
        })
    }

    /// Bytes the ring can occupy when full.
    pub fn max_bytes(&self) -> usize {
        self.capacity * std::mem::size_of::<RawEvent>()
    }
}

/// Faulting in a new chunk's pages before the hot path writes them. A chunk is fresh memory
/// from the system: written one event at a time, each page's first write traps into the
/// kernel, which on a virtual machine costs microseconds, more than the events that fill the
/// page. Asking the kernel to populate the whole range in one call does the same work without
/// the traps, and in a huge page, where it can, with one fault for 2 MiB. Where the kernel
/// cannot (before Linux 5.14, or elsewhere), nothing happens and the pages fault in as they
/// are written.
mod prefault {
    /// Populates, writable, the whole pages inside `memory` (its padding included); with
    /// `huge`, asks first for huge pages there (which the kernel gives where it has them and
    /// can, else small ones).
    #[cfg(target_os = "linux")]
    pub(super) fn populate<M: ?Sized>(memory: &mut M, huge: bool) {
        // SAFETY: sysconf reads a constant of the system and touches no memory of ours.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        let Ok(page) = usize::try_from(page) else {
            return;
        };
        if page == 0 {
            return;
        }
        let start = (memory as *mut M).cast::<u8>() as usize;
        let end = start + std::mem::size_of_val(memory);
        let first = start.div_ceil(page) * page;
        let last = end / page * page;
        if last <= first {
            return;
        }
        if !huge && resident(first, last - first, page) {
            return;
        }
        // SAFETY: [first, last) lies inside `memory`, which we borrow mutably and which is
        // mapped and writable (fresh memory of the system allocator). MADV_HUGEPAGE only
        // marks the range as one where huge pages are welcome, and MADV_POPULATE_WRITE only
        // faults its pages in, as a write to each would, neither changing a byte; an error
        // (an old kernel, or huge pages turned off) leaves the memory as it was.
        unsafe {
            if huge {
                libc::madvise(
                    first as *mut libc::c_void,
                    last - first,
                    libc::MADV_HUGEPAGE,
                );
            }
            libc::madvise(
                first as *mut libc::c_void,
                last - first,
                libc::MADV_POPULATE_WRITE,
            );
        }
    }

    /// Pages a residency probe looks at, at most: a small chunk's 56 (224 KiB) fit.
    #[cfg(target_os = "linux")]
    const PROBED_PAGES: usize = 64;

    /// Whether every page of the page-aligned range `[start, start + len)` is already in
    /// memory: a small chunk that the system allocator handed back from memory it had freed
    /// before (an allocator made after another one dropped its ring, as the peer benchmark
    /// makes one a pass), where populating finds nothing to fault in but still walks the
    /// range page by page (`follow_page_pte`: 4 % of a pass of `scattered` with events,
    /// 2–4 % on the realistic traces). `mincore` reads the page tables without that walk.
    /// Ranges longer than [`PROBED_PAGES`] pages, and any error, count as not resident.
    #[cfg(target_os = "linux")]
    pub(super) fn resident(start: usize, len: usize, page: usize) -> bool {
        let pages = len / page;
        if pages == 0 || pages > PROBED_PAGES {
            return false;
        }
        let mut flags = [0u8; PROBED_PAGES];
        // SAFETY: `start` is page-aligned and `[start, start + len)` is mapped (it lies inside
        // the caller's allocation); `flags` has room for one byte per page of the range,
        // which is all `mincore` writes.
        let status = unsafe { libc::mincore(start as *mut libc::c_void, len, flags.as_mut_ptr()) };
        status == 0 && flags[..pages].iter().all(|f| f & 1 != 0)
    }

    /// Elsewhere the pages fault in as they are written.
    #[cfg(not(target_os = "linux"))]
    pub(super) fn populate<M: ?Sized>(_memory: &mut M, _huge: bool) {}
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

    #[cfg(target_os = "linux")]
    #[test]
    fn residency_is_told_apart_from_fresh_pages() {
        // SAFETY: sysconf reads a constant of the system.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as usize;
        let len = 8 * page;
        // SAFETY: a fresh private anonymous mapping of `len` bytes, unmapped below; nothing
        // else refers to it.
        let start = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(start, libc::MAP_FAILED);
        let base = start as usize;
        assert!(!prefault::resident(base, len, page), "fresh pages");
        // SAFETY: the first page lies inside the mapping, which is writable.
        unsafe { (start as *mut u8).write(1) };
        assert!(!prefault::resident(base, len, page), "one page of eight");
        for i in 0..8 {
            // SAFETY: page `i` lies inside the mapping.
            unsafe { (start as *mut u8).add(i * page).write(1) };
        }
        assert!(prefault::resident(base, len, page), "every page written");
        // Longer than a probe looks at: counted as not resident, so populated.
        assert!(!prefault::resident(base, 65 * page, page));
        // SAFETY: unmaps the mapping made above, which nothing uses any more.
        assert_eq!(unsafe { libc::munmap(start, len) }, 0);
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
    fn a_ring_of_one_keeps_the_newest_event() {
        let mut ring = EventRing::new(0);
        assert_eq!(ring.since(0, usize::MAX).count(), 0);
        for i in 0..4 {
            assert_eq!(ring.push(event(i)), i);
            let held: Vec<(u64, u64)> = ring
                .since(0, usize::MAX)
                .map(|(s, e)| (s, e.size))
                .collect();
            assert_eq!(held, vec![(i, i)]);
            assert_eq!(ring.overwritten(), i);
        }
        assert_eq!(ring.chunks.len(), 1);
        assert_eq!(ring.max_bytes(), 56);
    }

    #[test]
    fn a_ring_of_whole_chunks_wraps_at_their_ends() {
        let capacity = FIRST + HUGE;
        let mut ring = EventRing::new(capacity);
        let total = (capacity * 5 + 3) as u64;
        for i in 0..total {
            assert_eq!(ring.push(event(i)), i);
        }
        assert_eq!(ring.chunks.len(), SMALL_CHUNKS + 1);
        assert!(ring.chunks[..SMALL_CHUNKS]
            .iter()
            .all(|c| matches!(c, Chunk::Small(m) if m.len() == SMALL)));
        // The chunk after the small ones is a whole huge page, aligned to one.
        assert!(matches!(ring.chunks[SMALL_CHUNKS], Chunk::Huge(_)));
        assert_eq!(
            ring.chunks[SMALL_CHUNKS].slots().as_ptr() as usize % HUGE_BYTES,
            0
        );
        assert_eq!(std::mem::size_of::<HugeChunk>(), HUGE_BYTES);
        assert_eq!(ring.oldest_seq(), total - capacity as u64);
        let held: Vec<(u64, u64)> = ring
            .since(0, usize::MAX)
            .map(|(s, e)| (s, e.size))
            .collect();
        assert_eq!(held.len(), capacity);
        assert!(held.iter().all(|&(seq, size)| seq == size));
        assert!(held.windows(2).all(|w| w[1].0 == w[0].0 + 1));
    }

    #[test]
    fn ring_spanning_several_chunks_wraps_in_order() {
        let capacity = FIRST + HUGE + 100;
        let mut ring = EventRing::new(capacity);
        let total = (capacity * 3 + 17) as u64;
        for i in 0..total {
            assert_eq!(ring.push(event(i)), i);
            // Across the end of a small chunk, of the small ones, and of the huge one.
            for end in [SMALL, FIRST, FIRST + HUGE] {
                if i == (end + 5) as u64 {
                    let sizes: Vec<u64> =
                        ring.since(end as u64 - 2, 4).map(|(_, e)| e.size).collect();
                    let first = end as u64 - 2;
                    assert_eq!(sizes, vec![first, first + 1, first + 2, first + 3]);
                }
            }
        }
        assert_eq!(
            ring.chunks.len(),
            SMALL_CHUNKS + 2,
            "storage never exceeds the capacity"
        );
        assert!(matches!(ring.chunks[SMALL_CHUNKS], Chunk::Huge(_)));
        assert!(
            matches!(ring.chunks[SMALL_CHUNKS + 1], Chunk::Small(ref m) if m.len() == 100),
            "the last is cut"
        );
        assert_eq!(
            ring.chunks.iter().map(|c| c.slots().len()).sum::<usize>(),
            capacity
        );
        assert_eq!(ring.overwritten(), total - capacity as u64);
        assert_eq!(ring.oldest_seq(), total - capacity as u64);
        let held: Vec<u64> = ring.since(0, usize::MAX).map(|(_, e)| e.size).collect();
        assert_eq!(held.len(), capacity);
        assert!(held.iter().copied().eq(total - capacity as u64..total));
    }
}
