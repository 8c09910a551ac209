//! Hostile and corrupt input for the importers (`vramscope_import`): truncated and
//! random pickles, pickles that would run code, gzip bombs and broken gzip, deeply nested and
//! malformed JSON. Every case must be a clean `ImportError` that names the file and the
//! problem, never a panic.

use std::io::Write;

use proptest::prelude::*;
use vramscope_import::{self as import, ImportError, ImportErrorKind, ImportOptions};
use vramscope_pickle::PickleErrorKind;

/// `{'segments': [], 'device_traces': [[]]}` as Python's pickler writes it (protocol 4).
const EMPTY_SNAPSHOT: &[u8] = b"\x80\x04}(\x8c\x08segments]\x8c\x0ddevice_traces](]eu.";

fn load(bytes: &[u8], origin: &str) -> Result<vramscope_model::Snapshot, ImportError> {
    import::load_bytes(bytes, origin, &ImportOptions::default())
}

fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(bytes).unwrap();
    gz.finish().unwrap()
}

#[test]
fn empty_snapshot_loads_plain_and_gzipped() {
    for bytes in [EMPTY_SNAPSHOT.to_vec(), gzip(EMPTY_SNAPSHOT)] {
        let s = load(&bytes, "empty.pickle").unwrap();
        assert!(s.events.is_empty() && s.segments.is_empty());
    }
}

#[test]
fn code_execution_pickles_are_refused() {
    // os.system('id') through GLOBAL + REDUCE, as protocol 2 writes it.
    let global = b"\x80\x02cos\nsystem\nq\x00X\x02\x00\x00\x00idq\x01\x85q\x02Rq\x03.";
    let e = load(global, "evil.pickle").unwrap_err();
    let text = e.to_string();
    assert!(text.starts_with("evil.pickle: "), "{text}");
    assert!(
        text.contains("GLOBAL") && text.contains("offset 2"),
        "{text}"
    );
    match e.kind {
        ImportErrorKind::Pickle(p) => {
            assert_eq!(p.offset, 2);
            assert!(matches!(
                p.kind,
                PickleErrorKind::Refused {
                    opcode: "GLOBAL",
                    ..
                }
            ));
        }
        other => panic!("{other:?}"),
    }

    // The same through STACK_GLOBAL (protocol 4).
    let stack_global = b"\x80\x04\x8c\x02os\x8c\x06system\x93\x8c\x02id\x85R.";
    let e = load(stack_global, "evil4.pickle").unwrap_err();
    assert!(e.to_string().contains("STACK_GLOBAL"), "{e}");

    // REDUCE alone, on values that are plain data.
    let e = load(b"\x80\x02N)R.", "reduce.pickle").unwrap_err();
    assert!(
        e.to_string().contains("REDUCE") && e.to_string().contains("offset 4"),
        "{e}"
    );

    // A GLOBAL hidden inside an otherwise valid snapshot dict.
    let hidden = b"\x80\x04}(\x8c\x08segments]\x8c\x0ddevice_traces](cos\nsystem\neu.";
    let e = load(hidden, "hidden.pickle").unwrap_err();
    assert!(
        e.to_string().contains("GLOBAL") && e.to_string().contains("offset 32"),
        "{e}"
    );
}

#[test]
fn truncated_pickles_are_errors() {
    for end in 0..EMPTY_SNAPSHOT.len() {
        let e = load(&EMPTY_SNAPSHOT[..end], "cut.pickle").unwrap_err();
        assert!(e.to_string().starts_with("cut.pickle: "), "{e}");
    }
    // A truncated real snapshot, when the shared traces are present.
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let Some(path) = vramscope_testkit::shared_trace(&root, "decomfl_opt125m_zo_fedlearn.pickle")
    else {
        return;
    };
    let bytes = std::fs::read(path).expect("a shared trace reads");
    for k in 1..8 {
        let end = bytes.len() * k / 8;
        let e = load(&bytes[..end], "decomfl-cut.pickle").unwrap_err();
        match e.kind {
            ImportErrorKind::Pickle(p) => assert!(p.offset <= end, "{p}"),
            other => panic!("{other:?}"),
        }
    }
}

#[test]
fn pickles_of_other_data_are_structure_errors() {
    let e = load(b"\x80\x04K\x01.", "int.pickle").unwrap_err();
    assert!(matches!(e.kind, ImportErrorKind::Structure { .. }), "{e}");
    assert!(
        e.to_string().contains("not a PyTorch memory snapshot"),
        "{e}"
    );
    let e = load(b"\x80\x04}\x8c\x01aK\x01s.", "dict.pickle").unwrap_err();
    assert!(
        e.to_string()
            .contains("neither `segments` nor `device_traces`"),
        "{e}"
    );
    // device_traces holding a number instead of a list.
    let e = load(
        b"\x80\x04}(\x8c\x08segments]\x8c\x0ddevice_traces](K\x07eu.",
        "odd.pickle",
    )
    .unwrap_err();
    match e.kind {
        ImportErrorKind::Structure { path, .. } => assert_eq!(path, "device_traces[0]"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn gzip_problems_are_errors() {
    let e = load(b"\x1f\x8b\x08\x00garbage", "bad.gz").unwrap_err();
    assert!(matches!(e.kind, ImportErrorKind::Gzip(_)), "{e}");
    let packed = gzip(&vec![b'{'; 1 << 20]);
    let mut options = ImportOptions::default();
    options.max_decompressed_bytes = 1 << 16;
    let e = import::load_bytes(&packed, "bomb.gz", &options).unwrap_err();
    assert!(matches!(e.kind, ImportErrorKind::TooLarge { .. }), "{e}");
    let e = load(&gzip(&gzip(b"{}")), "twice.gz").unwrap_err();
    assert!(
        matches!(e.kind, ImportErrorKind::UnknownFormat { .. }),
        "{e}"
    );
}

#[test]
fn deeply_nested_and_malformed_json_are_handled() {
    let deep = |open: &str, close: &str, n: usize| format!("{}{}", open.repeat(n), close.repeat(n));
    // Nesting inside values the importer skips is read without recursion.
    let skipped = format!(
        "{{\"traceEvents\": [], \"x\": {}}}",
        deep("[", "]", 100_000)
    );
    assert!(load(skipped.as_bytes(), "skipped.json")
        .unwrap()
        .events
        .is_empty());
    // A deeply nested object that is not a trace is an error.
    let other = format!(
        "{{\"x\": {}1{}}}",
        "{\"a\":".repeat(10_000),
        "}".repeat(10_000)
    );
    let e = load(other.as_bytes(), "other.json").unwrap_err();
    assert!(
        matches!(e.kind, ImportErrorKind::UnknownFormat { .. }),
        "{e}"
    );
    // Unclosed nesting, a bare deep array, and a deep vramscope snapshot are errors.
    for (name, text) in [
        ("unclosed.json", "[".repeat(100_000)),
        ("array.json", deep("[", "]", 100_000)),
        (
            "snapshot.json",
            format!(
                "{{\"format_version\": 1, \"events\": {}}}",
                deep("[", "]", 100_000)
            ),
        ),
        ("events.json", "{\"traceEvents\": 5}".to_string()),
        ("syntax.json", "{\"traceEvents\": [,]}".to_string()),
    ] {
        match load(text.as_bytes(), name) {
            Ok(s) => assert!(s.events.is_empty(), "{name}"),
            Err(e) => assert!(e.to_string().starts_with(name), "{e}"),
        }
    }
    let e = load(b"{\"traceEvents\": [,]}", "syntax.json").unwrap_err();
    assert!(e.to_string().contains("line 1 column"), "{e}");
}

#[test]
fn missing_files_are_named() {
    let e = import::load("/nonexistent/vramscope/file.pickle").unwrap_err();
    assert!(matches!(e.kind, ImportErrorKind::Io(_)));
    assert!(
        e.to_string()
            .starts_with("/nonexistent/vramscope/file.pickle: "),
        "{e}"
    );
}

proptest! {
    #![proptest_config(vramscope_testkit::props::config(1000))]

    #[test]
    fn random_input_never_panics(
        first in prop::sample::select(vec![0x80u8, b'{', b'[', 0x1f, b'x']),
        rest in proptest::collection::vec(any::<u8>(), 0..200),
    ) {
        let mut bytes = vec![first];
        if first == 0x1f {
            bytes.push(0x8b);
        }
        bytes.extend_from_slice(&rest);
        let _ = load(&bytes, "random");
    }

    #[test]
    fn mutated_snapshot_never_panics(
        edits in proptest::collection::vec((any::<usize>(), any::<u8>()), 1..4),
        cut in any::<usize>(),
    ) {
        let mut bytes = EMPTY_SNAPSHOT.to_vec();
        for (at, byte) in edits {
            let i = at % bytes.len();
            bytes[i] = byte;
        }
        let cut = cut % (bytes.len() + 1);
        let _ = load(&bytes[..cut], "mutated");
        let _ = load(&gzip(&bytes), "mutated.gz");
    }

    #[test]
    fn mutated_json_never_panics(
        edits in proptest::collection::vec((any::<usize>(), any::<u8>()), 1..4),
    ) {
        let mut bytes = br#"{"traceEvents": [{"name": "[memory]", "ph": "i", "ts": 5,
            "args": {"Device Type": 1, "Device Id": 0, "Addr": 4096, "Bytes": 512,
            "Total Allocated": 512, "Total Reserved": 2097152}},
            {"name": "ProfilerStep#1", "ph": "X", "ts": 1, "dur": 9}]}"#
            .to_vec();
        for (at, byte) in edits {
            let i = at % bytes.len();
            bytes[i] = byte;
        }
        let _ = load(&bytes, "mutated.json");
    }
}
