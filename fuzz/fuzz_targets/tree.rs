//! `KeyTree` and `Allocator` under any sequence of operations, checked against a sorted map
//! and a brute-force version of DESIGN.md's walk: counts, weights, order, prefix loads,
//! aligned blocks, and every key the allocator picks (whole keyspace, a range, or the
//! lightest shard of a balanced map) is exactly the walk's pick: free and inside the range.
#![no_main]

use std::collections::BTreeMap;

use arbitrary::Arbitrary;
use keyspread::keyspace::{
    Allocator, Error, HashKey, KeyTree, Keyspace, Load, MAX_WEIGHT, ShardMap,
};
use libfuzzer_sys::fuzz_target;

/// How a key is chosen: anywhere, or near the places where trees go wrong.
#[derive(Arbitrary, Debug, Clone, Copy)]
enum Pick {
    Any(u128),
    Low(u8),
    High(u8),
    PowerOfTwo(u8, i8),
    NearHeld(u16, i8),
    /// Past the keyspace's top (for small keyspaces).
    Beyond(u8),
}

#[derive(Arbitrary, Debug)]
enum Op {
    Insert(Pick, u32),
    Remove(Pick),
    Reweight(Pick, u32),
    Allocate(u32),
    Next,
    NextIn(Pick, Pick),
    Below(Pick),
    LoadIn(Pick, Pick),
    Weight(Pick),
    Iter,
    Blocks(Pick),
    Uniform(u8),
    Explicit(Vec<Pick>),
    Unbalanced,
}

#[derive(Arbitrary, Debug)]
struct Input {
    bits: u8,
    ops: Vec<Op>,
}

type Model = BTreeMap<u128, u64>;

struct State {
    keyspace: Keyspace,
    max: u128,
    alloc: Allocator,
    tree: KeyTree,
    model: Model,
    map: Option<ShardMap>,
}

fn weight(w: u32) -> u64 {
    1 + u64::from(w) % MAX_WEIGHT
}

fn load(model: &Model, lo: u128, hi: u128) -> Load {
    if lo > hi {
        return Load::default();
    }
    model
        .range(lo..=hi)
        .fold(Load::default(), |acc, (_, w)| acc + Load::one(*w))
}

fn full(model: &Model, lo: u128, hi: u128) -> bool {
    let count = load(model, lo, hi).count;
    count > 0 && (count - 1) as u128 == hi - lo
}

/// The walk as DESIGN.md states it, over `[lo, hi]`: take the middle key if free, else go to
/// the side (excluding that key) of less weight that still has a free key, ties left.
fn walk(model: &Model, lo: u128, hi: u128) -> Option<u128> {
    let (mut lo, mut hi) = (lo, hi);
    if lo > hi || full(model, lo, hi) {
        return None;
    }
    loop {
        let span = hi - lo;
        let key = lo + span / 2 + span % 2;
        if !model.contains_key(&key) {
            return Some(key);
        }
        let left_open = key > lo && !full(model, lo, key - 1);
        let right_open = key < hi && !full(model, key + 1, hi);
        let go_left = match (left_open, right_open) {
            (true, true) => load(model, lo, key - 1).weight <= load(model, key + 1, hi).weight,
            (left, right) => {
                assert!(left || right, "a non-full interval has a free key");
                left
            }
        };
        if go_left {
            hi = key - 1;
        } else {
            lo = key + 1;
        }
    }
}

impl State {
    fn key(&self, pick: Pick) -> u128 {
        match pick {
            Pick::Any(k) => k & self.max,
            Pick::Low(k) => u128::from(k) & self.max,
            Pick::High(k) => self.max.saturating_sub(u128::from(k)),
            Pick::PowerOfTwo(b, d) => {
                let base = 1u128 << (u32::from(b) % self.keyspace.bits());
                base.wrapping_add_signed(i128::from(d)) & self.max
            }
            Pick::NearHeld(i, d) => match self.model.len() {
                0 => 0,
                n => {
                    let held = *self.model.keys().nth(usize::from(i) % n).expect("i < n");
                    held.wrapping_add_signed(i128::from(d)) & self.max
                }
            },
            Pick::Beyond(k) => self.max.saturating_add(1 + u128::from(k)),
        }
    }

    /// What `next_key` must answer: the walk over the whole keyspace, or inside the first
    /// non-full shard by (weight, count, index) when a map balances.
    fn expected_next(&self) -> Result<HashKey, Error> {
        let full = Error::Full {
            lo: HashKey(0),
            hi: self.keyspace.max(),
        };
        let Some(map) = &self.map else {
            return walk(&self.model, 0, self.max).map(HashKey).ok_or(full);
        };
        let mut order: Vec<_> = map
            .iter()
            .map(|s| {
                let l = load(&self.model, s.start.0, s.end.0);
                (l.weight, l.count, s.index, s.start.0, s.end.0)
            })
            .collect();
        order.sort();
        order
            .into_iter()
            .find_map(|(_, _, _, lo, hi)| walk(&self.model, lo, hi))
            .map(HashKey)
            .ok_or(full)
    }

    fn insert(&mut self, key: u128, w: u64) {
        let expected = if key > self.max {
            Err(Error::HashKeyOutOfRange {
                key: HashKey(key),
                max: self.keyspace.max(),
            })
        } else if self.model.contains_key(&key) {
            Err(Error::KeyTaken(HashKey(key)))
        } else {
            Ok(())
        };
        assert_eq!(self.alloc.insert(HashKey(key), w), expected);
        if expected.is_ok() {
            assert_eq!(self.tree.insert(key, w), Ok(()));
            self.model.insert(key, w);
        } else if key <= self.max {
            assert_eq!(self.tree.insert(key, w), Err(key));
        }
    }

    fn remove(&mut self, key: u128) {
        let held = self.model.remove(&key);
        assert_eq!(self.alloc.remove(HashKey(key)).ok(), held);
        assert_eq!(self.tree.remove(key), held);
    }

    fn apply(&mut self, op: Op) {
        match op {
            Op::Insert(p, w) => self.insert(self.key(p), weight(w)),
            Op::Remove(p) => self.remove(self.key(p)),
            Op::Reweight(p, w) => {
                let (key, w) = (self.key(p), weight(w));
                let expected = match self.model.get_mut(&key) {
                    Some(old) => {
                        *old = w;
                        Ok(())
                    }
                    None => Err(Error::KeyNotHeld(HashKey(key))),
                };
                assert_eq!(self.alloc.set_weight(HashKey(key), w), expected);
                if expected.is_ok() {
                    assert!(self.tree.remove(key).is_some());
                    assert_eq!(self.tree.insert(key, w), Ok(()));
                }
            }
            Op::Allocate(w) => {
                let expected = self.expected_next();
                let got = self.alloc.allocate(weight(w));
                assert_eq!(got, expected);
                if let Ok(key) = got {
                    assert!(key.0 <= self.max);
                    assert_eq!(self.model.insert(key.0, weight(w)), None, "{key} was held");
                    assert_eq!(self.tree.insert(key.0, weight(w)), Ok(()));
                } else {
                    assert!(full(&self.model, 0, self.max));
                }
            }
            Op::Next => assert_eq!(self.alloc.next_key(), self.expected_next()),
            Op::NextIn(a, b) => {
                let (lo, hi) = (self.key(a), self.key(b));
                let got = self.alloc.next_key_in(HashKey(lo), HashKey(hi));
                let expected =
                    walk(&self.model, lo, hi.min(self.max))
                        .map(HashKey)
                        .ok_or(Error::Full {
                            lo: HashKey(lo),
                            hi: HashKey(hi),
                        });
                assert_eq!(got, expected, "next_key_in({lo}, {hi})");
                if let Ok(key) = got {
                    assert!(lo <= key.0 && key.0 <= hi.min(self.max));
                    assert!(!self.model.contains_key(&key.0));
                }
            }
            Op::Below(p) => {
                let key = self.key(p);
                let below =
                    load(&self.model, 0, key).count - u64::from(self.model.contains_key(&key));
                let (got, at) = self.tree.below(key);
                assert_eq!(got.count, below);
                assert_eq!(
                    got,
                    load(&self.model, 0, key) - at.map_or(Load::default(), Load::one)
                );
                assert_eq!(at, self.model.get(&key).copied());
            }
            Op::LoadIn(a, b) => {
                let (lo, hi) = (self.key(a), self.key(b));
                let (lo, hi) = (lo.min(hi), lo.max(hi));
                let expected = load(&self.model, lo, hi);
                assert_eq!(self.tree.load_in(lo, hi), expected);
                assert_eq!(self.alloc.load_in(HashKey(lo), HashKey(hi)), expected);
            }
            Op::Weight(p) => {
                let key = self.key(p);
                assert_eq!(self.tree.weight(key), self.model.get(&key).copied());
                assert_eq!(
                    self.alloc.weight(HashKey(key)),
                    self.model.get(&key).copied()
                );
            }
            Op::Iter => self.check_all(),
            Op::Blocks(p) => self.check_blocks(self.key(p)),
            Op::Uniform(n) => self.balance(ShardMap::uniform(self.keyspace, u64::from(n)).ok()),
            Op::Explicit(cuts) => {
                let mut starts: Vec<u128> = cuts.iter().map(|p| self.key(*p)).collect();
                starts.retain(|s| *s <= self.max);
                starts.push(0);
                starts.sort_unstable();
                starts.dedup();
                let open = starts
                    .iter()
                    .enumerate()
                    .map(|(i, s)| {
                        let end = starts.get(i + 1).map_or(self.max, |n| n - 1);
                        (format!("s{i}"), HashKey(*s), HashKey(end))
                    })
                    .collect();
                let map = ShardMap::explicit(self.keyspace, open).expect("a tiling");
                self.balance(Some(map));
            }
            Op::Unbalanced => self.balance(None),
        }
    }

    fn balance(&mut self, map: Option<ShardMap>) {
        self.alloc.balance_on(map.clone());
        assert_eq!(self.alloc.balanced_map(), map.as_ref());
        self.map = map;
    }

    /// Totals and in-order walks of both structures equal the model.
    fn check_all(&self) {
        let total = load(&self.model, 0, u128::MAX);
        assert_eq!(self.tree.total(), total);
        assert_eq!(self.alloc.total(), total);
        assert_eq!(self.tree.len(), self.model.len() as u64);
        assert_eq!(self.tree.is_empty(), self.model.is_empty());
        let model: Vec<(u128, u64)> = self.model.iter().map(|(k, w)| (*k, *w)).collect();
        assert!(self.tree.iter().eq(model.iter().copied()), "tree order");
        assert!(
            self.alloc
                .iter()
                .map(|(k, w)| (k.0, w))
                .eq(model.iter().copied()),
            "allocator order"
        );
        let first = model.first().copied();
        assert_eq!(self.tree.node_first(self.tree.root()), first);
    }

    /// Following `halves` from the root towards `key` finds each aligned block's load and
    /// smallest key.
    fn check_blocks(&self, key: u128) {
        let mut node = self.tree.root();
        for bit in (0..128u32).rev() {
            let (lo, hi) = if bit == 127 {
                (0, u128::MAX)
            } else {
                let lo = key & (!0u128 << (bit + 1));
                (lo, lo + ((1u128 << (bit + 1)) - 1))
            };
            assert_eq!(
                self.tree.node_load(node),
                load(&self.model, lo, hi),
                "block {lo}..={hi}"
            );
            let first = self.model.range(lo..=hi).next().map(|(k, w)| (*k, *w));
            assert_eq!(self.tree.node_first(node), first);
            node = self.tree.halves(node, bit as u8)[((key >> bit) & 1) as usize];
        }
    }
}

fuzz_target!(|input: Input| {
    // Mostly tiny keyspaces, where ranges fill up; sometimes the production one.
    let bits = match input.bits % 16 {
        b @ 1..=10 => u32::from(b),
        11 => 16,
        12 => 64,
        13 => 127,
        _ => 128,
    };
    let keyspace = Keyspace::new(bits).expect("1..=128 bits");
    let mut state = State {
        keyspace,
        max: keyspace.max().0,
        alloc: Allocator::new(keyspace),
        tree: KeyTree::new(),
        model: Model::new(),
        map: None,
    };
    for op in input.ops.into_iter().take(512) {
        state.apply(op);
    }
    state.check_all();
    state.check_blocks(state.model.keys().next().copied().unwrap_or(0));
});
