//! The authoritative table of assignments and its event log.
//!
//! One `Store` type with one implementation per backend; the in-memory tree is only a
//! cache of what is committed here.

mod sqlite;

use crate::keyspace::{AccountId, HashKey, Move};

pub use sqlite::SqliteStore;

/// One account's hash key, as committed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Assignment {
    pub account: AccountId,
    pub hash_key: HashKey,
    pub weight: u64,
    /// Unix milliseconds.
    pub created_at: i64,
}

/// Errors of the storage layer. Their text is logged, never sent to clients.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("unsupported database URL {0:?}: expected sqlite://PATH")]
    UnsupportedUrl(String),
    #[error("a row with the same account or hash key already exists")]
    Conflict,
    #[error("the row changed underneath this write")]
    Stale,
    #[error("database holds a {stored}-bit keyspace but {configured} bits are configured")]
    KeyspaceMismatch { stored: u32, configured: u32 },
    #[error("corrupt row: {0}")]
    Corrupt(String),
    #[error("migration failed: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    #[error("database error: {0}")]
    Database(sqlx::Error),
}

impl From<sqlx::Error> for StoreError {
    fn from(err: sqlx::Error) -> Self {
        match &err {
            sqlx::Error::Database(db) if db.is_unique_violation() => StoreError::Conflict,
            _ => StoreError::Database(err),
        }
    }
}

pub type Result<T, E = StoreError> = std::result::Result<T, E>;

/// The database behind keyspread.
#[derive(Debug, Clone)]
pub enum Store {
    Sqlite(SqliteStore),
}

impl Store {
    /// Opens (creating if needed) the database at `url` and runs its migrations.
    pub async fn connect(url: &str) -> Result<Store> {
        if url.starts_with("sqlite:") {
            Ok(Store::Sqlite(SqliteStore::connect(url).await?))
        } else {
            Err(StoreError::UnsupportedUrl(url.to_owned()))
        }
    }

    /// Binds the database to a keyspace width on first use; refuses a different one later.
    pub async fn bind_keyspace(&self, bits: u32) -> Result<()> {
        match self {
            Store::Sqlite(s) => s.bind_keyspace(bits).await,
        }
    }

    /// Every assignment, for rebuilding the tree.
    pub async fn load(&self) -> Result<Vec<Assignment>> {
        match self {
            Store::Sqlite(s) => s.load().await,
        }
    }

    /// Id of the newest event, 0 when there is none.
    pub async fn last_event_id(&self) -> Result<i64> {
        match self {
            Store::Sqlite(s) => s.last_event_id().await,
        }
    }

    /// Commits a new assignment and its `allocate` event; answers the event id.
    pub async fn insert(&self, assignment: &Assignment, at: i64) -> Result<i64> {
        match self {
            Store::Sqlite(s) => s.insert(assignment, at).await,
        }
    }

    /// Deletes an assignment and logs `release`; answers the event id.
    pub async fn delete(&self, assignment: &Assignment, at: i64) -> Result<i64> {
        match self {
            Store::Sqlite(s) => s.delete(assignment, at).await,
        }
    }

    /// Changes an assignment's weight and logs `reweight`; answers the event id.
    pub async fn reweight(&self, assignment: &Assignment, at: i64) -> Result<i64> {
        match self {
            Store::Sqlite(s) => s.reweight(assignment, at).await,
        }
    }

    /// Applies moves in order, in one transaction, with a `move` event each; answers the
    /// id of the last event.
    pub async fn apply_moves(&self, moves: &[Move], at: i64) -> Result<i64> {
        match self {
            Store::Sqlite(s) => s.apply_moves(moves, at).await,
        }
    }

    /// Up to `limit` assignments with account greater than `after`, by account.
    pub async fn list(&self, after: Option<&str>, limit: u32) -> Result<Vec<Assignment>> {
        match self {
            Store::Sqlite(s) => s.list(after, limit).await,
        }
    }

    /// Round-trips the database.
    pub async fn ping(&self) -> Result<()> {
        match self {
            Store::Sqlite(s) => s.ping().await,
        }
    }
}

/// Decodes a 16-byte big-endian key column.
fn decode_key(bytes: &[u8]) -> Result<HashKey> {
    let bytes: [u8; 16] = bytes
        .try_into()
        .map_err(|_| StoreError::Corrupt(format!("hash key of {} bytes", bytes.len())))?;
    Ok(HashKey::from_be_bytes(bytes))
}

fn decode_assignment(
    account: String,
    key: &[u8],
    weight: i64,
    created_at: i64,
) -> Result<Assignment> {
    Ok(Assignment {
        account: AccountId::parse(account).map_err(|e| StoreError::Corrupt(e.to_string()))?,
        hash_key: decode_key(key)?,
        weight: u64::try_from(weight)
            .map_err(|_| StoreError::Corrupt(format!("weight {weight}")))?,
        created_at,
    })
}
