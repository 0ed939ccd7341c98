//! Start-up, restart, shutdown, health and the OpenAPI document.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::helpers::{spawn_app, spawn_app_with};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_rebuilds_the_tree_from_the_database() {
    let app = spawn_app_with(|c| c.keyspace_bits = 7).await;
    for account in ["a", "b", "c", "d", "e"] {
        app.allocate(account).await;
    }
    assert_eq!(app.delete("/keys/b").await.status, 204);
    let before = app.get("/keys?limit=10").await.body;

    let app = app.restart().await;
    assert_eq!(app.get("/keys?limit=10").await.body, before);
    assert_eq!(app.get("/keys/c").await.body["hash_key"], "96");
    // The walk continues where it was: b's freed 32 first, then the golden order.
    assert_eq!(app.allocate("f").await, "32");
    assert_eq!(app.allocate("g").await, "48");
    assert_eq!(app.get("/healthz").await.body["accounts"], 6);
}

/// Replicas upgrade one at a time: a keyspread restarting on a database that a newer
/// version migrated further (migrations only add) starts and serves reads; it refuses
/// changes (see `fold::a_keyspread_older_than_its_database_refuses_changes`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_migrated_by_a_newer_version_still_serves() {
    let app = spawn_app().await;
    let key = app.allocate("acme").await;
    app.db().await.record_newer_migration().await;
    let app = app.restart().await;
    assert_eq!(app.get("/keys/acme").await.body["hash_key"], key.as_str());
    assert_eq!(app.post("/keys/globex", None).await.status, 503);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_keeps_its_keyspace_width() {
    let mut app = spawn_app_with(|c| c.keyspace_bits = 7).await;
    app.allocate("a").await;
    app.stop().await;
    let mut config = app.config.clone();
    config.keyspace_bits = 128;
    let err = keyspread::AppState::open(&config)
        .await
        .err()
        .expect("refused");
    assert!(
        err.to_string().contains("7-bit keyspace but 128 bits"),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_and_readiness() {
    let app = spawn_app().await;
    let health = app.get("/healthz").await;
    assert_eq!(
        (health.status, health.body["status"].as_str()),
        (200, Some("ok"))
    );
    let ready = app.get("/readyz").await;
    assert_eq!(
        (ready.status, ready.body["status"].as_str()),
        (200, Some("ready"))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn committed_openapi_document_is_current() {
    let committed =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/openapi/openapi.json"))
            .expect("openapi/openapi.json exists");
    let generated = keyspread::http::openapi_json();
    assert!(
        committed.trim_end() == generated.trim_end(),
        "openapi/openapi.json is stale: run `make openapi` and commit it"
    );
    let app = spawn_app().await;
    let served = app.get("/openapi.json").await;
    let committed: serde_json::Value = serde_json::from_str(&committed).unwrap();
    assert_eq!(served.body, committed);
    let docs = app.client.get(app.url("/docs/")).send().await.unwrap();
    assert_eq!(docs.status(), 200);
    assert!(docs.text().await.unwrap().contains("swagger"));
}

/// The OpenAPI 3.0.3 rendition, for generators that read 3.0 only: committed, served and
/// printed as the code makes it now.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn committed_openapi_30_rendition_is_current() {
    let committed = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/openapi/openapi-3.0.json"
    ))
    .expect("openapi/openapi-3.0.json exists");
    let generated = keyspread::http::openapi_30_json();
    assert!(
        committed.trim_end() == generated.trim_end(),
        "openapi/openapi-3.0.json is stale: run `make openapi` and commit it"
    );
    let app = spawn_app().await;
    let served = app.get("/openapi-3.0.json").await;
    let committed: serde_json::Value = serde_json::from_str(&committed).unwrap();
    assert_eq!(
        (served.status, served.content_type.as_str()),
        (200, "application/json")
    );
    assert_eq!(served.body, committed);
    assert_eq!(committed["openapi"], "3.0.3");
    let document: serde_json::Value =
        serde_json::from_str(&keyspread::http::openapi_json()).unwrap();
    assert_eq!(
        committed["paths"]
            .as_object()
            .unwrap()
            .keys()
            .collect::<Vec<_>>(),
        document["paths"]
            .as_object()
            .unwrap()
            .keys()
            .collect::<Vec<_>>()
    );
}

/// Waits until `url` answers 200, or panics after `limit`.
async fn wait_healthy(url: &str, limit: Duration) {
    let started = Instant::now();
    while started.elapsed() < limit {
        if reqwest::get(url).await.is_ok_and(|r| r.status() == 200) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("{url} not healthy after {limit:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_creates_its_database_and_stops_on_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut child = Command::new(env!("CARGO_BIN_EXE_keyspread"))
        .arg("serve")
        .current_dir(dir.path())
        .env("KEYSPREAD_LISTEN", format!("127.0.0.1:{port}"))
        .env_remove("DATABASE_URL")
        .env_remove("KEYSPREAD_TOKEN")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    wait_healthy(
        &format!("http://127.0.0.1:{port}/healthz"),
        Duration::from_secs(20),
    )
    .await;
    assert!(
        dir.path().join("keyspread.db").exists(),
        "default database created in the working directory"
    );

    let status = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let started = Instant::now();
    let exit = loop {
        if let Some(exit) = child.try_wait().unwrap() {
            break exit;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "still running 10 s after SIGTERM"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(exit.success(), "clean exit on SIGTERM: {exit}");
}

#[test]
fn openapi_subcommand_prints_the_document() {
    let out = Command::new(env!("CARGO_BIN_EXE_keyspread"))
        .arg("openapi")
        .output()
        .unwrap();
    assert!(out.status.success());
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(doc["info"]["title"], "keyspread");
    assert!(doc["paths"]["/keys/{account}"]["post"].is_object());
    for (version, printed) in [
        ("3.1", keyspread::http::openapi_json()),
        ("3.0", keyspread::http::openapi_30_json()),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_keyspread"))
            .args(["openapi", "--version", version])
            .output()
            .unwrap();
        assert!(out.status.success(), "openapi --version {version}");
        assert_eq!(
            String::from_utf8_lossy(&out.stdout).trim_end(),
            printed.trim_end()
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_put_command_registers_a_list_shards_file() {
    let app = spawn_app().await;
    let half = 1u128 << 127;
    let listed = serde_json::json!({"Shards": [
        {"ShardId": "shardId-000000000000", "HashKeyRange": {"StartingHashKey": "0", "EndingHashKey": u128::MAX.to_string()},
         "SequenceNumberRange": {"StartingSequenceNumber": "1", "EndingSequenceNumber": "2"}},
        {"ShardId": "shardId-000000000001", "ParentShardId": "shardId-000000000000",
         "HashKeyRange": {"StartingHashKey": "0", "EndingHashKey": (half - 1).to_string()},
         "SequenceNumberRange": {"StartingSequenceNumber": "3"}},
        {"ShardId": "shardId-000000000002", "ParentShardId": "shardId-000000000000",
         "HashKeyRange": {"StartingHashKey": half.to_string(), "EndingHashKey": u128::MAX.to_string()},
         "SequenceNumberRange": {"StartingSequenceNumber": "4"}}
    ]});
    let file = app.dir().join("orders.json");
    std::fs::write(&file, listed.to_string()).unwrap();
    // The server runs on this test's runtime: wait for the command without blocking it.
    let run = |args: &[&str]| {
        tokio::process::Command::new(env!("CARGO_BIN_EXE_keyspread"))
            .args(["streams", "put", "orders", "--from"])
            .args(args)
            .args(["--url", &app.url("")])
            .env_remove("KEYSPREAD_TOKEN")
            .output()
    };
    let out = run(&[file.to_str().unwrap(), "--primary"]).await.unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("registered stream orders: 2 open shards (primary)"),
        "{stdout}"
    );
    let stream = app.get("/streams/orders").await.body;
    assert_eq!(
        (
            stream["primary"].as_bool(),
            stream["next_shard_number"].as_u64()
        ),
        (Some(true), Some(3))
    );

    // A file whose open shards leave a gap is refused before anything is sent.
    let mut broken = listed.clone();
    broken["Shards"][2]["HashKeyRange"]["StartingHashKey"] = (half + 10).to_string().into();
    std::fs::write(&file, broken.to_string()).unwrap();
    let out = run(&[file.to_str().unwrap()]).await.unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("gap: no open shard covers"));
}

#[test]
fn migrate_prepares_a_database_without_serving() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("fresh.db").display());
    let out = Command::new(env!("CARGO_BIN_EXE_keyspread"))
        .args(["migrate", "--database-url", &url])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("is up to date"));
    assert!(dir.path().join("fresh.db").exists());
    let refused = Command::new(env!("CARGO_BIN_EXE_keyspread"))
        .args(["migrate", "--database-url", "mysql://db/keys"])
        .output()
        .unwrap();
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("unsupported database URL"));
}

/// Another writer holding the write lock for long (a stuck replica, a big transaction)
/// does not stop a replica from starting: start-up reads one consistent state of the
/// database and takes no lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_starts_while_another_writer_holds_the_lock() {
    let app = spawn_app().await;
    let key = app.allocate("acme").await;
    let mut db = app.db().await;
    db.hold_write_lock().await;
    let app = tokio::time::timeout(Duration::from_secs(30), app.restart())
        .await
        .expect("start-up waited for the write lock");
    assert_eq!(app.get("/keys/acme").await.body["hash_key"], key.as_str());
    assert_eq!(app.get("/readyz").await.status, 200);
    db.release_write_lock().await;
    assert_eq!(app.post("/keys/globex", None).await.status, 201);
}

/// A second `keyspread serve` on a taken address says which address, and exits 1, before
/// it touches the database (the file is not even created).
#[test]
fn a_port_in_use_is_named_in_the_error() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("k.db").display());
    let (code, stderr) = crate::startup::serve_on(&addr.to_string(), &url, dir.path());
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!("cannot listen on {addr}: address already in use")),
        "{stderr}"
    );
    assert!(
        !dir.path().join("k.db").exists(),
        "the database was created by a process that could not listen"
    );
    drop(taken);
}

#[test]
fn serve_refuses_a_lookup_cache_control_that_outlives_a_switch_or_stales_mirrors() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("never.db");
    let url = format!("sqlite://{}", db.display());
    for (value, needle) in [
        ("max-age=86401", "86400"),
        ("public, s-maxage=90000", "86400"),
        ("max-age=86400, stale-while-revalidate=1", "86400"),
        ("max-age=60, max-age=600", "max-age is given twice"),
        ("max-age=60, MAX-AGE=60", "max-age is given twice"),
        ("max-age=soon", "max-age"),
        ("max-age=0", "Stale"),
        ("no-cache", "max-age=60, no-cache"),
        ("no-store", "0 s"),
    ] {
        let mut child = Command::new(env!("CARGO_BIN_EXE_keyspread"))
            .args(["serve", "--listen", "127.0.0.1:0", "--database-url", &url])
            .args(["--lookup-cache-control", value])
            .env_remove("KEYSPREAD_TOKEN")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let started = Instant::now();
        let status = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break status;
            }
            if started.elapsed() > Duration::from_secs(10) {
                child.kill().unwrap();
                child.wait().unwrap();
                panic!("{value}: still serving after 10 s");
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        let mut stderr = String::new();
        std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
        assert_eq!(status.code(), Some(2), "{value}: {stderr}");
        assert!(
            stderr.contains("--lookup-cache-control"),
            "{value}: {stderr}"
        );
        assert!(stderr.contains(needle), "{value}: {stderr}");
        assert!(
            !db.exists(),
            "{value}: refused before the database is touched"
        );
    }
}
