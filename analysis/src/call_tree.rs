//! The model's own tree (issue 46): the bytes live at one moment of a trace, by the user's call
//! tree (the driver's lines, then each module's `forward`, then the lines inside it), so that
//! a reader sees which layer holds the activations.
//!
//! Each live block's stack is read outermost frame first. The user's frames (not PyTorch's,
//! not `site-packages`, not C++: [`vramscope_import::sites::is_framework_frame`]) become the
//! tree's lines; the framework's frames between them are folded into the user's line that
//! called them. Where `attach()` marked the module calls (`vramscope_model::marks`: an
//! annotation around each call), the modules open at the block's allocation are matched one to
//! one with the stack's `nn.Module.__call__` frames, and each module call becomes a node named
//! by its place in the model (`GPT.h.3.attn`), framework modules (an `nn.Linear`) included;
//! where the count differs, only the allocation's own metadata (`module=...`) names the
//! innermost call. A stack with no user frame is named by its autograd node (`backward:
//! MmBackward0`) or said to have none.
//!
//! A node's bytes and blocks include its subtree's; its children are sorted by bytes, then
//! blocks, then name (a total order), and the tree is bounded: [`CallTree::at`] keeps at most
//! `max_nodes` nodes, the largest first, and sums each kept node's other children into one
//! "other" child. Every node also splits its bytes by [`Category`], so the root holds the
//! categories at that moment and the dashboard's bar reads them from it.
//!
//! The tree is made from the blocks summed by what decides their path ([`TreeSums`]: the
//! site, the allocation's own module mark, the modules open when it was made, keyed with
//! [`TreeKeys`]), never from the blocks themselves: the dashboard keeps those sums beside the
//! state at its cursor and changes them by the blocks a move changes, so a move costs what
//! changed, not every live block ([`CallTree::of_sums`]; [`CallTree::at`] sums a state whole).

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use rustc_hash::FxHashMap;
use serde::Serialize;
use vramscope_engine::{autograd_node, is_compiled_frame, LiveBlock, MemoryState};
use vramscope_model::marks::{module_of_annotation, LiveMark};
use vramscope_model::{CallSite, Category, CategoryBytes, Event, Frame, Snapshot};

use crate::categories::Categories;
use crate::model_view::{default_framework_paths, is_module_call};

/// How many nodes a tree keeps unless told otherwise.
pub const DEFAULT_MAX_NODES: usize = 200;

/// What a node of the tree stands for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum NodeKind {
    /// Everything live.
    Root,
    /// A line of the user's code (in a driver or in a module's `forward`).
    Line,
    /// A module call, named by `attach()`'s marks.
    Module,
    /// A stack with no user frame, made by an autograd node.
    Autograd,
    /// A stack with no user frame and no autograd node.
    Framework,
    /// A block with no stack.
    NoStack,
    /// The children a bounded tree left out, summed.
    Other,
}

/// One node of a [`CallTree`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct CallNode {
    /// What the node stands for.
    pub kind: NodeKind,
    /// The short name shown in a tree (`model.py:31 forward`, `GPT.h.3.attn`).
    pub label: String,
    /// The full name (`/home/u/model.py:31 in forward`).
    pub detail: String,
    /// Depth: 0 for the root.
    pub depth: u32,
    /// The parent's index; `None` for the root.
    pub parent: Option<u32>,
    /// The children's indices, largest first ("other" last).
    pub children: Vec<u32>,
    /// Live bytes (block sizes) in this node's subtree.
    pub bytes: u64,
    /// Live blocks in this node's subtree.
    pub blocks: u64,
    /// `bytes` by category.
    #[serde(skip)]
    pub categories: CategoryBytes,
}

impl CallNode {
    /// The bytes of blocks whose path ends at this node (not in a child).
    pub fn self_bytes(&self, tree: &CallTree) -> u64 {
        let children: u64 = self
            .children
            .iter()
            .map(|&c| tree.nodes[c as usize].bytes)
            .sum();
        self.bytes - children
    }

    /// The category holding most of this node's bytes (the first in chart order on a tie),
    /// `None` for a node of no bytes.
    pub fn main_category(&self) -> Option<Category> {
        let mut best: Option<(Category, u64)> = None;
        for (category, bytes) in self.categories.nonzero() {
            if best.is_none_or(|(_, b)| bytes > b) {
                best = Some((category, bytes));
            }
        }
        best.map(|(c, _)| c)
    }
}

/// The live bytes of one moment by the user's call tree: nodes in pre-order (the root first,
/// each subtree contiguous), bounded in number.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct CallTree {
    /// The nodes, the root at index 0, in pre-order of the sorted tree.
    pub nodes: Vec<CallNode>,
}

/// One step of a site's path: a user line, or the `k`-th module call (outermost first).
#[derive(Clone, Copy, Debug)]
enum Part {
    Line(u32),
    ModuleCall(u32),
}

/// What a call site's stack gives every block made there.
#[derive(Clone, Debug, Default)]
struct SitePath {
    parts: Vec<Part>,
    /// Module calls in the whole stack.
    module_calls: u32,
    /// The node for a stack without user frames.
    fallback: Option<u32>,
}

/// Node keys, interned: (kind, full text) and the short label.
#[derive(Default)]
struct Keys {
    ids: FxHashMap<(NodeKind, String), u32>,
    keys: Vec<(NodeKind, String, String)>,
}

impl Keys {
    fn intern(&mut self, kind: NodeKind, full: String, label: impl FnOnce() -> String) -> u32 {
        if let Some(&id) = self.ids.get(&(kind, full.clone())) {
            return id;
        }
        let id = self.keys.len() as u32;
        self.keys.push((kind, full.clone(), label()));
        self.ids.insert((kind, full), id);
        id
    }
}

fn file_name(path: &str) -> &str {
    path.rsplit(['/', '\\']).next().unwrap_or(path)
}

impl SitePath {
    /// The path of a call site: of its stack where it has one, else of its primary location
    /// alone (a recording of vramscope's own allocator names the line that allocated, without
    /// a stack, and that line is the user's unless the same rules as a stack's frames say it
    /// is compiled code or the framework's).
    fn of_site(site: &CallSite, framework: &[String], keys: &mut Keys) -> SitePath {
        if !site.frames.is_empty() {
            return SitePath::of(&site.frames, framework, keys);
        }
        // An unknown location (`??`, line 0) is a native frame, which the rules skip.
        let primary = Frame {
            file: site.file.clone(),
            line: site.line,
            function: site.function.clone(),
        };
        SitePath::of(std::slice::from_ref(&primary), framework, keys)
    }

    /// The path of a stack (innermost frame first).
    fn of(frames: &[Frame], framework: &[String], keys: &mut Keys) -> SitePath {
        let mut path = SitePath::default();
        let mut in_call = false;
        for f in frames.iter().rev() {
            if is_module_call(f) {
                if !in_call {
                    path.parts.push(Part::ModuleCall(path.module_calls));
                    path.module_calls += 1;
                    in_call = true;
                }
                continue;
            }
            if is_compiled_frame(f) {
                continue;
            }
            in_call = false;
            if vramscope_import::sites::is_framework_frame(f, framework) {
                continue;
            }
            let full = format!("{}:{} in {}", f.file, f.line, f.function);
            let id = keys.intern(NodeKind::Line, full, || {
                let at = format!("{}:{}", file_name(&f.file), f.line);
                if f.function.is_empty() {
                    at
                } else {
                    format!("{at} {}", f.function)
                }
            });
            path.parts.push(Part::Line(id));
        }
        if !path.parts.iter().any(|p| matches!(p, Part::Line(_))) {
            path.fallback = Some(match autograd_node(frames) {
                Some(node) => {
                    let label = format!("backward: {node}");
                    keys.intern(NodeKind::Autograd, label.clone(), || label)
                }
                None => {
                    let label = "(no line of the user's)".to_string();
                    keys.intern(NodeKind::Framework, label.clone(), || label)
                }
            });
        }
        path
    }
}

/// What decides a block's path: its site (within the table), its tag (where it names a
/// module) and the modules open when it was made (an id of [`ModuleMarks`]' open lists).
type GroupKey = (Option<u32>, Option<u32>, u32);

/// Bytes, blocks and bytes by category of a group of blocks: exact under additions and
/// removals in any order (in 128 bits; a tree saturates them at 2^64 - 1, as a sum of a
/// file's sizes does).
#[derive(Clone, Debug, PartialEq, Eq)]
struct Sum {
    bytes: u128,
    blocks: u64,
    categories: [u128; Category::COUNT],
}

impl Default for Sum {
    fn default() -> Sum {
        Sum {
            bytes: 0,
            blocks: 0,
            categories: [0; Category::COUNT],
        }
    }
}

/// A sum past 2^64 - 1 at that figure.
fn saturated(v: u128) -> u64 {
    u64::try_from(v).unwrap_or(u64::MAX)
}

/// What a snapshot says about every block's place in a [`CallTree`], worked out once: the
/// module calls open at any time (from `attach()`'s marks), the tags that name a module and
/// the number of call sites. A block's group is a function of the block and these alone
/// ([`TreeSums`]); the keys describe the tables of the snapshot they were made from.
#[derive(Clone, Debug)]
pub struct TreeKeys {
    marks: ModuleMarks,
    /// Whether each tag names a module (`module=...`).
    module_tags: Vec<bool>,
    sites: usize,
}

impl TreeKeys {
    /// The keys of `snapshot`: a pass over its annotations and tags.
    pub fn new(snapshot: &Snapshot) -> TreeKeys {
        TreeKeys {
            marks: ModuleMarks::of(snapshot),
            module_tags: snapshot
                .tags
                .iter()
                .map(|t| LiveMark::parse(t).is_some_and(|m| m.module.is_some()))
                .collect(),
            sites: snapshot.sites.len(),
        }
    }

    /// The group and category of `block`, the block at `addr` (`events` are the trace's,
    /// for the time of its allocation).
    fn key_of(
        &self,
        categories: Option<&Categories>,
        events: &[Event],
        addr: u64,
        block: &LiveBlock,
    ) -> (GroupKey, Category) {
        let category = match categories {
            Some(c) => c.of_block(addr, block),
            None if block.predates_trace() => Category::BeforeTrace,
            None => Category::Unknown,
        };
        let open = if !self.marks.is_empty() && !block.predates_trace() {
            events
                .get(block.alloc_event as usize)
                .map_or(0, |e| self.marks.open_at(e.time_ns))
        } else {
            0
        };
        let site = block.site.filter(|&s| (s as usize) < self.sites);
        let own = block
            .tag
            .filter(|&t| self.module_tags.get(t as usize).copied().unwrap_or(false));
        ((site, own, open), category)
    }
}

/// The allocated blocks of a state summed by what decides their place in a [`CallTree`] (the
/// site, the allocation's own module mark, the modules open when it was made), kept up to
/// date block by block: a state that moves a few events at a time (the dashboard's cursor)
/// changes them by the blocks it changes, and [`CallTree::of_sums`] makes the tree from them
/// alone. Pending frees count nothing.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TreeSums {
    groups: FxHashMap<GroupKey, Sum>,
}

impl TreeSums {
    /// The sums of every allocated block of `state`, a state of the trace of `events`, with
    /// `keys` of its snapshot and categories from `categories` (see [`CallTree::at`]).
    pub fn of_state(
        keys: &TreeKeys,
        categories: Option<&Categories>,
        events: &[Event],
        state: &MemoryState,
    ) -> TreeSums {
        let mut sums = TreeSums::default();
        for (&addr, block) in state.blocks.unordered() {
            sums.add(keys, categories, events, addr, block);
        }
        sums
    }

    /// Adds `block`, at `addr` (nothing when it is pending).
    pub fn add(
        &mut self,
        keys: &TreeKeys,
        categories: Option<&Categories>,
        events: &[Event],
        addr: u64,
        block: &LiveBlock,
    ) {
        if block.pending {
            return;
        }
        let (key, category) = keys.key_of(categories, events, addr, block);
        let sum = self.groups.entry(key).or_default();
        sum.bytes += u128::from(block.size);
        sum.blocks += 1;
        sum.categories[category.index()] += u128::from(block.size);
    }

    /// Takes out `block`, at `addr`, added before with the same keys and categories
    /// (nothing when it is pending).
    pub fn remove(
        &mut self,
        keys: &TreeKeys,
        categories: Option<&Categories>,
        events: &[Event],
        addr: u64,
        block: &LiveBlock,
    ) {
        if block.pending {
            return;
        }
        let (key, category) = keys.key_of(categories, events, addr, block);
        let Some(sum) = self.groups.get_mut(&key) else {
            debug_assert!(false, "a block taken out that was never added");
            return;
        };
        sum.bytes -= u128::from(block.size);
        sum.blocks -= 1;
        sum.categories[category.index()] -= u128::from(block.size);
        if sum.blocks == 0 {
            self.groups.remove(&key);
        }
    }
}

/// A node while the tree grows.
struct Growing {
    key: u32,
    parent: u32,
    children: Vec<u32>,
    bytes: u64,
    blocks: u64,
    categories: CategoryBytes,
}

impl CallTree {
    /// The tree of the blocks allocated in `state` (a state of `snapshot`'s walk; blocks
    /// waiting for their free to complete are not allocated and left out), their categories
    /// from `categories` (when `None`, blocks from before the trace are `before_trace` and
    /// the rest `unknown`), with at most `max_nodes` nodes (at least 2: the root and one "other").
    pub fn at(
        snapshot: &Snapshot,
        state: &MemoryState,
        categories: Option<&Categories>,
        max_nodes: usize,
    ) -> CallTree {
        let keys = TreeKeys::new(snapshot);
        let sums = TreeSums::of_state(&keys, categories, &snapshot.events, state);
        CallTree::of_sums(snapshot, &keys, &sums, max_nodes)
    }

    /// The tree of the blocks `sums` holds, summed with `keys` of `snapshot`: what
    /// [`CallTree::at`] gives for the state they are the sums of.
    pub fn of_sums(
        snapshot: &Snapshot,
        tree_keys: &TreeKeys,
        sums: &TreeSums,
        max_nodes: usize,
    ) -> CallTree {
        let framework = default_framework_paths();
        let marks = &tree_keys.marks;
        let mut keys = Keys::default();
        let no_stack = keys.intern(NodeKind::NoStack, "(no stack)".into(), || {
            "(no stack)".into()
        });
        let mut site_paths: Vec<Option<SitePath>> = vec![None; snapshot.sites.len()];
        let mut nodes = vec![Growing {
            key: u32::MAX,
            parent: u32::MAX,
            children: Vec::new(),
            bytes: 0,
            blocks: 0,
            categories: CategoryBytes::new(),
        }];
        let mut child_of: FxHashMap<(u32, u32), u32> = FxHashMap::default();
        let mut path: Vec<u32> = Vec::new();
        for (&(site, own, open), sum) in &sums.groups {
            let open = marks.open(open);
            path.clear();
            match site.filter(|&s| (s as usize) < snapshot.sites.len()) {
                None => path.push(no_stack),
                Some(s) => {
                    let site = site_paths[s as usize].get_or_insert_with(|| {
                        SitePath::of_site(&snapshot.sites[s as usize], &framework, &mut keys)
                    });
                    let by_marks = !open.is_empty() && open.len() == site.module_calls as usize;
                    let own = snapshot
                        .tag(own)
                        .and_then(LiveMark::parse)
                        .and_then(|m| m.module);
                    for part in &site.parts {
                        match *part {
                            Part::Line(id) => path.push(id),
                            Part::ModuleCall(k) => {
                                let name = if by_marks {
                                    Some(marks.name(open[k as usize]))
                                } else if k + 1 == site.module_calls {
                                    own
                                } else {
                                    None
                                };
                                if let Some(name) = name {
                                    path.push(keys.intern(
                                        NodeKind::Module,
                                        name.to_string(),
                                        || name.to_string(),
                                    ));
                                }
                            }
                        }
                    }
                    if let Some(fallback) = site.fallback {
                        if path.is_empty() {
                            path.push(fallback);
                        }
                    }
                }
            }
            let (bytes, blocks) = (saturated(sum.bytes), sum.blocks);
            let mut at = 0u32;
            for &key in std::iter::once(&u32::MAX).chain(path.iter()) {
                if key != u32::MAX {
                    at = *child_of.entry((at, key)).or_insert_with(|| {
                        let id = nodes.len() as u32;
                        nodes.push(Growing {
                            key,
                            parent: at,
                            children: Vec::new(),
                            bytes: 0,
                            blocks: 0,
                            categories: CategoryBytes::new(),
                        });
                        nodes[at as usize].children.push(id);
                        id
                    });
                }
                let node = &mut nodes[at as usize];
                node.bytes = node.bytes.saturating_add(bytes);
                node.blocks = node.blocks.saturating_add(blocks);
                for (category, &b) in Category::ALL.iter().zip(&sum.categories) {
                    if b > 0 {
                        node.categories.add(*category, saturated(b));
                    }
                }
            }
        }
        CallTree::bounded(nodes, &keys, max_nodes.max(2))
    }

    /// The sorted, bounded tree in pre-order.
    fn bounded(mut nodes: Vec<Growing>, keys: &Keys, max_nodes: usize) -> CallTree {
        let key_of = |n: &Growing| keys.keys.get(n.key as usize);
        // Siblings have distinct keys, so (bytes, blocks, label, key) orders them totally.
        let order: Vec<(u64, u64, String, NodeKind, String)> = nodes
            .iter()
            .map(|n| {
                let (kind, full, label) =
                    key_of(n)
                        .cloned()
                        .unwrap_or((NodeKind::Root, String::new(), String::new()));
                (n.bytes, n.blocks, label, kind, full)
            })
            .collect();
        for n in nodes.iter_mut() {
            n.children.sort_by(|&a, &b| {
                let (a, b) = (&order[a as usize], &order[b as usize]);
                b.0.cmp(&a.0)
                    .then(b.1.cmp(&a.1))
                    .then_with(|| a.2.cmp(&b.2))
                    .then(a.3.cmp(&b.3))
                    .then_with(|| a.4.cmp(&b.4))
            });
        }
        // The rank of every node in pre-order of the whole sorted tree: the tie-break that
        // makes the choice of nodes deterministic.
        let mut rank = vec![0u32; nodes.len()];
        let mut stack = vec![0u32];
        let mut next = 0u32;
        while let Some(n) = stack.pop() {
            rank[n as usize] = next;
            next += 1;
            stack.extend(nodes[n as usize].children.iter().rev());
        }
        // Keep the largest nodes whose parents are kept while the kept nodes and one "other"
        // per node with left-out children fit.
        let mut kept = vec![false; nodes.len()];
        let mut left_out = vec![0usize; nodes.len()];
        kept[0] = true;
        left_out[0] = nodes[0].children.len();
        let mut count = 1usize;
        let mut others = usize::from(left_out[0] > 0);
        let mut heap: BinaryHeap<(u64, Reverse<u32>, u32)> = nodes[0]
            .children
            .iter()
            .map(|&c| (nodes[c as usize].bytes, Reverse(rank[c as usize]), c))
            .collect();
        while let Some((_, _, c)) = heap.pop() {
            let node = &nodes[c as usize];
            let parent = node.parent as usize;
            let others_after = others - usize::from(left_out[parent] == 1)
                + usize::from(!node.children.is_empty());
            if count + 1 + others_after > max_nodes {
                break;
            }
            kept[c as usize] = true;
            count += 1;
            left_out[parent] -= 1;
            left_out[c as usize] = node.children.len();
            others = others_after;
            heap.extend(
                node.children
                    .iter()
                    .map(|&g| (nodes[g as usize].bytes, Reverse(rank[g as usize]), g)),
            );
        }
        let mut out = CallTree::default();
        CallTree::emit(&nodes, keys, &kept, 0, None, 0, &mut out);
        out
    }

    fn emit(
        nodes: &[Growing],
        keys: &Keys,
        kept: &[bool],
        n: u32,
        parent: Option<u32>,
        depth: u32,
        out: &mut CallTree,
    ) {
        let node = &nodes[n as usize];
        let (kind, detail, label) = keys.keys.get(node.key as usize).cloned().unwrap_or((
            NodeKind::Root,
            "all allocated memory".into(),
            "all".into(),
        ));
        let id = out.nodes.len() as u32;
        out.nodes.push(CallNode {
            kind,
            label,
            detail,
            depth,
            parent,
            children: Vec::new(),
            bytes: node.bytes,
            blocks: node.blocks,
            categories: node.categories,
        });
        let mut other = (0usize, 0u64, 0u64, CategoryBytes::new());
        for &c in &node.children {
            if kept[c as usize] {
                let child = out.nodes.len() as u32;
                out.nodes[id as usize].children.push(child);
                CallTree::emit(nodes, keys, kept, c, Some(id), depth + 1, out);
            } else {
                let g = &nodes[c as usize];
                other.0 += 1;
                other.1 = other.1.saturating_add(g.bytes);
                other.2 = other.2.saturating_add(g.blocks);
                for (category, bytes) in g.categories.nonzero() {
                    other.3.add(category, bytes);
                }
            }
        }
        if other.0 > 0 {
            let child = out.nodes.len() as u32;
            out.nodes[id as usize].children.push(child);
            let label = format!(
                "other ({} place{})",
                other.0,
                if other.0 == 1 { "" } else { "s" }
            );
            out.nodes.push(CallNode {
                kind: NodeKind::Other,
                detail: label.clone(),
                label,
                depth: depth + 1,
                parent: Some(id),
                children: Vec::new(),
                bytes: other.1,
                blocks: other.2,
                categories: other.3,
            });
        }
    }

    /// The root: every allocated block. `None` only for a tree made by `Default`.
    pub fn root(&self) -> Option<&CallNode> {
        self.nodes.first()
    }

    /// The bytes per category of every allocated block (the root's).
    pub fn categories(&self) -> CategoryBytes {
        self.root().map(|r| r.categories).unwrap_or_default()
    }

    /// The node's names from the root's child down to `node`, joined by " > ".
    pub fn path_of(&self, node: usize) -> String {
        let mut names = Vec::new();
        let mut at = Some(node as u32);
        while let Some(n) = at {
            let node = &self.nodes[n as usize];
            if node.kind != NodeKind::Root {
                names.push(node.label.as_str());
            }
            at = node.parent;
        }
        names.reverse();
        names.join(" > ")
    }
}

/// `attach()`'s module marks: which module calls are open at any time. The marks are gone
/// through once, in time order; the module calls open after each prefix of them are kept
/// (each distinct list once), so the list open at a time is a search away.
#[derive(Clone, Debug, Default)]
struct ModuleMarks {
    /// The marks' times, in order.
    times: Vec<u64>,
    /// For each prefix of the marks (none, the first, the first two, ...), the id of the
    /// list of module calls open after it.
    after: Vec<u32>,
    /// The lists of open module calls (outermost first), by id; the first is empty.
    lists: Vec<Vec<u32>>,
    names: Vec<String>,
}

impl ModuleMarks {
    fn of(snapshot: &Snapshot) -> ModuleMarks {
        let mut ids: FxHashMap<&str, u32> = FxHashMap::default();
        let mut names = Vec::new();
        let mut marks = Vec::new();
        for a in &snapshot.annotations {
            let Some(module) = module_of_annotation(&a.name) else {
                continue;
            };
            let start = match a.stage.as_str() {
                "START" => true,
                "END" => false,
                _ => continue,
            };
            let id = *ids.entry(module).or_insert_with(|| {
                names.push(module.to_string());
                names.len() as u32 - 1
            });
            marks.push((a.time_ns, start, id));
        }
        // A stable sort keeps the recorded order of marks at one time.
        marks.sort_by_key(|&(t, _, _)| t);
        let mut lists = vec![Vec::new()];
        let mut list_ids: FxHashMap<Vec<u32>, u32> = FxHashMap::default();
        list_ids.insert(Vec::new(), 0);
        let mut after = Vec::with_capacity(marks.len() + 1);
        after.push(0);
        let mut open: Vec<u32> = Vec::new();
        for &(_, start, id) in &marks {
            if start {
                open.push(id);
            } else if let Some(k) = open.iter().rposition(|&o| o == id) {
                open.truncate(k);
            }
            let list = *list_ids.entry(open.clone()).or_insert_with(|| {
                lists.push(open.clone());
                lists.len() as u32 - 1
            });
            after.push(list);
        }
        ModuleMarks {
            times: marks.iter().map(|&(t, _, _)| t).collect(),
            after,
            lists,
            names,
        }
    }

    /// The id of the module calls open at `time`: after every mark at or before it.
    fn open_at(&self, time: u64) -> u32 {
        self.after[self.times.partition_point(|&t| t <= time)]
    }

    /// The module calls of list `id` (outermost first).
    fn open(&self, id: u32) -> &[u32] {
        &self.lists[id as usize]
    }

    fn is_empty(&self) -> bool {
        self.times.is_empty()
    }

    fn name(&self, id: u32) -> &str {
        &self.names[id as usize]
    }
}
