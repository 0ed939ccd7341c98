//! One truth where features meet: every replica folds the log and the clock the same way,
//! only the database's clock frees a key, and the database itself refuses a second holder
//! of any key, pending old keys included.

use std::time::{Duration, Instant};

use reqwest::Method;
use serde_json::{Value, json};

use sqlx::Connection;

use crate::helpers::{fresh_database, spawn_app};
use crate::replicas::{Api, start_with};
use crate::staged::{lopsided, now_ms, sleep_until, unix_ms};

/// Allocates `account` on replica `i`; answers its keys.
async fn allocate(api: &Api, i: usize, account: &str) -> Vec<String> {
    let (status, body) = api
        .call(i, Method::POST, &format!("/keys/{account}"), None)
        .await;
    assert_eq!(status, 201, "allocate {account} on replica {i}: {body}");
    keys(&body["hash_keys"])
}

/// Waits up to 1 s (the documented lag bound) until every replica answers each of
/// `accounts` as replica 0 does: status, keys in force, and the next ones.
async fn agree(api: &Api, replicas: usize, accounts: &[String]) {
    let started = Instant::now();
    loop {
        let mut differ = None;
        'all: for account in accounts {
            let path = format!("/keys/{account}");
            let truth = answer(api.get(0, &path).await);
            for i in 1..replicas {
                let seen = answer(api.get(i, &path).await);
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
async fn stage_moves(api: &Api, switch_after_s: u64) -> (Vec<String>, Vec<String>, i64) {
    let mut held = Vec::new();
    for i in 0..8 {
        allocate(api, 0, &format!("acct-{i}")).await;
    }
    for i in 0..8 {
        let account = format!("acct-{i}");
        let (_, on) = api
            .get(0, &format!("/shard-of?account={account}&shards=2"))
            .await;
        if on["shard_index"] == 1 {
            let (status, _) = api
                .call(0, Method::DELETE, &format!("/keys/{account}"), None)
                .await;
            assert_eq!(status, 204);
        } else {
            held.push(account);
        }
    }
    let (status, preview) = api.get(0, "/rebalance/preview?shards=2").await;
    assert_eq!(status, 200, "{preview}");
    let body = json!({"plan_id": preview["plan_id"], "switch_after_s": switch_after_s});
    let (status, applied) = api.call(0, Method::POST, "/rebalance", Some(body)).await;
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
    let (replicas, api) = start_with(&url, dir.path(), &[&[], &[]]).await;
    let (mut accounts, old, switch_at) = stage_moves(&api, 1).await;
    // Replica 1 is asked nothing until well past the switch.
    sleep_until(switch_at, 2_000).await;

    let mut reused = 0;
    for n in 0..6 {
        let account = format!("new-{n}");
        let got = allocate(&api, 0, &account).await;
        reused += got.iter().filter(|k| old.contains(k)).count();
        accounts.push(account);
    }
    assert!(
        reused > 0,
        "the walk hands out the freed old keys {old:?} first"
    );
    // A released account's key goes to the next account: replica 1 must not answer it twice.
    let victim = accounts.remove(0);
    let (status, _) = api
        .call(0, Method::DELETE, &format!("/keys/{victim}"), None)
        .await;
    assert_eq!(status, 204);
    let thief = allocate(&api, 0, "thief").await;
    accounts.extend([victim, "thief".to_owned()]);
    agree(&api, replicas.len(), &accounts).await;
    assert!(!thief.is_empty());

    // It decides on the same truth: a change through it finds the thief's keys.
    let (status, body) = api
        .call(1, Method::PATCH, "/keys/thief", Some(json!({"weight": 3})))
        .await;
    assert_eq!((status, keys(&body["hash_keys"])), (200, thief), "{body}");
    let (status, ready) = api.get(1, "/readyz").await;
    assert_eq!(status, 200, "{ready}");
    for server in &replicas {
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
    let (replicas, api) = start_with(&url, dir.path(), &[&[]]).await;

    let (status, body) = api.get(0, "/keys/acme").await;
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
        let (status, problem) = api.call(0, method.clone(), path, body).await;
        assert_eq!(status, 503, "{method} {path}: {problem}");
        let detail = problem["detail"].as_str().unwrap_or_default();
        assert!(detail.contains("upgrade"), "{method} {path}: {detail}");
    }
    let log = replicas[0].log_text();
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
    let Some(ahead) = crate::skip::clock_ahead(TEST, 4) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (url, _pg) = fresh_database(dir.path()).await;
    let (replicas, api) = start_with(&url, dir.path(), &[&[], &ahead.env()]).await;
    let (mut accounts, old, switch_at) = stage_moves(&api, 3).await;
    // By the fast replica's clock the switch has passed; by the database's it has not.
    // (Lookups of the moving accounts differ meanwhile: each replica switches producers by
    // its own clock.)
    sleep_until(switch_at - 3_000, 500).await;
    let mut early = Vec::new();
    for n in 0..6 {
        let account = format!("early-{n}");
        let got = allocate(&api, 1, &account).await;
        assert!(
            now_ms() >= switch_at || got.iter().all(|k| !old.contains(k)),
            "{account} got a pending old key {got:?} before the switch"
        );
        early.push(account);
    }
    agree(&api, replicas.len(), &early).await;
    accounts.extend(early);
    sleep_until(switch_at, 300).await;
    allocate(&api, 0, "after").await;
    accounts.push("after".into());
    agree(&api, replicas.len(), &accounts).await;
    for server in &replicas {
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

/// What a change logs is by the database's clock: a replica whose clock runs 3 s ahead
/// (libfaketime) logs its allocations, and their `created_at`, at the database's time, not
/// 3 s in the future (both the one-statement allocation and the transaction). Postgres only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_whose_clock_runs_ahead_logs_by_the_databases_clock() {
    const TEST: &str = "a_replica_whose_clock_runs_ahead_logs_by_the_databases_clock";
    let Some(ahead) = crate::skip::clock_ahead(TEST, 3) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (url, _pg) = fresh_database(dir.path()).await;
    let (_replicas, api) = start_with(&url, dir.path(), &[&ahead.env()]).await;
    let mut db = sqlx::PgConnection::connect(&url).await.unwrap();
    for n in 0..4 {
        let account = format!("now-{n}");
        let before = db_now(&mut db).await;
        let (status, body) = if n % 2 == 0 {
            api.call(0, Method::POST, &format!("/keys/{account}"), None)
                .await
        } else {
            let sent = (api.client().post(format!("{}/keys/{account}", api.url(0))))
                .header("Idempotency-Key", format!("clock-{n}"))
                .send()
                .await
                .unwrap();
            (sent.status().as_u16(), sent.json::<Value>().await.unwrap())
        };
        let after = db_now(&mut db).await;
        assert_eq!(status, 201, "{body}");
        let (at,): (i64,) = sqlx::query_as("SELECT at FROM events WHERE account = $1")
            .bind(&account)
            .fetch_one(&mut db)
            .await
            .unwrap();
        let created = crate::staged::unix_ms(body["created_at"].as_str().unwrap());
        for (what, t) in [("the event's at", at), ("created_at", created)] {
            assert!(
                before - 500 <= t && t <= after + 500,
                "{account}: {what} {t} is {} ms after the database's clock read after it",
                t - after
            );
        }
    }
}

/// The database's clock, Unix ms.
async fn db_now(db: &mut sqlx::PgConnection) -> i64 {
    let sql = "SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint";
    sqlx::query_scalar(sql).fetch_one(db).await.unwrap()
}
