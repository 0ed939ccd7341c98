//! Accounts written back with every key they held, and every switch they were waiting
//! for: `keyspread import` of a snapshot; and the other keys of CSV rows that brought key
//! 0 of several. Logged like any other change (allocations, then the staged moves), so
//! replicas and mirrors following the log see them.

use std::collections::HashSet;
use std::sync::Arc;

use super::{Error, Registry, detached, metrics::Committed};
use crate::keyspace::{self, AccountId, Allocator, HashKey};
use crate::store::{Actor, Actors, Assignment, Change, Event, KeyRow, MoveReason};

/// An account as a snapshot line gives it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Restored {
    pub account: AccountId,
    /// The account's weight, shared by its keys as every account's is.
    pub weight: u64,
    /// The keys producers send now, by index.
    pub keys: Vec<HashKey>,
    /// The keys producers send from a pending switch on, by index, and when (Unix
    /// milliseconds): a key that differs moves there; keys past `keys` take over then.
    pub next: Option<(Vec<HashKey>, i64)>,
    pub max_fanout: Option<u32>,
    /// When the account was first allocated (Unix milliseconds), kept from the snapshot;
    /// `None`: the time of the import.
    pub created_at: Option<i64>,
}

/// What one [`Registry::restore`] did. When `refused` is not empty it wrote nothing.
#[derive(Debug, Default)]
pub struct RestoreChunk {
    /// Accounts written.
    pub written: u64,
    /// Keys they hold (pending old keys not counted).
    pub keys: u64,
    /// Keys whose switch is still ahead, kept staged.
    pub pending: u64,
    /// Accounts the database already held just so.
    pub present: u64,
    pub refused: Vec<(AccountId, String)>,
}

/// A CSV row that brought key 0 of several keys: `keyspread import` places that key alone,
/// at its share of the weight, then grows the account to its fanout.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grow {
    pub account: AccountId,
    /// The key 0 the row brought.
    pub key: HashKey,
    /// The account's weight once it holds every key.
    pub weight: u64,
    pub fanout: u32,
}

impl Grow {
    /// Whether `held` is the account as the row's import left it before growing it: key
    /// 0 alone, at its share of the weight, nothing switching.
    fn waits_for_its_keys(&self, held: &Assignment) -> bool {
        held.hash_keys.as_slice() == [self.key]
            && held.weight == keyspace::key_weight(self.weight, self.fanout, 0)
            && held.switching.is_empty()
    }
}

/// How the table holds a restored account at some moment.
struct Placed {
    /// Each key's row, by index: the old key of a pending move until its switch.
    rows: Vec<HashKey>,
    /// The keys from the switch on, if it is still ahead.
    switch: Option<(Vec<HashKey>, i64)>,
}

impl Restored {
    /// The keys as of `now` (Unix milliseconds): a switch whose time has come is simply
    /// the new keys.
    fn placed(&self, now: i64) -> Placed {
        match &self.next {
            Some((next, switch_at)) if *switch_at > now => Placed {
                rows: self.keys.clone(),
                switch: Some((next.clone(), *switch_at)),
            },
            Some((next, _)) => Placed {
                rows: next.clone(),
                switch: None,
            },
            None => Placed {
                rows: self.keys.clone(),
                switch: None,
            },
        }
    }

    /// Every key the account holds at `now`: its keys, and the new ones a pending switch
    /// names.
    pub fn held_keys(&self, now: i64) -> Vec<HashKey> {
        let placed = self.placed(now);
        let mut keys = placed.rows;
        if let Some((next, _)) = placed.switch {
            for key in next {
                if !keys.contains(&key) {
                    keys.push(key);
                }
            }
        }
        keys
    }

    /// Whether `held` is this account as of `now`: the same weight, cap, keys in force,
    /// and switch ahead.
    pub fn matches(&self, held: &Assignment, now: i64) -> bool {
        let placed = self.placed(now);
        let at = held.keys_at(now);
        let next = at.next.map(|n| (n.keys.as_slice().to_vec(), n.switch_at));
        held.weight == self.weight
            && held.max_fanout == self.max_fanout
            && at.keys.as_slice() == placed.rows.as_slice()
            && next == placed.switch
    }
}

impl Registry {
    /// Writes `accounts` back with their keys, in one transaction: every key by index, and
    /// every switch still ahead by the database's clock staged with its time. An account
    /// the database already holds just so is left as it is; one held otherwise, or a key
    /// another account holds, refuses the whole group (nothing is written). Every event
    /// records `actor`.
    pub async fn restore(
        self: &Arc<Self>,
        accounts: Vec<Restored>,
        actor: &Actor,
    ) -> Result<RestoreChunk, Error> {
        let (this, actor) = (Arc::clone(self), actor.clone());
        detached(async move {
            let mut w = this.writer.lock().await;
            this.writable()?;
            let (mut tx, at) = this.begin(&mut w).await?;
            let mut done = RestoreChunk::default();
            let mut claimed = HashSet::new();
            let mut rows: Vec<KeyRow> = Vec::new();
            // Per new row: when it takes over, if it is a key a switch adds.
            let mut takes_over: Vec<Option<i64>> = Vec::new();
            let mut moves: Vec<(AccountId, Vec<keyspace::Move>, i64)> = Vec::new();
            let mut caps = Vec::new();
            for r in &accounts {
                if let Some(held) = this.lookup(r.account.as_str()) {
                    if r.matches(&held, at) {
                        done.present += 1;
                    } else {
                        let why = "is already present with other keys, weight or max_fanout";
                        done.refused.push((r.account.clone(), why.into()));
                    }
                    continue;
                }
                if let Some(key) = (r.held_keys(at).into_iter())
                    .find(|&k| w.alloc.weight(k).is_some() || !claimed.insert(k))
                {
                    let why = format!("hash key {key} is already held by another account");
                    done.refused.push((r.account.clone(), why));
                    continue;
                }
                let placed = r.placed(at);
                let fanout = placed
                    .switch
                    .as_ref()
                    .map_or(placed.rows.len(), |s| s.0.len());
                let share = |i: usize| keyspace::key_weight(r.weight, fanout as u32, i as u32);
                let mut moved = Vec::new();
                for i in 0..fanout {
                    let now = placed.rows.get(i).copied();
                    let after = placed.switch.as_ref().map(|(next, _)| next[i]);
                    let key = now.or(after).expect("a key now or after the switch");
                    rows.push(KeyRow {
                        account: r.account.clone(),
                        index: i as u32,
                        hash_key: key,
                        weight: share(i),
                        created_at: r.created_at.unwrap_or(at),
                    });
                    let switch_at = placed.switch.as_ref().map(|s| s.1);
                    takes_over.push(switch_at.filter(|_| now.is_none()));
                    if let (Some(from), Some(to)) = (now, after)
                        && from != to
                    {
                        let shard = |k| w.alloc.balanced_map().map_or(0, |m| m.index_of(k));
                        moved.push(keyspace::Move {
                            account: r.account.to_string(),
                            index: i as u32,
                            from,
                            to,
                            from_shard: shard(from),
                            to_shard: shard(to),
                            weight: share(i),
                        });
                    }
                }
                done.written += 1;
                done.keys += fanout as u64;
                done.pending += (moved.len() + (fanout - placed.rows.len())) as u64;
                if let (false, Some((_, switch_at))) = (moved.is_empty(), &placed.switch) {
                    moves.push((r.account.clone(), moved, *switch_at));
                }
                if let Some(cap) = r.max_fanout {
                    caps.push((r.account.clone(), cap));
                }
            }
            if !done.refused.is_empty() {
                // Dropped without a commit: nothing of the group is written.
                return Ok(done);
            }
            let mut events = Vec::with_capacity(rows.len() + moves.len() + caps.len());
            let ids = tx.insert_many(&rows, Actors::One(&actor), at).await?;
            // A key a switch adds takes over at its own account's switch.
            for ((&id, row), switch_at) in ids.iter().zip(&rows).zip(&takes_over) {
                if let Some(switch_at) = switch_at {
                    let staged = [(row.account.as_str(), row.index, id)];
                    tx.stage_new_keys(&staged, *switch_at).await?;
                }
            }
            events.extend(ids.iter().zip(&rows).zip(&takes_over).map(
                |((&id, row), &switch_at)| Event {
                    id,
                    at,
                    change: Change::Allocate {
                        account: row.account.clone(),
                        index: row.index,
                        key: row.hash_key,
                        weight: row.weight,
                        switch_at,
                    },
                },
            ));
            for (account, moved, switch_at) in &moves {
                let ids = tx
                    .apply_moves(moved, &actor, at, *switch_at, MoveReason::Admin)
                    .await?;
                events.extend(ids.into_iter().zip(moved).map(|(id, m)| Event {
                    id,
                    at,
                    change: Change::Move {
                        account: account.clone(),
                        index: m.index,
                        from: m.from,
                        to: m.to,
                        switch_at: *switch_at,
                        reason: Some(MoveReason::Admin),
                    },
                }));
            }
            for (account, cap) in caps {
                let id = (tx.set_max_fanout(account.as_str(), Some(cap), &actor, at)).await?;
                let change = Change::MaxFanout {
                    account,
                    max_fanout: Some(cap),
                };
                events.push(Event { id, at, change });
            }
            let what = Committed::Allocations(done.written as usize);
            this.commit(&mut w, tx, what, &[]).await?;
            events.sort_unstable_by_key(|e| e.id);
            this.apply_events(&mut w, events)?;
            Ok(done)
        })
        .await
    }
}

impl Registry {
    /// Gives each account of `grow` that still holds key 0 alone (see [`Grow`]) its keys
    /// `1..fanout`, in one transaction, as if one after another: each new key steers the
    /// next pick, so the keys do not depend on how the accounts are split into calls.
    /// Every other account is left as it is. The new keys share the account's created_at.
    pub async fn grow_imported(
        self: &Arc<Self>,
        grow: Vec<Grow>,
        actor: &Actor,
    ) -> Result<u64, Error> {
        let (this, actor) = (Arc::clone(self), actor.clone());
        detached(async move {
            let mut w = this.writer.lock().await;
            this.writable()?;
            let (mut tx, at) = this.begin(&mut w).await?;
            let (rows, grown) = this.pick_grown(&mut w.alloc, &grow)?;
            if rows.is_empty() {
                return Ok(0);
            }
            let ids = tx.insert_many(&rows, Actors::One(&actor), at).await?;
            this.commit(&mut w, tx, Committed::Reweight, &[]).await?;
            this.apply_events(&mut w, super::allocated(ids, rows, at))?;
            Ok(grown)
        })
        .await
    }

    /// The key rows that grow each account of `grow` still waiting for its keys, picked
    /// one account after another, and how many accounts they grow. `alloc` is left as it
    /// was: the committed events hold the keys (as every allocation's do).
    fn pick_grown(
        &self,
        alloc: &mut Allocator,
        grow: &[Grow],
    ) -> Result<(Vec<KeyRow>, u64), Error> {
        let mut rows: Vec<KeyRow> = Vec::new();
        let mut grown = 0;
        let mut failed = None;
        for g in grow {
            let Some(held) = self.lookup(g.account.as_str()) else {
                continue;
            };
            if !g.waits_for_its_keys(&held) {
                continue;
            }
            let share = |i: u32| keyspace::key_weight(g.weight, g.fanout, i);
            let weights: Vec<u64> = (1..g.fanout).map(share).collect();
            let mut keys = vec![g.key];
            if let Err(err) = alloc.extend_keys(&mut keys, &weights) {
                failed = Some(err);
                break;
            }
            grown += 1;
            rows.extend((1..g.fanout).zip(&keys[1..]).map(|(i, &key)| KeyRow {
                account: g.account.clone(),
                index: i,
                hash_key: key,
                weight: share(i),
                created_at: held.created_at,
            }));
        }
        for row in &rows {
            alloc.remove(row.hash_key).expect("held a moment ago");
        }
        match failed {
            Some(err) => Err(err.into()),
            None => Ok((rows, grown)),
        }
    }
}
