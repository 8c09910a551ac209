//! Tests of the PyTorch snapshot importer (`vramscope_import::pytorch`) on a small
//! synthetic snapshot, and cross-checks of the pickle reader against Python's own pickler when
//! `python3` is installed (skipped, with one line of output, when it is not).

use std::process::Command;

use vramscope_import::{self as import, ImportErrorKind, ImportOptions};
use vramscope_model::{BlockState, EventKind, Pool, SnapshotSource};
use vramscope_pickle::Value;

/// A snapshot written by Python 3's pickler (protocol 4) from this dict:
///
/// ```python
/// fr_user = [{'filename': '/v/site-packages/torch/nn/functional.py', 'line': 10, 'name': 'linear'},
///            {'filename': '/home/u/train.py', 'line': 42, 'name': 'train_step'},
///            {'filename': '/home/u/train.py', 'line': 99, 'name': '<module>'}]
/// fr_cpp = [{'filename': '??', 'line': 0, 'name': 'malloc'}] + fr_user
/// {'segments': [{'device': 0, 'address': 0x1000000, 'total_size': 2097152, 'allocated_size': 512,
///                'active_size': 512, 'requested_size': 100, 'stream': 0, 'segment_type': 'small',
///                'segment_pool_id': (0, 0), 'is_expandable': False, 'frames': [],
///                'blocks': [{'address': 0x1000000, 'size': 512, 'requested_size': 100,
///                            'state': 'active_allocated', 'frames': fr_user},
///                           {'address': 0x1000200, 'size': 2097152 - 512, 'requested_size': 0,
///                            'state': 'inactive', 'frames': []}]}],
///  'device_traces': [[
///     {'action': 'segment_alloc', 'addr': 0x1000000, 'size': 2097152, 'stream': 0, 'time_us': 1000, 'frames': fr_user},
///     {'action': 'free_requested', 'addr': 0x5000, 'size': 300, 'stream': 0, 'time_us': 1001, 'frames': fr_cpp},
///     {'action': 'free_completed', 'addr': 0x5000, 'size': 300, 'stream': 0, 'time_us': 1002, 'frames': fr_cpp},
///     {'action': 'alloc', 'addr': 0x1000000, 'size': 100, 'stream': 0, 'time_us': 1010, 'frames': fr_user},
///     {'action': 'oom', 'addr': 12345, 'size': 1 << 40, 'stream': 0, 'time_us': 1020, 'frames': fr_cpp},
///     {'action': 'snapshot', 'addr': 0, 'size': 0, 'stream': 0, 'time_us': 1030, 'frames': []},
///     {'action': 'weird_new_action', 'addr': 0, 'size': 0, 'stream': 0, 'time_us': 1031, 'frames': []}]],
///  'allocator_settings': {'PYTORCH_CUDA_ALLOC_CONF': 'expandable_segments:True', 'max_split_size': -1,
///                         'garbage_collection_threshold': 0.0, 'expandable_segments': True},
///  'external_annotations': [{'name': 'Optimizer.step#SGD.step', 'stage': 'START', 'device': 0, 'time_us': 1005},
///                           {'name': 'Optimizer.step#SGD.step', 'stage': 'END', 'device': 0, 'time_us': 1006}]}
/// ```
const SYNTHETIC: &[u8] =
    b"\x80\x04\x95b\x04\x00\x00\x00\x00\x00\x00}\x94(\x8c\x08segments\x94]\x94}\x94(\x8c\x06de\
    vice\x94K\x00\x8c\x07address\x94J\x00\x00\x00\x01\x8c\x0atotal_size\x94J\x00\x00\x20\x00\
    \x8c\x0eallocated_size\x94M\x00\x02\x8c\x0bactive_size\x94M\x00\x02\x8c\x0erequested_siz\
    e\x94Kd\x8c\x06stream\x94K\x00\x8c\x0csegment_type\x94\x8c\x05small\x94\x8c\x0fsegment_p\
    ool_id\x94K\x00K\x00\x86\x94\x8c\x0dis_expandable\x94\x89\x8c\x06frames\x94]\x94\x8c\x06\
    blocks\x94]\x94(}\x94(h\x05J\x00\x00\x00\x01\x8c\x04size\x94M\x00\x02h\x09Kd\x8c\x05stat\
    e\x94\x8c\x10active_allocated\x94h\x10]\x94(}\x94(\x8c\x08filename\x94\x8c'/v/site-packa\
    ges/torch/nn/functional.py\x94\x8c\x04line\x94K\x0a\x8c\x04name\x94\x8c\x06linear\x94u}\x94\
    (h\x1a\x8c\x10/home/u/train.py\x94h\x1cK*h\x1d\x8c\x0atrain_step\x94u}\x94(h\x1ah\x20h\x1c\
    Kch\x1d\x8c\x08<module>\x94ueu}\x94(h\x05J\x00\x02\x00\x01h\x15J\x00\xfe\x1f\x00h\x09K\x00\
    h\x16\x8c\x08inactive\x94h\x10]\x94ueua\x8c\x0ddevice_traces\x94]\x94]\x94(}\x94(\x8c\x06\
    action\x94\x8c\x0dsegment_alloc\x94\x8c\x04addr\x94J\x00\x00\x00\x01h\x15J\x00\x00\x20\x00\
    h\x0aK\x00\x8c\x07time_us\x94M\xe8\x03h\x10h\x18u}\x94(h+\x8c\x0efree_requested\x94h-M\x00\
    Ph\x15M,\x01h\x0aK\x00h.M\xe9\x03h\x10]\x94(}\x94(h\x1a\x8c\x02??\x94h\x1cK\x00h\x1d\x8c\
    \x06malloc\x94uh\x19h\x1fh\x22eu}\x94(h+\x8c\x0efree_completed\x94h-M\x00Ph\x15M,\x01h\x0a\
    K\x00h.M\xea\x03h\x10h1u}\x94(h+\x8c\x05alloc\x94h-J\x00\x00\x00\x01h\x15Kdh\x0aK\x00h.M\
    \xf2\x03h\x10h\x18u}\x94(h+\x8c\x03oom\x94h-M90h\x15\x8a\x06\x00\x00\x00\x00\x00\x01h\x0a\
    K\x00h.M\xfc\x03h\x10h1u}\x94(h+\x8c\x08snapshot\x94h-K\x00h\x15K\x00h\x0aK\x00h.M\x06\x04\
    h\x10]\x94u}\x94(h+\x8c\x10weird_new_action\x94h-K\x00h\x15K\x00h\x0aK\x00h.M\x07\x04h\x10\
    ]\x94uea\x8c\x12allocator_settings\x94}\x94(\x8c\x17PYTORCH_CUDA_ALLOC_CONF\x94\x8c\x18e\
    xpandable_segments:True\x94\x8c\x0emax_split_size\x94J\xff\xff\xff\xff\x8c\x1cgarbage_co\
    llection_threshold\x94G\x00\x00\x00\x00\x00\x00\x00\x00\x8c\x13expandable_segments\x94\x88\
    u\x8c\x14external_annotations\x94]\x94(}\x94(h\x1d\x8c\x17Optimizer.step#SGD.step\x94\x8c\
    \x05stage\x94\x8c\x05START\x94h\x04K\x00h.M\xed\x03u}\x94(h\x1dhKhL\x8c\x03END\x94h\x04K\
    \x00h.M\xee\x03ueu.";

fn import(bytes: &[u8], options: &ImportOptions) -> vramscope_model::Snapshot {
    match import::load_bytes(bytes, "synthetic.pickle", options) {
        Ok(s) => s,
        Err(e) => panic!("{e}"),
    }
}

#[test]
fn synthetic_snapshot_converts() {
    let s = import(SYNTHETIC, &ImportOptions::default());
    assert_eq!(s.source, SnapshotSource::Pytorch);
    assert_eq!(s.device.index, 0);
    assert_eq!(s.device.capacity, 0);

    // The unknown action is skipped; the free without an alloc is kept.
    let kinds: Vec<EventKind> = s.events.iter().map(|e| e.kind).collect();
    assert_eq!(
        kinds,
        vec![
            EventKind::SegmentAlloc,
            EventKind::FreeRequested,
            EventKind::FreeCompleted,
            EventKind::Alloc,
            EventKind::Oom,
            EventKind::Snapshot,
        ]
    );
    let seqs: Vec<u64> = s.events.iter().map(|e| e.seq).collect();
    assert_eq!(seqs, vec![0, 1, 2, 3, 4, 5]);
    let oom = &s.events[4];
    // This file wrote the free memory as `addr`; PyTorch writes `device_free`: both are read.
    assert_eq!((oom.addr, oom.device_free, oom.size), (0, 12345, 1 << 40));
    let alloc = &s.events[3];
    // The request as PyTorch recorded it, and the block it got (512 bytes at least).
    assert_eq!((alloc.size, alloc.requested), (512, 100));
    assert_eq!(alloc.time_ns, 10_000);
    // 1000 µs is not a plausible Unix time, so the epoch is unknown.
    assert_eq!(s.epoch_unix_ns, 0);

    // Two distinct stacks, both naming the user's train_step.
    assert_eq!(s.sites.len(), 2);
    for site in &s.sites {
        assert_eq!(site.file_line(), "/home/u/train.py:42");
        assert_eq!(site.function, "train_step");
    }
    assert_eq!(
        s.sites[s.events[1].site().unwrap() as usize].frames.len(),
        4
    );
    assert_eq!(s.events[5].site, None);

    // The START annotation at 1005 µs begins step 1.
    assert_eq!(s.annotations.len(), 2);
    assert_eq!(s.annotations[0].time_ns, 5_000);
    assert_eq!(s.steps.len(), 1);
    assert_eq!(s.steps[0].label, "Optimizer.step#SGD.step");
    assert_eq!((s.steps[0].step, s.steps[0].seq), (1, 3));
    let steps: Vec<u32> = s.events.iter().map(|e| e.step).collect();
    assert_eq!(steps, vec![0, 0, 0, 1, 1, 1]);

    // Segments and blocks.
    assert_eq!(s.segments.len(), 1);
    let seg = &s.segments[0];
    assert_eq!(seg.pool, Pool::Small);
    assert_eq!(seg.blocks.len(), 2);
    assert_eq!(seg.blocks[0].state, BlockState::ActiveAllocated);
    assert_eq!(seg.blocks[0].step, 1);
    assert_eq!(seg.blocks[0].site, s.events[3].site());
    assert_eq!(seg.blocks[1].site, None);

    // Statistics.
    let st = &s.stats;
    assert_eq!(st.reserved_bytes.all.current, 2 << 20);
    assert_eq!(st.reserved_bytes.small_pool.current, 2 << 20);
    assert_eq!(st.segment.all.current, 1);
    assert_eq!(st.allocated_bytes.all.current, 512);
    assert_eq!(st.allocated_bytes.all.peak, 512);
    assert_eq!(st.requested_bytes.all.current, 100);
    assert_eq!(st.allocation.all.current, 1);
    assert_eq!(st.inactive_split_bytes.all.current, (2 << 20) - 512);
    assert_eq!(st.num_ooms, 1);
    assert_eq!(st.num_device_alloc, 1);
    assert!(s.config.expandable_segments);
    assert_eq!(s.config.max_split_size, None);
}

#[test]
fn step_marker_function_starts_steps() {
    let mut options = ImportOptions::default();
    options.step_marker = Some("train_step".to_string());
    let s = import(SYNTHETIC, &options);
    assert_eq!(s.steps.len(), 1);
    assert_eq!(s.steps[0].seq, 3);
    assert_eq!(s.steps[0].label, "train_step");
    let steps: Vec<u32> = s.events.iter().map(|e| e.step).collect();
    assert_eq!(steps, vec![0, 0, 0, 1, 1, 1]);
}

#[test]
fn framework_paths_are_configurable() {
    let mut options = ImportOptions::default();
    options.framework_paths = vec!["/home/u/".to_string()];
    let s = import(SYNTHETIC, &options);
    // With the user's own folder declared framework and torch/ no longer listed, the torch
    // frame is the innermost frame that is not framework code.
    assert_eq!(
        s.sites[0].file_line(),
        "/v/site-packages/torch/nn/functional.py:10"
    );
}

#[test]
fn every_prefix_of_the_snapshot_is_an_error() {
    for end in 0..SYNTHETIC.len() {
        let e = import::load_bytes(&SYNTHETIC[..end], "cut.pickle", &ImportOptions::default())
            .expect_err("a truncated pickle must not import");
        assert!(e.to_string().starts_with("cut.pickle: "), "{e}");
    }
}

#[test]
fn wrong_types_name_their_path() {
    // Replace the `size` of the second trace entry (BININT2 300 = M,0x2c,0x01) with a string.
    let at = SYNTHETIC
        .windows(3)
        .position(|w| w == b"M\x2c\x01")
        .expect("fixture holds the size 300");
    let mut bytes = SYNTHETIC[..at].to_vec();
    bytes.extend_from_slice(b"\x8c\x01x");
    bytes.extend_from_slice(&SYNTHETIC[at + 3..]);
    // The FRAME length no longer matches, which the reader tolerates as a hint.
    let e = import::load_bytes(&bytes, "bad.pickle", &ImportOptions::default()).unwrap_err();
    match &e.kind {
        ImportErrorKind::Structure { path, message } => {
            assert_eq!(path, "device_traces[0][1].size");
            assert!(message.contains("found str"), "{message}");
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_read_document_converts_like_the_bytes() {
    let doc = vramscope_pickle::Document::parse(SYNTHETIC).unwrap();
    let options = ImportOptions::default();
    let from_doc = import::pytorch::from_document(&doc, "s.pickle", &options).unwrap();
    assert_eq!(from_doc, import(SYNTHETIC, &options));
    // The document and the value tree agree, and the shared frame list is one object.
    assert_eq!(
        doc.root().to_value(),
        vramscope_pickle::parse(SYNTHETIC).unwrap()
    );
    let trace = doc.root().get("device_traces").unwrap().as_seq().unwrap();
    let entries = trace.get(0).unwrap().as_seq().unwrap();
    let frames = |i: usize| entries.get(i).unwrap().get("frames").unwrap().identity();
    assert!(frames(1).is_some());
    assert_eq!(frames(1), frames(2));
    assert_ne!(frames(0), frames(1));
}

/// Runs `python3 -c code`, or returns `None` when Python is not available.
fn python(code: &str) -> Option<Vec<u8>> {
    let out = Command::new("python3").arg("-c").arg(code).output().ok()?;
    if !out.status.success() {
        panic!("python3 failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    Some(out.stdout)
}

#[test]
fn agrees_with_python_pickler() {
    let values = r#"[None, True, False, 0, 1, -1, 255, 256, 65535, 65536, -2**31, 2**31 - 1, 2**31,
        2**63 - 1, -2**63, 2**64 - 1, 2**64, -2**100, 1.5, -0.0, float('inf'), '', 'héllo ✓',
        'x' * 300, (), (1,), (1, 2), (1, 2, 3), (1, 2, 3, 4), [], [[]], {}, {'a': {'b': [1, 2]}},
        {1: 'one', 2: 'two'}, {(0, 0): 'tuple key'}]"#;
    let native = "[b'', b'\\x00\\xff', bytearray(b'ab'), set(), {3}, frozenset({4})]";
    let code = format!(
        "import pickle, sys\n\
         def out(d): sys.stdout.buffer.write(len(d).to_bytes(4, 'little') + d)\n\
         v = {values}\n\
         shared = ['shared']\n\
         v.append([shared, shared, {{'k': shared}}])\n\
         for p in range(6): out(pickle.dumps(v, protocol=p))\n\
         out(pickle.dumps({native}, protocol=5))\n\
         out(pickle.dumps({{3}}, protocol=2))\n"
    );
    let Some(out) = python(&code) else {
        println!("skipped: python3 not found, pickler cross-check not run");
        return;
    };
    let mut blobs = Vec::new();
    let mut rest = &out[..];
    while rest.len() >= 4 {
        let n = u32::from_le_bytes(rest[..4].try_into().unwrap()) as usize;
        blobs.push(&rest[4..4 + n]);
        rest = &rest[4 + n..];
    }
    assert_eq!(blobs.len(), 8);
    for (protocol, bytes) in blobs[..6].iter().enumerate() {
        let v = match vramscope_pickle::parse(bytes) {
            Ok(v) => v,
            Err(e) => panic!("protocol {protocol}: {e}"),
        };
        let items = v.as_seq().expect("a list");
        assert_eq!(items.len(), 36, "protocol {protocol}");
        let ints: Vec<Option<i64>> = items[3..15].iter().map(Value::as_i64).collect();
        let expected = [
            0,
            1,
            -1,
            255,
            256,
            65535,
            65536,
            -(1 << 31),
            (1 << 31) - 1,
            1 << 31,
            i64::MAX,
            i64::MIN,
        ];
        assert_eq!(ints, expected.map(Some).to_vec(), "protocol {protocol}");
        assert_eq!(items[0], Value::None);
        assert_eq!(items[1], Value::Bool(true));
        assert_eq!(items[2], Value::Bool(false));
        assert_eq!(items[15].as_u64(), Some(u64::MAX), "protocol {protocol}");
        assert!(matches!(items[16], Value::BigInt(_)));
        assert!(matches!(items[17], Value::BigInt(_)));
        assert_eq!(items[18], Value::Float(1.5));
        assert_eq!(items[19].as_f64().map(f64::is_sign_negative), Some(true));
        assert_eq!(items[20], Value::Float(f64::INFINITY));
        assert_eq!(items[21].as_str(), Some(""));
        assert_eq!(items[22].as_str(), Some("héllo ✓"), "protocol {protocol}");
        assert_eq!(items[23].as_str().map(str::len), Some(300));
        for (i, n) in [(24, 0), (25, 1), (26, 2), (27, 3), (28, 4)] {
            assert!(matches!(items[i], Value::Tuple(_)), "protocol {protocol}");
            assert_eq!(items[i].as_seq().map(<[Value]>::len), Some(n));
        }
        assert_eq!(items[30].as_seq().map(<[Value]>::len), Some(1));
        assert_eq!(
            items[32].get("a").and_then(|a| a.get("b")),
            Some(&Value::List(vec![Value::Int(1), Value::Int(2)].into()))
        );
        assert_eq!(items[33].as_dict().map(<[(Value, Value)]>::len), Some(2));
        let shared = items[35].as_seq().unwrap();
        assert_eq!(shared[0].identity(), shared[1].identity());
        assert_eq!(shared[0].identity(), shared[2].get("k").unwrap().identity());
    }
    let native = vramscope_pickle::parse(blobs[6]).unwrap();
    let native = native.as_seq().unwrap();
    assert_eq!(native[1].as_bytes(), Some(&b"\x00\xff"[..]));
    assert_eq!(native[2].as_bytes(), Some(&b"ab"[..]));
    assert_eq!(native[4], Value::Set(vec![Value::Int(3)].into()));
    assert_eq!(native[5], Value::FrozenSet(vec![Value::Int(4)].into()));
    // Protocol 2 writes a set by calling `builtins.set`, which the reader refuses.
    let e = vramscope_pickle::parse(blobs[7]).unwrap_err();
    assert!(e.to_string().contains("refused opcode GLOBAL"), "{e}");
}

#[test]
fn loading_a_file_reports_how_far_it_has_got() {
    use vramscope_import::{Progress, Stage};
    let dir = std::env::temp_dir().join(format!("vramscope-progress-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");

    // A PyTorch pickle ends in the block-size replay, which went through every trace event
    // of the device (its first six: the seventh's action is unknown and dropped).
    let pickle_path = dir.join("synthetic.pickle");
    std::fs::write(&pickle_path, SYNTHETIC).expect("write pickle");
    let progress = Progress::new();
    let mut options = ImportOptions::default();
    options.progress = Some(progress.clone());
    let snapshot = import::load_with(&pickle_path, &options).expect("pickle loads");
    let state = progress.state();
    assert_eq!(state.stage, Stage::SizingBlocks, "{state:?}");
    assert!(state.total > 0 && state.done == state.total, "{state:?}");
    assert!(state.total <= snapshot.events.len() as u64, "{state:?}");

    // Any other file ends with its bytes read.
    let json_path = dir.join("synthetic.json");
    std::fs::write(&json_path, serde_json::to_vec(&snapshot).expect("json")).expect("write json");
    let size = std::fs::metadata(&json_path).expect("metadata").len();
    let progress = Progress::new();
    options.progress = Some(progress.clone());
    import::load_with(&json_path, &options).expect("json loads");
    let state = progress.state();
    assert_eq!(
        (state.stage, state.done, state.total),
        (Stage::Reading, size, size)
    );
    let _ = std::fs::remove_dir_all(&dir);
}
