//! Compacting the event log: its horizon, and dropping old events in small batches.

use super::{Result, Store, Tx, postgres, sqlite};

/// Runs a write statement outside any transaction: on SQLite's writing pool.
macro_rules! on_write {
    ($target:expr, $conn:ident => $call:ident($($arg:expr),*)) => {
        match $target {
            Store::Sqlite(pools) => {
                let mut $conn = pools.writes.acquire().await?;
                let done = sqlite::$call(&mut $conn, $($arg),*).await;
                pools.health.observe(&done);
                done
            }
            Store::Postgres(pool) => {
                let mut $conn = pool.acquire().await?;
                postgres::$call(&mut $conn, $($arg),*).await
            }
        }
    };
}

/// What one compaction step may drop and must keep.
#[derive(Debug, Clone, Copy)]
pub struct Compaction {
    /// Drop only events at or below this id (see [`Store::compaction_bound`]).
    pub through: i64,
    /// Keep the events of staged moves pending after this time (Unix ms).
    pub pending_after: i64,
    /// Keep moves made for load at or after this time (Unix ms).
    pub cooldown_from: i64,
    /// Most events one statement drops.
    pub batch: i64,
}

impl Store {
    /// The event log's horizon: events at or below it may have been dropped, so a reader
    /// positioned below it cannot read on (0: nothing was ever dropped).
    pub async fn event_horizon(&self) -> Result<i64> {
        on_backend!(self, c => event_horizon())
    }

    /// The newest event id a compaction keeping the newest `keep` events and every event
    /// logged at or after `cutoff` (Unix ms) may drop through; never the newest event.
    pub async fn compaction_bound(&self, keep: i64, cutoff: i64) -> Result<i64> {
        on_backend!(self, c => compaction_bound(keep, cutoff))
    }

    /// Raises the horizon to `through`, before any event at or below it is dropped: a
    /// reader that finds the horizon below its position after reading has missed nothing.
    pub async fn raise_event_horizon(&self, through: i64) -> Result<()> {
        on_write!(self, c => raise_event_horizon(through))
    }

    /// Drops one batch of events as `step` says, in a statement of its own (a SQLite
    /// write lock held for one batch only; on Postgres, no writer waits for it). Answers
    /// how many went.
    pub async fn drop_events(&self, step: Compaction) -> Result<u64> {
        let Compaction {
            through,
            pending_after,
            cooldown_from,
            batch,
        } = step;
        on_write!(self, c => drop_events(through, pending_after, cooldown_from, batch))
    }

    /// How many events the log holds.
    pub async fn count_events(&self) -> Result<i64> {
        on_backend!(self, c => count_events())
    }
}

impl Tx {
    /// The event log's horizon, read inside this transaction.
    pub async fn event_horizon(&mut self) -> Result<i64> {
        in_tx!(self, event_horizon())
    }
}
