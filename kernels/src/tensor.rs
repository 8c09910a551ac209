//! [`Tensor`]: a shaped, typed array in device memory, with the ops a small MLP needs.
//!
//! A tensor's storage is a `DeviceBuffer` from its `crate::device::Device`'s caching allocator,
//! so the allocator records each tensor's allocation with the *caller's* line: every
//! constructor and op is `#[track_caller]` down to the allocator, and so are the transfers
//! ([`Tensor::from_host`], [`Tensor::to_host`], [`Tensor::item`], [`Tensor::to_device`]), which go
//! through the buffer's recorded copies so the inspector's `sync_in_loop` and `transfer_heavy`
//! detectors see them where the user wrote them. Ops run as CUDA kernels (`crate::cuda`) or as
//! their CPU twins (`crate::cpu`) as the device's engine decides; the CPU path reads and writes
//! device memory through the backend directly, which is kernel work, not a transfer, and is not
//! recorded. Operands must live on the same device; otherwise the op fails with an error naming
//! both devices and the lines where both tensors were made.

use std::fmt;
use std::panic::Location;

use vramscope_allocator::{
    AllocError, Backend, BackendError, DeviceBackend, DeviceBuffer, StreamId,
};

use crate::cpu::{self, AdamW};
use crate::cuda::{Arg, Kernels, Launch};
use crate::device::{Device, Engine};
use crate::dtype::DType;

/// Why a tensor operation failed.
#[derive(Debug)]
#[non_exhaustive]
pub enum TensorError {
    /// The operands live on different devices.
    DeviceMismatch {
        /// The operation.
        op: &'static str,
        /// The first operand's device.
        left_device: String,
        /// Where the first operand was made (`file:line:column`).
        left_origin: String,
        /// The second operand's device.
        right_device: String,
        /// Where the second operand was made.
        right_origin: String,
    },
    /// Shapes, lengths or element counts do not fit the operation.
    Shape {
        /// The operation.
        op: &'static str,
        /// What does not fit.
        message: String,
    },
    /// The allocator refused (out of memory, or a copy out of bounds).
    Alloc(AllocError),
    /// The device failed.
    Backend(BackendError),
    /// A kernel could not be launched.
    Kernel {
        /// The operation.
        op: &'static str,
        /// The driver's or launcher's message.
        message: String,
    },
}

impl fmt::Display for TensorError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TensorError::DeviceMismatch {
                op,
                left_device,
                left_origin,
                right_device,
                right_origin,
            } => write!(
                f,
                "{op}: operands are on different devices: one is on {left_device} (made at {left_origin}), the other on {right_device} (made at {right_origin}); move one with to_device"
            ),
            TensorError::Shape { op, message } => write!(f, "{op}: {message}"),
            TensorError::Alloc(e) => write!(f, "{e}"),
            TensorError::Backend(e) => write!(f, "device error: {e}"),
            TensorError::Kernel { op, message } => write!(f, "{op}: kernel failed: {message}"),
        }
    }
}

impl std::error::Error for TensorError {}

impl From<AllocError> for TensorError {
    fn from(e: AllocError) -> Self {
        TensorError::Alloc(e)
    }
}

impl From<BackendError> for TensorError {
    fn from(e: BackendError) -> Self {
        TensorError::Backend(e)
    }
}

fn shape_error(op: &'static str, message: String) -> TensorError {
    TensorError::Shape { op, message }
}

/// A shaped, typed array in one device's memory. Freed (returned to the allocator's cache)
/// when dropped.
pub struct Tensor {
    device: Device,
    buffer: DeviceBuffer<DeviceBackend>,
    shape: Vec<usize>,
    dtype: DType,
    origin: &'static Location<'static>,
}

impl fmt::Debug for Tensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Tensor({:?} {} on {}, made at {})",
            self.shape, self.dtype, self.device, self.origin
        )
    }
}

impl Tensor {
    // ---- Construction and transfers -------------------------------------------------------

    /// Allocates an uninitialized tensor; the allocation is recorded at the caller's line.
    #[track_caller]
    fn alloc(device: &Device, shape: &[usize], dtype: DType) -> Result<Tensor, TensorError> {
        let numel: usize = shape.iter().product();
        let buffer = device.allocator().alloc((numel * dtype.size()) as u64)?;
        Ok(Tensor {
            device: device.clone(),
            buffer,
            shape: shape.to_vec(),
            dtype,
            origin: Location::caller(),
        })
    }

    /// A tensor of zeros.
    #[track_caller]
    pub fn zeros(device: &Device, shape: &[usize], dtype: DType) -> Result<Tensor, TensorError> {
        let mut t = Tensor::alloc(device, shape, dtype)?;
        // Zero bits are 0.0 in every supported dtype.
        t.buffer.fill(0)?;
        Ok(t)
    }

    /// A tensor with every element `value`.
    #[track_caller]
    pub fn full(
        device: &Device,
        shape: &[usize],
        dtype: DType,
        value: f32,
    ) -> Result<Tensor, TensorError> {
        let mut t = Tensor::alloc(device, shape, dtype)?;
        t.fill(value)?;
        Ok(t)
    }

    /// A tensor whose every element is poison (NaN), so reading it before writing shows.
    #[track_caller]
    pub fn poisoned(device: &Device, shape: &[usize], dtype: DType) -> Result<Tensor, TensorError> {
        let mut t = Tensor::alloc(device, shape, dtype)?;
        t.poison()?;
        Ok(t)
    }

    /// Copies `data` to a new tensor on `device`, recorded as a host→device transfer at the
    /// caller's line.
    #[track_caller]
    pub fn from_host(
        device: &Device,
        data: &[f32],
        shape: &[usize],
        dtype: DType,
    ) -> Result<Tensor, TensorError> {
        let numel: usize = shape.iter().product();
        if data.len() != numel {
            return Err(shape_error(
                "from_host",
                format!(
                    "{} values do not fill shape {shape:?} ({numel} elements)",
                    data.len()
                ),
            ));
        }
        let mut t = Tensor::alloc(device, shape, dtype)?;
        t.buffer.copy_from_host(&dtype.encode(data))?;
        Ok(t)
    }

    /// Copies the tensor to the host as f32, recorded as a device→host transfer (a sync) at the
    /// caller's line.
    #[track_caller]
    pub fn to_host(&self) -> Result<Vec<f32>, TensorError> {
        let mut bytes = vec![0u8; self.byte_len()];
        self.buffer.copy_to_host(&mut bytes)?;
        Ok(self.dtype.decode(&bytes))
    }

    /// The value of a one-element tensor, copied to the host (a sync, like PyTorch's `.item()`),
    /// recorded at the caller's line.
    #[track_caller]
    pub fn item(&self) -> Result<f32, TensorError> {
        if self.numel() != 1 {
            return Err(shape_error(
                "item",
                format!(
                    "a tensor of shape {:?} has {} elements, not one",
                    self.shape,
                    self.numel()
                ),
            ));
        }
        Ok(self.to_host()?[0])
    }

    /// A copy on `device`. Across devices this is a device→host then a host→device transfer,
    /// both recorded at the caller's line; on the same device, a device→device copy.
    #[track_caller]
    pub fn to_device(&self, device: &Device) -> Result<Tensor, TensorError> {
        if self.device.same_as(device) {
            return self.try_clone();
        }
        let mut bytes = vec![0u8; self.byte_len()];
        self.buffer.copy_to_host(&mut bytes)?;
        let mut t = Tensor::alloc(device, &self.shape, self.dtype)?;
        t.buffer.copy_from_host(&bytes)?;
        Ok(t)
    }

    /// A copy on the same device (a recorded device→device transfer).
    #[track_caller]
    pub fn try_clone(&self) -> Result<Tensor, TensorError> {
        let mut t = Tensor::alloc(&self.device, &self.shape, self.dtype)?;
        t.buffer
            .copy_from_device(&self.buffer, self.byte_len() as u64)?;
        Ok(t)
    }

    /// The same storage with another shape of the same element count.
    pub fn reshape(mut self, shape: &[usize]) -> Result<Tensor, TensorError> {
        let numel: usize = shape.iter().product();
        if numel != self.numel() {
            return Err(shape_error(
                "reshape",
                format!("cannot view {:?} as {shape:?}", self.shape),
            ));
        }
        self.shape = shape.to_vec();
        Ok(self)
    }

    // ---- Accessors ----------------------------------------------------------------------------

    /// The shape (empty for a scalar).
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// The number of elements.
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// Bytes of storage in use.
    pub fn byte_len(&self) -> usize {
        self.numel() * self.dtype.size()
    }

    /// The device the tensor lives on.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// Where the tensor was made.
    pub fn origin(&self) -> &'static Location<'static> {
        self.origin
    }

    /// The device address of the first element.
    pub fn addr(&self) -> u64 {
        self.buffer.addr()
    }

    /// The allocator buffer behind the tensor.
    pub fn buffer(&self) -> &DeviceBuffer<DeviceBackend> {
        &self.buffer
    }

    // ---- Dispatch helpers ---------------------------------------------------------------------

    /// Reads the elements through the backend, as kernel work (not a recorded transfer).
    fn read(&self) -> Result<Vec<f32>, TensorError> {
        let mut bytes = vec![0u8; self.byte_len()];
        self.device
            .backend()
            .copy_device_to_host(&mut bytes, self.addr(), self.buffer.stream())?;
        Ok(self.dtype.decode(&bytes))
    }

    /// Writes the elements through the backend, as kernel work (not a recorded transfer).
    fn write(&self, values: &[f32]) -> Result<(), TensorError> {
        let bytes = self.dtype.encode(values);
        self.device
            .backend()
            .copy_host_to_device(self.addr(), &bytes, self.buffer.stream())?;
        Ok(())
    }

    fn launch(
        &self,
        kernels: &Kernels,
        op: &'static str,
        name: &str,
        launch: Launch,
        args: &[Arg],
    ) -> Result<(), TensorError> {
        let cuda = self
            .device
            .backend()
            .as_cuda()
            .ok_or_else(|| TensorError::Kernel {
                op,
                message: "CUDA kernels on a device that is not CUDA".to_string(),
            })?;
        kernels
            .launch(cuda, StreamId::DEFAULT, name, launch, args)
            .map_err(|message| TensorError::Kernel { op, message })
    }

    fn same_device(&self, op: &'static str, other: &Tensor) -> Result<(), TensorError> {
        if self.device.same_as(&other.device) {
            Ok(())
        } else {
            Err(TensorError::DeviceMismatch {
                op,
                left_device: self.device.to_string(),
                left_origin: self.origin.to_string(),
                right_device: other.device.to_string(),
                right_origin: other.origin.to_string(),
            })
        }
    }

    fn same_numel(&self, op: &'static str, other: &Tensor) -> Result<(), TensorError> {
        self.same_device(op, other)?;
        if self.numel() == other.numel() {
            Ok(())
        } else {
            Err(shape_error(
                op,
                format!(
                    "shapes {:?} and {:?} differ in size",
                    self.shape, other.shape
                ),
            ))
        }
    }

    fn ptr(&self) -> Arg {
        Arg::Ptr(self.addr())
    }

    fn code(&self) -> Arg {
        Arg::I32(self.dtype.code())
    }

    fn n(&self) -> Arg {
        Arg::U64(self.numel() as u64)
    }

    fn matrix(&self, op: &'static str) -> Result<(usize, usize), TensorError> {
        match self.shape[..] {
            [rows, cols] => Ok((rows, cols)),
            _ => Err(shape_error(
                op,
                format!("expected a matrix, got shape {:?}", self.shape),
            )),
        }
    }

    // ---- In-place element-wise ops --------------------------------------------------------------

    /// Sets every element to `value`.
    pub fn fill(&mut self, value: f32) -> Result<(), TensorError> {
        if self.numel() == 0 {
            return Ok(());
        }
        match self.device.engine() {
            Engine::Host { .. } => self.write(&vec![value; self.numel()]),
            Engine::Cuda(k) => self.launch(
                k,
                "fill",
                "vs_fill",
                Launch::linear(self.numel() as u64),
                &[self.ptr(), self.code(), self.n(), Arg::F32(value)],
            ),
        }
    }

    /// Overwrites every byte with `0xff`, which is NaN in f32, f16 and bf16 alike.
    pub fn poison(&mut self) -> Result<(), TensorError> {
        self.buffer.fill(0xff)?;
        Ok(())
    }

    /// `self = alpha · x + self`.
    pub fn axpy(&mut self, alpha: f32, x: &Tensor) -> Result<(), TensorError> {
        self.same_numel("axpy", x)?;
        if self.numel() == 0 {
            return Ok(());
        }
        match self.device.engine() {
            Engine::Host { .. } => {
                let mut y = self.read()?;
                cpu::axpy(alpha, &x.read()?, &mut y);
                self.write(&y)
            }
            Engine::Cuda(k) => self.launch(
                k,
                "axpy",
                "vs_axpy",
                Launch::linear(self.numel() as u64),
                &[
                    self.n(),
                    Arg::F32(alpha),
                    x.ptr(),
                    x.code(),
                    self.ptr(),
                    self.code(),
                ],
            ),
        }
    }

    /// `self = alpha · self`.
    pub fn scale(&mut self, alpha: f32) -> Result<(), TensorError> {
        if self.numel() == 0 {
            return Ok(());
        }
        match self.device.engine() {
            Engine::Host { .. } => {
                let mut y = self.read()?;
                cpu::scale(alpha, &mut y);
                self.write(&y)
            }
            Engine::Cuda(k) => self.launch(
                k,
                "scale",
                "vs_scale",
                Launch::linear(self.numel() as u64),
                &[self.n(), Arg::F32(alpha), self.ptr(), self.code()],
            ),
        }
    }

    // ---- Ops that make a new tensor ----------------------------------------------------------

    /// A copy converted to `dtype`.
    #[track_caller]
    pub fn to_dtype(&self, dtype: DType) -> Result<Tensor, TensorError> {
        let out = Tensor::alloc(&self.device, &self.shape, dtype)?;
        self.cast_into(&out, 0, self.numel())?;
        Ok(out)
    }

    /// Element `index` (in row-major order) as a new one-element tensor, like `t.flatten()[i]`.
    #[track_caller]
    pub fn element(&self, index: usize) -> Result<Tensor, TensorError> {
        if index >= self.numel() {
            return Err(shape_error(
                "element",
                format!("index {index} is out of bounds for shape {:?}", self.shape),
            ));
        }
        let out = Tensor::alloc(&self.device, &[], self.dtype)?;
        self.cast_into(&out, index, 1)?;
        Ok(out)
    }

    /// Converts `count` elements starting at `offset` into the start of `out`.
    fn cast_into(&self, out: &Tensor, offset: usize, count: usize) -> Result<(), TensorError> {
        if count == 0 {
            return Ok(());
        }
        let src = self.addr() + (offset * self.dtype.size()) as u64;
        match self.device.engine() {
            Engine::Host { .. } => {
                let mut bytes = vec![0u8; count * self.dtype.size()];
                self.device
                    .backend()
                    .copy_device_to_host(&mut bytes, src, self.buffer.stream())?;
                out.write(&self.dtype.decode(&bytes))
            }
            Engine::Cuda(k) => self.launch(
                k,
                "cast",
                "vs_cast",
                Launch::linear(count as u64),
                &[
                    Arg::Ptr(src),
                    self.code(),
                    out.ptr(),
                    out.code(),
                    Arg::U64(count as u64),
                ],
            ),
        }
    }

    /// The matrix product `self · rhs`, in `self`'s dtype.
    #[track_caller]
    pub fn matmul(&self, rhs: &Tensor) -> Result<Tensor, TensorError> {
        self.matmul_ex(rhs, false, false, self.dtype)
    }

    /// The matrix product `op(self) · op(rhs)`, where `op` transposes its operand when the flag
    /// is set, stored as `out_dtype` (accumulation is always f32).
    #[track_caller]
    pub fn matmul_ex(
        &self,
        rhs: &Tensor,
        trans_a: bool,
        trans_b: bool,
        out_dtype: DType,
    ) -> Result<Tensor, TensorError> {
        self.same_device("matmul", rhs)?;
        let (ar, ac) = self.matrix("matmul")?;
        let (br, bc) = rhs.matrix("matmul")?;
        let (m, k) = if trans_a { (ac, ar) } else { (ar, ac) };
        let (k2, n) = if trans_b { (bc, br) } else { (br, bc) };
        if k != k2 {
            return Err(shape_error(
                "matmul",
                format!(
                    "inner dimensions differ: {:?}{} · {:?}{}",
                    self.shape,
                    if trans_a { "ᵀ" } else { "" },
                    rhs.shape,
                    if trans_b { "ᵀ" } else { "" }
                ),
            ));
        }
        let out = Tensor::alloc(&self.device, &[m, n], out_dtype)?;
        if m * n == 0 {
            return Ok(out);
        }
        match self.device.engine() {
            Engine::Host { .. } => {
                let mut c = vec![0.0; m * n];
                cpu::matmul(
                    &self.read()?,
                    &rhs.read()?,
                    &mut c,
                    m,
                    n,
                    k,
                    trans_a,
                    trans_b,
                );
                out.write(&c)?;
            }
            Engine::Cuda(kernels) => self.launch(
                kernels,
                "matmul",
                "vs_matmul",
                Launch::tiles(m, n),
                &[
                    self.ptr(),
                    self.code(),
                    rhs.ptr(),
                    rhs.code(),
                    out.ptr(),
                    out.code(),
                    Arg::I32(m as i32),
                    Arg::I32(n as i32),
                    Arg::I32(k as i32),
                    Arg::I32(trans_a as i32),
                    Arg::I32(trans_b as i32),
                ],
            )?,
        }
        Ok(out)
    }

    /// `self[r][c] + bias[c]` for a matrix `self` and a vector `bias`, in `self`'s dtype.
    #[track_caller]
    pub fn add_bias(&self, bias: &Tensor) -> Result<Tensor, TensorError> {
        self.same_device("add_bias", bias)?;
        let (rows, cols) = self.matrix("add_bias")?;
        if bias.shape != [cols] {
            return Err(shape_error(
                "add_bias",
                format!(
                    "bias of shape {:?} does not fit {:?}",
                    bias.shape, self.shape
                ),
            ));
        }
        let out = Tensor::alloc(&self.device, &self.shape, self.dtype)?;
        if rows * cols == 0 {
            return Ok(out);
        }
        match self.device.engine() {
            Engine::Host { .. } => {
                let mut y = vec![0.0; rows * cols];
                cpu::add_bias(&self.read()?, &bias.read()?, &mut y);
                out.write(&y)?;
            }
            Engine::Cuda(k) => self.launch(
                k,
                "add_bias",
                "vs_add_bias",
                Launch::linear((rows * cols) as u64),
                &[
                    self.ptr(),
                    self.code(),
                    bias.ptr(),
                    bias.code(),
                    out.ptr(),
                    out.code(),
                    Arg::U64(rows as u64),
                    Arg::U64(cols as u64),
                ],
            )?,
        }
        Ok(out)
    }

    /// `max(self, 0)`.
    #[track_caller]
    pub fn relu(&self) -> Result<Tensor, TensorError> {
        let out = Tensor::alloc(&self.device, &self.shape, self.dtype)?;
        if self.numel() == 0 {
            return Ok(out);
        }
        match self.device.engine() {
            Engine::Host { .. } => {
                let mut y = vec![0.0; self.numel()];
                cpu::relu(&self.read()?, &mut y);
                out.write(&y)?;
            }
            Engine::Cuda(k) => self.launch(
                k,
                "relu",
                "vs_relu",
                Launch::linear(self.numel() as u64),
                &[self.ptr(), self.code(), out.ptr(), out.code(), self.n()],
            )?,
        }
        Ok(out)
    }

    /// The gradient through a relu: `grad` where `input > 0`, else 0, in `grad`'s dtype.
    #[track_caller]
    pub fn relu_backward(grad: &Tensor, input: &Tensor) -> Result<Tensor, TensorError> {
        grad.same_numel("relu_backward", input)?;
        let out = Tensor::alloc(&grad.device, &grad.shape, grad.dtype)?;
        if grad.numel() == 0 {
            return Ok(out);
        }
        match grad.device.engine() {
            Engine::Host { .. } => {
                let mut y = vec![0.0; grad.numel()];
                cpu::relu_backward(&grad.read()?, &input.read()?, &mut y);
                out.write(&y)?;
            }
            Engine::Cuda(k) => grad.launch(
                k,
                "relu_backward",
                "vs_relu_backward",
                Launch::linear(grad.numel() as u64),
                &[
                    grad.ptr(),
                    grad.code(),
                    input.ptr(),
                    input.code(),
                    out.ptr(),
                    out.code(),
                    grad.n(),
                ],
            )?,
        }
        Ok(out)
    }

    /// Mean softmax cross-entropy of `self` (logits, `[batch, classes]`) against `labels`
    /// (`[batch]`, class indices as floats). Returns the loss (an f32 scalar) and its gradient
    /// with respect to the logits (in the logits' dtype).
    #[track_caller]
    pub fn softmax_cross_entropy(&self, labels: &Tensor) -> Result<(Tensor, Tensor), TensorError> {
        self.same_device("softmax_cross_entropy", labels)?;
        let (rows, cols) = self.matrix("softmax_cross_entropy")?;
        if labels.shape != [rows] {
            return Err(shape_error(
                "softmax_cross_entropy",
                format!(
                    "labels of shape {:?} do not fit logits {:?}",
                    labels.shape, self.shape
                ),
            ));
        }
        let scale = if rows == 0 { 0.0 } else { 1.0 / rows as f32 };
        let loss_rows = Tensor::alloc(&self.device, &[rows], DType::F32)?;
        let grad = Tensor::alloc(&self.device, &self.shape, self.dtype)?;
        if rows * cols > 0 {
            match self.device.engine() {
                Engine::Host { .. } => {
                    let mut l = vec![0.0; rows];
                    let mut g = vec![0.0; rows * cols];
                    cpu::softmax_cross_entropy(
                        &self.read()?,
                        &labels.read()?,
                        cols,
                        &mut l,
                        &mut g,
                        scale,
                    );
                    loss_rows.write(&l)?;
                    grad.write(&g)?;
                }
                Engine::Cuda(k) => self.launch(
                    k,
                    "softmax_cross_entropy",
                    "vs_softmax_xent",
                    Launch::linear(rows as u64),
                    &[
                        self.ptr(),
                        self.code(),
                        labels.ptr(),
                        labels.code(),
                        Arg::U64(rows as u64),
                        Arg::U64(cols as u64),
                        loss_rows.ptr(),
                        grad.ptr(),
                        grad.code(),
                        Arg::F32(scale),
                    ],
                )?,
            }
        }
        let loss = loss_rows.reduce(scale)?;
        Ok((loss, grad))
    }

    /// The sum of every element, as an f32 scalar.
    #[track_caller]
    pub fn sum(&self) -> Result<Tensor, TensorError> {
        self.reduce(1.0)
    }

    /// The mean of every element, as an f32 scalar.
    #[track_caller]
    pub fn mean(&self) -> Result<Tensor, TensorError> {
        self.reduce(1.0 / self.numel().max(1) as f32)
    }

    #[track_caller]
    fn reduce(&self, scale: f32) -> Result<Tensor, TensorError> {
        let out = Tensor::alloc(&self.device, &[], DType::F32)?;
        match self.device.engine() {
            Engine::Host { .. } => out.write(&[cpu::sum(&self.read()?) * scale])?,
            Engine::Cuda(k) => self.launch(
                k,
                "sum",
                "vs_sum",
                Launch::single_block(),
                &[
                    self.ptr(),
                    self.code(),
                    self.n(),
                    out.ptr(),
                    out.code(),
                    Arg::F32(scale),
                ],
            )?,
        }
        Ok(out)
    }

    /// The sum over rows of a matrix (`[rows, cols]` → `[cols]`), as f32.
    #[track_caller]
    pub fn sum_rows(&self) -> Result<Tensor, TensorError> {
        let (rows, cols) = self.matrix("sum_rows")?;
        let out = Tensor::alloc(&self.device, &[cols], DType::F32)?;
        if cols == 0 {
            return Ok(out);
        }
        match self.device.engine() {
            Engine::Host { .. } => {
                let mut y = vec![0.0; cols];
                cpu::sum_rows(&self.read()?, &mut y);
                out.write(&y)?;
            }
            Engine::Cuda(k) => self.launch(
                k,
                "sum_rows",
                "vs_sum_rows",
                Launch::linear(cols as u64),
                &[
                    self.ptr(),
                    self.code(),
                    Arg::U64(rows as u64),
                    Arg::U64(cols as u64),
                    out.ptr(),
                    out.code(),
                ],
            )?,
        }
        Ok(out)
    }

    // ---- Optimizer updates ------------------------------------------------------------------------

    /// One SGD step on these weights: `self −= lr · (grad + weight_decay · self)`.
    pub fn sgd_step(
        &mut self,
        grad: &Tensor,
        lr: f32,
        weight_decay: f32,
    ) -> Result<(), TensorError> {
        self.same_numel("sgd_step", grad)?;
        if self.numel() == 0 {
            return Ok(());
        }
        match self.device.engine() {
            Engine::Host { .. } => {
                let mut w = self.read()?;
                cpu::sgd(&mut w, &grad.read()?, lr, weight_decay);
                self.write(&w)
            }
            Engine::Cuda(k) => self.launch(
                k,
                "sgd_step",
                "vs_sgd",
                Launch::linear(self.numel() as u64),
                &[
                    self.n(),
                    self.ptr(),
                    self.code(),
                    grad.ptr(),
                    grad.code(),
                    Arg::F32(lr),
                    Arg::F32(weight_decay),
                ],
            ),
        }
    }

    /// One AdamW step (1-based `step`) on these weights, with moments `m` and `v` of the same
    /// size (usually f32).
    pub fn adamw_step(
        &mut self,
        grad: &Tensor,
        m: &mut Tensor,
        v: &mut Tensor,
        params: &AdamW,
        step: u32,
    ) -> Result<(), TensorError> {
        self.same_numel("adamw_step", grad)?;
        self.same_numel("adamw_step", m)?;
        self.same_numel("adamw_step", v)?;
        if self.numel() == 0 {
            return Ok(());
        }
        match self.device.engine() {
            Engine::Host { .. } => {
                let mut w = self.read()?;
                let mut mm = m.read()?;
                let mut vv = v.read()?;
                cpu::adamw(&mut w, &grad.read()?, &mut mm, &mut vv, params, step);
                m.write(&mm)?;
                v.write(&vv)?;
                self.write(&w)
            }
            Engine::Cuda(k) => {
                let (bc1, bc2) = params.bias_corrections(step);
                self.launch(
                    k,
                    "adamw_step",
                    "vs_adamw",
                    Launch::linear(self.numel() as u64),
                    &[
                        self.n(),
                        self.ptr(),
                        self.code(),
                        grad.ptr(),
                        grad.code(),
                        m.ptr(),
                        m.code(),
                        v.ptr(),
                        v.code(),
                        Arg::F32(params.lr),
                        Arg::F32(params.beta1),
                        Arg::F32(params.beta2),
                        Arg::F32(params.eps),
                        Arg::F32(params.weight_decay),
                        Arg::F32(bc1),
                        Arg::F32(bc2),
                    ],
                )
            }
        }
    }
}
