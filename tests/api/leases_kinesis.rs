//! Proof on kinesalite that consumer leases give every shard one reader at a time:
//! examples/lease_worker.py processes (boto3 and the generated client) read a stream while
//! a producer writes; tests/python/lease_proof.py runs them and checks what they printed.

use std::path::Path;

use serde_json::Value;
use tokio::process::Command;

use crate::helpers::spawn_app_with;
use crate::kinesalite::Kinesalite;
use crate::python_client::{assert_success, generate, tool};
use crate::roles::{close, hand_out};

/// Runs the proof in `mode`. With `least_privilege`, the server has a tokens file and closed
/// reads; the workers hold a `consume` token, the harness an `admin` one.
async fn prove(mode: &str, least_privilege: bool) -> Value {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let python = tool("KEYSPREAD_TEST_PYTHON", manifest.join(".venv/bin/python"));
    let kinesalite = Kinesalite::start().await;
    let work = tempfile::tempdir().unwrap();
    let client_dir = generate(work.path()).await;
    let app = spawn_app_with(|c| {
        if least_privilege {
            close(c, work.path());
        }
    })
    .await;
    let mut command = Command::new(&python);
    if least_privilege {
        let tokens = [
            ("KEYSPREAD_ADMIN_TOKEN", "ops"),
            ("KEYSPREAD_WORKER_TOKEN", "workers"),
        ];
        hand_out(&mut command, &tokens);
    }
    let run = command
        .arg(manifest.join("tests/python/lease_proof.py"))
        .arg("--client-dir")
        .arg(&client_dir)
        .args(["--keyspread", &app.url("")])
        .args(["--kinesis", kinesalite.api.endpoint()])
        .args(["--stream", &format!("leases-{mode}"), "--mode", mode])
        .arg("--work")
        .arg(work.path())
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .kill_on_drop(true)
        .output()
        .await
        .expect("run lease_proof.py");
    assert_success(&format!("lease_proof.py --mode {mode}"), &run);
    let stdout = String::from_utf8_lossy(&run.stdout);
    print!("{stdout}");
    let last = stdout.lines().last().expect("a summary line");
    serde_json::from_str(last).unwrap_or_else(|e| panic!("{e}: {last}"))
}

fn assert_one_reader_at_a_time(figures: &Value) {
    assert!(figures["records"].as_u64() > Some(300), "{figures}");
    assert_eq!(figures["producer_error"], Value::Null, "{figures}");
    for figure in [
        "missing",
        "wrong_data",
        "overlap_count",
        "duplicates_after_clean_hand_over",
    ] {
        assert_eq!(figures[figure], 0, "{figure}: {figures}");
    }
}

/// The proof's checker itself: a record the killed worker handed on first and another
/// worker read again is excused whatever order the workers' output files are read in; one
/// read twice after a clean hand-over is not.
#[tokio::test]
async fn the_proofs_checker_excuses_only_the_killed_workers_duplicates() {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let python = tool("KEYSPREAD_TEST_PYTHON", manifest.join(".venv/bin/python"));
    let run = Command::new(&python)
        .arg(manifest.join("tests/python/lease_proof.py"))
        .arg("--self-test")
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .output()
        .await
        .expect("run lease_proof.py --self-test");
    assert_success("lease_proof.py --self-test", &run);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_workers_one_killed_two_more_read_every_record_one_reader_at_a_time() {
    // On Postgres in `make proofs`, at full length.
    if !crate::skip::proof_here(
        "four_workers_one_killed_two_more_read_every_record_one_reader_at_a_time",
    ) {
        return;
    }
    let _quiet = crate::kinesalite::one_proof_at_a_time().await;
    // Least privilege too: the workers hold a consume token, reads are closed.
    let figures = prove("churn", true).await;
    assert_one_reader_at_a_time(&figures);
    assert!(figures["hand_overs"].as_u64() > Some(0), "{figures}");
    assert!(
        figures["events"]["revoking"].as_u64() > Some(0),
        "clean hand-overs: {figures}"
    );
    let per_worker = figures["per_worker"].as_object().unwrap();
    assert_eq!(per_worker.len(), 6, "all six workers read: {figures}");
    assert_eq!(
        figures["final_lease_counts"],
        serde_json::json!([1, 1, 2, 2, 2]),
        "eight equal shards over the five live workers: {figures}"
    );
    assert_eq!(figures["final_states"], serde_json::json!(["held"]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn children_of_a_real_split_and_merge_are_read_after_their_parents() {
    // On Postgres in `make proofs`, at full length.
    if !crate::skip::proof_here("children_of_a_real_split_and_merge_are_read_after_their_parents") {
        return;
    }
    let _quiet = crate::kinesalite::one_proof_at_a_time().await;
    let figures = prove("reshard", false).await;
    assert_one_reader_at_a_time(&figures);
    assert_eq!(
        (figures["shards"].as_u64(), figures["children"].as_u64()),
        (Some(5), Some(3)),
        "{figures}"
    );
    // Every record was read (missing is 0), the children's included.
    assert!(figures["children_read"].as_u64() >= Some(2), "{figures}");
    assert_eq!(
        figures["early_children"],
        serde_json::json!([]),
        "{figures}"
    );
    assert_eq!(
        figures["events"]["shard_end"], 3,
        "three closed parents read to the end: {figures}"
    );
    let states = figures["final_states"].as_object().unwrap();
    let done = states.values().filter(|s| *s == "done").count();
    let held = states.values().filter(|s| *s == "held").count();
    assert_eq!((done, held), (3, 2), "{figures}");
}
