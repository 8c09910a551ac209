//! PyTorch's caching-allocator constants (512 B, 1 MiB, 2 MiB, 10 MiB, 20 MiB) and its rounding
//! have one home, `vramscope_model::pytorch` (model/src/pytorch.rs); the allocator re-exports
//! them and every other crate uses them. This test greps the library source of the workspace's
//! crates (every `.rs` file under their `src/`, test modules left out) for private copies and
//! fails naming the file and line of each.

use std::fs;
use std::path::{Path, PathBuf};

/// The one file allowed to define them.
const HOME: &str = "model/src/pytorch.rs";

/// What a private copy of a constant or of the rounding looks like, each with what it copies.
const STRAY: &[(&str, &str)] = &[
    ("= 512;", "kMinBlockSize (MIN_BLOCK_SIZE)"),
    ("20 << 20", "kLargeBuffer (LARGE_BUFFER)"),
    ("fn round_size", "round_size"),
    ("fn round_block", "round_size"),
];

/// A constant of this value is a copy when it is a `u64` (`const NAME: u64 = 1 << 20`).
const STRAY_CONSTANTS: &[(&str, &str)] = &[
    ("1 << 20", "kSmallSize (SMALL_SIZE)"),
    (
        "2 << 20",
        "kSmallBuffer / kRoundLarge (SMALL_BUFFER, ROUND_LARGE)",
    ),
    ("10 << 20", "kMinLargeAlloc (MIN_LARGE_ALLOC)"),
];

/// Constants of those values that are not PyTorch's policy: (file, constant, why).
const NOT_POLICY: &[(&str, &str, &str)] = &[
    (
        "caching/src/sim.rs",
        "SIM_ALIGNMENT",
        "the simulated device's address alignment, as cudaMalloc aligns",
    ),
    (
        "caching/src/sim.rs",
        "SIM_GRANULARITY",
        "the simulated device's mapping granularity, as the driver reports it",
    ),
    (
        "caching/src/debug.rs",
        "CHUNK",
        "how much the debug checks fill or compare at a time",
    ),
    (
        "pickle/src/machine/stream.rs",
        "PIECE",
        "how much of a file the pickle reader takes at a time",
    ),
    ("testkit/src/trace.rs", "MIB", "the unit"),
    ("testkit/src/fixture.rs", "MIB", "the unit"),
];

/// The workspace's crates: the root package and the members of its `[workspace]`.
fn crate_dirs(root: &Path) -> Vec<PathBuf> {
    let manifest = fs::read_to_string(root.join("Cargo.toml")).expect("the root manifest");
    let members = manifest
        .lines()
        .find_map(|l| l.trim().strip_prefix("members = ["))
        .expect("the workspace's members, on one line");
    let mut dirs = vec![root.to_path_buf()];
    dirs.extend(
        members
            .trim_end_matches(']')
            .split(',')
            .map(|m| m.trim().trim_matches('"'))
            .filter(|m| !m.is_empty())
            .map(|m| root.join(m)),
    );
    dirs
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs")
            // A module of tests in a file of its own (`#[cfg(test)] mod tests;`).
            && path.file_name().is_some_and(|n| n != "tests.rs")
        {
            out.push(path);
        }
    }
}

/// The lines of `text` outside its test modules, with their numbers (from 1). A top-level
/// `#[cfg(test)] mod name { .. }` runs, as rustfmt writes it, to the next line that is `}`
/// alone; a `#[cfg(test)]` on anything else covers its next line.
fn library_lines(text: &str) -> Vec<(usize, &str)> {
    let mut lines = text.lines().enumerate().map(|(i, l)| (i + 1, l));
    let mut kept = Vec::new();
    while let Some((n, line)) = lines.next() {
        if line.trim() != "#[cfg(test)]" {
            kept.push((n, line));
            continue;
        }
        let Some((_, item)) = lines.next() else {
            break;
        };
        let opens_module = item.starts_with("mod ") || item.starts_with("pub(crate) mod ");
        if opens_module && item.trim_end().ends_with('{') {
            for (_, line) in lines.by_ref() {
                if line == "}" {
                    break;
                }
            }
        }
    }
    kept
}

/// Whether `pattern` occurs in `code` with no digit, letter or `_` right before it (so that
/// `20 << 20` is not found in `120 << 20`).
fn has(code: &str, pattern: &str) -> bool {
    let word = |c: char| c.is_alphanumeric() || c == '_';
    code.match_indices(pattern).any(|(at, _)| {
        !pattern.starts_with(word) || !code[..at].chars().next_back().is_some_and(word)
    })
}

/// The name of the constant a line defines, if it does.
fn constant_name(line: &str) -> Option<&str> {
    let after = line.split("const ").nth(1)?;
    Some(after.split(':').next()?.trim())
}

#[test]
fn pytorch_policy_constants_have_one_home() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    for dir in crate_dirs(root) {
        rust_files(&dir.join("src"), &mut files);
    }
    assert!(
        files.iter().any(|f| f.ends_with(HOME)),
        "{HOME} is missing: the constants' home moved without this test"
    );
    let mut strays = Vec::new();
    for file in &files {
        let relative = file.strip_prefix(root).unwrap_or(file);
        let name = relative.to_string_lossy().replace('\\', "/");
        if name == HOME {
            continue;
        }
        let text = fs::read_to_string(file).unwrap_or_else(|e| panic!("{name}: {e}"));
        for (n, line) in library_lines(&text) {
            let code = line.split("//").next().unwrap_or("");
            let constant = constant_name(code);
            let allowed = constant.is_some_and(|c| {
                NOT_POLICY
                    .iter()
                    .any(|&(file, name_, _)| file == name && name_ == c)
            });
            if allowed {
                continue;
            }
            for &(pattern, copies) in STRAY {
                if has(code, pattern) {
                    strays.push(format!("{name}:{n}: {} (copies {copies})", line.trim()));
                }
            }
            if constant.is_some() {
                for &(value, copies) in STRAY_CONSTANTS {
                    if has(code, &format!(": u64 = {value};")) {
                        strays.push(format!("{name}:{n}: {} (copies {copies})", line.trim()));
                    }
                }
            }
        }
    }
    assert!(
        strays.is_empty(),
        "PyTorch's policy constants and rounding are defined outside {HOME}; use \
         vramscope_model::pytorch's instead (or, for a constant that only shares the value, \
         add it to NOT_POLICY with why):\n{}",
        strays.join("\n")
    );
}

#[test]
fn patterns_match_whole_numbers() {
    assert!(has("const L: u64 = 20 << 20;", "20 << 20"));
    assert!(!has("const L: u64 = 120 << 20;", "20 << 20"));
    assert!(has("const L: u64 = 1 << 20;", ": u64 = 1 << 20;"));
    assert!(has("let x = 512;", "= 512;"));
}

#[test]
fn test_modules_are_left_out() {
    let text = "const A: u64 = 512;\n#[cfg(test)]\nmod tests {\n    const B: u64 = 512;\n}\nconst C: u64 = 1;\n#[cfg(test)]\nstatic D: u64 = 512;\n";
    let kept: Vec<usize> = library_lines(text).iter().map(|&(n, _)| n).collect();
    assert_eq!(kept, [1, 6]);
}
