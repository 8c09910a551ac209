//! Fuzzes format detection and every importer behind it: PyTorch pickles, Chrome traces
//! (plain or gzip), vramscope JSON snapshots.
#![no_main]

use libfuzzer_sys::fuzz_target;
use vramscope_import::{load_bytes, ImportOptions};

fuzz_target!(|data: &[u8]| {
    if let Ok(snapshot) = load_bytes(data, "fuzz", &ImportOptions::default()) {
        // Whatever imports must also analyse without panicking.
        let _ = vramscope_analysis::detect::detect(&snapshot, &Default::default());
    }
});
