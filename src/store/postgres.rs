//! Postgres backend: many keyspread replicas share one database.
//!
//! Writers serialize on a transaction-scoped advisory lock; a trigger announces each
//! commit that logged events on a channel that every replica listens to.

use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{Connection as _, PgPool, Postgres};

use super::pg_commit::PgTx;
use super::pg_writable;

super::queries::queries!(Postgres);

use super::Actors;

/// Inserts new keys and an `allocate` event each in one statement (migration 0017's
/// `keyspread_insert_keys_by`); answers the event ids in the order of `new`.
///
/// The rows travel as arrays, so the statement's text is the same for any number of
/// rows: prepared once per connection, one round trip per call.
pub async fn insert_many(
    conn: &mut Conn,
    new: &[KeyRow],
    by: Actors<'_>,
    at: i64,
) -> Result<Vec<i64>> {
    let columns = Columns::of(new, by);
    let rows: Vec<(String, i64, i64)> = sqlx::query_as(
        "SELECT account, idx, id FROM keyspread_insert_keys_by($1, $2, $3, $4, $5, $6, $7)",
    )
    .bind(&columns.accounts)
    .bind(&columns.indices)
    .bind(&columns.keys)
    .bind(&columns.weights)
    .bind(&columns.created)
    .bind(&columns.actors)
    .bind(at)
    .fetch_all(&mut *conn)
    .await?;
    columns.ids_in_order(rows)
}

/// Inserts new keys as [`insert_many`] does, in a transaction of its own that holds the
/// write lock, provided the log is still `seen` (the same log, ending at the same event);
/// answers the event ids in the order of `new`. One round trip: migration 0018's
/// `keyspread_allocate_keys_in` does it all.
///
/// Refused as read-only, it is tried once more on a fresh connection (see [`begin`]): the
/// refused statement made nothing.
pub async fn insert_if_current(
    pool: &PgPool,
    seen: super::LogEnd,
    new: &[KeyRow],
    by: Actors<'_>,
    at: i64,
) -> Result<Vec<i64>> {
    match insert_if_current_once(pool, seen, new, by, at).await {
        Err(StoreError::ReadOnly) => insert_if_current_once(pool, seen, new, by, at).await,
        done => done,
    }
}

/// One try of [`insert_if_current`].
async fn insert_if_current_once(
    pool: &PgPool,
    seen: super::LogEnd,
    new: &[KeyRow],
    by: Actors<'_>,
    at: i64,
) -> Result<Vec<i64>> {
    let columns = Columns::of(new, by);
    // A connection first: failing to get one sent nothing.
    let mut conn = pool.acquire().await?;
    let statement = sqlx::query_as::<_, (String, i64, i64)>(
        "SELECT account, idx, id FROM keyspread_allocate_keys_in($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)",
    )
    .bind(WRITE_LOCK)
    .bind(seen.log_id.to_string())
    .bind(seen.end)
    .bind(&columns.accounts)
    .bind(&columns.indices)
    .bind(&columns.keys)
    .bind(&columns.weights)
    .bind(&columns.created)
    .bind(&columns.actors)
    .bind(at)
    .fetch_all(&mut *conn);
    // The statement commits by itself: once sent, its result is waited for like a COMMIT's.
    let rows = super::pg_commit::settled(statement, None, &pool.connect_options())
        .await
        .map_err(|err| match &err {
            StoreError::Database(sqlx::Error::Database(db))
                if db.code().as_deref() == Some(SERIALIZATION_FAILURE) =>
            {
                StoreError::LogMoved
            }
            _ => err,
        })?;
    columns.ids_in_order(rows)
}

/// Deletes each key, which must be stored as given, and logs `release` for it, in one
/// round trip (migration 0017's `keyspread_delete_keys_by`); answers the event ids in the
/// order of `gone`, or [`StoreError::Stale`] if a row had changed.
pub async fn delete_many(
    conn: &mut Conn,
    gone: &[KeyRow],
    by: Actors<'_>,
    at: i64,
) -> Result<Vec<i64>> {
    let columns = Columns::of(gone, by);
    let rows: Vec<(String, i64, i64)> = sqlx::query_as(
        "SELECT account, idx, id FROM keyspread_delete_keys_by($1, $2, $3, $4, $5, $6)",
    )
    .bind(&columns.accounts)
    .bind(&columns.indices)
    .bind(&columns.keys)
    .bind(&columns.weights)
    .bind(&columns.actors)
    .bind(at)
    .fetch_all(&mut *conn)
    .await?;
    if rows.len() != gone.len() {
        return Err(StoreError::Stale);
    }
    columns.ids_in_order(rows)
}

/// The SQLSTATE `keyspread_allocate_keys_in` fails with when the log moved on.
const SERIALIZATION_FAILURE: &str = "40001";

/// Key rows as the column arrays the statements take.
struct Columns<'a> {
    accounts: Vec<&'a str>,
    indices: Vec<i64>,
    keys: Vec<Vec<u8>>,
    weights: Vec<i64>,
    created: Vec<i64>,
    actors: Vec<&'a str>,
}

impl<'a> Columns<'a> {
    fn of(rows: &'a [KeyRow], by: Actors<'a>) -> Self {
        Columns {
            actors: by.names(rows.len()),
            accounts: rows.iter().map(|r| r.account.as_str()).collect(),
            indices: rows.iter().map(|r| i64::from(r.index)).collect(),
            keys: rows
                .iter()
                .map(|r| r.hash_key.to_be_bytes().to_vec())
                .collect(),
            weights: rows.iter().map(|r| r.weight as i64).collect(),
            created: rows.iter().map(|r| r.created_at).collect(),
        }
    }

    /// The event ids of `(account, idx, id)` rows, in the order of the key rows.
    fn ids_in_order(&self, rows: Vec<(String, i64, i64)>) -> Result<Vec<i64>> {
        // (account, idx) is the primary key: each returned row names its own.
        let ids: std::collections::HashMap<(String, i64), i64> = rows
            .into_iter()
            .map(|(account, idx, id)| ((account, idx), id))
            .collect();
        self.accounts
            .iter()
            .zip(&self.indices)
            .map(|(account, idx)| {
                ids.get(&((*account).to_owned(), *idx))
                    .copied()
                    .ok_or_else(|| {
                        StoreError::Corrupt(format!(
                            "no event id came back for {account:?} key {idx}"
                        ))
                    })
            })
            .collect()
    }
}

/// Hands every key row to `each`, [`SCAN_BATCH`](super::SCAN_BATCH) at a time, paging
/// by account and index so that no read holds more than one batch.
pub async fn scan_assignments(
    conn: &mut Conn,
    mut each: impl FnMut(Vec<KeyRow>) -> bool,
) -> Result<()> {
    let sql = format!(
        "{KEY_COLUMNS} WHERE (account, idx) > ($1, $2) ORDER BY account, idx LIMIT {}",
        super::SCAN_BATCH
    );
    let (mut after, mut after_idx) = (String::new(), -1i64);
    loop {
        let rows = sqlx::query(&sql)
            .bind(&after)
            .bind(after_idx)
            .fetch_all(&mut *conn)
            .await?;
        let Some(last) = rows.last() else {
            return Ok(());
        };
        after = last.try_get(0)?;
        after_idx = last.try_get(1)?;
        let batch = rows
            .iter()
            .map(|r| {
                decode_row(
                    r.try_get(0)?,
                    r.try_get(1)?,
                    r.try_get(2)?,
                    r.try_get(3)?,
                    r.try_get(4)?,
                )
            })
            .collect::<Result<Vec<_>>>()?;
        if !each(batch) {
            return Ok(());
        }
    }
}

/// The advisory lock every write holds until it commits ("keyspread" in ASCII, as a key).
const WRITE_LOCK: i64 = 0x6b65_7973_7072_6561;

/// The channel commits are announced on, naming an event they logged, by the trigger of
/// migrations 0003 and 0005.
pub const CHANNEL: &str = "keyspread_events";

/// Connects and runs the Postgres migrations (concurrent replicas migrate one at a time:
/// sqlx takes its own advisory lock for that).
pub async fn connect(url: &str) -> Result<PgPool> {
    let options: PgConnectOptions = url.parse()?;
    let mut conn = first_connection(&options).await?;
    migrate(&mut conn).await?;
    conn.close().await?;
    Ok(PgPoolOptions::new()
        .max_connections(8)
        // Mutations fail fast when the database is gone; lookups never wait on it.
        .acquire_timeout(super::ACQUIRE_TIMEOUT)
        // A connection that comes back still inside a transaction, as sqlx counts them (a
        // statement refused while the transaction guard was being given up), is closed
        // rather than lent again: the next begin on it would fail.
        .after_release(|conn, _| {
            Box::pin(async move { Ok(!sqlx::Connection::is_in_transaction(conn)) })
        })
        // A connection that may lead to a server taking no writes is not lent again.
        .before_acquire(|_, meta| Box::pin(async move { Ok(!pg_writable::retired(meta.age)) }))
        .connect_with(options.options(session_settings()))
        .await?)
}

/// A connection of its own, tried for [`ACQUIRE_TIMEOUT`](super::ACQUIRE_TIMEOUT) (a
/// server still starting answers soon), failing with what stopped the last try: a pool
/// would only say that it timed out.
async fn first_connection(options: &PgConnectOptions) -> Result<sqlx::PgConnection> {
    let started = std::time::Instant::now();
    loop {
        let tried = tokio::time::timeout(
            super::ACQUIRE_TIMEOUT,
            sqlx::PgConnection::connect_with(options),
        )
        .await;
        let err = match tried {
            Ok(Ok(conn)) => return Ok(conn),
            Ok(Err(err)) => err,
            Err(_) => {
                return Err(StoreError::Unreachable(format!(
                    "no answer from {} within {} s",
                    address(options),
                    super::ACQUIRE_TIMEOUT.as_secs()
                )));
            }
        };
        if started.elapsed() >= super::ACQUIRE_TIMEOUT {
            return Err(match &err {
                sqlx::Error::Io(io) if io.kind() == std::io::ErrorKind::ConnectionRefused => {
                    StoreError::Unreachable(format!(
                        "connection refused at {} (is the server running and listening there?)",
                        address(options)
                    ))
                }
                sqlx::Error::Io(io) => {
                    StoreError::Unreachable(format!("{io} at {}", address(options)))
                }
                _ => err.into(),
            });
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Where `options` connect: `HOST:PORT`, or the socket file.
fn address(options: &PgConnectOptions) -> String {
    match options.get_socket() {
        Some(dir) => format!("{}/.s.PGSQL.{}", dir.display(), options.get_port()),
        None => format!("{}:{}", options.get_host(), options.get_port()),
    }
}

/// What every session sets for itself when it connects, so that a stuck or vanished writer
/// cannot hold the others up for long, with nothing to configure on the server.
fn session_settings() -> [(&'static str, String); 7] {
    let ms = |d: Duration| format!("{}ms", d.as_millis());
    [
        // A write that waits this long for another writer's lock is refused (503).
        ("lock_timeout", ms(LOCK_TIMEOUT)),
        // Several times keyspread's slowest statement (a 10,000-account batch, whose whole
        // request takes under a second): one still running is ended, and its transaction
        // rolled back, rather than commit long after its client was answered.
        ("statement_timeout", ms(STATEMENT_TIMEOUT)),
        // keyspread never pauses inside a transaction for long (start-up's tree build, about
        // a second at a million accounts): a writer that stopped talking while holding the
        // write lock loses its session, and the lock, within 10 s.
        (
            "idle_in_transaction_session_timeout",
            ms(IDLE_IN_TRANSACTION_TIMEOUT),
        ),
        // The server notices a client that vanished (host down, network cut) within 20 s:
        // by keepalive probes on an idle connection, by unacknowledged data on a busy one.
        ("tcp_keepalives_idle", "5".into()),
        ("tcp_keepalives_interval", "5".into()),
        ("tcp_keepalives_count", "3".into()),
        ("tcp_user_timeout", ms(Duration::from_secs(20))),
    ]
}

/// Longest a write waits for another writer's lock. Writers hold it for milliseconds, even
/// under 64 clients' groups; one that holds it this long is stuck, and the client is better
/// answered 503 than kept waiting. Under half [`CHANGE_TIMEOUT`], so that a group queued
/// behind a refused one is refused by the database too (and so never made later) before
/// its callers stop waiting.
const LOCK_TIMEOUT: Duration = Duration::from_millis(1500);

/// Longest a change is waited for before its client is answered 503: a connection that has
/// gone silent (a network dropping packets) is never waited for past it, and the answer
/// comes well before the request timeout (408).
pub const CHANGE_TIMEOUT: Duration = Duration::from_secs(4);

const _: () = assert!(2 * LOCK_TIMEOUT.as_millis() < CHANGE_TIMEOUT.as_millis());

/// See [`session_settings`].
const STATEMENT_TIMEOUT: Duration = Duration::from_secs(5);

/// See [`session_settings`].
const IDLE_IN_TRANSACTION_TIMEOUT: Duration = Duration::from_secs(10);

/// Runs the migrations on a connection of their own, without the sessions' lock and
/// statement timeouts: a replica waits its turn behind another's migrations, and a
/// migration may take long.
async fn migrate(conn: &mut sqlx::PgConnection) -> Result<()> {
    sqlx::raw_sql("SET lock_timeout = 0; SET statement_timeout = 0")
        .execute(&mut *conn)
        .await?;
    super::additive(migrator()).run(&mut *conn).await?;
    Ok(())
}

/// Whether Postgres turned a statement away for the moment, by its SQLSTATE: the lock
/// timeout (55P03), a statement cancelled by its timeout (57014), the session ended while
/// idle in a transaction (25P03), a broken connection (class 08), the server shutting down
/// or refusing connections (class 57P), or too many connections (53300).
pub fn turned_away(code: &str) -> bool {
    matches!(code, "55P03" | "57014" | "25P03" | "53300")
        || code.starts_with("08")
        || code.starts_with("57P")
}

/// The migrations this keyspread knows.
pub fn migrator() -> sqlx::migrate::Migrator {
    sqlx::migrate!("migrations/postgres")
}

/// The database server's clock, in Unix milliseconds: one clock for every replica, however
/// far their hosts' clocks drift.
pub async fn clock_ms(conn: &mut Conn) -> Result<i64> {
    const NOW: &str = "SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint";
    Ok(sqlx::query_scalar(NOW).fetch_one(&mut *conn).await?)
}

/// A write transaction holding the cluster-wide write lock, on a server that takes writes.
///
/// The lock is taken by a statement of its own, inside a transaction sqlx knows it
/// began: when the lock is refused (its timeout, a cancelled statement), dropping the
/// transaction rolls it back before the connection goes back to the pool. Sent together
/// with `BEGIN` as one query, a refused lock left the connection in an aborted
/// transaction that failed every later statement on it.
///
/// A session opened while the server took no writes may stay read-only after it takes
/// them again: a transaction found read-only retires its connection, and one fresh
/// connection says whether the server takes writes now ([`StoreError::ReadOnly`] if not).
pub async fn begin(pool: &PgPool) -> Result<PgTx> {
    for _ in 0..2 {
        let mut tx = start(pool, None).await?;
        let row = sqlx::Executor::fetch_one(&mut *tx, LOCK_WRITES).await?;
        let (pid, read_only): (i32, bool) = (row.try_get(0)?, row.try_get(1)?);
        if !read_only {
            return Ok(PgTx::new(tx, Some(pid), pool.connect_options()));
        }
        pg_writable::met_now();
    }
    Err(StoreError::ReadOnly)
}

/// Whether the server takes writes now, as [`begin`] finds out: a connection found
/// read-only or in recovery is retired, and one fresh connection asked again.
pub async fn writable(pool: &PgPool) -> std::result::Result<(), super::Unwritable> {
    use super::Unwritable;
    const ASK: &str = "SELECT pg_is_in_recovery(), current_setting('transaction_read_only')::bool";
    let mut found = Unwritable::ReadOnly;
    for _ in 0..2 {
        let asked = async {
            let mut conn = pool.acquire().await?;
            sqlx::query_as::<_, (bool, bool)>(ASK)
                .fetch_one(&mut *conn)
                .await
        };
        match asked.await {
            Err(_) => return Err(Unwritable::Unreachable),
            Ok((false, false)) => return Ok(()),
            Ok((recovering, _)) => {
                pg_writable::met_now();
                found = if recovering {
                    Unwritable::InRecovery
                } else {
                    Unwritable::ReadOnly
                };
            }
        }
    }
    Err(found)
}

/// Takes the write lock, and names the backend that holds it (to ask after it while its
/// COMMIT is under way) and whether its transaction is read-only. Without arguments it
/// goes as a simple query: nothing to prepare, one message, and the lock is taken as soon
/// as it arrives.
const LOCK_WRITES: &str = "SELECT pg_backend_pid(), current_setting('transaction_read_only')::bool \
     FROM (SELECT pg_advisory_xact_lock(7738725071420810593)) AS l";

const _: () = assert!(WRITE_LOCK == 7_738_725_071_420_810_593);

/// The class of the advisory locks that serialize each stream's lease changes (the stream
/// name's hash is the other half), apart from the write lock: heartbeats never wait on
/// allocations.
const LEASE_LOCK: i32 = 0x6c65_6173; // "leas"

/// A transaction holding `stream`'s lease lock, for changing its leases and workers.
pub async fn begin_leases(pool: &PgPool, stream: &str) -> Result<PgTx> {
    let mut tx = start(pool, None).await?;
    lease_lock(&mut tx, stream).await?;
    Ok(PgTx::new(tx, None, pool.connect_options()))
}

/// Takes `stream`'s lease lock until the transaction ends.
pub async fn lease_lock(conn: &mut Conn, stream: &str) -> Result<()> {
    sqlx::query("SELECT pg_advisory_xact_lock($1, hashtext($2))")
        .bind(LEASE_LOCK)
        .bind(stream)
        .execute(&mut *conn)
        .await?;
    Ok(())
}

/// A read-only transaction over one snapshot of the database, waiting for no lock.
pub async fn snapshot(pool: &PgPool) -> Result<PgTx> {
    let tx = start(
        pool,
        Some("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY"),
    )
    .await?;
    Ok(PgTx::new(tx, None, pool.connect_options()))
}

/// Begins a transaction (with `statement`, or a plain `BEGIN`) on a task of its own, so that
/// it completes even if its caller goes away (a timeout, a client gone) while the `BEGIN`
/// is under way: sqlx 0.8 queues no ROLLBACK for a `BEGIN` whose answer has not come, and
/// the connection would go back to the pool inside a transaction. Completed, the
/// transaction is dropped like any other, and rolled back.
async fn start(
    pool: &PgPool,
    statement: Option<&'static str>,
) -> Result<sqlx::Transaction<'static, Postgres>> {
    let pool = pool.clone();
    let begun = tokio::spawn(async move {
        match statement {
            Some(statement) => pool.begin_with(statement).await,
            None => pool.begin().await,
        }
    });
    begun
        .await
        .map_err(|_| sqlx::Error::WorkerCrashed)?
        .map_err(Into::into)
}

/// Commits `tx`, waiting for the result while its session lives (see
/// [`pg_commit::settled`](super::pg_commit::settled)). The other replicas hear of it from
/// the `events` trigger (migration 0003), on commit and only then.
pub async fn commit(tx: PgTx) -> Result<()> {
    tx.commit().await
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_trigger_announces_on_the_channel_replicas_listen_to() {
        let migration = include_str!("../../migrations/postgres/0005_announce_id.sql");
        assert!(migration.contains(&format!("pg_notify('{}', newest::text)", super::CHANNEL)));
    }
}
