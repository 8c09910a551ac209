//! The C ABI of vramscope's caching allocator: what PyTorch's `CUDAPluggableAllocator` and C or
//! C++ programs load.
//!
//! PyTorch calls [`vramscope_malloc`] and [`vramscope_free`] for every device allocation once
//! `torch.cuda.memory.change_current_allocator` points at this library. Behind them sits one
//! `CachingAllocator` per device, created on first use on the backend `DeviceBackend::detect`
//! picks (CUDA, or the simulated device with `VRAMSCOPE_BACKEND=sim`), configured from
//! `VRAMSCOPE_ALLOC_CONF`. A pluggable allocator costs PyTorch its own `memory_stats()` and
//! snapshots, so this library gives them back: [`vramscope_stats_json`],
//! [`vramscope_memory_summary`], [`vramscope_snapshot`] and, with `VRAMSCOPE_SNAPSHOT_ON_EXIT`,
//! a snapshot written when the process exits, with `VRAMSCOPE_LISTEN` the live telemetry
//! that `vramscope top` attaches to, and with `VRAMSCOPE_METRICS=127.0.0.1:9400` a Prometheus
//! `/metrics` endpoint for every device in use.
//!
//! Through this ABI vramscope sees no caller's stack (PyTorch calls in from C++), so every
//! allocation has the same call site; [`vramscope_push_scope`] and [`vramscope_pop_scope`] let
//! the program name what it is doing instead, and the snapshot and the dashboard show those
//! scopes.
//!
//! Misuse never aborts the host process: a free of an unknown or already-freed pointer, a
//! negative size or a bad device is counted ([`vramscope_error_count`]) and logged to standard
//! error, and the call returns. Nor does a bug of ours: every entry point runs its body under
//! `catch_unwind` (`guarded`), so a panic becomes a logged, counted error and the entry
//! point's failure value (null, -1, 0), never an unwind across the C boundary (which aborts).

use std::cell::RefCell;
use std::ffi::{c_char, c_int, c_void, CStr};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};

use vramscope_allocator::metrics::{MetricsServer, StatsSource};
use vramscope_allocator::provenance::MAX_SCOPE_DEPTH;
use vramscope_allocator::DeviceBackend;
use vramscope_allocator::Telemetry;
use vramscope_allocator::{AllocError, CachingAllocator, ScopeGuard, StreamId};
use vramscope_model::AllocatorConfig;

/// Devices this library serves (ordinals `0..MAX_DEVICES`).
pub const MAX_DEVICES: usize = 64;

/// The environment variable naming a file to write a snapshot to at process exit.
pub const SNAPSHOT_ON_EXIT_ENV: &str = "VRAMSCOPE_SNAPSHOT_ON_EXIT";

/// Capacity of the simulated device (`VRAMSCOPE_BACKEND=sim`): addresses only, no memory.
const SIM_CAPACITY: u64 = 1 << 40;

static ALLOCATORS: [OnceLock<Option<CachingAllocator<DeviceBackend>>>; MAX_DEVICES] =
    [const { OnceLock::new() }; MAX_DEVICES];
static ERRORS: AtomicU64 = AtomicU64::new(0);
/// Scopes refused for nesting too deep ([`vramscope_scopes_refused`]).
static SCOPES_REFUSED: AtomicU64 = AtomicU64::new(0);
static LAST_ERROR: Mutex<String> = Mutex::new(String::new());
static EXIT_HOOK: AtomicBool = AtomicBool::new(false);
/// The live-telemetry publisher (`VRAMSCOPE_LISTEN`), serving the first device opened.
static TELEMETRY: Mutex<Option<Telemetry>> = Mutex::new(None);
/// The Prometheus `/metrics` server (`VRAMSCOPE_METRICS`), serving every device in use.
static METRICS: Mutex<Option<MetricsServer>> = Mutex::new(None);

thread_local! {
    /// The scopes this thread opened with [`vramscope_push_scope`], innermost last.
    static OPEN_SCOPES: RefCell<Vec<ScopeGuard>> = const { RefCell::new(Vec::new()) };
}

/// Counts a misuse or failure and logs it to standard error (never panics).
fn report_error(message: String) {
    ERRORS.fetch_add(1, Ordering::Relaxed);
    eprintln!("vramscope: {message}");
    if let Ok(mut last) = LAST_ERROR.lock() {
        *last = message;
    }
}

/// The backend for `device`: CUDA device `device` unless `VRAMSCOPE_BACKEND=sim`.
fn open_backend(device: u32) -> Result<DeviceBackend, String> {
    let forced_sim = std::env::var(vramscope_allocator::BACKEND_ENV)
        .is_ok_and(|v| v.eq_ignore_ascii_case("sim"));
    if forced_sim {
        return Ok(DeviceBackend::Sim(
            vramscope_allocator::SimDevice::with_index(SIM_CAPACITY, false, device),
        ));
    }
    DeviceBackend::cuda(device)
}

/// The allocator of `device`, created on first use; `None` when the device cannot be opened.
fn allocator(device: c_int) -> Option<&'static CachingAllocator<DeviceBackend>> {
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
        let config = match AllocatorConfig::from_env() {
            Ok(config) => config,
            Err(e) => {
                report_error(format!("{e}; using the default settings"));
                AllocatorConfig::default()
            }
        };
        match open_backend(index as u32) {
            Ok(backend) => {
                install_exit_hook();
                let alloc = CachingAllocator::new(backend, config);
                start_telemetry(&alloc);
                start_metrics();
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

fn live_allocators() -> impl Iterator<Item = &'static CachingAllocator<DeviceBackend>> {
    ALLOCATORS
        .iter()
        .filter_map(|slot| slot.get().and_then(Option::as_ref))
}

/// Runs the body of the entry point `entry`, turning a panic into `failure` (counted and
/// logged like a misuse): unwinding out of an `extern "C"` function aborts the host process.
fn guarded<T>(entry: &str, failure: T, body: impl FnOnce() -> T) -> T {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(value) => value,
        Err(panic) => {
            let message = panic
                .downcast_ref::<String>()
                .map(String::as_str)
                .or_else(|| panic.downcast_ref::<&str>().copied())
                .unwrap_or("unknown panic");
            report_error(format!(
                "{entry}: internal error (please report it): {message}"
            ));
            failure
        }
    }
}

/// Allocates `size` bytes on `device` for `stream` (PyTorch's `alloc_fn`). Returns null when
/// the device is out of memory (the report goes to standard error) or on misuse.
#[no_mangle]
pub extern "C" fn vramscope_malloc(size: isize, device: c_int, stream: *mut c_void) -> *mut c_void {
    guarded("vramscope_malloc", std::ptr::null_mut(), || {
        let Ok(size) = u64::try_from(size) else {
            report_error(format!("vramscope_malloc: negative size {size}"));
            return std::ptr::null_mut();
        };
        let Some(alloc) = allocator(device) else {
            return std::ptr::null_mut();
        };
        match alloc.alloc_ptr(size, StreamId(stream as u64)) {
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
    })
}

/// Opens a scope named `name` on the calling thread: the allocations this thread makes on
/// `device` carry it, nested in the scopes it already has open there, until
/// [`vramscope_pop_scope`]. PyTorch calls `alloc_fn` on the thread that runs the operation, so
/// a Python `with` block around a forward pass names its allocations (not those of the
/// backward pass, which autograd runs on a thread of its own). Returns 0, or -1 for a null or
/// non-UTF-8 name or a device that cannot be served (counted and logged), or for a scope that
/// would nest deeper than `MAX_SCOPE_DEPTH` (1024) levels: that scope is refused and nothing
/// is opened (do not pop it), and the refusal is counted in [`vramscope_error_count`] and
/// [`vramscope_scopes_refused`] (logged at the first refusal and then at each power of two,
/// so a program that never closes its scopes cannot flood standard error). A scope costs a few
/// bytes however deep it nests, so the table stays linear in the scopes opened.
///
/// # Safety
///
/// `name` must be null or point to a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn vramscope_push_scope(device: c_int, name: *const c_char) -> c_int {
    guarded("vramscope_push_scope", -1, || {
        if name.is_null() {
            report_error("vramscope_push_scope: null name".to_string());
            return -1;
        }
        // SAFETY: the caller promises a NUL-terminated string, checked non-null above.
        let Ok(name) = unsafe { CStr::from_ptr(name) }.to_str() else {
            report_error("vramscope_push_scope: the name is not UTF-8".to_string());
            return -1;
        };
        let Some(alloc) = allocator(device) else {
            return -1;
        };
        let Some(guard) = alloc.try_scope(name) else {
            let refused = SCOPES_REFUSED.fetch_add(1, Ordering::Relaxed) + 1;
            ERRORS.fetch_add(1, Ordering::Relaxed);
            let message = format!(
                "vramscope_push_scope: scope `{}` refused: scopes nest at most {MAX_SCOPE_DEPTH} \
                 levels ({refused} refused so far)",
                name.chars().take(64).collect::<String>()
            );
            if refused.is_power_of_two() {
                eprintln!("vramscope: {message}");
            }
            if let Ok(mut last) = LAST_ERROR.lock() {
                *last = message;
            }
            return -1;
        };
        match OPEN_SCOPES.try_with(|scopes| scopes.borrow_mut().push(guard)) {
            Ok(()) => 0,
            Err(_) => {
                report_error("vramscope_push_scope: the thread is exiting".to_string());
                -1
            }
        }
    })
}

/// Scopes [`vramscope_push_scope`] refused because they would nest deeper than
/// `MAX_SCOPE_DEPTH` (1024) levels, since the library was loaded.
#[no_mangle]
pub extern "C" fn vramscope_scopes_refused() -> u64 {
    SCOPES_REFUSED.load(Ordering::Relaxed)
}

/// Closes the innermost scope the calling thread opened with [`vramscope_push_scope`]. Returns
/// 0, or -1 when the thread has none open, or is exiting and its scopes are gone (counted and
/// logged).
#[no_mangle]
pub extern "C" fn vramscope_pop_scope() -> c_int {
    guarded("vramscope_pop_scope", -1, || {
        match OPEN_SCOPES
            .try_with(|scopes| scopes.borrow_mut().pop())
            .ok()
            .flatten()
        {
            Some(guard) => {
                drop(guard);
                0
            }
            None => {
                report_error("vramscope_pop_scope: no scope is open on this thread".to_string());
                -1
            }
        }
    })
}

/// Frees a pointer from [`vramscope_malloc`] (PyTorch's `free_fn`). A pointer that is unknown,
/// already freed or on another device is counted and logged; the call still returns.
#[no_mangle]
pub extern "C" fn vramscope_free(
    ptr: *mut c_void,
    _size: isize,
    device: c_int,
    _stream: *mut c_void,
) {
    guarded("vramscope_free", (), || {
        if ptr.is_null() {
            return;
        }
        let Some(alloc) = allocator(device) else {
            return;
        };
        if let Err(e) = alloc.free_ptr_on(ptr as u64, alloc.device()) {
            report_error(format!("vramscope_free: {e}"));
        }
    })
}

/// Releases every cached segment without live blocks on every device
/// (`torch.cuda.empty_cache()`). Returns the bytes released.
#[no_mangle]
pub extern "C" fn vramscope_empty_cache() -> u64 {
    guarded("vramscope_empty_cache", 0, || {
        live_allocators().map(|a| a.empty_cache()).sum()
    })
}

/// Marks the start of a training step on every device.
#[no_mangle]
pub extern "C" fn vramscope_mark_step() {
    guarded("vramscope_mark_step", (), || {
        for alloc in live_allocators() {
            alloc.mark_step();
        }
    })
}

/// Misuses and failures counted so far.
#[no_mangle]
pub extern "C" fn vramscope_error_count() -> u64 {
    ERRORS.load(Ordering::Relaxed)
}

/// Copies `text` and a terminating NUL into `buf` of `len` bytes when it fits; returns the
/// length of `text` (without the NUL), so a caller can retry with a larger buffer, or -1.
fn copy_out(text: &str, buf: *mut c_char, len: usize) -> isize {
    let needed = text.len();
    if !buf.is_null() && len > needed {
        // SAFETY: the caller promises `buf` points to `len` writable bytes; we write
        // `needed + 1 <= len` of them, and `text` does not overlap a caller's buffer.
        unsafe {
            std::ptr::copy_nonoverlapping(text.as_ptr(), buf.cast::<u8>(), needed);
            *buf.add(needed) = 0;
        }
    }
    isize::try_from(needed).unwrap_or(-1)
}

/// Writes the statistics of every device in use as JSON (an object keyed by device ordinal)
/// into `buf`. Returns the JSON's length; when that is `len` or more, nothing was written.
#[no_mangle]
pub extern "C" fn vramscope_stats_json(buf: *mut c_char, len: usize) -> isize {
    guarded("vramscope_stats_json", -1, || {
        let mut all = serde_json::Map::new();
        for alloc in live_allocators() {
            let stats = serde_json::to_value(alloc.stats()).unwrap_or_default();
            all.insert(alloc.device().to_string(), stats);
        }
        copy_out(&serde_json::Value::Object(all).to_string(), buf, len)
    })
}

/// Writes PyTorch's `memory_summary()` table for `device` into `buf`. Returns its length, or
/// -1 when the device was never used.
#[no_mangle]
pub extern "C" fn vramscope_memory_summary(device: c_int, buf: *mut c_char, len: usize) -> isize {
    guarded("vramscope_memory_summary", -1, || {
        let found = usize::try_from(device)
            .ok()
            .and_then(|i| ALLOCATORS.get(i))
            .and_then(|slot| slot.get())
            .and_then(Option::as_ref);
        match found {
            Some(alloc) => copy_out(&alloc.memory_summary(), buf, len),
            None => -1,
        }
    })
}

/// Writes a JSON snapshot of every device in use: device 0 (or the first in use) to `path`,
/// any other device `N` to `path` with `.deviceN.json` appended. Returns 0, or -1 on failure
/// (counted and logged).
///
/// # Safety
///
/// `path` must be null or point to a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn vramscope_snapshot(path: *const c_char) -> c_int {
    guarded("vramscope_snapshot", -1, || {
        if path.is_null() {
            report_error("vramscope_snapshot: null path".to_string());
            return -1;
        }
        // SAFETY: the caller promises a NUL-terminated string, checked non-null above.
        let path = unsafe { CStr::from_ptr(path) }
            .to_string_lossy()
            .into_owned();
        write_snapshots(&path)
    })
}

fn write_snapshots(path: &str) -> c_int {
    let mut status = 0;
    for (i, alloc) in live_allocators().enumerate() {
        let target = if i == 0 {
            path.to_string()
        } else {
            format!("{path}.device{}.json", alloc.device())
        };
        if let Err(e) = alloc.snapshot().save(&target) {
            report_error(format!("vramscope_snapshot: {e}"));
            status = -1;
        }
    }
    status
}

extern "C" fn snapshot_at_exit() {
    guarded("snapshot_at_exit", (), || {
        if let Ok(path) = std::env::var(SNAPSHOT_ON_EXIT_ENV) {
            if !path.is_empty() && write_snapshots(&path) == 0 {
                eprintln!("vramscope: snapshot written to {path}");
            }
        }
    })
}

extern "C" {
    fn atexit(callback: extern "C" fn()) -> c_int;
}

/// Starts the live-telemetry publisher for the first device opened, when `VRAMSCOPE_LISTEN`
/// asks for one; a failure is logged, never fatal.
fn start_telemetry(alloc: &CachingAllocator<DeviceBackend>) {
    let Ok(mut slot) = TELEMETRY.lock() else {
        return;
    };
    if slot.is_some() {
        return;
    }
    match Telemetry::from_env(alloc) {
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

/// Starts the Prometheus `/metrics` server once, when `VRAMSCOPE_METRICS` asks for one: it
/// reads every device in use at each scrape; a failure is logged, never fatal.
fn start_metrics() {
    let Ok(mut slot) = METRICS.lock() else {
        return;
    };
    if slot.is_some() {
        return;
    }
    let source: StatsSource = Box::new(|| {
        live_allocators()
            .map(|alloc| (alloc.device(), alloc.stats()))
            .collect()
    });
    match MetricsServer::from_env(source) {
        Ok(Some(server)) => {
            eprintln!(
                "vramscope: serving metrics on http://{}/metrics",
                server.addr()
            );
            *slot = Some(server);
        }
        Ok(None) => {}
        Err(e) => report_error(format!("metrics not served: {e}")),
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panic_inside_an_entry_point_is_an_error_return_not_an_abort() {
        let before = vramscope_error_count();
        let value = guarded("vramscope_test", -1, || -> c_int { panic!("planted") });
        assert_eq!(value, -1);
        assert_eq!(vramscope_error_count(), before + 1);
        let last = LAST_ERROR.lock().unwrap().clone();
        assert!(
            last.contains("vramscope_test") && last.contains("planted"),
            "{last}"
        );
        assert_eq!(guarded("vramscope_test", -1, || 7), 7);
    }
}
