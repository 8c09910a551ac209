//! The CUDA kernels against their CPU twins, the tensor layer and trainer on a real GPU, and
//! the allocator's CUDA backend under the caching policy. Each test runs where a CUDA driver
//! and device exist and prints one line saying it was skipped anywhere else.

use vramscope_allocator::cuda::nvrtc_version;
use vramscope_allocator::{Backend, CachingAllocator, DeviceBackend};
use vramscope_kernels::{cpu, train, AdamW, DType, Device, Tensor, TrainConfig};
use vramscope_model::AllocatorConfig;

/// A CUDA device with the default allocator settings, or `None` after printing why not.
fn cuda_device(config: AllocatorConfig) -> Option<Device> {
    match DeviceBackend::cuda(0) {
        Ok(backend) => Some(Device::new(CachingAllocator::new(backend, config))),
        Err(reason) => {
            vramscope_testkit::skip_notice(&format!("no CUDA driver ({reason})"));
            None
        }
    }
}

/// A CUDA device whose ops run as CUDA kernels; fails if NVRTC is present but unusable.
fn kernel_device() -> Option<Device> {
    let device = cuda_device(AllocatorConfig::default())?;
    match nvrtc_version() {
        Ok(_) => assert!(
            device.uses_cuda_kernels(),
            "NVRTC is present but the kernels did not load: {}",
            device.engine_description()
        ),
        Err(reason) => {
            vramscope_testkit::skip_notice(&format!(
                "no NVRTC ({reason}); {}",
                device.engine_description()
            ));
            return None;
        }
    }
    println!("{}", device.engine_description());
    Some(device)
}

fn values(seed: u64, n: usize, scale: f32) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s >> 12;
            s ^= s << 25;
            s ^= s >> 27;
            ((s.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 40) as f32 / (1u64 << 23) as f32 - 1.0)
                * scale
        })
        .collect()
}

fn tolerance(dtype: DType) -> f32 {
    match dtype {
        DType::F32 => 1e-4,
        DType::F16 => 4e-3,
        DType::BF16 => 2e-2,
    }
}

fn assert_close(what: &str, got: &[f32], want: &[f32], tol: f32) {
    assert_eq!(got.len(), want.len(), "{what}");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= tol * (1.0 + w.abs()),
            "{what}: element {i}: GPU {g}, CPU {w}"
        );
    }
}

#[test]
fn conversions_on_the_gpu_round_exactly_like_the_half_crate() {
    let Some(dev) = kernel_device() else { return };
    let mut data = vec![
        0.0,
        -0.0,
        1.0,
        65504.0,
        65520.0,
        1e6,
        -1e6,
        6.1e-5,
        5.96e-8,
        2.98e-8,
        1e-10,
        1.0 + 1.0 / 2048.0,
        1.0 + 3.0 / 2048.0,
        1.0 + 1.0 / 256.0,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::MAX,
        f32::MIN_POSITIVE,
    ];
    for exp in -30..20 {
        data.extend(values(exp as u64 + 100, 64, 2f32.powi(exp)));
    }
    let wide = Tensor::from_host(&dev, &data, &[data.len()], DType::F32).unwrap();
    for dtype in [DType::F16, DType::BF16] {
        let narrow = wide.to_dtype(dtype).unwrap().to_host().unwrap();
        for (i, (got, v)) in narrow.iter().zip(&data).enumerate() {
            let want = dtype.round(*v);
            assert!(
                got.to_bits() == want.to_bits(),
                "{dtype}: element {i} ({v:e}): GPU {got:e}, half crate {want:e}"
            );
        }
    }
    let nan = Tensor::from_host(&dev, &[f32::NAN], &[1], DType::F32).unwrap();
    assert!(nan.to_dtype(DType::F16).unwrap().item().unwrap().is_nan());
    assert!(nan.to_dtype(DType::BF16).unwrap().item().unwrap().is_nan());
}

#[test]
fn gpu_kernels_match_the_cpu_kernels_in_every_dtype() {
    let Some(dev) = kernel_device() else { return };
    let (m, k, n) = (37, 70, 45);
    for dtype in [DType::F32, DType::F16, DType::BF16] {
        let tol = tolerance(dtype);
        let a_host: Vec<f32> = values(1, m * k, 1.0)
            .into_iter()
            .map(|v| dtype.round(v))
            .collect();
        let b_host: Vec<f32> = values(2, k * n, 1.0)
            .into_iter()
            .map(|v| dtype.round(v))
            .collect();
        let a = Tensor::from_host(&dev, &a_host, &[m, k], dtype).unwrap();
        let b = Tensor::from_host(&dev, &b_host, &[k, n], dtype).unwrap();
        for (ta, tb) in [(false, false), (true, false), (false, true), (true, true)] {
            // Reinterpret the same data under the transposes: shapes swap, values stay.
            let (ra, rb) = (
                if ta {
                    a.try_clone().unwrap().reshape(&[k, m]).unwrap()
                } else {
                    a.try_clone().unwrap()
                },
                if tb {
                    b.try_clone().unwrap().reshape(&[n, k]).unwrap()
                } else {
                    b.try_clone().unwrap()
                },
            );
            let c = ra
                .matmul_ex(&rb, ta, tb, DType::F32)
                .unwrap()
                .to_host()
                .unwrap();
            let mut want = vec![0.0; m * n];
            cpu::matmul(&a_host, &b_host, &mut want, m, n, k, ta, tb);
            assert_close(&format!("matmul {dtype} {ta} {tb}"), &c, &want, 1e-4);
        }

        let x_host: Vec<f32> = values(3, 5000, 3.0)
            .into_iter()
            .map(|v| dtype.round(v))
            .collect();
        let x = Tensor::from_host(&dev, &x_host, &[100, 50], dtype).unwrap();
        let mut want = vec![0.0; x_host.len()];
        cpu::relu(&x_host, &mut want);
        assert_close(
            &format!("relu {dtype}"),
            &x.relu().unwrap().to_host().unwrap(),
            &want,
            tol,
        );

        let g_host: Vec<f32> = values(4, 5000, 1.0)
            .into_iter()
            .map(|v| dtype.round(v))
            .collect();
        let g = Tensor::from_host(&dev, &g_host, &[100, 50], dtype).unwrap();
        cpu::relu_backward(&g_host, &x_host, &mut want);
        let got = Tensor::relu_backward(&g, &x).unwrap().to_host().unwrap();
        assert_close(&format!("relu_backward {dtype}"), &got, &want, tol);

        let bias_host: Vec<f32> = values(5, 50, 1.0)
            .into_iter()
            .map(|v| dtype.round(v))
            .collect();
        let bias = Tensor::from_host(&dev, &bias_host, &[50], dtype).unwrap();
        cpu::add_bias(&x_host, &bias_host, &mut want);
        assert_close(
            &format!("add_bias {dtype}"),
            &x.add_bias(&bias).unwrap().to_host().unwrap(),
            &want,
            tol,
        );

        let mut y = g.try_clone().unwrap();
        y.axpy(0.5, &x).unwrap();
        y.scale(-2.0).unwrap();
        let mut want = g_host.clone();
        cpu::axpy(0.5, &x_host, &mut want);
        cpu::scale(-2.0, &mut want);
        assert_close(
            &format!("axpy+scale {dtype}"),
            &y.to_host().unwrap(),
            &want,
            2.0 * tol,
        );

        let total = x.sum().unwrap().item().unwrap();
        let want_total = cpu::sum(&x_host);
        assert!(
            (total - want_total).abs() < 1e-2,
            "sum {dtype}: {total} vs {want_total}"
        );
        let mut cols = vec![0.0; 50];
        cpu::sum_rows(&x_host, &mut cols);
        assert_close(
            &format!("sum_rows {dtype}"),
            &x.sum_rows().unwrap().to_host().unwrap(),
            &cols,
            1e-4,
        );

        let labels_host: Vec<f32> = (0..100).map(|r| (r * 7 % 50) as f32).collect();
        let labels = Tensor::from_host(&dev, &labels_host, &[100], DType::F32).unwrap();
        let (loss, grad) = x.softmax_cross_entropy(&labels).unwrap();
        let mut rows = vec![0.0; 100];
        let mut grad_want = vec![0.0; 5000];
        cpu::softmax_cross_entropy(&x_host, &labels_host, 50, &mut rows, &mut grad_want, 0.01);
        let want_loss = rows.iter().sum::<f32>() / 100.0;
        let got_loss = loss.item().unwrap();
        assert!(
            (got_loss - want_loss).abs() < 1e-3 * (1.0 + want_loss),
            "xent {dtype}: {got_loss} vs {want_loss}"
        );
        assert_close(
            &format!("xent grad {dtype}"),
            &grad.to_host().unwrap(),
            &grad_want,
            tol,
        );

        let mut w = x.to_dtype(DType::F32).unwrap();
        w.sgd_step(&g, 0.1, 0.01).unwrap();
        let mut w_want = x_host.clone();
        cpu::sgd(&mut w_want, &g_host, 0.1, 0.01);
        assert_close(
            &format!("sgd {dtype}"),
            &w.to_host().unwrap(),
            &w_want,
            1e-5,
        );

        let mut mm = Tensor::zeros(&dev, &[100, 50], DType::F32).unwrap();
        let mut vv = Tensor::zeros(&dev, &[100, 50], DType::F32).unwrap();
        let (mut m_want, mut v_want) = (vec![0.0; 5000], vec![0.0; 5000]);
        let p = AdamW {
            lr: 0.01,
            ..AdamW::default()
        };
        for step in 1..=3 {
            w.adamw_step(&g, &mut mm, &mut vv, &p, step).unwrap();
            cpu::adamw(&mut w_want, &g_host, &mut m_want, &mut v_want, &p, step);
        }
        assert_close(
            &format!("adamw {dtype}"),
            &w.to_host().unwrap(),
            &w_want,
            1e-4,
        );

        let mut f = Tensor::poisoned(&dev, &[300], dtype).unwrap();
        assert!(f.to_host().unwrap().iter().all(|v| v.is_nan()));
        f.fill(1.25).unwrap();
        assert!(f.to_host().unwrap().iter().all(|v| *v == 1.25));
        assert_eq!(x.element(57).unwrap().item().unwrap(), x_host[57]);
    }
    // A sum over far more elements than one block has threads.
    let big = values(9, 1 << 20, 1.0);
    let t = Tensor::from_host(&dev, &big, &[big.len()], DType::F32).unwrap();
    let got = t.sum().unwrap().item().unwrap();
    assert!(
        (got - cpu::sum(&big)).abs() < 0.05,
        "{got} vs {}",
        cpu::sum(&big)
    );
}

#[test]
fn the_mlp_learns_on_the_gpu() {
    let Some(dev) = kernel_device() else { return };
    for bf16 in [false, true] {
        let report = train(
            &dev,
            &TrainConfig {
                steps: 100,
                bf16,
                ..TrainConfig::default()
            },
        )
        .unwrap();
        let (first, last) = (report.first_loss().unwrap(), report.final_loss().unwrap());
        println!("cuda mlp (bf16: {bf16}): loss {first:.3} -> {last:.3}");
        assert!(last < 0.7 * first, "{first} -> {last}");
    }
}

/// Allocates, fills and reads back buffers of every pool size, then empties the cache.
fn exercise_allocator(dev: &Device, settings: &str) {
    let alloc = dev.allocator();
    let mut buffers = Vec::new();
    for (i, size) in [512u64, 4 << 10, 3 << 20, 25 << 20, 1 << 20]
        .iter()
        .enumerate()
    {
        let mut b = alloc.alloc(*size).unwrap();
        let pattern: Vec<u8> = (0..*size).map(|j| (j as usize * 31 + i) as u8).collect();
        b.copy_from_host(&pattern).unwrap();
        let mut back = vec![0u8; *size as usize];
        b.copy_to_host(&mut back).unwrap();
        assert_eq!(back, pattern, "{settings}: buffer {i}");
        buffers.push(b);
    }
    drop(buffers);
    alloc.check_invariants().unwrap();
    let released = alloc.empty_cache();
    assert!(released > 0, "{settings}");
    assert_eq!(alloc.stats().reserved_bytes.all.current, 0, "{settings}");
    // An impossible request is an error, not a crash.
    let total = dev.backend().mem_info().total;
    assert!(alloc.alloc(total * 4).is_err(), "{settings}");
}

#[test]
fn the_caching_allocator_runs_on_cuda_with_plain_and_expandable_segments() {
    for settings in ["", "expandable_segments:True"] {
        let config = AllocatorConfig::parse(settings).unwrap();
        let Some(dev) = cuda_device(config) else {
            return;
        };
        exercise_allocator(&dev, settings);
    }
}

#[test]
fn the_same_allocator_exercise_passes_on_the_simulated_device() {
    for settings in ["", "expandable_segments:True"] {
        let config = AllocatorConfig::parse(settings).unwrap();
        let dev = Device::new(CachingAllocator::new(DeviceBackend::sim(1 << 30), config));
        exercise_allocator(&dev, settings);
    }
}
