//! What the crash test's clients were promised, checked against the database itself.

use std::collections::{BTreeMap, HashMap, HashSet};

use super::client::{Op, Record};
use crate::helpers::EventRow;
use crate::replay::key;

/// One account's entry in the event log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Logged {
    Allocate(u128),
    Release,
    Move(u128, u128),
}

/// The counts a run is judged by, and every broken promise.
#[derive(Debug, Default)]
pub struct Verdict {
    pub acked_allocations: u64,
    /// Acknowledged allocations found in the log as the account's, with exactly that key.
    pub found: u64,
    /// Of `found`: retried allocations answered with the key a rebalance had moved the
    /// account to after the first attempt committed (its answer lost in a kill).
    pub found_moved: u64,
    /// Acknowledged allocations missing from the log, or undone without a later release.
    pub lost: u64,
    /// Keys held twice, accounts holding two keys.
    pub duplicates: u64,
    pub acked_releases: u64,
    /// Move events in the log, and moves answered to clients.
    pub moves: u64,
    pub acked_moves: u64,
    pub problems: Vec<String>,
}

/// Judges `records` against the table (`account, key, weight`) and the event log.
pub fn judge(
    records: &[Record],
    assignments: &[(String, Vec<u8>, i64)],
    events: &[EventRow],
) -> Verdict {
    let mut v = Verdict::default();
    let table: BTreeMap<&str, (u128, i64)> = (assignments.iter())
        .map(|(a, k, w)| (a.as_str(), (key(k), *w)))
        .collect();
    let keys: HashSet<u128> = table.values().map(|(k, _)| *k).collect();
    v.duplicates = (assignments.len() - table.len() + table.len() - keys.len()) as u64;
    if v.duplicates > 0 {
        v.problems
            .push(format!("{} keys or accounts held twice", v.duplicates));
    }

    let mut log: HashMap<&str, Vec<Logged>> = HashMap::new();
    let mut logged_moves = HashSet::new();
    for (kind, account, _, before, after, _, _) in events {
        let Some(account) = account.as_deref() else {
            continue;
        };
        let entry = match kind.as_str() {
            "allocate" => Logged::Allocate(key(after.as_deref().expect("key_after"))),
            "release" => Logged::Release,
            "move" => {
                let (from, to) = (
                    key(before.as_deref().unwrap()),
                    key(after.as_deref().unwrap()),
                );
                logged_moves.insert((account.to_owned(), from, to));
                v.moves += 1;
                Logged::Move(from, to)
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

/// Checks one account's acknowledged operations against its log entries and its row.
fn judge_account(
    v: &mut Verdict,
    account: &str,
    ops: &[Op],
    logged: &[Logged],
    row: Option<&(u128, i64)>,
) {
    // The last acknowledged operation decides the state, unless a later attempt (one that
    // got no answer) may have changed it.
    let last = ops.iter().rposition(|op| {
        matches!(
            op,
            Op::Allocate { key: Some(_), .. } | Op::Release { acked: true }
        )
    });
    let attempted_after = |i: usize, release: bool| {
        ops[i + 1..]
            .iter()
            .any(|op| matches!(op, Op::Release { .. }) == release)
    };
    for (i, op) in ops.iter().enumerate() {
        let deciding = last == Some(i);
        match *op {
            Op::Allocate {
                weight,
                key: Some(k),
            } => {
                v.acked_allocations += 1;
                // The key allocated, or, when a retry found the allocation already made
                // (its first answer lost in a kill), the key a rebalance moved it to since.
                let mut kept = logged
                    .iter()
                    .any(|e| matches!(*e, Logged::Allocate(x) | Logged::Move(_, x) if x == k));
                if kept {
                    v.found += 1;
                    if !logged.contains(&Logged::Allocate(k)) {
                        v.found_moved += 1;
                    }
                } else {
                    v.problems.push(format!(
                        "{account}: acknowledged key {k} is not in the log: {logged:?}"
                    ));
                }
                if deciding && !attempted_after(i, true) {
                    let expected = current_key(logged, k).map(|key| (key, weight));
                    let held = row.map(|&(key, w)| (key, w as u64));
                    if held.is_none() || held != expected {
                        kept = false;
                        v.problems.push(format!(
                            "{account}: acknowledged key {k} should be held as {expected:?}, \
                             the table has {held:?}; its log: {logged:?}"
                        ));
                    }
                }
                if !kept {
                    v.lost += 1;
                }
            }
            Op::Release { acked: true } => {
                v.acked_releases += 1;
                if deciding && !attempted_after(i, false) && row.is_some() {
                    v.problems
                        .push(format!("{account}: released, yet the table has {row:?}"));
                }
            }
            _ => {}
        }
    }
}

/// The key an allocation acknowledged as `k` holds now: the account's last allocation
/// moved by the logged moves after it, never released, with `k` on that path (a retried
/// allocation is answered the key it holds by then).
fn current_key(logged: &[Logged], k: u128) -> Option<u128> {
    let start = logged
        .iter()
        .rposition(|e| matches!(e, Logged::Allocate(_)))?;
    let Logged::Allocate(mut current) = logged[start] else {
        unreachable!("found as an allocation")
    };
    let mut on_path = current == k;
    for entry in &logged[start + 1..] {
        match *entry {
            Logged::Move(from, to) if from == current => current = to,
            _ => return None,
        }
        on_path |= current == k;
    }
    on_path.then_some(current)
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: u128 = 1 << 100;
    const B: u128 = 2 << 100;
    const MOVED: u128 = 3 << 100;

    fn judged(ops: &[Op], logged: &[Logged], row: Option<(u128, i64)>) -> Verdict {
        let mut v = Verdict::default();
        judge_account(&mut v, "acct", ops, logged, row.as_ref());
        v
    }

    /// A retried allocation found its first attempt committed and answered the key a
    /// rebalance had moved it to since (seen in a run: allocate, release, allocate, move,
    /// release).
    #[test]
    fn a_retry_may_be_answered_the_key_a_rebalance_moved_it_to() {
        let ops = [
            Op::Allocate {
                weight: 1,
                key: Some(MOVED),
            },
            Op::Release { acked: true },
        ];
        let logged = [
            Logged::Allocate(A),
            Logged::Release,
            Logged::Allocate(B),
            Logged::Move(B, MOVED),
            Logged::Release,
        ];
        let v = judged(&ops, &logged, None);
        assert!(v.problems.is_empty(), "{:?}", v.problems);
        assert_eq!((v.found, v.found_moved, v.lost), (1, 1, 0));
        // Still held: the table must have the moved key.
        let ops = [Op::Allocate {
            weight: 1,
            key: Some(MOVED),
        }];
        let held = &logged[..4];
        assert!(judged(&ops, held, Some((MOVED, 1))).problems.is_empty());
        assert_eq!(judged(&ops, held, Some((B, 1))).lost, 1);
    }

    #[test]
    fn an_acknowledged_key_nowhere_in_the_log_is_lost() {
        let ops = [Op::Allocate {
            weight: 1,
            key: Some(MOVED),
        }];
        let logged = [Logged::Allocate(A), Logged::Move(A, B)];
        let v = judged(&ops, &logged, Some((B, 1)));
        assert_eq!(v.lost, 1);
        assert_eq!(v.problems.len(), 2, "{:?}", v.problems);
    }
}
