//! A Rust client progenitor generates from openapi/openapi-3.0.json (examples/rust: its own
//! crate and lock file, outside the service's workspace) builds and drives the live server.

use std::path::{Path, PathBuf};
use std::time::Instant;

use tokio::process::Command;

use crate::helpers::spawn_app;
use crate::python_client::assert_success;
use crate::typescript_client::assert_drove_the_story;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn generated_rust_client_drives_the_live_server() {
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

    let app = spawn_app().await;
    let driven = Command::new(client_target_dir().join("debug/keyspread-rust-client"))
        .arg(app.url(""))
        .kill_on_drop(true)
        .output()
        .await
        .expect("run the Rust client");
    assert_success("examples/rust", &driven);
    let stdout = String::from_utf8_lossy(&driven.stdout);
    print!("{stdout}");
    assert_drove_the_story(&stdout, "rs");
}

/// A build directory of its own beside this test's (`<target>/rust-client`): kept between
/// runs, and never locked by the build that runs this test.
fn client_target_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary's path");
    // <target>/debug/deps/api-<hash>
    let target = exe.ancestors().nth(3).expect("a target directory");
    target.join("rust-client")
}
