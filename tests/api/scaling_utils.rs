//! How awslabs' amazon-kinesis-scaling-utils resizes a stream with SplitShard and MergeShards
//! (`StreamScaler.scaleStream`, release 9.8.x), made call for call against a Kinesis
//! endpoint: it walks the open shards from the lowest hash key, cutting each to `1 ÷ target`
//! of the keyspace, and never looks at the keys records are sent with.

use std::cmp::Ordering;
use std::time::Duration;

use serde_json::{Value, json};

use crate::kinesalite::KinesisApi;

/// The highest hash key, scaling-utils' `ShardHashInfo.maxHash`.
const MAX_HASH: u128 = u128::MAX;

/// An open shard as scaling-utils sees it (`ShardHashInfo`).
#[derive(Clone, Debug)]
struct Info {
    id: String,
    start: u128,
    /// Its share of the keyspace, `(end - start) ÷ maxHash` at 10 decimals.
    pct: f64,
}

/// Resizes `stream` to `target` shards as `StreamScaler.resize` does when Kinesis refuses
/// UpdateShardCount (a target past double or half the shards, or the calls' daily quota):
/// kinesalite lacks UpdateShardCount, so that first call is not made here. Answers how long
/// scaling-utils would have slept waiting for the stream to be ACTIVE again.
pub(crate) async fn resize(kinesis: &KinesisApi, stream: &str, target: usize) -> Duration {
    let mut slept = Duration::ZERO;
    // doResize: the open shard count, from DescribeStreamSummary.
    let summary = describe(kinesis, stream).await;
    assert!(summary["OpenShardCount"].as_u64().is_some(), "{summary}");
    let target_pct = 1.0 / target as f64;
    // A stack whose top (the end) is the lowest shard.
    let mut stack = open_shards(kinesis, stream, None).await;
    stack.reverse();
    while let Some(lower) = stack.pop() {
        match soft_compare(lower.pct, target_pct) {
            Ordering::Equal => {}
            Ordering::Greater => {
                let highest = top_or(&stack, &lower);
                let [_, upper] =
                    split(kinesis, stream, &lower, target_pct, &highest, &mut slept).await;
                stack.push(upper);
            }
            Ordering::Less => {
                let Some(higher) = stack.pop() else { break };
                let highest = top_or(&stack, &higher);
                if soft_compare(lower.pct + higher.pct, target_pct) == Ordering::Greater {
                    // Cut the rest of a target's width off the next shard and merge it down.
                    let offset = target_pct - lower.pct;
                    let [cut, upper] =
                        split(kinesis, stream, &higher, offset, &highest, &mut slept).await;
                    stack.push(upper);
                    let highest = top_or(&stack, &higher);
                    merge(kinesis, stream, &lower, &cut, &highest, &mut slept).await;
                } else {
                    let merged =
                        merge(kinesis, stream, &lower, &higher, &highest, &mut slept).await;
                    stack.push(merged);
                }
            }
        }
    }
    // reportFor: the open shards, listed once more for the report.
    open_shards(kinesis, stream, None).await;
    slept
}

/// The id scaling-utils lists after (`ExclusiveStartShardId`) to find new shards: the
/// stack's top, or `shard` when it is empty.
fn top_or(stack: &[Info], shard: &Info) -> String {
    stack.last().unwrap_or(shard).id.clone()
}

/// `ShardHashInfo.doSplit`: SplitShard at `pct` of the keyspace above the shard's start,
/// wait for ACTIVE, and find the two children among the shards listed after `highest`.
async fn split(
    kinesis: &KinesisApi,
    stream: &str,
    shard: &Info,
    pct: f64,
    highest: &str,
    slept: &mut Duration,
) -> [Info; 2] {
    let at = shard.start + fraction_of_max(pct);
    let body = json!({"StreamName": stream, "ShardToSplit": shard.id,
                      "NewStartingHashKey": at.to_string()});
    kinesis.call("SplitShard", body).await;
    wait_active(kinesis, stream, slept).await;
    let mut lower = None;
    for info in open_shards(kinesis, stream, Some(highest)).await {
        if info.id == shard.id {
            continue;
        }
        if info.start == at {
            let lower = lower.unwrap_or_else(|| panic!("no lower child of {shard:?}"));
            return [lower, info];
        }
        lower = Some(info);
    }
    panic!("no shard of {stream} starts at {at} after splitting {shard:?}")
}

/// `AdjacentShards.doMerge`: MergeShards, wait for ACTIVE, and find the merged shard among
/// those listed after `highest`.
async fn merge(
    kinesis: &KinesisApi,
    stream: &str,
    lower: &Info,
    higher: &Info,
    highest: &str,
    slept: &mut Duration,
) -> Info {
    let body = json!({"StreamName": stream, "ShardToMerge": lower.id,
                      "AdjacentShardToMerge": higher.id});
    kinesis.call("MergeShards", body).await;
    wait_active(kinesis, stream, slept).await;
    let listed = list(kinesis, stream, Some(highest)).await;
    let merged = listed.iter().find(|s| {
        s["ParentShardId"] == lower.id.as_str() && s["AdjacentParentShardId"] == higher.id.as_str()
    });
    info(merged.unwrap_or_else(|| panic!("no shard merged from {lower:?} and {higher:?}")))
}

/// `StreamScalingUtils.waitForStreamStatus`: DescribeStreamSummary until ACTIVE, sleeping
/// 20 s after the first look that is not, then 1 s. Those sleeps are added to `slept`, not
/// slept: kinesalite is ACTIVE again within milliseconds, so they would only measure
/// scaling-utils' constants; the looks here are 20 ms apart (at most a minute).
async fn wait_active(kinesis: &KinesisApi, stream: &str, slept: &mut Duration) {
    let mut pause = Duration::from_secs(20);
    for _ in 0..3000 {
        if describe(kinesis, stream).await["StreamStatus"] == "ACTIVE" {
            return;
        }
        *slept += pause;
        pause = Duration::from_secs(1);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("{stream} is not ACTIVE after a minute");
}

async fn describe(kinesis: &KinesisApi, stream: &str) -> Value {
    let out = (kinesis.call("DescribeStreamSummary", json!({"StreamName": stream}))).await;
    out["StreamDescriptionSummary"].clone()
}

/// ListShards (after `after`, when given), every page.
async fn list(kinesis: &KinesisApi, stream: &str, after: Option<&str>) -> Vec<Value> {
    let mut body = json!({"StreamName": stream});
    if let Some(after) = after {
        body["ExclusiveStartShardId"] = json!(after);
    }
    let mut shards = Vec::new();
    loop {
        let page = kinesis.call("ListShards", body).await;
        shards.extend(page["Shards"].as_array().cloned().unwrap_or_default());
        let Some(token) = page["NextToken"].as_str() else {
            return shards;
        };
        body = json!({"NextToken": token});
    }
}

/// `StreamScalingUtils.getOpenShards`: the listed shards (after `after`) less the parents
/// of listed shards, in hash key order.
async fn open_shards(kinesis: &KinesisApi, stream: &str, after: Option<&str>) -> Vec<Info> {
    let listed = list(kinesis, stream, after).await;
    let parents: Vec<&Value> = (listed.iter())
        .flat_map(|s| [&s["ParentShardId"], &s["AdjacentParentShardId"]])
        .filter(|p| p.is_string())
        .collect();
    let mut open: Vec<Info> = (listed.iter())
        .filter(|s| !parents.contains(&&s["ShardId"]))
        .map(info)
        .collect();
    open.sort_by_key(|s| s.start);
    open
}

fn info(shard: &Value) -> Info {
    let key = |field: &str| -> u128 {
        let text = shard["HashKeyRange"][field].as_str().expect("a hash key");
        text.parse().expect("a decimal hash key")
    };
    let (start, end) = (key("StartingHashKey"), key("EndingHashKey"));
    Info {
        id: shard["ShardId"].as_str().expect("ShardId").to_owned(),
        start,
        // BigDecimal division at scale 10; f64 differs from it only on exact ties.
        pct: round10((end - start) as f64 / MAX_HASH as f64),
    }
}

fn round10(x: f64) -> f64 {
    (x * 1e10).round() / 1e10
}

/// `StreamScalingUtils.softCompare`: equal within 10^-9 at 10 decimals.
fn soft_compare(a: f64, b: f64) -> Ordering {
    let (a, b) = (round10(a), round10(b));
    if (a - b).abs() < 1e-9 {
        Ordering::Equal
    } else {
        a.total_cmp(&b)
    }
}

/// `maxHash × BigDecimal.valueOf(pct)`, truncated: the decimal Java prints for `pct`
/// (the shortest that reads back as `pct`, as Rust prints it) times maxHash, exactly.
fn fraction_of_max(pct: f64) -> u128 {
    assert!((0.0..1.0).contains(&pct), "a share of the keyspace: {pct}");
    let text = format!("{pct}");
    let digits = text.strip_prefix("0.").expect("a decimal below 1");
    let scale = 10u128.pow(digits.len() as u32);
    let d: u128 = digits.parse().expect("decimal digits");
    // maxHash × d ÷ 10^k without overflow: maxHash = q·10^k + r.
    let (q, r) = (MAX_HASH / scale, MAX_HASH % scale);
    let low = r.checked_mul(d).expect("at most 19 decimals");
    q * d + low / scale
}

/// The arithmetic against Python's `int(Decimal(2**128 - 1) * Decimal(repr(x)))`.
#[test]
fn shares_of_the_keyspace_are_cut_where_java_cuts_them() {
    assert_eq!(
        fraction_of_max(1.0 / 6.0),
        56713727820156408308679988432371612153
    );
    assert_eq!(fraction_of_max(0.5), MAX_HASH / 2);
}
