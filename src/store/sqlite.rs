//! SQLite backend: one file in WAL mode, every commit synced (synchronous=FULL).

use std::str::FromStr;
use std::time::Duration;

use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};
use sqlx::{Sqlite, SqlitePool, Transaction};

super::queries::queries!(Sqlite);

/// Opens (creating if missing) the database file and runs the SQLite migrations.
pub async fn connect(url: &str) -> Result<SqlitePool> {
    let options = SqliteConnectOptions::from_str(url)?
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        .synchronous(SqliteSynchronous::Full)
        .busy_timeout(Duration::from_secs(5))
        .foreign_keys(true);
    // Processes starting together on one file would race to switch it to WAL mode (which
    // SQLite refuses at once rather than waiting) and to apply the first migration (sqlx's
    // SQLite migrator takes no lock). A file lock beside the database makes them take turns.
    let lock_path = options.get_filename().with_extension("migrate-lock");
    let lock = tokio::task::spawn_blocking(move || -> std::io::Result<std::fs::File> {
        let file = std::fs::File::create(lock_path)?;
        file.lock()?;
        Ok(file)
    })
    .await
    .expect("lock task")
    .map_err(|e| StoreError::Database(sqlx::Error::Io(e)))?;
    let pool = SqlitePoolOptions::new()
        .max_connections(4)
        .acquire_timeout(Duration::from_secs(5))
        .connect_with(options)
        .await?;
    sqlx::migrate!("migrations/sqlite").run(&pool).await?;
    drop(lock);
    Ok(pool)
}

/// A write transaction. `BEGIN IMMEDIATE` takes the database's write lock up front, so
/// writers in other processes on the same file wait rather than interleave.
pub async fn begin(pool: &SqlitePool) -> Result<Transaction<'static, Sqlite>> {
    Ok(pool.begin_with("BEGIN IMMEDIATE").await?)
}

/// Commits `tx`.
pub async fn commit(tx: Transaction<'static, Sqlite>) -> Result<()> {
    Ok(tx.commit().await?)
}
