//! Rebalance preview and apply.

use serde_json::{Value, json};

use crate::helpers::{TestApp, assert_problem, spawn_app};

/// Eight accounts over two shards, then the four on shard 1 released: 4 vs 0.
async fn lopsided() -> TestApp {
    let app = spawn_app().await;
    crate::staged::lopsided(&app).await;
    app
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn preview_changes_nothing_and_apply_moves_the_minimum() {
    let app = lopsided().await;
    let preview = app.get("/rebalance/preview?shards=2").await;
    assert_eq!(preview.status, 200);
    let plan = &preview.body;
    assert_eq!(
        (
            plan["before"]["max"].as_u64(),
            plan["before"]["min"].as_u64()
        ),
        (Some(4), Some(0))
    );
    assert_eq!(
        (plan["after"]["max"].as_u64(), plan["after"]["min"].as_u64()),
        (Some(2), Some(2))
    );
    assert_eq!(plan["cap"], 2);
    let moves = plan["moves"].as_array().unwrap().clone();
    assert_eq!(moves.len(), 2, "4 vs 0 needs exactly two moves");
    for m in &moves {
        assert_eq!(
            (m["from_shard"].as_u64(), m["to_shard"].as_u64()),
            (Some(0), Some(1))
        );
        // Preview changed nothing.
        let current = app
            .get(&format!("/keys/{}", m["account"].as_str().unwrap()))
            .await;
        assert_eq!(current.body["hash_key"], m["from"]);
    }
    // The same state previews the same plan.
    assert_eq!(
        app.get("/rebalance/preview?shards=2").await.body["plan_id"],
        plan["plan_id"]
    );

    let applied = app
        .post(
            "/rebalance",
            Some(json!({"plan_id": plan["plan_id"], "switch_after_s": 0})),
        )
        .await;
    assert_eq!(applied.status, 200, "{}", applied.body);
    let mut unstaged = applied.body["moves"].clone();
    for m in unstaged.as_array_mut().unwrap() {
        assert_eq!(m["switch_at"], applied.body["switch_at"], "{m}");
        m.as_object_mut().unwrap().remove("switch_at");
    }
    assert_eq!(unstaged, Value::Array(moves.clone()), "the moves previewed");
    for m in &moves {
        let account = m["account"].as_str().unwrap();
        assert_eq!(
            app.get(&format!("/keys/{account}")).await.body["hash_key"],
            m["to"]
        );
        let shard = app
            .get(&format!("/shard-of?account={account}&shards=2"))
            .await;
        assert_eq!(shard.body["shard_index"], 1);
    }
    let d = app.get("/distribution?shards=2").await;
    assert_eq!(d.body["skew"]["max"], 2);
    assert!(
        app.get("/rebalance/preview?shards=2").await.body["moves"]
            .as_array()
            .unwrap()
            .is_empty()
    );
    // A plan applies once.
    assert_problem(
        &app.post(
            "/rebalance",
            Some(json!({"plan_id": plan["plan_id"], "switch_after_s": 0})),
        )
        .await,
        409,
        "preview again",
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn any_change_since_the_preview_is_a_conflict() {
    let app = lopsided().await;
    let plan = app.get("/rebalance/preview?shards=2").await.body;
    app.allocate("newcomer").await;
    let stale = app
        .post(
            "/rebalance",
            Some(json!({"plan_id": plan["plan_id"], "switch_after_s": 0})),
        )
        .await;
    assert_problem(&stale, 409, "preview again");
    // Nothing moved.
    for m in plan["moves"].as_array().unwrap() {
        let current = app
            .get(&format!("/keys/{}", m["account"].as_str().unwrap()))
            .await;
        assert_eq!(current.body["hash_key"], m["from"]);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_plan_ids_and_maps_are_rejected() {
    let app = spawn_app().await;
    assert_problem(
        &app.post("/rebalance", Some(json!({"plan_id": "nonsense"})))
            .await,
        422,
        "not a plan id",
    );
    assert_problem(
        &app.post(
            "/rebalance",
            Some(json!({"plan_id": "0.0.0.0000000000000000"})),
        )
        .await,
        422,
        "not a plan id",
    );
    assert_problem(
        &app.post("/rebalance", Some(json!({}))).await,
        422,
        "plan_id",
    );
    assert_problem(
        &app.get("/rebalance/preview").await,
        400,
        "exactly one of `shards`",
    );
    assert_problem(
        &app.get("/rebalance/preview?shards=0").await,
        400,
        "shard count",
    );
    let empty = app.get("/rebalance/preview?shards=3").await;
    assert_eq!(
        (empty.status, empty.body["after"]["max_over_mean"].as_f64()),
        (200, Some(0.0))
    );
    let applied = app
        .post(
            "/rebalance",
            Some(json!({"plan_id": empty.body["plan_id"]})),
        )
        .await;
    assert_eq!(
        (
            applied.status,
            applied.body["moves"].as_array().map(Vec::len)
        ),
        (200, Some(0))
    );
}
