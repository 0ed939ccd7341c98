//! Hostile clients: oversized and trickled requests, connection floods, and tokens kept out
//! of the logs. Raw sockets, since well-behaved HTTP clients cannot misbehave this way.

use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::helpers::{PgDatabase, spawn_app, spawn_app_with};

/// Reads until the end of a response head, the connection closes, or `within` passes;
/// answers what was read and whether the server closed the connection.
async fn read_head(stream: &mut (impl AsyncReadExt + Unpin), within: Duration) -> (String, bool) {
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    let deadline = tokio::time::Instant::now() + within;
    loop {
        match tokio::time::timeout_at(deadline, stream.read(&mut buf)).await {
            Err(_) => return (String::from_utf8_lossy(&got).into_owned(), false),
            Ok(Ok(0) | Err(_)) => return (String::from_utf8_lossy(&got).into_owned(), true),
            Ok(Ok(n)) => {
                got.extend_from_slice(&buf[..n]);
                if got.windows(4).any(|w| w == b"\r\n\r\n") {
                    return (String::from_utf8_lossy(&got).into_owned(), false);
                }
            }
        }
    }
}

/// Waits until the server closes `stream` (answering anything first is allowed).
async fn closed_within(stream: &mut (impl AsyncReadExt + Unpin), within: Duration) -> bool {
    let mut buf = [0u8; 4096];
    let deadline = tokio::time::Instant::now() + within;
    loop {
        match tokio::time::timeout_at(deadline, stream.read(&mut buf)).await {
            Err(_) => return false,
            Ok(Ok(0) | Err(_)) => return true,
            Ok(Ok(_)) => {}
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_huge_declared_length_is_refused_before_any_body_arrives() {
    let app = spawn_app().await;
    for (path, what) in [("/keys/a", "small"), ("/keys/batch", "batch")] {
        let mut stream = TcpStream::connect(app.addr).await.unwrap();
        let head = format!(
            "POST {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n\
             Content-Length: 10000000000\r\n\r\n"
        );
        stream.write_all(head.as_bytes()).await.unwrap();
        // No body byte is ever sent: the answer comes from the declared length alone.
        let (answer, _) = read_head(&mut stream, Duration::from_secs(5)).await;
        assert!(answer.starts_with("HTTP/1.1 413"), "{what}: {answer:?}");
        assert!(answer.contains("application/problem+json"), "{answer}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chunked_body_is_cut_off_once_it_passes_the_limit() {
    let app = spawn_app().await;
    let stream = TcpStream::connect(app.addr).await.unwrap();
    let (mut reader, mut writer) = stream.into_split();
    let head = "POST /keys/a HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n\
                Transfer-Encoding: chunked\r\n\r\n";
    writer.write_all(head.as_bytes()).await.unwrap();
    let answered = Arc::new(AtomicBool::new(false));
    let sent = Arc::new(AtomicUsize::new(0));
    let feeder = {
        let (answered, sent) = (Arc::clone(&answered), Arc::clone(&sent));
        tokio::spawn(async move {
            let chunk = format!("2000\r\n{}\r\n", " ".repeat(0x2000));
            // At most 4 MiB, 8 KiB every 5 ms: the server must answer long before.
            while !answered.load(Ordering::SeqCst) && sent.load(Ordering::SeqCst) < 4 << 20 {
                if writer.write_all(chunk.as_bytes()).await.is_err() {
                    return;
                }
                sent.fetch_add(0x2000, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
    };
    let (answer, _) = read_head(&mut reader, Duration::from_secs(10)).await;
    answered.store(true, Ordering::SeqCst);
    let at = sent.load(Ordering::SeqCst);
    feeder.await.unwrap();
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer:?}");
    assert!(
        at < 1 << 20,
        "answered only after {at} bytes of a body limited to 64 KiB"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_that_trickle_headers_or_idle_are_disconnected() {
    let app = spawn_app_with(|c| c.header_timeout_secs = 1).await;
    // Slowloris: a header line every 200 ms, never the blank line that ends them.
    let mut slow = TcpStream::connect(app.addr).await.unwrap();
    slow.write_all(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n")
        .await
        .unwrap();
    let started = Instant::now();
    let mut closed = false;
    while started.elapsed() < Duration::from_secs(5) {
        if slow.write_all(b"X-Slow: 1\r\n").await.is_err() {
            closed = true;
            break;
        }
        let mut buf = [0u8; 1024];
        let read = tokio::time::timeout(Duration::from_millis(200), slow.read(&mut buf)).await;
        if let Ok(Ok(0) | Err(_)) = read {
            closed = true;
            break;
        }
    }
    let took = started.elapsed();
    assert!(closed, "a trickled header kept its connection for {took:?}");
    assert!(took < Duration::from_secs(3), "closed only after {took:?}");

    // A connection that never sends a byte is closed too.
    let mut idle = TcpStream::connect(app.addr).await.unwrap();
    assert!(closed_within(&mut idle, Duration::from_secs(3)).await);

    // An idle keep-alive connection after a request, likewise.
    let mut kept = TcpStream::connect(app.addr).await.unwrap();
    kept.write_all(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n")
        .await
        .unwrap();
    assert!(closed_within(&mut kept, Duration::from_secs(3)).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trickled_body_times_out_408() {
    let app = spawn_app_with(|c| c.request_timeout_secs = 1).await;
    let mut stream = TcpStream::connect(app.addr).await.unwrap();
    stream
        .write_all(
            b"POST /keys/a HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n\
              Content-Length: 100\r\n\r\n{",
        )
        .await
        .unwrap();
    let started = Instant::now();
    let mut answer = String::new();
    while started.elapsed() < Duration::from_secs(5) {
        let _ = stream.write_all(b" ").await;
        let (got, closed) = read_head(&mut stream, Duration::from_millis(200)).await;
        answer.push_str(&got);
        if closed || answer.contains("\r\n\r\n") {
            break;
        }
    }
    let took = started.elapsed();
    assert!(
        answer.starts_with("HTTP/1.1 408"),
        "{answer:?} after {took:?}"
    );
    assert!(
        took < Duration::from_secs(3),
        "answered only after {took:?}"
    );
}

/// Open files this process may have, from `/proc/self/limits` (Linux).
fn open_files_limit() -> Option<usize> {
    let limits = std::fs::read_to_string("/proc/self/limits").ok()?;
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    line.split_whitespace().nth(3)?.parse().ok()
}

/// Times `n` sequential `/healthz` calls on a fresh connection each.
async fn healthz_latencies(addr: SocketAddr, n: usize) -> Vec<Duration> {
    let mut latencies = Vec::with_capacity(n);
    for _ in 0..n {
        let client = reqwest::Client::builder()
            .timeout(Duration::from_secs(5))
            .build()
            .unwrap();
        let started = Instant::now();
        let answer = client
            .get(format!("http://{addr}/healthz"))
            .send()
            .await
            .expect("healthz answers during the flood");
        assert_eq!(answer.status(), 200);
        latencies.push(started.elapsed());
    }
    latencies.sort();
    latencies
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thousands_of_idle_connections_do_not_stop_the_service() {
    // Both ends of every connection live in this process: keep well inside its limit.
    let wanted = 3000;
    let room = open_files_limit().map_or(wanted, |limit| limit.saturating_sub(500) / 2);
    let n = wanted.min(room);
    let app = spawn_app_with(|c| c.header_timeout_secs = 60).await;
    let started = Instant::now();
    let mut idle = Vec::with_capacity(n);
    for _ in 0..n {
        idle.push(TcpStream::connect(app.addr).await.expect("connect"));
    }
    let opened = started.elapsed();
    let latencies = healthz_latencies(app.addr, 50).await;
    let (median, worst) = (
        latencies[latencies.len() / 2],
        latencies[latencies.len() - 1],
    );
    eprintln!(
        "{n} idle connections opened in {opened:?}; /healthz during the flood: median {median:?}, worst {worst:?}"
    );
    assert!(n >= 1000 || room < wanted, "only {n} connections");
    assert!(worst < Duration::from_secs(1), "worst /healthz {worst:?}");
    drop(idle);
    let after = healthz_latencies(app.addr, 5).await;
    assert!(after[4] < Duration::from_secs(1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_the_connection_cap_clients_wait_until_idle_ones_time_out() {
    let app = spawn_app_with(|c| {
        c.max_connections = 50;
        c.header_timeout_secs = 1;
    })
    .await;
    let mut idle = Vec::new();
    for _ in 0..50 {
        idle.push(TcpStream::connect(app.addr).await.unwrap());
    }
    // Every slot is taken by a silent client: the next one waits for the idle timeout,
    // then is served.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let started = Instant::now();
    let answer = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap()
        .get(app.url("/healthz"))
        .send()
        .await
        .expect("served once idle connections are closed");
    assert_eq!(answer.status(), 200);
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_millis(500) && waited < Duration::from_secs(5),
        "waited {waited:?}"
    );
}

const TOKEN: &str = "s3cr3t-t0ken-that-must-never-be-logged";
const WRONG: &str = "wrong-t0ken-that-must-never-be-logged-either";
const METRICS_TOKEN: &str = "scrape-t0ken-that-must-never-be-logged";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_never_reach_the_logs_even_at_trace_level() {
    let dir = tempfile::tempdir().unwrap();
    let postgres = match std::env::var("KEYSPREAD_TEST_POSTGRES") {
        Ok(server) if !server.is_empty() => Some(PgDatabase::create(&server).await),
        _ => None,
    };
    let database_url = postgres.as_ref().map_or_else(
        || format!("sqlite://{}", dir.path().join("k.db").display()),
        |db| db.url.clone(),
    );
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let log = dir.path().join("server.log");
    let mut child = Command::new(env!("CARGO_BIN_EXE_keyspread"))
        .arg("serve")
        .env("DATABASE_URL", &database_url)
        .env("KEYSPREAD_LISTEN", format!("127.0.0.1:{port}"))
        .env("KEYSPREAD_TOKEN", TOKEN)
        .env("KEYSPREAD_METRICS_TOKEN", METRICS_TOKEN)
        .env("RUST_LOG", "trace")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .expect("start keyspread");
    let base = format!("http://127.0.0.1:{port}");
    let client = reqwest::Client::new();
    let started = Instant::now();
    while !client
        .get(format!("{base}/readyz"))
        .send()
        .await
        .is_ok_and(|r| r.status() == 200)
    {
        assert!(child.try_wait().unwrap().is_none(), "keyspread exited");
        assert!(started.elapsed() < Duration::from_secs(30), "not ready");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let bearer = |t: &str| format!("Bearer {t}");
    let calls = [
        (
            reqwest::Method::POST,
            "/keys/logged",
            Some(bearer(TOKEN)),
            201,
        ),
        (
            reqwest::Method::POST,
            "/keys/other",
            Some(bearer(WRONG)),
            401,
        ),
        (
            reqwest::Method::POST,
            "/keys/other",
            Some(TOKEN.to_owned()),
            401,
        ),
        (
            reqwest::Method::DELETE,
            "/keys/logged",
            Some(bearer(WRONG)),
            401,
        ),
        (
            reqwest::Method::GET,
            "/keys/logged",
            Some(bearer(TOKEN)),
            200,
        ),
        (
            reqwest::Method::DELETE,
            "/keys/logged",
            Some(bearer(TOKEN)),
            204,
        ),
        (
            reqwest::Method::GET,
            "/metrics",
            Some(bearer(METRICS_TOKEN)),
            200,
        ),
        (reqwest::Method::GET, "/metrics", Some(bearer(WRONG)), 401),
    ];
    for (method, path, authorization, status) in calls {
        let mut request = client.request(method.clone(), format!("{base}{path}"));
        if let Some(value) = authorization {
            request = request.header("authorization", value);
        }
        let answer = request.send().await.unwrap();
        assert_eq!(answer.status().as_u16(), status, "{method} {path}");
    }
    // Let the last lines reach the file, then stop the server.
    tokio::time::sleep(Duration::from_millis(200)).await;
    child.kill().unwrap();
    child.wait().unwrap();
    let text = std::fs::read_to_string(&log).unwrap();
    // Every request shows up, with the per-request lines of the verbose levels.
    assert!(text.contains("DEBUG"), "not a verbose log:\n{text}");
    assert!(
        text.contains("path=/keys/logged"),
        "requests not logged:\n{text}"
    );
    for secret in [TOKEN, WRONG, METRICS_TOKEN] {
        assert!(!text.contains(secret), "{secret} appears in the log");
    }
}

/// Python's urllib, like most clients, writes the whole body before it reads the answer.
const URLLIB_OVERSIZED_POSTS: &str = r#"
import json, sys, urllib.error, urllib.request
base = sys.argv[1]
for path in ("/keys/x", "/keys/batch"):
    body = b"{" + b" " * (5 << 20) + b"}"
    request = urllib.request.Request(base + path, data=body, method="POST",
                                     headers={"Content-Type": "application/json"})
    try:
        urllib.request.urlopen(request, timeout=30)
        sys.exit(f"{path}: a 5 MiB body was accepted")
    except urllib.error.HTTPError as answer:
        kind = answer.headers["Content-Type"]
        problem = json.loads(answer.read())
        print(path, answer.code, kind, problem["detail"])
        if answer.code != 413 or kind != "application/problem+json" or problem["status"] != 413:
            sys.exit(1)
    except OSError as error:
        sys.exit(f"{path}: no answer but {error!r}")
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_that_write_the_whole_body_first_read_the_413() {
    let test = "clients_that_write_the_whole_body_first_read_the_413";
    let Some(python) = crate::helpers::required_tool("python3", test) else {
        return;
    };
    let app = spawn_app().await;
    // tokio's Command lets the server keep serving on this runtime meanwhile.
    let run = tokio::process::Command::new(python)
        .args(["-c", URLLIB_OVERSIZED_POSTS, &app.url("")])
        .kill_on_drop(true)
        .output()
        .await
        .expect("run python3");
    let (out, err) = (
        String::from_utf8_lossy(&run.stdout),
        String::from_utf8_lossy(&run.stderr),
    );
    assert!(run.status.success(), "{out}{err}");
    assert_eq!(
        out.matches(" 413 application/problem+json ").count(),
        2,
        "{out}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_body_is_not_read_for_ever() {
    let app = spawn_app().await;
    let stream = TcpStream::connect(app.addr).await.unwrap();
    let (mut reader, mut writer) = stream.into_split();
    // Within the length the server discards after a 413, but trickled: 1 KiB every 10 ms
    // would take 80 s.
    let head = "POST /keys/a HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n\
                Content-Length: 8000000\r\n\r\n";
    writer.write_all(head.as_bytes()).await.unwrap();
    let started = Instant::now();
    let feeder = tokio::spawn(async move {
        let chunk = [b' '; 1024];
        while started.elapsed() < Duration::from_secs(20) {
            if writer.write_all(&chunk).await.is_err() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    });
    let (answer, _) = read_head(&mut reader, Duration::from_secs(5)).await;
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer:?}");
    assert!(
        closed_within(&mut reader, Duration::from_secs(15)).await,
        "still reading the body after {:?}",
        started.elapsed()
    );
    let took = started.elapsed();
    feeder.abort();
    assert!(took < Duration::from_secs(10), "closed only after {took:?}");
}

/// The budget of refused credentials the guessing tests run with: README's defaults.
const GUESSES_PER_MINUTE: u32 = 60;
const GUESS_BURST: u32 = 20;

/// A server of the tokens in `roles` behind a proxy on loopback, so each request names its
/// client in `X-Forwarded-For`, with the default budget of refused credentials.
async fn guarded(dir: &std::path::Path) -> crate::helpers::TestApp {
    let tokens = crate::roles::write_tokens_file(dir);
    spawn_app_with(|c| {
        c.tokens_file = Some(tokens);
        c.metrics_token = Some(METRICS_TOKEN.parse().unwrap());
        c.trusted_proxies = vec![keyspread::config::parse_network("127.0.0.1").unwrap()];
        c.auth_failures_per_minute = GUESSES_PER_MINUTE;
        c.auth_failure_burst = GUESS_BURST;
    })
    .await
}

/// `POST /keys/{account}` from `client` with `token` (none when empty): the status, and the
/// seconds `Retry-After` says.
async fn allocate_from(
    app: &crate::helpers::TestApp,
    client: &str,
    token: &str,
    account: &str,
) -> (u16, Option<u64>) {
    let mut request =
        (app.client.post(app.url(&format!("/keys/{account}")))).header("x-forwarded-for", client);
    if !token.is_empty() {
        request = request.bearer_auth(token);
    }
    let answer = request.send().await.unwrap();
    let retry = answer.headers().get("retry-after");
    let retry = retry.map(|v| v.to_str().unwrap().parse().unwrap());
    (answer.status().as_u16(), retry)
}

/// 2,000 wrong tokens from one address, 8 at a time: only the budget's worth (the burst,
/// plus the rate over the time they took) are checked and answered 401; the rest get 429
/// with `Retry-After`. Meanwhile the token that address used before passes every time. A
/// valid token it never used is answered as a wrong one is, so a guess that hits does not
/// stand out; and /metrics' token is on the same budget.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn guessed_tokens_get_the_budgets_401s_and_then_429s_that_reveal_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let app = Arc::new(guarded(dir.path()).await);
    let (guesser, producers) = ("2001:db8:1:2::7", crate::roles::token_of("producers"));
    assert_eq!(
        allocate_from(&app, guesser, &producers, "warm").await.0,
        201
    );

    let started = Instant::now();
    let mut workers = Vec::new();
    for w in 0..8 {
        let (app, producers) = (Arc::clone(&app), producers.clone());
        workers.push(tokio::spawn(async move {
            let mut statuses = Vec::new();
            for i in 0..250 {
                let guess = format!("guess-{w}-{i}-0123456789abcdef");
                let (status, retry) = allocate_from(&app, guesser, &guess, "g").await;
                assert!(
                    status != 429 || retry.is_some_and(|s| s >= 1),
                    "{status} {retry:?}"
                );
                statuses.push(status);
                if i % 50 == 0 {
                    let account = format!("p{w}-{i}");
                    let held = allocate_from(&app, guesser, &producers, &account).await;
                    assert_eq!(held.0, 201, "the producers' token, amid the guesses");
                }
            }
            statuses
        }));
    }
    let mut statuses = Vec::new();
    for worker in workers {
        statuses.extend(worker.await.unwrap());
    }
    let took = started.elapsed();
    let refused = statuses.iter().filter(|s| **s == 401).count();
    let limited = statuses.iter().filter(|s| **s == 429).count();
    let budget = f64::from(GUESS_BURST) + took.as_secs_f64() * f64::from(GUESSES_PER_MINUTE) / 60.0;
    println!(
        "2000 guesses in {took:?}: {refused} answered 401, {limited} 429 (budget {budget:.1})"
    );
    assert_eq!(refused + limited, 2000, "{statuses:?}");
    assert!(refused >= GUESS_BURST as usize, "{refused} 401s");
    assert!(
        refused as f64 <= budget.floor(),
        "{refused} 401s past a budget of {budget:.1}"
    );

    // Over budget, the right token is answered as a wrong one unless this address used it.
    let ops = crate::roles::token_of("ops");
    assert_eq!(allocate_from(&app, guesser, &ops, "o").await.0, 429);
    assert_eq!(allocate_from(&app, guesser, "", "o").await.0, 429);
    let metrics = |token: &str| {
        (app.client.get(app.url("/metrics")))
            .header("x-forwarded-for", guesser)
            .bearer_auth(token)
            .send()
    };
    assert_eq!(metrics(METRICS_TOKEN).await.unwrap().status(), 429);
    assert_eq!(metrics(WRONG).await.unwrap().status(), 429);
    // The same host from another address of its /64 shares the budget; another /64 not.
    let neighbour = "2001:db8:1:2:ffff:ffff:ffff:ffff";
    assert_eq!(allocate_from(&app, neighbour, WRONG, "n").await.0, 429);
    assert_eq!(
        allocate_from(&app, "2001:db8:1:3::7", WRONG, "n").await.0,
        401
    );
    assert_eq!(
        allocate_from(&app, "2001:db8:1:3::7", &ops, "n").await.0,
        201
    );
}

/// Valid requests spend nothing of the budget: after 100 of them an address still has its
/// whole burst of refusals, and a valid token that failed its role (403) is no guess either.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn valid_credentials_spend_none_of_the_budget() {
    let dir = tempfile::tempdir().unwrap();
    let app = guarded(dir.path()).await;
    let client = "198.51.100.7";
    let (producers, reader) = (
        crate::roles::token_of("producers"),
        crate::roles::token_of("reader"),
    );
    for i in 0..100 {
        assert_eq!(
            allocate_from(&app, client, &producers, &format!("v{i}"))
                .await
                .0,
            201
        );
        assert_eq!(allocate_from(&app, client, &reader, "r").await.0, 403);
    }
    let scraped = (app.client.get(app.url("/metrics")))
        .header("x-forwarded-for", client)
        .bearer_auth(METRICS_TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(scraped.status(), 200);
    for i in 0..GUESS_BURST {
        let guess = format!("guess-{i}-0123456789abcdef");
        let (status, _) = allocate_from(&app, client, &guess, "g").await;
        assert_eq!(status, 401, "refusal {i} of a burst of {GUESS_BURST}");
    }
}
