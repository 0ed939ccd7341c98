//! The authoritative table of assignments, the registered streams, and the event log of
//! every change to them.
//!
//! One `Store` type over two backends (SQLite, Postgres) whose queries are written once in
//! `queries.rs`. Every change runs in a write transaction ([`Tx`]) that holds the
//! database's write lock, so writers in other processes or replicas take turns; the
//! in-memory tree is only a cache of what is committed here.

pub mod kept;
pub mod leases;
pub mod load;
pub mod packed;
mod pg_commit;
mod pg_writable;
mod postgres;
mod queries;
mod raw_sqlite;
mod sqlite;

pub use sqlite::Pools as SqlitePools;

use std::time::Duration;

use sqlx::PgPool;

use crate::keyspace::lease_state::LeaseShard;
use crate::keyspace::{AccountId, HashKey, Move};
use leases::{LeaseGroup, LeaseRow, WorkerRow};

pub use log::{LogCheck, LogEnd, LogId, LogRead};
pub use postgres::CHANNEL;
pub use reshard::{JobProgress, JobState, ReshardJob};
pub use retention::Compaction;

/// `migrations` (a backend's `sqlx::migrate!`), ready to run on a database that a newer
/// keyspread may have migrated further.
///
/// Migrations only add (tables, functions, triggers, columns with defaults), so a binary
/// runs correctly on a newer schema: replicas upgrade one at a time, and an old one that
/// restarts after a new one migrated the database must start. sqlx refuses by default.
fn additive(mut migrations: sqlx::migrate::Migrator) -> sqlx::migrate::Migrator {
    migrations.set_ignore_missing(true);
    migrations
}

/// One of an account's keys, as committed: a row of the `assignments` table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyRow {
    pub account: AccountId,
    /// Which of the account's keys, `0..fanout`.
    pub index: u32,
    pub hash_key: HashKey,
    /// This key's share of the account's weight.
    pub weight: u64,
    /// Unix milliseconds.
    pub created_at: i64,
}

/// An account's hash keys, by index: one for most accounts, kept inline.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HashKeys {
    One(HashKey),
    Many(std::sync::Arc<[HashKey]>),
}

impl HashKeys {
    pub fn from_vec(keys: Vec<HashKey>) -> Self {
        match keys.as_slice() {
            [one] => HashKeys::One(*one),
            _ => HashKeys::Many(keys.into()),
        }
    }

    pub fn as_slice(&self) -> &[HashKey] {
        match self {
            HashKeys::One(key) => std::slice::from_ref(key),
            HashKeys::Many(keys) => keys,
        }
    }

    /// The account's fanout.
    pub fn len(&self) -> usize {
        self.as_slice().len()
    }

    pub fn is_empty(&self) -> bool {
        self.as_slice().is_empty()
    }
}

/// One account's hash keys, as committed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Assignment {
    pub account: AccountId,
    /// By index; as many as the account's fanout, at least one. A key that is switching
    /// is here with its new value.
    pub hash_keys: HashKeys,
    /// The account's weight: the sum of its keys'.
    pub weight: u64,
    /// Unix milliseconds.
    pub created_at: i64,
    /// The account's keys that a staged move is switching (empty for almost every
    /// account): each key's old value stays in use until its switch.
    pub switching: Vec<Switch>,
    /// The most keys the load controller may give the account, if it opted in.
    pub max_fanout: Option<u32>,
}

/// One key of an account moving under a staged move: producers send `from` until
/// `switch_at`, then the key's new value. With no `from`, the key is new (a fanout the load
/// controller raised): until `switch_at` producers send over the account's other keys, as
/// if the fanout had not grown, so that no sub-key changes shard before the switch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Switch {
    pub index: u32,
    pub from: Option<HashKey>,
    /// Unix milliseconds.
    pub switch_at: i64,
}

/// The keys producers send at some moment, and the switch ahead of them, if any.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeysAt {
    pub keys: HashKeys,
    pub next: Option<NextKeys>,
}

/// The keys that take over at `switch_at`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NextKeys {
    pub keys: HashKeys,
    /// Unix milliseconds.
    pub switch_at: i64,
}

impl Assignment {
    /// Key 0: the account's only key unless it fans out.
    pub fn hash_key(&self) -> HashKey {
        self.hash_keys.as_slice()[0]
    }

    pub fn fanout(&self) -> u32 {
        self.hash_keys.len() as u32
    }

    /// The keys to send at `now` (Unix milliseconds): each switching key's old value until
    /// its switch; and the nearest switch still ahead, with the keys from then on.
    pub fn keys_at(&self, now: i64) -> KeysAt {
        let ahead = |after: i64| self.switching.iter().filter(move |s| s.switch_at > after);
        let Some(first) = ahead(now).map(|s| s.switch_at).min() else {
            return KeysAt {
                keys: self.hash_keys.clone(),
                next: None,
            };
        };
        let keys_after = |moment: i64| {
            let mut keys = self.hash_keys.as_slice().to_vec();
            let mut fanout = keys.len();
            for s in ahead(moment) {
                match s.from {
                    Some(from) => {
                        if let Some(key) = keys.get_mut(s.index as usize) {
                            *key = from;
                        }
                    }
                    // New keys are the last ones; key 0 is never new.
                    None => fanout = fanout.min((s.index as usize).max(1)),
                }
            }
            keys.truncate(fanout);
            HashKeys::from_vec(keys)
        };
        KeysAt {
            keys: keys_after(now),
            next: Some(NextKeys {
                keys: keys_after(first),
                switch_at: first,
            }),
        }
    }

    /// The rows that store it.
    pub fn rows(&self) -> Vec<KeyRow> {
        let fanout = self.fanout();
        self.hash_keys
            .as_slice()
            .iter()
            .enumerate()
            .map(|(i, key)| KeyRow {
                account: self.account.clone(),
                index: i as u32,
                hash_key: *key,
                weight: crate::keyspace::key_weight(self.weight, fanout, i as u32),
                created_at: self.created_at,
            })
            .collect()
    }
}

/// Groups rows sorted by account and index into assignments (the first row of an account
/// gives its creation time).
/// A page of [`Store::list`] from at most `max_keys + 1` key rows: the flag says whether
/// the key bound cut it.
fn list_page(
    rows: Vec<(KeyRow, Option<Switch>, Option<u32>)>,
    max_keys: u32,
) -> Result<(Vec<Assignment>, bool)> {
    let cut = rows.len() > max_keys as usize;
    let mut accounts = group_rows(rows)?;
    if cut {
        // The last account may be missing keys: it starts the next page.
        accounts.pop();
    }
    Ok((accounts, cut))
}

fn group_rows(rows: Vec<(KeyRow, Option<Switch>, Option<u32>)>) -> Result<Vec<Assignment>> {
    let mut out: Vec<(Assignment, Vec<HashKey>)> = Vec::new();
    for (row, switch, max_fanout) in rows {
        let switching = Vec::from_iter(switch);
        match out.last_mut() {
            Some((a, keys)) if a.account == row.account => {
                if row.index as usize != keys.len() {
                    return Err(StoreError::Corrupt(format!(
                        "account {}: key {} follows key {}",
                        row.account,
                        row.index,
                        keys.len() - 1
                    )));
                }
                keys.push(row.hash_key);
                a.weight += row.weight;
                a.switching.extend(switching);
            }
            _ => {
                if row.index != 0 {
                    return Err(StoreError::Corrupt(format!(
                        "account {} has key {} but no key 0",
                        row.account, row.index
                    )));
                }
                let a = Assignment {
                    account: row.account,
                    hash_keys: HashKeys::One(row.hash_key),
                    weight: row.weight,
                    created_at: row.created_at,
                    switching,
                    max_fanout,
                };
                out.push((a, vec![row.hash_key]));
            }
        }
    }
    Ok(out
        .into_iter()
        .map(|(mut a, keys)| {
            a.hash_keys = HashKeys::from_vec(keys);
            a
        })
        .collect())
}

/// A registered stream, as committed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamRow {
    pub name: String,
    /// Open shards `(id, start, end)` in key order.
    pub shards: Vec<(String, HashKey, HashKey)>,
    /// One past the highest shard number the stream ever used.
    pub next_shard: u64,
    /// Whether new keys balance on this stream's map.
    pub primary: bool,
    /// Unix milliseconds.
    pub updated_at: i64,
    /// Id of the `stream_put` event that last wrote the row: set by the database (see
    /// migration `stream_map_references`), ignored when writing.
    pub version: i64,
    /// Every shard list-shards named, closed ones and parents included; `None` when the
    /// map was given as a shard count (the open shards are all there is).
    pub listed: Option<Vec<LeaseShard>>,
    /// Whether Kinesis is the map's source: it is listed again every sync interval.
    pub watch: bool,
    /// The stream Kinesis last answered under this name, if it was ever listed there.
    pub kinesis: Option<KinesisStream>,
    /// What the last listing from Kinesis found (written apart from the map: a listing
    /// that finds the map unchanged logs no event).
    pub sync: SyncState,
}

/// Which stream Kinesis means by a name: one deleted and created again under it has
/// another creation time (and, in another account or region, another ARN).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KinesisStream {
    pub arn: String,
    /// Unix milliseconds.
    pub created_at_ms: i64,
}

/// What the last listing of a stream from Kinesis found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SyncState {
    /// When a listing last succeeded (Unix ms).
    pub synced_at: Option<i64>,
    /// Why the last listing failed, until one succeeds.
    pub sync_error: Option<String>,
}

/// A staged move not yet switched: a key of `account` is `to` in the table, and producers
/// send `from` until `switch_at`; with no `from`, `to` is a new key (a fanout raised by
/// load) that producers start sending at `switch_at`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PendingMove {
    pub account: AccountId,
    pub index: u32,
    pub from: Option<HashKey>,
    pub to: HashKey,
    /// Unix milliseconds.
    pub switch_at: i64,
    /// Id of the `move` event.
    pub event_id: i64,
    /// When the move was applied (the event's time), Unix milliseconds.
    pub applied_at: i64,
    /// Who applied it (the event's actor).
    pub applied_by: Actor,
    /// Why (the event's reason); `None` for moves logged before reasons were.
    pub reason: Option<MoveReason>,
}

/// Who made a change, as the log records it: a token's name from the tokens file, `admin`
/// for `--token`, `loopback` for a client on the server's host when no token is configured,
/// `controller` for the closed loop's own rounds, `import` for `keyspread import`, `config`
/// for the primary stream named at start-up, `kinesis` for a watched stream's map as
/// listed from Kinesis. Never a token.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Actor(compact_str::CompactString);

impl Actor {
    pub const LOOPBACK: &'static str = "loopback";
    pub const CONTROLLER: &'static str = "controller";
    pub const IMPORT: &'static str = "import";
    /// The server's configuration: `--primary-stream` made a registered stream primary.
    pub const CONFIG: &'static str = "config";
    /// The one token `--token` configures.
    pub const ADMIN: &'static str = crate::config::ADMIN_TOKEN_NAME;
    /// What events logged before actors were read.
    pub const UNRECORDED: &'static str = "unrecorded";
    /// Kinesis itself: the map of a watched stream, as listed from Kinesis.
    pub const KINESIS: &'static str = "kinesis";
    /// Names no token may take (the tokens file refuses them): the log could not tell them
    /// from the server's own.
    pub const RESERVED: [&'static str; 6] = crate::config::RESERVED_NAMES;

    /// A name already checked (a tokens file's, or one of the constants above).
    pub fn new(name: &str) -> Actor {
        Actor(name.into())
    }

    pub fn loopback() -> Actor {
        Actor::new(Self::LOOPBACK)
    }

    pub fn controller() -> Actor {
        Actor::new(Self::CONTROLLER)
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// Who made each change of a write: one actor for all, or one per row (the changes of
/// several requests committed together).
#[derive(Debug, Clone, Copy)]
pub enum Actors<'a> {
    One(&'a Actor),
    Each(&'a [Actor]),
}

impl<'a> Actors<'a> {
    /// The actor of row `i` of `rows` rows (every row's, for [`Actors::One`]).
    fn of(self, i: usize, rows: usize) -> &'a Actor {
        match self {
            Actors::One(actor) => actor,
            Actors::Each(actors) => {
                assert_eq!(actors.len(), rows, "one actor per row");
                &actors[i]
            }
        }
    }

    /// Each row's actor's name, in order.
    fn names(self, rows: usize) -> Vec<&'a str> {
        (0..rows).map(|i| self.of(i, rows).as_str()).collect()
    }
}

impl std::fmt::Display for Actor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// One entry of the event log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    pub id: i64,
    /// Unix milliseconds.
    pub at: i64,
    pub change: Change,
}

/// An event with its columns as the log stores them, which say a little more than the
/// [`Change`] (the weight a released account had, the key a reweighted one keeps).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoggedEvent {
    pub event: Event,
    pub key_before: Option<HashKey>,
    pub key_after: Option<HashKey>,
    pub weight: Option<u64>,
    /// For `stream_put`: how many open shards the new map has. The map itself is the
    /// streams row while its `version` is this event's id; the log never holds a map.
    pub shard_count: Option<u64>,
    /// Who made the change.
    pub actor: Actor,
}

/// What an event did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// Every account event is about one of the account's keys, `index`.
    Allocate {
        account: AccountId,
        index: u32,
        key: HashKey,
        /// The key's share of the account's weight.
        weight: u64,
        /// For a key a fanout raised by load added: when producers start sending it (Unix
        /// milliseconds); until then they send over the account's other keys.
        switch_at: Option<i64>,
    },
    Release {
        account: AccountId,
        index: u32,
        key: HashKey,
    },
    /// Key `index` becomes `to` at once in the table, but producers keep sending `from`
    /// until `switch_at` (Unix milliseconds): until then the account holds both.
    Move {
        account: AccountId,
        index: u32,
        from: HashKey,
        to: HashKey,
        switch_at: i64,
        /// Why the move was made; `None` for moves logged before reasons were.
        reason: Option<MoveReason>,
    },
    /// The account's cap on a fanout raised by load; `None` clears it.
    MaxFanout {
        account: AccountId,
        max_fanout: Option<u32>,
    },
    Reweight {
        account: AccountId,
        index: u32,
        /// The key's new share of the account's weight.
        weight: u64,
    },
    StreamPut {
        stream: String,
    },
    StreamDelete {
        stream: String,
    },
}

/// Why a move was made: an admin's apply (or fanout change), the load controller, or the
/// rebalance that ends a reshard keyspread carried out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MoveReason {
    Admin,
    Load,
    Reshard,
}

impl MoveReason {
    pub fn as_str(self) -> &'static str {
        match self {
            MoveReason::Admin => "admin",
            MoveReason::Load => "load",
            MoveReason::Reshard => "reshard",
        }
    }

    fn parse(text: &str) -> Option<MoveReason> {
        match text {
            "admin" => Some(MoveReason::Admin),
            "load" => Some(MoveReason::Load),
            "reshard" => Some(MoveReason::Reshard),
            _ => None,
        }
    }
}

/// Errors of the storage layer. Their text is logged, never sent to clients.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("unsupported database URL {0:?}: expected sqlite://PATH or postgres://...")]
    UnsupportedUrl(String),
    #[error("the database URL {path:?} is a file path, not a URL: did you mean {suggestion}?")]
    BarePath { path: String, suggestion: String },
    #[error(
        "cannot open the SQLite database {file}: the directory {dir} does not exist (create it, \
         or choose another path)"
    )]
    MissingDirectory { file: String, dir: String },
    #[error("cannot connect to Postgres: {0}")]
    Unreachable(String),
    #[error(
        "the database URL's parameter `{0}` is not one the Postgres driver reads (it would be \
         ignored, and its value logged); it reads sslmode, sslrootcert, sslcert, sslkey, \
         host, hostaddr, port, dbname, user, password, application_name, options"
    )]
    UnreadParameter(String),
    /// Unreachable, or turning statements away for now (a lock or statement timeout).
    #[error("the database cannot take statements now: {0}")]
    Unavailable(sqlx::Error),
    #[error("a row with the same account or hash key already exists")]
    Conflict,
    #[error("the row changed underneath this write")]
    Stale,
    #[error("another writer logged events since this one last looked")]
    LogMoved,
    #[error("database holds a {stored}-bit keyspace but {configured} bits are configured")]
    KeyspaceMismatch { stored: u32, configured: u32 },
    #[error("reading the database failed: {0}")]
    Read(String),
    #[error("corrupt row: {0}")]
    Corrupt(String),
    #[error("migration failed: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    #[error("database error: {0}")]
    Database(sqlx::Error),
    /// A COMMIT was sent and its result can no longer be known (see `pg_commit`).
    #[error("the outcome of a commit is unknown: {0}")]
    OutcomeUnknown(String),
    /// The server takes no writes now: a standby, a demoted primary, read-only sessions.
    #[error("the database takes no writes now (read-only, or in recovery)")]
    ReadOnly,
}

/// The SQLite URL of `raw` when it looks like a bare file path (`/var/lib/k.db`, `k.db`):
/// `sqlite://` and the path as it is, so an absolute path gets three slashes and a
/// relative one two. Nothing that could be a mangled server URL (an `@`, a scheme) is
/// taken for a path: it might hold a password.
fn sqlite_url_for(raw: &str) -> Option<String> {
    if raw.is_empty() || raw.contains('@') || raw.contains("://") || url::Url::parse(raw).is_ok() {
        return None;
    }
    // sqlx decodes `%` escapes in the path and ends it at `?`.
    let path = raw
        .replace('%', "%25")
        .replace('?', "%3F")
        .replace('#', "%23");
    Some(format!("sqlite://{path}"))
}

/// Whether a statement that changes one given row found it: [`StoreError::Stale`] if not.
fn changed_one(rows_affected: u64) -> Result<()> {
    if rows_affected == 1 {
        Ok(())
    } else {
        Err(StoreError::Stale)
    }
}

impl From<sqlx::Error> for StoreError {
    /// Every statement's error passes here: one that met a Postgres server taking no
    /// writes retires the connections to it (see [`pg_writable`]).
    fn from(err: sqlx::Error) -> Self {
        pg_writable::note(&err);
        if pg_writable::read_only(&err) {
            return StoreError::ReadOnly;
        }
        match &err {
            sqlx::Error::Database(db)
                if db.is_unique_violation() || refused_pending_key(db.as_ref()) =>
            {
                StoreError::Conflict
            }
            sqlx::Error::Database(db) if turned_away(db.as_ref()) => StoreError::Unavailable(err),
            sqlx::Error::PoolTimedOut
            | sqlx::Error::PoolClosed
            | sqlx::Error::Io(_)
            | sqlx::Error::Tls(_)
            | sqlx::Error::WorkerCrashed => StoreError::Unavailable(err),
            _ => StoreError::Database(err),
        }
    }
}

/// Whether SQLite's trigger refused a key a staged move is switching away from (SQLite's
/// triggers can raise only SQLITE_CONSTRAINT_TRIGGER; Postgres' says unique violation).
fn refused_pending_key(db: &dyn sqlx::error::DatabaseError) -> bool {
    const SQLITE_CONSTRAINT_TRIGGER: &str = "1811";
    db.try_downcast_ref::<sqlx::sqlite::SqliteError>().is_some()
        && db.code().as_deref() == Some(SQLITE_CONSTRAINT_TRIGGER)
}

/// Whether the database turned a statement away for the moment rather than for what it
/// asked: a lock held past the lock (or busy) timeout, a timeout ending the statement or the session,
/// the server going down.
fn turned_away(db: &dyn sqlx::error::DatabaseError) -> bool {
    if let Some(pg) = db.try_downcast_ref::<sqlx::postgres::PgDatabaseError>() {
        postgres::turned_away(pg.code())
    } else {
        db.try_downcast_ref::<sqlx::sqlite::SqliteError>()
            .is_some_and(sqlite::turned_away)
    }
}

/// Longest a query waits for a connection from the pool: a database that cannot be reached
/// is reported (503) rather than waited for.
const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(3);

pub type Result<T, E = StoreError> = std::result::Result<T, E>;

pub use kept::Kept;

/// The database behind keyspread.
#[derive(Debug, Clone)]
pub enum Store {
    Sqlite(SqlitePools),
    Postgres(PgPool),
}

/// Why a change cannot commit now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unwritable {
    /// The database does not answer.
    Unreachable,
    /// The server takes no writes: its sessions are read-only (a demoted primary).
    ReadOnly,
    /// The server is a standby, replaying another's log.
    InRecovery,
    /// The SQLite file's disk is full, or failing.
    DiskFull,
}

impl Unwritable {
    /// Every reason, in the order metrics list them.
    pub const ALL: [Unwritable; 4] = [
        Unwritable::Unreachable,
        Unwritable::ReadOnly,
        Unwritable::InRecovery,
        Unwritable::DiskFull,
    ];

    /// The reason as a word, for answers and metric labels.
    pub fn as_str(self) -> &'static str {
        match self {
            Unwritable::Unreachable => "unreachable",
            Unwritable::ReadOnly => "read_only",
            Unwritable::InRecovery => "in_recovery",
            Unwritable::DiskFull => "disk_full",
        }
    }
}

/// Rows [`Tx::scan_assignments`] hands over at a time.
pub const SCAN_BATCH: usize = 16_384;

const KEY_COLUMNS: &str = "SELECT account, idx, hash_key, weight, created_at FROM assignments";

/// A write transaction holding the database's write lock; dropped without
/// [`Tx::commit`], it rolls back.
pub enum Tx {
    /// With the file's [`sqlite::Health`], which its statements and commit report to.
    Sqlite(sqlx::Transaction<'static, sqlx::Sqlite>, sqlite::Health),
    Postgres(pg_commit::PgTx),
}

/// Runs the same query function on whichever backend `$target` holds.
macro_rules! on_backend {
    ($target:expr, $conn:ident => $call:ident($($arg:expr),*)) => {
        match $target {
            Store::Sqlite(pools) => {
                let mut $conn = pools.reads.acquire().await?;
                sqlite::$call(&mut $conn, $($arg),*).await
            }
            Store::Postgres(pool) => {
                let mut $conn = pool.acquire().await?;
                postgres::$call(&mut $conn, $($arg),*).await
            }
        }
    };
}

/// The same for a transaction.
macro_rules! in_tx {
    ($tx:expr, $call:ident($($arg:expr),*)) => {
        match $tx {
            Tx::Sqlite(tx, health) => {
                let done = sqlite::$call(tx, $($arg),*).await;
                health.observe(&done);
                done
            }
            Tx::Postgres(tx) => postgres::$call(tx, $($arg),*).await,
        }
    };
}

// After the macros, which they use.
mod log;
mod reshard;
mod retention;

impl Store {
    /// Opens the database at `url` (a SQLite file is created if missing) and migrates it.
    pub async fn connect(url: &str) -> Result<Store> {
        if url.starts_with("sqlite:") {
            Ok(Store::Sqlite(sqlite::connect(url).await?))
        } else if url.starts_with("postgres:") || url.starts_with("postgresql:") {
            if let Some(name) = crate::config::unread_parameter(url) {
                return Err(StoreError::UnreadParameter(name));
            }
            Ok(Store::Postgres(postgres::connect(url).await?))
        } else if let Some(suggestion) = sqlite_url_for(url) {
            Err(StoreError::BarePath {
                path: url.to_owned(),
                suggestion,
            })
        } else {
            Err(StoreError::UnsupportedUrl(crate::config::redact_url(url)))
        }
    }

    /// Binds the database to a keyspace width on first use; refuses a different one later.
    pub async fn bind_keyspace(&self, bits: u32) -> Result<()> {
        on_backend!(self, c => bind_keyspace(bits))
    }

    /// Every registered stream.
    pub async fn load_streams(&self) -> Result<Vec<StreamRow>> {
        on_backend!(self, c => load_streams())
    }

    /// What the last listing from Kinesis found, for every stream ever listed there, by name.
    pub async fn sync_states(&self) -> Result<Vec<(String, SyncState)>> {
        on_backend!(self, c => sync_states())
    }

    /// Up to `limit` events after `after`, oldest first.
    pub async fn events_after(&self, after: i64, limit: i64) -> Result<Vec<Event>> {
        Ok(events(self.log(after, limit).await?))
    }

    /// Up to `limit` events after `after` with the columns the log stores, oldest first.
    pub async fn log(&self, after: i64, limit: i64) -> Result<Vec<LoggedEvent>> {
        on_backend!(self, c => events_after(after, limit))
    }

    /// Id of the newest event, 0 when there is none.
    pub async fn last_event_id(&self) -> Result<i64> {
        on_backend!(self, c => last_event_id())
    }

    /// Up to `limit` assignments with account greater than `after`, by account, holding
    /// at most `max_keys` keys in all (at least one account's worth: 1,024 or more); the
    /// flag says whether the key bound ended the list before `limit` accounts.
    pub async fn list(
        &self,
        after: Option<&str>,
        limit: u32,
        max_keys: u32,
    ) -> Result<(Vec<Assignment>, bool)> {
        let rows = on_backend!(self, c => list(after, limit, max_keys + 1))?;
        list_page(rows, max_keys)
    }

    /// Up to `limit` moves still pending at `now` (Unix milliseconds) with event id above
    /// `after`, by event id.
    pub async fn moves(&self, after: i64, now: i64, limit: i64) -> Result<Vec<PendingMove>> {
        on_backend!(self, c => moves(after, now, limit))
    }

    /// Longest a change is waited for before its client is answered 503, or `None` when
    /// every wait ends by itself: a local SQLite file never goes silent, and its busy
    /// timeout ends the wait for another process's lock.
    pub fn change_timeout(&self) -> Option<Duration> {
        match self {
            Store::Sqlite(_) => None,
            Store::Postgres(_) => Some(postgres::CHANGE_TIMEOUT),
        }
    }

    /// The newest migration this keyspread knows for its backend: a database migrated
    /// further belongs to a newer release, and this one must not write to it.
    pub fn known_schema(&self) -> i64 {
        let migrator = match self {
            Store::Sqlite(_) => sqlite::migrator(),
            Store::Postgres(_) => postgres::migrator(),
        };
        migrator.iter().map(|m| m.version).max().unwrap_or(0)
    }

    /// The newest migration the database has run.
    pub async fn schema_version(&self) -> Result<i64> {
        on_backend!(self, c => schema_version())
    }

    /// The database's clock (Unix milliseconds), as [`Tx::clock_ms`] reads it.
    pub async fn clock_ms(&self) -> Result<i64> {
        on_backend!(self, c => clock_ms())
    }

    /// Round-trips the database.
    pub async fn ping(&self) -> Result<()> {
        on_backend!(self, c => ping())
    }

    /// Whether a change can commit now. On SQLite, after a write met a full disk or an I/O
    /// error, a write is tried here, so the answer comes back by itself once space is
    /// freed; on Postgres, the server must be a primary that takes writes.
    pub async fn writable(&self) -> Result<(), Unwritable> {
        match self {
            Store::Sqlite(pools) => sqlite::writable(pools).await.map_err(|_| {
                if pools.health.failing().is_some() {
                    Unwritable::DiskFull
                } else {
                    Unwritable::Unreachable
                }
            }),
            Store::Postgres(pool) => postgres::writable(pool).await,
        }
    }

    /// Inserts new keys and logs `allocate` for each, as [`Tx::insert_many`] does, in
    /// a write transaction of its own, provided the log is still `seen` (the same log,
    /// ending at the same event); otherwise fails with [`StoreError::LogMoved`] and changes
    /// nothing. Answers the event ids in the order of `new`. On Postgres this is one round
    /// trip.
    pub async fn insert_if_current(
        &self,
        seen: LogEnd,
        new: &[KeyRow],
        by: Actors<'_>,
        at: i64,
    ) -> Result<Vec<i64>> {
        match self {
            Store::Sqlite(_) => {
                let mut tx = self.begin().await?;
                if tx.log_end().await? != seen {
                    return Err(StoreError::LogMoved);
                }
                let ids = tx.insert_many(new, by, at).await?;
                tx.commit().await?;
                Ok(ids)
            }
            Store::Postgres(pool) => postgres::insert_if_current(pool, seen, new, by, at).await,
        }
    }

    /// Starts a read-only transaction over one consistent state of the database, taking
    /// no lock: start-up reads a large table this way while other replicas keep writing.
    /// Writers commit one at a time in event-id order, so the state holds exactly the
    /// events up to its newest.
    pub async fn snapshot(&self) -> Result<Tx> {
        Ok(match self {
            // What a read meets says nothing of whether the file takes writes.
            Store::Sqlite(pools) => {
                Tx::Sqlite(sqlite::snapshot(pools).await?, sqlite::Health::default())
            }
            Store::Postgres(pool) => Tx::Postgres(postgres::snapshot(pool).await?),
        })
    }

    /// Starts a transaction for changing `stream`'s leases and workers: lease changes of
    /// one stream take turns (on Postgres apart from other writes).
    pub async fn begin_leases(&self, stream: &str) -> Result<Tx> {
        Ok(match self {
            Store::Sqlite(pools) => {
                let tx = sqlite::begin_leases(pools, stream).await;
                pools.health.observe(&tx);
                Tx::Sqlite(tx?, pools.health.clone())
            }
            Store::Postgres(pool) => Tx::Postgres(postgres::begin_leases(pool, stream).await?),
        })
    }

    /// A stream's lease rows and workers, read together (one snapshot), and the
    /// database's clock (Unix milliseconds) to tell live workers by.
    pub async fn lease_view(&self, stream: &str) -> Result<(Vec<LeaseRow>, Vec<WorkerRow>, i64)> {
        let mut tx = self.snapshot().await?;
        let leases = tx.leases(stream).await?;
        let workers = tx.lease_workers(stream).await?;
        let now = tx.clock_ms().await?;
        Ok((leases, workers, now))
    }

    /// Starts a write transaction; it waits for writers in other processes to finish.
    pub async fn begin(&self) -> Result<Tx> {
        Ok(match self {
            Store::Sqlite(pools) => {
                let tx = sqlite::begin(pools).await;
                pools.health.observe(&tx);
                Tx::Sqlite(tx?, pools.health.clone())
            }
            Store::Postgres(pool) => Tx::Postgres(postgres::begin(pool).await?),
        })
    }
}

impl Tx {
    /// The database's clock (Unix milliseconds), read inside this transaction: every
    /// decision that frees a key or takes a lease away is made by it, so replicas whose
    /// own clocks disagree never disagree about who holds what.
    pub async fn clock_ms(&mut self) -> Result<i64> {
        in_tx!(self, clock_ms())
    }

    /// The newest migration the database has run, read inside this transaction.
    pub async fn schema_version(&mut self) -> Result<i64> {
        in_tx!(self, schema_version())
    }

    /// Events other writers committed after `after`: read under the write lock, so
    /// nothing can be missed before this transaction's own changes.
    pub async fn events_after(&mut self, after: i64) -> Result<Vec<Event>> {
        Ok(events(in_tx!(self, events_after(after, i64::MAX))?))
    }

    pub async fn load_streams(&mut self) -> Result<Vec<StreamRow>> {
        in_tx!(self, load_streams())
    }

    /// Hands every key row to `each`, [`SCAN_BATCH`] at a time, for rebuilding the
    /// tree; stops early when `each` answers false. Rows come in no particular order.
    pub async fn scan_assignments(&mut self, each: impl FnMut(Vec<KeyRow>) -> bool) -> Result<()> {
        in_tx!(self, scan_assignments(each))
    }

    /// How many key rows there are.
    pub async fn count_assignments(&mut self) -> Result<i64> {
        in_tx!(self, count_assignments())
    }

    /// How many accounts hold keys.
    pub async fn count_accounts(&mut self) -> Result<i64> {
        in_tx!(self, count_accounts())
    }

    /// [`Store::list`], read in this transaction.
    pub async fn list(
        &mut self,
        after: Option<&str>,
        limit: u32,
        max_keys: u32,
    ) -> Result<(Vec<Assignment>, bool)> {
        let rows = match self {
            // A snapshot reads a million accounts this way: stepped on the connection, not
            // handed over row by row (see `raw_sqlite`).
            Tx::Sqlite(tx, health) => {
                let done = sqlite::list_stepped(tx, after, limit, max_keys + 1).await;
                health.observe(&done);
                done
            }
            Tx::Postgres(tx) => postgres::list(tx, after, limit, max_keys + 1).await,
        }?;
        list_page(rows, max_keys)
    }

    /// Inserts new keys and logs `allocate` for each; answers the event ids in the order
    /// of `new`.
    pub async fn insert_many(
        &mut self,
        new: &[KeyRow],
        by: Actors<'_>,
        at: i64,
    ) -> Result<Vec<i64>> {
        in_tx!(self, insert_many(new, by, at))
    }

    /// Deletes keys, each stored as given, and logs `release` for each; answers the event
    /// ids in order, or [`StoreError::Stale`] if a row had changed.
    pub async fn delete_many(
        &mut self,
        gone: &[KeyRow],
        by: Actors<'_>,
        at: i64,
    ) -> Result<Vec<i64>> {
        in_tx!(self, delete_many(gone, by, at))
    }

    /// Sets each key's weight to the one given and logs `reweight` for each; answers the
    /// event ids in order.
    pub async fn reweight(&mut self, rows: &[KeyRow], by: &Actor, at: i64) -> Result<Vec<i64>> {
        in_tx!(self, reweight(rows, by, at))
    }

    /// Applies moves in order, each switching at `switch_at` (Unix milliseconds), with a
    /// `move` event each; answers the events' ids.
    pub async fn apply_moves(
        &mut self,
        moves: &[Move],
        by: &Actor,
        at: i64,
        switch_at: i64,
        reason: MoveReason,
    ) -> Result<Vec<i64>> {
        in_tx!(self, apply_moves(moves, by, at, switch_at, reason))
    }

    /// Makes the new keys `(account, index, allocate event id)` take over at `switch_at`
    /// (Unix milliseconds): until then producers send over the account's other keys.
    pub async fn stage_new_keys(
        &mut self,
        staged: &[(&str, u32, i64)],
        switch_at: i64,
    ) -> Result<()> {
        in_tx!(self, stage_new_keys(staged, switch_at))
    }

    /// Sets (or with `None` clears) `account`'s cap on a fanout raised by load and logs a
    /// `max_fanout` event; answers its id, or [`StoreError::Stale`] if the account has no
    /// key 0.
    pub async fn set_max_fanout(
        &mut self,
        account: &str,
        max_fanout: Option<u32>,
        by: &Actor,
        at: i64,
    ) -> Result<i64> {
        in_tx!(self, set_max_fanout(account, max_fanout, by, at))
    }

    /// Claims the load controller's next round on `stream` at `now` (the database's clock,
    /// Unix milliseconds) if the last was claimed at least `interval_ms` before: true when
    /// this transaction took it, the round's number (one replica per round; a second waits
    /// for the first's commit and then finds the round taken).
    pub async fn claim_round(
        &mut self,
        stream: &str,
        now: i64,
        interval_ms: i64,
    ) -> Result<Option<i64>> {
        in_tx!(self, claim_round(stream, now, interval_ms))
    }

    /// The accounts with several keys that opted in to fanouts by load and were cold at
    /// the controller's last round, with since when (Unix milliseconds).
    pub async fn fanout_cold(&mut self) -> Result<Vec<(String, i64)>> {
        in_tx!(self, fanout_cold())
    }

    /// Replaces the cold accounts with `rows` (few: those that opted in and hold several
    /// keys).
    pub async fn set_fanout_cold(&mut self, rows: &[(String, i64)]) -> Result<()> {
        in_tx!(self, set_fanout_cold(rows))
    }

    /// The accounts the load controller moved at or after `since` (Unix milliseconds).
    pub async fn moved_by_load_since(&mut self, since: i64) -> Result<Vec<String>> {
        in_tx!(self, moved_by_load_since(since))
    }

    /// Every account that set a cap on its fanout, with the cap.
    pub async fn max_fanouts(&mut self) -> Result<Vec<(AccountId, u32)>> {
        in_tx!(self, max_fanouts())
    }

    /// Every move still pending at `now` (Unix milliseconds), by event id.
    pub async fn pending_moves(&mut self, now: i64) -> Result<Vec<PendingMove>> {
        in_tx!(self, moves(0, now, i64::MAX))
    }

    /// Creates or replaces a stream (clearing any other primary if this one is) and logs
    /// `stream_put`; answers the event id.
    pub async fn put_stream(&mut self, stream: &StreamRow, by: &Actor) -> Result<i64> {
        in_tx!(self, put_stream(stream, by))
    }

    /// Claims the next listing of watched stream `name` from Kinesis at `now` (the
    /// database's clock, Unix ms) if the last was claimed at least `interval_ms` before
    /// (a back-off may have claimed ahead), and no reshard of it runs (its job lists it):
    /// true when this transaction took it.
    pub async fn claim_sync(&mut self, name: &str, now: i64, interval_ms: i64) -> Result<bool> {
        in_tx!(self, claim_sync(name, now, interval_ms))
    }

    /// Records that stream `name` was listed from Kinesis at `at`.
    pub async fn synced(&mut self, name: &str, at: i64) -> Result<()> {
        in_tx!(self, synced(name, at))
    }

    /// Records why listing stream `name` failed, and whether Kinesis throttled it: answers
    /// how many listings in a row it has throttled (0 when it did not).
    pub async fn sync_failed(&mut self, name: &str, error: &str, throttled: bool) -> Result<i64> {
        in_tx!(self, sync_failed(name, error, throttled))
    }

    /// Holds the next listing of stream `name` until `until` (Unix ms): a back-off.
    pub async fn defer_sync(&mut self, name: &str, until: i64) -> Result<()> {
        in_tx!(self, defer_sync(name, until))
    }

    /// Deletes a stream and logs `stream_delete`; answers the event id.
    pub async fn delete_stream(&mut self, name: &str, by: &Actor, at: i64) -> Result<i64> {
        in_tx!(self, delete_stream(name, by, at))
    }

    /// Takes `stream`'s lease lock (see [`Store::begin_leases`]) until the transaction ends.
    pub async fn lease_lock(&mut self, stream: &str) -> Result<()> {
        in_tx!(self, lease_lock(stream))
    }

    pub async fn lease_workers(&mut self, stream: &str) -> Result<Vec<WorkerRow>> {
        in_tx!(self, lease_workers(stream))
    }

    /// Sets a worker's time to live and expiry; whether it was in the group.
    pub async fn touch_worker(&mut self, stream: &str, worker: &WorkerRow) -> Result<bool> {
        in_tx!(self, touch_worker(stream, worker))
    }

    pub async fn insert_worker(&mut self, stream: &str, worker: &WorkerRow, at: i64) -> Result<()> {
        in_tx!(self, insert_worker(stream, worker, at))
    }

    /// How many workers `stream`'s group has (live or not yet found expired).
    pub async fn count_workers(&mut self, stream: &str) -> Result<i64> {
        in_tx!(self, count_workers(stream))
    }

    /// The `version` of stream `name`'s map as committed, if it is registered: one row.
    pub async fn stream_version(&mut self, name: &str) -> Result<Option<i64>> {
        in_tx!(self, stream_version(name))
    }

    /// Stream `name`'s row as committed, if it is registered.
    pub async fn load_stream(&mut self, name: &str) -> Result<Option<StreamRow>> {
        in_tx!(self, load_stream(name))
    }

    /// Whether the worker was in the group.
    pub async fn delete_worker(&mut self, stream: &str, worker: &str) -> Result<bool> {
        in_tx!(self, delete_worker(stream, worker))
    }

    /// Whether some worker of `stream` expired at or before `now`, without a scan.
    pub async fn any_expired(&mut self, stream: &str, now: i64) -> Result<bool> {
        in_tx!(self, any_expired(stream, now))
    }

    pub async fn leases(&mut self, stream: &str) -> Result<Vec<LeaseRow>> {
        in_tx!(self, leases(stream))
    }

    /// The leases `worker` owns, without a scan.
    pub async fn owned_leases(&mut self, stream: &str, worker: &str) -> Result<Vec<LeaseRow>> {
        in_tx!(self, owned_leases(stream, worker))
    }

    pub async fn lease(&mut self, stream: &str, shard_id: &str) -> Result<Option<LeaseRow>> {
        in_tx!(self, lease(stream, shard_id))
    }

    pub async fn put_lease(&mut self, stream: &str, lease: &LeaseRow) -> Result<()> {
        in_tx!(self, put_lease(stream, lease))
    }

    pub async fn delete_lease(&mut self, stream: &str, shard_id: &str) -> Result<()> {
        in_tx!(self, delete_lease(stream, shard_id))
    }

    pub async fn lease_group(&mut self, stream: &str) -> Result<Option<LeaseGroup>> {
        in_tx!(self, lease_group(stream))
    }

    pub async fn put_lease_group(&mut self, stream: &str, group: &LeaseGroup) -> Result<()> {
        in_tx!(self, put_lease_group(stream, group))
    }

    /// Forgets `stream`'s workers, leases and checkpoints.
    pub async fn delete_lease_group(&mut self, stream: &str) -> Result<()> {
        in_tx!(self, delete_lease_group(stream))
    }

    /// Makes the changes durable (and, on Postgres, tells the other replicas).
    pub async fn commit(self) -> Result<()> {
        match self {
            Tx::Sqlite(tx, health) => {
                let done = sqlite::commit(tx).await;
                health.observe(&done);
                if done.is_ok() {
                    health.committed();
                }
                done
            }
            Tx::Postgres(tx) => postgres::commit(tx).await,
        }
    }
}

fn events(logged: Vec<LoggedEvent>) -> Vec<Event> {
    logged.into_iter().map(|l| l.event).collect()
}

/// Decodes a 16-byte big-endian key column.
fn decode_key(bytes: &[u8]) -> Result<HashKey> {
    let bytes: [u8; 16] = bytes
        .try_into()
        .map_err(|_| StoreError::Corrupt(format!("hash key of {} bytes", bytes.len())))?;
    Ok(HashKey::from_be_bytes(bytes))
}

fn decode_account(account: String) -> Result<AccountId> {
    AccountId::parse(account).map_err(|e| StoreError::Corrupt(e.to_string()))
}

fn decode_weight(weight: i64) -> Result<u64> {
    u64::try_from(weight).map_err(|_| StoreError::Corrupt(format!("weight {weight}")))
}

/// A page of [`Tx::list`]: the key rows of the first `$2` accounts after `$1`, by account and
/// index, at most `$3` rows, with the columns [`listed`] decodes.
const LIST_PAGE: &str = "SELECT account, idx, hash_key, weight, created_at, prev_hash_key, switch_at, \
     max_fanout FROM assignments WHERE account IN \
     (SELECT account FROM assignments WHERE account > $1 AND idx = 0 ORDER BY account LIMIT $2) \
     ORDER BY account, idx LIMIT $3";

/// A listed key row with the switch of a staged move that set it (past or pending; a
/// `switch_at` with no old key is a key a fanout raise added, taking over then), and key
/// 0's cap on the account's fanout, if it set one.
fn listed(
    row: KeyRow,
    from: Option<&[u8]>,
    switch_at: Option<i64>,
    cap: Option<i64>,
) -> Result<(KeyRow, Option<Switch>, Option<u32>)> {
    let switch = match switch_at {
        Some(switch_at) => Some(Switch {
            index: row.index,
            from: from.map(decode_key).transpose()?,
            switch_at,
        }),
        None => None,
    };
    let cap = cap
        .map(|c| {
            u32::try_from(c).map_err(|_| {
                StoreError::Corrupt(format!("account {}: max_fanout {c}", row.account))
            })
        })
        .transpose()?;
    Ok((row, switch, cap))
}

fn decode_row(
    account: String,
    index: i64,
    key: &[u8],
    weight: i64,
    created_at: i64,
) -> Result<KeyRow> {
    Ok(KeyRow {
        index: u32::try_from(index)
            .map_err(|_| StoreError::Corrupt(format!("account {account}: key index {index}")))?,
        account: decode_account(account)?,
        hash_key: decode_key(key)?,
        weight: decode_weight(weight)?,
        created_at,
    })
}

/// An `events` row as stored, before decoding.
#[derive(Debug, sqlx::FromRow)]
struct EventRow {
    id: i64,
    at: i64,
    kind: String,
    account: Option<String>,
    key_before: Option<Vec<u8>>,
    key_after: Option<Vec<u8>>,
    weight: Option<i64>,
    stream: Option<String>,
    shard_count: Option<i64>,
    idx: i64,
    switch_at: Option<i64>,
    reason: Option<String>,
    max_fanout: Option<i64>,
    actor: String,
}

impl EventRow {
    /// The change the row records, with the columns it stores.
    fn decode(self) -> Result<LoggedEvent> {
        let EventRow {
            id,
            at,
            kind,
            account,
            key_before,
            key_after,
            weight,
            stream,
            shard_count,
            idx,
            switch_at,
            reason,
            max_fanout,
            actor,
        } = self;
        let index = u32::try_from(idx)
            .map_err(|_| StoreError::Corrupt(format!("event {id}: key index {idx}")))?;
        let corrupt = || StoreError::Corrupt(format!("event {id} ({kind}) lacks a column"));
        let some_key = |k: Option<HashKey>| k.ok_or_else(corrupt);
        let key = |k: &Option<Vec<u8>>| k.as_deref().map(decode_key).transpose();
        let (key_before, key_after) = (key(&key_before)?, key(&key_after)?);
        let weight = weight.map(decode_weight).transpose()?;
        let shard_count = shard_count
            .map(|n| {
                u64::try_from(n).map_err(|_| StoreError::Corrupt(format!("event {id}: {n} shards")))
            })
            .transpose()?;
        let account = || account.clone().ok_or_else(corrupt).and_then(decode_account);
        let some_weight = || weight.ok_or_else(corrupt);
        let change = match kind.as_str() {
            "allocate" => Change::Allocate {
                account: account()?,
                index,
                key: some_key(key_after)?,
                weight: some_weight()?,
                switch_at,
            },
            "release" => Change::Release {
                account: account()?,
                index,
                key: some_key(key_before)?,
            },
            "move" => Change::Move {
                account: account()?,
                index,
                from: some_key(key_before)?,
                to: some_key(key_after)?,
                // Moves logged before they were staged switched at once.
                switch_at: switch_at.unwrap_or(at),
                reason: match reason {
                    None => None,
                    Some(r) => Some(MoveReason::parse(&r).ok_or_else(|| {
                        StoreError::Corrupt(format!("event {id}: move reason {r:?}"))
                    })?),
                },
            },
            "max_fanout" => Change::MaxFanout {
                account: account()?,
                max_fanout: max_fanout
                    .map(|n| {
                        u32::try_from(n)
                            .map_err(|_| StoreError::Corrupt(format!("event {id}: max_fanout {n}")))
                    })
                    .transpose()?,
            },
            "reweight" => Change::Reweight {
                account: account()?,
                index,
                weight: some_weight()?,
            },
            "stream_put" => Change::StreamPut {
                stream: stream.clone().ok_or_else(corrupt)?,
            },
            "stream_delete" => Change::StreamDelete {
                stream: stream.clone().ok_or_else(corrupt)?,
            },
            other => {
                return Err(StoreError::Corrupt(format!(
                    "event {id} of unknown kind {other:?}"
                )));
            }
        };
        Ok(LoggedEvent {
            event: Event { id, at, change },
            key_before,
            key_after,
            weight,
            shard_count,
            actor: Actor::new(&actor),
        })
    }
}

/// The stored form of a shard map: `[[id, start, end], ...]` with keys as decimal strings.
fn encode_shards(shards: &[(String, HashKey, HashKey)]) -> String {
    serde_json::to_string(shards).expect("shards serialize")
}

fn decode_shards(name: &str, json: &str) -> Result<Vec<(String, HashKey, HashKey)>> {
    serde_json::from_str(json).map_err(|e| StoreError::Corrupt(format!("stream {name}: {e}")))
}

/// The stored form of every listed shard: `[{"id", "start", "end", "parents"?, "closed"?}]`.
fn encode_listed(listed: &Option<Vec<LeaseShard>>) -> Option<String> {
    listed
        .as_ref()
        .map(|l| serde_json::to_string(l).expect("shards serialize"))
}

fn decode_listed(name: &str, json: Option<String>) -> Result<Option<Vec<LeaseShard>>> {
    json.map(|json| {
        serde_json::from_str(&json)
            .map_err(|e| StoreError::Corrupt(format!("stream {name}, listed shards: {e}")))
    })
    .transpose()
}

#[cfg(test)]
mod tests {
    use super::Actor;

    #[test]
    fn the_servers_own_actors_are_names_no_token_may_take() {
        for own in [
            Actor::LOOPBACK,
            Actor::CONTROLLER,
            Actor::IMPORT,
            Actor::CONFIG,
            Actor::UNRECORDED,
            Actor::KINESIS,
        ] {
            assert!(Actor::RESERVED.contains(&own), "{own}");
            assert!(crate::config::check_name(own).is_err(), "{own}");
        }
    }

    use super::sqlite_url_for;

    #[test]
    fn a_bare_path_is_answered_with_its_sqlite_url() {
        assert_eq!(
            sqlite_url_for("/tmp/x.db").as_deref(),
            Some("sqlite:///tmp/x.db")
        );
        assert_eq!(sqlite_url_for("x.db").as_deref(), Some("sqlite://x.db"));
        assert_eq!(
            sqlite_url_for("data/a?b.db").as_deref(),
            Some("sqlite://data/a%3Fb.db")
        );
        assert_eq!(sqlite_url_for("user:secret@db/k"), None);
        assert_eq!(sqlite_url_for("mysql://h/k"), None);
    }
}
