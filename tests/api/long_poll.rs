//! `GET /events?wait_s=`: a long-poll of the log answers as soon as an event after `after`
//! exists (on a replica, once its follower applies it), empty once its wait passes, and at
//! once when the server drains; it may outlast the request timeout by its wait.

use std::time::{Duration, Instant};

use serde_json::Value;

use crate::helpers::{TestApp, answer, assert_problem, spawn_app_with};

/// The newest event id of `app`'s log.
async fn head(app: &TestApp) -> i64 {
    let mut after = 0;
    loop {
        let page = app.get(&format!("/events?after={after}&limit=1000")).await;
        assert_eq!(page.status, 200, "{}", page.body);
        let next = page.body["next"].as_i64().unwrap();
        if next == after {
            return after;
        }
        after = next;
    }
}

/// Starts `GET {url}/events?after=&wait_s=` on its own task: its answer and how long it took.
fn long_poll(
    client: &reqwest::Client,
    url: String,
) -> tokio::task::JoinHandle<(u16, Value, Duration)> {
    let request = client.get(url);
    tokio::spawn(async move {
        let started = Instant::now();
        let got = answer(request.send().await.expect("the long-poll is answered")).await;
        (got.status, got.body, started.elapsed())
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_poll_answers_when_an_event_commits_and_empty_when_its_wait_passes() {
    // Requests time out after a second; a long-poll may take its wait on top.
    let app = spawn_app_with(|c| c.request_timeout_secs = 1).await;
    let after = head(&app).await;

    let (status, body, took) = long_poll(
        &app.client,
        app.url(&format!("/events?after={after}&wait_s=2")),
    )
    .await
    .unwrap();
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["events"], Value::Array(vec![]), "{body}");
    assert_eq!(body["next"], after, "{body}");
    assert!(took >= Duration::from_secs(2), "answered after {took:?}");

    let poll = long_poll(
        &app.client,
        app.url(&format!("/events?after={after}&wait_s=30")),
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!poll.is_finished(), "it waits while nothing is logged");
    let allocated = app.post("/keys/acme", None).await;
    assert_eq!(allocated.status, 201, "{}", allocated.body);
    let committed = Instant::now();
    let (status, body, _) = poll.await.unwrap();
    let woke = committed.elapsed();
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["events"][0]["kind"], "allocate", "{body}");
    assert_eq!(body["events"][0]["account"], "acme", "{body}");
    assert_eq!(body["next"], body["events"][0]["id"], "{body}");
    // Woken by the commit, not by its wait (30 s).
    assert!(
        woke < Duration::from_secs(5),
        "answered {woke:?} after the commit"
    );

    // An event already there is answered at once, wait or not.
    let (status, body, took) = long_poll(
        &app.client,
        app.url(&format!("/events?after={after}&wait_s=30")),
    )
    .await
    .unwrap();
    assert_eq!(
        (status, body["events"][0]["account"].clone()),
        (200, "acme".into())
    );
    assert!(took < Duration::from_secs(5), "{took:?}");

    for bad in ["61", "-1", "x"] {
        let got = app
            .get(&format!("/events?after={after}&wait_s={bad}"))
            .await;
        assert_problem(&got, 400, "wait_s");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replicas_long_poll_wakes_when_its_follower_applies() {
    let app = spawn_app_with(|_| {}).await;
    let after = head(&app).await;
    // A replica on the same database, following the log.
    let replica = keyspread::AppState::open(&app.config).await.unwrap();
    let path = format!("/events?after={after}&wait_s=30");
    let poll = tokio::spawn(async move {
        let request = axum::http::Request::get(&path)
            .body(axum::body::Body::empty())
            .unwrap();
        let router = keyspread::app(replica);
        let answer = tower::ServiceExt::oneshot(router, request).await.unwrap();
        let status = answer.status().as_u16();
        let bytes = axum::body::to_bytes(answer.into_body(), 1 << 20)
            .await
            .unwrap();
        (status, serde_json::from_slice::<Value>(&bytes).unwrap())
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!poll.is_finished(), "it waits while nothing is logged");
    let allocated = app.post("/keys/acme", None).await;
    assert_eq!(allocated.status, 201, "{}", allocated.body);
    let committed = Instant::now();
    let (status, body) = poll.await.unwrap();
    let woke = committed.elapsed();
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["events"][0]["account"], "acme", "{body}");
    assert!(
        woke < Duration::from_secs(5),
        "answered {woke:?} after the commit"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stopping_the_server_ends_its_long_polls() {
    let mut app = spawn_app_with(|_| {}).await;
    let after = head(&app).await;
    let poll = long_poll(
        &app.client,
        app.url(&format!("/events?after={after}&wait_s=60")),
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    let stopping = Instant::now();
    app.stop().await;
    let stopped = stopping.elapsed();
    let (status, body, _) = poll.await.unwrap();
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["events"], Value::Array(vec![]), "{body}");
    assert!(
        stopped < Duration::from_secs(10),
        "the drain took {stopped:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_percent_encoded_wait_s_is_bounded_as_wait_s_is() {
    // Requests time out after a second; a long-poll may take its wait on top.
    let app = spawn_app_with(|c| c.request_timeout_secs = 1).await;
    let end = app.db().await.last_event_id().await;
    let started = Instant::now();
    let page = app.get(&format!("/events?after={end}&wait%5Fs=2")).await;
    assert_eq!(page.status, 200, "{}", page.body);
    assert_eq!(page.body["events"], Value::Array(vec![]), "{}", page.body);
    assert!(
        started.elapsed() >= Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    let refused = app.get(&format!("/events?after={end}&wait%5Fs=61")).await;
    assert_problem(&refused, 400, "wait_s");
}
