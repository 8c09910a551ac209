//! `vramscope._native`: the one native module of the `vramscope` Python package.
//!
//! It is at once the Python extension and the `CUDAPluggableAllocator` library: PyTorch loads
//! this file by path and calls its `vramscope_malloc`/`vramscope_free` C symbols
//! ([`pluggable`], with sampled native stacks on threads without Python: [`native`]), while
//! Python imports it for [`sim::SimAllocator`] (the caching allocator on a simulated device),
//! the functions that steer the pluggable allocator, the inspector's reports on any file
//! PyTorch or vramscope wrote ([`analysis`]), the synchronizing calls PyTorch reports, merged
//! into those reports ([`host`]), live telemetry of PyTorch's own allocator for `attach()`
//! ([`live`]), and the Python stack capture settings ([`stack`]). The Python package
//! (`python/vramscope/`) wraps all of it.

mod analysis;
mod host;
mod live;
mod native;
mod pluggable;
mod sim;
mod stack;

use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use vramscope_inspector::import;

use crate::host::{HostLog, Numbering};

/// Loads `path` (a vramscope snapshot, a PyTorch snapshot pickle, a profiler trace).
fn load(path: &str) -> PyResult<vramscope_model::Snapshot> {
    import::load(path).map_err(|e| PyValueError::new_err(e.to_string()))
}

/// Loads `path` with `log`'s syncs and steps merged in by time (the file numbers its own
/// steps: a PyTorch snapshot of `attach()`).
fn load_with(path: &str, log: Option<&HostLog>) -> PyResult<vramscope_model::Snapshot> {
    Ok(host::with_log(load(path)?, log, Numbering::ByTime))
}

/// The inspector's findings on the file at `path`, as JSON, with the syncs of `log`.
#[pyfunction]
#[pyo3(signature = (path, log = None))]
fn file_findings_json(path: &str, log: Option<Bound<'_, HostLog>>) -> PyResult<String> {
    let log = log.as_ref().map(Bound::get);
    Ok(analysis::findings_json(&load_with(path, log)?))
}

/// The inspector's text report on the file at `path`, with the syncs of `log`.
#[pyfunction]
#[pyo3(signature = (path, log = None))]
fn file_report_text(path: &str, log: Option<Bound<'_, HostLog>>) -> PyResult<String> {
    let log = log.as_ref().map(Bound::get);
    Ok(analysis::report_text(&load_with(path, log)?))
}

/// The checks of the pytest marker that the file at `path`, with the syncs of `log`, fails.
#[pyfunction]
#[pyo3(signature = (path, max_peak = None, no_leaks = false, max_syncs_per_step = None, log = None))]
fn file_check(
    path: &str,
    max_peak: Option<u64>,
    no_leaks: bool,
    max_syncs_per_step: Option<u64>,
    log: Option<Bound<'_, HostLog>>,
) -> PyResult<Vec<String>> {
    Ok(analysis::check(
        &load_with(path, log.as_ref().map(Bound::get))?,
        analysis::Limits {
            max_peak,
            no_leaks,
            max_syncs_per_step,
        },
    ))
}

/// Writes the file at `path` (a PyTorch snapshot pickle, say) as a vramscope snapshot to
/// `out`, with the syncs and steps of `log`.
#[pyfunction]
#[pyo3(signature = (path, out, log = None))]
fn file_convert(path: &str, out: &str, log: Option<Bound<'_, HostLog>>) -> PyResult<()> {
    load_with(path, log.as_ref().map(Bound::get))?
        .save(out)
        .map_err(|e| PyRuntimeError::new_err(e.to_string()))
}

/// Bytes from a size such as `"24GB"` or `"1.5 GiB"`: the one parser the command line's
/// `--capacity` uses too (`vramscope_model::parse_bytes`), with binary units throughout, as GPU
/// memory is sold (`"24GB"` is 24 GiB).
#[pyfunction]
fn parse_bytes(text: &str) -> PyResult<u64> {
    vramscope_model::parse_bytes(text).map_err(pyo3::exceptions::PyValueError::new_err)
}

/// `bytes` as a human figure (`"1.50 GiB"`).
#[pyfunction]
fn format_bytes(bytes: u64) -> String {
    analysis::human(bytes)
}

/// The most Python frames a capture walks.
#[pyfunction]
fn stack_depth() -> usize {
    stack::max_depth()
}

/// Sets the most Python frames a capture walks.
#[pyfunction]
fn set_stack_depth(depth: usize) {
    stack::set_max_depth(depth);
}

/// Treats frames whose path contains one of `paths` as framework code (never a site's line).
#[pyfunction]
fn add_framework_paths(paths: Vec<String>) {
    stack::add_framework_paths(paths);
}

/// Distinct Python stacks interned so far.
#[pyfunction]
fn cached_stacks() -> usize {
    stack::cached_stacks()
}

/// Whether the stack cache keys frames by instruction offset (CPython 3.11 and later) rather
/// than by line.
#[pyfunction]
fn stack_keyed_by_offset() -> bool {
    stack::keyed_by_offset()
}

/// A frame as Python sees it: `(file, line, function)`.
type PyFrame = (String, u32, String);

/// The calling thread's Python stack as vramscope interns it: `(file, line, function, frames)`
/// with frames as `(file, line, function)`, innermost first; `None` without Python frames.
#[pyfunction]
fn current_site(py: Python<'_>) -> Option<(String, u32, String, Vec<PyFrame>)> {
    let _ = py;
    // SAFETY: a `#[pyfunction]` runs with the GIL held (`py` proves it).
    let site = unsafe { stack::capture() }?;
    Some((
        site.file.clone(),
        site.line,
        site.function.clone(),
        site.frames
            .iter()
            .map(|f| (f.file.clone(), f.line, f.function.clone()))
            .collect(),
    ))
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    if let Some(depth) = std::env::var("VRAMSCOPE_PY_STACK_DEPTH")
        .ok()
        .and_then(|v| v.trim().parse::<usize>().ok())
    {
        stack::set_max_depth(depth);
    }
    if let Some(every) = std::env::var(native::ENV_EVERY)
        .ok()
        .and_then(|v| v.trim().parse::<u32>().ok())
    {
        native::set_every(every);
    }
    // The native stacks' placeholders are named when they leave the allocator, live telemetry
    // included; a second initialisation finds the same resolver registered and changes nothing.
    vramscope_allocator::provenance::set_external_site_resolver(native::resolve_site);
    m.add_class::<sim::SimAllocator>()?;
    m.add_class::<sim::Block>()?;
    m.add_class::<sim::ScopeToken>()?;
    m.add_class::<HostLog>()?;
    m.add_class::<live::LivePublisher>()?;
    m.add_function(wrap_pyfunction!(live::read_telemetry, m)?)?;
    m.add_function(wrap_pyfunction!(file_findings_json, m)?)?;
    m.add_function(wrap_pyfunction!(file_report_text, m)?)?;
    m.add_function(wrap_pyfunction!(file_check, m)?)?;
    m.add_function(wrap_pyfunction!(file_convert, m)?)?;
    m.add_function(wrap_pyfunction!(parse_bytes, m)?)?;
    m.add_function(wrap_pyfunction!(format_bytes, m)?)?;
    m.add_function(wrap_pyfunction!(stack_depth, m)?)?;
    m.add_function(wrap_pyfunction!(set_stack_depth, m)?)?;
    m.add_function(wrap_pyfunction!(add_framework_paths, m)?)?;
    m.add_function(wrap_pyfunction!(cached_stacks, m)?)?;
    m.add_function(wrap_pyfunction!(stack_keyed_by_offset, m)?)?;
    m.add_function(wrap_pyfunction!(current_site, m)?)?;
    m.add_function(wrap_pyfunction!(native::set_native_stacks, m)?)?;
    m.add_function(wrap_pyfunction!(native::native_stacks, m)?)?;
    m.add_function(wrap_pyfunction!(native::alloc_on_native_thread, m)?)?;
    m.add_function(wrap_pyfunction!(native::time_native_thread_pairs, m)?)?;
    m.add_function(wrap_pyfunction!(pluggable::set_stack_mode, m)?)?;
    m.add_function(wrap_pyfunction!(pluggable::stack_mode, m)?)?;
    m.add_function(wrap_pyfunction!(pluggable::set_listen, m)?)?;
    m.add_function(wrap_pyfunction!(pluggable::device_mark_step, m)?)?;
    m.add_function(wrap_pyfunction!(pluggable::device_arm, m)?)?;
    m.add_function(wrap_pyfunction!(pluggable::device_push_scope, m)?)?;
    m.add_function(wrap_pyfunction!(pluggable::device_pop_scope, m)?)?;
    m.add_function(wrap_pyfunction!(pluggable::device_snapshot, m)?)?;
    m.add_function(wrap_pyfunction!(pluggable::device_memory_summary, m)?)?;
    m.add_function(wrap_pyfunction!(pluggable::device_stats_json, m)?)?;
    m.add_function(wrap_pyfunction!(pluggable::device_findings_json, m)?)?;
    m.add_function(wrap_pyfunction!(pluggable::device_report_text, m)?)?;
    m.add_function(wrap_pyfunction!(pluggable::device_check, m)?)?;
    m.add_function(wrap_pyfunction!(pluggable::devices_served, m)?)?;
    m.add_function(wrap_pyfunction!(pluggable::errors, m)?)?;
    Ok(())
}
