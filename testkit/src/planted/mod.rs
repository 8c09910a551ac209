//! Planted cases for the classification of memory by what it holds (issue 46): PyTorch-shaped
//! snapshots whose generator knows the true [`Category`] of every block.
//!
//! [`Recorder`] runs every request of a planted program through vramscope's caching allocator
//! (PyTorch's policy rule for rule) on a phantom device and records what an imported
//! `torch.cuda.memory._dump_snapshot()` pickle holds: block-sized events with their requested
//! sizes, segment allocations, PyTorch-shaped stacks ([`frames`]) interned as the importer
//! interns them (a free carries the stack of the free: where Python dropped the tensor, or the
//! autograd engine released a saved tensor or a node's inputs, as PyTorch records it),
//! `external_annotations` (`Optimizer.step#AdamW.step`, `Optimizer.zero_grad#AdamW.zero_grad`,
//! `START` and `END`) and steps numbered from them as the importer numbers them, and the segments
//! at the end. A late recording drops what happened before recording began, as a trace that
//! started late lacks it. With [`StackMode::Python`] only Python frames are kept, so the
//! autograd thread's allocations have no stack at all (`stacks="python"`, what `attach()`
//! records).
//!
//! A program can also be marked as the Python face's `attach()` marks it
//! ([`cases::Program::with_marks`]: `vramscope.module#…` and `vramscope.phase#…` annotations,
//! `vramscope_model::marks`), and step with torch's AdamW or with an optimizer of the user's
//! own that replaces its state every step, as the shared `cs336` trace's does
//! ([`cases::Optimizer`]).
//!
//! Each allocation is made with the category the program means it as, and [`Truth`] keeps it
//! by the allocation's event index; blocks live when recording began are
//! [`Category::BeforeTrace`], by address. [`cases`] holds the cases the issue names and
//! [`cases::programs`] random programs for property tests.

pub mod cases;
pub mod frames;

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use vramscope_caching::{CachingAllocator, SimDevice, StreamId};
use vramscope_model::marks;
use vramscope_model::{
    AllocatorConfig, Annotation, BlockState, CallSite, Category, CategoryBytes, DeviceInfo,
    EventKind, Frame, Id, SiteId, Snapshot, SnapshotSource, StepMark,
};

use frames::is_python;

/// Which frames a recording keeps, as `_record_memory_history(stacks=...)` says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StackMode {
    /// `stacks="all"`: C++ and Python frames (the shared `cs336` trace).
    All,
    /// `stacks="python"`: Python frames only; allocations on the autograd thread have none.
    Python,
}

/// Which block a truth is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum BlockKey {
    /// The block the allocation at this index of the snapshot's events made.
    Alloc(usize),
    /// The block at this address that was live when recording began.
    BeforeTrace(u64),
}

/// The true category of every block of a planted snapshot.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Truth {
    /// The category of each allocation, by its index in the snapshot's events.
    pub allocs: BTreeMap<usize, Category>,
    /// The blocks live when recording began, by address: block size, and the category the
    /// trace shows. That is [`Category::BeforeTrace`], except for the parameters where the
    /// recording shows which blocks they are (as `vramscope_analysis::categories` reads it):
    /// its backward makes gradients (at least two; every planted parameter gets one), and
    /// no other block from before it that lives through it has a parameter's requested size
    /// (AdamW's state, updated in place, or gradients no recorded `zero_grad` frees). Then
    /// each parameter that lives through the recording is [`Category::Parameters`].
    pub before_trace: BTreeMap<u64, (u64, Category)>,
    /// The allocations (event indices) whose category the trace cannot show, because the
    /// evidence lies outside the recording: a batch's copy to the device under Python-only
    /// stacks (no C++ frame shows the copy, and the user's line alone does not say it is
    /// one), and the blocks of a forward that the dump interrupts at call sites whose blocks
    /// the trace never shows freed by a backward (nothing in the trace says the backward will
    /// read them). A classifier that answers from evidence alone says `unknown` for them;
    /// [`Truth::allocs`] still says what the program meant them as.
    pub hidden: BTreeSet<usize>,
}

impl Truth {
    /// The category of the block `key`; `None` for a block the truth does not know.
    pub fn category(&self, key: BlockKey) -> Option<Category> {
        match key {
            BlockKey::Alloc(i) => self.allocs.get(&i).copied(),
            BlockKey::BeforeTrace(addr) => self.before_trace.get(&addr).map(|&(_, c)| c),
        }
    }

    /// Bytes per category when recording began.
    pub fn at_start(&self) -> CategoryBytes {
        let mut bytes = CategoryBytes::new();
        for &(size, category) in self.before_trace.values() {
            bytes.add(category, size);
        }
        bytes
    }

    /// Bytes per category after each event of `snapshot` (the snapshot this truth came with):
    /// a block counts from its allocation until its free is requested, as allocated bytes
    /// do.
    pub fn after_each(&self, snapshot: &Snapshot) -> Vec<CategoryBytes> {
        let mut bytes = self.at_start();
        let mut live: HashMap<u64, (Category, u64)> = self
            .before_trace
            .iter()
            .map(|(&addr, &(size, category))| (addr, (category, size)))
            .collect();
        let mut series = Vec::with_capacity(snapshot.events.len());
        for (i, e) in snapshot.events.iter().enumerate() {
            match e.kind {
                EventKind::Alloc => {
                    let category = self.allocs.get(&i).copied().unwrap_or(Category::Unknown);
                    bytes.add(category, e.size);
                    live.insert(e.addr, (category, e.size));
                }
                EventKind::FreeRequested => {
                    if let Some((category, size)) = live.remove(&e.addr) {
                        bytes.sub(category, size);
                    }
                }
                _ => {}
            }
            series.push(bytes);
        }
        series
    }

    /// The blocks live at the end of `snapshot` (the snapshot this truth came with): key,
    /// address, size and category, by address.
    pub fn live_at_end(&self, snapshot: &Snapshot) -> Vec<(BlockKey, u64, u64, Category)> {
        let mut live: BTreeMap<u64, (BlockKey, u64, Category)> = self
            .before_trace
            .iter()
            .map(|(&addr, &(size, category))| (addr, (BlockKey::BeforeTrace(addr), size, category)))
            .collect();
        for (i, e) in snapshot.events.iter().enumerate() {
            match e.kind {
                EventKind::Alloc => {
                    let category = self.allocs.get(&i).copied().unwrap_or(Category::Unknown);
                    live.insert(e.addr, (BlockKey::Alloc(i), e.size, category));
                }
                EventKind::FreeRequested => {
                    live.remove(&e.addr);
                }
                _ => {}
            }
        }
        live.into_iter()
            .map(|(addr, (key, size, category))| (key, addr, size, category))
            .collect()
    }
}

/// A planted case: its name, the snapshot as the PyTorch importer gives it, and the truth.
#[derive(Clone, Debug)]
pub struct Planted {
    /// What the case is (`adamw_training`).
    pub name: String,
    /// The snapshot.
    pub snapshot: Snapshot,
    /// The category of every block.
    pub truth: Truth,
}

/// The step annotations the importer numbers steps from, in the order it prefers them.
const STEP_FAMILIES: [&str; 4] = [
    "ProfilerStep#",
    "Optimizer.step#",
    "Optimizer.zero_grad#",
    "enumerate(DataLoader)#",
];

/// A planted program being recorded.
pub struct Recorder {
    alloc: CachingAllocator<SimDevice>,
    snap: Snapshot,
    mode: StackMode,
    sites: HashMap<Vec<Frame>, Option<SiteId>>,
    next_seq: u64,
    time_ns: u64,
    /// Site, category and allocation index of each live block, by address.
    live: HashMap<u64, (Option<SiteId>, Category, usize)>,
    allocs: BTreeMap<usize, Category>,
    /// The allocations whose evidence the trace lacks ([`Truth::hidden`]).
    hidden: BTreeSet<usize>,
    /// The call sites of blocks freed by a backward in the recorded part.
    freed_by_backward: HashSet<Option<SiteId>>,
    /// The index of the first recorded event, for a late recording.
    recording_from: usize,
    /// The blocks live when recording began (address, size and allocation index), for a
    /// late recording.
    before_trace: BTreeMap<u64, (u64, usize)>,
    /// Annotations recorded before recording began, dropped at the end.
    annotations_from: usize,
}

impl Recorder {
    /// A recording of a program on an 80 GiB device with PyTorch's default settings.
    pub fn new(mode: StackMode) -> Recorder {
        let config = AllocatorConfig {
            record_events: true,
            max_entries: usize::MAX,
            ..AllocatorConfig::default()
        };
        let alloc = CachingAllocator::new(SimDevice::phantom(80 << 30), config);
        let device = DeviceInfo {
            index: 0,
            name: "cuda:0".to_string(),
            backend: "cuda".to_string(),
            capacity: 0,
        };
        Recorder {
            alloc,
            snap: Snapshot::empty(SnapshotSource::Pytorch, device),
            mode,
            sites: HashMap::new(),
            next_seq: 0,
            time_ns: 0,
            live: HashMap::new(),
            allocs: BTreeMap::new(),
            hidden: BTreeSet::new(),
            freed_by_backward: HashSet::new(),
            recording_from: 0,
            before_trace: BTreeMap::new(),
            annotations_from: 0,
        }
    }

    /// The stack mode of the recording.
    pub fn mode(&self) -> StackMode {
        self.mode
    }

    /// The call site of `frames` as the importer interns it: the frames the mode keeps; none
    /// for an empty stack.
    fn site(&mut self, frames: &[Frame]) -> Option<SiteId> {
        if let Some(&id) = self.sites.get(frames) {
            return id;
        }
        let kept: Vec<Frame> = match self.mode {
            StackMode::All => frames.to_vec(),
            StackMode::Python => frames.iter().filter(|f| is_python(f)).cloned().collect(),
        };
        let id = primary_frame(&kept).map(|primary| {
            let main = &kept[primary];
            let site = CallSite {
                file: main.file.clone(),
                line: main.line,
                column: 0,
                function: main.function.clone(),
                frames: kept.clone(),
            };
            match self.snap.sites.iter().position(|s| s == &site) {
                Some(i) => i as SiteId,
                None => {
                    self.snap.sites.push(site);
                    (self.snap.sites.len() - 1) as SiteId
                }
            }
        });
        self.sites.insert(frames.to_vec(), id);
        id
    }

    /// Moves the allocator's new events into the trace under `site`; returns the index of the
    /// last allocation among them.
    fn pull(&mut self, site: Option<SiteId>, requested: Option<u64>) -> Option<usize> {
        let batch = self.alloc.events_since(self.next_seq, usize::MAX);
        self.next_seq = batch.next_seq;
        let mut last_alloc = None;
        for mut e in batch.events {
            if matches!(e.kind, EventKind::EmptyCache | EventKind::Snapshot) {
                continue;
            }
            self.time_ns += 1_000;
            e.seq = self.snap.events.len() as u64;
            e.time_ns = self.time_ns;
            e.site = Id::pack(site);
            e.tag = None;
            e.scope = None;
            e.step = 0;
            e.thread = 0;
            if e.kind == EventKind::Alloc {
                if let Some(r) = requested {
                    e.requested = r;
                }
                last_alloc = Some(self.snap.events.len());
            }
            self.snap.events.push(e);
        }
        last_alloc
    }

    /// Allocates `bytes` with the stack `frames` (innermost first) as a block of `category`;
    /// returns its address.
    pub fn alloc(&mut self, frames: &[Frame], bytes: u64, category: Category) -> u64 {
        let site = self.site(frames);
        let addr = self
            .alloc
            .alloc_ptr(bytes, StreamId(0))
            .expect("the planted device has room");
        let index = self
            .pull(site, Some(bytes))
            .expect("an allocation records its event");
        self.allocs.insert(index, category);
        self.live.insert(addr, (site, category, index));
        addr
    }

    /// Notes that the allocation that made the block at `addr` leaves no evidence of what it
    /// is in the trace ([`Truth::hidden`]).
    pub fn hide(&mut self, addr: u64) {
        if let Some(&(_, _, index)) = self.live.get(&addr) {
            self.hidden.insert(index);
        }
    }

    /// Whether the trace so far shows a block of `addr`'s call site freed by a backward.
    pub fn site_freed_by_backward(&self, addr: u64) -> bool {
        self.live
            .get(&addr)
            .is_some_and(|(site, _, _)| self.freed_by_backward.contains(site))
    }

    /// Frees the block at `addr` in a backward pass with the stack `frames`, which the trace
    /// then shows of the block's call site.
    pub fn free_in_backward(&mut self, addr: u64, frames: &[Frame]) {
        if let Some(&(site, _, _)) = self.live.get(&addr) {
            self.freed_by_backward.insert(site);
        }
        self.free(addr, frames);
    }

    /// Frees the block at `addr` with the stack `frames` (innermost first): PyTorch records a
    /// free with the stack of the free (`THPVariable_dealloc` at a Python line,
    /// `release_variables` in the backward), not of the allocation.
    pub fn free(&mut self, addr: u64, frames: &[Frame]) {
        self.live.remove(&addr).expect("a live planted block");
        let site = self.site(frames);
        self.alloc.free_ptr(addr).expect("a live block");
        self.pull(site, None);
    }

    /// The category the block at `addr` was allocated as.
    pub fn category_of(&self, addr: u64) -> Option<Category> {
        self.live.get(&addr).map(|&(_, c, _)| c)
    }

    /// An external annotation (`Optimizer.step#AdamW.step`, `START` or `END`) now.
    pub fn annotate(&mut self, name: &str, stage: &str) {
        self.time_ns += 1_000;
        self.snap.annotations.push(Annotation {
            name: name.to_string(),
            stage: stage.to_string(),
            time_ns: self.time_ns,
            device: 0,
        });
    }

    /// Begins the recording here: what happened before is left out of the trace, and the
    /// blocks live now are [`Category::BeforeTrace`].
    pub fn start_recording(&mut self) {
        self.freed_by_backward.clear();
        self.hidden.clear();
        self.recording_from = self.snap.events.len();
        self.annotations_from = self.snap.annotations.len();
        self.before_trace = self
            .live
            .iter()
            .map(|(&addr, &(_, _, index))| (addr, (self.snap.events[index].size, index)))
            .collect();
    }

    /// The blocks live when recording began, with the category the trace shows of each
    /// ([`Truth::before_trace`]).
    fn before_trace_shown(&self) -> BTreeMap<u64, (u64, Category)> {
        let category_of = |index: usize| self.allocs.get(&index).copied();
        // Those that live through the recording: requested bytes and true category.
        let lived_through: HashMap<u64, (u64, Option<Category>)> = self
            .before_trace
            .iter()
            .filter(|&(addr, &(_, index))| self.live.get(addr).is_some_and(|l| l.2 == index))
            .map(|(&addr, &(_, index))| {
                (
                    addr,
                    (self.snap.events[index].requested, category_of(index)),
                )
            })
            .collect();
        let recorded_gradients = self
            .allocs
            .range(self.recording_from..)
            .filter(|&(_, &c)| c == Category::Gradients)
            .count();
        let parameter_sizes: BTreeSet<u64> = lived_through
            .values()
            .filter(|(_, c)| *c == Some(Category::Parameters))
            .map(|&(requested, _)| requested)
            .collect();
        let shown = recorded_gradients >= 2
            && lived_through.values().all(|(requested, c)| {
                *c == Some(Category::Parameters) || !parameter_sizes.contains(requested)
            });
        self.before_trace
            .iter()
            .map(|(&addr, &(size, _))| {
                let parameter = lived_through
                    .get(&addr)
                    .is_some_and(|(_, c)| *c == Some(Category::Parameters));
                let category = if shown && parameter {
                    Category::Parameters
                } else {
                    Category::BeforeTrace
                };
                (addr, (size, category))
            })
            .collect()
    }

    /// The case named `name` as the importer gives it: the recorded part of the trace, its
    /// times counted from its first event or annotation, steps numbered from the first step
    /// annotation family present, the segments at the end with each live block's site and
    /// step, and the truth.
    pub fn finish(mut self, name: &str) -> Planted {
        let end = self.alloc.snapshot();
        let from = self.recording_from;
        let before_trace = self.before_trace_shown();
        let mut events = self.snap.events.split_off(from);
        let annotations = self.snap.annotations.split_off(self.annotations_from);
        let epoch = events
            .iter()
            .map(|e| e.time_ns)
            .chain(annotations.iter().map(|a| a.time_ns))
            .min()
            .unwrap_or(0);
        for (seq, e) in events.iter_mut().enumerate() {
            e.seq = seq as u64;
            e.time_ns -= epoch;
        }
        self.snap.events = events;
        self.snap.annotations = annotations;
        for a in &mut self.snap.annotations {
            a.time_ns -= epoch;
        }
        self.snap.steps = number_steps(&mut self.snap);
        let truth = Truth {
            allocs: self
                .allocs
                .range(from..)
                .map(|(&i, &c)| (i - from, c))
                .collect(),
            before_trace,
            hidden: self.hidden.range(from..).map(|&i| i - from).collect(),
        };
        // Each live block keeps the site and step of its allocation.
        let mut of_block: HashMap<u64, (Option<SiteId>, u64)> = HashMap::new();
        for e in self.snap.events.iter() {
            if e.kind == EventKind::Alloc {
                of_block.insert(e.addr, (e.site(), u64::from(e.step)));
            }
        }
        self.snap.segments = end.segments;
        for segment in &mut self.snap.segments {
            for block in &mut segment.blocks {
                // PyTorch keeps a block's stack in the segments only while it is allocated;
                // one allocated before the recording has none, and a free block none.
                let allocated = block.state != BlockState::Inactive;
                let (site, step) = of_block
                    .get(&block.address)
                    .copied()
                    .filter(|_| allocated)
                    .unwrap_or_default();
                block.site = site;
                block.tag = None;
                block.scope = None;
                block.step = step;
                block.thread = 0;
            }
        }
        self.snap.stats = end.stats;
        Planted {
            name: name.to_string(),
            snapshot: self.snap,
            truth,
        }
    }
}

/// The index of the frame that names a stack, as the importer picks it: the innermost frame
/// with a line outside torch, site-packages and the standard library, else the innermost;
/// `None` for an empty stack.
fn primary_frame(frames: &[Frame]) -> Option<usize> {
    if frames.is_empty() {
        return None;
    }
    let framework = |f: &Frame| {
        f.line == 0
            || f.file.contains("/torch/")
            || f.file.contains("site-packages/")
            || f.file.contains("/lib/python3")
    };
    Some(frames.iter().position(|f| !framework(f)).unwrap_or(0))
}

/// Numbers the snapshot's steps from its annotations as the importer does without a step
/// marker: the `START`s of the first family of [`STEP_FAMILIES`] present begin the steps
/// (else those named as the first `START`, `attach()`'s marks left out: they say where the
/// program is, never where a step begins), and an event belongs to the last step begun at or
/// before its time.
fn number_steps(snap: &mut Snapshot) -> Vec<StepMark> {
    let is_start = |a: &&Annotation| a.stage == "START" && !marks::is_mark(&a.name);
    let family: Option<String> = STEP_FAMILIES
        .iter()
        .find(|family| {
            snap.annotations
                .iter()
                .filter(is_start)
                .any(|a| a.name.starts_with(**family))
        })
        .map(|family| family.to_string())
        .or_else(|| {
            snap.annotations
                .iter()
                .find(is_start)
                .map(|a| a.name.clone())
        });
    let starts: Vec<&Annotation> = match &family {
        Some(family) => snap
            .annotations
            .iter()
            .filter(is_start)
            .filter(|a| a.name.starts_with(family.as_str()))
            .collect(),
        None => Vec::new(),
    };
    let times: Vec<u64> = starts.iter().map(|a| a.time_ns).collect();
    for e in snap.events.iter_mut() {
        e.step = times.partition_point(|&t| t <= e.time_ns) as u32;
    }
    let end = snap.events.len() as u64;
    starts
        .iter()
        .enumerate()
        .map(|(k, a)| StepMark {
            step: k as u64 + 1,
            seq: snap
                .events
                .iter()
                .find(|e| e.step as usize > k)
                .map_or(end, |e| e.seq),
            time_ns: a.time_ns,
            label: a.name.clone(),
        })
        .collect()
}

#[cfg(test)]
mod tests;
