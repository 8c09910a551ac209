//! The CUDA kernels: sources, NVRTC compilation at first use, a per-device cache, and launches.
//!
//! The sources in `kernels/cuda/*.cu` are baked into the binary and compiled together, once per
//! device ordinal per process, with NVRTC into PTX for the device's compute capability, then
//! loaded into the device's primary context. `crate::device` asks [`kernels_for`] for them the
//! first time a tensor op runs on a CUDA device, and falls back to the CPU twins in `crate::cpu`
//! (with the reason recorded) when NVRTC is missing or compilation fails. `crate::tensor` calls
//! [`Kernels::launch`] with raw device addresses from the allocator's buffers and the raw stream
//! from `vramscope_allocator::cuda::CudaBackend::raw_stream`.

use std::collections::HashMap;
use std::ffi::c_void;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::{result, sys, CudaFunction, CudaModule};
use cudarc::nvrtc::{compile_ptx_with_opts, CompileOptions, Ptx};
use vramscope_allocator::cuda::nvrtc_version;
use vramscope_allocator::cuda::CudaBackend;
use vramscope_allocator::StreamId;

/// Every kernel source, in the order they are concatenated (the helpers first).
pub const SOURCES: [(&str, &str); 6] = [
    ("common.cuh", include_str!("../cuda/common.cuh")),
    ("elementwise.cu", include_str!("../cuda/elementwise.cu")),
    ("matmul.cu", include_str!("../cuda/matmul.cu")),
    ("reduce.cu", include_str!("../cuda/reduce.cu")),
    ("loss.cu", include_str!("../cuda/loss.cu")),
    ("optim.cu", include_str!("../cuda/optim.cu")),
];

/// The entry points the sources define.
pub const KERNEL_NAMES: [&str; 13] = [
    "vs_fill",
    "vs_cast",
    "vs_axpy",
    "vs_scale",
    "vs_relu",
    "vs_relu_backward",
    "vs_add_bias",
    "vs_matmul",
    "vs_sum",
    "vs_sum_rows",
    "vs_softmax_xent",
    "vs_sgd",
    "vs_adamw",
];

/// Threads per block of the element-wise kernels (and of `vs_sum`, which needs exactly this).
pub const BLOCK: u32 = 256;

/// The whole program NVRTC compiles: every source, each preceded by a line naming it.
pub fn program_source() -> String {
    let mut source = String::new();
    for (name, text) in SOURCES {
        source.push_str(&format!("// ---- {name}\n"));
        source.push_str(text);
        source.push('\n');
    }
    source
}

/// One kernel argument. Each is passed to the driver from its own 8-byte slot: the driver reads
/// as many bytes as the kernel's parameter has, from the slot's start, which on a little-endian
/// machine is the value itself for 4-byte and 8-byte parameters alike.
#[derive(Clone, Copy, Debug)]
pub enum Arg {
    /// A device address (a pointer parameter).
    Ptr(u64),
    /// An `int` parameter.
    I32(i32),
    /// An `unsigned long long` parameter.
    U64(u64),
    /// A `float` parameter.
    F32(f32),
}

#[cfg(not(target_endian = "little"))]
compile_error!("kernel arguments are passed from 8-byte slots, which needs a little-endian host");

impl Arg {
    fn slot(self) -> u64 {
        match self {
            Arg::Ptr(v) | Arg::U64(v) => v,
            Arg::I32(v) => u64::from(v as u32),
            Arg::F32(v) => u64::from(v.to_bits()),
        }
    }
}

/// Grid and block shape of one launch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Launch {
    /// Blocks in x, y, z.
    pub grid: (u32, u32, u32),
    /// Threads per block in x, y, z.
    pub block: (u32, u32, u32),
}

impl Launch {
    /// A grid-stride launch over `n` elements: [`BLOCK`] threads per block, at most 4096 blocks.
    pub fn linear(n: u64) -> Launch {
        let blocks = n.div_ceil(u64::from(BLOCK)).clamp(1, 4096) as u32;
        Launch {
            grid: (blocks, 1, 1),
            block: (BLOCK, 1, 1),
        }
    }

    /// One block of [`BLOCK`] threads (for `vs_sum`).
    pub fn single_block() -> Launch {
        Launch {
            grid: (1, 1, 1),
            block: (BLOCK, 1, 1),
        }
    }

    /// 16 × 16 tiles covering an `m × n` output (for `vs_matmul`).
    pub fn tiles(m: usize, n: usize) -> Launch {
        Launch {
            grid: (
                (n.div_ceil(16)).max(1) as u32,
                (m.div_ceil(16)).max(1) as u32,
                1,
            ),
            block: (16, 16, 1),
        }
    }
}

/// The compiled kernels of one device.
pub struct Kernels {
    _module: Arc<CudaModule>,
    functions: HashMap<&'static str, CudaFunction>,
    arch: String,
}

impl std::fmt::Debug for Kernels {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Kernels")
            .field("arch", &self.arch)
            .field("functions", &self.functions.len())
            .finish()
    }
}

type Cache = Mutex<HashMap<u32, Result<Arc<Kernels>, String>>>;

fn cache() -> &'static Cache {
    static CACHE: OnceLock<Cache> = OnceLock::new();
    CACHE.get_or_init(|| Mutex::new(HashMap::new()))
}

/// The kernels for `backend`'s device, compiled on first use and cached per device ordinal for
/// the life of the process (a failure is cached too, so it is reported once, not retried).
pub fn kernels_for(backend: &CudaBackend) -> Result<Arc<Kernels>, String> {
    use vramscope_allocator::Backend;
    let ordinal = backend.device_index();
    let mut cache = cache().lock().unwrap_or_else(|p| p.into_inner());
    cache
        .entry(ordinal)
        .or_insert_with(|| compile(backend).map(Arc::new))
        .clone()
}

/// Compiles [`program_source`] to PTX with NVRTC for `arch` (`"compute_90"`), or for NVRTC's
/// default architecture when `arch` is `None`. Needs NVRTC but no GPU; fails with a one-line
/// reason (NVRTC's log included) instead of panicking when NVRTC is missing or rejects the code.
pub fn compile_ptx(arch: Option<&str>) -> Result<Ptx, String> {
    let (nv_major, nv_minor) = nvrtc_version()?;
    let options = CompileOptions {
        options: arch
            .map(|a| vec![format!("--gpu-architecture={a}")])
            .unwrap_or_default(),
        name: Some("vramscope_kernels.cu".to_string()),
        ..CompileOptions::default()
    };
    let source = program_source();
    match catch_unwind(AssertUnwindSafe(|| compile_ptx_with_opts(&source, options))) {
        Ok(Ok(ptx)) => Ok(ptx),
        Ok(Err(e)) => Err(format!("NVRTC {nv_major}.{nv_minor} failed: {e}")),
        Err(_) => Err(format!("NVRTC {nv_major}.{nv_minor} panicked")),
    }
}

fn compile(backend: &CudaBackend) -> Result<Kernels, String> {
    let (major, minor) = backend.compute_capability();
    let arch = format!("compute_{major}{minor}");
    // An NVRTC older than the device may not know its architecture; PTX for NVRTC's default
    // architecture is then JIT-compiled by the driver instead.
    let (ptx, arch) = match compile_ptx(Some(&arch)) {
        Ok(ptx) => (ptx, arch),
        Err(first) => match compile_ptx(None) {
            Ok(ptx) => (ptx, "NVRTC's default architecture".to_string()),
            Err(_) => return Err(first),
        },
    };
    let ctx = backend.context().clone();
    let module = ctx
        .load_module(ptx)
        .map_err(|e| format!("loading the PTX into the driver failed: {e}"))?;
    let mut functions = HashMap::new();
    for name in KERNEL_NAMES.iter() {
        let f = module
            .load_function(name)
            .map_err(|e| format!("kernel {name} missing from the module: {e}"))?;
        functions.insert(*name, f);
    }
    Ok(Kernels {
        _module: module,
        functions,
        arch,
    })
}

impl Kernels {
    /// The architecture the PTX was generated for.
    pub fn arch(&self) -> &str {
        &self.arch
    }

    /// Launches kernel `name` on `stream` of `backend` with `args`. Asynchronous: errors in the
    /// kernel itself surface at the next synchronizing call.
    pub fn launch(
        &self,
        backend: &CudaBackend,
        stream: StreamId,
        name: &str,
        launch: Launch,
        args: &[Arg],
    ) -> Result<(), String> {
        let f = self
            .functions
            .get(name)
            .ok_or_else(|| format!("no kernel named {name}"))?;
        let raw_stream = backend.raw_stream(stream).map_err(|e| e.to_string())?;
        let mut slots: Vec<u64> = args.iter().map(|a| a.slot()).collect();
        let mut params: Vec<*mut c_void> = slots
            .iter_mut()
            .map(|s| s as *mut u64 as *mut c_void)
            .collect();
        // SAFETY: `f` is a live function of a module this struct keeps loaded; `raw_stream` is a
        // live stream of the same context, which `raw_stream` bound to this thread; `params`
        // points at one 8-byte slot per kernel parameter, alive until the call returns (the
        // driver copies parameter values at launch). The pointer arguments are device addresses
        // of live allocator buffers sized by `crate::tensor` for the shapes passed alongside.
        unsafe {
            result::launch_kernel(
                f.cu_function(),
                launch.grid,
                launch.block,
                0,
                raw_stream as sys::CUstream,
                &mut params,
            )
        }
        .map_err(|e| format!("launching {name} failed: {e}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kernel_name_is_defined_in_the_sources() {
        let source = program_source();
        for name in KERNEL_NAMES.iter() {
            assert!(
                source.contains(&format!("void {name}(")),
                "{name} is not defined"
            );
        }
        assert!(source.starts_with("// ---- common.cuh"));
    }

    #[test]
    fn the_sources_compile_with_nvrtc_when_it_is_present() {
        if let Err(reason) = nvrtc_version() {
            vramscope_testkit::skip_notice(&format!("no NVRTC ({reason})"));
            return;
        }
        for arch in [Some("compute_90"), Some("compute_80"), None] {
            let ptx = compile_ptx(arch).unwrap_or_else(|e| panic!("{arch:?}: {e}"));
            let text = ptx.to_src();
            for name in KERNEL_NAMES {
                assert!(
                    text.contains(&format!(".entry {name}(")),
                    "{arch:?}: {name}"
                );
            }
        }
    }

    #[test]
    fn arguments_fill_their_slots_little_endian() {
        assert_eq!(Arg::I32(-1).slot(), 0xffff_ffff);
        assert_eq!(Arg::F32(1.0).slot(), 0x3f80_0000);
        assert_eq!(Arg::Ptr(0x7f00_0000_0000).slot(), 0x7f00_0000_0000);
        assert_eq!(Launch::linear(0).grid.0, 1);
        assert_eq!(Launch::linear(257).grid.0, 2);
        assert_eq!(Launch::tiles(17, 33).grid, (3, 2, 1));
    }
}
