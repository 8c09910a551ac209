//! vramscope-pickle: a safe reader and writer for the data subset of Python's pickle format,
//! protocols 0 to 5. It refuses every opcode that imports or calls anything, so reading a
//! pickle never runs code that the file names.
//!
//! PyTorch's `torch.cuda.memory._dump_snapshot()` writes a pickle of plain Python values: dicts,
//! lists, tuples, strings, integers, floats, booleans and `None`, with strings, frame dicts and
//! whole frame lists shared through the pickle memo. This crate reads such bytes into a
//! [`Document`], a compact arena read through [`ValueRef`]s, or into a tree of immutable
//! [`Value`]s ([`parse`]). It never imports, constructs or calls anything: every opcode that
//! would (`GLOBAL`, `STACK_GLOBAL`, `REDUCE`, `BUILD`, `INST`, `OBJ`, `NEWOBJ`, `NEWOBJ_EX`,
//! the `EXT` registry, persistent ids, out-of-band buffers) is refused with a [`PickleError`]
//! that names the opcode and its byte offset. Truncated or corrupt input is an error naming
//! what went wrong and where, never a panic, and [`Limits`] bound nesting depth, the number of
//! values and the number of container elements so that hostile input cannot exhaust memory.
//! [`PickleWriter`] (`writer`) writes the same subset as protocol 4, sharing repeated objects
//! through the memo. The crate depends on no other crate of vramscope.
//!
//! The importer and the exporter use it both ways: `vramscope_import::pytorch` walks a
//! [`Document`] through [`ValueRef`]s to build the one data model of `vramscope_model`, or
//! streams the trace entries into an [`EntrySink`] while the pickle is read
//! ([`parse_streaming`], [`parse_streaming_chunks`], and [`parse_streaming_read`] with
//! [`Document::parse_read`] for what gzip data unpacks to, whose length is not known until it
//! ends and which is read no further than its first error); `export` writes PyTorch snapshot pickles
//! with [`PickleWriter`], and reads an original snapshot's extras back from a [`Document`].
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
//!
//! The crate's parts: [`Value`] (`value`), the [`Document`] arena with its [`ValueRef`] and
//! [`Seq`] handles (`document`), the machine that runs the opcodes into a document
//! (`machine`, with the opcodes by name in `opcodes` and the decoding of text and number
//! arguments in `args`), the conversion of a document to [`Value`]s (`tree`), the [`Limits`]
//! (`limits`), the [`PickleError`] (`error`) and the [`PickleWriter`] (`writer`). The machine
//! can also stream the entries of the lists under one key of the root dict into a consumer
//! while it reads, from all the bytes or from pieces of them, dropping each entry once
//! converted (`machine::stream`); it falls back to a whole document whenever that could
//! change the result. An entry of the shape Python's pickler writes is decoded there without
//! the generic machine and handed over as a [`FastEntry`] (`machine::fast`), to a sink that
//! takes them ([`EntrySink::takes_fast_entries`]); anything else is read opcode by opcode.

#![warn(missing_docs)]

mod args;
mod document;
mod error;
mod limits;
mod machine;
pub(crate) mod opcodes;
mod tree;
mod value;
pub mod writer;

#[cfg(test)]
mod tests;

pub use document::{Document, Seq, ValueRef};
pub use error::{human_bytes, PickleError, PickleErrorKind};
pub use limits::{Limits, DEFAULT_MAX_INPUT_BYTES};
pub use opcodes::opcode_name;
pub use value::Value;
pub use writer::{MemoRef, PickleWriter};

pub use machine::fast::{FastEntry, FastList, FastValue};
pub use machine::stream::{
    parse_streaming, parse_streaming_chunks, parse_streaming_read, EntrySink, Standin, Streamed,
    StreamedList,
};

/// Parses a pickle of plain data with the default [`Limits`].
///
/// ```
/// use vramscope_pickle::{parse, Value};
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
