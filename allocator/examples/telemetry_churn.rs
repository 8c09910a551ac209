//! What hostile dashboards cost a program: allocation latency and memory while clients churn.
//!
//! A program allocates and frees in a loop with the telemetry publisher on, while 100 client
//! threads connect, read the hello and disconnect as fast as they can, and 16 clients connect
//! and never read. The program's per-pair latency (p50, p99, p99.9, max) and its resident
//! memory growth are printed next to the same loop with no client at all, in the same run.
//! Run: `cargo run --release -p vramscope-allocator --example telemetry_churn [PAIRS]`.

use std::io::Read;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use vramscope_allocator::{CachingAllocator, SimDevice};
use vramscope_allocator::{ServeOptions, Telemetry};
use vramscope_model::AllocatorConfig;
use vramscope_telemetry::TelemetryAddr;

/// Resident memory of this process in bytes, from `/proc/self/status`.
fn rss() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<u64>().ok())
        })
        .unwrap_or(0)
        * 1024
}

/// Latency percentiles of `pairs` alloc+free pairs, in nanoseconds.
fn measure(alloc: &CachingAllocator<SimDevice>, pairs: usize) -> Vec<u64> {
    let mut times = Vec::with_capacity(pairs);
    for i in 0..pairs {
        let started = Instant::now();
        let buffer = alloc.alloc(512 + (i as u64 % 64) * 512).unwrap();
        drop(buffer);
        times.push(started.elapsed().as_nanos() as u64);
    }
    times.sort_unstable();
    times
}

fn percentile(sorted: &[u64], p: f64) -> u64 {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

fn report(label: &str, sorted: &[u64]) {
    println!(
        "{label:<28} p50 {:>7} ns  p99 {:>7} ns  p99.9 {:>8} ns  max {:>9} ns",
        percentile(sorted, 0.50),
        percentile(sorted, 0.99),
        percentile(sorted, 0.999),
        sorted[sorted.len() - 1]
    );
}

fn main() {
    let pairs: usize = std::env::args()
        .nth(1)
        .and_then(|n| n.parse().ok())
        .unwrap_or(2_000_000);
    let alloc = CachingAllocator::new(SimDevice::phantom(1 << 36), AllocatorConfig::default());
    // A history, so that every snapshot has something to convert.
    for i in 0..200_000u64 {
        drop(alloc.alloc(512 + (i % 64) * 512).unwrap());
    }
    report("no publisher", &measure(&alloc, pairs));

    let dir = std::env::temp_dir().join(format!("vramscope-churn-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("churn.sock");
    let mut options = ServeOptions::default();
    options.max_clients = 200;
    let bound = options.client_queue_bytes as u64;
    let telemetry =
        Telemetry::serve_with(&alloc, &TelemetryAddr::Unix(path.clone()), options).unwrap();
    let before = rss();
    let stop = Arc::new(AtomicBool::new(false));
    let connects = Arc::new(AtomicU64::new(0));
    let idle: Vec<UnixStream> = (0..16)
        .map(|_| UnixStream::connect(&path).unwrap())
        .collect();
    let churners: Vec<_> = (0..100)
        .map(|_| {
            let (stop, connects, path) = (Arc::clone(&stop), Arc::clone(&connects), path.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    if let Ok(mut conn) = UnixStream::connect(&path) {
                        let _ = conn.set_read_timeout(Some(Duration::from_millis(50)));
                        let mut header = [0u8; 8];
                        let _ = conn.read(&mut header);
                        connects.fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(500));
    let started = Instant::now();
    let times = measure(&alloc, pairs);
    let seconds = started.elapsed().as_secs_f64();
    report("100 churning + 16 idle", &times);
    let grown = rss().saturating_sub(before);
    stop.store(true, Ordering::Relaxed);
    for thread in churners {
        let _ = thread.join();
    }
    let stats = telemetry.stats();
    println!(
        "{} connects in {seconds:.1} s; snapshots taken {}; refused {}; queued now {} bytes",
        connects.load(Ordering::Relaxed),
        stats.snapshots,
        stats.clients_refused,
        stats.queued_bytes
    );
    println!(
        "resident memory grew {} MiB while they ran; the bound allows 16 idle clients x {} MiB = {} MiB",
        grown >> 20,
        bound >> 20,
        (16 * bound) >> 20
    );
    drop(idle);
    telemetry.shutdown();
    let _ = std::fs::remove_dir_all(dir);
}
