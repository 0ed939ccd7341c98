//! A bounded event log (`--event-retention`): compaction keeps the newest events, those a
//! pending staged move names, and a horizon below which `GET /events` answers 410; a
//! replica the compaction passed by reloads its table instead of skipping events.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use keyspread::config::EventRetention;

use crate::helpers::{TestApp, answer, assert_problem, backend, fresh_database, spawn_app_with};
use crate::process::{Rng, Server};
use crate::replicas::{Api, start_with};

/// A server keeping `keep` events whatever their age, compacting every second.
async fn keeping(keep: u64) -> TestApp {
    spawn_app_with(|c| {
        c.event_retention = EventRetention::Keep {
            max_age_ms: 0,
            keep,
        };
        c.event_compaction_interval_s = 1;
    })
    .await
}

/// Waits (up to 20 s) until the log holds no event at or below `through`, but those
/// `kept` names; answers the ids it holds.
async fn compacted_through(app: &TestApp, through: i64, kept: &[i64]) -> Vec<i64> {
    let mut db = app.db().await;
    let started = Instant::now();
    loop {
        let ids = db.event_ids().await;
        if ids.iter().all(|id| *id > through || kept.contains(id)) {
            return ids;
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "events at or below {through} still held after 20 s: {} of them",
            ids.iter().filter(|id| **id <= through).count()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The newest event id, as `GET /events` pages from `after` reach it.
async fn head(app: &TestApp, mut after: i64) -> i64 {
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_small_retention_keeps_the_newest_events_and_answers_410_below_its_horizon() {
    let app = keeping(100).await;
    for i in 0..250 {
        app.allocate(&format!("acct-{i}")).await;
    }
    for i in 0..250 {
        assert_eq!(app.delete(&format!("/keys/acct-{i}")).await.status, 204);
    }
    let newest = app.db().await.last_event_id().await;
    assert!(newest >= 500, "500 changes logged {newest} events");
    let ids = compacted_through(&app, newest - 100, &[]).await;
    println!("{} events held after 500 changes", ids.len());
    assert_eq!(ids.len(), 100, "the newest 100 stay: {ids:?}");
    assert_eq!(ids[0], newest - 99);
    let horizon = newest - 100;

    for after in [0, horizon - 1] {
        let gone = app.get(&format!("/events?after={after}")).await;
        assert_problem(&gone, 410, "GET /snapshot");
        assert_eq!(gone.body["type"], "urn:keyspread:problem:compacted");
        assert_eq!(gone.body["horizon"], horizon, "{}", gone.body);
        // The long-poll form answers the same, at once.
        let polled = app.get(&format!("/events?after={after}&wait_s=30")).await;
        assert_problem(&polled, 410, "compacted");
        assert_eq!(polled.body["horizon"], horizon, "{}", polled.body);
    }
    // Which log the horizon is in: the 410 names it as pages do.
    let response = (app.client.get(app.url("/events?after=0")).send().await).unwrap();
    let named = response.headers().get("x-keyspread-log").cloned();
    let page = app.get(&format!("/events?after={horizon}")).await;
    assert_eq!(
        named.as_ref().map(|v| v.to_str().unwrap()),
        page.body["log_id"].as_str()
    );
    let kept = app
        .get(&format!("/events?after={horizon}&limit=1000"))
        .await;
    assert_eq!(kept.status, 200, "{}", kept.body);
    assert_eq!(kept.body["events"].as_array().unwrap().len(), 100);
    assert_eq!(kept.body["events"][0]["id"], horizon + 1);
    assert_eq!(kept.body["next"], newest);
    assert_eq!(head(&app, newest).await, newest);
    assert_eq!(
        app.metric("keyspread_event_horizon_id").await as i64,
        horizon
    );
    assert!(app.metric("keyspread_events_compacted_total").await >= 400.0);

    // A long-poll from the head still waits for the next change and gets it.
    let request = app
        .client
        .get(app.url(&format!("/events?after={newest}&wait_s=30")));
    let poll = tokio::spawn(async move { answer(request.send().await.unwrap()).await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    app.allocate("late").await;
    let got = poll.await.unwrap();
    assert_eq!(got.status, 200, "{}", got.body);
    assert_eq!(got.body["events"][0]["account"], "late", "{}", got.body);
}

/// Applies a rebalance over two uniform shards, its moves switching in `switch_after_s`.
async fn rebalance(app: &TestApp, switch_after_s: u64) -> Value {
    let preview = app.get("/rebalance/preview?shards=2").await;
    assert_eq!(preview.status, 200, "{}", preview.body);
    let body = json!({"plan_id": preview.body["plan_id"], "switch_after_s": switch_after_s});
    let applied = app.post("/rebalance", Some(body)).await;
    assert_eq!(applied.status, 200, "{}", applied.body);
    applied.body
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pending_staged_move_keeps_its_event_past_the_horizon_and_get_moves_lists_it() {
    let app = keeping(5).await;
    crate::staged::lopsided(&app).await;
    rebalance(&app, 120).await;
    let before = app.get("/moves").await.body;
    let moves: Vec<i64> = (before["items"].as_array().unwrap().iter())
        .map(|m| m["event_id"].as_i64().unwrap())
        .collect();
    assert_eq!(moves.len(), 2, "{before}");
    for i in 0..30 {
        app.allocate(&format!("later-{i}")).await;
    }
    let newest = app.db().await.last_event_id().await;
    let ids = compacted_through(&app, newest - 5, &moves).await;
    println!("held after compaction: {ids:?}");
    for id in &moves {
        assert!(
            ids.contains(id),
            "the move's event {id} was dropped: {ids:?}"
        );
    }
    assert_eq!(app.get("/moves").await.body, before);
    assert_eq!(app.get("/events?after=0").await.status, 410);

    // Start-up reads pending moves through their events too.
    let app = app.restart().await;
    assert_eq!(app.get("/moves").await.body, before);
    let moved = before["items"][0]["account"].as_str().unwrap();
    let looked = app.get(&format!("/keys/{moved}")).await;
    assert_eq!(looked.body["hash_key"], before["items"][0]["from"]);
    assert_eq!(
        looked.body["next"]["hash_keys"],
        json!([before["items"][0]["to"]]),
        "{}",
        looked.body
    );
}

/// Sends SIGCONT to a replica stopped with SIGSTOP when dropped.
struct Resume<'a>(&'a Server);

impl Drop for Resume<'_> {
    fn drop(&mut self) {
        self.0.signal("CONT");
    }
}

/// Each account's keys on replica `i`, or its status when it has none.
async fn keys_on(api: &Api, i: usize, accounts: &[String]) -> Vec<Value> {
    let mut keys = Vec::with_capacity(accounts.len());
    for account in accounts {
        let (status, body) = api.get(i, &format!("/keys/{account}")).await;
        keys.push(if status == 200 {
            body["hash_keys"].clone()
        } else {
            json!(status)
        });
    }
    keys
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_stopped_while_the_log_is_compacted_past_it_reloads_and_agrees() {
    let dir = tempfile::tempdir().unwrap();
    let (url, _postgres) = fresh_database(dir.path()).await;
    let env: &[(&str, &str)] = &[
        ("KEYSPREAD_EVENT_RETENTION", "0s,10"),
        ("KEYSPREAD_EVENT_COMPACTION_INTERVAL_S", "1"),
    ];
    let (servers, api) = start_with(&url, dir.path(), &[env, env]).await;
    let accounts: Vec<String> = (0..80).map(|i| format!("acct-{i}")).collect();
    for account in &accounts[..20] {
        let (status, body) = api
            .call(0, reqwest::Method::POST, &format!("/keys/{account}"), None)
            .await;
        assert_eq!(status, 201, "{body}");
    }
    let started = Instant::now();
    while keys_on(&api, 1, &accounts[..20]).await != keys_on(&api, 0, &accounts[..20]).await {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "replica 1 never caught up"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut db = crate::helpers::Db::connect(&url).await;
    let stopped_at = db.last_event_id().await;

    // Replica 1 stops; the other changes the table, and compacts what replica 1 missed.
    servers[1].signal("STOP");
    let resume = Resume(&servers[1]);
    for account in &accounts[20..] {
        let (status, body) = api
            .call(0, reqwest::Method::POST, &format!("/keys/{account}"), None)
            .await;
        assert_eq!(status, 201, "{body}");
    }
    for account in &accounts[..10] {
        let (status, _) = api
            .call(
                0,
                reqwest::Method::DELETE,
                &format!("/keys/{account}"),
                None,
            )
            .await;
        assert_eq!(status, 204);
    }
    let started = Instant::now();
    while db
        .event_ids()
        .await
        .first()
        .is_none_or(|&id| id <= stopped_at + 1)
    {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "no compaction in 20 s"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    drop(resume);

    let expected = keys_on(&api, 0, &accounts).await;
    assert_eq!(expected.iter().filter(|k| **k == json!(404)).count(), 10);
    let started = Instant::now();
    loop {
        let seen = keys_on(&api, 1, &accounts).await;
        if seen == expected {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "replica 1 ({}) disagrees after 10 s: {seen:?}\nreplica 0: {expected:?}",
            backend(&url)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        servers[1].log_text().contains("reloaded the whole table"),
        "{}",
        servers[1].log_text()
    );
    let (_, metrics) = api.get(1, "/metrics").await;
    let metrics = metrics.as_str().unwrap_or_default();
    assert!(
        metrics.contains("\nkeyspread_table_reloads_total 1\n"),
        "{metrics}"
    );
    let compacted = servers[0].log_text();
    assert!(
        compacted.contains("compacted the event log") && compacted.contains(" horizon="),
        "{compacted}"
    );
    // It follows the log on from there.
    let (status, _) = api
        .call(0, reqwest::Method::POST, "/keys/after-reload", None)
        .await;
    assert_eq!(status, 201);
    let started = Instant::now();
    while api.get(1, "/keys/after-reload").await.0 != 200 {
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "not followed after the reload"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_soak_of_allocations_and_releases_leaves_the_log_bounded() {
    const KEEP: u64 = 500;
    const SOAK: Duration = Duration::from_secs(20);
    let app = keeping(KEEP).await;
    let until = Instant::now() + SOAK;
    let mut clients = Vec::new();
    for seed in 0..8 {
        let client = app.client.clone();
        let base = app.url("/keys/");
        clients.push(tokio::spawn(async move {
            let mut rng = Rng::new(seed);
            let mut changes = 0u64;
            while Instant::now() < until {
                let account = format!("{base}soak-{}", rng.below(500));
                let request = if rng.below(2) == 0 {
                    client.post(&account)
                } else {
                    client.delete(&account)
                };
                let status = request.send().await.unwrap().status().as_u16();
                assert!(matches!(status, 200 | 201 | 204 | 404), "{status}");
                changes += u64::from(matches!(status, 201 | 204));
            }
            changes
        }));
    }
    let mut changes = 0;
    for client in clients {
        changes += client.await.unwrap();
    }
    let newest = app.db().await.last_event_id().await;
    let ids = compacted_through(&app, newest - KEEP as i64, &[]).await;
    println!(
        "soak on {}: {changes} changes in {SOAK:?}, {newest} events logged, {} held",
        backend(&app.config.database_url),
        ids.len()
    );
    assert!(changes > 2 * KEEP, "the soak changed too little: {changes}");
    assert_eq!(ids.len() as u64, KEEP);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_move_made_for_load_stays_through_the_controllers_cooldown() {
    let mut app = keeping(5).await;
    app.stop().await;
    // Logged while no server runs, so that the next one starts past them: a move the
    // controller made for load a moment ago, one made before the cooldown (600 s), and
    // changes after both.
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    let old = now - 700_000;
    let mut db = app.db().await;
    let moved = |at: i64| {
        format!(
            "INSERT INTO events (at, kind, account, idx, weight, reason, switch_at) \
             VALUES ({at}, 'move', 'hot-{at}', 0, 1, 'load', {at})"
        )
    };
    db.execute_script(&format!("{}; {}", moved(old), moved(now)))
        .await;
    let reweights: Vec<String> = (0..20)
        .map(|_| format!("({now}, 'reweight', 'busy', 0, 1)"))
        .collect();
    db.execute_script(&format!(
        "INSERT INTO events (at, kind, account, idx, weight) VALUES {}",
        reweights.join(", ")
    ))
    .await;
    let newest = db.last_event_id().await;
    let recent = newest - 20;
    let app = app.restart().await;
    let ids = compacted_through(&app, newest - 5, &[recent]).await;
    assert_eq!(
        ids.len(),
        6,
        "the newest five and the recent load move: {ids:?}"
    );
    assert!(
        ids.contains(&recent),
        "the load move within the cooldown went: {ids:?}"
    );
    assert!(
        !ids.contains(&(recent - 1)),
        "the one before the cooldown goes: {ids:?}"
    );
}
