//! A stream's load as a plan weighs it: each account's total and each shard's unexplained
//! load, summed while the packed rows are opened, in the order `GET /load` lists the terms.

use std::collections::HashMap;
use std::hash::BuildHasher;

use hashbrown::HashTable;

use super::ShardLoad;
use super::load::{held, listed, open_shards, stored};
use crate::config::LoadConfig;
use crate::store::load::LoadRows;
use crate::store::{StoreError, StreamRow};

/// A stream's load as a plan weighs it, summed while its rows are opened: no string per
/// account and shard, no sort. Each sum runs in the order `GET /load`'s
/// [`StreamLoad`](super::StreamLoad) lists its terms, so that it equals, to the bit, the
/// same sum over its entries.
#[derive(Debug, Clone, Default)]
pub struct LoadTotals {
    /// Its open shards, in key order (as `GET /load` lists them).
    pub shards: Vec<ShardLoad>,
    /// Per account named on a listed shard: its load (each entry at least 0) summed over
    /// those shards in order of their ids.
    pub accounts: AccountTotals,
    /// Per listed shard that names accounts: its utilisation (at least 0; 0 when it is not
    /// open) less each named account's load there, in byte order of their names. What no
    /// report explains; negative when the entries outgrow the shard's own rate.
    pub unexplained: HashMap<String, f64>,
    /// Whether any report was ever counted for the stream.
    pub reported: bool,
}

/// Each named account's load, the names in one arena: a round's million accounts are a few
/// allocations, not one each (allocating and freeing them cost more than the sums).
#[derive(Clone, Default)]
pub struct AccountTotals {
    names: String,
    /// (start in `names`, length, total).
    table: HashTable<(u32, u32, f64)>,
    hasher: foldhash::fast::RandomState,
}

/// An entry's account: `(start, length, _)` in `names`.
fn name_in<'a>(names: &'a str, &(start, len, _): &(u32, u32, f64)) -> &'a str {
    &names[start as usize..start as usize + len as usize]
}

impl AccountTotals {
    /// Empty, with room for `accounts`.
    fn with_capacity(accounts: usize) -> Self {
        AccountTotals {
            names: String::with_capacity(accounts * 16),
            table: HashTable::with_capacity(accounts),
            hasher: Default::default(),
        }
    }

    /// Adds `load` to `account`'s total (0 until then).
    fn add(&mut self, account: &str, load: f64) {
        let hash = self.hasher.hash_one(account);
        let AccountTotals {
            names,
            table,
            hasher,
        } = self;
        match table.find_mut(hash, |e| name_in(names, e) == account) {
            Some((.., total)) => *total += load,
            None => {
                let start = names.len();
                u32::try_from(start + account.len()).expect("account names under 4 GiB");
                names.push_str(account);
                let rehash = |e: &(u32, u32, f64)| hasher.hash_one(name_in(names, e));
                table.insert_unique(hash, (start as u32, account.len() as u32, load), rehash);
            }
        }
    }

    /// `account`'s total, if any entry named it.
    pub fn get(&self, account: &str) -> Option<f64> {
        let hash = self.hasher.hash_one(account);
        let found = self
            .table
            .find(hash, |e| name_in(&self.names, e) == account);
        found.map(|&(.., total)| total)
    }

    /// Every account named, with its total.
    pub fn iter(&self) -> impl Iterator<Item = (&str, f64)> + '_ {
        (self.table.iter()).map(|e| (name_in(&self.names, e), e.2))
    }

    /// How many accounts are named.
    pub fn len(&self) -> usize {
        self.table.len()
    }

    pub fn is_empty(&self) -> bool {
        self.table.is_empty()
    }
}

impl std::fmt::Debug for AccountTotals {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_map().entries(self.iter()).finish()
    }
}

impl LoadTotals {
    /// The totals of the stream `row` from its stored `rows`, decayed to `now_ms` (not
    /// `reported`). O(accounts), one hash map insert or update per entry.
    pub fn open(
        row: &StreamRow,
        rows: &LoadRows,
        now_ms: i64,
        config: &LoadConfig,
    ) -> Result<LoadTotals, StoreError> {
        let (hl, limits) = (config.half_life_ms, config.limits);
        let (mut rates, latest) = listed(row, rows.shards(now_ms)?, now_ms);
        // Each account's entries are added in order of their shards' ids.
        rates.sort_unstable_by(|a, b| a.shard_id.cmp(b.shard_id));
        let own = (rates.iter())
            .map(|s| (s.shard_id, (held(s.rate, s, latest, now_ms, hl), s.source)))
            .collect();
        let shards = open_shards(row, &own, now_ms, limits);
        let open: HashMap<&str, f64> = (shards.iter())
            .map(|s| (s.shard_id.as_str(), s.utilisation.max(0.0)))
            .collect();
        let mut accounts =
            AccountTotals::with_capacity(rates.iter().map(|s| s.accounts.len()).sum());
        let mut unexplained = HashMap::new();
        for shard in rates.iter().filter(|s| !s.accounts.is_empty()) {
            let mut left = open.get(shard.shard_id).copied().unwrap_or(0.0);
            for e in &shard.accounts {
                let load = held(stored(e, shard), shard, latest, now_ms, hl)
                    .utilisation(limits)
                    .max(0.0);
                left -= load;
                accounts.add(e.account, load);
            }
            unexplained.insert(shard.shard_id.to_owned(), left);
        }
        Ok(LoadTotals {
            shards,
            accounts,
            unexplained,
            reported: false,
        })
    }
}

#[cfg(test)]
impl LoadTotals {
    /// The totals summed from `load`'s entries, one by one in its order: the sums
    /// [`LoadTotals::open`] makes while opening the rows, made as they were made before.
    pub(crate) fn summed(load: &super::StreamLoad) -> LoadTotals {
        let open: HashMap<&str, f64> = (load.shards.iter())
            .map(|s| (s.shard_id.as_str(), s.utilisation.max(0.0)))
            .collect();
        let mut totals = LoadTotals {
            shards: load.shards.clone(),
            reported: load.reported,
            ..LoadTotals::default()
        };
        for a in &load.accounts {
            let start = open.get(a.shard_id.as_str()).copied().unwrap_or(0.0);
            let left = (totals.unexplained)
                .entry(a.shard_id.clone())
                .or_insert(start);
            *left -= a.load.max(0.0);
        }
        let mut entries = load.accounts.iter().peekable();
        while let Some(first) = entries.next() {
            let mut total = 0.0;
            total += first.load.max(0.0);
            while let Some(next) = entries.next_if(|e| e.account == first.account) {
                total += next.load.max(0.0);
            }
            totals.accounts.add(&first.account, total);
        }
        totals
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keyspace::{HashKey, Rate};
    use crate::registry::StreamLoad;
    use crate::store::packed::{Entry, Packer};
    use proptest::prelude::*;

    /// A stream of `open` shards as the store holds it: `shardId-…` ids.
    fn stream_row(open: usize) -> StreamRow {
        StreamRow {
            name: "s".to_owned(),
            shards: (0..open)
                .map(|i| {
                    (
                        format!("shardId-{i:012}"),
                        HashKey(i as u128),
                        HashKey(i as u128),
                    )
                })
                .collect(),
            next_shard: open as u64,
            primary: true,
            updated_at: 0,
            version: 1,
            listed: None,
            watch: false,
            kinesis: None,
            sync: Default::default(),
        }
    }

    /// Rows of shards `0..shards` (some not open), each naming some of a few accounts.
    fn rows() -> impl Strategy<Value = Vec<(String, Rate, i64, Vec<u8>)>> {
        let account = (0.0..5e3f64, 0.0..5e6f64);
        let shard = (
            0.0..3e3f64,
            0.0..3e6f64,
            0i64..20_000,
            1i64..10_000,
            -5_000i64..5_000,
            proptest::collection::btree_map("[a-e]{1,2}", account, 0..12),
        );
        proptest::collection::vec(shard, 0..9).prop_map(|shards| {
            (shards.into_iter().enumerate())
                .rev()
                .map(|(i, (r, b, at_ms, window, since, accounts))| {
                    let mut packed = Packer::new(at_ms + since, accounts.len());
                    for (account, &(records_per_s, bytes_per_s)) in &accounts {
                        packed.push(Entry {
                            account,
                            records_per_s,
                            bytes_per_s,
                        });
                    }
                    let rate = Rate {
                        records_per_s: r,
                        bytes_per_s: b,
                        at_ms,
                    };
                    (format!("shardId-{i:012}"), rate, window, packed.finish())
                })
                .collect()
        })
    }

    proptest! {
        /// The totals opened from the rows are, to the bit, those summed from `GET /load`'s
        /// entries as the controller summed them: the same shards, every account's load
        /// and every shard's unexplained remainder.
        #[test]
        fn totals_opened_from_the_rows_are_the_sums_of_the_entries(
            rows in rows(), open in 0usize..9, now in 0i64..40_000,
        ) {
            let (row, rows) = (stream_row(open), LoadRows::packed(rows));
            let config = LoadConfig::default();
            let load = StreamLoad::open(&row, &rows, now, &config).unwrap();
            let totals = LoadTotals::open(&row, &rows, now, &config).unwrap();
            prop_assert_eq!(&totals.shards, &load.shards);
            let want = LoadTotals::summed(&load);
            prop_assert_eq!(totals.accounts.len(), want.accounts.len());
            for (account, total) in want.accounts.iter() {
                let got = totals.accounts.get(account);
                prop_assert_eq!(got.map(f64::to_bits), Some(total.to_bits()), "{}", account);
            }
            prop_assert_eq!(totals.unexplained.len(), want.unexplained.len());
            for (shard, left) in &want.unexplained {
                let got = totals.unexplained.get(shard);
                prop_assert_eq!(got.map(|l| l.to_bits()), Some(left.to_bits()), "{}", shard);
            }
        }
    }
}
