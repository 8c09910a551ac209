//! A min/max pyramid over the usage series: the lowest and highest allocated and reserved bytes
//! in any range of events in O(log n), so that a timeline column costs the same at ten million
//! events as at ten thousand.
//!
//! `crate::data::Dataset` keeps one [`Pyramid`] beside its usage series (the allocated and
//! reserved bytes after every event): built once when a file loads, extended as a live source
//! appends events, rebuilt when old events are dropped. Level `k` holds the extremes of every
//! bucket of `2^(BASE + k)` consecutive events; a range query scans at most `2^BASE - 1` events
//! at each end and takes whole buckets in between, at most two per level. The timeline of
//! `crate::ui::timeline` asks it, through `Dataset::usage_extremes`, for each column's highest
//! bytes. It knows nothing of the rest of the crate.

use vramscope_engine::{Usage, UsageSeries};

/// The lowest level's buckets hold `2^BASE` events: the pyramid takes two buckets of 32 bytes
/// per `2^BASE` events (10 MB at ten million events; 40 MB with buckets of 16, a tenth of the
/// dashboard's memory beyond the events on a replica of decomfl, issue 47) and a query scans
/// at most `2 * (2^BASE - 1)` events, 126, a fraction of a millisecond for a whole timeline.
const BASE: u32 = 6;

/// The higher of each figure of `a` and `b` (allocated and reserved bytes each on its own).
pub fn higher(a: Usage, b: Usage) -> Usage {
    Usage {
        allocated: a.allocated.max(b.allocated),
        reserved: a.reserved.max(b.reserved),
    }
}

/// The lowest and highest allocated and reserved bytes over some events (each figure on its
/// own: the highest allocated and the highest reserved may come from different events).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Extremes {
    /// The lowest allocated and reserved bytes.
    pub min: Usage,
    /// The highest allocated and reserved bytes.
    pub max: Usage,
}

impl Extremes {
    /// The extremes of one event's usage.
    pub fn from_usage(u: Usage) -> Extremes {
        Extremes { min: u, max: u }
    }

    /// The extremes of both ranges together.
    pub fn merge(self, other: Extremes) -> Extremes {
        Extremes {
            min: Usage {
                allocated: self.min.allocated.min(other.min.allocated),
                reserved: self.min.reserved.min(other.min.reserved),
            },
            max: higher(self.max, other.max),
        }
    }

    /// The extremes of `usage` by a plain scan; `None` when it is empty.
    pub fn scan(usage: impl IntoIterator<Item = Usage>) -> Option<Extremes> {
        let mut usage = usage.into_iter();
        let first = usage.next()?;
        Some(usage.fold(Extremes::from_usage(first), |e, u| {
            e.merge(Extremes::from_usage(u))
        }))
    }
}

/// The bucket levels over a usage series. See the module documentation.
#[derive(Clone, Debug, Default)]
pub struct Pyramid {
    /// `levels[k][i]`: the extremes of events `i * 2^(BASE + k)` up to the next bucket (or the
    /// end of the series, for the last bucket of a level).
    levels: Vec<Vec<Extremes>>,
    /// Events covered.
    len: usize,
}

impl Pyramid {
    /// The pyramid of `usage`, built bottom-up in one pass over it and one over each level.
    pub fn new(usage: &UsageSeries) -> Pyramid {
        let mut levels = Vec::new();
        let size = 1usize << BASE;
        let mut level: Vec<Extremes> = (0..usage.len().div_ceil(size))
            .filter_map(|bucket| Extremes::scan(usage.range(bucket * size, (bucket + 1) * size)))
            .collect();
        while level.len() > 1 {
            let up = level
                .chunks(2)
                .map(|pair| pair[1..].iter().fold(pair[0], |e, &f| e.merge(f)))
                .collect();
            levels.push(std::mem::replace(&mut level, up));
        }
        if !level.is_empty() {
            levels.push(level);
        }
        Pyramid {
            levels,
            len: usage.len(),
        }
    }

    /// Events covered.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it covers no event.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Takes in the usage after one more event: the bucket holding it at every level, and a
    /// new level on top when the old top bucket filled up. O(log n).
    pub fn push(&mut self, u: Usage) {
        let index = self.len;
        self.len += 1;
        let e = Extremes::from_usage(u);
        for (k, level) in self.levels.iter_mut().enumerate() {
            let bucket = index >> (BASE as usize + k);
            if bucket == level.len() {
                level.push(e);
            } else {
                level[bucket] = level[bucket].merge(e);
            }
        }
        match self.levels.last() {
            // The top has two buckets now: one more level joins them.
            Some(top) if top.len() == 2 => {
                let joined = top[0].merge(top[1]);
                self.levels.push(vec![joined]);
            }
            Some(_) => {}
            None => self.levels.push(vec![e]),
        }
    }

    /// The extremes of `usage[a..b]`, where `usage` is the series this pyramid covers; `None`
    /// for an empty range. At most `2 * (2^BASE - 1)` events are scanned, plus two buckets a
    /// level.
    pub fn range(&self, usage: &UsageSeries, a: usize, b: usize) -> Option<Extremes> {
        let b = b.min(self.len).min(usage.len());
        if a >= b {
            return None;
        }
        let size = 1usize << BASE;
        // Whole lowest-level buckets inside the range: [lo, hi).
        let lo = a.div_ceil(size);
        let hi = b / size;
        if lo >= hi {
            return Extremes::scan(usage.range(a, b));
        }
        let mut out = Extremes::scan(usage.range(a, lo * size));
        let mut add = |e: Extremes| out = Some(out.map_or(e, |o| o.merge(e)));
        if let Some(e) = Extremes::scan(usage.range(hi * size, b)) {
            add(e);
        }
        let (mut l, mut h) = (lo, hi);
        for level in &self.levels {
            if l >= h {
                break;
            }
            if l % 2 == 1 {
                add(level[l]);
                l += 1;
            }
            if h % 2 == 1 {
                h -= 1;
                add(level[h]);
            }
            l /= 2;
            h /= 2;
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::{Extremes, Pyramid, BASE};
    use vramscope_engine::{Usage, UsageSeries};

    /// A small random number generator (xorshift), so that every run checks the same ranges.
    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }

        fn below(&mut self, n: usize) -> usize {
            (self.next() % n.max(1) as u64) as usize
        }
    }

    /// A usage series that wanders up and down, as a trace's does.
    fn series(rng: &mut Rng, n: usize) -> Vec<Usage> {
        let (mut allocated, mut reserved) = (1u64 << 30, 1u64 << 31);
        (0..n)
            .map(|_| {
                allocated = allocated
                    .wrapping_add(rng.next() % 4096)
                    .wrapping_sub(2048)
                    .min(1 << 40);
                reserved = reserved.max(allocated) - rng.below(2) as u64 * 512;
                Usage {
                    allocated,
                    reserved,
                }
            })
            .collect()
    }

    /// Every length around the bucket and level boundaries, and random ones, each checked on
    /// random ranges (and every range for the short ones) against a plain scan.
    #[test]
    fn ranges_match_a_plain_scan() {
        let mut rng = Rng(0x2545_f491_4f6c_dd1d);
        let size = 1usize << BASE;
        let mut lengths: Vec<usize> = vec![0, 1, 2, size - 1, size, size + 1, 2 * size + 3];
        lengths.extend([7 * size, 64 * size - 1, 64 * size, 64 * size + 5]);
        lengths.extend((0..8).map(|_| rng.below(20_000)));
        for n in lengths {
            let usage = series(&mut rng, n);
            let kept: UsageSeries = usage.iter().copied().collect();
            let pyramid = Pyramid::new(&kept);
            assert_eq!(pyramid.len(), n);
            let check = |a: usize, b: usize| {
                let want = usage
                    .get(a..b)
                    .and_then(|range| Extremes::scan(range.iter().copied()));
                assert_eq!(pyramid.range(&kept, a, b), want, "n {n}, range {a}..{b}");
            };
            if n <= 2 * size + 3 {
                for a in 0..=n {
                    for b in 0..=n {
                        check(a, b);
                    }
                }
            } else {
                for _ in 0..2_000 {
                    let a = rng.below(n + 1);
                    let b = a + rng.below(n + 1 - a);
                    check(a, b);
                }
                check(0, n);
            }
        }
    }

    /// A pyramid grown one event at a time answers as one built from the whole series.
    #[test]
    fn pushing_equals_building() {
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        let usage = series(&mut rng, 5_000);
        let kept: UsageSeries = usage.iter().copied().collect();
        let mut grown = Pyramid::default();
        for (i, &u) in usage.iter().enumerate() {
            grown.push(u);
            let n = i + 1;
            if n % 97 == 0 || n < 3 * (1 << BASE) {
                let built = Pyramid::new(&usage[..n].iter().copied().collect());
                assert_eq!(grown.levels, built.levels, "after {n} events");
            }
        }
        for _ in 0..2_000 {
            let a = rng.below(usage.len() + 1);
            let b = a + rng.below(usage.len() + 1 - a);
            let want = Extremes::scan(usage[a..b].iter().copied());
            assert_eq!(grown.range(&kept, a, b), want, "range {a}..{b}");
        }
    }

    /// The extremes of a range are those of its events: a spike in the middle of a long range
    /// is the maximum, a dip the minimum.
    #[test]
    fn a_single_spike_is_found() {
        let flat = Usage {
            allocated: 100,
            reserved: 200,
        };
        let mut usage = vec![flat; 100_000];
        usage[54_321].allocated = 7_000;
        usage[12_345].reserved = 5;
        let usage: UsageSeries = usage.into_iter().collect();
        let pyramid = Pyramid::new(&usage);
        let e = pyramid.range(&usage, 3, 99_990).unwrap();
        assert_eq!(e.max.allocated, 7_000);
        assert_eq!(e.min.reserved, 5);
        assert_eq!(e.min.allocated, 100);
        assert_eq!(
            pyramid.range(&usage, 54_322, 99_990).unwrap().max.allocated,
            100
        );
    }
}
