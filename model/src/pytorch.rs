//! PyTorch's caching-allocator policy constants and rounding, in one place: the sizes of
//! `c10/cuda/CUDACachingAllocator.cpp` (under their names there) and the rules built on them,
//! how a request is rounded to a block ([`round_size`]), which pool serves it ([`pool_for`]),
//! the segment a new request gets ([`segment_size_for`]), and which pool a segment or a mapped
//! range of an expandable segment belongs to ([`segment_pool`], [`mapping_pool`]).
//!
//! The caching allocator (`vramscope-allocator`) runs on these, and re-exports them at its
//! root; the engine, the importers, the exporter and the replay read traces with them; the OOM
//! rule ([`crate::oom`]) sizes a failed request's segment with them. Nothing else defines them
//! (`tests/one_home.rs` greps the workspace for copies). The names PyTorch writes in a snapshot
//! live here too: the trace entries' actions ([`TRACE_ACTIONS`]), which the importer reads and
//! the exporter writes, and the annotation families that mark training steps
//! ([`STEP_ANNOTATIONS`]).
//!
//! ```
//! use vramscope_model::pytorch::{pool_for, round_size, segment_size_for, SMALL_BUFFER};
//! use vramscope_model::Pool;
//!
//! assert_eq!(round_size(1000, 0), 1024);
//! assert_eq!(pool_for(round_size(1000, 0)), Pool::Small);
//! assert_eq!(segment_size_for(1024), SMALL_BUFFER);
//! ```

use crate::{EventKind, Pool, MIB};

/// Every request is rounded up to a multiple of this, and never below it (`kMinBlockSize`).
pub const MIN_BLOCK_SIZE: u64 = 512;
/// Requests up to this size use the small pool (`kSmallSize`).
pub const SMALL_SIZE: u64 = MIB;
/// A small-pool segment, and a small-pool page of an expandable segment (`kSmallBuffer`).
pub const SMALL_BUFFER: u64 = 2 * MIB;
/// The segment of a large request below [`MIN_LARGE_ALLOC`], a large-pool page of an
/// expandable segment, and the most an oversize request may take beyond its size
/// (`kLargeBuffer`).
pub const LARGE_BUFFER: u64 = 20 * MIB;
/// Large requests from this size get a segment of their own size (`kMinLargeAlloc`).
pub const MIN_LARGE_ALLOC: u64 = 10 * MIB;
/// Those segments are rounded up to this (`kRoundLarge`).
pub const ROUND_LARGE: u64 = 2 * MIB;

/// Rounds a request of `size` bytes to its block size as PyTorch's `round_size` does: up to a
/// multiple of [`MIN_BLOCK_SIZE`] (and at least that), or, with `roundup_power2_divisions`
/// above 1 and a request above `MIN_BLOCK_SIZE` times it, up to the next of that many
/// divisions between two powers of two.
///
/// Saturating: a request within 511 bytes of `u64::MAX` rounds down to the last multiple of
/// 512, which no cached block matches and the allocator refuses as too large.
#[inline]
pub fn round_size(size: u64, roundup_power2_divisions: u32) -> u64 {
    let divisions = roundup_power2_divisions as u64;
    if divisions > 1 && size > MIN_BLOCK_SIZE * divisions {
        return roundup_power2_next_division(size, divisions);
    }
    // Requests below `MIN_BLOCK_SIZE` (zero too) round up to it: `max(1)` makes that a
    // select instead of a branch.
    size.max(1).saturating_add(MIN_BLOCK_SIZE - 1) & !(MIN_BLOCK_SIZE - 1)
}

/// PyTorch's `roundup_power2_next_division`: `size` rounded up to the next of `divisions`
/// equal steps between the powers of two around it.
#[inline]
fn roundup_power2_next_division(size: u64, divisions: u64) -> u64 {
    if size.is_power_of_two() {
        return size;
    }
    let floor = 1u64 << (63 - size.leading_zeros());
    let division = floor >> (63 - divisions.leading_zeros());
    if division == 0 {
        return floor.saturating_mul(2);
    }
    let rounded_floor = size & !(division - 1);
    if rounded_floor == size {
        size
    } else {
        rounded_floor.saturating_add(division)
    }
}

/// Whether a block of `size` bytes (a rounded request) is served from the small pool: up to
/// [`SMALL_SIZE`].
#[inline]
pub fn is_small(size: u64) -> bool {
    size <= SMALL_SIZE
}

/// The pool a block of `rounded` bytes (a rounded request) is served from.
#[inline]
pub fn pool_for(rounded: u64) -> Pool {
    if is_small(rounded) {
        Pool::Small
    } else {
        Pool::Large
    }
}

/// The size of the plain segment a request of `request` bytes (rounded) gets: PyTorch's
/// `get_allocation_size`. [`SMALL_BUFFER`] for the small pool, [`LARGE_BUFFER`] for a large
/// request below [`MIN_LARGE_ALLOC`], else the request rounded up to [`ROUND_LARGE`].
#[inline]
pub fn segment_size_for(request: u64) -> u64 {
    if request <= SMALL_SIZE {
        SMALL_BUFFER
    } else if request < MIN_LARGE_ALLOC {
        LARGE_BUFFER
    } else {
        request.div_ceil(ROUND_LARGE).saturating_mul(ROUND_LARGE)
    }
}

/// The pool of a plain (not expandable) segment of `size` bytes: the small pool allocates
/// [`SMALL_BUFFER`] segments and the large pool never one that small (its smallest is
/// [`LARGE_BUFFER`], or a request of [`MIN_LARGE_ALLOC`] or more).
#[inline]
pub fn segment_pool(size: u64) -> Pool {
    if size <= SMALL_BUFFER {
        Pool::Small
    } else {
        Pool::Large
    }
}

/// The pool of a range of `size` bytes mapped into an expandable segment, when nothing but its
/// size says: the large pool maps [`LARGE_BUFFER`] pages, the small pool [`SMALL_BUFFER`] ones,
/// so a whole number of large pages is taken for the large pool.
#[inline]
pub fn mapping_pool(size: u64) -> Pool {
    if size.is_multiple_of(LARGE_BUFFER) {
        Pool::Large
    } else {
        Pool::Small
    }
}

/// PyTorch's trace-entry actions that are allocator events, as `_dump_snapshot()` writes them
/// (`TraceEntry::Action` of `CUDACachingAllocator.h`), with the event kind each one is. The
/// importer reads these and no other action; the exporter writes these names.
pub const TRACE_ACTIONS: [(&str, EventKind); 9] = [
    ("alloc", EventKind::Alloc),
    ("free_requested", EventKind::FreeRequested),
    ("free_completed", EventKind::FreeCompleted),
    ("segment_alloc", EventKind::SegmentAlloc),
    ("segment_free", EventKind::SegmentFree),
    ("segment_map", EventKind::SegmentMap),
    ("segment_unmap", EventKind::SegmentUnmap),
    ("snapshot", EventKind::Snapshot),
    ("oom", EventKind::Oom),
];

/// The event kind of a trace entry's `action`, or `None` for an action that is no allocator
/// event (`user_defined` annotations, ...).
pub fn action_kind(action: &str) -> Option<EventKind> {
    TRACE_ACTIONS
        .iter()
        .find(|(name, _)| *name == action)
        .map(|&(_, kind)| kind)
}

/// PyTorch's action name for an event kind, or `None` for a kind PyTorch does not record
/// (copies, waits, steps, `empty_cache()` calls).
pub fn action_name(kind: EventKind) -> Option<&'static str> {
    TRACE_ACTIONS
        .iter()
        .find(|&&(_, k)| k == kind)
        .map(|&(name, _)| name)
}

/// The annotation families (`record_function` names numbered `#N`) that mark training steps,
/// in order of preference: the profiler's step, the optimizer's step and `zero_grad`, and the
/// data loader's iteration.
pub const STEP_ANNOTATIONS: &[&str] = &[
    "ProfilerStep#",
    "Optimizer.step#",
    "Optimizer.zero_grad#",
    "enumerate(DataLoader)#",
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounds_like_pytorch() {
        assert_eq!(round_size(0, 0), 512);
        assert_eq!(round_size(1, 0), 512);
        assert_eq!(round_size(512, 0), 512);
        assert_eq!(round_size(513, 0), 1024);
        assert_eq!(round_size(u64::MAX, 0), u64::MAX - 511);
        // Four divisions between 1 MiB and 2 MiB: 1.25, 1.5, 1.75 and 2 MiB.
        assert_eq!(round_size(MIB + 1, 4), MIB + MIB / 4);
        assert_eq!(round_size(2 * MIB - 1, 4), 2 * MIB);
        assert_eq!(round_size(MIB, 4), MIB);
        // Small requests keep 512-byte rounding.
        assert_eq!(round_size(1000, 4), 1024);
    }

    #[test]
    fn pools_and_segments() {
        assert!(is_small(MIB));
        assert_eq!(pool_for(MIB), Pool::Small);
        assert_eq!(pool_for(MIB + 512), Pool::Large);
        assert_eq!(segment_size_for(512), 2 * MIB);
        assert_eq!(segment_size_for(MIB), 2 * MIB);
        assert_eq!(segment_size_for(MIB + 512), 20 * MIB);
        assert_eq!(segment_size_for(10 * MIB - 512), 20 * MIB);
        assert_eq!(segment_size_for(10 * MIB), 10 * MIB);
        assert_eq!(segment_size_for(11 * MIB + 1), 12 * MIB);
        assert_eq!(segment_pool(2 * MIB), Pool::Small);
        assert_eq!(segment_pool(10 * MIB), Pool::Large);
        assert_eq!(mapping_pool(40 * MIB), Pool::Large);
        assert_eq!(mapping_pool(4 * MIB), Pool::Small);
    }

    #[test]
    fn every_action_names_one_kind_and_back() {
        for (name, kind) in TRACE_ACTIONS {
            assert_eq!(action_kind(name), Some(kind));
            assert_eq!(action_name(kind), Some(name));
            assert_eq!(kind.name(), name);
        }
        assert_eq!(action_kind("user_defined"), None);
        assert_eq!(action_name(EventKind::Sync), None);
    }
}
