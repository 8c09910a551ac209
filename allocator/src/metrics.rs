//! Prometheus metrics: the allocators' statistics on `/metrics`, for the cluster's own
//! Prometheus and Grafana.
//!
//! Where users outgrow one machine they already watch the fleet with Prometheus; vramscope
//! feeds it rather than replacing it. [`MetricsServer::serve`] (or [`MetricsServer::from_env`]
//! with `VRAMSCOPE_METRICS=127.0.0.1:9400`) starts one background thread with a small HTTP
//! server (tiny_http) that answers `GET /metrics` in the Prometheus text exposition format
//! (version 0.0.4, written by the prometheus-client crate). Each scrape reads every
//! allocator's [`MemoryStats`] once, so the figures are those `memory_stats()` gives at that
//! moment; nothing is kept between scrapes and the allocators never wait for the server.
//!
//! The names are PyTorch's statistics, one family per statistic with `device`, `pool`
//! (`all`, `large`, `small`) and `stat` (`current`, `peak`, `allocated`, `freed`) labels:
//! `vramscope_allocated_bytes`, `vramscope_reserved_bytes`, `vramscope_active_bytes`,
//! `vramscope_inactive_split_bytes`, `vramscope_requested_bytes`, `vramscope_allocations`,
//! `vramscope_active_allocations`, `vramscope_segments`, `vramscope_inactive_split_blocks`;
//! the counters `vramscope_alloc_retries_total`, `vramscope_ooms_total`,
//! `vramscope_device_allocs_total`, `vramscope_device_frees_total`; and
//! `vramscope_fragmentation_ratio`, the share of reserved memory not allocated. A `rank` label
//! (from `RANK`, else `LOCAL_RANK`) is on every series when the variable is set. Like the
//! telemetry socket (`crate::telemetry`), the server listens on loopback unless told otherwise.

use std::borrow::Cow;
use std::fmt;
use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;

use crate::backend::Backend;
use crate::caching::CachingAllocator;
use vramscope_model::{MemoryStats, Stat, StatArray};

/// The environment variable naming the address to serve metrics on.
pub const ENV_METRICS: &str = "VRAMSCOPE_METRICS";

/// The environment variable that allows a non-loopback metrics address.
pub const ENV_METRICS_ALLOW_REMOTE: &str = "VRAMSCOPE_METRICS_ALLOW_REMOTE";

/// The content type of the Prometheus text exposition format.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Why a metrics server could not start.
#[derive(Debug)]
#[non_exhaustive]
pub enum MetricsError {
    /// The address is not `HOST:PORT`.
    BadAddress(String),
    /// The address is not on the loopback interface and remote addresses were not allowed.
    NotLoopback(SocketAddr),
    /// The server could not listen.
    Listen(String),
}

impl fmt::Display for MetricsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MetricsError::BadAddress(a) => {
                write!(f, "bad metrics address `{a}` (expected HOST:PORT)")
            }
            MetricsError::NotLoopback(a) => write!(
                f,
                "metrics address {a} is not on the loopback interface (set {ENV_METRICS_ALLOW_REMOTE}=1 to allow it)"
            ),
            MetricsError::Listen(e) => write!(f, "cannot serve metrics: {e}"),
        }
    }
}

impl std::error::Error for MetricsError {}

/// Reads one statistic of a [`MemoryStats`].
type StatOf = fn(&MemoryStats) -> &StatArray;

/// The statistic families: metric name, help, and the statistic.
const FAMILIES: [(&str, &str, StatOf); 9] = [
    (
        "vramscope_allocated_bytes",
        "Bytes in allocated blocks (PyTorch's allocated_bytes).",
        |s| &s.allocated_bytes,
    ),
    (
        "vramscope_reserved_bytes",
        "Bytes reserved from the device in segments (reserved_bytes).",
        |s| &s.reserved_bytes,
    ),
    (
        "vramscope_active_bytes",
        "Bytes in allocated blocks and blocks waiting on other streams (active_bytes).",
        |s| &s.active_bytes,
    ),
    (
        "vramscope_inactive_split_bytes",
        "Free bytes in segments that also hold active blocks (inactive_split_bytes).",
        |s| &s.inactive_split_bytes,
    ),
    (
        "vramscope_requested_bytes",
        "Bytes the program asked for in allocated blocks (requested_bytes).",
        |s| &s.requested_bytes,
    ),
    (
        "vramscope_allocations",
        "Allocated blocks (allocation).",
        |s| &s.allocation,
    ),
    (
        "vramscope_active_allocations",
        "Allocated blocks and blocks waiting on other streams (active).",
        |s| &s.active,
    ),
    (
        "vramscope_segments",
        "Segments reserved from the device (segment).",
        |s| &s.segment,
    ),
    (
        "vramscope_inactive_split_blocks",
        "Free blocks in segments that also hold active blocks (inactive_split).",
        |s| &s.inactive_split,
    ),
];

/// What a scrape reads: the statistics of every device served, as `(device, stats)`.
pub type StatsSource = Box<dyn Fn() -> Vec<(u32, MemoryStats)> + Send + Sync>;

/// Reads the statistics of every allocator at each scrape.
struct StatsCollector {
    source: StatsSource,
}

impl fmt::Debug for StatsCollector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("StatsCollector")
    }
}

type Labels = Vec<(&'static str, String)>;

impl Collector for StatsCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), fmt::Error> {
        let all = (self.source)();
        let device_label = |device: u32| -> Labels { vec![("device", device.to_string())] };
        // One family per statistic, every device, pool and stat in it.
        for (name, help, stat_of) in FAMILIES {
            let mut family = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
            for (device, stats) in &all {
                let array = stat_of(stats);
                for (pool, stat) in [
                    ("all", &array.all),
                    ("large", &array.large_pool),
                    ("small", &array.small_pool),
                ] {
                    for (which, value) in stat_values(stat) {
                        let mut labels = device_label(*device);
                        labels.push(("pool", pool.to_string()));
                        labels.push(("stat", which.to_string()));
                        ConstGauge::new(value as i64).encode(family.encode_family(&labels)?)?;
                    }
                }
            }
        }
        type Count = fn(&MemoryStats) -> u64;
        let counters: [(&str, &str, Count); 4] = [
            (
                "vramscope_alloc_retries",
                "Allocations that failed, freed the cache and were tried again (num_alloc_retries).",
                |s| s.num_alloc_retries,
            ),
            (
                "vramscope_ooms",
                "Allocations that failed for good (num_ooms).",
                |s| s.num_ooms,
            ),
            (
                "vramscope_device_allocs",
                "Raw device allocations: segments and mapped pages (num_device_alloc).",
                |s| s.num_device_alloc,
            ),
            (
                "vramscope_device_frees",
                "Raw device frees: segments and unmapped pages (num_device_free).",
                |s| s.num_device_free,
            ),
        ];
        for (name, help, read) in counters {
            let mut family = encoder.encode_descriptor(name, help, None, MetricType::Counter)?;
            for (device, stats) in &all {
                ConstCounter::new(read(stats))
                    .encode(family.encode_family(&device_label(*device))?)?;
            }
        }
        let mut family = encoder.encode_descriptor(
            "vramscope_fragmentation_ratio",
            "Share of reserved memory that is not allocated (0 without reserved memory).",
            None,
            MetricType::Gauge,
        )?;
        for (device, stats) in &all {
            ConstGauge::new(fragmentation_ratio(stats))
                .encode(family.encode_family(&device_label(*device))?)?;
        }
        Ok(())
    }
}

/// `(stat label, value)` of one statistic.
fn stat_values(stat: &Stat) -> [(&'static str, u64); 4] {
    [
        ("current", stat.current),
        ("peak", stat.peak),
        ("allocated", stat.allocated),
        ("freed", stat.freed),
    ]
}

/// The share of reserved memory that is not allocated.
pub fn fragmentation_ratio(stats: &MemoryStats) -> f64 {
    let reserved = stats.reserved_bytes.all.current;
    if reserved == 0 {
        0.0
    } else {
        reserved.saturating_sub(stats.allocated_bytes.all.current) as f64 / reserved as f64
    }
}

/// The `rank` label of this process: `RANK`, else `LOCAL_RANK`, when set.
fn rank_label() -> Option<String> {
    ["RANK", "LOCAL_RANK"]
        .into_iter()
        .filter_map(|name| std::env::var(name).ok())
        .map(|v| v.trim().to_string())
        .find(|v| !v.is_empty())
}

/// The metrics of `allocators`, in the Prometheus text exposition format: what `/metrics`
/// answers.
pub fn render<B: Backend>(allocators: &[CachingAllocator<B>]) -> String {
    render_registry(&registry(source_of(allocators)))
}

/// The statistics of a fixed set of allocators.
fn source_of<B: Backend>(allocators: &[CachingAllocator<B>]) -> StatsSource {
    let allocators = allocators.to_vec();
    Box::new(move || allocators.iter().map(|a| (a.device(), a.stats())).collect())
}

fn registry(source: StatsSource) -> Registry {
    let labels: Vec<(Cow<'static, str>, Cow<'static, str>)> = rank_label()
        .map(|rank| (Cow::Borrowed("rank"), Cow::Owned(rank)))
        .into_iter()
        .collect();
    let mut registry = Registry::with_labels(labels.into_iter());
    registry.register_collector(Box::new(StatsCollector { source }));
    registry
}

fn render_registry(registry: &Registry) -> String {
    let mut text = String::new();
    // Writing into a String cannot fail.
    let _ = prometheus_client::encoding::prometheus_text::encode(&mut text, registry);
    text
}

/// A running `/metrics` server. Dropping it (or [`MetricsServer::shutdown`]) stops it.
pub struct MetricsServer {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl MetricsServer {
    /// Serves the metrics of `allocators` on `addr` (`HOST:PORT`; port 0 picks a free one).
    /// A non-loopback address is refused unless `allow_remote` is set.
    pub fn serve<B: Backend>(
        allocators: &[CachingAllocator<B>],
        addr: &str,
        allow_remote: bool,
    ) -> Result<MetricsServer, MetricsError> {
        MetricsServer::serve_source(source_of(allocators), addr, allow_remote)
    }

    /// Serves the statistics `source` reads at each scrape (for a set of allocators that
    /// grows, as the C ABI's per-device table does).
    pub fn serve_source(
        source: StatsSource,
        addr: &str,
        allow_remote: bool,
    ) -> Result<MetricsServer, MetricsError> {
        let wanted = addr
            .to_socket_addrs()
            .ok()
            .and_then(|mut a| a.next())
            .ok_or_else(|| MetricsError::BadAddress(addr.to_string()))?;
        if !wanted.ip().is_loopback() && !allow_remote {
            return Err(MetricsError::NotLoopback(wanted));
        }
        let server =
            tiny_http::Server::http(wanted).map_err(|e| MetricsError::Listen(e.to_string()))?;
        let bound = server
            .server_addr()
            .to_ip()
            .ok_or_else(|| MetricsError::Listen("not an IP address".to_string()))?;
        let registry = registry(source);
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = Arc::clone(&stop);
        let thread = std::thread::Builder::new()
            .name("vramscope-metrics".to_string())
            .spawn(move || {
                while !stopping.load(Ordering::Relaxed) {
                    match server.recv_timeout(Duration::from_millis(100)) {
                        Ok(Some(request)) => answer(request, &registry),
                        Ok(None) => {}
                        Err(_) => return,
                    }
                }
            })
            .map_err(|e| MetricsError::Listen(e.to_string()))?;
        Ok(MetricsServer {
            addr: bound,
            stop,
            thread: Some(thread),
        })
    }

    /// Serves from `VRAMSCOPE_METRICS` when it is set (and not `0`/`off`); `Ok(None)` when it
    /// is not. `VRAMSCOPE_METRICS_ALLOW_REMOTE=1` allows a non-loopback address.
    pub fn from_env(source: StatsSource) -> Result<Option<MetricsServer>, MetricsError> {
        let Ok(value) = std::env::var(ENV_METRICS) else {
            return Ok(None);
        };
        let value = value.trim();
        if value.is_empty() || value == "0" || value.eq_ignore_ascii_case("off") {
            return Ok(None);
        }
        let allow_remote = std::env::var(ENV_METRICS_ALLOW_REMOTE).is_ok_and(|v| v.trim() == "1");
        MetricsServer::serve_source(source, value, allow_remote).map(Some)
    }

    /// The address the server listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops the server and waits for its thread.
    pub fn shutdown(mut self) {
        self.stop_thread();
    }

    fn stop_thread(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for MetricsServer {
    fn drop(&mut self) {
        self.stop_thread();
    }
}

/// Answers one request: the metrics on `GET /metrics`, 404 elsewhere, 405 for other methods.
fn answer(request: tiny_http::Request, registry: &Registry) {
    let path = request.url().split('?').next().unwrap_or("");
    let response = if *request.method() != tiny_http::Method::Get {
        tiny_http::Response::from_string("only GET is served\n").with_status_code(405)
    } else if path == "/metrics" {
        let header =
            tiny_http::Header::from_bytes("Content-Type", CONTENT_TYPE).expect("a valid header");
        tiny_http::Response::from_string(render_registry(registry)).with_header(header)
    } else {
        tiny_http::Response::from_string("vramscope serves /metrics\n").with_status_code(404)
    };
    // A client that went away is not the program's problem.
    let _ = request.respond(response);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::SimDevice;
    use vramscope_model::AllocatorConfig;

    #[test]
    fn the_text_holds_every_family_with_the_allocators_figures() {
        let alloc = CachingAllocator::new(SimDevice::phantom(1 << 30), AllocatorConfig::default());
        let _kept = alloc.alloc(3 << 20).unwrap();
        let text = render(std::slice::from_ref(&alloc));
        let allocated = alloc.stats().allocated_bytes.all.current;
        assert!(
            text.contains(&format!(
                "vramscope_allocated_bytes{{device=\"0\",pool=\"all\",stat=\"current\"}} {allocated}"
            )),
            "{text}"
        );
        for name in [
            "# TYPE vramscope_reserved_bytes gauge",
            "# TYPE vramscope_alloc_retries_total counter",
            "vramscope_alloc_retries_total{device=\"0\"} 0",
            "vramscope_segments{device=\"0\",pool=\"large\",stat=\"current\"} 1",
            "vramscope_fragmentation_ratio{device=\"0\"}",
        ] {
            assert!(text.contains(name), "{name} missing from\n{text}");
        }
    }

    #[test]
    fn a_remote_address_needs_permission() {
        let alloc = CachingAllocator::new(SimDevice::phantom(1 << 30), AllocatorConfig::default());
        let refused = MetricsServer::serve(&[alloc], "8.8.8.8:9400", false);
        assert!(matches!(refused, Err(MetricsError::NotLoopback(_))));
    }
}
