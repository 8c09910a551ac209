//! Multi-device snapshots through the CLI: `report`, `summary` and `replay` report every device
//! with data in turn (JSON lists them), `--device N` picks one, and a device without data is
//! an error that lists those with data.

use std::path::PathBuf;
use std::process::{Command, Output};

use serde_json::Value;
use vramscope::inspector::model_view::ModelView;
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
    assert_eq!(json["stats"]["peak_allocated_bytes"], peaks[1]);

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
