//! [`Limits`]: the bounds on what reading one pickle may build, so that hostile input cannot
//! exhaust memory or time.
//!
//! `super::machine` checks the memory budget and the open `MARK`s as it runs,
//! `super::Document`'s check after reading bounds nesting, and
//! `vramscope_import::pytorch` sets [`Limits::max_input_bytes`] from the importer's
//! options. SECURITY.md lists every bound.

/// The largest input read by default, in bytes (4 GiB): more than the largest PyTorch snapshots
/// of big jobs. The file commands' `--max-input` and `VRAMSCOPE_MAX_INPUT` set another ceiling.
pub const DEFAULT_MAX_INPUT_BYTES: usize = 4 << 30;

/// Bounds on what one [`parse`](super::parse) may build; exceeding one is an error, never an abort.
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
#[non_exhaustive]
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
    /// These limits with the largest input accepted set to `max_input_bytes`: how another
    /// crate sets one bound, as the struct is `non_exhaustive`.
    #[must_use]
    pub fn with_max_input_bytes(mut self, max_input_bytes: usize) -> Self {
        self.max_input_bytes = max_input_bytes;
        self
    }

    /// The most bytes of memory a document read from `input_bytes` bytes may take.
    pub fn memory_budget(&self, input_bytes: usize) -> usize {
        input_bytes
            .saturating_mul(self.memory_per_input_byte)
            .max(self.min_memory_bytes)
    }
}
