//! The registry: the committed table mirrored in memory, and the one path every change takes.
//!
//! Lookups read an in-memory map and never wait on the database. Changes are serialized by
//! one writer lock, committed to the store first, and only then applied in memory and
//! answered, so a key reaches a client only once the row holding it is durable.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use md5::{Digest, Md5};

use crate::keyspace::{
    self, AccountId, Allocator, HashKey, Holding, Keyspace, Load, Plan, ShardMap,
};
use crate::store::{Assignment, Store, StoreError};

/// Why a registry operation failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("account {0} has no hash key")]
    NotFound(AccountId),
    #[error(transparent)]
    Keyspace(#[from] keyspace::Error),
    #[error("plan {0} no longer matches the assignments: preview again")]
    StalePlan(String),
    #[error("{0:?} is not a plan id issued by this service")]
    BadPlanId(String),
    #[error("the database refused the change because another writer changed the same rows")]
    Conflict,
    #[error(transparent)]
    Store(StoreError),
}

impl From<StoreError> for Error {
    fn from(err: StoreError) -> Self {
        match err {
            StoreError::Conflict | StoreError::Stale => Error::Conflict,
            other => Error::Store(other),
        }
    }
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

/// State only the writer touches.
#[derive(Debug)]
struct Writer {
    alloc: Allocator,
    last_event: i64,
}

/// The authoritative registry of account -> hash key.
#[derive(Debug)]
pub struct Registry {
    store: Store,
    keyspace: Keyspace,
    accounts: RwLock<HashMap<AccountId, Entry>>,
    writer: tokio::sync::Mutex<Writer>,
}

impl Registry {
    /// Loads every committed assignment and rebuilds the allocation tree.
    pub async fn open(store: Store, keyspace: Keyspace) -> Result<Arc<Registry>, Error> {
        let started = Instant::now();
        store.bind_keyspace(keyspace.bits()).await?;
        let rows = store.load().await?;
        let last_event = store.last_event_id().await?;
        let mut alloc = Allocator::new(keyspace);
        let mut accounts = HashMap::with_capacity(rows.len());
        for a in rows {
            alloc.insert(a.hash_key, a.weight)?;
            let entry = Entry {
                hash_key: a.hash_key,
                weight: a.weight,
                created_at: a.created_at,
            };
            accounts.insert(a.account, entry);
        }
        tracing::info!(
            accounts = accounts.len(),
            last_event,
            elapsed_ms = started.elapsed().as_millis() as u64,
            "rebuilt allocation tree from the database"
        );
        Ok(Arc::new(Registry {
            store,
            keyspace,
            accounts: RwLock::new(accounts),
            writer: tokio::sync::Mutex::new(Writer { alloc, last_event }),
        }))
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

    /// Number of accounts held.
    pub fn len(&self) -> usize {
        self.accounts.read().expect("accounts lock poisoned").len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Gives `account` a hash key, or answers the one it has.
    pub async fn allocate(
        self: &Arc<Self>,
        account: AccountId,
        weight: u64,
    ) -> Result<Allocated, Error> {
        if let Some(existing) = self.lookup(account.as_str()) {
            return Ok(Allocated::Existing(existing));
        }
        let this = Arc::clone(self);
        detached(async move {
            let mut w = this.writer.lock().await;
            if let Some(existing) = this.lookup(account.as_str()) {
                return Ok(Allocated::Existing(existing));
            }
            let key = w.alloc.next_key()?;
            let now = now_ms();
            let a = Assignment {
                account,
                hash_key: key,
                weight,
                created_at: now,
            };
            w.last_event = this.store.insert(&a, now).await?;
            w.alloc.insert(key, weight)?;
            this.put(&a);
            Ok(Allocated::Created(a))
        })
        .await
    }

    /// Frees `account`'s hash key.
    pub async fn release(self: &Arc<Self>, account: AccountId) -> Result<Assignment, Error> {
        let this = Arc::clone(self);
        detached(async move {
            let mut w = this.writer.lock().await;
            let a = this
                .lookup(account.as_str())
                .ok_or(Error::NotFound(account))?;
            w.last_event = this.store.delete(&a, now_ms()).await?;
            w.alloc.remove(a.hash_key)?;
            this.accounts
                .write()
                .expect("accounts lock poisoned")
                .remove(a.account.as_str());
            Ok(a)
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
            let mut a = this
                .lookup(account.as_str())
                .ok_or(Error::NotFound(account))?;
            if a.weight == weight {
                return Ok(a);
            }
            a.weight = weight;
            w.last_event = this.store.reweight(&a, now_ms()).await?;
            w.alloc.set_weight(a.hash_key, weight)?;
            this.put(&a);
            Ok(a)
        })
        .await
    }

    /// Up to `limit` assignments after `after`, by account, from the database.
    pub async fn list(&self, after: Option<&str>, limit: u32) -> Result<Vec<Assignment>, Error> {
        Ok(self.store.list(after, limit).await?)
    }

    /// Accounts and weight per shard of `map`.
    pub async fn loads(&self, map: &ShardMap) -> Vec<Load> {
        let w = self.writer.lock().await;
        map.iter()
            .map(|s| w.alloc.load_in(s.start, s.end))
            .collect()
    }

    /// Accounts and weight per shard had the account names been MD5-hashed by Kinesis.
    pub fn md5_loads(&self, map: &ShardMap) -> Vec<Load> {
        let mut loads = vec![Load::default(); map.len()];
        let accounts = self.accounts.read().expect("accounts lock poisoned");
        for (id, e) in accounts.iter() {
            let shard = map.index_of(keyspace::md5_hash(id.as_str(), self.keyspace));
            loads[shard] = loads[shard] + Load::one(e.weight);
        }
        loads
    }

    /// Plans a rebalance over `map` without changing anything.
    pub async fn preview(&self, map: &ShardMap) -> (String, Plan) {
        let mut w = self.writer.lock().await;
        let plan = self.plan(&mut w.alloc, map);
        (plan_id(w.last_event, map, &plan), plan)
    }

    /// Applies the plan `id` names, if nothing changed since it was previewed.
    pub async fn apply(self: &Arc<Self>, id: String) -> Result<Plan, Error> {
        let (event, shards) = parse_plan_id(&id).ok_or_else(|| Error::BadPlanId(id.clone()))?;
        let map =
            ShardMap::uniform(self.keyspace, shards).map_err(|_| Error::BadPlanId(id.clone()))?;
        let this = Arc::clone(self);
        detached(async move {
            let mut w = this.writer.lock().await;
            if w.last_event != event {
                return Err(Error::StalePlan(id));
            }
            let plan = this.plan(&mut w.alloc, &map);
            if plan_id(w.last_event, &map, &plan) != id {
                return Err(Error::StalePlan(id));
            }
            if plan.moves.is_empty() {
                return Ok(plan);
            }
            w.last_event = this.store.apply_moves(&plan.moves, now_ms()).await?;
            plan.apply(&mut w.alloc)?;
            let mut accounts = this.accounts.write().expect("accounts lock poisoned");
            for m in &plan.moves {
                if let Some(e) = accounts.get_mut(m.account.as_str()) {
                    e.hash_key = m.to;
                }
            }
            drop(accounts);
            Ok(plan)
        })
        .await
    }

    /// Whether the database answers.
    pub async fn ready(&self) -> bool {
        self.store.ping().await.is_ok()
    }

    fn plan(&self, alloc: &mut Allocator, map: &ShardMap) -> Plan {
        let accounts = self.accounts.read().expect("accounts lock poisoned");
        let holdings = accounts.iter().map(|(id, e)| Holding {
            account: id.as_str(),
            key: e.hash_key,
            weight: e.weight,
            created_at: e.created_at,
        });
        keyspace::plan(alloc, map, holdings)
    }

    fn put(&self, a: &Assignment) {
        let entry = Entry {
            hash_key: a.hash_key,
            weight: a.weight,
            created_at: a.created_at,
        };
        self.accounts
            .write()
            .expect("accounts lock poisoned")
            .insert(a.account.clone(), entry);
    }
}

/// Runs a change on its own task, so a client that disconnects or times out cannot cancel
/// it between the database commit and the in-memory update.
async fn detached<T: Send + 'static>(change: impl Future<Output = T> + Send + 'static) -> T {
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

/// `EVENT.SHARDS.DIGEST`: the state a plan was computed on, the map, and the moves' digest.
fn plan_id(last_event: i64, map: &ShardMap, plan: &Plan) -> String {
    let mut md5 = Md5::new();
    for m in &plan.moves {
        md5.update(m.account.as_bytes());
        md5.update(m.from.to_be_bytes());
        md5.update(m.to.to_be_bytes());
    }
    let digest: [u8; 16] = md5.finalize().into();
    let short = u64::from_be_bytes(digest[..8].try_into().expect("8 bytes"));
    format!("{last_event}.{}.{short:016x}", map.len())
}

fn parse_plan_id(id: &str) -> Option<(i64, u64)> {
    let mut parts = id.split('.');
    let event = parts.next()?.parse().ok()?;
    let shards = parts.next()?.parse().ok()?;
    let digest = parts.next()?;
    (digest.len() == 16 && parts.next().is_none()).then_some((event, shards))
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}
