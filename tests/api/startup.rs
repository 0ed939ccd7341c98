//! `keyspread serve` refusing to start says what is wrong with what it was given, names
//! it, and exits 1, before it touches anything it need not.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Runs `keyspread serve` on a free loopback port with `database_url`, in `cwd`, until it
/// exits (at most 30 s); answers its exit code and stderr.
fn serve(database_url: &str, cwd: &Path) -> (Option<i32>, String) {
    serve_on("127.0.0.1:0", database_url, cwd)
}

/// `keyspread serve` on `listen` over `database_url`, from `cwd`, expected to stop by itself
/// (within 30 s): its exit code and standard error.
pub fn serve_on(listen: &str, database_url: &str, cwd: &Path) -> (Option<i32>, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_keyspread"))
        .arg("serve")
        .current_dir(cwd)
        .env("KEYSPREAD_LISTEN", listen)
        .env("DATABASE_URL", database_url)
        .env("RUST_LOG", "info")
        .env_remove("KEYSPREAD_TOKEN")
        .env_remove("KEYSPREAD_PRIMARY_STREAM")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let started = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if started.elapsed() > Duration::from_secs(30) {
            let _ = child.kill();
            panic!("still running 30 s after starting on {listen} over {database_url}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn an_absolute_bare_path_is_answered_with_its_sqlite_url() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("x.db");
    let (code, stderr) = serve(&path.display().to_string(), dir.path());
    assert_eq!(code, Some(1), "{stderr}");
    let expected = format!(
        "the database URL \"{0}\" is a file path, not a URL: did you mean sqlite://{0}?",
        path.display()
    );
    assert!(stderr.contains(&expected), "{stderr}");
    assert!(stderr.contains(&format!(
        "sqlite:///{}",
        path.display().to_string().trim_start_matches('/')
    )));
    assert!(!path.exists(), "a file was created at the bare path");
}

#[test]
fn a_relative_bare_path_is_answered_with_its_sqlite_url() {
    let dir = tempfile::tempdir().unwrap();
    let (code, stderr) = serve("x.db", dir.path());
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains(
            "the database URL \"x.db\" is a file path, not a URL: did you mean sqlite://x.db?"
        ),
        "{stderr}"
    );
    assert!(!dir.path().join("x.db").exists());
}

#[test]
fn a_sqlite_file_in_a_missing_directory_names_the_path() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing");
    let file = missing.join("k.db");
    let (code, stderr) = serve(&format!("sqlite://{}", file.display()), dir.path());
    assert_eq!(code, Some(1), "{stderr}");
    let expected = format!(
        "cannot open the SQLite database {}: the directory {} does not exist",
        file.display(),
        missing.display()
    );
    assert!(stderr.contains(&expected), "{stderr}");
}

#[test]
fn an_unreachable_postgres_is_named_without_its_password() {
    // Its Postgres is an address nothing answers: the pass's backend plays no part.
    if !crate::skip::sqlite_only("an_unreachable_postgres_is_named_without_its_password") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    // A port nothing listens on: taken from the system, then let go.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("postgres://keyspread:s3cret-pw@127.0.0.1:{port}/keyspread");
    let (code, stderr) = serve(&url, dir.path());
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "cannot connect to Postgres: connection refused at 127.0.0.1:{port}"
        )),
        "{stderr}"
    );
    assert!(
        !stderr.contains("s3cret-pw"),
        "the password was printed: {stderr}"
    );
}
