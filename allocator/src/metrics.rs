//! Prometheus metrics: the allocators' statistics on `/metrics`, for the cluster's own
//! Prometheus and Grafana.
//!
//! Where users outgrow one machine they already watch the fleet with Prometheus; vramscope
//! feeds it rather than replacing it. [`MetricsServer::serve`] (or [`MetricsServer::from_env`]
//! with `VRAMSCOPE_METRICS=127.0.0.1:9400`) starts one background thread with a small HTTP
//! server of its own that answers `GET /metrics` in the Prometheus text exposition format
//! (version 0.0.4, written by the prometheus-client crate). Each scrape reads every
//! allocator's [`MemoryStats`] once, so the figures are those `memory_stats()` gives at that
//! moment; nothing is kept between scrapes and the allocators never wait for the server.
//!
//! The series follow the exporters' conventions (node_exporter, DCGM exporter): a unit suffix
//! on every gauge (`_bytes`, `_blocks`, `_segments`), `_total` only on counters, and families
//! that can be summed over any label without counting a byte twice. Each of PyTorch's
//! statistics becomes three kinds of series ([`STATISTICS`]): the current value as a gauge per
//! `pool` (`large`, `small`: there is no `all` beside them, `sum by (device)` is it), the peak
//! of both pools together as a gauge without a `pool` label (a peak is not the sum of the
//! pools' peaks), and PyTorch's running totals as two counters per pool, `…_added_…_total`
//! (PyTorch's `allocated`) and `…_removed_…_total` (`freed`). Beside them: the counters
//! `vramscope_alloc_retries_total`, `vramscope_ooms_total`, `vramscope_device_allocs_total`,
//! `vramscope_device_frees_total`; the device's capacity and free bytes as the driver (or the
//! simulated device) says them, the largest free block in the allocator's cache, the training
//! step, `vramscope_fragmentation_ratio`, and `vramscope_build_info`. README's metrics table
//! names every series with its type, unit and `memory_stats()` key. A `rank` label (from
//! `RANK`, else `LOCAL_RANK`) is on every series when the variable is set. Like the telemetry
//! socket (`crate::telemetry`), the server listens on loopback unless told otherwise.
//!
//! A short job's last values are kept: `VRAMSCOPE_METRICS_LINGER=30s` makes the server, when
//! it is dropped at the run's end, go on serving the figures of that moment for that long, and
//! `VRAMSCOPE_METRICS_PUSH=http://HOST:9091` pushes them to a Prometheus Pushgateway then, with
//! a deadline ([`PUSH_TIMEOUT`]) so that an unreachable gateway never holds the exit for long.
//!
//! The server runs inside the program being debugged, so nothing a client sends may cost that
//! program more than a few kilobytes or a thread for a few seconds: it reads only a request's
//! head, into a fixed buffer, within a deadline, on a bounded number of connections at once
//! ([`MetricsLimits`]; a general-purpose HTTP server buffers header lines without limit).
//! What a head asks for is decided by one pure function, [`parse_request`], which the server
//! calls on the bytes it read and the `metrics_request` fuzz target calls on any bytes.

use std::borrow::Cow;
use std::fmt;
use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;

use vramscope_caching::Backend;
use vramscope_caching::CachingAllocator;
use vramscope_model::{MemoryStats, Stat, StatArray};

/// The environment variable naming the address to serve metrics on.
pub const ENV_METRICS: &str = "VRAMSCOPE_METRICS";

/// The environment variable that allows a non-loopback metrics address.
pub const ENV_METRICS_ALLOW_REMOTE: &str = "VRAMSCOPE_METRICS_ALLOW_REMOTE";

/// The environment variable giving how long a server goes on serving the last figures after
/// the run ends (`30s`, `500ms`, `2m`, or plain seconds); unset or `0`, it stops at once.
pub const ENV_METRICS_LINGER: &str = "VRAMSCOPE_METRICS_LINGER";

/// The environment variable naming a Prometheus Pushgateway (`http://HOST:PORT`, optionally
/// with its own `/metrics/job/…` grouping path) to push the last figures to at the run's end.
pub const ENV_METRICS_PUSH: &str = "VRAMSCOPE_METRICS_PUSH";

/// The longest a push at the run's end may take, connecting, sending and reading the answer
/// together: an unreachable or slow gateway costs the exit at most this.
pub const PUSH_TIMEOUT: Duration = Duration::from_secs(3);

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
    /// `VRAMSCOPE_METRICS_LINGER` or `VRAMSCOPE_METRICS_PUSH` is not a value it takes.
    BadSetting(String),
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
            MetricsError::BadSetting(e) => f.write_str(e),
        }
    }
}

impl std::error::Error for MetricsError {}

/// Reads one statistic of a [`MemoryStats`].
type StatOf = fn(&MemoryStats) -> &StatArray;

/// One of PyTorch's statistics as it is served: `base` and `unit` make the names of its
/// series (`vramscope_{base}_{unit}` for the current value per pool, `vramscope_{base}_peak_{unit}`
/// for the peak, `vramscope_{base}_added_{unit}_total` and `vramscope_{base}_removed_{unit}_total`
/// for the running totals per pool), `key` is its name in `memory_stats()`.
#[derive(Clone, Copy, Debug)]
pub struct Statistic {
    /// The first part of the series' names, after `vramscope_`.
    pub base: &'static str,
    /// The unit: `bytes`, `blocks` or `segments`.
    pub unit: &'static str,
    /// The statistic's key in PyTorch's `memory_stats()` (`allocated_bytes`, `segment`, …).
    pub key: &'static str,
    /// What it counts, for the help text.
    pub what: &'static str,
    stat_of: StatOf,
}

impl Statistic {
    /// The gauge of the current value, per pool.
    pub fn current_name(&self) -> String {
        format!("vramscope_{}_{}", self.base, self.unit)
    }

    /// The gauge of the peak, both pools together.
    pub fn peak_name(&self) -> String {
        format!("vramscope_{}_peak_{}", self.base, self.unit)
    }

    /// The counter of PyTorch's `allocated` running total, per pool, with its `_total`.
    pub fn added_name(&self) -> String {
        format!("vramscope_{}_added_{}_total", self.base, self.unit)
    }

    /// The counter of PyTorch's `freed` running total, per pool, with its `_total`.
    pub fn removed_name(&self) -> String {
        format!("vramscope_{}_removed_{}_total", self.base, self.unit)
    }

    /// The statistic in `stats`.
    pub fn of<'a>(&self, stats: &'a MemoryStats) -> &'a StatArray {
        (self.stat_of)(stats)
    }
}

/// PyTorch's nine statistics, in `memory_stats()`'s order.
pub const STATISTICS: [Statistic; 9] = [
    Statistic {
        base: "allocated",
        unit: "bytes",
        key: "allocated_bytes",
        what: "Bytes in allocated blocks",
        stat_of: |s| &s.allocated_bytes,
    },
    Statistic {
        base: "reserved",
        unit: "bytes",
        key: "reserved_bytes",
        what: "Bytes reserved from the device in segments",
        stat_of: |s| &s.reserved_bytes,
    },
    Statistic {
        base: "active",
        unit: "bytes",
        key: "active_bytes",
        what: "Bytes in allocated blocks and blocks waiting on other streams",
        stat_of: |s| &s.active_bytes,
    },
    Statistic {
        base: "inactive_split",
        unit: "bytes",
        key: "inactive_split_bytes",
        what: "Free bytes in segments that also hold active blocks",
        stat_of: |s| &s.inactive_split_bytes,
    },
    Statistic {
        base: "requested",
        unit: "bytes",
        key: "requested_bytes",
        what: "Bytes the program asked for in allocated blocks",
        stat_of: |s| &s.requested_bytes,
    },
    Statistic {
        base: "allocated",
        unit: "blocks",
        key: "allocation",
        what: "Allocated blocks",
        stat_of: |s| &s.allocation,
    },
    Statistic {
        base: "active",
        unit: "blocks",
        key: "active",
        what: "Allocated blocks and blocks waiting on other streams",
        stat_of: |s| &s.active,
    },
    Statistic {
        base: "reserved",
        unit: "segments",
        key: "segment",
        what: "Segments reserved from the device",
        stat_of: |s| &s.segment,
    },
    Statistic {
        base: "inactive_split",
        unit: "blocks",
        key: "inactive_split",
        what: "Free blocks in segments that also hold active blocks",
        stat_of: |s| &s.inactive_split,
    },
];

/// Whether a server of this process has claimed `VRAMSCOPE_METRICS`.
static ENV_CLAIMED: AtomicBool = AtomicBool::new(false);

/// The address `VRAMSCOPE_METRICS` asks for, with whether a non-loopback one is allowed
/// (`VRAMSCOPE_METRICS_ALLOW_REMOTE=1`), for the first caller in this process; `None` when it is
/// unset, empty, `0` or `off`, or already claimed. A process has one such address whatever
/// faces it runs (the C library, a Python `SimAllocator`, `attach()`, a Rust program): the
/// first to start serves there, and the others do not fail binding the port again.
pub fn claim_env_addr() -> Option<(String, bool)> {
    let value = std::env::var(ENV_METRICS).ok()?;
    let value = value.trim();
    if value.is_empty() || value == "0" || value.eq_ignore_ascii_case("off") {
        return None;
    }
    if ENV_CLAIMED.swap(true, Ordering::SeqCst) {
        return None;
    }
    let allow_remote = std::env::var(ENV_METRICS_ALLOW_REMOTE).is_ok_and(|v| v.trim() == "1");
    Some((value.to_string(), allow_remote))
}

/// Gives `VRAMSCOPE_METRICS` back after the server that claimed it stopped or could not start,
/// so that the next face of the process may serve there.
pub fn release_env_claim() {
    ENV_CLAIMED.store(false, Ordering::SeqCst);
}

/// What a scrape reads of one device: its allocator's statistics, and what else is known of
/// it (`None` where the face serving it cannot say: PyTorch's own allocator under `attach()`
/// knows no capacity, for one).
#[derive(Clone, Debug, Default, PartialEq)]
#[non_exhaustive]
pub struct DeviceFigures {
    /// The device index, the `device` label.
    pub device: u32,
    /// PyTorch's `memory_stats()`.
    pub stats: MemoryStats,
    /// The device's total memory, as its driver (or the simulated device) says.
    pub capacity_bytes: Option<u64>,
    /// The device's free memory, as its driver (or the simulated device) says.
    pub free_bytes: Option<u64>,
    /// The largest free block in the allocator's cache.
    pub largest_free_block_bytes: Option<u64>,
    /// The training step (`mark_step`'s count).
    pub step: Option<u64>,
}

impl DeviceFigures {
    /// The figures of `device` where only its statistics are known.
    pub fn new(device: u32, stats: MemoryStats) -> DeviceFigures {
        DeviceFigures {
            device,
            stats,
            ..DeviceFigures::default()
        }
    }

    /// Everything `alloc` knows now: statistics, the device's capacity and free memory, the
    /// largest cached free block and the step. Each is read under its own short lock.
    pub fn of<B: Backend>(alloc: &CachingAllocator<B>) -> DeviceFigures {
        let info = alloc.backend().mem_info();
        // The CUDA backend answers 0 free bytes when the driver's call fails: that is the
        // driver saying nothing, not a full device, and a near-OOM alert must not fire on it.
        let driver_silent = info.free == 0 && alloc.backend().kind() == "cuda";
        DeviceFigures {
            device: alloc.device(),
            stats: alloc.stats(),
            capacity_bytes: (info.total > 0).then_some(info.total),
            free_bytes: (info.total > 0 && !driver_silent).then_some(info.free),
            largest_free_block_bytes: Some(alloc.largest_free_block()),
            step: Some(alloc.step()),
        }
    }
}

/// What a scrape reads: the figures of every device served.
pub type StatsSource = Box<dyn Fn() -> Vec<DeviceFigures> + Send + Sync>;

/// Where a scrape's figures come from: the source, or the figures frozen at the run's end.
struct Figures {
    source: StatsSource,
    frozen: Mutex<Option<Vec<DeviceFigures>>>,
}

impl Figures {
    fn read(&self) -> Vec<DeviceFigures> {
        let frozen = self.frozen.lock().unwrap_or_else(|e| e.into_inner());
        match frozen.as_ref() {
            Some(figures) => figures.clone(),
            None => {
                drop(frozen);
                (self.source)()
            }
        }
    }

    /// Reads the source one last time and serves that from now on.
    fn freeze(&self) -> Vec<DeviceFigures> {
        let last = (self.source)();
        *self.frozen.lock().unwrap_or_else(|e| e.into_inner()) = Some(last.clone());
        last
    }
}

/// Writes the series of the figures at each scrape.
struct StatsCollector {
    figures: Arc<Figures>,
}

impl fmt::Debug for StatsCollector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("StatsCollector")
    }
}

type Labels = Vec<(&'static str, String)>;

/// The pools of the per-pool series.
fn pools(array: &StatArray) -> [(&'static str, &Stat); 2] {
    [("large", &array.large_pool), ("small", &array.small_pool)]
}

/// A single-device figure: metric name, help, type, and its value where known.
type Single = (
    &'static str,
    &'static str,
    MetricType,
    fn(&DeviceFigures) -> Option<f64>,
);

/// The counters and gauges of one value per device.
const SINGLES: [Single; 9] = [
    (
        "vramscope_alloc_retries",
        "Allocations that failed, freed the cache and were tried again (num_alloc_retries).",
        MetricType::Counter,
        |f| Some(f.stats.num_alloc_retries as f64),
    ),
    (
        "vramscope_ooms",
        "Allocations that failed for good (num_ooms).",
        MetricType::Counter,
        |f| Some(f.stats.num_ooms as f64),
    ),
    (
        "vramscope_device_allocs",
        "Raw device allocations: segments and mapped pages (num_device_alloc).",
        MetricType::Counter,
        |f| Some(f.stats.num_device_alloc as f64),
    ),
    (
        "vramscope_device_frees",
        "Raw device frees: segments and unmapped pages (num_device_free).",
        MetricType::Counter,
        |f| Some(f.stats.num_device_free as f64),
    ),
    (
        "vramscope_device_capacity_bytes",
        "Total memory of the device, as its driver says (torch.cuda.mem_get_info()[1]).",
        MetricType::Gauge,
        |f| f.capacity_bytes.map(|v| v as f64),
    ),
    (
        "vramscope_device_free_bytes",
        "Free memory of the device, as its driver says (torch.cuda.mem_get_info()[0]).",
        MetricType::Gauge,
        |f| f.free_bytes.map(|v| v as f64),
    ),
    (
        "vramscope_largest_free_block_bytes",
        "The largest free block cached by the allocator: the largest request it serves without reserving more.",
        MetricType::Gauge,
        |f| f.largest_free_block_bytes.map(|v| v as f64),
    ),
    (
        "vramscope_step",
        "The training step: how many steps the program has marked.",
        MetricType::Gauge,
        |f| f.step.map(|v| v as f64),
    ),
    (
        "vramscope_fragmentation_ratio",
        "Share of reserved memory that is not allocated (0 without reserved memory).",
        MetricType::Gauge,
        |f| Some(fragmentation_ratio(&f.stats)),
    ),
];

impl Collector for StatsCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), fmt::Error> {
        let all = self.figures.read();
        let device_label = |device: u32| -> Labels { vec![("device", device.to_string())] };
        let pool_labels = |device: u32, pool: &str| -> Labels {
            vec![("device", device.to_string()), ("pool", pool.to_string())]
        };
        for statistic in &STATISTICS {
            let help = format!(
                "{} now, per pool ({}.large_pool/small_pool.current).",
                statistic.what, statistic.key
            );
            let name = statistic.current_name();
            let mut family = encoder.encode_descriptor(&name, &help, None, MetricType::Gauge)?;
            for figures in &all {
                for (pool, stat) in pools(statistic.of(&figures.stats)) {
                    ConstGauge::new(stat.current as i64)
                        .encode(family.encode_family(&pool_labels(figures.device, pool))?)?;
                }
            }
            let help = format!(
                "{}: the most at once, both pools together ({}.all.peak).",
                statistic.what, statistic.key
            );
            let name = statistic.peak_name();
            let mut family = encoder.encode_descriptor(&name, &help, None, MetricType::Gauge)?;
            for figures in &all {
                ConstGauge::new(statistic.of(&figures.stats).all.peak as i64)
                    .encode(family.encode_family(&device_label(figures.device))?)?;
            }
            for (name, which, read) in [
                (
                    statistic.added_name(),
                    "allocated",
                    (|s| s.allocated) as fn(&Stat) -> u64,
                ),
                (statistic.removed_name(), "freed", |s| s.freed),
            ] {
                let help = format!(
                    "{}: running total added (allocated) or removed (freed), per pool ({}.large_pool/small_pool.{which}).",
                    statistic.what, statistic.key
                );
                // The encoder adds the counter's `_total`.
                let name = name.strip_suffix("_total").unwrap_or(&name);
                let mut family =
                    encoder.encode_descriptor(name, &help, None, MetricType::Counter)?;
                for figures in &all {
                    for (pool, stat) in pools(statistic.of(&figures.stats)) {
                        ConstCounter::new(read(stat))
                            .encode(family.encode_family(&pool_labels(figures.device, pool))?)?;
                    }
                }
            }
        }
        for (name, help, kind, read) in SINGLES {
            let known: Vec<(u32, f64)> = all
                .iter()
                .filter_map(|f| read(f).map(|v| (f.device, v)))
                .collect();
            if known.is_empty() {
                continue;
            }
            let mut family = encoder.encode_descriptor(name, help, None, kind)?;
            for (device, value) in known {
                let labels = device_label(device);
                if matches!(kind, MetricType::Counter) {
                    ConstCounter::new(value as u64).encode(family.encode_family(&labels)?)?;
                } else {
                    ConstGauge::new(value).encode(family.encode_family(&labels)?)?;
                }
            }
        }
        let mut family = encoder.encode_descriptor(
            "vramscope_build_info",
            "The vramscope that serves these metrics: 1, with its version as a label.",
            None,
            MetricType::Gauge,
        )?;
        let labels: Labels = vec![("version", env!("CARGO_PKG_VERSION").to_string())];
        ConstGauge::new(1i64).encode(family.encode_family(&labels)?)?;
        Ok(())
    }
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
    render_source(source_of(allocators))
}

/// The metrics `source` reads now, in the Prometheus text exposition format.
pub fn render_source(source: StatsSource) -> String {
    render_registry(&registry(Arc::new(Figures {
        source,
        frozen: Mutex::new(None),
    })))
}

/// What a scrape of `allocators` reads: each one's [`DeviceFigures::of`].
pub fn source_of<B: Backend>(allocators: &[CachingAllocator<B>]) -> StatsSource {
    let allocators = allocators.to_vec();
    Box::new(move || allocators.iter().map(DeviceFigures::of).collect())
}

fn registry(figures: Arc<Figures>) -> Registry {
    let labels: Vec<(Cow<'static, str>, Cow<'static, str>)> = rank_label()
        .map(|rank| (Cow::Borrowed("rank"), Cow::Owned(rank)))
        .into_iter()
        .collect();
    let mut registry = Registry::with_labels(labels.into_iter());
    registry.register_collector(Box::new(StatsCollector { figures }));
    registry
}

fn render_registry(registry: &Registry) -> String {
    let mut text = String::new();
    // Writing into a String cannot fail.
    let _ = prometheus_client::encoding::prometheus_text::encode(&mut text, registry);
    text
}

/// The bounds of a `/metrics` server: whatever clients send, the server holds at most
/// `max_connections` requests of at most `max_request_bytes` each, for at most
/// `request_timeout` each. The defaults are the figures SECURITY.md states.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct MetricsLimits {
    /// The most bytes of a request's head, its request line and header lines together (8 KiB).
    /// A head that does not end within them is answered 431 and the connection closed: the
    /// server reads no further.
    pub max_request_bytes: usize,
    /// The most header lines of a request (64); more are answered 431.
    pub max_headers: usize,
    /// The time a client has, from its connection, to send the whole head of its request
    /// (5 s); a client that has not is answered 408 and closed.
    pub request_timeout: Duration,
    /// The time a client has to take the response (5 s), after which the connection closes.
    pub write_timeout: Duration,
    /// The most connections served at once (8). A connection past them is answered 503 at once
    /// and closed: none waits in a queue.
    pub max_connections: usize,
}

impl Default for MetricsLimits {
    fn default() -> MetricsLimits {
        MetricsLimits {
            max_request_bytes: 8 << 10,
            max_headers: 64,
            request_timeout: Duration::from_secs(5),
            write_timeout: Duration::from_secs(5),
            max_connections: 8,
        }
    }
}

/// How often the accepting thread looks for new connections and for a stop.
const ACCEPT_POLL: Duration = Duration::from_millis(20);

/// A running `/metrics` server. Dropping it (or [`MetricsServer::shutdown`]) stops it.
///
/// The server is small on purpose: one thread accepts connections, and each connection is
/// served by a thread of its own, at most [`MetricsLimits::max_connections`] at once. It reads
/// only the head of a request (the request line and the header lines, into a buffer of
/// [`MetricsLimits::max_request_bytes`] allocated once per connection), answers `GET /metrics`
/// with the metrics and anything else with an error status, and closes the connection: there
/// is no keep-alive and no request body is read. So whatever clients send, the server holds at
/// most `max_connections × max_request_bytes` of their bytes (64 KiB by default), and a client
/// holds a connection for at most `request_timeout + write_timeout`.
pub struct MetricsServer {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    figures: Arc<Figures>,
    registry: Arc<Registry>,
    at_end: AtEnd,
}

/// What a server does at the run's end, before it stops: from `VRAMSCOPE_METRICS_LINGER` and
/// `VRAMSCOPE_METRICS_PUSH`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AtEnd {
    /// How long to go on serving the last figures.
    pub linger: Option<Duration>,
    /// The Pushgateway to push the last figures to.
    pub push: Option<PushTarget>,
}

impl AtEnd {
    /// What `VRAMSCOPE_METRICS_LINGER` and `VRAMSCOPE_METRICS_PUSH` ask for; an error names the
    /// variable whose value is not one they take.
    pub fn from_env() -> Result<AtEnd, MetricsError> {
        let set = |name: &str| {
            std::env::var(name)
                .ok()
                .map(|v| v.trim().to_string())
                .filter(|v| !v.is_empty() && v != "0" && !v.eq_ignore_ascii_case("off"))
        };
        let linger = set(ENV_METRICS_LINGER)
            .map(|v| {
                parse_duration(&v).ok_or_else(|| {
                    MetricsError::BadSetting(format!(
                        "{ENV_METRICS_LINGER}={v}: expected a duration such as 30s, 500ms or 2m"
                    ))
                })
            })
            .transpose()?;
        let push = set(ENV_METRICS_PUSH)
            .map(|v| PushTarget::parse(&v, rank_label().as_deref()))
            .transpose()?;
        Ok(AtEnd { linger, push })
    }
}

/// A duration as `VRAMSCOPE_METRICS_LINGER` takes it: a number with `ms`, `s`, `m` or `h`, or
/// plain seconds; at most a day.
pub fn parse_duration(text: &str) -> Option<Duration> {
    let text = text.trim();
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let number: f64 = number.parse().ok()?;
    let seconds = match unit.trim() {
        "ms" => number / 1000.0,
        "" | "s" => number,
        "m" => number * 60.0,
        "h" => number * 3600.0,
        _ => return None,
    };
    (seconds.is_finite() && (0.0..=86_400.0).contains(&seconds))
        .then(|| Duration::from_secs_f64(seconds))
}

/// A Prometheus Pushgateway to push to: `http://HOST[:PORT]` (port 9091 when left out), with
/// the grouping path `/metrics/job/vramscope` (and `/rank/N` when the process has a rank), or
/// the URL's own `/metrics/job/…` path as it is. Only plain HTTP, to the host the URL names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PushTarget {
    /// `HOST:PORT`.
    pub authority: String,
    /// The path the metrics are put to, `/metrics/job/…`.
    pub path: String,
}

impl PushTarget {
    /// Reads `url`, adding the `rank` to the default grouping path when one is given.
    pub fn parse(url: &str, rank: Option<&str>) -> Result<PushTarget, MetricsError> {
        let bad = |why: &str| {
            MetricsError::BadSetting(format!(
                "{ENV_METRICS_PUSH}={url}: {why} (expected http://HOST:PORT, optionally with /metrics/job/NAME…)"
            ))
        };
        let rest = url
            .trim()
            .strip_prefix("http://")
            .ok_or_else(|| bad("not an http:// URL"))?;
        let (authority, path) = match rest.find('/') {
            Some(at) => rest.split_at(at),
            None => (rest, ""),
        };
        if authority.is_empty() || authority.contains('@') {
            return Err(bad("no host"));
        }
        let authority = if authority
            .rsplit_once(':')
            .is_some_and(|(_, p)| !p.is_empty() && p.chars().all(|c| c.is_ascii_digit()))
        {
            authority.to_string()
        } else {
            format!("{authority}:9091")
        };
        let path = path.trim_end_matches('/');
        let path = if path.is_empty() {
            let mut path = "/metrics/job/vramscope".to_string();
            if let Some(rank) = rank.filter(|r| r.chars().all(|c| c.is_ascii_alphanumeric())) {
                path.push_str("/rank/");
                path.push_str(rank);
            }
            path
        } else if path.starts_with("/metrics/job/") && !path.contains(char::is_whitespace) {
            path.to_string()
        } else {
            return Err(bad("a path other than /metrics/job/…"));
        };
        Ok(PushTarget { authority, path })
    }

    /// The URL pushed to.
    pub fn url(&self) -> String {
        format!("http://{}{}", self.authority, self.path)
    }

    /// Puts `body` (the text exposition format) to the gateway, replacing the group's metrics,
    /// within `timeout` for the whole exchange; the status code of its answer.
    pub fn push(&self, body: &str, timeout: Duration) -> Result<u16, String> {
        let deadline = Instant::now() + timeout;
        let left = || {
            deadline
                .checked_duration_since(Instant::now())
                .filter(|d| !d.is_zero())
                .ok_or_else(|| format!("no answer within {} ms", timeout.as_millis()))
        };
        let addrs = self
            .authority
            .to_socket_addrs()
            .map_err(|e| format!("cannot resolve {}: {e}", self.authority))?;
        let mut conn = None;
        let mut last_error = format!("{} resolves to no address", self.authority);
        for addr in addrs {
            match TcpStream::connect_timeout(&addr, left()?) {
                Ok(c) => {
                    conn = Some(c);
                    break;
                }
                Err(e) => last_error = format!("cannot connect to {addr}: {e}"),
            }
        }
        let mut conn = conn.ok_or(last_error)?;
        let head = format!(
            "PUT {} HTTP/1.1\r\nHost: {}\r\nContent-Type: {CONTENT_TYPE}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
            self.path,
            self.authority,
            body.len()
        );
        let io = |e: std::io::Error| format!("pushing to {}: {e}", self.url());
        conn.set_write_timeout(Some(left()?)).map_err(io)?;
        conn.write_all(head.as_bytes()).map_err(io)?;
        conn.write_all(body.as_bytes()).map_err(io)?;
        // Only the status line is read, into a fixed buffer.
        let mut answer = [0u8; 256];
        let mut len = 0;
        while len < answer.len() && !answer[..len].contains(&b'\n') {
            conn.set_read_timeout(Some(left()?)).map_err(io)?;
            match conn.read(&mut answer[len..]) {
                Ok(0) => break,
                Ok(n) => len += n,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(io(e)),
            }
        }
        let line = String::from_utf8_lossy(&answer[..len]);
        line.split(' ')
            .nth(1)
            .and_then(|code| code.trim().parse().ok())
            .filter(|_| line.starts_with("HTTP/"))
            .ok_or_else(|| format!("{} answered no HTTP status: {line:?}", self.url()))
    }
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
        MetricsServer::serve_source_with(source, addr, allow_remote, MetricsLimits::default())
    }

    /// [`MetricsServer::serve_source`] with bounds other than the default ones.
    pub fn serve_source_with(
        source: StatsSource,
        addr: &str,
        allow_remote: bool,
        limits: MetricsLimits,
    ) -> Result<MetricsServer, MetricsError> {
        let wanted = addr
            .to_socket_addrs()
            .ok()
            .and_then(|mut a| a.next())
            .ok_or_else(|| MetricsError::BadAddress(addr.to_string()))?;
        if !wanted.ip().is_loopback() && !allow_remote {
            return Err(MetricsError::NotLoopback(wanted));
        }
        let listen = |e: std::io::Error| MetricsError::Listen(e.to_string());
        let listener = TcpListener::bind(wanted).map_err(listen)?;
        let bound = listener.local_addr().map_err(listen)?;
        listener.set_nonblocking(true).map_err(listen)?;
        let at_end = AtEnd::from_env()?;
        let figures = Arc::new(Figures {
            source,
            frozen: Mutex::new(None),
        });
        let registry = Arc::new(registry(Arc::clone(&figures)));
        let serving = Arc::clone(&registry);
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = Arc::clone(&stop);
        let thread = std::thread::Builder::new()
            .name("vramscope-metrics".to_string())
            .spawn(move || {
                let active = Arc::new(AtomicUsize::new(0));
                while !stopping.load(Ordering::Relaxed) {
                    match listener.accept() {
                        Ok((conn, _)) => dispatch(conn, &serving, &limits, &active),
                        // Nothing pending, or a failed accept (a client gone at once, or no
                        // descriptor left): look again a little later.
                        Err(_) => std::thread::sleep(ACCEPT_POLL),
                    }
                }
            })
            .map_err(listen)?;
        Ok(MetricsServer {
            addr: bound,
            stop,
            thread: Some(thread),
            figures,
            registry,
            at_end,
        })
    }

    /// Serves the metrics of `allocators` where `VRAMSCOPE_METRICS` asks (the one line a Rust
    /// program adds: `let _metrics = MetricsServer::serve_from_env(&[alloc.clone()])?;`);
    /// `Ok(None)` when it is unset, empty, `0` or `off`. `VRAMSCOPE_METRICS_ALLOW_REMOTE=1`
    /// allows a non-loopback address. The server stops when the value returned is dropped.
    pub fn serve_from_env<B: Backend>(
        allocators: &[CachingAllocator<B>],
    ) -> Result<Option<MetricsServer>, MetricsError> {
        MetricsServer::from_env(source_of(allocators))
    }

    /// Serves from `VRAMSCOPE_METRICS` when it is set (and not `0`/`off`) and no other server
    /// of this process has claimed it ([`claim_env_addr`]); `Ok(None)` otherwise.
    /// `VRAMSCOPE_METRICS_ALLOW_REMOTE=1` allows a non-loopback address.
    pub fn from_env(source: StatsSource) -> Result<Option<MetricsServer>, MetricsError> {
        let Some((addr, allow_remote)) = claim_env_addr() else {
            return Ok(None);
        };
        MetricsServer::serve_source(source, &addr, allow_remote).map(Some)
    }

    /// The address the server listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// What the server does at the run's end ([`AtEnd::from_env`] when it started).
    pub fn at_end(&self) -> &AtEnd {
        &self.at_end
    }

    /// Sets what the server does at the run's end, in place of what the environment said.
    pub fn set_at_end(&mut self, at_end: AtEnd) {
        self.at_end = at_end;
    }

    /// Ends the run: does what [`MetricsServer::at_end`] asks (push the last figures, then go
    /// on serving them for the linger time, each said on standard error), stops accepting and
    /// waits for the accepting thread (a connection being served finishes on its own thread,
    /// within the limits' timeouts). Dropping the server does the same.
    pub fn shutdown(mut self) {
        self.stop_thread();
    }

    /// The run's end: the figures are frozen, pushed, and served for the linger time.
    fn finish(&mut self) {
        let at_end = std::mem::take(&mut self.at_end);
        if at_end.linger.is_none() && at_end.push.is_none() {
            return;
        }
        self.figures.freeze();
        if let Some(target) = &at_end.push {
            let body = render_registry(&self.registry);
            match target.push(&body, PUSH_TIMEOUT) {
                Ok(code) if (200..300).contains(&code) => {
                    eprintln!("vramscope: pushed the last metrics to {}", target.url())
                }
                Ok(code) => eprintln!(
                    "vramscope: {ENV_METRICS_PUSH}: {} answered {code}: the last metrics were not pushed",
                    target.url()
                ),
                Err(e) => eprintln!(
                    "vramscope: {ENV_METRICS_PUSH}: {e}: the last metrics were not pushed"
                ),
            }
        }
        if let Some(linger) = at_end.linger {
            eprintln!(
                "vramscope: serving the last metrics on http://{}/metrics for {} ms more ({ENV_METRICS_LINGER})",
                self.addr,
                linger.as_millis()
            );
            std::thread::sleep(linger);
        }
    }

    fn stop_thread(&mut self) {
        if self.thread.is_some() {
            self.finish();
        }
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

/// Takes a slot for one connection while it is served; gives it back when dropped.
struct Slot(Arc<AtomicUsize>);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Serves `conn` on a thread of its own when a slot is free, else answers 503 without waiting
/// and closes it.
fn dispatch(
    mut conn: TcpStream,
    registry: &Arc<Registry>,
    limits: &MetricsLimits,
    active: &Arc<AtomicUsize>,
) {
    let taken = active.fetch_add(1, Ordering::AcqRel);
    let slot = Slot(Arc::clone(active));
    if taken >= limits.max_connections {
        // A fresh socket's buffer takes these few bytes at once; never wait for the client.
        let _ = conn.set_nonblocking(true);
        let _ = conn.write_all(&response(Status::Busy, "text/plain", b"busy: try again\n"));
        close_gently(&mut conn);
        return;
    }
    let registry = Arc::clone(registry);
    let limits = limits.clone();
    // A thread that cannot start drops the connection and gives the slot back.
    let _ = std::thread::Builder::new()
        .name("vramscope-metrics-conn".to_string())
        .spawn(move || {
            let _slot = slot;
            serve_connection(conn, &registry, &limits);
        });
}

/// The statuses the server answers with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Status {
    Ok,
    BadRequest,
    NotFound,
    MethodNotAllowed,
    Timeout,
    TooLarge,
    Busy,
}

impl Status {
    fn line(self) -> &'static str {
        match self {
            Status::Ok => "200 OK",
            Status::BadRequest => "400 Bad Request",
            Status::NotFound => "404 Not Found",
            Status::MethodNotAllowed => "405 Method Not Allowed",
            Status::Timeout => "408 Request Timeout",
            Status::TooLarge => "431 Request Header Fields Too Large",
            Status::Busy => "503 Service Unavailable",
        }
    }
}

/// A whole response that closes the connection.
fn response(status: Status, content_type: &str, body: &[u8]) -> Vec<u8> {
    let mut out = format!(
        "HTTP/1.1 {}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n",
        status.line(),
        body.len()
    )
    .into_bytes();
    if status == Status::Busy {
        out.extend_from_slice(b"Retry-After: 1\r\n");
    }
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(body);
    out
}

/// What reading a request's head found.
#[derive(Debug, PartialEq, Eq)]
enum Head {
    /// The head, complete, is the first `usize` bytes of the buffer.
    Complete(usize),
    /// The client closed the connection (or it failed) before the head was complete.
    Gone,
    /// The client did not send the whole head in time.
    Timeout,
    /// The head did not end within the buffer.
    TooLarge,
}

/// Reads the head of one request into `buf`, and never more than `buf` holds, by `deadline`.
fn read_head(conn: &mut impl ReadTimeout, buf: &mut [u8], deadline: Instant) -> Head {
    let mut len = 0;
    loop {
        if len == buf.len() {
            return Head::TooLarge;
        }
        let Some(left) = deadline
            .checked_duration_since(Instant::now())
            .filter(|d| !d.is_zero())
        else {
            return Head::Timeout;
        };
        if conn.set_timeout(left).is_err() {
            return Head::Gone;
        }
        match conn.read(&mut buf[len..]) {
            Ok(0) => return Head::Gone,
            Ok(n) => {
                let from = len.saturating_sub(3);
                len += n;
                if let Some(end) = head_end(&buf[..len], from) {
                    return Head::Complete(end);
                }
            }
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                return Head::Timeout
            }
            Err(_) => return Head::Gone,
        }
    }
}

/// A stream whose reads can be bounded in time (a `TcpStream`; a test's reader).
trait ReadTimeout: Read {
    /// Makes a read that waits longer than `timeout` fail with `WouldBlock` or `TimedOut`.
    fn set_timeout(&mut self, timeout: Duration) -> std::io::Result<()>;
}

impl ReadTimeout for TcpStream {
    fn set_timeout(&mut self, timeout: Duration) -> std::io::Result<()> {
        self.set_read_timeout(Some(timeout))
    }
}

/// Where the head in `bytes` ends (just after its empty line: `\r\n\r\n` or `\n\n`), looking
/// only at line ends from `from` on.
fn head_end(bytes: &[u8], from: usize) -> Option<usize> {
    (from..bytes.len()).find_map(|i| {
        let ends = bytes[i] == b'\n'
            && ((i >= 1 && bytes[i - 1] == b'\n')
                || (i >= 2 && bytes[i - 1] == b'\r' && bytes[i - 2] == b'\n'));
        ends.then_some(i + 1)
    })
}

/// What a request's head asks for, when it is one the server answers with a page.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Request {
    /// `GET /metrics`, with or without a query: the metrics (200).
    Metrics,
    /// A `GET` of any other path (404).
    NotFound,
}

/// Why a request's bytes are not a request the server answers with a page.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum RequestError {
    /// The head has not ended (no empty line yet) within fewer bytes than
    /// [`MetricsLimits::max_request_bytes`]: more bytes may complete it.
    Incomplete,
    /// The head does not end within [`MetricsLimits::max_request_bytes`], or it has more than
    /// [`MetricsLimits::max_headers`] header lines (431).
    TooLarge,
    /// The head is not UTF-8, its request line is not `METHOD /TARGET HTTP/…`, or a header
    /// line has no colon (400).
    BadRequest,
    /// A well-formed request with a method other than `GET` (405).
    MethodNotAllowed,
}

/// Parses the head of one request from the first bytes a client sent, as the server does:
/// the head ends at its first empty line (`\r\n\r\n` or `\n\n`), which must come within
/// `limits.max_request_bytes` (at least 1); bytes after the head (a body, a next request) are
/// never looked at. Pure and linear in `bytes.len()`, whatever they are, so that a fuzzer can
/// drive it (`fuzz/fuzz_targets/metrics_request.rs`); the server calls it on the head it read.
pub fn parse_request(bytes: &[u8], limits: &MetricsLimits) -> Result<Request, RequestError> {
    let max = limits.max_request_bytes.max(1);
    let window = &bytes[..bytes.len().min(max)];
    match head_end(window, 0) {
        Some(end) => parse_head(&window[..end], limits),
        None if bytes.len() >= max => Err(RequestError::TooLarge),
        None => Err(RequestError::Incomplete),
    }
}

/// What a complete head (ending in its empty line) asks for.
fn parse_head(head: &[u8], limits: &MetricsLimits) -> Result<Request, RequestError> {
    let Ok(text) = std::str::from_utf8(head) else {
        return Err(RequestError::BadRequest);
    };
    let mut lines = text.lines().map(|l| l.strip_suffix('\r').unwrap_or(l));
    let request = lines.next().unwrap_or("");
    let mut headers = 0;
    for line in lines.take_while(|l| !l.is_empty()) {
        headers += 1;
        if headers > limits.max_headers {
            return Err(RequestError::TooLarge);
        }
        if !line.contains(':') {
            return Err(RequestError::BadRequest);
        }
    }
    let mut parts = request.split(' ');
    let (Some(method), Some(target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(RequestError::BadRequest);
    };
    if method.is_empty() || !target.starts_with('/') || !version.starts_with("HTTP/") {
        return Err(RequestError::BadRequest);
    }
    if method != "GET" {
        return Err(RequestError::MethodNotAllowed);
    }
    if target.split('?').next() == Some("/metrics") {
        Ok(Request::Metrics)
    } else {
        Ok(Request::NotFound)
    }
}

/// The answer to a complete head: the status of what [`parse_request`] found in it.
fn route(head: &[u8], limits: &MetricsLimits) -> Status {
    match parse_request(head, limits) {
        Ok(Request::Metrics) => Status::Ok,
        Ok(Request::NotFound) => Status::NotFound,
        Err(RequestError::MethodNotAllowed) => Status::MethodNotAllowed,
        Err(RequestError::TooLarge) => Status::TooLarge,
        // A complete head is never incomplete; were it so, it is not a request.
        Err(RequestError::BadRequest | RequestError::Incomplete) => Status::BadRequest,
    }
}

/// Serves one connection: one request, one response, then the connection closes.
fn serve_connection(mut conn: TcpStream, registry: &Registry, limits: &MetricsLimits) {
    let deadline = Instant::now() + limits.request_timeout;
    let _ = conn.set_nonblocking(false);
    let mut buf = vec![0u8; limits.max_request_bytes.max(1)];
    let status = match read_head(&mut conn, &mut buf, deadline) {
        Head::Complete(end) => route(&buf[..end], limits),
        Head::Gone => return,
        Head::Timeout => Status::Timeout,
        Head::TooLarge => Status::TooLarge,
    };
    drop(buf);
    let bytes = match status {
        Status::Ok => response(
            Status::Ok,
            CONTENT_TYPE,
            render_registry(registry).as_bytes(),
        ),
        Status::NotFound => response(status, "text/plain", b"vramscope serves /metrics\n"),
        Status::MethodNotAllowed => response(status, "text/plain", b"only GET is served\n"),
        Status::TooLarge => response(
            status,
            "text/plain",
            format!(
                "a request's head is limited to {} bytes and {} header lines\n",
                limits.max_request_bytes, limits.max_headers
            )
            .as_bytes(),
        ),
        Status::Timeout => response(
            status,
            "text/plain",
            format!(
                "a request must arrive within {} ms\n",
                limits.request_timeout.as_millis()
            )
            .as_bytes(),
        ),
        other => response(other, "text/plain", b"bad request\n"),
    };
    // A client that does not take the response, or went away, is not the program's problem.
    let _ = conn.set_write_timeout(Some(limits.write_timeout.max(Duration::from_millis(1))));
    let _ = conn.write_all(&bytes);
    let _ = conn.flush();
    let _ = conn.set_nonblocking(true);
    close_gently(&mut conn);
}

/// Ends the response and discards what the client has sent and the server has not read, as
/// far as it is already there (never waiting, at most 16 KiB), so that closing the connection
/// does not reset it and lose the response on its way; the socket must be non-blocking.
fn close_gently(conn: &mut TcpStream) {
    let _ = conn.shutdown(Shutdown::Write);
    let mut sink = [0u8; 4096];
    for _ in 0..4 {
        match conn.read(&mut sink) {
            Ok(n) if n > 0 => {}
            _ => return,
        }
    }
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
        drop(alloc.alloc(1 << 20).unwrap());
        alloc.mark_step();
        let text = render(std::slice::from_ref(&alloc));
        let stats = alloc.stats();
        let large = stats.allocated_bytes.large_pool.current;
        for line in [
            format!("vramscope_allocated_bytes{{device=\"0\",pool=\"large\"}} {large}"),
            "# TYPE vramscope_allocated_bytes gauge".to_string(),
            "# TYPE vramscope_allocated_peak_bytes gauge".to_string(),
            "# TYPE vramscope_allocated_added_bytes_total counter".to_string(),
            format!(
                "vramscope_allocated_added_bytes_total{{device=\"0\",pool=\"large\"}} {}",
                stats.allocated_bytes.large_pool.allocated
            ),
            format!(
                "vramscope_allocated_removed_blocks_total{{device=\"0\",pool=\"large\"}} {}",
                stats.allocation.large_pool.freed
            ),
            "# TYPE vramscope_reserved_bytes gauge".to_string(),
            "# TYPE vramscope_alloc_retries_total counter".to_string(),
            "vramscope_alloc_retries_total{device=\"0\"} 0".to_string(),
            "vramscope_reserved_segments{device=\"0\",pool=\"large\"} 1".to_string(),
            "vramscope_device_capacity_bytes{device=\"0\"} 1073741824".to_string(),
            format!(
                "vramscope_largest_free_block_bytes{{device=\"0\"}} {}",
                alloc.largest_free_block()
            ),
            "vramscope_step{device=\"0\"} 1".to_string(),
            format!(
                "vramscope_build_info{{version=\"{}\"}} 1",
                env!("CARGO_PKG_VERSION")
            ),
        ] {
            assert!(text.contains(&line), "{line} missing from\n{text}");
        }
        // No pool `all` beside the pools, and no running total under a gauge's type.
        assert!(!text.contains("pool=\"all\""), "{text}");
        assert!(!text.contains("stat="), "{text}");
        for line in text.lines().filter(|l| l.starts_with("# TYPE")) {
            let (name, kind) = line[7..].split_once(' ').unwrap();
            assert_eq!(
                name.ends_with("_total"),
                kind == "counter",
                "{line}: counters and only counters end in _total"
            );
        }
        // The largest free block is the snapshot's.
        let snapshot = alloc.snapshot();
        let largest = snapshot
            .segments
            .iter()
            .map(|s| s.largest_free_block())
            .max()
            .unwrap_or(0);
        assert!(largest > 0);
        assert_eq!(alloc.largest_free_block(), largest);
    }

    #[test]
    fn linger_and_push_settings_are_read_or_refused() {
        assert_eq!(parse_duration("30s"), Some(Duration::from_secs(30)));
        assert_eq!(parse_duration("500ms"), Some(Duration::from_millis(500)));
        assert_eq!(parse_duration("2m"), Some(Duration::from_secs(120)));
        assert_eq!(parse_duration("1.5"), Some(Duration::from_millis(1500)));
        for bad in ["", "s", "30 parsecs", "-1s", "2d", "100000h"] {
            assert_eq!(parse_duration(bad), None, "{bad}");
        }
        let target = PushTarget::parse("http://127.0.0.1:9091", None).unwrap();
        assert_eq!(target.url(), "http://127.0.0.1:9091/metrics/job/vramscope");
        let target = PushTarget::parse("http://gateway/", Some("3")).unwrap();
        assert_eq!(
            target.url(),
            "http://gateway:9091/metrics/job/vramscope/rank/3"
        );
        let target = PushTarget::parse("http://[::1]:9/metrics/job/train/instance/a", Some("3"));
        assert_eq!(
            target.unwrap().url(),
            "http://[::1]:9/metrics/job/train/instance/a"
        );
        for bad in [
            "https://gw:9091",
            "gw:9091",
            "http://",
            "http://gw:9091/push",
            "http://u@gw",
        ] {
            assert!(PushTarget::parse(bad, None).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_push_to_no_gateway_fails_within_its_timeout() {
        // A port just freed: nothing listens there, so the push fails, and fast.
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let target = PushTarget::parse(&format!("http://127.0.0.1:{port}"), None).unwrap();
        let started = Instant::now();
        assert!(target.push("x 1\n", Duration::from_secs(2)).is_err());
        assert!(started.elapsed() < Duration::from_secs(3));
        // A listener that never answers: the push gives up at its deadline.
        let silent = TcpListener::bind("127.0.0.1:0").unwrap();
        let target =
            PushTarget::parse(&format!("http://{}", silent.local_addr().unwrap()), None).unwrap();
        let started = Instant::now();
        let answer = target.push("x 1\n", Duration::from_millis(300));
        assert!(answer.is_err(), "{answer:?}");
        let took = started.elapsed();
        assert!(
            took >= Duration::from_millis(250) && took < Duration::from_secs(2),
            "{took:?}"
        );
    }

    /// A reader that hands out `chunk` bytes of `data` per read and counts what it gave.
    struct Trickle {
        data: Vec<u8>,
        chunk: usize,
        given: usize,
    }

    impl Read for Trickle {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            let n = self.chunk.min(buf.len()).min(self.data.len() - self.given);
            buf[..n].copy_from_slice(&self.data[self.given..self.given + n]);
            self.given += n;
            Ok(n)
        }
    }

    impl ReadTimeout for Trickle {
        fn set_timeout(&mut self, _: Duration) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_head_is_read_into_its_buffer_and_never_past_it() {
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut huge = b"GET /metrics HTTP/1.1\r\nX-Big: ".to_vec();
        huge.resize(1 << 20, b'a');
        let mut reader = Trickle {
            data: huge,
            chunk: 1000,
            given: 0,
        };
        let mut buf = vec![0u8; 8192];
        assert_eq!(read_head(&mut reader, &mut buf, deadline), Head::TooLarge);
        assert_eq!(
            reader.given, 8192,
            "not a byte more than the buffer was read"
        );

        // Byte by byte, the end is found however the last line end is split.
        for ending in ["\r\n\r\n", "\n\n"] {
            let head = format!("GET /metrics HTTP/1.1{ending}");
            let mut reader = Trickle {
                data: head.clone().into_bytes(),
                chunk: 1,
                given: 0,
            };
            assert_eq!(
                read_head(&mut reader, &mut buf, deadline),
                Head::Complete(head.len())
            );
        }
        let mut gone = Trickle {
            data: b"GET /metr".to_vec(),
            chunk: 4,
            given: 0,
        };
        assert_eq!(read_head(&mut gone, &mut buf, deadline), Head::Gone);
        let past = Instant::now() - Duration::from_millis(1);
        assert_eq!(read_head(&mut gone, &mut buf, past), Head::Timeout);
    }

    #[test]
    fn requests_are_routed_by_method_path_and_header_count() {
        let limits = MetricsLimits::default();
        let route_of = |text: &str| route(text.as_bytes(), &limits);
        assert_eq!(
            route_of("GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"),
            Status::Ok
        );
        assert_eq!(route_of("GET /metrics?x=1 HTTP/1.0\n\n"), Status::Ok);
        assert_eq!(route_of("GET / HTTP/1.1\r\n\r\n"), Status::NotFound);
        assert_eq!(
            route_of("POST /metrics HTTP/1.1\r\n\r\n"),
            Status::MethodNotAllowed
        );
        for bad in [
            "nonsense\r\n\r\n",
            "GET /metrics\r\n\r\n",
            "GET metrics HTTP/1.1\r\n\r\n",
            "GET /metrics HTTP/1.1\r\nno colon\r\n\r\n",
        ] {
            assert_eq!(route_of(bad), Status::BadRequest, "{bad:?}");
        }
        assert_eq!(
            route(b"GET /metrics HTTP/1.1\r\n\xff: x\r\n\r\n", &limits),
            Status::BadRequest
        );
        let headers = |n: usize| {
            let mut text = "GET /metrics HTTP/1.1\r\n".to_string();
            for i in 0..n {
                text.push_str(&format!("X-{i}: y\r\n"));
            }
            text + "\r\n"
        };
        assert_eq!(route_of(&headers(limits.max_headers)), Status::Ok);
        assert_eq!(route_of(&headers(limits.max_headers + 1)), Status::TooLarge);
    }

    #[test]
    fn parse_request_is_what_the_server_answers_on_the_bytes_it_read() {
        let limits = MetricsLimits {
            max_request_bytes: 64,
            max_headers: 2,
            ..MetricsLimits::default()
        };
        let get = b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n";
        assert_eq!(parse_request(get, &limits), Ok(Request::Metrics));
        // Bytes after the head (a body, a second request, garbage) are never looked at.
        let mut trailing = get.to_vec();
        trailing.extend_from_slice(&[0xff; 4096]);
        assert_eq!(parse_request(&trailing, &limits), Ok(Request::Metrics));
        // Every proper prefix is incomplete: the head ends only at its empty line.
        for cut in 0..get.len() {
            assert_eq!(
                parse_request(&get[..cut], &limits),
                Err(RequestError::Incomplete),
                "{cut}"
            );
        }
        // A head that has not ended within the limit is too large, however much more follows;
        // one that ends at the limit's last byte is complete.
        let mut long = b"GET /metrics HTTP/1.1\r\nX: ".to_vec();
        long.resize(63, b'a');
        assert_eq!(parse_request(&long, &limits), Err(RequestError::Incomplete));
        long.push(b'a');
        assert_eq!(parse_request(&long, &limits), Err(RequestError::TooLarge));
        long.truncate(60);
        long.extend_from_slice(b"\r\n\r\n");
        assert_eq!(long.len(), 64);
        assert_eq!(parse_request(&long, &limits), Ok(Request::Metrics));
        let three = b"GET / HTTP/1.1\r\na: 1\r\nb: 2\r\nc: 3\r\n\r\n";
        assert_eq!(parse_request(three, &limits), Err(RequestError::TooLarge));
        assert_eq!(
            parse_request(&three[..three.len() - 8], &limits),
            Err(RequestError::Incomplete)
        );
        assert_eq!(
            parse_request(b"PUT /metrics HTTP/1.1\n\n", &limits),
            Err(RequestError::MethodNotAllowed)
        );

        // The server reads the head with `read_head` and answers by `parse_request`: the same
        // answer as on the whole of what the client sent.
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut buf = vec![0u8; limits.max_request_bytes];
        for (data, status) in [
            (trailing.clone(), Status::Ok),
            (three.to_vec(), Status::TooLarge),
            (vec![b'x'; 1000], Status::TooLarge),
            (b"GET /x HTTP/1.0\n\nrest".to_vec(), Status::NotFound),
        ] {
            let mut reader = Trickle {
                data: data.clone(),
                chunk: 7,
                given: 0,
            };
            let answered = match read_head(&mut reader, &mut buf, deadline) {
                Head::Complete(end) => route(&buf[..end], &limits),
                Head::TooLarge => Status::TooLarge,
                other => panic!("{other:?}"),
            };
            assert_eq!(answered, status, "{data:?}");
            let parsed = match parse_request(&data, &limits) {
                Ok(Request::Metrics) => Status::Ok,
                Ok(Request::NotFound) => Status::NotFound,
                Err(RequestError::TooLarge) => Status::TooLarge,
                Err(e) => panic!("{e:?}"),
            };
            assert_eq!(parsed, status, "{data:?}");
        }
    }

    #[test]
    fn a_remote_address_needs_permission() {
        let alloc = CachingAllocator::new(SimDevice::phantom(1 << 30), AllocatorConfig::default());
        let refused = MetricsServer::serve(&[alloc], "8.8.8.8:9400", false);
        assert!(matches!(refused, Err(MetricsError::NotLoopback(_))));
    }
}
