//! The snapshot is also the backup: `keyspread export` writes it, from a running server or
//! straight from the database.

use std::path::Path;
use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt};

use crate::helpers::spawn_app;

/// Runs the keyspread binary with `args`, waiting without blocking the test's runtime.
async fn keyspread(args: &[&str]) -> std::process::Output {
    tokio::process::Command::new(env!("CARGO_BIN_EXE_keyspread"))
        .args(args)
        .env_remove("DATABASE_URL")
        .env_remove("KEYSPREAD_EXPORT_FROM")
        .output()
        .await
        .unwrap()
}

fn path(p: &Path) -> &str {
    p.to_str().unwrap()
}

fn stderr(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn sqlite_in(dir: &Path, name: &str) -> String {
    format!("sqlite://{}", dir.join(name).display())
}

/// A server that answers `GET /snapshot` with `first`, then waits for `go` before it sends
/// `rest` (or closes the connection when `rest` is `None`).
async fn stalling_server(
    first: Vec<u8>,
    rest: Option<Vec<u8>>,
    go: tokio::sync::oneshot::Receiver<()>,
) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move {
        let (mut socket, _) = listener.accept().await.unwrap();
        let mut request = [0u8; 4096];
        let _ = socket.read(&mut request).await.unwrap();
        let chunk = |bytes: &[u8]| {
            [
                format!("{:x}\r\n", bytes.len()).into_bytes(),
                bytes.to_vec(),
                b"\r\n".to_vec(),
            ]
            .concat()
        };
        let head = "HTTP/1.1 200 OK\r\nContent-Type: application/x-ndjson\r\nTransfer-Encoding: chunked\r\n\r\n";
        socket.write_all(head.as_bytes()).await.unwrap();
        socket.write_all(&chunk(&first)).await.unwrap();
        let _ = go.await;
        if let Some(rest) = rest {
            socket.write_all(&chunk(&rest)).await.unwrap();
            socket.write_all(b"0\r\n\r\n").await.unwrap();
        }
    });
    url
}

/// A 1,000-account export is written as it arrives: the first half is out before the
/// server sends the second. One cut short fails and leaves no file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_export_streams_and_one_cut_short_fails() {
    let dir = tempfile::tempdir().unwrap();
    let app = spawn_app().await;
    let accounts: Vec<Value> = (0..1000)
        .map(|i| json!({"account": format!("a-{i:04}")}))
        .collect();
    let batch = app
        .post("/keys/batch", Some(json!({"accounts": accounts})))
        .await;
    assert_eq!(batch.status, 200, "{}", batch.body);
    let whole = app.client.get(app.url("/snapshot")).send().await.unwrap();
    let whole = whole.bytes().await.unwrap().to_vec();
    let half_end = whole
        .iter()
        .enumerate()
        .filter(|(_, b)| **b == b'\n')
        .nth(500)
        .unwrap()
        .0
        + 1;
    let (first, rest) = whole.split_at(half_end);

    let (go, wait) = tokio::sync::oneshot::channel();
    let url = stalling_server(first.to_vec(), Some(rest.to_vec()), wait).await;
    let mut export = tokio::process::Command::new(env!("CARGO_BIN_EXE_keyspread"))
        .args(["export", "--from", &url])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut out = tokio::io::BufReader::new(export.stdout.take().unwrap());
    let mut written = Vec::new();
    let mut line = Vec::new();
    // The head and 500 accounts are out while the server holds the rest back.
    while written.len() < first.len() {
        line.clear();
        let read = tokio::time::timeout(Duration::from_secs(20), out.read_until(b'\n', &mut line))
            .await
            .expect("the first half written before the second is sent")
            .unwrap();
        assert!(read > 0, "the export ended early");
        written.extend_from_slice(&line);
    }
    assert_eq!(written, first);
    go.send(()).unwrap();
    out.read_to_end(&mut written).await.unwrap();
    let done = export.wait_with_output().await.unwrap();
    assert!(done.status.success(), "{}", stderr(&done));
    assert!(
        written == whole,
        "the export is the snapshot, byte for byte"
    );

    let (go, wait) = tokio::sync::oneshot::channel();
    let url = stalling_server(first.to_vec(), None, wait).await;
    drop(go);
    let file = dir.path().join("cut.ndjson");
    let out = keyspread(&["export", "--from", &url, "--output", path(&file)]).await;
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("the snapshot was cut short"),
        "{}",
        stderr(&out)
    );
    assert!(!file.exists(), "no file for a snapshot cut short");

    // A database that is not there is not backed up as an empty table.
    let missing = sqlite_in(dir.path(), "missing.db");
    let out = keyspread(&["export", "--database-url", &missing]).await;
    assert!(!out.status.success());
    assert!(stderr(&out).contains("no database at"), "{}", stderr(&out));
    assert!(!dir.path().join("missing.db").exists());
}
