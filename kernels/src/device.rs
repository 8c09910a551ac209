//! [`Device`]: one allocator plus the kernels that run on its memory.
//!
//! A device owns a `CachingAllocator<DeviceBackend>` from the allocator crate, so every tensor's
//! storage is an allocator block with its call site, tag, scope and step, and every transfer is
//! recorded. It also decides, at the first op, how kernels run: the NVRTC-compiled CUDA kernels
//! of `crate::cuda` on a CUDA device, or the CPU twins of `crate::cpu` on the backed simulated
//! device (and on a CUDA device whose kernels could not be compiled, with the reason kept).
//! `crate::tensor` asks [`Device::engine`] and dispatches on it.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use vramscope_allocator::{CachingAllocator, DeviceBackend, StreamId};
use vramscope_model::AllocatorConfig;

use crate::cuda::{kernels_for, Kernels};
use crate::tensor::TensorError;

static NEXT_DEVICE_ID: AtomicU64 = AtomicU64::new(1);

/// How a device's kernels run.
#[derive(Clone, Debug)]
pub enum Engine {
    /// The CPU twins in `crate::cpu`, reading and writing device memory through the backend.
    Host {
        /// Why the CUDA kernels are not used.
        why: String,
    },
    /// The NVRTC-compiled CUDA kernels.
    Cuda(Arc<Kernels>),
}

struct DeviceInner {
    id: u64,
    allocator: CachingAllocator<DeviceBackend>,
    label: String,
    engine: OnceLock<Engine>,
}

/// A device that tensors live on. Cloning gives another handle to the same device.
#[derive(Clone)]
pub struct Device {
    inner: Arc<DeviceInner>,
}

impl Device {
    /// A device drawing its memory from `allocator`.
    pub fn new(allocator: CachingAllocator<DeviceBackend>) -> Device {
        use vramscope_allocator::Backend;
        let backend = allocator.backend();
        let label = format!("{}:{}", backend.kind(), backend.device_index());
        Device {
            inner: Arc::new(DeviceInner {
                id: NEXT_DEVICE_ID.fetch_add(1, Ordering::Relaxed),
                allocator,
                label,
                engine: OnceLock::new(),
            }),
        }
    }

    /// A backed simulated device of `capacity` bytes with the default allocator settings.
    pub fn sim(capacity: u64) -> Device {
        Device::new(CachingAllocator::new(
            DeviceBackend::sim(capacity),
            AllocatorConfig::default(),
        ))
    }

    /// CUDA device 0 when there is one, otherwise a backed simulated device of
    /// `capacity_for_sim` bytes; the string says which and why, in one line.
    pub fn detect(capacity_for_sim: u64, config: AllocatorConfig) -> (Device, String) {
        let (backend, reason) = DeviceBackend::detect(capacity_for_sim);
        (Device::new(CachingAllocator::new(backend, config)), reason)
    }

    /// The allocator behind this device's tensors.
    pub fn allocator(&self) -> &CachingAllocator<DeviceBackend> {
        &self.inner.allocator
    }

    /// The backend (CUDA or simulated).
    pub fn backend(&self) -> &DeviceBackend {
        self.inner.allocator.backend()
    }

    /// `"cuda:0"` or `"sim:0"`.
    pub fn label(&self) -> &str {
        &self.inner.label
    }

    /// A number unique to this device handle in this process (two simulated devices share a
    /// label but not an id).
    pub fn id(&self) -> u64 {
        self.inner.id
    }

    /// Whether two handles name the same device.
    pub fn same_as(&self, other: &Device) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }

    /// Whether the backend is CUDA.
    pub fn is_cuda(&self) -> bool {
        self.backend().is_cuda()
    }

    /// How kernels run on this device, decided (and CUDA kernels compiled) at the first call.
    pub fn engine(&self) -> &Engine {
        self.inner.engine.get_or_init(|| match self.backend() {
            DeviceBackend::Sim(_) => Engine::Host {
                why: "the simulated device runs the CPU kernels".to_string(),
            },
            DeviceBackend::Cuda(cuda) => match kernels_for(cuda) {
                Ok(kernels) => Engine::Cuda(kernels),
                Err(why) => Engine::Host {
                    why: format!("CUDA kernels unavailable: {why}"),
                },
            },
        })
    }

    /// Whether ops run as CUDA kernels (compiling them now if they have not been).
    pub fn uses_cuda_kernels(&self) -> bool {
        matches!(self.engine(), Engine::Cuda(_))
    }

    /// One line saying how kernels run here.
    pub fn engine_description(&self) -> String {
        match self.engine() {
            Engine::Cuda(k) => format!("CUDA kernels compiled with NVRTC for {}", k.arch()),
            Engine::Host { why } => format!("CPU kernels ({why})"),
        }
    }

    /// Waits for all work on the default stream, recorded as a sync at the caller's line.
    #[track_caller]
    pub fn synchronize(&self) -> Result<(), TensorError> {
        self.inner.allocator.synchronize(StreamId::DEFAULT)?;
        Ok(())
    }

    /// Starts a new training step in the allocator's record, at the caller's line.
    #[track_caller]
    pub fn mark_step(&self) -> u64 {
        self.inner.allocator.mark_step()
    }
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (device #{})", self.inner.label, self.inner.id)
    }
}

impl fmt::Debug for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}
