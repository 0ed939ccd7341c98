//! Kinesis as referee: kinesalite (a real Kinesis implementation) and keyspread
//! must put every hash key and partition key on the same shard.

use std::path::Path;
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio::task::JoinSet;

use crate::helpers::spawn_app;

const SHARD_COUNTS: [u32; 6] = [1, 2, 3, 5, 8, 10];
const ACCOUNTS: usize = 40;
const PARTITION_KEYS: usize = 1_000;
const WORKERS: usize = 16;

// kinesalite wants a SigV4-shaped header and a date, but never checks the signature.
const FAKE_DATE: &str = "20240101T000000Z";
const FAKE_AUTH: &str = "AWS4-HMAC-SHA256 \
    Credential=AKIDEXAMPLE/20240101/us-east-1/kinesis/aws4_request, \
    SignedHeaders=content-type;host;x-amz-date;x-amz-target, \
    Signature=0000000000000000000000000000000000000000000000000000000000000000";

#[tokio::test]
async fn kinesalite_and_keyspread_put_every_key_on_the_same_shard() {
    let kinesalite = Kinesalite::start().await;
    let app = spawn_app().await;
    let keyspread = Keyspread {
        client: app.client.clone(),
        base: app.url(""),
    };
    let mut accounts = Vec::new();
    for i in 0..ACCOUNTS {
        accounts.push(keyspread.allocate(&format!("account-{i:02}")).await);
    }
    let partition_keys: Vec<Probe> = partition_keys().into_iter().map(Probe::Partition).collect();

    for shards in SHARD_COUNTS {
        let started = Instant::now();
        let stream = format!("referee-{shards}");
        let ranges = kinesalite.api.create_stream(&stream, shards).await;
        let referee = Arc::new(Referee {
            kinesis: kinesalite.api.clone(),
            keyspread: keyspread.clone(),
            stream,
            shards,
        });
        referee.check_ranges(&ranges).await;

        let edges = ranges.iter().flat_map(Shard::edges);
        let explicit: Vec<Probe> = accounts
            .iter()
            .chain(edges)
            .cloned()
            .map(Probe::Explicit)
            .collect();
        probe_all(&referee, explicit.clone()).await;
        probe_all(&referee, partition_keys.clone()).await;
        println!(
            "kinesis referee: {shards:>2} shards, {} explicit keys, {} partition keys, {} records put: all agree ({:.1?})",
            explicit.len(),
            partition_keys.len(),
            explicit.len() + partition_keys.len(),
            started.elapsed(),
        );
    }
}

/// One key to route through both kinesalite and keyspread.
#[derive(Clone, Debug)]
enum Probe {
    Explicit(String),
    Partition(String),
}

/// Compares kinesalite's routing of one stream with keyspread's uniform map.
struct Referee {
    kinesis: KinesisApi,
    keyspread: Keyspread,
    stream: String,
    shards: u32,
}

impl Referee {
    /// ListShards' ranges must be keyspread's uniform map, shard by shard.
    async fn check_ranges(&self, ranges: &[Shard]) {
        let (stream, shards) = (&self.stream, self.shards);
        assert_eq!(
            ranges.len(),
            shards as usize,
            "stream {stream}: ListShards gave {ranges:?}"
        );
        for (index, shard) in ranges.iter().enumerate() {
            for key in shard.edges() {
                let expected = ShardOf {
                    hash_key: key.clone(),
                    shard_index: index as u64,
                    shard_id: shard.shard_id.clone(),
                    starting_hash_key: shard.range.starting_hash_key.clone(),
                    ending_hash_key: shard.range.ending_hash_key.clone(),
                };
                let got = self.keyspread.shard_of("hash_key", key, shards).await;
                assert_eq!(
                    got, expected,
                    "stream {stream}: keyspread (left) disagrees with ListShards"
                );
            }
        }
    }

    /// PutRecord's ShardId must be the shard keyspread names for the same key.
    async fn check(&self, probe: &Probe) {
        let (stream, shards) = (&self.stream, self.shards);
        let (kinesis, keyspread) = match probe {
            Probe::Explicit(key) => (
                self.kinesis.put_record(stream, "explicit", Some(key)).await,
                self.keyspread.shard_of("hash_key", key, shards).await,
            ),
            Probe::Partition(key) => (
                self.kinesis.put_record(stream, key, None).await,
                self.keyspread.shard_of("partition_key", key, shards).await,
            ),
        };
        assert_eq!(
            kinesis, keyspread.shard_id,
            "stream {stream}: kinesalite put {probe:?} on {kinesis}, keyspread says {keyspread:?}",
        );
    }
}

/// Runs every probe, `WORKERS` at a time; a failed check fails the test with its own message.
async fn probe_all(referee: &Arc<Referee>, probes: Vec<Probe>) {
    let probes = Arc::new(probes);
    let mut workers = JoinSet::new();
    for first in 0..WORKERS {
        let (referee, probes) = (Arc::clone(referee), Arc::clone(&probes));
        workers.spawn(async move {
            for probe in probes.iter().skip(first).step_by(WORKERS) {
                referee.check(probe).await;
            }
        });
    }
    while let Some(done) = workers.join_next().await {
        if let Err(err) = done {
            std::panic::resume_unwind(err.into_panic());
        }
    }
}

/// Digits, words, URL metacharacters and unicode, 1 to 256 characters, the same every run.
fn partition_keys() -> Vec<String> {
    const WORDS: [&str; 8] = [
        "acme", "tenant", "user 42", "a+b&c=d", "100% off", "#x?q=1", "café", "../x",
    ];
    const UNICODE: [&str; 6] = ["ключ", "鍵", "🔑", "naïve façade", "עברית", "ε→∞"];
    let key = |i: usize| match i % 4 {
        // "1", "2", ...: the keys MD5 spreads badly.
        0 => (i / 4 + 1).to_string(),
        1 => format!("{} {i}", WORDS[i % WORDS.len()]),
        2 => format!("{}-{i}", UNICODE[i % UNICODE.len()]),
        // Kinesis allows 256 characters; kinesalite counts UTF-16 units, so stay in the BMP.
        _ => "keyspread-é-鍵-"
            .chars()
            .cycle()
            .take(1 + i * 37 % 256)
            .collect(),
    };
    (0..PARTITION_KEYS).map(key).collect()
}

/// kinesalite under node on 127.0.0.1, killed when dropped; it also exits
/// by itself when its stdin (held open by `child`) closes.
struct Kinesalite {
    child: Child,
    api: KinesisApi,
}

impl Kinesalite {
    async fn start() -> Kinesalite {
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

/// The few Kinesis actions the referee needs, over the AWS JSON 1.1 protocol.
#[derive(Clone)]
struct KinesisApi {
    client: reqwest::Client,
    endpoint: String,
}

impl KinesisApi {
    /// Creates a stream, waits for it to be ACTIVE and answers its shards.
    async fn create_stream(&self, name: &str, shard_count: u32) -> Vec<Shard> {
        self.post(
            "CreateStream",
            json!({"StreamName": name, "ShardCount": shard_count}),
        )
        .await;
        for _ in 0..200 {
            let out: DescribeStreamSummary = parse(
                &self
                    .post("DescribeStreamSummary", json!({"StreamName": name}))
                    .await,
            );
            if out.summary.stream_status == "ACTIVE" {
                let out: ListShards =
                    parse(&self.post("ListShards", json!({"StreamName": name})).await);
                return out.shards;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        panic!("stream {name} is not ACTIVE after 5 s");
    }

    /// Puts an empty record and answers the ShardId it landed on.
    async fn put_record(
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

#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
struct Shard {
    shard_id: String,
    #[serde(rename = "HashKeyRange")]
    range: HashKeyRange,
}

impl Shard {
    /// The first and last hash key of the shard.
    fn edges(&self) -> [&String; 2] {
        [&self.range.starting_hash_key, &self.range.ending_hash_key]
    }
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
struct HashKeyRange {
    starting_hash_key: String,
    ending_hash_key: String,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct PutRecord {
    shard_id: String,
}

/// keyspread's HTTP API, cheap to clone into tasks.
#[derive(Clone)]
struct Keyspread {
    client: reqwest::Client,
    base: String,
}

impl Keyspread {
    /// Allocates a key for a new account and answers it.
    async fn allocate(&self, account: &str) -> String {
        let what = format!("POST /keys/{account}");
        let response = self
            .client
            .post(format!("{}/keys/{account}", self.base))
            .send()
            .await;
        let assignment: Assignment = parse(&expect_status(response, 201, &what).await);
        assert_eq!(
            assignment.account, account,
            "{what} answered {assignment:?}"
        );
        assignment.hash_key
    }

    /// `GET /shard-of?{by}={value}&shards={shards}`: the uniform map's answer.
    async fn shard_of(&self, by: &str, value: &str, shards: u32) -> ShardOf {
        let query = [(by, value.to_string()), ("shards", shards.to_string())];
        let response = self
            .client
            .get(format!("{}/shard-of", self.base))
            .query(&query)
            .send()
            .await;
        let what = format!("GET /shard-of?{by}={value:?}&shards={shards}");
        parse(&expect_status(response, 200, &what).await)
    }
}

/// Assignment; `weight` and `created_at` are parsed only to pin their presence.
#[derive(Debug, Deserialize)]
#[allow(dead_code)]
struct Assignment {
    account: String,
    hash_key: String,
    weight: serde_json::Number,
    created_at: String,
}

#[derive(Debug, Deserialize, PartialEq)]
struct ShardOf {
    hash_key: String,
    shard_index: u64,
    shard_id: String,
    starting_hash_key: String,
    ending_hash_key: String,
}

/// The body of a response that must have `status`; panics naming `what` otherwise.
async fn expect_status(
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

fn parse<T: DeserializeOwned>(body: &str) -> T {
    serde_json::from_str(body).unwrap_or_else(|err| panic!("unexpected JSON ({err}): {body}"))
}
