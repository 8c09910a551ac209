//! The Prometheus `/metrics` endpoint (`vramscope_allocator::metrics`) over real HTTP: the
//! allocated figure it serves is `memory_stats()`'s, other paths are 404, and the text passes
//! Prometheus's own linter (`promtool check metrics`, from Debian's `prometheus` package; the
//! check says it was skipped where promtool is absent).

#![cfg(feature = "metrics")]

use vramscope_allocator::metrics::{MetricsServer, CONTENT_TYPE};
use vramscope_allocator::{CachingAllocator, SimDevice};
use vramscope_model::AllocatorConfig;
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
        for (pool, figure) in [
            ("all", stats.allocated_bytes.all),
            ("large", stats.allocated_bytes.large_pool),
            ("small", stats.allocated_bytes.small_pool),
        ] {
            let series = format!(
                "vramscope_allocated_bytes{{device=\"{device}\",pool=\"{pool}\",stat=\"current\"}}"
            );
            assert_eq!(
                value(&body, &series),
                Some(figure.current as f64),
                "{series}\n{body}"
            );
        }
        let series =
            format!("vramscope_reserved_bytes{{device=\"{device}\",pool=\"all\",stat=\"peak\"}}");
        assert_eq!(
            value(&body, &series),
            Some(stats.reserved_bytes.all.peak as f64)
        );
        let series = format!("vramscope_device_allocs_total{{device=\"{device}\"}}");
        assert_eq!(value(&body, &series), Some(stats.num_device_alloc as f64));
    }
    // The figures are read at each scrape.
    let _more = device0.alloc(50 << 20).unwrap();
    let (_, _, later) = get(&server, "/metrics");
    let series = "vramscope_allocated_bytes{device=\"0\",pool=\"all\",stat=\"current\"}";
    assert_eq!(
        value(&later, series),
        Some(device0.stats().allocated_bytes.all.current as f64)
    );

    let (status, _, _) = get(&server, "/other");
    assert!(status.contains("404"), "{status}");

    check_with_promtool(&later);
    server.shutdown();
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
