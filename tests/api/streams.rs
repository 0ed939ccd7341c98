//! Registered streams: their maps, the primary one, and what a change does to balance.

use reqwest::Method;
use serde_json::{Value, json};

use crate::helpers::{TestApp, assert_problem, spawn_app, spawn_app_with};

async fn put(app: &TestApp, name: &str, body: Value) -> crate::helpers::Answer {
    app.call(Method::PUT, &format!("/streams/{name}"), Some(body))
        .await
}

fn counts(shards: &Value) -> Vec<u64> {
    shards
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["accounts"].as_u64().unwrap())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn register_list_show_and_forget() {
    let app = spawn_app().await;
    let created = put(&app, "orders", json!({"shard_count": 3})).await;
    assert_eq!(created.status, 201, "{}", created.body);
    assert_eq!(created.body["stream"]["shard_count"], 3);
    assert_eq!(created.body["stream"]["primary"], false);
    assert_eq!(created.body["stream"]["next_shard_number"], 3);
    assert!(created.body["before"].is_null());
    assert_eq!(
        created.body["stream"]["shards"][2]["shard_id"],
        "shardId-000000000002"
    );
    let again = put(&app, "orders", json!({"shard_count": 4})).await;
    assert_eq!(again.status, 200);
    assert_eq!(again.body["before"].as_array().unwrap().len(), 3);
    assert_eq!(again.body["after"].as_array().unwrap().len(), 4);

    let listed = app.get("/streams").await;
    assert_eq!(listed.body.as_array().unwrap().len(), 1);
    assert_eq!(app.get("/streams/orders").await.body["shard_count"], 4);
    assert_eq!(app.delete("/streams/orders").await.status, 204);
    assert_problem(&app.get("/streams/orders").await, 404, "orders");
    assert_problem(&app.delete("/streams/orders").await, 404, "orders");
    assert_problem(
        &app.get("/shard-of?hash_key=1&stream=orders").await,
        404,
        "no stream named",
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_are_listed_a_page_at_a_time_by_name() {
    let app = spawn_app().await;
    for name in ["e", "b", "d", "a", "c"] {
        assert_eq!(put(&app, name, json!({"shard_count": 2})).await.status, 201);
    }
    // Follow the Link header from the first page to the last.
    let mut path = "/streams?limit=2".to_owned();
    let mut pages = Vec::new();
    loop {
        let response = app.client.get(app.url(&path)).send().await.unwrap();
        assert_eq!(response.status(), 200);
        let link = response
            .headers()
            .get("link")
            .map(|l| l.to_str().unwrap().to_owned());
        let page: Value = response.json().await.unwrap();
        let names: Vec<String> = page
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["name"].as_str().unwrap().to_owned())
            .collect();
        pages.push(names);
        let Some(link) = link else { break };
        let (target, rel) = link.split_once("; ").unwrap();
        assert_eq!(rel, r#"rel="next""#);
        path = target.trim_matches(|c| c == '<' || c == '>').to_owned();
        assert!(pages.len() < 5, "pages never end: {pages:?}");
    }
    assert_eq!(pages, [vec!["a", "b"], vec!["c", "d"], vec!["e"]]);
    // The default page holds them all; a page may start after a name never registered.
    assert_eq!(app.get("/streams").await.body.as_array().unwrap().len(), 5);
    let rest = app.get("/streams?after=bb").await.body;
    assert_eq!(rest[0]["name"], "c");
    assert_eq!(rest.as_array().unwrap().len(), 3);
    assert_problem(&app.get("/streams?limit=0").await, 400, "limit");
    assert_problem(&app.get("/streams?limit=1001").await, 400, "limit");
    // Any text marks a place in the order, a valid name or not.
    assert_eq!(app.get("/streams?after=c%20d").await.body[0]["name"], "d");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_maps_and_names_are_rejected() {
    let app = spawn_app().await;
    assert_problem(
        &put(&app, "bad name", json!({"shard_count": 2})).await,
        400,
        "stream name",
    );
    assert_problem(
        &put(&app, "s", json!({})).await,
        422,
        "exactly one of `Shards`",
    );
    assert_problem(
        &put(&app, "s", json!({"shard_count": 2, "Shards": []})).await,
        422,
        "exactly one",
    );
    assert_problem(
        &put(&app, "s", json!({"shard_count": 0})).await,
        422,
        "shard count",
    );
    let gap = json!({"Shards": [
        {"ShardId": "shardId-000000000000", "HashKeyRange": {"StartingHashKey": "0", "EndingHashKey": "99"}, "SequenceNumberRange": {"StartingSequenceNumber": "1"}},
        {"ShardId": "shardId-000000000001", "HashKeyRange": {"StartingHashKey": "200", "EndingHashKey": u128::MAX.to_string()}, "SequenceNumberRange": {"StartingSequenceNumber": "1"}},
    ]});
    assert_problem(
        &put(&app, "s", gap).await,
        422,
        "gap: no open shard covers [100, 199]",
    );
    assert_problem(
        &put(&app, "s", json!({"Shards": "nope"})).await,
        422,
        "Shards",
    );
    assert_problem(
        &app.get("/shard-of?hash_key=1&shards=2&stream=s").await,
        400,
        "exactly one of `shards`",
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_primary_stream_keeps_any_shard_count_even() {
    let app = spawn_app().await;
    put(&app, "three", json!({"shard_count": 3, "primary": true})).await;
    for i in 0..10u64 {
        app.allocate(&format!("acct-{i}")).await;
        let d = app.get("/distribution?stream=three").await.body;
        let total = i + 1;
        assert!(
            d["skew"]["max"].as_u64().unwrap() <= total.div_ceil(3),
            "after {total}: {}",
            d["shards"]
        );
    }
    assert_eq!(
        counts(&app.get("/distribution?stream=three").await.body["shards"]),
        [4, 3, 3]
    );
    // Without it the plain walk is back: 2^127 and 2^126 fall in shards 1 and 0.
    assert_eq!(app.delete("/streams/three").await.status, 204);
    let app = app.restart().await;
    assert_eq!(app.get("/keys/acct-0").await.status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changing_a_map_shows_its_effect_and_the_plan_to_fix_it() {
    let app = spawn_app().await;
    put(&app, "s", json!({"shard_count": 2, "primary": true})).await;
    for i in 0..6 {
        app.allocate(&format!("a{i}")).await;
    }
    // Re-register as 3 shards: the keys stay, the balance on the new map may not.
    let change = put(&app, "s", json!({"shard_count": 3})).await;
    assert_eq!(change.status, 200);
    assert_eq!(
        change.body["stream"]["primary"], true,
        "a PUT without `primary` keeps the role"
    );
    assert_eq!(counts(&change.body["before"]).iter().sum::<u64>(), 6);
    let after = counts(&change.body["after"]);
    let plan = &change.body["rebalance"];
    let moves = plan["moves"].as_array().unwrap().len() as u64;
    assert_eq!(
        moves,
        after.iter().map(|c| c.saturating_sub(2)).sum::<u64>(),
        "exactly the excess over 2"
    );
    let applied = app
        .post(
            "/rebalance",
            Some(json!({"plan_id": plan["plan_id"], "switch_after_s": 0})),
        )
        .await;
    assert_eq!(applied.status, 200, "{}", applied.body);
    assert_eq!(
        app.get("/distribution?stream=s").await.body["skew"]["max"],
        2
    );
    // A plan computed on the old map goes stale when the map changes.
    let stale = app.get("/rebalance/preview?stream=s").await.body["plan_id"].clone();
    put(&app, "s", json!({"shard_count": 4})).await;
    assert_problem(
        &app.post("/rebalance", Some(json!({"plan_id": stale})))
            .await,
        409,
        "preview again",
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_survive_a_restart() {
    let app = spawn_app().await;
    put(&app, "keep", json!({"shard_count": 5, "primary": true})).await;
    let app = app.restart().await;
    let stream = app.get("/streams/keep").await.body;
    assert_eq!(
        (stream["shard_count"].as_u64(), stream["primary"].as_bool()),
        (Some(5), Some(true))
    );
    for i in 0..5 {
        app.allocate(&format!("k{i}")).await;
    }
    assert_eq!(
        counts(&app.get("/distribution?stream=keep").await.body["shards"]),
        [1, 1, 1, 1, 1]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn split_plans_answer_calls_and_commands() {
    let app = spawn_app().await;
    put(&app, "s", json!({"shard_count": 1})).await;
    for i in 0..8 {
        app.allocate(&format!("a{i}")).await;
    }
    let plan = app.get("/streams/s/split-plan?target=4").await;
    assert_eq!(plan.status, 200, "{}", plan.body);
    assert_eq!(counts(&plan.body["shards"]), [2, 2, 2, 2]);
    assert_eq!(plan.body["spread"], 0);
    let ops = plan.body["operations"].as_array().unwrap();
    assert_eq!(ops.len(), 3);
    assert_eq!(ops[0]["action"], "split");
    assert_eq!(ops[0]["shard_to_split"], "shardId-000000000000");
    assert_eq!(
        ops[0]["resulting_shards"],
        json!(["shardId-000000000001", "shardId-000000000002"])
    );
    let commands = plan.body["commands"].as_array().unwrap();
    assert!(commands[0].as_str().unwrap().starts_with("aws kinesis split-shard --stream-name=s --shard-to-split=shardId-000000000000 --new-starting-hash-key="));
    assert_eq!(
        commands[1],
        "aws kinesis wait stream-exists --stream-name=s"
    );
    assert_eq!(
        plan.body["uniform_scaling"]["shards"]
            .as_array()
            .unwrap()
            .len(),
        4
    );
    assert_problem(
        &app.get("/streams/s/split-plan?target=0").await,
        400,
        "shard count",
    );
    assert_problem(
        &app.get("/streams/nope/split-plan?target=2").await,
        404,
        "nope",
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn split_plans_that_splitshard_cannot_make_answer_422() {
    let app = spawn_app_with(|c| c.keyspace_bits = 4).await;
    put(&app, "s", json!({"shard_count": 1})).await;
    for i in 0..16 {
        app.allocate(&format!("a{i}")).await;
    }
    // Every key is held: the cut between keys 0 and 1 would leave a one-key shard.
    assert_problem(
        &app.get("/streams/s/split-plan?target=16").await,
        422,
        "too close to its edge for SplitShard",
    );
}
