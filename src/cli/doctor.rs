//! `vramscope doctor`: what this machine offers (CUDA driver, devices and memory, NVRTC, the
//! backend a program would get), as the allocator crate's `doctor` says it.

use super::common::{emit, Failure, Output};

/// `vramscope doctor`.
pub(super) fn run() -> Result<u8, Failure> {
    emit(
        &format!("{}\n", crate::allocator::doctor()),
        None,
        Output::Text { color: false },
    )?;
    Ok(0)
}
