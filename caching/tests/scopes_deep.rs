//! Scopes a program never closes (issue 33): 30,000 nested scopes through the allocator's API
//! cost a table linear in the scopes opened (a parent's id and a name each, the name stored
//! once), scopes past `MAX_SCOPE_DEPTH` are refused and counted rather than fatal, the paths a
//! snapshot shows stay bounded, and the allocator works on once they are closed.

use vramscope_caching::provenance::{MAX_SCOPE_DEPTH, MAX_SCOPE_PATH_BYTES};
use vramscope_caching::{CachingAllocator, SimDevice, StreamId};
use vramscope_model::AllocatorConfig;

fn allocator() -> CachingAllocator<SimDevice> {
    CachingAllocator::new(SimDevice::phantom(1 << 34), AllocatorConfig::default())
}

/// The scope path of the block at `addr` in `alloc`'s snapshot.
fn scope_of(alloc: &CachingAllocator<SimDevice>, addr: u64) -> Option<String> {
    let snapshot = alloc.snapshot();
    let block = snapshot
        .segments
        .iter()
        .flat_map(|s| &s.blocks)
        .find(|b| b.address == addr)
        .expect("the block");
    snapshot.scope(block.scope).map(str::to_string)
}

#[test]
fn thirty_thousand_nested_scopes_cost_a_linear_table_and_the_deep_ones_are_refused() {
    let alloc = allocator();
    let pushes = 30_000;
    let mut guards = Vec::with_capacity(pushes);
    let mut refused = 0;
    for _ in 0..pushes {
        match alloc.try_scope("loop") {
            Some(guard) => guards.push(guard),
            None => refused += 1,
        }
    }
    assert_eq!(guards.len(), MAX_SCOPE_DEPTH);
    assert_eq!(refused, pushes - MAX_SCOPE_DEPTH);
    // The infallible form refuses the same way: its guard opens nothing.
    let inert = alloc.scope("loop");
    assert!(!inert.is_open());
    let stats = alloc.scope_stats();
    assert_eq!(stats.scopes, MAX_SCOPE_DEPTH);
    assert_eq!(stats.refused, (pushes - MAX_SCOPE_DEPTH + 1) as u64);
    assert!(
        stats.table_bytes < 100 * MAX_SCOPE_DEPTH,
        "{} bytes for {} scopes",
        stats.table_bytes,
        stats.scopes
    );

    // An allocation inside carries the deepest scope opened; its path is cut, innermost kept.
    let deep = alloc.alloc_ptr(4096, StreamId::DEFAULT).unwrap();
    let path = scope_of(&alloc, deep).expect("a scope");
    assert!(path.len() <= MAX_SCOPE_PATH_BYTES, "{} bytes", path.len());
    assert!(
        path.starts_with('…') && path.ends_with("/loop/loop"),
        "{path}"
    );
    let snapshot = alloc.snapshot();
    let rendered: usize = snapshot.scopes.iter().map(String::len).sum();
    assert!(
        rendered <= MAX_SCOPE_DEPTH * MAX_SCOPE_PATH_BYTES,
        "{rendered} bytes of paths"
    );
    assert_eq!(
        snapshot.scopes[2], "loop/loop/loop",
        "paths render as before"
    );

    // Closed, innermost first: the allocator works on, and scopes open at the top again.
    drop(inert);
    while guards.pop().is_some() {}
    let _outer = alloc.scope("outer");
    let _inner = alloc.scope("inner");
    let fresh = alloc.alloc_ptr(4096, StreamId::DEFAULT).unwrap();
    assert_eq!(scope_of(&alloc, fresh).as_deref(), Some("outer/inner"));
    alloc.free_ptr(deep).unwrap();
    alloc.free_ptr(fresh).unwrap();
    alloc.check_invariants().unwrap();
}

#[test]
fn distinct_names_at_every_level_cost_a_few_bytes_a_scope_and_each_name_once() {
    let alloc = allocator();
    let mut guards = Vec::new();
    let mut names = 0;
    for level in 0..MAX_SCOPE_DEPTH {
        let name = format!("layer{level}");
        names += name.len();
        guards.push(alloc.try_scope(&name).expect("within the cap"));
    }
    assert!(alloc.try_scope("one too many").is_none());
    let stats = alloc.scope_stats();
    assert_eq!(stats.refused, 1);
    // Entries and index (about 50 bytes a scope) and each name with its index entry (twice
    // its text and about 100 bytes): nothing grows with the depth of a scope.
    assert!(
        stats.table_bytes < 200 * MAX_SCOPE_DEPTH + 2 * names,
        "{} bytes",
        stats.table_bytes
    );
}

#[test]
fn scopes_on_other_threads_nest_apart_and_count_their_own_depth() {
    let alloc = allocator();
    let mut guards = Vec::new();
    for _ in 0..MAX_SCOPE_DEPTH {
        guards.push(alloc.try_scope("main").unwrap());
    }
    assert!(alloc.try_scope("main").is_none());
    // Another thread starts at the top: the cap is a depth, not a count of scopes.
    let other = alloc.clone();
    let path = std::thread::spawn(move || {
        let _a = other
            .try_scope("worker")
            .expect("a thread's own first level");
        let _b = other.try_scope("step").expect("its second");
        let addr = other.alloc_ptr(512, StreamId::DEFAULT).unwrap();
        let path = scope_of(&other, addr);
        other.free_ptr(addr).unwrap();
        path
    })
    .join()
    .unwrap();
    assert_eq!(path.as_deref(), Some("worker/step"));
}
