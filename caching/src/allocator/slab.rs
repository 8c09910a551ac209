//! A vector of slots addressed by `u32` ids, with a free list of vacant slots: the storage of
//! the allocator's block and segment metadata (`super::state::State::blocks` and `segments`).
//!
//! Block ids are what the state links blocks with (`prev`, `next`, a segment's `first` and
//! `last`), what the free lists (`crate::free_index`) and the raw-pointer map hold, and what a
//! [`BlockHandle`](super::BlockHandle) or a `DeviceBuffer` frees by, so that reads of the block
//! metadata, the commonest thing the policy does, cost one indexed load.

/// A vector of slots with a free list, addressed by `u32` ids. Vacant slots keep their last
/// value (debug builds check that only live slots are read). `slots` only grows, so an id once
/// handed out stays in bounds: `get` and `get_mut` skip the bounds check, which the block
/// metadata reads of every operation would otherwise repeat (about 5 % of the instructions of
/// an allocation and free).
pub(super) struct Slab<T> {
    slots: Vec<T>,
    vacant: Vec<u32>,
    #[cfg(debug_assertions)]
    live: Vec<bool>,
}

impl<T: Copy> Slab<T> {
    /// An empty slab.
    pub(super) fn new() -> Self {
        Slab {
            slots: Vec::new(),
            vacant: Vec::new(),
            #[cfg(debug_assertions)]
            live: Vec::new(),
        }
    }
    /// Stores `value` in a vacant slot (the last one vacated) or a new one; returns its id.
    #[inline]
    pub(super) fn insert(&mut self, value: T) -> u32 {
        let id = if let Some(id) = self.vacant.pop() {
            self.slots[id as usize] = value;
            id
        } else {
            self.slots.push(value);
            #[cfg(debug_assertions)]
            self.live.push(false);
            (self.slots.len() - 1) as u32
        };
        #[cfg(debug_assertions)]
        {
            self.live[id as usize] = true;
        }
        id
    }
    /// Vacates slot `id`, returning its value.
    #[inline]
    pub(super) fn remove(&mut self, id: u32) -> T {
        #[cfg(debug_assertions)]
        {
            assert!(self.live[id as usize], "slab slot {id} removed twice");
            self.live[id as usize] = false;
        }
        self.vacant.push(id);
        self.slots[id as usize]
    }
    /// The value of live slot `id`.
    #[inline]
    pub(super) fn get(&self, id: u32) -> &T {
        #[cfg(debug_assertions)]
        debug_assert!(self.live[id as usize], "slab slot {id} is vacant");
        // SAFETY: ids come from `insert`, which returns an index below `slots.len()`, and
        // `slots` never shrinks; ids from outside the allocator (a `BlockHandle` or a
        // `DeviceBuffer`) are looked up with `slot`, which checks them against `slots.len()`,
        // before they reach here. Debug
        // builds (all tests) also index `live` above, which panics on any id out of bounds.
        unsafe { self.slots.get_unchecked(id as usize) }
    }
    /// The value of live slot `id`, to change.
    #[inline]
    pub(super) fn get_mut(&mut self, id: u32) -> &mut T {
        #[cfg(debug_assertions)]
        debug_assert!(self.live[id as usize], "slab slot {id} is vacant");
        // SAFETY: as in `get`.
        unsafe { self.slots.get_unchecked_mut(id as usize) }
    }
    /// The slot `id` whether live or vacant (a vacant slot holds its last value), or `None`
    /// past the end: for ids from outside the allocator (a `DeviceBuffer`'s or a
    /// [`BlockHandle`](super::BlockHandle)'s), which the caller then checks against the block
    /// it expects.
    #[inline]
    pub(super) fn slot(&self, id: u32) -> Option<&T> {
        self.slots.get(id as usize)
    }
    /// The live slots and their ids, in id order.
    pub(super) fn iter(&self) -> impl Iterator<Item = (u32, &T)> {
        let mut vacant = vec![false; self.slots.len()];
        for &id in &self.vacant {
            vacant[id as usize] = true;
        }
        self.slots
            .iter()
            .enumerate()
            .filter(move |(i, _)| !vacant[*i])
            .map(|(i, v)| (i as u32, v))
    }
    /// The number of live slots.
    pub(super) fn len(&self) -> usize {
        self.slots.len() - self.vacant.len()
    }
}
