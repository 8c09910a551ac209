//! The pickle opcodes by name, with the name each has in error messages and the reason each
//! refused one is refused.
//!
//! `super::machine` matches on these constants instead of literal bytes, and
//! `super::error::PickleErrorKind` carries the names [`opcode_name`] gives them. The byte
//! values are those of CPython's `Lib/pickletools.py`; the opcodes that import, construct or
//! call Python objects are listed here too, so that [`refusal`] can name them.

/// `(`: pushes a mark on the mark stack.
pub(crate) const MARK: u8 = b'(';
/// `.`: ends the pickle; the value on top of the stack is the result.
pub(crate) const STOP: u8 = b'.';
/// `0`: discards the top of the stack (or, with nothing above the last mark, the mark).
pub(crate) const POP: u8 = b'0';
/// `1`: discards the values above the last mark and the mark.
pub(crate) const POP_MARK: u8 = b'1';
/// `2`: pushes the top of the stack again.
pub(crate) const DUP: u8 = b'2';
/// `F`: a float in decimal text.
pub(crate) const FLOAT: u8 = b'F';
/// `I`: an integer in decimal text (`00` and `01` are `False` and `True`).
pub(crate) const INT: u8 = b'I';
/// `J`: a four-byte signed integer.
pub(crate) const BININT: u8 = b'J';
/// `K`: a one-byte unsigned integer.
pub(crate) const BININT1: u8 = b'K';
/// `L`: a long integer in decimal text, with an optional `L` suffix.
pub(crate) const LONG: u8 = b'L';
/// `M`: a two-byte unsigned integer.
pub(crate) const BININT2: u8 = b'M';
/// `N`: `None`.
pub(crate) const NONE: u8 = b'N';
/// `P`: a persistent id in text (refused).
pub(crate) const PERSID: u8 = b'P';
/// `Q`: a persistent id from the stack (refused).
pub(crate) const BINPERSID: u8 = b'Q';
/// `R`: calls a callable with arguments (refused).
pub(crate) const REDUCE: u8 = b'R';
/// `S`: a quoted, escaped byte string in text.
pub(crate) const STRING: u8 = b'S';
/// `T`: a byte string with a four-byte signed length.
pub(crate) const BINSTRING: u8 = b'T';
/// `U`: a byte string with a one-byte length.
pub(crate) const SHORT_BINSTRING: u8 = b'U';
/// `V`: text in `raw-unicode-escape` form, ended by a newline.
pub(crate) const UNICODE: u8 = b'V';
/// `X`: UTF-8 text with a four-byte length.
pub(crate) const BINUNICODE: u8 = b'X';
/// `a`: appends the top of the stack to the list below it.
pub(crate) const APPEND: u8 = b'a';
/// `b`: sets an object's state (refused).
pub(crate) const BUILD: u8 = b'b';
/// `c`: imports a module attribute by name (refused).
pub(crate) const GLOBAL: u8 = b'c';
/// `d`: a dict of the key/value pairs above the last mark.
pub(crate) const DICT: u8 = b'd';
/// `}`: an empty dict.
pub(crate) const EMPTY_DICT: u8 = b'}';
/// `e`: appends the values above the last mark to the list below it.
pub(crate) const APPENDS: u8 = b'e';
/// `g`: pushes a memo entry whose index is decimal text.
pub(crate) const GET: u8 = b'g';
/// `h`: pushes a memo entry with a one-byte index.
pub(crate) const BINGET: u8 = b'h';
/// `i`: builds an instance of a named class (refused).
pub(crate) const INST: u8 = b'i';
/// `j`: pushes a memo entry with a four-byte index.
pub(crate) const LONG_BINGET: u8 = b'j';
/// `l`: a list of the values above the last mark.
pub(crate) const LIST: u8 = b'l';
/// `]`: an empty list.
pub(crate) const EMPTY_LIST: u8 = b']';
/// `o`: builds an instance of a class from the stack (refused).
pub(crate) const OBJ: u8 = b'o';
/// `p`: stores the top of the stack in the memo at an index in decimal text.
pub(crate) const PUT: u8 = b'p';
/// `q`: stores the top of the stack in the memo at a one-byte index.
pub(crate) const BINPUT: u8 = b'q';
/// `r`: stores the top of the stack in the memo at a four-byte index.
pub(crate) const LONG_BINPUT: u8 = b'r';
/// `s`: sets one key/value pair of the dict below them.
pub(crate) const SETITEM: u8 = b's';
/// `t`: a tuple of the values above the last mark.
pub(crate) const TUPLE: u8 = b't';
/// `)`: an empty tuple.
pub(crate) const EMPTY_TUPLE: u8 = b')';
/// `u`: sets the key/value pairs above the last mark in the dict below it.
pub(crate) const SETITEMS: u8 = b'u';
/// `G`: a big-endian eight-byte float.
pub(crate) const BINFLOAT: u8 = b'G';
/// Protocol 2: the protocol version of the pickle.
pub(crate) const PROTO: u8 = 0x80;
/// Protocol 2: builds an object with `cls.__new__` (refused).
pub(crate) const NEWOBJ: u8 = 0x81;
/// Protocol 2: an object from the extension registry, one-byte code (refused).
pub(crate) const EXT1: u8 = 0x82;
/// Protocol 2: the same with a two-byte code (refused).
pub(crate) const EXT2: u8 = 0x83;
/// Protocol 2: the same with a four-byte code (refused).
pub(crate) const EXT4: u8 = 0x84;
/// Protocol 2: a tuple of the top value.
pub(crate) const TUPLE1: u8 = 0x85;
/// Protocol 2: a tuple of the top two values.
pub(crate) const TUPLE2: u8 = 0x86;
/// Protocol 2: a tuple of the top three values.
pub(crate) const TUPLE3: u8 = 0x87;
/// Protocol 2: `True`.
pub(crate) const NEWTRUE: u8 = 0x88;
/// Protocol 2: `False`.
pub(crate) const NEWFALSE: u8 = 0x89;
/// Protocol 2: a little-endian two's-complement integer with a one-byte length.
pub(crate) const LONG1: u8 = 0x8a;
/// Protocol 2: the same with a four-byte length.
pub(crate) const LONG4: u8 = 0x8b;
/// Protocol 3: bytes with a four-byte length.
pub(crate) const BINBYTES: u8 = b'B';
/// Protocol 3: bytes with a one-byte length.
pub(crate) const SHORT_BINBYTES: u8 = b'C';
/// Protocol 4: UTF-8 text with a one-byte length.
pub(crate) const SHORT_BINUNICODE: u8 = 0x8c;
/// Protocol 4: UTF-8 text with an eight-byte length.
pub(crate) const BINUNICODE8: u8 = 0x8d;
/// Protocol 4: bytes with an eight-byte length.
pub(crate) const BINBYTES8: u8 = 0x8e;
/// Protocol 4: an empty set.
pub(crate) const EMPTY_SET: u8 = 0x8f;
/// Protocol 4: adds the values above the last mark to the set below it.
pub(crate) const ADDITEMS: u8 = 0x90;
/// Protocol 4: a frozenset of the values above the last mark.
pub(crate) const FROZENSET: u8 = 0x91;
/// Protocol 4: builds an object with `cls.__new__` and keyword arguments (refused).
pub(crate) const NEWOBJ_EX: u8 = 0x92;
/// Protocol 4: imports a module attribute named by two strings on the stack (refused).
pub(crate) const STACK_GLOBAL: u8 = 0x93;
/// Protocol 4: stores the top of the stack in the memo at the next index.
pub(crate) const MEMOIZE: u8 = 0x94;
/// Protocol 4: announces the length of the next frame of opcodes.
pub(crate) const FRAME: u8 = 0x95;
/// Protocol 5: a bytearray with an eight-byte length.
pub(crate) const BYTEARRAY8: u8 = 0x96;
/// Protocol 5: the next out-of-band buffer (refused).
pub(crate) const NEXT_BUFFER: u8 = 0x97;
/// Protocol 5: makes the buffer on top of the stack read-only (refused).
pub(crate) const READONLY_BUFFER: u8 = 0x98;

/// The names of all pickle opcodes, for error messages.
pub fn opcode_name(byte: u8) -> &'static str {
    match byte {
        MARK => "MARK",
        STOP => "STOP",
        POP => "POP",
        POP_MARK => "POP_MARK",
        DUP => "DUP",
        FLOAT => "FLOAT",
        INT => "INT",
        BININT => "BININT",
        BININT1 => "BININT1",
        LONG => "LONG",
        BININT2 => "BININT2",
        NONE => "NONE",
        PERSID => "PERSID",
        BINPERSID => "BINPERSID",
        REDUCE => "REDUCE",
        STRING => "STRING",
        BINSTRING => "BINSTRING",
        SHORT_BINSTRING => "SHORT_BINSTRING",
        UNICODE => "UNICODE",
        BINUNICODE => "BINUNICODE",
        APPEND => "APPEND",
        BUILD => "BUILD",
        GLOBAL => "GLOBAL",
        DICT => "DICT",
        EMPTY_DICT => "EMPTY_DICT",
        APPENDS => "APPENDS",
        GET => "GET",
        BINGET => "BINGET",
        INST => "INST",
        LONG_BINGET => "LONG_BINGET",
        LIST => "LIST",
        EMPTY_LIST => "EMPTY_LIST",
        OBJ => "OBJ",
        PUT => "PUT",
        BINPUT => "BINPUT",
        LONG_BINPUT => "LONG_BINPUT",
        SETITEM => "SETITEM",
        TUPLE => "TUPLE",
        EMPTY_TUPLE => "EMPTY_TUPLE",
        SETITEMS => "SETITEMS",
        BINFLOAT => "BINFLOAT",
        PROTO => "PROTO",
        NEWOBJ => "NEWOBJ",
        EXT1 => "EXT1",
        EXT2 => "EXT2",
        EXT4 => "EXT4",
        TUPLE1 => "TUPLE1",
        TUPLE2 => "TUPLE2",
        TUPLE3 => "TUPLE3",
        NEWTRUE => "NEWTRUE",
        NEWFALSE => "NEWFALSE",
        LONG1 => "LONG1",
        LONG4 => "LONG4",
        BINBYTES => "BINBYTES",
        SHORT_BINBYTES => "SHORT_BINBYTES",
        SHORT_BINUNICODE => "SHORT_BINUNICODE",
        BINUNICODE8 => "BINUNICODE8",
        BINBYTES8 => "BINBYTES8",
        EMPTY_SET => "EMPTY_SET",
        ADDITEMS => "ADDITEMS",
        FROZENSET => "FROZENSET",
        NEWOBJ_EX => "NEWOBJ_EX",
        STACK_GLOBAL => "STACK_GLOBAL",
        MEMOIZE => "MEMOIZE",
        FRAME => "FRAME",
        BYTEARRAY8 => "BYTEARRAY8",
        NEXT_BUFFER => "NEXT_BUFFER",
        READONLY_BUFFER => "READONLY_BUFFER",
        _ => "unknown",
    }
}

/// Why an opcode is refused, or `None` when it only builds data.
pub(super) fn refusal(byte: u8) -> Option<&'static str> {
    match byte {
        GLOBAL | STACK_GLOBAL => Some("imports a Python object by name"),
        REDUCE | BUILD | INST | OBJ | NEWOBJ | NEWOBJ_EX => {
            Some("constructs or calls a Python object")
        }
        EXT1 | EXT2 | EXT4 => Some("imports a Python object from the extension registry"),
        PERSID | BINPERSID => Some("loads a persistent object through the unpickler"),
        NEXT_BUFFER | READONLY_BUFFER => Some("needs an out-of-band buffer"),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_byte_with_a_name_is_a_distinct_opcode() {
        // The table of names and the constants agree: 68 opcodes, each named once.
        let named: Vec<u8> = (0..=255u8)
            .filter(|&b| opcode_name(b) != "unknown")
            .collect();
        assert_eq!(named.len(), 68);
        let mut names: Vec<&str> = named.iter().map(|&b| opcode_name(b)).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), 68);
        assert_eq!(opcode_name(SHORT_BINUNICODE), "SHORT_BINUNICODE");
        assert_eq!(opcode_name(0xff), "unknown");
    }

    #[test]
    fn refused_opcodes_are_those_that_run_code_or_need_outside_data() {
        let refused: Vec<&str> = (0..=255u8)
            .filter(|&b| refusal(b).is_some())
            .map(opcode_name)
            .collect();
        assert_eq!(refused.len(), 15, "{refused:?}");
        assert!(refusal(EMPTY_DICT).is_none());
        assert!(refusal(GLOBAL).unwrap().contains("imports"));
    }
}
