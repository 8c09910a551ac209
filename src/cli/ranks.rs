//! `vramscope ranks FILES...`: the snapshots of a job's ranks compared side by side (the
//! analysis crate's `ranks`), printed by the render crate's `ranks`.

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
    pub(super) limit: InputLimit,
}

/// `vramscope ranks`.
pub(super) fn run(args: RanksArgs) -> Result<u8, Failure> {
    let RanksArgs {
        inputs,
        format,
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
