//! What an attacker or an unlucky operator tries against least privilege: signals sent by
//! habit, tokens files edited on other systems, names that pass for the server's own.

use std::time::Duration;

use crate::helpers::fresh_database;
use crate::process::Server;

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
