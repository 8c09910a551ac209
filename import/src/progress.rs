//! How far the loading of a file has got, for a display that a person watches while a big
//! snapshot opens.
//!
//! A [`Progress`] is shared between the thread that loads and the thread that shows it: the
//! importer (`super::load_with`, and through [`super::ImportOptions::progress`] the PyTorch
//! pickle reader and the block-size replay) moves it through its [`Stage`]s, and `vramscope
//! view`'s loading screen prints [`Progress::state`] ten times a second. Nothing here decides
//! anything: a load with no progress attached does exactly the same work.

use std::fmt;
use std::sync::{Arc, Mutex};

use vramscope_model::{format_bytes, thousands};

/// A step of opening a file, in the order they happen.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum Stage {
    /// Nothing started yet.
    #[default]
    Starting,
    /// Reading and decoding the file: `done` and `total` count bytes of the file.
    Reading,
    /// Replaying a PyTorch trace to give each allocation PyTorch's block size: `done` and
    /// `total` count trace events.
    SizingBlocks,
    /// Building the dashboard's timeline (memory after every event, checkpoints, the pyramid).
    BuildingTimeline,
    /// Running the detectors for the first screen's findings.
    Analysing,
}

/// Where a load is: its stage, and how much of that stage is done (0 of 0 when the stage
/// cannot tell).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProgressState {
    /// The current stage.
    pub stage: Stage,
    /// Units of the stage done so far.
    pub done: u64,
    /// Units the stage has in all (0: unknown).
    pub total: u64,
}

impl ProgressState {
    /// The fraction of the stage done, when the stage knows its total.
    pub fn fraction(&self) -> Option<f64> {
        (self.total > 0).then(|| self.done.min(self.total) as f64 / self.total as f64)
    }
}

impl fmt::Display for ProgressState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let what = match self.stage {
            Stage::Starting => return f.write_str("opening the file"),
            Stage::Reading => "reading the file",
            Stage::SizingBlocks => "replaying the trace for PyTorch's block sizes",
            Stage::BuildingTimeline => return f.write_str("building the timeline"),
            Stage::Analysing => return f.write_str("looking for problems"),
        };
        let Some(fraction) = self.fraction() else {
            return f.write_str(what);
        };
        let done = self.done.min(self.total);
        let percent = (fraction * 100.0).floor();
        match self.stage {
            Stage::Reading => write!(
                f,
                "{what}: {} of {} ({percent:.0} %)",
                format_bytes(done),
                format_bytes(self.total)
            ),
            _ => write!(
                f,
                "{what}: {} of {} events ({percent:.0} %)",
                thousands(done),
                thousands(self.total)
            ),
        }
    }
}

/// A shared record of a load's [`ProgressState`]; clones share it. Two handles are equal when
/// they share one record, so that [`super::ImportOptions`] stays comparable.
#[derive(Clone, Debug, Default)]
pub struct Progress(Arc<Mutex<ProgressState>>);

impl Progress {
    /// A new record, at [`Stage::Starting`].
    pub fn new() -> Progress {
        Progress::default()
    }

    /// Enters `stage`, with `total` units to do (0: unknown).
    pub fn begin(&self, stage: Stage, total: u64) {
        self.update(|s| {
            *s = ProgressState {
                stage,
                done: 0,
                total,
            }
        });
    }

    /// Counts `units` more done in the current stage.
    pub fn add(&self, units: u64) {
        self.update(|s| s.done = s.done.saturating_add(units));
    }

    /// Sets the units done in the current stage, and its total.
    pub fn set(&self, done: u64, total: u64) {
        self.update(|s| {
            s.done = done;
            s.total = total;
        });
    }

    /// Where the load is now.
    pub fn state(&self) -> ProgressState {
        match self.0.lock() {
            Ok(state) => *state,
            Err(poisoned) => *poisoned.into_inner(),
        }
    }

    fn update(&self, change: impl FnOnce(&mut ProgressState)) {
        match self.0.lock() {
            Ok(mut state) => change(&mut state),
            Err(poisoned) => change(&mut poisoned.into_inner()),
        }
    }
}

impl PartialEq for Progress {
    fn eq(&self, other: &Progress) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for Progress {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stage_with_a_total_says_how_far_it_is() {
        let progress = Progress::new();
        assert_eq!(progress.state().to_string(), "opening the file");
        progress.begin(Stage::Reading, 958 << 20);
        progress.add(412 << 20);
        assert_eq!(
            progress.state().to_string(),
            "reading the file: 412 MiB of 958 MiB (43 %)"
        );
        progress.begin(Stage::SizingBlocks, 10_000_000);
        progress.set(9_999_999, 10_000_000);
        // Never 100 % before the end.
        assert_eq!(
            progress.state().to_string(),
            "replaying the trace for PyTorch's block sizes: 9,999,999 of 10,000,000 events (99 %)"
        );
        progress.begin(Stage::Reading, 0);
        assert_eq!(progress.state().to_string(), "reading the file");
        progress.begin(Stage::BuildingTimeline, 0);
        assert_eq!(progress.state().to_string(), "building the timeline");
    }

    #[test]
    fn clones_share_one_record_and_compare_equal() {
        let progress = Progress::new();
        let clone = progress.clone();
        clone.begin(Stage::Analysing, 0);
        assert_eq!(progress.state().stage, Stage::Analysing);
        assert_eq!(progress, clone);
        assert_ne!(progress, Progress::new());
        // Work past the total (a file that grew) shows as all done, not more.
        progress.begin(Stage::Reading, 10);
        progress.add(20);
        assert_eq!(progress.state().fraction(), Some(1.0));
    }
}
