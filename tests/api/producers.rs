//! Load from producers: `POST /load/producers` reports of what producers sent add up per
//! shard and account, a report numbered as one counted before counts once on any replica,
//! and a shard's figures come from its consumer's reports while they are current, else
//! from producers'.

use std::time::Duration;

use reqwest::Method;
use serde_json::{Value, json};

use crate::helpers::{Answer, TestApp, assert_problem, fresh_database};
use crate::load::{app, beat_ok, decay, entry, f, leases, load, put_listed, put_stream, shard};

/// A day: rates barely decay over a test, and a report is held for its window anyway. Its
/// rates are small (a report adds a share of about window / half-life): counts are large,
/// so that no account's rate is below the one at which it is forgotten.
const HALF_LIFE_S: u64 = 86_400;
const HL_MS: i64 = HALF_LIFE_S as i64 * 1000;

/// The share of a window's rate a first report adds (see `Rate::observe`).
fn share(window_ms: i64) -> f64 {
    1.0 - decay(window_ms, HL_MS)
}

/// Records (or bytes) a second a first report of `n` over `window_ms` smooths to.
fn rate(n: u64, window_ms: i64) -> f64 {
    n as f64 / (window_ms as f64 / 1000.0) * share(window_ms)
}

/// `got` is `want` but for the decay of a few seconds at [`HALF_LIFE_S`] (rates decay
/// from the newest report on).
fn near(got: f64, want: f64, what: &str) {
    assert!(
        (got - want).abs() <= 1e-4 * want.abs(),
        "{what}: got {got}, want {want}"
    );
}

/// Hash key `n` of shard `i` of a uniform map of 4 shards.
fn key_on(i: u128, n: u128) -> String {
    (i * (1u128 << 126) + n).to_string()
}

/// `{"account", "hash_key", "records", "bytes"}`.
fn key(account: &str, hash_key: &str, records: u64, bytes: u64) -> Value {
    json!({"account": account, "hash_key": hash_key, "records": records, "bytes": bytes})
}

fn body(stream: &str, producer: &str, seq: u64, window_ms: u64, keys: Value) -> Value {
    json!({"stream": stream, "producer": producer, "seq": seq, "window_ms": window_ms,
           "keys": keys})
}

async fn report(app: &TestApp, body: Value) -> Answer {
    app.post("/load/producers", Some(body)).await
}

/// A report on stream `s` that must be answered 200: whether it counted.
async fn counted(app: &TestApp, producer: &str, seq: u64, window_ms: u64, keys: Value) -> bool {
    let answer = report(app, body("s", producer, seq, window_ms, keys)).await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    answer.body["counted"]
        .as_bool()
        .unwrap_or_else(|| panic!("no counted: {}", answer.body))
}

/// `(shard_id, source)` of every shard of a `GET /load` page.
fn sources(page: &Value) -> Vec<(String, Value)> {
    (page["shards"].as_array().unwrap().iter())
        .map(|s| {
            (
                s["shard_id"].as_str().unwrap().to_owned(),
                s["source"].clone(),
            )
        })
        .collect()
}

/// The account of a `GET /load` page named `name`.
fn account<'a>(page: &'a Value, name: &str) -> &'a Value {
    (page["accounts"].as_array().unwrap().iter())
        .find(|a| a["account"] == name)
        .unwrap_or_else(|| panic!("no account {name} in {page}"))
}

/// Names of the accounts of a `GET /load` page, in its order.
fn names(page: &Value) -> Vec<&str> {
    (page["accounts"].as_array().unwrap().iter())
        .map(|a| a["account"].as_str().unwrap())
        .collect()
}

#[tokio::test]
async fn reports_of_two_producers_add_up_and_a_repeated_seq_counts_once() {
    let app = app(HALF_LIFE_S).await;
    put_stream(&app, "s", 4).await;
    let w = 10_000;
    // Producer 1: account a on shard 0, and on shard 1 under a second key; b on shard 1.
    let first = json!([
        key("a", &key_on(0, 7), 100_000, 1_000_000),
        key("a", &key_on(1, 7), 10_000, 100_000),
        key("b", &key_on(1, 9), 50_000, 500_000),
    ]);
    assert!(counted(&app, "p1", 1, w, first.clone()).await);
    // Producer 2: more of a on shard 0.
    assert!(
        counted(
            &app,
            "p2",
            1,
            w,
            json!([key("a", &key_on(0, 8), 300_000, 3_000_000)])
        )
        .await
    );
    // A retry of p1's report, and an older number of p1's: counted before, not again.
    assert!(!counted(&app, "p1", 1, w, first).await);
    assert!(
        !counted(
            &app,
            "p1",
            0,
            w,
            json!([key("a", &key_on(0, 7), 999_000, 9)])
        )
        .await
    );

    let page = load(&app, "").await;
    let want_sources = [
        ("shardId-000000000000", json!("producers")),
        ("shardId-000000000001", json!("producers")),
        ("shardId-000000000002", Value::Null),
        ("shardId-000000000003", Value::Null),
    ];
    let want_sources: Vec<(String, Value)> = (want_sources.into_iter())
        .map(|(id, s)| (id.to_owned(), s))
        .collect();
    assert_eq!(sources(&page), want_sources, "{page}");
    let s0 = shard(&page, "shardId-000000000000");
    near(
        f(&s0["records_per_s"]),
        rate(400_000, w as i64),
        "shard 0 records/s",
    );
    near(
        f(&s0["bytes_per_s"]),
        rate(4_000_000, w as i64),
        "shard 0 bytes/s",
    );
    let s1 = shard(&page, "shardId-000000000001");
    near(
        f(&s1["records_per_s"]),
        rate(60_000, w as i64),
        "shard 1 records/s",
    );
    assert_eq!(
        f(&shard(&page, "shardId-000000000002")["records_per_s"]),
        0.0
    );
    // An account's figures are its keys' on every shard, of every producer.
    assert_eq!(names(&page), ["a", "b"], "{page}");
    near(
        f(&account(&page, "a")["records_per_s"]),
        rate(410_000, w as i64),
        "a records/s",
    );
    near(
        f(&account(&page, "a")["bytes_per_s"]),
        rate(4_100_000, w as i64),
        "a bytes/s",
    );
    near(
        f(&account(&page, "b")["records_per_s"]),
        rate(50_000, w as i64),
        "b records/s",
    );
    // A higher number counts again.
    assert!(
        counted(
            &app,
            "p1",
            2,
            w,
            json!([key("b", &key_on(1, 9), 50_000, 500_000)])
        )
        .await
    );
    let page = load(&app, "").await;
    assert!(
        f(&account(&page, "b")["records_per_s"]) > 1.9 * rate(50_000, w as i64),
        "{page}"
    );
}

#[tokio::test]
async fn a_report_counted_on_one_replica_counts_once_on_another() {
    let dir = tempfile::tempdir().unwrap();
    let (url, _db) = fresh_database(dir.path()).await;
    let env: &[(&str, &str)] = &[("KEYSPREAD_LOAD_HALF_LIFE_S", "86400")];
    let (_servers, api) = crate::replicas::start_with(&url, dir.path(), &[env, env]).await;
    let (status, put) = api
        .call(
            0,
            Method::PUT,
            "/streams/s",
            Some(json!({"shard_count": 4})),
        )
        .await;
    assert_eq!(status, 201, "{put}");
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while api.get(1, "/streams/s").await.0 != 200 {
        assert!(
            std::time::Instant::now() < deadline,
            "replica 1 never saw the stream"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let sent = body(
        "s",
        "p",
        5,
        10_000,
        json!([key("a", &key_on(2, 1), 700, 70)]),
    );
    let post = |i: usize, body: Value| api.call(i, Method::POST, "/load/producers", Some(body));
    let (status, first) = post(0, sent.clone()).await;
    assert_eq!((status, &first), (200, &json!({"counted": true})));
    // Its retry lands on the other replica: counted before.
    let (status, again) = post(1, sent).await;
    assert_eq!((status, &again), (200, &json!({"counted": false})));
    for i in 0..2 {
        let (status, page) = api.get(i, "/load?stream=s").await;
        assert_eq!(status, 200, "{page}");
        near(
            f(&shard(&page, "shardId-000000000002")["records_per_s"]),
            rate(700, 10_000),
            &format!("shard 2 on replica {i}"),
        );
    }
}

#[tokio::test]
async fn invalid_reports_are_refused_naming_the_field_and_nothing_is_counted() {
    let app = app(HALF_LIFE_S).await;
    put_stream(&app, "s", 4).await;
    let good = || key("a", &key_on(0, 1), 1, 1);
    let many: Vec<Value> = (0..1001).map(|i| key("a", &key_on(0, i), 1, 1)).collect();
    let cases = [
        (body("s", "p", 1, 0, json!([good()])), "window_ms"),
        (body("s", "p", 1, 3_600_001, json!([good()])), "window_ms"),
        (body("s", "p", 1, 1000, json!(many)), "at most 1000 keys"),
        (body("s", "p q", 1, 1000, json!([good()])), "producer"),
        (body("s", "", 1, 1000, json!([good()])), "producer"),
        (body("s", "p", 1 << 63, 1000, json!([good()])), "seq"),
        (
            body("bad name", "p", 1, 1000, json!([good()])),
            "stream name",
        ),
        (
            body(
                "s",
                "p",
                1,
                1000,
                json!([good(), key("", &key_on(0, 2), 1, 1)]),
            ),
            "keys[1].account",
        ),
        (
            body("s", "p", 1, 1000, json!([key("a", "12x", 1, 1)])),
            "keys[0].hash_key",
        ),
        (
            body(
                "s",
                "p",
                1,
                1000,
                json!([key("a", "340282366920938463463374607431768211456", 1, 1)]),
            ),
            "keys[0].hash_key",
        ),
        (
            json!({"stream": "s", "producer": "p", "seq": -1, "window_ms": 1000, "keys": []}),
            "seq",
        ),
        (
            json!({"stream": "s", "producer": "p", "seq": 1, "window_ms": 1000,
                   "keys": [{"account": "a", "hash_key": "1", "records": 1.5, "bytes": 1}]}),
            "records",
        ),
        (
            json!({"stream": "s", "producer": "p", "seq": 1, "window_ms": 1000, "keys": [],
                   "epoch": 3}),
            "epoch",
        ),
        (
            json!({"stream": "s", "producer": "p", "window_ms": 1000, "keys": []}),
            "seq",
        ),
    ];
    for (sent, needle) in cases {
        let answer = report(&app, sent.clone()).await;
        assert_problem(&answer, 422, needle);
    }
    let unknown = report(&app, body("t", "p", 1, 1000, json!([good()]))).await;
    assert_problem(&unknown, 404, "\"t\"");
    let page = load(&app, "").await;
    assert!(
        sources(&page).iter().all(|(_, s)| s.is_null()),
        "nothing counted: {page}"
    );
    // No refused report took its number.
    assert!(counted(&app, "p", 1, 1000, json!([good()])).await);
}

/// DESIGN's precedence: a shard with current reports of its consumer takes theirs, a shard
/// with producers' only takes those; once its consumer's reports are two windows old, its
/// producers' take over.
#[tokio::test]
async fn a_shard_takes_its_consumers_figures_while_current_else_its_producers() {
    let app = app(HALF_LIFE_S).await;
    put_stream(&app, "s", 2).await;
    let (joined, _) = beat_ok(&app, "w1", json!([])).await;
    let held = leases(&joined);
    let (s0, s1) = (held[0].0.clone(), held[1].0.clone());
    assert_eq!(
        (s0.as_str(), s1.as_str()),
        ("shardId-000000000000", "shardId-000000000001")
    );
    let (w_producers, w_consumer) = (10_000, 1_000);
    let keys = json!([
        key("p0", &key_on(0, 1), 5_000_000, 5_000_000),
        key("p1", &key_on(2, 1), 3_000_000, 3_000_000),
    ]);
    assert!(counted(&app, "p", 1, w_producers, keys).await);
    let accounts = json!([{"account": "c0", "records": 100_000, "bytes": 100_000}]);
    let (beat, _) = beat_ok(
        &app,
        "w1",
        json!([entry(
            &s0, held[0].2, w_consumer, 100_000, 100_000, accounts
        )]),
    )
    .await;
    assert_eq!(beat["ignored_load"], json!([]), "{beat}");

    let page = load(&app, "").await;
    assert_eq!(
        sources(&page),
        vec![
            (s0.clone(), json!("consumers")),
            (s1.clone(), json!("producers"))
        ],
        "{page}"
    );
    near(
        f(&shard(&page, &s0)["records_per_s"]),
        rate(100_000, w_consumer as i64),
        "shard 0: the consumer's",
    );
    near(
        f(&shard(&page, &s1)["records_per_s"]),
        rate(3_000_000, w_producers as i64),
        "shard 1: the producers'",
    );
    // The accounts of each shard's source only.
    assert_eq!(names(&page), ["c0", "p1"], "{page}");

    // The consumer reports no more: two of its windows on, its producers' figures stand.
    tokio::time::sleep(Duration::from_millis(2 * w_consumer + 500)).await;
    let page = load(&app, "").await;
    assert_eq!(
        sources(&page),
        vec![(s0.clone(), json!("producers")), (s1, json!("producers"))],
        "{page}"
    );
    near(
        f(&shard(&page, &s0)["records_per_s"]),
        rate(5_000_000, w_producers as i64),
        "shard 0: the producers'",
    );
    assert_eq!(names(&page), ["p0", "p1"], "{page}");
}

#[tokio::test]
async fn producers_load_of_dropped_shards_and_deleted_streams_is_forgotten() {
    let app = app(HALF_LIFE_S).await;
    let (a, b, c) = ("shardId-a", "shardId-b", "shardId-c");
    put_listed(&app, &[a, b]).await;
    let both = json!([
        key("x", &key_on(0, 1), 10, 10),
        key("y", &key_on(3, 1), 10, 10)
    ]);
    assert!(counted(&app, "p", 1, 1000, both.clone()).await);
    let page = load(&app, "").await;
    assert_eq!(sources(&page)[0].1, "producers", "{page}");
    // A map without A and B: a report on C clears their rows.
    put_listed(&app, &[c]).await;
    assert!(counted(&app, "p", 2, 1000, json!([key("x", &key_on(0, 1), 10, 10)])).await);
    put_listed(&app, &[a, b]).await;
    let page = load(&app, "").await;
    assert!(sources(&page).iter().all(|(_, s)| s.is_null()), "{page}");
    assert_eq!(page["accounts"], json!([]), "{page}");
    // A deleted stream's load goes with it.
    assert!(counted(&app, "p", 3, 1000, both).await);
    let deleted = app.delete("/streams/s").await;
    assert_eq!(deleted.status, 204, "{}", deleted.body);
    put_listed(&app, &[a, b]).await;
    let page = load(&app, "").await;
    assert!(sources(&page).iter().all(|(_, s)| s.is_null()), "{page}");
    assert_eq!(page["accounts"], json!([]), "{page}");
}

/// The closed loop on a stream no consumer reports: the controller moves a hot account
/// off the busiest shard by what producers sent alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_controller_moves_a_hot_account_by_producers_reports_alone() {
    use crate::controller::{controlled, load_moves, rounds};
    let app = controlled(|c| c.controller.max_moves_per_round = Some(1)).await;
    let hot_key = app.allocate("hot").await;
    let hot_shard = hot_key.parse::<u128>().unwrap() >> 126;
    let listed = app.get("/keys?limit=1000").await;
    assert_eq!(listed.status, 200, "{}", listed.body);
    // An hour at 100 records a second a shard, 200 on the hot account's, spread over their
    // accounts, and 150 more of the hot account's: moving it is the best move.
    let hour_s = 3_600u64;
    let items = listed.body["items"].as_array().unwrap();
    let on = |shard: u128| {
        (items.iter())
            .filter(|a| a["account"] != "hot")
            .filter(move |a| {
                a["hash_key"].as_str().unwrap().parse::<u128>().unwrap() >> 126 == shard
            })
    };
    let mut keys = vec![key("hot", &hot_key, 150 * hour_s, 150 * hour_s)];
    for shard in 0..4 {
        let accounts: Vec<&Value> = on(shard).collect();
        let spread = if shard == hot_shard { 200 } else { 100 };
        let each = spread * hour_s / accounts.len() as u64;
        keys.extend(accounts.iter().map(|a| {
            key(
                a["account"].as_str().unwrap(),
                a["hash_key"].as_str().unwrap(),
                each,
                each,
            )
        }));
    }
    assert!(counted(&app, "producer-1", 1, hour_s * 1000, json!(keys)).await);
    let page = load(&app, "").await;
    assert!(
        sources(&page).iter().all(|(_, s)| s == "producers"),
        "no consumer reports: {page}"
    );
    let busiest = f(&shard(&page, &format!("shardId-{hot_shard:012}"))["utilisation"]);
    assert!(busiest > 0.34, "{page}");
    rounds(&app, 2).await;
    let moves = load_moves(&app).await;
    assert!(
        moves.iter().any(|(_, account)| account == "hot"),
        "the hot account moves by producers' reports: {moves:?}"
    );
}
