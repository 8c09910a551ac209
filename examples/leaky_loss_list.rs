//! The classic leak: every step's loss buffer is kept in a list (`losses.append(loss)` in
//! PyTorch), so device memory grows by one block per step until the run dies of OOM.
//!
//! Runs on the simulated device and writes a snapshot; `vramscope report PATH` names the line.
//! Usage: `cargo run --example leaky_loss_list [-- SNAPSHOT.json]`.

use std::error::Error;

use vramscope::{AllocatorConfig, CachingAllocator, SimDevice};

const MIB: u64 = 1 << 20;

fn main() -> Result<(), Box<dyn Error>> {
    let out = std::env::args().nth(1).unwrap_or_else(|| {
        std::env::temp_dir()
            .join("leaky_loss_list.json")
            .display()
            .to_string()
    });
    let alloc = CachingAllocator::new(SimDevice::phantom(16 << 30), AllocatorConfig::default());
    let _weights = alloc.tagged("weights").alloc(256 * MIB)?;
    let _optimizer_state = alloc.tagged("adam").alloc(512 * MIB)?;
    let mut losses = Vec::new();
    for _ in 0..30 {
        alloc.mark_step();
        let activations = alloc.alloc(96 * MIB)?;
        let hidden = alloc.alloc(24 * MIB)?;
        let loss = alloc.alloc(4 * MIB)?; // BUG: retained_per_step (kept below, every step)
        let gradients = alloc.alloc(256 * MIB)?;
        losses.push(loss);
        drop(hidden);
        drop(activations);
        drop(gradients);
    }
    let snapshot = alloc.snapshot();
    snapshot.save(&out)?;
    println!(
        "{} steps, {} losses kept; snapshot written to {out}",
        alloc.step(),
        losses.len()
    );
    Ok(())
}
