//! Alloc/free pairing: which allocation event each free releases.
//!
//! A trace names blocks by address only, so a free is paired with the last allocation at its
//! address that is still open. PyTorch records a free in two events when other streams used the
//! block (`free_requested`, then `free_completed` once their work is done); both are paired
//! with the allocation, and the second knows that the first happened. [`Pairing`] keeps the
//! open allocations and is fed events in order, by `super::Reconstruction` for a whole trace and
//! by the dashboard's dataset as a live program's events arrive, so that every view pairs the
//! same way.

use crate::AddrMap;
use vramscope_model::{Event, EventKind};

/// What pairing one event found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pair {
    /// The event is not an allocation or a free.
    Other,
    /// An allocation; `replaced` is the open allocation at the same address, whose free the
    /// trace lost.
    Alloc {
        /// The allocation event it replaced, if any.
        replaced: Option<u32>,
        /// Whether the replaced block's free had been requested (it was pending).
        replaced_requested: bool,
        /// For a replaced block from before the trace (allocated before it, its free requested
        /// in it and never completed), the free request, the one event that describes it.
        replaced_request: Option<u32>,
    },
    /// A free request or completion.
    Free(FreeLink),
}

impl Pair {
    /// For an allocation over a block the trace had not freed, the event that describes the
    /// block it replaced (its allocation, or for a block from before the trace its free
    /// request); `None` for every other event.
    pub fn replaced(&self) -> Option<u32> {
        match self {
            Pair::Alloc { .. } => self.link().alloc,
            _ => None,
        }
    }

    /// The link the walk keeps for this event (packed, one per event): a free's own, and for
    /// an allocation that replaced a block the trace had not freed, the event that describes
    /// the replaced block (its allocation, or for a block from before the trace its free
    /// request) with whether it was pending, so that undoing the allocation brings that block
    /// back. Every other event has [`FreeLink::NONE`].
    pub fn link(&self) -> FreeLink {
        match *self {
            Pair::Free(link) => link,
            Pair::Alloc {
                replaced,
                replaced_requested,
                replaced_request,
            } => match replaced.or(replaced_request) {
                Some(event) => FreeLink {
                    alloc: Some(event),
                    requested_before: replaced_requested,
                    ends_allocation: false,
                },
                None => FreeLink::NONE,
            },
            Pair::Other => FreeLink::NONE,
        }
    }
}

/// How a free relates to its allocation (or an allocation to the block it replaced, see
/// [`Pair::link`]); stored per event by the walk and the dashboard's dataset.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FreeLink {
    /// The allocation event the free releases, when the trace has it. In an allocation's
    /// link ([`Pair::link`]), the event that describes the block it replaced: that block's
    /// allocation, or for a block from before the trace its free request.
    pub alloc: Option<u32>,
    /// Whether the free was requested before this event (true only for a completion whose
    /// request the trace has): the block was pending just before.
    pub requested_before: bool,
    /// Whether this event ends the block's life as an allocation: a free request, or a
    /// completion without a request before it.
    pub ends_allocation: bool,
}

impl FreeLink {
    /// No allocation and no request: an event that is not a free, or a free of a block the
    /// trace never saw.
    pub const NONE: FreeLink = FreeLink {
        alloc: None,
        requested_before: false,
        ends_allocation: false,
    };
}

/// Flag of a packed link: the free was requested before this event.
const PACKED_REQUESTED: u32 = 1 << 31;
/// The packed allocation index meaning "none".
const PACKED_NONE: u32 = PACKED_REQUESTED - 1;

impl FreeLink {
    /// The link in 32 bits, for keeping one per event: the allocation index (event indices
    /// stay below 2^31 - 1) and the request flag. [`FreeLink::ends_allocation`] is not kept.
    pub fn pack(self) -> u32 {
        let index = self
            .alloc
            .filter(|&a| a < PACKED_NONE)
            .unwrap_or(PACKED_NONE);
        if self.requested_before {
            index | PACKED_REQUESTED
        } else {
            index
        }
    }

    /// A link from [`FreeLink::pack`] (with `ends_allocation` false).
    pub fn unpack(bits: u32) -> FreeLink {
        let index = bits & PACKED_NONE;
        FreeLink {
            alloc: (index != PACKED_NONE).then_some(index),
            requested_before: bits & PACKED_REQUESTED != 0,
            ends_allocation: false,
        }
    }
}

/// An allocation the trace has not seen freed yet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Open {
    /// The allocation event; `None` for a block allocated before the trace whose free was
    /// requested in it.
    alloc: Option<u32>,
    /// Whether its free was requested.
    requested: bool,
    /// For a block from before the trace, the free request that made it known.
    request: Option<u32>,
}

/// The open allocations of a trace, fed one event at a time. See the module documentation.
#[derive(Clone, Debug, Default)]
pub struct Pairing {
    open: AddrMap<Open>,
    /// Allocations at an address whose block was not freed yet (its free not completed).
    lost_frees: u64,
}

impl Pairing {
    /// An empty pairing.
    pub fn new() -> Pairing {
        Pairing::default()
    }

    /// Pairs event `e` at index `index`.
    #[inline]
    pub fn push(&mut self, index: u32, e: &Event) -> Pair {
        match e.kind {
            EventKind::Alloc => {
                let open = Open {
                    alloc: Some(index),
                    requested: false,
                    request: None,
                };
                let before = self.open.insert(e.addr, open);
                self.lost_frees += u64::from(before.is_some());
                Pair::Alloc {
                    replaced: before.and_then(|o| o.alloc),
                    replaced_requested: before.is_some_and(|o| o.requested),
                    replaced_request: before.and_then(|o| o.request),
                }
            }
            EventKind::FreeRequested => {
                let open = self.open.entry(e.addr).or_insert(Open {
                    alloc: None,
                    requested: false,
                    request: Some(index),
                });
                let first = !open.requested;
                open.requested = true;
                Pair::Free(FreeLink {
                    alloc: open.alloc,
                    requested_before: false,
                    ends_allocation: first,
                })
            }
            EventKind::FreeCompleted => match self.open.remove(&e.addr) {
                Some(open) => Pair::Free(FreeLink {
                    alloc: open.alloc,
                    requested_before: open.requested,
                    ends_allocation: !open.requested,
                }),
                None => Pair::Free(FreeLink {
                    ends_allocation: true,
                    ..FreeLink::NONE
                }),
            },
            _ => Pair::Other,
        }
    }

    /// The frees the trace lost so far: allocations at an address whose block was not freed
    /// yet (no free completed; whether or not one was requested). Every view counts them
    /// here, so `report` and the dashboard give the same number.
    pub fn lost_frees(&self) -> u64 {
        self.lost_frees
    }

    /// How many blocks are open: allocated (or known from a free request) and not freed yet.
    pub(crate) fn open_len(&self) -> usize {
        self.open.len()
    }

    /// The open allocations: address and allocation event, for blocks allocated in the trace
    /// and not yet freed.
    pub fn open_allocations(&self) -> impl Iterator<Item = (u64, u32)> + '_ {
        self.open
            .iter()
            .filter_map(|(&addr, o)| o.alloc.map(|a| (addr, a)))
    }

    /// Shifts every index down by `count` after the first `count` events were dropped; an
    /// allocation among them is from then on one from before the trace.
    pub fn drop_front(&mut self, count: u32) {
        for open in self.open.values_mut() {
            open.alloc = open.alloc.and_then(|a| a.checked_sub(count));
            open.request = open.request.and_then(|r| r.checked_sub(count));
        }
    }
}
