//! Accounts with several keys through random operation sequences, held against a plain
//! model: the spread rule as DESIGN.md words it (checked for every prefix, by brute
//! force), no key held twice, counts and weight sums per shard.

use std::collections::{BTreeMap, HashSet};

use proptest::prelude::*;

use super::tree::Load;
use super::{Allocator, HashKey, Holding, Keyspace, ShardMap, key_weight, plan};

#[derive(Debug, Clone)]
enum Op {
    Allocate {
        fanout: u32,
        extra: u64,
    },
    Resize {
        pick: usize,
        fanout: u32,
    },
    Release {
        pick: usize,
    },
    /// A rebalance over the primary map (or, without one, a uniform map of `shards`).
    Rebalance {
        shards: u64,
    },
    /// The primary stream changes: none, a uniform map, or a random tiling.
    Stream(Option<Vec<u128>>),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        5 => (1u32..=12, 0u64..3).prop_map(|(fanout, extra)| Op::Allocate { fanout, extra }),
        3 => (any::<usize>(), 1u32..=12).prop_map(|(pick, fanout)| Op::Resize { pick, fanout }),
        1 => any::<usize>().prop_map(|pick| Op::Release { pick }),
        1 => (1u64..=8).prop_map(|shards| Op::Rebalance { shards }),
        1 => prop::option::of(prop::collection::btree_set(1u128..u128::MAX, 0..7))
            .prop_map(|cuts| Op::Stream(cuts.map(|c| c.into_iter().collect()))),
    ]
}

/// A map whose shards start at 0 and at each cut.
fn map_of(cuts: &[u128]) -> ShardMap {
    let starts: Vec<u128> = std::iter::once(0).chain(cuts.iter().copied()).collect();
    ShardMap::explicit(Keyspace::KINESIS, super::shards::tiling(&starts)).unwrap()
}

/// The rule for one length `k` (DESIGN.md's words): on a map of S shards, min(k, S)
/// distinct shards with ⌊k/S⌋ or ⌈k/S⌉ keys each; without one, k distinct segments of the
/// uniform map of 2^⌈log2 k⌉ shards.
fn rule(primary: Option<&ShardMap>, keys: &[HashKey]) -> bool {
    let k = keys.len();
    match primary {
        Some(map) => {
            let s = map.len();
            let mut counts = vec![0usize; s];
            for key in keys {
                counts[map.index_of(*key)] += 1;
            }
            counts.iter().filter(|&&c| c > 0).count() == k.min(s)
                && counts.iter().all(|&c| c == k / s || c == k.div_ceil(s))
        }
        None => {
            let segments = k.next_power_of_two() as u64;
            let uniform = ShardMap::uniform(Keyspace::KINESIS, segments).unwrap();
            let used: HashSet<usize> = keys.iter().map(|key| uniform.index_of(*key)).collect();
            used.len() == k
        }
    }
}

/// The rule for every prefix: what keeps shrinking free of moves.
fn spread(primary: Option<&ShardMap>, keys: &[HashKey]) -> bool {
    (1..=keys.len()).all(|k| rule(primary, &keys[..k]))
}

struct Account {
    keys: Vec<HashKey>,
    weight: u64,
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]
    #[test]
    fn fanned_out_accounts_stay_spread_through_any_operations(
        ops in prop::collection::vec(op(), 1..60),
    ) {
        let mut alloc = Allocator::new(Keyspace::KINESIS);
        let mut primary: Option<ShardMap> = None;
        let mut accounts: BTreeMap<String, Account> = BTreeMap::new();
        // Accounts a stream change left unspread, until a rebalance mends them.
        let mut broken: HashSet<String> = HashSet::new();
        let mut next = 0;
        for op in ops {
            match op {
                Op::Allocate { fanout, extra } => {
                    let weight = u64::from(fanout) + extra;
                    let weights: Vec<u64> = (0..fanout).map(|i| key_weight(weight, fanout, i)).collect();
                    let keys = alloc.allocate_keys(&weights).unwrap();
                    prop_assert_eq!(keys.len(), fanout as usize);
                    next += 1;
                    accounts.insert(format!("acct-{next}"), Account { keys, weight });
                }
                Op::Resize { pick, fanout } => {
                    let Some(name) = accounts.keys().nth(pick % accounts.len().max(1)).cloned() else { continue };
                    let a = accounts.get_mut(&name).unwrap();
                    let weight = a.weight.max(u64::from(fanout));
                    // Shrink: release from the top; then every kept key takes its new share.
                    for key in a.keys.drain((fanout as usize).min(a.keys.len())..) {
                        alloc.remove(key).unwrap();
                    }
                    let k = a.keys.len() as u32;
                    for (i, key) in a.keys.iter().enumerate() {
                        alloc.set_weight(*key, key_weight(weight, fanout, i as u32)).unwrap();
                    }
                    let weights: Vec<u64> = (k..fanout).map(|i| key_weight(weight, fanout, i)).collect();
                    alloc.extend_keys(&mut a.keys, &weights).unwrap();
                    a.weight = weight;
                }
                Op::Release { pick } => {
                    let Some(name) = accounts.keys().nth(pick % accounts.len().max(1)).cloned() else { continue };
                    for key in accounts.remove(&name).unwrap().keys {
                        alloc.remove(key).unwrap();
                    }
                    broken.remove(&name);
                }
                Op::Rebalance { shards } => {
                    let map = primary.clone().unwrap_or_else(|| ShardMap::uniform(Keyspace::KINESIS, shards).unwrap());
                    let holdings = accounts.iter().flat_map(|(name, a)| {
                        let fanout = a.keys.len() as u32;
                        a.keys.iter().enumerate().map(move |(i, key)| Holding {
                            account: name,
                            index: i as u32,
                            fanout,
                            key: *key,
                            weight: key_weight(a.weight, fanout, i as u32),
                            created_at: 0,
                        })
                    });
                    let p = plan(&mut alloc, &map, holdings);
                    p.apply(&mut alloc).unwrap();
                    for m in &p.moves {
                        let a = accounts.get_mut(&m.account).unwrap();
                        prop_assert_eq!(a.keys[m.index as usize], m.from);
                        a.keys[m.index as usize] = m.to;
                    }
                    // The rebalance mends every account (there is always room on 2^128 keys):
                    // checked below for all of them.
                    broken.clear();
                    let loads: Vec<Load> = map.iter().map(|s| alloc.load_in(s.start, s.end)).collect();
                    prop_assert_eq!(super::Skew::of(&loads), p.after.clone());
                }
                Op::Stream(cuts) => {
                    primary = cuts.map(|c| map_of(&c));
                    alloc.balance_on(primary.clone());
                    broken = accounts
                        .iter()
                        .filter(|(_, a)| !spread(primary.as_ref(), &a.keys))
                        .map(|(name, _)| name.clone())
                        .collect();
                    // The allocator's own check agrees with the model's.
                    for (name, a) in &accounts {
                        prop_assert_eq!(alloc.spread().holds(&a.keys), !broken.contains(name));
                    }
                }
            }
            for (name, a) in &accounts {
                if !broken.contains(name) {
                    prop_assert!(spread(primary.as_ref(), &a.keys), "{name}: {:?} on {:?}", a.keys, primary);
                }
            }
            // No key held twice; the tree holds exactly the model's keys and weights.
            let mut held: BTreeMap<u128, u64> = BTreeMap::new();
            for a in accounts.values() {
                let fanout = a.keys.len() as u32;
                for (i, key) in a.keys.iter().enumerate() {
                    prop_assert!(held.insert(key.0, key_weight(a.weight, fanout, i as u32)).is_none(), "{key} twice");
                }
            }
            let tree: BTreeMap<u128, u64> = alloc.iter().map(|(k, w)| (k.0, w)).collect();
            prop_assert_eq!(&tree, &held);
        }
    }
}

/// A unit-weight rebalance over the primary map moves exactly the excess when nothing
/// stops it, and never stacks an account's keys: the fewest moves of single keys.
#[test]
fn unit_rebalance_moves_single_keys_and_no_more_than_the_excess() {
    let mut alloc = Allocator::new(Keyspace::KINESIS);
    // Keys placed with no map, then a 3-shard primary registered: uneven.
    let mut accounts: Vec<(String, Vec<HashKey>)> = Vec::new();
    for (n, fanout) in [1u32, 4, 1, 2, 7, 1, 1, 3].into_iter().enumerate() {
        let keys = alloc.allocate_keys(&vec![1; fanout as usize]).unwrap();
        accounts.push((format!("a{n}"), keys));
    }
    let map = ShardMap::uniform(Keyspace::KINESIS, 3).unwrap();
    alloc.balance_on(Some(map.clone()));
    let holdings: Vec<Holding<'_>> = accounts
        .iter()
        .flat_map(|(name, keys)| {
            keys.iter().enumerate().map(|(i, key)| Holding {
                account: name,
                index: i as u32,
                fanout: keys.len() as u32,
                key: *key,
                weight: 1,
                created_at: 0,
            })
        })
        .collect();
    let p = plan(&mut alloc, &map, holdings);
    // Past the mends, exactly the excess moves: the fewest single-key moves there are.
    let mut mended = alloc.clone();
    for m in &p.moves[..p.mends] {
        mended.remove(m.from).unwrap();
        mended.insert(m.to, m.weight).unwrap();
    }
    let excess: u64 = map
        .iter()
        .map(|s| mended.load_in(s.start, s.end).count.saturating_sub(p.cap))
        .sum();
    assert!(p.mends > 0, "the stream change left accounts unspread");
    assert_eq!((p.moves.len() - p.mends) as u64, excess);
    p.apply(&mut alloc).unwrap();
    let mut keys: BTreeMap<&str, Vec<HashKey>> = accounts
        .iter()
        .map(|(n, k)| (n.as_str(), k.clone()))
        .collect();
    for m in &p.moves {
        keys.get_mut(m.account.as_str()).unwrap()[m.index as usize] = m.to;
    }
    for (name, k) in &keys {
        assert!(spread(Some(&map), k), "{name}: {k:?}");
    }
    assert!(p.complete);
    assert!(p.after.max <= p.cap);
    let counts: Vec<u64> = map
        .iter()
        .map(|s| alloc.load_in(s.start, s.end).count)
        .collect();
    assert_eq!(counts.iter().sum::<u64>(), 20);
    assert!(counts.iter().all(|&c| c == 6 || c == 7), "{counts:?}");
}
