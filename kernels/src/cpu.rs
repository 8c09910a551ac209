//! CPU implementations of every kernel, on f32 slices.
//!
//! These are the twins of the CUDA kernels in `kernels/cuda/*.cu`: the same operations in the
//! same order of arithmetic, so a CUDA test can compare the two. `crate::tensor` runs them on
//! the backed simulated device (reading and writing the device memory behind the tensors), and
//! on a CUDA device whose kernels could not be compiled. Every function checks nothing beyond
//! what its slice lengths imply; `crate::tensor` validates shapes before calling.

/// Fills `out` with `value`.
pub fn fill(out: &mut [f32], value: f32) {
    out.fill(value);
}

/// `y = alpha * x + y`.
pub fn axpy(alpha: f32, x: &[f32], y: &mut [f32]) {
    for (yi, xi) in y.iter_mut().zip(x) {
        *yi += alpha * xi;
    }
}

/// `y = alpha * y`.
pub fn scale(alpha: f32, y: &mut [f32]) {
    for yi in y {
        *yi *= alpha;
    }
}

/// Tile edge of [`matmul`]: 32 × 32 f32 tiles of each operand fit in L1 together.
pub const TILE: usize = 32;

/// `c (m × n) = op(a) (m × k) · op(b) (k × n)`, where `op` transposes a row-major operand when
/// its flag is set (`a` is then stored k × m, `b` n × k). Blocked in [`TILE`]-sized tiles;
/// accumulation is in f32.
#[allow(clippy::too_many_arguments)]
pub fn matmul(
    a: &[f32],
    b: &[f32],
    c: &mut [f32],
    m: usize,
    n: usize,
    k: usize,
    trans_a: bool,
    trans_b: bool,
) {
    let a_at = |i: usize, p: usize| if trans_a { a[p * m + i] } else { a[i * k + p] };
    let b_at = |p: usize, j: usize| if trans_b { b[j * k + p] } else { b[p * n + j] };
    c[..m * n].fill(0.0);
    for i0 in (0..m).step_by(TILE) {
        for p0 in (0..k).step_by(TILE) {
            for j0 in (0..n).step_by(TILE) {
                for i in i0..(i0 + TILE).min(m) {
                    for p in p0..(p0 + TILE).min(k) {
                        let av = a_at(i, p);
                        let row = &mut c[i * n..(i + 1) * n];
                        for (j, cj) in row.iter_mut().enumerate().take((j0 + TILE).min(n)).skip(j0)
                        {
                            *cj += av * b_at(p, j);
                        }
                    }
                }
            }
        }
    }
}

/// `out[r][c] = x[r][c] + bias[c]` for a row-major `x` with `bias.len()` columns.
pub fn add_bias(x: &[f32], bias: &[f32], out: &mut [f32]) {
    let cols = bias.len().max(1);
    for (i, (o, xi)) in out.iter_mut().zip(x).enumerate() {
        *o = xi + bias[i % cols];
    }
}

/// `out = max(x, 0)` (NaN becomes 0, as in the CUDA kernel).
pub fn relu(x: &[f32], out: &mut [f32]) {
    for (o, v) in out.iter_mut().zip(x) {
        *o = if *v > 0.0 { *v } else { 0.0 };
    }
}

/// `out = grad` where `input > 0`, else 0.
pub fn relu_backward(grad: &[f32], input: &[f32], out: &mut [f32]) {
    for ((o, g), v) in out.iter_mut().zip(grad).zip(input) {
        *o = if *v > 0.0 { *g } else { 0.0 };
    }
}

/// Softmax cross-entropy of row-major `logits` (`labels.len()` rows of `cols` classes) against
/// class indices stored as floats. Writes each row's loss to `loss_rows` and the gradient
/// `(softmax − one_hot) · grad_scale` to `grad`. An invalid label makes its row NaN.
pub fn softmax_cross_entropy(
    logits: &[f32],
    labels: &[f32],
    cols: usize,
    loss_rows: &mut [f32],
    grad: &mut [f32],
    grad_scale: f32,
) {
    for (r, (&label_f, loss)) in labels.iter().zip(loss_rows.iter_mut()).enumerate() {
        let row = &logits[r * cols..(r + 1) * cols];
        let g = &mut grad[r * cols..(r + 1) * cols];
        let mx = row.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
        let total: f32 = row.iter().map(|&v| (v - mx).exp()).sum();
        let lse = mx + total.ln();
        let valid = label_f >= 0.0 && label_f < cols as f32 && label_f.floor() == label_f;
        let label = if valid { label_f as usize } else { 0 };
        *loss = if valid { lse - row[label] } else { f32::NAN };
        for (c, (gc, &v)) in g.iter_mut().zip(row).enumerate() {
            let p = (v - lse).exp();
            let one_hot = if c == label { 1.0 } else { 0.0 };
            *gc = if valid {
                (p - one_hot) * grad_scale
            } else {
                f32::NAN
            };
        }
    }
}

/// The sum of `x`, accumulated in f64 and rounded once.
pub fn sum(x: &[f32]) -> f32 {
    x.iter().map(|&v| f64::from(v)).sum::<f64>() as f32
}

/// `out[c] = Σ_r x[r][c]` for a row-major `x` with `out.len()` columns.
pub fn sum_rows(x: &[f32], out: &mut [f32]) {
    out.fill(0.0);
    let cols = out.len();
    if cols == 0 {
        return;
    }
    for row in x.chunks_exact(cols) {
        for (o, v) in out.iter_mut().zip(row) {
            *o += v;
        }
    }
}

/// SGD with weight decay: `w −= lr · (g + weight_decay · w)`.
pub fn sgd(w: &mut [f32], g: &[f32], lr: f32, weight_decay: f32) {
    for (wi, gi) in w.iter_mut().zip(g) {
        *wi -= lr * (gi + weight_decay * *wi);
    }
}

/// AdamW's hyper-parameters.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdamW {
    /// Learning rate.
    pub lr: f32,
    /// Decay of the first moment.
    pub beta1: f32,
    /// Decay of the second moment.
    pub beta2: f32,
    /// Added to the root of the second moment.
    pub eps: f32,
    /// Decoupled weight decay.
    pub weight_decay: f32,
}

impl Default for AdamW {
    /// PyTorch's defaults: lr 1e-3, betas (0.9, 0.999), eps 1e-8, weight decay 1e-2.
    fn default() -> Self {
        AdamW {
            lr: 1e-3,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 1e-2,
        }
    }
}

impl AdamW {
    /// The bias corrections `(1 − β1^step, 1 − β2^step)` for a 1-based `step`.
    pub fn bias_corrections(&self, step: u32) -> (f32, f32) {
        let step = step.max(1) as i32;
        (1.0 - self.beta1.powi(step), 1.0 - self.beta2.powi(step))
    }
}

/// One AdamW step (1-based `step`) on `w` with gradient `g` and moments `m`, `v`.
pub fn adamw(w: &mut [f32], g: &[f32], m: &mut [f32], v: &mut [f32], p: &AdamW, step: u32) {
    let (bc1, bc2) = p.bias_corrections(step);
    for (((wi, gi), mi), vi) in w.iter_mut().zip(g).zip(m.iter_mut()).zip(v.iter_mut()) {
        *mi = p.beta1 * *mi + (1.0 - p.beta1) * gi;
        *vi = p.beta2 * *vi + (1.0 - p.beta2) * gi * gi;
        *wi -= p.lr * p.weight_decay * *wi;
        *wi -= p.lr * (*mi / bc1) / ((*vi / bc2).sqrt() + p.eps);
    }
}
