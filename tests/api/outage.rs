//! The database going away and coming back (Postgres): lookups keep answering from memory,
//! changes fail fast with 503, and readiness follows the database without a restart.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;

use crate::helpers::{PgDatabase, assert_problem, spawn_app_with};

/// A TCP proxy to the database that can be cut and restored.
struct Proxy {
    addr: SocketAddr,
    up: Arc<AtomicBool>,
    links: Arc<tokio::sync::Mutex<JoinSet<()>>>,
    accept: tokio::task::JoinHandle<()>,
}

impl Proxy {
    async fn start(upstream: String) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let up = Arc::new(AtomicBool::new(true));
        let links = Arc::new(tokio::sync::Mutex::new(JoinSet::new()));
        let (flag, tasks) = (Arc::clone(&up), Arc::clone(&links));
        let accept = tokio::spawn(async move {
            while let Ok((mut client, _)) = listener.accept().await {
                if !flag.load(Ordering::SeqCst) {
                    continue; // dropped: the connection is refused
                }
                let upstream = upstream.clone();
                tasks.lock().await.spawn(async move {
                    if let Ok(mut server) = TcpStream::connect(upstream).await {
                        let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                    }
                });
            }
        });
        Proxy {
            addr,
            up,
            links,
            accept,
        }
    }

    /// Refuses new connections and severs the open ones.
    async fn cut(&self) {
        self.up.store(false, Ordering::SeqCst);
        self.links.lock().await.abort_all();
    }

    fn restore(&self) {
        self.up.store(true, Ordering::SeqCst);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

/// Polls `path` until it answers `status`, or fails after `limit`.
async fn wait_for(
    app: &crate::helpers::TestApp,
    path: &str,
    status: u16,
    limit: Duration,
) -> Duration {
    let started = Instant::now();
    loop {
        if app.get(path).await.status == status {
            return started.elapsed();
        }
        assert!(
            started.elapsed() < limit,
            "{path} did not answer {status} within {limit:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lookups_survive_a_database_outage_and_readiness_recovers() {
    let Ok(server) = std::env::var("KEYSPREAD_TEST_POSTGRES") else {
        eprintln!("outage test runs on Postgres only: KEYSPREAD_TEST_POSTGRES is not set");
        return;
    };
    let db = PgDatabase::create(&server).await;
    let host_port = db
        .url
        .split('@')
        .nth(1)
        .and_then(|r| r.split('/').next())
        .unwrap()
        .to_owned();
    // The URL may leave the port to its default.
    let upstream = if host_port.contains(':') {
        host_port.clone()
    } else {
        format!("{host_port}:5432")
    };
    let proxy = Proxy::start(upstream).await;
    let through_proxy = db.url.replace(&host_port, &proxy.addr.to_string());
    let app = spawn_app_with(|c| c.database_url = through_proxy).await;
    let key = app.allocate("before").await;

    proxy.cut().await;
    let noticed = wait_for(&app, "/readyz", 503, Duration::from_secs(10)).await;
    assert_problem(&app.get("/readyz").await, 503, "database");
    // Lookups answer from memory.
    let looked_up = app.get("/keys/before").await;
    assert_eq!(
        (looked_up.status, looked_up.body["hash_key"].as_str()),
        (200, Some(key.as_str()))
    );
    // Changes are refused quickly, not hung.
    let started = Instant::now();
    let refused = app.post("/keys/during", None).await;
    let refused_in = started.elapsed();
    assert_problem(&refused, 503, "unreachable");
    assert!(refused_in < Duration::from_secs(5), "took {refused_in:?}");

    proxy.restore();
    let recovered = wait_for(&app, "/readyz", 200, Duration::from_secs(15)).await;
    assert_eq!(app.post("/keys/after", None).await.status, 201);
    assert_eq!(
        app.get("/keys/during").await.status,
        404,
        "the refused change left nothing"
    );
    println!(
        "outage: readyz 503 after {noticed:?}, change refused in {refused_in:?}, readyz 200 {recovered:?} after the database returned"
    );
    drop(db);
}
