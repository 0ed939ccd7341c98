//! Three replica processes on one database: they never disagree, and follow each other.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use reqwest::Method;
use serde_json::{Value, json};

use crate::helpers::{Db, backend, fresh_database};
use crate::process::{Rng, Server};
use crate::replay::{Held, check_store};

const REPLICAS: usize = 3;
const CLIENTS: u64 = 64;
const LOAD_FOR: Duration = Duration::from_secs(6);
/// Few enough names that allocations, releases and repeats mix.
const POOL: u64 = 400;
/// The documented bound on how long a change takes to show on another replica.
const LAG_BOUND: Duration = Duration::from_secs(1);
const SHARDS: usize = 4;
/// Shard i of the uniform 4-shard map starts at i * floor(2^128 / 4).
const STEP: u128 = 1 << 126;

/// Operation name and status -> how many times it was answered so.
type Counts = BTreeMap<(&'static str, u16), u64>;

/// HTTP access to the replicas; cheap to clone into client tasks.
#[derive(Clone)]
pub struct Api {
    client: reqwest::Client,
    urls: Arc<Vec<String>>,
}

impl Api {
    /// Sends a request to replica `i`: status and JSON body (a string if not JSON).
    pub async fn call(
        &self,
        i: usize,
        method: Method,
        path: &str,
        body: Option<Value>,
    ) -> (u16, Value) {
        let mut request = self
            .client
            .request(method.clone(), format!("{}{path}", self.urls[i]));
        if let Some(body) = body {
            request = request.json(&body);
        }
        let response = (request.send().await)
            .unwrap_or_else(|e| panic!("{method} {path} on replica {i}: {e}"));
        let status = response.status().as_u16();
        let text = response.text().await.unwrap_or_default();
        let body = serde_json::from_str(&text).unwrap_or(Value::String(text));
        (status, body)
    }

    pub async fn get(&self, i: usize, path: &str) -> (u16, Value) {
        self.call(i, Method::GET, path, None).await
    }
}

/// Starts the replicas on `database_url` and waits until each is ready.
pub async fn start(database_url: &str, dir: &Path) -> (Vec<Server>, Api) {
    let mut replicas: Vec<Server> = (0..REPLICAS)
        .map(|i| Server::spawn(database_url, &dir.join(format!("replica-{i}.log"))))
        .collect();
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(20))
        .build()
        .unwrap();
    for replica in &mut replicas {
        replica.wait_ready(&client).await;
    }
    let api = Api {
        client,
        urls: Arc::new(replicas.iter().map(|r| r.url.clone()).collect()),
    };
    (replicas, api)
}

/// Allocates on each replica in turn and times how long the others take to show the key.
async fn measure_lag(api: &Api) -> Vec<Duration> {
    let mut lags = Vec::new();
    for n in 0..30 {
        // Followers poll on a fixed period; write at spread-out phases of it, not right
        // after the last poll (when the previous change was seen), or p50 is the period.
        tokio::time::sleep(Duration::from_millis(n as u64 * 97 % 250)).await;
        let (leader, path) = (n % REPLICAS, format!("/keys/lag-{n}"));
        let (status, body) = api.call(leader, Method::POST, &path, None).await;
        assert_eq!(status, 201, "{body}");
        let committed = Instant::now();
        for follower in (0..REPLICAS).filter(|&r| r != leader) {
            loop {
                let (status, seen) = api.get(follower, &path).await;
                if status == 200 {
                    assert_eq!(
                        seen["hash_key"], body["hash_key"],
                        "replica {follower} disagrees on {path}"
                    );
                    break;
                }
                assert_eq!(status, 404, "{seen}");
                assert!(
                    committed.elapsed() < Duration::from_secs(5),
                    "replica {follower} never showed {path}"
                );
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            lags.push(committed.elapsed());
        }
    }
    lags.sort();
    lags
}

/// One client: random operations on random replicas until `until`; fails on any other status.
async fn client(api: Api, seed: u64, until: Instant) -> Counts {
    let mut rng = Rng::new(seed);
    let mut counts = Counts::new();
    let mut record = |op: &'static str, (status, body): (u16, Value), allowed: &[u16]| {
        assert!(
            allowed.contains(&status),
            "{op}: unexpected {status} {body}"
        );
        *counts.entry((op, status)).or_default() += 1;
        body
    };
    while Instant::now() < until {
        let replica = rng.below(REPLICAS as u64) as usize;
        let path = format!("/keys/acct-{}", rng.below(POOL));
        if rng.below(100) == 0 {
            // Planned on one replica, applied on another: 409 when anything changed in between.
            let plan = api.get(replica, "/rebalance/preview?shards=4").await;
            let body = json!({"plan_id": record("preview", plan, &[200])["plan_id"]});
            let other = (replica + 1 + rng.below(2) as usize) % REPLICAS;
            let applied = api.call(other, Method::POST, "/rebalance", Some(body));
            record("rebalance", applied.await, &[200, 409]);
            continue;
        }
        let (op, method, allowed): (_, _, &[u16]) = match rng.below(100) {
            0..45 => ("allocate", Method::POST, &[200, 201]),
            45..70 => ("release", Method::DELETE, &[204, 404]),
            _ => ("lookup", Method::GET, &[200, 404]),
        };
        record(op, api.call(replica, method, &path, None).await, allowed);
    }
    counts
}

/// Runs `CLIENTS` clients for `LOAD_FOR` and adds up what they saw.
async fn load(api: &Api) -> Counts {
    let until = Instant::now() + LOAD_FOR;
    let clients: Vec<_> = (1..=CLIENTS)
        .map(|n| tokio::spawn(client(api.clone(), n, until)))
        .collect();
    let mut total = Counts::new();
    for handle in clients {
        let counts = tokio::time::timeout(LOAD_FOR + Duration::from_secs(60), handle)
            .await
            .expect("a client still running a minute after the load ended")
            .unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()));
        for (kind, n) in counts {
            *total.entry(kind).or_default() += n;
        }
    }
    total
}

/// Keys per shard of the uniform 4-shard map.
fn per_shard(stored: &Held) -> Vec<u64> {
    let mut counts = vec![0; SHARDS];
    for (k, _) in stored.values().flatten() {
        counts[((k / STEP) as usize).min(SHARDS - 1)] += 1;
    }
    counts
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_never_disagree_and_follow_each_other() {
    let dir = tempfile::tempdir().unwrap();
    let (url, _postgres) = fresh_database(dir.path()).await;
    let backend = backend(&url);
    let (_replicas, api) = start(&url, dir.path()).await;

    let lags = measure_lag(&api).await;
    let (p50, max) = (lags[lags.len() / 2], lags[lags.len() - 1]);
    println!(
        "{backend}: replica lag over {} samples: p50 {p50:?}, max {max:?}",
        lags.len()
    );
    assert!(max < LAG_BOUND, "a replica took {max:?} to show a change");
    if backend == "postgres" {
        // Commits are announced (a trigger on `events`): followers hear of a change at
        // once rather than at their next poll, which would put p50 near half the period.
        assert!(
            p50 < keyspread::registry::POLL / 5,
            "p50 lag {p50:?}: are commits announced?"
        );
    }

    let started = Instant::now();
    let counts = load(&api).await;
    let elapsed = started.elapsed();
    let ops: u64 = counts.values().sum();
    for ((op, status), n) in &counts {
        println!("{backend}: {op:>9} {status}: {n}");
    }

    tokio::time::sleep(LAG_BOUND).await;
    let mut db = Db::connect(&url).await;
    let stored = check_store(&db.key_rows().await, &db.indexed_events().await);
    let expected = per_shard(&stored);
    for i in 0..REPLICAS {
        let (status, body) = api.get(i, "/distribution?shards=4").await;
        assert_eq!(status, 200, "{body}");
        let seen: Vec<u64> = (body["shards"].as_array().unwrap().iter())
            .map(|s| s["accounts"].as_u64().unwrap())
            .collect();
        assert_eq!(seen, expected, "replica {i} has not converged");
    }

    // Planned on one replica, applied via another: the plan names the shared event log.
    let (status, plan) = api.get(1, "/rebalance/preview?shards=4").await;
    assert_eq!(status, 200, "{plan}");
    let body = json!({"plan_id": plan["plan_id"]});
    let (status, applied) = api.call(0, Method::POST, "/rebalance", Some(body)).await;
    assert_eq!(status, 200, "{applied}");
    let stored = check_store(&db.key_rows().await, &db.indexed_events().await);
    let cap = stored
        .values()
        .map(Vec::len)
        .sum::<usize>()
        .div_ceil(SHARDS) as u64;
    let shards = per_shard(&stored);
    assert!(
        shards.iter().all(|&n| n <= cap),
        "after rebalancing: {shards:?}, cap {cap}"
    );

    let moves = applied["moves"].as_array().map_or(0, Vec::len);
    println!("{backend}: per shard {expected:?}, after {moves} moves {shards:?}");
    let rate = ops as f64 / elapsed.as_secs_f64();
    println!(
        "{backend}: {ops} ops in {elapsed:.1?} ({rate:.0} ops/s), lag p50 {p50:?} max {max:?}"
    );
}
