//! The Python mirror (clients/python) against the live server: pip installs it, then its
//! own tests run on that install, with this backend under both servers they talk to.

use std::path::{Path, PathBuf};

use tokio::process::Command;

use crate::helpers::{backend, fresh_database, spawn_app};
use crate::python_client::{assert_success, tool};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_mirror_passes_its_tests_against_the_live_server() {
    // The client drives the HTTP API, which either backend serves alike: once is enough.
    if !crate::skip::sqlite_only("the_python_mirror_passes_its_tests_against_the_live_server") {
        return;
    }
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let python = tool("KEYSPREAD_TEST_PYTHON", manifest.join(".venv/bin/python"));
    let work = tempfile::tempdir().expect("temp dir");
    let site = install(&python, &manifest.join("clients/python"), work.path()).await;

    let app = spawn_app().await;
    // The staged move's test makes this one's table uneven and rebalances it.
    let empty = spawn_app().await;
    // The tests that stop, freeze and restart a server start their own, on this database.
    let (own_database, _postgres) = fresh_database(work.path()).await;
    let run = Command::new(&python)
        .args(["-m", "unittest", "-v", "test_mirror", "test_table"])
        .current_dir(manifest.join("clients/python/tests"))
        .env("PYTHONPATH", &site)
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .env("KEYSPREAD_TEST_URL", app.url(""))
        .env("KEYSPREAD_TEST_EMPTY_URL", empty.url(""))
        .env("KEYSPREAD_TEST_BIN", env!("CARGO_BIN_EXE_keyspread"))
        .env("KEYSPREAD_TEST_DATABASE_URL", &own_database)
        .kill_on_drop(true)
        .output()
        .await
        .expect("run the mirror's tests");
    assert_success("clients/python tests", &run);
    let report = String::from_utf8_lossy(&run.stderr);
    assert!(
        !report.contains("skipped"),
        "every test must run here:\n{report}"
    );
    eprintln!("{} on {}", report.trim(), backend(&own_database));
}

/// `pip install` of a copy of the package (its build leaves files beside the source) into
/// a directory of `work`, which it answers: the tests import the installed package.
async fn install(python: &Path, package: &Path, work: &Path) -> PathBuf {
    let source = work.join("source");
    copy_tree(package, &source);
    let site = work.join("site");
    let installed = Command::new(python)
        .args([
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
        ])
        .args([
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "--target",
        ])
        .arg(&site)
        .arg(&source)
        .output()
        .await
        .expect("run pip");
    assert_success("pip install ./clients/python", &installed);
    assert!(site.join("keyspread_client/mirror.py").exists());
    site
}

fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("create a directory");
    for entry in std::fs::read_dir(from).expect("read a directory") {
        let entry = entry.expect("a directory entry");
        let name = entry.file_name();
        let name_text = name.to_string_lossy();
        if name_text == "__pycache__" || name_text == "build" || name_text.ends_with(".egg-info") {
            continue;
        }
        if entry.file_type().expect("a file type").is_dir() {
            copy_tree(&entry.path(), &to.join(&name));
        } else {
            std::fs::copy(entry.path(), to.join(&name)).expect("copy a file");
        }
    }
}
