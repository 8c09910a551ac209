//! The ordered index of one free list: free blocks by (size, address), smallest first.
//!
//! `crate::caching` keeps one index per (stream, pool) and asks it for the first block at or
//! after a key (PyTorch's best fit: `lower_bound` on a set ordered by size, then address).
//! Most free lists hold a handful of blocks, where a sorted vector beats a B-tree on every
//! operation and never allocates on the fast path; a list that grows past [`SMALL_MAX`] entries
//! (a fragmented pool) moves to a `BTreeMap` so that no operation degrades to a long memmove,
//! and moves back when it shrinks below [`SMALL_MIN`].

use std::collections::BTreeMap;

/// Above this many entries a sorted vector becomes a B-tree.
const SMALL_MAX: usize = 64;
/// Below this many entries a B-tree becomes a sorted vector again.
const SMALL_MIN: usize = 16;

/// Free blocks keyed by `(size << 64) | address`, with their block ids.
pub(crate) enum FreeIndex {
    /// Few entries: a vector sorted by key.
    Small(Vec<(u128, u32)>),
    /// Many entries: a B-tree.
    Large(BTreeMap<u128, u32>),
}

impl FreeIndex {
    /// An empty index.
    pub fn new() -> FreeIndex {
        FreeIndex::Small(Vec::new())
    }

    /// Adds a block.
    #[inline]
    pub fn insert(&mut self, key: u128, id: u32) {
        match self {
            FreeIndex::Small(entries) => {
                let at = entries.partition_point(|e| e.0 < key);
                entries.insert(at, (key, id));
                if entries.len() > SMALL_MAX {
                    *self = FreeIndex::Large(entries.drain(..).collect());
                }
            }
            FreeIndex::Large(map) => {
                map.insert(key, id);
            }
        }
    }

    /// Removes the block with `key`, returning its id.
    #[inline]
    pub fn remove(&mut self, key: u128) -> Option<u32> {
        match self {
            FreeIndex::Small(entries) => {
                let at = entries.binary_search_by(|e| e.0.cmp(&key)).ok()?;
                Some(entries.remove(at).1)
            }
            FreeIndex::Large(map) => {
                let id = map.remove(&key);
                if map.len() < SMALL_MIN {
                    *self = FreeIndex::Small(std::mem::take(map).into_iter().collect());
                }
                id
            }
        }
    }

    /// The id stored under exactly `key`.
    pub fn get(&self, key: u128) -> Option<u32> {
        match self {
            FreeIndex::Small(entries) => entries
                .binary_search_by(|e| e.0.cmp(&key))
                .ok()
                .map(|at| entries[at].1),
            FreeIndex::Large(map) => map.get(&key).copied(),
        }
    }

    /// The first entry at or after `key` (best fit).
    #[inline]
    pub fn first_from(&self, key: u128) -> Option<(u128, u32)> {
        match self {
            FreeIndex::Small(entries) => {
                let at = entries.partition_point(|e| e.0 < key);
                entries.get(at).copied()
            }
            FreeIndex::Large(map) => map.range(key..).next().map(|(&k, &v)| (k, v)),
        }
    }

    /// Every entry at or after `key`, in order.
    pub fn all_from(&self, key: u128) -> Vec<(u128, u32)> {
        match self {
            FreeIndex::Small(entries) => {
                let at = entries.partition_point(|e| e.0 < key);
                entries[at..].to_vec()
            }
            FreeIndex::Large(map) => map.range(key..).map(|(&k, &v)| (k, v)).collect(),
        }
    }

    /// Number of entries.
    pub fn len(&self) -> usize {
        match self {
            FreeIndex::Small(entries) => entries.len(),
            FreeIndex::Large(map) => map.len(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn behaves_like_an_ordered_map_across_both_representations() {
        let mut index = FreeIndex::new();
        let mut model = BTreeMap::new();
        let mut seed = 12345u64;
        for step in 0..5000u64 {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            let key = (seed % 200) as u128;
            if seed % 3 == 0 {
                assert_eq!(index.remove(key), model.remove(&key), "step {step}");
            } else if let std::collections::btree_map::Entry::Vacant(e) = model.entry(key) {
                e.insert(step as u32);
                index.insert(key, step as u32);
            }
            assert_eq!(index.len(), model.len());
            let probe = ((seed >> 8) % 210) as u128;
            assert_eq!(
                index.first_from(probe),
                model.range(probe..).next().map(|(&k, &v)| (k, v))
            );
            assert_eq!(index.get(probe), model.get(&probe).copied());
        }
        assert!(matches!(index, FreeIndex::Large(_)) || index.len() <= SMALL_MAX);
        assert_eq!(
            index.all_from(50),
            model.range(50..).map(|(&k, &v)| (k, v)).collect::<Vec<_>>()
        );
    }
}
