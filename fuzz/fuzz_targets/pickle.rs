//! Fuzzes the safe pickle reader: any bytes give a value or an error naming the offset.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = vramscope_pickle::parse(data);
});
