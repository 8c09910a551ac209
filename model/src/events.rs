//! The events of a snapshot, as a list that can also share its memory with its own prefixes.
//!
//! [`Snapshot::events`](crate::Snapshot::events) is an [`Events`]: it reads as a slice of
//! [`Event`]s (it dereferences to `[Event]`) and grows like a `Vec`, but once
//! [`Events::share`] has been called, [`Events::prefix`] hands out the first `n` events
//! without copying them. The dashboard needs this: its analysis looks at the trace up to the
//! time cursor, and a 10M-event trace is a gigabyte of events that a copy per analysis would
//! double. A shared list is copied only when it is changed while another list still reads it
//! (copy on write), so whoever holds a prefix never sees it change.

use std::ops::{Deref, DerefMut, RangeBounds};
use std::sync::Arc;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::Event;

/// A snapshot's events: a `Vec<Event>` whose memory can be shared with its prefixes.
///
/// Reading goes through `Deref<Target = [Event]>`; the `Vec` methods a snapshot's builders use
/// are here under their `Vec` names. Changing a list that shares its memory copies the part it
/// sees first, so the others keep what they had.
#[derive(Clone, Default)]
pub struct Events(Store);

#[derive(Clone)]
enum Store {
    /// A list of its own: every change is a `Vec` change.
    Owned(Vec<Event>),
    /// The first `len` events of a list that others may read too.
    Shared { all: Arc<Vec<Event>>, len: usize },
}

impl Default for Store {
    fn default() -> Store {
        Store::Owned(Vec::new())
    }
}

impl Events {
    /// An empty list.
    pub fn new() -> Events {
        Events::default()
    }

    /// An empty list with room for `capacity` events.
    pub fn with_capacity(capacity: usize) -> Events {
        Events(Store::Owned(Vec::with_capacity(capacity)))
    }

    /// Makes the list's memory shareable, without copying it, so that [`Events::prefix`] and
    /// `clone` copy nothing afterwards.
    pub fn share(&mut self) {
        if let Store::Owned(events) = &mut self.0 {
            let all = Arc::new(std::mem::take(events));
            let len = all.len();
            self.0 = Store::Shared { all, len };
        }
    }

    /// The first `len` events (all of them when there are fewer): the same memory when the
    /// list is shared, a copy otherwise.
    pub fn prefix(&self, len: usize) -> Events {
        match &self.0 {
            Store::Owned(events) => Events(Store::Owned(events[..len.min(events.len())].to_vec())),
            Store::Shared { all, len: seen } => Events(Store::Shared {
                all: Arc::clone(all),
                len: len.min(*seen),
            }),
        }
    }

    /// The list as a `Vec` to change: a shared list's part is copied first unless no other
    /// list reads its memory (then it is taken as it is, and stays shareable for the next
    /// [`Events::share`]).
    pub fn to_mut(&mut self) -> &mut Vec<Event> {
        if let Store::Shared { all, len } = &mut self.0 {
            let len = *len;
            let events = match Arc::get_mut(all) {
                Some(events) => {
                    events.truncate(len);
                    std::mem::take(events)
                }
                None => {
                    // Room to grow: a copy is made to be changed, most often appended to.
                    let mut events = Vec::with_capacity(len + len / 8);
                    events.extend_from_slice(&all[..len]);
                    events
                }
            };
            self.0 = Store::Owned(events);
        }
        match &mut self.0 {
            Store::Owned(events) => events,
            Store::Shared { .. } => unreachable!("a shared list became owned above"),
        }
    }

    /// The events as a `Vec` of their own (no copy when the list owns them alone).
    pub fn into_vec(mut self) -> Vec<Event> {
        std::mem::take(self.to_mut())
    }

    /// Appends `event`.
    pub fn push(&mut self, event: Event) {
        self.to_mut().push(event);
    }

    /// Keeps the first `len` events.
    pub fn truncate(&mut self, len: usize) {
        if len < self.len() {
            self.to_mut().truncate(len);
        }
    }

    /// Removes every event.
    pub fn clear(&mut self) {
        self.0 = Store::Owned(Vec::new());
    }

    /// Keeps the events for which `keep` is true, in order.
    pub fn retain(&mut self, keep: impl FnMut(&Event) -> bool) {
        self.to_mut().retain(keep);
    }

    /// Removes the events in `range` and yields them.
    pub fn drain(&mut self, range: impl RangeBounds<usize>) -> std::vec::Drain<'_, Event> {
        self.to_mut().drain(range)
    }

    /// Splits the list at `at`: this keeps `..at`, the result holds `at..`.
    pub fn split_off(&mut self, at: usize) -> Events {
        Events(Store::Owned(self.to_mut().split_off(at)))
    }
}

impl Deref for Events {
    type Target = [Event];

    fn deref(&self) -> &[Event] {
        match &self.0 {
            Store::Owned(events) => events,
            Store::Shared { all, len } => &all[..*len],
        }
    }
}

impl DerefMut for Events {
    fn deref_mut(&mut self) -> &mut [Event] {
        self.to_mut()
    }
}

impl From<Vec<Event>> for Events {
    fn from(events: Vec<Event>) -> Events {
        Events(Store::Owned(events))
    }
}

impl From<Events> for Vec<Event> {
    fn from(events: Events) -> Vec<Event> {
        events.into_vec()
    }
}

impl FromIterator<Event> for Events {
    fn from_iter<I: IntoIterator<Item = Event>>(iter: I) -> Events {
        Events(Store::Owned(iter.into_iter().collect()))
    }
}

impl Extend<Event> for Events {
    fn extend<I: IntoIterator<Item = Event>>(&mut self, iter: I) {
        self.to_mut().extend(iter);
    }
}

impl<'a> IntoIterator for &'a Events {
    type Item = &'a Event;
    type IntoIter = std::slice::Iter<'a, Event>;

    fn into_iter(self) -> Self::IntoIter {
        self.iter()
    }
}

impl<'a> IntoIterator for &'a mut Events {
    type Item = &'a mut Event;
    type IntoIter = std::slice::IterMut<'a, Event>;

    fn into_iter(self) -> Self::IntoIter {
        self.iter_mut()
    }
}

impl IntoIterator for Events {
    type Item = Event;
    type IntoIter = std::vec::IntoIter<Event>;

    fn into_iter(self) -> Self::IntoIter {
        self.into_vec().into_iter()
    }
}

impl PartialEq for Events {
    fn eq(&self, other: &Events) -> bool {
        **self == **other
    }
}

impl std::fmt::Debug for Events {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

impl Serialize for Events {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        (**self).serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for Events {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Events, D::Error> {
        Vec::<Event>::deserialize(deserializer).map(Events::from)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An allocation numbered `seq`, read as a snapshot file holds it (the fields a file may
    /// leave out are their defaults).
    fn event(seq: u64) -> Event {
        let text = format!(
            r#"{{"seq":{seq},"time_ns":{},"kind":"alloc","device":0,"stream":0,"addr":{},"size":512,"requested":512}}"#,
            seq * 10,
            seq << 20
        );
        serde_json::from_str(&text).unwrap()
    }

    fn list(n: u64) -> Events {
        (0..n).map(event).collect()
    }

    #[test]
    fn a_prefix_of_a_shared_list_is_the_same_memory_and_does_not_change_with_it() {
        let mut events = list(10);
        events.share();
        let first = events.prefix(4);
        assert!(std::ptr::eq(first.as_ptr(), events.as_ptr()), "no copy");
        assert_eq!(first.len(), 4);
        assert_eq!(first[3].seq, 3);
        // Changing the whole list copies it: the prefix still reads what it had.
        events.push(event(10));
        events[0].size = 1;
        assert_eq!(events.len(), 11);
        assert_eq!(events[0].size, 1);
        assert_eq!(first[0].size, 512);
        assert_eq!(*first, *list(4));
        // A prefix that is changed copies only what it sees.
        let mut shared = list(6);
        shared.share();
        let mut head = shared.prefix(2);
        head.push(event(99));
        assert_eq!(head.iter().map(|e| e.seq).collect::<Vec<_>>(), [0, 1, 99]);
        assert_eq!(shared.len(), 6);
        assert_eq!(shared[2].seq, 2);
    }

    #[test]
    fn a_list_alone_is_changed_in_place_even_when_shared() {
        let mut events = list(5);
        events.share();
        let before = events.as_ptr();
        events.truncate(3);
        assert!(
            std::ptr::eq(events.as_ptr(), before),
            "no copy when nothing else reads it"
        );
        assert_eq!(events.len(), 3);
        // A prefix that was dropped leaves the list alone again.
        events.share();
        drop(events.prefix(1));
        events.push(event(7));
        assert_eq!(
            events.iter().map(|e| e.seq).collect::<Vec<_>>(),
            [0, 1, 2, 7]
        );
        // Unshared lists copy on prefix, and compare by content.
        let owned = list(3);
        let copy = owned.prefix(2);
        assert!(!std::ptr::eq(copy.as_ptr(), owned.as_ptr()));
        assert_eq!(copy, list(2));
        assert_eq!(owned.prefix(10).len(), 3);
    }

    /// An event's size is what a big trace costs per event: 10M events are a gigabyte at 104
    /// bytes. Two-byte devices brought it to 96, four-byte table ids to 88 and a four-byte
    /// step to 80; a field that grows it shows here.
    #[test]
    fn an_event_takes_80_bytes() {
        assert_eq!(std::mem::size_of::<Event>(), 80);
    }

    #[test]
    fn serialized_as_a_plain_list() {
        let mut events = list(3);
        events.share();
        let text = serde_json::to_string(&events.prefix(2)).unwrap();
        let back: Events = serde_json::from_str(&text).unwrap();
        assert_eq!(back, list(2));
        assert_eq!(text, serde_json::to_string(&list(2).into_vec()).unwrap());
    }
}
