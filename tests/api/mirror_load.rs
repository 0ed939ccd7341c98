//! The Rust mirror counts what it hands out: `record` answers `key_for`'s key and counts
//! the record, and the mirror reports to `POST /load/producers` on close and every
//! `report_interval`; a report the server does not take is sent again as it was, with what
//! was recorded since after it, while lookups go on. A server that plays refusals, and an
//! event kind newer than the mirror, is a few routes here.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::Query;
use axum::http::StatusCode;
use axum::routing::{get, post};
use keyspread_client::{Mirror, Options};
use serde_json::{Value, json};

use crate::load::{app, f, load, shard};

/// Options with reports every `interval` (only on close if zero) under `producer`.
fn reporting(interval: Duration, producer: &str) -> Options {
    Options {
        report_interval: interval,
        producer: Some(producer.into()),
        ..Options::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mirror_reports_what_it_recorded_when_it_closes() {
    let app = app(86_400).await;
    crate::fanout::primary_stream(&app, "s", 4).await;
    let (a, b) = (app.allocate("a").await, app.allocate("b").await);
    let mirror = Mirror::start_with(&app.url(""), reporting(Duration::ZERO, "p1"))
        .await
        .expect("a mirror");
    for i in 0..30 {
        let key = mirror.record("a", &format!("order-{i}"), 100).unwrap();
        assert_eq!(key, mirror.key_for("a", &format!("order-{i}")).unwrap());
        assert_eq!(key.as_deref(), Some(a.as_str()));
    }
    for _ in 0..10 {
        assert_eq!(mirror.record("b", "x", 50).unwrap(), Some(b.clone()));
    }
    // An account without keys: nothing to send, nothing counted.
    assert_eq!(mirror.record("nobody", "x", 1).unwrap(), None);
    let before = load(&app, "").await;
    assert!(
        (before["shards"].as_array().unwrap().iter()).all(|s| s["source"].is_null()),
        "nothing reported before close: {before}"
    );

    mirror.close().await;
    let page = load(&app, "").await;
    let shard_of = |key: &str| format!("shardId-{:012}", key.parse::<u128>().unwrap() >> 126);
    for key in [&a, &b] {
        let s = shard(&page, &shard_of(key));
        assert_eq!(s["source"], "producers", "{page}");
        assert!(f(&s["records_per_s"]) > 0.0, "{page}");
    }
    let accounts = page["accounts"].as_array().unwrap();
    let names: Vec<&str> = accounts
        .iter()
        .map(|x| x["account"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["a", "b"], "{page}");
    // One report, one window: rates stand as the counts do.
    let ratio = |field: &str| f(&accounts[0][field]) / f(&accounts[1][field]);
    assert!((ratio("records_per_s") - 3.0).abs() < 1e-9, "{page}");
    assert!((ratio("bytes_per_s") - 6.0).abs() < 1e-9, "{page}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mirror_reports_nothing_while_no_stream_is_primary() {
    let app = app(86_400).await;
    crate::load::put_stream(&app, "s", 4).await;
    app.allocate("a").await;
    let mirror = Mirror::start_with(&app.url(""), reporting(Duration::ZERO, "p1"))
        .await
        .expect("a mirror");
    assert!(mirror.record("a", "x", 100).unwrap().is_some());
    mirror.close().await;
    let page = load(&app, "").await;
    assert!(
        (page["shards"].as_array().unwrap().iter()).all(|s| s["source"].is_null()),
        "{page}"
    );
    let bad = Options {
        producer: Some("a b".into()),
        ..Options::default()
    };
    let refused = Mirror::start_with(&app.url(""), bad).await;
    assert!(
        matches!(&refused, Err(keyspread_client::Error::Server { detail, .. }) if detail.contains("producer id")),
        "{:?}",
        refused.err()
    );
}

/// What the fake server's `POST /load/producers` saw.
#[derive(Default)]
struct Reports {
    refusing: AtomicBool,
    /// `(seq, records)` of each report answered 200, and of each refused, in order.
    taken: Mutex<Vec<(u64, u64)>>,
    refused: Mutex<Vec<(u64, u64)>>,
}

impl Reports {
    fn taken_records(&self) -> u64 {
        self.taken.lock().unwrap().iter().map(|r| r.1).sum()
    }
}

/// A server whose table holds account `a` (key 1) on primary stream `s`, whose log holds
/// one event of a kind no mirror knows, and whose `POST /load/producers` answers 503 while
/// `refusing`.
async fn fake() -> (SocketAddr, Arc<Reports>) {
    const LOG: &str = "00000000-0000-4000-8000-000000000002";
    let reports = Arc::new(Reports::default());
    let head = format!(
        "{}\n{}\n",
        json!({"event_id": 1, "accounts": 1, "max_age_s": 60, "log_id": LOG, "stream": "s"}),
        json!({"account": "a", "hash_keys": ["1"]})
    );
    let events = move |Query(q): Query<Vec<(String, String)>>| async move {
        let after: i64 =
            (q.iter().find(|(k, _)| k == "after")).map_or(0, |(_, v)| v.parse().unwrap());
        let page = if after < 2 {
            json!({"events": [{"id": 2, "kind": "split_brain_repaired", "at": "2026-11-28T00:00:00Z",
                               "actor": "x", "account": "a", "key_after": "9"}],
                   "next": 2, "log_id": LOG})
        } else {
            tokio::time::sleep(Duration::from_millis(200)).await;
            json!({"events": [], "next": 2, "log_id": LOG})
        };
        axum::Json(page)
    };
    let seen = reports.clone();
    let report = move |axum::Json(body): axum::Json<Value>| async move {
        let records = (body["keys"].as_array().unwrap().iter())
            .map(|k| k["records"].as_u64().unwrap())
            .sum();
        let line = (body["seq"].as_u64().unwrap(), records);
        assert_eq!(
            (&body["stream"], &body["producer"]),
            (&json!("s"), &json!("p"))
        );
        if seen.refusing.load(Ordering::SeqCst) {
            seen.refused.lock().unwrap().push(line);
            (StatusCode::SERVICE_UNAVAILABLE, axum::Json(json!({})))
        } else {
            seen.taken.lock().unwrap().push(line);
            (StatusCode::OK, axum::Json(json!({"counted": true})))
        }
    };
    let app = Router::new()
        .route("/snapshot", get(move || async move { head }))
        .route("/events", get(events))
        .route("/load/producers", post(report));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    (addr, reports)
}

/// Waits up to 10 s for `check`.
async fn until(what: &str, check: impl Fn() -> bool) {
    let started = Instant::now();
    while !check() {
        assert!(started.elapsed() < Duration::from_secs(10), "never: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mirror_reports_periodically_and_sends_a_refused_report_again_while_lookups_go_on() {
    let (addr, reports) = fake().await;
    let options = reporting(Duration::from_millis(100), "p");
    let mirror = Mirror::start_with(&format!("http://{addr}"), options)
        .await
        .expect("a mirror");
    // An event of a kind it does not know is skipped: no new snapshot, no failure.
    until("the unknown event passed", || mirror.event_id() == 2).await;
    assert_eq!(mirror.snapshots(), 1);
    assert_eq!(mirror.keys("a").unwrap().unwrap().to_vec(), ["1"]);

    for _ in 0..5 {
        assert_eq!(mirror.record("a", "x", 10).unwrap().as_deref(), Some("1"));
    }
    until("reported without a close", || reports.taken_records() == 5).await;
    let before = reports.taken.lock().unwrap().len();

    // The server refuses: the report is kept and sent again; lookups and records go on.
    reports.refusing.store(true, Ordering::SeqCst);
    for _ in 0..7 {
        mirror.record("a", "x", 10).unwrap();
    }
    until("refused twice", || {
        reports.refused.lock().unwrap().len() >= 2
    })
    .await;
    for _ in 0..3 {
        assert_eq!(mirror.record("a", "x", 10).unwrap().as_deref(), Some("1"));
    }
    let refused = reports.refused.lock().unwrap().clone();
    assert!(
        refused.iter().all(|r| *r == refused[0]),
        "the same report again, as it was: {refused:?}"
    );
    // (A tick may have cut it before all 7 were recorded: the rest follow it.)
    assert!((1..=7).contains(&refused[0].1), "{refused:?}");

    // Back: that report, then what was recorded since, each counted once.
    reports.refusing.store(false, Ordering::SeqCst);
    until("all reported", || reports.taken_records() == 15).await;
    let taken = reports.taken.lock().unwrap().clone();
    assert_eq!(taken[before], refused[0], "{taken:?}");
    assert!(
        taken.windows(2).all(|w| w[0].0 < w[1].0),
        "numbered upwards: {taken:?}"
    );
    mirror.close().await;
    assert_eq!(reports.taken_records(), 15, "nothing left to report");
}
