//! schemathesis generates requests from the committed OpenAPI document and holds every
//! answer of the live server to it, with all of its checks.

use std::path::Path;

use tokio::process::Command;

use crate::helpers::spawn_app;

/// Fixed, so a run can be repeated case for case (`--seed`).
const SEED: &str = "20261122";
/// Cases per operation and phase; the run must generate `MIN_CASES` in all.
const MAX_EXAMPLES: &str = "60";
const MIN_CASES: u64 = 1_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_keeps_to_its_document() {
    // The client drives the HTTP API, which either backend serves alike: once is enough.
    if !crate::skip::sqlite_only("the_api_keeps_to_its_document") {
        return;
    }
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let schemathesis = std::env::var_os("KEYSPREAD_TEST_SCHEMATHESIS")
        .map_or_else(|| manifest.join(".venv/bin/schemathesis"), Into::into);
    if !schemathesis.exists() {
        let why = format!(
            "{} not found; run `make test-deps` to create .venv, or set \
             KEYSPREAD_TEST_SCHEMATHESIS",
            schemathesis.display()
        );
        crate::skip::skipped("the_api_keeps_to_its_document", &why);
        return;
    }
    let app = spawn_app().await;
    let work = tempfile::tempdir().expect("temp dir");
    // tokio's Command lets the server keep serving on this runtime meanwhile.
    let run = Command::new(&schemathesis)
        .current_dir(work.path())
        .arg("run")
        .arg(manifest.join("openapi/openapi.json"))
        .args(["--url", &app.url("")])
        .args([
            "--checks",
            "all",
            "--seed",
            SEED,
            "--max-examples",
            MAX_EXAMPLES,
        ])
        .args(["--generation-database", "none", "--no-color"])
        // Rules the document cannot state, applied to the cases meant to be valid.
        .env("SCHEMATHESIS_HOOKS", "schemathesis_hooks")
        .env("PYTHONPATH", manifest.join("tests/python"))
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .kill_on_drop(true)
        .output()
        .await
        .expect("run schemathesis");
    let stdout = String::from_utf8_lossy(&run.stdout);
    print!("{stdout}");
    assert!(
        run.status.success(),
        "schemathesis failed ({}); stderr:\n{}",
        run.status,
        String::from_utf8_lossy(&run.stderr)
    );
    let cases = generated(&stdout).expect("schemathesis names how many cases it generated");
    assert!(cases >= MIN_CASES, "only {cases} cases generated");
}

/// The `N` of schemathesis' `N generated` summary line.
fn generated(stdout: &str) -> Option<u64> {
    let line = stdout.lines().find(|l| l.contains(" generated"))?;
    line.split_whitespace().next()?.parse().ok()
}
