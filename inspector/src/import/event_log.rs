//! vramscope's event logs: JSON Lines written by `Snapshot::write_event_log`, whose first line
//! is a snapshot without its events and every further line one `Event`.
//!
//! `super::load_bytes` sends a vramscope JSON file here when more JSON follows the first
//! object. The header supplies the device, settings, statistics, segments and call-site tables;
//! the events are appended in order. A log a program was still appending to may end in a cut
//! line: that last line is dropped, and any other bad line is an error naming its line number.
//! Steps come from the header's step marks, or, when it has none, from the log's `step` events.

use serde_json::Deserializer;
use vramscope_model::{Event, EventKind, Snapshot, StepMark, FORMAT_VERSION};

use super::{ImportError, ImportErrorKind};

/// Whether `bytes` hold more than one JSON value: an event log rather than a snapshot.
pub fn is_event_log(bytes: &[u8]) -> bool {
    let mut values = Deserializer::from_slice(bytes).into_iter::<serde::de::IgnoredAny>();
    matches!(values.next(), Some(Ok(_))) && values.next().is_some()
}

/// Reads an event log; `origin` names it in errors.
pub fn read(bytes: &[u8], origin: &str) -> Result<Snapshot, ImportError> {
    let structure = |line: usize, message: String| {
        ImportError::new(
            origin,
            ImportErrorKind::Structure {
                path: format!("line {line}"),
                message,
            },
        )
    };
    let mut lines = bytes
        .split(|&b| b == b'\n')
        .enumerate()
        .filter(|(_, line)| !line.iter().all(u8::is_ascii_whitespace))
        .peekable();
    let Some((_, header)) = lines.next() else {
        return Err(structure(1, "the event log is empty".to_string()));
    };
    // The version the log was written in, which its event lines follow too (reading the header
    // upgrades the snapshot to this build's version).
    #[derive(serde::Deserialize)]
    struct VersionProbe {
        format_version: u32,
    }
    let written_in = serde_json::from_slice::<VersionProbe>(header)
        .map_or(FORMAT_VERSION, |probe| probe.format_version);
    let mut snapshot = Snapshot::from_json_bytes(header, origin)
        .map_err(|e| ImportError::new(origin, ImportErrorKind::Snapshot(e)))?;
    if snapshot.format_version > FORMAT_VERSION {
        return Err(structure(
            1,
            format!("format version {}", snapshot.format_version),
        ));
    }
    while let Some((index, line)) = lines.next() {
        match serde_json::from_slice::<Event>(line) {
            Ok(mut event) => {
                event.upgrade_from(written_in);
                snapshot.events.push(event);
            }
            // The writer may have been cut off in the middle of its last line.
            Err(e) if e.is_eof() && lines.peek().is_none() => break,
            Err(e) => return Err(structure(index + 1, e.to_string())),
        }
    }
    if snapshot.steps.is_empty() {
        snapshot.steps = snapshot
            .events
            .iter()
            .filter(|e| e.kind == EventKind::Step)
            .map(|e| StepMark {
                step: e.step,
                seq: e.seq,
                time_ns: e.time_ns,
                label: "mark_step".to_string(),
            })
            .collect();
    }
    Ok(snapshot)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::import::{load_bytes, ImportOptions};
    use vramscope_allocator::{CachingAllocator, SimDevice};
    use vramscope_model::AllocatorConfig;

    fn log() -> (Snapshot, Vec<u8>) {
        let alloc = CachingAllocator::new(SimDevice::phantom(1 << 34), AllocatorConfig::default());
        let mut kept = Vec::new();
        for _ in 0..4 {
            alloc.mark_step();
            kept.push(alloc.alloc(1 << 20).unwrap());
        }
        let snapshot = alloc.snapshot();
        let mut bytes = Vec::new();
        snapshot.write_event_log(&mut bytes).unwrap();
        (snapshot, bytes)
    }

    #[test]
    fn an_event_log_reads_back_as_the_snapshot_it_came_from() {
        let (snapshot, bytes) = log();
        assert!(is_event_log(&bytes));
        let back = load_bytes(&bytes, "run.jsonl", &ImportOptions::default()).unwrap();
        assert_eq!(back, snapshot);
    }

    #[test]
    fn a_cut_last_line_is_dropped_and_other_bad_lines_are_named() {
        let (snapshot, mut bytes) = log();
        bytes.truncate(bytes.len() - 20);
        let back = load_bytes(&bytes, "run.jsonl", &ImportOptions::default()).unwrap();
        assert_eq!(back.events.len(), snapshot.events.len() - 1);

        let (_, bytes) = log();
        let text = String::from_utf8(bytes).unwrap();
        let mut lines: Vec<&str> = text.lines().collect();
        lines[3] = r#"{"seq": "three"}"#;
        let broken = lines.join("\n");
        let err = load_bytes(broken.as_bytes(), "run.jsonl", &ImportOptions::default())
            .unwrap_err()
            .to_string();
        assert!(err.contains("run.jsonl") && err.contains("line 4"), "{err}");
    }

    #[test]
    fn steps_come_from_step_events_when_the_header_has_none() {
        let (snapshot, _) = log();
        let mut header = snapshot.clone();
        header.steps.clear();
        let mut bytes = Vec::new();
        header.write_event_log(&mut bytes).unwrap();
        let back = load_bytes(&bytes, "run.jsonl", &ImportOptions::default()).unwrap();
        assert_eq!(back.steps.len(), 4);
        assert_eq!(
            back.steps.iter().map(|s| s.step).collect::<Vec<_>>(),
            [1, 2, 3, 4]
        );
    }
}
