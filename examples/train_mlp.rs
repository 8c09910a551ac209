//! Trains a small MLP on synthetic data through vramscope's tensor layer: on CUDA when a driver
//! and device are present, on the backed simulated device otherwise (the first line printed
//! says which and why). Flags plant the bugs the inspector finds and switch on the variants
//! whose memory effect is worth seeing; the run ends by writing a snapshot for
//! `vramscope report PATH`.
//!
//! Usage: `cargo run --release --example train_mlp -- [FLAGS]`
//!
//! - `--retain-loss`: keep every step's loss tensor alive (`losses.append(loss)`).
//! - `--item-in-loop`: read the loss and logits to the host element by element every step.
//! - `--grad-accum N`: accumulate gradients over N micro-batches per optimizer step.
//! - `--bf16`: bf16 activations and weight copies, f32 master weights.
//! - `--sgd`: SGD instead of AdamW.
//! - `--steps N`, `--batch N`, `--hidden N`: the run's size.
//! - `--out PATH` (or a bare `PATH`): where to write the snapshot (default: `train_mlp.json` in
//!   the temp dir).
//!
//! `VRAMSCOPE_BACKEND=sim` forces the simulated device on a CUDA machine.

use std::error::Error;
use std::path::PathBuf;

use vramscope::model::{format_bytes, AllocatorConfig};
use vramscope_kernels::{train, Device, Optimizer, TrainConfig};

/// Capacity of the simulated device when there is no GPU.
const SIM_CAPACITY: u64 = 4 << 30;

fn parse_args() -> Result<(TrainConfig, PathBuf), String> {
    let mut config = TrainConfig::default();
    let mut out = std::env::temp_dir().join("train_mlp.json");
    let mut args = std::env::args().skip(1);
    let number = |flag: &str, value: Option<String>| -> Result<usize, String> {
        value
            .as_deref()
            .and_then(|v| v.parse().ok())
            .filter(|n| *n > 0)
            .ok_or_else(|| format!("{flag} needs a positive number"))
    };
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--retain-loss" => config.retain_loss = true,
            "--item-in-loop" => config.item_in_loop = true,
            "--bf16" => config.bf16 = true,
            "--sgd" => {
                config.optimizer = Optimizer::Sgd;
                config.lr = 0.2;
            }
            "--grad-accum" => config.grad_accum = number(&arg, args.next())?,
            "--steps" => config.steps = number(&arg, args.next())?,
            "--batch" => config.batch = number(&arg, args.next())?,
            "--hidden" => config.hidden = number(&arg, args.next())?,
            "--out" => out = args.next().ok_or("--out needs a path")?.into(),
            "-h" | "--help" => {
                println!("flags: --retain-loss --item-in-loop --grad-accum N --bf16 --sgd --steps N --batch N --hidden N --out PATH (or a bare PATH)");
                std::process::exit(0);
            }
            other if !other.starts_with('-') => out = other.into(),
            other => return Err(format!("unknown flag {other} (try --help)")),
        }
    }
    Ok((config, out))
}

fn main() -> Result<(), Box<dyn Error>> {
    let (config, out) = parse_args()?;
    let (device, why) = Device::detect(SIM_CAPACITY, AllocatorConfig::default());
    println!("device: {why}");
    println!("kernels: {}", device.engine_description());

    let report = train(&device, &config)?;
    for (step, loss) in &report.history {
        println!("step {step:>5}  loss {loss:.4}");
    }
    let stats = device.allocator().stats();
    println!(
        "memory: peak allocated {}, allocated at end {}, reserved {}, persistent (weights, grads, optimizer) {}",
        format_bytes(report.peak_allocated),
        format_bytes(report.allocated_at_end),
        format_bytes(stats.reserved_bytes.all.current),
        format_bytes(report.persistent_bytes),
    );
    if config.retain_loss {
        println!("retained loss tensors: {}", report.retained_losses);
    }
    if config.item_in_loop {
        println!(
            "host reads of the loss in the loop: {}",
            report.item_losses.len()
        );
    }
    report.snapshot.save(&out)?;
    println!("snapshot written to {}", out.display());
    Ok(())
}
