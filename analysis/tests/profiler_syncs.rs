//! The host's waits for the device in torch.profiler traces (issue 43): traces built here in the
//! shapes PyTorch writes (Kineto's `cpu_op`/`cuda_runtime`/`gpu_memcpy`/`python_function` and
//! the 2021 format's `Operator`/`Runtime`/`Memcpy` with `Call stack`), each checked for the
//! exact number of waits, the line named and the cause.

use std::io::Write;

use serde_json::{json, Value};
use vramscope_analysis::detect::{Finding, FindingKind};
use vramscope_analysis::report::{build_report, ReportOptions};
use vramscope_import::{load_bytes, ImportOptions};
use vramscope_model::{EventKind, Snapshot, TransferDirection};

/// A trace being built: events on one host thread (pid 1, tid 1) and the device (pid 0,
/// tid 7), with times in microseconds.
struct Trace {
    events: Vec<Value>,
    correlation: u64,
    /// The 2021 format: `Operator`, `Runtime`, `Memcpy`, no `python_function`.
    old: bool,
}

impl Trace {
    fn new(old: bool) -> Trace {
        Trace {
            events: Vec::new(),
            correlation: 1000,
            old,
        }
    }

    fn slice(&mut self, cat: &str, name: &str, ts: f64, dur: f64, args: Value) {
        self.events.push(json!({
            "ph": "X", "cat": cat, "name": name, "pid": 1, "tid": 1,
            "ts": ts, "dur": dur, "args": args,
        }));
    }

    fn step(&mut self, n: u32, ts: f64, dur: f64) {
        self.slice(
            "user_annotation",
            &format!("ProfilerStep#{n}"),
            ts,
            dur,
            json!({}),
        );
    }

    fn python(&mut self, frame: &str, ts: f64, dur: f64) {
        self.slice("python_function", frame, ts, dur, json!({}));
    }

    fn op(&mut self, name: &str, ts: f64, dur: f64, stack: Option<&str>) {
        let cat = if self.old { "Operator" } else { "cpu_op" };
        let args = match stack {
            Some(s) => json!({ "Call stack": s }),
            None => json!({}),
        };
        self.slice(cat, name, ts, dur, args);
    }

    fn runtime(&mut self, name: &str, ts: f64, dur: f64) -> u64 {
        self.correlation += 1;
        let cat = if self.old { "Runtime" } else { "cuda_runtime" };
        let c = self.correlation;
        self.slice(cat, name, ts, dur, json!({ "correlation": c, "cbid": 1 }));
        c
    }

    /// A copy: its runtime call at `ts`, its device event, and the `ac2g` flow between them.
    fn copy(&mut self, api: &str, direction: &str, bytes: u64, ts: f64, dur: f64) {
        let c = self.runtime(api, ts, dur);
        let cat = if self.old { "Memcpy" } else { "gpu_memcpy" };
        self.events.push(json!({
            "ph": "X", "cat": cat, "name": format!("Memcpy {direction}"), "pid": 0, "tid": 7,
            "ts": ts + 1.0, "dur": 1, "args": { "correlation": c, "bytes": bytes, "stream": 7 },
        }));
        self.events.push(json!({"ph": "s", "cat": "ac2g", "name": "ac2g", "id": c, "pid": 1, "tid": 1, "ts": ts}));
        self.events.push(json!({"ph": "f", "cat": "ac2g", "name": "ac2g", "id": c, "pid": 0, "tid": 7, "ts": ts + 1.0, "bp": "e"}));
    }

    /// `.item()` of a CUDA tensor at `ts` (10 µs): `aten::item` around
    /// `aten::_local_scalar_dense`, a 4-byte copy to pageable memory and a stream sync.
    fn item(&mut self, ts: f64, stack: Option<&str>) {
        self.op("aten::item", ts, 10.0, stack);
        self.op("aten::_local_scalar_dense", ts + 1.0, 8.0, stack);
        self.copy(
            "cudaMemcpyAsync",
            "DtoH (Device -> Pageable)",
            4,
            ts + 2.0,
            3.0,
        );
        self.runtime("cudaStreamSynchronize", ts + 6.0, 2.0);
    }

    /// `.item()` of a CPU tensor: the operators and no runtime call.
    fn cpu_item(&mut self, ts: f64) {
        self.op("aten::item", ts, 2.0, None);
        self.op("aten::_local_scalar_dense", ts + 0.5, 1.0, None);
    }

    /// A `[memory]` event on the host thread.
    fn memory(&mut self, ts: f64, addr: Option<u64>, bytes: i64, total: Option<u64>) {
        let mut args = json!({ "Device Type": 1, "Device Id": 0, "Bytes": bytes });
        if let Some(a) = addr {
            args["Addr"] = json!(a);
        }
        if let Some(t) = total {
            args["Total Allocated"] = json!(t);
            args["Total Reserved"] = json!(64 << 20);
        }
        self.events.push(json!({
            "ph": "i", "cat": "cpu_instant_event", "s": "t", "name": "[memory]",
            "pid": 1, "tid": 1, "ts": ts, "args": args,
        }));
    }

    fn bytes(&self) -> Vec<u8> {
        serde_json::to_vec(&json!({
            "schemaVersion": 1,
            "deviceProperties": [{"id": 0, "name": "Test GPU", "totalGlobalMem": 1u64 << 34}],
            "traceEvents": self.events,
        }))
        .unwrap()
    }
}

fn load(bytes: &[u8]) -> Snapshot {
    load_bytes(bytes, "trace.json", &ImportOptions::default()).unwrap()
}

fn waits(snapshot: &Snapshot) -> usize {
    snapshot
        .events
        .iter()
        .filter(|e| e.kind == EventKind::Sync)
        .count()
}

fn syncs_found(snapshot: &Snapshot) -> (Vec<Finding>, vramscope_analysis::report::Report) {
    let mut options = ReportOptions::default();
    options.explorer = false;
    let report = build_report(snapshot, &options);
    let found = report
        .findings
        .iter()
        .filter(|f| f.kind == FindingKind::SyncInLoop)
        .cloned()
        .collect();
    (found, report)
}

const USER: &str = "/home/u/train.py";

/// Three profiler steps; in each, `per_step` calls of `.item()` at train.py:44 under the
/// Python frames of `main` and `train_step`, and one allocation.
fn item_loop(per_step: usize) -> Trace {
    let mut t = Trace::new(false);
    t.python(&format!("{USER}(90): <module>"), 0.0, 10_000.0);
    for s in 0..3u32 {
        let base = 100.0 + f64::from(s) * 3000.0;
        t.step(s + 1, base, 2500.0);
        t.python(&format!("{USER}(60): main"), base + 1.0, 2400.0);
        t.python(&format!("{USER}(44): train_step"), base + 2.0, 2300.0);
        t.op("aten::empty", base + 3.0, 2.0, None);
        t.memory(base + 4.0, Some(4096 * (u64::from(s) + 1)), 512, Some(512));
        for k in 0..per_step {
            let ts = base + 10.0 + k as f64 * 20.0;
            t.python(
                "<built-in method item of Tensor object at 0x7f3a>",
                ts - 0.5,
                11.0,
            );
            t.item(ts, None);
        }
        t.memory(
            base + 2200.0,
            Some(4096 * (u64::from(s) + 1)),
            -512,
            Some(0),
        );
    }
    t
}

#[test]
fn an_item_per_element_warns_at_its_line() {
    let snapshot = load(&item_loop(32).bytes());
    assert_eq!(waits(&snapshot), 96);
    let d2h: Vec<u64> = snapshot
        .events
        .iter()
        .filter(|e| e.kind == EventKind::Transfer(TransferDirection::DeviceToHost))
        .map(|e| e.size)
        .collect();
    assert_eq!(d2h.len(), 96);
    assert!(d2h.iter().all(|&b| b == 4));
    // Each wait lasts its copy and its sync: 3 + 2 µs.
    let waited: Vec<u64> = snapshot
        .events
        .iter()
        .filter_map(|e| e.waited_ns())
        .collect();
    assert_eq!(waited.len(), 96);
    assert!(waited.iter().all(|&ns| ns == 5_000), "{waited:?}");
    let (found, report) = syncs_found(&snapshot);
    assert!(report.caveats.is_empty());
    assert_eq!(found.len(), 1, "{:?}", report.findings);
    let f = &found[0];
    assert_eq!(f.site.as_deref(), Some("/home/u/train.py:44"));
    assert_eq!(f.count, 96);
    assert_eq!(f.per_step.unwrap().count, 32.0);
    assert!(f.summary.contains("caused by `.item()`"), "{}", f.summary);
    assert!(
        f.summary.contains("the host waited 480 µs in all"),
        "{}",
        f.summary
    );
    assert!(f.fix.contains(".tolist()"), "{}", f.fix);
    assert_eq!(report.stats.syncs, Some(96));
    assert_eq!(report.stats.host_waits, Some(96));
    assert_eq!(report.stats.transfers, Some(96));
    assert_eq!(report.stats.d2h_bytes, Some(384));
    assert_eq!(report.stats.host_wait_ns, Some(480_000));
    assert_eq!(report.steps, 3);
    // The memory events are named at the user's line too.
    let alloc = snapshot
        .events
        .iter()
        .find(|e| e.kind == EventKind::Alloc)
        .unwrap();
    assert_eq!(
        snapshot.site(alloc.site()).map(|s| s.file_line()),
        Some("/home/u/train.py:44".to_string())
    );
}

#[test]
fn one_item_per_step_is_silent_and_counted() {
    let snapshot = load(&item_loop(1).bytes());
    assert_eq!(waits(&snapshot), 3);
    let (found, report) = syncs_found(&snapshot);
    assert!(found.is_empty(), "{found:?}");
    assert_eq!(report.stats.host_waits, Some(3));
    assert_eq!(report.stats.host_wait_ns, Some(15_000));
}

#[test]
fn cpu_items_beside_real_syncs_count_only_the_real_ones() {
    let mut t = Trace::new(false);
    for s in 0..3u32 {
        let base = 100.0 + f64::from(s) * 10_000.0;
        t.step(s + 1, base, 9000.0);
        t.python(&format!("{USER}(70): train_step"), base + 1.0, 8900.0);
        for k in 0..300 {
            t.cpu_item(base + 10.0 + f64::from(k) * 5.0);
        }
        for k in 0..2 {
            t.item(base + 2000.0 + f64::from(k) * 20.0, None);
        }
    }
    let snapshot = load(&t.bytes());
    assert_eq!(waits(&snapshot), 6);
    let (found, report) = syncs_found(&snapshot);
    assert_eq!(report.stats.host_waits, Some(6));
    // Two waits per step at one line: a warning with exactly those.
    assert_eq!(found.len(), 1);
    assert_eq!(found[0].count, 6);
    assert_eq!(found[0].per_step.unwrap().count, 2.0);
}

#[test]
fn a_per_layer_isnan_check_is_named_with_its_fix() {
    let mut t = Trace::new(false);
    for s in 0..3u32 {
        let base = 100.0 + f64::from(s) * 5000.0;
        t.step(s + 1, base, 4000.0);
        t.python("/home/u/model.py(88): forward", base + 1.0, 3900.0);
        for layer in 0..12 {
            let ts = base + 10.0 + f64::from(layer) * 30.0;
            t.op("aten::isnan", ts, 3.0, None);
            t.op("aten::any", ts + 4.0, 3.0, None);
            t.op("aten::is_nonzero", ts + 8.0, 14.0, None);
            t.item(ts + 9.0, None);
        }
    }
    let snapshot = load(&t.bytes());
    let (found, _) = syncs_found(&snapshot);
    assert_eq!(found.len(), 1);
    let f = &found[0];
    assert_eq!(f.site.as_deref(), Some("/home/u/model.py:88"));
    assert_eq!(f.count, 36);
    assert!(f.summary.contains("`if tensor:`"), "{}", f.summary);
    assert!(f.fix.contains("torch._assert_async"), "{}", f.fix);
}

#[test]
fn a_library_loop_names_the_library_line_and_the_user_line() {
    let lib = "/venv/lib/python3.11/site-packages/transformers/pipelines/base.py";
    let mut t = Trace::new(false);
    for s in 0..3u32 {
        let base = 100.0 + f64::from(s) * 5000.0;
        t.step(s + 1, base, 4000.0);
        t.python(&format!("{USER}(21): run"), base + 1.0, 3900.0);
        t.python(&format!("{lib}(1120): forward"), base + 2.0, 3800.0);
        t.python(
            &format!("{lib}(1045): _ensure_tensor_on_device"),
            base + 3.0,
            3700.0,
        );
        for k in 0..10 {
            let ts = base + 10.0 + f64::from(k) * 40.0;
            t.op("aten::to", ts, 30.0, None);
            t.op("aten::_to_copy", ts + 1.0, 28.0, None);
            t.op("aten::copy_", ts + 2.0, 26.0, None);
            t.copy(
                "cudaMemcpyAsync",
                "DtoH (Device -> Pageable)",
                4096,
                ts + 3.0,
                15.0,
            );
            t.runtime("cudaStreamSynchronize", ts + 20.0, 5.0);
        }
    }
    let snapshot = load(&t.bytes());
    assert_eq!(waits(&snapshot), 30);
    let (found, _) = syncs_found(&snapshot);
    assert_eq!(found.len(), 1);
    let f = &found[0];
    assert_eq!(f.site.as_deref(), Some("/home/u/train.py:21"));
    assert_eq!(f.count, 30);
    assert!(f.summary.contains("`.to(\"cpu\")`"), "{}", f.summary);
    assert!(
        f.summary.contains(&format!("inside {lib}:1045")),
        "{}",
        f.summary
    );
    assert!(f.fix.contains(".cpu() after the loop"), "{}", f.fix);
}

#[test]
fn the_2021_format_with_call_stacks_and_bytes_only_memory() {
    let mut t = Trace::new(true);
    let stack = "/home/u/old.py(17): evaluate;\r\n/home/u/old.py(40): <module>";
    let mut total: i64 = 0;
    for s in 0..3u32 {
        let base = 100.0 + f64::from(s) * 5000.0;
        t.step(s + 1, base, 4000.0);
        t.op(
            "aten::empty",
            base + 2.0,
            3.0,
            Some("/home/u/old.py(12): evaluate;\r\n/home/u/old.py(40): <module>"),
        );
        t.memory(base + 3.0, None, 1 << 20, None);
        total += 1 << 20;
        for k in 0..9 {
            t.item(base + 10.0 + f64::from(k) * 20.0, Some(stack));
        }
        if s > 0 {
            t.memory(base + 500.0, None, -(1 << 20), None);
            total -= 1 << 20;
        }
    }
    let snapshot = load(&t.bytes());
    assert_eq!(waits(&snapshot), 27);
    let allocs: Vec<_> = snapshot
        .events
        .iter()
        .filter(|e| e.kind == EventKind::Alloc)
        .collect();
    assert_eq!(allocs.len(), 3);
    assert_eq!(
        snapshot.site(allocs[0].site()).map(|s| s.file_line()),
        Some("/home/u/old.py:12".to_string())
    );
    let (found, report) = syncs_found(&snapshot);
    assert_eq!(found.len(), 1);
    assert_eq!(found[0].site.as_deref(), Some("/home/u/old.py:17"));
    assert_eq!(found[0].count, 27);
    assert_eq!(report.caveats.len(), 1);
    assert!(
        report.caveats[0].contains("no addresses"),
        "{:?}",
        report.caveats
    );
    // The curve from the deltas: one block live at the end, two at the peak.
    assert_eq!(report.stats.allocated_bytes, total as u64);
    assert_eq!(report.stats.peak_allocated_bytes, 2 << 20);
}

#[test]
fn syncs_without_memory_events_are_analysed_and_gzip_reads_the_same() {
    let t = item_loop(16);
    let plain: Vec<u8> = t.bytes();
    // Drop the memory events.
    let text = String::from_utf8(plain).unwrap();
    let mut v: Value = serde_json::from_str(&text).unwrap();
    v["traceEvents"]
        .as_array_mut()
        .unwrap()
        .retain(|e| e["name"] != "[memory]");
    let plain = serde_json::to_vec(&v).unwrap();
    let snapshot = load(&plain);
    assert_eq!(
        snapshot
            .events
            .iter()
            .filter(|e| e.kind == EventKind::Alloc)
            .count(),
        0
    );
    assert_eq!(waits(&snapshot), 48);
    let (found, _) = syncs_found(&snapshot);
    assert_eq!(found.len(), 1);
    assert_eq!(found[0].count, 48);

    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(&plain).unwrap();
    let packed = gz.finish().unwrap();
    let unpacked = load_bytes(&packed, "trace.json.gz", &ImportOptions::default()).unwrap();
    assert_eq!(unpacked, snapshot);
}

#[test]
fn a_loop_over_layers_without_profiler_steps_is_one_step() {
    let mut t = Trace::new(false);
    t.python(&format!("{USER}(30): forward"), 0.0, 5000.0);
    for layer in 0..24u32 {
        let ts = 10.0 + f64::from(layer) * 40.0;
        t.op("aten::empty", ts, 2.0, None);
        t.memory(
            ts + 1.0,
            Some(8192 * (u64::from(layer) + 1)),
            1024,
            Some(1024),
        );
        t.item(ts + 5.0, None);
        t.memory(
            ts + 30.0,
            Some(8192 * (u64::from(layer) + 1)),
            -1024,
            Some(0),
        );
    }
    let snapshot = load(&t.bytes());
    let (found, report) = syncs_found(&snapshot);
    assert_eq!(report.steps, 1);
    assert_eq!(found.len(), 1);
    assert_eq!(found[0].count, 24);
    assert!(
        found[0]
            .summary
            .contains("24 times in the trace's one step"),
        "{}",
        found[0].summary
    );
}

#[test]
fn stream_waits_and_device_copies_are_not_host_waits() {
    let mut t = Trace::new(false);
    for s in 0..3u32 {
        let base = 100.0 + f64::from(s) * 5000.0;
        t.step(s + 1, base, 4000.0);
        for k in 0..20 {
            let ts = base + 10.0 + f64::from(k) * 20.0;
            t.runtime("cudaStreamWaitEvent", ts, 2.0);
            t.copy(
                "cudaMemcpyAsync",
                "DtoD (Device -> Device)",
                1 << 20,
                ts + 5.0,
                3.0,
            );
            t.copy(
                "cudaMemcpyAsync",
                "DtoH (Device -> Pinned)",
                64,
                ts + 10.0,
                3.0,
            );
        }
    }
    let snapshot = load(&t.bytes());
    assert_eq!(waits(&snapshot), 0);
    let (found, report) = syncs_found(&snapshot);
    assert!(found.is_empty());
    assert_eq!(report.stats.syncs, Some(0));
    assert_eq!(report.stats.transfers, Some(60));
}
