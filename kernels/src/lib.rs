//! vramscope-kernels: the kernels and the small tensor layer that let vramscope's demos and
//! examples do real work, on a GPU when one is there and on the simulated device otherwise.
//!
//! The crate sits on top of `vramscope-allocator` and below the examples. [`device::Device`]
//! wraps a caching allocator on a `DeviceBackend` (CUDA or backed simulation) and decides how
//! kernels run: the CUDA C sources in `kernels/cuda/*.cu`, compiled with NVRTC at first use and
//! cached per device ([`cuda`]), or their CPU twins ([`cpu`]). [`tensor::Tensor`] is a shaped,
//! typed ([`dtype::DType`]: f32, f16, bf16) array whose storage is an allocator block; its ops
//! and transfers are recorded with the caller's line. [`mod@train`] is a small MLP trainer with
//! switches that plant the memory bugs vramscope's inspector finds.
//!
//! ```
//! use vramscope_kernels::{DType, Device, Tensor};
//!
//! let device = Device::sim(64 << 20);
//! let a = Tensor::from_host(&device, &[1.0, 2.0, 3.0, 4.0], &[2, 2], DType::F32).unwrap();
//! let b = Tensor::full(&device, &[2, 2], DType::F32, 1.0).unwrap();
//! let c = a.matmul(&b).unwrap();
//! assert_eq!(c.to_host().unwrap(), vec![3.0, 3.0, 7.0, 7.0]);
//! assert_eq!(c.sum().unwrap().item().unwrap(), 20.0);
//! ```

pub mod cpu;
pub mod cuda;
pub mod device;
pub mod dtype;
pub mod tensor;
pub mod train;

pub use cpu::AdamW;
pub use device::{Device, Engine};
pub use dtype::DType;
pub use tensor::{Tensor, TensorError};
pub use train::{train, train_with, Optimizer, TrainConfig, TrainHooks, TrainReport};
