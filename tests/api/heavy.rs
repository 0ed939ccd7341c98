//! The heaviest reads: the largest split plan answers a correct plan, and the service keeps
//! answering other requests while it is computed.

use std::collections::BTreeMap;

use reqwest::Method;
use serde_json::{Value, json};

use keyspread::config::ServeConfig;

use crate::helpers::{TestApp, assert_problem, spawn_app_with};

/// The most open shards a split plan may aim at (and a stream may have).
const LARGEST_TARGET: u64 = keyspread::keyspace::MAX_SHARDS as u64;

const ACCOUNTS: u64 = 2_000;

/// A request timeout of a minute: the answer is several MB of JSON, which an unoptimized
/// build on a busy machine takes seconds to write (a release build, well under one).
fn patient(config: &mut ServeConfig) {
    config.request_timeout_secs = 60;
}

/// A one-shard stream `big` and `ACCOUNTS` accounts of weights 1 to 5.
async fn big_stream(app: &TestApp) {
    let accounts: Vec<Value> = (0..ACCOUNTS)
        .map(|i| json!({"account": format!("acct-{i}"), "weight": i % 5 + 1}))
        .collect();
    let batch = app
        .post("/keys/batch", Some(json!({ "accounts": accounts })))
        .await;
    assert_eq!(batch.status, 200, "{}", batch.body);
    let stream = app
        .call(Method::PUT, "/streams/big", Some(json!({"shard_count": 1})))
        .await;
    assert_eq!(stream.status, 201, "{}", stream.body);
}

fn key(value: &Value) -> u128 {
    value.as_str().expect("a decimal string").parse().unwrap()
}

/// Replays the plan's calls on the one-shard map and checks they end at the shards it lists,
/// which tile the keyspace.
fn assert_plan_comes_true(plan: &Value) {
    // start -> (shard id, end)
    let mut open = BTreeMap::from([(0u128, ("shardId-000000000000".to_owned(), u128::MAX))]);
    let operations = plan["operations"].as_array().unwrap();
    for op in operations {
        assert_eq!(op["action"], "split", "{op}");
        let at = key(&op["new_starting_hash_key"]);
        let (&start, (id, end)) = open.range(..at).next_back().unwrap();
        let end = *end;
        assert_eq!(op["shard_to_split"], id.as_str(), "{op}");
        assert!(start + 1 < at && at < end, "SplitShard's rule broken: {op}");
        let children = op["resulting_shards"].as_array().unwrap();
        open.insert(start, (children[0].as_str().unwrap().to_owned(), at - 1));
        open.insert(at, (children[1].as_str().unwrap().to_owned(), end));
    }
    let listed: Vec<(u128, (String, u128))> = plan["shards"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            let id = s["shard_id"].as_str().unwrap().to_owned();
            (
                key(&s["starting_hash_key"]),
                (id, key(&s["ending_hash_key"])),
            )
        })
        .collect();
    assert_eq!(listed, open.into_iter().collect::<Vec<_>>());
    assert_eq!(
        plan["commands"].as_array().unwrap().len(),
        2 * operations.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_largest_split_plan_answers_a_correct_plan() {
    let app = spawn_app_with(patient).await;
    big_stream(&app).await;
    let plan = app
        .get(&format!("/streams/big/split-plan?target={LARGEST_TARGET}"))
        .await;
    assert_eq!(plan.status, 200, "{}", plan.body);
    let body = &plan.body;
    assert_eq!(body["target"], LARGEST_TARGET);
    assert_eq!(
        body["shards"].as_array().unwrap().len() as u64,
        LARGEST_TARGET
    );
    assert_eq!(
        body["operations"].as_array().unwrap().len() as u64,
        LARGEST_TARGET - 1
    );
    assert_plan_comes_true(body);
    let shards = body["shards"].as_array().unwrap();
    let accounts: u64 = shards.iter().map(|s| s["accounts"].as_u64().unwrap()).sum();
    assert_eq!(accounts, ACCOUNTS);
    assert!(body["spread"].as_u64().unwrap() <= body["heaviest_account"].as_u64().unwrap());
    let uniform = body["uniform_scaling"]["shards"].as_array().unwrap();
    assert_eq!(uniform.len() as u64, LARGEST_TARGET);
    let uniform_accounts: u64 = uniform
        .iter()
        .map(|s| s["accounts"].as_u64().unwrap())
        .sum();
    assert_eq!(uniform_accounts, ACCOUNTS);

    let past = app
        .get(&format!(
            "/streams/big/split-plan?target={}",
            LARGEST_TARGET + 1
        ))
        .await;
    assert_problem(
        &past,
        400,
        &format!("shard count must be between 1 and {LARGEST_TARGET}"),
    );
}

/// One runtime thread serves every request: a plan computed on it would hold the health
/// check until the plan is done.
#[tokio::test(flavor = "current_thread")]
async fn health_answers_while_the_largest_split_plan_is_computed() {
    let app = spawn_app_with(patient).await;
    big_stream(&app).await;
    let plan = tokio::spawn(
        app.client
            .get(app.url(&format!("/streams/big/split-plan?target={LARGEST_TARGET}")))
            .send(),
    );
    // Let the server take the plan's request before asking for its health.
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    let health = app.get("/healthz").await;
    assert_eq!(health.status, 200);
    assert!(
        !plan.is_finished(),
        "the health check was answered only after the split plan"
    );
    let plan = plan.await.unwrap().unwrap();
    assert_eq!(plan.status(), 200);
}
