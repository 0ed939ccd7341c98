//! Shard ids are what Kinesis allows, and the printed `aws kinesis` commands are safe to run.

use reqwest::Method;
use serde_json::{Value, json};

use crate::helpers::{TestApp, assert_problem, spawn_app};

async fn put(app: &TestApp, name: &str, body: Value) -> crate::helpers::Answer {
    app.call(Method::PUT, &format!("/streams/{name}"), Some(body))
        .await
}

/// List-shards output of one open shard `id` over the whole keyspace, child of `parent`.
fn one_shard(id: &str, parent: Option<&str>) -> Value {
    json!({"Shards": [{
        "ShardId": id,
        "ParentShardId": parent,
        "HashKeyRange": {"StartingHashKey": "0", "EndingHashKey": u128::MAX.to_string()},
        "SequenceNumberRange": {"StartingSequenceNumber": "1"},
    }]})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shard_ids_must_be_what_kinesis_allows() {
    let app = spawn_app().await;
    let long = "s".repeat(129);
    for id in [
        "shardId-000000000000$(touch /tmp/x)",
        "shardId-000000000000 --profile prod",
        "",
        "shard\nId",
        "shardId-ü",
        long.as_str(),
    ] {
        assert_problem(&put(&app, "s", one_shard(id, None)).await, 422, "ShardId");
        let child = put(&app, "s", one_shard("shardId-000000000001", Some(id))).await;
        assert_problem(&child, 422, "ParentShardId");
    }
    let widest = format!("{}_.-", "aZ9".repeat(41));
    assert_eq!(widest.len(), 126);
    let ok = put(&app, "s", one_shard(&widest, Some("shardId-000000000000"))).await;
    assert_eq!(ok.status, 201, "{}", ok.body);
}

/// The words a POSIX shell makes of `command`, without running it.
fn shell_words(command: &str) -> Vec<String> {
    let out = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!("set -- {command}\nprintf '%s\\0' \"$@\""))
        .output()
        .unwrap();
    assert!(out.status.success(), "sh refused {command:?}: {out:?}");
    String::from_utf8(out.stdout)
        .unwrap()
        .split_terminator('\0')
        .map(str::to_owned)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn split_plan_commands_quote_every_argument() {
    let app = spawn_app().await;
    for account in ["a", "b", "c", "d"] {
        app.allocate(account).await;
    }
    // A map stored before shard ids were checked.
    let marker = app.dir().join("touched");
    let id = format!(
        "shardId-0'\"$(touch {m})`touch {m}`;touch {m}",
        m = marker.display()
    );
    let map = json!([[id, "0", u128::MAX.to_string()]]).to_string();
    app.db()
        .await
        .execute(
            "INSERT INTO streams (name, shards, next_shard, is_primary, updated_at) \
             VALUES ('old', $1, 1, FALSE, 0)",
            &[&map],
        )
        .await;
    // Registering another stream reloads them all.
    assert_eq!(
        put(&app, "new", json!({"shard_count": 1})).await.status,
        201
    );

    let plan = app.get("/streams/old/split-plan?target=2").await;
    assert_eq!(plan.status, 200, "{}", plan.body);
    let commands = plan.body["commands"].as_array().unwrap();
    assert!(!commands.is_empty());
    for command in commands {
        let words = shell_words(command.as_str().unwrap());
        assert_eq!(words[..2], ["aws", "kinesis"], "{command}");
        let arg = |flag: &str| option(&words, flag);
        assert_eq!(arg("--stream-name").as_deref(), Some("old"), "{command}");
        if words[2] == "split-shard" {
            assert_eq!(arg("--shard-to-split"), Some(id.clone()), "{command}");
        }
    }
    assert!(
        !marker.exists(),
        "a printed command ran a command of its own"
    );
}

/// The value of `flag` among `words`, given as one word `FLAG=VALUE`.
fn option(words: &[String], flag: &str) -> Option<String> {
    let prefix = format!("{flag}=");
    let mut values = words.iter().filter_map(|w| w.strip_prefix(&prefix));
    let value = values.next()?.to_owned();
    assert_eq!(values.next(), None, "{flag} given twice: {words:?}");
    Some(value)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn names_that_start_with_a_dash_stay_values_in_printed_commands() {
    let app = spawn_app().await;
    // Valid in Kinesis; `--stream-name -x` would make the AWS CLI read `-x` as an option.
    let two = json!({"Shards": [
        {"ShardId": "-a", "HashKeyRange": {"StartingHashKey": "0", "EndingHashKey": (u128::MAX / 2).to_string()},
         "SequenceNumberRange": {"StartingSequenceNumber": "1"}},
        {"ShardId": "-b", "HashKeyRange": {"StartingHashKey": (u128::MAX / 2 + 1).to_string(), "EndingHashKey": u128::MAX.to_string()},
         "SequenceNumberRange": {"StartingSequenceNumber": "2"}},
    ]});
    let created = put(&app, "-x", two).await;
    assert_eq!(created.status, 201, "{}", created.body);
    let mut seen = std::collections::BTreeSet::new();
    for target in [1, 4] {
        let plan = app
            .get(&format!("/streams/-x/split-plan?target={target}"))
            .await;
        assert_eq!(plan.status, 200, "{}", plan.body);
        for command in plan.body["commands"].as_array().unwrap() {
            let command = command.as_str().unwrap();
            let words = shell_words(command);
            assert_eq!(words[..2], ["aws", "kinesis"], "{command}");
            // Every option and its value are one word, so no value can pass for an option.
            let options: Vec<&String> = words.iter().filter(|w| w.starts_with('-')).collect();
            assert!(
                options
                    .iter()
                    .all(|w| w.starts_with("--") && w.contains('=')),
                "{command}"
            );
            assert_eq!(
                option(&words, "--stream-name").as_deref(),
                Some("-x"),
                "{command}"
            );
            match words[2].as_str() {
                "split-shard" => {
                    assert!(option(&words, "--shard-to-split").is_some(), "{command}");
                    assert!(
                        option(&words, "--new-starting-hash-key").is_some(),
                        "{command}"
                    );
                }
                "merge-shards" => {
                    assert_eq!(
                        option(&words, "--shard-to-merge").as_deref(),
                        Some("-a"),
                        "{command}"
                    );
                    assert_eq!(
                        option(&words, "--adjacent-shard-to-merge").as_deref(),
                        Some("-b"),
                        "{command}"
                    );
                }
                _ => assert_eq!(words[2..4], ["wait", "stream-exists"], "{command}"),
            }
            seen.insert(words[2].clone());
        }
    }
    assert_eq!(seen.len(), 3, "split, merge and wait printed: {seen:?}");
}
