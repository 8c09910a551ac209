//! `vramscope._native`: the one native module of the `vramscope` Python package.
//!
//! It is at once the Python extension and the `CUDAPluggableAllocator` library: PyTorch loads
//! this file by path and calls its `vramscope_malloc`/`vramscope_free` C symbols, which are
//! `vramscope-ffi`'s, linked in, with the Python stack of each allocation as its call site
//! ([`pluggable`], which also registers the functions that steer that allocator; sampled
//! native stacks on threads without Python: [`native`]), while
//! Python imports it for [`sim::SimAllocator`] (the caching allocator on a simulated device),
//! the functions that steer the pluggable allocator, the inspector's reports on any file
//! PyTorch or vramscope wrote ([`analysis`], as typed findings and reports: `report`), the
//! synchronizing calls PyTorch reports, merged into those reports ([`host`]), live telemetry
//! of PyTorch's own allocator for `attach()` ([`live`]), and the Python stack capture settings
//! ([`stack`]). The Python package (`python/vramscope/`) wraps all of it.

// A Python extension has no Rust API: its modules are private, and the documentation links
// them for readers of the source.
#![allow(rustdoc::private_intra_doc_links)]

mod analysis;
mod host;
mod live;
mod metrics;
mod native;
mod pluggable;
mod ranks;
mod report;
mod sim;
mod stack;

use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use vramscope_import as import;

use crate::host::{HostLog, LogData, Numbering};

/// Loads `path` (a vramscope snapshot, a PyTorch snapshot pickle, a profiler trace). What is
/// not a regular file (a FIFO, a socket, a device) is a `ValueError` saying so, before it is
/// opened, as for the command line.
fn load(path: &str) -> PyResult<vramscope_model::Snapshot> {
    import::load(path).map_err(|e| PyValueError::new_err(e.to_string()))
}

/// Loads `path` with the syncs and steps of `log` merged in by time (the file numbers its own
/// steps: a PyTorch snapshot of `attach()`).
fn load_with(path: &str, log: Option<&LogData>) -> PyResult<vramscope_model::Snapshot> {
    let mut snapshot = load(path)?;
    if let Some(log) = log {
        host::merge(&mut snapshot, log, Numbering::ByTime);
    }
    Ok(snapshot)
}

/// How often a caller waiting for [`off_the_interpreter`] checks for signals.
const SIGNAL_CHECK_EVERY: std::time::Duration = std::time::Duration::from_millis(50);

/// Runs `work` (reading a file and analysing it) on a thread of its own while the calling
/// thread waits without the GIL, so that the interpreter's other threads run meanwhile, and
/// checks for signals every [`SIGNAL_CHECK_EVERY`], so that Ctrl-C raises `KeyboardInterrupt`
/// at once however large the file. Interrupted, the work goes on to its end on its thread and
/// what it made is dropped there; nothing of it reaches Python.
fn off_the_interpreter<T: Send + 'static>(
    py: Python<'_>,
    work: impl FnOnce() -> PyResult<T> + Send + 'static,
) -> PyResult<T> {
    use std::sync::mpsc::{channel, RecvTimeoutError};
    let (done, result) = channel();
    std::thread::Builder::new()
        .name("vramscope-load".into())
        .spawn(move || {
            let _ = done.send(work());
        })
        .map_err(|e| PyRuntimeError::new_err(format!("cannot start a thread: {e}")))?;
    let mut result = result;
    loop {
        // The receiver goes to the wait without the GIL and comes back with what it got.
        let got;
        (got, result) = py.detach(move || (result.recv_timeout(SIGNAL_CHECK_EVERY), result));
        match got {
            Ok(value) => return value,
            Err(RecvTimeoutError::Timeout) => py.check_signals()?,
            Err(RecvTimeoutError::Disconnected) => {
                return Err(PyRuntimeError::new_err(
                    "vramscope: reading the file failed unexpectedly (a panic)",
                ))
            }
        }
    }
}

/// What `log` holds, copied for a thread of its own.
fn log_data(log: Option<Bound<'_, HostLog>>) -> Option<LogData> {
    log.as_ref().map(|log| log.get().data())
}

/// The inspector's findings on the file at `path`, with the syncs of `log`, most severe
/// first.
#[pyfunction]
#[pyo3(signature = (path, log = None))]
fn file_findings(
    py: Python<'_>,
    path: String,
    log: Option<Bound<'_, HostLog>>,
) -> PyResult<Vec<report::Finding>> {
    let log = log_data(log);
    off_the_interpreter(py, move || {
        let snapshot = load_with(&path, log.as_ref())?;
        // An empty dump is said to be one, in the words of `vramscope report` and `load()`,
        // never answered with no findings (issue 42, item 11).
        if let Some(words) = vramscope_analysis::report::nothing_to_analyse(&snapshot, &path) {
            return Err(PyValueError::new_err(words));
        }
        // A file of several devices is its devices, each finding saying its own.
        let parts = vramscope_engine::devices::parts(snapshot);
        let many = parts.len() > 1;
        Ok(parts
            .iter()
            .flat_map(|part| {
                let label = vramscope_render::device_label_of(&part.device.name, part.device.index);
                report::findings_of(part).into_iter().map(move |f| {
                    if many {
                        f.on_device(&label)
                    } else {
                        f
                    }
                })
            })
            .collect())
    })
}

/// `vramscope report` on the file at `path` (a PyTorch snapshot pickle, a vramscope snapshot,
/// a profiler trace), with the syncs of `log`: `device`'s part, or every device with data (a
/// report of each, the worst first). An empty dump is a `ValueError` in the command line's
/// words. The file is read and analysed without the GIL, and Ctrl-C stops the wait at once
/// ([`off_the_interpreter`]).
#[pyfunction]
#[pyo3(name = "load", signature = (path, device = None, log = None))]
fn file_report(
    py: Python<'_>,
    path: String,
    device: Option<u32>,
    log: Option<Bound<'_, HostLog>>,
) -> PyResult<report::Report> {
    let log = log_data(log);
    off_the_interpreter(py, move || {
        let snapshot = load_with(&path, log.as_ref())?;
        let parts = report::device_parts(snapshot, device, &path)?;
        Ok(report::Report::from_parts(&parts, Some(path)))
    })
}

/// The inspector's text report on the file at `path`, with the syncs of `log`.
#[pyfunction]
#[pyo3(signature = (path, log = None))]
fn file_report_text(
    py: Python<'_>,
    path: String,
    log: Option<Bound<'_, HostLog>>,
) -> PyResult<String> {
    let log = log_data(log);
    off_the_interpreter(py, move || {
        let parts = vramscope_engine::devices::parts(load_with(&path, log.as_ref())?);
        Ok(analysis::report_text_of_parts(&parts))
    })
}

/// The checks of the pytest marker that the file at `path`, with the syncs of `log`, fails.
#[pyfunction]
#[pyo3(signature = (path, max_peak = None, no_leaks = false, max_syncs_per_step = None, log = None))]
fn file_check(
    py: Python<'_>,
    path: String,
    max_peak: Option<u64>,
    no_leaks: bool,
    max_syncs_per_step: Option<u64>,
    log: Option<Bound<'_, HostLog>>,
) -> PyResult<Vec<String>> {
    let log = log_data(log);
    off_the_interpreter(py, move || {
        Ok(analysis::check(
            &load_with(&path, log.as_ref())?,
            analysis::Limits::new(max_peak, no_leaks, max_syncs_per_step, None),
        ))
    })
}

/// Writes the file at `path` (a PyTorch snapshot pickle, say) as a vramscope snapshot to
/// `out`, with the syncs and steps of `log`.
#[pyfunction]
#[pyo3(signature = (path, out, log = None))]
fn file_convert(
    py: Python<'_>,
    path: String,
    out: String,
    log: Option<Bound<'_, HostLog>>,
) -> PyResult<()> {
    let log = log_data(log);
    off_the_interpreter(py, move || {
        load_with(&path, log.as_ref())?
            .save(&out)
            .map_err(|e| PyRuntimeError::new_err(e.to_string()))
    })
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

/// Runs the `vramscope` command line on `argv` (the program's name first) and returns its exit
/// status: the Python package's `vramscope` command. The command line is the library's own
/// (`vramscope::cli`), built into this module, so the wheel carries no second executable; the
/// GIL is released while it runs, so a dashboard (`top`, `view`) never holds up other threads.
#[pyfunction]
fn cli(py: Python<'_>, argv: Vec<String>) -> u8 {
    py.detach(|| vramscope::cli::main_with_args(argv))
}

/// The package's version, from the workspace's Cargo.toml.
#[pyfunction]
fn version() -> &'static str {
    env!("CARGO_PKG_VERSION")
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
    m.add_class::<metrics::MetricsServer>()?;
    m.add_function(wrap_pyfunction!(metrics::serve_stats_metrics, m)?)?;
    m.add_class::<report::Finding>()?;
    m.add_class::<report::FindingSite>()?;
    m.add_class::<report::Report>()?;
    m.add_class::<report::TopSite>()?;
    m.add_class::<live::LivePublisher>()?;
    m.add_function(wrap_pyfunction!(live::read_telemetry, m)?)?;
    m.add_class::<ranks::RankSummary>()?;
    m.add_class::<ranks::RankComparison>()?;
    m.add_function(wrap_pyfunction!(ranks::rank_summary, m)?)?;
    m.add_function(wrap_pyfunction!(ranks::compare_ranks, m)?)?;
    m.add_function(wrap_pyfunction!(file_findings, m)?)?;
    m.add_function(wrap_pyfunction!(file_report, m)?)?;
    m.add_function(wrap_pyfunction!(file_report_text, m)?)?;
    m.add_function(wrap_pyfunction!(file_check, m)?)?;
    m.add_function(wrap_pyfunction!(file_convert, m)?)?;
    m.add_function(wrap_pyfunction!(cli, m)?)?;
    m.add_function(wrap_pyfunction!(version, m)?)?;
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
    pluggable::register(m)?;
    Ok(())
}

/// The binding's own tests, run by `cargo test --workspace`: the module is registered with an
/// embedded interpreter and driven through Python, as the package drives it.
#[cfg(test)]
mod tests {
    use pyo3::prelude::*;
    use pyo3::types::PyList;

    use super::_native;

    /// Runs `body` with the module importable as `_native` in an embedded interpreter.
    fn with_module<T>(body: impl FnOnce(&Bound<'_, PyModule>) -> T) -> T {
        static REGISTER: std::sync::Once = std::sync::Once::new();
        REGISTER.call_once(|| {
            pyo3::append_to_inittab!(_native);
            Python::initialize();
        });
        Python::attach(|py| {
            let module = py.import("_native").expect("the module registers");
            body(&module)
        })
    }

    /// Issue 44: `load()` of a FIFO with no writer blocked the interpreter for ten minutes; it
    /// is a `ValueError` saying what the path is, before it is opened.
    #[test]
    #[cfg(unix)]
    fn load_refuses_what_is_not_a_regular_file_with_a_value_error() {
        let dir = std::env::temp_dir().join(format!("vramscope-py-fifo-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let fifo = dir.join("trace.pickle");
        let made = std::process::Command::new("mkfifo").arg(&fifo).status();
        let mut cases = vec![("/dev/zero".to_string(), "a device")];
        if made.is_ok_and(|s| s.success()) {
            cases.push((fifo.to_str().unwrap().to_string(), "a FIFO"));
        }
        with_module(|m| {
            for (path, kind) in &cases {
                let e = m.call_method1("load", (path.as_str(),)).unwrap_err();
                assert!(
                    e.is_instance_of::<pyo3::exceptions::PyValueError>(m.py()),
                    "{e}"
                );
                assert!(e.to_string().contains(kind), "{e}");
            }
        });
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// Issue 44: reading and analysing a file holds no GIL, so another thread that needs the
    /// interpreter runs meanwhile: here the work waits for a thread that must take the GIL
    /// first, which it could not while the caller held it (the work then gives up after 20 s
    /// and the test fails).
    #[test]
    fn a_file_is_read_without_the_gil() {
        use std::sync::atomic::{AtomicBool, Ordering};
        use std::sync::Arc;
        with_module(|m| {
            let py = m.py();
            let ran = Arc::new(AtomicBool::new(false));
            let flag = ran.clone();
            let other = std::thread::spawn(move || {
                Python::attach(|_| flag.store(true, Ordering::SeqCst));
            });
            let seen = super::off_the_interpreter(py, move || {
                let start = std::time::Instant::now();
                while !ran.load(Ordering::SeqCst) {
                    if start.elapsed() > std::time::Duration::from_secs(20) {
                        return Ok(false);
                    }
                    std::thread::sleep(std::time::Duration::from_millis(1));
                }
                Ok(true)
            });
            assert!(
                seen.unwrap(),
                "another thread took the GIL while the file was read"
            );
            py.detach(|| other.join().unwrap());
        });
    }

    #[test]
    fn sizes_parse_with_binary_units_as_on_the_command_line() {
        with_module(|m| {
            let bytes: u64 = m
                .call_method1("parse_bytes", ("24GB",))
                .and_then(|v| v.extract())
                .expect("24GB parses");
            assert_eq!(bytes, 24 << 30);
            assert_eq!(
                vramscope_model::parse_bytes("24GB").expect("the core parses it"),
                bytes
            );
            let error = m.call_method1("parse_bytes", ("24 parsecs",)).unwrap_err();
            assert!(error.to_string().contains("parsecs"), "{error}");
        });
    }

    #[test]
    fn the_version_is_the_workspace_version() {
        with_module(|m| {
            let version: String = m
                .call_method0("version")
                .and_then(|v| v.extract())
                .expect("version");
            assert_eq!(version, env!("CARGO_PKG_VERSION"));
        });
    }

    #[test]
    fn the_command_line_runs_inside_the_module() {
        use vramscope::{AllocatorConfig, CachingAllocator, SimDevice};

        let dir = std::env::temp_dir().join(format!("vramscope-py-cli-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let input = dir.join("run.json");
        let alloc = CachingAllocator::new(SimDevice::phantom(1 << 30), AllocatorConfig::default());
        let mut kept = Vec::new();
        for _ in 0..6 {
            alloc.mark_step();
            kept.push(alloc.alloc(4 << 20).expect("fits"));
        }
        alloc.snapshot().save(&input).expect("save");
        let output = dir.join("report.json");
        let run = |args: &[&str]| -> u8 {
            with_module(|m| {
                let argv = PyList::new(m.py(), args).expect("argv");
                m.call_method1("cli", (argv,))
                    .and_then(|v| v.extract())
                    .expect("cli runs")
            })
        };
        let input_arg = input.to_str().expect("utf-8 path");
        let output_arg = output.to_str().expect("utf-8 path");
        let status = run(&[
            "vramscope",
            "report",
            input_arg,
            "--format",
            "json",
            "-o",
            output_arg,
        ]);
        assert_eq!(status, 0);
        let report: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&output).expect("the report was written"))
                .expect("JSON");
        assert_eq!(
            report["devices"].as_array().map(Vec::len),
            Some(1),
            "{report}"
        );
        // A bad argument is status 2 and a message, not the end of the embedding process.
        assert_eq!(run(&["vramscope", "report", "--no-such-flag"]), 2);
        assert_eq!(run(&["vramscope", "--version"]), 0);
        // The kept blocks are a leak: `--fail-on` turns it into exit status 1, as in a shell.
        let failing = run(&[
            "vramscope",
            "report",
            input_arg,
            "--fail-on",
            "info",
            "-o",
            output_arg,
        ]);
        assert_eq!(failing, 1);
        drop(kept);
        std::fs::remove_dir_all(&dir).ok();
    }

    /// Runs Python `code` with the module as `_native` and `path` as `path`, and returns what
    /// it leaves in `result` as JSON text.
    fn run_python(path: &str, code: &str) -> String {
        with_module(|m| {
            let py = m.py();
            let locals = pyo3::types::PyDict::new(py);
            locals.set_item("_native", m).expect("module");
            locals.set_item("path", path).expect("path");
            let code = std::ffi::CString::new(code).expect("no NUL");
            py.run(&code, None, Some(&locals)).expect("the code runs");
            let result = locals
                .get_item("result")
                .expect("result")
                .expect("the code sets result");
            let json = py.import("json").expect("json");
            json.call_method1("dumps", (result,))
                .and_then(|v| v.extract())
                .expect("JSON")
        })
    }

    /// `load()` on a 3-GPU dump whose cuda:1 ran out of memory opens the file (issue 42, item
    /// 4): its verdict is the whole file's and names the OOM on cuda:1, its devices are the
    /// worst first, its figures the worst device's, and `to_dict()` is the command line's
    /// JSON.
    #[test]
    fn load_opens_a_multi_device_file_device_by_device() {
        let dir = std::env::temp_dir().join(format!("vramscope-py-3gpu-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let path = dir.join("three.json");
        vramscope_testkit::three_devices_oom_on_1()
            .save(&path)
            .expect("save");
        let path = path.to_str().expect("utf-8 path");
        let seen: serde_json::Value = serde_json::from_str(&run_python(
            path,
            "r = _native.load(path)\n\
             d = r.to_dict()\n\
             result = {'verdict': r.verdict, 'device': r.device, \
               'devices': [x.device for x in r.devices], \
               'peaks': [x.peak_allocated for x in r.devices], 'peak': r.peak_allocated, \
               'errors': [(f.device, f.kind) for f in r.findings if f.severity == 'error'], \
               'json_devices': len(d['devices']), 'json_verdict': d['verdict'], \
               'summary': r.summary().splitlines()[0], 'html': '<iframe' in r.html(), \
               'repr': repr(r)}\n",
        ))
        .expect("JSON");
        let verdict = seen["verdict"].as_str().expect("verdict");
        assert!(
            verdict.starts_with("1 problem found: oom on cuda:1 at "),
            "{seen:#}"
        );
        assert_eq!(seen["device"], "cuda:1", "the worst device's figures");
        assert_eq!(
            seen["devices"],
            serde_json::json!(["cuda:1", "cuda:0", "cuda:2"])
        );
        assert_eq!(seen["peak"], seen["peaks"][0]);
        assert_eq!(seen["errors"], serde_json::json!([["cuda:1", "oom"]]));
        assert_eq!(seen["json_devices"], 3);
        assert_eq!(seen["json_verdict"], verdict);
        assert_eq!(
            seen["summary"], verdict,
            "the text opens with the file's verdict"
        );
        assert_eq!(seen["html"], true);
        assert!(
            seen["repr"].as_str().unwrap().contains("3 devices"),
            "{seen:#}"
        );
        std::fs::remove_dir_all(&dir).ok();
    }

    /// `load()` on an empty dump raises what `vramscope report` says of it (issue 42, item 11),
    /// not a report that finds no leaks in 0 events.
    #[test]
    fn load_of_an_empty_dump_says_what_the_command_line_says() {
        use vramscope_model::{DeviceInfo, Snapshot, SnapshotSource};
        let dir = std::env::temp_dir().join(format!("vramscope-py-empty-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let path = dir.join("empty.json");
        Snapshot::empty(SnapshotSource::Vramscope, DeviceInfo::default())
            .save(&path)
            .expect("save");
        let path = path.to_str().expect("utf-8 path");
        let seen: serde_json::Value = serde_json::from_str(&run_python(
            path,
            "try:\n    _native.load(path)\n    result = ['loaded']\n\
             except ValueError as e:\n    result = ['ValueError', str(e)]\n",
        ))
        .expect("JSON");
        // `report_file()` (the findings of a file) says the same, not an empty list.
        let findings: serde_json::Value = serde_json::from_str(&run_python(
            path,
            "try:\n    result = ['findings', len(_native.file_findings(path))]\n\
             except ValueError as e:\n    result = ['ValueError', str(e)]\n",
        ))
        .expect("JSON");
        let words = vramscope_analysis::report::nothing_to_analyse(
            &Snapshot::empty(SnapshotSource::Vramscope, DeviceInfo::default()),
            path,
        )
        .expect("an empty dump has nothing to analyse");
        assert_eq!(seen, serde_json::json!(["ValueError", words]));
        assert_eq!(findings, serde_json::json!(["ValueError", words]));
        // The command line, run inside the module, says the same words with status 2.
        let status: u8 = with_module(|m| {
            let argv = PyList::new(m.py(), ["vramscope", "report", path]).expect("argv");
            m.call_method1("cli", (argv,))
                .and_then(|v| v.extract())
                .expect("cli runs")
        });
        assert_eq!(status, 2);
        std::fs::remove_dir_all(&dir).ok();
    }
}
