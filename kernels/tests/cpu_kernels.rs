//! The CPU kernels against naive references written the obvious way (f64 where it matters).

use vramscope_kernels::cpu::{self, AdamW};

/// A seeded stream of values in [-1, 1).
fn values(seed: u64, n: usize) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s >> 12;
            s ^= s << 25;
            s ^= s >> 27;
            (s.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 40) as f32 / (1u64 << 23) as f32 - 1.0
        })
        .collect()
}

fn assert_close(got: &[f32], want: &[f32], tol: f32) {
    assert_eq!(got.len(), want.len());
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= tol * (1.0 + w.abs()),
            "element {i}: got {g}, want {w}"
        );
    }
}

#[test]
fn tiled_matmul_matches_the_triple_loop_for_every_transpose() {
    // Sizes that straddle the 32-wide tiles.
    let (m, n, k) = (37, 45, 70);
    for (ta, tb) in [(false, false), (true, false), (false, true), (true, true)] {
        let a = values(1, m * k);
        let b = values(2, k * n);
        let mut want = vec![0.0f32; m * n];
        for i in 0..m {
            for j in 0..n {
                let mut acc = 0.0f64;
                for p in 0..k {
                    let av = if ta { a[p * m + i] } else { a[i * k + p] };
                    let bv = if tb { b[j * k + p] } else { b[p * n + j] };
                    acc += f64::from(av) * f64::from(bv);
                }
                want[i * n + j] = acc as f32;
            }
        }
        let mut got = vec![f32::NAN; m * n];
        cpu::matmul(&a, &b, &mut got, m, n, k, ta, tb);
        assert_close(&got, &want, 1e-5);
    }
}

#[test]
fn element_wise_kernels_match_their_definitions() {
    let x = values(3, 1000);
    let y0 = values(4, 1000);

    let mut y = y0.clone();
    cpu::axpy(0.5, &x, &mut y);
    let want: Vec<f32> = x.iter().zip(&y0).map(|(x, y)| 0.5 * x + y).collect();
    assert_close(&y, &want, 0.0);

    cpu::scale(-2.0, &mut y);
    let want: Vec<f32> = want.iter().map(|v| -2.0 * v).collect();
    assert_close(&y, &want, 0.0);

    let mut out = vec![0.0; 1000];
    cpu::relu(&x, &mut out);
    assert!(out.iter().zip(&x).all(|(o, x)| *o == x.max(0.0)));
    cpu::relu_backward(&y0, &x, &mut out);
    assert!(out
        .iter()
        .zip(&x)
        .zip(&y0)
        .all(|((o, x), g)| *o == if *x > 0.0 { *g } else { 0.0 }));
    let mut nan = [0.0];
    cpu::relu(&[f32::NAN], &mut nan);
    assert_eq!(nan, [0.0]);

    cpu::fill(&mut out, 3.5);
    assert!(out.iter().all(|v| *v == 3.5));

    let bias = values(5, 10);
    let mut biased = vec![0.0; 1000];
    cpu::add_bias(&x, &bias, &mut biased);
    for (i, v) in biased.iter().enumerate() {
        assert_eq!(*v, x[i] + bias[i % 10]);
    }
}

#[test]
fn reductions_match_f64_sums() {
    let x = values(6, 12 * 7);
    let want: f64 = x.iter().map(|v| f64::from(*v)).sum();
    assert!((f64::from(cpu::sum(&x)) - want).abs() < 1e-5);
    assert_eq!(cpu::sum(&[]), 0.0);

    let mut cols = vec![f32::NAN; 7];
    cpu::sum_rows(&x, &mut cols);
    for (c, got) in cols.iter().enumerate() {
        let want: f64 = (0..12).map(|r| f64::from(x[r * 7 + c])).sum();
        assert!((f64::from(*got) - want).abs() < 1e-5, "column {c}");
    }
}

#[test]
fn softmax_cross_entropy_matches_the_textbook_formula() {
    let (rows, cols) = (9, 5);
    let logits: Vec<f32> = values(7, rows * cols).iter().map(|v| v * 6.0).collect();
    let labels: Vec<f32> = (0..rows).map(|r| (r % cols) as f32).collect();
    let mut loss = vec![0.0; rows];
    let mut grad = vec![0.0; rows * cols];
    let scale = 1.0 / rows as f32;
    cpu::softmax_cross_entropy(&logits, &labels, cols, &mut loss, &mut grad, scale);
    for r in 0..rows {
        let row: Vec<f64> = logits[r * cols..(r + 1) * cols]
            .iter()
            .map(|v| f64::from(*v))
            .collect();
        let z: f64 = row.iter().map(|v| v.exp()).sum();
        let label = labels[r] as usize;
        let want_loss = -(row[label].exp() / z).ln();
        assert!((f64::from(loss[r]) - want_loss).abs() < 1e-5, "row {r}");
        for c in 0..cols {
            let p = row[c].exp() / z;
            let want = (p - if c == label { 1.0 } else { 0.0 }) * f64::from(scale);
            assert!(
                (f64::from(grad[r * cols + c]) - want).abs() < 1e-6,
                "row {r} col {c}"
            );
        }
    }
    // Each row's gradient sums to zero.
    for r in 0..rows {
        let s: f32 = grad[r * cols..(r + 1) * cols].iter().sum();
        assert!(s.abs() < 1e-6);
    }
    // An out-of-range or fractional label poisons its row instead of reading out of bounds.
    let mut l = [0.0; 2];
    let mut g = [0.0; 4];
    cpu::softmax_cross_entropy(&[0.0, 1.0, 0.0, 1.0], &[2.0, 0.5], 2, &mut l, &mut g, 1.0);
    assert!(l.iter().chain(&g).all(|v| v.is_nan()));
}

#[test]
fn optimizer_updates_match_their_definitions() {
    let w0 = values(8, 64);
    let g = values(9, 64);

    let mut w = w0.clone();
    cpu::sgd(&mut w, &g, 0.1, 0.01);
    let want: Vec<f32> = w0
        .iter()
        .zip(&g)
        .map(|(w, g)| w - 0.1 * (g + 0.01 * w))
        .collect();
    assert_close(&w, &want, 0.0);

    // Two AdamW steps against an f64 transcription of the update rule.
    let p = AdamW {
        lr: 0.01,
        ..AdamW::default()
    };
    let (mut w, mut m, mut v) = (w0.clone(), vec![0.0; 64], vec![0.0; 64]);
    let (mut wr, mut mr, mut vr): (Vec<f64>, Vec<f64>, Vec<f64>) = (
        w0.iter().map(|x| f64::from(*x)).collect(),
        vec![0.0; 64],
        vec![0.0; 64],
    );
    for step in 1..=2u32 {
        cpu::adamw(&mut w, &g, &mut m, &mut v, &p, step);
        let (b1, b2) = (f64::from(p.beta1), f64::from(p.beta2));
        let (lr, wd, eps) = (f64::from(p.lr), f64::from(p.weight_decay), f64::from(p.eps));
        for i in 0..64 {
            let gi = f64::from(g[i]);
            mr[i] = b1 * mr[i] + (1.0 - b1) * gi;
            vr[i] = b2 * vr[i] + (1.0 - b2) * gi * gi;
            wr[i] *= 1.0 - lr * wd;
            let mhat = mr[i] / (1.0 - b1.powi(step as i32));
            let vhat = vr[i] / (1.0 - b2.powi(step as i32));
            wr[i] -= lr * mhat / (vhat.sqrt() + eps);
        }
    }
    let want: Vec<f32> = wr.iter().map(|x| *x as f32).collect();
    assert_close(&w, &want, 1e-5);
}
