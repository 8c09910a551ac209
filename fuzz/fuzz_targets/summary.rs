//! Fuzzes `summary` on whatever imports: PyTorch's memory_summary() table of the statistics
//! the importer computed from the file.
#![no_main]

use libfuzzer_sys::fuzz_target;
use vramscope_import::{load_bytes, ImportOptions};
use vramscope_analysis::report::{build_report, ReportOptions};
use vramscope_render::render_summary;

fuzz_target!(|data: &[u8]| {
    let Ok(snapshot) = load_bytes(data, "fuzz", &ImportOptions::default()) else {
        return;
    };
    let _ = render_summary(&build_report(&snapshot, &ReportOptions::default()));
});
