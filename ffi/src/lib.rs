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
//! `/metrics` endpoint for every device in use ([`vramscope_metrics_addr`] says where, when the
//! port was 0).
//!
//! Through this ABI alone vramscope sees no caller's stack (PyTorch calls in from C++), so
//! every allocation has the same call site unless a host that links this crate names one
//! ([`CallSiteProvider`]); [`vramscope_push_scope`] and [`vramscope_pop_scope`] let
//! the program name what it is doing instead, and the snapshot and the dashboard show those
//! scopes.
//!
//! The table of allocators and the services behind these entry points live in [`pluggable`],
//! whose Rust API ([`set_call_site_provider`], [`allocator`], [`push_scope`],
//! [`serve_metrics`] and the rest) lets a host that links this crate steer the same table:
//! the Python extension `vramscope._native` links it, names each allocation by its Python
//! stack through a [`CallSiteProvider`], and exports these C symbols as its own, so PyTorch
//! can load the Python module's file as the pluggable allocator library.
//!
//! Misuse never aborts the host process: a free of an unknown or already-freed pointer, a
//! negative size or a bad device is counted ([`vramscope_error_count`]) and logged to standard
//! error, and the call returns. Nor does a bug of ours: every entry point runs its body under
//! `catch_unwind` (`guarded`), so a panic becomes a logged, counted error and the entry
//! point's failure value (null, -1, 0), never an unwind across the C boundary (which aborts).

use std::ffi::{c_char, c_int, c_void, CStr};
use std::panic::{catch_unwind, AssertUnwindSafe};

pub mod pluggable;

pub use pluggable::{
    allocator, arm, devices_served, empty_cache, error_count, last_error, live_allocators,
    mark_step, metrics_addr, opened, pop_scope, push_scope, scopes_refused, serve_metrics,
    set_call_site_provider, set_listen, step_snapshot, CallSiteProvider, ScopeError, MAX_DEVICES,
    SNAPSHOT_ON_EXIT_ENV,
};

use pluggable::{count_error, report_error, set_last_error};

/// Runs the body of the entry point `entry`, turning a panic into `failure` (counted and
/// logged like a misuse): unwinding out of an `extern "C"` function aborts the host process.
pub(crate) fn guarded<T>(entry: &str, failure: T, body: impl FnOnce() -> T) -> T {
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
/// the device is out of memory (the report goes to standard error) or on misuse. The
/// allocation's call site is the [`CallSiteProvider`]'s when a host set one.
#[no_mangle]
pub extern "C" fn vramscope_malloc(size: isize, device: c_int, stream: *mut c_void) -> *mut c_void {
    guarded("vramscope_malloc", std::ptr::null_mut(), || {
        pluggable::allocate(size, device, stream)
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
        match push_scope(device, name) {
            Ok(()) => 0,
            // The table counted and logged why the device cannot be served.
            Err(ScopeError::Device(_)) => -1,
            Err(e @ ScopeError::TooDeep { refused, .. }) => {
                count_error();
                let message = format!("vramscope_push_scope: {e}");
                if refused.is_power_of_two() {
                    eprintln!("vramscope: {message}");
                }
                set_last_error(message);
                -1
            }
            Err(e) => {
                report_error(format!("vramscope_push_scope: {e}"));
                -1
            }
        }
    })
}

/// Scopes [`vramscope_push_scope`] refused because they would nest deeper than
/// `MAX_SCOPE_DEPTH` (1024) levels, since the library was loaded.
#[no_mangle]
pub extern "C" fn vramscope_scopes_refused() -> u64 {
    scopes_refused()
}

/// Closes the innermost scope the calling thread opened with [`vramscope_push_scope`]. Returns
/// 0, or -1 when the thread has none open, or is exiting and its scopes are gone (counted and
/// logged).
#[no_mangle]
pub extern "C" fn vramscope_pop_scope() -> c_int {
    guarded("vramscope_pop_scope", -1, || match pop_scope() {
        Ok(()) => 0,
        Err(e) => {
            report_error(format!("vramscope_pop_scope: {e}"));
            -1
        }
    })
}

/// Frees a pointer from [`vramscope_malloc`] (PyTorch's `free_fn`). A pointer that is unknown,
/// already freed, or on a device that never allocated is counted and logged; the call still
/// returns.
#[no_mangle]
pub extern "C" fn vramscope_free(
    ptr: *mut c_void,
    _size: isize,
    device: c_int,
    _stream: *mut c_void,
) {
    guarded("vramscope_free", (), || pluggable::release(ptr, device))
}

/// Releases every cached segment without live blocks on every device
/// (`torch.cuda.empty_cache()`). Returns the bytes released.
#[no_mangle]
pub extern "C" fn vramscope_empty_cache() -> u64 {
    guarded("vramscope_empty_cache", 0, empty_cache)
}

/// Marks the start of a training step on every device.
#[no_mangle]
pub extern "C" fn vramscope_mark_step() {
    guarded("vramscope_mark_step", (), mark_step)
}

/// Misuses and failures counted so far.
#[no_mangle]
pub extern "C" fn vramscope_error_count() -> u64 {
    error_count()
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
    guarded("vramscope_memory_summary", -1, || match opened(device) {
        Some(alloc) => copy_out(&alloc.memory_summary(), buf, len),
        None => -1,
    })
}

/// Writes the address the Prometheus `/metrics` server listens on (`HOST:PORT`, the port
/// chosen when `VRAMSCOPE_METRICS` asked for port 0) into `buf`. Returns its length (when that
/// is `len` or more, nothing was written), or -1 when no server runs: the variable is unset,
/// or no device has been used yet (the first one starts the server).
#[no_mangle]
pub extern "C" fn vramscope_metrics_addr(buf: *mut c_char, len: usize) -> isize {
    guarded("vramscope_metrics_addr", -1, || match metrics_addr() {
        Some(addr) => copy_out(&addr.to_string(), buf, len),
        None => -1,
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
        if pluggable::write_snapshots(&path) {
            0
        } else {
            -1
        }
    })
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
        let last = last_error();
        assert!(
            last.contains("vramscope_test") && last.contains("planted"),
            "{last}"
        );
        assert_eq!(guarded("vramscope_test", -1, || 7), 7);
    }
}
