//! Rebalance planning: the fewest moves of single keys that bring every shard to at most
//! ceil(keys / shards) keys, each to a key the balanced walk picks inside its new shard,
//! never where an account's other keys forbid it (see [`Spread`](super::Spread)).

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};

use super::shards::{ShardMap, Skew};
use super::spread::Spread;
use super::tree::Load;
use super::{Allocator, Error, HashKey};

/// One key of an account, as the planner sees it.
#[derive(Debug, Clone)]
pub struct Holding<'a> {
    pub account: &'a str,
    /// Which of the account's keys this is, `0..fanout`.
    pub index: u32,
    pub fanout: u32,
    pub key: HashKey,
    /// This key's share of the account's weight.
    pub weight: u64,
    /// Creation time; the newest accounts move first, as producers have cached them least.
    pub created_at: i64,
}

/// One key of an account moving to another.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Move {
    pub account: String,
    pub index: u32,
    pub from: HashKey,
    pub to: HashKey,
    pub from_shard: usize,
    pub to_shard: usize,
    pub weight: u64,
}

/// A rebalance plan and what it does to the shards.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    /// Most keys a shard may hold afterwards: ceil(keys / shards).
    pub cap: u64,
    /// The moves that spread again the keys of accounts a map change left unspread, then
    /// the moves that balance the shards.
    pub moves: Vec<Move>,
    /// How many of `moves`, from the first, mend spread.
    pub mends: usize,
    pub before: Skew,
    pub after: Skew,
    /// False when some shard stays above `cap` because every further move would have
    /// made the heaviest shard heavier (only possible with unequal weights) or would have
    /// stacked an account's keys; or when an account could not be spread again.
    pub complete: bool,
}

impl Plan {
    /// Performs the moves on `alloc`, in order.
    pub fn apply(&self, alloc: &mut Allocator) -> Result<(), Error> {
        apply_moves(&self.moves, alloc)
    }

    /// Reverts [`Plan::apply`].
    fn undo(&self, alloc: &mut Allocator) {
        undo_moves(&self.moves, alloc);
    }
}

/// Performs `moves` on `alloc`, in order.
pub(super) fn apply_moves(moves: &[Move], alloc: &mut Allocator) -> Result<(), Error> {
    for m in moves {
        alloc.remove(m.from)?;
        alloc.insert(m.to, m.weight)?;
    }
    Ok(())
}

/// Moves `from` to `to` while planning: `from` stays taken (reserved) until the plan is
/// undone, as a staged move's old key stays its account's until the switch, so no later
/// move of the same plan lands on it.
pub(super) fn plan_move(alloc: &mut Allocator, from: HashKey, to: HashKey, weight: u64) {
    alloc.insert(to, weight).expect("walk picks a free key");
    alloc.reserve(from).expect("key was just freed");
}

/// Reverts the moves a planner made with [`plan_move`].
pub(super) fn undo_moves(moves: &[Move], alloc: &mut Allocator) {
    for m in moves.iter().rev() {
        alloc.remove(m.to).expect("planned key is held");
        alloc.unreserve(m.from).expect("vacated key is reserved");
        alloc
            .insert(m.from, m.weight)
            .expect("original key is free");
    }
}

/// Plans a rebalance of `holdings` (every held key of `alloc`) over `map`: first the moves
/// that spread every account's keys again (see [`Spread::misplaced`]), then the fewest
/// moves that bring the shards within `cap`.
///
/// `alloc` is left exactly as it was; call [`Plan::apply`] once the moves are durable.
pub fn plan<'a>(
    alloc: &mut Allocator,
    map: &ShardMap,
    holdings: impl IntoIterator<Item = Holding<'a>>,
) -> Plan {
    let mut holdings: Vec<Holding<'a>> = holdings.into_iter().collect();
    let mut loads: Vec<Load> = map.iter().map(|s| alloc.load_in(s.start, s.end)).collect();
    let before = Skew::of(&loads);
    let cap = before.accounts.div_ceil(before.shards);
    let heaviest = before.max_weight;
    let mut plan = Plan {
        cap,
        moves: Vec::new(),
        mends: 0,
        before,
        after: Skew::of(&loads),
        complete: true,
    };

    // The keys of every account that has several, by index.
    let mut fanned: HashMap<&'a str, Vec<HashKey>> = HashMap::new();
    for h in holdings.iter().filter(|h| h.fanout > 1) {
        let keys = fanned
            .entry(h.account)
            .or_insert_with(|| vec![HashKey(0); h.fanout as usize]);
        keys[h.index as usize] = h.key;
    }
    let mut names: Vec<&'a str> = fanned.keys().copied().collect();
    names.sort_unstable();
    for name in names {
        let keys = fanned.get_mut(name).expect("listed");
        if alloc.spread().holds(keys) {
            continue;
        }
        let Some(moved) = mend(alloc, keys) else {
            plan.complete = false;
            continue;
        };
        for (index, from, to) in moved {
            let m = Move {
                account: name.to_owned(),
                index: index as u32,
                from,
                to,
                from_shard: map.index_of(from),
                to_shard: map.index_of(to),
                weight: alloc.weight(to).expect("just placed"),
            };
            loads[m.from_shard] = loads[m.from_shard] - Load::one(m.weight);
            loads[m.to_shard] = loads[m.to_shard] + Load::one(m.weight);
            plan.moves.push(m);
        }
    }
    plan.mends = plan.moves.len();
    // Holdings see where the mends put their keys.
    for h in holdings.iter_mut().filter(|h| h.fanout > 1) {
        h.key = fanned[h.account][h.index as usize];
    }

    let (mut leaving, spares) = over_cap_holdings(map, &loads, cap, holdings);
    // Heaviest movers first, into the lightest shards: keeps the heaviest shard from growing.
    leaving.sort_by(|a, b| b.weight.cmp(&a.weight).then(a.account.cmp(b.account)));

    let mut targets: BinaryHeap<Reverse<(u64, u64, usize)>> = loads
        .iter()
        .enumerate()
        .filter(|(_, l)| l.count < cap)
        .map(|(i, l)| Reverse((l.weight, l.count, i)))
        .collect();
    // Keys moved already: a spare offered to several of its shard's leavers moves once.
    let mut moved: std::collections::HashSet<(&'a str, u32)> = std::collections::HashSet::new();
    for holding in leaving {
        // The holding chosen to leave, else the next candidate of its shard: an account's
        // other keys may leave it nowhere to go.
        let mut placed = None;
        let shard = map.index_of(holding.key);
        let candidates = std::iter::once(holding).chain(spares[shard].iter().cloned());
        for h in candidates.filter(|h| !moved.contains(&(h.account, h.index))) {
            let forbidden = fanned
                .get(h.account)
                .map(|keys| alloc.spread().forbidden(keys, h.index as usize));
            match place(
                alloc,
                map,
                &mut targets,
                &loads,
                heaviest,
                &h,
                forbidden.as_deref(),
            ) {
                Placed::Moved(m) => {
                    placed = Some((h, m));
                    break;
                }
                Placed::NowhereFor => continue,
                Placed::TooHeavy => break,
            }
        }
        let Some((h, m)) = placed else {
            plan.complete = false;
            continue;
        };
        moved.insert((h.account, h.index));
        if let Some(keys) = fanned.get_mut(h.account) {
            keys[h.index as usize] = m.to;
        }
        loads[m.from_shard] = loads[m.from_shard] - Load::one(m.weight);
        loads[m.to_shard] = loads[m.to_shard] + Load::one(m.weight);
        let target = loads[m.to_shard];
        if target.count < cap {
            targets.push(Reverse((target.weight, target.count, m.to_shard)));
        }
        plan.moves.push(m);
    }
    plan.after = Skew::of(&loads);
    // Keys the planner was not given (an account whose move has not switched yet) may
    // keep a shard above the cap too.
    plan.complete &= plan.after.max <= cap;
    plan.undo(alloc);
    plan
}

/// Moves the keys of one account that break the spread rule, on `alloc` and in `keys`;
/// answers `(index, from, to)` per move, or `None` (nothing moved) when no key is free
/// where one must go.
///
/// On a map, each misplaced key goes to the lightest shard no other key of its round
/// holds: there always is one, and no other key needs to move. Without one, keys are
/// taken in index order, each that shares a segment with an earlier one going to the
/// lightest segment of its level the earlier ones leave free.
fn mend(alloc: &mut Allocator, keys: &mut [HashKey]) -> Option<Vec<(usize, HashKey, HashKey)>> {
    let on_shards = matches!(alloc.spread(), Spread::Shards(_));
    let max = alloc.keyspace().max();
    let mut moved = Vec::new();
    let candidates: Vec<usize> = if on_shards {
        alloc.spread().misplaced(keys)
    } else {
        (1..keys.len()).collect()
    };
    for i in candidates {
        let spread = alloc.spread();
        let avoid = if on_shards {
            &keys[..]
        } else {
            if !(0..i).any(|j| spread.conflict(i, keys[i], j, keys[j])) {
                continue;
            }
            &keys[..i]
        };
        let Ok(to) = alloc.next_key_for(avoid, i, HashKey(0), max) else {
            for &(_, from, to) in moved.iter().rev() {
                let weight = alloc.remove(to).expect("placed");
                alloc.unreserve(from).expect("vacated");
                alloc.insert(from, weight).expect("freed");
            }
            for &(index, from, _) in &moved {
                keys[index] = from;
            }
            return None;
        };
        let from = keys[i];
        let weight = alloc.remove(from).expect("holding is held");
        plan_move(alloc, from, to, weight);
        keys[i] = to;
        moved.push((i, from, to));
    }
    Some(moved)
}

/// The holdings that leave a shard over `cap` (per shard: lightest first, then newest),
/// and per shard the remaining candidates, should one of them have nowhere to go.
fn over_cap_holdings<'a>(
    map: &ShardMap,
    loads: &[Load],
    cap: u64,
    holdings: Vec<Holding<'a>>,
) -> (Vec<Holding<'a>>, Vec<Vec<Holding<'a>>>) {
    let mut per_shard: Vec<Vec<Holding<'a>>> = vec![Vec::new(); loads.len()];
    for h in holdings {
        let shard = map.index_of(h.key);
        if loads[shard].count > cap {
            per_shard[shard].push(h);
        }
    }
    let mut leaving = Vec::new();
    let mut spares = Vec::with_capacity(loads.len());
    for (shard, mut held) in per_shard.into_iter().enumerate() {
        let excess = (loads[shard].count.saturating_sub(cap)) as usize;
        held.sort_by(|a, b| {
            (a.weight, Reverse(a.created_at), a.account, a.index).cmp(&(
                b.weight,
                Reverse(b.created_at),
                b.account,
                b.index,
            ))
        });
        let rest = held.split_off(excess.min(held.len()));
        leaving.extend(held);
        // Keys of accounts with one key are never stuck: only those of fanned-out ones
        // may need a spare.
        spares.push(rest.into_iter().filter(|h| h.fanout > 1).collect());
    }
    (leaving, spares)
}

/// What became of one holding offered a target.
enum Placed {
    Moved(Move),
    /// Its account's other keys forbid every shard with room.
    NowhereFor,
    /// Every shard with room would become heavier than the heaviest is now.
    TooHeavy,
}

/// Moves one holding into the lightest shard that still has room and that its account's
/// other keys allow (outside `forbidden`, if it has several), if that keeps every shard at
/// or below `heaviest`; the move is performed on `alloc`.
fn place(
    alloc: &mut Allocator,
    map: &ShardMap,
    targets: &mut BinaryHeap<Reverse<(u64, u64, usize)>>,
    loads: &[Load],
    heaviest: u64,
    holding: &Holding<'_>,
    forbidden: Option<&[(HashKey, HashKey)]>,
) -> Placed {
    let mut passed = Vec::new();
    let mut outcome = Placed::NowhereFor;
    while let Some(Reverse((weight, count, shard))) = targets.pop() {
        if loads[shard] != (Load { count, weight }) {
            continue; // stale heap entry
        }
        if weight + holding.weight > heaviest {
            // The lightest target is too heavy, so every other one is as well.
            passed.push((weight, count, shard));
            outcome = Placed::TooHeavy;
            break;
        }
        let range = map.shard(shard);
        alloc.remove(holding.key).expect("holding is held");
        let picked = match forbidden {
            Some(forbidden) => alloc.next_key_outside(forbidden, range.start, range.end),
            None => alloc.next_key_in(range.start, range.end),
        };
        match picked {
            Ok(to) => {
                plan_move(alloc, holding.key, to, holding.weight);
                outcome = Placed::Moved(Move {
                    account: holding.account.to_owned(),
                    index: holding.index,
                    from: holding.key,
                    to,
                    from_shard: map.index_of(holding.key),
                    to_shard: shard,
                    weight: holding.weight,
                });
                break;
            }
            // Forbidden for this key, or every key of it held: offered to the next key.
            Err(_) => {
                alloc
                    .insert(holding.key, holding.weight)
                    .expect("key was just freed");
                passed.push((weight, count, shard));
            }
        }
    }
    for entry in passed {
        targets.push(Reverse(entry));
    }
    outcome
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Keyspace;
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
                index: 0,
                fanout: 1,
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
            // A staged move's old key stays its account's until the switch.
            let vacated: std::collections::HashSet<HashKey> =
                plan.moves.iter().map(|m| m.from).collect();
            for m in &plan.moves {
                prop_assert!(!vacated.contains(&m.to), "{:?} lands on a vacated key", m);
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
