//! A TypeScript client generated from openapi/openapi.json (openapi-typescript, called
//! through openapi-fetch) type-checks under `tsc --strict` and drives the live server: the
//! very driver of examples/typescript/, so the example cannot rot.

use std::path::Path;

use tokio::process::Command;

use crate::helpers::{required_tool, spawn_app};
use crate::python_client::assert_success;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn generated_typescript_client_drives_the_live_server() {
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

    let app = spawn_app().await;
    // tokio's Command lets the server keep serving on this runtime meanwhile.
    let driven = Command::new(&node)
        .arg(work.path().join("dist/driver.js"))
        .arg(app.url(""))
        .kill_on_drop(true)
        .output()
        .await
        .expect("run the TypeScript driver");
    assert_success("examples/typescript/driver.ts", &driven);
    let stdout = String::from_utf8_lossy(&driven.stdout);
    print!("{stdout}");
    assert_drove_the_story(&stdout, "ts");
}

/// Every step the TypeScript and Rust clients drive, as each prints it (`ok    ...`), with
/// the names it uses (`ts-hot`, `rs-hot`, ...).
pub fn assert_drove_the_story(stdout: &str, prefix: &str) {
    for told in [
        format!("allocate {prefix}-hot fanout 3 -> 201"),
        "with If-None-Match -> 304".to_owned(),
        "sub_key=order-1 shards=4 -> key 2 on shardId-".to_owned(),
        "rebalance apply switch_after_s=30 -> 200".to_owned(),
        "-> next until 20".to_owned(),
        format!(
            "heartbeat {prefix}-worker-1 on {prefix}-orders -> holds shardId-000000000000, \
             shardId-000000000001, shardId-000000000002, shardId-000000000003"
        ),
        format!("release {prefix}-hot -> 204; lookup -> 404"),
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
