//! Test harness: the real server on 127.0.0.1:0 over a fresh database per test.
//!
//! SQLite by default; with `KEYSPREAD_TEST_POSTGRES` set to a server URL, every test gets
//! a fresh database on that server instead, so the same suite runs on both backends.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use keyspread::config::ServeConfig;
use sqlx::Connection;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

pub use crate::skip::required_tool;

/// A running keyspread with its own database, shut down when dropped.
pub struct TestApp {
    pub addr: SocketAddr,
    pub client: reqwest::Client,
    pub config: ServeConfig,
    shutdown: Option<oneshot::Sender<()>>,
    server: Option<JoinHandle<()>>,
    // Held so the database outlives the server.
    dir: tempfile::TempDir,
    postgres: Option<PgDatabase>,
}

impl TestApp {
    /// Full URL for a path such as `/keys/acme`.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }

    /// The directory holding this app's database file.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Stops the server gracefully and waits for it, keeping the database.
    pub async fn stop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(server) = self.server.take() {
            server.await.expect("server task panicked");
        }
    }

    /// Stops the server and starts a new one on the same database.
    pub async fn restart(mut self) -> TestApp {
        self.stop().await;
        let config = self.config.clone();
        let dir = std::mem::replace(&mut self.dir, tempfile::tempdir().unwrap());
        let mut app = start(config, dir).await;
        app.postgres = self.postgres.take();
        app
    }

    /// A direct connection to this app's database.
    pub async fn db(&self) -> Db {
        Db::connect(&self.config.database_url).await
    }
}

impl Db {
    /// A direct connection to the database at `url`, or why not.
    pub async fn try_connect(url: &str) -> Result<Db, sqlx::Error> {
        Ok(if url.starts_with("postgres") {
            Db::Postgres(sqlx::PgConnection::connect(url).await?)
        } else {
            Db::Sqlite(sqlx::SqliteConnection::connect(url).await?)
        })
    }

    /// A direct connection to the database at `url`.
    pub async fn connect(url: &str) -> Db {
        if url.starts_with("postgres") {
            Db::Postgres(
                sqlx::PgConnection::connect(url)
                    .await
                    .expect("connect to postgres"),
            )
        } else {
            Db::Sqlite(
                sqlx::SqliteConnection::connect(url)
                    .await
                    .expect("open sqlite"),
            )
        }
    }
}

impl Drop for TestApp {
    fn drop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
    }
}

/// Starts keyspread on a 128-bit keyspace with no token (loopback clients may mutate).
pub async fn spawn_app() -> TestApp {
    spawn_app_with(|_| {}).await
}

/// Starts keyspread after letting the caller adjust its configuration.
pub async fn spawn_app_with(adjust: impl FnOnce(&mut ServeConfig)) -> TestApp {
    let dir = tempfile::tempdir().expect("temp dir");
    let (url, postgres) = fresh_database(dir.path()).await;
    let mut config = ServeConfig::for_tests(url);
    adjust(&mut config);
    let mut app = start(config, dir).await;
    app.postgres = postgres;
    app
}

/// A fresh database for one test: a database on the `KEYSPREAD_TEST_POSTGRES` server when
/// that is set (dropped with the returned guard), else a SQLite file in `dir`.
pub async fn fresh_database(dir: &Path) -> (String, Option<PgDatabase>) {
    match std::env::var("KEYSPREAD_TEST_POSTGRES") {
        Ok(server) if !server.is_empty() => {
            let db = PgDatabase::create(&server).await;
            (db.url.clone(), Some(db))
        }
        _ => (sqlite_url(dir), None),
    }
}

/// `postgres` or `sqlite`, for what a test prints.
pub fn backend(url: &str) -> &'static str {
    if url.starts_with("postgres") {
        "postgres"
    } else {
        "sqlite"
    }
}

fn sqlite_url(dir: &Path) -> String {
    let file: PathBuf = dir.join("keyspread.db");
    format!("sqlite://{}", file.display())
}

/// A database created for one test on the Postgres server, dropped after it.
pub struct PgDatabase {
    server: String,
    name: String,
    pub url: String,
}

impl PgDatabase {
    pub async fn create(server: &str) -> PgDatabase {
        let name = format!("keyspread_test_{}", uuid::Uuid::new_v4().simple());
        let mut admin = sqlx::PgConnection::connect(server)
            .await
            .expect("connect to KEYSPREAD_TEST_POSTGRES");
        sqlx::query(&format!("CREATE DATABASE {name}"))
            .execute(&mut admin)
            .await
            .expect("create database");
        let base = server.rsplit_once('/').map_or(server, |(base, _)| base);
        PgDatabase {
            server: server.to_owned(),
            url: format!("{base}/{name}"),
            name,
        }
    }
}

impl Drop for PgDatabase {
    fn drop(&mut self) {
        let (server, name) = (self.server.clone(), self.name.clone());
        // Drop runs inside the test's runtime: do the async work on a thread of its own.
        // (Tests use the multi-threaded runtime, so the app's connections are still
        // served while this waits and Postgres can close them.)
        let dropped = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async {
                if let Ok(mut admin) = sqlx::PgConnection::connect(&server).await {
                    let _ = sqlx::query(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
                        .execute(&mut admin)
                        .await;
                }
            });
        });
        let _ = dropped.join();
    }
}

/// A direct connection to a test app's database, for checking what was stored.
pub enum Db {
    Sqlite(sqlx::SqliteConnection),
    Postgres(sqlx::PgConnection),
}

/// An `events` row: kind, account, stream, key before, key after, weight, detail.
pub type EventRow = (
    String,
    Option<String>,
    Option<String>,
    Option<Vec<u8>>,
    Option<Vec<u8>>,
    Option<i64>,
    Option<String>,
);

/// An `assignments` row: account, key index, hash key, weight (that key's share), and the
/// old key and switch time the last staged move of the key left (NULL if none).
pub type KeyRow = (String, i64, Vec<u8>, i64, Option<Vec<u8>>, Option<i64>);

/// An `events` row with the key it is about: time (one change's events share it), kind,
/// account, key index, key before, key after, weight, switch time (moves).
pub type IndexedEvent = (
    i64,
    String,
    Option<String>,
    i64,
    Option<Vec<u8>>,
    Option<Vec<u8>>,
    Option<i64>,
    Option<i64>,
);

/// An `events` row about an account: id, kind, account, key before, key after, weight.
pub type AccountEvent = (
    i64,
    String,
    String,
    Option<Vec<u8>>,
    Option<Vec<u8>>,
    Option<i64>,
);

/// The same query on either connection.
macro_rules! on_db {
    ($db:expr, $conn:ident => $body:expr) => {
        match $db {
            Db::Sqlite($conn) => $body,
            Db::Postgres($conn) => $body,
        }
    };
}

impl Db {
    /// Inserts an assignment behind the server's back, as an import would.
    pub async fn insert_assignment(&mut self, account: &str, key: u128) {
        self.execute_with_key(
            "INSERT INTO assignments (account, hash_key, weight, created_at) VALUES ($1, $2, 1, 0)",
            account,
            key,
        )
        .await;
    }

    /// Deletes `account`'s assignment behind the server's back, logging nothing.
    pub async fn delete_assignment(&mut self, account: &str) {
        on_db!(self, c => sqlx::query("DELETE FROM assignments WHERE account = $1")
            .bind(account)
            .execute(c)
            .await
            .map(|done| done.rows_affected())
            .unwrap());
    }

    /// Records a migration this keyspread does not know, as a newer version migrating the
    /// database would.
    pub async fn record_newer_migration(&mut self) {
        on_db!(self, c => sqlx::query(
            "INSERT INTO _sqlx_migrations (version, description, success, checksum, execution_time) \
             VALUES (99990101000000, 'a migration of a newer keyspread', TRUE, $1, 0)",
        )
        .bind(vec![0u8; 48])
        .execute(c)
        .await
        .map(|done| done.rows_affected())
        .unwrap());
    }

    /// Runs `sql` with `params` as `$1`, `$2`, ... (text).
    pub async fn execute(&mut self, sql: &str, params: &[&str]) {
        on_db!(self, c => {
            let mut query = sqlx::query(sql);
            for param in params {
                query = query.bind(*param);
            }
            query.execute(c).await.map(|done| done.rows_affected()).unwrap()
        });
    }

    /// Runs `sql` with `account` as `$1` and `key`, big-endian, as `$2`.
    async fn execute_with_key(&mut self, sql: &str, account: &str, key: u128) {
        on_db!(self, c => sqlx::query(sql)
            .bind(account)
            .bind(key.to_be_bytes().to_vec())
            .execute(c)
            .await
            .map(|done| done.rows_affected())
            .unwrap());
    }

    /// As [`Db::execute_with_key`], answering the database's refusal instead of panicking.
    pub async fn try_execute_with_key(
        &mut self,
        sql: &str,
        account: &str,
        key: u128,
    ) -> Result<u64, String> {
        on_db!(self, c => sqlx::query(sql)
            .bind(account)
            .bind(key.to_be_bytes().to_vec())
            .execute(c)
            .await
            .map(|done| done.rows_affected())
            .map_err(|e| e.to_string()))
    }

    /// Hash keys as `ORDER BY hash_key` returns them.
    pub async fn keys_in_stored_order(&mut self) -> Vec<u128> {
        let rows: Vec<(Vec<u8>,)> = on_db!(self, c => sqlx::query_as("SELECT hash_key FROM assignments ORDER BY hash_key")
            .fetch_all(c)
            .await
            .unwrap());
        rows.into_iter()
            .map(|(k,)| u128::from_be_bytes(k.try_into().unwrap()))
            .collect()
    }

    /// The Idempotency-Keys an answer is kept for, of every actor.
    pub async fn kept_keys(&mut self) -> Vec<String> {
        on_db!(self, c => sqlx::query_scalar("SELECT key FROM idempotency")
            .fetch_all(c)
            .await
            .unwrap())
    }

    /// Every event, oldest first.
    pub async fn events(&mut self) -> Vec<EventRow> {
        on_db!(self, c => sqlx::query_as("SELECT kind, account, stream, key_before, key_after, weight, detail FROM events ORDER BY id")
            .fetch_all(c)
            .await
            .unwrap())
    }

    /// How the database would run `sql` with `params` as `$1`, `$2`, ... (text): SQLite's
    /// `EXPLAIN QUERY PLAN` or Postgres' `EXPLAIN`, one line per step.
    pub async fn query_plan(&mut self, sql: &str, params: &[&str]) -> String {
        let lines: Vec<String> = match self {
            Db::Sqlite(c) => {
                let explain = format!("EXPLAIN QUERY PLAN {sql}");
                let mut query = sqlx::query_as::<_, (i64, i64, i64, String)>(&explain);
                for param in params {
                    query = query.bind(*param);
                }
                let rows = query.fetch_all(c).await.unwrap();
                rows.into_iter().map(|(_, _, _, step)| step).collect()
            }
            Db::Postgres(c) => {
                let explain = format!("EXPLAIN {sql}");
                let mut query = sqlx::query_scalar::<_, String>(&explain);
                for param in params {
                    query = query.bind(*param);
                }
                query.fetch_all(c).await.unwrap()
            }
        };
        lines.join("\n")
    }

    /// Runs statements, several at once, that take no parameters.
    pub async fn execute_script(&mut self, sql: &str) {
        on_db!(self, c => {
            sqlx::raw_sql(sql).execute(c).await.unwrap();
        });
    }

    /// The id of the newest event (0 when the log is empty).
    pub async fn last_event_id(&mut self) -> i64 {
        on_db!(self, c => sqlx::query_scalar("SELECT COALESCE(MAX(id), 0) FROM events")
            .fetch_one(c)
            .await
            .unwrap())
    }

    /// The ids of the events the log holds, oldest first.
    pub async fn event_ids(&mut self) -> Vec<i64> {
        on_db!(self, c => sqlx::query_scalar("SELECT id FROM events ORDER BY id")
            .fetch_all(c)
            .await
            .unwrap())
    }

    /// Every event about an account, oldest first: id, kind, account, key before, key
    /// after, weight.
    pub async fn account_events(&mut self) -> Vec<AccountEvent> {
        on_db!(self, c => sqlx::query_as(
            "SELECT id, kind, account, key_before, key_after, weight FROM events \
             WHERE account IS NOT NULL ORDER BY id",
        )
        .fetch_all(c)
        .await
        .unwrap())
    }

    /// Takes the database's write lock as another writer would, until
    /// [`Db::release_write_lock`]: SQLite's `BEGIN IMMEDIATE`, Postgres' advisory lock.
    pub async fn hold_write_lock(&mut self) {
        match self {
            Db::Sqlite(c) => {
                sqlx::raw_sql("BEGIN IMMEDIATE").execute(c).await.unwrap();
            }
            Db::Postgres(c) => {
                // The store's lock: "keyspread" in ASCII, 0x6b65_7973_7072_6561.
                sqlx::raw_sql("BEGIN; SELECT pg_advisory_xact_lock(7738725071420810593)")
                    .execute(c)
                    .await
                    .unwrap();
            }
        }
    }

    /// Allocates `key` to `account` as another replica would: the row and its event.
    pub async fn log_allocation(&mut self, account: &str, key: u128) {
        self.insert_assignment(account, key).await;
        self.execute_with_key(
            "INSERT INTO events (at, kind, account, key_after, weight) VALUES (0, 'allocate', $1, $2, 1)",
            account,
            key,
        )
        .await;
    }

    /// Commits what was written since [`Db::hold_write_lock`], releasing the lock.
    pub async fn commit(&mut self) {
        on_db!(self, c => {
            sqlx::raw_sql("COMMIT").execute(c).await.unwrap();
        });
    }

    pub async fn release_write_lock(&mut self) {
        on_db!(self, c => {
            sqlx::raw_sql("ROLLBACK").execute(c).await.unwrap();
        });
    }

    /// Every key row, by account and index.
    pub async fn key_rows(&mut self) -> Vec<KeyRow> {
        on_db!(self, c => sqlx::query_as(
            "SELECT account, idx, hash_key, weight, prev_hash_key, switch_at FROM assignments ORDER BY account, idx",
        )
        .fetch_all(c)
        .await
        .unwrap())
    }

    /// Every event with its key index, oldest first.
    pub async fn indexed_events(&mut self) -> Vec<IndexedEvent> {
        on_db!(self, c => sqlx::query_as(
            "SELECT at, kind, account, idx, key_before, key_after, weight, switch_at FROM events ORDER BY id",
        )
        .fetch_all(c)
        .await
        .unwrap())
    }

    /// `(account, hash key, weight)` of every assignment, by account.
    pub async fn assignments(&mut self) -> Vec<(String, Vec<u8>, i64)> {
        on_db!(self, c => sqlx::query_as("SELECT account, hash_key, weight FROM assignments ORDER BY account")
            .fetch_all(c)
            .await
            .unwrap())
    }
}

async fn start(config: ServeConfig, dir: tempfile::TempDir) -> TestApp {
    // Port 0 unless a test pinned it (to restart on the same address).
    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .unwrap_or_else(|e| panic!("bind {}: {e}", config.listen));
    let addr = listener.local_addr().unwrap();
    let state = keyspread::AppState::open(&config)
        .await
        .expect("open state");
    let (tx, rx) = oneshot::channel::<()>();
    let server = tokio::spawn(async move {
        keyspread::serve(listener, state, async {
            let _ = rx.await;
        })
        .await
        .expect("server failed");
    });
    TestApp {
        addr,
        client: reqwest::Client::new(),
        config,
        shutdown: Some(tx),
        server: Some(server),
        dir,
        postgres: None,
    }
}

/// A JSON response: status, content type and body.
#[derive(Debug)]
pub struct Answer {
    pub status: u16,
    pub content_type: String,
    pub body: serde_json::Value,
}

impl TestApp {
    /// Sends a request with an optional JSON body and reads the answer as JSON.
    pub async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<serde_json::Value>,
    ) -> Answer {
        let mut request = self.client.request(method, self.url(path));
        if let Some(body) = body {
            request = request.json(&body);
        }
        answer(request.send().await.expect("request sent")).await
    }

    pub async fn get(&self, path: &str) -> Answer {
        self.call(reqwest::Method::GET, path, None).await
    }

    pub async fn post(&self, path: &str, body: Option<serde_json::Value>) -> Answer {
        self.call(reqwest::Method::POST, path, body).await
    }

    pub async fn delete(&self, path: &str) -> Answer {
        self.call(reqwest::Method::DELETE, path, None).await
    }

    /// The value of an unlabelled series of `/metrics`, panicking when it is not there.
    pub async fn metric(&self, name: &str) -> f64 {
        let text = (self.client.get(self.url("/metrics")).send().await)
            .expect("GET /metrics sent")
            .text()
            .await
            .expect("a /metrics body");
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
            .unwrap_or_else(|| panic!("no {name} in /metrics:\n{text}"))
    }

    /// Allocates `account` and answers its hash key, asserting a 200 or 201.
    pub async fn allocate(&self, account: &str) -> String {
        let answer = self.post(&format!("/keys/{account}"), None).await;
        assert!(
            matches!(answer.status, 200 | 201),
            "allocate {account}: {}",
            answer.body
        );
        answer.body["hash_key"]
            .as_str()
            .expect("hash_key string")
            .to_owned()
    }
}

/// Reads a response as JSON (null when the body is empty).
pub async fn answer(response: reqwest::Response) -> Answer {
    let status = response.status().as_u16();
    let content_type = content_type(&response);
    let bytes = response.bytes().await.expect("body read");
    let body = if bytes.is_empty() {
        serde_json::Value::Null
    } else {
        serde_json::from_slice(&bytes)
            .unwrap_or_else(|_| panic!("not JSON: {}", String::from_utf8_lossy(&bytes)))
    };
    Answer {
        status,
        content_type,
        body,
    }
}

/// A response's `Content-Type`, or "" without one.
pub fn content_type(response: &reqwest::Response) -> String {
    response
        .headers()
        .get(reqwest::header::CONTENT_TYPE)
        .map(|v| v.to_str().unwrap().to_owned())
        .unwrap_or_default()
}

/// Asserts a problem+json answer with `status` whose detail mentions `needle`.
pub fn assert_problem(answer: &Answer, status: u16, needle: &str) {
    assert_eq!(answer.status, status, "{}", answer.body);
    assert_eq!(
        answer.content_type, "application/problem+json",
        "{}",
        answer.body
    );
    assert_eq!(answer.body["status"], status);
    for field in ["type", "title", "detail"] {
        assert!(
            answer.body[field].is_string(),
            "problem lacks {field}: {}",
            answer.body
        );
    }
    let detail = answer.body["detail"].as_str().unwrap();
    assert!(
        detail.contains(needle),
        "detail {detail:?} lacks {needle:?}"
    );
}
