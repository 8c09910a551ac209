//! vramscope-testkit: the helpers and fixtures of vramscope's tests, in one dev-only crate
//! (never a dependency of a library, so nothing here is part of any public API).
//!
//! - [`Trace`] and [`event`] (the `trace` module) build synthetic snapshots and single events;
//! - [`generated::trace_of_ops`] builds the traces, consistent or not, of property tests;
//! - [`planted`] records PyTorch-shaped training and inference programs whose generator knows
//!   what every block is (its category), for the tests of what memory is made of;
//! - [`device_run`] and [`merge_devices`] build the multi-device snapshots that tests of
//!   per-device views need, by running the caching allocator on simulated devices;
//! - [`props::config`] is the one configuration of every property test (a fixed seed; a deep
//!   run on request);
//! - [`skip_notice`], [`shared_traces_dir`] and [`shared_trace`] are for tests that need
//!   something this machine may lack;
//! - [`prometheus`] runs a real Prometheus and Pushgateway for the tests of `/metrics`;
//! - [`torch_h200`] finds the recordings of PyTorch's own allocator on an H200 and what PyTorch counted.
//!
//! Tests that need something this machine may lack (the shared traces, a CUDA driver, python3)
//! check for it at run time and, when it is absent, say so in one visible line and pass:
//! [`skip_notice`] writes that line past the test harness's output capture, and
//! [`shared_traces_dir`] finds the real traces the project tests against. Where the traces
//! must be there (CI sets [`REQUIRE_TRACES_ENV`]`=1`), [`shared_trace`] fails the test instead
//! of skipping it.

use std::io::Write;
use std::path::{Path, PathBuf};

use vramscope_caching::{CachingAllocator, SimDevice};

pub mod fixture;
pub mod generated;
pub mod planted;
pub mod prometheus;
pub mod props;
pub mod torch_h200;
mod trace;

pub use trace::{clean_loop, event, EventBuilder, Trace, MIB};

/// The environment variable that points at the shared traces folder.
pub const TRACES_ENV: &str = "VRAMSCOPE_TRACES";

/// Writes `skipped: {reason}` as one line to standard error, visible even when the test
/// harness captures test output (it bypasses `print!`'s capture).
pub fn skip_notice(reason: &str) {
    let mut stderr = std::io::stderr().lock();
    let _ = writeln!(stderr, "skipped: {reason}");
}

/// `GET path` over HTTP/1.1 at `addr` (`HOST:PORT`), the way a Prometheus scrape asks;
/// returns the status line, the header lines and the body. A connection that fails or a
/// response that does not end its head fails the test.
pub fn http_get(addr: &str, path: &str) -> (String, String, String) {
    use std::io::Read;
    let mut conn =
        std::net::TcpStream::connect(addr).unwrap_or_else(|e| panic!("connecting to {addr}: {e}"));
    write!(
        conn,
        "GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
    )
    .expect("the request written");
    let mut response = String::new();
    conn.read_to_string(&mut response)
        .unwrap_or_else(|e| panic!("reading the answer of {addr}{path}: {e}"));
    let (head, body) = response
        .split_once("\r\n\r\n")
        .unwrap_or_else(|| panic!("an incomplete response from {addr}{path}: {response:?}"));
    let (status, headers) = head.split_once("\r\n").unwrap_or((head, ""));
    (status.to_string(), headers.to_string(), body.to_string())
}

/// Checks `text` with Prometheus's own linter, `promtool check metrics` (Debian's `prometheus`
/// package), and fails the test with promtool's words when it finds a fault. Where promtool is
/// not installed the check says, in one line, that it was skipped.
pub fn check_with_promtool(text: &str) {
    use std::process::{Command, Stdio};
    let child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn();
    let Ok(mut child) = child else {
        skip_notice("promtool not found: the metrics were not checked by Prometheus's linter (apt-get install prometheus)");
        return;
    };
    if let Some(mut stdin) = child.stdin.take() {
        stdin
            .write_all(text.as_bytes())
            .expect("the metrics written to promtool");
    }
    let output = child.wait_with_output().expect("promtool's answer");
    assert!(
        output.status.success(),
        "promtool check metrics failed:\n{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

/// The shared traces folder: `$VRAMSCOPE_TRACES`, else `shared/traces` beside the workspace
/// root (`workspace_root/../shared/traces`). `None` when it does not exist.
pub fn shared_traces_dir(workspace_root: &Path) -> Option<PathBuf> {
    let dir = traces_dir_path(workspace_root);
    dir.is_dir().then_some(dir)
}

/// Where the shared traces folder should be, whether or not it exists.
fn traces_dir_path(workspace_root: &Path) -> PathBuf {
    std::env::var_os(TRACES_ENV)
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root.join("../shared/traces"))
}

/// The environment variable that makes a missing shared trace a failure: set to `1` (as
/// `.ci/run` does), [`shared_trace`] panics where it would otherwise skip.
pub const REQUIRE_TRACES_ENV: &str = "VRAMSCOPE_REQUIRE_TRACES";

/// Whether [`REQUIRE_TRACES_ENV`] asks for the shared traces: set, and neither empty nor `0`.
pub fn traces_required() -> bool {
    std::env::var_os(REQUIRE_TRACES_ENV).is_some_and(|v| !v.is_empty() && v != "0")
}

/// A file in the shared traces folder, or `None` after a [`skip_notice`] naming it. With
/// [`REQUIRE_TRACES_ENV`] set, a missing file panics instead, so the test fails.
pub fn shared_trace(workspace_root: &Path, name: &str) -> Option<PathBuf> {
    let dir = traces_dir_path(workspace_root);
    let path = dir.join(name);
    if path.is_file() {
        return Some(path);
    }
    let reason = format!(
        "shared trace {name} not found in {} (set {TRACES_ENV} to the traces folder)",
        dir.display()
    );
    if traces_required() {
        panic!("{reason}; {REQUIRE_TRACES_ENV} is set, so a missing trace fails");
    }
    skip_notice(&reason);
    None
}

/// The shared traces folder for a test that reads every trace in it, or `None` after a
/// [`skip_notice`] naming where it looked. With [`REQUIRE_TRACES_ENV`] set, an absent folder
/// panics instead, as [`shared_trace`] does for one file.
pub fn shared_traces_folder(workspace_root: &Path) -> Option<PathBuf> {
    let dir = traces_dir_path(workspace_root);
    if dir.is_dir() {
        return Some(dir);
    }
    let reason = format!(
        "shared traces not found at {} (set {TRACES_ENV} to the traces folder)",
        dir.display()
    );
    if traces_required() {
        panic!("{reason}; {REQUIRE_TRACES_ENV} is set, so a missing folder fails");
    }
    skip_notice(&reason);
    None
}

/// A short run on simulated device `index`: a block of `bytes` kept throughout, and three
/// steps that each allocate and free half that. Its snapshot, with history.
pub fn device_run(index: u32, bytes: u64) -> vramscope_model::Snapshot {
    let alloc = CachingAllocator::new(
        SimDevice::with_index(1 << 36, false, index),
        vramscope_model::AllocatorConfig::default(),
    );
    let _kept = alloc.alloc(bytes).expect("the simulated device has room");
    for _ in 0..3 {
        alloc.mark_step();
        drop(
            alloc
                .alloc(bytes / 2)
                .expect("the simulated device has room"),
        );
    }
    alloc.snapshot()
}

/// A run on device `index` of a simulated device of 1 GiB that runs out of memory: it keeps
/// 256 MiB, frees what each of three steps allocates, then asks for 2 GiB, which fails (an
/// OOM event at this function's line).
pub fn device_run_with_oom(index: u32) -> vramscope_model::Snapshot {
    let alloc = CachingAllocator::new(
        SimDevice::with_index(1 << 30, false, index),
        vramscope_model::AllocatorConfig::default(),
    );
    let _kept = alloc
        .alloc(256 << 20)
        .expect("the simulated device has room");
    for _ in 0..3 {
        alloc.mark_step();
        drop(
            alloc
                .alloc(64 << 20)
                .expect("the simulated device has room"),
        );
    }
    assert!(alloc.alloc(2 << 30).is_err(), "2 GiB does not fit in 1 GiB");
    alloc.snapshot()
}

/// Three devices in one snapshot, as a 3-GPU dump holds them, of which device 1 ran out of
/// memory ([`device_run_with_oom`]) and devices 0 and 2 ran cleanly ([`device_run`]).
pub fn three_devices_oom_on_1() -> vramscope_model::Snapshot {
    let mut merged = merge_devices(&[
        device_run(0, 64 << 20),
        device_run_with_oom(1),
        device_run(2, 96 << 20),
    ]);
    // Named as PyTorch names a GPU, so that each device's part is named after its index.
    merged.device.name = "cuda:0".to_string();
    merged
}

/// A run that holds 36 MiB and works 1 MiB at a time for 40,000 events, spiking to 134 MiB
/// for one event four times, each spike far narrower than a pixel of a chart (issue 42: a
/// dump spiking four times to 13.4 GiB was drawn as a flat band at 3.7 GiB); returns the
/// trace and the position after each spike's allocation.
pub fn spiky_run() -> (vramscope_model::Snapshot, Vec<u64>) {
    let mut t = Trace::new();
    let (base, work, spike) = (
        t.site("train.py", 1, "setup"),
        t.site("train.py", 2, "step"),
        t.site("train.py", 3, "spike"),
    );
    t.alloc(base, 36 * MIB);
    let mut spikes = Vec::new();
    for i in 0..20_000u64 {
        let a = t.alloc(work, MIB);
        t.free(a, MIB);
        if [5_000, 10_000, 15_000, 17_500].contains(&i) {
            let s = t.alloc(spike, 98 * MIB);
            // The position after the spike's allocation: its events so far.
            spikes.push(t.next_seq());
            t.free(s, 98 * MIB);
        }
    }
    (t.finish(), spikes)
}

/// The runs of several devices in one snapshot, as a multi-GPU snapshot holds them: the first
/// run's header, every run's segments, and their events interleaved by time and numbered
/// again (without step marks, whose numbers belonged to one run each).
pub fn merge_devices(runs: &[vramscope_model::Snapshot]) -> vramscope_model::Snapshot {
    let mut merged = runs.first().cloned().unwrap_or_else(|| {
        vramscope_model::Snapshot::empty(
            vramscope_model::SnapshotSource::Vramscope,
            Default::default(),
        )
    });
    merged.segments = runs
        .iter()
        .flat_map(|r| r.segments.iter().cloned())
        .collect();
    merged.events = runs.iter().flat_map(|r| r.events.iter().copied()).collect();
    merged.events.sort_by_key(|e| (e.time_ns, e.device));
    for (seq, e) in merged.events.iter_mut().enumerate() {
        e.seq = seq as u64;
    }
    merged.steps.clear();
    merged
}

/// A trace that lost frees: a 20 MiB large-pool segment at `0x1000_0000` holding a 4 MiB block,
/// then a segment and a 6 MiB block allocated again at the same address (the frees of both were
/// lost) and the 6 MiB block freed; the dump-time segment list holds the one segment. Every
/// view takes an allocation over a live block or segment as replacing it, so the statistics'
/// peaks are 6 MiB allocated and 20 MiB reserved, not the sums.
pub fn lost_frees() -> (Vec<vramscope_model::Segment>, Vec<vramscope_model::Event>) {
    use vramscope_model::EventKind;
    let mib = 1u64 << 20;
    let at = |kind, size| {
        event(kind)
            .addr(0x1000_0000)
            .size(size)
            .requested(size)
            .build()
    };
    let events = vec![
        at(EventKind::SegmentAlloc, 20 * mib),
        at(EventKind::Alloc, 4 * mib),
        at(EventKind::SegmentAlloc, 20 * mib),
        at(EventKind::Alloc, 6 * mib),
        at(EventKind::FreeRequested, 6 * mib),
        at(EventKind::FreeCompleted, 6 * mib),
    ];
    let segment = vramscope_model::Segment {
        device: 0,
        address: 0x1000_0000,
        total_size: 20 * mib,
        stream: 0,
        pool: vramscope_model::Pool::Large,
        expandable: false,
        blocks: Vec::new(),
    };
    (vec![segment], events)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    /// Run only as the child of the test below, in an environment it sets.
    #[test]
    #[ignore = "run by a_missing_trace_skips_or_fails_as_the_environment_says"]
    fn looks_for_a_trace_that_is_not_there() {
        assert!(shared_trace(Path::new("/nonexistent"), "no-such-trace.pickle").is_none());
    }

    fn child(require: Option<&str>) -> std::process::Output {
        let mut command = Command::new(std::env::current_exe().unwrap());
        command
            .args([
                "--exact",
                "tests::looks_for_a_trace_that_is_not_there",
                "--ignored",
            ])
            .env(TRACES_ENV, "/nonexistent/traces")
            .env_remove(REQUIRE_TRACES_ENV);
        if let Some(value) = require {
            command.env(REQUIRE_TRACES_ENV, value);
        }
        command.output().unwrap()
    }

    #[test]
    fn a_missing_trace_skips_or_fails_as_the_environment_says() {
        for require in [None, Some("0"), Some("")] {
            let output = child(require);
            assert!(output.status.success(), "{require:?}: {output:?}");
            let stderr = String::from_utf8_lossy(&output.stderr);
            assert!(
                stderr.contains(
                    "skipped: shared trace no-such-trace.pickle not found in /nonexistent/traces"
                ),
                "{stderr}"
            );
        }
        let output = child(Some("1"));
        assert!(!output.status.success(), "{output:?}");
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(
            stdout.contains("VRAMSCOPE_REQUIRE_TRACES is set"),
            "{stdout}"
        );
    }
}
