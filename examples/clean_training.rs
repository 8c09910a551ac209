//! The fixed training loop: activations freed inside the step, the loss read back once per
//! step as a host number, the cache left alone. No detector should flag it.
//!
//! Runs on the backed simulated device and writes a snapshot.
//! Usage: `cargo run --example clean_training [-- SNAPSHOT.json]`.

use std::error::Error;

use vramscope::{AllocatorConfig, CachingAllocator, SimDevice};

const MIB: u64 = 1 << 20;

fn main() -> Result<(), Box<dyn Error>> {
    let out = std::env::args().nth(1).unwrap_or_else(|| {
        std::env::temp_dir()
            .join("clean_training.json")
            .display()
            .to_string()
    });
    let alloc = CachingAllocator::new(SimDevice::backed(2 << 30), AllocatorConfig::default());
    let _weights = alloc.tagged("weights").alloc(64 * MIB)?;
    let _optimizer_state = alloc.tagged("adam").alloc(128 * MIB)?;
    let mut losses = Vec::new();
    for _ in 0..30 {
        alloc.mark_step();
        let activations = alloc.alloc(48 * MIB)?;
        let mut loss = alloc.alloc(4)?;
        loss.copy_from_host(&1.5f32.to_le_bytes())?;
        let gradients = alloc.alloc(64 * MIB)?;
        let mut host = [0u8; 4];
        loss.copy_to_host(&mut host)?; // One read per step: a host number, not a device buffer.
        losses.push(f32::from_le_bytes(host));
        drop(gradients);
        drop(activations);
    }
    let snapshot = alloc.snapshot();
    snapshot.save(&out)?;
    println!(
        "{} losses kept on the host; snapshot written to {out}",
        losses.len()
    );
    Ok(())
}
