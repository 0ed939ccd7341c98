//! A statement the database refuses (a lock timeout, a killed backend, a full disk) fails
//! its own request only: no pooled connection stays in a transaction afterwards, so every
//! later request, reads included, is answered.

use std::collections::BTreeMap;
use std::time::Duration;

use sqlx::Connection;

use serde_json::json;
use tokio::task::JoinSet;

use crate::helpers::{Db, backend, fresh_database};
use crate::process::Server;

/// What a run of requests was answered, by status.
type Statuses = BTreeMap<u16, usize>;

/// Request `i` of a mix that touches every path a pooled connection serves: a lookup of an
/// account that stays, an allocation, a release of an account made for it, readiness.
/// Round "hold" releases only: each release begins a write transaction of its own.
fn request(client: &reqwest::Client, url: &str, round: &str, i: usize) -> reqwest::RequestBuilder {
    let kind = if round == "hold" { 2 } else { i % 4 };
    match kind {
        0 => client.get(format!("{url}/keys/base-{}", i % 20)),
        1 => client.post(format!("{url}/keys/new-{round}-{i}")),
        2 => client.delete(format!("{url}/keys/gone-{round}-{i}")),
        _ => client.get(format!("{url}/readyz")),
    }
}

/// Creates the accounts [`request`] looks up and the ones it releases in `round`.
async fn prepare(client: &reqwest::Client, url: &str, round: &str, requests: usize) {
    let mut accounts: Vec<_> = (0..20)
        .map(|i| json!({"account": format!("base-{i}")}))
        .collect();
    if round == "hold" {
        accounts.clear();
    }
    accounts.extend(
        (0..requests)
            .filter(|i| round == "hold" || i % 4 == 2)
            .map(|i| json!({"account": format!("gone-{round}-{i}")})),
    );
    let made = client
        .post(format!("{url}/keys/batch"))
        .json(&json!({"accounts": accounts}))
        .send()
        .await
        .unwrap();
    assert!(made.status().is_success(), "{}", made.text().await.unwrap());
}

/// Sends `n` requests of the mix, 8 at a time, and counts the answers.
async fn fire(client: &reqwest::Client, url: &str, round: &str, n: usize) -> Statuses {
    let mut statuses = Statuses::new();
    let mut running = JoinSet::new();
    for i in 0..n {
        if running.len() == 8 {
            let status: u16 = running.join_next().await.unwrap().unwrap();
            *statuses.entry(status).or_default() += 1;
        }
        let sent = request(client, url, round, i).send();
        running.spawn(async move { sent.await.map_or(0, |r| r.status().as_u16()) });
    }
    while let Some(status) = running.join_next().await {
        *statuses.entry(status.unwrap()).or_default() += 1;
    }
    statuses
}

/// Answers other than 200, 201 and 204.
fn failures(statuses: &Statuses) -> usize {
    statuses
        .iter()
        .filter(|(s, _)| ![200, 201, 204].contains(*s))
        .map(|(_, n)| n)
        .sum()
}

/// The server's log from `log`, asserting it never says a connection was left in an
/// aborted transaction.
fn assert_no_aborted_transaction(log: &std::path::Path) {
    let text = std::fs::read_to_string(log).unwrap();
    let aborted = text
        .lines()
        .filter(|l| l.contains("transaction is aborted"))
        .count();
    assert_eq!(
        aborted, 0,
        "a pooled connection stayed in an aborted transaction:\n{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_refused_while_another_writer_holds_the_lock_leave_every_connection_clean() {
    let dir = tempfile::tempdir().unwrap();
    let (url, _postgres) = fresh_database(dir.path()).await;
    let log = dir.path().join("server.log");
    let mut server = Server::spawn(&url, &log);
    let client = reqwest::Client::new();
    server.wait_ready(&client).await;
    prepare(&client, &server.url, "hold", 24).await;
    prepare(&client, &server.url, "after", 200).await;

    // Another writer holds the write lock for 2 s while changes keep coming.
    let mut other = Db::connect(&url).await;
    other.hold_write_lock().await;
    let during = {
        let (client, base) = (client.clone(), server.url.clone());
        tokio::spawn(async move { fire(&client, &base, "hold", 24).await })
    };
    tokio::time::sleep(Duration::from_secs(2)).await;
    other.release_write_lock().await;
    let during = during.await.unwrap();
    // Refused (503) or done; never a 500.
    let broken: usize = during
        .iter()
        .filter(|(s, _)| ![200, 201, 204, 503].contains(*s))
        .map(|(_, n)| n)
        .sum();
    assert_eq!(
        broken,
        0,
        "{} while the lock was held: {during:?}",
        backend(&url)
    );

    tokio::time::sleep(Duration::from_secs(2)).await;
    let after = fire(&client, &server.url, "after", 200).await;
    println!("{}: while held {during:?}, after {after:?}", backend(&url));
    assert_eq!(
        failures(&after),
        0,
        "{} after the hold: {after:?}",
        backend(&url)
    );
    server.kill();
    assert_no_aborted_transaction(&log);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backends_terminated_mid_traffic_are_replaced_and_every_later_request_is_answered() {
    const TEST: &str =
        "backends_terminated_mid_traffic_are_replaced_and_every_later_request_is_answered";
    if crate::skip::postgres_only(TEST).is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (url, _postgres) = fresh_database(dir.path()).await;
    let log = dir.path().join("server.log");
    let mut server = Server::spawn(&url, &log);
    let client = reqwest::Client::new();
    server.wait_ready(&client).await;
    prepare(&client, &server.url, "kill", 400).await;
    prepare(&client, &server.url, "after", 200).await;

    let traffic = {
        let (client, base) = (client.clone(), server.url.clone());
        tokio::spawn(async move { fire(&client, &base, "kill", 400).await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut admin = sqlx::PgConnection::connect(&url).await.unwrap();
    let terminated: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
         WHERE datname = current_database() AND pid <> pg_backend_pid()) AS t",
    )
    .fetch_one(&mut admin)
    .await
    .unwrap();
    assert!(terminated > 0, "no backend of the server was terminated");
    assert!(
        !traffic.is_finished(),
        "the backends were terminated after the traffic"
    );
    let during = traffic.await.unwrap();

    tokio::time::sleep(Duration::from_secs(2)).await;
    let after = fire(&client, &server.url, "after", 200).await;
    println!("postgres: {terminated} backends terminated; around it {during:?}, after {after:?}");
    assert_eq!(
        failures(&after),
        0,
        "after the backends were terminated: {after:?}"
    );
    server.kill();
    assert_no_aborted_transaction(&log);
}

/// A small tmpfs mounted for one test, unmounted (lazily, whatever still holds it open)
/// when dropped.
struct SmallDisk {
    path: std::path::PathBuf,
}

impl SmallDisk {
    /// Mounts a tmpfs of `size` (as `mount -o size=` reads it) under `dir`, or says why not.
    fn mount(dir: &std::path::Path, size: &str) -> Result<SmallDisk, String> {
        let path = dir.join("disk");
        std::fs::create_dir(&path).map_err(|e| e.to_string())?;
        let mounted = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(&path)
            .output()
            .map_err(|e| format!("cannot run mount: {e}"))?;
        if !mounted.status.success() {
            return Err(format!(
                "mount refused a tmpfs: {}",
                String::from_utf8_lossy(&mounted.stderr).trim()
            ));
        }
        Ok(SmallDisk { path })
    }

    /// Writes a file that takes every free byte left.
    fn fill(&self) -> std::path::PathBuf {
        use std::io::Write as _;
        let filler = self.path.join("filler");
        let mut file = std::fs::File::create(&filler).unwrap();
        let chunk = vec![0u8; 4096];
        while file.write_all(&chunk).is_ok() {}
        filler
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(&self.path)
            .status();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_refuses_writes_with_503_until_space_is_freed_without_a_restart() {
    // SQLite only: a Postgres database's disk is the server's.
    const TEST: &str = "a_full_disk_refuses_writes_with_503_until_space_is_freed_without_a_restart";
    if !crate::skip::sqlite_only(TEST) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let disk = match SmallDisk::mount(dir.path(), "2m") {
        Ok(disk) => disk,
        Err(why) => {
            crate::skip::skipped(TEST, &format!("needs a small tmpfs to fill: {why}"));
            return;
        }
    };
    let url = format!("sqlite://{}", disk.path.join("keyspread.db").display());
    let app = crate::helpers::spawn_app_with(|c| c.database_url = url).await;
    for i in 0..10 {
        app.allocate(&format!("before-{i}")).await;
    }
    let filler = disk.fill();

    // Batches of allocations until the disk refuses one: 503 and Retry-After from the
    // first refusal on, never a 500; readiness says not ready.
    let mut refused = 0;
    for round in 0..200 {
        let accounts: Vec<_> = (0..50)
            .map(|i| json!({"account": format!("full-{round}-{i}")}))
            .collect();
        let batch = app
            .client
            .post(app.url("/keys/batch"))
            .json(&json!({"accounts": accounts}))
            .send()
            .await
            .unwrap();
        let status = batch.status().as_u16();
        let retry = batch.headers().get("retry-after").cloned();
        let body = batch.text().await.unwrap();
        match status {
            200 | 201 if refused == 0 => continue,
            503 => {
                assert!(retry.is_some(), "503 without Retry-After: {body}");
                refused += 1;
                if refused == 3 {
                    break;
                }
            }
            _ => panic!("round {round}, {refused} refused before: {status} {body}"),
        }
    }
    assert_eq!(refused, 3, "the disk never filled");
    let single = app.post("/keys/one-more", None).await;
    assert_eq!(single.status, 503, "{}", single.body);
    let writes = app.get("/readyz/writes").await;
    assert_eq!(
        writes.status, 503,
        "writable while writes fail: {}",
        writes.body
    );
    assert_eq!(writes.body["reason"], "disk_full");
    let ready = app.get("/readyz").await;
    assert_eq!(ready.status, 200, "lookups are answered: {}", ready.body);
    // Lookups still answer from memory.
    assert_eq!(app.get("/keys/before-3").await.status, 200);

    // Space back: write readiness returns by itself (no write has come to prove it), and
    // writes with it, without a restart.
    std::fs::remove_file(filler).unwrap();
    let writes = app.get("/readyz/writes").await;
    assert_eq!(writes.status, 200, "{}", writes.body);
    let back = app.post("/keys/after-freeing", None).await;
    assert_eq!(back.status, 201, "{}", back.body);
    let released = app.delete("/keys/before-4").await;
    assert_eq!(released.status, 204, "{}", released.body);
    drop(app);
}
