//! [`DeviceBackend`]: the backend a program gets at run time, CUDA when it can, simulated otherwise.
//!
//! Programs that should run on a GPU when one is there and on the backed simulated device
//! otherwise build their `crate::CachingAllocator` on a `DeviceBackend`, which
//! delegates every [`Backend`] call to a `crate::cuda::CudaBackend` or a
//! `crate::SimDevice`. [`DeviceBackend::detect`] makes the choice and says why in one line;
//! [`doctor`] reports everything the choice was based on (driver library, driver version,
//! devices and their memory, NVRTC) for `vramscope doctor`. The kernels crate reaches the CUDA
//! side through [`DeviceBackend::as_cuda`] to launch kernels.

use std::fmt;

use crate::cuda::{self, CudaBackend, CudaDeviceInfo};
use vramscope_caching::SimDevice;
use vramscope_caching::{Backend, BackendError, EventId, MemInfo, StreamId};
use vramscope_model::format_bytes;

/// The environment variable that forces the simulated device (`VRAMSCOPE_BACKEND=sim`).
pub const BACKEND_ENV: &str = "VRAMSCOPE_BACKEND";

/// Capacity of the simulated device that [`doctor`] describes.
pub const DEFAULT_SIM_CAPACITY: u64 = 8 << 30;

/// A CUDA device or a simulated one, chosen at run time.
#[derive(Clone)]
pub enum DeviceBackend {
    /// The simulated device.
    Sim(SimDevice),
    /// A CUDA device.
    Cuda(CudaBackend),
}

macro_rules! delegate {
    ($self:ident, $dev:ident => $call:expr) => {
        match $self {
            DeviceBackend::Sim($dev) => $call,
            DeviceBackend::Cuda($dev) => $call,
        }
    };
}

impl DeviceBackend {
    /// CUDA device 0 when the driver library loads and reports a device, otherwise a backed
    /// simulated device of `capacity_for_sim` bytes. The string says in one line what was
    /// chosen and why. `VRAMSCOPE_BACKEND=sim` forces the simulated device.
    pub fn detect(capacity_for_sim: u64) -> (DeviceBackend, String) {
        let sim = |why: &str| {
            (
                DeviceBackend::Sim(SimDevice::backed(capacity_for_sim)),
                format!(
                    "simulated device (backed, {}): {why}",
                    format_bytes(capacity_for_sim)
                ),
            )
        };
        if std::env::var(BACKEND_ENV).is_ok_and(|v| v.eq_ignore_ascii_case("sim")) {
            return sim(&format!("{BACKEND_ENV}=sim"));
        }
        match DeviceBackend::cuda(0) {
            Ok(device) => {
                let line = device.describe();
                (device, line)
            }
            Err(reason) => sim(&format!("no usable CUDA device ({reason})")),
        }
    }

    /// A backed simulated device of `capacity` bytes.
    pub fn sim(capacity: u64) -> DeviceBackend {
        DeviceBackend::Sim(SimDevice::backed(capacity))
    }

    /// CUDA device `ordinal`, or the one-line reason it cannot be opened.
    pub fn cuda(ordinal: u32) -> Result<DeviceBackend, String> {
        CudaBackend::new(ordinal).map(DeviceBackend::Cuda)
    }

    /// The CUDA backend, when this is one.
    pub fn as_cuda(&self) -> Option<&CudaBackend> {
        match self {
            DeviceBackend::Cuda(c) => Some(c),
            DeviceBackend::Sim(_) => None,
        }
    }

    /// The simulated device, when this is one.
    pub fn as_sim(&self) -> Option<&SimDevice> {
        match self {
            DeviceBackend::Sim(s) => Some(s),
            DeviceBackend::Cuda(_) => None,
        }
    }

    /// Whether this is a CUDA device.
    pub fn is_cuda(&self) -> bool {
        matches!(self, DeviceBackend::Cuda(_))
    }

    /// One line naming the device: `"CUDA device 0: NVIDIA H200 (140 GiB, compute 9.0)"`.
    pub fn describe(&self) -> String {
        match self {
            DeviceBackend::Cuda(c) => {
                let (major, minor) = c.compute_capability();
                format!(
                    "CUDA device {}: {} ({}, compute {major}.{minor})",
                    c.device_index(),
                    c.name(),
                    format_bytes(c.mem_info().total)
                )
            }
            DeviceBackend::Sim(s) => format!(
                "simulated device {} ({}, {})",
                s.device_index(),
                if s.is_backed() { "backed" } else { "phantom" },
                format_bytes(s.capacity())
            ),
        }
    }
}

impl fmt::Debug for DeviceBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.describe())
    }
}

impl Backend for DeviceBackend {
    fn name(&self) -> String {
        delegate!(self, d => d.name())
    }

    fn kind(&self) -> &'static str {
        delegate!(self, d => d.kind())
    }

    fn device_index(&self) -> u32 {
        delegate!(self, d => d.device_index())
    }

    fn malloc(&self, size: u64) -> Result<u64, BackendError> {
        delegate!(self, d => d.malloc(size))
    }

    fn free(&self, addr: u64) -> Result<(), BackendError> {
        delegate!(self, d => d.free(addr))
    }

    fn mem_info(&self) -> MemInfo {
        delegate!(self, d => d.mem_info())
    }

    fn create_stream(&self) -> Result<StreamId, BackendError> {
        delegate!(self, d => d.create_stream())
    }

    fn create_event(&self) -> Result<EventId, BackendError> {
        delegate!(self, d => d.create_event())
    }

    fn destroy_event(&self, event: EventId) -> Result<(), BackendError> {
        delegate!(self, d => d.destroy_event(event))
    }

    fn record_event(&self, event: EventId, stream: StreamId) -> Result<(), BackendError> {
        delegate!(self, d => d.record_event(event, stream))
    }

    fn query_event(&self, event: EventId) -> Result<bool, BackendError> {
        delegate!(self, d => d.query_event(event))
    }

    fn stream_wait_event(&self, stream: StreamId, event: EventId) -> Result<(), BackendError> {
        delegate!(self, d => d.stream_wait_event(stream, event))
    }

    fn synchronize_stream(&self, stream: StreamId) -> Result<(), BackendError> {
        delegate!(self, d => d.synchronize_stream(stream))
    }

    fn synchronize(&self) -> Result<(), BackendError> {
        delegate!(self, d => d.synchronize())
    }

    fn memset(&self, addr: u64, value: u8, len: u64, stream: StreamId) -> Result<(), BackendError> {
        delegate!(self, d => d.memset(addr, value, len, stream))
    }

    fn copy_host_to_device(
        &self,
        dst: u64,
        src: &[u8],
        stream: StreamId,
    ) -> Result<(), BackendError> {
        delegate!(self, d => d.copy_host_to_device(dst, src, stream))
    }

    fn copy_device_to_host(
        &self,
        dst: &mut [u8],
        src: u64,
        stream: StreamId,
    ) -> Result<(), BackendError> {
        delegate!(self, d => d.copy_device_to_host(dst, src, stream))
    }

    fn copy_device_to_device(
        &self,
        dst: u64,
        src: u64,
        len: u64,
        stream: StreamId,
    ) -> Result<(), BackendError> {
        delegate!(self, d => d.copy_device_to_device(dst, src, len, stream))
    }

    fn vm_granularity(&self) -> u64 {
        delegate!(self, d => d.vm_granularity())
    }

    fn reserve_address_range(&self, size: u64) -> Result<u64, BackendError> {
        delegate!(self, d => d.reserve_address_range(size))
    }

    fn release_address_range(&self, addr: u64, size: u64) -> Result<(), BackendError> {
        delegate!(self, d => d.release_address_range(addr, size))
    }

    fn map(&self, addr: u64, size: u64) -> Result<(), BackendError> {
        delegate!(self, d => d.map(addr, size))
    }

    fn unmap(&self, addr: u64, size: u64) -> Result<(), BackendError> {
        delegate!(self, d => d.unmap(addr, size))
    }
}

/// What `vramscope doctor` found: the facts behind the backend choice.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DoctorReport {
    /// Whether the CUDA driver library could be opened.
    pub driver_library_found: bool,
    /// Driver API version (major, minor), when the driver initialized.
    pub driver_version: Option<(u32, u32)>,
    /// Why the driver could not be used, when it could not.
    pub driver_problem: Option<String>,
    /// The CUDA devices, with their memory.
    pub devices: Vec<CudaDeviceInfo>,
    /// NVRTC's version, or why it is unavailable.
    pub nvrtc: Result<(u32, u32), String>,
    /// The backend kind a program would get: `"cuda"` or `"sim"`.
    pub backend: &'static str,
    /// The one line [`DeviceBackend::detect`] gives for that choice.
    pub backend_reason: String,
}

/// Probes the machine the way [`DeviceBackend::detect`] does and reports what it found.
pub fn doctor() -> DoctorReport {
    let driver_library_found = cuda::driver_library_present();
    let (driver_version, driver_problem, mut devices) = match cuda::probe() {
        Ok(info) => (Some(info.version), None, info.devices),
        Err(reason) => (None, Some(reason), Vec::new()),
    };
    for device in &mut devices {
        if let Ok(backend) = CudaBackend::new(device.ordinal) {
            device.free_bytes = Some(backend.mem_info().free);
        }
    }
    let (backend, backend_reason) = DeviceBackend::detect(DEFAULT_SIM_CAPACITY);
    DoctorReport {
        driver_library_found,
        driver_version,
        driver_problem,
        devices,
        nvrtc: cuda::nvrtc_version(),
        backend: backend.kind(),
        backend_reason,
    }
}

impl fmt::Display for DoctorReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let found = if self.driver_library_found {
            "found"
        } else {
            "not found"
        };
        writeln!(f, "CUDA driver library: {found}")?;
        match (self.driver_version, &self.driver_problem) {
            (Some((major, minor)), _) => writeln!(f, "driver version: {major}.{minor}")?,
            (None, Some(problem)) => writeln!(f, "driver: unusable: {problem}")?,
            (None, None) => writeln!(f, "driver: unusable")?,
        }
        writeln!(f, "devices: {}", self.devices.len())?;
        for d in &self.devices {
            let free = d
                .free_bytes
                .map(|b| format!(", {} free", format_bytes(b)))
                .unwrap_or_default();
            writeln!(
                f,
                "  cuda:{} {}: {} total{free}, compute {}.{}",
                d.ordinal,
                d.name,
                format_bytes(d.total_bytes),
                d.compute_capability.0,
                d.compute_capability.1
            )?;
        }
        match &self.nvrtc {
            Ok((major, minor)) => {
                writeln!(f, "NVRTC: {major}.{minor} (kernels compile at first use)")?
            }
            Err(reason) => writeln!(f, "NVRTC: unavailable: {reason}")?,
        }
        write!(f, "backend: {}: {}", self.backend, self.backend_reason)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::CachingAllocator;
    use vramscope_model::AllocatorConfig;

    #[test]
    fn detect_always_gives_a_working_device_and_a_reason() {
        let (device, reason) = DeviceBackend::detect(64 << 20);
        assert!(!reason.is_empty() && !reason.contains('\n'), "{reason}");
        assert_eq!(device.kind() == "cuda", device.is_cuda());
        if !device.is_cuda() {
            assert!(
                reason.starts_with("simulated device (backed, 64.0 MiB)"),
                "{reason}"
            );
            assert_eq!(device.mem_info().total, 64 << 20);
        }
        let alloc = CachingAllocator::new(device, AllocatorConfig::default());
        let mut buf = alloc.alloc(1000).unwrap();
        buf.copy_from_host(&[7; 1000]).unwrap();
        let mut back = [0u8; 1000];
        buf.copy_to_host(&mut back).unwrap();
        assert_eq!(back, [7; 1000]);
    }

    #[test]
    fn the_sim_variant_delegates_everything() {
        let device = DeviceBackend::sim(16 << 20);
        assert!(device.as_sim().is_some() && device.as_cuda().is_none());
        assert_eq!(device.name(), "sim (backed)");
        let base = device.reserve_address_range(4 << 20).unwrap();
        device.map(base, 2 << 20).unwrap();
        device.memset(base, 3, 16, StreamId::DEFAULT).unwrap();
        let mut out = [0u8; 4];
        device
            .copy_device_to_host(&mut out, base + 4, StreamId::DEFAULT)
            .unwrap();
        assert_eq!(out, [3; 4]);
        device.unmap(base, 2 << 20).unwrap();
        device.release_address_range(base, 4 << 20).unwrap();
        assert!(device.describe().starts_with("simulated device 0 (backed"));
    }

    #[test]
    fn doctor_reports_every_line() {
        let report = doctor();
        let text = report.to_string();
        println!("{text}");
        for key in ["CUDA driver library:", "devices:", "NVRTC:", "backend:"] {
            assert!(text.contains(key), "{key} missing from:\n{text}");
        }
        assert!(report.driver_library_found || report.devices.is_empty());
        if report.devices.is_empty() {
            assert_eq!(report.backend, "sim");
        }
    }
}
