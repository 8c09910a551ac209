//! `vramscope diff BEFORE AFTER`: two snapshots compared by call site (the analysis crate's
//! `diff`), as text or JSON.

use std::path::PathBuf;

use clap::Args;

use super::common::{emit, Failure, Output};
use super::{loading, InputLimit};
use crate::analysis::diff;
use crate::render::Format;

/// The arguments of `vramscope diff`.
#[derive(Args)]
pub(super) struct DiffArgs {
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
    pub(super) limit: InputLimit,
}

/// `vramscope diff`.
pub(super) fn run(args: DiffArgs) -> Result<u8, Failure> {
    let DiffArgs {
        before,
        after,
        at,
        format,
        ..
    } = args;
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
