//! What a PyTorch snapshot pickle holds beyond the model, kept while the pickle is streamed, so
//! that a writer of PyTorch's format (`vramscope convert --to pytorch`) gives the file back
//! without parsing it a second time.
//!
//! A streaming import drops each trace entry once it is an event; what the model has no place
//! for is an entry's keys in their order and the values of the keys it does not read
//! (`compile_context`, `user_metadata`, ...). Python writes every entry of a trace with the same
//! keys and the same few values there, so each entry is kept as the number of its
//! [`EntryShape`] (four bytes an entry) in a table of the shapes met, beside the document of
//! the rest of the pickle (segments, settings, annotations), which the streaming read builds
//! anyway. [`SourceSlot`] in `ImportOptions::keep_source` asks for it, and holds the
//! [`KeptSource`] once the import has converted the pickle. What cannot be kept so (an entry
//! of an action the importer does not read, a value there that is a container, a key that is
//! not a string, a pickle read whole rather than streamed) leaves the slot empty: the writer
//! then reads the source again, as it did before.

use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex};

use rustc_hash::FxHashMap;
use vramscope_model::pytorch::action_kind;
use vramscope_model::EventKind;
use vramscope_pickle::{Document, FastValue, ValueRef};

/// The keys of a trace entry whose values a writer takes from the model, in the order PyTorch
/// writes them: an OOM's `addr` and any other entry's `device_free` are not among them (an
/// OOM has `device_free` where the others have `addr`).
pub const MODEL_ENTRY_KEYS: [&str; 7] = [
    "action",
    "addr",
    "device_free",
    "size",
    "stream",
    "time_us",
    "frames",
];

/// Whether a writer takes the value of `key` from the model, for an entry that is an OOM or
/// not.
pub fn is_model_key(key: &str, oom: bool) -> bool {
    let other = if oom { "addr" } else { "device_free" };
    key != other && MODEL_ENTRY_KEYS.contains(&key)
}

/// A value of a trace entry as it is kept: for a key the model writes, only whether a stream
/// was negative (written back as a signed number); for another key, the value itself.
#[derive(Clone, Debug)]
pub enum KeptValue {
    /// A key whose value the model has; `negative` when it is a negative integer.
    Model {
        /// Whether the source's value was a negative integer.
        negative: bool,
    },
    /// `None`.
    None,
    /// A boolean.
    Bool(bool),
    /// An integer that fits in an `i64`.
    Int(i64),
    /// An integer past `i64::MAX` that fits in a `u64`.
    UInt(u64),
    /// An integer past 64 bits, as its little-endian two's complement bytes.
    BigInt(Box<[u8]>),
    /// A float.
    Float(f64),
    /// A string.
    Str(Box<str>),
    /// Bytes.
    Bytes(Box<[u8]>),
}

impl PartialEq for KeptValue {
    fn eq(&self, other: &Self) -> bool {
        Val::from(self) == Val::from(other)
    }
}

impl Eq for KeptValue {}

impl Hash for KeptValue {
    fn hash<H: Hasher>(&self, state: &mut H) {
        Val::from(self).hash(state);
    }
}

/// A trace entry's keys in the order Python holds them (a key set twice once, at its first
/// place, with its last value), each with what is kept of its value.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct EntryShape {
    items: Vec<(Box<str>, KeptValue)>,
}

impl EntryShape {
    /// The keys and values, in order.
    pub fn items(&self) -> &[(Box<str>, KeptValue)] {
        &self.items
    }
}

/// What the model does not keep of a streamed PyTorch snapshot pickle (see the module's
/// documentation).
pub struct KeptSource {
    doc: Document,
    /// Per list of `device_traces`, the shape of each entry, when entries were streamed;
    /// `None` when the document holds them.
    traces: Option<Vec<Vec<u32>>>,
    shapes: Vec<EntryShape>,
    earliest_us: Option<u64>,
}

impl KeptSource {
    /// The document of the pickle without its streamed trace entries: the root dict with its
    /// segments, settings and annotations, and `device_traces` as lists emptied of them.
    pub fn document(&self) -> &Document {
        &self.doc
    }

    /// Per list of `device_traces`, the numbers of its entries' shapes ([`KeptSource::shape`]),
    /// when the entries were streamed; `None` when [`KeptSource::document`] holds them.
    pub fn traces(&self) -> Option<&[Vec<u32>]> {
        self.traces.as_deref()
    }

    /// The shape numbered `id`.
    pub fn shape(&self, id: u32) -> &EntryShape {
        &self.shapes[id as usize]
    }

    /// The earliest `time_us` of a streamed entry of an action the importer reads.
    pub fn earliest_us(&self) -> Option<u64> {
        self.earliest_us
    }
}

/// Where an import puts the [`KeptSource`] of a PyTorch pickle it streamed. Clones share one
/// place; two handles are equal when they share it, so that `ImportOptions` stays comparable.
#[derive(Clone, Default)]
pub struct SourceSlot(Arc<Mutex<Option<KeptSource>>>);

impl SourceSlot {
    /// An empty slot.
    pub fn new() -> SourceSlot {
        SourceSlot::default()
    }

    /// What the import kept, leaving the slot empty; `None` when it kept nothing.
    pub fn take(&self) -> Option<KeptSource> {
        self.0.lock().map_or(None, |mut kept| kept.take())
    }

    pub(super) fn put(&self, kept: KeptSource) {
        if let Ok(mut slot) = self.0.lock() {
            *slot = Some(kept);
        }
    }
}

impl PartialEq for SourceSlot {
    fn eq(&self, other: &SourceSlot) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for SourceSlot {}

impl std::fmt::Debug for SourceSlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SourceSlot")
    }
}

/// A value of an entry while it is read, borrowed from the document: what a writer of source
/// values writes for it (an integer past 64 bits, or a container, is `Other`).
#[derive(Clone, Copy, Debug)]
enum Val<'a> {
    Model(bool),
    None,
    Bool(bool),
    Int(i64),
    UInt(u64),
    BigInt(&'a [u8]),
    Float(f64),
    Str(&'a str),
    Bytes(&'a [u8]),
    Other,
}

impl PartialEq for Val<'_> {
    fn eq(&self, other: &Self) -> bool {
        match (*self, *other) {
            (Val::Model(a), Val::Model(b)) | (Val::Bool(a), Val::Bool(b)) => a == b,
            (Val::None, Val::None) | (Val::Other, Val::Other) => true,
            (Val::Int(a), Val::Int(b)) => a == b,
            (Val::UInt(a), Val::UInt(b)) => a == b,
            // Bit for bit: what is written back.
            (Val::Float(a), Val::Float(b)) => a.to_bits() == b.to_bits(),
            (Val::Str(a), Val::Str(b)) => a == b,
            (Val::Bytes(a), Val::Bytes(b)) | (Val::BigInt(a), Val::BigInt(b)) => a == b,
            _ => false,
        }
    }
}

impl Hash for Val<'_> {
    fn hash<H: Hasher>(&self, state: &mut H) {
        std::mem::discriminant(self).hash(state);
        match *self {
            Val::Model(b) | Val::Bool(b) => b.hash(state),
            Val::Int(i) => i.hash(state),
            Val::UInt(u) => u.hash(state),
            Val::Float(f) => f.to_bits().hash(state),
            Val::Str(s) => s.hash(state),
            Val::Bytes(b) | Val::BigInt(b) => b.hash(state),
            Val::None | Val::Other => {}
        }
    }
}

impl<'a> From<&'a KeptValue> for Val<'a> {
    fn from(v: &'a KeptValue) -> Val<'a> {
        match v {
            KeptValue::Model { negative } => Val::Model(*negative),
            KeptValue::None => Val::None,
            KeptValue::Bool(b) => Val::Bool(*b),
            KeptValue::Int(i) => Val::Int(*i),
            KeptValue::UInt(u) => Val::UInt(*u),
            KeptValue::BigInt(b) => Val::BigInt(b),
            KeptValue::Float(f) => Val::Float(*f),
            KeptValue::Str(s) => Val::Str(s),
            KeptValue::Bytes(b) => Val::Bytes(b),
        }
    }
}

impl<'a> Val<'a> {
    /// The value of a document's value, as the export's writer of source values reads it.
    fn of(v: ValueRef<'a>) -> Val<'a> {
        match v.type_name() {
            "None" => Val::None,
            "bool" => Val::Bool(v.as_bool().unwrap_or(false)),
            "int" => match (v.as_i64(), v.big_int_bytes()) {
                (Some(i), _) => Val::Int(i),
                (None, Some(bytes)) => Val::BigInt(bytes),
                (None, None) => Val::UInt(v.as_u64().unwrap_or(0)),
            },
            "float" => Val::Float(v.as_float().unwrap_or(0.0)),
            "str" => Val::Str(v.as_str().unwrap_or("")),
            "bytes" => Val::Bytes(v.as_bytes().unwrap_or(&[])),
            _ => Val::Other,
        }
    }

    /// The value of a value the pickle reader's fast path decoded.
    fn of_fast(v: FastValue<'a>) -> Val<'a> {
        match v {
            FastValue::Doc(v) => Val::of(v),
            FastValue::Int(i) => Val::Int(i),
            FastValue::Float(f) => Val::Float(f),
            FastValue::List(_) => Val::Other,
        }
    }

    fn owned(self) -> Option<KeptValue> {
        Some(match self {
            Val::Model(negative) => KeptValue::Model { negative },
            Val::None => KeptValue::None,
            Val::Bool(b) => KeptValue::Bool(b),
            Val::Int(i) => KeptValue::Int(i),
            Val::UInt(u) => KeptValue::UInt(u),
            Val::BigInt(b) => KeptValue::BigInt(b.into()),
            Val::Float(f) => KeptValue::Float(f),
            Val::Str(s) => KeptValue::Str(s.into()),
            Val::Bytes(b) => KeptValue::Bytes(b.into()),
            Val::Other => return None,
        })
    }

    fn negative(self) -> bool {
        matches!(self, Val::Int(i) if i < 0)
    }

    /// A time in microseconds as the export reads `time_us` for the epoch.
    fn time_us(self) -> Option<u64> {
        match self {
            Val::Int(i) => Some(i.max(0) as u64),
            Val::Float(f) if f.is_finite() => Some(f.max(0.0) as u64),
            Val::Float(_) => None,
            Val::UInt(u) => Some(u),
            _ => None,
        }
    }
}

/// The recorder of the streamed entries' shapes, for a [`KeptSource`].
#[derive(Default)]
pub(super) struct Capture {
    lists: Vec<Vec<u32>>,
    shapes: Vec<EntryShape>,
    ids: FxHashMap<EntryShape, u32>,
    last: Option<u32>,
    earliest_us: Option<u64>,
    /// Whether an entry could not be kept: nothing is.
    failed: bool,
}

impl Capture {
    /// Records a streamed entry read whole, the `index`-th of list `list`.
    pub(super) fn entry(&mut self, entry: ValueRef<'_>, list: usize, index: usize) {
        match entry.dict_items() {
            Some(items) => self.record(items.map(|(k, v)| (k.as_str(), Val::of(v))), list, index),
            None => self.failed = true,
        }
    }

    /// Records a streamed entry that the fast path decoded.
    pub(super) fn fast_entry(
        &mut self,
        entry: &vramscope_pickle::FastEntry<'_>,
        list: usize,
        index: usize,
    ) {
        self.record(
            entry.pairs().map(|(k, v)| (k.as_str(), Val::of_fast(v))),
            list,
            index,
        );
    }

    fn record<'a>(
        &mut self,
        pairs: impl Iterator<Item = (Option<&'a str>, Val<'a>)>,
        list: usize,
        index: usize,
    ) {
        if self.failed {
            return;
        }
        // As Python holds the dict: each key once, at its first place, with its last value.
        let mut items: Vec<(&str, Val<'_>)> = Vec::with_capacity(10);
        for (key, value) in pairs {
            let Some(key) = key else {
                self.failed = true;
                return;
            };
            match items.iter_mut().find(|(k, _)| *k == key) {
                Some(item) => item.1 = value,
                None => items.push((key, value)),
            }
        }
        let action = items
            .iter()
            .find(|(k, _)| *k == "action")
            .and_then(|(_, v)| match v {
                Val::Str(s) => action_kind(s),
                _ => None,
            });
        // An entry the importer does not read is written back whole, which this does not keep.
        let Some(kind) = action else {
            self.failed = true;
            return;
        };
        let oom = kind == EventKind::Oom;
        for (key, value) in &mut items {
            if *key == "time_us" {
                if let Some(t) = value.time_us() {
                    self.earliest_us = Some(self.earliest_us.map_or(t, |e| e.min(t)));
                }
            }
            if is_model_key(key, oom) {
                *value = Val::Model(*key == "stream" && value.negative());
            } else if matches!(value, Val::Other) {
                self.failed = true;
                return;
            }
        }
        let same = |shape: &EntryShape| {
            shape.items.len() == items.len()
                && shape
                    .items
                    .iter()
                    .zip(&items)
                    .all(|((k, v), (key, value))| &**k == *key && Val::from(v) == *value)
        };
        let id = match self.last {
            Some(id) if same(&self.shapes[id as usize]) => id,
            _ => {
                let Some(owned) = items
                    .iter()
                    .map(|&(k, v)| v.owned().map(|v| (Box::<str>::from(k), v)))
                    .collect::<Option<Vec<_>>>()
                else {
                    self.failed = true;
                    return;
                };
                let shape = EntryShape { items: owned };
                match self.ids.get(&shape) {
                    Some(&id) => id,
                    None => {
                        let id = self.shapes.len() as u32;
                        self.shapes.push(shape.clone());
                        self.ids.insert(shape, id);
                        id
                    }
                }
            }
        };
        self.last = Some(id);
        if self.lists.len() <= list {
            self.lists.resize_with(list + 1, Vec::new);
        }
        let entries = &mut self.lists[list];
        if entries.len() != index {
            // Entries out of order: the streaming read would not have gone on.
            self.failed = true;
            return;
        }
        entries.push(id);
    }

    /// The bytes of memory held, as the reader's budget counts them.
    pub(super) fn memory(&self) -> usize {
        self.lists.iter().map(|l| l.capacity() * 4).sum::<usize>() + self.shapes.len() * 256
    }

    /// The kept source, with `doc` the streaming read's document, its `device_traces` of
    /// `lists` lists (when entries were streamed); `None` when an entry could not be kept.
    pub(super) fn finish(mut self, doc: Document, lists: Option<usize>) -> Option<KeptSource> {
        if self.failed {
            return None;
        }
        let traces = match lists {
            Some(n) if n >= self.lists.len() => {
                self.lists.resize_with(n, Vec::new);
                Some(self.lists)
            }
            Some(_) => return None,
            None if self.lists.is_empty() => None,
            None => return None,
        };
        Some(KeptSource {
            doc,
            traces,
            shapes: self.shapes,
            earliest_us: self.earliest_us,
        })
    }
}
