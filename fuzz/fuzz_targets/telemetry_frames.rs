//! Fuzzes the telemetry frame reader, as a dashboard meets it on a socket.
#![no_main]

use libfuzzer_sys::fuzz_target;
use vramscope_telemetry::FrameReader;

fuzz_target!(|data: &[u8]| {
    let mut reader = FrameReader::new(std::io::Cursor::new(data));
    for _ in 0..64 {
        if reader.next_frame().is_err() {
            break;
        }
    }
});
