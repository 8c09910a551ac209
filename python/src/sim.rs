//! `vramscope.SimAllocator`: the caching allocator on the simulated device, from Python.
//!
//! Each allocation made with the GIL held (every call from Python) carries the caller's Python
//! stack as its call site ([`crate::stack::capture`], through
//! [`vramscope_allocator::provenance::with_call_site`]), so the inspector's findings name the
//! Python `file:line`. A [`Block`] frees itself when Python drops it, or on `.free()`. This is
//! how a Python user (and CI) tries vramscope with no GPU, and how the stack capture is tested.

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::thread::ThreadId;

use pyo3::exceptions::{PyMemoryError, PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use vramscope_allocator::provenance::{with_call_site, MAX_SCOPE_DEPTH};
use vramscope_allocator::{
    AllocError, CachingAllocator, DeviceBuffer, ScopeGuard, SimDevice, StreamId,
};
use vramscope_model::{AllocatorConfig, Snapshot};

use crate::analysis;
use crate::report::{self, Finding, Report};
use crate::stack;

/// Turns an allocator error into the Python exception a user expects (`MemoryError` for an
/// out-of-memory, `RuntimeError` for misuse).
pub fn to_py(error: AllocError) -> PyErr {
    match error {
        AllocError::OutOfMemory(_) => PyMemoryError::new_err(error.to_string()),
        other => PyRuntimeError::new_err(other.to_string()),
    }
}

/// Runs `f` with the calling thread's Python stack as the call site, when `capture` is on and
/// the stack can be read.
pub fn at_python_line<R>(capture: bool, f: impl FnOnce() -> R) -> R {
    if capture && stack::gil_held() {
        // SAFETY: the GIL is held (checked just above).
        if let Some(site) = unsafe { stack::capture() } {
            return with_call_site(site, f);
        }
    }
    f()
}

/// The caching allocator on a simulated device of `capacity` bytes.
#[pyclass(module = "vramscope._native", frozen, subclass)]
pub struct SimAllocator {
    alloc: CachingAllocator<SimDevice>,
    capture: bool,
    /// The snapshot taken at the latest step mark, while armed ([`SimAllocator::arm`]).
    step_snapshot: Mutex<Option<Snapshot>>,
    armed: AtomicBool,
}

#[pymethods]
impl SimAllocator {
    /// A simulated device of `capacity` bytes; `config` in `PYTORCH_CUDA_ALLOC_CONF` syntax;
    /// `backed` puts host memory behind the addresses; `capture_stacks=False` turns the
    /// Python stack capture off (every site is then this module's).
    #[new]
    #[pyo3(signature = (capacity, config = "", backed = false, capture_stacks = true))]
    fn new(capacity: u64, config: &str, backed: bool, capture_stacks: bool) -> PyResult<Self> {
        let config =
            AllocatorConfig::parse(config).map_err(|e| PyValueError::new_err(e.to_string()))?;
        let device = if backed {
            SimDevice::backed(capacity)
        } else {
            SimDevice::phantom(capacity)
        };
        Ok(SimAllocator {
            alloc: CachingAllocator::new(device, config),
            capture: capture_stacks,
            step_snapshot: Mutex::new(None),
            armed: AtomicBool::new(false),
        })
    }

    /// Allocates `nbytes` on the default stream; the block is freed when dropped or on
    /// `.free()`. `tag` labels it in reports. Raises `MemoryError` when the device is full.
    #[pyo3(signature = (nbytes, tag = None))]
    fn alloc(&self, nbytes: u64, tag: Option<&str>) -> PyResult<Block> {
        let buffer = at_python_line(self.capture, || match tag {
            Some(tag) => self.alloc.tagged(tag).alloc(nbytes),
            None => self.alloc.alloc(nbytes),
        })
        .map_err(to_py)?;
        Ok(Block {
            addr: buffer.addr(),
            size: nbytes,
            buffer: Mutex::new(Some(buffer)),
        })
    }

    /// Starts a new training step; returns its number.
    fn mark_step(&self) -> u64 {
        if self.armed.load(Ordering::Relaxed) {
            let snapshot = self.alloc.snapshot();
            *self.step_snapshot.lock().unwrap_or_else(|e| e.into_inner()) = Some(snapshot);
        }
        at_python_line(self.capture, || self.alloc.mark_step())
    }

    /// While `on`, each step mark keeps a snapshot of the state just before it, so that the
    /// leak check sees what earlier steps left alive even after the test's locals are gone
    /// (the pytest plugin arms it for a checked test). Disarming drops the kept snapshot.
    fn arm(&self, on: bool) {
        self.armed.store(on, Ordering::Relaxed);
        if !on {
            self.step_snapshot
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .take();
        }
    }

    /// Waits for the device (`.item()`, `.cpu()`), recorded as a sync at the Python line.
    fn synchronize(&self) -> PyResult<()> {
        at_python_line(self.capture, || self.alloc.synchronize(StreamId::DEFAULT)).map_err(to_py)
    }

    /// Opens the scope `name` on this thread until the returned token's `close()`; the
    /// Python `scope()` context manager wraps this. Raises `RuntimeError` for a scope that
    /// would nest deeper than `MAX_SCOPE_DEPTH` (1024) levels (counted in `scopes_refused`).
    fn open_scope(&self, name: &str) -> PyResult<ScopeToken> {
        let guard = self
            .alloc
            .try_scope(name)
            .ok_or_else(|| PyRuntimeError::new_err(scope_refused(name)))?;
        Ok(ScopeToken::open(guard))
    }

    /// Scopes refused because they would nest deeper than `MAX_SCOPE_DEPTH` (1024) levels.
    #[getter]
    fn scopes_refused(&self) -> u64 {
        self.alloc.scope_stats().refused
    }

    /// Releases every cached segment without live blocks; returns the bytes released.
    fn empty_cache(&self) -> u64 {
        self.alloc.empty_cache()
    }

    /// Writes a JSON snapshot to `path` (`vramscope report PATH` reads it).
    fn snapshot(&self, path: &str) -> PyResult<()> {
        self.alloc
            .snapshot()
            .save(path)
            .map_err(|e| PyRuntimeError::new_err(e.to_string()))
    }

    /// The snapshot as JSON text.
    fn snapshot_json(&self) -> String {
        serde_json::to_string(&self.alloc.snapshot()).unwrap_or_default()
    }

    /// The inspector's findings on what has been recorded so far, most severe first.
    fn report(&self) -> Vec<Finding> {
        report::findings_of(&self.alloc.snapshot())
    }

    /// The whole report on the current snapshot, as `vramscope.load()` gives it for a file:
    /// figures, findings, the text report, the top sites, and the explorer in a notebook.
    fn inspect(&self) -> Report {
        Report::from_snapshot(&self.alloc.snapshot(), None)
    }

    /// The inspector's text report.
    fn report_text(&self) -> String {
        analysis::report_text(&self.alloc.snapshot())
    }

    /// The checks of the pytest marker that fail, one message each.
    /// `since` is [`SimAllocator::next_event_seq`] when the test began: with it, a test that
    /// marks no steps fails `no_leaks` on any block it allocated that is still live.
    #[pyo3(signature = (max_peak = None, no_leaks = false, max_syncs_per_step = None, since = None))]
    fn check(
        &self,
        max_peak: Option<u64>,
        no_leaks: bool,
        max_syncs_per_step: Option<u64>,
        since: Option<u64>,
    ) -> Vec<String> {
        let at_step = self
            .step_snapshot
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        analysis::check_with_step(
            &self.alloc.snapshot(),
            at_step.as_ref(),
            analysis::Limits::new(max_peak, no_leaks, max_syncs_per_step, since),
        )
    }

    /// Serves this allocator's statistics on `/metrics` at `addr` (`HOST:PORT`, port 0 picks
    /// one; a non-loopback address needs `allow_remote`), or, without `addr`, where
    /// `VRAMSCOPE_METRICS` asks when no other face of this process serves it yet (`None`
    /// otherwise). The server stops when the object returned is closed or dropped.
    #[pyo3(signature = (addr = None, allow_remote = false))]
    fn serve_metrics(
        &self,
        addr: Option<&str>,
        allow_remote: bool,
    ) -> PyResult<Option<crate::metrics::MetricsServer>> {
        let source = vramscope_allocator::metrics::source_of(std::slice::from_ref(&self.alloc));
        crate::metrics::serve_at(source, addr, allow_remote)
    }

    /// The sequence number the allocator's next event gets: the mark a check's `since` takes.
    fn next_event_seq(&self) -> u64 {
        self.alloc.next_event_seq()
    }

    /// PyTorch's `memory_summary()` table.
    fn memory_summary(&self) -> String {
        self.alloc.memory_summary()
    }

    /// PyTorch's `memory_stats()` figures, as a dictionary nested as PyTorch's names are
    /// (`stats()["allocated_bytes"]["all"]["current"]`).
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        report::stats_to_py(py, &self.alloc.stats())
    }

    /// Bytes allocated now.
    #[getter(allocated)]
    fn allocated_now(&self) -> u64 {
        self.alloc.stats().allocated_bytes.all.current
    }

    /// Peak bytes allocated.
    #[getter]
    fn peak_allocated(&self) -> u64 {
        self.alloc.stats().allocated_bytes.all.peak
    }

    /// Bytes reserved from the device now.
    #[getter]
    fn reserved(&self) -> u64 {
        self.alloc.stats().reserved_bytes.all.current
    }

    /// The current step number.
    #[getter]
    fn step(&self) -> u64 {
        self.alloc.step()
    }

    /// Whether allocations carry the Python stack.
    #[getter]
    fn capture_stacks(&self) -> bool {
        self.capture
    }
}

/// One allocation; freed when dropped or on `.free()`.
#[pyclass(module = "vramscope._native", frozen)]
pub struct Block {
    addr: u64,
    size: u64,
    buffer: Mutex<Option<DeviceBuffer<SimDevice>>>,
}

#[pymethods]
impl Block {
    /// Frees the block now (later drops and frees do nothing).
    fn free(&self) -> PyResult<()> {
        let taken = self.buffer.lock().unwrap_or_else(|e| e.into_inner()).take();
        match taken {
            Some(buffer) => buffer.free().map_err(to_py),
            None => Ok(()),
        }
    }

    /// The device address.
    #[getter]
    fn addr(&self) -> u64 {
        self.addr
    }

    /// The bytes asked for.
    #[getter]
    fn nbytes(&self) -> u64 {
        self.size
    }

    /// Whether the block was freed.
    #[getter]
    fn freed(&self) -> bool {
        self.buffer
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_none()
    }

    fn __repr__(&self) -> String {
        format!(
            "<vramscope.Block {} bytes at {:#x}{}>",
            self.size,
            self.addr,
            if self.freed() { ", freed" } else { "" }
        )
    }
}

/// The message of a scope refused for nesting too deep.
pub fn scope_refused(name: &str) -> String {
    let shown: String = name.chars().take(64).collect();
    format!(
        "scope {shown:?} refused: scopes nest at most {MAX_SCOPE_DEPTH} levels (is a scope \
         opened in a loop and never closed?)"
    )
}

/// The message of a scope closed on a thread other than its own.
const OTHER_THREAD: &str = "a scope must be closed on the thread that opened it";

thread_local! {
    /// The scopes this thread opened with `open_scope`, by their token's number: a scope is
    /// its thread's own, so its guard stays on that thread and only that thread closes it.
    static OPEN_SCOPES: RefCell<HashMap<u64, ScopeGuard>> = RefCell::new(HashMap::new());
}

/// The number of the next scope token.
static NEXT_TOKEN: AtomicU64 = AtomicU64::new(1);

/// An open scope; `close()` ends it. It belongs to the thread that opened it: `close()` on
/// another thread raises `RuntimeError` and leaves the scope open; a token dropped on another
/// thread leaves it open until its own thread ends.
#[pyclass(module = "vramscope._native", frozen)]
pub struct ScopeToken {
    number: u64,
    thread: ThreadId,
    closed: AtomicBool,
}

impl ScopeToken {
    /// The token of `guard`, which stays with this thread.
    fn open(guard: ScopeGuard) -> ScopeToken {
        let number = NEXT_TOKEN.fetch_add(1, Ordering::Relaxed);
        OPEN_SCOPES.with(|scopes| scopes.borrow_mut().insert(number, guard));
        ScopeToken {
            number,
            thread: std::thread::current().id(),
            closed: AtomicBool::new(false),
        }
    }

    /// Closes the scope, on its own thread (elsewhere: nothing, and `false`).
    fn close_here(&self) -> bool {
        if std::thread::current().id() != self.thread {
            return false;
        }
        self.closed.store(true, Ordering::Relaxed);
        // Taken out first, dropped after the borrow ends.
        let guard = OPEN_SCOPES
            .try_with(|scopes| scopes.borrow_mut().remove(&self.number))
            .ok()
            .flatten();
        drop(guard);
        true
    }
}

#[pymethods]
impl ScopeToken {
    /// Ends the scope (again: nothing). Raises `RuntimeError` on a thread other than the one
    /// that opened it.
    fn close(&self) -> PyResult<()> {
        if self.closed.load(Ordering::Relaxed) || self.close_here() {
            Ok(())
        } else {
            Err(PyRuntimeError::new_err(OTHER_THREAD))
        }
    }

    /// Whether the scope is closed.
    #[getter]
    fn closed(&self) -> bool {
        self.closed.load(Ordering::Relaxed)
    }
}

impl Drop for ScopeToken {
    fn drop(&mut self) {
        if !self.closed.load(Ordering::Relaxed) {
            self.close_here();
        }
    }
}
