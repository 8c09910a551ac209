//! [`Document`], the compact arena a pickle is read into, and [`ValueRef`] and [`Seq`], the
//! handles through which its values are read.
//!
//! `super::machine` fills a document opcode by opcode; once it is read, [`Document`] checks
//! that it has no cycle and nests within [`Limits::max_depth`].
//! `vramscope_import::pytorch` and `vramscope_export` walk it through
//! [`ValueRef`]s, and `super::tree` turns it into
//! [`super::Value`]s. A value is referenced by a four-byte [`Ref`]: small integers, `None` and
//! booleans in place, everything else as an index into the table of its kind (the text of all
//! strings in one buffer, the elements of all containers in one pool).

use std::fmt;

use super::error::{PickleError, PickleErrorKind};
use super::limits::Limits;
use super::machine::stream::Standin;
use super::machine::Machine;
use super::tree::ValueBuilder;
use super::value::{big_u64, Value};

/// Bits of a [`Ref`] that hold its payload; the four bits above them hold its kind.
pub(super) const PAYLOAD_BITS: u32 = 28;
/// The payload of a [`Ref`].
pub(super) const PAYLOAD_MASK: u32 = (1 << PAYLOAD_BITS) - 1;
/// The most entries one table of a document holds (integers, floats, strings, byte strings,
/// containers, each table on its own), whatever the [`Limits`] allow: every index of a table
/// must fit in a [`Ref`]'s payload. Values stored in place (small integers, `None`, booleans)
/// take no entry.
pub(super) const MAX_TABLE: usize = 1 << PAYLOAD_BITS;

/// The kinds of value a [`Ref`] can name.
pub(super) mod kind {
    /// An integer of 28 bits, stored in the payload itself.
    pub const SMALL_INT: u32 = 0;
    /// `None` (payload 0), `False` (1) or `True` (2).
    pub const CONST: u32 = 1;
    /// An index into `Document::ints`.
    pub const INT: u32 = 2;
    /// An index into the byte strings, holding an integer too large for 64 bits.
    pub const BIG_INT: u32 = 3;
    /// An index into `Document::floats`.
    pub const FLOAT: u32 = 4;
    /// An index into the text strings.
    pub const STR: u32 = 5;
    /// An index into the byte strings.
    pub const BYTES: u32 = 6;
    /// An index into `Document::containers`, for a list.
    pub const LIST: u32 = 7;
    /// The same, for a tuple.
    pub const TUPLE: u32 = 8;
    /// The same, for a dict (whose elements alternate key and value).
    pub const DICT: u32 = 9;
    /// The same, for a set.
    pub const SET: u32 = 10;
    /// The same, for a frozenset.
    pub const FROZEN_SET: u32 = 11;
    /// A trace entry consumed by a streaming read, by its place in its run of entries (see
    /// `super::machine::stream`); never in a finished document.
    pub const ENTRY: u32 = 12;
    /// A frames list of a consumed entry, as its call site.
    pub const SITE: u32 = 13;
    /// A frame dict of a consumed entry, as its frame number.
    pub const FRAME: u32 = 14;
}

/// A value as a document references it: its kind in the top four bits and, in the other 28,
/// a small integer or an index into the table of its kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(super) struct Ref(u32);

impl Ref {
    pub(super) const NONE: Ref = Ref::new(kind::CONST, 0);
    pub(super) const FALSE: Ref = Ref::new(kind::CONST, 1);
    pub(super) const TRUE: Ref = Ref::new(kind::CONST, 2);
    /// Fills element slots reserved for a container to grow into.
    pub(super) const VACANT: Ref = Ref(u32::MAX);

    #[inline]
    pub(super) const fn new(kind: u32, payload: u32) -> Ref {
        Ref((kind << PAYLOAD_BITS) | (payload & PAYLOAD_MASK))
    }

    /// The integer in place, when it fits in 28 bits.
    #[inline]
    pub(super) fn small(v: i64) -> Option<Ref> {
        const HALF: i64 = 1 << (PAYLOAD_BITS - 1);
        (-HALF..HALF)
            .contains(&v)
            .then(|| Ref::new(kind::SMALL_INT, v as u32))
    }

    /// The four bytes of the reference, kind and payload.
    #[inline]
    pub(super) fn raw(self) -> u32 {
        self.0
    }

    /// The reference whose four bytes [`Ref::raw`] gave.
    #[inline]
    pub(super) fn from_raw(raw: u32) -> Ref {
        Ref(raw)
    }

    #[inline]
    pub(super) fn kind(self) -> u32 {
        self.0 >> PAYLOAD_BITS
    }

    #[inline]
    pub(super) fn index(self) -> usize {
        (self.0 & PAYLOAD_MASK) as usize
    }

    /// The integer of a `SMALL_INT`, sign-extended from 28 bits.
    #[inline]
    pub(super) fn small_value(self) -> i64 {
        (((self.0 << (32 - PAYLOAD_BITS)) as i32) >> (32 - PAYLOAD_BITS)) as i64
    }

    #[inline]
    pub(super) fn is_container(self) -> bool {
        (kind::LIST..=kind::FROZEN_SET).contains(&self.kind())
    }

    #[inline]
    pub(super) fn type_name(self) -> &'static str {
        match self.kind() {
            kind::SMALL_INT | kind::INT | kind::BIG_INT => "int",
            kind::CONST if self == Ref::NONE => "None",
            kind::CONST => "bool",
            kind::FLOAT => "float",
            kind::STR => "str",
            kind::BYTES => "bytes",
            kind::LIST => "list",
            kind::TUPLE => "tuple",
            kind::DICT => "dict",
            kind::SET => "set",
            kind::FROZEN_SET => "frozenset",
            _ => "unknown",
        }
    }
}

/// Where a container's elements lie in the pool.
#[derive(Clone, Copy, Debug)]
pub(super) struct Container {
    /// Position of the first element.
    pub(super) start: u32,
    /// Number of elements (a dict's keys and values both count).
    pub(super) len: u32,
    /// Slots reserved from `start` (at least `len`) that the container may grow into.
    pub(super) cap: u32,
    /// Whether another container has the very same elements in the same slots (see
    /// [`Machine::share_equal`]), so that the container must move to grow.
    pub(super) shared: bool,
    /// Whether a streaming read converted something from the container, which must then not
    /// change (see `super::machine::stream`).
    pub(super) frozen: bool,
}

impl Container {
    pub(super) fn range(&self) -> std::ops::Range<usize> {
        self.start as usize..self.start as usize + self.len as usize
    }
}

/// A pickle read into compact tables: the result of [`Document::parse`].
///
/// Values are reached from [`Document::root`] as [`ValueRef`]s. The document is immutable,
/// free of cycles and nested no deeper than the [`Limits`] it was read with.
pub struct Document {
    pub(super) root: Ref,
    /// The size of the input in bytes.
    pub(super) input_len: usize,
    /// Integers that need more than 28 bits.
    pub(super) ints: Vec<i64>,
    pub(super) floats: Vec<f64>,
    /// The text of all strings, one after another.
    pub(super) text: String,
    /// Where each string's text ends.
    pub(super) text_ends: Vec<usize>,
    /// The bytes of all byte strings and big integers.
    pub(super) blob: Vec<u8>,
    /// Where each byte string ends.
    pub(super) blob_ends: Vec<usize>,
    pub(super) containers: Vec<Container>,
    /// The elements of all containers.
    pub(super) items: Vec<Ref>,
}

impl fmt::Debug for Document {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Document")
            .field("containers", &self.containers.len())
            .field("elements", &self.items.len())
            .field("strings", &self.text_ends.len())
            .finish_non_exhaustive()
    }
}

impl Document {
    /// A document of nothing yet, for a machine reading `input_len` bytes to fill.
    pub(super) fn empty(input_len: usize) -> Document {
        Document {
            root: Ref::NONE,
            input_len,
            ints: Vec::new(),
            floats: Vec::new(),
            text: String::new(),
            text_ends: Vec::new(),
            blob: Vec::new(),
            blob_ends: Vec::new(),
            containers: Vec::new(),
            items: Vec::new(),
        }
    }

    /// Reads a pickle of plain data with the default [`Limits`].
    pub fn parse(bytes: &[u8]) -> Result<Document, PickleError> {
        Document::parse_with_limits(bytes, &Limits::default())
    }

    /// Reads a pickle of plain data within `limits`.
    pub fn parse_with_limits(bytes: &[u8], limits: &Limits) -> Result<Document, PickleError> {
        if bytes.is_empty() {
            return Err(PickleError {
                offset: 0,
                kind: PickleErrorKind::Empty,
            });
        }
        if bytes.len() > limits.max_input_bytes {
            return Err(PickleError {
                offset: 0,
                kind: PickleErrorKind::InputTooLarge {
                    size: bytes.len(),
                    limit: limits.max_input_bytes,
                },
            });
        }
        let mut machine = Machine::new(bytes, limits, false);
        let root = machine.run()?;
        let mut doc = machine.doc;
        doc.root = root;
        if let Err((container, kind)) = doc.check(limits) {
            // Where containers were created is not kept; read the input again to find it.
            let mut again = Machine::new(bytes, limits, true);
            let offset = match again.run() {
                Ok(_) => again.origins.get(container).copied().unwrap_or(0),
                Err(e) => e.offset,
            };
            return Err(PickleError { offset, kind });
        }
        Ok(doc)
    }

    /// Reads a pickle of plain data within `limits` from an input whose length is not known
    /// until it ends (what gzip data unpacks to, as it is unpacked), holding only a window of
    /// it. `open` gives the input from its start: once, and a second time only when the
    /// document fails its final check, to find where the offending container was made. The
    /// memory budget is that of the bytes read so far ([`Limits::memory_budget`]), so that a
    /// hostile input fails, and is read no further, as soon as a prefix of it breaks a bound;
    /// otherwise the document, and every error, are those of
    /// [`Document::parse_with_limits`] on the whole input, but that a `FRAME` announcing more
    /// bytes than the input has is found at the end, after any error in between. A read error
    /// ends the input: the caller, who owns the reader, reports it first.
    pub fn parse_read<'r>(
        open: &mut dyn FnMut() -> Box<dyn std::io::Read + 'r>,
        limits: &Limits,
    ) -> Result<Document, PickleError> {
        use super::machine::stream::{pieces, run_pieces};
        let unsized_error = |e: Option<PickleError>| {
            e.unwrap_or(PickleError {
                offset: 0,
                kind: PickleErrorKind::Empty,
            })
        };
        let mut input = open();
        let machine = Machine::unsized_input(limits, false);
        let (machine, root) =
            run_pieces(machine, None, &mut pieces(&mut *input), limits).map_err(unsized_error)?;
        drop(input);
        let mut doc = machine.doc;
        doc.root = root;
        if let Err((container, kind)) = doc.check(limits) {
            let mut input = open();
            let again = Machine::unsized_input(limits, true);
            let offset = match run_pieces(again, None, &mut pieces(&mut *input), limits) {
                Ok((again, _)) => again.origins.get(container).copied().unwrap_or(0),
                Err(e) => unsized_error(e).offset,
            };
            return Err(PickleError { offset, kind });
        }
        Ok(doc)
    }

    /// The bytes of memory the document's tables and element pool take, counted by length as
    /// the [`Limits`] budget counts them.
    pub fn memory_bytes(&self) -> usize {
        use std::mem::size_of;
        self.items.len() * size_of::<Ref>()
            + self.containers.len() * size_of::<Container>()
            + (self.ints.len() + self.floats.len()) * 8
            + self.text.len()
            + self.blob.len()
            + (self.text_ends.len() + self.blob_ends.len()) * size_of::<usize>()
    }

    /// The size of the pickle the document was read from, in bytes.
    pub fn input_bytes(&self) -> usize {
        self.input_len
    }

    /// The number of containers the document holds (a container the pickle shares through
    /// its memo counts once).
    pub fn containers(&self) -> usize {
        self.containers.len()
    }

    /// The number of elements of all containers together, each container counted once
    /// (a dict's keys and values both count).
    pub fn element_count(&self) -> usize {
        self.containers.iter().map(|c| c.len as usize).sum()
    }

    /// The value the pickle stores.
    pub fn root(&self) -> ValueRef<'_> {
        self.at(self.root)
    }

    #[inline]
    pub(super) fn at(&self, r: Ref) -> ValueRef<'_> {
        ValueRef { doc: self, r }
    }

    #[inline]
    pub(super) fn text_of(&self, i: usize) -> &str {
        let start = if i == 0 { 0 } else { self.text_ends[i - 1] };
        &self.text[start..self.text_ends[i]]
    }

    pub(super) fn blob_of(&self, i: usize) -> &[u8] {
        let start = if i == 0 { 0 } else { self.blob_ends[i - 1] };
        &self.blob[start..self.blob_ends[i]]
    }

    /// The elements of the container `r`.
    #[inline]
    pub(super) fn elements(&self, r: Ref) -> &[Ref] {
        &self.items[self.containers[r.index()].range()]
    }

    /// Appends `new` to the elements of container `c`, in place when its reserved slots or
    /// the end of the pool allow, else by moving its elements to the end of the pool.
    /// Returns `false`, changing nothing, when the pool would outgrow 32-bit positions.
    pub(super) fn extend(&mut self, c: usize, new: &[Ref]) -> bool {
        if new.is_empty() {
            return true;
        }
        let cont = self.containers[c];
        let own = !cont.shared;
        let (start, len, cap) = (cont.start as usize, cont.len as usize, cont.cap as usize);
        let new_len = len + new.len();
        let (new_start, new_cap) = if own && new_len <= cap {
            self.items[start + len..start + new_len].copy_from_slice(new);
            (start, cap)
        } else if own && start + cap == self.items.len() {
            if start + new_len > u32::MAX as usize {
                return false;
            }
            self.items.truncate(start + len);
            self.items.extend_from_slice(new);
            (start, new_len)
        } else {
            // A first batch gets exactly its room; a container that grows again gets twice
            // what it needs, so that one filled in many batches moves only a few times.
            let room = if len == 0 { new_len } else { new_len * 2 };
            let at = self.items.len();
            if at + room > u32::MAX as usize {
                return false;
            }
            self.items.extend_from_within(start..start + len);
            self.items.extend_from_slice(new);
            self.items.resize(at + room, Ref::VACANT);
            (at, room)
        };
        self.containers[c] = Container {
            start: new_start as u32,
            len: new_len as u32,
            cap: new_cap as u32,
            // Moved or not, the elements are now the container's own.
            shared: false,
            frozen: cont.frozen,
        };
        true
    }

    /// Checks that no container reachable from the root contains itself and that none is
    /// nested deeper than `limits.max_depth`, visiting containers depth first in element
    /// order; returns the first container at fault and what is wrong.
    pub(super) fn check(&self, limits: &Limits) -> Result<(), (usize, PickleErrorKind)> {
        const NEW: u8 = 0;
        const OPEN: u8 = 1;
        const DONE: u8 = 2;
        let too_deep = PickleErrorKind::LimitExceeded {
            what: "levels of nesting",
            limit: limits.max_depth,
        };
        if !self.root.is_container() {
            return Ok(());
        }
        if limits.max_depth < 1 {
            return Err((self.root.index(), too_deep));
        }
        let mut state = vec![NEW; self.containers.len()];
        // Each open container and the position of its next element.
        let mut path: Vec<(Ref, usize)> = vec![(self.root, 0)];
        state[self.root.index()] = OPEN;
        while let Some(top) = path.last_mut() {
            let (r, next) = *top;
            let elements = self.elements(r);
            let Some(&child) = elements.get(next) else {
                state[r.index()] = DONE;
                path.pop();
                continue;
            };
            top.1 += 1;
            if !child.is_container() {
                continue;
            }
            match state[child.index()] {
                DONE => {}
                OPEN => return Err((child.index(), PickleErrorKind::Cycle)),
                _ => {
                    if path.len() + 1 > limits.max_depth {
                        return Err((child.index(), too_deep));
                    }
                    state[child.index()] = OPEN;
                    path.push((child, 0));
                }
            }
        }
        Ok(())
    }
}

/// A value of a [`Document`]: a cheap handle with the accessors of [`Value`].
#[derive(Clone, Copy)]
pub struct ValueRef<'d> {
    doc: &'d Document,
    r: Ref,
}

impl fmt::Debug for ValueRef<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.to_value())
    }
}

impl<'d> ValueRef<'d> {
    /// The Python type name of the value (`"dict"`, `"int"`, ...), for error messages.
    #[inline]
    pub fn type_name(self) -> &'static str {
        self.r.type_name()
    }

    /// Whether the value is `None`.
    #[inline]
    pub fn is_none(self) -> bool {
        self.r == Ref::NONE
    }

    /// The boolean, when the value is a `bool`.
    #[inline]
    pub fn as_bool(self) -> Option<bool> {
        match self.r {
            Ref::TRUE => Some(true),
            Ref::FALSE => Some(false),
            _ => None,
        }
    }

    /// The integer, when the value is an `int` that fits in an `i64`.
    #[inline]
    pub fn as_i64(self) -> Option<i64> {
        match self.r.kind() {
            kind::SMALL_INT => Some(self.r.small_value()),
            kind::INT => Some(self.doc.ints[self.r.index()]),
            _ => None,
        }
    }

    /// The integer, when the value is a non-negative `int` that fits in a `u64`.
    #[inline]
    pub fn as_u64(self) -> Option<u64> {
        match self.r.kind() {
            kind::BIG_INT => big_u64(self.doc.blob_of(self.r.index())),
            _ => self.as_i64().and_then(|i| u64::try_from(i).ok()),
        }
    }

    /// The float, when the value is a `float`.
    #[inline]
    pub fn as_float(self) -> Option<f64> {
        (self.r.kind() == kind::FLOAT).then(|| self.doc.floats[self.r.index()])
    }

    /// The number as a float, when the value is a `float` or an `int` that fits in an `i64`.
    #[inline]
    pub fn as_f64(self) -> Option<f64> {
        self.as_float().or_else(|| self.as_i64().map(|i| i as f64))
    }

    /// The text, when the value is a `str`.
    #[inline]
    pub fn as_str(self) -> Option<&'d str> {
        (self.r.kind() == kind::STR).then(|| self.doc.text_of(self.r.index()))
    }

    /// The bytes, when the value is `bytes` or `bytearray`.
    pub fn as_bytes(self) -> Option<&'d [u8]> {
        (self.r.kind() == kind::BYTES).then(|| self.doc.blob_of(self.r.index()))
    }

    /// The elements, when the value is a list or a tuple.
    #[inline]
    pub fn as_seq(self) -> Option<Seq<'d>> {
        matches!(self.r.kind(), kind::LIST | kind::TUPLE).then(|| Seq {
            doc: self.doc,
            refs: self.doc.elements(self.r),
        })
    }

    /// The elements, when the value is a list, a tuple, a set or a frozenset.
    #[inline]
    pub fn elements(self) -> Option<Seq<'d>> {
        (self.r.is_container() && self.r.kind() != kind::DICT).then(|| Seq {
            doc: self.doc,
            refs: self.doc.elements(self.r),
        })
    }

    /// The minimal little-endian two's-complement bytes of an integer too large for 64 bits,
    /// as `LONG1`/`LONG4` store them.
    pub fn big_int_bytes(self) -> Option<&'d [u8]> {
        (self.r.kind() == kind::BIG_INT).then(|| self.doc.blob_of(self.r.index()))
    }

    /// The key/value pairs in the order the pickle set them, when the value is a dict. A key
    /// set twice appears twice; the later pair is the one Python keeps (and [`Self::get`]
    /// finds).
    pub fn dict_items(self) -> Option<impl ExactSizeIterator<Item = (ValueRef<'d>, ValueRef<'d>)>> {
        let doc = self.doc;
        (self.r.kind() == kind::DICT).then(|| {
            doc.elements(self.r)
                .chunks_exact(2)
                .map(move |pair| (doc.at(pair[0]), doc.at(pair[1])))
        })
    }

    /// The key/value pairs Python holds once it has loaded the dict: a string key set more
    /// than once appears once, in the place it was first set, with the value it was last set
    /// to. Other keys (which a snapshot never uses) are kept as they come. Writers use it so
    /// that a key repeated in a hostile file is written once, not once per repetition.
    pub fn python_dict_items(self) -> Option<Vec<(ValueRef<'d>, ValueRef<'d>)>> {
        let items: Vec<_> = self.dict_items()?.collect();
        // Each string key's last place; a dict without a repeated key is done after this pass.
        let mut seen = rustc_hash::FxHashMap::default();
        let mut repeated = false;
        for (i, (key, _)) in items.iter().enumerate() {
            if let Some(text) = key.as_str() {
                if seen.insert(text, i).is_some() {
                    repeated = true;
                }
            }
        }
        if !repeated {
            return Some(items);
        }
        // Each repeated key at its first place, with the value of its last.
        let mut placed: rustc_hash::FxHashSet<&str> = rustc_hash::FxHashSet::default();
        let mut kept = Vec::with_capacity(seen.len());
        for &(key, value) in &items {
            match key.as_str() {
                Some(text) if placed.insert(text) => kept.push((key, items[seen[text]].1)),
                Some(_) => {}
                None => kept.push((key, value)),
            }
        }
        Some(kept)
    }

    /// Whether the value is a dict.
    pub fn is_dict(self) -> bool {
        self.r.kind() == kind::DICT
    }

    /// The value under the string key `key`, when the value is a dict that has it (the last
    /// one set, as in Python).
    pub fn get(self, key: &str) -> Option<ValueRef<'d>> {
        if self.r.kind() != kind::DICT {
            return None;
        }
        self.doc
            .elements(self.r)
            .chunks_exact(2)
            .rev()
            .find(|pair| self.doc.at(pair[0]).as_str() == Some(key))
            .map(|pair| self.doc.at(pair[1]))
    }

    /// A number that identifies a string, bytes or non-empty container; `None` for scalars
    /// and empty containers. Two values with the same identity are equal: they are one
    /// memoized object, or lists (or tuples) of the very same elements, which a document
    /// stores once. Importers use it to convert each shared object once.
    #[inline]
    pub fn identity(self) -> Option<usize> {
        // The kind in the low four bits, above it the position of the value in the table of
        // its kind or, for a container, of its first element in the pool: containers share
        // that position only while they share their elements.
        let (kind, at) = match self.r.kind() {
            k @ (kind::STR | kind::BYTES | kind::BIG_INT) => (k, self.r.index() as u64),
            k if self.r.is_container() => {
                let c = &self.doc.containers[self.r.index()];
                if c.len == 0 {
                    return None;
                }
                (k, c.start as u64)
            }
            _ => return None,
        };
        usize::try_from((at << 4) | kind as u64).ok()
    }

    /// The number of the container in the document's table, when the value is a container:
    /// how a streaming read tells the containers made for an entry from older ones.
    #[inline]
    pub fn container_index(self) -> Option<usize> {
        self.r.is_container().then(|| self.r.index())
    }

    /// What the value stands in for, when a streaming read made it of a consumed entry's
    /// frames list or frame dict.
    #[inline]
    pub fn standin(self) -> Option<Standin> {
        Standin::from_ref(self.r)
    }

    /// The value as a [`Value`] tree, in which every memo-shared object and every list of
    /// the very same elements is one reference-counted allocation.
    pub fn to_value(self) -> Value {
        ValueBuilder::new(self.doc).build(self.r)
    }
}

/// The elements of a list or tuple of a [`Document`].
#[derive(Clone, Copy)]
pub struct Seq<'d> {
    doc: &'d Document,
    refs: &'d [Ref],
}

impl<'d> Seq<'d> {
    /// The number of elements.
    pub fn len(self) -> usize {
        self.refs.len()
    }

    /// Whether there are no elements.
    pub fn is_empty(self) -> bool {
        self.refs.is_empty()
    }

    /// The element at `i`, if there is one.
    pub fn get(self, i: usize) -> Option<ValueRef<'d>> {
        self.refs.get(i).map(|&r| self.doc.at(r))
    }

    /// The last element, if there is one.
    pub fn last(self) -> Option<ValueRef<'d>> {
        self.refs.last().map(|&r| self.doc.at(r))
    }

    /// Puts into `out` a key of the elements that two lists share exactly when they hold the
    /// very same values, and returns whether it stays valid: `false` when an element is a
    /// container numbered `transient_from` or above, which a streaming read drops and whose
    /// number it gives again.
    pub fn stable_elements(self, transient_from: usize, out: &mut Vec<u32>) -> bool {
        out.clear();
        out.extend(self.refs.iter().map(|r| r.0));
        !self
            .refs
            .iter()
            .any(|r| r.is_container() && r.index() >= transient_from)
    }

    /// The elements in order.
    pub fn iter(self) -> impl DoubleEndedIterator<Item = ValueRef<'d>> + ExactSizeIterator {
        let doc = self.doc;
        self.refs.iter().map(move |&r| doc.at(r))
    }
}
