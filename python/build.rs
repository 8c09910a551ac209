//! Bundles the `vramscope` command line into the Python package, so that `pip install` alone
//! gives the `vramscope` command (the console script `vramscope._cli:main` runs it).
//!
//! maturin builds only this crate's library, so a release build (what `pip install` makes)
//! also builds the workspace's `vramscope` binary with a nested `cargo build --release` in the
//! workspace's own target folder, and copies it to `vramscope/_bin/vramscope`, which maturin
//! puts in the wheel. `VRAMSCOPE_CLI_BIN=PATH` copies that binary instead (CI passes the one
//! its tests built); `VRAMSCOPE_BUNDLE_CLI=0` skips the command (the package then says how
//! to get it), `=1` bundles it in a debug build too.

use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-env-changed=VRAMSCOPE_BUNDLE_CLI");
    println!("cargo:rerun-if-env-changed=VRAMSCOPE_CLI_BIN");
    let here = PathBuf::from(env::var("CARGO_MANIFEST_DIR").expect("set by cargo"));
    let root = here
        .parent()
        .expect("python/ lives in the workspace")
        .to_path_buf();
    let wanted = match env::var("VRAMSCOPE_BUNDLE_CLI").as_deref() {
        Ok("0") => false,
        Ok("1") => true,
        _ => env::var("PROFILE").as_deref() == Ok("release"),
    };
    if !wanted {
        return;
    }
    let binary = match env::var("VRAMSCOPE_CLI_BIN") {
        Ok(path) if !path.is_empty() => {
            println!("cargo:rerun-if-changed={path}");
            PathBuf::from(path)
        }
        _ => build_cli(&root),
    };
    let dest_dir = here.join("vramscope").join("_bin");
    let dest = dest_dir.join("vramscope");
    std::fs::create_dir_all(&dest_dir).expect("create vramscope/_bin");
    let _ = std::fs::remove_file(&dest);
    std::fs::copy(&binary, &dest).unwrap_or_else(|e| {
        panic!(
            "cannot copy the command line {} to {}: {e}",
            binary.display(),
            dest.display()
        )
    });
    // Debug information is most of a binary's size; the wheel does without it.
    let _ = Command::new("strip")
        .arg("--strip-debug")
        .arg(&dest)
        .status();
}

/// Builds the workspace's `vramscope` binary in release mode and returns its path.
fn build_cli(root: &Path) -> PathBuf {
    for watched in [
        "Cargo.lock",
        "Cargo.toml",
        "src",
        "allocator/src",
        "inspector/src",
        "kernels/src",
        "tui/src",
    ] {
        println!("cargo:rerun-if-changed={}", root.join(watched).display());
    }
    let cargo = env::var("CARGO").unwrap_or_else(|_| "cargo".to_string());
    let status = Command::new(cargo)
        .current_dir(root)
        .args(["build", "--release", "--locked", "--bin", "vramscope"])
        // The outer build's flags are for a Python extension, not for the command line.
        .env_remove("CARGO_ENCODED_RUSTFLAGS")
        .env_remove("RUSTFLAGS")
        .env_remove("CARGO_TARGET_DIR")
        .status()
        .expect("run cargo for the command line");
    assert!(
        status.success(),
        "building the vramscope command line failed (VRAMSCOPE_BUNDLE_CLI=0 skips it)"
    );
    root.join("target").join("release").join("vramscope")
}
