//! Loads the built vramscope C library, allocates through its C ABI and exits, so a test can
//! check that `VRAMSCOPE_SNAPSHOT_ON_EXIT` writes a snapshot when the host process ends.
//! Usage: `exit_snapshot PATH_TO_LIBVRAMSCOPE_FFI`.

use std::ffi::{c_int, c_void};

type Malloc = unsafe extern "C" fn(isize, c_int, *mut c_void) -> *mut c_void;

fn main() {
    let path = std::env::args().nth(1).expect("path to the library");
    // SAFETY: the library is vramscope's own cdylib, whose initialisers do nothing unusual.
    let library = unsafe { libloading::Library::new(&path) }.expect("library loads");
    // SAFETY: the symbol has exactly the `Malloc` signature in `ffi/src/lib.rs`.
    let malloc: libloading::Symbol<Malloc> = unsafe { library.get(b"vramscope_malloc") }.unwrap();
    // SAFETY: a valid size, device 0 and the default stream.
    let ptr = unsafe { malloc(1 << 20, 0, std::ptr::null_mut()) };
    assert!(!ptr.is_null());
    // Leave the library loaded so the exit hook still exists when the process ends.
    std::mem::forget(library);
}
