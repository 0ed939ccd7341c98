//! Leases weighed by observed load: once workers report what they read, shards weigh their
//! utilisation, and leases move only when the busiest worker leaves the band
//! `max((1 + tolerance) × mean, mean + heaviest shard)`, or when a worker below
//! `(1 - tolerance) × mean` can take a whole lease from one above `(1 + tolerance) × mean`.

use std::collections::BTreeMap;
use std::time::Duration;

use reqwest::Method;
use serde_json::{Value, json};

use crate::helpers::{TestApp, spawn_app_with};

/// The tolerance leases keep by default (the controller's `--load-tolerance`).
const TOLERANCE: f64 = 0.10;
/// A report's window: an hour, many half-lives, so one report sets a shard's rate.
const WINDOW_MS: u64 = 3_600_000;

/// `PUT /streams/s/workers/{worker}`, reporting `load`, asserting 200 and nothing ignored.
async fn heartbeat(app: &TestApp, worker: &str, load: Vec<Value>) -> Value {
    let path = format!("/streams/s/workers/{worker}");
    let body = json!({"ttl_s": 600, "load": load});
    let answer = app.call(Method::PUT, &path, Some(body)).await;
    assert_eq!(answer.status, 200, "{worker}: {}", answer.body);
    assert_eq!(
        answer.body["ignored_load"],
        json!([]),
        "{worker}: {}",
        answer.body
    );
    answer.body
}

/// A load entry that adds `utilisation` (of the default 1,000 records/s) to a shard.
fn report(lease: &Value, utilisation: f64) -> Value {
    let records = (utilisation * 1000.0 * (WINDOW_MS / 1000) as f64).round() as u64;
    json!({"shard_id": lease["shard_id"], "epoch": lease["epoch"], "window_ms": WINDOW_MS,
           "records": records, "bytes": records * 100})
}

async fn group(app: &TestApp) -> Value {
    let answer = app.get("/streams/s/leases").await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    answer.body
}

/// Shard -> owner, asserting that no lease is on its way anywhere.
fn settled_owners(group: &Value) -> BTreeMap<String, String> {
    (group["shards"].as_array().unwrap().iter())
        .map(|s| {
            assert_eq!(s["state"], "held", "{group}");
            let id = s["shard_id"].as_str().unwrap().to_owned();
            (id, s["owner"].as_str().unwrap().to_owned())
        })
        .collect()
}

fn moved(before: &BTreeMap<String, String>, after: &BTreeMap<String, String>) -> Vec<String> {
    (after.iter())
        .filter(|(id, owner)| before[*id] != **owner)
        .map(|(id, _)| id.clone())
        .collect()
}

/// The band over `GET /leases`' own figures: `max((1 + tol) × mean, mean + heaviest)`.
fn band(group: &Value) -> f64 {
    let used: Vec<f64> = (group["shards"].as_array().unwrap().iter())
        .map(|s| s["utilisation"].as_f64().unwrap())
        .collect();
    let workers = group["workers"].as_array().unwrap().len() as f64;
    let mean = used.iter().sum::<f64>() / workers;
    let heaviest = used.iter().copied().fold(0.0, f64::max);
    ((1.0 + TOLERANCE) * mean).max(mean + heaviest)
}

fn worker_use(group: &Value) -> BTreeMap<String, f64> {
    (group["workers"].as_array().unwrap().iter())
        .map(|w| {
            let id = w["worker"].as_str().unwrap().to_owned();
            (id, w["utilisation"].as_f64().unwrap())
        })
        .collect()
}

#[tokio::test]
async fn a_hot_worker_gives_up_the_fewest_leases_and_inside_the_band_nothing_moves() {
    let app = spawn_app_with(|c| c.lease_join_batch_ms = 0).await;
    let put = app
        .call(Method::PUT, "/streams/s", Some(json!({"shard_count": 8})))
        .await;
    assert!(matches!(put.status, 200 | 201), "{}", put.body);
    let workers = ["w0", "w1", "w2", "w3"];
    let mut answers = BTreeMap::new();
    for _ in 0..3 {
        for w in workers {
            answers.insert(w, heartbeat(&app, w, vec![]).await);
        }
    }
    let balanced = settled_owners(&group(&app).await);
    for w in workers {
        let held = balanced.values().filter(|o| *o == w).count();
        assert_eq!(held, 2, "8 shards over 4 workers: {balanced:?}");
    }
    // Every shard reads at 5 % of its limit; then w0's two shards turn hot (+100 %, +75 %).
    for w in workers {
        let leases = answers[w]["leases"].as_array().unwrap();
        let load = leases.iter().map(|l| report(l, 0.05)).collect();
        heartbeat(&app, w, load).await;
    }
    let w0 = answers["w0"]["leases"].as_array().unwrap();
    let (hot, warm) = (&w0[0], &w0[1]);
    heartbeat(&app, "w0", vec![report(hot, 1.0), report(warm, 0.75)]).await;
    let reported = group(&app).await;
    assert_eq!(
        settled_owners(&reported),
        balanced,
        "no lease moves at once"
    );
    let top = band(&reported);
    let w0_use = worker_use(&reported)["w0"];
    assert!(
        w0_use > top,
        "w0 at {w0_use} is above the band {top}: {reported}"
    );
    let hot_use = reported["shards"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["shard_id"] == hot["shard_id"])
        .unwrap()["utilisation"]
        .as_f64()
        .unwrap();
    assert!((1.0..1.1).contains(&hot_use), "{reported}");

    // Loads are checked at most every WEIGHT_RECHECK_MS (5 s) after an assignment. w0 is
    // told to give a lease up, and gives it up at its next heartbeat.
    tokio::time::sleep(Duration::from_millis(5_100)).await;
    for w in ["w0", "w0", "w1", "w2", "w3"] {
        heartbeat(&app, w, vec![]).await;
    }
    let after = group(&app).await;
    let owners = settled_owners(&after);
    assert_eq!(
        moved(&balanced, &owners),
        [hot["shard_id"].as_str().unwrap()],
        "only the hottest shard moved: {after}"
    );
    let top = band(&after);
    for (worker, used) in worker_use(&after) {
        assert!(
            used <= top,
            "{worker} at {used} is above the band {top}: {after}"
        );
    }

    // Heartbeats inside the band move nothing, checks of the load included.
    tokio::time::sleep(Duration::from_millis(5_100)).await;
    for _ in 0..2 {
        for w in workers {
            heartbeat(&app, w, vec![]).await;
        }
    }
    let later = group(&app).await;
    assert_eq!(settled_owners(&later), owners, "{later}");
}

/// A server with the 8-shard stream `s`, all of it leased to `w0`: its leases.
async fn eight_shards_held_by_w0() -> (TestApp, Vec<Value>) {
    let app = spawn_app_with(|c| c.lease_join_batch_ms = 0).await;
    let put = app
        .call(Method::PUT, "/streams/s", Some(json!({"shard_count": 8})))
        .await;
    assert!(matches!(put.status, 200 | 201), "{}", put.body);
    let joined = heartbeat(&app, "w0", vec![]).await;
    let leases = joined["leases"].as_array().unwrap().clone();
    assert_eq!(leases.len(), 8, "{joined}");
    (app, leases)
}

/// `w1` joins beside `w0`; both heartbeat until the hand-overs settle. Asserts each holds
/// four of the eight shards; answers who owns which.
async fn w1_joins_and_gets_half(app: &TestApp) -> BTreeMap<String, String> {
    for _ in 0..3 {
        for w in ["w0", "w1"] {
            heartbeat(app, w, vec![]).await;
        }
    }
    let owners = settled_owners(&group(app).await);
    for w in ["w0", "w1"] {
        let held = owners.values().filter(|o| *o == w).count();
        assert_eq!(held, 4, "8 shards over 2 workers: {owners:?}");
    }
    owners
}

/// Workers that report reading nothing (a fleet up before its producers) weigh nothing:
/// every assignment would be inside the band, so a worker that joins would get a single
/// lease and keep it. Until some load is seen, shards weigh the same: a joining worker
/// gets its share, lease counts differing by at most one.
#[tokio::test]
async fn a_worker_joining_a_group_that_reads_nothing_yet_gets_its_share() {
    let (app, leases) = eight_shards_held_by_w0().await;
    heartbeat(&app, "w0", leases.iter().map(|l| report(l, 0.0)).collect()).await;
    w1_joins_and_gets_half(&app).await;
}

/// Until every shard has been reported, the picture is partial: a shard not reported yet
/// would weigh nothing, and the workers that read it would be handed more while the
/// reported ones looked busy. Until then shards weigh the same, lease counts differing by
/// at most one; once every shard reports alike, nothing moves.
#[tokio::test]
async fn until_every_shard_is_reported_leases_are_spread_by_count() {
    let (app, leases) = eight_shards_held_by_w0().await;
    // Half the shards report half a shard's worth each; the others have not reported.
    let first: Vec<Value> = leases.iter().take(4).map(|l| report(l, 0.5)).collect();
    heartbeat(&app, "w0", first).await;
    let owners = w1_joins_and_gets_half(&app).await;
    // Every shard reports the same: inside the band, nothing moves.
    for w in ["w0", "w1"] {
        let beat = heartbeat(&app, w, vec![]).await;
        let load = (beat["leases"].as_array().unwrap().iter())
            .map(|l| report(l, 0.5))
            .collect();
        heartbeat(&app, w, load).await;
    }
    let after = group(&app).await;
    assert_eq!(settled_owners(&after), owners, "{after}");
}

/// Workers that join while every shard reads alike each get their share, two of eight over
/// four, not the single lease the band's upper edge would leave a joiner (three, two, two
/// and one is inside `mean + heaviest`: 1.5 × the mean), and heartbeats then move nothing.
#[tokio::test]
async fn workers_joining_shards_that_read_alike_get_their_share() {
    let (app, leases) = eight_shards_held_by_w0().await;
    heartbeat(&app, "w0", leases.iter().map(|l| report(l, 0.5)).collect()).await;
    w1_joins_and_gets_half(&app).await;
    let workers = ["w0", "w1", "w2", "w3"];
    for _ in 0..3 {
        for w in workers {
            heartbeat(&app, w, vec![]).await;
        }
    }
    let joined = group(&app).await;
    let owners = settled_owners(&joined);
    for w in workers {
        let held = owners.values().filter(|o| *o == w).count();
        assert_eq!(held, 2, "8 shards over 4 workers: {owners:?}");
    }
    let used = worker_use(&joined);
    let mean = used.values().sum::<f64>() / used.len() as f64;
    let busiest = used.values().copied().fold(0.0, f64::max);
    assert!(busiest <= (1.0 + TOLERANCE) * mean, "{joined}");
    // Inside both edges, heartbeats and checks of the load move nothing.
    tokio::time::sleep(Duration::from_millis(5_100)).await;
    for _ in 0..2 {
        for w in workers {
            heartbeat(&app, w, vec![]).await;
        }
    }
    assert_eq!(settled_owners(&group(&app).await), owners);
}
