//! Observed load: reports on heartbeats, counted only from the holder at that epoch,
//! smoothed with the configured half-life and read back by `GET /load` on any replica.

use std::time::Duration;

use reqwest::Method;
use serde_json::{Value, json};

use crate::helpers::{Answer, TestApp, assert_problem, fresh_database, spawn_app_with};

const TTL_S: i64 = 30;

/// Unix milliseconds of an RFC 3339 timestamp.
pub(crate) fn ms(text: &Value) -> i64 {
    use time::format_description::well_known::Rfc3339;
    let text = text.as_str().expect("a timestamp");
    let t = time::OffsetDateTime::parse(text, &Rfc3339).unwrap_or_else(|e| panic!("{text}: {e}"));
    (t.unix_timestamp_nanos() / 1_000_000) as i64
}

pub(crate) async fn app(half_life_s: u64) -> TestApp {
    spawn_app_with(|c| {
        c.load_half_life_s = half_life_s;
        c.lease_join_batch_ms = 0;
    })
    .await
}

pub(crate) async fn put_stream(app: &TestApp, stream: &str, shards: u64) {
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
pub(crate) async fn beat_ok(app: &TestApp, worker: &str, load: Value) -> (Value, i64) {
    let answer = beat(app, worker, load).await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    let at = ms(&answer.body["expires_at"]) - TTL_S * 1000;
    (answer.body, at)
}

/// An app with the given half-life and stream `s` of `shards` shards, held whole by `w1`,
/// which has reported nothing yet: its leases, as [`leases`] reads them.
async fn joined(half_life_s: u64, shards: u64) -> (TestApp, Vec<(String, String, u64)>) {
    let app = app(half_life_s).await;
    put_stream(&app, "s", shards).await;
    let (joined, _) = beat_ok(&app, "w1", json!([])).await;
    let held = leases(&joined);
    assert_eq!(held.len(), shards as usize, "{joined}");
    (app, held)
}

/// Shard id -> (state, epoch) of a heartbeat's leases.
pub(crate) fn leases(answer: &Value) -> Vec<(String, String, u64)> {
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

pub(crate) fn entry(
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

pub(crate) async fn load(app: &TestApp, query: &str) -> Value {
    let answer = app.get(&format!("/load?stream=s{query}")).await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    answer.body
}

pub(crate) fn shard<'a>(page: &'a Value, id: &str) -> &'a Value {
    page["shards"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["shard_id"] == id)
        .unwrap_or_else(|| panic!("no shard {id} in {page}"))
}

pub(crate) fn f(v: &Value) -> f64 {
    v.as_f64().unwrap_or_else(|| panic!("not a number: {v}"))
}

pub(crate) fn assert_close(got: f64, want: f64, what: &str) {
    assert!(
        (got - want).abs() <= 1e-6 * want.abs().max(1.0),
        "{what}: got {got}, want {want}"
    );
}

/// 2^(-elapsed / half-life).
pub(crate) fn decay(elapsed_ms: i64, half_life_ms: i64) -> f64 {
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

    // Shard B first: A's reports later must leave B's figures alone; within B's 10-s
    // window B reads as of the newest report, like A.
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

    assert!(t2 - t_b < 10_000, "B's window covers A's reports");
    let page = load(&app, "&order=load").await;
    let at = ms(&page["at"]);
    let first_rate = 500.0 * (1.0 - decay(10_000, hl));
    let second = first_rate * decay(t2 - t1, hl) + 500.0 * (1.0 - decay(5_000, hl));
    // Every shard reads as of the stream's newest report (t2: B's 10-s window covers it)
    // and decays from there.
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
        b_rate * decay(at - t2, hl),
        "B records/s",
    );
    let b_now = b_rate * decay(at - t2, hl);
    let max_over_mean = now.max(b_now) * 2.0 / (now + b_now);
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
    let (app, mut held) = joined(1, 1).await;
    let (id, _, epoch) = held.remove(0);
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

/// Two shards read at the same steady rate weigh the same whenever their reports came:
/// a report is current until the next is due, so the phase of the heartbeats moves nothing.
#[tokio::test]
async fn shards_at_one_rate_weigh_the_same_whatever_the_phase_of_their_reports() {
    let app = app(1).await;
    put_stream(&app, "s", 2).await;
    let (joined, _) = beat_ok(&app, "w1", json!([])).await;
    let held = leases(&joined);
    assert_eq!(held.len(), 2, "{joined}");
    let report = |(id, _, epoch): &(String, String, u64)| {
        json!([entry(
            id,
            *epoch,
            2000,
            400,
            4000,
            json!([{"account": id, "records": 400, "bytes": 4000}])
        )])
    };
    beat_ok(&app, "w1", report(&held[0])).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    beat_ok(&app, "w1", report(&held[1])).await;
    let page = load(&app, "").await;
    let (a, b) = (shard(&page, &held[0].0), shard(&page, &held[1].0));
    assert_close(f(&a["records_per_s"]), f(&b["records_per_s"]), "records/s");
    assert_close(f(&page["max_over_mean"]), 1.0, "max_over_mean");
    let accounts = page["accounts"].as_array().unwrap();
    assert_eq!(accounts.len(), 2, "{page}");
    assert_close(
        f(&accounts[0]["load"]),
        f(&accounts[1]["load"]),
        "account load",
    );
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
    let (app, mut held) = joined(60, 2).await;
    let (id, _, epoch) = held.remove(0);
    let good = entry(&id, epoch, 1000, 10, 10, json!([]));
    let many = |n: usize| {
        let accounts: Vec<Value> = (0..n)
            // Long ids: 1,000 of them make a body of 250 KB.
            .map(|i| json!({"account": format!("account-{i:0>200}"), "records": 1, "bytes": 1}))
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

#[tokio::test]
async fn accounts_come_by_account_in_pages_or_heaviest_first_with_their_suggested_fanout() {
    let app = spawn_app_with(|c| {
        c.shard_records_per_s = 100.0;
        c.lease_join_batch_ms = 0;
    })
    .await;
    put_stream(&app, "s", 1).await;
    app.allocate("a9").await;
    let (joined, _) = beat_ok(&app, "w1", json!([])).await;
    let (id, _, epoch) = leases(&joined).remove(0);
    // Ten accounts, two pairs of them tied.
    let records = [5, 40, 40, 300, 1000, 4000, 9000, 9000, 20_000, 100_000];
    let accounts: Vec<Value> = records
        .iter()
        .enumerate()
        .map(|(i, r)| json!({"account": format!("a{i}"), "records": r, "bytes": r}))
        .collect();
    beat_ok(
        &app,
        "w1",
        json!([entry(&id, epoch, 1000, 200_000, 200_000, json!(accounts))]),
    )
    .await;
    let whole = load(&app, "&order=load&limit=1000").await;
    let all: Vec<Value> = whole["accounts"].as_array().unwrap().clone();
    assert_eq!(all.len(), 10);
    assert_eq!(whole["next"], Value::Null, "{whole}");
    let names: Vec<&str> = all.iter().map(|a| a["account"].as_str().unwrap()).collect();
    assert_eq!(
        names,
        ["a9", "a8", "a6", "a7", "a5", "a4", "a3", "a1", "a2", "a0"],
        "heaviest first, ties by account"
    );
    for a in &all {
        let load = f(&a["load"]);
        assert_close(
            load,
            f(&a["records_per_s"]) / 100.0,
            "load over the records limit",
        );
        let suggested = (load / 0.5).ceil();
        if suggested > 1.0 {
            assert_eq!(a["suggested_fanout"], json!(suggested as u64), "{a}");
        } else {
            assert_eq!(a["suggested_fanout"], Value::Null, "{a}");
        }
    }
    assert!(
        all[0]["suggested_fanout"].as_u64().unwrap() > 1,
        "{}",
        all[0]
    );
    assert_eq!(all[0]["fanout"], json!(1), "a9 holds one key");
    assert_eq!(all[0]["max_fanout"], Value::Null, "a9 has not opted in");
    assert_eq!(all[1]["fanout"], Value::Null, "a8 holds none");
    // An account that opted in to a load-raised fanout says how far.
    let opted = app
        .call(
            reqwest::Method::PATCH,
            "/keys/a9",
            Some(json!({"max_fanout": 8})),
        )
        .await;
    assert_eq!(opted.status, 200, "{}", opted.body);
    let whole = load(&app, "&order=load&limit=1").await;
    assert_eq!(
        whole["next"],
        Value::Null,
        "the heaviest come in one page: {whole}"
    );
    assert_eq!(whole["accounts"][0]["account"], "a9");
    assert_eq!(whole["accounts"][0]["max_fanout"], 8, "{whole}");

    let mut paged = Vec::new();
    let mut query = "&limit=3".to_owned();
    for _ in 0..10 {
        let page = load(&app, &query).await;
        let items = page["accounts"].as_array().unwrap();
        assert!(items.len() <= 3);
        paged.extend(
            items
                .iter()
                .map(|a| a["account"].as_str().unwrap().to_owned()),
        );
        match page["next"].as_str() {
            Some(next) => query = format!("&limit=3&after={next}"),
            None => break,
        }
    }
    let mut by_account = names.clone();
    by_account.sort();
    assert_eq!(
        paged, by_account,
        "pages by account, none twice, none missed"
    );
    assert_problem(
        &app.get("/load?stream=s&after=nonsense").await,
        400,
        "after",
    );
    let next = load(&app, "&limit=3").await["next"].clone();
    assert_problem(
        &app.get(&format!(
            "/load?stream=s&order=load&after={}",
            next.as_str().unwrap()
        ))
        .await,
        400,
        "order=account",
    );
    assert_problem(
        &app.get("/load?stream=s&order=weight").await,
        400,
        "order must be",
    );
    assert_problem(&app.get("/load?stream=s&limit=0").await, 400, "limit");
    assert_problem(&app.get("/load?stream=nope").await, 404, "nope");
    assert_problem(&app.get("/load?stream=no%20such").await, 400, "stream name");
}

/// Two open shards, A and B, or one, C, over the whole keyspace.
fn listed(ids: &[&str]) -> Value {
    let half = "170141183460469231731687303715884105727";
    let half1 = "170141183460469231731687303715884105728";
    let max = "340282366920938463463374607431768211455";
    let open = json!({"StartingSequenceNumber": "1"});
    let ranges: Vec<(&str, &str)> = if ids.len() == 2 {
        vec![("0", half), (half1, max)]
    } else {
        vec![("0", max)]
    };
    let shards: Vec<Value> = ids
        .iter()
        .zip(ranges)
        .map(|(id, (lo, hi))| {
            json!({"ShardId": id, "HashKeyRange": {"StartingHashKey": lo, "EndingHashKey": hi},
                   "SequenceNumberRange": open})
        })
        .collect();
    json!({ "Shards": shards })
}

pub(crate) async fn put_listed(app: &TestApp, ids: &[&str]) {
    let put = app.call(Method::PUT, "/streams/s", Some(listed(ids))).await;
    assert!(matches!(put.status, 200 | 201), "{}", put.body);
}

/// Reports on every shard `worker` holds (or held, if the map dropped it), with account
/// `acct-SHARD` on each; answers `GET /load` after.
async fn report_all(app: &TestApp, worker: &str, dropped: &[&str]) -> Value {
    let (answer, _) = beat_ok(app, worker, json!([])).await;
    let entries: Vec<Value> = leases(&answer)
        .into_iter()
        .map(|(id, _, epoch)| {
            let accounts = json!([{"account": format!("acct-{id}"), "records": 50, "bytes": 50}]);
            entry(&id, epoch, 1000, 100, 100, accounts)
        })
        .collect();
    let (answer, _) = beat_ok(app, worker, json!(entries)).await;
    let ignored: Vec<(&str, &str)> = answer["ignored_load"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| {
            (
                i["shard_id"].as_str().unwrap(),
                i["reason"].as_str().unwrap(),
            )
        })
        .collect();
    let want: Vec<(&str, &str)> = dropped.iter().map(|id| (*id, "not_listed")).collect();
    assert_eq!(ignored, want, "{answer}");
    load(app, "").await
}

#[tokio::test]
async fn load_of_dropped_shards_and_deleted_streams_is_forgotten() {
    let app = app(60).await;
    let (a, b, c) = ("shardId-a", "shardId-b", "shardId-c");
    put_listed(&app, &[a, b]).await;
    let page = report_all(&app, "w1", &[]).await;
    assert!(f(&shard(&page, a)["records_per_s"]) > 0.0, "{page}");
    assert_eq!(page["accounts"].as_array().unwrap().len(), 2, "{page}");
    // A map without A and B: a report on C clears their rows, so listing them again
    // shows no load.
    put_listed(&app, &[c]).await;
    let page = report_all(&app, "w1", &[a, b]).await;
    let ids: Vec<&str> = page["shards"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["shard_id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, [c], "{page}");
    assert_eq!(page["accounts"].as_array().unwrap().len(), 1, "{page}");
    put_listed(&app, &[a, b]).await;
    let page = load(&app, "").await;
    for id in [a, b] {
        assert_eq!(f(&shard(&page, id)["records_per_s"]), 0.0, "{page}");
    }
    assert_eq!(page["accounts"], json!([]), "{page}");
    // A deleted stream's load goes with it.
    let page = report_all(&app, "w1", &[c]).await;
    assert!(f(&shard(&page, a)["records_per_s"]) > 0.0, "{page}");
    let deleted = app.delete("/streams/s").await;
    assert_eq!(deleted.status, 204, "{}", deleted.body);
    put_listed(&app, &[a, b]).await;
    let page = load(&app, "").await;
    for id in [a, b] {
        assert_eq!(f(&shard(&page, id)["records_per_s"]), 0.0, "{page}");
    }
    assert_eq!(page["accounts"], json!([]), "{page}");
}

#[tokio::test]
async fn every_replica_answers_the_same_load() {
    let dir = tempfile::tempdir().unwrap();
    let (url, _db) = fresh_database(dir.path()).await;
    let env: &[(&str, &str)] = &[
        ("KEYSPREAD_LOAD_HALF_LIFE_S", "30"),
        ("KEYSPREAD_SHARD_RECORDS_PER_S", "100"),
        ("KEYSPREAD_LEASE_JOIN_BATCH_MS", "0"),
    ];
    let (_servers, api) = crate::replicas::start_with(&url, dir.path(), &[env, env]).await;
    let (status, body) = api
        .call(
            0,
            Method::PUT,
            "/streams/s",
            Some(json!({"shard_count": 2})),
        )
        .await;
    assert_eq!(status, 201, "{body}");
    let (status, joined) = api
        .call(0, Method::PUT, "/streams/s/workers/w1", None)
        .await;
    assert_eq!(status, 200, "{joined}");
    // The report goes through the other replica, once it has followed the stream.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while api.call(1, Method::GET, "/streams/s", None).await.0 != 200 {
        assert!(
            std::time::Instant::now() < deadline,
            "replica 1 never saw the stream"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let entries: Vec<Value> = leases(&joined)
        .into_iter()
        .enumerate()
        .map(|(i, (id, _, epoch))| {
            let n = 1000 * (i as u64 + 1);
            entry(
                &id,
                epoch,
                2000,
                n,
                10 * n,
                json!([{"account": format!("a{i}"), "records": n, "bytes": n}]),
            )
        })
        .collect();
    let (status, answer) = api
        .call(
            1,
            Method::PUT,
            "/streams/s/workers/w1",
            Some(json!({"load": entries})),
        )
        .await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["ignored_load"], json!([]), "{answer}");
    let (s0, first) = api.call(0, Method::GET, "/load?stream=s", None).await;
    let (s1, second) = api.call(1, Method::GET, "/load?stream=s", None).await;
    assert_eq!((s0, s1), (200, 200), "{first} {second}");
    let elapsed = ms(&second["at"]) - ms(&first["at"]);
    let factor = decay(elapsed, 30_000);
    for (x, y) in first["shards"]
        .as_array()
        .unwrap()
        .iter()
        .zip(second["shards"].as_array().unwrap())
    {
        assert_eq!(x["shard_id"], y["shard_id"]);
        assert!(f(&x["records_per_s"]) > 0.0, "{first}");
        assert_close(
            f(&y["records_per_s"]),
            f(&x["records_per_s"]) * factor,
            "records/s",
        );
        assert_close(
            f(&y["utilisation"]),
            f(&y["records_per_s"]) / 100.0,
            "utilisation",
        );
    }
    let (xs, ys) = (
        first["accounts"].as_array().unwrap(),
        second["accounts"].as_array().unwrap(),
    );
    assert_eq!(xs.len(), 2);
    for (x, y) in xs.iter().zip(ys) {
        assert_eq!(x["account"], y["account"]);
        assert_close(f(&y["load"]), f(&x["load"]) * factor, "account load");
    }
}

#[tokio::test]
async fn accounts_whose_rate_faded_are_forgotten_at_the_next_report() {
    let (app, mut held) = joined(1, 1).await;
    let (id, _, epoch) = held.remove(0);
    // 8 records in an hour: 0.0022/s, under the floor (0.001/s) after 1.15 half-lives;
    // one below it from the start is not even kept.
    let accounts = json!([{"account": "faint", "records": 8, "bytes": 8},
                          {"account": "below", "records": 1, "bytes": 1},
                          {"account": "busy", "records": 3_600_000, "bytes": 1}]);
    let hour = 3_600_000;
    let (_, t) = beat_ok(
        &app,
        "w1",
        json!([entry(&id, epoch, hour, hour, hour, accounts)]),
    )
    .await;
    let names = |page: &Value| -> Vec<String> {
        let accounts = page["accounts"].as_array().unwrap();
        accounts
            .iter()
            .map(|a| a["account"].as_str().unwrap().to_owned())
            .collect()
    };
    assert_eq!(names(&load(&app, "").await), ["busy", "faint"]);
    tokio::time::sleep(Duration::from_millis(1300)).await;
    assert_eq!(
        names(&load(&app, "").await),
        ["busy", "faint"],
        "until a report"
    );
    beat_ok(
        &app,
        "w1",
        json!([entry(&id, epoch, 1000, 1, 1, json!([]))]),
    )
    .await;
    let page = load(&app, "").await;
    assert_eq!(names(&page), ["busy"]);
    // Its row was brought to a newer instant on the way (a half-life passed): same rate.
    let busy = 1000.0 * decay(ms(&page["at"]) - t, 1000);
    assert_close(
        f(&page["accounts"][0]["records_per_s"]),
        busy,
        "busy records/s",
    );
}

#[tokio::test]
async fn accounts_are_stored_by_their_exact_text_and_add_up_across_reports() {
    let (app, mut held) = joined(3600, 1).await;
    let (id, _, epoch) = held.remove(0);
    // Multi-byte, quoted, longest (256 bytes) and look-alike names: each its own row.
    let long = "é".repeat(128);
    let names = ["zoë", "zoe", "o'brien \"q\"", "表-😀", long.as_str()];
    let accounts: Vec<Value> = names
        .iter()
        .enumerate()
        .map(|(i, a)| json!({"account": a, "records": 1000 * (i as u64 + 1), "bytes": 1}))
        .collect();
    let report = json!([entry(&id, epoch, 1000, 100_000, 100, json!(accounts))]);
    beat_ok(&app, "w1", report.clone()).await;
    beat_ok(&app, "w1", report).await;
    let page = load(&app, "&limit=1000").await;
    let stored: Vec<(String, f64)> = page["accounts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| {
            let name = a["account"].as_str().unwrap().to_owned();
            (name, f(&a["records_per_s"]))
        })
        .collect();
    assert_eq!(stored.len(), names.len(), "{page}");
    // Two reports of a one-second window with an hour's half-life: about twice one's share.
    let one = f(&shard(&page, &id)["records_per_s"]) / 100_000.0;
    for (i, name) in names.iter().enumerate() {
        let (_, rate) = stored
            .iter()
            .find(|(a, _)| a == name)
            .unwrap_or_else(|| panic!("no account {name:?} in {page}"));
        assert_close(*rate, one * 1000.0 * (i as f64 + 1.0), name);
    }
}

/// Rates a keyspread from before packing stored one row per account are read as they
/// were, and carried into the shard's packed row at its next report, counted once.
#[tokio::test]
async fn account_rows_stored_one_per_account_are_read_and_carried_into_the_next_report() {
    let hl = 3_600_000;
    let app = app(hl as u64 / 1000).await;
    put_stream(&app, "s", 1).await;
    let (joined, _) = beat_ok(&app, "w1", json!([])).await;
    let (id, _, epoch) = leases(&joined).remove(0);
    let (_, t) = beat_ok(
        &app,
        "w1",
        json!([entry(&id, epoch, 1000, 0, 0, json!([]))]),
    )
    .await;
    // The shard as an older keyspread left it: its accounts in rows of their own.
    let mut db = app.db().await;
    let unpack = format!("UPDATE shard_load SET accounts = NULL, accounts_at = {t}");
    db.execute(&unpack, &[]).await;
    for (account, rate) in [("old-a", 2.5), ("old-b", 4.0)] {
        let insert = format!(
            "INSERT INTO account_load (stream, shard_id, account, records_per_s, bytes_per_s) \
             VALUES ('s', $1, $2, {rate}, {rate})"
        );
        db.execute(&insert, &[&id, account]).await;
    }
    let rates = |page: &Value| -> Vec<(String, f64)> {
        let accounts = page["accounts"].as_array().unwrap();
        accounts
            .iter()
            .map(|a| {
                (
                    a["account"].as_str().unwrap().to_owned(),
                    f(&a["records_per_s"]),
                )
            })
            .collect()
    };
    let page = load(&app, "&order=load").await;
    let got = rates(&page);
    let names: Vec<&str> = got.iter().map(|(a, _)| a.as_str()).collect();
    assert_eq!(names, ["old-b", "old-a"], "{page}");
    let left = decay(ms(&page["at"]) - t, hl);
    assert_close(got[0].1, 4.0 * left, "old-b before a report");
    assert_close(got[1].1, 2.5 * left, "old-a before a report");

    let accounts = json!([{"account": "old-a", "records": 3000, "bytes": 3000},
                          {"account": "new", "records": 1000, "bytes": 1000}]);
    let (_, t2) = beat_ok(
        &app,
        "w1",
        json!([entry(&id, epoch, 1000, 4000, 4000, accounts)]),
    )
    .await;
    // And once more with no accounts: what was carried over counts once.
    beat_ok(
        &app,
        "w1",
        json!([entry(&id, epoch, 1000, 0, 0, json!([]))]),
    )
    .await;
    let page = load(&app, "&order=load").await;
    let now = ms(&page["at"]);
    let share = 1.0 - decay(1000, hl);
    let want = [
        ("old-b", 4.0 * decay(now - t, hl)),
        (
            "old-a",
            2.5 * decay(now - t, hl) + 3000.0 * share * decay(now - t2, hl),
        ),
        ("new", 1000.0 * share * decay(now - t2, hl)),
    ];
    let got = rates(&page);
    assert_eq!(got.len(), want.len(), "{page}");
    for ((account, rate), (name, want)) in got.iter().zip(want) {
        assert_eq!(account, name, "{page}");
        assert_close(*rate, want, name);
    }
}

/// Names of the accounts of a `GET /load` page, in its order.
fn account_names(page: &Value) -> Vec<String> {
    let accounts = page["accounts"].as_array().unwrap();
    accounts
        .iter()
        .map(|a| a["account"].as_str().unwrap().to_owned())
        .collect()
}

/// One entry per held shard, each naming its accounts (`names[i]` on shard `i % shards`)
/// with records drawn from `rng`: every report reorders the accounts by load.
fn shuffled_report(
    held: &[(String, String, u64)],
    names: &[String],
    rng: &mut crate::process::Rng,
) -> Value {
    let entries: Vec<Value> = (held.iter().enumerate())
        .map(|(s, (id, _, epoch))| {
            let accounts: Vec<Value> = (names.iter().skip(s).step_by(held.len()))
                .map(|a| {
                    let r = 1 + rng.below(10_000);
                    json!({"account": a, "records": r, "bytes": r})
                })
                .collect();
            entry(id, *epoch, 1000, 10_000_000, 10_000_000, json!(accounts))
        })
        .collect();
    json!(entries)
}

/// Walking `GET /load`'s accounts page by page while heartbeats report loads that reorder
/// them lists every account exactly once, in account order.
#[tokio::test]
async fn walking_the_accounts_under_heartbeats_lists_each_exactly_once() {
    let (app, held) = joined(3600, 4).await;
    let names: Vec<String> = (0..3000).map(|i| format!("acct-{i:04}")).collect();
    let mut rng = crate::process::Rng::new(7);
    beat_ok(&app, "w1", shuffled_report(&held, &names, &mut rng)).await;
    let mut walked: Vec<String> = Vec::new();
    let mut query = "&limit=100".to_owned();
    for _ in 0..100 {
        let page = load(&app, &query).await;
        walked.extend(account_names(&page));
        // A heartbeat between every two pages: the loads the walk has seen no longer hold.
        let (answer, _) = beat_ok(&app, "w1", shuffled_report(&held, &names, &mut rng)).await;
        assert_eq!(answer["ignored_load"], json!([]), "{answer}");
        match page["next"].as_str() {
            Some(next) => query = format!("&limit=100&after={next}"),
            None => break,
        }
    }
    let distinct: std::collections::BTreeSet<&String> = walked.iter().collect();
    assert_eq!(
        (walked.len(), distinct.len()),
        (names.len(), names.len()),
        "accounts listed, and distinct ones"
    );
    assert_eq!(walked, names, "every account once, in account order");
}

/// The accounts a shard keeps: its heaviest 2,000 by smoothed load (twice the 1,000 one
/// report may name, so that one report of new names never pushes out the last one's).
const SHARD_ACCOUNTS: usize = 2000;

/// Every account `GET /load` lists, walked page by page by account.
async fn every_account(app: &TestApp) -> Vec<Value> {
    let mut all = Vec::new();
    let mut query = "&limit=1000".to_owned();
    for _ in 0..100 {
        let page = load(app, &query).await;
        all.extend(page["accounts"].as_array().unwrap().iter().cloned());
        match page["next"].as_str() {
            Some(next) => query = format!("&limit=1000&after={next}"),
            None => return all,
        }
    }
    panic!("more than 100 pages");
}

/// Heartbeats whose reports name ever new accounts leave a shard with its heaviest
/// [`SHARD_ACCOUNTS`], not with every name ever reported.
#[tokio::test]
async fn a_shard_keeps_its_heaviest_accounts_however_many_names_reports_bring() {
    let (app, mut held) = joined(3600, 1).await;
    let (id, _, epoch) = held.remove(0);
    // Six reports of 1,000 new names each; records grow with the report, and within one
    // report with the name, so the heaviest are the latest. One heavy account, named
    // once in the first report, stays heaviest of all.
    let mut heaviest: Vec<(u64, String)> = Vec::new();
    for round in 0..6u64 {
        let mut accounts: Vec<Value> = (0..1000u64)
            .map(|i| {
                let (name, records) = (format!("r{round}-{i:04}"), 100 + round * 1000 + i);
                heaviest.push((records, name.clone()));
                json!({"account": name, "records": records, "bytes": 1})
            })
            .collect();
        if round == 0 {
            accounts[0] = json!({"account": "whale", "records": 1_000_000, "bytes": 1});
            heaviest[0] = (1_000_000, "whale".to_owned());
        }
        let report = json!([entry(&id, epoch, 1000, 2_000_000, 1000, json!(accounts))]);
        let (answer, _) = beat_ok(&app, "w1", report).await;
        assert_eq!(answer["ignored_load"], json!([]), "{answer}");
    }
    let kept: Vec<String> = every_account(&app)
        .await
        .iter()
        .map(|a| a["account"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(kept.len(), SHARD_ACCOUNTS, "accounts kept of 6,000 named");
    // Reports seconds apart with an hour's half-life: the order of the records holds.
    heaviest.sort_by_key(|h| std::cmp::Reverse(h.0));
    let mut want: Vec<String> = (heaviest.into_iter().take(SHARD_ACCOUNTS))
        .map(|(_, name)| name)
        .collect();
    want.sort();
    assert_eq!(kept, want, "the heaviest by smoothed load");
}
