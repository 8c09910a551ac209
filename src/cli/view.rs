//! `vramscope view FILE`: a snapshot, PyTorch pickle or Chrome trace in the dashboard
//! (`vramscope-tui`), with a time cursor.

use std::path::PathBuf;

use clap::Args;

use super::common::{dashboard_status, tui_failure, Failure};
use super::InputLimit;
use crate::import::ImportOptions;

/// The arguments of `vramscope view`.
#[derive(Args)]
pub(super) struct ViewArgs {
    /// The file to read.
    file: PathBuf,
    /// A function name whose allocations start a new training step.
    #[arg(long)]
    step_marker: Option<String>,
    #[command(flatten)]
    pub(super) limit: InputLimit,
}

/// `vramscope view`.
pub(super) fn run(args: ViewArgs) -> Result<u8, Failure> {
    let mut options = ImportOptions::default();
    options.step_marker = args.step_marker;
    vramscope_tui::run_view(&args.file, &options).map_err(tui_failure)?;
    Ok(dashboard_status())
}
