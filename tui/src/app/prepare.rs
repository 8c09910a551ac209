//! The view at the time cursor: what the panels show, computed when something changed.
//!
//! [`App::prepare`] fills the app's `crate::view::CursorView`: live blocks grouped by call site
//! (`crate::data::Dataset::groups`), filtered and sorted as the user chose, with growth per step
//! from the analysis; the stack tree when it is shown; the indices of the findings that pass
//! their filter; and figures about the segments. A key of the choices it was computed with lets
//! a redraw with nothing changed skip all of it. The event log's rows do not depend on the
//! cursor: `crate::app::event_rows` keeps them from frame to frame and redoes them only when
//! the filters or the events change. Nothing here costs a pass over every event on a cursor
//! move. `crate::ui` then draws from that view through `App::view_model`.

use std::collections::{BTreeSet, HashMap};

use ratatui::layout::Rect;
use rustc_hash::FxHashMap;
use vramscope_analysis::model_view::holdings_of;
use vramscope_engine::{GroupId, LiveBlock, SiteGroups};
use vramscope_import::sites::is_framework_frame;
use vramscope_model::SiteId;

use super::event_rows::{self, RowsKey};
use super::App;
use crate::ui;
use crate::view::{CursorView, Panel, SegmentFigures, SiteRow, SiteSort, TreeRow};

impl App {
    fn view_key(&self) -> String {
        format!(
            "{:?}|{}|{:?}|{}|{}|{}|{}|{:?}",
            self.sites.sort,
            self.sites.tree,
            self.sites.collapsed,
            self.sites.hide_framework,
            self.sites.filter,
            self.findings.filter,
            self.analysis.as_ref().map_or(0, |a| a.version),
            self.analysis.as_ref().map(|a| a.cut),
        )
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
        let growth = self.analysis.as_ref().map(|a| &a.growth);
        // Borrowed, not cloned: a copy of the groups here cost O(call sites) at every view
        // change, which a publisher sending call sites made quadratic (issue 33). The state at
        // the cursor was worked out above and is at hand.
        let _ = self.data.state_at(pos);
        let groups = self.data.groups();
        let state = match self.data.cached_state(pos) {
            Some(state) => state,
            None => self.data.head(),
        };
        // The rows hold allocated bytes by group, summed as the report sums its columns: a
        // block whose free is requested is not among them, and memory from before the trace
        // that no block describes (a profiler trace's totals) is the "before the trace" row.
        let by_group = holdings_of(state, groups, &|b: &LiveBlock| b.step);
        // The tree's sums by site, the same bytes; a block without a site goes by its group
        // ("before the trace" or "unknown site"), as the table names it.
        let mut by_site: FxHashMap<(Option<SiteId>, GroupId), (u64, u64)> = FxHashMap::default();
        if self.sites.tree {
            for (_, b) in state.blocks.unordered().filter(|(_, b)| !b.pending) {
                let s = by_site
                    .entry((b.site, groups.of_block(b)))
                    .or_insert((0, 0));
                s.0 += b.size;
                s.1 += 1;
            }
            if state.unattributed.allocated > 0 {
                let s = by_site
                    .entry((None, SiteGroups::BEFORE_TRACE))
                    .or_insert((0, 0));
                s.0 += state.unattributed.allocated;
            }
        }
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
        let segments = SegmentFigures::from_state(state);
        let tree = if self.sites.tree {
            self.build_tree(&by_site, &filter)
        } else {
            Vec::new()
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
            key,
        };
        let rows = if self.sites.tree {
            self.view.tree.len()
        } else {
            self.view.sites.len()
        };
        self.sites.selected = self.sites.selected.min(rows.saturating_sub(1));
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
