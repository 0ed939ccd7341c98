//! Tests that cannot run here say so: to stderr, and as a line in the file
//! `KEYSPREAD_SKIP_LOG` names, from which `make test` (tests/run) counts them skipped, not
//! passed (libtest has no runtime skip: such a test returns and reports `ok`).
//!
//! A line is `KIND<TAB>TEST<TAB>REASON`: `skipped` (a tool is missing), or `postgres-only`
//! (on SQLite: the test belongs to the Postgres pass; `sqlite-only` would say the converse).

use std::io::Write;
use std::path::PathBuf;

/// The program `name` (on PATH or in sbin), for a test that drives it. Missing, the test is
/// skipped with the reason recorded, except under CI (`CI=true`), where a skipped test would
/// hide a broken set-up: there it fails.
pub fn required_tool(name: &str, test: &str) -> Option<PathBuf> {
    // Debian installs daemons such as nginx in sbin, often not on a user's PATH.
    let path = std::env::var_os("PATH").unwrap_or_default();
    let found = std::env::split_paths(&path)
        .chain(["/usr/local/sbin", "/usr/sbin"].map(PathBuf::from))
        .map(|dir| dir.join(name))
        .find(|program| program.is_file());
    if found.is_none() {
        let package = if name == "node" { "nodejs" } else { name };
        skipped(
            test,
            &format!("{name} is not installed (on Debian: apt-get install {package})"),
        );
    }
    found
}

/// Records that `test` cannot run here, for `why`; under CI it fails instead.
pub fn skipped(test: &str, why: &str) {
    assert!(
        std::env::var("CI").as_deref() != Ok("true"),
        "{test}: {why}"
    );
    record("skipped", test, why);
}

/// The `KEYSPREAD_TEST_POSTGRES` server, for a test that runs on Postgres only; None on
/// SQLite, where the test is recorded as the Postgres pass's.
pub fn postgres_only(test: &str) -> Option<String> {
    let server = std::env::var("KEYSPREAD_TEST_POSTGRES")
        .ok()
        .filter(|s| !s.is_empty());
    if server.is_none() {
        record("postgres-only", test, "runs on Postgres only");
    }
    server
}

/// libfaketime's preload library, or `None` (`test` recorded as skipped) where it is not
/// installed; under CI its absence fails.
pub fn faketime_library(test: &str) -> Option<String> {
    let found = faketime_path();
    if found.is_none() {
        skipped(test, FAKETIME_MISSING);
    }
    found
}

/// What runs a process with its wall clock `secs` ahead through libfaketime.
pub struct ClockAhead {
    library: String,
    offset: String,
}

impl ClockAhead {
    /// Where the library is installed, and the lead in seconds.
    pub fn new(library: String, secs: u64) -> ClockAhead {
        ClockAhead {
            library,
            offset: format!("+{secs}s"),
        }
    }

    /// The variables to add to the process's environment.
    pub fn env(&self) -> [(&'static str, &str); 3] {
        [
            ("LD_PRELOAD", self.library.as_str()),
            ("FAKETIME", self.offset.as_str()),
            // Timers and timeouts run on the monotonic clock: only the wall clock is ahead.
            ("FAKETIME_DONT_FAKE_MONOTONIC", "1"),
        ]
    }
}

/// For `test`, which runs on Postgres only (replicas on one SQLite file share a host, and
/// so a clock), a clock `secs` ahead; `None`, the test recorded as the Postgres pass's
/// or skipped, where it cannot run.
pub fn clock_ahead(test: &str, secs: u64) -> Option<ClockAhead> {
    postgres_only(test)?;
    Some(ClockAhead::new(faketime_library(test)?, secs))
}

pub const FAKETIME_MISSING: &str =
    "libfaketime is not installed (on Debian: apt-get install libfaketime)";

/// Where libfaketime's preload library is installed, if it is.
pub fn faketime_path() -> Option<String> {
    [
        "/usr/lib/x86_64-linux-gnu/faketime",
        "/usr/lib/aarch64-linux-gnu/faketime",
        "/usr/lib/faketime",
    ]
    .iter()
    .map(|dir| std::path::Path::new(dir).join("libfaketime.so.1"))
    .find(|p| p.is_file())
    .map(|p| p.display().to_string())
}

/// Whether `test`, which runs on SQLite only, runs here; on Postgres it is recorded as the
/// SQLite pass's.
pub fn sqlite_only(test: &str) -> bool {
    let postgres = std::env::var("KEYSPREAD_TEST_POSTGRES").is_ok_and(|s| !s.is_empty());
    if postgres {
        record("sqlite-only", test, "runs on SQLite only");
    }
    !postgres
}

fn record(kind: &str, test: &str, why: &str) {
    let test = full_name(test);
    eprintln!("SKIPPED {test}: {why}");
    let Some(log) = std::env::var_os("KEYSPREAD_SKIP_LOG") else {
        return;
    };
    // One short write in append mode: lines from concurrent tests do not interleave.
    let line = format!("{kind}\t{test}\t{}\n", why.replace(['\t', '\n'], " "));
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log)
        .and_then(|mut file| file.write_all(line.as_bytes()))
        .unwrap_or_else(|e| panic!("append to KEYSPREAD_SKIP_LOG {log:?}: {e}"));
}

/// libtest's name for the running test (`module::test`): the thread libtest runs it on is
/// named so, and a `#[tokio::test]` body runs on that thread.
fn full_name(test: &str) -> String {
    std::thread::current()
        .name()
        .filter(|name| name.rsplit("::").next() == Some(test) || *name == test)
        .unwrap_or(test)
        .to_owned()
}

/// Whether proof `test` runs here: in the SQLite pass of `make test`, and on both backends
/// in `make proofs` (`KEYSPREAD_PROOF_FULL`), which runs it at full length. A proof on
/// kinesalite judges producers and consumers through the HTTP API, which either backend
/// serves alike; `make test`'s Postgres pass records it as the SQLite pass's.
pub fn proof_here(test: &str) -> bool {
    std::env::var_os("KEYSPREAD_PROOF_FULL").is_some() || sqlite_only(test)
}
