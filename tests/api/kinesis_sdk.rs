//! keyspread's Kinesis client (the AWS SDK for Rust) against kinesalite: the shards it
//! lists are the map the registry takes, its splits and merges are Kinesis', and every
//! failure is told apart.

use std::time::{Duration, Instant};

use keyspread::keyspace::{HashKey, Keyspace};
use keyspread::kinesis::{Kinesis, KinesisConfig, KinesisError, StreamStatus};

use crate::kinesalite::Kinesalite;

/// A client for kinesalite, with a region and (the chain having none) dummy credentials.
pub(crate) async fn client(kinesalite: &Kinesalite) -> Kinesis {
    Kinesis::connect(&config(kinesalite.api.endpoint()))
        .await
        .expect("a client for kinesalite")
}

pub(crate) fn config(endpoint: &str) -> KinesisConfig {
    KinesisConfig {
        endpoint: Some(endpoint.to_owned()),
        region: Some("us-east-1".to_owned()),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sdk_lists_splits_and_merges_what_kinesis_has() {
    let kinesalite = Kinesalite::start().await;
    kinesalite.api.create_stream("orders", 3).await;
    let kinesis = client(&kinesalite).await;

    let listing = kinesis
        .list_shards("orders", Keyspace::KINESIS)
        .await
        .unwrap();
    assert_eq!(listing.map.map.len(), 3);
    assert_eq!(listing.map.next_shard, 3);
    assert_eq!(listing.shards.len(), 3);

    let middle = listing.map.map.shard(1);
    let cut = HashKey(middle.start.0 + (middle.end.0 - middle.start.0) / 2);
    kinesis
        .split_shard("orders", &middle.id, cut)
        .await
        .unwrap();
    kinesalite.api.wait_active("orders").await;
    let listing = kinesis
        .list_shards("orders", Keyspace::KINESIS)
        .await
        .unwrap();
    assert_eq!(listing.map.map.len(), 4, "the split's children are open");
    assert_eq!(listing.shards.len(), 5, "its closed parent is listed too");
    assert_eq!(listing.map.next_shard, 5);
    let closed: Vec<_> = listing.shards.iter().filter(|s| !s.is_open()).collect();
    assert_eq!(closed.len(), 1);
    assert_eq!(closed[0].shard_id, middle.id);
    let lease_shards = listing.map.lease_shards.as_ref().expect("listed shards");
    let children: Vec<_> = lease_shards
        .iter()
        .filter(|s| s.parents == [middle.id.clone()])
        .collect();
    assert_eq!(children.len(), 2, "{lease_shards:?}");
    assert_eq!(listing.map.map.shard(2).start, cut);

    let (lower, upper) = (listing.map.map.shard(0), listing.map.map.shard(1));
    kinesis
        .merge_shards("orders", &lower.id, &upper.id)
        .await
        .unwrap();
    kinesalite.api.wait_active("orders").await;
    let listing = kinesis
        .list_shards("orders", Keyspace::KINESIS)
        .await
        .unwrap();
    assert_eq!(listing.map.map.len(), 3);
    assert_eq!(listing.shards.len(), 6);

    let summary = kinesis.summary("orders").await.unwrap();
    assert_eq!(summary.status, StreamStatus::Active);
    assert_eq!(summary.open_shards, 3);
    assert!(!summary.on_demand);
    assert!(summary.arn.ends_with(":stream/orders"), "{}", summary.arn);
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    assert!(
        (now_ms - 600_000..=now_ms).contains(&summary.created_at_ms),
        "{summary:?}"
    );

    assert_eq!(
        kinesis.shard_limit().await.unwrap(),
        None,
        "kinesalite has no DescribeLimits"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_stream_and_a_stopped_endpoint_are_told_apart() {
    let kinesalite = Kinesalite::start().await;
    let kinesis = client(&kinesalite).await;
    let missing = kinesis.list_shards("nowhere", Keyspace::KINESIS).await;
    assert!(
        matches!(missing, Err(KinesisError::NotFound(ref m)) if m.contains("nowhere")),
        "{missing:?}"
    );
    let missing = kinesis.summary("nowhere").await;
    assert!(
        matches!(missing, Err(KinesisError::NotFound(_))),
        "{missing:?}"
    );

    // A port nothing listens on any more.
    let port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    };
    let stopped = Kinesis::connect(&config(&format!("http://127.0.0.1:{port}")))
        .await
        .unwrap();
    let started = Instant::now();
    let err = stopped.list_shards("orders", Keyspace::KINESIS).await;
    assert!(matches!(err, Err(KinesisError::Unreachable(_))), "{err:?}");
    assert!(
        started.elapsed() < Duration::from_secs(9),
        "bounded by the operation timeout"
    );
}

#[tokio::test]
async fn without_a_region_the_client_says_which_is_missing() {
    if [
        "AWS_REGION",
        "AWS_DEFAULT_REGION",
        "AWS_PROFILE",
        "AWS_CONFIG_FILE",
    ]
    .iter()
    .any(|v| std::env::var_os(v).is_some())
    {
        crate::skip::skipped(
            "kinesis_sdk::without_a_region_the_client_says_which_is_missing",
            "the environment names an AWS region or profile",
        );
        return;
    }
    let err = Kinesis::connect(&KinesisConfig {
        endpoint: Some("http://127.0.0.1:9".into()),
        region: None,
    })
    .await
    .unwrap_err();
    assert_eq!(err, KinesisError::MissingRegion);
    assert!(err.to_string().contains("AWS_REGION"), "{err}");
}
