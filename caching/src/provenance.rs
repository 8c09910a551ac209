//! Provenance: where an allocation came from, captured cheaply on the hot path and resolved
//! only when a snapshot or report is made.
//!
//! `crate::allocator` asks this module for the calling thread's number and innermost scope
//! (thread-locals, no lock), captures an unresolved backtrace when sampling says so (outside
//! its lock), and then, under its device lock, interns the `#[track_caller]` location, the
//! backtrace, the tag and the scope into small integer ids (`ProvenanceTables`). A block keeps
//! one `u32` provenance id. Sites leave the tables unsymbolized, copied under the lock
//! (`ProvenanceTables::sites_since`), and [`UnresolvedSite::resolve`] turns them into the
//! model's `CallSite`s after the lock is released; the frames it symbolizes are then kept
//! (`ProvenanceTables::keep_resolved`), so each backtrace is symbolized once.
//!
//! A caller that knows better than Rust where an allocation comes from (the Python binding,
//! which walks the interpreter's frames) wraps the allocation in [`with_call_site`]: the site
//! it gives replaces the `#[track_caller]` location and any backtrace for the allocations the
//! thread makes inside the closure. Such a site is kept as given; when it leaves the allocator
//! (in a snapshot, a site table or the tables the telemetry publisher sends, always after the
//! device lock is released) the resolver its owner registered with
//! [`set_external_site_resolver`] may rewrite it: the Python binding gives allocations on
//! threads without Python a site of raw native addresses and names their functions there.

use std::cell::{Cell, RefCell};
use std::panic::Location;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::OnceLock;

use rustc_hash::FxHashMap;

use vramscope_model::{CallSite, Frame};

/// The id that means "none".
pub(crate) const NIL: u32 = u32::MAX;

static NEXT_THREAD: AtomicU32 = AtomicU32::new(1);

thread_local! {
    static THREAD_NUMBER: Cell<u32> = const { Cell::new(0) };
    static SCOPES: RefCell<Vec<(u64, u32)>> = const { RefCell::new(Vec::new()) };
    /// Entries in `SCOPES`: read first by [`current_scope`], so that a thread without open
    /// scopes (the common case) reads one plain thread-local instead of the vector behind its
    /// `RefCell`, whose thread-local has a destructor and so a state to check on every access.
    static OPEN_SCOPES: Cell<usize> = const { Cell::new(0) };
    static SAMPLE_COUNTER: Cell<u32> = const { Cell::new(0) };
    static EXTERNAL_SITE: Cell<Option<&'static CallSite>> = const { Cell::new(None) };
}

/// Runs `f` with `site` as the call site of every allocation, transfer and sync this thread
/// records inside it, on any allocator: it replaces the `#[track_caller]` location and any
/// sampled backtrace. Sites are interned by address, so a caller passes the same `&'static`
/// value for the same place (the Python binding leaks one per distinct stack, as Rust's
/// locations are static). Nests; the previous site is restored on return and on unwind.
pub fn with_call_site<R>(site: &'static CallSite, f: impl FnOnce() -> R) -> R {
    struct Restore(Option<&'static CallSite>);
    impl Drop for Restore {
        fn drop(&mut self) {
            let _ = EXTERNAL_SITE.try_with(|s| s.set(self.0));
        }
    }
    let _restore = Restore(EXTERNAL_SITE.with(|s| s.replace(Some(site))));
    f()
}

/// Rewrites a site given with [`with_call_site`] as it leaves the allocator: `Some` replaces
/// it, `None` keeps it as it is.
pub type ExternalSiteResolver = fn(&CallSite) -> Option<CallSite>;

/// The resolver of sites given with [`with_call_site`], once registered.
static EXTERNAL_RESOLVER: OnceLock<ExternalSiteResolver> = OnceLock::new();

/// Registers, for the whole process, the function that resolves the sites given with
/// [`with_call_site`] when they leave any allocator. Snapshots, [`site_tables`] and
/// [`site_tables_since`] (so the tables the telemetry publisher sends) pass each such site
/// through it after the device lock is released, never on the allocation path, so the
/// resolver may be slow (symbolize native addresses, say) and take locks of its own. It
/// returns `None` for a site it leaves as it is (every site it did not make); a resolver that
/// panics leaves the site as it is too. The first registration stays: a later call is ignored
/// and returns `false` (it returns `true` when it registered `resolver`).
///
/// [`site_tables`]: crate::CachingAllocator::site_tables
/// [`site_tables_since`]: crate::CachingAllocator::site_tables_since
pub fn set_external_site_resolver(resolver: ExternalSiteResolver) -> bool {
    EXTERNAL_RESOLVER.set(resolver).is_ok()
}

/// A site given with [`with_call_site`] as it leaves the allocator: through the registered
/// resolver, if any ([`set_external_site_resolver`]).
fn resolve_external(site: &CallSite) -> CallSite {
    EXTERNAL_RESOLVER
        .get()
        .and_then(|resolver| std::panic::catch_unwind(|| resolver(site)).ok().flatten())
        .unwrap_or_else(|| site.clone())
}

/// The site [`with_call_site`] set on this thread, if any.
#[inline]
fn external_site() -> Option<&'static CallSite> {
    EXTERNAL_SITE.try_with(Cell::get).ok().flatten()
}

/// vramscope's small number for the calling thread (1, 2, ... in order of first use).
#[inline]
pub fn thread_number() -> u32 {
    let current = THREAD_NUMBER.with(Cell::get);
    if current != 0 {
        return current;
    }
    first_thread_number()
}

/// Gives the calling thread its number, on its first call to [`thread_number`].
#[cold]
#[inline(never)]
fn first_thread_number() -> u32 {
    let fresh = NEXT_THREAD.fetch_add(1, Ordering::Relaxed);
    THREAD_NUMBER.with(|n| n.set(fresh));
    fresh
}

/// The innermost scope id the calling thread has open on allocator `owner`, or [`NIL`].
#[inline]
pub(crate) fn current_scope(owner: u64) -> u32 {
    if OPEN_SCOPES.with(Cell::get) == 0 {
        return NIL;
    }
    scope_in_stack(owner)
}

/// [`current_scope`] of a thread with scopes open: the innermost on `owner` in its stack.
#[inline(never)]
fn scope_in_stack(owner: u64) -> u32 {
    SCOPES.with(|stack| {
        stack
            .borrow()
            .iter()
            .rev()
            .find(|(o, _)| *o == owner)
            .map(|(_, id)| *id)
            .unwrap_or(NIL)
    })
}

pub(crate) fn push_scope(owner: u64, id: u32) {
    SCOPES.with(|stack| {
        let mut stack = stack.borrow_mut();
        stack.push((owner, id));
        OPEN_SCOPES.with(|open| open.set(stack.len()));
    });
}

pub(crate) fn pop_scope(owner: u64, id: u32) {
    // A guard dropped while the thread exits may find the stack already gone: nothing to pop.
    let _ = SCOPES.try_with(|stack| {
        let mut stack = stack.borrow_mut();
        if let Some(pos) = stack.iter().rposition(|entry| *entry == (owner, id)) {
            stack.remove(pos);
        }
        OPEN_SCOPES.with(|open| open.set(stack.len()));
    });
}

/// Whether this allocation should carry a full backtrace: every `n`th on this thread.
pub(crate) fn sample_backtrace(every: u32) -> bool {
    SAMPLE_COUNTER.with(|c| {
        let next = c.get() + 1;
        if next >= every {
            c.set(0);
            true
        } else {
            c.set(next);
            false
        }
    })
}

/// Captures the caller's stack as raw instruction pointers, without symbolizing (nothing when
/// the crate is built without its `backtrace` feature: call sites are then the callers'
/// `#[track_caller]` locations alone).
pub(crate) fn capture_backtrace() -> Vec<usize> {
    #[cfg(feature = "backtrace")]
    {
        let mut ips = Vec::with_capacity(32);
        backtrace::trace(|frame| {
            ips.push(frame.ip() as usize);
            ips.len() < 64
        });
        ips
    }
    #[cfg(not(feature = "backtrace"))]
    Vec::new()
}

/// Provenance of one allocation, as interned ids.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Provenance {
    pub site: u32,
    pub tag: u32,
    pub scope: u32,
    pub thread: u32,
}

/// One entry of the site table: a location and, optionally, the backtrace taken there.
struct SiteEntry {
    location: &'static Location<'static>,
    /// The site given with [`with_call_site`], which replaces the location when present.
    external: Option<&'static CallSite>,
    backtrace: Option<Vec<usize>>,
    resolved: Option<Vec<Frame>>,
}

/// Interned strings with ids.
#[derive(Default)]
pub(crate) struct Interner {
    ids: FxHashMap<String, u32>,
    pub strings: Vec<String>,
}

impl Interner {
    /// The bytes the strings and their index hold.
    pub fn bytes(&self) -> usize {
        let text: usize = self.strings.iter().map(|s| s.capacity()).sum();
        let string = std::mem::size_of::<String>();
        self.strings.capacity() * string
            + self.ids.capacity() * (string + std::mem::size_of::<u32>() + 1)
            + 2 * text
    }

    pub fn intern(&mut self, text: &str) -> u32 {
        if let Some(&id) = self.ids.get(text) {
            return id;
        }
        let id = self.strings.len() as u32;
        self.strings.push(text.to_string());
        self.ids.insert(text.to_string(), id);
        id
    }
}

/// The deepest a scope may nest: a scope opened inside [`MAX_SCOPE_DEPTH`] open ones is
/// refused and counted ([`crate::CachingAllocator::try_scope`], [`crate::ScopeStats::refused`]).
pub const MAX_SCOPE_DEPTH: usize = 1024;

/// The most bytes of a scope's path as it leaves the allocator (in a snapshot or a telemetry
/// table): a longer path keeps its innermost bytes after a leading `…`, so that a table of
/// deeply nested scopes with long names is never quadratic in what it sends.
pub const MAX_SCOPE_PATH_BYTES: usize = 4096;

/// One scope of the table: its parent's id ([`NIL`] at the top), its own name's id, and its
/// depth (1 at the top).
#[derive(Clone, Copy, Debug)]
struct ScopeEntry {
    parent: u32,
    name: u32,
    depth: u32,
}

/// The scope table: each scope is its parent's id and its own name, stored once, so a scope
/// costs the same few bytes however deep it nests; the path a reader sees
/// (`outer/inner`) is put together only as it leaves the allocator
/// ([`ScopeTable::paths_since`]).
#[derive(Default)]
pub(crate) struct ScopeTable {
    names: Interner,
    entries: Vec<ScopeEntry>,
    by_key: FxHashMap<(u32, u32), u32>,
    refused: u64,
}

impl ScopeTable {
    /// The id of the scope `name` inside `parent` ([`NIL`]: at the top), added if new; `None`,
    /// counted, when it would nest deeper than [`MAX_SCOPE_DEPTH`].
    pub fn open(&mut self, parent: u32, name: &str) -> Option<u32> {
        let depth = match self.entries.get(parent as usize) {
            Some(entry) => entry.depth + 1,
            None => 1,
        };
        if depth as usize > MAX_SCOPE_DEPTH {
            self.refused += 1;
            return None;
        }
        let parent = if depth == 1 { NIL } else { parent };
        let name = self.names.intern(name);
        if let Some(&id) = self.by_key.get(&(parent, name)) {
            return Some(id);
        }
        let id = self.entries.len() as u32;
        self.entries.push(ScopeEntry {
            parent,
            name,
            depth,
        });
        self.by_key.insert((parent, name), id);
        Some(id)
    }

    /// The scopes in the table.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Scopes refused for nesting past [`MAX_SCOPE_DEPTH`].
    pub fn refused(&self) -> u64 {
        self.refused
    }

    /// The bytes the table holds: its entries, its index and the names (each once).
    pub fn bytes(&self) -> usize {
        let map_entry = std::mem::size_of::<((u32, u32), u32)>() + 1;
        self.entries.capacity() * std::mem::size_of::<ScopeEntry>()
            + self.by_key.capacity() * map_entry
            + self.names.bytes()
    }

    /// The paths (`outer/inner`) of the scopes from id `from` on, by id, each cut to
    /// [`MAX_SCOPE_PATH_BYTES`].
    pub fn paths_since(&self, from: usize) -> Vec<String> {
        (from..self.entries.len())
            .map(|id| self.path(id as u32))
            .collect()
    }

    /// The path of scope `id`, its innermost [`MAX_SCOPE_PATH_BYTES`] when it is longer.
    fn path(&self, id: u32) -> String {
        let mut names = Vec::new();
        let mut bytes = 0;
        let mut at = id;
        let mut cut = false;
        while let Some(entry) = self.entries.get(at as usize) {
            let name = &self.names.strings[entry.name as usize];
            bytes += name.len() + usize::from(!names.is_empty());
            names.push(name.as_str());
            if bytes > MAX_SCOPE_PATH_BYTES {
                cut = true;
                break;
            }
            at = entry.parent;
        }
        names.reverse();
        let path = names.join("/");
        if !cut {
            return path;
        }
        let keep = MAX_SCOPE_PATH_BYTES - "…".len();
        let mut start = path.len() - keep.min(path.len());
        while !path.is_char_boundary(start) {
            start += 1;
        }
        format!("…{}", &path[start..])
    }
}

/// An allocation's origin as the fast path keys it: (location address, tag, scope, thread).
type OriginKey = (usize, u32, u32, u32);

/// Entries of the origin cache (a power of two).
const ORIGIN_CACHE: usize = 16;

/// A key no origin has (no `Location` lives at address `usize::MAX`).
const NO_ORIGIN: (OriginKey, u32) = ((usize::MAX, 0, 0, 0), NIL);

/// The allocator's tables of call sites, tags, scopes and provenance tuples.
pub(crate) struct ProvenanceTables {
    sites: Vec<SiteEntry>,
    by_location: FxHashMap<usize, u32>,
    by_backtrace: FxHashMap<(usize, Vec<usize>), u32>,
    /// Sites given with [`with_call_site`], by address.
    by_external: FxHashMap<usize, u32>,
    pub tags: Interner,
    pub scopes: ScopeTable,
    provenance: Vec<Provenance>,
    by_provenance: FxHashMap<Provenance, u32>,
    /// Fast path: (location, tag, scope, thread) straight to a provenance id.
    by_origin: FxHashMap<OriginKey, u32>,
    /// Faster path: a direct-mapped cache of `by_origin` indexed by the location's address,
    /// so that the few call sites of a hot loop skip the hash lookup.
    origin_cache: [(OriginKey, u32); ORIGIN_CACHE],
}

impl Default for ProvenanceTables {
    fn default() -> Self {
        ProvenanceTables {
            sites: Vec::new(),
            by_location: FxHashMap::default(),
            by_backtrace: FxHashMap::default(),
            by_external: FxHashMap::default(),
            tags: Interner::default(),
            scopes: ScopeTable::default(),
            provenance: Vec::new(),
            by_provenance: FxHashMap::default(),
            by_origin: FxHashMap::default(),
            origin_cache: [NO_ORIGIN; ORIGIN_CACHE],
        }
    }
}

impl ProvenanceTables {
    /// Interns a call site; `backtrace` makes it distinct from the bare location.
    pub fn site(
        &mut self,
        location: &'static Location<'static>,
        backtrace: Option<Vec<usize>>,
    ) -> u32 {
        if let Some(site) = external_site() {
            return self.external(location, site);
        }
        let key = location as *const Location<'static> as usize;
        match backtrace {
            None => *self.by_location.entry(key).or_insert_with(|| {
                self.sites.push(SiteEntry {
                    location,
                    external: None,
                    backtrace: None,
                    resolved: None,
                });
                (self.sites.len() - 1) as u32
            }),
            Some(ips) => {
                let map_key = (key, ips);
                if let Some(&id) = self.by_backtrace.get(&map_key) {
                    return id;
                }
                let id = self.sites.len() as u32;
                self.sites.push(SiteEntry {
                    location,
                    external: None,
                    backtrace: Some(map_key.1.clone()),
                    resolved: None,
                });
                self.by_backtrace.insert(map_key, id);
                id
            }
        }
    }

    /// The provenance id of an allocation at `location` (or at no location, when call sites are
    /// off) with no backtrace: one hash lookup once seen.
    #[inline]
    pub fn provenance_at(
        &mut self,
        location: Option<&'static Location<'static>>,
        tag: u32,
        scope: u32,
        thread: u32,
    ) -> u32 {
        if let Some(external) = external_site() {
            let site = location.map_or(NIL, |l| self.external(l, external));
            return self.provenance(Provenance {
                site,
                tag,
                scope,
                thread,
            });
        }
        let key = (
            location.map_or(0, |l| l as *const Location<'static> as usize),
            tag,
            scope,
            thread,
        );
        // `Location`s are at least 8-byte aligned and several words long.
        let slot = (key.0 >> 4) & (ORIGIN_CACHE - 1);
        let (cached, id) = self.origin_cache[slot];
        if cached == key {
            return id;
        }
        if let Some(&id) = self.by_origin.get(&key) {
            self.origin_cache[slot] = (key, id);
            return id;
        }
        let site = location.map_or(NIL, |l| self.site(l, None));
        let id = self.provenance(Provenance {
            site,
            tag,
            scope,
            thread,
        });
        self.by_origin.insert(key, id);
        self.origin_cache[slot] = (key, id);
        id
    }

    /// Interns a site given with [`with_call_site`] (`location` is the Rust caller's, kept for
    /// the entry's sake).
    fn external(&mut self, location: &'static Location<'static>, site: &'static CallSite) -> u32 {
        let key = site as *const CallSite as usize;
        *self.by_external.entry(key).or_insert_with(|| {
            self.sites.push(SiteEntry {
                location,
                external: Some(site),
                backtrace: None,
                resolved: None,
            });
            (self.sites.len() - 1) as u32
        })
    }

    /// Interns a provenance tuple.
    #[inline]
    pub fn provenance(&mut self, prov: Provenance) -> u32 {
        if let Some(&id) = self.by_provenance.get(&prov) {
            return id;
        }
        let id = self.provenance.len() as u32;
        self.provenance.push(prov);
        self.by_provenance.insert(prov, id);
        id
    }

    /// The tuple behind a provenance id.
    pub fn get(&self, id: u32) -> Option<Provenance> {
        self.provenance.get(id as usize).copied()
    }

    /// The location of a site id as `file:line:column`.
    pub fn site_label(&self, site: u32) -> Option<String> {
        self.sites.get(site as usize).map(|s| {
            if let Some(external) = s.external {
                return external.to_string();
            }
            format!(
                "{}:{}:{}",
                s.location.file(),
                s.location.line(),
                s.location.column()
            )
        })
    }

    /// The sites from id `from` on, unsymbolized: cheap to take under the device lock (a
    /// location reference and a copy of the instruction pointers each); [`UnresolvedSite::
    /// resolve`] then symbolizes them without it.
    pub fn sites_since(&self, from: usize) -> Vec<UnresolvedSite> {
        self.sites
            .get(from..)
            .unwrap_or_default()
            .iter()
            .map(|entry| UnresolvedSite {
                location: entry.location,
                external: entry.external,
                backtrace: match &entry.resolved {
                    Some(_) => None,
                    None => entry.backtrace.clone(),
                },
                resolved: entry.resolved.clone(),
            })
            .collect()
    }

    /// Keeps the frames of sites from id `from` on that were symbolized outside the device lock
    /// ([`ProvenanceTables::sites_since`], then [`UnresolvedSite::resolve`]), so that each
    /// backtrace is resolved once.
    pub fn keep_resolved(&mut self, from: usize, sites: &[CallSite]) {
        for (entry, site) in self.sites.iter_mut().skip(from).zip(sites) {
            if entry.resolved.is_none() && entry.backtrace.is_some() && entry.external.is_none() {
                entry.resolved = Some(site.frames.clone());
            }
        }
    }

    /// Every provenance tuple, by id (copied under the lock, read outside it).
    pub fn provenances(&self) -> &[Provenance] {
        &self.provenance
    }
}

/// A call site taken from the tables without symbolizing it (`ProvenanceTables::sites_since`, as
/// [`crate::CachingAllocator::site_tables_since`] uses it).
#[derive(Clone, Debug)]
pub struct UnresolvedSite {
    location: &'static Location<'static>,
    external: Option<&'static CallSite>,
    backtrace: Option<Vec<usize>>,
    resolved: Option<Vec<Frame>>,
}

impl UnresolvedSite {
    /// The model's call site, symbolizing the backtrace if it has one (slow: call it without
    /// the device lock). A site given with [`with_call_site`] goes through the resolver
    /// registered with [`set_external_site_resolver`], if any.
    pub fn resolve(self) -> CallSite {
        if let Some(external) = self.external {
            return resolve_external(external);
        }
        let frames = match (self.resolved, self.backtrace) {
            (Some(frames), _) => frames,
            (None, Some(ips)) => resolve(&ips),
            (None, None) => Vec::new(),
        };
        CallSite {
            file: self.location.file().to_string(),
            line: self.location.line(),
            column: self.location.column(),
            function: String::new(),
            frames,
        }
    }
}

/// Turns instruction pointers into frames, skipping vramscope's own and the runtime's frames
/// at the top of the stack.
fn resolve(ips: &[usize]) -> Vec<Frame> {
    #[allow(unused_mut)]
    let mut frames = Vec::new();
    #[cfg(feature = "backtrace")]
    for &ip in ips {
        backtrace::resolve(ip as *mut std::ffi::c_void, |symbol| {
            let function = symbol.name().map(|n| format!("{n:#}")).unwrap_or_default();
            frames.push(Frame {
                file: symbol
                    .filename()
                    .map(|p| p.display().to_string())
                    .unwrap_or_else(|| "??".to_string()),
                line: symbol.lineno().unwrap_or(0),
                function,
            });
        });
    }
    #[cfg(not(feature = "backtrace"))]
    let _ = ips;
    let first_user = frames
        .iter()
        .position(|f: &Frame| {
            !f.function.starts_with("backtrace::")
                && !f.function.starts_with("vramscope_allocator::")
                && !f.function.starts_with("core::")
                && !f.function.starts_with("<vramscope_allocator::")
        })
        .unwrap_or(0);
    frames.drain(..first_user);
    frames
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{CachingAllocator, SimDevice, StreamId};
    use vramscope_model::AllocatorConfig;

    fn leaked(file: &str, line: u32) -> &'static CallSite {
        Box::leak(Box::new(CallSite {
            file: file.to_string(),
            line,
            column: 0,
            function: "train".to_string(),
            frames: vec![Frame {
                file: file.to_string(),
                line,
                function: "train".to_string(),
            }],
        }))
    }

    #[test]
    fn a_given_call_site_replaces_the_location_inside_the_closure_only() {
        let alloc = CachingAllocator::new(SimDevice::phantom(1 << 30), AllocatorConfig::default());
        let site = leaked("train.py", 12);
        let other = leaked("train.py", 40);
        let a = with_call_site(site, || alloc.alloc_ptr(4096, StreamId::DEFAULT)).unwrap();
        let b = with_call_site(site, || alloc.alloc_ptr(8192, StreamId::DEFAULT)).unwrap();
        let c = with_call_site(other, || {
            with_call_site(site, || ());
            alloc.alloc_ptr(512, StreamId::DEFAULT)
        })
        .unwrap();
        let d = alloc.alloc_ptr(512, StreamId::DEFAULT).unwrap();
        let snapshot = alloc.snapshot();
        let site_of = |addr: u64| {
            let block = snapshot
                .segments
                .iter()
                .flat_map(|s| &s.blocks)
                .find(|b| b.address == addr)
                .unwrap();
            snapshot.sites[block.site.unwrap() as usize].clone()
        };
        assert_eq!(site_of(a), *site);
        assert_eq!(site_of(b), *site);
        assert_eq!(site_of(c), *other, "the inner closure's site was restored");
        assert!(
            site_of(d).file.ends_with("provenance.rs"),
            "{:?}",
            site_of(d)
        );
        let same: Vec<_> = snapshot.sites.iter().filter(|s| *s == site).collect();
        assert_eq!(same.len(), 1, "one table entry per given site");
    }

    #[test]
    fn scope_paths_render_as_before_and_are_stored_once_per_scope() {
        let mut table = ScopeTable::default();
        let model = table.open(NIL, "model").unwrap();
        let layer = table.open(model, "layer1").unwrap();
        let again = table.open(model, "layer1").unwrap();
        let other = table.open(NIL, "eval").unwrap();
        assert_eq!(layer, again, "a name inside a parent is one scope");
        assert_eq!(
            table.paths_since(0),
            vec![
                "model".to_string(),
                "model/layer1".to_string(),
                "eval".to_string()
            ]
        );
        assert_eq!(table.paths_since(2), vec!["eval".to_string()]);
        assert_ne!(other, layer);
        // An id this table never gave (a scope of another allocator) is no parent.
        assert_eq!(table.open(12345, "top"), Some(3));
        assert_eq!(table.paths_since(3), vec!["top".to_string()]);
    }

    #[test]
    fn scopes_past_the_depth_cap_are_refused_and_counted() {
        let mut table = ScopeTable::default();
        let mut parent = NIL;
        for _ in 0..MAX_SCOPE_DEPTH {
            parent = table.open(parent, "loop").expect("within the cap");
        }
        for _ in 0..10 {
            assert_eq!(table.open(parent, "loop"), None);
        }
        assert_eq!(table.refused(), 10);
        assert_eq!(table.len(), MAX_SCOPE_DEPTH);
        // One name, stored once: a few dozen bytes a scope.
        assert!(
            table.bytes() < 100 * MAX_SCOPE_DEPTH,
            "{} bytes for {MAX_SCOPE_DEPTH} scopes",
            table.bytes()
        );
        let paths = table.paths_since(0);
        let deepest = paths.last().unwrap();
        assert!(deepest.len() <= MAX_SCOPE_PATH_BYTES, "{}", deepest.len());
        assert!(deepest.starts_with('…') && deepest.ends_with("loop/loop"));
        assert_eq!(paths[9], ["loop"; 10].join("/"), "short paths are whole");
    }

    #[test]
    fn a_long_name_is_cut_at_a_character_boundary() {
        let mut table = ScopeTable::default();
        let long = "é".repeat(3000);
        let outer = table.open(NIL, &long).unwrap();
        table.open(outer, "inner").unwrap();
        let paths = table.paths_since(0);
        for path in &paths {
            assert!(path.len() <= MAX_SCOPE_PATH_BYTES, "{}", path.len());
            assert!(path.starts_with('…'));
        }
        assert!(paths[1].ends_with("é/inner"));
    }

    /// The test's resolver: names the sites of `native.placeholder`, panics on those of
    /// `native.panics` and leaves every other site alone.
    fn name_placeholders(site: &CallSite) -> Option<CallSite> {
        match site.file.as_str() {
            "native.placeholder" => Some(CallSite {
                file: "native.rs".to_string(),
                frames: vec![Frame {
                    file: "native.rs".to_string(),
                    line: 0,
                    function: "MmBackward0::apply".to_string(),
                }],
                ..site.clone()
            }),
            "native.panics" => panic!("the test's resolver panics on {site}"),
            _ => None,
        }
    }

    /// The test's second resolver, which must never be used.
    fn second_resolver(site: &CallSite) -> Option<CallSite> {
        Some(CallSite {
            function: "second resolver".to_string(),
            ..site.clone()
        })
    }

    #[test]
    fn the_registered_resolver_rewrites_given_sites_as_they_leave_the_allocator() {
        let alloc = CachingAllocator::new(SimDevice::phantom(1 << 30), AllocatorConfig::default());
        let placeholder = leaked("native.placeholder", 0);
        let panics = leaked("native.panics", 0);
        let kept = leaked("kept.py", 7);
        // Given before the resolver is registered: resolved all the same, when it leaves.
        with_call_site(placeholder, || alloc.alloc_ptr(4096, StreamId::DEFAULT)).unwrap();
        assert!(set_external_site_resolver(name_placeholders));
        assert!(
            !set_external_site_resolver(second_resolver),
            "the first registration stays"
        );
        let known = alloc.site_tables_since(0, 0, 0);
        assert_eq!(known.sites.len(), 1);
        let named = &known.sites[0];
        assert_eq!(named.file, "native.rs");
        assert_eq!(named.frames[0].function, "MmBackward0::apply");
        assert_eq!(
            named.function, "train",
            "the rest of the site is the resolver's to keep"
        );
        assert_eq!(
            *placeholder,
            *leaked("native.placeholder", 0),
            "the given site is unchanged"
        );

        // Sites added later reach a live consumer resolved, as table additions; the sites the
        // resolver declines, or panics on, go out as given.
        with_call_site(kept, || alloc.alloc_ptr(4096, StreamId::DEFAULT)).unwrap();
        with_call_site(panics, || alloc.alloc_ptr(4096, StreamId::DEFAULT)).unwrap();
        let more = alloc.site_tables_since(known.sites.len(), 0, 0);
        assert_eq!(more.sites, vec![kept.clone(), panics.clone()]);

        // Snapshots and the whole table go through the same resolver.
        let snapshot = alloc.snapshot();
        let all = alloc.site_tables();
        assert_eq!(snapshot.sites, all.sites);
        assert_eq!(all.sites, vec![named.clone(), kept.clone(), panics.clone()]);
        assert!(all.sites.iter().all(|s| s.function != "second resolver"));
    }
}
