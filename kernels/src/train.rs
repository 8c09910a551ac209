//! A small MLP trained on synthetic data: the workload behind `examples/train_mlp.rs`.
//!
//! Two layers (`inputs → hidden → classes`, relu between) learn to classify random points by a
//! random linear teacher, with softmax cross-entropy and SGD or AdamW, entirely through
//! `crate::tensor`, so every activation, gradient and optimizer state is an allocator block
//! recorded at the line below that made it. Options reproduce what practitioners do and get
//! wrong: [`TrainConfig::retain_loss`] keeps every step's loss tensor alive (the classic
//! `losses.append(loss)`), [`TrainConfig::item_in_loop`] reads values to the host element by
//! element every step (`loss.item()`, `print(logits[0, i])`), [`TrainConfig::grad_accum`] adds
//! gradient-accumulation buffers, and [`TrainConfig::bf16`] keeps activations and weight copies
//! in bf16 with f32 master weights. The inspector's detectors should point at the marked lines.
//!
//! Each part of the step runs in an allocator scope that names what its blocks are
//! (`vramscope_model::Category::from_scope`): `parameters`, `optimizer` (AdamW's moments),
//! `gradients` (the weights' gradients and accumulation buffers), `inputs` (the batch),
//! `activations` (what the forward keeps for the backward, the bf16 weight copies among it) and
//! `temporaries` (the backward's intermediate gradients), so that every view can say what the
//! memory is made of. The loss and the planted bugs' tensors are left in no such scope: what
//! they are is what the findings say.

use vramscope_model::Snapshot;

use crate::cpu::AdamW;
use crate::device::Device;
use crate::dtype::DType;
use crate::tensor::{Tensor, TensorError};

/// The optimizer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Optimizer {
    /// Plain SGD.
    Sgd,
    /// AdamW (two f32 moments per weight).
    AdamW,
}

/// What to train and which mistakes to make.
#[derive(Clone, Debug, PartialEq)]
pub struct TrainConfig {
    /// Optimizer steps.
    pub steps: usize,
    /// Samples per micro-batch.
    pub batch: usize,
    /// Input features.
    pub inputs: usize,
    /// Hidden units.
    pub hidden: usize,
    /// Classes.
    pub classes: usize,
    /// The optimizer.
    pub optimizer: Optimizer,
    /// Learning rate.
    pub lr: f32,
    /// Micro-batches per optimizer step (1 = no accumulation).
    pub grad_accum: usize,
    /// bf16 activations and weight copies, f32 master weights and gradients.
    pub bf16: bool,
    /// Planted bug: keep every step's loss tensor alive.
    pub retain_loss: bool,
    /// With `retain_loss`, also keep what the loss's autograd graph would hold in PyTorch (the
    /// hidden activations and the logits), so the leak grows by megabytes per step.
    pub retain_graph: bool,
    /// Planted bug: read the loss and the first two samples' logits to the host, element by
    /// element, every micro-batch.
    pub item_in_loop: bool,
    /// Seed of the data and the initial weights.
    pub seed: u64,
    /// Steps per logged loss (the only host reads of a correct run).
    pub log_every: usize,
}

impl Default for TrainConfig {
    fn default() -> Self {
        TrainConfig {
            steps: 200,
            batch: 64,
            inputs: 32,
            hidden: 128,
            classes: 8,
            optimizer: Optimizer::AdamW,
            lr: 5e-3,
            grad_accum: 1,
            bf16: false,
            retain_loss: false,
            retain_graph: false,
            item_in_loop: false,
            seed: 7,
            log_every: 20,
        }
    }
}

/// What a run did.
#[derive(Clone, Debug, PartialEq)]
pub struct TrainReport {
    /// `(step, mean loss over the steps since the previous entry)`, one per log interval.
    pub history: Vec<(usize, f32)>,
    /// The per-micro-batch losses read with `item()` (only with `item_in_loop`).
    pub item_losses: Vec<f32>,
    /// Loss tensors still alive at the end (only with `retain_loss`).
    pub retained_losses: usize,
    /// Peak bytes allocated by the device's allocator.
    pub peak_allocated: u64,
    /// Bytes still allocated at the end of training, before the model is dropped.
    pub allocated_at_end: u64,
    /// Bytes of parameters, gradient buffers and optimizer state that live across steps.
    pub persistent_bytes: u64,
    /// The allocator's snapshot at the end of training, taken while the model (and whatever
    /// the run kept alive) still holds its memory.
    pub snapshot: Snapshot,
}

impl TrainReport {
    /// The first logged mean loss.
    pub fn first_loss(&self) -> Option<f32> {
        self.history.first().map(|h| h.1)
    }

    /// The last logged mean loss.
    pub fn final_loss(&self) -> Option<f32> {
        self.history.last().map(|h| h.1)
    }
}

/// A small, seeded generator (xorshift64*), so runs are reproducible without a dependency.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform in [-1, 1).
    fn uniform(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }
}

/// Random points labelled by the arg-max of a fixed random linear map.
struct Teacher {
    weights: Vec<f32>,
    inputs: usize,
    classes: usize,
    rng: Rng,
}

impl Teacher {
    fn new(inputs: usize, classes: usize, seed: u64) -> Teacher {
        let mut rng = Rng::new(seed ^ 0x5eed);
        let weights = (0..inputs * classes).map(|_| rng.uniform()).collect();
        Teacher {
            weights,
            inputs,
            classes,
            rng,
        }
    }

    fn batch(&mut self, n: usize) -> (Vec<f32>, Vec<f32>) {
        let xs: Vec<f32> = (0..n * self.inputs).map(|_| self.rng.uniform()).collect();
        let labels = xs
            .chunks_exact(self.inputs)
            .map(|x| {
                let score = |c: usize| -> f32 {
                    x.iter()
                        .enumerate()
                        .map(|(i, v)| v * self.weights[i * self.classes + c])
                        .sum()
                };
                (0..self.classes)
                    .max_by(|&a, &b| score(a).total_cmp(&score(b)))
                    .unwrap_or(0) as f32
            })
            .collect();
        (xs, labels)
    }
}

/// One weight or bias with its optimizer state and accumulation buffer.
struct Param {
    value: Tensor,
    m: Option<Tensor>,
    v: Option<Tensor>,
    accum: Option<Tensor>,
}

impl Param {
    #[track_caller]
    fn new(
        device: &Device,
        shape: &[usize],
        init: Vec<f32>,
        config: &TrainConfig,
    ) -> Result<Param, TensorError> {
        let adam = config.optimizer == Optimizer::AdamW;
        let allocator = device.allocator();
        let value = {
            let _parameters = allocator.scope("parameters");
            Tensor::from_host(device, &init, shape, DType::F32)?
        };
        let optimizer = allocator.scope("optimizer");
        let m = if adam {
            Some(Tensor::zeros(device, shape, DType::F32)?)
        } else {
            None
        };
        let v = if adam {
            Some(Tensor::zeros(device, shape, DType::F32)?)
        } else {
            None
        };
        drop(optimizer);
        let _gradients = allocator.scope("gradients");
        let accum = if config.grad_accum > 1 {
            Some(Tensor::zeros(device, shape, DType::F32)?)
        } else {
            None
        };
        Ok(Param { value, m, v, accum })
    }

    fn bytes(&self) -> u64 {
        [
            Some(&self.value),
            self.m.as_ref(),
            self.v.as_ref(),
            self.accum.as_ref(),
        ]
        .into_iter()
        .flatten()
        .map(|t| t.byte_len() as u64)
        .sum()
    }

    /// Adds this micro-batch's gradient to the accumulation buffer, or applies it at once.
    fn take_grad(
        &mut self,
        grad: Tensor,
        config: &TrainConfig,
        step: u32,
    ) -> Result<(), TensorError> {
        match &mut self.accum {
            Some(accum) => accum.axpy(1.0 / config.grad_accum as f32, &grad),
            None => self.apply(&grad, config, step),
        }
    }

    /// Applies the accumulated gradient and clears the buffer.
    fn finish_step(&mut self, config: &TrainConfig, step: u32) -> Result<(), TensorError> {
        if let Some(mut accum) = self.accum.take() {
            self.apply(&accum, config, step)?;
            accum.fill(0.0)?;
            self.accum = Some(accum);
        }
        Ok(())
    }

    fn apply(&mut self, grad: &Tensor, config: &TrainConfig, step: u32) -> Result<(), TensorError> {
        match (&mut self.m, &mut self.v) {
            (Some(m), Some(v)) => {
                let params = AdamW {
                    lr: config.lr,
                    weight_decay: 0.0,
                    ..AdamW::default()
                };
                self.value.adamw_step(grad, m, v, &params, step)
            }
            _ => self.value.sgd_step(grad, config.lr, 0.0),
        }
    }
}

fn init_weights(rng: &mut Rng, fan_in: usize, count: usize) -> Vec<f32> {
    let bound = 1.0 / (fan_in.max(1) as f32).sqrt();
    (0..count).map(|_| rng.uniform() * bound).collect()
}

/// Callbacks into a training run.
pub struct TrainHooks<'a> {
    /// Called before each step with its index; `false` ends the run early.
    pub before_step: &'a mut dyn FnMut(usize) -> bool,
    /// Called once after the last step, while everything the run keeps is still alive.
    pub at_end: &'a mut dyn FnMut(),
}

/// Trains the MLP on `device` and reports the loss history and memory use.
pub fn train(device: &Device, config: &TrainConfig) -> Result<TrainReport, TensorError> {
    train_with(
        device,
        config,
        TrainHooks {
            before_step: &mut |_| true,
            at_end: &mut || {},
        },
    )
}

/// [`train`] with callbacks: the demo paces its steps beside the dashboard and lingers at the
/// end with the retained tensors alive.
pub fn train_with(
    device: &Device,
    config: &TrainConfig,
    hooks: TrainHooks<'_>,
) -> Result<TrainReport, TensorError> {
    let (d, h, c, b) = (config.inputs, config.hidden, config.classes, config.batch);
    let accum_steps = config.grad_accum.max(1);
    let act = if config.bf16 { DType::BF16 } else { DType::F32 };
    let mut rng = Rng::new(config.seed);
    let mut teacher = Teacher::new(d, c, config.seed);

    let mut w1 = Param::new(device, &[d, h], init_weights(&mut rng, d, d * h), config)?;
    let mut b1 = Param::new(device, &[h], vec![0.0; h], config)?;
    let mut w2 = Param::new(device, &[h, c], init_weights(&mut rng, h, h * c), config)?;
    let mut b2 = Param::new(device, &[c], vec![0.0; c], config)?;
    let persistent_bytes = [&w1, &b1, &w2, &b2].iter().map(|p| p.bytes()).sum();

    let mut history = Vec::new();
    let mut item_losses = Vec::new();
    let mut retained: Vec<Tensor> = Vec::new();
    let mut retained_losses = 0;
    let mut running = Tensor::zeros(device, &[], DType::F32)?;
    let mut window = 0usize;
    let log_every = config.log_every.max(1);

    for step in 0..config.steps {
        if !(hooks.before_step)(step) {
            break;
        }
        device.mark_step();
        let adam_step = step as u32 + 1;
        for _ in 0..accum_steps {
            let allocator = device.allocator();
            let (xs, ys) = teacher.batch(b);
            let inputs = allocator.scope("inputs");
            let x = Tensor::from_host(device, &xs, &[b, d], act)?;
            let labels = Tensor::from_host(device, &ys, &[b], DType::F32)?;
            drop(inputs);

            // Forward. In bf16 mode the f32 master weights are cast for this micro-batch.
            let activations = allocator.scope("activations");
            let w1c = if config.bf16 {
                Some(w1.value.to_dtype(act)?)
            } else {
                None
            };
            let w2c = if config.bf16 {
                Some(w2.value.to_dtype(act)?)
            } else {
                None
            };
            let w1v = w1c.as_ref().unwrap_or(&w1.value);
            let w2v = w2c.as_ref().unwrap_or(&w2.value);
            let pre1 = x.matmul(w1v)?.add_bias(&b1.value)?;
            let hidden = pre1.relu()?;
            let logits = hidden.matmul(w2v)?.add_bias(&b2.value)?;
            drop(activations);
            // With `retain_loss`, the loss made on this line is kept alive below; an
            // allocation-site report names this line.
            let (loss, dlogits) = logits.softmax_cross_entropy(&labels)?;

            // Backward: gradients of the master weights in f32.
            let gradients = allocator.scope("gradients");
            let dw2 = hidden.matmul_ex(&dlogits, true, false, DType::F32)?;
            let db2 = dlogits.sum_rows()?;
            let temporaries = allocator.scope("temporaries");
            let dhidden = dlogits.matmul_ex(w2v, false, true, act)?;
            let dpre1 = Tensor::relu_backward(&dhidden, &pre1)?;
            drop(temporaries);
            let dw1 = x.matmul_ex(&dpre1, true, false, DType::F32)?;
            let db1 = dpre1.sum_rows()?;
            drop(gradients);
            w2.take_grad(dw2, config, adam_step)?;
            b2.take_grad(db2, config, adam_step)?;
            w1.take_grad(dw1, config, adam_step)?;
            b1.take_grad(db1, config, adam_step)?;

            // The correct way to track the loss: accumulate on the device, read it rarely.
            running.axpy(1.0 / accum_steps as f32, &loss)?;

            if config.item_in_loop {
                // PLANTED BUG (item-in-loop): a host sync for the loss and one per logit element
                // of the first two samples, every micro-batch.
                item_losses.push(loss.item()?);
                let mut shown = Vec::with_capacity(2 * c);
                for i in 0..(2 * c).min(logits.numel()) {
                    shown.push(logits.element(i)?.item()?);
                }
                std::hint::black_box(shown);
            }
            if config.retain_loss {
                // PLANTED BUG (retain-loss): every step's loss tensor stays alive, like
                // `losses.append(loss)` in PyTorch.
                retained.push(loss);
                retained_losses += 1;
                if config.retain_graph {
                    retained.push(hidden);
                    retained.push(logits);
                }
            }
        }
        for p in [&mut w1, &mut b1, &mut w2, &mut b2] {
            p.finish_step(config, adam_step)?;
        }
        window += 1;
        if (step + 1) % log_every == 0 || step + 1 == config.steps {
            let mean = running.item()? / window as f32;
            history.push((step + 1, mean));
            running.fill(0.0)?;
            window = 0;
        }
    }

    (hooks.at_end)();
    let stats = device.allocator().stats();
    Ok(TrainReport {
        history,
        item_losses,
        retained_losses,
        peak_allocated: stats.allocated_bytes.all.peak,
        allocated_at_end: stats.allocated_bytes.all.current,
        persistent_bytes,
        snapshot: device.allocator().snapshot(),
    })
}
