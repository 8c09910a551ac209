//! Native stacks for the pluggable allocator's allocations on threads without Python:
//! autograd's backward thread, or any C++ thread, where no Python frame says who allocated.
//!
//! One allocation in [`every`] on such a thread (sampled per thread, the first one always)
//! captures its native backtrace as raw instruction pointers, with nothing symbolized on the
//! hot path, and is given the call site of that chain of addresses: a site without a line whose
//! frames are placeholders naming the addresses, leaked once per distinct chain like the
//! Python sites of `crate::stack`. [`resolve_site`] turns the placeholders into function
//! names (and source files, without lines), each address once per process, and drops the
//! frames of the allocator itself, up to `vramscope_malloc`, so that the frames begin at
//! PyTorch's caller. It runs whenever such a site leaves the allocator, after its device lock
//! is released: the module registers it at import as the allocator's resolver of the sites
//! it was given (`vramscope_allocator::provenance::set_external_site_resolver`), so snapshots
//! and the tables of live telemetry (`vramscope top`) name the functions, never the addresses;
//! [`symbolize`] does the same to a whole snapshot.
//! The inspector then names the site by the autograd node it runs in (`MmBackward0
//! (backward)`, from `torch::autograd::generated::MmBackward0::apply`), as it names PyTorch's
//! own C++ stacks. Allocations that are not sampled keep the Rust site of the allocator.

use std::cell::Cell;
use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Mutex;

use pyo3::prelude::*;
use rustc_hash::FxHashMap;
use vramscope_model::{CallSite, Frame, Snapshot};

/// One allocation in this many on a thread without Python gets a native stack by default.
pub const DEFAULT_EVERY: u32 = 16;

/// The environment variable that sets [`every`] at import (0 turns native stacks off).
pub const ENV_EVERY: &str = "VRAMSCOPE_NATIVE_STACKS";

/// Frames kept per native stack.
const MAX_FRAMES: usize = 64;

/// Distinct native stacks kept; beyond, an allocation with a new stack keeps the Rust site.
const MAX_STACKS: usize = 1 << 14;

/// What a placeholder frame's function starts with, before the address in hexadecimal.
const PLACEHOLDER: &str = "vramscope-native-ip:";

/// The allocator's own entry point: frames up to it are the allocator's.
const ENTRY: &str = "vramscope_malloc";

static EVERY: AtomicU32 = AtomicU32::new(DEFAULT_EVERY);
static STACKS: Mutex<Option<FxHashMap<Vec<usize>, &'static CallSite>>> = Mutex::new(None);
static RESOLVED: Mutex<Option<FxHashMap<usize, Vec<Frame>>>> = Mutex::new(None);

thread_local! {
    /// Allocations left on this thread before the next sampled one.
    static UNTIL_NEXT: Cell<u32> = const { Cell::new(0) };
}

/// One allocation in how many on a thread without Python gets a native stack (0: none).
pub fn every() -> u32 {
    EVERY.load(Ordering::Relaxed)
}

/// Sets [`every`].
pub fn set_every(n: u32) {
    EVERY.store(n, Ordering::Relaxed);
    UNTIL_NEXT.with(|c| c.set(0));
}

/// The call site of this allocation's native stack, when sampling picks it.
pub fn sampled_site() -> Option<&'static CallSite> {
    let every = every();
    if every == 0 {
        return None;
    }
    let picked = UNTIL_NEXT.with(|left| match left.get() {
        0 => {
            left.set(every - 1);
            true
        }
        n => {
            left.set(n - 1);
            false
        }
    });
    if !picked {
        return None;
    }
    let mut ips = Vec::with_capacity(MAX_FRAMES);
    backtrace::trace(|frame| {
        ips.push(frame.ip() as usize);
        ips.len() < MAX_FRAMES
    });
    intern(ips)
}

/// The site of the address chain `ips`, leaked on first sight.
fn intern(ips: Vec<usize>) -> Option<&'static CallSite> {
    let mut guard = STACKS.lock().unwrap_or_else(|e| e.into_inner());
    let stacks = guard.get_or_insert_with(FxHashMap::default);
    if let Some(&site) = stacks.get(&ips) {
        return Some(site);
    }
    if stacks.len() >= MAX_STACKS {
        return None;
    }
    let frames = ips
        .iter()
        .map(|ip| Frame {
            file: "??".to_string(),
            line: 0,
            function: format!("{PLACEHOLDER}{ip:x}"),
        })
        .collect();
    let site: &'static CallSite = Box::leak(Box::new(CallSite {
        file: "??".to_string(),
        line: 0,
        column: 0,
        function: String::new(),
        frames,
    }));
    stacks.insert(ips, site);
    Some(site)
}

/// Distinct native stacks interned so far.
pub fn stacks() -> usize {
    let guard = STACKS.lock().unwrap_or_else(|e| e.into_inner());
    guard.as_ref().map_or(0, FxHashMap::len)
}

/// The address a placeholder frame names.
fn placeholder_ip(frame: &Frame) -> Option<usize> {
    let hex = frame.function.strip_prefix(PLACEHOLDER)?;
    usize::from_str_radix(hex, 16).ok()
}

/// The frames at `ip` (more than one where functions were inlined), innermost first.
fn resolve(ip: usize, cache: &mut FxHashMap<usize, Vec<Frame>>) -> Vec<Frame> {
    cache
        .entry(ip)
        .or_insert_with(|| {
            let mut frames = Vec::new();
            backtrace::resolve(ip as *mut c_void, |symbol| {
                // The line is left out (0): the inspector names a stack by its first frame
                // with a line, which in a native stack is whichever library has debug
                // information (the C library's `start_thread`, say), not the autograd node.
                frames.push(Frame {
                    file: symbol
                        .filename()
                        .map(|p| p.display().to_string())
                        .unwrap_or_else(|| "??".to_string()),
                    line: 0,
                    function: symbol.name().map(|n| format!("{n:#}")).unwrap_or_default(),
                });
            });
            if frames.is_empty() {
                frames.push(Frame {
                    file: "??".to_string(),
                    line: 0,
                    function: format!("{ip:#x}"),
                });
            }
            frames
        })
        .clone()
}

/// The frames of a symbolized native stack from the allocator's caller outwards.
fn caller_frames(mut frames: Vec<Frame>) -> Vec<Frame> {
    match frames.iter().rposition(|f| f.function == ENTRY) {
        Some(entry) => {
            frames.drain(..=entry);
        }
        None => {
            let own = |f: &Frame| {
                [
                    "backtrace::",
                    "_native::",
                    "vramscope_ffi::",
                    "std::",
                    "core::",
                    "alloc::",
                    "<",
                ]
                .iter()
                .any(|p| f.function.starts_with(p))
            };
            let first = frames.iter().position(|f| !own(f)).unwrap_or(0);
            frames.drain(..first);
        }
    }
    frames
}

/// The native stack `site` with its placeholders turned into function names, from the
/// allocator's caller outwards; `None` when `site` is not a native stack of [`sampled_site`]
/// (its first frame is not a placeholder). The allocator calls it, as the resolver of the
/// sites given with `with_call_site` (registered at import), for each such site that leaves
/// it: snapshots and the tables that live telemetry sends, after its device lock is released.
pub fn resolve_site(site: &CallSite) -> Option<CallSite> {
    placeholder_ip(site.frames.first()?)?;
    let mut guard = RESOLVED.lock().unwrap_or_else(|e| e.into_inner());
    let cache = guard.get_or_insert_with(FxHashMap::default);
    let frames = site
        .frames
        .iter()
        .flat_map(|f| match placeholder_ip(f) {
            Some(ip) => resolve(ip, cache),
            None => vec![f.clone()],
        })
        .collect();
    Some(CallSite {
        file: site.file.clone(),
        line: site.line,
        column: site.column,
        function: site.function.clone(),
        frames: caller_frames(frames),
    })
}

/// Turns the native stacks among `snapshot`'s sites into function names, from the
/// allocator's caller outwards (those that [`resolve_site`] has not already named as they
/// left the allocator).
pub fn symbolize(snapshot: &mut Snapshot) {
    for site in &mut snapshot.sites {
        if let Some(named) = resolve_site(site) {
            *site = named;
        }
    }
}

/// Test support: allocates `nbytes` on `device` through `vramscope_malloc` from a new thread
/// that Python does not know, inside a function named like an autograd node, as PyTorch's
/// backward thread allocates. Returns the address (0 when the allocation failed).
#[pyfunction]
pub fn alloc_on_native_thread(py: Python<'_>, device: i32, nbytes: isize) -> u64 {
    py.detach(|| {
        std::thread::spawn(move || MmBackward0::apply(device, nbytes))
            .join()
            .unwrap_or(0)
    })
}

/// Benchmark support: the mean time of `count` allocate-and-free pairs of `nbytes` on
/// `device` from a new thread that Python does not know, in nanoseconds, and the native stack
/// depth an allocation there sees (frames above the allocator's entry point).
#[pyfunction]
pub fn time_native_thread_pairs(
    py: Python<'_>,
    device: i32,
    nbytes: isize,
    count: u32,
) -> (f64, usize) {
    py.detach(|| {
        std::thread::spawn(move || {
            let depth = {
                let mut frames = 0;
                backtrace::trace(|_| {
                    frames += 1;
                    true
                });
                frames
            };
            let start = std::time::Instant::now();
            for _ in 0..count {
                let addr = MmBackward0::apply(device, nbytes);
                let free: Free = std::hint::black_box(vramscope_ffi::vramscope_free);
                free(addr as *mut c_void, nbytes, device, std::ptr::null_mut());
            }
            let ns = start.elapsed().as_nanos() as f64 / f64::from(count.max(1));
            (ns, depth + 1)
        })
        .join()
        .unwrap_or((0.0, 0))
    })
}

type Malloc = extern "C" fn(isize, c_int, *mut c_void) -> *mut c_void;
type Free = extern "C" fn(*mut c_void, isize, c_int, *mut c_void);

/// Stands for PyTorch's `torch::autograd::generated::MmBackward0` in the tests: its `apply`
/// is the frame that names the stack.
struct MmBackward0;

impl MmBackward0 {
    #[inline(never)]
    fn apply(device: i32, nbytes: isize) -> u64 {
        // Called through a pointer that the optimizer cannot see through, so that the
        // allocator's entry point stays a frame of its own, as when PyTorch calls it.
        let malloc: Malloc = std::hint::black_box(vramscope_ffi::vramscope_malloc);
        malloc(nbytes, device, std::ptr::null_mut()) as u64
    }
}

/// Sets how often an allocation on a thread without Python gets a native stack: one in
/// `every` (0: never).
#[pyfunction]
pub fn set_native_stacks(every: u32) {
    set_every(every);
}

/// How often an allocation on a thread without Python gets a native stack (one in this many;
/// 0: never), and the distinct native stacks seen.
#[pyfunction]
pub fn native_stacks() -> (u32, usize) {
    (every(), stacks())
}
