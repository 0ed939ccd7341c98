//! The log's name: which history an event id belongs to.
//!
//! Event ids only grow within one log. A database created afresh (an import's target), or
//! one rewound under its readers (an older copy of a SQLite file, a point-in-time restore),
//! may hand the same ids to other events, so every position is read with the log's name.

use super::{LoggedEvent, Result, Store, StoreError, Tx, postgres, sqlite};

/// A log's name: a random UUID drawn when the database is created, and again when a
/// replica finds the log rewound.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct LogId(uuid::Uuid);

impl LogId {
    /// A name no log has had.
    pub fn fresh() -> LogId {
        LogId(uuid::Uuid::new_v4())
    }

    /// The name as the `meta` table stores it.
    pub fn parse(text: &str) -> Result<LogId> {
        uuid::Uuid::parse_str(text)
            .map(LogId)
            .map_err(|_| StoreError::Corrupt(format!("log_id {text:?}")))
    }
}

impl std::fmt::Display for LogId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.hyphenated().fmt(f)
    }
}

/// Where a log is: its name and its newest event id (0 while it has none).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogEnd {
    pub log_id: LogId,
    pub end: i64,
}

impl LogEnd {
    /// The `(log_id, MAX(id))` row the query answers.
    pub(super) fn decode(log_id: Option<String>, end: i64) -> Result<LogEnd> {
        let log_id = log_id.ok_or_else(|| StoreError::Corrupt("no log_id in meta".into()))?;
        Ok(LogEnd {
            log_id: LogId::parse(&log_id)?,
            end,
        })
    }
}

impl Store {
    /// The log's name and newest event id, read together.
    pub async fn log_end(&self) -> Result<LogEnd> {
        on_backend!(self, c => log_end())
    }
}

impl Tx {
    /// The log's name and newest event id, as this transaction sees them.
    pub async fn log_end(&mut self) -> Result<LogEnd> {
        in_tx!(self, log_end())
    }

    /// Up to `limit` events after `after` with the columns the log stores, oldest first.
    pub async fn log(&mut self, after: i64, limit: i64) -> Result<Vec<LoggedEvent>> {
        in_tx!(self, events_after(after, limit))
    }

    /// Gives log `from` the name `to`, unless another writer renamed it first; answers the
    /// log's name now (one replica's rename wins, the others adopt it).
    pub async fn rename_log(&mut self, from: LogId, to: LogId) -> Result<LogId> {
        let now = in_tx!(self, rename_log(&from.to_string(), &to.to_string()))?;
        LogId::parse(&now)
    }
}
