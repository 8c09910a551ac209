//! Fuzzes the pickle reader's fast path for trace entries against its generic machine: a
//! PyTorch snapshot imports into the same snapshot, or fails with the same error, whether the
//! entries of the shape Python writes are decoded by the fast path
//! (`pytorch::from_pickle_bytes`) or read by the generic machine
//! (`pytorch::from_pickle_bytes_generic`).
//!
//! Random bytes seldom reach the fast path, which needs a streamed `device_traces` list. So each
//! input is imported twice: as it is, and as edits to a snapshot written as Python's pickler
//! writes one (shared keys, memoized frame dicts, a new frames list per entry), where the
//! input's bytes, taken in threes, each put a byte at an offset of the template.
#![no_main]

use libfuzzer_sys::fuzz_target;
use vramscope_import::pytorch::{from_pickle_bytes, from_pickle_bytes_generic};
use vramscope_import::ImportOptions;

/// Imports `bytes` both ways and asserts that they agree.
fn agree(bytes: &[u8]) {
    let options = ImportOptions::default();
    let fast = from_pickle_bytes(bytes, "fuzz", &options).map_err(|e| e.to_string());
    let generic = from_pickle_bytes_generic(bytes, "fuzz", &options).map_err(|e| e.to_string());
    assert_eq!(fast, generic);
}

/// A snapshot of 40 trace entries in Python's protocol 4 shape.
fn template() -> Vec<u8> {
    let mut out = vec![0x80, 4];
    let mut memo = 0u32;
    let mut memoize = |out: &mut Vec<u8>| {
        out.push(0x94);
        memo += 1;
        memo - 1
    };
    let get = |out: &mut Vec<u8>, index: u32| out.extend([b'h', index as u8]);
    let text = |out: &mut Vec<u8>, s: &str| {
        out.extend([0x8c, s.len() as u8]);
        out.extend(s.as_bytes());
    };
    // The root dict, its `device_traces` key, the outer list and the one trace list.
    out.push(b'}');
    memoize(&mut out);
    out.push(b'(');
    text(&mut out, "device_traces");
    memoize(&mut out);
    out.push(b']');
    memoize(&mut out);
    out.push(b']');
    memoize(&mut out);
    out.push(b'(');
    let mut keys = Vec::new();
    let mut frames = Vec::new();
    for i in 0..40u32 {
        out.push(b'}');
        memoize(&mut out);
        out.push(b'(');
        for (k, key) in ["action", "addr", "size", "stream", "time_us", "frames"]
            .iter()
            .enumerate()
        {
            match keys.get(k) {
                Some(&index) => get(&mut out, index),
                None => {
                    text(&mut out, key);
                    keys.push(memoize(&mut out));
                }
            }
            match k {
                0 => text(
                    &mut out,
                    ["alloc", "free_requested", "free_completed"][i as usize % 3],
                ),
                1 => {
                    out.extend([0x8a, 5]);
                    out.extend(&(0x01_0000_0000u64 + u64::from(i % 4) * 4096).to_le_bytes()[..5]);
                }
                2 => out.extend([b'M', 0, 16]),
                3 => out.extend([b'K', 0]),
                4 => {
                    out.push(b'J');
                    out.extend((1_000_000 + i as i32).to_le_bytes());
                }
                _ => {
                    out.push(b']');
                    memoize(&mut out);
                    out.push(b'(');
                    for f in 0..1 + i % 4 {
                        match frames.get(f as usize) {
                            Some(&index) => get(&mut out, index),
                            None => {
                                out.push(b'}');
                                let index = memoize(&mut out);
                                out.push(b'(');
                                text(&mut out, "filename");
                                text(&mut out, "model.py");
                                text(&mut out, "line");
                                out.extend([b'K', f as u8]);
                                text(&mut out, "name");
                                text(&mut out, "f");
                                out.push(b'u');
                                frames.push(index);
                            }
                        }
                    }
                    out.push(b'e');
                }
            }
        }
        out.push(b'u');
    }
    // The trace list's entries, the outer list's one list, the root's pair, STOP.
    out.extend([b'e', b'a', b'u', b'.']);
    out
}

fuzz_target!(|data: &[u8]| {
    agree(data);
    let mut bytes = template();
    for edit in data.chunks_exact(3) {
        let at = usize::from(u16::from_le_bytes([edit[0], edit[1]])) % bytes.len();
        bytes[at] = edit[2];
    }
    agree(&bytes);
});
