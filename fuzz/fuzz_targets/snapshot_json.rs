//! Fuzzes vramscope's own JSON snapshot reader.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = vramscope_model::Snapshot::from_json_bytes(data, "fuzz");
});
