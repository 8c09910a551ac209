//! Export to PyTorch's pickle format: the shared traces survive pickle → model → pickle →
//! model unchanged, and Python's own `pickle` reads what we write with PyTorch's keys and value
//! types (when python3 exists; otherwise one line says it was skipped).

use std::path::{Path, PathBuf};
use std::process::Command;

use vramscope_export::{to_perfetto, to_pytorch_pickle};
use vramscope_import::{self as import, ImportOptions};
use vramscope_model::Snapshot;

fn trace(name: &str) -> Option<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    vramscope_testkit::shared_trace(&root, name)
}

/// What a PyTorch snapshot carries, in comparable form.
fn essentials(s: &Snapshot) -> impl PartialEq + std::fmt::Debug {
    let segments: Vec<_> = s
        .segments
        .iter()
        .map(|seg| {
            let blocks: Vec<_> = seg
                .blocks
                .iter()
                .map(|b| {
                    (
                        b.address,
                        b.size,
                        b.requested_size,
                        b.state,
                        s.site(b.site).cloned(),
                    )
                })
                .collect();
            (
                seg.device,
                seg.address,
                seg.total_size,
                seg.stream,
                seg.pool,
                seg.expandable,
                blocks,
            )
        })
        .collect();
    let events: Vec<_> = s
        .events
        .iter()
        .map(|e| {
            (
                e.kind,
                e.device,
                e.addr,
                e.size,
                e.stream,
                e.time_ns,
                e.step,
                s.site(e.site()).cloned(),
            )
        })
        .collect();
    let annotations: Vec<_> = s
        .annotations
        .iter()
        .map(|a| (a.name.clone(), a.stage.clone(), a.time_ns, a.device))
        .collect();
    (
        segments,
        events,
        annotations,
        s.steps.clone(),
        s.config.clone(),
    )
}

#[test]
fn shared_pickles_round_trip_through_export() {
    for name in [
        "decomfl_opt125m_zo_fedlearn.pickle",
        "cs336_medium_ctx512_train_step.pickle",
    ] {
        let Some(path) = trace(name) else {
            continue;
        };
        let first = import::load(&path).unwrap();
        let bytes = to_pytorch_pickle(&first).unwrap();
        let second = import::load_bytes(&bytes, name, &ImportOptions::default()).unwrap();
        assert_eq!(essentials(&second), essentials(&first), "{name}");
        let size = std::fs::metadata(&path).unwrap().len();
        assert!(
            (bytes.len() as u64) < size * 2,
            "{name}: {} bytes written for a {size}-byte original",
            bytes.len()
        );
    }
}

#[test]
fn python_reads_the_pickle_with_pytorch_keys_and_types() {
    let Some(path) = trace("decomfl_opt125m_zo_fedlearn.pickle") else {
        return;
    };
    if Command::new("python3").arg("--version").output().is_err() {
        vramscope_testkit::skip_notice("python3 not found, pickle check not run");
        return;
    }
    let snapshot = import::load(&path).unwrap();
    let out = std::env::temp_dir().join(format!("vramscope-export-{}.pickle", std::process::id()));
    std::fs::write(&out, to_pytorch_pickle(&snapshot).unwrap()).unwrap();
    let script = r#"
import pickle, sys
d = pickle.load(open(sys.argv[1], "rb"))
assert set(d) >= {"segments", "device_traces", "allocator_settings", "external_annotations"}, d.keys()
seg = d["segments"][0]
for key, kind in [("device", int), ("address", int), ("total_size", int), ("allocated_size", int),
                  ("active_size", int), ("requested_size", int), ("stream", int), ("segment_type", str),
                  ("segment_pool_id", tuple), ("is_expandable", bool), ("frames", list), ("blocks", list)]:
    assert isinstance(seg[key], kind), (key, type(seg[key]))
block = seg["blocks"][0]
assert set(block) >= {"address", "size", "requested_size", "state", "frames"}
assert block["state"] in ("active_allocated", "active_pending_free", "inactive")
trace = d["device_traces"][0]
entry = trace[1]
for key, kind in [("action", str), ("addr", int), ("size", int), ("stream", int), ("time_us", int), ("frames", list)]:
    assert isinstance(entry[key], kind), (key, type(entry[key]))
frame = next(e for e in trace if e["frames"])["frames"][0]
assert isinstance(frame["filename"], str) and isinstance(frame["line"], int) and isinstance(frame["name"], str)
print(len(d["segments"]), len(trace))
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
    assert_eq!(printed.trim(), format!("61 23105"));
}

#[test]
fn perfetto_export_of_a_shared_trace_is_valid_chrome_json() {
    let Some(path) = trace("decomfl_opt125m_zo_fedlearn.pickle") else {
        return;
    };
    let snapshot = import::load(&path).unwrap();
    let value: serde_json::Value = serde_json::from_str(&to_perfetto(&snapshot).unwrap()).unwrap();
    let events = value["traceEvents"].as_array().unwrap();
    let slices = events
        .iter()
        .filter(|e| e["ph"] == "X" && e["args"]["size"].is_u64())
        .count();
    assert_eq!(slices, 7946, "one slice per allocation, live or freed");
}
