//! What the CUDA driver says about itself and its devices, for `doctor` reports: plain data,
//! the same whether the crate is built with its `cuda` feature (`crate::cuda` fills it from
//! the driver) or without (`crate::cuda` then never finds a driver).

/// What the driver said about itself and its devices, for `doctor` reports.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CudaDeviceInfo {
    /// Device ordinal.
    pub ordinal: u32,
    /// Marketing name (`"NVIDIA H200"`).
    pub name: String,
    /// Total memory in bytes.
    pub total_bytes: u64,
    /// Free memory in bytes, when a context could be made to ask.
    pub free_bytes: Option<u64>,
    /// Compute capability (major, minor).
    pub compute_capability: (i32, i32),
}

/// The driver as found on this machine.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DriverInfo {
    /// Driver API version as (major, minor), e.g. (12, 8).
    pub version: (u32, u32),
    /// The devices the driver reports.
    pub devices: Vec<CudaDeviceInfo>,
}
