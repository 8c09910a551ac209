//! `convert --to pytorch` parses its source once (issue 47): what the model does not keep of a
//! PyTorch pickle is kept while the import streams it (`ImportOptions::keep_source`), and the
//! pickle written from that ([`PytorchExtras::from_kept`]) is byte for byte the one written
//! from the file's whole document read a second time ([`PytorchExtras::from_document`]), as
//! before. Checked on the shared traces, on pickles of the test kit's snapshots (several
//! devices, OOMs) and on entries with every kind of value beside the model's, keys set twice
//! and negative streams; entries the kept form cannot hold (an action the importer does not
//! read, a container beside the model's values) leave the slot empty, so that the writer
//! reads the file again.

use std::path::Path;

use rustc_hash::FxHashMap;
use vramscope_export::{to_pytorch_pickle, to_pytorch_pickle_with, PytorchExtras};
use vramscope_import::pytorch::SourceSlot;
use vramscope_import::{self as import, ImportOptions};
use vramscope_pickle::{Document, MemoRef, PickleWriter};

/// The pickle written from what the import kept of `bytes` and the one written from their
/// document read again, or `None` for the first when the import kept nothing.
fn both(bytes: &[u8]) -> (Option<Vec<u8>>, Vec<u8>) {
    let slot = SourceSlot::new();
    let mut options = ImportOptions::default();
    options.keep_source = Some(slot.clone());
    let snapshot = import::load_bytes(bytes, "t", &options).expect("imports");
    let kept = slot.take();
    let from_kept = kept.as_ref().map(|kept| {
        let extras = PytorchExtras::from_kept(kept).expect("a PyTorch snapshot");
        to_pytorch_pickle_with(&snapshot, Some(&extras)).expect("writes")
    });
    let doc = Document::parse_with_limits(bytes, &import::pytorch::limits(&options)).unwrap();
    let extras = PytorchExtras::from_document(&doc).expect("a PyTorch snapshot");
    let from_doc = to_pytorch_pickle_with(&snapshot, Some(&extras)).expect("writes");
    (from_kept, from_doc)
}

fn assert_same_bytes(bytes: &[u8], origin: &str) {
    let (kept, doc) = both(bytes);
    let kept = kept.unwrap_or_else(|| panic!("{origin}: the import kept nothing"));
    assert!(kept == doc, "{origin}: the pickles differ");
}

#[test]
fn the_shared_traces_are_kept_and_written_as_from_their_document() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    for name in [
        "decomfl_opt125m_zo_fedlearn.pickle",
        "cs336_medium_ctx512_train_step.pickle",
    ] {
        let Some(path) = vramscope_testkit::shared_trace(&root, name) else {
            continue;
        };
        assert_same_bytes(&std::fs::read(&path).unwrap(), name);
    }
}

#[test]
fn pickles_of_the_kits_snapshots_are_kept_and_written_alike() {
    let snapshots = [
        ("training", vramscope_testkit::fixture::training_snapshot()),
        (
            "stacks",
            vramscope_testkit::fixture::pytorch_stacks_snapshot(),
        ),
        ("oom on 1", vramscope_testkit::three_devices_oom_on_1()),
        ("spiky", vramscope_testkit::spiky_run().0),
    ];
    for (origin, snapshot) in snapshots {
        let bytes = to_pytorch_pickle(&snapshot).unwrap();
        assert_same_bytes(&bytes, origin);
    }
}

/// A value beside the model's in a hand-written entry.
#[derive(Clone, Copy)]
enum Extra {
    None,
    Bool(bool),
    Int(i64),
    UInt(u64),
    Float(f64),
    Str(&'static str),
    Bytes(&'static [u8]),
    /// A list: a container, which the kept form does not hold.
    List,
}

/// A hand-written trace entry: its action, its stream and the values beside the model's.
type HandEntry<'a> = (&'a str, i64, Vec<(&'a str, Extra)>);

/// A snapshot pickle of one segment and one device trace whose entries are `(action, stream,
/// extras)`, each entry's keys PyTorch's with the extras after `time_us`.
fn pickle_of(entries: &[HandEntry<'_>]) -> Vec<u8> {
    let mut w = PickleWriter::new();
    let mut memo: FxHashMap<String, MemoRef> = FxHashMap::default();
    let base = 1u64 << 32;
    w.begin_dict();
    w.shared_str("segments", &mut memo);
    w.begin_list();
    w.begin_dict();
    for (key, value) in [("device", 0), ("address", base), ("total_size", 2 << 20)] {
        w.shared_str(key, &mut memo);
        w.uint(value);
    }
    w.shared_str("stream", &mut memo);
    w.uint(0);
    w.shared_str("segment_type", &mut memo);
    w.str("large");
    w.shared_str("blocks", &mut memo);
    w.begin_list();
    w.begin_dict();
    for (key, value) in [("address", base), ("size", 2 << 20), ("requested_size", 0)] {
        w.shared_str(key, &mut memo);
        w.uint(value);
    }
    w.shared_str("state", &mut memo);
    w.str("inactive");
    w.end_dict();
    w.end_list();
    w.end_dict();
    w.end_list();
    w.shared_str("device_traces", &mut memo);
    w.begin_list();
    w.begin_list();
    for (i, (action, stream, extras)) in entries.iter().enumerate() {
        w.begin_dict();
        w.shared_str("action", &mut memo);
        w.shared_str(action, &mut memo);
        w.shared_str("addr", &mut memo);
        w.uint(base + 512 * (i as u64 / 3));
        w.shared_str("size", &mut memo);
        w.uint(512);
        w.shared_str("stream", &mut memo);
        w.int(*stream);
        w.shared_str("time_us", &mut memo);
        w.uint(1_000 + i as u64);
        for (key, extra) in extras {
            w.shared_str(key, &mut memo);
            match *extra {
                Extra::None => w.none(),
                Extra::Bool(b) => w.bool(b),
                Extra::Int(v) => w.int(v),
                Extra::UInt(v) => w.uint(v),
                Extra::Float(v) => w.float(v),
                Extra::Str(s) => w.shared_str(s, &mut memo),
                Extra::Bytes(b) => w.bytes(b),
                Extra::List => {
                    w.begin_list();
                    w.int(1);
                    w.end_list();
                }
            }
        }
        w.shared_str("frames", &mut memo);
        w.begin_list();
        w.end_list();
        w.end_dict();
    }
    w.end_list();
    w.end_list();
    w.shared_str("allocator_settings", &mut memo);
    w.begin_dict();
    w.end_dict();
    w.shared_str("external_annotations", &mut memo);
    w.begin_list();
    w.end_list();
    w.end_dict();
    w.finish()
}

/// Alloc, request and completion of the same block, `n` times over.
fn cycles<'a>(n: usize, extras: &[Vec<(&'a str, Extra)>]) -> Vec<HandEntry<'a>> {
    (0..3 * n)
        .map(|i| {
            let action = ["alloc", "free_requested", "free_completed"][i % 3];
            (action, 0, extras[i % extras.len()].clone())
        })
        .collect()
}

#[test]
fn every_value_beside_the_models_is_written_back_alike() {
    let extras = vec![
        vec![
            ("compile_context", Extra::Str("N/A")),
            ("user_metadata", Extra::Str("")),
        ],
        vec![
            ("compile_context", Extra::None),
            ("flag", Extra::Bool(true)),
            ("count", Extra::Int(-7)),
            ("big", Extra::UInt(u64::MAX)),
            ("ratio", Extra::Float(0.25)),
            ("nan", Extra::Float(f64::NAN)),
            ("raw", Extra::Bytes(b"\x00\x01")),
        ],
        // A key set twice: once, at its first place, with its last value; and a key the
        // model writes set again after the extras.
        vec![
            ("user_metadata", Extra::Str("first")),
            ("compile_context", Extra::Str("N/A")),
            ("user_metadata", Extra::Str("last")),
            ("size", Extra::UInt(512)),
        ],
        // An OOM's field on an entry that is not one stays the source's.
        vec![("device_free", Extra::UInt(1 << 30))],
    ];
    let mut entries = cycles(20, &extras);
    // A negative stream is written back as a signed number.
    entries.push(("alloc", -3, extras[0].clone()));
    entries.push(("oom", 0, vec![("device_free", Extra::UInt(1 << 20))]));
    assert_same_bytes(&pickle_of(&entries), "hand-written entries");
}

#[test]
fn what_the_kept_form_cannot_hold_leaves_the_slot_empty() {
    let plain = vec![vec![("compile_context", Extra::Str("N/A"))]];
    // An action the importer does not read is written back whole from the document.
    let mut unknown = cycles(4, &plain);
    unknown.insert(2, ("a_future_action", 0, plain[0].clone()));
    // A container beside the model's values.
    let container = cycles(4, &[vec![("user_metadata", Extra::List)]]);
    for (origin, entries) in [("unknown action", unknown), ("container", container)] {
        let (kept, _) = both(&pickle_of(&entries));
        assert!(kept.is_none(), "{origin}: kept what it cannot write back");
    }
    // The control: the same entries without them are kept.
    let (kept, doc) = both(&pickle_of(&cycles(4, &plain)));
    assert_eq!(kept, Some(doc));
}
