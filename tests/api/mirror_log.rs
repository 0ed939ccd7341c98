//! The Rust mirror and the log it follows: another log on its server's address makes it take
//! a new snapshot (and that snapshot's `max_age_s`), a sync counts from when its request was
//! sent, a snapshot that never comes ends `start`, and each allocation carries an
//! `Idempotency-Key` of its own. Servers that misbehave on purpose are played by a few
//! routes here.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::{get, post};
use keyspread_client::{Error, Mirror, Options};

use crate::helpers::spawn_app_with;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mirror_takes_a_new_snapshot_when_its_address_serves_another_log() {
    let mut first = spawn_app_with(|c| {
        c.lookup_cache_control = axum::http::HeaderValue::from_static("max-age=3");
    })
    .await;
    first.allocate("one").await;
    let mirror = Mirror::start(&first.url("")).await.expect("a mirror");
    assert_eq!(mirror.max_age(), Duration::from_secs(3));

    // Another database, filled elsewhere: its log runs past the mirror's position.
    let mut second = spawn_app_with(|c| {
        c.lookup_cache_control = axum::http::HeaderValue::from_static("max-age=30");
    })
    .await;
    for account in ["x", "y", "z"] {
        second.allocate(account).await;
    }
    first.stop().await;
    second.config.listen = first.addr;
    let second = second.restart().await;

    let started = Instant::now();
    loop {
        let x = mirror.keys("x").ok().flatten();
        if x.is_some() {
            assert_eq!(mirror.keys("one").unwrap(), None, "one is the old log's");
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(15),
            "the mirror never took the other log's table (event {}, {} snapshots)",
            mirror.event_id(),
            mirror.snapshots()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let want = second.get("/keys/x").await.body["hash_keys"].clone();
    assert_eq!(
        serde_json::json!(mirror.keys("x").unwrap().unwrap().to_vec()),
        want
    );
    assert_eq!(mirror.snapshots(), 2);
    assert_eq!(
        mirror.max_age(),
        Duration::from_secs(30),
        "the new snapshot's"
    );
}

/// The log a fake server names.
const LOG: &str = "00000000-0000-4000-8000-000000000001";

/// What the fake server saw: the `Idempotency-Key` of each allocation.
#[derive(Default)]
struct Seen {
    keys: Mutex<Vec<Option<String>>>,
}

/// A server with an empty table (`max_age_s` 3) whose answers to `GET /events` take
/// `delay` whatever `wait_s` says, and which refuses every allocation (409).
async fn fake(delay: Duration) -> (SocketAddr, Arc<Seen>) {
    let seen = Arc::new(Seen::default());
    let head = format!(r#"{{"event_id":1,"accounts":0,"max_age_s":3,"log_id":"{LOG}"}}"#);
    let page = format!(r#"{{"events":[],"next":1,"log_id":"{LOG}"}}"#);
    let recorder = seen.clone();
    let app = Router::new()
        .route("/snapshot", get(move || async move { format!("{head}\n") }))
        .route(
            "/events",
            get(move || async move {
                tokio::time::sleep(delay).await;
                ([("content-type", "application/json")], page)
            }),
        )
        .route(
            "/keys/{account}",
            post(move |headers: HeaderMap| async move {
                let key = headers.get("idempotency-key");
                let key = key.map(|v| v.to_str().unwrap().to_owned());
                recorder.keys.lock().unwrap().push(key);
                (StatusCode::CONFLICT, r#"{"detail":"refused here"}"#)
            }),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    (addr, seen)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mirror_counts_a_sync_from_when_its_request_was_sent() {
    // Each poll is answered 2.5 s after it was sent: the answer says nothing of the table
    // after the request left, so 3 s (max_age_s) after one is sent the table is stale
    // until the next answer comes, 2 s later.
    let (addr, _) = fake(Duration::from_millis(2500)).await;
    let mirror = Mirror::start(&format!("http://{addr}"))
        .await
        .expect("a mirror");
    let started = Instant::now();
    loop {
        if let Err(Error::Stale(lag)) = mirror.keys("a") {
            assert!(lag > Duration::from_secs(3), "{lag:?}");
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(8),
            "answered as fresh throughout; lag {:?}",
            mirror.lag()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mirror_gives_up_on_a_snapshot_that_never_comes() {
    // Takes connections and never answers.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let silent = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((conn, _)) = listener.accept().await {
            held.push(conn);
        }
    });
    let options = Options {
        timeout: Duration::from_secs(1),
        ..Options::default()
    };
    let started = Instant::now();
    let url = format!("http://{addr}");
    let start = Mirror::start_with(&url, options);
    match tokio::time::timeout(Duration::from_secs(10), start).await {
        Ok(Err(Error::Server { detail, .. })) => assert!(detail.contains("stalled"), "{detail}"),
        Ok(other) => panic!("{:?}", other.map(|m| m.len())),
        Err(_) => panic!("Mirror::start still waits after {:?}", started.elapsed()),
    }
    silent.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mirror_sends_a_fresh_idempotency_key_with_each_allocation() {
    let (addr, seen) = fake(Duration::ZERO).await;
    let mirror = Mirror::start(&format!("http://{addr}"))
        .await
        .expect("a mirror");
    for _ in 0..2 {
        let refused = mirror.allocate("acme").await;
        assert!(
            matches!(refused, Err(Error::Refused { status: 409, .. })),
            "{refused:?}"
        );
    }
    let keys = seen.keys.lock().unwrap().clone();
    assert_eq!(keys.len(), 2, "{keys:?}");
    for key in &keys {
        let key = key.as_deref().expect("an Idempotency-Key");
        assert!(uuid::Uuid::parse_str(key).is_ok(), "{key}");
    }
    assert_ne!(keys[0], keys[1], "one per allocation");
}
