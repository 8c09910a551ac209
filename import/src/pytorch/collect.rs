//! The second core's share of a streamed import. `super::stream` converts each trace entry
//! into an event on the parsing thread and hands the events over in batches ([`EventOut`]);
//! a second thread gathers them into the trace's event list, notes their earliest time, pairs
//! them (`vramscope_engine::PairedEvents`) and notes the last allocation at each address
//! ([`Collected`]) while the parser goes on with the next entries.
//!
//! `super::finish` takes the pairs for the block sizing and the last allocations for the
//! segments' live blocks where the events' order is final: when only one device's trace has
//! entries. The events of several devices' traces are merged by time afterwards, which
//! changes their order: then `super::finish` leaves what the collector made (which stops
//! pairing at the first event of a second device) and works both out from the merged events,
//! as after a whole-document import. Either way the snapshot is the same; the thread only
//! moves work off the parser's core.

use std::sync::mpsc::{self, Receiver, SyncSender};

use vramscope_engine::{AddrMap, PairedEvents};
use vramscope_model::{Event, EventKind};

use super::note_time;

/// Events in a batch: 320 KiB, which stays in the parser's cache until it is handed over.
const BATCH: usize = 4096;
/// Batches waiting in the channel, at most, before the parser waits (besides the one being
/// collected). The batches in flight (one being filled, these, one being collected) are
/// memory the import holds beside the events: at most 1.25 MiB, where eight waiting batches
/// of 640 KiB could make 6.25 MiB.
const QUEUE: usize = 2;

/// What the collector made of the events, in the order they were converted.
pub(super) struct Collected {
    /// Every event, its time not yet relative (see `super::read_entry`).
    pub(super) events: Vec<Event>,
    /// The earliest of their times (`super::note_time`).
    pub(super) earliest_us: Option<u64>,
    /// The pairs and last allocations, while every event so far is on one device.
    pub(super) one_device: Option<OneDevice>,
    /// The device of the first event.
    device: Option<u16>,
}

/// What the collector works out while every event is on one device.
pub(super) struct OneDevice {
    /// Every event paired, in order.
    pub(super) paired: PairedEvents,
    /// The index of the last allocation at each address (keyed by the file's addresses, so
    /// seeded per process: `vramscope_engine::AddrMap`).
    pub(super) last_alloc: AddrMap<u32>,
}

impl Collected {
    fn new() -> Collected {
        Collected {
            events: Vec::new(),
            earliest_us: None,
            one_device: Some(OneDevice {
                paired: PairedEvents::with_capacity(0),
                last_alloc: AddrMap::default(),
            }),
            device: None,
        }
    }

    /// Adds `batch`, the next events.
    fn push(&mut self, batch: &[Event]) {
        let first = self.events.len();
        self.events.extend_from_slice(batch);
        for e in batch {
            note_time(&mut self.earliest_us, e);
        }
        let Some(one) = &mut self.one_device else {
            return;
        };
        let device = *self
            .device
            .get_or_insert(batch.first().map_or(0, |e| e.device));
        for (k, e) in batch.iter().enumerate() {
            if e.device != device {
                self.one_device = None;
                return;
            }
            // The entry limit keeps a trace's events far below 2^32 (`max_trace_entries`).
            let index = (first + k) as u32;
            one.paired.push(index, e);
            if e.kind == EventKind::Alloc {
                one.last_alloc.insert(e.addr, index);
            }
        }
    }
}

/// Where the parsing thread puts each converted event: a batch, handed to the collector when
/// full.
pub(super) struct EventOut {
    batch: Vec<Event>,
    /// Events in the batches handed over.
    handed: usize,
    to: Handoff,
}

/// The collector a batch goes to.
enum Handoff {
    /// The second thread, and the emptied batches it gives back.
    Thread {
        batches: SyncSender<Vec<Event>>,
        returned: Receiver<Vec<Event>>,
    },
    /// This thread, when no second one could be started.
    Here(Collected),
}

impl EventOut {
    /// Adds `e`, the next event.
    #[inline]
    pub(super) fn push(&mut self, e: Event) {
        self.batch.push(e);
        if self.batch.len() >= BATCH {
            self.hand_over();
        }
    }

    /// Events put so far.
    pub(super) fn len(&self) -> usize {
        self.handed + self.batch.len()
    }

    fn hand_over(&mut self) {
        self.handed += self.batch.len();
        match &mut self.to {
            Handoff::Thread { batches, returned } => {
                let mut next = returned
                    .try_recv()
                    .unwrap_or_else(|_| Vec::with_capacity(BATCH));
                next.clear();
                let full = std::mem::replace(&mut self.batch, next);
                // The collector ends only after the sender is dropped, or by panicking, which
                // joining it reports.
                let _ = batches.send(full);
            }
            Handoff::Here(collected) => {
                collected.push(&self.batch);
                self.batch.clear();
            }
        }
    }

    /// Hands over the last batch and closes the handoff (the second thread ends once it has
    /// collected what it was handed); what was collected here, if it was.
    fn close(mut self) -> Option<Collected> {
        if !self.batch.is_empty() {
            self.hand_over();
        }
        match self.to {
            Handoff::Here(collected) => Some(collected),
            Handoff::Thread { .. } => None,
        }
    }
}

/// Runs `work` with an [`EventOut`] whose batches a second thread collects (this one, when no
/// thread can be started); gives back `work`'s result and what was collected.
pub(super) fn collecting<R>(work: impl FnOnce(&mut EventOut) -> R) -> (R, Collected) {
    collecting_on(Collector::SecondThread, work)
}

/// Where the batches are collected.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Collector {
    /// On a second thread, or on this one when none can be started.
    SecondThread,
    /// On this thread, as when no second one can be started.
    #[cfg_attr(not(test), allow(dead_code))]
    ThisThread,
}

/// [`collecting`] with the collector where `collector` says.
fn collecting_on<R>(collector: Collector, work: impl FnOnce(&mut EventOut) -> R) -> (R, Collected) {
    std::thread::scope(|scope| {
        let (batches, received) = mpsc::sync_channel::<Vec<Event>>(QUEUE);
        let (give_back, returned) = mpsc::channel::<Vec<Event>>();
        let spawned = (collector == Collector::SecondThread).then(|| {
            std::thread::Builder::new()
                .name("vramscope-collect".to_string())
                .spawn_scoped(scope, move || {
                    let mut collected = Collected::new();
                    for batch in received {
                        collected.push(&batch);
                        let _ = give_back.send(batch);
                    }
                    collected
                })
        });
        let (to, collector) = match spawned {
            Some(Ok(handle)) => (Handoff::Thread { batches, returned }, Some(handle)),
            Some(Err(_)) | None => (Handoff::Here(Collected::new()), None),
        };
        let mut out = EventOut {
            batch: Vec::with_capacity(BATCH),
            handed: 0,
            to,
        };
        let result = work(&mut out);
        let here = out.close();
        let collected = match (here, collector) {
            (Some(collected), _) => collected,
            (None, Some(handle)) => match handle.join() {
                Ok(collected) => collected,
                Err(panic) => std::panic::resume_unwind(panic),
            },
            // `close` gives back what was collected here whenever there was no thread.
            (None, None) => Collected::new(),
        };
        (result, collected)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use vramscope_model::EventKind;

    fn event(kind: EventKind, device: u16, addr: u64) -> Event {
        vramscope_testkit::event(kind)
            .device(device)
            .addr(addr)
            .size(512)
            .build()
    }

    /// A trace longer than several batches, with allocations that reuse addresses; most
    /// events have a time (`seq` 1, as `super::super::read_entry` marks them), and those
    /// without one hold a smaller number there.
    fn trace(devices: &[u16]) -> Vec<Event> {
        (0..3 * BATCH + 17)
            .map(|i| {
                let device = devices[i * devices.len() / (3 * BATCH + 17)];
                let addr = 4096 * (i as u64 % 97 / 2);
                let kind = if i % 2 == 0 {
                    EventKind::Alloc
                } else {
                    EventKind::FreeCompleted
                };
                let mut e = event(kind, device, addr);
                if i % 5 == 0 {
                    e.time_ns = 1;
                } else {
                    e.seq = 1;
                    e.time_ns = 10_000 + (i as u64 * 7919) % 5000;
                }
                e
            })
            .collect()
    }

    /// Everything the collector gives back: the events in order, their earliest time, and on
    /// one device the pairs and last allocations a pass over the whole list finds.
    #[test]
    fn the_collector_gives_the_events_pairs_and_last_allocations_of_one_pass() {
        let events = trace(&[3]);
        let ((), collected) = collecting(|out| {
            for e in &events {
                out.push(*e);
            }
            assert_eq!(out.len(), events.len());
        });
        assert_eq!(collected.events, events);
        let earliest = events
            .iter()
            .filter(|e| e.seq == 1)
            .map(|e| e.time_ns)
            .min();
        assert_eq!(collected.earliest_us, earliest);
        assert!(earliest > Some(1));
        let one = collected.one_device.expect("all events are on one device");
        let expected = PairedEvents::pair(&events);
        assert_eq!(one.paired.len(), expected.len());
        let mut open: Vec<_> = one.paired.pairing().open_allocations().collect();
        let mut expected_open: Vec<_> = expected.pairing().open_allocations().collect();
        open.sort_unstable();
        expected_open.sort_unstable();
        assert_eq!(open, expected_open);
        let mut last = AddrMap::default();
        for (i, e) in events.iter().enumerate() {
            if e.kind == EventKind::Alloc {
                last.insert(e.addr, i as u32);
            }
        }
        assert_eq!(one.last_alloc, last);
    }

    /// A batch given back is reused empty, whatever it still holds.
    #[test]
    fn a_batch_given_back_is_reused_empty() {
        let events = trace(&[0]);
        let (batches, received) = mpsc::sync_channel(64);
        let (give_back, returned) = mpsc::channel();
        for _ in 0..4 {
            give_back.send(events[..5].to_vec()).unwrap();
        }
        let mut out = EventOut {
            batch: Vec::new(),
            handed: 0,
            to: Handoff::Thread { batches, returned },
        };
        for e in &events {
            out.push(*e);
        }
        assert!(out.close().is_none());
        let got: Vec<Event> = received.iter().flatten().collect();
        assert_eq!(got, events);
    }

    /// Events of a second device end the pairing, whose order the merge by time would change.
    #[test]
    fn a_second_device_ends_the_pairing() {
        let events = trace(&[0, 1]);
        let ((), collected) = collecting(|out| {
            for e in &events {
                out.push(*e);
            }
        });
        assert_eq!(collected.events, events);
        assert!(collected.one_device.is_none());
    }

    /// Collected on the parser's own thread (as when no second one can be started), the
    /// events, their earliest time, pairs and last allocations are the second thread's, on one
    /// device and on two.
    #[test]
    fn collecting_without_a_second_thread_gives_the_same() {
        for devices in [&[2][..], &[0, 1][..]] {
            let events = trace(devices);
            let [second, here] =
                [Collector::SecondThread, Collector::ThisThread].map(|collector| {
                    let ((), collected) = collecting_on(collector, |out| {
                        let on_this_thread = matches!(out.to, Handoff::Here(_));
                        assert_eq!(on_this_thread, collector == Collector::ThisThread);
                        for e in &events {
                            out.push(*e);
                        }
                        assert_eq!(out.len(), events.len());
                    });
                    collected
                });
            assert_eq!(second.events, events);
            assert_eq!(here.events, events);
            assert_eq!(here.earliest_us, second.earliest_us);
            match (&here.one_device, &second.one_device) {
                (Some(a), Some(b)) => {
                    assert_eq!(devices.len(), 1);
                    assert_eq!(a.last_alloc, b.last_alloc);
                    let mut open_a: Vec<_> = a.paired.pairing().open_allocations().collect();
                    let mut open_b: Vec<_> = b.paired.pairing().open_allocations().collect();
                    open_a.sort_unstable();
                    open_b.sort_unstable();
                    assert_eq!(open_a, open_b);
                    assert_eq!(a.paired.len(), events.len());
                }
                (None, None) => assert_eq!(devices.len(), 2),
                _ => panic!("one collector paired the events and the other did not"),
            }
        }
    }
}
