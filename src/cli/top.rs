//! `vramscope top [ADDR...]`: the dashboard attached to a live program started with
//! `VRAMSCOPE_LISTEN`, or to several (a row each).

use clap::Args;

use super::common::{dashboard_status, tui_failure, Failure};

/// The arguments of `vramscope top`.
#[derive(Args)]
pub(super) struct TopArgs {
    /// unix:PATH, tcp:HOST:PORT or a socket path, one per process (two or more: a table
    /// with a row each); the newest local socket when omitted.
    addrs: Vec<String>,
}

/// `vramscope top`.
pub(super) fn run(args: TopArgs) -> Result<u8, Failure> {
    let mut addrs = args
        .addrs
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
