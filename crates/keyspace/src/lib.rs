//! The pure core: hash keys, account ids, the allocation tree, shard maps and rebalance planning.
//!
//! Nothing here knows about HTTP, databases or async runtimes.

mod account;
mod alloc;
mod balance;
mod key;
pub mod lease_state;
pub mod leases;
mod list_shards;
pub mod load;
mod load_plan;
mod rebalance;
mod selector;
mod shards;
mod split;
mod spread;
#[cfg(test)]
mod spread_model;
mod tree;

pub use account::AccountId;
pub use alloc::Allocator;
pub use key::{HashKey, Keyspace};
pub use list_shards::{
    HashKeyRange, ListShards, ListedShard, SequenceNumberRange, is_kinesis_name, shard_number,
};
pub use load::{Limits, Rate};
pub use load_plan::{
    COLD_HALF_LIVES, KeyLoad, LoadPlan, LoadPlanLimits, LoadSkew, fanout_cold, fanout_target,
    plan_by_load, plan_by_load_keys, suggested_fanout,
};
pub use rebalance::{Holding, Move, Plan, plan};
pub use selector::{jump, sub_key_index};
pub use shards::{MAX_SHARDS, Shard, ShardMap, Skew, md5_hash};
pub use split::{Reshard, SplitPlan, calls_since, calls_to, load_in, split_plan};
pub use spread::Spread;
pub use tree::{KeyTree, Load};

/// Everything that can go wrong in the pure core.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    #[error("hash key must be a decimal integer of at most 39 digits without sign or spaces")]
    HashKeySyntax,
    #[error("hash key {key} is outside the keyspace [0, {max}]")]
    HashKeyOutOfRange { key: HashKey, max: HashKey },
    #[error("account id must be 1 to 256 bytes of UTF-8")]
    AccountLength,
    #[error("account id must not contain control characters")]
    AccountControlChar,
    #[error("account id \"batch\" is reserved: POST /keys/batch allocates in bulk")]
    AccountReserved,
    #[error("keyspace bits must be between 1 and 128, got {0}")]
    KeyspaceBits(u32),
    #[error("shard count must be between 1 and {max}, got {got}")]
    ShardCount { got: u64, max: u64 },
    #[error("weight must be between 1 and {max}, got {got}", max = crate::MAX_WEIGHT)]
    Weight { got: u64 },
    #[error("fanout must be between 1 and {max}, got {got}", max = crate::MAX_FANOUT)]
    Fanout { got: u64 },
    #[error(
        "weight {weight} is below fanout {fanout}: each of an account's keys carries a share of \
         its weight, at least 1, so the weight must be at least the fanout"
    )]
    WeightBelowFanout { weight: u64, fanout: u32 },
    #[error("the open shards do not tile the keyspace: {0}")]
    Tiling(String),
    #[error("not list-shards output: {0}")]
    ListShards(String),
    #[error("hash key {0} is already held")]
    KeyTaken(HashKey),
    #[error("hash key {0} is not held")]
    KeyNotHeld(HashKey),
    #[error("no free hash key is left in [{lo}, {hi}]")]
    Full { lo: HashKey, hi: HashKey },
}

/// The heaviest weight one account may carry.
pub const MAX_WEIGHT: u64 = 1_000_000;

/// The most keys one account may hold.
pub const MAX_FANOUT: u32 = 1024;

/// Checks a fanout against `1..=MAX_FANOUT`.
pub fn check_fanout(fanout: u64) -> Result<u32, Error> {
    match u32::try_from(fanout) {
        Ok(k) if (1..=MAX_FANOUT).contains(&k) => Ok(k),
        _ => Err(Error::Fanout { got: fanout }),
    }
}

/// Checks that an account of `weight` can spread it over `fanout` keys, at least 1 each.
pub fn check_shares(weight: u64, fanout: u32) -> Result<(), Error> {
    if weight >= u64::from(fanout) {
        Ok(())
    } else {
        Err(Error::WeightBelowFanout { weight, fanout })
    }
}

/// The weight key `index` of an account of `weight` and `fanout` carries: ⌊w/K⌋, plus 1
/// for the first `w mod K` keys, so the keys' weights sum to the account's.
pub fn key_weight(weight: u64, fanout: u32, index: u32) -> u64 {
    let k = u64::from(fanout);
    weight / k + u64::from(u64::from(index) < weight % k)
}

/// Checks an account weight against `1..=MAX_WEIGHT`.
pub fn check_weight(weight: u64) -> Result<u64, Error> {
    if (1..=MAX_WEIGHT).contains(&weight) {
        Ok(weight)
    } else {
        Err(Error::Weight { got: weight })
    }
}
