//! A crit-bit (compressed binary) trie over 128-bit keys with per-node counts and weight sums.
//!
//! Every internal node splits its keys on one bit, so the trie is at most 128 deep and has
//! exactly `n - 1` internal nodes for `n` keys, whatever the keys are. Prefix sums
//! ("how many keys, how much weight below x") are one descent.

use std::ops::{Add, Sub};

/// How many keys and how much weight lie somewhere.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Load {
    pub count: u64,
    pub weight: u64,
}

impl Load {
    pub fn one(weight: u64) -> Self {
        Load { count: 1, weight }
    }

    /// `count` keys of weight 0.
    pub fn many(count: u64) -> Self {
        Load { count, weight: 0 }
    }
}

impl Add for Load {
    type Output = Load;
    fn add(self, other: Load) -> Load {
        Load {
            count: self.count + other.count,
            weight: self.weight + other.weight,
        }
    }
}

impl Sub for Load {
    type Output = Load;
    fn sub(self, other: Load) -> Load {
        Load {
            count: self.count - other.count,
            weight: self.weight - other.weight,
        }
    }
}

/// Index into `leaves` when the top bit is set, into `inners` otherwise.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Ref(u32);

const LEAF_TAG: u32 = 1 << 31;

impl Ref {
    fn leaf(index: usize) -> Ref {
        Ref(LEAF_TAG | index as u32)
    }
    fn inner(index: usize) -> Ref {
        Ref(index as u32)
    }
    fn as_leaf(self) -> Option<usize> {
        (self.0 & LEAF_TAG != 0).then_some((self.0 & !LEAF_TAG) as usize)
    }
    fn index(self) -> usize {
        (self.0 & !LEAF_TAG) as usize
    }
}

#[derive(Debug, Clone)]
struct Inner {
    /// The bits above `bit` shared by every key below; lower bits are zero.
    prefix: u128,
    load: Load,
    child: [Ref; 2],
    /// The leaf of the smallest key below: answers "is this block's first key held" in O(1).
    first: u32,
    bit: u8,
}

#[derive(Debug, Clone)]
struct Leaf {
    key: u128,
    weight: u64,
}

/// A position in the trie: all the keys of one aligned block of the keyspace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NodeRef(Ref);

/// The set of held keys with their weights.
#[derive(Debug, Clone, Default)]
pub struct KeyTree {
    inners: Vec<Inner>,
    leaves: Vec<Leaf>,
    free_inners: Vec<usize>,
    free_leaves: Vec<usize>,
    root: Option<Ref>,
}

/// Mask of the bits strictly above `bit`.
fn above(bit: u8) -> u128 {
    if bit >= 127 { 0 } else { !0u128 << (bit + 1) }
}

fn side(key: u128, bit: u8) -> usize {
    ((key >> bit) & 1) as usize
}

impl KeyTree {
    pub fn new() -> Self {
        Self::default()
    }

    /// Count and weight of every key.
    pub fn total(&self) -> Load {
        self.root.map_or(Load::default(), |r| self.load(r))
    }

    pub fn len(&self) -> u64 {
        self.total().count
    }

    pub fn is_empty(&self) -> bool {
        self.root.is_none()
    }

    /// Nodes in use, inner and leaf: what the tree's memory grows with.
    pub fn nodes(&self) -> usize {
        self.inners.len() - self.free_inners.len() + self.leaves.len() - self.free_leaves.len()
    }

    /// The weight of `key`, if held.
    pub fn weight(&self, key: u128) -> Option<u64> {
        self.below(key).1
    }

    /// Load of the keys strictly below `x`, and the weight of `x` itself if held.
    pub fn below(&self, x: u128) -> (Load, Option<u64>) {
        let mut acc = Load::default();
        let mut cur = match self.root {
            Some(r) => r,
            None => return (acc, None),
        };
        loop {
            if let Some(l) = cur.as_leaf() {
                let leaf = &self.leaves[l];
                return match leaf.key.cmp(&x) {
                    std::cmp::Ordering::Less => (acc + Load::one(leaf.weight), None),
                    std::cmp::Ordering::Equal => (acc, Some(leaf.weight)),
                    std::cmp::Ordering::Greater => (acc, None),
                };
            }
            let node = &self.inners[cur.index()];
            let high = x & above(node.bit);
            if high != node.prefix {
                // x lies outside this block: the whole block is either below it or above it.
                if high > node.prefix {
                    acc = acc + node.load;
                }
                return (acc, None);
            }
            if side(x, node.bit) == 1 {
                acc = acc + self.load(node.child[0]);
            }
            cur = node.child[side(x, node.bit)];
        }
    }

    /// Load of the keys in `[lo, hi]`.
    pub fn load_in(&self, lo: u128, hi: u128) -> Load {
        let (below_hi, at_hi) = self.below(hi);
        let through_hi = below_hi + at_hi.map_or(Load::default(), Load::one);
        through_hi - self.below(lo).0
    }

    /// Builds the trie of `entries` in one pass, as start-up does with every stored key:
    /// sorting and splitting on the highest differing bit is several times faster than
    /// inserting keys one by one. Refuses a key that appears twice.
    pub fn from_entries(mut entries: Vec<(u128, u64)>) -> Result<KeyTree, u128> {
        entries.sort_unstable_by_key(|&(key, _)| key);
        if let Some(pair) = entries.windows(2).find(|pair| pair[0].0 == pair[1].0) {
            return Err(pair[0].0);
        }
        let mut tree = KeyTree {
            inners: Vec::with_capacity(entries.len().saturating_sub(1)),
            leaves: entries
                .into_iter()
                .map(|(key, weight)| Leaf { key, weight })
                .collect(),
            ..KeyTree::default()
        };
        if !tree.leaves.is_empty() {
            tree.root = Some(tree.build(0, tree.leaves.len()));
        }
        Ok(tree)
    }

    /// The subtrie of the sorted leaves `lo..hi`: the highest bit where the first and last
    /// key differ splits them, and the two runs either side become its children.
    fn build(&mut self, lo: usize, hi: usize) -> Ref {
        if hi - lo == 1 {
            return Ref::leaf(lo);
        }
        let first = self.leaves[lo].key;
        let bit = (127 - (first ^ self.leaves[hi - 1].key).leading_zeros()) as u8;
        let mid = lo + self.leaves[lo..hi].partition_point(|leaf| side(leaf.key, bit) == 0);
        let child = [self.build(lo, mid), self.build(mid, hi)];
        let inner = Inner {
            prefix: first & above(bit),
            load: self.load(child[0]) + self.load(child[1]),
            child,
            first: lo as u32,
            bit,
        };
        self.inners.push(inner);
        Ref::inner(self.inners.len() - 1)
    }

    /// Adds `key` with `weight`; refuses a key already held.
    pub fn insert(&mut self, key: u128, weight: u64) -> Result<(), u128> {
        if self.weight(key).is_some() {
            return Err(key);
        }
        let leaf = Ref::leaf(self.alloc_leaf(Leaf { key, weight }));
        let Some(mut cur) = self.root else {
            self.root = Some(leaf);
            return Ok(());
        };
        // The slot that points at `cur`: None for the root, else (inner, side).
        let mut slot: Option<(usize, usize)> = None;
        loop {
            let other = match cur.as_leaf() {
                Some(l) => self.leaves[l].key,
                None => {
                    let first_key = self.leaves[self.inners[cur.index()].first as usize].key;
                    let node = &mut self.inners[cur.index()];
                    if key & above(node.bit) == node.prefix {
                        node.load = node.load + Load::one(weight);
                        if key < first_key {
                            node.first = leaf.index() as u32;
                        }
                        let s = side(key, node.bit);
                        slot = Some((cur.index(), s));
                        cur = node.child[s];
                        continue;
                    }
                    node.prefix
                }
            };
            let bit = (127 - (key ^ other).leading_zeros()) as u8;
            let mut child = [cur, cur];
            child[side(key, bit)] = leaf;
            let inner = Inner {
                prefix: key & above(bit),
                load: self.load(cur) + Load::one(weight),
                child,
                first: self.first_leaf(child[0]) as u32,
                bit,
            };
            let new = Ref::inner(self.alloc_inner(inner));
            self.set_slot(slot, new);
            return Ok(());
        }
    }

    /// Removes `key`, answering its weight; `None` when it was not held.
    pub fn remove(&mut self, key: u128) -> Option<u64> {
        let weight = self.weight(key)?;
        let mut cur = self.root.expect("a held key implies a root");
        let mut slot: Option<(usize, usize)> = None;
        let mut parent_slot: Option<(usize, usize)> = None;
        // Inner nodes above the parent whose smallest key is the one leaving.
        let mut led: Vec<usize> = Vec::new();
        while cur.as_leaf().is_none() {
            let node = &mut self.inners[cur.index()];
            node.load = node.load - Load::one(weight);
            let s = side(key, node.bit);
            if let Some((above, _)) = slot
                && self.leaves[self.inners[above].first as usize].key == key
            {
                led.push(above);
            }
            parent_slot = slot;
            slot = Some((cur.index(), s));
            cur = self.inners[cur.index()].child[s];
        }
        self.free_leaves.push(cur.index());
        match slot {
            None => self.root = None,
            Some((parent, s)) => {
                // The parent had two children; its other child takes its place.
                let sibling = self.inners[parent].child[1 - s];
                self.free_inners.push(parent);
                self.set_slot(parent_slot, sibling);
                let first = self.first_leaf(sibling) as u32;
                for node in led {
                    self.inners[node].first = first;
                }
            }
        }
        Some(weight)
    }

    /// Every held key with its weight, in ascending key order.
    pub fn iter(&self) -> impl Iterator<Item = (u128, u64)> + '_ {
        let mut stack: Vec<Ref> = self.root.into_iter().collect();
        std::iter::from_fn(move || {
            while let Some(r) = stack.pop() {
                match r.as_leaf() {
                    Some(l) => return Some((self.leaves[l].key, self.leaves[l].weight)),
                    None => {
                        let node = &self.inners[r.index()];
                        stack.push(node.child[1]);
                        stack.push(node.child[0]);
                    }
                }
            }
            None
        })
    }

    /// The node holding every key, if any.
    pub fn root(&self) -> Option<NodeRef> {
        self.root.map(NodeRef)
    }

    /// Count and weight below `node`.
    pub fn node_load(&self, node: Option<NodeRef>) -> Load {
        node.map_or(Load::default(), |n| self.load(n.0))
    }

    /// The smallest key below `node`, with its weight.
    pub fn node_first(&self, node: Option<NodeRef>) -> Option<(u128, u64)> {
        let leaf = &self.leaves[self.first_leaf(node?.0)];
        Some((leaf.key, leaf.weight))
    }

    /// Splits `node`, whose keys all share the bits above `bit`, into the keys with `bit`
    /// clear and those with it set.
    pub fn halves(&self, node: Option<NodeRef>, bit: u8) -> [Option<NodeRef>; 2] {
        let Some(NodeRef(r)) = node else {
            return [None, None];
        };
        let (split_bit, any_key) = match r.as_leaf() {
            Some(l) => (None, self.leaves[l].key),
            None => {
                let inner = &self.inners[r.index()];
                debug_assert!(inner.bit <= bit, "node spans more than the block");
                (Some(inner), inner.prefix)
            }
        };
        match split_bit {
            Some(inner) if inner.bit == bit => inner.child.map(|c| Some(NodeRef(c))),
            // Every key below agrees on `bit`.
            _ => {
                let mut halves = [None, None];
                halves[side(any_key, bit)] = node;
                halves
            }
        }
    }

    fn first_leaf(&self, r: Ref) -> usize {
        match r.as_leaf() {
            Some(l) => l,
            None => self.inners[r.index()].first as usize,
        }
    }

    fn load(&self, r: Ref) -> Load {
        match r.as_leaf() {
            Some(l) => Load::one(self.leaves[l].weight),
            None => self.inners[r.index()].load,
        }
    }

    fn set_slot(&mut self, slot: Option<(usize, usize)>, to: Ref) {
        match slot {
            None => self.root = Some(to),
            Some((inner, s)) => self.inners[inner].child[s] = to,
        }
    }

    fn alloc_leaf(&mut self, leaf: Leaf) -> usize {
        match self.free_leaves.pop() {
            Some(i) => {
                self.leaves[i] = leaf;
                i
            }
            None => {
                self.leaves.push(leaf);
                self.leaves.len() - 1
            }
        }
    }

    fn alloc_inner(&mut self, inner: Inner) -> usize {
        match self.free_inners.pop() {
            Some(i) => {
                self.inners[i] = inner;
                i
            }
            None => {
                self.inners.push(inner);
                self.inners.len() - 1
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    fn brute_load(model: &BTreeMap<u128, u64>, lo: u128, hi: u128) -> Load {
        model
            .range(lo..=hi)
            .fold(Load::default(), |acc, (_, w)| acc + Load::one(*w))
    }

    #[test]
    fn extremes_and_neighbours() {
        let mut tree = KeyTree::new();
        for key in [0, u128::MAX, 1, u128::MAX - 1, 1 << 127, (1 << 127) - 1] {
            tree.insert(key, 2).unwrap();
        }
        assert_eq!(tree.insert(0, 1), Err(0));
        assert_eq!(
            tree.total(),
            Load {
                count: 6,
                weight: 12
            }
        );
        assert_eq!(tree.load_in(0, u128::MAX).count, 6);
        assert_eq!(tree.load_in(1, u128::MAX - 1).count, 4);
        assert_eq!(tree.below(1 << 127).0.count, 3);
        assert_eq!(tree.remove(1 << 127), Some(2));
        assert_eq!(tree.remove(1 << 127), None);
        assert_eq!(tree.len(), 5);
    }

    /// A key drawn so that tests hit shared prefixes, neighbours and the extremes.
    fn key() -> impl Strategy<Value = u128> {
        prop_oneof![
            any::<u128>(),
            0u128..64,
            (u128::MAX - 64)..=u128::MAX,
            (0u32..128).prop_map(|b| 1u128 << b),
        ]
    }

    /// Every query of `tree` answers as the brute-force `model` does.
    fn assert_matches(
        tree: &KeyTree,
        model: &BTreeMap<u128, u64>,
        probes: &[(u128, u128)],
    ) -> Result<(), TestCaseError> {
        prop_assert_eq!(tree.total(), brute_load(model, 0, u128::MAX));
        // Following the halves down to any aligned block finds its load and first key.
        for (key, _) in probes {
            let mut node = tree.root();
            for bit in (0..128u32).rev() {
                let block = if bit == 127 {
                    0..=u128::MAX
                } else {
                    let start = key & (!0u128 << (bit + 1));
                    start..=start + ((1u128 << (bit + 1)) - 1)
                };
                prop_assert_eq!(
                    tree.node_load(node),
                    brute_load(model, *block.start(), *block.end())
                );
                let first = model.range(block.clone()).next().map(|(k, w)| (*k, *w));
                prop_assert_eq!(tree.node_first(node), first);
                node = tree.halves(node, bit as u8)[side(*key, bit as u8)];
            }
        }
        prop_assert!(
            tree.iter().eq(model.iter().map(|(k, w)| (*k, *w))),
            "in-order walk"
        );
        for &(a, b) in probes {
            let (lo, hi) = (a.min(b), a.max(b));
            prop_assert_eq!(tree.load_in(lo, hi), brute_load(model, lo, hi));
            prop_assert_eq!(tree.weight(a), model.get(&a).copied());
        }
        Ok(())
    }

    proptest! {
        #[test]
        fn matches_a_sorted_map(
            ops in prop::collection::vec((key(), 1u64..5, any::<bool>()), 1..200),
            probes in prop::collection::vec((key(), key()), 1..20),
        ) {
            let mut tree = KeyTree::new();
            let mut model = BTreeMap::new();
            for (key, weight, insert) in ops {
                if insert {
                    let expected = if let std::collections::btree_map::Entry::Vacant(e) = model.entry(key) {
                        e.insert(weight);
                        Ok(())
                    } else {
                        Err(key)
                    };
                    prop_assert_eq!(tree.insert(key, weight), expected);
                } else {
                    prop_assert_eq!(tree.remove(key), model.remove(&key));
                }
            }
            assert_matches(&tree, &model, &probes)?;
        }

        #[test]
        fn building_at_once_matches_inserting(
            keys in prop::collection::btree_map(key(), 1u64..5, 0..200),
            later in prop::collection::vec((key(), 1u64..5, any::<bool>()), 0..50),
            probes in prop::collection::vec((key(), key()), 1..20),
        ) {
            let mut model = keys;
            let mut tree = KeyTree::from_entries(model.iter().map(|(k, w)| (*k, *w)).collect()).unwrap();
            assert_matches(&tree, &model, &probes)?;
            // The built trie takes inserts and removals like any other.
            for (key, weight, insert) in later {
                if insert {
                    let fresh = !model.contains_key(&key);
                    prop_assert_eq!(tree.insert(key, weight).is_ok(), fresh);
                    model.entry(key).or_insert(weight);
                } else {
                    prop_assert_eq!(tree.remove(key), model.remove(&key));
                }
            }
            assert_matches(&tree, &model, &probes)?;
        }
    }

    #[test]
    fn building_refuses_a_repeated_key() {
        assert_eq!(
            KeyTree::from_entries(vec![(7, 1), (3, 1), (7, 2)]).unwrap_err(),
            7
        );
        assert!(KeyTree::from_entries(Vec::new()).unwrap().is_empty());
    }
}
