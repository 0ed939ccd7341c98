//! Staged moves: a rebalance announces each new key and the instant it takes over; until
//! then lookups answer the old key plus `next`, and the account holds both.

use std::time::Duration;

use serde_json::{Value, json};

use crate::helpers::{TestApp, assert_problem, spawn_app, spawn_app_with};

/// RFC 3339 as Unix milliseconds.
pub fn unix_ms(text: &str) -> i64 {
    use time::format_description::well_known::Rfc3339;
    let t = time::OffsetDateTime::parse(text, &Rfc3339).unwrap_or_else(|e| panic!("{text}: {e}"));
    (t.unix_timestamp_nanos() / 1_000_000) as i64
}

pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

/// Sleeps until the wall clock reads `at` (Unix milliseconds) plus `margin_ms`.
pub async fn sleep_until(at: i64, margin_ms: i64) {
    let wait = at + margin_ms - now_ms();
    if wait > 0 {
        tokio::time::sleep(Duration::from_millis(wait as u64)).await;
    }
}

/// Eight accounts over two uniform shards, then those on shard 1 released: 4 vs 0, which
/// a rebalance evens out with two moves.
pub async fn lopsided(app: &TestApp) {
    for i in 0..8 {
        app.allocate(&format!("acct-{i}")).await;
    }
    for i in 0..8 {
        let on = app
            .get(&format!("/shard-of?account=acct-{i}&shards=2"))
            .await;
        if on.body["shard_index"] == 1 {
            assert_eq!(app.delete(&format!("/keys/acct-{i}")).await.status, 204);
        }
    }
}

/// Allocates accounts until the keyspace is full (409); answers how many got a key.
async fn fill(app: &TestApp) -> usize {
    let mut got = 0;
    while app.post(&format!("/keys/new-{got}"), None).await.status == 201 {
        got += 1;
    }
    got
}

/// Previews over two uniform shards and applies the plan with `body` (plus its plan id).
async fn rebalance(app: &TestApp, mut body: Value) -> (Value, Value) {
    let preview = app.get("/rebalance/preview?shards=2").await;
    assert_eq!(preview.status, 200, "{}", preview.body);
    body["plan_id"] = preview.body["plan_id"].clone();
    let applied = app.post("/rebalance", Some(body)).await;
    assert_eq!(applied.status, 200, "{}", applied.body);
    (preview.body, applied.body)
}

/// A lookup's status, ETag, Cache-Control and body.
async fn lookup(app: &TestApp, account: &str, if_none_match: Option<&str>) -> Looked {
    let mut request = app.client.get(app.url(&format!("/keys/{account}")));
    if let Some(tag) = if_none_match {
        request = request.header("if-none-match", tag);
    }
    let response = request.send().await.unwrap();
    let header = |name: &str| {
        response
            .headers()
            .get(name)
            .map(|v| v.to_str().unwrap().to_owned())
            .unwrap_or_default()
    };
    let (status, etag, cache) = (
        response.status().as_u16(),
        header("etag"),
        header("cache-control"),
    );
    let bytes = response.bytes().await.unwrap();
    let body = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    Looked {
        status,
        etag,
        cache,
        body,
    }
}

struct Looked {
    status: u16,
    etag: String,
    cache: String,
    body: Value,
}

/// `max-age=N` as N.
fn max_age(cache: &str) -> i64 {
    cache
        .strip_prefix("max-age=")
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("Cache-Control {cache:?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_staged_move_answers_the_old_key_with_next_until_switch_at_then_the_new_one() {
    let app = spawn_app().await;
    lopsided(&app).await;
    let preview = app.get("/rebalance/preview?shards=2").await.body;
    let moves = preview["moves"].as_array().unwrap().clone();
    assert_eq!(moves.len(), 2, "{preview}");
    assert!(
        moves.iter().all(|m| m.get("switch_at").is_none()),
        "a preview switches nothing: {preview}"
    );
    let moved = moves[0]["account"].as_str().unwrap().to_owned();
    let before = lookup(&app, &moved, None).await;
    assert_eq!(before.cache, "max-age=60");

    let asked = now_ms();
    let (_, applied) = rebalance(&app, json!({"switch_after_s": 4})).await;
    let answered = now_ms();
    let switch_at = unix_ms(applied["switch_at"].as_str().expect("switch_at"));
    assert!(
        (asked + 4000..=answered + 4000).contains(&switch_at),
        "switch_at {switch_at} is 4 s after the apply ({asked}..{answered})"
    );
    let text = applied["switch_at"].as_str().unwrap();
    assert!(
        text.ends_with('Z') && text.rsplit_once('.').unwrap().1.len() == 4,
        "RFC 3339 with milliseconds, UTC: {text}"
    );
    for m in applied["moves"].as_array().unwrap() {
        assert_eq!(m["switch_at"], applied["switch_at"], "{m}");
    }

    // Until the switch: the old key, the new one as `next`, cached no longer than the
    // seconds left, under a new tag.
    let during = lookup(&app, &moved, None).await;
    assert_eq!(during.status, 200);
    assert_eq!(during.body["hash_key"], moves[0]["from"]);
    assert_eq!(during.body["hash_keys"], json!([moves[0]["from"]]));
    let next = &during.body["next"];
    assert_eq!(next["hash_key"], moves[0]["to"], "{}", during.body);
    assert_eq!(next["hash_keys"], json!([moves[0]["to"]]));
    assert_eq!(next["switch_at"], applied["switch_at"]);
    let left = max_age(&during.cache);
    assert!(
        (0..=4).contains(&left) && left <= (switch_at - now_ms()) / 1000 + 1,
        "max-age {left} within the seconds left"
    );
    assert_ne!(during.etag, before.etag, "the tag changes at the apply");
    assert_eq!(lookup(&app, &moved, Some(&before.etag)).await.status, 200);
    let revalidated = lookup(&app, &moved, Some(&during.etag)).await;
    assert_eq!(revalidated.status, 304);
    assert!(max_age(&revalidated.cache) <= left);

    // Every view of the table says the same.
    let listed = app.get("/keys?limit=10").await.body;
    let row = listed["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["account"] == moved.as_str())
        .unwrap()
        .clone();
    assert_eq!(row["hash_key"], moves[0]["from"]);
    assert_eq!(row["next"]["hash_keys"], json!([moves[0]["to"]]));
    let pending = app.get("/moves").await.body;
    let items = pending["items"].as_array().unwrap();
    assert_eq!(items.len(), 2, "{pending}");
    assert_eq!(pending["next"], Value::Null);
    let events = app.get("/events?limit=1000").await.body;
    for item in items {
        let event = events["events"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["id"] == item["event_id"])
            .unwrap();
        assert_eq!(event["kind"], "move");
        assert_eq!(
            (&event["account"], &event["key_before"], &event["key_after"]),
            (&item["account"], &item["from"], &item["to"])
        );
        assert_eq!(event["switch_at"], applied["switch_at"]);
        assert_eq!(item["switch_at"], applied["switch_at"]);
        assert_eq!(
            unix_ms(item["applied_at"].as_str().unwrap()),
            unix_ms(event["at"].as_str().unwrap())
        );
        assert_eq!(item["index"], 0);
    }
    let page = app.get("/moves?limit=1").await.body;
    assert_eq!(page["items"].as_array().unwrap().len(), 1);
    let rest = app
        .get(&format!("/moves?after={}", page["next"]))
        .await
        .body;
    assert_eq!(rest["items"].as_array().unwrap().len(), 1);
    assert_ne!(rest["items"][0]["event_id"], page["items"][0]["event_id"]);

    let metrics = |app: &TestApp| {
        let request = app.client.get(app.url("/metrics"));
        async move { request.send().await.unwrap().text().await.unwrap() }
    };
    assert!(
        metrics(&app)
            .await
            .contains("\nkeyspread_switching_keys 2\n"),
        "the metric counts the keys switching"
    );

    // A preview plans over the keys after the switch: nothing left to move.
    let again = app.get("/rebalance/preview?shards=2").await.body;
    assert_eq!(again["moves"], json!([]), "{again}");
    assert_eq!(again["before"], preview["after"]);
    let shown = app.get("/distribution?shards=2").await.body;
    assert_eq!(
        (&shown["skew"]["max"], &shown["skew"]["min"]),
        (&json!(2), &json!(2)),
        "keys count where they go: {shown}"
    );

    // From the switch on: the new key, no `next`, the configured caching, another tag.
    assert!(now_ms() < switch_at, "the checks above took under 4 s");
    sleep_until(switch_at, 50).await;
    let after = lookup(&app, &moved, None).await;
    assert_eq!(after.body["hash_key"], moves[0]["to"]);
    assert_eq!(after.body.get("next"), None, "{}", after.body);
    assert_eq!(after.cache, "max-age=60");
    assert_ne!(after.etag, during.etag);
    assert_ne!(after.etag, before.etag);
    assert_eq!(lookup(&app, &moved, Some(&during.etag)).await.status, 200);
    assert_eq!(app.get("/moves").await.body["items"], json!([]));
    assert!(
        metrics(&app)
            .await
            .contains("\nkeyspread_switching_keys 0\n")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_allocation_gets_either_key_of_a_pending_move() {
    // 16 keys in all: allocating until the keyspace is full counts what is held.
    let app = spawn_app_with(|c| c.keyspace_bits = 4).await;
    lopsided(&app).await;
    let (_, applied) = rebalance(&app, json!({"switch_after_s": 5})).await;
    let switch_at = unix_ms(applied["switch_at"].as_str().unwrap());
    let moves = applied["moves"].as_array().unwrap();
    assert_eq!(moves.len(), 2);
    let taken: Vec<&Value> = moves.iter().flat_map(|m| [&m["from"], &m["to"]]).collect();

    // 4 accounts, each moving: 8 keys held, 8 free.
    let mut got = Vec::new();
    for i in 0.. {
        let answer = app.post(&format!("/keys/new-{i}"), None).await;
        if answer.status == 409 {
            break;
        }
        assert_eq!(answer.status, 201, "{}", answer.body);
        got.push(answer.body["hash_key"].clone());
    }
    assert!(now_ms() < switch_at, "allocations took under 5 s");
    assert_eq!(got.len(), 16 - 4 - 2, "the old keys stay held: {got:?}");
    for key in &got {
        assert!(!taken.contains(&key), "{key} belongs to a moving account");
    }

    // After the switch the old keys are free again.
    sleep_until(switch_at, 50).await;
    for i in 0..2 {
        let answer = app.post(&format!("/keys/later-{i}"), None).await;
        assert_eq!(answer.status, 201, "{}", answer.body);
        let froms: Vec<&Value> = moves.iter().map(|m| &m["from"]).collect();
        assert!(froms.contains(&&answer.body["hash_key"]), "{}", answer.body);
    }
    assert_eq!(app.post("/keys/one-too-many", None).await.status, 409);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pending_moves_survive_a_restart_and_switch_on_time() {
    let app = spawn_app_with(|c| c.keyspace_bits = 4).await;
    lopsided(&app).await;
    let (_, applied) = rebalance(&app, json!({"switch_after_s": 4})).await;
    let switch_at = unix_ms(applied["switch_at"].as_str().unwrap());
    let m = applied["moves"][0].clone();
    let account = m["account"].as_str().unwrap();

    let app = app.restart().await;
    let during = lookup(&app, account, None).await;
    assert_eq!(during.body["hash_key"], m["from"], "{}", during.body);
    assert_eq!(during.body["next"]["hash_key"], m["to"]);
    assert_eq!(during.body["next"]["switch_at"], applied["switch_at"]);
    assert_eq!(
        app.get("/moves").await.body["items"]
            .as_array()
            .unwrap()
            .len(),
        2
    );
    // The old keys are still held: 4 accounts and 2 old keys leave 10.
    let got = fill(&app).await;
    assert!(now_ms() < switch_at);
    assert_eq!(got, 10);

    sleep_until(switch_at, 50).await;
    let after = lookup(&app, account, None).await;
    assert_eq!(after.body["hash_key"], m["to"]);
    assert_eq!(after.body.get("next"), None);
    // A restart after the switch does not bring the old keys back.
    let app = app.restart().await;
    assert_eq!(lookup(&app, account, None).await.body["hash_key"], m["to"]);
    assert_eq!(app.post("/keys/freed-0", None).await.status, 201);
    assert_eq!(app.post("/keys/freed-1", None).await.status, 201);
    assert_eq!(app.post("/keys/freed-2", None).await.status, 409);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn switch_after_s_defaults_to_the_lookup_cache_lifetime() {
    for (cache, expected_ms) in [
        ("max-age=60", 60_000),
        ("max-age=7", 7_000),
        ("public, max-age=3, stale-while-revalidate=2", 5_000),
        ("no-cache, max-age=2", 2_000),
    ] {
        let app = spawn_app_with(|c| c.lookup_cache_control = cache.parse().unwrap()).await;
        lopsided(&app).await;
        let (_, applied) = rebalance(&app, json!({})).await;
        let events = app.get("/events?limit=1000").await.body;
        let event = events["events"]
            .as_array()
            .unwrap()
            .iter()
            .rfind(|e| e["kind"] == "move")
            .unwrap()
            .clone();
        let waited =
            unix_ms(event["switch_at"].as_str().unwrap()) - unix_ms(event["at"].as_str().unwrap());
        assert_eq!(waited, expected_ms, "Cache-Control {cache}: {event}");
        assert_eq!(applied["switch_at"], event["switch_at"]);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn switch_after_s_0_switches_at_once() {
    let app = spawn_app_with(|c| c.keyspace_bits = 4).await;
    lopsided(&app).await;
    let (_, applied) = rebalance(&app, json!({"switch_after_s": 0})).await;
    for m in applied["moves"].as_array().unwrap() {
        let now = lookup(&app, m["account"].as_str().unwrap(), None).await;
        assert_eq!(now.body["hash_key"], m["to"]);
        assert_eq!(now.body.get("next"), None);
        assert_eq!(now.cache, "max-age=60");
    }
    assert_eq!(app.get("/moves").await.body["items"], json!([]));
    // Nothing held beyond the 4 accounts' keys.
    let got = fill(&app).await;
    assert_eq!(got, 12);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_switch_after_s_outside_0_to_86400_whole_seconds_is_refused() {
    let app = spawn_app().await;
    lopsided(&app).await;
    let plan_id = app.get("/rebalance/preview?shards=2").await.body["plan_id"].clone();
    for bad in [
        json!(86_401),
        json!(-1),
        json!(1.5),
        json!("5"),
        json!(1e30),
    ] {
        let answer = app
            .post(
                "/rebalance",
                Some(json!({"plan_id": plan_id, "switch_after_s": bad})),
            )
            .await;
        assert_eq!(answer.status, 422, "{bad}: {}", answer.body);
    }
    let answer = app
        .post(
            "/rebalance",
            Some(json!({"plan_id": plan_id, "switch_after_s": 86_401})),
        )
        .await;
    assert_problem(&answer, 422, "switch_after_s must be between 0 and 86400");
    // Nothing was applied.
    assert_eq!(app.get("/moves").await.body["items"], json!([]));
    let applied = app
        .post(
            "/rebalance",
            Some(json!({"plan_id": plan_id, "switch_after_s": 86_400})),
        )
        .await;
    assert_eq!(applied.status, 200, "{}", applied.body);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shrinking_or_releasing_a_moving_account_frees_both_of_its_keys() {
    let app = spawn_app_with(|c| c.keyspace_bits = 4).await;
    lopsided(&app).await;
    let (_, applied) = rebalance(&app, json!({"switch_after_s": 60})).await;
    for m in applied["moves"].as_array().unwrap() {
        let account = m["account"].as_str().unwrap();
        assert_eq!(app.delete(&format!("/keys/{account}")).await.status, 204);
    }
    assert_eq!(app.get("/moves").await.body["items"], json!([]));
    // 2 accounts left: 14 keys free, the moved ones' old and new keys among them.
    let got = fill(&app).await;
    assert_eq!(got, 14);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hot_accounts_keys_switch_one_by_one_and_pending_accounts_are_not_planned_again() {
    let app = spawn_app().await;
    // Accounts placed before any stream, then a 3-shard primary: uneven, and the hot
    // accounts' keys share shards.
    for (name, fanout) in [("a", 4), ("b", 1), ("c", 7), ("d", 2), ("e", 1), ("f", 5)] {
        let a = app
            .post(&format!("/keys/{name}"), Some(json!({"fanout": fanout})))
            .await;
        assert_eq!(a.status, 201, "{}", a.body);
    }
    crate::fanout::primary_stream(&app, "s", 3).await;
    let plan = app.get("/rebalance/preview?stream=s").await.body;
    let body = json!({"plan_id": plan["plan_id"], "switch_after_s": 3});
    let applied = app.post("/rebalance", Some(body)).await.body;
    let switch_at = unix_ms(applied["switch_at"].as_str().expect("moves applied"));
    let moves = applied["moves"].as_array().unwrap().clone();
    assert!(
        moves.iter().any(|m| m["index"].as_u64() > Some(0)),
        "a key other than key 0 moves: {applied}"
    );
    let moving: std::collections::BTreeSet<&str> = moves
        .iter()
        .map(|m| m["account"].as_str().unwrap())
        .collect();

    // Each moving account answers its old keys, and the new ones as `next`, index by index.
    let before_switch = |account: &str| {
        let path = format!("/keys/{account}");
        let app = &app;
        async move { app.get(&path).await.body }
    };
    for account in &moving {
        let a = before_switch(account).await;
        let (now, next) = (a["hash_keys"].clone(), a["next"]["hash_keys"].clone());
        assert_eq!(
            now.as_array().unwrap().len(),
            next.as_array().unwrap().len(),
            "{a}"
        );
        for (i, (old, new)) in now
            .as_array()
            .unwrap()
            .iter()
            .zip(next.as_array().unwrap())
            .enumerate()
        {
            let m = moves
                .iter()
                .find(|m| m["account"] == *account && m["index"] == i);
            match m {
                Some(m) => assert_eq!((old, new), (&m["from"], &m["to"]), "{account} key {i}"),
                None => assert_eq!(old, new, "{account} key {i} does not move"),
            }
        }
    }
    let pending = app.get("/moves").await.body;
    assert_eq!(pending["items"].as_array().unwrap().len(), moves.len());

    // Previews made now, over any map, leave the moving accounts be.
    for map in ["stream=s", "shards=2", "shards=4", "shards=5"] {
        let preview = app.get(&format!("/rebalance/preview?{map}")).await.body;
        for m in preview["moves"].as_array().unwrap() {
            assert!(
                !moving.contains(m["account"].as_str().unwrap()),
                "{map}: a pending account planned again: {m}"
            );
        }
    }

    assert!(now_ms() < switch_at, "the checks above took under 3 s");
    sleep_until(switch_at, 50).await;
    for account in &moving {
        let a = app.get(&format!("/keys/{account}")).await.body;
        assert_eq!(a.get("next"), None, "{a}");
        for m in moves.iter().filter(|m| m["account"] == *account) {
            assert_eq!(
                a["hash_keys"][m["index"].as_u64().unwrap() as usize],
                m["to"]
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pending_account_is_not_moved_again_even_where_a_plan_would_want_it() {
    let app = spawn_app().await;
    lopsided(&app).await;
    let (_, applied) = rebalance(&app, json!({"switch_after_s": 30})).await;
    let moving: Vec<&str> = (applied["moves"].as_array().unwrap().iter())
        .map(|m| m["account"].as_str().unwrap())
        .collect();
    assert_eq!(moving.len(), 2);
    // Only the two moving accounts left, both on shard 1 after their switch: a plan for
    // two shards would move one of them back, but neither may move before it switches.
    for i in 0..8 {
        let account = format!("acct-{i}");
        if !moving.contains(&account.as_str()) {
            app.delete(&format!("/keys/{account}")).await;
        }
    }
    let preview = app.get("/rebalance/preview?shards=2").await.body;
    assert_eq!(
        preview["before"]["max"], 2,
        "both count on shard 1: {preview}"
    );
    assert_eq!(preview["moves"], json!([]), "{preview}");
    assert_eq!(preview["complete"], false, "{preview}");
}

/// The shard index of `key` (a decimal string) on `stream`, as shard-of says.
async fn shard_index(app: &TestApp, key: &Value, stream: &str) -> u64 {
    let key = key.as_str().expect("hash keys are strings");
    let on = app
        .get(&format!("/shard-of?hash_key={key}&stream={stream}"))
        .await;
    assert_eq!(on.status, 200, "{}", on.body);
    on.body["shard_index"].as_u64().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn growing_a_moving_account_spreads_its_keys_now_and_after_the_switch() {
    let app = spawn_app().await;
    crate::fanout::primary_stream(&app, "s", 2).await;
    lopsided(&app).await;
    let preview = app.get("/rebalance/preview?stream=s").await.body;
    let body = json!({"plan_id": preview["plan_id"], "switch_after_s": 3600});
    let applied = app.post("/rebalance", Some(body)).await;
    assert_eq!(applied.status, 200, "{}", applied.body);
    let account = applied.body["moves"][0]["account"].as_str().unwrap();
    // A replica on the same database, following the log from before the change.
    let replica = keyspread::AppState::open(&app.config).await.unwrap();

    let path = format!("/keys/{account}");
    let grown = app
        .call(
            reqwest::Method::PATCH,
            &path,
            Some(json!({"fanout": 2, "weight": 2})),
        )
        .await;
    assert_eq!(grown.status, 200, "{}", grown.body);
    let looked = app.get(&path).await.body;
    let started = std::time::Instant::now();
    loop {
        let router = keyspread::app(replica.clone());
        let request = axum::http::Request::get(&path)
            .body(axum::body::Body::empty())
            .unwrap();
        let answer = tower::ServiceExt::oneshot(router, request).await.unwrap();
        let bytes = axum::body::to_bytes(answer.into_body(), 1 << 20)
            .await
            .unwrap();
        let followed: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        if followed == looked {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "the replica answers {followed}, the writer {looked}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The key added as two is a staged move of its own, and survives a restart as one.
    let app = app.restart().await;
    let restarted = app.get(&path).await.body;
    assert_eq!(restarted, looked);
    for answer in [grown.body, looked] {
        let (now, next) = (&answer["hash_keys"], &answer["next"]["hash_keys"]);
        let mut shards = Vec::new();
        for keys in [now, next] {
            let keys = keys.as_array().unwrap_or_else(|| panic!("{answer}"));
            assert_eq!(keys.len(), 2, "{answer}");
            shards.push(vec![
                shard_index(&app, &keys[0], "s").await,
                shard_index(&app, &keys[1], "s").await,
            ]);
        }
        assert_ne!(shards[0][0], shards[0][1], "keys now: {answer}");
        assert_ne!(shards[1][0], shards[1][1], "keys from switch_at: {answer}");
    }
}
