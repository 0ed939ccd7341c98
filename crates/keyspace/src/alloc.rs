//! The balanced walk that picks the next hash key (seed 000's tree, by weight).
//!
//! The keyspace `[lo, hi]` is read as an implicit binary search tree: the node for an
//! interval holds its middle key `lo + ceil((hi - lo) / 2)`, its children are the intervals
//! either side of it. To allocate, take the node's key if it is free, else descend into the
//! child holding less weight (ties go left), skipping children with no free key. On a
//! power-of-two keyspace this is the tree of DESIGN.md: 64, 32, 96, 16, 80, ... for 7 bits.

use super::balance::ShardBalance;
use super::shards::ShardMap;
use super::spread::{self, Spread};
use super::tree::{KeyTree, Load};
use super::{Error, HashKey, Keyspace};

/// The held keys of one keyspace and the walk that chooses new ones.
#[derive(Debug, Clone)]
pub struct Allocator {
    keyspace: Keyspace,
    tree: KeyTree,
    /// Set when a primary stream's map decides which shard a new key goes to.
    balance: Option<ShardBalance>,
    /// Keys held but not counted: the old keys of staged moves, taken until their switch
    /// (in the tree with weight 0, so the walk passes them by, and left out of every load).
    reserved: std::collections::BTreeSet<u128>,
}

impl Allocator {
    pub fn new(keyspace: Keyspace) -> Self {
        Allocator {
            keyspace,
            tree: KeyTree::new(),
            balance: None,
            reserved: Default::default(),
        }
    }

    /// An allocator already holding `keys` with their weights, built at once; refuses a key
    /// outside the keyspace or held twice.
    pub fn with_keys(keyspace: Keyspace, keys: Vec<(HashKey, u64)>) -> Result<Self, Error> {
        let entries = keys
            .into_iter()
            .map(|(key, weight)| keyspace.check(key).map(|key| (key.0, weight)))
            .collect::<Result<_, _>>()?;
        let tree = KeyTree::from_entries(entries).map_err(|key| Error::KeyTaken(HashKey(key)))?;
        Ok(Allocator {
            keyspace,
            tree,
            balance: None,
            reserved: Default::default(),
        })
    }

    /// Balances new keys over `map`'s shards from now on (`None`: over the whole keyspace).
    pub fn balance_on(&mut self, map: Option<ShardMap>) {
        self.balance = map.map(|map| {
            let loads = map.iter().map(|s| self.load_in(s.start, s.end)).collect();
            ShardBalance::new(map, loads)
        });
    }

    /// The map new keys balance on, if any.
    pub fn balanced_map(&self) -> Option<&ShardMap> {
        self.balance.as_ref().map(ShardBalance::map)
    }

    pub fn keyspace(&self) -> Keyspace {
        self.keyspace
    }

    /// Count and weight of all held keys (reserved ones aside).
    pub fn total(&self) -> Load {
        self.tree.total() - Load::many(self.reserved.len() as u64)
    }

    /// Count and weight of the held keys in `[lo, hi]` (reserved ones aside).
    pub fn load_in(&self, lo: HashKey, hi: HashKey) -> Load {
        let reserved = match lo <= hi {
            true => self.reserved.range(lo.0..=hi.0).count() as u64,
            false => 0,
        };
        self.tree.load_in(lo.0, hi.0) - Load::many(reserved)
    }

    /// Every held key with its weight, in key order (reserved ones aside).
    pub fn iter(&self) -> impl Iterator<Item = (HashKey, u64)> + '_ {
        self.tree
            .iter()
            .filter(|(k, _)| !self.reserved.contains(k))
            .map(|(k, w)| (HashKey(k), w))
    }

    /// Takes `key` without counting it anywhere: no allocation gets it until
    /// [`Allocator::unreserve`], and no load includes it.
    pub fn reserve(&mut self, key: HashKey) -> Result<(), Error> {
        self.keyspace.check(key)?;
        self.tree
            .insert(key.0, 0)
            .map_err(|_| Error::KeyTaken(key))?;
        self.reserved.insert(key.0);
        Ok(())
    }

    /// Frees a key [`Allocator::reserve`] took.
    pub fn unreserve(&mut self, key: HashKey) -> Result<(), Error> {
        if !self.reserved.remove(&key.0) {
            return Err(Error::KeyNotHeld(key));
        }
        self.tree.remove(key.0).ok_or(Error::KeyNotHeld(key))?;
        Ok(())
    }

    /// Whether `key` is reserved.
    pub fn is_reserved(&self, key: HashKey) -> bool {
        self.reserved.contains(&key.0)
    }

    /// Nodes of the key tree in use.
    pub fn tree_nodes(&self) -> usize {
        self.tree.nodes()
    }

    /// The weight of `key`, if held.
    pub fn weight(&self, key: HashKey) -> Option<u64> {
        self.tree.weight(key.0)
    }

    /// The key to hand out next: inside the lightest shard of the balanced map if there is
    /// one, else anywhere the walk picks. Changes nothing.
    pub fn next_key(&self) -> Result<HashKey, Error> {
        let Some(balance) = &self.balance else {
            return self.walk_keyspace();
        };
        self.first_fit(balance.lightest_first().map(|(_, lo, hi)| (lo, hi)))
    }

    /// The walk's pick in the first of `ranges` that has a free key.
    fn first_fit(
        &self,
        ranges: impl IntoIterator<Item = (HashKey, HashKey)>,
    ) -> Result<HashKey, Error> {
        for (lo, hi) in ranges {
            match self.next_key_in(lo, hi) {
                Err(Error::Full { .. }) => continue,
                picked => return picked,
            }
        }
        Err(Error::Full {
            lo: HashKey(0),
            hi: self.keyspace.max(),
        })
    }

    /// The key the walk picks next inside `[lo, hi]`. Changes nothing.
    pub fn next_key_in(&self, lo: HashKey, hi: HashKey) -> Result<HashKey, Error> {
        let full = Error::Full { lo, hi };
        let (mut lo, mut hi) = (lo.0, hi.0.min(self.keyspace.max().0));
        if lo > hi {
            return Err(full);
        }
        let mut load = self.tree.load_in(lo, hi);
        if is_full(load, lo, hi) {
            return Err(full);
        }
        // Load strictly below `lo`, carried so each level costs one prefix query.
        let mut before = self.tree.below(lo).0;
        loop {
            let key = lo + (hi - lo) / 2 + (hi - lo) % 2;
            let (below_key, held) = self.tree.below(key);
            let Some(weight) = held else {
                return Ok(HashKey(key));
            };
            let left = below_key - before;
            let right = load - left - Load::one(weight);
            let left_open = key > lo && !is_full(left, lo, key - 1);
            let right_open = key < hi && !is_full(right, key + 1, hi);
            let go_left = match (left_open, right_open) {
                (true, true) => left.weight <= right.weight,
                (open_left, _) => open_left,
            };
            if go_left {
                hi = key - 1;
                load = left;
            } else {
                debug_assert!(right_open, "a non-full interval has a free key");
                lo = key + 1;
                load = right;
                before = below_key + Load::one(weight);
            }
        }
    }

    /// The walk over the whole keyspace, in O(depth) rather than a prefix query per level.
    ///
    /// On `[0, 2^bits)` every interval of the walk is an aligned block `[start, start + 2^k)`,
    /// less its first key when that key belongs to an ancestor. Each block's keys are one
    /// trie node, so the trie is followed down alongside the walk; each step is O(1).
    fn walk_keyspace(&self) -> Result<HashKey, Error> {
        let full = || Error::Full {
            lo: HashKey(0),
            hi: self.keyspace.max(),
        };
        let mut start = 0u128;
        let mut k = self.keyspace.bits();
        let mut node = self.tree.root();
        // Weight of the block's first key when an ancestor holds it (it is not the block's).
        let mut excluded: Option<u64> = None;
        let mut load = self.tree.node_load(node);
        if block_is_full(load, k, false) {
            return Err(full());
        }
        loop {
            if k == 0 {
                // A one-key block that is not full: its key is free.
                return Ok(HashKey(start));
            }
            let half = k - 1;
            let key = start + (1u128 << half);
            let [left_node, right_node] = self.tree.halves(node, half as u8);
            let Some(weight) = self
                .tree
                .node_first(right_node)
                .and_then(|(first, w)| (first == key).then_some(w))
            else {
                return Ok(HashKey(key));
            };
            let left = self.tree.node_load(left_node) - excluded.map_or(Load::default(), Load::one);
            let right = self.tree.node_load(right_node) - Load::one(weight);
            let left_open = !block_is_full(left, half, excluded.is_some());
            let right_open = !block_is_full(right, half, true);
            let go_left = match (left_open, right_open) {
                (true, true) => left.weight <= right.weight,
                (open_left, _) => open_left,
            };
            k = half;
            if go_left {
                node = left_node;
                load = left;
            } else {
                node = right_node;
                start = key;
                excluded = Some(weight);
                load = right;
            }
            debug_assert!(!block_is_full(load, k, excluded.is_some() && start != 0));
        }
    }

    /// What an account's several keys must spread over: the balanced map, else segments.
    pub fn spread(&self) -> Spread<'_> {
        match &self.balance {
            Some(balance) => Spread::Shards(balance.map()),
            None => Spread::Segments(self.keyspace),
        }
    }

    /// Places a new account's keys in index order (key `i` of weight `weights[i]`) so that
    /// they spread, and holds them. All or nothing.
    pub fn allocate_keys(&mut self, weights: &[u64]) -> Result<Vec<HashKey>, Error> {
        let mut keys = Vec::with_capacity(weights.len());
        self.extend_keys(&mut keys, weights)?;
        Ok(keys)
    }

    /// Grows an account's `keys` (held, spread, by index) by one key per weight, each
    /// where the spread rule allows it: on the lightest shard its round has not used, or
    /// without a map in the lightest free segment of its level. All or nothing.
    pub fn extend_keys(&mut self, keys: &mut Vec<HashKey>, weights: &[u64]) -> Result<(), Error> {
        let held = keys.len();
        let mut segments = SegmentLoads::default();
        for &weight in weights {
            let picked = if keys.is_empty() {
                self.next_key()
            } else if self.balance.is_some() {
                self.next_key_on_shards(keys)
            } else {
                segments.next_key(self, keys)
            };
            match picked.and_then(|key| self.insert(key, weight).map(|()| key)) {
                Ok(key) => {
                    segments.record(self.keyspace, key, weight);
                    keys.push(key);
                }
                Err(err) => {
                    for key in keys.drain(held..) {
                        self.remove(key).expect("held a moment ago");
                    }
                    return Err(err);
                }
            }
        }
        Ok(())
    }

    /// Grows an account's `keys` (held, spread, by index) by one key per weight, each on
    /// the least-loaded shard of the balanced map its round has not used, by `loads` (per
    /// shard of that map; the shard of least weight among equals), the walk picking the key
    /// inside it; each key placed adds `key_load` to its shard in `loads`, so the next goes
    /// elsewhere. Without a map, as [`Allocator::extend_keys`]. All or nothing.
    pub fn extend_by_load(
        &mut self,
        keys: &mut Vec<HashKey>,
        weights: &[u64],
        loads: &mut [f64],
        key_load: f64,
    ) -> Result<(), Error> {
        if self.balance.is_none() {
            return self.extend_keys(keys, weights);
        }
        let held = keys.len();
        // Each shard's load before a key was added to it, to put back on a refusal.
        let mut was: Vec<(usize, f64)> = Vec::with_capacity(weights.len());
        for &weight in weights {
            let picked = self.next_key_by_load(keys, loads);
            match picked.and_then(|key| self.insert(key, weight).map(|()| key)) {
                Ok(key) => {
                    keys.push(key);
                    let shard = self.balanced_map().expect("balanced").index_of(key);
                    if let Some(load) = loads.get_mut(shard) {
                        was.push((shard, *load));
                        *load += key_load;
                    }
                }
                Err(err) => {
                    for key in keys.drain(held..) {
                        self.remove(key).expect("held a moment ago");
                    }
                    for (shard, load) in was.into_iter().rev() {
                        loads[shard] = load;
                    }
                    return Err(err);
                }
            }
        }
        Ok(())
    }

    /// The key for index `keys.len()` by `loads`: in the least-loaded shard its round has
    /// not used that has a free key.
    fn next_key_by_load(&self, keys: &[HashKey], loads: &[f64]) -> Result<HashKey, Error> {
        let balance = self.balance.as_ref().expect("balanced on a map");
        let map = balance.map();
        let first = keys.len() / map.len() * map.len();
        let used: std::collections::HashSet<usize> =
            keys[first..].iter().map(|k| map.index_of(*k)).collect();
        let load = |s: usize| {
            loads
                .get(s)
                .copied()
                .filter(|l| l.is_finite())
                .unwrap_or(0.0)
        };
        // `lightest_first` orders by weight: a stable sort by load keeps it among equals.
        let mut open: Vec<(f64, usize, HashKey, HashKey)> = balance
            .lightest_first()
            .filter(|(s, ..)| !used.contains(s))
            .map(|(s, lo, hi)| (load(s), s, lo, hi))
            .collect();
        open.sort_by(|a, b| a.0.total_cmp(&b.0));
        self.first_fit(open.into_iter().map(|(_, _, lo, hi)| (lo, hi)))
    }

    /// Grows an account one of whose keys is switching: `now` are its keys in force now,
    /// `after` its keys from its last switch on (by index, as many). Each new key is spread
    /// against both where one key can be; where none can (2 shards, key 0 crossing over),
    /// it is two: one for now, reserved as a staged move's old key is, and one from the
    /// switch on, held. Answers each new key as `(now, after)`. All or nothing.
    pub fn extend_switching(
        &mut self,
        now: &[HashKey],
        after: &[HashKey],
        weights: &[u64],
    ) -> Result<Vec<(HashKey, HashKey)>, Error> {
        let (mut now, mut after) = (now.to_vec(), after.to_vec());
        let mut added: Vec<(HashKey, HashKey)> = Vec::with_capacity(weights.len());
        for &weight in weights {
            match self.place_switching(&now, &after, weight) {
                Ok((key_now, key_after)) => {
                    now.push(key_now);
                    after.push(key_after);
                    added.push((key_now, key_after));
                }
                Err(err) => {
                    for (key_now, key_after) in added {
                        self.remove(key_after).expect("held a moment ago");
                        if key_now != key_after {
                            self.unreserve(key_now).expect("reserved a moment ago");
                        }
                    }
                    return Err(err);
                }
            }
        }
        Ok(added)
    }

    /// Key `now.len()` of a switching account, as [`Allocator::extend_switching`] places it.
    fn place_switching(
        &mut self,
        now: &[HashKey],
        after: &[HashKey],
        weight: u64,
    ) -> Result<(HashKey, HashKey), Error> {
        let (i, max) = (now.len(), self.keyspace.max());
        let both = self.spread().forbidden_at_all(&[now, after], i);
        match self.next_key_outside(&both, HashKey(0), max) {
            Ok(key) => return self.insert(key, weight).map(|()| (key, key)),
            Err(Error::Full { .. }) => {}
            Err(err) => return Err(err),
        }
        let key_after = self.next_key_for(after, i, HashKey(0), max)?;
        self.insert(key_after, weight)?;
        let key_now = self
            .next_key_for(now, i, HashKey(0), max)
            .and_then(|key| self.reserve(key).map(|()| key));
        match key_now {
            Ok(key_now) => Ok((key_now, key_after)),
            Err(err) => {
                self.remove(key_after).expect("held a moment ago");
                Err(err)
            }
        }
    }

    /// The key for index `keys.len()`: in the lightest shard its round has not used.
    fn next_key_on_shards(&self, keys: &[HashKey]) -> Result<HashKey, Error> {
        let balance = self.balance.as_ref().expect("balanced on a map");
        let map = balance.map();
        let first = keys.len() / map.len() * map.len();
        let used: std::collections::HashSet<usize> =
            keys[first..].iter().map(|k| map.index_of(*k)).collect();
        self.first_fit(
            balance
                .lightest_first()
                .filter(|(index, ..)| !used.contains(index))
                .map(|(_, lo, hi)| (lo, hi)),
        )
    }

    /// A new key for index `i` of an account holding `keys` (where `keys[i]`, if there,
    /// is ignored): in the lightest part of `[lo, hi]` the spread rule allows, if any.
    pub fn next_key_for(
        &self,
        keys: &[HashKey],
        i: usize,
        lo: HashKey,
        hi: HashKey,
    ) -> Result<HashKey, Error> {
        self.next_key_outside(&self.spread().forbidden(keys, i), lo, hi)
    }

    /// A new key in the lightest part of `[lo, hi]` outside the `forbidden` ranges (as
    /// [`Spread::forbidden`] answers them), if any: on the balanced map, in the lightest
    /// allowed shard.
    pub fn next_key_outside(
        &self,
        forbidden: &[(HashKey, HashKey)],
        lo: HashKey,
        hi: HashKey,
    ) -> Result<HashKey, Error> {
        let mut parts = spread::allowed_in(forbidden, lo, hi);
        if let Spread::Shards(map) = self.spread() {
            // Whole shards are allowed or not: each its own part.
            parts = parts
                .into_iter()
                .flat_map(|(a, b)| {
                    (map.index_of(a)..=map.index_of(b)).map(move |s| {
                        let shard = map.shard(s);
                        (shard.start.max(a), shard.end.min(b))
                    })
                })
                .collect();
        }
        let mut parts: Vec<(Load, HashKey, HashKey)> = parts
            .into_iter()
            .map(|(a, b)| (self.load_in(a, b), a, b))
            .collect();
        parts.sort_by_key(|(load, a, _)| (load.weight, load.count, *a));
        self.first_fit(parts.into_iter().map(|(_, a, b)| (a, b)))
            .map_err(|err| match err {
                Error::Full { .. } => Error::Full { lo, hi },
                other => other,
            })
    }

    /// Holds `key` with `weight`: a key the walk chose, or one imported from elsewhere.
    pub fn insert(&mut self, key: HashKey, weight: u64) -> Result<(), Error> {
        self.keyspace.check(key)?;
        self.tree
            .insert(key.0, weight)
            .map_err(|_| Error::KeyTaken(key))?;
        if let Some(balance) = &mut self.balance {
            balance.record(key, weight, true);
        }
        Ok(())
    }

    /// Picks the next key and holds it.
    pub fn allocate(&mut self, weight: u64) -> Result<HashKey, Error> {
        let key = self.next_key()?;
        self.insert(key, weight)?;
        Ok(key)
    }

    /// Frees `key`, answering the weight it had; a reserved key is freed only by
    /// [`Allocator::unreserve`].
    pub fn remove(&mut self, key: HashKey) -> Result<u64, Error> {
        if self.is_reserved(key) {
            return Err(Error::KeyNotHeld(key));
        }
        let weight = self.tree.remove(key.0).ok_or(Error::KeyNotHeld(key))?;
        if let Some(balance) = &mut self.balance {
            balance.record(key, weight, false);
        }
        Ok(weight)
    }

    /// Changes the weight of a held key.
    pub fn set_weight(&mut self, key: HashKey, weight: u64) -> Result<(), Error> {
        self.remove(key)?;
        self.insert(key, weight)
    }
}

/// Loads of the segments of one level, kept while one account's keys are placed: each
/// new key goes to the lightest segment of its level that holds none of the earlier keys
/// (O(2^level) a key, 2^level ≤ 2 × fanout).
#[derive(Debug, Default)]
struct SegmentLoads {
    level: Option<u32>,
    loads: Vec<Load>,
    /// Segments holding one of the account's keys, or with no free key left.
    closed: Vec<bool>,
}

impl SegmentLoads {
    /// The key for index `keys.len()` (at least 1) without a map.
    fn next_key(&mut self, alloc: &Allocator, keys: &[HashKey]) -> Result<HashKey, Error> {
        let keyspace = alloc.keyspace;
        let level = spread::level(keys.len()).min(keyspace.bits());
        if self.level != Some(level) {
            self.level = Some(level);
            self.loads = (0..1u128 << level)
                .map(|s| {
                    let (lo, hi) = segment_bounds(keyspace, level, s);
                    alloc.load_in(lo, hi)
                })
                .collect();
            self.closed = vec![false; self.loads.len()];
            for key in keys {
                self.closed[segment_of(keyspace, level, *key)] = true;
            }
        }
        loop {
            let lightest = (0..self.loads.len())
                .filter(|&s| !self.closed[s])
                .min_by_key(|&s| (self.loads[s].weight, self.loads[s].count, s));
            let Some(s) = lightest else {
                return Err(Error::Full {
                    lo: HashKey(0),
                    hi: keyspace.max(),
                });
            };
            let (lo, hi) = segment_bounds(keyspace, level, s as u128);
            match alloc.next_key_in(lo, hi) {
                Err(Error::Full { .. }) => self.closed[s] = true,
                picked => return picked,
            }
        }
    }

    /// Counts a key of the account just held.
    fn record(&mut self, keyspace: Keyspace, key: HashKey, weight: u64) {
        if let Some(level) = self.level {
            let s = segment_of(keyspace, level, key);
            self.loads[s] = self.loads[s] + Load::one(weight);
            self.closed[s] = true;
        }
    }
}

/// Which segment of `level` (at most the keyspace's width) `key` lies in.
fn segment_of(keyspace: Keyspace, level: u32, key: HashKey) -> usize {
    key.0.checked_shr(keyspace.bits() - level).unwrap_or(0) as usize
}

/// The inclusive range of segment `s` of `level` (at most the keyspace's width).
fn segment_bounds(keyspace: Keyspace, level: u32, s: u128) -> (HashKey, HashKey) {
    let shift = keyspace.bits() - level;
    if shift >= 128 {
        return (HashKey(0), keyspace.max());
    }
    let start = s << shift;
    (HashKey(start), HashKey(start + ((1u128 << shift) - 1)))
}

/// Whether every free slot of the block `[start, start + 2^k)` is held, one slot fewer
/// when its first key belongs to an ancestor.
fn block_is_full(load: Load, k: u32, excluded: bool) -> bool {
    if k >= 64 {
        return false; // more slots than a u64 count can fill
    }
    load.count == (1u64 << k) - u64::from(excluded)
}

/// Whether every key of `[lo, hi]` is held.
fn is_full(load: Load, lo: u128, hi: u128) -> bool {
    // Compared as `count - 1 == hi - lo` so the full 128-bit interval does not overflow.
    load.count > 0 && (load.count - 1) as u128 == hi - lo
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    fn seven_bits() -> Allocator {
        Allocator::new(Keyspace::new(7).unwrap())
    }

    fn take(alloc: &mut Allocator, n: usize) -> Vec<u128> {
        (0..n).map(|_| alloc.allocate(1).unwrap().0).collect()
    }

    #[test]
    fn golden_sequence_from_empty() {
        let mut alloc = seven_bits();
        assert_eq!(
            take(&mut alloc, 15),
            [64, 32, 96, 16, 80, 48, 112, 8, 72, 40, 104, 24, 88, 56, 120]
        );
    }

    #[test]
    fn built_at_once_walks_as_inserted_one_by_one() {
        let keys = [0, 32, 9, 57].map(|k| (HashKey(k), 1));
        let mut built = Allocator::with_keys(Keyspace::new(7).unwrap(), keys.to_vec()).unwrap();
        assert_eq!(take(&mut built, 8), [64, 96, 80, 112, 72, 48, 104, 16]);
        let seven = Keyspace::new(7).unwrap();
        assert!(matches!(
            Allocator::with_keys(seven, vec![(HashKey(5), 1), (HashKey(5), 2)]),
            Err(Error::KeyTaken(HashKey(5)))
        ));
        assert!(matches!(
            Allocator::with_keys(seven, vec![(HashKey(128), 1)]),
            Err(Error::HashKeyOutOfRange { .. })
        ));
    }

    #[test]
    fn golden_sequence_around_imported_keys() {
        let mut alloc = seven_bits();
        for key in [0, 32, 9, 57] {
            alloc.insert(HashKey(key), 1).unwrap();
        }
        assert_eq!(take(&mut alloc, 8), [64, 96, 80, 112, 72, 48, 104, 16]);
    }

    #[test]
    fn first_128_bit_key_is_half_the_keyspace() {
        let mut alloc = Allocator::new(Keyspace::KINESIS);
        assert_eq!(
            alloc.allocate(1).unwrap().to_string(),
            "170141183460469231731687303715884105728"
        );
    }

    #[test]
    fn released_keys_are_refilled_first() {
        let mut alloc = seven_bits();
        take(&mut alloc, 7);
        alloc.remove(HashKey(32)).unwrap();
        alloc.remove(HashKey(112)).unwrap();
        assert_eq!(take(&mut alloc, 2), [32, 112]);
    }

    #[test]
    fn extremes_can_be_imported() {
        let mut alloc = seven_bits();
        alloc.insert(HashKey(0), 1).unwrap();
        alloc.insert(HashKey(127), 1).unwrap();
        assert_eq!(
            alloc.insert(HashKey(128), 1),
            Err(Error::HashKeyOutOfRange {
                key: HashKey(128),
                max: HashKey(127)
            })
        );
        assert_eq!(
            alloc.insert(HashKey(0), 1),
            Err(Error::KeyTaken(HashKey(0)))
        );
        assert_eq!(take(&mut alloc, 3), [64, 32, 96]);
    }

    #[test]
    fn weight_steers_the_walk() {
        let mut alloc = seven_bits();
        alloc.allocate(1).unwrap(); // 64
        alloc.insert(HashKey(10), 5).unwrap(); // left now weighs 5
        assert_eq!(alloc.allocate(1).unwrap(), HashKey(96));
        assert_eq!(alloc.allocate(1).unwrap(), HashKey(80));
        alloc.set_weight(HashKey(10), 1).unwrap();
        // Left weighs 1, right weighs 2: back to the left.
        assert_eq!(alloc.allocate(1).unwrap(), HashKey(32));
    }

    #[test]
    fn fills_every_key_then_reports_full() {
        let mut alloc = Allocator::new(Keyspace::new(4).unwrap());
        let mut keys = take(&mut alloc, 16);
        keys.sort();
        assert_eq!(keys, (0..16).collect::<Vec<_>>());
        assert_eq!(
            alloc.allocate(1),
            Err(Error::Full {
                lo: HashKey(0),
                hi: HashKey(15)
            })
        );
    }

    #[test]
    fn walk_restricted_to_a_range() {
        let mut alloc = seven_bits();
        assert_eq!(
            alloc.next_key_in(HashKey(10), HashKey(20)).unwrap(),
            HashKey(15)
        );
        alloc.insert(HashKey(15), 1).unwrap();
        assert_eq!(
            alloc.next_key_in(HashKey(10), HashKey(20)).unwrap(),
            HashKey(12)
        );
        assert_eq!(
            alloc.next_key_in(HashKey(15), HashKey(15)),
            Err(Error::Full {
                lo: HashKey(15),
                hi: HashKey(15)
            })
        );
    }

    /// Every N from 1 to 10,000 at once: the sequence from empty is deterministic, so
    /// checking each prefix covers every N exhaustively.
    #[test]
    fn unit_allocations_stay_even_on_every_power_of_two_map() {
        use crate::ShardMap;
        let mut alloc = Allocator::new(Keyspace::KINESIS);
        // Up to 65,536 shards, past what a stream may register: built from their ranges.
        let maps: Vec<ShardMap> = (0..=16)
            .map(|p| {
                let step = u128::MAX >> p;
                let starts: Vec<u128> = (0..1u128 << p).map(|i| i * step + i).collect();
                let tiling = crate::shards::tiling(&starts);
                ShardMap::explicit(Keyspace::KINESIS, tiling).unwrap()
            })
            .collect();
        // Per map: count per shard, the minimum count and how many shards sit at it.
        let mut counts: Vec<Vec<u32>> = maps.iter().map(|m| vec![0; m.len()]).collect();
        let mut floor: Vec<(u32, usize)> = maps.iter().map(|m| (0, m.len())).collect();
        for n in 1..=10_000 {
            let key = alloc.allocate(1).unwrap();
            for (m, map) in maps.iter().enumerate() {
                let shard = map.index_of(key);
                let (min, at_min) = &mut floor[m];
                // Counts stay within {min, min + 1} only if each key lands on a shard at min.
                assert_eq!(
                    counts[m][shard],
                    *min,
                    "N={n}, {} shards: shard {shard} would exceed min + 1",
                    map.len()
                );
                counts[m][shard] += 1;
                *at_min -= 1;
                if *at_min == 0 {
                    *min += 1;
                    *at_min = map.len();
                }
            }
        }
    }

    #[derive(Debug, Clone)]
    enum Op {
        Allocate(u64),
        Release(usize),
        Import(u128, u64),
        Reweight(usize, u64),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => (1u64..=10).prop_map(Op::Allocate),
            2 => any::<usize>().prop_map(Op::Release),
            2 => (any::<u128>(), 1u64..=10).prop_map(|(k, w)| Op::Import(k, w)),
            1 => (any::<usize>(), 1u64..=10).prop_map(|(i, w)| Op::Reweight(i, w)),
        ]
    }

    fn nth_key(model: &BTreeMap<u128, u64>, i: usize) -> Option<u128> {
        (!model.is_empty()).then(|| *model.keys().nth(i % model.len()).unwrap())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(128))]
        #[test]
        fn invariants_hold_after_any_operations(
            bits in prop_oneof![1u32..=8, Just(64u32), Just(127u32), Just(128u32)],
            ops in prop::collection::vec(op(), 1..300),
            probes in prop::collection::vec((any::<u128>(), any::<u128>()), 8),
        ) {
            let keyspace = Keyspace::new(bits).unwrap();
            let max = keyspace.max().0;
            let mut alloc = Allocator::new(keyspace);
            let mut model: BTreeMap<u128, u64> = BTreeMap::new();
            for op in ops {
                match op {
                    Op::Allocate(w) => match alloc.allocate(w) {
                        Ok(key) => {
                            prop_assert!(key.0 <= max, "{key} outside the keyspace");
                            prop_assert!(model.insert(key.0, w).is_none(), "{key} handed out twice");
                        }
                        Err(Error::Full { .. }) => prop_assert_eq!(model.len() as u128 - 1, max),
                        Err(e) => prop_assert!(false, "unexpected {e}"),
                    },
                    Op::Release(i) => {
                        if let Some(key) = nth_key(&model, i) {
                            prop_assert_eq!(alloc.remove(HashKey(key)), Ok(model.remove(&key).unwrap()));
                        }
                    }
                    Op::Import(k, w) => {
                        let key = k & max;
                        let expected = if model.contains_key(&key) { Err(Error::KeyTaken(HashKey(key))) } else { Ok(()) };
                        prop_assert_eq!(alloc.insert(HashKey(key), w), expected.clone());
                        if expected.is_ok() {
                            model.insert(key, w);
                        }
                    }
                    Op::Reweight(i, w) => {
                        if let Some(key) = nth_key(&model, i) {
                            alloc.set_weight(HashKey(key), w).unwrap();
                            model.insert(key, w);
                        }
                    }
                }
            }
            let recount = |lo: u128, hi: u128| {
                model.range(lo..=hi).fold(Load::default(), |acc, (_, w)| acc + Load::one(*w))
            };
            prop_assert_eq!(alloc.total(), recount(0, max));
            // The O(depth) walk and the general one agree on the whole keyspace.
            prop_assert_eq!(alloc.walk_keyspace(), alloc.next_key_in(HashKey(0), keyspace.max()));
            for (a, b) in probes {
                let (lo, hi) = ((a & max).min(b & max), (a & max).max(b & max));
                prop_assert_eq!(alloc.load_in(HashKey(lo), HashKey(hi)), recount(lo, hi));
            }
        }
    }

    /// Random tilings of the keyspace into `shards` ranges.
    fn random_map() -> impl Strategy<Value = crate::ShardMap> {
        prop::collection::btree_set(1u128..u128::MAX, 0..40).prop_map(|cuts| {
            let starts: Vec<u128> = std::iter::once(0).chain(cuts).collect();
            let open = crate::shards::tiling(&starts);
            crate::ShardMap::explicit(Keyspace::KINESIS, open).unwrap()
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        #[test]
        fn a_primary_map_stays_within_one_account_at_every_moment(
            map in random_map(),
            imported in prop::collection::vec(any::<u128>(), 0..20),
            n in 1usize..400,
        ) {
            let mut alloc = Allocator::new(Keyspace::KINESIS);
            alloc.balance_on(Some(map.clone()));
            let shards = map.len() as u64;
            // Any starting point: imported keys, then only new allocations.
            for key in imported {
                let _ = alloc.insert(HashKey(key), 1);
            }
            let count = |alloc: &Allocator| -> Vec<u64> {
                map.iter().map(|s| alloc.load_in(s.start, s.end).count).collect()
            };
            let start = count(&alloc);
            let (start_max, start_min) = (*start.iter().max().unwrap(), *start.iter().min().unwrap());
            for _ in 0..n {
                let key = alloc.allocate(1).unwrap();
                let counts = count(&alloc);
                let total: u64 = counts.iter().sum();
                let max = *counts.iter().max().unwrap();
                // From an even start every shard stays at or below ceil(N / S); from an
                // uneven one, new keys only ever fill the emptiest shard.
                if start_max - start_min <= 1 {
                    prop_assert!(max <= total.div_ceil(shards), "{counts:?}");
                } else {
                    prop_assert!(max <= start_max.max(total.div_ceil(shards)), "{counts:?}");
                }
                let shard = map.shard_of(key);
                prop_assert!(shard.start <= key && key <= shard.end);
            }
        }

        #[test]
        fn primary_loads_follow_releases_and_weights(
            map in random_map(),
            ops in prop::collection::vec((0u8..3, any::<usize>(), 1u64..5), 1..200),
        ) {
            let mut alloc = Allocator::new(Keyspace::KINESIS);
            alloc.balance_on(Some(map.clone()));
            let mut held: Vec<HashKey> = Vec::new();
            for (op, pick, weight) in ops {
                match op {
                    0 => held.push(alloc.allocate(weight).unwrap()),
                    1 if !held.is_empty() => {
                        let key = held.swap_remove(pick % held.len());
                        alloc.remove(key).unwrap();
                    }
                    _ if !held.is_empty() => alloc.set_weight(held[pick % held.len()], weight).unwrap(),
                    _ => {}
                }
            }
            // The incremental loads equal a fresh count: rebuilding the balance changes nothing.
            let next = alloc.next_key();
            alloc.balance_on(Some(map.clone()));
            prop_assert_eq!(alloc.next_key(), next);
        }
    }

    #[test]
    fn a_key_added_while_key_0_crosses_two_shards_switches_the_other_way() {
        let map = crate::ShardMap::uniform(Keyspace::new(7).unwrap(), 2).unwrap();
        let mut alloc = Allocator::new(Keyspace::new(7).unwrap());
        alloc.balance_on(Some(map.clone()));
        // Key 0 moving from shard 0 (10) to shard 1 (100): its old key reserved.
        alloc.insert(HashKey(100), 1).unwrap();
        alloc.reserve(HashKey(10)).unwrap();
        let added = alloc
            .extend_switching(&[HashKey(10)], &[HashKey(100)], &[1])
            .unwrap();
        let (now, after) = added[0];
        assert_eq!((map.index_of(now), map.index_of(after)), (1, 0));
        assert!(alloc.is_reserved(now));
        assert_eq!(alloc.weight(after), Some(1));
    }

    /// An account of `held` keys spread on `map`, some of which a staged move switches:
    /// answers its keys now and after the switch, with the allocator holding them as the
    /// registry does (old keys reserved).
    fn switching_account(
        alloc: &mut Allocator,
        held: usize,
        moving: &[bool],
    ) -> (Vec<HashKey>, Vec<HashKey>) {
        let now = alloc.allocate_keys(&vec![1; held]).unwrap();
        let mut after = now.clone();
        let max = alloc.keyspace().max();
        for i in (0..held).filter(|&i| moving[i]) {
            let to = alloc.next_key_for(&after, i, HashKey(0), max).unwrap();
            alloc.insert(to, 1).unwrap();
            alloc.remove(now[i]).unwrap();
            alloc.reserve(now[i]).unwrap();
            after[i] = to;
        }
        (now, after)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(128))]
        #[test]
        fn keys_added_while_others_switch_spread_now_and_after_the_switch(
            shards in prop::option::of(1u64..6),
            others in prop::collection::vec(0u128..128, 0..40),
            held in 1usize..5,
            moving in prop::collection::vec(any::<bool>(), 5),
            grow in 1usize..6,
        ) {
            let keyspace = Keyspace::new(7).unwrap();
            let map = shards.map(|s| crate::ShardMap::uniform(keyspace, s).unwrap());
            let mut alloc = Allocator::new(keyspace);
            alloc.balance_on(map.clone());
            for key in others {
                let _ = alloc.insert(HashKey(key), 1);
            }
            let (now, after) = switching_account(&mut alloc, held, &moving);
            let spread = alloc.spread();
            prop_assume!(spread.holds(&now) && spread.holds(&after));
            let before = alloc.clone();
            let added = match alloc.extend_switching(&now, &after, &vec![1; grow]) {
                Ok(added) => added,
                Err(Error::Full { .. }) => {
                    // All or nothing: a refusal leaves every key as it was.
                    prop_assert_eq!(alloc.iter().collect::<Vec<_>>(), before.iter().collect::<Vec<_>>());
                    return Ok(());
                }
                Err(err) => return Err(TestCaseError::fail(format!("{err}"))),
            };
            let spread = alloc.spread();
            let grown_now: Vec<HashKey> = now.iter().copied().chain(added.iter().map(|p| p.0)).collect();
            let grown_after: Vec<HashKey> = after.iter().copied().chain(added.iter().map(|p| p.1)).collect();
            prop_assert!(spread.holds(&grown_now), "now {grown_now:?}");
            prop_assert!(spread.holds(&grown_after), "after {grown_after:?}");
            for (key_now, key_after) in added {
                prop_assert!(before.weight(key_after).is_none() && before.weight(key_now).is_none());
                prop_assert_eq!(alloc.weight(key_after), Some(1));
                // A key for now differs from its key after the switch only as a staged old key.
                prop_assert_eq!(alloc.is_reserved(key_now), key_now != key_after);
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]
        #[test]
        fn keys_added_by_load_go_to_the_least_loaded_shard_without_the_accounts_keys(
            shards in 1u64..8,
            others in prop::collection::vec(0u128..128, 0..30),
            held in 0usize..4,
            loads in prop::collection::vec(prop_oneof![Just(0.0), 0.0..2.0f64], 8),
            grow in 1usize..6,
            key_load in 0.0..1.0f64,
        ) {
            let keyspace = Keyspace::new(7).unwrap();
            let map = crate::ShardMap::uniform(keyspace, shards).unwrap();
            let mut alloc = Allocator::new(keyspace);
            alloc.balance_on(Some(map.clone()));
            for key in others {
                let _ = alloc.insert(HashKey(key), 1);
            }
            let mut keys = alloc.allocate_keys(&vec![1; held]).unwrap_or_default();
            let mut loads = loads[..map.len()].to_vec();
            let (before, held) = (alloc.clone(), keys.len());
            let mut expected = loads.clone();
            match alloc.extend_by_load(&mut keys, &vec![1; grow], &mut loads, key_load) {
                Ok(()) => {}
                Err(Error::Full { .. }) => {
                    // All or nothing: a refusal leaves every key and load as it was.
                    prop_assert_eq!(alloc.iter().collect::<Vec<_>>(), before.iter().collect::<Vec<_>>());
                    prop_assert_eq!(&keys[..], &keys[..held]);
                    prop_assert_eq!(loads, expected);
                    return Ok(());
                }
                Err(err) => return Err(TestCaseError::fail(format!("{err}"))),
            }
            prop_assert_eq!(keys.len(), held + grow);
            prop_assert!(alloc.spread().holds(&keys), "{keys:?}");
            // Each new key, in order, on a least-loaded shard among those with a free key
            // that its round leaves open; the loads it saw count the keys placed before it.
            let mut walked = before.clone();
            for i in held..keys.len() {
                let first = i / map.len() * map.len();
                let used: Vec<usize> = keys[first..i].iter().map(|k| map.index_of(*k)).collect();
                let open: Vec<usize> = (0..map.len())
                    .filter(|s| !used.contains(s))
                    .filter(|&s| walked.next_key_in(map.shard(s).start, map.shard(s).end).is_ok())
                    .collect();
                let least = open.iter().map(|&s| expected[s]).fold(f64::INFINITY, f64::min);
                let shard = map.index_of(keys[i]);
                prop_assert!(open.contains(&shard), "key {i} on shard {shard}, open {open:?}");
                prop_assert!(expected[shard] <= least, "key {i} on {shard} at {} > {least}", expected[shard]);
                walked.insert(keys[i], 1).unwrap();
                expected[shard] += key_load;
            }
            prop_assert_eq!(loads, expected);
        }
    }
}
