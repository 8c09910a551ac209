//! The pickle virtual machine, restricted to data: it runs a pickle's opcodes and builds a
//! `super::Document`.
//!
//! [`Machine::run`] reads one opcode at a time, refuses those that would import, construct or
//! call anything (`super::opcodes::refusal`), and hands the rest to one method per family:
//! framing and stack manipulation, the memo, scalars, strings, and containers. Values go into
//! the document's tables as they are pushed; containers stay mutable until `STOP`, and a list
//! or tuple equal to an earlier one shares its elements ([`Machine::share_equal`]). The
//! machine counts the memory it takes against the `super::Limits` budget as it runs, and
//! bounds the `MARK`s open at once; `super::Document::parse_with_limits` drives it.

use std::hash::{Hash, Hasher};

use rustc_hash::{FxHashMap, FxHasher};

use super::args::{
    int_from_decimal, int_from_le, quoted, quoted_unescape, raw_unicode_unescape, PyInt,
    MAX_DECIMAL_DIGITS,
};
use super::document::{kind, Container, Document, Ref, MAX_TABLE};
use super::error::{PickleError, PickleErrorKind};
use super::limits::Limits;
use super::opcodes::*;

pub(super) mod fast;
pub(super) mod stream;

use stream::Stream;

/// How many opcodes run between two checks of the memory budget; a container that moves to
/// grow is checked at once.
const BUDGET_CHECK_EVERY: u32 = 1024;

/// The memo: dense for the sequential indices every Python pickler writes, sparse otherwise,
/// so that a huge `LONG_BINPUT` index cannot force a huge allocation.
#[derive(Default)]
struct Memo {
    dense: Vec<Ref>,
    sparse: FxHashMap<u64, Ref>,
    /// How many stores went to `sparse`, for streaming's checks.
    sparse_puts: u64,
}

impl Memo {
    fn put(&mut self, index: u64, r: Ref) {
        let len = self.dense.len() as u64;
        if index < len {
            self.dense[index as usize] = r;
        } else if index == len {
            self.dense.push(r);
            if !self.sparse.is_empty() {
                self.sparse.remove(&index);
            }
        } else {
            self.sparse.insert(index, r);
            self.sparse_puts += 1;
        }
    }

    fn get(&self, index: u64) -> Option<Ref> {
        match self.dense.get(index as usize) {
            Some(&r) if index < self.dense.len() as u64 => Some(r),
            _ => self.sparse.get(&index).copied(),
        }
    }

    fn len(&self) -> u64 {
        (self.dense.len() + self.sparse.len()) as u64
    }
}

/// The pickle virtual machine, restricted to data, building a [`Document`].
///
/// It reads the input from `data`, all of it or, for a streaming read of a file
/// ([`stream::parse_streaming_chunks`]), a window of it that [`Machine::rebase`] moves on.
pub(super) struct Machine<'a, 's> {
    /// The input at hand, from offset `base`.
    data: &'a [u8],
    /// The position in `data` of the next byte to read.
    pos: usize,
    /// The offset in the input of `data[0]`: 0 unless the input arrives in pieces.
    base: usize,
    /// The input's length; for an input of unknown length (`sized` false), the bytes that
    /// have arrived so far, which is the length once `complete`.
    total: usize,
    /// Whether `total` was known from the start ([`Machine::unsized_input`] makes one that
    /// was not: the budget and the document's input size then grow with the bytes that
    /// arrive).
    sized: bool,
    /// The memory budget's floor ([`Limits::min_memory_bytes`]), to recompute it as an input
    /// of unknown length arrives.
    min_memory: usize,
    /// The largest input read ([`Limits::max_input_bytes`]): no length may reach past it.
    max_input: usize,
    /// For an input of unknown length, the first `FRAME` that announced more bytes than had
    /// arrived: its offset, the offset its bytes start at, and their length. Checked once the
    /// input's length is known, as a sized read checks it at once.
    pub(super) frame_due: Option<(usize, usize, u64)>,
    /// Whether `data` reaches the end of the input.
    complete: bool,
    /// Set when an opcode needs bytes past `data` that are still to come: how many more, at
    /// least, from its start; the opcode changed nothing and runs again once they are there.
    pub(super) more: Option<usize>,
    /// The most bytes of memory the document may take ([`Limits::memory_budget`]).
    budget: usize,
    /// The bytes of memory allowed per input byte, for the error.
    per_input_byte: usize,
    /// Opcodes left until the next check of the budget.
    until_check: u32,
    pub(super) doc: Document,
    stack: Vec<Ref>,
    /// Stack lengths at each open MARK.
    marks: Vec<usize>,
    /// The most MARKs open at once ([`Limits::max_depth`]).
    max_marks: usize,
    memo: Memo,
    /// Lists and tuples by kind and a hash of their elements, to store equal ones once.
    sequences: FxHashMap<(u32, u64), u32>,
    /// Whether to record where each container is created, in `origins`.
    record_origins: bool,
    /// Byte offset of the opcode that created each container, when recorded.
    pub(super) origins: Vec<usize>,
    /// Offset in the input of the opcode being executed.
    op_pos: usize,
    op: u8,
    /// The state of a streaming read ([`stream::parse_streaming`]), `None` otherwise.
    stream: Option<Stream<'s>>,
}

type Step<T> = Result<T, PickleError>;

impl<'a, 's> Machine<'a, 's> {
    /// A machine reading all of `data`.
    pub(super) fn new(data: &'a [u8], limits: &Limits, record_origins: bool) -> Self {
        Machine::of_input(data, data.len(), limits, record_origins)
    }

    /// A machine reading an input of `total` bytes, which begin with `data` (all of them
    /// when `data` has `total` bytes).
    pub(super) fn of_input(
        data: &'a [u8],
        total: usize,
        limits: &Limits,
        record_origins: bool,
    ) -> Self {
        Machine {
            data,
            pos: 0,
            base: 0,
            total,
            sized: true,
            min_memory: limits.min_memory_bytes,
            max_input: limits.max_input_bytes,
            frame_due: None,
            complete: data.len() == total,
            more: None,
            budget: limits.memory_budget(total),
            per_input_byte: limits.memory_per_input_byte,
            until_check: BUDGET_CHECK_EVERY,
            doc: Document::empty(total),
            stack: Vec::with_capacity(64),
            marks: Vec::with_capacity(16),
            max_marks: limits.max_depth,
            memo: Memo::default(),
            sequences: FxHashMap::default(),
            record_origins,
            origins: Vec::new(),
            op_pos: 0,
            op: 0,
            stream: None,
        }
    }

    /// A machine reading an input whose length is not known until it ends (what gzip data
    /// unpacks to): the memory budget, and the input size the document reports, are those of
    /// the bytes that have arrived so far, and grow at each [`Machine::rebase`].
    pub(super) fn unsized_input(limits: &Limits, record_origins: bool) -> Machine<'static, 's> {
        let mut machine = Machine::of_input(&[], 0, limits, record_origins);
        machine.sized = false;
        machine.complete = false;
        machine
    }

    /// The same machine reading `data`, the input from offset `base` on (to its end when
    /// `complete`), from offset `at` (at or after `base`).
    pub(super) fn rebase<'b>(
        self,
        data: &'b [u8],
        base: usize,
        at: usize,
        complete: bool,
    ) -> Machine<'b, 's> {
        let (total, budget, mut doc) = (self.total, self.budget, self.doc);
        let (total, budget) = if self.sized {
            (total, budget)
        } else {
            let arrived = total.max(base + data.len());
            let budget = arrived
                .saturating_mul(self.per_input_byte)
                .max(self.min_memory);
            doc.input_len = arrived;
            (arrived, budget)
        };
        Machine {
            data,
            pos: at - base,
            base,
            total,
            sized: self.sized,
            min_memory: self.min_memory,
            max_input: self.max_input,
            frame_due: self.frame_due,
            complete,
            more: None,
            budget,
            per_input_byte: self.per_input_byte,
            until_check: self.until_check,
            doc,
            stack: self.stack,
            marks: self.marks,
            max_marks: self.max_marks,
            memo: self.memo,
            sequences: self.sequences,
            record_origins: self.record_origins,
            origins: self.origins,
            op_pos: self.op_pos,
            op: self.op,
            stream: self.stream,
        }
    }

    /// The offset in the input of the opcode being executed.
    pub(super) fn op_pos(&self) -> usize {
        self.op_pos
    }

    /// The error that asks for `n` more bytes than `data` holds from the opcode's start
    /// (see [`Machine::more`]); only a machine reading a window makes it.
    fn wait_for(&mut self, n: usize) -> PickleError {
        self.more = Some(n);
        self.error(PickleErrorKind::Truncated {
            opcode: self.name(),
            needed: n as u64,
            available: 0,
        })
    }

    fn error(&self, kind: PickleErrorKind) -> PickleError {
        PickleError {
            offset: self.op_pos,
            kind,
        }
    }

    fn name(&self) -> &'static str {
        opcode_name(self.op)
    }

    fn bad(&self, reason: impl Into<String>) -> PickleError {
        self.error(PickleErrorKind::BadArgument {
            opcode: self.name(),
            reason: reason.into(),
        })
    }

    /// Takes `n` argument bytes of the current opcode.
    ///
    /// `n` is a length read from the input, up to 2^64 − 1: every sum with it is checked, so
    /// that no length can wrap into a small count of bytes to wait for (a `BINBYTES8` of
    /// 2^64 − 9 bytes once asked for 0 more bytes, forever). A length past the end of an input
    /// of known size is refused at once; one past the largest input read, for an input whose
    /// size is not known yet, too.
    fn take(&mut self, n: u64) -> Step<&'a [u8]> {
        let available = (self.data.len() - self.pos) as u64;
        if n > available {
            let here = self.base + self.pos;
            // The bytes the input holds from here, as far as is known.
            let left = if self.sized || self.complete {
                self.total.saturating_sub(here) as u64
            } else {
                self.max_input.saturating_sub(here) as u64
            };
            if !self.complete && n <= left {
                // The opcode's bytes from its start, at most the input's size: no overflow.
                let wanted = (here - self.op_pos) as u64 + n;
                return Err(self.wait_for(usize::try_from(wanted).unwrap_or(usize::MAX)));
            }
            if !self.sized && !self.complete {
                return Err(self.bad(format!(
                    "a length of {n} bytes, past the largest input read ({} bytes)",
                    self.max_input
                )));
            }
            return Err(self.error(PickleErrorKind::Truncated {
                opcode: self.name(),
                needed: n,
                available: left,
            }));
        }
        let start = self.pos;
        self.pos += n as usize;
        Ok(&self.data[start..self.pos])
    }

    fn take_array<const N: usize>(&mut self) -> Step<[u8; N]> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N as u64)?);
        Ok(out)
    }

    fn take_u8(&mut self) -> Step<u8> {
        Ok(self.take_array::<1>()?[0])
    }

    fn take_u32(&mut self) -> Step<u32> {
        Ok(u32::from_le_bytes(self.take_array()?))
    }

    fn take_i32(&mut self) -> Step<i32> {
        Ok(i32::from_le_bytes(self.take_array()?))
    }

    fn take_u64(&mut self) -> Step<u64> {
        Ok(u64::from_le_bytes(self.take_array()?))
    }

    /// Takes a length prefix that must not be negative.
    fn take_len_i32(&mut self) -> Step<u64> {
        let n = self.take_i32()?;
        u64::try_from(n).map_err(|_| self.bad(format!("negative length {n}")))
    }

    /// Takes a newline-terminated text argument, without the newline.
    fn take_line(&mut self) -> Step<&'a [u8]> {
        let rest = &self.data[self.pos..];
        match rest.iter().position(|&b| b == b'\n') {
            Some(end) => {
                self.pos += end + 1;
                Ok(&rest[..end])
            }
            // Twice what is at hand, so that a long line is searched a few times only.
            None if !self.complete => {
                let at_hand = self.data.len() + self.base - self.op_pos;
                Err(self.wait_for(2 * at_hand + 1))
            }
            None => Err(self.error(PickleErrorKind::Truncated {
                opcode: self.name(),
                needed: rest.len() as u64 + 1,
                available: rest.len() as u64,
            })),
        }
    }

    fn take_line_str(&mut self) -> Step<&'a str> {
        let line = self.take_line()?;
        std::str::from_utf8(line).map_err(|_| self.bad("the text argument is not ASCII"))
    }

    /// The bytes of memory the document and the machine's stack, marks and memo take, counted
    /// by length (a vector's spare capacity is at most as much again).
    fn memory(&self) -> usize {
        use std::mem::size_of;
        self.doc.memory_bytes()
            + self.stack.len() * size_of::<Ref>()
            + self.marks.len() * size_of::<usize>()
            + self.memo.dense.len() * size_of::<Ref>()
            // A hash table entry with its key, value and control byte.
            + self.memo.sparse.len() * 24
            + self.sequences.len() * 24
            + self.origins.len() * size_of::<usize>()
            + self.stream.as_ref().map_or(0, Stream::memory)
    }

    /// Fails once the document takes more memory than the budget.
    fn check_budget(&self) -> Step<()> {
        if self.memory() > self.budget {
            return Err(self.error(PickleErrorKind::MemoryBudget {
                limit: self.budget,
                input_bytes: self.total,
                per_input_byte: self.per_input_byte,
            }));
        }
        Ok(())
    }

    /// Fails when a table already holds as many entries as a [`Ref`] can index.
    fn table_room(&self, len: usize, what: &'static str) -> Step<()> {
        if len >= MAX_TABLE {
            return Err(self.error(PickleErrorKind::LimitExceeded {
                what,
                limit: MAX_TABLE,
            }));
        }
        Ok(())
    }

    fn too_many_items(&self) -> PickleError {
        self.error(PickleErrorKind::LimitExceeded {
            what: "container element slots (the most a document can address)",
            limit: u32::MAX as usize,
        })
    }

    /// Pushes a new value that needs no table (an integer of 28 bits or a constant).
    fn push_inline(&mut self, r: Ref) -> Step<()> {
        self.stack.push(r);
        Ok(())
    }

    fn push_int(&mut self, v: PyInt) -> Step<()> {
        let r = match v {
            PyInt::Fits(v) => match Ref::small(v) {
                Some(r) => r,
                None => {
                    self.table_room(
                        self.doc.ints.len(),
                        "integers (the most a document can address)",
                    )?;
                    self.doc.ints.push(v);
                    Ref::new(kind::INT, (self.doc.ints.len() - 1) as u32)
                }
            },
            PyInt::Big(bytes) => self.add_blob(kind::BIG_INT, &bytes)?,
        };
        self.stack.push(r);
        Ok(())
    }

    fn push_float(&mut self, v: f64) -> Step<()> {
        self.table_room(
            self.doc.floats.len(),
            "floats (the most a document can address)",
        )?;
        self.doc.floats.push(v);
        let r = Ref::new(kind::FLOAT, (self.doc.floats.len() - 1) as u32);
        self.stack.push(r);
        Ok(())
    }

    fn push_str(&mut self, text: &str) -> Step<()> {
        let r = self.add_str(text)?;
        self.stack.push(r);
        Ok(())
    }

    /// Adds a string to the document and returns its reference.
    fn add_str(&mut self, text: &str) -> Step<Ref> {
        self.table_room(
            self.doc.text_ends.len(),
            "strings (the most a document can address)",
        )?;
        self.doc.text.push_str(text);
        self.doc.text_ends.push(self.doc.text.len());
        Ok(Ref::new(kind::STR, (self.doc.text_ends.len() - 1) as u32))
    }

    /// Pushes text whose invalid UTF-8 (for example a lone surrogate) is replaced by U+FFFD.
    fn push_text(&mut self, bytes: &[u8]) -> Step<()> {
        self.push_str(&String::from_utf8_lossy(bytes))
    }

    fn push_bytes(&mut self, bytes: &[u8]) -> Step<()> {
        let r = self.add_blob(kind::BYTES, bytes)?;
        self.stack.push(r);
        Ok(())
    }

    /// Pushes a protocol 0–2 byte string: text when it is UTF-8, bytes otherwise.
    fn push_byte_string(&mut self, bytes: &[u8]) -> Step<()> {
        match std::str::from_utf8(bytes) {
            Ok(s) => self.push_str(s),
            Err(_) => self.push_bytes(bytes),
        }
    }

    fn add_blob(&mut self, kind: u32, bytes: &[u8]) -> Step<Ref> {
        self.table_room(
            self.doc.blob_ends.len(),
            "byte strings and big integers (the most a document can address)",
        )?;
        self.doc.blob.extend_from_slice(bytes);
        self.doc.blob_ends.push(self.doc.blob.len());
        Ok(Ref::new(kind, (self.doc.blob_ends.len() - 1) as u32))
    }

    /// Creates an empty container of `kind`.
    fn new_container(&mut self, kind: u32) -> Step<Ref> {
        self.table_room(
            self.doc.containers.len(),
            "containers (the most a document can address)",
        )?;
        let c = self.doc.containers.len() as u32;
        self.doc.containers.push(Container {
            start: self.doc.items.len() as u32,
            len: 0,
            cap: 0,
            shared: false,
            frozen: false,
        });
        if self.record_origins {
            self.origins.push(self.op_pos);
        }
        Ok(Ref::new(kind, c))
    }

    /// Creates a container of `kind` from the values above stack position `from` and pushes
    /// it in their place.
    fn collect(&mut self, kind: u32, from: usize) -> Step<()> {
        let r = self.new_container(kind)?;
        self.extend(r, from)?;
        self.stack.truncate(from);
        self.stack.push(r);
        self.share_equal(r);
        Ok(())
    }

    /// Appends the values above stack position `from` to the container `target` and pops
    /// them.
    fn append_from(&mut self, target: Ref, from: usize) -> Step<()> {
        let first = self.doc.containers[target.index()].len == 0;
        self.extend(target, from)?;
        self.stack.truncate(from);
        if first {
            self.share_equal(target);
        }
        Ok(())
    }

    /// Appends the values above stack position `from` to the list `target`, or, when they
    /// are the entries streamed for it, drops them (see [`stream`]).
    fn append_or_stream(&mut self, target: Ref, from: usize) -> Step<()> {
        if self.stream.is_some() && self.stream_appends(target, from)? {
            self.stack.truncate(from);
            return Ok(());
        }
        self.append_from(target, from)
    }

    /// Puts the values above stack position `from` into the container `target`: each is
    /// counted here, once, however it came onto the stack. A container that had to move to
    /// grow (it shared its elements with an equal one, or others were added after it) copies
    /// its elements, so the budget is checked at once.
    fn extend(&mut self, target: Ref, from: usize) -> Step<()> {
        if self.stream.is_some() {
            self.stream_extend(target, from)?;
        }
        let pool = self.doc.items.len();
        if !self.doc.extend(target.index(), &self.stack[from..]) {
            return Err(self.too_many_items());
        }
        if self.doc.items.len() - pool > self.stack.len() - from {
            self.check_budget()?;
        }
        Ok(())
    }

    /// Makes a list or tuple that has just received its first elements, at the end of the
    /// pool, share the elements of an earlier one of the same kind with the very same
    /// elements. Values are never changed once read, so the sharing cannot be observed
    /// except through [`ValueRef::identity`](super::ValueRef::identity); a shared list that
    /// grows later moves to elements of its own.
    fn share_equal(&mut self, r: Ref) {
        if !matches!(r.kind(), kind::LIST | kind::TUPLE) {
            return;
        }
        let c = r.index();
        let cont = self.doc.containers[c];
        let range = cont.range();
        if cont.len == 0 || cont.cap != cont.len || range.end != self.doc.items.len() {
            return;
        }
        // A list made for a streamed entry is dropped with it, and the sink never looks one
        // up by identity: sharing its elements would only be undone.
        if self.made_for_entry(c) {
            return;
        }
        let mut hasher = FxHasher::default();
        self.doc.items[range.clone()].hash(&mut hasher);
        let key = (r.kind(), hasher.finish());
        let (earlier_index, earlier) = match self.sequences.get(&key) {
            Some(&e) if e as usize != c => (e, self.doc.containers[e as usize]),
            _ => {
                self.new_sequence(key, c);
                return;
            }
        };
        if earlier.len != cont.len || self.doc.items[earlier.range()] != self.doc.items[range] {
            self.new_sequence(key, c);
            return;
        }
        self.doc.items.truncate(cont.start as usize);
        self.doc.containers[c] = Container {
            cap: earlier.len,
            shared: true,
            frozen: false,
            ..earlier
        };
        self.doc.containers[earlier_index as usize].shared = true;
    }

    /// Makes container `c` the list found for `key` by [`Machine::share_equal`].
    fn new_sequence(&mut self, key: (u32, u64), c: usize) {
        self.sequences.insert(key, c as u32);
        if let Some(stream) = &mut self.stream {
            stream.sequence_key(key);
        }
    }

    /// Where the values above the last mark begin.
    fn floor(&self) -> usize {
        self.marks.last().copied().unwrap_or(0)
    }

    fn underflow(&self) -> PickleError {
        self.error(PickleErrorKind::StackUnderflow {
            opcode: self.name(),
        })
    }

    fn pop(&mut self) -> Step<Ref> {
        if self.stack.len() > self.floor() {
            Ok(self.stack.pop().unwrap_or(Ref::NONE))
        } else {
            Err(self.underflow())
        }
    }

    fn top(&self) -> Step<Ref> {
        if self.stack.len() > self.floor() {
            Ok(self.stack[self.stack.len() - 1])
        } else {
            Err(self.underflow())
        }
    }

    /// Pops the last mark and returns the stack length it recorded.
    fn take_mark(&mut self) -> Step<usize> {
        let mark = self.marks.pop().ok_or_else(|| {
            self.error(PickleErrorKind::MissingMark {
                opcode: self.name(),
            })
        })?;
        if self.stream.is_some() {
            self.stream_mark_taken()?;
        }
        Ok(mark)
    }

    /// The value just below a popped mark at `mark`, which must lie above the previous mark.
    fn below(&self, mark: usize) -> Step<Ref> {
        if mark > self.floor() {
            Ok(self.stack[mark - 1])
        } else {
            Err(self.underflow())
        }
    }

    /// Pops the values above the last mark and the mark itself.
    fn pop_mark(&mut self) -> Step<()> {
        let mark = self.take_mark()?;
        self.stack.truncate(mark);
        Ok(())
    }

    /// Checks that the values above `mark` can be key/value pairs.
    fn check_pairs(&self, mark: usize) -> Step<()> {
        let n = self.stack.len() - mark;
        if !n.is_multiple_of(2) {
            return Err(self.bad(format!("an odd number of values ({n}) for key/value pairs")));
        }
        Ok(())
    }

    /// Checks that `target` is a container of `kind`, else a wrong-type error.
    fn expect(&self, target: Ref, kind: u32, expected: &'static str) -> Step<()> {
        if target.kind() == kind {
            Ok(())
        } else {
            Err(self.error(PickleErrorKind::WrongType {
                opcode: self.name(),
                expected,
                found: target.type_name(),
            }))
        }
    }

    fn memo_get(&self, index: u64) -> Step<Ref> {
        self.memo
            .get(index)
            .ok_or_else(|| self.error(PickleErrorKind::MissingMemo { index }))
    }

    fn memo_put(&mut self, index: u64) -> Step<()> {
        let top = self.top()?;
        if self.stream.is_some() {
            self.stream_put(index)?;
        }
        self.memo.put(index, top);
        Ok(())
    }

    /// Pushes the memoized value `index`.
    fn push_memo(&mut self, index: u64) -> Step<()> {
        let r = self.memo_get(index)?;
        self.stack.push(r);
        Ok(())
    }

    fn text_u64(&self, text: &str) -> Step<u64> {
        text.trim()
            .parse()
            .map_err(|_| self.bad(format!("{} is not a memo index", quoted(text))))
    }

    /// The integer written in decimal as `text` (the argument of `INT` or `LONG`), refusing
    /// more than [`MAX_DECIMAL_DIGITS`] digits as Python does.
    fn decimal(&self, text: &str) -> Step<PyInt> {
        let digits = text.trim().trim_start_matches(['-', '+']).len();
        if digits > MAX_DECIMAL_DIGITS {
            return Err(self.bad(format!(
                "an integer of {digits} decimal digits; more than {MAX_DECIMAL_DIGITS} are refused, as Python's int() refuses them"
            )));
        }
        int_from_decimal(text)
            .ok_or_else(|| self.bad(format!("{} is not an integer", quoted(text))))
    }

    /// Runs opcodes up to `STOP` and returns the value it pops.
    pub(super) fn run(&mut self) -> Step<Ref> {
        loop {
            self.op_pos = self.base + self.pos;
            self.until_check -= 1;
            if self.until_check == 0 {
                self.until_check = BUDGET_CHECK_EVERY;
                self.check_budget()?;
            }
            let Some(&op) = self.data.get(self.pos) else {
                if !self.complete {
                    return Err(self.wait_for(1));
                }
                return Err(PickleError {
                    offset: self.total,
                    kind: PickleErrorKind::MissingStop,
                });
            };
            self.op = op;
            self.pos += 1;
            // One dispatch per opcode: the opcodes refused (which no arm runs) are told apart
            // from unknown bytes only once neither builds data.
            match op {
                STOP => {
                    self.check_budget()?;
                    if self.stream.is_some() {
                        self.stream_stop()?;
                    }
                    return self.pop();
                }
                PROTO | FRAME | MARK | POP | POP_MARK | DUP => self.control(op)?,
                PUT | BINPUT | LONG_BINPUT | MEMOIZE | GET | BINGET | LONG_BINGET => {
                    self.memo_op(op)?
                }
                NONE | NEWTRUE | NEWFALSE | BININT | BININT1 | BININT2 | LONG1 | LONG4 | INT
                | LONG | BINFLOAT | FLOAT => self.scalar(op)?,
                SHORT_BINUNICODE | BINUNICODE | BINUNICODE8 | UNICODE | SHORT_BINSTRING
                | BINSTRING | STRING | SHORT_BINBYTES | BINBYTES | BINBYTES8 | BYTEARRAY8 => {
                    self.string(op)?
                }
                // A trace entry of the shape Python writes, decoded without the generic
                // machine when a streaming read is in a run of entries (`fast`).
                EMPTY_DICT if self.stream.is_some() && self.fast_entry()? => {}
                EMPTY_LIST | EMPTY_DICT | EMPTY_TUPLE | EMPTY_SET | LIST | TUPLE | FROZENSET
                | DICT | TUPLE1 | TUPLE2 | TUPLE3 => self.make_container(op)?,
                APPEND | APPENDS | SETITEM | SETITEMS | ADDITEMS => self.fill_container(op)?,
                _ => {
                    return Err(match refusal(op) {
                        Some(reason) => self.error(PickleErrorKind::Refused {
                            opcode: self.name(),
                            reason,
                        }),
                        None => self.unknown(op),
                    })
                }
            }
        }
    }

    fn unknown(&self, op: u8) -> PickleError {
        self.error(PickleErrorKind::UnknownOpcode { byte: op })
    }

    /// Runs an opcode of framing, protocol or stack manipulation.
    #[inline]
    fn control(&mut self, op: u8) -> Step<()> {
        match op {
            PROTO => {
                let version = self.take_u8()?;
                if version > 5 {
                    return Err(self.error(PickleErrorKind::UnsupportedProtocol { version }));
                }
            }
            FRAME => {
                let len = self.take_u64()?;
                let available = self.total.saturating_sub(self.base + self.pos) as u64;
                if len > available && !self.sized && !self.complete {
                    // More may still come: checked once the input has ended.
                    let start = self.base + self.pos;
                    self.frame_due.get_or_insert((self.op_pos, start, len));
                } else if len > available {
                    return Err(self.error(PickleErrorKind::Truncated {
                        opcode: "FRAME",
                        needed: len,
                        available,
                    }));
                }
            }
            MARK => {
                if self.marks.len() >= self.max_marks {
                    return Err(self.error(PickleErrorKind::LimitExceeded {
                        what: "MARKs open at once (levels of nesting)",
                        limit: self.max_marks,
                    }));
                }
                self.marks.push(self.stack.len());
                if self.stream.is_some() {
                    self.stream_mark();
                }
            }
            POP => {
                if self.stack.len() > self.floor() {
                    self.stack.pop();
                } else {
                    self.pop_mark()?;
                }
            }
            POP_MARK => self.pop_mark()?,
            DUP => {
                let top = self.top()?;
                self.stack.push(top);
            }
            _ => return Err(self.unknown(op)),
        }
        Ok(())
    }

    /// Runs an opcode that stores into or fetches from the memo.
    #[inline]
    fn memo_op(&mut self, op: u8) -> Step<()> {
        match op {
            PUT => {
                let text = self.take_line_str()?;
                let index = self.text_u64(text)?;
                self.memo_put(index)
            }
            BINPUT => {
                let index = self.take_u8()? as u64;
                self.memo_put(index)
            }
            LONG_BINPUT => {
                let index = self.take_u32()? as u64;
                self.memo_put(index)
            }
            MEMOIZE => {
                let index = self.memo.len();
                self.memo_put(index)
            }
            GET => {
                let text = self.take_line_str()?;
                let index = self.text_u64(text)?;
                self.push_memo(index)
            }
            BINGET => {
                let index = self.take_u8()? as u64;
                self.push_memo(index)
            }
            LONG_BINGET => {
                let index = self.take_u32()? as u64;
                self.push_memo(index)
            }
            _ => Err(self.unknown(op)),
        }
    }

    /// Runs an opcode that pushes `None`, a boolean, an integer or a float.
    #[inline]
    fn scalar(&mut self, op: u8) -> Step<()> {
        match op {
            NONE => self.push_inline(Ref::NONE),
            NEWTRUE => self.push_inline(Ref::TRUE),
            NEWFALSE => self.push_inline(Ref::FALSE),
            BININT => {
                let v = self.take_i32()?;
                self.push_int(PyInt::Fits(v as i64))
            }
            BININT1 => {
                let v = self.take_u8()?;
                self.push_int(PyInt::Fits(v as i64))
            }
            BININT2 => {
                let v = u16::from_le_bytes(self.take_array()?);
                self.push_int(PyInt::Fits(v as i64))
            }
            LONG1 => {
                let n = self.take_u8()? as u64;
                let bytes = self.take(n)?;
                self.push_int(int_from_le(bytes))
            }
            LONG4 => {
                let n = self.take_len_i32()?;
                let bytes = self.take(n)?;
                self.push_int(int_from_le(bytes))
            }
            INT => {
                let text = self.take_line_str()?;
                match text {
                    "00" => self.push_inline(Ref::FALSE),
                    "01" => self.push_inline(Ref::TRUE),
                    _ => {
                        let v = self.decimal(text)?;
                        self.push_int(v)
                    }
                }
            }
            LONG => {
                let text = self.take_line_str()?;
                let v = self.decimal(text.strip_suffix('L').unwrap_or(text))?;
                self.push_int(v)
            }
            BINFLOAT => {
                let v = f64::from_be_bytes(self.take_array()?);
                self.push_float(v)
            }
            FLOAT => {
                let text = self.take_line_str()?;
                let v: f64 = text
                    .trim()
                    .parse()
                    .map_err(|_| self.bad(format!("{} is not a float", quoted(text))))?;
                self.push_float(v)
            }
            _ => Err(self.unknown(op)),
        }
    }

    /// Runs an opcode that pushes text or bytes.
    #[inline]
    fn string(&mut self, op: u8) -> Step<()> {
        match op {
            SHORT_BINUNICODE => {
                let n = self.take_u8()? as u64;
                let bytes = self.take(n)?;
                self.push_text(bytes)
            }
            BINUNICODE => {
                let n = self.take_u32()? as u64;
                let bytes = self.take(n)?;
                self.push_text(bytes)
            }
            BINUNICODE8 => {
                let n = self.take_u64()?;
                let bytes = self.take(n)?;
                self.push_text(bytes)
            }
            UNICODE => {
                let line = self.take_line()?;
                let text = raw_unicode_unescape(line)
                    .ok_or_else(|| self.bad("a bad \\u or \\U escape"))?;
                self.push_str(&text)
            }
            SHORT_BINSTRING => {
                let n = self.take_u8()? as u64;
                let bytes = self.take(n)?;
                self.push_byte_string(bytes)
            }
            BINSTRING => {
                let n = self.take_len_i32()?;
                let bytes = self.take(n)?;
                self.push_byte_string(bytes)
            }
            STRING => {
                let line = self.take_line()?;
                let bytes =
                    quoted_unescape(line).ok_or_else(|| self.bad("a malformed quoted string"))?;
                self.push_byte_string(&bytes)
            }
            SHORT_BINBYTES => {
                let n = self.take_u8()? as u64;
                let bytes = self.take(n)?;
                self.push_bytes(bytes)
            }
            BINBYTES => {
                let n = self.take_u32()? as u64;
                let bytes = self.take(n)?;
                self.push_bytes(bytes)
            }
            BINBYTES8 | BYTEARRAY8 => {
                let n = self.take_u64()?;
                let bytes = self.take(n)?;
                self.push_bytes(bytes)
            }
            _ => Err(self.unknown(op)),
        }
    }

    /// Runs an opcode that creates a container, empty or from values on the stack.
    #[inline]
    fn make_container(&mut self, op: u8) -> Step<()> {
        match op {
            EMPTY_LIST | EMPTY_DICT | EMPTY_TUPLE | EMPTY_SET => {
                let kind = match op {
                    EMPTY_LIST => kind::LIST,
                    EMPTY_DICT => kind::DICT,
                    EMPTY_TUPLE => kind::TUPLE,
                    _ => kind::SET,
                };
                let r = self.new_container(kind)?;
                self.stack.push(r);
                if kind == kind::DICT && self.stream.is_some() {
                    self.stream_dict(r);
                }
                Ok(())
            }
            LIST | TUPLE | FROZENSET | DICT => {
                let mark = self.take_mark()?;
                let kind = match op {
                    LIST => kind::LIST,
                    TUPLE => kind::TUPLE,
                    FROZENSET => kind::FROZEN_SET,
                    _ => {
                        self.check_pairs(mark)?;
                        kind::DICT
                    }
                };
                self.collect(kind, mark)
            }
            TUPLE1 | TUPLE2 | TUPLE3 => {
                let n = (op - TUPLE1 + 1) as usize;
                if self.stack.len() < self.floor() + n {
                    return Err(self.underflow());
                }
                self.collect(kind::TUPLE, self.stack.len() - n)
            }
            _ => Err(self.unknown(op)),
        }
    }

    /// Runs an opcode that adds values to the list, dict or set below them on the stack.
    #[inline]
    fn fill_container(&mut self, op: u8) -> Step<()> {
        match op {
            APPEND => {
                let value = self.pop()?;
                let target = self.top()?;
                self.expect(target, kind::LIST, "list")?;
                let from = self.stack.len();
                self.stack.push(value);
                self.append_or_stream(target, from)
            }
            APPENDS => {
                let mark = self.take_mark()?;
                let target = self.below(mark)?;
                self.expect(target, kind::LIST, "list")?;
                self.append_or_stream(target, mark)
            }
            SETITEM => {
                let value = self.pop()?;
                let key = self.pop()?;
                let target = self.top()?;
                self.expect(target, kind::DICT, "dict")?;
                let from = self.stack.len();
                self.stack.push(key);
                self.stack.push(value);
                self.append_from(target, from)?;
                self.stream_filled(target)
            }
            SETITEMS => {
                let mark = self.take_mark()?;
                let target = self.below(mark)?;
                self.check_pairs(mark)?;
                self.expect(target, kind::DICT, "dict")?;
                self.append_from(target, mark)?;
                self.stream_filled(target)
            }
            ADDITEMS => {
                let mark = self.take_mark()?;
                let target = self.below(mark)?;
                self.expect(target, kind::SET, "set")?;
                self.append_from(target, mark)
            }
            _ => Err(self.unknown(op)),
        }
    }
}
