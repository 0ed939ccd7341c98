//! Shard maps: which shard of a stream a hash key lands on, and how even the shards are.

use md5::{Digest, Md5};
use serde::Serialize;

use super::tree::Load;
use super::{Error, HashKey, Keyspace};

/// The most shards a Kinesis stream may have.
pub const MAX_SHARDS: u32 = 100_000;

/// One open shard: an inclusive range of hash keys.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shard {
    pub index: usize,
    pub id: String,
    pub start: HashKey,
    pub end: HashKey,
}

/// The uniform map of `count` shards that CreateStream and UNIFORM_SCALING make: shard `i`
/// starts at `i * floor(2^bits / count)`; the last one ends at the top of the keyspace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShardMap {
    count: u32,
    step: u128,
    max: u128,
}

impl ShardMap {
    /// A uniform map of `count` shards, 1..=100,000 and no more than the keyspace has keys.
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
        let n = u128::from(count);
        // floor((max + 1) / n) without overflowing when max + 1 = 2^128.
        let step = (max / n).saturating_add(u128::from(max % n == n - 1));
        Ok(ShardMap {
            count: count as u32,
            step,
            max,
        })
    }

    pub fn len(&self) -> usize {
        self.count as usize
    }

    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// The shard at `index` (< len).
    pub fn shard(&self, index: usize) -> Shard {
        let start = self.step * index as u128;
        let end = if index + 1 == self.len() {
            self.max
        } else {
            start + self.step - 1
        };
        Shard {
            index,
            id: shard_id(index),
            start: HashKey(start),
            end: HashKey(end),
        }
    }

    /// The shard whose range holds `key`.
    pub fn shard_of(&self, key: HashKey) -> Shard {
        self.shard(self.index_of(key))
    }

    /// Index of the shard whose range holds `key`.
    pub fn index_of(&self, key: HashKey) -> usize {
        (key.0 / self.step).min(u128::from(self.count - 1)) as usize
    }

    pub fn iter(&self) -> impl Iterator<Item = Shard> + '_ {
        (0..self.len()).map(|i| self.shard(i))
    }
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
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct Skew {
    /// Number of shards.
    pub shards: u64,
    /// Number of accounts over all shards.
    pub accounts: u64,
    /// Accounts on the fullest shard.
    pub max: u64,
    /// Accounts on the emptiest shard.
    pub min: u64,
    /// `max` divided by the mean accounts per shard; 1.0 is perfect, 0 when there are none.
    pub max_over_mean: f64,
    /// Sum of the account weights over all shards.
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
        assert!(ShardMap::uniform(Keyspace::KINESIS, 100_001).is_err());
        assert!(ShardMap::uniform(Keyspace::KINESIS, 100_000).is_ok());
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
}
