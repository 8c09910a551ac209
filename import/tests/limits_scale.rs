//! No cliff (issue 18): the pickle reader's bounds scale with the input instead of being fixed
//! counts, so a genuine snapshot of a million events with deep stacks loads, while a small
//! crafted file still cannot make a large document; each limit's error names the limit, the
//! input size it corresponds to, and how to raise the ceiling.
//!
//! The big snapshot is generated here, byte by byte through the project's pickle writer (never
//! committed): a million trace entries, each with a stack of its own list of 32 frames shared
//! through the memo, as PyTorch writes them. Counting each memo reference twice, the reader used
//! to refuse it with "more than 67108864 container elements".

use vramscope_import::{self as import, ImportErrorKind, ImportOptions};
use vramscope_model::EventKind;
use vramscope_pickle::{Document, Limits, MemoRef, PickleErrorKind, PickleWriter};

/// Distinct frame dicts the generated stacks are made of.
const FRAMES: usize = 200;
/// Frames per stack.
const DEPTH: usize = 32;
/// Distinct stacks.
const STACKS: usize = 64;

/// A PyTorch-shaped snapshot pickle with `events` trace entries: one 20 MiB segment, then
/// allocations of 2 MiB at its start, each requested, freed and completed in turn.
fn generated_snapshot(events: usize) -> Vec<u8> {
    let base: u64 = 0x7f00_0000_0000;
    let segment: u64 = 20 << 20;
    let block: u64 = 2 << 20;
    let mut w = PickleWriter::new();
    let mut strings = rustc_hash::FxHashMap::default();
    w.begin_dict();
    // The frame dicts come first so that their memo slots are below 256 (two-byte references).
    w.str("external_annotations");
    w.begin_list();
    w.end_list();
    w.str("device_traces");
    w.begin_list();
    w.begin_list();
    let entry = |w: &mut PickleWriter,
                 strings: &mut rustc_hash::FxHashMap<String, MemoRef>,
                 action: &str,
                 addr: u64,
                 size: u64,
                 time_us: u64,
                 frames: &dyn Fn(&mut PickleWriter)| {
        w.begin_dict();
        w.shared_str("action", strings);
        w.shared_str(action, strings);
        w.shared_str("addr", strings);
        w.uint(addr);
        w.shared_str("size", strings);
        w.uint(size);
        w.shared_str("stream", strings);
        w.uint(0);
        w.shared_str("time_us", strings);
        w.uint(time_us);
        w.shared_str("frames", strings);
        frames(w);
        w.end_dict();
    };
    // The first entry's stack defines every frame dict.
    let mut slots: Vec<MemoRef> = Vec::with_capacity(FRAMES);
    w.begin_dict();
    w.str("action");
    w.str("segment_alloc");
    w.str("addr");
    w.uint(base);
    w.str("size");
    w.uint(segment);
    w.str("stream");
    w.uint(0);
    w.str("time_us");
    w.uint(1_700_000_000_000_000);
    w.str("frames");
    w.begin_list();
    for f in 0..FRAMES {
        w.begin_dict();
        w.str("filename");
        w.str(&format!("/home/user/project/model/layer_{}.py", f % 37));
        w.str("line");
        w.uint(10 + f as u64);
        w.str("name");
        w.str(&format!("forward_{f}"));
        w.end_dict();
        slots.push(w.memoize());
    }
    w.end_list();
    w.end_dict();
    let slots = &slots;
    let stack = |k: usize| {
        move |w: &mut PickleWriter| {
            w.begin_list();
            for j in 0..DEPTH {
                w.get(slots[(k * 7 + j) % FRAMES]);
            }
            w.end_list();
        }
    };
    let actions = ["alloc", "free_requested", "free_completed"];
    for i in 0..events - 1 {
        let time_us = 1_700_000_000_000_000 + 1 + i as u64;
        let frames = stack((i / 3) % STACKS);
        entry(
            &mut w,
            &mut strings,
            actions[i % 3],
            base,
            block,
            time_us,
            &frames,
        );
    }
    w.end_list();
    w.end_list();
    w.str("segments");
    w.begin_list();
    w.begin_dict();
    for (key, value) in [("device", 0), ("address", base), ("total_size", segment)] {
        w.str(key);
        w.uint(value);
    }
    w.str("stream");
    w.uint(0);
    w.str("segment_type");
    w.str("large");
    w.str("blocks");
    w.begin_list();
    w.begin_dict();
    w.str("address");
    w.uint(base);
    w.str("size");
    w.uint(segment);
    w.str("state");
    w.str("inactive");
    w.end_dict();
    w.end_list();
    w.end_dict();
    w.end_list();
    w.str("allocator_settings");
    w.begin_dict();
    w.end_dict();
    w.end_dict();
    w.finish()
}

#[test]
fn a_generated_million_event_snapshot_with_deep_stacks_loads() {
    let events = 1_000_000;
    let bytes = generated_snapshot(events);
    // Past the old cliff: more than 67,108,864 elements when memo references counted twice.
    let references = (events - 1) * DEPTH;
    assert!(
        2 * references + 12 * events > 64 << 20,
        "the file must be past the old limit"
    );
    let snapshot = import::load_bytes(&bytes, "generated.pickle", &ImportOptions::default())
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(snapshot.events.len(), events);
    let allocs = snapshot
        .events
        .iter()
        .filter(|e| e.kind == EventKind::Alloc)
        .count();
    assert_eq!(allocs, (events - 1).div_ceil(3));
    assert_eq!(snapshot.segments.len(), 1);
    // The 64 stacks, and the first entry's own.
    assert!(
        snapshot.sites.len() <= STACKS + 1,
        "{}",
        snapshot.sites.len()
    );
    assert_eq!(snapshot.events[1].size, 2 << 20);
}

#[test]
fn each_memo_reference_counts_once_and_memory_stays_within_the_budget() {
    let bytes = generated_snapshot(30_000);
    let doc = Document::parse(&bytes).unwrap();
    // Every reference is one element of the list that holds it, not two: 12 per entry dict,
    // 32 per stack, 6 per frame dict, one per entry in the trace, and 29 in the root, the segment and its block.
    let entries = 30_000;
    let expected = 12 * entries + DEPTH * (entries - 1) + FRAMES + 6 * FRAMES + entries + 29;
    assert_eq!(doc.element_count(), expected);
    let per_byte = doc.memory_bytes() as f64 / bytes.len() as f64;
    assert!(
        per_byte < Limits::default().memory_per_input_byte as f64 / 2.0,
        "{per_byte:.2} bytes of document per input byte"
    );
}

#[test]
fn shared_traces_take_a_few_bytes_of_document_per_input_byte() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    for name in [
        "decomfl_opt125m_zo_fedlearn.pickle",
        "cs336_medium_ctx512_train_step.pickle",
    ] {
        let Some(path) = vramscope_testkit::shared_trace(&root, name) else {
            continue;
        };
        let bytes = std::fs::read(&path).unwrap();
        let doc = Document::parse(&bytes).unwrap();
        let per_byte = doc.memory_bytes() as f64 / bytes.len() as f64;
        // Well inside the budget, so that a genuine snapshot is never refused by it.
        assert!(per_byte < 4.0, "{name}: {per_byte:.2} bytes per input byte");
    }
}

#[test]
fn a_small_crafted_pickle_is_held_to_memory_per_input_byte() {
    // `None` wrapped a million times in a one-element tuple, one byte per tuple: 44 bytes of
    // document per input byte (a container, an element and a table entry each).
    let mut bytes = b"\x80\x04N".to_vec();
    bytes.resize(bytes.len() + 4_000_000, 0x85);
    bytes.push(b'.');
    let e = vramscope_pickle::parse(&bytes).unwrap_err();
    let limits = Limits::default();
    match e.kind {
        PickleErrorKind::MemoryBudget {
            limit,
            input_bytes,
            per_input_byte,
        } => {
            assert_eq!(input_bytes, bytes.len());
            assert_eq!(per_input_byte, limits.memory_per_input_byte);
            assert_eq!(limit, limits.memory_budget(bytes.len()));
        }
        other => panic!("{other:?}"),
    }
    assert!(e.offset > 3 && e.offset < bytes.len() - 1, "{}", e.offset);
    let text = e.to_string();
    assert!(
        text.contains("per input byte") && text.contains("-byte"),
        "{text}"
    );
}

#[test]
fn trace_entries_that_share_one_dict_are_bounded_per_input_byte() {
    // One entry dict referenced 200,000 times, two bytes each: 0.4 MB that would make 200,000
    // events.
    let mut w = PickleWriter::new();
    w.begin_dict();
    w.str("device_traces");
    w.begin_list();
    w.begin_list();
    w.begin_dict();
    w.str("action");
    w.str("alloc");
    w.str("addr");
    w.uint(4096);
    w.str("size");
    w.uint(512);
    w.end_dict();
    let slot = w.memoize();
    for _ in 0..200_000 {
        w.get(slot);
    }
    w.end_list();
    w.end_list();
    w.end_dict();
    let bytes = w.finish();
    let e = import::load_bytes(&bytes, "shared.pickle", &ImportOptions::default()).unwrap_err();
    match &e.kind {
        ImportErrorKind::Structure { path, message } => {
            assert_eq!(path, "device_traces");
            assert!(message.contains("200001 trace entries"), "{message}");
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn the_size_error_names_the_size_the_limit_and_how_to_raise_it() {
    let mut options = ImportOptions::default();
    options.max_file_bytes = 1000;
    options.max_decompressed_bytes = 1000;
    let bytes = generated_snapshot(100);
    let e = import::load_bytes(&bytes, "big.pickle", &options).unwrap_err();
    let text = e.to_string();
    assert!(
        matches!(e.kind, ImportErrorKind::TooLarge { size: Some(s), limit: 1000, .. } if s == bytes.len() as u64),
        "{e:?}"
    );
    for needle in [
        "big.pickle",
        &bytes.len().to_string(),
        "1000 bytes",
        "--max-input",
        "VRAMSCOPE_MAX_INPUT",
    ] {
        assert!(text.contains(needle), "{needle} missing from: {text}");
    }
    assert_eq!(import::MAX_FILE_BYTES, 4 << 30, "the documented default");
}
