//! One truth where features meet: every replica folds the log and the clock the same way,
//! only the database's clock frees a key, and the database itself refuses a second holder
//! of any key, pending old keys included.

use std::path::Path;
use std::time::{Duration, Instant};

use reqwest::Method;
use serde_json::{Value, json};

use crate::helpers::{fresh_database, spawn_app};
use crate::process::Server;
use crate::staged::{lopsided, now_ms, sleep_until, unix_ms};

/// Replica processes on one database, and a client for them.
struct Replicas {
    servers: Vec<Server>,
    client: reqwest::Client,
}

impl Replicas {
    /// Starts one replica per entry of `envs` (extra environment each) on `database_url`.
    async fn start(database_url: &str, dir: &Path, envs: &[&[(&str, &str)]]) -> Replicas {
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
        Replicas { servers, client }
    }

    /// Sends a request to replica `i`: status and JSON body (a string if not JSON).
    async fn call(
        &self,
        i: usize,
        method: Method,
        path: &str,
        body: Option<Value>,
    ) -> (u16, Value) {
        let mut request = (self.client).request(method, format!("{}{path}", self.servers[i].url));
        if let Some(body) = body {
            request = request.json(&body);
        }
        let response = request.send().await.unwrap();
        let status = response.status().as_u16();
        let text = response.text().await.unwrap();
        (
            status,
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
        )
    }

    async fn get(&self, i: usize, path: &str) -> (u16, Value) {
        self.call(i, Method::GET, path, None).await
    }

    /// Allocates `account` on replica `i`; answers its keys.
    async fn allocate(&self, i: usize, account: &str) -> Vec<String> {
        let (status, body) = self
            .call(i, Method::POST, &format!("/keys/{account}"), None)
            .await;
        assert_eq!(status, 201, "allocate {account} on replica {i}: {body}");
        keys(&body["hash_keys"])
    }

    /// Waits up to 1 s (the documented lag bound) until every replica answers each of
    /// `accounts` as replica 0 does: status, keys in force, and the next ones.
    async fn agree(&self, accounts: &[String]) {
        let started = Instant::now();
        loop {
            let mut differ = None;
            'all: for account in accounts {
                let path = format!("/keys/{account}");
                let truth = answer(self.get(0, &path).await);
                for i in 1..self.servers.len() {
                    let seen = answer(self.get(i, &path).await);
                    if seen != truth {
                        differ = Some(format!("{path}: replica 0 {truth:?}, replica {i} {seen:?}"));
                        break 'all;
                    }
                }
            }
            let Some(differ) = differ else { return };
            assert!(
                started.elapsed() < Duration::from_secs(1),
                "replicas still disagree after 1 s: {differ}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// What a lookup tells a producer: status, keys in force, next keys and their switch.
fn answer((status, body): (u16, Value)) -> (u16, Value, Value) {
    (status, body["hash_keys"].clone(), body["next"].clone())
}

fn keys(list: &Value) -> Vec<String> {
    let list = list
        .as_array()
        .unwrap_or_else(|| panic!("a list of keys: {list}"));
    list.iter()
        .map(|k| k.as_str().unwrap().to_owned())
        .collect()
}

/// On replica 0: eight accounts over two uniform shards, those on shard 1 released, and
/// the plan that evens them out applied with `switch_after_s`. Answers the accounts still
/// held, the moves' old keys and the switch time (Unix milliseconds).
async fn stage_moves(replicas: &Replicas, switch_after_s: u64) -> (Vec<String>, Vec<String>, i64) {
    let mut held = Vec::new();
    for i in 0..8 {
        replicas.allocate(0, &format!("acct-{i}")).await;
    }
    for i in 0..8 {
        let account = format!("acct-{i}");
        let (_, on) = replicas
            .get(0, &format!("/shard-of?account={account}&shards=2"))
            .await;
        if on["shard_index"] == 1 {
            let (status, _) = replicas
                .call(0, Method::DELETE, &format!("/keys/{account}"), None)
                .await;
            assert_eq!(status, 204);
        } else {
            held.push(account);
        }
    }
    let (status, preview) = replicas.get(0, "/rebalance/preview?shards=2").await;
    assert_eq!(status, 200, "{preview}");
    let body = json!({"plan_id": preview["plan_id"], "switch_after_s": switch_after_s});
    let (status, applied) = replicas
        .call(0, Method::POST, "/rebalance", Some(body))
        .await;
    assert_eq!(status, 200, "{applied}");
    let moves = applied["moves"].as_array().unwrap();
    assert!(!moves.is_empty(), "a lopsided table moves: {applied}");
    let old: Vec<String> = moves
        .iter()
        .map(|m| m["from"].as_str().unwrap().to_owned())
        .collect();
    let switch_at = unix_ms(applied["switch_at"].as_str().unwrap());
    (held, old, switch_at)
}

/// A replica that serves nothing while a staged switch passes still follows the log: when
/// another replica hands the freed old keys to new accounts, it answers them, and it
/// answers nobody a key that is now another account's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_idle_through_a_staged_switch_follows_and_answers_the_truth() {
    let dir = tempfile::tempdir().unwrap();
    let (url, _pg) = fresh_database(dir.path()).await;
    let replicas = Replicas::start(&url, dir.path(), &[&[], &[]]).await;
    let (mut accounts, old, switch_at) = stage_moves(&replicas, 1).await;
    // Replica 1 is asked nothing until well past the switch.
    sleep_until(switch_at, 2_000).await;

    let mut reused = 0;
    for n in 0..6 {
        let account = format!("new-{n}");
        let got = replicas.allocate(0, &account).await;
        reused += got.iter().filter(|k| old.contains(k)).count();
        accounts.push(account);
    }
    assert!(
        reused > 0,
        "the walk hands out the freed old keys {old:?} first"
    );
    // A released account's key goes to the next account: replica 1 must not answer it twice.
    let victim = accounts.remove(0);
    let (status, _) = replicas
        .call(0, Method::DELETE, &format!("/keys/{victim}"), None)
        .await;
    assert_eq!(status, 204);
    let thief = replicas.allocate(0, "thief").await;
    accounts.extend([victim, "thief".to_owned()]);
    replicas.agree(&accounts).await;
    assert!(!thief.is_empty());

    // It decides on the same truth: a change through it finds the thief's keys.
    let (status, body) = replicas
        .call(1, Method::PATCH, "/keys/thief", Some(json!({"weight": 3})))
        .await;
    assert_eq!((status, keys(&body["hash_keys"])), (200, thief), "{body}");
    let (status, ready) = replicas.get(1, "/readyz").await;
    assert_eq!(status, 200, "{ready}");
    for server in &replicas.servers {
        let log = server.log_text();
        assert!(
            !log.contains("cannot follow"),
            "a replica stopped following:\n{log}"
        );
    }
}

/// The database refuses to give a pending old key to another account, even to a
/// keyspread that knows nothing of staged moves (the SQL an earlier release sends); once
/// the switch has passed, by the database's clock, the key is free again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_database_refuses_a_pending_old_key_to_any_writer() {
    let app = spawn_app().await;
    lopsided(&app).await;
    let preview = app.get("/rebalance/preview?shards=2").await.body;
    let applied = app
        .post(
            "/rebalance",
            Some(json!({"plan_id": preview["plan_id"], "switch_after_s": 2})),
        )
        .await;
    assert_eq!(applied.status, 200, "{}", applied.body);
    let moves = applied.body["moves"].as_array().unwrap().clone();
    let switch_at = unix_ms(applied.body["switch_at"].as_str().unwrap());
    let old: u128 = moves[0]["from"].as_str().unwrap().parse().unwrap();
    let new: u128 = moves[0]["to"].as_str().unwrap().parse().unwrap();

    let mut db = app.db().await;
    // What a release before fanout and staged moves sends to insert an assignment.
    const OLD_INSERT: &str =
        "INSERT INTO assignments (account, hash_key, weight, created_at) VALUES ($1, $2, 1, 0)";
    let refused = db.try_execute_with_key(OLD_INSERT, "intruder", old).await;
    let err = refused.expect_err("a pending old key is refused");
    assert!(err.contains("pending old key"), "{err}");
    // A current key was refused before (the unique index): still so.
    let err = db
        .try_execute_with_key(OLD_INSERT, "intruder", new)
        .await
        .expect_err("held");
    assert!(!err.is_empty());

    sleep_until(switch_at, 200).await;
    db.try_execute_with_key(OLD_INSERT, "latecomer", old)
        .await
        .expect("free once the switch has passed");
}

/// From this release on, a keyspread whose database a newer release migrated serves reads
/// and refuses every change with 503, saying in its log and its answer to upgrade.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keyspread_older_than_its_database_refuses_changes() {
    let app = spawn_app().await;
    let key = app.allocate("acme").await;
    let stream = json!({"shard_count": 2});
    let put = app.call(Method::PUT, "/streams/old", Some(stream)).await;
    assert_eq!(put.status, 201, "{}", put.body);
    app.db().await.record_newer_migration().await;
    let dir = tempfile::tempdir().unwrap();
    let url = app.config.database_url.clone();
    let replicas = Replicas::start(&url, dir.path(), &[&[]]).await;

    let (status, body) = replicas.get(0, "/keys/acme").await;
    assert_eq!(
        (status, body["hash_key"].as_str()),
        (200, Some(key.as_str()))
    );
    for (method, path, body) in [
        (Method::POST, "/keys/globex", None),
        (Method::DELETE, "/keys/acme", None),
        (Method::PATCH, "/keys/acme", Some(json!({"weight": 2}))),
        (Method::PUT, "/streams/s", Some(json!({"shard_count": 2}))),
        (Method::PUT, "/streams/old/workers/w1", Some(json!({}))),
    ] {
        let (status, problem) = replicas.call(0, method.clone(), path, body).await;
        assert_eq!(status, 503, "{method} {path}: {problem}");
        let detail = problem["detail"].as_str().unwrap_or_default();
        assert!(detail.contains("upgrade"), "{method} {path}: {detail}");
    }
    let log = replicas.servers[0].log_text();
    assert!(
        log.contains("migrated by a newer keyspread") && log.contains("upgrade it"),
        "{log}"
    );
    assert_eq!(app.get("/keys/acme").await.body["hash_key"], key.as_str());
}

/// Replica clocks do not decide who may take a key: a replica whose clock runs seconds
/// ahead (libfaketime) does not hand out a pending old key before the database's clock
/// reaches the switch, and the true-clock replica keeps following. Postgres only: SQLite
/// replicas share one host, and so one clock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_whose_clock_runs_ahead_hands_out_no_pending_old_key() {
    const TEST: &str = "a_replica_whose_clock_runs_ahead_hands_out_no_pending_old_key";
    if crate::skip::postgres_only(TEST).is_none() {
        return;
    }
    let Some(faketime) = crate::skip::faketime_library(TEST) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (url, _pg) = fresh_database(dir.path()).await;
    let ahead: &[(&str, &str)] = &[
        ("LD_PRELOAD", faketime.as_str()),
        ("FAKETIME", "+4s"),
        ("FAKETIME_DONT_RESET", "1"),
    ];
    let replicas = Replicas::start(&url, dir.path(), &[&[], ahead]).await;
    let (mut accounts, old, switch_at) = stage_moves(&replicas, 3).await;
    // By the fast replica's clock the switch has passed; by the database's it has not.
    // (Lookups of the moving accounts differ meanwhile: each replica switches producers by
    // its own clock.)
    sleep_until(switch_at - 3_000, 500).await;
    let mut early = Vec::new();
    for n in 0..6 {
        let account = format!("early-{n}");
        let got = replicas.allocate(1, &account).await;
        assert!(
            now_ms() >= switch_at || got.iter().all(|k| !old.contains(k)),
            "{account} got a pending old key {got:?} before the switch"
        );
        early.push(account);
    }
    replicas.agree(&early).await;
    accounts.extend(early);
    sleep_until(switch_at, 300).await;
    replicas.allocate(0, "after").await;
    accounts.push("after".into());
    replicas.agree(&accounts).await;
    for server in &replicas.servers {
        assert!(!server.log_text().contains("cannot follow"));
    }
}

/// A replica that cannot apply the log (here: a release of a key nobody holds, written
/// behind its back) would answer a past state: after a short grace it says it is not
/// ready, so a balancer stops sending it lookups.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_that_cannot_apply_the_log_is_not_ready() {
    let app = spawn_app().await;
    app.allocate("acme").await;
    assert_eq!(app.get("/readyz").await.status, 200);
    let ghost = "INSERT INTO events (at, kind, account, key_before, weight) \
                 VALUES (0, 'release', $1, $2, 1)";
    let mut db = app.db().await;
    db.try_execute_with_key(ghost, "ghost", 12345)
        .await
        .expect("logged");
    let started = Instant::now();
    loop {
        let ready = app.get("/readyz").await;
        if ready.status == 503 {
            let detail = ready.body["detail"].as_str().unwrap_or_default();
            assert!(detail.contains("cannot apply the event log"), "{detail}");
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "still ready: {}",
            ready.body
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
