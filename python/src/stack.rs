//! Python stack capture: the interpreter's frames of the allocating thread, interned as a
//! vramscope call site.
//!
//! With the GIL held, [`capture`] walks the calling thread's frames (innermost first, up to
//! [`max_depth`]) through the C API and looks the chain up in a process-wide cache. Where the
//! interpreter has `PyFrame_GetLasti` (CPython 3.11 and later) the chain is keyed by each
//! frame's code object and instruction offset, so a hit (a training loop runs the same lines
//! again and again) computes no line number: CPython finds a frame's line by scanning the code
//! object's line table from its start, which is most of a walk's cost in the big outer
//! functions. On a miss the walk is made again for the lines, and the chain of
//! `(code object, line)` pairs is looked up in the table of sites; on a miss there too the
//! [`CallSite`] is built: the full stack as frames, and as its primary `file:line` the
//! innermost frame that is the user's own code (the inspector's rule: not torch, not
//! site-packages, not the standard library, not this package). Each distinct stack's site is
//! leaked once, so the allocator can intern it by address
//! ([`vramscope_allocator::provenance::with_call_site`]), as it does Rust's static locations;
//! offset chains that differ only in offsets within the same lines share that one site. The
//! cache holds a strong reference to every code object in any key, so an address in a key
//! always names the same code. Older interpreters key by line alone.
//!
//! Nothing here takes the GIL: callers check [`gil_held`] first (the pluggable allocator may
//! also run on threads that have no Python state at all, such as autograd's).

use std::ffi::{c_char, c_int, c_void};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};

use pyo3::ffi;
use pyo3::prelude::*;
use rustc_hash::FxHashMap;
use vramscope_import::sites::{primary_frame, DEFAULT_FRAMEWORK_PATHS};
use vramscope_model::{CallSite, Frame};

// The frame accessors are in the stable ABI from 3.10 and exported by every CPython from 3.9,
// which this module requires; pyo3 declares them only for the newer limited API.
extern "C" {
    fn PyEval_GetFrame() -> *mut c_void;
    fn PyFrame_GetBack(frame: *mut c_void) -> *mut c_void;
    fn PyFrame_GetCode(frame: *mut c_void) -> *mut ffi::PyObject;
    fn PyFrame_GetLineNumber(frame: *mut c_void) -> c_int;
    fn PyGILState_Check() -> c_int;
    fn dlsym(handle: *mut c_void, symbol: *const c_char) -> *mut c_void;
}

/// `PyFrame_GetLasti`: a frame's instruction offset in bytes (CPython 3.11 and later).
type GetLasti = unsafe extern "C" fn(frame: *mut c_void) -> c_int;

/// The dynamic linker's handle that searches every loaded object.
#[cfg(target_os = "macos")]
const RTLD_DEFAULT: *mut c_void = -2isize as *mut c_void;
/// The dynamic linker's handle that searches every loaded object.
#[cfg(not(target_os = "macos"))]
const RTLD_DEFAULT: *mut c_void = std::ptr::null_mut();

/// `PyFrame_GetLasti` where the running interpreter exports it. It is looked up at run time:
/// linking it would keep the module from loading on 3.9 and 3.10, which lack it.
fn get_lasti() -> Option<GetLasti> {
    static FOUND: OnceLock<Option<GetLasti>> = OnceLock::new();
    *FOUND.get_or_init(|| {
        if std::env::var_os("VRAMSCOPE_PY_STACK_BY_LINE").is_some_and(|v| v == "1") {
            return None;
        }
        // SAFETY: `dlsym` with the default handle and a NUL-terminated name only searches the
        // loaded objects' symbol tables.
        let symbol = unsafe { dlsym(RTLD_DEFAULT, c"PyFrame_GetLasti".as_ptr()) };
        if symbol.is_null() {
            None
        } else {
            // SAFETY: the symbol is CPython's `int PyFrame_GetLasti(PyFrameObject *)`, whose
            // signature `GetLasti` repeats.
            Some(unsafe { std::mem::transmute::<*mut c_void, GetLasti>(symbol) })
        }
    })
}

/// Frames walked at most per capture (`VRAMSCOPE_PY_STACK_DEPTH`, [`set_max_depth`]).
static MAX_DEPTH: AtomicUsize = AtomicUsize::new(128);

/// Distinct stacks kept before new stacks are cut to their innermost [`CUT_DEPTH`] frames.
const MAX_STACKS: usize = 1 << 16;

/// Offset chains kept; beyond, a chain not seen yet is walked for its lines every time.
const MAX_OFFSET_CHAINS: usize = 4 * MAX_STACKS;

/// The depth stacks are cut to once the cache is full.
const CUT_DEPTH: usize = 8;

/// One frame of a key: a code object's address, and an instruction offset or a line.
type FrameKey = (usize, u32);

/// What the cache knows of a code object it holds.
struct CodeInfo {
    file: String,
    function: String,
}

#[derive(Default)]
struct Cache {
    /// Chains of `(code object, instruction offset)` to their site.
    by_offset: FxHashMap<Vec<FrameKey>, &'static CallSite>,
    /// Chains of `(code object, line)` to their site: one entry per distinct site.
    by_line: FxHashMap<Vec<FrameKey>, &'static CallSite>,
    /// Code objects by address, each with a strong reference the cache never drops.
    codes: FxHashMap<usize, CodeInfo>,
    framework_paths: Vec<String>,
}

static CACHE: Mutex<Option<Cache>> = Mutex::new(None);

thread_local! {
    static KEYS: std::cell::RefCell<(Vec<FrameKey>, Vec<FrameKey>)> =
        const { std::cell::RefCell::new((Vec::new(), Vec::new())) };
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

/// Whether chains are keyed by instruction offset (CPython 3.11 and later, unless
/// `VRAMSCOPE_PY_STACK_BY_LINE=1`) rather than by line.
pub fn keyed_by_offset() -> bool {
    get_lasti().is_some()
}

/// Adds path fragments whose frames are framework code, never a site's primary frame (this
/// package's own directory, for one), to the inspector's defaults. Sites already cached keep
/// their primary frame.
pub fn add_framework_paths(paths: Vec<String>) {
    let mut guard = CACHE.lock().unwrap_or_else(|e| e.into_inner());
    let cache = guard.get_or_insert_with(Cache::default);
    cache.framework_paths.extend(paths);
}

/// The path fragments of framework code: the inspector's defaults and those added with
/// [`add_framework_paths`].
pub fn framework_paths() -> Vec<String> {
    let guard = CACHE.lock().unwrap_or_else(|e| e.into_inner());
    let mut paths: Vec<String> = DEFAULT_FRAMEWORK_PATHS
        .iter()
        .map(|p| p.to_string())
        .collect();
    if let Some(cache) = guard.as_ref() {
        paths.extend(cache.framework_paths.iter().cloned());
    }
    paths
}

/// Distinct stacks interned so far.
pub fn cached_stacks() -> usize {
    let guard = CACHE.lock().unwrap_or_else(|e| e.into_inner());
    guard.as_ref().map_or(0, |c| c.by_line.len())
}

/// Walks the calling thread's frames into `key`, innermost first, up to `depth` frames: each
/// frame's code object's address with `position(frame)` (an offset or a line).
///
/// # Safety
///
/// The calling thread holds the GIL.
unsafe fn walk(key: &mut Vec<FrameKey>, depth: usize, position: impl Fn(*mut c_void) -> u32) {
    key.clear();
    // SAFETY: the caller holds the GIL. `PyEval_GetFrame` returns a borrowed frame; we take
    // our own reference so that every frame in the loop is owned, and release each after
    // taking its successor (a new reference, or null at the bottom).
    unsafe {
        let mut frame = PyEval_GetFrame();
        if frame.is_null() {
            return;
        }
        ffi::Py_IncRef(frame.cast());
        while !frame.is_null() && key.len() < depth {
            let code = PyFrame_GetCode(frame);
            key.push((code as usize, position(frame)));
            // The frame keeps its code alive while we hold the frame; the cache takes its own
            // reference when it first records this code object.
            ffi::Py_DecRef(code);
            let back = PyFrame_GetBack(frame);
            ffi::Py_DecRef(frame.cast());
            frame = back;
        }
        if !frame.is_null() {
            ffi::Py_DecRef(frame.cast());
        }
    }
}

/// A frame's line.
fn line_of(frame: *mut c_void) -> u32 {
    // SAFETY: `walk` passes live frames and holds the GIL.
    unsafe { PyFrame_GetLineNumber(frame).max(0) as u32 }
}

/// The calling thread's Python stack as an interned call site, or `None` when it has no
/// Python frame.
///
/// # Safety
///
/// The calling thread must hold the GIL ([`gil_held`]).
pub unsafe fn capture() -> Option<&'static CallSite> {
    let depth = max_depth();
    let lasti = get_lasti();
    KEYS.with(|keys| {
        let (offsets, lines) = &mut *keys.borrow_mut();
        match lasti {
            Some(lasti) => {
                // SAFETY: `walk` passes live frames and holds the GIL; `lasti` is CPython's
                // accessor.
                let offset = |frame| unsafe { lasti(frame) }.max(0) as u32;
                // SAFETY: the caller holds the GIL.
                unsafe { walk(offsets, depth, offset) };
                if offsets.is_empty() {
                    return None;
                }
                {
                    let guard = CACHE.lock().unwrap_or_else(|e| e.into_inner());
                    if let Some(site) = guard.as_ref().and_then(|c| c.by_offset.get(&**offsets)) {
                        return Some(*site);
                    }
                }
                // SAFETY: as above; the stack has not changed since the first walk (no Python
                // code ran in between).
                unsafe { walk(lines, depth, line_of) };
            }
            // SAFETY: the caller holds the GIL.
            None => unsafe { walk(lines, depth, line_of) },
        }
        if lines.is_empty() {
            return None;
        }
        let mut guard = CACHE.lock().unwrap_or_else(|e| e.into_inner());
        let cache = guard.get_or_insert_with(Cache::default);
        // SAFETY: the GIL is held and every code object in both keys is alive (its frame was
        // on this thread's stack a moment ago and the thread has not run Python since).
        let site = unsafe { cache.site_for(lines) };
        if lasti.is_some() && cache.by_offset.len() < MAX_OFFSET_CHAINS {
            // SAFETY: as above.
            unsafe { cache.retain_codes(offsets) };
            cache.by_offset.insert(offsets.clone(), site);
        }
        Some(site)
    })
}

impl Cache {
    /// The site of the line chain `key`, built and recorded on a miss (cut to [`CUT_DEPTH`]
    /// frames once [`MAX_STACKS`] sites are known).
    ///
    /// # Safety
    ///
    /// The GIL is held and every code object in `key` is alive.
    unsafe fn site_for(&mut self, key: &mut Vec<FrameKey>) -> &'static CallSite {
        if let Some(&site) = self.by_line.get(&**key) {
            return site;
        }
        if self.by_line.len() >= MAX_STACKS {
            key.truncate(CUT_DEPTH);
            if let Some(&site) = self.by_line.get(&**key) {
                return site;
            }
        }
        // SAFETY: per this function's contract.
        let site = unsafe { self.build(key) };
        self.by_line.insert(key.clone(), site);
        site
    }

    /// Records every code object of `key` the cache does not hold yet.
    ///
    /// # Safety
    ///
    /// The GIL is held and every code object in `key` is alive.
    unsafe fn retain_codes(&mut self, key: &[FrameKey]) {
        for &(code, _) in key {
            // SAFETY: per this function's contract.
            unsafe { self.code(code) };
        }
    }

    /// What the cache knows of the code object at `code`, recorded (with a strong reference
    /// that is never released, so the address keeps naming this code object) on first sight.
    ///
    /// # Safety
    ///
    /// The GIL is held and `code` is a live code object.
    unsafe fn code(&mut self, code: usize) -> &CodeInfo {
        self.codes.entry(code).or_insert_with(|| {
            // SAFETY: per this function's contract.
            unsafe {
                let object = code as *mut ffi::PyObject;
                ffi::Py_IncRef(object);
                CodeInfo {
                    file: string_attr(object, "co_filename"),
                    function: string_attr(object, "co_name"),
                }
            }
        })
    }

    /// Builds and leaks the call site of the line chain `key`, recording unseen code objects.
    ///
    /// # Safety
    ///
    /// The GIL is held and every code object in `key` is alive.
    unsafe fn build(&mut self, key: &[FrameKey]) -> &'static CallSite {
        let mut frames = Vec::with_capacity(key.len());
        for &(code, line) in key {
            // SAFETY: per this function's contract.
            let info = unsafe { self.code(code) };
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
