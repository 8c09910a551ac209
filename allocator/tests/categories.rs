//! The allocator's live face of what memory is made of (issue 46): a program's tags and scopes
//! that name a category ([`Category::from_tag`], [`Category::from_scope`]) reach the snapshot,
//! its JSON file and its blocks, so every reader can say what each block is; tags and scopes
//! that name none say nothing.

use vramscope_allocator::{CachingAllocator, SimDevice};
use vramscope_model::{AllocatorConfig, Category, EventKind, Snapshot};

const MIB: u64 = 1 << 20;

/// The category that a block's or event's tag, else its scope, names in `snap`.
fn named(snap: &Snapshot, tag: Option<u32>, scope: Option<u32>) -> Option<Category> {
    snap.tag(tag)
        .and_then(Category::from_tag)
        .or_else(|| snap.scope(scope).and_then(Category::from_scope))
}

#[test]
fn tags_and_scopes_that_name_a_category_reach_the_dump() {
    let alloc = CachingAllocator::new(SimDevice::phantom(1 << 34), AllocatorConfig::default());
    // (size, what the program says, the category that says).
    let weights = alloc.tagged("weights").alloc(4 * MIB).unwrap();
    let grads = alloc
        .tagged(Category::Gradients.as_str())
        .alloc(5 * MIB)
        .unwrap();
    let loss = alloc.tagged("loss").alloc(6 * MIB).unwrap();
    let (state, activation, scratch) = {
        let _train = alloc.scope("train");
        let state = {
            let _optimizer = alloc.scope("optimizer");
            alloc.alloc(7 * MIB).unwrap()
        };
        let _forward = alloc.scope("forward");
        let activation = alloc.tagged("activation").alloc(8 * MIB).unwrap();
        let scratch = alloc.alloc(9 * MIB).unwrap();
        (state, activation, scratch)
    };
    let expected = [
        (4 * MIB, Some(Category::Parameters)),
        (5 * MIB, Some(Category::Gradients)),
        (6 * MIB, None),
        (7 * MIB, Some(Category::OptimizerState)),
        (8 * MIB, Some(Category::Activations)),
        (9 * MIB, None),
    ];

    // Through a file, as a dump is read.
    let dir = std::env::temp_dir().join(format!("vramscope-categories-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("dump.json");
    alloc.snapshot().save(&path).unwrap();
    let snap = Snapshot::load(&path).unwrap();
    std::fs::remove_dir_all(&dir).unwrap();

    let mut by_event: Vec<(u64, Option<Category>)> = snap
        .events
        .iter()
        .filter(|e| e.kind == EventKind::Alloc)
        .map(|e| (e.size, named(&snap, e.tag(), e.scope())))
        .collect();
    by_event.sort_by_key(|&(size, _)| size);
    assert_eq!(by_event, expected, "the allocations' events");

    let mut by_block: Vec<(u64, Option<Category>)> = snap
        .segments
        .iter()
        .flat_map(|s| &s.blocks)
        .filter(|b| b.state == vramscope_model::BlockState::ActiveAllocated)
        .map(|b| (b.size, named(&snap, b.tag, b.scope)))
        .collect();
    by_block.sort_by_key(|&(size, _)| size);
    assert_eq!(by_block, expected, "the live blocks at the dump");
    drop((weights, grads, loss, state, activation, scratch));
}
