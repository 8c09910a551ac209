//! Measures the telemetry publisher on loopback (a Unix socket and TCP 127.0.0.1): how many
//! events per second one dashboard receives, how many it misses, and the application's own
//! allocation rate with and without a dashboard attached.
//!
//! Two workloads: `burst` allocates and frees as fast as one thread can (far more events than
//! any consumer needs), `paced` produces about 1.5 million events per second.
//!
//! `cargo run --release -p vramscope-tui --example telemetry_throughput [SECONDS]`

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use vramscope_allocator::{CachingAllocator, SimDevice, StreamId, Telemetry};
use vramscope_model::AllocatorConfig;
use vramscope_telemetry::Frame;
use vramscope_telemetry::{TelemetryAddr, TelemetryClient};

/// Allocates and frees for `secs`, at most `per_ms` allocations per millisecond (0: no
/// limit). Returns alloc+free pairs and the time taken.
fn app_loop(alloc: &CachingAllocator<SimDevice>, secs: f64, per_ms: u64) -> (u64, f64) {
    let start = Instant::now();
    let mut pairs = 0u64;
    let mut live = Vec::with_capacity(64);
    while start.elapsed().as_secs_f64() < secs {
        let chunk = if per_ms == 0 { 1024 } else { per_ms };
        for i in 0..chunk {
            let p = alloc
                .alloc_ptr(512 * (1 + (i % 32)), StreamId::DEFAULT)
                .unwrap();
            live.push(p);
            if live.len() >= 32 {
                for p in live.drain(..) {
                    alloc.free_ptr(p).unwrap();
                }
            }
            pairs += 1;
        }
        if let Some(micros) = (pairs * 1000).checked_div(per_ms) {
            if let Some(wait) = Duration::from_micros(micros).checked_sub(start.elapsed()) {
                std::thread::sleep(wait);
            }
        }
    }
    for p in live.drain(..) {
        alloc.free_ptr(p).unwrap();
    }
    (pairs, start.elapsed().as_secs_f64())
}

fn next_seq(alloc: &CachingAllocator<SimDevice>) -> u64 {
    alloc.snapshot().events.last().map_or(0, |e| e.seq + 1)
}

fn run(label: &str, addr: Option<TelemetryAddr>, secs: f64, per_ms: u64) {
    let alloc = CachingAllocator::new(SimDevice::phantom(1 << 40), AllocatorConfig::default());
    let received = Arc::new(AtomicU64::new(0));
    let last_at = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let mut telemetry = None;
    let mut reader = None;
    let start_seq;
    let t0 = Instant::now();
    if let Some(addr) = addr {
        let t = Telemetry::serve(&alloc, &addr).unwrap();
        let mut client = TelemetryClient::connect(t.addr()).unwrap();
        // Attach fully before the clock starts.
        start_seq = loop {
            if let Frame::Snapshot { next_seq, .. } = client.next_frame().unwrap() {
                break next_seq;
            }
        };
        let (r, l, s) = (
            Arc::clone(&received),
            Arc::clone(&last_at),
            Arc::clone(&stop),
        );
        reader = Some(std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                match client.next_frame() {
                    Ok(Frame::Events(e)) => {
                        r.fetch_add(e.len() as u64, Ordering::Relaxed);
                        l.store(t0.elapsed().as_nanos() as u64, Ordering::Relaxed);
                    }
                    Ok(_) => {}
                    Err(_) => return,
                }
            }
        }));
        telemetry = Some(t);
    } else {
        start_seq = next_seq(&alloc);
    }
    let begin = t0.elapsed().as_secs_f64();
    let (pairs, elapsed) = app_loop(&alloc, secs, per_ms);
    let generated = next_seq(&alloc) - start_seq - 1;
    // Let the publisher drain what it can.
    let deadline = Instant::now() + Duration::from_secs(10);
    if let Some(t) = &telemetry {
        while Instant::now() < deadline {
            if received.load(Ordering::Relaxed) + t.stats().events_dropped >= generated {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    let got = received.load(Ordering::Relaxed);
    let span = (last_at.load(Ordering::Relaxed) as f64 / 1e9 - begin).max(elapsed);
    let dropped = telemetry.as_ref().map_or(0, |t| t.stats().events_dropped);
    stop.store(true, Ordering::Relaxed);
    drop(telemetry);
    if let Some(r) = reader {
        let _ = r.join();
    }
    println!(
        "{label:<24} app {:>5.2} M alloc+free/s = {:>5.2} M events/s; dashboard got {:>5.2} M events/s ({got} of {generated}, {dropped} dropped)",
        pairs as f64 / elapsed / 1e6,
        generated as f64 / elapsed / 1e6,
        got as f64 / span / 1e6,
    );
}

fn main() {
    let secs: f64 = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(3.0);
    let dir = std::env::temp_dir().join(format!("vramscope-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let paced: Vec<u64> = std::env::args()
        .skip(2)
        .filter_map(|s| s.parse().ok())
        .collect();
    let mut modes = vec![("burst".to_string(), 0u64)];
    for per_ms in if paced.is_empty() { vec![500] } else { paced } {
        modes.push((format!("{:.1}M/s", per_ms as f64 * 3.0 / 1000.0), per_ms));
    }
    for (mode, per_ms) in modes {
        run(&format!("{mode}, no dashboard"), None, secs, per_ms);
        let unix = TelemetryAddr::Unix(dir.join(format!("{mode}.sock")));
        run(&format!("{mode}, unix socket"), Some(unix), secs, per_ms);
        let tcp = TelemetryAddr::parse("tcp:127.0.0.1:0").unwrap();
        run(&format!("{mode}, tcp 127.0.0.1"), Some(tcp), secs, per_ms);
    }
    let _ = std::fs::remove_dir_all(dir);
}
