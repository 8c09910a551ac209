//! A small streaming writer for pickle protocol 4, the counterpart of this crate's reader
//! for the data subset: dicts, lists, tuples, strings, integers of any size, floats, booleans
//! and None, with the memo for shared objects.
//!
//! `vramscope_export` writes PyTorch snapshot pickles with it. Like PyTorch's own
//! files, the output shares repeated objects (a stack's frame list, a file name) through the
//! memo, so a trace whose 20,000 events share a few hundred stacks stays small. It writes no
//! opcode that imports or calls anything, so any unpickler can read it safely.
//!
//! The bytes collect in a vector ([`PickleWriter::finish`] returns them); a caller that
//! streams passes them to an [`std::io::Write`] every [`PickleWriter::CHUNK`] bytes or so
//! ([`PickleWriter::drain_into`], [`PickleWriter::finish_into`]), so that a pickle of a
//! 10M-event trace is never whole in memory. The writing methods themselves do not fail.

use std::io::Write;

/// Opcodes of the pickle protocol used here.
mod op {
    pub const PROTO: u8 = 0x80;
    pub const STOP: u8 = b'.';
    pub const MARK: u8 = b'(';
    pub const NONE: u8 = b'N';
    pub const NEWTRUE: u8 = 0x88;
    pub const NEWFALSE: u8 = 0x89;
    pub const BININT: u8 = b'J';
    pub const BININT1: u8 = b'K';
    pub const BININT2: u8 = b'M';
    pub const LONG1: u8 = 0x8a;
    pub const LONG4: u8 = 0x8b;
    pub const SHORT_BINBYTES: u8 = b'C';
    pub const BINBYTES: u8 = b'B';
    pub const BINBYTES8: u8 = 0x8e;
    pub const EMPTY_SET: u8 = 0x8f;
    pub const ADDITEMS: u8 = 0x90;
    pub const FROZENSET: u8 = 0x91;
    pub const BINFLOAT: u8 = b'G';
    pub const SHORT_BINUNICODE: u8 = 0x8c;
    pub const BINUNICODE: u8 = b'X';
    pub const BINUNICODE8: u8 = 0x8d;
    pub const EMPTY_DICT: u8 = b'}';
    pub const SETITEMS: u8 = b'u';
    pub const EMPTY_LIST: u8 = b']';
    pub const APPENDS: u8 = b'e';
    pub const TUPLE: u8 = b't';
    pub const MEMOIZE: u8 = 0x94;
    pub const BINGET: u8 = b'h';
    pub const LONG_BINGET: u8 = b'j';
}

/// A memo slot holding an object written earlier.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemoRef(u32);

/// Writes one pickled object into a byte vector, piece by piece.
///
/// Containers are opened and closed explicitly (`begin_dict` … `end_dict`); a dict's items are
/// written as key, value, key, value. [`PickleWriter::finish`] ends the stream. A caller that
/// streams passes the bytes collected so far to its output now and then
/// ([`PickleWriter::drain_into`], once [`PickleWriter::pending`] reaches [`PickleWriter::CHUNK`]) and ends
/// with [`PickleWriter::finish_into`].
pub struct PickleWriter {
    /// The bytes not yet passed on.
    out: Vec<u8>,
    memo_len: u32,
    /// How many bytes were passed on.
    passed: u64,
}

impl Default for PickleWriter {
    fn default() -> Self {
        PickleWriter::new()
    }
}

impl PickleWriter {
    /// How many bytes a streaming caller lets collect before it passes them on
    /// ([`PickleWriter::drain_into`]).
    pub const CHUNK: usize = 1 << 16;

    /// A writer positioned after the protocol header.
    pub fn new() -> PickleWriter {
        PickleWriter {
            out: vec![op::PROTO, 4],
            memo_len: 0,
            passed: 0,
        }
    }

    /// Ends the stream and returns the bytes (those not passed on: all of them when none
    /// were).
    pub fn finish(mut self) -> Vec<u8> {
        self.out.push(op::STOP);
        self.out
    }

    /// How many bytes collected since the last [`PickleWriter::drain_into`].
    pub fn pending(&self) -> usize {
        self.out.len()
    }

    /// Passes the bytes collected so far to `sink` and forgets them; the memo and the
    /// stream's state stay.
    pub fn drain_into(&mut self, sink: &mut dyn Write) -> std::io::Result<()> {
        sink.write_all(&self.out)?;
        self.passed += self.out.len() as u64;
        self.out.clear();
        Ok(())
    }

    /// Ends the stream, passes what is left to `sink` and flushes it; returns how many bytes
    /// the pickle has.
    pub fn finish_into(mut self, sink: &mut dyn Write) -> std::io::Result<u64> {
        self.out.push(op::STOP);
        self.drain_into(sink)?;
        sink.flush()?;
        Ok(self.passed)
    }

    /// Writes `None`.
    pub fn none(&mut self) {
        self.out.push(op::NONE);
    }

    /// Writes a boolean.
    pub fn bool(&mut self, value: bool) {
        self.out
            .push(if value { op::NEWTRUE } else { op::NEWFALSE });
    }

    /// Writes a signed integer.
    pub fn int(&mut self, value: i64) {
        if (0..256).contains(&value) {
            self.out.extend([op::BININT1, value as u8]);
        } else if (0..65536).contains(&value) {
            self.out.push(op::BININT2);
            self.out.extend((value as u16).to_le_bytes());
        } else if let Ok(small) = i32::try_from(value) {
            self.out.push(op::BININT);
            self.out.extend(small.to_le_bytes());
        } else {
            self.long(value as i128);
        }
    }

    /// Writes an unsigned integer (as a Python int of any size).
    pub fn uint(&mut self, value: u64) {
        match i64::try_from(value) {
            Ok(v) => self.int(v),
            Err(_) => self.long(value as i128),
        }
    }

    fn long(&mut self, value: i128) {
        // Little-endian two's complement, trimmed to the shortest form that keeps the sign.
        let bytes = value.to_le_bytes();
        let mut len = bytes.len();
        while len > 1 {
            let top = bytes[len - 1];
            let next_sign = bytes[len - 2] & 0x80;
            if (top == 0 && next_sign == 0) || (top == 0xff && next_sign != 0) {
                len -= 1;
            } else {
                break;
            }
        }
        self.out.extend([op::LONG1, len as u8]);
        self.out.extend(&bytes[..len]);
    }

    /// Writes an integer of any size from its little-endian two's-complement bytes (as
    /// `LONG1`/`LONG4` store them; empty is zero).
    pub fn long_bytes(&mut self, bytes: &[u8]) {
        match u8::try_from(bytes.len()) {
            Ok(len) => self.out.extend([op::LONG1, len]),
            Err(_) => {
                self.out.push(op::LONG4);
                self.out
                    .extend((u32::try_from(bytes.len()).unwrap_or(u32::MAX)).to_le_bytes());
            }
        }
        self.out.extend(bytes);
    }

    /// Writes a `bytes` value.
    pub fn bytes(&mut self, value: &[u8]) {
        if let Ok(len) = u8::try_from(value.len()) {
            self.out.extend([op::SHORT_BINBYTES, len]);
        } else if let Ok(len) = u32::try_from(value.len()) {
            self.out.push(op::BINBYTES);
            self.out.extend(len.to_le_bytes());
        } else {
            self.out.push(op::BINBYTES8);
            self.out.extend((value.len() as u64).to_le_bytes());
        }
        self.out.extend(value);
    }

    /// Opens a set; write its elements, then [`PickleWriter::end_set`].
    pub fn begin_set(&mut self) {
        self.out.extend([op::EMPTY_SET, op::MARK]);
    }

    /// Closes a set.
    pub fn end_set(&mut self) {
        self.out.push(op::ADDITEMS);
    }

    /// Opens a frozenset; write its elements, then [`PickleWriter::end_frozenset`].
    pub fn begin_frozenset(&mut self) {
        self.out.push(op::MARK);
    }

    /// Closes a frozenset.
    pub fn end_frozenset(&mut self) {
        self.out.push(op::FROZENSET);
    }

    /// The number of bytes written so far (those passed to an output included).
    pub fn len(&self) -> usize {
        self.passed as usize + self.out.len()
    }

    /// Whether nothing but the protocol header was written.
    pub fn is_empty(&self) -> bool {
        self.len() <= 2
    }

    /// Writes a float.
    pub fn float(&mut self, value: f64) {
        self.out.push(op::BINFLOAT);
        self.out.extend(value.to_be_bytes());
    }

    /// Writes a string.
    pub fn str(&mut self, value: &str) {
        let bytes = value.as_bytes();
        if bytes.len() < 256 {
            self.out.extend([op::SHORT_BINUNICODE, bytes.len() as u8]);
        } else if let Ok(len) = u32::try_from(bytes.len()) {
            self.out.push(op::BINUNICODE);
            self.out.extend(len.to_le_bytes());
        } else {
            self.out.push(op::BINUNICODE8);
            self.out.extend((bytes.len() as u64).to_le_bytes());
        }
        self.out.extend(bytes);
    }

    /// Opens a dict; write key, value pairs, then [`PickleWriter::end_dict`].
    pub fn begin_dict(&mut self) {
        self.out.extend([op::EMPTY_DICT, op::MARK]);
    }

    /// Closes a dict.
    pub fn end_dict(&mut self) {
        self.out.push(op::SETITEMS);
    }

    /// Opens a list; write items, then [`PickleWriter::end_list`].
    pub fn begin_list(&mut self) {
        self.out.extend([op::EMPTY_LIST, op::MARK]);
    }

    /// Closes a list.
    pub fn end_list(&mut self) {
        self.out.push(op::APPENDS);
    }

    /// Opens a tuple; write items, then [`PickleWriter::end_tuple`].
    pub fn begin_tuple(&mut self) {
        self.out.push(op::MARK);
    }

    /// Closes a tuple.
    pub fn end_tuple(&mut self) {
        self.out.push(op::TUPLE);
    }

    /// Stores the object just written in the memo, for [`PickleWriter::get`].
    pub fn memoize(&mut self) -> MemoRef {
        self.out.push(op::MEMOIZE);
        self.memo_len += 1;
        MemoRef(self.memo_len - 1)
    }

    /// Writes a reference to an object stored earlier: the reader shares it.
    pub fn get(&mut self, slot: MemoRef) {
        match u8::try_from(slot.0) {
            Ok(small) => self.out.extend([op::BINGET, small]),
            Err(_) => {
                self.out.push(op::LONG_BINGET);
                self.out.extend(slot.0.to_le_bytes());
            }
        }
    }

    /// Writes a string, sharing it through the memo after its first occurrence.
    pub fn shared_str(&mut self, value: &str, memo: &mut rustc_hash::FxHashMap<String, MemoRef>) {
        self.shared_str_slot(value, memo);
    }

    /// [`PickleWriter::shared_str`], returning the memo slot that holds the string, so that a
    /// caller that writes it again can [`PickleWriter::get`] it without looking it up.
    pub fn shared_str_slot(
        &mut self,
        value: &str,
        memo: &mut rustc_hash::FxHashMap<String, MemoRef>,
    ) -> MemoRef {
        match memo.get(value) {
            Some(&slot) => {
                self.get(slot);
                slot
            }
            None => {
                self.str(value);
                let slot = self.memoize();
                memo.insert(value.to_string(), slot);
                slot
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{parse, Value};

    #[test]
    fn round_trips_through_the_reader() {
        let mut w = PickleWriter::new();
        w.begin_dict();
        w.str("ints");
        w.begin_list();
        for v in [
            0i64,
            255,
            256,
            65535,
            65536,
            -1,
            i32::MIN as i64,
            i64::MAX,
            i64::MIN,
        ] {
            w.int(v);
        }
        w.uint(u64::MAX);
        w.end_list();
        w.str("text");
        w.str(&"é".repeat(300));
        w.str("shared");
        w.begin_tuple();
        w.float(1.5);
        w.bool(true);
        w.none();
        w.end_tuple();
        let slot = w.memoize();
        w.str("again");
        w.get(slot);
        w.end_dict();
        let bytes = w.finish();
        let value = parse(&bytes).unwrap();
        let text = format!("{value:?}");
        assert!(text.contains("255") && text.contains("65536"), "{text}");
        assert!(matches!(value, Value::Dict(_)));
    }

    /// Writes a list of `n` dicts, passing the bytes to `sink` every chunk when there is one.
    fn entries(n: u64, mut sink: Option<&mut Vec<u8>>) -> (PickleWriter, usize) {
        let mut w = PickleWriter::new();
        let mut memo = rustc_hash::FxHashMap::default();
        let mut drains = 0;
        w.begin_list();
        for i in 0..n {
            w.begin_dict();
            w.shared_str("addr", &mut memo);
            w.uint(i << 20);
            w.shared_str("action", &mut memo);
            w.str("alloc");
            w.end_dict();
            if let Some(sink) = sink.as_mut() {
                if w.pending() >= PickleWriter::CHUNK {
                    w.drain_into(*sink).unwrap();
                    drains += 1;
                }
            }
        }
        w.end_list();
        (w, drains)
    }

    #[test]
    fn a_drained_stream_is_the_same_bytes() {
        let (whole, _) = entries(20_000, None);
        let whole = whole.finish();
        let mut streamed = Vec::new();
        let (w, drains) = entries(20_000, Some(&mut streamed));
        assert!(drains > 2, "the stream passed its bytes on {drains} times");
        let len = w.finish_into(&mut streamed).unwrap();
        assert_eq!(len as usize, streamed.len());
        assert!(
            streamed == whole,
            "the streamed pickle differs from the whole one"
        );
        assert!(parse(&streamed).is_ok());
    }

    #[test]
    fn a_failed_drain_is_the_outputs_error() {
        let (mut w, _) = entries(10, None);
        let mut full = std::io::Cursor::new([0u8; 8]);
        let e = w.drain_into(&mut full).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::WriteZero);
    }
}
