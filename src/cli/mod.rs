//! The `vramscope` command line: argument parsing, calls into the library crates, printing.
//!
//! It lives in the library so that one build serves both doors: the `vramscope` binary
//! (`src/main.rs`, which calls [`main_with_args`]) and the Python package's `vramscope`
//! command, which calls the same function from inside its native module, so the wheel carries
//! no second executable that could go stale.
//!
//! Every subcommand is glue: `report`, `summary` and `diff` load files with the inspector's
//! importers and render its reports; `demo` runs the built-in workload of `demo.rs` on the
//! simulated device in the terminal dashboard (`vramscope-tui`), or reports on it with
//! `--headless`; `view` and `top` open the dashboard on a file or a live program. Exit status: 0 on success, 1 when a finding reaches
//! `--fail-on`, 2 for unusable input.
//!
//! Everything printed passes one door, `emit` for the output and `say` for standard error:
//! text and markdown through `vramscope_model::terminal::sanitize_output` (only a text report's own
//! colours pass as escape sequences), JSON and HTML through `sanitize_json`, so that no
//! string from a file acts on the terminal. A write that fails is exit 2 with the system's
//! words ("No space left on device"), except a closed pipe (`| head`), which ends quietly.
//! An output path of `-` is standard output: `convert -o -` streams to a pipe or a
//! redirection, its JSON escaped as `sanitize_json` escapes it (a CI log reads pipes), buffers
//! it on a terminal, and refuses to write the binary pickle to one. An output file is written
//! new and renamed onto its path (`model::files`), never through a link standing there.

mod demo;
mod loading;
mod run;

use std::io::{IsTerminal, Write};
use std::path::PathBuf;

use crate::analysis::detect::Severity;
use crate::analysis::diff;
use crate::analysis::ranks;
use crate::analysis::report::{self, ReportOptions};
use crate::engine::devices;
use crate::export;
use crate::import::{self, ImportOptions};
use crate::model::terminal;
use crate::render::{self, Format};
use crate::Snapshot;
use clap::{Args, Parser, Subcommand};

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
    Demo(DemoArgs),
    /// Open a snapshot, PyTorch pickle or Chrome trace in the dashboard, with a time cursor.
    View {
        /// The file to read.
        file: PathBuf,
        /// A function name whose allocations start a new training step.
        #[arg(long)]
        step_marker: Option<String>,
        #[command(flatten)]
        limit: InputLimit,
    },
    /// Attach the dashboard to a live program started with VRAMSCOPE_LISTEN, or to several
    /// (one address per rank or process: a row each, Enter opens one).
    Top {
        /// unix:PATH, tcp:HOST:PORT or a socket path, one per process (two or more: a table
        /// with a row each); the newest local socket when omitted.
        addrs: Vec<String>,
    },
    /// Diagnose a snapshot: ours, a PyTorch pickle, or a torch.profiler Chrome trace.
    Report(ReportArgs),
    /// Replay a trace's allocations through the caching allocator: peaks, segment calls, OOMs
    /// at a capacity, beside what the trace shows PyTorch did.
    Replay(ReplayArgs),
    /// Convert a snapshot: to PyTorch's pickle (memory_viz reads it), Perfetto's trace JSON,
    /// or vramscope's JSON.
    Convert {
        /// The file to read.
        file: PathBuf,
        /// Target format: pytorch, perfetto, json, events or html.
        #[arg(long)]
        to: ConvertTarget,
        /// The file to write; `-` is standard output.
        #[arg(short, long)]
        output: PathBuf,
        /// Convert only these steps, numbered as `report` numbers them, both ends included:
        /// A..B, A.., ..B or N (a Perfetto trace past about 1 GB does not open in its UI).
        #[arg(long, value_name = "A..B")]
        steps: Option<export::StepRange>,
        #[command(flatten)]
        limit: InputLimit,
    },
    /// Say what this machine offers: CUDA driver, devices and memory, NVRTC, and which backend
    /// a program would get.
    Doctor,
    /// Run a training script watched, with no change to it (`vramscope run -- python
    /// train.py ARGS`): snapshot at exit and at OOM, the verdict, the script's exit status.
    Run(run::RunArgs),
    /// Print the memory summary table of any snapshot.
    Summary {
        /// The file to read.
        file: PathBuf,
        /// Summarize only this device (a multi-device snapshot gives one summary per device).
        #[arg(long)]
        device: Option<u32>,
        #[command(flatten)]
        limit: InputLimit,
    },
    /// Compare the snapshots of a job's ranks side by side and name the rank that stands out.
    Ranks {
        /// Snapshot files, or folders of them (one per rank; the rank is read from the name).
        #[arg(required = true)]
        inputs: Vec<PathBuf>,
        /// Output format: text, markdown, json or html.
        #[arg(long, default_value = "text")]
        format: Format,
        /// Write to this file instead of standard output (`-` is standard output).
        #[arg(short, long)]
        output: Option<PathBuf>,
        #[command(flatten)]
        limit: InputLimit,
    },
    /// Compare two snapshots by call site: what grew and what shrank, with both runs' peaks.
    Diff {
        /// The earlier snapshot.
        before: PathBuf,
        /// The later snapshot.
        after: PathBuf,
        /// Which moment of each run to compare: end (what is live at its end) or peak (what
        /// it held at its own peak of allocated bytes).
        #[arg(long, default_value = "end")]
        at: diff::At,
        /// Output format: text or json.
        #[arg(long, default_value = "text")]
        format: Format,
        #[command(flatten)]
        limit: InputLimit,
    },
}

impl Command {
    /// The input ceiling given to a command that reads files; none for the others.
    fn input_limit(&self) -> InputLimit {
        match self {
            Command::View { limit, .. }
            | Command::Convert { limit, .. }
            | Command::Summary { limit, .. }
            | Command::Ranks { limit, .. }
            | Command::Diff { limit, .. } => *limit,
            Command::Report(args) => args.limit,
            Command::Replay(args) => args.limit,
            Command::Demo(_) | Command::Top { .. } | Command::Doctor | Command::Run(_) => {
                InputLimit::default()
            }
        }
    }
}

/// The arguments of `vramscope demo`.
#[derive(Args)]
struct DemoArgs {
    /// Bugs to plant: retained-loss, item-in-loop, or none (comma-separated).
    #[arg(long, default_value = "retained-loss,item-in-loop")]
    bug: demo::Bugs,
    /// Training steps to run (20 headless, 300 in the dashboard).
    #[arg(long)]
    steps: Option<u64>,
    /// Run without the terminal dashboard and print the report (the default when standard
    /// output is not a terminal).
    #[arg(long)]
    headless: bool,
    /// Report format: text, markdown, json, html, sarif or github.
    #[arg(long, default_value = "text")]
    format: Format,
    /// Publish the demo's live telemetry on unix:PATH or tcp:127.0.0.1:PORT instead of
    /// opening the dashboard here: watch it with `vramscope top ADDR` in another terminal.
    #[arg(long)]
    listen: Option<String>,
}

/// The arguments of `vramscope report`.
#[derive(Args)]
struct ReportArgs {
    /// The file to read.
    file: PathBuf,
    /// Output format: text, markdown, json, html, sarif (a SARIF 2.1.0 log for code scanning)
    /// or github (GitHub Actions annotations, one per finding).
    #[arg(long, default_value = "text")]
    format: Format,
    /// Write the report to this file instead of standard output (`-` is standard output).
    #[arg(short, long)]
    output: Option<PathBuf>,
    /// A function name whose allocations start a new training step.
    #[arg(long)]
    step_marker: Option<String>,
    /// Exit with status 1 when a finding is at least this severe: info, warning or error.
    #[arg(long)]
    fail_on: Option<Severity>,
    /// Report only this device (a multi-device snapshot reports every device with data).
    #[arg(long)]
    device: Option<u32>,
    #[command(flatten)]
    limit: InputLimit,
}

/// The arguments of `vramscope replay`.
#[derive(Args)]
struct ReplayArgs {
    /// The trace to replay.
    file: PathBuf,
    /// Device capacity (24GiB, 80G, ...). When not given, the capacity the trace implies
    /// (an OOM's free bytes, free-and-retry bursts), said in the output; unlimited where it
    /// implies none.
    #[arg(long, value_parser = parse_size)]
    capacity: Option<u64>,
    /// Allocator settings in PYTORCH_CUDA_ALLOC_CONF syntax; the settings the trace recorded
    /// when not given ("" for PyTorch's defaults).
    #[arg(long)]
    conf: Option<String>,
    /// Placement policy: pytorch or compact (vramscope's own, not a PyTorch setting).
    #[arg(long)]
    policy: Option<String>,
    /// Try a set of settings, the trace's own and those given among them, and say which fit
    /// the capacity.
    #[arg(long)]
    sweep: bool,
    /// Also compare the replay's device calls (segment allocations, frees, maps, unmaps)
    /// with the trace's, call by call, and name the first difference; exits with 1 when
    /// they differ (a trace that records none has nothing to differ from).
    #[arg(long, conflicts_with = "sweep")]
    verify: bool,
    /// Output format: text or json.
    #[arg(long, default_value = "text")]
    format: Format,
    /// Exit with status 1 when the replay runs out of memory (or its start state alone
    /// exceeds the capacity).
    #[arg(long, conflicts_with = "sweep")]
    fail_on_oom: bool,
    /// Report only this device (a multi-device snapshot reports every device with data).
    #[arg(long)]
    device: Option<u32>,
    #[command(flatten)]
    limit: InputLimit,
}

/// A format `vramscope convert` writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum ConvertTarget {
    /// A `torch.cuda.memory._dump_snapshot()` pickle.
    Pytorch,
    /// Chrome trace JSON for ui.perfetto.dev.
    Perfetto,
    /// vramscope's event log: JSON Lines, a header snapshot then one event per line.
    Events,
    /// vramscope's JSON snapshot.
    Json,
    /// The interactive HTML explorer (the page `report --format html` writes).
    Html,
}

/// An error that ends the command with a status code.
struct Failure {
    message: String,
    status: u8,
}

impl Failure {
    fn input(message: impl std::fmt::Display) -> Failure {
        Failure {
            message: message.to_string(),
            status: 2,
        }
    }
}

fn parse_size(text: &str) -> Result<u64, String> {
    crate::model::parse_bytes(text)
}

/// A progress line on standard error while long work runs, when standard error is a terminal.
fn progress_line(label: &'static str) -> impl FnMut(usize, usize) {
    let show = std::io::stderr().is_terminal();
    move |done, total| {
        if show && total > 0 {
            let percent = done * 100 / total;
            eprint!("\r{label} {percent:3}% ({done}/{total})");
            if done >= total {
                eprint!("\r{:60}\r", "");
            }
        }
    }
}

/// Refuses a snapshot with nothing to analyse (no events and no segments), in the words every
/// face says (`report::nothing_to_analyse`): a report on nothing would say "no problems
/// found" and be believed.
fn require_data(snapshot: &Snapshot, file: &std::path::Path) -> Result<(), Failure> {
    match report::nothing_to_analyse(snapshot, &file.display().to_string()) {
        Some(message) => Err(Failure::input(message)),
        None => Ok(()),
    }
}

/// The parts of `snapshot` to report on: the device asked for, else every device with data
/// (one part for a single-device snapshot).
fn device_parts(snapshot: Snapshot, device: Option<u32>) -> Result<Vec<Snapshot>, Failure> {
    devices::select(snapshot, device).map_err(Failure::input)
}

fn use_color() -> bool {
    std::io::stdout().is_terminal() && std::env::var_os("NO_COLOR").is_none()
}

/// The exit status after the dashboard closed: 0 when the user quit, `128 + signal` when a
/// signal (SIGTERM, SIGHUP, SIGINT, SIGQUIT) stopped it, as a shell expects.
fn dashboard_status() -> u8 {
    vramscope_tui::stop_signal()
        .map(|signal| 128u8.saturating_add(signal as u8))
        .unwrap_or(0)
}

/// Unusable input is status 2; a terminal or connection failure is status 1.
fn tui_failure(e: vramscope_tui::TuiError) -> Failure {
    let status = match e {
        vramscope_tui::TuiError::Import(_)
        | vramscope_tui::TuiError::NoPublisher(_)
        | vramscope_tui::TuiError::NoTerminal(_)
        | vramscope_tui::TuiError::Empty(_) => 2,
        vramscope_tui::TuiError::Io(_) => 1,
    };
    Failure {
        message: e.to_string(),
        status,
    }
}

/// What an output is, for the escaping it gets on its way out.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Output {
    /// Text or markdown; `color`: the text report's own colour sequences pass.
    Text { color: bool },
    /// JSON, or an HTML page (whose data is JSON): escaped as JSON escapes.
    Json,
    /// `--format github`: vramscope's own workflow commands, one a line, escaped for the
    /// runner by the renderer; checked as text on the way out, keeping their `::`.
    Annotations,
}

impl Output {
    /// The output of a report in `format`.
    fn for_format(format: Format, color: bool) -> Output {
        match format {
            Format::Text => Output::Text { color },
            Format::Markdown => Output::Text { color: false },
            Format::Json | Format::Html | Format::Sarif => Output::Json,
            Format::Github => Output::Annotations,
        }
    }
}

/// A line on standard error, escaped as text from a file is (`vramscope_model::terminal`); a
/// failure to write it has nowhere to be told.
fn say(line: impl std::fmt::Display) {
    let line = line.to_string();
    let mut stderr = std::io::stderr().lock();
    let _ = writeln!(stderr, "{}", terminal::sanitize_output(&line, false));
}

/// Writes `text` to `output` (a file) or to standard output, escaped as `kind` says. A failed
/// write is exit 2 with the system's words; a closed pipe on standard output (`| head`) is
/// not an error worth reporting.
fn emit(text: &str, output: Option<&PathBuf>, kind: Output) -> Result<(), Failure> {
    let text = match kind {
        Output::Text { color } => terminal::sanitize_output(text, color),
        Output::Json => terminal::sanitize_json(text),
        Output::Annotations => terminal::sanitize_annotations(text),
    };
    match output.filter(|path| !is_stdout(path)) {
        Some(path) => crate::model::files::write_new(path, text.as_bytes())
            .map_err(|e| Failure::input(format!("cannot write {}: {e}", path.display()))),
        None => {
            let mut stdout = std::io::stdout().lock();
            match stdout
                .write_all(text.as_bytes())
                .and_then(|()| stdout.flush())
            {
                Ok(()) => Ok(()),
                Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
                Err(e) => Err(Failure::input(format!(
                    "cannot write to standard output: {e}"
                ))),
            }
        }
    }
}

/// Whether an output path names standard output: `-`, as everywhere in Unix.
fn is_stdout(path: &std::path::Path) -> bool {
    path.as_os_str() == "-"
}

/// An output path as messages name it: `standard output` for `-`.
fn output_name(path: &std::path::Path) -> String {
    if is_stdout(path) {
        "standard output".to_string()
    } else {
        path.display().to_string()
    }
}

/// Where `convert` writes: a file, written new and renamed onto the path once whole (never
/// through a link standing there: `model::files`), standard output streamed as the file would
/// be (a pipe or a redirection), or, when standard output is a terminal, a buffer that
/// `finish` passes through `sanitize_json` (every text format convert writes is JSON or a page
/// whose data is JSON; the binary pickle is refused before). A text format streamed to a
/// pipe is escaped as it goes ([`JsonEscaping`]): a CI log reads pipes too.
enum ConvertSink {
    /// A file, until `finish` renames it into place.
    File(Option<crate::model::files::NewFile>),
    /// Standard output that is not a terminal, as the bytes are (the pickle).
    Stream(std::io::BufWriter<std::io::Stdout>),
    /// Standard output that is not a terminal, for a text format: escaped as it streams.
    Escaped(std::io::BufWriter<JsonEscaping<std::io::Stdout>>),
    /// Standard output that is a terminal: escaped once whole.
    Terminal(Vec<u8>),
}

impl ConvertSink {
    /// Opens `path` for writing, or standard output for `-`; `text` when what is written is
    /// text (JSON, or a page whose data is JSON).
    fn open(path: &std::path::Path, text: bool) -> std::io::Result<ConvertSink> {
        if !is_stdout(path) {
            return Ok(ConvertSink::File(Some(
                crate::model::files::NewFile::create(path)?,
            )));
        }
        if std::io::stdout().is_terminal() {
            return Ok(ConvertSink::Terminal(Vec::new()));
        }
        if text {
            let escaping = JsonEscaping::new(std::io::stdout());
            return Ok(ConvertSink::Escaped(std::io::BufWriter::new(escaping)));
        }
        Ok(ConvertSink::Stream(std::io::BufWriter::new(
            std::io::stdout(),
        )))
    }

    /// Writes what is buffered: renames the file into place, flushes the stream, or prints the
    /// escaped text.
    fn finish(&mut self) -> std::io::Result<()> {
        match self {
            ConvertSink::File(file) => file.take().map_or(Ok(()), |file| file.commit()),
            ConvertSink::Stream(writer) => writer.flush(),
            ConvertSink::Escaped(writer) => {
                writer.flush()?;
                writer.get_mut().finish()
            }
            ConvertSink::Terminal(buffer) => {
                let text = String::from_utf8_lossy(buffer);
                let mut stdout = std::io::stdout().lock();
                stdout.write_all(terminal::sanitize_json(&text).as_bytes())?;
                stdout.flush()
            }
        }
    }
}

impl Write for ConvertSink {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        match self {
            ConvertSink::File(Some(file)) => file.write(bytes),
            ConvertSink::File(None) => Err(std::io::Error::other("written after its end")),
            ConvertSink::Stream(writer) => writer.write(bytes),
            ConvertSink::Escaped(writer) => writer.write(bytes),
            ConvertSink::Terminal(buffer) => buffer.write(bytes),
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        match self {
            ConvertSink::File(Some(file)) => file.flush(),
            ConvertSink::Stream(writer) => writer.flush(),
            ConvertSink::Escaped(writer) => writer.flush(),
            ConvertSink::File(None) | ConvertSink::Terminal(_) => Ok(()),
        }
    }
}

/// A writer of JSON text (or a page whose data is JSON) that passes it through
/// `terminal::sanitize_json` as it streams: what it is handed is escaped up to the last
/// whole character that cannot begin a `##[` with what follows; the rest waits for the next
/// write, or `finish`.
struct JsonEscaping<W: Write> {
    inner: W,
    pending: Vec<u8>,
}

impl<W: Write> JsonEscaping<W> {
    fn new(inner: W) -> Self {
        JsonEscaping {
            inner,
            pending: Vec::new(),
        }
    }

    /// Escapes and writes `pending` up to `end`.
    fn pass(&mut self, end: usize) -> std::io::Result<()> {
        let text = String::from_utf8_lossy(&self.pending[..end]);
        self.inner
            .write_all(terminal::sanitize_json(&text).as_bytes())?;
        self.pending.drain(..end);
        Ok(())
    }

    /// Writes everything still pending.
    fn finish(&mut self) -> std::io::Result<()> {
        self.pass(self.pending.len())?;
        self.inner.flush()
    }
}

impl<W: Write> Write for JsonEscaping<W> {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.pending.extend_from_slice(bytes);
        // Whole characters only, and trailing `#`s wait: they may begin a `##[`.
        let whole = match std::str::from_utf8(&self.pending) {
            Ok(_) => self.pending.len(),
            Err(e) if e.error_len().is_none() => e.valid_up_to(),
            Err(_) => self.pending.len(),
        };
        let hashes = self.pending[..whole]
            .iter()
            .rev()
            .take_while(|&&b| b == b'#')
            .count();
        let end = whole - hashes.min(2);
        if end > 0 {
            self.pass(end)?;
        }
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

fn run(cli: Cli) -> Result<u8, Failure> {
    match cli.command {
        Command::Demo(args) => run_demo(args),
        Command::View {
            file, step_marker, ..
        } => run_view(file, step_marker),
        Command::Top { addrs } => run_top(addrs),
        Command::Report(args) => run_report(args),
        Command::Run(args) => run::run(args),
        Command::Replay(args) => run_replay(args),
        Command::Convert {
            file,
            to,
            output,
            steps,
            ..
        } => run_convert(file, to, output, steps),
        Command::Doctor => {
            emit(
                &format!("{}\n", crate::allocator::doctor()),
                None,
                Output::Text { color: false },
            )?;
            Ok(0)
        }
        Command::Summary { file, device, .. } => run_summary(file, device),
        Command::Ranks {
            inputs,
            format,
            output,
            ..
        } => run_ranks(inputs, format, output),
        Command::Diff {
            before,
            after,
            at,
            format,
            ..
        } => run_diff(before, after, at, format),
    }
}

/// `vramscope view`.
fn run_view(file: PathBuf, step_marker: Option<String>) -> Result<u8, Failure> {
    let mut options = ImportOptions::default();
    options.step_marker = step_marker;
    vramscope_tui::run_view(&file, &options).map_err(tui_failure)?;
    Ok(dashboard_status())
}

/// `vramscope top`.
fn run_top(addrs: Vec<String>) -> Result<u8, Failure> {
    let mut addrs = addrs
        .iter()
        .map(|a| a.parse::<vramscope_telemetry::TelemetryAddr>())
        .collect::<Result<Vec<_>, _>>()
        .map_err(Failure::input)?;
    if addrs.len() > 1 {
        vramscope_tui::run_top_many(addrs).map_err(tui_failure)?;
    } else {
        vramscope_tui::run_top(addrs.pop()).map_err(tui_failure)?;
    }
    Ok(dashboard_status())
}

/// The size past which ui.perfetto.dev does not open a JSON trace (about 1 GB).
const PERFETTO_UI_BYTES: u64 = 1_000_000_000;

/// An export error as an I/O error: a failed write as the system's own (so that a closed pipe
/// is still one), anything else as its sentence.
fn export_io(e: export::ExportError) -> std::io::Error {
    match e {
        export::ExportError::Io(e) => e,
        other => std::io::Error::other(other),
    }
}

/// Says, before a Perfetto trace of about `estimate` bytes is written, that it passes what
/// ui.perfetto.dev opens, with the range of steps from the loop's first (step 1, or the
/// trace's first) that stays within about 90% of it.
fn warn_perfetto_size(snapshot: &Snapshot, estimate: u64) {
    use crate::model::format_bytes;
    let first = snapshot.events.iter().map(|e| u64::from(e.step)).min();
    let first = match snapshot.events.iter().any(|e| e.step >= 1) {
        true => Some(first.unwrap_or(1).max(1)),
        false => first,
    };
    let fits = first.and_then(|first| {
        export::perfetto_steps_within(snapshot, first, PERFETTO_UI_BYTES / 10 * 9)
            .map(|(last, bytes)| (first, last, bytes))
    });
    let suggestion = match fits {
        Some((first, last, bytes)) => format!(
            "; convert a range of steps, such as `--steps {first}..{last}` (about {}; steps are numbered as `report` numbers them)",
            format_bytes(bytes)
        ),
        None => "; one step alone passes it, so no range of steps opens either".to_string(),
    };
    // What comes before the first step (step 0) may be most of the trace.
    let before = export::StepRange { first: 0, last: 0 }
        .window(snapshot)
        .ok()
        .map(|window| export::perfetto_size_estimate(snapshot, window))
        .filter(|&bytes| bytes > PERFETTO_UI_BYTES / 10 * 9 && fits.is_some_and(|f| f.0 > 0));
    let suggestion = match before {
        Some(bytes) => format!(
            "{suggestion}; step 0, before the first step, is about {} alone",
            format_bytes(bytes)
        ),
        None => suggestion,
    };
    say(format_args!(
        "the Perfetto trace will be about {}, past the {} that ui.perfetto.dev opens as JSON{suggestion}",
        format_bytes(estimate),
        format_bytes(PERFETTO_UI_BYTES),
    ));
}

/// `vramscope convert`.
fn run_convert(
    file: PathBuf,
    to: ConvertTarget,
    output: PathBuf,
    steps: Option<export::StepRange>,
) -> Result<u8, Failure> {
    let to_stdout = is_stdout(&output);
    // A pickle is binary: like `gzip -c`, it is not written to a terminal.
    if to_stdout && to == ConvertTarget::Pytorch && std::io::stdout().is_terminal() {
        return Err(Failure::input(
            "a PyTorch pickle is binary and standard output is a terminal: redirect it \
             (`-o - > FILE`) or give -o FILE",
        ));
    }
    // The source pickle read again for what the model does not keep, before the import, so
    // that the file's bytes, held while the document is parsed, are gone before the snapshot
    // is built (the two peaks do not add up). A file it cannot read is read again after the
    // import, which names what is wrong first.
    let early_source = match (to, steps) {
        (ConvertTarget::Pytorch, None) => {
            export::read_source(&file, &ImportOptions::default()).ok()
        }
        _ => None,
    };
    let mut snapshot = loading::load(&file).map_err(Failure::input)?;
    // The events of the steps asked for, numbered as `report` numbers them: a trace without
    // marks of its own takes the steps the report infers.
    let window = match steps {
        Some(range) => {
            crate::analysis::model_view::record_inferred_steps(&mut snapshot);
            let window = range
                .window(&snapshot)
                .map_err(|e| Failure::input(format!("{}: {e}", file.display())))?;
            Some(window)
        }
        None => None,
    };
    let all = 0..snapshot.events.len();
    if to == ConvertTarget::Perfetto {
        let estimate =
            export::perfetto_size_estimate(&snapshot, window.clone().unwrap_or(all.clone()));
        if estimate > PERFETTO_UI_BYTES {
            // The range suggested is numbered as `report` numbers steps: a trace without marks
            // takes the inferred ones for the suggestion, and has none again for the output.
            let inferred = window.is_none()
                && crate::analysis::model_view::record_inferred_steps(&mut snapshot) > 0;
            warn_perfetto_size(&snapshot, estimate);
            if inferred {
                snapshot.events.iter_mut().for_each(|e| e.step = 0);
                snapshot.steps.clear();
            }
        }
    }
    // Every format but Perfetto's (which draws a window of the whole trace) writes the part of
    // the snapshot at the steps asked for as a snapshot of its own.
    let sliced = match (&window, to) {
        (Some(window), to) if to != ConvertTarget::Perfetto => Some(
            export::slice(&snapshot, window.clone())
                .map_err(|e| Failure::input(format!("{}: {e}", file.display())))?,
        ),
        _ => None,
    };
    let part = sliced.as_ref().unwrap_or(&snapshot);
    let mut sink = ConvertSink::open(&output, to != ConvertTarget::Pytorch)
        .map_err(|e| Failure::input(format!("{}: {e}", output_name(&output))))?;
    let written = match to {
        ConvertTarget::Pytorch => {
            // What the model does not keep is read again from the source file, which matches
            // only the whole trace.
            let doc = match (&sliced, early_source) {
                (Some(_), _) => Ok(None),
                (None, Some(doc)) => Ok(doc),
                (None, None) => export::read_source(&file, &ImportOptions::default())
                    .map_err(std::io::Error::other),
            };
            doc.and_then(|doc| {
                let plan = export::PytorchPlan::new(part).map_err(export_io)?;
                // What the format cannot carry, said before the file is written.
                for line in plan.not_carried() {
                    say(format_args!(
                        "not carried into the PyTorch format: {}",
                        terminal::sanitize(&line.to_string())
                    ));
                }
                if sliced.is_some() && part.source == crate::model::SnapshotSource::Pytorch {
                    say(format_args!(
                        "not carried into the PyTorch format: what the model does not keep of the source pickle (segment frames, compile_context, user_metadata, entries of other kinds): a range of steps is written from the model alone"
                    ));
                }
                let extras = doc.as_ref().and_then(export::PytorchExtras::from_document);
                plan.write(extras.as_ref(), &mut sink).map_err(export_io)?;
                Ok(())
            })
        }
        ConvertTarget::Perfetto => {
            export::write_perfetto_window(&snapshot, window.unwrap_or(all), &mut sink)
                .map_err(export_io)
        }
        // Written here rather than by `Snapshot::save`, so that a failed write says
        // the system's words, not that the snapshot is not valid.
        ConvertTarget::Json => serde_json::to_writer(&mut sink, part).map_err(std::io::Error::from),
        ConvertTarget::Html => {
            let mut options = ReportOptions::default();
            options.input = Some(file.display().to_string());
            // The page `report --format html` writes: a device picker for several devices.
            let devices = devices::devices_with_data(part);
            let built: Vec<report::Report> = if devices.len() > 1 {
                devices
                    .iter()
                    .map(|&d| report::build_report(&devices::only_device(part, d), &options))
                    .collect()
            } else {
                vec![report::build_report(part, &options)]
            };
            sink.write_all(render::render_file(&built, Format::Html, false).as_bytes())
        }
        ConvertTarget::Events => part.write_event_log(&mut sink),
    }
    .and_then(|()| sink.finish());
    match written {
        Ok(()) => {}
        // A closed pipe (`| head`) ends quietly, as `emit` does.
        Err(e) if to_stdout && e.kind() == std::io::ErrorKind::BrokenPipe => {}
        // A file cut short by the error is never renamed into place: the path keeps what it
        // held (`model::files`).
        Err(e) => return Err(Failure::input(format!("{}: {e}", output_name(&output)))),
    }
    if !to_stdout {
        say(format_args!("wrote {}", output.display()));
    }
    Ok(0)
}

/// `vramscope summary`.
fn run_summary(file: PathBuf, device: Option<u32>) -> Result<u8, Failure> {
    let snapshot = loading::load(&file).map_err(Failure::input)?;
    require_data(&snapshot, &file)?;
    let text = device_parts(snapshot, device)?
        .iter()
        .map(|part| {
            let mut options = ReportOptions::default();
            options.explorer = false;
            render::render_summary(&report::build_report(part, &options))
        })
        .collect::<Vec<_>>()
        .join("\n");
    emit(&text, None, Output::Text { color: false })?;
    Ok(0)
}

/// `vramscope ranks`.
fn run_ranks(inputs: Vec<PathBuf>, format: Format, output: Option<PathBuf>) -> Result<u8, Failure> {
    if matches!(format, Format::Sarif | Format::Github) {
        return Err(Failure::input(
            "ranks writes text, markdown, json or html (sarif and github are report's)",
        ));
    }
    let (files, left_out) = ranks::expand_inputs(&inputs).map_err(Failure::input)?;
    for why in &left_out {
        say(format_args!("vramscope ranks: left out {why}"));
    }
    if files.is_empty() {
        return Err(Failure::input("no snapshot files in the inputs"));
    }
    let started = std::time::Instant::now();
    let show = std::io::stderr().is_terminal();
    let progress = |done: usize, total: usize| {
        if show && started.elapsed().as_secs_f64() > 1.0 {
            eprint!("\rloading {done}/{total} snapshots");
        }
    };
    let loaded = ranks::load_all(&files, &progress);
    if show && started.elapsed().as_secs_f64() > 1.0 {
        eprint!("\r{:40}\r", "");
    }
    let results: Vec<_> = files.into_iter().zip(loaded).collect();
    // A file that cannot be read is a row with its error; the others are compared.
    if results.iter().all(|(_, result)| result.is_err()) {
        for (_, result) in &results {
            if let Err(e) = result {
                say(format_args!("vramscope ranks: {e}"));
            }
        }
        return Err(Failure::input("none of the snapshot files could be read"));
    }
    let comparison = ranks::compare_results(&results);
    for failed in &comparison.failed {
        say(format_args!(
            "vramscope ranks: skipped rank {}: {}",
            failed.rank, failed.error
        ));
    }
    if comparison.ranks.is_empty() {
        return Err(Failure::input(
            "none of the snapshot files could be read with anything to analyse",
        ));
    }
    let text = match format {
        Format::Text => render::ranks::render_text(&comparison),
        Format::Markdown => render::ranks::render_markdown(&comparison),
        Format::Json => render::ranks::render_json(&comparison),
        Format::Html => render::ranks::render_html(&comparison),
        Format::Sarif | Format::Github => unreachable!("refused above"),
    };
    emit(&text, output.as_ref(), Output::for_format(format, false))?;
    Ok(u8::from(!comparison.failed.is_empty()))
}

/// `vramscope diff`.
fn run_diff(before: PathBuf, after: PathBuf, at: diff::At, format: Format) -> Result<u8, Failure> {
    let a = loading::load(&before).map_err(Failure::input)?;
    let b = loading::load(&after).map_err(Failure::input)?;
    let d = diff::diff_at(&a, &b, at);
    let text = match format {
        Format::Json => diff::render_json(&d),
        Format::Text => diff::render_text(&d),
        other => {
            return Err(Failure::input(format!(
                "diff prints text or json, not {other:?}"
            )))
        }
    };
    emit(&text, None, Output::for_format(format, false))?;
    Ok(0)
}

/// `vramscope demo`.
fn run_demo(args: DemoArgs) -> Result<u8, Failure> {
    let DemoArgs {
        bug,
        steps,
        headless,
        format,
        listen,
    } = args;
    if let Some(listen) = listen {
        let addr = listen
            .parse::<vramscope_telemetry::TelemetryAddr>()
            .map_err(Failure::input)?;
        demo::run_listening(&addr, steps.unwrap_or(300), bug)
            .map_err(|message| Failure { message, status: 1 })?;
        return Ok(0);
    }
    let terminal = std::io::stdout().is_terminal() && std::io::stdin().is_terminal();
    if !headless && terminal {
        let steps = steps.unwrap_or(300);
        let (device, why) = demo::device();
        say(format_args!("vramscope demo: {why}"));
        let _metrics = demo::serve_metrics(&device).map_err(Failure::input)?;
        let alloc = device.allocator().clone();
        let pace = std::time::Duration::from_millis(150);
        let intro = demo::intro(steps, bug);
        vramscope_tui::run_in_process_with_intro(alloc, "demo", Some(intro), move |control| {
            let mut before_step = |_| control.proceed() && control.pace(pace);
            // Until the user quits, the dashboard shows the end state with the kept
            // tensors alive.
            let mut at_end = || while control.proceed() && control.pace(pace) {};
            let _ = demo::run_paced(&device, steps, bug, &mut before_step, &mut at_end);
        })
        .map_err(|e| Failure {
            message: e.to_string(),
            status: 1,
        })?;
        return Ok(dashboard_status());
    }
    let steps = steps.unwrap_or(20);
    // The metrics server (with its linger, if asked) ends after the report is out.
    let (snapshot, _metrics) = demo::run(steps, bug).map_err(|e| Failure {
        message: format!("demo failed: {e}"),
        status: 1,
    })?;
    let mut options = ReportOptions::default();
    options.input = Some("vramscope demo".to_string());
    options.explorer = format == Format::Html;
    let built = report::build_report(&snapshot, &options);
    let color = use_color() && format == Format::Text;
    emit(
        &render::render(&built, format, color),
        None,
        Output::for_format(format, color),
    )?;
    Ok(0)
}

/// `vramscope report`.
fn run_report(args: ReportArgs) -> Result<u8, Failure> {
    let ReportArgs {
        file,
        format,
        output,
        step_marker,
        fail_on,
        device,
        limit: _,
    } = args;
    let mut phases = PhaseTimes::from_env();
    let mut snapshot = loading::load(&file).map_err(Failure::input)?;
    phases.done("load");
    if let Some(marker) = step_marker {
        // A marker may be a step-mark label, an annotation name
        // (`Optimizer.step#AdamW.step`) or a function of the stacks; one that matches
        // nothing is an error that lists what the trace offers.
        crate::analysis::model_view::restep(&mut snapshot, &marker).map_err(Failure::input)?;
    }
    require_data(&snapshot, &file)?;
    let parts = device_parts(snapshot, device)?;
    phases.done("devices");
    let mut options = ReportOptions::default();
    options.input = Some(file.display().to_string());
    options.explorer = format == Format::Html;
    let color = output.as_deref().is_none_or(is_stdout) && use_color() && format == Format::Text;
    let reports: Vec<report::Report> = parts
        .iter()
        .map(|part| report::build_report(part, &options))
        .collect();
    phases.done("analysis (model view, detectors)");
    let text = match (format, reports.as_slice()) {
        // SARIF and GitHub's commands: one log, or one list of commands, for every device.
        (Format::Sarif | Format::Github, all) => {
            let mut annotation = render::AnnotationOptions::default();
            annotation.source_root = std::env::current_dir()
                .ok()
                .and_then(|dir| dir.to_str().map(str::to_owned));
            annotation.trace_file = Some(file.display().to_string());
            annotation.device_indices = parts.iter().map(|p| p.device.index).collect();
            if format == Format::Sarif {
                render::render_sarif(all, &annotation)
            } else {
                render::render_github(all, &annotation)
            }
        }
        // Every other format: one document for the file, opening with its verdict.
        (_, all) => render::render_file(all, format, color),
    };
    emit(&text, output.as_ref(), Output::for_format(format, color))?;
    phases.done("output");
    // The exit status counts every device's findings.
    Ok(match fail_on {
        Some(level) if report::file_fails_on(&reports, level) => 1,
        _ => 0,
    })
}

/// The wall time of each phase of `report`, printed on standard error when
/// `VRAMSCOPE_IMPORT_TIMES` is set (for benchmarks: the import prints its own phases, the
/// parse and the assembly, under the same variable).
struct PhaseTimes {
    last: Option<std::time::Instant>,
}

impl PhaseTimes {
    fn from_env() -> PhaseTimes {
        let on = std::env::var_os(crate::import::pytorch::IMPORT_TIMES_ENV).is_some();
        PhaseTimes {
            last: on.then(std::time::Instant::now),
        }
    }

    /// Prints how long the phase `what`, which ends now, took.
    fn done(&mut self, what: &str) {
        if let Some(last) = &mut self.last {
            eprintln!("{what}: {:.3} s", last.elapsed().as_secs_f64());
            *last = std::time::Instant::now();
        }
    }
}

/// `vramscope replay`.
fn run_replay(args: ReplayArgs) -> Result<u8, Failure> {
    let ReplayArgs {
        file,
        capacity,
        conf,
        policy,
        sweep,
        verify,
        format,
        fail_on_oom,
        device,
        limit: _,
    } = args;
    use crate::replay;
    if !matches!(format, Format::Text | Format::Json) {
        return Err(Failure::input(
            "replay prints text or json (sarif and github are report's)",
        ));
    }
    // Without --conf the trace's own settings apply; --policy replaces either's policy.
    let mut config =
        crate::AllocatorConfig::parse(conf.as_deref().unwrap_or("")).map_err(Failure::input)?;
    if let Some(policy) = &policy {
        config.set("policy", policy).map_err(Failure::input)?;
    }
    let policy = policy.map(|_| config.policy);
    let snapshot = loading::load(&file).map_err(Failure::input)?;
    // An empty dump is said as every face says it, not replayed into a match of nothing.
    require_data(&snapshot, &file)?;
    let parts = device_parts(snapshot, device)?;
    let mut calls_differ = false;
    let mut texts = Vec::with_capacity(parts.len());
    for snapshot in &parts {
        let source = if parts.len() > 1 {
            format!("{} (cuda:{})", file.display(), snapshot.device.index)
        } else {
            file.display().to_string()
        };
        texts.push(if sweep {
            // The settings given are one more row: --conf's, or the trace's with --policy.
            let given = match (&conf, policy) {
                (Some(_), _) => Some(config.clone()),
                (None, Some(policy)) => {
                    let mut given = replay::trace_settings(snapshot);
                    given.policy = policy;
                    Some(given)
                }
                (None, None) => None,
            };
            let rows = replay::sweep_with(
                snapshot,
                capacity,
                given.as_ref(),
                &mut progress_line("sweeping"),
            );
            match format {
                Format::Json => serde_json::to_string_pretty(&rows).unwrap_or_default(),
                _ => replay::render_sweep_text(
                    &source,
                    capacity.unwrap_or(replay::UNLIMITED_CAPACITY),
                    &rows,
                ),
            }
        } else {
            let mut options = replay::ReplayOptions::default();
            options.capacity = capacity;
            options.config = config.clone();
            options.trace_settings = conf.is_none();
            options.policy = policy;
            options.reconstruct_start = true;
            options.verify = verify;
            // A trace that ran under pressure says what it had: replay on that, not on an
            // unlimited device.
            options.infer_capacity = true;
            let result = replay::replay(snapshot, &options, &mut progress_line("replaying"));
            calls_differ |= result
                .device_calls
                .as_ref()
                .is_some_and(replay::DeviceCallCheck::differs)
                || (fail_on_oom
                    && (result.first_oom.is_some() || result.start_over_capacity.is_some()));
            match format {
                Format::Json => serde_json::to_string_pretty(&result).unwrap_or_default(),
                _ => replay::render_text(&source, &result),
            }
        });
    }
    let text = match format {
        // One device: its document; several: a list of them, in device order.
        Format::Json if texts.len() > 1 => format!("[\n{}\n]\n", texts.join(",\n")),
        Format::Json => texts.join("") + "\n",
        _ => texts.join("\n"),
    };
    emit(&text, None, Output::for_format(format, false))?;
    // Like `diff`, a verification that found a difference exits with 1, and so does a
    // replay that ran out of memory under `--fail-on-oom`.
    Ok(u8::from(calls_differ))
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
