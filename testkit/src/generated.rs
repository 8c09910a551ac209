//! Traces made from a list of operations at a few addresses, for property tests of what must
//! hold on any trace, consistent or not: [`ops`] and [`live_at_dump`] are the strategies, and
//! [`trace_of_ops`] turns what they give into a snapshot the same way for every test.

use std::ops::Range;

use proptest::strategy::Strategy;
use vramscope_model::Snapshot;

use crate::trace::{Trace, MIB};

/// How many addresses a generated trace uses.
pub const SLOTS: u64 = 5;

/// The distance between two of its addresses: room for a block of up to 8 MiB at each.
pub const SLOT_BYTES: u64 = 8 * MIB;

/// What one operation of [`trace_of_ops`] does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// Allocates a block at the slot.
    Alloc,
    /// Frees the slot's block: the request, then the completion.
    Free,
    /// Requests the free of the slot's block without completing it.
    FreeRequested,
    /// Completes the free of the slot's block without a request.
    FreeCompleted,
    /// An allocation of its size fails.
    Oom,
    /// Starts the next step.
    Step,
}

impl Op {
    /// The operation numbered `n`, in the order of the variants (modulo their number).
    pub fn nth(n: u8) -> Op {
        [
            Op::Alloc,
            Op::Free,
            Op::FreeRequested,
            Op::FreeCompleted,
            Op::Oom,
            Op::Step,
        ][usize::from(n) % 6]
    }
}

/// One operation of [`trace_of_ops`]: `(operation number for Op::nth, slot, MiB, site number)`.
pub type OpArgs = (u8, u64, u64, usize);

/// Lists of `len` operations of any kind, at any slot and of any call site, each of `mib`
/// MiB (within 1 to 8).
pub fn ops(mib: Range<u64>, len: Range<usize>) -> impl Strategy<Value = Vec<OpArgs>> {
    proptest::collection::vec((0u8..6, 0..SLOTS, mib, 0usize..3), len)
}

/// Which slots hold a live block in the dump-time state.
pub fn live_at_dump() -> impl Strategy<Value = Vec<bool>> {
    proptest::collection::vec(proptest::bool::ANY, SLOTS as usize)
}

/// The address of slot `slot` (modulo [`SLOTS`]).
pub fn slot_address(slot: u64) -> u64 {
    0x100_0000 + (slot % SLOTS) * SLOT_BYTES
}

/// A trace of `ops`, each `(operation number for Op::nth, slot, MiB, site number)`, at
/// [`SLOTS`] addresses [`SLOT_BYTES`] apart in one large-pool segment. The dump-time state
/// holds a 2 MiB block at each slot where `live_at_dump` says so (the first [`SLOTS`] of it).
/// An allocation has one of three call sites; a free names the size of the last block allocated
/// at its slot, as PyTorch writes it, or for a block from before the trace the size the slot's
/// first free named (a request and its completion name one size, as in PyTorch's traces); an
/// OOM asks for its size. Nothing keeps the trace consistent: blocks freed twice or never allocated,
/// allocations over live blocks, free requests never completed and dump-time states that the
/// events contradict all come out of some lists.
pub fn trace_of_ops(ops: &[OpArgs], live_at_dump: &[bool]) -> Snapshot {
    let mut t = Trace::new();
    let sites: Vec<_> = (0..3).map(|i| t.site("train.py", 10 + i, "step")).collect();
    let blocks: Vec<(u64, u64, bool)> = live_at_dump
        .iter()
        .take(SLOTS as usize)
        .enumerate()
        .map(|(slot, &live)| (slot as u64 * SLOT_BYTES, 2 * MIB, live))
        .collect();
    t.add_segment(slot_address(0), &blocks, SLOTS * SLOT_BYTES);
    let mut last_size = [None; SLOTS as usize];
    for &(op, slot, mib, site) in ops {
        let (addr, size) = (slot_address(slot), mib.clamp(1, 8) * MIB);
        let last = &mut last_size[(slot % SLOTS) as usize];
        let free_size = last.unwrap_or(size);
        if matches!(
            Op::nth(op),
            Op::Free | Op::FreeRequested | Op::FreeCompleted
        ) {
            // A block the trace never allocated keeps the size its first free names: PyTorch
            // writes one block's size in both its free request and its completion.
            *last = Some(free_size);
        }
        match Op::nth(op) {
            Op::Alloc => {
                t.alloc_at(sites[site % sites.len()], addr, size);
                *last = Some(size);
            }
            Op::Free => t.free(addr, free_size),
            Op::FreeRequested => t.free_requested(addr, free_size),
            Op::FreeCompleted => t.free_completed(addr, free_size),
            Op::Oom => t.oom(sites[site % sites.len()], size, 0),
            Op::Step => t.step(),
        }
    }
    t.finish()
}
