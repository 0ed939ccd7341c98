//! Through a database failover: while the server under a running keyspread takes no writes
//! (a demoted primary, a standby), changes are refused with 503 and `Retry-After`, never
//! 500, lookups go on, and writes resume on their own once it takes writes again.

use std::time::{Duration, Instant};

use crate::helpers::{TestApp, spawn_app_with};
use crate::pg_cluster::Cluster;

/// Makes every session of the cluster read-only, or writable again, as a demotion and a
/// promotion do, with no connection ended: `ALTER SYSTEM` reaches open sessions at their
/// next transaction; the database's own setting reaches only sessions opened while it
/// holds, which stay read-only after it is reset, as sessions of a standby do.
async fn set_read_only(cluster: &Cluster, database: &str, on: bool) {
    let mut admin = cluster.admin().await;
    let (system, db) = if on {
        (
            "ALTER SYSTEM SET default_transaction_read_only = on".to_owned(),
            format!("ALTER DATABASE {database} SET default_transaction_read_only = on"),
        )
    } else {
        (
            "ALTER SYSTEM RESET default_transaction_read_only".to_owned(),
            format!("ALTER DATABASE {database} RESET default_transaction_read_only"),
        )
    };
    // The test's own session is read-only too, until it says otherwise.
    let own = "SET default_transaction_read_only = off";
    for sql in [own, db.as_str(), system.as_str(), "SELECT pg_reload_conf()"] {
        sqlx::query(sql).execute(&mut admin).await.expect(sql);
    }
    // The reload reaches each backend on its own; this session's is one of them.
    let want = if on { "on" } else { "off" };
    let started = Instant::now();
    loop {
        let mut fresh = cluster.admin().await;
        let now: String = sqlx::query_scalar("SHOW default_transaction_read_only")
            .fetch_one(&mut fresh)
            .await
            .expect("show");
        if now == want {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(10), "no reload");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
}

/// A change's status and `Retry-After`.
async fn change(app: &TestApp, method: reqwest::Method, path: &str) -> (u16, Option<String>) {
    send(app.client.request(method, app.url(path))).await
}

async fn send(request: reqwest::RequestBuilder) -> (u16, Option<String>) {
    let sent = request.send().await.expect("send");
    let retry = sent
        .headers()
        .get("retry-after")
        .map(|v| v.to_str().unwrap_or_default().to_owned());
    (sent.status().as_u16(), retry)
}

/// Eight allocations at once: as many connections as the pool holds.
async fn allocate_together(app: &TestApp, prefix: &str) -> Vec<(u16, Option<String>)> {
    together((0..8).map(|i| app.client.post(app.url(&format!("/keys/{prefix}-{i}"))))).await
}

/// The answers to `requests`, sent all at once.
async fn together(
    requests: impl Iterator<Item = reqwest::RequestBuilder>,
) -> Vec<(u16, Option<String>)> {
    let sent: Vec<_> = requests.map(|r| tokio::spawn(send(r))).collect();
    let mut answers = Vec::new();
    for answer in sent {
        answers.push(answer.await.expect("request task"));
    }
    answers
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_answer_503_while_the_database_is_read_only_and_resume_without_a_restart() {
    const TEST: &str =
        "writes_answer_503_while_the_database_is_read_only_and_resume_without_a_restart";
    if crate::skip::postgres_only(TEST).is_none() {
        return;
    }
    let Some(cluster) = Cluster::start(TEST) else {
        return;
    };
    let url = cluster.create_database("keyspread").await;
    let app = spawn_app_with(|c| c.database_url = url).await;
    let key = app.allocate("before").await;
    let opened = allocate_together(&app, "warm").await;
    assert!(opened.iter().all(|(s, _)| *s == 201), "{opened:?}");

    set_read_only(&cluster, "keyspread", true).await;
    for round in 0..3 {
        for (status, retry) in allocate_together(&app, &format!("during-{round}")).await {
            assert_eq!(status, 503, "an allocation while read-only");
            assert!(retry.is_some(), "503 without Retry-After");
        }
        let released = change(&app, reqwest::Method::DELETE, "/keys/warm-0").await;
        assert_eq!(released.0, 503, "a release while read-only");
        assert!(released.1.is_some(), "503 without Retry-After");
    }
    let looked_up = app.get("/keys/before").await;
    assert_eq!(
        (looked_up.status, looked_up.body["hash_key"].as_str()),
        (200, Some(key.as_str()))
    );
    assert_eq!(app.get("/readyz").await.status, 200, "lookups are answered");
    let writes = app.get("/readyz/writes").await;
    assert_eq!(writes.status, 503, "{}", writes.body);
    assert_eq!(writes.body["reason"], "read_only", "{}", writes.body);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(app.get("/readyz/writes").await.status, 503);
    let read_only_s = app
        .metric("keyspread_database_unwritable_seconds_total{reason=\"read_only\"}")
        .await;
    assert!(read_only_s >= 0.5, "{read_only_s} s read-only counted");
    // Reads of the table, many at once, open connections while the server is read-only.
    let read = together((0..16).map(|_| app.client.get(app.url("/keys")))).await;
    assert!(read.iter().all(|(s, _)| *s == 200), "{read:?}");

    set_read_only(&cluster, "keyspread", false).await;
    let writes = app.get("/readyz/writes").await;
    assert_eq!(writes.status, 200, "{}", writes.body);
    for round in 0..3 {
        let made = allocate_together(&app, &format!("after-{round}")).await;
        assert!(
            made.iter().all(|(s, _)| *s == 201),
            "round {round}: {made:?}"
        );
    }
    let released = change(&app, reqwest::Method::DELETE, "/keys/warm-0").await;
    assert_eq!(released.0, 204, "a release once writable");
    assert_eq!(
        app.get("/keys/during-0-0").await.status,
        404,
        "refused, so not made"
    );
    drop(app);
    drop(cluster);
}
