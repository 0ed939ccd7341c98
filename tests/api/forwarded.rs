//! `X-Forwarded-For` from a trusted proxy: what a client writes into it cannot make it
//! local. Raw bytes over a socket (HTTP clients refuse non-ASCII header values), and a
//! real nginx in front of the server.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::helpers::{TestApp, spawn_app, spawn_app_with};

/// A server without a token that trusts proxies on 127.0.0.1.
async fn behind_local_proxy() -> TestApp {
    spawn_app_with(|c| {
        c.trusted_proxies = vec![keyspread::config::parse_network("127.0.0.1").unwrap()];
    })
    .await
}

/// Sends `request` as is and answers the status line and the body.
async fn raw(addr: std::net::SocketAddr, request: &[u8]) -> (String, String) {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream.write_all(request).await.unwrap();
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut answer))
        .await
        .expect("answered within 10 s")
        .unwrap();
    let text = String::from_utf8_lossy(&answer).into_owned();
    let status = text.lines().next().unwrap_or_default().to_owned();
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    (status, body)
}

fn post_forwarded_for(account: &str, forwarded: &[u8]) -> Vec<u8> {
    let mut request = format!(
        "POST /keys/{account} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 0\r\n\
         Connection: close\r\nX-Forwarded-For: "
    )
    .into_bytes();
    request.extend_from_slice(forwarded);
    request.extend_from_slice(b"\r\n\r\n");
    request
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreadable_forwarded_entry_does_not_make_a_client_local() {
    let app = behind_local_proxy().await;
    for (n, forwarded) in [
        &b"\xff, 203.0.113.9"[..],
        b"203.0.113.9, \xff",
        b"\xff",
        b"unknown",
        b"203.0.113.9, , 127.0.0.1",
    ]
    .into_iter()
    .enumerate()
    {
        let (status, body) = raw(app.addr, &post_forwarded_for(&format!("a{n}"), forwarded)).await;
        assert!(
            status.starts_with("HTTP/1.1 403"),
            "{:?}: {status} {body}",
            String::from_utf8_lossy(forwarded)
        );
        assert!(
            body.contains("only clients on the server's own host"),
            "{body}"
        );
    }
    // A local client through the proxy, and the proxy itself, still may.
    let (status, _) = raw(app.addr, &post_forwarded_for("local", b"127.0.0.1")).await;
    assert!(status.starts_with("HTTP/1.1 201"), "{status}");
}

/// nginx on 127.0.0.1 in front of `upstream`, as its documentation sets up a reverse
/// proxy; stopped when dropped.
struct Nginx {
    child: tokio::process::Child,
    addr: std::net::SocketAddr,
    _dir: tempfile::TempDir,
}

impl Nginx {
    async fn start(program: &std::path::Path, upstream: std::net::SocketAddr) -> Nginx {
        Nginx::start_setting(
            program,
            upstream,
            "X-Forwarded-For $proxy_add_x_forwarded_for",
        )
        .await
    }

    /// nginx that sets `header` (`NAME VALUE`, nginx variables allowed) on what it relays.
    async fn start_setting(
        program: &std::path::Path,
        upstream: std::net::SocketAddr,
        header: &str,
    ) -> Nginx {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().display().to_string();
        // nginx cannot listen on port 0: take a free port and hand it over.
        let addr = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        let config = format!(
            "daemon off;\nmaster_process off;\npid {root}/nginx.pid;\n\
             error_log {root}/error.log info;\nevents {{ worker_connections 64; }}\n\
             http {{\n  access_log off;\n  client_body_temp_path {root}/body;\n\
             proxy_temp_path {root}/proxy;\n  fastcgi_temp_path {root}/fastcgi;\n\
             uwsgi_temp_path {root}/uwsgi;\n  scgi_temp_path {root}/scgi;\n\
             server {{\n    listen {addr};\n    location / {{\n\
             proxy_pass http://{upstream};\n\
             proxy_set_header {header};\n    }}\n  }}\n}}\n"
        );
        let file = dir.path().join("nginx.conf");
        std::fs::write(&file, config).unwrap();
        let mut child = tokio::process::Command::new(program)
            .arg("-p")
            .arg(dir.path())
            .arg("-c")
            .arg(&file)
            .args(["-e", &format!("{root}/error.log")])
            .kill_on_drop(true)
            .spawn()
            .expect("start nginx");
        let started = std::time::Instant::now();
        while TcpStream::connect(addr).await.is_err() {
            if let Some(status) = child.try_wait().unwrap() {
                let log = std::fs::read_to_string(dir.path().join("error.log")).unwrap_or_default();
                panic!("nginx exited ({status}):\n{log}");
            }
            assert!(started.elapsed() < Duration::from_secs(10), "nginx not up");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Nginx {
            child,
            addr,
            _dir: dir,
        }
    }
}

impl Drop for Nginx {
    fn drop(&mut self) {
        let _ = self.child.start_kill();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn through_nginx_a_forged_forwarded_for_is_refused_and_local_clients_pass() {
    let test = "through_nginx_a_forged_forwarded_for_is_refused_and_local_clients_pass";
    let Some(program) = crate::helpers::required_tool("nginx", test) else {
        return;
    };
    let app = behind_local_proxy().await;
    let nginx = Nginx::start(&program, app.addr).await;
    // nginx appends the address it saw (127.0.0.1) to whatever the client sent.
    for (n, forged) in [
        &b"\xff, 203.0.113.9"[..],
        b"\xff",
        b"garbage",
        b"203.0.113.9",
    ]
    .into_iter()
    .enumerate()
    {
        let (status, body) = raw(nginx.addr, &post_forwarded_for(&format!("f{n}"), forged)).await;
        assert!(
            status.starts_with("HTTP/1.1 403"),
            "{:?}: {status} {body}",
            String::from_utf8_lossy(forged)
        );
        assert!(body.contains("\"status\":403"), "{body}");
    }
    let plain = b"POST /keys/plain HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 0\r\n\
                  Connection: close\r\n\r\n";
    let (status, body) = raw(nginx.addr, plain).await;
    assert!(status.starts_with("HTTP/1.1 201"), "{status} {body}");
    assert_eq!(app.get("/keys/plain").await.status, 200);
    for n in 0..4 {
        assert_eq!(app.get(&format!("/keys/f{n}")).await.status, 404);
    }
}

/// A POST from this host carrying `header` (a whole `Name: value` line, or none).
fn post_with(account: &str, header: &str) -> Vec<u8> {
    let line = match header {
        "" => String::new(),
        header => format!("{header}\r\n"),
    };
    format!(
        "POST /keys/{account} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 0\r\n\
         Connection: close\r\n{line}\r\n"
    )
    .into_bytes()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_that_says_it_was_relayed_is_remote_unless_its_proxy_is_trusted() {
    let app = spawn_app().await;
    for (n, header) in [
        "X-Forwarded-For: 203.0.113.9",
        "X-Forwarded-For: 127.0.0.1",
        "Forwarded: for=203.0.113.9;proto=https",
        "X-Real-IP: 203.0.113.9",
        "X-Forwarded-Host: keys.example.com",
        "Via: 1.1 proxy.example.com",
    ]
    .into_iter()
    .enumerate()
    {
        let (status, body) = raw(app.addr, &post_with(&format!("r{n}"), header)).await;
        assert!(
            status.starts_with("HTTP/1.1 403"),
            "{header}: {status} {body}"
        );
        assert!(body.contains("--trusted-proxies"), "{header}: {body}");
        assert_eq!(
            app.get(&format!("/keys/r{n}")).await.status,
            404,
            "{header}"
        );
    }
    // Without such a header a client on this host is local, and reads stay open to all.
    let (status, body) = raw(app.addr, &post_with("direct", "")).await;
    assert!(status.starts_with("HTTP/1.1 201"), "{status} {body}");
    let read = b"GET /keys/direct HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Real-IP: 203.0.113.9\r\n\
                 Connection: close\r\n\r\n";
    let (status, _) = raw(app.addr, read).await;
    assert!(status.starts_with("HTTP/1.1 200"), "{status}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn through_an_untrusted_nginx_on_this_host_a_client_is_remote() {
    let test = "through_an_untrusted_nginx_on_this_host_a_client_is_remote";
    let Some(program) = crate::helpers::required_tool("nginx", test) else {
        return;
    };
    let app = spawn_app().await;
    for (n, header) in [
        "X-Forwarded-For $proxy_add_x_forwarded_for",
        "X-Real-IP $remote_addr",
        "Forwarded \"for=$remote_addr\"",
    ]
    .into_iter()
    .enumerate()
    {
        let nginx = Nginx::start_setting(&program, app.addr, header).await;
        let (status, body) = raw(nginx.addr, &post_with(&format!("n{n}"), "")).await;
        assert!(
            status.starts_with("HTTP/1.1 403"),
            "{header}: {status} {body}"
        );
        assert!(body.contains("\"status\":403"), "{body}");
    }
    for n in 0..3 {
        assert_eq!(app.get(&format!("/keys/n{n}")).await.status, 404);
    }
}
