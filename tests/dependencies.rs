//! The dependency direction ARCHITECTURE.md promises, checked with `cargo tree`: the inspector
//! crates (import, analysis, render, export) and the dashboard on top of them read snapshots
//! without linking the CUDA bindings or the backtrace machinery; the four inspector crates
//! keep one direction (import, then analysis, then render; export beside analysis on import); only the programs that drive a device (the CLI, the kernels, the C
//! ABI) enable the allocator's `cuda` and `backtrace` features.

use std::process::Command;

/// The normal dependencies of `package`, as `cargo tree --offline` prints them (the lock file
/// and the registry cache a build leaves are all it needs). A `cargo tree` that cannot run or
/// fails fails the test with its standard error: a check that cannot look must not pass.
fn tree(package: &str) -> String {
    let output = Command::new(env!("CARGO"))
        .args(["tree", "--offline", "-e", "normal", "-p", package])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .unwrap_or_else(|e| panic!("cargo tree -p {package} could not run: {e}"));
    assert!(
        output.status.success(),
        "cargo tree --offline -e normal -p {package} failed ({}):\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

#[test]
fn the_inspector_and_the_dashboard_link_no_cuda_and_no_backtrace() {
    for package in [
        "vramscope-import",
        "vramscope-analysis",
        "vramscope-render",
        "vramscope-export",
        "vramscope-tui",
    ] {
        let tree = tree(package);
        for forbidden in ["cudarc", "backtrace"] {
            assert!(
                !tree.contains(forbidden),
                "{package} depends on {forbidden}:\n{tree}"
            );
        }
    }
}

/// The dashboard reads files and analyses them; it never links a printer or a writer, so a
/// change to the HTML page or to the pickle writer does not rebuild it.
#[test]
fn the_dashboard_depends_on_import_and_analysis_only() {
    let tree = tree("vramscope-tui");
    for name in ["vramscope-import", "vramscope-analysis"] {
        assert!(tree.contains(name), "vramscope-tui lost {name}:\n{tree}");
    }
    for name in ["vramscope-render", "vramscope-export"] {
        assert!(
            !tree.contains(name),
            "vramscope-tui depends on {name}:\n{tree}"
        );
    }
}

#[test]
fn the_cli_keeps_the_cuda_backend() {
    let tree = tree("vramscope");
    assert!(
        tree.contains("cudarc"),
        "the CLI lost its CUDA backend:\n{tree}"
    );
}

/// The layers of ARCHITECTURE.md's code map: the data model stands on serde alone; the engine
/// and the telemetry wire format on the model alone, never on the allocator; the caching
/// policy on the model alone, with no driver, no network and no telemetry; the replay drives
/// the caching policy, never the link-in allocator; and the inspector, which reaches the
/// policy only through the replay, links neither the allocator nor its CUDA bindings: the
/// importers below the analysis, the printers above it, the writers beside it on the importers.
#[test]
fn the_crates_keep_their_layers() {
    let layers: [(&str, &[&str], &[&str]); 9] = [
        (
            "vramscope-model",
            &["serde"],
            &[
                "vramscope-allocator",
                "vramscope-caching",
                "vramscope-engine",
                "vramscope-telemetry",
            ],
        ),
        (
            "vramscope-engine",
            &["vramscope-model"],
            &[
                "vramscope-allocator",
                "vramscope-caching",
                "vramscope-telemetry",
                "vramscope-import",
                "vramscope-analysis",
                "vramscope-render",
                "vramscope-export",
            ],
        ),
        (
            "vramscope-telemetry",
            &["vramscope-model"],
            &[
                "vramscope-allocator",
                "vramscope-caching",
                "vramscope-engine",
                "vramscope-import",
                "vramscope-analysis",
                "vramscope-render",
                "vramscope-export",
            ],
        ),
        (
            "vramscope-caching",
            &["vramscope-model"],
            &[
                "vramscope-allocator",
                "vramscope-telemetry",
                "vramscope-engine",
                "cudarc",
                "prometheus-client",
            ],
        ),
        (
            "vramscope-replay",
            &["vramscope-caching", "vramscope-engine"],
            &[
                "vramscope-allocator",
                "vramscope-import",
                "vramscope-analysis",
                "cudarc",
            ],
        ),
        (
            "vramscope-import",
            &["vramscope-replay", "vramscope-pickle", "vramscope-engine"],
            &[
                "vramscope-analysis",
                "vramscope-render",
                "vramscope-export",
                "vramscope-allocator",
                "vramscope-telemetry",
                "cudarc",
                "prometheus-client",
            ],
        ),
        (
            "vramscope-analysis",
            &["vramscope-import", "vramscope-engine"],
            &[
                "vramscope-render",
                "vramscope-export",
                "vramscope-allocator",
                "vramscope-telemetry",
                "cudarc",
            ],
        ),
        (
            "vramscope-render",
            &["vramscope-analysis"],
            &[
                "vramscope-export",
                "vramscope-allocator",
                "vramscope-telemetry",
                "cudarc",
            ],
        ),
        (
            "vramscope-export",
            &["vramscope-import", "vramscope-pickle"],
            &[
                "vramscope-analysis",
                "vramscope-render",
                "vramscope-allocator",
                "vramscope-telemetry",
                "cudarc",
            ],
        ),
    ];
    for (package, required, forbidden) in layers {
        let tree = tree(package);
        for name in required {
            assert!(tree.contains(name), "{package} lost {name}:\n{tree}");
        }
        for name in forbidden {
            assert!(!tree.contains(name), "{package} depends on {name}:\n{tree}");
        }
    }
}

/// The pickle codec depends on no crate of ours (nor they on it but the importer and the
/// exporter), so it
/// builds and is fuzzed alone.
#[test]
fn the_pickle_codec_stands_alone() {
    let tree = tree("vramscope-pickle");
    let ours: Vec<&str> = tree
        .lines()
        .skip(1)
        .filter(|line| line.contains("vramscope"))
        .collect();
    assert!(ours.is_empty(), "vramscope-pickle depends on {ours:?}");
}
