//! Kinesis as referee: kinesalite (a real Kinesis implementation) and keyspread
//! must put every hash key and partition key on the same shard.

use std::sync::Arc;
use std::time::Instant;

use serde::Deserialize;
use tokio::task::JoinSet;

use crate::helpers::spawn_app;
use crate::kinesalite::{Kinesalite, KinesisApi, Shard, expect_status, parse};

const SHARD_COUNTS: [u32; 6] = [1, 2, 3, 5, 8, 10];
const ACCOUNTS: usize = 40;
const PARTITION_KEYS: usize = 1_000;
const WORKERS: usize = 16;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kinesalite_and_keyspread_put_every_key_on_the_same_shard() {
    // The client drives the HTTP API, which either backend serves alike: once is enough.
    if !crate::skip::sqlite_only("kinesalite_and_keyspread_put_every_key_on_the_same_shard") {
        return;
    }
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
