//! `vramscope convert FILE --to FORMAT -o OUT`: a snapshot written as PyTorch's pickle
//! (memory_viz reads it), Perfetto's trace JSON, vramscope's JSON or event log, or the HTML
//! explorer, whole or for a range of steps.
//!
//! The export crate decides what is said before writing (what a pickle cannot carry,
//! `PytorchPlan::not_carried`; a Perfetto trace past what its UI opens,
//! `perfetto_size_warning`) and writes; this module reads the file (once: for a PyTorch pickle
//! the import keeps what the model does not, `import::pytorch::KeptSource`), prints those
//! warnings and picks where the bytes go (`super::sink`). A pickle is binary: like `gzip -c`, it is not
//! written to a terminal.

use std::io::{IsTerminal, Write};
use std::path::PathBuf;

use clap::Args;

use super::common::{is_stdout, output_name, say, Failure};
use super::sink::ConvertSink;
use super::{loading, InputLimit};
use crate::analysis::model_view;
use crate::analysis::report::{self, ReportOptions};
use crate::export;
use crate::import::{self, ImportOptions};
use crate::model::terminal;
use crate::render::{self, Format};

/// The arguments of `vramscope convert`.
#[derive(Args)]
pub(super) struct ConvertArgs {
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
    pub(super) limit: InputLimit,
}

/// A format `vramscope convert` writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(super) enum ConvertTarget {
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

/// An export error as an I/O error: a failed write as the system's own (so that a closed pipe
/// is still one), anything else as its sentence.
fn export_io(e: export::ExportError) -> std::io::Error {
    match e {
        export::ExportError::Io(e) => e,
        other => std::io::Error::other(other),
    }
}

/// `vramscope convert`.
pub(super) fn run(args: ConvertArgs) -> Result<u8, Failure> {
    let ConvertArgs {
        file,
        to,
        output,
        steps,
        ..
    } = args;
    let to_stdout = is_stdout(&output);
    // A pickle is binary: like `gzip -c`, it is not written to a terminal.
    if to_stdout && to == ConvertTarget::Pytorch && std::io::stdout().is_terminal() {
        return Err(Failure::input(
            "a PyTorch pickle is binary and standard output is a terminal: redirect it \
             (`-o - > FILE`) or give -o FILE",
        ));
    }
    // What the model does not keep of a PyTorch pickle is kept while the file is imported
    // (`import::pytorch::KeptSource`), so that the file is parsed once; for the whole trace
    // only, which is all it matches.
    let keep =
        (to == ConvertTarget::Pytorch && steps.is_none()).then(import::pytorch::SourceSlot::new);
    let mut options = ImportOptions::default();
    options.keep_source = keep.clone();
    let mut snapshot = loading::load_with(&file, options).map_err(Failure::input)?;
    let kept = keep.and_then(|slot| slot.take());
    // The events of the steps asked for, numbered as `report` numbers them: a trace without
    // marks of its own takes the steps the report infers.
    let window = match steps {
        Some(range) => {
            model_view::record_inferred_steps(&mut snapshot);
            let window = range
                .window(&snapshot)
                .map_err(|e| Failure::input(format!("{}: {e}", file.display())))?;
            Some(window)
        }
        None => None,
    };
    if to == ConvertTarget::Perfetto {
        let warning = export::perfetto_size_warning(
            &mut snapshot,
            window.clone(),
            model_view::record_inferred_steps,
        );
        if let Some(warning) = warning {
            say(warning);
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
            // What the model does not keep, as the import kept it; else read again from the
            // source file (a pickle that was not streamed, or with entries of actions the
            // importer does not read), which matches only the whole trace.
            let doc = match (&sliced, &kept) {
                (Some(_), _) | (None, Some(_)) => Ok(None),
                (None, None) => export::read_source(&file, &ImportOptions::default())
                    .map_err(std::io::Error::other),
            };
            doc.and_then(|doc| {
                // A range of steps is written from the model alone.
                let plan = if sliced.is_some() {
                    export::PytorchPlan::for_range(part)
                } else {
                    export::PytorchPlan::new(part)
                }
                .map_err(export_io)?;
                // What the format cannot carry, said before the file is written.
                for line in plan.not_carried() {
                    say(format_args!(
                        "not carried into the PyTorch format: {}",
                        terminal::sanitize(&line.to_string())
                    ));
                }
                let extras = match &kept {
                    Some(kept) => export::PytorchExtras::from_kept(kept),
                    None => doc.as_ref().and_then(export::PytorchExtras::from_document),
                };
                plan.write(extras.as_ref(), &mut sink).map_err(export_io)?;
                Ok(())
            })
        }
        ConvertTarget::Perfetto => export::write_perfetto_window(
            &snapshot,
            window.unwrap_or(0..snapshot.events.len()),
            &mut sink,
        )
        .map_err(export_io),
        // Written here rather than by `Snapshot::save`, so that a failed write says
        // the system's words, not that the snapshot is not valid.
        ConvertTarget::Json => serde_json::to_writer(&mut sink, part).map_err(std::io::Error::from),
        ConvertTarget::Html => {
            let mut options = ReportOptions::default();
            options.input = Some(file.display().to_string());
            // The page `report --format html` writes: a device picker for several devices.
            let built = report::build_device_reports(part, &options);
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
