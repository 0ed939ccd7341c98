//! The proof that a restore never makes a producer's mirror hand out a key another account
//! holds: a server on SQLite with a Rust and a Python mirror following it; the README's
//! backup path (export, import into a fresh database, serve that on the same address); on
//! the restored server an account's key is released and given to another account. From the
//! moment the restored server answers on the mirrors' address, each mirror answers the
//! restored table or refuses (stale), and takes the restored table within seconds.
//!
//! The restored log is made longer than the mirrors' position, so that a mirror which took
//! the new log's events for its own would follow on from its old position: skip the
//! release and the reallocation, and answer the old key as fresh.

use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use keyspread_client::{Error, Mirror};
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};

use crate::backup::{import, keyspread, path};
use crate::helpers::{TestApp, spawn_app_with};
use crate::python_client::{assert_success, tool};

/// The lookup lifetime of both servers: the mirrors' `max_age_s`.
const MAX_AGE: Duration = Duration::from_secs(3);
/// How long the mirrors have to take the restored table.
const RECOVERY: Duration = Duration::from_secs(15);

/// What a mirror answered for an account.
#[derive(Debug, Clone, PartialEq)]
enum Seen {
    Stale,
    Keys(Option<Vec<String>>),
}

fn rust_seen(mirror: &Mirror, account: &str) -> Seen {
    match mirror.keys(account) {
        Err(Error::Stale(_)) => Seen::Stale,
        Err(other) => panic!("the Rust mirror: {other}"),
        Ok(keys) => Seen::Keys(keys.map(|k| k.to_vec())),
    }
}

/// A Python mirror in a process of its own (tests/python/mirror_answers.py).
struct PythonMirror {
    _child: Child,
    stdin: ChildStdin,
    lines: Lines<BufReader<ChildStdout>>,
}

impl PythonMirror {
    async fn start(url: &str) -> PythonMirror {
        let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
        let python = tool("KEYSPREAD_TEST_PYTHON", manifest.join(".venv/bin/python"));
        let mut child = Command::new(python)
            .arg(manifest.join("tests/python/mirror_answers.py"))
            .arg(url)
            .env("PYTHONPATH", manifest.join("clients/python"))
            .env("PYTHONDONTWRITEBYTECODE", "1")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("start the Python mirror");
        let stdin = child.stdin.take().unwrap();
        let lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let mut mirror = PythonMirror {
            _child: child,
            stdin,
            lines,
        };
        let ready = mirror.line().await;
        assert!(ready["ready"].is_i64(), "{ready}");
        mirror
    }

    async fn line(&mut self) -> Value {
        let line = tokio::time::timeout(Duration::from_secs(30), self.lines.next_line()).await;
        let line = line.expect("the Python mirror answers").unwrap();
        serde_json::from_str(&line.expect("the Python mirror is running")).unwrap()
    }

    /// What it answers now for `x` and `y`.
    async fn seen(&mut self) -> (Seen, Seen) {
        self.stdin.write_all(b"x y\n").await.unwrap();
        let answers = self.line().await;
        let seen = |account: &str| match &answers[account] {
            Value::String(s) if s == "stale" => Seen::Stale,
            Value::Null => Seen::Keys(None),
            keys => Seen::Keys(Some(serde_json::from_value(keys.clone()).unwrap())),
        };
        (seen("x"), seen("y"))
    }
}

/// Whether `who`'s answers are the restored table (x holds no key, y holds `key`);
/// panics on any fresh answer that is not.
fn restored_table(who: &str, (x, y): &(Seen, Seen), key: &str) -> bool {
    if let Seen::Keys(Some(keys)) = x {
        assert!(
            !keys.iter().any(|k| k == key),
            "{who} answered x's old key {key} as fresh while the server gives it to y"
        );
    }
    let want_x = Seen::Keys(None);
    let want_y = Seen::Keys(Some(vec![key.to_owned()]));
    for (account, seen, want) in [("x", x, &want_x), ("y", y, &want_y)] {
        assert!(
            *seen == Seen::Stale || seen == want,
            "{who} answered {account} -> {seen:?} as fresh; the server answers {want:?}"
        );
    }
    (x, y) == (&want_x, &want_y)
}

async fn serve(url: &str) -> TestApp {
    let url = url.to_owned();
    spawn_app_with(move |c| {
        c.database_url = url;
        c.lookup_cache_control = axum::http::HeaderValue::from_static("max-age=3");
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_restore_mirrors_answer_the_restored_table_or_stale_never_a_key_another_holds() {
    if !crate::skip::sqlite_only(
        "after_a_restore_mirrors_answer_the_restored_table_or_stale_never_a_key_another_holds",
    ) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let sqlite = |name: &str| format!("sqlite://{}", dir.path().join(name).display());
    let mut source = serve(&sqlite("source.db")).await;
    // x first: it holds the root of the tree, the key the walk hands out first once free.
    let key = source.allocate("x").await;
    for i in 0..10 {
        source.allocate(&format!("a-{i}")).await;
    }
    // A history longer than the table: the restored log starts shorter than it.
    for i in 0..20 {
        source.allocate(&format!("t-{i}")).await;
        assert_eq!(source.delete(&format!("/keys/t-{i}")).await.status, 204);
    }
    let position = source.db().await.last_event_id().await;
    let rust = Mirror::start(&source.url("")).await.expect("a Rust mirror");
    let mut python = PythonMirror::start(&source.url("")).await;
    let old = (Seen::Keys(Some(vec![key.clone()])), Seen::Keys(None));
    assert_eq!((rust_seen(&rust, "x"), rust_seen(&rust, "y")), old);
    assert_eq!(python.seen().await, old);

    // The backup path: export from the running server, import into a fresh database.
    let backup = dir.path().join("backup.ndjson");
    let export = [
        "export",
        "--from",
        &source.url(""),
        "--output",
        path(&backup),
    ];
    assert_success("keyspread export", &keyspread(&export).await);
    let restored_url = sqlite("restored.db");
    import(&backup, &restored_url).await;
    // Served elsewhere first: x released and its key given to y, then more changes, so
    // that the restored log runs past the mirrors' position.
    let mut restored = serve(&restored_url).await;
    assert_eq!(restored.delete("/keys/x").await.status, 204);
    assert_eq!(restored.allocate("y").await, key, "y gets x's old key");
    let mut i = 0;
    while restored.db().await.last_event_id().await <= position + 5 {
        restored.allocate(&format!("u-{i}")).await;
        i += 1;
    }

    // The old server goes; the restored one takes its address once the mirrors' table is
    // past max_age_s (a restore takes longer than that).
    source.stop().await;
    tokio::time::sleep(MAX_AGE + Duration::from_millis(500)).await;
    let stale = (Seen::Stale, Seen::Stale);
    assert_eq!((rust_seen(&rust, "x"), rust_seen(&rust, "y")), stale);
    assert_eq!(python.seen().await, stale);
    restored.config.listen = source.addr;
    let restored = restored.restart().await;
    let started = Instant::now();

    let (mut rust_took, mut python_took) = (None, None);
    let mut samples = 0;
    while started.elapsed() < RECOVERY {
        let at = started.elapsed();
        let seen = (rust_seen(&rust, "x"), rust_seen(&rust, "y"));
        if restored_table("the Rust mirror", &seen, &key) {
            rust_took.get_or_insert(at);
        }
        if restored_table("the Python mirror", &python.seen().await, &key) {
            python_took.get_or_insert(at);
        }
        samples += 1;
        // Both took it: watch them a second more, then stop.
        if let (Some(r), Some(p)) = (rust_took, python_took)
            && at > r.max(p) + Duration::from_secs(1)
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let rust_took = rust_took.expect("the Rust mirror took the restored table");
    let python_took = python_took.expect("the Python mirror took the restored table");
    assert_eq!(rust.snapshots(), 2);
    println!(
        "{samples} samples, no answer of x's old key; the restored table in the Rust mirror after \
         {rust_took:?}, in the Python mirror after {python_took:?} (log {} -> {})",
        position,
        restored.db().await.last_event_id().await
    );
}
