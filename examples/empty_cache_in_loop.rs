//! `empty_cache()` called every step: the cache is thrown away and every step pays for fresh
//! `cudaMalloc`/`cudaFree` calls, which also synchronize the device.
//!
//! Runs on the simulated device and writes a snapshot; `vramscope report PATH` names the line.
//! Usage: `cargo run --example empty_cache_in_loop [-- SNAPSHOT.json]`.

use std::error::Error;

use vramscope::{AllocatorConfig, CachingAllocator, SimDevice};

const MIB: u64 = 1 << 20;

fn main() -> Result<(), Box<dyn Error>> {
    let out = std::env::args().nth(1).unwrap_or_else(|| {
        std::env::temp_dir()
            .join("empty_cache_in_loop.json")
            .display()
            .to_string()
    });
    let alloc = CachingAllocator::new(SimDevice::phantom(16 << 30), AllocatorConfig::default());
    let _weights = alloc.tagged("weights").alloc(128 * MIB)?;
    for _ in 0..20 {
        alloc.mark_step();
        let activations = alloc.alloc(200 * MIB)?;
        let workspace = alloc.alloc(64 * MIB)?;
        drop(workspace);
        drop(activations);
        alloc.empty_cache(); // BUG: cache_churn (the cache is released every step)
    }
    let snapshot = alloc.snapshot();
    snapshot.save(&out)?;
    println!(
        "{} raw device allocations; snapshot written to {out}",
        alloc.stats().num_device_alloc
    );
    Ok(())
}
