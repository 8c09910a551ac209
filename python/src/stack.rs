//! Python stack capture: the interpreter's frames of the allocating thread, interned as a
//! vramscope call site.
//!
//! With the GIL held, [`capture`] walks the calling thread's frames (code object and line of
//! each, innermost first, up to [`max_depth`]) through the stable C API, looks the chain up in
//! a process-wide cache keyed by `(code object address, line)` pairs, and on a miss builds the
//! [`CallSite`]: the full stack as frames, and as its primary `file:line` the innermost frame
//! that is the user's own code (the inspector's rule: not torch, not site-packages, not the
//! standard library, not this package). Each distinct stack's site is leaked once, so the
//! allocator can intern it by address ([`vramscope_allocator::provenance::with_call_site`]),
//! as it does Rust's static locations. The cache holds a strong reference to every code object
//! it has seen, so an address in a key always names the same code.
//!
//! Nothing here takes the GIL: callers check [`gil_held`] first (the pluggable allocator may
//! also run on threads that have no Python state at all, such as autograd's).

use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use pyo3::ffi;
use pyo3::prelude::*;
use rustc_hash::FxHashMap;
use vramscope_allocator::{CallSite, Frame};
use vramscope_inspector::import::sites::{primary_frame, DEFAULT_FRAMEWORK_PATHS};

// The frame accessors are in the stable ABI from 3.10 and exported by every CPython from 3.9,
// which this module requires; pyo3 declares them only for the newer limited API.
extern "C" {
    fn PyEval_GetFrame() -> *mut c_void;
    fn PyFrame_GetBack(frame: *mut c_void) -> *mut c_void;
    fn PyFrame_GetCode(frame: *mut c_void) -> *mut ffi::PyObject;
    fn PyFrame_GetLineNumber(frame: *mut c_void) -> c_int;
    fn PyGILState_Check() -> c_int;
}

/// Frames walked at most per capture (`VRAMSCOPE_PY_STACK_DEPTH`, [`set_max_depth`]).
static MAX_DEPTH: AtomicUsize = AtomicUsize::new(128);

/// Distinct stacks kept before new stacks are cut to their innermost [`CUT_DEPTH`] frames.
const MAX_STACKS: usize = 1 << 16;

/// The depth stacks are cut to once the cache is full.
const CUT_DEPTH: usize = 8;

/// One frame of a key: a code object's address and a line.
type FrameKey = (usize, u32);

/// What the cache knows of a code object it holds.
struct CodeInfo {
    file: String,
    function: String,
}

#[derive(Default)]
struct Cache {
    stacks: FxHashMap<Vec<FrameKey>, &'static CallSite>,
    /// Code objects by address, each with a strong reference the cache never drops.
    codes: FxHashMap<usize, CodeInfo>,
    framework_paths: Vec<String>,
}

static CACHE: Mutex<Option<Cache>> = Mutex::new(None);

thread_local! {
    static KEY: std::cell::RefCell<Vec<FrameKey>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Whether the calling thread holds the GIL (false on threads Python does not know).
pub fn gil_held() -> bool {
    // SAFETY: `PyGILState_Check` may be called from any thread, with or without the GIL, once
    // the interpreter is initialized (it is: this code runs inside a loaded extension module).
    unsafe { PyGILState_Check() == 1 }
}

/// The most frames a capture walks.
pub fn max_depth() -> usize {
    MAX_DEPTH.load(Ordering::Relaxed)
}

/// Sets the most frames a capture walks (at least 1).
pub fn set_max_depth(depth: usize) {
    MAX_DEPTH.store(depth.max(1), Ordering::Relaxed);
}

/// Adds path fragments whose frames are framework code, never a site's primary frame (this
/// package's own directory, for one), to the inspector's defaults. Sites already cached keep
/// their primary frame.
pub fn add_framework_paths(paths: Vec<String>) {
    let mut guard = CACHE.lock().unwrap_or_else(|e| e.into_inner());
    let cache = guard.get_or_insert_with(Cache::default);
    cache.framework_paths.extend(paths);
}

/// Distinct stacks interned so far.
pub fn cached_stacks() -> usize {
    let guard = CACHE.lock().unwrap_or_else(|e| e.into_inner());
    guard.as_ref().map_or(0, |c| c.stacks.len())
}

/// The calling thread's Python stack as an interned call site, or `None` when it has no
/// Python frame.
///
/// # Safety
///
/// The calling thread must hold the GIL ([`gil_held`]).
pub unsafe fn capture() -> Option<&'static CallSite> {
    let depth = max_depth();
    KEY.with(|key| {
        let mut key = key.borrow_mut();
        key.clear();
        // SAFETY: the caller holds the GIL. `PyEval_GetFrame` returns a borrowed frame; we take
        // our own reference so that every frame in the loop is owned, and release each after
        // taking its successor (a new reference, or null at the bottom).
        unsafe {
            let mut frame = PyEval_GetFrame();
            if frame.is_null() {
                return None;
            }
            ffi::Py_IncRef(frame.cast());
            while !frame.is_null() && key.len() < depth {
                let code = PyFrame_GetCode(frame);
                let line = PyFrame_GetLineNumber(frame).max(0) as u32;
                key.push((code as usize, line));
                // The frame keeps its code alive while we hold the frame; the cache takes its
                // own reference when it first records this code object.
                ffi::Py_DecRef(code);
                let back = PyFrame_GetBack(frame);
                ffi::Py_DecRef(frame.cast());
                frame = back;
            }
            if !frame.is_null() {
                ffi::Py_DecRef(frame.cast());
            }
        }
        let mut guard = CACHE.lock().unwrap_or_else(|e| e.into_inner());
        let cache = guard.get_or_insert_with(Cache::default);
        if let Some(site) = cache.stacks.get(key.as_slice()) {
            return Some(*site);
        }
        if cache.stacks.len() >= MAX_STACKS {
            key.truncate(CUT_DEPTH);
            if let Some(site) = cache.stacks.get(key.as_slice()) {
                return Some(*site);
            }
        }
        // SAFETY: the GIL is held and every code object in `key` is alive (its frame was on
        // this thread's stack a moment ago and the thread has not run Python since).
        let site = unsafe { cache.build(&key) };
        cache.stacks.insert(key.clone(), site);
        Some(site)
    })
}

impl Cache {
    /// Builds and leaks the call site of the stack `key`, recording unseen code objects.
    ///
    /// # Safety
    ///
    /// The GIL is held and every code object in `key` is alive.
    unsafe fn build(&mut self, key: &[FrameKey]) -> &'static CallSite {
        let mut frames = Vec::with_capacity(key.len());
        for &(code, line) in key {
            let info = self.codes.entry(code).or_insert_with(|| {
                // SAFETY: per this function's contract; the reference taken here is the
                // cache's, never released, so the address keeps naming this code object.
                unsafe {
                    let object = code as *mut ffi::PyObject;
                    ffi::Py_IncRef(object);
                    CodeInfo {
                        file: string_attr(object, "co_filename"),
                        function: string_attr(object, "co_name"),
                    }
                }
            });
            frames.push(Frame {
                file: info.file.clone(),
                line,
                function: info.function.clone(),
            });
        }
        let mut paths: Vec<String> = DEFAULT_FRAMEWORK_PATHS
            .iter()
            .map(|p| p.to_string())
            .collect();
        paths.extend(self.framework_paths.iter().cloned());
        let primary = primary_frame(&frames, &paths).unwrap_or(0);
        let top = frames.get(primary).cloned().unwrap_or(Frame {
            file: "??".to_string(),
            line: 0,
            function: String::new(),
        });
        Box::leak(Box::new(CallSite {
            file: top.file,
            line: top.line,
            column: 0,
            function: top.function,
            frames,
        }))
    }
}

/// The string attribute `name` of `object`, or `"??"`.
///
/// # Safety
///
/// The GIL is held and `object` is alive.
unsafe fn string_attr(object: *mut ffi::PyObject, name: &str) -> String {
    // SAFETY: per this function's contract (the GIL is held; `object` is a live reference,
    // borrowed for the duration of this call).
    let py = unsafe { Python::assume_attached() };
    // SAFETY: as above.
    let object = unsafe { Bound::from_borrowed_ptr(py, object) };
    object
        .getattr(name)
        .and_then(|value| value.extract::<String>())
        .unwrap_or_else(|_| "??".to_string())
}
