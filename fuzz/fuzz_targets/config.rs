//! Fuzzes the `PYTORCH_CUDA_ALLOC_CONF`-syntax settings parser.
#![no_main]

use libfuzzer_sys::fuzz_target;
use vramscope_model::AllocatorConfig;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        if let Ok(config) = AllocatorConfig::parse(text) {
            assert_eq!(AllocatorConfig::parse(&config.to_string()), Ok(config));
        }
    }
});
