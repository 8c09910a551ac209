//! The usage series: allocated and reserved bytes after every event of a trace, kept in four
//! or eight bytes an event rather than sixteen.
//!
//! [`Reconstruction`](crate::Reconstruction) fills a [`UsageSeries`] on its backward walk; the
//! inspector's `ModelView` reads its timeline and peaks from it, and the dashboard's dataset
//! keeps one that grows as a live source appends events and loses its front when old ones are
//! dropped. Allocated bytes change at almost every event, so they are kept for each: as a
//! count of 512-byte units in four bytes while every figure is such a multiple below 2 TiB
//! (PyTorch rounds every block to 512 bytes, so its traces' figures all are), in eight bytes
//! from the first figure that is not. Reserved bytes change only at segment events, so they
//! are kept as runs (`crate::runs`): the first event of each run and its figure. A PyTorch
//! trace costs about
//! four bytes an event, where a plain list cost sixteen; a trace where every event changes
//! reserved bytes (a replay of mappings only) costs up to twenty.

use crate::{Runs, Usage};

/// Allocated and reserved bytes after every event. See the module documentation.
#[derive(Clone, Debug, Default)]
pub struct UsageSeries {
    /// Allocated bytes after each event.
    allocated: Allocated,
    /// Reserved bytes after each event, as runs.
    reserved: Runs<u64>,
}

/// The bytes of one unit: PyTorch's rounding of every block (512 bytes).
const UNIT: u64 = vramscope_model::pytorch::MIN_BLOCK_SIZE;

/// Allocated bytes after each event, in the narrower form that holds them all.
#[derive(Clone, Debug)]
enum Allocated {
    /// Counts of [`UNIT`]s, while every figure is a multiple of it below 2 TiB.
    Units(Vec<u32>),
    /// Bytes.
    Bytes(Vec<u64>),
}

impl Default for Allocated {
    fn default() -> Allocated {
        Allocated::Units(Vec::new())
    }
}

impl Allocated {
    /// `bytes` as a count of units, when it is one that four bytes hold.
    fn units(bytes: u64) -> Option<u32> {
        if bytes.is_multiple_of(UNIT) {
            u32::try_from(bytes / UNIT).ok()
        } else {
            None
        }
    }

    fn len(&self) -> usize {
        match self {
            Allocated::Units(v) => v.len(),
            Allocated::Bytes(v) => v.len(),
        }
    }

    fn get(&self, i: usize) -> Option<u64> {
        match self {
            Allocated::Units(v) => v.get(i).map(|&u| u64::from(u) * UNIT),
            Allocated::Bytes(v) => v.get(i).copied(),
        }
    }

    /// The list in bytes, from here on: a figure the units cannot hold came.
    fn widen(&mut self) -> &mut Vec<u64> {
        if let Allocated::Units(v) = self {
            *self = Allocated::Bytes(v.iter().map(|&u| u64::from(u) * UNIT).collect());
        }
        match self {
            Allocated::Bytes(v) => v,
            Allocated::Units(_) => unreachable!("widened above"),
        }
    }

    fn set(&mut self, i: usize, bytes: u64) {
        match (&mut *self, Allocated::units(bytes)) {
            (Allocated::Units(v), Some(units)) => v[i] = units,
            (Allocated::Bytes(v), _) => v[i] = bytes,
            (Allocated::Units(_), None) => self.widen()[i] = bytes,
        }
    }

    fn push(&mut self, bytes: u64) {
        match (&mut *self, Allocated::units(bytes)) {
            (Allocated::Units(v), Some(units)) => v.push(units),
            (Allocated::Bytes(v), _) => v.push(bytes),
            (Allocated::Units(_), None) => self.widen().push(bytes),
        }
    }

    fn drop_front(&mut self, count: usize) {
        match self {
            Allocated::Units(v) => drop(v.drain(..count)),
            Allocated::Bytes(v) => drop(v.drain(..count)),
        }
    }
}

/// Two series are equal when they hold the same figures, however they keep them.
impl PartialEq for UsageSeries {
    fn eq(&self, other: &UsageSeries) -> bool {
        self.len() == other.len() && self.iter().eq(other.iter())
    }
}

impl Eq for UsageSeries {}

impl UsageSeries {
    /// An empty series.
    pub fn new() -> UsageSeries {
        UsageSeries::default()
    }

    /// A series of `len` events filled from the last to the first: `at(i)` is called for
    /// `i = len - 1` down to `0` and gives the usage after event `i`. The backward walk of
    /// [`Reconstruction`](crate::Reconstruction) makes the usage in that order.
    pub fn from_last(len: usize, mut at: impl FnMut(usize) -> Usage) -> UsageSeries {
        let mut allocated = Allocated::Units(vec![0; len]);
        let reserved = Runs::from_last(len, |i| {
            let u = at(i);
            allocated.set(i, u.allocated);
            u.reserved
        });
        UsageSeries {
            allocated,
            reserved,
        }
    }

    /// Events in the series.
    pub fn len(&self) -> usize {
        self.allocated.len()
    }

    /// Whether the series has no event.
    pub fn is_empty(&self) -> bool {
        self.allocated.len() == 0
    }

    /// The usage after event `i`, `None` past the last. O(log runs).
    pub fn get(&self, i: usize) -> Option<Usage> {
        Some(Usage {
            allocated: self.allocated.get(i)?,
            reserved: self.reserved.get(i)?,
        })
    }

    /// The usage after the last event.
    pub fn last(&self) -> Option<Usage> {
        self.len().checked_sub(1).and_then(|i| self.get(i))
    }

    /// Adds the usage after one more event.
    pub fn push(&mut self, u: Usage) {
        self.allocated.push(u.allocated);
        self.reserved.push(u.reserved);
    }

    /// Drops the first `count` events (all of them when `count` is past the end); the event
    /// that was `count` is event 0 afterwards.
    pub fn drop_front(&mut self, count: usize) {
        let count = count.min(self.len());
        self.allocated.drop_front(count);
        self.reserved.drop_front(count);
    }

    /// The usage after events `a..b` (clamped to the series), in order. O(log runs) to
    /// start, then O(1) an event.
    pub fn range(&self, a: usize, b: usize) -> impl Iterator<Item = Usage> + '_ {
        let b = b.min(self.len());
        let a = a.min(b);
        self.reserved
            .range(a, b)
            .zip(a..b)
            .map(|(reserved, i)| Usage {
                allocated: self.allocated.get(i).unwrap_or(0),
                reserved,
            })
    }

    /// The usage after every event, in order.
    pub fn iter(&self) -> impl Iterator<Item = Usage> + '_ {
        self.range(0, self.len())
    }
}

impl FromIterator<Usage> for UsageSeries {
    fn from_iter<I: IntoIterator<Item = Usage>>(iter: I) -> UsageSeries {
        let mut series = UsageSeries::new();
        for u in iter {
            series.push(u);
        }
        series
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn usage(allocated: u64, reserved: u64) -> Usage {
        Usage {
            allocated,
            reserved,
        }
    }

    /// A series with runs of reserved bytes of several lengths, one event long included.
    fn sample() -> Vec<Usage> {
        let reserved = [2, 2, 2, 4, 4, 1, 9, 9, 9, 9, 3];
        reserved
            .iter()
            .enumerate()
            .map(|(i, &r)| usage(i as u64 * 10, r))
            .collect()
    }

    #[test]
    fn reads_back_what_was_pushed_and_what_was_filled_from_the_last() {
        let plain = sample();
        let pushed: UsageSeries = plain.iter().copied().collect();
        let filled = UsageSeries::from_last(plain.len(), |i| plain[i]);
        assert_eq!(pushed, filled, "both ways make the same runs");
        for (i, u) in plain.iter().enumerate() {
            assert_eq!(pushed.get(i), Some(*u), "at {i}");
        }
        assert_eq!(pushed.get(plain.len()), None);
        assert_eq!(pushed.iter().collect::<Vec<_>>(), plain);
        assert_eq!(pushed.last(), plain.last().copied());
        assert_eq!(
            pushed.reserved.starts,
            vec![0, 3, 5, 6, 10],
            "one entry a run"
        );
        for a in 0..=plain.len() {
            for b in a..=plain.len() + 2 {
                let want: Vec<Usage> = plain[a..b.min(plain.len())].to_vec();
                assert_eq!(pushed.range(a, b).collect::<Vec<_>>(), want, "{a}..{b}");
            }
        }
    }

    #[test]
    fn dropping_the_front_keeps_every_later_figure() {
        let plain = sample();
        for count in 0..=plain.len() + 1 {
            let mut series: UsageSeries = plain.iter().copied().collect();
            series.drop_front(count);
            let rest = &plain[count.min(plain.len())..];
            assert_eq!(series.iter().collect::<Vec<_>>(), rest, "after {count}");
            let fresh: UsageSeries = rest.iter().copied().collect();
            assert_eq!(
                series, fresh,
                "the same runs as a series of the rest, after {count}"
            );
            series.push(usage(1, 1));
            assert_eq!(series.last(), Some(usage(1, 1)));
        }
    }

    /// Figures in 512-byte units up to 2 TiB are kept in four bytes; the first figure that is
    /// not (an odd size, or more) widens the series, and every figure reads back either way,
    /// filled from the last or pushed.
    #[test]
    fn units_widen_to_bytes_at_the_first_figure_they_cannot_hold() {
        let top = u64::from(u32::MAX) * UNIT;
        for odd in [top + UNIT, 1000, 3 << 40] {
            let plain: Vec<Usage> = [512, 1024, top, 0, odd, 2048, odd + 1]
                .iter()
                .enumerate()
                .map(|(i, &a)| usage(a, i as u64 / 3))
                .collect();
            let pushed: UsageSeries = plain.iter().copied().collect();
            let filled = UsageSeries::from_last(plain.len(), |i| plain[i]);
            for series in [&pushed, &filled] {
                assert!(matches!(series.allocated, Allocated::Bytes(_)), "{odd}");
                assert_eq!(series.iter().collect::<Vec<_>>(), plain, "{odd}");
            }
            let before: UsageSeries = plain[..4].iter().copied().collect();
            assert!(matches!(before.allocated, Allocated::Units(_)));
            assert_eq!(before.iter().collect::<Vec<_>>(), plain[..4]);
            let mut dropped = pushed.clone();
            dropped.drop_front(5);
            assert_eq!(dropped.iter().collect::<Vec<_>>(), plain[5..], "{odd}");
        }
    }

    #[test]
    fn an_empty_series_has_nothing() {
        let series = UsageSeries::from_last(0, |_| unreachable!());
        assert!(series.is_empty());
        assert_eq!(series.get(0), None);
        assert_eq!(series.last(), None);
        assert_eq!(series.iter().count(), 0);
    }
}
