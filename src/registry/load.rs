//! Observed load: reports folded in at heartbeats, in the heartbeat's own transaction, and
//! each stream's load as of the database's clock, so every replica answers the same.

use std::collections::{BTreeMap, HashMap, HashSet};

use super::{Error, Registry, Stream};
use crate::keyspace::load::{decay, held_ms};
use crate::keyspace::{Limits, Rate};
use crate::store::leases::LeaseRow;
use crate::store::load::{AccountRate, ShardRate};
use crate::store::{StoreError, Tx};

/// How reports are smoothed and weighed.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LoadConfig {
    /// Rates halve over this many milliseconds without reports.
    pub half_life_ms: i64,
    /// A shard's write limit: utilisation 1 uses all of it.
    pub limits: Limits,
    /// The share of a shard's limit one key of an account should carry at most: an
    /// account of load L is suggested ⌈L ÷ share⌉ keys.
    pub hot_account_share: f64,
}

impl Default for LoadConfig {
    fn default() -> Self {
        LoadConfig {
            half_life_ms: 120_000,
            limits: Limits::default(),
            hot_account_share: 0.5,
        }
    }
}

/// Most accounts one report entry may name.
pub const MAX_REPORT_ACCOUNTS: usize = 1000;

/// Longest window one report entry may cover: an hour, in milliseconds.
pub const MAX_WINDOW_MS: u64 = 3_600_000;

/// Records/s and bytes/s below which an account's rate is forgotten.
const FADED: f64 = 1e-3;

/// Half-lives after which a shard's account rows are brought to a newer instant (one
/// statement over the shard's rows, every few minutes at most), so that their stored
/// numbers never grow far.
const REBASE_HALF_LIVES: i64 = 1;

/// What a worker read from one shard since its last report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoadReport {
    pub shard_id: String,
    /// The lease's epoch the worker read it at.
    pub epoch: u64,
    /// 1..=[`MAX_WINDOW_MS`].
    pub window_ms: u64,
    pub records: u64,
    pub bytes: u64,
    /// The worker's top accounts of the shard (at most [`MAX_REPORT_ACCOUNTS`]).
    pub accounts: Vec<AccountReport>,
}

/// One account's part of a report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AccountReport {
    pub account: String,
    pub records: u64,
    pub bytes: u64,
}

/// Why a report entry was not counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IgnoreReason {
    /// The worker does not own the shard's lease (another does, or nobody).
    NotHeld,
    /// The worker owns the lease at another epoch than the entry's.
    StaleEpoch,
    /// The worker's lease is being revoked: what it reads now is not counted.
    Revoking,
    /// The stream's map no longer lists the shard.
    NotListed,
}

/// A report entry not counted, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IgnoredLoad {
    pub shard_id: String,
    pub epoch: u64,
    pub reason: IgnoreReason,
}

/// A shard's load as of now.
#[derive(Debug, Clone, PartialEq)]
pub struct ShardLoad {
    pub shard_id: String,
    pub rate: Rate,
    pub utilisation: f64,
}

/// An account's load on one shard as of now.
#[derive(Debug, Clone, PartialEq)]
pub struct AccountLoad {
    pub account: String,
    pub shard_id: String,
    pub rate: Rate,
    /// Its rate's share of a shard's limit (utilisation's formula).
    pub load: f64,
}

/// A stream's load as of now.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct StreamLoad {
    /// Its open shards, in key order (a shard never reported has rate 0).
    pub shards: Vec<ShardLoad>,
    /// Per (account, shard) reported, by account then shard, on shards the map lists.
    pub accounts: Vec<AccountLoad>,
    /// Whether any report was ever counted for the stream.
    pub reported: bool,
}

impl Registry {
    /// How reports are smoothed and weighed.
    pub fn load_config(&self) -> LoadConfig {
        *self.load_config.read().expect("load config lock poisoned")
    }

    pub fn set_load_config(&self, config: LoadConfig) {
        *self.load_config.write().expect("load config lock poisoned") = config;
    }

    /// `stream`'s load as the database holds it, decayed to the database's clock.
    pub async fn stream_load(&self, stream: &str) -> Result<StreamLoad, Error> {
        Ok(self.stream_load_at(stream).await?.0)
    }

    /// [`Registry::stream_load`], and the database's clock it is decayed to (Unix ms).
    pub async fn stream_load_at(&self, stream: &str) -> Result<(StreamLoad, i64), Error> {
        let Some(stream) = self.stream(stream) else {
            return Err(Error::UnknownStream(stream.to_owned()));
        };
        let mut tx = self.store.snapshot().await?;
        let now = tx.clock_ms().await?;
        let load = tx
            .stream_load(&stream.name, now, &self.load_config())
            .await?;
        Ok((load, now))
    }

    /// Refuses reports on shards `stream`'s map does not list, unless the worker still
    /// owns the lease of one (`owned`): the map dropped it while the worker read it.
    pub(super) fn check_load_shards(
        stream: &Stream,
        owned: &[LeaseRow],
        load: &[LoadReport],
    ) -> Result<(), Error> {
        for (i, report) in load.iter().enumerate() {
            let id = report.shard_id.as_str();
            if stream.lease_shard(id).is_none() && !owned.iter().any(|l| l.shard_id == id) {
                return Err(Error::InvalidReport(format!(
                    "load[{i}].shard_id: stream {:?} lists no shard {:?}",
                    stream.name, report.shard_id
                )));
            }
        }
        Ok(())
    }

    /// Folds the entries of `load` that `worker` may report (it holds the shard at that
    /// epoch, by `owned`, its lease rows as this transaction read them) into the stream's
    /// rates at `now`; answers the others. Touches only the reported shards' rows.
    pub(super) async fn fold_load(
        &self,
        tx: &mut Tx,
        stream: &Stream,
        owned: &[LeaseRow],
        load: Vec<LoadReport>,
        now: i64,
    ) -> Result<Vec<IgnoredLoad>, Error> {
        let mut ignored = Vec::new();
        let mut counted = Vec::new();
        for report in load {
            let lease = owned.iter().find(|l| l.shard_id == report.shard_id);
            let reason = match lease {
                _ if stream.lease_shard(&report.shard_id).is_none() => {
                    Some(IgnoreReason::NotListed)
                }
                None => Some(IgnoreReason::NotHeld),
                Some(l) if l.holder.epoch != report.epoch => Some(IgnoreReason::StaleEpoch),
                Some(l) if l.holder.next.is_some() => Some(IgnoreReason::Revoking),
                Some(_) => None,
            };
            match reason {
                Some(reason) => ignored.push(IgnoredLoad {
                    shard_id: report.shard_id,
                    epoch: report.epoch,
                    reason,
                }),
                None => counted.push(report),
            }
        }
        if counted.is_empty() {
            return Ok(ignored);
        }
        let name = stream.name.as_str();
        let hl = self.load_config().half_life_ms;
        if tx.load_map_version(name).await? != Some(stream.version) {
            // A newer map: the rows of shards it dropped go (once per map).
            for shard in tx.loaded_shards(name).await? {
                if stream.lease_shard(&shard).is_none() {
                    tx.forget_shard_load(name, &shard).await?;
                }
            }
        }
        for report in counted {
            let shard = report.shard_id.as_str();
            let fresh = ShardRate {
                rate: Rate {
                    at_ms: now,
                    ..Rate::default()
                },
                accounts_at: now,
                window_ms: 0,
            };
            let mut stored = tx.shard_rate(name, shard).await?.unwrap_or(fresh);
            let window = report.window_ms as i64;
            stored.window_ms = window;
            stored.rate = stored
                .rate
                .observe(report.records, report.bytes, window, now, hl);
            if now - stored.accounts_at > REBASE_HALF_LIVES * hl {
                let factor = decay(now - stored.accounts_at, hl);
                tx.rescale_account_load(name, shard, factor, now).await?;
                stored.accounts_at = now;
            }
            tx.put_shard_rate(name, shard, stored).await?;
            // What is worth 1 now, as of the rows' instant.
            let grown = 1.0 / decay(now - stored.accounts_at, hl);
            if !report.accounts.is_empty() {
                fold_accounts(tx, name, &report, grown, hl).await?;
            }
            tx.prune_account_load(name, shard, FADED * grown).await?;
        }
        tx.mark_reported(name, stream.version, now).await?;
        Ok(ignored)
    }
}

/// Adds a report's accounts to their rates on its shard, each share grown by `grown` to
/// the instant the shard's account rows are stored as of: one write, no read. An account
/// named twice counts once, with both parts.
async fn fold_accounts(
    tx: &mut Tx,
    stream: &str,
    report: &LoadReport,
    grown: f64,
    hl: i64,
) -> Result<(), StoreError> {
    let mut parts: BTreeMap<&str, (u64, u64)> = BTreeMap::new();
    for a in &report.accounts {
        let (r, b) = parts.entry(a.account.as_str()).or_default();
        *r = r.saturating_add(a.records);
        *b = b.saturating_add(a.bytes);
    }
    let window = report.window_ms as i64;
    let rows: Vec<AccountRate> = parts
        .into_iter()
        .map(|(account, (r, b))| {
            // The share this window adds now (see `Rate::observe`), grown.
            let share = Rate::default().observe(r, b, window, 0, hl);
            AccountRate {
                account: account.to_owned(),
                records_per_s: share.records_per_s * grown,
                bytes_per_s: share.bytes_per_s * grown,
            }
        })
        .collect();
    tx.add_account_rates(stream, &report.shard_id, &rows).await
}

impl Tx {
    /// `stream`'s load as this transaction reads it, decayed to `now_ms`: its open shards
    /// in key order, and its accounts' rates on the shards its map lists.
    pub async fn stream_load(
        &mut self,
        stream: &str,
        now_ms: i64,
        config: &LoadConfig,
    ) -> Result<StreamLoad, StoreError> {
        let Some(row) = self.load_stream(stream).await? else {
            return Ok(StreamLoad::default());
        };
        let reported = self.load_map_version(stream).await?.is_some();
        let (hl, limits) = (config.half_life_ms, config.limits);
        let mut shard_rates: HashMap<String, Rate> = HashMap::new();
        let mut accounts = Vec::new();
        let listed: HashSet<&str> = match &row.listed {
            Some(listed) => listed.iter().map(|s| s.id.as_str()).collect(),
            None => row.shards.iter().map(|(id, ..)| id.as_str()).collect(),
        };
        let mut rows = self.load_rows(stream).await?;
        rows.retain(|r| listed.contains(r.shard_id.as_str()));
        let latest = rows.iter().map(|r| r.reported_ms).max().unwrap_or(now_ms);
        for r in rows {
            let held = held_ms(r.reported_ms, r.window_ms, latest);
            let rate = r.rate.held(now_ms, held, hl);
            if r.account.is_empty() {
                shard_rates.insert(r.shard_id, rate);
            } else {
                accounts.push(AccountLoad {
                    load: rate.utilisation(limits),
                    account: r.account,
                    shard_id: r.shard_id,
                    rate,
                });
            }
        }
        accounts.sort_by(|a, b| (&a.account, &a.shard_id).cmp(&(&b.account, &b.shard_id)));
        let idle = Rate {
            at_ms: now_ms,
            ..Rate::default()
        };
        let shards = row
            .shards
            .iter()
            .map(|(id, ..)| {
                let rate = shard_rates.get(id).copied().unwrap_or(idle);
                ShardLoad {
                    shard_id: id.clone(),
                    utilisation: rate.utilisation(limits),
                    rate,
                }
            })
            .collect();
        Ok(StreamLoad {
            shards,
            accounts,
            reported,
        })
    }
}
