//! The stacks of a PyTorch program as `torch.cuda.memory._record_memory_history` records them
//! and the PyTorch importer turns them into [`Frame`]s: innermost frame first; C++ frames with
//! file `??`, an empty file or a bare `.cpp` name and line 0 (the unwinder's symbols, as in the
//! shared `cs336` trace); Python frames with their file and line, each followed by the
//! interpreter's `_PyEval_EvalFrameDefault` in `stacks="all"` mode; torch's own Python under
//! `site-packages/torch/`; the autograd thread's stacks C++ only, ending in `__clone`.
//!
//! A stack is built from the inside out: [`alloc_frames`] (the allocator and the op), then the
//! Python binding of the op ([`binding`]), then Python frames ([`py`], [`torch_py`]) with the
//! callers of the program's loop ([`Stack::then`]).

use vramscope_model::Frame;

/// Where the planted program's torch lives.
pub const TORCH: &str = "/opt/conda/lib/python3.11/site-packages/torch";
/// The planted program's training script.
pub const TRAIN: &str = "/home/user/project/train.py";
/// The planted program's model file.
pub const MODEL: &str = "/home/user/project/model.py";
/// The planted program's own optimizer.
pub const OPTIMIZER: &str = "/home/user/project/optimizer.py";

/// A C++ frame as the unwinder names it: no line, and `file` `??`, empty or a bare source
/// name.
pub fn cpp_in(file: &str, function: &str) -> Frame {
    Frame {
        file: file.to_string(),
        line: 0,
        function: function.to_string(),
    }
}

/// A C++ frame with file `??`.
pub fn cpp(function: &str) -> Frame {
    cpp_in("??", function)
}

/// A Python frame.
pub fn py(file: &str, line: u32, function: &str) -> Frame {
    Frame {
        file: file.to_string(),
        line,
        function: function.to_string(),
    }
}

/// A Python frame of torch's own (`site-packages/torch/{path}`).
pub fn torch_py(path: &str, line: u32, function: &str) -> Frame {
    py(&format!("{TORCH}/{path}"), line, function)
}

/// Whether `frame` is a Python frame (it has a line): what `stacks="python"` keeps.
pub fn is_python(frame: &Frame) -> bool {
    frame.line > 0
}

/// A stack under construction, innermost frame first.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Stack(pub Vec<Frame>);

impl Stack {
    /// The frames `frames`, innermost first.
    pub fn of(frames: Vec<Frame>) -> Stack {
        Stack(frames)
    }

    /// This stack with `outer` (innermost first) outside it; each Python frame of `outer` but
    /// the outermost is followed by the interpreter's frame, as the combined unwinder records
    /// it.
    pub fn then(mut self, outer: &[Frame]) -> Stack {
        for (i, frame) in outer.iter().enumerate() {
            self.0.push(frame.clone());
            if is_python(frame) && i + 1 < outer.len() {
                self.0.push(cpp("_PyEval_EvalFrameDefault"));
            }
        }
        self
    }

    /// This stack with the C++ frames `outer` outside it, as they are.
    pub fn then_cpp(mut self, outer: &[Frame]) -> Stack {
        self.0.extend_from_slice(outer);
        self
    }

    /// The frames.
    pub fn frames(&self) -> &[Frame] {
        &self.0
    }
}

/// The frames at the innermost end of every allocation's stack: the unwinder, the caching
/// allocator, the empty tensor and the CUDA kernel wrapper of `op` (`addmm`, `gelu`,
/// `_to_copy`).
pub fn alloc_frames(op: &str) -> Stack {
    Stack(vec![
        cpp("torch::unwind::unwind()"),
        cpp("torch::CapturedTraceback::gather(bool, bool, bool)"),
        cpp_in("memory_snapshot.cpp", "torch::cuda::(anonymous namespace)::gather_with_cpp()"),
        cpp_in("CUDACachingAllocator.cpp", "c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc(unsigned long, CUstream_st*)"),
        cpp_in("", "c10::cuda::CUDACachingAllocator::Native::NativeCachingAllocator::malloc(void**, signed char, unsigned long, CUstream_st*)"),
        cpp_in("", "c10::cuda::CUDACachingAllocator::Native::NativeCachingAllocator::allocate(unsigned long)"),
        cpp("at::detail::empty_generic(c10::ArrayRef<long>, c10::Allocator*, c10::DispatchKeySet, c10::ScalarType, std::optional<c10::MemoryFormat>)"),
        cpp("at::detail::empty_cuda(c10::ArrayRef<long>, c10::TensorOptions const&)"),
        cpp_in("RegisterCUDA_0.cpp", &format!("at::(anonymous namespace)::wrapper_CUDA_{op}(at::Tensor const&, at::Tensor const&)")),
        cpp(&format!("at::_ops::{op}::call(at::Tensor const&, at::Tensor const&)")),
    ])
}

/// The Python binding through which Python code called `op`.
pub fn binding(op: &str) -> Frame {
    cpp_in(
        "python_variable_methods.cpp",
        &format!("torch::autograd::THPVariable_{op}(_object*, _object*, _object*)"),
    )
}

/// The stack of an allocation by `op` called from Python code `outer` (innermost first).
pub fn python_op(op: &str, outer: &[Frame]) -> Stack {
    alloc_frames(op).then_cpp(&[binding(op)]).then(outer)
}

/// The stack of `tensor.to(device)` (a copy to the device: `Tensor.to` in Python, `_to_copy`
/// in ATen) called from Python code `outer`.
pub fn tensor_to(outer: &[Frame]) -> Stack {
    alloc_frames("_to_copy")
        .then_cpp(&[binding("to")])
        .then(outer)
}

/// The frames the process's start puts outside every stack of the main thread; the script's
/// `<module>` frame, which the unwinder could not place among the interpreter's frames, comes
/// last, as in the shared `cs336` trace.
pub fn process_start(module_line: u32) -> Vec<Frame> {
    vec![
        cpp("PyEval_EvalCode"),
        cpp("_PyRun_SimpleFileObject"),
        cpp("Py_RunMain"),
        cpp("Py_BytesMain"),
        cpp("__libc_start_main"),
        cpp("_start"),
        py(TRAIN, module_line, "<module>"),
    ]
}

/// The frames `nn.Module.__call__` puts between a caller and a module's `forward`.
pub fn module_call() -> Vec<Frame> {
    vec![
        torch_py("nn/modules/module.py", 1762, "_call_impl"),
        torch_py("nn/modules/module.py", 1751, "_wrapped_call_impl"),
    ]
}

/// The autograd engine's frames outside a node's `apply` on its own thread.
pub fn autograd_thread() -> Vec<Frame> {
    vec![
        cpp_in("", "torch::autograd::Node::operator()(std::vector<at::Tensor, std::allocator<at::Tensor> >&&)"),
        cpp("torch::autograd::Engine::evaluate_function(std::shared_ptr<torch::autograd::GraphTask>&, torch::autograd::Node*, torch::autograd::InputBuffer&, std::shared_ptr<torch::autograd::ReadyQueue> const&)"),
        cpp("torch::autograd::Engine::thread_main(std::shared_ptr<torch::autograd::GraphTask> const&)"),
        cpp("torch::autograd::Engine::thread_init(int, std::shared_ptr<torch::autograd::ReadyQueue> const&, bool)"),
        cpp_in("", "torch::autograd::python::PythonEngine::thread_init(int, std::shared_ptr<torch::autograd::ReadyQueue> const&, bool)"),
        cpp("std::error_code::default_error_condition() const"),
        cpp("pthread_condattr_setpshared"),
        cpp("__clone"),
    ]
}

/// The frames at the innermost end of every free's stack: the unwinder, the caching
/// allocator's `free` and the tensor's storage released. PyTorch records a free with the
/// stack of the free, not of the allocation.
pub fn free_frames() -> Stack {
    Stack(vec![
        cpp("torch::unwind::unwind()"),
        cpp("torch::CapturedTraceback::gather(bool, bool, bool)"),
        cpp_in("memory_snapshot.cpp", "torch::cuda::(anonymous namespace)::gather_with_cpp()"),
        cpp_in("CUDACachingAllocator.cpp", "c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::free(c10::cuda::CUDACachingAllocator::Native::Block*)"),
        cpp_in("", "c10::intrusive_ptr<c10::StorageImpl, c10::detail::intrusive_target_default_null_type<c10::StorageImpl> >::reset_()"),
        cpp_in("TensorImpl.cpp", "c10::TensorImpl::~TensorImpl() [clone .localalias]"),
    ])
}

/// The stack of a tensor freed as Python drops it (a name rebound, a local at a function's
/// end) in Python code `outer`.
pub fn python_free(outer: &[Frame]) -> Stack {
    free_frames()
        .then_cpp(&[
            cpp_in("python_variable.cpp", "THPVariable_clear(THPVariable*)"),
            cpp_in("python_variable.cpp", "THPVariable_dealloc(_object*)"),
        ])
        .then(outer)
}

/// The autograd engine's frames outside a node's work on its own thread, from
/// `evaluate_function` out.
fn engine_tail() -> Vec<Frame> {
    autograd_thread().split_off(1)
}

/// The stack of a tensor the forward saved for the backward node `node`, freed by the
/// backward once the node has run (`SavedVariable::reset_data`, `release_variables`).
pub fn saved_released(node: &str) -> Stack {
    free_frames()
        .then_cpp(&[
            cpp("torch::autograd::SavedVariable::reset_data()"),
            cpp_in(
                "",
                &format!("torch::autograd::generated::{node}::release_variables()"),
            ),
        ])
        .then_cpp(&engine_tail())
}

/// The stack of a backward node's incoming gradients, freed by the engine once the node has
/// run.
pub fn inputs_released() -> Stack {
    free_frames()
        .then_cpp(&[cpp(
            "std::vector<at::Tensor, std::allocator<at::Tensor> >::~vector()",
        )])
        .then_cpp(&engine_tail())
}

/// The stack of a gradient that `AccumulateGrad` has copied or added into a parameter's
/// `.grad`, freed by it.
pub fn accumulate_released() -> Stack {
    free_frames()
        .then_cpp(&[
            cpp_in("accumulate_grad.cpp", "torch::autograd::(anonymous namespace)::AccumulateGrad_apply_impl(std::vector<at::Tensor, std::allocator<at::Tensor> >&&, std::shared_ptr<torch::autograd::Node> const&)"),
            cpp("torch::autograd::AccumulateGrad::apply(std::vector<at::Tensor, std::allocator<at::Tensor> >&&)"),
        ])
        .then_cpp(&autograd_thread())
}

/// The frames of `optimizer.zero_grad()` (with `set_to_none=True` it drops each `.grad`)
/// called from `caller`.
pub fn zero_grad(caller: &[Frame]) -> Vec<Frame> {
    let mut frames = vec![torch_py("optim/optimizer.py", 993, "zero_grad")];
    frames.extend_from_slice(caller);
    frames
}

/// The stack of an allocation by `op` inside the backward node `node` (`AddmmBackward0`) on
/// the autograd thread: C++ frames only.
pub fn backward_node(node: &str, op: &str) -> Stack {
    alloc_frames(op)
        .then_cpp(&[
            cpp_in("Functions.cpp", &format!("torch::autograd::generated::{node}_apply_functional(std::vector<at::Tensor, std::allocator<at::Tensor> >&&)")),
            cpp(&format!("torch::autograd::generated::{node}::apply(std::vector<at::Tensor, std::allocator<at::Tensor> >&&)")),
        ])
        .then_cpp(&autograd_thread())
}

/// The stack of a gradient that `AccumulateGrad` allocates as a parameter's `.grad` (a copy
/// obeying the parameter's layout) on the autograd thread.
pub fn accumulate_grad() -> Stack {
    alloc_frames("new_empty_strided")
        .then_cpp(&[
            cpp_in("", "torch::autograd::utils::clone_obey_contract(at::Tensor const&, at::Tensor const&)"),
            cpp_in("", "void torch::autograd::AccumulateGrad::accumulateGrad<std::function<void (at::Tensor&&)> >(at::Tensor const&, at::Tensor&, at::Tensor const&, long, std::function<void (at::Tensor&&)> const&)"),
            cpp_in("accumulate_grad.cpp", "torch::autograd::(anonymous namespace)::AccumulateGrad_apply_impl(std::vector<at::Tensor, std::allocator<at::Tensor> >&&, std::shared_ptr<torch::autograd::Node> const&)"),
            cpp("torch::autograd::AccumulateGrad::apply(std::vector<at::Tensor, std::allocator<at::Tensor> >&&)"),
        ])
        .then_cpp(&autograd_thread())
}

/// The frames of `optimizer.step()` (the profiling wrapper that records the
/// `Optimizer.step#AdamW.step` annotation, `_use_grad`, AdamW's `step`) called from `caller`.
pub fn adamw_step(caller: &[Frame]) -> Vec<Frame> {
    let mut frames = vec![
        torch_py("optim/adamw.py", 209, "step"),
        torch_py("optim/optimizer.py", 79, "_use_grad"),
        torch_py("optim/optimizer.py", 485, "wrapper"),
    ];
    frames.extend_from_slice(caller);
    frames
}

/// The frames of AdamW's `_init_group`, where it makes a parameter's state (`exp_avg`,
/// `exp_avg_sq`) on the step's first call, inside [`adamw_step`] from `caller`.
pub fn adamw_init_group(caller: &[Frame]) -> Vec<Frame> {
    let mut frames = vec![torch_py("optim/adamw.py", 133, "_init_group")];
    frames.extend(adamw_step(caller));
    frames
}

/// The frames of AdamW's update (`_multi_tensor_adamw`, whose `torch._foreach_*` calls make
/// scratch lists), inside [`adamw_step`] from `caller`.
pub fn adamw_update(caller: &[Frame]) -> Vec<Frame> {
    let mut frames = vec![
        torch_py("optim/adamw.py", 612, "_multi_tensor_adamw"),
        torch_py("optim/optimizer.py", 150, "maybe_fallback"),
        torch_py("optim/adamw.py", 780, "adamw"),
        torch_py("optim/adamw.py", 243, "step"),
        torch_py("optim/optimizer.py", 79, "_use_grad"),
        torch_py("optim/optimizer.py", 485, "wrapper"),
    ];
    frames.extend_from_slice(caller);
    frames
}

/// The frames of a closure that `optimizer.step(closure)` calls (AdamW's `step` calls it under
/// `torch.enable_grad()`): the user's `closure` at `line`, inside AdamW's `step` from
/// `caller`.
pub fn in_closure(line: u32, caller: &[Frame]) -> Vec<Frame> {
    let mut frames = vec![
        py(TRAIN, line, "closure"),
        torch_py("optim/adamw.py", 201, "step"),
        torch_py("optim/optimizer.py", 79, "_use_grad"),
        torch_py("optim/optimizer.py", 485, "wrapper"),
    ];
    frames.extend_from_slice(caller);
    frames
}

/// The frames of `model.to(device)` moving a model's parameters (`Module.to`, `_apply` once
/// per level of the module tree, `convert`) from `caller`.
pub fn module_to(depth: usize, caller: &[Frame]) -> Vec<Frame> {
    let mut frames = vec![torch_py("nn/modules/module.py", 1357, "convert")];
    frames.push(torch_py("nn/modules/module.py", 957, "_apply"));
    for _ in 0..depth {
        frames.push(torch_py("nn/modules/module.py", 930, "_apply"));
    }
    frames.push(torch_py("nn/modules/module.py", 1371, "to"));
    frames.extend_from_slice(caller);
    frames
}
