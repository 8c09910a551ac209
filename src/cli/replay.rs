//! `vramscope replay FILE`: a trace's allocations replayed through the caching allocator, or
//! swept over a set of settings, beside what the trace shows PyTorch did.
//!
//! The replay crate settles the flags into a plan (`replay::ReplayPlan`: the settings, the
//! capacity inferred where none is given, what fails the command) and returns one outcome per
//! device; this module prints them, as text or as JSON (a list of documents for several
//! devices), and exits with 1 when an outcome fails.

use std::path::PathBuf;

use clap::Args;

use super::common::{device_parts, emit, parse_size, progress_line, require_data, Failure, Output};
use super::{loading, InputLimit};
use crate::render::Format;
use crate::replay::{ReplayPlan, ReplayRequest};

/// The arguments of `vramscope replay`.
#[derive(Args)]
pub(super) struct ReplayArgs {
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
    pub(super) limit: InputLimit,
}

/// `vramscope replay`.
pub(super) fn run(args: ReplayArgs) -> Result<u8, Failure> {
    if !matches!(args.format, Format::Text | Format::Json) {
        return Err(Failure::input(
            "replay prints text or json (sarif and github are report's)",
        ));
    }
    let mut request = ReplayRequest::default();
    request.capacity = args.capacity;
    request.conf = args.conf;
    request.policy = args.policy;
    request.sweep = args.sweep;
    request.verify = args.verify;
    request.fail_on_oom = args.fail_on_oom;
    let plan = ReplayPlan::new(request).map_err(Failure::input)?;
    let file = args.file;
    let snapshot = loading::load(&file).map_err(Failure::input)?;
    // An empty dump is said as every face says it, not replayed into a match of nothing.
    require_data(&snapshot, &file)?;
    let parts = device_parts(snapshot, args.device)?;
    let mut fails = false;
    let mut texts = Vec::with_capacity(parts.len());
    for snapshot in &parts {
        let source = if parts.len() > 1 {
            format!("{} (cuda:{})", file.display(), snapshot.device.index)
        } else {
            file.display().to_string()
        };
        let label = if plan.sweeps() {
            "sweeping"
        } else {
            "replaying"
        };
        let outcome = plan.run(snapshot, &mut progress_line(label));
        fails |= outcome.fails();
        texts.push(match args.format {
            Format::Json => serde_json::to_string_pretty(&outcome).unwrap_or_default(),
            _ => outcome.render_text(&source),
        });
    }
    let text = match args.format {
        // One device: its document; several: a list of them, in device order.
        Format::Json if texts.len() > 1 => format!("[\n{}\n]\n", texts.join(",\n")),
        Format::Json => texts.join("") + "\n",
        _ => texts.join("\n"),
    };
    emit(&text, None, Output::for_format(args.format, false))?;
    // Like `diff`, a verification that found a difference exits with 1, and so does a
    // replay that ran out of memory under `--fail-on-oom`.
    Ok(u8::from(fails))
}
