//! What an attacker or an unlucky operator tries against least privilege: signals sent by
//! habit, tokens files edited on other systems, names that pass for the server's own.

use std::time::Duration;

use keyspread::config::{Role, Roles, tokens_file_line};

use crate::helpers::fresh_database;
use crate::process::Server;
use crate::roles::restrict;

/// `kill -HUP` re-reads the tokens file; sent by habit to a server that has none (only
/// `--token`, or no token at all), it must not end it, as SIGHUP's default action would.
#[tokio::test]
async fn sighup_leaves_a_server_without_a_tokens_file_serving() {
    let dir = tempfile::tempdir().unwrap();
    let (url, _postgres) = fresh_database(dir.path()).await;
    let client = reqwest::Client::new();
    let settings: [&[(&str, &str)]; 2] =
        [&[("KEYSPREAD_TOKEN", "admin-token-0123456789abcdef")], &[]];
    for (i, env) in settings.into_iter().enumerate() {
        let log = dir.path().join(format!("log{i}"));
        let mut server = Server::spawn_with(&url, &log, env);
        server.wait_ready(&client).await;
        server.signal("HUP");
        tokio::time::sleep(Duration::from_millis(300)).await;
        let alive = client.get(format!("{}/healthz", server.url)).send().await;
        assert!(
            alive.as_ref().is_ok_and(|a| a.status() == 200),
            "{env:?}: the server did not survive SIGHUP: {alive:?}"
        );
        let text = server.log_text();
        assert!(text.contains("no tokens file"), "{env:?}: {text}");
        assert!(!text.contains("admin-token-0123456789abcdef"), "{text}");
    }
}

/// A tokens-file line named `admin` would pass in the log for `--token`'s holder: a SIGHUP
/// that brings one in is refused with its line number, as at start-up, and the tokens in
/// force stay, `--token` among them.
#[tokio::test]
async fn sighup_refuses_a_line_named_admin_and_keeps_the_tokens_in_force() {
    let dir = tempfile::tempdir().unwrap();
    let (url, _postgres) = fresh_database(dir.path()).await;
    let admin = "admin-token-0123456789abcdef";
    let (fleet, impostor) = ("fleet-token-0123456789abcdef", "impostor-token-0123456789");
    let fleet_line = tokens_file_line("fleet", Roles::of(&[Role::Produce]), fleet);
    let path = dir.path().join("tokens");
    std::fs::write(&path, format!("{fleet_line}\n")).unwrap();
    restrict(&path);
    let env = [
        ("KEYSPREAD_TOKENS_FILE", path.to_str().unwrap()),
        ("KEYSPREAD_TOKEN", admin),
    ];
    let mut server = Server::spawn_with(&url, &dir.path().join("log"), &env);
    let client = reqwest::Client::new();
    server.wait_ready(&client).await;
    let impostor_line = tokens_file_line("admin", Roles::of(&[Role::Admin]), impostor);
    std::fs::write(&path, format!("# fleet\n{fleet_line}\n{impostor_line}\n")).unwrap();
    server.signal("HUP");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let allocate = |token: &str, account: &str| {
        client
            .post(format!("{}/keys/{account}", server.url))
            .bearer_auth(token)
            .send()
    };
    assert_eq!(allocate(impostor, "a").await.unwrap().status(), 401);
    assert_eq!(allocate(admin, "b").await.unwrap().status(), 201);
    assert_eq!(allocate(fleet, "c").await.unwrap().status(), 201);
    let text = server.log_text();
    assert!(
        text.contains("line 3: the name \"admin\" is --token's")
            && text.contains("the tokens in force stay"),
        "{text}"
    );
}
