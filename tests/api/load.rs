//! Observed load: reports on heartbeats, counted only from the holder at that epoch,
//! smoothed with the configured half-life and read back by `GET /load` on any replica.

use std::time::Duration;

use reqwest::Method;
use serde_json::{Value, json};

use crate::helpers::{Answer, TestApp, assert_problem, spawn_app_with};

const TTL_S: i64 = 30;

/// Unix milliseconds of an RFC 3339 timestamp.
fn ms(text: &Value) -> i64 {
    use time::format_description::well_known::Rfc3339;
    let text = text.as_str().expect("a timestamp");
    let t = time::OffsetDateTime::parse(text, &Rfc3339).unwrap_or_else(|e| panic!("{text}: {e}"));
    (t.unix_timestamp_nanos() / 1_000_000) as i64
}

async fn app(half_life_s: u64) -> TestApp {
    spawn_app_with(|c| {
        c.load_half_life_s = half_life_s;
        c.lease_join_batch_ms = 0;
    })
    .await
}

async fn put_stream(app: &TestApp, stream: &str, shards: u64) {
    let put = app
        .call(
            Method::PUT,
            &format!("/streams/{stream}"),
            Some(json!({"shard_count": shards})),
        )
        .await;
    assert!(matches!(put.status, 200 | 201), "{}", put.body);
}

async fn beat(app: &TestApp, worker: &str, load: Value) -> Answer {
    app.call(
        Method::PUT,
        &format!("/streams/s/workers/{worker}"),
        Some(json!({"ttl_s": TTL_S, "load": load})),
    )
    .await
}

/// A heartbeat that must be answered 200: its body, and the database's clock it was
/// folded at (its `expires_at` less the ttl).
async fn beat_ok(app: &TestApp, worker: &str, load: Value) -> (Value, i64) {
    let answer = beat(app, worker, load).await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    let at = ms(&answer.body["expires_at"]) - TTL_S * 1000;
    (answer.body, at)
}

/// Shard id -> (state, epoch) of a heartbeat's leases.
fn leases(answer: &Value) -> Vec<(String, String, u64)> {
    answer["leases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| {
            let id = l["shard_id"].as_str().unwrap().to_owned();
            let state = l["state"].as_str().unwrap().to_owned();
            (id, state, l["epoch"].as_u64().unwrap())
        })
        .collect()
}

fn entry(
    shard: &str,
    epoch: u64,
    window_ms: u64,
    records: u64,
    bytes: u64,
    accounts: Value,
) -> Value {
    json!({"shard_id": shard, "epoch": epoch, "window_ms": window_ms, "records": records,
           "bytes": bytes, "accounts": accounts})
}

async fn load(app: &TestApp, query: &str) -> Value {
    let answer = app.get(&format!("/load?stream=s{query}")).await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    answer.body
}

fn shard<'a>(page: &'a Value, id: &str) -> &'a Value {
    page["shards"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["shard_id"] == id)
        .unwrap_or_else(|| panic!("no shard {id} in {page}"))
}

fn f(v: &Value) -> f64 {
    v.as_f64().unwrap_or_else(|| panic!("not a number: {v}"))
}

fn assert_close(got: f64, want: f64, what: &str) {
    assert!(
        (got - want).abs() <= 1e-6 * want.abs().max(1.0),
        "{what}: got {got}, want {want}"
    );
}

/// 2^(-elapsed / half-life).
fn decay(elapsed_ms: i64, half_life_ms: i64) -> f64 {
    (-(elapsed_ms.max(0) as f64) / half_life_ms as f64).exp2()
}

#[tokio::test]
async fn two_reports_smooth_as_the_formula_says_and_touch_only_their_shard() {
    let hl = 60_000;
    let app = app(60).await;
    put_stream(&app, "s", 2).await;
    let (joined, _) = beat_ok(&app, "w1", json!([])).await;
    let held = leases(&joined);
    assert_eq!(held.len(), 2, "{joined}");
    let (a, b) = (held[0].0.clone(), held[1].0.clone());
    let epoch = held[0].2;
    assert_eq!(joined["ignored_load"], json!([]));

    // Shard B first: A's report later must leave B's figures to decay alone.
    let (_, t_b) = beat_ok(
        &app,
        "w1",
        json!([entry(&b, held[1].2, 10_000, 3000, 30_000, json!([]))]),
    )
    .await;
    let b_rate = 300.0 * (1.0 - decay(10_000, hl));

    let accounts = json!([{"account": "hot", "records": 4000, "bytes": 400_000},
                          {"account": "cold", "records": 100, "bytes": 100}]);
    let (first, t1) = beat_ok(
        &app,
        "w1",
        json!([entry(&a, epoch, 10_000, 5000, 500_000, accounts)]),
    )
    .await;
    assert_eq!(first["ignored_load"], json!([]), "{first}");
    let accounts = json!([{"account": "hot", "records": 2000, "bytes": 200_000}]);
    let (_, t2) = beat_ok(
        &app,
        "w1",
        json!([entry(&a, epoch, 5_000, 2500, 250_000, accounts)]),
    )
    .await;

    let page = load(&app, "").await;
    let at = ms(&page["at"]);
    let first_rate = 500.0 * (1.0 - decay(10_000, hl));
    let second = first_rate * decay(t2 - t1, hl) + 500.0 * (1.0 - decay(5_000, hl));
    let now = second * decay(at - t2, hl);
    assert_close(f(&shard(&page, &a)["records_per_s"]), now, "A records/s");
    assert_close(
        f(&shard(&page, &a)["bytes_per_s"]),
        100.0 * now,
        "A bytes/s",
    );
    assert_close(
        f(&shard(&page, &a)["utilisation"]),
        now / 1000.0,
        "A utilisation",
    );
    assert_close(
        f(&shard(&page, &b)["records_per_s"]),
        b_rate * decay(at - t_b, hl),
        "B records/s",
    );
    let max_over_mean =
        now.max(b_rate * decay(at - t_b, hl)) * 2.0 / (now + b_rate * decay(at - t_b, hl));
    assert_close(f(&page["max_over_mean"]), max_over_mean, "max_over_mean");

    let hot = (400.0 * (1.0 - decay(10_000, hl)) * decay(t2 - t1, hl)
        + 400.0 * (1.0 - decay(5_000, hl)))
        * decay(at - t2, hl);
    let listed = page["accounts"].as_array().unwrap();
    assert_eq!(listed[0]["account"], "hot", "{page}");
    assert_close(f(&listed[0]["records_per_s"]), hot, "hot records/s");
    assert_close(f(&listed[0]["load"]), hot / 1000.0, "hot load");
    let cold = 10.0 * (1.0 - decay(10_000, hl)) * decay(at - t1, hl);
    assert_eq!(listed[1]["account"], "cold", "{page}");
    assert_close(f(&listed[1]["records_per_s"]), cold, "cold records/s");
    assert_eq!(listed[1]["fanout"], Value::Null, "an account without keys");
    assert_eq!(listed[1]["max_fanout"], Value::Null);
    assert_eq!(listed[1]["suggested_fanout"], Value::Null);
    assert_eq!(page["next"], Value::Null);
}

#[tokio::test]
async fn load_decays_with_the_database_clock() {
    let app = app(1).await;
    put_stream(&app, "s", 1).await;
    let (joined, _) = beat_ok(&app, "w1", json!([])).await;
    let (id, _, epoch) = leases(&joined).remove(0);
    let (_, t) = beat_ok(
        &app,
        "w1",
        json!([entry(&id, epoch, 1000, 800, 8000, json!([]))]),
    )
    .await;
    let first = load(&app, "").await;
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let second = load(&app, "").await;
    let (at1, at2) = (ms(&first["at"]), ms(&second["at"]));
    assert!(at2 - at1 >= 1000, "{at1} {at2}");
    let reported = 800.0 * 0.5;
    for (page, at) in [(&first, at1), (&second, at2)] {
        let want = reported * decay(at - t, 1000);
        assert_close(
            f(&shard(page, &id)["records_per_s"]),
            want,
            "decayed records/s",
        );
    }
    assert!(f(&shard(&second, &id)["records_per_s"]) < reported / 2.0 + 1e-9);
}

#[tokio::test]
async fn entries_count_only_from_the_holder_at_that_epoch() {
    let app = app(60).await;
    put_stream(&app, "s", 2).await;
    let (joined, _) = beat_ok(&app, "w1", json!([])).await;
    assert_eq!(leases(&joined).len(), 2);
    // A second worker takes one of w1's shards: w1 is told it is revoking.
    beat_ok(&app, "w2", json!([])).await;
    let (told, _) = beat_ok(&app, "w1", json!([])).await;
    let (moving, _, old_epoch) = leases(&told)
        .into_iter()
        .find(|(_, state, _)| state == "revoking")
        .unwrap_or_else(|| panic!("nothing revoking: {told}"));
    let (kept, _, kept_epoch) = leases(&told)
        .into_iter()
        .find(|(_, state, _)| state == "held")
        .unwrap();
    let (answer, _) = beat_ok(
        &app,
        "w1",
        json!([
            entry(&moving, old_epoch, 1000, 100, 100, json!([])),
            entry(&kept, kept_epoch, 1000, 100, 100, json!([]))
        ]),
    )
    .await;
    assert_eq!(
        answer["ignored_load"],
        json!([{"shard_id": moving, "epoch": old_epoch, "reason": "revoking"}]),
        "{answer}"
    );
    // The hand-over is done: w2 holds it at the next epoch.
    let (w2, _) = beat_ok(&app, "w2", json!([])).await;
    let (_, _, new_epoch) = leases(&w2)
        .into_iter()
        .find(|(id, ..)| *id == moving)
        .unwrap();
    assert_eq!(new_epoch, old_epoch + 1, "{w2}");
    let (answer, _) = beat_ok(
        &app,
        "w1",
        json!([entry(&moving, old_epoch, 1000, 100, 100, json!([]))]),
    )
    .await;
    assert_eq!(
        answer["ignored_load"],
        json!([{"shard_id": moving, "epoch": old_epoch, "reason": "not_held"}])
    );
    let (answer, _) = beat_ok(
        &app,
        "w2",
        json!([entry(&moving, old_epoch, 1000, 100, 100, json!([]))]),
    )
    .await;
    assert_eq!(
        answer["ignored_load"],
        json!([{"shard_id": moving, "epoch": old_epoch, "reason": "stale_epoch"}])
    );
    let page = load(&app, "").await;
    assert_eq!(f(&shard(&page, &moving)["records_per_s"]), 0.0, "{page}");
    assert!(f(&shard(&page, &kept)["records_per_s"]) > 0.0, "{page}");
}

#[tokio::test]
async fn invalid_entries_are_refused_naming_the_field_and_nothing_is_written() {
    let app = app(60).await;
    put_stream(&app, "s", 2).await;
    let (joined, _) = beat_ok(&app, "w1", json!([])).await;
    let (id, _, epoch) = leases(&joined).remove(0);
    let good = entry(&id, epoch, 1000, 10, 10, json!([]));
    let many = |n: usize| {
        let accounts: Vec<Value> = (0..n)
            .map(|i| json!({"account": format!("account-{i}"), "records": 1, "bytes": 1}))
            .collect();
        entry(&id, epoch, 1000, n as u64, n as u64, json!(accounts))
    };
    let mut negative = good.clone();
    negative["records"] = json!(-1);
    let mut negative_account = many(1);
    negative_account["accounts"][0]["bytes"] = json!(-5);
    let cases = [
        (json!([good.clone(), negative]), "load[1].records"),
        (json!([negative_account]), "load[0].accounts[0].bytes"),
        (
            json!([entry(&id, epoch, 0, 1, 1, json!([]))]),
            "load[0].window_ms must be between 1 and 3600000",
        ),
        (
            json!([
                good.clone(),
                good.clone(),
                entry(&id, epoch, 3_600_001, 1, 1, json!([]))
            ]),
            "load[2].window_ms",
        ),
        (
            json!([good.clone(), many(1001)]),
            "load[1].accounts may name at most 1000 accounts",
        ),
        (
            json!([good.clone(), entry("shardId-999", 1, 1000, 1, 1, json!([]))]),
            "load[1].shard_id: stream \"s\" lists no shard \"shardId-999\"",
        ),
        (
            json!([entry(
                &id,
                epoch,
                1000,
                1,
                1,
                json!([{"account": "", "records": 1, "bytes": 1}])
            )]),
            "load[0].accounts[0].account",
        ),
    ];
    for (load, needle) in cases {
        assert_problem(&beat(&app, "w1", load.clone()).await, 422, needle);
        // Nor does a refused heartbeat join a worker.
        assert_problem(&beat(&app, "newcomer", load).await, 422, needle);
    }
    let group = app.get("/streams/s/leases").await;
    assert_eq!(
        group.body["workers"].as_array().unwrap().len(),
        1,
        "{}",
        group.body
    );
    let page = load(&app, "").await;
    for s in page["shards"].as_array().unwrap() {
        assert_eq!(f(&s["records_per_s"]), 0.0, "{page}");
    }
    assert_eq!(page["accounts"], json!([]));

    let (answer, _) = beat_ok(&app, "w1", json!([many(1000)])).await;
    assert_eq!(answer["ignored_load"], json!([]));
    let page = load(&app, "&limit=1000").await;
    assert_eq!(page["accounts"].as_array().unwrap().len(), 1000);
}
