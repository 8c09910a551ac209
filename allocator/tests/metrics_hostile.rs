//! The `/metrics` server (`vramscope_allocator::metrics`) against hostile clients, which the
//! tests build themselves: a header of 64 MiB is cut off at the server's limit of a request's
//! head, too many header lines are refused, and connections that send nothing, or a byte now
//! and then, are answered 503 or closed at their deadline, while a real scrape still succeeds
//! within a few seconds. The server runs inside the program being debugged: none of this may
//! cost it more than its few bounded buffers.

#![cfg(feature = "metrics")]

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use vramscope_allocator::metrics::{DeviceFigures, MetricsLimits, MetricsServer, StatsSource};
use vramscope_allocator::{CachingAllocator, SimDevice};
use vramscope_model::AllocatorConfig;

/// A server of one simulated device's statistics with `limits`.
fn server(limits: MetricsLimits) -> MetricsServer {
    let alloc = CachingAllocator::new(SimDevice::phantom(1 << 30), AllocatorConfig::default());
    let source: StatsSource = Box::new(move || vec![DeviceFigures::of(&alloc)]);
    MetricsServer::serve_source_with(source, "127.0.0.1:0", false, limits).expect("a server")
}

/// Sends `request` on a fresh connection and returns the whole response (empty when the server
/// closed without one).
fn exchange(server: &MetricsServer, request: &[u8]) -> String {
    let mut conn = TcpStream::connect(server.addr()).unwrap();
    conn.set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    conn.write_all(request).unwrap();
    read_response(&mut conn).unwrap_or_default()
}

/// Reads a response until the server closes the connection (a reset after the response is a
/// close too: the server may close a connection with bytes it did not read); `None` when the
/// read timed out.
fn read_response(conn: &mut TcpStream) -> Option<String> {
    let mut response = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match conn.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => response.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                return None
            }
            Err(_) => break,
        }
    }
    Some(String::from_utf8_lossy(&response).into_owned())
}

/// A normal scrape's response.
fn scrape(server: &MetricsServer) -> String {
    exchange(
        server,
        b"GET /metrics HTTP/1.1\r\nHost: localhost\r\nAccept: text/plain\r\n\r\n",
    )
}

#[test]
fn a_header_of_64_mib_is_cut_off_at_the_limit_and_scrapes_go_on() {
    let limits = MetricsLimits::default();
    let server = server(limits.clone());
    let mut conn = TcpStream::connect(server.addr()).unwrap();
    // A server that stopped reading without closing would block the writes: that is a failure
    // too, told apart from a closed connection by the error's kind.
    conn.set_write_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    conn.write_all(b"GET /metrics HTTP/1.1\r\nX-Big: ").unwrap();
    let chunk = vec![b'a'; 64 << 10];
    let total = 64usize << 20;
    let mut sent = 0usize;
    let mut cut = None;
    while sent < total {
        match conn.write(&chunk) {
            Ok(n) => sent += n,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => {
                cut = Some(e);
                break;
            }
        }
    }
    let cut = cut.unwrap_or_else(|| panic!("all {sent} bytes of the header were taken"));
    assert!(
        matches!(
            cut.kind(),
            ErrorKind::BrokenPipe | ErrorKind::ConnectionReset | ErrorKind::ConnectionAborted
        ),
        "the connection was not closed, the write failed with {cut}"
    );
    // What the kernel's socket buffers took besides the server's 8 KiB; never the 64 MiB.
    assert!(
        sent < 16 << 20,
        "{sent} bytes were taken before the connection closed"
    );
    drop(conn);

    let response = scrape(&server);
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    assert!(
        response.contains("vramscope_allocated_bytes{device=\"0\",pool=\"large\"} 0"),
        "{response}"
    );
}

#[test]
fn a_head_past_the_byte_or_header_line_limit_is_answered_431() {
    let limits = MetricsLimits::default();
    let server = server(limits.clone());
    let mut many = b"GET /metrics HTTP/1.1\r\n".to_vec();
    for i in 0..limits.max_headers + 1 {
        many.extend_from_slice(format!("X-{i}: y\r\n").as_bytes());
    }
    assert!(many.len() < limits.max_request_bytes, "the bytes fit");
    many.extend_from_slice(b"\r\n");
    let response = exchange(&server, &many);
    assert!(response.starts_with("HTTP/1.1 431"), "{response}");
    assert!(response.contains("64 header lines"), "{response}");

    // As many header lines as allowed are served.
    let mut enough = b"GET /metrics HTTP/1.1\r\n".to_vec();
    for i in 0..limits.max_headers {
        enough.extend_from_slice(format!("X-{i}: y\r\n").as_bytes());
    }
    enough.extend_from_slice(b"\r\n");
    let response = exchange(&server, &enough);
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");

    // One header line longer than the whole limit, sent whole (it fits the socket's buffers):
    // the server answers once it has read its limit.
    let mut long = b"GET /metrics HTTP/1.1\r\nX-Long: ".to_vec();
    long.resize(limits.max_request_bytes + 100, b'b');
    let mut conn = TcpStream::connect(server.addr()).unwrap();
    conn.set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    conn.write_all(&long).unwrap();
    let mut status = [0u8; 12];
    conn.read_exact(&mut status).unwrap();
    assert_eq!(&status, b"HTTP/1.1 431");

    for (request, want) in [
        (&b"nonsense\r\n\r\n"[..], "HTTP/1.1 400"),
        (b"POST /metrics HTTP/1.1\r\n\r\n", "HTTP/1.1 405"),
        (b"GET /other HTTP/1.1\r\n\r\n", "HTTP/1.1 404"),
    ] {
        let response = exchange(&server, request);
        assert!(response.starts_with(want), "{want}: {response}");
    }
}

#[test]
fn idle_and_slow_clients_do_not_keep_a_scrape_from_succeeding() {
    let mut limits = MetricsLimits::default();
    limits.request_timeout = Duration::from_millis(800);
    let server = server(limits.clone());
    // Four times as many connections as are served at once: some send nothing, some a byte.
    let clients: Vec<TcpStream> = (0..4 * limits.max_connections)
        .map(|i| {
            let mut conn = TcpStream::connect(server.addr()).unwrap();
            if i % 2 == 1 {
                conn.write_all(b"G").unwrap();
            }
            conn
        })
        .collect();

    // A scrape succeeds, at once or, while every slot is taken, after a refusal or two.
    let started = Instant::now();
    let mut refusals = 0;
    loop {
        let response = scrape(&server);
        if response.starts_with("HTTP/1.1 200") {
            break;
        }
        assert!(response.starts_with("HTTP/1.1 503"), "{response}");
        assert!(response.contains("Retry-After: 1"), "{response}");
        refusals += 1;
        assert!(
            started.elapsed() < Duration::from_secs(15),
            "no scrape succeeded in 15 s ({refusals} refused)"
        );
        std::thread::sleep(Duration::from_millis(100));
    }

    // Every hostile connection was answered and closed: 503 at once past the slots, 408 at
    // the request's deadline for those served.
    let mut busy = 0;
    for mut conn in clients {
        conn.set_read_timeout(Some(Duration::from_secs(20)))
            .unwrap();
        let response =
            read_response(&mut conn).expect("the connection is closed, not left waiting");
        if response.starts_with("HTTP/1.1 503") {
            busy += 1;
        } else {
            assert!(response.starts_with("HTTP/1.1 408"), "{response}");
        }
    }
    assert!(
        busy >= 2 * limits.max_connections,
        "only {busy} of {} connections past the slots were refused",
        4 * limits.max_connections
    );
    let response = scrape(&server);
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
}
