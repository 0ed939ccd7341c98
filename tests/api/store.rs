//! What lands in the database: the table, its key order, and the event log.

use std::time::Duration;

use sqlx::Connection;
use sqlx::postgres::{PgConnection, PgListener};

use crate::helpers::{backend, spawn_app, spawn_app_with};

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
    // The event names the map (its shard count); the streams table holds it.
    assert_eq!(events[0].6, None, "a map in the log");
    let feed = app.get("/events").await;
    assert_eq!(feed.body["events"][0]["shard_count"], 2);
    assert_eq!(
        (events[1].0.as_str(), events[1].2.as_deref()),
        ("stream_delete", Some("s"))
    );
}

/// On Postgres a transaction that logs events announces itself once, naming one of them,
/// however many statements logged: a group of releases (a statement per account) sends
/// one notice, not one per account.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_is_announced_once_naming_an_event_it_logged() {
    let app = spawn_app().await;
    let url = app.config.database_url.clone();
    if backend(&url) != "postgres" {
        return; // commits are announced on Postgres only
    }
    const ACCOUNTS: usize = 20;
    for n in 0..ACCOUNTS {
        app.allocate(&format!("gone-{n}")).await;
    }
    let mut listener = PgListener::connect(&url).await.unwrap();
    listener.listen(keyspread::store::CHANNEL).await.unwrap();
    // Releases queued behind another writer's lock commit together.
    let mut db = app.db().await;
    db.hold_write_lock().await;
    let mut tasks = tokio::task::JoinSet::new();
    for n in 0..ACCOUNTS {
        let (client, url) = (app.client.clone(), app.url(&format!("/keys/gone-{n}")));
        tasks.spawn(async move { client.delete(url).send().await.unwrap().status() });
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    db.release_write_lock().await;
    while let Some(status) = tasks.join_next().await {
        assert_eq!(status.unwrap(), 204);
    }
    let mut named = Vec::new();
    while let Ok(notice) = tokio::time::timeout(Duration::from_millis(500), listener.recv()).await {
        let payload = notice.unwrap().payload().to_owned();
        named.push(payload.parse::<i64>().expect("a notice names an event id"));
    }
    let mut conn = PgConnection::connect(&url).await.unwrap();
    let releases: Vec<i64> = sqlx::query_scalar("SELECT id FROM events WHERE kind = 'release'")
        .fetch_all(&mut conn)
        .await
        .unwrap();
    assert_eq!(releases.len(), ACCOUNTS);
    assert!(
        !named.is_empty() && named.len() < ACCOUNTS / 2,
        "{} notices for {ACCOUNTS} releases in groups",
        named.len()
    );
    assert!(
        named.iter().all(|id| releases.contains(id)),
        "notices {named:?} name events other than the releases {releases:?}"
    );
}
