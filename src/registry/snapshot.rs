//! The whole table as of one event, read page by page in one read transaction: what a
//! producer's mirror starts from before it follows the log.

use super::{Error, Registry};
use crate::store::{Assignment, LogEnd, LogId, Store, Tx};

/// Accounts a page holds at most.
const PAGE_ACCOUNTS: u32 = 1000;
/// Keys a page holds at most (an account has up to 1,024).
const PAGE_KEYS: u32 = 16_384;

/// The table as of event `event_id`: `accounts` assignments, read by
/// [`Snapshot::next_page`] in account order. Holds a read transaction (and on SQLite a
/// read connection) until dropped; writers do not wait on it.
pub struct Snapshot {
    /// The log the table comes from, and its newest event the table holds: follow that log
    /// from after it.
    pub log_id: LogId,
    pub event_id: i64,
    /// How many accounts the pages hold together.
    pub accounts: i64,
    /// The primary stream as of the same state, if one is registered.
    pub stream: Option<String>,
    tx: Tx,
    after: Option<String>,
    done: bool,
}

impl Snapshot {
    /// The next page of assignments, by account; `None` once every one was read.
    pub async fn next_page(&mut self) -> Result<Option<Vec<Assignment>>, Error> {
        if self.done {
            return Ok(None);
        }
        let (page, cut) = (self.tx)
            .list(self.after.as_deref(), PAGE_ACCOUNTS, PAGE_KEYS)
            .await?;
        self.done = !cut && page.len() < PAGE_ACCOUNTS as usize;
        match page.last() {
            Some(last) => self.after = Some(last.account.as_str().to_owned()),
            None => self.done = true,
        }
        Ok((!page.is_empty()).then_some(page))
    }
}

impl Snapshot {
    /// Starts a snapshot of `store`'s committed table: one consistent state of the database
    /// (every event up to its newest). `keyspread export` reads a database this way without
    /// a registry of its own.
    pub async fn of(store: &Store) -> Result<Snapshot, Error> {
        let mut tx = store.snapshot().await?;
        let LogEnd {
            log_id,
            end: event_id,
        } = tx.log_end().await?;
        let accounts = tx.count_accounts().await?;
        let streams = tx.load_streams().await?;
        let stream = (streams.into_iter()).find(|s| s.primary).map(|s| s.name);
        Ok(Snapshot {
            log_id,
            event_id,
            accounts,
            stream,
            tx,
            after: None,
            done: false,
        })
    }
}

impl Registry {
    /// Starts a [`Snapshot`] of the committed table: one consistent state of the database
    /// (every event up to its newest), whatever replica answers.
    pub async fn snapshot(&self) -> Result<Snapshot, Error> {
        Snapshot::of(&self.store).await
    }
}
