//! Every query, written once for both backends.
//!
//! The SQL is the same on SQLite and Postgres (`$N` placeholders, `RETURNING`,
//! `ON CONFLICT`); only the sqlx types differ, so `queries!` stamps out one copy of these
//! functions per backend module. Each takes a plain connection (a pooled one or a
//! transaction's) so the caller decides what runs inside which transaction.
//!
//! The exceptions are the group writes, `insert_many`, `delete_many` and Postgres'
//! `insert_if_current`: Postgres sends the rows as arrays, one round trip, SQLite a
//! multi-row `VALUES` or a statement per row; each backend module has its own.

/// Expands to the query functions over `$db` (an sqlx database type).
macro_rules! queries {
    ($db:ty) => {
        use sqlx::Row as _;

        use crate::keyspace::Move;
        use crate::keyspace::lease_state::Holder;
        use crate::store::leases::{LeaseGroup, LeaseRow, WorkerRow};
        use crate::store::{
            Actor, EventRow, KeyRow, KinesisStream, LoggedEvent, PendingMove, Result, StoreError, StreamRow, SyncState, Switch,
            decode_account, decode_key, decode_listed, decode_row, decode_shards, encode_listed, encode_shards,
        };

        type Conn = <$db as sqlx::Database>::Connection;

        use crate::store::KEY_COLUMNS;

        pub async fn bind_keyspace(conn: &mut Conn, bits: u32) -> Result<()> {
            const STORED: &str = "SELECT value FROM meta WHERE name = 'keyspace_bits'";
            // Read first: a database already bound is written to by no starting replica, so
            // none waits for another writer's lock (SQLite's is the whole file's).
            let stored: Option<String> = sqlx::query_scalar(STORED).fetch_optional(&mut *conn).await?;
            let stored = match stored {
                Some(stored) => stored,
                None => {
                    sqlx::query("INSERT INTO meta (name, value) VALUES ('keyspace_bits', $1) ON CONFLICT (name) DO NOTHING")
                        .bind(bits.to_string())
                        .execute(&mut *conn)
                        .await?;
                    sqlx::query_scalar(STORED).fetch_one(&mut *conn).await?
                }
            };
            let stored: u32 = stored
                .parse()
                .map_err(|_| StoreError::Corrupt(format!("keyspace_bits {stored:?}")))?;
            if stored == bits {
                Ok(())
            } else {
                Err(StoreError::KeyspaceMismatch { stored, configured: bits })
            }
        }

        pub async fn count_assignments(conn: &mut Conn) -> Result<i64> {
            Ok(sqlx::query_scalar("SELECT COUNT(*) FROM assignments").fetch_one(&mut *conn).await?)
        }

        /// How many accounts hold keys (each has its key 0).
        pub async fn count_accounts(conn: &mut Conn) -> Result<i64> {
            Ok(sqlx::query_scalar("SELECT COUNT(*) FROM assignments WHERE idx = 0").fetch_one(&mut *conn).await?)
        }

        /// The key rows of the first `limit` accounts after `after`, by account and index,
        /// at most `max_rows` of them, each with the switch of a staged move that set it
        /// (past or pending), and key 0 with the account's cap on its fanout, if it set one.
        pub async fn list(conn: &mut Conn, after: Option<&str>, limit: u32, max_rows: u32) -> Result<Vec<(KeyRow, Option<Switch>, Option<u32>)>> {
            let rows = sqlx::query(super::LIST_PAGE)
            .bind(after.unwrap_or(""))
            .bind(i64::from(limit))
            .bind(i64::from(max_rows))
            .fetch_all(&mut *conn)
            .await?;
            rows.iter()
                .map(|r| {
                    let row = decode_row(
                        r.try_get(0)?,
                        r.try_get::<i64, _>(1)?,
                        &r.try_get::<Vec<u8>, _>(2)?,
                        r.try_get(3)?,
                        r.try_get(4)?,
                    )?;
                    let from: Option<Vec<u8>> = r.try_get(5)?;
                    super::listed(row, from.as_deref(), r.try_get(6)?, r.try_get(7)?)
                })
                .collect()
        }

        /// Up to `limit` moves still pending at `now` (Unix milliseconds) whose event id is
        /// above `after`, by event id.
        pub async fn moves(conn: &mut Conn, after: i64, now: i64, limit: i64) -> Result<Vec<PendingMove>> {
            let rows = sqlx::query(
                "SELECT a.account, a.idx, a.prev_hash_key, a.hash_key, a.switch_at, a.moved_by, e.at, e.actor, e.reason \
                 FROM assignments a JOIN events e ON e.id = a.moved_by \
                 WHERE a.switch_at > $1 AND a.moved_by > $2 ORDER BY a.moved_by LIMIT $3",
            )
            .bind(now)
            .bind(after)
            .bind(limit)
            .fetch_all(&mut *conn)
            .await?;
            rows.iter()
                .map(|r| {
                    let account: String = r.try_get(0)?;
                    let idx: i64 = r.try_get(1)?;
                    let index = u32::try_from(idx)
                        .map_err(|_| StoreError::Corrupt(format!("account {account}: key index {idx}")))?;
                    let from: Option<Vec<u8>> = r.try_get(2)?;
                    let reason: Option<String> = r.try_get(8)?;
                    let reason = reason
                        .map(|text| {
                            crate::store::MoveReason::parse(&text)
                                .ok_or_else(|| StoreError::Corrupt(format!("account {account}: move reason {text:?}")))
                        })
                        .transpose()?;
                    Ok(PendingMove {
                        account: decode_account(account)?,
                        index,
                        from: from.as_deref().map(decode_key).transpose()?,
                        to: decode_key(&r.try_get::<Vec<u8>, _>(3)?)?,
                        switch_at: r.try_get(4)?,
                        event_id: r.try_get(5)?,
                        applied_at: r.try_get(6)?,
                        applied_by: Actor::new(r.try_get(7)?),
                        reason,
                    })
                })
                .collect()
        }

        /// The newest migration the database has run (a newer keyspread's, perhaps).
        pub async fn schema_version(conn: &mut Conn) -> Result<i64> {
            Ok(sqlx::query_scalar("SELECT COALESCE(MAX(version), 0) FROM _sqlx_migrations WHERE success")
                .fetch_one(&mut *conn)
                .await?)
        }

        pub async fn last_event_id(conn: &mut Conn) -> Result<i64> {
            Ok(sqlx::query_scalar("SELECT COALESCE(MAX(id), 0) FROM events").fetch_one(&mut *conn).await?)
        }

        /// The log's name and its newest event id (0 while it has none), in one statement.
        pub async fn log_end(conn: &mut Conn) -> Result<crate::store::LogEnd> {
            let (log_id, end): (Option<String>, i64) = sqlx::query_as(
                "SELECT (SELECT value FROM meta WHERE name = 'log_id'), (SELECT COALESCE(MAX(id), 0) FROM events)",
            )
            .fetch_one(&mut *conn)
            .await?;
            crate::store::LogEnd::decode(log_id, end)
        }

        /// The log's name, end and horizon, with the time event `applied` was logged at if
        /// the log holds it, in one statement.
        pub async fn log_check(conn: &mut Conn, applied: i64) -> Result<crate::store::LogCheck> {
            let (log_id, end, horizon, applied_at): (Option<String>, i64, Option<String>, Option<i64>) = sqlx::query_as(
                "SELECT (SELECT value FROM meta WHERE name = 'log_id'), (SELECT COALESCE(MAX(id), 0) FROM events), \
                 (SELECT value FROM meta WHERE name = 'event_horizon'), (SELECT at FROM events WHERE id = $1)",
            )
            .bind(applied)
            .fetch_one(&mut *conn)
            .await?;
            Ok(crate::store::LogCheck {
                end: crate::store::LogEnd::decode(log_id, end)?,
                horizon: crate::store::log::decode_horizon(horizon)?,
                applied_at,
            })
        }

        /// When event `id` was logged, if the log holds it.
        pub async fn event_at(conn: &mut Conn, id: i64) -> Result<Option<i64>> {
            Ok(sqlx::query_scalar("SELECT at FROM events WHERE id = $1").bind(id).fetch_optional(&mut *conn).await?)
        }

        /// Up to `limit` events after `after` with the log's name, end and horizon, in one
        /// statement: one consistent state, and no transaction a reader that goes away could
        /// leave open on the connection.
        pub async fn log_page(conn: &mut Conn, after: i64, limit: i64) -> Result<crate::store::LogRead> {
            use sqlx::FromRow as _;
            let rows = sqlx::query(crate::store::log::LOG_PAGE).bind(after).bind(limit).fetch_all(&mut *conn).await?;
            // The head is on every row, and there is one row even when no event follows.
            let head = rows.first().ok_or_else(|| StoreError::Corrupt("no log head".into()))?;
            let end = crate::store::LogEnd::decode(head.try_get("log_id")?, head.try_get("log_end")?)?;
            let horizon = crate::store::log::decode_horizon(head.try_get("horizon")?)?;
            let mut events = Vec::with_capacity(rows.len());
            for row in &rows {
                if row.try_get::<Option<i64>, _>("id")?.is_some() {
                    events.push(EventRow::from_row(row)?.decode()?);
                }
            }
            Ok(crate::store::LogRead { end, horizon, events })
        }

        /// Renames the log `from` to `to` unless it is no longer `from`; answers its name now.
        pub async fn rename_log(conn: &mut Conn, from: &str, to: &str) -> Result<String> {
            sqlx::query("UPDATE meta SET value = $2 WHERE name = 'log_id' AND value = $1")
                .bind(from)
                .bind(to)
                .execute(&mut *conn)
                .await?;
            Ok(sqlx::query_scalar("SELECT value FROM meta WHERE name = 'log_id'").fetch_one(&mut *conn).await?)
        }

        pub async fn events_after(conn: &mut Conn, after: i64, limit: i64) -> Result<Vec<LoggedEvent>> {
            let rows: Vec<EventRow> = sqlx::query_as(
                "SELECT id, at, kind, account, key_before, key_after, weight, stream, shard_count, idx, switch_at, \
                 reason, max_fanout, actor FROM events WHERE id > $1 ORDER BY id LIMIT $2",
            )
            .bind(after)
            .bind(limit)
            .fetch_all(&mut *conn)
            .await?;
            rows.into_iter().map(EventRow::decode).collect()
        }

        /// The event log's horizon: events at or below it may have been dropped (0: none).
        pub async fn event_horizon(conn: &mut Conn) -> Result<i64> {
            let stored: Option<String> = sqlx::query_scalar("SELECT value FROM meta WHERE name = 'event_horizon'")
                .fetch_optional(&mut *conn)
                .await?;
            crate::store::log::decode_horizon(stored)
        }

        /// Raises the event log's horizon to `through`; a higher one stays.
        pub async fn raise_event_horizon(conn: &mut Conn, through: i64) -> Result<()> {
            sqlx::query(
                "INSERT INTO meta (name, value) VALUES ('event_horizon', $1) ON CONFLICT (name) DO UPDATE \
                 SET value = excluded.value WHERE CAST(meta.value AS BIGINT) < CAST(excluded.value AS BIGINT)",
            )
            .bind(through.to_string())
            .execute(&mut *conn)
            .await?;
            Ok(())
        }

        /// The newest event id a compaction may drop through: below the newest event, the
        /// newest `keep` events, and every event logged at or after `cutoff` (Unix ms).
        pub async fn compaction_bound(conn: &mut Conn, keep: i64, cutoff: i64) -> Result<i64> {
            let by_count: Option<i64> = sqlx::query_scalar("SELECT id FROM events ORDER BY id DESC LIMIT 1 OFFSET $1")
                .bind(keep.max(1))
                .fetch_optional(&mut *conn)
                .await?;
            let Some(by_count) = by_count else {
                return Ok(0);
            };
            let young: Option<i64> = sqlx::query_scalar("SELECT MIN(id) FROM events WHERE id <= $1 AND at >= $2")
                .bind(by_count)
                .bind(cutoff)
                .fetch_one(&mut *conn)
                .await?;
            Ok(young.map_or(by_count, |id| id - 1))
        }

        /// Drops up to `batch` events at or below `through`, oldest first, but the events
        /// that staged moves pending after `pending_after` (Unix ms) name (`GET /moves`
        /// reads them) and moves made for load at or after `cooldown_from` (the controller's
        /// cooldown reads them). Answers how many went.
        pub async fn drop_events(conn: &mut Conn, through: i64, pending_after: i64, cooldown_from: i64, batch: i64) -> Result<u64> {
            let done = sqlx::query(
                "DELETE FROM events WHERE id IN (SELECT id FROM events WHERE id <= $1 \
                 AND id NOT IN (SELECT moved_by FROM assignments WHERE moved_by IS NOT NULL AND switch_at > $2) \
                 AND (reason IS NULL OR reason <> 'load' OR at < $3) ORDER BY id LIMIT $4)",
            )
            .bind(through)
            .bind(pending_after)
            .bind(cooldown_from)
            .bind(batch)
            .execute(&mut *conn)
            .await?;
            Ok(done.rows_affected())
        }

        /// How many events the log holds.
        pub async fn count_events(conn: &mut Conn) -> Result<i64> {
            Ok(sqlx::query_scalar("SELECT COUNT(*) FROM events").fetch_one(&mut *conn).await?)
        }

        pub async fn set_max_fanout(conn: &mut Conn, account: &str, max_fanout: Option<u32>, by: &Actor, at: i64) -> Result<i64> {
            let done = sqlx::query("UPDATE assignments SET max_fanout = $1 WHERE account = $2 AND idx = 0")
                .bind(max_fanout.map(i64::from))
                .bind(account)
                .execute(&mut *conn)
                .await?;
            crate::store::changed_one(done.rows_affected())?;
            Ok(sqlx::query_scalar(
                "INSERT INTO events (at, kind, account, idx, max_fanout, actor) VALUES ($1, 'max_fanout', $2, 0, $3, $4) RETURNING id",
            )
            .bind(at)
            .bind(account)
            .bind(max_fanout.map(i64::from))
            .bind(by.as_str())
            .fetch_one(&mut *conn)
            .await?)
        }

        pub async fn claim_round(conn: &mut Conn, stream: &str, now: i64, interval_ms: i64) -> Result<Option<i64>> {
            sqlx::query("INSERT INTO controller_rounds (stream, round, at_ms) VALUES ($1, 0, 0) ON CONFLICT (stream) DO NOTHING")
                .bind(stream)
                .execute(&mut *conn)
                .await?;
            Ok(sqlx::query_scalar(
                "UPDATE controller_rounds SET round = round + 1, at_ms = $2 WHERE stream = $1 AND at_ms <= $3 RETURNING round",
            )
            .bind(stream)
            .bind(now)
            .bind(now - interval_ms)
            .fetch_optional(&mut *conn)
            .await?)
        }

        pub async fn moved_by_load_since(conn: &mut Conn, since: i64) -> Result<Vec<String>> {
            Ok(sqlx::query_scalar("SELECT DISTINCT account FROM events WHERE reason = 'load' AND at >= $1")
                .bind(since)
                .fetch_all(&mut *conn)
                .await?)
        }

        pub async fn fanout_cold(conn: &mut Conn) -> Result<Vec<(String, i64)>> {
            Ok(sqlx::query_as("SELECT account, since FROM fanout_cold")
                .fetch_all(&mut *conn)
                .await?)
        }

        pub async fn set_fanout_cold(conn: &mut Conn, rows: &[(String, i64)]) -> Result<()> {
            sqlx::query("DELETE FROM fanout_cold").execute(&mut *conn).await?;
            for (account, since) in rows {
                sqlx::query("INSERT INTO fanout_cold (account, since) VALUES ($1, $2)")
                    .bind(account)
                    .bind(since)
                    .execute(&mut *conn)
                    .await?;
            }
            Ok(())
        }

        pub async fn max_fanouts(conn: &mut Conn) -> Result<Vec<(crate::keyspace::AccountId, u32)>> {
            let rows: Vec<(String, i64)> =
                sqlx::query_as("SELECT account, max_fanout FROM assignments WHERE max_fanout IS NOT NULL")
                    .fetch_all(&mut *conn)
                    .await?;
            rows.into_iter()
                .map(|(account, cap)| {
                    let cap = u32::try_from(cap)
                        .map_err(|_| StoreError::Corrupt(format!("account {account}: max_fanout {cap}")))?;
                    Ok((decode_account(account)?, cap))
                })
                .collect()
        }

        pub async fn reweight(conn: &mut Conn, rows: &[KeyRow], by: &Actor, at: i64) -> Result<Vec<i64>> {
            let mut ids = Vec::with_capacity(rows.len());
            for row in rows {
                let key = row.hash_key.to_be_bytes();
                let done = sqlx::query("UPDATE assignments SET weight = $1 WHERE account = $2 AND idx = $3 AND hash_key = $4")
                    .bind(row.weight as i64)
                    .bind(row.account.as_str())
                    .bind(i64::from(row.index))
                    .bind(key.to_vec())
                    .execute(&mut *conn)
                    .await?;
                crate::store::changed_one(done.rows_affected())?;
                ids.push(log(conn, at, by, "reweight", row.account.as_str(), row.index, Some(key), Some(key), row.weight, None).await?);
            }
            Ok(ids)
        }

        /// Applies moves in order, each switching at `switch_at`, with a `move` event each;
        /// answers the events' ids.
        pub async fn apply_moves(conn: &mut Conn, moves: &[Move], by: &Actor, at: i64, switch_at: i64, reason: crate::store::MoveReason) -> Result<Vec<i64>> {
            let mut ids = Vec::with_capacity(moves.len());
            for m in moves {
                let (from, to) = (m.from.to_be_bytes(), m.to.to_be_bytes());
                let id: i64 = sqlx::query_scalar(
                    "INSERT INTO events (at, kind, account, idx, key_before, key_after, weight, switch_at, reason, actor) \
                     VALUES ($1, 'move', $2, $3, $4, $5, $6, $7, $8, $9) RETURNING id",
                )
                .bind(at)
                .bind(&m.account)
                .bind(i64::from(m.index))
                .bind(from.to_vec())
                .bind(to.to_vec())
                .bind(m.weight as i64)
                .bind(switch_at)
                .bind(reason.as_str())
                .bind(by.as_str())
                .fetch_one(&mut *conn)
                .await?;
                let done = sqlx::query(
                    "UPDATE assignments SET hash_key = $1, prev_hash_key = $2, switch_at = $3, moved_by = $4 \
                     WHERE account = $5 AND idx = $6 AND hash_key = $2",
                )
                .bind(to.to_vec())
                .bind(from.to_vec())
                .bind(switch_at)
                .bind(id)
                .bind(&m.account)
                .bind(i64::from(m.index))
                .execute(&mut *conn)
                .await?;
                crate::store::changed_one(done.rows_affected())?;
                ids.push(id);
            }
            Ok(ids)
        }

        /// Makes new keys (just inserted, each with its `allocate` event) take over at
        /// `switch_at`: producers keep to the account's other keys until then.
        pub async fn stage_new_keys(conn: &mut Conn, staged: &[(&str, u32, i64)], switch_at: i64) -> Result<()> {
            for &(account, index, event_id) in staged {
                let done = sqlx::query(
                    "UPDATE assignments SET switch_at = $1, moved_by = $2 \
                     WHERE account = $3 AND idx = $4 AND prev_hash_key IS NULL",
                )
                .bind(switch_at)
                .bind(event_id)
                .bind(account)
                .bind(i64::from(index))
                .execute(&mut *conn)
                .await?;
                crate::store::changed_one(done.rows_affected())?;
                let done = sqlx::query("UPDATE events SET switch_at = $1 WHERE id = $2 AND kind = 'allocate'")
                    .bind(switch_at)
                    .bind(event_id)
                    .execute(&mut *conn)
                    .await?;
                crate::store::changed_one(done.rows_affected())?;
            }
            Ok(())
        }

        pub async fn load_streams(conn: &mut Conn) -> Result<Vec<StreamRow>> {
            let rows = sqlx::query("SELECT name, shards, next_shard, is_primary, updated_at, version, listed, watch, kinesis_arn, kinesis_created_at, synced_at, sync_error FROM streams ORDER BY name")
                .fetch_all(&mut *conn)
                .await?;
            rows.iter().map(stream_row).collect()
        }

        /// Stream `name`'s row as committed, if it is registered.
        pub async fn load_stream(conn: &mut Conn, name: &str) -> Result<Option<StreamRow>> {
            let row = sqlx::query("SELECT name, shards, next_shard, is_primary, updated_at, version, listed, watch, kinesis_arn, kinesis_created_at, synced_at, sync_error FROM streams WHERE name = $1")
                .bind(name)
                .fetch_optional(&mut *conn)
                .await?;
            row.as_ref().map(stream_row).transpose()
        }

        /// The `version` of stream `name`'s map as committed, if it is registered: one
        /// primary-key probe, however large the map.
        pub async fn stream_version(conn: &mut Conn, name: &str) -> Result<Option<i64>> {
            Ok(sqlx::query_scalar("SELECT version FROM streams WHERE name = $1")
                .bind(name)
                .fetch_optional(&mut *conn)
                .await?)
        }

        fn stream_row(row: &<$db as sqlx::Database>::Row) -> Result<StreamRow> {
            let name: String = row.try_get(0)?;
            let shards = decode_shards(&name, &row.try_get::<String, _>(1)?)?;
            Ok(StreamRow {
                shards,
                next_shard: row.try_get::<i64, _>(2)? as u64,
                primary: row.try_get(3)?,
                updated_at: row.try_get(4)?,
                version: row.try_get(5)?,
                listed: decode_listed(&name, row.try_get(6)?)?,
                watch: row.try_get(7)?,
                kinesis: match (row.try_get::<Option<String>, _>(8)?, row.try_get::<Option<i64>, _>(9)?) {
                    (Some(arn), Some(created_at_ms)) => Some(KinesisStream { arn, created_at_ms }),
                    _ => None,
                },
                sync: SyncState { synced_at: row.try_get(10)?, sync_error: row.try_get(11)? },
                name,
            })
        }

        pub async fn sync_states(conn: &mut Conn) -> Result<Vec<(String, SyncState)>> {
            let rows = sqlx::query("SELECT name, synced_at, sync_error FROM streams WHERE synced_at IS NOT NULL OR sync_error IS NOT NULL")
                .fetch_all(&mut *conn)
                .await?;
            rows.iter()
                .map(|row| {
                    let state = SyncState { synced_at: row.try_get(1)?, sync_error: row.try_get(2)? };
                    Ok((row.try_get(0)?, state))
                })
                .collect()
        }

        pub async fn claim_sync(conn: &mut Conn, name: &str, now: i64, interval_ms: i64) -> Result<bool> {
            let done = sqlx::query(
                "UPDATE streams SET sync_claimed_at = $2 WHERE name = $1 AND watch AND sync_claimed_at <= $3 \
                 AND NOT EXISTS (SELECT 1 FROM reshard_jobs WHERE stream = $1 AND state = 'running')",
            )
                .bind(name)
                .bind(now)
                .bind(now - interval_ms)
                .execute(&mut *conn)
                .await?;
            Ok(done.rows_affected() == 1)
        }

        pub async fn synced(conn: &mut Conn, name: &str, at: i64) -> Result<()> {
            sqlx::query("UPDATE streams SET synced_at = $2, sync_error = NULL, sync_throttled = 0 WHERE name = $1")
                .bind(name)
                .bind(at)
                .execute(&mut *conn)
                .await?;
            Ok(())
        }

        pub async fn sync_failed(conn: &mut Conn, name: &str, error: &str, throttled: bool) -> Result<i64> {
            let count: Option<i64> = sqlx::query_scalar(
                "UPDATE streams SET sync_error = $2, \
                 sync_throttled = CASE WHEN $3 THEN sync_throttled + 1 ELSE 0 END \
                 WHERE name = $1 RETURNING sync_throttled",
            )
            .bind(name)
            .bind(error)
            .bind(throttled)
            .fetch_optional(&mut *conn)
            .await?;
            Ok(count.unwrap_or(0))
        }

        pub async fn defer_sync(conn: &mut Conn, name: &str, until: i64) -> Result<()> {
            sqlx::query("UPDATE streams SET sync_claimed_at = $2 WHERE name = $1")
                .bind(name)
                .bind(until)
                .execute(&mut *conn)
                .await?;
            Ok(())
        }

        pub async fn put_stream(conn: &mut Conn, stream: &StreamRow, by: &Actor) -> Result<i64> {
            if stream.primary {
                sqlx::query("UPDATE streams SET is_primary = FALSE WHERE name <> $1")
                    .bind(&stream.name)
                    .execute(&mut *conn)
                    .await?;
            }
            let shards = encode_shards(&stream.shards);
            sqlx::query(
                "INSERT INTO streams (name, shards, next_shard, is_primary, updated_at, listed, watch, kinesis_arn, kinesis_created_at) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) \
                 ON CONFLICT (name) DO UPDATE SET shards = excluded.shards, next_shard = excluded.next_shard, \
                 is_primary = excluded.is_primary, updated_at = excluded.updated_at, listed = excluded.listed, \
                 watch = excluded.watch, kinesis_arn = excluded.kinesis_arn, kinesis_created_at = excluded.kinesis_created_at",
            )
            .bind(&stream.name)
            .bind(&shards)
            .bind(stream.next_shard as i64)
            .bind(stream.primary)
            .bind(stream.updated_at)
            .bind(encode_listed(&stream.listed))
            .bind(stream.watch)
            .bind(stream.kinesis.as_ref().map(|k| k.arn.as_str()))
            .bind(stream.kinesis.as_ref().map(|k| k.created_at_ms))
            .execute(&mut *conn)
            .await?;
            let count = stream.shards.len() as i64;
            log_stream(conn, stream.updated_at, by, "stream_put", &stream.name, Some(count)).await
        }

        pub async fn delete_stream(conn: &mut Conn, name: &str, by: &Actor, at: i64) -> Result<i64> {
            let done = sqlx::query("DELETE FROM streams WHERE name = $1").bind(name).execute(&mut *conn).await?;
            crate::store::changed_one(done.rows_affected())?;
            log_stream(conn, at, by, "stream_delete", name, None).await
        }

        pub async fn ping(conn: &mut Conn) -> Result<()> {
            sqlx::query("SELECT 1").execute(&mut *conn).await?;
            Ok(())
        }

        #[allow(clippy::too_many_arguments)]
        async fn log(
            conn: &mut Conn,
            at: i64,
            by: &Actor,
            kind: &str,
            account: &str,
            index: u32,
            before: Option<[u8; 16]>,
            after: Option<[u8; 16]>,
            weight: u64,
            switch_at: Option<i64>,
        ) -> Result<i64> {
            Ok(sqlx::query_scalar(
                "INSERT INTO events (at, kind, account, idx, key_before, key_after, weight, switch_at, actor) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) RETURNING id",
            )
            .bind(at)
            .bind(kind)
            .bind(account)
            .bind(i64::from(index))
            .bind(before.map(|b| b.to_vec()))
            .bind(after.map(|b| b.to_vec()))
            .bind(weight as i64)
            .bind(switch_at)
            .bind(by.as_str())
            .fetch_one(&mut *conn)
            .await?)
        }

        /// The stream's workers, by name.
        pub async fn lease_workers(conn: &mut Conn, stream: &str) -> Result<Vec<WorkerRow>> {
            let rows: Vec<(String, i64, i64)> = sqlx::query_as(
                "SELECT worker, ttl_ms, expires_at FROM lease_workers WHERE stream = $1",
            )
            .bind(stream)
            .fetch_all(&mut *conn)
            .await?;
            let mut workers: Vec<WorkerRow> = rows
                .into_iter()
                .map(|(worker, ttl_ms, expires_at)| WorkerRow { worker, ttl_ms, expires_at })
                .collect();
            workers.sort_unstable_by(|a, b| a.worker.cmp(&b.worker));
            Ok(workers)
        }

        /// Sets a worker's time to live and expiry; whether it was in the group.
        pub async fn touch_worker(conn: &mut Conn, stream: &str, worker: &WorkerRow) -> Result<bool> {
            let done = sqlx::query("UPDATE lease_workers SET ttl_ms = $1, expires_at = $2 WHERE stream = $3 AND worker = $4")
                .bind(worker.ttl_ms)
                .bind(worker.expires_at)
                .bind(stream)
                .bind(&worker.worker)
                .execute(&mut *conn)
                .await?;
            Ok(done.rows_affected() == 1)
        }

        pub async fn insert_worker(conn: &mut Conn, stream: &str, worker: &WorkerRow, at: i64) -> Result<()> {
            sqlx::query("INSERT INTO lease_workers (stream, worker, ttl_ms, expires_at, joined_at) VALUES ($1, $2, $3, $4, $5)")
                .bind(stream)
                .bind(&worker.worker)
                .bind(worker.ttl_ms)
                .bind(worker.expires_at)
                .bind(at)
                .execute(&mut *conn)
                .await?;
            Ok(())
        }

        /// How many workers the stream's group has (live or not yet found expired).
        pub async fn count_workers(conn: &mut Conn, stream: &str) -> Result<i64> {
            Ok(sqlx::query_scalar("SELECT COUNT(*) FROM lease_workers WHERE stream = $1")
                .bind(stream)
                .fetch_one(&mut *conn)
                .await?)
        }

        /// Whether the worker was in the group.
        pub async fn delete_worker(conn: &mut Conn, stream: &str, worker: &str) -> Result<bool> {
            let done = sqlx::query("DELETE FROM lease_workers WHERE stream = $1 AND worker = $2")
                .bind(stream)
                .bind(worker)
                .execute(&mut *conn)
                .await?;
            Ok(done.rows_affected() == 1)
        }

        /// Whether some worker of the stream expired at or before `now`: one index probe.
        pub async fn any_expired(conn: &mut Conn, stream: &str, now: i64) -> Result<bool> {
            let expired: Option<i64> = sqlx::query_scalar(
                "SELECT expires_at FROM lease_workers WHERE stream = $1 AND expires_at <= $2 LIMIT 1",
            )
            .bind(stream)
            .bind(now)
            .fetch_optional(&mut *conn)
            .await?;
            Ok(expired.is_some())
        }

        /// Every lease row of the stream.
        pub async fn leases(conn: &mut Conn, stream: &str) -> Result<Vec<LeaseRow>> {
            const SQL: &str = "SELECT shard_id, owner, next_owner, told, epoch, checkpoint FROM leases \
                               WHERE stream = $1 ORDER BY shard_id";
            lease_rows(conn, SQL, stream, None).await
        }

        /// The leases `worker` owns: one range of the owner index.
        pub async fn owned_leases(conn: &mut Conn, stream: &str, worker: &str) -> Result<Vec<LeaseRow>> {
            lease_rows(conn, crate::store::leases::OWNED_LEASES, stream, Some(worker)).await
        }

        /// One shard's lease row, if it has one.
        pub async fn lease(conn: &mut Conn, stream: &str, shard_id: &str) -> Result<Option<LeaseRow>> {
            const SQL: &str = "SELECT shard_id, owner, next_owner, told, epoch, checkpoint FROM leases \
                               WHERE stream = $1 AND shard_id = $2";
            Ok(lease_rows(conn, SQL, stream, Some(shard_id)).await?.pop())
        }

        async fn lease_rows(conn: &mut Conn, sql: &str, stream: &str, second: Option<&str>) -> Result<Vec<LeaseRow>> {
            let mut query = sqlx::query_as::<_, (String, Option<String>, Option<String>, bool, i64, Option<String>)>(sql).bind(stream);
            if let Some(second) = second {
                query = query.bind(second);
            }
            query
                .fetch_all(&mut *conn)
                .await?
                .into_iter()
                .map(|(shard_id, owner, next, told, epoch, checkpoint)| {
                    let epoch = u64::try_from(epoch)
                        .map_err(|_| StoreError::Corrupt(format!("lease {shard_id}: epoch {epoch}")))?;
                    Ok(LeaseRow {
                        shard_id,
                        holder: Holder { owner, next, told, epoch },
                        checkpoint,
                    })
                })
                .collect()
        }

        /// Writes a lease row (creating it if the shard had none).
        pub async fn put_lease(conn: &mut Conn, stream: &str, lease: &LeaseRow) -> Result<()> {
            let h = &lease.holder;
            sqlx::query(
                "INSERT INTO leases (stream, shard_id, owner, next_owner, told, epoch, checkpoint) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT (stream, shard_id) DO UPDATE SET \
                 owner = excluded.owner, next_owner = excluded.next_owner, told = excluded.told, \
                 epoch = excluded.epoch, checkpoint = excluded.checkpoint",
            )
            .bind(stream)
            .bind(&lease.shard_id)
            .bind(&h.owner)
            .bind(&h.next)
            .bind(h.told)
            .bind(h.epoch as i64)
            .bind(&lease.checkpoint)
            .execute(&mut *conn)
            .await?;
            Ok(())
        }

        pub async fn delete_lease(conn: &mut Conn, stream: &str, shard_id: &str) -> Result<()> {
            sqlx::query("DELETE FROM leases WHERE stream = $1 AND shard_id = $2")
                .bind(stream)
                .bind(shard_id)
                .execute(&mut *conn)
                .await?;
            Ok(())
        }

        pub async fn lease_group(conn: &mut Conn, stream: &str) -> Result<Option<LeaseGroup>> {
            let row: Option<(i64, i64, i64, bool)> = sqlx::query_as(
                "SELECT map_version, assigned_at, weights_event, pending_join FROM lease_groups WHERE stream = $1",
            )
            .bind(stream)
            .fetch_optional(&mut *conn)
            .await?;
            Ok(row.map(|(map_version, assigned_at, weights_event, pending_join)| LeaseGroup {
                map_version,
                assigned_at,
                weights_event,
                pending_join,
            }))
        }

        pub async fn put_lease_group(conn: &mut Conn, stream: &str, group: &LeaseGroup) -> Result<()> {
            sqlx::query(
                "INSERT INTO lease_groups (stream, map_version, assigned_at, weights_event, pending_join) \
                 VALUES ($1, $2, $3, $4, $5) ON CONFLICT (stream) DO UPDATE SET map_version = excluded.map_version, \
                 assigned_at = excluded.assigned_at, weights_event = excluded.weights_event, \
                 pending_join = excluded.pending_join",
            )
            .bind(stream)
            .bind(group.map_version)
            .bind(group.assigned_at)
            .bind(group.weights_event)
            .bind(group.pending_join)
            .execute(&mut *conn)
            .await?;
            Ok(())
        }

        /// Forgets a stream's consumer group: workers, leases and checkpoints.
        pub async fn delete_lease_group(conn: &mut Conn, stream: &str) -> Result<()> {
            for table in ["leases", "lease_workers", "lease_groups"] {
                sqlx::query(&format!("DELETE FROM {table} WHERE stream = $1"))
                    .bind(stream)
                    .execute(&mut *conn)
                    .await?;
            }
            Ok(())
        }

        /// Logs a stream event; the database sets the stream's `version` to its id.
        async fn log_stream(conn: &mut Conn, at: i64, by: &Actor, kind: &str, stream: &str, shard_count: Option<i64>) -> Result<i64> {
            Ok(sqlx::query_scalar(
                "INSERT INTO events (at, kind, stream, shard_count, actor) VALUES ($1, $2, $3, $4, $5) RETURNING id",
            )
            .bind(at)
            .bind(kind)
            .bind(stream)
            .bind(shard_count)
            .bind(by.as_str())
            .fetch_one(&mut *conn)
            .await?)
        }
    };
}

pub(crate) use queries;
