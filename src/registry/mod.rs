//! The registry: the committed table mirrored in memory, and the one path every change takes.
//!
//! Lookups read an in-memory map and never wait on the database. Changes are serialized by
//! one writer lock, committed to the store first, and only then applied in memory and
//! answered, so a key reaches a client only once the row holding it is durable.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, RwLock};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use crate::keyspace::{self, AccountId, Allocator, HashKey, Keyspace};
use crate::store::{Assignment, Change, Event, LoggedEvent, Store, StoreError};

mod follow;
mod group;
mod metrics;
mod rebalance;
mod streams;

pub use follow::POLL;
use metrics::Committed;
pub use rebalance::MapSpec;
pub use streams::{Stream, StreamChange};

/// Why a registry operation failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("account {0} has no hash key")]
    NotFound(AccountId),
    #[error(transparent)]
    Keyspace(#[from] keyspace::Error),
    #[error("plan {0} no longer matches the assignments: preview again")]
    StalePlan(String),
    #[error("no stream named {0:?} is registered")]
    UnknownStream(String),
    #[error("{0:?} is not a plan id issued by this service")]
    BadPlanId(String),
    #[error("the database refused the change because another writer changed the same rows")]
    Conflict,
    #[error("the database is unreachable; changes are refused until it is back")]
    Unavailable,
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
            other => Error::Store(other),
        }
    }
}

/// An account to give a hash key.
#[derive(Debug, Clone)]
pub struct NewAccount {
    pub account: AccountId,
    pub weight: u64,
    /// The key it already has elsewhere (an import), or `None` for the walk's pick.
    pub key: Option<HashKey>,
}

/// What an allocation found or made.
#[derive(Debug, Clone)]
pub enum Allocated {
    Created(Assignment),
    Existing(Assignment),
}

/// An assignment as the lookup map holds it (the account is the map's key).
#[derive(Debug, Clone, Copy)]
struct Entry {
    hash_key: HashKey,
    weight: u64,
    created_at: i64,
}

/// Every account's assignment, by account. Hashed with foldhash (seeded per process) rather
/// than SipHash: a third of start-up at a million accounts was filing them, and lookups
/// hash on every request.
type Accounts = HashMap<AccountId, Entry, foldhash::quality::RandomState>;

/// State only the writer touches.
#[derive(Debug)]
struct Writer {
    alloc: Allocator,
    last_event: i64,
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
}

/// Files every stored assignment by account.
fn file(count: usize, batches: std::sync::mpsc::Receiver<Vec<Assignment>>) -> Accounts {
    let mut accounts = Accounts::with_capacity_and_hasher(count, Default::default());
    for batch in batches {
        for a in batch {
            let entry = Entry {
                hash_key: a.hash_key,
                weight: a.weight,
                created_at: a.created_at,
            };
            accounts.insert(a.account, entry);
        }
    }
    accounts
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
        store.bind_keyspace(keyspace.bits()).await?;
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
        let last_event = snapshot.last_event_id().await?;
        let streams = snapshot.load_streams().await?;
        drop(snapshot);
        let alloc = tokio::task::spawn_blocking(move || Allocator::with_keys(keyspace, keys))
            .await
            .expect("tree build")?;
        let accounts = accounts.await.expect("the filing thread answers");
        tracing::info!(
            accounts = accounts.len(),
            streams = streams.len(),
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
                last_event,
                pending_primary: None,
                tx_started: None,
            }),
            group: std::sync::OnceLock::new(),
            metrics: Default::default(),
        });
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
        let (id, e) = accounts.get_key_value(account)?;
        Some(assignment(id, e))
    }

    /// As [`Registry::lookup`], answering with the given id instead of a copy of the
    /// map's (the lookup route's path); the id comes back when the account has no key.
    pub fn lookup_id(&self, account: AccountId) -> Result<Assignment, AccountId> {
        let held = self
            .accounts
            .read()
            .expect("accounts lock poisoned")
            .get(account.as_str())
            .copied();
        match held {
            Some(e) => Ok(Assignment {
                account,
                hash_key: e.hash_key,
                weight: e.weight,
                created_at: e.created_at,
            }),
            None => Err(account),
        }
    }

    /// Whether some account holds `key`.
    pub async fn is_held(&self, key: HashKey) -> bool {
        self.writer.lock().await.alloc.weight(key).is_some()
    }

    /// Number of accounts held.
    pub fn len(&self) -> usize {
        self.accounts.read().expect("accounts lock poisoned").len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Gives `account` a hash key, or answers the one it has.
    ///
    /// Decided against the database like every change, never from memory alone: another
    /// replica may have released the account a moment ago.
    pub async fn allocate(
        self: &Arc<Self>,
        account: AccountId,
        weight: u64,
    ) -> Result<Allocated, Error> {
        let request = NewAccount {
            account,
            weight,
            key: None,
        };
        self.allocate_in_group(request).await
    }

    /// Gives each account a hash key (the walk's pick, or the one it brings), or answers
    /// the one it has, in one transaction: all or nothing. Accounts must be distinct.
    pub async fn allocate_many(
        self: &Arc<Self>,
        requests: Vec<NewAccount>,
    ) -> Result<Vec<Allocated>, Error> {
        let this = Arc::clone(self);
        detached(async move {
            let mut w = this.writer.lock().await;
            let now = now_ms();
            // Mostly the log is where this process last saw it: pick from memory and write
            // it all in one round trip (or, when every account had a key, check in one
            // round trip that the log has not moved). If another writer got in first,
            // catch up and pick again inside a transaction that holds the write lock.
            let (answers, new) = this.pick(&mut w, &requests, now)?;
            let started = Instant::now();
            let written = if new.is_empty() {
                this.unmoved_since(w.last_event).await.map(|()| Vec::new())
            } else {
                this.store.insert_if_current(w.last_event, &new, now).await
            };
            let (answers, new, ids) = match written {
                Ok(_) if new.is_empty() => return Ok(answers),
                Ok(ids) => {
                    this.count_committed(started, Committed::Allocations(new.len()));
                    (answers, new, ids)
                }
                Err(StoreError::LogMoved) => {
                    let mut tx = this.begin(&mut w).await?;
                    let (answers, new) = this.pick(&mut w, &requests, now)?;
                    if new.is_empty() {
                        return Ok(answers);
                    }
                    let ids = tx.insert_many(&new, now).await?;
                    this.commit(&mut w, tx, Committed::Allocations(new.len()))
                        .await?;
                    (answers, new, ids)
                }
                Err(err) => return Err(err.into()),
            };
            for (id, a) in ids.into_iter().zip(new) {
                let change = Change::Allocate {
                    account: a.account,
                    key: a.hash_key,
                    weight: a.weight,
                };
                this.apply_event(
                    &mut w,
                    Event {
                        id,
                        at: now,
                        change,
                    },
                )?;
            }
            Ok(answers)
        })
        .await
    }

    /// Whether the log still ends at event `seen`: then memory, which applied it that far,
    /// is the database's current state. [`StoreError::LogMoved`] otherwise.
    async fn unmoved_since(&self, seen: i64) -> Result<(), StoreError> {
        if self.store.last_event_id().await? == seen {
            Ok(())
        } else {
            Err(StoreError::LogMoved)
        }
    }

    /// Picks keys for the accounts without one, as if they came one by one (each new key
    /// steers the next pick), and answers what each request gets with the assignments to
    /// write. The tree is left as it was: the committed events update it.
    fn pick(
        &self,
        w: &mut Writer,
        requests: &[NewAccount],
        now: i64,
    ) -> Result<(Vec<Allocated>, Vec<Assignment>), Error> {
        let mut answers = Vec::with_capacity(requests.len());
        let mut new: Vec<Assignment> = Vec::new();
        let mut failed = None;
        for request in requests {
            if let Some(existing) = self.lookup(request.account.as_str()) {
                answers.push(Allocated::Existing(existing));
                continue;
            }
            let key = match request.key {
                Some(key) => Ok(key),
                None => w.alloc.next_key(),
            };
            match key.and_then(|key| w.alloc.insert(key, request.weight).map(|()| key)) {
                Ok(hash_key) => {
                    let a = Assignment {
                        account: request.account.clone(),
                        hash_key,
                        weight: request.weight,
                        created_at: now,
                    };
                    new.push(a.clone());
                    answers.push(Allocated::Created(a));
                }
                Err(err) => {
                    failed = Some(err);
                    break;
                }
            }
        }
        for a in &new {
            w.alloc.remove(a.hash_key).expect("held a moment ago");
        }
        match failed {
            Some(err) => Err(err.into()),
            None => Ok((answers, new)),
        }
    }

    /// Frees `account`'s hash key.
    ///
    /// Whether it has one is decided in the write transaction, after catching up with the
    /// other writers: an account another replica just allocated is found.
    pub async fn release(self: &Arc<Self>, account: AccountId) -> Result<Assignment, Error> {
        self.release_in_group(account).await
    }

    /// Frees each account's hash key in one transaction; answers each account's released
    /// assignment, or that it had none. Accounts must be distinct.
    pub(super) async fn release_many(
        self: &Arc<Self>,
        accounts: Vec<AccountId>,
    ) -> Result<Vec<Result<Assignment, Error>>, Error> {
        let this = Arc::clone(self);
        detached(async move {
            let mut w = this.writer.lock().await;
            let mut tx = this.begin(&mut w).await?;
            let at = now_ms();
            let mut answers = Vec::with_capacity(accounts.len());
            let mut gone = Vec::new();
            for account in accounts {
                match this.lookup(account.as_str()) {
                    Some(a) => {
                        answers.push(Ok(a.clone()));
                        gone.push(a);
                    }
                    None => answers.push(Err(Error::NotFound(account))),
                }
            }
            if gone.is_empty() {
                return Ok(answers);
            }
            let ids = tx.delete_many(&gone, at).await?;
            this.commit(&mut w, tx, Committed::Releases(gone.len()))
                .await?;
            for (id, a) in ids.into_iter().zip(gone) {
                let change = Change::Release {
                    account: a.account,
                    key: a.hash_key,
                };
                this.apply_event(&mut w, Event { id, at, change })?;
            }
            Ok(answers)
        })
        .await
    }

    /// Changes `account`'s weight; its hash key stays.
    pub async fn reweight(
        self: &Arc<Self>,
        account: AccountId,
        weight: u64,
    ) -> Result<Assignment, Error> {
        let this = Arc::clone(self);
        detached(async move {
            let mut w = this.writer.lock().await;
            let mut tx = this.begin(&mut w).await?;
            let mut a = this
                .lookup(account.as_str())
                .ok_or(Error::NotFound(account))?;
            if a.weight == weight {
                return Ok(a);
            }
            a.weight = weight;
            let at = now_ms();
            let id = tx.reweight(&a, at).await?;
            this.commit(&mut w, tx, Committed::Reweight).await?;
            let change = Change::Reweight {
                account: a.account.clone(),
                weight,
            };
            this.apply_event(&mut w, Event { id, at, change })?;
            Ok(a)
        })
        .await
    }

    /// Up to `limit` assignments after `after`, by account, from the database.
    pub async fn list(&self, after: Option<&str>, limit: u32) -> Result<Vec<Assignment>, Error> {
        Ok(self.store.list(after, limit).await?)
    }

    /// Up to `limit` events of the log after id `after`, from the database.
    pub async fn log(&self, after: i64, limit: u32) -> Result<Vec<LoggedEvent>, Error> {
        Ok(self.store.log(after, i64::from(limit)).await?)
    }

    /// Longest a change is waited for before its client is told the database cannot take
    /// it, if the database needs such a bound (see [`Store::change_timeout`]).
    pub fn change_timeout(&self) -> Option<std::time::Duration> {
        self.store.change_timeout()
    }

    /// Whether the database answers.
    pub async fn ready(&self) -> bool {
        self.store.ping().await.is_ok()
    }
}

/// Runs a change on its own task, so a client that disconnects or times out cannot cancel
/// it between the database commit and the in-memory update.
pub(crate) async fn detached<T: Send + 'static>(
    change: impl Future<Output = T> + Send + 'static,
) -> T {
    tokio::spawn(change)
        .await
        .expect("registry change panicked")
}

fn assignment(id: &AccountId, e: &Entry) -> Assignment {
    Assignment {
        account: id.clone(),
        hash_key: e.hash_key,
        weight: e.weight,
        created_at: e.created_at,
    }
}

pub(crate) fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}
