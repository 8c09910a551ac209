//! Every face of the command line gives one answer for a file (issue 42, items 4 and 11).
//!
//! A 3-GPU dump whose cuda:1 ran out of memory: the text and markdown reports open with the
//! whole file's verdict, which names the OOM on cuda:1; `--format html` opens the file with a
//! device picker, cuda:1 first; the JSON has the one shape of a single-device file, with
//! three entries; `--fail-on` counts every device. An empty dump: `report`, `summary`, `view`
//! and `replay --verify` each exit 2 with the same sentence.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;
use vramscope::model::{DeviceInfo, Snapshot, SnapshotSource};
use vramscope_testkit::{device_run, three_devices_oom_on_1};

fn vramscope(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_vramscope"))
        .args(args)
        .env("NO_COLOR", "1")
        .output()
        .unwrap()
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("vramscope-faces-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// The 3-device file, saved under `dir`.
fn three_devices(dir: &Path) -> PathBuf {
    let path = dir.join("three.json");
    three_devices_oom_on_1().save(&path).unwrap();
    path
}

#[test]
fn a_multi_device_file_opens_with_the_whole_files_verdict() {
    let dir = scratch("verdict");
    let path = three_devices(&dir);
    let file = path.to_str().unwrap();

    let text = vramscope(&["report", file]);
    assert!(text.status.success(), "{}", stderr(&text));
    let text = stdout(&text);
    let first = text.lines().next().unwrap();
    assert!(
        first.starts_with("1 problem found: oom on cuda:1 at "),
        "the first line is the file's verdict: {first}"
    );
    // Each device's part follows, opening with its own verdict.
    for device in [
        "cuda:0: no leaks",
        "cuda:1: 1 problem found: oom at",
        "cuda:2: no leaks",
    ] {
        assert!(text.contains(device), "{device} in:\n{text}");
    }

    let markdown = stdout(&vramscope(&["report", file, "--format", "markdown"]));
    let verdict_line = markdown.lines().find(|l| l.starts_with("**")).unwrap();
    assert!(
        verdict_line.starts_with("**1 problem found: oom on cuda:1 at "),
        "{markdown}"
    );
    assert_eq!(markdown.matches("\n## cuda:").count(), 3, "{markdown}");

    // --fail-on counts every device: the OOM is on cuda:1, not on the first device.
    let failing = vramscope(&["report", file, "--fail-on", "error", "-o", "/dev/null"]);
    assert_eq!(failing.status.code(), Some(1), "{}", stderr(&failing));
    let device0 = vramscope(&["report", file, "--device", "0", "--fail-on", "error"]);
    assert_eq!(device0.status.code(), Some(0), "{}", stderr(&device0));
    std::fs::remove_dir_all(dir).ok();
}

#[test]
fn json_has_one_shape_for_one_device_or_many() {
    let dir = scratch("json");
    let path = three_devices(&dir);
    let file = path.to_str().unwrap();
    let one_path = dir.join("one.json");
    device_run(0, 64 << 20).save(&one_path).unwrap();

    let many: Value =
        serde_json::from_slice(&vramscope(&["report", file, "--format", "json"]).stdout).unwrap();
    let one: Value = serde_json::from_slice(
        &vramscope(&["report", one_path.to_str().unwrap(), "--format", "json"]).stdout,
    )
    .unwrap();
    let keys = |v: &Value| {
        let mut k: Vec<String> = v.as_object().unwrap().keys().cloned().collect();
        k.sort();
        k
    };
    assert_eq!(keys(&many), keys(&one), "the same top-level keys");
    assert_eq!(many["format_version"], 3);
    let devices = many["devices"].as_array().unwrap();
    assert_eq!(devices.len(), 3);
    assert_eq!(one["devices"].as_array().unwrap().len(), 1);
    assert_eq!(
        keys(&devices[0]),
        keys(&one["devices"][0]),
        "the same device keys"
    );
    assert_eq!(many["worst_device"], 1);
    assert!(
        many["verdict"]
            .as_str()
            .unwrap()
            .starts_with("1 problem found: oom on cuda:1"),
        "{many:#}"
    );
    let kinds: Vec<Vec<String>> = devices
        .iter()
        .map(|d| {
            d["findings"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|f| f["severity"] == "error")
                .map(|f| f["kind"].as_str().unwrap().to_string())
                .collect()
        })
        .collect();
    assert_eq!(kinds, [vec![], vec!["oom".to_string()], vec![]]);
    assert_eq!(devices[1]["device"]["index"], 1);
    std::fs::remove_dir_all(dir).ok();
}

#[test]
fn html_opens_a_multi_device_file_with_the_worst_device_first() {
    let dir = scratch("html");
    let path = three_devices(&dir);
    let out = vramscope(&["report", path.to_str().unwrap(), "--format", "html"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let page = stdout(&out);
    let buttons: Vec<&str> = page
        .match_indices("<button role=\"tab\" data-device=\"")
        .map(|(at, m)| &page[at + m.len()..at + m.len() + 1])
        .collect();
    assert_eq!(buttons, ["1", "0", "2"], "the worst device first");
    assert!(page.contains("1 problem found: oom on cuda:1 at "));
    assert_eq!(page.matches("<iframe class=\"device\"").count(), 3);
    // Only the worst device's page is shown at first.
    assert_eq!(
        page.matches("<iframe class=\"device\"").count() - 1,
        page.matches(" hidden srcdoc=").count()
    );
    std::fs::remove_dir_all(dir).ok();
}

/// The sentence every face says of an empty dump.
const NOTHING: &str = "nothing to analyse: the snapshot holds no events and no segments";

#[test]
fn an_empty_dump_gets_the_same_answer_from_every_face() {
    let dir = scratch("empty");
    let path = dir.join("empty.json");
    Snapshot::empty(SnapshotSource::Vramscope, DeviceInfo::default())
        .save(&path)
        .unwrap();
    let file = path.to_str().unwrap();
    for args in [
        vec!["report", file],
        vec!["report", file, "--format", "json"],
        vec!["report", file, "--format", "html"],
        vec!["summary", file],
        vec!["replay", file, "--verify"],
        vec!["replay", file],
        // Without a terminal the dashboard cannot open, but the file is said to be empty first.
        vec!["view", file],
    ] {
        let out = vramscope(&args);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", stderr(&out));
        assert!(
            stderr(&out).contains(&format!("{file}: {NOTHING}")),
            "{args:?}: {}",
            stderr(&out)
        );
        assert!(
            stdout(&out).is_empty(),
            "{args:?}: nothing on standard output"
        );
    }
    std::fs::remove_dir_all(dir).ok();
}
