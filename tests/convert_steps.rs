//! `vramscope convert --steps A..B` end to end (issue 36): every format takes a range of
//! steps, numbered as `report` numbers them, and writes only those steps; a range the trace
//! does not have, or one that is not a range, is exit 2 with a sentence that says why, and no
//! output file is left behind.

use std::path::PathBuf;
use std::process::{Command, Output};

fn vramscope(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_vramscope"))
        .args(args)
        .env("NO_COLOR", "1")
        .output()
        .expect("vramscope runs")
}

fn temp(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("vramscope-steps-{}-{name}", std::process::id()))
}

/// A snapshot saved as `name`: five steps, each allocating and freeing a block of its own size, with
/// one block held from before the first.
fn five_steps(name: &str) -> PathBuf {
    use vramscope::{AllocatorConfig, CachingAllocator, SimDevice};
    let path = temp(name);
    let alloc = CachingAllocator::new(SimDevice::phantom(1 << 34), AllocatorConfig::default());
    let _held = alloc.alloc(3 << 20).unwrap();
    for step in 1..=5 {
        alloc.mark_step();
        drop(alloc.alloc(1000 * step).unwrap());
    }
    alloc.snapshot().save(&path).unwrap();
    path
}

#[test]
fn every_format_converts_a_range_of_steps() {
    let source = five_steps("formats.json");
    let src = source.to_str().unwrap();
    for (target, name) in [
        ("pytorch", "out.pickle"),
        ("perfetto", "out.trace.json"),
        ("json", "out.json"),
        ("events", "out.jsonl"),
        ("html", "out.html"),
    ] {
        let out = temp(name);
        let path = out.to_str().unwrap();
        let output = vramscope(&[
            "convert", src, "--to", target, "--steps", "2..3", "-o", path,
        ]);
        let err = String::from_utf8_lossy(&output.stderr);
        assert!(output.status.success(), "{target}: {err}");
        match target {
            "perfetto" => {
                let value: serde_json::Value =
                    serde_json::from_slice(&std::fs::read(&out).unwrap()).unwrap();
                let steps: Vec<&str> = value["traceEvents"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .filter(|e| e["ph"] == "X" && e["tid"] == 0)
                    .map(|e| e["name"].as_str().unwrap())
                    .collect();
                assert_eq!(steps, ["step 2", "step 3"]);
            }
            "pytorch" | "json" => {
                let report = vramscope(&["report", path, "--format", "json"]);
                let value: serde_json::Value = serde_json::from_slice(&report.stdout).unwrap();
                assert_eq!(
                    value["devices"][0]["steps"], 2,
                    "{target}: steps 2 and 3 read back"
                );
            }
            _ => assert!(std::fs::metadata(&out).unwrap().len() > 0),
        }
        std::fs::remove_file(out).ok();
    }
    std::fs::remove_file(source).ok();
}

#[test]
fn a_range_the_trace_does_not_have_is_exit_2_and_leaves_no_file() {
    let source = five_steps("errors.json");
    let src = source.to_str().unwrap();
    let out = temp("none.json");
    let path = out.to_str().unwrap();
    let output = vramscope(&[
        "convert", src, "--to", "perfetto", "--steps", "9..12", "-o", path,
    ]);
    let err = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{err}");
    assert!(
        err.contains("no event of the trace is in steps 9..12"),
        "{err}"
    );
    assert!(err.contains("its events are in steps 0..5"), "{err}");
    assert!(
        !out.exists(),
        "no output for a range the trace does not have"
    );
    let output = vramscope(&[
        "convert", src, "--to", "pytorch", "--steps", "3..2", "-o", path,
    ]);
    let err = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{err}");
    assert!(err.contains("starts after it ends"), "{err}");
    std::fs::remove_file(source).ok();
}
