//! Hot accounts refereed by kinesalite: every key of a fanned-out account lands where
//! shard-of says, and an account's K keys spread over min(K, S) of a primary stream's
//! S shards, ⌊K/S⌋ or ⌈K/S⌉ each, as Kinesis itself routes them.

use std::collections::{BTreeMap, HashSet};
use std::time::Instant;

use reqwest::Method;
use serde::Deserialize;
use serde_json::{Value, json};

use crate::helpers::{TestApp, answer, spawn_app};
use crate::kinesalite::{Kinesalite, KinesisApi, Shard, open_in_key_order};

/// A stream as CreateStream makes it, then SplitShard calls: (position of the open shard in
/// key order, numerator, denominator of where in its range the upper child starts).
struct Recipe {
    name: &'static str,
    created: u32,
    splits: &'static [(usize, u128, u128)],
}

/// 3 shards as created; 5 after two splits; 8 after three, one of them of a split's child.
const STREAMS: [Recipe; 3] = [
    Recipe {
        name: "hot-3",
        created: 3,
        splits: &[],
    },
    Recipe {
        name: "hot-5",
        created: 3,
        splits: &[(0, 1, 3), (3, 2, 3)],
    },
    Recipe {
        name: "hot-8",
        created: 5,
        splits: &[(0, 1, 2), (1, 1, 3), (5, 3, 4)],
    },
];

/// The sub-keys asked for every account; the first three have test vectors in DESIGN.md.
const SUB_KEYS: [&str; 8] = [
    "order-1", "user-42", "", "order-2", "user-7", "café 9", "a+b&c=d", "鍵-3",
];

/// `jump(MD5(s), K)` for K = 1, 2, 3, 4, 5, 8, 16, 100 (DESIGN.md, "Hot accounts").
const JUMP_VECTORS: [(&str, [usize; 8]); 3] = [
    ("order-1", [0, 0, 2, 3, 3, 3, 11, 44]),
    ("user-42", [0, 1, 2, 3, 3, 7, 7, 45]),
    ("", [0, 1, 1, 3, 3, 3, 11, 11]),
];
const JUMP_FANOUTS: [usize; 8] = [1, 2, 3, 4, 5, 8, 16, 100];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_key_of_a_hot_account_lands_where_shard_of_says_and_spreads_on_kinesalite() {
    // On Postgres in `make proofs`, at full length.
    if !crate::skip::proof_here(
        "every_key_of_a_hot_account_lands_where_shard_of_says_and_spreads_on_kinesalite",
    ) {
        return;
    }
    let kinesalite = Kinesalite::start().await;
    let kinesis = &kinesalite.api;
    let app = spawn_app().await;
    let mut taken: HashSet<String> = HashSet::new();

    for recipe in &STREAMS {
        let started = Instant::now();
        let (stream, open) = build_and_register(&app, kinesis, recipe).await;
        let s = open.len();
        let accounts = allocate_and_resize(&app, stream, s).await;

        let (mut records, mut sub_keys) = (0, 0);
        let mut spreads = Vec::new();
        for account in &accounts {
            for key in &account.hash_keys {
                assert!(
                    taken.insert(key.clone()),
                    "{}: key {key} is also another account's",
                    account.account
                );
            }
            let landed = check_every_key(&app, kinesis, stream, &open, account).await;
            records += landed.len();
            check_spread(stream, &open, account, &landed);
            sub_keys += check_sub_keys(&app, stream, account, &landed).await;
            spreads.push(format!(
                "K={}: {}",
                account.fanout,
                per_shard(&open, &landed)
            ));
        }
        println!(
            "fanout on kinesalite: {stream} ({s} open shards): {} accounts, {records} keys put, \
             each on shard-of's shard; {sub_keys} sub-key lookups consistent; keys per shard {} ({:.1?})",
            accounts.len(),
            spreads.join(", "),
            started.elapsed()
        );
    }
}

/// Creates the stream on kinesalite, registers it as primary, runs the splits and
/// registers ListShards' output again (closed shards included); answers the open shards.
async fn build_and_register<'r>(
    app: &TestApp,
    kinesis: &KinesisApi,
    recipe: &'r Recipe,
) -> (&'r str, Vec<Shard>) {
    let stream = recipe.name;
    kinesis.create_stream(stream, recipe.created).await;
    register(app, kinesis, stream, 201).await;
    if recipe.splits.is_empty() {
        return (
            stream,
            open_in_key_order(&kinesis.list_shards(stream).await),
        );
    }
    for &(position, num, den) in recipe.splits {
        let open = open_in_key_order(&kinesis.list_shards(stream).await);
        // Only open shards: kinesalite would split a closed one too (real Kinesis refuses).
        let shard = &open[position];
        let at = shard.start() + (shard.end() - shard.start()) / den * num;
        kinesis
            .split_shard(stream, &shard.shard_id, &at.to_string())
            .await;
    }
    let listed = kinesis.list_shards(stream).await;
    let open = open_in_key_order(&listed);
    assert_eq!(
        (open.len(), listed.len() - open.len()),
        (
            recipe.created as usize + recipe.splits.len(),
            recipe.splits.len()
        ),
        "{stream}: one more open shard and one closed parent per split: {listed:?}"
    );
    register(app, kinesis, stream, 200).await;
    (stream, open)
}

/// `PUT /streams/{stream}` with ListShards' JSON as kinesalite answers it, as primary.
async fn register(app: &TestApp, kinesis: &KinesisApi, stream: &str, status: u16) {
    let mut body = kinesis.list_shards_json(stream).await;
    body["primary"] = json!(true);
    let put = app
        .call(Method::PUT, &format!("/streams/{stream}"), Some(body))
        .await;
    assert_eq!(put.status, status, "PUT /streams/{stream}: {}", put.body);
    let open = open_in_key_order(&kinesis.list_shards(stream).await);
    let ids: Vec<&str> = open.iter().map(|s| s.shard_id.as_str()).collect();
    let registered: Vec<&str> = put.body["stream"]["shards"]
        .as_array()
        .unwrap_or_else(|| panic!("stream.shards: {}", put.body))
        .iter()
        .filter_map(|s| s["shard_id"].as_str())
        .collect();
    assert_eq!(registered, ids, "PUT /streams/{stream}: {}", put.body);
    assert_eq!(
        put.body["stream"]["primary"], true,
        "PUT /streams/{stream}: {}",
        put.body
    );
}

/// Assignment with its keys.
#[derive(Debug, Deserialize)]
struct Assignment {
    account: String,
    hash_key: String,
    hash_keys: Vec<String>,
    fanout: usize,
    weight: u64,
}

/// Accounts with fanouts 1, 2, S, 2S+1 and 16; one grown from 2 to 2S+2 and one shrunk
/// from 16 to S-1 with PATCH.
async fn allocate_and_resize(app: &TestApp, stream: &str, s: usize) -> Vec<Assignment> {
    let plain = app.post(&format!("/keys/{stream}-plain"), None).await;
    assert_eq!(
        plain.status, 201,
        "POST /keys/{stream}-plain: {}",
        plain.body
    );
    let mut accounts = vec![assignment(&format!("{stream}-plain"), plain.body, 1)];
    for (fanout, weight) in [
        (2, 2),
        (s, 3 * s as u64 + 1),
        (2 * s + 1, 2 * s as u64 + 1),
        (16, 40),
    ] {
        let name = format!("{stream}-k{fanout}");
        accounts.push(allocate(app, &name, fanout, weight).await);
    }
    let grown = allocate(app, &format!("{stream}-grown"), 2, 64).await;
    accounts.push(resize(app, grown, 2 * s + 2).await);
    let shrunk = allocate(app, &format!("{stream}-shrunk"), 16, 20).await;
    accounts.push(resize(app, shrunk, s - 1).await);
    accounts
}

/// `POST /keys/{name}` with `{"fanout", "weight"}`: 201 and `fanout` keys.
async fn allocate(app: &TestApp, name: &str, fanout: usize, weight: u64) -> Assignment {
    let body = json!({"fanout": fanout, "weight": weight});
    let answer = app.post(&format!("/keys/{name}"), Some(body.clone())).await;
    assert_eq!(
        answer.status, 201,
        "POST /keys/{name} {body}: {}",
        answer.body
    );
    let got = assignment(name, answer.body, fanout);
    assert_eq!(got.weight, weight, "POST /keys/{name} {body}: {got:?}");
    got
}

/// `PATCH /keys/{account}` with `{"fanout"}`: keys below both fanouts stay as they were.
async fn resize(app: &TestApp, before: Assignment, fanout: usize) -> Assignment {
    let name = before.account.clone();
    let body = json!({"fanout": fanout});
    let answer = app
        .call(Method::PATCH, &format!("/keys/{name}"), Some(body.clone()))
        .await;
    assert_eq!(
        answer.status, 200,
        "PATCH /keys/{name} {body}: {}",
        answer.body
    );
    let after = assignment(&name, answer.body, fanout);
    let kept = before.fanout.min(fanout);
    assert_eq!(
        after.hash_keys[..kept],
        before.hash_keys[..kept],
        "PATCH /keys/{name} {body} from fanout {}: keys 0..{kept} (left) changed",
        before.fanout
    );
    assert_eq!(after.weight, before.weight, "PATCH /keys/{name} {body}");
    let looked_up = app.get(&format!("/keys/{name}")).await;
    assert_eq!(
        looked_up.status, 200,
        "GET /keys/{name}: {}",
        looked_up.body
    );
    let looked_up = assignment(&name, looked_up.body, fanout);
    assert_eq!(
        looked_up.hash_keys, after.hash_keys,
        "GET /keys/{name} (left) after the PATCH"
    );
    after
}

/// Parses an Assignment and checks its shape: `fanout` keys, `hash_key` = `hash_keys[0]`.
fn assignment(name: &str, body: Value, fanout: usize) -> Assignment {
    let got: Assignment = serde_json::from_value(body.clone())
        .unwrap_or_else(|err| panic!("{name}: not an Assignment with keys ({err}): {body}"));
    assert_eq!(got.account, name, "{body}");
    assert_eq!(got.fanout, fanout, "{name}: {body}");
    assert_eq!(got.hash_keys.len(), fanout, "{name}: {body}");
    assert_eq!(got.hash_key, got.hash_keys[0], "{name}: {body}");
    let distinct: HashSet<&String> = got.hash_keys.iter().collect();
    assert_eq!(distinct.len(), fanout, "{name}: a key twice: {body}");
    got
}

/// shard-of for one key of an account.
#[derive(Debug, Deserialize, PartialEq)]
struct KeyShard {
    index: usize,
    hash_key: String,
    shard_index: usize,
    shard_id: String,
    starting_hash_key: String,
    ending_hash_key: String,
}

/// Puts a record under every key of `account` and compares kinesalite's ShardId with
/// `GET /shard-of?account=&index=&stream=`; answers the ShardId of each index.
async fn check_every_key(
    app: &TestApp,
    kinesis: &KinesisApi,
    stream: &str,
    open: &[Shard],
    account: &Assignment,
) -> Vec<String> {
    let name = &account.account;
    let mut landed = Vec::with_capacity(account.fanout);
    for (index, key) in account.hash_keys.iter().enumerate() {
        let partition_key = format!("{name}#{index}");
        let shard_id = kinesis.put_record(stream, &partition_key, Some(key)).await;
        let shard_index = open
            .iter()
            .position(|s| s.shard_id == shard_id)
            .unwrap_or_else(|| panic!("kinesalite put {key} on {shard_id}, not an open shard"));
        let shard = &open[shard_index];
        let expected = KeyShard {
            index,
            hash_key: key.clone(),
            shard_index,
            shard_id: shard_id.clone(),
            starting_hash_key: shard.range.starting_hash_key.clone(),
            ending_hash_key: shard.range.ending_hash_key.clone(),
        };
        let query = [
            ("account", name.clone()),
            ("index", index.to_string()),
            ("stream", stream.to_owned()),
        ];
        let got: KeyShard = shard_of(app, &query).await;
        assert_eq!(
            got, expected,
            "{stream}: shard-of {query:?} (left) disagrees with PutRecord of ExplicitHashKey {key} (right)"
        );
        landed.push(shard_id);
    }
    landed
}

/// The K keys lie, as kinesalite routed them, on min(K, S) shards, ⌊K/S⌋ or ⌈K/S⌉ each.
fn check_spread(stream: &str, open: &[Shard], account: &Assignment, landed: &[String]) {
    let (k, s) = (account.fanout, open.len());
    let counts = counts(open, landed);
    let distinct = counts.values().filter(|&&n| n > 0).count();
    let (low, high) = (k / s, k.div_ceil(s));
    assert!(
        distinct == k.min(s) && counts.values().all(|&n| n == low || n == high),
        "{stream}: {} with fanout {k} has keys per shard {counts:?} as kinesalite routed them \
         (keys {:?}); want {} distinct shards of {s}, {low} or {high} keys each",
        account.account,
        account.hash_keys,
        k.min(s)
    );
}

/// Keys per open shard (zeros included), by ShardId.
fn counts<'a>(open: &'a [Shard], landed: &[String]) -> BTreeMap<&'a str, usize> {
    open.iter()
        .map(|shard| {
            let n = landed.iter().filter(|id| **id == shard.shard_id).count();
            (shard.shard_id.as_str(), n)
        })
        .collect()
}

/// Keys per open shard in key order, for the report.
fn per_shard(open: &[Shard], landed: &[String]) -> String {
    let counts = counts(open, landed);
    let list: Vec<String> = open
        .iter()
        .map(|s| counts[s.shard_id.as_str()].to_string())
        .collect();
    format!("[{}]", list.join(" "))
}

/// `GET /shard-of?account=&sub_key=&stream=` answers an index in range, that index's key,
/// and the shard kinesalite put that key on; answers how many lookups it checked.
async fn check_sub_keys(
    app: &TestApp,
    stream: &str,
    account: &Assignment,
    landed: &[String],
) -> usize {
    let name = &account.account;
    for sub_key in SUB_KEYS {
        let query = [
            ("account", name.clone()),
            ("sub_key", sub_key.to_owned()),
            ("stream", stream.to_owned()),
        ];
        let got: KeyShard = shard_of(app, &query).await;
        let index = got.index;
        assert!(
            index < account.fanout,
            "{stream}: shard-of {query:?} answered index {index} of fanout {}: {got:?}",
            account.fanout
        );
        assert_eq!(
            (&got.hash_key, &got.shard_id),
            (&account.hash_keys[index], &landed[index]),
            "{stream}: shard-of {query:?} (left) vs key {index} and its ShardId on kinesalite (right)"
        );
        if let Some(want) = jump_vector(sub_key, account.fanout) {
            assert_eq!(
                index, want,
                "{stream}: shard-of {query:?}: index (left) vs jump's test vector (right)"
            );
        }
    }
    SUB_KEYS.len()
}

/// DESIGN.md's jump index for `sub_key` with fanout `k`, when it gives one.
fn jump_vector(sub_key: &str, k: usize) -> Option<usize> {
    let (_, indexes) = JUMP_VECTORS.iter().find(|(s, _)| *s == sub_key)?;
    let at = JUMP_FANOUTS.iter().position(|&f| f == k)?;
    Some(indexes[at])
}

/// `GET /shard-of` with `query` (URL-encoded): 200 and its body.
async fn shard_of<T: serde::de::DeserializeOwned>(app: &TestApp, query: &[(&str, String)]) -> T {
    let response = app
        .client
        .get(app.url("/shard-of"))
        .query(query)
        .send()
        .await
        .expect("request sent");
    let got = answer(response).await;
    assert_eq!(got.status, 200, "GET /shard-of {query:?}: {}", got.body);
    serde_json::from_value(got.body.clone())
        .unwrap_or_else(|err| panic!("GET /shard-of {query:?} ({err}): {}", got.body))
}
