//! The overflow of a long bin of the free index: its free blocks by size, and for each size
//! the blocks' addresses in order, found in a bounded number of steps however many there are.
//!
//! A bin of `crate::free_index` that has held more than its vector's worth of free blocks
//! keeps the larger keys here. Such bins are, on the traces that make them, thousands of free
//! blocks of a few equal sizes that cannot merge (equal tensors interleaved with longer-lived
//! ones and freed out of order), so the overflow is split by exact size first, as PyTorch's
//! pools and offset-allocator's bins are, into an ordered map of few entries. Within one
//! size the blocks must still come out lowest address first, the block PyTorch's
//! `std::set` ordered by (size, address) would pick, so a size's addresses are not a plain
//! list but an [`AddrSet`]: a sorted vector while short, then a radix tree of 64-way nodes
//! with a bit mask each over the addresses divided by the block size, in which inserting,
//! removing and finding the lowest address at or after another take one step per six bits
//! of the span (three for blocks of 64 KiB over 16 GiB) and no comparison of keys.

use std::collections::BTreeMap;

/// Address bits a node of the radix tree resolves: 64 children per node.
const FANOUT_BITS: u32 = 6;
/// Children per node.
const FANOUT: u64 = 1 << FANOUT_BITS;
/// A short set is a sorted vector up to this many addresses, and becomes one again when a
/// tree falls to [`SHORT`] addresses.
const LONG: usize = 32;
/// See [`LONG`].
const SHORT: usize = 8;
/// The most levels a tree can have: enough for 64-bit granules.
const MAX_LEVELS: usize = 64usize.div_ceil(FANOUT_BITS as usize);

/// A set of addresses with a block id each, ordered by address.
#[derive(Debug)]
pub(crate) enum AddrSet {
    /// Few addresses: sorted, smallest first.
    Short(Vec<(u64, u32)>),
    /// Many addresses: a radix tree.
    Long(Radix),
}

impl AddrSet {
    /// An empty set.
    pub fn new() -> AddrSet {
        AddrSet::Short(Vec::new())
    }

    /// Adds `addr` with `id`, or replaces the id of an `addr` already there. `size` is the
    /// size of the blocks the set holds: free blocks of one size do not overlap, so they lie
    /// at least that far apart, which sets the tree's granule (a guess only: addresses closer
    /// than that are still kept apart, at some cost).
    pub fn insert(&mut self, addr: u64, id: u32, size: u64) {
        match self {
            AddrSet::Short(entries) => match entries.binary_search_by_key(&addr, |e| e.0) {
                Ok(i) => entries[i].1 = id,
                Err(i) if entries.len() < LONG => entries.insert(i, (addr, id)),
                Err(_) => {
                    let mut tree = Radix::new(63 - size.max(1).leading_zeros());
                    for &(a, i) in entries.iter() {
                        tree.insert(a, i);
                    }
                    tree.insert(addr, id);
                    *self = AddrSet::Long(tree);
                }
            },
            AddrSet::Long(tree) => tree.insert(addr, id),
        }
    }

    /// Removes `addr`, returning its id.
    pub fn remove(&mut self, addr: u64) -> Option<u32> {
        match self {
            AddrSet::Short(entries) => {
                let i = entries.binary_search_by_key(&addr, |e| e.0).ok()?;
                Some(entries.remove(i).1)
            }
            AddrSet::Long(tree) => {
                let id = tree.remove(addr)?;
                if tree.len() <= SHORT {
                    self.shorten();
                }
                Some(id)
            }
        }
    }

    /// Takes out the lowest address.
    pub fn pop_first(&mut self) -> Option<(u64, u32)> {
        match self {
            AddrSet::Short(entries) => (!entries.is_empty()).then(|| entries.remove(0)),
            AddrSet::Long(tree) => {
                let first = tree.pop_first();
                if tree.len() <= SHORT {
                    self.shorten();
                }
                first
            }
        }
    }

    /// Turns a tree that has fallen to [`SHORT`] addresses back into a vector.
    #[cold]
    fn shorten(&mut self) {
        let mut entries = Vec::with_capacity(LONG);
        if let AddrSet::Long(tree) = self {
            tree.collect_from(0, &mut entries);
        }
        *self = AddrSet::Short(entries);
    }

    /// The id of `addr`.
    pub fn get(&self, addr: u64) -> Option<u32> {
        match self {
            AddrSet::Short(entries) => entries
                .binary_search_by_key(&addr, |e| e.0)
                .ok()
                .map(|i| entries[i].1),
            AddrSet::Long(tree) => tree.get(addr),
        }
    }

    /// The lowest address at or after `addr`, with its id.
    pub fn first_from(&self, addr: u64) -> Option<(u64, u32)> {
        match self {
            AddrSet::Short(entries) => entries
                .get(entries.partition_point(|e| e.0 < addr))
                .copied(),
            AddrSet::Long(tree) => tree.first_from(addr),
        }
    }

    /// The highest address.
    pub fn last(&self) -> Option<u64> {
        match self {
            AddrSet::Short(entries) => entries.last().map(|e| e.0),
            AddrSet::Long(tree) => tree.last(),
        }
    }

    /// Number of addresses.
    pub fn len(&self) -> usize {
        match self {
            AddrSet::Short(entries) => entries.len(),
            AddrSet::Long(tree) => tree.len(),
        }
    }

    /// Every address at or after `addr` with its id, in order, appended to `out`.
    pub fn collect_from(&self, addr: u64, out: &mut Vec<(u64, u32)>) {
        match self {
            AddrSet::Short(entries) => {
                out.extend_from_slice(&entries[entries.partition_point(|e| e.0 < addr)..])
            }
            AddrSet::Long(tree) => tree.collect_from(addr, out),
        }
    }
}

/// One node of a [`Radix`] tree: a mask of the occupied slots, and per slot the child's index
/// or, in a leaf, the block's id and its whole address (a granule holds at most one address,
/// which need not be its first byte). A slot whose bit is clear holds nothing.
#[derive(Clone, Debug)]
struct Node {
    mask: u64,
    slots: [u32; FANOUT as usize],
    addrs: [u64; FANOUT as usize],
}

impl Node {
    const EMPTY: Node = Node {
        mask: 0,
        slots: [0; FANOUT as usize],
        addrs: [0; FANOUT as usize],
    };
}

/// The bits of `granule` above the `levels` lowest levels of a tree (zero when those levels
/// cover all 64 bits).
#[inline(always)]
fn above(granule: u64, levels: u32) -> u64 {
    granule.checked_shr(FANOUT_BITS * levels).unwrap_or(0)
}

/// The slot of `granule` in a node at `level` (leaves are level 0).
#[inline(always)]
fn slot_at(granule: u64, level: u32) -> usize {
    (above(granule, level) & (FANOUT - 1)) as usize
}

/// The mask bits of slots after `slot`.
#[inline(always)]
fn after(slot: usize) -> u64 {
    (u64::MAX << slot) << 1
}

/// A set of addresses in a radix tree over their granules, `addr >> shift`, which keep the
/// addresses' order. A granule holds one address: `shift` starts at the blocks' size (rounded
/// down to a power of two), so that blocks which do not overlap never share a granule, and
/// two addresses that would share one rebuild the tree over finer granules. The root covers
/// the granules whose bits above its levels equal `prefix`; a granule outside that range adds
/// levels on top until it is inside, so the tree is as deep as the span of its addresses
/// needs (three levels for blocks of 64 KiB over 16 GiB).
#[derive(Debug)]
pub(crate) struct Radix {
    /// The nodes; `nodes[root]` is the root. Freed nodes are listed in `spare` for reuse.
    nodes: Vec<Node>,
    spare: Vec<u32>,
    root: u32,
    /// Levels of nodes, the leaves' included (at least 1).
    levels: u32,
    prefix: u64,
    shift: u32,
    len: usize,
}

impl Radix {
    /// An empty tree, one empty leaf as its root, over granules of `shift` bits.
    fn new(shift: u32) -> Radix {
        Radix {
            nodes: vec![Node::EMPTY],
            spare: Vec::new(),
            root: 0,
            levels: 1,
            prefix: 0,
            shift,
            len: 0,
        }
    }

    fn len(&self) -> usize {
        self.len
    }

    fn new_node(&mut self) -> u32 {
        match self.spare.pop() {
            Some(i) => {
                self.nodes[i as usize].mask = 0;
                i
            }
            None => {
                if self.nodes.len() == self.nodes.capacity() {
                    // Four times the nodes, not twice: a node is 776 bytes, and a tree built
                    // up from one node (a size's set turns into a tree at 33 addresses and
                    // back into a vector at 8, so `scattered`'s trees are built again and
                    // again) copied every node about twice on its way to 160 of them, where
                    // this copies a third as much, in half the reallocations. A tree's
                    // nodes are at most four times what it has used.
                    self.nodes.reserve_exact(self.nodes.len() * 3);
                }
                self.nodes.push(Node::EMPTY);
                (self.nodes.len() - 1) as u32
            }
        }
    }

    /// Adds `addr` with `id`, or replaces the id of an `addr` already there.
    fn insert(&mut self, addr: u64, id: u32) {
        let granule = addr >> self.shift;
        if self.len == 0 {
            self.prefix = above(granule, self.levels);
        }
        while above(granule, self.levels) != self.prefix {
            self.add_level();
        }
        let mut node = self.root as usize;
        for level in (1..self.levels).rev() {
            let slot = slot_at(granule, level);
            node = if self.nodes[node].mask & (1 << slot) != 0 {
                self.nodes[node].slots[slot] as usize
            } else {
                let child = self.new_node();
                let n = &mut self.nodes[node];
                n.mask |= 1 << slot;
                n.slots[slot] = child;
                child as usize
            };
        }
        let slot = slot_at(granule, 0);
        let leaf = &mut self.nodes[node];
        if leaf.mask & (1 << slot) != 0 && leaf.addrs[slot] != addr {
            let other = leaf.addrs[slot];
            return self.refine(addr, id, other);
        }
        self.len += (leaf.mask & (1 << slot) == 0) as usize;
        leaf.mask |= 1 << slot;
        leaf.slots[slot] = id;
        leaf.addrs[slot] = addr;
    }

    /// Puts a new root above the tree, so that it covers 64 times the granules.
    #[cold]
    fn add_level(&mut self) {
        let old = self.root;
        let root = self.new_node();
        let n = &mut self.nodes[root as usize];
        let slot = (self.prefix & (FANOUT - 1)) as usize;
        n.mask = 1 << slot;
        n.slots[slot] = old;
        self.root = root;
        self.levels += 1;
        self.prefix = self.prefix.checked_shr(FANOUT_BITS).unwrap_or(0);
    }

    /// Builds the tree again over granules fine enough to keep `addr` apart from `other`,
    /// which shares its granule now, and adds `addr` (never on the allocator's blocks of one
    /// size, which do not overlap).
    #[cold]
    #[inline(never)]
    fn refine(&mut self, addr: u64, id: u32, other: u64) {
        let mut entries = Vec::with_capacity(self.len + 1);
        self.collect_from(0, &mut entries);
        // The highest bit in which the two differ tells them apart.
        *self = Radix::new(63 - (addr ^ other).leading_zeros());
        for (a, i) in entries {
            self.insert(a, i);
        }
        self.insert(addr, id);
    }

    /// The granule of `addr` when the tree's range holds it.
    #[inline(always)]
    fn granule_of(&self, addr: u64) -> Option<u64> {
        let granule = addr >> self.shift;
        (self.len > 0 && above(granule, self.levels) == self.prefix).then_some(granule)
    }

    /// The leaf that would hold `granule`, if the nodes down to it exist, with the nodes on
    /// the way (`path[level]` for each level above the leaves).
    #[inline(always)]
    fn leaf_of(&self, granule: u64, path: &mut [u32; MAX_LEVELS]) -> Option<usize> {
        let mut node = self.root as usize;
        for level in (1..self.levels).rev() {
            path[level as usize] = node as u32;
            let n = &self.nodes[node];
            let slot = slot_at(granule, level);
            if n.mask & (1 << slot) == 0 {
                return None;
            }
            node = n.slots[slot] as usize;
        }
        Some(node)
    }

    /// Removes `addr`, returning its id.
    fn remove(&mut self, addr: u64) -> Option<u32> {
        let granule = self.granule_of(addr)?;
        let mut path = [0u32; MAX_LEVELS];
        let leaf = self.leaf_of(granule, &mut path)?;
        let slot = slot_at(granule, 0);
        let n = &self.nodes[leaf];
        if n.mask & (1 << slot) == 0 || n.addrs[slot] != addr {
            return None;
        }
        Some(self.take(leaf, granule, &path).1)
    }

    /// Takes out the lowest address.
    fn pop_first(&mut self) -> Option<(u64, u32)> {
        if self.len == 0 {
            return None;
        }
        let mut path = [0u32; MAX_LEVELS];
        let mut node = self.root as usize;
        let mut granule = self.prefix;
        for level in (0..self.levels).rev() {
            path[level as usize] = node as u32;
            let n = &self.nodes[node];
            let slot = n.mask.trailing_zeros() as usize;
            granule = (granule << FANOUT_BITS) | slot as u64;
            if level > 0 {
                node = n.slots[slot] as usize;
            }
        }
        Some(self.take(node, granule, &path))
    }

    /// Takes the address of `granule` out of `leaf`, reached through `path`; the nodes left
    /// empty go to `spare` (the root stays).
    #[inline(always)]
    fn take(&mut self, leaf: usize, granule: u64, path: &[u32; MAX_LEVELS]) -> (u64, u32) {
        let slot = slot_at(granule, 0);
        let n = &mut self.nodes[leaf];
        let found = (n.addrs[slot], n.slots[slot]);
        n.mask &= !(1 << slot);
        self.len -= 1;
        let mut emptied = n.mask == 0;
        let mut child = leaf as u32;
        for level in 1..self.levels {
            if !emptied {
                break;
            }
            self.spare.push(child);
            let parent = path[level as usize];
            let n = &mut self.nodes[parent as usize];
            n.mask &= !(1 << slot_at(granule, level));
            emptied = n.mask == 0;
            child = parent;
        }
        found
    }

    /// The id of `addr`.
    fn get(&self, addr: u64) -> Option<u32> {
        let granule = self.granule_of(addr)?;
        let leaf = &self.nodes[self.leaf_of(granule, &mut [0; MAX_LEVELS])?];
        let slot = slot_at(granule, 0);
        (leaf.mask & (1 << slot) != 0 && leaf.addrs[slot] == addr).then(|| leaf.slots[slot])
    }

    /// The lowest address under `node`, a node at `level`, with its id.
    #[inline(always)]
    fn lowest_under(&self, mut node: usize, mut level: u32) -> (u64, u32) {
        loop {
            let n = &self.nodes[node];
            let slot = n.mask.trailing_zeros() as usize;
            if level == 0 {
                return (n.addrs[slot], n.slots[slot]);
            }
            node = n.slots[slot] as usize;
            level -= 1;
        }
    }

    /// The lowest address at or after `addr`, with its id.
    fn first_from(&self, addr: u64) -> Option<(u64, u32)> {
        if self.len == 0 {
            return None;
        }
        let granule = addr >> self.shift;
        let high = above(granule, self.levels);
        if high < self.prefix {
            return Some(self.lowest_under(self.root as usize, self.levels - 1));
        }
        if high > self.prefix {
            return None;
        }
        // Down the path of `granule` while it exists; then the first later slot in the
        // deepest node on the path that has one.
        let mut path = [(0u32, 0u8); MAX_LEVELS];
        let mut node = self.root as usize;
        let mut level = self.levels - 1;
        let mut depth = 0;
        loop {
            let n = &self.nodes[node];
            let slot = slot_at(granule, level);
            if level == 0 {
                let mut later = n.mask & (u64::MAX << slot);
                // The address in `granule` itself may lie before `addr`.
                if later & (1 << slot) != 0 && n.addrs[slot] < addr {
                    later &= !(1 << slot);
                }
                if later != 0 {
                    let found = later.trailing_zeros() as usize;
                    return Some((n.addrs[found], n.slots[found]));
                }
                break;
            }
            if n.mask & (1 << slot) == 0 {
                let later = n.mask & after(slot);
                if later != 0 {
                    let found = later.trailing_zeros() as usize;
                    return Some(self.lowest_under(n.slots[found] as usize, level - 1));
                }
                break;
            }
            path[depth] = (node as u32, slot as u8);
            depth += 1;
            node = n.slots[slot] as usize;
            level -= 1;
        }
        while depth > 0 {
            depth -= 1;
            level += 1;
            let (node, slot) = path[depth];
            let n = &self.nodes[node as usize];
            let later = n.mask & after(slot as usize);
            if later != 0 {
                let found = later.trailing_zeros() as usize;
                return Some(self.lowest_under(n.slots[found] as usize, level - 1));
            }
        }
        None
    }

    /// The highest address.
    fn last(&self) -> Option<u64> {
        if self.len == 0 {
            return None;
        }
        let mut node = self.root as usize;
        for _ in 1..self.levels {
            let n = &self.nodes[node];
            node = n.slots[63 - n.mask.leading_zeros() as usize] as usize;
        }
        let n = &self.nodes[node];
        Some(n.addrs[63 - n.mask.leading_zeros() as usize])
    }

    /// Every address at or after `addr` with its id, in order, appended to `out`.
    fn collect_from(&self, addr: u64, out: &mut Vec<(u64, u32)>) {
        let mut next = self.first_from(addr);
        while let Some((a, id)) = next {
            out.push((a, id));
            next = a.checked_add(1).and_then(|a| self.first_from(a));
        }
    }
}

/// The keys of a long bin's overflow, `(size << 64) | address`, by size, then address.
#[derive(Debug, Default)]
pub(crate) struct Overflow {
    sizes: BTreeMap<u64, AddrSet>,
}

#[inline(always)]
fn split(key: u128) -> (u64, u64) {
    ((key >> 64) as u64, key as u64)
}

#[inline(always)]
fn join(size: u64, addr: u64) -> u128 {
    ((size as u128) << 64) | addr as u128
}

impl Overflow {
    /// Adds `key` with `id`.
    pub fn insert(&mut self, key: u128, id: u32) {
        let (size, addr) = split(key);
        self.sizes
            .entry(size)
            .or_insert_with(AddrSet::new)
            .insert(addr, id, size);
    }

    /// Removes `key`, returning its id.
    pub fn remove(&mut self, key: u128) -> Option<u32> {
        let (size, addr) = split(key);
        let set = self.sizes.get_mut(&size)?;
        let id = set.remove(addr)?;
        if set.len() == 0 {
            self.sizes.remove(&size);
        }
        Some(id)
    }

    /// The id of `key`.
    pub fn get(&self, key: u128) -> Option<u32> {
        let (size, addr) = split(key);
        self.sizes.get(&size)?.get(addr)
    }

    /// The first key at or after `key`, with its id.
    pub fn first_from(&self, key: u128) -> Option<(u128, u32)> {
        let (size, addr) = split(key);
        for (&s, set) in self.sizes.range(size..) {
            let from = if s == size { addr } else { 0 };
            if let Some((a, id)) = set.first_from(from) {
                return Some((join(s, a), id));
            }
        }
        None
    }

    /// Takes out the smallest key.
    pub fn pop_first(&mut self) -> Option<(u128, u32)> {
        let mut entry = self.sizes.first_entry()?;
        let size = *entry.key();
        let set = entry.get_mut();
        let (addr, id) = set.pop_first().expect("a size's set is never empty");
        if set.len() == 0 {
            entry.remove();
        }
        Some((join(size, addr), id))
    }

    /// The largest key.
    pub fn last(&self) -> Option<u128> {
        let (&size, set) = self.sizes.last_key_value()?;
        Some(join(size, set.last()?))
    }

    /// True when it holds no key.
    pub fn is_empty(&self) -> bool {
        self.sizes.is_empty()
    }

    /// Every key at or after `key` with its id, in order, appended to `out`.
    pub fn collect_from(&self, key: u128, out: &mut Vec<(u128, u32)>) {
        let (size, addr) = split(key);
        let mut addrs = Vec::new();
        for (&s, set) in self.sizes.range(size..) {
            addrs.clear();
            set.collect_from(if s == size { addr } else { 0 }, &mut addrs);
            out.extend(addrs.iter().map(|&(a, id)| (join(s, a), id)));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeMap;
    use vramscope_testkit::props;

    /// One step of a program on an [`AddrSet`].
    #[derive(Clone, Debug)]
    enum Step {
        Insert(u64),
        Remove(u64),
        Probe(u64),
        PopFirst,
    }

    /// Addresses from a few regions far apart, mostly multiples of 512 bytes, now and then
    /// not (which rebuilds the tree over finer granules).
    fn address() -> impl Strategy<Value = u64> {
        (0usize..4, 0u64..4096, 0u64..8).prop_map(|(region, unit, odd)| {
            let base = [
                0u64,
                0x7f00_0000_0000,
                0x7f00_4000_0000,
                u64::MAX - (8 << 20),
            ][region];
            let offset = unit * 512 + if odd == 0 { 8 } else { 0 };
            base + offset
        })
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            5 => address().prop_map(Step::Insert),
            3 => address().prop_map(Step::Remove),
            2 => address().prop_map(Step::Probe),
            1 => Just(Step::PopFirst),
        ]
    }

    proptest! {
        #![proptest_config(proptest::test_runner::Config {
            failure_persistence: None,
            ..props::config(64)
        })]

        /// An address set answers every question as an ordered map of the same addresses.
        #[test]
        fn an_address_set_behaves_like_an_ordered_map(
            size in prop_oneof![Just(512u64), Just(65536), Just(1 << 40)],
            steps in proptest::collection::vec(step(), 1..600)
        ) {
            let mut set = AddrSet::new();
            let mut model = BTreeMap::new();
            for (i, step) in steps.iter().enumerate() {
                match *step {
                    Step::Insert(addr) => {
                        set.insert(addr, i as u32, size);
                        model.insert(addr, i as u32);
                    }
                    Step::Remove(addr) => {
                        prop_assert_eq!(set.remove(addr), model.remove(&addr));
                    }
                    Step::Probe(addr) => {
                        prop_assert_eq!(set.get(addr), model.get(&addr).copied());
                    }
                    Step::PopFirst => {
                        prop_assert_eq!(set.pop_first(), model.pop_first());
                    }
                }
                let probe = match *step {
                    Step::Insert(a) | Step::Remove(a) | Step::Probe(a) => a,
                    Step::PopFirst => 0,
                };
                prop_assert_eq!(set.len(), model.len());
                for from in [probe, probe.wrapping_add(1), probe.saturating_sub(512), 0] {
                    prop_assert_eq!(
                        set.first_from(from),
                        model.range(from..).next().map(|(&a, &id)| (a, id))
                    );
                }
                prop_assert_eq!(set.last(), model.keys().next_back().copied());
            }
            let mut all = Vec::new();
            set.collect_from(0, &mut all);
            prop_assert_eq!(all, model.into_iter().collect::<Vec<_>>());
        }
    }

    #[test]
    fn a_long_set_is_a_tree_as_deep_as_its_span() {
        let mut set = AddrSet::new();
        // 5,000 blocks 64 KiB apart from a GPU-like base: 312 MiB inside one 16 GiB-aligned
        // range, three levels of six bits above the 64 KiB granule.
        let base = 0x7f12_3400_0000u64;
        for i in 0..5_000u64 {
            set.insert(base + i * 65536, i as u32, 65536);
        }
        let AddrSet::Long(tree) = &set else {
            panic!("5,000 addresses make a tree");
        };
        assert_eq!((tree.levels, tree.shift), (3, 16));
        assert!(tree.nodes.len() < 5_000 / 16, "{} nodes", tree.nodes.len());
        assert_eq!(set.first_from(0), Some((base, 0)));
        assert_eq!(set.first_from(base + 1), Some((base + 65536, 1)));
        assert_eq!(set.last(), Some(base + 4_999 * 65536));
        // Emptied but for a few, it is a vector again, and empty nodes went back.
        for i in 0..4_995u64 {
            assert_eq!(set.remove(base + i * 65536), Some(i as u32));
        }
        assert!(matches!(set, AddrSet::Short(ref v) if v.len() == 5));
        assert_eq!(set.first_from(0), Some((base + 4_995 * 65536, 4_995)));
    }
}
