//! The C ABI's snapshot at a host's exit: a host program (`examples/exit_snapshot.rs`) loads
//! the built shared library with `VRAMSCOPE_SNAPSHOT_ON_EXIT` set in its own environment,
//! allocates, and exits; the snapshot file must be written. A binary of its own, so that the
//! child's environment is built while no other test of this process sets variables.

mod common;

use common::{library_path, target_dir};
use std::path::Path;
use std::process::Command;

fn vramscope_allocator_snapshot(path: &Path) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

#[test]
fn writes_a_snapshot_when_the_host_process_exits() {
    let path = std::env::temp_dir().join(format!("vramscope-ffi-exit-{}.json", std::process::id()));
    std::fs::remove_file(&path).ok();
    let host = target_dir().join("examples").join("exit_snapshot");
    let output = Command::new(&host)
        .arg(library_path())
        .env("VRAMSCOPE_BACKEND", "sim")
        .env("VRAMSCOPE_SNAPSHOT_ON_EXIT", &path)
        .output()
        .unwrap_or_else(|e| panic!("{}: {e}", host.display()));
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let snap = vramscope_allocator_snapshot(&path);
    assert_eq!(snap["stats"]["allocation"]["all"]["current"], 1);
    std::fs::remove_file(path).ok();
}
