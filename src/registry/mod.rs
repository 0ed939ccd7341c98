//! The registry: the committed table mirrored in memory, and the one path every change takes.
//!
//! Lookups read an in-memory map and never wait on the database. Changes are serialized by
//! one writer lock, committed to the store first, and only then applied in memory and
//! answered, so a key reaches a client only once the row holding it is durable.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::config::{ControllerConfig, DEFAULT_JOIN_BATCH_MS, LoadConfig};
use crate::keyspace::{self, AccountId, Allocator, HashKey, Keyspace};
use crate::store::{
    Actor, Actors, Assignment, Change, Event, HashKeys, KeyRow, LogEnd, LogId, MoveReason, Store,
    StoreError, Switch, Unwritable,
};

mod accounts;
mod clock;
mod controller;
mod follow;
mod group;
mod keep;
mod leases;
mod lineage;
mod load;
mod log;
mod md5_loads;
mod metrics;
mod rebalance;
mod reshard;
mod restore;
mod retention;
mod snapshot;
mod streams;
mod ticket;
mod totals;
mod vouch;
mod watch;

use accounts::Accounts;
pub use accounts::Held;
pub use controller::{FanoutDecision, Round, capped_loads, fanout_targets, key_loads, plan_round};
pub use follow::POLL;
pub use keep::{KEPT_FOR_MS, Keep};
pub use leases::{
    Checkpointed, Heartbeat, LeaseState, LeaseView, OwnLease, ShardLease, WEIGHT_RECHECK_MS,
    WorkerLeases,
};
pub use load::{
    AccountLoad, AccountReport, IgnoreReason, IgnoredLoad, KeyReport, LoadReport,
    MAX_REPORT_ACCOUNTS, MAX_WINDOW_MS, ProducerReport, ShardLoad, ShardReport, StreamLoad,
};
pub use log::LogPage;
use metrics::Committed;
pub use rebalance::{Applied, Counted, MapSpec, Planned};
pub use reshard::{ReshardError, ReshardView};
pub use restore::{Grow, RestoreChunk, Restored};
pub use retention::Compacted;
pub use snapshot::Snapshot;
pub use streams::{Source, Stream, StreamChange, StreamMap};
pub use ticket::Ticket;
pub use totals::{AccountTotals, LoadTotals};
pub use vouch::VOUCH;
pub use watch::Watch;

/// Why a registry operation failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("account {0} has no hash key")]
    NotFound(AccountId),
    #[error(transparent)]
    Keyspace(#[from] keyspace::Error),
    #[error(
        "plan {0} no longer matches the assignments: preview again, or apply with \"replan\": true"
    )]
    StalePlan(String),
    #[error("no stream named {0:?} is registered")]
    UnknownStream(String),
    #[error(
        "stream {0:?} is watched: its map comes from Kinesis; send {{\"watch\": false}} (with \
         or without a map) to stop watching it first"
    )]
    Watched(String),
    #[error("stream {0:?} is no longer watched")]
    NotWatched(String),
    /// A watch's listing that another registration, or a running reshard, overtook.
    #[error(
        "stream {0:?}'s map changed while Kinesis was listed, or a reshard of it runs: the listing is not registered"
    )]
    Overtaken(String),
    #[error("worker {worker:?} is not in stream {stream:?}'s group (it left, or expired)")]
    UnknownWorker { stream: String, worker: String },
    #[error("stream {stream:?}'s consumer group already has {max} workers, the most it may have")]
    GroupFull { stream: String, max: i64 },
    #[error("stream {stream:?} lists no shard {shard:?}")]
    UnknownShard { stream: String, shard: String },
    #[error(
        "shard {shard:?} of stream {stream:?} is still open: SHARD_END is the checkpoint of a closed shard read to its end (the stream's map, from list-shards, names it closed)"
    )]
    ShardOpen { stream: String, shard: String },
    #[error(
        "worker {worker:?} does not hold the lease of shard {shard:?} at epoch {epoch}: it passed to another worker (or ended); stop reading the shard"
    )]
    NotLeaseHolder {
        shard: String,
        worker: String,
        epoch: u64,
    },
    #[error("{0}")]
    InvalidReport(String),
    #[error("{0:?} is not a plan id issued by this service")]
    BadPlanId(String),
    /// A fanout above the account's cap, or a cap below its fanout.
    #[error("{0}")]
    FanoutCap(String),
    #[error(
        "account {account}'s fanout is growing: its new keys take over at {switch_at} (Unix ms); change its fanout after that"
    )]
    FanoutGrowing { account: AccountId, switch_at: i64 },
    #[error("the database refused the change because another writer changed the same rows")]
    Conflict,
    #[error("the database is unreachable; changes are refused until it is back")]
    Unavailable,
    /// The change was refused at its commit point (see [`Ticket`]): it was not made.
    #[error(
        "the change was not made: it could not commit before its deadline (the database was \
         slow or held up, or this server was paused)"
    )]
    NotMade,
    /// A COMMIT was sent and its answer lost: the change may or may not have been made.
    #[error("the outcome of the change is unknown: {0}")]
    OutcomeUnknown(String),
    #[error(
        "the database's schema (migration {found}) is newer than this keyspread knows (up to {known}): it serves reads but refuses changes until it is upgraded"
    )]
    SchemaNewer { found: i64, known: i64 },
    #[error(
        "events after {after} were compacted away (the log keeps those after {horizon}): take a new GET /snapshot and follow the log from its event_id"
    )]
    Compacted {
        after: i64,
        horizon: i64,
        log_id: LogId,
    },
    #[error(
        "event {after} is past the end of log {log_id} (its newest event is {end}): the position belongs to another history; take a new GET /snapshot and follow the log from its event_id"
    )]
    PastEnd { after: i64, end: i64, log_id: LogId },
    /// Another request with the same Idempotency-Key committed first.
    #[error(
        "another request with this Idempotency-Key was being made at the same time: send it \
         again to be told its answer"
    )]
    KeyInUse,
    /// This replica has not read the log for longer than its lookups may be cached, and
    /// cannot read it now.
    #[error(
        "this replica has not been able to read the database's log for {age_s} s, longer than \
         lookups may be cached: it cannot vouch for its table"
    )]
    Stale { age_s: u64 },
    #[error(transparent)]
    Store(StoreError),
}

impl From<StoreError> for Error {
    fn from(err: StoreError) -> Self {
        match err {
            StoreError::Conflict | StoreError::Stale | StoreError::LogMoved => Error::Conflict,
            StoreError::Unavailable(cause) => {
                tracing::warn!(%cause, "database unreachable");
                Error::Unavailable
            }
            StoreError::ReadOnly => {
                tracing::warn!("the database takes no writes (read-only, or in recovery)");
                Error::Unavailable
            }
            StoreError::OutcomeUnknown(cause) => {
                tracing::warn!(%cause, "a commit's outcome is unknown");
                Error::OutcomeUnknown(cause)
            }
            other => Error::Store(other),
        }
    }
}

/// An account to give its hash keys.
#[derive(Debug, Clone)]
pub struct NewAccount {
    pub account: AccountId,
    /// The account's weight, at least `fanout`: its keys share it.
    pub weight: u64,
    /// How many keys it holds, 1..=[`keyspace::MAX_FANOUT`].
    pub fanout: u32,
    /// The key 0 it already has elsewhere (an import), or `None` for the walk's pick.
    pub key: Option<HashKey>,
}

/// What [`Registry::pick`] answers: each request's answer, the key rows to write, and
/// each row's actor.
type Picked = (Vec<Allocated>, Vec<KeyRow>, Vec<Actor>);

/// What an allocation found or made.
#[derive(Debug, Clone)]
pub enum Allocated {
    Created(Assignment),
    Existing(Assignment),
}

/// State only the writer touches.
#[derive(Debug)]
struct Writer {
    alloc: Allocator,
    /// The log memory follows, and the newest of its events applied.
    log: LogId,
    last_event: i64,
    /// When that event was logged (its `at`; 0 before the first): a log that holds another
    /// event under its id is another history (see `log::found`).
    last_at: i64,
    /// The configured primary stream, until it is registered.
    pending_primary: Option<String>,
    /// When the open write transaction began.
    tx_started: Option<Instant>,
}

/// The authoritative registry of account -> hash key.
#[derive(Debug)]
pub struct Registry {
    store: Store,
    keyspace: Keyspace,
    accounts: RwLock<Accounts>,
    streams: RwLock<BTreeMap<String, Stream>>,
    writer: tokio::sync::Mutex<Writer>,
    /// Where single allocations and releases queue for group commit.
    group: std::sync::OnceLock<group::Queues>,
    metrics: metrics::Metrics,
    /// See [`DEFAULT_JOIN_BATCH_MS`].
    lease_join_batch: std::sync::atomic::AtomicI64,
    /// `--load-tolerance`, as f64 bits: the band by-load plans stop inside.
    load_tolerance: std::sync::atomic::AtomicU64,
    /// The last MD5 comparison made, while no account changes.
    md5_cache: std::sync::Mutex<Option<md5_loads::Md5Loads>>,
    /// The newest migration the database was seen to have run; above
    /// `Store::known_schema`, this keyspread refuses every change.
    schema: std::sync::atomic::AtomicI64,
    /// Since when the follower has failed to apply the log, while it does.
    follow_failing: std::sync::Mutex<Option<Instant>>,
    /// How observed load is smoothed and weighed.
    load_config: RwLock<LoadConfig>,
    /// The newest event applied to memory, for long-polls of the log to wait on; and
    /// whether the server is draining, which ends them at once.
    applied: tokio::sync::watch::Sender<LogHead>,
    /// When the log was last read to its end: how far memory may be trusted.
    synced: vouch::Synced,
    /// How far the database's clock is from this host's.
    offset: clock::Offset,
    /// Wakes this replica's reshard driver: a job was started here.
    reshard_wake: tokio::sync::Notify,
}

/// What a long-poll of the log waits on (see [`Registry::wait_for_events`]).
#[derive(Debug, Clone, Copy, Default)]
struct LogHead {
    log: LogId,
    event: i64,
    draining: bool,
}

/// Loads a fanout raise places new keys by: per shard of the primary map, and what each new
/// key adds to its shard.
#[derive(Debug, Clone)]
pub struct LoadPlacement {
    pub shard_loads: Vec<f64>,
    pub key_load: f64,
    /// The new keys take over this long after the change (0: at once). Growing the fanout
    /// moves sub-keys to the new keys; staged, every producer moves them at one instant a
    /// consumer can wait for, as with a staged move.
    pub new_keys_after_ms: i64,
}

/// What [`Registry::update`] changes: each field given replaces the account's.
#[derive(Debug, Clone, Copy)]
pub struct Update {
    pub weight: Option<u64>,
    pub fanout: Option<u32>,
    /// `Some(None)` clears the cap.
    pub max_fanout: Option<Option<u32>>,
    /// Why moves this makes are made.
    pub reason: MoveReason,
}

/// Files every stored key row by account: key 0 makes the entry, the keys of accounts
/// that fan out are added once every row is read (rows come in no particular order).
fn file(count: usize, batches: std::sync::mpsc::Receiver<Vec<KeyRow>>) -> Result<Accounts, Error> {
    let mut accounts = Accounts::with_capacity(count);
    let mut more: HashMap<AccountId, Vec<(u32, HashKey, u64)>> = HashMap::new();
    for batch in batches {
        for row in batch {
            if row.index == 0 {
                accounts.file_one(row.account, row.hash_key, row.weight, row.created_at);
            } else {
                more.entry(row.account)
                    .or_default()
                    .push((row.index, row.hash_key, row.weight));
            }
        }
    }
    for (account, mut rows) in more {
        rows.sort_unstable_by_key(|(index, ..)| *index);
        let corrupt = |detail: String| Error::Store(StoreError::Corrupt(detail));
        let held = accounts
            .get(account.as_str())
            .ok_or_else(|| corrupt(format!("account {account} has keys but no key 0")))?;
        let mut keys = held.keys.as_slice().to_vec();
        let mut weight = held.weight;
        for (index, key, w) in rows {
            if index as usize != keys.len() {
                return Err(corrupt(format!(
                    "account {account} lacks key {}",
                    keys.len()
                )));
            }
            keys.push(key);
            weight += w;
        }
        accounts.file(account, keys, weight, held.created_at);
    }
    Ok(accounts)
}

/// The committed table as one consistent state of the database holds it, ready to serve.
struct Table {
    alloc: Allocator,
    accounts: Accounts,
    log: LogId,
    last_event: i64,
    last_at: i64,
    streams: Vec<crate::store::StreamRow>,
    schema: i64,
}

impl Table {
    /// Reads every assignment, pending move and stream, and rebuilds the allocation tree:
    /// at start-up, and when a replica must start again from the table (see
    /// `retention`).
    async fn load(store: &Store, keyspace: Keyspace) -> Result<Table, Error> {
        // One consistent state, so that the rows and the last event id agree while other
        // replicas write; no lock, so that they need not wait for a large table's read.
        let mut snapshot = store.snapshot().await?;
        let count = usize::try_from(snapshot.count_assignments().await?).unwrap_or(0);
        // The rows are read here while another thread files them by account; the tree of
        // their keys is built while the filing finishes.
        let (batches, filed) = std::sync::mpsc::sync_channel(4);
        let (done, accounts) = tokio::sync::oneshot::channel();
        std::thread::Builder::new()
            .name("keyspread-file".into())
            .spawn(move || {
                let _ = done.send(file(count, filed));
            })
            .expect("start the filing thread");
        let mut keys = Vec::with_capacity(count);
        snapshot
            .scan_assignments(|batch| {
                keys.extend(batch.iter().map(|a| (a.hash_key, a.weight)));
                batches.send(batch).is_ok()
            })
            .await?;
        drop(batches);
        let LogEnd {
            log_id: log,
            end: last_event,
        } = snapshot.log_end().await?;
        let last_at = snapshot.event_at(last_event).await?.unwrap_or(0);
        let streams = snapshot.load_streams().await?;
        // Pending by the database's clock: only it ends a switch (see `follow::fold`).
        let now = snapshot.clock_ms().await?;
        let schema = snapshot.schema_version().await?;
        let moves = snapshot.pending_moves(now).await?;
        let caps = snapshot.max_fanouts().await?;
        drop(snapshot);
        let mut alloc = tokio::task::spawn_blocking(move || Allocator::with_keys(keyspace, keys))
            .await
            .expect("tree build")?;
        let mut accounts = accounts.await.expect("the filing thread answers")?;
        // Pending moves hold their old keys until they switch.
        for m in moves {
            if let Some(from) = m.from {
                alloc.reserve(from)?;
            }
            let switch = Switch {
                index: m.index,
                from: m.from,
                switch_at: m.switch_at,
            };
            accounts.stage(&m.account, switch);
        }
        for (account, cap) in caps {
            accounts.set_max_fanout(&account, Some(cap));
        }
        Ok(Table {
            alloc,
            accounts,
            log,
            last_event,
            last_at,
            streams,
            schema,
        })
    }
}

impl Registry {
    /// Loads every committed assignment and stream and rebuilds the allocation tree;
    /// `primary` names the stream new keys balance on, overriding the database's choice.
    pub async fn open(
        store: Store,
        keyspace: Keyspace,
        primary: Option<String>,
    ) -> Result<Arc<Registry>, Error> {
        let started = Instant::now();
        let synced = vouch::Synced::new();
        synced.note(started);
        store.bind_keyspace(keyspace.bits()).await?;
        lineage::check(&store).await?;
        let Table {
            alloc,
            accounts,
            log,
            last_event,
            last_at,
            streams,
            schema,
        } = Table::load(&store, keyspace).await?;
        tracing::info!(
            accounts = accounts.len(),
            switching = accounts.switching(),
            streams = streams.len(),
            %log,
            last_event,
            elapsed_ms = started.elapsed().as_millis() as u64,
            "rebuilt allocation tree from the database"
        );
        let registry = Arc::new(Registry {
            store,
            keyspace,
            accounts: RwLock::new(accounts),
            streams: RwLock::new(BTreeMap::new()),
            writer: tokio::sync::Mutex::new(Writer {
                alloc,
                log,
                last_event,
                last_at,
                pending_primary: None,
                tx_started: None,
            }),
            group: std::sync::OnceLock::new(),
            metrics: Default::default(),
            lease_join_batch: DEFAULT_JOIN_BATCH_MS.into(),
            load_tolerance: ControllerConfig::default().load_tolerance.to_bits().into(),
            md5_cache: Default::default(),
            schema: 0.into(),
            follow_failing: Default::default(),
            load_config: Default::default(),
            applied: tokio::sync::watch::Sender::new(LogHead {
                log,
                ..Default::default()
            }),
            synced,
            offset: Default::default(),
            reshard_wake: Default::default(),
        });
        registry.note_schema(schema);
        registry.db_clock().await?;
        registry.keep_lineage();
        let w = registry.writer.lock().await;
        registry.count_applied(&w, last_event);
        drop(w);
        let queues = registry.start_group_commit();
        registry.group.set(queues).expect("set once");
        registry.reload_streams(&mut *registry.writer.lock().await, streams)?;
        registry.choose_primary(primary).await?;
        Ok(registry)
    }

    pub fn keyspace(&self) -> Keyspace {
        self.keyspace
    }

    /// The committed assignment of `account`, from memory.
    pub fn lookup(&self, account: &str) -> Option<Assignment> {
        let accounts = self.accounts.read().expect("accounts lock poisoned");
        let (id, held) = accounts.get_key_value(account)?;
        Some(assignment(id.clone(), held))
    }

    /// As [`Registry::lookup`], answering with the given id instead of a copy of the
    /// map's (the lookup route's path); the id comes back when the account has no key.
    pub fn lookup_id(&self, account: AccountId) -> Result<Assignment, AccountId> {
        let held = self
            .accounts
            .read()
            .expect("accounts lock poisoned")
            .get(account.as_str());
        match held {
            Some(held) => Ok(assignment(account, held)),
            None => Err(account),
        }
    }

    /// Whether some account holds `key`.
    pub async fn is_held(&self, key: HashKey) -> bool {
        self.writer.lock().await.alloc.weight(key).is_some()
    }

    /// Number of accounts held (an account that fans out counts once).
    pub fn len(&self) -> usize {
        self.accounts.read().expect("accounts lock poisoned").len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Gives `account` its `fanout` hash keys, spread, or answers the ones it has.
    ///
    /// Decided against the database like every change, never from memory alone: another
    /// replica may have released the account a moment ago.
    pub async fn allocate(
        self: &Arc<Self>,
        account: AccountId,
        weight: u64,
        fanout: u32,
        actor: &Actor,
        ticket: &Ticket,
    ) -> Result<Allocated, Error> {
        keyspace::check_shares(weight, fanout)?;
        let request = NewAccount {
            account,
            weight,
            fanout,
            key: None,
        };
        self.allocate_in_group((request, actor.clone(), ticket.clone()))
            .await
    }

    /// Gives each account a hash key (the walk's pick, or the one it brings), or answers
    /// the one it has, in one transaction: all or nothing. Accounts must be distinct.
    pub async fn allocate_many(
        self: &Arc<Self>,
        requests: Vec<NewAccount>,
        actor: &Actor,
        ticket: &Ticket,
    ) -> Result<Vec<Allocated>, Error> {
        let requests = (requests.into_iter())
            .map(|r| (r, actor.clone(), ticket.clone()))
            .collect();
        self.allocate_each(requests, true).await
    }

    /// [`Registry::allocate_many`], each request made by its own actor, with its own
    /// ticket (the requests of several clients committed together).
    pub(super) async fn allocate_each(
        self: &Arc<Self>,
        requests: Vec<(NewAccount, Actor, Ticket)>,
        batch: bool,
    ) -> Result<Vec<Allocated>, Error> {
        let this = Arc::clone(self);
        detached(async move {
            let mut w = this.writer.lock().await;
            this.writable()?;
            let tickets: Vec<&Ticket> = requests.iter().map(|(.., t)| t).collect();
            if !tickets.iter().all(|t| t.wanted()) {
                return Err(Error::NotMade);
            }
            // An answer kept for an Idempotency-Key is written with the change, so keyed
            // requests take the transaction below.
            let keyed = tickets.iter().any(|t| t.keep().is_some());
            let mut now = this.decision_time().await?;
            // Mostly the log is where this process last saw it: pick from memory and write
            // it all in one round trip (or, when every account had a key, check in one
            // round trip that the log has not moved). If another writer got in first, or
            // the database refuses a key (another replica's pending old key, by the
            // database's clock), catch up and pick again inside a transaction that holds
            // the write lock.
            let (answers, new, actors) = this.pick(&mut w, &requests, now)?;
            let started = Instant::now();
            let written = if keyed {
                None
            } else if new.is_empty() {
                Some(this.unmoved_since(&w).await.map(|()| Vec::new()))
            } else if ticket::commit_all(&tickets).is_err() {
                return Err(Error::NotMade);
            } else {
                // The statement commits by itself: this was the commit point.
                let by = Actors::Each(&actors);
                let written = (this.store)
                    .insert_if_current(position(&w), &new, by, now)
                    .await;
                if !matches!(written, Ok(_) | Err(StoreError::OutcomeUnknown(_))) {
                    tickets.iter().for_each(|t| t.rolled_back());
                }
                Some(written)
            };
            let accounts = |new: &[KeyRow]| new.iter().filter(|r| r.index == 0).count();
            let (answers, new, ids) = match written {
                Some(Ok(_)) if new.is_empty() => return Ok(answers),
                Some(Ok(ids)) => {
                    this.count_committed(started, Committed::Allocations(accounts(&new)));
                    (answers, new, ids)
                }
                None | Some(Err(StoreError::LogMoved | StoreError::Conflict)) => {
                    let (mut tx, at) = this.begin(&mut w).await?;
                    now = at;
                    let (answers, new, actors) = this.pick(&mut w, &requests, now)?;
                    if new.is_empty() && !keyed {
                        return Ok(answers);
                    }
                    let ids = tx.insert_many(&new, Actors::Each(&actors), now).await?;
                    if batch {
                        let (_, actor, ticket) = &requests[0];
                        ticket.keep_in(&mut tx, actor, Ok(&answers), now).await?;
                    } else {
                        for ((_, actor, ticket), answer) in requests.iter().zip(&answers) {
                            ticket.keep_in(&mut tx, actor, Ok(answer), now).await?;
                        }
                    }
                    let what = Committed::Allocations(accounts(&new));
                    this.commit(&mut w, tx, what, &tickets).await?;
                    (answers, new, ids)
                }
                Some(Err(err)) => return Err(err.into()),
            };
            this.apply_events(&mut w, allocated(ids, new, now))?;
            Ok(answers)
        })
        .await
    }

    /// The time a decision made outside a write transaction picks and logs by: the
    /// database's clock as last measured while no staged switch is due by it, else the
    /// database's clock read now, since only it may free a key.
    async fn decision_time(&self) -> Result<i64, Error> {
        let measured = self.offset.now();
        if self.switch_due(measured) {
            self.db_clock().await
        } else {
            Ok(measured)
        }
    }

    /// Remembers the database's schema version, saying once why changes are refused when
    /// a newer keyspread migrated the database.
    fn note_schema(&self, found: i64) {
        use std::sync::atomic::Ordering;
        let known = self.store.known_schema();
        let before = self.schema.swap(found, Ordering::Relaxed);
        if found > known && before <= known {
            tracing::error!(
                found,
                known,
                "the database was migrated by a newer keyspread: this one refuses every change; upgrade it"
            );
        }
    }

    /// Refuses a change when the database's schema is newer than this keyspread knows: its
    /// rules (which keys are held, say) may be ones this release cannot keep.
    pub(super) fn writable(&self) -> Result<(), Error> {
        let found = self.schema.load(std::sync::atomic::Ordering::Relaxed);
        let known = self.store.known_schema();
        if found > known {
            return Err(Error::SchemaNewer { found, known });
        }
        Ok(())
    }

    /// Whether the database's log is still the one memory follows, ending where memory has
    /// applied it: then memory is the database's current state. [`StoreError::LogMoved`]
    /// otherwise.
    async fn unmoved_since(&self, w: &Writer) -> Result<(), StoreError> {
        let check = self.store.log_check(w.last_event).await?;
        if check.end == position(w) && log::found(w, check) == log::Found::Same {
            Ok(())
        } else {
            Err(StoreError::LogMoved)
        }
    }

    /// Picks keys for the accounts without any, as if they came one by one (each new key
    /// steers the next pick), and answers what each request gets with the key rows to
    /// write and each row's actor. The tree is left as it was: the committed events update
    /// it.
    fn pick(
        &self,
        w: &mut Writer,
        requests: &[(NewAccount, Actor, Ticket)],
        now: i64,
    ) -> Result<Picked, Error> {
        self.end_switches(w, now)?;
        let mut answers = Vec::with_capacity(requests.len());
        let mut new: Vec<KeyRow> = Vec::new();
        let mut actors: Vec<Actor> = Vec::new();
        let mut failed = None;
        for (request, actor, _) in requests {
            if let Some(existing) = self.lookup(request.account.as_str()) {
                answers.push(Allocated::Existing(existing));
                continue;
            }
            match place(&mut w.alloc, request) {
                Ok(keys) => {
                    let a = Assignment {
                        account: request.account.clone(),
                        hash_keys: HashKeys::from_vec(keys),
                        weight: request.weight,
                        created_at: now,
                        switching: Vec::new(),
                        max_fanout: None,
                    };
                    new.extend(a.rows());
                    actors.resize(new.len(), actor.clone());
                    answers.push(Allocated::Created(a));
                }
                Err(err) => {
                    failed = Some(err);
                    break;
                }
            }
        }
        for row in &new {
            w.alloc.remove(row.hash_key).expect("held a moment ago");
        }
        match failed {
            Some(err) => Err(err.into()),
            None => Ok((answers, new, actors)),
        }
    }

    /// Frees `account`'s hash key.
    ///
    /// Whether it has one is decided in the write transaction, after catching up with the
    /// other writers: an account another replica just allocated is found.
    pub async fn release(
        self: &Arc<Self>,
        account: AccountId,
        actor: &Actor,
        ticket: &Ticket,
    ) -> Result<Assignment, Error> {
        self.release_in_group((account, actor.clone(), ticket.clone()))
            .await
    }

    /// Frees each account's hash key in one transaction, each released by its own actor;
    /// answers each account's released assignment, or that it had none. Accounts must be
    /// distinct.
    pub(super) async fn release_many(
        self: &Arc<Self>,
        accounts: Vec<(AccountId, Actor, Ticket)>,
    ) -> Result<Vec<Result<Assignment, Error>>, Error> {
        let this = Arc::clone(self);
        detached(async move {
            let mut w = this.writer.lock().await;
            let tickets: Vec<Ticket> = accounts.iter().map(|(.., t)| t.clone()).collect();
            if !tickets.iter().all(Ticket::wanted) {
                return Err(Error::NotMade);
            }
            let (mut tx, at) = this.begin(&mut w).await?;
            let mut answers = Vec::with_capacity(accounts.len());
            let mut gone: Vec<KeyRow> = Vec::new();
            let mut actors: Vec<Actor> = Vec::new();
            let mut released = 0;
            let asked: Vec<Actor> = accounts.iter().map(|(_, actor, _)| actor.clone()).collect();
            for (account, actor, _) in accounts {
                match this.lookup(account.as_str()) {
                    Some(a) => {
                        // Highest index first: every moment's keys are `0..k`.
                        gone.extend(held_rows(&w.alloc, &a).into_iter().rev());
                        actors.resize(gone.len(), actor);
                        answers.push(Ok(a));
                        released += 1;
                    }
                    None => answers.push(Err(Error::NotFound(account))),
                }
            }
            if gone.is_empty() {
                return Ok(answers);
            }
            let ids = tx.delete_many(&gone, Actors::Each(&actors), at).await?;
            for ((ticket, actor), answer) in tickets.iter().zip(&asked).zip(&answers) {
                ticket.keep_in(&mut tx, actor, answer.as_ref(), at).await?;
            }
            let tickets: Vec<&Ticket> = tickets.iter().collect();
            (this.commit(&mut w, tx, Committed::Releases(released), &tickets)).await?;
            let events = ids.into_iter().zip(gone).map(|(id, row)| Event {
                id,
                at,
                change: Change::Release {
                    account: row.account,
                    index: row.index,
                    key: row.hash_key,
                },
            });
            this.apply_events(&mut w, events.collect())?;
            Ok(answers)
        })
        .await
    }

    /// Changes `account`'s weight, its fanout, its cap on a fanout raised by load
    /// (`Some(None)` clears it), or several; key `i` stays for every `i` below both fanouts.
    /// Growing adds keys where the spread rule allows; shrinking releases the keys with
    /// index at or above the new fanout; moves this makes are logged with `reason`. One
    /// transaction, one event per key.
    pub async fn update(
        self: &Arc<Self>,
        account: AccountId,
        change: Update,
        actor: &Actor,
        ticket: &Ticket,
    ) -> Result<Assignment, Error> {
        self.update_placed(account, change, None, actor, ticket)
            .await
    }

    /// [`Registry::update`], a growth's new keys placed by `by_load` when given (each on the
    /// least-loaded shard of the primary map its account leaves open) rather than by count.
    pub async fn update_placed(
        self: &Arc<Self>,
        account: AccountId,
        change: Update,
        by_load: Option<LoadPlacement>,
        actor: &Actor,
        ticket: &Ticket,
    ) -> Result<Assignment, Error> {
        let this = Arc::clone(self);
        let (actor, ticket) = (actor.clone(), ticket.clone());
        detached(async move {
            let mut w = this.writer.lock().await;
            if !ticket.wanted() {
                return Err(Error::NotMade);
            }
            let (mut tx, at) = this.begin(&mut w).await?;
            let mut a = this
                .lookup(account.as_str())
                .ok_or(Error::NotFound(account))?;
            let weight = change.weight.unwrap_or(a.weight);
            let fanout = change.fanout.unwrap_or(a.fanout());
            keyspace::check_shares(weight, fanout)?;
            let cap = change.max_fanout.unwrap_or(a.max_fanout);
            match (cap, change.max_fanout) {
                (Some(cap), Some(_)) if fanout > cap => {
                    return Err(Error::FanoutCap(format!(
                        "max_fanout {cap} is below the fanout {fanout}"
                    )));
                }
                (Some(cap), None) if fanout > cap => {
                    return Err(Error::FanoutCap(format!(
                        "fanout {fanout} is above max_fanout {cap}: raise or clear max_fanout first"
                    )));
                }
                _ => {}
            }
            let cap_change = change.max_fanout.filter(|&cap| cap != a.max_fanout);
            if (weight, fanout) == (a.weight, a.fanout()) {
                let Some(cap) = cap_change else {
                    return Ok(a);
                };
                let id = tx
                    .set_max_fanout(a.account.as_str(), cap, &actor, at)
                    .await?;
                a.max_fanout = cap;
                ticket.keep_in(&mut tx, &actor, Ok(&a), at).await?;
                (this.commit(&mut w, tx, Committed::Reweight, &[&ticket])).await?;
                let change = Change::MaxFanout {
                    account: a.account.clone(),
                    max_fanout: cap,
                };
                this.apply_events(&mut w, vec![Event { id, at, change }])?;
                return Ok(a);
            }
            if let Some(switch_at) = (a.switching.iter())
                .filter(|s| s.from.is_none() && s.switch_at > at)
                .map(|s| s.switch_at)
                .max()
                && fanout != a.fanout()
            {
                return Err(Error::FanoutGrowing {
                    account: a.account,
                    switch_at,
                });
            }
            let held = held_rows(&w.alloc, &a);
            let kept = held.len().min(fanout as usize);
            let share = |i: usize| keyspace::key_weight(weight, fanout, i as u32);
            let gone: Vec<KeyRow> = held[kept..].iter().rev().cloned().collect();
            let reweighted: Vec<KeyRow> = held[..kept]
                .iter()
                .filter(|row| row.weight != share(row.index as usize))
                .map(|row| KeyRow {
                    weight: share(row.index as usize),
                    ..row.clone()
                })
                .collect();
            let mut keys: Vec<HashKey> = held[..kept].iter().map(|r| r.hash_key).collect();
            let weights: Vec<u64> = (kept..fanout as usize).map(share).collect();
            // While kept keys switch, new keys spread against the keys now and after it;
            // one that cannot be both switches too, at the last of their switches.
            let switching: Vec<Switch> = (a.switching.iter())
                .filter(|s| (s.index as usize) < kept)
                .copied()
                .collect();
            let mut takes_over_at = None;
            // No new key (a weight or a shrink): nothing to place. (A raised fanout's new
            // keys, still waiting for their switch, are not in force: spreading against
            // the keys in force would find fewer than those kept.)
            let new_keys: Vec<(HashKey, HashKey)> = match switching.is_empty() {
                _ if weights.is_empty() => Vec::new(),
                true => {
                    match by_load {
                        Some(LoadPlacement {
                            mut shard_loads,
                            key_load,
                            new_keys_after_ms,
                        }) => {
                            takes_over_at = (new_keys_after_ms > 0 && fanout as usize > kept)
                                .then_some(at + new_keys_after_ms);
                            w.alloc.extend_by_load(
                                &mut keys,
                                &weights,
                                &mut shard_loads,
                                key_load,
                            )?
                        }
                        None => w.alloc.extend_keys(&mut keys, &weights)?,
                    }
                    keys[kept..].iter().map(|&k| (k, k)).collect()
                }
                false => {
                    let now = a.keys_at(at).keys;
                    let now = &now.as_slice()[..kept];
                    let new_keys = w.alloc.extend_switching(now, &keys, &weights)?;
                    keys.extend(new_keys.iter().map(|&(_, after)| after));
                    new_keys
                }
            };
            let added: Vec<KeyRow> = (new_keys.iter().enumerate())
                .map(|(n, &(key, _))| KeyRow {
                    account: a.account.clone(),
                    index: (kept + n) as u32,
                    hash_key: key,
                    weight: weights[n],
                    created_at: at,
                })
                .collect();
            let switch_at = switching.iter().map(|s| s.switch_at).max().unwrap_or(at);
            let staged: Vec<keyspace::Move> = (added.iter().zip(&new_keys))
                .filter(|(_, (now, after))| now != after)
                .map(|(row, &(from, to))| keyspace::Move {
                    account: row.account.to_string(),
                    index: row.index,
                    from,
                    to,
                    from_shard: w.alloc.balanced_map().map_or(0, |m| m.index_of(from)),
                    to_shard: w.alloc.balanced_map().map_or(0, |m| m.index_of(to)),
                    weight: row.weight,
                })
                .collect();
            for &(now, after) in &new_keys {
                w.alloc.remove(after).expect("held a moment ago");
                if now != after {
                    w.alloc.unreserve(now).expect("reserved a moment ago");
                }
            }
            let mut events = Vec::with_capacity(gone.len() + reweighted.len() + added.len());
            let ids = tx.delete_many(&gone, Actors::One(&actor), at).await?;
            events.extend(ids.into_iter().zip(&gone).map(|(id, row)| Event {
                id,
                at,
                change: Change::Release {
                    account: row.account.clone(),
                    index: row.index,
                    key: row.hash_key,
                },
            }));
            let ids = tx.reweight(&reweighted, &actor, at).await?;
            events.extend(ids.into_iter().zip(&reweighted).map(|(id, row)| Event {
                id,
                at,
                change: Change::Reweight {
                    account: row.account.clone(),
                    index: row.index,
                    weight: row.weight,
                },
            }));
            let ids = tx.insert_many(&added, Actors::One(&actor), at).await?;
            if let Some(switch_at) = takes_over_at {
                let staged: Vec<(&str, u32, i64)> = (ids.iter().zip(&added))
                    .map(|(&id, row)| (row.account.as_str(), row.index, id))
                    .collect();
                tx.stage_new_keys(&staged, switch_at).await?;
            }
            events.extend(ids.into_iter().zip(&added).map(|(id, row)| Event {
                id,
                at,
                change: Change::Allocate {
                    account: row.account.clone(),
                    index: row.index,
                    key: row.hash_key,
                    weight: row.weight,
                    switch_at: takes_over_at,
                },
            }));
            let ids = tx
                .apply_moves(&staged, &actor, at, switch_at, change.reason)
                .await?;
            events.extend(ids.into_iter().zip(&staged).map(|(id, m)| Event {
                id,
                at,
                change: Change::Move {
                    account: a.account.clone(),
                    index: m.index,
                    from: m.from,
                    to: m.to,
                    switch_at,
                    reason: Some(change.reason),
                },
            }));
            if let Some(cap) = cap_change {
                let id = tx
                    .set_max_fanout(a.account.as_str(), cap, &actor, at)
                    .await?;
                let change = Change::MaxFanout {
                    account: a.account.clone(),
                    max_fanout: cap,
                };
                events.push(Event { id, at, change });
            }
            let updated = Assignment {
                account: a.account,
                hash_keys: HashKeys::from_vec(keys),
                weight,
                created_at: a.created_at,
                switching: (switching.into_iter())
                    .chain(staged.iter().map(|m| Switch {
                        index: m.index,
                        from: Some(m.from),
                        switch_at,
                    }))
                    .chain(takes_over_at.into_iter().flat_map(|switch_at| {
                        added.iter().map(move |row| Switch {
                            index: row.index,
                            from: None,
                            switch_at,
                        })
                    }))
                    .collect(),
                max_fanout: cap,
            };
            ticket.keep_in(&mut tx, &actor, Ok(&updated), at).await?;
            (this.commit(&mut w, tx, Committed::Reweight, &[&ticket])).await?;
            this.apply_events(&mut w, events)?;
            Ok(updated)
        })
        .await
    }

    /// Whether a staged switch is due by `now` (Unix milliseconds).
    fn switch_due(&self, now: i64) -> bool {
        let accounts = self.accounts.read().expect("accounts lock poisoned");
        accounts.next_switch().is_some_and(|at| at <= now)
    }

    /// Ends the staged moves whose switch is due by `now` (Unix milliseconds): their old
    /// keys become free. Every decision that picks keys runs this first with the time it
    /// logs, and every replica folds each event the same way (see `follow::fold`), so the
    /// event log replays to the same picks.
    fn end_switches(&self, w: &mut Writer, now: i64) -> Result<(), Error> {
        if !self.switch_due(now) {
            return Ok(());
        }
        let mut accounts = self.accounts.write().expect("accounts lock poisoned");
        follow::end_due(&mut w.alloc, &mut accounts, now)
    }

    /// Staged moves still pending at `now` (Unix milliseconds) with event id above
    /// `after`, by event id, from the database: up to `limit`.
    pub async fn moves(
        &self,
        after: i64,
        now: i64,
        limit: u32,
    ) -> Result<Vec<crate::store::PendingMove>, Error> {
        Ok(self.store.moves(after, now, i64::from(limit)).await?)
    }

    /// Up to `limit` assignments after `after`, by account, from the database.
    /// At most `max_keys` keys in all; the flag says whether that bound ended the list.
    pub async fn list(
        &self,
        after: Option<&str>,
        limit: u32,
        max_keys: u32,
    ) -> Result<(Vec<Assignment>, bool), Error> {
        Ok(self.store.list(after, limit, max_keys).await?)
    }

    /// Ends every long-poll of the log now and each later one at once: the server drains.
    pub fn end_long_polls(&self) {
        self.applied.send_modify(|a| a.draining = true);
    }

    /// Longest a change is waited for before its client is told the database cannot take
    /// it, if the database needs such a bound (see [`Store::change_timeout`]).
    pub fn change_timeout(&self) -> Option<std::time::Duration> {
        self.store.change_timeout()
    }

    /// Whether this replica answers lookups truthfully: it follows the log, or has been out
    /// of touch with the database for no longer than `max_age` (lookups' own rule, see
    /// [`Registry::vouch`]). One that cannot apply the log while the database answers
    /// would answer a past state: not ready after [`follow::FOLLOW_GRACE`].
    pub async fn ready(&self, max_age: Duration) -> bool {
        let failing = *self.follow_failing.lock().expect("follow lock poisoned");
        if failing.is_some_and(|since| since.elapsed() >= follow::FOLLOW_GRACE) {
            let answers = tokio::time::timeout(vouch::VOUCH, self.store.ping()).await;
            if matches!(answers, Ok(Ok(()))) {
                return false;
            }
        }
        self.vouch(max_age).await.is_ok()
    }

    /// Whether a change can commit now, counted in the metrics by what was found. A
    /// database that takes longer than [`WRITABLE_WAIT`] to say (a cut network drops
    /// packets rather than refuse them) counts as unreachable.
    pub async fn writes_ready(&self) -> Result<(), Unwritable> {
        let found = tokio::time::timeout(WRITABLE_WAIT, self.store.writable())
            .await
            .unwrap_or(Err(Unwritable::Unreachable));
        self.metrics.outages.note(found);
        found
    }
}

/// Longest [`Registry::writes_ready`] waits for the database: a balancer must hear in time.
const WRITABLE_WAIT: Duration = Duration::from_secs(2);

/// Runs a change on its own task, so a client that disconnects or times out cannot cancel
/// it between the database commit and the in-memory update.
pub(crate) async fn detached<T: Send + 'static>(
    change: impl Future<Output = T> + Send + 'static,
) -> T {
    tokio::spawn(change)
        .await
        .expect("registry change panicked")
}

/// Where memory at `w` stands in the log.
fn position(w: &Writer) -> LogEnd {
    LogEnd {
        log_id: w.log,
        end: w.last_event,
    }
}

fn assignment(account: AccountId, held: Held) -> Assignment {
    Assignment {
        account,
        hash_keys: held.keys,
        weight: held.weight,
        created_at: held.created_at,
        switching: held.switching,
        max_fanout: held.max_fanout,
    }
}

/// The rows that store `a`, each with the weight its key holds in the tree.
fn held_rows(alloc: &Allocator, a: &Assignment) -> Vec<KeyRow> {
    let mut rows = a.rows();
    for row in &mut rows {
        if let Some(weight) = alloc.weight(row.hash_key) {
            row.weight = weight;
        }
    }
    rows
}

/// Places `request`'s keys (its own key 0, if it brings one) and holds them.
fn place(alloc: &mut Allocator, request: &NewAccount) -> Result<Vec<HashKey>, keyspace::Error> {
    let weights: Vec<u64> = (0..request.fanout)
        .map(|i| keyspace::key_weight(request.weight, request.fanout, i))
        .collect();
    let Some(key) = request.key else {
        return alloc.allocate_keys(&weights);
    };
    alloc.insert(key, weights[0])?;
    let mut keys = vec![key];
    if let Err(err) = alloc.extend_keys(&mut keys, &weights[1..]) {
        alloc.remove(key).expect("held a moment ago");
        return Err(err);
    }
    Ok(keys)
}

pub(crate) fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// The events that logged `rows`, newly allocated at `at`, under `ids`.
fn allocated(ids: Vec<i64>, rows: Vec<KeyRow>, at: i64) -> Vec<Event> {
    let events = ids.into_iter().zip(rows).map(|(id, row)| Event {
        id,
        at,
        change: Change::Allocate {
            account: row.account,
            index: row.index,
            key: row.hash_key,
            weight: row.weight,
            switch_at: None,
        },
    });
    events.collect()
}
