//! [`Value`], a pickle's data as a tree of immutable, reference-counted Python values.
//!
//! `super::parse` returns one; `super::tree` builds it from a [`super::Document`], sharing
//! every memo-shared object as one allocation. Importers that walk a whole snapshot read the
//! document's `super::ValueRef`s instead, which have the same accessors without the tree.

use std::rc::Rc;

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

/// The value of a minimal nine-byte encoding of an integer in 2^63..2^64.
pub(super) fn big_u64(bytes: &[u8]) -> Option<u64> {
    if bytes.len() == 9 && bytes[8] == 0 {
        let mut le = [0u8; 8];
        le.copy_from_slice(&bytes[..8]);
        Some(u64::from_le_bytes(le))
    } else {
        None
    }
}
