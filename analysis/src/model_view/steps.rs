//! How the events of a snapshot are numbered into steps.
//!
//! A trace's steps come from its own marks (`mark_step`, an optimizer annotation, a profiler
//! slice) when they cover the trace; otherwise [`StepPlan`] infers them from the repeating
//! call-site sequence of the allocations (the line that opens each iteration of the loop);
//! failing both, the whole trace is one step.
//!
//! A step is one call of the frame that drives the model: the user's code outside
//! `nn.Module.__call__` (`_call_impl`), never a loop under it. The inference therefore reads
//! only the user frames outside the outermost module call of each stack, so the 24 layers of
//! one forward, the shards of an offloading loader or an iteration loop inside `forward` are
//! not steps, and a trace with one call of the driving frame has no steps. Marks seen only in
//! a prefix of the trace (a warm-up before a CUDA-graph replay, which runs no Python) are not
//! the steps of the rest: such a trace has no steps ([`StepSource::PrefixMarks`]). `build` asks the plan for each event's step number while it
//! feeds the events through, and [`collect_steps`] lists the steps the view will index.
//!
//! The public half re-steps a snapshot that is already loaded, for the CLI's `--step-marker`:
//! [`apply_step_marker`] by mark labels or annotation names, [`restep`] also by a function in
//! the allocations' stacks, with [`step_marker_candidates`] to suggest names when nothing
//! matches. The parent module re-exports these, so they stay `model_view::restep` and so on.

use rustc_hash::FxHashMap;
use vramscope_model::{step_after, Event, EventKind, Snapshot};

use super::stacks::{default_framework_paths, is_module_call};
use super::StepInfo;

/// Where the steps of a view came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StepSource {
    /// The trace's own step marks (`mark_step`, an annotation such as
    /// `Optimizer.step#AdamW.step`, a profiler slice); `label` is the first mark's label.
    Recorded {
        /// The label of the first mark.
        label: String,
    },
    /// No marks: each step begins where the loop's first allocating line runs again (the
    /// repeating call-site sequence of the allocations).
    Inferred {
        /// `file:line` of the line that opens each iteration.
        opener: String,
    },
    /// Neither marks nor a repeating sequence: the whole trace is one step.
    None,
    /// Step marks cover only a prefix of the trace (a warm-up before a loop that runs without
    /// Python, such as a CUDA-graph replay): they are not the steps of the rest, so the view
    /// has no steps.
    PrefixMarks {
        /// The label of the first mark.
        label: String,
        /// How many marked steps the prefix holds.
        marked_steps: u64,
        /// Events up to the last mark.
        covered_events: u64,
        /// Events in the trace.
        events: u64,
    },
}

impl StepSource {
    /// A phrase for reports: where the steps came from.
    pub fn describe(&self) -> String {
        match self {
            StepSource::Recorded { label } if label.is_empty() => {
                "steps from the trace's step marks".to_string()
            }
            StepSource::Recorded { label } => {
                format!("steps from the trace's step marks (`{label}`)")
            }
            StepSource::Inferred { opener } => {
                format!("steps inferred from the repeating allocations (each begins at {opener})")
            }
            StepSource::None => "no steps (no marks and no repeating loop found)".to_string(),
            StepSource::PrefixMarks {
                label,
                marked_steps,
                covered_events,
                events,
            } => format!(
                "no steps: the trace's {} (`{label}`) cover only its first {covered_events} of {events} events (a warm-up), not the rest",
                vramscope_model::plural(*marked_steps, "step mark"),
            ),
        }
    }
}

/// Steps found from the repeating call-site sequence of a trace without marks.
#[derive(Clone, Debug, PartialEq, Eq)]
struct InferredSteps {
    /// Event indices that begin steps 1, 2, ...
    starts: Vec<u32>,
    /// `file:line` of the line that opens each iteration.
    opener: String,
}

impl InferredSteps {
    /// The step of event `index`: how many steps began at or before it.
    fn step_of(&self, index: usize) -> usize {
        self.starts.partition_point(|&s| s as usize <= index)
    }
}

/// How the view numbers steps: the events' own step numbers, or inferred ones.
pub(super) struct StepPlan {
    /// Where the steps come from, as the view reports it.
    pub(super) source: StepSource,
    /// The inferred steps, when the trace has no marks of its own.
    inferred: Option<InferredSteps>,
    /// Whether every event is step 0 (marks that cover only a prefix).
    flat: bool,
}

impl StepPlan {
    /// The plan for `snapshot`: its own marks when it has any, else the loop found in its
    /// allocations' stacks, else one step for everything.
    pub(super) fn from_snapshot(snapshot: &Snapshot) -> StepPlan {
        let marked = !snapshot.steps.is_empty() || snapshot.events.iter().any(|e| e.step > 0);
        if marked {
            let label = first_mark_label(snapshot);
            if let Some((marked_steps, covered_events)) = prefix_marks(snapshot) {
                return StepPlan {
                    source: StepSource::PrefixMarks {
                        label,
                        marked_steps,
                        covered_events,
                        events: snapshot.events.len() as u64,
                    },
                    inferred: None,
                    flat: true,
                };
            }
            return StepPlan {
                source: StepSource::Recorded { label },
                inferred: None,
                flat: false,
            };
        }
        match infer_steps(snapshot) {
            Some(inferred) => StepPlan {
                source: StepSource::Inferred {
                    opener: inferred.opener.clone(),
                },
                inferred: Some(inferred),
                flat: false,
            },
            None => StepPlan {
                source: StepSource::None,
                inferred: None,
                flat: false,
            },
        }
    }

    /// The plan of a part of a trace (the prefix a dashboard's cursor cuts) whose steps were
    /// decided on the whole trace (`whole`, [`step_source_of`] the whole): the part numbers
    /// steps as the whole does and decides nothing of its own. A whole without steps (no loop,
    /// or marks that cover only a warm-up) leaves the part without steps, where the part alone
    /// could show a loop or marks that cover it; a whole with steps (its marks, or the inferred
    /// ones that [`record_inferred_steps`] wrote) gives the part its events' own step numbers,
    /// never a loop inferred from the part, even before the first mark.
    pub(super) fn for_part(snapshot: &Snapshot, whole: &StepSource) -> StepPlan {
        match whole {
            StepSource::PrefixMarks { .. } | StepSource::None => StepPlan {
                source: whole.clone(),
                inferred: None,
                flat: true,
            },
            StepSource::Recorded { .. } | StepSource::Inferred { .. } => StepPlan {
                source: StepSource::Recorded {
                    label: first_mark_label(snapshot),
                },
                inferred: None,
                flat: false,
            },
        }
    }

    /// The step number of event `index`.
    pub(super) fn step_of(&self, index: usize, event: &Event) -> u64 {
        match &self.inferred {
            Some(inferred) => inferred.step_of(index) as u64,
            None if self.flat => 0,
            None => u64::from(event.step),
        }
    }
}

/// The label of `snapshot`'s first step mark, empty without marks: what a recorded step
/// source names.
fn first_mark_label(snapshot: &Snapshot) -> String {
    snapshot
        .steps
        .first()
        .map(|m| m.label.clone())
        .unwrap_or_default()
}

/// Where the steps of `snapshot` come from, as a view of it says ([`super::ModelView::step_source`])
/// without building the view: what a part of the trace is then numbered by
/// ([`super::ModelView::new_part`]).
pub fn step_source_of(snapshot: &Snapshot) -> StepSource {
    StepPlan::from_snapshot(snapshot).source
}

/// Whether the step marks of `snapshot` cover only a prefix of it: `(marked steps, events up
/// to the last step's start)` when the events after the last mark outnumber three times the
/// longest complete marked step and a quarter of the trace (a warm-up, then a loop that runs
/// without Python). Marks that begin fewer than two complete steps say nothing of a step's
/// length and always count as covering.
fn prefix_marks(snapshot: &Snapshot) -> Option<(u64, u64)> {
    // The index of the first event of each step number, in event order.
    let mut starts: Vec<(u32, usize)> = Vec::new();
    for (i, e) in snapshot.events.iter().enumerate() {
        if starts.last().is_none_or(|&(step, _)| e.step > step) {
            starts.push((e.step, i));
        }
    }
    let marked: Vec<usize> = starts
        .iter()
        .filter(|(step, _)| *step > 0)
        .map(|&(_, i)| i)
        .collect();
    if marked.len() < 3 {
        return None;
    }
    let longest = marked.windows(2).map(|w| w[1] - w[0]).max()?;
    let last = *marked.last()?;
    let events = snapshot.events.len();
    let tail = events - last;
    (tail > 3 * longest.max(1) && tail * 4 > events).then_some((marked.len() as u64, last as u64))
}

/// Every step number seen in events or marks (or inferred), in order, with the label of its
/// mark.
pub(super) fn collect_steps(snapshot: &Snapshot, plan: &StepPlan) -> (Vec<u64>, Vec<StepInfo>) {
    if plan.flat {
        let steps = vec![StepInfo {
            step: 0,
            first_event: None,
            label: String::new(),
        }];
        return (vec![0], steps);
    }
    if let Some(inferred) = &plan.inferred {
        let n = inferred.starts.len() as u64;
        let numbers: Vec<u64> = (0..=n).collect();
        let steps = numbers
            .iter()
            .map(|&step| StepInfo {
                step,
                first_event: None,
                label: if step == 0 {
                    String::new()
                } else {
                    inferred.opener.clone()
                },
            })
            .collect();
        return (numbers, steps);
    }
    // Events come in runs of one step, so only a change of step is kept before sorting: a
    // copy of every event's step was 8 bytes an event at the peak of a big trace's memory.
    let mut numbers: Vec<u64> = Vec::new();
    let mut last = None;
    for e in snapshot.events.iter() {
        if last != Some(e.step) {
            last = Some(e.step);
            numbers.push(u64::from(e.step));
        }
    }
    numbers.extend(snapshot.steps.iter().map(|m| m.step));
    numbers.sort_unstable();
    numbers.dedup();
    let mut steps: Vec<StepInfo> = numbers
        .iter()
        .map(|&step| StepInfo {
            step,
            first_event: None,
            label: String::new(),
        })
        .collect();
    for mark in &snapshot.steps {
        if let Ok(i) = numbers.binary_search(&mark.step) {
            if steps[i].label.is_empty() {
                steps[i].label = mark.label.clone();
            }
        }
    }
    (numbers, steps)
}

/// Writes the steps a view infers for a trace without marks into the trace itself: each event's
/// step number, and a mark where each step begins, labelled with the line that opens it. Every
/// view of the trace, and of any prefix of it (the dashboard's time cursor cuts the trace and
/// analyses the part before the cursor), then numbers steps as the report on the whole trace
/// does, instead of inferring a loop of its own from the part it sees (a prefix that ends
/// inside one step shows the model's layers repeating). Returns the number of steps written:
/// 0 for a trace with marks of its own or without a loop.
pub fn record_inferred_steps(snapshot: &mut Snapshot) -> usize {
    use vramscope_model::StepMark;

    if !snapshot.steps.is_empty() || snapshot.events.iter().any(|e| e.step > 0) {
        return 0;
    }
    let Some(inferred) = infer_steps(snapshot) else {
        return 0;
    };
    for (i, e) in snapshot.events.iter_mut().enumerate() {
        e.step = step_after(inferred.step_of(i));
    }
    let label = format!("inferred: each step begins at {}", inferred.opener);
    let marks: Vec<StepMark> = inferred
        .starts
        .iter()
        .enumerate()
        .filter_map(|(k, &start)| {
            let e = snapshot.events.get(start as usize)?;
            Some(StepMark {
                step: k as u64 + 1,
                seq: e.seq,
                time_ns: e.time_ns,
                label: label.clone(),
            })
        })
        .collect();
    snapshot.steps = marks;
    snapshot.steps.len()
}

/// Fewest iterations a repeating sequence must show to be taken for a loop.
const MIN_INFERRED_STEPS: usize = 3;

/// Finds the loop of a trace without step marks from its allocations' stacks.
///
/// Each allocation's Python frames that are the user's own (outermost first) down to the
/// outermost module call (`nn.Module.__call__`: what runs under it is one call of the model,
/// whatever loops it holds) say which line of each function it came from. Starting at the outermost frame, the walk descends while one
/// line holds most allocations in one unbroken run (`main()` calling `train()` once); at the
/// first level where no line does, that level is the loop body: the number of runs of a line
/// there is the number of times the line ran, the most common such number (at least
/// [`MIN_INFERRED_STEPS`]) is the iteration count, and the line with that count that runs
/// first opens each iteration. Traces whose sites have no stacks use each allocation's own
/// `file:line` at a single level. Stacks with no user frame (C++ only, as on the autograd
/// thread) take no part.
fn infer_steps(snapshot: &Snapshot) -> Option<InferredSteps> {
    let framework = default_framework_paths();
    let with_frames = snapshot.sites.iter().any(|s| !s.frames.is_empty());
    // The user frames of each site, outermost first, as (file, line) keys.
    let mut site_keys: Vec<Vec<(String, u32)>> = Vec::with_capacity(snapshot.sites.len());
    for site in &snapshot.sites {
        let keys = if with_frames {
            site.frames
                .iter()
                .rev()
                .take_while(|f| !is_module_call(f))
                .filter(|f| !vramscope_import::sites::is_framework_frame(f, &framework))
                .map(|f| (f.file.clone(), f.line))
                .collect()
        } else if site.file.is_empty() || site.file == "??" {
            Vec::new()
        } else {
            vec![(site.file.clone(), site.line)]
        };
        site_keys.push(keys);
    }
    let allocs: Vec<(u32, &[(String, u32)])> = snapshot
        .events
        .iter()
        .enumerate()
        .filter(|(_, e)| e.kind == EventKind::Alloc)
        .filter_map(|(i, e)| {
            let keys = site_keys.get(e.site()? as usize)?;
            (!keys.is_empty()).then_some((i as u32, keys.as_slice()))
        })
        .collect();
    if allocs.len() < MIN_INFERRED_STEPS {
        return None;
    }
    let mut prefix: Vec<(String, u32)> = Vec::new();
    loop {
        let depth = prefix.len();
        // (key, events, runs, first event index, run starts)
        let mut stats: Vec<((String, u32), usize, Vec<u32>)> = Vec::new();
        let mut index: FxHashMap<(String, u32), usize> = FxHashMap::default();
        let mut previous: Option<usize> = None;
        let mut members = 0usize;
        for &(event, keys) in &allocs {
            if keys.len() <= depth || keys[..depth] != prefix[..] {
                continue;
            }
            members += 1;
            let key = &keys[depth];
            let k = match index.get(key) {
                Some(&k) => k,
                None => {
                    index.insert(key.clone(), stats.len());
                    stats.push((key.clone(), 0, Vec::new()));
                    stats.len() - 1
                }
            };
            stats[k].1 += 1;
            if previous != Some(k) {
                stats[k].2.push(event);
            }
            previous = Some(k);
        }
        if members < MIN_INFERRED_STEPS {
            return None;
        }
        if let Some(dominant) = stats
            .iter()
            .find(|(_, events, runs)| runs.len() <= 2 && events * 2 > members)
        {
            prefix.push(dominant.0.clone());
            continue;
        }
        // The loop level: the most common run count among lines that ran often enough.
        let mut by_count: FxHashMap<usize, usize> = FxHashMap::default();
        for (_, _, runs) in &stats {
            if runs.len() >= MIN_INFERRED_STEPS {
                *by_count.entry(runs.len()).or_default() += 1;
            }
        }
        let (&count, _) = by_count
            .iter()
            .max_by(|a, b| a.1.cmp(b.1).then(a.0.cmp(b.0)))?;
        let opener = stats
            .iter()
            .filter(|(_, _, runs)| runs.len() == count)
            .min_by_key(|(_, _, runs)| runs[0])?;
        return Some(InferredSteps {
            starts: opener.2.clone(),
            // The label every inferred step repeats: a long file name is cut.
            opener: format!(
                "{}:{}",
                vramscope_model::elide_start(&opener.0 .0, vramscope_model::LABEL_CHARS),
                opener.0 .1
            ),
        });
    }
}

/// Re-derives the steps of `snapshot` from marks whose name contains `marker`.
///
/// Step marks ([`Snapshot::steps`]) whose label contains `marker` are used first: each starts a
/// step at its sequence number. Failing those, annotations ([`Snapshot::annotations`]) whose
/// name contains `marker` and whose stage is `START` (or empty) start a step at their time.
/// Every event's `step` and the snapshot's step marks are rewritten; the function returns the
/// number of steps found, and leaves the snapshot unchanged when it finds none.
///
/// The importers (`vramscope_import::ImportOptions`) recognise steps while reading a file, by a
/// function in the allocation stacks or by an annotation family; this function re-steps a
/// snapshot that is already loaded, for example to pick one family of profiler slices.
pub fn apply_step_marker(snapshot: &mut Snapshot, marker: &str) -> usize {
    use vramscope_model::StepMark;

    let by_label: Vec<(u64, u64, String)> = snapshot
        .steps
        .iter()
        .filter(|m| m.label.contains(marker))
        .map(|m| (m.seq, m.time_ns, m.label.clone()))
        .collect();
    if !by_label.is_empty() {
        let mut marks = by_label;
        marks.sort_by_key(|m| m.0);
        for e in &mut snapshot.events {
            e.step = step_after(marks.partition_point(|m| m.0 <= e.seq));
        }
        snapshot.steps = marks
            .iter()
            .enumerate()
            .map(|(i, (seq, time_ns, label))| StepMark {
                step: i as u64 + 1,
                seq: *seq,
                time_ns: *time_ns,
                label: label.clone(),
            })
            .collect();
        return snapshot.steps.len();
    }

    let mut times: Vec<(u64, String)> = snapshot
        .annotations
        .iter()
        .filter(|a| {
            a.name.contains(marker) && (a.stage.is_empty() || a.stage.eq_ignore_ascii_case("start"))
        })
        .map(|a| (a.time_ns, a.name.clone()))
        .collect();
    if times.is_empty() {
        return 0;
    }
    times.sort();
    times.dedup_by_key(|t| t.0);
    for e in &mut snapshot.events {
        e.step = step_after(times.partition_point(|t| t.0 <= e.time_ns));
    }
    let next_seq = snapshot.events.last().map(|e| e.seq + 1).unwrap_or(0);
    let mut marks = Vec::with_capacity(times.len());
    let mut cursor = 0;
    for (i, (time_ns, label)) in times.into_iter().enumerate() {
        while cursor < snapshot.events.len() && snapshot.events[cursor].time_ns < time_ns {
            cursor += 1;
        }
        marks.push(StepMark {
            step: i as u64 + 1,
            seq: snapshot
                .events
                .get(cursor)
                .map(|e| e.seq)
                .unwrap_or(next_seq),
            time_ns,
            label,
        });
    }
    snapshot.steps = marks;
    snapshot.steps.len()
}

/// A `--step-marker` that matches nothing in the trace, with what the trace offers instead.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StepMarkerError {
    /// The marker asked for.
    pub marker: String,
    /// Names that would work: step-mark labels, annotation names, and the functions seen most
    /// often in the allocations' stacks.
    pub candidates: Vec<String>,
}

impl std::fmt::Display for StepMarkerError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "--step-marker `{}` matches nothing in the trace",
            self.marker
        )?;
        if self.candidates.is_empty() {
            write!(
                f,
                " (it has no annotations, step marks or named frames to choose from)"
            )
        } else {
            write!(f, "; candidates: {}", self.candidates.join(", "))
        }
    }
}

impl std::error::Error for StepMarkerError {}

/// Re-derives the steps of `snapshot` from `marker`: step-mark labels or annotation names that
/// contain it ([`apply_step_marker`]), else a function of that name in the allocations'
/// stacks (each allocation whose stack enters it after one whose stack did not begins a
/// step). Returns the number of steps, or the candidates when nothing matches.
pub fn restep(snapshot: &mut Snapshot, marker: &str) -> Result<usize, StepMarkerError> {
    let found = apply_step_marker(snapshot, marker);
    if found > 0 {
        return Ok(found);
    }
    // A function in the stacks.
    let has: Vec<bool> = snapshot
        .sites
        .iter()
        .map(|s| s.function == marker || s.frames.iter().any(|f| f.function == marker))
        .collect();
    let mut starts: Vec<usize> = Vec::new();
    let mut inside = false;
    for (i, e) in snapshot.events.iter().enumerate() {
        if e.kind != EventKind::Alloc {
            continue;
        }
        let now = e.site().is_some_and(|s| has.get(s as usize) == Some(&true));
        if now && !inside {
            starts.push(i);
        }
        inside = now;
    }
    if !starts.is_empty() {
        let mut marks = Vec::with_capacity(starts.len());
        for (k, &at) in starts.iter().enumerate() {
            let e = &snapshot.events[at];
            marks.push(vramscope_model::StepMark {
                step: k as u64 + 1,
                seq: e.seq,
                time_ns: e.time_ns,
                label: marker.to_string(),
            });
        }
        for (i, e) in snapshot.events.iter_mut().enumerate() {
            e.step = step_after(starts.partition_point(|&s| s <= i));
        }
        snapshot.steps = marks;
        return Ok(starts.len());
    }
    Err(StepMarkerError {
        marker: marker.to_string(),
        candidates: step_marker_candidates(snapshot),
    })
}

/// Names a `--step-marker` could take in `snapshot`: step-mark labels and annotation names
/// (up to 8 distinct), then the user's functions that appear in the most allocation stacks
/// (up to 8).
pub fn step_marker_candidates(snapshot: &Snapshot) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for name in snapshot
        .steps
        .iter()
        .map(|m| &m.label)
        .chain(snapshot.annotations.iter().map(|a| &a.name))
    {
        if !name.is_empty() && !out.contains(name) && out.len() < 8 {
            out.push(name.clone());
        }
    }
    let framework = default_framework_paths();
    let mut counts: FxHashMap<&str, u64> = FxHashMap::default();
    let mut per_site: Vec<Vec<&str>> = Vec::with_capacity(snapshot.sites.len());
    for site in &snapshot.sites {
        let mut names: Vec<&str> = site
            .frames
            .iter()
            .filter(|f| {
                !f.function.is_empty()
                    && !vramscope_import::sites::is_framework_frame(f, &framework)
            })
            .map(|f| f.function.as_str())
            .collect();
        if site.frames.is_empty() && !site.function.is_empty() {
            names.push(site.function.as_str());
        }
        names.sort_unstable();
        names.dedup();
        per_site.push(names);
    }
    for e in snapshot
        .events
        .iter()
        .filter(|e| e.kind == EventKind::Alloc)
    {
        if let Some(names) = e.site().and_then(|s| per_site.get(s as usize)) {
            for name in names {
                *counts.entry(name).or_default() += 1;
            }
        }
    }
    let mut functions: Vec<(&str, u64)> = counts.into_iter().collect();
    functions.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
    for (name, _) in functions.into_iter().take(8) {
        if !out.iter().any(|o| o == name) {
            out.push(name.to_string());
        }
    }
    out
}
