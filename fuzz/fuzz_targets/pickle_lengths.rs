//! Fuzzes every reader of a pickle with the lengths and indices a file gives its sized opcodes
//! near the top of their field (issue 44: a `BINBYTES8` of 2^64 − 9 bytes made a streaming
//! read wait for a count that had wrapped, and every reader spun for ever).
//!
//! The input chooses an opcode that reads a length or an index (`BINBYTES8`, `BINUNICODE8`,
//! `BYTEARRAY8`, `FRAME`, `BINUNICODE`, `BINBYTES`, `BINSTRING`, `LONG4`, `LONG1`,
//! `SHORT_BINBYTES`, `LONG_BINGET`, `LONG_BINPUT`), a top (2^64, 2^63, 2^32, 2^31, 2^8 as the
//! field allows), a distance below or above it, a protocol, the values before the opcode and
//! the bytes after it. The pickle runs through the whole read, the chunked streaming read (as
//! a file is read) and both reads of an input of unknown length (as gzip data is read), with
//! pieces whose size the input chooses: each must end, with a value or an error; a streaming
//! read never succeeds where the whole read fails, and a read of unknown length fails where it
//! does. Run it with
//! `-timeout=10`: a hang is the finding. The deterministic twin is
//! `lengths_near_the_top_of_their_field_are_errors_in_every_reader` in `pickle/src/tests.rs`.
#![no_main]

use libfuzzer_sys::fuzz_target;
use vramscope_pickle::{Document, EntrySink, Limits, Standin, ValueRef};

/// The opcodes with a length or an index, and the bytes of that field.
const SIZED: [(u8, usize); 12] = [
    (0x8e, 8), // BINBYTES8
    (0x8d, 8), // BINUNICODE8
    (0x96, 8), // BYTEARRAY8
    (0x95, 8), // FRAME
    (b'X', 4), // BINUNICODE
    (b'B', 4), // BINBYTES
    (b'T', 4), // BINSTRING
    (0x8b, 4), // LONG4
    (b'j', 4), // LONG_BINGET
    (b'r', 4), // LONG_BINPUT
    (0x8a, 1), // LONG1
    (b'C', 1), // SHORT_BINBYTES
];

struct NoEntries(Vec<usize>, Vec<(usize, Standin)>);

impl EntrySink for NoEntries {
    fn entry(&mut self, _: ValueRef<'_>, _: usize, _: usize, _: usize) -> bool {
        false
    }
    fn read(&mut self) -> &mut Vec<usize> {
        &mut self.0
    }
    fn standins(&mut self) -> &mut Vec<(usize, Standin)> {
        &mut self.1
    }
    fn memory(&self) -> usize {
        0
    }
}

/// A reader handing out `piece` bytes at a time.
struct Pieces<'a> {
    data: &'a [u8],
    piece: usize,
}

impl std::io::Read for Pieces<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.piece.min(buf.len()).min(self.data.len());
        buf[..n].copy_from_slice(&self.data[..n]);
        self.data = &self.data[n..];
        Ok(n)
    }
}

/// The pickle the input describes, and the piece size to read it in.
fn pickle(data: &[u8]) -> Option<(Vec<u8>, usize)> {
    let (&[choice, top, below, above, proto, before, piece], rest) =
        data.split_first_chunk::<7>()?;
    let (op, width) = SIZED[choice as usize % SIZED.len()];
    let bits = (8 * width as u32).min([64, 63, 32, 31, 8][top as usize % 5]);
    let top: u128 = 1 << bits;
    let n = (top + u128::from(above)).saturating_sub(u128::from(below)) % (1u128 << (8 * width));
    let mut bytes = vec![0x80, 2 + proto % 4];
    // Values for the memo and the stack, so that LONG_BINPUT has something to store.
    bytes.extend(std::iter::repeat_n(b'N', usize::from(before % 4)));
    bytes.push(op);
    bytes.extend_from_slice(&n.to_le_bytes()[..width]);
    bytes.extend_from_slice(rest);
    Some((bytes, 1 + usize::from(piece) % 64))
}

fuzz_target!(|data: &[u8]| {
    let Some((bytes, piece)) = pickle(data) else {
        return;
    };
    let limits = Limits::default();
    let whole = Document::parse_with_limits(&bytes, &limits);

    let mut at = 0;
    let mut next = |window: &mut Vec<u8>| {
        let end = (at + piece).min(bytes.len());
        window.extend_from_slice(&bytes[at..end]);
        let gave = end > at;
        at = end;
        gave
    };
    let mut sink = NoEntries(Vec::new(), Vec::new());
    let chunked = vramscope_pickle::parse_streaming_chunks(
        bytes.len(),
        &mut next,
        &limits,
        "device_traces",
        &mut sink,
    );
    // A streaming read gives up (None) on any error: it never succeeds where the whole fails.
    assert!(
        chunked.is_none() || whole.is_ok(),
        "chunked read of {bytes:02x?}"
    );

    let mut sink = NoEntries(Vec::new(), Vec::new());
    let mut input = Pieces {
        data: &bytes,
        piece,
    };
    let streamed_read =
        vramscope_pickle::parse_streaming_read(&mut input, &limits, "device_traces", &mut sink);
    assert!(
        streamed_read.is_none() || whole.is_ok(),
        "unsized read of {bytes:02x?}"
    );

    let mut open = || -> Box<dyn std::io::Read + '_> {
        Box::new(Pieces {
            data: &bytes,
            piece,
        })
    };
    let read = Document::parse_read(&mut open, &limits);
    assert_eq!(read.is_ok(), whole.is_ok(), "read of {bytes:02x?}");
});
