//! The database going away and coming back, or stuck: lookups keep answering from memory,
//! changes fail fast with 503, and readiness follows the database without a restart.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;

use reqwest::Method;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};

use crate::helpers::{
    Answer, Db, PgDatabase, answer, assert_problem, backend, spawn_app, spawn_app_with,
};

/// A TCP proxy to the database that can be cut (connections refused, open ones severed),
/// restored, or turned into a black hole (nothing forwarded either way, nothing closed), as
/// a network that silently drops a replica's packets would.
struct Proxy {
    addr: SocketAddr,
    state: Arc<ProxyState>,
    links: Arc<tokio::sync::Mutex<JoinSet<()>>>,
    accept: tokio::task::JoinHandle<()>,
}

#[derive(Default)]
struct ProxyState {
    down: AtomicBool,
    holed: AtomicBool,
    /// Bytes that, once forwarded from the client, turn the proxy into a black hole.
    trigger: std::sync::Mutex<Option<Vec<u8>>>,
}

impl ProxyState {
    /// Black-holes the proxy if `sent` (just forwarded to the database) holds the trigger.
    fn watch(&self, sent: &[u8]) {
        let mut trigger = self.trigger.lock().unwrap();
        if let Some(needle) = trigger.as_deref()
            && sent.windows(needle.len()).any(|w| w == needle)
        {
            *trigger = None;
            self.holed.store(true, Ordering::SeqCst);
        }
    }
}

impl Proxy {
    async fn start(upstream: String) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let state = Arc::new(ProxyState::default());
        let links = Arc::new(tokio::sync::Mutex::new(JoinSet::new()));
        let (shared, tasks) = (Arc::clone(&state), Arc::clone(&links));
        let accept = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                if shared.down.load(Ordering::SeqCst) {
                    continue; // dropped: the connection is refused
                }
                let (upstream, state) = (upstream.clone(), Arc::clone(&shared));
                tasks.lock().await.spawn(async move {
                    if state.holed.load(Ordering::SeqCst) {
                        // Connected, and never answered.
                        let _held = client;
                        return std::future::pending().await;
                    }
                    let Ok(server) = TcpStream::connect(upstream).await else {
                        return;
                    };
                    let ((client_in, client_out), (server_in, server_out)) =
                        (client.into_split(), server.into_split());
                    tokio::join!(
                        pump(client_in, server_out, &state, true),
                        pump(server_in, client_out, &state, false)
                    );
                });
            }
        });
        Proxy {
            addr,
            state,
            links,
            accept,
        }
    }

    /// Refuses new connections and severs the open ones.
    async fn cut(&self) {
        self.state.down.store(true, Ordering::SeqCst);
        self.links.lock().await.abort_all();
    }

    fn restore(&self) {
        self.state.down.store(false, Ordering::SeqCst);
    }

    /// Forwards as usual until a client sends `sql`, lets that reach the database, then
    /// forwards nothing more either way, on any connection, and closes none.
    fn black_hole_after(&self, sql: &str) {
        *self.state.trigger.lock().unwrap() = Some(sql.as_bytes().to_vec());
    }

    fn is_black_hole(&self) -> bool {
        self.state.holed.load(Ordering::SeqCst)
    }
}

/// Copies `from` to `to` until either closes; once the proxy is a black hole, holds both
/// open and copies nothing. `watch`: whether this is the client's direction.
async fn pump(mut from: OwnedReadHalf, mut to: OwnedWriteHalf, state: &ProxyState, watch: bool) {
    let mut buf = vec![0; 64 * 1024];
    loop {
        let read = from.read(&mut buf).await.unwrap_or(0);
        if state.holed.load(Ordering::SeqCst) {
            break;
        }
        if read == 0 || to.write_all(&buf[..read]).await.is_err() {
            return;
        }
        if watch {
            state.watch(&buf[..read]);
        }
    }
    let _held = (from, to);
    std::future::pending().await
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

/// A proxy to `db`'s server, and `db`'s URL through it.
async fn proxy_to(db: &PgDatabase) -> (Proxy, String) {
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
    (proxy, through_proxy)
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
    let Some(server) =
        crate::skip::postgres_only("lookups_survive_a_database_outage_and_readiness_recovers")
    else {
        return;
    };
    let db = PgDatabase::create(&server).await;
    let (proxy, through_proxy) = proxy_to(&db).await;
    let app = spawn_app_with(|c| c.database_url = through_proxy).await;
    let key = app.allocate("before").await;

    proxy.cut().await;
    let noticed = wait_for(&app, "/readyz/writes", 503, Duration::from_secs(10)).await;
    let unwritable = app.get("/readyz/writes").await;
    assert_problem(&unwritable, 503, "database");
    assert_eq!(unwritable.body["reason"], "unreachable");
    // Out of touch for less than the lookups' max-age: still ready for lookups.
    assert_eq!(app.get("/readyz").await.status, 200);
    // Lookups answer from memory.
    let looked_up = app.get("/keys/before").await;
    assert_eq!(
        (looked_up.status, looked_up.body["hash_key"].as_str()),
        (200, Some(key.as_str()))
    );
    // A read of the database is refused in a read's words.
    let listed = app.get("/keys").await;
    assert_problem(&listed, 503, "cannot be read");
    let detail = listed.body["detail"].as_str().unwrap();
    assert!(!detail.contains("change"), "{detail}");
    // Changes are refused quickly, not hung.
    let started = Instant::now();
    let refused = app.post("/keys/during", None).await;
    let refused_in = started.elapsed();
    assert_problem(&refused, 503, "unreachable");
    assert!(refused_in < Duration::from_secs(5), "took {refused_in:?}");

    proxy.restore();
    let recovered = wait_for(&app, "/readyz/writes", 200, Duration::from_secs(15)).await;
    assert_eq!(app.post("/keys/after", None).await.status, 201);
    assert_eq!(
        app.get("/keys/during").await.status,
        404,
        "the refused change left nothing"
    );
    println!(
        "outage: readyz/writes 503 after {noticed:?}, change refused in {refused_in:?}, readyz/writes 200 {recovered:?} after the database returned"
    );
    drop(db);
}

/// An answer with its `Retry-After` header and how long it took.
struct Timed {
    answer: Answer,
    retry_after: Option<String>,
    took: Duration,
}

/// Sends `method url` and times the answer.
async fn timed(client: reqwest::Client, method: Method, url: String) -> Timed {
    let started = Instant::now();
    let response = client.request(method, url).send().await.unwrap();
    let retry_after = (response.headers().get(reqwest::header::RETRY_AFTER))
        .map(|v| v.to_str().unwrap().to_owned());
    let answer = answer(response).await;
    Timed {
        answer,
        retry_after,
        took: started.elapsed(),
    }
}

/// How soon a change behind a held write lock is refused: 5 s on Postgres; on SQLite, whose
/// busy timeout is 4 s, within two of them (a change may queue behind a refused group),
/// still before the request timeout.
fn refused_within(database_url: &str) -> Duration {
    match backend(database_url) {
        "postgres" => Duration::from_secs(5),
        _ => Duration::from_millis(9500),
    }
}

/// Asserts a change was refused because the database cannot take it now: 503 with
/// `Retry-After`, within `limit`.
fn assert_refused(refused: &Timed, limit: Duration) {
    let Timed {
        answer,
        retry_after,
        took,
    } = refused;
    assert_eq!(
        answer.status, 503,
        "answered {} after {took:?}: {}",
        answer.status, answer.body
    );
    assert_problem(answer, 503, "database");
    let seconds: u64 = (retry_after.as_deref())
        .expect("503 without Retry-After")
        .parse()
        .expect("Retry-After in seconds");
    assert!((1..=10).contains(&seconds), "Retry-After: {seconds}");
    assert!(*took < limit, "refused after {took:?}");
}

/// Changes sent at once by [`a_change_behind_a_held_write_lock_is_refused_in_time_and_leaves_nothing`].
const CONCURRENT: usize = 16;

/// A change sent while another session holds the database's write lock (a replica stuck
/// inside a write, an operator's open transaction) is refused in time ([`refused_within`]),
/// 503 with `Retry-After`; it leaves nothing behind once the lock is free, and succeeds when
/// sent again. On SQLite the lock is another connection's `BEGIN IMMEDIATE`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_behind_a_held_write_lock_is_refused_in_time_and_leaves_nothing() {
    let app = spawn_app().await;
    let mut other = app.db().await;
    other.hold_write_lock().await;

    // Many at once, so that they queue behind each other as well as behind the lock.
    let mut changes = JoinSet::new();
    for i in 0..CONCURRENT {
        changes.spawn(timed(
            app.client.clone(),
            Method::POST,
            app.url(&format!("/keys/behind-{i}")),
        ));
    }
    let mut slowest = Duration::ZERO;
    while let Some(refused) = changes.join_next().await {
        let refused = refused.unwrap();
        assert_refused(&refused, refused_within(&app.config.database_url));
        slowest = slowest.max(refused.took);
    }
    assert_eq!(app.get("/readyz").await.status, 200, "the database answers");

    other.release_write_lock().await;
    // Longer than any refused change could have gone on waiting for the lock.
    tokio::time::sleep(Duration::from_secs(3)).await;
    for i in 0..CONCURRENT {
        let path = format!("/keys/behind-{i}");
        assert_eq!(
            app.get(&path).await.status,
            404,
            "{path} was made after all"
        );
    }
    assert!(other.assignments().await.is_empty());
    assert_eq!(app.post("/keys/behind-0", None).await.status, 201);
    println!(
        "{}: {CONCURRENT} changes behind a held write lock refused within {slowest:?}",
        backend(&app.config.database_url),
    );
}

/// Two replicas on one Postgres database; A reaches it through a proxy that turns into a
/// black hole just after A's release has taken the cluster's write lock. B's changes are
/// refused in time (503, not 408) while A's dead session holds the lock, A reports that it
/// cannot write (`/readyz/writes`), and the database ends A's session so that B writes again within 30 s while A
/// stays cut off. A's release is rolled back with its session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_cut_off_inside_a_write_holds_up_no_other() {
    let Some(server) =
        crate::skip::postgres_only("a_replica_cut_off_inside_a_write_holds_up_no_other")
    else {
        return;
    };
    let db = PgDatabase::create(&server).await;
    let (proxy, through_proxy) = proxy_to(&db).await;
    let a = spawn_app_with(|c| c.database_url = through_proxy).await;
    let b = spawn_app_with(|c| c.database_url = db.url.clone()).await;
    a.allocate("held").await;

    // A release begins its transaction, then takes the lock: `SELECT pg_advisory_xact_lock(..)`.
    proxy.black_hole_after("pg_advisory_xact_lock");
    let cut_off = tokio::spawn(timed(a.client.clone(), Method::DELETE, a.url("/keys/held")));
    let mut watcher = Db::connect(&db.url).await;
    wait_until_locked(&mut watcher).await;
    assert!(proxy.is_black_hole());
    let cut_at = Instant::now();

    let refused = timed(b.client.clone(), Method::POST, b.url("/keys/elsewhere")).await;
    assert_refused(&refused, Duration::from_secs(5));
    let unready = wait_for(&a, "/readyz/writes", 503, Duration::from_secs(10)).await;
    assert_eq!(
        b.get("/readyz/writes").await.status,
        200,
        "B reaches the database"
    );

    let mut tries = 0;
    loop {
        tries += 1;
        let again = timed(b.client.clone(), Method::POST, b.url("/keys/again")).await;
        if again.answer.status == 201 {
            break;
        }
        assert_refused(&again, Duration::from_secs(5));
        let waited = cut_at.elapsed();
        assert!(
            waited < Duration::from_secs(30),
            "B still refused after {waited:?}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let recovered = cut_at.elapsed();
    assert!(proxy.is_black_hole(), "A stayed cut off");

    let released = cut_off.await.unwrap();
    assert_refused(&released, Duration::from_secs(5));
    assert_eq!(
        b.get("/keys/held").await.status,
        200,
        "A's release rolled back"
    );
    assert_eq!(
        b.get("/keys/elsewhere").await.status,
        404,
        "B's refused change left nothing"
    );
    println!(
        "black hole: B refused in {:?}, A unready after {unready:?}, A's release refused in {:?}, \
         B wrote again {recovered:?} after the cut ({tries} tries)",
        refused.took, released.took
    );
    drop((a, b, watcher));
}

/// Waits until some session holds an advisory lock on the database `db` is connected to.
async fn wait_until_locked(db: &mut Db) {
    let Db::Postgres(conn) = db else {
        unreachable!("advisory locks are Postgres'");
    };
    let started = Instant::now();
    loop {
        let held: i64 = sqlx::query_scalar(
            "SELECT COUNT(*) FROM pg_locks l JOIN pg_database d ON d.oid = l.database \
             WHERE l.locktype = 'advisory' AND l.granted AND d.datname = current_database()",
        )
        .fetch_one(&mut *conn)
        .await
        .unwrap();
        if held > 0 {
            return;
        }
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "the write lock was never taken"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A COMMIT that reaches the database while the connection then goes silent (a proxy that
/// black-holes it right after): the change was made, its answer lost. The client is told
/// so, 504 `outcome-unknown`, once the session cannot be reached for the liveness bound,
/// never 503; and sending it again with the same Idempotency-Key, through a replica that
/// reaches the database, replays the 201 the commit made.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_whose_answer_is_lost_is_504_and_its_key_settles_it() {
    let Some(server) =
        crate::skip::postgres_only("a_commit_whose_answer_is_lost_is_504_and_its_key_settles_it")
    else {
        return;
    };
    let db = PgDatabase::create(&server).await;
    let (proxy, through_proxy) = proxy_to(&db).await;
    let a = spawn_app_with(|c| c.database_url = through_proxy).await;
    let b = spawn_app_with(|c| c.database_url = db.url.clone()).await;
    a.allocate("before").await;
    let patient = reqwest::Client::builder()
        .timeout(Duration::from_secs(60))
        .build()
        .unwrap();
    let keyed = |app: &crate::helpers::TestApp| {
        patient
            .post(app.url("/keys/lost"))
            .header("Idempotency-Key", "lost-1")
    };

    proxy.black_hole_after("COMMIT");
    let started = Instant::now();
    let lost = answer(keyed(&a).send().await.unwrap()).await;
    let took = started.elapsed();
    assert!(proxy.is_black_hole());
    assert_problem(&lost, 504, "may or may not have been made");
    assert!(
        lost.body["type"]
            .as_str()
            .unwrap()
            .ends_with("outcome-unknown"),
        "{}",
        lost.body
    );
    assert!(took < Duration::from_secs(30), "took {took:?}");

    let settled = keyed(&b).send().await.unwrap();
    let replayed = settled.headers().get("idempotent-replayed").cloned();
    let settled = answer(settled).await;
    assert_eq!(
        (
            settled.status,
            replayed.as_ref().map(|v| v.to_str().unwrap())
        ),
        (201, Some("true")),
        "{}",
        settled.body
    );
    assert_eq!(b.get("/keys/lost").await.status, 200, "the commit was made");
    println!(
        "a lost commit answered 504 after {took:?}; its key replayed the 201 on another replica"
    );
}
