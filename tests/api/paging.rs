//! Paged lists keep their promise while writes go on: a walk of `GET /keys`, `GET /moves`
//! or `GET /events` lists every item that exists throughout it exactly once.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use reqwest::Method;
use serde_json::{Value, json};

use crate::helpers::{TestApp, spawn_app};

/// Every item of a paged list from its start: `GET {path}` with `limit`, each page's
/// `items` (or `field`) named by `name`, following `next` until it is null. Panics past
/// `pages` pages.
async fn walk(
    app: &TestApp,
    path: &str,
    field: &str,
    name: impl Fn(&Value) -> String,
    pages: usize,
) -> Vec<String> {
    let mut items = Vec::new();
    let mut query = String::new();
    for _ in 0..pages {
        let page = app.get(&format!("{path}{query}")).await;
        assert_eq!(page.status, 200, "{path}{query}: {}", page.body);
        items.extend(page.body[field].as_array().unwrap().iter().map(&name));
        match &page.body["next"] {
            Value::Null => return items,
            next => {
                query = format!(
                    "&after={}",
                    next.as_str().map_or(next.to_string(), str::to_owned)
                )
            }
        }
    }
    panic!("{path}: more than {pages} pages");
}

/// Asserts that `walked` names no item twice and holds every one of `throughout`.
fn once_each(what: &str, walked: &[String], throughout: &BTreeSet<String>) {
    let distinct: BTreeSet<&String> = walked.iter().collect();
    assert_eq!(distinct.len(), walked.len(), "{what}: an item listed twice");
    let missed: Vec<&String> = throughout
        .iter()
        .filter(|i| !distinct.contains(i))
        .collect();
    assert!(
        missed.is_empty(),
        "{what}: {} items missed: {missed:?}",
        missed.len()
    );
}

/// Rounds of writes after which the writer rebalances: early, so that the rebalance falls
/// inside the walks however slowly the machine writes.
const REBALANCE_AT: u64 = 5;

/// Allocations, releases and a rebalance whose moves stay pending, until `stop`.
async fn writes(app: Arc<TestApp>, stop: Arc<AtomicBool>) -> u64 {
    let mut n = 0u64;
    while !stop.load(Ordering::Relaxed) {
        app.allocate(&format!("churn-{n:05}")).await;
        if n >= 3 {
            let gone = app.delete(&format!("/keys/churn-{:05}", n - 3)).await;
            assert_eq!(gone.status, 204, "{}", gone.body);
        }
        if n == REBALANCE_AT {
            rebalance(&app, 5).await;
        }
        n += 1;
    }
    n
}

/// Grows the primary stream `s` to `shards` and applies the plan, its moves pending for
/// an hour.
async fn rebalance(app: &TestApp, shards: u64) {
    let body = json!({"shard_count": shards, "primary": true});
    let put = app.call(Method::PUT, "/streams/s", Some(body)).await;
    assert_eq!(put.status, 200, "{}", put.body);
    let preview = app.get("/rebalance/preview?stream=s").await;
    assert_eq!(preview.status, 200, "{}", preview.body);
    let body = json!({"plan_id": preview.body["plan_id"], "switch_after_s": 3600});
    let applied = app.post("/rebalance", Some(body)).await;
    assert_eq!(applied.status, 200, "{}", applied.body);
}

/// Primary stream `s` of two shards, the first holding 1/256 of the keyspace: the keys
/// balanced over it crowd one end of the keyspace, so a uniform map moves many of them.
async fn skewed_primary(app: &TestApp) {
    let cut = 1u128 << 120;
    let open = json!({"StartingSequenceNumber": "1"});
    let shard = |id: &str, lo: u128, hi: u128| {
        json!({"ShardId": id, "SequenceNumberRange": open,
               "HashKeyRange": {"StartingHashKey": lo.to_string(), "EndingHashKey": hi.to_string()}})
    };
    let body = json!({"Shards": [shard("shardId-a", 0, cut - 1), shard("shardId-b", cut, u128::MAX)],
                      "primary": true});
    let put = app.call(Method::PUT, "/streams/s", Some(body)).await;
    assert_eq!(put.status, 201, "{}", put.body);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn walks_of_keys_moves_and_events_list_each_item_once_while_writes_go_on() {
    let app = Arc::new(spawn_app().await);
    skewed_primary(&app).await;
    let accounts: Vec<Value> = (0..400)
        .map(|i| json!({"account": format!("stay-{i:04}")}))
        .collect();
    let made = app
        .post("/keys/batch", Some(json!({ "accounts": accounts })))
        .await;
    assert_eq!(made.status, 200, "{}", made.body);
    rebalance(&app, 4).await;
    let stay: BTreeSet<String> = (0..400).map(|i| format!("stay-{i:04}")).collect();
    let pending = app.get("/moves?limit=1000").await;
    let moves: BTreeSet<String> = (pending.body["items"].as_array().unwrap().iter())
        .map(|m| m["event_id"].to_string())
        .collect();
    assert!(moves.len() > 50, "{}", pending.body);

    let stop = Arc::new(AtomicBool::new(false));
    let writer = tokio::spawn(writes(Arc::clone(&app), Arc::clone(&stop)));
    let account = |a: &Value| a["account"].as_str().unwrap().to_owned();
    let keys = walk(&app, "/keys?limit=10", "items", account, 1000).await;
    let event_id = |m: &Value| m["event_id"].to_string();
    let pending = walk(&app, "/moves?limit=10", "items", event_id, 1000).await;
    // The log, walked until it is empty while writes still go on.
    let mut events = Vec::new();
    let mut after = 0;
    for _ in 0..10_000 {
        let page = app.get(&format!("/events?limit=20&after={after}")).await;
        assert_eq!(page.status, 200, "{}", page.body);
        let ids = page.body["events"].as_array().unwrap().iter();
        events.extend(ids.map(|e| e["id"].as_i64().unwrap()));
        after = page.body["next"].as_i64().unwrap();
        if page.body["events"].as_array().unwrap().is_empty() {
            break;
        }
    }
    stop.store(true, Ordering::Relaxed);
    let written = writer.await.unwrap();
    assert!(
        written > REBALANCE_AT,
        "the walks ended after {written} rounds of writes, before the rebalance"
    );

    once_each("GET /keys", &keys, &stay);
    let mut sorted = keys.clone();
    sorted.sort();
    assert_eq!(keys, sorted, "GET /keys in account order");
    once_each("GET /moves", &pending, &moves);
    let logged: Vec<i64> = app.db().await.event_ids().await;
    let ours: Vec<i64> = logged.into_iter().filter(|&id| id <= after).collect();
    assert_eq!(
        events, ours,
        "GET /events: every event up to {after}, once, in order"
    );
}
