//! End-to-end: each example workload runs, writes a snapshot, and the inspector finds exactly
//! its bug at the line marked `// BUG: <kind>` in the example's source, and nothing else of
//! warning or error severity. The clean example yields no warning or error at all.

use std::path::{Path, PathBuf};
use std::process::Command;

use vramscope::analysis::detect::{detect, DetectOptions, Severity};
use vramscope::Snapshot;

/// The directory cargo builds examples into, next to this test's own executable.
fn examples_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    exe.parent()
        .and_then(Path::parent)
        .expect("target profile directory")
        .join("examples")
}

/// The `file:line` and kind named by the `// BUG: kind` marker in an example's source.
fn marked_bug(example: &str) -> Option<(String, String)> {
    let file = format!("examples/{example}.rs");
    let source =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(&file)).unwrap();
    source.lines().enumerate().find_map(|(i, line)| {
        let (_, rest) = line.split_once("// BUG: ")?;
        let kind = rest.split_whitespace().next()?.to_string();
        Some((format!("{file}:{}", i + 1), kind))
    })
}

fn run_example(example: &str) -> Snapshot {
    let out = std::env::temp_dir().join(format!("vramscope-{example}-{}.json", std::process::id()));
    let binary = examples_dir().join(example);
    let output = Command::new(&binary)
        .arg(&out)
        .output()
        .unwrap_or_else(|e| panic!("{}: {e}", binary.display()));
    assert!(
        output.status.success(),
        "{example}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        stdout.contains(&out.display().to_string()),
        "{example} prints its snapshot path"
    );
    let snapshot = Snapshot::load(&out).unwrap();
    std::fs::remove_file(&out).ok();
    snapshot
}

fn check_buggy_example(example: &str) {
    let (site, kind) = marked_bug(example).expect("example has a BUG marker");
    let snapshot = run_example(example);
    let findings = detect(&snapshot, &DetectOptions::default());
    let serious: Vec<_> = findings
        .iter()
        .filter(|f| f.severity >= Severity::Warning)
        .collect();
    assert_eq!(
        serious.len(),
        1,
        "{example}: expected exactly one warning or error, got {serious:#?}"
    );
    assert_eq!(serious[0].kind.as_str(), kind, "{example}");
    assert_eq!(serious[0].site.as_deref(), Some(site.as_str()), "{example}");
}

#[test]
fn leaky_loss_list_is_retained_per_step_at_its_line() {
    check_buggy_example("leaky_loss_list");
}

#[test]
fn item_in_hot_loop_is_sync_in_loop_at_its_line() {
    check_buggy_example("item_in_hot_loop");
}

#[test]
fn empty_cache_in_loop_is_cache_churn_at_its_line() {
    check_buggy_example("empty_cache_in_loop");
}

#[test]
fn clean_training_has_no_warning_or_error() {
    let snapshot = run_example("clean_training");
    let findings = detect(&snapshot, &DetectOptions::default());
    let serious: Vec<_> = findings
        .iter()
        .filter(|f| f.severity >= Severity::Warning)
        .collect();
    assert!(serious.is_empty(), "{serious:#?}");
    assert!(snapshot.steps.len() >= 30);
}
