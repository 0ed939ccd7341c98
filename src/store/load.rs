//! The rows behind observed load: each shard's and each (account, shard)'s smoothed rate,
//! and which streams have had reports.
//!
//! A shard's account rows are all stored as of one instant, its `accounts_at`: a report
//! adds each account's share already grown to that instant (2^((now - accounts_at) /
//! half-life) times what it is worth now), so folding needs no read of the old rates and
//! no per-row decay. Every half-life or so the rows are brought to a newer instant in one
//! statement, which keeps the numbers far from overflowing.
//!
//! A report's accounts are written as one batch: Postgres sends them as arrays (one
//! statement, one round trip), SQLite a few hundred rows per statement (each statement is
//! a hand-off to sqlx's connection thread; one per row cost more than the rest of the
//! heartbeat).

use super::{Result, Tx};
use crate::keyspace::Rate;

/// A stored rate and the shard (and account) it belongs to.
#[derive(Debug, Clone, PartialEq)]
pub struct RateRow {
    pub shard_id: String,
    /// Empty for a shard's own rate.
    pub account: String,
    pub rate: Rate,
    /// When the shard's last counted report was folded in, and the window it covered: its
    /// rates stay current for up to one window (see [`crate::keyspace::load::held_ms`]).
    pub reported_ms: i64,
    pub window_ms: i64,
}

/// Rows per SQLite upsert: 5 parameters each, well under its limit of 32,766.
const SQLITE_CHUNK: usize = 500;

/// What a report adds to an account's rates on a shard, as of the shard's `accounts_at`.
#[derive(Debug, Clone, PartialEq)]
pub struct AccountRate {
    pub account: String,
    pub records_per_s: f64,
    pub bytes_per_s: f64,
}

/// A shard's own rate, and the instant its accounts' rows are stored as of.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ShardRate {
    pub rate: Rate,
    pub accounts_at: i64,
    /// The window the last counted report covered.
    pub window_ms: i64,
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

const SHARD_RATES: &str = "SELECT shard_id, records_per_s, bytes_per_s, at_ms, at_ms, window_ms \
    FROM shard_load WHERE stream = $1";
const ACCOUNT_RATES: &str = "SELECT a.shard_id, a.account, a.records_per_s, a.bytes_per_s, \
    s.accounts_at, s.at_ms, s.window_ms FROM account_load a JOIN shard_load s \
    ON s.stream = a.stream AND s.shard_id = a.shard_id WHERE a.stream = $1";

/// A row as read: shard, account, records/s, bytes/s, as of, reported at, window.
type Row = (String, String, f64, f64, i64, i64, i64);

fn rate_row((shard_id, account, r, b, at_ms, reported_ms, window_ms): Row) -> RateRow {
    RateRow {
        shard_id,
        account,
        rate: Rate {
            records_per_s: r,
            bytes_per_s: b,
            at_ms,
        },
        reported_ms,
        window_ms,
    }
}

impl Tx {
    /// Every stored rate of `stream`: its shards' (account empty), then its accounts'.
    pub async fn load_rows(&mut self, stream: &str) -> Result<Vec<RateRow>> {
        on_tx!(self, c => {
            let shards: Vec<(String, f64, f64, i64, i64, i64)> =
                sqlx::query_as(SHARD_RATES).bind(stream).fetch_all(&mut *c).await?;
            let accounts: Vec<Row> =
                sqlx::query_as(ACCOUNT_RATES).bind(stream).fetch_all(&mut *c).await?;
            shards
                .into_iter()
                .map(|(s, r, b, at, reported, window)| (s, String::new(), r, b, at, reported, window))
                .chain(accounts)
                .map(rate_row)
                .collect::<Vec<_>>()
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

    /// Deletes the account rows of `shard_id` whose stored rates (as of its `accounts_at`)
    /// are both below `floor`: one range of the key.
    pub async fn prune_account_load(
        &mut self,
        stream: &str,
        shard_id: &str,
        floor: f64,
    ) -> Result<u64> {
        on_tx!(self, c => sqlx::query(
                "DELETE FROM account_load WHERE stream = $1 AND shard_id = $2 \
                 AND records_per_s < $3 AND bytes_per_s < $3",
            )
            .bind(stream)
            .bind(shard_id)
            .bind(floor)
            .execute(&mut *c)
            .await?
            .rows_affected())
    }

    /// Multiplies `shard_id`'s account rates by `factor`, as of the new `accounts_at`.
    pub async fn rescale_account_load(
        &mut self,
        stream: &str,
        shard_id: &str,
        factor: f64,
        accounts_at: i64,
    ) -> Result<()> {
        on_tx!(self, c => {
            sqlx::query(
                "UPDATE account_load SET records_per_s = records_per_s * $3, \
                 bytes_per_s = bytes_per_s * $3 WHERE stream = $1 AND shard_id = $2",
            )
            .bind(stream)
            .bind(shard_id)
            .bind(factor)
            .execute(&mut *c)
            .await?;
            sqlx::query("UPDATE shard_load SET accounts_at = $3 WHERE stream = $1 AND shard_id = $2")
                .bind(stream)
                .bind(shard_id)
                .bind(accounts_at)
                .execute(&mut *c)
                .await?;
        })
    }

    /// `shard_id`'s stored rate, if it has one.
    pub async fn shard_rate(&mut self, stream: &str, shard_id: &str) -> Result<Option<ShardRate>> {
        let row: Option<(f64, f64, i64, i64, i64)> = on_tx!(self, c => sqlx::query_as(
                "SELECT records_per_s, bytes_per_s, at_ms, accounts_at, window_ms FROM shard_load \
                 WHERE stream = $1 AND shard_id = $2",
            )
            .bind(stream)
            .bind(shard_id)
            .fetch_optional(&mut *c)
            .await?)?;
        Ok(row.map(|(r, b, at, accounts_at, window_ms)| ShardRate {
            rate: Rate {
                records_per_s: r,
                bytes_per_s: b,
                at_ms: at,
            },
            accounts_at,
            window_ms,
        }))
    }

    pub async fn put_shard_rate(
        &mut self,
        stream: &str,
        shard_id: &str,
        shard: ShardRate,
    ) -> Result<()> {
        on_tx!(self, c => {
            sqlx::query(
                "INSERT INTO shard_load \
                 (stream, shard_id, records_per_s, bytes_per_s, at_ms, accounts_at, window_ms) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT (stream, shard_id) DO UPDATE SET \
                 records_per_s = excluded.records_per_s, bytes_per_s = excluded.bytes_per_s, \
                 at_ms = excluded.at_ms, accounts_at = excluded.accounts_at, \
                 window_ms = excluded.window_ms",
            )
            .bind(stream)
            .bind(shard_id)
            .bind(shard.rate.records_per_s)
            .bind(shard.rate.bytes_per_s)
            .bind(shard.rate.at_ms)
            .bind(shard.accounts_at)
            .bind(shard.window_ms)
            .execute(&mut *c)
            .await?;
        })
    }

    /// Adds a report's shares to its accounts' rates on `shard_id` (as of the shard's
    /// `accounts_at`), as one batch.
    pub async fn add_account_rates(
        &mut self,
        stream: &str,
        shard_id: &str,
        rows: &[AccountRate],
    ) -> Result<()> {
        const ADD: &str = " ON CONFLICT (stream, shard_id, account) DO UPDATE \
            SET records_per_s = account_load.records_per_s + excluded.records_per_s, \
            bytes_per_s = account_load.bytes_per_s + excluded.bytes_per_s";
        on_tx!(self, c =>
            sqlite: for chunk in rows.chunks(SQLITE_CHUNK) {
                sqlx::QueryBuilder::<sqlx::Sqlite>::new(
                    "INSERT INTO account_load (stream, shard_id, account, records_per_s, bytes_per_s) ",
                )
                .push_values(chunk, |mut row, r| {
                    row.push_bind(stream)
                        .push_bind(shard_id)
                        .push_bind(r.account.as_str())
                        .push_bind(r.records_per_s)
                        .push_bind(r.bytes_per_s);
                })
                .push(ADD)
                .build()
                .execute(&mut *c)
                .await?;
            },
            postgres: {
                let accounts: Vec<&str> = rows.iter().map(|r| r.account.as_str()).collect();
                let records: Vec<f64> = rows.iter().map(|r| r.records_per_s).collect();
                let bytes: Vec<f64> = rows.iter().map(|r| r.bytes_per_s).collect();
                sqlx::query(&format!(
                    "INSERT INTO account_load (stream, shard_id, account, records_per_s, bytes_per_s) \
                     SELECT $1, $2, a, r, b FROM UNNEST($3::text[], $4::float8[], $5::float8[]) \
                     AS u(a, r, b){ADD}"
                ))
                .bind(stream)
                .bind(shard_id)
                .bind(&accounts)
                .bind(&records)
                .bind(&bytes)
                .execute(&mut *c)
                .await?;
            }
        )
    }
}
