//! Readers hold no one up: a client trickling a snapshot holds no turn that others need,
//! long polls of the log leave `--max-connections` to other requests, and a stop ends
//! within `--shutdown-timeout-s` whatever clients leave unread.

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};
use tokio::task::JoinSet;

use crate::helpers::{Db, answer, fresh_database, spawn_app_with};
use crate::process::Server;

/// Accounts in the table a slow client reads: about 12 MB of snapshot, well past what the
/// sockets between the two can buffer.
const ACCOUNTS: usize = 60_000;

/// Allocates `ACCOUNTS` accounts through `url`, 10,000 a batch.
async fn fill(client: &reqwest::Client, url: &str) {
    let names: Vec<String> = (0..ACCOUNTS).map(|i| format!("reader-{i:06}")).collect();
    for chunk in names.chunks(10_000) {
        let accounts: Vec<Value> = chunk.iter().map(|a| json!({"account": a})).collect();
        let batch = client
            .post(format!("{url}/keys/batch"))
            .json(&json!({"accounts": accounts}))
            .send()
            .await
            .unwrap();
        assert_eq!(batch.status(), 200, "{}", batch.text().await.unwrap());
    }
}

/// A client that asks for `GET /snapshot` with a small receive buffer, so what it leaves
/// unread stays with the server.
async fn ask_for_snapshot(addr: std::net::SocketAddr) -> TcpStream {
    let socket = TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(16 * 1024).unwrap();
    let mut stream = socket.connect(addr).await.unwrap();
    (stream
        .write_all(b"GET /snapshot HTTP/1.1\r\nHost: localhost\r\n\r\n")
        .await)
        .unwrap();
    let mut head = [0u8; 64];
    let read = stream.read(&mut head).await.unwrap();
    assert!(String::from_utf8_lossy(&head[..read]).starts_with("HTTP/1.1 200"));
    stream
}

/// Reads `stream` at about 80 KB/s until `stop`: the bytes read, and whether the answer's
/// end (the last chunk) came.
async fn trickle(mut stream: TcpStream, stop: tokio::sync::oneshot::Receiver<()>) -> (usize, bool) {
    let (mut read, mut ended) = (0, false);
    let mut buffer = vec![0u8; 16 * 1024];
    tokio::pin!(stop);
    loop {
        tokio::select! {
            _ = &mut stop => return (read, ended),
            got = stream.read(&mut buffer) => match got.unwrap() {
                0 => return (read, ended),
                n => {
                    read += n;
                    ended |= buffer[..n].ends_with(b"\r\n0\r\n\r\n");
                }
            },
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// `GET path`: its status and body.
async fn get(client: reqwest::Client, url: String, path: String) -> (String, u16, String) {
    let response = client.get(format!("{url}{path}")).send().await.unwrap();
    let status = response.status().as_u16();
    (path, status, response.text().await.unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_trickling_a_snapshot_holds_no_one_up() {
    // The heavy reads take turns on as few as one thread, each a second or more in a debug
    // build on a busy machine: give them time, far less than the slow client's minutes.
    let app = spawn_app_with(|c| c.request_timeout_secs = 30).await;
    fill(&app.client, &app.url("")).await;
    let (stop, stopped) = tokio::sync::oneshot::channel();
    let slow = tokio::spawn(trickle(ask_for_snapshot(app.addr).await, stopped));
    tokio::time::sleep(Duration::from_millis(300)).await;

    // Every heavy read at once, while the slow client reads on.
    let mut others = JoinSet::new();
    let paths = [2, 3, 5, 8].map(|shards| format!("/distribution?shards={shards}"));
    let paths = paths
        .into_iter()
        .chain(["/rebalance/preview?shards=4".into(), "/snapshot".into()]);
    for path in paths {
        others.spawn(get(app.client.clone(), app.url(""), path));
    }
    while let Some(done) = others.join_next().await {
        let (path, status, body) = done.unwrap();
        assert_eq!(status, 200, "{path}: {}", &body[..body.len().min(300)]);
        if path == "/snapshot" {
            let lines: Vec<&str> = body.lines().collect();
            let head: Value = serde_json::from_str(lines[0]).unwrap();
            assert_eq!(head["accounts"], ACCOUNTS, "{head}");
            assert_eq!(
                lines.len(),
                ACCOUNTS + 1,
                "every account of the second snapshot"
            );
        }
    }
    // On SQLite the log can be checkpointed to its end: no read transaction holds it back.
    if let Db::Sqlite(conn) = &mut app.db().await {
        let (busy, _, _): (i64, i64, i64) = sqlx::query_as("PRAGMA wal_checkpoint(TRUNCATE)")
            .fetch_one(conn)
            .await
            .unwrap();
        assert_eq!(
            busy, 0,
            "a reader kept the checkpoint from the end of the log"
        );
    }
    stop.send(()).unwrap();
    let (read, ended) = slow.await.unwrap();
    assert!(
        !ended,
        "the slow client read its whole answer ({read} bytes) before the others were done: \
         nothing was held"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_polls_leave_the_connection_cap_to_other_requests() {
    const CAP: usize = 8;
    let app = spawn_app_with(|c| c.max_connections = CAP as u32).await;
    app.allocate("acme").await;
    let after = app.get("/events?after=0&limit=1000").await.body["next"].clone();
    let poll_url = app.url(&format!("/events?after={after}&wait_s=60"));
    let mut polls = JoinSet::new();
    // Each on a connection of its own, as mirrors in other processes would.
    let poll = |polls: &mut JoinSet<_>| {
        let request = reqwest::Client::new().get(&poll_url);
        polls.spawn(async move { answer(request.send().await.unwrap()).await })
    };
    for _ in 0..CAP {
        poll(&mut polls);
    }
    tokio::time::sleep(Duration::from_millis(500)).await;

    // As many long polls as the cap wait, and lookups on new connections are answered.
    let fresh = || {
        reqwest::Client::builder()
            .pool_max_idle_per_host(0)
            .timeout(Duration::from_secs(5))
            .build()
            .unwrap()
    };
    for _ in 0..2 * CAP {
        let lookup = fresh().get(app.url("/keys/acme")).send().await;
        let lookup = lookup.expect("a lookup answered while long polls wait");
        assert_eq!(lookup.status(), 200);
    }

    // As many again wait in the connections' own places: those are all taken.
    let more: Vec<_> = (0..CAP).map(|_| poll(&mut polls)).collect();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let blocked = fresh()
        .get(app.url("/keys/acme"))
        .timeout(Duration::from_secs(1))
        .send()
        .await;
    assert!(
        blocked.is_err(),
        "past the cap and as many long polls again, a client waits"
    );
    more.iter().for_each(|poll| poll.abort());
    let lookup = fresh().get(app.url("/keys/acme")).send().await;
    assert_eq!(
        lookup.expect("answered once the extra polls left").status(),
        200
    );

    // The long polls still answer the next event, each taking a place back to answer it.
    let allocated = fresh().post(app.url("/keys/globex")).send().await.unwrap();
    assert_eq!(allocated.status(), 201);
    let mut woken = 0;
    while let Some(done) = polls.join_next().await {
        let Ok(got) = done else { continue };
        assert_eq!(got.status, 200, "{}", got.body);
        assert_eq!(got.body["events"][0]["account"], "globex", "{}", got.body);
        woken += 1;
    }
    assert_eq!(woken, CAP);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_ends_the_process_within_the_shutdown_timeout_whatever_clients_leave_unread() {
    let dir = tempfile::tempdir().unwrap();
    let (url, _postgres) = fresh_database(dir.path()).await;
    let timeout = Duration::from_secs(2);
    let env = [("KEYSPREAD_SHUTDOWN_TIMEOUT_S", "2")];
    let mut server = Server::spawn_with(&url, &dir.path().join("server.log"), &env);
    let client = reqwest::Client::new();
    server.wait_ready(&client).await;
    fill(&client, &server.url).await;
    let addr = server.url.trim_start_matches("http://").parse().unwrap();
    // It asks for the whole table and never reads it.
    let stalled = ask_for_snapshot(addr).await;
    tokio::time::sleep(Duration::from_millis(300)).await;

    server.signal("TERM");
    let stopping = Instant::now();
    let exit = server.wait_exit(timeout + Duration::from_secs(5)).await;
    let took = stopping.elapsed();
    let exit = exit.unwrap_or_else(|| panic!("still running {took:?} after SIGTERM"));
    assert!(exit.success(), "{exit}");
    assert!(
        took >= timeout,
        "the request in flight was dropped after {took:?}, before the shutdown timeout"
    );
    let log = server.log_text();
    assert!(log.contains("their connections are dropped"), "{log}");
    drop(stalled);
}
