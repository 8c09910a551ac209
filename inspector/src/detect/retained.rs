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
//! One finding is one line to change. Each leaking site is charged to the line that keeps it
//! ([`crate::model_view::kept_line`]): a block made inside a model called from the loop
//! (`outputs.append(model(x))`) is kept through the loop line that called the model, not the
//! model's own line; any other block is kept by the line that allocated it. Sites kept through
//! one line are one finding, named at that line, with the line that made the memory
//! (`made_at`) and the user's frames between; a leak from one site is named at its allocating
//! line. Leaks kept through different lines are separate findings, even when they retain in
//! the same steps: two lists filled in one loop are two bugs, and fixing one leaves the other.
//! A site without a Python frame (the autograd thread's) is its own finding, named by its
//! autograd node.

use rustc_hash::FxHashMap;
use vramscope_model::{format_bytes, Frame, SiteId};

use vramscope_model::plural;

use super::{
    sat_sum, DetectOptions, Finding, FindingKind, FindingSink, FindingSite, PerStep, Severity,
};
use crate::model_view::{kept_line, KeptLine, ModelView};
use vramscope_engine::{GroupId, GroupKind};

/// One site as the detector sees it: every interval index it owns.
struct Unit {
    label: String,
    function: String,
    /// Whether the unit is named by its autograd node or C++ function (no source line).
    native: bool,
    /// The groups all of whose intervals are the unit's: their indices are read from the view
    /// (`ModelView::group_intervals`), not copied, as a big trace has millions.
    groups: Vec<GroupId>,
    /// The unit's intervals of groups that are told apart by site (no source line), in order.
    own: Vec<u32>,
}

impl Unit {
    /// The indices of the unit's intervals: its groups', then its own.
    fn intervals<'v>(&'v self, view: &'v ModelView<'_>) -> impl Iterator<Item = u32> + 'v {
        self.groups
            .iter()
            .flat_map(|&g| view.group_intervals(g).iter().copied())
            .chain(self.own.iter().copied())
    }
}

/// What one leaking site retained.
struct Leak {
    unit: usize,
    /// Loop step indices (relative to the loop's first) that retained memory.
    steps: Vec<u32>,
    bytes: u64,
    blocks: u64,
    /// The line that keeps the site's retained blocks (of the stack that retained the most
    /// bytes), when their stacks have a frame of the user's.
    kept: Option<KeptLine>,
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
    let framework = crate::model_view::default_framework_paths();
    let mut leaks: Vec<Leak> = Vec::new();
    for (u, unit) in units.iter().enumerate() {
        // Retained blocks per loop step (relative index), and the live staircase.
        let mut retained: FxHashMap<u32, (u64, u64)> = FxHashMap::default();
        for i in unit.intervals(view) {
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
        let live = staircase(view, unit.intervals(view), loop_steps.clone());
        if !is_leak(&steps, &live, bytes, n as u32) {
            continue;
        }
        let kept = kept_line_of(view, unit.intervals(view), &loop_steps, &framework);
        leaks.push(Leak {
            unit: u,
            steps,
            bytes,
            blocks,
            kept,
        });
    }

    // Sites kept through one line are one bug; a site without a line of the user's is its own.
    let mut groups: Vec<(Option<Frame>, Vec<usize>)> = Vec::new();
    for (k, leak) in leaks.iter().enumerate() {
        let key = leak.kept.as_ref().map(|kept| kept.keeper.clone());
        match groups
            .iter_mut()
            .find(|(keeper, _)| key.is_some() && *keeper == key)
        {
            Some((_, members)) => members.push(k),
            None => groups.push((key, vec![k])),
        }
    }
    let mut findings: Vec<Finding> = groups
        .iter()
        .map(|(_, members)| report_group(view, options, &units, &leaks, members))
        .collect();
    note_same_steps(&mut findings, &groups, &leaks, n as u32);
    for f in findings {
        sink.report(f);
    }
}

/// Says in each finding which other findings retained in exactly the same steps: nothing in a
/// memory dump says whether one reference keeps them all (a kept tensor's autograd graph keeps
/// the tensors it was made from) or two lists keep two things, so they stay separate findings,
/// each with its own line and bytes, and the reader is told they may share a cause. The last
/// loop step, which the snapshot may have cut short, takes no part in the comparison.
fn note_same_steps(
    findings: &mut [Finding],
    groups: &[(Option<Frame>, Vec<usize>)],
    leaks: &[Leak],
    loop_len: u32,
) {
    let last = loop_len.saturating_sub(1);
    let steps_of = |members: &[usize]| -> Vec<u32> {
        cluster_lead(leaks, members)
            .steps
            .iter()
            .copied()
            .filter(|&s| s != last)
            .collect()
    };
    let keys: Vec<Vec<u32>> = groups.iter().map(|(_, m)| steps_of(m)).collect();
    let sites: Vec<String> = findings
        .iter()
        .map(|f| f.site_label().to_string())
        .collect();
    for (i, f) in findings.iter_mut().enumerate() {
        let others: Vec<&str> = (0..keys.len())
            .filter(|&j| j != i && keys[j] == keys[i])
            .map(|j| sites[j].as_str())
            .collect();
        if others.is_empty() {
            continue;
        }
        let list = others.join(", ");
        f.summary.push_str(&format!(
            "; retained in the same steps as {list}: if one tensor keeps them all (through its autograd graph), fixing its line fixes them all, else each is a leak of its own"
        ));
        f.evidence = std::mem::take(&mut f.evidence).text("same_steps_as", list);
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
    // trace, each a copy of its name). A group named by its source line is its unit's whole,
    // which reads the group's intervals from the view; only the intervals of groups told apart
    // by site are listed here.
    let mut by_group: Vec<Option<usize>> = vec![None; view.groups().len()];
    let mut by_site: FxHashMap<SiteId, usize> = FxHashMap::default();
    let events = &view.snapshot().events;
    for (i, iv) in view.intervals().iter().enumerate() {
        let group = view.group(iv.group);
        let cached_by_group = &mut by_group[iv.group as usize];
        let u = match (&group.file_line, group.kind) {
            (Some(file_line), GroupKind::Site) if !file_line.starts_with("??:") => {
                if cached_by_group.is_none() {
                    let native = group
                        .sites
                        .first()
                        .is_some_and(|&s| view.site_name(s).native);
                    let u = units.named(file_line.clone(), group.function.clone(), native);
                    units.list[u].groups.push(iv.group);
                    *cached_by_group = Some(u);
                }
                continue;
            }
            _ => match iv.alloc(events).site() {
                Some(site) => *by_site.entry(site).or_insert_with(|| {
                    let name = view.site_name(site);
                    units.named(name.label, name.function, name.native)
                }),
                None => *cached_by_group.get_or_insert_with(|| {
                    units.named(group.label().to_string(), String::new(), false)
                }),
            },
        };
        units.list[u].own.push(i as u32);
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
    /// The place of the unit named `label`, made (with `function` and whether it is `native`)
    /// when it is new.
    fn named(&mut self, label: String, function: String, native: bool) -> usize {
        if let Some(&u) = self.by_label.get(&label) {
            return u;
        }
        self.list.push(Unit {
            label: label.clone(),
            function,
            native,
            groups: Vec::new(),
            own: Vec::new(),
        });
        self.by_label.insert(label, self.list.len() - 1);
        self.list.len() - 1
    }
}

/// Live bytes of the intervals at the end of each loop step, and (first) just before the loop.
fn staircase(
    view: &ModelView<'_>,
    intervals: impl Iterator<Item = u32>,
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
    for i in intervals {
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

/// The finding of one group of sites kept through one line.
fn report_group(
    view: &ModelView<'_>,
    options: &DetectOptions,
    units: &[Unit],
    leaks: &[Leak],
    members: &[usize],
) -> Finding {
    let loop_steps = retaining_range(view);
    // The steps of the group: those of its largest member.
    let lead = cluster_lead(leaks, members);
    let steps = &lead.steps;
    let first = steps[0];
    let last_retaining = steps[steps.len() - 1];
    let total_bytes = sat_sum(members.iter().map(|&k| leaks[k].bytes));
    let total_blocks = sat_sum(members.iter().map(|&k| leaks[k].blocks));
    let sites = cluster_sites(units, leaks, members);
    let naming = GroupNaming::choose(units, leaks, members, lead);
    let rate = RetentionRate::measure(view, options, total_bytes, total_blocks, first);
    let period = period_of(steps);
    let first_step = view.step_number(loop_steps.start + first);
    let last_step = view.step_number(loop_steps.start + last_retaining);
    let every = match period {
        1 => "every step".to_string(),
        p => format!("every {p} steps"),
    };
    let site = naming.site.clone();
    let mut f = Finding::at_group(view, FindingKind::RetainedPerStep, rate.severity, None);
    f.site = Some(site.clone());
    f.function = naming.function.clone();
    f.made_at = Some(naming.made_at.clone());
    f.frames = naming.path.clone();
    f.bytes = total_bytes;
    f.count = total_blocks;
    f.per_step = Some(PerStep::new(rate.bytes_per_step, rate.blocks_per_step));
    f.first_step = Some(first_step);
    f.last_step = Some(last_step);
    let from_sites = if sites.len() == 1 {
        String::new()
    } else {
        format!(" from {} lines", sites.len())
    };
    let origin = naming.origin_phrase();
    f.summary = format!(
        "keeps memory alive {every}: {} in {}{from_sites} allocated in {} between steps {first_step} and {last_step} are still live at the end ({} per step){origin}",
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
        .text("named_because", naming.why);
    if let (Some(c), Some(s)) = (rate.capacity, rate.steps_until_oom) {
        evidence = evidence
            .int("device_capacity_bytes", c)
            .int("peak_allocated_bytes", view.peak_allocated())
            .int("steps_until_oom", s);
    }
    f.evidence = evidence;
    f.sites = sites;
    f.fix = if naming.through_model {
        format!(
            "at {site}, do not keep the model's output with its graph: run the loop under torch.no_grad() (or torch.inference_mode()) when it does not train, or keep out.detach() (.cpu() to move it off the device) instead of the output"
        )
    } else if naming.native {
        format!(
            "{site} is kept from the backward pass: a hook or a list keeps the gradient; store grad.detach().cpu() or a statistic of it, or remove the hook once it has run"
        )
    } else {
        format!(
            "at {site}, do not keep the step's device tensors: store loss.item() or t.detach().cpu() instead of the tensor (a kept tensor keeps its whole autograd graph), or drop the reference each step"
        )
    };
    f
}

/// The line that keeps a leaking site's retained blocks, from the stack that retained the most
/// bytes among them; `None` when that stack has no frame of the user's.
fn kept_line_of(
    view: &ModelView<'_>,
    intervals: impl Iterator<Item = u32>,
    loop_steps: &std::ops::Range<u32>,
    framework: &[String],
) -> Option<KeptLine> {
    let events = &view.snapshot().events;
    let mut by_site: FxHashMap<SiteId, u64> = FxHashMap::default();
    for i in intervals {
        let iv = &view.intervals()[i as usize];
        if !(iv.is_live_at_end() && loop_steps.contains(&iv.alloc_step)) {
            continue;
        }
        if let Some(site) = iv.alloc(events).site() {
            let bytes = by_site.entry(site).or_default();
            *bytes = bytes.saturating_add(view.interval_size(iv));
        }
    }
    let (&site, _) = by_site
        .iter()
        .max_by(|a, b| a.1.cmp(b.1).then(b.0.cmp(a.0)))?;
    let call_site = view.snapshot().sites.get(site as usize)?;
    kept_line(&call_site.frames, framework)
}

/// How a group's finding is named: the line to change, where the memory was made, and why.
struct GroupNaming {
    /// The line to change: the keeping line of a group of several sites, the allocating line
    /// of one.
    site: String,
    /// The function at `site`.
    function: String,
    /// The line that made the memory (`site` itself for a plain leak).
    made_at: String,
    /// The function at `made_at`.
    made_in: String,
    /// The user's frames from `site` in to `made_at`, as `file:line (function)`.
    path: Vec<String>,
    /// Whether the memory was made inside a module called from `site`.
    through_model: bool,
    /// Whether the group has no line of the user's (named by autograd node).
    native: bool,
    /// Why the finding is named so, for the evidence.
    why: &'static str,
}

impl GroupNaming {
    /// The naming of the group `members` of `leaks`, whose largest member is `lead`.
    fn choose(units: &[Unit], leaks: &[Leak], members: &[usize], lead: &Leak) -> GroupNaming {
        let label = |f: &Frame| format!("{}:{}", f.file, f.line);
        let lead_unit = &units[lead.unit];
        let Some(kept) = &lead.kept else {
            return GroupNaming {
                site: lead_unit.label.clone(),
                function: lead_unit.function.clone(),
                made_at: lead_unit.label.clone(),
                made_in: lead_unit.function.clone(),
                path: Vec::new(),
                through_model: false,
                native: lead_unit.native,
                why: if lead_unit.native {
                    "no frame of the stack is the user's code: the site is named by its autograd node"
                } else {
                    "the retained blocks come from one line: the line that allocated them"
                },
            };
        };
        let path: Vec<String> = kept
            .path
            .iter()
            .map(|f| format!("{} ({})", label(f), f.function))
            .collect();
        if members.len() == 1 {
            return GroupNaming {
                site: lead_unit.label.clone(),
                function: lead_unit.function.clone(),
                made_at: lead_unit.label.clone(),
                made_in: lead_unit.function.clone(),
                path,
                through_model: false,
                native: false,
                why: "the retained blocks come from one line: the line that allocated them",
            };
        }
        // Where the memory was made: the innermost user frame every member's path shares
        // below the keeping line (the model's own `forward` line), else the largest site.
        let mut common = kept.path.len();
        for &k in members {
            if let Some(other) = &leaks[k].kept {
                common = common.min(
                    kept.path
                        .iter()
                        .zip(&other.path)
                        .take_while(|(a, b)| a == b)
                        .count(),
                );
            }
        }
        let (made_at, made_in) = match kept.path.get(common.wrapping_sub(1)) {
            Some(shared) if common > 1 => (label(shared), shared.function.clone()),
            _ => (lead_unit.label.clone(), lead_unit.function.clone()),
        };
        GroupNaming {
            site: label(&kept.keeper),
            function: kept.keeper.function.clone(),
            made_at,
            made_in,
            path,
            through_model: kept.keeper != kept.made_at,
            native: false,
            why: "the retained blocks come from several lines under one call: the user's line outside the module call chain that made them all keeps them",
        }
    }

    /// `, made in forward at model.py:201, kept through evaluate.py:57` when the two differ.
    fn origin_phrase(&self) -> String {
        if self.made_at == self.site || self.native {
            return String::new();
        }
        let made_in = if self.made_in.is_empty() {
            String::new()
        } else {
            format!(" in {}", self.made_in)
        };
        format!(
            "; made{made_in} at {}, kept through {}",
            self.made_at, self.site
        )
    }
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
    fn measure(
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
