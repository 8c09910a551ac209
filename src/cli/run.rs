//! `vramscope run -- python train.py ARGS`: a training script watched with no change to it, as
//! `memray run` and `py-spy record` do.
//!
//! The command starts the script's Python with a `sitecustomize.py` of its own first on
//! `PYTHONPATH` (written to a private temporary folder, [`SITECUSTOMIZE`]), which imports the
//! Python package's `vramscope._run` before the script's first line: that applies `attach()`
//! (PyTorch's own allocator, recorded) or `use_allocator()` (vramscope's) with the snapshot,
//! OOM snapshot, telemetry and metrics settings this command passes in one environment
//! variable, [`ENV_CONFIG`], which it removes from the environment at once so that the
//! script's own child processes are not watched twice. A `sitecustomize` the environment
//! already has still runs after it. When the script ends, whether it returned, raised or died
//! of an out-of-memory error, this command reads the snapshots it left and prints the report's
//! verdict on standard error, with the commands that open them, and exits with the script's
//! own status (128 plus the signal's number when a signal ended it), so a job's scheduler sees
//! what it would have seen without vramscope.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command as Process;

use clap::{Args, ValueEnum};

use super::common::{say, Failure};
use crate::analysis::report::{self, ReportOptions};
use crate::import::{self, ImportOptions};
use crate::render;

/// The environment variable that carries the settings to `vramscope._run` (JSON).
pub const ENV_CONFIG: &str = "VRAMSCOPE_RUN_CONFIG";

/// The `sitecustomize.py` that applies vramscope in the script's interpreter.
const SITECUSTOMIZE: &str = r#"# Written by `vramscope run`: applies vramscope in this Python before the script's first
# line (vramscope._run reads VRAMSCOPE_RUN_CONFIG), then runs the sitecustomize that the
# environment would have run without it.
import os as _os
import sys as _sys

_here = _os.path.dirname(_os.path.abspath(__file__))
try:
    import vramscope._run as _vramscope_run
    _vramscope_run.start_from_env()
except Exception as _error:  # the script runs unwatched rather than not at all
    _sys.stderr.write("vramscope run: not applied: %s: %s\n" % (type(_error).__name__, _error))
_sys.path[:] = [p for p in _sys.path if _os.path.abspath(p or ".") != _here]
_this = _sys.modules.pop("sitecustomize", None)
try:
    import sitecustomize  # noqa: F401
except ImportError:
    pass
finally:
    # The import that runs this file expects to find a module under its name.
    _sys.modules.setdefault("sitecustomize", _this)
"#;

/// Which allocator the script runs on.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum RunAllocator {
    /// PyTorch's own, recorded with `_record_memory_history` (`vramscope.attach()`).
    #[default]
    Pytorch,
    /// vramscope's caching allocator under PyTorch (`vramscope.use_allocator()`).
    Vramscope,
}

/// The arguments of `vramscope run`.
#[derive(Args)]
pub struct RunArgs {
    /// Where the snapshot is written when the script ends (a PyTorch pickle for
    /// `--allocator pytorch`, a vramscope snapshot for `.json`); vramscope-run.pickle by
    /// default (vramscope-run.json with `--allocator vramscope`).
    #[arg(long)]
    snapshot: Option<PathBuf>,
    /// Where the snapshot taken at an out-of-memory error is written (PyTorch's allocator);
    /// the snapshot's name with `-oom` by default.
    #[arg(long)]
    oom_snapshot: Option<PathBuf>,
    /// Publish live telemetry on unix:PATH or tcp:127.0.0.1:PORT for `vramscope top`.
    #[arg(long)]
    listen: Option<String>,
    /// Serve Prometheus's /metrics on this address (127.0.0.1:9400), as VRAMSCOPE_METRICS.
    #[arg(long)]
    metrics: Option<String>,
    /// The allocator the script runs on: pytorch (its own, recorded) or vramscope.
    #[arg(long, value_enum, default_value = "pytorch")]
    allocator: RunAllocator,
    /// The command to run, after `--`: `python train.py ARGS` (one Python process: a
    /// launcher such as torchrun would be watched itself, not its workers).
    #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
    command: Vec<OsString>,
}

/// Runs `args.command` watched, prints the verdict on what it left, and returns its status.
pub fn run(args: RunArgs) -> Result<u8, Failure> {
    let snapshot = args.snapshot.clone().unwrap_or_else(|| {
        PathBuf::from(match args.allocator {
            RunAllocator::Pytorch => "vramscope-run.pickle",
            RunAllocator::Vramscope => "vramscope-run.json",
        })
    });
    let oom_snapshot = args
        .oom_snapshot
        .clone()
        .unwrap_or_else(|| with_suffix(&snapshot, "-oom"));
    let absolute = |p: &Path| std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf());
    let (snapshot, oom_snapshot) = (absolute(&snapshot), absolute(&oom_snapshot));
    for stale in [&snapshot, &oom_snapshot] {
        // A snapshot from an earlier run must not pass for this one's.
        match std::fs::remove_file(stale) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(Failure::input(format!(
                    "cannot replace {}: {e}",
                    stale.display()
                )))
            }
            _ => {}
        }
    }
    let site = tempfile_dir()?;
    std::fs::write(site.path().join("sitecustomize.py"), SITECUSTOMIZE)
        .map_err(|e| Failure::input(format!("cannot write {}: {e}", site.path().display())))?;
    let config = serde_json::json!({
        "allocator": match args.allocator {
            RunAllocator::Pytorch => "pytorch",
            RunAllocator::Vramscope => "vramscope",
        },
        "snapshot": snapshot.to_string_lossy(),
        "oom_snapshot": oom_snapshot.to_string_lossy(),
        "listen": args.listen,
        "metrics": args.metrics,
    });
    let mut paths = vec![site.path().to_path_buf()];
    if let Some(existing) = std::env::var_os("PYTHONPATH").filter(|p| !p.is_empty()) {
        paths.extend(std::env::split_paths(&existing));
    }
    let python_path = std::env::join_paths(paths)
        .map_err(|e| Failure::input(format!("cannot set PYTHONPATH: {e}")))?;
    let (program, rest) = args.command.split_first().expect("clap requires a command");
    let name = Path::new(program).display();
    let mut child = Process::new(program)
        .args(rest)
        .env("PYTHONPATH", python_path)
        .env(ENV_CONFIG, config.to_string())
        .spawn()
        .map_err(|e| Failure::input(format!("cannot run {name}: {e}")))?;
    // Ctrl-C reaches the script, which writes its snapshot and exits; this command outlives it
    // to print the verdict and pass its status on. Ignored after the spawn, so that the script
    // keeps the default handling.
    let status = {
        let _interrupts = IgnoredInterrupts::now();
        child.wait()
    }
    .map_err(|e| Failure::input(format!("cannot wait for {name}: {e}")))?;
    drop(site);
    let code = exit_code(&status);
    say(format_args!(
        "vramscope run: {} exited with status {code}",
        Path::new(program).display()
    ));
    let mut found = false;
    for (label, path) in [
        ("at exit", &snapshot),
        ("at the out-of-memory error", &oom_snapshot),
    ] {
        if !path.is_file() {
            continue;
        }
        found = true;
        match verdict_of(path) {
            Ok(verdict) => say(format_args!(
                "vramscope run: snapshot {label}: {}\n  {verdict}\n  details: vramscope report {}  (dashboard: vramscope view {})",
                path.display(),
                path.display(),
                path.display()
            )),
            Err(e) => say(format_args!(
                "vramscope run: the snapshot {label}, {}, cannot be read: {e}",
                path.display()
            )),
        }
    }
    if !found {
        say(format_args!(
            "vramscope run: the script left no snapshot at {} (it was killed before Python could \
             write one, or vramscope was not applied: see the lines above)",
            snapshot.display()
        ));
    }
    Ok(code)
}

/// SIGINT and SIGQUIT ignored by this process until dropped, as `system()` ignores them while
/// its command runs (a no-op where there are no such signals).
struct IgnoredInterrupts {
    #[cfg(unix)]
    previous: [(libc::c_int, libc::sighandler_t); 2],
}

impl IgnoredInterrupts {
    fn now() -> IgnoredInterrupts {
        #[cfg(unix)]
        {
            // SAFETY: `signal` with `SIG_IGN` installs no code of ours; the previous handlers
            // it returns are put back unchanged on drop.
            let previous = [libc::SIGINT, libc::SIGQUIT]
                .map(|signal| (signal, unsafe { libc::signal(signal, libc::SIG_IGN) }));
            IgnoredInterrupts { previous }
        }
        #[cfg(not(unix))]
        IgnoredInterrupts {}
    }
}

impl Drop for IgnoredInterrupts {
    fn drop(&mut self) {
        #[cfg(unix)]
        for (signal, handler) in self.previous {
            if handler != libc::SIG_ERR {
                // SAFETY: puts back the handler `signal` returned for this signal.
                unsafe { libc::signal(signal, handler) };
            }
        }
    }
}

/// The report's verdict on the snapshot at `path`: the whole file's, every device counted, or
/// the sentence every face says of an empty dump.
fn verdict_of(path: &Path) -> Result<String, String> {
    let snapshot = import::load_with(path, &ImportOptions::default()).map_err(|e| e.to_string())?;
    if let Some(message) = report::nothing_to_analyse(&snapshot, &path.display().to_string()) {
        return Ok(message);
    }
    let mut options = ReportOptions::default();
    options.explorer = false;
    let built: Vec<report::Report> = crate::engine::devices::parts(snapshot)
        .iter()
        .map(|part| report::build_report(part, &options))
        .collect();
    Ok(render::file_verdict(&built))
}

/// `path` with `suffix` added before its extension: `run.pickle` → `run-oom.pickle`.
fn with_suffix(path: &Path, suffix: &str) -> PathBuf {
    let stem = path
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    let name = match path.extension() {
        Some(ext) => format!("{stem}{suffix}.{}", ext.to_string_lossy()),
        None => format!("{stem}{suffix}"),
    };
    path.with_file_name(name)
}

/// The status a shell would report for `status`: its code, or 128 plus the signal's number.
fn exit_code(status: &std::process::ExitStatus) -> u8 {
    if let Some(code) = status.code() {
        return u8::try_from(code & 0xff).unwrap_or(1);
    }
    #[cfg(unix)]
    {
        use std::os::unix::process::ExitStatusExt;
        if let Some(signal) = status.signal() {
            return u8::try_from(128 + (signal & 0x7f)).unwrap_or(1);
        }
    }
    1
}

/// A private temporary folder, removed when dropped.
struct TempDir(PathBuf);

impl TempDir {
    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Creates a fresh folder under the system's temporary folder, readable by this user only.
fn tempfile_dir() -> Result<TempDir, Failure> {
    let base = std::env::temp_dir();
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    for attempt in 0..100u32 {
        let path = base.join(format!(
            "vramscope-run-{}-{nanos:x}-{attempt}",
            std::process::id()
        ));
        let mut builder = std::fs::DirBuilder::new();
        #[cfg(unix)]
        {
            use std::os::unix::fs::DirBuilderExt;
            builder.mode(0o700);
        }
        match builder.create(&path) {
            Ok(()) => return Ok(TempDir(path)),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => {
                return Err(Failure::input(format!(
                    "cannot create a folder in {}: {e}",
                    base.display()
                )))
            }
        }
    }
    Err(Failure::input(format!(
        "cannot create a fresh folder in {}",
        base.display()
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_oom_snapshot_is_named_after_the_snapshot() {
        assert_eq!(
            with_suffix(Path::new("/x/run.pickle"), "-oom"),
            PathBuf::from("/x/run-oom.pickle")
        );
        assert_eq!(
            with_suffix(Path::new("run"), "-oom"),
            PathBuf::from("run-oom")
        );
    }

    #[cfg(unix)]
    #[test]
    fn a_signal_is_reported_as_a_shell_reports_it() {
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(exit_code(&std::process::ExitStatus::from_raw(9)), 137);
        assert_eq!(exit_code(&std::process::ExitStatus::from_raw(3 << 8)), 3);
    }

    /// The verdict `run` prints after the script is the whole file's: on a 3-GPU snapshot
    /// whose cuda:1 ran out of memory it names that OOM, and an empty snapshot is said to be
    /// empty, not clean (issue 42, items 4 and 11).
    #[test]
    fn the_verdict_is_the_whole_files() {
        let dir =
            std::env::temp_dir().join(format!("vramscope-run-verdict-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let three = dir.join("three.json");
        vramscope_testkit::three_devices_oom_on_1()
            .save(&three)
            .unwrap();
        let verdict = verdict_of(&three).unwrap();
        assert!(
            verdict.starts_with("1 problem found: oom on cuda:1 at "),
            "{verdict}"
        );
        let empty = dir.join("empty.json");
        crate::Snapshot::empty(crate::model::SnapshotSource::Vramscope, Default::default())
            .save(&empty)
            .unwrap();
        let verdict = verdict_of(&empty).unwrap();
        assert!(verdict.contains("nothing to analyse"), "{verdict}");
        std::fs::remove_dir_all(&dir).ok();
    }
}
