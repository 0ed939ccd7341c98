//! Consumer leases: which worker reads which shard of a stream, kept in the database so
//! that every replica answers the same.
//!
//! A heartbeat costs O(the worker's own leases): it touches the worker's row, completes
//! the revocations it was told of, and reads its leases. The whole group is assigned again
//! (O(shards + workers)) only when something changed: a worker joined, left or expired, a
//! shard was read to its end, the stream's map was registered again, or, at most every
//! [`WEIGHT_RECHECK_MS`], the weights moved or (once its readers report load) loads may
//! have drifted. Each stream's lease changes take turns on a lock of their own (see
//! [`Store::begin_leases`](crate::store::Store::begin_leases)).
//!
//! A stream whose readers report what they read is balanced by its shards' observed
//! utilisation, with a hysteresis band (see [`assign_by_load`]); one without reports, by its
//! keys' weights.
//!
//! Every decision is made over the stream's map and by the clock the database holds,
//! both read inside the lease transaction: a replica that has not read the newest map
//! yet, or whose clock runs ahead, decides as every other replica would.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use super::load::{IgnoredLoad, LoadReport};
use super::{Error, Registry, Stream, Ticket, detached};
use crate::keyspace::lease_state::{Holder, HolderState, LeaseShard, SHARD_END, leasable};
use crate::keyspace::leases::{assign, assign_by_load};
use crate::store::Actor;
use crate::store::Tx;
use crate::store::leases::{LeaseGroup, LeaseRow, WorkerRow};

/// Longest a group goes without its weights checked against the balance rule while keys
/// are being allocated, released or moved. Weights drift slowly; checking costs O(shards).
pub const WEIGHT_RECHECK_MS: i64 = 5_000;

/// What a heartbeat answers: the worker's leases.
#[derive(Debug, Clone)]
pub struct Heartbeat {
    pub worker: String,
    pub ttl_ms: i64,
    /// Unix milliseconds: the worker's leases are its until then unless it heartbeats.
    pub expires_at: i64,
    pub leases: Vec<OwnLease>,
    /// The load entries not counted, and why.
    pub ignored_load: Vec<IgnoredLoad>,
}

/// A lease as its owner sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OwnLease {
    pub shard_id: String,
    pub epoch: u64,
    pub state: HolderState,
    pub checkpoint: Option<String>,
}

/// A shard's lease as the whole group sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaseState {
    /// A live worker reads it.
    Held,
    /// A live worker reads it and has been (or will be, at its next heartbeat) told to stop.
    Revoking,
    /// Nobody live reads it (no live worker, or its owner expired a moment ago).
    Free,
    /// A child whose parents are not all read to their end yet.
    Waiting,
    /// A closed shard read to its end.
    Done,
}

/// One shard in the whole assignment.
#[derive(Debug, Clone)]
pub struct ShardLease {
    pub shard: LeaseShard,
    /// The live worker reading it.
    pub owner: Option<String>,
    /// The worker it is going to, while revoking.
    pub next_owner: Option<String>,
    pub epoch: u64,
    pub state: LeaseState,
    pub weight: u64,
    /// Its observed utilisation now (0 when its readers never reported it).
    pub utilisation: f64,
    pub checkpoint: Option<String>,
}

/// One live worker in the whole assignment.
#[derive(Debug, Clone)]
pub struct WorkerLeases {
    pub worker: String,
    /// The shards it reads (held or revoking), in the stream's order.
    pub shards: Vec<String>,
    pub weight: u64,
    /// Its shards' summed utilisation.
    pub utilisation: f64,
    /// Unix milliseconds.
    pub expires_at: i64,
}

/// The whole assignment of a stream.
#[derive(Debug, Clone)]
pub struct LeaseView {
    pub shards: Vec<ShardLease>,
    pub workers: Vec<WorkerLeases>,
}

/// A recorded checkpoint.
#[derive(Debug, Clone)]
pub struct Checkpointed {
    pub shard_id: String,
    pub worker: String,
    pub epoch: u64,
    pub checkpoint: String,
}

/// Most workers a stream's group holds: as many as a stream may have shards. A join
/// beyond is refused (409), so that an assignment stays O(shards + workers).
pub const MAX_WORKERS: i64 = 10_000;

/// Most times a lease change weighs a map and finds a newer one registered meanwhile.
const MAP_RETRIES: usize = 4;

impl Registry {
    /// How long joins wait to be assigned together (see [`DEFAULT_JOIN_BATCH_MS`]).
    pub fn set_lease_join_batch_ms(&self, ms: i64) {
        self.lease_join_batch
            .store(ms, std::sync::atomic::Ordering::Relaxed);
    }

    fn lease_join_batch_ms(&self) -> i64 {
        self.lease_join_batch
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Joins `worker` to `stream`'s consumer group, or keeps it in: it stays live for
    /// `ttl_ms` from now. Folds in the entries of `load` it may report (see
    /// [`Registry::fold_load`]), in the same transaction. Answers its leases.
    pub async fn heartbeat(
        self: &Arc<Self>,
        stream: &str,
        worker: String,
        ttl_ms: i64,
        load: Vec<LoadReport>,
        actor: &Actor,
        ticket: &Ticket,
    ) -> Result<Heartbeat, Error> {
        let stream = self.leased_stream(stream)?;
        let (this, actor, ticket) = (Arc::clone(self), actor.clone(), ticket.clone());
        detached(async move {
            if !ticket.wanted() {
                return Err(Error::NotMade);
            }
            let (mut tx, mut stream, now) = this.begin_leases(&stream).await?;
            let name: &str = &stream.name.clone();
            let me = WorkerRow {
                worker,
                ttl_ms,
                expires_at: now + ttl_ms,
            };
            let joined = !tx.touch_worker(name, &me).await?;
            if joined {
                // The stream is there: `begin_leases` read it under the lease lock, which
                // deleting the stream takes too, so a join never outlives its stream.
                if tx.count_workers(name).await? >= MAX_WORKERS {
                    return Err(Error::GroupFull {
                        stream: stream.name.clone(),
                        max: MAX_WORKERS,
                    });
                }
                tx.insert_worker(name, &me, now).await?;
            }
            // The revocations it was told of at an earlier heartbeat complete now: it has
            // stopped reading those shards (and forgets those the map no longer lists).
            let owned = tx.owned_leases(name, &me.worker).await?;
            // Refused, this rolls back the worker's join or heartbeat.
            Self::check_load_shards(&stream, &owned, &load)?;
            // Counted by the leases as they stood before this heartbeat changed them.
            let ignored_load = if load.is_empty() {
                Vec::new()
            } else {
                this.fold_load(&mut tx, &stream, &owned, load, now).await?
            };
            let listed = |id: &str| stream.lease_shards.iter().any(|s| s.id == id);
            for mut lease in owned {
                if lease.holder.told && !listed(&lease.shard_id) {
                    tx.delete_lease(name, &lease.shard_id).await?;
                } else if lease.holder.told {
                    lease.holder = lease.holder.owner_heartbeats();
                    tx.put_lease(name, &lease).await?;
                }
            }
            if this.leases_due(&mut tx, &stream, now, joined).await? {
                // The weights are read outside any transaction: they wait on the writer
                // lock, which may be waiting on this database connection.
                super::metrics::settle(tx, &[&ticket], None).await?;
                let (again, current, now, weights) = this.begin_weighed(stream).await?;
                (tx, stream) = (again, current);
                // Another heartbeat may have assigned them meanwhile.
                if this.leases_due(&mut tx, &stream, now, joined).await? {
                    this.assign_leases(&mut tx, &stream, &weights, now).await?;
                }
            }
            let mut leases = Vec::new();
            let listed = |id: &str| stream.lease_shards.iter().any(|s| s.id == id);
            for mut lease in tx.owned_leases(name, &me.worker).await? {
                let dropped = !listed(&lease.shard_id);
                if (dropped || lease.holder.next.is_some()) && !lease.holder.told {
                    // A shard the map dropped goes to nobody: its owner is told to stop.
                    lease.holder = if dropped {
                        Holder {
                            told: true,
                            ..lease.holder
                        }
                    } else {
                        lease.holder.owner_heartbeats()
                    };
                    tx.put_lease(name, &lease).await?;
                }
                let mut own = own_lease(lease);
                if dropped {
                    own.state = HolderState::Revoking;
                }
                leases.push(own);
            }
            // By shard id (Kinesis numbers shards upwards): O(own leases), where the stream's
            // own order would cost a walk of all its shards.
            leases.sort_by(|a, b| a.shard_id.cmp(&b.shard_id));
            let beat = Heartbeat {
                worker: me.worker,
                ttl_ms,
                expires_at: me.expires_at,
                ignored_load,
                leases,
            };
            ticket.keep_in(&mut tx, &actor, Ok(&beat), now).await?;
            super::metrics::settle(tx, &[&ticket], None).await?;
            this.metrics.lease_heartbeats.add(1);
            Ok(beat)
        })
        .await
    }

    /// Takes `worker` out of `stream`'s group; its leases go to the others at once.
    pub async fn leave(
        self: &Arc<Self>,
        stream: &str,
        worker: String,
        actor: &Actor,
        ticket: &Ticket,
    ) -> Result<(), Error> {
        let stream = self.leased_stream(stream)?;
        let (this, actor, ticket) = (Arc::clone(self), actor.clone(), ticket.clone());
        detached(async move {
            if !ticket.wanted() {
                return Err(Error::NotMade);
            }
            let (mut tx, stream, now, weights) = this.begin_weighed(stream).await?;
            let name = stream.name.as_str();
            if !tx.delete_worker(name, &worker).await? {
                return Err(Error::UnknownWorker {
                    stream: stream.name.clone(),
                    worker,
                });
            }
            this.assign_leases(&mut tx, &stream, &weights, now).await?;
            ticket.keep_in(&mut tx, &actor, Ok(&()), now).await?;
            super::metrics::settle(tx, &[&ticket], None).await?;
            Ok(())
        })
        .await
    }

    /// Records `asked`: its worker's progress on its shard, if it holds that lease at its
    /// epoch. A shard read to its end ([`SHARD_END`]) is done: its lease ends, and its
    /// children may be leased.
    pub async fn checkpoint(
        self: &Arc<Self>,
        stream: &str,
        asked: Checkpointed,
        actor: &Actor,
        ticket: &Ticket,
    ) -> Result<Checkpointed, Error> {
        let stream = self.leased_stream(stream)?;
        let Checkpointed {
            shard_id,
            worker,
            epoch,
            checkpoint: sequence_number,
        } = asked;
        let end = sequence_number == SHARD_END;
        let (this, actor, ticket) = (Arc::clone(self), actor.clone(), ticket.clone());
        detached(async move {
            if !ticket.wanted() {
                return Err(Error::NotMade);
            }
            // Only a shard's end changes the assignment, and so needs the weights.
            let (mut tx, stream, now, weights) = if end {
                let (tx, stream, now, weights) = this.begin_weighed(stream).await?;
                (tx, stream, now, Some(weights))
            } else {
                let (tx, stream, now) = this.begin_leases(&stream).await?;
                (tx, stream, now, None)
            };
            let name = stream.name.as_str();
            let Some(shard) = stream.lease_shard(&shard_id) else {
                return Err(Error::UnknownShard {
                    stream: stream.name.clone(),
                    shard: shard_id,
                });
            };
            if end && !shard.closed {
                return Err(Error::ShardOpen {
                    stream: stream.name.clone(),
                    shard: shard_id,
                });
            }
            let lease = tx.lease(name, &shard_id).await?;
            let Some(mut lease) = lease.filter(|l| {
                l.holder.owner.as_deref() == Some(worker.as_str()) && l.holder.epoch == epoch
            }) else {
                return Err(Error::NotLeaseHolder {
                    shard: shard_id,
                    worker,
                    epoch,
                });
            };
            lease.checkpoint = Some(sequence_number.clone());
            if end {
                lease.holder = lease.holder.pass(None);
            }
            tx.put_lease(name, &lease).await?;
            if let Some(weights) = weights {
                this.assign_leases(&mut tx, &stream, &weights, now).await?;
            }
            let done = Checkpointed {
                shard_id,
                worker,
                epoch,
                checkpoint: sequence_number,
            };
            ticket.keep_in(&mut tx, &actor, Ok(&done), now).await?;
            super::metrics::settle(tx, &[&ticket], None).await?;
            Ok(done)
        })
        .await
    }

    /// The whole assignment of `stream`, as the database holds it now: one read of its
    /// lease rows and workers, the weights of its shards and their observed load.
    pub async fn lease_view(self: &Arc<Self>, stream: &str) -> Result<LeaseView, Error> {
        let stream = self.leased_stream(stream)?;
        let (rows, workers, now) = self.store.lease_view(&stream.name).await?;
        let weights = self.lease_weights(&stream).await;
        let load = self.stream_load(&stream.name).await?;
        let utilisation: HashMap<&str, f64> = load
            .shards
            .iter()
            .map(|s| (s.shard_id.as_str(), s.utilisation))
            .collect();
        let live: HashSet<&str> = workers
            .iter()
            .filter(|w| w.expires_at > now)
            .map(|w| w.worker.as_str())
            .collect();
        let rows: HashMap<&str, &LeaseRow> =
            rows.iter().map(|r| (r.shard_id.as_str(), r)).collect();
        let done = |id: &str| rows.get(id).is_some_and(|r| is_done(r));
        let can = leasable(&stream.lease_shards, done);
        let mut shards = Vec::with_capacity(stream.lease_shards.len());
        let mut held: HashMap<String, (Vec<String>, u64, f64)> = HashMap::new();
        for ((shard, can), weight) in stream.lease_shards.iter().zip(can).zip(&weights) {
            let row = rows.get(shard.id.as_str());
            let holder = row.map(|r| r.holder.clone()).unwrap_or_default();
            let owner = holder.owner.filter(|o| live.contains(o.as_str()));
            let next_owner = holder.next.filter(|_| owner.is_some());
            let state = if done(&shard.id) {
                LeaseState::Done
            } else if !can {
                LeaseState::Waiting
            } else if owner.is_none() {
                LeaseState::Free
            } else if next_owner.is_some() {
                LeaseState::Revoking
            } else {
                LeaseState::Held
            };
            let used = utilisation.get(shard.id.as_str()).copied().unwrap_or(0.0);
            if let Some(owner) = &owner {
                let (ids, load, worker_used) = held.entry(owner.clone()).or_default();
                ids.push(shard.id.clone());
                *load += weight;
                *worker_used += used;
            }
            shards.push(ShardLease {
                shard: shard.clone(),
                owner,
                next_owner,
                epoch: holder.epoch,
                state,
                weight: *weight,
                utilisation: used,
                checkpoint: row.and_then(|r| r.checkpoint.clone()),
            });
        }
        let workers = workers
            .iter()
            .filter(|w| w.expires_at > now)
            .map(|w| {
                let (shards, weight, utilisation) =
                    held.remove(w.worker.as_str()).unwrap_or_default();
                WorkerLeases {
                    worker: w.worker.clone(),
                    shards,
                    weight,
                    utilisation,
                    expires_at: w.expires_at,
                }
            })
            .collect();
        Ok(LeaseView { shards, workers })
    }

    fn leased_stream(&self, name: &str) -> Result<Stream, Error> {
        self.stream(name)
            .ok_or_else(|| Error::UnknownStream(name.to_owned()))
    }

    /// Begins a lease transaction on `stream` and reads, inside it, the stream's map as the
    /// database holds it (`stream` itself unless a newer one was registered) and the
    /// database's clock (Unix milliseconds). Lease rows are only ever made for the newest
    /// map, so no decision is made over an older one than theirs.
    pub(super) async fn begin_leases(&self, stream: &Stream) -> Result<(Tx, Stream, i64), Error> {
        let name = stream.name.as_str();
        let gone = || Error::UnknownStream(name.to_owned());
        // The schema as last seen (the follower looks every few seconds): no extra round
        // trip on a heartbeat.
        self.writable()?;
        let mut tx = self.store.begin_leases(name).await?;
        let current = match tx.stream_version(name).await? {
            None => return Err(gone()),
            Some(version) if version == stream.version => stream.clone(),
            // Registered elsewhere and not followed here yet: O(shards), once per new map.
            Some(_) => {
                Stream::from_row(tx.load_stream(name).await?.ok_or_else(gone)?, self.keyspace)?
            }
        };
        let now = tx.clock_ms().await?;
        Ok((tx, current, now))
    }

    /// [`Registry::begin_leases`] with the weights of the map it read. They are read before
    /// the transaction (see [`Registry::lease_weights`]); a newer map found inside it is
    /// weighed, and the transaction begun again.
    async fn begin_weighed(
        self: &Arc<Self>,
        stream: Stream,
    ) -> Result<(Tx, Stream, i64, Vec<u64>), Error> {
        let mut weighed = stream;
        for _ in 0..MAP_RETRIES {
            let weights = self.lease_weights(&weighed).await;
            let (tx, current, now) = self.begin_leases(&weighed).await?;
            if current.version == weighed.version {
                return Ok((tx, current, now, weights));
            }
            // Nothing written yet: dropping the transaction rolls it back.
            drop(tx);
            weighed = current;
        }
        // The map changed at every try: the caller sends the change again later.
        Err(Error::Unavailable)
    }

    /// Whether `stream`'s leases must be assigned again: its map changed, a worker expired,
    /// a worker joined (`joined`: this one) and the last assignment is the join batch's
    /// time old, or the weights moved (or, once the stream has reports, its load may have)
    /// and were last checked [`WEIGHT_RECHECK_MS`] ago or more. A few row and index probes. A join that must wait is noted on the group, for
    /// the next heartbeat of any worker.
    async fn leases_due(
        &self,
        tx: &mut Tx,
        stream: &Stream,
        now: i64,
        joined: bool,
    ) -> Result<bool, Error> {
        let Some(group) = tx.lease_group(&stream.name).await? else {
            return Ok(true);
        };
        if group.map_version != stream.version {
            // Assigned over an older map (`stream` is the database's newest).
            return Ok(true);
        }
        if tx.any_expired(&stream.name, now).await? {
            return Ok(true);
        }
        if joined || group.pending_join {
            if now - group.assigned_at >= self.lease_join_batch_ms() {
                return Ok(true);
            }
            if !group.pending_join {
                let pending = LeaseGroup {
                    pending_join: true,
                    ..group
                };
                tx.put_lease_group(&stream.name, &pending).await?;
            }
        }
        if now - group.assigned_at < WEIGHT_RECHECK_MS {
            return Ok(false);
        }
        // Weights move with events; observed load drifts with every report and the clock.
        Ok(group.weights_event < self.applied_event()
            || tx.load_map_version(&stream.name).await?.is_some())
    }

    /// Assigns `stream`'s leases again (O(shards + workers)): expired workers leave, shards
    /// no longer listed are forgotten, and every leasable shard goes toward the owner the
    /// balanced, sticky assignment gives it, fenced (see [`Holder::toward`](crate::keyspace::lease_state::Holder::toward)).
    async fn assign_leases(
        &self,
        tx: &mut Tx,
        stream: &Stream,
        weights: &[u64],
        now: i64,
    ) -> Result<(), Error> {
        let started = std::time::Instant::now();
        let name = stream.name.as_str();
        let weights_event = self.applied_event();
        let mut live = Vec::new();
        for w in tx.lease_workers(name).await? {
            if w.expires_at > now {
                live.push(w.worker);
            } else {
                tx.delete_worker(name, &w.worker).await?;
            }
        }
        let index: HashMap<&str, usize> = live
            .iter()
            .enumerate()
            .map(|(i, w)| (w.as_str(), i))
            .collect();
        let is_live = |w: &String| index.contains_key(w.as_str());
        let listed: HashSet<&str> = stream.lease_shards.iter().map(|s| s.id.as_str()).collect();
        let mut rows: HashMap<String, LeaseRow> = HashMap::new();
        for row in tx.leases(name).await? {
            if listed.contains(row.shard_id.as_str()) {
                rows.insert(row.shard_id.clone(), row);
            } else if !read_by_live(&row, is_live) {
                tx.delete_lease(name, &row.shard_id).await?;
            }
            // Else a live owner still reads a shard the map no longer lists: the row stays
            // until its owner has been answered `revoking` (see `heartbeat`), so that a map
            // listing the shard again fences it like any hand-over.
        }
        let done = |id: &str| rows.get(id).is_some_and(is_done);
        let can = leasable(&stream.lease_shards, done);
        let open: Vec<usize> = (0..can.len()).filter(|&i| can[i]).collect();
        let current: Vec<Option<usize>> = open
            .iter()
            .map(|&i| {
                let holder = rows.get(&stream.lease_shards[i].id).map(|r| &r.holder)?;
                let live_index =
                    |w: &Option<String>| w.as_deref().and_then(|w| index.get(w)).copied();
                live_index(&holder.next).or_else(|| live_index(&holder.owner))
            })
            .collect();
        let target = self
            .target_owners(tx, stream, weights, &open, live.len(), &current, now)
            .await?;
        let mut targets: Vec<Option<usize>> = vec![None; can.len()];
        for (k, &i) in open.iter().enumerate() {
            targets[i] = target[k];
        }
        for (i, shard) in stream.lease_shards.iter().enumerate() {
            let row = rows.get(&shard.id);
            let holder = row.map(|r| r.holder.clone()).unwrap_or_default();
            let new = if can[i] {
                holder.toward(targets[i].map(|w| live[w].clone()), is_live)
            } else if holder.owner.is_some() || holder.next.is_some() {
                // Done, or waiting on a parent: nobody reads it.
                holder.pass(None)
            } else {
                holder.clone()
            };
            if new != holder {
                let lease = LeaseRow {
                    shard_id: shard.id.clone(),
                    holder: new,
                    checkpoint: row.and_then(|r| r.checkpoint.clone()),
                };
                tx.put_lease(name, &lease).await?;
            }
        }
        let group = LeaseGroup {
            map_version: stream.version,
            assigned_at: now,
            weights_event,
            pending_join: false,
        };
        tx.put_lease_group(name, &group).await?;
        self.metrics.lease_assignments.add(1);
        self.metrics.lease_assign_time.observe(started.elapsed());
        Ok(())
    }

    /// Where the leases of the shards `open` (indices into `stream`'s lease shards) should
    /// be: by observed utilisation, read in this transaction at the database's `now`, once
    /// the stream has reports (all alike while they report no load); else by the keys'
    /// `weights`.
    #[allow(clippy::too_many_arguments)]
    async fn target_owners(
        &self,
        tx: &mut Tx,
        stream: &Stream,
        weights: &[u64],
        open: &[usize],
        workers: usize,
        current: &[Option<usize>],
        now: i64,
    ) -> Result<Vec<Option<usize>>, Error> {
        // One probe: a stream without reports costs no read of its load.
        if tx.load_map_version(&stream.name).await?.is_none() {
            let open_weights: Vec<u64> = open.iter().map(|&i| weights[i]).collect();
            return Ok(assign(&open_weights, workers, current));
        }
        let load = tx
            .stream_load(&stream.name, now, &self.load_config())
            .await?;
        let used: HashMap<&str, f64> = (load.shards.iter())
            .filter(|s| s.reported())
            .map(|s| (s.shard_id.as_str(), s.utilisation))
            .collect();
        let loads: Vec<Option<f64>> = open
            .iter()
            .map(|&i| used.get(stream.lease_shards[i].id.as_str()).copied())
            .collect();
        // Until every shard it leases has been reported (the first seconds of load, a new
        // child, a reader that does not report), the picture is partial: a shard not
        // reported yet would weigh nothing and its reader be handed more. And with nothing
        // read yet (a fleet up before its producers) every assignment would be inside the
        // band, a joining worker keeping a single lease. Until then shards weigh the same:
        // lease counts differ by at most one.
        let loads = match loads.into_iter().collect::<Option<Vec<f64>>>() {
            Some(loads) if loads.iter().any(|&l| l > 0.0) => loads,
            _ => return Ok(assign(&vec![1; open.len()], workers, current)),
        };
        // The controller's band (`--load-tolerance`): loads wobble, leases should not.
        Ok(assign_by_load(
            &loads,
            workers,
            current,
            self.load_tolerance(),
        ))
    }

    /// What each of `stream`'s shards weighs: the weights of the keys in its range, at
    /// least 1. O(shards × log keys) under the writer lock, off the async threads; never
    /// inside a lease transaction, as the writer may be waiting on the database's lock.
    async fn lease_weights(self: &Arc<Self>, stream: &Stream) -> Vec<u64> {
        let this = Arc::clone(self);
        let shards = Arc::clone(&stream.lease_shards);
        tokio::task::spawn_blocking(move || {
            let w = this.writer.blocking_lock();
            shards
                .iter()
                .map(|s| w.alloc.load_in(s.start, s.end).weight.max(1))
                .collect()
        })
        .await
        .expect("weights task")
    }
}

/// Whether a live worker reads the shard of `row`: it owns the lease and has not ended it.
fn read_by_live(row: &LeaseRow, is_live: impl Fn(&String) -> bool) -> bool {
    !is_done(row) && row.holder.owner.as_ref().is_some_and(is_live)
}

fn is_done(row: &LeaseRow) -> bool {
    row.checkpoint.as_deref() == Some(SHARD_END)
}

fn own_lease(row: LeaseRow) -> OwnLease {
    OwnLease {
        state: row.holder.state().unwrap_or(HolderState::Held),
        epoch: row.holder.epoch,
        shard_id: row.shard_id,
        checkpoint: row.checkpoint,
    }
}
