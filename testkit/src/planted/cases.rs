//! The planted programs: a small model trained with AdamW ([`Program`]) and the cases issue 46
//! names, each a [`Planted`] with the true category of every block, plus random programs for
//! property tests ([`programs`]).
//!
//! What the program means each block as, which is what the truth says:
//!
//! - `model.to(device)` makes a weight and a bias per layer: parameters.
//! - `batch.to(device)` makes the batch: an input, freed after the step.
//! - A forward with gradients keeps each layer's `addmm` and `gelu` outputs for the backward
//!   (activations, freed as the backward passes their layer) and makes a `mul` scratch freed
//!   within the layer (a temporary). Under `no_grad` nothing is kept: every output is freed
//!   once the next layer has read it, the last after the step (all temporaries).
//! - The loss (`F.cross_entropy` at the user's line, outside any module) makes `log_softmax`'s
//!   output, which its backward saves: an activation, released by the backward. The backward
//!   begins on the calling thread with the loss's gradient (`_make_grads`), a temporary.
//! - The backward (the autograd thread) makes each layer's incoming gradient (a temporary,
//!   freed within the backward) and the layer's parameter gradients. Where a parameter has no
//!   `.grad`, even layers keep the node's output as the gradient (allocated under
//!   `MmBackward0`) and odd layers have `AccumulateGrad` copy it (allocated under
//!   `AccumulateGrad`, the node's output then a temporary); both are gradients, kept until
//!   `zero_grad` frees them. Where `.grad` exists (gradient accumulation) the node's output
//!   is added in place and freed: a temporary.
//! - AdamW's `step` makes `exp_avg` and `exp_avg_sq` per parameter on its first call (optimizer
//!   state, kept) and `torch._foreach_*` scratch on every call (temporaries freed within the
//!   step). With a closure, the closure's `zero_grad`, forward and backward run inside the
//!   step, and what they make is what they make outside it.
//!   The user's own AdamW ([`Optimizer::OutOfPlace`]) instead makes new state tensors on
//!   every step and frees the old ones there: optimizer state too, since each outlives the
//!   step that made it.
//! - `zero_grad()` (`set_to_none=True`) frees the gradients.

use proptest::prelude::*;
use vramscope_model::marks::{MODULE_ANNOTATION, PHASE_ANNOTATION};
use vramscope_model::{Category, Frame};

use super::frames::{self, cpp, py, torch_py, Stack, MODEL, OPTIMIZER, TRAIN};
use super::{Planted, Recorder, StackMode};

/// The annotation AdamW's `step` records.
pub const STEP_ANNOTATION: &str = "Optimizer.step#AdamW.step";
/// The annotation AdamW's `zero_grad` records.
pub const ZERO_GRAD_ANNOTATION: &str = "Optimizer.zero_grad#AdamW.zero_grad";

/// The shape of the planted model.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shape {
    /// Layers (each a linear layer with a weight and a bias, then a GELU).
    pub layers: usize,
    /// Bytes of one layer's weight (its gradient and each of its two AdamW states too).
    pub weight: u64,
    /// Bytes of one layer's bias.
    pub bias: u64,
    /// Bytes of one activation (an `addmm` or `gelu` output).
    pub activation: u64,
    /// Bytes of one batch.
    pub batch: u64,
}

impl Default for Shape {
    fn default() -> Shape {
        Shape {
            layers: 4,
            weight: 16 * crate::MIB,
            bias: 16 << 10,
            activation: 8 * crate::MIB,
            batch: 2 * crate::MIB,
        }
    }
}

/// The optimizer a planted program steps with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Optimizer {
    /// `torch.optim.AdamW`: its state made once by `_init_group`, updated in place by
    /// `torch._foreach_*` calls whose scratch is freed within the step.
    AdamW,
    /// The user's own AdamW (the shared `cs336` trace's, `optimizer.py` in the project, called
    /// through torch's profiling `wrapper`), which replaces each state tensor every step
    /// (`m = beta1 * m + (1 - beta1) * grad`): the new state is made inside the step and
    /// outlives it, the old is freed there.
    OutOfPlace,
}

/// A parameter on the device: its block and its gradient's, if any.
#[derive(Clone, Copy, Debug)]
struct Param {
    bytes: u64,
    grad: Option<u64>,
}

/// The planted program's state as it runs: the model's parameters, the optimizer's state, and
/// where in the program each allocation's stack is.
pub struct Program {
    /// The recording.
    pub rec: Recorder,
    /// The model's shape.
    pub shape: Shape,
    params: Vec<(u64, Param)>,
    state_made: bool,
    optimizer: Optimizer,
    /// The optimizer's state tensors, two per parameter.
    state: Vec<u64>,
    /// Whether module calls and phases are annotated as `attach()` marks them.
    marked: bool,
    /// The loss's saved intermediate of the last forward, and the caller frames of the
    /// `loss.backward()` that will consume it.
    pending_loss: Option<(u64, Vec<Frame>)>,
}

impl Program {
    /// A program recording in `mode` a model of `shape`.
    pub fn new(mode: StackMode, shape: Shape) -> Program {
        Program {
            rec: Recorder::new(mode),
            shape,
            params: Vec::new(),
            state_made: false,
            optimizer: Optimizer::AdamW,
            state: Vec::new(),
            marked: false,
            pending_loss: None,
        }
    }

    /// This program with its module calls and phases annotated as the Python face's
    /// `attach()` marks them (`vramscope_model::marks`): the model is `Model`, its layers
    /// `Model.layers.0`, ...; forwards are `forward` or `forward_no_grad`, backwards
    /// `backward`.
    pub fn with_marks(mut self) -> Program {
        self.marked = true;
        self
    }

    /// This program stepping with `optimizer`.
    pub fn with_optimizer(mut self, optimizer: Optimizer) -> Program {
        self.optimizer = optimizer;
        self
    }

    /// The frames of the loop at `line` of `train` in the training script, outermost the
    /// script's start.
    fn at_line(line: u32) -> Vec<Frame> {
        let mut frames = vec![py(TRAIN, line, "train")];
        frames.extend(frames::process_start(120));
        frames
    }

    /// `model = Model().to(device)`: the parameters, moved to the device by `Module.to`.
    pub fn load_model(&mut self) {
        let caller = [py(TRAIN, 20, "main")];
        let outer: Vec<Frame> = frames::module_to(1, &caller)
            .into_iter()
            .chain(frames::process_start(118))
            .collect();
        let stack = frames::tensor_to(&outer);
        for _ in 0..self.shape.layers {
            for bytes in [self.shape.weight, self.shape.bias] {
                let addr = self.rec.alloc(stack.frames(), bytes, Category::Parameters);
                self.params.push((addr, Param { bytes, grad: None }));
            }
        }
    }

    /// `x = batch.to(device)` at the loop's line 41: the batch, an input.
    pub fn load_batch(&mut self) -> u64 {
        let stack = frames::tensor_to(&Program::at_line(41));
        let x = self
            .rec
            .alloc(stack.frames(), self.shape.batch, Category::Inputs);
        if self.rec.mode() == StackMode::Python {
            // Python frames show the user's line, not that it copies to the device.
            self.rec.hide(x);
        }
        x
    }

    /// The stack of `op` at `line` of the model's `forward`, called from `caller`.
    fn forward_stack(op: &str, line: u32, caller: &[Frame]) -> Stack {
        let mut outer = vec![torch_py("nn/modules/linear.py", 125, "forward")];
        outer.extend(frames::module_call());
        outer.push(py(MODEL, line, "forward"));
        outer.extend(frames::module_call());
        outer.extend_from_slice(caller);
        frames::python_op(op, &outer)
    }

    /// A forward pass from `caller` over the first `layers` layers; with `grad` it returns the
    /// activations it keeps for the backward, innermost layer last. Without, it frees each
    /// output once the next layer has read it and returns the last output (a temporary, for
    /// the caller to free).
    fn forward_from(&mut self, caller: &[Frame], layers: usize, grad: bool) -> Vec<u64> {
        let mut kept = Vec::new();
        let mut previous: Option<u64> = None;
        let kept_as = if grad {
            Category::Activations
        } else {
            Category::Temporaries
        };
        let phase = format!(
            "{PHASE_ANNOTATION}{}",
            if grad { "forward" } else { "forward_no_grad" }
        );
        let model = format!("{MODULE_ANNOTATION}Model");
        self.mark(&phase, "START");
        self.mark(&model, "START");
        for layer in 0..layers {
            let module = format!("{MODULE_ANNOTATION}Model.layers.{layer}");
            self.mark(&module, "START");
            let linear = Program::forward_stack("addmm", 31, caller);
            let out = self
                .rec
                .alloc(linear.frames(), self.shape.activation, kept_as);
            if let Some(p) = previous.take() {
                self.rec.free(p, Program::forward_free(31, caller).frames());
            }
            let scratch = Program::forward_stack("mul", 32, caller);
            let s = self.rec.alloc(
                scratch.frames(),
                self.shape.activation / 2,
                Category::Temporaries,
            );
            self.rec.free(s, Program::forward_free(32, caller).frames());
            let gelu = Program::forward_stack("gelu", 33, caller);
            let act = self
                .rec
                .alloc(gelu.frames(), self.shape.activation, kept_as);
            if grad {
                kept.push(out);
                kept.push(act);
            } else {
                self.rec
                    .free(out, Program::forward_free(33, caller).frames());
                previous = Some(act);
            }
            self.mark(&module, "END");
        }
        // A forward the dump interrupts never ends.
        if layers == self.shape.layers {
            self.mark(&model, "END");
            self.mark(&phase, "END");
        }
        if let Some(p) = previous {
            kept.push(p);
        }
        kept
    }

    /// The annotation `name` at `stage`, where the program is marked as `attach()` marks it.
    fn mark(&mut self, name: &str, stage: &str) {
        if self.marked {
            self.rec.annotate(name, stage);
        }
    }

    /// `loss = model(x)` at the loop's line 44, with gradients: the activations kept.
    pub fn forward(&mut self) -> Vec<u64> {
        let caller = Program::at_line(44);
        let acts = self.forward_from(&caller, self.shape.layers, true);
        self.loss(&Program::at_line(45), Program::at_line(46));
        acts
    }

    /// `loss = F.cross_entropy(out, y)` at the user's line `caller` (outside any module):
    /// `log_softmax`'s output, which the loss's backward saves, released by the backward
    /// that `backward_caller` (the line of `loss.backward()`) runs.
    fn loss(&mut self, caller: &[Frame], backward_caller: Vec<Frame>) {
        let mut outer = vec![torch_py("nn/functional.py", 3104, "cross_entropy")];
        outer.extend_from_slice(caller);
        let stack = frames::python_op("_log_softmax", &outer);
        let saved = self.rec.alloc(
            stack.frames(),
            self.shape.activation / 4,
            Category::Activations,
        );
        self.pending_loss = Some((saved, backward_caller));
    }

    /// `out = model(x)` under `torch.no_grad()` at the loop's line 52: the output, a
    /// temporary the caller frees.
    pub fn forward_no_grad(&mut self) -> Option<u64> {
        let caller = Program::at_line(52);
        self.forward_from(&caller, self.shape.layers, false).pop()
    }

    /// A forward that the dump interrupts after `layers` layers (`loss = model(x)` at line
    /// 44): the activations kept so far stay live.
    pub fn forward_interrupted(&mut self, layers: usize) -> Vec<u64> {
        let caller = Program::at_line(44);
        let kept = self.forward_from(&caller, layers.min(self.shape.layers), true);
        for &a in &kept {
            if !self.rec.site_freed_by_backward(a) {
                self.rec.hide(a);
            }
        }
        kept
    }

    /// `loss.backward()`: on the autograd thread, layer by layer from the last, the incoming
    /// gradient, the parameter gradients (made, kept or added in place, see the module
    /// documentation) and the layer's activations freed.
    pub fn backward(&mut self, activations: Vec<u64>) {
        let phase = format!("{PHASE_ANNOTATION}backward");
        self.mark(&phase, "START");
        if let Some((saved, caller)) = self.pending_loss.take() {
            // `loss.backward()` makes the loss's gradient (`_make_grads`, on this thread),
            // then the engine runs the loss's nodes, which release it and their saved tensor.
            let mut outer = vec![
                torch_py("autograd/__init__.py", 231, "_make_grads"),
                torch_py("autograd/__init__.py", 374, "backward"),
                torch_py("_tensor.py", 631, "backward"),
            ];
            outer.extend(caller);
            let ones = self.rec.alloc(
                frames::python_op("ones_like", &outer).frames(),
                512,
                Category::Temporaries,
            );
            self.rec.free(ones, frames::inputs_released().frames());
            self.rec.free_in_backward(
                saved,
                frames::saved_released("LogSoftmaxBackward0").frames(),
            );
        }
        let mut incoming: Option<u64> = None;
        let mut acts = activations;
        for layer in (0..self.shape.layers).rev() {
            let g = self.rec.alloc(
                frames::backward_node("GeluBackward0", "gelu_backward").frames(),
                self.shape.activation,
                Category::Temporaries,
            );
            if let Some(i) = incoming.replace(g) {
                self.rec.free(i, frames::inputs_released().frames());
            }
            for k in 0..2 {
                let index = 2 * layer + k;
                let (_, param) = self.params[index];
                let node = if k == 0 {
                    "MmBackward0"
                } else {
                    "AddmmBackward0"
                };
                let op = if k == 0 { "mm" } else { "sum" };
                let stack = frames::backward_node(node, op);
                match param.grad {
                    Some(_) => {
                        // `.grad += new`, in place: the node's output is scratch.
                        let t = self
                            .rec
                            .alloc(stack.frames(), param.bytes, Category::Temporaries);
                        self.rec.free(t, frames::accumulate_released().frames());
                    }
                    None if layer % 2 == 0 => {
                        let grad = self
                            .rec
                            .alloc(stack.frames(), param.bytes, Category::Gradients);
                        self.params[index].1.grad = Some(grad);
                    }
                    None => {
                        let t = self
                            .rec
                            .alloc(stack.frames(), param.bytes, Category::Temporaries);
                        let grad = self.rec.alloc(
                            frames::accumulate_grad().frames(),
                            param.bytes,
                            Category::Gradients,
                        );
                        self.rec.free(t, frames::accumulate_released().frames());
                        self.params[index].1.grad = Some(grad);
                    }
                }
            }
            for node in ["GeluBackward0", "AddmmBackward0"] {
                if let Some(a) = acts.pop() {
                    self.rec
                        .free_in_backward(a, frames::saved_released(node).frames());
                }
            }
        }
        if let Some(i) = incoming {
            self.rec.free(i, frames::inputs_released().frames());
        }
        // Activations of layers the pass did not reach (none in a whole forward).
        for a in acts {
            self.rec
                .free_in_backward(a, frames::saved_released("AddmmBackward0").frames());
        }
        self.mark(&phase, "END");
    }

    /// `optimizer.zero_grad()` (`set_to_none=True`) at the loop's line 43: the gradients
    /// freed, inside its annotation.
    pub fn zero_grad(&mut self) {
        self.zero_grad_from(&Program::at_line(43));
    }

    /// `optimizer.zero_grad()` called from `caller`.
    fn zero_grad_from(&mut self, caller: &[Frame]) {
        self.rec.annotate(ZERO_GRAD_ANNOTATION, "START");
        let stack = frames::python_free(&frames::zero_grad(caller));
        for index in 0..self.params.len() {
            if let Some(grad) = self.params[index].1.grad.take() {
                self.rec.free(grad, stack.frames());
            }
        }
        self.rec.annotate(ZERO_GRAD_ANNOTATION, "END");
    }

    /// The stack of a tensor dropped at `line` of the model's `forward`, called from `caller`.
    fn forward_free(line: u32, caller: &[Frame]) -> Stack {
        let mut outer = vec![py(MODEL, line, "forward")];
        outer.extend(frames::module_call());
        outer.extend_from_slice(caller);
        frames::python_free(&outer)
    }

    /// The optimizer's update inside its step, called from `caller`: for `torch.optim.AdamW`
    /// the state on the first call and the foreach scratch every call; for the user's own,
    /// the state replaced and a scratch per parameter.
    fn adamw_update(&mut self, caller: &[Frame]) {
        if self.optimizer == Optimizer::OutOfPlace {
            self.out_of_place_update(caller);
            return;
        }
        if !self.state_made {
            let stack = frames::python_op("zeros_like", &frames::adamw_init_group(caller));
            let bytes: Vec<u64> = self.params.iter().map(|(_, p)| p.bytes).collect();
            for b in bytes {
                for _ in 0..2 {
                    self.rec.alloc(stack.frames(), b, Category::OptimizerState);
                }
            }
            self.state_made = true;
        }
        let foreach = frames::alloc_frames("_foreach_sqrt")
            .then_cpp(&[cpp(
                "torch::autograd::THPVariable__foreach_sqrt(_object*, _object*, _object*)",
            )])
            .then(&frames::adamw_update(caller));
        let bytes: Vec<u64> = self.params.iter().map(|(_, p)| p.bytes).collect();
        let scratch: Vec<u64> = bytes
            .into_iter()
            .map(|b| self.rec.alloc(foreach.frames(), b, Category::Temporaries))
            .collect();
        let dropped = frames::python_free(&frames::adamw_update(caller));
        for s in scratch {
            self.rec.free(s, dropped.frames());
        }
    }

    /// The user's own AdamW's update (`optimizer.py`, called through torch's `wrapper` from
    /// `caller`): per parameter, new `m` and `v` made (the old freed) and a scratch
    /// `v.sqrt()` made and freed.
    fn out_of_place_update(&mut self, caller: &[Frame]) {
        let mut outer = vec![
            py(OPTIMIZER, 76, "step"),
            torch_py("optim/optimizer.py", 533, "wrapper"),
        ];
        outer.extend_from_slice(caller);
        let update = frames::python_op("mul", &outer);
        let replaced = frames::python_free(&outer);
        outer[0].line = 80;
        let sqrt = frames::python_op("sqrt", &outer);
        let dropped = frames::python_free(&outer);
        let bytes: Vec<u64> = self.params.iter().map(|(_, p)| p.bytes).collect();
        let mut state = Vec::with_capacity(2 * bytes.len());
        for (k, b) in bytes.into_iter().enumerate() {
            for j in 0..2 {
                let new = self.rec.alloc(update.frames(), b, Category::OptimizerState);
                if let Some(&old) = self.state.get(2 * k + j) {
                    self.rec.free(old, replaced.frames());
                }
                state.push(new);
            }
            let scratch = self.rec.alloc(sqrt.frames(), b, Category::Temporaries);
            self.rec.free(scratch, dropped.frames());
        }
        self.state = state;
        self.state_made = true;
    }

    /// `optimizer.step()` at the loop's line 47, inside its annotation.
    pub fn step(&mut self) {
        self.rec.annotate(STEP_ANNOTATION, "START");
        let caller = Program::at_line(47);
        self.adamw_update(&caller);
        self.rec.annotate(STEP_ANNOTATION, "END");
    }

    /// `optimizer.step(closure)` at the loop's line 47, where the closure runs
    /// `optimizer.zero_grad()`, `loss = model(x)` (its line 60) and `loss.backward()` inside
    /// the step, before the update.
    pub fn step_with_closure(&mut self) {
        self.rec.annotate(STEP_ANNOTATION, "START");
        let caller = Program::at_line(47);
        self.zero_grad_from(&frames::in_closure(58, &caller));
        let in_closure = frames::in_closure(60, &caller);
        let acts = self.forward_from(&in_closure, self.shape.layers, true);
        self.loss(
            &frames::in_closure(61, &caller),
            frames::in_closure(62, &caller),
        );
        self.backward(acts);
        self.adamw_update(&caller);
        self.rec.annotate(STEP_ANNOTATION, "END");
    }

    /// One training step: `zero_grad`, `micro` micro-batches of batch, forward and backward,
    /// then `optimizer.step()`; the batches freed as the next replaces them and after the
    /// step.
    pub fn train_step(&mut self, micro: usize) {
        self.zero_grad();
        let mut batch: Option<u64> = None;
        for _ in 0..micro.max(1) {
            let x = self.load_batch();
            if let Some(b) = batch.replace(x) {
                self.rec
                    .free(b, frames::python_free(&Program::at_line(41)).frames());
            }
            let acts = self.forward();
            self.backward(acts);
        }
        self.step();
        if let Some(b) = batch {
            self.rec
                .free(b, frames::python_free(&Program::at_line(48)).frames());
        }
    }

    /// One training step whose forward and backward run in `optimizer.step(closure)`.
    pub fn train_step_with_closure(&mut self) {
        let x = self.load_batch();
        self.step_with_closure();
        self.rec
            .free(x, frames::python_free(&Program::at_line(48)).frames());
    }

    /// One inference step under `torch.no_grad()`: batch, forward, output read and freed.
    pub fn inference_step(&mut self) {
        let x = self.load_batch();
        if let Some(out) = self.forward_no_grad() {
            self.rec
                .free(out, frames::python_free(&Program::at_line(53)).frames());
        }
        self.rec
            .free(x, frames::python_free(&Program::at_line(54)).frames());
    }

    /// The case named `name`.
    pub fn finish(self, name: &str) -> Planted {
        self.rec.finish(name)
    }
}

/// A training run with AdamW: the model loaded, then `steps` steps of `zero_grad`, batch,
/// forward, backward and `optimizer.step()`; the dump after the last step holds parameters,
/// gradients and optimizer state.
pub fn adamw_training(mode: StackMode, steps: usize) -> Planted {
    let mut p = Program::new(mode, Shape::default());
    p.load_model();
    for _ in 0..steps {
        p.train_step(1);
    }
    p.finish("adamw_training")
}

/// Gradient accumulation: `steps` steps of `micro` micro-batches each; the first micro-batch
/// makes the gradients, the others add into them.
pub fn gradient_accumulation(mode: StackMode, steps: usize, micro: usize) -> Planted {
    let mut p = Program::new(mode, Shape::default());
    p.load_model();
    for _ in 0..steps {
        p.train_step(micro);
    }
    p.finish("gradient_accumulation")
}

/// `optimizer.step(closure)`: the forward and backward run inside the optimizer's step and
/// make activations, gradients and temporaries there, not optimizer state.
pub fn step_with_closure(mode: StackMode, steps: usize) -> Planted {
    let mut p = Program::new(mode, Shape::default());
    p.load_model();
    for _ in 0..steps {
        p.train_step_with_closure();
    }
    p.finish("step_with_closure")
}

/// A dump taken in the middle of a forward: `steps` whole steps, then the next step's
/// `zero_grad`, batch and a forward through half the layers, whose activations are live.
pub fn mid_forward(mode: StackMode, steps: usize) -> Planted {
    let mut p = Program::new(mode, Shape::default());
    p.load_model();
    for _ in 0..steps {
        p.train_step(1);
    }
    p.zero_grad();
    let _batch = p.load_batch();
    let half = p.shape.layers / 2;
    let _live = p.forward_interrupted(half.max(1));
    p.finish("mid_forward")
}

/// Training with the user's own AdamW, which replaces its state every step (as in the shared
/// `cs336` trace): the state made inside each step outlives it, optimizer state all the same.
pub fn custom_optimizer(mode: StackMode, steps: usize) -> Planted {
    let mut p = Program::new(mode, Shape::default()).with_optimizer(Optimizer::OutOfPlace);
    p.load_model();
    for _ in 0..steps {
        p.train_step(1);
    }
    p.finish("custom_optimizer")
}

/// Inference under `torch.no_grad()`: the model loaded, then `steps` batches through it;
/// nothing but parameters outlives a step.
pub fn inference_no_grad(mode: StackMode, steps: usize) -> Planted {
    let mut p = Program::new(mode, Shape::default());
    p.load_model();
    for _ in 0..steps {
        p.inference_step();
    }
    p.finish("inference_no_grad")
}

/// A late recording: `before` training steps run before recording began, `after` recorded.
/// The parameters, optimizer state and gradients from before are live when it begins
/// (before-trace blocks); the first recorded `zero_grad` frees the gradients among them.
pub fn late_recording(mode: StackMode, before: usize, after: usize) -> Planted {
    late_recording_with(Optimizer::AdamW, mode, before, after, "late_recording")
}

/// A late recording of a program stepping with `optimizer`, named `name`.
fn late_recording_with(
    optimizer: Optimizer,
    mode: StackMode,
    before: usize,
    after: usize,
    name: &str,
) -> Planted {
    let mut p = Program::new(mode, Shape::default()).with_optimizer(optimizer);
    p.load_model();
    for _ in 0..before {
        p.train_step(1);
    }
    p.rec.start_recording();
    for _ in 0..after {
        p.train_step(1);
    }
    p.finish(name)
}

/// A late recording of a program that steps with the user's own optimizer, which replaces
/// its state every step (the shared `cs336` trace's shape): of the blocks from before the
/// recording only the parameters live through it, and the recorded backward makes one
/// gradient of each one's size, which shows which blocks they are ([`super::Truth`]).
pub fn late_recording_own_optimizer(mode: StackMode, before: usize, after: usize) -> Planted {
    late_recording_with(
        Optimizer::OutOfPlace,
        mode,
        before,
        after,
        "late_recording_own_optimizer",
    )
}

/// Every case the issue names, and training with the user's own optimizer, with stacks as
/// `mode` records them.
pub fn all_cases(mode: StackMode) -> Vec<Planted> {
    vec![
        adamw_training(mode, 3),
        gradient_accumulation(mode, 2, 3),
        step_with_closure(mode, 3),
        mid_forward(mode, 2),
        inference_no_grad(mode, 3),
        late_recording(mode, 2, 2),
        late_recording_own_optimizer(mode, 2, 2),
        custom_optimizer(mode, 3),
    ]
}

/// One part of a random program ([`programs`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Part {
    /// A training step of this many micro-batches.
    Train(usize),
    /// A training step through `optimizer.step(closure)`.
    Closure,
    /// An inference step under `no_grad`.
    Inference,
    /// Recording begins here (the first of these; the others do nothing).
    StartRecording,
}

/// A random program: the stack mode, the model's shape, the optimizer, whether it is marked
/// as `attach()` marks programs, and its parts after the model is loaded; ending, when `interrupted`, in a forward cut after `interrupted` layers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProgramSpec {
    /// The stack mode.
    pub mode: StackMode,
    /// The model's shape.
    pub shape: Shape,
    /// The optimizer.
    pub optimizer: Optimizer,
    /// Whether module calls and phases are marked as `attach()` marks them.
    pub marked: bool,
    /// The parts, in order.
    pub parts: Vec<Part>,
    /// Layers of a forward the dump interrupts at the end, if any.
    pub interrupted: Option<usize>,
}

impl ProgramSpec {
    /// Runs the program and returns its case.
    pub fn run(&self) -> Planted {
        let mut p = Program::new(self.mode, self.shape).with_optimizer(self.optimizer);
        if self.marked {
            p = p.with_marks();
        }
        p.load_model();
        let mut started = false;
        for part in &self.parts {
            match *part {
                Part::Train(micro) => p.train_step(micro),
                Part::Closure => p.train_step_with_closure(),
                Part::Inference => p.inference_step(),
                Part::StartRecording => {
                    if !started {
                        p.rec.start_recording();
                        started = true;
                    }
                }
            }
        }
        if let Some(layers) = self.interrupted {
            p.zero_grad();
            p.load_batch();
            p.forward_interrupted(layers);
        }
        p.finish("random_program")
    }
}

/// Random programs of up to `max_parts` parts on models of 1 to 4 layers of sizes from 512
/// bytes (the small pool) to 24 MiB (past a 20 MiB segment).
pub fn programs(max_parts: usize) -> impl Strategy<Value = ProgramSpec> {
    let part = prop_oneof![
        (1usize..4).prop_map(Part::Train),
        Just(Part::Closure),
        Just(Part::Inference),
        Just(Part::StartRecording),
    ];
    let shape = (1usize..5, 1u64..49, 1u64..2049, 1u64..17, 1u64..9).prop_map(
        |(layers, weight_halves, bias_units, act_mib, batch_units)| Shape {
            layers,
            weight: weight_halves << 19,
            bias: bias_units * 512,
            activation: act_mib << 19,
            batch: batch_units * 1000,
        },
    );
    (
        prop_oneof![Just(StackMode::All), Just(StackMode::Python)],
        shape,
        prop_oneof![Just(Optimizer::AdamW), Just(Optimizer::OutOfPlace)],
        proptest::bool::ANY,
        proptest::collection::vec(part, 0..=max_parts),
        proptest::option::of(1usize..5),
    )
        .prop_map(
            |(mode, shape, optimizer, marked, parts, interrupted)| ProgramSpec {
                mode,
                shape,
                optimizer,
                marked,
                parts,
                interrupted: interrupted.map(|l| l.min(shape.layers)),
            },
        )
}
