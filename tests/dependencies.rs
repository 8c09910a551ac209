//! The dependency direction ARCHITECTURE.md promises, checked with `cargo tree`: the inspector
//! (and the dashboard on top of it) reads snapshots without linking the CUDA bindings or the
//! backtrace machinery; only the programs that drive a device (the CLI, the kernels, the C
//! ABI) enable the allocator's `cuda` and `backtrace` features.

use std::process::Command;

/// The normal dependencies of `package`, as `cargo tree` prints them.
fn tree(package: &str) -> Option<String> {
    let output = Command::new(env!("CARGO"))
        .args(["tree", "--offline", "-e", "normal", "-p", package])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .ok()?;
    if !output.status.success() {
        vramscope::allocator::testing::skip_notice(&format!(
            "cargo tree -p {package} failed: {}",
            String::from_utf8_lossy(&output.stderr)
        ));
        return None;
    }
    Some(String::from_utf8_lossy(&output.stdout).into_owned())
}

#[test]
fn the_inspector_and_the_dashboard_link_no_cuda_and_no_backtrace() {
    for package in ["vramscope-inspector", "vramscope-tui"] {
        let Some(tree) = tree(package) else {
            return;
        };
        for forbidden in ["cudarc", "backtrace"] {
            assert!(
                !tree.contains(forbidden),
                "{package} depends on {forbidden}:\n{tree}"
            );
        }
    }
}

#[test]
fn the_cli_keeps_the_cuda_backend() {
    let Some(tree) = tree("vramscope") else {
        return;
    };
    assert!(
        tree.contains("cudarc"),
        "the CLI lost its CUDA backend:\n{tree}"
    );
}
