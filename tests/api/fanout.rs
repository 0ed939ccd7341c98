//! Hot accounts: several keys per account, on distinct shards, through every change.

use std::collections::{BTreeMap, HashMap};

use reqwest::Method;
use serde_json::{Value, json};

use crate::helpers::{TestApp, assert_problem, spawn_app};

/// The account's keys as the answer lists them, checked against `hash_key` and `fanout`.
fn keys_of(answer: &Value) -> Vec<u128> {
    let keys: Vec<u128> = answer["hash_keys"]
        .as_array()
        .unwrap_or_else(|| panic!("no hash_keys in {answer}"))
        .iter()
        .map(|k| k.as_str().unwrap().parse().unwrap())
        .collect();
    assert_eq!(answer["hash_key"], answer["hash_keys"][0], "{answer}");
    assert_eq!(
        answer["fanout"].as_u64(),
        Some(keys.len() as u64),
        "{answer}"
    );
    keys
}

/// A primary map of two shards cut at 2^126: the second holds both 2^126 and 2^127, the
/// first two keys of an account of fanout 2 placed without a map.
fn cut_at_a_quarter() -> Value {
    let cut = (1u128 << 126) - 1;
    json!({"Shards": [
        {"ShardId": "shardId-000000000000",
         "HashKeyRange": {"StartingHashKey": "0", "EndingHashKey": cut.to_string()},
         "SequenceNumberRange": {"StartingSequenceNumber": "1"}},
        {"ShardId": "shardId-000000000001",
         "HashKeyRange": {"StartingHashKey": (cut + 1).to_string(), "EndingHashKey": u128::MAX.to_string()},
         "SequenceNumberRange": {"StartingSequenceNumber": "1"}},
    ], "primary": true})
}

/// Registers a uniform map of `shards` as the primary stream `name`; answers the
/// registration (201).
pub async fn primary_stream(app: &TestApp, name: &str, shards: u64) -> crate::helpers::Answer {
    let put = app
        .call(
            Method::PUT,
            &format!("/streams/{name}"),
            Some(json!({"shard_count": shards, "primary": true})),
        )
        .await;
    assert_eq!(put.status, 201, "{}", put.body);
    put
}

async fn etag_of(app: &TestApp, account: &str) -> String {
    let response = reqwest::get(app.url(&format!("/keys/{account}")))
        .await
        .unwrap();
    response.headers()["etag"].to_str().unwrap().to_owned()
}

async fn patch(app: &TestApp, path: &str, body: Value) -> crate::helpers::Answer {
    app.call(Method::PATCH, path, Some(body)).await
}

/// The shard id each of `account`'s keys lands on in `stream`, by index, as shard-of says.
async fn shards_of(app: &TestApp, account: &str, stream: &str, fanout: usize) -> Vec<String> {
    let mut shards = Vec::new();
    for i in 0..fanout {
        let a = app
            .get(&format!(
                "/shard-of?account={account}&index={i}&stream={stream}"
            ))
            .await;
        assert_eq!(a.status, 200, "{}", a.body);
        assert_eq!(a.body["index"], i);
        shards.push(a.body["shard_id"].as_str().unwrap().to_owned());
    }
    shards
}

/// Whether keys `0..k` lie on min(k, S) shards with ⌊k/S⌋ or ⌈k/S⌉ each, for every k.
fn spread_on(shards: &[String], s: usize) -> bool {
    (1..=shards.len()).all(|k| {
        let mut counts: HashMap<&str, usize> = HashMap::new();
        for shard in &shards[..k] {
            *counts.entry(shard).or_default() += 1;
        }
        counts.len() == k.min(s) && counts.values().all(|&c| c == k / s || c == k.div_ceil(s))
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fanned_out_keys_lie_on_distinct_shards_of_the_primary_stream() {
    let app = spawn_app().await;
    primary_stream(&app, "orders", 4).await;
    app.post("/keys/quiet", None).await;

    let hot = app.post("/keys/hot", Some(json!({"fanout": 4}))).await;
    assert_eq!(hot.status, 201, "{}", hot.body);
    assert_eq!(hot.body["weight"], 4, "the weight defaults to the fanout");
    assert_eq!(keys_of(&hot.body).len(), 4);
    let shards = shards_of(&app, "hot", "orders", 4).await;
    assert!(spread_on(&shards, 4), "{shards:?}");

    let hotter = app
        .post("/keys/hotter", Some(json!({"fanout": 10, "weight": 25})))
        .await;
    assert_eq!(hotter.status, 201, "{}", hotter.body);
    let shards = shards_of(&app, "hotter", "orders", 10).await;
    assert!(spread_on(&shards, 4), "{shards:?}");

    // Idempotent: the same keys again, whatever the body asks.
    let again = app.post("/keys/hotter", Some(json!({"fanout": 2}))).await;
    assert_eq!((again.status, &again.body), (200, &hotter.body));
    let lookup = app.get("/keys/hotter").await;
    assert_eq!(lookup.body, hotter.body);

    // Balance counts keys: 1 + 4 + 10 keys over 4 shards, at most ceil(15 / 4) each.
    let d = app.get("/distribution?stream=orders").await;
    assert_eq!(d.body["skew"]["accounts"], 15, "{}", d.body);
    assert_eq!(d.body["skew"]["weight"], 1 + 4 + 25);
    assert!(d.body["skew"]["max"].as_u64().unwrap() <= 4, "{}", d.body);
    // The MD5 comparison hashes `hot#0`..`hot#3` and so on: as many keys, the same weight.
    assert_eq!(d.body["md5_skew"]["accounts"], 15);
    assert_eq!(d.body["md5_skew"]["weight"], 1 + 4 + 25);

    // Every key survives a restart, with its index.
    let app = app.restart().await;
    assert_eq!(app.get("/keys/hotter").await.body, hotter.body);
    assert_eq!(shards_of(&app, "hotter", "orders", 10).await, shards);

    // Events name each key's index; an allocation of K keys is K events.
    let events = app.get("/events?limit=1000").await;
    let hotter_events: Vec<(String, u64, u64)> = events.body["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["account"] == "hotter")
        .map(|e| {
            (
                e["kind"].as_str().unwrap().to_owned(),
                e["index"].as_u64().unwrap(),
                e["weight"].as_u64().unwrap(),
            )
        })
        .collect();
    let expected: Vec<(String, u64, u64)> = (0..10)
        .map(|i| ("allocate".to_owned(), i, if i < 5 { 3 } else { 2 }))
        .collect();
    assert_eq!(
        hotter_events, expected,
        "25 over 10 keys: 3 for the first 5, 2 after"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn patch_grows_from_the_top_and_shrinks_from_the_top() {
    let app = spawn_app().await;
    let first = app.post("/keys/acct", Some(json!({"fanout": 2}))).await;
    assert_eq!(first.status, 201, "{}", first.body);
    let two = keys_of(&first.body);
    // Without a primary stream: two keys in distinct halves of the keyspace.
    assert_ne!(two[0] >> 127, two[1] >> 127, "{two:?}");
    let etag = etag_of(&app, "acct").await;

    let grown = patch(&app, "/keys/acct", json!({"fanout": 5, "weight": 11})).await;
    assert_eq!(grown.status, 200, "{}", grown.body);
    let five = keys_of(&grown.body);
    assert_eq!(&five[..2], &two[..], "growing keeps keys 0..k");
    assert_eq!(grown.body["weight"], 11);
    // Distinct segments of the uniform map of 8 shards, for every prefix.
    for k in 1..=5usize {
        let level = usize::BITS - (k - 1).leading_zeros();
        let mut segments: Vec<u128> = five[..k]
            .iter()
            .map(|key| key.checked_shr(128 - level).unwrap_or(0))
            .collect();
        segments.sort();
        segments.dedup();
        assert_eq!(segments.len(), k, "{five:?}");
    }
    assert_eq!(app.get("/keys/acct").await.body, grown.body);
    assert_ne!(
        etag_of(&app, "acct").await,
        etag,
        "the ETag follows the keys"
    );

    let shrunk = patch(&app, "/keys/acct", json!({"fanout": 3})).await;
    assert_eq!(shrunk.status, 200, "{}", shrunk.body);
    assert_eq!(
        keys_of(&shrunk.body),
        five[..3],
        "shrinking keeps keys 0..K"
    );
    // Weight only: the keys stay.
    let reweighted = patch(&app, "/keys/acct", json!({"weight": 3})).await;
    assert_eq!(keys_of(&reweighted.body), five[..3]);

    // The log of the shrink: keys 4 then 3 released, then the kept keys' new shares.
    let events = app.get("/events?limit=1000").await.body["events"]
        .as_array()
        .unwrap()
        .clone();
    let tail: Vec<(&str, u64)> = events
        .iter()
        .filter(|e| e["account"] == "acct")
        .map(|e| (e["kind"].as_str().unwrap(), e["index"].as_u64().unwrap()))
        .collect();
    assert_eq!(
        tail,
        [
            ("allocate", 0),
            ("allocate", 1),
            ("reweight", 0),
            ("reweight", 1),
            ("allocate", 2),
            ("allocate", 3),
            ("allocate", 4),
            ("release", 4),
            ("release", 3),
            ("reweight", 0),
            ("reweight", 1),
            ("reweight", 2),
            ("reweight", 0),
            ("reweight", 1),
            ("reweight", 2),
        ]
    );

    // The released keys are free again: another account may get them.
    let mut held: Vec<u128> = Vec::new();
    for i in 0..40 {
        let a = app.post(&format!("/keys/other-{i}"), None).await;
        held.extend(keys_of(&a.body));
    }
    assert!(
        five[3..].iter().any(|k| held.contains(k)),
        "released keys are handed out again"
    );

    // Releasing the account frees all its keys; it is gone.
    assert_eq!(app.delete("/keys/acct").await.status, 204);
    assert_eq!(app.get("/keys/acct").await.status, 404);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn weight_and_fanout_are_checked() {
    let app = spawn_app().await;
    for (body, needle) in [
        (
            json!({"fanout": 0}),
            "fanout must be between 1 and 1024, got 0",
        ),
        (
            json!({"fanout": 1025}),
            "fanout must be between 1 and 1024, got 1025",
        ),
        (
            json!({"fanout": 3, "weight": 2}),
            "weight 2 is below fanout 3",
        ),
        (json!({"fanout": "2"}), "fanout"),
    ] {
        assert_problem(&app.post("/keys/bad", Some(body)).await, 422, needle);
    }
    app.post("/keys/acct", Some(json!({"fanout": 4}))).await;
    assert_problem(
        &patch(&app, "/keys/acct", json!({})).await,
        422,
        "give a weight, a fanout, or both",
    );
    assert_problem(
        &patch(&app, "/keys/acct", json!({"weight": 3})).await,
        422,
        "weight 3 is below fanout 4",
    );
    assert_problem(
        &patch(&app, "/keys/acct", json!({"fanout": 9})).await,
        422,
        "weight 4 is below fanout 9",
    );
    assert_problem(
        &patch(&app, "/keys/nobody", json!({"fanout": 2})).await,
        404,
        "nobody",
    );
    let batch = app
        .post(
            "/keys/batch",
            Some(json!({"accounts": [{"account": "b1", "fanout": 3}, {"account": "b2", "fanout": 0}]})),
        )
        .await;
    assert_problem(
        &batch,
        422,
        "accounts[1]: fanout must be between 1 and 1024",
    );
    assert_eq!(app.get("/keys/b1").await.status, 404, "all or nothing");
    // One transaction's work is bounded by keys, not only by accounts.
    let greedy: Vec<Value> = (0..17)
        .map(|i| json!({"account": format!("g{i}"), "fanout": 1024}))
        .collect();
    let batch = app
        .post("/keys/batch", Some(json!({"accounts": greedy})))
        .await;
    assert_problem(
        &batch,
        422,
        "accounts[16]: a batch holds at most 16384 keys",
    );

    // Shard-of: index within the fanout, sub_key by the jump hash, both only with an account.
    for (query, status, needle) in [
        ("account=acct&index=4&shards=4", 400, "index must be below"),
        ("account=acct&index=1&sub_key=x&shards=4", 400, "not both"),
        ("hash_key=5&index=1&shards=4", 400, "give the account"),
    ] {
        assert_problem(
            &app.get(&format!("/shard-of?{query}")).await,
            status,
            needle,
        );
    }
    let keys = keys_of(&app.get("/keys/acct").await.body);
    // DESIGN.md's vector: "order-1" goes to key 3 of 4.
    let by_sub_key = app
        .get("/shard-of?account=acct&sub_key=order-1&shards=4")
        .await;
    assert_eq!(by_sub_key.body["index"], 3, "{}", by_sub_key.body);
    assert_eq!(by_sub_key.body["hash_key"], keys[3].to_string());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_and_imports_take_fanouts() {
    let app = spawn_app().await;
    let batch = app
        .post(
            "/keys/batch",
            Some(json!({"accounts": [
                {"account": "b1", "fanout": 3},
                {"account": "b2"},
                {"account": "b3", "fanout": 16, "weight": 100},
            ]})),
        )
        .await;
    assert_eq!(batch.status, 200, "{}", batch.body);
    let fanouts: Vec<u64> = batch.body["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| keys_of(a).len() as u64)
        .collect();
    assert_eq!(fanouts, [3, 1, 16]);
    let mut all: Vec<u128> = batch.body["items"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(keys_of)
        .collect();
    all.sort();
    all.dedup();
    assert_eq!(all.len(), 20, "no key held twice");
    // Paging lists each account once, with all its keys.
    let page = app.get("/keys?limit=2").await;
    let listed: Vec<(String, usize)> = page.body["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| (a["account"].as_str().unwrap().to_owned(), keys_of(a).len()))
        .collect();
    assert_eq!(listed, [("b1".to_owned(), 3), ("b2".to_owned(), 1)]);
    assert_eq!(page.body["next"], "b2");
    let rest = app.get("/keys?after=b2").await;
    assert_eq!(keys_of(&rest.body["items"][0]).len(), 16);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_map_change_that_breaks_spread_says_so_and_the_rebalance_mends_it() {
    let app = spawn_app().await;
    // No primary: key 0 at 2^127, key 1 at 2^126 (the walk's picks in each half).
    let a = app.post("/keys/acct", Some(json!({"fanout": 2}))).await;
    let keys = keys_of(&a.body);
    assert_eq!(keys, [1u128 << 127, 1u128 << 126]);
    // A primary whose second shard holds both keys.
    let listed = cut_at_a_quarter();
    let put = app.call(Method::PUT, "/streams/s", Some(listed)).await;
    assert_eq!(put.status, 201, "{}", put.body);
    assert_eq!(put.body["unspread_accounts"], 1, "{}", put.body);
    assert_eq!(put.body["unspread_sample"], json!(["acct"]));
    assert_eq!(put.body["rebalance"]["mends"], 1);
    let preview = app.get("/rebalance/preview?stream=s").await;
    let moves = preview.body["moves"].as_array().unwrap();
    assert_eq!(moves[0]["account"], "acct");
    assert_eq!(
        moves[0]["index"], 1,
        "the later key moves: {}",
        preview.body
    );
    let applied = app
        .post(
            "/rebalance",
            Some(json!({"plan_id": preview.body["plan_id"], "switch_after_s": 0})),
        )
        .await;
    assert_eq!(applied.status, 200, "{}", applied.body);
    let shards = shards_of(&app, "acct", "s", 2).await;
    assert!(spread_on(&shards, 2), "{shards:?}");
    assert_eq!(
        keys_of(&app.get("/keys/acct").await.body)[0],
        keys[0],
        "key 0 stayed"
    );
    // Spread again: nothing left to mend.
    let preview = app.get("/rebalance/preview?stream=s").await;
    assert_eq!(preview.body["mends"], 0, "{}", preview.body);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rebalance_moves_single_keys_and_never_stacks_an_account() {
    let app = spawn_app().await;
    // Accounts allocated before any stream, then a 3-shard primary: uneven, and some
    // accounts' keys share shards.
    for (name, fanout) in [("a", 4), ("b", 1), ("c", 7), ("d", 2), ("e", 1), ("f", 5)] {
        let a = app
            .post(&format!("/keys/{name}"), Some(json!({"fanout": fanout})))
            .await;
        assert_eq!(a.status, 201);
    }
    let put = primary_stream(&app, "s", 3).await;
    let plan = &put.body["rebalance"];
    let applied = app
        .post(
            "/rebalance",
            Some(json!({"plan_id": plan["plan_id"], "switch_after_s": 0})),
        )
        .await;
    assert_eq!(applied.status, 200, "{}", applied.body);
    assert_eq!(applied.body["complete"], true);
    let mut per_shard: BTreeMap<String, usize> = BTreeMap::new();
    for (name, fanout) in [("a", 4), ("b", 1), ("c", 7), ("d", 2), ("e", 1), ("f", 5)] {
        let shards = shards_of(&app, name, "s", fanout).await;
        assert!(spread_on(&shards, 3), "{name}: {shards:?}");
        for s in shards {
            *per_shard.entry(s).or_default() += 1;
        }
    }
    // 20 keys over 3 shards: 6 or 7 each.
    assert!(
        per_shard.values().all(|&n| n == 6 || n == 7),
        "{per_shard:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fanout_of_1024_is_one_transaction_all_or_nothing() {
    let app = spawn_app().await;
    let before = app.get("/events?limit=1").await.body["next"]
        .as_i64()
        .unwrap();
    let big = app
        .post("/keys/biggest", Some(json!({"fanout": 1024})))
        .await;
    assert_eq!(big.status, 201, "{}", big.body);
    let keys = keys_of(&big.body);
    let mut distinct = keys.clone();
    distinct.sort();
    distinct.dedup();
    assert_eq!(distinct.len(), 1024);
    // Distinct segments of the uniform map of 1024 shards: one key per 1/1024 of the space.
    let segments: std::collections::HashSet<u128> = keys.iter().map(|k| k >> 118).collect();
    assert_eq!(segments.len(), 1024);
    // 1024 events committed together: consecutive ids, one commit time.
    let events = app
        .get(&format!("/events?after={before}&limit=1000"))
        .await
        .body["events"]
        .as_array()
        .unwrap()
        .clone();
    let ats: std::collections::HashSet<&str> =
        events.iter().map(|e| e["at"].as_str().unwrap()).collect();
    assert_eq!(events.len(), 1000);
    assert_eq!(ats.len(), 1, "one transaction, one commit time");
    for (n, e) in events.iter().enumerate() {
        assert_eq!(e["id"].as_i64().unwrap(), before + 1 + n as i64);
        assert_eq!(e["index"], n);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fanout_that_does_not_fit_writes_nothing() {
    // A 10-bit keyspace: 1024 keys, one of them held.
    let app = crate::helpers::spawn_app_with(|c| c.keyspace_bits = 10).await;
    app.post("/keys/first", None).await;
    let last = app.get("/events?limit=1000").await.body["next"].clone();
    let full = app
        .post("/keys/greedy", Some(json!({"fanout": 1024})))
        .await;
    assert_problem(&full, 409, "no free hash key");
    app.post("/keys/hot", Some(json!({"fanout": 1000}))).await;
    let last_hot = app.get("/events?limit=1000&after=0").await.body["events"]
        .as_array()
        .unwrap()
        .len();
    let grow = patch(&app, "/keys/hot", json!({"fanout": 1024, "weight": 1024})).await;
    assert_problem(&grow, 409, "no free hash key");
    assert_eq!(keys_of(&app.get("/keys/hot").await.body).len(), 1000);
    assert_eq!(app.get("/keys/greedy").await.status, 404);
    let events = app.get("/events?limit=1000&after=0").await.body["events"]
        .as_array()
        .unwrap()
        .len();
    assert_eq!(events, last_hot, "the refused growth logged nothing");
    assert_eq!(last, 1, "the refused allocation logged nothing");
    // What is left still fits: 23 free keys.
    let rest = patch(&app, "/keys/hot", json!({"fanout": 1023, "weight": 1023})).await;
    assert_eq!(rest.status, 200, "{}", rest.body);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_primary_map_that_leaves_accounts_unspread_is_logged() {
    let dir = tempfile::tempdir().unwrap();
    let (url, _postgres) = crate::helpers::fresh_database(dir.path()).await;
    let log = dir.path().join("server.log");
    let mut server = crate::process::Server::spawn(&url, &log);
    let client = reqwest::Client::new();
    server.wait_ready(&client).await;
    let post = client
        .post(format!("{}/keys/acct", server.url))
        .json(&json!({"fanout": 2}))
        .send()
        .await
        .unwrap();
    assert_eq!(post.status(), 201);
    // Both keys (2^127 and 2^126) on the second shard of the new primary map.
    let listed = cut_at_a_quarter();
    let put = client
        .put(format!("{}/streams/s", server.url))
        .json(&listed)
        .send()
        .await
        .unwrap();
    assert_eq!(put.status(), 201);
    server.kill();
    let text = std::fs::read_to_string(&log).unwrap();
    let line = text
        .lines()
        .find(|l| l.contains("leaves accounts' keys sharing shards"))
        .unwrap_or_else(|| panic!("no warning in the log:\n{text}"));
    assert!(
        line.contains("accounts=1") && line.contains("example=\"acct\""),
        "{line}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn split_plans_weigh_a_hot_account_key_by_key() {
    let app = spawn_app().await;
    primary_stream(&app, "s", 1).await;
    let hot = app
        .post("/keys/hot", Some(json!({"fanout": 4, "weight": 8})))
        .await;
    assert_eq!(hot.status, 201, "{}", hot.body);
    let plan = app.get("/streams/s/split-plan?target=2").await;
    assert_eq!(plan.status, 200, "{}", plan.body);
    // One account of weight 8 on 4 keys of 2: split between them, 2 keys and 4 each.
    assert_eq!(plan.body["heaviest_account"], 2, "{}", plan.body);
    let loads: Vec<(u64, u64)> = plan.body["shards"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            (
                s["accounts"].as_u64().unwrap(),
                s["weight"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(loads, [(2, 4), (2, 4)], "{}", plan.body);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_page_of_hot_accounts_ends_at_16384_keys() {
    let app = spawn_app().await;
    // 17 accounts of 1024 keys: one more than a page holds.
    for (first, n) in [(0, 16), (16, 1)] {
        let accounts: Vec<Value> = (first..first + n)
            .map(|i| json!({"account": format!("hot-{i:02}"), "fanout": 1024}))
            .collect();
        // A loaded machine may answer 503 (not taken within the change bound, nothing
        // written): send it again, as a client would.
        let mut tries = 0;
        let batch = loop {
            let batch = app
                .post("/keys/batch", Some(json!({"accounts": accounts})))
                .await;
            tries += 1;
            if batch.status != 503 || tries == 5 {
                break batch;
            }
        };
        assert_eq!(batch.status, 200, "{}", batch.body);
    }
    let page = app.get("/keys?limit=1000").await;
    assert_eq!(page.status, 200);
    let items = page.body["items"].as_array().unwrap();
    assert_eq!(items.len(), 16);
    assert!(items.iter().all(|a| keys_of(a).len() == 1024));
    assert_eq!(page.body["next"], "hot-15");
    let rest = app.get("/keys?limit=1000&after=hot-15").await;
    assert_eq!(rest.body["items"][0]["account"], "hot-16");
    assert_eq!(keys_of(&rest.body["items"][0]).len(), 1024);
    assert_eq!(rest.body["next"], Value::Null);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn query_values_that_are_not_utf8_are_refused_not_replaced() {
    let app = spawn_app().await;
    let made = app
        .post("/keys/acct", Some(json!({"fanout": 4, "weight": 4})))
        .await;
    assert_eq!(made.status, 201, "{}", made.body);
    for (query, name) in [
        ("account=acct&sub_key=%FF&shards=4", "sub_key"),
        ("account=acct&sub_key=order-%C3&shards=4", "sub_key"),
        ("partition_key=%FE%FF&shards=4", "partition_key"),
        ("account=acct%FF&shards=4", "account"),
    ] {
        let answer = app.get(&format!("/shard-of?{query}")).await;
        assert_problem(&answer, 400, &format!("`{name}` is not UTF-8"));
    }
    // Percent-encoded UTF-8 is fine: "é" is %C3%A9, and `+` is a space.
    let encoded = app
        .get("/shard-of?account=acct&sub_key=caf%C3%A9+1&shards=4")
        .await;
    let plain = app
        .get(&format!(
            "/shard-of?account=acct&sub_key={}&shards=4",
            "caf\u{e9}%201"
        ))
        .await;
    assert_eq!(encoded.status, 200, "{}", encoded.body);
    assert_eq!(encoded.body, plain.body);
    let index = keyspread::keyspace::sub_key_index("caf\u{e9} 1", 4);
    assert_eq!(encoded.body["index"], index);
}
