//! The `CUDAPluggableAllocator` library inside the Python extension: the Python stack of each
//! allocation as its call site, and the Python functions that read and steer the allocator
//! (`vramscope.use_allocator()` and friends).
//!
//! The allocator itself is `vramscope-ffi`'s, linked into this module: its C symbols
//! (`vramscope_malloc`, `vramscope_free` and the rest) are this module's own exported symbols,
//! so PyTorch loads the module's file by path as the pluggable allocator library, and its
//! table of one caching allocator per device is the one these functions read. [`register`]
//! adds them to the module and gives the table [`python_site`] as its call-site provider.
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

use std::sync::atomic::{AtomicU8, Ordering};

use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::ffi;
use pyo3::prelude::*;
use vramscope_allocator::metrics::MetricsError;
use vramscope_allocator::{CachingAllocator, DeviceBackend};
use vramscope_ffi::ScopeError;
use vramscope_model::{CallSite, Snapshot};

use crate::analysis;
use crate::host::{self, HostLog, Numbering};
use crate::native;
use crate::stack;

static STACK_MODE: AtomicU8 = AtomicU8::new(StackMode::Python as u8);

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

/// The Python stack of the calling thread, per the [`StackMode`]; never takes the GIL on a
/// thread without a Python thread state, where a sampled native stack stands in for it. The
/// allocator table's call-site provider: `vramscope_malloc` calls it before taking the
/// device's lock.
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

/// Adds the functions of this module to `m` and makes [`python_site`] the allocator table's
/// call-site provider (a second import finds it set and changes nothing).
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    vramscope_ffi::set_call_site_provider(python_site);
    m.add_function(wrap_pyfunction!(set_stack_mode, m)?)?;
    m.add_function(wrap_pyfunction!(stack_mode, m)?)?;
    m.add_function(wrap_pyfunction!(set_listen, m)?)?;
    m.add_function(wrap_pyfunction!(serve_metrics, m)?)?;
    m.add_function(wrap_pyfunction!(device_mark_step, m)?)?;
    m.add_function(wrap_pyfunction!(device_arm, m)?)?;
    m.add_function(wrap_pyfunction!(device_push_scope, m)?)?;
    m.add_function(wrap_pyfunction!(device_pop_scope, m)?)?;
    m.add_function(wrap_pyfunction!(device_snapshot, m)?)?;
    m.add_function(wrap_pyfunction!(device_memory_summary, m)?)?;
    m.add_function(wrap_pyfunction!(device_stats, m)?)?;
    m.add_function(wrap_pyfunction!(device_findings, m)?)?;
    m.add_function(wrap_pyfunction!(device_report_text, m)?)?;
    m.add_function(wrap_pyfunction!(device_check, m)?)?;
    m.add_function(wrap_pyfunction!(device_next_event_seq, m)?)?;
    m.add_function(wrap_pyfunction!(devices_served, m)?)?;
    m.add_function(wrap_pyfunction!(errors, m)?)?;
    Ok(())
}

fn device_or_err(device: i32) -> PyResult<&'static CachingAllocator<DeviceBackend>> {
    vramscope_ffi::opened(device).ok_or_else(|| {
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
    vramscope_ffi::set_listen(addr);
}

/// Serves Prometheus `/metrics` for every device of the allocator, now: on `addr`
/// (`HOST:PORT`, port 0 picks one) when given, else where `VRAMSCOPE_METRICS` says. Returns
/// the address served (`HOST:PORT`), or `None` when neither asks for a server; once a server
/// runs, returns its address. Raises `ValueError` for an address that is not `HOST:PORT` or
/// not on the loopback interface (unless `VRAMSCOPE_METRICS_ALLOW_REMOTE=1`), `RuntimeError`
/// when the server cannot listen.
#[pyfunction]
#[pyo3(signature = (addr = None))]
pub fn serve_metrics(addr: Option<&str>) -> PyResult<Option<String>> {
    match vramscope_ffi::serve_metrics(addr) {
        Ok(served) => Ok(served.map(|a| a.to_string())),
        Err(e @ (MetricsError::BadAddress(_) | MetricsError::NotLoopback(_))) => {
            Err(PyValueError::new_err(e.to_string()))
        }
        Err(e) => Err(PyRuntimeError::new_err(e.to_string())),
    }
}

/// Starts a step on every device served (keeping each one's snapshot first while armed).
#[pyfunction]
pub fn device_mark_step() {
    vramscope_ffi::mark_step();
}

/// While `on`, each step mark keeps every device's snapshot from just before it, for the
/// leak check (see `SimAllocator.arm`); disarming drops them.
#[pyfunction]
pub fn device_arm(on: bool) {
    vramscope_ffi::arm(on);
}

/// Opens the scope `name` on this thread for `device`'s allocations. Raises `RuntimeError` for
/// a scope that would nest deeper than `MAX_SCOPE_DEPTH` (1024) levels: nothing is opened.
#[pyfunction]
pub fn device_push_scope(device: i32, name: &str) -> PyResult<()> {
    vramscope_ffi::push_scope(device, name).map_err(|e| match e {
        ScopeError::TooDeep { .. } => PyRuntimeError::new_err(crate::sim::scope_refused(name)),
        other => PyRuntimeError::new_err(other.to_string()),
    })
}

/// Closes the innermost scope this thread opened with [`device_push_scope`].
#[pyfunction]
pub fn device_pop_scope() -> PyResult<()> {
    vramscope_ffi::pop_scope()
        .map_err(|_| PyRuntimeError::new_err("no vramscope scope is open on this thread"))
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

/// `device`'s statistics, PyTorch's `memory_stats()` figures as nested dictionaries.
#[pyfunction]
pub fn device_stats(py: Python<'_>, device: i32) -> PyResult<Bound<'_, PyAny>> {
    crate::report::stats_to_py(py, &device_or_err(device)?.stats())
}

/// The inspector's findings on `device`'s snapshot, with the syncs of `log`, most severe
/// first.
#[pyfunction]
#[pyo3(signature = (device, log = None))]
pub fn device_findings(
    device: i32,
    log: Option<Bound<'_, HostLog>>,
) -> PyResult<Vec<crate::report::Finding>> {
    let log = log.as_ref().map(Bound::get);
    Ok(crate::report::findings_of(&snapshot_with(device, log)?))
}

/// The inspector's text report on `device`'s snapshot, with the syncs of `log`.
#[pyfunction]
#[pyo3(signature = (device, log = None))]
pub fn device_report_text(device: i32, log: Option<Bound<'_, HostLog>>) -> PyResult<String> {
    let log = log.as_ref().map(Bound::get);
    Ok(analysis::report_text(&snapshot_with(device, log)?))
}

/// The checks of the pytest marker that `device`'s snapshot, with the syncs of `log`, fails.
/// `since` is [`device_next_event_seq`] when the test began (see `SimAllocator.check`).
#[pyfunction]
#[pyo3(signature = (device, max_peak = None, no_leaks = false, max_syncs_per_step = None, log = None, since = None))]
pub fn device_check(
    device: i32,
    max_peak: Option<u64>,
    no_leaks: bool,
    max_syncs_per_step: Option<u64>,
    log: Option<Bound<'_, HostLog>>,
    since: Option<u64>,
) -> PyResult<Vec<String>> {
    let at_step = u32::try_from(device)
        .ok()
        .and_then(vramscope_ffi::step_snapshot);
    Ok(analysis::check_with_step(
        &snapshot_with(device, log.as_ref().map(Bound::get))?,
        at_step.as_ref(),
        analysis::Limits::new(max_peak, no_leaks, max_syncs_per_step, since),
    ))
}

/// The sequence number `device`'s allocator gives its next event: the mark a check's `since`
/// takes; 0 for a device not opened yet (it has no events).
#[pyfunction]
pub fn device_next_event_seq(device: i32) -> u64 {
    vramscope_ffi::opened(device).map_or(0, |alloc| alloc.next_event_seq())
}

/// The devices this library has served.
#[pyfunction]
pub fn devices_served() -> Vec<u32> {
    vramscope_ffi::devices_served()
}

/// Misuses and failures counted so far, and the last one's message.
#[pyfunction]
pub fn errors() -> (u64, String) {
    (vramscope_ffi::error_count(), vramscope_ffi::last_error())
}
