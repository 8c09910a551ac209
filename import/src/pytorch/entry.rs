//! One trace entry of a PyTorch snapshot into one `Event`: the entry's keys found by identity
//! ([`EntryKeys`]), its values read through [`EntryValue`] whether they come from the document
//! (`ValueRef`) or from the pickle reader's fast path (`FastValue`), and the one conversion
//! both share ([`entry_event`]). The streaming reader (`super::stream`) and the whole-document
//! path (`super::from_document`) call [`read_entry`] and [`read_fast_entry`].

use super::*;

/// The keys of a trace entry that are read, in the order [`EntryKeys::fields`] returns them.
pub(super) const ENTRY_KEYS: [&str; 8] = [
    "action",
    "addr",
    "size",
    "stream",
    "time_us",
    "frames",
    "device_free",
    "user_metadata",
];

/// The places of the keys in [`ENTRY_KEYS`].
const ACTION: usize = 0;
const ADDR: usize = 1;
const SIZE: usize = 2;
const STREAM: usize = 3;
const TIME_US: usize = 4;
const FRAMES: usize = 5;
const DEVICE_FREE: usize = 6;
const USER_METADATA: usize = 7;

/// Where the key strings met so far are among [`ENTRY_KEYS`], by their identity: the pickle
/// shares each key string among all entries, so each is compared with the key names once.
#[derive(Default)]
pub(super) struct EntryKeys {
    by_string: FxHashMap<usize, u8>,
    /// The identity and position of the key found at each place of the last entry's dict:
    /// PyTorch writes every entry's keys in the same order, so the next entry's key at the
    /// same place is usually the same string, found without a look-up.
    last: [(usize, u8); EntryKeys::REMEMBERED],
    /// The kinds of the last few action strings, by their identity (0: unset), and where the
    /// next one goes: PyTorch shares each action's string among all entries.
    actions: [(usize, Option<EventKind>); 4],
    next_action: usize,
    /// The keys of the last entry the fast path decoded whose keys were looked at
    /// ([`FastEntry::key_ids`]), and the place of each field's last pair in it
    /// (`usize::MAX`: none): PyTorch writes every entry with the same key strings in the same
    /// order, so the next entry's fields are usually at the same places.
    shape: Vec<u32>,
    shape_places: [usize; 8],
}

impl EntryKeys {
    /// The places of an entry's dict whose keys are remembered from the last entry.
    const REMEMBERED: usize = 16;

    /// [`fields`] of `entry` with [`ENTRY_KEYS`].
    pub(super) fn fields<'d>(&mut self, entry: ValueRef<'d>) -> [Option<ValueRef<'d>>; 8] {
        let mut found = [None; 8];
        if let Some(pairs) = entry.dict_items() {
            for (place, (k, v)) in pairs.enumerate() {
                if let Some(slot) = self.position(place, k).and_then(|at| found.get_mut(at)) {
                    *slot = Some(v);
                }
            }
        }
        found.map(|v| v.filter(|v| !v.is_none()))
    }

    /// [`EntryKeys::fields`] of an entry that the pickle reader's fast path decoded: the same
    /// values, found the same way, for the same entry read whole, each looked at only when
    /// the conversion asks for it.
    fn fast_fields<'e, 'd>(&mut self, entry: &'e FastEntry<'d>) -> FastFields<'e, 'd> {
        // The place of each key's last pair; only those values are looked at.
        let places = if !self.shape.is_empty() && entry.keys_are(&self.shape) {
            self.shape_places
        } else {
            let mut found = [usize::MAX; 8];
            for place in 0..entry.len() {
                if let Some(slot) = self
                    .position(place, entry.key(place))
                    .and_then(|at| found.get_mut(at))
                {
                    *slot = place;
                }
            }
            self.shape.clear();
            self.shape.extend(entry.key_ids());
            self.shape_places = found;
            found
        };
        FastFields { entry, places }
    }

    /// The kind of the event whose `action` is `action` at `loc`: `None` for an action that
    /// is not read, a fault when it is missing or not a string.
    #[inline]
    fn action<'d>(
        &mut self,
        action: Option<impl EntryValue<'d>>,
        loc: Loc,
    ) -> Result<Option<EventKind>, Fault> {
        // Only strings are remembered, and an identity says its value's type.
        let id = action.and_then(EntryValue::identity).filter(|&id| id != 0);
        if let Some(&(_, kind)) = id.and_then(|id| self.actions.iter().find(|a| a.0 == id)) {
            return Ok(kind);
        }
        let kind = vramscope_model::pytorch::action_kind(need_str(action, "action", loc)?);
        if let Some(id) = id {
            self.actions[self.next_action] = (id, kind);
            self.next_action = (self.next_action + 1) % self.actions.len();
        }
        Ok(kind)
    }

    /// The position among [`ENTRY_KEYS`] of `key`, the key at `place` of an entry's dict:
    /// `None` when it is not a string, past the keys' number when it is none of them.
    #[inline(always)]
    fn position(&mut self, place: usize, key: ValueRef<'_>) -> Option<usize> {
        let identity = key.identity();
        // A place's key is remembered only when it is a string (its identity says its kind).
        // An unset place holds identity 0, which is never taken from it.
        if let (Some(id), Some(last)) = (identity, self.last.get(place)) {
            if last.0 == id && id != 0 {
                return Some(last.1 as usize);
            }
        }
        self.find_position(place, key, identity)
    }

    /// [`EntryKeys::position`] of a key not remembered at its place.
    #[cold]
    fn find_position(
        &mut self,
        place: usize,
        key: ValueRef<'_>,
        identity: Option<usize>,
    ) -> Option<usize> {
        let text = key.as_str()?;
        let position = |text: &str| {
            ENTRY_KEYS
                .iter()
                .position(|&key| key == text)
                .map_or(u8::MAX, |i| i as u8)
        };
        let at = match (identity, self.last.get_mut(place)) {
            (Some(id), last) => {
                let at = *self.by_string.entry(id).or_insert_with(|| position(text));
                if let Some(last) = last {
                    *last = (id, at);
                }
                at
            }
            (None, _) => position(text),
        };
        Some(at as usize)
    }

    /// The bytes of memory the table takes, roughly.
    pub(super) fn memory(&self) -> usize {
        self.by_string.len() * 24
    }
}

/// The values of an entry's [`ENTRY_KEYS`] as the conversion reads them: each is the value of
/// the key's last pair, `None` when the key is absent or its value is `None`.
pub(super) trait EntryFields<'d> {
    /// The values' type.
    type Value: EntryValue<'d>;
    /// The value of the key at `ENTRY_KEYS[k]`.
    fn field(&self, k: usize) -> Option<Self::Value>;
}

impl<'d> EntryFields<'d> for [Option<ValueRef<'d>>; 8] {
    type Value = ValueRef<'d>;
    #[inline]
    fn field(&self, k: usize) -> Option<ValueRef<'d>> {
        self[k]
    }
}

/// The fields of an entry that the pickle reader's fast path decoded: the place of each key's
/// last pair in it (`usize::MAX`: none), so that a value is looked at only when asked for.
pub(super) struct FastFields<'e, 'd> {
    entry: &'e FastEntry<'d>,
    places: [usize; 8],
}

impl<'d> EntryFields<'d> for FastFields<'_, 'd> {
    type Value = FastValue<'d>;
    #[inline]
    fn field(&self, k: usize) -> Option<FastValue<'d>> {
        let place = self.places[k];
        if place == usize::MAX {
            return None;
        }
        let value = self.entry.value(place);
        (!value.is_none()).then_some(value)
    }
}

/// A value as the conversion of a trace entry reads it: from a document, or decoded by the
/// pickle reader's fast path, which must convert as the same value read whole.
pub(super) trait EntryValue<'d>: Copy {
    fn identity(self) -> Option<usize>;
    fn type_name(self) -> &'static str;
    fn as_i64(self) -> Option<i64>;
    fn as_u64(self) -> Option<u64>;
    fn as_float(self) -> Option<f64>;
    fn as_str(self) -> Option<&'d str>;
}

impl<'d> EntryValue<'d> for ValueRef<'d> {
    fn identity(self) -> Option<usize> {
        ValueRef::identity(self)
    }
    fn type_name(self) -> &'static str {
        ValueRef::type_name(self)
    }
    fn as_i64(self) -> Option<i64> {
        ValueRef::as_i64(self)
    }
    fn as_u64(self) -> Option<u64> {
        ValueRef::as_u64(self)
    }
    fn as_float(self) -> Option<f64> {
        ValueRef::as_float(self)
    }
    fn as_str(self) -> Option<&'d str> {
        ValueRef::as_str(self)
    }
}

impl<'d> EntryValue<'d> for FastValue<'d> {
    fn identity(self) -> Option<usize> {
        match self {
            FastValue::Doc(v) => v.identity(),
            _ => None,
        }
    }
    fn type_name(self) -> &'static str {
        FastValue::type_name(self)
    }
    fn as_i64(self) -> Option<i64> {
        FastValue::as_i64(self)
    }
    fn as_u64(self) -> Option<u64> {
        FastValue::as_u64(self)
    }
    fn as_float(self) -> Option<f64> {
        FastValue::as_float(self)
    }
    fn as_str(self) -> Option<&'d str> {
        FastValue::as_str(self)
    }
}

#[inline]
pub(super) fn need<'d, V: EntryValue<'d>>(v: Option<V>, key: &str, loc: Loc) -> Result<V, Fault> {
    v.ok_or_else(|| loc.fault(key, "missing"))
}

#[inline]
pub(super) fn to_u64<'d>(v: impl EntryValue<'d>, key: &str, loc: Loc) -> Result<u64, Fault> {
    v.as_u64()
        .ok_or_else(|| loc.wrong(key, "a non-negative integer", v))
}

#[inline]
pub(super) fn need_u64<'d>(
    v: Option<impl EntryValue<'d>>,
    key: &str,
    loc: Loc,
) -> Result<u64, Fault> {
    to_u64(need(v, key, loc)?, key, loc)
}

#[inline]
pub(super) fn opt_u64<'d>(
    v: Option<impl EntryValue<'d>>,
    key: &str,
    loc: Loc,
) -> Result<Option<u64>, Fault> {
    v.map(|v| to_u64(v, key, loc)).transpose()
}

/// A stream handle: any integer, negative ones kept as their two's-complement bits.
#[inline]
pub(super) fn opt_stream<'d>(
    v: Option<impl EntryValue<'d>>,
    key: &str,
    loc: Loc,
) -> Result<u64, Fault> {
    match v {
        None => Ok(0),
        Some(v) => match v.as_i64() {
            Some(i) => Ok(i as u64),
            None => v.as_u64().ok_or_else(|| loc.wrong(key, "an integer", v)),
        },
    }
}

pub(super) fn need_str<'d>(
    v: Option<impl EntryValue<'d>>,
    key: &str,
    loc: Loc,
) -> Result<&'d str, Fault> {
    let v = need(v, key, loc)?;
    v.as_str().ok_or_else(|| loc.wrong(key, "a string", v))
}

pub(super) fn opt_str<'d>(
    v: Option<ValueRef<'d>>,
    key: &str,
    loc: Loc,
) -> Result<Option<&'d str>, Fault> {
    v.map(|v| v.as_str().ok_or_else(|| loc.wrong(key, "a string", v)))
        .transpose()
}

pub(super) fn opt_seq<'d>(
    v: Option<ValueRef<'d>>,
    key: &str,
    loc: Loc,
) -> Result<Option<Seq<'d>>, Fault> {
    v.map(|v| v.as_seq().ok_or_else(|| loc.wrong(key, "a list", v)))
        .transpose()
}

/// The elements of a list that may be absent.
pub(super) fn elements<'d>(seq: Option<Seq<'d>>) -> impl Iterator<Item = ValueRef<'d>> {
    seq.into_iter().flat_map(Seq::iter)
}

/// A time in microseconds: an integer or a float; negative times count as 0.
#[inline]
pub(super) fn opt_time_us<'d>(
    v: Option<impl EntryValue<'d>>,
    key: &str,
    loc: Loc,
) -> Result<Option<u64>, Fault> {
    let Some(v) = v else {
        return Ok(None);
    };
    if let Some(i) = v.as_i64() {
        return Ok(Some(i.max(0) as u64));
    }
    match v.as_float() {
        Some(f) if f.is_finite() => Ok(Some(f.max(0.0) as u64)),
        _ => v
            .as_u64()
            .map(Some)
            .ok_or_else(|| loc.wrong(key, "a time in microseconds", v)),
    }
}

pub(super) fn device_index(v: u64, key: &str, loc: Loc) -> Result<u32, Fault> {
    vramscope_model::event_device(v)
        .map(u32::from)
        .ok_or_else(|| loc.fault(key, vramscope_model::device_refusal(v)))
}

/// The figures of a file, checked as they are read so that no sum of them computed later (the
/// statistics, the block sizes' replay, the engine's totals, the reports and exports) can pass
/// 64 bits: every address range must end below 2^63 and all the sizes in the file together
/// must stay within 2^60 bytes (1 EiB, a thousand times the memory of the largest machines).
/// A file past either is inconsistent, and the error names the field.
#[derive(Default)]
pub(super) struct Figures {
    /// The sizes read so far, added up.
    total: u64,
}

impl Figures {
    /// The most all the sizes of a file may add up to.
    const MAX_TOTAL: u64 = 1 << 60;
    /// Where every address range must end.
    const ADDRESS_END: u64 = 1 << 63;

    /// Counts `size`, the value of `key` at `loc`.
    #[inline]
    fn size(&mut self, size: u64, loc: Loc, key: &str) -> Result<(), Fault> {
        match self.total.checked_add(size) {
            Some(total) if total <= Self::MAX_TOTAL => {
                self.total = total;
                Ok(())
            }
            _ => Err(loc.fault(
                key,
                format!(
                    "{size} bytes: the sizes in the file add up to more than 2^60 bytes (1 EiB), which no device holds; the file is inconsistent"
                ),
            )),
        }
    }

    /// Counts the range of `size` bytes at `addr` (`addr_key` and `size_key` at `loc`).
    #[inline]
    pub(super) fn range(
        &mut self,
        addr: u64,
        size: u64,
        loc: Loc,
        addr_key: &str,
        size_key: &str,
    ) -> Result<(), Fault> {
        if addr
            .checked_add(size)
            .is_none_or(|end| end > Self::ADDRESS_END)
        {
            return Err(loc.fault(
                addr_key,
                format!(
                    "{addr:#x} + {size} bytes ends past 2^63, outside any device's address space; the file is inconsistent"
                ),
            ));
        }
        self.size(size, loc, size_key)
    }
}

/// The event of a trace entry, or `None` for an action that is not read. Its time is not yet
/// relative: `time_ns` holds the entry's `time_us` and `seq` is 1 when it has one, 0 when not
/// (see [`finish`]).
pub(super) fn read_entry(
    entry: ValueRef<'_>,
    device: u16,
    loc: Loc,
    keys: &mut EntryKeys,
    stacks: &mut Stacks,
    figures: &mut Figures,
) -> Result<Option<Event>, Fault> {
    let entry = dict(entry, loc)?;
    let fields = keys.fields(entry);
    entry_event(fields, device, loc, keys, figures, |frames, metadata| {
        Ok((stacks.site(frames, loc)?, stacks.tag(metadata)))
    })
}

/// [`read_entry`] of an entry that the pickle reader's fast path decoded: the same event, or
/// the same fault, as for the same entry read whole.
pub(super) fn read_fast_entry(
    entry: &FastEntry<'_>,
    device: u16,
    loc: Loc,
    keys: &mut EntryKeys,
    stacks: &mut Stacks,
    figures: &mut Figures,
) -> Result<Option<Event>, Fault> {
    let fields = keys.fast_fields(entry);
    entry_event(fields, device, loc, keys, figures, |frames, metadata| {
        Ok((stacks.fast_site(frames, loc)?, stacks.tag(metadata)))
    })
}

/// The event of the trace entry whose [`ENTRY_KEYS`] hold `fields`, with `site` to find the
/// call site of its `frames` and the tag of its `user_metadata` (PyTorch's custom allocation
/// metadata, a string; a value of another type is left unread) (see [`read_entry`]).
pub(super) fn entry_event<'d, F: EntryFields<'d>>(
    fields: F,
    device: u16,
    loc: Loc,
    keys: &mut EntryKeys,
    figures: &mut Figures,
    site: impl FnOnce(Option<F::Value>, Option<&'d str>) -> Result<(Option<SiteId>, Option<Id>), Fault>,
) -> Result<Option<Event>, Fault> {
    let Some(kind) = keys.action(fields.field(ACTION), loc)? else {
        return Ok(None);
    };
    let located = !matches!(kind, EventKind::Snapshot | EventKind::Oom);
    let (addr, size) = if located {
        (
            need_u64(fields.field(ADDR), "addr", loc)?,
            need_u64(fields.field(SIZE), "size", loc)?,
        )
    } else {
        (
            opt_u64(fields.field(ADDR), "addr", loc)?.unwrap_or(0),
            opt_u64(fields.field(SIZE), "size", loc)?.unwrap_or(0),
        )
    };
    if located {
        figures.range(addr, size, loc, "addr", "size")?;
    } else {
        figures.size(size, loc, "size")?;
    }
    let requested = match kind {
        EventKind::Alloc | EventKind::FreeRequested | EventKind::FreeCompleted => size,
        _ => 0,
    };
    // PyTorch writes an OOM's free device memory as `device_free` (in place of `addr`, which
    // an OOM does not have); a file that wrote it as `addr` is read the same.
    let (addr, device_free) = if kind == EventKind::Oom {
        let free = opt_u64(fields.field(DEVICE_FREE), "device_free", loc)?;
        (0, free.unwrap_or(addr))
    } else {
        (addr, 0)
    };
    let stream = opt_stream(fields.field(STREAM), "stream", loc)?;
    let metadata = fields.field(USER_METADATA).and_then(EntryValue::as_str);
    let (site, tag) = site(fields.field(FRAMES), metadata)?;
    let time_us = opt_time_us(fields.field(TIME_US), "time_us", loc)?;
    Ok(Some(Event {
        seq: u64::from(time_us.is_some()),
        time_ns: time_us.unwrap_or(0),
        kind,
        device,
        stream,
        addr,
        size,
        requested,
        site: Id::pack(site),
        tag,
        scope: None,
        step: 0,
        thread: 0,
        device_free,
    }))
}

/// Lowers `earliest` to the time of `e`, an event from [`read_entry`], when it has one.
#[inline]
pub(super) fn note_time(earliest: &mut Option<u64>, e: &Event) {
    if e.seq == 1 {
        *earliest = Some(earliest.map_or(e.time_ns, |t| t.min(e.time_ns)));
    }
}
