//! The rows behind observed load: each shard's smoothed rate with its accounts' rates
//! packed beside it (see [`super::packed`]), and which streams have had reports.
//!
//! A report rewrites its shard's row, accounts and all, in one statement: the accounts'
//! rates are decayed to the report's instant and its shares added in one pass, in Rust.
//! Rows of `account_load` are what keyspreads that predate packing wrote: a shard whose
//! row has no packed value yet is read from them, and packs them at its next report.

use std::collections::HashMap;

use super::packed::{Entry, unpack};
use super::{Result, Tx};
use crate::keyspace::Rate;

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
}

/// A stream's stored rates as read, before their packed values are opened.
#[derive(Debug, Default)]
pub struct LoadRows {
    shards: Vec<ShardRateRow>,
    unpacked: Vec<Row>,
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
        }
    }

    /// Every shard's rates, its accounts' opened without a copy of their names.
    /// O(accounts): at a million, call it off the async workers.
    pub fn shards(&self) -> Result<Vec<ShardRates<'_>>> {
        let mut unpacked: HashMap<&str, Vec<&Row>> = HashMap::new();
        for row in &self.unpacked {
            unpacked.entry(row.0.as_str()).or_default().push(row);
        }
        let mut shards = Vec::with_capacity(self.shards.len());
        for (shard_id, r, b, at, window, packed) in &self.shards {
            let (accounts_at, accounts) = match packed {
                Some(packed) => unpack(packed)?,
                None => {
                    let mut rows = unpacked.remove(shard_id.as_str()).unwrap_or_default();
                    rows.sort_by(|x, y| x.1.as_bytes().cmp(y.1.as_bytes()));
                    let accounts_at = rows.first().map_or(*at, |row| row.4);
                    let entries = rows.iter().map(|row| Entry {
                        account: &row.1,
                        records_per_s: row.2,
                        bytes_per_s: row.3,
                    });
                    (accounts_at, entries.collect())
                }
            };
            shards.push(ShardRates {
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
            });
        }
        Ok(shards)
    }
}

impl Tx {
    /// Every stored rate of `stream`, as read (see [`LoadRows::shards`]).
    pub async fn load_rows(&mut self, stream: &str) -> Result<LoadRows> {
        on_tx!(self, c => {
            let shards: Vec<ShardRateRow> =
                sqlx::query_as(SHARD_RATES).bind(stream).fetch_all(&mut *c).await?;
            let unpacked: Vec<Row> =
                sqlx::query_as(UNPACKED_RATES).bind(stream).fetch_all(&mut *c).await?;
            LoadRows { shards, unpacked }
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

    /// The shards `stream` has rates for.
    pub async fn loaded_shards(&mut self, stream: &str) -> Result<Vec<String>> {
        on_tx!(self, c => sqlx::query_scalar(
                "SELECT shard_id FROM shard_load WHERE stream = $1 \
                 UNION SELECT DISTINCT shard_id FROM account_load WHERE stream = $1",
            )
            .bind(stream)
            .fetch_all(&mut *c)
            .await?)
    }

    /// Deletes `shard_id`'s rates (its own and its accounts').
    pub async fn forget_shard_load(&mut self, stream: &str, shard_id: &str) -> Result<()> {
        on_tx!(self, c => {
            for sql in [
                "DELETE FROM shard_load WHERE stream = $1 AND shard_id = $2",
                "DELETE FROM account_load WHERE stream = $1 AND shard_id = $2",
            ] {
                sqlx::query(sql).bind(stream).bind(shard_id).execute(&mut *c).await?;
            }
        })
    }

    /// `shard_id`'s stored row, if it has one.
    pub async fn shard_row(&mut self, stream: &str, shard_id: &str) -> Result<Option<ShardRow>> {
        type Stored = (f64, f64, i64, i64, i64, Option<Vec<u8>>);
        let row: Option<Stored> = on_tx!(self, c => sqlx::query_as(
                "SELECT records_per_s, bytes_per_s, at_ms, accounts_at, window_ms, accounts \
                 FROM shard_load WHERE stream = $1 AND shard_id = $2",
            )
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

    /// Writes `shard_id`'s row: its rate and the window its last report covered, and its
    /// accounts packed as of the value's own instant (which `accounts_at` takes too, for
    /// keyspreads that predate packing).
    pub async fn put_shard_row(
        &mut self,
        stream: &str,
        shard_id: &str,
        (rate, window_ms): (Rate, i64),
        accounts_at: i64,
        packed: &[u8],
    ) -> Result<()> {
        on_tx!(self, c => {
            sqlx::query(
                "INSERT INTO shard_load (stream, shard_id, records_per_s, bytes_per_s, at_ms, \
                 accounts_at, window_ms, accounts) VALUES ($1, $2, $3, $4, $5, $6, $7, $8) \
                 ON CONFLICT (stream, shard_id) DO UPDATE SET \
                 records_per_s = excluded.records_per_s, bytes_per_s = excluded.bytes_per_s, \
                 at_ms = excluded.at_ms, accounts_at = excluded.accounts_at, \
                 window_ms = excluded.window_ms, accounts = excluded.accounts",
            )
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
}
