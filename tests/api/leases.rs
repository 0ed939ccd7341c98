//! Consumer leases: which worker reads which shard, balanced by weight, sticky, and handed
//! over so that no two live workers are ever told `held` for one shard.

use std::collections::BTreeMap;
use std::time::Duration;

use reqwest::Method;
use serde_json::{Value, json};

use crate::helpers::{Answer, TestApp, assert_problem, spawn_app, spawn_app_with};

/// `PUT /streams/{stream}/workers/{worker}` with `ttl_s`, asserting 200.
async fn heartbeat(app: &TestApp, stream: &str, worker: &str, ttl_s: u64) -> Value {
    let answer = app
        .call(
            Method::PUT,
            &format!("/streams/{stream}/workers/{worker}"),
            Some(json!({"ttl_s": ttl_s})),
        )
        .await;
    assert_eq!(answer.status, 200, "{worker}: {}", answer.body);
    assert_eq!(answer.body["worker"], worker);
    answer.body
}

/// A heartbeat's leases as shard -> (state, epoch).
pub fn leases_of(answer: &Value) -> BTreeMap<String, (String, u64)> {
    answer["leases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| {
            (
                l["shard_id"].as_str().unwrap().to_owned(),
                (
                    l["state"].as_str().unwrap().to_owned(),
                    l["epoch"].as_u64().unwrap(),
                ),
            )
        })
        .collect()
}

fn held(answer: &Value) -> Vec<String> {
    leases_of(answer)
        .into_iter()
        .filter(|(_, (state, _))| state == "held")
        .map(|(id, _)| id)
        .collect()
}

async fn checkpoint(
    app: &TestApp,
    stream: &str,
    shard: &str,
    worker: &str,
    epoch: u64,
    seq: &str,
) -> Answer {
    app.call(
        Method::PUT,
        &format!("/streams/{stream}/leases/{shard}/checkpoint"),
        Some(json!({"worker": worker, "epoch": epoch, "sequence_number": seq})),
    )
    .await
}

async fn put_stream(app: &TestApp, stream: &str, body: Value) {
    let put = app
        .call(Method::PUT, &format!("/streams/{stream}"), Some(body))
        .await;
    assert!(matches!(put.status, 200 | 201), "{}", put.body);
}

async fn group(app: &TestApp, stream: &str) -> Value {
    let answer = app.get(&format!("/streams/{stream}/leases")).await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    answer.body
}

/// Shard -> owner in `GET /leases`.
fn owners(group: &Value) -> BTreeMap<String, Value> {
    group["shards"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            (
                s["shard_id"].as_str().unwrap().to_owned(),
                s["owner"].clone(),
            )
        })
        .collect()
}

/// A server that assigns leases at every join (`--lease-join-batch-ms 0`), so that each
/// step below shows its effect at once; the batching itself is tested on its own.
async fn spawn_assigning_every_join() -> TestApp {
    spawn_app_with(|c| c.lease_join_batch_ms = 0).await
}

fn shard(n: u32) -> String {
    format!("shardId-{n:012}")
}

#[tokio::test]
async fn a_joining_worker_gets_a_lease_only_after_its_owner_lets_go() {
    let app = spawn_assigning_every_join().await;
    put_stream(&app, "orders", json!({"shard_count": 4})).await;

    let first = heartbeat(&app, "orders", "w1", 30).await;
    assert_eq!(
        held(&first).len(),
        4,
        "a lone worker reads every shard: {first}"
    );
    assert!(leases_of(&first).values().all(|(_, epoch)| *epoch == 1));
    assert!(first["leases"][0]["checkpoint"].is_null());

    // The joiner is given nothing yet: w1 still reads everything.
    let joined = heartbeat(&app, "orders", "w2", 30).await;
    assert_eq!(leases_of(&joined).len(), 0, "{joined}");
    let g = group(&app, "orders").await;
    let revoking: Vec<&Value> = g["shards"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["state"] == "revoking")
        .collect();
    assert_eq!(revoking.len(), 2, "{g}");
    assert!(
        revoking
            .iter()
            .all(|s| s["owner"] == "w1" && s["next_owner"] == "w2")
    );

    // w1 is told: two of its four are revoking; it checkpoints one of them.
    let told = heartbeat(&app, "orders", "w1", 30).await;
    let states = leases_of(&told);
    let going: Vec<String> = states
        .iter()
        .filter(|(_, (s, _))| s == "revoking")
        .map(|(id, _)| id.clone())
        .collect();
    assert_eq!((states.len(), going.len()), (4, 2), "{told}");
    let done = checkpoint(
        &app,
        "orders",
        &going[0],
        "w1",
        1,
        "49590338271490256608559692538361571095921575989136588802",
    )
    .await;
    assert_eq!(done.status, 200, "{}", done.body);
    assert_eq!(
        done.body["checkpoint"],
        "49590338271490256608559692538361571095921575989136588802"
    );

    // Until w1 heartbeats again, w2 gets nothing.
    assert_eq!(
        leases_of(&heartbeat(&app, "orders", "w2", 30).await).len(),
        0
    );
    let after = heartbeat(&app, "orders", "w1", 30).await;
    assert_eq!(leases_of(&after).len(), 2, "{after}");
    assert!(going.iter().all(|id| !leases_of(&after).contains_key(id)));

    let taken = heartbeat(&app, "orders", "w2", 30).await;
    let taken_leases = leases_of(&taken);
    assert_eq!(taken_leases.keys().cloned().collect::<Vec<_>>(), going);
    assert!(
        taken_leases.values().all(|(s, e)| s == "held" && *e == 2),
        "{taken}"
    );
    let resumed = taken["leases"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["shard_id"] == going[0].as_str())
        .unwrap();
    assert_eq!(
        resumed["checkpoint"], "49590338271490256608559692538361571095921575989136588802",
        "the new owner resumes from the old owner's last checkpoint"
    );

    // The old owner's checkpoint is fenced off; the new owner's is taken.
    let stale = checkpoint(
        &app,
        "orders",
        &going[0],
        "w1",
        1,
        "49590338271490256608559692538361571095921575989136588900",
    )
    .await;
    assert_problem(&stale, 409, "does not hold");
    assert_eq!(stale.body["type"], "urn:keyspread:problem:not-lease-holder");
    let fresh = checkpoint(
        &app,
        "orders",
        &going[0],
        "w2",
        2,
        "49590338271490256608559692538361571095921575989136588900",
    )
    .await;
    assert_eq!(fresh.status, 200, "{}", fresh.body);
    let wrong_epoch = checkpoint(&app, "orders", &going[0], "w2", 3, "1").await;
    assert_problem(&wrong_epoch, 409, "epoch 3");
}

#[tokio::test]
async fn heartbeats_of_a_balanced_group_move_nothing() {
    let app = spawn_assigning_every_join().await;
    put_stream(&app, "clicks", json!({"shard_count": 10})).await;
    let workers = ["a", "b", "c"];
    for _ in 0..3 {
        for w in workers {
            heartbeat(&app, "clicks", w, 30).await;
        }
    }
    let settled = group(&app, "clicks").await;
    let mut counts: Vec<usize> = settled["workers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w["shards"].as_array().unwrap().len())
        .collect();
    counts.sort();
    assert_eq!(counts, [3, 3, 4], "{settled}");
    assert!(
        settled["shards"]
            .as_array()
            .unwrap()
            .iter()
            .all(|s| s["state"] == "held")
    );
    for _ in 0..5 {
        for w in workers {
            heartbeat(&app, "clicks", w, 30).await;
        }
    }
    let later = group(&app, "clicks").await;
    assert_eq!(
        later["shards"], settled["shards"],
        "owners, epochs and states unchanged"
    );
}

#[tokio::test]
async fn a_leaving_worker_hands_its_leases_over_at_once() {
    let app = spawn_assigning_every_join().await;
    put_stream(&app, "s", json!({"shard_count": 6})).await;
    for _ in 0..3 {
        for w in ["a", "b", "c"] {
            heartbeat(&app, "s", w, 30).await;
        }
    }
    let settled = group(&app, "s").await;
    let before = owners(&settled);
    let epochs: BTreeMap<String, u64> = settled["shards"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            (
                s["shard_id"].as_str().unwrap().to_owned(),
                s["epoch"].as_u64().unwrap(),
            )
        })
        .collect();
    let gone: Vec<String> = before
        .iter()
        .filter(|(_, o)| **o == "c")
        .map(|(id, _)| id.clone())
        .collect();
    assert_eq!(gone.len(), 2);
    let left = app.delete("/streams/s/workers/c").await;
    assert_eq!(left.status, 204, "{}", left.body);
    let after = owners(&group(&app, "s").await);
    for id in &gone {
        assert!(after[id] == "a" || after[id] == "b", "{id}: {}", after[id]);
    }
    // Nobody else's lease moved, and the new owners read c's shards at their next
    // heartbeat, with the epoch raised, no revocation in between.
    for (id, owner) in &before {
        if !gone.contains(id) {
            assert_eq!(&after[id], owner, "{id}");
        }
    }
    let mut taken = 0;
    for w in ["a", "b"] {
        let answer = heartbeat(&app, "s", w, 30).await;
        for (id, (state, epoch)) in leases_of(&answer) {
            assert_eq!(state, "held");
            if gone.contains(&id) {
                assert_eq!(epoch, epochs[&id] + 1, "{id}");
                taken += 1;
            }
        }
    }
    assert_eq!(taken, 2);
    assert_problem(
        &app.delete("/streams/s/workers/c").await,
        404,
        "not in stream",
    );
}

#[tokio::test]
async fn an_expired_worker_loses_its_leases_to_the_live_ones() {
    let app = spawn_assigning_every_join().await;
    put_stream(&app, "s", json!({"shard_count": 4})).await;
    heartbeat(&app, "s", "quiet", 1).await;
    heartbeat(&app, "s", "busy", 30).await;
    heartbeat(&app, "s", "quiet", 1).await;
    heartbeat(&app, "s", "quiet", 1).await;
    let busy = heartbeat(&app, "s", "busy", 30).await;
    assert_eq!(held(&busy).len(), 2, "{busy}");
    let quiet_had: Vec<String> = owners(&group(&app, "s").await)
        .into_iter()
        .filter(|(_, o)| *o == "quiet")
        .map(|(id, _)| id)
        .collect();
    assert_eq!(quiet_had.len(), 2);

    tokio::time::sleep(Duration::from_millis(1200)).await;
    // The live worker's next heartbeat sees the expiry and takes everything at once.
    let all = heartbeat(&app, "s", "busy", 30).await;
    let leases = leases_of(&all);
    assert_eq!(leases.len(), 4, "{all}");
    for id in &quiet_had {
        assert_eq!(leases[id], ("held".to_owned(), 2), "{id}");
    }
    let g = group(&app, "s").await;
    assert_eq!(g["workers"].as_array().unwrap().len(), 1, "{g}");
    assert_problem(
        &checkpoint(&app, "s", &quiet_had[0], "quiet", 1, "7").await,
        409,
        "does not hold",
    );
    // Coming back is joining again: it gets its share through the owner's hand-over.
    let back = heartbeat(&app, "s", "quiet", 30).await;
    assert_eq!(leases_of(&back).len(), 0);
    heartbeat(&app, "s", "busy", 30).await;
    heartbeat(&app, "s", "busy", 30).await;
    let share = heartbeat(&app, "s", "quiet", 30).await;
    assert_eq!(held(&share).len(), 2, "{share}");
    assert!(
        leases_of(&share)
            .values()
            .all(|(_, epoch)| *epoch == 3 || *epoch == 2)
    );
}

/// A list-shards answer after a split of shard 0 into 2 and 3, and a merge of 1 and 4
/// (4 being a split child too) into 5: the shapes Kinesis prints.
fn resharded() -> Value {
    let half = "170141183460469231731687303715884105727";
    let half1 = "170141183460469231731687303715884105728";
    let quarter = "85070591730234615865843651857942052863";
    let quarter1 = "85070591730234615865843651857942052864";
    let max = "340282366920938463463374607431768211455";
    let closed = json!({"StartingSequenceNumber": "1", "EndingSequenceNumber": "9"});
    let open = json!({"StartingSequenceNumber": "10"});
    json!({"Shards": [
        {"ShardId": shard(0), "HashKeyRange": {"StartingHashKey": "0", "EndingHashKey": half},
         "SequenceNumberRange": closed},
        {"ShardId": shard(1), "HashKeyRange": {"StartingHashKey": half1, "EndingHashKey": max},
         "SequenceNumberRange": closed},
        {"ShardId": shard(2), "ParentShardId": shard(0),
         "HashKeyRange": {"StartingHashKey": "0", "EndingHashKey": quarter},
         "SequenceNumberRange": open},
        {"ShardId": shard(3), "ParentShardId": shard(0),
         "HashKeyRange": {"StartingHashKey": quarter1, "EndingHashKey": half},
         "SequenceNumberRange": closed},
        {"ShardId": shard(4), "ParentShardId": shard(3), "AdjacentParentShardId": shard(1),
         "HashKeyRange": {"StartingHashKey": quarter1, "EndingHashKey": max},
         "SequenceNumberRange": open},
    ]})
}

#[tokio::test]
async fn children_are_leased_only_once_every_listed_parent_is_at_shard_end() {
    let app = spawn_assigning_every_join().await;
    put_stream(&app, "r", resharded()).await;
    let states = |g: &Value| -> BTreeMap<String, String> {
        g["shards"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| {
                (
                    s["shard_id"].as_str().unwrap().to_owned(),
                    s["state"].as_str().unwrap().to_owned(),
                )
            })
            .collect()
    };
    let g = group(&app, "r").await;
    assert_eq!(
        g["shards"].as_array().unwrap().len(),
        5,
        "closed shards are leased too: {g}"
    );
    assert_eq!(g["shards"][4]["parents"], json!([shard(3), shard(1)]));
    assert_eq!(g["shards"][0]["closed"], true);

    let w = heartbeat(&app, "r", "w", 30).await;
    assert_eq!(held(&w), [shard(0), shard(1)], "only the parents: {w}");
    let s = states(&group(&app, "r").await);
    assert_eq!(
        (
            s[&shard(2)].as_str(),
            s[&shard(3)].as_str(),
            s[&shard(4)].as_str()
        ),
        ("waiting", "waiting", "waiting")
    );

    // Shard 0 read to its end: its children 2 and 3 are leased; 4 still waits for 3 and 1.
    let end = checkpoint(&app, "r", &shard(0), "w", 1, "SHARD_END").await;
    assert_eq!(end.status, 200, "{}", end.body);
    let w = heartbeat(&app, "r", "w", 30).await;
    assert_eq!(held(&w), [shard(1), shard(2), shard(3)], "{w}");
    let s = states(&group(&app, "r").await);
    assert_eq!(
        (s[&shard(0)].as_str(), s[&shard(4)].as_str()),
        ("done", "waiting")
    );
    assert_problem(
        &checkpoint(&app, "r", &shard(0), "w", 1, "SHARD_END").await,
        409,
        "does not hold",
    );

    assert_eq!(
        checkpoint(&app, "r", &shard(3), "w", 1, "SHARD_END")
            .await
            .status,
        200
    );
    let w = heartbeat(&app, "r", "w", 30).await;
    assert_eq!(held(&w), [shard(1), shard(2)], "4 still waits for 1: {w}");
    assert_eq!(
        checkpoint(&app, "r", &shard(1), "w", 1, "SHARD_END")
            .await
            .status,
        200
    );
    let w = heartbeat(&app, "r", "w", 30).await;
    assert_eq!(held(&w), [shard(2), shard(4)], "{w}");

    // Kinesis trims the closed parents: the child no longer waits on them, and what was
    // recorded of the shards still listed stays.
    let mut trimmed = resharded();
    let shards = trimmed["Shards"].as_array_mut().unwrap();
    shards.retain(|s| s["ShardId"] != shard(0) && s["ShardId"] != shard(1));
    put_stream(&app, "r", trimmed).await;
    let g = group(&app, "r").await;
    let s = states(&g);
    assert_eq!(s.len(), 3);
    assert_eq!(s[&shard(3)], "done");
    let w = heartbeat(&app, "r", "w", 30).await;
    assert_eq!(held(&w), [shard(2), shard(4)], "{w}");
}

#[tokio::test]
async fn a_heavy_shard_counts_for_its_weight() {
    let app = spawn_assigning_every_join().await;
    put_stream(&app, "w", json!({"shard_count": 4, "primary": true})).await;
    // One account of weight 1000 on some shard, and light ones.
    let heavy = app.post("/keys/whale", Some(json!({"weight": 1000}))).await;
    assert_eq!(heavy.status, 201, "{}", heavy.body);
    for i in 0..12 {
        app.allocate(&format!("minnow-{i}")).await;
    }
    for _ in 0..3 {
        for w in ["a", "b", "c"] {
            heartbeat(&app, "w", w, 30).await;
        }
    }
    let g = group(&app, "w").await;
    let dist = app.get("/distribution?stream=w").await;
    assert_eq!(dist.status, 200, "{}", dist.body);
    let weights: Vec<u64> = g["shards"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["weight"].as_u64().unwrap())
        .collect();
    let expected: Vec<u64> = dist.body["shards"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["weight"].as_u64().unwrap().max(1))
        .collect();
    assert_eq!(
        weights, expected,
        "the weights GET /distribution answers: {}",
        dist.body
    );
    // The worker reading the whale's shard reads nothing else.
    let heaviest = *weights.iter().max().unwrap();
    assert!(heaviest >= 1000);
    for w in g["workers"].as_array().unwrap() {
        let load = w["weight"].as_u64().unwrap();
        if load >= heaviest {
            assert_eq!(w["shards"].as_array().unwrap().len(), 1, "{g}");
        }
    }
}

#[tokio::test]
async fn leases_outlive_a_restart_and_deleting_the_stream_forgets_them() {
    let app = spawn_assigning_every_join().await;
    put_stream(&app, "s", json!({"shard_count": 2})).await;
    let w = heartbeat(&app, "s", "w", 60).await;
    assert_eq!(
        checkpoint(&app, "s", &shard(0), "w", 1, "42").await.status,
        200
    );
    let app = app.restart().await;
    let again = heartbeat(&app, "s", "w", 60).await;
    assert_eq!(leases_of(&again), leases_of(&w), "same leases, same epochs");
    assert_eq!(again["leases"][0]["checkpoint"], "42");

    assert_eq!(app.delete("/streams/s").await.status, 204);
    assert_problem(&app.get("/streams/s/leases").await, 404, "no stream");
    put_stream(&app, "s", json!({"shard_count": 2})).await;
    let fresh = group(&app, "s").await;
    assert_eq!(fresh["workers"], json!([]));
    assert!(
        fresh["shards"]
            .as_array()
            .unwrap()
            .iter()
            .all(|s| s["checkpoint"].is_null() && s["epoch"] == 0)
    );
}

#[tokio::test]
async fn bad_lease_requests_get_problems() {
    let app = spawn_assigning_every_join().await;
    put_stream(&app, "s", json!({"shard_count": 2})).await;
    let put = |path: String, body: Option<Value>| {
        let app = &app;
        async move { app.call(Method::PUT, &path, body).await }
    };
    let long = "w".repeat(129);
    for worker in ["a%20b", "a%2Fb", "%C3%BC", "a$b", long.as_str()] {
        let answer = put(format!("/streams/s/workers/{worker}"), None).await;
        assert_problem(&answer, 400, "worker id");
    }
    let widest = format!("{}.:_-", "aZ9".repeat(41));
    assert_eq!(
        put(format!("/streams/s/workers/{widest}"), None)
            .await
            .status,
        200
    );
    for ttl in [json!(0), json!(601), json!(1.5), json!("30"), json!(-1)] {
        let answer = put("/streams/s/workers/w".into(), Some(json!({"ttl_s": ttl}))).await;
        assert_eq!(answer.status, 422, "{ttl}: {}", answer.body);
    }
    let unknown = put("/streams/s/workers/w".into(), Some(json!({"ttl": 5}))).await;
    assert_eq!(unknown.status, 422, "{}", unknown.body);
    let defaults = put("/streams/s/workers/w".into(), None).await;
    assert_eq!(defaults.body["ttl_s"], 30);
    assert_problem(
        &put("/streams/nope/workers/w".into(), None).await,
        404,
        "nope",
    );
    assert_problem(&app.get("/streams/nope/leases").await, 404, "nope");

    let cp =
        |shard: &str, body: Value| put(format!("/streams/s/leases/{shard}/checkpoint"), Some(body));
    let ok = json!({"worker": "w", "epoch": 1, "sequence_number": "12"});
    assert_problem(
        &cp("shardId-000000000009", ok.clone()).await,
        404,
        "no shard",
    );
    for seq in ["", "12a", "-1", "shard_end", &"1".repeat(129)] {
        let answer = cp(
            &shard(0),
            json!({"worker": "w", "epoch": 1, "sequence_number": seq}),
        )
        .await;
        assert_problem(&answer, 422, "sequence_number");
    }
    let missing = cp(&shard(0), json!({"worker": "w", "sequence_number": "1"})).await;
    assert_eq!(missing.status, 422, "{}", missing.body);
    let bad_worker = cp(
        &shard(0),
        json!({"worker": "a b", "epoch": 1, "sequence_number": "1"}),
    )
    .await;
    assert_problem(&bad_worker, 400, "worker id");
    let g = group(&app, "s").await;
    let (owner, epoch) = (&g["shards"][0]["owner"], &g["shards"][0]["epoch"]);
    let ok = json!({"worker": owner, "epoch": epoch, "sequence_number": "12"});
    assert_eq!(cp(&shard(0), ok).await.status, 200);
    let text = app
        .client
        .put(app.url("/streams/s/workers/w"))
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(text.status(), 415);
}

#[tokio::test]
async fn lease_changes_need_the_token() {
    let app =
        spawn_app_with(|c| c.token = Some("lease-token-0123456789abcdef".parse().unwrap())).await;
    let authorized = |r: reqwest::RequestBuilder| r.bearer_auth("lease-token-0123456789abcdef");
    let put = authorized(app.client.put(app.url("/streams/s")))
        .json(&json!({"shard_count": 2}))
        .send()
        .await
        .unwrap();
    assert_eq!(put.status(), 201);
    let calls = [
        (Method::PUT, "/streams/s/workers/w", None),
        (Method::DELETE, "/streams/s/workers/w", None),
        (
            Method::PUT,
            "/streams/s/leases/shardId-000000000000/checkpoint",
            Some(json!({"worker": "w", "epoch": 1, "sequence_number": "1"})),
        ),
    ];
    for (method, path, body) in &calls {
        let answer = app.call(method.clone(), path, body.clone()).await;
        assert_problem(&answer, 401, "token");
    }
    let joined = authorized(app.client.put(app.url("/streams/s/workers/w")))
        .send()
        .await
        .unwrap();
    assert_eq!(joined.status(), 200);
    assert_eq!(
        app.get("/streams/s/leases").await.status,
        200,
        "reads need no token"
    );
}

#[tokio::test]
async fn a_worker_whose_shards_grow_heavy_gives_one_up() {
    let app = spawn_assigning_every_join().await;
    put_stream(&app, "s", json!({"shard_count": 8, "primary": true})).await;
    for i in 0..8 {
        app.allocate(&format!("acct-{i}")).await;
    }
    for _ in 0..3 {
        for w in ["a", "b"] {
            heartbeat(&app, "s", w, 30).await;
        }
    }
    let settled = group(&app, "s").await;
    let a_shards: Vec<Value> = settled["workers"][0]["shards"].as_array().unwrap().clone();
    assert_eq!(
        (settled["workers"][0]["worker"].as_str(), a_shards.len()),
        (Some("a"), 4),
        "{settled}"
    );
    // Every account on a's shards gets ten times heavier: a holds 40 of 44, over the
    // mean (22) plus the heaviest shard (10).
    for i in 0..8 {
        let on = app
            .get(&format!("/shard-of?account=acct-{i}&stream=s"))
            .await;
        if a_shards.contains(&on.body["shard_id"]) {
            let heavier = app
                .call(
                    Method::PATCH,
                    &format!("/keys/acct-{i}"),
                    Some(json!({"weight": 10})),
                )
                .await;
            assert_eq!(heavier.status, 200, "{}", heavier.body);
        }
    }
    // Weights are checked at most every WEIGHT_RECHECK_MS (5 s) after an assignment.
    tokio::time::sleep(Duration::from_millis(5_100)).await;
    heartbeat(&app, "s", "b", 30).await;
    heartbeat(&app, "s", "a", 30).await;
    heartbeat(&app, "s", "a", 30).await;
    heartbeat(&app, "s", "b", 30).await;
    let after = group(&app, "s").await;
    let loads: Vec<u64> = after["workers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w["weight"].as_u64().unwrap())
        .collect();
    assert_eq!(
        loads,
        [30, 14],
        "one heavy shard moved from a to b, nothing else: {after}"
    );
    let before = owners(&settled);
    let moved = owners(&after)
        .iter()
        .filter(|(id, o)| before[*id] != **o)
        .count();
    assert_eq!(moved, 1);
}

#[tokio::test]
async fn joins_close_together_are_assigned_together() {
    // The default: joins within a second of the last assignment wait for the next one.
    let app = spawn_app().await;
    put_stream(&app, "s", json!({"shard_count": 4})).await;
    let first = heartbeat(&app, "s", "w1", 30).await;
    assert_eq!(
        held(&first).len(),
        4,
        "the first worker is assigned at once: {first}"
    );
    let joined = heartbeat(&app, "s", "w2", 30).await;
    assert_eq!(leases_of(&joined).len(), 0);
    // Within the batch: nothing is revoked yet.
    let still = heartbeat(&app, "s", "w1", 30).await;
    assert_eq!(held(&still).len(), 4, "{still}");
    let g = group(&app, "s").await;
    assert!(
        g["shards"]
            .as_array()
            .unwrap()
            .iter()
            .all(|s| s["state"] == "held" && s["owner"] == "w1")
    );
    tokio::time::sleep(Duration::from_millis(1_050)).await;
    // The next heartbeat of any worker assigns every join since.
    let told = heartbeat(&app, "s", "w1", 30).await;
    let revoking = leases_of(&told)
        .values()
        .filter(|(s, _)| s == "revoking")
        .count();
    assert_eq!(revoking, 2, "{told}");
}

#[tokio::test]
async fn a_group_holds_at_most_ten_thousand_workers() {
    let app = spawn_assigning_every_join().await;
    put_stream(&app, "s", json!({"shard_count": 2})).await;
    let mut db = app.db().await;
    db.execute(
        "INSERT INTO lease_workers (stream, worker, ttl_ms, expires_at, joined_at) \
         WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 9999) \
         SELECT 's', 'filler-' || i, 600000, 99999999999999, 0 FROM n",
        &[],
    )
    .await;
    heartbeat(&app, "s", "the-last", 30).await;
    let full = app
        .call(Method::PUT, "/streams/s/workers/one-too-many", None)
        .await;
    assert_problem(&full, 409, "10000 workers");
    assert_eq!(full.body["type"], "urn:keyspread:problem:group-full");
    // A member heartbeats on; a leaver makes room.
    heartbeat(&app, "s", "the-last", 30).await;
    assert_eq!(app.delete("/streams/s/workers/filler-1").await.status, 204);
    heartbeat(&app, "s", "one-too-many", 30).await;
}

/// A heartbeat reads the worker's own leases through the owner index, so it costs
/// O(its own leases) however many shards the stream has: the very SQL the store sends.
#[tokio::test]
async fn a_heartbeat_reads_its_own_leases_through_the_owner_index() {
    let app = spawn_app().await;
    let mut db = app.db().await;
    // 10,000 shards held by 1,000 workers.
    db.execute_script(
        "WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i < 9999) \
         INSERT INTO leases (stream, shard_id, owner, epoch) \
         SELECT 's', 'shardId-' || i, 'w' || (i % 1000), 1 FROM n",
    )
    .await;
    if app.config.database_url.starts_with("postgres") {
        // Postgres plans by statistics, which autovacuum keeps; SQLite has none unless
        // someone runs ANALYZE, so its plan is the one a fresh database gets.
        db.execute_script("ANALYZE leases").await;
    }
    let plan = db
        .query_plan(keyspread::store::leases::OWNED_LEASES, &["s", "w7"])
        .await;
    assert!(
        plan.contains("leases_owner") && !plan.contains("Seq Scan"),
        "the owned leases are not read through the owner index:\n{plan}"
    );
}

/// `SHARD_END` says a closed shard was read to its end; an open shard has no end yet, and
/// ending it would leave it unread for good.
#[tokio::test]
async fn shard_end_on_an_open_shard_is_refused_and_it_stays_leased() {
    let app = spawn_assigning_every_join().await;
    put_stream(&app, "o", json!({"shard_count": 2})).await;
    let w1 = heartbeat(&app, "o", "w1", 30).await;
    assert_eq!(held(&w1), [shard(0), shard(1)], "{w1}");
    assert_problem(
        &checkpoint(&app, "o", &shard(0), "w1", 1, "SHARD_END").await,
        409,
        "still open",
    );
    let s = group(&app, "o").await;
    assert_eq!(s["shards"][0]["state"], "held", "{s}");
    assert!(s["shards"][0]["checkpoint"].is_null(), "{s}");

    // A second worker gets its share of both shards.
    heartbeat(&app, "o", "w2", 30).await;
    heartbeat(&app, "o", "w1", 30).await;
    heartbeat(&app, "o", "w1", 30).await;
    let w2 = heartbeat(&app, "o", "w2", 30).await;
    assert_eq!(held(&w2).len(), 1, "{w2}");
}

/// A map that drops a shard a live worker reads takes it to nobody, fenced: the worker is
/// told `revoking` at its next heartbeat, and a map that lists the shard again hands it to
/// another worker only through the usual revocation, never `held` to two live workers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shard_dropped_and_listed_again_is_never_held_by_two_live_workers() {
    let app = spawn_assigning_every_join().await;
    put_stream(&app, "s", json!({"shard_count": 4})).await;
    let first = heartbeat(&app, "s", "w1", 60).await;
    assert_eq!(held(&first).len(), 4, "{first}");
    let told = leases_of(&first);

    // Shards 2 and 3 leave the map; another worker's join assigns over it while w1, which
    // still reads them, has not heartbeated.
    put_stream(&app, "s", json!({"shard_count": 2})).await;
    heartbeat(&app, "s", "w0", 60).await;
    put_stream(&app, "s", json!({"shard_count": 4})).await;
    let w0 = heartbeat(&app, "s", "w0", 60).await;
    for shard in ["shardId-000000000002", "shardId-000000000003"] {
        assert!(
            !held(&w0).contains(&shard.to_owned()),
            "{shard} told held to w0 while w1 still reads it at epoch {:?}: {w0}",
            told[shard]
        );
    }
    // w1 hears of it, stops, and then the shards pass on with their epochs raised.
    let w1 = heartbeat(&app, "s", "w1", 60).await;
    let w1_leases = leases_of(&w1);
    assert!(
        ["shardId-000000000002", "shardId-000000000003"]
            .iter()
            .any(|s| w1_leases
                .get(*s)
                .is_some_and(|(state, _)| state == "revoking")),
        "{w1}"
    );
    heartbeat(&app, "s", "w1", 60).await;
    let w0 = heartbeat(&app, "s", "w0", 60).await;
    for (shard, (state, epoch)) in leases_of(&w0) {
        if state == "held" && told.contains_key(&shard) && told[&shard].1 >= epoch {
            panic!(
                "{shard} passed to w0 at epoch {epoch}, not above w1's {:?}",
                told[&shard]
            );
        }
    }
}
