//! Problem+json for every error, authentication, request ids, limits and timeouts.

use std::net::SocketAddr;

use axum::body::Body;
use axum::extract::connect_info::MockConnectInfo;
use axum::http::{Request, StatusCode};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tower::ServiceExt;

use crate::helpers::{answer, assert_problem, spawn_app, spawn_app_with};

const TOKEN: &str = "test-token-0123456789";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn framework_rejections_are_problems() {
    let app = spawn_app().await;
    assert_problem(&app.get("/nowhere").await, 404, "no route for GET /nowhere");
    assert_problem(
        &app.call(reqwest::Method::PUT, "/keys/a", None).await,
        405,
        "PUT is not allowed",
    );
    assert_problem(
        &app.call(reqwest::Method::POST, "/healthz", None).await,
        405,
        "POST is not allowed",
    );

    let bad_json = app
        .client
        .post(app.url("/keys/a"))
        .header("content-type", "application/json")
        .body("{\"weight\":")
        .send()
        .await
        .unwrap();
    assert_problem(&answer(bad_json).await, 400, "JSON");
    let wrong_type = app
        .client
        .post(app.url("/rebalance"))
        .header("content-type", "text/plain")
        .body("x")
        .send()
        .await
        .unwrap();
    assert_problem(&answer(wrong_type).await, 415, "Content-Type");
    // Its own connection: the server answers 413 before reading the body and closes the
    // connection, which a pooled client could otherwise pick for the next request.
    let huge = reqwest::Client::new()
        .post(app.url("/keys/a"))
        .header("content-type", "application/json")
        .body(vec![b' '; 100_000])
        .send()
        .await
        .unwrap();
    assert_problem(&answer(huge).await, 413, "larger than this server accepts");
    let bad_utf8 = app.get("/keys/%FF").await;
    assert_problem(&bad_utf8, 400, "UTF-8");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_ids_are_set_and_propagated() {
    let app = spawn_app().await;
    let fresh = app.client.get(app.url("/healthz")).send().await.unwrap();
    assert_eq!(fresh.headers()["x-request-id"].len(), 36, "a UUID");
    let given = app
        .client
        .get(app.url("/keys/none"))
        .header("x-request-id", "abc-123")
        .send()
        .await
        .unwrap();
    assert_eq!(given.headers()["x-request-id"], "abc-123");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_guards_every_mutation() {
    let app = spawn_app_with(|c| c.token = Some(TOKEN.parse().unwrap())).await;
    let anonymous = app.client.post(app.url("/keys/a")).send().await.unwrap();
    assert_eq!(anonymous.headers()["www-authenticate"], "Bearer");
    assert_problem(&answer(anonymous).await, 401, "Authorization: Bearer");
    let wrong = app
        .client
        .delete(app.url("/keys/a"))
        .bearer_auth("test-token-0123456788")
        .send()
        .await
        .unwrap();
    assert_problem(&answer(wrong).await, 401, "Bearer");
    let rebalance = app
        .client
        .post(app.url("/rebalance"))
        .json(&serde_json::json!({"plan_id": "x"}))
        .send()
        .await
        .unwrap();
    assert_eq!(rebalance.status(), 401);
    let patch = app
        .client
        .patch(app.url("/keys/a"))
        .json(&serde_json::json!({"weight": 2}))
        .send()
        .await
        .unwrap();
    assert_eq!(patch.status(), 401);

    let allowed = app
        .client
        .post(app.url("/keys/a"))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(allowed.status(), 201);
    // Reads need no token.
    assert_eq!(app.get("/keys/a").await.status, 200);
    assert_eq!(app.get("/shard-of?account=a&shards=2").await.status, 200);
}

/// Sends one request through the in-process router as if from `peer`.
async fn from_peer(peer: SocketAddr, method: &str, path: &str) -> StatusCode {
    via_proxy(&[], peer, None, method, path).await
}

/// Sends one request through the in-process router of a server that trusts `proxies`,
/// as if from `peer`, with `X-Forwarded-For: forwarded` if given.
async fn via_proxy(
    proxies: &[&str],
    peer: SocketAddr,
    forwarded: Option<&str>,
    method: &str,
    path: &str,
) -> StatusCode {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("k.db").display());
    let mut config = keyspread::config::ServeConfig::for_tests(url);
    config.trusted_proxies = proxies
        .iter()
        .map(|p| keyspread::config::parse_network(p).unwrap())
        .collect();
    let state = keyspread::AppState::open(&config).await.unwrap();
    let app = keyspread::app(state).layer(MockConnectInfo(peer));
    let mut request = Request::builder().method(method).uri(path);
    if let Some(forwarded) = forwarded {
        request = request.header("x-forwarded-for", forwarded);
    }
    let request = request.body(Body::empty()).unwrap();
    app.oneshot(request).await.unwrap().status()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn behind_a_trusted_proxy_without_a_token_the_forwarded_client_must_be_local() {
    let local_proxy: SocketAddr = "127.0.0.1:5000".parse().unwrap();
    let remote: SocketAddr = "203.0.113.9:5000".parse().unwrap();
    let trusted = ["127.0.0.1"];
    // A remote client relayed by a proxy on this host is still remote.
    assert_eq!(
        via_proxy(
            &trusted,
            local_proxy,
            Some("203.0.113.9"),
            "POST",
            "/keys/a"
        )
        .await,
        StatusCode::FORBIDDEN
    );
    assert_eq!(
        via_proxy(
            &trusted,
            local_proxy,
            Some("203.0.113.9"),
            "DELETE",
            "/keys/a"
        )
        .await,
        StatusCode::FORBIDDEN
    );
    // A local client through it, or the proxy's own request, is local.
    assert_eq!(
        via_proxy(&trusted, local_proxy, Some("127.0.0.1"), "POST", "/keys/a").await,
        StatusCode::CREATED
    );
    assert_eq!(
        via_proxy(&trusted, local_proxy, None, "POST", "/keys/a").await,
        StatusCode::CREATED
    );
    // An untrusted peer cannot claim to be local.
    assert_eq!(
        via_proxy(&trusted, remote, Some("127.0.0.1"), "POST", "/keys/a").await,
        StatusCode::FORBIDDEN
    );
    // Without trusted proxies the address in it is not believed, and the request, relayed
    // by a proxy on this host, is from a remote client.
    assert_eq!(
        via_proxy(&[], local_proxy, Some("203.0.113.9"), "POST", "/keys/a").await,
        StatusCode::FORBIDDEN
    );
    assert_eq!(
        via_proxy(&[], local_proxy, Some("127.0.0.1"), "POST", "/keys/a").await,
        StatusCode::FORBIDDEN
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_token_only_local_clients_mutate() {
    let remote: SocketAddr = "203.0.113.9:5000".parse().unwrap();
    assert_eq!(
        from_peer(remote, "POST", "/keys/a").await,
        StatusCode::FORBIDDEN
    );
    assert_eq!(
        from_peer(remote, "DELETE", "/keys/a").await,
        StatusCode::FORBIDDEN
    );
    assert_eq!(
        from_peer(remote, "GET", "/keys/a").await,
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        from_peer("127.0.0.1:5000".parse().unwrap(), "POST", "/keys/a").await,
        StatusCode::CREATED
    );
    assert_eq!(
        from_peer("[::1]:5000".parse().unwrap(), "POST", "/keys/a").await,
        StatusCode::CREATED
    );
    assert_eq!(
        from_peer(
            "[::ffff:127.0.0.1]:5000".parse().unwrap(),
            "POST",
            "/keys/a"
        )
        .await,
        StatusCode::CREATED
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_requests_time_out() {
    let app = spawn_app_with(|c| c.request_timeout_secs = 1).await;
    let mut stream = tokio::net::TcpStream::connect(app.addr).await.unwrap();
    // Promise a body and never send it.
    stream
        .write_all(b"POST /keys/slow HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\ncontent-length: 20\r\n\r\n{")
        .await
        .unwrap();
    let mut reply = vec![0; 4096];
    let n = tokio::time::timeout(std::time::Duration::from_secs(5), stream.read(&mut reply))
        .await
        .expect("answered before 5 s")
        .unwrap();
    let reply = String::from_utf8_lossy(&reply[..n]);
    assert!(reply.starts_with("HTTP/1.1 408"), "{reply}");
    assert!(reply.contains("application/problem+json"), "{reply}");
    assert_eq!(app.get("/keys/slow").await.status, 404);
}

/// Request bodies are JSON objects, as the document says: serde would also take a struct
/// from an array of its fields (`[5]` for `{"weight": 5}`), at the top or nested.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bodies_are_objects_not_arrays_of_their_fields() {
    use reqwest::Method;
    use serde_json::json;
    let app = spawn_app().await;
    app.allocate("present").await;
    for (method, path, body) in [
        (Method::POST, "/keys/new", json!([5])),
        (Method::POST, "/keys/new", json!([])),
        (Method::PATCH, "/keys/present", json!([7])),
        (Method::POST, "/keys/batch", json!([[{"account": "q"}]])),
        (Method::POST, "/keys/batch", json!({"accounts": [["q", 3]]})),
        (
            Method::POST,
            "/rebalance",
            json!(["1.4.0.0123456789abcdef"]),
        ),
        (Method::PUT, "/streams/orders", json!([null, 4])),
    ] {
        let answer = app.call(method.clone(), path, Some(body.clone())).await;
        assert_eq!(
            answer.status, 422,
            "{method} {path} {body}: {:?}",
            answer.body
        );
        assert!(
            answer.body["detail"]
                .as_str()
                .unwrap()
                .contains("invalid type: sequence"),
            "{method} {path} {body}: {:?}",
            answer.body
        );
    }
    assert_eq!(app.get("/keys/new").await.status, 404);
    assert_eq!(app.get("/keys/present").await.body["weight"], 1);
    assert_eq!(app.get("/streams/orders").await.status, 404);
}

/// A paging cursor is an account id (the `next` of a page): anything else is a 400 that
/// names it, on either backend (Postgres cannot even compare text holding a NUL).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keys_cursor_that_is_no_account_id_is_refused() {
    let app = spawn_app().await;
    app.allocate("a").await;
    for after in ["%00", "a%00b", "%07bell"] {
        let answer = app.get(&format!("/keys?after={after}")).await;
        assert_problem(&answer, 400, "account id");
    }
    let page = app.get("/keys?after=a").await;
    assert_eq!(
        (page.status, page.body["items"].as_array().map(Vec::len)),
        (200, Some(0))
    );
}
