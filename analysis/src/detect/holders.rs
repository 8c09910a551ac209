//! `top_holders`: what holds memory at the end of the trace (or at its peak), by kind.
//!
//! Weights, optimizer state and caches allocated once are not leaks, but they are usually most
//! of the memory, so they are reported as information. The holders of `crate::model_view` (the
//! call-site groups live at the end, memory from before the recording included) are sorted
//! into four kinds: memory from before the trace, memory allocated in one step, memory
//! allocated across steps, and memory allocated under a module call in the step in progress
//! at the dump (the forward in progress: a dump before `backward()` or at an OOM shows its
//! activations, which is said as such and never as a leak). What the memory is made of is the
//! classifier's answer (`crate::categories`, one engine for every view), said only of the
//! bytes it knows (never of those it calls unknown), and memory that is all parameters,
//! optimizer state and gradients made across steps (AdamW state created as layers unfreeze)
//! is called expected rather than a reference to drop. Each kind present is one finding that lists its largest sites (up to
//! `top_holders`) with their bytes, names the largest, and gives its advice once. When nothing
//! is live at the end, as in a profiler window that frees everything it allocates, the
//! holders at the peak of allocated bytes are reported instead.

use vramscope_model::format_bytes;

use super::{DetectOptions, Finding, FindingKind, FindingSink, FindingSite, Severity};
use crate::model_view::{Holding, ModelView};
use vramscope_engine::{GroupId, GroupKind, SiteGroups};
use vramscope_model::{plural, Category, CategoryBytes, SnapshotSource};

/// The kinds of holders, in report order.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Once,
    Spread,
    Before,
    InProgress,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Once => "weights_and_state",
            Kind::Spread => "across_steps",
            Kind::Before => "before_trace",
            Kind::InProgress => "step_in_progress",
        }
    }
}

/// The caller of the outermost module call (`nn.Module.__call__`) in the stacks of `group`'s
/// sites, when one of them passes through one: the line that runs the model.
fn model_caller(view: &ModelView<'_>, group: GroupId) -> Option<String> {
    let framework = crate::model_view::default_framework_paths();
    let sites = &view.snapshot().sites;
    view.group(group).sites.iter().find_map(|&s| {
        let site = sites.get(s as usize)?;
        let kept = crate::model_view::kept_line(&site.frames, &framework)?;
        (kept.keeper != kept.made_at)
            .then(|| vramscope_engine::frame_label(&kept.keeper.file, kept.keeper.line))
    })
}

/// Reports the largest holders of memory by kind, as information.
pub fn top_holders(view: &ModelView<'_>, options: &DetectOptions, sink: &mut dyn FindingSink) {
    let (holdings, when) = if view.live_at_end().iter().any(|h| h.bytes > 0) {
        (view.live_at_end(), "end")
    } else {
        (view.live_at_peak(), "peak")
    };
    let total = super::sat_sum(holdings.iter().map(|h| h.bytes));
    if total == 0 {
        return;
    }
    let loop_started = !view.loop_steps().is_empty();
    // The step in progress at the dump: the last one (the whole trace when it has no steps).
    let last_step = view.steps().last().map(|s| s.step).unwrap_or(0);
    let kind_of = |h: &Holding| {
        if h.group == SiteGroups::BEFORE_TRACE {
            Kind::Before
        } else if when == "end"
            && h.first_step == last_step
            && h.last_step == last_step
            && model_caller(view, h.group).is_some()
        {
            Kind::InProgress
        } else if loop_started && h.first_step != h.last_step {
            Kind::Spread
        } else {
            Kind::Once
        }
    };
    for kind in [Kind::Once, Kind::Spread, Kind::Before, Kind::InProgress] {
        let members: Vec<&Holding> = holdings
            .iter()
            .filter(|h| h.bytes > 0 && kind_of(h) == kind)
            .collect();
        if members.is_empty() {
            continue;
        }
        let bytes = super::sat_sum(members.iter().map(|h| h.bytes));
        let blocks = super::sat_sum(members.iter().map(|h| h.blocks));
        let first_step = members.iter().map(|h| h.first_step).min().unwrap_or(0);
        let last_step = members.iter().map(|h| h.last_step).max().unwrap_or(0);
        let mut sites: Vec<FindingSite> = members
            .iter()
            .map(|h| {
                let (site, function) = group_name(view, h.group);
                FindingSite {
                    site,
                    function,
                    bytes: h.bytes,
                    blocks: h.blocks,
                }
            })
            .collect();
        sites.sort_by(|a, b| b.bytes.cmp(&a.bytes).then(a.site.cmp(&b.site)));
        let shown = options.top_holders.max(1);
        let more = sites.len().saturating_sub(shown);
        let site_count = sites.len();
        sites.truncate(shown);
        let share = bytes as f64 / total as f64;
        let share_text = if share < 0.005 {
            "<1%".to_string()
        } else {
            format!("{:.0}%", share * 100.0)
        };
        let mut f = Finding::at_group(view, FindingKind::TopHolders, Severity::Info, None);
        f.site = Some(sites[0].site.clone());
        f.function = sites[0].function.clone();
        f.bytes = bytes;
        f.count = blocks;
        f.first_step = Some(first_step);
        f.last_step = Some(last_step);
        // What the memory is made of, from the classifier (`crate::categories`) over the
        // engine's own state: nothing is claimed of the bytes it calls unknown, and memory
        // from before the trace is said by its kind.
        let mut made_of = CategoryBytes::new();
        for h in &members {
            made_of += view.group_categories(h.group, when == "peak");
        }
        let known: Vec<(Category, u64)> = made_of
            .nonzero()
            .filter(|&(c, _)| !matches!(c, Category::Unknown | Category::BeforeTrace))
            .collect();
        let known_bytes = super::sat_sum(known.iter().map(|&(_, b)| b));
        let state_only = |c: Category| {
            matches!(
                c,
                Category::Parameters | Category::OptimizerState | Category::Gradients
            )
        };
        // Expected: every byte is parameters, optimizer state or gradients.
        let expected =
            !known.is_empty() && known_bytes == bytes && known.iter().all(|&(c, _)| state_only(c));
        let said = if known.is_empty() {
            String::new()
        } else if known_bytes == bytes && known.len() == 1 {
            format!(" ({})", known[0].0.label())
        } else {
            let parts: Vec<String> = known
                .iter()
                .map(|&(c, b)| format!("{} {}", c.label(), format_bytes(b)))
                .collect();
            format!(" (of which {})", parts.join(", "))
        };
        let caller = match kind {
            Kind::InProgress => members.iter().find_map(|h| model_caller(view, h.group)),
            _ => None,
        };
        let what = match kind {
            Kind::Once if loop_started => format!("allocated in one step{said}"),
            Kind::Once => format!("allocated in the trace (it has no steps){said}"),
            Kind::Spread => format!("allocated across steps {first_step}..{last_step}{said}"),
            Kind::Before => format!("allocated before the trace began{said}"),
            Kind::InProgress => format!(
                "allocated under the model call at {} in the step in progress at the dump",
                caller.as_deref().unwrap_or("?")
            ),
        };
        // Memory a trace knows only as a total (a profiler trace's statistics) is in no block.
        let held_in = if blocks == 0 {
            "in no block the trace names (a total from its statistics)".to_string()
        } else {
            format!("in {}", plural(blocks, "block"))
        };
        f.summary = format!(
            "{} {held_in} from {} {what} held {share_text} of live memory at the {when}; the largest is {} ({})",
            format_bytes(bytes),
            plural(site_count as u64, "site"),
            sites[0].site,
            format_bytes(sites[0].bytes),
        );
        if kind == Kind::InProgress {
            f.summary = format!(
                "the forward in progress holds {}: {}",
                format_bytes(bytes),
                f.summary
            );
        }
        let mut evidence = f.evidence.text("when", when).text("kind", kind.name());
        if let Some(tag) = tag_of(view, members[0].group) {
            evidence = evidence.text("tag", tag);
        }
        f.evidence = evidence
            .int("live_bytes", bytes)
            .int("live_blocks", blocks)
            .int(
                "requested_bytes",
                super::sat_sum(members.iter().map(|h| h.requested)),
            )
            .float("share_of_live", share)
            .int("sites", site_count as u64)
            .int("sites_not_listed", more as u64)
            .int("first_step", first_step)
            .int("last_step", last_step);
        f.fix = match kind {
            Kind::Once if loop_started => "expected for weights, optimizer state and caches made once; to shrink it, use lower precision, sharding or offloading".to_string(),
            Kind::Once => "memory held to the end of the trace; to shrink it, use lower precision, sharding or offloading".to_string(),
            Kind::InProgress => "not a leak: a forward's activations are kept for backward() and freed by it or at the end of the step, so a dump taken before backward() (or at an OOM in the forward) shows them; to see what outlives a step, dump after the optimizer step".to_string(),
            Kind::Spread if expected => "expected: optimizer state and gradients are made as parameters start training (the first steps, or progressive unfreezing); to shrink them, use lower precision, sharding or offloading".to_string(),
            Kind::Spread => "blocks from several steps are still live: if they keep growing with the step count it is a leak (see retained_per_step); otherwise something keeps a reference to them between steps".to_string(),
            Kind::Before => before_trace_fix(view.snapshot().source).to_string(),
        };
        f.sites = sites;
        sink.report(f);
    }
}

/// A group's name for a reader: its `file:line`, or for a group without a source line (C++
/// frames only) the name of its first site ([`ModelView::site_name`]).
fn group_name(view: &ModelView<'_>, group: GroupId) -> (String, String) {
    let g = view.group(group);
    match (&g.file_line, g.kind) {
        (Some(file_line), GroupKind::Site) if !file_line.starts_with("??:") => {
            (file_line.clone(), g.function.clone())
        }
        _ => match g.sites.first() {
            Some(&site) => {
                let name = view.site_name(site);
                (name.label, name.function)
            }
            None => (g.label().to_string(), g.function.clone()),
        },
    }
}

/// The tag of the group's first allocation that has one (`alloc.tagged("weights")`).
fn tag_of<'a>(view: &ModelView<'a>, group: GroupId) -> Option<&'a str> {
    let snapshot = view.snapshot();
    view.group_intervals(group).iter().find_map(|&i| {
        let event = view.intervals()[i as usize].alloc(&snapshot.events);
        snapshot.tag(event.tag())
    })
}

/// What to do about memory allocated before a trace of `source` began: start that recording
/// earlier, in the words of the tool that made it.
fn before_trace_fix(source: SnapshotSource) -> &'static str {
    match source {
        SnapshotSource::Pytorch => {
            "allocated before recording began: call torch.cuda.memory._record_memory_history() earlier (before the model is built) to see where"
        }
        SnapshotSource::ChromeTrace => {
            "allocated before the profiler started: start torch.profiler with profile_memory=True earlier (before the model is built), or record with torch.cuda.memory._record_memory_history(), to see where"
        }
        _ => "allocated before this recording began: attach vramscope before the model is built to see where",
    }
}
