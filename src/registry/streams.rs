//! Registered streams: their shard maps, and the primary one new keys balance on.

use std::sync::Arc;

use super::rebalance::plan_id;
use super::{Committed, Error, MapSpec, Registry, Ticket, Writer, detached};
use crate::keyspace::lease_state::LeaseShard;
use crate::keyspace::{self, Keyspace, Load, Plan, ShardMap, SplitPlan};
use crate::store::{Actor, Change, Event, KinesisStream, StreamRow, SyncState, Tx};

/// The map a stream registers: what `PUT /streams/{name}` takes.
#[derive(Debug)]
pub struct StreamMap {
    pub map: ShardMap,
    /// Every shard consumers read, closed ones and parents included; none for a uniform map.
    pub lease_shards: Option<Vec<LeaseShard>>,
    /// The number Kinesis will give the stream's next new shard.
    pub next_shard: u64,
}

/// A registered stream.
#[derive(Debug, Clone)]
pub struct Stream {
    pub name: String,
    pub map: Arc<ShardMap>,
    /// One past the highest shard number the stream ever used.
    pub next_shard: u64,
    pub primary: bool,
    /// Unix milliseconds.
    pub updated_at: i64,
    /// Id of the `stream_put` event that registered this map.
    pub version: i64,
    /// Whether the ranges are a uniform map's (known once here: listing many streams must
    /// not walk every map).
    pub uniform: bool,
    /// The shards consumers read: every shard list-shards named, closed ones and parents
    /// included, or the open shards when the map was given as a shard count.
    pub lease_shards: Arc<[LeaseShard]>,
    /// Whether `lease_shards` came from list-shards output.
    pub listed: bool,
    /// Whether Kinesis is the map's source (listed again every sync interval).
    pub watch: bool,
    /// The stream Kinesis last answered under this name, if it was ever listed there.
    pub kinesis: Option<KinesisStream>,
    /// What the last listing from Kinesis found.
    pub sync: SyncState,
}

/// Where a map being registered comes from, and what that does to the stream's watch.
#[derive(Debug, Clone)]
pub enum Source {
    /// keyspread itself (a reshard's end): the stream's watch stays as it is.
    Kept,
    /// A client: refused while Kinesis is the stream's source.
    Given,
    /// A client that stops the watch: Kinesis is no longer the map's source.
    Unwatched,
    /// Listed from Kinesis at a client's request: watched from now on.
    Watched(KinesisStream),
    /// Listed from Kinesis by the watch, claimed when the stream's map was at `claimed`
    /// (its version): registered only while the stream is watched, no reshard of it runs,
    /// and its map is still that one (a listing overtaken by another is left for the next).
    Synced {
        kinesis: KinesisStream,
        claimed: i64,
    },
    /// Listed from Kinesis by the stream's reshard job: registered while it is watched.
    Resharding(KinesisStream),
}

impl Source {
    /// Whether the map was listed from Kinesis just now.
    fn listed(&self) -> bool {
        matches!(
            self,
            Source::Watched(_) | Source::Synced { .. } | Source::Resharding(_)
        )
    }

    /// Who the log says made the change: Kinesis for a listing, else the client.
    fn actor<'a>(&self, client: &'a Actor) -> std::borrow::Cow<'a, Actor> {
        if self.listed() {
            std::borrow::Cow::Owned(Actor::new(Actor::KINESIS))
        } else {
            std::borrow::Cow::Borrowed(client)
        }
    }
}

/// What registering a map from a [`Source`] does to the stream's watch.
#[derive(Debug)]
struct Watching {
    watch: bool,
    /// The Kinesis stream the name stands for afterwards.
    kinesis: Option<KinesisStream>,
    /// Whether the listing found another stream under the name than the last did.
    recreated: bool,
}

/// What registering a stream's map did to balance.
#[derive(Debug, Clone)]
pub struct StreamChange {
    pub stream: Stream,
    /// Per-shard loads on the map it replaced; `None` for a new stream.
    pub before: Option<(Arc<ShardMap>, Vec<Load>)>,
    /// Per-shard loads on the new map.
    pub after: Vec<Load>,
    /// The plan that would restore ceil(accounts / shards) on the new map (not applied).
    pub rebalance: (String, Plan),
}

impl Stream {
    pub(super) fn from_row(row: StreamRow, keyspace: Keyspace) -> Result<Stream, Error> {
        let map = ShardMap::explicit(keyspace, row.shards)?;
        let listed = row.listed.is_some();
        let lease_shards = match row.listed {
            Some(listed) => listed.into(),
            None => map
                .iter()
                .map(|s| LeaseShard {
                    id: s.id,
                    start: s.start,
                    end: s.end,
                    parents: Vec::new(),
                    closed: false,
                })
                .collect(),
        };
        Ok(Stream {
            lease_shards,
            listed,
            name: row.name,
            uniform: map.is_uniform(),
            map: Arc::new(map),
            next_shard: row.next_shard,
            primary: row.primary,
            updated_at: row.updated_at,
            version: row.version,
            watch: row.watch,
            kinesis: row.kinesis,
            sync: row.sync,
        })
    }

    fn to_row(&self) -> StreamRow {
        StreamRow {
            name: self.name.clone(),
            shards: self.map.iter().map(|s| (s.id, s.start, s.end)).collect(),
            next_shard: self.next_shard,
            primary: self.primary,
            updated_at: self.updated_at,
            version: self.version,
            listed: self.listed.then(|| self.lease_shards.to_vec()),
            watch: self.watch,
            kinesis: self.kinesis.clone(),
            sync: self.sync.clone(),
        }
    }

    /// The map as registered, to register again.
    fn stream_map(&self) -> StreamMap {
        StreamMap {
            map: (*self.map).clone(),
            lease_shards: self.listed.then(|| self.lease_shards.to_vec()),
            next_shard: self.next_shard,
        }
    }

    /// Whether `map` is the map registered: the same open shards, the same shards listed,
    /// the same next shard number.
    fn holds(&self, map: &StreamMap) -> bool {
        *self.map == map.map
            && self.next_shard == map.next_shard
            && map.lease_shards.as_deref() == self.listed.then_some(&*self.lease_shards)
    }

    /// The shard consumers know as `id`, if the stream lists it.
    pub fn lease_shard(&self, id: &str) -> Option<&LeaseShard> {
        self.lease_shards.iter().find(|s| s.id == id)
    }
}

impl Registry {
    /// Up to `limit` registered streams named after `after`, by name, and whether more
    /// follow.
    pub fn streams(&self, after: Option<&str>, limit: usize) -> (Vec<Stream>, bool) {
        use std::ops::Bound;
        let from = after.map_or(Bound::Unbounded, Bound::Excluded);
        let streams = self.streams.read().expect("streams lock poisoned");
        let mut named = streams.range::<str, _>((from, Bound::Unbounded));
        let page = named.by_ref().take(limit).map(|(_, s)| s.clone()).collect();
        (page, named.next().is_some())
    }

    pub fn stream(&self, name: &str) -> Option<Stream> {
        self.streams
            .read()
            .expect("streams lock poisoned")
            .get(name)
            .cloned()
    }

    /// The primary stream, the one new keys balance on, if one is registered.
    pub fn primary_stream(&self) -> Option<Stream> {
        let streams = self.streams.read().expect("streams lock poisoned");
        streams.values().find(|s| s.primary).cloned()
    }

    /// Registers or replaces `name`'s map. `primary: None` keeps the stream's current role
    /// (or makes it primary if configuration named it so); the stream's watch stays as it
    /// is.
    pub async fn put_stream(
        self: &Arc<Self>,
        name: String,
        map: StreamMap,
        primary: Option<bool>,
        actor: &Actor,
        ticket: &Ticket,
    ) -> Result<StreamChange, Error> {
        self.put_stream_from(name, Some(map), primary, Source::Kept, actor, ticket)
            .await
    }

    /// Registers `name`'s map from `source` (see [`Registry::register`]): its current map
    /// again when `map` is `None`.
    pub async fn put_stream_from(
        self: &Arc<Self>,
        name: String,
        map: Option<StreamMap>,
        primary: Option<bool>,
        source: Source,
        actor: &Actor,
        ticket: &Ticket,
    ) -> Result<StreamChange, Error> {
        let change = self.register(name.clone(), map, primary, source, actor, ticket);
        change.await?.ok_or(Error::NotWatched(name))
    }

    /// Registers `name`'s map from `source`, or its current map again when `map` is `None`
    /// (a watch stopped). A listing the sync made of a map already registered, from the
    /// same Kinesis stream, registers nothing (`None`) but that it was synced. A stream
    /// created again in Kinesis under the name (another ARN or creation time) is a new
    /// stream: its consumers' leases and checkpoints go, as `DELETE /streams` drops them.
    /// The log names `actor`, or Kinesis for a listing; an Idempotency-Key is `actor`'s.
    pub(super) async fn register(
        self: &Arc<Self>,
        name: String,
        map: Option<StreamMap>,
        primary: Option<bool>,
        source: Source,
        actor: &Actor,
        ticket: &Ticket,
    ) -> Result<Option<StreamChange>, Error> {
        let (this, actor, ticket) = (Arc::clone(self), actor.clone(), ticket.clone());
        detached(async move {
            let mut w = this.writer.lock().await;
            if !ticket.wanted() {
                return Err(Error::NotMade);
            }
            let (mut tx, at) = this.begin(&mut w).await?;
            let old = this.stream(&name);
            let Watching {
                watch,
                kinesis,
                recreated,
            } = watch_after(&name, old.as_ref(), &source)?;
            let map = match (map, &old) {
                (Some(map), _) => map,
                (None, Some(old)) => old.stream_map(),
                (None, None) => return Err(Error::UnknownStream(name)),
            };
            if let Source::Synced { claimed, .. } = source
                && (old.as_ref().is_some_and(|o| o.version != claimed)
                    || tx.reshard_runs_on(&name).await?)
            {
                return Err(Error::Overtaken(name));
            }
            if let (Source::Synced { .. }, Some(old)) = (&source, &old)
                && !recreated
                && old.holds(&map)
            {
                tx.synced(&name, at).await?;
                this.commit(&mut w, tx, Committed::Stream, &[&ticket]).await?;
                this.note_sync(&name, synced_at(at));
                return Ok(None);
            }
            if recreated {
                tracing::warn!(stream = %name, "the stream was created again in Kinesis: its consumers' leases and checkpoints are dropped");
                tx.lease_lock(&name).await?;
                tx.delete_lease_group(&name).await?;
            }
            let StreamMap {
                map,
                lease_shards: listed,
                next_shard,
            } = map;
            let configured = w.pending_primary.as_deref() == Some(name.as_str());
            let primary = primary.unwrap_or_else(|| old.as_ref().map_or(configured, |o| o.primary));
            let sync = match &old {
                _ if source.listed() => synced_at(at),
                Some(old) => old.sync.clone(),
                None => SyncState::default(),
            };
            let row = StreamRow {
                name: name.clone(),
                shards: map.iter().map(|s| (s.id, s.start, s.end)).collect(),
                next_shard,
                primary,
                updated_at: at,
                version: 0,
                listed,
                watch,
                kinesis,
                sync,
            };
            let id = tx.put_stream(&row, &source.actor(&actor)).await?;
            if source.listed() {
                tx.synced(&name, at).await?;
            }
            // The answer as memory holds it once this commits, worked out before, so that an
            // answer kept for an Idempotency-Key is kept with the change.
            let stream = Stream::from_row(StreamRow { version: id, ..row }, this.keyspace)?;
            let loads = |w: &Writer, map: &ShardMap| -> Vec<Load> {
                map.iter()
                    .map(|s| w.alloc.load_in(s.start, s.end))
                    .collect()
            };
            let before = old.map(|o| {
                let l = loads(&w, &o.map);
                (o.map, l)
            });
            let after = loads(&w, &stream.map);
            let primary_after = match this.primary_stream() {
                _ if stream.primary => Some((*stream.map).clone()),
                Some(other) if other.name != name => Some((*other.map).clone()),
                _ => None,
            };
            let balanced = w.alloc.balanced_map().cloned();
            w.alloc.balance_on(primary_after);
            let plan = this.plan(&mut w, &stream.map, at);
            w.alloc.balance_on(balanced);
            let plan = plan?;
            let rebalance = (plan_id(id, &MapSpec::Stream(name.clone()), &plan), plan);
            let change = StreamChange {
                stream,
                before,
                after,
                rebalance,
            };
            ticket.keep_in(&mut tx, &actor, Ok(&change), at).await?;
            let event = Event {
                id,
                at,
                change: Change::StreamPut { stream: name },
            };
            (this.commit_stream_change(&mut w, tx, event, &ticket)).await?;
            if primary && configured {
                w.pending_primary = None;
            }
            Ok(Some(change))
        })
        .await
    }

    /// Forgets a stream; if it was primary, new keys go back to the plain walk.
    pub async fn delete_stream(
        self: &Arc<Self>,
        name: String,
        actor: &Actor,
        ticket: &Ticket,
    ) -> Result<(), Error> {
        let (this, actor, ticket) = (Arc::clone(self), actor.clone(), ticket.clone());
        detached(async move {
            let mut w = this.writer.lock().await;
            if !ticket.wanted() {
                return Err(Error::NotMade);
            }
            let (mut tx, at) = this.begin(&mut w).await?;
            this.stream(&name)
                .ok_or_else(|| Error::UnknownStream(name.clone()))?;
            // Its consumers' leases and checkpoints go with it: a stream created again
            // under the name starts its sequence numbers afresh.
            tx.lease_lock(&name).await?;
            tx.delete_lease_group(&name).await?;
            let id = tx.delete_stream(&name, &actor, at).await?;
            ticket.keep_in(&mut tx, &actor, Ok(&()), at).await?;
            this.commit_stream_change(
                &mut w,
                tx,
                Event {
                    id,
                    at,
                    change: Change::StreamDelete { stream: name },
                },
                &ticket,
            )
            .await
        })
        .await
    }

    /// The SplitShard / MergeShards calls that take `name` to `target` even shards, and the
    /// loads `target` uniform shards would carry instead. Blocks: the keys are copied under
    /// the writer lock, the plan is made after releasing it, in O(keys + target × log keys).
    pub fn split_plan(
        &self,
        name: &str,
        target: usize,
    ) -> Result<(Stream, SplitPlan, Vec<Load>), Error> {
        let stream = self
            .stream(name)
            .ok_or_else(|| Error::UnknownStream(name.to_owned()))?;
        let uniform = ShardMap::uniform(self.keyspace, target as u64)?;
        let keys = self.keys();
        let plan =
            keyspace::split_plan(self.keyspace, &stream.map, stream.next_shard, &keys, target)?;
        let uniform = uniform
            .iter()
            .map(|s| keyspace::load_in(&keys, s.start, s.end))
            .collect();
        Ok((stream, plan, uniform))
    }

    /// Makes the configured primary stream primary at start-up (logged as the
    /// configuration's change), or remembers the name until a stream of that name is
    /// registered.
    pub(super) async fn choose_primary(&self, configured: Option<String>) -> Result<(), Error> {
        let Some(name) = configured else {
            return Ok(());
        };
        let mut w = self.writer.lock().await;
        let (mut tx, at) = self.begin(&mut w).await?;
        match self.stream(&name) {
            Some(stream) if stream.primary => Ok(()),
            Some(stream) => {
                let row = StreamRow {
                    primary: true,
                    updated_at: at,
                    ..stream.to_row()
                };
                let id = tx.put_stream(&row, &Actor::new(Actor::CONFIG)).await?;
                self.commit_stream_change(
                    &mut w,
                    tx,
                    Event {
                        id,
                        at,
                        change: Change::StreamPut { stream: name },
                    },
                    &Ticket::unbounded(),
                )
                .await
            }
            None => {
                tracing::warn!(stream = %name, "the configured primary stream is not registered yet; new keys use the plain walk until it is");
                w.pending_primary = Some(name);
                Ok(())
            }
        }
    }

    /// Commits a stream change logged as `event` (at `ticket`'s commit point), then applies
    /// it; the streams table is re-read inside the transaction, so memory gets exactly what
    /// was committed.
    async fn commit_stream_change(
        &self,
        w: &mut Writer,
        mut tx: Tx,
        event: Event,
        ticket: &Ticket,
    ) -> Result<(), Error> {
        let rows = tx.load_streams().await?;
        self.commit(w, tx, Committed::Stream, &[ticket]).await?;
        self.apply_events(w, vec![event])?;
        self.reload_streams(w, rows)
    }
}

/// Whether the stream is watched once `source` registers a map, and the Kinesis stream it
/// is then known as; refuses a client's map while Kinesis is the source, and a sync's
/// listing once the watch has stopped.
fn watch_after(name: &str, old: Option<&Stream>, source: &Source) -> Result<Watching, Error> {
    let watched = old.is_some_and(|o| o.watch);
    let known = old.and_then(|o| o.kinesis.clone());
    let kept = |watch| Watching {
        watch,
        kinesis: known.clone(),
        recreated: false,
    };
    match source {
        Source::Kept => Ok(kept(watched)),
        Source::Given if watched => Err(Error::Watched(name.to_owned())),
        Source::Given | Source::Unwatched => Ok(kept(false)),
        Source::Synced { .. } | Source::Resharding(_) if !watched => {
            Err(Error::NotWatched(name.to_owned()))
        }
        Source::Watched(now) | Source::Synced { kinesis: now, .. } | Source::Resharding(now) => {
            Ok(Watching {
                watch: true,
                recreated: known.as_ref().is_some_and(|was| was != now),
                kinesis: Some(now.clone()),
            })
        }
    }
}

/// A listing that succeeded at `at`.
fn synced_at(at: i64) -> SyncState {
    SyncState {
        synced_at: Some(at),
        sync_error: None,
    }
}
