//! The tensor layer on the backed simulated device: results, dtypes, errors, and what the
//! allocator records (allocations and transfers at the caller's line).

use vramscope_kernels::{cpu, AdamW, DType, Device, Tensor, TensorError};
use vramscope_model::{EventKind, Snapshot, TransferDirection};

fn device() -> Device {
    Device::sim(256 << 20)
}

fn ramp(n: usize, scale: f32) -> Vec<f32> {
    (0..n)
        .map(|i| ((i * 7 % 13) as f32 - 6.0) * scale)
        .collect()
}

/// The lines of this file at which events of `kind` were recorded.
fn lines_of(snapshot: &Snapshot, kind: EventKind) -> Vec<u32> {
    snapshot
        .events
        .iter()
        .filter(|e| e.kind == kind)
        .filter_map(|e| e.site())
        .map(|s| &snapshot.sites[s as usize])
        .filter(|site| site.file.ends_with("tensor_sim.rs"))
        .map(|site| site.line)
        .collect()
}

#[test]
fn ops_on_the_simulated_device_match_the_cpu_kernels() {
    let dev = device();
    let (m, k, n) = (5, 19, 3);
    let a_host = ramp(m * k, 0.1);
    let b_host = ramp(k * n, 0.05);
    let a = Tensor::from_host(&dev, &a_host, &[m, k], DType::F32).unwrap();
    let b = Tensor::from_host(&dev, &b_host, &[k, n], DType::F32).unwrap();
    let c = a.matmul(&b).unwrap();
    let mut want = vec![0.0; m * n];
    cpu::matmul(&a_host, &b_host, &mut want, m, n, k, false, false);
    assert_eq!(c.shape(), &[m, n]);
    assert_eq!(c.to_host().unwrap(), want);

    // aᵀ · a through the transpose flag.
    let ata = a.matmul_ex(&a, true, false, DType::F32).unwrap();
    assert_eq!(ata.shape(), &[k, k]);

    let bias = Tensor::from_host(&dev, &[1.0, -1.0, 0.5], &[3], DType::F32).unwrap();
    let biased = c.add_bias(&bias).unwrap().to_host().unwrap();
    assert_eq!(biased[4], want[4] - 1.0);

    let r = c.relu().unwrap().to_host().unwrap();
    assert!(r.iter().zip(&want).all(|(r, w)| *r == w.max(0.0)));

    let total = c.sum().unwrap().item().unwrap();
    assert!((total - want.iter().sum::<f32>()).abs() < 1e-4);
    let mean = c.mean().unwrap().item().unwrap();
    assert!((mean - total / 15.0).abs() < 1e-5);
    let cols = c.sum_rows().unwrap().to_host().unwrap();
    assert_eq!(cols.len(), n);

    let mut y = Tensor::full(&dev, &[m, n], DType::F32, 1.0).unwrap();
    y.axpy(2.0, &c).unwrap();
    y.scale(0.5).unwrap();
    let got = y.to_host().unwrap();
    for (g, w) in got.iter().zip(&want) {
        assert!((g - 0.5 * (2.0 * w + 1.0)).abs() < 1e-6);
    }
    assert_eq!(c.element(4).unwrap().item().unwrap(), want[4]);
    assert!(c.element(15).is_err());
}

#[test]
fn half_precision_storage_rounds_like_the_half_crate() {
    let dev = device();
    let data = ramp(64, 0.013);
    for dtype in [DType::F16, DType::BF16] {
        let t = Tensor::from_host(&dev, &data, &[8, 8], dtype).unwrap();
        assert_eq!(t.byte_len(), 128);
        let back = t.to_host().unwrap();
        for (b, d) in back.iter().zip(&data) {
            assert_eq!(*b, dtype.round(*d));
        }
        let wide = t.to_dtype(DType::F32).unwrap();
        assert_eq!(wide.to_host().unwrap(), back);
        // A mixed-precision product: bf16/f16 inputs, f32 output.
        let p = t.matmul_ex(&wide, false, false, DType::F32).unwrap();
        assert_eq!(p.dtype(), DType::F32);
    }
}

#[test]
fn loss_gradient_and_optimizer_steps_work_on_the_device() {
    let dev = device();
    let logits_host = ramp(4 * 3, 0.3);
    let logits = Tensor::from_host(&dev, &logits_host, &[4, 3], DType::F32).unwrap();
    let labels = Tensor::from_host(&dev, &[0.0, 1.0, 2.0, 1.0], &[4], DType::F32).unwrap();
    let (loss, grad) = logits.softmax_cross_entropy(&labels).unwrap();
    let mut rows = vec![0.0; 4];
    let mut g = vec![0.0; 12];
    cpu::softmax_cross_entropy(
        &logits_host,
        &[0.0, 1.0, 2.0, 1.0],
        3,
        &mut rows,
        &mut g,
        0.25,
    );
    assert!((loss.item().unwrap() - rows.iter().sum::<f32>() / 4.0).abs() < 1e-6);
    assert_eq!(grad.to_host().unwrap(), g);
    assert!(logits.softmax_cross_entropy(&logits).is_err());

    let mut w = Tensor::full(&dev, &[4, 3], DType::F32, 1.0).unwrap();
    w.sgd_step(&grad, 0.5, 0.0).unwrap();
    let after = w.to_host().unwrap();
    assert!(after
        .iter()
        .zip(&g)
        .all(|(w, g)| (*w - (1.0 - 0.5 * g)).abs() < 1e-6));

    let mut m = Tensor::zeros(&dev, &[4, 3], DType::F32).unwrap();
    let mut v = Tensor::zeros(&dev, &[4, 3], DType::F32).unwrap();
    w.adamw_step(&grad, &mut m, &mut v, &AdamW::default(), 1)
        .unwrap();
    assert!(m
        .to_host()
        .unwrap()
        .iter()
        .zip(&g)
        .all(|(m, g)| (*m - 0.1 * g).abs() < 1e-7));
}

#[test]
fn poison_fill_and_empty_tensors() {
    let dev = device();
    let mut t = Tensor::poisoned(&dev, &[3], DType::BF16).unwrap();
    assert!(t.to_host().unwrap().iter().all(|v| v.is_nan()));
    t.fill(2.0).unwrap();
    assert_eq!(t.to_host().unwrap(), vec![2.0; 3]);
    let z = Tensor::zeros(&dev, &[0, 4], DType::F16).unwrap();
    assert_eq!(z.numel(), 0);
    assert_eq!(z.sum().unwrap().item().unwrap(), 0.0);
    assert!(z.to_host().unwrap().is_empty());
    let r = Tensor::zeros(&dev, &[2, 3], DType::F32)
        .unwrap()
        .reshape(&[6])
        .unwrap();
    assert_eq!(r.shape(), &[6]);
    assert!(r.reshape(&[4]).is_err());
    assert!(matches!(
        Tensor::from_host(&dev, &[1.0], &[2], DType::F32),
        Err(TensorError::Shape {
            op: "from_host",
            ..
        })
    ));
    let two = Tensor::zeros(&dev, &[2], DType::F32).unwrap();
    assert!(two.item().is_err());
}

#[test]
fn operands_on_different_devices_name_both_devices_and_origins() {
    let first = device();
    let second = device();
    let a = Tensor::zeros(&first, &[2, 2], DType::F32).unwrap();
    let a_line = line!() - 1;
    let b = Tensor::zeros(&second, &[2, 2], DType::F32).unwrap();
    let b_line = line!() - 1;
    let err = a.matmul(&b).unwrap_err();
    let text = err.to_string();
    assert!(matches!(
        err,
        TensorError::DeviceMismatch { op: "matmul", .. }
    ));
    assert!(text.contains(&first.to_string()), "{text}");
    assert!(text.contains(&second.to_string()), "{text}");
    assert!(text.contains(&format!("tensor_sim.rs:{a_line}:")), "{text}");
    assert!(text.contains(&format!("tensor_sim.rs:{b_line}:")), "{text}");
    assert_ne!(first.to_string(), second.to_string());

    // Moving one fixes it, and the copy is two recorded transfers.
    let moved = b.to_device(&first).unwrap();
    assert!(moved.device().same_as(&first));
    assert!(a.matmul(&moved).is_ok());
}

#[test]
fn allocations_and_transfers_are_recorded_at_the_callers_line() {
    let dev = device();
    let x = Tensor::from_host(&dev, &[1.0, 2.0, 3.0, 4.0], &[2, 2], DType::F32).unwrap();
    let upload_line = line!() - 1;
    let y = x.matmul(&x).unwrap();
    let matmul_line = line!() - 1;
    let total = y.sum().unwrap();
    let value = total.item().unwrap();
    let item_line = line!() - 1;
    assert_eq!(value, 7.0 + 10.0 + 15.0 + 22.0);
    dev.synchronize().unwrap();
    let sync_line = line!() - 1;

    let snapshot = dev.allocator().snapshot();
    let allocs = lines_of(&snapshot, EventKind::Alloc);
    assert!(allocs.contains(&upload_line), "{allocs:?}");
    assert!(allocs.contains(&matmul_line), "{allocs:?}");
    assert_eq!(
        lines_of(
            &snapshot,
            EventKind::Transfer(TransferDirection::HostToDevice)
        ),
        vec![upload_line]
    );
    assert_eq!(
        lines_of(
            &snapshot,
            EventKind::Transfer(TransferDirection::DeviceToHost)
        ),
        vec![item_line]
    );
    assert_eq!(lines_of(&snapshot, EventKind::Sync), vec![sync_line]);
    // Kernel work on the simulated device is not a transfer: only the three above were recorded.
    let transfers = snapshot
        .events
        .iter()
        .filter(|e| matches!(e.kind, EventKind::Transfer(_)))
        .count();
    assert_eq!(transfers, 2);
    assert!(dev.engine_description().starts_with("CPU kernels"));
}
