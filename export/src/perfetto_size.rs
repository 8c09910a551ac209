//! Whether a Perfetto trace about to be written passes what ui.perfetto.dev opens as JSON
//! (about 1 GB, [`PERFETTO_UI_BYTES`]), and what to convert instead.
//!
//! [`perfetto_size_warning`] estimates the trace's size from its events alone
//! ([`super::perfetto_size_estimate`]); past the limit it returns a [`PerfettoSizeWarning`]
//! with the figures: the range of steps, from the loop's first (step 1, or the trace's first),
//! that stays within about 90% of the limit ([`super::perfetto_steps_within`]), and the size
//! of step 0 (what comes before the first step) when that alone passes it. Steps are numbered
//! as `vramscope report` numbers them: a trace without marks of its own is numbered by the
//! caller's step inference (`vramscope_analysis::model_view::record_inferred_steps`, which
//! this crate does not link) for the suggestion alone. The warning's `Display` is the sentence
//! `vramscope convert` prints; the caller decides nothing.

use std::fmt;
use std::ops::Range;

use vramscope_model::{format_bytes, Snapshot};

use super::{perfetto_size_estimate, perfetto_steps_within, StepRange};

/// The size past which ui.perfetto.dev does not open a JSON trace (about 1 GB).
pub const PERFETTO_UI_BYTES: u64 = 1_000_000_000;

/// A Perfetto trace that passes what ui.perfetto.dev opens, with what would not.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PerfettoSizeWarning {
    /// About how many bytes the trace will be.
    pub estimate: u64,
    /// What ui.perfetto.dev opens ([`PERFETTO_UI_BYTES`]).
    pub limit: u64,
    /// The steps from the loop's first that stay within about 90% of the limit, and their
    /// size; `None` when one step alone passes it.
    pub fits: Option<StepsWithin>,
    /// The size of step 0, before the first step, when it alone passes about 90% of the limit
    /// and the suggested range starts after it.
    pub before_first_step: Option<u64>,
}

/// A range of steps, both ends included, and about how many bytes of Perfetto trace it makes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StepsWithin {
    /// The first step.
    pub first: u64,
    /// The last step.
    pub last: u64,
    /// About how many bytes the steps make.
    pub bytes: u64,
}

/// The warning for a Perfetto trace of the events at `window` of `snapshot` (`None`: the whole
/// trace), or `None` when it is within what ui.perfetto.dev opens. Without a window the
/// snapshot's steps are numbered by `number_steps` for the suggestion (it returns how many
/// steps it wrote: 0 for a trace with marks of its own) and given back unnumbered after; a
/// window was found on steps numbered already.
pub fn perfetto_size_warning(
    snapshot: &mut Snapshot,
    window: Option<Range<usize>>,
    number_steps: impl FnOnce(&mut Snapshot) -> usize,
) -> Option<PerfettoSizeWarning> {
    size_warning(snapshot, window, number_steps, PERFETTO_UI_BYTES)
}

/// [`perfetto_size_warning`] against a viewer that opens `limit` bytes.
fn size_warning(
    snapshot: &mut Snapshot,
    window: Option<Range<usize>>,
    number_steps: impl FnOnce(&mut Snapshot) -> usize,
    limit: u64,
) -> Option<PerfettoSizeWarning> {
    let whole = window.is_none();
    let estimate = perfetto_size_estimate(snapshot, window.unwrap_or(0..snapshot.events.len()));
    if estimate <= limit {
        return None;
    }
    // The range suggested is numbered as `report` numbers steps: a trace without marks takes
    // the inferred ones for the suggestion, and has none again for the output.
    let inferred = whole && number_steps(snapshot) > 0;
    let warning = warning(snapshot, estimate, limit);
    if inferred {
        snapshot.events.iter_mut().for_each(|e| e.step = 0);
        snapshot.steps.clear();
    }
    Some(warning)
}

/// The warning for a trace of about `estimate` bytes past `limit`, its steps numbered; a
/// suggested range of steps may come to about 90% of the limit.
fn warning(snapshot: &Snapshot, estimate: u64, limit: u64) -> PerfettoSizeWarning {
    let suggested = limit / 10 * 9;
    let first = snapshot.events.iter().map(|e| u64::from(e.step)).min();
    let first = match snapshot.events.iter().any(|e| e.step >= 1) {
        true => Some(first.unwrap_or(1).max(1)),
        false => first,
    };
    let fits = first.and_then(|first| {
        perfetto_steps_within(snapshot, first, suggested).map(|(last, bytes)| StepsWithin {
            first,
            last,
            bytes,
        })
    });
    // What comes before the first step (step 0) may be most of the trace.
    let before_first_step = StepRange { first: 0, last: 0 }
        .window(snapshot)
        .ok()
        .map(|window| perfetto_size_estimate(snapshot, window))
        .filter(|&bytes| bytes > suggested && fits.is_some_and(|f| f.first > 0));
    PerfettoSizeWarning {
        estimate,
        limit,
        fits,
        before_first_step,
    }
}

impl fmt::Display for PerfettoSizeWarning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "the Perfetto trace will be about {}, past the {} that ui.perfetto.dev opens as JSON",
            format_bytes(self.estimate),
            format_bytes(self.limit),
        )?;
        match self.fits {
            Some(StepsWithin { first, last, bytes }) => write!(
                f,
                "; convert a range of steps, such as `--steps {first}..{last}` (about {}; steps are numbered as `report` numbers them)",
                format_bytes(bytes)
            )?,
            None => write!(
                f,
                "; one step alone passes it, so no range of steps opens either"
            )?,
        }
        if let Some(bytes) = self.before_first_step {
            write!(
                f,
                "; step 0, before the first step, is about {} alone",
                format_bytes(bytes)
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A run of 100 MiB of weights (step 0), then eight steps of three allocations each.
    fn traced_run() -> Snapshot {
        let alloc = vramscope_caching::CachingAllocator::new(
            vramscope_caching::SimDevice::phantom(1 << 40),
            vramscope_model::AllocatorConfig::default(),
        );
        let _weights = alloc.alloc(100 << 20).unwrap();
        for _ in 0..8 {
            alloc.mark_step();
            let _a = alloc.alloc(30 << 20).unwrap();
            let _b = alloc.alloc(3 << 20).unwrap();
            let _c = alloc.alloc(50 << 20).unwrap();
        }
        alloc.snapshot()
    }

    fn whole(snapshot: &Snapshot) -> u64 {
        perfetto_size_estimate(snapshot, 0..snapshot.events.len())
    }

    #[test]
    fn a_trace_within_the_limit_has_no_warning() {
        let mut snapshot = traced_run();
        let limit = whole(&snapshot);
        assert_eq!(size_warning(&mut snapshot, None, |_| 0, limit), None);
    }

    #[test]
    fn past_the_limit_it_suggests_steps_from_the_first_that_fit() {
        let mut snapshot = traced_run();
        let estimate = whole(&snapshot);
        let limit = estimate / 2;
        let warning = size_warning(&mut snapshot, None, |_| 0, limit).expect("a warning");
        assert_eq!(warning.estimate, estimate);
        assert_eq!(warning.limit, limit);
        let fits = warning.fits.expect("a range that fits");
        assert_eq!(
            fits.first, 1,
            "the suggestion starts at the loop's first step"
        );
        assert!(fits.last >= 1 && fits.last < 8, "{fits:?}");
        assert!(fits.bytes <= limit / 10 * 9, "{fits:?}");
        assert_eq!(warning.before_first_step, None);
        let text = warning.to_string();
        assert!(
            text.contains(&format!("`--steps 1..{}`", fits.last)),
            "{text}"
        );
    }

    #[test]
    fn one_step_past_the_limit_says_no_range_opens() {
        let mut snapshot = traced_run();
        let warning = size_warning(&mut snapshot, None, |_| 0, 10).expect("a warning");
        assert_eq!(warning.fits, None);
        assert!(warning
            .to_string()
            .ends_with("so no range of steps opens either"));
    }

    #[test]
    fn steps_numbered_for_the_suggestion_are_given_back() {
        let mut snapshot = traced_run();
        snapshot.events.iter_mut().for_each(|e| e.step = 0);
        snapshot.steps.clear();
        let limit = whole(&snapshot) / 2;
        let mut numbered = false;
        let warning = size_warning(
            &mut snapshot,
            None,
            |s| {
                numbered = true;
                let n = s.events.len();
                s.events
                    .iter_mut()
                    .enumerate()
                    .for_each(|(i, e)| e.step = (1 + i * 4 / n) as u32);
                4
            },
            limit,
        )
        .expect("a warning");
        assert!(numbered);
        assert_eq!(warning.fits.map(|f| f.first), Some(1));
        assert!(snapshot.events.iter().all(|e| e.step == 0));
        // A window was found on numbered steps: they are not numbered again.
        let window = Some(0..snapshot.events.len());
        let warning = size_warning(&mut snapshot, window, |_| panic!("numbered again"), limit);
        assert!(warning.is_some());
    }
}
