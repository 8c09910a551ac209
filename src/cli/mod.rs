//! The `vramscope` command line: argument parsing, calls into the library crates, printing.
//!
//! It lives in the library so that one build serves both doors: the `vramscope` binary
//! (`src/main.rs`, which calls [`main_with_args`]) and the Python package's `vramscope`
//! command, which calls the same function from inside its native module, so the wheel carries
//! no second executable that could go stale.
//!
//! This module is the dispatch: the clap parser and one module per subcommand (as ripgrep's
//! `flags`), each holding its arguments and a few dozen lines of glue that parse them, call the
//! library crates and print what they return (`report`, `summary`, `diff`, `ranks`,
//! `convert`, `replay`, `view`, `top`, `doctor`, `demo` with its built-in workload, `run`);
//! decisions and warnings come back from the libraries as values. What they share is in
//! `common`, where `convert` writes in `sink`. Exit status: 0 on success, 1 when a finding
//! reaches `--fail-on` or a comparison differs, 2 for unusable input.
//!
//! Everything printed passes one door, `common::emit` for the output and `common::say` for
//! standard error: text and markdown through `vramscope_model::terminal::sanitize_output`
//! (only a text report's own colours pass as escape sequences), JSON and HTML through
//! `sanitize_json`, so that no string from a file acts on the terminal. A write that fails is exit 2 with the system's
//! words ("No space left on device"), except a closed pipe (`| head`), which ends quietly.
//! An output path of `-` is standard output: `convert -o -` streams to a pipe or a
//! redirection, its JSON escaped as `sanitize_json` escapes it (a CI log reads pipes), buffers
//! it on a terminal, and refuses to write the binary pickle to one. An output file is written
//! new and renamed onto its path (`model::files`), never through a link standing there.

mod common;
mod convert;
mod demo;
mod diff;
mod doctor;
mod loading;
mod ranks;
mod replay;
mod report;
mod run;
mod sink;
mod summary;
mod top;
mod view;

use std::io::Write;

use crate::import;
use crate::model::terminal;
use clap::{Args, Parser, Subcommand};
use common::{parse_size, say, Failure};

/// GPU memory debugger and allocator inspector.
#[derive(Parser)]
#[command(name = "vramscope", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

/// The ceiling on what a command that reads files reads: only those commands take it.
#[derive(Args, Clone, Copy, Default)]
struct InputLimit {
    /// The largest input file (or gzip content) read, e.g. 8GiB; 4GiB by default, or
    /// VRAMSCOPE_MAX_INPUT.
    #[arg(long, value_parser = parse_size)]
    max_input: Option<u64>,
}

#[derive(Subcommand)]
enum Command {
    /// Run a built-in training loop with planted memory bugs in the dashboard (or report on it).
    Demo(demo::DemoArgs),
    /// Open a snapshot, PyTorch pickle or Chrome trace in the dashboard, with a time cursor.
    View(view::ViewArgs),
    /// Attach the dashboard to a live program started with VRAMSCOPE_LISTEN, or to several
    /// (one address per rank or process: a row each, Enter opens one).
    Top(top::TopArgs),
    /// Diagnose a snapshot: ours, a PyTorch pickle, or a torch.profiler Chrome trace.
    Report(report::ReportArgs),
    /// Replay a trace's allocations through the caching allocator: peaks, segment calls, OOMs
    /// at a capacity, beside what the trace shows PyTorch did.
    Replay(replay::ReplayArgs),
    /// Convert a snapshot: to PyTorch's pickle (memory_viz reads it), Perfetto's trace JSON,
    /// or vramscope's JSON.
    Convert(convert::ConvertArgs),
    /// Say what this machine offers: CUDA driver, devices and memory, NVRTC, and which backend
    /// a program would get.
    Doctor,
    /// Run a training script watched, with no change to it (`vramscope run -- python
    /// train.py ARGS`): snapshot at exit and at OOM, the verdict, the script's exit status.
    Run(run::RunArgs),
    /// Print the memory summary table of any snapshot.
    Summary(summary::SummaryArgs),
    /// Compare the snapshots of a job's ranks side by side and name the ranks that stand out.
    Ranks(ranks::RanksArgs),
    /// Reduce one rank's snapshot to its summary for `ranks` (versioned JSON, kilobytes): the
    /// map of a big job, run where the snapshots are.
    Summarize(ranks::SummarizeArgs),
    /// Compare two snapshots by call site: what grew and what shrank, with both runs' peaks.
    Diff(diff::DiffArgs),
}

impl Command {
    /// The input ceiling given to a command that reads files; none for the others.
    fn input_limit(&self) -> InputLimit {
        match self {
            Command::View(args) => args.limit,
            Command::Convert(args) => args.limit,
            Command::Summary(args) => args.limit,
            Command::Ranks(args) => args.limit,
            Command::Summarize(args) => args.limit,
            Command::Diff(args) => args.limit,
            Command::Report(args) => args.limit,
            Command::Replay(args) => args.limit,
            Command::Demo(_) | Command::Top(_) | Command::Doctor | Command::Run(_) => {
                InputLimit::default()
            }
        }
    }
}

/// Runs the subcommand `cli` names.
fn run(cli: Cli) -> Result<u8, Failure> {
    match cli.command {
        Command::Demo(args) => demo::run_command(args),
        Command::View(args) => view::run(args),
        Command::Top(args) => top::run(args),
        Command::Report(args) => report::run(args),
        Command::Run(args) => run::run(args),
        Command::Replay(args) => replay::run(args),
        Command::Convert(args) => convert::run(args),
        Command::Doctor => doctor::run(),
        Command::Summary(args) => summary::run(args),
        Command::Ranks(args) => ranks::run(args),
        Command::Summarize(args) => ranks::run_summarize(args),
        Command::Diff(args) => diff::run(args),
    }
}

/// Runs the command line on `args` (the program's name first, as `std::env::args_os` gives
/// it) and returns the exit status: 0 on success, 1 when a finding reaches `--fail-on` or a
/// comparison differs, 2 for unusable input. `--help`, `--version` and argument errors print
/// and return their status (0 for help and version, 2 for a bad argument) without ending the
/// process, which may be a Python interpreter or a notebook's kernel.
pub fn main_with_args<I, T>(args: I) -> u8
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    let cli = match Cli::try_parse_from(args) {
        Ok(cli) => cli,
        Err(error) if !error.use_stderr() => {
            // Help and the version, on standard output: a failed write is exit 2 with the
            // system's words, as for every other output; a closed pipe ends quietly.
            let text = error.render().to_string();
            let mut stdout = std::io::stdout().lock();
            return match stdout
                .write_all(text.as_bytes())
                .and_then(|()| stdout.flush())
            {
                Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => {
                    say(format_args!(
                        "vramscope: cannot write to standard output: {e}"
                    ));
                    2
                }
                _ => u8::try_from(error.exit_code()).unwrap_or(2),
            };
        }
        Err(error) => {
            let _ = error.print();
            return u8::try_from(error.exit_code()).unwrap_or(2);
        }
    };
    match cli.command.input_limit().max_input {
        Some(bytes) => import::set_default_max_input(bytes),
        None => import::clear_default_max_input(),
    }
    match run(cli) {
        Ok(status) => status,
        Err(failure) => {
            // One line, whatever a path or a file's text in it holds.
            say(format_args!(
                "vramscope: {}",
                terminal::sanitize(&failure.message)
            ));
            failure.status
        }
    }
}
