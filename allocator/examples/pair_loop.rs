//! A fixed loop of cached alloc+free pairs, for instruction-count profiling of the fast path
//! (`valgrind --tool=callgrind target/release/examples/pair_loop [off|raw|events] [N]`).

use vramscope_allocator::{CachingAllocator, SimDevice};
use vramscope_model::AllocatorConfig;

fn main() {
    let mut args = std::env::args().skip(1);
    let mode = args.next().unwrap_or_else(|| "off".to_string());
    let pairs: u64 = args
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or(1_000_000);
    let config = match mode.as_str() {
        "off" | "raw" => AllocatorConfig::default().untracked(),
        _ => AllocatorConfig::default(),
    };
    let alloc = CachingAllocator::new(SimDevice::phantom(1 << 40), config);
    drop(alloc.alloc(4096).unwrap());
    let start = std::time::Instant::now();
    if mode == "raw" {
        for _ in 0..pairs {
            let ptr = alloc
                .alloc_ptr(
                    std::hint::black_box(4096),
                    vramscope_allocator::StreamId::DEFAULT,
                )
                .unwrap();
            alloc.free_ptr(std::hint::black_box(ptr)).unwrap();
        }
    } else {
        for _ in 0..pairs {
            let buffer = alloc.alloc(std::hint::black_box(4096)).unwrap();
            drop(std::hint::black_box(buffer));
        }
    }
    let elapsed = start.elapsed();
    println!(
        "{mode}: {pairs} pairs, {:.1} ns per pair",
        elapsed.as_nanos() as f64 / pairs as f64
    );
}
