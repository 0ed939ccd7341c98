//! Checks of what a run left in the database: no key or account twice, and an event log
//! that replays, decision by decision, to exactly the stored table.

use std::collections::{BTreeMap, HashSet};

use keyspread::keyspace::{Allocator, HashKey, Keyspace};

use crate::helpers::EventRow;

/// A 16-byte big-endian hash key column as a number.
pub fn key(bytes: &[u8]) -> u128 {
    u128::from_be_bytes(bytes.try_into().expect("16-byte key"))
}

/// Checks the assignments for duplicates, against their event log, and the log against the
/// allocator one replica would have run. Answers account -> (key, weight).
pub fn check_store(
    assignments: &[(String, Vec<u8>, i64)],
    events: &[EventRow],
) -> BTreeMap<String, (u128, i64)> {
    let stored: BTreeMap<String, (u128, i64)> = (assignments.iter())
        .map(|(account, k, w)| (account.clone(), (key(k), *w)))
        .collect();
    assert_eq!(stored.len(), assignments.len(), "an account holds two keys");
    let keys: HashSet<u128> = stored.values().map(|(k, _)| *k).collect();
    assert_eq!(keys.len(), stored.len(), "a hash key is held twice");

    let mut replayed = BTreeMap::new();
    let mut alloc = Allocator::new(Keyspace::KINESIS);
    for (id, (kind, account, _, before, after, weight, _)) in events.iter().enumerate() {
        let account = account.clone().expect("event account");
        let weight = weight.expect("event weight");
        let from = || HashKey(key(before.as_deref().expect("key_before")));
        let to = || HashKey(key(after.as_deref().expect("key_after")));
        match kind.as_str() {
            "allocate" => {
                // Each replica decided on the caught-up state: one replica's walk must agree.
                assert_eq!(alloc.next_key(), Ok(to()), "event {id}: allocate {account}");
                alloc.insert(to(), weight as u64).unwrap();
                let held = replayed.insert(account.clone(), (to().0, weight));
                assert_eq!(held, None, "event {id}: {account} allocated twice");
            }
            "release" => {
                alloc.remove(from()).unwrap();
                let held = replayed.remove(&account).map(|(k, _)| k);
                assert_eq!(held, Some(from().0), "event {id}: release {account}");
            }
            "move" => {
                let w = alloc.remove(from()).unwrap();
                alloc.insert(to(), w).unwrap();
                let held = replayed.get_mut(&account).expect("moved account is held");
                assert_eq!(held.0, from().0, "event {id}: move {account}");
                held.0 = to().0;
            }
            "reweight" => {
                alloc.set_weight(to(), weight as u64).unwrap();
                replayed
                    .get_mut(&account)
                    .expect("reweighted account is held")
                    .1 = weight;
            }
            other => panic!("event {id}: unexpected kind {other}"),
        }
    }
    assert_eq!(
        replayed, stored,
        "the event log does not replay to the assignments"
    );
    stored
}
