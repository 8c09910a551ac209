//! Fuzzes the telemetry client's frame reader the way a hostile publisher would drive it:
//! the input is cut into frames with well-formed headers (a kind byte, a two-byte length and
//! the payload), so that the fuzzer reaches the payloads and the protocol's state (snapshot
//! parts, announced history, table additions) instead of the header checks. Every frame the
//! reader returns keeps its promises: it never holds more than its limit, and the tables a
//! dashboard builds from the frames are exactly as long as the reader says they are.
#![no_main]

use libfuzzer_sys::fuzz_target;
use vramscope_model::Snapshot;
use vramscope_telemetry::wire::encode_frame;
use vramscope_telemetry::{Frame, FrameKind, FrameReader};

/// The limit the reader runs with here: small, so that the fuzzer reaches it.
const LIMIT: usize = 1 << 20;

fuzz_target!(|data: &[u8]| {
    let mut stream = Vec::new();
    let mut rest = data;
    while rest.len() >= 3 {
        let kind = FrameKind::from_code(rest[0] % 9).unwrap_or(FrameKind::Events);
        let len = usize::from(u16::from_le_bytes([rest[1], rest[2]]));
        let body = &rest[3..];
        let len = len.min(body.len());
        stream.extend(encode_frame(kind, &body[..len]));
        rest = &body[len..];
    }
    let mut reader = FrameReader::with_limit(&stream[..], LIMIT);
    let mut tables: Option<Snapshot> = None;
    for _ in 0..256 {
        let frame = match reader.next_frame() {
            Ok(frame) => frame,
            Err(_) => break,
        };
        assert!(reader.held_bytes() <= LIMIT as u64);
        match frame {
            Frame::Snapshot { snapshot, .. } => tables = Some(*snapshot),
            Frame::Tables(t) => {
                if let Some(s) = tables.as_mut() {
                    t.apply_to(s);
                }
            }
            _ => {}
        }
        if let Some(s) = &tables {
            let known = reader.known_tables();
            assert_eq!(
                (s.sites.len(), s.tags.len(), s.scopes.len()),
                (known.sites, known.tags, known.scopes)
            );
        }
    }
});
