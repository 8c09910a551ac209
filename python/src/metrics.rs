//! Prometheus `/metrics` for the Python faces that are not the pluggable allocator:
//! [`crate::sim::SimAllocator`] (its caching allocator's statistics) and `attach()`
//! (PyTorch's own allocator: `torch.cuda.memory_stats()` read at each scrape, under the same
//! metric names). Both are served by the allocator crate's one HTTP server
//! (`vramscope_allocator::metrics::MetricsServer`, with its bounds on what a client may cost
//! the program); the pluggable allocator's server is `vramscope-ffi`'s.
//!
//! An explicit address (`metrics=` in Python) is served or raises. `VRAMSCOPE_METRICS` is the
//! process's one address (`vramscope_allocator::metrics::claim_env_addr`): the first face that
//! starts serves there, the C library's included, and later faces in the same process (the
//! pytest plugin's allocator per test, say) leave it to that one instead of failing to bind
//! the port again.

use std::sync::{Arc, Mutex};

use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::types::{PyCFunction, PyDict};
use vramscope_allocator::metrics::{AtEnd, DeviceFigures, MetricsServer as Server, StatsSource};
use vramscope_model::MemoryStats;

/// A running `/metrics` server; it stops on `close()` or when dropped. With
/// `VRAMSCOPE_METRICS_LINGER` or `VRAMSCOPE_METRICS_PUSH` set, the interpreter's exit closes it
/// (an `atexit` hook: Python does not promise to drop objects at exit), so the last figures
/// are served for the linger and pushed.
#[pyclass(module = "vramscope._native")]
pub struct MetricsServer {
    server: Arc<Mutex<Option<Server>>>,
    addr: String,
    /// Whether it serves `VRAMSCOPE_METRICS`'s address, given back when it stops.
    env_claim: bool,
}

impl MetricsServer {
    fn new(server: Server, env_claim: bool) -> MetricsServer {
        let at_exit = server.at_end() != &AtEnd::default();
        let made = MetricsServer {
            addr: server.addr().to_string(),
            server: Arc::new(Mutex::new(Some(server))),
            env_claim,
        };
        if at_exit {
            let slot = Arc::clone(&made.server);
            let registered = Python::attach(|py| -> PyResult<()> {
                let close = PyCFunction::new_closure(py, None, None, move |args, _| {
                    let server = slot.lock().unwrap_or_else(|e| e.into_inner()).take();
                    if let Some(server) = server {
                        args.py().detach(move || server.shutdown());
                    }
                })?;
                py.import("atexit")?.call_method1("register", (close,))?;
                Ok(())
            });
            if let Err(e) = registered {
                eprintln!("vramscope: the metrics' linger and push at exit not registered: {e}");
            }
        }
        made
    }
}

impl Drop for MetricsServer {
    fn drop(&mut self) {
        if self.env_claim {
            vramscope_allocator::metrics::release_env_claim();
        }
    }
}

#[pymethods]
impl MetricsServer {
    /// The address served, `HOST:PORT`.
    #[getter]
    fn addr(&self) -> String {
        self.addr.clone()
    }

    /// The URL a Prometheus scrapes, `http://HOST:PORT/metrics`.
    #[getter]
    fn url(&self) -> String {
        format!("http://{}/metrics", self.addr)
    }

    /// Stops serving (the port is released); closing twice does nothing.
    fn close(&self, py: Python<'_>) {
        let server = self.server.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(server) = server {
            // The server's thread may be waiting for the GIL in a scrape of `attach()`.
            py.detach(move || server.shutdown());
            if self.env_claim {
                vramscope_allocator::metrics::release_env_claim();
            }
        }
    }

    fn __repr__(&self) -> String {
        format!("<vramscope MetricsServer {}>", self.url())
    }
}

/// Serves `source` on `addr` (raising when it cannot), or without `addr` where
/// `VRAMSCOPE_METRICS` asks ([`serve_from_env`]): what every face of this module calls.
pub fn serve_at(
    source: StatsSource,
    addr: Option<&str>,
    allow_remote: bool,
) -> PyResult<Option<MetricsServer>> {
    use vramscope_allocator::metrics::MetricsError;
    let Some(addr) = addr else {
        return Ok(serve_from_env(source));
    };
    let server = Server::serve_source(source, addr, allow_remote).map_err(|e| {
        let message = format!("cannot serve /metrics on {addr}: {e}");
        match e {
            MetricsError::BadAddress(_) | MetricsError::NotLoopback(_) => {
                pyo3::exceptions::PyValueError::new_err(message)
            }
            _ => PyRuntimeError::new_err(message),
        }
    })?;
    Ok(Some(MetricsServer::new(server, false)))
}

/// Serves `/metrics` on `addr` from `stats`, a Python callable that returns
/// `torch.cuda.memory_stats()`'s flat dictionary for one device, called (with the GIL) at each
/// scrape; `device` labels the series. A scrape whose call fails serves no series for it.
/// `mem_info`, when given, returns `torch.cuda.mem_get_info()`'s `(free, total)`: the device's
/// free and capacity series (left out of a scrape where it fails).
/// Without `addr`, serves where `VRAMSCOPE_METRICS` asks ([`serve_from_env`]), or not at all.
#[pyfunction]
#[pyo3(signature = (addr, stats, device = 0, allow_remote = false, mem_info = None))]
pub fn serve_stats_metrics(
    addr: Option<&str>,
    stats: Py<PyAny>,
    device: u32,
    allow_remote: bool,
    mem_info: Option<Py<PyAny>>,
) -> PyResult<Option<MetricsServer>> {
    let source: StatsSource = Box::new(move || {
        Python::attach(|py| match read_flat_stats(py, &stats) {
            Some(figures) => {
                let mut figures = DeviceFigures::new(device, figures);
                let info = mem_info
                    .as_ref()
                    .and_then(|f| f.bind(py).call0().ok()?.extract::<(u64, u64)>().ok());
                if let Some((free, total)) = info.filter(|(_, total)| *total > 0) {
                    figures.free_bytes = Some(free);
                    figures.capacity_bytes = Some(total);
                }
                vec![figures]
            }
            None => Vec::new(),
        })
    });
    serve_at(source, addr, allow_remote)
}

/// Serves `source` where `VRAMSCOPE_METRICS` asks, when no other server of the process does:
/// `None` when unset or taken. An address it cannot serve is said on standard error, once, and
/// given back, rather than raised: the variable is the environment's, not the caller's code.
pub fn serve_from_env(source: StatsSource) -> Option<MetricsServer> {
    let (addr, allow_remote) = vramscope_allocator::metrics::claim_env_addr()?;
    match Server::serve_source(source, &addr, allow_remote) {
        Ok(server) => Some(MetricsServer::new(server, true)),
        Err(e) => {
            eprintln!("vramscope: VRAMSCOPE_METRICS={addr}: /metrics not served: {e}");
            vramscope_allocator::metrics::release_env_claim();
            None
        }
    }
}

/// Calls `stats` and reads its flat figures; `None` when the call or the reading fails.
fn read_flat_stats(py: Python<'_>, stats: &Py<PyAny>) -> Option<MemoryStats> {
    let value = stats.bind(py).call0().ok()?;
    let dict = value.cast::<PyDict>().ok()?;
    let mut figures = Vec::with_capacity(dict.len());
    for (key, value) in dict.iter() {
        let (Ok(key), Ok(value)) = (key.extract::<String>(), value.extract::<u64>()) else {
            continue;
        };
        figures.push((key, value));
    }
    Some(crate::live::stats_from_flat(figures))
}
