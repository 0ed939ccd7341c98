//! A bounded event log: compaction in the background, and a replica that compaction left
//! behind starting again from the table.
//!
//! As with etcd's compaction, the log keeps a horizon: events at or below it may be gone.
//! It is raised before anything is dropped, and readers check it after reading, so a
//! reader below it learns that it is (`GET /events` answers 410; a follower reloads)
//! rather than skipping events silently.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{Error, Registry, Table, Writer};
use crate::config::EventRetention;
use crate::store::Compaction;

/// Most events one statement of a compaction drops: a SQLite write lock is held for
/// milliseconds, and a Postgres statement locks few rows.
const DROP_BATCH: i64 = 5_000;

/// Slack for clocks: a staged move's event stays this long past its switch, so that a
/// replica whose clock trails the database's still finds it in `GET /moves`.
const SWITCH_SLACK_MS: i64 = 60_000;

/// What one compaction did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Compacted {
    /// Events dropped.
    pub dropped: u64,
    /// The horizon after it: events at or below it may be gone.
    pub horizon: i64,
}

impl Registry {
    /// Compacts the event log by `retention` every `interval` until the process ends
    /// (nothing when it is off). Moves made for load within `cooldown_ms` stay, since the
    /// controller's cooldown reads them. Every replica may run it: its steps are
    /// idempotent, and the horizon only rises.
    pub fn retain(
        self: &Arc<Self>,
        retention: EventRetention,
        interval: Duration,
        cooldown_ms: i64,
    ) -> Option<tokio::task::JoinHandle<()>> {
        let EventRetention::Keep { max_age_ms, keep } = retention else {
            return None;
        };
        let keep = i64::try_from(keep).unwrap_or(i64::MAX);
        let this = Arc::clone(self);
        Some(tokio::spawn(async move {
            let mut ticks = tokio::time::interval(interval);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                ticks.tick().await;
                if let Err(err) = this.compact(max_age_ms, keep, cooldown_ms).await {
                    tracing::warn!(%err, "cannot compact the event log; trying again later");
                }
            }
        }))
    }

    /// Drops the events older than `max_age_ms` with more than `keep` newer ones after
    /// them, in batches, after raising the horizon over them; never the newest event, the
    /// events of staged moves still pending (`GET /moves` and start-up read them), nor
    /// moves made for load within `cooldown_ms`.
    pub async fn compact(
        &self,
        max_age_ms: i64,
        keep: i64,
        cooldown_ms: i64,
    ) -> Result<Compacted, Error> {
        let started = Instant::now();
        let now = self.store.clock_ms().await?;
        let bound = self
            .store
            .compaction_bound(keep, now.saturating_sub(max_age_ms))
            .await?;
        let mut horizon = self.store.event_horizon().await?;
        if bound > horizon {
            self.store.raise_event_horizon(bound).await?;
            horizon = bound;
        }
        if horizon == 0 {
            return Ok(Compacted {
                dropped: 0,
                horizon,
            });
        }
        let step = Compaction {
            through: horizon,
            pending_after: now - SWITCH_SLACK_MS,
            cooldown_from: now - cooldown_ms,
            batch: DROP_BATCH,
        };
        let mut dropped = 0;
        loop {
            let gone = self.store.drop_events(step).await?;
            dropped += gone;
            if gone < DROP_BATCH as u64 {
                break;
            }
            // Writers get the lock between batches.
            tokio::task::yield_now().await;
        }
        self.count_compacted(dropped, horizon);
        if dropped > 0 {
            tracing::info!(
                dropped,
                horizon,
                elapsed_ms = started.elapsed().as_millis() as u64,
                "compacted the event log: readers of GET /events after an id below the horizon must start again from GET /snapshot"
            );
        }
        Ok(Compacted { dropped, horizon })
    }

    /// Starts again from the table: a replica whose position in the log is below the
    /// horizon cannot apply what was dropped (nor one whose log is not the database's any
    /// more: `why` says which), so it reads everything, as at start-up, and follows the log
    /// from the newest event on.
    pub(super) async fn reload(&self, w: &mut Writer, why: &str) -> Result<(), Error> {
        let started = Instant::now();
        let from = w.last_event;
        let Table {
            alloc,
            accounts,
            log,
            last_event,
            last_at,
            streams,
            schema,
        } = Table::load(&self.store, self.keyspace).await?;
        w.alloc = alloc;
        w.log = log;
        w.last_event = last_event;
        w.last_at = last_at;
        // Long-polls wait for ids of this log from now on, whether above the old ones or not.
        self.applied.send_modify(|head| {
            head.log = log;
            head.event = last_event;
        });
        *self.accounts.write().expect("accounts lock poisoned") = accounts;
        *self.md5_cache.lock().expect("md5 cache lock poisoned") = None;
        self.note_schema(schema);
        self.reload_streams(w, streams)?;
        self.count_applied(w, last_event);
        self.count_reload();
        tracing::warn!(
            from,
            to = last_event,
            %log,
            elapsed_ms = started.elapsed().as_millis() as u64,
            "{why}: reloaded the whole table"
        );
        Ok(())
    }
}

/// Whether ids in `events`, read after `position`, skip any, so that compaction may have
/// dropped some of them: then the horizon, read after them, tells. (On Postgres a
/// rolled-back write skips ids too.)
pub(super) fn gapped(position: i64, ids: impl IntoIterator<Item = i64>) -> bool {
    let mut before = position;
    for id in ids {
        if id != before + 1 {
            return true;
        }
        before = id;
    }
    false
}

#[cfg(test)]
mod tests {
    use super::gapped;

    #[test]
    fn ids_that_follow_on_from_the_position_skip_nothing() {
        assert!(!gapped(7, []));
        assert!(!gapped(7, [8, 9, 10]));
        assert!(gapped(7, [9, 10]), "the first id skips 8");
        assert!(gapped(7, [8, 10]), "a kept event, then a skip");
        assert!(gapped(0, [1, 2, 40]));
    }
}
