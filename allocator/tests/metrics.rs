//! The Prometheus `/metrics` endpoint (`vramscope_allocator::metrics`) over real HTTP: the
//! figures it serves are `memory_stats()`'s, other paths are 404, the text passes Prometheus's
//! own linter (`promtool check metrics`, from Debian's `prometheus` package), README's table
//! names every series with its type, and a real Prometheus server (the same package) scrapes
//! it every second: every series with its type, `up` 1, the capacity, a counter's `rate()`,
//! and the last figures served after the run ends (`VRAMSCOPE_METRICS_LINGER`); a real
//! Pushgateway (`prometheus-pushgateway`) receives them at the end (`VRAMSCOPE_METRICS_PUSH`).
//! Each check against a Debian binary says it was skipped where the binary is absent.

#![cfg(feature = "metrics")]

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use vramscope_allocator::metrics::{AtEnd, MetricsServer, PushTarget, CONTENT_TYPE};
use vramscope_allocator::{Backend, CachingAllocator, SimDevice};
use vramscope_model::AllocatorConfig;
use vramscope_testkit::prometheus::{served_types, Prometheus, Pushgateway};
use vramscope_testkit::{check_with_promtool, http_get};

/// `GET path` on `server`; returns the status line, the headers and the body.
fn get(server: &MetricsServer, path: &str) -> (String, String, String) {
    http_get(&server.addr().to_string(), path)
}

/// The value of the series whose line starts with `series`.
fn value(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series))
        .and_then(|rest| rest.trim().parse().ok())
}

#[test]
fn metrics_serve_memory_stats_and_pass_promtool() {
    let device0 = CachingAllocator::new(SimDevice::phantom(1 << 34), AllocatorConfig::default());
    let device1 = CachingAllocator::new(
        SimDevice::with_index(1 << 34, false, 1),
        AllocatorConfig::default(),
    );
    let _weights = device0.alloc(100 << 20).unwrap();
    let _small = device0.alloc(4096).unwrap();
    let _other = device1.alloc(30 << 20).unwrap();
    drop(device0.alloc(8 << 20).unwrap());
    let server = MetricsServer::serve(&[device0.clone(), device1.clone()], "127.0.0.1:0", false)
        .expect("a loopback server");

    let (status, headers, body) = get(&server, "/metrics");
    assert!(status.contains("200"), "{status}");
    assert!(headers.contains(CONTENT_TYPE), "{headers}");
    for (device, alloc) in [(0, &device0), (1, &device1)] {
        let stats = alloc.stats();
        let mut pools = 0.0;
        for (pool, figure) in [
            ("large", stats.allocated_bytes.large_pool),
            ("small", stats.allocated_bytes.small_pool),
        ] {
            let series =
                format!("vramscope_allocated_bytes{{device=\"{device}\",pool=\"{pool}\"}}");
            let served = value(&body, &series);
            assert_eq!(served, Some(figure.current as f64), "{series}\n{body}");
            pools += served.unwrap();
        }
        // The pools sum to PyTorch's `all`: nothing is counted twice.
        assert_eq!(pools, stats.allocated_bytes.all.current as f64);
        let series = format!("vramscope_reserved_peak_bytes{{device=\"{device}\"}}");
        assert_eq!(
            value(&body, &series),
            Some(stats.reserved_bytes.all.peak as f64)
        );
        let series =
            format!("vramscope_allocated_added_blocks_total{{device=\"{device}\",pool=\"large\"}}");
        assert_eq!(
            value(&body, &series),
            Some(stats.allocation.large_pool.allocated as f64)
        );
        let series = format!("vramscope_device_allocs_total{{device=\"{device}\"}}");
        assert_eq!(value(&body, &series), Some(stats.num_device_alloc as f64));
        let series = format!("vramscope_device_capacity_bytes{{device=\"{device}\"}}");
        assert_eq!(value(&body, &series), Some((1u64 << 34) as f64));
        let series = format!("vramscope_device_free_bytes{{device=\"{device}\"}}");
        let free = alloc.backend().mem_info().free;
        assert_eq!(value(&body, &series), Some(free as f64));
    }
    // The figures are read at each scrape.
    let _more = device0.alloc(50 << 20).unwrap();
    let (_, _, later) = get(&server, "/metrics");
    let series = "vramscope_allocated_bytes{device=\"0\",pool=\"large\"}";
    assert_eq!(
        value(&later, series),
        Some(device0.stats().allocated_bytes.large_pool.current as f64)
    );

    let (status, _, _) = get(&server, "/other");
    assert!(status.contains("404"), "{status}");

    check_with_promtool(&later);
    server.shutdown();
}

/// The rows of README's metrics table: series name to (type, unit, PyTorch key).
fn readme_table() -> BTreeMap<String, (String, String, String)> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../README.md");
    let readme = std::fs::read_to_string(path).expect("README.md");
    let start = readme
        .find("| Series | Type | Unit |")
        .expect("README has the metrics table");
    readme[start..]
        .lines()
        .skip(2)
        .take_while(|l| l.starts_with('|'))
        .map(|row| {
            let cells: Vec<String> = row
                .split('|')
                .map(|c| c.trim().trim_matches('`').to_string())
                .collect();
            (
                cells[1].clone(),
                (cells[2].clone(), cells[3].clone(), cells[4].clone()),
            )
        })
        .collect()
}

#[test]
fn readme_lists_every_series_with_its_type_and_unit() {
    let alloc = CachingAllocator::new(SimDevice::phantom(1 << 30), AllocatorConfig::default());
    let served = served_types(&vramscope_allocator::metrics::render(&[alloc]));
    let table = readme_table();
    let listed: BTreeMap<String, String> = table
        .iter()
        .map(|(name, (kind, _, _))| (name.clone(), kind.clone()))
        .collect();
    assert_eq!(listed, served, "README's metrics table and /metrics differ");
    for (name, (kind, unit, key)) in &table {
        assert!(!key.is_empty(), "{name} names no memory_stats() key");
        let suffix = if kind == "counter" {
            name.strip_suffix("_total")
                .expect("a counter ends in _total")
        } else {
            name
        };
        if ["bytes", "blocks", "segments", "ratio"].contains(&unit.as_str()) {
            assert!(suffix.ends_with(&format!("_{unit}")), "{name}: unit {unit}");
        }
    }
}

#[test]
fn the_grafana_dashboard_uses_only_metrics_that_are_served() {
    let path =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/grafana-vramscope.json");
    let dashboard = std::fs::read_to_string(&path).expect("the example dashboard");
    let served = vramscope_allocator::metrics::render(&[CachingAllocator::new(
        SimDevice::phantom(1 << 30),
        AllocatorConfig::default(),
    )]);
    let mut names = 0;
    for (at, _) in dashboard.match_indices("vramscope_") {
        let name: String = dashboard[at..]
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        names += 1;
        assert!(
            served.lines().any(|l| l.starts_with(&format!("{name}{{"))),
            "the dashboard queries {name}, which /metrics does not serve"
        );
    }
    assert!(names >= 5, "the dashboard queries the metrics");
}

/// A real Prometheus scrapes a server while its allocator works, then after the run ends:
/// every series arrives with its type, `up` is 1, the capacity is the device's, a counter's
/// `rate()` is positive, and the last figures are still served (and scraped) for the linger.
#[test]
fn a_real_prometheus_scrapes_the_counters_the_capacity_and_the_last_values() {
    let capacity: u64 = 3 << 30;
    let alloc = CachingAllocator::new(SimDevice::phantom(capacity), AllocatorConfig::default());
    let mut server = MetricsServer::serve(std::slice::from_ref(&alloc), "127.0.0.1:0", false)
        .expect("a loopback server");
    let linger = Duration::from_secs(6);
    server.set_at_end(AtEnd {
        linger: Some(linger),
        ..AtEnd::default()
    });
    let target = server.addr().to_string();
    let Some(prometheus) = Prometheus::start(&[("alloc", &target)]) else {
        return;
    };
    // The program works: it allocates and frees while Prometheus scrapes, until the counter's
    // rate is seen.
    let kept = alloc.alloc(64 << 20).unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let worker = {
        let (alloc, stop) = (alloc.clone(), stop.clone());
        std::thread::spawn(move || {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                drop(alloc.alloc(4 << 20).unwrap());
                alloc.mark_step();
                std::thread::sleep(Duration::from_millis(50));
            }
        })
    };
    let timeout = Duration::from_secs(60);
    prometheus.wait_for(
        "rate(vramscope_allocated_added_bytes_total{job=\"alloc\",pool=\"large\"}[5s])",
        timeout,
        |r| r.len() == 1 && r[0].1 > 0.0,
    );
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    worker.join().unwrap();
    let up = prometheus.query("up{job=\"alloc\"}");
    assert_eq!(up.len(), 1);
    assert_eq!(up[0].1, 1.0);
    prometheus.assert_has_every_family("alloc", &get(&server, "/metrics").2);
    let found = prometheus.query("vramscope_device_capacity_bytes{job=\"alloc\",device=\"0\"}");
    assert_eq!(found.len(), 1);
    assert_eq!(found[0].1, capacity as f64);

    // The run ends with one more tensor kept: its figures are the last, and they stay.
    let _last = alloc.alloc(32 << 20).unwrap();
    let last = alloc.stats().allocated_bytes.large_pool.current as f64;
    let ended = Instant::now();
    let ending = std::thread::spawn(move || server.shutdown());
    let ended_unix = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    // A scrape that began after the end, and succeeded, has the last figures.
    prometheus.wait_for(
        &format!("timestamp(up{{job=\"alloc\"}}) > {ended_unix} and up{{job=\"alloc\"}} == 1"),
        linger,
        |r| r.len() == 1,
    );
    let found = prometheus.query("vramscope_allocated_bytes{job=\"alloc\",pool=\"large\"}");
    assert_eq!(found.len(), 1);
    assert_eq!(found[0].1, last);
    ending.join().unwrap();
    assert!(
        ended.elapsed() >= linger,
        "the server stopped before its linger"
    );
    // After the linger, the endpoint is gone: Prometheus says so.
    prometheus.wait_for("up{job=\"alloc\"} == 0", Duration::from_secs(10), |r| {
        r.len() == 1
    });
    drop(kept);
}

/// At the end of the run, the last figures go to a real Pushgateway, under the job
/// `vramscope`, within the push's deadline.
#[test]
fn the_last_values_are_pushed_to_a_real_pushgateway() {
    let Some(gateway) = Pushgateway::start() else {
        return;
    };
    let alloc = CachingAllocator::new(SimDevice::phantom(1 << 30), AllocatorConfig::default());
    let _kept = alloc.alloc(10 << 20).unwrap();
    let mut server = MetricsServer::serve(std::slice::from_ref(&alloc), "127.0.0.1:0", false)
        .expect("a loopback server");
    let push = PushTarget::parse(&format!("http://{}", gateway.addr()), None).unwrap();
    server.set_at_end(AtEnd {
        push: Some(push),
        ..AtEnd::default()
    });
    let _last = alloc.alloc(5 << 20).unwrap();
    let last = alloc.stats().allocated_bytes.large_pool.current;
    let started = Instant::now();
    server.shutdown();
    assert!(started.elapsed() < Duration::from_secs(3));
    let pushed = gateway.metrics();
    let series =
        "vramscope_allocated_bytes{device=\"0\",instance=\"\",job=\"vramscope\",pool=\"large\"}";
    assert_eq!(value(&pushed, series), Some(last as f64), "{pushed}");
    assert!(
        pushed.contains("# TYPE vramscope_ooms_total counter"),
        "{pushed}"
    );
}
