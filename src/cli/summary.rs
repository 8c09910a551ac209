//! `vramscope summary FILE`: the memory summary table of any snapshot, one per device.

use std::path::PathBuf;

use clap::Args;

use super::common::{device_parts, emit, require_data, Failure, Output};
use super::{loading, InputLimit};
use crate::analysis::report::{self, ReportOptions};
use crate::render;

/// The arguments of `vramscope summary`.
#[derive(Args)]
pub(super) struct SummaryArgs {
    /// The file to read.
    file: PathBuf,
    /// Summarize only this device (a multi-device snapshot gives one summary per device).
    #[arg(long)]
    device: Option<u32>,
    #[command(flatten)]
    pub(super) limit: InputLimit,
}

/// `vramscope summary`.
pub(super) fn run(args: SummaryArgs) -> Result<u8, Failure> {
    let SummaryArgs { file, device, .. } = args;
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
