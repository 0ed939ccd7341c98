//! A replica follows the log to its end: what an event implies is read before the replica's
//! position passes it, so a read that fails is retried, never skipped.

use std::time::{Duration, Instant};

use reqwest::Method;
use serde_json::json;

use crate::helpers::{TestApp, spawn_app};

/// `keyspread_replica_lag_events` as `/metrics` reports it.
async fn lag(app: &TestApp) -> i64 {
    app.metric("keyspread_replica_lag_events").await as i64
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_map_that_failed_to_load_is_loaded_once_the_database_answers() {
    let app = spawn_app().await;
    let put = app
        .call(
            Method::PUT,
            "/streams/first",
            Some(json!({"shard_count": 4})),
        )
        .await;
    assert_eq!(put.status, 201, "{}", put.body);

    // Another writer registers a second stream (a copy of the first) and, in the same
    // commit, makes the streams table unreadable: this replica reads the event but cannot
    // load the map it implies.
    let mut db = app.db().await;
    db.hold_write_lock().await;
    db.execute_script(
        "INSERT INTO streams (name, shards, next_shard, is_primary, updated_at) \
         SELECT 'second', shards, next_shard, FALSE, updated_at FROM streams WHERE name = 'first'; \
         INSERT INTO events (at, kind, stream, shard_count) \
         SELECT at, kind, 'second', shard_count FROM events WHERE stream = 'first'; \
         ALTER TABLE streams RENAME TO streams_away",
    )
    .await;
    db.commit().await;
    tokio::time::sleep(4 * keyspread::registry::POLL).await;
    assert_eq!(app.get("/streams/second").await.status, 404);
    assert!(
        lag(&app).await > 0,
        "the replica reports itself caught up without the map"
    );

    // The fault passes: the replica loads the map on its next round.
    db.execute_script("ALTER TABLE streams_away RENAME TO streams")
        .await;
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        let seen = app.get("/streams/second").await;
        if seen.status == 200 {
            assert_eq!(seen.body["shard_count"], 4, "{}", seen.body);
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the replica never loaded the map: {} {}",
            seen.status,
            seen.body
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(lag(&app).await, 0);
}
