//! Every answer to a change agrees with the event log at some moment between the request
//! and its answer, whichever replica gives it: no replica answers from a stale memory.
//!
//! A client reads the log's newest event id before it sends a change (`lo`) and after it
//! has the answer (`hi`); the replica decided somewhere in between. The checker replays
//! the log and holds each answer against the states the log passed through in `[lo, hi]`.

use std::collections::{BTreeMap, HashSet};
use std::time::{Duration, Instant};

use reqwest::Method;
use serde_json::{Value, json};

use crate::helpers::{AccountEvent, Db, backend, fresh_database};
use crate::process::Rng;
use crate::replay::key;
use crate::replicas::{Api, start};

const CLIENTS: u64 = 16;
/// Few accounts, so that every client keeps changing what the others just saw.
const ACCOUNTS: u64 = 6;
const RUN_FOR: Duration = Duration::from_secs(5);

/// An account's key and weight, or `None` while it holds no key.
type Held = Option<(u128, i64)>;

/// One answer to a change, with the log positions around it.
#[derive(Debug)]
struct Seen {
    lo: i64,
    hi: i64,
    replica: usize,
    op: &'static str,
    account: String,
    status: u16,
    /// The key and weight answered, for answers that carry an assignment.
    held: Held,
    /// Whether the answer says it made a new assignment.
    created: bool,
}

fn assignment(body: &Value) -> Held {
    let hash_key = body["hash_key"].as_str()?.parse().ok()?;
    Some((hash_key, body["weight"].as_i64()?))
}

/// Sends one random change to a random replica and records what it answered.
async fn change(api: &Api, db: &mut Db, rng: &mut Rng, replicas: usize) -> Vec<Seen> {
    let replica = rng.below(replicas as u64) as usize;
    let account = format!("acct-{}", rng.below(ACCOUNTS));
    let path = format!("/keys/{account}");
    let weight = 1 + rng.below(3);
    let (op, method, body) = match rng.below(100) {
        0..40 => ("allocate", Method::POST, Some(json!({ "weight": weight }))),
        40..70 => ("release", Method::DELETE, None),
        70..85 => ("reweight", Method::PATCH, Some(json!({ "weight": weight }))),
        _ => {
            let other = format!("acct-{}", rng.below(ACCOUNTS));
            let mut accounts = vec![json!({ "account": account })];
            if other != account {
                accounts.push(json!({ "account": other }));
            }
            let lo = db.last_event_id().await;
            let (status, body) = api
                .call(
                    replica,
                    Method::POST,
                    "/keys/batch",
                    Some(json!({ "accounts": accounts })),
                )
                .await;
            let hi = db.last_event_id().await;
            assert_eq!(status, 200, "batch on replica {replica}: {body}");
            let items = body["items"].as_array().expect("batch items");
            let all_created = body["existing"] == 0;
            return items
                .iter()
                .map(|item| Seen {
                    lo,
                    hi,
                    replica,
                    op: "batch",
                    account: item["account"].as_str().unwrap().to_owned(),
                    status,
                    held: assignment(item),
                    created: all_created,
                })
                .collect();
        }
    };
    let lo = db.last_event_id().await;
    let (status, body) = api.call(replica, method, &path, body).await;
    let hi = db.last_event_id().await;
    let allowed: &[u16] = match op {
        "allocate" => &[200, 201],
        "release" => &[204, 404],
        _ => &[200, 404],
    };
    assert!(allowed.contains(&status), "{op} {path}: {status} {body}");
    vec![Seen {
        lo,
        hi,
        replica,
        op,
        account,
        status,
        held: assignment(&body),
        created: status == 201,
    }]
}

/// Each account's states in log order: the event id that set it, and what it held after.
struct Timeline {
    states: BTreeMap<String, Vec<(i64, Held)>>,
    /// `(kind, account, key after, weight)` of each event, by id.
    events: BTreeMap<i64, (String, String, Held)>,
}

impl Timeline {
    fn replay(log: &[AccountEvent]) -> Timeline {
        let mut states: BTreeMap<String, Vec<(i64, Held)>> = BTreeMap::new();
        let mut events = BTreeMap::new();
        for (id, kind, account, _, after, weight) in log {
            let states = states.entry(account.clone()).or_insert(vec![(0, None)]);
            let before = states.last().expect("a first state").1;
            let now = match kind.as_str() {
                "allocate" => Some((key(after.as_deref().unwrap()), weight.unwrap())),
                "release" => None,
                "move" => before.map(|(_, w)| (key(after.as_deref().unwrap()), w)),
                "reweight" => before.map(|(k, _)| (k, weight.unwrap())),
                other => panic!("event {id}: unexpected kind {other}"),
            };
            states.push((*id, now));
            events.insert(*id, (kind.clone(), account.clone(), now));
        }
        Timeline { states, events }
    }

    /// What `account` held at any moment from log position `lo` to `hi`.
    fn held_during(&self, account: &str, lo: i64, hi: i64) -> Vec<Held> {
        let Some(states) = self.states.get(account) else {
            return vec![None];
        };
        let first = states.partition_point(|(id, _)| *id <= lo) - 1;
        states[first..]
            .iter()
            .take_while(|(id, _)| *id <= hi)
            .map(|(_, held)| *held)
            .collect()
    }

    /// The events of `kind` about `account` logged after `lo` up to `hi`.
    fn logged_between(&self, kind: &str, account: &str, lo: i64, hi: i64) -> Vec<(i64, Held)> {
        self.events
            .range(lo + 1..=hi)
            .filter(|(_, (k, a, _))| k == kind && a == account)
            .map(|(id, (_, _, held))| (*id, *held))
            .collect()
    }
}

/// Every answer that no state of the log in its window explains.
///
/// An answer that made a change claims the earliest unclaimed event of its kind in its
/// window; taking answers by the end of their windows makes that matching a perfect one
/// whenever any exists.
fn contradictions(seen: &mut [Seen], timeline: &Timeline) -> Vec<String> {
    seen.sort_by_key(|s| (s.hi, s.lo));
    let mut claimed = HashSet::new();
    let mut wrong = Vec::new();
    for s in seen.iter() {
        let during = timeline.held_during(&s.account, s.lo, s.hi);
        // A change this answer made: an event of its kind in its window, not another's.
        let mut made = |kind: &str, held: Option<Held>| {
            timeline
                .logged_between(kind, &s.account, s.lo, s.hi)
                .into_iter()
                .any(|(id, logged)| held.is_none_or(|h| h == logged) && claimed.insert(id))
        };
        let explained = match (s.op, s.status) {
            ("allocate", 201) => made("allocate", Some(s.held)),
            ("release", 204) => made("release", None),
            ("batch", _) if s.created => made("allocate", Some(s.held)),
            ("allocate" | "reweight" | "batch", 200) => {
                s.held.is_some() && during.contains(&s.held)
            }
            (_, 404) => during.contains(&None),
            _ => false,
        };
        if !explained {
            wrong.push(format!(
                "replica {} answered {} {} with {} {:?}, but between events {} and {} the log \
                 held {:?}",
                s.replica, s.op, s.account, s.status, s.held, s.lo, s.hi, during
            ));
        }
    }
    wrong
}

/// The issue's own case: replica 0 releases `x` and gives its key to `y`; replica 1, which
/// saw `x` hold that key, must not answer it again.
async fn released_elsewhere(api: &Api) {
    let (status, first) = api.call(0, Method::POST, "/keys/x", None).await;
    assert_eq!(status, 201, "{first}");
    let deadline = Instant::now() + Duration::from_secs(5);
    while api.get(1, "/keys/x").await.0 != 200 {
        assert!(Instant::now() < deadline, "replica 1 never saw x");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(api.call(0, Method::DELETE, "/keys/x", None).await.0, 204);
    let (status, y) = api.call(0, Method::POST, "/keys/y", None).await;
    assert_eq!(status, 201, "{y}");
    assert_eq!(y["hash_key"], first["hash_key"], "y gets the key x freed");

    let (status, again) = api.call(1, Method::POST, "/keys/x", None).await;
    assert_eq!(status, 201, "replica 1 answered x from memory: {again}");
    assert_ne!(again["hash_key"], y["hash_key"], "x and y answered one key");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_replica_answers_a_change_the_log_contradicts() {
    let dir = tempfile::tempdir().unwrap();
    let (url, _postgres) = fresh_database(dir.path()).await;
    let backend = backend(&url);
    let (replicas, api) = start(&url, dir.path()).await;

    released_elsewhere(&api).await;

    let until = Instant::now() + RUN_FOR;
    let clients: Vec<_> = (1..=CLIENTS)
        .map(|seed| {
            let (api, url, n) = (api.clone(), url.clone(), replicas.len());
            tokio::spawn(async move {
                let (mut db, mut rng, mut seen) = (Db::connect(&url).await, Rng::new(seed), vec![]);
                while Instant::now() < until {
                    seen.extend(change(&api, &mut db, &mut rng, n).await);
                }
                seen
            })
        })
        .collect();
    let mut seen = Vec::new();
    for client in clients {
        seen.extend(client.await.unwrap());
    }

    let log = Db::connect(&url).await.account_events().await;
    let wrong = contradictions(&mut seen, &Timeline::replay(&log));
    let mut counts: BTreeMap<(&str, u16), usize> = BTreeMap::new();
    for s in &seen {
        *counts.entry((s.op, s.status)).or_default() += 1;
    }
    println!(
        "{backend}: {} answers from {} replicas over {} events, {} contradictions: {counts:?}",
        seen.len(),
        replicas.len(),
        log.len(),
        wrong.len()
    );
    assert!(
        wrong.is_empty(),
        "{} answers contradict the log, e.g.:\n{}",
        wrong.len(),
        wrong[..wrong.len().min(10)].join("\n")
    );
}
