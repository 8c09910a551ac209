//! A generator of PyTorch-like memory traces for the planted tests.
//!
//! [`Torch`] runs every request through vramscope's caching allocator (PyTorch's policy rule
//! for rule: rounding, pools, segment sizes, splitting, `empty_cache`) on a phantom device and
//! records what a `torch.cuda.memory._dump_snapshot()` pickle holds after import: requested
//! sizes and block sizes, segment allocations and frees, PyTorch-shaped stacks (C++ frames
//! named `??`, framework Python frames under `site-packages/torch/`, the user's own lines),
//! annotations such as `Optimizer.step#AdamW.step`, and no `empty_cache` event of its own
//! (PyTorch records the segment frees only, with the stack of the call). Call sites are
//! interned with the importer's own table, so the primary frame of each stack is the one an
//! imported pickle would get. [`Model`] builds the stacks of a small transformer-like model,
//! so that each test states its training or evaluation loop in a few lines.
#![allow(dead_code)]

use std::collections::HashMap;

use vramscope_caching::{CachingAllocator, SimDevice, StreamId};
use vramscope_import::sites::{SiteTable, DEFAULT_FRAMEWORK_PATHS};
use vramscope_model::{
    AllocatorConfig, Annotation, DeviceInfo, EventKind, Frame, Id, SiteId, Snapshot, SnapshotSource,
};

/// One mebibyte.
pub const MIB: u64 = 1 << 20;

const TORCH: &str = "/opt/conda/lib/python3.11/site-packages/torch";

/// A Python frame.
pub fn py(file: &str, line: u32, function: &str) -> Frame {
    Frame {
        file: file.to_string(),
        line,
        function: function.to_string(),
    }
}

/// A C++ frame as PyTorch records it (file `??`, line 0).
pub fn cpp(function: &str) -> Frame {
    Frame {
        file: "??".to_string(),
        line: 0,
        function: function.to_string(),
    }
}

/// The C++ frames at the innermost end of every allocation stack, below the op `op`.
pub fn alloc_frames(op: &str) -> Vec<Frame> {
    vec![
        cpp("torch::unwind::unwind()"),
        cpp("torch::CapturedTraceback::gather(bool, bool, bool)"),
        cpp("c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc(signed char, unsigned long, CUstream_st*)"),
        cpp("c10::cuda::CUDACachingAllocator::Native::NativeCachingAllocator::malloc(void**, signed char, unsigned long, CUstream_st*)"),
        cpp("at::detail::empty_generic(c10::ArrayRef<long>, c10::Allocator*, c10::DispatchKeySet, c10::ScalarType, std::optional<c10::MemoryFormat>)"),
        cpp("at::native::empty_cuda(c10::ArrayRef<long>, std::optional<c10::ScalarType>, std::optional<c10::Layout>, std::optional<c10::Device>, std::optional<bool>, std::optional<c10::MemoryFormat>)"),
        cpp(&format!("at::native::{op}(at::Tensor const&, at::Tensor const&)")),
        cpp(&format!("at::_ops::{op}::call(at::Tensor const&, at::Tensor const&)")),
        cpp("torch::autograd::THPVariable_wrap(at::TensorBase)"),
    ]
}

/// A Python frame inside torch (`site-packages/torch/...`).
pub fn torch_py(path: &str, line: u32, function: &str) -> Frame {
    py(&format!("{TORCH}/{path}"), line, function)
}

/// The frames `nn.Module.__call__` puts between a caller and a module's `forward`.
pub fn module_call() -> Vec<Frame> {
    vec![
        torch_py("nn/modules/module.py", 1762, "_call_impl"),
        torch_py("nn/modules/module.py", 1751, "_wrapped_call_impl"),
    ]
}

/// The stack of a backward allocation: the autograd thread's C++ frames only, inside the
/// node `node` (`MmBackward0`).
pub fn backward_stack(node: &str) -> Vec<Frame> {
    let mut frames = alloc_frames("mm");
    frames.push(cpp(&format!(
        "torch::autograd::generated::{node}::apply(std::vector<at::Tensor, std::allocator<at::Tensor> >&&)"
    )));
    frames.push(cpp(
        "torch::autograd::Node::operator()(std::vector<at::Tensor, std::allocator<at::Tensor> >&&)",
    ));
    frames.push(cpp(
        "torch::autograd::call_function(torch::autograd::NodeTask&)",
    ));
    frames.push(cpp("torch::autograd::Engine::evaluate_function(std::shared_ptr<torch::autograd::GraphTask>&, torch::autograd::Node*, torch::autograd::InputBuffer&, std::shared_ptr<torch::autograd::ReadyQueue> const&)"));
    frames.push(cpp(
        "torch::autograd::Engine::thread_main(std::shared_ptr<torch::autograd::GraphTask> const&)",
    ));
    frames.push(cpp("torch::autograd::Engine::thread_init(int, std::shared_ptr<torch::autograd::ReadyQueue> const&, bool)"));
    frames.push(cpp("start_thread"));
    frames
}

/// The stack of `torch.cuda.empty_cache()` called from `caller` (outermost last).
pub fn empty_cache_stack(caller: &[Frame]) -> Vec<Frame> {
    let mut frames = vec![
        cpp("torch::unwind::unwind()"),
        cpp("torch::CapturedTraceback::gather(bool, bool, bool)"),
        cpp("c10::cuda::CUDACachingAllocator::Native::NativeCachingAllocator::emptyCache()"),
        cpp("THCPModule_emptyCache(_object*, _object*)"),
        torch_py("cuda/memory.py", 222, "empty_cache"),
    ];
    frames.extend_from_slice(caller);
    frames
}

/// The stack `frames` as a conda build of PyTorch symbolizes it: every C++ frame gets the
/// source file and line of its function (`c10/cuda/CUDACachingAllocator.cpp:1425`,
/// `torch/csrc/autograd/engine.cpp:1081`), and the autograd thread's stack ends in libstdc++'s
/// `thread.cc:82 (execute_native_thread_routine)` and glibc's `pthread_create.c:442`.
pub fn symbolize(frames: &[Frame]) -> Vec<Frame> {
    const BUILD: &str = "/opt/conda/conda-bld/pytorch_1716905975447/work";
    const GCC: &str = "/home/conda/feedstock_root/build_artifacts/gcc_compilers_1719179180043/work/gcc/libstdc++-v3";
    let mut out = Vec::with_capacity(frames.len() + 1);
    for (i, f) in frames.iter().enumerate() {
        if f.file != "??" {
            out.push(f.clone());
            continue;
        }
        let function = f.function.as_str();
        let line = 100 + (i as u32) * 37;
        let file = if function == "start_thread" {
            out.push(py(
                &format!("{GCC}/src/c++11/thread.cc"),
                82,
                "execute_native_thread_routine",
            ));
            "./nptl/pthread_create.c".to_string()
        } else if function.starts_with("c10::cuda") {
            format!("{BUILD}/c10/cuda/CUDACachingAllocator.cpp")
        } else if function.starts_with("torch::autograd::generated") {
            format!("{BUILD}/torch/csrc/autograd/generated/Functions.cpp")
        } else if function.starts_with("torch::autograd") {
            format!("{BUILD}/torch/csrc/autograd/engine.cpp")
        } else if function.starts_with("torch::") {
            format!("{BUILD}/torch/csrc/profiler/combined_traceback.cpp")
        } else {
            format!("{BUILD}/aten/src/ATen/native/TensorFactories.cpp")
        };
        out.push(py(&file, line, function));
    }
    out
}

/// A stack: `inner` (innermost first) followed by `outer`.
pub fn stack(inner: &[Frame], outer: &[Frame]) -> Vec<Frame> {
    inner.iter().chain(outer).cloned().collect()
}

/// A trace being recorded.
pub struct Torch {
    alloc: CachingAllocator<SimDevice>,
    snap: Snapshot,
    table: SiteTable,
    stacks: HashMap<Vec<Frame>, Option<SiteId>>,
    next_seq: u64,
    time_ns: u64,
    /// Site and time of the last allocation at each address, for the segments at the end.
    last_alloc: HashMap<u64, Option<SiteId>>,
    /// Whether C++ frames carry files and lines, as a conda build's dumps do ([`symbolize`]).
    symbolized: bool,
}

impl Default for Torch {
    fn default() -> Self {
        Torch::new()
    }
}

impl Torch {
    /// An empty trace on an 80 GiB device with PyTorch's default settings.
    pub fn new() -> Torch {
        Torch::with_config("")
    }

    /// An empty trace with allocator settings in `PYTORCH_CUDA_ALLOC_CONF` syntax.
    pub fn with_config(conf: &str) -> Torch {
        Torch::on_device(conf, 80 << 30)
    }

    /// An empty trace with allocator settings `conf` on a device of `capacity` bytes, where
    /// the allocator frees its cache to retry as PyTorch's does.
    pub fn on_device(conf: &str, capacity: u64) -> Torch {
        let config = AllocatorConfig::parse(conf).expect("settings parse");
        let mut recording = config.clone();
        recording.record_events = true;
        recording.max_entries = usize::MAX;
        let alloc = CachingAllocator::new(SimDevice::phantom(capacity), recording);
        let device = DeviceInfo {
            index: 0,
            name: "NVIDIA H100 80GB HBM3 (planted)".to_string(),
            backend: "cuda".to_string(),
            capacity,
        };
        let mut snap = Snapshot::empty(SnapshotSource::Pytorch, device);
        snap.config = config;
        let paths: Vec<String> = DEFAULT_FRAMEWORK_PATHS
            .iter()
            .map(|s| s.to_string())
            .collect();
        Torch {
            alloc,
            snap,
            table: SiteTable::new(&paths),
            stacks: HashMap::new(),
            next_seq: 0,
            time_ns: 1_000_000,
            last_alloc: HashMap::new(),
            symbolized: false,
        }
    }

    /// This trace with its C++ frames symbolized as a conda build's dumps are ([`symbolize`]).
    pub fn symbolized(mut self) -> Torch {
        self.symbolized = true;
        self
    }

    fn site(&mut self, frames: &[Frame]) -> Option<SiteId> {
        if let Some(&id) = self.stacks.get(frames) {
            return id;
        }
        let recorded = if self.symbolized {
            symbolize(frames)
        } else {
            frames.to_vec()
        };
        let id = self.table.intern(recorded);
        self.stacks.insert(frames.to_vec(), id);
        id
    }

    /// Moves the allocator's new events into the trace under `site`.
    fn pull(&mut self, site: Option<SiteId>, requested: Option<u64>) {
        let batch = self.alloc.events_since(self.next_seq, usize::MAX);
        self.next_seq = batch.next_seq;
        for mut e in batch.events {
            if e.kind == EventKind::EmptyCache {
                continue;
            }
            self.time_ns += 1_000;
            e.seq = self.snap.events.len() as u64;
            e.time_ns = self.time_ns;
            e.site = Id::pack(site);
            e.tag = None;
            e.scope = None;
            e.step = 0;
            e.thread = 0;
            if e.kind == EventKind::Alloc {
                if let Some(r) = requested {
                    e.requested = r;
                }
                self.last_alloc.insert(e.addr, site);
            }
            self.snap.events.push(e);
        }
    }

    /// Allocates `bytes` with the stack `frames` (innermost first); returns the address.
    pub fn alloc(&mut self, frames: &[Frame], bytes: u64) -> u64 {
        self.alloc_on(frames, bytes, 0)
    }

    /// [`Torch::alloc`] on CUDA stream `stream` (0 is the default stream).
    pub fn alloc_on(&mut self, frames: &[Frame], bytes: u64, stream: u64) -> u64 {
        let site = self.site(frames);
        let addr = self
            .alloc
            .alloc_ptr(bytes, StreamId(stream))
            .expect("the planted device has room");
        self.pull(site, Some(bytes));
        addr
    }

    /// Frees the block at `addr`; PyTorch records the free with the stack of the allocation.
    pub fn free(&mut self, addr: u64) {
        let site = self.last_alloc.get(&addr).copied().flatten();
        self.alloc.free_ptr(addr).expect("a live block");
        self.pull(site, None);
    }

    /// `torch.cuda.empty_cache()` called from `caller` (outermost last): the segment frees,
    /// with the call's stack, and no event of its own.
    pub fn empty_cache(&mut self, caller: &[Frame]) {
        let site = self.site(&empty_cache_stack(caller));
        self.alloc.empty_cache();
        self.pull(site, None);
    }

    /// An external annotation (`Optimizer.step#AdamW.step`, `START` or `END`) now.
    pub fn annotate(&mut self, name: &str, stage: &str) {
        self.time_ns += 1_000;
        self.snap.annotations.push(Annotation {
            name: name.to_string(),
            stage: stage.to_string(),
            time_ns: self.time_ns,
            device: 0,
        });
    }

    /// The trace as the importer gives it: steps from the first annotation family present
    /// (`Optimizer.step#`, as the importer prefers), the segments at the end, the statistics.
    pub fn finish(mut self) -> Snapshot {
        let end = self.alloc.snapshot();
        self.snap.segments = end.segments;
        for segment in &mut self.snap.segments {
            for block in &mut segment.blocks {
                block.site = self.last_alloc.get(&block.address).copied().flatten();
                block.tag = None;
                block.scope = None;
                block.step = 0;
                block.thread = 0;
            }
        }
        self.snap.stats = end.stats;
        self.snap.sites = self.table.into_sites();
        let family = self
            .snap
            .annotations
            .iter()
            .find(|a| a.stage == "START")
            .map(|a| a.name.clone());
        if let Some(family) = family {
            vramscope_analysis::model_view::apply_step_marker(&mut self.snap, &family);
            // Blocks at the end take the step of their allocation.
            let steps: HashMap<u64, u64> = self
                .snap
                .events
                .iter()
                .filter(|e| e.kind == EventKind::Alloc)
                .map(|e| (e.addr, u64::from(e.step)))
                .collect();
            for segment in &mut self.snap.segments {
                for block in &mut segment.blocks {
                    block.step = steps.get(&block.address).copied().unwrap_or(0);
                }
            }
        }
        self.snap
    }
}

/// The stacks of a small transformer-like model called from one line of the user's loop.
pub struct Model {
    /// The user's model file.
    pub file: String,
    /// Layers of the model.
    pub layers: usize,
    /// Bytes of one activation.
    pub activation: u64,
}

impl Model {
    /// A model of `layers` layers whose activations are `activation` bytes.
    pub fn new(layers: usize, activation: u64) -> Model {
        Model {
            file: "/home/user/project/model.py".to_string(),
            layers,
            activation,
        }
    }

    /// The stack of one activation allocated by `op` at `line` of the model's `forward`, the
    /// model called from `caller` (outermost last).
    pub fn activation_stack(&self, op: &str, line: u32, caller: &[Frame]) -> Vec<Frame> {
        let mut frames = alloc_frames(op);
        frames.push(torch_py("nn/modules/linear.py", 125, "forward"));
        frames.extend(module_call());
        frames.push(py(&self.file, line, "forward"));
        frames.extend(module_call());
        frames.extend_from_slice(caller);
        frames
    }

    /// One forward pass from `caller`: allocates each layer's activations and returns them
    /// (all of them, as the autograd graph keeps them until backward or until dropped).
    pub fn forward(&self, t: &mut Torch, caller: &[Frame]) -> Vec<u64> {
        let mut kept = Vec::new();
        for _ in 0..self.layers {
            for (op, line) in [("addmm", 31), ("gelu", 32), ("addmm", 33)] {
                let frames = self.activation_stack(op, line, caller);
                kept.push(t.alloc(&frames, self.activation + 100));
            }
        }
        kept
    }

    /// One backward pass: gradients of the activations on the autograd thread (C++ frames
    /// only), freed as it goes; then the activations are freed.
    pub fn backward(&self, t: &mut Torch, activations: Vec<u64>) {
        for &a in activations.iter().rev() {
            let g = t.alloc(&backward_stack("AddmmBackward0"), self.activation);
            t.free(g);
            t.free(a);
        }
    }
}
