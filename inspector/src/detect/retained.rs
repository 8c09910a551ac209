//! `retained_per_step`: memory that grows with the step count, one finding per bug.
//!
//! This is the classic `losses.append(loss)` bug, and its relatives: `outputs.append(model(x))`
//! keeps each step's whole activation graph, a logging branch keeps a tensor every tenth step,
//! a backward hook keeps a gradient. The detector works on call sites as a reader names them
//! (`crate::model_view::ModelView::site_name`: a stack with C++ frames only is named by its
//! autograd node, never `??:0`). For each one it takes the blocks allocated in loop steps and
//! still live at the end (the steps that retained memory) and the site's live bytes at the end
//! of every step (the staircase). A site leaks when at least `min_steps` steps retained memory,
//! its live bytes grew by at least half of what it retained and never fell back below half of
//! their high mark (a KV cache freed per sequence does), the retaining steps reach into the
//! last third of the loop, and the steps since the last one are no more than twice the longest
//! gap between two of them, plus one (growth that stopped, such as a cache filled in its first
//! steps, is not a leak). So a site that keeps a block every step, or only every 3rd, 5th or
//! 10th step, is found; a sliding window, a holder allocated once, a buffer replaced every step
//! and bounded growth are left alone.
//!
//! Sites that retained memory in the same steps are one bug (one reference keeps a graph
//! alive): they are reported together, as one finding that lists each site with its bytes and
//! names the innermost frame of the user's code that every retained block's stack shares (the
//! line that calls the model and keeps its output). Without stacks, the finding names the site
//! that allocated last in a retaining step: the output of the graph, which keeps the rest.

use rustc_hash::FxHashMap;
use vramscope_model::{format_bytes, CallSite, EventKind, Frame, SiteId};

use vramscope_model::plural;

use super::{
    sat_sum, DetectOptions, Finding, FindingKind, FindingSink, FindingSite, PerStep, Severity,
};
use crate::model_view::ModelView;
use vramscope_engine::{is_native_frame, GroupKind};

/// One site as the detector sees it: every interval index it owns.
struct Unit {
    label: String,
    function: String,
    intervals: Vec<u32>,
}

/// What one leaking site retained.
struct Leak {
    unit: usize,
    /// Loop step indices (relative to the loop's first) that retained memory.
    steps: Vec<u32>,
    bytes: u64,
    blocks: u64,
}

/// Reports memory that grows with the step count, one finding per group of sites retained
/// together.
pub fn retained_per_step(
    view: &ModelView<'_>,
    options: &DetectOptions,
    sink: &mut dyn FindingSink,
) {
    let loop_steps = retaining_range(view);
    let n = loop_steps.len();
    let min_steps = options.min_steps.max(1);
    if (n as u64) < min_steps || view.loop_steps().is_empty() {
        return;
    }
    let units = units_of(view);
    let intervals = view.intervals();
    let mut leaks: Vec<Leak> = Vec::new();
    for (u, unit) in units.iter().enumerate() {
        // Retained blocks per loop step (relative index), and the live staircase.
        let mut retained: FxHashMap<u32, (u64, u64)> = FxHashMap::default();
        for &i in &unit.intervals {
            let iv = &intervals[i as usize];
            if iv.is_live_at_end() && loop_steps.contains(&iv.alloc_step) {
                let r = retained
                    .entry(iv.alloc_step - loop_steps.start)
                    .or_default();
                r.0 += 1;
                r.1 = r.1.saturating_add(view.interval_size(iv));
            }
        }
        if (retained.len() as u64) < min_steps {
            continue;
        }
        let mut steps: Vec<u32> = retained.keys().copied().collect();
        steps.sort_unstable();
        let bytes = sat_sum(retained.values().map(|r| r.1));
        let blocks = sat_sum(retained.values().map(|r| r.0));
        let live = staircase(view, &unit.intervals, loop_steps.clone());
        if !is_leak(&steps, &live, bytes, n as u32) {
            continue;
        }
        leaks.push(Leak {
            unit: u,
            steps,
            bytes,
            blocks,
        });
    }

    // Sites retained in the same steps are one bug. The last loop step may have been cut
    // short by the snapshot, so it takes no part in the comparison.
    let last = n as u32 - 1;
    let mut clusters: Vec<(Vec<u32>, Vec<usize>)> = Vec::new();
    for (k, leak) in leaks.iter().enumerate() {
        let key: Vec<u32> = leak.steps.iter().copied().filter(|&s| s != last).collect();
        match clusters.iter_mut().find(|(sig, _)| *sig == key) {
            Some((_, members)) => members.push(k),
            None => clusters.push((key, vec![k])),
        }
    }
    for (_, members) in clusters {
        report_cluster(view, options, &units, &leaks, &members, sink);
    }
}

/// The steps a leak may retain in: every step, the one before the first mark included (with
/// marks at the optimizer step, as PyTorch's annotations put them, it holds the first
/// iteration; setup allocations there retain in one step only, which is never a leak).
fn retaining_range(view: &ModelView<'_>) -> std::ops::Range<u32> {
    0..view.steps().len() as u32
}

/// The sites of the trace under the names a reader sees: a group per `file:line`, except that
/// the sites of a group without a source line (C++ frames only) are told apart by their
/// autograd node or C++ function.
fn units_of(view: &ModelView<'_>) -> Vec<Unit> {
    let mut units = Units::default();
    // A unit's name depends only on the group, or for a group without a source line on the
    // allocation's call site: each is named once, not once per allocation (millions in a big
    // trace, each a copy of its name).
    let mut by_group: Vec<Option<usize>> = vec![None; view.groups().len()];
    let mut by_site: FxHashMap<SiteId, usize> = FxHashMap::default();
    let events = &view.snapshot().events;
    for (i, iv) in view.intervals().iter().enumerate() {
        let group = view.group(iv.group);
        let cached_by_group = &mut by_group[iv.group as usize];
        let u = match (&group.file_line, group.kind) {
            (Some(file_line), GroupKind::Site) if !file_line.starts_with("??:") => *cached_by_group
                .get_or_insert_with(|| units.named(file_line.clone(), group.function.clone())),
            _ => match iv.alloc(events).site() {
                Some(site) => *by_site.entry(site).or_insert_with(|| {
                    let name = view.site_name(site);
                    units.named(name.label, name.function)
                }),
                None => *cached_by_group
                    .get_or_insert_with(|| units.named(group.label().to_string(), String::new())),
            },
        };
        units.list[u].intervals.push(i as u32);
    }
    units.list
}

/// The units found so far, and each one's place by its name.
#[derive(Default)]
struct Units {
    list: Vec<Unit>,
    by_label: FxHashMap<String, usize>,
}

impl Units {
    /// The place of the unit named `label`, made (with `function`) when it is new.
    fn named(&mut self, label: String, function: String) -> usize {
        if let Some(&u) = self.by_label.get(&label) {
            return u;
        }
        self.list.push(Unit {
            label: label.clone(),
            function,
            intervals: Vec::new(),
        });
        self.by_label.insert(label, self.list.len() - 1);
        self.list.len() - 1
    }
}

/// Live bytes of the intervals at the end of each loop step, and (first) just before the loop.
fn staircase(
    view: &ModelView<'_>,
    intervals: &[u32],
    loop_steps: std::ops::Range<u32>,
) -> Vec<u64> {
    let n = loop_steps.len();
    // delta[k] applies at the end of loop step k - 1 (k = 0 is before the loop).
    let mut delta = vec![0i128; n + 2];
    let slot = |step: u32| -> usize {
        if step < loop_steps.start {
            0
        } else {
            (step - loop_steps.start) as usize + 1
        }
    };
    for &i in intervals {
        let iv = &view.intervals()[i as usize];
        let size = i128::from(view.interval_size(iv));
        delta[slot(iv.alloc_step)] += size;
        if let Some(f) = iv.free_step() {
            delta[slot(f)] -= size;
        }
    }
    let mut live = Vec::with_capacity(n + 1);
    let mut acc = 0i128;
    for d in delta.iter().take(n + 1) {
        acc += d;
        live.push(acc.max(0) as u64);
    }
    live
}

/// The leak rule of the module documentation. `steps` are the retaining loop steps (relative,
/// sorted), `live` the staircase (before the loop, then after each loop step), `retained` the
/// bytes those steps retained, `n` the number of loop steps.
fn is_leak(steps: &[u32], live: &[u64], retained: u64, n: u32) -> bool {
    let first = steps[0];
    let last_retaining = steps[steps.len() - 1];
    // The growth is real: live bytes rose by at least half of what the steps retained.
    let before = live[first as usize];
    let end = live[live.len() - 1];
    if end.saturating_sub(before).saturating_mul(2) < retained {
        return false;
    }
    // It never fell back: no drop below half of the high mark once the retaining began.
    let mut high = 0u64;
    for &bytes in &live[first as usize + 1..] {
        high = high.max(bytes);
        if bytes.saturating_mul(2) < high {
            return false;
        }
    }
    // It reaches the last third of the loop and did not stop growing.
    if u64::from(last_retaining + 1) * 3 < u64::from(n) * 2 {
        return false;
    }
    let max_gap = steps.windows(2).map(|w| w[1] - w[0]).max().unwrap_or(1);
    let tail = (n - 1) - last_retaining;
    tail <= 2 * max_gap + 1
}

/// Reports one group of sites retained together.
fn report_cluster(
    view: &ModelView<'_>,
    options: &DetectOptions,
    units: &[Unit],
    leaks: &[Leak],
    members: &[usize],
    sink: &mut dyn FindingSink,
) {
    let loop_steps = retaining_range(view);
    // The steps of the cluster: those of its largest member.
    let lead = cluster_lead(leaks, members);
    let steps = &lead.steps;
    let first = steps[0];
    let last_retaining = steps[steps.len() - 1];
    let total_bytes = sat_sum(members.iter().map(|&k| leaks[k].bytes));
    let total_blocks = sat_sum(members.iter().map(|&k| leaks[k].blocks));
    let sites = cluster_sites(units, leaks, members);
    let (site, function, why, caller) = name_cluster(view, units, leaks, members, lead);
    let rate = RetentionRate::of(view, options, total_bytes, total_blocks, first);
    let period = period_of(steps);
    let first_step = view.step_number(loop_steps.start + first);
    let last_step = view.step_number(loop_steps.start + last_retaining);
    let every = match period {
        1 => "every step".to_string(),
        p => format!("every {p} steps"),
    };
    let mut f = Finding::at_group(view, FindingKind::RetainedPerStep, rate.severity, None);
    f.site = Some(site.clone());
    f.function = function;
    f.bytes = total_bytes;
    f.count = total_blocks;
    f.per_step = Some(PerStep::new(rate.bytes_per_step, rate.blocks_per_step));
    f.first_step = Some(first_step);
    f.last_step = Some(last_step);
    let from_sites = if sites.len() == 1 {
        String::new()
    } else {
        format!(" from {} sites", sites.len())
    };
    f.summary = format!(
        "keeps memory alive {every}: {} in {}{from_sites} allocated in {} between steps {first_step} and {last_step} are still live at the end ({} per step)",
        format_bytes(total_bytes),
        plural(total_blocks, "block"),
        plural(steps.len() as u64, "step"),
        format_bytes(rate.bytes_per_step.round() as u64),
    );
    let site_list = sites
        .iter()
        .map(|s| format!("{} {}", s.site, format_bytes(s.bytes)))
        .collect::<Vec<_>>()
        .join("; ");
    let mut evidence = f
        .evidence
        .float("retained_bytes_per_step", rate.bytes_per_step)
        .float("retained_blocks_per_step", rate.blocks_per_step)
        .int("steps_with_retention", steps.len() as u64)
        .int("retention_period_steps", u64::from(period))
        .int("first_step", first_step)
        .int("last_step", last_step)
        .int("retained_blocks", total_blocks)
        .int("retained_bytes", total_bytes)
        .int("sites", sites.len() as u64)
        .text("site_bytes", site_list)
        .text("named_because", why);
    if let Some(caller) = caller {
        evidence = evidence.text("caller_line", caller);
    }
    if let (Some(c), Some(s)) = (rate.capacity, rate.steps_until_oom) {
        evidence = evidence
            .int("device_capacity_bytes", c)
            .int("peak_allocated_bytes", view.peak_allocated())
            .int("steps_until_oom", s);
    }
    f.evidence = evidence;
    f.sites = sites;
    f.fix = format!(
        "at {site}, do not keep the step's device tensors: store loss.item() or t.detach().cpu() instead of the tensor (a kept tensor keeps its whole autograd graph), or drop the reference each step"
    );
    sink.report(f);
}

/// The largest leak of a cluster (the first site on ties), whose steps stand for the cluster's.
fn cluster_lead<'l>(leaks: &'l [Leak], members: &[usize]) -> &'l Leak {
    members
        .iter()
        .max_by(|&&a, &&b| {
            leaks[a]
                .bytes
                .cmp(&leaks[b].bytes)
                .then(leaks[b].unit.cmp(&leaks[a].unit))
        })
        .map(|&k| &leaks[k])
        .expect("a cluster has members")
}

/// The sites of a cluster with what each retained, largest first.
fn cluster_sites(units: &[Unit], leaks: &[Leak], members: &[usize]) -> Vec<FindingSite> {
    let mut sites: Vec<FindingSite> = members
        .iter()
        .map(|&k| FindingSite {
            site: units[leaks[k].unit].label.clone(),
            function: units[leaks[k].unit].function.clone(),
            bytes: leaks[k].bytes,
            blocks: leaks[k].blocks,
        })
        .collect();
    sites.sort_by(|a, b| b.bytes.cmp(&a.bytes).then(a.site.cmp(&b.site)));
    sites
}

/// The name of a cluster's finding: `(site, function, why it is named so, the caller line
/// when the stacks gave it)`. The line the retained blocks' stacks share comes first (see
/// [`name_by_stacks`]); without one, the site of the last block allocated in a retaining step.
fn name_cluster(
    view: &ModelView<'_>,
    units: &[Unit],
    leaks: &[Leak],
    members: &[usize],
    lead: &Leak,
) -> (String, String, &'static str, Option<String>) {
    let retained = RetainedStacks::of(view, units, leaks, members, &lead.steps);
    let events = &view.snapshot().events;
    let latest_site = retained.latest.and_then(|(e, _)| events[e as usize].site());
    let named = name_by_stacks(view, &retained.site_ids, latest_site, lead.steps.len());
    match named {
        Some((frame, why)) => {
            let line = format!("{}:{}", frame.file, frame.line);
            (line.clone(), frame.function, why, Some(line))
        }
        None => {
            let unit = retained.latest.map(|(_, u)| u).unwrap_or(lead.unit);
            (
                units[unit].label.clone(),
                units[unit].function.clone(),
                "the site of the last block allocated in a retaining step, which keeps the others",
                None,
            )
        }
    }
}

/// Where a cluster's retained blocks were allocated.
struct RetainedStacks {
    /// The distinct call sites of the retained blocks (at most 512), in allocation order.
    site_ids: Vec<SiteId>,
    /// `(alloc event, unit)` of the last block allocated in the last retaining step (the one
    /// before it when the last is the loop's last step, which the snapshot may have cut short).
    latest: Option<(u32, usize)>,
}

impl RetainedStacks {
    /// The stacks of the blocks the `members` of a cluster retained in `steps` (relative loop
    /// step indices, sorted).
    fn of(
        view: &ModelView<'_>,
        units: &[Unit],
        leaks: &[Leak],
        members: &[usize],
        steps: &[u32],
    ) -> RetainedStacks {
        let loop_steps = retaining_range(view);
        let n = loop_steps.len() as u32;
        let intervals = view.intervals();
        let events = &view.snapshot().events;
        let last_retaining = steps[steps.len() - 1];
        let retaining_end = if last_retaining == n - 1 && steps.len() > 1 {
            steps[steps.len() - 2]
        } else {
            last_retaining
        };
        let mut site_ids: Vec<SiteId> = Vec::new();
        let mut latest: Option<(u32, usize)> = None;
        for &k in members {
            for &i in &units[leaks[k].unit].intervals {
                let iv = &intervals[i as usize];
                if !(iv.is_live_at_end() && loop_steps.contains(&iv.alloc_step)) {
                    continue;
                }
                if let Some(site) = iv.alloc(events).site() {
                    if site_ids.len() < 512 && !site_ids.contains(&site) {
                        site_ids.push(site);
                    }
                }
                if iv.alloc_step - loop_steps.start == retaining_end
                    && latest.is_none_or(|(e, _)| iv.alloc_event > e)
                {
                    latest = Some((iv.alloc_event, leaks[k].unit));
                }
            }
        }
        RetainedStacks { site_ids, latest }
    }
}

/// How fast a cluster retains memory, and how bad that is.
struct RetentionRate {
    /// Bytes retained per step, over the steps from the first retaining one to the end of
    /// the loop.
    bytes_per_step: f64,
    /// Blocks retained per step, over the same steps.
    blocks_per_step: f64,
    /// The device's capacity, when known.
    capacity: Option<u64>,
    /// Steps until the retained memory fills the capacity left above the peak.
    steps_until_oom: Option<u64>,
    /// An error for a fast leak or one close to an OOM, else a warning.
    severity: Severity,
}

impl RetentionRate {
    /// The rate of `total_bytes` in `total_blocks` retained from relative loop step `first`
    /// to the end of the loop.
    fn of(
        view: &ModelView<'_>,
        options: &DetectOptions,
        total_bytes: u64,
        total_blocks: u64,
        first: u32,
    ) -> RetentionRate {
        let n = retaining_range(view).len() as u32;
        let span = f64::from(n - first);
        let bytes_per_step = total_bytes as f64 / span;
        let blocks_per_step = total_blocks as f64 / span;
        let capacity = view.capacity(options.capacity);
        let steps_until_oom = capacity.map(|c| {
            let headroom = c.saturating_sub(view.peak_allocated());
            if bytes_per_step > 0.0 {
                (headroom as f64 / bytes_per_step).floor() as u64
            } else {
                u64::MAX
            }
        });
        let severity = if bytes_per_step >= options.retained_error_bytes_per_step as f64
            || steps_until_oom.is_some_and(|s| s <= options.retained_error_steps_until_oom)
        {
            Severity::Error
        } else {
            Severity::Warning
        };
        RetentionRate {
            bytes_per_step,
            blocks_per_step,
            capacity,
            steps_until_oom,
            severity,
        }
    }
}

/// The line to name from the retained blocks' stacks: the innermost frame of the user's code
/// that all of them share, when that line runs once per step (`outputs.append(model(x))`:
/// every block of the kept graph was allocated under `model(x)`); when the shared frame is
/// the one around the whole loop, the loop line under which the last retained block was
/// allocated (`running_loss = running_loss + loss`: the sum made last keeps the graph).
/// `None` when the stacks have no Python frames.
fn name_by_stacks(
    view: &ModelView<'_>,
    site_ids: &[SiteId],
    latest: Option<SiteId>,
    retaining_steps: usize,
) -> Option<(Frame, &'static str)> {
    let snapshot = view.snapshot();
    let framework = crate::model_view::default_framework_paths();
    let user = |f: &Frame| !crate::import::sites::is_framework_frame(f, &framework);
    let python = |s: &CallSite| -> Vec<Frame> {
        s.frames
            .iter()
            .rev()
            .filter(|f| !is_native_frame(f))
            .cloned()
            .collect()
    };
    let stacks: Vec<Vec<Frame>> = site_ids
        .iter()
        .filter_map(|&s| snapshot.sites.get(s as usize))
        .map(python)
        .filter(|f| !f.is_empty())
        .collect();
    let first = stacks.first()?;
    let mut common = first.len();
    for other in &stacks[1..] {
        common = common.min(first.iter().zip(other).take_while(|(a, b)| a == b).count());
    }
    let candidate = first[..common].iter().rev().find(|f| user(f));
    if let Some(frame) = candidate {
        // How many times the line ran: runs of allocations under it.
        let under: Vec<bool> = snapshot
            .sites
            .iter()
            .map(|s| s.frames.iter().any(|f| f == frame))
            .collect();
        // Allocations without a Python frame (the autograd thread's) neither open nor close
        // a run.
        let has_python: Vec<bool> = snapshot
            .sites
            .iter()
            .map(|s| s.frames.iter().any(|f| !is_native_frame(f)))
            .collect();
        let mut runs = 0usize;
        let mut inside = false;
        for e in snapshot.events.iter().filter(|e| {
            e.kind == EventKind::Alloc
                && e.site()
                    .is_some_and(|s| has_python.get(s as usize) == Some(&true))
        }) {
            let now = e
                .site()
                .is_some_and(|s| under.get(s as usize) == Some(&true));
            if now && !inside {
                runs += 1;
            }
            inside = now;
        }
        if runs >= retaining_steps {
            return Some((
                frame.clone(),
                "the line every retained block's stack passes through",
            ));
        }
    }
    let latest = python(snapshot.sites.get(latest? as usize)?);
    latest[common.min(latest.len())..]
        .iter()
        .find(|f| user(f))
        .map(|f| {
            (
                f.clone(),
                "the loop line under which the last retained block was allocated; it keeps the others",
            )
        })
}

/// The most common gap between retaining steps (1 for every step).
fn period_of(steps: &[u32]) -> u32 {
    let mut counts: FxHashMap<u32, usize> = FxHashMap::default();
    for w in steps.windows(2) {
        *counts.entry(w[1] - w[0]).or_default() += 1;
    }
    counts
        .into_iter()
        .max_by(|a, b| a.1.cmp(&b.1).then(b.0.cmp(&a.0)))
        .map(|(gap, _)| gap)
        .unwrap_or(1)
}
