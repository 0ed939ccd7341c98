//! Every event records its actor: `loopback` without a token, `admin` with `--token` (and
//! never the token), `controller` for the closed loop, `import` for `keyspread import`,
//! `unrecorded` for events logged before actors were.

use std::time::Duration;

use reqwest::Method;
use serde_json::{Value, json};

use crate::helpers::{Answer, TestApp, answer, spawn_app, spawn_app_with};

const TOKEN: &str = "audit-token-0123456789abcdef";

/// Sends a request as a client holding `token`, if any.
async fn send(
    app: &TestApp,
    token: Option<&str>,
    method: Method,
    path: &str,
    body: Option<Value>,
) -> Answer {
    let mut request = app.client.request(method, app.url(path));
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    if let Some(body) = body {
        request = request.json(&body);
    }
    answer(request.send().await.expect("request sent")).await
}

/// Makes one change of every kind through the API, as a client holding `token`: allocate,
/// batch allocate, reweight, a fanout raised and a cap set, release, a stream put and
/// deleted, and a rebalance applied (its moves pending for an hour).
async fn every_change(app: &TestApp, token: Option<&str>) {
    let ok = |answer: Answer, what: &str| {
        assert!(
            (200..300).contains(&answer.status),
            "{what}: {} {}",
            answer.status,
            answer.body
        );
    };
    for i in 0..12 {
        let path = format!("/keys/acct-{i}");
        ok(
            send(app, token, Method::POST, &path, None).await,
            "allocate",
        );
    }
    let batch = json!({"accounts": [{"account": "b1"}, {"account": "b2", "fanout": 2}]});
    ok(
        send(app, token, Method::POST, "/keys/batch", Some(batch)).await,
        "batch",
    );
    let weight = json!({"weight": 5});
    ok(
        send(app, token, Method::PATCH, "/keys/b1", Some(weight)).await,
        "reweight",
    );
    let fanout = json!({"weight": 6, "fanout": 3, "max_fanout": 4});
    ok(
        send(app, token, Method::PATCH, "/keys/b2", Some(fanout)).await,
        "fanout",
    );
    // Every key left on shard 0 of 2: a rebalance has moves to make.
    for i in 0..12 {
        let on = app
            .get(&format!("/shard-of?account=acct-{i}&shards=2"))
            .await;
        if on.body["shard_index"] == 1 {
            let path = format!("/keys/acct-{i}");
            ok(
                send(app, token, Method::DELETE, &path, None).await,
                "release",
            );
        }
    }
    let stream = json!({"shard_count": 2});
    ok(
        send(app, token, Method::PUT, "/streams/s", Some(stream)).await,
        "stream put",
    );
    let plan = app.get("/rebalance/preview?shards=2").await.body;
    assert!(!plan["moves"].as_array().unwrap().is_empty(), "{plan}");
    let apply = json!({"plan_id": plan["plan_id"], "switch_after_s": 3600});
    ok(
        send(app, token, Method::POST, "/rebalance", Some(apply)).await,
        "apply",
    );
    ok(
        send(app, token, Method::DELETE, "/streams/s", None).await,
        "stream delete",
    );
}

/// Every event of the log, with the page's raw text.
async fn events(app: &TestApp) -> (Vec<Value>, String) {
    let text = (app.client.get(app.url("/events?limit=1000")).send().await)
        .unwrap()
        .text()
        .await
        .unwrap();
    let page: Value = serde_json::from_str(&text).unwrap();
    (page["events"].as_array().unwrap().clone(), text)
}

/// Asserts that every event is of `actor` and that every kind of change is among them.
fn all_by(events: &[Value], actor: &str) {
    for e in events {
        assert_eq!(e["actor"], actor, "{e}");
    }
    let kinds: std::collections::BTreeSet<&str> =
        events.iter().map(|e| e["kind"].as_str().unwrap()).collect();
    for kind in [
        "allocate",
        "release",
        "reweight",
        "move",
        "max_fanout",
        "stream_put",
        "stream_delete",
    ] {
        assert!(kinds.contains(kind), "no {kind} among {kinds:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_token_every_change_records_loopback() {
    let app = spawn_app().await;
    every_change(&app, None).await;
    let (events, _) = events(&app).await;
    all_by(&events, "loopback");
    let moves = app.get("/moves?limit=1000").await.body;
    let moves = moves["items"].as_array().unwrap();
    assert!(!moves.is_empty());
    for m in moves {
        assert_eq!(m["applied_by"], "loopback", "{m}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_token_every_change_records_admin_and_never_the_token() {
    let app = spawn_app_with(|c| c.token = Some(TOKEN.parse().unwrap())).await;
    every_change(&app, Some(TOKEN)).await;
    let (events, text) = events(&app).await;
    all_by(&events, "admin");
    assert!(!text.contains(TOKEN), "the token is in the log: {text}");
    let moves = (app.client.get(app.url("/moves?limit=1000")).send().await)
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(moves.contains("\"applied_by\":\"admin\""), "{moves}");
    assert!(!moves.contains(TOKEN), "the token is in the moves: {moves}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_controllers_moves_record_controller() {
    let app = crate::controller::controlled(|c| c.controller.max_moves_per_round = Some(2)).await;
    crate::controller::report(&app, [600, 100, 100, 100]).await;
    crate::controller::rounds(&app, 2).await;
    let (events, _) = events(&app).await;
    let by_load: Vec<&Value> = events.iter().filter(|e| e["reason"] == "load").collect();
    assert!(!by_load.is_empty(), "the controller moved keys");
    for e in &by_load {
        assert_eq!(e["actor"], "controller", "{e}");
    }
    // The test's own changes are the loopback client's.
    for e in events.iter().filter(|e| e["reason"] != "load") {
        assert_eq!(e["actor"], "loopback", "{e}");
    }
}

/// `keyspread import` of a CSV table and of a snapshot with a pending move.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn import_records_import() {
    let app = spawn_app().await;
    app.allocate("before").await;
    let csv = app.dir().join("table.csv");
    // A keyed row with a fanout of 2 gets its other key after the rest.
    std::fs::write(
        &csv,
        "account,weight,hash_key,fanout\nplain,1\nkeyed,2,77,2\n",
    )
    .unwrap();
    let ahead = crate::backup::from_now(3600);
    let half = 1u128 << 127;
    let snapshot = crate::backup::snapshot_file(
        app.dir(),
        &[crate::backup::line(
            "moving",
            1,
            &[half + 5],
            Some((&[half + 6], &ahead)),
        )],
    );
    for file in [&csv, &snapshot] {
        let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_keyspread"))
            .args(["import", file.to_str().unwrap()])
            .args(["--database-url", &app.config.database_url])
            .env_remove("DATABASE_URL")
            .output()
            .await
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    crate::import::caught_up(&app).await;
    let (events, _) = events(&app).await;
    let (before, imported): (Vec<&Value>, Vec<&Value>) =
        events.iter().partition(|e| e["account"] == "before");
    assert_eq!(before.len(), 1);
    assert_eq!(before[0]["actor"], "loopback");
    let kinds: std::collections::BTreeSet<&str> = (imported.iter())
        .map(|e| e["kind"].as_str().unwrap())
        .collect();
    // The keyed row's key 0 comes at its share of the weight, its second key after.
    let expected = ["allocate", "move"].into();
    assert_eq!(kinds, expected, "{imported:?}");
    for e in &imported {
        assert_eq!(e["actor"], "import", "{e}");
    }
    let moves = app.get("/moves").await.body;
    assert_eq!(moves["items"][0]["applied_by"], "import", "{moves}");
}

/// An event logged before actors were (here, as an older keyspread writes it: no actor
/// column) reads `unrecorded`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_from_before_actors_reads_unrecorded() {
    let app = spawn_app().await;
    app.db().await.log_allocation("older", 7).await;
    let started = std::time::Instant::now();
    while app.get("/keys/older").await.status != 200 {
        assert!(started.elapsed() < Duration::from_secs(5), "never followed");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (events, _) = events(&app).await;
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(events[0]["actor"], "unrecorded", "{}", events[0]);
}

/// A registered stream made primary by `--primary-stream` at start-up: the configuration's
/// change.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_primary_stream_named_at_start_up_records_config() {
    let mut app = spawn_app().await;
    let stream = json!({"shard_count": 2});
    let put = send(&app, None, Method::PUT, "/streams/s", Some(stream)).await;
    assert_eq!(put.status, 201, "{}", put.body);
    app.config.primary_stream = Some("s".into());
    let app = app.restart().await;
    let (events, _) = events(&app).await;
    let actors: Vec<(&str, &str)> = (events.iter())
        .map(|e| (e["kind"].as_str().unwrap(), e["actor"].as_str().unwrap()))
        .collect();
    assert_eq!(
        actors,
        [("stream_put", "loopback"), ("stream_put", "config")]
    );
}
