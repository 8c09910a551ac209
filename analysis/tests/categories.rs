//! What the memory is made of (issue 46), against cases whose answer is known: the planted
//! PyTorch programs of `vramscope_testkit::planted` (every block's category known to their
//! generator) are classified exactly, the categories add up to the allocated bytes at every
//! moment, a program's own tags decide, and on the shared GPT training step the gradients
//! and the optimizer state are what the model's configuration implies.

use std::path::{Path, PathBuf};

use proptest::prelude::*;
use vramscope_analysis::categories::Categories;
use vramscope_engine::Reconstruction;
use vramscope_model::{Category, CategoryBytes, EventKind};
use vramscope_testkit::planted::{cases, Planted, StackMode};
use vramscope_testkit::{Trace, MIB};

/// What a classifier from evidence alone must answer for each allocation: the truth, or
/// unknown where the recording hides the evidence ([`vramscope_testkit::planted::Truth::hidden`]).
fn expected(case: &Planted, i: usize) -> Category {
    if case.truth.hidden.contains(&i) {
        Category::Unknown
    } else {
        case.truth.allocs[&i]
    }
}

/// Fails naming every allocation classified otherwise than expected, and every moment whose
/// categories do not add up to the engine's allocated bytes.
fn check(case: &Planted) {
    let snap = &case.snapshot;
    let categories = Categories::classify(snap);
    let wrong: Vec<String> = case
        .truth
        .allocs
        .keys()
        .filter(|&&i| categories.of_alloc(i) != expected(case, i))
        .map(|&i| {
            let site = snap.site(snap.events[i].site()).map(|s| s.file_line());
            format!(
                "event {i} at {site:?}: {} where {} is right",
                categories.of_alloc(i),
                expected(case, i)
            )
        })
        .take(10)
        .collect();
    assert!(wrong.is_empty(), "{}: {wrong:#?}", case.name);
    let walk = Reconstruction::from_snapshot(snap);
    let truth = case.truth.after_each(snap);
    assert_eq!(
        categories.at_start(&walk.start),
        case.truth.at_start(),
        "{}",
        case.name
    );
    for (&addr, block) in walk.start.blocks.unordered() {
        assert_eq!(
            Some(categories.of_block(addr, block)),
            case.truth
                .category(vramscope_testkit::planted::BlockKey::BeforeTrace(addr)),
            "{}: the block from before the trace at {addr:#x}",
            case.name
        );
    }
    let mut moments = 0;
    categories.walk(snap, &walk.start, |i, bytes| {
        assert_eq!(
            bytes.total(),
            walk.usage_at(i + 1).allocated,
            "{}: the categories add up to the allocated bytes after event {i}",
            case.name
        );
        if case.truth.hidden.is_empty() {
            assert_eq!(bytes, &truth[i], "{}: after event {i}", case.name);
        }
        moments += 1;
    });
    assert_eq!(moments, snap.events.len());
}

#[test]
fn every_planted_case_is_classified_exactly() {
    for mode in [StackMode::All, StackMode::Python] {
        for case in cases::all_cases(mode) {
            check(&case);
        }
    }
}

#[test]
fn a_closure_run_by_the_optimizer_is_no_optimizer_state() {
    let case = cases::step_with_closure(StackMode::All, 2);
    check(&case);
    let categories = Categories::classify(&case.snapshot);
    let made: Vec<Category> = case
        .truth
        .allocs
        .keys()
        .map(|&i| categories.of_alloc(i))
        .collect();
    for category in [
        Category::Activations,
        Category::Gradients,
        Category::OptimizerState,
        Category::Temporaries,
        Category::Parameters,
        Category::Inputs,
    ] {
        assert!(made.contains(&category), "{category}");
    }
}

#[test]
fn tags_that_name_a_category_decide() {
    let mut t = Trace::new();
    let site = t.site("train.py", 3, "main");
    t.alloc(site, 4 * MIB);
    t.alloc(site, 2 * MIB);
    t.alloc(site, MIB);
    let mut snap = t.finish();
    snap.tags = vec!["weights".to_string(), "loss".to_string()];
    snap.scopes = vec!["train/optimizer".to_string()];
    snap.events.to_mut()[0].tag = vramscope_model::Id::new(0);
    snap.events.to_mut()[1].tag = vramscope_model::Id::new(1);
    snap.events.to_mut()[2].scope = vramscope_model::Id::new(0);
    let categories = Categories::classify(&snap);
    assert_eq!(categories.of_alloc(0), Category::Parameters);
    assert_eq!(
        categories.of_alloc(1),
        Category::Unknown,
        "a tag naming none"
    );
    assert_eq!(categories.of_alloc(2), Category::OptimizerState);
    let walk = Reconstruction::from_snapshot(&snap);
    let mut last = CategoryBytes::new();
    categories.walk(&snap, &walk.start, |_, bytes| last = *bytes);
    assert_eq!(
        last.summary(),
        "7.00 MiB: parameters 4.0, optimizer state 1.0, unknown 2.0"
    );
}

proptest! {
    #![proptest_config(vramscope_testkit::props::config(32))]

    /// Random planted programs (training with either optimizer, closures, inference, late
    /// recordings, interrupted forwards, either stack mode, marked or not) are classified
    /// exactly, and their categories add up to the allocated bytes at every moment.
    #[test]
    fn random_programs_are_classified_exactly(spec in cases::programs(6)) {
        check(&spec.run());
    }
}

fn shared(name: &str) -> Option<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    vramscope_testkit::shared_trace(&root, name)
}

/// The cs336 "medium" model of the shared GPT training step (Wedsonlin/assignment2-systems,
/// the trace's README): vocabulary 10,000, context 512, d_model 1,024, 24 layers, d_ff 4,096,
/// untied embedding and output projection, attention without biases (q, k, v, o: 4 d_model²),
/// a SwiGLU feed-forward (w1, w2, w3: 3 d_model d_ff) and two RMSNorm weights per layer, and a
/// final RMSNorm: 2 × 10,000 × 1,024 + 24 × (4 × 1,024² + 3 × 1,024 × 4,096 + 2 × 1,024) +
/// 1,024 = 423,183,360 parameters, 219 tensors (2 + 24 × 9 + 1), in fp32 (the trace's step runs
/// under bf16 autocast, its parameters stay fp32).
const CS336_PARAMETERS: u64 =
    2 * 10_000 * 1_024 + 24 * (4 * 1_024 * 1_024 + 3 * 1_024 * 4_096 + 2 * 1_024) + 1_024;

#[test]
fn the_gpt_steps_gradients_and_optimizer_state_are_what_its_configuration_implies() {
    let Some(path) = shared("cs336_medium_ctx512_train_step.pickle") else {
        return;
    };
    assert_eq!(CS336_PARAMETERS, 423_183_360);
    let snap = vramscope_import::load(&path).unwrap();
    let categories = Categories::classify(&snap);
    // Requested bytes (PyTorch's rounding to 512 bytes changes none of these tensors); the
    // blocks around them may be larger where a segment's remainder was too small to split.
    let made = |category: Category| {
        snap.events
            .iter()
            .enumerate()
            .filter(|&(i, e)| e.kind == EventKind::Alloc && categories.of_alloc(i) == category)
            .fold((0, 0), |(n, bytes), (_, e)| (n + 1, bytes + e.requested))
    };
    // The recording began after warm-up: the parameters and the first optimizer state were
    // live before it. The backward makes one gradient per parameter tensor, 4 bytes each.
    assert_eq!(made(Category::Gradients), (219, 4 * CS336_PARAMETERS));
    // The user's AdamW replaces its two state tensors per parameter inside the step
    // (`m = beta1 * m + ...`): 8 bytes per parameter made in the trace, the old ones freed.
    assert_eq!(
        made(Category::OptimizerState),
        (2 * 219, 8 * CS336_PARAMETERS)
    );
    // The parameters were live before the trace: the blocks from before it that its backward
    // shows to be parameters (one per gradient, by requested size) are 219 tensors of 4
    // bytes per parameter.
    let requested: std::collections::HashMap<u64, u64> = snap
        .segments
        .iter()
        .flat_map(|s| &s.blocks)
        .map(|b| (b.address, b.requested_size))
        .collect();
    let parameters = categories.parameters_before_trace();
    assert_eq!(parameters.len(), 219);
    assert_eq!(
        parameters.iter().map(|a| requested[a]).sum::<u64>(),
        4 * CS336_PARAMETERS
    );
    // At the end: the parameters, the new optimizer state and the gradients, in blocks at
    // least as large as what was asked for.
    let walk = Reconstruction::from_snapshot(&snap);
    let mut end = CategoryBytes::new();
    categories.walk(&snap, &walk.start, |_, bytes| end = *bytes);
    assert!(end[Category::Parameters] >= 4 * CS336_PARAMETERS);
    assert!(end[Category::Gradients] >= 4 * CS336_PARAMETERS);
    assert!(end[Category::OptimizerState] >= 8 * CS336_PARAMETERS);
    assert_eq!(end.total(), walk.usage_at(snap.events.len()).allocated);
    assert_eq!(end, categories.in_state(&walk.end));
    // What the trace cannot say stays small: under 1 % of the bytes it allocated.
    let all: u64 = snap
        .events
        .iter()
        .filter(|e| e.kind == EventKind::Alloc)
        .map(|e| e.size)
        .sum();
    let (_, unknown) = made(Category::Unknown);
    assert!(unknown * 100 < all, "{unknown} of {all} bytes unknown");
}

/// The report's categories come from the one engine: at the peak and at the end they add up
/// to the allocated bytes the report prints there, before the first event to the baseline,
/// and at each position of its timeline to that position's allocated bytes.
fn report_adds_up(snap: &vramscope_model::Snapshot, name: &str) {
    let report = vramscope_analysis::report::build_report(snap, &Default::default());
    let by = &report.memory_by_category;
    assert_eq!(
        by.peak.total(),
        report.stats.peak_allocated_bytes,
        "{name}: at the peak"
    );
    assert_eq!(
        by.end.total(),
        report.stats.allocated_bytes,
        "{name}: at the end"
    );
    let timeline = &report.timeline;
    assert_eq!(
        timeline.start_categories.total(),
        timeline.start.0,
        "{name}: at the start"
    );
    assert_eq!(timeline.categories.len(), timeline.points.len(), "{name}");
    assert_eq!(by.series.bytes, timeline.categories, "{name}");
    for (point, bytes) in timeline.points.iter().zip(&timeline.categories) {
        assert_eq!(
            bytes.total(),
            point.allocated,
            "{name}: after event {}",
            point.event
        );
    }
    if let Some(last) = timeline.points.last() {
        if last.event as usize + 1 == snap.events.len() {
            assert_eq!(timeline.categories.last(), Some(&by.end), "{name}");
        }
    }
}

#[test]
fn the_reports_categories_add_up_on_every_shared_trace() {
    for name in [
        "cs336_medium_ctx512_train_step.pickle",
        "decomfl_opt125m_zo_fedlearn.pickle",
        "hta_ddp_rank1_v100_profile_memory.trace.json.gz",
    ] {
        let Some(path) = shared(name) else {
            return;
        };
        let snap = vramscope_import::load(&path).unwrap();
        for part in vramscope_engine::devices::parts(snap) {
            report_adds_up(&part, name);
        }
    }
}

#[test]
fn the_reports_categories_add_up_on_planted_cases() {
    for case in cases::all_cases(StackMode::Python) {
        report_adds_up(&case.snapshot, &case.name);
    }
}

proptest! {
    #![proptest_config(vramscope_testkit::props::config(64))]

    /// Generated traces of any shape, consistent or not (blocks freed twice or never
    /// allocated, allocations over live blocks, frees requested and never completed).
    #[test]
    fn the_reports_categories_add_up_on_generated_traces(
        ops in vramscope_testkit::generated::ops(1..5, 1..120),
        live_at_dump in vramscope_testkit::generated::live_at_dump(),
    ) {
        let snap = vramscope_testkit::generated::trace_of_ops(&ops, &live_at_dump);
        report_adds_up(&snap, "generated");
    }
}

/// A trace whose allocations are tagged `tags[i]` (none for `""`), `sizes[i]` MiB each, then
/// an OOM of 64 MiB.
fn tagged_then_oom(allocs: &[(&str, u64)]) -> vramscope_model::Snapshot {
    let mut t = Trace::new();
    let site = t.site("train.py", 3, "main");
    for &(_, mib) in allocs {
        t.alloc(site, mib * MIB);
    }
    t.oom(site, 64 * MIB, MIB);
    let mut snap = t.finish();
    for (i, &(tag, _)) in allocs.iter().enumerate() {
        if !tag.is_empty() {
            let id = snap.tags.len() as u32;
            snap.tags.push(tag.to_string());
            snap.events.to_mut()[i].tag = vramscope_model::Id::new(id);
        }
    }
    snap
}

fn oom_finding(snap: &vramscope_model::Snapshot) -> vramscope_analysis::detect::Finding {
    let report = vramscope_analysis::report::build_report(snap, &Default::default());
    report
        .findings
        .into_iter()
        .find(|f| f.kind == vramscope_analysis::detect::FindingKind::Oom)
        .expect("an OOM finding")
}

/// An OOM says what the memory was made of at the failing request, and its fix follows the
/// largest category the classifier knows, when that holds a fair share; never a fix from
/// unknown memory.
#[test]
fn an_oom_says_what_the_memory_was_made_of_and_its_fix_follows_it() {
    let f = oom_finding(&tagged_then_oom(&[("activations", 6), ("weights", 2)]));
    assert!(
        f.summary
            .ends_with("; the memory allocated then was activations 75 %, parameters 25 %"),
        "{}",
        f.summary
    );
    assert!(
        f.fix.starts_with(
            "activations 75 % of the allocated memory: try activation checkpointing or a smaller micro-batch; "
        ),
        "{}",
        f.fix
    );
    assert_eq!(
        f.evidence
            .get("activations_bytes_at_oom")
            .map(|v| v.to_string()),
        Some((6 * MIB).to_string())
    );
    // Mostly unknown: the composition is said, no category's fix is given.
    let f = oom_finding(&tagged_then_oom(&[
        ("", 12),
        ("weights", 1),
        ("activations", 1),
    ]));
    assert!(
        f.summary
            .contains("unknown 86 %, activations 7 %, parameters 7 %"),
        "{}",
        f.summary
    );
    assert!(f.fix.starts_with("lower the peak"), "{}", f.fix);
    assert!(!f.fix.contains("of the allocated memory"), "{}", f.fix);
}

/// A loop whose weights (4 blocks at `model.py:10`, the first events) are tagged `weights`
/// when `tag` says so, with a 512-byte block kept every step at `train.py:33`, tagged
/// `grad` when `tag` says so.
fn loop_with_leak(tag: bool) -> vramscope_model::Snapshot {
    let mut t = vramscope_testkit::clean_loop(0);
    let leak = t.site("train.py", 33, "train");
    let mut kept = Vec::new();
    for _ in 0..10 {
        t.step();
        t.alloc(leak, 512);
        kept.push(t.snap.events.len() - 1);
    }
    let mut snap = t.finish();
    if tag {
        snap.tags = vec!["weights".to_string(), "grad".to_string()];
        for i in 0..snap.events.len() {
            let e = &snap.events[i];
            if e.kind == EventKind::Alloc && e.size == 8 * MIB {
                snap.events.to_mut()[i].tag = vramscope_model::Id::new(0);
            }
        }
        for i in kept {
            snap.events.to_mut()[i].tag = vramscope_model::Id::new(1);
        }
    }
    snap
}

/// `top_holders` and `retained_per_step` say what the memory is made of by the classifier,
/// and nothing where it says unknown.
#[test]
fn holders_and_retained_memory_say_the_classifiers_category() {
    use vramscope_analysis::detect::FindingKind;
    let findings =
        |snap| vramscope_analysis::report::build_report(&snap, &Default::default()).findings;
    let tagged = findings(loop_with_leak(true));
    let holder = tagged
        .iter()
        .find(|f| f.kind == FindingKind::TopHolders && f.site.as_deref() == Some("model.py:10"))
        .expect("the weights hold memory");
    assert!(
        holder
            .summary
            .contains("allocated in one step (parameters) held"),
        "{}",
        holder.summary
    );
    let leak = tagged
        .iter()
        .find(|f| f.kind == FindingKind::RetainedPerStep)
        .expect("a leak");
    assert!(
        leak.summary
            .contains("; by what made them they are gradients 4.00 KiB"),
        "{}",
        leak.summary
    );
    let plain = findings(loop_with_leak(false));
    let holder = plain
        .iter()
        .find(|f| f.kind == FindingKind::TopHolders && f.site.as_deref() == Some("model.py:10"))
        .expect("the weights hold memory");
    assert!(
        holder.summary.contains("allocated in one step held"),
        "unknown memory gets no category: {}",
        holder.summary
    );
    let leak = plain
        .iter()
        .find(|f| f.kind == FindingKind::RetainedPerStep)
        .expect("a leak");
    assert!(
        !leak.summary.contains("by what made them"),
        "{}",
        leak.summary
    );
}

/// The evidence that names the shared GPT step's parameters (recorded after warm-up, so its
/// parameters were live when recording began): the blocks from before the trace that live
/// through it match the gradients live at the end one to one by *requested* size and count
/// (219 = 2 of 10,000 × 1,024 fp32, 96 of 1,024², 72 of 1,024 × 4,096, 49 of 1,024: the
/// model's configuration, see [`CS336_PARAMETERS`]), with 7 more blocks of other sizes; by
/// *block* size they do not (one embedding-sized gradient got a 40,960,000-byte block where
/// both embedding-sized parameters hold 40 MiB blocks: block sizes follow the segments'
/// splits, not the tensors). So the rule matches requested sizes, exactly per size, and the
/// 7 others stay `before_trace`; the walk, the engine's states and the report name the same
/// blocks.
#[test]
fn the_gpt_steps_parameters_are_the_blocks_from_before_matching_its_gradients() {
    let Some(path) = shared("cs336_medium_ctx512_train_step.pickle") else {
        return;
    };
    let snap = vramscope_import::load(&path).unwrap();
    let categories = Categories::classify(&snap);
    let walk = Reconstruction::from_snapshot(&snap);
    type Counts = std::collections::BTreeMap<u64, u64>;
    let (mut gradients, mut before, mut gradient_blocks, mut before_blocks) =
        (Counts::new(), Counts::new(), Counts::new(), Counts::new());
    for (&addr, block) in walk.end.blocks.unordered() {
        if block.pending {
            continue;
        }
        let (by_request, by_block) = match categories.of_block(addr, block) {
            _ if block.predates_trace() => (&mut before, &mut before_blocks),
            Category::Gradients => (&mut gradients, &mut gradient_blocks),
            _ => continue,
        };
        *by_request.entry(block.requested).or_default() += 1;
        *by_block.entry(block.size).or_default() += 1;
    }
    let d = 1_024u64;
    let expected: Counts = [
        (4 * d, 49),
        (4 * d * d, 96),
        (16 * d * d, 72),
        (4 * 10_000 * d, 2),
    ]
    .into_iter()
    .collect();
    assert_eq!(gradients, expected);
    assert_eq!(gradients.values().sum::<u64>(), 219);
    for (size, n) in &gradients {
        assert_eq!(
            before.get(size),
            Some(n),
            "one to one at {size} bytes requested"
        );
    }
    assert_eq!(
        before.values().sum::<u64>(),
        226,
        "and 7 blocks of other sizes"
    );
    let by_block_size_matches = gradient_blocks
        .iter()
        .all(|(size, n)| before_blocks.get(size) == Some(n));
    assert!(
        !by_block_size_matches,
        "block sizes do not match one to one: {gradient_blocks:?} against {before_blocks:?}"
    );
    // The classifier names exactly the matched blocks, and says `before_trace` of the 7.
    let mut named: Vec<u64> = walk
        .end
        .blocks
        .unordered()
        .filter(|&(&addr, b)| !b.pending && categories.of_block(addr, b) == Category::Parameters)
        .map(|(&addr, _)| addr)
        .collect();
    named.sort_unstable();
    assert_eq!(named, categories.parameters_before_trace());
    let mut end = CategoryBytes::new();
    categories.walk(&snap, &walk.start, |_, bytes| end = *bytes);
    let before_bytes: u64 = walk
        .end
        .blocks
        .unordered()
        .filter(|&(&addr, b)| {
            !b.pending
                && b.predates_trace()
                && categories.of_block(addr, b) == Category::BeforeTrace
        })
        .map(|(_, b)| b.size)
        .sum();
    assert_eq!(
        before_bytes,
        end[Category::BeforeTrace] - walk.end.unattributed.allocated
    );
    let report = vramscope_analysis::report::build_report(&snap, &Default::default());
    assert_eq!(report.memory_by_category.end, end);
    assert_eq!(
        report.memory_by_category.end,
        categories.in_state(&walk.end)
    );
}

/// A late recording names its parameters only where the trace shows which blocks they are:
/// one gradient of the recorded backward for each, by requested size, and nothing else from
/// before the trace of those sizes.
#[test]
fn a_late_recording_names_its_parameters_only_where_the_gradients_show_them() {
    let layers = vramscope_testkit::planted::cases::Shape::default().layers;
    for mode in [StackMode::All, StackMode::Python] {
        // The user's own optimizer replaces its state every step: the weights and biases
        // alone live through the recording.
        let case = cases::late_recording_own_optimizer(mode, 2, 2);
        let categories = Categories::classify(&case.snapshot);
        assert_eq!(categories.parameters_before_trace().len(), 2 * layers);
        // torch's AdamW keeps two state tensors of each parameter's size: three blocks per
        // gradient, so it abstains.
        let case = cases::late_recording(mode, 2, 2);
        let categories = Categories::classify(&case.snapshot);
        assert!(categories.parameters_before_trace().is_empty());
        // A recording with no backward shows no gradient to match.
        let mut p = cases::Program::new(mode, Default::default())
            .with_optimizer(cases::Optimizer::OutOfPlace);
        p.load_model();
        p.train_step(1);
        p.rec.start_recording();
        p.inference_step();
        let case = p.finish("inference_after_warm_up");
        let categories = Categories::classify(&case.snapshot);
        assert!(categories.parameters_before_trace().is_empty());
        check(&case);
    }
    // A copy of the weights from before the trace (an EMA model, a reference model) doubles
    // every count: it abstains rather than pick one of two.
    let mut case = cases::late_recording_own_optimizer(StackMode::All, 2, 2);
    let named = Categories::classify(&case.snapshot)
        .parameters_before_trace()
        .to_vec();
    let copies: Vec<_> = case
        .snapshot
        .segments
        .iter()
        .filter(|s| s.blocks.iter().any(|b| named.contains(&b.address)))
        .map(|s| {
            let mut copy = s.clone();
            copy.address += 1 << 44;
            for b in &mut copy.blocks {
                b.address += 1 << 44;
            }
            copy
        })
        .collect();
    case.snapshot.segments.extend(copies);
    let categories = Categories::classify(&case.snapshot);
    assert!(categories.parameters_before_trace().is_empty());
}
