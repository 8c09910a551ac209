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
use vramscope_model::{format_bytes, Category, CategoryBytes, Frame, SiteId};

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
    /// That stack's call site.
    site: Option<SiteId>,
    /// `(loop step, first, last)`: the first and last allocation events of the retained
    /// blocks in each retaining step, by step.
    positions: Vec<(u32, u32, u32)>,
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
        // Per step: blocks, bytes, first and last allocation event.
        let mut retained: FxHashMap<u32, (u64, u64, u32, u32)> = FxHashMap::default();
        for i in unit.intervals(view) {
            let iv = &intervals[i as usize];
            if outlives_a_completed_step(iv, &loop_steps) {
                let r =
                    retained
                        .entry(iv.alloc_step - loop_steps.start)
                        .or_insert((0, 0, u32::MAX, 0));
                r.0 += 1;
                r.1 = r.1.saturating_add(view.interval_size(iv));
                r.2 = r.2.min(iv.alloc_event);
                r.3 = r.3.max(iv.alloc_event);
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
        let (site, kept) = match kept_line_of(view, unit.intervals(view), &loop_steps, &framework) {
            Some((site, kept)) => (Some(site), kept),
            None => (None, None),
        };
        let positions = steps
            .iter()
            .map(|s| (*s, retained[s].2, retained[s].3))
            .collect();
        leaks.push(Leak {
            unit: u,
            steps,
            bytes,
            blocks,
            kept,
            site,
            positions,
        });
    }

    // Sites kept through one line are one bug; a site without a line of the user's is its own.
    let mut groups: Vec<(Option<Frame>, Vec<usize>)> = Vec::new();
    let mut by_keeper: FxHashMap<Frame, usize> = FxHashMap::default();
    for (k, leak) in leaks.iter().enumerate() {
        let key = leak.kept.as_ref().map(|kept| kept.keeper.clone());
        match key.as_ref().and_then(|key| by_keeper.get(key)) {
            Some(&g) => groups[g].1.push(k),
            None => {
                if let Some(key) = &key {
                    by_keeper.insert(key.clone(), groups.len());
                }
                groups.push((key, vec![k]));
            }
        }
    }
    let graphs = kept_graphs(view, &units, &leaks, &groups);
    let mut merged: Vec<(Option<Frame>, Vec<usize>)> = Vec::new();
    let mut roots: Vec<Option<GraphRoot>> = Vec::new();
    for (g, group) in groups.iter().enumerate() {
        match &graphs[g] {
            Membership::Absorbed => {}
            Membership::Alone => {
                merged.push(group.clone());
                roots.push(None);
            }
            Membership::Root(absorbed) => {
                let mut members = group.1.clone();
                let graph: Vec<usize> = absorbed
                    .iter()
                    .flat_map(|&a| groups[a].1.iter().copied())
                    .collect();
                members.extend(&graph);
                merged.push((group.0.clone(), members));
                roots.push(Some(GraphRoot {
                    root: group.1.clone(),
                    graph,
                }));
            }
        }
    }
    let mut findings: Vec<Finding> = merged
        .iter()
        .zip(&roots)
        .map(|((_, members), root)| {
            report_group(view, options, &units, &leaks, members, root.as_ref())
        })
        .collect();
    note_same_steps(&mut findings, &merged, &leaks);
    for f in findings {
        sink.report(f);
    }
}

/// Per-step bytes at or under which a kept tensor counts as small: a loss, a metric from
/// `v.mean()`, a sum, not a batch of activations.
const SMALL_TENSOR_BYTES: u64 = 64 << 10;

/// How a group of leaking sites (those kept through one line) takes part in a kept graph.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Membership {
    /// On its own: a finding of its own.
    Alone,
    /// The small tensor that keeps the graph of the groups listed (by group index).
    Root(Vec<usize>),
    /// Part of another group's graph: no finding of its own.
    Absorbed,
}

/// The parts of a finding about a kept graph: the groups' leak indices of the small tensor
/// that keeps it, and of the graph it keeps.
struct GraphRoot {
    root: Vec<usize>,
    graph: Vec<usize>,
}

/// Finds the small tensors kept with their autograd graph (`losses.append(loss)`, a metric
/// `v.mean()` kept every step): groups retained in exactly the same steps, where one small
/// tensor is made after the others in every one of them, by the frame that drives the model.
/// The graph's tensors come from the forward under that same driving frame: at least one of
/// them is made under a module call (`nn.Module.__call__`) whose caller is in the function
/// whose frames hold the small tensor. Two lists filled outside the model (no group made
/// under a module call) stay two findings. In a trace with no module call at all (the demo's
/// stacks, or a trace without Python stacks) the order and sizes decide alone.
fn kept_graphs(
    view: &ModelView<'_>,
    units: &[Unit],
    leaks: &[Leak],
    groups: &[(Option<Frame>, Vec<usize>)],
) -> Vec<Membership> {
    let mut out = vec![Membership::Alone; groups.len()];
    let sites = &view.snapshot().sites;
    let any_module_call = sites
        .iter()
        .any(|s| s.frames.iter().any(crate::model_view::is_module_call));
    // Groups by the steps they retain in (those of their largest member).
    let mut buckets: FxHashMap<&[u32], Vec<usize>> = FxHashMap::default();
    for (g, (_, members)) in groups.iter().enumerate() {
        let lead = cluster_lead(leaks, members);
        buckets.entry(lead.steps.as_slice()).or_default().push(g);
    }
    let mut keys: Vec<&[u32]> = buckets.keys().copied().collect();
    keys.sort_unstable();
    for key in keys {
        let bucket = &buckets[key];
        if bucket.len() < 2 || key.is_empty() {
            continue;
        }
        let info: Vec<GroupShape> = bucket
            .iter()
            .map(|&g| GroupShape::of(view, units, leaks, &groups[g].1, key))
            .collect();
        // The driving functions: the callers of the model among the graph's candidates.
        let drivers: Vec<(&str, &str)> = info
            .iter()
            .filter_map(|i| i.model_caller.as_ref())
            .map(|f| (f.file.as_str(), f.function.as_str()))
            .collect();
        if any_module_call && drivers.is_empty() {
            continue;
        }
        let driven = |i: &GroupShape| {
            !any_module_call
                || i.stack_functions
                    .iter()
                    .any(|(file, function)| drivers.contains(&(file.as_str(), function.as_str())))
        };
        let biggest = info.iter().map(|i| i.bytes_per_step).max().unwrap_or(0);
        // The root: the small tensor made last in the step, by the driving frame.
        let Some(root) = (0..info.len())
            .filter(|&k| {
                let i = &info[k];
                !i.native
                    && i.model_caller.is_none()
                    && i.bytes_per_step <= SMALL_TENSOR_BYTES
                    && i.bytes_per_step.saturating_mul(8) <= biggest
                    && driven(i)
            })
            .max_by_key(|&k| (info[k].first_in_first_step, std::cmp::Reverse(bucket[k])))
        else {
            continue;
        };
        let made_before_root = |i: &GroupShape| {
            i.last_by_step
                .iter()
                .zip(&info[root].first_by_step)
                .all(|(last, first)| last < first)
        };
        let absorbed: Vec<usize> = (0..info.len())
            .filter(|&k| k != root && !info[k].native && driven(&info[k]))
            .filter(|&k| made_before_root(&info[k]))
            .collect();
        if !any_module_call || absorbed.iter().any(|&k| info[k].model_caller.is_some()) {
            if absorbed.is_empty() {
                continue;
            }
            for &k in &absorbed {
                out[bucket[k]] = Membership::Absorbed;
            }
            out[bucket[root]] = Membership::Root(absorbed.iter().map(|&k| bucket[k]).collect());
        }
    }
    out
}

/// What [`kept_graphs`] needs to know of one group.
struct GroupShape {
    /// Bytes retained per retaining step.
    bytes_per_step: u64,
    /// Whether the group has no line of the user's (named by autograd node).
    native: bool,
    /// The caller of the outermost module call, when the group's memory is made under one.
    model_caller: Option<Frame>,
    /// `(file, function)` of every frame of the group's stack.
    stack_functions: Vec<(String, String)>,
    /// The first allocation event of the group in each of the bucket's steps.
    first_by_step: Vec<u32>,
    /// The last allocation event of the group in each of the bucket's steps.
    last_by_step: Vec<u32>,
    /// The first allocation event in the first step.
    first_in_first_step: u32,
}

impl GroupShape {
    /// The shape of the group whose leaks are `members`, over the retaining steps `steps`.
    fn of(
        view: &ModelView<'_>,
        units: &[Unit],
        leaks: &[Leak],
        members: &[usize],
        steps: &[u32],
    ) -> GroupShape {
        let mut first_by_step = vec![u32::MAX; steps.len()];
        let mut last_by_step = vec![0u32; steps.len()];
        let mut bytes = 0u64;
        for &m in members {
            let leak = &leaks[m];
            bytes = bytes.saturating_add(leak.bytes);
            for &(step, first, last) in &leak.positions {
                if let Ok(k) = steps.binary_search(&step) {
                    first_by_step[k] = first_by_step[k].min(first);
                    last_by_step[k] = last_by_step[k].max(last);
                }
            }
        }
        let lead = cluster_lead(leaks, members);
        let model_caller = lead
            .kept
            .as_ref()
            .filter(|k| k.keeper != k.made_at)
            .map(|k| k.keeper.clone());
        let stack_functions = lead
            .site
            .and_then(|s| view.snapshot().sites.get(s as usize))
            .map(|site| {
                site.frames
                    .iter()
                    .map(|f| (f.file.clone(), f.function.clone()))
                    .collect()
            })
            .unwrap_or_default();
        GroupShape {
            bytes_per_step: bytes / steps.len().max(1) as u64,
            native: units[lead.unit].native,
            model_caller,
            stack_functions,
            first_in_first_step: first_by_step.first().copied().unwrap_or(0),
            first_by_step,
            last_by_step,
        }
    }
}

/// Says in each finding which other findings retained in exactly the same steps: nothing in a
/// memory dump says whether one reference keeps them all (a kept tensor's autograd graph keeps
/// the tensors it was made from) or two lists keep two things, so where [`kept_graphs`] found
/// no small tensor keeping the others they stay separate findings, each with its own line and
/// bytes, and the reader is told they may share a cause. The list names at most
/// [`LISTED_SITES`] others, then says how many more: findings retained together can be
/// thousands, and each naming all the others would make the report quadratic in the sites.
fn note_same_steps(
    findings: &mut [Finding],
    groups: &[(Option<Frame>, Vec<usize>)],
    leaks: &[Leak],
) {
    let mut by_steps: FxHashMap<&[u32], Vec<usize>> = FxHashMap::default();
    for (i, (_, members)) in groups.iter().enumerate() {
        by_steps
            .entry(cluster_lead(leaks, members).steps.as_slice())
            .or_default()
            .push(i);
    }
    let sites: Vec<String> = findings
        .iter()
        .map(|f| f.site_label().to_string())
        .collect();
    for same in by_steps.values().filter(|same| same.len() > 1) {
        for &i in same {
            let others: Vec<&str> = same
                .iter()
                .filter(|&&j| j != i)
                .take(LISTED_SITES)
                .map(|&j| sites[j].as_str())
                .collect();
            let more = same.len() - 1 - others.len();
            let mut list = others.join(", ");
            if more > 0 {
                list.push_str(&format!(" and {more} more"));
            }
            let f = &mut findings[i];
            f.summary.push_str(&format!(
                "; retained in the same steps as {list}: if one tensor keeps them all (through its autograd graph), fixing its line fixes them all, else each is a leak of its own"
            ));
            f.evidence = std::mem::take(&mut f.evidence).text("same_steps_as", list);
        }
    }
}

/// How many sites a list in a finding's text names before it says how many more there are.
const LISTED_SITES: usize = 5;

/// How many sites a finding carries (largest first); its evidence counts them all.
const KEPT_SITES: usize = 10;

/// The completed steps: every step but the last, the one before the first mark included (with
/// marks at the optimizer step, as PyTorch's annotations put them, it holds the first
/// iteration; setup allocations there retain in one step only, which is never a leak). The
/// last step is the one in progress at the dump: a snapshot taken mid-forward, before
/// `backward()` or at an OOM holds that step's activations by design, and nothing says the
/// step would not have freed them.
fn retaining_range(view: &ModelView<'_>) -> std::ops::Range<u32> {
    0..(view.steps().len() as u32).saturating_sub(1)
}

/// Whether `iv` counts as retained: live at the end, allocated in a completed step (of
/// `completed`), and alive through a later step that also completed (it began and ended while
/// the block stayed live). Memory of the last completed step is live only into the step in
/// progress, which proves nothing.
fn outlives_a_completed_step(
    iv: &crate::model_view::Interval,
    completed: &std::ops::Range<u32>,
) -> bool {
    iv.is_live_at_end() && iv.alloc_step >= completed.start && iv.alloc_step + 1 < completed.end
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
        // Steps past the range (the one in progress) take no part.
        if iv.alloc_step >= loop_steps.end {
            continue;
        }
        let size = i128::from(view.interval_size(iv));
        delta[slot(iv.alloc_step)] += size;
        if let Some(f) = view.free_step(iv).filter(|&f| f < loop_steps.end) {
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
    root: Option<&GraphRoot>,
) -> Finding {
    let loop_steps = retaining_range(view);
    // The steps of the group: those of its largest member.
    let lead = cluster_lead(leaks, members);
    let steps = &lead.steps;
    let first = steps[0];
    let last_retaining = steps[steps.len() - 1];
    let total_bytes = sat_sum(members.iter().map(|&k| leaks[k].bytes));
    let total_blocks = sat_sum(members.iter().map(|&k| leaks[k].blocks));
    let mut sites = cluster_sites(units, leaks, members);
    let site_count = sites.len();
    let naming = match root {
        Some(root) => GroupNaming::graph_root(view, units, leaks, root),
        None => GroupNaming::choose(units, leaks, members, lead),
    };
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
    let from_sites = if site_count == 1 {
        String::new()
    } else {
        format!(" from {} lines", site_count)
    };
    let origin = naming.origin_phrase();
    let made_of = retained_categories(view, units, leaks, members);
    let retained = format!(
        "{} in {}{from_sites} allocated in {} between steps {first_step} and {last_step} are still live at the end ({} per step){}",
        format_bytes(total_bytes),
        plural(total_blocks, "block"),
        plural(steps.len() as u64, "step"),
        format_bytes(rate.bytes_per_step.round() as u64),
        made_of_phrase(&made_of),
    );
    f.summary = match root {
        Some(root) => {
            let root_bytes = sat_sum(root.root.iter().map(|&k| leaks[k].bytes));
            format!(
                "keeps a small tensor with its autograd graph {every}: the tensor made at {} ({} per step, a loss or a metric) keeps its graph: {}; {retained}",
                naming.made_at,
                format_bytes(root_bytes / steps.len().max(1) as u64),
                graph_list(units, leaks, &root.graph),
            )
        }
        None => format!("keeps memory alive {every}: {retained}{origin}"),
    };
    // Lists in a finding are bounded: the largest sites, then how many more.
    sites.truncate(KEPT_SITES);
    let mut site_list = sites
        .iter()
        .map(|s| format!("{} {}", s.site, format_bytes(s.bytes)))
        .collect::<Vec<_>>()
        .join("; ");
    if site_count > sites.len() {
        site_list.push_str(&format!("; and {} more", site_count - sites.len()));
    }
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
        .int("sites", site_count as u64)
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
    f.fix = if root.is_some() {
        format!(
            "at {site}, keep the value, not the tensor: store loss.item() (or .detach()) instead; the kept tensor keeps its whole autograd graph, the forward's tensors listed above"
        )
    } else if naming.through_model {
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

/// What the retained blocks of the leaks `members` are made of, by the classifier
/// (`crate::categories`): their blocks still live at the end, allocated within the retaining
/// steps' spans of retained allocations (`Leak::positions`).
fn retained_categories(
    view: &ModelView<'_>,
    units: &[Unit],
    leaks: &[Leak],
    members: &[usize],
) -> CategoryBytes {
    let events = &view.snapshot().events;
    let categories = view.categories();
    let mut bytes = CategoryBytes::new();
    for &k in members {
        let leak = &leaks[k];
        let Some(unit) = units.get(leak.unit) else {
            continue;
        };
        let retained = |event: u32| {
            leak.positions
                .iter()
                .any(|&(_, first, last)| first <= event && event <= last)
        };
        for i in unit.intervals(view) {
            let interval = &view.intervals()[i as usize];
            if interval.is_live_at_end() && retained(interval.alloc_event) {
                let size = interval.alloc(events).size;
                bytes.add(categories.of_alloc(interval.alloc_event as usize), size);
            }
        }
    }
    bytes
}

/// `; by what made them they are activations 12.0 MiB, unknown 1.0 MiB`: what retained blocks
/// are made of, said only where it knows some of them (nothing for bytes all unknown).
fn made_of_phrase(bytes: &CategoryBytes) -> String {
    let known = bytes
        .nonzero()
        .any(|(c, _)| !matches!(c, Category::Unknown | Category::BeforeTrace));
    if !known {
        return String::new();
    }
    let parts: Vec<String> = bytes
        .nonzero()
        .map(|(c, b)| format!("{} {}", c.label(), format_bytes(b)))
        .collect();
    format!("; by what made them they are {}", parts.join(", "))
}

/// The stack that retained the most bytes among a leaking site's retained blocks, and the line
/// that keeps them by that stack (`None` when it has no frame of the user's); `None` when no
/// retained block has a site.
fn kept_line_of(
    view: &ModelView<'_>,
    intervals: impl Iterator<Item = u32>,
    loop_steps: &std::ops::Range<u32>,
    framework: &[String],
) -> Option<(SiteId, Option<KeptLine>)> {
    let events = &view.snapshot().events;
    let mut by_site: FxHashMap<SiteId, u64> = FxHashMap::default();
    for i in intervals {
        let iv = &view.intervals()[i as usize];
        if !outlives_a_completed_step(iv, loop_steps) {
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
    Some((site, kept_line(&call_site.frames, framework)))
}

/// The tensors of a kept graph for a reader, largest first: each allocating line with its
/// bytes, or for memory made inside the model the line that called it; at most
/// [`LISTED_SITES`], then how many more.
fn graph_list(units: &[Unit], leaks: &[Leak], graph: &[usize]) -> String {
    let mut parts: Vec<(String, u64)> = Vec::new();
    let mut index: FxHashMap<String, usize> = FxHashMap::default();
    for &k in graph {
        let leak = &leaks[k];
        let label = match &leak.kept {
            Some(kept) if kept.keeper != kept.made_at => format!(
                "the model's tensors under {}",
                vramscope_engine::frame_label(&kept.keeper.file, kept.keeper.line)
            ),
            _ => units[leak.unit].label.clone(),
        };
        match index.get(&label) {
            Some(&i) => parts[i].1 = parts[i].1.saturating_add(leak.bytes),
            None => {
                index.insert(label.clone(), parts.len());
                parts.push((label, leak.bytes));
            }
        }
    }
    parts.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    let more = parts.len().saturating_sub(LISTED_SITES);
    let mut list: Vec<String> = parts
        .iter()
        .take(LISTED_SITES)
        .map(|(label, bytes)| format!("{label} ({})", format_bytes(*bytes)))
        .collect();
    if more > 0 {
        list.push(format!("and {more} more"));
    }
    list.join(", ")
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
        let label = |f: &Frame| vramscope_engine::frame_label(&f.file, f.line);
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

    /// The naming of a small tensor kept with its graph ([`kept_graphs`]): the line of the
    /// frame that drives the model where the tensor's stack passes through it (the caller of a
    /// metric helper), else the line that made it.
    fn graph_root(
        view: &ModelView<'_>,
        units: &[Unit],
        leaks: &[Leak],
        root: &GraphRoot,
    ) -> GroupNaming {
        let label = |f: &Frame| vramscope_engine::frame_label(&f.file, f.line);
        let lead = cluster_lead(leaks, &root.root);
        let unit = &units[lead.unit];
        let driver = root.graph.iter().find_map(|&k| {
            leaks[k]
                .kept
                .as_ref()
                .filter(|kept| kept.keeper != kept.made_at)
                .map(|kept| kept.keeper.clone())
        });
        let stack = lead
            .site
            .and_then(|s| view.snapshot().sites.get(s as usize))
            .map(|s| s.frames.as_slice())
            .unwrap_or(&[]);
        let keeper = driver.as_ref().and_then(|d| {
            stack
                .iter()
                .find(|f| f.file == d.file && f.function == d.function)
                .cloned()
        });
        let (made_at, made_in) = match &lead.kept {
            Some(kept) => (label(&kept.made_at), kept.made_at.function.clone()),
            None => (unit.label.clone(), unit.function.clone()),
        };
        let (site, function) = match &keeper {
            Some(k) => (label(k), k.function.clone()),
            None => (made_at.clone(), made_in.clone()),
        };
        let path = match (&keeper, &lead.kept) {
            (Some(k), Some(kept)) if label(k) != made_at => {
                let mut path = vec![format!("{} ({})", label(k), k.function)];
                path.extend(
                    kept.path
                        .iter()
                        .map(|f| format!("{} ({})", label(f), f.function)),
                );
                path
            }
            _ => Vec::new(),
        };
        GroupNaming {
            site,
            function,
            made_at,
            made_in,
            path,
            through_model: false,
            native: false,
            why: "a small tensor made after the others in every retaining step, by the frame that drives the model, keeps the forward's tensors through its autograd graph: the line that makes and keeps it",
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
    /// Bytes retained per step, over the steps from the first retaining one to the last step
    /// whose retention counts.
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
        // Retention counts in the completed steps but the last (see
        // `outlives_a_completed_step`): the rate is over those from the first retaining one.
        let n = retaining_range(view).len() as u32;
        let span = f64::from(n.saturating_sub(1).saturating_sub(first).max(1));
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
