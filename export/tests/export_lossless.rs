//! Exports that lose nothing (issue 20) and exports that never wrap (issue 17).
//!
//! `convert --to pytorch` of a PyTorch pickle must give back every key and value of the
//! original: Python's own `pickle` loads both and compares them key by key, types included
//! (on the shared traces; skipped with a notice without them or without python3). The Perfetto
//! export must put allocations on tracks where they nest, as Chrome's trace format requires of
//! complete slices on one thread: the output is parsed and every track's slices are checked to
//! nest. Sums of sizes near 2^64 are errors that name the field.

use std::path::{Path, PathBuf};
use std::process::Command;

use vramscope_caching::{CachingAllocator, SimDevice};
use vramscope_export::{to_perfetto, to_pytorch_pickle, to_pytorch_pickle_from_file, ExportError};
use vramscope_import as import;
use vramscope_model::{AllocatorConfig, Block, BlockState, EventKind, Pool, Segment, Snapshot};

fn trace(name: &str) -> Option<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    vramscope_testkit::shared_trace(&root, name)
}

fn python() -> bool {
    let found = Command::new("python3").arg("--version").output().is_ok();
    if !found {
        vramscope_testkit::skip_notice("python3 not found, pickle comparison not run");
    }
    found
}

/// Loads two pickles with Python's `pickle` and compares them key by key; prints the number of
/// values compared, or fails naming the first difference's path.
const COMPARE: &str = r#"
import pickle, sys
a = pickle.load(open(sys.argv[1], "rb"))
b = pickle.load(open(sys.argv[2], "rb"))
seen = set()
count = 0
def same(x, y, path):
    global count
    count += 1
    if type(x) is not type(y):
        sys.exit(f"{path}: {type(x).__name__} {x!r:.80} became {type(y).__name__} {y!r:.80}")
    if isinstance(x, (dict, list, tuple)):
        if (id(x), id(y)) in seen:
            return
        seen.add((id(x), id(y)))
    if isinstance(x, dict):
        if list(x) != list(y):
            sys.exit(f"{path}: keys {list(x)} became {list(y)}")
        for k in x:
            same(x[k], y[k], f"{path}[{k!r}]")
    elif isinstance(x, (list, tuple)):
        if len(x) != len(y):
            sys.exit(f"{path}: {len(x)} elements became {len(y)}")
        for i, (p, q) in enumerate(zip(x, y)):
            same(p, q, f"{path}[{i}]")
    elif x != y and not (x != x and y != y):
        sys.exit(f"{path}: {x!r:.80} became {y!r:.80}")
same(a, b, "snapshot")
print(count)
"#;

#[test]
fn pytorch_pickles_convert_to_pytorch_key_by_key() {
    let mut compared = 0;
    for name in [
        "decomfl_opt125m_zo_fedlearn.pickle",
        "cs336_medium_ctx512_train_step.pickle",
    ] {
        let Some(path) = trace(name) else {
            continue;
        };
        if !python() {
            return;
        }
        let snapshot = import::load(&path).unwrap();
        let export = to_pytorch_pickle_from_file(&snapshot, &path).unwrap();
        assert_eq!(
            export.not_carried,
            Vec::<String>::new(),
            "{name}: nothing lost"
        );
        let bytes = export.bytes;
        let out =
            std::env::temp_dir().join(format!("vramscope-lossless-{}-{name}", std::process::id()));
        std::fs::write(&out, &bytes).unwrap();
        let output = Command::new("python3")
            .arg("-c")
            .arg(COMPARE)
            .arg(&path)
            .arg(&out)
            .output()
            .unwrap();
        std::fs::remove_file(&out).ok();
        assert!(
            output.status.success(),
            "{name}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        let values: u64 = String::from_utf8_lossy(&output.stdout)
            .trim()
            .parse()
            .unwrap();
        assert!(values > 100_000, "{name}: only {values} values compared");
        compared += 1;
        // What the export writes reads back into the same model.
        let again = import::load_bytes(&bytes, name, &Default::default()).unwrap();
        assert_eq!(again.events, snapshot.events, "{name}");
        assert_eq!(again.segments, snapshot.segments, "{name}");
    }
    if compared == 0 {
        vramscope_testkit::skip_notice("shared PyTorch traces absent");
    }
}

fn sample() -> Snapshot {
    let alloc = CachingAllocator::new(SimDevice::phantom(1 << 34), AllocatorConfig::default());
    let _keep = alloc.alloc(3 << 20).unwrap();
    for _ in 0..3 {
        alloc.mark_step();
        drop(alloc.alloc(4000).unwrap());
    }
    let mut snapshot = alloc.snapshot();
    snapshot.epoch_unix_ns = 1_700_000_000_123_456_789;
    snapshot
}

#[test]
fn a_vramscope_snapshot_keeps_its_times_and_requested_sizes() {
    if !python() {
        return;
    }
    let snapshot = sample();
    let out = std::env::temp_dir().join(format!("vramscope-model-{}.pickle", std::process::id()));
    std::fs::write(&out, to_pytorch_pickle(&snapshot).unwrap()).unwrap();
    let script = r#"
import pickle, sys
d = pickle.load(open(sys.argv[1], "rb"))
t = d["device_traces"][0]
allocs = [e for e in t if e["action"] == "alloc"]
print(min(e["time_us"] for e in t), sorted({e["size"] for e in allocs}))
"#;
    let output = Command::new("python3")
        .arg("-c")
        .arg(script)
        .arg(&out)
        .output()
        .unwrap();
    std::fs::remove_file(&out).ok();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let printed = String::from_utf8_lossy(&output.stdout);
    let first_us = snapshot.epoch_unix_ns / 1000 + snapshot.events[0].time_ns / 1000;
    // Times count from the snapshot's epoch, not from 0; sizes are what was requested (4000
    // bytes), not the 4096-byte blocks.
    assert_eq!(printed.trim(), format!("{first_us} [4000, 3145728]"));
}

/// Checks that the complete slices of every track nest: sorted by start (a longer one first),
/// each starts at or after the start of the slice it sits in and ends at or before its end.
/// Times are compared in nanoseconds, exactly.
fn assert_slices_nest(json: &str, origin: &str) -> usize {
    let value: serde_json::Value = serde_json::from_str(json).unwrap();
    let ns = |v: &serde_json::Value| (v.as_f64().unwrap() * 1000.0).round() as i64;
    let mut tracks: std::collections::BTreeMap<(u64, u64), Vec<(i64, i64)>> = Default::default();
    for e in value["traceEvents"].as_array().unwrap() {
        if e["ph"] == "X" {
            let key = (e["pid"].as_u64().unwrap(), e["tid"].as_u64().unwrap());
            let start = ns(&e["ts"]);
            let dur = ns(&e["dur"]);
            assert!(dur >= 0, "{origin}: a negative duration: {e}");
            tracks.entry(key).or_default().push((start, start + dur));
        }
    }
    let mut slices = 0;
    for (track, mut list) in tracks {
        list.sort_by_key(|&(s, e)| (s, std::cmp::Reverse(e)));
        let mut stack: Vec<(i64, i64)> = Vec::new();
        for (s, e) in list {
            while stack.last().is_some_and(|&(_, end)| end <= s) {
                stack.pop();
            }
            if let Some(&(ps, pe)) = stack.last() {
                assert!(
                    ps <= s && e <= pe,
                    "{origin}: on track {track:?}, [{s}, {e}] ns overlaps [{ps}, {pe}] without nesting"
                );
            }
            stack.push((s, e));
            slices += 1;
        }
    }
    slices
}

/// A snapshot whose allocations overlap without nesting: each freed in the order it was
/// allocated, on one stream, with timestamps.
fn first_in_first_out(n: u64) -> Snapshot {
    let mut snapshot = sample();
    snapshot.events.clear();
    snapshot.steps.clear();
    let event = |seq: u64, kind, addr| {
        vramscope_testkit::event(kind)
            .seq(seq)
            .time_ns(1000 * (seq + 1))
            .stream(7)
            .addr(addr)
            .size(512)
            .requested(500)
            .build()
    };
    for i in 0..n {
        snapshot
            .events
            .push(event(i, EventKind::Alloc, 0x1000 + 512 * i));
    }
    for i in 0..n {
        snapshot
            .events
            .push(event(n + i, EventKind::FreeCompleted, 0x1000 + 512 * i));
    }
    snapshot
}

#[test]
fn perfetto_slices_nest_on_every_track() {
    let fifo = to_perfetto(&first_in_first_out(2000)).unwrap();
    assert_eq!(assert_slices_nest(&fifo, "first in, first out"), 2000);
    assert_slices_nest(&to_perfetto(&sample()).unwrap(), "sample");
    for name in [
        "decomfl_opt125m_zo_fedlearn.pickle",
        "cs336_medium_ctx512_train_step.pickle",
        "hta_ddp_rank1_v100_profile_memory.trace.json.gz",
    ] {
        let Some(path) = trace(name) else {
            continue;
        };
        let snapshot = import::load(&path).unwrap();
        let allocations = snapshot
            .events
            .iter()
            .filter(|e| e.kind == EventKind::Alloc)
            .count();
        let json = to_perfetto(&snapshot).unwrap();
        // Every allocation is a slice, and so is every step.
        assert_eq!(
            assert_slices_nest(&json, name),
            allocations + snapshot.steps.len(),
            "{name}"
        );
    }
}

fn segment_of(blocks: &[u64]) -> Segment {
    let mut address = 0x1000;
    Segment {
        device: 0,
        address,
        total_size: u64::MAX,
        stream: 0,
        pool: Pool::Large,
        expandable: false,
        blocks: blocks
            .iter()
            .map(|&size| {
                let b = Block {
                    address,
                    size,
                    requested_size: size,
                    state: BlockState::ActiveAllocated,
                    site: None,
                    tag: None,
                    scope: None,
                    step: 0,
                    thread: 0,
                };
                address = address.wrapping_add(size);
                b
            })
            .collect(),
    }
}

#[test]
fn sums_past_2_pow_64_are_errors_that_name_the_field() {
    let mut snapshot = sample();
    snapshot.segments = vec![segment_of(&[4096]), segment_of(&[1 << 63, 1 << 63])];
    match to_pytorch_pickle(&snapshot) {
        Err(ExportError::Overflow { path, .. }) => assert_eq!(path, "segments[1].blocks"),
        other => panic!("{other:?}"),
    }
    let mut snapshot = first_in_first_out(3);
    for e in &mut snapshot.events {
        e.size = 1 << 63;
    }
    let e = to_perfetto(&snapshot).unwrap_err();
    assert!(
        matches!(&e, ExportError::Overflow { path, .. } if path == "events[1].size"),
        "{e:?}"
    );
    assert!(e.to_string().contains("2^64"), "{e}");
}

/// An out-of-memory event's free device memory has a field of its own: PyTorch's pickles carry
/// it as `device_free` (an OOM has no `addr`), a vramscope snapshot of format 1 carried it in
/// `addr`, and every way in and out keeps it.
#[test]
fn an_oom_keeps_the_free_memory_in_its_own_field() {
    let alloc = CachingAllocator::new(SimDevice::phantom(64 << 20), AllocatorConfig::default());
    let _kept = alloc.alloc(40 << 20).unwrap();
    assert!(alloc.alloc(40 << 20).is_err());
    let snapshot = alloc.snapshot();
    let oom = *snapshot
        .events
        .iter()
        .find(|e| e.kind == EventKind::Oom)
        .expect("the failed request is recorded");
    assert_eq!(oom.addr, 0, "an OOM has no block");
    assert!(oom.device_free > 0 && oom.device_free < 64 << 20, "{oom:?}");

    // Through a PyTorch pickle: written as `device_free`, read back the same.
    let pickle = to_pytorch_pickle(&snapshot).unwrap();
    assert!(pickle.windows(11).any(|w| w == b"device_free"));
    let back =
        import::load_bytes(&pickle, "oom.pickle", &import::ImportOptions::default()).unwrap();
    let back_oom = back
        .events
        .iter()
        .find(|e| e.kind == EventKind::Oom)
        .unwrap();
    assert_eq!((back_oom.addr, back_oom.device_free), (0, oom.device_free));

    // A JSON snapshot of format 1 kept the free memory in `addr`: it is read into `device_free`.
    let mut old = serde_json::to_value(&snapshot).unwrap();
    old["format_version"] = 1.into();
    let mut rewritten = 0;
    for event in old["events"].as_array_mut().unwrap() {
        if event["kind"] == "oom" {
            event["addr"] = oom.device_free.into();
            event.as_object_mut().unwrap().remove("device_free");
            rewritten += 1;
        }
    }
    assert_eq!(rewritten, 1, "the OOM is written as kind \"oom\"");
    let upgraded =
        vramscope_model::Snapshot::from_json_bytes(old.to_string().as_bytes(), "old.json").unwrap();
    let upgraded_oom = upgraded
        .events
        .iter()
        .find(|e| e.kind == EventKind::Oom)
        .unwrap();
    assert_eq!(
        (upgraded_oom.addr, upgraded_oom.device_free),
        (0, oom.device_free)
    );
    assert_eq!(upgraded.format_version, vramscope_model::FORMAT_VERSION);
}

/// An allocation over a block the trace had not freed (a lost free) ends that block's slice
/// where it replaces it, as the engine's walk and the report take it, rather than leaving it
/// live to the end.
#[test]
fn perfetto_ends_a_block_whose_free_was_lost_where_its_address_is_reused() {
    let mut snapshot = sample();
    snapshot.events.clear();
    snapshot.steps.clear();
    snapshot.segments.clear();
    let event = |seq: u64, kind, size| {
        vramscope_testkit::event(kind)
            .seq(seq)
            .time_ns(1000 * (seq + 1))
            .stream(7)
            .addr(0x1000)
            .size(size)
            .build()
    };
    snapshot.events.push(event(0, EventKind::Alloc, 512));
    snapshot.events.push(event(1, EventKind::Alloc, 1024));
    snapshot
        .events
        .push(event(2, EventKind::FreeRequested, 1024));
    snapshot
        .events
        .push(event(3, EventKind::FreeCompleted, 1024));
    let json: serde_json::Value = serde_json::from_str(&to_perfetto(&snapshot).unwrap()).unwrap();
    let slices: Vec<(u64, f64, f64, bool)> = json["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["ph"] == "X" && e["args"]["size"].is_u64())
        .map(|e| {
            (
                e["args"]["size"].as_u64().unwrap(),
                e["ts"].as_f64().unwrap(),
                e["dur"].as_f64().unwrap(),
                e["args"]["live_at_end"] == true,
            )
        })
        .collect();
    assert_eq!(slices.len(), 2, "{slices:?}");
    let (first, second) = (slices[0], slices[1]);
    assert_eq!(first.0, 512);
    assert_eq!(
        first.2, 1.0,
        "the lost block ends at the reuse, a microsecond on"
    );
    assert!(!first.3, "and is not live at the end");
    assert_eq!(second.0, 1024);
    assert_eq!(second.1, first.1 + 1.0);
    assert_eq!(second.2, 2.0, "the new block ends at its completed free");
}
