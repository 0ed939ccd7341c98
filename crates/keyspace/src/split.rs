//! Split plans (seed 002): cut the keyspace into ranges of equal load between the actual
//! keys, and list the SplitShard / MergeShards calls that take a stream's open shards there.

use super::lease_state::LeaseShard;
use super::list_shards::shard_number;
use super::shards::{Shard, ShardMap, shard_id};
use super::tree::Load;
use super::{Error, HashKey, Keyspace};

/// One resharding call, with the shard ids Kinesis will give its results.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reshard {
    /// `SplitShard`: the shard's keys from `new_starting_hash_key` up go to a new shard.
    Split {
        shard: String,
        new_starting_hash_key: HashKey,
        children: [String; 2],
    },
    /// `MergeShards` of two adjacent open shards.
    Merge {
        shard: String,
        adjacent: String,
        merged: String,
    },
}

/// Where a split plan leads.
#[derive(Debug, Clone, PartialEq)]
pub struct SplitPlan {
    pub operations: Vec<Reshard>,
    /// The open shards afterwards, in key order, with the load each will carry.
    pub shards: Vec<(Shard, Load)>,
    /// Weight of the heaviest single account: the bound on how far shards may differ.
    pub heaviest_account: u64,
}

/// Plans the calls that take `current` to `target` open shards of near-equal weight.
///
/// `keys` are the held keys with their weights, in key order; `next_number` is one past
/// the highest shard number the stream ever used (Kinesis numbers new shards upwards).
pub fn split_plan(
    keyspace: Keyspace,
    current: &ShardMap,
    next_number: u64,
    keys: &[(HashKey, u64)],
    target: usize,
) -> Result<SplitPlan, Error> {
    ShardMap::uniform(keyspace, target as u64)?;
    let weights: Vec<u64> = keys.iter().map(|(_, w)| *w).collect();
    let current_starts: Vec<HashKey> = current.iter().skip(1).map(|s| s.start).collect();
    // Gaps between keys that already hold a boundary: cutting there costs no call.
    let mut kept: Vec<usize> = current_starts
        .iter()
        .map(|b| keys.partition_point(|(k, _)| k < b))
        .collect();
    kept.dedup();
    let cuts = balanced_cuts(&weights, target, &kept);
    let starts = boundaries(keyspace, keys, &cuts, &current_starts)?;
    let (operations, open) = calls_to(current, next_number, &starts)?;
    let shards = open
        .into_iter()
        .enumerate()
        .map(|(index, shard)| {
            let load = load_in(keys, shard.start, shard.end);
            (Shard { index, ..shard }, load)
        })
        .collect();
    Ok(SplitPlan {
        operations,
        shards,
        heaviest_account: weights.iter().copied().max().unwrap_or(0),
    })
}

/// The calls that take a stream's open shards (`current`; `next_number` as in
/// [`split_plan`]) to shards starting at 0 and at each of `starts` (sorted), in the order to
/// make them, and the open shards they leave: first the merges of each shard whose start is
/// not wanted into the shard below it, then the splits at each wanted start the stream
/// lacks, both in key order. Made one at a time, each from a fresh look at the stream, the
/// first call of each look is the next call of the first look's list.
pub fn calls_to(
    current: &ShardMap,
    next_number: u64,
    starts: &[HashKey],
) -> Result<(Vec<Reshard>, Vec<Shard>), Error> {
    let open: Vec<Shard> = current.iter().collect();
    let current_starts: Vec<HashKey> = open.iter().skip(1).map(|s| s.start).collect();
    let mut next = next_number;
    let mut operations = Vec::new();
    let open = merge_away(open, starts, &mut next, &mut operations);
    let open = split_at(open, starts, &current_starts, &mut next, &mut operations)?;
    Ok((operations, open))
}

/// Merges each shard whose start `starts` lacks into the shard below it, in key order, in
/// one pass over the shards.
fn merge_away(
    current: Vec<Shard>,
    starts: &[HashKey],
    next: &mut u64,
    operations: &mut Vec<Reshard>,
) -> Vec<Shard> {
    let mut open: Vec<Shard> = Vec::with_capacity(current.len());
    for shard in current {
        match open.last_mut() {
            Some(low) if starts.binary_search(&shard.start).is_err() => {
                let merged = shard_id(*next as usize);
                *next += 1;
                operations.push(Reshard::Merge {
                    shard: std::mem::replace(&mut low.id, merged.clone()),
                    adjacent: shard.id,
                    merged,
                });
                low.end = shard.end;
            }
            _ => open.push(shard),
        }
    }
    open
}

/// Splits the shards at each of `starts` the stream lacks (`current_starts`), in key
/// order, in one pass: each new start lies in the shard last split or a later one.
fn split_at(
    open: Vec<Shard>,
    starts: &[HashKey],
    current_starts: &[HashKey],
    next: &mut u64,
    operations: &mut Vec<Reshard>,
) -> Result<Vec<Shard>, Error> {
    let mut done = Vec::with_capacity(open.len() + starts.len());
    let mut rest = open.into_iter();
    let mut shard = rest.next().expect("a map has a shard");
    for b in starts
        .iter()
        .filter(|b| current_starts.binary_search(b).is_err())
    {
        while !(shard.start < *b && *b <= shard.end) {
            done.push(shard);
            shard = rest.next().expect("a shard holds every key");
        }
        // Kinesis' rule: StartingHashKey + 1 < NewStartingHashKey < EndingHashKey.
        if !(shard.start.0 + 1 < b.0 && *b < shard.end) {
            return Err(Error::Tiling(format!(
                "{} [{}, {}] cannot be split at {b}: too close to its edge for SplitShard",
                shard.id, shard.start, shard.end
            )));
        }
        let children = [shard_id(*next as usize), shard_id(*next as usize + 1)];
        *next += 2;
        operations.push(Reshard::Split {
            shard: shard.id,
            new_starting_hash_key: *b,
            children: children.clone(),
        });
        let [low, high] = children;
        done.push(Shard {
            index: 0,
            id: low,
            start: shard.start,
            end: HashKey(b.0 - 1),
        });
        shard = Shard {
            index: 0,
            id: high,
            start: *b,
            end: shard.end,
        };
    }
    done.push(shard);
    done.extend(rest);
    Ok(done)
}

/// Load of the keys in `[lo, hi]`; `keys` sorted.
pub fn load_in(keys: &[(HashKey, u64)], lo: HashKey, hi: HashKey) -> Load {
    let a = keys.partition_point(|(k, _)| *k < lo);
    let b = keys.partition_point(|(k, _)| *k <= hi);
    keys[a..b]
        .iter()
        .fold(Load::default(), |acc, (_, w)| acc + Load::one(*w))
}

/// `parts - 1` cut positions (how many keys lie left of each cut), non-decreasing, chosen so
/// that the parts' weights differ by at most the heaviest single weight, at positions
/// in `kept` (sorted) where that choice is free.
fn balanced_cuts(weights: &[u64], parts: usize, kept: &[usize]) -> Vec<usize> {
    let mut prefix = vec![0u128; weights.len() + 1];
    for (i, w) in weights.iter().enumerate() {
        prefix[i + 1] = prefix[i] + u128::from(*w);
    }
    let total = prefix[weights.len()];
    let heaviest = u128::from(weights.iter().copied().max().unwrap_or(0));
    // Look for a window [lo, lo + heaviest] that holds the mean and admits a partition,
    // trying windows centred on the mean first.
    let mean = total / parts as u128;
    let mut offsets: Vec<u128> = (0..=32).map(|i| heaviest * i / 32).collect();
    offsets.sort_by_key(|o| o.abs_diff(heaviest / 2));
    offsets
        .into_iter()
        .filter_map(|o| {
            let lo = mean.saturating_sub(o);
            partition_within(&prefix, parts, lo, lo + heaviest, kept)
        })
        .next()
        .unwrap_or_else(|| pairwise_balanced(&prefix, parts))
}

/// Cuts making every part's weight lie in `[lo, hi]`, if any exist.
///
/// With `hi - lo` at least the heaviest weight, the cut positions reachable after k parts
/// form one contiguous range, so tracking its two ends decides feasibility in O(parts log n).
fn partition_within(
    prefix: &[u128],
    parts: usize,
    lo: u128,
    hi: u128,
    kept: &[usize],
) -> Option<Vec<usize>> {
    let n = prefix.len() - 1;
    let mut reach = vec![(0usize, 0usize)];
    for _ in 0..parts {
        let (a, b) = *reach.last().expect("seeded");
        let first = prefix.partition_point(|p| *p < prefix[a] + lo);
        let last = prefix
            .partition_point(|p| *p <= prefix[b] + hi)
            .checked_sub(1)?;
        if first > last || first > n {
            return None;
        }
        reach.push((first, last));
    }
    let (a, b) = reach[parts];
    if !(a <= n && n <= b) {
        return None;
    }
    // Walk back from the end, keeping each cut reachable: on a kept position if one is in
    // range, else nearest its ideal position.
    let total = prefix[n];
    let mut cuts = vec![0; parts - 1];
    let mut z = n;
    for k in (1..parts).rev() {
        let (a, b) = reach[k];
        let first = prefix.partition_point(|p| *p + hi < prefix[z]).max(a);
        let last = prefix
            .partition_point(|p| *p + lo <= prefix[z])
            .checked_sub(1)?
            .min(b);
        if first > last {
            return None;
        }
        let goal = total * k as u128;
        let distance = |x: usize| (prefix[x] * parts as u128).abs_diff(goal);
        let nearest = |among: &[usize]| -> Option<usize> {
            let j = among.partition_point(|p| prefix[*p] * (parts as u128) < goal);
            [j.checked_sub(1), Some(j)]
                .into_iter()
                .flatten()
                .filter_map(|j| among.get(j).copied())
                .min_by_key(|c| distance(*c))
        };
        let in_range =
            &kept[kept.partition_point(|p| *p < first)..kept.partition_point(|p| *p <= last)];
        let x = nearest(in_range).unwrap_or_else(|| {
            let i = prefix
                .partition_point(|p| p * (parts as u128) < goal)
                .clamp(first, last);
            [i.saturating_sub(1).max(first), i]
                .into_iter()
                .min_by_key(|c| distance(*c))
                .expect("two candidates")
        });
        cuts[k - 1] = x;
        z = x;
    }
    Some(cuts)
}

/// Fallback: cuts nearest the ideal positions, then neighbours evened out until nothing
/// improves (each change lowers the sum of squared part weights, so this ends).
fn pairwise_balanced(prefix: &[u128], parts: usize) -> Vec<usize> {
    let n = prefix.len() - 1;
    let nearest = |lo: usize, hi: usize, goal: u128, scale: u128| {
        let i = lo + prefix[lo..=hi].partition_point(|p| p * scale < goal);
        [i.saturating_sub(1).max(lo), i.min(hi)]
            .into_iter()
            .min_by_key(|c| (prefix[*c] * scale).abs_diff(goal))
            .expect("two candidates")
    };
    let mut cuts: Vec<usize> = (1..parts)
        .map(|j| nearest(0, n, prefix[n] * j as u128, parts as u128))
        .collect();
    for _ in 0..256 {
        let mut changed = false;
        for j in 0..cuts.len() {
            let lo = if j == 0 { 0 } else { cuts[j - 1] };
            let hi = if j + 1 == cuts.len() { n } else { cuts[j + 1] };
            let best = nearest(lo, hi, prefix[lo] + prefix[hi], 2);
            let spread = |c: usize| (2 * prefix[c]).abs_diff(prefix[lo] + prefix[hi]);
            if spread(best) < spread(cuts[j]) {
                cuts[j] = best;
                changed = true;
            }
        }
        if !changed {
            break;
        }
    }
    cuts
}

/// Hash keys where the new shards start: each cut sits between the keys either side of it,
/// on a boundary the stream already has if one lies there (no call needed), else spread
/// evenly across the gap.
fn boundaries(
    keyspace: Keyspace,
    keys: &[(HashKey, u64)],
    cuts: &[usize],
    existing: &[HashKey],
) -> Result<Vec<HashKey>, Error> {
    let mut starts = Vec::with_capacity(cuts.len());
    let mut j = 0;
    while j < cuts.len() {
        let gap = cuts[j];
        let same = cuts[j..].iter().take_while(|c| **c == gap).count();
        let lower = if gap == 0 { 1 } else { keys[gap - 1].0.0 + 1 };
        let upper = keys.get(gap).map_or(keyspace.max().0, |(k, _)| k.0);
        if upper < lower || upper - lower < same as u128 - 1 {
            return Err(Error::Tiling(format!(
                "no room for {same} shard boundaries between keys {} and {upper}",
                lower - 1
            )));
        }
        let there = &existing
            [existing.partition_point(|b| b.0 < lower)..existing.partition_point(|b| b.0 <= upper)];
        if there.len() >= same {
            // Keep the existing boundaries nearest the middle of the gap.
            let skip = (there.len() - same) / 2;
            starts.extend_from_slice(&there[skip..skip + same]);
            j += same;
            continue;
        }
        let step = (upper - lower) / (same as u128 + 1);
        for k in 0..same {
            let offset = if same == 1 {
                (upper - lower).div_ceil(2)
            } else {
                step * (k as u128 + 1)
            };
            starts.push(HashKey(lower + offset.max(k as u128)));
        }
        j += same;
    }
    Ok(starts)
}

/// The SplitShard and MergeShards calls a stream's lineage (`shards`: every shard
/// list-shards names, closed ones and their parents included) shows were made since its
/// next shard number was `first`, in the order Kinesis made them: each shard numbered from
/// `first` on is a call's result, a merge's (it has two parents) or one of a split's two
/// children (which share their parent).
pub fn calls_since(shards: &[LeaseShard], first: u64) -> Vec<Reshard> {
    let mut new: Vec<(u64, &LeaseShard)> = (shards.iter())
        .filter_map(|s| Some((shard_number(&s.id)?, s)))
        .filter(|(number, _)| *number >= first)
        .collect();
    new.sort_unstable_by_key(|(number, _)| *number);
    let mut children: std::collections::HashMap<&str, Vec<&LeaseShard>> = Default::default();
    for (_, s) in &new {
        if let [parent] = s.parents.as_slice() {
            children.entry(parent).or_default().push(s);
        }
    }
    let mut calls = Vec::new();
    for (_, s) in new {
        match s.parents.as_slice() {
            [shard, adjacent] => calls.push(Reshard::Merge {
                shard: shard.clone(),
                adjacent: adjacent.clone(),
                merged: s.id.clone(),
            }),
            // A split shows once, at its first child.
            [parent] => {
                if let Some(&[a, b]) = children.remove(parent.as_str()).as_deref() {
                    let (low, high) = if a.start < b.start { (a, b) } else { (b, a) };
                    calls.push(Reshard::Split {
                        shard: parent.clone(),
                        new_starting_hash_key: high.start,
                        children: [low.id.clone(), high.id.clone()],
                    });
                }
            }
            _ => {}
        }
    }
    calls
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::{BTreeMap, BTreeSet};

    /// The planner as first written, quadratic in the shards (a scan of every shard per
    /// call): the fast one must answer exactly as it does.
    mod reference {
        use super::super::*;

        pub fn split_plan(
            keyspace: Keyspace,
            current: &ShardMap,
            next_number: u64,
            keys: &[(HashKey, u64)],
            target: usize,
        ) -> Result<SplitPlan, Error> {
            ShardMap::uniform(keyspace, target as u64)?;
            let weights: Vec<u64> = keys.iter().map(|(_, w)| *w).collect();
            let mut open: Vec<Shard> = current.iter().collect();
            let current_starts: Vec<HashKey> = open.iter().skip(1).map(|s| s.start).collect();
            // Gaps between keys that already hold a boundary: cutting there costs no call.
            let mut kept: Vec<usize> = current_starts
                .iter()
                .map(|b| keys.partition_point(|(k, _)| k < b))
                .collect();
            kept.dedup();
            let cuts = balanced_cuts(&weights, target, &kept);
            let starts = boundaries_by_scan(keyspace, keys, &cuts, &current_starts)?;
            let mut next = next_number;
            let mut operations = Vec::new();
            for b in current_starts
                .iter()
                .filter(|b| starts.binary_search(b).is_err())
            {
                let k = open
                    .iter()
                    .position(|s| s.start == *b)
                    .expect("a current boundary");
                let merged = shard_id(next as usize);
                next += 1;
                operations.push(Reshard::Merge {
                    shard: open[k - 1].id.clone(),
                    adjacent: open[k].id.clone(),
                    merged: merged.clone(),
                });
                let end = open[k].end;
                open[k - 1] = Shard {
                    index: 0,
                    id: merged,
                    start: open[k - 1].start,
                    end,
                };
                open.remove(k);
            }
            for b in starts
                .iter()
                .filter(|b| current_starts.binary_search(b).is_err())
            {
                let k = open
                    .iter()
                    .position(|s| s.start < *b && *b <= s.end)
                    .expect("a shard holds every key");
                // Kinesis' rule: StartingHashKey + 1 < NewStartingHashKey < EndingHashKey.
                if !(open[k].start.0 + 1 < b.0 && *b < open[k].end) {
                    return Err(Error::Tiling(format!(
                        "{} [{}, {}] cannot be split at {b}: too close to its edge for SplitShard",
                        open[k].id, open[k].start, open[k].end
                    )));
                }
                let children = [shard_id(next as usize), shard_id(next as usize + 1)];
                next += 2;
                operations.push(Reshard::Split {
                    shard: open[k].id.clone(),
                    new_starting_hash_key: *b,
                    children: children.clone(),
                });
                let parent = open.remove(k);
                let [low, high] = children;
                open.insert(
                    k,
                    Shard {
                        index: 0,
                        id: high,
                        start: *b,
                        end: parent.end,
                    },
                );
                open.insert(
                    k,
                    Shard {
                        index: 0,
                        id: low,
                        start: parent.start,
                        end: HashKey(b.0 - 1),
                    },
                );
            }
            let shards = open
                .into_iter()
                .enumerate()
                .map(|(index, shard)| {
                    let load = load_in(keys, shard.start, shard.end);
                    (Shard { index, ..shard }, load)
                })
                .collect();
            Ok(SplitPlan {
                operations,
                shards,
                heaviest_account: weights.iter().copied().max().unwrap_or(0),
            })
        }

        fn boundaries_by_scan(
            keyspace: Keyspace,
            keys: &[(HashKey, u64)],
            cuts: &[usize],
            existing: &[HashKey],
        ) -> Result<Vec<HashKey>, Error> {
            let mut starts = Vec::with_capacity(cuts.len());
            let mut j = 0;
            while j < cuts.len() {
                let gap = cuts[j];
                let same = cuts[j..].iter().take_while(|c| **c == gap).count();
                let lower = if gap == 0 { 1 } else { keys[gap - 1].0.0 + 1 };
                let upper = keys.get(gap).map_or(keyspace.max().0, |(k, _)| k.0);
                if upper < lower || upper - lower < same as u128 - 1 {
                    return Err(Error::Tiling(format!(
                        "no room for {same} shard boundaries between keys {} and {upper}",
                        lower - 1
                    )));
                }
                let there: Vec<HashKey> = existing
                    .iter()
                    .copied()
                    .filter(|b| lower <= b.0 && b.0 <= upper)
                    .collect();
                if there.len() >= same {
                    // Keep the existing boundaries nearest the middle of the gap.
                    let skip = (there.len() - same) / 2;
                    starts.extend_from_slice(&there[skip..skip + same]);
                    j += same;
                    continue;
                }
                let step = (upper - lower) / (same as u128 + 1);
                for k in 0..same {
                    let offset = if same == 1 {
                        (upper - lower).div_ceil(2)
                    } else {
                        step * (k as u128 + 1)
                    };
                    starts.push(HashKey(lower + offset.max(k as u128)));
                }
                j += same;
            }
            Ok(starts)
        }
    }

    fn uniform(n: u64) -> ShardMap {
        ShardMap::uniform(Keyspace::KINESIS, n).unwrap()
    }

    #[test]
    fn splits_where_the_keys_are() {
        // Eight accounts all in the lower quarter of a one-shard stream.
        let keys: Vec<_> = (1..=8u128).map(|i| (HashKey(i << 100), 1)).collect();
        let plan = split_plan(Keyspace::KINESIS, &uniform(1), 1, &keys, 2).unwrap();
        assert_eq!(plan.operations.len(), 1);
        let Reshard::Split {
            shard,
            new_starting_hash_key,
            children,
        } = &plan.operations[0]
        else {
            panic!("a split");
        };
        assert_eq!(shard, "shardId-000000000000");
        assert!(
            HashKey(4 << 100) < *new_starting_hash_key
                && *new_starting_hash_key <= HashKey(5 << 100)
        );
        assert_eq!(
            children,
            &[
                "shardId-000000000001".to_owned(),
                "shardId-000000000002".to_owned()
            ]
        );
        let counts: Vec<u64> = plan.shards.iter().map(|(_, l)| l.count).collect();
        assert_eq!(counts, [4, 4]);
    }

    #[test]
    fn merges_adjacent_shards_to_shrink() {
        let keys: Vec<_> = (0..4u128).map(|i| (HashKey(i << 126 | 1), 1)).collect();
        let plan = split_plan(Keyspace::KINESIS, &uniform(4), 4, &keys, 2).unwrap();
        let merges: Vec<_> = plan
            .operations
            .iter()
            .filter(|o| matches!(o, Reshard::Merge { .. }))
            .collect();
        assert_eq!(merges.len(), 2);
        assert_eq!(
            merges[0],
            &Reshard::Merge {
                shard: "shardId-000000000000".into(),
                adjacent: "shardId-000000000001".into(),
                merged: "shardId-000000000004".into()
            }
        );
        assert_eq!(plan.shards.len(), 2);
        assert!(plan.shards.iter().all(|(_, l)| l.count == 2));
    }

    #[test]
    fn keeps_boundaries_the_stream_already_has() {
        let step = u128::MAX / 40;
        let keys: Vec<_> = (0..40u128)
            .map(|i| (HashKey(i * step + step / 2), 1))
            .collect();
        let plan = split_plan(Keyspace::KINESIS, &uniform(2), 2, &keys, 4).unwrap();
        assert!(
            plan.operations
                .iter()
                .all(|o| matches!(o, Reshard::Split { .. }))
        );
        assert_eq!(plan.operations.len(), 2, "{:?}", plan.operations);
    }

    #[test]
    fn no_keys_means_even_ranges() {
        let plan = split_plan(Keyspace::KINESIS, &uniform(1), 1, &[], 4).unwrap();
        assert_eq!(plan.shards.len(), 4);
        assert_eq!(plan.operations.len(), 3);
    }

    /// A map of shards starting at 0 and at each of `starts` (masked to the keyspace).
    fn explicit(keyspace: Keyspace, starts: BTreeSet<u128>) -> ShardMap {
        let max = keyspace.max().0;
        let starts: BTreeSet<u128> = starts.into_iter().map(|s| s & max).collect();
        let mut edges = vec![0];
        edges.extend(starts.into_iter().filter(|s| *s > 0));
        let open = edges
            .iter()
            .enumerate()
            .map(|(i, start)| {
                let end = edges.get(i + 1).map_or(max, |next| next - 1);
                (shard_id(i), HashKey(*start), HashKey(end))
            })
            .collect();
        ShardMap::explicit(keyspace, open).unwrap()
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(1024))]
        #[test]
        fn answers_as_the_reference_planner(
            bits in prop_oneof![Just(6u32), Just(12), Just(128)],
            keys in prop::collection::btree_map(any::<u128>(), 1u64..=20, 0..120),
            unit in any::<bool>(),
            starts in prop::collection::btree_set(any::<u128>(), 0..16),
            unused in 0u64..5,
            target in 1usize..=40,
        ) {
            let keyspace = Keyspace::new(bits).unwrap();
            let max = keyspace.max().0;
            let keys: BTreeMap<u128, u64> = keys.into_iter().map(|(k, w)| (k & max, if unit { 1 } else { w })).collect();
            let keys: Vec<(HashKey, u64)> = keys.into_iter().map(|(k, w)| (HashKey(k), w)).collect();
            let map = explicit(keyspace, starts);
            let next = map.len() as u64 + unused;
            prop_assert_eq!(
                split_plan(keyspace, &map, next, &keys, target),
                reference::split_plan(keyspace, &map, next, &keys, target)
            );
        }
    }

    proptest! {
        #[test]
        fn plans_tile_and_stay_within_the_heaviest_account(
            keys in prop::collection::btree_map(any::<u128>(), 1u64..=20, 0..200),
            unit in any::<bool>(),
            current in 1u64..=8,
            target in 1usize..=16,
        ) {
            let keys: Vec<(HashKey, u64)> = keys.into_iter().map(|(k, w)| (HashKey(k), if unit { 1 } else { w })).collect();
            let plan = split_plan(Keyspace::KINESIS, &uniform(current), current, &keys, target).unwrap();
            // The result tiles the keyspace.
            let open: Vec<_> = plan.shards.iter().map(|(s, _)| (s.id.clone(), s.start, s.end)).collect();
            prop_assert!(ShardMap::explicit(Keyspace::KINESIS, open).is_ok());
            prop_assert_eq!(plan.shards.len(), target);
            let weights: Vec<u64> = plan.shards.iter().map(|(_, l)| l.weight).collect();
            let spread = weights.iter().max().unwrap() - weights.iter().min().unwrap();
            if unit {
                prop_assert!(spread <= 1, "unit weights {:?}", weights);
            }
            prop_assert!(spread <= plan.heaviest_account.max(1), "weights {:?}, heaviest {}", weights, plan.heaviest_account);
            // Every call is legal when made in order.
            let mut live: std::collections::HashSet<String> = uniform(current).iter().map(|s| s.id).collect();
            for op in &plan.operations {
                match op {
                    Reshard::Split { shard, children, .. } => {
                        prop_assert!(live.remove(shard));
                        live.extend(children.iter().cloned());
                    }
                    Reshard::Merge { shard, adjacent, merged } => {
                        prop_assert!(live.remove(shard) && live.remove(adjacent));
                        live.insert(merged.clone());
                    }
                }
            }
            let planned: std::collections::HashSet<String> = plan.shards.iter().map(|(s, _)| s.id.clone()).collect();
            prop_assert_eq!(live, planned);
        }
    }

    /// What Kinesis makes of `op` on a stream whose shards are `shards` (closed ones
    /// included) and whose next shard number is `next`.
    fn kinesis_applies(shards: &mut Vec<LeaseShard>, next: &mut u64, op: &Reshard) {
        let mut close = |id: &str| {
            let shard = shards.iter_mut().find(|s| s.id == id && !s.closed);
            let shard = shard.unwrap_or_else(|| panic!("{id} is not an open shard"));
            shard.closed = true;
            (shard.start, shard.end)
        };
        let mut born = |start, end, parents: Vec<String>| LeaseShard {
            id: {
                *next += 1;
                shard_id(*next as usize - 1)
            },
            start,
            end,
            parents,
            closed: false,
        };
        let new: Vec<LeaseShard> = match op {
            Reshard::Split {
                shard,
                new_starting_hash_key: at,
                ..
            } => {
                let (start, end) = close(shard);
                vec![
                    born(start, HashKey(at.0 - 1), vec![shard.clone()]),
                    born(*at, end, vec![shard.clone()]),
                ]
            }
            Reshard::Merge {
                shard, adjacent, ..
            } => {
                let (start, _) = close(shard);
                let (_, end) = close(adjacent);
                vec![born(start, end, vec![shard.clone(), adjacent.clone()])]
            }
        };
        shards.extend(new);
    }

    fn open_map(shards: &[LeaseShard]) -> ShardMap {
        let open = (shards.iter().filter(|s| !s.closed))
            .map(|s| (s.id.clone(), s.start, s.end))
            .collect();
        ShardMap::explicit(Keyspace::KINESIS, open).unwrap()
    }

    proptest! {
        /// A reshard carried out call by call: from the stream's real shards after any
        /// number of a plan's calls, the calls towards the plan's shards are the plan's
        /// remaining ones (naming open shards only), and the lineage shows exactly the calls
        /// made; so a job that stops and starts again from the stream's state makes no call
        /// twice.
        #[test]
        fn a_plan_carried_out_from_the_live_shards_makes_its_calls_once(
            keys in prop::collection::btree_map(any::<u128>(), 1u64..=20, 0..200),
            unit in any::<bool>(),
            current in 1u64..=8,
            target in 1usize..=16,
        ) {
            let keys: Vec<(HashKey, u64)> = keys.into_iter().map(|(k, w)| (HashKey(k), if unit { 1 } else { w })).collect();
            // Keys too close together for SplitShard to cut between them are refused.
            let plan = split_plan(Keyspace::KINESIS, &uniform(current), current, &keys, target);
            prop_assume!(plan.is_ok());
            let plan = plan.unwrap();
            let wanted: Vec<HashKey> = plan.shards.iter().skip(1).map(|(s, _)| s.start).collect();
            let mut shards: Vec<LeaseShard> = uniform(current)
                .iter()
                .map(|s| LeaseShard { id: s.id, start: s.start, end: s.end, parents: Vec::new(), closed: false })
                .collect();
            let mut next = current;
            for (made, op) in plan.operations.iter().enumerate() {
                prop_assert_eq!(calls_since(&shards, current), plan.operations[..made].to_vec());
                let (calls, _) = calls_to(&open_map(&shards), next, &wanted).unwrap();
                prop_assert_eq!(&calls[..], &plan.operations[made..]);
                kinesis_applies(&mut shards, &mut next, op);
            }
            prop_assert_eq!(calls_since(&shards, current), plan.operations.clone());
            prop_assert_eq!(calls_to(&open_map(&shards), next, &wanted).unwrap().0, vec![]);
        }
    }
}
