//! What lands in the database: the table, its key order, and the event log.

use crate::helpers::{spawn_app, spawn_app_with};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stored_key_order_is_numeric_order() {
    let app = spawn_app().await;
    let keys = [
        0u128,
        1,
        255,
        256,
        65_536,
        1 << 64,
        (1 << 127) - 1,
        1 << 127,
        u128::MAX - 1,
        u128::MAX,
    ];
    let mut db = app.db().await;
    // Insert out of order, as an import would.
    for (i, key) in keys.iter().rev().enumerate() {
        db.insert_assignment(&format!("imported-{i}"), *key).await;
    }
    assert_eq!(db.keys_in_stored_order().await, keys);
    // The server reads them back as the same numbers after a restart.
    drop(db);
    let app = app.restart().await;
    let max = app.get("/shard-of?account=imported-0&shards=2").await;
    assert_eq!(max.body["hash_key"], u128::MAX.to_string());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_change_is_logged() {
    let app = spawn_app_with(|c| c.keyspace_bits = 7).await;
    for account in ["a", "b", "c"] {
        app.allocate(account).await;
    }
    app.allocate("a").await; // idempotent: no event
    app.call(
        reqwest::Method::PATCH,
        "/keys/c",
        Some(serde_json::json!({"weight": 4})),
    )
    .await;
    app.delete("/keys/b").await;
    let mut db = app.db().await;
    let key = |k: u128| Some(k.to_be_bytes().to_vec());
    let event = |kind: &str, account: &str, before, after, weight| {
        (
            kind.to_owned(),
            Some(account.to_owned()),
            None,
            before,
            after,
            Some(weight),
            None,
        )
    };
    assert_eq!(
        db.events().await,
        [
            event("allocate", "a", None, key(64), 1),
            event("allocate", "b", None, key(32), 1),
            event("allocate", "c", None, key(96), 1),
            event("reweight", "c", key(96), key(96), 4),
            event("release", "b", key(32), None, 1),
        ]
    );
    assert_eq!(db.assignments().await.len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_changes_are_logged() {
    let app = spawn_app().await;
    let put = app
        .call(
            reqwest::Method::PUT,
            "/streams/s",
            Some(serde_json::json!({"shard_count": 2})),
        )
        .await;
    assert_eq!(put.status, 201);
    assert_eq!(app.delete("/streams/s").await.status, 204);
    let events = app.db().await.events().await;
    assert_eq!(events.len(), 2);
    assert_eq!(
        (
            events[0].0.as_str(),
            events[0].1.as_deref(),
            events[0].2.as_deref()
        ),
        ("stream_put", None, Some("s"))
    );
    assert!(
        events[0]
            .6
            .as_deref()
            .unwrap()
            .contains("shardId-000000000001")
    );
    assert_eq!(
        (events[1].0.as_str(), events[1].2.as_deref()),
        ("stream_delete", Some("s"))
    );
}
