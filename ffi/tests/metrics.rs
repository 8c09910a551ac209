//! The C library's Prometheus `/metrics` endpoint (`VRAMSCOPE_METRICS`), loaded as PyTorch
//! loads it: the first allocation starts the server on the port the system picks,
//! `vramscope_metrics_addr` says where, a scrape over HTTP serves the figures that
//! `vramscope_stats_json` gives for the same moment, and the text passes Prometheus's own
//! linter (`promtool check metrics`; skipped with a notice where promtool is absent).
//!
//! A test binary of its own: the variable is read when the library opens its first device,
//! once per process.

mod common;

use common::library_path;
use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_void, CStr};

use libloading::{Library, Symbol};
use vramscope_testkit::{check_with_promtool, http_get};

type Malloc = unsafe extern "C" fn(isize, c_int, *mut c_void) -> *mut c_void;
type Free = unsafe extern "C" fn(*mut c_void, isize, c_int, *mut c_void);
type WriteText = unsafe extern "C" fn(*mut c_char, usize) -> isize;

/// What `write` puts in a buffer, or `None` when it returns -1.
fn text_of(write: &Symbol<WriteText>) -> Option<String> {
    let mut buf = vec![0 as c_char; 1 << 16];
    // SAFETY: `buf` holds `buf.len()` writable bytes, as the entry point's contract asks.
    let len = unsafe { write(buf.as_mut_ptr(), buf.len()) };
    if len < 0 {
        return None;
    }
    assert!((len as usize) < buf.len(), "{len} bytes do not fit");
    // SAFETY: the entry point wrote a NUL-terminated string into `buf`.
    Some(
        unsafe { CStr::from_ptr(buf.as_ptr()) }
            .to_str()
            .unwrap()
            .to_string(),
    )
}

/// The statistics of `/metrics` (the first part of their names, their unit) and the
/// statistics of `vramscope_stats_json` they carry.
const FAMILIES: [(&str, &str, &str); 9] = [
    ("allocated", "bytes", "allocated_bytes"),
    ("reserved", "bytes", "reserved_bytes"),
    ("active", "bytes", "active_bytes"),
    ("inactive_split", "bytes", "inactive_split_bytes"),
    ("requested", "bytes", "requested_bytes"),
    ("allocated", "blocks", "allocation"),
    ("active", "blocks", "active"),
    ("reserved", "segments", "segment"),
    ("inactive_split", "blocks", "inactive_split"),
];

/// The counters of `/metrics` and the statistics they carry.
const COUNTERS: [(&str, &str); 4] = [
    ("vramscope_alloc_retries_total", "num_alloc_retries"),
    ("vramscope_ooms_total", "num_ooms"),
    ("vramscope_device_allocs_total", "num_device_alloc"),
    ("vramscope_device_frees_total", "num_device_free"),
];

/// The series of the bytes allocated on device 0 now, in the large and the small pool.
const ALLOCATED: [&str; 2] = [
    "vramscope_allocated_bytes{device=\"0\",pool=\"large\"}",
    "vramscope_allocated_bytes{device=\"0\",pool=\"small\"}",
];

/// The bytes allocated on device 0 in `text`: the pools' sum.
fn allocated(text: &str) -> Option<u64> {
    let served = samples(text);
    Some(served.get(ALLOCATED[0])? + served.get(ALLOCATED[1])?)
}

/// The samples of a Prometheus text page, by series (`name{labels}`), as whole numbers.
fn samples(text: &str) -> HashMap<&str, u64> {
    text.lines()
        .filter(|line| !line.starts_with('#'))
        .filter_map(|line| line.rsplit_once(' '))
        .filter_map(|(series, value)| Some((series, value.parse::<f64>().ok()? as u64)))
        .collect()
}

#[test]
fn the_c_library_serves_its_statistics_on_metrics() {
    std::env::set_var("VRAMSCOPE_BACKEND", "sim");
    std::env::set_var("VRAMSCOPE_METRICS", "127.0.0.1:0");
    // SAFETY: the library is this workspace's own cdylib.
    let lib = unsafe { Library::new(library_path()) }.expect("the C library loads");
    // SAFETY: each symbol is looked up with the signature it is defined with in src/lib.rs and
    // called with valid arguments.
    unsafe {
        let malloc: Symbol<Malloc> = lib.get(b"vramscope_malloc").unwrap();
        let free: Symbol<Free> = lib.get(b"vramscope_free").unwrap();
        let stats: Symbol<WriteText> = lib.get(b"vramscope_stats_json").unwrap();
        let metrics_addr: Symbol<WriteText> = lib.get(b"vramscope_metrics_addr").unwrap();
        assert_eq!(
            text_of(&metrics_addr),
            None,
            "no server before a device opens"
        );

        let kept = [
            malloc(100 << 20, 0, std::ptr::null_mut()),
            malloc(4096, 0, std::ptr::null_mut()),
        ];
        assert!(kept.iter().all(|p| !p.is_null()));
        free(
            malloc(8 << 20, 0, std::ptr::null_mut()),
            8 << 20,
            0,
            std::ptr::null_mut(),
        );

        let addr = text_of(&metrics_addr).expect("the first device started the server");
        assert!(
            addr.starts_with("127.0.0.1:") && !addr.ends_with(":0"),
            "{addr}"
        );
        let (status, _, body) = http_get(&addr, "/metrics");
        assert!(status.contains("200"), "{status}");
        let served = samples(&body);
        let own: serde_json::Value = serde_json::from_str(&text_of(&stats).unwrap()).unwrap();
        let own = &own["0"];
        for (base, unit, figure) in FAMILIES {
            for (pool, field) in [("large", "large_pool"), ("small", "small_pool")] {
                for (name, stat) in [
                    (format!("vramscope_{base}_{unit}"), "current"),
                    (format!("vramscope_{base}_added_{unit}_total"), "allocated"),
                    (format!("vramscope_{base}_removed_{unit}_total"), "freed"),
                ] {
                    let series = format!("{name}{{device=\"0\",pool=\"{pool}\"}}");
                    assert_eq!(
                        served.get(series.as_str()).copied(),
                        own[figure][field][stat].as_u64(),
                        "{series}\n{body}"
                    );
                }
            }
            let series = format!("vramscope_{base}_peak_{unit}{{device=\"0\"}}");
            assert_eq!(
                served.get(series.as_str()).copied(),
                own[figure]["all"]["peak"].as_u64(),
                "{series}\n{body}"
            );
        }
        for (counter, figure) in COUNTERS {
            let series = format!("{counter}{{device=\"0\"}}");
            assert_eq!(
                served.get(series.as_str()).copied(),
                own[figure].as_u64(),
                "{series}\n{body}"
            );
        }
        assert_eq!(allocated(&body), Some((100 << 20) + 4096));
        check_with_promtool(&body);

        for (ptr, size) in kept.into_iter().zip([100 << 20, 4096]) {
            free(ptr, size, 0, std::ptr::null_mut());
        }
        let (_, _, after) = http_get(&addr, "/metrics");
        assert_eq!(
            allocated(&after),
            Some(0),
            "each scrape reads the figures then"
        );
    }
}
