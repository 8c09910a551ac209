//! A device-to-host copy of one element inside the inner loop of every step (`loss.item()` or
//! `print(t[0, 0])` per batch element in PyTorch): each copy is a sync that stalls the GPU.
//!
//! Runs on the backed simulated device and writes a snapshot; `vramscope report PATH` names the
//! line. Usage: `cargo run --example item_in_hot_loop [-- SNAPSHOT.json]`.

use std::error::Error;

use vramscope::{AllocatorConfig, CachingAllocator, SimDevice};

fn main() -> Result<(), Box<dyn Error>> {
    let out = std::env::args().nth(1).unwrap_or_else(|| {
        std::env::temp_dir()
            .join("item_in_hot_loop.json")
            .display()
            .to_string()
    });
    let alloc = CachingAllocator::new(SimDevice::backed(1 << 30), AllocatorConfig::default());
    let mut total = 0.0f32;
    for _ in 0..10 {
        alloc.mark_step();
        let mut logits = alloc.alloc(64 * 1024)?;
        logits.copy_from_host(&[0u8; 4096])?;
        for _ in 0..50 {
            let mut element = [0u8; 4];
            logits.copy_to_host(&mut element)?; // BUG: sync_in_loop (one element copied per iteration)
            total += f32::from_le_bytes(element);
        }
    }
    let snapshot = alloc.snapshot();
    snapshot.save(&out)?;
    println!("sum {total}; snapshot written to {out}");
    Ok(())
}
