//! Watched streams: Kinesis is their map's source. Every `--stream-sync-interval-s` one
//! replica (the database decides which) lists each again and registers what changed,
//! logged as `kinesis`. Nothing here runs on a lookup's path: Kinesis is called with no
//! lock held, and only the registration that follows takes the writer's lock.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::{Committed, Error, Registry, Source, StreamChange, StreamMap, Ticket};
use crate::keyspace::Keyspace;
use crate::kinesis::{KinesisError, KinesisLink, StreamStatus};
use crate::metrics::{escape, header};
use crate::store::{Actor, KinesisStream, SyncState};

/// The longest a throttled stream's next listing is held back.
const MAX_BACKOFF_MS: i64 = 600_000;
/// Streams whose syncs `/metrics` counts by name, at most: its labels stay bounded.
const MAX_COUNTED: usize = 1000;

/// Where watched streams' maps come from, how often they are listed again, and what those
/// listings did.
#[derive(Debug)]
pub struct Watch {
    link: Arc<KinesisLink>,
    interval: Duration,
    /// With `--auto-rebalance`: a changed primary map is rebalanced, its moves staged to
    /// switch this long after.
    rebalance_after_ms: Option<i64>,
    counts: Mutex<BTreeMap<String, SyncCounts>>,
}

/// One stream's listings by this process.
#[derive(Debug, Default, Clone, Copy)]
struct SyncCounts {
    syncs: u64,
    changes: u64,
    errors: u64,
}

/// A counter of [`SyncCounts`]: its name, its help, and its value.
type Series = (&'static str, &'static str, fn(&SyncCounts) -> u64);

/// What one listing of a stream did.
#[derive(Debug)]
enum Synced {
    Unchanged,
    Changed(Box<StreamChange>),
    Failed(KinesisError),
}

impl Watch {
    /// Streams listed through `link` every `interval`; with `rebalance_after_ms`
    /// (`--auto-rebalance`), a changed primary map is rebalanced too.
    pub fn new(
        link: Arc<KinesisLink>,
        interval: Duration,
        rebalance_after_ms: Option<i64>,
    ) -> Watch {
        Watch {
            link,
            interval,
            rebalance_after_ms,
            counts: Mutex::default(),
        }
    }

    /// Stream `name` as Kinesis has it now: which stream it is, and its map (ListShards,
    /// every page, closed parents included). A stream being created or deleted has none.
    pub async fn list(
        &self,
        name: &str,
        keyspace: Keyspace,
    ) -> Result<(KinesisStream, StreamMap), KinesisError> {
        let kinesis = self.link.client().await?;
        let summary = kinesis.summary(name).await?;
        match summary.status {
            StreamStatus::Active | StreamStatus::Updating => {}
            StreamStatus::Creating => {
                return Err(KinesisError::InUse(format!(
                    "stream {name} is still being created in Kinesis"
                )));
            }
            StreamStatus::Deleting => {
                return Err(KinesisError::NotFound(format!(
                    "stream {name} is being deleted in Kinesis"
                )));
            }
        }
        let listing = kinesis.list_shards(name, keyspace).await?;
        let stream = KinesisStream {
            arn: summary.arn,
            created_at_ms: summary.created_at_ms,
        };
        Ok((stream, listing.map))
    }

    fn count(&self, name: &str, synced: &Synced) {
        let mut counts = self.counts.lock().expect("sync counts lock poisoned");
        if counts.len() >= MAX_COUNTED && !counts.contains_key(name) {
            return;
        }
        let c = counts.entry(name.to_owned()).or_default();
        c.syncs += 1;
        match synced {
            Synced::Unchanged => {}
            Synced::Changed(_) => c.changes += 1,
            Synced::Failed(_) => c.errors += 1,
        }
    }

    /// The sync counters in the Prometheus text format, by stream.
    pub fn render_metrics(&self, out: &mut String) {
        use std::fmt::Write as _;
        let counts = self.counts.lock().expect("sync counts lock poisoned");
        let series: [Series; 3] = [
            (
                "keyspread_stream_syncs_total",
                "Listings of a watched stream from Kinesis this process made, by stream.",
                |c| c.syncs,
            ),
            (
                "keyspread_stream_sync_changes_total",
                "Listings that found a watched stream's map changed and registered it.",
                |c| c.changes,
            ),
            (
                "keyspread_stream_sync_errors_total",
                "Listings of a watched stream that failed (throttled, deleted, unreachable).",
                |c| c.errors,
            ),
        ];
        for (name, help, value) in series {
            header(out, name, "counter", help);
            for (stream, c) in counts.iter() {
                let _ = writeln!(out, "{name}{{stream=\"{}\"}} {}", escape(stream), value(c));
            }
        }
    }
}

impl Registry {
    /// Lists every watched stream again each interval, until the process ends.
    pub fn sync_streams(self: &Arc<Self>, watch: Arc<Watch>) -> tokio::task::JoinHandle<()> {
        let this = Arc::downgrade(self);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(watch.interval);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let Some(this) = this.upgrade() else {
                    return;
                };
                this.sync_round(&watch).await;
            }
        })
    }

    /// One round: what other replicas' listings found, then each watched stream whose
    /// listing this replica claims. A stream being resharded is not claimed: its job lists
    /// and registers it (listed here, a map of the way there would be registered and
    /// rebalanced).
    async fn sync_round(self: &Arc<Self>, watch: &Watch) {
        match self.store.sync_states().await {
            Ok(states) => {
                for (name, sync) in states {
                    self.note_sync(&name, sync);
                }
            }
            Err(err) => tracing::debug!(%err, "cannot read the watched streams' sync states"),
        }
        let (streams, _) = self.streams(None, usize::MAX);
        for stream in streams.into_iter().filter(|s| s.watch) {
            match self.claim_sync(&stream.name, watch).await {
                Ok(Some(claimed)) => {
                    (self.sync_stream(stream.name, stream.primary, claimed, watch)).await
                }
                Ok(None) => {}
                Err(err) => {
                    tracing::warn!(stream = %stream.name, %err, "cannot claim a stream's listing")
                }
            }
        }
    }

    /// Whether this replica takes stream `name`'s listing this interval: if so, the
    /// version of the stream's map it then found.
    async fn claim_sync(&self, name: &str, watch: &Watch) -> Result<Option<i64>, Error> {
        let interval_ms = watch.interval.as_millis() as i64;
        let mut w = self.writer.lock().await;
        let (mut tx, at) = self.begin(&mut w).await?;
        // A little before the interval is up, so that ticks a few milliseconds early by the
        // database's clock still find their round (as the controller's rounds do).
        if !tx.claim_sync(name, at, interval_ms * 9 / 10).await? {
            return Ok(None);
        }
        let claimed = self.stream(name).map(|s| s.version);
        self.commit(&mut w, tx, Committed::Stream, &[]).await?;
        Ok(claimed)
    }

    /// Lists stream `name`, whose map was at version `claimed`, and registers what changed;
    /// a failure is recorded on the stream (its last map stays), and throttling holds the
    /// next listing back, longer each time.
    async fn sync_stream(
        self: &Arc<Self>,
        name: String,
        primary: bool,
        claimed: i64,
        watch: &Watch,
    ) {
        let synced = match watch.list(&name, self.keyspace).await {
            Ok((kinesis, map)) => match self.register_listing(&name, kinesis, claimed, map).await {
                Some(synced) => synced,
                None => return,
            },
            Err(err) => Synced::Failed(err),
        };
        watch.count(&name, &synced);
        match synced {
            Synced::Unchanged => {
                tracing::debug!(stream = %name, "watched stream listed: unchanged")
            }
            Synced::Changed(change) => {
                let shards = change.stream.map.len();
                tracing::info!(stream = %name, shards, "watched stream listed: its map changed in Kinesis and is registered");
                if primary && let Some(after_ms) = watch.rebalance_after_ms {
                    self.rebalance_synced(&name, *change, after_ms).await;
                }
            }
            Synced::Failed(err) => {
                tracing::warn!(stream = %name, kind = err.kind(), %err, "cannot list a watched stream: it keeps its last map");
                if let Err(failed) = self.sync_failed(&name, &err, watch).await {
                    tracing::warn!(stream = %name, err = %failed, "cannot record a failed listing");
                }
            }
        }
    }

    /// Registers a listing of watched stream `name` claimed at version `claimed`: `None`
    /// when it was not (the watch stopped, the stream was forgotten, registered again or
    /// taken by a reshard meanwhile, or the registration failed, logged).
    async fn register_listing(
        self: &Arc<Self>,
        name: &str,
        kinesis: KinesisStream,
        claimed: i64,
        map: StreamMap,
    ) -> Option<Synced> {
        let source = Source::Synced { kinesis, claimed };
        let by = Actor::new(Actor::KINESIS);
        let unbounded = Ticket::unbounded();
        let change = self.register(name.to_owned(), Some(map), None, source, &by, &unbounded);
        match change.await {
            Ok(Some(change)) => Some(Synced::Changed(Box::new(change))),
            Ok(None) => Some(Synced::Unchanged),
            Err(Error::NotWatched(_) | Error::UnknownStream(_)) => None,
            Err(Error::Overtaken(_)) => {
                tracing::debug!(stream = %name, "a watched stream's listing was overtaken: the next lists it again");
                None
            }
            Err(err) => {
                tracing::warn!(stream = %name, %err, "cannot register a watched stream's listing");
                None
            }
        }
    }

    /// Applies the rebalance a changed primary map calls for, staged, logged as Kinesis'.
    async fn rebalance_synced(self: &Arc<Self>, name: &str, change: StreamChange, after_ms: i64) {
        let (plan_id, plan) = change.rebalance;
        if plan.moves.is_empty() {
            return;
        }
        let by = Actor::new(Actor::KINESIS);
        match self
            .apply(plan_id, after_ms, true, &by, &Ticket::unbounded())
            .await
        {
            Ok(applied) => {
                tracing::info!(stream = %name, moves = applied.plan.moves().len(), "the primary stream's new map is rebalanced, staged")
            }
            Err(err) => {
                tracing::warn!(stream = %name, %err, "cannot rebalance the primary stream's new map")
            }
        }
    }

    /// Records why listing `name` failed; throttled, holds its next listing back, doubling
    /// with each throttled listing in a row up to [`MAX_BACKOFF_MS`].
    async fn sync_failed(
        &self,
        name: &str,
        err: &KinesisError,
        watch: &Watch,
    ) -> Result<(), Error> {
        let said = match err {
            KinesisError::NotFound(_) => format!("{err} (the stream keeps its last map)"),
            _ => err.to_string(),
        };
        let throttled = matches!(err, KinesisError::Throttled(_));
        let mut w = self.writer.lock().await;
        let (mut tx, at) = self.begin(&mut w).await?;
        let in_a_row = tx.sync_failed(name, &said, throttled).await?;
        if throttled {
            let interval_ms = watch.interval.as_millis() as i64;
            let shift = in_a_row.clamp(1, 20) as u32 - 1;
            let backoff = interval_ms.saturating_mul(1 << shift).min(MAX_BACKOFF_MS);
            tracing::info!(stream = %name, backoff_ms = backoff, "Kinesis throttles the listing: the next waits longer");
            tx.defer_sync(name, at + backoff).await?;
        }
        self.commit(&mut w, tx, Committed::Stream, &[]).await?;
        let synced_at = self.stream(name).and_then(|s| s.sync.synced_at);
        self.note_sync(
            name,
            SyncState {
                synced_at,
                sync_error: Some(said),
            },
        );
        Ok(())
    }

    /// Memory's record of what the last listing of `name` found.
    pub(super) fn note_sync(&self, name: &str, sync: SyncState) {
        let mut streams = self.streams.write().expect("streams lock poisoned");
        if let Some(stream) = streams.get_mut(name) {
            stream.sync = sync;
        }
    }
}
