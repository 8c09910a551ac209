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
use std::sync::Arc;
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
/// What a scrape of `allocators` reads: each one's device and statistics.
pub fn source_of<B: Backend>(allocators: &[CachingAllocator<B>]) -> StatsSource {
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
        let registry = Arc::new(registry(source));
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = Arc::clone(&stop);
        let thread = std::thread::Builder::new()
            .name("vramscope-metrics".to_string())
            .spawn(move || {
                let active = Arc::new(AtomicUsize::new(0));
                while !stopping.load(Ordering::Relaxed) {
                    match listener.accept() {
                        Ok((conn, _)) => dispatch(conn, &registry, &limits, &active),
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

    /// Stops accepting and waits for the accepting thread (a connection being served finishes
    /// on its own thread, within the limits' timeouts).
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
