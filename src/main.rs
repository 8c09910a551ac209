//! The `vramscope` binary: the command line of `vramscope::cli`, run on this process's
//! arguments.

use std::process::ExitCode;

fn main() -> ExitCode {
    ExitCode::from(vramscope::cli::main_with_args(std::env::args_os()))
}
