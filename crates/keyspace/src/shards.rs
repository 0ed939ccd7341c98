//! Shard maps: which shard of a stream a hash key lands on, and how even the shards are.

use md5::{Digest, Md5};
use serde::Serialize;

use super::tree::Load;
use super::{Error, HashKey, Keyspace};

/// The most open shards a stream may have: Kinesis' default limit per stream (raising it
/// takes a request to AWS). It also bounds every answer that lists a map's shards.
pub const MAX_SHARDS: u32 = 10_000;

/// One open shard: an inclusive range of hash keys.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shard {
    pub index: usize,
    pub id: String,
    pub start: HashKey,
    pub end: HashKey,
}

/// The open shards of a stream: ranges that tile the keyspace, in key order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardMap {
    repr: Repr,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Repr {
    /// What CreateStream and UNIFORM_SCALING make: shard `i` starts at
    /// `i * floor(2^bits / count)`; the last one ends at the top of the keyspace.
    Uniform { count: u32, step: u128, max: u128 },
    /// Any tiling, as SplitShard and MergeShards leave it; sorted by start.
    Explicit { shards: Vec<Shard> },
}

impl ShardMap {
    /// A uniform map of `count` shards, 1..=[`MAX_SHARDS`] and no more than the keyspace has
    /// keys.
    pub fn uniform(keyspace: Keyspace, count: u64) -> Result<Self, Error> {
        let max = keyspace.max().0;
        let limit =
            u64::from(MAX_SHARDS).min(u64::try_from(max).unwrap_or(u64::MAX).saturating_add(1));
        if count == 0 || count > limit {
            return Err(Error::ShardCount {
                got: count,
                max: limit,
            });
        }
        Ok(ShardMap {
            repr: Repr::Uniform {
                count: count as u32,
                step: uniform_step(max, count),
                max,
            },
        })
    }

    /// Whether the ranges are those of a uniform map of as many shards (what CreateStream
    /// and UNIFORM_SCALING make), whatever the shard ids.
    pub fn is_uniform(&self) -> bool {
        match &self.repr {
            Repr::Uniform { .. } => true,
            Repr::Explicit { shards } => {
                let max = shards.last().expect("at least one shard").end.0;
                let step = uniform_step(max, shards.len() as u64);
                shards.iter().all(|s| {
                    let start = step * s.index as u128;
                    let end = if s.index + 1 == shards.len() {
                        max
                    } else {
                        start + step - 1
                    };
                    (s.start.0, s.end.0) == (start, end)
                })
            }
        }
    }

    /// A map of the given open shards `(id, start, end)`, which must tile the keyspace
    /// exactly: no gap, no overlap, ids unique. Registration checks the count against
    /// [`MAX_SHARDS`]; maps stored under an earlier, higher limit still load.
    pub fn explicit(
        keyspace: Keyspace,
        open: Vec<(String, HashKey, HashKey)>,
    ) -> Result<Self, Error> {
        if open.is_empty() {
            return Err(Error::ShardCount {
                got: 0,
                max: u64::from(MAX_SHARDS),
            });
        }
        let mut open = open;
        open.sort_by_key(|(_, start, _)| *start);
        let tiling = |detail: String| Error::Tiling(detail);
        let mut ids = std::collections::HashSet::new();
        let mut next = 0u128; // the first key not yet covered
        for (i, (id, start, end)) in open.iter().enumerate() {
            if !ids.insert(id.as_str()) {
                return Err(tiling(format!("{id} appears twice among the open shards")));
            }
            if start > end {
                return Err(tiling(format!(
                    "{id}: StartingHashKey {start} is above EndingHashKey {end}"
                )));
            }
            keyspace.check(*end).map_err(|_| {
                tiling(format!(
                    "{id}: EndingHashKey {end} is above the keyspace's top {}",
                    keyspace.max()
                ))
            })?;
            if start.0 > next {
                let after = if i == 0 {
                    "the start of the keyspace".to_owned()
                } else {
                    open[i - 1].0.clone()
                };
                return Err(tiling(format!(
                    "gap: no open shard covers [{next}, {}] (between {after} and {id})",
                    start.0 - 1
                )));
            }
            if start.0 < next {
                let (prev, _, prev_end) = &open[i - 1];
                return Err(tiling(format!(
                    "overlap: {prev} and {id} both cover [{start}, {}]",
                    prev_end.0.min(end.0)
                )));
            }
            next = end.0.wrapping_add(1);
            if end.0 == keyspace.max().0 && i + 1 < open.len() {
                let (extra, extra_start, _) = &open[i + 1];
                return Err(tiling(format!(
                    "overlap: {id} already ends at the top of the keyspace, {extra} starts at {extra_start}"
                )));
            }
        }
        let (last_id, _, last_end) = open.last().expect("at least one shard");
        if *last_end != keyspace.max() {
            return Err(tiling(format!(
                "gap: no open shard covers [{}, {}] (after {last_id})",
                last_end.0 + 1,
                keyspace.max()
            )));
        }
        let shards = open
            .into_iter()
            .enumerate()
            .map(|(index, (id, start, end))| Shard {
                index,
                id,
                start,
                end,
            })
            .collect();
        Ok(ShardMap {
            repr: Repr::Explicit { shards },
        })
    }

    pub fn len(&self) -> usize {
        match &self.repr {
            Repr::Uniform { count, .. } => *count as usize,
            Repr::Explicit { shards } => shards.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The shard at `index` (< len), in key order.
    pub fn shard(&self, index: usize) -> Shard {
        match &self.repr {
            Repr::Uniform { count, step, max } => {
                let start = step * index as u128;
                let end = if index + 1 == *count as usize {
                    *max
                } else {
                    start + step - 1
                };
                Shard {
                    index,
                    id: shard_id(index),
                    start: HashKey(start),
                    end: HashKey(end),
                }
            }
            Repr::Explicit { shards } => shards[index].clone(),
        }
    }

    /// The shard whose range holds `key`.
    pub fn shard_of(&self, key: HashKey) -> Shard {
        self.shard(self.index_of(key))
    }

    /// Index of the shard whose range holds `key` (a bisect over the starts).
    pub fn index_of(&self, key: HashKey) -> usize {
        match &self.repr {
            Repr::Uniform { count, step, .. } => (key.0 / step).min(u128::from(count - 1)) as usize,
            Repr::Explicit { shards } => {
                shards.partition_point(|s| s.start <= key).saturating_sub(1)
            }
        }
    }

    pub fn iter(&self) -> impl Iterator<Item = Shard> + '_ {
        (0..self.len()).map(|i| self.shard(i))
    }
}

/// Open shards starting at each of `starts` (sorted, the first 0) and tiling the whole
/// 128-bit keyspace; for tests.
#[cfg(test)]
pub(crate) fn tiling(starts: &[u128]) -> Vec<(String, HashKey, HashKey)> {
    starts
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let end = starts.get(i + 1).map_or(u128::MAX, |n| n - 1);
            (shard_id(i), HashKey(*s), HashKey(end))
        })
        .collect()
}

/// `floor((max + 1) / count)`, the width of a uniform map's shards, without overflowing
/// when `max + 1 = 2^128`.
fn uniform_step(max: u128, count: u64) -> u128 {
    let n = u128::from(count);
    (max / n).saturating_add(u128::from(max % n == n - 1))
}

/// Kinesis' shard id for a shard index: `shardId-` and 12 digits.
pub fn shard_id(index: usize) -> String {
    format!("shardId-{index:012}")
}

/// What Kinesis does with a partition key: MD5 read as a big-endian integer, here cut to the
/// keyspace's top bits (all 128 of them in production).
pub fn md5_hash(partition_key: &str, keyspace: Keyspace) -> HashKey {
    let digest: [u8; 16] = Md5::digest(partition_key.as_bytes()).into();
    HashKey(u128::from_be_bytes(digest) >> (128 - keyspace.bits()))
}

/// How even a set of shards is.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Skew {
    /// Number of shards.
    pub shards: u64,
    /// Number of keys over all shards: one per account, K for an account of fanout K.
    pub accounts: u64,
    /// Keys on the fullest shard.
    pub max: u64,
    /// Keys on the emptiest shard.
    pub min: u64,
    /// `max` divided by the mean keys per shard; 1.0 is perfect, 0 when there are none.
    pub max_over_mean: f64,
    /// Sum of the keys' weights over all shards (each account's weight, shared among its
    /// keys).
    pub weight: u64,
    /// Weight of the heaviest shard.
    pub max_weight: u64,
    /// Weight of the lightest shard.
    pub min_weight: u64,
}

impl Skew {
    /// Summarises per-shard loads.
    pub fn of(loads: &[Load]) -> Skew {
        let total = loads.iter().fold(Load::default(), |a, l| a + *l);
        let max = loads.iter().map(|l| l.count).max().unwrap_or(0);
        let max_over_mean = if total.count == 0 {
            0.0
        } else {
            max as f64 * loads.len() as f64 / total.count as f64
        };
        Skew {
            shards: loads.len() as u64,
            accounts: total.count,
            max,
            min: loads.iter().map(|l| l.count).min().unwrap_or(0),
            max_over_mean,
            weight: total.weight,
            max_weight: loads.iter().map(|l| l.weight).max().unwrap_or(0),
            min_weight: loads.iter().map(|l| l.weight).min().unwrap_or(0),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn two_shards_split_at_half() {
        let map = ShardMap::uniform(Keyspace::KINESIS, 2).unwrap();
        let first = map.shard(0);
        let second = map.shard(1);
        assert_eq!(first.id, "shardId-000000000000");
        assert_eq!(
            first.end.to_string(),
            "170141183460469231731687303715884105727"
        );
        assert_eq!(
            second.start.to_string(),
            "170141183460469231731687303715884105728"
        );
        assert_eq!(second.end, HashKey(u128::MAX));
    }

    #[test]
    fn three_shards_follow_floor_division() {
        let map = ShardMap::uniform(Keyspace::KINESIS, 3).unwrap();
        let step = u128::MAX / 3; // 2^128 / 3 rounds down to the same value
        assert_eq!(map.shard(1).start, HashKey(step));
        assert_eq!(map.shard(2).start, HashKey(2 * step));
        assert_eq!(map.shard(2).end, HashKey(u128::MAX));
        assert_eq!(map.shard(1).id, "shardId-000000000001");
    }

    #[test]
    fn rejects_bad_counts() {
        assert!(ShardMap::uniform(Keyspace::KINESIS, 0).is_err());
        assert!(ShardMap::uniform(Keyspace::KINESIS, 10_001).is_err());
        assert!(ShardMap::uniform(Keyspace::KINESIS, 10_000).is_ok());
        let small = Keyspace::new(3).unwrap();
        assert!(ShardMap::uniform(small, 8).is_ok());
        assert_eq!(
            ShardMap::uniform(small, 9),
            Err(Error::ShardCount { got: 9, max: 8 })
        );
    }

    #[test]
    fn md5_matches_kinesis() {
        assert_eq!(
            md5_hash("1", Keyspace::KINESIS).to_string(),
            "261578874264819908609102035485573088411"
        );
        // The seed's skew: keys "1".."14" over two shards land 3 vs 11.
        let map = ShardMap::uniform(Keyspace::KINESIS, 2).unwrap();
        let first = (1..=14)
            .filter(|i| map.index_of(md5_hash(&i.to_string(), Keyspace::KINESIS)) == 0)
            .count();
        assert_eq!(first, 3);
    }

    #[test]
    fn skew_of_loads() {
        let skew = Skew::of(&[
            Load {
                count: 3,
                weight: 3,
            },
            Load {
                count: 11,
                weight: 20,
            },
        ]);
        assert_eq!((skew.max, skew.min, skew.accounts), (11, 3, 14));
        assert!((skew.max_over_mean - 11.0 / 7.0).abs() < 1e-12);
        assert_eq!((skew.max_weight, skew.min_weight, skew.weight), (20, 3, 23));
        assert_eq!(Skew::of(&[Load::default(); 4]).max_over_mean, 0.0);
    }

    proptest! {
        #[test]
        fn shards_tile_the_keyspace(count in 1u64..=MAX_SHARDS as u64, key in any::<u128>()) {
            let map = ShardMap::uniform(Keyspace::KINESIS, count).unwrap();
            let shard = map.shard_of(HashKey(key));
            prop_assert!(shard.start.0 <= key && key <= shard.end.0);
            if shard.index > 0 {
                prop_assert_eq!(map.shard(shard.index - 1).end.0 + 1, shard.start.0);
            }
            prop_assert_eq!(map.shard(0).start, HashKey(0));
            prop_assert_eq!(map.shard(map.len() - 1).end, HashKey(u128::MAX));
        }
    }

    fn open(ranges: &[(&str, u128, u128)]) -> Vec<(String, HashKey, HashKey)> {
        ranges
            .iter()
            .map(|(id, a, b)| (id.to_string(), HashKey(*a), HashKey(*b)))
            .collect()
    }

    #[test]
    fn explicit_maps_must_tile_the_keyspace() {
        let ks = Keyspace::new(8).unwrap();
        let map = ShardMap::explicit(ks, open(&[("b", 100, 255), ("a", 0, 99)])).unwrap();
        assert_eq!(map.len(), 2);
        assert_eq!(map.shard_of(HashKey(99)).id, "a");
        assert_eq!(map.shard_of(HashKey(100)).id, "b");
        let err = |ranges: &[(&str, u128, u128)]| {
            ShardMap::explicit(ks, open(ranges))
                .unwrap_err()
                .to_string()
        };
        assert!(
            err(&[("a", 0, 99), ("b", 101, 255)])
                .contains("gap: no open shard covers [100, 100] (between a and b)")
        );
        assert!(err(&[("a", 1, 255)]).contains("gap: no open shard covers [0, 0]"));
        assert!(err(&[("a", 0, 200)]).contains("gap: no open shard covers [201, 255] (after a)"));
        assert!(
            err(&[("a", 0, 120), ("b", 100, 255)])
                .contains("overlap: a and b both cover [100, 120]")
        );
        assert!(err(&[("a", 0, 255), ("b", 255, 255)]).contains("overlap"));
        assert!(err(&[("a", 0, 99), ("a", 100, 255)]).contains("a appears twice"));
        assert!(err(&[("a", 0, 300)]).contains("above the keyspace's top 255"));
        assert!(
            err(&[("a", 0, 99), ("b", 200, 100)])
                .contains("StartingHashKey 200 is above EndingHashKey 100")
        );
        assert!(ShardMap::explicit(ks, Vec::new()).is_err());
    }

    #[test]
    fn uniform_ranges_are_uniform_whatever_their_ids() {
        for bits in [3, 128] {
            let ks = Keyspace::new(bits).unwrap();
            for count in [1, 3, 7, 8] {
                let uniform = ShardMap::uniform(ks, count).unwrap();
                let renamed = uniform
                    .iter()
                    .map(|s| (format!("shardId-{:012}", s.index + 40), s.start, s.end))
                    .collect();
                let explicit = ShardMap::explicit(ks, renamed).unwrap();
                assert!(explicit.is_uniform(), "{count} shards of {bits} bits");
                assert!(uniform.is_uniform());
            }
        }
        let ks = Keyspace::new(8).unwrap();
        let uneven = ShardMap::explicit(ks, open(&[("a", 0, 99), ("b", 100, 255)])).unwrap();
        assert!(!uneven.is_uniform());
        let whole = ShardMap::explicit(ks, open(&[("a", 0, 255)])).unwrap();
        assert!(whole.is_uniform());
    }

    proptest! {
        #[test]
        fn explicit_bisect_matches_a_scan(
            mut cuts in prop::collection::btree_set(1u128..u128::MAX, 0..50),
            key in any::<u128>(),
        ) {
            let mut starts: Vec<u128> = std::iter::once(0).chain(std::mem::take(&mut cuts)).collect();
            starts.dedup();
            let ranges = tiling(&starts);
            let map = ShardMap::explicit(Keyspace::KINESIS, ranges.clone()).unwrap();
            let scanned = ranges.iter().position(|(_, s, e)| s.0 <= key && key <= e.0).unwrap();
            prop_assert_eq!(map.index_of(HashKey(key)), scanned);
        }
    }
}
