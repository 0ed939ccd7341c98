//! `/shard-of` and `/distribution`.

use crate::helpers::{assert_problem, spawn_app};

const HALF: &str = "170141183460469231731687303715884105728";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shard_of_a_hash_key() {
    let app = spawn_app().await;
    let top = app
        .get(&format!("/shard-of?hash_key={HALF}&shards=2"))
        .await;
    assert_eq!(top.status, 200);
    assert_eq!(top.body["shard_index"], 1);
    assert_eq!(top.body["shard_id"], "shardId-000000000001");
    assert_eq!(top.body["starting_hash_key"], HALF);
    assert_eq!(top.body["ending_hash_key"], u128::MAX.to_string());
    let below = app
        .get("/shard-of?hash_key=170141183460469231731687303715884105727&shards=2")
        .await;
    assert_eq!(
        (
            below.body["shard_index"].as_u64(),
            below.body["ending_hash_key"].as_str()
        ),
        (Some(0), Some("170141183460469231731687303715884105727"))
    );
    let last = app
        .get(&format!("/shard-of?hash_key={}&shards=10000", u128::MAX))
        .await;
    assert_eq!(last.body["shard_id"], "shardId-000000009999");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shard_of_a_partition_key_is_md5() {
    let app = spawn_app().await;
    let one = app.get("/shard-of?partition_key=1&shards=2").await;
    assert_eq!(one.status, 200);
    assert_eq!(
        one.body["hash_key"],
        "261578874264819908609102035485573088411"
    );
    assert_eq!(one.body["shard_index"], 1);
    // Partition keys are URL-decoded UTF-8.
    let spaced = app.get("/shard-of?partition_key=a%20b%26c&shards=1").await;
    assert_eq!(spaced.status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shard_of_an_account() {
    let app = spawn_app().await;
    let key = app.allocate("acme").await;
    let found = app.get("/shard-of?account=acme&shards=4").await;
    assert_eq!(
        (
            found.body["hash_key"].as_str(),
            found.body["shard_index"].as_u64()
        ),
        (Some(key.as_str()), Some(2))
    );
    assert_problem(
        &app.get("/shard-of?account=ghost&shards=4").await,
        404,
        "ghost",
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shard_of_rejects_bad_queries() {
    let app = spawn_app().await;
    for (query, needle) in [
        ("shards=2", "exactly one"),
        ("hash_key=1&partition_key=1&shards=2", "exactly one"),
        ("hash_key=1", "exactly one of `shards`"),
        ("hash_key=1&shards=0", "shard count"),
        ("hash_key=1&shards=10001", "shard count"),
        ("hash_key=1&shards=-3", "shards"),
        ("hash_key=-1&shards=2", "decimal"),
        ("hash_key=0x10&shards=2", "decimal"),
        (
            "hash_key=340282366920938463463374607431768211456&shards=2",
            "decimal",
        ),
    ] {
        assert_problem(&app.get(&format!("/shard-of?{query}")).await, 400, needle);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn distribution_beats_md5_for_the_seed_example() {
    let app = spawn_app().await;
    for i in 1..=14 {
        app.allocate(&i.to_string()).await;
    }
    let d = app.get("/distribution?shards=2").await;
    assert_eq!(d.status, 200);
    let shards = d.body["shards"].as_array().unwrap();
    let counts: Vec<_> = shards
        .iter()
        .map(|s| s["accounts"].as_u64().unwrap())
        .collect();
    let md5: Vec<_> = shards
        .iter()
        .map(|s| s["md5_accounts"].as_u64().unwrap())
        .collect();
    assert_eq!(counts, [7, 7]);
    assert_eq!(md5, [3, 11], "the seed's MD5 figure");
    assert_eq!(d.body["skew"]["max_over_mean"], 1.0);
    assert_eq!(
        (
            d.body["md5_skew"]["max"].as_u64(),
            d.body["md5_skew"]["min"].as_u64()
        ),
        (Some(11), Some(3))
    );
    assert_eq!(d.body["skew"]["accounts"], 14);
    assert_eq!(shards[1]["shard_id"], "shardId-000000000001");
    assert_eq!(shards[1]["starting_hash_key"], HALF);
    assert_problem(
        &app.get("/distribution").await,
        400,
        "exactly one of `shards`",
    );
}

/// Keys and weight over every shard of MD5's comparison.
async fn md5_totals(app: &crate::helpers::TestApp, shards: u32) -> (u64, u64) {
    let d = app.get(&format!("/distribution?shards={shards}")).await;
    assert_eq!(d.status, 200, "{}", d.body);
    let shards = d.body["shards"].as_array().unwrap().iter();
    shards.fold((0, 0), |(keys, weight), s| {
        let field = |f: &str| s[f].as_u64().unwrap();
        (keys + field("md5_accounts"), weight + field("md5_weight"))
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn md5_figures_follow_every_change_of_the_accounts() {
    use reqwest::Method;
    use serde_json::json;
    let app = spawn_app().await;
    for i in 0..10 {
        app.allocate(&format!("a{i}")).await;
    }
    assert_eq!(md5_totals(&app, 4).await, (10, 10));
    assert_eq!(md5_totals(&app, 4).await, (10, 10), "asked again");
    app.allocate("a10").await;
    assert_eq!(md5_totals(&app, 4).await, (11, 11), "after an allocation");
    let patch = |body| app.call(Method::PATCH, "/keys/a3", Some(body));
    assert_eq!(patch(json!({"weight": 5})).await.status, 200);
    assert_eq!(md5_totals(&app, 4).await, (11, 15), "after a new weight");
    assert_eq!(patch(json!({"fanout": 3})).await.status, 200);
    assert_eq!(md5_totals(&app, 4).await, (13, 15), "after a new fanout");
    assert_eq!(app.delete("/keys/a0").await.status, 204);
    assert_eq!(md5_totals(&app, 4).await, (12, 14), "after a release");
    assert_eq!(md5_totals(&app, 3).await, (12, 14), "on another map");
}
