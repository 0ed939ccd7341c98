//! Rebalance plans and per-shard loads through the registry: previewed on a copy of the
//! state taken under the writer lock, named by an id that pins that state, applied in one
//! transaction.
//!
//! The read-only views here (previews, loads) block their thread: the HTTP layer runs them
//! on blocking threads, and they hold the writer lock only to copy out what they read.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use md5::{Digest, Md5};

use super::controller::key_loads;
use super::{Committed, Error, Held, LoadTotals, Registry, Ticket, Writer, detached, now_ms};
use crate::keyspace::{
    self, AccountId, Allocator, HashKey, Holding, KeyLoad, Load, LoadPlan, LoadPlanLimits,
    LoadSkew, Plan, ShardMap, plan_by_load,
};
use crate::store::{Actor, Change, Event, MoveReason};

/// Which shard map a request means: a uniform map of N shards, or a registered stream's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MapSpec {
    Uniform(u64),
    Stream(String),
}

impl MapSpec {
    /// How a plan id spells the map: `N` or `stream:NAME`.
    fn to_id_part(&self) -> String {
        match self {
            MapSpec::Uniform(n) => n.to_string(),
            MapSpec::Stream(name) => format!("stream:{name}"),
        }
    }

    fn from_id_part(text: &str) -> Option<MapSpec> {
        match text.strip_prefix("stream:") {
            Some(name) => Some(MapSpec::Stream(name.to_owned())),
            None => text.parse().ok().map(MapSpec::Uniform),
        }
    }
}

impl Registry {
    /// The shard map `spec` names.
    pub fn resolve(&self, spec: &MapSpec) -> Result<Arc<ShardMap>, Error> {
        match spec {
            MapSpec::Uniform(n) => Ok(Arc::new(ShardMap::uniform(self.keyspace, *n)?)),
            MapSpec::Stream(name) => self
                .stream(name)
                .map(|s| s.map)
                .ok_or_else(|| Error::UnknownStream(name.clone())),
        }
    }

    /// Plans a rebalance over the map `spec` names, changing nothing. Blocks: the state is
    /// copied under the writer lock (the tree's arrays and the accounts, O(accounts)), the
    /// plan is made on the copy after releasing it.
    ///
    /// Accounts with a staged move still to switch are planned where they go, and not moved
    /// again.
    pub fn preview(&self, spec: &MapSpec) -> Result<(String, Plan), Error> {
        let (map, mut alloc, mut accounts, last_event) = {
            let w = self.writer.blocking_lock();
            let map = self.resolve(spec)?;
            let accounts = self.accounts.read().expect("accounts lock poisoned");
            let accounts: Vec<(AccountId, Held)> = accounts
                .iter()
                .map(|(id, held)| (id.clone(), held))
                .collect();
            (map, w.alloc.clone(), accounts, w.last_event)
        };
        // Switches due by this host's clock are planned as ended, on the copies only: only
        // a write transaction, by the database's clock, frees a key (the apply plans again
        // there, and a different plan is refused as stale).
        let now = now_ms();
        for (_, held) in &mut accounts {
            for switch in held.switching.extract_if(.., |s| s.switch_at <= now) {
                if let Some(from) = switch.from {
                    alloc.unreserve(from)?;
                }
            }
        }
        let plan = plan_for(
            &mut alloc,
            &map,
            accounts.iter().map(|(id, held)| (id, held.clone())),
        );
        Ok((plan_id(last_event, spec, &plan), plan))
    }

    /// Every held key with its weight, in key order: one O(keys) copy under the writer
    /// lock. Blocks.
    pub fn keys(&self) -> Vec<(HashKey, u64)> {
        self.writer.blocking_lock().alloc.iter().collect()
    }

    /// Accounts and weight per shard of `map`: O(shards × log keys) under the writer lock.
    /// Blocks.
    pub fn loads(&self, map: &ShardMap) -> Vec<Load> {
        let w = self.writer.blocking_lock();
        map.iter()
            .map(|s| w.alloc.load_in(s.start, s.end))
            .collect()
    }

    /// The `n` accounts of most weight, heaviest first (ties by account id), as lookups
    /// answer them: one pass over the accounts under their read lock.
    pub fn heaviest(&self, n: usize) -> Vec<crate::store::Assignment> {
        let accounts = self.accounts.read().expect("accounts lock poisoned");
        accounts
            .heaviest(n)
            .into_iter()
            .map(|(id, held)| super::assignment(id, held))
            .collect()
    }

    /// Applies the plan `id` names, staging its moves: each account keeps its old key until
    /// `switch_after_ms` from now, then switches. When anything changed since the preview,
    /// refuses it as stale, or with `replan` plans again under the writer lock and applies
    /// at most as many moves as the preview had.
    pub async fn apply(
        self: &Arc<Self>,
        id: String,
        switch_after_ms: i64,
        replan: bool,
        actor: &Actor,
        ticket: &Ticket,
    ) -> Result<Applied, Error> {
        let parsed = PlanId::parse(&id).ok_or_else(|| Error::BadPlanId(id.clone()))?;
        let map = self.resolve(&parsed.spec).map_err(|e| match e {
            Error::Keyspace(_) => Error::BadPlanId(id.clone()),
            other => other,
        })?;
        let (this, actor, ticket) = (Arc::clone(self), actor.clone(), ticket.clone());
        detached(async move {
            let mut w = this.writer.lock().await;
            if !ticket.wanted() {
                return Err(Error::NotMade);
            }
            let (mut tx, at) = this.begin(&mut w).await?;
            // Any change, a stream's map included, here or on another replica, moves the
            // event id on.
            if w.last_event != parsed.event && !replan {
                return Err(Error::StalePlan(id));
            }
            let switch_at = at + switch_after_ms;
            let (plan, fresh) = match &parsed.spec {
                MapSpec::Stream(name) if parsed.by_load => {
                    let load = tx.load_totals(name, at, &this.load_config()).await?;
                    this.end_switches(&mut w, at)?;
                    let accounts = this.accounts_copy();
                    let limits = this.admin_load_limits(&accounts);
                    let keys = key_loads(&map, &load, &accounts);
                    let frozen = pending(&accounts);
                    let mut plan = plan_by_load(&mut w.alloc, &map, &keys, &frozen, limits);
                    let fresh = load_plan_id(w.last_event, name, &plan.moves);
                    if plan.moves.len() > parsed.moves {
                        truncate_load(&mut plan, parsed.moves, &map, &keys);
                    }
                    let id = load_plan_id(w.last_event, name, &plan.moves);
                    let counted = Counted::of(&w.alloc, &map, &plan, limits.tolerance);
                    (Planned::Load(plan, counted), (fresh, id))
                }
                _ => {
                    let mut plan = this.plan(&mut w, &map, at)?;
                    let fresh = plan_id(w.last_event, &parsed.spec, &plan);
                    if plan.moves.len() > parsed.moves {
                        let loads = map
                            .iter()
                            .map(|s| w.alloc.load_in(s.start, s.end))
                            .collect();
                        truncate(&mut plan, parsed.moves, loads);
                    }
                    let id = plan_id(w.last_event, &parsed.spec, &plan);
                    (Planned::Count(plan), (fresh, id))
                }
            };
            let replanned = fresh.0 != id;
            if replanned && !replan {
                return Err(Error::StalePlan(id));
            }
            let applied = Applied {
                plan_id: fresh.1,
                plan,
                switch_at,
                replanned,
            };
            if applied.plan.moves().is_empty() {
                return Ok(applied);
            }
            let moves = applied.plan.moves();
            let ids = tx
                .apply_moves(moves, &actor, at, switch_at, MoveReason::Admin)
                .await?;
            ticket.keep_in(&mut tx, &actor, Ok(&applied), at).await?;
            let what = Committed::Moves(moves.len());
            this.commit(&mut w, tx, what, &[&ticket]).await?;
            let events = ids
                .into_iter()
                .zip(moves)
                .map(|(id, m)| {
                    let change = Change::Move {
                        account: AccountId::parse(m.account.clone())?,
                        index: m.index,
                        from: m.from,
                        to: m.to,
                        switch_at,
                        reason: Some(MoveReason::Admin),
                    };
                    Ok(Event { id, at, change })
                })
                .collect::<Result<Vec<_>, Error>>()?;
            this.apply_events(&mut w, events)?;
            Ok(applied)
        })
        .await
    }

    /// Plans by observed `load` over stream `name`'s map, changing nothing: as
    /// [`Registry::preview`], with the keys' loads as `key_loads` weighs them. Blocks.
    pub fn preview_by_load(
        &self,
        name: &str,
        load: &LoadTotals,
    ) -> Result<(String, Planned), Error> {
        let spec = MapSpec::Stream(name.to_owned());
        let (map, mut alloc, mut accounts, last_event) = {
            let w = self.writer.blocking_lock();
            let map = self.resolve(&spec)?;
            (map, w.alloc.clone(), self.accounts_copy(), w.last_event)
        };
        let now = now_ms();
        for (_, held) in &mut accounts {
            for switch in held.switching.extract_if(.., |s| s.switch_at <= now) {
                if let Some(from) = switch.from {
                    alloc.unreserve(from)?;
                }
            }
        }
        let limits = self.admin_load_limits(&accounts);
        let keys = key_loads(&map, load, &accounts);
        let plan = plan_by_load(&mut alloc, &map, &keys, &pending(&accounts), limits);
        let counted = Counted::of(&alloc, &map, &plan, limits.tolerance);
        let id = load_plan_id(last_event, name, &plan.moves);
        Ok((id, Planned::Load(plan, counted)))
    }

    /// Every account with its keys: one O(accounts) copy under their read lock.
    pub(super) fn accounts_copy(&self) -> Vec<(AccountId, Held)> {
        let accounts = self.accounts.read().expect("accounts lock poisoned");
        accounts
            .iter()
            .map(|(id, held)| (id.clone(), held))
            .collect()
    }

    /// An admin's by-load plan: the controller's band, as many moves as it takes.
    fn admin_load_limits(&self, accounts: &[(AccountId, Held)]) -> LoadPlanLimits {
        LoadPlanLimits {
            tolerance: self.load_tolerance(),
            max_moves: accounts.iter().map(|(_, h)| h.keys.len()).sum(),
        }
    }

    /// Plans over `map` for the accounts as they are at `now` (Unix milliseconds), leaving
    /// the tree as it was.
    pub(super) fn plan(&self, w: &mut Writer, map: &ShardMap, now: i64) -> Result<Plan, Error> {
        self.end_switches(w, now)?;
        let accounts = self.accounts.read().expect("accounts lock poisoned");
        Ok(plan_for(&mut w.alloc, map, accounts.iter()))
    }
}

/// Plans over `map` for `accounts` (every key `alloc` counts), leaving `alloc` as it was.
/// An account with a key still switching counts where its keys go, and does not move.
fn plan_for<'a>(
    alloc: &mut Allocator,
    map: &ShardMap,
    accounts: impl Iterator<Item = (&'a AccountId, Held)>,
) -> Plan {
    let settled = accounts.filter(|(_, held)| held.switching.is_empty());
    let holdings = settled.flat_map(|(id, held)| {
        let fanout = held.keys.len() as u32;
        (0..fanout).map(move |i| Holding {
            account: id.as_str(),
            index: i,
            fanout,
            key: held.keys.as_slice()[i as usize],
            weight: keyspace::key_weight(held.weight, fanout, i),
            created_at: held.created_at,
        })
    });
    keyspace::plan(alloc, map, holdings)
}

/// What an apply did: the plan it applied (named by its own id), when its moves switch
/// (Unix milliseconds), and whether it planned again because the preview had gone stale.
#[derive(Debug, Clone)]
pub struct Applied {
    pub plan_id: String,
    pub plan: Planned,
    pub switch_at: i64,
    pub replanned: bool,
}

/// A plan by count and weight, or by observed load (with what its moves do to the
/// shards' key counts).
#[derive(Debug, Clone)]
pub enum Planned {
    Count(Plan),
    Load(LoadPlan, Counted),
}

/// Keys per shard before and after a by-load plan's moves.
#[derive(Debug, Clone)]
pub struct Counted {
    pub cap: u64,
    /// Whether the plan ends with the busiest shard inside the band.
    pub complete: bool,
    pub before: keyspace::Skew,
    pub after: keyspace::Skew,
}

impl Counted {
    /// What `moves` do to the keys per shard of `map` that `alloc` holds.
    fn of(alloc: &Allocator, map: &ShardMap, plan: &LoadPlan, tolerance: f64) -> Counted {
        let moves = &plan.moves;
        let mut loads: Vec<Load> = map.iter().map(|s| alloc.load_in(s.start, s.end)).collect();
        let before = keyspace::Skew::of(&loads);
        for m in moves {
            loads[m.from_shard] = loads[m.from_shard] - Load::one(m.weight);
            loads[m.to_shard] = loads[m.to_shard] + Load::one(m.weight);
        }
        Counted {
            cap: before.accounts.div_ceil(before.shards.max(1)),
            complete: plan.after.within(tolerance),
            before,
            after: keyspace::Skew::of(&loads),
        }
    }
}

impl Planned {
    pub fn moves(&self) -> &[keyspace::Move] {
        match self {
            Planned::Count(plan) => &plan.moves,
            Planned::Load(plan, _) => &plan.moves,
        }
    }
}

/// The accounts with a move still to switch: they are planned where they go, and do not
/// move again.
pub(super) fn pending(accounts: &[(AccountId, Held)]) -> HashSet<&str> {
    (accounts.iter())
        .filter(|(_, held)| !held.switching.is_empty())
        .map(|(id, _)| id.as_str())
        .collect()
}

/// Keeps the first `n` moves of a by-load `plan`, its `after` measured from `keys`.
fn truncate_load(plan: &mut LoadPlan, n: usize, map: &ShardMap, keys: &[KeyLoad<'_>]) {
    plan.moves.truncate(n);
    let mut loads = vec![0.0; map.len()];
    let mut load_of = HashMap::new();
    for k in keys {
        loads[map.index_of(k.key)] += k.load.max(0.0);
        load_of.insert((k.account, k.index), k.load.max(0.0));
    }
    for m in &plan.moves {
        let load = load_of
            .get(&(m.account.as_str(), m.index))
            .copied()
            .unwrap_or(0.0);
        loads[m.from_shard] -= load;
        loads[m.to_shard] += load;
    }
    plan.after = LoadSkew::of(&loads);
}

/// Keeps the first `n` moves of `plan`, its `after` measured from the shards' `loads`
/// before any move.
fn truncate(plan: &mut Plan, n: usize, mut loads: Vec<Load>) {
    plan.moves.truncate(n);
    plan.mends = plan.mends.min(n);
    for m in &plan.moves {
        loads[m.from_shard] = loads[m.from_shard] - Load::one(m.weight);
        loads[m.to_shard] = loads[m.to_shard] + Load::one(m.weight);
    }
    plan.after = keyspace::Skew::of(&loads);
    plan.complete = false;
}

/// `EVENT.MAP.MOVES.DIGEST`: the state a plan was computed on, the map, how many moves it
/// makes (the most an apply that plans again may make), and the moves' digest.
pub(super) fn plan_id(last_event: i64, spec: &MapSpec, plan: &Plan) -> String {
    moves_id(last_event, &spec.to_id_part(), &plan.moves)
}

/// The id of a by-load plan over stream `name`: `EVENT.load:NAME.MOVES.DIGEST`.
fn load_plan_id(last_event: i64, name: &str, moves: &[keyspace::Move]) -> String {
    moves_id(last_event, &format!("load:{name}"), moves)
}

fn moves_id(last_event: i64, map: &str, moves: &[keyspace::Move]) -> String {
    let mut md5 = Md5::new();
    for m in moves {
        md5.update(m.account.as_bytes());
        md5.update(m.from.to_be_bytes());
        md5.update(m.to.to_be_bytes());
    }
    let digest: [u8; 16] = md5.finalize().into();
    let short = u64::from_be_bytes(digest[..8].try_into().expect("8 bytes"));
    let count = moves.len();
    format!("{last_event}.{map}.{count}.{short:016x}")
}

/// A plan id's parts.
#[derive(Debug, PartialEq)]
struct PlanId {
    event: i64,
    spec: MapSpec,
    /// Planned by observed load rather than by count and weight.
    by_load: bool,
    moves: usize,
}

impl PlanId {
    fn parse(id: &str) -> Option<PlanId> {
        let (event, rest) = id.split_once('.')?;
        let (rest, digest) = rest.rsplit_once('.')?;
        let (map, moves) = rest.rsplit_once('.')?;
        let digest_ok = digest.len() == 16 && digest.bytes().all(|b| b.is_ascii_hexdigit());
        let moves_ok = !moves.is_empty() && moves.bytes().all(|b| b.is_ascii_digit());
        (digest_ok && moves_ok).then_some(())?;
        let (spec, by_load) = match map.strip_prefix("load:") {
            Some(name) => (MapSpec::Stream(name.to_owned()), true),
            None => (MapSpec::from_id_part(map)?, false),
        };
        Some(PlanId {
            event: event.parse().ok()?,
            spec,
            by_load,
            moves: moves.parse().ok()?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plan_ids_round_trip() {
        let plan = Plan {
            cap: 0,
            moves: Vec::new(),
            mends: 0,
            before: keyspace::Skew::of(&[]),
            after: keyspace::Skew::of(&[]),
            complete: true,
        };
        for spec in [MapSpec::Uniform(7), MapSpec::Stream("orders.v2-eu".into())] {
            let id = plan_id(42, &spec, &plan);
            let parsed = PlanId {
                event: 42,
                spec,
                by_load: false,
                moves: 0,
            };
            assert_eq!(PlanId::parse(&id), Some(parsed));
        }
        for bad in [
            "",
            "1.2",
            "x.2.0000000000000000",
            "1.2.zzzzzzzzzzzzzzzz",
            "1.2.00",
            "1.2.0000000000000000",
            "1.2.x.0000000000000000",
            "1.2..0000000000000000",
        ] {
            assert_eq!(PlanId::parse(bad), None, "{bad}");
        }
    }
}
