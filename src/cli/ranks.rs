//! `vramscope ranks FILES...`: the snapshots of a job's ranks compared side by side (the
//! analysis crate's `ranks`), printed by the render crate's `ranks`; and `vramscope
//! summarize FILE`, one rank's summary, the map of a big job whose reduce is `ranks`.

use std::io::IsTerminal;
use std::path::PathBuf;

use clap::Args;

use super::common::{emit, say, Failure, Output};
use super::InputLimit;
use crate::analysis::ranks;
use crate::render::{self, Format};

/// The arguments of `vramscope ranks`.
#[derive(Args)]
pub(super) struct RanksArgs {
    /// Snapshot files, their summaries (`vramscope summarize`), or folders of them, mixed
    /// (one per rank; the rank is read from the name).
    #[arg(required = true)]
    inputs: Vec<PathBuf>,
    /// Output format: text, markdown, json or html.
    #[arg(long, default_value = "text")]
    format: Format,
    /// Print every rank's row however many ranks (past 8, the ranks alike and the
    /// distribution are printed instead; the JSON always holds every rank).
    #[arg(long)]
    all: bool,
    /// Write to this file instead of standard output (`-` is standard output).
    #[arg(short, long)]
    output: Option<PathBuf>,
    #[command(flatten)]
    pub(super) limit: InputLimit,
}

/// The arguments of `vramscope summarize`.
#[derive(Args)]
pub(super) struct SummarizeArgs {
    /// The rank's snapshot (the rank is read from its name).
    file: PathBuf,
    /// Write to this file instead of standard output (`-` is standard output).
    #[arg(short, long)]
    output: Option<PathBuf>,
    #[command(flatten)]
    pub(super) limit: InputLimit,
}

/// `vramscope ranks`: each file read on every core and reduced to its summary at once (or
/// read as a summary), so that memory holds the summaries and the few snapshots in flight.
pub(super) fn run(args: RanksArgs) -> Result<u8, Failure> {
    let RanksArgs {
        inputs,
        format,
        all,
        output,
        ..
    } = args;
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
            eprint!("\rreading {done}/{total} ranks");
        }
    };
    let summaries = ranks::summarize_all(&files, ranks::IN_FLIGHT_BYTES, &progress);
    if show && started.elapsed().as_secs_f64() > 1.0 {
        eprint!("\r{:40}\r", "");
    }
    // A file that cannot be read is a row with its error; the others are compared.
    let unreadable = |s: &ranks::RankSummary| {
        s.skipped
            .as_ref()
            .is_some_and(|k| k.skipped == ranks::SKIPPED_UNREADABLE)
    };
    if summaries.iter().all(unreadable) {
        for summary in &summaries {
            if let Some(skipped) = &summary.skipped {
                say(format_args!("vramscope ranks: {}", skipped.error));
            }
        }
        return Err(Failure::input("none of the snapshot files could be read"));
    }
    let comparison = ranks::compare_summaries(&summaries);
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
        Format::Text => render::ranks::render_text_rows(&comparison, all),
        Format::Markdown => render::ranks::render_markdown_rows(&comparison, all),
        Format::Json => render::ranks::render_json(&comparison),
        Format::Html => render::ranks::render_html_rows(&comparison, all),
        Format::Sarif | Format::Github => unreachable!("refused above"),
    };
    emit(&text, output.as_ref(), Output::for_format(format, false))?;
    Ok(u8::from(!comparison.failed.is_empty()))
}

/// `vramscope summarize`: the rank's summary, written even when the file was skipped (so that
/// `ranks` lists it with the reason), which exits with 1.
pub(super) fn run_summarize(args: SummarizeArgs) -> Result<u8, Failure> {
    let summary = ranks::read_rank(&args.file);
    emit(
        &ranks::summary_to_json(&summary),
        args.output.as_ref(),
        Output::Json,
    )?;
    match &summary.skipped {
        Some(skipped) => {
            say(format_args!(
                "vramscope summarize: skipped: {}",
                skipped.error
            ));
            Ok(1)
        }
        None => Ok(0),
    }
}
