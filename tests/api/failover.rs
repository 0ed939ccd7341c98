//! Through a database failover: while the server under a running keyspread takes no writes
//! (a demoted primary, a standby), changes are refused with 503 and `Retry-After`, never
//! 500, lookups go on, and writes resume on their own once it takes writes again.

use std::sync::Arc;
use std::sync::atomic::{AtomicU16, Ordering};
use std::time::{Duration, Instant};

use sqlx::Connection;
use tokio::net::{TcpListener, TcpStream};

use crate::helpers::{TestApp, spawn_app_with};
use crate::pg_cluster::{Cluster, path};

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

/// A TCP proxy whose upstream can be switched, as a failover's virtual address moves to the
/// promoted server; connections open at the switch stay with the server they reached.
struct Switch {
    addr: std::net::SocketAddr,
    upstream: Arc<AtomicU16>,
    accept: tokio::task::JoinHandle<()>,
}

impl Switch {
    async fn start(port: u16) -> Switch {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("address");
        let upstream = Arc::new(AtomicU16::new(port));
        let to = Arc::clone(&upstream);
        let accept = tokio::spawn(async move {
            while let Ok((mut client, _)) = listener.accept().await {
                let port = to.load(Ordering::SeqCst);
                tokio::spawn(async move {
                    if let Ok(mut server) = TcpStream::connect(("127.0.0.1", port)).await {
                        let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                    }
                });
            }
        });
        Switch {
            addr,
            upstream,
            accept,
        }
    }

    fn to(&self, port: u16) {
        self.upstream.store(port, Ordering::SeqCst);
    }
}

impl Drop for Switch {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

/// A standby of `cluster`'s primary, streaming from it (asynchronously: the primary waits
/// for it to receive nothing), running: its data directory and port.
fn streaming_standby(cluster: &Cluster) -> (std::path::PathBuf, u16) {
    let standby = cluster.beside("standby");
    let port = cluster.port.to_string();
    cluster.run(
        "pg_basebackup",
        &[
            "-D",
            path(&standby),
            "-h",
            "127.0.0.1",
            "-p",
            &port,
            "-U",
            "postgres",
            "-R",
            "-X",
            "stream",
            // At once, not after a spread checkpoint (a minute and more).
            "--checkpoint=fast",
            "--no-sync",
        ],
    );
    let standby_port = crate::pg_cluster::free_port();
    cluster.start_server(&standby, standby_port);
    (standby, standby_port)
}

/// Polls `check` every 100 ms until it holds, failing after `limit`.
async fn eventually<F: std::future::Future<Output = bool>>(
    what: &str,
    limit: Duration,
    mut check: impl FnMut() -> F,
) -> Duration {
    let started = Instant::now();
    while !check().await {
        assert!(started.elapsed() < limit, "{what}: not within {limit:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    started.elapsed()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_resume_through_a_switch_to_a_promoted_standby_and_nothing_acknowledged_is_lost() {
    const TEST: &str =
        "writes_resume_through_a_switch_to_a_promoted_standby_and_nothing_acknowledged_is_lost";
    if crate::skip::postgres_only(TEST).is_none() {
        return;
    }
    let Some(cluster) = Cluster::start(TEST) else {
        return;
    };
    cluster.create_database("keyspread").await;
    let (standby, standby_port) = streaming_standby(&cluster);

    let switch = Switch::start(cluster.port).await;
    let url = Cluster::url_on(switch.addr.port(), "keyspread");
    let a = spawn_app_with(|c| c.database_url = url.clone()).await;
    let b = spawn_app_with(|c| c.database_url = url.clone()).await;
    let mut acknowledged = Vec::new();
    for i in 0..20 {
        let app = if i % 2 == 0 { &a } else { &b };
        let account = format!("before-{i}");
        acknowledged.push((account.clone(), app.allocate(&account).await));
    }

    // The primary goes (a clean stop sends the standby all it wrote), the address moves to
    // the standby before it is promoted: writes meet a server in recovery.
    cluster.stop_server(&cluster.data);
    switch.to(standby_port);
    let in_recovery = eventually(
        "/readyz/writes in_recovery",
        Duration::from_secs(15),
        || async { a.get("/readyz/writes").await.body["reason"] == "in_recovery" },
    )
    .await;
    let (status, retry) = change(&a, reqwest::Method::POST, "/keys/during").await;
    assert_eq!(status, 503, "a change on a standby");
    assert!(retry.is_some(), "503 without Retry-After");
    assert_eq!(a.get("/readyz").await.status, 200, "lookups are answered");

    cluster.run("pg_ctl", &["-D", path(&standby), "-w", "promote"]);
    let resumed = eventually("writes resume", Duration::from_secs(30), || async {
        let (status, _) = change(&a, reqwest::Method::POST, "/keys/after-a").await;
        assert!(matches!(status, 201 | 503), "a change answered {status}");
        status == 201
    })
    .await;
    assert_eq!(a.get("/readyz/writes").await.status, 200);
    b.allocate("after-b").await;

    // Each replica follows the other's changes on the new primary.
    eventually("A follows B", Duration::from_secs(10), || async {
        a.get("/keys/after-b").await.status == 200
    })
    .await;
    eventually("B follows A", Duration::from_secs(10), || async {
        b.get("/keys/after-a").await.status == 200
    })
    .await;
    let mut db = sqlx::PgConnection::connect(&Cluster::url_on(standby_port, "keyspread"))
        .await
        .expect("connect to the new primary");
    for (account, key) in &acknowledged {
        let stored: Vec<u8> =
            sqlx::query_scalar("SELECT hash_key FROM assignments WHERE account = $1")
                .bind(account)
                .fetch_one(&mut db)
                .await
                .unwrap_or_else(|e| panic!("{account} lost in the failover: {e}"));
        let stored = u128::from_be_bytes(stored.try_into().expect("16 bytes"));
        assert_eq!(stored.to_string(), *key, "{account}");
        assert_eq!(b.get(&format!("/keys/{account}")).await.status, 200);
    }
    assert_eq!(
        a.get("/keys/during").await.status,
        404,
        "refused, so not made"
    );
    println!(
        "failover: /readyz/writes in_recovery {in_recovery:?} after the switch, writes back \
         {resumed:?} after the promotion"
    );
    drop((a, b, switch));
    drop(cluster);
}

/// What `sql` answers on the server at `port`, database `keyspread`.
async fn scalar_on(port: u16, sql: &str) -> i64 {
    let mut db = sqlx::PgConnection::connect(&Cluster::url_on(port, "keyspread"))
        .await
        .expect("connect");
    sqlx::query_scalar(sql).fetch_one(&mut db).await.expect(sql)
}

/// The name of the log `app` serves.
async fn log_id(app: &TestApp) -> String {
    let page = app.get("/events?after=0&limit=1").await;
    assert_eq!(page.status, 200, "{}", page.body);
    page.body["log_id"].as_str().expect("log_id").to_owned()
}

/// Asynchronous replication loses what the old primary acknowledged and never sent, and the
/// promoted standby hands the lost events' ids to new ones. A replica that applied the lost
/// events finds the history it followed is gone even though the log has the same name and
/// ends past its position: it gives the log a new name (so every reader, other replicas and
/// mirrors, starts again from a snapshot) and reads the table again, instead of applying
/// the new events on top of ones the database no longer holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_promotion_that_lost_acknowledged_events_is_another_log_to_every_reader() {
    const TEST: &str = "a_promotion_that_lost_acknowledged_events_is_another_log_to_every_reader";
    if crate::skip::postgres_only(TEST).is_none() {
        return;
    }
    let Some(cluster) = Cluster::start(TEST) else {
        return;
    };
    cluster.create_database("keyspread").await;
    let (standby, standby_port) = streaming_standby(&cluster);
    let switch = Switch::start(cluster.port).await;
    let url = Cluster::url_on(switch.addr.port(), "keyspread");
    let a = spawn_app_with(|c| c.database_url = url.clone()).await;
    let mut kept = Vec::new();
    for i in 0..10 {
        let account = format!("kept-{i}");
        kept.push((account.clone(), a.allocate(&account).await));
    }
    let before = log_id(&a).await;
    eventually(
        "the standby has the first events",
        Duration::from_secs(15),
        || async { scalar_on(standby_port, "SELECT COUNT(*) FROM assignments").await == 10 },
    )
    .await;

    // The standby stops receiving; the primary goes on acknowledging, then dies.
    let mut on_standby = sqlx::PgConnection::connect(&Cluster::url_on(standby_port, "keyspread"))
        .await
        .expect("connect to the standby");
    for sql in [
        "ALTER SYSTEM SET primary_conninfo = ''",
        "SELECT pg_reload_conf()",
    ] {
        sqlx::query(sql).execute(&mut on_standby).await.expect(sql);
    }
    drop(on_standby);
    eventually(
        "the standby stops receiving",
        Duration::from_secs(15),
        || async {
            scalar_on(standby_port, "SELECT COUNT(*) FROM pg_stat_wal_receiver").await == 0
        },
    )
    .await;
    for i in 0..5 {
        a.allocate(&format!("lost-{i}")).await;
    }
    let applied = scalar_on(cluster.port, "SELECT MAX(id) FROM events").await;
    cluster.stop_server(&cluster.data);
    cluster.run("pg_ctl", &["-D", path(&standby), "-w", "promote"]);

    // Another replica writes on the new primary past the ids the lost events had, before
    // the address moves and A looks again.
    let c = spawn_app_with(|c| c.database_url = Cluster::url_on(standby_port, "keyspread")).await;
    let mut after = Vec::new();
    for i in 0.. {
        if scalar_on(standby_port, "SELECT COALESCE(MAX(id), 0) FROM events").await > applied {
            break;
        }
        let account = format!("after-{i}");
        after.push((account.clone(), c.allocate(&account).await));
    }
    assert_eq!(
        log_id(&c).await,
        before,
        "the promoted standby keeps the log's name"
    );
    switch.to(standby_port);

    let moved = eventually(
        "A reads the table again",
        Duration::from_secs(20),
        || async { a.get("/keys/lost-0").await.status == 404 },
    )
    .await;
    let renamed = log_id(&a).await;
    assert_ne!(
        renamed, before,
        "readers of the old history are told it is another log"
    );
    eventually(
        "C follows the new name",
        Duration::from_secs(10),
        || async { log_id(&c).await == renamed },
    )
    .await;
    for i in 0..5 {
        assert_eq!(
            a.get(&format!("/keys/lost-{i}")).await.status,
            404,
            "lost-{i}"
        );
    }
    for (account, key) in kept.iter().chain(&after) {
        for (name, app) in [("A", &a), ("C", &c)] {
            let answer = app.get(&format!("/keys/{account}")).await;
            assert_eq!(answer.status, 200, "{name}: {account}");
            assert_eq!(answer.body["hash_key"], key.as_str(), "{name}: {account}");
        }
    }
    // And A writes again, on the table the database holds.
    a.allocate("new-on-a").await;
    eventually("C follows A", Duration::from_secs(10), || async {
        c.get("/keys/new-on-a").await.status == 200
    })
    .await;
    println!("lost promotion: A read the table again {moved:?} after the address moved");
    drop((a, c, switch));
    drop(cluster);
}
