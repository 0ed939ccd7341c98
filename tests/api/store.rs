//! What lands in the database: the table, its key order, and the event log.

use sqlx::{Connection, Row, SqliteConnection};

use crate::helpers::{TestApp, spawn_app, spawn_app_with};

async fn connect(app: &TestApp) -> SqliteConnection {
    SqliteConnection::connect(&format!(
        "sqlite://{}",
        app.dir().join("keyspread.db").display()
    ))
    .await
    .unwrap()
}

#[tokio::test]
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
    let mut db = connect(&app).await;
    // Insert out of order, as an import would.
    for (i, key) in keys.iter().rev().enumerate() {
        sqlx::query(
            "INSERT INTO assignments (account, hash_key, weight, created_at) VALUES ($1, $2, 1, 0)",
        )
        .bind(format!("imported-{i}"))
        .bind(key.to_be_bytes().as_slice())
        .execute(&mut db)
        .await
        .unwrap();
    }
    let ordered: Vec<u128> = sqlx::query("SELECT hash_key FROM assignments ORDER BY hash_key")
        .fetch_all(&mut db)
        .await
        .unwrap()
        .iter()
        .map(|r| u128::from_be_bytes(r.get::<Vec<u8>, _>(0).try_into().unwrap()))
        .collect();
    assert_eq!(ordered, keys);
    // The server reads them back as the same numbers after a restart.
    drop(db);
    let app = app.restart().await;
    let max = app.get("/shard-of?account=imported-0&shards=2").await;
    assert_eq!(max.body["hash_key"], u128::MAX.to_string());
}

/// kind, account, key before, key after, weight.
type EventRow = (String, String, Option<Vec<u8>>, Option<Vec<u8>>, i64);

#[tokio::test]
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
    let mut db = connect(&app).await;
    let events: Vec<EventRow> = sqlx::query_as(
        "SELECT kind, account, key_before, key_after, weight FROM events ORDER BY id",
    )
    .fetch_all(&mut db)
    .await
    .unwrap();
    let key = |k: u128| Some(k.to_be_bytes().to_vec());
    assert_eq!(
        events,
        [
            ("allocate".into(), "a".into(), None, key(64), 1),
            ("allocate".into(), "b".into(), None, key(32), 1),
            ("allocate".into(), "c".into(), None, key(96), 1),
            ("reweight".into(), "c".into(), key(96), key(96), 4),
            ("release".into(), "b".into(), key(32), None, 1),
        ]
    );
    let rows: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM assignments")
        .fetch_one(&mut db)
        .await
        .unwrap();
    assert_eq!(rows, 2);
}

#[tokio::test]
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
    let mut db = connect(&app).await;
    let events: Vec<(String, Option<String>, Option<String>, Option<String>)> =
        sqlx::query_as("SELECT kind, stream, account, detail FROM events ORDER BY id")
            .fetch_all(&mut db)
            .await
            .unwrap();
    assert_eq!(events.len(), 2);
    assert_eq!(
        (
            events[0].0.as_str(),
            events[0].1.as_deref(),
            events[0].2.as_deref()
        ),
        ("stream_put", Some("s"), None)
    );
    assert!(
        events[0]
            .3
            .as_deref()
            .unwrap()
            .contains("shardId-000000000001")
    );
    assert_eq!(
        (events[1].0.as_str(), events[1].1.as_deref()),
        ("stream_delete", Some("s"))
    );
}
