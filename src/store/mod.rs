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

    /// Every registered stream.
    pub async fn load_streams(&self) -> Result<Vec<StreamRow>> {
        match self {
            Store::Sqlite(s) => s.load_streams().await,
        }
    }

    /// Creates or replaces a stream (clearing any other primary if this one is); logs
    /// `stream_put`; answers the event id.
    pub async fn put_stream(&self, stream: &StreamRow) -> Result<i64> {
        match self {
            Store::Sqlite(s) => s.put_stream(stream).await,
        }
    }

    /// Deletes a stream and logs `stream_delete`; answers the event id.
    pub async fn delete_stream(&self, name: &str, at: i64) -> Result<i64> {
        match self {
            Store::Sqlite(s) => s.delete_stream(name, at).await,
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

/// The stored form of a shard map: `[[id, start, end], ...]` with keys as decimal strings.
fn encode_shards(shards: &[(String, HashKey, HashKey)]) -> String {
    serde_json::to_string(shards).expect("shards serialize")
}

fn decode_shards(name: &str, json: &str) -> Result<Vec<(String, HashKey, HashKey)>> {
    serde_json::from_str(json).map_err(|e| StoreError::Corrupt(format!("stream {name}: {e}")))
}
