//! Call-site groups: every call site with the same name (`file:line`, or for a C++-only stack
//! its autograd node, see `super::naming`) is one group, with a stable id.
//!
//! Call sites are interned per stack, so one source line reached through several stacks has
//! several site ids; a reader wants them together. [`SiteGroups`] numbers groups in the order
//! their first site appears and keeps up with a site table that grows (the live dashboard
//! receives new sites as the program runs): a group's id never changes once given. Two groups
//! are always there: [`SiteGroups::UNKNOWN`] for events without a call site, and
//! [`SiteGroups::BEFORE_TRACE`] for blocks allocated before the trace began whose site the
//! dump-time state does not name. The inspector's `ModelView`, its reports and the dashboard all
//! group through this type, so a site's bytes are the same in every view.

use rustc_hash::FxHashMap;
use vramscope_model::{CallSite, SiteId};

use super::naming::name_call_site;
use super::state::LiveBlock;

/// Index of a group in [`SiteGroups`].
pub type GroupId = u32;

/// What a group stands for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GroupKind {
    /// A source line (`file:line`).
    Site,
    /// Events without a call site.
    Unknown,
    /// Blocks allocated before the trace began, whose site nothing records.
    BeforeTrace,
}

/// One call-site group.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SiteGroup {
    /// What the group stands for.
    pub kind: GroupKind,
    /// The name of a [`GroupKind::Site`] group (`file:line`, or `MmBackward0 (backward)` for a
    /// C++-only stack); `None` for the other kinds.
    pub file_line: Option<String>,
    /// The function at the site (the first non-empty one among the member sites).
    pub function: String,
    /// The site ids that belong to the group, in increasing order.
    pub sites: Vec<SiteId>,
}

impl SiteGroup {
    /// The group's name for a reader: `file:line`, `(unknown site)` or `(before the trace)`.
    pub fn label(&self) -> &str {
        match (&self.file_line, self.kind) {
            (Some(file_line), _) => file_line,
            (None, GroupKind::BeforeTrace) => "(before the trace)",
            (None, _) => "(unknown site)",
        }
    }
}

/// Call sites grouped by `file:line`, kept in step with a growing site table.
#[derive(Clone, Debug)]
pub struct SiteGroups {
    list: Vec<SiteGroup>,
    site_group: Vec<GroupId>,
    by_key: FxHashMap<String, GroupId>,
}

impl Default for SiteGroups {
    fn default() -> SiteGroups {
        SiteGroups::new()
    }
}

impl SiteGroups {
    /// The group of events without a call site.
    pub const UNKNOWN: GroupId = 0;
    /// The group of blocks from before the trace whose site nothing records.
    pub const BEFORE_TRACE: GroupId = 1;

    /// The two fixed groups and no site.
    pub fn new() -> SiteGroups {
        let fixed = |kind| SiteGroup {
            kind,
            file_line: None,
            function: String::new(),
            sites: Vec::new(),
        };
        SiteGroups {
            list: vec![fixed(GroupKind::Unknown), fixed(GroupKind::BeforeTrace)],
            site_group: Vec::new(),
            by_key: FxHashMap::default(),
        }
    }

    /// The groups of a site table.
    pub fn from_sites(sites: &[CallSite]) -> SiteGroups {
        let mut groups = SiteGroups::new();
        groups.sync(sites);
        groups
    }

    /// Adds the sites of `sites` beyond those already grouped (the table only grows).
    pub fn sync(&mut self, sites: &[CallSite]) {
        for (id, site) in sites.iter().enumerate().skip(self.site_group.len()) {
            let name = name_call_site(site);
            let next = self.list.len() as GroupId;
            let g = *self.by_key.entry(name.label.clone()).or_insert(next);
            if g == next {
                self.list.push(SiteGroup {
                    kind: GroupKind::Site,
                    file_line: Some(name.label),
                    function: String::new(),
                    sites: Vec::new(),
                });
            }
            let group = &mut self.list[g as usize];
            if group.function.is_empty() && !name.function.is_empty() {
                group.function = name.function;
            }
            group.sites.push(id as SiteId);
            self.site_group.push(g);
        }
    }

    /// The group of an event's site ([`SiteGroups::UNKNOWN`] without one, or for an id
    /// outside the table).
    pub fn group_of(&self, site: Option<SiteId>) -> GroupId {
        site.and_then(|s| self.site_group.get(s as usize).copied())
            .unwrap_or(SiteGroups::UNKNOWN)
    }

    /// The group a live block counts under: its allocation's site; for a block from before
    /// the trace, the site the dump-time state names, else [`SiteGroups::BEFORE_TRACE`].
    pub fn of_block(&self, block: &LiveBlock) -> GroupId {
        if block.predates_trace() && block.site.is_none() {
            SiteGroups::BEFORE_TRACE
        } else {
            self.group_of(block.site)
        }
    }

    /// The group of a site id, `None` for ids outside the table.
    pub fn of_site(&self, site: SiteId) -> Option<GroupId> {
        self.site_group.get(site as usize).copied()
    }

    /// One group.
    pub fn get(&self, group: GroupId) -> &SiteGroup {
        &self.list[group as usize]
    }

    /// Every group, by id.
    pub fn all(&self) -> &[SiteGroup] {
        &self.list
    }

    /// The number of groups.
    pub fn len(&self) -> usize {
        self.list.len()
    }

    /// Whether there are no groups (never: the two fixed groups are always there).
    pub fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    /// The group whose label is `label`.
    pub fn by_label(&self, label: &str) -> Option<GroupId> {
        self.list
            .iter()
            .position(|g| g.label() == label)
            .map(|g| g as GroupId)
    }
}
