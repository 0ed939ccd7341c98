//! Three replica processes on one database: they never disagree, and follow each other.

use std::collections::{BTreeMap, HashSet};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
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
/// Accounts of 1024 keys allocated in one batch: more events than a follower reads at once.
const WIDE: usize = 12;
/// How long that batch may take to show on another replica.
const WIDE_LAG: Duration = Duration::from_secs(20);
/// The pause a 503 asks for (its `Retry-After`).
const RETRY_AFTER_S: u64 = 2;
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
    /// Access to replicas at `urls` (`http://127.0.0.1:PORT`), in order.
    pub fn new(client: reqwest::Client, urls: Vec<String>) -> Api {
        Api {
            client,
            urls: Arc::new(urls),
        }
    }

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

    /// The HTTP client the calls go through.
    pub fn client(&self) -> &reqwest::Client {
        &self.client
    }

    /// Replica `i`'s address, `http://127.0.0.1:PORT`.
    pub fn url(&self, i: usize) -> &str {
        &self.urls[i]
    }
}

/// Starts the replicas on `database_url` and waits until each is ready.
pub async fn start(database_url: &str, dir: &Path) -> (Vec<Server>, Api) {
    let none: &[(&str, &str)] = &[];
    start_with(database_url, dir, &[none; REPLICAS]).await
}

/// Starts one replica per entry of `envs` on `database_url`, each with that environment
/// added, and waits until each is ready.
pub async fn start_with(
    database_url: &str,
    dir: &Path,
    envs: &[&[(&str, &str)]],
) -> (Vec<Server>, Api) {
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(20))
        .build()
        .unwrap();
    let mut servers = Vec::new();
    for (i, env) in envs.iter().enumerate() {
        let log = dir.join(format!("replica-{i}.log"));
        let mut server = Server::spawn_with(database_url, &log, env);
        server.wait_ready(&client).await;
        servers.push(server);
    }
    let urls = servers.iter().map(|s| s.url.clone()).collect();
    (servers, Api::new(client, urls))
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

/// An assignment answer's keys by index (decimal strings), checked against its fanout.
fn hash_keys(body: &Value) -> Vec<String> {
    let keys: Vec<String> = (body["hash_keys"].as_array())
        .unwrap_or_else(|| panic!("no hash_keys in {body}"))
        .iter()
        .map(|k| k.as_str().unwrap().to_owned())
        .collect();
    assert_eq!(body["fanout"].as_u64(), Some(keys.len() as u64), "{body}");
    assert_eq!(body["hash_key"], body["hash_keys"][0], "{body}");
    keys
}

/// Waits until every replica but `leader` answers `path` with `keys` (`None`: 404), for at
/// most `bound`; answers the longest wait.
async fn followed(
    api: &Api,
    leader: usize,
    path: &str,
    keys: Option<&[String]>,
    bound: Duration,
) -> Duration {
    let committed = Instant::now();
    for follower in (0..REPLICAS).filter(|&r| r != leader) {
        loop {
            let (status, body) = api.get(follower, path).await;
            let seen = (status == 200).then(|| hash_keys(&body));
            if seen.as_deref() == keys {
                break;
            }
            assert!(status == 200 || status == 404, "{status} {body}");
            let count = |keys: Option<&[String]>| keys.map(<[String]>::len);
            assert!(
                committed.elapsed() < bound,
                "replica {follower} answers {path} with {:?} keys, not the {:?} of replica {leader}",
                count(seen.as_deref()),
                count(keys),
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
    committed.elapsed()
}

/// Asks `replica` for `path` until `done`; answers the keys of each answer (`None`: 404).
async fn poll(
    api: Api,
    replica: usize,
    path: String,
    done: Arc<AtomicBool>,
) -> Vec<Option<Vec<String>>> {
    let mut seen = Vec::new();
    while !done.load(Ordering::SeqCst) {
        let (status, body) = api.get(replica, &path).await;
        assert!(status == 200 || status == 404, "{status} {body}");
        seen.push((status == 200).then(|| hash_keys(&body)));
    }
    seen
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_agree_on_fanned_out_keys_and_never_show_half_a_change() {
    let dir = tempfile::tempdir().unwrap();
    let (url, _postgres) = fresh_database(dir.path()).await;
    let backend = backend(&url);
    let (_replicas, api) = start(&url, dir.path()).await;

    // Allocated on one replica, grown on the next, shrunk on the third, released on the
    // first: the others answer the same keys by index within the lag bound.
    let mut slowest = Duration::ZERO;
    for n in 0..REPLICAS {
        let path = format!("/keys/hot-{n}");
        let steps = [
            (Method::POST, json!({"fanout": 2 + n})),
            (Method::PATCH, json!({"fanout": 64, "weight": 100})),
            (Method::PATCH, json!({"fanout": 3})),
        ];
        let mut keys = Vec::new();
        for (step, (method, body)) in steps.into_iter().enumerate() {
            let leader = (n + step) % REPLICAS;
            let (status, answer) = api.call(leader, method, &path, Some(body)).await;
            assert!(status == 200 || status == 201, "{status} {answer}");
            let now = hash_keys(&answer);
            let kept = keys.len().min(now.len());
            assert_eq!(now[..kept], keys[..kept], "keys 0..k stay");
            keys = now;
            let lag = followed(&api, leader, &path, Some(&keys), LAG_BOUND).await;
            slowest = slowest.max(lag);
        }
        let (status, answer) = api.call(n, Method::DELETE, &path, None).await;
        assert_eq!(status, 204, "{answer}");
        slowest = slowest.max(followed(&api, n, &path, None, LAG_BOUND).await);
    }
    println!("{backend}: fanned-out changes followed within {slowest:?}");

    // One replica grows an account from 2 keys to 64 and shrinks it back, over and over,
    // while every replica is asked for it: each answer is keys some change committed.
    let path = "/keys/flip".to_owned();
    let (status, first) = (api.call(
        0,
        Method::POST,
        &path,
        Some(json!({"fanout": 2, "weight": 64})),
    ))
    .await;
    assert_eq!(status, 201, "{first}");
    followed(&api, 0, &path, Some(&hash_keys(&first)), LAG_BOUND).await;
    let mut committed = HashSet::from([hash_keys(&first)]);
    let done = Arc::new(AtomicBool::new(false));
    let pollers: Vec<_> = (0..REPLICAS)
        .map(|r| tokio::spawn(poll(api.clone(), r, path.clone(), done.clone())))
        .collect();
    let until = Instant::now() + Duration::from_secs(3);
    let mut flips = 0;
    while Instant::now() < until {
        let fanout = if flips % 2 == 0 { 64 } else { 2 };
        let body = json!({"fanout": fanout});
        let (status, answer) = api.call(0, Method::PATCH, &path, Some(body)).await;
        assert_eq!(status, 200, "{answer}");
        committed.insert(hash_keys(&answer));
        flips += 1;
    }
    tokio::time::sleep(LAG_BOUND).await;
    done.store(true, Ordering::SeqCst);
    let mut seen: BTreeMap<(usize, usize), u64> = BTreeMap::new();
    for (r, poller) in pollers.into_iter().enumerate() {
        for keys in poller.await.unwrap() {
            let keys = keys.expect("the account is held throughout");
            assert!(
                committed.contains(&keys),
                "replica {r} answered {} keys no change committed: {keys:?}",
                keys.len()
            );
            *seen.entry((r, keys.len())).or_default() += 1;
        }
    }
    println!("{backend}: {flips} flips between 2 and 64 keys; (replica, fanout) seen: {seen:?}");
    for r in 1..REPLICAS {
        for fanout in [2, 64] {
            assert!(
                seen.contains_key(&(r, fanout)),
                "replica {r} never showed {fanout} keys: {seen:?}"
            );
        }
    }

    // One transaction of more events than a follower reads at once: 12 accounts of 1024
    // keys. Every lookup anywhere shows an account with none or all of its keys.
    let done = Arc::new(AtomicBool::new(false));
    let pollers: Vec<_> = (0..WIDE)
        .map(|n| {
            let r = 1 + n % (REPLICAS - 1);
            tokio::spawn(poll(
                api.clone(),
                r,
                format!("/keys/wide-{n}"),
                done.clone(),
            ))
        })
        .collect();
    let accounts: Vec<Value> = (0..WIDE)
        .map(|n| json!({"account": format!("wide-{n}"), "fanout": 1024}))
        .collect();
    let body = json!({ "accounts": accounts });
    // A busy machine may take longer than a change may wait (503, made or not): sent again
    // later, as the answer asks (Retry-After), for up to three minutes (tests beside this
    // one may keep the database's cores busy that long). Taking the batch again answers the
    // keys it was given.
    let mut answer = Value::Null;
    let give_up = Instant::now() + Duration::from_secs(180);
    while Instant::now() < give_up {
        let batch = api.call(0, Method::POST, "/keys/batch", Some(body.clone()));
        let status;
        (status, answer) = batch.await;
        if status == 200 {
            break;
        }
        assert_eq!(status, 503, "{answer}");
        println!("{backend}: the batch was answered 503; sent again after a pause");
        tokio::time::sleep(Duration::from_secs(RETRY_AFTER_S)).await;
    }
    let wide: Vec<Vec<String>> = (answer["items"].as_array())
        .unwrap_or_else(|| panic!("the batch was never taken: {answer}"))
        .iter()
        .map(hash_keys)
        .collect();
    let path = format!("/keys/wide-{}", WIDE - 1);
    let lag = followed(&api, 0, &path, Some(&wide[WIDE - 1]), WIDE_LAG).await;
    done.store(true, Ordering::SeqCst);
    // (account, keys shown) -> how many lookups showed that many of its keys.
    let mut partial: BTreeMap<(usize, usize), u64> = BTreeMap::new();
    let mut lookups = 0;
    for (n, poller) in pollers.into_iter().enumerate() {
        for keys in poller.await.unwrap() {
            lookups += 1;
            if let Some(keys) = keys
                && keys != wide[n]
            {
                *partial.entry((n, keys.len())).or_default() += 1;
            }
        }
    }
    println!(
        "{backend}: {lookups} lookups during a batch of {WIDE} x 1024 keys, followed in {lag:?}"
    );
    assert!(
        partial.is_empty(),
        "lookups showed part of the batch ((account, keys): lookups): {partial:?}"
    );
    let mut db = Db::connect(&url).await;
    check_store(&db.key_rows().await, &db.indexed_events().await);
}

/// A staged move switches on every replica at `switch_at`: none answers the new key before
/// it, all do within a second of it (followers learn of the move within their lag; the
/// switch itself is the clock's).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_replica_switches_a_staged_move_at_switch_at() {
    use crate::staged::{now_ms, unix_ms};
    let dir = tempfile::tempdir().unwrap();
    let (url, _postgres) = fresh_database(dir.path()).await;
    let backend = backend(&url);
    let (_replicas, api) = start(&url, dir.path()).await;
    // Eight accounts on replica 0, those on shard 1 of 2 released: two moves to even them.
    for i in 0..8 {
        let (status, body) = api
            .call(0, Method::POST, &format!("/keys/sw-{i}"), None)
            .await;
        assert_eq!(status, 201, "{body}");
    }
    for i in 0..8 {
        let (_, on) = api
            .get(0, &format!("/shard-of?account=sw-{i}&shards=2"))
            .await;
        if on["shard_index"] == 1 {
            let (status, _) = (api.call(0, Method::DELETE, &format!("/keys/sw-{i}"), None)).await;
            assert_eq!(status, 204);
        }
    }
    tokio::time::sleep(LAG_BOUND).await;
    let (status, plan) = api.get(1, "/rebalance/preview?shards=2").await;
    assert_eq!(status, 200, "{plan}");
    let body = json!({"plan_id": plan["plan_id"], "switch_after_s": 3});
    let (status, applied) = api.call(2, Method::POST, "/rebalance", Some(body)).await;
    assert_eq!(status, 200, "{applied}");
    let moves = applied["moves"].as_array().unwrap().clone();
    assert_eq!(moves.len(), 2, "{applied}");
    let switch_at = unix_ms(applied["switch_at"].as_str().unwrap());

    // Every replica, every 20 ms, until a second and a half past the switch: (replica,
    // sent, received, answer).
    let mut answers = Vec::new();
    while now_ms() < switch_at + 1500 {
        for r in 0..REPLICAS {
            for m in &moves {
                let sent = now_ms();
                let (status, body) = api
                    .get(r, &format!("/keys/{}", m["account"].as_str().unwrap()))
                    .await;
                assert_eq!(status, 200, "{body}");
                answers.push((r, sent, now_ms(), m.clone(), body));
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut first_new: BTreeMap<usize, i64> = BTreeMap::new();
    let mut announced = 0;
    for (r, sent, received, m, body) in &answers {
        let new = body["hash_key"] == m["to"] && body.get("next").is_none();
        let old = body["hash_key"] == m["from"];
        assert!(new || old, "replica {r} answered neither key: {body}");
        if new {
            assert!(
                *received >= switch_at,
                "replica {r} answered the new key {} ms before switch_at: {body}",
                switch_at - received
            );
            first_new.entry(*r).or_insert(*received);
        } else {
            assert!(
                *sent < switch_at + LAG_BOUND.as_millis() as i64,
                "replica {r} still answered the old key {} ms after switch_at: {body}",
                sent - switch_at
            );
            if body["next"]["hash_key"] == m["to"] {
                assert_eq!(body["next"]["switch_at"], applied["switch_at"], "{body}");
                announced += 1;
            }
        }
    }
    let delays: Vec<i64> = first_new.values().map(|t| t - switch_at).collect();
    println!(
        "{backend}: {} lookups, {announced} answered the old key with next; each replica's \
         first new key {delays:?} ms after switch_at",
        answers.len()
    );
    assert_eq!(first_new.len(), REPLICAS, "every replica switched");
    assert!(announced > 0, "the move was announced before the switch");
}
