//! Hash maps keyed by device address, for the engine's hot paths: the live blocks of a
//! `super::MemoryState` and the open allocations of `super::Pairing`, each touched once or
//! twice for every event of a trace, and the replay's map from a trace's addresses to its own.
//!
//! The addresses come from the file being read, so they may be chosen to collide. A fast
//! multiplicative hash (FxHash) sends addresses that differ only in their high bits (2^50
//! apart, say) to one bucket, and a map of them degrades to a list: a few thousand such
//! blocks would make every event a scan. [`AddrState`] mixes each address with a seed drawn
//! once per process from the operating system's randomness (std's `RandomState`), through a
//! finalizer in which every output bit depends on every input bit, so that no file can know
//! which addresses collide, at a cost of a few multiplications per look-up.
//!
//! Architecture Invariant: iteration order of these maps differs from run to run. Whatever
//! is shown or written in order (blocks by address, lists of holdings) is sorted first;
//! `super::LiveBlocks` offers its blocks unordered only under a name that says so.

use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasher, Hasher};
use std::sync::OnceLock;

/// A hash map keyed by device address (see the module documentation).
pub type AddrMap<V> = HashMap<u64, V, AddrState>;

/// A hash set of device addresses (see the module documentation).
pub type AddrSet = HashSet<u64, AddrState>;

/// Builds [`AddrHasher`]s with this process's seed.
#[derive(Clone, Copy, Debug)]
pub struct AddrState {
    seed: u64,
}

impl Default for AddrState {
    fn default() -> AddrState {
        static SEED: OnceLock<u64> = OnceLock::new();
        let seed = *SEED.get_or_init(|| {
            // std's keys come from the operating system's randomness, once per process.
            let mut h = std::collections::hash_map::RandomState::new().build_hasher();
            h.write_u64(0x7672_616d_7363_6f70);
            h.finish()
        });
        AddrState { seed }
    }
}

impl BuildHasher for AddrState {
    type Hasher = AddrHasher;

    #[inline]
    fn build_hasher(&self) -> AddrHasher {
        AddrHasher { state: self.seed }
    }
}

/// Hashes one address (or any bytes, for completeness) with a seed; see [`AddrState`].
#[derive(Clone, Copy, Debug)]
pub struct AddrHasher {
    state: u64,
}

/// A folded multiply (the full 128-bit product's halves XORed, as foldhash and wyhash mix):
/// the high half depends on every bit of `x`, so every bit of the result does too, and with
/// `x` XORed with the process's seed a file cannot tell which addresses share a bucket.
#[inline]
fn mix(x: u64) -> u64 {
    const MULTIPLIER: u64 = 0x9e37_79b9_7f4a_7c15;
    let product = u128::from(x) * u128::from(MULTIPLIER);
    (product as u64) ^ ((product >> 64) as u64)
}

impl Hasher for AddrHasher {
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut word = [0u8; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            self.write_u64(u64::from_le_bytes(word));
        }
    }

    #[inline]
    fn write_u64(&mut self, value: u64) {
        self.state = mix(self.state ^ value);
    }

    #[inline]
    fn finish(&self) -> u64 {
        self.state
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Addresses 2^50 apart collide in FxHash's bucket bits; here they spread over the
    /// buckets as random keys would.
    #[test]
    fn addresses_that_differ_only_in_high_bits_spread_over_the_buckets() {
        let state = AddrState::default();
        let keys: Vec<u64> = (0..4096u64).map(|i| 0x7f00_0000_0000 + (i << 50)).collect();
        let buckets: HashSet<u64> = keys.iter().map(|&k| state.hash_one(k) & 0xfff).collect();
        // 4096 random keys into 4096 buckets fill about 63 % of them.
        assert!(buckets.len() > 2300, "{} buckets of 4096", buckets.len());
        let fx: HashSet<u64> = keys
            .iter()
            .map(|&k| rustc_hash::FxBuildHasher.hash_one(k) & 0xfff)
            .collect();
        assert!(fx.len() < 64, "the family does collide under FxHash");
    }

    #[test]
    fn a_map_finds_what_it_holds() {
        let mut map: AddrMap<u32> = AddrMap::default();
        for i in 0..10_000u64 {
            map.insert(i << 9, i as u32);
        }
        assert_eq!(map.len(), 10_000);
        assert!((0..10_000u64).all(|i| map.get(&(i << 9)) == Some(&(i as u32))));
        assert_eq!(map.get(&1), None);
    }
}
