//! The load controller: every interval, on the primary stream, a by-load plan applied
//! under the writer lock when the busiest shard is above the tolerance band and the floor;
//! one replica acts per round (the database decides which), at most a cap of moves, no
//! account moved twice within the cooldown, each move logged with `reason: load`.

use std::collections::{HashMap, HashSet};
use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use super::{Committed, Error, Held, LoadTotals, Registry, ShardLoad, Writer};
use crate::config::ControllerConfig;
use crate::keyspace::{
    self, AccountId, Allocator, KeyLoad, LoadPlan, LoadPlanLimits, LoadSkew, ShardMap,
    plan_by_load_keys,
};
use crate::store::{Actor, Change, Event, MoveReason, Tx};

/// What one round saw and did.
#[derive(Debug, Clone, PartialEq)]
pub enum Round {
    /// No primary stream, or no report on it yet.
    NoLoad(&'static str),
    /// The busiest shard is inside the band, or below the floor.
    Balanced { skew: LoadSkew, why: &'static str },
    /// Another replica claimed this round.
    Claimed,
    /// Planned, and applied the moves (perhaps none: no move lowered the busiest shard).
    Applied {
        before: LoadSkew,
        after: LoadSkew,
        moves: usize,
    },
}

/// The skew of a stream's shard utilisations.
fn shard_skew(load: &LoadTotals) -> LoadSkew {
    let loads: Vec<f64> = load.shards.iter().map(|s| s.utilisation).collect();
    LoadSkew::of(&loads)
}

/// Each shard's utilisation, by index of `map` (at least 0; 0 for one `shards` lacks).
fn shard_utilisation(map: &ShardMap, shards: &[ShardLoad]) -> Vec<f64> {
    let index: HashMap<String, usize> = map.iter().map(|s| (s.id, s.index)).collect();
    let mut util = vec![0.0; map.len()];
    for s in shards {
        if let Some(&i) = index.get(&s.shard_id) {
            util[i] = s.utilisation.max(0.0);
        }
    }
    util
}

/// Each key of `accounts` on `map` with the load it carries. A named account's load is the
/// sum of its entries over every shard, shared evenly by its keys (its sub-keys spread
/// evenly over them): the load goes with the account, so a key that has just switched
/// carries its load to its new shard at once, while the smoothed entries there are still
/// catching up and those on its old shard still fading (the two always sum to the
/// account's rate). A shard's unexplained remainder (its utilisation less every entry
/// named there) is shared by weight among the keys measured there of accounts no report
/// names. A key a pending move is switching is measured where producers still send it and
/// counted where it goes. The sums are `load`'s, made as its rows were opened.
pub fn key_loads<'a>(
    map: &ShardMap,
    load: &LoadTotals,
    accounts: &'a [(AccountId, Held)],
) -> Vec<KeyLoad<'a>> {
    let mut remainder = shard_utilisation(map, &load.shards);
    for shard in map.iter() {
        if let Some(&left) = load.unexplained.get(&shard.id) {
            remainder[shard.index] = left;
        }
    }
    let named = &load.accounts;
    // Each key, where it is measured if its account is not named, and the unnamed weight
    // measured per shard.
    let mut keys: Vec<KeyLoad<'a>> = Vec::with_capacity(accounts.len());
    let mut unnamed: Vec<(usize, usize)> = Vec::new();
    let mut unnamed_weight = vec![0u64; map.len()];
    for (id, held) in accounts {
        let fanout = held.keys.len() as u32;
        let total = named.get(id.as_str());
        for (i, &key) in held.keys.as_slice().iter().enumerate() {
            let weight = keyspace::key_weight(held.weight, fanout, i as u32);
            if total.is_none() {
                let sent = (held.switching.iter())
                    .find(|s| s.index == i as u32)
                    .and_then(|s| s.from)
                    .unwrap_or(key);
                let measured = map.index_of(sent);
                unnamed_weight[measured] += weight;
                unnamed.push((keys.len(), measured));
            }
            keys.push(KeyLoad {
                account: id.as_str(),
                index: i as u32,
                fanout,
                key,
                weight,
                load: total.map_or(0.0, |t| t / f64::from(fanout)),
            });
        }
    }
    for (k, measured) in unnamed {
        let k = &mut keys[k];
        if unnamed_weight[measured] > 0 {
            k.load =
                remainder[measured].max(0.0) * k.weight as f64 / unnamed_weight[measured] as f64;
        }
    }
    keys
}

impl Registry {
    /// The band by-load plans stop inside: `(1 + tolerance) × mean`.
    pub fn load_tolerance(&self) -> f64 {
        f64::from_bits(self.load_tolerance.load(Ordering::Relaxed))
    }

    pub fn set_load_tolerance(&self, tolerance: f64) {
        self.load_tolerance
            .store(tolerance.to_bits(), Ordering::Relaxed);
    }

    /// Runs the controller every `config.auto_rebalance_interval_s` until the process ends.
    pub fn control(self: &Arc<Self>, config: ControllerConfig) -> tokio::task::JoinHandle<()> {
        let this = Arc::clone(self);
        tokio::spawn(async move {
            let period = Duration::from_secs(config.auto_rebalance_interval_s);
            let mut tick = tokio::time::interval(period);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            tick.tick().await;
            loop {
                tick.tick().await;
                match this.control_round(&config).await {
                    Ok(round) => this.log_round(&round),
                    Err(err) => tracing::warn!(%err, "load controller round failed"),
                }
            }
        })
    }

    fn log_round(&self, round: &Round) {
        self.metrics.controller_rounds.add(1);
        match round {
            Round::NoLoad(why) => tracing::info!(why, "load controller: nothing to do"),
            Round::Balanced { skew, why } => tracing::info!(
                max = skew.max,
                mean = skew.mean,
                max_over_mean = skew.max_over_mean,
                why,
                "load controller: nothing to do"
            ),
            Round::Claimed => {
                tracing::info!("load controller: another replica took this round")
            }
            Round::Applied {
                before,
                after,
                moves,
            } => {
                self.metrics.controller_moves.add(*moves as u64);
                let why = if *moves == 0 {
                    "no move lowers the busiest shard"
                } else {
                    "busiest shard above the band and the floor"
                };
                tracing::info!(
                    moves,
                    before_max = before.max,
                    before_max_over_mean = before.max_over_mean,
                    after_max = after.max,
                    after_max_over_mean = after.max_over_mean,
                    mean = before.mean,
                    why,
                    "load controller: moved keys by load"
                );
            }
        }
    }

    /// One round: measures the primary stream, and when its busiest shard is above the
    /// band and the floor, claims the round and applies a by-load plan under the writer
    /// lock.
    pub async fn control_round(
        self: &Arc<Self>,
        config: &ControllerConfig,
    ) -> Result<Round, Error> {
        let Some(stream) = self.primary_stream() else {
            return Ok(Round::NoLoad("no primary stream"));
        };
        let load = self.load_totals(&stream.name).await?;
        if !load.reported {
            return Ok(Round::NoLoad("no load reported on the primary stream"));
        }
        // O(accounts that opted in): off the async workers, as the round's plan is.
        // Whether a fanout comes down depends on how long its account has been cold, which
        // the round that claims keeps: an account at several keys that opted in needs one.
        // A key wider than the band cannot be balanced within it: while the stream is out
        // of the band, fanouts keep each key within the band's width.
        let share = shard_skew(&load).key_share(
            self.load_config().hot_account_share,
            config.load_tolerance,
            config.load_floor,
        );
        let this = Arc::clone(self);
        let (load, loads, fanouts) = tokio::task::spawn_blocking(move || {
            let capped = this.capped();
            let several = capped.iter().any(|&(_, fanout, ..)| fanout > 1);
            let loads = capped_loads(&load, &capped);
            let raise = any_raise(&loads, &capped, share);
            (load, loads, several || raise)
        })
        .await
        .expect("fanout decisions do not panic");
        if let Some(why) = calm(&shard_skew(&load), config)
            && !fanouts
        {
            return Ok(Round::Balanced {
                skew: shard_skew(&load),
                why,
            });
        }
        let this = Arc::clone(self);
        let interval_ms = config.auto_rebalance_interval_s as i64 * 1000;
        let name = stream.name.clone();
        let claimed = super::detached(async move {
            let mut w = this.writer.lock().await;
            let (mut tx, at) = this.begin(&mut w).await?;
            // Claimed a little before the interval is up, so that a replica's own ticks,
            // a few milliseconds early by the database's clock, still find their round.
            let Some(round) = tx.claim_round(&name, at, interval_ms * 9 / 10).await? else {
                return Ok(None);
            };
            // How long each account has been cold is the claiming round's to keep.
            let cold: HashMap<String, i64> = tx.fanout_cold().await?.into_iter().collect();
            let decided = fanout_targets(
                &loads,
                this.capped(),
                share,
                &cold,
                at,
                keyspace::COLD_HALF_LIVES * this.load_config().half_life_ms,
            );
            tx.set_fanout_cold(&decided.cold).await?;
            this.commit(&mut w, tx, Committed::Moves(0), &[]).await?;
            // Which replica ran which round, for whoever reads the replicas' logs: no number
            // is claimed twice.
            tracing::info!(round, at, stream = %name, "load controller: round claimed");
            Ok::<_, Error>(Some(decided.changes))
        })
        .await?;
        let Some(fanouts) = claimed else {
            return Ok(Round::Claimed);
        };
        // Fanouts first: a raise's new keys go where the load is least now, and the plan
        // below counts them where they go (their accounts, switching, stay put).
        let new_keys_after_ms = config.switch_after_ms.unwrap_or(60_000);
        self.change_fanouts(&load, fanouts, new_keys_after_ms).await;
        let skew = shard_skew(&load);
        if let Some(why) = calm(&skew, config) {
            return Ok(Round::Balanced { skew, why });
        }
        // The plan weighs keys by the load read above, not read again under the writer's
        // lock: a whole stream's load is the round's largest read (0.17 s at a million
        // accounts), smoothed over minutes, and writes wait while the lock is held. The
        // keys, pending moves and new keys it weighs are the writer's own, current.
        let this = Arc::clone(self);
        let config = config.clone();
        super::detached(async move {
            let mut w = this.writer.lock().await;
            let (mut tx, at) = this.begin(&mut w).await?;
            let cooldown_from = at - config.move_cooldown_s as i64 * 1000;
            let cooling = tx.moved_by_load_since(cooldown_from).await?;
            let plan =
                (this.plan_by_load_locked(&mut w, &stream.map, load, cooling, &config)).await?;
            let (before, after) = (plan.before, plan.after);
            // Never worse than leaving it off: a plan that does not lower the busiest shard
            // applies nothing.
            let moves = if plan.after.max < plan.before.max {
                plan.moves
            } else {
                Vec::new()
            };
            let n = moves.len();
            let switch_at = at + config.switch_after_ms.unwrap_or(60_000);
            let by = Actor::controller();
            (this.apply_staged(&mut w, tx, at, switch_at, moves, MoveReason::Load, &by)).await?;
            Ok::<_, Error>(Round::Applied {
                before,
                after: if n == 0 { before } else { after },
                moves: n,
            })
        })
        .await
    }

    /// Every account that opted in with `max_fanout`: (account, fanout, weight, cap).
    fn capped(&self) -> Vec<(AccountId, u32, u64, u32)> {
        self.accounts
            .read()
            .expect("accounts lock poisoned")
            .capped()
    }

    /// Sets each account's fanout (and its weight, at least the fanout), logging each. New
    /// keys go to the least-utilised shards their account leaves open, each counting its
    /// share of the account's load there for the next, and take over `new_keys_after_ms`
    /// later (staged, as moves are). An account with a key still switching waits for a
    /// later round.
    async fn change_fanouts(
        self: &Arc<Self>,
        load: &LoadTotals,
        changes: Vec<(AccountId, u32, u64)>,
        new_keys_after_ms: i64,
    ) {
        let map = self.primary_stream().map(|stream| stream.map);
        let mut utilisation = map.as_ref().map(|map| shard_utilisation(map, &load.shards));
        let now = super::now_ms();
        for (account, fanout, weight) in changes {
            let switching = self
                .lookup(account.as_str())
                .is_some_and(|a| a.switching.iter().any(|s| s.switch_at > now));
            if switching {
                continue;
            }
            let change = super::Update {
                weight: Some(weight),
                fanout: Some(fanout),
                max_fanout: None,
                reason: MoveReason::Load,
            };
            let total = load.accounts.get(account.as_str()).unwrap_or(0.0);
            let key_load = total / f64::from(fanout);
            let before = self
                .lookup(account.as_str())
                .map_or(0, |a| a.fanout() as usize);
            let by_load = utilisation.clone().map(|shard_loads| super::LoadPlacement {
                shard_loads,
                key_load,
                new_keys_after_ms,
            });
            let by = Actor::controller();
            let unbounded = super::Ticket::unbounded();
            match (self.update_placed(account.clone(), change, by_load, &by, &unbounded)).await {
                Ok(a) => {
                    if let (Some(util), Some(map)) = (&mut utilisation, &map) {
                        for key in a.hash_keys.as_slice().iter().skip(before) {
                            util[map.index_of(*key)] += key_load;
                        }
                    }
                    self.metrics.controller_fanouts.add(1);
                    tracing::info!(%account, fanout, "load controller: changed a fanout by load");
                }
                Err(err) => {
                    tracing::warn!(%account, fanout, %err, "load controller: fanout not changed")
                }
            }
        }
    }

    /// Plans by load over `map` for every account as it is at the writer's state, leaving
    /// the tree as it was. Accounts with pending moves or in `cooling` do not move. The
    /// O(keys) work runs on a blocking thread that owns its inputs (the tree taken out of
    /// the writer and put back), so a round never holds an async worker.
    async fn plan_by_load_locked(
        self: &Arc<Self>,
        w: &mut Writer,
        map: &ShardMap,
        load: LoadTotals,
        cooling: Vec<String>,
        config: &ControllerConfig,
    ) -> Result<LoadPlan, Error> {
        let mut alloc = std::mem::replace(&mut w.alloc, Allocator::new(self.keyspace));
        let (this, map, config) = (Arc::clone(self), map.clone(), config.clone());
        let (alloc, plan) = tokio::task::spawn_blocking(move || {
            let plan = catch_unwind(AssertUnwindSafe(|| {
                let accounts = this.accounts_copy();
                plan_round(&mut alloc, &map, &load, &accounts, &cooling, &config)
            }));
            (alloc, plan)
        })
        .await
        .expect("a planning thread returns its tree");
        w.alloc = alloc;
        Ok(plan.unwrap_or_else(|panicked| resume_unwind(panicked)))
    }

    /// Applies `moves` staged (switching at `switch_at`) in `tx`, logged with `reason` as
    /// `actor`'s, and commits (with whatever else `tx` holds: a round's claim, a job's end).
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn apply_staged(
        &self,
        w: &mut Writer,
        mut tx: Tx,
        at: i64,
        switch_at: i64,
        moves: Vec<keyspace::Move>,
        reason: MoveReason,
        actor: &Actor,
    ) -> Result<(), Error> {
        let ids = (tx.apply_moves(&moves, actor, at, switch_at, reason)).await?;
        self.commit(w, tx, Committed::Moves(moves.len()), &[])
            .await?;
        let events = ids
            .into_iter()
            .zip(&moves)
            .map(|(id, m)| {
                let change = Change::Move {
                    account: AccountId::parse(m.account.clone())?,
                    index: m.index,
                    from: m.from,
                    to: m.to,
                    switch_at,
                    reason: Some(reason),
                };
                Ok(Event { id, at, change })
            })
            .collect::<Result<Vec<_>, Error>>()?;
        self.apply_events(w, events)
    }
}

/// What a round decides for the accounts that opted in with `max_fanout`.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct FanoutDecision {
    /// (account, new fanout, weight) to set.
    pub changes: Vec<(AccountId, u32, u64)>,
    /// The accounts at several keys cold now, with since when (Unix milliseconds): the
    /// rows to keep.
    pub cold: Vec<(String, i64)>,
}

/// Each of the `capped` accounts' load: the sum of its entries in `load`, over every
/// shard (0 when none names it). O(capped accounts).
pub fn capped_loads(
    load: &LoadTotals,
    capped: &[(AccountId, u32, u64, u32)],
) -> HashMap<String, f64> {
    (capped.iter())
        .map(|(id, ..)| {
            let total = load.accounts.get(id.as_str()).unwrap_or(0.0);
            (id.to_string(), total)
        })
        .collect()
}

/// The fanouts to change of the `capped` accounts (account, fanout, weight, cap), by their
/// `loads` (see [`capped_loads`]; one missing carries none), each decided by
/// [`keyspace::fanout_target`] over `share`; an account cold since `cold_since` says, or
/// from `now`, needs `cold_for_ms` cold to come down. Pure, O(capped accounts).
pub fn fanout_targets(
    loads: &HashMap<String, f64>,
    capped: Vec<(AccountId, u32, u64, u32)>,
    share: f64,
    cold_since: &HashMap<String, i64>,
    now: i64,
    cold_for_ms: i64,
) -> FanoutDecision {
    let mut decided = FanoutDecision::default();
    for (id, fanout, weight, cap) in capped {
        let load = loads.get(id.as_str()).copied().unwrap_or(0.0);
        let since = cold_since.get(id.as_str()).copied().unwrap_or(now);
        let target = keyspace::fanout_target(
            load,
            fanout,
            cap,
            share,
            now.saturating_sub(since),
            cold_for_ms,
        );
        if target == fanout && keyspace::fanout_cold(load, fanout, share) {
            decided.cold.push((id.to_string(), since));
        }
        if target != fanout {
            decided
                .changes
                .push((id, target, weight.max(u64::from(target))));
        }
    }
    decided
}

/// Whether any of the `capped` accounts' fanouts goes up at `share` (see
/// [`fanout_targets`]).
fn any_raise(
    loads: &HashMap<String, f64>,
    capped: &[(AccountId, u32, u64, u32)],
    share: f64,
) -> bool {
    capped.iter().any(|(id, fanout, _, cap)| {
        let load = loads.get(id.as_str()).copied().unwrap_or(0.0);
        keyspace::fanout_target(load, *fanout, *cap, share, 0, i64::MAX) > *fanout
    })
}

/// One round's plan, pure: each key's load (see [`key_loads`]), then a by-load plan over
/// `map` of at most the round's cap of moves (`--max-moves-per-round`, else 1 % of the
/// accounts), leaving `alloc` as it was. Accounts with a pending move or in `cooling`
/// stay. O(keys); public so its cost can be measured alone.
pub fn plan_round(
    alloc: &mut Allocator,
    map: &ShardMap,
    load: &LoadTotals,
    accounts: &[(AccountId, Held)],
    cooling: &[String],
    config: &ControllerConfig,
) -> LoadPlan {
    let keys = key_loads(map, load, accounts);
    let mut frozen: HashSet<&str, foldhash::fast::RandomState> =
        super::rebalance::pending(accounts).into_iter().collect();
    frozen.extend(cooling.iter().map(String::as_str));
    let cap = config
        .max_moves_per_round
        .map_or((accounts.len() / 100).max(1), |n| n as usize);
    let limits = LoadPlanLimits {
        tolerance: config.load_tolerance,
        max_moves: cap,
    };
    plan_by_load_keys(alloc, map, &keys, &|k| frozen.contains(k.account), limits)
}

/// Why a stream of this skew needs no round, if it does not.
fn calm(skew: &LoadSkew, config: &ControllerConfig) -> Option<&'static str> {
    if skew.max <= config.load_floor {
        Some("busiest shard below the floor")
    } else if skew.max <= (1.0 + config.load_tolerance) * skew.mean {
        Some("busiest shard inside the band")
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keyspace::{HashKey, Keyspace, Rate};
    use crate::registry::{AccountLoad, StreamLoad};
    use crate::store::load::LoadSource;
    use crate::store::{HashKeys, Switch};

    fn held(keys: &[u128], weight: u64, switching: Vec<Switch>) -> Held {
        let keys: Vec<HashKey> = keys.iter().map(|&k| HashKey(k)).collect();
        Held {
            keys: HashKeys::from_vec(keys),
            weight,
            created_at: 0,
            switching,
            max_fanout: None,
        }
    }

    fn rate() -> Rate {
        Rate {
            records_per_s: 0.0,
            bytes_per_s: 0.0,
            at_ms: 0,
        }
    }

    #[test]
    fn keys_carry_their_accounts_entries_and_share_the_remainder_by_weight() {
        let map = ShardMap::uniform(Keyspace::KINESIS, 2).unwrap();
        let (s0, s1) = (1u128, (1u128 << 127) + 1);
        let accounts = vec![
            // Named on shard 0 with two keys there: they split its entry.
            (
                AccountId::parse("named".to_owned()).unwrap(),
                held(&[s0, s0 + 1], 2, vec![]),
            ),
            // Unnamed on shard 0, weights 1 and 3: the remainder 0.4 splits 0.1 / 0.3.
            (
                AccountId::parse("light".to_owned()).unwrap(),
                held(&[s0 + 2], 1, vec![]),
            ),
            (
                AccountId::parse("heavy".to_owned()).unwrap(),
                held(&[s0 + 3], 3, vec![]),
            ),
            // Moving from shard 1 to shard 0: measured on shard 1, counted on shard 0.
            (
                AccountId::parse("moving".to_owned()).unwrap(),
                held(
                    &[s0 + 4],
                    1,
                    vec![Switch {
                        index: 0,
                        from: Some(HashKey(s1)),
                        switch_at: 1,
                    }],
                ),
            ),
            // Switched from shard 1 to shard 0 a moment ago: its entry on shard 1 still
            // fades, the one on shard 0 grows.
            (
                AccountId::parse("switched".to_owned()).unwrap(),
                held(&[s0 + 5], 1, vec![]),
            ),
        ];
        let shard = |id: &str, utilisation| ShardLoad {
            shard_id: id.into(),
            rate: rate(),
            utilisation,
            source: Some(LoadSource::Consumers),
        };
        let entry = |account: &str, shard_id: &str, load| AccountLoad {
            account: account.into(),
            shard_id: shard_id.into(),
            rate: rate(),
            load,
        };
        let load = StreamLoad {
            shards: vec![
                shard("shardId-000000000000", 1.1),
                shard("shardId-000000000001", 0.8),
            ],
            accounts: vec![
                entry("named", "shardId-000000000000", 0.6),
                entry("moving", "shardId-000000000001", 0.5),
                entry("switched", "shardId-000000000001", 0.3),
                entry("switched", "shardId-000000000000", 0.1),
            ],
            reported: true,
        };
        let keys = key_loads(&map, &LoadTotals::summed(&load), &accounts);
        let of = |account: &str, index: u32| {
            let k = keys
                .iter()
                .find(|k| k.account == account && k.index == index)
                .unwrap();
            (k.key, k.load)
        };
        assert!((of("named", 0).1 - 0.3).abs() < 1e-9);
        assert!((of("named", 1).1 - 0.3).abs() < 1e-9);
        assert!((of("light", 0).1 - 0.1).abs() < 1e-9);
        assert!((of("heavy", 0).1 - 0.3).abs() < 1e-9);
        let (key, moving) = of("moving", 0);
        assert_eq!(key, HashKey(s0 + 4), "counted where it goes");
        assert!(
            (moving - 0.5).abs() < 1e-9,
            "measured where it is sent: {moving}"
        );
        let (key, switched) = of("switched", 0);
        assert_eq!(key, HashKey(s0 + 5));
        assert!(
            (switched - 0.4).abs() < 1e-9,
            "its fading entry on the old shard goes with it: {switched}"
        );
    }

    #[test]
    fn a_fanout_comes_down_only_after_it_was_cold_long_enough_and_nearly_idle() {
        let id = |a: &str| AccountId::parse(a.to_owned()).unwrap();
        // (account, fanout, weight, cap): "raised" holds 3 keys, "single" one.
        let capped = || vec![(id("raised"), 3, 3, 4), (id("single"), 1, 1, 4)];
        // Its entries on every shard add up; others' are not summed.
        let entry = |account: &str, shard_id: &str, load| AccountLoad {
            account: account.into(),
            shard_id: shard_id.into(),
            rate: rate(),
            load,
        };
        let reported = StreamLoad {
            shards: Vec::new(),
            accounts: vec![
                entry("other", "s0", 5.0),
                entry("raised", "s0", 1.5),
                entry("raised", "s1", 0.4),
            ],
            reported: true,
        };
        let loads = capped_loads(&LoadTotals::summed(&reported), &capped());
        assert_eq!(loads.len(), 2);
        assert!((loads["raised"] - 1.9).abs() < 1e-9 && loads["single"] == 0.0);
        let (share, cold_for) = (0.5, 10_000);
        let none = HashMap::new();
        let decide = |load: f64, since: &HashMap<String, i64>, now: i64| {
            let loads = HashMap::from([("raised".to_owned(), load)]);
            fanout_targets(&loads, capped(), share, since, now, cold_for)
        };

        // Hot: raised to what its load suggests, within the cap; nothing cold.
        let hot = fanout_targets(&loads, capped(), share, &none, 0, cold_for);
        assert_eq!(hot.changes, vec![(id("raised"), 4, 4)]);
        assert!(hot.cold.is_empty());

        // Idle and first found cold now: cold from now, kept; one key is never cold.
        let first = decide(0.0, &none, 5_000);
        assert_eq!(first.changes, vec![]);
        assert_eq!(first.cold, vec![("raised".to_owned(), 5_000)]);

        // Cold since then: kept until ten half-lives have passed, then one key.
        let since: HashMap<String, i64> = first.cold.iter().cloned().collect();
        let early = decide(0.0, &since, 14_999);
        assert_eq!((early.changes.len(), early.cold), (0, first.cold.clone()));
        let due = decide(0.0, &since, 15_000);
        assert_eq!(due.changes, vec![(id("raised"), 1, 3)]);
        assert!(due.cold.is_empty());

        // Long cold but still carrying records: kept (a shrink reorders its sub-keys).
        assert_eq!(decide(0.1, &since, 60_000).changes, vec![]);

        // Hot again: its time cold starts over.
        assert!(decide(1.2, &since, 16_000).cold.is_empty());
    }
}
