//! What each call-site group holds: blocks summed into one [`Holding`] per group, largest
//! first.
//!
//! Holdings are always summed from an engine state (`MemoryState`): through
//! `ModelView::holdings_in` (in the parent module) for the walk's own state at the end and at
//! the peak (`build`) and at an OOM (the largest holder), or at the dashboard's time cursor
//! (`vramscope-tui`). So they add up to the allocated figure the walk found there, memory from
//! before the trace included.

use rustc_hash::FxHashMap;
use vramscope_engine::{GroupId, LiveBlock, MemoryState, SiteGroups};

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
    if state.unattributed.allocated > 0 {
        let h = by_group.entry(SiteGroups::BEFORE_TRACE).or_insert(Holding {
            group: SiteGroups::BEFORE_TRACE,
            bytes: 0,
            blocks: 0,
            requested: 0,
            first_step: 0,
            last_step: 0,
        });
        h.bytes = h.bytes.saturating_add(state.unattributed.allocated);
    }
    sorted_holdings(by_group)
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
