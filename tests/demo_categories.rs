//! The demo's trainer says what its memory is made of (issue 46): its allocator scopes
//! (`kernels/src/train.rs`) name each block, so on its snapshot the classifier finds the
//! weights and biases as parameters, AdamW's two moments per parameter as optimizer state,
//! the accumulation buffers as gradients, the batch as inputs and what the forward keeps as
//! activations, in the bytes the model's shape implies.

use vramscope::allocator::{CachingAllocator, DeviceBackend};
use vramscope::analysis::categories::Categories;
use vramscope::engine::Reconstruction;
use vramscope::kernels::{train, Device, TrainConfig};
use vramscope::model::{AllocatorConfig, Category, CategoryBytes, Snapshot};

/// A request's block size: PyTorch's rounding to 512 bytes, as the allocator applies it.
fn block(bytes: u64) -> u64 {
    bytes.div_ceil(512).max(1) * 512
}

/// The demo trainer's recording of `config` on a simulated device of 256 MiB.
fn recorded(config: &TrainConfig) -> Snapshot {
    let settings = AllocatorConfig {
        record_events: true,
        ..AllocatorConfig::default()
    };
    let device = Device::new(CachingAllocator::new(
        DeviceBackend::sim(256 << 20),
        settings,
    ));
    train(&device, config).unwrap().snapshot
}

#[test]
fn the_demos_trainer_names_what_its_memory_is() {
    for grad_accum in [1, 2] {
        let config = TrainConfig {
            steps: 6,
            batch: 32,
            inputs: 16,
            hidden: 32,
            classes: 4,
            log_every: 3,
            grad_accum,
            ..TrainConfig::default()
        };
        let snap = recorded(&config);
        let categories = Categories::classify(&snap);
        let walk = Reconstruction::from_snapshot(&snap);
        let (d, h, c, b) = (
            config.inputs as u64,
            config.hidden as u64,
            config.classes as u64,
            config.batch as u64,
        );
        // f32 weights and biases of the two layers.
        let parameters: u64 = [d * h, h, h * c, c].iter().map(|&n| block(4 * n)).sum();
        let end = categories.in_state(&walk.end);
        assert_eq!(
            end[Category::Parameters],
            parameters,
            "accumulation {grad_accum}"
        );
        assert_eq!(end[Category::OptimizerState], 2 * parameters);
        let buffers = if grad_accum > 1 { parameters } else { 0 };
        assert_eq!(
            end[Category::Gradients],
            buffers,
            "the accumulation buffers"
        );
        // While it trained: each micro-batch's inputs and labels, the forward's activations,
        // the backward's gradients and temporaries, at their most.
        let mut most = CategoryBytes::new();
        categories.walk(&snap, &walk.start, |_, bytes| {
            for category in Category::ALL {
                let now = bytes[category];
                if now > most[category] {
                    most.add(category, now - most[category]);
                }
            }
        });
        assert_eq!(most[Category::Inputs], block(4 * b * d) + block(4 * b));
        // The forward keeps the first layer's output before and after the relu, and the
        // logits.
        assert!(most[Category::Activations] >= 2 * block(4 * b * h) + block(4 * b * c));
        assert!(most[Category::Gradients] >= parameters);
        assert!(most[Category::Temporaries] >= block(4 * b * h));
    }
}

/// The demo's recording names the line that allocated each block, without a stack: the
/// call tree (the dashboard's Memory panel, the HTML page's moments) is built from those
/// lines, so its nodes are the trainer's lines, not one "(no line of the user's)".
#[test]
fn the_demos_call_tree_is_the_trainers_lines() {
    use vramscope::analysis::call_tree::{CallTree, NodeKind};
    let config = TrainConfig {
        steps: 4,
        batch: 32,
        inputs: 16,
        hidden: 32,
        classes: 4,
        log_every: 2,
        ..TrainConfig::default()
    };
    let snap = recorded(&config);
    let categories = Categories::classify(&snap);
    let walk = Reconstruction::from_snapshot(&snap);
    let tree = CallTree::at(&snap, &walk.end, Some(&categories), 64);
    let root = tree.root().expect("a root");
    assert_eq!(root.bytes, walk.end.allocated);
    assert!(!root.children.is_empty());
    for &c in &root.children {
        let node = &tree.nodes[c as usize];
        assert_eq!(node.kind, NodeKind::Line, "{node:?}");
        let line = node.label.strip_prefix("train.rs:").expect(&node.label);
        assert!(line.parse::<u32>().is_ok(), "{}", node.label);
    }
    // The largest node is the first layer's weight line, where `Param::new` makes the
    // weight and AdamW's two moments: optimizer state is most of it.
    let first = &tree.nodes[root.children[0] as usize];
    assert_eq!(first.main_category(), Some(Category::OptimizerState));
}
