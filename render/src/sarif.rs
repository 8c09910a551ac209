//! The report as a SARIF 2.1.0 log (`vramscope report FILE --format sarif`), for code-scanning
//! consumers such as GitHub's, which put each finding on the line it names.
//!
//! One run, whose tool driver is `vramscope` at the crate's version, with one rule per
//! detector kind (in [`FindingKind::ALL`]'s order, so that `ruleIndex` is stable) carrying its
//! description and help. Each finding is one result: `level` from its severity (`error`,
//! `warning`, `note` for information), the fix as its message, its site as the physical
//! location when the site is a source line (`crate::location`: a URI relative to
//! `%SRCROOT%`, or an absolute `file:` URI for a file outside the checkout, and `startLine`
//! of 1 or more), the function there as a logical location, the line that allocated kept
//! memory and the other sites of the finding as related locations, and every figure of the
//! JSON report's finding (bytes, count, per step, steps, evidence) as properties. A finding
//! that names no source line (an autograd node, memory from before the trace) is anchored at
//! the trace file itself, without a region, and named by its logical location where it has
//! one: GitHub refuses a whole log when one result has no file. Several devices' reports are
//! one run, each result saying its device.

use serde_json::{json, Map, Value};

use crate::location::{path_ref, source_line, AnnotationOptions, PathRef};
use vramscope_analysis::detect::{Finding, FindingKind, Severity};
use vramscope_analysis::report::Report;

/// The URI of the SARIF 2.1.0 schema (OASIS, errata 01) the log declares.
pub const SARIF_SCHEMA_URI: &str =
    "https://docs.oasis-open.org/sarif/sarif/v2.1.0/errata01/os/schemas/sarif-schema-2.1.0.json";

/// The `uriBaseId` of relative URIs: the root of the sources, which the consumer knows (for
/// GitHub, the repository's checkout).
pub const SOURCE_ROOT_BASE_ID: &str = "%SRCROOT%";

/// The most related locations a result lists (the finding's other sites, largest first).
const MAX_RELATED: usize = 10;

/// What a detector kind's rule says: a name, one line, a paragraph, and what to do.
struct RuleText {
    name: &'static str,
    short: &'static str,
    full: &'static str,
    help: &'static str,
    level: Severity,
}

fn rule_text(kind: FindingKind) -> RuleText {
    match kind {
        FindingKind::RetainedPerStep => RuleText {
            name: "RetainedPerStep",
            short: "A line keeps device memory alive every training step (a leak).",
            full: "The blocks a call site allocated in at least three steps are still live at \
                   the end, and its live bytes rose step over step: something keeps a reference \
                   to each step's tensors, so memory grows until the device runs out.",
            help: "Do not keep the step's device tensors: store loss.item() or t.detach().cpu() \
                   instead of the tensor (a kept tensor keeps its whole autograd graph), or drop \
                   the reference each step.",
            level: Severity::Error,
        },
        FindingKind::SyncInLoop => RuleText {
            name: "SyncInLoop",
            short: "A line makes the host wait for the device many times per step.",
            full: "Tiny device-to-host copies (.item(), print(t[0])) or explicit syncs at one \
                   call site, many times per step: each stalls the host until the device has \
                   caught up.",
            help: "Accumulate on the device (total += loss.detach()) and copy to the host once \
                   per step, not per element.",
            level: Severity::Warning,
        },
        FindingKind::TransferHeavy => RuleText {
            name: "TransferHeavy",
            short: "Host/device copies dominate the loop, or the same upload repeats every step.",
            full: "Copies between host and device reach a set share of what the loop allocates \
                   per step at these call sites; an upload of the same size in nearly every \
                   step is data that could stay on the device.",
            help: "Move data that does not change to the device once, before the loop; batch \
                   small copies and use pinned memory with non_blocking=True for the rest.",
            level: Severity::Warning,
        },
        FindingKind::CacheChurn => RuleText {
            name: "CacheChurn",
            short: "Segments are allocated and released every step (empty_cache() in a loop).",
            full: "Loop steps that both allocate and release device segments: the caching \
                   allocator hands memory back to the driver and asks for it again, which is \
                   slow and fragments memory.",
            help: "Remove torch.cuda.empty_cache() from the training loop; call it, if at all, \
                   once after a phase that freed memory for good.",
            level: Severity::Warning,
        },
        FindingKind::Fragmentation => RuleText {
            name: "Fragmentation",
            short: "Reserved memory the program cannot use (split blocks), or an OOM it explains.",
            full: "Free memory split inside segments that also hold live blocks: reserved by \
                   the allocator, yet too scattered for the requests that come, up to an \
                   allocation that failed for it.",
            help: "Set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True, or keep large \
                   long-lived allocations apart from short-lived ones (allocate them first).",
            level: Severity::Warning,
        },
        FindingKind::Oom => RuleText {
            name: "OutOfMemory",
            short: "An allocation failed and fragmentation does not explain it.",
            full: "The device ran out of memory: what was live at that moment, or the process's \
                   memory cap, refused the request.",
            help: "Lower the peak (a smaller batch, activation checkpointing, lower precision) \
                   or raise the process's memory cap; see what was live at the failure.",
            level: Severity::Error,
        },
        FindingKind::TopHolders => RuleText {
            name: "TopHolders",
            short: "What holds device memory at the end (or at the peak).",
            full: "The call sites holding the most memory, by kind: allocated once (weights, \
                   optimizer state), across steps, or before the trace began.",
            help: "Expected for weights, optimizer state and caches made once; to shrink them, \
                   use lower precision, sharding or offloading.",
            level: Severity::Info,
        },
    }
}

/// SARIF's `level` of a severity: `error`, `warning`, or `note` for information.
pub fn sarif_level(severity: Severity) -> &'static str {
    match severity {
        Severity::Error => "error",
        Severity::Warning => "warning",
        Severity::Info => "note",
    }
}

/// The rules of the driver: one per detector kind, in [`FindingKind::ALL`]'s order.
fn rules() -> Vec<Value> {
    let help_uri = format!(
        "{}#what-the-findings-mean",
        env!("CARGO_PKG_REPOSITORY").trim_end_matches('/')
    );
    FindingKind::ALL
        .iter()
        .map(|&kind| {
            let text = rule_text(kind);
            json!({
                "id": kind.as_str(),
                "name": text.name,
                "shortDescription": { "text": text.short },
                "fullDescription": { "text": text.full },
                "help": { "text": text.help },
                "helpUri": help_uri,
                "defaultConfiguration": { "level": sarif_level(text.level) },
            })
        })
        .collect()
}

/// Percent-encodes `path` for a URI: every byte but the unreserved characters and `/` (so that
/// `:` can never read as a scheme, nor a space, `#`, `?` or `%` break the reference).
fn encode_path(path: &str) -> String {
    let mut out = String::with_capacity(path.len());
    for b in path.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~' | b'/') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The `artifactLocation` of `file`: a relative URI with [`SOURCE_ROOT_BASE_ID`], or an
/// absolute `file:` URI. `None` when the path names nothing.
fn artifact_location(file: &str, options: &AnnotationOptions) -> Option<Value> {
    Some(match path_ref(file, options.source_root.as_deref())? {
        PathRef::Relative(path) => json!({
            "uri": encode_path(&path),
            "uriBaseId": SOURCE_ROOT_BASE_ID,
        }),
        PathRef::Absolute(path) => {
            // `file:///C:/x.py` keeps the drive's colon; every other byte is encoded.
            let uri = match path.split_at_checked(2) {
                Some((drive, rest)) if drive.ends_with(':') && rest.starts_with('/') => {
                    format!("file:///{drive}{}", encode_path(rest))
                }
                _ => format!("file://{}", encode_path(&path)),
            };
            json!({ "uri": uri })
        }
    })
}

/// A physical location at `site`'s source line, or `None` when the site is not one.
fn physical_at(site: &str, options: &AnnotationOptions) -> Option<Value> {
    let at = source_line(site)?;
    let artifact = artifact_location(at.file, options)?;
    Some(json!({
        "artifactLocation": artifact,
        "region": { "startLine": at.line },
    }))
}

/// The result's primary location: the site's line, the function there as a logical location;
/// for a site that is no source line, the trace file and the site's name.
fn primary_location(finding: &Finding, options: &AnnotationOptions) -> Option<Value> {
    let mut location = Map::new();
    let site = finding.site.as_deref();
    match site.and_then(|s| physical_at(s, options)) {
        Some(physical) => {
            location.insert("physicalLocation".into(), physical);
            if !finding.function.is_empty() {
                location.insert(
                    "logicalLocations".into(),
                    json!([{ "name": finding.function, "kind": "function" }]),
                );
            }
        }
        None => {
            if let Some(trace) = options.trace_file.as_deref() {
                if let Some(artifact) = artifact_location(trace, options) {
                    location.insert(
                        "physicalLocation".into(),
                        json!({ "artifactLocation": artifact }),
                    );
                }
            }
            // A name of code (`MmBackward0 (backward)`, a C++ function), not a placeholder
            // such as `(before the trace)` or `(unknown site)`.
            if let Some(name) = site.filter(|s| !s.starts_with('(')) {
                let short = if finding.function.is_empty() {
                    name
                } else {
                    finding.function.as_str()
                };
                location.insert(
                    "logicalLocations".into(),
                    json!([{ "name": short, "fullyQualifiedName": name, "kind": "function" }]),
                );
            }
            location.insert(
                "message".into(),
                json!({ "text": format!("{}: no source line recorded", finding.site_label()) }),
            );
        }
    }
    let located =
        location.contains_key("physicalLocation") || location.contains_key("logicalLocations");
    located.then_some(Value::Object(location))
}

/// The finding's other lines: where kept memory was made, and the sites it gathers.
fn related_locations(finding: &Finding, options: &AnnotationOptions) -> Vec<Value> {
    let mut candidates: Vec<(&str, String)> = Vec::new();
    if let Some(made_at) = finding.made_at.as_deref() {
        candidates.push((made_at, "the memory is allocated here".to_string()));
    }
    for s in &finding.sites {
        let message = format!(
            "{} in {} here",
            vramscope_model::format_bytes(s.bytes),
            vramscope_model::plural(s.blocks, "block")
        );
        candidates.push((s.site.as_str(), message));
    }
    let mut seen: Vec<&str> = finding.site.as_deref().into_iter().collect();
    let mut out = Vec::new();
    for (place, message) in candidates {
        if out.len() >= MAX_RELATED || seen.contains(&place) {
            continue;
        }
        seen.push(place);
        if let Some(physical) = physical_at(place, options) {
            out.push(json!({
                "id": out.len() + 1,
                "physicalLocation": physical,
                "message": { "text": message },
            }));
        }
    }
    out
}

/// A 64-bit FNV-1a hash, as 16 hex digits: a fingerprint that stays the same from one run to
/// the next (unlike std's randomly seeded hasher).
fn fnv1a(text: &str) -> String {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for b in text.bytes() {
        hash ^= u64::from(b);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    format!("{hash:016x}")
}

/// One result: the finding at its line, its fix as the message, its figures as properties.
fn result(
    finding: &Finding,
    device: (&str, Option<u32>),
    options: &AnnotationOptions,
    ordinal: usize,
) -> Value {
    let rule_index = FindingKind::ALL
        .iter()
        .position(|&k| k == finding.kind)
        .unwrap_or(0);
    let message = [finding.fix.as_str(), finding.summary.as_str()]
        .into_iter()
        .find(|t| !t.trim().is_empty())
        .unwrap_or(finding.kind.as_str());
    let mut result = Map::new();
    result.insert("ruleId".into(), json!(finding.kind.as_str()));
    result.insert("ruleIndex".into(), json!(rule_index));
    result.insert("level".into(), json!(sarif_level(finding.severity)));
    result.insert("message".into(), json!({ "text": message }));
    if let Some(location) = primary_location(finding, options) {
        result.insert("locations".into(), json!([location]));
    }
    let related = related_locations(finding, options);
    if !related.is_empty() {
        result.insert("relatedLocations".into(), Value::Array(related));
    }
    let identity = format!(
        "{}\u{0}{}\u{0}{}\u{0}{ordinal}",
        finding.kind,
        finding.site_label(),
        finding.made_at.as_deref().unwrap_or("")
    );
    result.insert(
        "partialFingerprints".into(),
        json!({ "vramscopeFinding/v1": fnv1a(&identity) }),
    );
    // The JSON report's finding, less what the result already says, as the property bag.
    let mut properties = match serde_json::to_value(finding) {
        Ok(Value::Object(map)) => map,
        _ => Map::new(),
    };
    for key in ["kind", "severity", "fix"] {
        properties.remove(key);
    }
    properties.insert("severity".into(), json!(finding.severity.as_str()));
    properties.insert("device".into(), json!(device.0));
    if let Some(index) = device.1 {
        properties.insert("device_index".into(), json!(index));
    }
    result.insert("properties".into(), Value::Object(properties));
    Value::Object(result)
}

/// The SARIF 2.1.0 log of `reports` (one per device of one trace) as pretty-printed JSON.
pub fn render_sarif(reports: &[Report], options: &AnnotationOptions) -> String {
    let mut results = Vec::new();
    let mut identities: Vec<(FindingKind, Option<&str>, Option<&str>)> = Vec::new();
    for (i, report) in reports.iter().enumerate() {
        let device = (
            report.device.name.as_str(),
            options.device_indices.get(i).copied(),
        );
        for finding in &report.findings {
            // Findings alike in kind and lines get distinct fingerprints by their order.
            let identity = (
                finding.kind,
                finding.site.as_deref(),
                finding.made_at.as_deref(),
            );
            let ordinal = identities.iter().filter(|i| **i == identity).count();
            identities.push(identity);
            results.push(result(finding, device, options, ordinal));
        }
    }
    let mut run_properties = Map::new();
    if let Some(first) = reports.first() {
        run_properties.insert("source".into(), json!(first.source));
        run_properties.insert("input".into(), json!(first.input));
        run_properties.insert("reportFormatVersion".into(), json!(first.format_version));
    }
    run_properties.insert(
        "devices".into(),
        json!(reports.iter().map(|r| &r.device.name).collect::<Vec<_>>()),
    );
    let log = json!({
        "$schema": SARIF_SCHEMA_URI,
        "version": "2.1.0",
        "runs": [{
            "tool": {
                "driver": {
                    "name": "vramscope",
                    "version": env!("CARGO_PKG_VERSION"),
                    "semanticVersion": env!("CARGO_PKG_VERSION"),
                    "informationUri": env!("CARGO_PKG_REPOSITORY"),
                    "rules": rules(),
                }
            },
            "results": results,
            "properties": run_properties,
        }],
    });
    let mut text = serde_json::to_string_pretty(&log).unwrap_or_else(|e| {
        // Serializing plain values into a string cannot fail; say so if it ever does.
        format!("{{\"error\": \"could not serialize the SARIF log: {e}\"}}")
    });
    text.push('\n');
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_become_uri_references_that_cannot_read_as_a_scheme() {
        let options = AnnotationOptions {
            source_root: Some("/repo".into()),
            trace_file: None,
            device_indices: Vec::new(),
        };
        let uri = |file: &str| artifact_location(file, &options).unwrap();
        assert_eq!(
            uri("/repo/src/my model.py"),
            json!({ "uri": "src/my%20model.py", "uriBaseId": "%SRCROOT%" })
        );
        assert_eq!(
            uri("a:b/100%#?.py"),
            json!({ "uri": "a%3Ab/100%25%23%3F.py", "uriBaseId": "%SRCROOT%" })
        );
        assert_eq!(
            uri("/opt/conda/lib/torch/nn.py"),
            json!({ "uri": "file:///opt/conda/lib/torch/nn.py" })
        );
        assert_eq!(
            uri("C:\\research\\client é.py"),
            json!({ "uri": "file:///C:/research/client%20%C3%A9.py" })
        );
    }

    #[test]
    fn every_kind_has_a_rule_in_a_stable_order() {
        let rules = rules();
        assert_eq!(rules.len(), FindingKind::ALL.len());
        for (rule, kind) in rules.iter().zip(FindingKind::ALL) {
            assert_eq!(rule["id"], kind.as_str());
            for key in ["shortDescription", "fullDescription", "help"] {
                let text = rule[key]["text"].as_str().unwrap();
                assert!(
                    text.ends_with('.') && text.len() > 20,
                    "{kind} {key}: {text}"
                );
            }
        }
        assert_eq!(fnv1a("a"), "af63dc4c8601ec8c");
    }
}
