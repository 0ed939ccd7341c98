//! Reshards keyspread carries out on kinesalite (through a recording proxy): the stream
//! ends with the target's shards, keyspread's map is Kinesis', each call is made once on an
//! open shard, and the primary stream gets one staged rebalance with reason `reshard`; what
//! Kinesis would refuse is refused up front, and a shard limit met partway fails the job.
//! The watch leaves a stream being resharded to its job, even a listing already on its way.

use std::time::{Duration, Instant};

use keyspread::config::ServeConfig;
use reqwest::Method;
use serde_json::{Value, json};

use crate::helpers::{TestApp, assert_problem, spawn_app_with};
use crate::kinesalite::{Kinesalite, KinesisApi};
use crate::reshard_proxy::{Call, ListingHold, Proxy, Rules};

/// Accounts held while resharding: enough that every plan cuts between keys.
const ACCOUNTS: usize = 90;

/// Accounts allocated during each job of the 2 -> 5 -> 9 test: at least, at most, and for
/// how long at most past the least.
const MIN_MORE: usize = 5;
const MAX_MORE: usize = 30;
const HOLD_FOR: Duration = Duration::from_secs(2);

/// A keyspread reaching kinesalite through `proxy`, with [`ACCOUNTS`] accounts.
pub(crate) async fn app_behind(proxy: &Proxy) -> TestApp {
    app_behind_with(proxy, |_| {}).await
}

/// [`app_behind`], configured further by `configure`.
async fn app_behind_with(proxy: &Proxy, configure: impl FnOnce(&mut ServeConfig)) -> TestApp {
    let endpoint = proxy.endpoint.clone();
    let app = spawn_app_with(|c| {
        c.kinesis_endpoint = Some(endpoint);
        c.kinesis_region = Some("us-east-1".into());
        configure(c);
    })
    .await;
    for i in 0..ACCOUNTS {
        app.allocate(&format!("acct-{i:03}")).await;
    }
    app
}

/// Creates `stream` with `shards` shards in kinesalite and has keyspread watch it, as the
/// primary stream.
pub(crate) async fn watch(app: &TestApp, kinesis: &KinesisApi, stream: &str, shards: u32) {
    kinesis.create_stream(stream, shards).await;
    let body = json!({"watch": true, "primary": true});
    let put = (app.call(Method::PUT, &format!("/streams/{stream}"), Some(body))).await;
    assert!(put.status < 300, "PUT /streams/{stream}: {put:?}");
}

/// Waits (at most 60 s) for `stream`'s latest job to end, and answers it.
pub(crate) async fn ended(client: &reqwest::Client, url: &str, stream: &str) -> Value {
    let started = Instant::now();
    loop {
        let job: Value = match client
            .get(format!("{url}/streams/{stream}/reshard"))
            .send()
            .await
        {
            Ok(response) => response.json().await.unwrap_or_default(),
            Err(_) => Value::Null,
        };
        if job["state"] != "running" && !job.is_null() {
            return job;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the reshard of {stream} did not end within 60 s: {job}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// `stream`'s open shards in Kinesis, in key order: (id, start, end).
pub(crate) async fn open_shards(kinesis: &KinesisApi, stream: &str) -> Vec<(String, u128, u128)> {
    let listing = kinesis.list_shards_json(stream).await;
    let mut open: Vec<_> = (listing["Shards"].as_array().unwrap().iter())
        .filter(|s| s["SequenceNumberRange"]["EndingSequenceNumber"].is_null())
        .map(|s| {
            let key = |field: &str| s["HashKeyRange"][field].as_str().unwrap().parse().unwrap();
            let id = s["ShardId"].as_str().unwrap().to_owned();
            (id, key("StartingHashKey"), key("EndingHashKey"))
        })
        .collect();
    open.sort_by_key(|s| s.1);
    open
}

/// Kinesis' open shards of `stream` tile the keyspace exactly, and keyspread's map of it
/// (at `url`) is theirs; answers their count.
pub(crate) async fn check_map(
    client: &reqwest::Client,
    url: &str,
    kinesis: &KinesisApi,
    stream: &str,
) -> usize {
    let open = open_shards(kinesis, stream).await;
    let mut next = 0u128;
    for (id, start, end) in &open {
        assert_eq!(
            *start, next,
            "{stream}: shard {id} leaves a gap or overlaps: {open:?}"
        );
        next = end.wrapping_add(1);
    }
    assert_eq!(
        next, 0,
        "{stream}: the open shards end at 2^128 - 1: {open:?}"
    );
    let ours: Value = (client.get(format!("{url}/streams/{stream}")).send().await)
        .unwrap()
        .json()
        .await
        .unwrap();
    let ours: Vec<(String, u128, u128)> = (ours["shards"].as_array().unwrap().iter())
        .map(|s| {
            let key = |field: &str| s[field].as_str().unwrap().parse().unwrap();
            let id = s["shard_id"].as_str().unwrap().to_owned();
            (id, key("starting_hash_key"), key("ending_hash_key"))
        })
        .collect();
    assert_eq!(ours, open, "{stream}: keyspread's map is Kinesis'");
    open.len()
}

/// No SplitShard or MergeShards Kinesis made named a shard closed before it (a call made
/// twice would): answers how many were made.
pub(crate) fn check_calls(calls: &[Call]) -> usize {
    let mut closed = std::collections::HashSet::new();
    let made: Vec<&Call> = calls.iter().filter(|c| c.reshaped()).collect();
    for call in &made {
        for shard in call.shards() {
            assert!(
                closed.insert(shard.clone()),
                "{} named shard {shard}, closed already: {:?}",
                call.action,
                made.iter()
                    .map(|c| (&c.action, c.shards()))
                    .collect::<Vec<_>>()
            );
        }
    }
    made.len()
}

async fn start(app: &TestApp, stream: &str, target: u32) -> crate::helpers::Answer {
    let body = json!({"target": target, "switch_after_s": 1});
    app.post(&format!("/streams/{stream}/reshard"), Some(body))
        .await
}

/// Reshards `stream` to `target` with its first call held: a second job meanwhile is 409.
/// Answers how many accounts were allocated while it ran.
async fn reshard(
    app: &TestApp,
    kinesalite: &Kinesalite,
    proxy: &Proxy,
    stream: &str,
    target: u32,
) -> usize {
    proxy.set(Rules {
        hold: Some(1),
        ..Rules::default()
    });
    let started = start(app, stream, target).await;
    assert_eq!(started.status, 202, "{started:?}");
    let job = &started.body;
    assert_eq!(job["state"], "running", "{job}");
    assert_eq!(job["target"], target, "{job}");
    assert_eq!(job["done"], 0, "{job}");
    let planned = job["steps"].as_array().unwrap().len();
    assert!(planned > 0, "{job}");

    proxy.held().await;
    let held = Instant::now();
    let second = start(app, stream, target + 1).await;
    // Accounts allocated meanwhile go on the map registered before the call: the
    // rebalance at the end moves some onto the shards cut without them. The call is
    // held well under the SDK's 5 s attempt timeout, after which it would be sent again.
    let mut more = 0;
    while more < MIN_MORE || (more < MAX_MORE && held.elapsed() < HOLD_FOR) {
        app.allocate(&format!("acct-{target}-{more:03}")).await;
        more += 1;
    }
    assert_problem(&second, 409, "is being resharded already");
    assert_eq!(second.body["job"], job["id"], "{second:?}");
    proxy.release();

    let job = ended(&app.client, &app.url(""), stream).await;
    assert_eq!(job["state"], "done", "{job}");
    assert_eq!(job["error"], Value::Null, "{job}");
    let made = check_calls(&proxy.calls());
    assert_eq!(job["done"], made, "{job}");
    assert_eq!(job["steps"].as_array().unwrap().len(), made, "{job}");
    assert_eq!(job["shard_count"], target, "{job}");
    let open = check_map(&app.client, &app.url(""), &kinesalite.api, stream).await;
    assert_eq!(open, target as usize);
    more
}

/// The staged moves a reshard's rebalance logged (one rebalance, every move `reshard`),
/// after checking the last map of `stream` was registered as Kinesis'.
async fn reshard_moves(app: &TestApp, stream: &str) -> Vec<Value> {
    let events = app.get("/events?after=0&limit=1000").await.body;
    let events = events["events"].as_array().unwrap();
    let put = (events.iter().rev())
        .find(|e| e["kind"] == "stream_put" && e["stream"] == stream)
        .unwrap();
    assert_eq!(put["actor"], "kinesis", "{put}");
    let moves: Vec<Value> = (events.iter())
        .filter(|e| e["kind"] == "move")
        .cloned()
        .collect();
    for m in &moves {
        assert_eq!(m["reason"], "reshard", "{m}");
    }
    moves
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watched_stream_is_resharded_2_to_5_to_9_with_one_rebalance_each() {
    let kinesalite = Kinesalite::start().await;
    let proxy = Proxy::start(kinesalite.api.endpoint()).await;
    // Listed every second while each job's first call is held for two, with the loop on:
    // the watch must leave a stream being resharded to its job, or it registers and
    // rebalances a map of the way there.
    let app = app_behind_with(&proxy, |c| {
        c.stream_sync_interval_s = 1;
        c.controller.auto_rebalance = true;
    })
    .await;
    watch(&app, &kinesalite.api, "orders", 2).await;

    let mut rebalances = Vec::new();
    let mut accounts = ACCOUNTS;
    for target in [5, 9] {
        accounts += reshard(&app, &kinesalite, &proxy, "orders", target).await;
        let moves = reshard_moves(&app, "orders").await;
        let ats: std::collections::BTreeSet<String> =
            (moves.iter()).map(|m| m["at"].to_string()).collect();
        rebalances.push(ats.len());
        // The moves switch 1 s on: then the accounts lie evenly on the new shards.
        tokio::time::sleep(Duration::from_millis(1500)).await;
        assert_eq!(app.get("/moves").await.body["items"], json!([]));
        let shown = app.get("/distribution?stream=orders").await.body;
        let most = accounts.div_ceil(target as usize) as u64;
        for shard in shown["shards"].as_array().unwrap() {
            assert!(
                shard["accounts"].as_u64().unwrap() <= most,
                "at most {most} accounts a shard: {shown}"
            );
        }
    }
    assert_eq!(rebalances, [1, 2], "one rebalance at the end of each job");
    // The watch listed the stream between the jobs and after, and found every change
    // already registered: while a job ran, it left the stream to the job.
    let syncs = app
        .metric("keyspread_stream_syncs_total{stream=\"orders\"}")
        .await;
    let changes = app
        .metric("keyspread_stream_sync_changes_total{stream=\"orders\"}")
        .await;
    assert!(syncs > 0.0);
    assert_eq!(changes, 0.0, "the watch registered a map of a job's way");
}

/// The watch's listings of `stream` counted so far, and those that registered a change
/// (none before the first is counted).
async fn syncs(app: &TestApp, stream: &str) -> (f64, f64) {
    let metrics = app.client.get(app.url("/metrics")).send().await;
    let text = metrics.expect("GET /metrics sent").text().await.unwrap();
    let count = |series: &str| {
        let series = format!("{series}{{stream=\"{stream}\"}} ");
        (text.lines())
            .find_map(|l| l.strip_prefix(&series)?.parse().ok())
            .unwrap_or(0.0)
    };
    let syncs = count("keyspread_stream_syncs_total");
    (syncs, count("keyspread_stream_sync_changes_total"))
}

/// Waits (at most 30 s) until the watch has counted a listing of `stream` past `before`:
/// the round of any listing held before then is over.
async fn next_sync(app: &TestApp, stream: &str, before: f64) {
    let started = Instant::now();
    while syncs(app, stream).await.0 <= before {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "no listing of {stream} in 30 s"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A watch's listing that a reshard overtook on its way is not registered: one sent to
/// Kinesis while a job runs (a map of the way there, which would be rebalanced), and one
/// answered before a job that ended since (it would put the map from before the job back).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listing_a_reshard_overtook_is_not_registered() {
    let kinesalite = Kinesalite::start().await;
    let proxy = Proxy::start(kinesalite.api.endpoint()).await;
    let app = app_behind_with(&proxy, |c| {
        c.stream_sync_interval_s = 1;
        c.controller.auto_rebalance = true;
    })
    .await;
    watch(&app, &kinesalite.api, "orders", 2).await;

    // The watch's next listing waits to be sent until the job's first split is made in
    // Kinesis (and its answer held: the job runs on).
    proxy.set(Rules {
        hold: Some(1),
        hold_listing: Some(ListingHold::Request),
        ..Rules::default()
    });
    proxy.listing_held().await;
    let started = start(&app, "orders", 3).await;
    assert_eq!(started.status, 202, "{started:?}");
    proxy.held().await;
    let (counted, _) = syncs(&app, "orders").await;
    proxy.release_listing();
    proxy.release();
    assert_eq!(
        ended(&app.client, &app.url(""), "orders").await["state"],
        "done"
    );
    next_sync(&app, "orders", counted).await;
    assert_eq!(
        check_map(&app.client, &app.url(""), &kinesalite.api, "orders").await,
        3
    );

    // The watch's next listing is answered (two open shards of three) and held until a
    // job to four has ended.
    proxy.set(Rules {
        hold_listing: Some(ListingHold::Answer),
        ..Rules::default()
    });
    proxy.listing_held().await;
    let started = start(&app, "orders", 4).await;
    assert_eq!(started.status, 202, "{started:?}");
    assert_eq!(
        ended(&app.client, &app.url(""), "orders").await["state"],
        "done"
    );
    let (counted, _) = syncs(&app, "orders").await;
    proxy.release_listing();
    next_sync(&app, "orders", counted).await;
    assert_eq!(
        check_map(&app.client, &app.url(""), &kinesalite.api, "orders").await,
        4
    );

    let (_, changes) = syncs(&app, "orders").await;
    assert_eq!(
        changes, 0.0,
        "the watch registered a listing a reshard overtook"
    );
    // The last map was the job's; any move was its rebalance's (cut between the accounts'
    // keys, the new shards need none).
    reshard_moves(&app, "orders").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_kinesis_would_refuse_is_refused_up_front() {
    let kinesalite = Kinesalite::start().await;
    let proxy = Proxy::start(kinesalite.api.endpoint()).await;
    let app = app_behind(&proxy).await;

    let put = (app.call(
        Method::PUT,
        "/streams/plain",
        Some(json!({"shard_count": 2})),
    ))
    .await;
    assert_eq!(put.status, 201, "{put:?}");
    assert_problem(&start(&app, "plain", 4).await, 409, "is not watched");
    // A map pasted from list-shards is not watched either: Kinesis is not its source.
    kinesalite.api.create_stream("pasted", 2).await;
    let listing = kinesalite.api.list_shards_json("pasted").await;
    let put = (app.call(Method::PUT, "/streams/pasted", Some(listing))).await;
    assert_eq!(put.status, 201, "{put:?}");
    assert_problem(&start(&app, "pasted", 4).await, 409, "is not watched");
    assert!(
        proxy.calls().is_empty(),
        "Kinesis is not asked about an unwatched stream"
    );

    watch(&app, &kinesalite.api, "orders", 2).await;
    proxy.set(Rules {
        on_demand: true,
        ..Rules::default()
    });
    assert_problem(
        &start(&app, "orders", 4).await,
        409,
        "on-demand capacity mode",
    );

    // 4 open shards in the account, 2 of them this stream's: it may have at most 4.
    proxy.set(Rules {
        limits: Some((6, 4)),
        ..Rules::default()
    });
    let refused = start(&app, "orders", 5).await;
    assert_problem(&refused, 422, "would pass the account's shard limit of 6");
    assert_eq!(refused.body["most"], 4, "{refused:?}");
    assert_eq!(start(&app, "orders", 4).await.status, 202);
    let job = ended(&app.client, &app.url(""), "orders").await;
    assert_eq!(job["state"], "done", "{job}");

    check_calls(&proxy.calls());
    assert_eq!(
        check_map(&app.client, &app.url(""), &kinesalite.api, "orders").await,
        4
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shard_limit_met_partway_fails_the_job_saying_where_it_stopped() {
    let kinesalite = Kinesalite::start().await;
    let proxy = Proxy::start(kinesalite.api.endpoint()).await;
    let app = app_behind(&proxy).await;
    watch(&app, &kinesalite.api, "orders", 2).await;
    proxy.set(Rules {
        splits_allowed: Some(1),
        ..Rules::default()
    });
    let started = start(&app, "orders", 5).await;
    assert_eq!(started.status, 202, "{started:?}");
    let planned = started.body["steps"].as_array().unwrap().len();

    let job = ended(&app.client, &app.url(""), "orders").await;
    assert_eq!(job["state"], "failed", "{job}");
    let made = check_calls(&proxy.calls());
    assert!(made < planned, "{job}");
    assert_eq!(job["done"], made, "{job}");
    let open = check_map(&app.client, &app.url(""), &kinesalite.api, "orders").await;
    assert_eq!(job["shard_count"], open, "{job}");
    let error = job["error"].as_str().unwrap();
    let stopped = format!("stopped after {made} of {planned} calls");
    assert!(error.contains(&stopped), "{error}");
    assert!(error.contains("shard limit"), "{error}");
    let now = format!("the stream has {open} open shards");
    assert!(error.contains(&now), "{error}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_follows_a_job_with_a_progress_bar_and_fails_with_it() {
    let kinesalite = Kinesalite::start().await;
    let proxy = Proxy::start(kinesalite.api.endpoint()).await;
    let app = app_behind(&proxy).await;
    watch(&app, &kinesalite.api, "orders", 2).await;

    let done = cli(&app, "orders", 4).await;
    let (stdout, stderr) = (text(&done.stdout), text(&done.stderr));
    assert!(done.status.success(), "{stdout}{stderr}");
    assert!(stdout.contains("4 open shards after"), "{stdout}");
    let made = check_calls(&proxy.calls());
    let bar = format!("] {made}/{made} calls, 4 open shards (done)");
    assert!(stderr.contains(&bar), "{stderr}");
    assert!(stderr.contains("reshard orders: [--"), "{stderr}");

    proxy.set(Rules {
        splits_allowed: Some(0),
        ..Rules::default()
    });
    let failed = cli(&app, "orders", 6).await;
    let stderr = text(&failed.stderr);
    assert_eq!(failed.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("the reshard of orders failed after"),
        "{stderr}"
    );
    assert!(stderr.contains("shard limit"), "{stderr}");

    let put = (app.call(
        Method::PUT,
        "/streams/plain",
        Some(json!({"shard_count": 2})),
    ))
    .await;
    assert_eq!(put.status, 201, "{put:?}");
    let refused = cli(&app, "plain", 4).await;
    let stderr = text(&refused.stderr);
    assert_eq!(refused.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("409 Conflict: stream \"plain\" is not watched"),
        "{stderr}"
    );
}

/// `keyspread streams reshard NAME --target S` against `app`, bounded to 90 s.
async fn cli(app: &TestApp, stream: &str, target: u32) -> std::process::Output {
    let run = tokio::process::Command::new(env!("CARGO_BIN_EXE_keyspread"))
        .args([
            "streams",
            "reshard",
            stream,
            "--target",
            &target.to_string(),
        ])
        .args(["--switch-after-s", "1", "--url", &app.url("")])
        .env_remove("KEYSPREAD_TOKEN")
        .kill_on_drop(true)
        .output();
    tokio::time::timeout(Duration::from_secs(90), run)
        .await
        .expect("the command ended within 90 s")
        .expect("run keyspread")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_throttled_job_says_so_and_goes_on() {
    let kinesalite = Kinesalite::start().await;
    let proxy = Proxy::start(kinesalite.api.endpoint()).await;
    let app = app_behind(&proxy).await;
    watch(&app, &kinesalite.api, "orders", 2).await;
    proxy.set(Rules {
        hold: Some(1),
        ..Rules::default()
    });
    assert_eq!(start(&app, "orders", 4).await.status, 202);
    proxy.held().await;
    // Every attempt of the SDK at the next look's ListShards, and of the one after.
    proxy.throttle(8);
    proxy.release();

    let started = Instant::now();
    let throttled = loop {
        let job = app.get("/streams/orders/reshard").await.body;
        if job["error"]
            .as_str()
            .is_some_and(|e| e.contains("throttling"))
        {
            break job;
        }
        assert_eq!(job["state"], "running", "{job}");
        assert!(started.elapsed() < Duration::from_secs(60), "{job}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    // What the last look at the stream showed: the held call's answer came after it.
    assert_eq!(throttled["done"], 0, "{throttled}");
    let job = ended(&app.client, &app.url(""), "orders").await;
    assert_eq!(job["state"], "done", "{job}");
    assert_eq!(job["error"], Value::Null, "{job}");
    assert_eq!(job["done"], check_calls(&proxy.calls()), "{job}");
    assert_eq!(
        check_map(&app.client, &app.url(""), &kinesalite.api, "orders").await,
        4
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_whose_answer_is_lost_is_not_sent_again() {
    let kinesalite = Kinesalite::start().await;
    let proxy = Proxy::start(kinesalite.api.endpoint()).await;
    let app = app_behind(&proxy).await;
    watch(&app, &kinesalite.api, "orders", 2).await;
    // Made in Kinesis and answered 500: sent again, a SplitShard would split a closed shard
    // (which kinesalite allows) or be refused; the next look at the stream finds it made.
    proxy.set(Rules {
        lose: Some(1),
        ..Rules::default()
    });
    assert_eq!(start(&app, "orders", 4).await.status, 202);
    let job = ended(&app.client, &app.url(""), "orders").await;
    assert_eq!(job["state"], "done", "{job}");
    let calls = proxy.calls();
    let made = check_calls(&calls);
    let sent = (calls.iter())
        .filter(|c| matches!(c.action.as_str(), "SplitShard" | "MergeShards"))
        .count();
    assert_eq!(sent, made, "every call sent once: {calls:?}");
    assert_eq!(job["done"], made, "{job}");
    assert_eq!(
        check_map(&app.client, &app.url(""), &kinesalite.api, "orders").await,
        4
    );
}
