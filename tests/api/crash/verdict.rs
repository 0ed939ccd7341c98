//! What the crash test's clients were promised, checked against the database itself.

use std::collections::{BTreeMap, HashMap, HashSet};

use keyspread::keyspace::key_weight;

use super::client::{Op, Record};
use crate::helpers::{IndexedEvent, KeyRow};
use crate::replay::key;

/// One account's entry in the event log, each about its key `index`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Logged {
    Allocate(u32, u128),
    Release(u32),
    Move(u32, u128, u128),
    Reweight(u32),
}

/// The counts a run is judged by, and every broken promise.
#[derive(Debug, Default)]
pub struct Verdict {
    /// Acknowledged allocations and resizes, and of them those of several keys.
    pub acked_allocations: u64,
    pub acked_resizes: u64,
    /// Resizes that got no answer (a kill came first): the table may hold either side.
    pub unanswered_resizes: u64,
    pub acked_fanned_out: u64,
    /// Acknowledged allocations and resizes whose keys, index by index, the account held at
    /// some point of the log.
    pub found: u64,
    /// Of `found`: retried changes answered with keys a rebalance had moved since the first
    /// attempt committed (its answer lost in a kill).
    pub found_moved: u64,
    /// Acknowledged keys missing from the log, or undone without a later change attempted.
    pub lost: u64,
    /// Keys held twice, accounts whose key indexes are not `0..K`, keys not holding their
    /// share of the account's weight.
    pub duplicates: u64,
    pub gaps: u64,
    pub wrong_shares: u64,
    pub acked_releases: u64,
    /// Move events in the log, and moves answered to clients.
    pub moves: u64,
    pub acked_moves: u64,
    pub problems: Vec<String>,
}

/// One account's rows: hash keys by index, and weights.
type Rows = BTreeMap<u32, (u128, i64)>;

/// Judges `records` against the table (`account, idx, key, weight`) and the event log.
pub fn judge(records: &[Record], rows: &[KeyRow], events: &[IndexedEvent]) -> Verdict {
    let mut v = Verdict::default();
    let mut table: BTreeMap<&str, Rows> = BTreeMap::new();
    for (account, idx, k, w, ..) in rows {
        let held = table.entry(account.as_str()).or_default();
        if held.insert(*idx as u32, (key(k), *w)).is_some() {
            v.duplicates += 1;
        }
    }
    let keys: HashSet<u128> = rows.iter().map(|(_, _, k, ..)| key(k)).collect();
    v.duplicates += (rows.len() - keys.len()) as u64;
    if v.duplicates > 0 {
        v.problems
            .push(format!("{} keys or account keys held twice", v.duplicates));
    }
    for (account, held) in &table {
        let fanout = held.len() as u32;
        if !held.keys().copied().eq(0..fanout) {
            v.gaps += 1;
            v.problems.push(format!(
                "{account}: key indexes are not 0..{fanout}: {held:?}"
            ));
        }
        let weight: i64 = held.values().map(|(_, w)| w).sum();
        let keys: Vec<u128> = held.values().map(|(k, _)| *k).collect();
        if held.values().ne(shares(&keys, weight as u64).values()) {
            v.wrong_shares += 1;
            v.problems.push(format!(
                "{account}: keys do not hold their shares of weight {weight}: {held:?}"
            ));
        }
    }

    let mut log: HashMap<&str, Vec<Logged>> = HashMap::new();
    let mut logged_moves = HashSet::new();
    for (_, kind, account, idx, before, after, ..) in events {
        let Some(account) = account.as_deref() else {
            continue;
        };
        let index = *idx as u32;
        let entry = match kind.as_str() {
            "allocate" => Logged::Allocate(index, key(after.as_deref().expect("key_after"))),
            "release" => Logged::Release(index),
            "reweight" => Logged::Reweight(index),
            "move" => {
                let (from, to) = (
                    key(before.as_deref().unwrap()),
                    key(after.as_deref().unwrap()),
                );
                logged_moves.insert((account.to_owned(), index, from, to));
                v.moves += 1;
                Logged::Move(index, from, to)
            }
            _ => continue,
        };
        log.entry(account).or_default().push(entry);
    }

    for record in records {
        for m in &record.moves {
            v.acked_moves += 1;
            if !logged_moves.contains(m) {
                v.problems
                    .push(format!("acknowledged move {m:?} is not logged"));
            }
        }
        v.problems.extend(record.anomalies.iter().cloned());
        for (account, ops) in &record.accounts {
            let logged = log.get(account.as_str()).map_or(&[][..], Vec::as_slice);
            judge_account(&mut v, account, ops, logged, table.get(account.as_str()));
        }
    }
    v
}

/// Checks one account's acknowledged operations against its log entries and its rows.
fn judge_account(
    v: &mut Verdict,
    account: &str,
    ops: &[Op],
    logged: &[Logged],
    rows: Option<&Rows>,
) {
    // The last acknowledged operation decides the state, unless a later attempt (one that
    // got no answer) may have changed it.
    let last = ops.iter().rposition(|op| {
        matches!(
            op,
            Op::Allocate { keys: Some(_), .. }
                | Op::Resize { keys: Some(_), .. }
                | Op::Release { acked: true }
        )
    });
    let states = states(logged);
    for (i, op) in ops.iter().enumerate() {
        // Only unacknowledged attempts can follow the deciding operation.
        let deciding = last == Some(i) && i + 1 == ops.len();
        let (weight, keys) = match op {
            Op::Allocate {
                weight,
                keys: Some(keys),
                ..
            } => {
                v.acked_allocations += 1;
                (*weight, keys)
            }
            Op::Resize {
                weight,
                keys: Some(keys),
                ..
            } => {
                v.acked_resizes += 1;
                (*weight, keys)
            }
            Op::Resize { keys: None, .. } => {
                v.unanswered_resizes += 1;
                continue;
            }
            Op::Release { acked: true } => {
                v.acked_releases += 1;
                if deciding && rows.is_some() {
                    v.problems
                        .push(format!("{account}: released, yet the table has {rows:?}"));
                }
                continue;
            }
            _ => continue,
        };
        if keys.len() > 1 {
            v.acked_fanned_out += 1;
        }
        // The keys answered, or, when a retry found the change already made (its first
        // answer lost in a kill), the keys rebalances moved them to since.
        let found: Vec<usize> = (states.iter().enumerate())
            .filter(|(_, (state, _))| state == keys)
            .map(|(at, _)| at)
            .collect();
        let mut kept = !found.is_empty();
        if kept {
            v.found += 1;
            if found.iter().all(|&at| states[at].1) {
                v.found_moved += 1;
            }
        } else {
            v.problems.push(format!(
                "{account}: acknowledged keys {keys:?} are not in the log: {logged:?}"
            ));
        }
        if deciding {
            let expected = current_keys(logged, &states, found.last().copied())
                .map(|now| shares(&now, weight));
            if rows.is_none() || rows != expected.as_ref() {
                kept = false;
                v.problems.push(format!(
                    "{account}: acknowledged keys {keys:?} of weight {weight} should be held \
                     as {expected:?}, the table has {rows:?}; its log: {logged:?}"
                ));
            }
        }
        if last == Some(i) && !deciding {
            // Only resizes that got no answer came after: the account holds what one of
            // them or this change asked for.
            let asked = |op: &Op| match *op {
                Op::Allocate { weight, fanout, .. } | Op::Resize { weight, fanout, .. } => {
                    Some((weight, fanout))
                }
                Op::Release { .. } => None,
            };
            let held = rows.map(|rows| {
                let weight: i64 = rows.values().map(|(_, w)| w).sum();
                (weight as u64, rows.len() as u32)
            });
            let allowed: Vec<_> = ops[i..].iter().map(asked).collect();
            let resized_only = allowed[1..].iter().all(Option::is_some);
            if resized_only && !allowed.contains(&held) {
                kept = false;
                v.problems.push(format!(
                    "{account}: holds (weight, fanout) {held:?}, none of {allowed:?} asked for"
                ));
            }
        }
        if !kept {
            v.lost += 1;
        }
    }
}

/// The account's keys by index after each log entry, and whether that entry was a move.
fn states(logged: &[Logged]) -> Vec<(Vec<u128>, bool)> {
    let mut keys: Vec<u128> = Vec::new();
    let mut states = Vec::with_capacity(logged.len());
    for entry in logged {
        match *entry {
            Logged::Allocate(i, k) if i as usize == keys.len() => keys.push(k),
            Logged::Release(i) if i as usize + 1 == keys.len() => {
                keys.pop();
            }
            Logged::Move(i, from, to) if keys.get(i as usize) == Some(&from) => {
                keys[i as usize] = to;
            }
            Logged::Reweight(i) if (i as usize) < keys.len() => {}
            // Out of order: no state after it is one the account was in.
            _ => keys = vec![u128::MAX; 1 + keys.len()],
        }
        states.push((keys.clone(), matches!(entry, Logged::Move(..))));
    }
    states
}

/// The keys acknowledged as log state `found` are held now: only moves came after it.
fn current_keys(
    logged: &[Logged],
    states: &[(Vec<u128>, bool)],
    found: Option<usize>,
) -> Option<Vec<u128>> {
    let found = found?;
    (logged[found + 1..].iter())
        .all(|e| matches!(e, Logged::Move(..)))
        .then(|| states.last().expect("found in them").0.clone())
}

/// Rows holding `keys` by index, each with its share of `weight`.
fn shares(keys: &[u128], weight: u64) -> Rows {
    let fanout = keys.len() as u32;
    (0..fanout)
        .zip(keys)
        .map(|(i, &k)| (i, (k, key_weight(weight, fanout, i) as i64)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: u128 = 1 << 100;
    const B: u128 = 2 << 100;
    const C: u128 = 3 << 100;
    const D: u128 = 4 << 100;
    const MOVED: u128 = 5 << 100;

    fn judged(ops: &[Op], logged: &[Logged], rows: &[(u128, i64)]) -> Verdict {
        let mut v = Verdict::default();
        let rows: Rows = (0..).zip(rows.iter().copied()).collect();
        let rows = (!rows.is_empty()).then_some(&rows);
        judge_account(&mut v, "acct", ops, logged, rows);
        v
    }

    fn allocated(weight: u64, keys: &[u128]) -> Op {
        Op::Allocate {
            weight,
            fanout: keys.len() as u32,
            keys: Some(keys.to_vec()),
        }
    }

    /// A retried allocation found its first attempt committed and answered the key a
    /// rebalance had moved it to since (seen in a run: allocate, release, allocate, move,
    /// release).
    #[test]
    fn a_retry_may_be_answered_the_key_a_rebalance_moved_it_to() {
        let ops = [allocated(1, &[MOVED]), Op::Release { acked: true }];
        let logged = [
            Logged::Allocate(0, A),
            Logged::Release(0),
            Logged::Allocate(0, B),
            Logged::Move(0, B, MOVED),
            Logged::Release(0),
        ];
        let v = judged(&ops, &logged, &[]);
        assert!(v.problems.is_empty(), "{:?}", v.problems);
        assert_eq!((v.found, v.found_moved, v.lost), (1, 1, 0));
        // Still held: the table must have the moved key.
        let ops = [allocated(1, &[MOVED])];
        let held = &logged[..4];
        assert!(judged(&ops, held, &[(MOVED, 1)]).problems.is_empty());
        assert_eq!(judged(&ops, held, &[(B, 1)]).lost, 1);
    }

    #[test]
    fn an_acknowledged_key_nowhere_in_the_log_is_lost() {
        let ops = [allocated(1, &[MOVED])];
        let logged = [Logged::Allocate(0, A), Logged::Move(0, A, B)];
        let v = judged(&ops, &logged, &[(B, 1)]);
        assert_eq!(v.lost, 1);
        assert_eq!(v.problems.len(), 2, "{:?}", v.problems);
    }

    /// Grown from 2 keys to 4 (weight 10: shares 3, 3, 2, 2), then key 3 moved: the table
    /// must hold exactly those keys by index, each with its share.
    #[test]
    fn a_grown_account_holds_its_keys_by_index_with_their_shares() {
        let grow = Op::Resize {
            weight: 10,
            fanout: 4,
            keys: Some(vec![A, B, C, D]),
        };
        let ops = [allocated(2, &[A, B]), grow];
        let logged = [
            Logged::Allocate(0, A),
            Logged::Allocate(1, B),
            Logged::Reweight(0),
            Logged::Reweight(1),
            Logged::Allocate(2, C),
            Logged::Allocate(3, D),
            Logged::Move(3, D, MOVED),
        ];
        let right = [(A, 3), (B, 3), (C, 2), (MOVED, 2)];
        let v = judged(&ops, &logged, &right);
        assert!(v.problems.is_empty(), "{:?}", v.problems);
        assert_eq!(
            (v.acked_allocations, v.acked_resizes, v.found, v.lost),
            (1, 1, 2, 0)
        );
        // Keys out of their places, a key missing, a share wrong, the move undone.
        for wrong in [
            &[(B, 3), (A, 3), (C, 2), (MOVED, 2)][..],
            &[(A, 3), (B, 3), (C, 2)],
            &[(A, 4), (B, 2), (C, 2), (MOVED, 2)],
            &[(A, 3), (B, 3), (C, 2), (D, 2)],
        ] {
            assert_eq!(judged(&ops, &logged, wrong).lost, 1, "{wrong:?}");
        }
        // Acknowledged keys never held together: lost, whatever the table says.
        let never = Op::Resize {
            weight: 10,
            fanout: 4,
            keys: Some(vec![A, B, D, C]),
        };
        let v = judged(&[allocated(2, &[A, B]), never], &logged, &right);
        assert_eq!(v.lost, 1, "{:?}", v.problems);
    }

    /// A shrink that got no answer may or may not have committed: the table is not judged
    /// by the grow before it, but its keys must still be in the log.
    #[test]
    fn an_unanswered_shrink_leaves_the_table_unjudged() {
        let ops = [
            allocated(4, &[A, B, C, D]),
            Op::Resize {
                weight: 2,
                fanout: 2,
                keys: None,
            },
        ];
        let logged = [
            Logged::Allocate(0, A),
            Logged::Allocate(1, B),
            Logged::Allocate(2, C),
            Logged::Allocate(3, D),
            Logged::Release(3),
            Logged::Release(2),
        ];
        let v = judged(&ops, &logged, &[(A, 1), (B, 1)]);
        assert!(v.problems.is_empty(), "{:?}", v.problems);
        // Nor did the account hold 3 keys at any point asked for.
        let v = judged(&ops, &logged, &[(A, 1), (B, 1), (C, 1)]);
        assert_eq!(v.lost, 1, "{:?}", v.problems);
        // Answered: then the table must have the two keys.
        let acked = Op::Resize {
            weight: 2,
            fanout: 2,
            keys: Some(vec![A, B]),
        };
        let ops = [ops[0].clone(), acked];
        assert!(judged(&ops, &logged, &[(A, 1), (B, 1)]).problems.is_empty());
        assert_eq!(judged(&ops, &logged, &[(A, 1), (B, 1), (C, 1)]).lost, 1);
    }
}
