//! A figure per event kept as runs: where a figure stays the same over many events, a list
//! holds one entry a run instead of one an event.
//!
//! [`UsageSeries`](crate::UsageSeries) keeps the reserved bytes after every event this way
//! (they change only at segment events), and the inspector's `ModelView` keeps the step index
//! of every event (events come a step at a time), so that a trace of millions of events costs
//! as many entries as runs.

/// A value per position, kept as runs of equal values: the first position of each run and its
/// value. Positions are `u32`, as the engine numbers events.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Runs<T> {
    /// The first position of each run, in increasing order; the first run starts at 0
    /// whenever there is one.
    pub(crate) starts: Vec<u32>,
    /// The value of each run; two runs side by side never have the same value.
    values: Vec<T>,
    /// Positions held.
    len: usize,
}

impl<T> Default for Runs<T> {
    fn default() -> Runs<T> {
        Runs {
            starts: Vec::new(),
            values: Vec::new(),
            len: 0,
        }
    }
}

impl<T: Copy + PartialEq> Runs<T> {
    /// No position.
    pub fn new() -> Runs<T> {
        Runs::default()
    }

    /// `len` positions filled from the last to the first: `at(i)` is called for
    /// `i = len - 1` down to `0` and gives the value at `i` (the order of a backward walk).
    pub fn from_last(len: usize, mut at: impl FnMut(usize) -> T) -> Runs<T> {
        // Runs are found back to front and put in order at the end.
        let mut runs: Vec<(u32, T)> = Vec::new();
        let mut later: Option<T> = None;
        for i in (0..len).rev() {
            let value = at(i);
            if let Some(v) = later.filter(|&v| v != value) {
                runs.push((position(i + 1), v));
            }
            later = Some(value);
        }
        if let Some(v) = later {
            runs.push((0, v));
        }
        runs.reverse();
        let (starts, values) = runs.into_iter().unzip();
        Runs {
            starts,
            values,
            len,
        }
    }

    /// Positions held.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no position is held.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The value at the next position.
    pub fn push(&mut self, value: T) {
        if self.values.last() != Some(&value) {
            self.starts.push(position(self.len));
            self.values.push(value);
        }
        self.len += 1;
    }

    /// The value at position `i`, `None` past the last. O(log runs).
    pub fn get(&self, i: usize) -> Option<T> {
        if i >= self.len {
            return None;
        }
        self.values.get(self.run_of(i)).copied()
    }

    /// The value at the last position.
    pub fn last(&self) -> Option<T> {
        self.values.last().copied()
    }

    /// The values at positions `a..b` (clamped to those held), in order. O(log runs) to
    /// start, then O(1) a position.
    pub fn range(&self, a: usize, b: usize) -> impl Iterator<Item = T> + '_ {
        let b = b.min(self.len);
        let a = a.min(b);
        let mut run = self.run_of(a);
        (a..b).map(move |i| {
            while self
                .starts
                .get(run + 1)
                .is_some_and(|&next| next as usize <= i)
            {
                run += 1;
            }
            self.values[run]
        })
    }

    /// Drops the first `count` positions (all of them when `count` is past the last); the
    /// position that was `count` is 0 afterwards.
    pub fn drop_front(&mut self, count: usize) {
        let count = count.min(self.len);
        if count == 0 {
            return;
        }
        self.len -= count;
        if self.len == 0 {
            self.starts.clear();
            self.values.clear();
            return;
        }
        // The run that holds the new first position starts there; earlier runs go.
        let keep_from = self.run_of(count);
        self.starts.drain(..keep_from);
        self.values.drain(..keep_from);
        let shift = position(count);
        for start in &mut self.starts {
            *start = start.saturating_sub(shift);
        }
    }

    /// The run that holds position `i` (the last run past the end; 0 when there is none).
    fn run_of(&self, i: usize) -> usize {
        self.starts
            .partition_point(|&start| start as usize <= i)
            .saturating_sub(1)
    }
}

/// A position as a run start holds it: a trace has fewer than 2^32 events (the importers'
/// limits refuse more long before), and the engine numbers events in `u32`.
fn position(i: usize) -> u32 {
    u32::try_from(i).unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    const PLAIN: [u32; 11] = [2, 2, 2, 4, 4, 1, 9, 9, 9, 9, 3];

    fn pushed(values: &[u32]) -> Runs<u32> {
        let mut runs = Runs::new();
        for &v in values {
            runs.push(v);
        }
        runs
    }

    #[test]
    fn reads_back_what_was_pushed_and_what_was_filled_from_the_last() {
        let runs = pushed(&PLAIN);
        assert_eq!(runs, Runs::from_last(PLAIN.len(), |i| PLAIN[i]));
        assert_eq!(runs.len(), PLAIN.len());
        assert_eq!(runs.starts, vec![0, 3, 5, 6, 10], "one entry a run");
        // Step indices as the model view keeps them: a value may come back after others.
        let steps = pushed(&[0, 0, 0, 1, 1, 2, 0, 0, 5]);
        assert_eq!(steps.starts, vec![0, 3, 5, 6, 8], "one entry a run");
        for (i, &v) in PLAIN.iter().enumerate() {
            assert_eq!(runs.get(i), Some(v), "at {i}");
        }
        assert_eq!(runs.get(PLAIN.len()), None);
        assert_eq!(runs.last(), Some(3));
        for a in 0..=PLAIN.len() {
            for b in a..=PLAIN.len() + 2 {
                let want = PLAIN[a..b.min(PLAIN.len())].to_vec();
                assert_eq!(runs.range(a, b).collect::<Vec<_>>(), want, "{a}..{b}");
            }
        }
    }

    #[test]
    fn dropping_the_front_keeps_every_later_value() {
        for count in 0..=PLAIN.len() + 1 {
            let mut runs = pushed(&PLAIN);
            runs.drop_front(count);
            let rest = &PLAIN[count.min(PLAIN.len())..];
            assert_eq!(runs.range(0, usize::MAX).collect::<Vec<_>>(), rest);
            assert_eq!(runs, pushed(rest), "the runs of the rest, after {count}");
            runs.push(7);
            assert_eq!(runs.last(), Some(7));
        }
    }

    #[test]
    fn no_position_has_nothing() {
        let runs: Runs<u32> = Runs::from_last(0, |_| unreachable!());
        assert!(runs.is_empty());
        assert_eq!(runs.get(0), None);
        assert_eq!(runs.last(), None);
        assert_eq!(runs.range(0, 5).count(), 0);
    }
}
