//! Rebalancing a busy system: applies that re-plan under the writer lock when their preview
//! went stale, bounded by the preview's move count.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde_json::json;

use crate::helpers::{TestApp, assert_problem, spawn_app};

/// Allocations and releases the churn aims at per second, over all its tasks.
const CHURN_PER_S: u64 = 1_500;
const CHURN_TASKS: u64 = 30;

/// Allocates `n` accounts, then releases those on shard 1 of 2: every key on shard 0.
async fn lopsided(app: &TestApp, n: usize) {
    for i in 0..n {
        app.allocate(&format!("acct-{i}")).await;
    }
    for i in 0..n {
        let on = app
            .get(&format!("/shard-of?account=acct-{i}&shards=2"))
            .await;
        if on.body["shard_index"] == 1 {
            assert_eq!(app.delete(&format!("/keys/acct-{i}")).await.status, 204);
        }
    }
}

/// Allocates and releases accounts at about [`CHURN_PER_S`] requests a second until `stop`,
/// counting the mutations answered 2xx in `done`.
fn churn(
    app: &TestApp,
    stop: Arc<AtomicBool>,
    done: Arc<AtomicU64>,
) -> Vec<tokio::task::JoinHandle<()>> {
    let period = Duration::from_micros(1_000_000 * CHURN_TASKS / CHURN_PER_S);
    (0..CHURN_TASKS)
        .map(|t| {
            let (client, base) = (app.client.clone(), app.url(""));
            let (stop, done) = (Arc::clone(&stop), Arc::clone(&done));
            tokio::spawn(async move {
                let mut tick = tokio::time::interval(period);
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    tick.tick().await;
                    let url = format!("{base}/keys/churn-{t}-{}", n / 2);
                    let sent = if n.is_multiple_of(2) {
                        client.post(url).send().await
                    } else {
                        client.delete(url).send().await
                    };
                    let status = sent.expect("churn request sent").status();
                    assert!(status.is_success(), "churn answered {status}");
                    done.fetch_add(1, Ordering::Relaxed);
                    n += 1;
                }
            })
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn applies_under_steady_writes_replan_and_succeed() {
    let app = spawn_app().await;
    lopsided(&app, 120).await;
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let tasks = churn(&app, Arc::clone(&stop), Arc::clone(&done));
    let started = Instant::now();
    let deadline = started + Duration::from_secs(60);

    let mut answers = Vec::new();
    for round in 0..10 {
        assert!(Instant::now() < deadline, "the applies took too long");
        let preview = app.get("/rebalance/preview?shards=2").await;
        assert_eq!(preview.status, 200, "{}", preview.body);
        // A write lands between the preview and its apply (besides the churn's): the
        // preview is stale.
        app.allocate(&format!("marker-{round}")).await;
        let applied = app
            .post(
                "/rebalance",
                Some(json!({
                    "plan_id": preview.body["plan_id"],
                    "switch_after_s": 0,
                    "replan": true,
                })),
            )
            .await;
        answers.push((preview.body, applied));
        // Spread the applies over a few seconds of churn.
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    stop.store(true, Ordering::Relaxed);
    let elapsed = started.elapsed().as_secs_f64();
    for task in tasks {
        task.await.expect("churn task");
    }
    let rate = done.load(Ordering::Relaxed) as f64 / elapsed;

    let statuses: Vec<u16> = answers.iter().map(|(_, a)| a.status).collect();
    eprintln!(
        "10 applies under {rate:.0} allocations+releases/s over {elapsed:.1} s: statuses {statuses:?}, moves {:?}",
        answers
            .iter()
            .map(|(_, a)| a.body["moves"].as_array().map_or(0, Vec::len))
            .collect::<Vec<_>>()
    );
    for (preview, applied) in &answers {
        assert_eq!(applied.status, 200, "{}", applied.body);
        assert_eq!(applied.body["replanned"], true, "{}", applied.body);
        let previewed = preview["moves"].as_array().unwrap().len();
        let moved = applied.body["moves"].as_array().unwrap().len();
        assert!(
            moved <= previewed,
            "{moved} moves applied, {previewed} previewed"
        );
    }
    let first = &answers[0].1.body;
    assert!(
        !first["moves"].as_array().unwrap().is_empty(),
        "the lopsided start needs moves: {first}"
    );
    assert_ne!(
        first["plan_id"], answers[0].0["plan_id"],
        "the plan applied is named anew"
    );
    // Every move applied switched at once: the shards are even but for the churn's keys.
    let d = app.get("/distribution?shards=2").await;
    assert!(
        d.body["skew"]["max"].as_u64().unwrap() <= 60 + CHURN_TASKS,
        "{}",
        d.body
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replanned_apply_moves_at_most_what_was_previewed() {
    let app = spawn_app().await;
    crate::staged::lopsided(&app).await;
    let preview = app.get("/rebalance/preview?shards=2").await.body;
    let previewed = preview["moves"].as_array().unwrap().len();
    assert_eq!(previewed, 2, "{preview}");
    // More keys on shard 0 since: a fresh plan needs more moves than the preview made.
    lopsided(&app, 40).await;
    let fresh = app.get("/rebalance/preview?shards=2").await.body;
    assert!(
        fresh["moves"].as_array().unwrap().len() > previewed,
        "{fresh}"
    );

    let body = json!({"plan_id": preview["plan_id"], "switch_after_s": 0, "replan": true});
    let applied = app.post("/rebalance", Some(body)).await;
    assert_eq!(applied.status, 200, "{}", applied.body);
    let plan = &applied.body;
    assert_eq!(plan["replanned"], true, "{plan}");
    assert_eq!(plan["moves"].as_array().unwrap().len(), previewed, "{plan}");
    // Before and after describe what was applied, not the whole fresh plan.
    assert_eq!(plan["before"], fresh["before"], "{plan}");
    let before_max = plan["before"]["max"].as_u64().unwrap();
    assert_eq!(
        plan["after"]["max"].as_u64(),
        Some(before_max - 2),
        "{plan}"
    );
    assert_eq!(plan["complete"], false, "{plan}");
    let d = app.get("/distribution?shards=2").await.body;
    assert_eq!(d["skew"]["max"], plan["after"]["max"], "{d}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exact_match_applies_as_previewed_and_a_stale_one_without_replan_conflicts() {
    let app = spawn_app().await;
    crate::staged::lopsided(&app).await;
    let preview = app.get("/rebalance/preview?shards=2").await.body;
    app.allocate("newcomer").await;
    let stale = json!({"plan_id": preview["plan_id"], "switch_after_s": 0, "replan": false});
    assert_problem(&app.post("/rebalance", Some(stale)).await, 409, "replan");

    let preview = app.get("/rebalance/preview?shards=2").await.body;
    let body = json!({"plan_id": preview["plan_id"], "switch_after_s": 0, "replan": true});
    let applied = app.post("/rebalance", Some(body)).await;
    assert_eq!(applied.status, 200, "{}", applied.body);
    assert_eq!(applied.body["replanned"], false, "{}", applied.body);
    assert_eq!(applied.body["plan_id"], preview["plan_id"]);
    assert_eq!(applied.body["after"], preview["after"]);
    assert_eq!(
        applied.body["moves"].as_array().unwrap().len(),
        preview["moves"].as_array().unwrap().len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_fanout_is_set_shown_and_cleared_with_patch() {
    let app = spawn_app().await;
    app.allocate("hot").await;
    let patch = |body: serde_json::Value| app.call(reqwest::Method::PATCH, "/keys/hot", Some(body));
    let set = patch(json!({"max_fanout": 4})).await;
    assert_eq!(set.status, 200, "{}", set.body);
    assert_eq!(
        (set.body["fanout"].clone(), set.body["max_fanout"].clone()),
        (json!(1), json!(4))
    );
    assert_eq!(app.get("/keys/hot").await.body["max_fanout"], 4);
    let page = app.get("/keys").await.body;
    assert_eq!(page["items"][0]["max_fanout"], 4, "{page}");
    // Weight and fanout changes keep it.
    let grown = patch(json!({"weight": 3, "fanout": 3})).await;
    assert_eq!(grown.status, 200, "{}", grown.body);
    assert_eq!(grown.body["max_fanout"], 4);

    // Out of range, or below the fanout (the one asked for, or the current one): 422.
    for (body, needle) in [
        (json!({"max_fanout": 0}), "max_fanout"),
        (json!({"max_fanout": 1025}), "max_fanout"),
        (json!({"max_fanout": 2}), "below the fanout"),
        (json!({"fanout": 5, "weight": 5}), "above max_fanout"),
        (json!({"fanout": 2, "max_fanout": 1}), "below the fanout"),
    ] {
        assert_problem(&patch(body.clone()).await, 422, needle);
    }
    assert_eq!(app.get("/keys/hot").await.body["max_fanout"], 4);

    // Null clears it, and the lookup no longer shows one.
    let cleared = patch(json!({"max_fanout": null})).await;
    assert_eq!(cleared.status, 200, "{}", cleared.body);
    assert!(cleared.body.get("max_fanout").is_none(), "{}", cleared.body);
    assert!(app.get("/keys/hot").await.body.get("max_fanout").is_none());

    // The log records each change of the cap.
    let events = app.get("/events?limit=1000").await.body;
    let caps: Vec<_> = events["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["kind"] == "max_fanout")
        .map(|e| e["max_fanout"].clone())
        .collect();
    assert_eq!(caps, vec![json!(4), json!(null)], "{events}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_fanout_survives_a_restart_and_goes_with_the_account() {
    let app = spawn_app().await;
    app.allocate("hot").await;
    let set = app
        .call(
            reqwest::Method::PATCH,
            "/keys/hot",
            Some(json!({"max_fanout": 8})),
        )
        .await;
    assert_eq!(set.status, 200, "{}", set.body);
    let app = app.restart().await;
    assert_eq!(app.get("/keys/hot").await.body["max_fanout"], 8);
    assert_eq!(app.delete("/keys/hot").await.status, 204);
    app.allocate("hot").await;
    assert!(app.get("/keys/hot").await.body.get("max_fanout").is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_moves_say_their_reason_in_the_log() {
    let app = spawn_app().await;
    crate::staged::lopsided(&app).await;
    let preview = app.get("/rebalance/preview?shards=2").await.body;
    let body = json!({"plan_id": preview["plan_id"], "switch_after_s": 0});
    assert_eq!(app.post("/rebalance", Some(body)).await.status, 200);
    let events = app.get("/events?limit=1000").await.body;
    let moves: Vec<_> = events["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["kind"] == "move")
        .collect();
    assert_eq!(moves.len(), 2, "{events}");
    for m in moves {
        assert_eq!(m["reason"], "admin", "{m}");
    }
    let allocate = &events["events"][0];
    assert!(allocate.get("reason").is_none(), "{allocate}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_replica_shows_max_fanout_from_the_log() {
    let dir = tempfile::tempdir().unwrap();
    let (database, _postgres) = crate::helpers::fresh_database(dir.path()).await;
    let none: &[(&str, &str)] = &[];
    let (_servers, api) = crate::replicas::start_with(&database, dir.path(), &[none; 2]).await;
    let (status, body) = api.call(0, reqwest::Method::POST, "/keys/hot", None).await;
    assert_eq!(status, 201, "{body}");
    let cap = Some(json!({"max_fanout": 6}));
    let (status, body) = api.call(0, reqwest::Method::PATCH, "/keys/hot", cap).await;
    assert_eq!(status, 200, "{body}");
    let started = Instant::now();
    loop {
        let (status, seen) = api.get(1, "/keys/hot").await;
        if status == 200 && seen["max_fanout"] == 6 {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "replica 1 answers {seen}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
