//! A Python client generated from openapi/openapi.json drives the live server.

use std::path::{Path, PathBuf};
use std::process::Output;

use tokio::process::Command;

use crate::helpers::{spawn_app, spawn_app_with};

// Keeps the package name fixed; no post hooks, so ruff need not be on PATH.
/// `GET /snapshot` answers NDJSON, which the generator reads as bytes when told so.
const GENERATOR_CONFIG: &str = r#"{"package_name_override": "keyspread_api", "content_type_overrides": {"application/x-ndjson": "application/octet-stream"}, "post_hooks": []}"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn generated_python_client_drives_the_live_server() {
    // The client drives the HTTP API, which either backend serves alike: once is enough.
    if !crate::skip::sqlite_only("generated_python_client_drives_the_live_server") {
        return;
    }
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let python = tool("KEYSPREAD_TEST_PYTHON", manifest.join(".venv/bin/python"));
    let work = tempfile::tempdir().expect("temp dir");
    let client_dir = generate(work.path()).await;

    // Open, then with every read closed and an admin token the client sends on every call.
    let open = spawn_app().await;
    let closed = spawn_app_with(|c| {
        c.token = Some(TOKEN.parse().unwrap());
        c.read_access = keyspread::config::ReadAccess::Token;
    })
    .await;
    for (app, token) in [(open, None), (closed, Some(TOKEN))] {
        // tokio's Command lets the server keep serving on this runtime meanwhile.
        let mut command = Command::new(&python);
        if let Some(token) = token {
            command.env("KEYSPREAD_TOKEN", token);
        }
        let driven = command
            .arg(manifest.join("tests/python/drive_client.py"))
            .arg("--client-dir")
            .arg(&client_dir)
            .arg("--base-url")
            .arg(app.url(""))
            .env("PYTHONDONTWRITEBYTECODE", "1")
            .kill_on_drop(true)
            .output()
            .await
            .expect("run drive_client.py");
        assert_success(
            &format!("drive_client.py, token {}", token.is_some()),
            &driven,
        );
        print!("{}", String::from_utf8_lossy(&driven.stdout));
    }
}

const TOKEN: &str = "python-client-token-0123456789";

/// examples/order_safe_producer.py's own tests (examples/test_order_safe_producer.py), with
/// the generated client and the mirror's package (clients/python) on the path.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_order_safe_producer_passes_its_tests() {
    // No server: a mirror and a Kinesis of the test's own.
    if !crate::skip::sqlite_only("the_order_safe_producer_passes_its_tests") {
        return;
    }
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let python = tool("KEYSPREAD_TEST_PYTHON", manifest.join(".venv/bin/python"));
    let work = tempfile::tempdir().expect("temp dir");
    let client_dir = generate(work.path()).await;
    let path = std::env::join_paths([client_dir, manifest.join("clients/python")]).unwrap();
    let run = Command::new(&python)
        .args(["-m", "unittest", "-v", "test_order_safe_producer"])
        .current_dir(manifest.join("examples"))
        .env("PYTHONPATH", path)
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .kill_on_drop(true)
        .output()
        .await
        .expect("run the order-safe producer's tests");
    assert_success("examples/test_order_safe_producer.py", &run);
    let report = String::from_utf8_lossy(&run.stderr);
    assert!(report.contains("Ran 1 test"), "{report}");
}

/// Generates the Python client from the committed OpenAPI document under `work`; answers
/// the directory that holds the package `keyspread_api` (for `PYTHONPATH`).
pub async fn generate(work: &Path) -> PathBuf {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let generator = tool(
        "KEYSPREAD_TEST_OPENAPI_CLIENT",
        manifest.join(".venv/bin/openapi-python-client"),
    );
    let config = work.join("config.json");
    std::fs::write(&config, GENERATOR_CONFIG).expect("write generator config");
    let client_dir = work.join("client");
    let document = manifest.join("openapi/openapi.json");
    assert!(document.exists(), "{} is missing", document.display());

    // With --meta none the output path is the package itself.
    let generated = Command::new(&generator)
        .arg("generate")
        .arg("--path")
        .arg(&document)
        .arg("--output-path")
        .arg(client_dir.join("keyspread_api"))
        .args(["--meta", "none", "--fail-on-warning"])
        .arg("--config")
        .arg(&config)
        .output()
        .await
        .expect("run openapi-python-client");
    assert_success("openapi-python-client generate", &generated);
    client_dir
}

/// The program `var` names (found on PATH like any command), else `default`,
/// which must exist.
pub fn tool(var: &str, default: PathBuf) -> PathBuf {
    if let Some(program) = std::env::var_os(var) {
        return PathBuf::from(program);
    }
    assert!(
        default.exists(),
        "{} not found: run `make test-deps` to create .venv, or set {var}",
        default.display()
    );
    default
}

pub fn assert_success(what: &str, output: &Output) {
    assert!(
        output.status.success(),
        "{what} failed ({})\n--- stdout\n{}\n--- stderr\n{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr),
    );
}
