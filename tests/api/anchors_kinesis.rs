//! Beside the anchors: the same 4-shard stream and the same 300 accounts (Zipf(1.1) records),
//! taken to 6 shards three ways: keyspread's reshard (the table as it leaves it), the uniform
//! split awslabs' amazon-kinesis-scaling-utils makes (made on kinesalite), and UpdateShardCount
//! UNIFORM_SCALING (computed: kinesalite lacks it). Per way: keys and observed records per
//! shard, Kinesis calls, time; once with one key an account, once with the hot accounts
//! opted in to several.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use serde_json::json;

use crate::helpers::{TestApp, spawn_app_with};
use crate::kinesalite::{Kinesalite, KinesisApi, one_proof_at_a_time};
use crate::process::Rng;
use crate::reshard_job::{open_shards, watch};
use crate::reshard_proxy::{Call, Proxy, Rules};

const ACCOUNTS: usize = 300;
const ZIPF: f64 = 1.1;
const SEED: u64 = 1;
/// Records written to each stream: about 2,000 a shard, so a shard's count is within ~2 %.
const RECORDS: usize = 12_000;
const CREATED: u32 = 4;
const TARGET: usize = 6;
/// The most of a shard's mean one key should carry: `--hot-account-share`'s default.
const HOT_SHARE: f64 = 0.5;

/// The open shards of a map in key order: (id, first key, last key).
type Map = Vec<(String, u128, u128)>;
/// Each account's keys, by index.
type Table = BTreeMap<String, Vec<u128>>;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keyspread_beside_uniform_scaling_and_scaling_utils_after_a_reshard() {
    if !crate::skip::sqlite_only(
        "keyspread_beside_uniform_scaling_and_scaling_utils_after_a_reshard",
    ) {
        return;
    }
    // Times are part of the table: nothing heavy beside it.
    let _alone = one_proof_at_a_time().await;
    let kinesalite = Kinesalite::start().await;
    let load = Load::zipf(SEED);
    let hottest = load.share.iter().copied().fold(0.0, f64::max);
    println!(
        "anchors: {ACCOUNTS} accounts, Zipf({ZIPF}) records (seed {SEED}), {RECORDS} records a \
         way, {CREATED} -> {TARGET} shards; the hottest account carries {:.1} % of the records, \
         {:.2} × a shard's mean{}",
        hottest * 100.0,
        hottest * TARGET as f64,
        if hottest * TARGET as f64 > 1.0 {
            ": alone it fills a shard past the mean, whatever holds its one key"
        } else {
            ""
        }
    );
    let single = compare(&kinesalite, &load, false).await;
    let fanned = compare(&kinesalite, &load, true).await;
    println!(
        "| accounts | way | keys per shard | max ÷ mean | records per shard | max ÷ mean | Kinesis calls | time |"
    );
    println!("| --- | --- | --- | ---: | --- | ---: | --- | --- |");
    for (rows, fanned) in [(&single, false), (&fanned, true)] {
        for row in rows {
            row.print(fanned);
        }
    }
    judge(&single);
    judge(&fanned);
}

/// keyspread's shards hold at most ⌈keys ÷ shards⌉ keys, and its busiest shard carries no
/// more of the records than the anchors' busiest.
fn judge([ours, split, scaling]: &[Row; 3]) {
    let keys: u64 = ours.keys.iter().sum();
    let most = keys.div_ceil(TARGET as u64);
    assert!(
        ours.keys.iter().all(|&n| n <= most),
        "keyspread's shards hold at most ⌈{keys}/{TARGET}⌉ = {most} keys: {:?}",
        ours.keys
    );
    for anchor in [split, scaling] {
        assert!(
            ratio(&ours.records) <= ratio(&anchor.records),
            "keyspread's busiest shard ({:?}) is no busier than {}'s ({:?})",
            ours.records,
            anchor.way,
            anchor.records
        );
    }
}

/// One way to 6 shards, as measured.
struct Row {
    way: &'static str,
    keys: Vec<u64>,
    records: Vec<u64>,
    calls: String,
    time: String,
}

impl Row {
    fn print(&self, fanned: bool) {
        let accounts = if fanned {
            "hot ones fanned out"
        } else {
            "one key each"
        };
        println!(
            "| {accounts} | {} | {:?} | {:.3} | {:?} | {:.3} | {} | {} |",
            self.way,
            self.keys,
            ratio(&self.keys),
            self.records,
            ratio(&self.records),
            self.calls,
            self.time
        );
    }
}

/// The busiest shard over the mean.
fn ratio(counts: &[u64]) -> f64 {
    let max = counts.iter().copied().max().unwrap_or(0) as f64;
    let total: u64 = counts.iter().sum();
    max * counts.len() as f64 / total as f64
}

/// Who writes the records: each account's share, and the records (account, sub-key).
struct Load {
    names: Vec<String>,
    share: Vec<f64>,
    records: Vec<(usize, String)>,
}

impl Load {
    /// Account ranks as a seeded permutation of the names (rank r carries r^-s ÷ H of the
    /// records, as examples/load_generator.py does), and the records drawn.
    fn zipf(seed: u64) -> Load {
        let mut rng = Rng::new(seed);
        let mut ranks: Vec<usize> = (1..=ACCOUNTS).collect();
        for i in (1..ranks.len()).rev() {
            ranks.swap(i, rng.below(i as u64 + 1) as usize);
        }
        let weights: Vec<f64> = ranks.iter().map(|&r| (r as f64).powf(-ZIPF)).collect();
        let total: f64 = weights.iter().sum();
        let share: Vec<f64> = weights.iter().map(|w| w / total).collect();
        let cumulative: Vec<f64> = (share.iter())
            .scan(0.0, |sum, s| {
                *sum += s;
                Some(*sum)
            })
            .collect();
        let records = (0..RECORDS)
            .map(|_| {
                let u = rng.below(1 << 32) as f64 / (1u64 << 32) as f64;
                let account = cumulative.partition_point(|&c| c <= u).min(ACCOUNTS - 1);
                (account, format!("order-{}", rng.below(1_000_000)))
            })
            .collect();
        let names = (0..ACCOUNTS).map(|i| format!("acct-{i:03}")).collect();
        Load {
            names,
            share,
            records,
        }
    }

    /// The keys an account needs so none carries more than [`HOT_SHARE`] of a shard's mean
    /// on `shards` shards: ⌈share × shards ÷ HOT_SHARE⌉, as `GET /load` suggests.
    fn fanout(&self, account: usize, shards: usize) -> u32 {
        (self.share[account] * shards as f64 / HOT_SHARE).ceil() as u32
    }

    /// Each record's (partition key, explicit hash key) under `table`: the account's key its
    /// sub-key chooses, as producers choose it.
    fn keyed(&self, table: &Table) -> Vec<(String, String)> {
        (self.records.iter())
            .map(|(account, sub_key)| {
                let name = &self.names[*account];
                let keys = &table[name];
                let index = keyspace::sub_key_index(sub_key, keys.len() as u32) as usize;
                (name.clone(), keys[index].to_string())
            })
            .collect()
    }
}

/// The three ways from the same stream and keys, the hot accounts with several keys when
/// `fanned`.
async fn compare(kinesalite: &Kinesalite, load: &Load, fanned: bool) -> [Row; 3] {
    let tag = if fanned { "fanned" } else { "single" };
    let proxy = Proxy::start(kinesalite.api.endpoint()).await;
    let endpoint = proxy.endpoint.clone();
    let app = spawn_app_with(|c| {
        c.kinesis_endpoint = Some(endpoint);
        c.kinesis_region = Some("us-east-1".into());
    })
    .await;
    let stream = format!("keyspread-{tag}");
    watch(&app, &kinesalite.api, &stream, CREATED).await;
    allocate(&app, load, fanned).await;
    // What both anchors keep: they never change a key.
    let before = table(&app).await;
    let theirs = format!("scaling-utils-{tag}");
    kinesalite.api.create_stream(&theirs, CREATED).await;

    let ours = reshard(&app, kinesalite, &proxy, &stream, load).await;
    if fanned {
        check_spread(&app, &stream, load).await;
    }
    let split = scaling_utils(kinesalite, &theirs, load, &before).await;
    let uniform = uniform_map(TARGET);
    let scaling = Row {
        way: "UpdateShardCount UNIFORM_SCALING (computed)",
        keys: keys_per_shard(&uniform, &before),
        records: records_per_shard(&uniform, &load.keyed(&before)),
        calls: "1 (Kinesis splits and merges itself)".into(),
        time: "not measurable here (AWS: \"could take a few minutes\")".into(),
    };
    [ours, split, scaling]
}

/// Allocates every account in name order (one key each); with `fanned`, the accounts
/// that need several keys on 6 shards opt in with `max_fanout` and get that fanout.
async fn allocate(app: &TestApp, load: &Load, fanned: bool) {
    for name in &load.names {
        app.allocate(name).await;
    }
    if !fanned {
        return;
    }
    for (account, name) in load.names.iter().enumerate() {
        let k = load.fanout(account, TARGET);
        if k > 1 {
            let share = load.share[account] * 100.0;
            println!(
                "anchors: {name} ({share:.1} % of the records) opts in: max_fanout and fanout {k}"
            );
            let body = json!({"max_fanout": k, "fanout": k, "weight": k});
            let answer =
                (app.call(reqwest::Method::PATCH, &format!("/keys/{name}"), Some(body))).await;
            assert_eq!(answer.status, 200, "PATCH /keys/{name}: {answer:?}");
        }
    }
}

/// Every account's keys as `GET /keys` answers them now.
async fn table(app: &TestApp) -> Table {
    let mut table = Table::new();
    let mut after = String::new();
    loop {
        let page = app.get(&format!("/keys?limit=1000{after}")).await;
        assert_eq!(page.status, 200, "{page:?}");
        for item in page.body["items"].as_array().expect("items") {
            let keys = (item["hash_keys"].as_array().expect("hash_keys").iter())
                .map(|k| k.as_str().and_then(|k| k.parse().ok()).expect("a hash key"))
                .collect();
            table.insert(item["account"].as_str().expect("account").to_owned(), keys);
        }
        match page.body["next"].as_str() {
            Some(next) => after = format!("&after={next}"),
            None => return table,
        }
    }
}

/// keyspread's reshard of watched stream `stream` through `proxy`, timed to `done` and to
/// its moves switched, and the records written with the table it leaves.
async fn reshard(
    app: &TestApp,
    kinesalite: &Kinesalite,
    proxy: &Proxy,
    stream: &str,
    load: &Load,
) -> Row {
    proxy.set(Rules::default());
    let started = Instant::now();
    let body = json!({"target": TARGET, "switch_after_s": 1});
    let answer = app
        .post(&format!("/streams/{stream}/reshard"), Some(body))
        .await;
    assert_eq!(answer.status, 202, "{answer:?}");
    let job = until(|| async {
        let job = app.get(&format!("/streams/{stream}/reshard")).await.body;
        (job["state"] != "running").then_some(job)
    })
    .await;
    assert_eq!(job["state"], "done", "{job}");
    let done = started.elapsed();
    let calls = proxy.calls();
    until(|| async {
        let moves = app.get("/moves").await.body;
        (moves["items"].as_array().is_some_and(Vec::is_empty)).then_some(())
    })
    .await;
    let switched = started.elapsed();
    let moved = moves(app).await;
    let table = table(app).await;
    let map = open_shards(&kinesalite.api, stream).await;
    let records = put(&kinesalite.api, stream, &map, &load.keyed(&table)).await;
    Row {
        way: "keyspread `reshard --target 6`",
        keys: keys_per_shard(&map, &table),
        records,
        calls: tally(&calls),
        time: match moved {
            0 => format!("{done:.1?} to done (no key to move)"),
            n => format!("{done:.1?} to done, {switched:.1?} to its {n} moves switched (1 s on)"),
        },
    }
}

/// How many keys the reshard's rebalance moved, as the event log says.
async fn moves(app: &TestApp) -> usize {
    let (mut after, mut moved) = (0, 0);
    loop {
        let page = app
            .get(&format!("/events?after={after}&limit=1000"))
            .await
            .body;
        let events = page["events"].as_array().expect("events");
        if events.is_empty() {
            return moved;
        }
        moved += (events.iter())
            .filter(|e| e["kind"] == "move" && e["reason"] == "reshard")
            .count();
        after = page["next"].as_i64().expect("next");
    }
}

/// Waits (at most 60 s, looking every 20 ms) for `look` to answer something.
async fn until<T, F: std::future::Future<Output = Option<T>>>(look: impl Fn() -> F) -> T {
    let started = Instant::now();
    loop {
        if let Some(found) = look().await {
            return found;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "not within 60 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// scaling-utils' resize of `stream` through a recording proxy of its own, timed, and the
/// records written with the keys as they were.
async fn scaling_utils(kinesalite: &Kinesalite, stream: &str, load: &Load, keys: &Table) -> Row {
    let proxy = Proxy::start(kinesalite.api.endpoint()).await;
    let started = Instant::now();
    let slept =
        crate::scaling_utils::resize(&KinesisApi::at(&proxy.endpoint), stream, TARGET).await;
    let took = started.elapsed();
    let map = open_shards(&kinesalite.api, stream).await;
    assert_eq!(map.len(), TARGET, "{map:?}");
    let records = put(&kinesalite.api, stream, &map, &load.keyed(keys)).await;
    Row {
        way: "scaling-utils' uniform split (on kinesalite)",
        keys: keys_per_shard(&map, keys),
        records,
        calls: tally(&proxy.calls()),
        time: format!(
            "{took:.1?} on kinesalite, + {}s of its waits for ACTIVE (not slept here)",
            slept.as_secs()
        ),
    }
}

/// SplitShard and MergeShards made, then the other calls by action.
fn tally(calls: &[Call]) -> String {
    let mut by_action: BTreeMap<&str, usize> = BTreeMap::new();
    for call in calls {
        *by_action.entry(call.action.as_str()).or_default() += 1;
    }
    let reshaped = calls.iter().filter(|c| c.reshaped()).count();
    let others: Vec<String> = (by_action.iter())
        .filter(|(action, _)| !matches!(**action, "SplitShard" | "MergeShards"))
        .map(|(action, n)| format!("{n} {action}"))
        .collect();
    format!(
        "{reshaped} ({} SplitShard, {} MergeShards) + {}",
        by_action.get("SplitShard").copied().unwrap_or(0),
        by_action.get("MergeShards").copied().unwrap_or(0),
        others.join(", ")
    )
}

/// Writes `records` to `stream` with PutRecords and counts the ShardId each landed on, per
/// open shard of `map`; they must land where `map`'s ranges say.
async fn put(
    kinesis: &KinesisApi,
    stream: &str,
    map: &Map,
    records: &[(String, String)],
) -> Vec<u64> {
    let mut counts = vec![0u64; map.len()];
    for batch in records.chunks(500) {
        for shard in kinesis.put_records(stream, batch).await {
            let at = map.iter().position(|(id, ..)| *id == shard);
            counts[at.unwrap_or_else(|| panic!("{shard} is not an open shard of {map:?}"))] += 1;
        }
    }
    assert_eq!(
        counts,
        records_per_shard(map, records),
        "kinesalite routes by {map:?}"
    );
    counts
}

/// Keys per open shard of `map`.
fn keys_per_shard(map: &Map, table: &Table) -> Vec<u64> {
    let mut counts = vec![0u64; map.len()];
    for key in table.values().flatten() {
        counts[shard_of(map, *key)] += 1;
    }
    counts
}

/// Records per open shard of `map`, by their explicit hash keys.
fn records_per_shard(map: &Map, records: &[(String, String)]) -> Vec<u64> {
    let mut counts = vec![0u64; map.len()];
    for (_, key) in records {
        counts[shard_of(map, key.parse().expect("a hash key"))] += 1;
    }
    counts
}

fn shard_of(map: &Map, key: u128) -> usize {
    map.partition_point(|(_, _, end)| *end < key)
}

/// What UpdateShardCount UNIFORM_SCALING leaves: `shards` shards of equal hash key ranges
/// (https://docs.aws.amazon.com/kinesis/latest/APIReference/API_UpdateShardCount.html,
/// "Uniform scaling creates shards of equal size"), cut as CreateStream cuts them.
fn uniform_map(shards: usize) -> Map {
    let width = u128::MAX / shards as u128;
    (0..shards)
        .map(|i| {
            let start = i as u128 * width;
            let end = if i + 1 == shards {
                u128::MAX
            } else {
                start + width - 1
            };
            (format!("uniform-{i}"), start, end)
        })
        .collect()
}

/// Each fanned-out account's keys lie on distinct shards of `stream`, as `GET /shard-of`
/// answers them.
async fn check_spread(app: &TestApp, stream: &str, load: &Load) {
    for (account, name) in load.names.iter().enumerate() {
        let k = load.fanout(account, TARGET);
        if k == 1 {
            continue;
        }
        let mut shards = Vec::new();
        for index in 0..k {
            let query = format!("account={name}&index={index}&stream={stream}");
            let at = app.get(&format!("/shard-of?{query}")).await;
            assert_eq!(at.status, 200, "{at:?}");
            shards.push(at.body["shard_id"].clone());
        }
        shards.sort_by_key(|s| s.to_string());
        shards.dedup();
        assert_eq!(shards.len(), k as usize, "{name}'s {k} keys: {shards:?}");
    }
}
