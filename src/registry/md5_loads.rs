//! What MD5 of the account names would give: the comparison beside keyspread's own loads.
//!
//! At a million accounts the hashing is most of the time a distribution or the operator
//! page takes, so it is spread over the cores the process may use, and the last result is
//! kept until an account's name, weight or fanout changes.

use std::fmt::Write as _;

use super::Registry;
use crate::keyspace::{self, AccountId, Keyspace, Load, ShardMap};

/// Fewest names worth a thread of their own.
const NAMES_PER_THREAD: usize = 50_000;

/// MD5 loads as computed on one map at one count of account changes.
#[derive(Debug)]
pub(super) struct Md5Loads {
    changes: u64,
    map: ShardMap,
    loads: Vec<Load>,
}

impl Registry {
    /// Keys and weight per shard had the account names been MD5-hashed by Kinesis: the
    /// name itself for an account of one key, `name#0` .. `name#K-1` (seed 001's suffixes)
    /// for one of K, each with its key's share. Blocks: the names are copied under the
    /// accounts lock and hashed after releasing it, so lookups and changes never wait on
    /// the hashing; unless no account changed since the last call on this map, whose
    /// answer is then the same.
    pub fn md5_loads(&self, map: &ShardMap) -> Vec<Load> {
        let (changes, named) = {
            let accounts = self.accounts.read().expect("accounts lock poisoned");
            let changes = accounts.changes();
            let cached = self.md5_cache.lock().expect("md5 cache lock poisoned");
            if let Some(c) = cached
                .as_ref()
                .filter(|c| c.changes == changes && c.map == *map)
            {
                return c.loads.clone();
            }
            drop(cached);
            let named: Vec<(AccountId, u64, u32)> = accounts
                .named()
                .map(|(id, weight, fanout)| (id.clone(), weight, fanout))
                .collect();
            (changes, named)
        };
        let loads = hash_all(&named, map, self.keyspace);
        *self.md5_cache.lock().expect("md5 cache lock poisoned") = Some(Md5Loads {
            changes,
            map: map.clone(),
            loads: loads.clone(),
        });
        loads
    }
}

/// The MD5 loads of `named` on `map`, a share of the names per core. The threads inherit
/// the caller's scheduling priority (a heavy-work thread's, lowered).
fn hash_all(named: &[(AccountId, u64, u32)], map: &ShardMap, keyspace: Keyspace) -> Vec<Load> {
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    let share = named.len().div_ceil(cores).max(NAMES_PER_THREAD);
    if named.len() <= share {
        return hash(named, map, keyspace);
    }
    std::thread::scope(|scope| {
        let parts: Vec<_> = named
            .chunks(share)
            .map(|part| scope.spawn(move || hash(part, map, keyspace)))
            .collect();
        let mut sum = vec![Load::default(); map.len()];
        for part in parts {
            let part = part.join().expect("MD5 hashing panicked");
            for (total, load) in sum.iter_mut().zip(part) {
                *total = *total + load;
            }
        }
        sum
    })
}

fn hash(named: &[(AccountId, u64, u32)], map: &ShardMap, keyspace: Keyspace) -> Vec<Load> {
    let mut loads = vec![Load::default(); map.len()];
    // One buffer for every suffixed name: a hot account's keys make no string each.
    let mut suffixed = String::with_capacity(300);
    for &(ref id, weight, fanout) in named {
        if fanout == 1 {
            let shard = map.index_of(keyspace::md5_hash(id.as_str(), keyspace));
            loads[shard] = loads[shard] + Load::one(weight);
            continue;
        }
        for i in 0..fanout {
            suffixed.clear();
            let _ = write!(suffixed, "{id}#{i}");
            let shard = map.index_of(keyspace::md5_hash(&suffixed, keyspace));
            loads[shard] = loads[shard] + Load::one(keyspace::key_weight(weight, fanout, i));
        }
    }
    loads
}

#[cfg(test)]
mod tests {
    use super::*;

    fn named(count: usize) -> Vec<(AccountId, u64, u32)> {
        (0..count)
            .map(|i| {
                let id = AccountId::parse(format!("acct-{i}")).unwrap();
                let fanout = if i % 100 == 0 { 4 } else { 1 };
                (id, 1 + i as u64 % 5 + u64::from(fanout), fanout)
            })
            .collect()
    }

    #[test]
    fn shares_over_threads_sum_to_the_whole() {
        let keyspace = Keyspace::KINESIS;
        let map = ShardMap::uniform(keyspace, 7).unwrap();
        let names = named(3 * NAMES_PER_THREAD + 17);
        let mut whole = vec![Load::default(); map.len()];
        for part in names.chunks(1000) {
            for (total, load) in whole.iter_mut().zip(hash(part, &map, keyspace)) {
                *total = *total + load;
            }
        }
        assert_eq!(hash_all(&names, &map, keyspace), whole);
        let keys: u64 = whole.iter().map(|l| l.count).sum();
        assert_eq!(keys as usize, names.len() + 3 * names.len().div_ceil(100));
    }

    #[test]
    fn a_hot_account_hashes_its_suffixed_names() {
        let keyspace = Keyspace::KINESIS;
        let map = ShardMap::uniform(keyspace, 4).unwrap();
        let id = AccountId::parse("big").unwrap();
        let loads = hash(&[(id, 7, 3)], &map, keyspace);
        let mut expected = vec![Load::default(); 4];
        for (i, weight) in [(0, 3), (1, 2), (2, 2)] {
            let shard = map.index_of(keyspace::md5_hash(&format!("big#{i}"), keyspace));
            expected[shard] = expected[shard] + Load::one(weight);
        }
        assert_eq!(loads, expected);
    }
}
