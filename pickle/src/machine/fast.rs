//! The fast path of a streaming read: a decoder for the one shape that makes up nearly all of
//! a PyTorch snapshot's bytes, a trace entry as Python's pickler writes it, which hands the
//! entry to the sink without building a value of it in the document.
//!
//! A trace entry is `EMPTY_DICT`, a memo store, `MARK`, pairs whose keys are memo references
//! to the key strings (`action`, `addr`, `size`, `stream`, `time_us`, `frames`, …) and whose
//! values are integers, floats, `None`, booleans, memo references, new strings (each with its
//! memo store) and a new frames list of memo references to frame dicts (`EMPTY_LIST`, its memo
//! store, then `MARK … APPENDS` runs or one `… APPEND`), and `SETITEMS`. When a streaming
//! read ([`super::stream`]) is in a run of entries and meets an `EMPTY_DICT`,
//! [`Machine::fast_entry`] decodes the bytes from there without changing anything
//! ([`decode`]). Anything outside that shape, or past the bytes at hand, leaves the machine
//! as it was and the generic machine reads the entry, opcode by opcode, as it always did: the
//! entries with new keys, new frame dicts, an unusual memo store, a `FRAME` inside them. A
//! decoded entry is then committed exactly as the generic machine leaves one once its sink
//! has converted it: its new strings added to the document and memoized, the entry and its
//! lists memoized as the stand-ins the sink made of them (`super::stream::consume_entry`),
//! the entry's place on the stack taken by the consumed entry. The sink converts it through
//! [`EntrySink::fast_entry`](super::stream::EntrySink::fast_entry) from a [`FastEntry`]:
//! its pairs as the document's values where the document has them ([`FastValue::Doc`]), and
//! as plain numbers and element lists where the generic machine would have made values of
//! the entry's own and dropped them again.
//!
//! The memory budget is checked after a decoded entry when its opcodes took the count to
//! the next check, rather than inside it, where the generic machine would also hold the
//! entry's own values: the two paths can disagree only for an input whose document is within
//! one entry's values of the budget.

use super::{Machine, Memo, Step, BUDGET_CHECK_EVERY};
use crate::args::{int_from_le, PyInt};
use crate::document::{kind, Document, Ref, MAX_TABLE};
use crate::machine::stream::{Standin, Stream};
use crate::opcodes::*;
use crate::ValueRef;

/// A value of a trace entry that the fast path decoded.
#[derive(Clone, Copy, Debug)]
pub enum FastValue<'d> {
    /// A value the document holds: what a memo reference names, a new string (which the
    /// document keeps, as the generic machine keeps it), `None` or a boolean.
    Doc(ValueRef<'d>),
    /// An integer, which the generic machine would have put in the entry's own values.
    Int(i64),
    /// A float, likewise.
    Float(f64),
    /// A list made for the entry, of values the document holds.
    List(FastList<'d>),
}

impl<'d> FastValue<'d> {
    /// The Python type name of the value, as [`ValueRef::type_name`] gives it.
    #[inline]
    pub fn type_name(self) -> &'static str {
        match self {
            FastValue::Doc(v) => v.type_name(),
            FastValue::Int(_) => "int",
            FastValue::Float(_) => "float",
            FastValue::List(_) => "list",
        }
    }

    /// Whether the value is `None`.
    #[inline]
    pub fn is_none(self) -> bool {
        matches!(self, FastValue::Doc(v) if v.is_none())
    }

    /// The integer, when the value is an `int` that fits in an `i64`.
    #[inline]
    pub fn as_i64(self) -> Option<i64> {
        match self {
            FastValue::Doc(v) => v.as_i64(),
            FastValue::Int(i) => Some(i),
            _ => None,
        }
    }

    /// The integer, when the value is a non-negative `int` that fits in a `u64`.
    #[inline]
    pub fn as_u64(self) -> Option<u64> {
        match self {
            FastValue::Doc(v) => v.as_u64(),
            FastValue::Int(i) => u64::try_from(i).ok(),
            _ => None,
        }
    }

    /// The float, when the value is a `float`.
    #[inline]
    pub fn as_float(self) -> Option<f64> {
        match self {
            FastValue::Doc(v) => v.as_float(),
            FastValue::Float(f) => Some(f),
            _ => None,
        }
    }

    /// The text, when the value is a `str`.
    #[inline]
    pub fn as_str(self) -> Option<&'d str> {
        match self {
            FastValue::Doc(v) => v.as_str(),
            _ => None,
        }
    }
}

/// A list made for a trace entry that the fast path decoded: its elements are values the
/// document holds from before the entry.
#[derive(Clone, Copy)]
pub struct FastList<'d> {
    doc: &'d Document,
    /// The elements' references, as [`Ref::raw`] gives them.
    refs: &'d [u32],
    /// The number the generic machine gives the list's container.
    container: usize,
}

impl std::fmt::Debug for FastList<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

impl<'d> FastList<'d> {
    /// The number of elements.
    #[inline]
    pub fn len(self) -> usize {
        self.refs.len()
    }

    /// Whether there are no elements.
    #[inline]
    pub fn is_empty(self) -> bool {
        self.refs.is_empty()
    }

    /// The elements in order.
    #[inline]
    pub fn iter(self) -> impl DoubleEndedIterator<Item = ValueRef<'d>> + ExactSizeIterator {
        let doc = self.doc;
        self.refs.iter().map(move |&r| doc.at(Ref::from_raw(r)))
    }

    /// The container number the generic machine gives the list, as
    /// [`ValueRef::container_index`] gives it for the same list read by it: numbered from the
    /// entry's own (`transient_from`) on.
    #[inline]
    pub fn container_index(self) -> usize {
        self.container
    }

    /// The key of the elements that [`crate::Seq::stable_elements`] gives for the same list
    /// read by the generic machine, when it stays valid (it always does: the elements are
    /// values from before the entry).
    #[inline]
    pub fn stable_elements(self, transient_from: usize) -> Option<&'d [u32]> {
        // The decoder takes every element from the memo as the entry began, so none is a
        // container numbered from `transient_from` on: the key is always valid.
        debug_assert!(self.refs.iter().all(|&r| {
            let r = Ref::from_raw(r);
            !(r.is_container() && r.index() >= transient_from)
        }));
        Some(self.refs)
    }
}

/// A trace entry that the fast path decoded, for [`EntrySink::fast_entry`](super::stream::EntrySink::fast_entry).
pub struct FastEntry<'d> {
    doc: &'d Document,
    pairs: &'d [(Ref, Val)],
    elements: &'d [u32],
    lists: &'d [(u32, u32)],
    transient_from: usize,
}

impl<'d> FastEntry<'d> {
    /// The number of key/value pairs, a key set twice counted twice.
    #[inline]
    pub fn len(&self) -> usize {
        self.pairs.len()
    }

    /// Whether the entry has no pairs.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.pairs.is_empty()
    }

    /// The key/value pairs in the order the pickle set them, as
    /// [`ValueRef::dict_items`] gives them for the same entry read by the generic machine.
    pub fn pairs(&self) -> impl ExactSizeIterator<Item = (ValueRef<'d>, FastValue<'d>)> + '_ {
        (0..self.pairs.len()).map(|i| (self.key(i), self.value(i)))
    }

    /// Whether the keys of the entry's pairs are, in order, those of another entry of the
    /// same document that [`FastEntry::key_ids`] gave `ids`: the very same values (PyTorch
    /// memoizes each key string once and every entry refers to it), so that whatever was
    /// found of that entry's keys holds for this one's.
    #[inline]
    pub fn keys_are(&self, ids: &[u32]) -> bool {
        self.pairs.len() == ids.len() && self.pairs.iter().zip(ids).all(|(p, &id)| p.0.raw() == id)
    }

    /// The keys of the entry's pairs in order, as numbers that name each value of the
    /// document (for [`FastEntry::keys_are`]).
    pub fn key_ids(&self) -> impl ExactSizeIterator<Item = u32> + '_ {
        self.pairs.iter().map(|p| p.0.raw())
    }

    /// The key of the `i`-th pair (see [`FastEntry::pairs`]).
    ///
    /// # Panics
    ///
    /// When there are not so many pairs.
    #[inline]
    pub fn key(&self, i: usize) -> ValueRef<'d> {
        self.doc.at(self.pairs[i].0)
    }

    /// The value of the `i`-th pair (see [`FastEntry::pairs`]).
    ///
    /// # Panics
    ///
    /// When there are not so many pairs.
    #[inline]
    pub fn value(&self, i: usize) -> FastValue<'d> {
        match self.pairs[i].1 {
            Val::Ref(r) => FastValue::Doc(self.doc.at(r)),
            Val::Int(i) => FastValue::Int(i),
            Val::Float(f) => FastValue::Float(f),
            Val::List(k) => {
                let (start, len) = self.lists[k as usize];
                FastValue::List(FastList {
                    doc: self.doc,
                    refs: &self.elements[start as usize..(start + len) as usize],
                    container: self.transient_from + 1 + k as usize,
                })
            }
        }
    }
}

/// A value as [`decode`] reads it.
#[derive(Clone, Copy, Debug)]
pub(super) enum Val {
    /// A value the document holds, or, once decoded, a new string by its place in
    /// [`Scratch::strings`] until it is added ([`Val::Ref`] then).
    Ref(Ref),
    Int(i64),
    Float(f64),
    /// The list at this place of [`Scratch::lists`].
    List(u32),
}

/// What one of an entry's memo stores stores, in order.
#[derive(Clone, Copy)]
enum Put {
    /// The entry's dict.
    Dict,
    /// The new string at this place of [`Scratch::strings`].
    Str(u32),
    /// The list at this place of [`Scratch::lists`].
    List(u32),
}

/// The fast path's buffers, kept from one entry to the next so that decoding allocates
/// nothing once they have grown.
#[derive(Default)]
pub(crate) struct Scratch {
    pairs: Vec<(Ref, Val)>,
    /// A value that is a new string is `Val::Ref` of [`Scratch::NEW_STRING`] with its place
    /// here in `new_strings`.
    new_strings: Vec<usize>,
    /// The elements of all the entry's lists, as [`Ref::raw`] gives them.
    elements: Vec<u32>,
    /// Each list's first element in `elements`, and its length.
    lists: Vec<(u32, u32)>,
    /// Each new string's bytes, as their range in the input at hand.
    strings: Vec<(usize, usize)>,
    /// Each string's reference once added.
    string_refs: Vec<Ref>,
    puts: Vec<Put>,
}

impl Scratch {
    fn clear(&mut self) {
        self.pairs.clear();
        self.new_strings.clear();
        self.elements.clear();
        self.lists.clear();
        self.strings.clear();
        self.string_refs.clear();
        self.puts.clear();
    }
}

/// The little-endian bytes `data[at..at + N]`, if there are so many.
#[inline(always)]
fn bytes<const N: usize>(data: &[u8], at: usize) -> Option<[u8; N]> {
    data.get(at..at + N)?.try_into().ok()
}

/// What [`decode`] reads from: the input and the memo as the entry begins.
struct Decoder<'a> {
    data: &'a [u8],
    memo: &'a [Ref],
    /// Whether `MEMOIZE` stores where the dense memo ends (no sparse index was stored).
    memoize_dense: bool,
    /// Opcodes read.
    ops: u32,
}

impl Decoder<'_> {
    /// A memo store at `p`: `Some(Some(next))` when there is one at the index the entry's
    /// next store goes to (`index`), `Some(None)` when there is none, `None` for any other.
    #[inline(always)]
    fn put(&mut self, p: usize, index: usize) -> Option<Option<usize>> {
        let (at, next) = match *self.data.get(p)? {
            MEMOIZE if self.memoize_dense => (index, p + 1),
            BINPUT => (self.data.get(p + 1).copied()? as usize, p + 2),
            LONG_BINPUT => (u32::from_le_bytes(bytes(self.data, p + 1)?) as usize, p + 5),
            MEMOIZE => return None,
            _ => return Some(None),
        };
        self.ops += 1;
        (at == index).then_some(Some(next))
    }

    /// A memo reference at `p` to a slot from before the entry, and where the next opcode is.
    #[inline(always)]
    fn get(&mut self, p: usize) -> Option<(Ref, usize)> {
        let (index, next) = match *self.data.get(p)? {
            BINGET => (self.data.get(p + 1).copied()? as usize, p + 2),
            LONG_BINGET => (u32::from_le_bytes(bytes(self.data, p + 1)?) as usize, p + 5),
            _ => return None,
        };
        self.ops += 1;
        self.memo.get(index).map(|&r| (r, next))
    }
}

/// Decodes the entry whose `EMPTY_DICT` ends at `p` in `data` into `s`, with the memo as it is
/// (`memo`): where the entry ends and how many opcodes it holds after `EMPTY_DICT`, or `None`
/// when it is not of the shape the fast path reads (the generic machine reads it then).
fn decode(data: &[u8], mut p: usize, memo: &Memo, s: &mut Scratch) -> Option<(usize, u32)> {
    s.clear();
    let memo_start = memo.dense.len();
    let mut d = Decoder {
        data,
        memo: &memo.dense,
        memoize_dense: memo.sparse.is_empty(),
        ops: 0,
    };
    if let Some(next) = d.put(p, memo_start)? {
        s.puts.push(Put::Dict);
        p = next;
    }
    if *data.get(p)? != MARK {
        return None;
    }
    p += 1;
    d.ops += 1;
    loop {
        if *data.get(p)? == SETITEMS {
            d.ops += 1;
            return Some((p + 1, d.ops));
        }
        let (key, next) = d.get(p)?;
        p = next;
        let op = *data.get(p)?;
        d.ops += 1;
        let value = match op {
            BININT1 => {
                p += 2;
                Val::Int(*data.get(p - 1)? as i64)
            }
            BININT2 => {
                p += 3;
                Val::Int(u16::from_le_bytes(bytes(data, p - 2)?) as i64)
            }
            BININT => {
                p += 5;
                Val::Int(i32::from_le_bytes(bytes(data, p - 4)?) as i64)
            }
            LONG1 => {
                let n = *data.get(p + 1)? as usize;
                let digits = data.get(p + 2..p + 2 + n)?;
                let value = match bytes::<8>(data, p + 2) {
                    // Eight bytes at hand from the first digit: the value is the first `n`
                    // of them, sign-extended, as `int_from_le` reads them.
                    Some(le) if (1..=8).contains(&n) => {
                        let shift = 64 - 8 * n as u32;
                        ((u64::from_le_bytes(le) << shift) as i64) >> shift
                    }
                    _ => match int_from_le(digits) {
                        PyInt::Fits(i) => i,
                        PyInt::Big(_) => return None,
                    },
                };
                p += 2 + n;
                Val::Int(value)
            }
            BINFLOAT => {
                p += 9;
                Val::Float(f64::from_be_bytes(bytes(data, p - 8)?))
            }
            NONE => {
                p += 1;
                Val::Ref(Ref::NONE)
            }
            NEWTRUE => {
                p += 1;
                Val::Ref(Ref::TRUE)
            }
            NEWFALSE => {
                p += 1;
                Val::Ref(Ref::FALSE)
            }
            BINGET | LONG_BINGET => {
                d.ops -= 1;
                let (r, next) = d.get(p)?;
                p = next;
                Val::Ref(r)
            }
            SHORT_BINUNICODE | BINUNICODE => {
                let (n, start) = if op == SHORT_BINUNICODE {
                    (*data.get(p + 1)? as usize, p + 2)
                } else {
                    (u32::from_le_bytes(bytes(data, p + 1)?) as usize, p + 5)
                };
                let end = start.checked_add(n)?;
                std::str::from_utf8(data.get(start..end)?).ok()?;
                p = end;
                let k = s.strings.len() as u32;
                s.strings.push((start, end));
                s.new_strings.push(s.pairs.len());
                if let Some(next) = d.put(p, memo_start + s.puts.len())? {
                    s.puts.push(Put::Str(k));
                    p = next;
                }
                Val::Ref(Ref::new(kind::STR, k))
            }
            EMPTY_LIST => {
                p += 1;
                let k = s.lists.len() as u32;
                if let Some(next) = d.put(p, memo_start + s.puts.len())? {
                    s.puts.push(Put::List(k));
                    p = next;
                }
                let start = s.elements.len();
                p = list_elements(&mut d, p, &mut s.elements)?;
                s.lists
                    .push((start as u32, (s.elements.len() - start) as u32));
                // A writer that memoizes a list once it is filled (vramscope's own).
                if let Some(next) = d.put(p, memo_start + s.puts.len())? {
                    s.puts.push(Put::List(k));
                    p = next;
                }
                Val::List(k)
            }
            _ => return None,
        };
        s.pairs.push((key, value));
    }
}

/// Reads the elements added to the list just made, from `p`: runs of `MARK`, memo
/// references and `APPENDS`, or one memo reference and `APPEND`. Returns where they end.
#[inline(always)]
fn list_elements(d: &mut Decoder<'_>, mut p: usize, out: &mut Vec<u32>) -> Option<usize> {
    loop {
        match *d.data.get(p)? {
            MARK => {
                p += 1;
                let first = out.len();
                // The run of memo references, one- and four-byte, most of a snapshot's bytes.
                loop {
                    match *d.data.get(p)? {
                        BINGET => {
                            let index = *d.data.get(p + 1)? as usize;
                            out.push(d.memo.get(index)?.raw());
                            p += 2;
                        }
                        LONG_BINGET => {
                            let index = u32::from_le_bytes(bytes(d.data, p + 1)?) as usize;
                            out.push(d.memo.get(index)?.raw());
                            p += 5;
                        }
                        APPENDS => break,
                        _ => return None,
                    }
                }
                p += 1;
                // The MARK, the references and the APPENDS.
                d.ops += 2 + (out.len() - first) as u32;
            }
            BINGET | LONG_BINGET => {
                // One element and `APPEND`, or the next key.
                let ops = d.ops;
                let (r, next) = d.get(p)?;
                if d.data.get(next) != Some(&APPEND) {
                    d.ops = ops;
                    return Some(p);
                }
                out.push(r.raw());
                p = next + 1;
                d.ops += 1;
            }
            _ => return Some(p),
        }
    }
}

impl Machine<'_, '_> {
    /// At an `EMPTY_DICT` (read, `self.pos` after it) during a streaming read: decodes and
    /// commits the trace entry it begins when it is of the shape the fast path reads, and
    /// returns whether it did; else changes nothing, for the generic machine to read it.
    pub(super) fn fast_entry(&mut self) -> Step<bool> {
        let Some(stream) = &mut self.stream else {
            return Ok(false);
        };
        // The run's fields are read one by one: a copy of the whole run would load, in wide
        // pieces, what the last entry's commit has just stored in narrow ones (its count of
        // consumed entries), which stalls the load until the store completes.
        let Some(b) = &stream.batch else {
            return Ok(false);
        };
        let (marks, start, consumed) = (b.marks, b.start, b.consumed);
        // What the generic machine checks when it consumes the entry, or could fail on
        // while it reads one: left to it.
        if !stream.fast
            || stream.entry.is_some()
            || self.record_origins
            || self.marks.len() != marks
            || self.stack.len() != start + consumed as usize
            || consumed >= Standin::MAX
            || self.marks.len() + 2 > self.max_marks
            || !self.memo.sparse.is_empty()
        {
            return Ok(false);
        }
        let Some(mut s) = stream.scratch.take() else {
            return Ok(false);
        };
        let decoded = decode(self.data, self.pos, &self.memo, &mut s);
        let result = match decoded {
            Some((end, ops))
                if self.doc.containers.len() + 1 + s.lists.len() < MAX_TABLE
                    && s.strings.len() + self.doc.text_ends.len() < MAX_TABLE =>
            {
                self.commit(&mut s, end, ops).map(|()| true)
            }
            _ => Ok(false),
        };
        if let Some(stream) = &mut self.stream {
            stream.scratch = Some(s);
        }
        result
    }

    /// Commits the entry `s` decoded, of the run being read, which ends at `end` after `ops`
    /// opcodes: what the generic machine leaves after reading and consuming it.
    fn commit(&mut self, s: &mut Scratch, end: usize, ops: u32) -> Step<()> {
        let Some(b) = self
            .stream
            .as_ref()
            .and_then(|stream| stream.batch.as_ref())
        else {
            return Ok(());
        };
        let (consumed, base, position) = (b.consumed, b.base, b.position);
        let data = self.data;
        let transient_from = self.doc.containers.len();
        let memo_start = self.memo.dense.len();
        let entry = Ref::new(kind::ENTRY, consumed);
        self.op_pos = self.base + end - 1;
        self.op = SETITEMS;
        for &(start, end) in &s.strings {
            // `decode` checked that the bytes are UTF-8.
            let text = std::str::from_utf8(&data[start..end]).unwrap_or_default();
            let r = self.add_str(text)?;
            s.string_refs.push(r);
        }
        for &at in &s.new_strings {
            if let (_, Val::Ref(r)) = &mut s.pairs[at] {
                *r = s.string_refs[r.index()];
            }
        }
        for put in &s.puts {
            let r = match *put {
                Put::Dict => entry,
                Put::Str(k) => s.string_refs[k as usize],
                // Until the sink has made its stand-in.
                Put::List(_) => Stream::DROPPED,
            };
            self.memo.dense.push(r);
        }
        let Some(stream) = self.stream.as_mut() else {
            return Ok(());
        };
        let fast = FastEntry {
            doc: &self.doc,
            pairs: &s.pairs,
            elements: &s.elements,
            lists: &s.lists,
            transient_from,
        };
        let index = base + consumed as usize;
        if !stream
            .sink
            .fast_entry(&fast, position, index, transient_from)
        {
            return Err(self.not_streamable("the sink stopped"));
        }
        let mut own = false;
        for i in stream.sink.read().drain(..) {
            match self.doc.containers.get_mut(i) {
                Some(cont) if i < transient_from => cont.frozen = true,
                _ => own = true,
            }
        }
        if own {
            return Err(self.not_streamable("the sink read a container of the entry"));
        }
        let Some(stream) = self.stream.as_mut() else {
            return Ok(());
        };
        let standins = stream.sink.standins();
        standins.sort_unstable_by_key(|&(i, _)| i);
        for (i, put) in s.puts.iter().enumerate() {
            if let Put::List(k) = *put {
                let c = transient_from + 1 + k as usize;
                self.memo.dense[memo_start + i] = standins
                    .binary_search_by_key(&c, |&(i, _)| i)
                    .ok()
                    .and_then(|at| standins[at].1.to_ref())
                    .unwrap_or(Stream::DROPPED);
            }
        }
        standins.clear();
        if let Some(batch) = &mut stream.batch {
            batch.consumed += 1;
        }
        stream.fast_entries += 1;
        self.stack.push(entry);
        self.pos = end;
        if ops >= self.until_check {
            self.until_check = BUDGET_CHECK_EVERY;
            self.check_budget()?;
        } else {
            self.until_check -= ops;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use crate::machine::stream::{parse_streaming, EntrySink, Standin};
    use crate::{FastEntry, FastValue, Limits, ValueRef};

    /// A sink that writes each entry down as text, from the generic machine's document or
    /// from the fast path, and takes fast entries when `fast`.
    struct Recorder {
        fast: bool,
        entries: Vec<String>,
        fast_entries: usize,
        /// Whether the fast path read each entry.
        paths: Vec<bool>,
        read: Vec<usize>,
        standins: Vec<(usize, Standin)>,
    }

    impl Recorder {
        fn new(fast: bool) -> Recorder {
            Recorder {
                fast,
                entries: Vec::new(),
                fast_entries: 0,
                paths: Vec::new(),
                read: Vec::new(),
                standins: Vec::new(),
            }
        }
    }

    /// A value as text: scalars as they are, containers from before the entry by number,
    /// lists made for it by their elements.
    fn text(v: ValueRef<'_>, transient_from: usize) -> String {
        if let Some(i) = v.as_i64() {
            return format!("{i}");
        }
        if let Some(f) = v.as_float() {
            return format!("{f:?}");
        }
        if let Some(s) = v.as_str() {
            return format!("{s:?}");
        }
        if let Some(s) = v.standin() {
            return format!("{s:?}");
        }
        match (v.container_index(), v.as_seq()) {
            (Some(c), Some(seq)) if c >= transient_from => {
                let elements: Vec<String> = seq.iter().map(|e| text(e, transient_from)).collect();
                format!("[{}]#{c}", elements.join(", "))
            }
            (Some(c), _) => format!("{}#{c}", v.type_name()),
            _ => v.type_name().to_string(),
        }
    }

    fn fast_text(v: FastValue<'_>, transient_from: usize) -> String {
        match v {
            FastValue::Doc(v) => text(v, transient_from),
            FastValue::Int(i) => format!("{i}"),
            FastValue::Float(f) => format!("{f:?}"),
            FastValue::List(list) => {
                let elements: Vec<String> = list.iter().map(|e| text(e, transient_from)).collect();
                format!("[{}]#{}", elements.join(", "), list.container_index())
            }
        }
    }

    impl EntrySink for Recorder {
        fn entry(&mut self, entry: ValueRef<'_>, list: usize, index: usize, from: usize) -> bool {
            let pairs: Vec<String> = entry
                .dict_items()
                .into_iter()
                .flatten()
                .map(|(k, v)| format!("{}: {}", text(k, from), text(v, from)))
                .collect();
            self.entries.push(format!(
                "{list}.{index} from {from} {{{}}}",
                pairs.join(", ")
            ));
            self.paths.push(false);
            true
        }

        fn fast_entry(
            &mut self,
            entry: &FastEntry<'_>,
            list: usize,
            index: usize,
            from: usize,
        ) -> bool {
            self.fast_entries += 1;
            let pairs: Vec<String> = entry
                .pairs()
                .map(|(k, v)| format!("{}: {}", text(k, from), fast_text(v, from)))
                .collect();
            self.entries.push(format!(
                "{list}.{index} from {from} {{{}}}",
                pairs.join(", ")
            ));
            self.paths.push(true);
            true
        }

        fn takes_fast_entries(&self) -> bool {
            self.fast
        }

        fn read(&mut self) -> &mut Vec<usize> {
            &mut self.read
        }

        fn standins(&mut self) -> &mut Vec<(usize, Standin)> {
            &mut self.standins
        }

        fn memory(&self) -> usize {
            0
        }
    }

    /// `{"device_traces": [[entries]]}` in protocol 4, memoizing as Python does; `entries`
    /// writes the entries' opcodes given the memo indices of the keys `action`, `addr` and
    /// `frames`, of the string `alloc` and of two frame dicts.
    fn snapshot(entries: impl Fn(&mut Vec<u8>)) -> Vec<u8> {
        let mut out = vec![0x80, 4, b'}', 0x94, b'('];
        // Memo 1: the key; 2 and 3: the outer and the trace list.
        out.extend([0x8c, 13]);
        out.extend(b"device_traces");
        out.extend([0x94, b']', 0x94, b']', 0x94, b'(']);
        entries(&mut out);
        out.extend([b'e', b'a', b'u', b'.']);
        out
    }

    /// The first entry, which brings the keys `action`, `addr` and `frames` (memo 5, 7 and
    /// 8), `alloc` (6) and two frame dicts (10 and 11) into the memo; the generic machine
    /// reads it.
    fn first(out: &mut Vec<u8>) {
        out.extend([b'}', 0x94, b'(']);
        let (key, value) = ("action", "alloc");
        out.extend([0x8c, key.len() as u8]);
        out.extend(key.as_bytes());
        out.push(0x94);
        out.extend([0x8c, value.len() as u8]);
        out.extend(value.as_bytes());
        out.push(0x94);
        out.extend([0x8c, 4]);
        out.extend(b"addr");
        out.extend([0x94, b'K', 1]);
        out.extend([0x8c, 6]);
        out.extend(b"frames");
        out.extend([0x94, b']', 0x94, b'(']);
        for _ in 0..2 {
            out.extend([b'}', 0x94, b'(', b'h', 5, b'K', 7, b'u']);
        }
        out.extend([b'e', b'u']);
    }

    /// An entry of the shape the fast path reads, with `extra` before `SETITEMS`.
    fn usual(out: &mut Vec<u8>, addr: u64, extra: &[u8]) {
        out.extend([b'}', 0x94, b'(', b'h', 5, b'h', 6, b'h', 7, 0x8a, 8]);
        out.extend(addr.to_le_bytes());
        out.extend([
            b'h', 8, b']', 0x94, b'(', b'h', 10, b'h', 11, b'h', 10, b'e',
        ]);
        out.extend(extra);
        out.push(b'u');
    }

    /// Reads `bytes` with and without the fast path, which must agree on the entries written
    /// down and the documents' roots: the entries, and which of them the fast path read.
    fn both(bytes: &[u8]) -> (Vec<String>, Vec<bool>) {
        let limits = Limits::default();
        let mut fast = Recorder::new(true);
        let mut generic = Recorder::new(false);
        let a = parse_streaming(bytes, &limits, "device_traces", &mut fast).map(|s| {
            assert_eq!(s.fast_entries, fast.fast_entries);
            format!("{:?} {:?}", s.doc.root(), s.lists)
        });
        let b = parse_streaming(bytes, &limits, "device_traces", &mut generic)
            .map(|s| format!("{:?} {:?}", s.doc.root(), s.lists));
        assert_eq!(a, b);
        assert_eq!(fast.entries, generic.entries);
        assert_eq!(generic.fast_entries, 0);
        assert_eq!(fast.paths.iter().filter(|&&f| f).count(), fast.fast_entries);
        (fast.entries, fast.paths)
    }

    #[test]
    fn entries_of_pythons_shape_take_the_fast_path_and_read_as_the_generic_machine_reads_them() {
        let bytes = snapshot(|out| {
            first(out);
            for i in 0..5 {
                usual(out, (1 << 40) + i, &[]);
            }
        });
        let (entries, paths) = both(&bytes);
        assert_eq!(paths, [false, true, true, true, true, true]);
        assert!(entries[1].contains("\"alloc\""), "{}", entries[1]);
        assert!(entries[1].contains("1099511627776"), "{}", entries[1]);
    }

    #[test]
    fn other_shapes_are_left_to_the_generic_machine() {
        let strays: [&[u8]; 9] = [
            // A key that is a new string, not memoized.
            &[0x8c, 1, b'x', b'K', 1],
            // A value that is a new dict.
            &[b'h', 5, b'}', 0x94],
            // An integer of nine bytes.
            &[b'h', 5, 0x8a, 9, 0, 0, 0, 0, 0, 0, 0, 0, 1],
            // A memo store out of order.
            &[b'h', 5, b'K', 1, b'q', 3],
            // A FRAME between two opcodes.
            &[0x95, 0, 0, 0, 0, 0, 0, 0, 0, b'h', 5, b'K', 1],
            // A memo reference to a slot the entry made.
            &[b'h', 5, b'h', 200],
            // A string that is not UTF-8.
            &[b'h', 5, 0x8c, 1, 0xff],
            // A bytes value.
            &[b'h', 5, b'C', 1, b'x'],
            // An odd number of values.
            &[b'h', 5],
        ];
        for (k, stray) in strays.iter().enumerate() {
            let bytes = snapshot(|out| {
                first(out);
                usual(out, 1, &[]);
                usual(out, 2, stray);
                usual(out, 3, &[]);
            });
            let (entries, paths) = both(&bytes);
            // Read up to the stray, which the generic machine reads (or fails on).
            let expected = [false, true, false, true];
            assert_eq!(paths, expected[..paths.len()], "stray {k}: {entries:?}");
            assert!(paths.len() >= 2, "stray {k}: {entries:?}");
        }
    }

    #[test]
    fn values_of_every_kind_read_as_the_generic_machine_reads_them() {
        let values: [&[u8]; 10] = [
            b"N",
            &[0x88],
            &[0x89],
            &[b'M', 1, 2],
            &[b'J', 0xff, 0xff, 0xff, 0xff],
            &[0x8a, 0],
            &[0x8a, 3, 0, 0, 0x80],
            &[b'G', 0x3f, 0xf8, 0, 0, 0, 0, 0, 0],
            &[b'X', 2, 0, 0, 0, b'o', b'k', 0x94],
            &[b']', b'h', 11, b'a', 0x94],
        ];
        for (k, value) in values.iter().enumerate() {
            let mut extra = vec![b'h', 5];
            extra.extend(*value);
            let bytes = snapshot(|out| {
                first(out);
                usual(out, 1, &extra);
                usual(out, 2, &[]);
            });
            let (entries, paths) = both(&bytes);
            assert_eq!(paths, [false, true, true], "value {k}: {entries:?}");
        }
    }
}
