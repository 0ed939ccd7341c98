//! Watched streams on kinesalite: `PUT /streams/{name}` with `{"watch": true}` lists the
//! stream from Kinesis, and every sync interval keyspread lists it again and registers
//! what changed outside it; throttling, a deleted stream and a stopped endpoint are told,
//! never fatal, and lookups never wait on Kinesis.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use keyspread::config::ServeConfig;
use reqwest::Method;
use serde_json::{Value, json};

use crate::helpers::{Answer, TestApp, assert_problem, fresh_database, spawn_app_with};
use crate::kinesalite::{Kinesalite, open_in_key_order};
use crate::python_client::tool;
use crate::replicas::{Api, start_with};

/// A server that watches streams at `endpoint`, listing them again every second.
async fn watching(endpoint: &str, adjust: impl FnOnce(&mut ServeConfig)) -> TestApp {
    let endpoint = endpoint.to_owned();
    spawn_app_with(|c| {
        c.kinesis_endpoint = Some(endpoint);
        c.kinesis_region = Some("us-east-1".into());
        c.stream_sync_interval_s = 1;
        adjust(c);
    })
    .await
}

async fn put(app: &TestApp, stream: &str, body: Value) -> Answer {
    app.call(Method::PUT, &format!("/streams/{stream}"), Some(body))
        .await
}

/// `GET /streams/{stream}` until `done` holds of it, for at most `limit`.
async fn until(
    app: &TestApp,
    stream: &str,
    limit: Duration,
    done: impl Fn(&Value) -> bool,
) -> Value {
    let started = Instant::now();
    loop {
        let got = app.get(&format!("/streams/{stream}")).await;
        assert_eq!(got.status, 200, "{}", got.body);
        if done(&got.body) {
            return got.body;
        }
        assert!(
            started.elapsed() < limit,
            "not within {limit:?}: {}",
            got.body
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The newest event of the log.
async fn last_event(app: &TestApp) -> Value {
    let page = app.get("/events?after=0&limit=1000").await;
    assert_eq!(page.status, 200, "{}", page.body);
    let events = page.body["events"].as_array().expect("events").clone();
    events.last().cloned().expect("an event")
}

/// Splits `shard` of `stream` in half with boto3, as an operator would outside keyspread.
async fn boto3_split(endpoint: &str, stream: &str, shard: &str, new_starting_hash_key: u128) {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let python = tool("KEYSPREAD_TEST_PYTHON", manifest.join(".venv/bin/python"));
    const SPLIT: &str = "import sys, boto3\n\
        endpoint, stream, shard, key = sys.argv[1:]\n\
        kinesis = boto3.client('kinesis', endpoint_url=endpoint, region_name='us-east-1',\n\
            aws_access_key_id='x', aws_secret_access_key='x')\n\
        kinesis.split_shard(StreamName=stream, ShardToSplit=shard, NewStartingHashKey=key)\n";
    let run = tokio::process::Command::new(python)
        .args(["-c", SPLIT, endpoint, stream, shard])
        .arg(new_starting_hash_key.to_string())
        .kill_on_drop(true)
        .output()
        .await
        .expect("run boto3");
    assert!(
        run.status.success(),
        "boto3 split_shard: {}",
        String::from_utf8_lossy(&run.stderr)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watched_stream_follows_a_split_made_outside_within_one_interval() {
    let kinesalite = Kinesalite::start().await;
    kinesalite.api.create_stream("orders", 2).await;
    let app = watching(kinesalite.api.endpoint(), |_| {}).await;

    let put = put(&app, "orders", json!({"watch": true, "primary": true})).await;
    assert_eq!(put.status, 201, "{}", put.body);
    let stream = &put.body["stream"];
    assert_eq!(stream["watch"], true, "{stream}");
    assert_eq!(stream["primary"], true, "{stream}");
    assert_eq!(stream["shard_count"], 2, "{stream}");
    assert!(stream["synced_at"].is_string(), "{stream}");
    assert_eq!(stream["sync_error"], Value::Null, "{stream}");
    let event = last_event(&app).await;
    assert_eq!(
        (event["kind"].as_str(), event["actor"].as_str()),
        (Some("stream_put"), Some("kinesis")),
        "{event}"
    );

    let first = open_in_key_order(&kinesalite.api.list_shards("orders").await)[0].clone();
    let cut = first.start() + (first.end() - first.start()) / 2 + 1;
    boto3_split(kinesalite.api.endpoint(), "orders", &first.shard_id, cut).await;
    let split = Instant::now();
    let seen = until(&app, "orders", Duration::from_secs(10), |s| {
        s["shard_count"] == 3
    })
    .await;
    assert!(
        split.elapsed() < Duration::from_millis(2500),
        "the split is registered within one interval (1 s) and a listing: {:?}",
        split.elapsed()
    );
    assert_eq!(seen["next_shard_number"], 4, "{seen}");
    assert_eq!(seen["watch"], true, "{seen}");
    let starts: Vec<String> = (seen["shards"].as_array().unwrap().iter())
        .map(|s| s["starting_hash_key"].as_str().unwrap().to_owned())
        .collect();
    assert!(starts.contains(&cut.to_string()), "{seen}");
    let event = last_event(&app).await;
    assert_eq!(
        (event["kind"].as_str(), event["actor"].as_str()),
        (Some("stream_put"), Some("kinesis")),
        "{event}"
    );

    let metrics = app
        .client
        .get(app.url("/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let changes = metrics
        .lines()
        .find_map(|l| l.strip_prefix("keyspread_stream_sync_changes_total{stream=\"orders\"} "))
        .and_then(|n| n.parse::<u64>().ok());
    assert_eq!(changes, Some(1), "{metrics}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_map_put_onto_a_watched_stream_is_refused_until_watching_stops() {
    let kinesalite = Kinesalite::start().await;
    kinesalite.api.create_stream("orders", 2).await;
    let app = watching(kinesalite.api.endpoint(), |_| {}).await;
    assert_eq!(
        put(&app, "orders", json!({"watch": true})).await.status,
        201
    );

    let given = put(&app, "orders", json!({"shard_count": 4})).await;
    assert_problem(&given, 409, "watch");
    assert_eq!(given.body["type"], "urn:keyspread:problem:stream-watched");
    let both = put(&app, "orders", json!({"watch": true, "shard_count": 4})).await;
    assert_problem(&both, 422, "takes no map");
    let listed = kinesalite.api.list_shards_json("orders").await;
    let both = put(
        &app,
        "orders",
        json!({"watch": true, "Shards": listed["Shards"]}),
    )
    .await;
    assert_problem(&both, 422, "takes no map");

    let stopped = put(&app, "orders", json!({"watch": false})).await;
    assert_eq!(stopped.status, 200, "{}", stopped.body);
    assert_eq!(stopped.body["stream"]["watch"], false);
    assert_eq!(stopped.body["stream"]["shard_count"], 2, "the map stays");
    assert_eq!(last_event(&app).await["actor"], "loopback");

    // No longer watched: a split in Kinesis is not listed.
    let first = open_in_key_order(&kinesalite.api.list_shards("orders").await)[0].clone();
    let cut = first.start() + (first.end() - first.start()) / 2 + 1;
    kinesalite
        .api
        .split_shard("orders", &first.shard_id, &cut.to_string())
        .await;
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let kept = app.get("/streams/orders").await;
    assert_eq!(kept.body["shard_count"], 2, "{}", kept.body);

    let given = put(&app, "orders", json!({"shard_count": 4})).await;
    assert_eq!(given.status, 200, "{}", given.body);
    let unknown = put(&app, "nowhere", json!({"watch": false})).await;
    assert_problem(&unknown, 404, "nowhere");
}

/// `PUT /streams/{stream}/workers/{worker}`, asserting 200.
async fn heartbeat(app: &TestApp, stream: &str, worker: &str) -> Value {
    let path = format!("/streams/{stream}/workers/{worker}");
    let answer = app
        .call(Method::PUT, &path, Some(json!({"ttl_s": 60})))
        .await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    answer.body
}

/// The checkpoint a heartbeat's answer gives shard `id`.
fn checkpoint_of(beat: &Value, id: &str) -> Value {
    let leases = beat["leases"].as_array().expect("leases");
    let lease = leases.iter().find(|l| l["shard_id"] == id);
    lease.unwrap_or_else(|| panic!("no lease of {id}: {beat}"))["checkpoint"].clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_deleted_keeps_its_map_and_one_created_again_inherits_no_lease() {
    let kinesalite = Kinesalite::start().await;
    kinesalite.api.create_stream("orders", 2).await;
    let app = watching(kinesalite.api.endpoint(), |c| c.lease_join_batch_ms = 0).await;
    let put = put(&app, "orders", json!({"watch": true})).await;
    assert_eq!(put.status, 201, "{}", put.body);
    let synced_at = put.body["stream"]["synced_at"].clone();

    let shard = "shardId-000000000000";
    let beat = heartbeat(&app, "orders", "w1").await;
    let lease = (beat["leases"].as_array().unwrap().iter())
        .find(|l| l["shard_id"] == shard)
        .cloned()
        .unwrap_or_else(|| panic!("{beat}"));
    let seq = "49590338271490256608559692538361571095921575989136588802";
    let body = json!({"worker": "w1", "epoch": lease["epoch"], "sequence_number": seq});
    let path = format!("/streams/orders/leases/{shard}/checkpoint");
    let done = app.call(Method::PUT, &path, Some(body)).await;
    assert_eq!(done.status, 200, "{}", done.body);
    assert_eq!(
        checkpoint_of(&heartbeat(&app, "orders", "w1").await, shard),
        seq
    );

    // Listed every second: the last successful listing may be newer than the PUT's.
    let last = app.get("/streams/orders").await.body["synced_at"].clone();
    kinesalite.api.delete_stream("orders").await;
    let gone = until(&app, "orders", Duration::from_secs(10), |s| {
        s["sync_error"].is_string()
    })
    .await;
    let error = gone["sync_error"].as_str().unwrap();
    assert!(
        error.contains("ResourceNotFoundException") && error.contains("keeps its last map"),
        "{gone}"
    );
    assert_eq!(gone["shard_count"], 2, "{gone}");
    assert_eq!(gone["watch"], true, "{gone}");
    let at = |v: &Value| {
        let text = v.as_str().unwrap_or_else(|| panic!("a time: {v}"));
        time::OffsetDateTime::parse(text, &time::format_description::well_known::Rfc3339)
            .unwrap_or_else(|e| panic!("{text}: {e}"))
    };
    assert!(at(&synced_at) <= at(&last), "{synced_at} then {last}");
    assert!(
        at(&last) <= at(&gone["synced_at"]),
        "the last successful listing: {gone}"
    );
    // Failed listings leave it as it was.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let later = app.get("/streams/orders").await.body;
    assert_eq!(later["synced_at"], gone["synced_at"], "{later}");
    assert!(later["sync_error"].is_string(), "{later}");
    let summaries = app.get("/streams").await;
    assert_eq!(
        summaries.body[0]["sync_error"], gone["sync_error"],
        "{}",
        summaries.body
    );

    // kinesalite's creation times are in seconds: the stream created again is another one.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    kinesalite.api.create_stream("orders", 3).await;
    let again = until(&app, "orders", Duration::from_secs(10), |s| {
        s["shard_count"] == 3
    })
    .await;
    assert_eq!(again["sync_error"], Value::Null, "{again}");
    assert_ne!(again["synced_at"], synced_at, "{again}");
    let beat = heartbeat(&app, "orders", "w1").await;
    assert_eq!(
        checkpoint_of(&beat, shard),
        Value::Null,
        "the new stream's shard inherits no checkpoint of the old: {beat}"
    );
}

#[tokio::test]
async fn watching_without_a_region_says_which_is_missing() {
    if [
        "AWS_REGION",
        "AWS_DEFAULT_REGION",
        "AWS_PROFILE",
        "AWS_CONFIG_FILE",
    ]
    .iter()
    .any(|v| std::env::var_os(v).is_some())
    {
        crate::skip::skipped(
            "watch::watching_without_a_region_says_which_is_missing",
            "the environment names an AWS region or profile",
        );
        return;
    }
    let app = spawn_app_with(|_| {}).await;
    let refused = put(&app, "orders", json!({"watch": true})).await;
    assert_problem(&refused, 503, "AWS_REGION");
    assert_eq!(
        refused.body["type"],
        "urn:keyspread:problem:kinesis-not-configured"
    );
    assert_eq!(app.get("/streams/orders").await.status, 404);
}

/// What the proxy in front of kinesalite does with each call.
const PASS: u8 = 0;
const THROTTLE: u8 = 1;
const HANG: u8 = 2;

/// A small HTTP proxy in front of kinesalite that passes calls on, answers them
/// `LimitExceededException` (kinesalite never throttles), or holds them unanswered.
struct Proxy {
    endpoint: String,
    mode: Arc<AtomicU8>,
    /// Calls held unanswered right now.
    hanging: Arc<AtomicUsize>,
    _server: tokio::task::JoinHandle<()>,
}

#[derive(Clone)]
struct Upstream {
    client: reqwest::Client,
    endpoint: String,
    mode: Arc<AtomicU8>,
    hanging: Arc<AtomicUsize>,
}

impl Proxy {
    async fn start(kinesalite: &Kinesalite) -> Proxy {
        let (mode, hanging) = (Arc::new(AtomicU8::new(PASS)), Arc::new(AtomicUsize::new(0)));
        let upstream = Upstream {
            client: reqwest::Client::new(),
            endpoint: kinesalite.api.endpoint().to_owned(),
            mode: Arc::clone(&mode),
            hanging: Arc::clone(&hanging),
        };
        let app = axum::Router::new().fallback(relay).with_state(upstream);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let endpoint = format!("http://{}/", listener.local_addr().unwrap());
        let server = tokio::spawn(async move {
            axum::serve(listener, app).await.unwrap();
        });
        Proxy {
            endpoint,
            mode,
            hanging,
            _server: server,
        }
    }

    fn set(&self, mode: u8) {
        self.mode.store(mode, Ordering::SeqCst);
    }
}

async fn relay(
    State(up): State<Upstream>,
    headers: HeaderMap,
    body: Bytes,
) -> (StatusCode, HeaderMap, Bytes) {
    let mut answer = HeaderMap::new();
    answer.insert(
        "content-type",
        "application/x-amz-json-1.1".parse().unwrap(),
    );
    match up.mode.load(Ordering::SeqCst) {
        THROTTLE => {
            let body = json!({"__type": "LimitExceededException", "message": "Rate exceeded for stream orders under account 000000000000."});
            return (
                StatusCode::BAD_REQUEST,
                answer,
                Bytes::from(body.to_string()),
            );
        }
        HANG => {
            up.hanging.fetch_add(1, Ordering::SeqCst);
            // Longer than keyspread waits for an answer; bounded, so the proxy ends too.
            tokio::time::sleep(Duration::from_secs(30)).await;
            up.hanging.fetch_sub(1, Ordering::SeqCst);
            return (StatusCode::INTERNAL_SERVER_ERROR, answer, Bytes::new());
        }
        _ => {}
    }
    let mut request = up.client.post(&up.endpoint).body(body);
    for name in [
        "x-amz-target",
        "content-type",
        "x-amz-date",
        "authorization",
    ] {
        if let Some(value) = headers.get(name) {
            request = request.header(name, value.as_bytes());
        }
    }
    let response = request.send().await.expect("kinesalite answers");
    let status = StatusCode::from_u16(response.status().as_u16()).unwrap();
    (status, answer, response.bytes().await.unwrap())
}

/// `(sync_throttled, sync_claimed_at)` of `stream`, as the database holds them.
async fn backoff_of(app: &TestApp, stream: &str) -> (i64, i64) {
    let url = &app.config.database_url;
    let query = "SELECT sync_throttled, sync_claimed_at FROM streams WHERE name = $1";
    if url.starts_with("postgres") {
        let mut conn = <sqlx::PgConnection as sqlx::Connection>::connect(url)
            .await
            .unwrap();
        sqlx::query_as(query)
            .bind(stream)
            .fetch_one(&mut conn)
            .await
            .unwrap()
    } else {
        let mut conn = <sqlx::SqliteConnection as sqlx::Connection>::connect(url)
            .await
            .unwrap();
        sqlx::query_as(query)
            .bind(stream)
            .fetch_one(&mut conn)
            .await
            .unwrap()
    }
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn throttling_is_told_and_backs_off_longer_each_time() {
    let kinesalite = Kinesalite::start().await;
    kinesalite.api.create_stream("orders", 2).await;
    let proxy = Proxy::start(&kinesalite).await;
    let app = watching(&proxy.endpoint, |_| {}).await;
    assert_eq!(
        put(&app, "orders", json!({"watch": true})).await.status,
        201
    );

    proxy.set(THROTTLE);
    let refused = put(&app, "orders", json!({"watch": true})).await;
    assert_problem(&refused, 503, "throttling");
    let told = until(&app, "orders", Duration::from_secs(20), |s| {
        s["sync_error"].is_string()
    })
    .await;
    assert!(
        told["sync_error"]
            .as_str()
            .unwrap()
            .contains("LimitExceededException"),
        "{told}"
    );
    assert_eq!(told["shard_count"], 2, "{told}");

    // The second throttled listing in a row holds the next back by two intervals, past
    // the one interval an unthrottled claim waits.
    let started = Instant::now();
    let (throttled, claimed_at) = loop {
        let (throttled, claimed_at) = backoff_of(&app, "orders").await;
        if throttled >= 2 {
            break (throttled, claimed_at);
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "throttled {throttled} times"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(throttled, 2);
    let ahead = claimed_at - now_ms();
    assert!(ahead > 1500, "the next listing is held back {ahead} ms");

    proxy.set(PASS);
    let back = until(&app, "orders", Duration::from_secs(20), |s| {
        s["sync_error"].is_null()
    })
    .await;
    assert_eq!(back["shard_count"], 2, "{back}");
    assert_eq!(
        backoff_of(&app, "orders").await.0,
        0,
        "the back-off ends with a listing"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lookups_and_changes_answer_while_kinesis_hangs() {
    let kinesalite = Kinesalite::start().await;
    kinesalite.api.create_stream("orders", 2).await;
    let proxy = Proxy::start(&kinesalite).await;
    let app = watching(&proxy.endpoint, |_| {}).await;
    assert_eq!(
        put(&app, "orders", json!({"watch": true, "primary": true}))
            .await
            .status,
        201
    );
    app.allocate("acme").await;

    proxy.set(HANG);
    let started = Instant::now();
    while proxy.hanging.load(Ordering::SeqCst) == 0 {
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "no listing reached Kinesis"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for i in 0..10 {
        let asked = Instant::now();
        let lookup = app.get("/keys/acme").await;
        assert_eq!(lookup.status, 200, "{}", lookup.body);
        let new = app.allocate(&format!("new-{i}")).await;
        assert!(!new.is_empty());
        assert!(
            asked.elapsed() < Duration::from_secs(1),
            "a lookup and an allocation took {:?} while Kinesis hangs",
            asked.elapsed()
        );
        assert!(
            proxy.hanging.load(Ordering::SeqCst) > 0,
            "the listing still hangs"
        );
    }
    let told = until(&app, "orders", Duration::from_secs(20), |s| {
        s["sync_error"].is_string()
    })
    .await;
    assert!(
        told["sync_error"].as_str().unwrap().contains("unreachable"),
        "{told}"
    );
    assert_eq!(told["shard_count"], 2, "{told}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_primary_map_is_rebalanced_staged_with_auto_rebalance() {
    let kinesalite = Kinesalite::start().await;
    kinesalite.api.create_stream("orders", 2).await;
    let app = watching(kinesalite.api.endpoint(), |c| {
        c.controller.auto_rebalance = true;
        c.controller.switch_after_ms = Some(30_000);
    })
    .await;
    let put = put(&app, "orders", json!({"watch": true, "primary": true})).await;
    assert_eq!(put.status, 201, "{}", put.body);
    for i in 0..12 {
        app.allocate(&format!("acct-{i:02}")).await;
    }
    let before = app.get("/events?after=0&limit=1000").await.body["next"]
        .as_i64()
        .unwrap();

    let first = open_in_key_order(&kinesalite.api.list_shards("orders").await)[0].clone();
    let cut = first.start() + (first.end() - first.start()) / 2 + 1;
    kinesalite
        .api
        .split_shard("orders", &first.shard_id, &cut.to_string())
        .await;
    until(&app, "orders", Duration::from_secs(10), |s| {
        s["shard_count"] == 3
    })
    .await;

    let started = Instant::now();
    let moves = loop {
        let page = app.get(&format!("/events?after={before}&limit=1000")).await;
        let events = page.body["events"].as_array().unwrap().clone();
        let moves: Vec<Value> = events.into_iter().filter(|e| e["kind"] == "move").collect();
        if !moves.is_empty() {
            break moves;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "no move after the split"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    for m in &moves {
        assert_eq!(
            (m["actor"].as_str(), m["reason"].as_str()),
            (Some("kinesis"), Some("admin")),
            "{m}"
        );
        assert!(m["switch_at"].is_string(), "staged: {m}");
    }
    let account = moves[0]["account"].as_str().unwrap();
    let lookup = app.get(&format!("/keys/{account}")).await;
    assert!(
        lookup.body["next"]["switch_at"].is_string(),
        "{}",
        lookup.body
    );
}

/// `keyspread_stream_syncs_total` of `stream` summed over the replicas behind `api`.
async fn syncs(api: &Api, replicas: usize, stream: &str) -> u64 {
    let series = format!("keyspread_stream_syncs_total{{stream=\"{stream}\"}} ");
    let mut total = 0;
    for i in 0..replicas {
        let (status, text) = api.call(i, Method::GET, "/metrics", None).await;
        assert_eq!(status, 200);
        let text = text.as_str().unwrap_or_default().to_owned();
        total += (text.lines())
            .find_map(|l| l.strip_prefix(series.as_str())?.parse::<u64>().ok())
            .unwrap_or(0);
    }
    total
}

/// `GET /streams/{stream}` on replica `i` until `done` holds of it, for at most 20 s.
async fn until_on(api: &Api, i: usize, stream: &str, done: impl Fn(&Value) -> bool) -> Value {
    let started = Instant::now();
    loop {
        let (status, body) = api
            .call(i, Method::GET, &format!("/streams/{stream}"), None)
            .await;
        assert_eq!(status, 200, "{body}");
        if done(&body) {
            return body;
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "replica {i}: {body}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_take_turns_and_a_deleted_stream_and_a_stopped_endpoint_are_logged() {
    let kinesalite = Kinesalite::start().await;
    kinesalite.api.create_stream("orders", 2).await;
    let dir = tempfile::tempdir().unwrap();
    let (url, _postgres) = fresh_database(dir.path()).await;
    let env: &[(&str, &str)] = &[
        ("KEYSPREAD_KINESIS_ENDPOINT", kinesalite.api.endpoint()),
        ("KEYSPREAD_KINESIS_REGION", "us-east-1"),
        ("KEYSPREAD_STREAM_SYNC_INTERVAL_S", "1"),
        ("AWS_EC2_METADATA_DISABLED", "true"),
    ];
    let (mut servers, api) = start_with(&url, dir.path(), &[env, env]).await;
    let (status, body) = api
        .call(
            0,
            Method::PUT,
            "/streams/orders",
            Some(json!({"watch": true})),
        )
        .await;
    assert_eq!(status, 201, "{body}");
    let (status, body) = api.call(0, Method::POST, "/keys/acme", None).await;
    assert_eq!(status, 201, "{body}");

    // One listing per interval between them, not one per replica.
    let from = syncs(&api, 2, "orders").await;
    let window = Instant::now();
    tokio::time::sleep(Duration::from_secs(6)).await;
    let listed = syncs(&api, 2, "orders").await - from;
    let seconds = window.elapsed().as_secs_f64();
    assert!(
        (2.0..=seconds * 1.25 + 1.0).contains(&(listed as f64)),
        "{listed} listings in {seconds:.1} s by two replicas at a 1 s interval"
    );

    kinesalite.api.delete_stream("orders").await;
    for i in 0..2 {
        let gone = until_on(&api, i, "orders", |s| s["sync_error"].is_string()).await;
        assert!(
            gone["sync_error"]
                .as_str()
                .unwrap()
                .contains("ResourceNotFoundException"),
            "{gone}"
        );
        assert_eq!(gone["shard_count"], 2, "{gone}");
    }
    drop(kinesalite);
    for i in 0..2 {
        until_on(&api, i, "orders", |s| {
            s["sync_error"]
                .as_str()
                .is_some_and(|e| e.contains("unreachable"))
        })
        .await;
        let (status, body) = api.call(i, Method::GET, "/keys/acme", None).await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(api.call(i, Method::GET, "/readyz", None).await.0, 200);
    }
    let logs: String = servers.iter().map(|s| s.log_text()).collect();
    for kind in ["not_found", "unreachable"] {
        assert!(
            logs.lines()
                .any(|l| l.contains("cannot list a watched stream") && l.contains(kind)),
            "no {kind} line in the replicas' logs"
        );
    }
    for server in &mut servers {
        server.kill();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_shows_when_a_watched_stream_was_last_listed() {
    let kinesalite = Kinesalite::start().await;
    kinesalite.api.create_stream("orders", 2).await;
    let app = watching(kinesalite.api.endpoint(), |_| {}).await;
    assert_eq!(
        put(&app, "orders", json!({"watch": true})).await.status,
        201
    );

    let page = |app: &TestApp| {
        let url = app.url("/ui?stream=orders");
        let client = app.client.clone();
        async move { client.get(url).send().await.unwrap().text().await.unwrap() }
    };
    let synced_at = app.get("/streams/orders").await.body["synced_at"].clone();
    let html = page(&app).await;
    let note = html
        .split("<p id=\"sync\"")
        .nth(1)
        .unwrap_or_else(|| panic!("{html}"));
    let note = note.split("</p>").next().unwrap();
    assert!(
        note.contains(synced_at.as_str().unwrap()),
        "{note} / {synced_at}"
    );
    assert!(note.contains("Watched in Kinesis"), "{note}");

    kinesalite.api.delete_stream("orders").await;
    until(&app, "orders", Duration::from_secs(10), |s| {
        s["sync_error"].is_string()
    })
    .await;
    let html = page(&app).await;
    assert!(
        html.contains("the last listing failed (") && html.contains("ResourceNotFoundException"),
        "{html}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_kinesis_lacks_and_an_endpoint_that_is_down_are_answered() {
    let kinesalite = Kinesalite::start().await;
    let app = watching(kinesalite.api.endpoint(), |_| {}).await;
    let missing = put(&app, "nowhere", json!({"watch": true})).await;
    assert_problem(&missing, 422, "ResourceNotFoundException");
    assert_eq!(
        missing.body["type"],
        "urn:keyspread:problem:kinesis-stream-not-found"
    );

    // A port nothing listens on any more.
    let port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    };
    let app = watching(&format!("http://127.0.0.1:{port}"), |_| {}).await;
    let down = put(&app, "orders", json!({"watch": true})).await;
    assert_problem(&down, 502, "unreachable");
    assert_eq!(down.body["type"], "urn:keyspread:problem:kinesis-failed");
    assert_eq!(
        app.get("/streams/orders").await.status,
        404,
        "nothing registered"
    );
}
