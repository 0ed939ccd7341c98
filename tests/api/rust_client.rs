//! A Rust client progenitor generates from openapi/openapi-3.0.json (examples/rust: its own
//! crate and lock file, outside the service's workspace) builds and drives the live server,
//! twice on one server, and says in one line why it stopped when it cannot go on.

use std::path::{Path, PathBuf};
use std::time::Instant;

use tokio::process::Command;

use crate::helpers::{spawn_app, spawn_app_with};
use crate::python_client::assert_success;
use crate::typescript_client::{
    assert_drove_the_story, assert_fails_readably, closed_port, prefix_of,
};

const TOKEN: &str = "client-example-token-0123456789";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn generated_rust_client_drives_the_live_server() {
    // The client drives the HTTP API, which either backend serves alike: once is enough.
    if !crate::skip::sqlite_only("generated_rust_client_drives_the_live_server") {
        return;
    }
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let started = Instant::now();
    // tokio's Command lets the server keep serving on this runtime meanwhile.
    let built = Command::new(env!("CARGO"))
        .args(["build", "--locked", "--quiet", "--manifest-path"])
        .arg(manifest.join("examples/rust/Cargo.toml"))
        .arg("--target-dir")
        .arg(client_target_dir())
        .env_remove("CARGO_TARGET_DIR")
        .kill_on_drop(true)
        .output()
        .await
        .expect("run cargo build");
    assert_success("cargo build of examples/rust", &built);
    println!("examples/rust built in {:.1?}", started.elapsed());

    let drive = |url: String, env: Vec<(&'static str, &'static str)>| {
        Command::new(client_target_dir().join("debug/keyspread-rust-client"))
            .arg(url)
            .env_remove("KEYSPREAD_TOKEN")
            .envs(env)
            .kill_on_drop(true)
            .output()
    };
    // Twice on one server: each run's names are its own.
    let app = spawn_app().await;
    let mut prefixes = Vec::new();
    for _ in 0..2 {
        let driven = drive(app.url(""), vec![])
            .await
            .expect("run the Rust client");
        assert_success("examples/rust", &driven);
        let stdout = String::from_utf8_lossy(&driven.stdout);
        print!("{stdout}");
        let prefix = prefix_of(&stdout);
        assert!(prefix.starts_with("rs-"), "{stdout}");
        assert_drove_the_story(&stdout, &prefix);
        prefixes.push(prefix);
    }
    assert_ne!(prefixes[0], prefixes[1], "two runs used the same names");

    // What stops it, each said in one line.
    let closed = closed_port();
    let out = drive(closed.clone(), vec![]).await.unwrap();
    assert_fails_readably(&out, &format!("cannot reach keyspread at {closed}"));
    // Reads closed too: the client sends its token with every call.
    let guarded = spawn_app_with(|c| {
        c.token = Some(TOKEN.parse().unwrap());
        c.read_access = keyspread::config::ReadAccess::Token;
    })
    .await;
    let out = drive(guarded.url(""), vec![]).await.unwrap();
    assert_fails_readably(&out, "401 Unauthorized");
    let out = drive(guarded.url(""), vec![("KEYSPREAD_TOKEN", TOKEN)])
        .await
        .unwrap();
    assert_success("the client with the server's token", &out);
    let tiny = spawn_app_with(|c| c.keyspace_bits = 1).await;
    let out = drive(tiny.url(""), vec![]).await.unwrap();
    assert_fails_readably(&out, "409 Conflict");
}

/// A build directory of its own beside this test's (`<target>/rust-client`): kept between
/// runs, and never locked by the build that runs this test.
fn client_target_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary's path");
    // <target>/debug/deps/api-<hash>
    let target = exe.ancestors().nth(3).expect("a target directory");
    target.join("rust-client")
}
