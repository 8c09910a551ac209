//! What the memory is made of (issue 46): one pass over a snapshot's events puts every block
//! in exactly one [`Category`], from what the trace shows and from nothing else.
//!
//! The evidence, strongest first:
//!
//! 1. A tag or a scope that names a category (the allocator's live face:
//!    [`Category::from_tag`], [`Category::from_scope`]).
//! 2. The phase that made the block, from its stack. The backward: the autograd thread (a
//!    `*Backward` node, `AccumulateGrad`, the engine's `thread_main`; in a trace of Python
//!    stacks only, an allocation with no stack at all, which only a thread without Python
//!    makes) and `torch.autograd.backward` on the calling thread. The optimizer step: an
//!    optimizer's own code (a `torch/optim/` frame with only the optimizer's code inside it,
//!    never a module call or a closure that `optimizer.step(closure)` runs). The forward: a
//!    module call (`nn.Module.__call__`). Consecutive allocations of one phase make one *run*;
//!    allocations of no phase (the user's own lines) leave the run as it is.
//! 3. The block's lifetime against the runs, and who freed it (PyTorch records a free with
//!    the stack of the free): a block freed in the run that made it is a temporary; a block
//!    the backward released (`SavedVariable::reset_data`, `release_variables`, the engine's
//!    thread; a free with no stack in a Python-only trace) that the backward did not make is
//!    an activation, as is a forward's block freed while a backward runs; a backward's block
//!    that outlives its run is a gradient; an optimizer's block that outlives its step is
//!    optimizer state.
//! 4. Outside the phases: `Module.to`/`_apply`/`load_state_dict` make parameters (temporaries
//!    when freed in the run that made them), and `Tensor.to`/`.cuda()`/`pin_memory` copies and
//!    `torch/utils/data` make inputs.
//! 5. A forward's block still live at the dump, in a forward that no backward followed: an
//!    activation where its call site's blocks were activations (and never temporaries) in the
//!    forwards before, else unknown.
//!
//! Blocks live when the recording began are [`Category::BeforeTrace`], except where the trace
//! shows them to be the parameters (a recording that began after warm-up): the blocks from
//! before the trace that live through all of it match, one for one by requested size, the
//! gradients one backward of the trace makes, and nothing else from before the trace has
//! those sizes (see [`Categories::parameters_before_trace`]). The rest is
//! [`Category::Unknown`], never a guess. The planted cases of `vramscope_testkit::planted`,
//! whose generator knows every block, are classified exactly (`analysis/tests/categories.rs`).

use vramscope_engine::{
    autograd_node, is_compiled_frame, AddrMap, GroupId, LiveBlock, MemoryState, SiteGroups,
    NO_EVENT,
};
use vramscope_model::{
    BlockState, Category, CategoryBytes, Event, EventKind, Frame, SiteId, Snapshot,
};

use crate::model_view::{default_framework_paths, is_module_call};

/// The phase an allocation's stack says made it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    Forward,
    Backward,
    Optimizer,
    /// The user's own code, or code no phase is known for.
    Other,
}

/// What one call site's stack shows.
#[derive(Clone, Copy, Debug, Default)]
struct Traits {
    /// Made by the backward: the autograd thread, or `torch.autograd.backward`.
    autograd: bool,
    /// As a free's stack: the autograd engine released the tensor.
    released_by_backward: bool,
    /// Inside a module call.
    module: bool,
    /// The optimizer's own code.
    optimizer: bool,
    /// `Module.to`, `_apply`, `load_state_dict`.
    params: bool,
    /// A copy to the device (`Tensor.to`, `.cuda()`, `pin_memory`) or a data loader.
    copy_in: bool,
}

fn path_of(frame: &Frame) -> String {
    frame.file.replace('\\', "/")
}

impl Traits {
    fn of(frames: &[Frame], framework: &[String]) -> Traits {
        let engine_thread = |f: &Frame| {
            f.function.contains("autograd::Engine::thread_main")
                || f.function.contains("autograd::Engine::evaluate_function")
        };
        let autograd = autograd_node(frames).is_some()
            || frames.iter().any(|f| {
                let path = path_of(f);
                engine_thread(f)
                    || (path.ends_with("torch/autograd/__init__.py")
                        && matches!(f.function.as_str(), "backward" | "grad" | "_make_grads"))
                    || (path.ends_with("torch/_tensor.py") && f.function == "backward")
            });
        let released_by_backward = frames.iter().any(|f| {
            f.function.contains("SavedVariable::reset_data")
                || f.function.contains("::release_variables()")
                || engine_thread(f)
        });
        let module = frames.iter().any(is_module_call);
        let python = || frames.iter().filter(|f| !is_compiled_frame(f));
        let is_optim = |f: &Frame| path_of(f).contains("torch/optim/");
        let optimizer = !module
            && python().position(is_optim).is_some_and(|k| {
                python().take(k).all(|f| {
                    !f.function.contains("closure")
                        && !vramscope_import::sites::is_framework_frame(f, framework)
                })
            });
        let params = frames.iter().any(|f| {
            let in_module = path_of(f).ends_with("nn/modules/module.py");
            (in_module
                && matches!(
                    f.function.as_str(),
                    "_apply" | "to" | "cuda" | "convert" | "to_empty"
                ))
                || f.function == "load_state_dict"
                || f.function == "_load_from_state_dict"
        });
        let copy_in = frames.iter().any(|f| {
            let name = f.function.split('(').next().unwrap_or("");
            name.ends_with("THPVariable_to")
                || name.ends_with("THPVariable_cuda")
                || name.ends_with("THPVariable_pin_memory")
                || path_of(f).contains("torch/utils/data/")
        });
        Traits {
            autograd,
            released_by_backward,
            module,
            optimizer,
            params,
            copy_in,
        }
    }
}

/// The category of every allocation of one snapshot.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Categories {
    /// For each event, the category of the block an allocation made (`Unknown` for every
    /// other event): one byte per event.
    of_event: Vec<Category>,
    /// The addresses, in increasing order, of the blocks from before the trace that the
    /// trace shows to be parameters ([`Categories::parameters_before_trace`]).
    parameters_before_trace: Vec<u64>,
}

/// One allocation as the second pass sees it: the phase and run that made it, the run in
/// progress and its phase when its block was freed, and whether the backward released it.
#[derive(Clone, Copy, Debug)]
struct Made {
    phase: Phase,
    run: u32,
    freed: Option<(u32, Phase)>,
    released: bool,
}

/// What the first pass learns of one allocation, in eight bytes (a third of a big trace's
/// events are allocations): the run in progress when its block was freed and, in `flags`,
/// that run's phase, whether it was freed, and whether the backward released it. The
/// allocation's own phase and run are worked out again by the second pass ([`Runs`]).
#[derive(Clone, Copy, Debug, Default)]
struct Freed {
    run: u32,
    flags: u8,
}

impl Freed {
    const FREED: u8 = 1 << 2;
    const RELEASED: u8 = 1 << 3;

    fn new(run: u32, phase: Phase, released: bool) -> Freed {
        let phase = match phase {
            Phase::Forward => 0,
            Phase::Backward => 1,
            Phase::Optimizer => 2,
            Phase::Other => 3,
        };
        let released = if released { Freed::RELEASED } else { 0 };
        Freed {
            run,
            flags: Freed::FREED | released | phase,
        }
    }

    /// The run in progress and its phase when the block was freed; `None` for a block
    /// never freed.
    fn at(self) -> Option<(u32, Phase)> {
        let phase = match self.flags & 3 {
            0 => Phase::Forward,
            1 => Phase::Backward,
            2 => Phase::Optimizer,
            _ => Phase::Other,
        };
        (self.flags & Freed::FREED != 0).then_some((self.run, phase))
    }

    /// Whether the backward released the block.
    fn released(self) -> bool {
        self.flags & Freed::RELEASED != 0
    }
}

/// The runs of phases: consecutive allocations of one phase make one run, and allocations of
/// no phase ([`Phase::Other`]) leave the run as it is.
#[derive(Clone, Copy, Debug)]
struct Runs {
    run: u32,
    current: Phase,
}

impl Runs {
    fn new() -> Runs {
        Runs {
            run: 0,
            current: Phase::Other,
        }
    }

    /// Counts an allocation of `phase`; returns the run it is in.
    fn push(&mut self, phase: Phase) -> u32 {
        if phase != Phase::Other && phase != self.current {
            self.run += 1;
            self.current = phase;
        }
        self.run
    }
}

impl Categories {
    /// Classifies every allocation of `snapshot`.
    pub fn classify(snapshot: &Snapshot) -> Categories {
        let framework = default_framework_paths();
        let sites = &snapshot.sites;
        let site_traits: Vec<Traits> = sites
            .iter()
            .map(|s| Traits::of(&s.frames, &framework))
            .collect();
        let traits_of = |site: Option<SiteId>| site.and_then(|s| site_traits.get(s as usize));
        // Python stacks only: every frame of every stack has a line. Then an event with no
        // stack at all came from a thread without Python: the autograd engine's.
        let python_only =
            !sites.is_empty() && sites.iter().all(|s| s.frames.iter().all(|f| f.line > 0));
        let events = &snapshot.events;
        // The phase an allocation's stack says made it.
        let phase_of = |e: &Event| match traits_of(e.site()) {
            Some(t) if t.autograd => Phase::Backward,
            Some(t) if t.optimizer => Phase::Optimizer,
            Some(t) if t.module => Phase::Forward,
            None if python_only && e.site().is_none() => Phase::Backward,
            _ => Phase::Other,
        };
        // One entry per allocation, in event order: the second pass counts allocations to
        // find each one's.
        let mut freed: Vec<Freed> = Vec::new();
        let mut live: AddrMap<u32> = AddrMap::default();
        let mut runs = Runs::new();
        let mut last_backward_run = None;
        for e in events.iter() {
            match e.kind {
                EventKind::Alloc => {
                    let phase = phase_of(e);
                    let run = runs.push(phase);
                    if phase == Phase::Backward {
                        last_backward_run = Some(run);
                    }
                    live.insert(e.addr, freed.len() as u32);
                    freed.push(Freed::default());
                }
                // A completion ends a block only where the trace has no request for it.
                EventKind::FreeRequested | EventKind::FreeCompleted => {
                    if let Some(f) = live.remove(&e.addr).and_then(|a| freed.get_mut(a as usize)) {
                        let released = match e.site() {
                            Some(_) => traits_of(e.site()).is_some_and(|t| t.released_by_backward),
                            None => python_only,
                        };
                        *f = Freed::new(runs.run, runs.current, released);
                    }
                }
                _ => {}
            }
        }
        // The blocks the dump holds that no allocation of the trace made: live from before the
        // trace through all of it, with their requested bytes (a free of one in the trace
        // would leave it out of the dump, or pending there).
        let lived_through: AddrMap<u64> = snapshot
            .segments
            .iter()
            .flat_map(|s| &s.blocks)
            .filter(|b| b.state == BlockState::ActiveAllocated && !live.contains_key(&b.address))
            .map(|b| (b.address, b.requested_size))
            .collect();
        drop(live);
        let mut of_event = vec![Category::Unknown; events.len()];
        // Per call site: whether its blocks were activations, and temporaries.
        let mut site_was: rustc_hash::FxHashMap<SiteId, (bool, bool)> = Default::default();
        let mut live_in_last_forward = Vec::new();
        // The gradients each backward run made, by requested bytes, and whether the trace
        // made parameters itself.
        let mut gradients_by_run: rustc_hash::FxHashMap<u32, SizeCounts> = Default::default();
        let mut made_parameters = false;
        let mut allocation = freed.iter();
        let mut runs = Runs::new();
        for (i, e) in events.iter().enumerate() {
            if e.kind != EventKind::Alloc {
                continue;
            }
            let Some(&f) = allocation.next() else {
                break;
            };
            let phase = phase_of(e);
            let m = Made {
                phase,
                run: runs.push(phase),
                freed: f.at(),
                released: f.released(),
            };
            let named = snapshot
                .tag(e.tag())
                .and_then(Category::from_tag)
                .or_else(|| snapshot.scope(e.scope()).and_then(Category::from_scope));
            let t = traits_of(e.site()).copied().unwrap_or_default();
            let same_run = m.freed.is_some_and(|(r, _)| r == m.run);
            let category = match m.phase {
                _ if named.is_some() => named.unwrap_or(Category::Unknown),
                // Released by the backward: what a forward (or a loss outside the model)
                // saved for it.
                phase if m.released && phase != Phase::Backward => Category::Activations,
                Phase::Backward if same_run => Category::Temporaries,
                Phase::Backward => Category::Gradients,
                Phase::Optimizer if same_run => Category::Temporaries,
                Phase::Optimizer => Category::OptimizerState,
                Phase::Forward if same_run => Category::Temporaries,
                Phase::Forward => match m.freed {
                    Some((_, Phase::Backward)) => Category::Activations,
                    Some(_) => Category::Unknown,
                    None => {
                        if last_backward_run.is_none_or(|b| b < m.run) {
                            live_in_last_forward.push(i);
                        }
                        Category::Unknown
                    }
                },
                Phase::Other if t.params && same_run => Category::Temporaries,
                Phase::Other if t.params => Category::Parameters,
                Phase::Other if t.copy_in => Category::Inputs,
                Phase::Other => Category::Unknown,
            };
            match category {
                Category::Gradients if m.phase == Phase::Backward => {
                    *gradients_by_run
                        .entry(m.run)
                        .or_default()
                        .entry(e.requested)
                        .or_default() += 1;
                }
                Category::Parameters => made_parameters = true,
                _ => {}
            }
            if let Some(s) = e.site() {
                let was = site_was.entry(s).or_default();
                was.0 |= category == Category::Activations;
                was.1 |= category == Category::Temporaries;
            }
            of_event[i] = category;
        }
        // A forward's block live at the dump is an activation where its call site's blocks
        // were activations (and never temporaries) in the forwards a backward completed.
        for i in live_in_last_forward {
            let was = events[i].site().and_then(|s| site_was.get(&s)).copied();
            if was == Some((true, false)) {
                of_event[i] = Category::Activations;
            }
        }
        let parameters_before_trace = if made_parameters {
            Vec::new()
        } else {
            parameters_from_gradients(&lived_through, &gradients_by_run)
        };
        Categories {
            of_event,
            parameters_before_trace,
        }
    }

    /// The addresses, in increasing order, of the blocks from before the trace that the trace
    /// shows to be parameters: a recording that began after warm-up, whose model was loaded
    /// before it. The evidence, all of which must hold:
    ///
    /// - the trace makes no parameters itself (else a block from before could be another
    ///   model of the same shapes: a teacher, a reference model, an EMA copy);
    /// - a backward run of the trace makes gradients, at least two, and every other run makes
    ///   a part of the same (the first micro-batch of gradient accumulation makes them, the
    ///   others add in place);
    /// - for every requested size among those gradients, the blocks from before the trace
    ///   that live through all of it (no event touches their address) have exactly as many
    ///   of that size as the gradients: one parameter per gradient. Optimizer state updated
    ///   in place (`torch.optim.AdamW`'s two tensors per parameter, SGD's momentum), or an
    ///   EMA copy of the weights, doubles or triples those counts, and the rule abstains.
    ///
    /// Those blocks, and only they, are [`Category::Parameters`]; blocks of other sizes stay
    /// [`Category::BeforeTrace`]. Empty where any part of the evidence is missing.
    pub fn parameters_before_trace(&self) -> &[u64] {
        &self.parameters_before_trace
    }

    /// The category of the block the allocation at event `event` made; `Unknown` for an
    /// event that is not an allocation.
    pub fn of_alloc(&self, event: usize) -> Category {
        self.of_event
            .get(event)
            .copied()
            .unwrap_or(Category::Unknown)
    }

    /// Bytes per category of `start`'s allocated bytes (the state before the first event):
    /// all of them from before the trace, its blocks ([`Categories::of_block_before_trace`])
    /// and the bytes no block describes.
    pub fn at_start(&self, start: &MemoryState) -> CategoryBytes {
        let mut bytes = CategoryBytes::new();
        for (&addr, block) in start.blocks.unordered() {
            if !block.pending {
                bytes.add(self.of_block_before_trace(addr), block.size);
            }
        }
        bytes.add(Category::BeforeTrace, start.unattributed.allocated);
        bytes
    }

    /// Bytes per category of the engine's `state` (its allocated blocks, each by the category
    /// of the allocation that made it, and the bytes from before the trace that no block
    /// describes): they add up to `state.allocated`, the figure a report prints.
    pub fn in_state(&self, state: &MemoryState) -> CategoryBytes {
        let mut bytes = CategoryBytes::new();
        for (&addr, block) in state.blocks.unordered() {
            if block.pending {
                continue;
            }
            bytes.add(self.of_block(addr, block), block.size);
        }
        bytes.add(Category::BeforeTrace, state.unattributed.allocated);
        bytes
    }

    /// The category of `block`, the block at `addr` of an engine state: its allocation's, or
    /// for a block from before the trace [`Categories::of_block_before_trace`].
    pub fn of_block(&self, addr: u64, block: &LiveBlock) -> Category {
        if block.alloc_event == NO_EVENT {
            self.of_block_before_trace(addr)
        } else {
            self.of_alloc(block.alloc_event as usize)
        }
    }

    /// The category of the block from before the trace at `addr`: [`Category::Parameters`]
    /// where the trace shows it is one ([`Categories::parameters_before_trace`]), else
    /// [`Category::BeforeTrace`].
    pub fn of_block_before_trace(&self, addr: u64) -> Category {
        if self.parameters_before_trace.binary_search(&addr).is_ok() {
            Category::Parameters
        } else {
            Category::BeforeTrace
        }
    }

    /// [`Categories::in_state`] per call-site group of `groups` (the groups of
    /// `ModelView::holdings_in`, the unattributed bytes under `SiteGroups::BEFORE_TRACE`).
    pub fn by_group_in_state(
        &self,
        state: &MemoryState,
        groups: &SiteGroups,
    ) -> rustc_hash::FxHashMap<GroupId, CategoryBytes> {
        let mut by: rustc_hash::FxHashMap<GroupId, CategoryBytes> = Default::default();
        for (&addr, block) in state.blocks.unordered() {
            if !block.pending {
                by.entry(groups.of_block(block))
                    .or_default()
                    .add(self.of_block(addr, block), block.size);
            }
        }
        if state.unattributed.allocated > 0 {
            by.entry(SiteGroups::BEFORE_TRACE)
                .or_default()
                .add(Category::BeforeTrace, state.unattributed.allocated);
        }
        by
    }

    /// The bytes per category just after each event of `events` (indices in increasing
    /// order), from one walk that stops after the last of them (see [`Categories::walk`]).
    pub fn after_events(
        &self,
        snapshot: &Snapshot,
        start: &MemoryState,
        events: &[u32],
    ) -> Vec<CategoryBytes> {
        let mut out = Vec::with_capacity(events.len());
        let Some(&last) = events.last() else {
            return out;
        };
        let end = (last as usize + 1).min(snapshot.events.len());
        let mut wanted = events.iter().peekable();
        self.walk_to(snapshot, start, end, |i, bytes| {
            while wanted.next_if(|&&e| e as usize <= i).is_some() {
                out.push(*bytes);
            }
        });
        // Indices past the last event read the end.
        let fill = out.last().copied().unwrap_or_else(|| self.at_start(start));
        out.resize(events.len(), fill);
        out
    }

    /// Walks `snapshot`'s events from `start` (the engine's state before the first event) and
    /// hands `visit` the bytes per category after each event, with its index: a block counts
    /// from its allocation until its free is requested, as allocated bytes do.
    pub fn walk(
        &self,
        snapshot: &Snapshot,
        start: &MemoryState,
        visit: impl FnMut(usize, &CategoryBytes),
    ) {
        self.walk_to(snapshot, start, snapshot.events.len(), visit);
    }

    /// [`Categories::walk`] over the first `end` events.
    fn walk_to(
        &self,
        snapshot: &Snapshot,
        start: &MemoryState,
        end: usize,
        mut visit: impl FnMut(usize, &CategoryBytes),
    ) {
        let mut bytes = self.at_start(start);
        let mut live: AddrMap<(Category, u64)> = AddrMap::default();
        for (&addr, block) in start.blocks.unordered() {
            if !block.pending {
                live.insert(addr, (self.of_block_before_trace(addr), block.size));
            }
        }
        for (i, e) in snapshot.events[..end].iter().enumerate() {
            match e.kind {
                EventKind::Alloc => {
                    let category = self.of_alloc(i);
                    if let Some((old, size)) = live.insert(e.addr, (category, e.size)) {
                        bytes.sub(old, size);
                    }
                    bytes.add(category, e.size);
                }
                EventKind::FreeRequested | EventKind::FreeCompleted => {
                    if let Some((category, size)) = live.remove(&e.addr) {
                        bytes.sub(category, size);
                    }
                }
                _ => {}
            }
            visit(i, &bytes);
        }
    }
}

/// How many blocks there are of each requested size.
type SizeCounts = std::collections::BTreeMap<u64, u32>;

/// [`Categories::parameters_before_trace`] from the blocks that live through the trace
/// (address to requested bytes) and the gradients of each backward run: the addresses, in
/// increasing order, or none where the evidence does not hold.
fn parameters_from_gradients(
    lived_through: &AddrMap<u64>,
    gradients_by_run: &rustc_hash::FxHashMap<u32, SizeCounts>,
) -> Vec<u64> {
    let total = |counts: &SizeCounts| counts.values().map(|&n| u64::from(n)).sum::<u64>();
    // The run that made the most; the earliest of equals.
    let Some((_, one_backward)) = gradients_by_run
        .iter()
        .max_by_key(|&(&run, counts)| (total(counts), std::cmp::Reverse(run)))
    else {
        return Vec::new();
    };
    if total(one_backward) < 2 {
        return Vec::new();
    }
    let within = |counts: &SizeCounts| {
        counts
            .iter()
            .all(|(size, &n)| one_backward.get(size).is_some_and(|&m| n <= m))
    };
    if !gradients_by_run.values().all(within) {
        return Vec::new();
    }
    let mut before = SizeCounts::new();
    for &requested in lived_through.values() {
        if one_backward.contains_key(&requested) {
            *before.entry(requested).or_default() += 1;
        }
    }
    if &before != one_backward {
        return Vec::new();
    }
    let mut parameters: Vec<u64> = lived_through
        .iter()
        .filter(|&(_, requested)| one_backward.contains_key(requested))
        .map(|(&addr, _)| addr)
        .collect();
    parameters.sort_unstable();
    parameters
}
