//! A safe reader for the data subset of Python's pickle format, protocols 0 to 5.
//!
//! PyTorch's `torch.cuda.memory._dump_snapshot()` writes a pickle of plain Python values: dicts,
//! lists, tuples, strings, integers, floats, booleans and `None`, with strings, frame dicts and
//! whole frame lists shared through the pickle memo. This module reads such bytes into a
//! [`Document`], a compact arena that `crate::import::pytorch` walks through [`ValueRef`]s to
//! build the one data model of `vramscope_allocator::model`, or into a tree of immutable
//! [`Value`]s ([`parse`]). It never imports, constructs or calls anything: every opcode that
//! would (`GLOBAL`, `STACK_GLOBAL`, `REDUCE`, `BUILD`, `INST`, `OBJ`, `NEWOBJ`, `NEWOBJ_EX`,
//! the `EXT` registry, persistent ids, out-of-band buffers) is refused with a [`PickleError`]
//! that names the opcode and its byte offset. Truncated or corrupt input is an error naming
//! what went wrong and where, never a panic, and [`Limits`] bound nesting depth, the number of
//! values and the number of container elements so that hostile input cannot exhaust memory.
//!
//! A document stores each value in four bytes where it is referenced (small integers, `None`
//! and booleans in place, everything else as an index into a table of its kind), the text of
//! all strings in one buffer, and the elements of all containers in one pool. Lists and dicts
//! stay mutable until `STOP`, as the pickle machine requires; a list or tuple whose elements
//! are the very same values as an earlier one's (the identical frame lists of a training
//! loop's many allocations) shares that one's elements, so a trace of ten thousand entries
//! that share a few hundred stacks stores a few hundred frame lists. Once read, a document is
//! checked to contain no cycle and to nest no deeper than [`Limits::max_depth`], so that any
//! walk of it ends. [`parse`] then turns it into [`Value`]s in which every memo-shared object
//! (and every such list) becomes one reference-counted allocation.

#![warn(missing_docs)]
use std::fmt;
use std::hash::{Hash, Hasher};
use std::rc::Rc;

use rustc_hash::{FxHashMap, FxHasher};

/// A Python value read from a pickle.
///
/// Containers are reference counted: an object the pickle shares through its memo is one
/// allocation, reachable from every place that references it. A walk that follows every path
/// of a hostile pickle can therefore visit far more nodes than the input has bytes; code that
/// walks arbitrary values should remember visited containers by [`Value::identity`].
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    /// Python's `None`.
    None,
    /// `True` or `False`.
    Bool(bool),
    /// An integer that fits in 64 bits.
    Int(i64),
    /// An integer too large for 64 bits: its minimal little-endian two's-complement bytes, as
    /// `LONG1`/`LONG4` store them.
    BigInt(Rc<[u8]>),
    /// A float.
    Float(f64),
    /// A text string. Invalid UTF-8 (for example a lone surrogate) is replaced by U+FFFD.
    Str(Rc<str>),
    /// A `bytes` or `bytearray` value (or a protocol 0–2 byte string that is not UTF-8).
    Bytes(Rc<[u8]>),
    /// A list.
    List(Rc<[Value]>),
    /// A tuple.
    Tuple(Rc<[Value]>),
    /// A dict as key/value pairs in insertion order, with a key set twice kept once (the last
    /// value wins, as in Python; keys are compared structurally, so `1` and `1.0` differ).
    Dict(Rc<[(Value, Value)]>),
    /// A set, without duplicate elements.
    Set(Rc<[Value]>),
    /// A frozenset, without duplicate elements.
    FrozenSet(Rc<[Value]>),
}

impl Value {
    /// The Python type name of the value (`"dict"`, `"int"`, ...), for error messages.
    pub fn type_name(&self) -> &'static str {
        match self {
            Value::None => "None",
            Value::Bool(_) => "bool",
            Value::Int(_) | Value::BigInt(_) => "int",
            Value::Float(_) => "float",
            Value::Str(_) => "str",
            Value::Bytes(_) => "bytes",
            Value::List(_) => "list",
            Value::Tuple(_) => "tuple",
            Value::Dict(_) => "dict",
            Value::Set(_) => "set",
            Value::FrozenSet(_) => "frozenset",
        }
    }

    /// Whether the value is `None`.
    pub fn is_none(&self) -> bool {
        matches!(self, Value::None)
    }

    /// The boolean, when the value is a `bool`.
    pub fn as_bool(&self) -> Option<bool> {
        match self {
            Value::Bool(b) => Some(*b),
            _ => None,
        }
    }

    /// The integer, when the value is an `int` that fits in an `i64`.
    pub fn as_i64(&self) -> Option<i64> {
        match self {
            Value::Int(i) => Some(*i),
            _ => None,
        }
    }

    /// The integer, when the value is a non-negative `int` that fits in a `u64`.
    pub fn as_u64(&self) -> Option<u64> {
        match self {
            Value::Int(i) => u64::try_from(*i).ok(),
            Value::BigInt(bytes) => big_u64(bytes),
            _ => None,
        }
    }

    /// The number as a float, when the value is a `float` or an `int`.
    pub fn as_f64(&self) -> Option<f64> {
        match self {
            Value::Float(f) => Some(*f),
            Value::Int(i) => Some(*i as f64),
            _ => None,
        }
    }

    /// The text, when the value is a `str`.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::Str(s) => Some(s),
            _ => None,
        }
    }

    /// The bytes, when the value is `bytes` or `bytearray`.
    pub fn as_bytes(&self) -> Option<&[u8]> {
        match self {
            Value::Bytes(b) => Some(b),
            _ => None,
        }
    }

    /// The elements, when the value is a list or a tuple.
    pub fn as_seq(&self) -> Option<&[Value]> {
        match self {
            Value::List(items) | Value::Tuple(items) => Some(items),
            _ => None,
        }
    }

    /// The key/value pairs, when the value is a dict.
    pub fn as_dict(&self) -> Option<&[(Value, Value)]> {
        match self {
            Value::Dict(pairs) => Some(pairs),
            _ => None,
        }
    }

    /// The value under the string key `key`, when the value is a dict that has it.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.as_dict()?
            .iter()
            .find(|(k, _)| k.as_str() == Some(key))
            .map(|(_, v)| v)
    }

    /// An address that identifies the shared allocation behind a string, bytes or container
    /// value; `None` for scalars and empty containers. Two values with the same identity are
    /// equal: they are one memoized object, or lists (or tuples) of the very same elements,
    /// which the reader stores once. Importers use it to convert each shared object once.
    pub fn identity(&self) -> Option<usize> {
        fn addr<T: ?Sized>(rc: &Rc<T>) -> usize {
            Rc::as_ptr(rc) as *const u8 as usize
        }
        match self {
            Value::Str(s) => Some(addr(s)),
            Value::Bytes(b) | Value::BigInt(b) => Some(addr(b)),
            Value::List(v) | Value::Tuple(v) | Value::Set(v) | Value::FrozenSet(v) => {
                (!v.is_empty()).then(|| addr(v))
            }
            Value::Dict(d) => (!d.is_empty()).then(|| addr(d)),
            _ => None,
        }
    }
}

/// The largest input read by default, in bytes (4 GiB): more than the largest PyTorch snapshots
/// of big jobs. `vramscope --max-input` and `VRAMSCOPE_MAX_INPUT` set another ceiling.
pub const DEFAULT_MAX_INPUT_BYTES: usize = 4 << 30;

/// Bounds on what one [`parse`] may build; exceeding one is an error, never an abort.
///
/// The bounds that protect memory scale with the input instead of being fixed counts, so that
/// a genuine snapshot of any size up to [`Limits::max_input_bytes`] is read while a small
/// hostile file cannot make a large document:
///
/// - every container element costs at least one opcode byte (the opcode that pushed it onto
///   the stack; a memo reference is counted once, where it is placed), so a document never
///   holds more elements or values than its input has bytes;
/// - the memory the document takes (its tables, element pool, stack and memo) may not pass
///   [`Limits::memory_per_input_byte`] bytes per input byte, or
///   [`Limits::min_memory_bytes`] for small inputs. PyTorch's snapshots take 2 to 3 bytes per
///   input byte; crafted ones (a byte that wraps the top of the stack in a tuple, an empty
///   container per byte, copies of shared lists) take 20 to 100 without the bound.
///
/// The hard ceilings that remain are what a document can address: 2^28 integers, floats,
/// strings, byte strings or containers each, and 2^32 element slots. A PyTorch snapshot
/// reaches the first of them (strings or element slots) at well over 10 GB.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Largest input accepted, in bytes ([`DEFAULT_MAX_INPUT_BYTES`] by default).
    pub max_input_bytes: usize,
    /// Deepest nesting of containers (the top-level container is depth 1). It also bounds the
    /// `MARK`s open at once: a pickler opens one per container it is still building, so no
    /// pickle of data nested within this depth needs more.
    pub max_depth: usize,
    /// The most bytes of memory the document may take per byte of input.
    pub memory_per_input_byte: usize,
    /// The most bytes of memory the document may take whatever its input's size, when that is
    /// more than `memory_per_input_byte` times the input's size.
    pub min_memory_bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_input_bytes: DEFAULT_MAX_INPUT_BYTES,
            max_depth: 200,
            memory_per_input_byte: 16,
            min_memory_bytes: 64 << 20,
        }
    }
}

impl Limits {
    /// The most bytes of memory a document read from `input_bytes` bytes may take.
    pub fn memory_budget(&self, input_bytes: usize) -> usize {
        input_bytes
            .saturating_mul(self.memory_per_input_byte)
            .max(self.min_memory_bytes)
    }
}

/// What went wrong while reading a pickle.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PickleErrorKind {
    /// The input is empty.
    Empty,
    /// The input ended inside an opcode's argument.
    Truncated {
        /// The opcode whose argument is cut.
        opcode: &'static str,
        /// Bytes the argument needs.
        needed: u64,
        /// Bytes left in the input.
        available: u64,
    },
    /// The input ended before a `STOP` opcode.
    MissingStop,
    /// An opcode that imports, constructs or calls Python objects, or needs data outside the
    /// stream.
    Refused {
        /// The opcode.
        opcode: &'static str,
        /// What the opcode would do.
        reason: &'static str,
    },
    /// A byte that is not a pickle opcode.
    UnknownOpcode {
        /// The byte.
        byte: u8,
    },
    /// A `PROTO` opcode announcing a protocol newer than 5.
    UnsupportedProtocol {
        /// The announced protocol.
        version: u8,
    },
    /// An opcode needed more values than the stack holds above the last mark.
    StackUnderflow {
        /// The opcode.
        opcode: &'static str,
    },
    /// An opcode needed a mark and none is set.
    MissingMark {
        /// The opcode.
        opcode: &'static str,
    },
    /// A memo lookup of an index that was never stored.
    MissingMemo {
        /// The index.
        index: u64,
    },
    /// An opcode found a value of the wrong type (for example `APPEND` onto a dict).
    WrongType {
        /// The opcode.
        opcode: &'static str,
        /// The type the opcode needs.
        expected: &'static str,
        /// The type found.
        found: &'static str,
    },
    /// An opcode's argument is malformed (a negative length, a bad decimal number, ...).
    BadArgument {
        /// The opcode.
        opcode: &'static str,
        /// What is wrong.
        reason: String,
    },
    /// The input is larger than [`Limits::max_input_bytes`].
    InputTooLarge {
        /// The input's size in bytes.
        size: usize,
        /// The limit in bytes.
        limit: usize,
    },
    /// The document would take more memory than [`Limits::memory_budget`] allows for its input.
    MemoryBudget {
        /// The budget in bytes.
        limit: usize,
        /// The input's size in bytes.
        input_bytes: usize,
        /// The bytes of memory allowed per input byte.
        per_input_byte: usize,
    },
    /// A [`Limits`] bound, or what a document can address, was exceeded.
    LimitExceeded {
        /// Which bound.
        what: &'static str,
        /// Its value.
        limit: usize,
    },
    /// A container contains itself, which an immutable [`Value`] cannot represent.
    Cycle,
}

/// An error while reading a pickle: what went wrong and at which byte offset.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PickleError {
    /// Byte offset of the opcode at fault (for limits and cycles, of the opcode that created
    /// the container concerned; for a missing `STOP`, the input length).
    pub offset: usize,
    /// What went wrong.
    pub kind: PickleErrorKind,
}

impl fmt::Display for PickleError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "pickle byte offset {}: ", self.offset)?;
        match &self.kind {
            PickleErrorKind::Empty => f.write_str("the input is empty"),
            PickleErrorKind::Truncated {
                opcode,
                needed,
                available,
            } => write!(
                f,
                "truncated: {opcode} needs {needed} bytes of argument but only {available} remain"
            ),
            PickleErrorKind::MissingStop => f.write_str("truncated: the input ends before STOP"),
            PickleErrorKind::Refused { opcode, reason } => write!(
                f,
                "refused opcode {opcode}: it {reason}; only plain data pickles are read"
            ),
            PickleErrorKind::UnknownOpcode { byte } => {
                write!(f, "unknown opcode byte 0x{byte:02x} (corrupt input?)")
            }
            PickleErrorKind::UnsupportedProtocol { version } => {
                write!(f, "pickle protocol {version} is newer than 5")
            }
            PickleErrorKind::StackUnderflow { opcode } => {
                write!(f, "{opcode} needs more values than the stack holds")
            }
            PickleErrorKind::MissingMark { opcode } => write!(f, "{opcode} needs a MARK"),
            PickleErrorKind::MissingMemo { index } => {
                write!(f, "memo index {index} was never stored")
            }
            PickleErrorKind::WrongType {
                opcode,
                expected,
                found,
            } => write!(f, "{opcode} needs a {expected} but found a {found}"),
            PickleErrorKind::BadArgument { opcode, reason } => {
                write!(f, "bad argument of {opcode}: {reason}")
            }
            PickleErrorKind::InputTooLarge { size, limit } => write!(
                f,
                "the input is {size} bytes ({}), more than the limit of {limit} bytes ({}); raise it with --max-input SIZE or VRAMSCOPE_MAX_INPUT=SIZE",
                human_bytes(*size),
                human_bytes(*limit)
            ),
            PickleErrorKind::MemoryBudget {
                limit,
                input_bytes,
                per_input_byte,
            } => write!(
                f,
                "limit exceeded: the document would take more than {limit} bytes ({}) of memory, the budget for a {input_bytes}-byte ({}) input at {per_input_byte} bytes per input byte; PyTorch's snapshots take 2 to 3, so this is not a plain memory snapshot",
                human_bytes(*limit),
                human_bytes(*input_bytes)
            ),
            PickleErrorKind::LimitExceeded { what, limit } => {
                write!(f, "limit exceeded: more than {limit} {what}")
            }
            PickleErrorKind::Cycle => {
                f.write_str("a container contains itself; recursive structures are not plain data")
            }
        }
    }
}

impl std::error::Error for PickleError {}

/// `bytes` in binary units with one decimal (`3.9 GiB`), for error messages.
pub fn human_bytes(bytes: usize) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

/// Parses a pickle of plain data with the default [`Limits`].
///
/// ```
/// use vramscope_inspector::pickle::{parse, Value};
/// // pickle.dumps([1, "a"], protocol=2)
/// let v = parse(b"\x80\x02]q\x00(K\x01X\x01\x00\x00\x00aq\x01e.").unwrap();
/// assert_eq!(v.as_seq().unwrap()[0], Value::Int(1));
/// assert_eq!(v.as_seq().unwrap()[1].as_str(), Some("a"));
/// ```
pub fn parse(bytes: &[u8]) -> Result<Value, PickleError> {
    parse_with_limits(bytes, &Limits::default())
}

/// Parses a pickle of plain data within `limits`.
pub fn parse_with_limits(bytes: &[u8], limits: &Limits) -> Result<Value, PickleError> {
    Ok(Document::parse_with_limits(bytes, limits)?
        .root()
        .to_value())
}

/// The names of all pickle opcodes, for error messages.
pub fn opcode_name(byte: u8) -> &'static str {
    match byte {
        b'(' => "MARK",
        b'.' => "STOP",
        b'0' => "POP",
        b'1' => "POP_MARK",
        b'2' => "DUP",
        b'F' => "FLOAT",
        b'I' => "INT",
        b'J' => "BININT",
        b'K' => "BININT1",
        b'L' => "LONG",
        b'M' => "BININT2",
        b'N' => "NONE",
        b'P' => "PERSID",
        b'Q' => "BINPERSID",
        b'R' => "REDUCE",
        b'S' => "STRING",
        b'T' => "BINSTRING",
        b'U' => "SHORT_BINSTRING",
        b'V' => "UNICODE",
        b'X' => "BINUNICODE",
        b'a' => "APPEND",
        b'b' => "BUILD",
        b'c' => "GLOBAL",
        b'd' => "DICT",
        b'}' => "EMPTY_DICT",
        b'e' => "APPENDS",
        b'g' => "GET",
        b'h' => "BINGET",
        b'i' => "INST",
        b'j' => "LONG_BINGET",
        b'l' => "LIST",
        b']' => "EMPTY_LIST",
        b'o' => "OBJ",
        b'p' => "PUT",
        b'q' => "BINPUT",
        b'r' => "LONG_BINPUT",
        b's' => "SETITEM",
        b't' => "TUPLE",
        b')' => "EMPTY_TUPLE",
        b'u' => "SETITEMS",
        b'G' => "BINFLOAT",
        0x80 => "PROTO",
        0x81 => "NEWOBJ",
        0x82 => "EXT1",
        0x83 => "EXT2",
        0x84 => "EXT4",
        0x85 => "TUPLE1",
        0x86 => "TUPLE2",
        0x87 => "TUPLE3",
        0x88 => "NEWTRUE",
        0x89 => "NEWFALSE",
        0x8a => "LONG1",
        0x8b => "LONG4",
        b'B' => "BINBYTES",
        b'C' => "SHORT_BINBYTES",
        0x8c => "SHORT_BINUNICODE",
        0x8d => "BINUNICODE8",
        0x8e => "BINBYTES8",
        0x8f => "EMPTY_SET",
        0x90 => "ADDITEMS",
        0x91 => "FROZENSET",
        0x92 => "NEWOBJ_EX",
        0x93 => "STACK_GLOBAL",
        0x94 => "MEMOIZE",
        0x95 => "FRAME",
        0x96 => "BYTEARRAY8",
        0x97 => "NEXT_BUFFER",
        0x98 => "READONLY_BUFFER",
        _ => "unknown",
    }
}

/// Why an opcode is refused, or `None` when it only builds data.
fn refusal(byte: u8) -> Option<&'static str> {
    match byte {
        b'c' | 0x93 => Some("imports a Python object by name"),
        b'R' | b'b' | b'i' | b'o' | 0x81 | 0x92 => Some("constructs or calls a Python object"),
        0x82..=0x84 => Some("imports a Python object from the extension registry"),
        b'P' | b'Q' => Some("loads a persistent object through the unpickler"),
        0x97 | 0x98 => Some("needs an out-of-band buffer"),
        _ => None,
    }
}

/// Bits of a [`Ref`] that hold its payload; the four bits above them hold its kind.
const PAYLOAD_BITS: u32 = 28;
/// The payload of a [`Ref`].
const PAYLOAD_MASK: u32 = (1 << PAYLOAD_BITS) - 1;
/// The most entries one table of a document holds (integers, floats, strings, byte strings,
/// containers, each table on its own), whatever the [`Limits`] allow: every index of a table
/// must fit in a [`Ref`]'s payload. Values stored in place (small integers, `None`, booleans)
/// take no entry.
const MAX_TABLE: usize = 1 << PAYLOAD_BITS;
/// How many opcodes run between two checks of the memory budget; a container that moves to
/// grow is checked at once.
const BUDGET_CHECK_EVERY: u32 = 256;

/// The most decimal digits an `INT` or `LONG` opcode may have: Python's own default limit
/// (`sys.int_info.default_max_str_digits`) for converting text to an integer, which its
/// unpickler applies to these opcodes too.
const MAX_DECIMAL_DIGITS: usize = 4300;

/// The kinds of value a [`Ref`] can name.
mod kind {
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
}

/// A value as a document references it: its kind in the top four bits and, in the other 28,
/// a small integer or an index into the table of its kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct Ref(u32);

impl Ref {
    const NONE: Ref = Ref::new(kind::CONST, 0);
    const FALSE: Ref = Ref::new(kind::CONST, 1);
    const TRUE: Ref = Ref::new(kind::CONST, 2);
    /// Fills element slots reserved for a container to grow into.
    const VACANT: Ref = Ref(u32::MAX);

    const fn new(kind: u32, payload: u32) -> Ref {
        Ref((kind << PAYLOAD_BITS) | (payload & PAYLOAD_MASK))
    }

    /// The integer in place, when it fits in 28 bits.
    fn small(v: i64) -> Option<Ref> {
        const HALF: i64 = 1 << (PAYLOAD_BITS - 1);
        (-HALF..HALF)
            .contains(&v)
            .then(|| Ref::new(kind::SMALL_INT, v as u32))
    }

    fn kind(self) -> u32 {
        self.0 >> PAYLOAD_BITS
    }

    fn index(self) -> usize {
        (self.0 & PAYLOAD_MASK) as usize
    }

    /// The integer of a `SMALL_INT`, sign-extended from 28 bits.
    fn small_value(self) -> i64 {
        (((self.0 << (32 - PAYLOAD_BITS)) as i32) >> (32 - PAYLOAD_BITS)) as i64
    }

    fn is_container(self) -> bool {
        (kind::LIST..=kind::FROZEN_SET).contains(&self.kind())
    }

    fn type_name(self) -> &'static str {
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
struct Container {
    /// Position of the first element.
    start: u32,
    /// Number of elements (a dict's keys and values both count).
    len: u32,
    /// Slots reserved from `start` (at least `len`) that the container may grow into.
    cap: u32,
    /// Whether another container has the very same elements in the same slots (see
    /// [`Machine::share_equal`]), so that the container must move to grow.
    shared: bool,
}

impl Container {
    fn range(&self) -> std::ops::Range<usize> {
        self.start as usize..self.start as usize + self.len as usize
    }
}

/// A pickle read into compact tables: the result of [`Document::parse`].
///
/// Values are reached from [`Document::root`] as [`ValueRef`]s. The document is immutable,
/// free of cycles and nested no deeper than the [`Limits`] it was read with.
pub struct Document {
    root: Ref,
    /// The size of the input in bytes.
    input_len: usize,
    /// Integers that need more than 28 bits.
    ints: Vec<i64>,
    floats: Vec<f64>,
    /// The text of all strings, one after another.
    text: String,
    /// Where each string's text ends.
    text_ends: Vec<usize>,
    /// The bytes of all byte strings and big integers.
    blob: Vec<u8>,
    /// Where each byte string ends.
    blob_ends: Vec<usize>,
    containers: Vec<Container>,
    /// The elements of all containers.
    items: Vec<Ref>,
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

    fn at(&self, r: Ref) -> ValueRef<'_> {
        ValueRef { doc: self, r }
    }

    fn text_of(&self, i: usize) -> &str {
        let start = if i == 0 { 0 } else { self.text_ends[i - 1] };
        &self.text[start..self.text_ends[i]]
    }

    fn blob_of(&self, i: usize) -> &[u8] {
        let start = if i == 0 { 0 } else { self.blob_ends[i - 1] };
        &self.blob[start..self.blob_ends[i]]
    }

    /// The elements of the container `r`.
    fn elements(&self, r: Ref) -> &[Ref] {
        &self.items[self.containers[r.index()].range()]
    }

    /// Appends `new` to the elements of container `c`, in place when its reserved slots or
    /// the end of the pool allow, else by moving its elements to the end of the pool.
    /// Returns `false`, changing nothing, when the pool would outgrow 32-bit positions.
    fn extend(&mut self, c: usize, new: &[Ref]) -> bool {
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
        };
        true
    }

    /// Checks that no container reachable from the root contains itself and that none is
    /// nested deeper than `limits.max_depth`, visiting containers depth first in element
    /// order; returns the first container at fault and what is wrong.
    fn check(&self, limits: &Limits) -> Result<(), (usize, PickleErrorKind)> {
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
    pub fn type_name(self) -> &'static str {
        self.r.type_name()
    }

    /// Whether the value is `None`.
    pub fn is_none(self) -> bool {
        self.r == Ref::NONE
    }

    /// The boolean, when the value is a `bool`.
    pub fn as_bool(self) -> Option<bool> {
        match self.r {
            Ref::TRUE => Some(true),
            Ref::FALSE => Some(false),
            _ => None,
        }
    }

    /// The integer, when the value is an `int` that fits in an `i64`.
    pub fn as_i64(self) -> Option<i64> {
        match self.r.kind() {
            kind::SMALL_INT => Some(self.r.small_value()),
            kind::INT => Some(self.doc.ints[self.r.index()]),
            _ => None,
        }
    }

    /// The integer, when the value is a non-negative `int` that fits in a `u64`.
    pub fn as_u64(self) -> Option<u64> {
        match self.r.kind() {
            kind::BIG_INT => big_u64(self.doc.blob_of(self.r.index())),
            _ => self.as_i64().and_then(|i| u64::try_from(i).ok()),
        }
    }

    /// The float, when the value is a `float`.
    pub fn as_float(self) -> Option<f64> {
        (self.r.kind() == kind::FLOAT).then(|| self.doc.floats[self.r.index()])
    }

    /// The number as a float, when the value is a `float` or an `int` that fits in an `i64`.
    pub fn as_f64(self) -> Option<f64> {
        self.as_float().or_else(|| self.as_i64().map(|i| i as f64))
    }

    /// The text, when the value is a `str`.
    pub fn as_str(self) -> Option<&'d str> {
        (self.r.kind() == kind::STR).then(|| self.doc.text_of(self.r.index()))
    }

    /// The bytes, when the value is `bytes` or `bytearray`.
    pub fn as_bytes(self) -> Option<&'d [u8]> {
        (self.r.kind() == kind::BYTES).then(|| self.doc.blob_of(self.r.index()))
    }

    /// The elements, when the value is a list or a tuple.
    pub fn as_seq(self) -> Option<Seq<'d>> {
        matches!(self.r.kind(), kind::LIST | kind::TUPLE).then(|| Seq {
            doc: self.doc,
            refs: self.doc.elements(self.r),
        })
    }

    /// The elements, when the value is a list, a tuple, a set or a frozenset.
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

    /// The elements in order.
    pub fn iter(self) -> impl DoubleEndedIterator<Item = ValueRef<'d>> + ExactSizeIterator {
        let doc = self.doc;
        self.refs.iter().map(move |&r| doc.at(r))
    }
}

/// The value of a minimal nine-byte encoding of an integer in 2^63..2^64.
fn big_u64(bytes: &[u8]) -> Option<u64> {
    if bytes.len() == 9 && bytes[8] == 0 {
        let mut le = [0u8; 8];
        le.copy_from_slice(&bytes[..8]);
        Some(u64::from_le_bytes(le))
    } else {
        None
    }
}

/// Turns document values into [`Value`]s, building each shared object once.
///
/// Every step is linear in the document: a list referenced many times is found again by the
/// position of its elements, not by hashing them anew, and the repeated keys of dicts and
/// elements of sets are found through [`KeyIds`], not by comparing values pairwise.
struct ValueBuilder<'d> {
    doc: &'d Document,
    /// Finished strings, byte strings, big integers, dicts and sets, by reference.
    built: FxHashMap<Ref, Value>,
    /// Finished lists and tuples by kind and the position and length of their elements, which
    /// containers that share elements share.
    by_slot: FxHashMap<(u32, u32, u32), Value>,
    /// Finished lists and tuples by kind and elements, looked up once per position: equal
    /// lists whose elements the reader stored twice still become one allocation.
    sequences: FxHashMap<(u32, &'d [Ref]), Value>,
    keys: KeyIds<'d>,
}

impl<'d> ValueBuilder<'d> {
    fn new(doc: &'d Document) -> ValueBuilder<'d> {
        ValueBuilder {
            doc,
            built: FxHashMap::default(),
            by_slot: FxHashMap::default(),
            sequences: FxHashMap::default(),
            keys: KeyIds::new(doc),
        }
    }

    /// Builds the value `r`. The document has no cycles and bounded depth (see
    /// [`Document::check`]), so the recursion ends.
    fn build(&mut self, r: Ref) -> Value {
        let doc = self.doc;
        let i = r.index();
        match r.kind() {
            kind::SMALL_INT => return Value::Int(r.small_value()),
            kind::CONST if r == Ref::NONE => return Value::None,
            kind::CONST => return Value::Bool(r == Ref::TRUE),
            kind::INT => return Value::Int(doc.ints[i]),
            kind::FLOAT => return Value::Float(doc.floats[i]),
            kind::LIST | kind::TUPLE => {
                let c = doc.containers[i];
                let slot = (r.kind(), c.start, c.len);
                if let Some(v) = self.by_slot.get(&slot) {
                    return v.clone();
                }
                let key = (r.kind(), doc.elements(r));
                let v = match self.sequences.get(&key) {
                    Some(v) => v.clone(),
                    None => {
                        let items: Rc<[Value]> = key.1.iter().map(|&e| self.build(e)).collect();
                        let v = if r.kind() == kind::TUPLE {
                            Value::Tuple(items)
                        } else {
                            Value::List(items)
                        };
                        self.sequences.insert(key, v.clone());
                        v
                    }
                };
                self.by_slot.insert(slot, v.clone());
                return v;
            }
            _ => {}
        }
        if let Some(v) = self.built.get(&r) {
            return v.clone();
        }
        let v = match r.kind() {
            kind::STR => Value::Str(Rc::from(doc.text_of(i))),
            kind::BYTES => Value::Bytes(Rc::from(doc.blob_of(i))),
            kind::BIG_INT => Value::BigInt(Rc::from(doc.blob_of(i))),
            kind::SET | kind::FROZEN_SET => {
                let elements = doc.elements(r);
                let ids: Vec<u32> = elements.iter().map(|&e| self.keys.id(e)).collect();
                let items: Rc<[Value]> = match distinct(&ids) {
                    None => elements.iter().map(|&e| self.build(e)).collect(),
                    Some(kept) => kept
                        .into_iter()
                        .map(|(first, _)| self.build(elements[first]))
                        .collect(),
                };
                if r.kind() == kind::SET {
                    Value::Set(items)
                } else {
                    Value::FrozenSet(items)
                }
            }
            _ => {
                let elements = doc.elements(r);
                let ids: Vec<u32> = elements
                    .chunks_exact(2)
                    .map(|pair| self.keys.id(pair[0]))
                    .collect();
                let pairs: Rc<[(Value, Value)]> = match distinct(&ids) {
                    None => elements
                        .chunks_exact(2)
                        .map(|pair| (self.build(pair[0]), self.build(pair[1])))
                        .collect(),
                    // A key set twice keeps its first place and its last value, as in Python.
                    Some(kept) => kept
                        .into_iter()
                        .map(|(first, last)| {
                            (
                                self.build(elements[2 * first]),
                                self.build(elements[2 * last + 1]),
                            )
                        })
                        .collect(),
                };
                Value::Dict(pairs)
            }
        };
        self.built.insert(r, v.clone());
        v
    }
}

/// When `ids` has repeats, the first and last position of each distinct id, in the order of
/// first positions; `None` when all are distinct.
fn distinct(ids: &[u32]) -> Option<Vec<(usize, usize)>> {
    let mut seen: FxHashMap<u32, usize> = FxHashMap::default();
    let mut kept: Vec<(usize, usize)> = Vec::with_capacity(ids.len());
    let mut repeated = false;
    for (i, &id) in ids.iter().enumerate() {
        match seen.get(&id) {
            Some(&k) => {
                kept[k].1 = i;
                repeated = true;
            }
            None => {
                seen.insert(id, kept.len());
                kept.push((i, i));
            }
        }
    }
    repeated.then_some(kept)
}

/// A scalar as [`KeyIds`] compares it.
#[derive(PartialEq, Eq, Hash)]
enum Atom<'d> {
    /// `None`, `False` or `True`, by the payload of their [`Ref`].
    Const(u32),
    /// An integer that fits in 64 bits.
    Int(i64),
    /// A float by its bits, with `-0.0` counted as `0.0`.
    Float(u64),
    /// A NaN, which equals only itself (one value referenced twice): by its index.
    Nan(usize),
    /// A text string.
    Str(&'d str),
    /// A byte string.
    Bytes(&'d [u8]),
    /// An integer too large for 64 bits, by its minimal bytes.
    BigInt(&'d [u8]),
}

/// Numbers values so that two values get the same number exactly when they are equal as
/// [`Value`]s compare them (structurally, in order, after a dict or set drops its repeated
/// keys), except that a NaN equals itself when it is the same object, as in Python.
///
/// Each string, byte string and container of the document is numbered once, from the numbers
/// of its elements, so numbering every key of a document takes time linear in its size
/// however its containers are shared, where comparing values pairwise could take time
/// quadratic in a dict's size and exponential in the nesting of shared containers.
struct KeyIds<'d> {
    doc: &'d Document,
    /// Numbers of scalars by content.
    atoms: FxHashMap<Atom<'d>, u32>,
    /// Numbers of containers by kind and the numbers of their (kept) elements.
    shapes: FxHashMap<(u32, Vec<u32>), u32>,
    /// Numbers already given to strings, byte strings, big integers and containers.
    known: FxHashMap<Ref, u32>,
    next: u32,
}

impl<'d> KeyIds<'d> {
    fn new(doc: &'d Document) -> KeyIds<'d> {
        KeyIds {
            doc,
            atoms: FxHashMap::default(),
            shapes: FxHashMap::default(),
            known: FxHashMap::default(),
            next: 0,
        }
    }

    /// The next unused number.
    fn fresh(next: &mut u32) -> u32 {
        let id = *next;
        *next += 1;
        id
    }

    fn atom(&mut self, atom: Atom<'d>) -> u32 {
        let next = &mut self.next;
        *self.atoms.entry(atom).or_insert_with(|| Self::fresh(next))
    }

    /// The number of the value `r`.
    fn id(&mut self, r: Ref) -> u32 {
        let doc = self.doc;
        let i = r.index();
        match r.kind() {
            kind::SMALL_INT => return self.atom(Atom::Int(r.small_value())),
            kind::CONST => return self.atom(Atom::Const(i as u32)),
            kind::INT => return self.atom(Atom::Int(doc.ints[i])),
            kind::FLOAT => {
                let f = doc.floats[i];
                let atom = if f.is_nan() {
                    Atom::Nan(i)
                } else if f == 0.0 {
                    Atom::Float(0)
                } else {
                    Atom::Float(f.to_bits())
                };
                return self.atom(atom);
            }
            _ => {}
        }
        if let Some(&id) = self.known.get(&r) {
            return id;
        }
        let id = match r.kind() {
            kind::STR => self.atom(Atom::Str(doc.text_of(i))),
            kind::BYTES => self.atom(Atom::Bytes(doc.blob_of(i))),
            kind::BIG_INT => self.atom(Atom::BigInt(doc.blob_of(i))),
            k => {
                let ids: Vec<u32> = doc.elements(r).iter().map(|&e| self.id(e)).collect();
                let kept: Vec<u32> = match k {
                    kind::SET | kind::FROZEN_SET => match distinct(&ids) {
                        None => ids,
                        Some(kept) => kept.into_iter().map(|(first, _)| ids[first]).collect(),
                    },
                    kind::DICT => {
                        let keys: Vec<u32> = ids.iter().step_by(2).copied().collect();
                        match distinct(&keys) {
                            None => ids,
                            Some(kept) => kept
                                .into_iter()
                                .flat_map(|(first, last)| [ids[2 * first], ids[2 * last + 1]])
                                .collect(),
                        }
                    }
                    _ => ids,
                };
                let next = &mut self.next;
                *self
                    .shapes
                    .entry((k, kept))
                    .or_insert_with(|| Self::fresh(next))
            }
        };
        self.known.insert(r, id);
        id
    }
}

/// The memo: dense for the sequential indices every Python pickler writes, sparse otherwise,
/// so that a huge `LONG_BINPUT` index cannot force a huge allocation.
#[derive(Default)]
struct Memo {
    dense: Vec<Ref>,
    sparse: FxHashMap<u64, Ref>,
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

/// An integer read from the input.
enum PyInt {
    /// One that fits in 64 bits.
    Fits(i64),
    /// Its minimal little-endian two's-complement bytes, when it does not.
    Big(Vec<u8>),
}

/// The pickle virtual machine, restricted to data, building a [`Document`].
struct Machine<'a> {
    data: &'a [u8],
    pos: usize,
    /// The most bytes of memory the document may take ([`Limits::memory_budget`]).
    budget: usize,
    /// The bytes of memory allowed per input byte, for the error.
    per_input_byte: usize,
    /// Opcodes left until the next check of the budget.
    until_check: u32,
    doc: Document,
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
    origins: Vec<usize>,
    /// Offset of the opcode being executed.
    op_pos: usize,
    op: u8,
}

type Step<T> = Result<T, PickleError>;

impl<'a> Machine<'a> {
    fn new(data: &'a [u8], limits: &Limits, record_origins: bool) -> Self {
        Machine {
            data,
            pos: 0,
            budget: limits.memory_budget(data.len()),
            per_input_byte: limits.memory_per_input_byte,
            until_check: BUDGET_CHECK_EVERY,
            doc: Document {
                root: Ref::NONE,
                input_len: data.len(),
                ints: Vec::new(),
                floats: Vec::new(),
                text: String::new(),
                text_ends: Vec::new(),
                blob: Vec::new(),
                blob_ends: Vec::new(),
                containers: Vec::new(),
                items: Vec::new(),
            },
            stack: Vec::with_capacity(64),
            marks: Vec::with_capacity(16),
            max_marks: limits.max_depth,
            memo: Memo::default(),
            sequences: FxHashMap::default(),
            record_origins,
            origins: Vec::new(),
            op_pos: 0,
            op: 0,
        }
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
    fn take(&mut self, n: u64) -> Step<&'a [u8]> {
        let available = (self.data.len() - self.pos) as u64;
        if n > available {
            return Err(self.error(PickleErrorKind::Truncated {
                opcode: self.name(),
                needed: n,
                available,
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
        let d = &self.doc;
        d.items.len() * size_of::<Ref>()
            + d.containers.len() * size_of::<Container>()
            + (d.ints.len() + d.floats.len()) * 8
            + d.text.len()
            + d.blob.len()
            + (d.text_ends.len() + d.blob_ends.len()) * size_of::<usize>()
            + self.stack.len() * size_of::<Ref>()
            + self.marks.len() * size_of::<usize>()
            + self.memo.dense.len() * size_of::<Ref>()
            // A hash table entry with its key, value and control byte.
            + self.memo.sparse.len() * 24
            + self.sequences.len() * 24
            + self.origins.len() * size_of::<usize>()
    }

    /// Fails once the document takes more memory than the budget.
    fn check_budget(&self) -> Step<()> {
        if self.memory() > self.budget {
            return Err(self.error(PickleErrorKind::MemoryBudget {
                limit: self.budget,
                input_bytes: self.data.len(),
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
        self.table_room(
            self.doc.text_ends.len(),
            "strings (the most a document can address)",
        )?;
        self.doc.text.push_str(text);
        self.doc.text_ends.push(self.doc.text.len());
        let r = Ref::new(kind::STR, (self.doc.text_ends.len() - 1) as u32);
        self.stack.push(r);
        Ok(())
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

    /// Puts the values above stack position `from` into the container `target`: each is
    /// counted here, once, however it came onto the stack. A container that had to move to
    /// grow (it shared its elements with an equal one, or others were added after it) copies
    /// its elements, so the budget is checked at once.
    fn extend(&mut self, target: Ref, from: usize) -> Step<()> {
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
    /// except through [`ValueRef::identity`]; a shared list that grows later moves to
    /// elements of its own.
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
        let mut hasher = FxHasher::default();
        self.doc.items[range.clone()].hash(&mut hasher);
        let key = (r.kind(), hasher.finish());
        let (earlier_index, earlier) = match self.sequences.get(&key) {
            Some(&e) if e as usize != c => (e, self.doc.containers[e as usize]),
            _ => {
                self.sequences.insert(key, c as u32);
                return;
            }
        };
        if earlier.len != cont.len || self.doc.items[earlier.range()] != self.doc.items[range] {
            self.sequences.insert(key, c as u32);
            return;
        }
        self.doc.items.truncate(cont.start as usize);
        self.doc.containers[c] = Container {
            cap: earlier.len,
            shared: true,
            ..earlier
        };
        self.doc.containers[earlier_index as usize].shared = true;
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
        self.marks.pop().ok_or_else(|| {
            self.error(PickleErrorKind::MissingMark {
                opcode: self.name(),
            })
        })
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
    fn run(&mut self) -> Step<Ref> {
        loop {
            self.op_pos = self.pos;
            self.until_check -= 1;
            if self.until_check == 0 {
                self.until_check = BUDGET_CHECK_EVERY;
                self.check_budget()?;
            }
            let Some(&op) = self.data.get(self.pos) else {
                return Err(PickleError {
                    offset: self.data.len(),
                    kind: PickleErrorKind::MissingStop,
                });
            };
            self.op = op;
            self.pos += 1;
            if let Some(reason) = refusal(op) {
                return Err(self.error(PickleErrorKind::Refused {
                    opcode: self.name(),
                    reason,
                }));
            }
            match op {
                // Framing and protocol.
                0x80 => {
                    let version = self.take_u8()?;
                    if version > 5 {
                        return Err(self.error(PickleErrorKind::UnsupportedProtocol { version }));
                    }
                }
                0x95 => {
                    let len = self.take_u64()?;
                    let available = (self.data.len() - self.pos) as u64;
                    if len > available {
                        return Err(self.error(PickleErrorKind::Truncated {
                            opcode: "FRAME",
                            needed: len,
                            available,
                        }));
                    }
                }
                b'.' => {
                    self.check_budget()?;
                    return self.pop();
                }
                // Stack manipulation.
                b'(' => {
                    if self.marks.len() >= self.max_marks {
                        return Err(self.error(PickleErrorKind::LimitExceeded {
                            what: "MARKs open at once (levels of nesting)",
                            limit: self.max_marks,
                        }));
                    }
                    self.marks.push(self.stack.len());
                }
                b'0' => {
                    if self.stack.len() > self.floor() {
                        self.stack.pop();
                    } else {
                        self.pop_mark()?;
                    }
                }
                b'1' => self.pop_mark()?,
                b'2' => {
                    let top = self.top()?;
                    self.stack.push(top);
                }
                // Memo.
                b'p' => {
                    let text = self.take_line_str()?;
                    let index = self.text_u64(text)?;
                    self.memo_put(index)?;
                }
                b'q' => {
                    let index = self.take_u8()? as u64;
                    self.memo_put(index)?;
                }
                b'r' => {
                    let index = self.take_u32()? as u64;
                    self.memo_put(index)?;
                }
                0x94 => {
                    let index = self.memo.len();
                    self.memo_put(index)?;
                }
                b'g' => {
                    let text = self.take_line_str()?;
                    let index = self.text_u64(text)?;
                    self.push_memo(index)?;
                }
                b'h' => {
                    let index = self.take_u8()? as u64;
                    self.push_memo(index)?;
                }
                b'j' => {
                    let index = self.take_u32()? as u64;
                    self.push_memo(index)?;
                }
                // Scalars.
                b'N' => self.push_inline(Ref::NONE)?,
                0x88 => self.push_inline(Ref::TRUE)?,
                0x89 => self.push_inline(Ref::FALSE)?,
                b'J' => {
                    let v = self.take_i32()?;
                    self.push_int(PyInt::Fits(v as i64))?;
                }
                b'K' => {
                    let v = self.take_u8()?;
                    self.push_int(PyInt::Fits(v as i64))?;
                }
                b'M' => {
                    let v = u16::from_le_bytes(self.take_array()?);
                    self.push_int(PyInt::Fits(v as i64))?;
                }
                0x8a => {
                    let n = self.take_u8()? as u64;
                    let bytes = self.take(n)?;
                    self.push_int(int_from_le(bytes))?;
                }
                0x8b => {
                    let n = self.take_len_i32()?;
                    let bytes = self.take(n)?;
                    self.push_int(int_from_le(bytes))?;
                }
                b'I' => {
                    let text = self.take_line_str()?;
                    match text {
                        "00" => self.push_inline(Ref::FALSE)?,
                        "01" => self.push_inline(Ref::TRUE)?,
                        _ => {
                            let v = self.decimal(text)?;
                            self.push_int(v)?;
                        }
                    }
                }
                b'L' => {
                    let text = self.take_line_str()?;
                    let v = self.decimal(text.strip_suffix('L').unwrap_or(text))?;
                    self.push_int(v)?;
                }
                b'G' => {
                    let v = f64::from_be_bytes(self.take_array()?);
                    self.push_float(v)?;
                }
                b'F' => {
                    let text = self.take_line_str()?;
                    let v: f64 = text
                        .trim()
                        .parse()
                        .map_err(|_| self.bad(format!("{} is not a float", quoted(text))))?;
                    self.push_float(v)?;
                }
                // Strings and bytes.
                0x8c => {
                    let n = self.take_u8()? as u64;
                    let bytes = self.take(n)?;
                    self.push_text(bytes)?;
                }
                b'X' => {
                    let n = self.take_u32()? as u64;
                    let bytes = self.take(n)?;
                    self.push_text(bytes)?;
                }
                0x8d => {
                    let n = self.take_u64()?;
                    let bytes = self.take(n)?;
                    self.push_text(bytes)?;
                }
                b'V' => {
                    let line = self.take_line()?;
                    let text = raw_unicode_unescape(line)
                        .ok_or_else(|| self.bad("a bad \\u or \\U escape"))?;
                    self.push_str(&text)?;
                }
                b'U' => {
                    let n = self.take_u8()? as u64;
                    let bytes = self.take(n)?;
                    self.push_byte_string(bytes)?;
                }
                b'T' => {
                    let n = self.take_len_i32()?;
                    let bytes = self.take(n)?;
                    self.push_byte_string(bytes)?;
                }
                b'S' => {
                    let line = self.take_line()?;
                    let bytes = quoted_unescape(line)
                        .ok_or_else(|| self.bad("a malformed quoted string"))?;
                    self.push_byte_string(&bytes)?;
                }
                b'C' => {
                    let n = self.take_u8()? as u64;
                    let bytes = self.take(n)?;
                    self.push_bytes(bytes)?;
                }
                b'B' => {
                    let n = self.take_u32()? as u64;
                    let bytes = self.take(n)?;
                    self.push_bytes(bytes)?;
                }
                0x8e | 0x96 => {
                    let n = self.take_u64()?;
                    let bytes = self.take(n)?;
                    self.push_bytes(bytes)?;
                }
                // Containers.
                b']' | b'}' | b')' | 0x8f => {
                    let kind = match op {
                        b']' => kind::LIST,
                        b'}' => kind::DICT,
                        b')' => kind::TUPLE,
                        _ => kind::SET,
                    };
                    let r = self.new_container(kind)?;
                    self.stack.push(r);
                }
                b'l' | b't' | 0x91 | b'd' => {
                    let mark = self.take_mark()?;
                    let kind = match op {
                        b'l' => kind::LIST,
                        b't' => kind::TUPLE,
                        0x91 => kind::FROZEN_SET,
                        _ => {
                            self.check_pairs(mark)?;
                            kind::DICT
                        }
                    };
                    self.collect(kind, mark)?;
                }
                0x85..=0x87 => {
                    let n = (op - 0x84) as usize;
                    if self.stack.len() < self.floor() + n {
                        return Err(self.underflow());
                    }
                    self.collect(kind::TUPLE, self.stack.len() - n)?;
                }
                b'a' => {
                    let value = self.pop()?;
                    let target = self.top()?;
                    self.expect(target, kind::LIST, "list")?;
                    let from = self.stack.len();
                    self.stack.push(value);
                    self.append_from(target, from)?;
                }
                b'e' => {
                    let mark = self.take_mark()?;
                    let target = self.below(mark)?;
                    self.expect(target, kind::LIST, "list")?;
                    self.append_from(target, mark)?;
                }
                b's' => {
                    let value = self.pop()?;
                    let key = self.pop()?;
                    let target = self.top()?;
                    self.expect(target, kind::DICT, "dict")?;
                    let from = self.stack.len();
                    self.stack.push(key);
                    self.stack.push(value);
                    self.append_from(target, from)?;
                }
                b'u' => {
                    let mark = self.take_mark()?;
                    let target = self.below(mark)?;
                    self.check_pairs(mark)?;
                    self.expect(target, kind::DICT, "dict")?;
                    self.append_from(target, mark)?;
                }
                0x90 => {
                    let mark = self.take_mark()?;
                    let target = self.below(mark)?;
                    self.expect(target, kind::SET, "set")?;
                    self.append_from(target, mark)?;
                }
                _ => return Err(self.error(PickleErrorKind::UnknownOpcode { byte: op })),
            }
        }
    }
}

/// Decodes a little-endian two's-complement integer (the argument of `LONG1`/`LONG4`).
fn int_from_le(bytes: &[u8]) -> PyInt {
    let mut len = bytes.len();
    // Drop sign-extension bytes that do not change the value.
    while len > 1 {
        let last = bytes[len - 1];
        let negative_below = bytes[len - 2] & 0x80 != 0;
        if (last == 0x00 && !negative_below) || (last == 0xff && negative_below) {
            len -= 1;
        } else {
            break;
        }
    }
    let bytes = &bytes[..len];
    if bytes.is_empty() {
        return PyInt::Fits(0);
    }
    if bytes.len() <= 8 {
        let fill = if bytes[bytes.len() - 1] & 0x80 != 0 {
            0xff
        } else {
            0
        };
        let mut le = [fill; 8];
        le[..bytes.len()].copy_from_slice(bytes);
        PyInt::Fits(i64::from_le_bytes(le))
    } else {
        PyInt::Big(bytes.to_vec())
    }
}

/// Parses a decimal integer of any size (the argument of the text `INT` and `LONG` opcodes),
/// nineteen digits at a time into 64-bit limbs.
fn int_from_decimal(text: &str) -> Option<PyInt> {
    let text = text.trim();
    if let Ok(v) = text.parse::<i64>() {
        return Some(PyInt::Fits(v));
    }
    let (negative, digits) = match text.as_bytes().first()? {
        b'-' => (true, &text[1..]),
        b'+' => (false, &text[1..]),
        _ => (false, text),
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    // Magnitude in base 2^64, little-endian, from the most significant digits down.
    const CHUNK: usize = 19;
    let mut limbs: Vec<u64> = Vec::with_capacity(digits.len() / CHUNK + 1);
    let first = match digits.len() % CHUNK {
        0 => CHUNK,
        n => n,
    };
    let mut at = 0;
    let mut take = first;
    while at < digits.len() {
        let chunk = &digits.as_bytes()[at..at + take];
        let value = chunk
            .iter()
            .fold(0u64, |v, &d| v * 10 + u64::from(d - b'0'));
        let scale = 10u128.pow(take as u32);
        let mut carry = u128::from(value);
        for limb in limbs.iter_mut() {
            let v = u128::from(*limb) * scale + carry;
            *limb = v as u64;
            carry = v >> 64;
        }
        if carry > 0 {
            limbs.push(carry as u64);
        }
        at += take;
        take = CHUNK;
    }
    let mut magnitude: Vec<u8> = limbs.iter().flat_map(|l| l.to_le_bytes()).collect();
    while magnitude.len() > 1 && magnitude[magnitude.len() - 1] == 0 {
        magnitude.pop();
    }
    // A zero byte on top makes the two's-complement form non-negative.
    magnitude.push(0);
    if negative {
        let mut carry = 1u16;
        for byte in magnitude.iter_mut() {
            let v = (!*byte) as u16 + carry;
            *byte = v as u8;
            carry = v >> 8;
        }
    }
    Some(int_from_le(&magnitude))
}

/// `text` in backquotes for an error message, cut after 40 characters so that a huge argument
/// does not make a huge message.
fn quoted(text: &str) -> String {
    const SHOWN: usize = 40;
    match text.char_indices().nth(SHOWN) {
        None => format!("`{text}`"),
        Some((cut, _)) => format!("`{}…` ({} bytes)", &text[..cut], text.len()),
    }
}

/// Decodes Python's `raw-unicode-escape` (the argument of `UNICODE`): Latin-1 text with
/// `\uXXXX` and `\UXXXXXXXX` escapes.
fn raw_unicode_unescape(bytes: &[u8]) -> Option<String> {
    let mut out = String::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        if b == b'\\' && i + 1 < bytes.len() && (bytes[i + 1] == b'u' || bytes[i + 1] == b'U') {
            let width = if bytes[i + 1] == b'u' { 4 } else { 8 };
            let hex = bytes.get(i + 2..i + 2 + width)?;
            let code = u32::from_str_radix(std::str::from_utf8(hex).ok()?, 16).ok()?;
            out.push(char::from_u32(code).unwrap_or(char::REPLACEMENT_CHARACTER));
            i += 2 + width;
        } else {
            out.push(b as char);
            i += 1;
        }
    }
    Some(out)
}

/// Decodes the quoted, backslash-escaped argument of the text `STRING` opcode.
fn quoted_unescape(line: &[u8]) -> Option<Vec<u8>> {
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    if line.len() < 2 {
        return None;
    }
    let quote = line[0];
    if (quote != b'\'' && quote != b'"') || line[line.len() - 1] != quote {
        return None;
    }
    let body = &line[1..line.len() - 1];
    let mut out = Vec::with_capacity(body.len());
    let mut i = 0;
    while i < body.len() {
        let b = body[i];
        i += 1;
        if b != b'\\' {
            out.push(b);
            continue;
        }
        let e = *body.get(i)?;
        i += 1;
        match e {
            b'\\' | b'\'' | b'"' => out.push(e),
            b'n' => out.push(b'\n'),
            b'r' => out.push(b'\r'),
            b't' => out.push(b'\t'),
            b'a' => out.push(0x07),
            b'b' => out.push(0x08),
            b'f' => out.push(0x0c),
            b'v' => out.push(0x0b),
            b'x' => {
                let hex = body.get(i..i + 2)?;
                out.push(u8::from_str_radix(std::str::from_utf8(hex).ok()?, 16).ok()?);
                i += 2;
            }
            b'0'..=b'7' => {
                let mut v = (e - b'0') as u32;
                let mut n = 1;
                while n < 3 && i < body.len() && (b'0'..=b'7').contains(&body[i]) {
                    v = v * 8 + (body[i] - b'0') as u32;
                    i += 1;
                    n += 1;
                }
                out.push(v as u8);
            }
            _ => {
                out.push(b'\\');
                out.push(e);
            }
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(bytes: &[u8]) -> Value {
        match parse(bytes) {
            Ok(v) => v,
            Err(e) => panic!("{e}"),
        }
    }

    fn err(bytes: &[u8]) -> PickleError {
        match parse(bytes) {
            Ok(v) => panic!("expected an error, got {v:?}"),
            Err(e) => e,
        }
    }

    fn s(text: &str) -> Value {
        Value::Str(Rc::from(text))
    }

    fn list(items: Vec<Value>) -> Value {
        Value::List(items.into())
    }

    fn tuple(items: Vec<Value>) -> Value {
        Value::Tuple(items.into())
    }

    #[test]
    fn scalars() {
        assert_eq!(p(b"\x80\x02N."), Value::None);
        assert_eq!(p(b"\x80\x02\x88."), Value::Bool(true));
        assert_eq!(p(b"\x80\x02\x89."), Value::Bool(false));
        assert_eq!(p(b"K\xff."), Value::Int(255));
        assert_eq!(p(b"M\x01\x02."), Value::Int(0x0201));
        assert_eq!(p(b"J\xff\xff\xff\xff."), Value::Int(-1));
        assert_eq!(p(b"G?\xf8\x00\x00\x00\x00\x00\x00."), Value::Float(1.5));
        assert_eq!(p(b"I42\n."), Value::Int(42));
        assert_eq!(p(b"I-7\n."), Value::Int(-7));
        assert_eq!(p(b"I01\n."), Value::Bool(true));
        assert_eq!(p(b"I00\n."), Value::Bool(false));
        assert_eq!(p(b"L123L\n."), Value::Int(123));
        assert_eq!(p(b"F2.25\n."), Value::Float(2.25));
    }

    #[test]
    fn long_integers() {
        assert_eq!(p(b"\x8a\x00."), Value::Int(0));
        assert_eq!(p(b"\x8a\x01\xff."), Value::Int(-1));
        assert_eq!(p(b"\x8a\x02\xff\x00."), Value::Int(255));
        assert_eq!(p(b"\x8a\x05\x00\x00\x00\x00\x01."), Value::Int(1 << 32));
        assert_eq!(
            p(b"\x8b\x08\x00\x00\x00\xff\xff\xff\xff\xff\xff\xff\x7f."),
            Value::Int(i64::MAX)
        );
        // 2**64 - 1 needs nine bytes and is kept as a big integer that still fits a u64.
        let big = p(b"\x8a\x09\xff\xff\xff\xff\xff\xff\xff\xff\x00.");
        assert!(matches!(big, Value::BigInt(_)));
        assert_eq!(big.as_u64(), Some(u64::MAX));
        assert_eq!(big.as_i64(), None);
        // 2**80 is too large for a u64.
        let huge = p(b"\x8a\x0b\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x01.");
        assert_eq!(huge.as_u64(), None);
        assert_eq!(huge.type_name(), "int");
        // Redundant sign bytes are dropped.
        assert_eq!(
            p(b"\x8a\x0a\x05\x00\x00\x00\x00\x00\x00\x00\x00\x00."),
            Value::Int(5)
        );
        assert_eq!(
            p(b"L18446744073709551616L\n."),
            Value::BigInt(Rc::from(&[0u8, 0, 0, 0, 0, 0, 0, 0, 1][..]))
        );
        assert_eq!(
            p(b"L-9223372036854775809L\n."),
            Value::BigInt(Rc::from(
                &[0xffu8, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f, 0xff][..]
            ))
        );
    }

    #[test]
    fn strings_and_bytes() {
        assert_eq!(p(b"\x8c\x02hi."), s("hi"));
        assert_eq!(p(b"X\x03\x00\x00\x00abc."), s("abc"));
        assert_eq!(p(b"\x8d\x01\x00\x00\x00\x00\x00\x00\x00z."), s("z"));
        assert_eq!(p(b"Vcaf\\u00e9\n."), s("caf\u{e9}"));
        assert_eq!(p(b"U\x02ok."), s("ok"));
        assert_eq!(p(b"T\x01\x00\x00\x00k."), s("k"));
        assert_eq!(p(b"S'a\\nb'\n."), s("a\nb"));
        assert_eq!(p(b"U\x01\xff."), Value::Bytes(Rc::from(&b"\xff"[..])));
        assert_eq!(
            p(b"C\x02\x00\x01."),
            Value::Bytes(Rc::from(&b"\x00\x01"[..]))
        );
        assert_eq!(p(b"B\x01\x00\x00\x00q."), Value::Bytes(Rc::from(&b"q"[..])));
        assert_eq!(
            p(b"\x8e\x01\x00\x00\x00\x00\x00\x00\x00q."),
            Value::Bytes(Rc::from(&b"q"[..]))
        );
        assert_eq!(
            p(b"\x96\x01\x00\x00\x00\x00\x00\x00\x00r."),
            Value::Bytes(Rc::from(&b"r"[..]))
        );
        // Invalid UTF-8 in a text opcode is replaced, not an error.
        assert_eq!(p(b"\x8c\x01\xff."), s("\u{fffd}"));
    }

    #[test]
    fn containers() {
        assert_eq!(p(b"]."), list(vec![]));
        assert_eq!(p(b")."), tuple(vec![]));
        assert_eq!(p(b"}."), Value::Dict(Vec::new().into()));
        assert_eq!(
            p(b"(K\x01K\x02l."),
            list(vec![Value::Int(1), Value::Int(2)])
        );
        assert_eq!(p(b"(K\x01t."), tuple(vec![Value::Int(1)]));
        assert_eq!(p(b"K\x01\x85."), tuple(vec![Value::Int(1)]));
        assert_eq!(
            p(b"K\x01K\x02\x86."),
            tuple(vec![Value::Int(1), Value::Int(2)])
        );
        assert_eq!(
            p(b"K\x01K\x02K\x03\x87."),
            tuple(vec![Value::Int(1), Value::Int(2), Value::Int(3)])
        );
        assert_eq!(p(b"]K\x07a."), list(vec![Value::Int(7)]));
        assert_eq!(
            p(b"](K\x01K\x02e."),
            list(vec![Value::Int(1), Value::Int(2)])
        );
        let d = p(b"}\x8c\x01aK\x01s.");
        assert_eq!(d.get("a"), Some(&Value::Int(1)));
        let d = p(b"}(\x8c\x01aK\x01\x8c\x01bK\x02u.");
        assert_eq!(d.get("b"), Some(&Value::Int(2)));
        let d = p(b"(\x8c\x01aK\x01d.");
        assert_eq!(d.get("a"), Some(&Value::Int(1)));
        assert_eq!(
            p(b"\x8f(K\x01K\x02K\x01\x90."),
            Value::Set(vec![Value::Int(1), Value::Int(2)].into())
        );
        assert_eq!(
            p(b"(K\x03K\x03\x91."),
            Value::FrozenSet(vec![Value::Int(3)].into())
        );
    }

    #[test]
    fn dict_keeps_last_value_of_repeated_key() {
        let d = p(b"}(\x8c\x01aK\x01\x8c\x01bK\x02\x8c\x01aK\x03u.");
        let pairs = d.as_dict().unwrap();
        assert_eq!(pairs.len(), 2);
        assert_eq!(pairs[0], (s("a"), Value::Int(3)));
        assert_eq!(pairs[1], (s("b"), Value::Int(2)));
        // The same with more than sixteen keys takes the hashed path.
        let mut bytes = b"}(".to_vec();
        for i in 0..20u8 {
            bytes.extend_from_slice(&[b'K', i, b'K', i]);
        }
        bytes.extend_from_slice(b"K\x05K\x63u.");
        let d = p(&bytes);
        let pairs = d.as_dict().unwrap();
        assert_eq!(pairs.len(), 20);
        assert_eq!(pairs[5], (Value::Int(5), Value::Int(99)));
    }

    #[test]
    fn stack_opcodes() {
        assert_eq!(p(b"K\x01K\x020."), Value::Int(1));
        assert_eq!(p(b"K\x01(K\x02K\x031."), Value::Int(1));
        assert_eq!(p(b"K\x012\x86."), tuple(vec![Value::Int(1), Value::Int(1)]));
        // POP with nothing above the mark pops the mark.
        assert_eq!(p(b"K\x01(0."), Value::Int(1));
    }

    #[test]
    fn memo_shares_objects() {
        // [x, x] where x = ["s"], memoized with each kind of PUT and fetched with each GET.
        for (put, get) in [
            (&b"q\x00"[..], &b"h\x00"[..]),
            (&b"r\x00\x00\x00\x00"[..], &b"j\x00\x00\x00\x00"[..]),
            (&b"p0\n"[..], &b"g0\n"[..]),
            (&b"\x94"[..], &b"h\x00"[..]),
        ] {
            let mut bytes = b"\x80\x04](](\x8c\x01se".to_vec();
            bytes.extend_from_slice(put);
            bytes.extend_from_slice(get);
            bytes.extend_from_slice(b"e.");
            let v = p(&bytes);
            let items = v.as_seq().unwrap();
            assert_eq!(items.len(), 2);
            assert_eq!(items[0], list(vec![s("s")]));
            assert_eq!(items[0].identity(), items[1].identity());
            assert!(items[0].identity().is_some());
        }
    }

    #[test]
    fn memoized_list_is_mutated_after_put() {
        // x = []; memo x; then append to it: later GETs see the appended element.
        let v = p(b"\x80\x04]\x94(K\x01eh\x00\x86.");
        assert_eq!(
            v,
            tuple(vec![list(vec![Value::Int(1)]), list(vec![Value::Int(1)])])
        );
    }

    #[test]
    fn sparse_memo_indices() {
        let v = p(b"K\x01r\xff\xff\xff\xff0j\xff\xff\xff\xff.");
        assert_eq!(v, Value::Int(1));
        let e = err(b"K\x01j\x05\x00\x00\x00.");
        assert_eq!(e.kind, PickleErrorKind::MissingMemo { index: 5 });
        assert_eq!(e.offset, 2);
    }

    #[test]
    fn frame_and_proto() {
        assert_eq!(
            p(b"\x80\x04\x95\x02\x00\x00\x00\x00\x00\x00\x00N."),
            Value::None
        );
        let e = err(b"\x80\x04\x95\xff\x00\x00\x00\x00\x00\x00\x00N.");
        assert!(matches!(
            e.kind,
            PickleErrorKind::Truncated {
                opcode: "FRAME",
                ..
            }
        ));
        assert_eq!(e.offset, 2);
        let e = err(b"\x80\x06N.");
        assert_eq!(e.kind, PickleErrorKind::UnsupportedProtocol { version: 6 });
    }

    #[test]
    fn refuses_code_execution_opcodes() {
        let e = err(b"\x80\x02cos\nsystem\n.");
        assert_eq!(e.offset, 2);
        assert!(matches!(
            e.kind,
            PickleErrorKind::Refused {
                opcode: "GLOBAL",
                ..
            }
        ));
        assert!(e.to_string().contains("GLOBAL"), "{e}");
        assert!(e.to_string().contains("offset 2"), "{e}");
        for (byte, name) in [
            (b'c', "GLOBAL"),
            (0x93, "STACK_GLOBAL"),
            (b'R', "REDUCE"),
            (b'b', "BUILD"),
            (b'i', "INST"),
            (b'o', "OBJ"),
            (0x81, "NEWOBJ"),
            (0x92, "NEWOBJ_EX"),
            (0x82, "EXT1"),
            (0x83, "EXT2"),
            (0x84, "EXT4"),
            (b'P', "PERSID"),
            (b'Q', "BINPERSID"),
            (0x97, "NEXT_BUFFER"),
            (0x98, "READONLY_BUFFER"),
        ] {
            let e = err(&[0x80, 4, b'N', byte, b'.']);
            assert_eq!(e.offset, 3, "{name}");
            match e.kind {
                PickleErrorKind::Refused { opcode, .. } => assert_eq!(opcode, name),
                other => panic!("{name}: {other:?}"),
            }
        }
    }

    #[test]
    fn structural_errors() {
        assert_eq!(err(b"").kind, PickleErrorKind::Empty);
        assert_eq!(err(b"N").kind, PickleErrorKind::MissingStop);
        assert_eq!(err(b"N").offset, 1);
        assert!(matches!(
            err(b".").kind,
            PickleErrorKind::StackUnderflow { opcode: "STOP" }
        ));
        assert!(matches!(
            err(b"Ne.").kind,
            PickleErrorKind::MissingMark { opcode: "APPENDS" }
        ));
        assert!(matches!(
            err(b"}K\x01a.").kind,
            PickleErrorKind::WrongType {
                opcode: "APPEND",
                expected: "list",
                found: "dict"
            }
        ));
        assert!(matches!(
            err(b"(K\x01d.").kind,
            PickleErrorKind::BadArgument { opcode: "DICT", .. }
        ));
        assert!(matches!(
            err(b"\xff.").kind,
            PickleErrorKind::UnknownOpcode { byte: 0xff }
        ));
        assert!(matches!(
            err(b"T\xff\xff\xff\xff.").kind,
            PickleErrorKind::BadArgument {
                opcode: "BINSTRING",
                ..
            }
        ));
        assert!(matches!(
            err(b"X\xff\xff\xff\x7f.").kind,
            PickleErrorKind::Truncated {
                opcode: "BINUNICODE",
                needed: 0x7fff_ffff,
                available: 1
            }
        ));
        assert!(matches!(
            err(b"(\x86.").kind,
            PickleErrorKind::StackUnderflow { opcode: "TUPLE2" }
        ));
        assert!(matches!(
            err(b"]\x94(h\x00a.").kind,
            PickleErrorKind::StackUnderflow { .. }
        ));
    }

    #[test]
    fn cycles_are_errors() {
        // l = []; l.append(l)
        let e = err(b"\x80\x04]\x94h\x00a.");
        assert_eq!(e.kind, PickleErrorKind::Cycle);
        assert_eq!(e.offset, 2);
    }

    #[test]
    fn limits_are_enforced() {
        // 300 nested lists: ]]]...]aaa...a.
        let mut deep = vec![b']'; 300];
        deep.extend_from_slice(&[b'a'; 299]);
        deep.push(b'.');
        let e = err(&deep);
        assert!(matches!(
            e.kind,
            PickleErrorKind::LimitExceeded {
                what: "levels of nesting",
                ..
            }
        ));
        // A memory budget of 60 bytes for any input: the fifth element of the list passes it
        // (a list is 16 bytes, its entry in the table of equal lists 24, each element 4, and
        // the list's place on the stack 4 more).
        let limits = Limits {
            memory_per_input_byte: 0,
            min_memory_bytes: 60,
            ..Limits::default()
        };
        assert!(parse_with_limits(b"](NNNNe.", &limits).is_ok());
        let e = parse_with_limits(b"](NNNNNe.", &limits).unwrap_err();
        assert_eq!(
            e.kind,
            PickleErrorKind::MemoryBudget {
                limit: 60,
                input_bytes: 9,
                per_input_byte: 0
            }
        );
        assert_eq!(e.offset, 8, "at STOP");
        let limits = Limits {
            max_input_bytes: 1,
            ..Limits::default()
        };
        let e = parse_with_limits(b"N.", &limits).unwrap_err();
        assert_eq!(e.kind, PickleErrorKind::InputTooLarge { size: 2, limit: 1 });
        let text = e.to_string();
        assert!(
            text.contains("--max-input") && text.contains("VRAMSCOPE_MAX_INPUT"),
            "{text}"
        );
    }

    /// A small pickle in the shape of a PyTorch snapshot, written by Python 3 with protocol 4.
    const SNAPSHOT_LIKE: &[u8] = b"\x80\x04\x95p\x00\x00\x00\x00\x00\x00\x00}\x94(\x8c\x08segments\x94]\x94}\x94(\x8c\x07address\x94\x8a\x05\x00\x00\x00\x00\x01\x8c\x06frames\x94]\x94}\x94(\x8c\x08filename\x94\x8c\x04a.py\x94\x8c\x04line\x94K\x03uaua\x8c\x05trace\x94]\x94(h\x06h\x06e\x8c\x04pool\x94K\x00K\x01\x86\x94u.";

    #[test]
    fn snapshot_like_pickle() {
        let v = p(SNAPSHOT_LIKE);
        let seg = &v.get("segments").unwrap().as_seq().unwrap()[0];
        assert_eq!(seg.get("address").unwrap().as_u64(), Some(1 << 32));
        let frames = seg.get("frames").unwrap();
        let trace = v.get("trace").unwrap().as_seq().unwrap();
        assert_eq!(trace.len(), 2);
        assert_eq!(trace[0].identity(), frames.identity());
        assert_eq!(
            frames.as_seq().unwrap()[0]
                .get("filename")
                .unwrap()
                .as_str(),
            Some("a.py")
        );
        assert_eq!(
            v.get("pool"),
            Some(&tuple(vec![Value::Int(0), Value::Int(1)]))
        );
    }

    #[test]
    fn every_truncation_is_an_error() {
        for end in 0..SNAPSHOT_LIKE.len() {
            let e = parse(&SNAPSHOT_LIKE[..end]).unwrap_err();
            assert!(e.offset <= end, "prefix {end}: {e}");
        }
    }

    fn doc(bytes: &[u8]) -> Document {
        match Document::parse(bytes) {
            Ok(d) => d,
            Err(e) => panic!("{e}"),
        }
    }

    #[test]
    fn value_refs_read_like_values() {
        // (None, True, 7, -2**27, 2**27, -2**40, 2**64 - 1, 2**80, 1.5, "é", b"\x00", [1, (2,)],
        //  {"k": None})
        let mut bytes = b"\x80\x04(N\x88K\x07J\x00\x00\x00\xf8J\x00\x00\x00\x08".to_vec();
        bytes.extend_from_slice(b"\x8a\x06\x00\x00\x00\x00\x00\xff");
        bytes.extend_from_slice(b"\x8a\x09\xff\xff\xff\xff\xff\xff\xff\xff\x00");
        bytes.extend_from_slice(b"\x8a\x0b\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x01");
        bytes.extend_from_slice(b"G?\xf8\x00\x00\x00\x00\x00\x00\x8c\x02\xc3\xa9C\x01\x00");
        bytes.extend_from_slice(b"(K\x01K\x02\x85l}\x8c\x01kNst.");
        let d = doc(&bytes);
        let root = d.root();
        assert_eq!(root.type_name(), "tuple");
        let items = root.as_seq().unwrap();
        assert_eq!(items.len(), 13);
        let at = |i: usize| items.get(i).unwrap();
        assert!(at(0).is_none());
        assert_eq!(at(1).as_bool(), Some(true));
        assert_eq!(at(2).as_i64(), Some(7));
        assert_eq!(at(3).as_i64(), Some(-(1 << 27)));
        assert_eq!(at(4).as_u64(), Some(1 << 27));
        assert_eq!(at(5).as_i64(), Some(-(1 << 40)));
        assert_eq!(at(5).as_u64(), None);
        assert_eq!(at(6).as_u64(), Some(u64::MAX));
        assert_eq!(at(6).as_i64(), None);
        assert_eq!((at(7).type_name(), at(7).as_u64()), ("int", None));
        assert_eq!(at(8).as_float(), Some(1.5));
        assert_eq!(at(2).as_float(), None);
        assert_eq!(at(2).as_f64(), Some(7.0));
        assert_eq!(at(9).as_str(), Some("\u{e9}"));
        assert_eq!(at(10).as_bytes(), Some(&b"\x00"[..]));
        let list = at(11).as_seq().unwrap();
        assert_eq!(list.last().unwrap().type_name(), "tuple");
        assert_eq!(
            list.iter().map(|v| v.type_name()).collect::<Vec<_>>(),
            ["int", "tuple"]
        );
        assert!(at(12).is_dict());
        assert!(at(12).get("k").unwrap().is_none());
        assert!(at(12).get("x").is_none());
        assert!(items.get(13).is_none());
        // The document and the value tree agree.
        assert_eq!(root.to_value(), p(&bytes));
    }

    #[test]
    fn repeated_dict_keys_keep_the_last_value() {
        let d = doc(b"}(\x8c\x01aK\x01\x8c\x01bK\x02\x8c\x01aK\x03u.");
        let root = d.root();
        assert_eq!(root.get("a").unwrap().as_i64(), Some(3));
        let keys: Vec<&str> = root
            .dict_items()
            .unwrap()
            .map(|(k, _)| k.as_str().unwrap())
            .collect();
        assert_eq!(keys, ["a", "b", "a"]);
    }

    #[test]
    fn equal_lists_share_their_elements() {
        // ([1, 2], [1, 2], [1, 3]), three separate lists.
        let d = doc(b"\x80\x04](K\x01K\x02e](K\x01K\x02e](K\x01K\x03e\x87.");
        let items = d.root().as_seq().unwrap();
        let id = |i: usize| items.get(i).unwrap().identity();
        assert!(id(0).is_some());
        assert_eq!(id(0), id(1));
        assert_ne!(id(0), id(2));
        let v = p(b"\x80\x04](K\x01K\x02e](K\x01K\x02e](K\x01K\x03e\x87.");
        let items = v.as_seq().unwrap();
        assert_eq!(items[0].identity(), items[1].identity());
        assert_ne!(items[0].identity(), items[2].identity());
    }

    #[test]
    fn shared_list_that_grows_moves_to_its_own_elements() {
        // a = [1, 2]; b = [1, 2]; a.append(3); (a, b)
        let bytes = b"\x80\x04]\x94(K\x01K\x02e]\x94(K\x01K\x02e0K\x03ah\x01\x86.";
        let d = doc(bytes);
        let items = d.root().as_seq().unwrap();
        let (a, b) = (items.get(0).unwrap(), items.get(1).unwrap());
        assert_ne!(a.identity(), b.identity());
        let ints = |v: ValueRef<'_>| -> Vec<i64> {
            v.as_seq()
                .unwrap()
                .iter()
                .map(|x| x.as_i64().unwrap())
                .collect()
        };
        assert_eq!(ints(a), [1, 2, 3]);
        assert_eq!(ints(b), [1, 2]);
        assert_eq!(
            p(bytes),
            tuple(vec![
                list(vec![Value::Int(1), Value::Int(2), Value::Int(3)]),
                list(vec![Value::Int(1), Value::Int(2)]),
            ])
        );
    }

    #[test]
    fn containers_filled_in_interleaved_batches() {
        // outer = []; three batches of APPENDS, each of 700 dicts {"k": i, "l": [i, i + 2**40]}
        // built in between, as Python's pickler writes lists of more than 1000 elements.
        let mut bytes = b"\x80\x04]\x94\x8c\x01k\x940\x8c\x01l\x940".to_vec();
        let mut expected = Vec::new();
        for batch in 0..3 {
            bytes.push(b'(');
            for j in 0..700u32 {
                let i = batch * 700 + j;
                bytes.extend_from_slice(b"}(h\x01J");
                bytes.extend_from_slice(&i.to_le_bytes());
                bytes.extend_from_slice(b"h\x02](J");
                bytes.extend_from_slice(&i.to_le_bytes());
                bytes.extend_from_slice(b"\x8a\x06");
                bytes.extend_from_slice(&(i as u64 + (1 << 40)).to_le_bytes()[..6]);
                bytes.extend_from_slice(b"eu");
                expected.push((i as i64, i as i64 + (1 << 40)));
            }
            bytes.push(b'e');
        }
        bytes.push(b'.');
        let d = doc(&bytes);
        let outer = d.root().as_seq().unwrap();
        assert_eq!(outer.len(), 2100);
        for (entry, &(k, big)) in outer.iter().zip(&expected) {
            assert_eq!(entry.get("k").unwrap().as_i64(), Some(k));
            let l = entry.get("l").unwrap().as_seq().unwrap();
            assert_eq!(l.get(0).unwrap().as_i64(), Some(k));
            assert_eq!(l.get(1).unwrap().as_i64(), Some(big));
        }
        assert_eq!(d.root().to_value(), p(&bytes));
    }

    #[test]
    fn nesting_limit_names_the_container_too_deep() {
        // 300 nested lists: the 201st (depth 201) is created by the opcode at offset 200.
        let mut deep = vec![b']'; 300];
        deep.extend_from_slice(&[b'a'; 299]);
        deep.push(b'.');
        let e = Document::parse(&deep).unwrap_err();
        assert_eq!(e.offset, 200);
        assert!(
            e.to_string().contains("more than 200 levels of nesting"),
            "{e}"
        );
    }

    #[test]
    fn open_marks_are_bounded_by_the_nesting_limit() {
        // 200 open MARKs are as deep as data may nest; the 201st is refused where it stands.
        let mut bytes = vec![b'('; 200];
        bytes.extend_from_slice(b"N");
        bytes.extend_from_slice(&[b't'; 200]);
        bytes.push(b'.');
        assert!(parse(&bytes).is_ok());
        let mut bytes = vec![b'('; 10_000];
        bytes.push(b'.');
        let e = err(&bytes);
        assert_eq!(e.offset, 200);
        assert_eq!(
            e.kind,
            PickleErrorKind::LimitExceeded {
                what: "MARKs open at once (levels of nesting)",
                limit: 200
            }
        );
    }

    /// `value` in the minimal little-endian two's-complement bytes `LONG1` uses, computed
    /// digit by digit in base 256 as a reference.
    fn reference_le(digits: &str, negative: bool) -> Vec<u8> {
        let mut magnitude = vec![0u8];
        for d in digits.bytes() {
            let mut carry = (d - b'0') as u32;
            for byte in magnitude.iter_mut() {
                let v = *byte as u32 * 10 + carry;
                *byte = v as u8;
                carry = v >> 8;
            }
            if carry > 0 {
                magnitude.push(carry as u8);
            }
        }
        magnitude.push(0);
        if negative {
            let mut carry = 1u16;
            for byte in magnitude.iter_mut() {
                let v = (!*byte) as u16 + carry;
                *byte = v as u8;
                carry = v >> 8;
            }
        }
        match int_from_le(&magnitude) {
            PyInt::Big(bytes) => bytes,
            PyInt::Fits(v) => panic!("{v} fits"),
        }
    }

    #[test]
    fn long_decimal_integers_parse_exactly_up_to_pythons_limit() {
        let mut digits = String::from("9");
        let mut state = 12345u64;
        while digits.len() < MAX_DECIMAL_DIGITS {
            state = state.wrapping_mul(6364136223846793005).wrapping_add(1);
            digits.push(char::from(b'0' + (state >> 60) as u8 % 10));
            if [20, 38, 39, 40, 57, 100, 1000, MAX_DECIMAL_DIGITS].contains(&digits.len()) {
                for negative in [false, true] {
                    let sign = if negative { "-" } else { "" };
                    let v = p(format!("L{sign}{digits}L\n.").as_bytes());
                    let expected = reference_le(&digits, negative);
                    assert_eq!(v, Value::BigInt(Rc::from(expected)), "{sign}{digits}");
                }
            }
        }
        // One digit more is refused by name, as Python refuses it, without echoing them all.
        let e = err(format!("I{digits}1\n.").as_bytes());
        assert_eq!(e.offset, 0);
        let text = e.to_string();
        assert!(text.contains("4301 decimal digits"), "{text}");
        assert!(text.contains("more than 4300"), "{text}");
        assert!(text.len() < 200, "{text}");
        // Leading zeros count as digits, as in Python.
        let zeros = format!("I{}\n.", "0".repeat(5000));
        assert!(err(zeros.as_bytes())
            .to_string()
            .contains("5000 decimal digits"));
        // A bad argument is quoted in part.
        let e = err(format!("I{}x\n.", "1".repeat(100)).as_bytes());
        assert!(e.to_string().contains("(101 bytes)"), "{e}");
    }

    #[test]
    fn repeated_keys_are_found_by_value_whatever_their_type() {
        // {0.0: 1, -0.0: 2, nan: 3, nan: 4, (1, 'a'): 5, (1, 'a'): 6, 1: 7, 1.0: 8}, the two
        // NaNs separate objects: 0.0 and -0.0 are one key, the NaNs two, the tuples one, and
        // 1 and 1.0 two (keys compare structurally).
        let nan = b"G\x7f\xf8\x00\x00\x00\x00\x00\x00";
        let mut bytes =
            b"}(G\x00\x00\x00\x00\x00\x00\x00\x00K\x01G\x80\x00\x00\x00\x00\x00\x00\x00K\x02"
                .to_vec();
        bytes.extend_from_slice(nan);
        bytes.extend_from_slice(b"K\x03");
        bytes.extend_from_slice(nan);
        bytes.extend_from_slice(b"K\x04K\x01\x8c\x01a\x86K\x05K\x01\x8c\x01a\x86K\x06");
        bytes.extend_from_slice(b"K\x01K\x07G?\xf0\x00\x00\x00\x00\x00\x00K\x08u.");
        let d = p(&bytes);
        let pairs = d.as_dict().unwrap();
        let values: Vec<i64> = pairs.iter().map(|(_, v)| v.as_i64().unwrap()).collect();
        assert_eq!(values, [2, 3, 4, 6, 7, 8]);
        assert_eq!(pairs[0].0, Value::Float(0.0));
        // One NaN object used twice as a key is one key, as in Python.
        let mut bytes = b"}(".to_vec();
        bytes.extend_from_slice(nan);
        bytes.extend_from_slice(b"\x94K\x01h\x00K\x02u.");
        let d = p(&bytes);
        assert_eq!(d.as_dict().unwrap().len(), 1);
        assert_eq!(d.as_dict().unwrap()[0].1, Value::Int(2));
        // Sets keep the first of equal elements, by the same rule.
        let d = p(b"\x8f(K\x01\x8c\x01a\x8c\x01aK\x01\x90.");
        assert_eq!(d, Value::Set(vec![Value::Int(1), s("a")].into()));
    }

    #[test]
    fn keys_that_share_containers_compare_in_linear_time() {
        // t0 = (0.5, 0.5); t(k+1) = (tk, tk), 64 levels: as a tree, 2^64 leaves. Two such
        // chains built separately are equal keys of one dict; comparing them as trees would
        // never end.
        let chain = |bytes: &mut Vec<u8>| {
            bytes.extend_from_slice(
                b"G?\xe0\x00\x00\x00\x00\x00\x00G?\xe0\x00\x00\x00\x00\x00\x00\x86",
            );
            for _ in 0..64 {
                bytes.extend_from_slice(b"2\x86");
            }
        };
        let mut bytes = b"}(".to_vec();
        chain(&mut bytes);
        bytes.extend_from_slice(b"K\x01");
        chain(&mut bytes);
        bytes.extend_from_slice(b"K\x02u.");
        let d = doc(&bytes);
        let v = d.root().to_value();
        let pairs = v.as_dict().unwrap();
        assert_eq!(pairs.len(), 1);
        assert_eq!(pairs[0].1, Value::Int(2));
    }

    #[test]
    fn a_list_referenced_many_times_is_built_once() {
        // [l] * 20000 with l a memoized list of 20000 elements: 4e8 element visits if each
        // reference were hashed again.
        let n = 20_000u32;
        let mut bytes = b"\x80\x04](".to_vec();
        bytes.extend(std::iter::repeat_n(b'N', n as usize));
        bytes.extend_from_slice(b"e\x94](");
        for _ in 0..n {
            bytes.extend_from_slice(b"h\x00");
        }
        bytes.extend_from_slice(b"e.");
        let v = p(&bytes);
        let outer = v.as_seq().unwrap();
        assert_eq!(outer.len(), n as usize);
        assert!(outer.iter().all(|l| l.identity() == outer[0].identity()));
        assert_eq!(outer[n as usize - 1].as_seq().unwrap().len(), n as usize);
    }

    mod fuzz {
        use super::super::*;
        use super::SNAPSHOT_LIKE;
        use proptest::prelude::*;

        proptest! {
            #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

            #[test]
            fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
                let _ = parse(&bytes);
            }

            #[test]
            fn mutated_pickles_never_panic(
                edits in proptest::collection::vec((any::<usize>(), any::<u8>()), 1..6),
                cut in any::<usize>(),
            ) {
                let mut bytes = SNAPSHOT_LIKE.to_vec();
                for (at, byte) in edits {
                    let i = at % bytes.len();
                    bytes[i] = byte;
                }
                let cut = cut % (bytes.len() + 1);
                let _ = parse(&bytes[..cut]);
                let _ = parse(&bytes);
            }

            #[test]
            fn opcode_soup_never_panics(
                ops in proptest::collection::vec(
                    prop::sample::select(b"(.012NKMJ\x88\x89]})lt\x85\x86\x87aesudq\x94h\x8f\x90\x91G\x8a".to_vec()),
                    0..64,
                ),
            ) {
                // Give every opcode that takes an argument a zero byte, so that more of the
                // soup is well formed and deeper paths of the machine are reached.
                let mut bytes = vec![0x80, 4];
                for op in ops {
                    bytes.push(op);
                    match op {
                        b'K' | b'q' | b'h' | 0x8a => bytes.push(0),
                        b'M' => bytes.extend_from_slice(&[0, 0]),
                        b'J' => bytes.extend_from_slice(&[0; 4]),
                        b'G' => bytes.extend_from_slice(&[0; 8]),
                        _ => {}
                    }
                }
                let _ = parse(&bytes);
            }
        }
    }
}
