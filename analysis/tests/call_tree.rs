//! The model's own tree (issue 46) against planted programs whose every block is known: which
//! layer holds the activations, with `attach()`'s module marks and without; the nodes' bytes
//! add up to the engine's allocated bytes at any moment; the tree is bounded and
//! deterministic; and on the shared GPT training step the activations at the peak sit under
//! the model's `forward`.

use std::path::{Path, PathBuf};

use proptest::prelude::*;
use vramscope_analysis::call_tree::{CallTree, NodeKind};
use vramscope_analysis::categories::Categories;
use vramscope_engine::{MemoryState, Reconstruction};
use vramscope_model::{Category, Snapshot};
use vramscope_testkit::planted::cases::{self, Program, Shape};
use vramscope_testkit::planted::StackMode;
use vramscope_testkit::MIB;

/// The engine's state after the first `pos` events, and its allocated bytes.
fn state_at(snap: &Snapshot, pos: usize) -> (MemoryState, u64) {
    let walk = Reconstruction::from_snapshot(snap);
    let state = walk.state_walked(&snap.events, pos);
    (state, walk.usage_at(pos).allocated)
}

/// Fails unless every node's children add up to no more than the node, are sorted by bytes
/// ("other" last) and the root holds `allocated`.
fn check_sums(tree: &CallTree, allocated: u64) {
    let root = tree.root().expect("a root");
    assert_eq!(root.kind, NodeKind::Root);
    assert_eq!(root.bytes, allocated, "the root holds every allocated byte");
    assert_eq!(root.categories.total(), allocated);
    for (i, node) in tree.nodes.iter().enumerate() {
        let children: Vec<_> = node
            .children
            .iter()
            .map(|&c| &tree.nodes[c as usize])
            .collect();
        let bytes: u64 = children.iter().map(|c| c.bytes).sum();
        let blocks: u64 = children.iter().map(|c| c.blocks).sum();
        assert!(bytes <= node.bytes && blocks <= node.blocks, "node {i}");
        assert_eq!(node.categories.total(), node.bytes, "node {i}");
        let sized: Vec<u64> = children
            .iter()
            .filter(|c| c.kind != NodeKind::Other)
            .map(|c| c.bytes)
            .collect();
        assert!(sized.windows(2).all(|w| w[0] >= w[1]), "node {i} sorted");
        assert!(children
            .iter()
            .position(|c| c.kind == NodeKind::Other)
            .is_none_or(|k| k + 1 == children.len()));
        for c in &children {
            assert_eq!(c.depth, node.depth + 1);
        }
    }
}

/// A marked program's dump in the middle of its third forward, two of four layers done.
fn mid_forward(mode: StackMode, marked: bool) -> Snapshot {
    let mut p = Program::new(mode, Shape::default());
    if marked {
        p = p.with_marks();
    }
    p.load_model();
    p.train_step(1);
    p.train_step(1);
    p.zero_grad();
    p.load_batch();
    p.forward_interrupted(2);
    p.finish("mid_forward").snapshot
}

fn find<'a>(tree: &'a CallTree, label: &str) -> Vec<&'a vramscope_analysis::call_tree::CallNode> {
    tree.nodes.iter().filter(|n| n.label == label).collect()
}

#[test]
fn marks_name_the_layers_that_hold_the_activations() {
    let snap = mid_forward(StackMode::All, true);
    let (state, allocated) = state_at(&snap, snap.events.len());
    let categories = Categories::classify(&snap);
    let tree = CallTree::at(&snap, &state, Some(&categories), 200);
    check_sums(&tree, allocated);
    let shape = Shape::default();
    // Each layer done keeps its `addmm` and `gelu` outputs for the backward.
    // Each layer done keeps its `addmm` output (made at the model's line 31, which calls the
    // layer) and its `gelu` output (line 33) for the backward.
    for layer in 0..2 {
        let name = format!("Model.layers.{layer}");
        let mut blocks = 0;
        let mut activations = 0;
        for (i, node) in tree
            .nodes
            .iter()
            .enumerate()
            .filter(|(_, n)| n.label == name)
        {
            assert_eq!(node.kind, NodeKind::Module);
            blocks += node.blocks;
            activations += node.categories[Category::Activations];
            let path = tree.path_of(i);
            assert!(
                path.ends_with(&format!(
                    "train.py:44 train > Model > model.py:31 forward > {name}"
                )) || path.ends_with(&format!(
                    "train.py:44 train > Model > model.py:33 forward > {name}"
                )),
                "{path}"
            );
        }
        assert_eq!(blocks, 2, "{name}");
        assert_eq!(activations, 2 * shape.activation, "{name}");
    }
    assert!(
        find(&tree, "Model.layers.2").is_empty(),
        "the forward stopped at layer 2"
    );
    // The parameters, made by `model.to(device)` at the script's line 20.
    let params = find(&tree, "train.py:20 main");
    assert_eq!(params.len(), 1);
    assert_eq!(
        params[0].categories[Category::Parameters],
        shape.layers as u64 * (shape.weight + shape.bias)
    );
}

#[test]
fn without_marks_the_lines_of_forward_hold_the_activations() {
    for mode in [StackMode::All, StackMode::Python] {
        let snap = mid_forward(mode, false);
        let (state, allocated) = state_at(&snap, snap.events.len());
        let categories = Categories::classify(&snap);
        let tree = CallTree::at(&snap, &state, Some(&categories), 200);
        check_sums(&tree, allocated);
        assert!(tree.nodes.iter().all(|n| n.kind != NodeKind::Module));
        let shape = Shape::default();
        for line in ["model.py:31 forward", "model.py:33 forward"] {
            let nodes = find(&tree, line);
            assert_eq!(nodes.len(), 1, "{mode:?} {line}");
            assert_eq!(nodes[0].blocks, 2, "two layers done");
            assert_eq!(
                nodes[0].categories[Category::Activations],
                2 * shape.activation,
                "{mode:?} {line}"
            );
        }
    }
}

#[test]
fn a_bounded_tree_sums_the_rest_into_other_and_is_deterministic() {
    let case = cases::adamw_training(StackMode::All, 2);
    let snap = &case.snapshot;
    let categories = Categories::classify(snap);
    for pos in [
        snap.events.len() / 3,
        snap.events.len() / 2,
        snap.events.len(),
    ] {
        let (state, allocated) = state_at(snap, pos);
        let full = CallTree::at(snap, &state, Some(&categories), usize::MAX);
        check_sums(&full, allocated);
        assert!(full.nodes.iter().all(|n| n.kind != NodeKind::Other));
        for max in [2, 3, 5, 8] {
            let tree = CallTree::at(snap, &state, Some(&categories), max);
            assert!(
                tree.nodes.len() <= max,
                "{} nodes for {max}",
                tree.nodes.len()
            );
            check_sums(&tree, allocated);
            if full.nodes.len() > max {
                assert!(tree.nodes.iter().any(|n| n.kind == NodeKind::Other));
            }
            assert_eq!(tree, CallTree::at(snap, &state, Some(&categories), max));
        }
    }
}

proptest! {
    #![proptest_config(vramscope_testkit::props::config(16))]

    /// On random planted programs, at any moment, the tree holds exactly the allocated bytes
    /// and its categories are the classifier's walk's at that moment.
    #[test]
    fn random_programs_add_up_at_any_moment(spec in cases::programs(5), at in 0.0f64..=1.0) {
        let case = spec.run();
        let snap = &case.snapshot;
        let pos = (at * snap.events.len() as f64) as usize;
        let categories = Categories::classify(snap);
        let (state, allocated) = state_at(snap, pos);
        let tree = CallTree::at(snap, &state, Some(&categories), 40);
        check_sums(&tree, allocated);
        let walk = Reconstruction::from_snapshot(snap);
        let mut walked = categories.at_start(&walk.start);
        categories.walk(snap, &walk.start, |i, bytes| if i + 1 == pos { walked = *bytes });
        prop_assert_eq!(tree.categories(), walked);
    }
}

fn shared(name: &str) -> Option<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    vramscope_testkit::shared_trace(&root, name)
}

#[test]
fn the_gpt_steps_activations_at_the_peak_sit_under_the_models_forward() {
    let Some(path) = shared("cs336_medium_ctx512_train_step.pickle") else {
        return;
    };
    let snap = vramscope_import::load(&path).unwrap();
    let categories = Categories::classify(&snap);
    let walk = Reconstruction::from_snapshot(&snap);
    let peak = (0..=snap.events.len())
        .max_by_key(|&p| (walk.usage_at(p).allocated, std::cmp::Reverse(p)))
        .unwrap();
    let state = walk.state_walked(&snap.events, peak);
    let tree = CallTree::at(&snap, &state, Some(&categories), 200);
    check_sums(&tree, walk.usage_at(peak).allocated);
    let root = &tree.nodes[0];
    let activations = root.categories[Category::Activations];
    assert!(
        activations > 6 * 1024 * MIB,
        "{}",
        root.categories.summary()
    );
    // The transformer's loop over its 24 blocks (`x = layer(x)` at model.py:253) holds the
    // activations, under the driver's line that runs the model.
    let lines = find(&tree, "model.py:253 forward");
    assert_eq!(lines.len(), 1);
    assert!(lines[0].categories[Category::Activations] * 100 >= activations * 95);
    assert_eq!(
        tree.nodes[root.children[0] as usize].label,
        "nsys_profile.py:249 <module>"
    );
    // The largest of them: each layer's attention probabilities (`softmax` in the user's
    // `scaled_dot_product_attention`), kept for the backward. One block per layer, each
    // 512 x 512 (the context) x 64 (batch 4 x 16 heads of the medium model) fp32 values
    // (softmax runs in fp32 under autocast): 64 MiB.
    let softmax = find(&tree, "nn_utils.py:6 softmax");
    assert_eq!(softmax.len(), 1);
    assert_eq!(softmax[0].blocks, 24);
    assert_eq!(softmax[0].categories[Category::Activations], 24 * 64 * MIB);
}

/// The explorer's chart of categories adds up to its allocated bytes in every column, and each
/// moment carries its call tree, whose root holds the moment's allocated blocks.
#[test]
fn the_explorers_categories_add_up_and_its_moments_carry_the_tree() {
    use vramscope_analysis::explorer::{ExplorerData, MAX_TREE_NODES};
    use vramscope_analysis::model_view::ModelView;
    for case in [
        cases::adamw_training(StackMode::All, 3),
        cases::late_recording(StackMode::Python, 2, 2),
    ] {
        let view = ModelView::new(&case.snapshot);
        let data = ExplorerData::build(&view, None);
        for (k, &allocated) in data.allocated.iter().enumerate() {
            let sum: u64 = data.categories.iter().map(|c| c.values[k]).sum();
            assert_eq!(sum, allocated, "{}: column {k}", case.name);
        }
        let names: Vec<&str> = data.categories.iter().map(|c| c.name).collect();
        assert!(
            names.contains(&"activations") && names.contains(&"gradients"),
            "{names:?}"
        );
        let peak = data.peak_moment().expect("the peak is a moment");
        assert!(!peak.tree.is_empty() && peak.tree.len() <= MAX_TREE_NODES);
        assert_eq!(peak.tree[0].1, -1, "the root first");
        assert_eq!(peak.tree[0].2, peak.allocated, "{}", case.name);
        for (i, node) in peak.tree.iter().enumerate().skip(1) {
            assert!(
                (0..i as i64).contains(&node.1),
                "a parent comes before its child"
            );
        }
    }
}
