//! A replica SIGKILLed mid-reshard, after each call in turn (made in Kinesis, its answer
//! never received), leaves the job to itself restarted or, once, to a second replica
//! running beside it: the
//! job always ends at the target, the open shards tile the keyspace, keyspread's map is
//! Kinesis', and no call is made twice or names a closed shard.

use serde_json::{Value, json};

use crate::helpers::fresh_database;
use crate::kinesalite::Kinesalite;
use crate::process::Server;
use crate::reshard_job::{check_calls, check_map, ended};
use crate::reshard_proxy::{Proxy, Rules};

const ACCOUNTS: usize = 60;
const TARGET: u32 = 5;
/// The call after which the replica is replaced by another instead of restarted.
const TAKEN_OVER_AFTER: usize = 2;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_killed_after_each_call_leaves_the_job_to_its_restart_or_another() {
    let kinesalite = Kinesalite::start().await;
    let proxy = Proxy::start(kinesalite.api.endpoint()).await;
    let dir = tempfile::tempdir().unwrap();
    let (url, _postgres) = fresh_database(dir.path()).await;
    let log = dir.path().join("log");
    let env = [
        ("KEYSPREAD_KINESIS_ENDPOINT", proxy.endpoint.as_str()),
        ("KEYSPREAD_KINESIS_REGION", "us-east-1"),
        // A dead replica's job waits this long before another takes it.
        ("KEYSPREAD_RESHARD_LEASE_S", "1"),
        ("AWS_EC2_METADATA_DISABLED", "true"),
    ];
    let client = reqwest::Client::new();
    let mut server = Server::spawn_with(&url, &log, &env);
    server.wait_ready(&client).await;
    for i in 0..ACCOUNTS {
        let made = client
            .post(format!("{}/keys/acct-{i:03}", server.url))
            .send()
            .await
            .unwrap();
        assert!(made.status().is_success(), "{made:?}");
    }

    let mut planned = usize::MAX;
    let mut killed_after = 1;
    while killed_after <= planned {
        let stream = format!("crash-{killed_after}");
        kinesalite.api.create_stream(&stream, 2).await;
        let put = client
            .put(format!("{}/streams/{stream}", server.url))
            .json(&json!({"watch": true}))
            .send()
            .await
            .unwrap();
        assert!(put.status().is_success(), "{put:?}");
        // Once, a second replica runs beside the first from before the job starts.
        let mut other = (killed_after == TAKEN_OVER_AFTER)
            .then(|| Server::spawn_with(&url, &dir.path().join("log-other"), &env));
        if let Some(other) = &mut other {
            other.wait_ready(&client).await;
        }
        proxy.set(Rules {
            hold: Some(killed_after),
            ..Rules::default()
        });
        let started = client
            .post(format!("{}/streams/{stream}/reshard", server.url))
            .json(&json!({"target": TARGET}))
            .send()
            .await
            .unwrap();
        assert_eq!(started.status(), 202);
        let job: Value = started.json().await.unwrap();
        planned = job["steps"].as_array().unwrap().len();

        // Killed at once: the call is made, its answer never received (and never retried).
        proxy.held().await;
        match other {
            Some(mut other) if drove(&other, &stream) => other.kill(),
            Some(other) => {
                assert!(drove(&server, &stream), "a replica made the held call");
                server.kill();
                server = other;
            }
            None => {
                server.kill();
                server = Server::spawn_with(&url, &log, &env);
                server.wait_ready(&client).await;
            }
        }
        proxy.release();

        let job = ended(&client, &server.url, &stream).await;
        let at = format!("killed after call {killed_after} of {planned}: {job}");
        assert_eq!(job["state"], "done", "{at}");
        let made = check_calls(&proxy.calls());
        assert_eq!(made, planned, "{at}");
        assert_eq!(job["done"], made, "{at}");
        assert_eq!(job["shard_count"], TARGET, "{at}");
        let open = check_map(&client, &server.url, &kinesalite.api, &stream).await;
        assert_eq!(open, TARGET as usize, "{at}");
        killed_after += 1;
    }
    assert!(planned > TAKEN_OVER_AFTER, "a plan of {planned} calls");
}

/// Whether `server` made a call of `stream`'s reshard.
fn drove(server: &Server, stream: &str) -> bool {
    let named = format!("stream={stream} ");
    (server.log_text().lines()).any(|l| l.contains("making a call") && l.contains(&named))
}
