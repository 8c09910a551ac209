//! What each call-site group holds: blocks summed into one [`Holding`] per group, largest
//! first.
//!
//! Holdings are always summed from an engine state (`MemoryState`): through
//! `ModelView::holdings_in` (in the parent module) for the walk's own state at the end and at
//! the peak (`build`) and at an OOM (the largest holder), or at the dashboard's time cursor
//! (`vramscope-tui`). So they add up to the allocated figure the walk found there, memory from
//! before the trace included. [`HoldingSums`] keeps the same sums for a state that moves a few
//! events at a time (the dashboard's cursor): each block that comes or goes is added or taken
//! out, so a move costs the blocks it changes, not every live block, and the holdings it gives
//! equal [`holdings_of`]'s of the state, figure for figure.

use std::collections::BTreeMap;

use rustc_hash::FxHashMap;
use vramscope_engine::{GroupId, LiveBlock, MemoryState, SiteGroups};
use vramscope_model::SiteId;

use super::Holding;

/// Adds one block of `bytes` (`requested` of them asked for), allocated in step number `step`,
/// to `group`'s holding in `by_group`.
fn add_holding(
    by_group: &mut FxHashMap<GroupId, Holding>,
    group: GroupId,
    bytes: u64,
    requested: u64,
    step: u64,
) {
    let h = by_group.entry(group).or_insert(Holding {
        group,
        bytes: 0,
        blocks: 0,
        requested: 0,
        first_step: step,
        last_step: step,
    });
    h.bytes = h.bytes.saturating_add(bytes);
    h.blocks += 1;
    h.requested = h.requested.saturating_add(requested);
    h.first_step = h.first_step.min(step);
    h.last_step = h.last_step.max(step);
}

/// What each group holds in `state` (pending frees left out, as from the allocated figure),
/// with the state's unattributed bytes under [`SiteGroups::BEFORE_TRACE`], largest first;
/// `step_of` gives the step a block was allocated in. The report's columns, the OOM findings
/// and the dashboard's call-site panel all sum a state this way.
pub fn holdings_of(
    state: &MemoryState,
    groups: &SiteGroups,
    step_of: &dyn Fn(&LiveBlock) -> u64,
) -> Vec<Holding> {
    let mut by_group: FxHashMap<GroupId, Holding> = FxHashMap::default();
    for (_, block) in state.blocks.unordered().filter(|(_, b)| !b.pending) {
        add_holding(
            &mut by_group,
            groups.of_block(block),
            block.size,
            block.requested,
            step_of(block),
        );
    }
    add_unattributed(&mut by_group, state.unattributed.allocated);
    sorted_holdings(by_group)
}

/// Adds `bytes` from before the trace that no block describes to the holding of
/// [`SiteGroups::BEFORE_TRACE`] (none when there are none).
fn add_unattributed(by_group: &mut FxHashMap<GroupId, Holding>, bytes: u64) {
    if bytes == 0 {
        return;
    }
    let h = by_group.entry(SiteGroups::BEFORE_TRACE).or_insert(Holding {
        group: SiteGroups::BEFORE_TRACE,
        bytes: 0,
        blocks: 0,
        requested: 0,
        first_step: 0,
        last_step: 0,
    });
    h.bytes = h.bytes.saturating_add(bytes);
}

/// The holdings of `by_group`, largest first (more blocks first on equal bytes, then by group
/// id, so that the order never depends on the map's).
fn sorted_holdings(by_group: FxHashMap<GroupId, Holding>) -> Vec<Holding> {
    let mut list: Vec<Holding> = by_group.into_values().collect();
    list.sort_unstable_by(|a, b| {
        b.bytes
            .cmp(&a.bytes)
            .then(b.blocks.cmp(&a.blocks))
            .then(a.group.cmp(&b.group))
    });
    list
}

/// What decides a block's group, whatever the groups are: its site, and whether it is a block
/// from before the trace that names none ([`SiteGroups::of_block`]).
type SumKey = (Option<SiteId>, bool);

/// The sums of the allocated blocks of one [`SumKey`]: exact under additions and removals in
/// any order (bytes in 128 bits, the steps as a multiset whose least and greatest are at hand).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct KeySum {
    bytes: u128,
    blocks: u64,
    requested: u128,
    /// How many blocks were allocated in each step.
    steps: BTreeMap<u64, u64>,
}

/// The allocated blocks of a state summed by site, kept up to date block by block: what
/// [`holdings_of`] (with each block's own step) and the dashboard's stack tree sum, at the cost
/// of the blocks that changed. Pending frees count nothing, as in [`holdings_of`]; memory no
/// block describes is the caller's to pass in ([`HoldingSums::holdings`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HoldingSums {
    by_key: FxHashMap<SumKey, KeySum>,
}

impl HoldingSums {
    /// The sums of every allocated block of `state`: a pass over its blocks.
    pub fn of_state(state: &MemoryState) -> HoldingSums {
        let mut sums = HoldingSums::default();
        for (_, block) in state.blocks.unordered() {
            sums.add(block);
        }
        sums
    }

    fn key(block: &LiveBlock) -> SumKey {
        (block.site, block.predates_trace() && block.site.is_none())
    }

    /// Adds `block` (nothing when it is pending).
    pub fn add(&mut self, block: &LiveBlock) {
        if block.pending {
            return;
        }
        let sum = self.by_key.entry(HoldingSums::key(block)).or_default();
        sum.bytes += u128::from(block.size);
        sum.blocks += 1;
        sum.requested += u128::from(block.requested);
        *sum.steps.entry(block.step).or_insert(0) += 1;
    }

    /// Takes out `block`, added before (nothing when it is pending).
    pub fn remove(&mut self, block: &LiveBlock) {
        if block.pending {
            return;
        }
        let key = HoldingSums::key(block);
        let Some(sum) = self.by_key.get_mut(&key) else {
            debug_assert!(false, "a block taken out that was never added");
            return;
        };
        sum.bytes -= u128::from(block.size);
        sum.blocks -= 1;
        sum.requested -= u128::from(block.requested);
        if let Some(n) = sum.steps.get_mut(&block.step) {
            *n -= 1;
            if *n == 0 {
                sum.steps.remove(&block.step);
            }
        }
        if sum.blocks == 0 {
            self.by_key.remove(&key);
        }
    }

    /// Replaces `before` (the block an address held, if any) with `after` (what it holds now).
    pub fn change(&mut self, before: Option<&LiveBlock>, after: Option<&LiveBlock>) {
        if before == after {
            return;
        }
        if let Some(b) = before {
            self.remove(b);
        }
        if let Some(a) = after {
            self.add(a);
        }
    }

    /// The holdings by group of `groups`, with `unattributed` bytes (the state's memory from
    /// before the trace that no block describes) under [`SiteGroups::BEFORE_TRACE`], largest
    /// first: [`holdings_of`] of the state these sums are of, with each block's own step.
    pub fn holdings(&self, groups: &SiteGroups, unattributed: u64) -> Vec<Holding> {
        let mut by_group: FxHashMap<GroupId, (u128, u64, u128, u64, u64)> = FxHashMap::default();
        for (&(site, before), sum) in &self.by_key {
            let group = if before {
                SiteGroups::BEFORE_TRACE
            } else {
                groups.group_of(site)
            };
            let first = sum.steps.keys().next().copied().unwrap_or(0);
            let last = sum.steps.keys().next_back().copied().unwrap_or(0);
            let g = by_group
                .entry(group)
                .or_insert((0, 0, 0, u64::MAX, u64::MIN));
            g.0 += sum.bytes;
            g.1 += sum.blocks;
            g.2 += sum.requested;
            g.3 = g.3.min(first);
            g.4 = g.4.max(last);
        }
        let saturated = |v: u128| u64::try_from(v).unwrap_or(u64::MAX);
        let mut holdings: FxHashMap<GroupId, Holding> = by_group
            .into_iter()
            .map(|(group, (bytes, blocks, requested, first, last))| {
                let h = Holding {
                    group,
                    bytes: saturated(bytes),
                    blocks,
                    requested: saturated(requested),
                    first_step: first,
                    last_step: last,
                };
                (group, h)
            })
            .collect();
        add_unattributed(&mut holdings, unattributed);
        sorted_holdings(holdings)
    }

    /// Bytes and blocks by site and group (a block's site, or `None`, with the group of
    /// `groups` it counts under), `unattributed` bytes under `(None, BEFORE_TRACE)`: the sums
    /// of the dashboard's stack tree, in no particular order. Sums past 2^64 wrap.
    pub fn by_site(
        &self,
        groups: &SiteGroups,
        unattributed: u64,
    ) -> FxHashMap<(Option<SiteId>, GroupId), (u64, u64)> {
        let mut out: FxHashMap<(Option<SiteId>, GroupId), (u64, u64)> = FxHashMap::default();
        for (&(site, before), sum) in &self.by_key {
            let group = if before {
                SiteGroups::BEFORE_TRACE
            } else {
                groups.group_of(site)
            };
            let s = out.entry((site, group)).or_insert((0, 0));
            s.0 = s.0.wrapping_add(sum.bytes as u64);
            s.1 += sum.blocks;
        }
        if unattributed > 0 {
            let s = out
                .entry((None, SiteGroups::BEFORE_TRACE))
                .or_insert((0, 0));
            s.0 = s.0.wrapping_add(unattributed);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vramscope_engine::NO_EVENT;
    use vramscope_model::{CallSite, Pool, Segment};

    /// A state of `blocks` (address, block) in one segment.
    fn state_of(blocks: &[(u64, LiveBlock)]) -> MemoryState {
        let mut state = MemoryState::from_segments(&[Segment {
            device: 0,
            address: 0,
            total_size: u64::MAX,
            stream: 0,
            pool: Pool::Large,
            expandable: false,
            blocks: blocks
                .iter()
                .map(|(a, b)| b.to_block(*a, b.size, b.requested))
                .collect(),
        }]);
        // A dump-time state knows no allocation events; these blocks' are their own.
        for (a, b) in blocks {
            if let Some(live) = state.blocks.get_mut(*a) {
                live.alloc_event = b.alloc_event;
            }
        }
        state
    }

    /// Sums kept block by block, in any order of additions and removals, give the holdings
    /// `holdings_of` sums from the state, sizes that saturate a group's sum included.
    #[test]
    fn sums_kept_block_by_block_give_the_holdings_of_the_state() {
        let mut groups = SiteGroups::new();
        let sites: Vec<CallSite> = (0..4)
            .map(|i| CallSite {
                file: format!("f{}.py", i % 3),
                line: 10,
                function: "g".into(),
                column: 0,
                frames: Vec::new(),
            })
            .collect();
        groups.sync(&sites);
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move |n: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % n
        };
        let mut live: Vec<(u64, LiveBlock)> = Vec::new();
        let mut sums = HoldingSums::default();
        let mut saturated = false;
        for i in 0..600u64 {
            if !live.is_empty() && next(3) == 0 {
                let (_, b) = live.swap_remove(next(live.len() as u64) as usize);
                sums.remove(&b);
            } else {
                let huge = next(12) == 0;
                let b = LiveBlock {
                    size: if huge {
                        u64::MAX / 3
                    } else {
                        512 * (1 + next(9))
                    },
                    requested: 100 * next(5),
                    site: [None, Some(0), Some(1), Some(2), Some(3), Some(9)][next(6) as usize]
                        .map(|s| s as SiteId),
                    tag: None,
                    scope: None,
                    step: next(7),
                    stream: 0,
                    pending: next(5) == 0,
                    alloc_event: if next(4) == 0 { NO_EVENT } else { i as u32 },
                };
                sums.add(&b);
                live.push((i * 4096, b));
            }
            if i % 25 == 0 {
                let state = state_of(&live);
                for unattributed in [0, 4096] {
                    let mut with = state.clone();
                    with.add_unattributed(vramscope_engine::Usage {
                        allocated: unattributed,
                        reserved: 0,
                    });
                    let holdings = sums.holdings(&groups, unattributed);
                    saturated |= holdings.iter().any(|h| h.bytes == u64::MAX);
                    assert_eq!(
                        holdings,
                        holdings_of(&with, &groups, &|b| b.step),
                        "after {i}"
                    );
                }
                assert_eq!(sums, HoldingSums::of_state(&state), "after {i}");
            }
        }
        assert!(saturated, "no group's sum saturated");
    }
}
