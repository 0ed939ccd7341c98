//! SQLite backend: one file in WAL mode, every commit synced (synchronous=FULL).

use std::str::FromStr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sqlx::sqlite::{
    SqliteConnectOptions, SqliteConnection, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous,
};
use sqlx::{Sqlite, SqlitePool, Transaction};

super::queries::queries!(Sqlite);

use super::Actors;

/// Inserts new keys and an `allocate` event each, a few hundred rows per statement;
/// answers the event ids in the order of `new`.
///
/// Under the write lock a statement's rows take consecutive ids, so the last one tells
/// them all; asking for `RETURNING id` would send each id from sqlx's connection thread
/// on its own, one hand-off per row.
pub async fn insert_many(
    conn: &mut Conn,
    new: &[KeyRow],
    by: Actors<'_>,
    at: i64,
) -> Result<Vec<i64>> {
    let mut ids = Vec::with_capacity(new.len());
    let actors = by.names(new.len());
    for (chunk, actors) in new.chunks(400).zip(actors.chunks(400)) {
        sqlx::QueryBuilder::<Sqlite>::new(
            "INSERT INTO assignments (account, idx, hash_key, weight, created_at) ",
        )
        .push_values(chunk, |mut row, a| {
            row.push_bind(a.account.as_str())
                .push_bind(i64::from(a.index))
                .push_bind(a.hash_key.to_be_bytes().to_vec())
                .push_bind(a.weight as i64)
                .push_bind(a.created_at);
        })
        .build()
        .execute(&mut *conn)
        .await?;
        let done = sqlx::QueryBuilder::<Sqlite>::new(
            "INSERT INTO events (at, kind, account, idx, key_after, weight, actor) ",
        )
        .push_values(chunk.iter().zip(actors), |mut row, (a, actor)| {
            row.push_bind(at)
                .push_bind("allocate")
                .push_bind(a.account.as_str())
                .push_bind(i64::from(a.index))
                .push_bind(a.hash_key.to_be_bytes().to_vec())
                .push_bind(a.weight as i64)
                .push_bind(*actor);
        })
        .build()
        .execute(&mut *conn)
        .await?;
        let (last, rows) = (done.last_insert_rowid(), done.rows_affected() as i64);
        ids.extend(last - rows + 1..=last);
    }
    Ok(ids)
}

/// Deletes each key, which must be stored as given, and logs `release` for it; answers
/// the event ids in the order of `gone`, or [`StoreError::Stale`] if a row had changed.
/// One statement per row: SQLite's statements cost no round trip.
pub async fn delete_many(
    conn: &mut Conn,
    gone: &[KeyRow],
    by: Actors<'_>,
    at: i64,
) -> Result<Vec<i64>> {
    let mut ids = Vec::with_capacity(gone.len());
    for (i, a) in gone.iter().enumerate() {
        let key = a.hash_key.to_be_bytes();
        let done = sqlx::query(
            "DELETE FROM assignments WHERE account = $1 AND idx = $2 AND hash_key = $3",
        )
        .bind(a.account.as_str())
        .bind(i64::from(a.index))
        .bind(key.to_vec())
        .execute(&mut *conn)
        .await?;
        super::changed_one(done.rows_affected())?;
        ids.push(
            log(
                conn,
                at,
                by.of(i, gone.len()),
                "release",
                a.account.as_str(),
                a.index,
                Some(key),
                None,
                a.weight,
                None,
            )
            .await?,
        );
    }
    Ok(ids)
}

/// Hands every key row to `each`, [`SCAN_BATCH`](super::SCAN_BATCH) at a time, stepping
/// one statement through SQLite's C API (see [`raw_sqlite`](super::raw_sqlite) for why).
///
/// The read runs on the calling thread without yielding: it is start-up's, before the
/// server accepts anything.
pub async fn scan_assignments(
    tx: &mut Transaction<'static, Sqlite>,
    mut each: impl FnMut(Vec<KeyRow>) -> bool,
) -> Result<()> {
    let mut handle = tx.lock_handle().await?;
    let mut rows = super::raw_sqlite::Statement::prepare(&mut handle, KEY_COLUMNS)?;
    let mut batch = Vec::with_capacity(super::SCAN_BATCH);
    while rows.step()? {
        let account = rows.text(0)?.to_owned();
        batch.push(decode_row(
            account,
            rows.int(1),
            rows.bytes(2),
            rows.int(3),
            rows.int(4),
        )?);
        if batch.len() == super::SCAN_BATCH {
            let full = std::mem::replace(&mut batch, Vec::with_capacity(super::SCAN_BATCH));
            if !each(full) {
                return Ok(());
            }
        }
    }
    if !batch.is_empty() {
        each(batch);
    }
    Ok(())
}

/// [`Tx::list`](super::Tx::list)'s page, stepped through SQLite's C API on the
/// transaction's connection (see [`raw_sqlite`](super::raw_sqlite) for why). A page is at
/// most a few thousand rows: read without yielding, it holds the thread a millisecond or two.
pub async fn list_stepped(
    tx: &mut Transaction<'static, Sqlite>,
    after: Option<&str>,
    limit: u32,
    max_rows: u32,
) -> Result<Vec<(KeyRow, Option<Switch>, Option<u32>)>> {
    let mut handle = tx.lock_handle().await?;
    let mut rows = super::raw_sqlite::Statement::prepare(&mut handle, super::LIST_PAGE)?;
    rows.bind_text(1, after.unwrap_or(""))?;
    rows.bind_int(2, i64::from(limit))?;
    rows.bind_int(3, i64::from(max_rows))?;
    let mut out = Vec::new();
    while rows.step()? {
        let row = decode_row(
            rows.text(0)?.to_owned(),
            rows.int(1),
            rows.bytes(2),
            rows.int(3),
            rows.int(4),
        )?;
        let from = (!rows.is_null(5)).then(|| rows.bytes(5));
        let switch_at = (!rows.is_null(6)).then(|| rows.int(6));
        let cap = (!rows.is_null(7)).then(|| rows.int(7));
        out.push(super::listed(row, from, switch_at, cap)?);
    }
    Ok(out)
}

/// The connections to one SQLite file.
///
/// Write transactions take turns on one connection of their own: SQLite drops a
/// connection's page cache whenever another connection has committed, so writes spread
/// over a pool would read their pages back from the file on most transactions. Everything
/// else reads through a few more.
#[derive(Debug, Clone)]
pub struct Pools {
    pub writes: SqlitePool,
    pub reads: SqlitePool,
    pub health: Health,
    /// The database file.
    pub file: std::path::PathBuf,
}

/// Why writes to the file fail, if they do: a full disk or an I/O error, remembered from
/// the statement that met it until a write commits.
#[derive(Debug, Clone, Default)]
pub struct Health(Arc<Mutex<Option<String>>>);

impl Health {
    /// Notes what `result` says of the file: an error of the disk is remembered.
    pub fn observe<T>(&self, result: &Result<T>) {
        if let Err(StoreError::Unavailable(sqlx::Error::Database(db))) = result
            && db
                .try_downcast_ref::<sqlx::sqlite::SqliteError>()
                .is_some_and(disk_failed)
        {
            *self.0.lock().expect("health lock") = Some(db.message().to_owned());
        }
    }

    /// A write committed: the file takes writes again.
    pub fn committed(&self) {
        *self.0.lock().expect("health lock") = None;
    }

    /// What the last failed write met, while no write has committed since.
    pub fn failing(&self) -> Option<String> {
        self.0.lock().expect("health lock").clone()
    }
}

/// Opens (creating if missing) the database file and runs the SQLite migrations.
pub async fn connect(url: &str) -> Result<Pools> {
    let options = SqliteConnectOptions::from_str(url)?
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        .synchronous(SqliteSynchronous::Full)
        // Another process's write transaction is waited for this long, then refused (503).
        // Seconds, not less: SQLite's busy handler polls rather than queues, and processes
        // writing one file under 64 clients keep one another waiting that long.
        .busy_timeout(Duration::from_secs(4))
        .foreign_keys(true)
        // A multi-row INSERT keeps a statement journal to undo itself on a conflict; in
        // memory it costs a copy, on a temporary file a write per page.
        .pragma("temp_store", "memory")
        // Copy the WAL back into the database every 10,000 pages (~40 MB) rather than
        // every 1,000: writes land on random pages of the hash-key index, and over ten
        // times as many commits most of them are written back once, not ten times. A
        // checkpoint runs inside a commit, so this is also time off allocations (+17%
        // under 64 allocating clients). Opening after a crash replays at most that much.
        .pragma("wal_autocheckpoint", "10000");
    let file = options.get_filename();
    if let Some(dir) = file.parent().filter(|d| !d.as_os_str().is_empty())
        && !dir.is_dir()
    {
        return Err(StoreError::MissingDirectory {
            file: file.display().to_string(),
            dir: dir.display().to_string(),
        });
    }
    // Processes starting together on one file would race to switch it to WAL mode (which
    // SQLite refuses at once rather than waiting) and to apply the first migration (sqlx's
    // SQLite migrator takes no lock). A file lock beside the database makes them take turns.
    let lock_path = options.get_filename().with_extension("migrate-lock");
    let lock = tokio::task::spawn_blocking(move || -> std::io::Result<std::fs::File> {
        // Opened, never truncated: a file of that name is the lock or left as it is.
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(lock_path)?;
        file.lock()?;
        Ok(file)
    })
    .await
    .expect("lock task")
    .map_err(|e| StoreError::Database(sqlx::Error::Io(e)))?;
    let pool = |connections| {
        SqlitePoolOptions::new()
            .max_connections(connections)
            .acquire_timeout(super::ACQUIRE_TIMEOUT)
            // A statement that failed for want of disk (or of the disk) may end its
            // transaction inside SQLite, so sqlx's ROLLBACK fails and sqlx still counts the
            // transaction open: every later BEGIN on the connection would be refused.
            // Such a connection is closed (which ends whatever it holds) and replaced.
            .after_release(|conn, _| Box::pin(async move { idle(conn).await }))
            .connect_with(options.clone())
    };
    let writes = pool(1).await?;
    super::additive(migrator()).run(&writes).await?;
    let reads = pool(3).await?;
    drop(lock);
    Ok(Pools {
        writes,
        reads,
        health: Health::default(),
        file: options.get_filename().to_owned(),
    })
}

/// Free space a disk that filled up must have again before readiness tries a write:
/// room in the write-ahead log for dozens of commits (a few 4 KiB pages each).
const HEADROOM: u64 = 1 << 20;

/// Bytes an unprivileged process may still write on the filesystem holding `dir`.
fn free_bytes(dir: &std::path::Path) -> std::io::Result<u64> {
    use std::os::unix::ffi::OsStrExt as _;
    let path = std::ffi::CString::new(dir.as_os_str().as_bytes())?;
    let mut stat = std::mem::MaybeUninit::<libc::statvfs>::uninit();
    // SAFETY: `path` is NUL-terminated and `stat` is written in full on success.
    if unsafe { libc::statvfs(path.as_ptr(), stat.as_mut_ptr()) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: statvfs succeeded.
    let stat = unsafe { stat.assume_init() };
    // The fields' types differ between platforms; on some they are u64 already.
    #[allow(clippy::useless_conversion)]
    Ok(u64::from(stat.f_bavail) * u64::from(stat.f_frsize))
}

/// Whether a connection given back to its pool is outside any transaction, both as SQLite
/// and as sqlx see it.
async fn idle(conn: &mut SqliteConnection) -> std::result::Result<bool, sqlx::Error> {
    use sqlx::Connection as _;
    // Locking the handle waits for the worker to run what was queued before, such as the
    // ROLLBACK of a transaction dropped just now.
    let mut handle = conn.lock_handle().await?;
    let autocommit = super::raw_sqlite::autocommit(&mut handle);
    drop(handle);
    Ok(autocommit && !conn.is_in_transaction())
}

/// Round-trips the file, and while [`Health::failing`], checks that its disk has
/// [`HEADROOM`] free and that a write commits: says whether the file takes writes, and
/// finds out by itself when it does again.
pub async fn writable(pools: &Pools) -> Result<()> {
    let Some(failure) = pools.health.failing() else {
        let mut conn = pools.reads.acquire().await?;
        return ping(&mut conn).await;
    };
    let dir = pools
        .file
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(std::path::Path::new("."));
    let free = free_bytes(dir).map_err(|e| StoreError::Database(sqlx::Error::Io(e)))?;
    if free < HEADROOM {
        tracing::warn!(
            %failure, free_bytes = free, dir = %dir.display(),
            "not ready: a write failed and the disk holding the database is still full"
        );
        return Err(StoreError::Read(failure));
    }
    // A write as small as this one may fit where a real one does not, hence the headroom.
    let mut tx = begin(pools).await?;
    let wrote = sqlx::query("UPDATE meta SET value = value WHERE name = 'keyspace_bits'")
        .execute(&mut *tx)
        .await
        .map_err(StoreError::from);
    pools.health.observe(&wrote);
    wrote?;
    let committed = commit(tx).await;
    pools.health.observe(&committed);
    committed?;
    pools.health.committed();
    Ok(())
}

/// The migrations this keyspread knows.
pub fn migrator() -> sqlx::migrate::Migrator {
    sqlx::migrate!("migrations/sqlite")
}

/// The database's clock, in Unix milliseconds: SQLite reads the host's clock in this
/// process, so every replica on one file reads the same one.
pub async fn clock_ms(conn: &mut Conn) -> Result<i64> {
    const NOW: &str = "SELECT CAST(ROUND((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER)";
    Ok(sqlx::query_scalar(NOW).fetch_one(&mut *conn).await?)
}

/// A write transaction. `BEGIN IMMEDIATE` takes the database's write lock up front, so
/// writers in other processes on the same file wait rather than interleave.
pub async fn begin(pools: &Pools) -> Result<Transaction<'static, Sqlite>> {
    Ok(pools.writes.begin_with("BEGIN IMMEDIATE").await?)
}

/// A transaction for changing `stream`'s leases and workers: a write transaction, whose
/// lock (the file's) serializes them.
pub async fn begin_leases(pools: &Pools, _stream: &str) -> Result<Transaction<'static, Sqlite>> {
    begin(pools).await
}

/// Nothing to take: a write transaction holds the whole file.
pub async fn lease_lock(_conn: &mut Conn, _stream: &str) -> Result<()> {
    Ok(())
}

/// A read transaction: in WAL mode its first read fixes the state every later one sees,
/// while writers go on.
pub async fn snapshot(pools: &Pools) -> Result<Transaction<'static, Sqlite>> {
    Ok(pools.reads.begin().await?)
}

/// Commits `tx`.
pub async fn commit(tx: Transaction<'static, Sqlite>) -> Result<()> {
    Ok(tx.commit().await?)
}

/// Whether SQLite refused for the moment: the file's write lock (`SQLITE_BUSY`) or a
/// table (`SQLITE_LOCKED`) still held by another connection when the busy timeout ran out,
/// or the disk (see [`disk_failed`]).
pub fn turned_away(err: &sqlx::sqlite::SqliteError) -> bool {
    const BUSY: i32 = 5;
    const LOCKED: i32 = 6;
    primary_code(err).is_some_and(|c| matches!(c, BUSY | LOCKED)) || disk_failed(err)
}

/// Whether the disk refused: full (`SQLITE_FULL`) or failing to read or write
/// (`SQLITE_IOERR`). Both pass once space is freed or the disk is back; no restart needed.
pub fn disk_failed(err: &sqlx::sqlite::SqliteError) -> bool {
    const IOERR: i32 = 10;
    const FULL: i32 = 13;
    primary_code(err).is_some_and(|c| matches!(c, IOERR | FULL))
}

/// The primary result code of an error (its code is an extended one: the low byte).
fn primary_code(err: &sqlx::sqlite::SqliteError) -> Option<i32> {
    use sqlx::error::DatabaseError as _;
    err.code()
        .and_then(|c| c.parse::<i32>().ok())
        .map(|c| c & 0xff)
}
