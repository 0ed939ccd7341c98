//! A TypeScript client generated from openapi/openapi.json (openapi-typescript, called
//! through openapi-fetch) type-checks under `tsc --strict` and drives the live server: the
//! very driver of examples/typescript/, so the example cannot rot. It runs on a server that
//! holds other accounts, its own from an earlier run included, and says in one line why it
//! stopped when it cannot go on.

use std::path::Path;
use std::process::Output;

use tokio::process::Command;

use crate::helpers::{required_tool, spawn_app, spawn_app_with};
use crate::python_client::assert_success;

const TOKEN: &str = "client-example-token-0123456789";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn generated_typescript_client_drives_the_live_server() {
    // The client drives the HTTP API, which either backend serves alike: once is enough.
    if !crate::skip::sqlite_only("generated_typescript_client_drives_the_live_server") {
        return;
    }
    let test = "generated_typescript_client_drives_the_live_server";
    let Some(node) = required_tool("node", test) else {
        return;
    };
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let example = manifest.join("examples/typescript");
    let modules = example.join("node_modules");
    assert!(
        modules.join("openapi-fetch").is_dir(),
        "{} is missing: run `make test-deps` (or `npm ci --prefix examples/typescript`)",
        modules.display()
    );

    // The example's files beside freshly generated types, built outside the source tree.
    let work = tempfile::tempdir().expect("temp dir");
    for file in ["driver.ts", "tsconfig.json", "package.json"] {
        std::fs::copy(example.join(file), work.path().join(file)).expect("copy the example");
    }
    std::os::unix::fs::symlink(&modules, work.path().join("node_modules")).expect("link modules");
    let generate = |document: &str, output: &str| {
        Command::new(&node)
            .arg(modules.join("openapi-typescript/bin/cli.js"))
            .arg(manifest.join("openapi").join(document))
            .arg("--output")
            .arg(work.path().join(output))
            .output()
    };
    let generated = generate("openapi.json", "api.d.ts")
        .await
        .expect("run openapi-typescript");
    assert_success("openapi-typescript", &generated);
    // The 3.0 rendition says the same: openapi-typescript reads both into the same types.
    let generated = generate("openapi-3.0.json", "api-3.0.d.ts")
        .await
        .expect("run it again");
    assert_success("openapi-typescript on the 3.0 rendition", &generated);
    let types = |file: &str| std::fs::read_to_string(work.path().join(file)).expect("types");
    assert!(
        types("api.d.ts") == types("api-3.0.d.ts"),
        "openapi-typescript reads openapi-3.0.json into other types than openapi.json"
    );
    let checked = Command::new(&node)
        .arg(modules.join("typescript/bin/tsc"))
        .arg("--project")
        .arg(work.path())
        .arg("--strict")
        .output()
        .await
        .expect("run tsc");
    assert_success("tsc --strict", &checked);

    let driver = work.path().join("dist/driver.js");
    // tokio's Command lets the server keep serving on this runtime meanwhile.
    let drive = |url: String, env: Vec<(&'static str, &'static str)>| {
        Command::new(&node)
            .arg(&driver)
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
            .expect("run the TypeScript driver");
        assert_success("examples/typescript/driver.ts", &driven);
        let stdout = String::from_utf8_lossy(&driven.stdout);
        print!("{stdout}");
        let prefix = prefix_of(&stdout);
        assert!(prefix.starts_with("ts-"), "{stdout}");
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
    assert_success("the driver with the server's token", &out);
    let tiny = spawn_app_with(|c| c.keyspace_bits = 1).await;
    let out = drive(tiny.url(""), vec![]).await.unwrap();
    assert_fails_readably(&out, "409 Conflict");
}

/// `http://127.0.0.1:PORT` where nothing listens.
pub fn closed_port() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    drop(listener);
    url
}

/// A client example that stopped says why in one line on stderr (no stack trace, no debug
/// dump), and exits 1.
pub fn assert_fails_readably(out: &Output, said: &str) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 1, "more than one line:\n{stderr}");
    assert!(
        lines[0].starts_with("failed: ") && lines[0].contains(said),
        "{said:?} not in {stderr}"
    );
}

/// The name prefix a run chose, from its first step (`allocate PREFIXhot ...`).
pub fn prefix_of(stdout: &str) -> String {
    let account = stdout
        .lines()
        .find_map(|l| l.strip_prefix("ok    allocate "))
        .and_then(|l| l.split_whitespace().next())
        .unwrap_or_else(|| panic!("no allocate step in {stdout}"));
    account
        .strip_suffix("hot")
        .expect("a hot account")
        .to_owned()
}

/// Every step the TypeScript and Rust clients drive, as each prints it (`ok    ...`), with
/// the names it uses (`PREFIXhot`, `PREFIXorders`, ...).
pub fn assert_drove_the_story(stdout: &str, prefix: &str) {
    for told in [
        format!("allocate {prefix}hot fanout 3 -> 201"),
        "sent again with its Idempotency-Key -> 201 replayed".to_owned(),
        "with If-None-Match -> 304".to_owned(),
        "sub_key=order-1 shards=4 -> key 2 on shardId-".to_owned(),
        "rebalance apply switch_after_s=30 -> 200".to_owned(),
        "-> next until 20".to_owned(),
        format!(
            "heartbeat {prefix}worker-1 on {prefix}orders -> holds shardId-000000000000, \
             shardId-000000000001, shardId-000000000002, shardId-000000000003"
        ),
        format!("release {prefix}hot -> 204; lookup -> 404"),
        "done".to_owned(),
    ] {
        assert!(
            stdout
                .lines()
                .any(|l| l.starts_with("ok    ") && l.contains(&told)),
            "the client never said {told:?}"
        );
    }
}
