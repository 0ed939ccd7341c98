//! The Rust producer of examples/mirror_producer (keys from keyspread's mirror, records
//! through the AWS SDK for Rust) against kinesalite: every record lands on the shard
//! `GET /shard-of` names for its account and sub-key, each sub-key's records in the order
//! they were written, none lost, none twice.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;

use serde_json::json;
use tokio::io::AsyncWriteExt;

use crate::helpers::spawn_app;
use crate::kinesalite::Kinesalite;

const STREAM: &str = "mirrored";
const SHARDS: u32 = 4;
/// (account, fanout): two hot accounts with several keys, four with one.
const ACCOUNTS: [(&str, u32); 6] = [
    ("hot-a", 4),
    ("hot-b", 3),
    ("plain-1", 1),
    ("plain-2", 1),
    ("plain-3", 1),
    ("plain-4", 1),
];
const SUB_KEYS: [&str; 5] = ["order-1", "user-42", "order-2", "", "café"];
const PER_SUB_KEY: usize = 40;

/// The producer `make test-deps` builds (`make mirror-producer`).
fn producer() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("target"));
    let binary = target.join("debug/keyspread-mirror-producer");
    assert!(
        binary.is_file(),
        "{} is missing: run `make test-deps` (or `make mirror-producer`)",
        binary.display()
    );
    binary
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rust_mirror_producer_puts_every_record_where_shard_of_says_in_order() {
    // The client drives the HTTP API, which either backend serves alike: once is enough.
    if !crate::skip::sqlite_only(
        "the_rust_mirror_producer_puts_every_record_where_shard_of_says_in_order",
    ) {
        return;
    }
    let _quiet = crate::kinesalite::one_proof_at_a_time().await;
    let binary = producer();
    let kinesalite = Kinesalite::start().await;
    let kinesis = &kinesalite.api;
    let shards = kinesis.create_stream(STREAM, SHARDS).await;
    let app = spawn_app().await;
    let put = app
        .call(
            reqwest::Method::PUT,
            &format!("/streams/{STREAM}"),
            Some(json!({"shard_count": SHARDS, "primary": true})),
        )
        .await;
    assert!(put.status < 300, "{}", put.body);
    for (account, fanout) in ACCOUNTS {
        let answer = app
            .post(
                &format!("/keys/{account}"),
                Some(json!({"fanout": fanout, "weight": 12})),
            )
            .await;
        assert_eq!(answer.status, 201, "{}", answer.body);
    }

    // Records interleaved across accounts and sub-keys, numbered per (account, sub-key).
    let mut input = String::new();
    for n in 0..PER_SUB_KEY {
        for (account, _) in ACCOUNTS {
            for sub_key in SUB_KEYS {
                input.push_str(&format!("{account}\t{sub_key}\t{account}|{sub_key}|{n}\n"));
            }
        }
    }
    let mut child = tokio::process::Command::new(&binary)
        .args(["--keyspread", &app.url(""), "--stream", STREAM])
        .args(["--endpoint-url", kinesis.endpoint()])
        .env("AWS_ACCESS_KEY_ID", "local")
        .env("AWS_SECRET_ACCESS_KEY", "local")
        .env("AWS_REGION", "us-east-1")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("run the producer");
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(input.as_bytes()).await.unwrap();
    drop(stdin);
    let out = tokio::time::timeout(
        std::time::Duration::from_secs(120),
        child.wait_with_output(),
    )
    .await
    .expect("the producer finished within 120 s")
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}\n{stdout}{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let total = ACCOUNTS.len() * SUB_KEYS.len() * PER_SUB_KEY;
    assert!(
        stdout.starts_with(&format!("sent {total} records")),
        "{stdout}"
    );

    // Where `GET /shard-of` says each (account, sub-key) goes.
    let mut shard_of: HashMap<(String, String), String> = HashMap::new();
    for (account, _) in ACCOUNTS {
        for sub_key in SUB_KEYS {
            // An empty SUB_KEY is the producer's "no sub-key": the account's first key.
            let pick = match sub_key {
                "" => "index=0".to_owned(),
                _ => format!("sub_key={}", urlencoding(sub_key)),
            };
            let query = format!("/shard-of?account={account}&{pick}&stream={STREAM}");
            let answer = app.get(&query).await;
            assert_eq!(answer.status, 200, "{query}: {}", answer.body);
            let id = answer.body["shard_id"]
                .as_str()
                .expect("shard_id")
                .to_owned();
            shard_of.insert((account.to_owned(), sub_key.to_owned()), id);
        }
    }
    let mut next: HashMap<(String, String), usize> = HashMap::new();
    let mut read = 0;
    let mut read_by_shard: HashMap<String, usize> = HashMap::new();
    for shard in &shards {
        for (partition_key, data) in kinesis.read_shard(STREAM, &shard.shard_id).await {
            let text = String::from_utf8(data).unwrap();
            let mut parts = text.splitn(3, '|');
            let (account, sub_key, n) = (
                parts.next().unwrap().to_owned(),
                parts.next().unwrap().to_owned(),
                parts.next().unwrap().parse::<usize>().unwrap(),
            );
            assert_eq!(partition_key, account);
            let at = (account, sub_key);
            assert_eq!(shard_of[&at], shard.shard_id, "{text} landed elsewhere");
            let expected = next.entry(at).or_default();
            assert_eq!(n, *expected, "{text}: out of order or twice");
            *expected += 1;
            read += 1;
            *read_by_shard.entry(shard.shard_id.clone()).or_default() += 1;
        }
    }
    assert_eq!(read, total, "every record read back once");
    assert!(next.values().all(|&n| n == PER_SUB_KEY));

    // The producer reported what it sent before it exited: each shard's share of the
    // producers' load is its share of the records read.
    let load = app.get(&format!("/load?stream={STREAM}")).await;
    assert_eq!(load.status, 200, "{}", load.body);
    let rates: HashMap<String, f64> = (load.body["shards"].as_array().unwrap().iter())
        .map(|s| {
            let id = s["shard_id"].as_str().unwrap().to_owned();
            (id, s["records_per_s"].as_f64().unwrap())
        })
        .collect();
    let sum: f64 = rates.values().sum();
    assert!(sum > 0.0, "the producer reported nothing: {}", load.body);
    for shard in load.body["shards"].as_array().unwrap() {
        let id = shard["shard_id"].as_str().unwrap();
        let share_read = read_by_shard.get(id).copied().unwrap_or(0) as f64 / total as f64;
        assert!(
            (rates[id] / sum - share_read).abs() < 0.01,
            "{id}: {share_read} of the records read: {}",
            load.body
        );
        let source = if share_read > 0.0 {
            json!("producers")
        } else {
            json!(null)
        };
        assert_eq!(shard["source"], source, "{}", load.body);
    }
    println!("{stdout}{read} records read back in order from {SHARDS} shards");
}

fn urlencoding(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'-' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}
