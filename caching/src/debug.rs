//! Use-after-free and overflow detection for the caching allocator's `debug` and
//! `guard_bytes` settings.
//!
//! With `debug`, `crate::allocator` fills all free memory with [`POISON`]: new segments when they
//! arrive, and each block when it returns to the cache, remembering who last owned the bytes
//! (`FreedOwners`). When a block is handed out again, `first_difference` checks that the
//! pattern is intact; a changed byte means someone wrote through a stale pointer, and the
//! violation names the bytes' last owner and the new one. With `guard_bytes`, the bytes after
//! each allocation hold [`GUARD`] and are checked when the block is freed. The checks read and
//! write device memory through the backend (host memory on the backed simulated device, a
//! device memset on CUDA); on a phantom device there is nothing to check and they do nothing.

use std::collections::BTreeMap;

use crate::backend::{Backend, StreamId};

/// The byte free memory is filled with.
pub const POISON: u8 = 0xdb;
/// The byte guard regions are filled with.
pub const GUARD: u8 = 0xfd;
/// Bytes read from the device per check step.
const CHUNK: u64 = 1 << 20;

/// Fills `[addr, addr + len)` with `value`; false when the backend has no memory to fill.
pub(crate) fn fill<B: Backend>(backend: &B, addr: u64, len: u64, value: u8) -> bool {
    len == 0 || backend.memset(addr, value, len, StreamId::DEFAULT).is_ok()
}

/// The first byte of `[addr, addr + len)` that is not `value`, and how many bytes differ;
/// `None` when all match or the memory cannot be read.
pub(crate) fn first_difference<B: Backend>(
    backend: &B,
    addr: u64,
    len: u64,
    value: u8,
) -> Option<(u64, u64)> {
    let mut buffer = vec![0u8; CHUNK.min(len) as usize];
    let mut first = None;
    let mut count = 0;
    let mut offset = 0;
    while offset < len {
        let take = CHUNK.min(len - offset) as usize;
        let chunk = &mut buffer[..take];
        if backend
            .copy_device_to_host(chunk, addr + offset, StreamId::DEFAULT)
            .is_err()
        {
            return None;
        }
        for (i, byte) in chunk.iter().enumerate() {
            if *byte != value {
                first.get_or_insert(addr + offset + i as u64);
                count += 1;
            }
        }
        offset += take as u64;
    }
    first.map(|at| (at, count))
}

/// Who last owned a freed range.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct FreedRange {
    pub end: u64,
    pub provenance: u32,
    pub step: u32,
}

/// The last owners of freed ranges, by start address.
#[derive(Default)]
pub(crate) struct FreedOwners {
    ranges: BTreeMap<u64, FreedRange>,
}

impl FreedOwners {
    /// Records that `[addr, end)` was freed by its owner, replacing older records it covers.
    pub fn record(&mut self, addr: u64, range: FreedRange) {
        let covered: Vec<u64> = self
            .ranges
            .range(addr..range.end)
            .map(|(&start, _)| start)
            .collect();
        for start in covered {
            self.ranges.remove(&start);
        }
        self.ranges.insert(addr, range);
    }

    /// The record covering `addr`.
    pub fn owner_of(&self, addr: u64) -> Option<FreedRange> {
        self.ranges
            .range(..=addr)
            .next_back()
            .filter(|(_, r)| addr < r.end)
            .map(|(_, r)| *r)
    }
}
