//! The CUDA backend of a build without the `cuda` feature: the same names as `crate::cuda`'s,
//! with no driver behind them.
//!
//! A program that only reads snapshots (the inspector, a replay) has no use for the driver
//! bindings, so the crate can be built with `default-features = false` and links no cudarc.
//! Then [`probe`] says why there is no driver, [`CudaBackend::new`] fails with the same
//! reason, and `crate::any` falls back to the simulated device exactly as on a machine without
//! CUDA. A [`CudaBackend`] cannot exist in such a build: its one field is of a type with no
//! values, so every method is an empty match.

pub use crate::driver_info::{CudaDeviceInfo, DriverInfo};
use vramscope_caching::{Backend, BackendError, EventId, MemInfo, StreamId};

/// Why nothing here reaches a driver.
const NOT_BUILT: &str = "vramscope-allocator was built without its `cuda` feature";

/// A type with no values.
#[derive(Clone, Copy, Debug)]
enum Never {}

/// A CUDA device; in this build there is none (see the module documentation).
#[derive(Clone, Debug)]
pub struct CudaBackend {
    never: Never,
}

/// Whether the CUDA driver library can be opened: never, in this build.
pub fn driver_library_present() -> bool {
    false
}

/// The NVRTC version: none in this build.
pub fn nvrtc_version() -> Result<(u32, u32), String> {
    Err(NOT_BUILT.to_string())
}

/// The driver and its devices: none in this build.
pub fn probe() -> Result<DriverInfo, String> {
    Err(NOT_BUILT.to_string())
}

impl CudaBackend {
    /// Fails: this build has no CUDA backend.
    pub fn new(_ordinal: u32) -> Result<CudaBackend, String> {
        Err(NOT_BUILT.to_string())
    }

    /// Compute capability (major, minor).
    pub fn compute_capability(&self) -> (i32, i32) {
        match self.never {}
    }
}

impl Backend for CudaBackend {
    fn name(&self) -> String {
        match self.never {}
    }
    fn kind(&self) -> &'static str {
        match self.never {}
    }
    fn device_index(&self) -> u32 {
        match self.never {}
    }
    fn malloc(&self, _size: u64) -> Result<u64, BackendError> {
        match self.never {}
    }
    fn free(&self, _addr: u64) -> Result<(), BackendError> {
        match self.never {}
    }
    fn mem_info(&self) -> MemInfo {
        match self.never {}
    }
    fn create_stream(&self) -> Result<StreamId, BackendError> {
        match self.never {}
    }
    fn create_event(&self) -> Result<EventId, BackendError> {
        match self.never {}
    }
    fn destroy_event(&self, _event: EventId) -> Result<(), BackendError> {
        match self.never {}
    }
    fn record_event(&self, _event: EventId, _stream: StreamId) -> Result<(), BackendError> {
        match self.never {}
    }
    fn query_event(&self, _event: EventId) -> Result<bool, BackendError> {
        match self.never {}
    }
    fn stream_wait_event(&self, _stream: StreamId, _event: EventId) -> Result<(), BackendError> {
        match self.never {}
    }
    fn synchronize_stream(&self, _stream: StreamId) -> Result<(), BackendError> {
        match self.never {}
    }
    fn synchronize(&self) -> Result<(), BackendError> {
        match self.never {}
    }
    fn memset(
        &self,
        _addr: u64,
        _value: u8,
        _len: u64,
        _stream: StreamId,
    ) -> Result<(), BackendError> {
        match self.never {}
    }
    fn copy_host_to_device(
        &self,
        _dst: u64,
        _src: &[u8],
        _stream: StreamId,
    ) -> Result<(), BackendError> {
        match self.never {}
    }
    fn copy_device_to_host(
        &self,
        _dst: &mut [u8],
        _src: u64,
        _stream: StreamId,
    ) -> Result<(), BackendError> {
        match self.never {}
    }
    fn copy_device_to_device(
        &self,
        _dst: u64,
        _src: u64,
        _len: u64,
        _stream: StreamId,
    ) -> Result<(), BackendError> {
        match self.never {}
    }
    fn vm_granularity(&self) -> u64 {
        match self.never {}
    }
    fn reserve_address_range(&self, _size: u64) -> Result<u64, BackendError> {
        match self.never {}
    }
    fn release_address_range(&self, _addr: u64, _size: u64) -> Result<(), BackendError> {
        match self.never {}
    }
    fn map(&self, _addr: u64, _size: u64) -> Result<(), BackendError> {
        match self.never {}
    }
    fn unmap(&self, _addr: u64, _size: u64) -> Result<(), BackendError> {
        match self.never {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_build_without_cuda_finds_no_driver_and_says_why() {
        assert!(!driver_library_present());
        for reason in [
            probe().unwrap_err(),
            CudaBackend::new(0).unwrap_err(),
            nvrtc_version().unwrap_err(),
        ] {
            assert!(reason.contains("`cuda` feature"), "{reason}");
        }
    }
}
