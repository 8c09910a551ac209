//! What every subcommand shares: the [`Failure`] that ends a command with its status, the two
//! doors everything printed passes ([`emit`] for the output, [`say`] for standard error, each
//! escaping as [`Output`] says), output paths (`-` is standard output), progress lines, the
//! refusal of a snapshot with nothing to analyse, the parts of a snapshot per device, and the
//! exit status after the dashboard closes.

use std::io::{IsTerminal, Write};
use std::path::PathBuf;

use crate::analysis::report;
use crate::engine::devices;
use crate::model::terminal;
use crate::render::Format;
use crate::Snapshot;

/// An error that ends the command with a status code.
pub(super) struct Failure {
    /// What went wrong, as one line.
    pub(super) message: String,
    /// The exit status.
    pub(super) status: u8,
}

impl Failure {
    /// Unusable input: status 2.
    pub(super) fn input(message: impl std::fmt::Display) -> Failure {
        Failure {
            message: message.to_string(),
            status: 2,
        }
    }
}

/// A size as the flags take it (`8GiB`, `80G`, bytes).
pub(super) fn parse_size(text: &str) -> Result<u64, String> {
    crate::model::parse_bytes(text)
}

/// A progress line on standard error while long work runs, when standard error is a terminal.
pub(super) fn progress_line(label: &'static str) -> impl FnMut(usize, usize) {
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
pub(super) fn require_data(snapshot: &Snapshot, file: &std::path::Path) -> Result<(), Failure> {
    match report::nothing_to_analyse(snapshot, &file.display().to_string()) {
        Some(message) => Err(Failure::input(message)),
        None => Ok(()),
    }
}

/// The parts of `snapshot` to report on: the device asked for, else every device with data
/// (one part for a single-device snapshot).
pub(super) fn device_parts(
    snapshot: Snapshot,
    device: Option<u32>,
) -> Result<Vec<Snapshot>, Failure> {
    devices::select(snapshot, device).map_err(Failure::input)
}

pub(super) fn use_color() -> bool {
    std::io::stdout().is_terminal() && std::env::var_os("NO_COLOR").is_none()
}

/// The exit status after the dashboard closed: 0 when the user quit, `128 + signal` when a
/// signal (SIGTERM, SIGHUP, SIGINT, SIGQUIT) stopped it, as a shell expects.
pub(super) fn dashboard_status() -> u8 {
    vramscope_tui::stop_signal()
        .map(|signal| 128u8.saturating_add(signal as u8))
        .unwrap_or(0)
}

/// Unusable input is status 2; a terminal or connection failure is status 1.
pub(super) fn tui_failure(e: vramscope_tui::TuiError) -> Failure {
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
pub(super) enum Output {
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
    pub(super) fn for_format(format: Format, color: bool) -> Output {
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
pub(super) fn say(line: impl std::fmt::Display) {
    let line = line.to_string();
    let mut stderr = std::io::stderr().lock();
    let _ = writeln!(stderr, "{}", terminal::sanitize_output(&line, false));
}

/// Writes `text` to `output` (a file) or to standard output, escaped as `kind` says. A failed
/// write is exit 2 with the system's words; a closed pipe on standard output (`| head`) is
/// not an error worth reporting.
pub(super) fn emit(text: &str, output: Option<&PathBuf>, kind: Output) -> Result<(), Failure> {
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
pub(super) fn is_stdout(path: &std::path::Path) -> bool {
    path.as_os_str() == "-"
}

/// An output path as messages name it: `standard output` for `-`.
pub(super) fn output_name(path: &std::path::Path) -> String {
    if is_stdout(path) {
        "standard output".to_string()
    } else {
        path.display().to_string()
    }
}
