//! The dashboard's memory on traces of allocations never freed (issue 33: a model with many
//! small tensors), for BENCHMARKS.md.
//!
//! `load N` builds a snapshot of one segment and `N` allocations of 512 bytes that stay live,
//! and opens it as `view` does (`Dataset::new`); `append N` starts from an empty dataset and
//! takes the same events in batches of 8,192, as `top` does from a live program. Either way it
//! then jumps the cursor to ten positions, and prints the time taken and the peak resident
//! memory of the process (run each case in a process of its own). Run it with
//! `cargo run --release -p vramscope-tui --example live_blocks_bench -- load 1000000`.

use std::time::Instant;

use vramscope_engine::MemoryState;
use vramscope_model::{DeviceInfo, Event, EventKind, Snapshot, SnapshotSource};
use vramscope_tui::data::{Dataset, Origin};

/// Peak resident memory of this process so far, in MiB.
fn peak_rss_mib() -> f64 {
    // SAFETY: `usage` is a valid, writable rusage for the call to fill in.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: as above; RUSAGE_SELF names this process.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) };
    usage.ru_maxrss as f64 / 1024.0
}

/// One segment, then `n` allocations of 512 bytes in it, none freed.
fn events(n: usize) -> Vec<Event> {
    let base = 0x10_0000_0000u64;
    let mut out = Vec::with_capacity(n + 1);
    out.push(
        vramscope_testkit::event(EventKind::SegmentAlloc)
            .addr(base)
            .size(512 * n as u64)
            .seq(0)
            .build(),
    );
    for i in 0..n as u64 {
        out.push(
            vramscope_testkit::event(EventKind::Alloc)
                .addr(base + 512 * i)
                .size(512)
                .seq(i + 1)
                .build(),
        );
    }
    out
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mode = args.first().map_or("load", String::as_str).to_string();
    let n: usize = args
        .get(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(1_000_000);
    let events = events(n);
    let device = DeviceInfo {
        name: "synthetic".to_string(),
        backend: "sim".to_string(),
        capacity: 80 << 30,
        ..DeviceInfo::default()
    };
    let before = peak_rss_mib();
    let started = Instant::now();
    let mut data = match mode.as_str() {
        "append" => {
            let empty = Snapshot::empty(SnapshotSource::Vramscope, device);
            let mut data = Dataset::new(empty, Origin::Live("bench".into()));
            data.max_events = usize::MAX / 2;
            for batch in events.chunks(8192) {
                data.append(batch);
            }
            drop(events);
            data
        }
        _ => {
            let mut snapshot = Snapshot::empty(SnapshotSource::Vramscope, device);
            let mut end = MemoryState::default();
            for (i, e) in events.iter().enumerate() {
                end.apply(e, i as u32);
            }
            snapshot.segments = end.to_segments();
            drop(end);
            for e in &events {
                snapshot.events.push(*e);
            }
            drop(events);
            Dataset::new(snapshot, Origin::File("bench".into()))
        }
    };
    let built = started.elapsed();
    let jumps = Instant::now();
    for k in [7, 2, 9, 0, 5, 3, 8, 1, 6, 4] {
        let pos = data.len() * k / 10;
        let state = data.state_at(pos);
        assert_eq!(state.usage(), data.usage_at(pos));
    }
    println!(
        "{mode} {n} live blocks: {:.2} s, peak RSS {:.0} MiB (events alone {:.0} MiB, {:.0} MiB before), ten cursor jumps {:.2} s",
        built.as_secs_f64(),
        peak_rss_mib(),
        (n * std::mem::size_of::<Event>()) as f64 / (1 << 20) as f64,
        before,
        jumps.elapsed().as_secs_f64()
    );
}
