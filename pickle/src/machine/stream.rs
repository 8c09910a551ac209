//! Streaming the entries of one list of a pickle into a consumer as they are read, so that
//! the document never holds them: how `vramscope_import::pytorch` turns the millions of
//! `device_traces` entries of a big snapshot into events without a document of them.
//!
//! [`parse_streaming`] runs the machine of `super` with hooks at `MARK`, `EMPTY_DICT`,
//! `SETITEM(S)`, `APPEND(S)` and `STOP`. A list is streamed when the stack shows it as
//! Python's pickler writes `root[key][i]`: the root dict at the bottom with its `MARK` above
//! it, `key` among the keys above that mark, the outer list after it and the list itself
//! above. Each dict made directly above such a list (between its `MARK` and `APPENDS`) is an
//! entry: when its `SETITEMS` completes it, the [`EntrySink`] converts it, and everything the
//! document gained for it since its `EMPTY_DICT` (containers, elements, numbers) is dropped
//! again. What the memo may still reference is kept in a four-byte stand-in instead: the entry
//! itself (which nothing may use again), and the frames list and frame dicts made for it, as
//! the call site and frame numbers the sink made of them ([`Standin`]), and anything else as
//! a dropped value that may go nowhere that is kept. Strings are kept: later parts of the file
//! (annotations) use the same keys. The input is all at hand ([`parse_streaming`]) or arrives
//! in pieces, of which only a window from the opcode being read on is held
//! ([`parse_streaming_chunks`], with [`Machine::rebase`]), or comes from a reader whose length
//! is not known until it ends ([`parse_streaming_read`], and `Document::parse_read` for the
//! whole document; both run [`run_pieces`], and the bounds that scale with the input follow
//! the bytes read so far).
//!
//! Streaming is a bet that the pickle is as Python writes it, checked at every step; the
//! result must be exactly what reading the whole document and converting it gives. Whatever
//! could make it differ stops it: a stand-in put into a container that is kept, a container
//! from before an entry changed while the entry is read, a container the sink read changed
//! later, a memo slot from before an entry overwritten during it, entries on the stack that
//! are not the ones streamed, in order, or anything unusual about how a batch ends. Any error
//! stops it too. Then [`parse_streaming`] returns `None` and the caller reads the pickle whole,
//! which gives the result or the error it always gave; limits are enforced the same way, with
//! the sink's memory counted against the document's budget.

use std::io::Read;

use super::fast::{FastEntry, Scratch};
use super::{Machine, Step};
use crate::document::{kind, Document, Ref, PAYLOAD_MASK};
use crate::error::{PickleError, PickleErrorKind};
use crate::limits::Limits;
use crate::opcodes::APPENDS;
use crate::ValueRef;

/// What the memo keeps of a container made for a consumed entry that the pickle may
/// reference again: what the sink made of it rather than the container.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Standin {
    /// A frames list, as the number of its call site plus one (0 for none).
    Site(u32),
    /// A frame dict, as the number of its frame.
    Frame(u32),
}

impl Standin {
    /// The largest number a stand-in holds.
    pub const MAX: u32 = PAYLOAD_MASK;

    pub(super) fn to_ref(self) -> Option<Ref> {
        let (kind, n) = match self {
            Standin::Site(n) => (kind::SITE, n),
            Standin::Frame(n) => (kind::FRAME, n),
        };
        (n <= Self::MAX).then(|| Ref::new(kind, n))
    }

    /// The stand-in a reference holds, if it is one.
    pub(crate) fn from_ref(r: Ref) -> Option<Standin> {
        match r.kind() {
            kind::SITE => Some(Standin::Site(r.index() as u32)),
            kind::FRAME => Some(Standin::Frame(r.index() as u32)),
            _ => None,
        }
    }
}

/// The consumer of streamed entries.
pub trait EntrySink {
    /// Converts `entry`, the `index`-th entry of the list at position `list` of the streamed
    /// key's list. Containers numbered `transient_from` and above
    /// ([`ValueRef::container_index`]) were made for this entry and are dropped after the
    /// call: the sink must not remember them by identity. Returns `false` to stop streaming.
    fn entry(
        &mut self,
        entry: ValueRef<'_>,
        list: usize,
        index: usize,
        transient_from: usize,
    ) -> bool;
    /// The containers from before the entry that the last call read, whose content must not
    /// change afterwards; the reader drains it.
    fn read(&mut self) -> &mut Vec<usize>;
    /// The stand-ins of the entry's own containers that the last call converted; the reader
    /// drains it.
    fn standins(&mut self) -> &mut Vec<(usize, Standin)>;
    /// The bytes of memory the sink holds, counted against the reader's budget.
    fn memory(&self) -> usize;
    /// Whether the sink takes entries that the fast path decoded ([`EntrySink::fast_entry`]);
    /// when not (the default), the generic machine reads every entry.
    fn takes_fast_entries(&self) -> bool {
        false
    }
    /// Converts `entry`, decoded by the fast path without a document of it, exactly as
    /// [`EntrySink::entry`] converts the same entry read by the generic machine, with the
    /// same `list`, `index` and `transient_from` (the entry's own lists are numbered from
    /// `transient_from + 1`, as the generic machine numbers them, and stand-ins and reads are
    /// reported the same way). Returns `false` to stop streaming. Called only when
    /// [`EntrySink::takes_fast_entries`] is `true`.
    fn fast_entry(
        &mut self,
        entry: &FastEntry<'_>,
        list: usize,
        index: usize,
        transient_from: usize,
    ) -> bool {
        let _ = (entry, list, index, transient_from);
        false
    }
}

/// A list whose entries were streamed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StreamedList {
    /// The list's container number ([`ValueRef::container_index`]); the document keeps it
    /// empty.
    pub list: usize,
    /// Its position in the outer list, as the sink was told.
    pub position: usize,
    /// How many entries were streamed.
    pub entries: usize,
}

/// A pickle read with its entries streamed.
///
/// A list whose runs of entries were not all streamed one after another appears more than once
/// in `lists`, which the caller must refuse.
pub struct Streamed {
    /// Everything but the streamed entries.
    pub doc: Document,
    /// The lists whose entries went to the sink, in the order they were read.
    pub lists: Vec<StreamedList>,
    /// How many of the entries the fast path decoded ([`EntrySink::fast_entry`]); the
    /// generic machine read the others.
    pub fast_entries: usize,
}

/// Reads `bytes` within `limits`, streaming the entries of the lists of `root[key]` into
/// `sink`. `None` when the pickle cannot be streamed faithfully or is not valid: the caller
/// then reads it whole ([`Document::parse_with_limits`]), which gives the same result or the
/// error. A pickle without such lists is read whole here, with no lists streamed.
pub fn parse_streaming<'a>(
    bytes: &'a [u8],
    limits: &Limits,
    key: &'static str,
    sink: &'a mut dyn EntrySink,
) -> Option<Streamed> {
    if bytes.is_empty() || bytes.len() > limits.max_input_bytes {
        return None;
    }
    let mut machine = Machine::new(bytes, limits, false);
    machine.stream = Some(Stream::new(sink, key));
    let root = machine.run().ok()?;
    streamed(machine, root, limits)
}

/// [`parse_streaming`] for an input of `total` bytes that arrives in pieces: `next` appends
/// the next piece to the buffer it is given, or returns `false` at the end. Only a window of
/// the input is held, from the opcode being read on; an opcode whose bytes are not all at
/// hand yet runs again once they are. The pieces must add up to `total` bytes.
pub fn parse_streaming_chunks<'s>(
    total: usize,
    next: &mut dyn FnMut(&mut Vec<u8>) -> bool,
    limits: &Limits,
    key: &'static str,
    sink: &'s mut dyn EntrySink,
) -> Option<Streamed> {
    if total == 0 || total > limits.max_input_bytes {
        return None;
    }
    let mut parked: Machine<'static, 's> = Machine::of_input(&[], total, limits, false);
    parked.stream = Some(Stream::new(sink, key));
    let (machine, root) = run_pieces(parked, Some(total), next, limits).ok()?;
    streamed(machine, root, limits)
}

/// [`parse_streaming`] for an input whose length is not known until it ends, read from
/// `input` (what gzip data unpacks to, as it is unpacked). The memory budget, and the bounds
/// the sink keeps, scale with the bytes read so far ([`Limits::memory_budget`] of them), so
/// that a hostile input fails, and stops being read, as soon as a prefix of it breaks a
/// bound; a read error ends the input (the caller, who owns the reader, reports it first).
/// After `STOP`, the rest of the input is read to its end, and discarded, to know its length.
/// `None` as for [`parse_streaming`]: the caller then reads the input again with
/// [`Document::parse_read`].
pub fn parse_streaming_read<'s>(
    input: &mut dyn Read,
    limits: &Limits,
    key: &'static str,
    sink: &'s mut dyn EntrySink,
) -> Option<Streamed> {
    let mut parked: Machine<'static, 's> = Machine::unsized_input(limits, false);
    parked.stream = Some(Stream::new(sink, key));
    let (machine, root) = run_pieces(parked, None, &mut pieces(input), limits).ok()?;
    streamed(machine, root, limits)
}

/// The bytes [`pieces`] reads at a time.
const PIECE: u64 = 1 << 20;

/// Pieces of `input` for [`run_pieces`]: a read error ends them.
pub(crate) fn pieces(input: &mut dyn Read) -> impl FnMut(&mut Vec<u8>) -> bool + '_ {
    move |window| matches!((&mut *input).take(PIECE).read_to_end(window), Ok(n) if n > 0)
}

/// Runs `parked` over the input that `next` hands out in pieces, keeping only a window of it
/// from the opcode being read on, until `STOP`. `total` is the input's length when known; when
/// not, the rest of the input after `STOP` is read (and dropped) to learn it, and a `FRAME`
/// that announced more bytes than came is the error a sized read gives. `Err(None)` when the
/// pieces do not add up to `total`.
pub(crate) fn run_pieces<'s>(
    mut parked: Machine<'static, 's>,
    total: Option<usize>,
    next: &mut dyn FnMut(&mut Vec<u8>) -> bool,
    limits: &Limits,
) -> Result<(Machine<'static, 's>, Ref), Option<PickleError>> {
    let mut window: Vec<u8> = Vec::new();
    // The offset of `window[0]` in the input, and where to go on.
    let (mut base, mut at) = (0, 0);
    let mut ended = false;
    let mut wanted = 1;
    loop {
        while !ended && window.len() < wanted {
            ended = !next(&mut window);
        }
        let arrived = base + window.len();
        match total {
            Some(total) if arrived > total || (ended && arrived != total) => return Err(None),
            None if arrived > limits.max_input_bytes => {
                return Err(Some(PickleError {
                    offset: 0,
                    kind: PickleErrorKind::InputTooLarge {
                        size: arrived,
                        limit: limits.max_input_bytes,
                    },
                }))
            }
            None if ended && arrived == 0 => {
                return Err(Some(PickleError {
                    offset: 0,
                    kind: PickleErrorKind::Empty,
                }))
            }
            _ => {}
        }
        let mut machine = parked.rebase(&window, base, at, ended);
        match (machine.run(), machine.more) {
            (Ok(root), _) => {
                at = machine.op_pos() + 1;
                let mut done = machine.rebase(&[], at, at, ended);
                if total.is_none() && !ended {
                    // The input's length, for the budget, the document and any FRAME.
                    let mut rest = arrived;
                    window.clear();
                    while next(&mut window) {
                        rest += window.len();
                        window.clear();
                    }
                    rest += window.len();
                    done = done.rebase(&[], rest, rest, true);
                }
                if let Some((op, start, len)) = done.frame_due {
                    let available = done.total.saturating_sub(start) as u64;
                    if len > available {
                        return Err(Some(PickleError {
                            offset: op,
                            kind: PickleErrorKind::Truncated {
                                opcode: "FRAME",
                                needed: len,
                                available,
                            },
                        }));
                    }
                }
                return Ok((done, root));
            }
            (Err(_), Some(more)) if !ended => {
                at = machine.op_pos();
                parked = machine.rebase(&[], at, at, false);
                window.drain(..at - base);
                base = at;
                wanted = more;
            }
            (Err(e), _) => {
                // A FRAME past the end of an input that has ended is the first error, as a
                // sized read finds it.
                let frame = machine.frame_due.filter(|_| ended);
                return Err(Some(match frame {
                    Some((op, start, len)) if len > (arrived.saturating_sub(start)) as u64 => {
                        PickleError {
                            offset: op,
                            kind: PickleErrorKind::Truncated {
                                opcode: "FRAME",
                                needed: len,
                                available: arrived.saturating_sub(start) as u64,
                            },
                        }
                    }
                    _ => e,
                }));
            }
        }
    }
}

/// The result of a streaming read that popped `root` at `STOP`, once checked.
fn streamed(mut machine: Machine<'_, '_>, root: Ref, limits: &Limits) -> Option<Streamed> {
    if Stream::is_standin(root) {
        return None;
    }
    let stream = machine.stream.take()?;
    let (lists, fast_entries) = (stream.lists, stream.fast_entries);
    let mut doc = machine.doc;
    doc.root = root;
    doc.check(limits).ok()?;
    Some(Streamed {
        doc,
        lists,
        fast_entries,
    })
}

/// The machine's streaming state.
pub(crate) struct Stream<'a> {
    pub(super) sink: &'a mut dyn EntrySink,
    /// The key of the root dict whose lists are streamed.
    key: &'static str,
    /// The run of entries being read for a list, between its `MARK` (or first entry) and
    /// its `APPENDS` (or `APPEND`).
    pub(super) batch: Option<Batch>,
    /// The entry being read.
    pub(super) entry: Option<Checkpoint>,
    lists: Vec<StreamedList>,
    /// Keys the machine's table of equal lists gained while the entry was read.
    sequence_keys: Vec<(u32, u64)>,
    /// Whether the sink takes entries from the fast path ([`EntrySink::takes_fast_entries`]).
    pub(super) fast: bool,
    /// The fast path's buffers, kept from one entry to the next (boxed, so that taking them
    /// for an entry moves a pointer).
    pub(super) scratch: Option<Box<Scratch>>,
    /// Entries the fast path decoded.
    pub(super) fast_entries: usize,
}

/// A run of entries being read for one list.
#[derive(Clone, Copy)]
pub(super) struct Batch {
    /// The list.
    pub(super) list: Ref,
    /// Its position in the outer list.
    pub(super) position: usize,
    /// Stack position of the run's first entry.
    pub(super) start: usize,
    /// How many marks are open while the run is read (its own included, when it has one).
    pub(super) marks: usize,
    /// Whether the run began with a `MARK` (`APPENDS`) or is one entry (`APPEND`).
    pub(super) has_mark: bool,
    /// Entries of the run consumed so far.
    pub(super) consumed: u32,
    /// Entries of the list streamed in earlier runs.
    pub(super) base: usize,
}

/// The document's size when an entry began, to drop what was made for it.
#[derive(Clone, Copy)]
pub(super) struct Checkpoint {
    /// The entry.
    dict: Ref,
    containers: usize,
    items: usize,
    ints: usize,
    floats: usize,
    /// The memo's dense length and its count of sparse stores.
    memo: usize,
    sparse_puts: u64,
}

impl<'s> Stream<'s> {
    /// The keys of the root dict searched for the streamed key: Python writes a snapshot's
    /// four, and a bound keeps the search short however many a crafted pickle has.
    const ROOT_KEYS: usize = 16;

    fn new(sink: &'s mut dyn EntrySink, key: &'static str) -> Stream<'s> {
        let fast = sink.takes_fast_entries();
        Stream {
            sink,
            key,
            batch: None,
            entry: None,
            lists: Vec::new(),
            sequence_keys: Vec::new(),
            fast,
            scratch: Some(Box::default()),
            fast_entries: 0,
        }
    }

    /// What the memo keeps of a value made for a consumed entry that the sink did not
    /// convert: like a consumed entry, it converts to nothing and may go nowhere that is
    /// kept.
    pub(super) const DROPPED: Ref = Ref::new(kind::ENTRY, PAYLOAD_MASK);

    /// Whether `r` is a stand-in or a consumed entry, which only streaming makes.
    pub(super) fn is_standin(r: Ref) -> bool {
        (kind::ENTRY..=kind::FRAME).contains(&r.kind())
    }

    /// Records a key of the table of equal lists gained while an entry is read.
    pub(super) fn sequence_key(&mut self, key: (u32, u64)) {
        if self.entry.is_some() {
            self.sequence_keys.push(key);
        }
    }

    /// The sink's memory, for the budget.
    pub(super) fn memory(&self) -> usize {
        self.sink.memory()
            + self.lists.len() * std::mem::size_of::<StreamedList>()
            + self.sequence_keys.len() * 16
    }
}

impl Machine<'_, '_> {
    /// The error that stops streaming; [`parse_streaming`] never shows it.
    pub(super) fn not_streamable(&self, why: &str) -> PickleError {
        self.error(PickleErrorKind::BadArgument {
            opcode: self.name(),
            reason: format!("not streamable: {why}"),
        })
    }

    /// The position in `root[key]` of the list at stack position `p`, when the stack holds it
    /// as Python's pickler writes it: the root dict at the bottom with its mark above it, `key`
    /// among the first [`Stream::ROOT_KEYS`] keys above that mark, the outer list after it,
    /// and then either the list itself, or a mark and lists up to this one. `outer` are the
    /// marks open below the list.
    fn trace_position(&self, p: usize, outer: &[usize]) -> Option<usize> {
        let stream = self.stream.as_ref()?;
        if self.stack.first()?.kind() != kind::DICT
            || outer.first() != Some(&1)
            || self.stack.get(p)?.kind() != kind::LIST
        {
            return None;
        }
        let mut k = 1;
        loop {
            if k + 1 >= p || k > 2 * Stream::ROOT_KEYS {
                return None;
            }
            let r = self.stack[k];
            if r.kind() == kind::STR && self.doc.text_of(r.index()) == stream.key {
                break;
            }
            k += 2;
        }
        let outer_list = self.stack[k + 1];
        if outer_list.kind() != kind::LIST {
            return None;
        }
        let before = self.doc.containers[outer_list.index()].len as usize;
        match *outer {
            [1] if p == k + 2 => Some(before),
            [1, m] if m == k + 2 => Some(before + (p - m)),
            _ => None,
        }
    }

    /// Entries of `list` streamed in earlier runs, which are the last runs streamed: a list
    /// streamed again after another one was is recorded twice, which the caller refuses.
    fn streamed_before(&self, list: Ref) -> usize {
        self.stream.as_ref().map_or(0, |s| match s.lists.last() {
            Some(l) if l.list == list.index() => l.entries,
            _ => 0,
        })
    }

    /// After a `MARK`: a run of entries begins when the mark is above a streamed list.
    pub(super) fn stream_mark(&mut self) {
        let Some(stream) = &self.stream else {
            return;
        };
        if stream.batch.is_some() || stream.entry.is_some() || !(2..=3).contains(&self.marks.len())
        {
            return;
        }
        let Some(p) = self.stack.len().checked_sub(1) else {
            return;
        };
        let Some(position) = self.trace_position(p, &self.marks[..self.marks.len() - 1]) else {
            return;
        };
        let list = self.stack[p];
        let base = self.streamed_before(list);
        if let Some(stream) = &mut self.stream {
            stream.batch = Some(Batch {
                list,
                position,
                start: self.stack.len(),
                marks: self.marks.len(),
                has_mark: true,
                consumed: 0,
                base,
            });
        }
    }

    /// After an `EMPTY_DICT` pushed `dict`: an entry begins when it lies directly in a run,
    /// or directly above a streamed list (a list of one entry, which `APPEND` adds).
    pub(super) fn stream_dict(&mut self, dict: Ref) {
        let Some(stream) = &self.stream else {
            return;
        };
        if stream.entry.is_some() {
            return;
        }
        match stream.batch {
            Some(b) if self.marks.len() == b.marks && self.stack.len() > b.start => {}
            Some(_) => return,
            None => {
                let Some(p) = self.stack.len().checked_sub(2) else {
                    return;
                };
                if !(1..=2).contains(&self.marks.len()) {
                    return;
                }
                let Some(position) = self.trace_position(p, &self.marks) else {
                    return;
                };
                let list = self.stack[p];
                let base = self.streamed_before(list);
                let batch = Batch {
                    list,
                    position,
                    start: p + 1,
                    marks: self.marks.len(),
                    has_mark: false,
                    consumed: 0,
                    base,
                };
                if let Some(stream) = &mut self.stream {
                    stream.batch = Some(batch);
                }
            }
        }
        let checkpoint = Checkpoint {
            dict,
            containers: dict.index(),
            items: self.doc.items.len(),
            ints: self.doc.ints.len(),
            floats: self.doc.floats.len(),
            memo: self.memo.dense.len(),
            sparse_puts: self.memo.sparse_puts,
        };
        if let Some(stream) = &mut self.stream {
            stream.entry = Some(checkpoint);
        }
    }

    /// Whether container `c` was made for the entry being read, which drops it once the sink
    /// has converted the entry.
    pub(super) fn made_for_entry(&self, c: usize) -> bool {
        self.stream
            .as_ref()
            .and_then(|stream| stream.entry)
            .is_some_and(|entry| c >= entry.containers)
    }

    /// After a `SETITEM` or `SETITEMS` into `target`: the entry is complete when it is the
    /// target and no mark of its own is open.
    pub(super) fn stream_filled(&mut self, target: Ref) -> Step<()> {
        let Some(stream) = &self.stream else {
            return Ok(());
        };
        match (stream.entry, stream.batch) {
            (Some(c), Some(b)) if c.dict == target && self.marks.len() == b.marks => {
                self.consume_entry(c, b)
            }
            _ => Ok(()),
        }
    }

    /// Converts the complete entry of `checkpoint`, puts its stand-ins in the memo and on the
    /// stack, and drops what the document gained for it.
    fn consume_entry(&mut self, c: Checkpoint, b: Batch) -> Step<()> {
        // The entries before this one are checked once, when the run ends.
        let n = b.consumed as usize;
        let in_order = self.stack.len() == b.start + n + 1 && self.stack[b.start + n] == c.dict;
        if !in_order || b.consumed >= Standin::MAX {
            return Err(self.not_streamable("the run's entries are not in order"));
        }
        if self.memo.sparse_puts != c.sparse_puts {
            return Err(self.not_streamable("a sparse memo index inside an entry"));
        }
        let Some(stream) = self.stream.as_mut() else {
            return Ok(());
        };
        let index = b.base + n;
        if !stream
            .sink
            .entry(self.doc.at(c.dict), b.position, index, c.containers)
        {
            return Err(self.not_streamable("the sink stopped"));
        }
        let mut own = false;
        for i in stream.sink.read().drain(..) {
            match self.doc.containers.get_mut(i) {
                Some(cont) if i < c.containers => cont.frozen = true,
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
        let entry = Ref::new(kind::ENTRY, b.consumed);
        for slot in &mut self.memo.dense[c.memo..] {
            let r = *slot;
            let made_for_entry = match r.kind() {
                kind::INT => r.index() >= c.ints,
                kind::FLOAT => r.index() >= c.floats,
                _ => r.is_container() && r.index() >= c.containers,
            };
            if r == c.dict {
                *slot = entry;
            } else if made_for_entry {
                *slot = standins
                    .binary_search_by_key(&r.index(), |&(i, _)| i)
                    .ok()
                    .filter(|_| r.is_container())
                    .and_then(|at| standins[at].1.to_ref())
                    .unwrap_or(Stream::DROPPED);
            }
        }
        standins.clear();
        let Some(stream) = self.stream.as_mut() else {
            return Ok(());
        };
        for key in stream.sequence_keys.drain(..) {
            if self
                .sequences
                .get(&key)
                .is_some_and(|&v| v as usize >= c.containers)
            {
                self.sequences.remove(&key);
            }
        }
        stream.entry = None;
        if let Some(batch) = &mut stream.batch {
            batch.consumed += 1;
        }
        if let Some(top) = self.stack.last_mut() {
            *top = entry;
        }
        self.doc.containers.truncate(c.containers);
        self.doc.items.truncate(c.items);
        self.doc.ints.truncate(c.ints);
        self.doc.floats.truncate(c.floats);
        Ok(())
    }

    /// Before an `APPEND` or `APPENDS` of the values `region` (above stack position `from`)
    /// into `target`: when the target is the run's list and the values are its consumed
    /// entries in order, the run ends and the list records them instead. Returns whether it
    /// did; the caller then drops the values.
    pub(super) fn stream_appends(&mut self, target: Ref, from: usize) -> Step<bool> {
        let Some(stream) = &self.stream else {
            return Ok(false);
        };
        let Some(b) = stream.batch else {
            return Ok(false);
        };
        let closes = if self.op == APPENDS {
            b.has_mark && from == b.start
        } else {
            !b.has_mark && from == b.start
        };
        if target != b.list || !closes {
            if closes && (b.consumed > 0 || stream.entry.is_some()) {
                return Err(self.not_streamable("a run of entries ends elsewhere"));
            }
            if closes {
                self.cancel_batch();
            }
            return Ok(false);
        }
        if stream.entry.is_some() {
            return Err(self.not_streamable("a run ends inside an entry"));
        }
        if b.consumed == 0 {
            self.cancel_batch();
            return Ok(false);
        }
        let region = &self.stack[from..];
        let in_order = region.len() == b.consumed as usize
            && region
                .iter()
                .enumerate()
                .all(|(i, &r)| r == Ref::new(kind::ENTRY, i as u32));
        if !in_order {
            return Err(self.not_streamable("the appended entries are not the run's"));
        }
        let Some(stream) = self.stream.as_mut() else {
            return Ok(false);
        };
        let consumed = b.consumed as usize;
        match stream.lists.last_mut() {
            Some(l) if l.list == b.list.index() && l.position == b.position => {
                l.entries += consumed;
            }
            Some(l) if l.list == b.list.index() => {
                return Err(self.not_streamable("a list moved in its outer list"));
            }
            _ => stream.lists.push(StreamedList {
                list: b.list.index(),
                position: b.position,
                entries: consumed,
            }),
        }
        stream.batch = None;
        Ok(true)
    }

    fn cancel_batch(&mut self) {
        if let Some(stream) = &mut self.stream {
            stream.batch = None;
        }
    }

    /// After a mark was popped: a run whose mark goes other than by `APPENDS` ends, which
    /// stops streaming when entries of it were consumed.
    pub(super) fn stream_mark_taken(&mut self) -> Step<()> {
        let Some(stream) = &self.stream else {
            return Ok(());
        };
        let Some(b) = stream.batch else {
            return Ok(());
        };
        if !b.has_mark || self.marks.len() >= b.marks || self.op == APPENDS {
            return Ok(());
        }
        if b.consumed > 0 || stream.entry.is_some() {
            return Err(self.not_streamable("a run's mark is dropped"));
        }
        self.cancel_batch();
        Ok(())
    }

    /// Before values above stack position `from` go into `target`: during an entry only the
    /// entry's own containers may change; otherwise no stand-in may go into a container and
    /// no container the sink read may change.
    pub(super) fn stream_extend(&self, target: Ref, from: usize) -> Step<()> {
        let Some(stream) = &self.stream else {
            return Ok(());
        };
        match stream.entry {
            Some(c) if target.index() < c.containers => {
                Err(self.not_streamable("a container from before an entry changes during it"))
            }
            Some(_) => Ok(()),
            None if self.doc.containers[target.index()].frozen => {
                Err(self.not_streamable("a container the sink read changes"))
            }
            None if self.stack[from..].iter().any(|&r| Stream::is_standin(r)) => {
                Err(self.not_streamable("a consumed value goes into a container"))
            }
            None => Ok(()),
        }
    }

    /// Before the memo stores at `index`: during an entry, no slot from before it may change.
    pub(super) fn stream_put(&self, index: u64) -> Step<()> {
        match self.stream.as_ref().and_then(|s| s.entry) {
            Some(c) if index < c.memo as u64 => {
                Err(self.not_streamable("a memo slot from before an entry changes during it"))
            }
            _ => Ok(()),
        }
    }

    /// At `STOP`: no run or entry may be left open.
    pub(super) fn stream_stop(&self) -> Step<()> {
        match &self.stream {
            Some(s) if s.batch.is_some() || s.entry.is_some() => {
                Err(self.not_streamable("the pickle stops inside a run of entries"))
            }
            _ => Ok(()),
        }
    }
}
