//! The rows behind observed load: each shard's and each (account, shard)'s smoothed rate,
//! and which streams have had reports.
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
}

/// Rows per SQLite upsert: 7 parameters each, well under its limit of 32,766.
const SQLITE_CHUNK: usize = 500;

/// An account's new rate on a shard, and when it fades below the tiny rate that lets its
/// row go (see [`Rate::fades_at`]).
#[derive(Debug, Clone, PartialEq)]
pub struct AccountRate {
    pub account: String,
    pub rate: Rate,
    pub fades_at: i64,
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

const SHARD_RATES: &str =
    "SELECT shard_id, records_per_s, bytes_per_s, at_ms FROM shard_load WHERE stream = $1";
const ACCOUNT_RATES: &str = "SELECT shard_id, account, records_per_s, bytes_per_s, at_ms \
    FROM account_load WHERE stream = $1";

fn rate_row(shard_id: String, account: String, r: f64, b: f64, at_ms: i64) -> RateRow {
    RateRow {
        shard_id,
        account,
        rate: Rate {
            records_per_s: r,
            bytes_per_s: b,
            at_ms,
        },
    }
}

impl Tx {
    /// Every stored rate of `stream`: its shards' (account empty), then its accounts'.
    pub async fn load_rows(&mut self, stream: &str) -> Result<Vec<RateRow>> {
        on_tx!(self, c => {
            let shards: Vec<(String, f64, f64, i64)> =
                sqlx::query_as(SHARD_RATES).bind(stream).fetch_all(&mut *c).await?;
            let accounts: Vec<(String, String, f64, f64, i64)> =
                sqlx::query_as(ACCOUNT_RATES).bind(stream).fetch_all(&mut *c).await?;
            shards
                .into_iter()
                .map(|(s, r, b, at)| rate_row(s, String::new(), r, b, at))
                .chain(accounts.into_iter().map(|(s, a, r, b, at)| rate_row(s, a, r, b, at)))
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

    /// Deletes the account rows of `shard_id` that faded by `now`: one range of the key.
    pub async fn prune_account_load(
        &mut self,
        stream: &str,
        shard_id: &str,
        now: i64,
    ) -> Result<u64> {
        on_tx!(self, c => sqlx::query(
                "DELETE FROM account_load WHERE stream = $1 AND shard_id = $2 AND fades_at <= $3",
            )
            .bind(stream)
            .bind(shard_id)
            .bind(now)
            .execute(&mut *c)
            .await?
            .rows_affected())
    }

    /// `shard_id`'s stored rate, if it has one.
    pub async fn shard_rate(&mut self, stream: &str, shard_id: &str) -> Result<Option<Rate>> {
        let row: Option<(f64, f64, i64)> = on_tx!(self, c => sqlx::query_as(
                "SELECT records_per_s, bytes_per_s, at_ms FROM shard_load \
                 WHERE stream = $1 AND shard_id = $2",
            )
            .bind(stream)
            .bind(shard_id)
            .fetch_optional(&mut *c)
            .await?)?;
        Ok(row.map(|(r, b, at)| Rate {
            records_per_s: r,
            bytes_per_s: b,
            at_ms: at,
        }))
    }

    pub async fn put_shard_rate(&mut self, stream: &str, shard_id: &str, rate: Rate) -> Result<()> {
        on_tx!(self, c => {
            sqlx::query(
                "INSERT INTO shard_load (stream, shard_id, records_per_s, bytes_per_s, at_ms) \
                 VALUES ($1, $2, $3, $4, $5) ON CONFLICT (stream, shard_id) DO UPDATE SET \
                 records_per_s = excluded.records_per_s, bytes_per_s = excluded.bytes_per_s, \
                 at_ms = excluded.at_ms",
            )
            .bind(stream)
            .bind(shard_id)
            .bind(rate.records_per_s)
            .bind(rate.bytes_per_s)
            .bind(rate.at_ms)
            .execute(&mut *c)
            .await?;
        })
    }

    /// The stored rates of those of `accounts` that have one on `shard_id`.
    pub async fn account_rates(
        &mut self,
        stream: &str,
        shard_id: &str,
        accounts: &[&str],
    ) -> Result<Vec<(String, Rate)>> {
        let names = serde_json::to_string(accounts).expect("strings encode");
        let rows: Vec<(String, f64, f64, i64)> = on_tx!(self, c =>
            sqlite: sqlx::query_as(
                "SELECT account, records_per_s, bytes_per_s, at_ms FROM account_load \
                 WHERE stream = $1 AND shard_id = $2 \
                 AND account IN (SELECT value FROM json_each($3))",
            )
            .bind(stream)
            .bind(shard_id)
            .bind(&names)
            .fetch_all(&mut *c)
            .await?,
            postgres: sqlx::query_as(
                "SELECT account, records_per_s, bytes_per_s, at_ms FROM account_load \
                 WHERE stream = $1 AND shard_id = $2 AND account = ANY($3)",
            )
            .bind(stream)
            .bind(shard_id)
            .bind(accounts)
            .fetch_all(&mut *c)
            .await?
        )?;
        Ok(rows
            .into_iter()
            .map(|(a, r, b, at)| {
                let rate = Rate {
                    records_per_s: r,
                    bytes_per_s: b,
                    at_ms: at,
                };
                (a, rate)
            })
            .collect())
    }

    /// Writes accounts' new rates on `shard_id`, as one batch.
    pub async fn put_account_rates(
        &mut self,
        stream: &str,
        shard_id: &str,
        rows: &[AccountRate],
    ) -> Result<()> {
        const UPDATE: &str = " ON CONFLICT (stream, shard_id, account) DO UPDATE \
            SET records_per_s = excluded.records_per_s, bytes_per_s = excluded.bytes_per_s, \
            at_ms = excluded.at_ms, fades_at = excluded.fades_at";
        on_tx!(self, c =>
            sqlite: for chunk in rows.chunks(SQLITE_CHUNK) {
                sqlx::QueryBuilder::<sqlx::Sqlite>::new(
                    "INSERT INTO account_load \
                     (stream, shard_id, account, records_per_s, bytes_per_s, at_ms, fades_at) ",
                )
                .push_values(chunk, |mut row, r| {
                    row.push_bind(stream)
                        .push_bind(shard_id)
                        .push_bind(r.account.as_str())
                        .push_bind(r.rate.records_per_s)
                        .push_bind(r.rate.bytes_per_s)
                        .push_bind(r.rate.at_ms)
                        .push_bind(r.fades_at);
                })
                .push(UPDATE)
                .build()
                .execute(&mut *c)
                .await?;
            },
            postgres: {
                let accounts: Vec<&str> = rows.iter().map(|r| r.account.as_str()).collect();
                let records: Vec<f64> = rows.iter().map(|r| r.rate.records_per_s).collect();
                let bytes: Vec<f64> = rows.iter().map(|r| r.rate.bytes_per_s).collect();
                let at: Vec<i64> = rows.iter().map(|r| r.rate.at_ms).collect();
                let fades: Vec<i64> = rows.iter().map(|r| r.fades_at).collect();
                sqlx::query(&format!(
                    "INSERT INTO account_load \
                     (stream, shard_id, account, records_per_s, bytes_per_s, at_ms, fades_at) \
                     SELECT $1, $2, a, r, b, t, f \
                     FROM UNNEST($3::text[], $4::float8[], $5::float8[], $6::int8[], $7::int8[]) \
                     AS u(a, r, b, t, f){UPDATE}"
                ))
                .bind(stream)
                .bind(shard_id)
                .bind(&accounts)
                .bind(&records)
                .bind(&bytes)
                .bind(&at)
                .bind(&fades)
                .execute(&mut *c)
                .await?;
            }
        )
    }
}
