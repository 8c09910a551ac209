//! vramscope's event logs: JSON Lines written by `Snapshot::write_event_log`, whose first line
//! is a snapshot without its events and every further line one `Event`.
//!
//! `super::load_bytes` sends a vramscope JSON file here when more JSON follows the first
//! object. The header supplies the device, settings, statistics, segments and call-site tables;
//! the events are appended in order. The header's state is the log's end, so a log is read
//! whole or not at all: when its header counts its event lines (`EVENT_LOG_COUNT_KEY`, which
//! every log written by this version has), a log with fewer or more is an error saying so; a
//! log from before that count existed may end in a cut line, which is dropped. Any other bad
//! line is an error naming its line number.
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
    struct HeaderProbe {
        format_version: u32,
        // `vramscope_model::EVENT_LOG_COUNT_KEY` (an attribute takes no constant; the tests
        // read logs through that constant).
        #[serde(rename = "event_log_events", default)]
        events: Option<u64>,
    }
    let probe = serde_json::from_slice::<HeaderProbe>(header).ok();
    let written_in = probe.as_ref().map_or(FORMAT_VERSION, |p| p.format_version);
    let declared = probe.and_then(|p| p.events);
    let mut snapshot = Snapshot::from_json_bytes(header, origin)
        .map_err(|e| ImportError::new(origin, ImportErrorKind::Snapshot(e)))?;
    if snapshot.format_version > FORMAT_VERSION {
        return Err(structure(
            1,
            format!("format version {}", snapshot.format_version),
        ));
    }
    let mut last_line = 1;
    let mut cut_line = None;
    while let Some((index, line)) = lines.next() {
        match serde_json::from_slice::<Event>(line) {
            Ok(mut event) => {
                event.upgrade_from(written_in);
                snapshot.events.push(event);
                last_line = index + 1;
            }
            // A log from before the header's count may have been cut off in the middle of its
            // last line; with the count, the check below says so.
            Err(e) if e.is_eof() && lines.peek().is_none() => {
                cut_line = Some(index + 1);
                break;
            }
            Err(e) => return Err(structure(index + 1, e.to_string())),
        }
    }
    if let Some(declared) = declared {
        let read = snapshot.events.len() as u64;
        if read != declared {
            let ending = match cut_line {
                Some(line) => format!("it ends in the middle of line {line}"),
                None => format!("its last complete line is line {last_line}"),
            };
            return Err(structure(
                cut_line.unwrap_or(last_line),
                format!(
                    "the event log is incomplete: its header counts {declared} events, the file \
                     holds {read} ({ending}); the header's state is the log's end, so its events \
                     cannot be read without the missing ones"
                ),
            ));
        }
    }
    if snapshot.steps.is_empty() {
        snapshot.steps = snapshot
            .events
            .iter()
            .filter(|e| e.kind == EventKind::Step)
            .map(|e| StepMark {
                step: u64::from(e.step),
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
    use crate::{load_bytes, ImportOptions};
    use vramscope_caching::{CachingAllocator, SimDevice};
    use vramscope_model::{AllocatorConfig, EVENT_LOG_COUNT_KEY};

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
    fn a_cut_log_is_refused_and_other_bad_lines_are_named() {
        // Cut in the middle of a line, and at a line's end: either way the header's count
        // says events are missing.
        let (snapshot, mut bytes) = log();
        bytes.truncate(bytes.len() - 20);
        let err = load_bytes(&bytes, "run.jsonl", &ImportOptions::default())
            .unwrap_err()
            .to_string();
        let events = snapshot.events.len();
        assert!(
            err.contains(&format!(
                "header counts {events} events, the file holds {}",
                events - 1
            )) && err.contains("it ends in the middle of line"),
            "{err}"
        );
        let (_, bytes) = log();
        let text = String::from_utf8(bytes).unwrap();
        let kept: Vec<&str> = text.lines().take(3).collect();
        let err = load_bytes(
            kept.join("\n").as_bytes(),
            "run.jsonl",
            &ImportOptions::default(),
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("line 3")
                && err.contains("the file holds 2 (its last complete line is line 3)"),
            "{err}"
        );

        // A log written before the header's count: a cut last line is dropped.
        let (snapshot, bytes) = log();
        let text = String::from_utf8(bytes).unwrap();
        let (header, events) = text.split_once('\n').unwrap();
        let count = format!(",\"{EVENT_LOG_COUNT_KEY}\":{}", snapshot.events.len());
        assert!(header.contains(&count), "{header}");
        let header = header.replace(&count, "");
        let mut old = format!("{header}\n{events}").into_bytes();
        old.truncate(old.len() - 20);
        let back = load_bytes(&old, "run.jsonl", &ImportOptions::default()).unwrap();
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
