//! The event log's rows: the indices of the events that pass its kind and text filters, kept
//! from frame to frame and redone only as far as a change needs.
//!
//! The list costs a pass over every event (ten million in a big trace), so `App::prepare`
//! (in `crate::app::prepare`) keeps it in the `crate::view::CursorView` with the [`RowsKey`] it
//! was computed for, and [`rows`] reuses it: as it is when nothing changed (moving the time
//! cursor or the selected row never touches it), extended by the new events when a live source
//! appended some, narrowed (one pass over the list, not the events) when the filter only got
//! stricter, as typing a filter does, and computed afresh otherwise. A reload, dropped old
//! events and new call-site tables change `crate::data::Dataset::epoch`, which starts afresh.

use crate::data::Dataset;
use crate::view::KindFilter;

/// What a list of event rows was computed from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RowsKey {
    /// The kind filter.
    pub kind: KindFilter,
    /// The text filter, in lower case.
    pub filter: String,
    /// The dataset's epoch (`crate::data::Dataset::epoch`).
    pub epoch: u64,
    /// Events the list covers: `0..len`.
    pub len: usize,
}

impl RowsKey {
    /// The key of the list the event log needs now.
    pub fn new(kind: KindFilter, filter: &str, data: &Dataset) -> RowsKey {
        RowsKey {
            kind,
            filter: filter.to_lowercase(),
            epoch: data.epoch(),
            len: data.len(),
        }
    }

    /// Whether every event passing this key's filters passes `old`'s as well, so that its
    /// rows are among `old`'s: the same kinds or fewer, and a text that contains the old one.
    fn within(&self, old: &RowsKey) -> bool {
        (old.kind == self.kind || old.kind == KindFilter::All) && self.filter.contains(&old.filter)
    }
}

/// The test of one event against a key's filters.
struct Filter<'a> {
    key: &'a RowsKey,
    data: &'a Dataset,
    /// For each call-site group, whether its label or function contains the text (empty
    /// without a text filter).
    site_match: Vec<bool>,
}

impl<'a> Filter<'a> {
    fn new(key: &'a RowsKey, data: &'a Dataset) -> Filter<'a> {
        let site_match = if key.filter.is_empty() {
            Vec::new()
        } else {
            data.groups()
                .all()
                .iter()
                .map(|g| {
                    g.label().to_lowercase().contains(&key.filter)
                        || g.function.to_lowercase().contains(&key.filter)
                })
                .collect()
        };
        Filter {
            key,
            data,
            site_match,
        }
    }

    /// Whether event `i` passes: its kind from the dataset's column of kinds, and only for a
    /// text filter the event itself.
    fn passes(&self, i: usize) -> bool {
        let kind = self.data.kinds()[i];
        self.key.kind.accepts(kind)
            && (self.key.filter.is_empty()
                || kind.name().contains(&self.key.filter)
                || self
                    .site_match
                    .get(self.data.groups().group_of(self.data.events()[i].site()) as usize)
                    .copied()
                    .unwrap_or(false))
    }

    /// Appends the indices of the events `from..` that pass.
    fn extend(&self, rows: &mut Vec<u32>, from: usize) {
        let len = self.data.kinds().len();
        let from = from.min(len);
        if self.key.kind == KindFilter::All && self.key.filter.is_empty() {
            // Every event passes: no need to look at them.
            rows.extend(from as u32..len as u32);
        } else {
            extend_filtered(rows, from..len, |i| self.passes(i));
        }
    }
}

/// Events (or rows) past which a pass over them is split across the machine's cores: a new
/// kind filter on ten million events took 33 ms on one core, past a frame's 16 (issue 47).
const PARALLEL_FROM: usize = 1 << 20;

/// How many parts a pass over `len` events or rows is split into: one below
/// [`PARALLEL_FROM`], else one per core (up to 8).
fn parts_for(len: usize) -> usize {
    if len < PARALLEL_FROM {
        1
    } else {
        std::thread::available_parallelism().map_or(1, |n| n.get().min(8))
    }
}

/// Runs every job of `jobs` and gives back what each returned, in order: the first on this
/// thread, the others on threads of their own, or on this one where none could be started.
fn run_all<T: Send, F: FnOnce() -> T + Send>(jobs: Vec<F>) -> Vec<T> {
    let slots: Vec<std::sync::Mutex<Option<F>>> = jobs
        .into_iter()
        .map(|job| std::sync::Mutex::new(Some(job)))
        .collect();
    let run = |k: usize| {
        let job = slots[k]
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .take();
        job.map(|job| job())
    };
    let run = &run;
    if slots.is_empty() {
        return Vec::new();
    }
    let done: Vec<Option<T>> = std::thread::scope(|scope| {
        let handles: Vec<_> = (1..slots.len())
            .map(|k| {
                std::thread::Builder::new()
                    .name(format!("vramscope-rows-{k}"))
                    .spawn_scoped(scope, move || run(k))
                    .ok()
            })
            .collect();
        let mut done = vec![run(0)];
        for handle in handles {
            done.push(handle.and_then(|h| {
                h.join()
                    .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
            }));
        }
        done
    });
    done.into_iter()
        .enumerate()
        .map(|(k, result)| match result {
            Some(result) => result,
            // Its thread never started: the job is still in its slot.
            None => run(k).expect("a job runs once"),
        })
        .collect()
}

/// The parts of `range` for [`parts_for`] of its length, in order.
fn split(range: std::ops::Range<usize>) -> Vec<std::ops::Range<usize>> {
    let len = range.len();
    let chunk = len.div_ceil(parts_for(len)).max(1);
    (0..len.div_ceil(chunk))
        .map(|k| range.start + k * chunk..range.start + ((k + 1) * chunk).min(len))
        .collect()
}

/// Appends to `rows` the events of `range` that `keep` keeps, in order. A long range is
/// counted part by part on every core, then each part writes its rows into its own place of
/// `rows`, so that the list is the one a single pass makes, in the memory it already holds.
fn extend_filtered(
    rows: &mut Vec<u32>,
    range: std::ops::Range<usize>,
    keep: impl Fn(usize) -> bool + Sync,
) {
    let parts = split(range.clone());
    if parts.len() <= 1 {
        rows.extend(range.filter(|&i| keep(i)).map(|i| i as u32));
        return;
    }
    let keep = &keep;
    let counts = run_all(
        parts
            .iter()
            .map(|part| {
                let part = part.clone();
                move || part.filter(|&i| keep(i)).count()
            })
            .collect(),
    );
    let base = rows.len();
    rows.resize(base + counts.iter().sum::<usize>(), 0);
    let mut places = Vec::with_capacity(parts.len());
    let mut rest = &mut rows[base..];
    for &count in &counts {
        let (place, after) = rest.split_at_mut(count);
        places.push(place);
        rest = after;
    }
    run_all(
        parts
            .into_iter()
            .zip(places)
            .map(|(part, place)| {
                move || {
                    for (slot, i) in place.iter_mut().zip(part.filter(|&i| keep(i))) {
                        *slot = i as u32;
                    }
                }
            })
            .collect(),
    );
}

/// Keeps the rows of `rows` that `keep` keeps, in order, in place: a long list is narrowed
/// part by part on every core, each part to its front, and the parts' rows are then moved
/// together.
fn retain_filtered(rows: &mut Vec<u32>, keep: impl Fn(u32) -> bool + Sync) {
    let parts = split(0..rows.len());
    if parts.len() <= 1 {
        rows.retain(|&i| keep(i));
        return;
    }
    let keep = &keep;
    let chunk = parts[0].len();
    let kept = run_all(
        rows.chunks_mut(chunk)
            .map(|part| {
                move || {
                    let mut kept = 0;
                    for k in 0..part.len() {
                        if keep(part[k]) {
                            part[kept] = part[k];
                            kept += 1;
                        }
                    }
                    kept
                }
            })
            .collect(),
    );
    let mut write = 0;
    for (k, &count) in kept.iter().enumerate() {
        let start = k * chunk;
        rows.copy_within(start..start + count, write);
        write += count;
    }
    rows.truncate(write);
}

/// The rows for `key`, made from `old` (the rows for `old_key`) where that saves work. See the
/// module documentation.
pub fn rows(data: &Dataset, old: Vec<u32>, old_key: Option<&RowsKey>, key: &RowsKey) -> Vec<u32> {
    let filter = Filter::new(key, data);
    match old_key {
        Some(o) if o.epoch == key.epoch && o.len <= key.len && key.within(o) => {
            let mut rows = old;
            if o.kind != key.kind || o.filter != key.filter {
                retain_filtered(&mut rows, |i| filter.passes(i as usize));
            }
            filter.extend(&mut rows, o.len);
            rows
        }
        _ => {
            let mut rows = old;
            rows.clear();
            filter.extend(&mut rows, 0);
            rows
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{rows, RowsKey};
    use crate::data::{Dataset, Origin};
    use crate::view::KindFilter;
    use vramscope_testkit::fixture;

    /// The rows by a plain pass over every event.
    fn plain(data: &Dataset, kind: KindFilter, filter: &str) -> Vec<u32> {
        let key = RowsKey::new(kind, filter, data);
        rows(data, Vec::new(), None, &key)
    }

    /// Typing a filter a character at a time, changing the kind, clearing the text and events
    /// arriving in between: the kept list is always the one a plain pass gives.
    #[test]
    fn kept_rows_are_the_rows_of_a_plain_pass() {
        let full = fixture::training_snapshot();
        let cut = full.events.len() / 2;
        let mut first = full.clone();
        first.events.truncate(cut);
        let mut data = Dataset::new(first, Origin::Live("test".into()));
        let mut list = Vec::new();
        let mut key: Option<RowsKey> = None;
        let mut step = |data: &Dataset, kind: KindFilter, filter: &str| {
            let new = RowsKey::new(kind, filter, data);
            list = rows(data, std::mem::take(&mut list), key.as_ref(), &new);
            key = Some(new);
            assert_eq!(
                list,
                plain(data, kind, filter),
                "kind {kind:?}, filter {filter:?}"
            );
            list.len()
        };
        let all = step(&data, KindFilter::All, "");
        assert_eq!(all, data.len());
        let mut typed = String::new();
        let mut counts = Vec::new();
        for c in "ALLOC".chars() {
            typed.push(c);
            counts.push(step(&data, KindFilter::All, &typed));
        }
        // Each character narrows the list, and the whole word leaves some events out.
        assert!(counts.windows(2).all(|w| w[1] <= w[0]), "{counts:?}");
        assert!(counts[4] > 0 && counts[4] < all, "{counts:?} of {all}");
        data.append(&full.events[cut..cut + 100]);
        step(&data, KindFilter::All, &typed);
        step(&data, KindFilter::Blocks, &typed);
        step(&data, KindFilter::Blocks, "");
        data.append(&full.events[cut + 100..]);
        step(&data, KindFilter::Blocks, "");
        let steps = step(&data, KindFilter::Steps, "");
        assert!(steps > 0);
        step(&data, KindFilter::Steps, "train");
        step(&data, KindFilter::All, "");
        data.trim_front(50);
        assert_eq!(step(&data, KindFilter::All, ""), data.len());
    }

    /// Passes split across threads keep what one pass over the whole keeps, in order,
    /// whatever the number of threads and wherever the kept rows fall (the parts end mid-run,
    /// some keep nothing), appending after rows already there and narrowing in place.
    #[test]
    fn a_split_pass_keeps_what_one_pass_keeps() {
        let len = 3 * super::PARALLEL_FROM + 7;
        assert!(super::split(0..len).iter().map(|r| r.len()).sum::<usize>() == len);
        for every in [1usize, 7, 1_000_003, len] {
            let keep = |i: usize| i % every == every / 2;
            let one: Vec<u32> = (0..len).filter(|&i| keep(i)).map(|i| i as u32).collect();
            let mut rows = vec![u32::MAX; 3];
            super::extend_filtered(&mut rows, 5..len, keep);
            let expected: Vec<u32> = [u32::MAX; 3]
                .into_iter()
                .chain(one.iter().copied().filter(|&i| i >= 5))
                .collect();
            assert_eq!(rows, expected, "extend, every {every}");
            let mut all: Vec<u32> = (0..len as u32).collect();
            super::retain_filtered(&mut all, |i| keep(i as usize));
            assert_eq!(all, one, "retain, every {every}");
        }
    }

    /// A stricter filter narrows the kept list; one that is not starts afresh.
    #[test]
    fn only_a_stricter_filter_narrows() {
        let data = Dataset::new(fixture::training_snapshot(), Origin::File("t".into()));
        let key = |kind, filter: &str| RowsKey::new(kind, filter, &data);
        assert!(key(KindFilter::Blocks, "ab").within(&key(KindFilter::All, "a")));
        assert!(key(KindFilter::Blocks, "xaby").within(&key(KindFilter::Blocks, "ab")));
        assert!(!key(KindFilter::Blocks, "a").within(&key(KindFilter::Steps, "a")));
        assert!(!key(KindFilter::All, "a").within(&key(KindFilter::Blocks, "a")));
        assert!(!key(KindFilter::All, "b").within(&key(KindFilter::All, "ab")));
        // A list given for a key it does not belong to is not trusted beyond what the key says:
        // the same filters with another epoch are computed afresh.
        let mut stale = key(KindFilter::All, "");
        stale.epoch += 1;
        let fresh = key(KindFilter::All, "");
        assert_eq!(rows(&data, vec![7], Some(&stale), &fresh).len(), data.len());
    }
}
