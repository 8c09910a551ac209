//! The pluggable allocator's state: the process-wide table of one `CachingAllocator` per
//! device, the misuse counters, and the services a device starts when it opens (live
//! telemetry, the `/metrics` server, the exit snapshot), with the Rust API that a host
//! embedding this crate steers them through.
//!
//! The C entry points of the crate root are thin wrappers over this module, and so is the
//! Python extension (`vramscope._native`, crate `vramscope-py`), which links this crate and
//! exports its C symbols as its own: it registers a [`CallSiteProvider`] (the allocating
//! thread's Python stack), and reads and steers the table with [`opened`],
//! [`devices_served`], [`mark_step`], [`arm`], [`push_scope`], [`set_listen`] and
//! [`serve_metrics`]. One table serves both, so an allocation that PyTorch makes through
//! `vramscope_malloc` is the one Python's `session.stats()` and `/metrics` count.

use std::cell::RefCell;
use std::ffi::{c_int, c_void};
use std::fmt;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};

use vramscope_allocator::metrics::ENV_METRICS_ALLOW_REMOTE;
use vramscope_allocator::metrics::{
    AtEnd, DeviceFigures, MetricsError, MetricsServer, StatsSource,
};
use vramscope_allocator::provenance::{with_call_site, MAX_SCOPE_DEPTH};
use vramscope_allocator::{AllocError, CachingAllocator, DeviceBackend, ScopeGuard, StreamId};
use vramscope_allocator::{SimDevice, Telemetry};
use vramscope_model::{AllocatorConfig, CallSite, Snapshot};
use vramscope_telemetry::TelemetryAddr;

/// Devices this library serves (ordinals `0..MAX_DEVICES`).
pub const MAX_DEVICES: usize = 64;

/// The environment variable naming a file to write a snapshot to at process exit.
pub const SNAPSHOT_ON_EXIT_ENV: &str = "VRAMSCOPE_SNAPSHOT_ON_EXIT";

/// Capacity of the simulated device (`VRAMSCOPE_BACKEND=sim`): addresses only, no memory.
const SIM_CAPACITY: u64 = 1 << 40;

/// Names the call site of the allocation being made on the calling thread, or `None` to keep
/// the allocator's own (Rust) site. It runs on the allocating thread before the device lock is
/// taken, so it may wait (for Python's GIL, say), but it must not allocate through this table.
pub type CallSiteProvider = fn() -> Option<&'static CallSite>;

static ALLOCATORS: [OnceLock<Option<CachingAllocator<DeviceBackend>>>; MAX_DEVICES] =
    [const { OnceLock::new() }; MAX_DEVICES];
static ERRORS: AtomicU64 = AtomicU64::new(0);
/// Scopes refused for nesting too deep ([`scopes_refused`]).
static SCOPES_REFUSED: AtomicU64 = AtomicU64::new(0);
static LAST_ERROR: Mutex<String> = Mutex::new(String::new());
static EXIT_HOOK: AtomicBool = AtomicBool::new(false);
static PROVIDER: OnceLock<CallSiteProvider> = OnceLock::new();
/// The live-telemetry publisher, serving the first device opened.
static TELEMETRY: Mutex<Option<Telemetry>> = Mutex::new(None);
/// Where the publisher listens when the host said ([`set_listen`]), before `VRAMSCOPE_LISTEN`.
static LISTEN: Mutex<Option<String>> = Mutex::new(None);
/// The Prometheus `/metrics` server, serving every device in use.
static METRICS: Mutex<Option<MetricsServer>> = Mutex::new(None);
static ARMED: AtomicBool = AtomicBool::new(false);
/// Per device, the snapshot taken at the latest step mark while armed.
static STEP_SNAPSHOTS: Mutex<Vec<(u32, Snapshot)>> = Mutex::new(Vec::new());

thread_local! {
    /// The scopes this thread opened with [`push_scope`], innermost last.
    static OPEN_SCOPES: RefCell<Vec<ScopeGuard>> = const { RefCell::new(Vec::new()) };
}

/// Counts a misuse or failure and logs it to standard error (never panics).
pub(crate) fn report_error(message: String) {
    ERRORS.fetch_add(1, Ordering::Relaxed);
    eprintln!("vramscope: {message}");
    set_last_error(message);
}

/// Keeps `message` as the last error, without counting or logging it.
pub(crate) fn set_last_error(message: String) {
    if let Ok(mut last) = LAST_ERROR.lock() {
        *last = message;
    }
}

/// Counts a failure that the caller logs itself (or, flooding, does not).
pub(crate) fn count_error() {
    ERRORS.fetch_add(1, Ordering::Relaxed);
}

/// Misuses and failures counted so far (what `vramscope_error_count` returns).
pub fn error_count() -> u64 {
    ERRORS.load(Ordering::Relaxed)
}

/// The message of the last misuse or failure counted, empty before the first.
pub fn last_error() -> String {
    LAST_ERROR.lock().map(|l| l.clone()).unwrap_or_default()
}

/// Scopes refused since the library was loaded because they would nest deeper than
/// `MAX_SCOPE_DEPTH` (1024) levels.
pub fn scopes_refused() -> u64 {
    SCOPES_REFUSED.load(Ordering::Relaxed)
}

/// Sets the provider of the allocations' call sites, once per process; `false` (and nothing
/// changed) when another provider was set before.
pub fn set_call_site_provider(provider: CallSiteProvider) -> bool {
    PROVIDER.set(provider).is_ok() || PROVIDER.get() == Some(&provider)
}

/// The backend for `device`: CUDA device `device` unless `VRAMSCOPE_BACKEND=sim`.
fn open_backend(device: u32) -> Result<DeviceBackend, String> {
    let forced_sim = std::env::var(vramscope_allocator::BACKEND_ENV)
        .is_ok_and(|v| v.eq_ignore_ascii_case("sim"));
    if forced_sim {
        return Ok(DeviceBackend::Sim(SimDevice::with_index(
            SIM_CAPACITY,
            false,
            device,
        )));
    }
    DeviceBackend::cuda(device)
}

/// The allocator of `device`, created on first use on the backend `VRAMSCOPE_BACKEND` picks,
/// with the settings of `VRAMSCOPE_ALLOC_CONF`; `None` when the device cannot be opened (the
/// reason counted and logged).
pub fn allocator(device: c_int) -> Option<&'static CachingAllocator<DeviceBackend>> {
    let Ok(index) = usize::try_from(device) else {
        report_error(format!("device {device} is not a valid device ordinal"));
        return None;
    };
    let Some(slot) = ALLOCATORS.get(index) else {
        report_error(format!(
            "device {device} is beyond the {MAX_DEVICES} devices served"
        ));
        return None;
    };
    let created = slot.get_or_init(|| {
        let config = AllocatorConfig::from_env().unwrap_or_else(|e| {
            report_error(format!("{e}; using the default settings"));
            AllocatorConfig::default()
        });
        match open_backend(index as u32) {
            Ok(backend) => {
                install_exit_hook();
                let alloc = CachingAllocator::new(backend, config);
                start_telemetry(&alloc);
                if let Err(e) = serve_metrics(None) {
                    report_error(format!("metrics not served: {e}"));
                }
                Some(alloc)
            }
            Err(reason) => {
                report_error(format!("cannot open device {device}: {reason}"));
                None
            }
        }
    });
    created.as_ref()
}

/// The allocator of `device` when it was opened before; never opens one.
pub fn opened(device: c_int) -> Option<&'static CachingAllocator<DeviceBackend>> {
    usize::try_from(device)
        .ok()
        .and_then(|i| ALLOCATORS.get(i))
        .and_then(|slot| slot.get())
        .and_then(Option::as_ref)
}

/// The allocators of the devices opened, by ordinal.
pub fn live_allocators() -> impl Iterator<Item = &'static CachingAllocator<DeviceBackend>> {
    ALLOCATORS
        .iter()
        .filter_map(|slot| slot.get().and_then(Option::as_ref))
}

/// The ordinals of the devices opened.
pub fn devices_served() -> Vec<u32> {
    live_allocators().map(|a| a.device()).collect()
}

/// Allocates `size` bytes on `device` for `stream`, at the provider's call site when it names
/// one: the body of `vramscope_malloc`. Null when the device is out of memory (the report goes
/// to standard error) or on misuse (counted and logged).
pub(crate) fn allocate(size: isize, device: c_int, stream: *mut c_void) -> *mut c_void {
    let Ok(size) = u64::try_from(size) else {
        report_error(format!("vramscope_malloc: negative size {size}"));
        return std::ptr::null_mut();
    };
    let Some(alloc) = allocator(device) else {
        return std::ptr::null_mut();
    };
    let stream = StreamId(stream as u64);
    let result = match PROVIDER.get().and_then(|provide| provide()) {
        Some(site) => with_call_site(site, || alloc.alloc_ptr(size, stream)),
        None => alloc.alloc_ptr(size, stream),
    };
    match result {
        Ok(addr) => addr as *mut c_void,
        Err(e @ AllocError::OutOfMemory(_)) => {
            eprintln!("vramscope: {e}");
            std::ptr::null_mut()
        }
        Err(e) => {
            report_error(format!("vramscope_malloc: {e}"));
            std::ptr::null_mut()
        }
    }
}

/// Frees `ptr` on `device`: the body of `vramscope_free`. A null pointer is no-op; a pointer
/// that is unknown, already freed, or on a device that never allocated is counted and logged.
pub(crate) fn release(ptr: *mut c_void, device: c_int) {
    if ptr.is_null() {
        return;
    }
    let Some(alloc) = opened(device) else {
        report_error(format!(
            "vramscope_free: {ptr:?} on device {device}, which never allocated"
        ));
        return;
    };
    if let Err(e) = alloc.free_ptr_on(ptr as u64, alloc.device()) {
        report_error(format!("vramscope_free: {e}"));
    }
}

/// Releases every cached segment without live blocks on every device; returns the bytes.
pub fn empty_cache() -> u64 {
    live_allocators().map(|a| a.empty_cache()).sum()
}

/// Why [`push_scope`] or [`pop_scope`] did nothing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ScopeError {
    /// The device cannot be served (the reason was counted and logged).
    Device(c_int),
    /// The scope would nest deeper than `MAX_SCOPE_DEPTH` levels: refused, nothing opened.
    TooDeep {
        /// The name of the scope refused, cut to 64 characters.
        name: String,
        /// Scopes refused so far, this one included.
        refused: u64,
    },
    /// The calling thread is exiting, and its scopes are gone.
    ThreadExiting,
    /// The calling thread has no scope open.
    NoneOpen,
}

impl fmt::Display for ScopeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ScopeError::Device(device) => write!(f, "cannot open device {device}"),
            ScopeError::TooDeep { name, refused } => write!(
                f,
                "scope `{name}` refused: scopes nest at most {MAX_SCOPE_DEPTH} levels \
                 ({refused} refused so far)"
            ),
            ScopeError::ThreadExiting => f.write_str("the thread is exiting"),
            ScopeError::NoneOpen => f.write_str("no scope is open on this thread"),
        }
    }
}

impl std::error::Error for ScopeError {}

/// Opens the scope `name` on the calling thread: the allocations this thread makes on
/// `device` carry it, nested in the scopes it already has open there, until [`pop_scope`].
/// A refusal for nesting too deep is counted in [`scopes_refused`]; the caller reports it.
pub fn push_scope(device: c_int, name: &str) -> Result<(), ScopeError> {
    let alloc = allocator(device).ok_or(ScopeError::Device(device))?;
    let Some(guard) = alloc.try_scope(name) else {
        let refused = SCOPES_REFUSED.fetch_add(1, Ordering::Relaxed) + 1;
        return Err(ScopeError::TooDeep {
            name: name.chars().take(64).collect(),
            refused,
        });
    };
    OPEN_SCOPES
        .try_with(|scopes| scopes.borrow_mut().push(guard))
        .map_err(|_| ScopeError::ThreadExiting)
}

/// Closes the innermost scope the calling thread opened with [`push_scope`].
pub fn pop_scope() -> Result<(), ScopeError> {
    match OPEN_SCOPES.try_with(|scopes| scopes.borrow_mut().pop()) {
        Ok(Some(guard)) => {
            drop(guard);
            Ok(())
        }
        Ok(None) => Err(ScopeError::NoneOpen),
        Err(_) => Err(ScopeError::ThreadExiting),
    }
}

/// Marks the start of a training step on every device; while [`arm`]ed, keeps each device's
/// snapshot from just before the mark first ([`step_snapshot`]).
pub fn mark_step() {
    if ARMED.load(Ordering::Relaxed) {
        let taken: Vec<(u32, Snapshot)> = live_allocators()
            .map(|a| (a.device(), a.snapshot()))
            .collect();
        if let Ok(mut kept) = STEP_SNAPSHOTS.lock() {
            *kept = taken;
        }
    }
    for alloc in live_allocators() {
        alloc.mark_step();
    }
}

/// While `on`, each [`mark_step`] keeps every device's snapshot from just before it, for a
/// leak check across one step; disarming drops them.
pub fn arm(on: bool) {
    ARMED.store(on, Ordering::Relaxed);
    if !on {
        if let Ok(mut kept) = STEP_SNAPSHOTS.lock() {
            kept.clear();
        }
    }
}

/// `device`'s snapshot from just before the latest step mark while armed.
pub fn step_snapshot(device: u32) -> Option<Snapshot> {
    STEP_SNAPSHOTS.lock().ok().and_then(|kept| {
        kept.iter()
            .find(|(d, _)| *d == device)
            .map(|(_, s)| s.clone())
    })
}

/// Where the first device opened publishes live telemetry (`unix:PATH` or `tcp:ADDR`), in
/// place of `VRAMSCOPE_LISTEN`; `None` returns to the variable. Takes effect when that device
/// opens, so a host calls it before the first allocation.
pub fn set_listen(addr: Option<String>) {
    if let Ok(mut listen) = LISTEN.lock() {
        *listen = addr;
    }
}

/// Starts the live-telemetry publisher for the first device opened, where [`set_listen`] or
/// `VRAMSCOPE_LISTEN` asks for one; a failure is logged, never fatal.
fn start_telemetry(alloc: &CachingAllocator<DeviceBackend>) {
    let Ok(mut slot) = TELEMETRY.lock() else {
        return;
    };
    if slot.is_some() {
        return;
    }
    let listen = LISTEN.lock().ok().and_then(|l| l.clone());
    let started = match listen {
        Some(addr) => TelemetryAddr::parse(&addr)
            .and_then(|addr| Telemetry::serve(alloc, &addr))
            .map(Some),
        None => Telemetry::from_env(alloc),
    };
    match started {
        Ok(Some(telemetry)) => {
            eprintln!(
                "vramscope: publishing device {} on {}",
                alloc.device(),
                telemetry.addr()
            );
            *slot = Some(telemetry);
        }
        Ok(None) => {}
        Err(e) => report_error(format!("live telemetry not started: {e}")),
    }
}

/// Starts the Prometheus `/metrics` server for every device of the table, once per process:
/// on `addr` (`HOST:PORT`, port 0 picks a free one) when given, else where
/// `VRAMSCOPE_METRICS` says (`Ok(None)` when it is unset, empty, `0` or `off`). Each scrape
/// reads the statistics of the devices in use then. A non-loopback address is refused unless
/// `VRAMSCOPE_METRICS_ALLOW_REMOTE=1`. Returns the address served; once a server runs, every
/// call returns its address and starts nothing. The first device opened calls it with `None`.
pub fn serve_metrics(addr: Option<&str>) -> Result<Option<SocketAddr>, MetricsError> {
    let mut slot = METRICS.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(server) = slot.as_ref() {
        return Ok(Some(server.addr()));
    }
    let source: StatsSource = Box::new(|| live_allocators().map(DeviceFigures::of).collect());
    let server = match addr {
        Some(addr) => {
            let allow_remote =
                std::env::var(ENV_METRICS_ALLOW_REMOTE).is_ok_and(|v| v.trim() == "1");
            MetricsServer::serve_source(source, addr, allow_remote).map(Some)
        }
        None => MetricsServer::from_env(source),
    }?;
    let Some(server) = server else {
        return Ok(None);
    };
    let bound = server.addr();
    eprintln!("vramscope: serving metrics on http://{bound}/metrics");
    if server.at_end() != &AtEnd::default() {
        // The server lives in a static, never dropped: its linger and push run at exit.
        // SAFETY: as in `install_exit_hook`.
        if unsafe { atexit(metrics_at_exit) } != 0 {
            report_error("could not register the metrics' linger and push at exit".to_string());
        }
    }
    *slot = Some(server);
    Ok(Some(bound))
}

/// The address the `/metrics` server listens on, once one runs ([`serve_metrics`],
/// `VRAMSCOPE_METRICS`).
pub fn metrics_addr() -> Option<SocketAddr> {
    let slot = METRICS.lock().unwrap_or_else(|e| e.into_inner());
    slot.as_ref().map(MetricsServer::addr)
}

/// Writes a JSON snapshot of every device in use: the first to `path`, any other device `N`
/// to `path` with `.deviceN.json` appended. A device that fails is counted and logged, and
/// the others are still written; `false` when any failed.
pub(crate) fn write_snapshots(path: &str) -> bool {
    let mut written = true;
    for (i, alloc) in live_allocators().enumerate() {
        let target = if i == 0 {
            path.to_string()
        } else {
            format!("{path}.device{}.json", alloc.device())
        };
        if let Err(e) = alloc.snapshot().save(&target) {
            report_error(format!("vramscope_snapshot: {e}"));
            written = false;
        }
    }
    written
}

extern "C" fn snapshot_at_exit() {
    crate::guarded("snapshot_at_exit", (), || {
        if let Ok(path) = std::env::var(SNAPSHOT_ON_EXIT_ENV) {
            if !path.is_empty() && write_snapshots(&path) {
                eprintln!("vramscope: snapshot written to {path}");
            }
        }
    })
}

/// Ends the `/metrics` server at exit: `VRAMSCOPE_METRICS_LINGER` and `VRAMSCOPE_METRICS_PUSH`.
extern "C" fn metrics_at_exit() {
    crate::guarded("metrics_at_exit", (), || {
        let server = METRICS.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(server) = server {
            server.shutdown();
        }
    })
}

extern "C" {
    fn atexit(callback: extern "C" fn()) -> c_int;
}

/// Registers the exit snapshot once, when `VRAMSCOPE_SNAPSHOT_ON_EXIT` is set.
fn install_exit_hook() {
    if std::env::var_os(SNAPSHOT_ON_EXIT_ENV).is_none() || EXIT_HOOK.swap(true, Ordering::SeqCst) {
        return;
    }
    // SAFETY: `atexit` is the C library's; the callback is a plain `extern "C" fn` with no
    // arguments that lives as long as the program (this library is never unloaded by PyTorch).
    if unsafe { atexit(snapshot_at_exit) } != 0 {
        report_error("could not register the exit snapshot".to_string());
    }
}
