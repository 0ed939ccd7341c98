//! Allocate, look up, reweight, release and list.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use reqwest::Method;
use serde_json::json;

use crate::helpers::{Answer, Db, TestApp, assert_problem, spawn_app, spawn_app_with};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allocate_is_idempotent() {
    let app = spawn_app().await;
    let first = app.post("/keys/acme", None).await;
    assert_eq!(first.status, 201);
    assert_eq!(first.body["account"], "acme");
    assert_eq!(
        first.body["hash_key"],
        "170141183460469231731687303715884105728"
    );
    assert_eq!(first.body["weight"], 1);
    assert!(first.body["created_at"].as_str().unwrap().ends_with('Z'));

    let again = app.post("/keys/acme", Some(json!({"weight": 7}))).await;
    assert_eq!(again.status, 200);
    assert_eq!(
        again.body, first.body,
        "a repeat answers the same assignment"
    );

    let looked_up = app.get("/keys/acme").await;
    assert_eq!(looked_up.status, 200);
    assert_eq!(looked_up.body, first.body);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn golden_sequence_over_http() {
    let app = spawn_app_with(|c| c.keyspace_bits = 7).await;
    let mut keys = Vec::new();
    for i in 0..15 {
        keys.push(app.allocate(&format!("acct-{i}")).await);
    }
    let expected = [64, 32, 96, 16, 80, 48, 112, 8, 72, 40, 104, 24, 88, 56, 120];
    assert_eq!(keys, expected.map(|k| k.to_string()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn weights_are_stored_and_validated() {
    let app = spawn_app().await;
    let heavy = app
        .post("/keys/heavy", Some(json!({"weight": 1_000_000})))
        .await;
    assert_eq!(
        (heavy.status, heavy.body["weight"].as_u64()),
        (201, Some(1_000_000))
    );
    // A body left out is fine; one that is sent must be the documented object.
    assert_problem(
        &app.post("/keys/nullish", Some(serde_json::Value::Null))
            .await,
        422,
        "expected struct AllocateRequest",
    );
    let whole = app.post("/keys/whole", Some(json!({"weight": 3.0}))).await;
    assert_eq!(
        (whole.status, whole.body["weight"].as_u64()),
        (201, Some(3))
    );
    for bad in [json!({"weight": 0}), json!({"weight": 1_000_001})] {
        assert_problem(
            &app.post("/keys/bad", Some(bad)).await,
            422,
            "weight must be between 1 and 1000000",
        );
    }
    assert_problem(
        &app.post("/keys/bad", Some(json!({"weight": -1}))).await,
        422,
        "weight",
    );
    assert_problem(
        &app.post("/keys/bad", Some(json!({"weight": "3"}))).await,
        422,
        "weight",
    );
    assert_problem(
        &app.post("/keys/bad", Some(json!({"wieght": 3}))).await,
        422,
        "unknown field",
    );
    assert_eq!(
        app.get("/keys/bad").await.status,
        404,
        "nothing allocated on bad input"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_allocate_body_may_be_left_out() {
    let app = spawn_app().await;
    // Some generated clients send a JSON content type with no body at all.
    let empty = app
        .client
        .post(app.url("/keys/a"))
        .header("content-type", "application/json")
        .send()
        .await
        .unwrap();
    assert_eq!(empty.status(), 201);
    let not_json = app
        .client
        .post(app.url("/keys/b"))
        .header("content-type", "text/plain")
        .body("weight=3")
        .send()
        .await
        .unwrap();
    assert_problem(&crate::helpers::answer(not_json).await, 415, "must be JSON");
    let untyped = app
        .client
        .post(app.url("/keys/c"))
        .body("{\"weight\": 2}")
        .send()
        .await
        .unwrap();
    assert_problem(
        &crate::helpers::answer(untyped).await,
        415,
        "Content-Type: application/json",
    );
    let merge = app
        .client
        .post(app.url("/keys/d"))
        .header("content-type", "application/merge-patch+json")
        .body("{\"weight\": 2}")
        .send()
        .await
        .unwrap();
    assert_eq!(merge.status(), 201);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reweight_keeps_the_key() {
    let app = spawn_app().await;
    let key = app.allocate("acme").await;
    let changed = app
        .call(Method::PATCH, "/keys/acme", Some(json!({"weight": 5})))
        .await;
    assert_eq!(changed.status, 200);
    assert_eq!(
        (
            changed.body["hash_key"].as_str(),
            changed.body["weight"].as_u64()
        ),
        (Some(key.as_str()), Some(5))
    );
    assert_eq!(app.get("/keys/acme").await.body["weight"], 5);
    assert_problem(
        &app.call(Method::PATCH, "/keys/ghost", Some(json!({"weight": 2})))
            .await,
        404,
        "ghost",
    );
    assert_problem(
        &app.call(Method::PATCH, "/keys/acme", Some(json!({"weight": 0})))
            .await,
        422,
        "weight",
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn account_ids_are_validated() {
    let app = spawn_app().await;
    let long = "x".repeat(257);
    assert_problem(
        &app.post(&format!("/keys/{long}"), None).await,
        400,
        "1 to 256 bytes",
    );
    assert_problem(
        &app.get(&format!("/keys/{long}")).await,
        400,
        "1 to 256 bytes",
    );
    assert_problem(
        &app.post("/keys/a%0Ab", None).await,
        400,
        "control characters",
    );
    assert_problem(&app.delete("/keys/a%7Fb").await, 400, "control characters");
    // Percent-encoded UTF-8 is an ordinary account.
    let unicode = app.post("/keys/%E8%B4%A6%E6%88%B7", None).await;
    assert_eq!(
        (unicode.status, unicode.body["account"].as_str()),
        (201, Some("账户"))
    );
    let max = "y".repeat(256);
    assert_eq!(app.post(&format!("/keys/{max}"), None).await.status, 201);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_frees_the_key_for_the_next_account() {
    let app = spawn_app_with(|c| c.keyspace_bits = 7).await;
    for account in ["a", "b", "c"] {
        app.allocate(account).await;
    }
    let released = app.delete("/keys/b").await;
    assert_eq!((released.status, released.body.is_null()), (204, true));
    assert_problem(&app.get("/keys/b").await, 404, "account b has no hash key");
    assert_problem(&app.delete("/keys/b").await, 404, "account b");
    // b held 32; the walk refills it first.
    assert_eq!(app.allocate("d").await, "32");
}

/// A row changed behind the log (here deleted by hand, logging nothing) fails its own
/// release only: 409 and nothing logged for it, while a release queued with it commits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_of_a_row_changed_behind_the_log_fails_alone() {
    let app = spawn_app().await;
    for account in ["acme", "globex"] {
        app.allocate(account).await;
    }
    let mut db = app.db().await;
    // Both releases queue while another writer holds the lock, so they may share a group.
    db.hold_write_lock().await;
    let mut tasks = tokio::task::JoinSet::new();
    for account in ["acme", "globex"] {
        let (client, url) = (app.client.clone(), app.url(&format!("/keys/{account}")));
        tasks.spawn(async move { (account, client.delete(url).send().await.unwrap().status()) });
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    db.delete_assignment("acme").await;
    db.commit().await;
    let mut statuses = Vec::new();
    while let Some(answer) = tasks.join_next().await {
        let (account, status) = answer.unwrap();
        statuses.push((account, status.as_u16()));
    }
    statuses.sort();
    assert_eq!(statuses, [("acme", 409), ("globex", 204)]);
    let released: Vec<_> = db
        .events()
        .await
        .into_iter()
        .filter(|e| e.0 == "release")
        .map(|e| e.1)
        .collect();
    assert_eq!(released, [Some("globex".to_owned())]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_pages_by_account() {
    let app = spawn_app().await;
    for account in ["e", "a", "d", "b", "c"] {
        app.allocate(account).await;
    }
    let mut seen = Vec::new();
    let mut path = "/keys?limit=2".to_owned();
    loop {
        let page = app.get(&path).await;
        assert_eq!(page.status, 200);
        let items = page.body["items"].as_array().unwrap();
        assert!(items.len() <= 2);
        seen.extend(
            items
                .iter()
                .map(|i| i["account"].as_str().unwrap().to_owned()),
        );
        match page.body["next"].as_str() {
            Some(next) => path = format!("/keys?limit=2&after={next}"),
            None => break,
        }
    }
    assert_eq!(seen, ["a", "b", "c", "d", "e"]);
    let all = app.get("/keys").await;
    assert_eq!(
        (
            all.body["items"].as_array().unwrap().len(),
            all.body["next"].is_null()
        ),
        (5, true)
    );
    assert_problem(&app.get("/keys?limit=0").await, 400, "limit");
    assert_problem(&app.get("/keys?limit=1001").await, 400, "limit");
    assert_problem(&app.get("/keys?limit=many").await, 400, "limit");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_allocations_never_share_a_key() {
    let app = spawn_app().await;
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..64 {
        let (client, url) = (
            app.client.clone(),
            app.url(&format!("/keys/acct-{}", i % 32)),
        );
        tasks.spawn(async move {
            client
                .post(url)
                .send()
                .await
                .unwrap()
                .json::<serde_json::Value>()
                .await
                .unwrap()
        });
    }
    let mut by_account = std::collections::HashMap::new();
    while let Some(body) = tasks.join_next().await {
        let body = body.unwrap();
        let key = body["hash_key"].as_str().unwrap().to_owned();
        let account = body["account"].as_str().unwrap().to_owned();
        let previous = by_account.insert(account.clone(), key.clone());
        assert!(previous.is_none_or(|p| p == key), "{account} got two keys");
    }
    let keys: std::collections::HashSet<_> = by_account.values().collect();
    assert_eq!(
        (by_account.len(), keys.len()),
        (32, 32),
        "32 accounts, 32 distinct keys"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lookups_carry_an_etag_and_revalidate() {
    let cache = "no-cache, max-age=60";
    let app = spawn_app_with(|c| c.lookup_cache_control = cache.parse().unwrap()).await;
    app.allocate("acme").await;
    let first = app.client.get(app.url("/keys/acme")).send().await.unwrap();
    assert_eq!(first.status(), 200);
    assert_eq!(first.headers()["cache-control"], cache);
    let etag = first.headers()["etag"].to_str().unwrap().to_owned();
    assert!(
        etag.starts_with('"') && etag.ends_with('"'),
        "strong tag: {etag}"
    );

    let revalidate = |tag: String| {
        let request = app
            .client
            .get(app.url("/keys/acme"))
            .header("if-none-match", tag);
        async move { request.send().await.unwrap() }
    };
    let unchanged = revalidate(etag.clone()).await;
    assert_eq!(unchanged.status(), 304);
    assert_eq!(unchanged.headers()["etag"], etag.as_str());
    assert!(unchanged.bytes().await.unwrap().is_empty());
    assert_eq!(
        revalidate(format!("\"other\", W/{etag}")).await.status(),
        304
    );
    assert_eq!(revalidate("*".into()).await.status(), 304);
    assert_eq!(revalidate("\"stale\"".into()).await.status(), 200);

    // Any change to the assignment changes the tag.
    app.call(Method::PATCH, "/keys/acme", Some(json!({"weight": 2})))
        .await;
    let changed = revalidate(etag.clone()).await;
    assert_eq!(changed.status(), 200);
    assert_ne!(changed.headers()["etag"], etag.as_str());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_allocate_together_and_idempotently() {
    let app = spawn_app_with(|c| c.keyspace_bits = 7).await;
    app.allocate("old").await; // 64
    let body =
        json!({"accounts": [{"account": "old"}, {"account": "a", "weight": 2}, {"account": "b"}]});
    let answer = app.post("/keys/batch", Some(body.clone())).await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    assert_eq!(
        (
            answer.body["created"].as_u64(),
            answer.body["existing"].as_u64()
        ),
        (Some(2), Some(1))
    );
    let keys: Vec<&str> = answer.body["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["hash_key"].as_str().unwrap())
        .collect();
    // In request order, each new key steering the next as if allocated one by one.
    assert_eq!(keys, ["64", "32", "96"]);
    assert_eq!(answer.body["items"][1]["weight"], 2);
    assert_eq!(app.get("/keys/b").await.body["hash_key"], "96");
    // The same batch again changes nothing.
    let again = app.post("/keys/batch", Some(body)).await;
    assert_eq!(
        (
            again.body["created"].as_u64(),
            again.body["items"][2]["hash_key"].as_str()
        ),
        (Some(0), Some("96"))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_batch_allocates_nothing() {
    let app = spawn_app().await;
    let bad = |accounts: serde_json::Value| json!({ "accounts": accounts });
    assert_problem(
        &app.post("/keys/batch", Some(bad(json!([])))).await,
        422,
        "1 to 10000 accounts",
    );
    assert_problem(
        &app.post(
            "/keys/batch",
            Some(bad(json!([{"account": "a"}, {"account": "a"}]))),
        )
        .await,
        422,
        "accounts[1]: a appears twice",
    );
    assert_problem(
        &app.post(
            "/keys/batch",
            Some(bad(json!([{"account": "a"}, {"account": ""}]))),
        )
        .await,
        422,
        "accounts[1]: account id must be 1 to 256 bytes",
    );
    assert_problem(
        &app.post(
            "/keys/batch",
            Some(bad(json!([{"account": "a", "weight": 0}]))),
        )
        .await,
        422,
        "accounts[0]: weight",
    );
    let many: Vec<_> = (0..10_001)
        .map(|i| json!({"account": format!("a{i}")}))
        .collect();
    assert_problem(
        &app.post("/keys/batch", Some(bad(json!(many)))).await,
        422,
        "got 10001",
    );
    assert_eq!(
        app.get("/keys/a").await.status,
        404,
        "nothing was allocated"
    );
    // The bulk route's name is reserved as an account id.
    assert_problem(&app.get("/keys/batch").await, 405, "GET is not allowed");
    assert_problem(
        &app.post("/keys/batch", Some(bad(json!([{"account": "batch"}]))))
            .await,
        422,
        "reserved",
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_batch_of_ten_thousand() {
    let app = spawn_app().await;
    let accounts: Vec<_> = (0..10_000)
        .map(|i| json!({"account": format!("acct-{i:05}")}))
        .collect();
    let answer = app
        .post("/keys/batch", Some(json!({ "accounts": accounts })))
        .await;
    assert_eq!(
        (answer.status, answer.body["created"].as_u64()),
        (200, Some(10_000))
    );
    let d = app.get("/distribution?shards=16").await.body;
    assert_eq!(
        (d["skew"]["max"].as_u64(), d["skew"]["min"].as_u64()),
        (Some(625), Some(625))
    );
    let events = app.db().await.events().await;
    assert_eq!(events.len(), 10_000);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_new_accounts_all_commit_with_distinct_keys() {
    let app = spawn_app().await;
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..64 {
        let (client, url) = (app.client.clone(), app.url(&format!("/keys/group-{i}")));
        tasks.spawn(async move { client.post(url).send().await.unwrap().status() });
    }
    while let Some(status) = tasks.join_next().await {
        assert_eq!(status.unwrap(), 201);
    }
    let events = app.db().await.events().await;
    assert_eq!(events.len(), 64);
    let keys: std::collections::HashSet<_> = events.iter().map(|e| e.4.clone()).collect();
    assert_eq!(keys.len(), 64, "one key never twice");
    assert_eq!(app.db().await.assignments().await.len(), 64);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_failing_allocation_does_not_fail_its_group() {
    // Four keys in a 2-bit keyspace: eight concurrent accounts, four get one.
    let app = spawn_app_with(|c| c.keyspace_bits = 2).await;
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..8 {
        let (client, url) = (app.client.clone(), app.url(&format!("/keys/tiny-{i}")));
        tasks.spawn(async move { client.post(url).send().await.unwrap().status().as_u16() });
    }
    let mut statuses = Vec::new();
    while let Some(status) = tasks.join_next().await {
        statuses.push(status.unwrap());
    }
    statuses.sort();
    assert_eq!(statuses, [201, 201, 201, 201, 409, 409, 409, 409]);
}

/// Lookups are answered from memory and never queue behind a write: they answer while an
/// allocation waits for the database's write lock (held here by another writer).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lookups_answer_while_an_allocation_waits() {
    let app = spawn_app().await;
    let key = app.allocate("acme").await;
    let mut db = app.db().await;
    let mut allocation = allocation_behind_the_lock(&app, &mut db, "/keys/globex").await;
    for _ in 0..50 {
        let answer = app.get("/keys/acme").await;
        assert_eq!(answer.status, 200);
        assert_eq!(answer.body["hash_key"], key.as_str());
    }
    let still = tokio::time::timeout(Duration::ZERO, &mut allocation).await;
    assert!(
        still.is_err(),
        "the allocation finished before the lock was released"
    );
    db.release_write_lock().await;
    assert_eq!(allocation.await.status, 201);
}

/// Another writer (a second replica) may commit while an allocation waits for the write
/// lock, and take the very key this server was about to pick. The allocation sees that the
/// log moved, catches up and picks again: no key is handed out twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_allocation_behind_another_writer_picks_after_it() {
    let app = spawn_app_with(|c| c.keyspace_bits = 7).await;
    let mut db = app.db().await;
    let allocation = allocation_behind_the_lock(&app, &mut db, "/keys/globex").await;
    // 64, the middle of the 7-bit keyspace, is the first key an empty tree gives.
    db.log_allocation("acme", 64).await;
    db.commit().await;
    let answer = allocation.await;
    assert_eq!(answer.status, 201, "{:?}", answer.body);
    // As if acme had come first: the next pick, the middle of the lower half.
    assert_eq!(answer.body["hash_key"], "32");
    assert_eq!(app.get("/keys/acme").await.body["hash_key"], "64");
    let stored: Vec<_> = db
        .assignments()
        .await
        .into_iter()
        .map(|(a, k, _)| (a, k))
        .collect();
    let key = |k: u128| k.to_be_bytes().to_vec();
    assert_eq!(
        stored,
        [("acme".to_owned(), key(64)), ("globex".to_owned(), key(32))]
    );
}

/// Takes the write lock on `db` as another writer, then posts to `path` (an allocation):
/// the answer to come, still waiting for the lock.
async fn allocation_behind_the_lock<'a>(
    app: &'a TestApp,
    db: &mut Db,
    path: &'a str,
) -> Pin<Box<dyn Future<Output = Answer> + 'a>> {
    db.hold_write_lock().await;
    let mut allocation = Box::pin(app.post(path, None));
    let waited = tokio::time::timeout(Duration::from_millis(300), &mut allocation).await;
    assert!(
        waited.is_err(),
        "allocated while another writer held the lock"
    );
    allocation
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_largest_batch_fits_its_body_limit() {
    let app = spawn_app().await;
    // 10,000 accounts of the longest id, 256 bytes: 2.7 MB, within the 4 MiB limit.
    let accounts: Vec<_> = (0..10_000)
        .map(|i| json!({"account": format!("{i:05}{}", "x".repeat(251))}))
        .collect();
    let body = json!({ "accounts": accounts });
    assert!(body.to_string().len() > 2_500_000);
    let answer = app.post("/keys/batch", Some(body)).await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    assert_eq!(answer.body["items"].as_array().map(Vec::len), Some(10_000));
}
