//! Resharded streams, refereed by kinesalite: real SplitShard / MergeShards results fed to
//! `PUT /streams/{name}` must route as Kinesis routes, and split plans must come true.

use std::collections::{BTreeMap, HashSet};
use std::time::Instant;

use reqwest::Method;
use serde::Deserialize;
use serde_json::{Value, json};

use crate::helpers::{Answer, TestApp, assert_problem, spawn_app};
use crate::kinesalite::{Kinesalite, KinesisApi, Shard, open_in_key_order};

const ACCOUNTS: usize = 40;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shard_of_matches_put_record_after_splits_and_merges() {
    let kinesalite = Kinesalite::start().await;
    let kinesis = &kinesalite.api;
    let app = spawn_app().await;
    let accounts = allocate(&app, |_| 1).await;

    let started = Instant::now();
    let stream = "resharded";
    kinesis.create_stream(stream, 3).await;
    reshape(kinesis, stream, &accounts).await;
    let listed = kinesis.list_shards(stream).await;
    let open = open_in_key_order(&listed);
    let put = put_stream(&app, stream, kinesis.list_shards_json(stream).await).await;
    assert_eq!(put.status, 201, "first PUT /streams/{stream}: {}", put.body);
    check_put_answer(&put.body, stream, &open, false);
    println!(
        "reshard: {} shards listed ({} open) after 4 splits and a merge, PUT as-is: 201 with the open map ({:.1?})",
        listed.len(),
        open.len(),
        started.elapsed()
    );

    let started = Instant::now();
    let edges: Vec<&String> = open.iter().flat_map(Shard::edges).collect();
    for key in accounts.iter().map(|a| &a.key).chain(edges.iter().copied()) {
        check_shard_of(&app, kinesis, stream, &open, key).await;
    }
    for account in &accounts {
        let by_account = shard_of(&app, &format!("account={}&stream={stream}", account.name)).await;
        let by_key = shard_of(&app, &format!("hash_key={}&stream={stream}", account.key)).await;
        assert_eq!(
            by_account, by_key,
            "shard-of by account and by its key differ"
        );
    }
    println!(
        "reshard: shard-of = PutRecord's ShardId for {} allocated keys and {} range edges; by account too ({:.1?})",
        accounts.len(),
        edges.len(),
        started.elapsed()
    );

    let again = put_stream(&app, stream, kinesis.list_shards_json(stream).await).await;
    assert_eq!(
        again.status, 200,
        "second PUT /streams/{stream}: {}",
        again.body
    );
    check_put_answer(&again.body, stream, &open, true);
    println!("reshard: the same map PUT again: 200 with `before`");

    check_broken_maps_are_refused(&app, kinesis, stream, &open).await;
    check_uniform_shard_count(&app, kinesis).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn split_plans_come_true_on_kinesalite() {
    let kinesalite = Kinesalite::start().await;
    let kinesis = &kinesalite.api;
    let app = spawn_app().await;
    let accounts = allocate(&app, |i| 1 + (i * 7 % 5) as u64).await;
    let heaviest = accounts.iter().map(|a| a.weight).max().unwrap();

    let stream = "planned";
    kinesis.create_stream(stream, 3).await;
    let mut body = kinesis.list_shards_json(stream).await;
    body["primary"] = json!(true);
    let put = put_stream(&app, stream, body).await;
    assert_eq!(put.status, 201, "PUT /streams/{stream}: {}", put.body);
    assert_eq!(put.body["stream"]["primary"], true, "{}", put.body);

    let (mut current, mut splits, mut merges) = (3, 0, 0);
    for target in [5, 2, 7] {
        let started = Instant::now();
        let answer = app
            .get(&format!("/streams/{stream}/split-plan?target={target}"))
            .await;
        assert_eq!(
            answer.status, 200,
            "split-plan target={target}: {}",
            answer.body
        );
        let plan: SplitPlan = serde_json::from_value(answer.body.clone())
            .unwrap_or_else(|err| panic!("split-plan answer ({err}): {}", answer.body));
        assert_eq!((plan.stream.as_str(), plan.target), (stream, target));
        assert_eq!(plan.shards.len(), target as usize, "{}", answer.body);
        check_heaviest(&plan.heaviest_account, heaviest, &accounts);
        check_commands(&plan, stream);

        for op in &plan.operations {
            execute(kinesis, stream, op).await;
        }
        let open = open_in_key_order(&kinesis.list_shards(stream).await);
        let planned: Vec<_> = plan.shards.iter().map(PlannedShard::range).collect();
        let got: Vec<_> = open.iter().map(range_of).collect();
        assert_eq!(
            got, planned,
            "target {target}: open shards (left) differ from the plan"
        );

        // Where Kinesis puts every account's key, by explicit key and by MD5 of the name.
        let mut by_key: BTreeMap<String, (u64, u64)> = BTreeMap::new();
        let mut by_md5: BTreeMap<String, (u64, u64)> = BTreeMap::new();
        let mut landed = Vec::new();
        for account in &accounts {
            let shard = kinesis.put_record(stream, "x", Some(&account.key)).await;
            landed.push(shard.clone());
            let entry = by_key.entry(shard).or_default();
            *entry = (entry.0 + 1, entry.1 + account.weight);
            let shard = kinesis.put_record(stream, &account.name, None).await;
            let entry = by_md5.entry(shard).or_default();
            *entry = (entry.0 + 1, entry.1 + account.weight);
        }
        let load =
            |map: &BTreeMap<String, (u64, u64)>, id: &str| map.get(id).copied().unwrap_or((0, 0));
        for shard in &plan.shards {
            assert_eq!(
                load(&by_key, &shard.shard_id),
                (shard.accounts, shard.weight),
                "target {target}: PutRecord put (accounts, weight) (left) on {} but the plan promised (right)",
                shard.shard_id
            );
        }
        let counts: Vec<u64> = plan.shards.iter().map(|s| s.accounts).collect();
        let weights: Vec<u64> = plan.shards.iter().map(|s| s.weight).collect();
        println!(
            "split plan: {current}->{target} shards: {} splits and {} merges ran on kinesalite with the promised shard ids; \
             open shards = plan; accounts per shard {counts:?}, weight {weights:?} (heaviest account {}, spread {}) ({:.1?})",
            count(&plan, "split"),
            count(&plan, "merge"),
            plan.heaviest_account,
            plan.spread,
            started.elapsed()
        );

        let started = Instant::now();
        let put = put_stream(&app, stream, kinesis.list_shards_json(stream).await).await;
        assert_eq!(
            put.status, 200,
            "PUT /streams/{stream} after the plan: {}",
            put.body
        );
        check_put_answer(&put.body, stream, &open, true);
        for shard in &plan.shards {
            let after = find(&put.body["after"], &shard.shard_id);
            assert_eq!(
                (after["accounts"].as_u64(), after["weight"].as_u64()),
                (Some(shard.accounts), Some(shard.weight)),
                "PUT answer's `after` for {}: {after}",
                shard.shard_id
            );
        }
        check_distribution(&app, stream, &plan, &by_key, &by_md5).await;
        for (account, landed) in accounts.iter().zip(&landed) {
            let got = shard_of(&app, &format!("account={}&stream={stream}", account.name)).await;
            assert_eq!(
                got["shard_id"],
                landed.as_str(),
                "shard-of {}: {got}",
                account.name
            );
        }
        println!(
            "split plan: new list-shards PUT (200); `after`, /distribution?stream= and shard-of?account= match the plan and PutRecord ({:.1?})",
            started.elapsed()
        );
        (current, splits, merges) = (
            target,
            splits + count(&plan, "split"),
            merges + count(&plan, "merge"),
        );
    }
    assert!(
        splits > 0 && merges > 0,
        "the plans ran {splits} splits and {merges} merges"
    );
    let replan = app
        .get(&format!("/streams/{stream}/split-plan?target=7"))
        .await;
    println!(
        "split plan: asking again for 7 right after reaching 7 plans {} operations",
        replan.body["operations"].as_array().map_or(0, Vec::len)
    );
}

/// One allocated account.
struct Account {
    name: String,
    key: String,
    weight: u64,
}

/// Allocates `ACCOUNTS` accounts, account `i` weighing `weight(i)`.
async fn allocate(app: &TestApp, weight: impl Fn(usize) -> u64) -> Vec<Account> {
    let mut accounts = Vec::new();
    for i in 0..ACCOUNTS {
        let name = format!("account-{i:02}");
        let weight = weight(i);
        let answer = app
            .post(&format!("/keys/{name}"), Some(json!({"weight": weight})))
            .await;
        assert_eq!(answer.status, 201, "allocate {name}: {}", answer.body);
        let key = answer.body["hash_key"]
            .as_str()
            .expect("hash_key")
            .to_owned();
        accounts.push(Account { name, key, weight });
    }
    accounts
}

/// Uneven splits and a merge of a 3-shard stream; one boundary lands on an allocated key
/// and another just after one, so allocated keys are range edges too.
async fn reshape(kinesis: &KinesisApi, stream: &str, accounts: &[Account]) {
    let shards = open_in_key_order(&kinesis.list_shards(stream).await);
    let [first, middle, last] = [0, 1, 2].map(|i| shards[i].clone());
    let at = |shard: &Shard, num: u128, den: u128| {
        (shard.start() + (shard.end() - shard.start()) / den * num).to_string()
    };
    let [_, upper] = split(kinesis, stream, &first.shard_id, &at(&first, 1, 5)).await;
    let [lower, _] = split(kinesis, stream, &last.shard_id, &at(&last, 7, 9)).await;
    let merged = merge(kinesis, stream, &middle.shard_id, &lower).await;
    let listed = kinesis.list_shards(stream).await;
    let key = key_inside(accounts, open_shard(&listed, &merged), 0);
    split(kinesis, stream, &merged, &key.to_string()).await;
    let key = key_inside(accounts, open_shard(&listed, &upper), 1);
    split(kinesis, stream, &upper, &(key + 1).to_string()).await;
}

/// The lowest allocated key `k` with `k + shift` a valid NewStartingHashKey for `shard`.
fn key_inside(accounts: &[Account], shard: &Shard, shift: u128) -> u128 {
    accounts
        .iter()
        .map(|a| a.key.parse::<u128>().unwrap())
        .filter(|k| shard.start() + 1 < k + shift && k + shift < shard.end())
        .min()
        .unwrap_or_else(|| panic!("no allocated key inside {shard:?}"))
}

/// SplitShard on an open shard; answers the new shards' ids, lower range first.
async fn split(kinesis: &KinesisApi, stream: &str, shard: &str, at: &str) -> [String; 2] {
    let before = kinesis.list_shards(stream).await;
    // kinesalite would split a closed shard too (real Kinesis refuses).
    open_shard(&before, shard);
    kinesis.split_shard(stream, shard, at).await;
    let new = new_shards(&before, &kinesis.list_shards(stream).await);
    let ids: Vec<String> = new.iter().map(|s| s.shard_id.clone()).collect();
    assert_eq!(new.len(), 2, "SplitShard {shard} at {at} made {new:?}");
    assert_eq!(new[1].range.starting_hash_key, at, "{new:?}");
    [ids[0].clone(), ids[1].clone()]
}

/// MergeShards of two open shards, `shard` the lower; answers the merged shard's id.
async fn merge(kinesis: &KinesisApi, stream: &str, shard: &str, adjacent: &str) -> String {
    let before = kinesis.list_shards(stream).await;
    // kinesalite would merge closed shards too (real Kinesis refuses).
    open_shard(&before, shard);
    open_shard(&before, adjacent);
    kinesis.merge_shards(stream, shard, adjacent).await;
    let new = new_shards(&before, &kinesis.list_shards(stream).await);
    assert_eq!(new.len(), 1, "MergeShards {shard} {adjacent} made {new:?}");
    new[0].shard_id.clone()
}

/// Shards in `after` but not in `before`, in key order.
fn new_shards(before: &[Shard], after: &[Shard]) -> Vec<Shard> {
    let old: HashSet<&str> = before.iter().map(|s| s.shard_id.as_str()).collect();
    let mut new: Vec<Shard> = after
        .iter()
        .filter(|s| !old.contains(s.shard_id.as_str()))
        .cloned()
        .collect();
    new.sort_by_key(Shard::start);
    new
}

/// The shard `id` of `listed`, which must be open.
fn open_shard<'a>(listed: &'a [Shard], id: &str) -> &'a Shard {
    let shard = listed
        .iter()
        .find(|s| s.shard_id == id)
        .unwrap_or_else(|| panic!("no shard {id} in {listed:?}"));
    assert!(shard.is_open(), "{id} is closed: {shard:?}");
    shard
}

/// `(shard_id, starting_hash_key, ending_hash_key)`.
fn range_of(shard: &Shard) -> (String, String, String) {
    let range = &shard.range;
    (
        shard.shard_id.clone(),
        range.starting_hash_key.clone(),
        range.ending_hash_key.clone(),
    )
}

async fn put_stream(app: &TestApp, name: &str, body: Value) -> Answer {
    app.call(Method::PUT, &format!("/streams/{name}"), Some(body))
        .await
}

/// The PUT answer describes the registered map; `before` is null only for a new stream.
fn check_put_answer(body: &Value, stream: &str, open: &[Shard], replaced: bool) {
    assert_eq!(body["stream"]["name"], stream, "{body}");
    let shards: Vec<(String, String, String)> = body["stream"]["shards"]
        .as_array()
        .unwrap_or_else(|| panic!("stream.shards: {body}"))
        .iter()
        .map(|s| {
            let text = |field: &str| {
                s[field]
                    .as_str()
                    .unwrap_or_else(|| panic!("{field}: {s}"))
                    .to_owned()
            };
            (
                text("shard_id"),
                text("starting_hash_key"),
                text("ending_hash_key"),
            )
        })
        .collect();
    let listed: Vec<_> = open.iter().map(range_of).collect();
    assert_eq!(
        shards, listed,
        "stream.shards (left) are not the open shards listed (right)"
    );
    assert_eq!(
        body["before"].is_array(),
        replaced,
        "before: {}",
        body["before"]
    );
    if !replaced {
        assert!(body["before"].is_null(), "before: {}", body["before"]);
    }
    let after = body["after"]
        .as_array()
        .unwrap_or_else(|| panic!("after: {body}"));
    let ids: Vec<&str> = after
        .iter()
        .filter_map(|s| s["shard_id"].as_str())
        .collect();
    let open_ids: Vec<&str> = open.iter().map(|s| s.shard_id.as_str()).collect();
    assert_eq!(ids, open_ids, "after: {}", body["after"]);
    assert!(
        body["rebalance"]["moves"].is_array(),
        "rebalance: {}",
        body["rebalance"]
    );
}

/// The entry of a per-shard array for `id`.
fn find<'a>(shards: &'a Value, id: &str) -> &'a Value {
    shards
        .as_array()
        .and_then(|shards| shards.iter().find(|s| s["shard_id"] == id))
        .unwrap_or_else(|| panic!("no {id} in {shards}"))
}

async fn shard_of(app: &TestApp, query: &str) -> Value {
    let answer = app.get(&format!("/shard-of?{query}")).await;
    assert_eq!(answer.status, 200, "GET /shard-of?{query}: {}", answer.body);
    answer.body
}

/// PutRecord with ExplicitHashKey `key` and `GET /shard-of?hash_key=` name the same shard.
async fn check_shard_of(
    app: &TestApp,
    kinesis: &KinesisApi,
    stream: &str,
    open: &[Shard],
    key: &str,
) {
    let id = kinesis.put_record(stream, "x", Some(key)).await;
    let index = open
        .iter()
        .position(|s| s.shard_id == id)
        .expect("an open shard");
    let shard = &open[index];
    let expected = json!({
        "hash_key": key,
        "shard_index": index,
        "shard_id": id,
        "starting_hash_key": shard.range.starting_hash_key,
        "ending_hash_key": shard.range.ending_hash_key,
    });
    let got = shard_of(app, &format!("hash_key={key}&stream={stream}")).await;
    assert_eq!(
        got, expected,
        "stream {stream}: keyspread (left) disagrees with PutRecord for {key}"
    );
}

/// A gap and an overlap among the open shards: 422 naming the range, and the map stays.
async fn check_broken_maps_are_refused(
    app: &TestApp,
    kinesis: &KinesisApi,
    stream: &str,
    open: &[Shard],
) {
    let good = kinesis.list_shards_json(stream).await;
    let edit = |id: &str, field: &str, value: u128| {
        let mut broken = good.clone();
        let shard = broken["Shards"]
            .as_array_mut()
            .unwrap()
            .iter_mut()
            .find(|s| s["ShardId"] == id)
            .unwrap();
        shard["HashKeyRange"][field] = json!(value.to_string());
        broken
    };
    let (short, late) = (&open[1], &open[3]);
    let cases = [
        (
            "gap",
            edit(&short.shard_id, "EndingHashKey", short.end() - 1000),
            short.end() - 999,
            short.end(),
        ),
        (
            "overlap",
            edit(&late.shard_id, "StartingHashKey", late.start() - 500),
            late.start() - 500,
            late.start() - 1,
        ),
    ];
    for (what, body, lo, hi) in cases {
        let answer = put_stream(app, stream, body).await;
        assert_problem(&answer, 422, &lo.to_string());
        let detail = answer.body["detail"].as_str().unwrap();
        assert!(
            detail.contains(&hi.to_string()),
            "{what}: detail {detail:?} lacks {hi}"
        );
        println!(
            "reshard: PUT with an {what} [{lo}, {hi}]: {} {}: {detail}",
            answer.status, answer.content_type
        );
    }
    let still = shard_of(
        app,
        &format!("hash_key={}&stream={stream}", short.end() - 999),
    )
    .await;
    assert_eq!(
        still["shard_id"],
        short.shard_id.as_str(),
        "a refused PUT changed the map: {still}"
    );
    println!("reshard: refused PUTs left the registered map as it was");
}

/// `{"shard_count": 5}` registers the map CreateStream makes.
async fn check_uniform_shard_count(app: &TestApp, kinesis: &KinesisApi) {
    let stream = "uniform-5";
    let open = open_in_key_order(&kinesis.create_stream(stream, 5).await);
    let put = put_stream(app, stream, json!({"shard_count": 5})).await;
    assert_eq!(put.status, 201, "PUT /streams/{stream}: {}", put.body);
    check_put_answer(&put.body, stream, &open, false);
    let edges: Vec<&String> = open.iter().flat_map(Shard::edges).collect();
    for key in &edges {
        check_shard_of(app, kinesis, stream, &open, key).await;
    }
    println!(
        "reshard: PUT {{\"shard_count\": 5}} = kinesalite's CreateStream map; {} edges agree",
        edges.len()
    );
}

/// `GET /streams/{name}/split-plan` answer.
#[derive(Debug, Deserialize)]
struct SplitPlan {
    stream: String,
    target: u64,
    operations: Vec<Operation>,
    commands: Vec<String>,
    shards: Vec<PlannedShard>,
    heaviest_account: Value,
    spread: Value,
}

#[derive(Debug, Deserialize)]
#[serde(tag = "action", rename_all = "lowercase")]
enum Operation {
    Split {
        shard_to_split: String,
        new_starting_hash_key: String,
        resulting_shards: Vec<String>,
    },
    Merge {
        shard_to_merge: String,
        adjacent_shard_to_merge: String,
        resulting_shards: Vec<String>,
    },
}

#[derive(Debug, Deserialize)]
struct PlannedShard {
    shard_id: String,
    starting_hash_key: String,
    ending_hash_key: String,
    accounts: u64,
    weight: u64,
}

impl PlannedShard {
    fn range(&self) -> (String, String, String) {
        (
            self.shard_id.clone(),
            self.starting_hash_key.clone(),
            self.ending_hash_key.clone(),
        )
    }
}

/// How many of the plan's operations are `action`s.
fn count(plan: &SplitPlan, action: &str) -> usize {
    plan.operations
        .iter()
        .filter(|op| {
            matches!(
                (op, action),
                (Operation::Split { .. }, "split") | (Operation::Merge { .. }, "merge")
            )
        })
        .count()
}

/// Runs one planned call on kinesalite; the new shards must get the promised ids.
async fn execute(kinesis: &KinesisApi, stream: &str, op: &Operation) {
    match op {
        Operation::Split {
            shard_to_split,
            new_starting_hash_key,
            resulting_shards,
        } => {
            let got = split(kinesis, stream, shard_to_split, new_starting_hash_key).await;
            assert_eq!(
                &got[..],
                &resulting_shards[..],
                "kinesalite's ids (left) for {op:?}"
            );
        }
        Operation::Merge {
            shard_to_merge,
            adjacent_shard_to_merge,
            resulting_shards,
        } => {
            let got = merge(kinesis, stream, shard_to_merge, adjacent_shard_to_merge).await;
            assert_eq!(
                &[got][..],
                &resulting_shards[..],
                "kinesalite's id (left) for {op:?}"
            );
        }
    }
}

/// One `aws kinesis` command per operation, in the same order, with the same arguments.
fn check_commands(plan: &SplitPlan, stream: &str) {
    let calls: Vec<&String> = plan
        .commands
        .iter()
        .filter(|c| c.contains("split-shard") || c.contains("merge-shards"))
        .collect();
    assert_eq!(
        calls.len(),
        plan.operations.len(),
        "commands: {:?}",
        plan.commands
    );
    for (op, command) in plan.operations.iter().zip(calls) {
        let needles: Vec<&str> = match op {
            Operation::Split {
                shard_to_split,
                new_starting_hash_key,
                ..
            } => vec![
                "split-shard",
                "--shard-to-split",
                shard_to_split,
                "--new-starting-hash-key",
                new_starting_hash_key,
            ],
            Operation::Merge {
                shard_to_merge,
                adjacent_shard_to_merge,
                ..
            } => vec![
                "merge-shards",
                "--shard-to-merge",
                shard_to_merge,
                "--adjacent-shard-to-merge",
                adjacent_shard_to_merge,
            ],
        };
        let stream_arg = format!("--stream-name={stream}");
        assert!(command.starts_with("aws kinesis "), "{command}");
        for needle in needles.into_iter().chain([stream_arg.as_str()]) {
            assert!(
                command.contains(needle),
                "command {command:?} lacks {needle:?} for {op:?}"
            );
        }
    }
}

/// `heaviest_account` names the heaviest weight (as a number, an account or `{"weight"}`).
fn check_heaviest(value: &Value, heaviest: u64, accounts: &[Account]) {
    let weight = match value {
        Value::Number(n) => n.as_u64(),
        Value::String(name) => accounts.iter().find(|a| &a.name == name).map(|a| a.weight),
        Value::Object(o) => o.get("weight").and_then(Value::as_u64),
        _ => None,
    };
    assert_eq!(weight, Some(heaviest), "heaviest_account: {value}");
}

/// `/distribution?stream=` per shard equals the plan, and its MD5 columns equal PutRecord by name.
async fn check_distribution(
    app: &TestApp,
    stream: &str,
    plan: &SplitPlan,
    by_key: &BTreeMap<String, (u64, u64)>,
    by_md5: &BTreeMap<String, (u64, u64)>,
) {
    let answer = app.get(&format!("/distribution?stream={stream}")).await;
    assert_eq!(
        answer.status, 200,
        "/distribution?stream={stream}: {}",
        answer.body
    );
    let d = &answer.body;
    let shards = d["shards"].as_array().unwrap_or_else(|| panic!("{d}"));
    assert_eq!(shards.len(), plan.shards.len(), "{d}");
    let load =
        |map: &BTreeMap<String, (u64, u64)>, id: &str| map.get(id).copied().unwrap_or((0, 0));
    for (index, (got, want)) in shards.iter().zip(&plan.shards).enumerate() {
        let (md5_accounts, md5_weight) = load(by_md5, &want.shard_id);
        let expected = json!({
            "shard_index": index,
            "shard_id": want.shard_id,
            "starting_hash_key": want.starting_hash_key,
            "ending_hash_key": want.ending_hash_key,
            "accounts": want.accounts,
            "weight": want.weight,
            "md5_accounts": md5_accounts,
            "md5_weight": md5_weight,
        });
        let fields = expected.as_object().unwrap();
        let picked: serde_json::Map<String, Value> =
            fields.keys().map(|k| (k.clone(), got[k].clone())).collect();
        assert_eq!(
            Value::Object(picked),
            expected,
            "/distribution (left) vs plan and PutRecord (right)"
        );
    }
    for (field, map) in [("skew", by_key), ("md5_skew", by_md5)] {
        let counts: Vec<u64> = plan
            .shards
            .iter()
            .map(|s| load(map, &s.shard_id).0)
            .collect();
        let skew = &d[field];
        assert_eq!(
            (
                skew["shards"].as_u64(),
                skew["accounts"].as_u64(),
                skew["max"].as_u64(),
                skew["min"].as_u64()
            ),
            (
                Some(counts.len() as u64),
                Some(ACCOUNTS as u64),
                counts.iter().max().copied(),
                counts.iter().min().copied()
            ),
            "{field}: {skew}"
        );
    }
}
