//! `VRAMSCOPE_METRICS` on the demo: `vramscope demo` serves `/metrics` for its own allocator
//! while it trains, says where on standard error, and what it serves passes `promtool check
//! metrics` and reads the state the demo is in (memory allocated and reserved, and the same
//! figures twice while the demo rests with its kept tensors alive).

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use vramscope_testkit::{check_with_promtool, http_get};

/// Kills the demo when the test ends, passed or failed.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The body of `GET /metrics` at `addr`.
fn scrape(addr: &str) -> String {
    let (status, _, body) = http_get(addr, "/metrics");
    assert!(status.starts_with("HTTP/1.1 200"), "{status}");
    body
}

/// The value of the series whose line starts with `series`.
fn value(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(series))
        .and_then(|rest| rest.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {series} in\n{text}"))
}

#[test]
fn the_demo_serves_its_allocator_on_metrics() {
    let dir = std::env::temp_dir().join(format!("vramscope-demo-metrics-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let socket = dir.join("demo.sock");
    let child = Command::new(env!("CARGO_BIN_EXE_vramscope"))
        .args(["demo", "--steps", "6", "--listen"])
        .arg(format!("unix:{}", socket.display()))
        .env("VRAMSCOPE_METRICS", "127.0.0.1:0")
        .env("VRAMSCOPE_BACKEND", "sim")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("vramscope demo starts");
    let mut demo = Running(child);
    let mut lines = BufReader::new(demo.0.stderr.take().unwrap()).lines();
    let mut said = Vec::new();
    let mut addr = None;
    for line in lines.by_ref() {
        let line = line.unwrap();
        if let Some(rest) = line.strip_prefix("vramscope demo: serving /metrics on http://") {
            addr = rest.strip_suffix("/metrics").map(str::to_string);
        }
        said.push(line);
        if addr.is_some() {
            break;
        }
    }
    // The demo goes on writing to standard error; a closed pipe would end it.
    let drain = std::thread::spawn(move || lines.count());
    let addr = addr.unwrap_or_else(|| panic!("the demo did not say where /metrics is:\n{said:#?}"));
    // The demo trains a step every 150 ms, then rests for 3 s with its kept tensors alive. A
    // step allocates, so two scrapes 300 ms apart with the same count of allocations made are
    // of the demo at rest.
    let made = "vramscope_allocations{device=\"0\",pool=\"all\",stat=\"allocated\"}";
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut first = scrape(&addr);
    let second = loop {
        std::thread::sleep(Duration::from_millis(300));
        let next = scrape(&addr);
        if value(&next, made) == value(&first, made) {
            break next;
        }
        assert!(Instant::now() < deadline, "the demo never came to rest");
        first = next;
    };
    let allocated = "vramscope_allocated_bytes{device=\"0\",pool=\"all\",stat=\"current\"}";
    let reserved = "vramscope_reserved_bytes{device=\"0\",pool=\"all\",stat=\"current\"}";
    assert!(value(&first, allocated) > 0.0, "{first}");
    assert!(
        value(&first, reserved) >= value(&first, allocated),
        "{first}"
    );
    assert!(value(&first, "vramscope_device_allocs_total{device=\"0\"}") >= 1.0);
    assert_eq!(
        (value(&first, allocated), value(&first, reserved)),
        (value(&second, allocated), value(&second, reserved)),
        "the figures moved while the demo rested"
    );
    check_with_promtool(&first);
    drop(demo);
    let _ = drain.join();
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn an_address_the_demo_cannot_serve_is_an_error_naming_it() {
    let output = Command::new(env!("CARGO_BIN_EXE_vramscope"))
        .args(["demo", "--headless", "--steps", "2"])
        .env("VRAMSCOPE_METRICS", "10.255.255.1:9400")
        .env("VRAMSCOPE_BACKEND", "sim")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "{stderr}");
    assert!(
        stderr.contains("VRAMSCOPE_METRICS") && stderr.contains("10.255.255.1"),
        "{stderr}"
    );
}
