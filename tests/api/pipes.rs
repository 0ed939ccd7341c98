//! Every subcommand that prints stops quietly when its reader does (`keyspread openapi |
//! head`): exit status 0 and nothing on stderr, never a panic.

use std::path::Path;
use std::process::{Command, Output, Stdio};

use crate::helpers::spawn_app;

/// Runs keyspread with `args`, its stdout a pipe nobody reads any more.
async fn into_closed_pipe(args: &[&str]) -> Output {
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    tokio::process::Command::new(env!("CARGO_BIN_EXE_keyspread"))
        .args(args)
        .env_remove("DATABASE_URL")
        .env_remove("KEYSPREAD_TOKEN")
        .stdout(writer)
        .stderr(Stdio::piped())
        // Not `output()`: tokio's would replace the stdout given here with a pipe it reads.
        .spawn()
        .expect("start keyspread")
        .wait_with_output()
        .await
        .expect("run keyspread")
}

/// Exit status 0, and no panic or error on stderr (`import` shows its progress there).
fn assert_quiet(what: &str, out: &Output) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success()
            && !stderr.contains("panicked")
            && !stderr.contains("Broken pipe")
            && !stderr.contains("keyspread: "),
        "keyspread {what}: {}, stderr: {stderr}",
        out.status
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_printing_subcommand_stops_quietly_when_its_reader_is_gone() {
    let app = spawn_app().await;
    let dir = tempfile::tempdir().unwrap();
    let database = format!("sqlite://{}", dir.path().join("k.db").display());
    let csv = dir.path().join("accounts.csv");
    std::fs::write(&csv, "account,weight\nacme,1\nglobex,2\n").unwrap();
    let stream = dir.path().join("stream.json");
    std::fs::write(&stream, r#"{"shard_count": 4}"#).unwrap();
    let (csv_path, stream_path) = (csv.display(), stream.display());
    let runs = [
        "openapi".to_owned(),
        "simulate --accounts 14 --shards 2".to_owned(),
        "simulate --fanout 2 --shards 4 --trials 10".to_owned(),
        "simulate leases --shards 4 --workers 2 --trials 1".to_owned(),
        format!("migrate --database-url {database}"),
        format!("import {csv_path} --database-url {database}"),
        format!(
            "streams put orders --from {stream_path} --url {}",
            app.url("")
        ),
        "--help".to_owned(),
        "--version".to_owned(),
    ];
    for run in &runs {
        let args: Vec<&str> = run.split_whitespace().collect();
        assert_quiet(run, &into_closed_pipe(&args).await);
    }
    // And each still did its work: the import and the registration happened.
    let imported = Command::new(env!("CARGO_BIN_EXE_keyspread"))
        .args(["import", csv.to_str().unwrap(), "--database-url", &database])
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&imported.stdout).contains("2 accounts already present"),
        "{}",
        String::from_utf8_lossy(&imported.stdout)
    );
    assert_eq!(app.get("/streams/orders").await.body["shard_count"], 4);
}

/// What a shell does with `keyspread openapi | head -n 1`: the reader takes a line and
/// goes, while the document (larger than a pipe's buffer) is still being written.
#[test]
fn openapi_into_head_exits_cleanly() {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    assert!(
        std::fs::metadata(manifest.join("openapi/openapi.json"))
            .unwrap()
            .len()
            > 1 << 16,
        "the document no longer outgrows a pipe: this test would pass whatever keyspread did"
    );
    let mut child = Command::new(env!("CARGO_BIN_EXE_keyspread"))
        .arg("openapi")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = String::new();
    let mut stdout = std::io::BufReader::new(child.stdout.take().unwrap());
    std::io::BufRead::read_line(&mut stdout, &mut first).unwrap();
    assert_eq!(first.trim_end(), "{");
    drop(stdout);
    let out = child.wait_with_output().unwrap();
    assert_quiet("openapi | head -n 1", &out);
}
