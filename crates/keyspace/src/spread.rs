//! Where one account's several keys may lie (DESIGN.md, "Hot accounts").
//!
//! An account of fanout K holds keys `0..K`. With a primary map of S shards they must lie on
//! min(K, S) distinct shards, ⌊K/S⌋ or ⌈K/S⌉ on each; without one, on K distinct shards of
//! the uniform map of 2^⌈log2 K⌉ shards (the keyspace cut into that many equal segments).
//!
//! keyspread keeps the stronger form that makes shrinking free: every prefix `0..k` of an
//! account's keys obeys the rule for k. On a map of S shards that means the keys come in
//! rounds of S indices (`0..S`, `S..2S`, ...) and each round lies on distinct shards; on the
//! segments it means key i lies in a segment of level ⌈log2 (i + 1)⌉ that holds no earlier
//! key. Dropping the keys with index ≥ k then leaves a spread account, without a move.

use super::shards::ShardMap;
use super::{HashKey, Keyspace};

/// The map an account's keys are spread over.
#[derive(Debug, Clone, Copy)]
pub enum Spread<'a> {
    /// The primary stream's open shards.
    Shards(&'a ShardMap),
    /// No primary stream: uniform segments of the keyspace, finer as the fanout grows.
    Segments(Keyspace),
}

impl Spread<'_> {
    /// Whether keys `i` (at `a`) and `j` (at `b`) of one account may not lie where they do.
    pub fn conflict(&self, i: usize, a: HashKey, j: usize, b: HashKey) -> bool {
        if i == j {
            return false;
        }
        match *self {
            Spread::Shards(map) => {
                let round = map.len();
                i / round == j / round && map.index_of(a) == map.index_of(b)
            }
            Spread::Segments(keyspace) => {
                let level = level(i.max(j));
                segment(keyspace, a, level) == segment(keyspace, b, level)
            }
        }
    }

    /// Whether `keys` (by index) obey the rule for every prefix. O(K log K).
    pub fn holds(&self, keys: &[HashKey]) -> bool {
        match *self {
            Spread::Shards(_) => self.misplaced(keys).is_empty(),
            // The longest prefix of each level decides it: keys 0..min(K, 2^L) on distinct
            // segments of level L (a shorter prefix of the level is a subset of it).
            Spread::Segments(keyspace) => (0..=level(keys.len().saturating_sub(1))).all(|l| {
                let n = keys.len().min(1 << l);
                let distinct: std::collections::HashSet<u128> =
                    keys[..n].iter().map(|k| segment(keyspace, *k, l)).collect();
                distinct.len() == n
            }),
        }
    }

    /// The indices to move so that `keys` obey the rule again: scanning in index order,
    /// each key that conflicts with an earlier one kept in place. On a map, that is every
    /// key but the first of each shard in each round, the fewest moves there are.
    pub fn misplaced(&self, keys: &[HashKey]) -> Vec<usize> {
        let mut kept: Vec<usize> = Vec::with_capacity(keys.len());
        let mut misplaced = Vec::new();
        match *self {
            Spread::Shards(map) => {
                let mut seen = std::collections::HashSet::new();
                for (i, key) in keys.iter().enumerate() {
                    if i % map.len() == 0 {
                        seen.clear();
                    }
                    if !seen.insert(map.index_of(*key)) {
                        misplaced.push(i);
                    }
                }
            }
            Spread::Segments(_) => {
                for (i, key) in keys.iter().enumerate() {
                    if kept.iter().any(|&j| self.conflict(i, *key, j, keys[j])) {
                        misplaced.push(i);
                    } else {
                        kept.push(i);
                    }
                }
            }
        }
        misplaced
    }

    /// The key ranges key `i` may not move into, given where the account's other keys lie
    /// (`keys[i]` itself is ignored): sorted, disjoint, inclusive.
    pub fn forbidden(&self, keys: &[HashKey], i: usize) -> Vec<(HashKey, HashKey)> {
        let ranges: Vec<(HashKey, HashKey)> = match *self {
            Spread::Shards(map) => {
                let round = map.len();
                let first = i / round * round;
                (first..keys.len().min(first + round))
                    .filter(|&j| j != i)
                    .map(|j| {
                        let shard = map.shard_of(keys[j]);
                        (shard.start, shard.end)
                    })
                    .collect()
            }
            Spread::Segments(keyspace) => (0..keys.len())
                .filter(|&j| j != i)
                .map(|j| segment_range(keyspace, keys[j], level(i.max(j))))
                .collect(),
        };
        merge(ranges)
    }

    /// The key ranges key `i` may not lie in at any of several moments, each moment's
    /// keys by index (a switching account: the keys in force now, and from its switch on).
    pub fn forbidden_at_all(&self, moments: &[&[HashKey]], i: usize) -> Vec<(HashKey, HashKey)> {
        merge(
            moments
                .iter()
                .flat_map(|keys| self.forbidden(keys, i))
                .collect(),
        )
    }

    /// The parts of `[lo, hi]` key `i` may move into: `[lo, hi]` less [`Spread::forbidden`].
    pub fn allowed_in(
        &self,
        keys: &[HashKey],
        i: usize,
        lo: HashKey,
        hi: HashKey,
    ) -> Vec<(HashKey, HashKey)> {
        allowed_in(&self.forbidden(keys, i), lo, hi)
    }
}

/// `ranges` (inclusive) sorted, overlapping and adjacent ones joined.
fn merge(mut ranges: Vec<(HashKey, HashKey)>) -> Vec<(HashKey, HashKey)> {
    ranges.sort();
    let mut merged: Vec<(HashKey, HashKey)> = Vec::with_capacity(ranges.len());
    for (lo, hi) in ranges {
        match merged.last_mut() {
            Some(last) if lo.0 <= last.1.0.saturating_add(1) => last.1 = last.1.max(hi),
            _ => merged.push((lo, hi)),
        }
    }
    merged
}

/// `[lo, hi]` less the `forbidden` ranges (sorted, disjoint, inclusive).
pub fn allowed_in(
    forbidden: &[(HashKey, HashKey)],
    lo: HashKey,
    hi: HashKey,
) -> Vec<(HashKey, HashKey)> {
    let mut allowed = Vec::new();
    let mut next = Some(lo.0);
    let first = forbidden.partition_point(|(_, f_hi)| f_hi.0 < lo.0);
    for &(f_lo, f_hi) in &forbidden[first..] {
        let Some(from) = next else { break };
        if f_hi.0 < from {
            continue;
        }
        if f_lo.0 > hi.0 {
            break;
        }
        if f_lo.0 > from {
            allowed.push((HashKey(from), HashKey(f_lo.0 - 1)));
        }
        next = f_hi.0.checked_add(1);
    }
    if let Some(from) = next
        && from <= hi.0
    {
        allowed.push((HashKey(from), hi));
    }
    allowed
}

/// The segment level key `i` is compared at: ⌈log2 (i + 1)⌉.
pub fn level(i: usize) -> u32 {
    usize::BITS - i.leading_zeros()
}

/// Which of the 2^`level` equal segments of the keyspace `key` lies in (the key itself
/// past the keyspace's own width).
fn segment(keyspace: Keyspace, key: HashKey, level: u32) -> u128 {
    match keyspace.bits().checked_sub(level) {
        Some(shift) if shift < 128 => key.0 >> shift,
        Some(_) => 0,
        None => key.0,
    }
}

/// The inclusive range of the segment of `level` holding `key`.
fn segment_range(keyspace: Keyspace, key: HashKey, level: u32) -> (HashKey, HashKey) {
    let Some(shift) = keyspace.bits().checked_sub(level) else {
        return (key, key);
    };
    if shift >= 128 {
        return (HashKey(0), keyspace.max());
    }
    let start = (key.0 >> shift) << shift;
    let span = if shift == 0 {
        0
    } else {
        u128::MAX >> (128 - shift)
    };
    (HashKey(start), HashKey(start + span))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn seven() -> Keyspace {
        Keyspace::new(7).unwrap()
    }

    #[test]
    fn levels_are_the_ceiling_of_log2_of_the_prefix_length() {
        let levels: Vec<u32> = (0..9).map(level).collect();
        assert_eq!(levels, [0, 1, 2, 2, 3, 3, 3, 3, 4]);
    }

    #[test]
    fn segments_cut_the_keyspace_in_equal_powers_of_two() {
        assert_eq!(
            segment_range(seven(), HashKey(70), 0),
            (HashKey(0), HashKey(127))
        );
        assert_eq!(
            segment_range(seven(), HashKey(70), 1),
            (HashKey(64), HashKey(127))
        );
        assert_eq!(
            segment_range(seven(), HashKey(70), 3),
            (HashKey(64), HashKey(79))
        );
        assert_eq!(
            segment_range(seven(), HashKey(70), 9),
            (HashKey(70), HashKey(70))
        );
        let full = Keyspace::KINESIS;
        assert_eq!(
            segment_range(full, HashKey(5), 0),
            (HashKey(0), HashKey(u128::MAX))
        );
        assert_eq!(segment(full, HashKey(u128::MAX), 2), 3);
    }

    #[test]
    fn without_a_map_each_prefix_takes_distinct_segments() {
        let spread = Spread::Segments(seven());
        // 0 and 1 in distinct halves; 2 and 3 in quarters neither of them holds.
        assert!(spread.holds(&[HashKey(64), HashKey(32), HashKey(96), HashKey(16)]));
        assert!(!spread.holds(&[HashKey(64), HashKey(96)]));
        // Distinct halves, but key 2 shares a quarter with key 0.
        assert_eq!(
            spread.misplaced(&[HashKey(64), HashKey(32), HashKey(80)]),
            [2]
        );
        assert_eq!(
            spread.forbidden(&[HashKey(64), HashKey(32), HashKey(80)], 2),
            [(HashKey(32), HashKey(95))]
        );
        assert_eq!(
            spread.allowed_in(
                &[HashKey(64), HashKey(32), HashKey(80)],
                2,
                HashKey(10),
                HashKey(127)
            ),
            [(HashKey(10), HashKey(31)), (HashKey(96), HashKey(127))]
        );
        // Key 1 is compared with key 0 at its own level, with key 2 at key 2's (finer).
        assert_eq!(
            spread.forbidden(&[HashKey(64), HashKey(32), HashKey(16)], 1),
            [(HashKey(0), HashKey(31)), (HashKey(64), HashKey(127))]
        );
    }

    #[test]
    fn on_a_map_each_round_takes_distinct_shards() {
        let map = ShardMap::uniform(seven(), 2).unwrap();
        let spread = Spread::Shards(&map);
        // Rounds [0, 1] and [2, 3]: each on both shards.
        assert!(spread.holds(&[HashKey(1), HashKey(100), HashKey(99), HashKey(2)]));
        // Two per shard, but the first round is all on shard 0: shrinking to 2 would break.
        let keys = [HashKey(1), HashKey(2), HashKey(99), HashKey(100)];
        assert_eq!(spread.misplaced(&keys), [1, 3]);
        assert_eq!(spread.forbidden(&keys, 1), [(HashKey(0), HashKey(63))]);
        assert!(
            spread
                .allowed_in(&keys, 3, HashKey(64), HashKey(127))
                .is_empty()
        );
    }

    /// The rule as DESIGN.md words it, for one length.
    fn rule_holds(spread: &Spread<'_>, keys: &[HashKey]) -> bool {
        let k = keys.len();
        match *spread {
            Spread::Shards(map) => {
                let s = map.len();
                let mut counts = vec![0usize; s];
                for key in keys {
                    counts[map.index_of(*key)] += 1;
                }
                let used = counts.iter().filter(|&&c| c > 0).count();
                used == k.min(s) && counts.iter().all(|&c| c == k / s || c == k.div_ceil(s))
            }
            Spread::Segments(keyspace) => {
                let level = level(k.saturating_sub(1));
                let segments: std::collections::HashSet<u128> = keys
                    .iter()
                    .map(|key| segment(keyspace, *key, level))
                    .collect();
                segments.len() == k
            }
        }
    }

    proptest! {
        #[test]
        fn holds_exactly_when_every_prefix_obeys_the_rule(
            shards in prop::option::of(1u64..6),
            keys in prop::collection::vec(0u128..128, 0..12),
        ) {
            let map = shards.map(|s| ShardMap::uniform(seven(), s).unwrap());
            let spread = match &map {
                Some(map) => Spread::Shards(map),
                None => Spread::Segments(seven()),
            };
            let keys: Vec<HashKey> = keys.into_iter().map(HashKey).collect();
            let every_prefix = (1..=keys.len()).all(|k| rule_holds(&spread, &keys[..k]));
            prop_assert_eq!(spread.holds(&keys), every_prefix);
            // Moving the misplaced keys into allowed ranges, one at a time, mends it.
            // On a map there is always room; on segments, when there was room for each.
            let mut mended = keys.clone();
            let mut placed_all = true;
            for i in spread.misplaced(&keys) {
                match spread.allowed_in(&mended, i, HashKey(0), HashKey(127)).first() {
                    Some((lo, _)) => mended[i] = *lo,
                    None => placed_all = false,
                }
            }
            prop_assert!(placed_all || map.is_none());
            if placed_all {
                prop_assert!(spread.holds(&mended), "{keys:?} -> {mended:?}");
            }
            for i in 0..keys.len() {
                for (lo, hi) in spread.allowed_in(&keys, i, HashKey(0), HashKey(127)) {
                    for key in [lo, hi] {
                        prop_assert!((0..keys.len()).all(|j| !spread.conflict(i, key, j, keys[j])));
                    }
                }
            }
        }
    }
}
