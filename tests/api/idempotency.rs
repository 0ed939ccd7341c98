//! `Idempotency-Key` on every change: a repeat of a request is answered its first committed
//! answer without being applied again; the key with another request is 422; a refusal is
//! not kept; the answer is kept per token, in the database (any replica replays it).

use reqwest::Method;
use serde_json::{Value, json};

use crate::helpers::{Db, TestApp, spawn_app, spawn_app_with};

/// One answer: status, whether it was replayed, content type and raw body.
#[derive(Debug, Clone, PartialEq)]
struct Told {
    status: u16,
    replayed: bool,
    content_type: String,
    body: String,
}

impl Told {
    fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or(Value::Null)
    }

    /// Whether `again` is this answer told again: the same status, type and bytes.
    fn same_as(&self, again: &Told) -> bool {
        (self.status, &self.content_type, &self.body)
            == (again.status, &again.content_type, &again.body)
    }
}

async fn send(
    app: &TestApp,
    method: Method,
    path: &str,
    body: Option<Value>,
    key: Option<&str>,
    token: Option<&str>,
) -> Told {
    let mut request = app.client.request(method, app.url(path));
    if let Some(key) = key {
        request = request.header("Idempotency-Key", key);
    }
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    if let Some(body) = body {
        request = request.json(&body);
    }
    let response = request.send().await.expect("request sent");
    let header = |name: &str| {
        (response.headers().get(name))
            .map(|v| v.to_str().unwrap().to_owned())
            .unwrap_or_default()
    };
    let (replayed, content_type) = (
        header("idempotent-replayed") == "true",
        header("content-type"),
    );
    Told {
        status: response.status().as_u16(),
        replayed,
        content_type,
        body: response.text().await.unwrap(),
    }
}

async fn keyed(app: &TestApp, method: Method, path: &str, body: Option<Value>, key: &str) -> Told {
    send(app, method, path, body, Some(key), None).await
}

async fn event_count(app: &TestApp) -> usize {
    app.db().await.events().await.len()
}

/// Sends a change twice with one key: the second answer is the first told again, marked
/// replayed, and the log holds no more events than after the first.
async fn replayed(
    app: &TestApp,
    method: Method,
    path: &str,
    body: Option<Value>,
    key: &str,
) -> Told {
    let first = keyed(app, method.clone(), path, body.clone(), key).await;
    assert!(!first.replayed, "{method} {path}: {first:?}");
    let events = event_count(app).await;
    let again = keyed(app, method.clone(), path, body, key).await;
    assert!(
        again.replayed && first.same_as(&again),
        "{method} {path} again: {again:?}, first {first:?}"
    );
    assert_eq!(
        event_count(app).await,
        events,
        "{method} {path} was applied again"
    );
    first
}

#[tokio::test]
async fn every_change_repeated_with_its_key_is_replayed_not_redone() {
    let app = spawn_app().await;
    let allocated = replayed(&app, Method::POST, "/keys/acme", None, "k-allocate").await;
    assert_eq!(allocated.status, 201, "a replayed allocation is 201 again");
    let batch = json!({"accounts": [{"account": "b1"}, {"account": "b2", "fanout": 2}]});
    let batch = replayed(&app, Method::POST, "/keys/batch", Some(batch), "k-batch").await;
    assert_eq!((batch.status, &batch.json()["created"]), (200, &json!(2)));
    let weighed = replayed(
        &app,
        Method::PATCH,
        "/keys/acme",
        Some(json!({"weight": 5})),
        "k-patch",
    )
    .await;
    assert_eq!(
        (weighed.status, &weighed.json()["weight"]),
        (200, &json!(5))
    );
    let stream = json!({"shard_count": 4});
    let put = replayed(&app, Method::PUT, "/streams/s", Some(stream), "k-put").await;
    assert_eq!(put.status, 201, "{}", put.body);
    let preview = app.get("/rebalance/preview?shards=4").await;
    let plan = json!({"plan_id": preview.body["plan_id"], "switch_after_s": 0});
    let applied = replayed(&app, Method::POST, "/rebalance", Some(plan), "k-apply").await;
    assert_eq!(applied.status, 200, "{}", applied.body);
    let joined = replayed(
        &app,
        Method::PUT,
        "/streams/s/workers/w1",
        Some(json!({"ttl_s": 60})),
        "k-join",
    )
    .await;
    assert_eq!(joined.status, 200, "{}", joined.body);
    let lease = &joined.json()["leases"][0];
    let checkpoint = json!({"worker": "w1", "epoch": lease["epoch"], "sequence_number": "7"});
    let path = format!(
        "/streams/s/leases/{}/checkpoint",
        lease["shard_id"].as_str().unwrap()
    );
    let checkpointed = replayed(&app, Method::PUT, &path, Some(checkpoint), "k-check").await;
    assert_eq!(checkpointed.status, 200, "{}", checkpointed.body);
    let left = replayed(
        &app,
        Method::DELETE,
        "/streams/s/workers/w1",
        None,
        "k-leave",
    )
    .await;
    assert_eq!(left.status, 204);
    let released = replayed(&app, Method::DELETE, "/keys/acme", None, "k-release").await;
    assert_eq!(released.status, 204, "a replayed release is 204 again");
    let deleted = replayed(&app, Method::DELETE, "/streams/s", None, "k-delete").await;
    assert_eq!(deleted.status, 204);
}

/// A release repeated with its key after the account was taken up again is told 204 and
/// changes nothing: the account keeps its new key. Without the key it would be released.
#[tokio::test]
async fn a_replayed_release_never_undoes_a_later_allocation() {
    let app = spawn_app().await;
    app.allocate("acme").await;
    let first = keyed(&app, Method::DELETE, "/keys/acme", None, "r-1").await;
    assert_eq!(first.status, 204);
    let key = app.allocate("acme").await;
    let again = keyed(&app, Method::DELETE, "/keys/acme", None, "r-1").await;
    assert_eq!((again.status, again.replayed), (204, true));
    let now = app.get("/keys/acme").await;
    assert_eq!(
        (now.status, now.body["hash_key"].as_str()),
        (200, Some(key.as_str()))
    );
}

/// An answer decided without a change is kept too: a release of an account without a key
/// (404) is told 404 again after the account got one, and nothing is released.
#[tokio::test]
async fn an_answer_that_changed_nothing_is_kept_too() {
    let app = spawn_app().await;
    let first = keyed(&app, Method::DELETE, "/keys/ghost", None, "g-1").await;
    assert_eq!(first.status, 404);
    app.allocate("ghost").await;
    let again = keyed(&app, Method::DELETE, "/keys/ghost", None, "g-1").await;
    assert!(again.replayed && first.same_as(&again), "{again:?}");
    assert_eq!(app.get("/keys/ghost").await.status, 200);
    // An allocation the account already had: 200, told 200 again after its release.
    let had = keyed(&app, Method::POST, "/keys/ghost", None, "g-2").await;
    assert_eq!(had.status, 200);
    assert_eq!(app.delete("/keys/ghost").await.status, 204);
    let again = keyed(&app, Method::POST, "/keys/ghost", None, "g-2").await;
    assert!(again.replayed && had.same_as(&again), "{again:?}");
    assert_eq!(
        app.get("/keys/ghost").await.status,
        404,
        "not allocated again"
    );
}

#[tokio::test]
async fn the_key_with_another_request_is_422_and_bad_keys_are_400() {
    let app = spawn_app().await;
    assert_eq!(
        keyed(&app, Method::POST, "/keys/a", None, "same")
            .await
            .status,
        201
    );
    for (method, path, body) in [
        (Method::POST, "/keys/b", None),
        (Method::POST, "/keys/a", Some(json!({"weight": 2}))),
        (Method::DELETE, "/keys/a", None),
    ] {
        let reused = keyed(&app, method.clone(), path, body, "same").await;
        assert_eq!(reused.status, 422, "{method} {path}: {reused:?}");
        assert!(
            reused.json()["type"]
                .as_str()
                .unwrap()
                .ends_with("idempotency-key-reused")
        );
    }
    assert_eq!(app.get("/keys/b").await.status, 404);
    let long = "x".repeat(256);
    for bad in [long.as_str(), "clé", "tab\tinside"] {
        let refused = keyed(&app, Method::POST, "/keys/c", None, bad).await;
        assert_eq!(refused.status, 400, "{bad:?}: {refused:?}");
    }
    // The draft's quoted form names the same key as the bare one.
    let quoted = keyed(&app, Method::POST, "/keys/d", None, "\"q-1\"").await;
    assert_eq!(quoted.status, 201);
    let bare = keyed(&app, Method::POST, "/keys/d", None, "q-1").await;
    assert!(bare.replayed, "{bare:?}");
    let longest = "y".repeat(255);
    assert_eq!(
        keyed(&app, Method::POST, "/keys/e", None, &longest)
            .await
            .status,
        201
    );
}

/// Keys are per token: two tokens may use one key for their own requests.
#[tokio::test]
async fn keys_are_kept_per_token() {
    let dir = tempfile::tempdir().unwrap();
    let tokens = crate::roles::write_tokens_file(dir.path());
    let app = spawn_app_with(|c| c.tokens_file = Some(tokens)).await;
    let producers = crate::roles::token_of("producers");
    let ops = crate::roles::token_of("ops");
    let a = send(
        &app,
        Method::POST,
        "/keys/p",
        None,
        Some("shared"),
        Some(&producers),
    )
    .await;
    let b = send(
        &app,
        Method::POST,
        "/keys/o",
        None,
        Some("shared"),
        Some(&ops),
    )
    .await;
    assert_eq!((a.status, b.status), (201, 201), "{a:?} {b:?}");
    let again = send(
        &app,
        Method::POST,
        "/keys/o",
        None,
        Some("shared"),
        Some(&ops),
    )
    .await;
    assert!(again.replayed && b.same_as(&again), "{again:?}");
}

/// A change refused for the moment (503: the write lock held by another session past the
/// change's deadline) is not kept: sent again with the key once the lock is free, it is
/// applied as new.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusal_is_not_kept_and_a_retry_is_applied_as_new() {
    let app = spawn_app_with(|c| c.request_timeout_secs = 3).await;
    let mut lock = Db::connect(&app.config.database_url).await;
    lock.hold_write_lock().await;
    let refused = keyed(&app, Method::POST, "/keys/held", None, "h-1").await;
    assert!(matches!(refused.status, 503 | 408), "{refused:?}");
    lock.release_write_lock().await;
    let retried = keyed(&app, Method::POST, "/keys/held", None, "h-1").await;
    assert_eq!(
        (retried.status, retried.replayed),
        (201, false),
        "{retried:?}"
    );
}

/// While the first request with a key is being made, a second with the same key is 409
/// (here the first waits for the write lock another session holds); then it is replayed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repeat_while_the_first_is_in_flight_is_409() {
    let app = spawn_app().await;
    let mut lock = Db::connect(&app.config.database_url).await;
    lock.hold_write_lock().await;
    let first = tokio::spawn({
        let (client, url) = (app.client.clone(), app.url("/keys/slow"));
        async move {
            let sent = client
                .post(url)
                .header("Idempotency-Key", "f-1")
                .send()
                .await;
            sent.unwrap().status().as_u16()
        }
    });
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let second = keyed(&app, Method::POST, "/keys/slow", None, "f-1").await;
    assert_eq!(second.status, 409, "{second:?}");
    assert!(
        second.json()["type"]
            .as_str()
            .unwrap()
            .ends_with("idempotency-key-in-use")
    );
    lock.release_write_lock().await;
    assert_eq!(first.await.unwrap(), 201);
    let third = keyed(&app, Method::POST, "/keys/slow", None, "f-1").await;
    assert_eq!((third.status, third.replayed), (201, true));
}

/// Kept in the database: a replica that did not make the change replays it.
#[tokio::test]
async fn any_replica_replays_a_kept_answer() {
    let a = spawn_app().await;
    let b = spawn_app_with(|c| c.database_url = a.config.database_url.clone()).await;
    let first = keyed(&a, Method::POST, "/keys/shared", None, "x-1").await;
    assert_eq!(first.status, 201);
    let again = keyed(&b, Method::POST, "/keys/shared", None, "x-1").await;
    assert!(again.replayed && first.same_as(&again), "{again:?}");
}

/// The bound on kept answers holds on both backends: an actor's oldest go first, other
/// actors' stay.
#[tokio::test]
async fn kept_answers_are_bounded_per_actor() {
    let app = spawn_app().await;
    for i in 0..15 {
        let sent = keyed(
            &app,
            Method::POST,
            &format!("/keys/b-{i}"),
            None,
            &format!("b-{i}"),
        )
        .await;
        assert_eq!(sent.status, 201);
    }
    let store = keyspread::store::Store::connect(&app.config.database_url)
        .await
        .unwrap();
    let other = keyspread::store::Actor::new("other");
    let kept = keyspread::store::Kept {
        fingerprint: [1; 32],
        status: 204,
        content_type: None,
        body: Vec::new(),
    };
    assert!(store.keep_alone(&other, "o-1", &kept, 0).await.unwrap());
    assert_eq!(store.forget_kept(-1, 5, 1 << 30).await.unwrap(), 10);
    let loopback = keyspread::store::Actor::loopback();
    let mut held = Vec::new();
    for i in 0..15 {
        if store
            .kept(&loopback, &format!("b-{i}"), 0)
            .await
            .unwrap()
            .is_some()
        {
            held.push(i);
        }
    }
    assert_eq!(held, (10..15).collect::<Vec<_>>(), "the newest five stay");
    assert!(store.kept(&other, "o-1", -1).await.unwrap().is_some());
}
