//! Rebalancing a busy system: applies that re-plan under the writer lock when their preview
//! went stale, bounded by the preview's move count.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde_json::json;

use crate::helpers::{TestApp, assert_problem, spawn_app};
use crate::replicas::Api;

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

/// Accounts on the primary stream `s` of four shards, ten a shard.
const ACCOUNTS: usize = 40;

/// An app that balances `s` by load every second, after `adjust`.
pub(crate) async fn controlled(
    adjust: impl FnOnce(&mut keyspread::config::ServeConfig),
) -> TestApp {
    let app = crate::helpers::spawn_app_with(|c| {
        c.primary_stream = Some("s".into());
        c.lease_join_batch_ms = 0;
        c.controller.auto_rebalance = true;
        c.controller.auto_rebalance_interval_s = 1;
        c.controller.switch_after_ms = Some(0);
        adjust(c);
    })
    .await;
    let put = app
        .call(
            reqwest::Method::PUT,
            "/streams/s",
            Some(json!({"shard_count": 4})),
        )
        .await;
    assert_eq!(put.status, 201, "{}", put.body);
    for i in 0..ACCOUNTS {
        app.allocate(&format!("a{i}")).await;
    }
    app
}

/// Reports, as worker `w` holding every shard of `s`, that shard i carried `rates[i]`
/// records a second over the last hour, spread evenly over the accounts on it.
pub(crate) async fn report(app: &TestApp, rates: [u64; 4]) {
    report_to(&Api::new(app.client.clone(), vec![app.url("")]), rates).await;
}

/// [`report`] through the first replica of `api`.
async fn report_to(api: &Api, rates: [u64; 4]) {
    report_with(api, rates, &[]).await;
}

/// [`report_to`], plus `extra` accounts with their rates on the shard of their key 0.
async fn report_with(api: &Api, mut rates: [u64; 4], extra: &[(&str, u64)]) {
    let put = reqwest::Method::PUT;
    let ttl = Some(json!({"ttl_s": 600}));
    let (status, joined) = api.call(0, put.clone(), "/streams/s/workers/w", ttl).await;
    assert_eq!(status, 200, "{joined}");
    let mut on: Vec<Vec<String>> = vec![Vec::new(); 4];
    for i in 0..ACCOUNTS {
        let (_, at) = api
            .get(0, &format!("/shard-of?account=a{i}&stream=s"))
            .await;
        on[at["shard_index"].as_u64().unwrap() as usize].push(format!("a{i}"));
    }
    let mut extra_on: Vec<Vec<(String, u64)>> = vec![Vec::new(); 4];
    for (account, rate) in extra {
        let (_, at) = api
            .get(0, &format!("/shard-of?account={account}&stream=s"))
            .await;
        let shard = at["shard_index"].as_u64().unwrap() as usize;
        extra_on[shard].push((account.to_string(), *rate));
        rates[shard] += rate;
    }
    let hour = 3_600u64;
    let load: Vec<_> = joined["leases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|lease| {
            let shard = lease["shard_id"].as_str().unwrap();
            let i: usize = shard.trim_start_matches("shardId-").parse().unwrap();
            let extra_rate: u64 = extra_on[i].iter().map(|(_, r)| r).sum();
            let per_account = (rates[i] - extra_rate) * hour / on[i].len().max(1) as u64;
            let accounts: Vec<_> =
                on[i]
                    .iter()
                    .map(|a| json!({"account": a, "records": per_account, "bytes": per_account}))
                    .chain(extra_on[i].iter().map(
                        |(a, r)| json!({"account": a, "records": r * hour, "bytes": r * hour}),
                    ))
                    .collect();
            json!({
                "shard_id": shard, "epoch": lease["epoch"], "window_ms": hour * 1000,
                "records": rates[i] * hour, "bytes": rates[i] * hour, "accounts": accounts,
            })
        })
        .collect();
    assert_eq!(load.len(), 4, "{joined}");
    let body = Some(json!({"ttl_s": 600, "load": load}));
    let (status, beat) = api.call(0, put, "/streams/s/workers/w", body).await;
    assert_eq!(status, 200, "{beat}");
    assert_eq!(beat["ignored_load"], json!([]), "{beat}");
}

/// The move events the controller logged, as (at, account).
pub(crate) async fn load_moves(app: &TestApp) -> Vec<(String, String)> {
    let events = app.get("/events?limit=1000").await.body;
    events["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["kind"] == "move" && e["reason"] == "load")
        .map(|e| {
            (
                e["at"].as_str().unwrap().to_owned(),
                e["account"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

/// A counter of `/metrics`.
async fn counter(app: &TestApp, name: &str) -> u64 {
    app.metric(name).await as u64
}

/// Waits until the controller has run `n` more rounds here.
pub(crate) async fn rounds(app: &TestApp, n: u64) {
    let start = counter(app, "keyspread_controller_rounds_total").await;
    let deadline = Instant::now() + Duration::from_secs(n * 3 + 5);
    while counter(app, "keyspread_controller_rounds_total").await < start + n {
        assert!(
            Instant::now() < deadline,
            "the controller ran no {n} rounds"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hot_shard_gets_moves_by_load_within_the_cap_and_the_cooldown() {
    let app = controlled(|c| c.controller.max_moves_per_round = Some(2)).await;
    report(&app, [600, 100, 100, 100]).await;
    rounds(&app, 3).await;
    let moves = load_moves(&app).await;
    assert!(!moves.is_empty(), "a hot shard gets moves");
    let mut per_round: std::collections::BTreeMap<&str, usize> = Default::default();
    for (at, _) in &moves {
        *per_round.entry(at).or_default() += 1;
    }
    assert!(
        per_round.values().all(|&n| n <= 2),
        "at most the cap a round: {per_round:?}"
    );
    let accounts: std::collections::HashSet<_> = moves.iter().map(|(_, a)| a).collect();
    assert_eq!(
        accounts.len(),
        moves.len(),
        "no account moved twice within the cooldown: {moves:?}"
    );
    assert!(counter(&app, "keyspread_controller_moves_total").await >= moves.len() as u64);
    // Every move left the hot shard.
    let events = app.get("/events?limit=1000").await.body;
    for e in events["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["reason"] == "load")
    {
        let key = e["key_before"].as_str().unwrap().parse::<u128>().unwrap();
        assert!(key < 1u128 << 126, "moved off shard 0: {e}");
    }
}

/// A round plans on a blocking thread of its own, never in place on an async worker: on a
/// runtime of one thread, which refuses work blocking in place, rounds still move keys.
#[tokio::test(flavor = "current_thread")]
async fn a_round_plans_off_the_async_workers() {
    let app = controlled(|c| c.controller.max_moves_per_round = Some(2)).await;
    report(&app, [600, 100, 100, 100]).await;
    rounds(&app, 2).await;
    assert!(
        !load_moves(&app).await.is_empty(),
        "rounds on a one-thread runtime move keys off the hot shard"
    );
}

/// The shard index of `account`'s key 0 on `s`.
async fn shard_of(app: &TestApp, account: &str) -> usize {
    let on = app
        .get(&format!("/shard-of?account={account}&stream=s"))
        .await;
    on.body["shard_index"].as_u64().expect("a shard index") as usize
}

/// A hot account moved by load, then reported where it landed as the best key to move off
/// a busier shard still: it stays put for the cooldown (other keys move instead), and with
/// no cooldown it moves again. Answers the times the hot account moved.
async fn hot_account_moves(cooldown_s: u64) -> usize {
    let app = controlled(|c| {
        c.load_half_life_s = 1;
        c.controller.max_moves_per_round = Some(1);
        c.controller.move_cooldown_s = cooldown_s;
    })
    .await;
    app.allocate("hot").await;
    let api = Api::new(app.client.clone(), vec![app.url("")]);
    let mut rates = [100; 4];
    let first = shard_of(&app, "hot").await;
    rates[first] = 200;
    report_with(&api, rates, &[("hot", 150)]).await;
    rounds(&app, 2).await;
    let moved = |moves: Vec<(String, String)>| moves.iter().filter(|(_, a)| a == "hot").count();
    assert_eq!(
        moved(load_moves(&app).await),
        1,
        "the hot account moves first: {:?}",
        load_moves(&app).await
    );
    // The first report fades (half-life 1 s); then the hot account's new shard is the
    // busiest, and moving it is the best move there.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let landed = shard_of(&app, "hot").await;
    assert_ne!(landed, first);
    let mut rates = [100; 4];
    rates[landed] = 250;
    report_with(&api, rates, &[("hot", 150)]).await;
    rounds(&app, 3).await;
    let moves = load_moves(&app).await;
    assert!(moves.len() >= 2, "the busy shard gets a move: {moves:?}");
    moved(moves)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_account_moved_by_load_stays_for_the_cooldown() {
    assert_eq!(
        hot_account_moves(600).await,
        1,
        "moved again within the cooldown"
    );
    assert_eq!(
        hot_account_moves(0).await,
        2,
        "without a cooldown it moves again"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inside_the_band_or_below_the_floor_nothing_moves() {
    let even = controlled(|_| {}).await;
    report(&even, [500, 520, 480, 510]).await;
    let quiet = controlled(|_| {}).await;
    report(&quiet, [40, 1, 1, 1]).await;
    rounds(&even, 3).await;
    rounds(&quiet, 3).await;
    assert_eq!(load_moves(&even).await, vec![], "inside the band");
    assert_eq!(load_moves(&quiet).await, vec![], "below the floor");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_controller_is_off_by_default() {
    let app = controlled(|c| c.controller = Default::default()).await;
    report(&app, [600, 100, 100, 100]).await;
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert_eq!(counter(&app, "keyspread_controller_rounds_total").await, 0);
    assert_eq!(load_moves(&app).await, vec![]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn of_three_replicas_one_acts_per_round() {
    let dir = tempfile::tempdir().unwrap();
    let (database, _postgres) = crate::helpers::fresh_database(dir.path()).await;
    let env: &[(&str, &str)] = &[
        ("KEYSPREAD_PRIMARY_STREAM", "s"),
        ("KEYSPREAD_AUTO_REBALANCE", "true"),
        ("KEYSPREAD_AUTO_REBALANCE_INTERVAL_S", "1"),
        ("KEYSPREAD_MAX_MOVES_PER_ROUND", "1"),
        ("KEYSPREAD_LEASE_JOIN_BATCH_MS", "0"),
    ];
    let (_servers, api) = crate::replicas::start_with(&database, dir.path(), &[env; 3]).await;
    let (status, body) = api
        .call(
            0,
            reqwest::Method::PUT,
            "/streams/s",
            Some(json!({"shard_count": 4})),
        )
        .await;
    assert_eq!(status, 201, "{body}");
    for i in 0..ACCOUNTS {
        let path = format!("/keys/a{i}");
        let (status, body) = api.call(i % 3, reqwest::Method::POST, &path, None).await;
        assert_eq!(status, 201, "{body}");
    }
    report_to(&api, [600, 100, 100, 100]).await;
    let started = Instant::now();
    tokio::time::sleep(Duration::from_secs(5)).await;
    let (_, events) = api.get(1, "/events?limit=1000").await;
    let elapsed = started.elapsed().as_secs_f64();
    let mut rounds: std::collections::BTreeMap<String, usize> = Default::default();
    for e in events["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["reason"] == "load")
    {
        *rounds
            .entry(e["at"].as_str().unwrap().to_owned())
            .or_default() += 1;
    }
    eprintln!("3 replicas, {elapsed:.1} s: load moves per acting round {rounds:?}");
    assert!(rounds.len() >= 2, "the controller acted: {rounds:?}");
    assert!(
        rounds.values().all(|&n| n == 1),
        "one move a round: {rounds:?}"
    );
    // Each replica ticks every second: without the claim, three rounds a second would act.
    // With it, acting rounds are a round apart (the claim allows a tenth's early tick).
    let mut times: Vec<f64> = rounds.keys().map(|at| seconds_of_day(at)).collect();
    times.sort_by(f64::total_cmp);
    for pair in times.windows(2) {
        assert!(
            pair[1] - pair[0] >= 0.85,
            "two acting rounds within one: {rounds:?}"
        );
    }
    assert!(rounds.len() as f64 <= elapsed / 0.9 + 2.0, "{rounds:?}");
}

/// Seconds since midnight of an RFC 3339 time such as `2026-11-26T12:36:23.99Z`.
fn seconds_of_day(at: &str) -> f64 {
    let time = at.split_once('T').unwrap().1.trim_end_matches('Z');
    let parts: Vec<f64> = time.split(':').map(|p| p.parse().unwrap()).collect();
    parts[0] * 3600.0 + parts[1] * 60.0 + parts[2]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn opted_in_accounts_fan_out_when_hot_and_back_when_cold() {
    let app = controlled(|_| {}).await;
    // A cap of 0: none set.
    for (account, fanout, cap) in [("hot", 1, 4), ("cold", 3, 4), ("shy", 1, 0)] {
        let body = json!({"fanout": fanout, "weight": fanout});
        app.post(&format!("/keys/{account}"), Some(body)).await;
        if cap > 0 {
            let cap = Some(json!({"max_fanout": cap}));
            let set = app
                .call(reqwest::Method::PATCH, &format!("/keys/{account}"), cap)
                .await;
            assert_eq!(set.status, 200, "{}", set.body);
        }
    }
    // hot carries 1.2 shards' worth (a hot share of 0.5 suggests 3 keys) and puts the
    // stream out of its band: each key within the band's width (a tenth of the mean
    // utilisation, 0.1 × 0.7) would take 18, so it goes to its cap of 4. shy carries as
    // much without having opted in; cold nothing.
    let api = Api::new(app.client.clone(), vec![app.url("")]);
    report_with(&api, [100, 100, 100, 100], &[("hot", 1200), ("shy", 1200)]).await;
    rounds(&app, 2).await;
    let fanout = |a: &'static str| {
        let app = &app;
        async move { app.get(&format!("/keys/{a}")).await.body["fanout"].clone() }
    };
    assert_eq!(fanout("hot").await, 4, "raised to its cap");
    assert_eq!(fanout("shy").await, 1, "never without max_fanout");
    // Cold since the first round, for less than ten half-lives (of 120 s): kept.
    assert_eq!(
        fanout("cold").await,
        3,
        "lowered before ten half-lives cold"
    );
    assert!(counter(&app, "keyspread_controller_fanouts_total").await >= 1);
}

/// Ten half-lives of 1 s: a fanout an admin set on an account that opted in, never hot,
/// comes down to one key no sooner and no much later.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fanout_comes_down_after_ten_half_lives_cold() {
    let app = controlled(|c| c.load_half_life_s = 1).await;
    let body = json!({"fanout": 3, "weight": 3});
    app.post("/keys/cold", Some(body)).await;
    let cap = Some(json!({"max_fanout": 4}));
    let set = app.call(reqwest::Method::PATCH, "/keys/cold", cap).await;
    assert_eq!(set.status, 200, "{}", set.body);
    report(&app, [100, 100, 100, 100]).await;
    let reported = Instant::now();
    let fanout = || async { app.get("/keys/cold").await.body["fanout"].clone() };
    while fanout().await != 1 {
        assert!(
            reported.elapsed() < Duration::from_secs(20),
            "never lowered"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // The first round after the report found it cold (rounds come every second).
    let waited = reported.elapsed().as_secs_f64();
    assert!(
        waited >= 9.0,
        "lowered {waited:.1} s after the report, before ten half-lives"
    );
    eprintln!("lowered {waited:.1} s after the first report (ten half-lives: 10 s)");
}

/// The `allocate` events of `account`'s keys above key 0, as (index, switch_at).
async fn new_keys(app: &TestApp, account: &str) -> Vec<(u64, serde_json::Value)> {
    let events = app.get("/events?limit=1000").await.body;
    (events["events"].as_array().unwrap().iter())
        .filter(|e| e["kind"] == "allocate" && e["account"] == account && e["index"] != 0)
        .map(|e| (e["index"].as_u64().unwrap(), e["switch_at"].clone()))
        .collect()
}

/// Growing a fanout moves sub-keys to the new keys, so the controller stages it as it
/// stages moves: every answer keeps to the keys in force until the switch (lookups,
/// shard-of, across a restart), `next` and `GET /moves` announce the new keys with the
/// keys their sub-keys come from, and from the switch on the new keys are in force.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fanout_raised_by_load_takes_over_at_its_switch_on_every_answer() {
    let app = controlled(|c| c.controller.switch_after_ms = Some(8_000)).await;
    app.post("/keys/hot", Some(json!({"fanout": 1, "weight": 1})))
        .await;
    // Out of the band, the load raises it to its cap.
    let cap = Some(json!({"max_fanout": 3}));
    let set = app.call(reqwest::Method::PATCH, "/keys/hot", cap).await;
    assert_eq!(set.status, 200, "{}", set.body);
    let key0 = app.get("/keys/hot").await.body["hash_key"].clone();
    let api = Api::new(app.client.clone(), vec![app.url("")]);
    report_with(&api, [100, 100, 100, 100], &[("hot", 1200)]).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while new_keys(&app, "hot").await.is_empty() {
        assert!(Instant::now() < deadline, "no fanout raised");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let logged = new_keys(&app, "hot").await;
    assert_eq!(logged.len(), 2, "raised to 3 keys: {logged:?}");
    let switch_at = logged[0].1.clone();
    assert!(
        switch_at.is_string(),
        "a new key says when it takes over: {logged:?}"
    );

    let lookup = app.get("/keys/hot").await;
    let before = &lookup.body;
    assert_eq!(before["fanout"], 1, "{before}");
    assert_eq!(before["hash_keys"], json!([key0]), "{before}");
    let next = &before["next"];
    assert_eq!(next["switch_at"], switch_at, "{before}");
    let all = next["hash_keys"].as_array().unwrap().clone();
    assert_eq!(all.len(), 3, "{before}");
    assert_eq!(all[0], key0);
    // "order-1" is index 2 of 3 keys (DESIGN's vectors), and 0 of 1.
    let of = app
        .get("/shard-of?account=hot&sub_key=order-1&stream=s")
        .await;
    assert_eq!(of.status, 200, "{}", of.body);
    assert_eq!(of.body["index"], 0, "{}", of.body);
    let moves = app.get("/moves").await.body;
    let announced: Vec<_> = (moves["items"].as_array().unwrap().iter())
        .filter(|m| m["account"] == "hot")
        .collect();
    assert_eq!(announced.len(), 2, "{moves}");
    for m in &announced {
        let i = m["index"].as_u64().unwrap() as usize;
        assert_eq!(m["to"], all[i], "{m}");
        assert_eq!(m["from_keys"], json!([key0]), "{m}");
        assert_eq!(m["switch_at"], switch_at, "{m}");
    }
    // A growth asked for while the new keys wait is refused, saying until when.
    let grow = Some(json!({"fanout": 2, "weight": 2}));
    let refused = app.call(reqwest::Method::PATCH, "/keys/hot", grow).await;
    let until = switch_at.as_str().unwrap();
    assert_problem(
        &refused,
        409,
        &format!("growing: its new keys take over at {until}"),
    );
    // A new weight meanwhile keeps every key where it is (it once panicked: the keys in
    // force are fewer than the keys held).
    let weight = Some(json!({"weight": 9}));
    let reweighted = app.call(reqwest::Method::PATCH, "/keys/hot", weight).await;
    assert_eq!(reweighted.status, 200, "{}", reweighted.body);
    assert_eq!(
        reweighted.body["hash_keys"],
        json!([key0]),
        "{}",
        reweighted.body
    );
    assert_eq!(reweighted.body["weight"], 9, "{}", reweighted.body);

    let app = app.restart().await;
    let again = app.get("/keys/hot").await;
    assert_eq!(again.body["hash_keys"], json!([key0]), "{}", again.body);
    assert_eq!(
        again.body["next"]["hash_keys"],
        json!(all),
        "{}",
        again.body
    );

    let at = keyspread_ms(&switch_at);
    while (time::OffsetDateTime::now_utc().unix_timestamp_nanos() / 1_000_000) as i64 <= at + 100 {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let after = app.get("/keys/hot").await.body;
    assert_eq!(after["fanout"], 3, "{after}");
    assert_eq!(after["hash_keys"], json!(all), "{after}");
    assert!(after.get("next").is_none_or(|n| n.is_null()), "{after}");
    let of = app
        .get("/shard-of?account=hot&sub_key=order-1&stream=s")
        .await;
    assert_eq!(of.body["index"], 2, "{}", of.body);
    let moves = app.get("/moves").await.body;
    assert!(
        !moves["items"]
            .as_array()
            .unwrap()
            .iter()
            .any(|m| m["account"] == "hot"),
        "{moves}"
    );
}

/// Unix milliseconds of an RFC 3339 timestamp.
fn keyspread_ms(text: &serde_json::Value) -> i64 {
    use time::format_description::well_known::Rfc3339;
    let text = text.as_str().expect("a timestamp");
    let t = time::OffsetDateTime::parse(text, &Rfc3339).unwrap_or_else(|e| panic!("{text}: {e}"));
    (t.unix_timestamp_nanos() / 1_000_000) as i64
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_preview_by_load_moves_keys_off_the_busiest_shard_and_applies() {
    let app = controlled(|c| c.controller = Default::default()).await;
    report(&app, [600, 100, 100, 100]).await;
    let preview = app.get("/rebalance/preview?stream=s&by=load").await;
    assert_eq!(preview.status, 200, "{}", preview.body);
    let plan = &preview.body;
    assert_eq!(plan["by"], "load", "{plan}");
    let moves = plan["moves"].as_array().unwrap().clone();
    assert!(!moves.is_empty(), "{plan}");
    assert!(
        moves
            .iter()
            .all(|m| m["from_shard"] == 0 && m["to_shard"] != 0),
        "{plan}"
    );
    let (before, after) = (&plan["load_before"], &plan["load_after"]);
    assert!(
        (before["max"].as_f64().unwrap() - 0.6).abs() < 0.01,
        "{plan}"
    );
    assert!(after["max"].as_f64() < before["max"].as_f64(), "{plan}");
    // The Skews every plan answers measure utilisation in a by-load plan.
    for (skew, load) in [("before", before), ("after", after)] {
        assert_eq!(plan[skew]["max_over_mean"], load["max_over_mean"], "{plan}");
    }
    // The same state previews the same plan; a by-count preview is another plan.
    let again = app.get("/rebalance/preview?stream=s&by=load").await.body;
    assert_eq!(again["plan_id"], plan["plan_id"]);
    let by_count = app.get("/rebalance/preview?stream=s").await.body;
    assert!(by_count.get("by").is_none(), "{by_count}");

    let body = json!({"plan_id": plan["plan_id"], "switch_after_s": 0});
    let applied = app.post("/rebalance", Some(body)).await;
    assert_eq!(applied.status, 200, "{}", applied.body);
    assert_eq!(applied.body["replanned"], false, "{}", applied.body);
    assert_eq!(applied.body["moves"].as_array().unwrap().len(), moves.len());
    // Loads decay between preview and apply; their proportions do not.
    let ratio = |p: &serde_json::Value| p["load_after"]["max_over_mean"].as_f64().unwrap();
    assert!(
        (ratio(&applied.body) - ratio(plan)).abs() < 1e-6,
        "{}",
        applied.body
    );
    for m in &moves {
        let account = m["account"].as_str().unwrap();
        assert_eq!(
            app.get(&format!("/keys/{account}")).await.body["hash_key"],
            m["to"]
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_preview_by_anything_else_is_refused() {
    let app = controlled(|c| c.controller = Default::default()).await;
    let by_weight = app.get("/rebalance/preview?stream=s&by=weight").await;
    assert_problem(&by_weight, 422, "by must be count or load");
    assert_problem(
        &app.get("/rebalance/preview?shards=4&by=load").await,
        422,
        "give stream",
    );
    assert_eq!(
        app.get("/rebalance/preview?stream=s&by=count").await.status,
        200
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fanout_raised_by_load_puts_the_new_key_on_the_least_utilised_shard() {
    // A band no skew leaves: the rounds only change fanouts.
    let app = controlled(|c| c.controller.load_tolerance = 100.0).await;
    app.post("/keys/hot", Some(json!({"fanout": 1, "weight": 1})))
        .await;
    let cap = Some(json!({"max_fanout": 2}));
    let set = app.call(reqwest::Method::PATCH, "/keys/hot", cap).await;
    assert_eq!(set.status, 200, "{}", set.body);
    let shard_of = |key: serde_json::Value| {
        let app = &app;
        async move {
            let key = key.as_str().unwrap().to_owned();
            let at = app.get(&format!("/shard-of?hash_key={key}&stream=s")).await;
            at.body["shard_index"].as_u64().unwrap() as usize
        }
    };
    let home = shard_of(app.get("/keys/hot").await.body["hash_keys"][0].clone()).await;
    // The other shards hold as many keys each; by count the new key would go to the first
    // of them. The last carries the least load.
    let others: Vec<usize> = (0..4).filter(|&s| s != home).collect();
    let mut rates = [400u64; 4];
    rates[others[2]] = 50;
    rates[others[1]] = 300;
    let api = Api::new(app.client.clone(), vec![app.url("")]);
    report_with(&api, rates, &[("hot", 1200)]).await;
    rounds(&app, 2).await;
    let keys = app.get("/keys/hot").await.body["hash_keys"].clone();
    assert_eq!(keys.as_array().map(Vec::len), Some(2), "{keys}");
    let page = app.get("/load?stream=s").await.body;
    let least = (page["shards"].as_array().unwrap().iter())
        .filter_map(|s| {
            let id = s["shard_id"].as_str().unwrap();
            let i: usize = id.trim_start_matches("shardId-").parse().unwrap();
            (i != home).then(|| (s["utilisation"].as_f64().unwrap(), i))
        })
        .min_by(|a, b| a.0.total_cmp(&b.0))
        .unwrap()
        .1;
    assert_eq!(least, others[2], "{page}");
    assert_eq!(shard_of(keys[1].clone()).await, least, "{keys} {page}");
}
