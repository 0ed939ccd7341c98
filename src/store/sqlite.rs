//! SQLite backend: one file in WAL mode, every commit synced (synchronous=FULL).

use std::str::FromStr;
use std::time::Duration;

use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};
use sqlx::{Row, SqlitePool};

use super::{
    Assignment, Result, StoreError, StreamRow, decode_assignment, decode_shards, encode_shards,
};
use crate::keyspace::Move;

/// The SQLite implementation of the store.
#[derive(Debug, Clone)]
pub struct SqliteStore {
    pool: SqlitePool,
}

const SELECT_ASSIGNMENT: &str = "SELECT account, hash_key, weight, created_at FROM assignments";

impl SqliteStore {
    pub async fn connect(url: &str) -> Result<Self> {
        let options = SqliteConnectOptions::from_str(url)?
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Full)
            .busy_timeout(Duration::from_secs(5))
            .foreign_keys(true);
        let pool = SqlitePoolOptions::new()
            .max_connections(4)
            .acquire_timeout(Duration::from_secs(5))
            .connect_with(options)
            .await?;
        sqlx::migrate!("migrations/sqlite").run(&pool).await?;
        Ok(SqliteStore { pool })
    }

    pub async fn bind_keyspace(&self, bits: u32) -> Result<()> {
        sqlx::query("INSERT INTO meta (name, value) VALUES ('keyspace_bits', $1) ON CONFLICT (name) DO NOTHING")
            .bind(bits.to_string())
            .execute(&self.pool)
            .await?;
        let stored: String =
            sqlx::query_scalar("SELECT value FROM meta WHERE name = 'keyspace_bits'")
                .fetch_one(&self.pool)
                .await?;
        let stored: u32 = stored
            .parse()
            .map_err(|_| StoreError::Corrupt(format!("keyspace_bits {stored:?}")))?;
        if stored == bits {
            Ok(())
        } else {
            Err(StoreError::KeyspaceMismatch {
                stored,
                configured: bits,
            })
        }
    }

    pub async fn load(&self) -> Result<Vec<Assignment>> {
        let rows = sqlx::query(SELECT_ASSIGNMENT).fetch_all(&self.pool).await?;
        rows.iter().map(row_to_assignment).collect()
    }

    pub async fn last_event_id(&self) -> Result<i64> {
        Ok(
            sqlx::query_scalar("SELECT COALESCE(MAX(id), 0) FROM events")
                .fetch_one(&self.pool)
                .await?,
        )
    }

    pub async fn insert(&self, a: &Assignment, at: i64) -> Result<i64> {
        let mut tx = self.pool.begin().await?;
        sqlx::query("INSERT INTO assignments (account, hash_key, weight, created_at) VALUES ($1, $2, $3, $4)")
            .bind(a.account.as_str())
            .bind(a.hash_key.to_be_bytes().as_slice())
            .bind(a.weight as i64)
            .bind(a.created_at)
            .execute(&mut *tx)
            .await?;
        let id = log(
            &mut tx,
            at,
            "allocate",
            a.account.as_str(),
            None,
            Some(a.hash_key.to_be_bytes()),
            a.weight,
        )
        .await?;
        tx.commit().await?;
        Ok(id)
    }

    pub async fn delete(&self, a: &Assignment, at: i64) -> Result<i64> {
        let mut tx = self.pool.begin().await?;
        let done = sqlx::query("DELETE FROM assignments WHERE account = $1 AND hash_key = $2")
            .bind(a.account.as_str())
            .bind(a.hash_key.to_be_bytes().as_slice())
            .execute(&mut *tx)
            .await?;
        if done.rows_affected() != 1 {
            return Err(StoreError::Stale);
        }
        let id = log(
            &mut tx,
            at,
            "release",
            a.account.as_str(),
            Some(a.hash_key.to_be_bytes()),
            None,
            a.weight,
        )
        .await?;
        tx.commit().await?;
        Ok(id)
    }

    pub async fn reweight(&self, a: &Assignment, at: i64) -> Result<i64> {
        let mut tx = self.pool.begin().await?;
        let key = a.hash_key.to_be_bytes();
        let done =
            sqlx::query("UPDATE assignments SET weight = $1 WHERE account = $2 AND hash_key = $3")
                .bind(a.weight as i64)
                .bind(a.account.as_str())
                .bind(key.as_slice())
                .execute(&mut *tx)
                .await?;
        if done.rows_affected() != 1 {
            return Err(StoreError::Stale);
        }
        let id = log(
            &mut tx,
            at,
            "reweight",
            a.account.as_str(),
            Some(key),
            Some(key),
            a.weight,
        )
        .await?;
        tx.commit().await?;
        Ok(id)
    }

    pub async fn apply_moves(&self, moves: &[Move], at: i64) -> Result<i64> {
        let mut tx = self.pool.begin().await?;
        let mut id = 0;
        for m in moves {
            let done = sqlx::query(
                "UPDATE assignments SET hash_key = $1 WHERE account = $2 AND hash_key = $3",
            )
            .bind(m.to.to_be_bytes().as_slice())
            .bind(&m.account)
            .bind(m.from.to_be_bytes().as_slice())
            .execute(&mut *tx)
            .await?;
            if done.rows_affected() != 1 {
                return Err(StoreError::Stale);
            }
            id = log(
                &mut tx,
                at,
                "move",
                &m.account,
                Some(m.from.to_be_bytes()),
                Some(m.to.to_be_bytes()),
                m.weight,
            )
            .await?;
        }
        tx.commit().await?;
        Ok(id)
    }

    pub async fn load_streams(&self) -> Result<Vec<StreamRow>> {
        let rows = sqlx::query(
            "SELECT name, shards, next_shard, is_primary, updated_at FROM streams ORDER BY name",
        )
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|row| {
                let name: String = row.try_get(0)?;
                let shards = decode_shards(&name, row.try_get(1)?)?;
                Ok(StreamRow {
                    name,
                    shards,
                    next_shard: row.try_get::<i64, _>(2)? as u64,
                    primary: row.try_get(3)?,
                    updated_at: row.try_get(4)?,
                })
            })
            .collect()
    }

    pub async fn put_stream(&self, stream: &StreamRow) -> Result<i64> {
        let mut tx = self.pool.begin().await?;
        if stream.primary {
            sqlx::query("UPDATE streams SET is_primary = 0 WHERE name <> $1")
                .bind(&stream.name)
                .execute(&mut *tx)
                .await?;
        }
        let shards = encode_shards(&stream.shards);
        sqlx::query(
            "INSERT INTO streams (name, shards, next_shard, is_primary, updated_at) VALUES ($1, $2, $3, $4, $5) \
             ON CONFLICT (name) DO UPDATE SET shards = excluded.shards, next_shard = excluded.next_shard, \
             is_primary = excluded.is_primary, updated_at = excluded.updated_at",
        )
        .bind(&stream.name)
        .bind(&shards)
        .bind(stream.next_shard as i64)
        .bind(stream.primary)
        .bind(stream.updated_at)
        .execute(&mut *tx)
        .await?;
        let id = log_stream(
            &mut tx,
            stream.updated_at,
            "stream_put",
            &stream.name,
            Some(&shards),
        )
        .await?;
        tx.commit().await?;
        Ok(id)
    }

    pub async fn delete_stream(&self, name: &str, at: i64) -> Result<i64> {
        let mut tx = self.pool.begin().await?;
        let done = sqlx::query("DELETE FROM streams WHERE name = $1")
            .bind(name)
            .execute(&mut *tx)
            .await?;
        if done.rows_affected() != 1 {
            return Err(StoreError::Stale);
        }
        let id = log_stream(&mut tx, at, "stream_delete", name, None).await?;
        tx.commit().await?;
        Ok(id)
    }

    pub async fn list(&self, after: Option<&str>, limit: u32) -> Result<Vec<Assignment>> {
        let rows = sqlx::query(&format!(
            "{SELECT_ASSIGNMENT} WHERE account > $1 ORDER BY account LIMIT $2"
        ))
        .bind(after.unwrap_or(""))
        .bind(i64::from(limit))
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(row_to_assignment).collect()
    }

    pub async fn ping(&self) -> Result<()> {
        sqlx::query("SELECT 1").execute(&self.pool).await?;
        Ok(())
    }
}

fn row_to_assignment(row: &sqlx::sqlite::SqliteRow) -> Result<Assignment> {
    decode_assignment(
        row.try_get(0)?,
        row.try_get::<&[u8], _>(1)?,
        row.try_get(2)?,
        row.try_get(3)?,
    )
}

async fn log(
    tx: &mut sqlx::Transaction<'_, sqlx::Sqlite>,
    at: i64,
    kind: &str,
    account: &str,
    before: Option<[u8; 16]>,
    after: Option<[u8; 16]>,
    weight: u64,
) -> Result<i64> {
    let id = sqlx::query_scalar(
        "INSERT INTO events (at, kind, account, key_before, key_after, weight) VALUES ($1, $2, $3, $4, $5, $6) RETURNING id",
    )
    .bind(at)
    .bind(kind)
    .bind(account)
    .bind(before.as_ref().map(|b| b.as_slice()))
    .bind(after.as_ref().map(|b| b.as_slice()))
    .bind(weight as i64)
    .fetch_one(&mut **tx)
    .await?;
    Ok(id)
}

async fn log_stream(
    tx: &mut sqlx::Transaction<'_, sqlx::Sqlite>,
    at: i64,
    kind: &str,
    stream: &str,
    detail: Option<&str>,
) -> Result<i64> {
    let id = sqlx::query_scalar(
        "INSERT INTO events (at, kind, stream, detail) VALUES ($1, $2, $3, $4) RETURNING id",
    )
    .bind(at)
    .bind(kind)
    .bind(stream)
    .bind(detail)
    .fetch_one(&mut **tx)
    .await?;
    Ok(id)
}
