//! What the `vramscope` binary prints is safe to print (issue 33, items 9 and 11, and the
//! `ranks` and format-sniffing items): a snapshot whose call sites, device name and block
//! states carry terminal escape sequences (OSC 52 to the clipboard, a tmux rename, a reset),
//! a bidi override and a line separator, and a folder of rank files whose names do, are run
//! through every command that prints; no raw control or bidi character reaches standard
//! output or standard error, in any format. A failed write is exit 2 with the system's words,
//! a closed pipe a quiet exit 0. A file of one bad rank is a row with its error, and a file
//! of zeros is refused by its first bytes. The CI formats (`report --format sarif` and
//! `--format github`) keep such a name inside the one annotation it belongs to.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use vramscope::allocator::{CachingAllocator, SimDevice};
use vramscope::model::AllocatorConfig;
use vramscope::Snapshot;

/// Escape sequences and characters that act on a terminal or reorder what it shows: OSC 52
/// (write the clipboard), a tmux window rename (`ESC k … ESC \`), a terminal reset (`ESC c`),
/// a C1 CSI, a right-to-left override, a line separator, DEL.
const HOSTILE: &str = "evil\u{1b}]52;c;aGk=\u{7}\u{1b}kpwned\u{1b}\\\u{1b}c\u{9b}2J\u{202e}yp.\u{2028}x\u{7f}\u{2066}";

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "vramscope-hostile-output-{name}-{}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn vramscope(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_vramscope"))
        .args(args)
        .env("NO_COLOR", "1")
        .output()
        .expect("vramscope runs")
}

/// The raw characters that must never be printed: every C0 control but newline and tab,
/// DEL, the C1 controls, the bidi controls and the line and paragraph separators.
fn raw_hostile(text: &str) -> Option<char> {
    text.chars().find(|&c| {
        (c.is_control() && c != '\n' && c != '\t')
            || matches!(
                c,
                '\u{202a}'..='\u{202e}'
                    | '\u{2066}'..='\u{2069}'
                    | '\u{200e}'
                    | '\u{200f}'
                    | '\u{061c}'
                    | '\u{2028}'
                    | '\u{2029}'
            )
    })
}

/// Asserts that neither stream of `output` holds a raw hostile character (checked on the
/// bytes too: an ESC is never printed, valid UTF-8 or not).
fn assert_safe(what: &str, output: &Output) {
    for (stream, bytes) in [("stdout", &output.stdout), ("stderr", &output.stderr)] {
        let text = String::from_utf8_lossy(bytes);
        assert!(
            !bytes.contains(&0x1b) && !bytes.contains(&0x07),
            "{what} printed a raw escape on {stream}: {text:?}"
        );
        if let Some(c) = raw_hostile(&text) {
            panic!(
                "{what} printed a raw U+{:04X} on {stream}: {text:?}",
                c as u32
            );
        }
    }
}

/// A leaking trace whose call sites, functions and device name are `name`; `heavy` keeps
/// more, for a rank that stands out.
fn snapshot_named(name: &str, heavy: bool) -> Snapshot {
    let alloc = CachingAllocator::new(SimDevice::phantom(1 << 34), AllocatorConfig::default());
    let mut kept = Vec::new();
    for _ in 0..6 {
        alloc.mark_step();
        kept.push(alloc.alloc(8 << 20).unwrap());
        if heavy {
            kept.push(alloc.alloc(8 << 20).unwrap());
        }
        drop(alloc.alloc(2 << 20).unwrap());
    }
    let mut snapshot = alloc.snapshot();
    for site in &mut snapshot.sites {
        site.file = format!("{name}.py");
        site.function = format!("f{name}");
        site.frames.clear();
    }
    snapshot.device.name = name.to_string();
    snapshot
}

fn save(snapshot: &Snapshot, path: &Path) -> String {
    snapshot.save(path).unwrap();
    path.to_str().unwrap().to_string()
}

/// `snapshot` as vramscope's JSON with its first `active_allocated` block state replaced
/// by a hostile word: serde's "unknown variant" error quotes it.
fn with_hostile_block_state(snapshot: &Snapshot) -> String {
    let json = serde_json::to_string(snapshot).unwrap();
    assert!(json.contains("\"active_allocated\""), "a live block");
    let word = serde_json::to_string(&format!("active{HOSTILE}")).unwrap();
    json.replacen("\"active_allocated\"", &word, 1)
}

#[test]
fn text_from_a_file_reaches_no_terminal_raw_in_any_command() {
    let dir = scratch("commands");
    let hostile = snapshot_named(HOSTILE, false);
    let file = save(&hostile, &dir.join("run.json"));
    let before = save(&snapshot_named("before", false), &dir.join("before.json"));
    let mut runs: Vec<(String, Output)> = Vec::new();
    let mut run = |args: &[&str]| runs.push((args.join(" "), vramscope(args)));
    for format in ["text", "markdown", "json", "html"] {
        run(&["report", &file, "--format", format]);
    }
    run(&["summary", &file]);
    run(&["diff", &before, &file]);
    run(&["diff", &before, &file, "--format", "json"]);
    // A capacity the kept blocks outgrow: the first OOM's site is printed.
    run(&["replay", &file, "--capacity", "30MiB"]);
    run(&["replay", &file, "--capacity", "30MiB", "--format", "json"]);
    for (what, output) in &runs {
        assert_safe(what, output);
        let out = String::from_utf8_lossy(&output.stdout);
        assert!(out.contains("evil"), "{what} names the site: {out}");
    }
    let text = String::from_utf8_lossy(&runs[0].1.stdout).into_owned();
    assert!(
        text.contains("evil\\u{1b}]52;c;aGk="),
        "shown escaped: {text}"
    );
    let replay = String::from_utf8_lossy(&runs[7].1.stdout).into_owned();
    assert!(
        replay.contains("out of memory") || replay.contains("OOM"),
        "{replay}"
    );
    // JSON stays JSON and reads back to the file's own text.
    let json: serde_json::Value = serde_json::from_slice(&runs[2].1.stdout).unwrap();
    assert!(json.to_string().contains("evil\\u001b]52"), "{json}");
    assert!(
        serde_json::to_string(&json)
            .unwrap()
            .contains(&serde_json::to_string(HOSTILE).unwrap()[1..20]),
        "the site's name survives in the JSON"
    );

    // Parse errors that quote the file: serde's unknown variant in vramscope's JSON, the
    // PyTorch importer's unknown block state in a pickle.
    let bad_json = dir.join("bad-state.json");
    std::fs::write(&bad_json, with_hostile_block_state(&hostile)).unwrap();
    let output = vramscope(&["report", bad_json.to_str().unwrap()]);
    assert_eq!(output.status.code(), Some(2));
    assert_safe("report of an unknown variant", &output);
    let err = String::from_utf8_lossy(&output.stderr);
    assert!(err.contains("unknown variant"), "{err}");
    assert!(err.contains("\\u{1b}]52"), "{err}");

    let mut pickle = vramscope::export::to_pytorch_pickle(&hostile).unwrap();
    let state = b"active_allocated";
    // The same length, so that the pickle's string lengths still hold.
    let evil = "\u{1b}]0;x\u{7}\u{202e}\u{1b}c!!!!!";
    assert_eq!(evil.len(), state.len());
    let at = pickle
        .windows(state.len())
        .position(|w| w == state)
        .expect("a block state in the pickle");
    pickle[at..at + state.len()].copy_from_slice(evil.as_bytes());
    let bad_pickle = dir.join("bad-state.pickle");
    std::fs::write(&bad_pickle, pickle).unwrap();
    let output = vramscope(&["summary", bad_pickle.to_str().unwrap()]);
    assert_eq!(output.status.code(), Some(2));
    assert_safe("summary of an unknown block state", &output);
    let err = String::from_utf8_lossy(&output.stderr);
    assert!(err.contains("unknown block state"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The CI formats (issue 34): a call site whose name holds escape sequences and GitHub
/// workflow commands of its own (`::add-mask::`, `::stop-commands::` after a newline), a
/// comma and a colon that would end the `file` property early, and an escape (`%0A`) that
/// the runner would turn into a newline. `--format github` prints one line per finding, each
/// a command of vramscope's own whose properties are the three it sets, and the name reads
/// back as written; `--format sarif` stays JSON whose URIs are percent-encoded. Neither
/// prints a raw control or bidi character.
#[test]
fn ci_formats_keep_the_files_text_inside_its_own_annotation() {
    let dir = scratch("ci");
    let name =
        format!("{HOSTILE}\n::add-mask::x\r\n::stop-commands::t,line=1,title=pwned:%0A::error::y");
    let file = save(&snapshot_named(&name, false), &dir.join("run.json"));
    let json = vramscope(&["report", &file, "--format", "json"]);
    let report: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    let findings = report["devices"][0]["findings"].as_array().unwrap().len();
    assert!(findings > 0, "{report}");

    let github = vramscope(&["report", &file, "--format", "github"]);
    assert_safe("report --format github", &github);
    assert_eq!(github.status.code(), Some(0));
    let text = String::from_utf8_lossy(&github.stdout);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), findings, "one line per finding: {text}");
    let mut located = 0;
    for line in &lines {
        let command = ["::error ", "::warning ", "::notice "]
            .iter()
            .find(|c| line.starts_with(*c))
            .unwrap_or_else(|| panic!("not one of vramscope's commands: {line}"));
        // The runner ends the properties at the first `::`.
        let head = &line[command.len()..line[2..].find("::").unwrap() + 2];
        let keys: Vec<&str> = head
            .split(',')
            .map(|p| p.split_once('=').unwrap().0)
            .collect();
        assert!(
            keys == ["file", "line", "title"] || keys == ["title"],
            "{keys:?} in {line}"
        );
        if keys[0] == "file" {
            located += 1;
            assert!(
                head.contains("pwned%3A%250A%3A%3Aerror%3A%3Ay.py,line="),
                "{head}"
            );
            assert!(head.contains("%2Cline=1%2Ctitle=pwned"), "{head}");
            assert!(head.contains("evil\\u{1b}]52;c;aGk="), "{head}");
        }
    }
    assert!(located > 0, "the leak is on its line: {text}");
    // Inside the message, the file's `%0A` stays text: `%250A`, never a line of its own.
    assert!(text.contains("pwned:%250A::error::y.py:"), "{text}");

    let sarif = vramscope(&["report", &file, "--format", "sarif"]);
    assert_safe("report --format sarif", &sarif);
    assert_eq!(sarif.status.code(), Some(0));
    let log: serde_json::Value = serde_json::from_slice(&sarif.stdout).unwrap();
    let results = log["runs"][0]["results"].as_array().unwrap();
    assert_eq!(results.len(), findings);
    let uris: Vec<&str> = results
        .iter()
        .filter_map(|r| r["locations"][0]["physicalLocation"]["artifactLocation"]["uri"].as_str())
        .collect();
    assert!(!uris.is_empty(), "{log}");
    for uri in uris {
        assert!(
            uri.chars()
                .all(|c| c.is_ascii_alphanumeric() || "-._~/%".contains(c)),
            "{uri}"
        );
        assert!(uri.starts_with("evil%1B%5D52%3Bc%3BaGk%3D%07"), "{uri}");
    }
    // The file's own text survives in the message, as JSON's escapes.
    assert!(log.to_string().contains("evil\\u001b]52;c;aGk="), "{log}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn ranks_escapes_names_goes_on_past_a_bad_file_and_exits_1() {
    let dir = scratch("ranks");
    save(&snapshot_named(HOSTILE, false), &dir.join("rank0.json"));
    save(&snapshot_named(HOSTILE, true), &dir.join("rank1.json"));
    save(&snapshot_named(HOSTILE, false), &dir.join("rank2.json"));
    // A file that is no snapshot, and one whose error quotes hostile text.
    std::fs::write(dir.join("rank3.json"), [0u8; 4096]).unwrap();
    std::fs::write(
        dir.join("rank4.json"),
        with_hostile_block_state(&snapshot_named("x", false)),
    )
    .unwrap();
    // A file the folder leaves out, whose name is an escape sequence.
    std::fs::write(dir.join(format!("notes{HOSTILE}.txt")), b"hi").unwrap();
    let folder = dir.to_str().unwrap();
    for format in ["text", "markdown", "json", "html"] {
        let output = vramscope(&["ranks", folder, "--format", format]);
        assert_safe(&format!("ranks --format {format}"), &output);
        assert_eq!(
            output.status.code(),
            Some(1),
            "a rank failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        let out = String::from_utf8_lossy(&output.stdout);
        let err = String::from_utf8_lossy(&output.stderr);
        assert!(err.contains("left out") && err.contains("notes"), "{err}");
        assert!(err.contains("rank 3"), "the failed rank is said: {err}");
        if format == "json" {
            let json: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
            assert_eq!(json["ranks"].as_array().unwrap().len(), 3, "{json}");
            let failed = json["failed"].as_array().unwrap();
            let ranks: Vec<u64> = failed.iter().map(|f| f["rank"].as_u64().unwrap()).collect();
            assert_eq!(ranks, [3, 4]);
            assert!(
                failed[0]["error"]
                    .as_str()
                    .unwrap()
                    .contains("not a format vramscope reads"),
                "{json}"
            );
            assert!(
                failed[1]["error"]
                    .as_str()
                    .unwrap()
                    .contains("unknown variant"),
                "{json}"
            );
            assert_eq!(json["findings"][0]["rank"], 1, "the heavy rank: {json}");
        } else {
            assert!(out.contains("could not be read"), "{format}: {out}");
            assert!(out.contains("evil"), "{format}: {out}");
        }
        if format == "text" {
            assert!(
                out.starts_with(
                    "vramscope ranks: 5 ranks (2 could not be read); 1 rank stands out"
                ),
                "{out}"
            );
        }
    }
    // No file can be read: nothing to compare, exit 2.
    let only_bad = vramscope(&["ranks", dir.join("rank3.json").to_str().unwrap()]);
    assert_eq!(only_bad.status.code(), Some(2));
    assert_safe("ranks of one bad file", &only_bad);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Standard output on `/dev/full`: every printing command exits 2 with the system's words.
#[test]
fn a_failed_write_is_exit_2_with_the_systems_words() {
    if !Path::new("/dev/full").exists() {
        vramscope_testkit::skip_notice("/dev/full does not exist here");
        return;
    }
    let dir = scratch("full");
    let file = save(&snapshot_named("train", false), &dir.join("rank0.json"));
    save(&snapshot_named("train", true), &dir.join("rank1.json"));
    let folder = dir.to_str().unwrap().to_string();
    let commands: Vec<Vec<&str>> = vec![
        vec!["report", &file],
        vec!["report", &file, "--format", "json"],
        vec!["report", &file, "--format", "markdown"],
        vec!["summary", &file],
        vec!["diff", &file, &file],
        vec!["diff", &file, &file, "--format", "json"],
        vec!["replay", &file],
        vec!["replay", &file, "--format", "json"],
        vec!["ranks", &folder],
        vec!["ranks", &folder, "--format", "json"],
    ];
    for args in &commands {
        let full = std::fs::OpenOptions::new()
            .write(true)
            .open("/dev/full")
            .unwrap();
        let output = Command::new(env!("CARGO_BIN_EXE_vramscope"))
            .args(args)
            .stdout(full)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains("No space left on device"), "{args:?}: {err}");
    }
    // A JSON snapshot written to a full device says so, not that the snapshot is invalid.
    let output = vramscope(&["convert", &file, "--to", "json", "-o", "/dev/full"]);
    let err = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{err}");
    assert!(err.contains("No space left on device"), "{err}");
    assert!(!err.contains("not a valid"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A reader that stops early (`| head`) ends the command quietly, with status 0.
#[test]
fn a_closed_pipe_is_a_quiet_exit_0() {
    let dir = scratch("pipe");
    let file = save(&snapshot_named("train", false), &dir.join("run.json"));
    for args in [
        vec!["report", file.as_str()],
        vec!["report", file.as_str(), "--format", "json"],
        vec!["summary", file.as_str()],
        vec!["diff", file.as_str(), file.as_str()],
        vec!["replay", file.as_str()],
    ] {
        let mut child = Command::new(env!("CARGO_BIN_EXE_vramscope"))
            .args(&args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // Closed before the command has loaded its file, so its write finds no reader.
        drop(child.stdout.take());
        let output = child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(0), "{args:?}: {err}");
        assert!(err.is_empty(), "{args:?} said: {err}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A big file whose first bytes are no known format is refused by them, naming what was
/// expected (a sparse file: its gigabytes of zeros take no disk).
#[test]
fn a_file_of_zeros_is_refused_by_its_first_bytes() {
    let dir = scratch("zeros");
    let path = dir.join("zeros.pickle");
    let file = std::fs::File::create(&path).unwrap();
    file.set_len(3 << 30).unwrap();
    drop(file);
    let output = vramscope(&["report", path.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{err}");
    assert!(
        err.contains(
            "not a format vramscope reads (a PyTorch snapshot pickle, a Chrome trace, or a \
             vramscope JSON snapshot): it starts with zero bytes"
        ),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// On a terminal the text report keeps its own colours, and only those: the file's escape
/// sequences are still shown escaped (run under `script`, which gives it a terminal).
#[test]
fn on_a_terminal_only_the_reports_own_colours_pass() {
    let has_script = Command::new("script")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !has_script {
        vramscope_testkit::skip_notice("script (util-linux) is not installed");
        return;
    }
    let dir = scratch("tty");
    let file = save(&snapshot_named(HOSTILE, false), &dir.join("run.json"));
    let command = format!("'{}' report '{file}'", env!("CARGO_BIN_EXE_vramscope"));
    let output = Command::new("script")
        .args(["-qec", &command, "/dev/null"])
        .env_remove("NO_COLOR")
        .env("TERM", "xterm")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(
        text.contains("\u{1b}[1m"),
        "the report is painted: {text:?}"
    );
    assert!(text.contains("evil\\u{1b}]52;c;aGk="), "{text:?}");
    // Every ESC that reaches the terminal opens a colour: `ESC [` digits and `;` then `m`.
    for (at, _) in text.match_indices('\u{1b}') {
        let rest = &text[at + 1..];
        let params = rest[1..]
            .find(|c: char| !(c.is_ascii_digit() || c == ';'))
            .unwrap_or(0);
        assert!(
            rest.starts_with('[') && rest[1 + params..].starts_with('m'),
            "an escape sequence that is no colour: {:?}",
            &text[at..(at + 12).min(text.len())]
        );
    }
    assert!(
        raw_hostile(&text.replace(['\u{1b}', '\r'], "")).is_none(),
        "{text:?}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Text from a file that a CI runner would obey, after a line break of the file's own: GitHub
/// Actions' workflow commands (`::add-mask::`, `::stop-commands::`, `::error` after spaces),
/// its older `##[command]` anywhere in a line, a carriage return, a tab and the controls of
/// [`HOSTILE`]. `BEFORE` and `AFTER` stand on either side of the first line break.
const COMMANDS: &str = "BEFORE\n::add-mask::AFTER\r\n  ::stop-commands::t\r##[set-output name=x;]y\t##[add-mask]z\u{85}::error::w";

/// Asserts that `output` is safe to print in a CI log: [`assert_safe`], no line that starts
/// (after spaces and tabs) with `::` but vramscope's own annotations in `--format github`
/// (`own_commands`), no `##[` anywhere, and no line break of the file's: every line holding
/// `AFTER` holds `BEFORE` too.
fn assert_inert(what: &str, output: &Output, own_commands: bool) {
    assert_safe(what, output);
    for (stream, bytes) in [("stdout", &output.stdout), ("stderr", &output.stderr)] {
        let text = String::from_utf8_lossy(bytes);
        assert!(!text.contains("##["), "{what}: ##[ on {stream}: {text}");
        for line in text.lines() {
            let body = line.trim_start_matches([' ', '\t']);
            let own = own_commands
                && stream == "stdout"
                && ["::error ", "::warning ", "::notice "]
                    .iter()
                    .any(|c| line.starts_with(c));
            assert!(
                !body.starts_with("::") || own,
                "{what}: a workflow command on {stream}: {line:?}"
            );
            assert!(
                !line.contains("AFTER") || line.contains("BEFORE"),
                "{what}: the file's line break reached {stream}: {line:?}"
            );
        }
    }
}

/// Issue 44, items 3 and 4: no text from a file reaches any output or error with a raw line
/// break, carriage return or other control, or as a workflow command, whatever the command,
/// the format or the door: call sites, functions and the device name through every report
/// format, `summary`, `diff`, `replay` (the first OOM's site, `--verify`, `--policy compact`,
/// `--sweep`), `convert`, `ranks` over a folder whose file names carry the commands, and the
/// errors that quote a file (an unknown block state in JSON and in a pickle, an unknown
/// snapshot source, a file of no format, a file that does not exist).
#[test]
fn workflow_commands_and_line_breaks_from_a_file_reach_no_output() {
    let dir = scratch("commands-ci");
    let name = format!("{COMMANDS}{HOSTILE}");
    let hostile = snapshot_named(&name, false);
    let file = save(&hostile, &dir.join("run.json"));
    let before = save(&snapshot_named("before", false), &dir.join("before.json"));
    let mut runs: Vec<(String, Output, bool)> = Vec::new();
    let mut run = |args: &[&str]| {
        let github = args.contains(&"github");
        runs.push((args.join(" "), vramscope(args), github));
    };
    for format in ["text", "markdown", "json", "html", "sarif", "github"] {
        run(&["report", &file, "--format", format]);
    }
    run(&["summary", &file]);
    for format in ["text", "json"] {
        run(&["diff", &before, &file, "--format", format]);
        run(&["diff", &file, &before, "--format", format]);
        run(&["replay", &file, "--capacity", "30MiB", "--format", format]);
        run(&[
            "replay",
            &file,
            "--capacity",
            "30MiB",
            "--verify",
            "--format",
            format,
        ]);
        let compact = [
            "replay",
            &file,
            "--capacity",
            "30MiB",
            "--policy",
            "compact",
        ];
        run(&[&compact[..], &["--format", format]].concat());
        run(&[
            "replay",
            &file,
            "--capacity",
            "30MiB",
            "--sweep",
            "--format",
            format,
        ]);
    }
    for (to, out) in [
        ("json", "-"),
        ("perfetto", "-"),
        ("events", "-"),
        ("html", "-"),
    ] {
        run(&["convert", &file, "--to", to, "-o", out]);
    }
    let pickle_out = dir.join("out.pickle");
    run(&[
        "convert",
        &file,
        "--to",
        "pytorch",
        "-o",
        pickle_out.to_str().unwrap(),
    ]);

    // Errors that quote the file.
    let json = serde_json::to_string(&hostile).unwrap();
    let word = serde_json::to_string(&format!("active{name}")).unwrap();
    let bad_state = dir.join("bad-state.json");
    std::fs::write(&bad_state, json.replacen("\"active_allocated\"", &word, 1)).unwrap();
    let source = serde_json::to_string(&hostile.source).unwrap();
    let bad_source = dir.join("bad-source.json");
    let quoted = serde_json::to_string(&name).unwrap();
    std::fs::write(&bad_source, json.replacen(&source, &quoted, 1)).unwrap();
    let mut pickle = vramscope::export::to_pytorch_pickle(&hostile).unwrap();
    let state = b"active_allocated";
    let evil = "\n::add-mask::##[";
    assert_eq!(evil.len(), state.len());
    let at = pickle
        .windows(state.len())
        .position(|w| w == state)
        .unwrap();
    pickle[at..at + state.len()].copy_from_slice(evil.as_bytes());
    let bad_pickle = dir.join("bad-state.pickle");
    std::fs::write(&bad_pickle, pickle).unwrap();
    let odd_name = dir.join(format!("{COMMANDS}.json"));
    std::fs::write(&odd_name, b"SECRET=1").unwrap();
    let missing = dir.join(format!("missing{COMMANDS}.json"));
    for path in [&bad_state, &bad_source, &bad_pickle, &odd_name, &missing] {
        for command in ["report", "summary"] {
            let output = vramscope(&[command, path.to_str().unwrap()]);
            assert_eq!(output.status.code(), Some(2), "{command} {path:?}");
            runs.push((format!("{command} {path:?}"), output, false));
        }
    }

    // A folder of ranks whose file names carry the commands, one of them no snapshot.
    let ranks = dir.join("ranks");
    std::fs::create_dir_all(&ranks).unwrap();
    save(&snapshot_named(&name, false), &ranks.join("rank0.json"));
    save(
        &snapshot_named(&name, true),
        &ranks.join(format!("{COMMANDS}rank1.json")),
    );
    std::fs::write(ranks.join(format!("{COMMANDS}rank2.json")), b"SECRET=1").unwrap();
    std::fs::write(ranks.join(format!("notes{COMMANDS}.txt")), b"hi").unwrap();
    for format in ["text", "markdown", "json", "html"] {
        let output = vramscope(&["ranks", ranks.to_str().unwrap(), "--format", format]);
        runs.push((format!("ranks --format {format}"), output, false));
    }

    for (what, output, github) in &runs {
        assert_inert(what, output, *github);
    }
    // The names are shown, escaped, where they were.
    let text = String::from_utf8_lossy(&runs[0].1.stdout).into_owned();
    assert!(
        text.contains("BEFORE\\u{a}\\u{3a}:add-mask::AFTER")
            || text.contains("BEFORE\\u{a}::add-mask::AFTER"),
        "{text}"
    );
    let replay = runs
        .iter()
        .find(|r| r.0.contains("replay") && r.0.ends_with("text"))
        .unwrap();
    let replay = String::from_utf8_lossy(&replay.1.stdout);
    assert!(
        replay.contains("first OOM") && replay.contains(" at BEFORE\\u{a}"),
        "{replay}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Issue 44: a `ranks` folder holding a link to `/proc/self/environ` (the process's own
/// environment, secrets included) gets a row saying the file is no format vramscope reads, and
/// no byte of it, in hex or as text, in any format or on standard error.
#[test]
fn a_link_to_the_environment_in_a_ranks_folder_prints_none_of_it() {
    if !Path::new("/proc/self/environ").exists() {
        vramscope_testkit::skip_notice("/proc/self/environ does not exist here");
        return;
    }
    let dir = scratch("environ");
    save(&snapshot_named("train", false), &dir.join("rank0.json"));
    save(&snapshot_named("train", true), &dir.join("rank1.json"));
    std::os::unix::fs::symlink("/proc/self/environ", dir.join("rank2.json")).unwrap();
    for format in ["text", "markdown", "json", "html"] {
        let output = Command::new(env!("CARGO_BIN_EXE_vramscope"))
            .args(["ranks", dir.to_str().unwrap(), "--format", format])
            .env_clear()
            .env("AAAA_SECRET", "s3cr3tvalue")
            .output()
            .unwrap();
        assert_eq!(output.status.code(), Some(1), "{format}");
        let all = [output.stdout, output.stderr].concat();
        let text = String::from_utf8_lossy(&all);
        assert!(
            text.contains("not a format vramscope reads"),
            "{format}: {text}"
        );
        for leak in ["SECRET", "s3cr3t", "41 41 41 41", "41414141"] {
            assert!(!text.contains(leak), "{format}: {leak} in {text}");
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Issue 44: `report -o` and `convert -o` write a new file and rename it onto the path, so a
/// link standing there is replaced and its target never written; `--help` and `--version` on
/// a full device exit 2 with the system's words, as every other output does.
#[test]
fn outputs_never_go_through_a_link_and_help_on_a_full_device_is_exit_2() {
    let dir = scratch("links");
    let file = save(&snapshot_named("train", false), &dir.join("run.json"));
    let precious = dir.join("precious");
    for (i, args) in [
        vec!["report", file.as_str(), "--format", "markdown", "-o"],
        vec!["report", file.as_str(), "--format", "html", "-o"],
        vec!["convert", file.as_str(), "--to", "json", "-o"],
        vec!["convert", file.as_str(), "--to", "pytorch", "-o"],
        vec!["convert", file.as_str(), "--to", "perfetto", "-o"],
    ]
    .into_iter()
    .enumerate()
    {
        std::fs::write(&precious, b"keep me").unwrap();
        let link = dir.join(format!("out{i}"));
        std::os::unix::fs::symlink(&precious, &link).unwrap();
        let output = vramscope(&[&args[..], &[link.to_str().unwrap()]].concat());
        assert_eq!(
            output.status.code(),
            Some(0),
            "{args:?}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        assert_eq!(std::fs::read(&precious).unwrap(), b"keep me", "{args:?}");
        let kind = std::fs::symlink_metadata(&link).unwrap().file_type();
        assert!(
            kind.is_file(),
            "{args:?}: the link is replaced by the output"
        );
        assert!(std::fs::metadata(&link).unwrap().len() > 100, "{args:?}");
    }
    // Nothing but the outputs is left in the folder.
    let names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(names.iter().all(|n| !n.ends_with(".tmp")), "{names:?}");

    if Path::new("/dev/full").exists() {
        for args in [vec!["--help"], vec!["--version"], vec!["report", "--help"]] {
            let full = std::fs::OpenOptions::new()
                .write(true)
                .open("/dev/full")
                .unwrap();
            let output = Command::new(env!("CARGO_BIN_EXE_vramscope"))
                .args(&args)
                .stdout(full)
                .output()
                .unwrap();
            let err = String::from_utf8_lossy(&output.stderr);
            assert_eq!(output.status.code(), Some(2), "{args:?}: {err}");
            assert!(err.contains("No space left on device"), "{args:?}: {err}");
        }
        // Help that is written is exit 0.
        assert_eq!(vramscope(&["--help"]).status.code(), Some(0));
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Issue 44, item 1: the 15-byte pickle (protocol 5, a `BINBYTES8`, `BINUNICODE8` or
/// `BYTEARRAY8` of 2^64 − 9 bytes or more, or near 2^63) hung `report` and `summary` at 100 %
/// CPU, plain and gzipped. Each is exit 2 naming the opcode; a hang is this test's failure.
#[test]
fn a_length_near_2_pow_64_is_an_error_in_every_command() {
    use std::io::Write as _;
    let dir = scratch("lengths");
    for (op, name) in [
        (0x8eu8, "BINBYTES8"),
        (0x8d, "BINUNICODE8"),
        (0x96, "BYTEARRAY8"),
    ] {
        for n in [u64::MAX - 8, u64::MAX, 1 << 63, (1 << 63) - 1] {
            let mut bytes = vec![0x80, 5, op];
            bytes.extend_from_slice(&n.to_le_bytes());
            bytes.extend_from_slice(b"N.N.");
            let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
            gz.write_all(&bytes).unwrap();
            for (what, data) in [("plain", bytes.clone()), ("gzip", gz.finish().unwrap())] {
                let path = dir.join(format!("{name}-{n}.pickle"));
                std::fs::write(&path, data).unwrap();
                for command in ["report", "summary"] {
                    let output = vramscope(&[command, path.to_str().unwrap()]);
                    let err = String::from_utf8_lossy(&output.stderr);
                    assert_eq!(
                        output.status.code(),
                        Some(2),
                        "{command} {name} {n} {what}: {err}"
                    );
                    assert!(err.contains(name), "{command} {name} {n} {what}: {err}");
                }
            }
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}
