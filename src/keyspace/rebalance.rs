//! Rebalance planning: the fewest moves that bring every shard to at most ceil(n / shards)
//! accounts, each to a key the balanced walk picks inside its new shard.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use super::shards::{ShardMap, Skew};
use super::tree::Load;
use super::{Allocator, HashKey};

/// An account's current key, as the planner sees it.
#[derive(Debug, Clone)]
pub struct Holding<'a> {
    pub account: &'a str,
    pub key: HashKey,
    pub weight: u64,
    /// Creation time; the newest accounts move first, as producers have cached them least.
    pub created_at: i64,
}

/// One account moving from one key to another.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Move {
    pub account: String,
    pub from: HashKey,
    pub to: HashKey,
    pub from_shard: usize,
    pub to_shard: usize,
    pub weight: u64,
}

/// A rebalance plan and what it does to the shards.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    /// Most accounts a shard may hold afterwards: ceil(accounts / shards).
    pub cap: u64,
    pub moves: Vec<Move>,
    pub before: Skew,
    pub after: Skew,
    /// False when some shard stays above `cap` because every further move would have
    /// made the heaviest shard heavier (only possible with unequal weights).
    pub complete: bool,
}

impl Plan {
    /// Performs the moves on `alloc`, in order.
    pub fn apply(&self, alloc: &mut Allocator) -> Result<(), super::Error> {
        for m in &self.moves {
            alloc.remove(m.from)?;
            alloc.insert(m.to, m.weight)?;
        }
        Ok(())
    }

    /// Reverts [`Plan::apply`].
    fn undo(&self, alloc: &mut Allocator) {
        for m in self.moves.iter().rev() {
            alloc.remove(m.to).expect("planned key is held");
            alloc
                .insert(m.from, m.weight)
                .expect("original key is free");
        }
    }
}

/// Plans a rebalance of `holdings` (every held key of `alloc`) over `map`.
///
/// `alloc` is left exactly as it was; call [`Plan::apply`] once the moves are durable.
pub fn plan<'a>(
    alloc: &mut Allocator,
    map: &ShardMap,
    holdings: impl IntoIterator<Item = Holding<'a>>,
) -> Plan {
    let mut loads: Vec<Load> = map.iter().map(|s| alloc.load_in(s.start, s.end)).collect();
    let before = Skew::of(&loads);
    let cap = before.accounts.div_ceil(before.shards);
    let heaviest = before.max_weight;

    let mut leaving = over_cap_holdings(map, &loads, cap, holdings);
    // Heaviest movers first, into the lightest shards: keeps the heaviest shard from growing.
    leaving.sort_by(|a, b| b.weight.cmp(&a.weight).then(a.account.cmp(b.account)));

    let mut targets: BinaryHeap<Reverse<(u64, u64, usize)>> = loads
        .iter()
        .enumerate()
        .filter(|(_, l)| l.count < cap)
        .map(|(i, l)| Reverse((l.weight, l.count, i)))
        .collect();
    let mut plan = Plan {
        cap,
        moves: Vec::new(),
        before,
        after: Skew::of(&loads),
        complete: true,
    };
    for holding in leaving {
        let Some(m) = place(alloc, map, &mut targets, &loads, heaviest, &holding) else {
            plan.complete = false;
            continue;
        };
        loads[m.from_shard] = loads[m.from_shard] - Load::one(m.weight);
        loads[m.to_shard] = loads[m.to_shard] + Load::one(m.weight);
        let target = loads[m.to_shard];
        if target.count < cap {
            targets.push(Reverse((target.weight, target.count, m.to_shard)));
        }
        plan.moves.push(m);
    }
    plan.after = Skew::of(&loads);
    plan.undo(alloc);
    plan
}

/// The holdings that must leave their shard, chosen per shard: lightest first, then newest.
fn over_cap_holdings<'a>(
    map: &ShardMap,
    loads: &[Load],
    cap: u64,
    holdings: impl IntoIterator<Item = Holding<'a>>,
) -> Vec<Holding<'a>> {
    let mut per_shard: Vec<Vec<Holding<'a>>> = vec![Vec::new(); loads.len()];
    for h in holdings {
        let shard = map.index_of(h.key);
        if loads[shard].count > cap {
            per_shard[shard].push(h);
        }
    }
    let mut leaving = Vec::new();
    for (shard, mut held) in per_shard.into_iter().enumerate() {
        let excess = (loads[shard].count.saturating_sub(cap)) as usize;
        held.sort_by(|a, b| {
            (a.weight, Reverse(a.created_at), a.account).cmp(&(
                b.weight,
                Reverse(b.created_at),
                b.account,
            ))
        });
        leaving.extend(held.into_iter().take(excess));
    }
    leaving
}

/// Moves one holding into the lightest shard that still has room, if that keeps every
/// shard at or below `heaviest`; the move is performed on `alloc`.
fn place(
    alloc: &mut Allocator,
    map: &ShardMap,
    targets: &mut BinaryHeap<Reverse<(u64, u64, usize)>>,
    loads: &[Load],
    heaviest: u64,
    holding: &Holding<'_>,
) -> Option<Move> {
    while let Some(Reverse((weight, count, shard))) = targets.pop() {
        if loads[shard] != (Load { count, weight }) {
            continue; // stale heap entry
        }
        if weight + holding.weight > heaviest {
            // The lightest target is too heavy, so every other one is as well.
            targets.push(Reverse((weight, count, shard)));
            return None;
        }
        let range = map.shard(shard);
        alloc.remove(holding.key).expect("holding is held");
        match alloc.next_key_in(range.start, range.end) {
            Ok(to) => {
                alloc
                    .insert(to, holding.weight)
                    .expect("walk picks a free key");
                return Some(Move {
                    account: holding.account.to_owned(),
                    from: holding.key,
                    to,
                    from_shard: map.index_of(holding.key),
                    to_shard: shard,
                    weight: holding.weight,
                });
            }
            // Every key of this shard is held (tiny keyspaces only): drop it as a target.
            Err(_) => alloc
                .insert(holding.key, holding.weight)
                .expect("key was just freed"),
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keyspace::Keyspace;
    use proptest::prelude::*;

    struct Fixture {
        alloc: Allocator,
        held: Vec<(String, HashKey, u64)>,
    }

    impl Fixture {
        fn new(bits: u32) -> Self {
            Fixture {
                alloc: Allocator::new(Keyspace::new(bits).unwrap()),
                held: Vec::new(),
            }
        }

        fn import(&mut self, key: u128, weight: u64) {
            self.alloc.insert(HashKey(key), weight).unwrap();
            self.held
                .push((format!("acct-{key}"), HashKey(key), weight));
        }

        fn plan(&mut self, shards: u64) -> Plan {
            let map = ShardMap::uniform(self.alloc.keyspace(), shards).unwrap();
            let holdings = self.held.iter().enumerate().map(|(i, (a, k, w))| Holding {
                account: a,
                key: *k,
                weight: *w,
                created_at: i as i64,
            });
            plan(&mut self.alloc, &map, holdings)
        }
    }

    #[test]
    fn moves_the_minimum_into_the_emptiest_shards() {
        let mut f = Fixture::new(7);
        for key in [1, 2, 3, 4, 5, 6, 70] {
            f.import(key, 1);
        }
        let before = f.alloc.total();
        let plan = f.plan(4);
        // 7 accounts over 4 shards: cap 2; shard 0 holds 6 so 4 must move.
        assert_eq!(plan.cap, 2);
        assert_eq!(plan.moves.len(), 4);
        assert!(plan.complete);
        assert_eq!((plan.before.max, plan.after.max), (6, 2));
        // Newest first: accounts imported last leave first.
        let leaving: Vec<_> = plan.moves.iter().map(|m| m.from.0).collect();
        assert_eq!(leaving, [3, 4, 5, 6]);
        // The planner leaves the allocator untouched.
        assert_eq!(f.alloc.total(), before);
        assert!(f.alloc.weight(HashKey(6)).is_some());
        // Each target key is the walk's pick inside its shard.
        assert_eq!(plan.moves[0].to, HashKey(48));
        plan.apply(&mut f.alloc).unwrap();
        assert_eq!(f.alloc.load_in(HashKey(0), HashKey(31)).count, 2);
    }

    #[test]
    fn balanced_state_needs_no_moves() {
        let mut f = Fixture::new(7);
        for key in [64, 32, 96, 16] {
            f.import(key, 1);
        }
        let plan = f.plan(4);
        assert!(plan.moves.is_empty());
        assert_eq!(plan.before, plan.after);
    }

    #[test]
    fn never_makes_the_heaviest_shard_heavier() {
        let mut f = Fixture::new(7);
        // Shard 0 of 2: three accounts of weight 10; shard 1: one of weight 30.
        for key in [1, 2, 3] {
            f.import(key, 10);
        }
        f.import(100, 30);
        let plan = f.plan(2);
        assert!(plan.moves.is_empty());
        assert!(!plan.complete);
        assert_eq!(plan.after.max_weight, 30);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(128))]
        #[test]
        fn plans_are_minimal_and_never_heavier(
            keys in prop::collection::btree_set(any::<u128>(), 0..120),
            weights in prop::collection::vec(1u64..=5, 120),
            unit in any::<bool>(),
            shards in 1u64..=20,
        ) {
            let mut f = Fixture::new(128);
            for (key, w) in keys.iter().zip(&weights) {
                f.import(*key, if unit { 1 } else { *w });
            }
            let total_before = f.alloc.total();
            let map = ShardMap::uniform(Keyspace::KINESIS, shards).unwrap();
            let plan = f.plan(shards);
            prop_assert_eq!(f.alloc.total(), total_before);
            let counts: Vec<u64> = map.iter().map(|s| f.alloc.load_in(s.start, s.end).count).collect();
            let excess: u64 = counts.iter().map(|c| c.saturating_sub(plan.cap)).sum();
            if unit {
                prop_assert_eq!(plan.moves.len() as u64, excess, "exactly minimal");
                prop_assert!(plan.after.max <= plan.cap);
                prop_assert!(plan.complete);
            } else {
                prop_assert!(plan.moves.len() as u64 <= excess);
            }
            prop_assert!(plan.after.max_weight <= plan.before.max_weight);
            for m in &plan.moves {
                let target = map.shard(m.to_shard);
                prop_assert!(target.start <= m.to && m.to <= target.end);
                prop_assert_eq!(map.index_of(m.from), m.from_shard);
            }
            plan.apply(&mut f.alloc).unwrap();
            let after: Vec<Load> = map.iter().map(|s| f.alloc.load_in(s.start, s.end)).collect();
            prop_assert_eq!(Skew::of(&after), plan.after);
        }
    }
}
