//! The `CUDAPluggableAllocator` library inside the Python extension: `vramscope_malloc` and
//! `vramscope_free` (C symbols of this very module), one caching allocator per device, and the
//! Python functions that read and steer it (`vramscope.use_allocator()` and friends).
//!
//! Each allocation carries the Python stack of the thread that asked for it when that thread
//! runs Python ([`StackMode`]): PyTorch calls `alloc_fn` from C++ on the thread that runs the
//! operation, usually after its binding released the GIL. In the default mode, `python`, a
//! thread that has a Python thread state takes the GIL for the walk, as PyTorch's own
//! `_record_memory_history` does, and before the allocator's lock (so the lock is never held
//! while waiting for the GIL); a thread without one (autograd's backward thread, any C++
//! thread) never takes it, and a sample of its allocations carries a native stack instead
//! ([`crate::native`]), named in reports by the autograd node it runs in; the others keep the
//! Rust site. `held` walks only when the GIL is already held; `off` never walks.
//!
//! Misuse never aborts the host process: a bad pointer or device is counted and logged, and
//! every entry point runs under `catch_unwind`, as in `vramscope-ffi`.

use std::ffi::{c_int, c_void};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::{Mutex, OnceLock};

use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::ffi;
use pyo3::prelude::*;
use vramscope_allocator::provenance::with_call_site;
use vramscope_allocator::DeviceBackend;
use vramscope_allocator::Telemetry;
use vramscope_allocator::{AllocError, CachingAllocator, ScopeGuard, SimDevice, StreamId};
use vramscope_model::{AllocatorConfig, CallSite, Snapshot};
use vramscope_telemetry::TelemetryAddr;

use crate::analysis;
use crate::host::{self, HostLog, Numbering};
use crate::native;
use crate::stack;

/// Devices served (ordinals `0..MAX_DEVICES`).
const MAX_DEVICES: usize = 64;

/// Capacity of the simulated device (`VRAMSCOPE_BACKEND=sim`): addresses only.
const SIM_CAPACITY: u64 = 1 << 40;

static ALLOCATORS: [OnceLock<Option<CachingAllocator<DeviceBackend>>>; MAX_DEVICES] =
    [const { OnceLock::new() }; MAX_DEVICES];
static ERRORS: AtomicU64 = AtomicU64::new(0);
static LAST_ERROR: Mutex<String> = Mutex::new(String::new());
static TELEMETRY: Mutex<Option<Telemetry>> = Mutex::new(None);
static LISTEN: Mutex<Option<String>> = Mutex::new(None);
static ARMED: AtomicBool = AtomicBool::new(false);
/// Per device, the snapshot taken at the latest step mark while armed.
static STEP_SNAPSHOTS: Mutex<Vec<(u32, Snapshot)>> = Mutex::new(Vec::new());
static STACK_MODE: AtomicU8 = AtomicU8::new(StackMode::Python as u8);

thread_local! {
    static OPEN_SCOPES: std::cell::RefCell<Vec<ScopeGuard>> =
        const { std::cell::RefCell::new(Vec::new()) };
}

/// When `vramscope_malloc` walks the Python stack.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum StackMode {
    /// Never.
    Off = 0,
    /// Only when the allocating thread already holds the GIL.
    Held = 1,
    /// On every thread that has a Python thread state, taking the GIL when it was released.
    Python = 2,
}

impl StackMode {
    fn parse(text: &str) -> Option<StackMode> {
        match text {
            "off" => Some(StackMode::Off),
            "held" => Some(StackMode::Held),
            "python" => Some(StackMode::Python),
            _ => None,
        }
    }

    fn name(self) -> &'static str {
        match self {
            StackMode::Off => "off",
            StackMode::Held => "held",
            StackMode::Python => "python",
        }
    }

    fn current() -> StackMode {
        match STACK_MODE.load(Ordering::Relaxed) {
            0 => StackMode::Off,
            1 => StackMode::Held,
            _ => StackMode::Python,
        }
    }
}

fn report_error(message: String) {
    ERRORS.fetch_add(1, Ordering::Relaxed);
    eprintln!("vramscope: {message}");
    if let Ok(mut last) = LAST_ERROR.lock() {
        *last = message;
    }
}

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

fn allocator(device: c_int) -> Option<&'static CachingAllocator<DeviceBackend>> {
    let Some(slot) = usize::try_from(device).ok().and_then(|i| ALLOCATORS.get(i)) else {
        report_error(format!(
            "device {device} is not a device this library serves"
        ));
        return None;
    };
    slot.get_or_init(|| {
        let config = AllocatorConfig::from_env().unwrap_or_else(|e| {
            report_error(format!("{e}; using the default settings"));
            AllocatorConfig::default()
        });
        match open_backend(device as u32) {
            Ok(backend) => {
                let alloc = CachingAllocator::new(backend, config);
                start_telemetry(&alloc);
                Some(alloc)
            }
            Err(reason) => {
                report_error(format!("cannot open device {device}: {reason}"));
                None
            }
        }
    })
    .as_ref()
}

fn opened(device: c_int) -> Option<&'static CachingAllocator<DeviceBackend>> {
    usize::try_from(device)
        .ok()
        .and_then(|i| ALLOCATORS.get(i))
        .and_then(|slot| slot.get())
        .and_then(Option::as_ref)
}

fn live_allocators() -> impl Iterator<Item = &'static CachingAllocator<DeviceBackend>> {
    ALLOCATORS
        .iter()
        .filter_map(|slot| slot.get().and_then(Option::as_ref))
}

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

/// The Python stack of the calling thread, per the [`StackMode`]; never takes the GIL on a
/// thread without a Python thread state, where a sampled native stack stands in for it.
fn python_site() -> Option<&'static CallSite> {
    let mode = StackMode::current();
    if mode == StackMode::Off {
        return None;
    }
    if stack::gil_held() {
        // SAFETY: the GIL is held.
        return unsafe { stack::capture() };
    }
    // SAFETY: both calls are valid from any thread of an initialized interpreter; the thread
    // state is only compared with null, never dereferenced.
    let has_python_state =
        unsafe { ffi::Py_IsInitialized() != 0 && !ffi::PyGILState_GetThisThreadState().is_null() };
    if !has_python_state {
        return native::sampled_site();
    }
    if mode != StackMode::Python {
        return None;
    }
    // SAFETY: this thread has a Python thread state and does not hold the GIL (checked above),
    // so `PyGILState_Ensure` takes it back (waiting for the holder, as PyTorch's own stack
    // capture does) and `PyGILState_Release` returns the thread to the state it was in. No
    // lock of ours is held here.
    unsafe {
        let state = ffi::PyGILState_Ensure();
        let site = stack::capture();
        ffi::PyGILState_Release(state);
        site
    }
}

/// Allocates `size` bytes on `device` for `stream` (PyTorch's `alloc_fn`). Null when the
/// device is out of memory (the report goes to standard error) or on misuse.
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
        let stream = StreamId(stream as u64);
        let result = match python_site() {
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
    })
}

/// Frees a pointer from [`vramscope_malloc`] (PyTorch's `free_fn`); misuse is counted and
/// logged, and the call returns.
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
        let Some(alloc) = opened(device) else {
            report_error(format!(
                "vramscope_free: {ptr:?} on device {device}, which never allocated"
            ));
            return;
        };
        if let Err(e) = alloc.free_ptr_on(ptr as u64, alloc.device()) {
            report_error(format!("vramscope_free: {e}"));
        }
    })
}

/// Releases every cached segment without live blocks on every device; returns the bytes.
#[no_mangle]
pub extern "C" fn vramscope_empty_cache() -> u64 {
    guarded("vramscope_empty_cache", 0, || {
        live_allocators().map(|a| a.empty_cache()).sum()
    })
}

fn device_or_err(device: i32) -> PyResult<&'static CachingAllocator<DeviceBackend>> {
    opened(device).ok_or_else(|| {
        PyRuntimeError::new_err(format!(
            "vramscope's allocator has not served device {device}: call \
             vramscope.use_allocator() before the first CUDA allocation"
        ))
    })
}

/// Sets when `vramscope_malloc` walks the Python stack: `"python"`, `"held"` or `"off"`.
#[pyfunction]
pub fn set_stack_mode(mode: &str) -> PyResult<()> {
    let parsed = StackMode::parse(mode).ok_or_else(|| {
        PyValueError::new_err(format!(
            "unknown stack mode `{mode}` (expected python, held or off)"
        ))
    })?;
    STACK_MODE.store(parsed as u8, Ordering::Relaxed);
    Ok(())
}

/// The stack mode in force.
#[pyfunction]
pub fn stack_mode() -> &'static str {
    StackMode::current().name()
}

/// Where the first device opened publishes live telemetry (`unix:PATH` or `tcp:ADDR`);
/// takes effect when that device is opened, so call it before the first allocation.
#[pyfunction]
pub fn set_listen(addr: Option<String>) {
    if let Ok(mut listen) = LISTEN.lock() {
        *listen = addr;
    }
}

/// Starts a step on every device served.
#[pyfunction]
pub fn device_mark_step() {
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

/// While `on`, each step mark keeps every device's snapshot from just before it, for the
/// leak check (see `SimAllocator.arm`); disarming drops them.
#[pyfunction]
pub fn device_arm(on: bool) {
    ARMED.store(on, Ordering::Relaxed);
    if !on {
        if let Ok(mut kept) = STEP_SNAPSHOTS.lock() {
            kept.clear();
        }
    }
}

/// Opens the scope `name` on this thread for `device`'s allocations. Raises `RuntimeError` for
/// a scope that would nest deeper than `MAX_SCOPE_DEPTH` (1024) levels: nothing is opened.
#[pyfunction]
pub fn device_push_scope(device: i32, name: &str) -> PyResult<()> {
    let alloc = allocator(device)
        .ok_or_else(|| PyRuntimeError::new_err(format!("cannot open device {device}")))?;
    let guard = alloc
        .try_scope(name)
        .ok_or_else(|| PyRuntimeError::new_err(crate::sim::scope_refused(name)))?;
    OPEN_SCOPES.with(|scopes| scopes.borrow_mut().push(guard));
    Ok(())
}

/// Closes the innermost scope this thread opened with [`device_push_scope`].
#[pyfunction]
pub fn device_pop_scope() -> PyResult<()> {
    OPEN_SCOPES
        .with(|scopes| scopes.borrow_mut().pop())
        .map(drop)
        .ok_or_else(|| PyRuntimeError::new_err("no vramscope scope is open on this thread"))
}

/// `device`'s snapshot, its native stacks symbolized, with the syncs of `log` (whose steps are
/// the allocator's: the session marks both with one call).
fn snapshot_with(device: i32, log: Option<&HostLog>) -> PyResult<Snapshot> {
    let mut snapshot = device_or_err(device)?.snapshot();
    native::symbolize(&mut snapshot);
    Ok(host::with_log(snapshot, log, Numbering::Same))
}

/// Writes `device`'s snapshot, with the syncs of `log`, as JSON to `path`.
#[pyfunction]
#[pyo3(signature = (device, path, log = None))]
pub fn device_snapshot(device: i32, path: &str, log: Option<Bound<'_, HostLog>>) -> PyResult<()> {
    snapshot_with(device, log.as_ref().map(Bound::get))?
        .save(path)
        .map_err(|e| PyRuntimeError::new_err(e.to_string()))
}

/// `device`'s `memory_summary()` table.
#[pyfunction]
pub fn device_memory_summary(device: i32) -> PyResult<String> {
    Ok(device_or_err(device)?.memory_summary())
}

/// `device`'s statistics as JSON.
#[pyfunction]
pub fn device_stats_json(device: i32) -> PyResult<String> {
    Ok(serde_json::to_string(&device_or_err(device)?.stats()).unwrap_or_default())
}

/// The inspector's findings on `device`'s snapshot, with the syncs of `log`, as JSON.
#[pyfunction]
#[pyo3(signature = (device, log = None))]
pub fn device_findings_json(device: i32, log: Option<Bound<'_, HostLog>>) -> PyResult<String> {
    let log = log.as_ref().map(Bound::get);
    Ok(analysis::findings_json(&snapshot_with(device, log)?))
}

/// The inspector's text report on `device`'s snapshot, with the syncs of `log`.
#[pyfunction]
#[pyo3(signature = (device, log = None))]
pub fn device_report_text(device: i32, log: Option<Bound<'_, HostLog>>) -> PyResult<String> {
    let log = log.as_ref().map(Bound::get);
    Ok(analysis::report_text(&snapshot_with(device, log)?))
}

/// The checks of the pytest marker that `device`'s snapshot, with the syncs of `log`, fails.
#[pyfunction]
#[pyo3(signature = (device, max_peak = None, no_leaks = false, max_syncs_per_step = None, log = None))]
pub fn device_check(
    device: i32,
    max_peak: Option<u64>,
    no_leaks: bool,
    max_syncs_per_step: Option<u64>,
    log: Option<Bound<'_, HostLog>>,
) -> PyResult<Vec<String>> {
    let at_step = STEP_SNAPSHOTS.lock().ok().and_then(|kept| {
        kept.iter()
            .find(|(d, _)| i32::try_from(*d) == Ok(device))
            .map(|(_, s)| s.clone())
    });
    Ok(analysis::check_with_step(
        &snapshot_with(device, log.as_ref().map(Bound::get))?,
        at_step.as_ref(),
        analysis::Limits {
            max_peak,
            no_leaks,
            max_syncs_per_step,
        },
    ))
}

/// The devices this library has served.
#[pyfunction]
pub fn devices_served() -> Vec<u32> {
    live_allocators().map(|a| a.device()).collect()
}

/// Misuses and failures counted so far, and the last one's message.
#[pyfunction]
pub fn errors() -> (u64, String) {
    let last = LAST_ERROR.lock().map(|l| l.clone()).unwrap_or_default();
    (ERRORS.load(Ordering::Relaxed), last)
}
