//! `VRAMSCOPE_METRICS` on the demo: `vramscope demo` serves `/metrics` for its own allocator
//! while it trains, says where on standard error, and what it serves passes `promtool check
//! metrics` and reads the state the demo is in. A real Prometheus (Debian's `prometheus`)
//! scrapes the `--listen` demo every second: every series arrives with its type, `up` is 1,
//! the capacity is the demo device's, a counter's `rate()` moves, every query of the example
//! Grafana dashboard (variables filled as Grafana fills them) returns series, and the last
//! figures are still scraped after the run ends (`VRAMSCOPE_METRICS_LINGER`). `--headless`
//! reports the same simulated device.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{channel, Receiver};
use std::time::{Duration, Instant};

use vramscope_testkit::prometheus::{free_port, poll, url_encode, Prometheus};
use vramscope_testkit::{check_with_promtool, http_get};

/// The demo's simulated device: 4 GiB in every mode (`src/cli/demo.rs`, `SIM_CAPACITY`).
const DEMO_CAPACITY: f64 = (4u64 << 30) as f64;

/// Kills the demo when the test ends, passed or failed.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `vramscope demo` with `args` and `env` on the simulated device; its standard error
/// comes line by line on the receiver (read on a thread of its own, so the demo never blocks
/// on a full pipe).
fn demo(args: &[&str], env: &[(&str, &str)]) -> (Running, Receiver<String>) {
    let mut command = Command::new(env!("CARGO_BIN_EXE_vramscope"));
    command
        .arg("demo")
        .args(args)
        .env("VRAMSCOPE_BACKEND", "sim")
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    for (name, value) in env {
        command.env(name, value);
    }
    let mut child = command.spawn().expect("vramscope demo starts");
    let stderr = child.stderr.take().unwrap();
    let (send, lines) = channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if send.send(line).is_err() {
                break;
            }
        }
    });
    (Running(child), lines)
}

/// Waits for the demo's line that starts with `prefix` and returns the rest of it.
fn line_after(lines: &Receiver<String>, prefix: &str) -> String {
    // A step of the `--listen` demo's model takes seconds in a debug build on a busy machine.
    let deadline = Instant::now() + Duration::from_secs(180);
    let mut said = Vec::new();
    while let Some(left) = deadline.checked_duration_since(Instant::now()) {
        match lines.recv_timeout(left) {
            Ok(line) => {
                if let Some(rest) = line.strip_prefix(prefix) {
                    return rest.to_string();
                }
                said.push(line);
            }
            Err(_) => break,
        }
    }
    panic!("the demo did not say `{prefix}`:\n{said:#?}")
}

/// The body of `GET /metrics` at `addr`.
fn scrape(addr: &str) -> String {
    let (status, _, body) = http_get(addr, "/metrics");
    assert!(status.starts_with("HTTP/1.1 200"), "{status}");
    body
}

/// The sum of the samples of `name` on device 0 (over its pools).
fn value(text: &str, name: &str) -> f64 {
    let samples: Vec<f64> = text
        .lines()
        .filter(|l| l.starts_with(&format!("{name}{{device=\"0\"")))
        .filter_map(|l| l.rsplit_once(' ')?.1.parse().ok())
        .collect();
    assert!(!samples.is_empty(), "no {name} in\n{text}");
    samples.iter().sum()
}

#[test]
fn the_demo_serves_its_allocator_on_metrics() {
    let dir = std::env::temp_dir().join(format!("vramscope-demo-metrics-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let socket = format!("unix:{}", dir.join("demo.sock").display());
    let (demo, lines) = demo(
        &["--steps", "6", "--listen", &socket],
        &[("VRAMSCOPE_METRICS", "127.0.0.1:0")],
    );
    let addr = line_after(&lines, "vramscope demo: serving /metrics on http://");
    let addr = addr.strip_suffix("/metrics").unwrap().to_string();
    // The demo trains a step every 150 ms, then rests for 3 s with its kept tensors alive. A
    // step allocates, so two scrapes 300 ms apart with the same count of allocations made are
    // of the demo at rest.
    let made = "vramscope_allocated_added_blocks_total";
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
    let allocated = "vramscope_allocated_bytes";
    let reserved = "vramscope_reserved_bytes";
    assert!(value(&first, allocated) > 0.0, "{first}");
    assert!(
        value(&first, reserved) >= value(&first, allocated),
        "{first}"
    );
    assert!(value(&first, "vramscope_device_allocs_total") >= 1.0);
    assert_eq!(
        value(&first, "vramscope_device_capacity_bytes"),
        DEMO_CAPACITY
    );
    assert_eq!(
        (value(&first, allocated), value(&first, reserved)),
        (value(&second, allocated), value(&second, reserved)),
        "the figures moved while the demo rested"
    );
    check_with_promtool(&first);
    drop(demo);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A Grafana dashboard query with its variables filled as Grafana fills them for "All" of
/// variables whose All is `.*`, and a 1 s scrape interval (`$__rate_interval` is then 4 s).
fn as_grafana_fills(expr: &str) -> String {
    expr.replace("$__rate_interval", "4s")
        .replace("$rank", ".*")
        .replace("$device", ".*")
}

#[test]
fn a_real_prometheus_scrapes_the_demo_and_every_dashboard_query_has_series() {
    let port = free_port();
    let target = format!("127.0.0.1:{port}");
    let Some(prometheus) = Prometheus::start(&[("demo", &target)]) else {
        return;
    };
    let dir = std::env::temp_dir().join(format!("vramscope-demo-prom-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let socket = format!("unix:{}", dir.join("demo.sock").display());
    let linger = Duration::from_secs(6);
    let (demo, lines) = demo(
        &["--steps", "4", "--listen", &socket],
        &[
            ("VRAMSCOPE_METRICS", &target),
            ("VRAMSCOPE_METRICS_LINGER", "6s"),
        ],
    );
    line_after(&lines, "vramscope demo: serving /metrics on http://");
    let timeout = Duration::from_secs(120);
    // A counter's rate moves while the demo trains.
    prometheus.wait_for(
        "sum without (pool) (rate(vramscope_allocated_added_bytes_total{job=\"demo\"}[5s])) > 0",
        timeout,
        |r| r.len() == 1,
    );
    let up = prometheus.query("up{job=\"demo\"}");
    assert_eq!((up.len(), up[0].1), (1, 1.0), "{up:?}");
    let capacity = prometheus.query("vramscope_device_capacity_bytes{job=\"demo\"}");
    assert_eq!(capacity.len(), 1);
    assert_eq!(capacity[0].1, DEMO_CAPACITY);
    // Every series the demo serves is in Prometheus with the type it was served with.
    prometheus.assert_has_every_family("demo", &scrape(&target));

    // The dashboard: its variables resolve (the rank has no values without RANK, so Grafana
    // offers only All, `.*`), and every panel's one query returns series.
    let path =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/grafana-vramscope.json");
    let dashboard: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    for variable in dashboard["templating"]["list"].as_array().unwrap() {
        let Some(query) = variable["query"].as_str() else {
            continue;
        };
        let Some(inner) = query
            .strip_prefix("label_values(")
            .and_then(|q| q.strip_suffix(')'))
        else {
            continue;
        };
        assert_eq!(variable["allValue"], ".*", "{variable}");
        assert_eq!(variable["includeAll"], true, "{variable}");
        let (metric, label) = inner.split_once(", ").unwrap();
        let values = prometheus.api(&format!(
            "label/{label}/values?{}={}",
            url_encode("match[]"),
            url_encode(metric)
        ));
        let expected = if label == "rank" { 0 } else { 1 };
        assert_eq!(
            values.as_array().unwrap().len(),
            expected,
            "{query}: {values}"
        );
    }
    let mut panels = 0;
    for panel in dashboard["panels"].as_array().unwrap() {
        let targets = panel["targets"].as_array().unwrap();
        assert_eq!(targets.len(), 1, "one query per panel: {}", panel["title"]);
        let expr = as_grafana_fills(targets[0]["expr"].as_str().unwrap());
        assert!(!expr.contains('$'), "{expr}");
        prometheus.wait_for(&expr, timeout, |r| !r.is_empty());
        panels += 1;
    }
    assert!(panels >= 10);

    // The run ends: the last figures are served for the linger, and scraped.
    let said = line_after(&lines, "vramscope: serving the last metrics on ");
    let ended = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    assert!(said.contains(&target), "{said}");
    let last = scrape(&target);
    prometheus.wait_for(
        &format!("timestamp(up{{job=\"demo\"}}) > {ended} and up{{job=\"demo\"}} == 1"),
        linger,
        |r| r.len() == 1,
    );
    for name in ["vramscope_allocated_bytes", "vramscope_step"] {
        let found = prometheus.query(&format!("sum(sum without (pool) ({name}{{job=\"demo\"}}))"));
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].1, value(&last, name), "{name}");
    }
    assert_eq!(value(&last, "vramscope_step"), 4.0);
    // The demo exits once the linger is over.
    let mut demo = demo;
    let status = poll("the demo's exit", Duration::from_secs(30), || {
        demo.0.try_wait().unwrap()
    });
    assert!(status.success(), "{status}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_headless_demo_reports_the_same_device_and_lingers() {
    let (demo, lines) = demo(
        &["--headless", "--steps", "3"],
        &[
            ("VRAMSCOPE_METRICS", "127.0.0.1:0"),
            ("VRAMSCOPE_METRICS_LINGER", "3s"),
        ],
    );
    let said = line_after(&lines, "vramscope: serving the last metrics on http://");
    let addr = said.split('/').next().unwrap().to_string();
    let last = scrape(&addr);
    assert_eq!(
        value(&last, "vramscope_device_capacity_bytes"),
        DEMO_CAPACITY
    );
    assert_eq!(value(&last, "vramscope_step"), 3.0);
    check_with_promtool(&last);
    drop(demo);
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
