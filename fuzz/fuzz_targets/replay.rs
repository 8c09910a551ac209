//! Fuzzes `replay` on whatever imports: the trace's allocations and frees through the caching
//! allocator on a phantom device, unlimited and at a small capacity, with the device calls
//! verified, and with expandable segments (the bomb of issue 17 was a 2^49-byte map).
#![no_main]

use libfuzzer_sys::fuzz_target;
use vramscope_model::AllocatorConfig;
use vramscope_import::{load_bytes, ImportOptions};
use vramscope_replay::{render_text, replay, ReplayOptions};

fuzz_target!(|data: &[u8]| {
    let Ok(snapshot) = load_bytes(data, "fuzz", &ImportOptions::default()) else {
        return;
    };
    for (capacity, conf, verify) in [
        (None, "", true),
        (Some(64 << 20), "", false),
        (None, "expandable_segments:True", false),
    ] {
        let mut options = ReplayOptions::default();
        options.capacity = capacity;
        options.config = AllocatorConfig::parse(conf).unwrap_or_default();
        options.reconstruct_start = true;
        options.verify = verify;
        let result = replay(&snapshot, &options, &mut |_, _| {});
        let _ = render_text("fuzz", &result);
    }
});
