//! Large shard maps: the open reads stay small however large the registered maps are.

use std::path::Path;

use reqwest::Method;
use serde_json::{Value, json};

use crate::helpers::{Answer, Db, TestApp, assert_problem, fresh_database, spawn_app_with};

/// The most open shards a stream may have: Kinesis' default per-stream limit.
const LARGEST: u64 = 10_000;

/// Bytes of an answer's JSON as the server sent it (compact, as serde_json writes it).
fn size(answer: &Answer) -> usize {
    answer.body.to_string().len()
}

async fn put(app: &TestApp, name: &str, body: Value) -> Answer {
    app.call(Method::PUT, &format!("/streams/{name}"), Some(body))
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_events_reference_the_map_instead_of_inlining_it() {
    let app = spawn_app_with(|_| {}).await;
    for name in ["big-0", "big-1", "big-2"] {
        let put = put(&app, name, json!({"shard_count": LARGEST})).await;
        assert_eq!(put.status, 201, "{}", put.body);
    }
    let feed = app.get("/events?limit=1000").await;
    assert_eq!(feed.status, 200);
    assert!(
        size(&feed) < 2048,
        "three stream events take {} bytes",
        size(&feed)
    );
    let events = feed.body["events"].as_array().unwrap();
    assert_eq!(events.len(), 3);
    for event in events {
        assert_eq!(event["kind"], "stream_put");
        assert_eq!(event["shard_count"], LARGEST, "{event}");
        assert!(event.get("detail").is_none(), "{event}");
        // The reference names the map `GET /streams/{name}` answers while it is current.
        let stream = app
            .get(&format!("/streams/{}", event["stream"].as_str().unwrap()))
            .await;
        assert_eq!(stream.body["version"], event["id"], "{event}");
        assert_eq!(
            stream.body["shards"].as_array().unwrap().len() as u64,
            LARGEST
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_stream_list_summarises_each_stream() {
    let app = spawn_app_with(|_| {}).await;
    let big = put(
        &app,
        "big",
        json!({"shard_count": LARGEST, "primary": true}),
    )
    .await;
    assert_eq!(big.status, 201, "{}", big.body);
    let uneven = json!({"Shards": [
        {"ShardId": "shardId-000000000001", "HashKeyRange": {"StartingHashKey": "0", "EndingHashKey": "99"}, "SequenceNumberRange": {"StartingSequenceNumber": "1"}},
        {"ShardId": "shardId-000000000002", "HashKeyRange": {"StartingHashKey": "100", "EndingHashKey": u128::MAX.to_string()}, "SequenceNumberRange": {"StartingSequenceNumber": "1"}},
    ]});
    assert_eq!(put(&app, "uneven", uneven).await.status, 201);

    let listed = app.get("/streams").await;
    assert_eq!(listed.status, 200);
    assert!(
        size(&listed) < 2048,
        "the list takes {} bytes",
        size(&listed)
    );
    let listed = listed.body.as_array().unwrap();
    let summary = |name: &str| listed.iter().find(|s| s["name"] == name).unwrap().clone();
    let (big, uneven) = (summary("big"), summary("uneven"));
    assert!(big.get("shards").is_none(), "{big}");
    assert_eq!(
        (&big["shard_count"], &big["kind"], &big["primary"]),
        (&json!(LARGEST), &json!("uniform"), &json!(true))
    );
    assert_eq!(
        (&uneven["shard_count"], &uneven["kind"], &uneven["primary"]),
        (&json!(2), &json!("explicit"), &json!(false))
    );
    assert_eq!(uneven["next_shard_number"], 3);
    // The whole map, with the same version, is one stream's own answer.
    let shown = app.get("/streams/big").await;
    assert_eq!(shown.body["version"], big["version"]);
    assert_eq!(shown.body["kind"], "uniform");
    assert!(size(&shown) < 16_000_000);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shard_counts_past_the_kinesis_default_are_refused() {
    let app = spawn_app_with(|_| {}).await;
    for count in [LARGEST + 1, 100_000] {
        assert_problem(
            &put(&app, "s", json!({"shard_count": count})).await,
            422,
            "shard count must be between 1 and 10000",
        );
    }
    assert_problem(
        &app.get(&format!("/shard-of?hash_key=1&shards={}", LARGEST + 1))
            .await,
        400,
        "shard count",
    );
    assert_eq!(
        put(&app, "s", json!({"shard_count": LARGEST})).await.status,
        201
    );
}

/// Applies the migrations before `first_new` (the file name's end) to the database at `url`,
/// as the release before that migration left it.
async fn migrate_as_release_before(url: &str, first_new: &str) {
    let backend = if url.starts_with("postgres") {
        "postgres"
    } else {
        "sqlite"
    };
    let older = tempfile::tempdir().unwrap();
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("migrations")
        .join(backend);
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|f| f.unwrap().path())
        .collect();
    files.sort();
    for path in files {
        let name = path.file_name().unwrap().to_str().unwrap().to_owned();
        if name.ends_with(first_new) {
            break;
        }
        std::fs::copy(&path, older.path().join(name)).unwrap();
    }
    let migrator = sqlx::migrate::Migrator::new(older.path()).await.unwrap();
    if backend == "postgres" {
        let pool = sqlx::PgPool::connect(url).await.unwrap();
        migrator.run(&pool).await.unwrap();
    } else {
        let options: sqlx::sqlite::SqliteConnectOptions = url.parse().unwrap();
        let pool = sqlx::SqlitePool::connect_with(options.create_if_missing(true))
            .await
            .unwrap();
        migrator.run(&pool).await.unwrap();
    }
}

/// A stream row and its `stream_put` event as releases before map references wrote them:
/// the whole map inlined in the event's `detail`.
async fn register_as_older_release(db: &mut Db, name: &str, shards: u64) {
    let map: Vec<Value> = (0..shards)
        .map(|i| {
            let step = u128::MAX / u128::from(shards);
            let end = if i + 1 == shards {
                u128::MAX
            } else {
                step * u128::from(i + 1) - 1
            };
            json!([
                format!("shardId-{i:012}"),
                (step * u128::from(i)).to_string(),
                end.to_string()
            ])
        })
        .collect();
    let map = Value::Array(map).to_string();
    db.execute(
        "INSERT INTO streams (name, shards, next_shard, is_primary, updated_at) VALUES ($1, $2, 3, FALSE, 0) \
         ON CONFLICT (name) DO UPDATE SET shards = excluded.shards",
        &[name, &map],
    )
    .await;
    db.execute(
        "INSERT INTO events (at, kind, stream, detail) VALUES (0, 'stream_put', $1, $2)",
        &[name, &map],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn maps_inlined_by_older_releases_are_served_as_references() {
    let dir = tempfile::tempdir().unwrap();
    let (url, _postgres) = fresh_database(dir.path()).await;
    migrate_as_release_before(&url, "_stream_map_references.sql").await;
    register_as_older_release(&mut Db::connect(&url).await, "old", 3).await;

    let app = spawn_app_with(|config| config.database_url = url.clone()).await;
    // A replica still running the older release registers a map after the upgrade.
    register_as_older_release(&mut app.db().await, "old", 4000).await;

    let feed = app.get("/events").await;
    assert!(size(&feed) < 2048, "{} bytes", size(&feed));
    let events = feed.body["events"].as_array().unwrap();
    let counts: Vec<&Value> = events.iter().map(|e| &e["shard_count"]).collect();
    assert_eq!(counts, [&json!(3), &json!(4000)], "{}", feed.body);
    assert!(events.iter().all(|e| e.get("detail").is_none()));
    let stored = app.db().await.events().await;
    assert!(
        stored.iter().all(|e| e.6.is_none()),
        "a map left in the log"
    );
    // The server reloads the table when the other replica's event arrives.
    let mut version = Value::Null;
    for _ in 0..100 {
        version = app.get("/streams/old").await.body["version"].clone();
        if version == events[1]["id"] {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert_eq!(version, events[1]["id"]);
}
