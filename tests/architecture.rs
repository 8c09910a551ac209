//! ARCHITECTURE.md stays short and true to the tree: every repository path it names in
//! backticks exists, every `vramscope-*` crate it names is a package of this workspace, and it
//! is at most 2,500 words. A file moved or a crate renamed without the map following fails here.

use std::collections::BTreeSet;
use std::path::Path;

const MAX_WORDS: usize = 2_500;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn architecture() -> String {
    std::fs::read_to_string(root().join("ARCHITECTURE.md")).expect("ARCHITECTURE.md is readable")
}

/// The text of `markdown` outside fenced code blocks.
fn prose(markdown: &str) -> String {
    let mut fenced = false;
    let mut out = String::new();
    for line in markdown.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if !fenced {
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

/// The spans in backticks that name a repository path: no whitespace, not absolute, not
/// outside the repository (`../`), not a Rust path or a URL, and either holding a `/` or
/// ending in `.rs`, `.md` or `.toml`. A `:LINE` suffix is dropped.
fn repo_paths(markdown: &str) -> BTreeSet<String> {
    let text = prose(markdown);
    text.split('`')
        .skip(1)
        .step_by(2)
        .filter(|span| !span.is_empty() && !span.contains(char::is_whitespace))
        .filter(|span| !span.starts_with('/') && !span.starts_with("../"))
        .filter(|span| !span.contains("::") && !span.contains("://"))
        .map(|span| match span.rsplit_once(':') {
            Some((path, line)) if line.chars().all(|c| c.is_ascii_digit()) => path,
            _ => span,
        })
        .filter(|span| {
            span.contains('/')
                || [".rs", ".md", ".toml"]
                    .iter()
                    .any(|ext| span.ends_with(ext))
        })
        .map(str::to_owned)
        .collect()
}

/// Every `vramscope-NAME` the text mentions, code blocks included.
fn crate_names(markdown: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut rest = markdown;
    while let Some(at) = rest.find("vramscope-") {
        let tail = &rest[at..];
        let len = tail
            .char_indices()
            .find(|&(_, c)| !(c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '_'))
            .map_or(tail.len(), |(i, _)| i);
        names.insert(tail[..len].trim_end_matches('-').to_owned());
        rest = &tail[len..];
    }
    names
}

/// The `name` of the `[package]` of the manifest at `path`.
fn package_name(manifest: &Path) -> String {
    let text =
        std::fs::read_to_string(manifest).unwrap_or_else(|e| panic!("{}: {e}", manifest.display()));
    let package = text
        .split("[package]")
        .nth(1)
        .unwrap_or_else(|| panic!("{} has no [package]", manifest.display()));
    package
        .lines()
        .find_map(|line| {
            let value = line.trim().strip_prefix("name")?.trim().strip_prefix('=')?;
            Some(value.trim().trim_matches('"').to_owned())
        })
        .unwrap_or_else(|| panic!("{} has no package name", manifest.display()))
}

/// The packages of the workspace: its members' and the root package's names.
fn workspace_packages() -> BTreeSet<String> {
    let manifest = std::fs::read_to_string(root().join("Cargo.toml")).unwrap();
    let members = manifest
        .split("members = [")
        .nth(1)
        .and_then(|m| m.split(']').next())
        .expect("the root Cargo.toml lists its members");
    let mut names: BTreeSet<String> = members
        .split('"')
        .skip(1)
        .step_by(2)
        .map(|member| package_name(&root().join(member).join("Cargo.toml")))
        .collect();
    names.insert(package_name(&root().join("Cargo.toml")));
    names
}

#[test]
fn the_extractors_find_what_they_should() {
    let sample = "See `model/src/lib.rs:12`, `Cargo.toml`, `analysis/src/detect/` and\n\
                  `vramscope_model::Snapshot`, `/metrics`, `cargo test -p x`, `file:line`,\n\
                  `../shared/traces`.\n\
                  ```\nvramscope-engine  `not/a/path/in/a/block`\n```\nvramscope-tui.";
    let paths: Vec<_> = repo_paths(sample).into_iter().collect();
    assert_eq!(
        paths,
        ["Cargo.toml", "analysis/src/detect/", "model/src/lib.rs"]
    );
    let names: Vec<_> = crate_names(sample).into_iter().collect();
    assert_eq!(names, ["vramscope-engine", "vramscope-tui"]);
    assert!(workspace_packages().contains("vramscope-model"));
    assert!(workspace_packages().contains("vramscope"));
}

#[test]
fn every_path_it_names_exists() {
    let doc = architecture();
    let paths = repo_paths(&doc);
    assert!(
        paths.len() >= 20,
        "ARCHITECTURE.md names only {} paths",
        paths.len()
    );
    let missing: Vec<_> = paths
        .iter()
        .filter(|path| !root().join(path.as_str()).exists())
        .collect();
    assert!(
        missing.is_empty(),
        "ARCHITECTURE.md names paths that do not exist: {missing:?}"
    );
}

#[test]
fn every_crate_it_names_is_a_package_of_the_workspace() {
    let packages = workspace_packages();
    let unknown: Vec<_> = crate_names(&architecture())
        .into_iter()
        .filter(|name| !packages.contains(name))
        .collect();
    assert!(
        unknown.is_empty(),
        "ARCHITECTURE.md names crates that are not workspace packages: {unknown:?} \
         (packages: {packages:?})"
    );
}

#[test]
fn it_is_short() {
    let words = architecture().split_whitespace().count();
    assert!(
        words <= MAX_WORDS,
        "ARCHITECTURE.md has {words} words; the limit is {MAX_WORDS}"
    );
}
