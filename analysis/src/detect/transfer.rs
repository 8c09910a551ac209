//! `transfer_heavy`: host/device copies that dominate the training loop.
//!
//! Two patterns are reported. A loop is *transfer-heavy* when its host-to-device plus
//! device-to-host bytes per step reach `transfer_min_bytes_per_step` and `transfer_ratio` of the
//! bytes it allocates per step; every call site carrying at least a fifth of those bytes gets a
//! warning. Separately, a call site that uploads a buffer of the same size (at least
//! `transfer_min_bytes_per_step`) in nearly every step gets an informational finding: if that
//! data does not change, it belongs on the device before the loop. The per-step tallies come
//! from `crate::model_view`.

use std::ops::Range;

use rustc_hash::FxHashMap;
use vramscope_model::{format_bytes, EventKind, TransferDirection};

use super::{sat_sum, DetectOptions, Finding, FindingKind, FindingSink, PerStep, Severity};
use crate::model_view::ModelView;

/// Reports transfer-heavy loops and same-size uploads repeated every step.
pub fn transfer_heavy(view: &ModelView<'_>, options: &DetectOptions, sink: &mut dyn FindingSink) {
    let Some(whole) = LoopTransfers::find(view, options) else {
        return;
    };
    let mut reported = vec![false; view.groups().len()];
    if whole.heavy {
        report_heavy_groups(view, options, &whole, &mut reported, sink);
    }
    report_repeated_uploads(view, options, &whole, &reported, sink);
}

/// The training loop's copies as a whole.
struct LoopTransfers {
    /// Step indices of the loop.
    loop_steps: Range<u32>,
    /// Steps in the loop.
    n_steps: u64,
    /// Bytes copied host to device and device to host in the loop.
    transfer_bytes: u64,
    /// Those bytes per step.
    transfer_per_step: f64,
    /// Bytes allocated per step of the loop.
    alloc_per_step: f64,
    /// Whether the loop is transfer-heavy (see the module documentation).
    heavy: bool,
}

impl LoopTransfers {
    /// The loop's copies, or `None` when the loop has fewer than `min_steps` steps.
    fn find(view: &ModelView<'_>, options: &DetectOptions) -> Option<LoopTransfers> {
        let loop_steps = view.loop_steps();
        let n_steps = loop_steps.len() as u64;
        if n_steps < options.min_steps.max(1) {
            return None;
        }
        let totals = &view.step_totals()[loop_steps.start as usize..loop_steps.end as usize];
        let transfer_bytes = sat_sum(
            totals
                .iter()
                .map(|t| t.h2d_bytes.saturating_add(t.d2h_bytes)),
        );
        let alloc_bytes = sat_sum(totals.iter().map(|t| t.alloc_bytes));
        let steps_with_transfers = totals.iter().filter(|t| t.h2d > 0 || t.d2h > 0).count() as u64;
        let transfer_per_step = transfer_bytes as f64 / n_steps as f64;
        let alloc_per_step = alloc_bytes as f64 / n_steps as f64;
        let heavy = steps_with_transfers >= options.min_steps.max(1)
            && transfer_per_step >= options.transfer_min_bytes_per_step as f64
            && transfer_per_step >= options.transfer_ratio * alloc_per_step;
        Some(LoopTransfers {
            loop_steps,
            n_steps,
            transfer_bytes,
            transfer_per_step,
            alloc_per_step,
            heavy,
        })
    }

    /// The loop's copied bytes per allocated byte (0 when it allocates nothing).
    fn transfer_to_alloc_ratio(&self) -> f64 {
        if self.alloc_per_step > 0.0 {
            self.transfer_per_step / self.alloc_per_step
        } else {
            0.0
        }
    }
}

/// One group's part of the loop's copies.
struct GroupShare {
    group: u32,
    /// Bytes copied host to device.
    h2d: u64,
    /// Bytes copied device to host.
    d2h: u64,
    /// Copies in either direction.
    copies: u64,
    /// Loop steps with at least one copy.
    steps: u64,
}

impl GroupShare {
    /// Bytes copied in either direction.
    fn moved(&self) -> u64 {
        self.h2d.saturating_add(self.d2h)
    }
}

/// Each group's share of the loop's host/device copies, largest first (groups that copied
/// nothing left out).
fn group_shares(view: &ModelView<'_>, loop_steps: &Range<u32>) -> Vec<GroupShare> {
    let mut shares: Vec<GroupShare> = Vec::new();
    for group in 0..view.groups().len() as u32 {
        let (mut h2d, mut d2h, mut copies, mut steps) = (0u64, 0u64, 0u64, 0u64);
        for (_, t) in view
            .group_steps(group)
            .iter()
            .filter(|(s, _)| loop_steps.contains(s))
        {
            h2d = h2d.saturating_add(t.h2d_bytes);
            d2h = d2h.saturating_add(t.d2h_bytes);
            copies = copies.saturating_add(t.h2d).saturating_add(t.d2h);
            if t.h2d > 0 || t.d2h > 0 {
                steps += 1;
            }
        }
        if h2d > 0 || d2h > 0 {
            shares.push(GroupShare {
                group,
                h2d,
                d2h,
                copies,
                steps,
            });
        }
    }
    shares.sort_by(|a, b| b.moved().cmp(&a.moved()).then(a.group.cmp(&b.group)));
    shares
}

/// Warns about every group carrying at least a fifth of a transfer-heavy loop's copies (and
/// always the largest), marking it in `reported`.
fn report_heavy_groups(
    view: &ModelView<'_>,
    options: &DetectOptions,
    whole: &LoopTransfers,
    reported: &mut [bool],
    sink: &mut dyn FindingSink,
) {
    for (rank, share) in group_shares(view, &whole.loop_steps).iter().enumerate() {
        let fraction = share.moved() as f64 / whole.transfer_bytes as f64;
        if rank > 0 && fraction < 0.2 {
            break;
        }
        reported[share.group as usize] = true;
        sink.report(heavy_finding(view, options, whole, share, fraction));
    }
}

/// The warning for one group that carries `fraction` of a transfer-heavy loop's copies.
fn heavy_finding(
    view: &ModelView<'_>,
    options: &DetectOptions,
    whole: &LoopTransfers,
    share: &GroupShare,
    fraction: f64,
) -> Finding {
    let n_steps = whole.n_steps;
    let moved = share.moved();
    let copies = share.copies;
    let site_per_step = moved as f64 / n_steps as f64;
    let seconds = site_per_step / options.assumed_transfer_bytes_per_s;
    let mut f = Finding::at_group(
        view,
        FindingKind::TransferHeavy,
        Severity::Warning,
        Some(share.group),
    );
    f.bytes = moved;
    f.count = copies;
    f.per_step = Some(PerStep::new(site_per_step, copies as f64 / n_steps as f64));
    f.first_step = Some(view.step_number(whole.loop_steps.start));
    f.last_step = Some(view.step_number(whole.loop_steps.end - 1));
    f.summary = format!(
        "copies {} per step between host and device ({:.0}% of the loop's copies); the loop copies {:.0}% as many bytes as it allocates",
        format_bytes(site_per_step.round() as u64),
        fraction * 100.0,
        if whole.alloc_per_step > 0.0 { whole.transfer_per_step / whole.alloc_per_step * 100.0 } else { 100.0 }
    );
    f.evidence = f
        .evidence
        .float("h2d_bytes_per_step", share.h2d as f64 / n_steps as f64)
        .float("d2h_bytes_per_step", share.d2h as f64 / n_steps as f64)
        .float("copies_per_step", copies as f64 / n_steps as f64)
        .float("share_of_loop_transfers", fraction)
        .float("loop_transfer_bytes_per_step", whole.transfer_per_step)
        .float("loop_allocated_bytes_per_step", whole.alloc_per_step)
        .float("transfer_to_alloc_ratio", whole.transfer_to_alloc_ratio())
        .int("steps", n_steps)
        .int("steps_with_copies", share.steps)
        .float(
            "assumed_transfer_gb_per_s",
            options.assumed_transfer_bytes_per_s / 1e9,
        )
        .float("est_ms_per_step", seconds * 1e3);
    f.fix = "keep the data resident on the device (move it once before the loop); use pinned memory and non_blocking copies for what must move".to_string();
    f
}

/// Uploads of one size that one group repeats across the loop.
struct RepeatedUpload {
    /// The size of each upload.
    size: u64,
    /// Loop steps with an upload of that size.
    steps: u64,
    /// Uploads of that size.
    uploads: u64,
}

/// Reports, for each group not already warned about, the same-size upload it makes in
/// (nearly) every step.
fn report_repeated_uploads(
    view: &ModelView<'_>,
    options: &DetectOptions,
    whole: &LoopTransfers,
    reported: &[bool],
    sink: &mut dyn FindingSink,
) {
    let n_steps = whole.n_steps;
    let needed = options
        .min_steps
        .max(((n_steps as f64) * 0.9).ceil() as u64)
        .max(1);
    for group in 0..view.groups().len() as u32 {
        if reported[group as usize] {
            continue;
        }
        let Some(upload) = repeated_upload(view, options, &whole.loop_steps, group, needed) else {
            continue;
        };
        let RepeatedUpload {
            size,
            steps,
            uploads,
        } = upload;
        let mut f = Finding::at_group(
            view,
            FindingKind::TransferHeavy,
            Severity::Info,
            Some(group),
        );
        f.bytes = size.saturating_mul(uploads);
        f.count = uploads;
        f.per_step = Some(PerStep::new(
            size.saturating_mul(uploads) as f64 / n_steps as f64,
            uploads as f64 / n_steps as f64,
        ));
        f.first_step = Some(view.step_number(whole.loop_steps.start));
        f.last_step = Some(view.step_number(whole.loop_steps.end - 1));
        f.summary = format!(
            "uploads {} of the same size in {} of {} steps; if the data does not change, it can stay on the device",
            format_bytes(size),
            steps,
            n_steps
        );
        f.evidence = f
            .evidence
            .int("upload_bytes", size)
            .int("steps_with_upload", steps)
            .int("steps", n_steps)
            .int("uploads", uploads);
        f.fix = "if this buffer is constant (weights, masks, lookup tables), upload it once before the loop and reuse it".to_string();
        sink.report(f);
    }
}

/// The upload size of `group` (at least `transfer_min_bytes_per_step`) seen in at least
/// `needed` loop steps that moved the most bytes over those steps, if any.
fn repeated_upload(
    view: &ModelView<'_>,
    options: &DetectOptions,
    loop_steps: &Range<u32>,
    group: u32,
    needed: u64,
) -> Option<RepeatedUpload> {
    let events = &view.snapshot().events;
    // size → (steps seen, last step index seen, uploads)
    let mut sizes: FxHashMap<u64, (u64, u32, u64)> = FxHashMap::default();
    for &i in view.group_events(group) {
        let e = &events[i as usize];
        let step = view.event_step(i);
        if e.kind != EventKind::Transfer(TransferDirection::HostToDevice)
            || e.size < options.transfer_min_bytes_per_step
            || !loop_steps.contains(&step)
        {
            continue;
        }
        let entry = sizes.entry(e.size).or_insert((0, u32::MAX, 0));
        if entry.1 != step {
            entry.0 += 1;
            entry.1 = step;
        }
        entry.2 += 1;
    }
    let best = sizes.iter().filter(|(_, v)| v.0 >= needed).max_by(|a, b| {
        a.1 .0
            .saturating_mul(*a.0)
            .cmp(&b.1 .0.saturating_mul(*b.0))
            .then(b.0.cmp(a.0))
    });
    best.map(|(&size, &(steps, _, uploads))| RepeatedUpload {
        size,
        steps,
        uploads,
    })
}
