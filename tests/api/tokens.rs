//! The tokens file: `keyspread token new`, start-up checks, rotation by SIGHUP under
//! traffic, closed reads, and odd credentials.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use keyspread::config::{ReadAccess, Role, Roles, tokens_file_line};

use crate::helpers::{fresh_database, spawn_app_with};
use crate::process::Server;
use crate::roles::{restrict, write_tokens_file};
use crate::secrets::run;

/// `keyspread token new`: the token on stdout, once; on stderr the line that grants it.
fn new_token(name: &str, role: &str) -> (String, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_keyspread"))
        .args(["token", "new", "--name", name, "--role", role])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let token = String::from_utf8(out.stdout).unwrap();
    let stderr = String::from_utf8(out.stderr).unwrap();
    let line = stderr.lines().last().unwrap().to_owned();
    assert!(
        !stderr.contains(token.trim()),
        "the token on stderr too: {stderr}"
    );
    (token.trim_end().to_owned(), line)
}

/// Replaces the file's lines at once (a reader never sees half a file).
fn write_atomically(path: &Path, lines: &[&str]) {
    let next = path.with_extension("next");
    std::fs::write(&next, lines.join("\n") + "\n").unwrap();
    restrict(&next);
    std::fs::rename(&next, path).unwrap();
}

#[test]
fn token_new_prints_a_fresh_token_once_and_the_line_that_grants_it() {
    let (a, line) = new_token("producers", "produce,consume");
    let (b, _) = new_token("producers", "produce");
    assert_ne!(a, b);
    assert_eq!(a.len(), 43, "{a}");
    assert!(
        a.bytes()
            .all(|c| c.is_ascii_alphanumeric() || c == b'-' || c == b'_')
    );
    assert_eq!(
        line,
        tokens_file_line("producers", Roles::of(&[Role::Produce, Role::Consume]), &a)
    );
    assert!(
        line.starts_with("producers produce,consume sha256:"),
        "{line}"
    );
    for (name, role, said) in [
        ("two words", "read", "has ' '"),
        ("loopback", "read", "the server's own"),
        ("ops", "reader", "unknown role"),
        ("Admin", "admin", "--token's"),
    ] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_keyspread"))
            .args(["token", "new", "--name", name, "--role", role])
            .output()
            .unwrap();
        assert!(!out.status.success());
        assert!(out.stdout.is_empty(), "a token printed for a refused name");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(said), "{name} {role}: {stderr}");
    }
}

/// A tokens file that cannot be taken stops start-up saying which line and why; one others
/// may write is refused, one others may read is taken with a warning; no token or digest is
/// ever logged.
#[test]
fn a_bad_tokens_file_refuses_start_up_with_its_line_and_never_shows_a_token() {
    let dir = tempfile::tempdir().unwrap();
    let (token, line) = new_token("producers", "produce");
    let digest = line.split("sha256:").nth(1).unwrap().to_owned();
    let path = dir.path().join("tokens");
    let file = path.to_str().unwrap();
    let db = format!("sqlite://{}", dir.path().join("db").display());
    let env = [
        ("KEYSPREAD_TOKENS_FILE", file),
        ("DATABASE_URL", db.as_str()),
    ];
    let cases = [
        (format!("{line}\nops admin\n"), 0o600, "line 2: 2 fields"),
        (
            format!("# ok\n{line}\n{line}\n"),
            0o600,
            "line 3: the name \"producers\" is given twice",
        ),
        (
            format!("ana@ops superuser sha256:{digest}\n"),
            0o600,
            "line 1: unknown role",
        ),
        (
            format!("{line}\n"),
            0o666,
            "users other than its owner may write it",
        ),
        (
            format!(
                "{line}\n{}\n",
                tokens_file_line("admin", Roles::of(&[Role::Admin]), "admin-token-0123456789")
            ),
            0o600,
            "line 2: the name \"admin\" is --token's",
        ),
    ];
    for (text, mode, said) in cases {
        std::fs::write(&path, &text).unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
        let (exit, out) = run(&["serve"], &env, Duration::from_secs(10));
        let exit = exit.unwrap_or_else(|| panic!("{said}: started anyway\n{out}"));
        assert!(!exit.success(), "{said}: {out}");
        assert!(out.contains(said), "{said}: {out}");
        assert!(!out.contains(&token) && !out.contains(&digest), "{out}");
    }
    // Owned by another user, who could rewrite it: refused (a test run as root can chown).
    std::fs::write(&path, format!("{line}\n")).unwrap();
    restrict(&path);
    if std::os::unix::fs::chown(&path, Some(54321), None).is_ok() {
        let (exit, out) = run(&["serve"], &env, Duration::from_secs(10));
        assert!(!exit.expect("refused").success(), "{out}");
        assert!(out.contains("belongs to uid 54321"), "{out}");
        std::os::unix::fs::chown(&path, Some(0), None).unwrap();
    }
    let (missing, out) = run(
        &["serve"],
        &[
            ("KEYSPREAD_TOKENS_FILE", "/nonexistent/tokens"),
            ("DATABASE_URL", db.as_str()),
        ],
        Duration::from_secs(10),
    );
    assert!(!missing.unwrap().success());
    assert!(
        out.contains("cannot read the tokens file /nonexistent/tokens"),
        "{out}"
    );

    // Readable by all: a warning, and it serves (killed at the limit).
    std::fs::write(&path, format!("{line}\n")).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
    let (exit, out) = run(&["serve"], &env, Duration::from_secs(3));
    assert!(exit.is_none(), "{out}");
    assert!(
        out.contains("readable by every user") && out.contains("0644"),
        "{out}"
    );
    assert!(!out.contains(&token) && !out.contains(&digest), "{out}");

    // Closed reads need somebody to read with.
    let (exit, out) = run(
        &["serve", "--read-access", "token"],
        &[("DATABASE_URL", db.as_str())],
        Duration::from_secs(10),
    );
    assert!(!exit.unwrap().success());
    assert!(
        out.contains("--read-access token") && out.contains("--tokens-file"),
        "{out}"
    );
    // A token with a line break, as `echo > file` leaves it, says so.
    let (exit, out) = run(
        &["serve"],
        &[
            ("KEYSPREAD_TOKEN", "0123456789abcdef0123\n"),
            ("DATABASE_URL", db.as_str()),
        ],
        Duration::from_secs(10),
    );
    assert!(!exit.unwrap().success());
    assert!(out.contains("ends with a line break"), "{out}");
    assert!(!out.contains("0123456789abcdef0123"), "{out}");
}

/// SIGHUP re-reads the file while 16 clients allocate: the added token works within 1 s,
/// the removed one gets 401 from then on, a bad file keeps the set in force, and no
/// request in flight fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sighup_rotates_tokens_under_traffic_without_failing_a_request() {
    let dir = tempfile::tempdir().unwrap();
    let (url, _postgres) = fresh_database(dir.path()).await;
    let (steady, steady_line) = new_token("fleet", "produce");
    let (old, old_line) = new_token("old-fleet", "produce");
    let (new, new_line) = new_token("new-fleet", "produce");
    let path = dir.path().join("tokens");
    write_atomically(&path, &[&steady_line, &old_line]);
    let log = dir.path().join("log");
    // The removed token is refused 401 every time here, never held up by the budget of
    // refused credentials (tests/api/abuse.rs holds that).
    let env = [
        ("KEYSPREAD_TOKENS_FILE", path.to_str().unwrap()),
        ("KEYSPREAD_AUTH_FAILURES_PER_MINUTE", "0"),
    ];
    let mut server = Server::spawn_with(&url, &log, &env);
    let client = reqwest::Client::new();
    server.wait_ready(&client).await;
    let base = server.url.clone();

    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let mut clients = Vec::new();
    for c in 0..16 {
        let (client, base, steady) = (client.clone(), base.clone(), steady.clone());
        let (stop, done) = (Arc::clone(&stop), Arc::clone(&done));
        clients.push(tokio::spawn(async move {
            let mut failures = Vec::new();
            let mut i = 0;
            while !stop.load(Ordering::Relaxed) {
                let answer = client
                    .post(format!("{base}/keys/c{c}-{i}"))
                    .bearer_auth(&steady)
                    .send()
                    .await;
                match answer {
                    Ok(a) if a.status() == 201 => {
                        done.fetch_add(1, Ordering::Relaxed);
                    }
                    Ok(a) => failures.push(format!("{} {}", a.status(), a.text().await.unwrap())),
                    Err(e) => failures.push(e.to_string()),
                }
                i += 1;
            }
            failures
        }));
    }
    let allocate = |token: &str, account: &str| {
        client
            .post(format!("{base}/keys/{account}"))
            .bearer_auth(token.to_owned())
            .send()
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(allocate(&new, "n0").await.unwrap().status(), 401);
    assert_eq!(allocate(&old, "o0").await.unwrap().status(), 201);

    write_atomically(&path, &[&steady_line, &new_line]);
    server.signal("HUP");
    let sent = Instant::now();
    let mut n = 0;
    loop {
        n += 1;
        if allocate(&new, &format!("n{n}")).await.unwrap().status() == 201 {
            break;
        }
        assert!(
            sent.elapsed() < Duration::from_secs(1),
            "the new token refused for 1 s"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let took = sent.elapsed();
    for i in 0..20 {
        let refused = allocate(&old, &format!("o{}", i + 1)).await.unwrap();
        assert_eq!(refused.status(), 401, "the removed token, {i}");
    }

    // A bad file: the set in force stays, and the log says why.
    std::fs::write(&path, format!("{new_line}\nbroken line\n")).unwrap();
    restrict(&path);
    server.signal("HUP");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        allocate(&steady, "s-after-bad").await.unwrap().status(),
        201
    );
    assert_eq!(allocate(&old, "o-after-bad").await.unwrap().status(), 401);

    stop.store(true, Ordering::Relaxed);
    let mut failures = Vec::new();
    for client in clients {
        failures.extend(client.await.unwrap());
    }
    assert!(
        failures.is_empty(),
        "{} failed: {:?}",
        failures.len(),
        &failures[..failures.len().min(5)]
    );
    assert!(
        done.load(Ordering::Relaxed) > 100,
        "{}",
        done.load(Ordering::Relaxed)
    );
    let text = server.log_text();
    assert!(
        text.contains("line 2: 2 fields") && text.contains("the tokens in force stay"),
        "{text}"
    );
    for secret in [&steady, &old, &new] {
        assert!(!text.contains(secret.as_str()), "a token in the log");
    }
    println!(
        "new token taken {took:?} after SIGHUP; {} allocations by 16 clients, none failed",
        done.load(Ordering::Relaxed)
    );
}

/// With `--read-access token` every read but the probes needs a token of any role, the
/// page and the documents included; a browser's Basic credentials (the token as password)
/// open the page; /metrics keeps its own token.
#[tokio::test]
async fn closed_reads_need_a_token_but_probes_do_not() {
    let dir = tempfile::tempdir().unwrap();
    let tokens = write_tokens_file(dir.path());
    let app = spawn_app_with(|c| {
        c.tokens_file = Some(tokens);
        c.read_access = ReadAccess::Token;
        c.metrics_token = Some("metrics-token-0123456789".parse().unwrap());
    })
    .await;
    let get = |path: &str| app.client.get(app.url(path));
    let reader = "reader-token-0123456789abcdef";
    for path in [
        "/keys",
        "/events",
        "/snapshot",
        "/ui",
        "/openapi.json",
        "/openapi-3.0.json",
        "/docs/",
    ] {
        let refused = get(path).send().await.unwrap();
        assert_eq!(refused.status(), 401, "{path}");
        let challenge = refused.headers()["www-authenticate"]
            .to_str()
            .unwrap()
            .to_owned();
        assert!(
            challenge.contains("Basic realm=\"keyspread\""),
            "{path}: {challenge}"
        );
        assert_eq!(
            get(path).bearer_auth(reader).send().await.unwrap().status(),
            200,
            "{path}"
        );
    }
    let basic = get("/ui")
        .basic_auth("anyone", Some(reader))
        .send()
        .await
        .unwrap();
    assert_eq!(basic.status(), 200);
    let wrong = get("/ui")
        .basic_auth("anyone", Some("not-a-token-0123456"))
        .send()
        .await
        .unwrap();
    assert_eq!(wrong.status(), 401);
    // Basic is for browsers reading: a change still needs a bearer token.
    let change = app
        .client
        .post(app.url("/keys/x"))
        .basic_auth("anyone", Some("ops-token-0123456789abcdef"))
        .send()
        .await
        .unwrap();
    assert_eq!(change.status(), 401);
    for probe in ["/healthz", "/readyz", "/readyz/writes"] {
        assert_eq!(get(probe).send().await.unwrap().status(), 200, "{probe}");
    }
    assert_eq!(get("/metrics").send().await.unwrap().status(), 401);
    assert_eq!(
        get("/metrics")
            .bearer_auth(reader)
            .send()
            .await
            .unwrap()
            .status(),
        401
    );
    let scraped = get("/metrics")
        .bearer_auth("metrics-token-0123456789")
        .send()
        .await
        .unwrap();
    assert_eq!(scraped.status(), 200);
}

/// Odd credentials get clear answers, none a 500: a 10,000-character token, two
/// Authorization headers, two bearer values in one, another scheme, an empty token.
#[tokio::test]
async fn odd_credentials_are_answered_clearly() {
    let dir = tempfile::tempdir().unwrap();
    let tokens = write_tokens_file(dir.path());
    let app = spawn_app_with(|c| c.tokens_file = Some(tokens)).await;
    let producer = "producers-token-0123456789abcdef";
    let long = "a".repeat(10_000);
    let cases: Vec<(Vec<String>, u16, &str)> = vec![
        (vec![format!("Bearer {long}")], 401, "10000 characters long"),
        (
            vec![format!("Bearer {producer}"), format!("Bearer {producer}")],
            400,
            "one Authorization header",
        ),
        (
            vec![format!("Bearer {producer}, Bearer {producer}")],
            400,
            "one bearer token",
        ),
        (
            vec![format!("Token {producer}")],
            401,
            "must be `Bearer <token>`",
        ),
        (vec!["Bearer".to_owned()], 401, "carries no token"),
        (
            vec![format!("Bearer {producer}x")],
            401,
            "not one this server takes",
        ),
        (vec![format!("bearer   {producer}  ")], 201, ""),
    ];
    for (i, (headers, status, said)) in cases.into_iter().enumerate() {
        let mut request = app.client.post(app.url(&format!("/keys/odd{i}")));
        for value in &headers {
            request = request.header("authorization", value);
        }
        let answer = request.send().await.unwrap();
        assert_eq!(answer.status().as_u16(), status, "{:.80?}", headers);
        let text = answer.text().await.unwrap();
        assert!(text.contains(said), "{:.80?}: {text}", headers);
        assert!(!text.contains(producer), "the token echoed: {text}");
    }
}
