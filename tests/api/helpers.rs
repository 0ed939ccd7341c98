//! Test harness: the real server on 127.0.0.1:0 over a fresh SQLite file per test.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use keyspread::config::ServeConfig;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// A running keyspread with its own database, shut down when dropped.
pub struct TestApp {
    pub addr: SocketAddr,
    pub client: reqwest::Client,
    pub config: ServeConfig,
    shutdown: Option<oneshot::Sender<()>>,
    server: Option<JoinHandle<()>>,
    // Held so the database directory outlives the server.
    dir: tempfile::TempDir,
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
        start(config, dir).await
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
    let mut config = ServeConfig::for_tests(database_url(dir.path()));
    adjust(&mut config);
    start(config, dir).await
}

fn database_url(dir: &Path) -> String {
    let file: PathBuf = dir.join("keyspread.db");
    format!("sqlite://{}", file.display())
}

async fn start(config: ServeConfig, dir: tempfile::TempDir) -> TestApp {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind port 0");
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
    }
}

/// A JSON response: status, content type and body.
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
    let content_type = response
        .headers()
        .get(reqwest::header::CONTENT_TYPE)
        .map(|v| v.to_str().unwrap().to_owned())
        .unwrap_or_default();
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
