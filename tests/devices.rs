//! Multi-device snapshots through the CLI: `report`, `summary` and `replay` report every device
//! with data in turn (JSON lists them, as it lists the one device of a single-device file), `--device N` picks one, and a device without data is
//! an error that lists those with data. Each device's part gives the figures of that device's
//! trace alone, whatever the traces.

use std::path::PathBuf;
use std::process::{Command, Output};

use serde_json::Value;
use vramscope::analysis::model_view::ModelView;
use vramscope::engine::Reconstruction;
use vramscope::model::EventKind;
use vramscope_testkit::{device_run, merge_devices};

/// Two devices' runs in one file, as a two-GPU snapshot holds them, and each run's peak.
fn two_device_file() -> (PathBuf, [u64; 2]) {
    let (a, b) = (device_run(0, 64 << 20), device_run(1, 300 << 20));
    let peaks = [
        ModelView::new(&a).peak_allocated(),
        ModelView::new(&b).peak_allocated(),
    ];
    let both = merge_devices(&[a, b]);
    let path =
        std::env::temp_dir().join(format!("vramscope-two-devices-{}.json", std::process::id()));
    both.save(&path).unwrap();
    (path, peaks)
}

fn vramscope(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_vramscope"))
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn every_device_is_reported_and_one_can_be_chosen() {
    let (path, peaks) = two_device_file();
    let file = path.to_str().unwrap();

    let all = vramscope(&["report", file, "--format", "json"]);
    assert!(
        all.status.success(),
        "{}",
        String::from_utf8_lossy(&all.stderr)
    );
    let json: Value = serde_json::from_slice(&all.stdout).unwrap();
    let devices = json["devices"].as_array().expect("a list of devices");
    assert_eq!(devices.len(), 2);
    for (report, peak) in devices.iter().zip(peaks) {
        assert_eq!(report["stats"]["peak_allocated_bytes"], peak);
    }

    let one = vramscope(&["report", file, "--format", "json", "--device", "1"]);
    assert!(one.status.success());
    let json: Value = serde_json::from_slice(&one.stdout).unwrap();
    assert_eq!(json["devices"].as_array().map(Vec::len), Some(1));
    assert_eq!(
        json["devices"][0]["stats"]["peak_allocated_bytes"],
        peaks[1]
    );

    let missing = vramscope(&["report", file, "--device", "7"]);
    assert_eq!(missing.status.code(), Some(2));
    let message = String::from_utf8_lossy(&missing.stderr);
    assert!(
        message.contains("device 7") && message.contains("0, 1"),
        "{message}"
    );

    let summary = vramscope(&["summary", file]);
    let text = String::from_utf8_lossy(&summary.stdout);
    assert_eq!(text.matches("| Allocated memory").count(), 2, "{text}");

    let replayed = vramscope(&["replay", file, "--format", "json"]);
    assert!(replayed.status.success());
    let json: Value = serde_json::from_slice(&replayed.stdout).unwrap();
    let runs = json.as_array().expect("one replay per device");
    assert_eq!(runs.len(), 2);
    for (run, peak) in runs.iter().zip(peaks) {
        assert_eq!(run["original"]["peak_allocated"], peak);
    }
    let _ = std::fs::remove_file(path);
}

/// The figures a reader compares between a device's part and its own run: the start, the
/// peak and the event that reached it (by its kind and address: a format may leave out events,
/// such as step marks, that move its index, and a PyTorch snapshot records requests, which its
/// import sizes from the dump-time blocks), the end, and what each site held at the peak.
type Figures = (u64, u64, Option<(EventKind, u64)>, u64, Vec<(String, u64)>);

fn figures(snapshot: &vramscope::model::Snapshot) -> Figures {
    let view = ModelView::new(snapshot);
    let mut at_peak: Vec<(String, u64)> = view
        .live_at_peak()
        .iter()
        .map(|h| (view.group(h.group).label().to_string(), h.bytes))
        .collect();
    at_peak.sort();
    let peak_event = view.peak_allocated_event().map(|i| {
        let e = &snapshot.events[i as usize];
        (e.kind, e.addr)
    });
    (
        view.baseline_allocated(),
        view.peak_allocated(),
        peak_event,
        view.end_allocated(),
        at_peak,
    )
}

proptest::proptest! {
    #![proptest_config(vramscope_testkit::props::config(48))]

    /// Two devices' traces of any shape, consistent or not, in one snapshot: each device's
    /// part gives the figures its trace gives alone (start, peak and its event, end, and what
    /// each site holds at the peak), as `report` shows them device by device, and so does the
    /// same file written as a PyTorch pickle and read again, whose statistics are its own
    /// device's.
    #[test]
    fn each_devices_part_gives_its_own_figures(
        ops in proptest::collection::vec(vramscope_testkit::generated::ops(1..5, 1..60), 2),
        live_at_dump in proptest::collection::vec(vramscope_testkit::generated::live_at_dump(), 2),
    ) {
        use vramscope_testkit::generated::trace_of_ops;
        let mut runs: Vec<_> = (0..2).map(|d| trace_of_ops(&ops[d], &live_at_dump[d])).collect();
        // Device 1 at addresses of its own, as CUDA's unified addressing gives a process's
        // devices.
        const APART: u64 = 1 << 40;
        for e in runs[1].events.iter_mut() {
            e.device = 1;
            if e.addr != 0 {
                e.addr += APART;
            }
        }
        for s in runs[1].segments.iter_mut() {
            s.device = 1;
            s.address += APART;
            for b in s.blocks.iter_mut() {
                b.address += APART;
            }
        }
        // The device numbers the file has.
        runs[1].device.index = 1;
        let both = merge_devices(&runs);
        // The same file written as a PyTorch pickle (a trace list per device) and read again.
        let pickle = vramscope::export::export_pytorch(&both, None).unwrap().bytes;
        let back = vramscope::import::load_bytes(&pickle, "both.pickle", &Default::default()).unwrap();
        // The whole file's statistics are those of its own device, as its part has them.
        let own = vramscope::engine::devices::only_device(&back, back.device.index);
        proptest::prop_assert_eq!(back.stats, own.stats);
        for (d, run) in runs.iter().enumerate() {
            let part = vramscope::engine::devices::only_device(&both, d as u32);
            proptest::prop_assert_eq!(part.events.len(), run.events.len());
            proptest::prop_assert_eq!(figures(&part), figures(run), "device {}", d);
            // Through the pickle, the start, peak and end are the trace's; where the trace
            // contradicts itself, a dump-time block without a site takes the site of the last
            // allocation at its address, as the PyTorch import names blocks, so the holdings
            // are compared on consistent traces only.
            let part = vramscope::engine::devices::only_device(&back, d as u32);
            let (through, own) = (figures(&part), figures(run));
            if Reconstruction::from_snapshot(run).disagreements.is_empty() {
                proptest::prop_assert_eq!(through, own, "device {} through a pickle", d);
            } else {
                proptest::prop_assert_eq!(
                    (through.0, through.1, through.3),
                    (own.0, own.1, own.3),
                    "device {} through a pickle",
                    d
                );
            }
        }
    }
}

/// A device that holds memory but recorded no events (idle while another worked) is not
/// reported by default, and its memory is not counted in the busy device's report either.
#[test]
fn an_idle_devices_memory_stays_out_of_the_busy_devices_report() {
    let (mut idle, busy) = (device_run(0, 64 << 20), device_run(1, 300 << 20));
    idle.events = Default::default();
    idle.steps.clear();
    let busy_view = ModelView::new(&busy);
    let (peak, reserved) = (busy_view.peak_allocated(), busy_view.end_reserved());
    let mut both = merge_devices(&[idle, busy]);
    both.device.index = 0;
    let path =
        std::env::temp_dir().join(format!("vramscope-idle-device-{}.json", std::process::id()));
    both.save(&path).unwrap();
    let out = vramscope(&["report", path.to_str().unwrap(), "--format", "json"]);
    let _ = std::fs::remove_file(&path);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let json: Value = serde_json::from_slice(&out.stdout).unwrap();
    let devices = json["devices"].as_array().unwrap();
    assert_eq!(devices.len(), 1, "one device has events");
    assert_eq!(devices[0]["stats"]["peak_allocated_bytes"], peak);
    assert_eq!(devices[0]["stats"]["reserved_bytes"], reserved);
}
