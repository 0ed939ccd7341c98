//! `/metrics`, the `/events` feed, and the per-client rate limit of mutations.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::helpers::{TestApp, assert_problem, spawn_app, spawn_app_with};

/// The metrics page, checked for its media type.
async fn scrape(app: &TestApp) -> String {
    let response = app.client.get(app.url("/metrics")).send().await.unwrap();
    assert_eq!(response.status(), 200);
    let media = response.headers()["content-type"]
        .to_str()
        .unwrap()
        .to_owned();
    assert!(media.starts_with("text/plain; version=0.0.4"), "{media}");
    response.text().await.unwrap()
}

/// The value of the sample `series` (name and labels exactly as written), if present.
fn sample(page: &str, series: &str) -> Option<f64> {
    page.lines()
        .find_map(|line| line.strip_prefix(series)?.strip_prefix(' '))
        .map(|v| v.parse().expect("a number"))
}

fn value(page: &str, series: &str) -> f64 {
    sample(page, series).unwrap_or_else(|| panic!("no sample {series} in\n{page}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_count_requests_by_route_template_and_changes() {
    let app = spawn_app().await;
    for account in ["a", "b", "c", "d"] {
        app.allocate(account).await;
    }
    assert_eq!(app.get("/keys/a").await.status, 200);
    assert_eq!(app.get("/keys/a").await.status, 200);
    assert_eq!(app.get("/keys/nobody").await.status, 404);
    assert_eq!(app.delete("/keys/d").await.status, 204);
    let reweighted = app
        .call(
            reqwest::Method::PATCH,
            "/keys/a",
            Some(json!({"weight": 3})),
        )
        .await;
    assert_eq!(reweighted.status, 200);
    assert_eq!(app.get("/no/such/route").await.status, 404);
    let preview = app.get("/rebalance/preview?shards=5").await;
    let applied = app
        .post(
            "/rebalance",
            Some(json!({"plan_id": preview.body["plan_id"], "switch_after_s": 0})),
        )
        .await;
    assert_eq!(applied.status, 200, "{}", applied.body);
    let moved = applied.body["moves"].as_array().unwrap().len() as f64;

    let page = scrape(&app).await;
    let requests =
        |labels: &str| value(&page, &format!("keyspread_http_requests_total{{{labels}}}"));
    assert_eq!(
        requests(r#"route="/keys/{account}",method="GET",status="200""#),
        2.0
    );
    assert_eq!(
        requests(r#"route="/keys/{account}",method="GET",status="404""#),
        1.0
    );
    assert_eq!(
        requests(r#"route="/keys/{account}",method="POST",status="201""#),
        4.0
    );
    assert_eq!(
        requests(r#"route="/keys/{account}",method="DELETE",status="204""#),
        1.0
    );
    assert_eq!(
        requests(r#"route="/keys/{account}",method="PATCH",status="200""#),
        1.0
    );
    assert_eq!(
        requests(r#"route="unmatched",method="GET",status="404""#),
        1.0
    );
    // Labels are route templates, never raw paths.
    assert!(!page.contains("route=\"/keys/a\""), "{page}");
    assert!(!page.contains("/no/such/route"), "{page}");
    let latency = "keyspread_http_request_duration_seconds";
    assert_eq!(
        value(
            &page,
            &format!(r#"{latency}_bucket{{route="/keys/{{account}}",method="GET",le="+Inf"}}"#)
        ),
        3.0
    );
    assert_eq!(
        value(
            &page,
            &format!(r#"{latency}_count{{route="/keys/{{account}}",method="GET"}}"#)
        ),
        3.0
    );
    assert!(page.contains("# TYPE keyspread_http_request_duration_seconds histogram"));

    assert_eq!(value(&page, "keyspread_allocations_total"), 4.0);
    assert_eq!(value(&page, "keyspread_releases_total"), 1.0);
    assert_eq!(value(&page, "keyspread_reweights_total"), 1.0);
    assert_eq!(value(&page, "keyspread_rebalance_moves_total"), moved);
    assert_eq!(value(&page, "keyspread_accounts"), 3.0);
    assert!(value(&page, "keyspread_tree_nodes") >= 3.0);
    // Four allocations one at a time, a release, a reweight and maybe the rebalance.
    let commits = value(&page, "keyspread_db_commit_seconds_count");
    assert!(commits >= 6.0, "{commits} commits");
    assert!(
        value(
            &page,
            r#"keyspread_db_transaction_seconds_bucket{le="+Inf"}"#
        ) >= 6.0
    );
    let applied_id = value(&page, "keyspread_event_applied_id");
    assert_eq!(applied_id, value(&page, "keyspread_event_log_id"));
    assert_eq!(value(&page, "keyspread_replica_lag_events"), 0.0);

    // The scrape itself shows up on the next one.
    let again = scrape(&app).await;
    assert_eq!(
        value(
            &again,
            r#"keyspread_http_requests_total{route="/metrics",method="GET",status="200"}"#
        ),
        1.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_show_what_a_replica_followed() {
    let first = spawn_app().await;
    let url = first.config.database_url.clone();
    let second = spawn_app_with(|c| c.database_url = url).await;
    first.allocate("elsewhere").await;
    let started = Instant::now();
    while second.get("/keys/elsewhere").await.status != 200 {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "never followed"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let page = scrape(&second).await;
    assert!(
        value(&page, "keyspread_replica_delay_seconds_count") >= 1.0,
        "{page}"
    );
    assert!(value(&page, "keyspread_replica_last_delay_seconds") < 10.0);
    assert_eq!(
        value(&page, "keyspread_event_applied_id"),
        value(&page, "keyspread_event_log_id")
    );
    // The follower counts no allocation of its own.
    assert_eq!(value(&page, "keyspread_allocations_total"), 0.0);
    assert_eq!(value(&page, "keyspread_accounts"), 1.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_reads_the_log_for_other_writers_changes_only() {
    let first = spawn_app().await;
    let url = first.config.database_url.clone();
    let second = spawn_app_with(|c| c.database_url = url).await;
    let reads = |page: &str| value(page, "keyspread_follow_reads_total");
    let (first_before, second_before) =
        (reads(&scrape(&first).await), reads(&scrape(&second).await));
    const COMMITS: usize = 40;
    for n in 0..COMMITS {
        first.allocate(&format!("own-{n}")).await;
    }
    let started = Instant::now();
    while second
        .get(&format!("/keys/own-{}", COMMITS - 1))
        .await
        .status
        != 200
    {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "never followed"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let first_reads = reads(&scrape(&first).await) - first_before;
    let second_reads = reads(&scrape(&second).await) - second_before;
    println!("{COMMITS} commits: {first_reads} reads by their writer, {second_reads} by the other");
    // On Postgres every commit is announced with its newest event id: the writer, which
    // applied its own commits already, reads nothing for them, and only the poll (every
    // 250 ms without a notice) reads. Without notices (SQLite) both only poll.
    assert!(
        first_reads < 10.0,
        "{first_reads} reads for its own {COMMITS} commits"
    );
    assert!(second_reads >= 1.0, "the other replica never read the log");
}

/// Every event, read through the feed `limit` at a time.
async fn read_feed(app: &TestApp, limit: u32) -> Vec<Value> {
    let mut after = 0;
    let mut events = Vec::new();
    loop {
        let page = app
            .get(&format!("/events?after={after}&limit={limit}"))
            .await;
        assert_eq!(page.status, 200, "{}", page.body);
        let batch = page.body["events"].as_array().unwrap().clone();
        assert!(batch.len() <= limit as usize);
        let next = page.body["next"].as_i64().unwrap();
        if batch.is_empty() {
            assert_eq!(next, after, "an empty page keeps the cursor");
            return events;
        }
        assert_eq!(next, batch.last().unwrap()["id"].as_i64().unwrap());
        after = next;
        events.extend(batch);
    }
}

fn decimal(key: &Option<Vec<u8>>) -> Value {
    key.as_ref().map_or(Value::Null, |k| {
        Value::String(u128::from_be_bytes(k.as_slice().try_into().unwrap()).to_string())
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_event_feed_pages_through_the_log_as_stored() {
    let app = spawn_app().await;
    for account in ["a", "b", "c"] {
        app.allocate(account).await;
    }
    app.call(
        reqwest::Method::PATCH,
        "/keys/a",
        Some(json!({"weight": 7})),
    )
    .await;
    app.delete("/keys/b").await;
    let put = app
        .call(
            reqwest::Method::PUT,
            "/streams/orders",
            Some(json!({"shard_count": 2})),
        )
        .await;
    assert!(matches!(put.status, 200 | 201), "{}", put.body);
    let preview = app.get("/rebalance/preview?shards=3").await;
    app.post(
        "/rebalance",
        Some(json!({"plan_id": preview.body["plan_id"], "switch_after_s": 0})),
    )
    .await;

    let stored = app.db().await.events().await;
    for limit in [1, 2, 1000] {
        let feed = read_feed(&app, limit).await;
        assert_eq!(feed.len(), stored.len());
        let mut last = 0;
        for (event, (kind, account, stream, before, after, weight, detail)) in
            feed.iter().zip(&stored)
        {
            let id = event["id"].as_i64().unwrap();
            assert!(id > last, "ids grow");
            last = id;
            assert_eq!(event["kind"], kind.as_str());
            assert_eq!(event["account"], json!(account));
            assert_eq!(event["stream"], json!(stream));
            assert_eq!(event["key_before"], decimal(before));
            assert_eq!(event["key_after"], decimal(after));
            assert_eq!(event["weight"], json!(weight));
            assert_eq!(event["detail"], json!(detail));
            assert!(event["at"].as_str().unwrap().ends_with('Z'));
        }
    }
    let kinds: Vec<&str> = stored.iter().map(|e| e.0.as_str()).collect();
    assert_eq!(
        &kinds[..6],
        [
            "allocate",
            "allocate",
            "allocate",
            "reweight",
            "release",
            "stream_put"
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_event_feed_refuses_bad_paging() {
    let app = spawn_app().await;
    assert_problem(&app.get("/events?limit=0").await, 400, "limit");
    assert_problem(&app.get("/events?limit=1001").await, 400, "limit");
    assert_problem(&app.get("/events?after=-1").await, 400, "after");
    assert_problem(&app.get("/events?after=abc").await, 400, "query");
    let empty = app.get("/events").await;
    assert_eq!(empty.status, 200);
    let log_id = empty.body["log_id"].clone();
    assert!(log_id.is_string(), "{}", empty.body);
    assert_eq!(
        empty.body,
        json!({"events": [], "next": 0, "log_id": log_id})
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_metrics_token_closes_metrics_to_everyone_else() {
    let (admin, scraper) = ("admin-token-0123456789", "scrape-token-0123456789");
    let app = spawn_app_with(|c| {
        c.token = Some(admin.parse().unwrap());
        c.metrics_token = Some(scraper.parse().unwrap());
    })
    .await;
    let get = |token: Option<&'static str>| {
        let mut request = app.client.get(app.url("/metrics"));
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        async move { request.send().await.unwrap() }
    };
    for refused in [None, Some("wrong-token-0123456789"), Some(admin)] {
        let response = get(refused).await;
        assert_eq!(response.headers()["www-authenticate"], "Bearer");
        assert_problem(
            &crate::helpers::answer(response).await,
            401,
            "metrics token",
        );
    }
    let page = get(Some(scraper)).await;
    assert_eq!(page.status(), 200);
    assert!(page.text().await.unwrap().contains("keyspread_accounts"));
    // Lookups and health stay open.
    assert_eq!(app.get("/healthz").await.status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn behind_a_trusted_proxy_each_forwarded_client_has_its_own_rate() {
    for trusted in [true, false] {
        // Forwarded clients are not local: they need the token.
        let token = "proxied-token-0123456789";
        let app = spawn_app_with(|c| {
            c.mutation_rate = 1;
            c.mutation_burst = 2;
            c.limit_token_holders = true;
            c.token = Some(token.parse().unwrap());
            if trusted {
                c.trusted_proxies = vec![keyspread::config::parse_network("127.0.0.1").unwrap()];
            }
        })
        .await;
        let post = |client: &'static str, n: usize| {
            let request = app
                .client
                .post(app.url(&format!("/keys/{client}-{n}")))
                .bearer_auth(token)
                .header("x-forwarded-for", client);
            async move { request.send().await.unwrap().status() }
        };
        // The first client spends its burst (a slow commit may let one more token in).
        let mut n = 0;
        while post("198.51.100.1", n).await == 201 {
            n += 1;
            assert!(n <= 5, "no 429 after {n} mutations");
        }
        assert!(n >= 2, "refused within the burst, after {n}");
        // Another client behind the same proxy: its own budget only if the proxy is trusted.
        let other = post("198.51.100.2", 0).await;
        assert_eq!(other, if trusted { 201 } else { 429 }, "trusted: {trusted}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutations_past_the_rate_are_refused_429_then_allowed_again() {
    let app = spawn_app_with(|c| {
        c.mutation_rate = 1;
        c.mutation_burst = 3;
        c.limit_token_holders = true;
    })
    .await;
    // The burst passes; the next mutations, made well within a second, find the bucket
    // empty (a slow commit may let one more token in first).
    let mut created = 0;
    let refused = loop {
        let url = app.url(&format!("/keys/k{created}"));
        let response = app.client.post(url).send().await.unwrap();
        if response.status() == 429 {
            break response;
        }
        assert_eq!(response.status(), 201);
        created += 1;
        assert!(created <= 10, "no 429 after {created} mutations");
    };
    assert!(created >= 3, "refused within the burst, after {created}");
    let retry_after: u64 = refused.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(retry_after, 1, "one token a second");
    assert_problem(
        &crate::helpers::answer(refused).await,
        429,
        "too many changes",
    );
    // Refused, so not allocated; and reads are never limited.
    for _ in 0..20 {
        assert_eq!(app.get("/keys/k0").await.status, 200);
    }
    let next = format!("/keys/k{created}");
    assert_eq!(app.get(&next).await.status, 404);
    tokio::time::sleep(Duration::from_secs(retry_after)).await;
    assert_eq!(app.post(&next, None).await.status, 201);
    let page = scrape(&app).await;
    assert_eq!(
        value(
            &page,
            r#"keyspread_http_requests_total{route="/keys/{account}",method="POST",status="429"}"#
        ),
        1.0
    );
}
