//! The C ABI, loaded as PyTorch loads it: the built shared library opened with `dlopen` and its
//! symbols called, on the simulated backend (`VRAMSCOPE_BACKEND=sim`).

mod common;

use common::library_path;
use std::ffi::{c_char, c_int, c_void, CString};
use std::path::{Path, PathBuf};

use libloading::{Library, Symbol};

type Malloc = unsafe extern "C" fn(isize, c_int, *mut c_void) -> *mut c_void;
type Free = unsafe extern "C" fn(*mut c_void, isize, c_int, *mut c_void);
type Counter = unsafe extern "C" fn() -> u64;
type WriteJson = unsafe extern "C" fn(*mut c_char, usize) -> isize;
type Snapshot = unsafe extern "C" fn(*const c_char) -> c_int;

/// The Unix socket the library publishes live telemetry on in these tests.
fn telemetry_socket() -> PathBuf {
    std::env::temp_dir().join(format!("vramscope-ffi-{}.sock", std::process::id()))
}

fn load() -> Library {
    // SAFETY: the library is this workspace's own cdylib.
    unsafe { Library::new(library_path()) }.expect("the C library loads")
}

fn allocates_frees_and_reports_misuse_without_aborting() {
    let lib = load();
    // SAFETY: each symbol is looked up with the signature it is defined with in src/lib.rs, and
    // called with valid arguments or with the misuse the test is about.
    unsafe {
        let malloc: Symbol<Malloc> = lib.get(b"vramscope_malloc").unwrap();
        let free: Symbol<Free> = lib.get(b"vramscope_free").unwrap();
        let errors: Symbol<Counter> = lib.get(b"vramscope_error_count").unwrap();
        let stats: Symbol<WriteJson> = lib.get(b"vramscope_stats_json").unwrap();
        let empty_cache: Symbol<Counter> = lib.get(b"vramscope_empty_cache").unwrap();
        let stream = std::ptr::null_mut();

        let a = malloc(4096, 0, stream);
        let b = malloc(3 << 20, 0, stream);
        assert!(!a.is_null() && !b.is_null());
        assert_eq!(a as usize % 512, 0);

        let mut buf = vec![0 as c_char; 1 << 16];
        let len = stats(buf.as_mut_ptr(), buf.len());
        assert!(len > 0 && (len as usize) < buf.len());
        let text = std::ffi::CStr::from_ptr(buf.as_ptr()).to_str().unwrap();
        let value: serde_json::Value = serde_json::from_str(text).unwrap();
        let live = value["0"]["allocation"]["all"]["current"].as_u64().unwrap();
        assert_eq!(live, 2, "two live blocks: {text}");
        // Too small a buffer: nothing written, the needed length returned.
        let mut tiny = [0 as c_char; 4];
        assert_eq!(stats(tiny.as_mut_ptr(), tiny.len()), len);

        let before = errors();
        free(a, 4096, 0, stream);
        free(a, 4096, 0, stream); // double free: counted, not fatal
        free(0x1234_5000 as *mut c_void, 1, 0, stream); // unknown pointer
        assert!(malloc(-5, 0, stream).is_null()); // negative size
        assert!(malloc(16, -1, stream).is_null()); // bad device
        assert_eq!(errors() - before, 4);

        free(b, 3 << 20, 0, stream);
        assert!(empty_cache() > 0);
    }
}

fn writes_a_snapshot_on_request() {
    let lib = load();
    let path = std::env::temp_dir().join(format!("vramscope-ffi-snap-{}.json", std::process::id()));
    let c_path = CString::new(path.to_str().unwrap()).unwrap();
    // SAFETY: as above.
    unsafe {
        let malloc: Symbol<Malloc> = lib.get(b"vramscope_malloc").unwrap();
        let snapshot: Symbol<Snapshot> = lib.get(b"vramscope_snapshot").unwrap();
        let free: Symbol<Free> = lib.get(b"vramscope_free").unwrap();
        let block = malloc(1000, 0, std::ptr::null_mut());
        assert!(!block.is_null());
        assert_eq!(snapshot(c_path.as_ptr()), 0);
        free(block, 1000, 0, std::ptr::null_mut());
        assert_eq!(snapshot(std::ptr::null()), -1);
    }
    let snap = vramscope_allocator_snapshot(&path);
    assert!(snap["segments"].as_array().is_some_and(|s| !s.is_empty()));
    std::fs::remove_file(path).ok();
}

fn scopes_opened_through_the_abi_name_the_allocations() {
    type PushScope = unsafe extern "C" fn(c_int, *const c_char) -> c_int;
    type PopScope = unsafe extern "C" fn() -> c_int;
    let lib = load();
    let path =
        std::env::temp_dir().join(format!("vramscope-ffi-scopes-{}.json", std::process::id()));
    let c_path = CString::new(path.to_str().unwrap()).unwrap();
    let model = CString::new("model").unwrap();
    let layer = CString::new("layer1").unwrap();
    let mut sizes_and_blocks = Vec::new();
    // SAFETY: each symbol is looked up with the signature it is defined with in src/lib.rs;
    // names are NUL-terminated or, where misuse is the point, null.
    unsafe {
        let malloc: Symbol<Malloc> = lib.get(b"vramscope_malloc").unwrap();
        let free: Symbol<Free> = lib.get(b"vramscope_free").unwrap();
        let push: Symbol<PushScope> = lib.get(b"vramscope_push_scope").unwrap();
        let pop: Symbol<PopScope> = lib.get(b"vramscope_pop_scope").unwrap();
        let errors: Symbol<Counter> = lib.get(b"vramscope_error_count").unwrap();
        let snapshot: Symbol<Snapshot> = lib.get(b"vramscope_snapshot").unwrap();
        assert_eq!(push(0, model.as_ptr()), 0);
        sizes_and_blocks.push((7001, malloc(7001, 0, std::ptr::null_mut())));
        assert_eq!(push(0, layer.as_ptr()), 0);
        sizes_and_blocks.push((7002, malloc(7002, 0, std::ptr::null_mut())));
        assert_eq!(pop(), 0);
        assert_eq!(pop(), 0);
        sizes_and_blocks.push((7003, malloc(7003, 0, std::ptr::null_mut())));
        let before = errors();
        assert_eq!(pop(), -1, "no scope is open");
        assert_eq!(push(0, std::ptr::null()), -1, "a null name");
        assert_eq!(errors(), before + 2);
        assert_eq!(snapshot(c_path.as_ptr()), 0);
        for &(size, block) in &sizes_and_blocks {
            assert!(!block.is_null());
            free(block, size as isize, 0, std::ptr::null_mut());
        }
    }
    let snap = vramscope_allocator_snapshot(&path);
    let scope_of = |requested: u64| {
        let block = snap["segments"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|s| s["blocks"].as_array().unwrap())
            .find(|b| b["requested_size"] == requested)
            .unwrap_or_else(|| panic!("no block of {requested} bytes"));
        block["scope"]
            .as_u64()
            .map(|id| snap["scopes"][id as usize].as_str().unwrap().to_string())
    };
    assert_eq!(scope_of(7001).as_deref(), Some("model"));
    assert_eq!(scope_of(7002).as_deref(), Some("model/layer1"));
    assert_eq!(scope_of(7003), None);
    std::fs::remove_file(path).ok();
}

/// The resident memory of this process, in bytes (Linux's `/proc/self/status`).
fn resident_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

fn thirty_thousand_scopes_never_closed_are_refused_past_the_cap_and_the_host_lives_on() {
    type PushScope = unsafe extern "C" fn(c_int, *const c_char) -> c_int;
    type PopScope = unsafe extern "C" fn() -> c_int;
    let lib = load();
    let pushes = 30_000;
    let cap = 1024;
    let name = CString::new("training_loop_iteration").unwrap();
    // SAFETY: each symbol is looked up with the signature it is defined with in src/lib.rs;
    // the name is NUL-terminated.
    unsafe {
        let malloc: Symbol<Malloc> = lib.get(b"vramscope_malloc").unwrap();
        let free: Symbol<Free> = lib.get(b"vramscope_free").unwrap();
        let push: Symbol<PushScope> = lib.get(b"vramscope_push_scope").unwrap();
        let pop: Symbol<PopScope> = lib.get(b"vramscope_pop_scope").unwrap();
        let errors: Symbol<Counter> = lib.get(b"vramscope_error_count").unwrap();
        let refused: Symbol<Counter> = lib.get(b"vramscope_scopes_refused").unwrap();
        // The device's allocator exists before the memory is measured.
        free(
            malloc(512, 0, std::ptr::null_mut()),
            512,
            0,
            std::ptr::null_mut(),
        );
        let errors_before = errors();
        let refused_before = refused();
        let resident_before = resident_bytes();
        let opened = (0..pushes).filter(|_| push(0, name.as_ptr()) == 0).count();
        let resident_after = resident_bytes();
        assert_eq!(opened, cap, "scopes nest at most {cap} levels");
        assert_eq!(refused() - refused_before, (pushes - cap) as u64);
        assert_eq!(errors() - errors_before, (pushes - cap) as u64);
        if let (Some(before), Some(after)) = (resident_before, resident_after) {
            // Quadratic paths took 830 MB at 10,000 levels; the table is a few dozen bytes a
            // level (and each refusal nothing).
            assert!(
                after.saturating_sub(before) < 32 << 20,
                "{} bytes more resident after {pushes} pushes",
                after.saturating_sub(before)
            );
        }
        // The host lives on: it allocates inside the deepest scope, and closes every scope
        // that was opened, and no more.
        let block = malloc(4096, 0, std::ptr::null_mut());
        assert!(!block.is_null());
        free(block, 4096, 0, std::ptr::null_mut());
        for _ in 0..cap {
            assert_eq!(pop(), 0);
        }
        assert_eq!(pop(), -1, "only the scopes opened were open");
        assert_eq!(push(0, name.as_ptr()), 0, "scopes open again at the top");
        assert_eq!(pop(), 0);
    }
}

fn publishes_live_telemetry_when_asked() {
    use vramscope_telemetry::{Frame, TelemetryAddr, TelemetryClient};
    let lib = load();
    // SAFETY: as above.
    let block = unsafe {
        let malloc: Symbol<Malloc> = lib.get(b"vramscope_malloc").unwrap();
        malloc(2048, 0, std::ptr::null_mut())
    };
    assert!(!block.is_null());
    let addr = TelemetryAddr::Unix(telemetry_socket());
    let mut client = TelemetryClient::connect(&addr).expect("the library listens");
    client
        .set_read_timeout(Some(std::time::Duration::from_secs(5)))
        .unwrap();
    match client.next_frame().unwrap() {
        Frame::Hello(hello) => assert_eq!(hello.pid, std::process::id()),
        other => panic!("expected a hello frame first, got {other:?}"),
    }
    // SAFETY: as above.
    unsafe {
        let free: Symbol<Free> = lib.get(b"vramscope_free").unwrap();
        free(block, 2048, 0, std::ptr::null_mut());
    }
}

/// The snapshot the library wrote at `path`, as JSON.
fn vramscope_allocator_snapshot(path: &Path) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

/// The cases above, in turn, in one test: the library's allocators are process-wide and read
/// their settings from the environment when the library loads, and setting a variable while
/// another test thread reads the environment is undefined behaviour, so this binary holds one
/// test, which sets the environment once before anything reads it. (The snapshot written at a
/// host's exit runs in a child process, in `c_abi_exit.rs`.)
#[test]
fn the_c_abi_in_one_process() {
    std::env::set_var("VRAMSCOPE_BACKEND", "sim");
    std::env::set_var(
        "VRAMSCOPE_LISTEN",
        format!("unix:{}", telemetry_socket().display()),
    );
    let cases: [(&str, fn()); 5] = [
        (
            "allocates_frees_and_reports_misuse_without_aborting",
            allocates_frees_and_reports_misuse_without_aborting,
        ),
        ("writes_a_snapshot_on_request", writes_a_snapshot_on_request),
        (
            "scopes_opened_through_the_abi_name_the_allocations",
            scopes_opened_through_the_abi_name_the_allocations,
        ),
        (
            "thirty_thousand_scopes_never_closed_are_refused_past_the_cap_and_the_host_lives_on",
            thirty_thousand_scopes_never_closed_are_refused_past_the_cap_and_the_host_lives_on,
        ),
        (
            "publishes_live_telemetry_when_asked",
            publishes_live_telemetry_when_asked,
        ),
    ];
    for (name, case) in cases {
        println!("case {name}");
        case();
    }
}
