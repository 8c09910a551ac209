//! Fuzzes the `/metrics` server's request reader (`vramscope_allocator::metrics::parse_request`)
//! the way a hostile local client would drive it: any bytes, under limits the input chooses
//! (its first two bytes set the head's byte limit, 1 to 1021, and the header-line limit, 0 to
//! 255) so that the fuzzer reaches both limits and not only the defaults. Besides never
//! panicking, the reader keeps its promises: it decides on the head alone, within the byte
//! limit (bytes past the head or past the limit never change the answer), it asks for more
//! only while fewer bytes than the limit came, and what it accepts is a `GET` whose head ends
//! in an empty line.
#![no_main]

use libfuzzer_sys::fuzz_target;
use vramscope_allocator::metrics::{parse_request, MetricsLimits, Request, RequestError};

/// Whether `bytes` hold the end of a head: an empty line, `\n\n` or `\n\r\n`.
fn ends(bytes: &[u8]) -> bool {
    bytes.windows(2).any(|w| w == b"\n\n") || bytes.windows(3).any(|w| w == b"\n\r\n")
}

fuzz_target!(|data: &[u8]| {
    let mut limits = MetricsLimits::default();
    let bytes = match data {
        [a, b, rest @ ..] => {
            limits.max_request_bytes = 1 + usize::from(*a) * 4;
            limits.max_headers = usize::from(*b);
            rest
        }
        _ => data,
    };
    let answer = parse_request(bytes, &limits);
    let max = limits.max_request_bytes;
    match answer {
        Err(RequestError::Incomplete) => {
            assert!(bytes.len() < max, "incomplete past the limit");
            assert!(!ends(bytes));
        }
        Err(RequestError::TooLarge) => {}
        Ok(request) => {
            assert!(bytes.starts_with(b"GET /"), "{request:?} from {bytes:?}");
            assert!(ends(&bytes[..bytes.len().min(max)]));
            if request == Request::Metrics {
                assert!(bytes.starts_with(b"GET /metrics"));
            }
        }
        Err(_) => {}
    }
    // The answer depends on the first `max` bytes alone, and once decided, on the head alone.
    if bytes.len() > max {
        assert_eq!(parse_request(&bytes[..max], &limits), answer);
    }
    if answer != Err(RequestError::Incomplete) {
        let mut more = bytes.to_vec();
        more.extend_from_slice(b"\r\n\r\nGET /metrics HTTP/1.1\r\n\r\n");
        assert_eq!(parse_request(&more, &limits), answer);
    }
});
