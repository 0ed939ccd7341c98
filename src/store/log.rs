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

/// Where a log is, and whether it still holds, as it was, the newest event a replica
/// applied: a history that lost events (a promotion after asynchronous replication, a
/// restore) may have given their ids to others since, and then its end alone says nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogCheck {
    pub end: LogEnd,
    /// Events at or below it may have been compacted away.
    pub horizon: i64,
    /// When the log says the event the replica applied last was logged (its `at`); none
    /// when the log does not hold it (compacted, or lost).
    pub applied_at: Option<i64>,
}

/// Events of the log after some id, as one state of the database held them with the log's
/// name, its end and its horizon (events at or below it may be gone).
#[derive(Debug)]
pub struct LogRead {
    pub end: LogEnd,
    pub horizon: i64,
    pub events: Vec<LoggedEvent>,
}

/// The page of [`Store::read_log`]: the head on every row, and one row (of NULL events)
/// when no event follows `$1`.
pub(super) const LOG_PAGE: &str = "SELECT h.log_id, h.log_end, h.horizon, e.id, e.at, e.kind, \
     e.account, e.key_before, e.key_after, e.weight, e.stream, e.shard_count, e.idx, e.switch_at, \
     e.reason, e.max_fanout, e.actor \
     FROM (SELECT (SELECT value FROM meta WHERE name = 'log_id') AS log_id, \
     (SELECT COALESCE(MAX(id), 0) FROM events) AS log_end, \
     (SELECT value FROM meta WHERE name = 'event_horizon') AS horizon) h \
     LEFT JOIN (SELECT id, at, kind, account, key_before, key_after, weight, stream, shard_count, \
     idx, switch_at, reason, max_fanout, actor FROM events WHERE id > $1 ORDER BY id LIMIT $2) e \
     ON TRUE ORDER BY e.id";

/// The horizon as the `meta` table stores it (none: 0, nothing was dropped).
pub(super) fn decode_horizon(stored: Option<String>) -> Result<i64> {
    stored.map_or(Ok(0), |v| {
        v.parse()
            .map_err(|_| StoreError::Corrupt(format!("event_horizon {v:?}")))
    })
}

impl Store {
    /// The log's name and newest event id, read together.
    pub async fn log_end(&self) -> Result<LogEnd> {
        on_backend!(self, c => log_end())
    }

    /// The log's name and end, and when it says event `applied` was logged, all read in
    /// one statement.
    pub async fn log_check(&self, applied: i64) -> Result<LogCheck> {
        on_backend!(self, c => log_check(applied))
    }

    /// Up to `limit` events after `after`, oldest first, with the log's name, end and
    /// horizon, all read in one statement.
    pub async fn read_log(&self, after: i64, limit: i64) -> Result<LogRead> {
        on_backend!(self, c => log_page(after, limit))
    }
}

impl Tx {
    /// The log's name and newest event id, as this transaction sees them.
    pub async fn log_end(&mut self) -> Result<LogEnd> {
        in_tx!(self, log_end())
    }

    /// [`Store::log_check`], as this transaction sees the log.
    pub async fn log_check(&mut self, applied: i64) -> Result<LogCheck> {
        in_tx!(self, log_check(applied))
    }

    /// When event `id` was logged, if the log holds it, as this transaction sees it.
    pub async fn event_at(&mut self, id: i64) -> Result<Option<i64>> {
        in_tx!(self, event_at(id))
    }

    /// Gives log `from` the name `to`, unless another writer renamed it first; answers the
    /// log's name now (one replica's rename wins, the others adopt it).
    pub async fn rename_log(&mut self, from: LogId, to: LogId) -> Result<LogId> {
        let now = in_tx!(self, rename_log(&from.to_string(), &to.to_string()))?;
        LogId::parse(&now)
    }
}
