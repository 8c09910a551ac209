//! The `vramscope` binary: the command line of `vramscope::cli`, run on this process's
//! arguments.

use std::process::ExitCode;

fn main() -> ExitCode {
    return_freed_memory();
    ExitCode::from(vramscope::cli::main_with_args(std::env::args_os()))
}

/// The smallest allocation, in bytes, that glibc's allocator maps on its own (and unmaps when
/// it is freed): glibc's own starting value, 128 KiB.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
const OWN_MAPPING_FROM: libc::c_int = 128 << 10;

/// Makes glibc give back to the system the big blocks a phase frees, before the next phase
/// allocates.
///
/// By default glibc raises the size from which a block gets a mapping of its own to the size
/// of each such block freed, up to 32 MiB. Once an import has freed its big buffers, the
/// analysis's arrays of up to 32 MiB then come from the heap, whose freed memory stays with
/// the process: `vramscope report` on a 4M-event trace peaked 16 MiB above what it held. A
/// fixed threshold keeps every block of 128 KiB or more in its own mapping, returned when it
/// is freed; growing one is `mremap`, which copies nothing, and the capacity a `Vec` has not
/// yet filled takes no memory.
fn return_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: `mallopt` only sets a parameter of glibc's allocator, under the allocator's own
    // lock; no other thread has started yet.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, OWN_MAPPING_FROM);
    }
}
