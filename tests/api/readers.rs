//! Readers hold no one up: a client trickling a snapshot holds no turn that others need.

use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};
use tokio::task::JoinSet;

use crate::helpers::spawn_app_with;

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

/// Reads `stream` at about 160 KB/s until `stop`: the bytes read, and whether the answer's
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
        tokio::time::sleep(Duration::from_millis(100)).await;
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
    let app = spawn_app_with(|_| {}).await;
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
    stop.send(()).unwrap();
    let (read, ended) = slow.await.unwrap();
    assert!(
        !ended,
        "the slow client read its whole answer ({read} bytes) before the others were done: \
         nothing was held"
    );
}
