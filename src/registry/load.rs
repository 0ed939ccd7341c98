//! Observed load: consumers' reports folded in at heartbeats, in the heartbeat's own
//! transaction, and producers' reports of what they sent; each stream's load as of the
//! database's clock, so every replica answers the same.

use super::{Error, LoadTotals, Registry, Stream, Ticket, detached};
use crate::config::LoadConfig;
use crate::keyspace::load::{decay, held_ms};
use crate::keyspace::{HashKey, Limits, Rate};
use crate::store::leases::LeaseRow;
use crate::store::load::{LoadRows, LoadSource, ShardRates, ShardRow};
use crate::store::packed::{Entry, Packer, unpack};
use crate::store::{Actor, StoreError, StreamRow, Tx};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

/// Most accounts one report entry may name.
pub const MAX_REPORT_ACCOUNTS: usize = 1000;

/// Longest window one report entry may cover: an hour, in milliseconds.
pub const MAX_WINDOW_MS: u64 = 3_600_000;

/// Records/s and bytes/s below which an account's rate is forgotten.
const FADED: f64 = 1e-3;

/// Most accounts a shard keeps rates for: its heaviest by smoothed load. Twice what one
/// report may name, so that a report of new names never pushes out the accounts of the
/// one before; and an account left out carries less of its shard's load than each of the
/// 2,000 kept (under 1/2,001 of it), far from hot. Without a bound, reports naming ever
/// new accounts would grow the row each heartbeat rewrites without end.
pub const MAX_SHARD_ACCOUNTS: usize = 2 * MAX_REPORT_ACCOUNTS;

/// How long a producer's highest report counted is kept after its last report: a day.
const PRODUCER_SEQ_KEPT_MS: i64 = 24 * 3_600_000;

/// Most rows of producers gone quiet one report forgets.
const PRODUCER_SEQS_FORGOTTEN: i64 = 64;

/// What went through one shard over a window, as either source reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardReport {
    pub shard_id: String,
    /// 1..=[`MAX_WINDOW_MS`].
    pub window_ms: u64,
    pub records: u64,
    pub bytes: u64,
    /// Its accounts' parts: a worker's top accounts of the shard (at most
    /// [`MAX_REPORT_ACCOUNTS`]), or every account a producer sent there.
    pub accounts: Vec<AccountReport>,
}

/// What a worker read from one shard since its last report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoadReport {
    /// The lease's epoch the worker read it at.
    pub epoch: u64,
    pub read: ShardReport,
}

/// What a producer sent since its last report: records and bytes per account and key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProducerReport {
    /// The producer's id (a worker id's syntax).
    pub producer: String,
    /// The report's number: a producer numbers its reports upwards, and one numbered at or
    /// below its highest counted was counted before.
    pub seq: i64,
    /// 1..=[`MAX_WINDOW_MS`].
    pub window_ms: u64,
    /// At most [`MAX_REPORT_ACCOUNTS`].
    pub keys: Vec<KeyReport>,
}

/// One key's part of a producer's report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyReport {
    pub account: String,
    pub hash_key: HashKey,
    pub records: u64,
    pub bytes: u64,
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
    /// Whose reports its figures come from; none when nobody ever reported it (rate 0).
    pub source: Option<LoadSource>,
}

impl ShardLoad {
    /// Whether any report of it is stored.
    pub fn reported(&self) -> bool {
        self.source.is_some()
    }
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

    /// `stream`'s load as a plan weighs it (see [`LoadTotals`]), decayed to the database's
    /// clock.
    pub async fn load_totals(&self, stream: &str) -> Result<LoadTotals, Error> {
        let Some(stream) = self.stream(stream) else {
            return Err(Error::UnknownStream(stream.to_owned()));
        };
        let mut tx = self.store.snapshot().await?;
        let now = tx.clock_ms().await?;
        let config = self.load_config();
        Ok(tx.load_totals(&stream.name, now, &config).await?)
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
            let id = report.read.shard_id.as_str();
            if stream.lease_shard(id).is_none() && !owned.iter().any(|l| l.shard_id == id) {
                return Err(Error::InvalidReport(format!(
                    "load[{i}].shard_id: stream {:?} lists no shard {id:?}",
                    stream.name
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
        for LoadReport { epoch, read } in load {
            let lease = owned.iter().find(|l| l.shard_id == read.shard_id);
            let reason = match lease {
                _ if stream.lease_shard(&read.shard_id).is_none() => Some(IgnoreReason::NotListed),
                None => Some(IgnoreReason::NotHeld),
                Some(l) if l.holder.epoch != epoch => Some(IgnoreReason::StaleEpoch),
                Some(l) if l.holder.next.is_some() => Some(IgnoreReason::Revoking),
                Some(_) => None,
            };
            match reason {
                Some(reason) => ignored.push(IgnoredLoad {
                    shard_id: read.shard_id,
                    epoch,
                    reason,
                }),
                None => counted.push(read),
            }
        }
        if !counted.is_empty() {
            self.fold_reports(tx, stream, LoadSource::Consumers, counted, now)
                .await?;
        }
        Ok(ignored)
    }

    /// Counts `report` of what a producer sent to `stream`, unless a report of its as high
    /// a number was counted before: each key's records go to the shard of the stream's map
    /// its hash key falls in. Answers whether it was counted now.
    pub async fn report_producer_load(
        self: &Arc<Self>,
        stream: &str,
        report: ProducerReport,
        actor: &Actor,
        ticket: &Ticket,
    ) -> Result<bool, Error> {
        let stream = self
            .stream(stream)
            .ok_or_else(|| Error::UnknownStream(stream.to_owned()))?;
        let (this, actor, ticket) = (Arc::clone(self), actor.clone(), ticket.clone());
        detached(async move {
            if !ticket.wanted() {
                return Err(Error::NotMade);
            }
            // The stream's lock, which heartbeats' folds take too: one writer of its rows.
            let (mut tx, stream, now) = this.begin_leases(&stream).await?;
            let counted = tx
                .count_producer_seq(&report.producer, report.seq, now)
                .await?;
            if counted {
                let quiet = now - PRODUCER_SEQ_KEPT_MS;
                tx.forget_producer_seqs(quiet, PRODUCER_SEQS_FORGOTTEN)
                    .await?;
            }
            if counted && !report.keys.is_empty() {
                let reports = by_shard(&stream, report.keys, report.window_ms);
                this.fold_reports(&mut tx, &stream, LoadSource::Producers, reports, now)
                    .await?;
            }
            ticket.keep_in(&mut tx, &actor, Ok(&counted), now).await?;
            super::metrics::settle(tx, &[&ticket], None).await?;
            Ok(counted)
        })
        .await
    }

    /// Folds `reports` of `source` into the stream's rates at `now`. Touches only the
    /// reported shards' rows (and, once per new map, drops the rows of shards it dropped).
    async fn fold_reports(
        &self,
        tx: &mut Tx,
        stream: &Stream,
        source: LoadSource,
        reports: Vec<ShardReport>,
        now: i64,
    ) -> Result<(), Error> {
        let name = stream.name.as_str();
        let config = self.load_config();
        if tx.load_map_version(name).await? != Some(stream.version) {
            // A newer map: the rows of shards it dropped go (once per map).
            for shard in tx.loaded_shards(name).await? {
                if stream.lease_shard(&shard).is_none() {
                    tx.forget_shard_load(name, &shard).await?;
                }
            }
        }
        for report in reports {
            let shard = report.shard_id.as_str();
            let row = tx.shard_row(source, name, shard).await?;
            let idle = Rate {
                at_ms: now,
                ..Rate::default()
            };
            let window = report.window_ms as i64;
            let rate = (row.as_ref().map_or(idle, |r| r.rate)).observe(
                report.records,
                report.bytes,
                window,
                now,
                config.half_life_ms,
            );
            let unpacked;
            let (as_of, old) = match &row {
                Some(ShardRow {
                    accounts: Some(packed),
                    ..
                }) => unpack(packed)?,
                Some(row) => {
                    unpacked = tx.take_unpacked_accounts(name, shard).await?;
                    let entries = unpacked.iter().map(|(account, r, b)| Entry {
                        account,
                        records_per_s: *r,
                        bytes_per_s: *b,
                    });
                    (row.accounts_at, entries.collect())
                }
                None => (now, Vec::new()),
            };
            let at = now.max(as_of);
            let left = decay(now - as_of, config.half_life_ms);
            let mut folded = fold_accounts(&old, left, &report, config.half_life_ms);
            keep_heaviest(&mut folded, MAX_SHARD_ACCOUNTS, config.limits);
            let mut packed = Packer::new(at, folded.len());
            folded.into_iter().for_each(|e| packed.push(e));
            let packed = packed.finish();
            tx.put_shard_row(source, name, shard, (rate, window), at, &packed)
                .await?;
        }
        tx.mark_reported(name, stream.version, now).await?;
        Ok(())
    }
}

/// `keys` sent over `window_ms`, summed by the shard of `stream`'s map each key falls in,
/// each shard's accounts in the order the keys came.
fn by_shard(stream: &Stream, keys: Vec<KeyReport>, window_ms: u64) -> Vec<ShardReport> {
    let mut shards: BTreeMap<String, ShardReport> = BTreeMap::new();
    for key in keys {
        let shard_id = stream.map.shard_of(key.hash_key).id;
        let shard = shards.entry(shard_id).or_insert_with_key(|id| ShardReport {
            shard_id: id.clone(),
            window_ms,
            records: 0,
            bytes: 0,
            accounts: Vec::new(),
        });
        shard.records = shard.records.saturating_add(key.records);
        shard.bytes = shard.bytes.saturating_add(key.bytes);
        shard.accounts.push(AccountReport {
            account: key.account,
            records: key.records,
            bytes: key.bytes,
        });
    }
    shards.into_values().collect()
}

/// `old` (a shard's account rates, in byte order of their names) decayed by `left`, with
/// `report`'s accounts' shares added, in the same order; rates that faded below [`FADED`]
/// are left out. One pass over both, no read or write per account. An account named twice
/// counts once, with both parts.
fn fold_accounts<'a>(
    old: &[Entry<'a>],
    left: f64,
    report: &'a ShardReport,
    hl: i64,
) -> Vec<Entry<'a>> {
    let mut parts: BTreeMap<&str, (u64, u64)> = BTreeMap::new();
    for a in &report.accounts {
        let (r, b) = parts.entry(a.account.as_str()).or_default();
        *r = r.saturating_add(a.records);
        *b = b.saturating_add(a.bytes);
    }
    let window = report.window_ms as i64;
    // The share a window adds now (see `Rate::observe`).
    let share = |(r, b): (u64, u64)| Rate::default().observe(r, b, window, 0, hl);
    let mut folded = Vec::with_capacity(old.len() + parts.len());
    let mut push = |account: &'a str, records_per_s: f64, bytes_per_s: f64| {
        if records_per_s >= FADED || bytes_per_s >= FADED {
            folded.push(Entry {
                account,
                records_per_s,
                bytes_per_s,
            });
        }
    };
    let mut old = old.iter().peekable();
    let mut new = parts.into_iter().peekable();
    loop {
        let next_old = old.peek().map(|e| e.account);
        let next_new = new.peek().map(|(a, _)| *a);
        match (next_old, next_new) {
            (None, None) => break,
            (Some(o), n) if n.is_none_or(|n| o < n) => {
                let e = old.next().expect("peeked");
                push(o, e.records_per_s * left, e.bytes_per_s * left);
            }
            (o, Some(n)) if o.is_none_or(|o| n < o) => {
                let (_, part) = new.next().expect("peeked");
                let add = share(part);
                push(n, add.records_per_s, add.bytes_per_s);
            }
            (_, Some(n)) => {
                let e = old.next().expect("peeked");
                let (_, part) = new.next().expect("peeked");
                let add = share(part);
                push(
                    n,
                    e.records_per_s * left + add.records_per_s,
                    e.bytes_per_s * left + add.bytes_per_s,
                );
            }
            (Some(_), None) => unreachable!("an old entry alone takes the first arm"),
        }
    }
    folded
}

/// Leaves the `most` heaviest of `entries` by load under `limits` (of equals, the first
/// by name), still in byte order of their names. O(entries).
fn keep_heaviest(entries: &mut Vec<Entry<'_>>, most: usize, limits: Limits) {
    if entries.len() <= most {
        return;
    }
    let load = |e: &Entry<'_>| {
        let rate = Rate {
            records_per_s: e.records_per_s,
            bytes_per_s: e.bytes_per_s,
            at_ms: 0,
        };
        rate.utilisation(limits)
    };
    let heavier = |a: &Entry<'_>, b: &Entry<'_>| {
        load(b)
            .total_cmp(&load(a))
            .then_with(|| a.account.cmp(b.account))
    };
    entries.select_nth_unstable_by(most - 1, heavier);
    entries.truncate(most);
    entries.sort_unstable_by(|a, b| a.account.cmp(b.account));
}

impl Tx {
    /// `stream`'s load as this transaction reads it, decayed to `now_ms`: its open shards
    /// in key order, and its accounts' rates on the shards its map lists. The rows are
    /// opened and ordered on a blocking thread: a million accounts' take a while.
    pub async fn stream_load(
        &mut self,
        stream: &str,
        now_ms: i64,
        config: &LoadConfig,
    ) -> Result<StreamLoad, StoreError> {
        let config = *config;
        let load = self.open_load(stream, move |row, rows, reported| {
            let load = StreamLoad::open(row, rows, now_ms, &config)?;
            Ok(StreamLoad { reported, ..load })
        });
        Ok(load.await?.unwrap_or_default())
    }

    /// `stream`'s load as a plan weighs it (see [`LoadTotals`]), decayed to `now_ms`; the
    /// rows are opened and summed on a blocking thread.
    pub async fn load_totals(
        &mut self,
        stream: &str,
        now_ms: i64,
        config: &LoadConfig,
    ) -> Result<LoadTotals, StoreError> {
        let config = *config;
        let totals = self.open_load(stream, move |row, rows, reported| {
            let totals = LoadTotals::open(row, rows, now_ms, &config)?;
            Ok(LoadTotals { reported, ..totals })
        });
        Ok(totals.await?.unwrap_or_default())
    }

    /// Reads `stream`'s load rows and opens them with `open` on a blocking thread, told
    /// whether any report was ever counted for the stream; `None` for a stream with no row.
    async fn open_load<T, F>(&mut self, stream: &str, open: F) -> Result<Option<T>, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&StreamRow, &LoadRows, bool) -> Result<T, StoreError> + Send + 'static,
    {
        let Some(row) = self.load_stream(stream).await? else {
            return Ok(None);
        };
        let reported = self.load_map_version(stream).await?.is_some();
        let rows = self.load_rows(stream).await?;
        tokio::task::spawn_blocking(move || open(&row, &rows, reported).map(Some))
            .await
            .expect("reading load does not panic")
    }
}

/// `row`'s listed shards of `rates` (the others are left out), and the instant the latest
/// of them was reported (`now_ms` when none was).
pub(super) fn listed<'a>(
    row: &StreamRow,
    mut rates: Vec<ShardRates<'a>>,
    now_ms: i64,
) -> (Vec<ShardRates<'a>>, i64) {
    let listed: HashSet<&str> = match &row.listed {
        Some(listed) => listed.iter().map(|s| s.id.as_str()).collect(),
        None => row.shards.iter().map(|(id, ..)| id.as_str()).collect(),
    };
    rates.retain(|r| listed.contains(r.shard_id));
    let latest = rates.iter().map(|r| r.reported_ms).max().unwrap_or(now_ms);
    (rates, latest)
}

/// A rate stored in `shard`'s row, as of `now_ms` (held for as long as its report's
/// window covers, see [`held_ms`]).
pub(super) fn held(rate: Rate, shard: &ShardRates<'_>, latest: i64, now_ms: i64, hl: i64) -> Rate {
    rate.held(
        now_ms,
        held_ms(shard.reported_ms, shard.window_ms, latest),
        hl,
    )
}

/// An account's stored rate in `shard`'s row.
pub(super) fn stored(e: &Entry<'_>, shard: &ShardRates<'_>) -> Rate {
    Rate {
        records_per_s: e.records_per_s,
        bytes_per_s: e.bytes_per_s,
        at_ms: shard.accounts_at,
    }
}

/// `row`'s open shards in key order, each at its `own` rate and from its source (idle at
/// `now_ms` if none).
pub(super) fn open_shards(
    row: &StreamRow,
    own: &HashMap<&str, (Rate, LoadSource)>,
    now_ms: i64,
    limits: Limits,
) -> Vec<ShardLoad> {
    let idle = Rate {
        at_ms: now_ms,
        ..Rate::default()
    };
    (row.shards.iter())
        .map(|(id, ..)| {
            let reported = own.get(id.as_str()).copied();
            let rate = reported.map_or(idle, |(rate, _)| rate);
            ShardLoad {
                shard_id: id.clone(),
                utilisation: rate.utilisation(limits),
                rate,
                source: reported.map(|(_, source)| source),
            }
        })
        .collect()
}

impl StreamLoad {
    /// The load of the stream `row` from its stored `rows`, decayed to `now_ms` (not
    /// `reported`). O(accounts): a string per account and shard, sorted.
    pub fn open(
        row: &StreamRow,
        rows: &LoadRows,
        now_ms: i64,
        config: &LoadConfig,
    ) -> Result<StreamLoad, StoreError> {
        let (hl, limits) = (config.half_life_ms, config.limits);
        let (rates, latest) = listed(row, rows.shards(now_ms)?, now_ms);
        let mut own = HashMap::new();
        let mut accounts = Vec::new();
        for shard in &rates {
            let rate = held(shard.rate, shard, latest, now_ms, hl);
            own.insert(shard.shard_id, (rate, shard.source));
            for e in &shard.accounts {
                let rate = held(stored(e, shard), shard, latest, now_ms, hl);
                accounts.push(AccountLoad {
                    account: e.account.to_owned(),
                    shard_id: shard.shard_id.to_owned(),
                    rate,
                    load: rate.utilisation(limits),
                });
            }
        }
        accounts.sort_by(|a, b| (&a.account, &a.shard_id).cmp(&(&b.account, &b.shard_id)));
        Ok(StreamLoad {
            shards: open_shards(row, &own, now_ms, limits),
            accounts,
            reported: false,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// The entries kept are those a full sort by load would keep, in name order.
        #[test]
        fn the_heaviest_are_kept_in_name_order(
            rates in prop::collection::btree_map("[a-z]{1,6}", (0.0..50.0f64, 0.0..5e4f64), 0..60),
            most in 1usize..40,
        ) {
            let limits = Limits { records_per_s: 10.0, bytes_per_s: 1e4 };
            let entries: Vec<Entry<'_>> = (rates.iter())
                .map(|(a, &(r, b))| Entry { account: a, records_per_s: r, bytes_per_s: b })
                .collect();
            let load = |e: &Entry<'_>| (e.records_per_s / 10.0).max(e.bytes_per_s / 1e4);
            let mut sorted = entries.clone();
            sorted.sort_by(|a, b| load(b).total_cmp(&load(a)).then_with(|| a.account.cmp(b.account)));
            sorted.truncate(most);
            sorted.sort_by(|a, b| a.account.cmp(b.account));
            let mut kept = entries;
            keep_heaviest(&mut kept, most, limits);
            prop_assert_eq!(kept, sorted);
        }
    }
}
