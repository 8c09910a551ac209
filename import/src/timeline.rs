//! Shared helpers of the importers for what happens over time: numbering training steps and
//! reading a trace's clock.
//!
//! `pytorch` and `chrome` both end with a list of `Event`s (the model of
//! `vramscope_model`) and a set of step starts, found by time (annotations,
//! profiler slices) or by event (a step-marker function). [`assign_steps_by_time`] and
//! [`assign_steps_at`] fill every event's `step` and build `Snapshot::steps`. The statistics
//! replayed over a trace are the engine's (`vramscope_engine::stats`).

use vramscope_model::{step_after, Event, StepMark};

/// Numbers steps from start times: each `(time_ns, label)` begins a step; an event belongs to
/// the last step that began at or before its time (step 0 before the first). Returns the
/// step marks, numbered from 1 in time order.
pub(crate) fn assign_steps_by_time(
    events: &mut [Event],
    mut starts: Vec<(u64, String)>,
) -> Vec<StepMark> {
    starts.sort_by_key(|(t, _)| *t);
    let times: Vec<u64> = starts.iter().map(|(t, _)| *t).collect();
    let mut firsts = FirstEvents::new(starts.len());
    // Events usually come in time order, mostly within one step: the step of the one before
    // is where the next one's is looked for, found at once when the next start is still ahead,
    // else searched for after it; a time that goes back is searched for from the first start.
    let mut at = 0;
    let mut last_time = 0;
    for event in events.iter_mut() {
        let t = event.time_ns;
        if t < last_time {
            at = times.partition_point(|&s| s <= t);
        } else if times.get(at).is_some_and(|&s| s <= t) {
            at += times[at..].partition_point(|&s| s <= t);
        }
        last_time = t;
        event.step = step_after(at);
        firsts.note(event);
    }
    firsts.marks(events, starts)
}

/// Numbers steps from event positions: each `(index, label)` (an index into `events`, in
/// increasing order) begins a step at that event.
pub(crate) fn assign_steps_at(events: &mut [Event], starts: Vec<(usize, String)>) -> Vec<StepMark> {
    let mut next = starts.iter().map(|(i, _)| *i).peekable();
    let mut step = 0;
    let mut firsts = FirstEvents::new(starts.len());
    for (i, event) in events.iter_mut().enumerate() {
        while next.peek() == Some(&i) {
            next.next();
            step += 1;
        }
        event.step = step_after(step);
        firsts.note(event);
    }
    let with_times = starts
        .into_iter()
        .map(|(i, label)| (events.get(i).map(|e| e.time_ns).unwrap_or(0), label))
        .collect();
    firsts.marks(events, with_times)
}

/// The first event of each step, noted as the steps are given out, for the step marks.
struct FirstEvents {
    /// The lowest `seq` of each step number (`u64::MAX` for none); the last slot collects
    /// steps past the marks.
    first: Vec<u64>,
}

impl FirstEvents {
    fn new(marks: usize) -> FirstEvents {
        FirstEvents {
            first: vec![u64::MAX; marks + 2],
        }
    }

    /// Notes `event`, which has its step.
    fn note(&mut self, event: &Event) {
        let s = (event.step as usize).min(self.first.len() - 1);
        self.first[s] = self.first[s].min(event.seq);
    }

    /// The step marks once every event has its step: a step's `seq` is the first event of
    /// that step or a later one (one past the last event when none follows).
    fn marks(mut self, events: &[Event], starts: Vec<(u64, String)>) -> Vec<StepMark> {
        let n = starts.len();
        let end = events.last().map(|e| e.seq + 1).unwrap_or(0);
        let first = &mut self.first;
        for s in (0..=n).rev() {
            first[s] = first[s].min(first[s + 1]);
        }
        starts
            .into_iter()
            .enumerate()
            .map(|(k, (time_ns, label))| StepMark {
                step: k as u64 + 1,
                seq: if first[k + 1] == u64::MAX {
                    end
                } else {
                    first[k + 1]
                },
                time_ns,
                label,
            })
            .collect()
    }
}

/// Microseconds of 2000-01-01 since the Unix epoch: earlier times are taken to be relative
/// to some other clock.
const UNIX_2000_US: f64 = 946_684_800_000_000.0;

/// The Unix time in nanoseconds of a time given in microseconds, or 0 when the time does not
/// look like a Unix time (it is before the year 2000, or not finite).
pub(crate) fn unix_epoch_ns(us: f64) -> u64 {
    if !(us.is_finite() && us >= UNIX_2000_US) {
        return 0;
    }
    let whole = us.trunc();
    let fraction_ns = ((us - whole) * 1000.0).round() as u64;
    (whole as u64)
        .saturating_mul(1000)
        .saturating_add(fraction_ns)
}

#[cfg(test)]
mod tests {
    use super::*;
    use vramscope_model::EventKind;

    fn event(seq: u64, time_ns: u64) -> Event {
        Event {
            seq,
            time_ns,
            kind: EventKind::Alloc,
            device: 0,
            stream: 0,
            addr: 0,
            size: 0,
            requested: 0,
            site: None,
            tag: None,
            scope: None,
            step: 0,
            thread: 0,
            device_free: 0,
        }
    }

    #[test]
    fn steps_by_time() {
        let mut events: Vec<Event> = (0..6).map(|i| event(i, i * 10)).collect();
        let marks = assign_steps_by_time(
            &mut events,
            vec![
                (25, "b".to_string()),
                (10, "a".to_string()),
                (500, "c".into()),
            ],
        );
        let steps: Vec<u32> = events.iter().map(|e| e.step).collect();
        assert_eq!(steps, vec![0, 1, 1, 2, 2, 2]);
        assert_eq!(marks.len(), 3);
        assert_eq!(
            (marks[0].step, marks[0].seq, marks[0].label.as_str()),
            (1, 1, "a")
        );
        assert_eq!((marks[1].step, marks[1].seq), (2, 3));
        assert_eq!((marks[2].step, marks[2].seq), (3, 6));
    }

    /// Times that go back (threads, clocks) get the step their own time falls in, as a search
    /// of every event would give, before and after the step search resumes going forwards.
    #[test]
    fn steps_by_time_when_times_go_back() {
        let times = [5, 15, 3, 25, 25, 12, 10, 30, 0, 20];
        let mut events: Vec<Event> = times
            .iter()
            .enumerate()
            .map(|(i, &t)| event(i as u64, t))
            .collect();
        let starts = [10, 20];
        let marks = assign_steps_by_time(
            &mut events,
            starts.iter().map(|&t| (t, "s".to_string())).collect(),
        );
        let expected: Vec<u32> = times
            .iter()
            .map(|&t| starts.iter().filter(|&&s| s <= t).count() as u32)
            .collect();
        let steps: Vec<u32> = events.iter().map(|e| e.step).collect();
        assert_eq!(steps, expected);
        assert_eq!(steps, [0, 1, 0, 2, 2, 1, 1, 2, 0, 2]);
        // Each mark names the first event of its step or a later one.
        assert_eq!((marks[0].seq, marks[1].seq), (1, 3));
    }

    #[test]
    fn steps_at_events() {
        let mut events: Vec<Event> = (0..5).map(|i| event(i, i * 10)).collect();
        let marks = assign_steps_at(&mut events, vec![(1, "x".into()), (3, "x".into())]);
        let steps: Vec<u32> = events.iter().map(|e| e.step).collect();
        assert_eq!(steps, vec![0, 1, 1, 2, 2]);
        assert_eq!(marks[1].seq, 3);
        assert_eq!(marks[1].time_ns, 30);
    }

    #[test]
    fn unix_epochs() {
        assert_eq!(
            unix_epoch_ns(1_763_324_225_770_003.0),
            1_763_324_225_770_003_000
        );
        assert_eq!(
            unix_epoch_ns(1_669_783_687_464_300.5),
            1_669_783_687_464_300_500
        );
        assert_eq!(unix_epoch_ns(12.0), 0);
        assert_eq!(unix_epoch_ns(f64::NAN), 0);
    }
}
