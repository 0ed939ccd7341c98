//! `GET /snapshot`: the whole table as NDJSON, as of one event: a head line, then one
//! assignment a line, each as `GET /keys/{account}` answers it (a pending move's `next`
//! and a fanned-out account's keys included), streamed while writers go on.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::helpers::{TestApp, spawn_app_with};

/// `GET /snapshot`: its head and its assignment lines, asserting the media type and that
/// the head counts the lines.
async fn snapshot(app: &TestApp) -> (Value, Vec<Value>) {
    let response = app.client.get(app.url("/snapshot")).send().await.unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["content-type"], "application/x-ndjson");
    let text = response.text().await.unwrap();
    let mut lines = text
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap());
    let head = lines.next().expect("a head line");
    let lines: Vec<Value> = lines.collect();
    assert_eq!(head["accounts"], lines.len(), "{head}");
    (head, lines)
}

/// Allocates `n` accounts named `{prefix}{i}` in batches.
async fn allocate(app: &TestApp, prefix: &str, n: usize) {
    let names: Vec<String> = (0..n).map(|i| format!("{prefix}{i:06}")).collect();
    for chunk in names.chunks(10_000) {
        let accounts: Vec<Value> = chunk.iter().map(|a| json!({"account": a})).collect();
        let batch = app
            .post("/keys/batch", Some(json!({"accounts": accounts})))
            .await;
        assert_eq!(batch.status, 200, "{}", batch.body);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_answers_every_account_as_its_lookup_does() {
    let app = spawn_app_with(|_| {}).await;
    crate::fanout::primary_stream(&app, "s", 2).await;
    crate::staged::lopsided(&app).await;
    // A staged move still pending, and an account on three keys.
    let preview = app.get("/rebalance/preview?stream=s").await.body;
    let body = json!({"plan_id": preview["plan_id"], "switch_after_s": 3600});
    let applied = app.post("/rebalance", Some(body)).await;
    assert_eq!(applied.status, 200, "{}", applied.body);
    let moving = applied.body["moves"][0]["account"]
        .as_str()
        .unwrap()
        .to_owned();
    allocate(&app, "bulk-", 2_500).await;
    let grown = app
        .call(
            reqwest::Method::PATCH,
            "/keys/bulk-000007",
            Some(json!({"fanout": 3, "weight": 3})),
        )
        .await;
    assert_eq!(grown.status, 200, "{}", grown.body);

    let (head, lines) = snapshot(&app).await;
    let events = app.get("/events?after=0&limit=1000").await.body;
    let mut last = events["next"].as_i64().unwrap();
    loop {
        let page = app
            .get(&format!("/events?after={last}&limit=1000"))
            .await
            .body;
        if page["next"] == last {
            break;
        }
        last = page["next"].as_i64().unwrap();
    }
    assert_eq!(head["event_id"], last, "{head}");
    assert_eq!(head["max_age_s"], 60, "the lookups' max-age: {head}");
    assert_eq!(
        head["stream"], "s",
        "the primary stream, for mirrors' reports: {head}"
    );
    let accounts: Vec<&str> = lines
        .iter()
        .map(|l| l["account"].as_str().unwrap())
        .collect();
    let sorted: BTreeSet<&str> = accounts.iter().copied().collect();
    assert_eq!(sorted.len(), accounts.len(), "no account twice");
    assert!(accounts.is_sorted(), "by account");
    assert_eq!(
        accounts.len(),
        2_500 + 4,
        "the bulk, and four of lopsided's eight"
    );
    let by_account: BTreeMap<&str, &Value> = accounts.iter().copied().zip(&lines).collect();
    assert!(by_account[moving.as_str()]["next"]["switch_at"].is_string());
    assert_eq!(by_account["bulk-000007"]["fanout"], 3);
    for account in [moving.as_str(), "bulk-000007", "bulk-000000", "bulk-002499"] {
        let looked = app.get(&format!("/keys/{account}")).await;
        assert_eq!(looked.status, 200, "{}", looked.body);
        assert_eq!(*by_account[account], looked.body, "{account}");
    }
}

/// Writers go on while a snapshot is read: it holds exactly the accounts the log had
/// allocated up to its `event_id`, no more and no fewer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_is_the_table_as_of_its_event() {
    let app = spawn_app_with(|_| {}).await;
    allocate(&app, "before-", 3_000).await;
    let writer = {
        let (client, url) = (app.client.clone(), app.url(""));
        tokio::spawn(async move {
            for i in 0..200 {
                let path = format!("{url}/keys/during-{i:04}");
                let answer = client.post(path).send().await.unwrap();
                assert_eq!(answer.status(), 201);
            }
        })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    let (head, lines) = snapshot(&app).await;
    writer.await.unwrap();
    let event_id = head["event_id"].as_i64().unwrap();
    let mut allocated = BTreeSet::new();
    let mut after = 0;
    while after < event_id {
        let page = app
            .get(&format!("/events?after={after}&limit=1000"))
            .await
            .body;
        for e in page["events"].as_array().unwrap() {
            if e["id"].as_i64().unwrap() <= event_id && e["kind"] == "allocate" {
                allocated.insert(e["account"].as_str().unwrap().to_owned());
            }
        }
        after = page["next"].as_i64().unwrap();
    }
    let seen: BTreeSet<String> = (lines.iter())
        .map(|l| l["account"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(seen, allocated, "as of event {event_id}");
    let during = seen.iter().filter(|a| a.starts_with("during-")).count();
    println!(
        "snapshot at event {event_id}: {} accounts, {during} of them allocated while it was taken",
        seen.len()
    );
}

/// A client that stops reading holds the server's read (and its turn of the heavy pool)
/// for the request timeout at most: another snapshot is then answered in full.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_stops_reading_a_snapshot_lets_it_go() {
    let app = spawn_app_with(|c| c.request_timeout_secs = 1).await;
    allocate(&app, "stalled-", 40_000).await;
    let mut stalled = tokio::net::TcpStream::connect(app.addr).await.unwrap();
    (stalled
        .write_all(b"GET /snapshot HTTP/1.1\r\nHost: localhost\r\n\r\n")
        .await)
        .unwrap();
    let mut first = [0u8; 64];
    let read = stalled.read(&mut first).await.unwrap();
    assert!(String::from_utf8_lossy(&first[..read]).starts_with("HTTP/1.1 200"));
    // It reads no more. Past the request timeout its answer is cut short and its turn
    // is free again: the next snapshot gets every line.
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    let (head, lines) = tokio::time::timeout(Duration::from_secs(20), snapshot(&app))
        .await
        .expect("a snapshot answered while another client stalls");
    assert_eq!(head["accounts"], 40_000);
    assert_eq!(lines.len(), 40_000);
    drop(stalled);
}
