//! The log by name: pages of it for readers, each with the name of the log it belongs to,
//! and a replica noticing that the database holds another log than the one its memory was
//! built from.

use super::{Error, Registry, Writer, retention};
use crate::store::{LogCheck, LogEnd, LogId, LogRead, LoggedEvent, Tx};

/// Events of the log, read with the log's name in one consistent state of the database.
#[derive(Debug)]
pub struct LogPage {
    pub log_id: LogId,
    pub events: Vec<LoggedEvent>,
}

/// How the database's log stands to the one a replica's memory follows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Found {
    /// The same log, at or past memory's position.
    Same,
    /// Another log: a database created afresh (an import), restored from a backup, or
    /// renamed by another replica.
    Other,
    /// The same name, but it ends before the events memory applied: rewound (an older
    /// copy of a SQLite file; on Postgres a point-in-time restore).
    Rewound,
    /// The same name, and it reaches past memory's position, but the newest event memory
    /// applied is not there as it was applied: the history lost it and others were
    /// written since, under its id or (Postgres' sequences skip the values a standby never
    /// heard were used) past it. On Postgres a promotion after asynchronous replication,
    /// where the new primary never received what the old one acknowledged last.
    Diverged,
}

/// How the database's log, as `check` found it, stands to memory at `w`.
pub(super) fn found(w: &Writer, check: LogCheck) -> Found {
    let LogCheck {
        end,
        horizon,
        applied_at,
    } = check;
    if end.log_id != w.log {
        Found::Other
    } else if end.end < w.last_event {
        Found::Rewound
    } else if w.last_event > horizon && applied_at != Some(w.last_at) {
        // (At or below the horizon, the event may have been compacted away: a replica that
        // far behind reads the table again anyway, see `retention`.)
        Found::Diverged
    } else {
        Found::Same
    }
}

impl Registry {
    /// Up to `limit` events after `after`, waiting up to `wait` for one when there is none
    /// yet: it answers as soon as this server has applied one (its own change, or one its
    /// follower read), or empty when `wait` passes or the server starts draining (the page
    /// read first: nothing after `after` in that state of the log).
    pub async fn wait_for_events(
        &self,
        after: i64,
        limit: u32,
        wait: std::time::Duration,
    ) -> Result<LogPage, Error> {
        // Watching before the read: an event applied in between is not missed.
        let mut applied = self.applied.subscribe();
        let page = self.read_log(after, limit).await?;
        if !page.events.is_empty() || wait.is_zero() {
            return Ok(page);
        }
        let woken = async {
            let head = applied.wait_for(|a| a.event > after || a.draining).await;
            head.is_ok_and(|a| !a.draining)
        };
        if tokio::time::timeout(wait, woken).await == Ok(true) {
            self.read_log(after, limit).await
        } else {
            Ok(page)
        }
    }

    /// Up to `limit` events after `after` and the log's name, read in one consistent state.
    /// Refused with [`Error::PastEnd`] when `after` is past the log's newest event (a
    /// position in another history: only the database's end decides, not what this replica
    /// has applied), and with [`Error::Compacted`] when events after `after` may have been
    /// dropped: the horizon is raised before any is dropped, so a page that passed some by
    /// is never answered. (An empty page passed none by: the newest event is never dropped.)
    async fn read_log(&self, after: i64, limit: u32) -> Result<LogPage, Error> {
        let LogRead {
            end: LogEnd { log_id, end },
            horizon,
            events,
        } = self.store.read_log(after, i64::from(limit)).await?;
        if after > end {
            return Err(Error::PastEnd { after, end, log_id });
        }
        // Ids that follow on from `after` with no gap skipped nothing.
        if retention::gapped(after, events.iter().map(|l| l.event.id)) && after < horizon {
            return Err(Error::Compacted {
                after,
                horizon,
                log_id,
            });
        }
        Ok(LogPage { log_id, events })
    }

    /// Makes memory follow the database's log again when `found` (read in `tx`, a write
    /// transaction) says it does not: a rewound log first gets a new name, committed in
    /// `tx`, so that every reader of it (other replicas, mirrors) starts again from a
    /// snapshot; then the whole table is read again. Only the first replica's new name
    /// sticks; the others read it.
    pub(super) async fn follow_anew(
        &self,
        w: &mut Writer,
        mut tx: Tx,
        found: Found,
    ) -> Result<(), Error> {
        let (lost, why) = match found {
            Found::Same => return Ok(()),
            Found::Other => {
                let why = "the database holds another log than the one this replica followed";
                return self.reload(w, why).await;
            }
            Found::Rewound => (
                "the event log ends before events this replica applied (an older copy of the database, or a restore)",
                "the event log was rewound",
            ),
            Found::Diverged => (
                "the event log lacks an event this replica applied, as it was applied (a promotion that lost what the old primary acknowledged, or a restore)",
                "the event log lost events this replica applied",
            ),
        };
        let named = tx.rename_log(w.log, LogId::fresh()).await?;
        tx.commit().await?;
        tracing::warn!(
            applied = w.last_event,
            was = %w.log,
            now = %named,
            "{lost}: it is a new log now, and its readers start again from a snapshot"
        );
        self.reload(w, why).await
    }
}
