//! The view at the time cursor: what the panels show, computed when something changed.
//!
//! [`App::prepare`] fills the app's `crate::view::CursorView`: live blocks grouped by call site
//! (`crate::data::Dataset::groups`), filtered and sorted as the user chose, with growth per step
//! from the analysis; the stack tree when it is shown; the indices of the findings that pass
//! their filter; figures about the segments; and, while the memory panel is shown, the
//! categories at the cursor and the visible rows of the call tree there
//! (`vramscope_analysis::call_tree`, from the classification of the data's allocations,
//! made once per file and at most once a second for live data). The sums behind the rows,
//! the segment figures and the tree are the dataset's, moved with the cursor event by event
//! (`crate::data::Sums`), so a move costs the blocks it changes, not every live block. A key
//! of the choices it was computed with lets a redraw with nothing changed skip all of it. The event log's rows do not depend on the
//! cursor: `crate::app::event_rows` keeps them from frame to frame and redoes them only when
//! the filters or the events change. Nothing here costs a pass over every event on a cursor
//! move. `crate::ui` then draws from that view through `App::view_model`.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use ratatui::layout::Rect;
use std::time::{Duration, Instant};

use rustc_hash::FxHashMap;
use vramscope_analysis::call_tree::{CallTree, TreeKeys};
use vramscope_analysis::categories::Categories;
use vramscope_engine::GroupId;
use vramscope_import::sites::is_framework_frame;
use vramscope_model::{Category, CategoryBytes, SiteId};

use super::event_rows::{self, RowsKey};
use super::App;
use crate::data::{Sums, TreeContext};
use crate::ui;
use crate::view::{CursorView, MemoryRow, Panel, SiteRow, SiteSort, TreeRow};

/// The most nodes the memory panel's call tree keeps (the rest summed into "other").
pub const MEMORY_TREE_NODES: usize = 200;

/// The classification of the data's allocations, and what it was made from.
pub(crate) struct Classified {
    version: u64,
    epoch: u64,
    at: Instant,
    categories: Arc<Categories>,
}

/// How long live data keeps a classification while only new events arrive: classifying costs
/// a pass over every event, and the allocations it has not seen count as unknown meanwhile.
const RECLASSIFY_LIVE: Duration = Duration::from_secs(1);

impl App {
    fn view_key(&self) -> String {
        format!(
            "{:?}|{}|{:?}|{}|{}|{}|{}|{:?}|{}|{:?}|{:?}",
            self.sites.sort,
            self.sites.tree,
            self.sites.collapsed,
            self.sites.hide_framework,
            self.sites.filter,
            self.findings.filter,
            self.analysis.as_ref().map_or(0, |a| a.version),
            self.analysis.as_ref().map(|a| a.cut),
            self.panel == Panel::Memory,
            self.memory.toggled,
            self.memory_area(),
        )
    }

    /// Classifies the data's allocations when they changed: a file once, live data at most
    /// once every [`RECLASSIFY_LIVE`] while only new events arrive.
    fn classify(&mut self) {
        let (version, epoch) = (self.data.version(), self.data.epoch());
        let fresh = self.categories.as_ref().is_some_and(|c| {
            c.version == version
                || (self.is_live() && c.epoch == epoch && c.at.elapsed() < RECLASSIFY_LIVE)
        });
        if !fresh {
            let categories = Arc::new(Categories::classify(self.data.snapshot()));
            // The memory panel's tree is summed with this classification and the tables of
            // the snapshot it was made from, moved with the cursor as the other sums are.
            self.data.set_tree_context(Arc::new(TreeContext {
                keys: TreeKeys::new(self.data.snapshot()),
                categories: Some(Arc::clone(&categories)),
            }));
            self.categories = Some(Classified {
                version,
                epoch,
                at: Instant::now(),
                categories,
            });
        }
    }

    /// The memory panel's area on the screen, border included, while it is shown.
    fn memory_area(&self) -> Option<Rect> {
        (self.panel == Panel::Memory).then(|| ui::layout(self.area, Panel::Memory).body)
    }

    /// The rows the memory panel's tree has on the screen with `categories` at the cursor:
    /// what is left below the bar and its legend, as the panel draws them
    /// ([`ui::memory::MemoryGeometry`]), and at least one.
    fn tree_rows(&self, categories: &CategoryBytes) -> usize {
        let Some(area) = self.memory_area() else {
            return 0;
        };
        let bar = ui::memory::CategoryBar {
            bytes: categories,
            theme: self.theme,
        };
        ui::memory::MemoryGeometry::of(area, &bar)
            .tree_list_rows()
            .max(1)
    }

    /// The nodes of `tree` open unless the user toggled them: the largest first, each while
    /// its children still fit the panel's rows (with `categories` at the cursor) beside the
    /// rows already shown.
    fn open_by_default(
        &self,
        tree: &CallTree,
        categories: &CategoryBytes,
    ) -> rustc_hash::FxHashSet<u32> {
        let mut open = rustc_hash::FxHashSet::default();
        let Some(root) = tree.root() else {
            return open;
        };
        let budget = self.tree_rows(categories);
        let mut shown = root.children.len();
        let candidates = |n: &[u32]| {
            n.iter()
                .filter(|&&c| !tree.nodes[c as usize].children.is_empty())
                .map(|&c| (tree.nodes[c as usize].bytes, std::cmp::Reverse(c)))
                .collect::<Vec<_>>()
        };
        let mut heap: std::collections::BinaryHeap<_> = candidates(&root.children).into();
        while let Some((_, std::cmp::Reverse(n))) = heap.pop() {
            let children = &tree.nodes[n as usize].children;
            if shown + children.len() > budget {
                continue;
            }
            shown += children.len();
            open.insert(n);
            heap.extend(candidates(children));
        }
        open
    }

    /// The call tree's visible rows, from `tree`, with `categories` at the cursor (the bar
    /// above the tree, whose legend takes rows of the panel).
    fn memory_rows(&self, tree: &CallTree, categories: &CategoryBytes) -> Vec<MemoryRow> {
        let mut rows = Vec::new();
        let Some(root) = tree.root() else {
            return rows;
        };
        let defaults = self.open_by_default(tree, categories);
        // Depth first from the root's children, a node's children after it while it is open.
        let mut stack: Vec<(u32, String)> = root
            .children
            .iter()
            .rev()
            .map(|&c| (c, String::new()))
            .collect();
        while let Some((n, parent)) = stack.pop() {
            let node = &tree.nodes[n as usize];
            let path = if parent.is_empty() {
                node.label.clone()
            } else {
                format!("{parent}\u{1f}{}", node.label)
            };
            let open = defaults.contains(&n) != self.memory.toggled.contains(&path);
            let has_children = !node.children.is_empty();
            if open && has_children {
                stack.extend(node.children.iter().rev().map(|&c| (c, path.clone())));
            }
            rows.push(MemoryRow {
                depth: node.depth.saturating_sub(1) as usize,
                label: node.label.clone(),
                bytes: node.bytes,
                blocks: node.blocks,
                main: node.main_category(),
                path,
                has_children,
                folded: has_children && !open,
            });
        }
        rows
    }

    /// Prepares a frame of `area`: remembers the area (for the mouse), the rows a page of the
    /// panel's list holds (for the page keys), and computes the view with [`App::prepare`].
    pub fn prepare_frame(&mut self, area: Rect) {
        self.area = area;
        let layout = ui::layout(area, self.panel);
        self.page_rows = usize::from(layout.body.height.saturating_sub(3)).max(1);
        self.prepare();
    }

    /// Computes what the panels need at the cursor, when the data, the cursor or a choice
    /// changed since the last call.
    pub fn prepare(&mut self) {
        let pos = self.pos();
        // Keep the state at the cursor at hand for drawing, even when nothing else changed.
        let _ = self.data.state_at(pos);
        // The event log's rows, only while it is shown: the first time they cost a pass over
        // every event, later only what changed.
        if self.panel == Panel::Events {
            self.update_event_rows();
        }
        let version = self.data.version();
        let key = self.view_key();
        if self.view.pos == pos && self.view.version == version && self.view.key == key {
            return;
        }
        if self.panel == Panel::Memory {
            self.classify();
        }
        let growth = self.analysis.as_ref().map(|a| &a.growth);
        // Borrowed, not cloned: a copy of the groups here cost O(call sites) at every view
        // change, which a publisher sending call sites made quadratic (issue 33). The state at
        // the cursor and its sums (`crate::data::Sums`, moved with the state event by event:
        // a move costs the blocks it changes, not every live block, issue 47) are worked out
        // here and are at hand below.
        let _ = self.data.sums_at(pos);
        let groups = self.data.groups();
        let state = match self.data.cached_state(pos) {
            Some(state) => state,
            None => self.data.head(),
        };
        let fallback;
        let sums = match self.data.cached_sums(pos) {
            Some(sums) => sums,
            None => {
                fallback = Sums::of_state(state);
                &fallback
            }
        };
        // The rows hold allocated bytes by group, summed as the report sums its columns
        // (`holdings_of`): a block whose free is requested is not among them, and memory
        // from before the trace that no block describes (a profiler trace's totals) is the
        // "before the trace" row.
        let unattributed = state.unattributed.allocated;
        let by_group = sums.holdings().holdings(groups, unattributed);
        // The tree's sums by site, the same bytes; a block without a site goes by its group
        // ("before the trace" or "unknown site"), as the table names it.
        let by_site: FxHashMap<(Option<SiteId>, GroupId), (u64, u64)> = if self.sites.tree {
            sums.holdings().by_site(groups, unattributed)
        } else {
            FxHashMap::default()
        };
        let live_blocks = state.blocks.len() as u64;
        let filter = self.sites.filter.to_lowercase();
        let mut sites: Vec<SiteRow> = by_group
            .into_iter()
            .map(|h| SiteRow {
                group: h.group,
                bytes: h.bytes,
                blocks: h.blocks,
                requested: h.requested,
                first_step: h.first_step,
                last_step: h.last_step,
                growth: None,
            })
            .filter(|r| {
                filter.is_empty() || {
                    let g = groups.get(r.group);
                    g.label().to_lowercase().contains(&filter)
                        || g.function.to_lowercase().contains(&filter)
                }
            })
            .map(|mut r| {
                r.growth = growth.and_then(|m| m.get(&r.group).copied());
                r
            })
            .collect();
        let label = |r: &SiteRow| groups.get(r.group).label().to_string();
        match self.sites.sort {
            SiteSort::Bytes => {
                sites.sort_by(|a, b| b.bytes.cmp(&a.bytes).then(label(a).cmp(&label(b))))
            }
            SiteSort::Blocks => {
                sites.sort_by(|a, b| b.blocks.cmp(&a.blocks).then(label(a).cmp(&label(b))))
            }
            SiteSort::Growth => sites.sort_by(|a, b| {
                let ga = a.growth.unwrap_or(f64::MIN);
                let gb = b.growth.unwrap_or(f64::MIN);
                gb.total_cmp(&ga)
                    .then(b.bytes.cmp(&a.bytes))
                    .then(label(a).cmp(&label(b)))
            }),
            SiteSort::Name => sites.sort_by_key(label),
        }
        let segments = sums.segment_figures(state);
        let tree = if self.sites.tree {
            self.build_tree(&by_site, &filter)
        } else {
            Vec::new()
        };
        let (categories, memory) = if self.panel == Panel::Memory {
            // From the sums at the cursor, made with the classification above; the blocks
            // themselves only where those are not at hand.
            let tree = match sums.tree() {
                Some((context, tree)) => {
                    CallTree::of_sums(self.data.snapshot(), &context.keys, tree, MEMORY_TREE_NODES)
                }
                None => {
                    let classified = self.categories.as_ref().map(|c| &*c.categories);
                    CallTree::at(self.data.snapshot(), state, classified, MEMORY_TREE_NODES)
                }
            };
            let mut categories = tree.categories();
            // Memory from before the trace that no block describes (a profiler trace's
            // totals), as the allocated figure counts it.
            categories.add(Category::BeforeTrace, state.unattributed.allocated);
            let rows = self.memory_rows(&tree, &categories);
            (categories, rows)
        } else {
            (CategoryBytes::new(), Vec::new())
        };
        let findings = self.filtered_findings();
        self.view = CursorView {
            pos,
            version,
            sites,
            tree,
            live_blocks,
            events: std::mem::take(&mut self.view.events),
            findings,
            segments,
            categories,
            memory,
            key,
        };
        let rows = if self.sites.tree {
            self.view.tree.len()
        } else {
            self.view.sites.len()
        };
        self.sites.selected = self.sites.selected.min(rows.saturating_sub(1));
        self.memory.selected = self
            .memory
            .selected
            .min(self.view.memory.len().saturating_sub(1));
        self.findings.selected = self
            .findings
            .selected
            .min(self.view.findings.len().saturating_sub(1));
    }

    fn build_tree(
        &self,
        by_site: &FxHashMap<(Option<SiteId>, GroupId), (u64, u64)>,
        filter: &str,
    ) -> Vec<TreeRow> {
        #[derive(Default)]
        struct Node {
            bytes: u64,
            blocks: u64,
            framework: bool,
            children: HashMap<String, Node>,
        }
        let snapshot = self.data.snapshot();
        let groups = self.data.groups();
        let mut root = Node::default();
        for (&(site, group), &(bytes, blocks)) in by_site {
            let mut path: Vec<(String, bool)> = Vec::new();
            match snapshot.site(site) {
                Some(s) if !s.frames.is_empty() => {
                    for f in s.frames.iter().rev() {
                        let framework = is_framework_frame(f, &self.framework_paths);
                        if framework && self.sites.hide_framework {
                            continue;
                        }
                        let name = if f.function.is_empty() {
                            "?"
                        } else {
                            &f.function
                        };
                        path.push((format!("{name} ({}:{})", f.file, f.line), framework));
                    }
                }
                Some(s) if s.function.is_empty() => path.push((s.file_line(), false)),
                Some(s) => path.push((format!("{} ({})", s.function, s.file_line()), false)),
                None => path.push((groups.get(group).label().to_string(), false)),
            }
            if !filter.is_empty() && !path.iter().any(|(l, _)| l.to_lowercase().contains(filter)) {
                continue;
            }
            let mut node = &mut root;
            for (label, framework) in path {
                node = node.children.entry(label).or_default();
                node.framework = framework;
                node.bytes += bytes;
                node.blocks += blocks;
            }
        }
        fn flatten(
            node: &Node,
            depth: usize,
            parent: &str,
            collapsed: &BTreeSet<String>,
            out: &mut Vec<TreeRow>,
        ) {
            let mut kids: Vec<(&String, &Node)> = node.children.iter().collect();
            kids.sort_by(|a, b| b.1.bytes.cmp(&a.1.bytes).then(a.0.cmp(b.0)));
            for (label, child) in kids {
                let path = if parent.is_empty() {
                    label.clone()
                } else {
                    format!("{parent}\u{1f}{label}")
                };
                let folded = collapsed.contains(&path);
                out.push(TreeRow {
                    depth,
                    label: label.clone(),
                    bytes: child.bytes,
                    blocks: child.blocks,
                    framework: child.framework,
                    path: path.clone(),
                    has_children: !child.children.is_empty(),
                    collapsed: folded,
                });
                if !folded {
                    flatten(child, depth + 1, &path, collapsed, out);
                }
            }
        }
        let mut out = Vec::new();
        flatten(&root, 0, "", &self.sites.collapsed, &mut out);
        out
    }

    /// Brings the event log's rows up to date with its filters and the data.
    fn update_event_rows(&mut self) {
        let key = RowsKey::new(self.events.kind, &self.events.filter, &self.data);
        if self.event_rows_key.as_ref() == Some(&key) {
            return;
        }
        let old = std::mem::take(&mut self.view.events);
        let old_key = self.event_rows_key.take();
        self.view.events = event_rows::rows(&self.data, old, old_key.as_ref(), &key);
        self.event_rows_key = Some(key);
    }

    fn filtered_findings(&self) -> Vec<usize> {
        let Some(a) = &self.analysis else {
            return Vec::new();
        };
        let filter = self.findings.filter.to_lowercase();
        a.findings
            .iter()
            .enumerate()
            .filter(|(_, f)| {
                filter.is_empty()
                    || f.kind.as_str().contains(&filter)
                    || f.site_label().to_lowercase().contains(&filter)
                    || f.summary.to_lowercase().contains(&filter)
            })
            .map(|(i, _)| i)
            .collect()
    }
}
