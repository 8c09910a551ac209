//! Answers that used to mislead (issue 32, item 8), end to end through the binary: `convert
//! -o -` and `report -o -` write to standard output rather than a file named `-`; a replay
//! whose start state alone exceeds the capacity says so and what fits; a sweep recommends a
//! setting only when it changes the outcome; `diff` states both runs' peaks and compares
//! what each held at its peak with `--at peak`; the HTML page opens on the verdict.
//!
//! Every trace is built here with `vramscope_testkit::Trace` (or the allocator itself).

use std::path::PathBuf;
use std::process::{Command, Output};

use vramscope_testkit::{Trace, MIB};

fn vramscope(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_vramscope"))
        .args(args)
        .env("NO_COLOR", "1")
        .output()
        .expect("vramscope runs")
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// A path in the temporary folder, unique to this test process.
fn temp(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("vramscope-plain-{}-{name}", std::process::id()))
}

/// Runs `vramscope` in `dir` (so that a file named `-` would land there).
fn vramscope_in(dir: &std::path::Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_vramscope"))
        .args(args)
        .current_dir(dir)
        .env("NO_COLOR", "1")
        .output()
        .expect("vramscope runs")
}

/// A small trace: 8 MiB kept and five steps of 4 MiB allocated and freed.
fn small_trace(path: &std::path::Path) {
    let mut t = Trace::new();
    let weights = t.site("model.py", 3, "Model.__init__");
    let step = t.site("train.py", 9, "train");
    t.alloc(weights, 8 * MIB);
    for _ in 0..5 {
        t.step();
        let a = t.alloc(step, 4 * MIB);
        t.free(a, 4 * MIB);
    }
    t.finish().save(path).unwrap();
}

/// `-` is standard output for every format of `convert` (and `report -o -`): the bytes on
/// standard output are the file's, and no file named `-` appears.
#[test]
fn dash_is_standard_output() {
    let dir = temp("dash");
    std::fs::create_dir_all(&dir).unwrap();
    let source = dir.join("trace.json");
    small_trace(&source);
    let src = source.to_str().unwrap();
    for target in ["pytorch", "perfetto", "json", "events", "html"] {
        let file = dir.join(format!("out.{target}"));
        let to_file = vramscope_in(
            &dir,
            &["convert", src, "--to", target, "-o", file.to_str().unwrap()],
        );
        assert!(to_file.status.success(), "{target}: {}", stderr(&to_file));
        let to_stdout = vramscope_in(&dir, &["convert", src, "--to", target, "-o", "-"]);
        assert!(
            to_stdout.status.success(),
            "{target}: {}",
            stderr(&to_stdout)
        );
        assert!(
            !dir.join("-").exists(),
            "{target}: convert -o - wrote a file named -"
        );
        let written = std::fs::read(&file).unwrap();
        assert!(!written.is_empty(), "{target}");
        assert_eq!(
            to_stdout.stdout, written,
            "{target}: standard output holds the file's bytes"
        );
        assert!(
            !stderr(&to_stdout).contains("wrote"),
            "{target}: {}",
            stderr(&to_stdout)
        );
    }
    let report = vramscope_in(&dir, &["report", src, "-o", "-"]);
    assert!(report.status.success(), "{}", stderr(&report));
    assert!(!dir.join("-").exists(), "report -o - wrote a file named -");
    assert_eq!(stdout(&report), stdout(&vramscope(&["report", src])));
    std::fs::remove_dir_all(dir).ok();
}
