//! Checks of what a run left in the database: no key held twice, each account's keys
//! numbered `0..K` with their shares, and an event log that replays, decision by decision
//! and key by key, to exactly the stored table.

use std::collections::{BTreeMap, HashSet};

use keyspread::keyspace::{Allocator, HashKey, Keyspace, key_weight};
use reqwest::Method;
use serde_json::json;

use crate::helpers::{IndexedEvent, KeyRow, spawn_app};

/// A 16-byte big-endian hash key column as a number.
pub fn key(bytes: &[u8]) -> u128 {
    u128::from_be_bytes(bytes.try_into().expect("16-byte key"))
}

/// Each account's keys by index: (hash key, that key's weight).
pub type Held = BTreeMap<String, Vec<(u128, i64)>>;

/// The key rows by account, each account's in index order; panics unless every account's
/// indexes are exactly `0..K` and each row carries its share of the account's weight.
pub fn held_keys(rows: &[KeyRow]) -> Held {
    let mut by_index: BTreeMap<String, BTreeMap<i64, (u128, i64)>> = BTreeMap::new();
    for (account, idx, k, w, ..) in rows {
        let row = by_index.entry(account.clone()).or_default();
        assert_eq!(
            row.insert(*idx, (key(k), *w)),
            None,
            "{account} key {idx} twice"
        );
    }
    let mut held = Held::new();
    for (account, keys) in by_index {
        let fanout = keys.len();
        let indexes: Vec<i64> = keys.keys().copied().collect();
        let expected: Vec<i64> = (0..fanout as i64).collect();
        assert_eq!(indexes, expected, "{account}: key indexes are not 0..K");
        let keys: Vec<(u128, i64)> = keys.into_values().collect();
        let weight: i64 = keys.iter().map(|(_, w)| w).sum();
        for (i, (_, w)) in keys.iter().enumerate() {
            let share = key_weight(weight as u64, fanout as u32, i as u32) as i64;
            assert_eq!(
                *w, share,
                "{account}: key {i} of {fanout} (weight {weight})"
            );
        }
        held.insert(account, keys);
    }
    held
}

/// A key and the weight it held before a reweight.
type Replaced = (HashKey, u64);

/// The old key and switch time a staged move left on a key row.
type Switch = (u128, i64);

/// Checks the key rows for duplicates, against their event log, and the log against the
/// allocator one replica would have run. Answers account -> keys by index.
///
/// The old key of a move still to switch is held too: no row may hold it, and the walk
/// replayed passes it by until the first decision made at or after its switch.
pub fn check_store(rows: &[KeyRow], events: &[IndexedEvent]) -> Held {
    let stored = held_keys(rows);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    let old_keys = rows
        .iter()
        .filter_map(|(.., prev, switch_at)| match (prev, switch_at) {
            (Some(prev), Some(at)) if *at > now => Some(key(prev)),
            _ => None,
        });
    let keys: HashSet<u128> = stored
        .values()
        .flatten()
        .map(|(k, _)| *k)
        .chain(old_keys.clone())
        .collect();
    assert_eq!(
        keys.len(),
        rows.len() + old_keys.count(),
        "a hash key is held twice (old keys of pending moves included)"
    );

    let mut replayed: BTreeMap<String, BTreeMap<i64, (u128, i64)>> = BTreeMap::new();
    // The last switch each key's moves left (for the rows' columns), and the old keys held
    // now: old key -> the (account, index) moving from it and its switch time.
    let mut switches: BTreeMap<(String, i64), Switch> = BTreeMap::new();
    let mut reserved: BTreeMap<u128, ((String, i64), i64)> = BTreeMap::new();
    let mut alloc = Allocator::new(Keyspace::KINESIS);
    // The weights the reweight events just before replaced (account, time, key and weight
    // before): a fanout change logs the kept keys' new shares before the added keys, but
    // picked those on the weights before.
    let mut reweighted: Option<(String, i64, Vec<Replaced>)> = None;
    let mut id = 0;
    while id < events.len() {
        let (at, kind, account, idx, before, after, weight, switch_at) = &events[id];
        // Every decision frees the old keys whose switch came by its time.
        reserved.retain(|old, (_, switch_at)| {
            let due = *switch_at <= *at;
            if due {
                alloc.unreserve(HashKey(*old)).unwrap();
            }
            !due
        });
        let mut end_switch = |alloc: &mut Allocator, moving: (String, i64)| {
            reserved.retain(|old, (owner, _)| {
                let ends = *owner == moving;
                if ends {
                    alloc.unreserve(HashKey(*old)).unwrap();
                }
                !ends
            });
        };
        let account = account.clone().expect("event account");
        let weight = weight.expect("event weight");
        let from = || HashKey(key(before.as_deref().expect("key_before")));
        let to = || HashKey(key(after.as_deref().expect("key_after")));
        let pending = match reweighted.take() {
            Some((a, t, pending)) if a == account && t == *at => pending,
            _ => Vec::new(),
        };
        match kind.as_str() {
            "allocate" => {
                // The keys one change added: this event and the account's allocations of
                // the same change right after it, by index.
                let run = events[id..]
                    .iter()
                    .enumerate()
                    .take_while(|(n, e)| {
                        (e.0, e.1.as_str(), e.2.as_deref(), e.3)
                            == (*at, "allocate", Some(account.as_str()), idx + *n as i64)
                    })
                    .count();
                let added = &events[id..id + run];
                let held = replayed.entry(account.clone()).or_default();
                assert_eq!(
                    held.len() as i64,
                    *idx,
                    "event {id}: {account} adds key {idx}"
                );
                for n in 0..run {
                    switches.remove(&(account.clone(), idx + n as i64));
                }
                // Each replica decided on the caught-up state: one replica's walk must agree.
                for &(key, old) in &pending {
                    alloc.set_weight(key, old).unwrap();
                }
                let mut keys: Vec<HashKey> = held.values().map(|(k, _)| HashKey(*k)).collect();
                let weights: Vec<u64> = added.iter().map(|e| e.6.unwrap() as u64).collect();
                // An account with keys still switching grows spread against its keys now
                // and after the switch; a key that cannot be both is added as the key for
                // now and moved (a `move` event follows) to the one after.
                let now_keys: Vec<HashKey> = (0..keys.len())
                    .map(|i| {
                        let moving = (account.clone(), i as i64);
                        (reserved.iter())
                            .find(|(_, (owner, _))| *owner == moving)
                            .map_or(keys[i], |(old, _)| HashKey(*old))
                    })
                    .collect();
                let picked: Vec<u128> = if now_keys == keys {
                    alloc.extend_keys(&mut keys, &weights).unwrap();
                    keys[held.len()..].iter().map(|k| k.0).collect()
                } else {
                    let new = alloc.extend_switching(&now_keys, &keys, &weights).unwrap();
                    // As the server does: the tree as before, then the events applied.
                    for (&(now, after), &w) in new.iter().zip(&weights) {
                        alloc.remove(after).unwrap();
                        if now != after {
                            alloc.unreserve(now).unwrap();
                        }
                        alloc.insert(now, w).unwrap();
                    }
                    new.iter().map(|(now, _)| now.0).collect()
                };
                for &(key, _) in &pending {
                    let (_, w) = held.values().find(|(k, _)| *k == key.0).unwrap();
                    alloc.set_weight(key, *w as u64).unwrap();
                }
                let logged: Vec<u128> = (added.iter())
                    .map(|e| key(e.5.as_deref().expect("key_after")))
                    .collect();
                assert_eq!(
                    picked, logged,
                    "event {id}: allocate {account} from key {idx}"
                );
                for (n, e) in added.iter().enumerate() {
                    held.insert(idx + n as i64, (logged[n], e.6.unwrap()));
                }
                id += run;
                continue;
            }
            "release" => {
                alloc.remove(from()).unwrap();
                switches.remove(&(account.clone(), *idx));
                end_switch(&mut alloc, (account.clone(), *idx));
                let held = replayed
                    .get_mut(&account)
                    .expect("released account is held");
                assert_eq!(
                    held.keys().next_back(),
                    Some(idx),
                    "event {id}: {account} releases from the top"
                );
                let (k, _) = held.remove(idx).unwrap();
                assert_eq!(k, from().0, "event {id}: release {account} key {idx}");
                if held.is_empty() {
                    replayed.remove(&account);
                }
            }
            "move" => {
                let w = alloc.remove(from()).unwrap();
                alloc.insert(to(), w).unwrap();
                let switch_at = switch_at.unwrap_or(*at);
                switches.insert((account.clone(), *idx), (from().0, switch_at));
                end_switch(&mut alloc, (account.clone(), *idx));
                if switch_at > *at {
                    alloc.reserve(from()).unwrap();
                    reserved.insert(from().0, ((account.clone(), *idx), switch_at));
                }
                let held = replayed.get_mut(&account).expect("moved account is held");
                let row = held.get_mut(idx).expect("moved key is held");
                assert_eq!(row.0, from().0, "event {id}: move {account} key {idx}");
                row.0 = to().0;
            }
            "reweight" => {
                let held = replayed
                    .get_mut(&account)
                    .expect("reweighted account is held");
                let row = held.get_mut(idx).expect("reweighted key is held");
                assert_eq!(row.0, to().0, "event {id}: reweight {account} key {idx}");
                let mut pending = pending;
                pending.push((to(), row.1 as u64));
                alloc.set_weight(to(), weight as u64).unwrap();
                row.1 = weight;
                reweighted = Some((account, *at, pending));
            }
            other => panic!("event {id}: unexpected kind {other}"),
        }
        id += 1;
    }
    let replayed: Held = replayed
        .into_iter()
        .map(|(account, keys)| (account, keys.into_values().collect()))
        .collect();
    assert_eq!(
        replayed, stored,
        "the event log does not replay to the assignments"
    );
    let stored_switches: BTreeMap<(String, i64), Switch> = rows
        .iter()
        .filter_map(|(account, idx, _, _, prev, switch_at)| {
            let switch = (key(prev.as_deref()?), (*switch_at)?);
            Some(((account.clone(), *idx), switch))
        })
        .collect();
    assert_eq!(
        switches, stored_switches,
        "the move events do not replay to the rows' old keys and switch times"
    );
    stored
}

/// Fanned-out accounts through allocation, batches, growth, shrinking, reweights, moves by
/// a rebalance, releases and restarts: the log replays by (account, index) to the table.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fanned_out_keys_replay_by_account_and_index() {
    let mut app = spawn_app().await;
    let ok = |a: &crate::helpers::Answer, status: u16| {
        assert_eq!(a.status, status, "{}", a.body);
    };
    for (name, body) in [
        ("a", json!({"fanout": 3, "weight": 7})),
        ("b", json!({})),
        ("c", json!({"fanout": 2})),
        ("d", json!({"fanout": 40, "weight": 100})),
    ] {
        ok(&app.post(&format!("/keys/{name}"), Some(body)).await, 201);
    }
    let batch = json!({"accounts": [
        {"account": "e", "fanout": 5},
        {"account": "f"},
        {"account": "g", "fanout": 2, "weight": 9},
    ]});
    ok(&app.post("/keys/batch", Some(batch)).await, 200);
    app = app.restart().await;
    for (name, body) in [
        ("a", json!({"fanout": 8, "weight": 20})),
        ("a", json!({"fanout": 2})),
        ("c", json!({"weight": 5})),
        ("c", json!({"fanout": 4})),
        // Shares of keys 0..18 stay: only keys 18 and 19 are reweighted.
        ("d", json!({"fanout": 41})),
        ("e", json!({"fanout": 1})),
        ("f", json!({"fanout": 3, "weight": 3})),
    ] {
        let patched = app
            .call(Method::PATCH, &format!("/keys/{name}"), Some(body))
            .await;
        ok(&patched, 200);
    }
    ok(&app.delete("/keys/g").await, 204);
    ok(&app.post("/keys/g", Some(json!({"fanout": 6}))).await, 201);
    let plan = app.get("/rebalance/preview?shards=4").await;
    ok(&plan, 200);
    let body = json!({"plan_id": plan.body["plan_id"]});
    ok(&app.post("/rebalance", Some(body)).await, 200);
    app = app.restart().await;
    ok(
        &app.call(Method::PATCH, "/keys/d", Some(json!({"fanout": 16})))
            .await,
        200,
    );
    ok(&app.delete("/keys/b").await, 204);
    ok(&app.post("/keys/h", Some(json!({"fanout": 3}))).await, 201);

    let mut db = app.db().await;
    let events = db.indexed_events().await;
    // Every kind of change to a key other than key 0 is in the log.
    for kind in ["allocate", "release", "reweight", "move"] {
        assert!(
            events.iter().any(|e| e.1 == kind && e.3 > 0),
            "no {kind} of a key other than key 0 in {events:?}"
        );
    }
    let stored = check_store(&db.key_rows().await, &events);
    let fanouts: Vec<(&str, usize)> = stored.iter().map(|(a, k)| (a.as_str(), k.len())).collect();
    let expected = [
        ("a", 2),
        ("c", 4),
        ("d", 16),
        ("e", 1),
        ("f", 3),
        ("g", 6),
        ("h", 3),
    ];
    assert_eq!(fanouts, expected);
    for (account, keys) in &stored {
        let seen = app.get(&format!("/keys/{account}")).await;
        // The table holds the keys after the pending switches: `next` while there is one.
        let after = seen.body.get("next").unwrap_or(&seen.body);
        let answered: Vec<u128> = (after["hash_keys"].as_array().unwrap().iter())
            .map(|k| k.as_str().unwrap().parse().unwrap())
            .collect();
        let held: Vec<u128> = keys.iter().map(|(k, _)| *k).collect();
        assert_eq!(answered, held, "{account}");
    }
}

/// An account that grows while its key 0 switches (on the uniform map of 2 shards its new
/// key cannot be apart from both the old and the new key 0): the log of the allocation and
/// the staged move of the added key replays to the table, the walk included.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn growing_a_switching_account_replays() {
    let app = spawn_app().await;
    let ok = |a: &crate::helpers::Answer, status: u16| assert_eq!(a.status, status, "{}", a.body);
    crate::staged::lopsided(&app).await;
    let plan = app.get("/rebalance/preview?shards=2").await;
    ok(&plan, 200);
    let body = json!({"plan_id": plan.body["plan_id"], "switch_after_s": 3600});
    let applied = app.post("/rebalance", Some(body)).await;
    ok(&applied, 200);
    let account = applied.body["moves"][0]["account"].as_str().unwrap();
    let grown = json!({"fanout": 2, "weight": 2});
    let path = format!("/keys/{account}");
    ok(&app.call(Method::PATCH, &path, Some(grown)).await, 200);
    ok(&app.post("/keys/later", None).await, 201);

    let mut db = app.db().await;
    let events = db.indexed_events().await;
    let staged_growth =
        (events.iter()).any(|e| e.1 == "move" && e.2.as_deref() == Some(account) && e.3 == 1);
    assert!(staged_growth, "the added key is staged too: {events:?}");
    check_store(&db.key_rows().await, &events);
}
