//! Consumer leases through replicas that disagree with the database: one whose copy of the
//! stream's map is behind, one whose clock is ahead. A lease decision is made over the map
//! and by the clock the database holds, whichever replica makes it.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::time::{Duration, Instant};

use reqwest::Method;
use serde_json::{Value, json};

use crate::helpers::fresh_database;
use crate::leases::leases_of;
use crate::process::Server;
use crate::replicas::Api;

/// Starts one replica per entry of `envs` on `database_url`, each with that environment
/// added (every one assigns leases at each join).
async fn replicas(database_url: &str, dir: &Path, envs: &[&[(&str, &str)]]) -> (Vec<Server>, Api) {
    let envs: Vec<Vec<(&str, &str)>> = (envs.iter())
        .map(|env| [*env, &[("KEYSPREAD_LEASE_JOIN_BATCH_MS", "0")]].concat())
        .collect();
    let envs: Vec<&[(&str, &str)]> = envs.iter().map(Vec::as_slice).collect();
    crate::replicas::start_with(database_url, dir, &envs).await
}

async fn heartbeat(api: &Api, replica: usize, worker: &str, ttl_s: u64) -> (u16, Value) {
    api.call(
        replica,
        Method::PUT,
        &format!("/streams/s/workers/{worker}"),
        Some(json!({"ttl_s": ttl_s})),
    )
    .await
}

/// Waits until `replica` answers `shard_count` shards for stream `s`.
async fn until_map(api: &Api, replica: usize, shard_count: u64) {
    let started = Instant::now();
    loop {
        let (status, body) = api.get(replica, "/streams/s").await;
        if status == 200 && body["shard_count"] == shard_count {
            return;
        }
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "replica {replica} never showed {shard_count} shards: {body}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A replica that has not read the newest map yet (held back here with SIGSTOP while the
/// map changes and the leases are assigned over it) takes a leave and a checkpoint: both
/// are decided over the map the leases were assigned for, so no lease row of the new map
/// is deleted, no checkpoint lost, no epoch goes back.
#[tokio::test]
async fn a_replica_behind_on_the_map_decides_leaves_and_checkpoints_over_the_newest() {
    let dir = tempfile::tempdir().unwrap();
    let (url, _postgres) = fresh_database(dir.path()).await;
    let (servers, api) = replicas(&url, dir.path(), &[&[], &[]]).await;
    let (status, body) = api
        .call(
            0,
            Method::PUT,
            "/streams/s",
            Some(json!({"shard_count": 2})),
        )
        .await;
    assert_eq!(status, 201, "{body}");
    until_map(&api, 1, 2).await;
    // Both join, and the reader's hand-over of one shard to the leaver completes.
    for worker in ["reader", "leaver", "reader", "reader", "leaver"] {
        let (status, body) = heartbeat(&api, 0, worker, 60).await;
        assert_eq!(status, 200, "{body}");
    }

    // Replica 1 stops before the map grows: it still knows 2 shards when it resumes.
    servers[1].signal("STOP");
    let (status, body) = api
        .call(
            0,
            Method::PUT,
            "/streams/s",
            Some(json!({"shard_count": 4})),
        )
        .await;
    let resumed = Resume(&servers[1]);
    assert_eq!(status, 200, "{body}");
    // Replica 0 assigns the leases over the new map: the new shards go to whoever has
    // fewest, at once (nobody read them before).
    let (_, reader) = heartbeat(&api, 0, "reader", 60).await;
    let (_, leaver) = heartbeat(&api, 0, "leaver", 60).await;
    let told: BTreeMap<String, (String, u64)> = leases_of(&reader);
    let new_shards = ["shardId-000000000002", "shardId-000000000003"];
    let (ours, theirs): (Vec<&str>, Vec<&str>) = new_shards
        .iter()
        .partition(|s| told.get(**s).is_some_and(|(state, _)| state == "held"));
    assert_eq!(
        (ours.len(), theirs.len()),
        (1, 1),
        "one new shard each: reader {reader}, leaver {leaver}"
    );
    let (status, body) = api
        .call(
            0,
            Method::PUT,
            &format!("/streams/s/leases/{}/checkpoint", ours[0]),
            Some(json!({"worker": "reader", "epoch": told[ours[0]].1, "sequence_number": "42"})),
        )
        .await;
    assert_eq!(status, 200, "{body}");

    // Through the replica that is behind: the leaver leaves, the reader checkpoints a new
    // shard. Both requests reach it before it can read the new map.
    let leave = tokio::spawn({
        let api = api.clone();
        async move {
            api.call(1, Method::DELETE, "/streams/s/workers/leaver", None)
                .await
        }
    });
    let noted = tokio::spawn({
        let api = api.clone();
        let (shard, epoch) = (ours[0].to_owned(), told[ours[0]].1);
        async move {
            api.call(
                1,
                Method::PUT,
                &format!("/streams/s/leases/{shard}/checkpoint"),
                Some(json!({"worker": "reader", "epoch": epoch, "sequence_number": "43"})),
            )
            .await
        }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    drop(resumed);
    let (status, body) = leave.await.unwrap();
    assert_eq!(status, 204, "leave through the replica behind: {body}");
    let noted = noted.await.unwrap();

    // Replica 0 (which made the map) shows the new map's leases kept: the reader's with its
    // checkpoint and epoch, the leaver's passed on to the reader with its epoch raised.
    let (status, view) = api.get(0, "/streams/s/leases").await;
    assert_eq!(status, 200, "{view}");
    let shards: HashMap<&str, &Value> = view["shards"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| (s["shard_id"].as_str().unwrap(), s))
        .collect();
    assert_eq!(shards.len(), 4, "{view}");
    let theirs_before = leases_of(&leaver)[theirs[0]].1;
    let theirs_now = shards[theirs[0]];
    assert_eq!(theirs_now["owner"], "reader", "{view}");
    assert_eq!(theirs_now["epoch"], theirs_before + 1, "{view}");
    assert_eq!(
        noted.0, 200,
        "checkpoint of a new shard through the replica behind: {}",
        noted.1
    );
    let ours_now = shards[ours[0]];
    assert_eq!(ours_now["owner"], "reader", "{view}");
    assert_eq!(ours_now["epoch"], told[ours[0]].1, "{view}");
    assert_eq!(
        ours_now["checkpoint"], "43",
        "the reader's checkpoint: {view}"
    );

    // Each lease the reader is told of is the one the database holds, at no lower epoch.
    let (_, after) = heartbeat(&api, 1, "reader", 60).await;
    let after = leases_of(&after);
    assert_eq!(
        after.len(),
        4,
        "the reader reads every shard now: {after:?}"
    );
    for (shard, (_, epoch)) in &told {
        assert!(after[shard].1 >= *epoch, "{shard} went back: {after:?}");
    }
}

/// Sends SIGCONT to a replica stopped with SIGSTOP when dropped, so that a failing
/// assertion never leaves it stopped.
struct Resume<'a>(&'a Server);

impl Drop for Resume<'_> {
    fn drop(&mut self) {
        self.0.signal("CONT");
    }
}

/// When a worker was told `held` for a shard, by the test's clock.
#[derive(Debug)]
struct Held {
    worker: usize,
    epoch: u64,
    from: Instant,
    until: Instant,
}

/// Two replicas, one with its clock 30 s ahead (libfaketime), one worker heartbeating
/// through each: leases expire by the database's clock, so the fast replica never takes a
/// live worker's leases, and both workers end up with their share.
///
/// Postgres only: replicas on one SQLite file share a host, and so a clock (SQLite reads
/// the host's, in each process).
#[tokio::test]
async fn a_replica_with_its_clock_ahead_takes_no_live_workers_lease() {
    const TEST: &str = "a_replica_with_its_clock_ahead_takes_no_live_workers_lease";
    if crate::skip::postgres_only(TEST).is_none() {
        return;
    }
    let Some(fast) = crate::skip::clock_ahead(TEST, 30) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (url, _postgres) = fresh_database(dir.path()).await;
    let (_servers, api) = replicas(&url, dir.path(), &[&[], &fast.env()]).await;
    let (status, body) = api
        .call(
            0,
            Method::PUT,
            "/streams/s",
            Some(json!({"shard_count": 4})),
        )
        .await;
    assert_eq!(status, 201, "{body}");
    until_map(&api, 1, 4).await;

    const TTL: Duration = Duration::from_secs(2);
    const BEAT: Duration = Duration::from_millis(400);
    let run = Duration::from_secs(8);
    let began = Instant::now();
    let workers: Vec<_> = (0..2)
        .map(|i| {
            let api = api.clone();
            tokio::spawn(async move {
                // Worker i heartbeats through replica i: held periods, and its last answer.
                let mut periods: Vec<(String, Held)> = Vec::new();
                let mut holding: HashMap<String, (u64, Instant)> = HashMap::new();
                let mut last = Value::Null;
                // Send time of the last answered heartbeat: a worker reads its leases until
                // then plus the ttl at most, answered or not.
                let mut answered: Option<Instant> = None;
                tokio::time::sleep(Duration::from_millis(150 * i as u64)).await;
                while began.elapsed() < run {
                    let sent = Instant::now();
                    let (status, body) = heartbeat(&api, i, &format!("w{i}"), TTL.as_secs()).await;
                    let received = Instant::now();
                    assert_eq!(status, 200, "w{i} through replica {i}: {body}");
                    let held: HashMap<String, u64> = leases_of(&body)
                        .into_iter()
                        .filter(|(_, (state, _))| state == "held")
                        .map(|(shard, (_, epoch))| (shard, epoch))
                        .collect();
                    let stopped = match answered {
                        Some(t) if received >= t + TTL => t + TTL,
                        _ => received,
                    };
                    for (shard, (epoch, from)) in holding.clone() {
                        if stopped < received || held.get(&shard) != Some(&epoch) {
                            holding.remove(&shard);
                            let period = Held {
                                worker: i,
                                epoch,
                                from,
                                until: stopped,
                            };
                            periods.push((shard, period));
                        }
                    }
                    if received < sent + TTL {
                        for (shard, epoch) in held {
                            holding.entry(shard).or_insert((epoch, received));
                        }
                    }
                    answered = Some(sent);
                    last = body;
                    tokio::time::sleep_until((sent + BEAT).into()).await;
                }
                let end = Instant::now();
                for (shard, (epoch, from)) in holding {
                    periods.push((
                        shard,
                        Held {
                            worker: i,
                            epoch,
                            from,
                            until: end,
                        },
                    ));
                }
                (periods, last)
            })
        })
        .collect();
    let mut by_shard: BTreeMap<String, Vec<Held>> = BTreeMap::new();
    let mut last = Vec::new();
    for worker in workers {
        let (periods, answer) = worker.await.unwrap();
        for (shard, period) in periods {
            by_shard.entry(shard).or_default().push(period);
        }
        last.push(answer);
    }
    for (shard, periods) in &mut by_shard {
        periods.sort_by_key(|p| p.from);
        for pair in periods.windows(2) {
            let (a, b) = (&pair[0], &pair[1]);
            assert!(
                b.from >= a.until,
                "{shard}: w{} was told held (epoch {}) while w{} still held it (epoch {})",
                b.worker,
                b.epoch,
                a.worker,
                a.epoch
            );
        }
    }
    for (i, answer) in last.iter().enumerate() {
        let held = leases_of(answer)
            .values()
            .filter(|(state, _)| state == "held")
            .count();
        assert_eq!(
            held, 2,
            "w{i} (through replica {i}) has its share: {answer}"
        );
    }
}
