//! Postgres backend: many keyspread replicas share one database.
//!
//! Writers serialize on a transaction-scoped advisory lock and announce each commit on a
//! channel that every replica listens to.

use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{PgPool, Postgres, Transaction};

super::queries::queries!(Postgres);

/// Runs a multi-row `INSERT INTO events` and answers the new ids in row order.
async fn insert_events(
    conn: &mut Conn,
    mut events: sqlx::QueryBuilder<'_, Postgres>,
) -> Result<Vec<i64>> {
    let mut ids: Vec<i64> = events
        .push(" RETURNING id")
        .build_query_scalar()
        .fetch_all(&mut *conn)
        .await?;
    // Ids are handed out in row order under the write lock.
    ids.sort_unstable();
    Ok(ids)
}

/// Hands every assignment to `each`, [`SCAN_BATCH`](super::SCAN_BATCH) at a time, paging
/// by account so that no read holds more than one batch.
pub async fn scan_assignments(
    conn: &mut Conn,
    mut each: impl FnMut(Vec<Assignment>) -> bool,
) -> Result<()> {
    let sql = format!(
        "{ASSIGNMENT_COLUMNS} WHERE account > $1 ORDER BY account LIMIT {}",
        super::SCAN_BATCH
    );
    let mut after = String::new();
    loop {
        let rows = sqlx::query(&sql).bind(&after).fetch_all(&mut *conn).await?;
        let Some(last) = rows.last() else {
            return Ok(());
        };
        after = last.try_get(0)?;
        let batch = rows
            .iter()
            .map(|r| decode_assignment(r.try_get(0)?, r.try_get(1)?, r.try_get(2)?, r.try_get(3)?))
            .collect::<Result<Vec<_>>>()?;
        if !each(batch) {
            return Ok(());
        }
    }
}

/// The advisory lock every write holds until it commits ("keyspread" in ASCII, as a key).
const WRITE_LOCK: i64 = 0x6b65_7973_7072_6561;

/// The channel commits are announced on.
pub const CHANNEL: &str = "keyspread_events";

/// Connects and runs the Postgres migrations (concurrent replicas migrate one at a time:
/// sqlx takes its own advisory lock for that).
pub async fn connect(url: &str) -> Result<PgPool> {
    let options: PgConnectOptions = url.parse()?;
    let pool = PgPoolOptions::new()
        .max_connections(8)
        // Mutations fail fast when the database is gone; lookups never wait on it.
        .acquire_timeout(Duration::from_secs(3))
        .connect_with(options)
        .await?;
    sqlx::migrate!("migrations/postgres").run(&pool).await?;
    Ok(pool)
}

/// A write transaction holding the cluster-wide write lock.
pub async fn begin(pool: &PgPool) -> Result<Transaction<'static, Postgres>> {
    let mut tx = pool.begin().await?;
    sqlx::query("SELECT pg_advisory_xact_lock($1)")
        .bind(WRITE_LOCK)
        .execute(&mut *tx)
        .await?;
    Ok(tx)
}

/// Announces the change to the other replicas and commits (the notice is delivered on
/// commit, and only then).
pub async fn commit(mut tx: Transaction<'static, Postgres>) -> Result<()> {
    sqlx::query("SELECT pg_notify($1, '')")
        .bind(CHANNEL)
        .execute(&mut *tx)
        .await?;
    Ok(tx.commit().await?)
}
