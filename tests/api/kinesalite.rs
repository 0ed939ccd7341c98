//! kinesalite (a real Kinesis implementation, in memory) under node, and a small typed
//! client for the Kinesis actions the referee tests need.

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

// kinesalite wants a SigV4-shaped header and a date, but never checks the signature.
const FAKE_DATE: &str = "20240101T000000Z";
const FAKE_AUTH: &str = "AWS4-HMAC-SHA256 \
    Credential=AKIDEXAMPLE/20240101/us-east-1/kinesis/aws4_request, \
    SignedHeaders=content-type;host;x-amz-date;x-amz-target, \
    Signature=0000000000000000000000000000000000000000000000000000000000000000";

/// The proofs on kinesalite measure what a stream carries in windows of seconds; on a
/// two-core machine two of them at once starve each other's producers and consumers. Each
/// holds this for its whole run, so one runs at a time (lighter tests still run beside it).
static ONE_PROOF: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Waits for the other proofs on kinesalite to finish; hold the answer while proving.
pub(crate) async fn one_proof_at_a_time() -> tokio::sync::MutexGuard<'static, ()> {
    ONE_PROOF.lock().await
}

/// kinesalite under node on 127.0.0.1, killed when dropped; it also exits
/// by itself when its stdin (held open by `child`) closes.
pub(crate) struct Kinesalite {
    child: Child,
    pub(crate) api: KinesisApi,
}

impl Kinesalite {
    pub(crate) async fn start() -> Kinesalite {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/kinesis");
        assert!(
            dir.join("node_modules/kinesalite").is_dir(),
            "{}/node_modules/kinesalite is missing: run `make test-deps` (or `npm ci --prefix tests/kinesis`)",
            dir.display(),
        );
        let mut child = Command::new("node")
            .arg(dir.join("kinesalite.js"))
            .arg("0")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap_or_else(|err| panic!("cannot run `node` for kinesalite: {err}"));
        let stdout = BufReader::new(child.stdout.take().expect("piped stdout"));
        let line = tokio::time::timeout(Duration::from_secs(30), stdout.lines().next_line())
            .await
            .expect("kinesalite did not start within 30 s")
            .expect("read kinesalite's stdout")
            .expect("kinesalite exited before listening");
        let port: u16 = line
            .strip_prefix("listening ")
            .and_then(|port| port.parse().ok())
            .unwrap_or_else(|| panic!("unexpected first line from kinesalite.js: {line:?}"));
        let endpoint = format!("http://127.0.0.1:{port}/");
        let api = KinesisApi {
            client: reqwest::Client::new(),
            endpoint,
        };
        Kinesalite { child, api }
    }
}

impl Drop for Kinesalite {
    fn drop(&mut self) {
        let _ = self.child.start_kill();
        // Reap it here: the test process may exit before tokio's reaper runs.
        for _ in 0..100 {
            if !matches!(self.child.try_wait(), Ok(None)) {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

/// The few Kinesis actions the referee tests need, over the AWS JSON 1.1 protocol.
#[derive(Clone)]
pub(crate) struct KinesisApi {
    client: reqwest::Client,
    endpoint: String,
}

impl KinesisApi {
    /// A client of the Kinesis endpoint at `endpoint` (a recording proxy in front of
    /// kinesalite, say).
    pub(crate) fn at(endpoint: &str) -> KinesisApi {
        KinesisApi {
            client: reqwest::Client::new(),
            endpoint: endpoint.to_owned(),
        }
    }

    /// Where kinesalite listens, for other Kinesis clients (boto3).
    pub(crate) fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// Creates a stream, waits for it to be ACTIVE and answers its shards.
    pub(crate) async fn create_stream(&self, name: &str, shard_count: u32) -> Vec<Shard> {
        self.post(
            "CreateStream",
            json!({"StreamName": name, "ShardCount": shard_count}),
        )
        .await;
        self.wait_active(name).await;
        self.list_shards(name).await
    }

    /// Deletes a stream (at once: kinesalite.js deletes with no delay).
    pub(crate) async fn delete_stream(&self, name: &str) {
        self.post("DeleteStream", json!({"StreamName": name})).await;
    }

    /// Polls DescribeStreamSummary until the stream is ACTIVE, for at most 5 s.
    pub(crate) async fn wait_active(&self, name: &str) {
        for _ in 0..500 {
            let out: DescribeStreamSummary = parse(
                &self
                    .post("DescribeStreamSummary", json!({"StreamName": name}))
                    .await,
            );
            if out.summary.stream_status == "ACTIVE" {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("stream {name} is not ACTIVE after 5 s");
    }

    /// ListShards' JSON exactly as kinesalite answers it (what `aws kinesis list-shards` prints).
    pub(crate) async fn list_shards_json(&self, name: &str) -> Value {
        parse(&self.post("ListShards", json!({"StreamName": name})).await)
    }

    /// Every shard of the stream, closed ones included, in kinesalite's order.
    pub(crate) async fn list_shards(&self, name: &str) -> Vec<Shard> {
        let out: ListShards =
            serde_json::from_value(self.list_shards_json(name).await).expect("ListShards answer");
        out.shards
    }

    /// `SplitShard`, then waits for ACTIVE.
    pub(crate) async fn split_shard(&self, name: &str, shard: &str, new_starting_hash_key: &str) {
        self.post(
            "SplitShard",
            json!({
                "StreamName": name,
                "ShardToSplit": shard,
                "NewStartingHashKey": new_starting_hash_key,
            }),
        )
        .await;
        self.wait_active(name).await;
    }

    /// `MergeShards` (`shard` must be the lower of the two), then waits for ACTIVE.
    pub(crate) async fn merge_shards(&self, name: &str, shard: &str, adjacent: &str) {
        self.post(
            "MergeShards",
            json!({
                "StreamName": name,
                "ShardToMerge": shard,
                "AdjacentShardToMerge": adjacent,
            }),
        )
        .await;
        self.wait_active(name).await;
    }

    /// Puts an empty record and answers the ShardId it landed on.
    pub(crate) async fn put_record(
        &self,
        stream: &str,
        partition_key: &str,
        explicit_hash_key: Option<&str>,
    ) -> String {
        let mut record = json!({"StreamName": stream, "PartitionKey": partition_key, "Data": ""});
        if let Some(key) = explicit_hash_key {
            record["ExplicitHashKey"] = json!(key);
        }
        let out: PutRecord = parse(&self.post("PutRecord", record).await);
        out.shard_id
    }

    /// `PutRecords` of empty records, each `(partition key, explicit hash key)` (at most 500):
    /// answers the ShardId each landed on, in order.
    pub(crate) async fn put_records(
        &self,
        stream: &str,
        records: &[(String, String)],
    ) -> Vec<String> {
        let entries: Vec<Value> = (records.iter())
            .map(|(partition, key)| {
                json!({"PartitionKey": partition, "ExplicitHashKey": key, "Data": ""})
            })
            .collect();
        let out = self
            .call(
                "PutRecords",
                json!({"StreamName": stream, "Records": entries}),
            )
            .await;
        assert_eq!(out["FailedRecordCount"], 0, "PutRecords: {out}");
        (out["Records"].as_array().expect("Records").iter())
            .map(|r| r["ShardId"].as_str().expect("ShardId").to_owned())
            .collect()
    }

    /// Any action, answered 200: its JSON answer.
    pub(crate) async fn call(&self, action: &str, body: Value) -> Value {
        parse(&self.post(action, body).await)
    }

    /// Every record of one shard from its start, oldest first: (partition key, data).
    pub(crate) async fn read_shard(&self, stream: &str, shard_id: &str) -> Vec<(String, Vec<u8>)> {
        let iterator: Value = parse(
            &self
                .post(
                    "GetShardIterator",
                    json!({"StreamName": stream, "ShardId": shard_id,
                           "ShardIteratorType": "TRIM_HORIZON"}),
                )
                .await,
        );
        let mut at = iterator["ShardIterator"].as_str().map(str::to_owned);
        let mut records = Vec::new();
        while let Some(iterator) = at.take() {
            let page: Value = parse(
                &self
                    .post(
                        "GetRecords",
                        json!({"ShardIterator": iterator, "Limit": 10000}),
                    )
                    .await,
            );
            let got = page["Records"].as_array().expect("Records");
            for record in got {
                let data = base64(record["Data"].as_str().unwrap_or_default());
                let key = record["PartitionKey"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned();
                records.push((key, data));
            }
            // An open shard hands out a next iterator forever: stop at the first empty page.
            if !got.is_empty() {
                at = page["NextShardIterator"].as_str().map(str::to_owned);
            }
        }
        records
    }

    async fn post(&self, action: &str, body: Value) -> String {
        let response = self
            .client
            .post(&self.endpoint)
            .header("X-Amz-Target", format!("Kinesis_20131202.{action}"))
            .header("Content-Type", "application/x-amz-json-1.1")
            .header("X-Amz-Date", FAKE_DATE)
            .header("Authorization", FAKE_AUTH)
            .body(body.to_string())
            .send()
            .await;
        expect_status(response, 200, &format!("kinesalite {action} {body}")).await
    }
}

#[derive(Deserialize)]
struct DescribeStreamSummary {
    #[serde(rename = "StreamDescriptionSummary")]
    summary: StreamSummary,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct StreamSummary {
    stream_status: String,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct ListShards {
    shards: Vec<Shard>,
}

/// One shard as ListShards describes it.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub(crate) struct Shard {
    pub(crate) shard_id: String,
    #[serde(rename = "HashKeyRange")]
    pub(crate) range: HashKeyRange,
    sequence_number_range: SequenceNumberRange,
}

impl Shard {
    /// The first and last hash key of the shard.
    pub(crate) fn edges(&self) -> [&String; 2] {
        [&self.range.starting_hash_key, &self.range.ending_hash_key]
    }

    /// Open shards have no ending sequence number.
    pub(crate) fn is_open(&self) -> bool {
        self.sequence_number_range.ending_sequence_number.is_none()
    }

    /// The starting hash key as a number, for ordering.
    pub(crate) fn start(&self) -> u128 {
        self.range
            .starting_hash_key
            .parse()
            .expect("decimal hash key")
    }

    /// The ending hash key as a number.
    pub(crate) fn end(&self) -> u128 {
        self.range
            .ending_hash_key
            .parse()
            .expect("decimal hash key")
    }
}

/// The open shards of `shards`, in hash key order.
pub(crate) fn open_in_key_order(shards: &[Shard]) -> Vec<Shard> {
    let mut open: Vec<Shard> = shards.iter().filter(|s| s.is_open()).cloned().collect();
    open.sort_by_key(Shard::start);
    open
}

#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub(crate) struct HashKeyRange {
    pub(crate) starting_hash_key: String,
    pub(crate) ending_hash_key: String,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
struct SequenceNumberRange {
    ending_sequence_number: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct PutRecord {
    shard_id: String,
}

/// The body of a response that must have `status`; panics naming `what` otherwise.
pub(crate) async fn expect_status(
    response: reqwest::Result<reqwest::Response>,
    status: u16,
    what: &str,
) -> String {
    let response = response.unwrap_or_else(|err| panic!("{what}: {err}"));
    let got = response.status();
    let body = response
        .text()
        .await
        .unwrap_or_else(|err| panic!("{what}: reading the body: {err}"));
    assert_eq!(got.as_u16(), status, "{what} answered {got}: {body}");
    body
}

/// Standard base64 (the AWS JSON protocol's blobs), decoded.
fn base64(text: &str) -> Vec<u8> {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = Vec::with_capacity(text.len() * 3 / 4);
    let (mut bits, mut held) = (0u32, 0u32);
    for c in text.bytes().filter(|&c| c != b'=') {
        let value = ALPHABET
            .iter()
            .position(|&a| a == c)
            .expect("a base64 digit") as u32;
        bits = (bits << 6) | value;
        held += 6;
        if held >= 8 {
            held -= 8;
            out.push((bits >> held) as u8);
        }
    }
    out
}

pub(crate) fn parse<T: DeserializeOwned>(body: &str) -> T {
    serde_json::from_str(body).unwrap_or_else(|err| panic!("unexpected JSON ({err}): {body}"))
}
