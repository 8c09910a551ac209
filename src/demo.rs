//! The built-in demo workload: a simulated training loop with bugs planted on request.
//!
//! `vramscope demo` runs it on a backed simulated device through the caching allocator: with
//! `--headless` (or without a terminal) all at once, then hands the snapshot to the inspector's
//! report; otherwise step by step beside the dashboard of `vramscope-tui`, which pulls the
//! allocator's events in the same process and paces the loop. Each planted bug sits on its own
//! line so the report and the dashboard can point at it.

use std::str::FromStr;

use vramscope::allocator::{AllocError, AllocatorConfig, CachingAllocator, SimDevice, Snapshot};

const MIB: u64 = 1 << 20;

/// The bugs the demo can plant.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Bugs {
    /// Keep every step's loss buffer (`losses.append(loss)`).
    pub retained_loss: bool,
    /// Copy one element to the host per inner iteration (`.item()` in a hot loop).
    pub item_in_loop: bool,
}

impl FromStr for Bugs {
    type Err = String;

    fn from_str(text: &str) -> Result<Bugs, String> {
        let mut bugs = Bugs::default();
        for name in text.split(',').map(str::trim).filter(|n| !n.is_empty()) {
            match name {
                "none" => {}
                "retained-loss" => bugs.retained_loss = true,
                "item-in-loop" => bugs.item_in_loop = true,
                other => {
                    return Err(format!(
                        "unknown bug `{other}` (expected retained-loss, item-in-loop or none)"
                    ))
                }
            }
        }
        Ok(bugs)
    }
}

/// The demo's allocator: a backed simulated device of 4 GiB.
pub fn allocator() -> CachingAllocator<SimDevice> {
    CachingAllocator::new(SimDevice::backed(4 << 30), AllocatorConfig::default())
}

/// Runs `steps` training steps with `bugs` planted and returns the allocator's snapshot.
pub fn run(steps: u64, bugs: Bugs) -> Result<Snapshot, AllocError> {
    let alloc = allocator();
    // The snapshot is taken at the end of the loop, while the kept buffers are alive.
    let mut snapshot = None;
    workload(&alloc, steps, bugs, &mut |_| true, &mut || {
        snapshot = Some(alloc.snapshot())
    })?;
    Ok(snapshot.unwrap_or_else(|| alloc.snapshot()))
}

/// The training loop on `alloc`: `steps` steps with `bugs` planted. Before each step it asks
/// `proceed` (with the step number), which may wait, and stops early when it says no; at the
/// end it calls `linger` while the kept buffers are still alive.
pub fn workload(
    alloc: &CachingAllocator<SimDevice>,
    steps: u64,
    bugs: Bugs,
    proceed: &mut dyn FnMut(u64) -> bool,
    linger: &mut dyn FnMut(),
) -> Result<(), AllocError> {
    let _weights = alloc.tagged("weights").alloc(32 * MIB)?;
    let _adam_state = alloc.tagged("adam").alloc(64 * MIB)?;
    let mut kept_losses = Vec::new();
    let mut host_losses = Vec::new();
    for step in 0..steps {
        if !proceed(step) {
            break;
        }
        alloc.mark_step();
        let mut activations = Vec::new();
        {
            let _forward = alloc.scope("forward");
            for _layer in 0..4 {
                activations.push(alloc.tagged("activation").alloc(6 * MIB)?);
            }
        }
        let mut loss = alloc.tagged("loss").alloc(2 * MIB)?; // planted: retained_per_step when kept
        loss.copy_from_host(&0.25f32.to_le_bytes())?;
        {
            let _backward = alloc.scope("backward");
            while let Some(activation) = activations.pop() {
                let _grad = alloc.tagged("grad").alloc(activation.len())?;
            }
        }
        if bugs.item_in_loop {
            for _ in 0..32 {
                let mut element = [0u8; 4];
                loss.copy_to_host(&mut element)?; // planted: sync_in_loop
                host_losses.push(f32::from_le_bytes(element));
            }
        } else {
            let mut element = [0u8; 4];
            loss.copy_to_host(&mut element)?;
            host_losses.push(f32::from_le_bytes(element));
        }
        if bugs.retained_loss {
            kept_losses.push(loss);
        }
    }
    linger();
    Ok(())
}
