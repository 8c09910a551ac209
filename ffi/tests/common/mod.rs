//! What the C ABI's test binaries share: where the build put the shared library they load.

use std::path::{Path, PathBuf};

/// The target directory of this test build.
pub fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    exe.parent().and_then(Path::parent).unwrap().to_path_buf()
}

/// The built `vramscope_ffi` shared library, as PyTorch would `dlopen` it.
pub fn library_path() -> PathBuf {
    let name = format!(
        "{}vramscope_ffi{}",
        std::env::consts::DLL_PREFIX,
        std::env::consts::DLL_SUFFIX
    );
    let dir = target_dir();
    [dir.join(&name), dir.join("deps").join(&name)]
        .into_iter()
        .find(|p| p.exists())
        .unwrap_or_else(|| panic!("{name} not built under {}", dir.display()))
}
