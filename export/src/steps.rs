//! A range of steps to convert (`vramscope convert --steps A..B`) and the part of a snapshot
//! it keeps.
//!
//! Steps are numbered as `vramscope report` numbers them: the trace's own step numbers where it
//! has marks (the first step is 1; what comes before it is step 0), else the steps the report
//! infers from the repeating allocations, which the caller writes into the snapshot first
//! (`vramscope_analysis::model_view::record_inferred_steps`). [`StepRange::window`] finds the events of a
//! range: from the first event of its first step to the last event of its last. The Perfetto
//! export draws a window of the whole trace (`super::write_perfetto_window`: the engine's
//! figures of the whole trace, so that the counter starts at what was held before the
//! window). The other formats write [`slice`], a snapshot of the window's events whose
//! dump-time state is the engine's state after the window's last event, so that a reader
//! that walks back from it (the importers, memory_viz) finds the state before the window.

use std::fmt;
use std::ops::Range;
use std::str::FromStr;

use vramscope_engine::Reconstruction;
use vramscope_model::{Snapshot, StepMark};

use super::{carry, ExportError};

/// A range of steps, both ends included: `A..B` (steps A to B), `A..` (A to the last), `..B`
/// (the first to B) or `N` (step N alone).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StepRange {
    /// The first step kept.
    pub first: u64,
    /// The last step kept (`u64::MAX` for "to the end").
    pub last: u64,
}

impl FromStr for StepRange {
    type Err = String;

    fn from_str(text: &str) -> Result<StepRange, String> {
        let number = |part: &str, default: u64| -> Result<u64, String> {
            let part = part.trim();
            if part.is_empty() {
                return Ok(default);
            }
            part.parse::<u64>().map_err(|_| {
                format!("`{text}` is not a range of steps: `{part}` is not a step number (write A..B, A.., ..B or N)")
            })
        };
        let range = match text.split_once("..") {
            Some((a, b)) => StepRange {
                first: number(a, 0)?,
                last: number(b.strip_prefix('=').unwrap_or(b), u64::MAX)?,
            },
            None => {
                let n = number(text, u64::MAX)?;
                if text.trim().is_empty() {
                    return Err("an empty range of steps (write A..B, A.., ..B or N)".to_string());
                }
                StepRange { first: n, last: n }
            }
        };
        if range.first > range.last {
            return Err(format!(
                "`{text}` is an empty range of steps: it starts after it ends (both ends are included: 3..5 is steps 3, 4 and 5)"
            ));
        }
        Ok(range)
    }
}

impl fmt::Display for StepRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.first, self.last) {
            (first, last) if first == last => write!(f, "step {first}"),
            (first, u64::MAX) => write!(f, "steps {first}.."),
            (first, last) => write!(f, "steps {first}..{last}"),
        }
    }
}

impl StepRange {
    /// Whether step `step` is in the range.
    pub fn contains(&self, step: u64) -> bool {
        (self.first..=self.last).contains(&step)
    }

    /// The events of `snapshot` in the range, as indices into its events: from the first event
    /// of a step in the range to the last one. An error naming the steps the trace has when
    /// no event is in the range.
    pub fn window(&self, snapshot: &Snapshot) -> Result<Range<usize>, ExportError> {
        let events = &snapshot.events;
        let inside = |e: &vramscope_model::Event| self.contains(u64::from(e.step));
        match (
            events.iter().position(inside),
            events.iter().rposition(inside),
        ) {
            (Some(first), Some(last)) => Ok(first..last + 1),
            _ => {
                let lowest = events.iter().map(|e| e.step).min();
                let highest = events.iter().map(|e| e.step).max();
                let have = match (lowest, highest) {
                    (Some(lo), Some(hi)) if lo == hi => format!("all its events are in step {lo}"),
                    (Some(lo), Some(hi)) => format!("its events are in steps {lo}..{hi}"),
                    _ => "it has no events".to_string(),
                };
                Err(ExportError::Steps {
                    what: format!("no event of the trace is in {self}: {have}"),
                })
            }
        }
    }
}

/// The part of `snapshot` at `window` (indices into its events, as [`StepRange::window`]
/// finds them) as a snapshot of its own: the window's events, the step marks and annotations
/// among them, and as its dump-time state the engine's state after the window's last event
/// (segments and blocks as they are, a live block outside every segment in a segment of its
/// own, memory known only as totals in a segment of its own), so that walking back from it
/// over the window's events gives the state before the window. The slice's statistics are
/// left empty: its segments hold what it has. The whole trace is the snapshot itself.
pub fn slice(snapshot: &Snapshot, window: Range<usize>) -> Result<Snapshot, ExportError> {
    let n = snapshot.events.len();
    let window = window.start.min(n)..window.end.min(n).max(window.start.min(n));
    // The state after the window's last event, walked back from the end.
    let mut end = None;
    if let Some(last) = window.end.checked_sub(1) {
        Reconstruction::states_after(snapshot, &[last as u32], |_, state| {
            end = Some(state.clone());
        });
    }
    let end = end.unwrap_or_else(|| Reconstruction::start_of(snapshot));
    let dump = carry::DumpState::from_state(snapshot, &end, reserved_known(snapshot))?;
    let segments = dump.map(|d| d.segments).unwrap_or_default();
    let events = &snapshot.events[window.clone()];
    let (first, last) = match (events.first(), events.last()) {
        (Some(a), Some(b)) => ((a.seq, a.time_ns), (b.seq, b.time_ns)),
        _ => ((0, 0), (0, 0)),
    };
    let steps: Vec<StepMark> = snapshot
        .steps
        .iter()
        .filter(|m| (first.0..=last.0).contains(&m.seq))
        .cloned()
        .collect();
    let annotations = snapshot
        .annotations
        .iter()
        .filter(|a| (first.1..=last.1).contains(&a.time_ns))
        .cloned()
        .collect();
    let mut sliced = empty_like(snapshot);
    sliced.segments = segments;
    sliced.events = events.to_vec().into();
    sliced.steps = steps;
    sliced.annotations = annotations;
    Ok(sliced)
}

/// Whether the engine finds that `snapshot`'s source records reserved memory.
fn reserved_known(snapshot: &Snapshot) -> bool {
    let stats = &snapshot.stats;
    !snapshot.segments.is_empty()
        || stats.reserved_bytes.all.current > 0
        || stats.reserved_bytes.all.peak > 0
        || snapshot
            .events
            .iter()
            .any(vramscope_engine::is_segment_event)
}

/// A snapshot with `snapshot`'s device, settings, source and tables, and no segments, events,
/// statistics, marks or annotations.
fn empty_like(snapshot: &Snapshot) -> Snapshot {
    Snapshot {
        format_version: snapshot.format_version,
        source: snapshot.source,
        device: snapshot.device.clone(),
        config: snapshot.config.clone(),
        stats: Default::default(),
        epoch_unix_ns: snapshot.epoch_unix_ns,
        segments: Vec::new(),
        events: Default::default(),
        dropped_events: 0,
        sites: snapshot.sites.clone(),
        tags: snapshot.tags.clone(),
        scopes: snapshot.scopes.clone(),
        steps: Vec::new(),
        annotations: Vec::new(),
        violations: Vec::new(),
    }
}
