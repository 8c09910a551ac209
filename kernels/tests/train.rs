//! The MLP trainer on the backed simulated device: the loss falls in every variant, and each
//! planted bug leaves the trace the inspector looks for.

use vramscope_kernels::{train, Device, Optimizer, TrainConfig};
use vramscope_model::{EventKind, TransferDirection};

fn small() -> TrainConfig {
    TrainConfig {
        steps: 60,
        batch: 32,
        inputs: 16,
        hidden: 32,
        classes: 4,
        log_every: 10,
        ..TrainConfig::default()
    }
}

fn assert_loss_falls(name: &str, config: &TrainConfig) -> vramscope_kernels::TrainReport {
    let device = Device::sim(256 << 20);
    let report = train(&device, config).unwrap();
    let (first, last) = (report.first_loss().unwrap(), report.final_loss().unwrap());
    println!(
        "{name}: loss {first:.3} -> {last:.3}, peak {} B, {:?}",
        report.peak_allocated, report.history
    );
    assert!(
        last.is_finite() && last < 0.7 * first,
        "{name}: {first} -> {last}"
    );
    assert_eq!(
        report.history.len(),
        config.steps.div_ceil(config.log_every)
    );
    report
}

#[test]
fn loss_falls_with_adamw_and_with_sgd() {
    assert_loss_falls("adamw", &small());
    assert_loss_falls(
        "sgd",
        &TrainConfig {
            optimizer: Optimizer::Sgd,
            lr: 0.5,
            ..small()
        },
    );
}

#[test]
fn loss_falls_with_gradient_accumulation_which_keeps_extra_buffers() {
    let plain = assert_loss_falls("plain", &small());
    let accum = assert_loss_falls(
        "grad_accum",
        &TrainConfig {
            grad_accum: 4,
            batch: 8,
            ..small()
        },
    );
    // One f32 accumulation buffer per parameter on top of the weights and two moments.
    assert_eq!(accum.persistent_bytes * 3, plain.persistent_bytes * 4);
}

#[test]
fn loss_falls_with_bf16_activations_and_f32_master_weights() {
    let plain = assert_loss_falls(
        "f32",
        &TrainConfig {
            batch: 256,
            ..small()
        },
    );
    let bf16 = assert_loss_falls(
        "bf16",
        &TrainConfig {
            bf16: true,
            batch: 256,
            ..small()
        },
    );
    assert_eq!(bf16.persistent_bytes, plain.persistent_bytes);
    assert!(
        bf16.peak_allocated < plain.peak_allocated,
        "{} vs {}",
        bf16.peak_allocated,
        plain.peak_allocated
    );
}

#[test]
fn retain_loss_keeps_one_block_per_step_alive() {
    let device = Device::sim(256 << 20);
    let clean = train(&device, &small()).unwrap();
    let device = Device::sim(256 << 20);
    let leaky = train(
        &device,
        &TrainConfig {
            retain_loss: true,
            ..small()
        },
    )
    .unwrap();
    assert_eq!(leaky.retained_losses, 60);
    assert_eq!(clean.retained_losses, 0);
    // Each retained scalar holds the allocator's minimum block of 512 bytes.
    assert!(leaky.allocated_at_end >= clean.allocated_at_end + 60 * 512);
}

#[test]
fn item_in_loop_syncs_many_times_per_step_from_one_line() {
    let device = Device::sim(256 << 20);
    let config = TrainConfig {
        item_in_loop: true,
        ..small()
    };
    let report = train(&device, &config).unwrap();
    assert_eq!(report.item_losses.len(), 60);
    let snapshot = device.allocator().snapshot();
    let mut per_site = std::collections::HashMap::<u32, usize>::new();
    for e in &snapshot.events {
        if e.kind == EventKind::Transfer(TransferDirection::DeviceToHost) {
            *per_site.entry(e.site().unwrap()).or_default() += 1;
        }
    }
    // The element-by-element read: 2 samples × 4 classes per step, all from one line.
    let (site, count) = per_site.iter().max_by_key(|(_, c)| **c).unwrap();
    assert_eq!(*count, 60 * 8);
    assert!(snapshot.sites[*site as usize].file.ends_with("train.rs"));

    // A clean run reads the loss once per log interval only.
    let device = Device::sim(256 << 20);
    train(&device, &small()).unwrap();
    let d2h = device
        .allocator()
        .snapshot()
        .events
        .iter()
        .filter(|e| e.kind == EventKind::Transfer(TransferDirection::DeviceToHost))
        .count();
    assert_eq!(d2h, 6);
}
