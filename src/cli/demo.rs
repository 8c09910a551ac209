//! The built-in demo workload: a small MLP trained on the tensor layer (`vramscope-kernels`)
//! with bugs planted on request.
//!
//! `vramscope demo` runs it with `--headless` (or without a terminal) on the simulated device
//! all at once, then hands the snapshot to the inspector's report; otherwise on the GPU when one
//! is usable (else the simulated device), step by step beside the dashboard of `vramscope-tui`,
//! which pulls the allocator's events in the same process and paces the loop. The planted bugs
//! are the trainer's own (`kernels/src/train.rs`), so the report and the dashboard point there.
//! The subcommand's arguments ([`DemoArgs`]) and glue ([`run_command`]) are here too.

use std::io::IsTerminal;
use std::str::FromStr;

use clap::Args;

use super::common::{dashboard_status, emit, say, use_color, Failure, Output};
use crate::analysis::report::{self, ReportOptions};
use crate::render::{self, Format};

use crate::allocator::metrics::MetricsServer;
use crate::allocator::Telemetry;
use crate::kernels::{train, train_with, Device, TensorError, TrainConfig, TrainHooks};
use crate::model::{AllocatorConfig, Snapshot};
use vramscope_telemetry::TelemetryAddr;

/// The bugs the demo can plant.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Bugs {
    /// Keep every step's loss buffer (`losses.append(loss)`).
    pub retained_loss: bool,
    /// Copy one element to the host per inner iteration (`.item()` in a hot loop).
    pub item_in_loop: bool,
}

impl FromStr for Bugs {
    type Err = String;

    fn from_str(text: &str) -> Result<Bugs, String> {
        let mut bugs = Bugs::default();
        for name in text.split(',').map(str::trim).filter(|n| !n.is_empty()) {
            match name {
                "none" => {}
                "retained-loss" => bugs.retained_loss = true,
                "item-in-loop" => bugs.item_in_loop = true,
                other => {
                    return Err(format!(
                        "unknown bug `{other}` (expected retained-loss, item-in-loop or none)"
                    ))
                }
            }
        }
        Ok(bugs)
    }
}

/// The one line the dashboard shows until the first key: what runs, which bugs are planted,
/// and what to look at.
pub fn intro(steps: u64, bugs: Bugs) -> String {
    let mut planted = Vec::new();
    if bugs.retained_loss {
        planted.push("the loss kept every step (memory climbs: see Findings and Sites)");
    }
    if bugs.item_in_loop {
        planted.push(".item() in the inner loop (host syncs: see Findings and Events)");
    }
    let planted = if planted.is_empty() {
        "no bugs planted: the findings should stay quiet".to_string()
    } else {
        format!("planted: {}", planted.join("; "))
    };
    format!("demo: an MLP trained for {steps} steps on vramscope's allocator; {planted}; ? for help, q to quit")
}

/// The training run for `steps` steps with `bugs` planted, at a size that trains in moments on
/// the CPU (`large` makes the leak grow by a megabyte of activations per step, for the
/// dashboard).
pub fn config(steps: u64, bugs: Bugs, large: bool) -> TrainConfig {
    let (batch, inputs, hidden) = if large {
        (128, 128, 2048)
    } else {
        (64, 64, 256)
    };
    TrainConfig {
        steps: steps as usize,
        batch,
        inputs,
        hidden,
        classes: 16,
        retain_loss: bugs.retained_loss,
        // Like `losses.append(loss)` in PyTorch, the kept loss keeps its graph alive.
        retain_graph: bugs.retained_loss,
        item_in_loop: bugs.item_in_loop,
        log_every: 10,
        ..TrainConfig::default()
    }
}

/// The capacity of the demo's simulated device, whichever way the demo runs (`--headless`,
/// `--listen`, the dashboard): one demo device, so that its report and its `/metrics`
/// (`vramscope_device_capacity_bytes`) say the same size.
pub const SIM_CAPACITY: u64 = 4 << 30;

/// The device the dashboard demo trains on: CUDA when usable, else the backed simulated
/// device of [`SIM_CAPACITY`]; the string says which and why.
pub fn device() -> (Device, String) {
    Device::detect(SIM_CAPACITY, AllocatorConfig::default())
}

/// Starts the Prometheus `/metrics` server for `device`'s allocator when `VRAMSCOPE_METRICS`
/// asks for one, and says where on standard error; the server stops when the value is
/// dropped. An address that cannot be served is an error naming it.
pub fn serve_metrics(device: &Device) -> Result<Option<MetricsServer>, String> {
    let server = MetricsServer::serve_from_env(std::slice::from_ref(device.allocator()))
        .map_err(|e| format!("VRAMSCOPE_METRICS: {e}"))?;
    if let Some(server) = &server {
        eprintln!(
            "vramscope demo: serving /metrics on http://{}/metrics",
            server.addr()
        );
    }
    Ok(server)
}

/// Runs `steps` training steps with `bugs` planted on the simulated device ([`SIM_CAPACITY`],
/// the `--listen` demo's size without a GPU) and returns the allocator's snapshot, taken
/// while the kept tensors are alive, with the `/metrics` server that served the run when
/// `VRAMSCOPE_METRICS` asked: the caller drops it once the report is out, so that a
/// `VRAMSCOPE_METRICS_LINGER` comes after the report rather than before it.
pub fn run(steps: u64, bugs: Bugs) -> Result<(Snapshot, Option<MetricsServer>), String> {
    let device = Device::sim(SIM_CAPACITY);
    let metrics = serve_metrics(&device)?;
    let snapshot = train(&device, &config(steps, bugs, false))
        .map(|run| run.snapshot)
        .map_err(|e| e.to_string())?;
    Ok((snapshot, metrics))
}

/// Runs the training loop beside the dashboard: `before_step` paces it (and stops it when the
/// user quits), `at_end` lingers while the kept tensors are still alive.
pub fn run_paced(
    device: &Device,
    steps: u64,
    bugs: Bugs,
    before_step: &mut dyn FnMut(usize) -> bool,
    at_end: &mut dyn FnMut(),
) -> Result<(), TensorError> {
    train_with(
        device,
        &config(steps, bugs, true),
        TrainHooks {
            before_step,
            at_end,
        },
    )
    .map(|_| ())
}

/// Runs the dashboard demo without a dashboard, publishing its live telemetry on `addr` for
/// `vramscope top` in another terminal: paced like the dashboard's run, then lingering a few
/// seconds with the kept tensors alive before the publisher stops.
pub fn run_listening(addr: &TelemetryAddr, steps: u64, bugs: Bugs) -> Result<(), String> {
    let (device, why) = device();
    eprintln!("vramscope demo: {why}");
    let _metrics = serve_metrics(&device)?;
    let telemetry = Telemetry::serve(device.allocator(), addr).map_err(|e| e.to_string())?;
    eprintln!(
        "vramscope demo: publishing on {0}; watch it with `vramscope top {0}`",
        telemetry.addr()
    );
    let pace = std::time::Duration::from_millis(150);
    let mut before_step = |_| {
        std::thread::sleep(pace);
        true
    };
    let mut at_end = || std::thread::sleep(std::time::Duration::from_secs(3));
    run_paced(&device, steps, bugs, &mut before_step, &mut at_end).map_err(|e| e.to_string())?;
    drop(telemetry);
    Ok(())
}

/// The arguments of `vramscope demo`.
#[derive(Args)]
pub(super) struct DemoArgs {
    /// Bugs to plant: retained-loss, item-in-loop, or none (comma-separated).
    #[arg(long, default_value = "retained-loss,item-in-loop")]
    bug: Bugs,
    /// Training steps to run (20 headless, 300 in the dashboard).
    #[arg(long)]
    steps: Option<u64>,
    /// Run without the terminal dashboard and print the report (the default when standard
    /// output is not a terminal).
    #[arg(long)]
    headless: bool,
    /// Report format: text, markdown, json, html, sarif or github.
    #[arg(long, default_value = "text")]
    format: Format,
    /// Publish the demo's live telemetry on unix:PATH or tcp:127.0.0.1:PORT instead of
    /// opening the dashboard here: watch it with `vramscope top ADDR` in another terminal.
    #[arg(long)]
    listen: Option<String>,
}

/// `vramscope demo`.
pub(super) fn run_command(args: DemoArgs) -> Result<u8, Failure> {
    let DemoArgs {
        bug,
        steps,
        headless,
        format,
        listen,
    } = args;
    if let Some(listen) = listen {
        let addr = listen
            .parse::<vramscope_telemetry::TelemetryAddr>()
            .map_err(Failure::input)?;
        run_listening(&addr, steps.unwrap_or(300), bug)
            .map_err(|message| Failure { message, status: 1 })?;
        return Ok(0);
    }
    let terminal = std::io::stdout().is_terminal() && std::io::stdin().is_terminal();
    if !headless && terminal {
        let steps = steps.unwrap_or(300);
        let (device, why) = device();
        say(format_args!("vramscope demo: {why}"));
        let _metrics = serve_metrics(&device).map_err(Failure::input)?;
        let alloc = device.allocator().clone();
        let pace = std::time::Duration::from_millis(150);
        let intro = intro(steps, bug);
        vramscope_tui::run_in_process_with_intro(alloc, "demo", Some(intro), move |control| {
            let mut before_step = |_| control.proceed() && control.pace(pace);
            // Until the user quits, the dashboard shows the end state with the kept
            // tensors alive.
            let mut at_end = || while control.proceed() && control.pace(pace) {};
            let _ = run_paced(&device, steps, bug, &mut before_step, &mut at_end);
        })
        .map_err(|e| Failure {
            message: e.to_string(),
            status: 1,
        })?;
        return Ok(dashboard_status());
    }
    let steps = steps.unwrap_or(20);
    // The metrics server (with its linger, if asked) ends after the report is out.
    let (snapshot, _metrics) = run(steps, bug).map_err(|e| Failure {
        message: format!("demo failed: {e}"),
        status: 1,
    })?;
    let mut options = ReportOptions::default();
    options.input = Some("vramscope demo".to_string());
    options.explorer = format == Format::Html;
    let built = report::build_report(&snapshot, &options);
    let color = use_color() && format == Format::Text;
    emit(
        &render::render(&built, format, color),
        None,
        Output::for_format(format, color),
    )?;
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_intro_names_the_planted_bugs() {
        let both: Bugs = "retained-loss,item-in-loop".parse().unwrap();
        let line = intro(300, both);
        assert!(
            line.contains("300 steps") && line.contains("loss kept") && line.contains(".item()")
        );
        let none: Bugs = "none".parse().unwrap();
        assert!(intro(10, none).contains("no bugs planted"));
    }
}
