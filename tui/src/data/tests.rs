//! Tests of the dataset: checkpoints, random access, cuts and their memory bound.

use super::*;
use vramscope_engine::LiveBlock;
use vramscope_testkit::fixture;

#[test]
fn the_state_at_the_end_is_the_snapshot_and_replays_agree() {
    let snapshot = fixture::training_snapshot();
    let mut data = Dataset::new(snapshot.clone(), Origin::File("f".into()));
    let end = MemoryState::from_segments(&snapshot.segments);
    assert_eq!(data.head().blocks.len(), end.blocks.len());
    assert_eq!(data.usage_at(data.len()), end.usage());
    // Forwards from the start reproduces the end.
    let n = data.len();
    let mut fwd = data.state_at(0).clone();
    for (i, e) in snapshot.events.iter().enumerate() {
        fwd.apply(e, i as u32);
        assert_eq!(fwd.usage(), data.usage_at(i + 1), "after event {i}");
    }
    assert_eq!(fwd.usage(), data.usage_at(n));
    // Random access agrees with the usage series.
    for pos in [n / 3, 1, n - 1, 0, n / 2] {
        let u = data.usage_at(pos);
        assert_eq!(data.state_at(pos).usage(), u, "at {pos}");
    }
}

/// The training fixture split in half: the whole of it as a file's dataset, a live
/// dataset of its first half (whose end state is the state after those events), and the
/// events of the second half, yet to come.
fn halves() -> (Dataset, Dataset, Vec<Event>) {
    let snapshot = fixture::training_snapshot();
    let half = snapshot.events.len() / 2;
    let mut first = snapshot.clone();
    let rest = first.events.split_off(half).into_vec();
    let mut whole = Dataset::new(snapshot, Origin::File("f".into()));
    first.segments = whole.state_at(half).to_segments();
    first.steps.retain(|m| m.seq < rest[0].seq);
    (whole, Dataset::new(first, Origin::Live("l".into())), rest)
}

#[test]
fn appending_matches_loading_at_once() {
    let (whole, mut grown, rest) = halves();
    let half = grown.len();
    grown.append(&rest);
    assert_eq!(grown.len(), whole.len());
    assert_eq!(grown.usage(), whole.usage());
    assert_eq!(grown.step_starts(), whole.step_starts());
    assert_eq!(grown.kinds(), whole.kinds());
    let kinds_of = |d: &Dataset| d.events().iter().map(|e| e.kind).collect::<Vec<_>>();
    assert_eq!(grown.kinds(), kinds_of(&grown));
    assert_eq!(grown.head().usage(), whole.head().usage());
    let extremes = |d: &Dataset, a: usize, b: usize| {
        assert_eq!(
            d.usage_extremes(a, b),
            Extremes::scan(d.usage().range(a, b)),
            "range {a}..{b} of {}",
            d.len()
        );
    };
    let n = grown.len();
    for (a, b) in [(0, n), (1, n - 1), (n / 3, n / 2), (n - 17, n), (5, 5)] {
        extremes(&grown, a, b);
    }
    check_peaks(&grown, Usage::default());
    check_peaks(&whole, Usage::default());
    assert_eq!(grown.peak_allocated_pos(), whole.peak_allocated_pos());
    let session_peak = grown.peak_at(grown.len());
    grown.trim_front(half / 2);
    check_peaks(&grown, whole.peak_at(half / 2));
    assert_eq!(grown.peak_at(grown.len()), session_peak);
    assert_eq!(grown.len(), whole.len() - half / 2);
    assert_eq!(grown.state_at(0).usage(), whole.usage_at(half / 2));
    let k = grown.len() - 3;
    assert_eq!(grown.state_at(k).usage(), whole.usage_at(k + half / 2));
    assert_eq!(grown.kinds(), kinds_of(&grown));
    let n = grown.len();
    for (a, b) in [(0, n), (2, n - 40), (n / 4, n / 4 + 33)] {
        extremes(&grown, a, b);
    }
}

/// The peaks the dataset keeps, against running maxima worked out here: at every position
/// (counting `dropped`, the peak of the events dropped from the front), and where each
/// figure first reaches its peak among the events kept.
fn check_peaks(data: &Dataset, dropped: Usage) {
    let n = data.len();
    let mut running = vec![data.usage_at(0)];
    for pos in 1..=n {
        running.push(higher(running[pos - 1], data.usage_at(pos)));
    }
    for (pos, kept) in running.iter().enumerate() {
        assert_eq!(
            data.peak_at(pos),
            higher(*kept, dropped),
            "peak at {pos} of {n}"
        );
    }
    let first = |key: fn(&Usage) -> u64| {
        (0..=n)
            .find(|&pos| key(&data.usage_at(pos)) == key(&running[n]))
            .unwrap()
    };
    assert_eq!(data.peak_allocated_pos(), first(|u| u.allocated));
    assert_eq!(data.peak_reserved_pos(), first(|u| u.reserved));
    assert!(
        data.peak_allocated_pos() > 0,
        "the fixture's peak is after its start"
    );
}

/// The analysis's cut at a position reads the dataset's events where they are (the
/// architecture's "a cut shares, it does not copy"), before and after live events are
/// appended, and an append while a cut is held leaves the cut as it was.
#[test]
fn a_cut_shares_the_events_and_keeps_them_while_the_dataset_grows() {
    let (whole, mut data, rest) = halves();
    let pos = data.len() / 2;
    let (full, segments) = data.cut_at(pos);
    let cut = cut_snapshot(&full, pos, segments);
    assert_eq!(cut.events.len(), pos);
    assert!(std::ptr::eq(cut.events.as_ptr(), data.events().as_ptr()));
    assert_eq!(*cut.events, data.events()[..pos]);
    let before: Vec<Event> = cut.events.to_vec();
    data.append(&rest);
    assert_eq!(data.len(), whole.len());
    assert_eq!(*cut.events, *before, "the cut still reads what it had");
    let (full, segments) = data.cut_at(data.len() - 1);
    let later = cut_snapshot(&full, data.len() - 1, segments);
    assert!(std::ptr::eq(later.events.as_ptr(), data.events().as_ptr()));
    assert_eq!(*later.events, whole.events()[..whole.len() - 1]);
}

/// Where a test's cursor goes over `n` events, `moves` times: by turns a jump anywhere,
/// a few events back or forward, and `step` events on, from the middle.
fn cursor_walk(n: usize, moves: usize, step: usize) -> Vec<usize> {
    let mut x = 0x2545_f491_4f6c_dd1du64;
    let mut pos = n / 2;
    let mut out = Vec::with_capacity(moves);
    for i in 0..moves {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        pos = match i % 3 {
            0 => (x % (n as u64 + 1)) as usize,
            1 => (pos + (x % 64) as usize).saturating_sub(32).min(n),
            _ => (pos + step).min(n),
        };
        out.push(pos);
    }
    out
}

/// Over a trace with many checkpoints, the state at any position, reached from wherever
/// the last one was (forwards, backwards, far or near), has the usage the series says.
#[test]
fn random_access_agrees_with_the_usage_series_over_many_checkpoints() {
    let mut data = Dataset::new(
        fixture::many_blocks_snapshot(30_000),
        Origin::File("f".into()),
    );
    let n = data.len();
    assert!(n > 3 * CHECKPOINT_MIN, "{n} events");
    // Its live blocks grow to 30,000 over some 75,000 events: the memory bound keeps at
    // most one state of that size beyond the events' share, and jumps cross the changes kept
    // between.
    assert!(
        data.checkpoints.len() >= 2,
        "{} checkpoints",
        data.checkpoints.len()
    );
    for pos in cursor_walk(n, 120, n / 190) {
        assert_eq!(data.state_at(pos).usage(), data.usage_at(pos), "at {pos}");
        check_order(data.state_at(pos), pos);
    }
    assert!(
        data.crossings > 10,
        "jumps crossed kept changes {} times",
        data.crossings
    );
}

/// The blocks of `state` in address order, and their extents, are those of its blocks
/// sorted afresh: the order a state moved by events and kept changes merges from the order
/// it had is the order it has.
fn check_order(state: &MemoryState, pos: usize) {
    let mut fresh: Vec<(u64, LiveBlock)> =
        state.blocks.unordered().map(|(&a, &b)| (a, b)).collect();
    fresh.sort_unstable_by_key(|&(a, _)| a);
    let ours: Vec<(u64, LiveBlock)> = state.blocks.by_address().map(|(&a, &b)| (a, b)).collect();
    assert_eq!(ours, fresh, "address order at {pos}");
    let extents: Vec<(u64, u64)> = state.blocks.extents_in(0, u64::MAX).collect();
    let sizes: Vec<(u64, u64)> = fresh.iter().map(|&(a, b)| (a, b.size)).collect();
    assert_eq!(extents, sizes, "extents at {pos}");
}

/// On a trace that contradicts itself (blocks freed twice, free requests repeated), where
/// walking forwards parts from the engine's walk back, the state at any position, reached
/// from wherever the last one was, is the walk's own: the blocks whose figures the
/// timeline shows there, the ones the report's "at peak" column counts. Stepping forwards
/// over a stretch without disagreements still applies events.
#[test]
fn the_state_at_any_position_is_the_walks_own_on_a_trace_that_contradicts_itself() {
    let mut snapshot = Snapshot::empty(Default::default(), Default::default());
    let kinds = [
        EventKind::Alloc,
        EventKind::FreeRequested,
        EventKind::FreeRequested,
        EventKind::FreeCompleted,
        EventKind::FreeCompleted,
    ];
    for k in 0..70_000u64 {
        // Every third stretch of 20,000 events is consistent.
        let contradicting = (k / 20_000) % 3 != 1;
        let kind = if contradicting {
            kinds[(k % 5) as usize]
        } else {
            [
                EventKind::Alloc,
                EventKind::FreeRequested,
                EventKind::FreeCompleted,
            ][(k % 3) as usize]
        };
        let addr = 0x10_0000 + 0x1000 * (k % 13);
        snapshot.events.push(
            vramscope_testkit::event(kind)
                .addr(addr)
                .size(512 * (1 + k % 7))
                .seq(k)
                .build(),
        );
    }
    let walk = vramscope_engine::Reconstruction::from_snapshot(&snapshot);
    assert!(!walk.disagreements.is_empty());
    let events: &[Event] = &snapshot.events;
    let n = events.len();
    // The walk's own state after every position.
    let mut states = vec![walk.end.clone()];
    let mut state = walk.end.clone();
    for i in (0..n).rev() {
        vramscope_engine::undo(&mut state, events, &walk.links, i);
        states.push(state.clone());
    }
    states.reverse();
    let mut forwards_differs = false;
    let mut data = Dataset::new(snapshot.clone(), Origin::File("f".into()));
    assert!(data.checkpoints.len() > 2, "{}", data.checkpoints.len());
    // Stepping forwards one event at a time, as a held arrow key does.
    for (i, pos) in cursor_walk(n, 600, 1).into_iter().enumerate() {
        assert_eq!(*data.state_at(pos), states[pos], "at {pos}");
        check_order(data.state_at(pos), pos);
        assert_eq!(data.usage_at(pos), states[pos].usage(), "at {pos}");
        if i % 5 == 0 {
            // The sums moved with the state, through the stretches that disagree too.
            check_sums_at(&mut data, pos);
        }
        let mut forwards = walk.start.clone();
        if i % 50 == 0 {
            for (j, e) in events.iter().enumerate().take(pos) {
                forwards.apply(e, j as u32);
            }
            forwards_differs |= forwards != states[pos];
        }
    }
    assert!(forwards_differs, "the trace does part the two directions");
    assert!(
        data.crossings > 10,
        "jumps crossed kept changes {} times",
        data.crossings
    );
}

proptest::proptest! {
    #![proptest_config(vramscope_testkit::props::config(64))]

    /// Whatever the trace, consistent or not, and wherever the cursor goes from wherever
    /// it was, the state at the cursor is the engine walk's own there, with its usage.
    #[test]
    fn the_state_at_any_cursor_of_any_trace_is_the_walks_own(
        ops in vramscope_testkit::generated::ops(1..5, 1..80),
        live_at_dump in vramscope_testkit::generated::live_at_dump(),
        cursor in proptest::collection::vec(0usize..100, 1..40),
    ) {
        let snapshot = vramscope_testkit::generated::trace_of_ops(&ops, &live_at_dump);
        let walk = vramscope_engine::Reconstruction::from_snapshot(&snapshot);
        let events: &[Event] = &snapshot.events;
        let n = events.len();
        let mut data = Dataset::new(snapshot.clone(), Origin::File("f".into()));
        for pos in cursor.into_iter().map(|c| c % (n + 1)) {
            let own = walk.state_walked(events, pos);
            proptest::prop_assert_eq!(data.state_at(pos), &own, "at {}", pos);
            proptest::prop_assert_eq!(data.usage_at(pos), own.usage(), "at {}", pos);
            check_order(data.state_at(pos), pos);
        }
    }

    /// Whatever the trace, crossing the changes kept between any two bounds, forwards or
    /// backwards, from the walk's own state at one gives the walk's own state at the other:
    /// blocks, segments and totals.
    #[test]
    fn crossing_the_kept_changes_gives_the_walks_own_state(
        ops in vramscope_testkit::generated::ops(1..5, 1..80),
        live_at_dump in vramscope_testkit::generated::live_at_dump(),
    ) {
        let snapshot = vramscope_testkit::generated::trace_of_ops(&ops, &live_at_dump);
        let walk = vramscope_engine::Reconstruction::from_snapshot(&snapshot);
        let events: &[Event] = &snapshot.events;
        let data = Dataset::new(snapshot.clone(), Origin::File("f".into()));
        let deltas = &data.deltas;
        let bounds = deltas.bounds();
        proptest::prop_assert!(bounds >= 3 || events.len() <= DELTA_EVERY, "{} bounds", bounds);
        let states: Vec<MemoryState> =
            (0..bounds).map(|b| walk.state_walked(events, deltas.bound(b))).collect();
        for i in 0..bounds {
            for j in 0..bounds {
                let mut state = states[i].clone();
                deltas.cross(&mut state, None, i, j);
                proptest::prop_assert_eq!(&state, &states[j], "from bound {} to {}", i, j);
            }
        }
    }
}

/// Appended events are walked forwards, never undone: a live source that frees a block
/// twice shows the state its events leave, whichever way the cursor comes.
#[test]
fn appended_events_are_walked_forwards_even_where_they_contradict_themselves() {
    let empty = Snapshot::empty(Default::default(), Default::default());
    let mut data = Dataset::new(empty, Origin::File("f".into()));
    let ev = |kind, seq| {
        vramscope_testkit::event(kind)
            .addr(0x1000)
            .size(4096)
            .seq(seq)
            .build()
    };
    data.append(&[
        ev(EventKind::Alloc, 0),
        ev(EventKind::FreeCompleted, 1),
        ev(EventKind::FreeCompleted, 2),
    ]);
    for pos in [3, 2, 1, 0, 2, 1, 3, 2] {
        let state = data.state_at(pos).clone();
        assert_eq!(state.usage(), data.usage_at(pos), "at {pos}");
        assert_eq!(state.blocks.len(), usize::from(pos == 1), "at {pos}");
    }
}

/// The loaded events are undone from the walk's own state after them, which the head
/// leaves behind once events are appended: a block the dump names keeps its site there.
#[test]
fn the_walks_end_state_is_kept_when_events_are_appended() {
    let snapshot = fixture::training_snapshot();
    let mut data = Dataset::new(snapshot, Origin::File("f".into()));
    let loaded = data.len();
    let at_load = data.head().clone();
    let (&addr, block) = at_load.blocks.by_address().next().unwrap();
    assert!(block.site.is_some());
    let free = vramscope_testkit::event(EventKind::FreeCompleted)
        .addr(addr)
        .size(block.size)
        .seq(loaded as u64)
        .build();
    data.append(&[free]);
    assert_eq!(*data.state_at(loaded), at_load);
    let back = data.state_at(loaded.saturating_sub(3)).clone();
    assert_eq!(*data.state_at(loaded), at_load);
    assert_eq!(back.usage(), data.usage_at(loaded.saturating_sub(3)));
}

/// After the oldest events are dropped (a live source), a free whose allocation went
/// with them is walked forwards from the new start, which holds the block as allocated,
/// site and all, whichever way the cursor comes.
#[test]
fn a_free_whose_allocation_was_dropped_shows_the_block_it_frees() {
    let empty = Snapshot::empty(Default::default(), Default::default());
    let mut data = Dataset::new(empty, Origin::File("f".into()));
    let mut events = Vec::new();
    for seq in 0..60u64 {
        let (kind, addr) = match seq {
            5 => (EventKind::Alloc, 0x9_0000_0000),
            40 => (EventKind::FreeCompleted, 0x9_0000_0000),
            _ if seq % 2 == 0 => (EventKind::Alloc, 0x1000 * (1 + seq)),
            _ => (EventKind::FreeCompleted, 0x1000 * seq),
        };
        let mut e = vramscope_testkit::event(kind)
            .addr(addr)
            .size(1024)
            .seq(seq)
            .build();
        if addr == 0x9_0000_0000 {
            e.site = vramscope_model::Id::new(7);
        }
        events.push(e);
    }
    data.append(&events);
    data.trim_front(10);
    // Event 40 is now event 30: the block lives before it.
    for pos in [50, 20, 29, 31, 25, 0] {
        let site = data.state_at(pos).blocks.get(0x9_0000_0000).map(|b| b.site);
        let live = pos <= 30;
        assert_eq!(site, live.then_some(Some(7)), "at {pos}");
        assert_eq!(data.state_at(pos).usage(), data.usage_at(pos), "at {pos}");
    }
}

/// One segment, then `n` allocations of 512 bytes in it that are never freed.
fn never_freed(n: u64) -> Vec<Event> {
    let base = 0x10_0000_0000u64;
    let mut events = vec![vramscope_testkit::event(EventKind::SegmentAlloc)
        .addr(base)
        .size(512 * n)
        .build()];
    for i in 0..n {
        events.push(
            vramscope_testkit::event(EventKind::Alloc)
                .addr(base + 512 * i)
                .size(512)
                .seq(i + 1)
                .build(),
        );
    }
    events
}

/// The blocks and segments all checkpoints hold, and the bound they must keep to: one
/// per `EVENTS_PER_ITEM` events and `FULL_STATES` states of the head's size.
fn held_and_bound(data: &Dataset) -> (usize, usize) {
    let held = data.checkpoints.iter().map(|(_, s)| items(s)).sum();
    let bound = data.len() / EVENTS_PER_ITEM + FULL_STATES * items(data.head());
    (held, bound)
}

/// Issue 33, item 8: on a trace of allocations never freed (a model of many small
/// tensors), checkpoints used to copy the whole live set every few thousand events (48
/// copies of up to a million blocks, 5.3 GB). Loaded or appended, they now hold at most
/// one block per `EVENTS_PER_ITEM` events and `FULL_STATES` full states, and the state
/// at any position is still right.
#[test]
fn checkpoints_of_a_trace_never_freed_hold_memory_linear_in_it() {
    let events = never_freed(120_000);
    let mut end = MemoryState::default();
    for (i, e) in events.iter().enumerate() {
        end.apply(e, i as u32);
    }
    let mut snapshot = Snapshot::empty(Default::default(), Default::default());
    snapshot.segments = end.to_segments();
    for e in &events {
        snapshot.events.push(*e);
    }
    let mut loaded = Dataset::new(snapshot, Origin::File("f".into()));
    let (held, bound) = held_and_bound(&loaded);
    assert!(held <= bound, "loaded: {held} blocks held, over {bound}");
    assert!(loaded.checkpoints.len() >= 2);

    let empty = Snapshot::empty(Default::default(), Default::default());
    let mut appended = Dataset::new(empty, Origin::Live("l".into()));
    for batch in events.chunks(8192) {
        appended.append(batch);
        let (held, bound) = held_and_bound(&appended);
        assert!(
            held <= bound,
            "after {} events: {held} blocks held, over {bound}",
            appended.len()
        );
    }
    assert!(appended.checkpoints.len() >= 2);
    for data in [&mut loaded, &mut appended] {
        let n = data.len();
        for pos in [n / 2, n / 7, n - 1, 3 * n / 4, 1, 0] {
            let state = data.state_at(pos);
            assert_eq!(state.blocks.len(), pos.saturating_sub(1), "at {pos}");
        }
    }
}

#[test]
fn the_host_waits_are_listed_for_the_timeline_as_loaded_and_as_grown() {
    let mut t = vramscope_testkit::Trace::new();
    let site = t.site("train.py", 44, "train");
    let a = t.alloc(site, 1 << 20);
    t.sync(site);
    t.sync(site);
    t.free(a, 1 << 20);
    t.sync(site);
    let snapshot = t.finish();
    let mut whole = Dataset::new(snapshot.clone(), Origin::File("f".into()));
    // A free is two events (requested, completed).
    assert_eq!(whole.waits(), &[1, 2, 5]);
    let mut first = snapshot.clone();
    let rest = first.events.split_off(2).into_vec();
    first.segments = whole.state_at(2).to_segments();
    let mut grown = Dataset::new(first, Origin::Live("l".into()));
    assert_eq!(grown.waits(), &[1]);
    grown.append(&rest);
    assert_eq!(grown.waits(), whole.waits());
}

/// The sums [`Dataset::sums_at`] moved to `pos` (from wherever the last move left them, a
/// checkpoint or the head) against those summed from the state there: the holdings as
/// `holdings_of` sums them, the stack tree's sums by site and the segment figures.
fn check_sums_at(data: &mut Dataset, pos: usize) {
    use vramscope_analysis::model_view::holdings_of;
    let sums = data.sums_at(pos).clone();
    assert!(sums.settled());
    let state = data.state_at(pos).clone();
    let groups = data.groups();
    let unattributed = state.unattributed.allocated;
    assert_eq!(
        sums.holdings().holdings(groups, unattributed),
        holdings_of(&state, groups, &|b| b.step),
        "holdings at {pos}"
    );
    let mut by_site: rustc_hash::FxHashMap<_, (u64, u64)> = Default::default();
    for (_, b) in state.blocks.unordered().filter(|(_, b)| !b.pending) {
        let s = by_site
            .entry((b.site, groups.of_block(b)))
            .or_insert((0, 0));
        s.0 += b.size;
        s.1 += 1;
    }
    if unattributed > 0 {
        by_site
            .entry((None, SiteGroups::BEFORE_TRACE))
            .or_insert((0, 0))
            .0 += unattributed;
    }
    assert_eq!(
        sums.holdings().by_site(groups, unattributed),
        by_site,
        "by site at {pos}"
    );
    assert_eq!(
        sums.segment_figures(&state),
        crate::view::SegmentFigures::from_state(&state),
        "segments at {pos}"
    );
    assert_eq!(*sums.holdings(), Sums::of_state(&state).holdings().clone());
    if let Some((context, tree)) = sums.tree() {
        use vramscope_analysis::call_tree::{CallTree, TreeSums};
        let snapshot = data.snapshot();
        let categories = context.categories.as_deref();
        assert_eq!(
            *tree,
            TreeSums::of_state(&context.keys, categories, &snapshot.events, &state),
            "tree sums at {pos}"
        );
        for max in [3, 200] {
            assert_eq!(
                CallTree::of_sums(snapshot, &context.keys, tree, max),
                CallTree::at(snapshot, &state, categories, max),
                "tree at {pos}"
            );
        }
    }
}

/// Sets `data`'s call-tree context from its snapshot as it is, classified.
fn classify(data: &mut Dataset) {
    let snapshot = data.snapshot();
    let context = TreeContext {
        keys: vramscope_analysis::call_tree::TreeKeys::new(snapshot),
        categories: Some(Arc::new(
            vramscope_analysis::categories::Categories::classify(snapshot),
        )),
    };
    data.set_tree_context(Arc::new(context));
}

/// Over a trace with many checkpoints, the sums at random cursors, each moved event by event
/// from the last, equal the sums of the state there (issue 47).
#[test]
fn the_sums_moved_with_the_cursor_equal_the_states_own_over_many_checkpoints() {
    let mut data = Dataset::new(
        fixture::many_blocks_snapshot(30_000),
        Origin::File("f".into()),
    );
    let n = data.len();
    assert!(data.checkpoints.len() >= 2);
    for (i, pos) in cursor_walk(n, 90, n / 190).into_iter().enumerate() {
        if i == 30 {
            // From here on, the call tree's sums too.
            classify(&mut data);
        }
        check_sums_at(&mut data, pos);
        assert_eq!(data.sums_at(pos).tree().is_some(), i >= 30);
    }
    assert!(
        data.checkpoint_sums.len() >= 2,
        "moves started from checkpoints: {}",
        data.checkpoint_sums.len()
    );
    assert!(
        data.crossings > 10,
        "jumps crossed kept changes {} times",
        data.crossings
    );
}

/// On the training fixture (call sites, steps, segments coming and going), cut in half and
/// grown as a live source is: the sums at any cursor, the head's kept up to date as events
/// come, equal the state's own.
#[test]
fn the_sums_equal_the_states_own_as_a_live_source_grows() {
    let (mut whole, mut grown, rest) = halves();
    classify(&mut whole);
    classify(&mut grown);
    let n = whole.len();
    for pos in cursor_walk(n, 60, 3) {
        check_sums_at(&mut whole, pos);
    }
    let half = grown.len();
    check_sums_at(&mut grown, half);
    for chunk in rest.chunks(7) {
        grown.append(chunk);
        let len = grown.len();
        check_sums_at(&mut grown, len);
        check_sums_at(&mut grown, len / 2);
    }
    grown.trim_front(grown.len() / 3);
    for pos in cursor_walk(grown.len(), 30, 2) {
        check_sums_at(&mut grown, pos);
    }
}

proptest::proptest! {
    #![proptest_config(vramscope_testkit::props::config(64))]

    /// Whatever the trace, consistent or not, and wherever the cursor goes from wherever
    /// it was, the sums moved with the cursor equal the state's own there.
    #[test]
    fn the_sums_at_any_cursor_of_any_trace_are_the_states_own(
        ops in vramscope_testkit::generated::ops(1..5, 1..80),
        live_at_dump in vramscope_testkit::generated::live_at_dump(),
        cursor in proptest::collection::vec(0usize..100, 1..40),
    ) {
        let snapshot = vramscope_testkit::generated::trace_of_ops(&ops, &live_at_dump);
        let n = snapshot.events.len();
        let mut data = Dataset::new(snapshot, Origin::File("f".into()));
        classify(&mut data);
        for pos in cursor.into_iter().map(|c| c % (n + 1)) {
            check_sums_at(&mut data, pos);
        }
    }
}

proptest::proptest! {
    #![proptest_config(vramscope_testkit::props::config(64))]

    /// Any events at all, on a few addresses: blocks and segments allocated, freed, mapped
    /// and unmapped over each other (segments that overlap, blocks outside any segment, frees
    /// of nothing), a dump-time state of a few blocks. Wherever the cursor goes, the sums
    /// moved with it equal the state's own.
    #[test]
    fn the_sums_at_any_cursor_of_any_events_are_the_states_own(
        events in proptest::collection::vec((0usize..8, 0u64..12, 1u64..6, 0u32..3, 0u32..4), 1..200),
        dump in proptest::collection::vec((0u64..12, 1u64..4, proptest::bool::ANY), 0..6),
        cursor in proptest::collection::vec(0usize..400, 1..40),
    ) {
        let kinds = [
            EventKind::Alloc,
            EventKind::Alloc,
            EventKind::FreeRequested,
            EventKind::FreeCompleted,
            EventKind::SegmentAlloc,
            EventKind::SegmentFree,
            EventKind::SegmentMap,
            EventKind::SegmentUnmap,
        ];
        let mut snapshot = Snapshot::empty(Default::default(), Default::default());
        snapshot.sites = (0..3)
            .map(|i| vramscope_model::CallSite {
                file: format!("f{}.py", i % 2),
                line: 1,
                column: 0,
                function: String::new(),
                frames: Vec::new(),
            })
            .collect();
        let unit = 0x10_0000u64;
        for (i, &(kind, slot, size, site, step)) in events.iter().enumerate() {
            let kind = kinds[kind];
            let size = if matches!(kind, EventKind::Alloc | EventKind::FreeRequested | EventKind::FreeCompleted) {
                size * unit / 4
            } else {
                size * unit
            };
            snapshot.events.push(
                vramscope_testkit::event(kind)
                    .addr(slot * unit / 2)
                    .size(size)
                    .site(if site == 2 { None } else { Some(site) })
                    .step(step)
                    .seq(i as u64)
                    .build(),
            );
        }
        // The dump's segment, holding its blocks (overlapping ones dropped).
        let mut blocks: Vec<vramscope_model::Block> = Vec::new();
        let mut end = 0;
        let mut sorted = dump.clone();
        sorted.sort_unstable();
        for (slot, size, pending) in sorted {
            let addr = slot * unit / 2;
            if addr < end {
                continue;
            }
            end = addr + size * unit / 4;
            blocks.push(vramscope_model::Block {
                address: addr,
                size: size * unit / 4,
                requested_size: size,
                state: if pending {
                    vramscope_model::BlockState::ActivePendingFree
                } else {
                    vramscope_model::BlockState::ActiveAllocated
                },
                site: None,
                tag: None,
                scope: None,
                step: 0,
                thread: 0,
            });
        }
        snapshot.segments.push(vramscope_model::Segment {
            device: 0,
            address: 0,
            total_size: 8 * unit,
            stream: 0,
            pool: vramscope_model::Pool::Large,
            expandable: false,
            blocks,
        });
        let n = snapshot.events.len();
        let mut data = Dataset::new(snapshot, Origin::File("f".into()));
        classify(&mut data);
        for pos in cursor.into_iter().map(|c| c % (n + 1)) {
            check_sums_at(&mut data, pos);
        }
    }
}

/// A program recorded with `attach()`'s module marks (the tree names its module calls): the
/// memory panel's tree from the sums moved with the cursor is the tree of the state there,
/// wherever the cursor goes.
#[test]
fn the_call_tree_from_the_sums_is_the_states_own_with_module_marks() {
    use vramscope_testkit::planted::cases::{Program, Shape};
    use vramscope_testkit::planted::StackMode;
    let mut p = Program::new(StackMode::All, Shape::default()).with_marks();
    p.load_model();
    for _ in 0..3 {
        p.train_step(1);
    }
    p.zero_grad();
    p.load_batch();
    p.forward_interrupted(2);
    let snapshot = p.finish("marked").snapshot;
    assert!(!snapshot.annotations.is_empty());
    let n = snapshot.events.len();
    let mut data = Dataset::new(snapshot, Origin::File("f".into()));
    classify(&mut data);
    let mut modules = 0;
    for pos in cursor_walk(n, 80, 5) {
        check_sums_at(&mut data, pos);
        let sums = data.sums_at(pos).clone();
        let (context, tree) = sums.tree().expect("the tree's sums");
        let tree = vramscope_analysis::call_tree::CallTree::of_sums(
            data.snapshot(),
            &context.keys,
            tree,
            200,
        );
        modules += tree
            .nodes
            .iter()
            .filter(|n| n.kind == vramscope_analysis::call_tree::NodeKind::Module)
            .count();
    }
    assert!(modules > 0, "no module call named by the marks");
}

/// The state handed to the analysis at a cut is the dataset's own, shared without a copy; a
/// move while the analysis holds it changes a copy, never the state the analysis reads.
#[test]
fn the_state_at_a_cut_is_shared_and_kept_while_the_cursor_moves() {
    let mut data = Dataset::new(fixture::training_snapshot(), Origin::File("f".into()));
    let n = data.len();
    let pos = n / 2;
    let (full, state) = data.cut_state_at(pos);
    assert!(std::ptr::eq(&*full, data.snapshot()));
    assert!(std::ptr::eq(&*state, data.state_at(pos)), "not copied");
    let (_, segments) = data.cut_at(pos);
    assert_eq!(state.to_segments(), segments);
    let kept = (*state).clone();
    for to in [pos + 7, pos - 5, n - 1, 1] {
        let moved = data.state_at(to).clone();
        assert_eq!(moved.usage(), data.usage_at(to), "at {to}");
        assert_eq!(
            *state, kept,
            "the analysis's state changed at a move to {to}"
        );
    }
    drop(state);
    // Once let go, moves change the state in place again.
    let (_, again) = data.cut_state_at(3);
    let address = Arc::as_ptr(&again);
    drop(again);
    let _ = data.state_at(4);
    assert!(std::ptr::eq(address, data.state_at(4)));
}

/// The checkpoints' sums made off the loop once the dataset is loaded are taken at the next
/// move, one for every checkpoint, each the sums of its own state; the checkpoints' blocks
/// are sorted by address on the way.
#[test]
fn the_checkpoints_are_summed_off_the_loop() {
    let mut data = Dataset::new(
        fixture::many_blocks_snapshot(30_000),
        Origin::File("f".into()),
    );
    let n = data.len();
    let _ = data.sums_at(n);
    let waited = std::time::Instant::now();
    let off_loop: Vec<usize> = data
        .checkpoints
        .iter()
        .filter(|(_, s)| items(s) >= SUM_OFF_LOOP_FROM)
        .map(|(k, _)| *k)
        .collect();
    assert!(!off_loop.is_empty());
    while !off_loop
        .iter()
        .all(|k| data.checkpoint_sums.contains_key(k))
    {
        assert!(
            waited.elapsed() < std::time::Duration::from_secs(60),
            "{} of {} checkpoints summed",
            data.checkpoint_sums.len(),
            data.checkpoints.len()
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
        let _ = data.state_at(n - 1);
    }
    assert!(data.checkpoints.len() >= 2);
    let check = |data: &Dataset| {
        for (k, state) in &data.checkpoints {
            let Some(sums) = data.checkpoint_sums.get(k) else {
                continue;
            };
            assert!(sums.settled());
            assert_eq!(
                *sums.holdings(),
                *Sums::of_state(state).holdings(),
                "at {k}"
            );
            assert_eq!(
                sums.segment_figures(state),
                crate::view::SegmentFigures::from_state(state),
                "at {k}"
            );
            check_order(state, *k);
            if let Some((context, tree)) = sums.tree() {
                let categories = context.categories.as_deref();
                let events = &data.snapshot().events;
                assert_eq!(
                    *tree,
                    vramscope_analysis::call_tree::TreeSums::of_state(
                        &context.keys,
                        categories,
                        events,
                        state
                    ),
                    "tree sums at {k}"
                );
            }
        }
    };
    check(&data);
    // Once the call tree's context is set, the checkpoints are summed again with it.
    classify(&mut data);
    let waited = std::time::Instant::now();
    while !off_loop.iter().all(|&k| data.summed(k)) {
        assert!(waited.elapsed() < std::time::Duration::from_secs(60));
        std::thread::sleep(std::time::Duration::from_millis(10));
        let _ = data.state_at(n - 1);
    }
    check(&data);
}

/// A reload keeps the call tree's context until the next is set, and sums the new
/// checkpoints off the loop with the new snapshot's events, the ones their blocks index: not
/// the events of the snapshot it replaces (here shorter, so that its events would not even
/// reach the new blocks' allocations).
#[test]
fn a_reload_sums_its_checkpoints_with_its_own_events() {
    let mut data = Dataset::new(
        fixture::many_blocks_snapshot(2_000),
        Origin::File("f".into()),
    );
    let _ = data.sums_at(data.len());
    classify(&mut data);
    data.reset(fixture::many_blocks_snapshot(30_000));
    let n = data.len();
    let _ = data.sums_at(n);
    let off_loop: Vec<usize> = data
        .checkpoints
        .iter()
        .filter(|(_, s)| items(s) >= SUM_OFF_LOOP_FROM)
        .map(|(k, _)| *k)
        .collect();
    assert!(!off_loop.is_empty());
    let waited = std::time::Instant::now();
    while !off_loop.iter().all(|&k| data.summed(k)) {
        assert!(
            waited.elapsed() < std::time::Duration::from_secs(60),
            "{} of {} checkpoints summed after the reload",
            data.checkpoint_sums.len(),
            off_loop.len()
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
        let _ = data.state_at(n - 1);
    }
    let context = data.tree_context.clone().expect("the context stays");
    for (k, state) in &data.checkpoints {
        let Some((_, tree)) = data.checkpoint_sums.get(k).and_then(|s| s.tree()) else {
            continue;
        };
        assert_eq!(
            *tree,
            vramscope_analysis::call_tree::TreeSums::of_state(
                &context.keys,
                context.categories.as_deref(),
                &data.snapshot().events,
                state
            ),
            "tree sums at {k}"
        );
    }
}
