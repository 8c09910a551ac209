//! [`PickleError`]: what went wrong while reading a pickle, and at which byte offset.
//!
//! `super::machine` raises every kind as it runs (naming the opcode through
//! `super::opcodes::opcode_name`), `super::Document`'s check raises cycles and nesting, and
//! `vramscope_import` wraps the error with the name of the file. Every limit's
//! message names the limit and, where one exists, the option that raises it.

use std::fmt;

#[cfg(doc)]
use super::{Limits, Value};

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
