//! A safe reader for the data subset of Python's pickle format, protocols 0 to 5.
//!
//! PyTorch's `torch.cuda.memory._dump_snapshot()` writes a pickle of plain Python values: dicts,
//! lists, tuples, strings, integers, floats, booleans and `None`, with strings, frame dicts and
//! whole frame lists shared through the pickle memo. This module turns such bytes into a
//! [`Value`] tree for `crate::import::pytorch`, which converts it into the one data model of
//! `vramscope_allocator::model`. It never imports, constructs or calls anything: every opcode
//! that would (`GLOBAL`, `STACK_GLOBAL`, `REDUCE`, `BUILD`, `INST`, `OBJ`, `NEWOBJ`,
//! `NEWOBJ_EX`, the `EXT` registry, persistent ids, out-of-band buffers) is refused with a
//! [`PickleError`] that names the opcode and its byte offset. Truncated or corrupt input is an
//! error naming what went wrong and where, never a panic, and [`Limits`] bound nesting depth,
//! the number of values and the number of container elements so that hostile input cannot
//! exhaust memory.
//!
//! The reader first builds an arena of nodes (so that memoized lists and dicts can still be
//! appended to, as the pickle machine requires) and then converts the arena into immutable
//! [`Value`]s in which every memo-shared object becomes one reference-counted allocation: a frame
//! list referenced by ten thousand trace entries is stored once, and so are separate lists that
//! hold the very same (memoized) elements, such as the identical stacks of a training loop.

#![warn(missing_docs)]
use std::fmt;
use std::hash::Hash;
use std::rc::Rc;

use rustc_hash::FxHashMap;

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
            Value::BigInt(bytes) => {
                // A minimal encoding of a value in 2^63..2^64 has nine bytes, the last one zero.
                if bytes.len() == 9 && bytes[8] == 0 {
                    let mut le = [0u8; 8];
                    le.copy_from_slice(&bytes[..8]);
                    Some(u64::from_le_bytes(le))
                } else {
                    None
                }
            }
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

/// Bounds on what one [`parse`] may build; exceeding one is an error, never an abort.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Largest input accepted, in bytes.
    pub max_input_bytes: usize,
    /// Deepest nesting of containers (the top-level container is depth 1).
    pub max_depth: usize,
    /// Most values (scalars and containers, not counting memo references) created.
    pub max_values: usize,
    /// Most elements put into containers, in total (a dict pair counts as two).
    pub max_container_items: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_input_bytes: 2 << 30,
            max_depth: 200,
            max_values: 64 << 20,
            max_container_items: 64 << 20,
        }
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
    /// A [`Limits`] bound was exceeded.
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
    if bytes.is_empty() {
        return Err(PickleError {
            offset: 0,
            kind: PickleErrorKind::Empty,
        });
    }
    if bytes.len() > limits.max_input_bytes {
        return Err(PickleError {
            offset: 0,
            kind: PickleErrorKind::LimitExceeded {
                what: "input bytes",
                limit: limits.max_input_bytes,
            },
        });
    }
    let mut machine = Machine::new(bytes, limits);
    let root = machine.run()?;
    machine.into_value(root)
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

/// Index of a node in the arena.
type Id = u32;

/// A value under construction. Lists, dicts and sets stay mutable until `STOP`; then each
/// becomes a finished `Leaf`, passing through `Building` while its elements are built.
enum Node {
    Leaf(Value),
    Building,
    List(Vec<Id>),
    Tuple(Vec<Id>),
    Dict(Vec<(Id, Id)>),
    Set(Vec<Id>),
    FrozenSet(Vec<Id>),
}

impl Node {
    fn type_name(&self) -> &'static str {
        match self {
            Node::Leaf(v) => v.type_name(),
            Node::Building => "container being built",
            Node::List(_) => "list",
            Node::Tuple(_) => "tuple",
            Node::Dict(_) => "dict",
            Node::Set(_) => "set",
            Node::FrozenSet(_) => "frozenset",
        }
    }
}

/// The memo: dense for the sequential indices every Python pickler writes, sparse otherwise,
/// so that a huge `LONG_BINPUT` index cannot force a huge allocation.
#[derive(Default)]
struct Memo {
    dense: Vec<Id>,
    sparse: FxHashMap<u64, Id>,
}

impl Memo {
    fn put(&mut self, index: u64, id: Id) {
        let len = self.dense.len() as u64;
        if index < len {
            self.dense[index as usize] = id;
        } else if index == len {
            self.dense.push(id);
            if !self.sparse.is_empty() {
                self.sparse.remove(&index);
            }
        } else {
            self.sparse.insert(index, id);
        }
    }

    fn get(&self, index: u64) -> Option<Id> {
        match self.dense.get(index as usize) {
            Some(&id) if index < self.dense.len() as u64 => Some(id),
            _ => self.sparse.get(&index).copied(),
        }
    }

    fn len(&self) -> u64 {
        (self.dense.len() + self.sparse.len()) as u64
    }
}

/// The pickle virtual machine, restricted to data.
struct Machine<'a> {
    data: &'a [u8],
    pos: usize,
    limits: &'a Limits,
    nodes: Vec<Node>,
    /// Byte offset of the opcode that created each node.
    origins: Vec<usize>,
    stack: Vec<Id>,
    /// Stack lengths at each open MARK.
    marks: Vec<usize>,
    memo: Memo,
    items: usize,
    /// Offset of the opcode being executed.
    op_pos: usize,
    op: u8,
}

type Step<T> = Result<T, PickleError>;

impl<'a> Machine<'a> {
    fn new(data: &'a [u8], limits: &'a Limits) -> Self {
        Machine {
            data,
            pos: 0,
            limits,
            nodes: Vec::with_capacity(data.len() / 16),
            origins: Vec::with_capacity(data.len() / 16),
            stack: Vec::with_capacity(64),
            marks: Vec::with_capacity(16),
            memo: Memo::default(),
            items: 0,
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

    fn new_node(&mut self, node: Node) -> Step<Id> {
        if self.nodes.len() >= self.limits.max_values {
            return Err(self.error(PickleErrorKind::LimitExceeded {
                what: "values",
                limit: self.limits.max_values,
            }));
        }
        let id = self.nodes.len() as Id;
        self.nodes.push(node);
        self.origins.push(self.op_pos);
        Ok(id)
    }

    fn push_node(&mut self, node: Node) -> Step<()> {
        let id = self.new_node(node)?;
        self.stack.push(id);
        Ok(())
    }

    fn push_leaf(&mut self, value: Value) -> Step<()> {
        self.push_node(Node::Leaf(value))
    }

    fn count_items(&mut self, n: usize) -> Step<()> {
        self.items = self.items.saturating_add(n);
        if self.items > self.limits.max_container_items {
            return Err(self.error(PickleErrorKind::LimitExceeded {
                what: "container elements",
                limit: self.limits.max_container_items,
            }));
        }
        Ok(())
    }

    /// Where the values above the last mark begin.
    fn floor(&self) -> usize {
        self.marks.last().copied().unwrap_or(0)
    }

    fn pop(&mut self) -> Step<Id> {
        if self.stack.len() > self.floor() {
            Ok(self.stack.pop().unwrap_or_default())
        } else {
            Err(self.error(PickleErrorKind::StackUnderflow {
                opcode: self.name(),
            }))
        }
    }

    fn top(&self) -> Step<Id> {
        if self.stack.len() > self.floor() {
            Ok(self.stack[self.stack.len() - 1])
        } else {
            Err(self.error(PickleErrorKind::StackUnderflow {
                opcode: self.name(),
            }))
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
    fn below(&self, mark: usize) -> Step<Id> {
        if mark > self.floor() {
            Ok(self.stack[mark - 1])
        } else {
            Err(self.error(PickleErrorKind::StackUnderflow {
                opcode: self.name(),
            }))
        }
    }

    /// Pops the values above the last mark and the mark itself.
    fn pop_mark(&mut self) -> Step<Vec<Id>> {
        let mark = self.take_mark()?;
        Ok(self.stack.split_off(mark))
    }

    fn pairs(&self, items: Vec<Id>) -> Step<Vec<(Id, Id)>> {
        if items.len() % 2 != 0 {
            return Err(self.bad(format!(
                "an odd number of values ({}) for key/value pairs",
                items.len()
            )));
        }
        Ok(items.chunks_exact(2).map(|p| (p[0], p[1])).collect())
    }

    fn wrong_type(&self, expected: &'static str, found: Id) -> PickleError {
        self.error(PickleErrorKind::WrongType {
            opcode: self.name(),
            expected,
            found: self.nodes[found as usize].type_name(),
        })
    }

    fn extend_list(&mut self, target: Id, items: Vec<Id>) -> Step<()> {
        self.count_items(items.len())?;
        match &mut self.nodes[target as usize] {
            Node::List(list) => {
                list.extend(items);
                Ok(())
            }
            _ => Err(self.wrong_type("list", target)),
        }
    }

    fn extend_dict(&mut self, target: Id, pairs: Vec<(Id, Id)>) -> Step<()> {
        self.count_items(pairs.len() * 2)?;
        match &mut self.nodes[target as usize] {
            Node::Dict(dict) => {
                dict.extend(pairs);
                Ok(())
            }
            _ => Err(self.wrong_type("dict", target)),
        }
    }

    fn memo_get(&self, index: u64) -> Step<Id> {
        self.memo
            .get(index)
            .ok_or_else(|| self.error(PickleErrorKind::MissingMemo { index }))
    }

    fn memo_put(&mut self, index: u64) -> Step<()> {
        let top = self.top()?;
        self.memo.put(index, top);
        Ok(())
    }

    fn text_u64(&self, text: &str) -> Step<u64> {
        text.trim()
            .parse()
            .map_err(|_| self.bad(format!("`{text}` is not a memo index")))
    }

    fn str_value(&self, bytes: &[u8]) -> Value {
        Value::Str(Rc::from(String::from_utf8_lossy(bytes).as_ref()))
    }

    /// Runs opcodes up to `STOP` and returns the node it pops.
    fn run(&mut self) -> Step<Id> {
        loop {
            self.op_pos = self.pos;
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
                b'.' => return self.pop(),
                // Stack manipulation.
                b'(' => self.marks.push(self.stack.len()),
                b'0' => {
                    if self.stack.len() > self.floor() {
                        self.stack.pop();
                    } else {
                        self.pop_mark()?;
                    }
                }
                b'1' => {
                    self.pop_mark()?;
                }
                b'2' => {
                    let top = self.top()?;
                    self.count_items(1)?;
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
                    let id = self.memo_get(index)?;
                    self.count_items(1)?;
                    self.stack.push(id);
                }
                b'h' => {
                    let index = self.take_u8()? as u64;
                    let id = self.memo_get(index)?;
                    self.count_items(1)?;
                    self.stack.push(id);
                }
                b'j' => {
                    let index = self.take_u32()? as u64;
                    let id = self.memo_get(index)?;
                    self.count_items(1)?;
                    self.stack.push(id);
                }
                // Scalars.
                b'N' => self.push_leaf(Value::None)?,
                0x88 => self.push_leaf(Value::Bool(true))?,
                0x89 => self.push_leaf(Value::Bool(false))?,
                b'J' => {
                    let v = self.take_i32()?;
                    self.push_leaf(Value::Int(v as i64))?;
                }
                b'K' => {
                    let v = self.take_u8()?;
                    self.push_leaf(Value::Int(v as i64))?;
                }
                b'M' => {
                    let v = u16::from_le_bytes(self.take_array()?);
                    self.push_leaf(Value::Int(v as i64))?;
                }
                0x8a => {
                    let n = self.take_u8()? as u64;
                    let bytes = self.take(n)?;
                    self.push_leaf(int_from_le(bytes))?;
                }
                0x8b => {
                    let n = self.take_len_i32()?;
                    let bytes = self.take(n)?;
                    self.push_leaf(int_from_le(bytes))?;
                }
                b'I' => {
                    let text = self.take_line_str()?;
                    let value = match text {
                        "00" => Value::Bool(false),
                        "01" => Value::Bool(true),
                        _ => int_from_decimal(text)
                            .ok_or_else(|| self.bad(format!("`{text}` is not an integer")))?,
                    };
                    self.push_leaf(value)?;
                }
                b'L' => {
                    let text = self.take_line_str()?;
                    let digits = text.strip_suffix('L').unwrap_or(text);
                    let value = int_from_decimal(digits)
                        .ok_or_else(|| self.bad(format!("`{text}` is not an integer")))?;
                    self.push_leaf(value)?;
                }
                b'G' => {
                    let v = f64::from_be_bytes(self.take_array()?);
                    self.push_leaf(Value::Float(v))?;
                }
                b'F' => {
                    let text = self.take_line_str()?;
                    let v: f64 = text
                        .trim()
                        .parse()
                        .map_err(|_| self.bad(format!("`{text}` is not a float")))?;
                    self.push_leaf(Value::Float(v))?;
                }
                // Strings and bytes.
                0x8c => {
                    let n = self.take_u8()? as u64;
                    let bytes = self.take(n)?;
                    let v = self.str_value(bytes);
                    self.push_leaf(v)?;
                }
                b'X' => {
                    let n = self.take_u32()? as u64;
                    let bytes = self.take(n)?;
                    let v = self.str_value(bytes);
                    self.push_leaf(v)?;
                }
                0x8d => {
                    let n = self.take_u64()?;
                    let bytes = self.take(n)?;
                    let v = self.str_value(bytes);
                    self.push_leaf(v)?;
                }
                b'V' => {
                    let line = self.take_line()?;
                    let text = raw_unicode_unescape(line)
                        .ok_or_else(|| self.bad("a bad \\u or \\U escape"))?;
                    self.push_leaf(Value::Str(Rc::from(text.as_str())))?;
                }
                b'U' => {
                    let n = self.take_u8()? as u64;
                    let bytes = self.take(n)?;
                    self.push_leaf(byte_string(bytes))?;
                }
                b'T' => {
                    let n = self.take_len_i32()?;
                    let bytes = self.take(n)?;
                    self.push_leaf(byte_string(bytes))?;
                }
                b'S' => {
                    let line = self.take_line()?;
                    let bytes = quoted_unescape(line)
                        .ok_or_else(|| self.bad("a malformed quoted string"))?;
                    self.push_leaf(byte_string(&bytes))?;
                }
                b'C' => {
                    let n = self.take_u8()? as u64;
                    let bytes = self.take(n)?;
                    self.push_leaf(Value::Bytes(Rc::from(bytes)))?;
                }
                b'B' => {
                    let n = self.take_u32()? as u64;
                    let bytes = self.take(n)?;
                    self.push_leaf(Value::Bytes(Rc::from(bytes)))?;
                }
                0x8e | 0x96 => {
                    let n = self.take_u64()?;
                    let bytes = self.take(n)?;
                    self.push_leaf(Value::Bytes(Rc::from(bytes)))?;
                }
                // Containers.
                b']' => self.push_node(Node::List(Vec::new()))?,
                b'}' => self.push_node(Node::Dict(Vec::new()))?,
                b')' => self.push_node(Node::Tuple(Vec::new()))?,
                0x8f => self.push_node(Node::Set(Vec::new()))?,
                b'l' => {
                    let items = self.pop_mark()?;
                    self.count_items(items.len())?;
                    self.push_node(Node::List(items))?;
                }
                b't' => {
                    let items = self.pop_mark()?;
                    self.count_items(items.len())?;
                    self.push_node(Node::Tuple(items))?;
                }
                0x91 => {
                    let items = self.pop_mark()?;
                    self.count_items(items.len())?;
                    self.push_node(Node::FrozenSet(items))?;
                }
                b'd' => {
                    let items = self.pop_mark()?;
                    let pairs = self.pairs(items)?;
                    self.count_items(pairs.len() * 2)?;
                    self.push_node(Node::Dict(pairs))?;
                }
                0x85..=0x87 => {
                    let n = (op - 0x84) as usize;
                    if self.stack.len() < self.floor() + n {
                        return Err(self.error(PickleErrorKind::StackUnderflow {
                            opcode: self.name(),
                        }));
                    }
                    let items = self.stack.split_off(self.stack.len() - n);
                    self.count_items(n)?;
                    self.push_node(Node::Tuple(items))?;
                }
                b'a' => {
                    let value = self.pop()?;
                    let target = self.top()?;
                    self.extend_list(target, vec![value])?;
                }
                b'e' => {
                    // Extends the list in place from the stack, without an intermediate vector.
                    let mark = self.take_mark()?;
                    let target = self.below(mark)?;
                    self.count_items(self.stack.len() - mark)?;
                    match &mut self.nodes[target as usize] {
                        Node::List(list) => list.extend_from_slice(&self.stack[mark..]),
                        _ => return Err(self.wrong_type("list", target)),
                    }
                    self.stack.truncate(mark);
                }
                b's' => {
                    let value = self.pop()?;
                    let key = self.pop()?;
                    let target = self.top()?;
                    self.extend_dict(target, vec![(key, value)])?;
                }
                b'u' => {
                    let mark = self.take_mark()?;
                    let target = self.below(mark)?;
                    let n = self.stack.len() - mark;
                    if n % 2 != 0 {
                        return Err(
                            self.bad(format!("an odd number of values ({n}) for key/value pairs"))
                        );
                    }
                    self.count_items(n)?;
                    match &mut self.nodes[target as usize] {
                        Node::Dict(dict) => dict.extend(
                            self.stack[mark..]
                                .chunks_exact(2)
                                .map(|pair| (pair[0], pair[1])),
                        ),
                        _ => return Err(self.wrong_type("dict", target)),
                    }
                    self.stack.truncate(mark);
                }
                0x90 => {
                    let items = self.pop_mark()?;
                    let target = self.top()?;
                    self.count_items(items.len())?;
                    match &mut self.nodes[target as usize] {
                        Node::Set(set) => set.extend(items),
                        _ => return Err(self.wrong_type("set", target)),
                    }
                }
                _ => return Err(self.error(PickleErrorKind::UnknownOpcode { byte: op })),
            }
        }
    }

    /// Converts the arena, from `root`, into immutable values, building each node once.
    fn into_value(self, root: Id) -> Step<Value> {
        let mut builder = Builder {
            nodes: self.nodes,
            origins: self.origins,
            limits: self.limits,
            sequences: FxHashMap::default(),
        };
        builder.build(root, 1)
    }
}

/// Turns arena nodes into [`Value`]s. A container, once built, replaces its node with the
/// finished value, so that every later reference shares it.
struct Builder<'a> {
    nodes: Vec<Node>,
    origins: Vec<usize>,
    limits: &'a Limits,
    /// Finished lists and tuples by their element nodes.
    sequences: FxHashMap<(bool, Vec<Id>), Value>,
}

impl Builder<'_> {
    fn error(&self, id: Id, kind: PickleErrorKind) -> PickleError {
        PickleError {
            offset: self.origins[id as usize],
            kind,
        }
    }

    fn build(&mut self, id: Id, depth: usize) -> Step<Value> {
        self.ensure(id, depth)?;
        Ok(self.peek(id).clone())
    }

    /// The finished value of a node that [`Builder::ensure`] has built.
    fn peek(&self, id: Id) -> &Value {
        match &self.nodes[id as usize] {
            Node::Leaf(v) => v,
            // Callers ensure the node first, so this arm is never taken.
            _ => &Value::None,
        }
    }

    /// Builds the node `id` (at nesting `depth`) unless it is already a finished value.
    fn ensure(&mut self, id: Id, depth: usize) -> Step<()> {
        match &self.nodes[id as usize] {
            Node::Leaf(_) => return Ok(()),
            Node::Building => return Err(self.error(id, PickleErrorKind::Cycle)),
            _ => {}
        }
        if depth > self.limits.max_depth {
            return Err(self.error(
                id,
                PickleErrorKind::LimitExceeded {
                    what: "levels of nesting",
                    limit: self.limits.max_depth,
                },
            ));
        }
        let node = std::mem::replace(&mut self.nodes[id as usize], Node::Building);
        let value = match node {
            // Leaves and nodes being built returned above; these arms only satisfy the match.
            Node::Leaf(v) => v,
            Node::Building => Value::None,
            Node::List(ids) => self.build_seq(ids, false, depth)?,
            Node::Tuple(ids) => self.build_seq(ids, true, depth)?,
            Node::Set(ids) => Value::Set(dedupe(self.build_all(&ids, depth)?.to_vec()).into()),
            Node::FrozenSet(ids) => {
                Value::FrozenSet(dedupe(self.build_all(&ids, depth)?.to_vec()).into())
            }
            Node::Dict(pairs) => {
                for &(k, v) in &pairs {
                    self.ensure(k, depth + 1)?;
                    self.ensure(v, depth + 1)?;
                }
                let keys = pairs.iter().map(|&(k, _)| self.peek(k));
                let pair = |&(k, v): &(Id, Id)| (self.peek(k).clone(), self.peek(v).clone());
                if all_distinct(keys, pairs.len()) == Some(true) {
                    Value::Dict(pairs.iter().map(pair).collect())
                } else {
                    Value::Dict(dedupe_pairs(pairs.iter().map(pair).collect()).into())
                }
            }
        };
        self.nodes[id as usize] = Node::Leaf(value);
        Ok(())
    }

    /// Builds a list or tuple. Sequences of the very same elements (such as the separate but
    /// identical frame lists of a PyTorch trace) share one allocation: values are immutable,
    /// so the sharing cannot be observed except through [`Value::identity`].
    fn build_seq(&mut self, ids: Vec<Id>, tuple: bool, depth: usize) -> Step<Value> {
        if ids.is_empty() {
            return Ok(if tuple {
                Value::Tuple(Rc::from(Vec::new()))
            } else {
                Value::List(Rc::from(Vec::new()))
            });
        }
        let key = (tuple, ids);
        if let Some(v) = self.sequences.get(&key) {
            return Ok(v.clone());
        }
        let items = self.build_all(&key.1, depth)?;
        let value = if tuple {
            Value::Tuple(items)
        } else {
            Value::List(items)
        };
        self.sequences.insert(key, value.clone());
        Ok(value)
    }

    /// Builds the elements `ids` and collects them straight into a shared slice.
    fn build_all(&mut self, ids: &[Id], depth: usize) -> Step<Rc<[Value]>> {
        for &child in ids {
            self.ensure(child, depth + 1)?;
        }
        Ok(ids.iter().map(|&child| self.peek(child).clone()).collect())
    }
}

/// A hashable view of the key types that real pickles use, for de-duplication.
#[derive(PartialEq, Eq, Hash)]
enum KeyRef<'a> {
    None,
    Bool(bool),
    Int(i64),
    Str(&'a str),
    Bytes(&'a [u8]),
}

fn key_ref(v: &Value) -> Option<KeyRef<'_>> {
    match v {
        Value::None => Some(KeyRef::None),
        Value::Bool(b) => Some(KeyRef::Bool(*b)),
        Value::Int(i) => Some(KeyRef::Int(*i)),
        Value::Str(s) => Some(KeyRef::Str(s)),
        Value::Bytes(b) => Some(KeyRef::Bytes(b)),
        _ => None,
    }
}

/// Positions of the first occurrence of each key among `keys`, keeping first-seen order; the
/// result maps each index of `keys` to the index of its first occurrence.
fn first_occurrences<'v>(keys: impl Iterator<Item = &'v Value>) -> Vec<usize> {
    let keys: Vec<&Value> = keys.collect();
    let mut first = Vec::with_capacity(keys.len());
    if keys.len() <= 16 {
        for (i, k) in keys.iter().enumerate() {
            let j = keys[..i].iter().position(|o| o == k).unwrap_or(i);
            first.push(j);
        }
        return first;
    }
    let mut hashed: FxHashMap<KeyRef<'_>, usize> = FxHashMap::default();
    let mut others: Vec<usize> = Vec::new();
    for (i, k) in keys.iter().enumerate() {
        let j = match key_ref(k) {
            Some(r) => *hashed.entry(r).or_insert(i),
            None => match others.iter().find(|&&o| keys[o] == *k) {
                Some(&o) => o,
                None => {
                    others.push(i);
                    i
                }
            },
        };
        first.push(j);
    }
    first
}

/// Whether all values are distinct, decided without allocating for short lists; `None` when
/// the list is too long to check this way.
fn all_distinct<'v>(keys: impl Iterator<Item = &'v Value> + Clone, len: usize) -> Option<bool> {
    if len > 16 {
        return None;
    }
    for (i, k) in keys.clone().enumerate() {
        if keys.clone().take(i).any(|o| o == k) {
            return Some(false);
        }
    }
    Some(true)
}

/// Removes repeated elements of a set, keeping the first of each.
fn dedupe(items: Vec<Value>) -> Vec<Value> {
    if all_distinct(items.iter(), items.len()) == Some(true) {
        return items;
    }
    let first = first_occurrences(items.iter());
    if first.iter().enumerate().all(|(i, &j)| i == j) {
        return items;
    }
    items
        .into_iter()
        .enumerate()
        .filter(|(i, _)| first[*i] == *i)
        .map(|(_, v)| v)
        .collect()
}

/// Keeps one pair per key, at the key's first position and with its last value.
fn dedupe_pairs(pairs: Vec<(Value, Value)>) -> Vec<(Value, Value)> {
    if all_distinct(pairs.iter().map(|(k, _)| k), pairs.len()) == Some(true) {
        return pairs;
    }
    let first = first_occurrences(pairs.iter().map(|(k, _)| k));
    if first.iter().enumerate().all(|(i, &j)| i == j) {
        return pairs;
    }
    let mut slots: Vec<Option<(Value, Value)>> = Vec::with_capacity(pairs.len());
    for (i, (k, v)) in pairs.into_iter().enumerate() {
        let j = first[i];
        if j == i {
            slots.push(Some((k, v)));
        } else {
            slots.push(None);
            if let Some(slot) = slots[j].as_mut() {
                slot.1 = v;
            }
        }
    }
    slots.into_iter().flatten().collect()
}

/// Decodes a little-endian two's-complement integer (the argument of `LONG1`/`LONG4`).
fn int_from_le(bytes: &[u8]) -> Value {
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
        return Value::Int(0);
    }
    if bytes.len() <= 8 {
        let fill = if bytes[bytes.len() - 1] & 0x80 != 0 {
            0xff
        } else {
            0
        };
        let mut le = [fill; 8];
        le[..bytes.len()].copy_from_slice(bytes);
        Value::Int(i64::from_le_bytes(le))
    } else {
        Value::BigInt(Rc::from(bytes))
    }
}

/// Parses a decimal integer of any size (the argument of the text `INT` and `LONG` opcodes).
fn int_from_decimal(text: &str) -> Option<Value> {
    let text = text.trim();
    if let Ok(v) = text.parse::<i64>() {
        return Some(Value::Int(v));
    }
    let (negative, digits) = match text.as_bytes().first()? {
        b'-' => (true, &text[1..]),
        b'+' => (false, &text[1..]),
        _ => (false, text),
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    // Magnitude in base 256, little-endian.
    let mut magnitude: Vec<u8> = vec![0];
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

/// A protocol 0–2 byte string: text when it is UTF-8, bytes otherwise.
fn byte_string(bytes: &[u8]) -> Value {
    match std::str::from_utf8(bytes) {
        Ok(s) => Value::Str(Rc::from(s)),
        Err(_) => Value::Bytes(Rc::from(bytes)),
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
        let limits = Limits {
            max_values: 3,
            ..Limits::default()
        };
        let e = parse_with_limits(b"NNNN.", &limits).unwrap_err();
        assert_eq!(e.offset, 3);
        let limits = Limits {
            max_container_items: 4,
            ..Limits::default()
        };
        let e = parse_with_limits(b"N22222.", &limits).unwrap_err();
        assert!(matches!(e.kind, PickleErrorKind::LimitExceeded { .. }));
        let limits = Limits {
            max_input_bytes: 1,
            ..Limits::default()
        };
        assert!(parse_with_limits(b"N.", &limits).is_err());
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
