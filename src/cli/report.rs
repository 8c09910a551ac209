//! `vramscope report FILE`: the diagnosis of a snapshot, ours, a PyTorch pickle or a
//! torch.profiler Chrome trace. The analysis crate builds one report per device
//! (`analysis::report`), the render crate prints them in the format asked for, and the exit
//! status counts every device's findings against `--fail-on`.

use std::path::PathBuf;

use clap::Args;

use super::common::{device_parts, emit, is_stdout, require_data, use_color, Failure, Output};
use super::{loading, InputLimit};
use crate::analysis::detect::Severity;
use crate::analysis::report::{self, ReportOptions};
use crate::render::{self, Format};

/// The arguments of `vramscope report`.
#[derive(Args)]
pub(super) struct ReportArgs {
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
    pub(super) limit: InputLimit,
}

/// `vramscope report`.
pub(super) fn run(args: ReportArgs) -> Result<u8, Failure> {
    let ReportArgs {
        file,
        format,
        output,
        step_marker,
        fail_on,
        device,
        ..
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

/// The wall time of each phase of `report`, with the process's memory at its end and its peak
/// in it (`import::pytorch::phase_memory`), printed on standard error when
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
            eprintln!(
                "{what}: {:.3} s{}",
                last.elapsed().as_secs_f64(),
                crate::import::pytorch::phase_memory()
            );
            *last = std::time::Instant::now();
        }
    }
}
