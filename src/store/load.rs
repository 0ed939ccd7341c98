//! The rows behind observed load: each shard's smoothed rate with its accounts' rates
//! packed beside it (see [`super::packed`]), once as its consumers report it
//! (`shard_load`) and once as producers do (`producer_load`); which streams have had
//! reports; and each producer's highest report counted.
//!
//! A report rewrites its shard's row, accounts and all, in one statement: the accounts'
//! rates are decayed to the report's instant and its shares added in one pass, in Rust.
//! Rows of `account_load` are what keyspreads that predate packing wrote: a shard whose
//! row has no packed value yet is read from them, and packs them at its next report.

use std::collections::HashMap;

use super::packed::{Entry, unpack};
use super::{Result, Tx};
use crate::keyspace::Rate;

/// Whose reports a shard's stored rates come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LoadSource {
    /// The consumer worker holding the shard's lease, on its heartbeats.
    Consumers,
    /// Producers, by the hash keys they sent records under.
    Producers,
}

impl LoadSource {
    /// The table its shards' rows are in.
    fn table(self) -> &'static str {
        match self {
            LoadSource::Consumers => "shard_load",
            LoadSource::Producers => "producer_load",
        }
    }
}

/// How many windows after its last report a shard's consumer figures stand before
/// producers' take over: the next report is due one window later, and one more window
/// lets a late one come without the shard changing source back and forth.
pub const CONSUMERS_CURRENT_WINDOWS: i64 = 2;

/// A shard's stored row: its own rate, and its accounts' rates packed, if they are.
#[derive(Debug, Clone, PartialEq)]
pub struct ShardRow {
    pub rate: Rate,
    /// The instant `account_load`'s rows of the shard are stored as of (unpacked rows).
    pub accounts_at: i64,
    /// The window the last counted report covered.
    pub window_ms: i64,
    pub accounts: Option<Vec<u8>>,
}

/// Runs `$body` on the transaction's connection `$c`, whichever backend holds it (or
/// `$sqlite` and `$postgres`, each on its own).
macro_rules! on_tx {
    ($tx:expr, $c:ident => $body:expr) => {
        on_tx!($tx, $c => sqlite: $body, postgres: $body)
    };
    ($tx:expr, $c:ident => sqlite: $sqlite:expr, postgres: $postgres:expr) => {
        match $tx {
            Tx::Sqlite(tx, health) => {
                let $c = &mut **tx;
                let done: Result<_> = async { Ok($sqlite) }.await;
                health.observe(&done);
                done
            }
            Tx::Postgres(tx) => {
                let $c = &mut **tx;
                let done: Result<_> = async { Ok($postgres) }.await;
                done
            }
        }
    };
}

const SHARD_RATES: &str = "SELECT shard_id, records_per_s, bytes_per_s, at_ms, window_ms, \
    accounts FROM shard_load WHERE stream = $1";
const PRODUCER_RATES: &str = "SELECT shard_id, records_per_s, bytes_per_s, at_ms, window_ms, \
    accounts FROM producer_load WHERE stream = $1";
/// Rows of shards not packed yet.
const UNPACKED_RATES: &str = "SELECT a.shard_id, a.account, a.records_per_s, a.bytes_per_s, \
    s.accounts_at, s.at_ms, s.window_ms FROM account_load a JOIN shard_load s \
    ON s.stream = a.stream AND s.shard_id = a.shard_id \
    WHERE a.stream = $1 AND s.accounts IS NULL";

type ShardRateRow = (String, f64, f64, i64, i64, Option<Vec<u8>>);

/// An account row as read: shard, account, records/s, bytes/s, as of, reported at, window.
type Row = (String, String, f64, f64, i64, i64, i64);

/// One shard's stored rates, opened: its own, and its accounts' in byte order of their
/// names, borrowed from the rows read.
#[derive(Debug, Clone, PartialEq)]
pub struct ShardRates<'a> {
    pub shard_id: &'a str,
    pub rate: Rate,
    /// When the shard's last counted report was folded in, and the window it covered: its
    /// rates stay current for up to one window (see [`crate::keyspace::load::held_ms`]).
    pub reported_ms: i64,
    pub window_ms: i64,
    /// The instant its accounts' rates are stored as of.
    pub accounts_at: i64,
    pub accounts: Vec<Entry<'a>>,
    pub source: LoadSource,
}

impl ShardRates<'_> {
    /// Whether its figures are still current at `now_ms` for its source to stand over
    /// another (see [`CONSUMERS_CURRENT_WINDOWS`]).
    fn current(&self, now_ms: i64) -> bool {
        now_ms - self.reported_ms <= CONSUMERS_CURRENT_WINDOWS * self.window_ms
    }
}

/// Which of a shard's two rows its figures come from at `now_ms`: its consumers' while
/// they are current, else its producers', else its consumers' as they fade.
fn chosen<'a>(
    consumers: Option<ShardRates<'a>>,
    producers: Option<ShardRates<'a>>,
    now_ms: i64,
) -> Option<ShardRates<'a>> {
    match (consumers, producers) {
        (Some(c), Some(p)) if !c.current(now_ms) => Some(p),
        (Some(c), _) => Some(c),
        (None, p) => p,
    }
}

/// A stream's stored rates as read, before their packed values are opened.
#[derive(Debug, Default)]
pub struct LoadRows {
    shards: Vec<ShardRateRow>,
    unpacked: Vec<Row>,
    producers: Vec<ShardRateRow>,
}

impl LoadRows {
    /// Rows as the store holds them once every shard is packed: per shard its id, its
    /// rate (as of when its last report was folded in), that report's window, and its
    /// accounts packed (see [`super::packed`]).
    pub fn packed(shards: impl IntoIterator<Item = (String, Rate, i64, Vec<u8>)>) -> Self {
        let shards = (shards.into_iter())
            .map(|(id, r, window, packed)| {
                let (records, bytes) = (r.records_per_s, r.bytes_per_s);
                (id, records, bytes, r.at_ms, window, Some(packed))
            })
            .collect();
        LoadRows {
            shards,
            unpacked: Vec::new(),
            producers: Vec::new(),
        }
    }

    /// These rows with producers' rows beside them, as [`LoadRows::packed`] takes them.
    pub fn with_producers(
        mut self,
        shards: impl IntoIterator<Item = (String, Rate, i64, Vec<u8>)>,
    ) -> Self {
        self.producers = LoadRows::packed(shards).shards;
        self
    }

    /// Every shard's rates at `now_ms`, by shard id, each from the source [`chosen`] for
    /// it, its accounts' opened without a copy of their names. O(accounts): at a million,
    /// call it off the async workers.
    pub fn shards(&self, now_ms: i64) -> Result<Vec<ShardRates<'_>>> {
        let mut producers = HashMap::with_capacity(self.producers.len());
        for row in &self.producers {
            let rates = opened(row, LoadSource::Producers, |_| (row.3, Vec::new()))?;
            producers.insert(rates.shard_id, rates);
        }
        let mut shards = Vec::with_capacity(self.shards.len() + producers.len());
        for rates in self.consumers()? {
            let theirs = producers.remove(rates.shard_id);
            shards.extend(chosen(Some(rates), theirs, now_ms));
        }
        shards.extend(producers.into_values());
        shards.sort_unstable_by(|a, b| a.shard_id.cmp(b.shard_id));
        Ok(shards)
    }

    /// Every shard's rates as its consumers reported them.
    fn consumers(&self) -> Result<Vec<ShardRates<'_>>> {
        let mut unpacked: HashMap<&str, Vec<&Row>> = HashMap::new();
        for row in &self.unpacked {
            unpacked.entry(row.0.as_str()).or_default().push(row);
        }
        (self.shards.iter())
            .map(|row| {
                opened(row, LoadSource::Consumers, |at| {
                    let mut rows = unpacked.remove(row.0.as_str()).unwrap_or_default();
                    rows.sort_by(|x, y| x.1.as_bytes().cmp(y.1.as_bytes()));
                    let accounts_at = rows.first().map_or(at, |row| row.4);
                    let entries = rows.iter().map(|row| Entry {
                        account: &row.1,
                        records_per_s: row.2,
                        bytes_per_s: row.3,
                    });
                    (accounts_at, entries.collect())
                })
            })
            .collect()
    }
}

/// `row`'s rates from `source`, its accounts unpacked, or (unpacked rows of a keyspread
/// that predates packing) as `unpacked` answers them given the row's instant.
fn opened<'a>(
    row: &'a ShardRateRow,
    source: LoadSource,
    unpacked: impl FnOnce(i64) -> (i64, Vec<Entry<'a>>),
) -> Result<ShardRates<'a>> {
    let (shard_id, r, b, at, window, packed) = row;
    let (accounts_at, accounts) = match packed {
        Some(packed) => unpack(packed)?,
        None => unpacked(*at),
    };
    Ok(ShardRates {
        shard_id,
        rate: Rate {
            records_per_s: *r,
            bytes_per_s: *b,
            at_ms: *at,
        },
        reported_ms: *at,
        window_ms: *window,
        accounts_at,
        accounts,
        source,
    })
}

impl Tx {
    /// Every stored rate of `stream`, as read (see [`LoadRows::shards`]).
    pub async fn load_rows(&mut self, stream: &str) -> Result<LoadRows> {
        on_tx!(self, c => {
            let shards: Vec<ShardRateRow> =
                sqlx::query_as(SHARD_RATES).bind(stream).fetch_all(&mut *c).await?;
            let unpacked: Vec<Row> =
                sqlx::query_as(UNPACKED_RATES).bind(stream).fetch_all(&mut *c).await?;
            let producers: Vec<ShardRateRow> =
                sqlx::query_as(PRODUCER_RATES).bind(stream).fetch_all(&mut *c).await?;
            LoadRows { shards, unpacked, producers }
        })
    }

    /// The `version` of the map `stream`'s load rows were last checked against, if any
    /// report was ever counted for it.
    pub async fn load_map_version(&mut self, stream: &str) -> Result<Option<i64>> {
        on_tx!(self, c => sqlx::query_scalar("SELECT map_version FROM load_streams WHERE stream = $1")
            .bind(stream)
            .fetch_optional(&mut *c)
            .await?)
    }

    /// Notes that a report was counted for `stream` at `now`, its rows checked against the
    /// map of `map_version`.
    pub async fn mark_reported(&mut self, stream: &str, map_version: i64, now: i64) -> Result<()> {
        on_tx!(self, c => {
            sqlx::query(
                "INSERT INTO load_streams (stream, map_version, reported_at) VALUES ($1, $2, $3) \
                 ON CONFLICT (stream) DO UPDATE SET map_version = excluded.map_version, \
                 reported_at = excluded.reported_at",
            )
            .bind(stream)
            .bind(map_version)
            .bind(now)
            .execute(&mut *c)
            .await?;
        })
    }

    /// The shards `stream` has rates for, from either source.
    pub async fn loaded_shards(&mut self, stream: &str) -> Result<Vec<String>> {
        on_tx!(self, c => sqlx::query_scalar(
                "SELECT shard_id FROM shard_load WHERE stream = $1 \
                 UNION SELECT DISTINCT shard_id FROM account_load WHERE stream = $1 \
                 UNION SELECT shard_id FROM producer_load WHERE stream = $1",
            )
            .bind(stream)
            .fetch_all(&mut *c)
            .await?)
    }

    /// Deletes `shard_id`'s rates (its own and its accounts', from either source).
    pub async fn forget_shard_load(&mut self, stream: &str, shard_id: &str) -> Result<()> {
        on_tx!(self, c => {
            for sql in [
                "DELETE FROM shard_load WHERE stream = $1 AND shard_id = $2",
                "DELETE FROM account_load WHERE stream = $1 AND shard_id = $2",
                "DELETE FROM producer_load WHERE stream = $1 AND shard_id = $2",
            ] {
                sqlx::query(sql).bind(stream).bind(shard_id).execute(&mut *c).await?;
            }
        })
    }

    /// `shard_id`'s stored row of `source`, if it has one.
    pub async fn shard_row(
        &mut self,
        source: LoadSource,
        stream: &str,
        shard_id: &str,
    ) -> Result<Option<ShardRow>> {
        type Stored = (f64, f64, i64, i64, i64, Option<Vec<u8>>);
        let sql = format!(
            "SELECT records_per_s, bytes_per_s, at_ms, accounts_at, window_ms, accounts \
             FROM {} WHERE stream = $1 AND shard_id = $2",
            source.table()
        );
        let row: Option<Stored> = on_tx!(self, c => sqlx::query_as(&sql)
            .bind(stream)
            .bind(shard_id)
            .fetch_optional(&mut *c)
            .await?)?;
        Ok(
            row.map(|(r, b, at, accounts_at, window_ms, accounts)| ShardRow {
                rate: Rate {
                    records_per_s: r,
                    bytes_per_s: b,
                    at_ms: at,
                },
                accounts_at,
                window_ms,
                accounts,
            }),
        )
    }

    /// Deletes `shard_id`'s unpacked account rows and answers them (as of the shard's
    /// `accounts_at`), in byte order of the accounts' names.
    pub async fn take_unpacked_accounts(
        &mut self,
        stream: &str,
        shard_id: &str,
    ) -> Result<Vec<(String, f64, f64)>> {
        let mut rows: Vec<(String, f64, f64)> = on_tx!(self, c => {
            let rows = sqlx::query_as(
                "SELECT account, records_per_s, bytes_per_s FROM account_load \
                 WHERE stream = $1 AND shard_id = $2",
            )
            .bind(stream)
            .bind(shard_id)
            .fetch_all(&mut *c)
            .await?;
            sqlx::query("DELETE FROM account_load WHERE stream = $1 AND shard_id = $2")
                .bind(stream)
                .bind(shard_id)
                .execute(&mut *c)
                .await?;
            rows
        })?;
        rows.sort_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
        Ok(rows)
    }

    /// Writes `shard_id`'s row of `source`: its rate and the window its last report
    /// covered, and its accounts packed as of the value's own instant (which `accounts_at`
    /// takes too, for keyspreads that predate packing).
    pub async fn put_shard_row(
        &mut self,
        source: LoadSource,
        stream: &str,
        shard_id: &str,
        (rate, window_ms): (Rate, i64),
        accounts_at: i64,
        packed: &[u8],
    ) -> Result<()> {
        let sql = format!(
            "INSERT INTO {} (stream, shard_id, records_per_s, bytes_per_s, at_ms, \
             accounts_at, window_ms, accounts) VALUES ($1, $2, $3, $4, $5, $6, $7, $8) \
             ON CONFLICT (stream, shard_id) DO UPDATE SET \
             records_per_s = excluded.records_per_s, bytes_per_s = excluded.bytes_per_s, \
             at_ms = excluded.at_ms, accounts_at = excluded.accounts_at, \
             window_ms = excluded.window_ms, accounts = excluded.accounts",
            source.table()
        );
        on_tx!(self, c => {
            sqlx::query(&sql)
            .bind(stream)
            .bind(shard_id)
            .bind(rate.records_per_s)
            .bind(rate.bytes_per_s)
            .bind(rate.at_ms)
            .bind(accounts_at)
            .bind(window_ms)
            .bind(packed)
            .execute(&mut *c)
            .await?;
        })
    }

    /// Counts report `seq` of `producer` at `now`, unless a report numbered as high was
    /// counted before: answers whether it is new. One statement, so that replicas counting
    /// the same report at once count it once.
    pub async fn count_producer_seq(&mut self, producer: &str, seq: i64, now: i64) -> Result<bool> {
        let done = on_tx!(self, c => sqlx::query(
                "INSERT INTO producer_seqs (producer, seq, reported_at) VALUES ($1, $2, $3) \
                 ON CONFLICT (producer) DO UPDATE SET seq = excluded.seq, \
                 reported_at = excluded.reported_at WHERE producer_seqs.seq < excluded.seq",
            )
            .bind(producer)
            .bind(seq)
            .bind(now)
            .execute(&mut *c)
            .await?
            .rows_affected())?;
        Ok(done == 1)
    }

    /// Forgets up to `most` producers last counted before `before` (the oldest first), so
    /// that producers that come and go leave no row behind for long.
    pub async fn forget_producer_seqs(&mut self, before: i64, most: i64) -> Result<()> {
        on_tx!(self, c => {
            sqlx::query(
                "DELETE FROM producer_seqs WHERE producer IN (SELECT producer FROM \
                 producer_seqs WHERE reported_at < $1 ORDER BY reported_at LIMIT $2)",
            )
            .bind(before)
            .bind(most)
            .execute(&mut *c)
            .await?;
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::packed::Packer;

    /// A row of `shard` reported at `at` over `window`, at `records` a second.
    fn row(shard: &str, records: f64, at: i64, window: i64) -> (String, Rate, i64, Vec<u8>) {
        let rate = Rate {
            records_per_s: records,
            bytes_per_s: 0.0,
            at_ms: at,
        };
        (shard.to_owned(), rate, window, Packer::new(at, 0).finish())
    }

    /// Shard id, source and records/s of each shard `rows` answer at `now`.
    fn sources(rows: &LoadRows, now: i64) -> Vec<(String, LoadSource, f64)> {
        (rows.shards(now).unwrap().into_iter())
            .map(|s| (s.shard_id.to_owned(), s.source, s.rate.records_per_s))
            .collect()
    }

    #[test]
    fn consumers_figures_stand_while_current_then_producers_take_over() {
        use LoadSource::{Consumers, Producers};
        let window = 10_000;
        // Shard a: both; b: producers' only; c: consumers' only.
        let rows = LoadRows::packed([row("a", 1.0, 0, window), row("c", 3.0, 0, window)])
            .with_producers([row("a", 10.0, 0, window), row("b", 20.0, 0, window)]);
        let current = vec![
            ("a".to_owned(), Consumers, 1.0),
            ("b".to_owned(), Producers, 20.0),
            ("c".to_owned(), Consumers, 3.0),
        ];
        assert_eq!(sources(&rows, 0), current);
        // The next report due, and one window late: still the consumers'.
        assert_eq!(sources(&rows, 2 * window), current);
        // Two windows without one: the producers' take over where they reported; a shard
        // without them keeps its consumers' as they fade.
        assert_eq!(
            sources(&rows, 2 * window + 1),
            vec![
                ("a".to_owned(), Producers, 10.0),
                ("b".to_owned(), Producers, 20.0),
                ("c".to_owned(), Consumers, 3.0),
            ]
        );
    }
}
