//! Without a token, browsers on other sites can neither change assignments (a form post
//! from another origin) nor read them through DNS rebinding (a foreign `Host`).

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::helpers::{Answer, answer, assert_problem, spawn_app, spawn_app_with};

const TOKEN: &str = "cross-site-token-0123456789";

/// Sends `method path` with extra headers and reads the answer.
async fn send(
    app: &crate::helpers::TestApp,
    method: reqwest::Method,
    path: &str,
    headers: &[(&str, &str)],
) -> Answer {
    let mut request = app.client.request(method, app.url(path));
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    answer(request.send().await.unwrap()).await
}

fn assert_refused(answer: &Answer, mentions: &str) {
    assert_problem(answer, 403, mentions);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_token_other_origins_cannot_change_anything() {
    let app = spawn_app().await;
    // What an HTML form on another site sends: text/plain, an empty body.
    for origin in [
        "http://evil.example",
        "null",
        "https://127.0.0.1.evil.example",
    ] {
        let headers = [("origin", origin), ("content-type", "text/plain")];
        let refused = send(&app, reqwest::Method::POST, "/keys/form", &headers).await;
        assert_refused(&refused, "--token");
    }
    assert_eq!(app.get("/keys/form").await.status, 404, "allocated anyway");
    app.allocate("kept").await;
    let refused = send(
        &app,
        reqwest::Method::DELETE,
        "/keys/kept",
        &[("origin", "http://evil.example")],
    )
    .await;
    assert_refused(&refused, "Origin");
    assert_eq!(app.get("/keys/kept").await.status, 200);
    // Pages on this host may, on any port, and so may clients that send no Origin.
    for (n, origin) in [
        "http://localhost:3000",
        "http://127.0.0.1:8080",
        "https://[::1]",
        "http://LOCALHOST",
        "http://app.localhost:5173",
    ]
    .into_iter()
    .enumerate()
    {
        let path = format!("/keys/local-{n}");
        let allowed = send(&app, reqwest::Method::POST, &path, &[("origin", origin)]).await;
        assert_eq!(allowed.status, 201, "{origin}: {}", allowed.body);
    }
    // Reads carry no risk from a foreign Origin (the browser hides the answer).
    let read = send(
        &app,
        reqwest::Method::GET,
        "/keys/kept",
        &[("origin", "http://evil.example")],
    )
    .await;
    assert_eq!(read.status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_token_only_loopback_and_allowed_host_names_are_answered() {
    let app = spawn_app_with(|c| c.allowed_hosts = vec!["keys.internal".parse().unwrap()]).await;
    app.allocate("a").await;
    // DNS rebinding: the page's own name, now pointing at 127.0.0.1.
    for method in [reqwest::Method::GET, reqwest::Method::DELETE] {
        let refused = send(
            &app,
            method.clone(),
            "/keys/a",
            &[("host", "rebind.evil.example:8080")],
        )
        .await;
        assert_refused(&refused, "--allowed-hosts");
    }
    assert_eq!(app.get("/keys/a").await.status, 200, "released anyway");
    for host in [
        "localhost",
        "LocalHost:8080",
        "127.0.0.1",
        "127.1.2.3:80",
        "[::1]:8080",
        "api.localhost",
        "keys.internal",
        "KEYS.internal:443",
    ] {
        let read = send(&app, reqwest::Method::GET, "/keys/a", &[("host", host)]).await;
        assert_eq!(read.status, 200, "{host}: {}", read.body);
    }
    for host in ["0.0.0.0:8080", "keys.internal.evil.example", "10.0.0.1"] {
        let refused = send(&app, reqwest::Method::GET, "/healthz", &[("host", host)]).await;
        assert_refused(&refused, "KEYSPREAD_ALLOWED_HOSTS");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_without_a_host_is_not_from_a_browser_and_is_served() {
    let app = spawn_app().await;
    let mut stream = TcpStream::connect(app.addr).await.unwrap();
    stream
        .write_all(b"POST /keys/old HTTP/1.0\r\nContent-Length: 0\r\n\r\n")
        .await
        .unwrap();
    let mut got = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut got))
        .await
        .unwrap()
        .unwrap();
    let text = String::from_utf8_lossy(&got);
    assert!(text.starts_with("HTTP/1.0 201"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_token_the_token_is_the_protection() {
    let app = spawn_app_with(|c| c.token = Some(TOKEN.parse().unwrap())).await;
    let bearer = format!("Bearer {TOKEN}");
    let headers = [
        ("host", "keys.example.com"),
        ("origin", "https://console.example.com"),
        ("authorization", bearer.as_str()),
    ];
    let created = send(&app, reqwest::Method::POST, "/keys/a", &headers).await;
    assert_eq!(created.status, 201, "{}", created.body);
    let read = send(&app, reqwest::Method::GET, "/keys/a", &headers[..2]).await;
    assert_eq!(read.status, 200);
    // Without the token the answer is the token's 401, whatever the names.
    let refused = send(&app, reqwest::Method::DELETE, "/keys/a", &headers[..2]).await;
    assert_eq!(refused.status, 401);
}
