//! `sync_in_loop`: a call site that makes the host wait for the device many times per step.
//!
//! Every device-to-host copy waits for the stream, so `.item()` or `print(t[0, 0])` inside a
//! hot loop stalls the pipeline once per element. The detector counts, per call-site group and
//! loop step, the waits by [`wait_of`]: explicit `Sync` events (each one a wait that was
//! recorded as such: PyTorch's sync debug mode, `CachingAllocator::synchronize`, a profiler
//! trace's runtime sync calls) and, where a recording does not record its waits, the tiny
//! device-to-host copies (at most `sync_max_bytes`) that are a guess at one. It reports groups
//! over at least `min_steps` steps that wait more than once per step and average
//! `explicit_sync_per_step` explicit syncs or more, or `sync_per_step` waits of both kinds
//! together (a guess takes more of them). A trace that is one step (a profiler trace without
//! `ProfilerStep#` slices: one forward) is reported when one line waits `sync_per_step` times
//! or more in it. A single wait per step (reading the loss) is the advice itself and no
//! finding. Where a profiler trace says what caused the waits (the operator around them:
//! `aten::item`, `aten::is_nonzero`, `aten::nonzero`, a copy to the host) and how long the host
//! waited, the finding says so and gives the fix that fits the cause. The rule is the same
//! wherever the snapshot came from and whichever face reads it.

use rustc_hash::FxHashMap;
use vramscope_model::{CallSite, EventKind, SnapshotSource, TransferDirection};

use super::{sat_sum, DetectOptions, Finding, FindingKind, FindingSink, PerStep, Severity};
use crate::model_view::ModelView;

/// What kind of wait for the device an event is, by this detector's rule.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Wait {
    /// A device-to-host copy of at most `DetectOptions::sync_max_bytes`: a guess at a sync.
    TinyCopy,
    /// A sync reported as such (PyTorch's sync debug mode, `CachingAllocator::synchronize`).
    Explicit,
}

/// The wait `event` of a snapshot from `source` is, if any: the one rule the detector and the
/// test checks (`crate::checks::check_syncs_per_step`) share. A `Sync` event is a wait. A tiny
/// device-to-host copy is a guess at one, except in a profiler trace, which records every wait
/// it shows as a `Sync` event (the copy of an `.item()` and its stream sync are one wait).
pub fn wait_of(
    event: &vramscope_model::Event,
    source: SnapshotSource,
    options: &DetectOptions,
) -> Option<Wait> {
    match event.kind {
        EventKind::Transfer(TransferDirection::DeviceToHost)
            if event.size <= options.sync_max_bytes && source != SnapshotSource::ChromeTrace =>
        {
            Some(Wait::TinyCopy)
        }
        EventKind::Sync => Some(Wait::Explicit),
        _ => None,
    }
}

/// What made a line wait, from the operators a profiler trace records around the wait.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Cause {
    /// `.item()` (`aten::item`, `aten::_local_scalar_dense`) or `.tolist()`.
    Item,
    /// `if tensor:` (`aten::is_nonzero`).
    IfTensor,
    /// A result whose size the host must read: `nonzero`, boolean indexing, `unique`.
    DataDependent,
    /// A copy to the host (`.to("cpu")`, `.cpu()`).
    ToHost,
    /// A blocking copy from pageable host memory to the device.
    FromHost,
    /// A sync called as such (`torch.cuda.synchronize()`, a stream or event sync).
    Synchronize,
}

impl Cause {
    /// The operator's cause, if it is one.
    fn of_operator(name: &str) -> Option<Cause> {
        Some(match name {
            "aten::item" | "aten::_local_scalar_dense" | "aten::tolist" => Cause::Item,
            "aten::is_nonzero" => Cause::IfTensor,
            "aten::nonzero"
            | "aten::index"
            | "aten::masked_select"
            | "aten::argwhere"
            | "aten::unique"
            | "aten::_unique"
            | "aten::_unique2"
            | "aten::unique_dim"
            | "aten::unique_consecutive"
            | "aten::repeat_interleave" => Cause::DataDependent,
            "aten::to" | "aten::_to_copy" | "aten::copy_" | "aten::cpu" => Cause::ToHost,
            _ => return None,
        })
    }

    /// The cause of a wait at `site`: the outermost operator of its stack that is a cause
    /// (`if t:` runs `aten::item` inside `aten::is_nonzero`); `None` for a stack without
    /// operators (vramscope's own recordings).
    fn of_site(site: &CallSite, to_device: bool) -> Option<Cause> {
        let operators: Vec<&str> = site
            .frames
            .iter()
            .take_while(|f| f.file.is_empty())
            .map(|f| f.function.as_str())
            .collect();
        if operators.is_empty() {
            return None;
        }
        let cause = operators
            .iter()
            .rev()
            .find_map(|name| Cause::of_operator(name))
            .unwrap_or(Cause::Synchronize);
        Some(match cause {
            Cause::ToHost if to_device => Cause::FromHost,
            cause => cause,
        })
    }

    /// What a reader calls it.
    fn describe(self) -> &'static str {
        match self {
            Cause::Item => "`.item()`",
            Cause::IfTensor => "`if tensor:` (aten::is_nonzero)",
            Cause::DataDependent => "`nonzero`, boolean indexing or `unique`",
            Cause::ToHost => "`.to(\"cpu\")`",
            Cause::FromHost => "a blocking copy from pageable host memory",
            Cause::Synchronize => "an explicit synchronize",
        }
    }

    /// The fix that fits the cause.
    fn fix(self) -> &'static str {
        match self {
            Cause::Item => "collect the values on the device (torch.stack) and read them once after the loop with one .tolist() or .cpu(), not one .item() per element",
            Cause::IfTensor => "keep the check on the device: accumulate a flag (bad |= torch.isnan(t).any()) and read it once per step, or use torch._assert_async(...)",
            Cause::DataDependent => "keep shapes fixed on the device: torch.where(mask, x, 0) or masking instead of nonzero and boolean indexing",
            Cause::ToHost => "copy once: torch.cat/torch.stack the outputs on the device and call .cpu() after the loop (or copy with non_blocking=True into pinned memory and synchronize once)",
            Cause::FromHost => "pin the host memory (DataLoader(pin_memory=True)) and copy with .to(device, non_blocking=True)",
            Cause::Synchronize => "move torch.cuda.synchronize() out of the loop; time with CUDA events or the profiler instead",
        }
    }
}

/// The line of an installed library that a stack passes through on its way to the user's line:
/// the innermost frame with a Python source line outside PyTorch and the standard library,
/// when it is not the site's own line.
fn library_line(site: &CallSite) -> Option<String> {
    let frame = site.frames.iter().find(|f| {
        let path = f.file.replace('\\', "/");
        f.line > 0
            && path.ends_with(".py")
            && (path.contains("site-packages/") || path.contains("dist-packages/"))
            && !path.contains("packages/torch/")
    })?;
    (frame.file != site.file || frame.line != site.line)
        .then(|| vramscope_engine::frame_label(&frame.file, frame.line))
}

/// A duration for a reader: `1.25 s`, `12.3 ms` or `840 µs`.
pub fn duration_text(ns: u64) -> String {
    let ns = ns as f64;
    if ns >= 1e9 {
        format!("{:.2} s", ns / 1e9)
    } else if ns >= 1e6 {
        format!("{:.1} ms", ns / 1e6)
    } else {
        format!("{:.0} µs", ns / 1e3)
    }
}

/// Reports call sites that synchronize with the device many times per step.
pub fn sync_in_loop(view: &ModelView<'_>, options: &DetectOptions, sink: &mut dyn FindingSink) {
    let loop_steps = view.loop_steps();
    if loop_steps.is_empty() {
        return;
    }
    let snapshot = view.snapshot();
    let source = snapshot.source;
    let events = &snapshot.events;
    // The loop steps' time: from the first event in them to the last.
    let in_loop = |i: usize| loop_steps.contains(&view.event_step(i as u32));
    let first_time = (0..events.len())
        .find(|&i| in_loop(i))
        .map(|i| events[i].time_ns);
    let last_time = (0..events.len())
        .rev()
        .find(|&i| in_loop(i))
        .map(|i| events[i].time_ns);
    let span_ns = match (first_time, last_time) {
        (Some(a), Some(b)) => b.saturating_sub(a),
        _ => 0,
    };
    let one_step = loop_steps.len() == 1;
    for group in 0..view.groups().len() as u32 {
        // Per loop step: (tiny device-to-host copies, their bytes, explicit syncs).
        let mut per_step: FxHashMap<u32, (u64, u64, u64)> = FxHashMap::default();
        let mut waited_ns: u64 = 0;
        let mut measured = false;
        let mut causes: FxHashMap<Option<vramscope_model::SiteId>, u64> = FxHashMap::default();
        let mut to_device = 0u64;
        let mut to_host = 0u64;
        for &i in view.group_events(group) {
            let e = &events[i as usize];
            let step = view.event_step(i);
            if !loop_steps.contains(&step) {
                continue;
            }
            match e.kind {
                EventKind::Transfer(TransferDirection::HostToDevice) => to_device += 1,
                EventKind::Transfer(TransferDirection::DeviceToHost) => to_host += 1,
                _ => {}
            }
            match wait_of(e, source, options) {
                Some(Wait::TinyCopy) => {
                    let c = per_step.entry(step).or_default();
                    c.0 += 1;
                    c.1 += e.size;
                }
                Some(Wait::Explicit) => {
                    per_step.entry(step).or_default().2 += 1;
                    if let Some(ns) = e.waited_ns() {
                        waited_ns = waited_ns.saturating_add(ns);
                        measured = true;
                    }
                    *causes.entry(e.site()).or_default() += 1;
                }
                None => {}
            }
        }
        let active = per_step.len() as u64;
        let copies = sat_sum(per_step.values().map(|c| c.0));
        let bytes = sat_sum(per_step.values().map(|c| c.1));
        let syncs = sat_sum(per_step.values().map(|c| c.2));
        let total = copies + syncs;
        let average = total as f64 / active.max(1) as f64;
        let explicit_average = syncs as f64 / active.max(1) as f64;
        let enough_steps = active >= options.min_steps.max(1)
            || (one_step && active == 1 && syncs as f64 >= options.sync_per_step);
        if !enough_steps || average <= 1.0 {
            continue;
        }
        if average < options.sync_per_step && explicit_average < options.explicit_sync_per_step {
            continue;
        }
        let most = per_step.values().map(|c| c.0 + c.2).max().unwrap_or(0);
        let first = per_step.keys().copied().min().unwrap_or(0);
        let last = per_step.keys().copied().max().unwrap_or(0);
        // The site that waited most (the lowest id of equals) says the cause and the library.
        let top_site = causes
            .iter()
            .max_by_key(|(site, n)| (**n, std::cmp::Reverse(**site)))
            .and_then(|(site, _)| snapshot.site(*site));
        let cause = top_site.and_then(|s| Cause::of_site(s, to_device > to_host));
        let library = top_site.and_then(library_line);

        let mut f = Finding::at_group(
            view,
            FindingKind::SyncInLoop,
            Severity::Warning,
            Some(group),
        );
        f.bytes = bytes;
        f.count = total;
        f.per_step = Some(PerStep::new(bytes as f64 / active as f64, average));
        f.first_step = Some(view.step_number(first));
        f.last_step = Some(view.step_number(last));
        let steps_text = if one_step {
            "in the trace's one step".to_string()
        } else {
            format!("per step over {}", vramscope_model::plural(active, "step"))
        };
        let count_text = if one_step {
            total.to_string()
        } else {
            super::count_text(average)
        };
        let mut summary = match cause {
            Some(cause) => format!(
                "waits for the device {count_text} times {steps_text}, caused by {}",
                cause.describe()
            ),
            None => format!(
                "waits for the device {count_text} times {steps_text} ({copies} tiny device-to-host copies, {syncs} explicit syncs)"
            ),
        };
        if let Some(library) = &library {
            summary.push_str(&format!(", inside {library}, which this line calls"));
        }
        if measured {
            let share = if span_ns > 0 {
                format!(
                    ", {:.0}% of the steps' time",
                    waited_ns as f64 * 100.0 / span_ns as f64
                )
            } else {
                String::new()
            };
            summary.push_str(&format!(
                "; the host waited {} in all{share}",
                duration_text(waited_ns)
            ));
        }
        f.summary = summary;
        let mut evidence = f
            .evidence
            .float("syncs_per_step", average)
            .float("tiny_d2h_copies_per_step", copies as f64 / active as f64)
            .float("explicit_syncs_per_step", syncs as f64 / active as f64)
            .int("max_syncs_in_one_step", most)
            .int("steps", active)
            .int("tiny_d2h_copies", copies)
            .int("explicit_syncs", syncs)
            .int("tiny_copy_max_bytes", options.sync_max_bytes);
        if measured {
            evidence = evidence.int("host_wait_ns", waited_ns);
            if span_ns > 0 {
                evidence = evidence.float("host_wait_share", waited_ns as f64 / span_ns as f64);
            }
        }
        if let Some(cause) = cause {
            evidence = evidence.text("cause", cause.describe());
        }
        if let Some(library) = library {
            evidence = evidence.text("library_line", library);
        }
        f.evidence = evidence;
        f.fix = match cause {
            Some(cause) => cause.fix().to_string(),
            None => "accumulate on the device (total += loss.detach()) and copy to the host once per step, not per element".to_string(),
        };
        sink.report(f);
    }
}
