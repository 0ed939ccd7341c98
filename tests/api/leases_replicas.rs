//! Consumer leases through three replicas on one database, with dozens of workers
//! heartbeating at once while others join, leave and go silent: no two live workers are
//! ever told `held` for one shard, and every shard has a reader within one ttl.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use reqwest::Method;
use serde_json::{Value, json};

use crate::helpers::{backend, fresh_database};
use crate::process::Rng;
use crate::replicas::{Api, start};

const WORKERS: usize = 56;
const SHARDS: usize = 64;
const TTL: Duration = Duration::from_secs(2);
/// Every quarter of the ttl, as a worker should (a third at most).
const BEAT: Duration = Duration::from_millis(500);
const RUN: Duration = Duration::from_secs(20);

/// When a worker held a shard, by the worker's own clock: from receiving an answer that
/// says `held` until receiving one that does not, or sending `DELETE`, or (gone silent)
/// its last answered heartbeat's send time plus the ttl.
#[derive(Debug, Clone)]
struct Period {
    worker: usize,
    epoch: u64,
    from: Instant,
    until: Instant,
}

/// What one worker saw and did.
#[derive(Debug, Default)]
struct Log {
    periods: Vec<(String, Period)>,
    heartbeats: u64,
    /// Heartbeats the database could not take in time (503): the worker beats again.
    unanswered: u64,
    /// Slowest heartbeat, send to answer.
    slowest: Duration,
    /// Longest from one heartbeat's send to the next's (a silence aside): a beat, unless
    /// answers and the checkpoints between heartbeats took longer on a busy machine.
    longest_beat: Duration,
    checkpoints: u64,
    /// Checkpoints of owned leases refused because they came after the ttl: on a slow
    /// machine the lease may have expired, and the worker must stop reading.
    late: u64,
    fenced: u64,
}

/// How a worker spends the run.
#[derive(Debug, Clone, Copy)]
enum Plan {
    Stays,
    /// Leaves cleanly after this long.
    Leaves(Duration),
    /// Stops heartbeating after the first, for the second (longer than the ttl), then
    /// comes back.
    Silent(Duration, Duration),
}

fn plan_of(i: usize, rng: &mut Rng) -> (Duration, Plan) {
    // Four waves of joins, 3 s apart.
    let join = Duration::from_millis((i % 4) as u64 * 3_000 + rng.below(400));
    let plan = match i % 7 {
        3 => Plan::Leaves(Duration::from_millis(11_000 + rng.below(5_000))),
        5 => Plan::Silent(
            Duration::from_millis(9_000 + rng.below(3_000)),
            Duration::from_millis(3_000 + rng.below(2_000)),
        ),
        _ => Plan::Stays,
    };
    (join, plan)
}

async fn worker(api: Api, i: usize, start: Instant, seed: u64) -> Log {
    let mut rng = Rng::new(seed);
    let (join, plan) = plan_of(i, &mut rng);
    let name = format!("worker-{i:02}");
    let end = start + RUN;
    let mut log = Log::default();
    // shard -> (epoch, since)
    let mut holding: HashMap<String, (u64, Instant)> = HashMap::new();
    let mut lost: Vec<(String, u64)> = Vec::new();
    let mut owned_before: HashMap<String, u64> = HashMap::new();
    // Send time of the last answered heartbeat: leases are safe to read until it plus the
    // ttl, after which a worker whose heartbeats went unanswered stops reading.
    let mut last_answered: Option<Instant> = None;
    let close =
        |holding: &mut HashMap<String, (u64, Instant)>, log: &mut Log, shard: &str, at: Instant| {
            let (epoch, from) = holding.remove(shard).expect("held");
            log.periods.push((
                shard.to_owned(),
                Period {
                    worker: i,
                    epoch,
                    from,
                    until: at,
                },
            ));
            epoch
        };
    tokio::time::sleep_until((start + join).into()).await;
    let mut silent_done = false;
    let mut beat = 0usize;
    let mut last_sent: Option<Instant> = None;
    loop {
        let elapsed = start.elapsed();
        if Instant::now() >= end {
            break;
        }
        match plan {
            Plan::Leaves(after) if elapsed >= after => {
                let sent = Instant::now();
                let shards: Vec<String> = holding.keys().cloned().collect();
                for shard in shards {
                    close(&mut holding, &mut log, &shard, sent);
                }
                let (status, body) = api
                    .call(
                        i % 3,
                        Method::DELETE,
                        &format!("/streams/load/workers/{name}"),
                        None,
                    )
                    .await;
                // A worker whose heartbeats went unanswered for the ttl has expired already.
                let expired = last_answered.is_none_or(|t| Instant::now() >= t + TTL);
                assert!(
                    status == 204 || (status == 404 && expired),
                    "{name} leaving: {status} {body}"
                );
                return log;
            }
            Plan::Silent(after, quiet) if elapsed >= after && !silent_done => {
                silent_done = true;
                tokio::time::sleep(quiet).await;
                last_sent = None;
                continue;
            }
            _ => {}
        }
        let replica = (i + beat) % 3;
        beat += 1;
        let sent = Instant::now();
        if let Some(before) = last_sent {
            log.longest_beat = log.longest_beat.max(sent - before);
        }
        last_sent = Some(sent);
        let (status, body) = api
            .call(
                replica,
                Method::PUT,
                &format!("/streams/load/workers/{name}"),
                Some(json!({"ttl_s": TTL.as_secs()})),
            )
            .await;
        let received = Instant::now();
        log.slowest = log.slowest.max(received - sent);
        if let Some(previous) = last_answered
            && received >= previous + TTL
        {
            // No answer within the ttl: the worker stopped reading at its leases' expiry.
            let shards: Vec<String> = holding.keys().cloned().collect();
            for shard in shards {
                close(&mut holding, &mut log, &shard, previous + TTL);
            }
        }
        if status == 503 {
            log.unanswered += 1;
            tokio::time::sleep_until((sent + BEAT).into()).await;
            continue;
        }
        assert_eq!(status, 200, "{name} heartbeat: {body}");
        log.heartbeats += 1;
        last_answered = Some(sent);
        let mut held_now: HashMap<String, u64> = HashMap::new();
        let mut owned: HashMap<String, u64> = HashMap::new();
        for lease in body["leases"].as_array().unwrap() {
            let (shard, epoch) = (
                lease["shard_id"].as_str().unwrap().to_owned(),
                lease["epoch"].as_u64().unwrap(),
            );
            owned.insert(shard.clone(), epoch);
            if lease["state"] == "held" {
                held_now.insert(shard, epoch);
            }
        }
        let was: Vec<(String, u64)> = holding.iter().map(|(s, (e, _))| (s.clone(), *e)).collect();
        for (shard, epoch) in was {
            if held_now.get(&shard) != Some(&epoch) {
                close(&mut holding, &mut log, &shard, received);
            }
        }
        // Revoking, a lease is still this worker's at its epoch (for a last checkpoint);
        // gone, its epoch is fenced off.
        for (shard, epoch) in owned_before.drain() {
            if owned.get(&shard) != Some(&epoch) {
                lost.push((shard, epoch));
            }
        }
        owned_before = owned.clone();
        if received < sent + TTL {
            for (shard, epoch) in &held_now {
                holding.entry(shard.clone()).or_insert((*epoch, received));
            }
        }
        // Checkpoint every lease it owns (held, or revoking: the last checkpoint) before the
        // next heartbeat: a lease cannot pass before its owner heartbeats again (or
        // expires), so each must be taken.
        for (shard, epoch) in &owned {
            let body =
                json!({"worker": name, "epoch": epoch, "sequence_number": format!("{}", beat)});
            let (status, answer) = api
                .call(
                    (replica + 1) % 3,
                    Method::PUT,
                    &format!("/streams/load/leases/{shard}/checkpoint"),
                    Some(body),
                )
                .await;
            if status == 409 && Instant::now() >= sent + TTL {
                log.late += 1;
                continue;
            }
            assert_eq!(
                status, 200,
                "{name} checkpoint of owned {shard}@{epoch}: {answer}"
            );
            log.checkpoints += 1;
        }
        // A lease this worker lost: its old epoch is fenced off.
        if let Some((shard, epoch)) = lost.pop() {
            let body = json!({"worker": name, "epoch": epoch, "sequence_number": "1"});
            let (status, answer) = api
                .call(
                    replica,
                    Method::PUT,
                    &format!("/streams/load/leases/{shard}/checkpoint"),
                    Some(body),
                )
                .await;
            assert_eq!(
                status, 409,
                "{name} checkpoint of lost {shard}@{epoch}: {answer}"
            );
            log.fenced += 1;
        }
        // About to go silent: every lease ends at this heartbeat's send time plus the ttl.
        if let Plan::Silent(after, _) = plan
            && !silent_done
            && start.elapsed() + BEAT >= after
        {
            tokio::time::sleep_until((start + after).into()).await;
            let shards: Vec<String> = holding.keys().cloned().collect();
            for shard in shards {
                close(&mut holding, &mut log, &shard, sent + TTL);
            }
            last_sent = None;
            continue;
        }
        tokio::time::sleep_until((sent + BEAT).into()).await;
    }
    // Reading until the end, or until its leases' expiry if its last heartbeats went
    // unanswered (503) since.
    let until = last_answered.map_or(end, |t| end.min(t + TTL));
    let shards: Vec<String> = holding.keys().cloned().collect();
    for shard in shards {
        close(&mut holding, &mut log, &shard, until);
    }
    log
}

#[tokio::test]
async fn no_two_live_workers_hold_a_shard_across_replicas() {
    let dir = tempfile::tempdir().unwrap();
    let (url, _postgres) = fresh_database(dir.path()).await;
    let backend = backend(&url);
    let (_replicas, api) = start(&url, dir.path()).await;
    let (status, body) = api
        .call(
            0,
            Method::PUT,
            "/streams/load",
            Some(json!({"shard_count": SHARDS, "primary": true})),
        )
        .await;
    assert_eq!(status, 201, "{body}");
    let mut rng = Rng::new(7);
    let accounts: Vec<Value> = (0..300)
        .map(|n| json!({"account": format!("acct-{n}"), "weight": 1 + rng.below(60)}))
        .collect();
    let (status, body) = api
        .call(
            1,
            Method::POST,
            "/keys/batch",
            Some(json!({"accounts": accounts})),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    tokio::time::sleep(Duration::from_secs(1)).await;

    let began = Instant::now();
    let tasks: Vec<_> = (0..WORKERS)
        .map(|i| tokio::spawn(worker(api.clone(), i, began, 1000 + i as u64)))
        .collect();
    let mut logs = Vec::new();
    for task in tasks {
        logs.push(task.await.expect("worker task"));
    }

    let mut by_shard: BTreeMap<String, Vec<Period>> = BTreeMap::new();
    for log in &logs {
        for (shard, period) in &log.periods {
            by_shard
                .entry(shard.clone())
                .or_default()
                .push(period.clone());
        }
    }
    assert_eq!(by_shard.len(), SHARDS, "every shard was held");
    let (mut hand_overs, mut widest_gap) = (0, Duration::ZERO);
    for (shard, periods) in &mut by_shard {
        periods.sort_by_key(|p| p.from);
        for pair in periods.windows(2) {
            let (a, b) = (&pair[0], &pair[1]);
            assert!(
                b.from >= a.until,
                "{shard}: worker {} was told held at epoch {} while worker {} still held it at epoch {}",
                b.worker,
                b.epoch,
                a.worker,
                a.epoch
            );
            assert!(
                b.epoch > a.epoch || (b.epoch == a.epoch && b.worker == a.worker),
                "{shard}: epoch {} of worker {} after epoch {} of worker {}",
                b.epoch,
                b.worker,
                a.epoch,
                a.worker
            );
            if b.worker != a.worker {
                hand_overs += 1;
            }
            widest_gap = widest_gap.max(b.from - a.until);
        }
    }
    // Each (shard, epoch) belongs to one worker.
    let mut epochs: HashMap<(String, u64), usize> = HashMap::new();
    for (shard, periods) in &by_shard {
        for p in periods {
            let owner = *epochs.entry((shard.clone(), p.epoch)).or_insert(p.worker);
            assert_eq!(
                owner, p.worker,
                "{shard} epoch {} held by two workers",
                p.epoch
            );
        }
    }
    // The longest a shard can wait: its new owner goes silent just as it is handed the
    // lease, so it waits for that worker's expiry (one ttl), for the next heartbeat of any
    // worker to notice (a beat), and for the next owner's heartbeat (a beat), each beat as
    // long as the longest was (BEAT, or more when a worker's answers and checkpoints took
    // longer) and answered as slowly as the slowest was.
    let slowest = logs.iter().map(|l| l.slowest).max().unwrap_or_default();
    let longest_beat = logs
        .iter()
        .map(|l| l.longest_beat)
        .fold(BEAT, Duration::max);
    assert!(
        widest_gap <= TTL + 2 * (longest_beat + slowest),
        "a shard went {widest_gap:?} without a reader (more than the ttl and two beats of \
         {longest_beat:?} answered in {slowest:?})"
    );
    let heartbeats: u64 = logs.iter().map(|l| l.heartbeats).sum();
    let unanswered: u64 = logs.iter().map(|l| l.unanswered).sum();
    let late: u64 = logs.iter().map(|l| l.late).sum();
    let checkpoints: u64 = logs.iter().map(|l| l.checkpoints).sum();
    let fenced: u64 = logs.iter().map(|l| l.fenced).sum();
    assert!(fenced > 0, "some worker lost a lease and was fenced off");

    // Settled: every replica answers the same assignment, every shard held by a live
    // worker, no worker above the mean plus the heaviest shard.
    // Each replica reads the database at its own moment, and a worker whose last heartbeat
    // went unanswered may expire between two reads: the views count when replica 0's stood
    // still across them.
    let mut tries = 0;
    let first = loop {
        tries += 1;
        let (_, first) = api.get(0, "/streams/load/leases").await;
        let mut others = Vec::new();
        for r in 1..3 {
            let (status, other) = api.get(r, "/streams/load/leases").await;
            assert_eq!(status, 200);
            others.push((r, other));
        }
        let (_, again) = api.get(0, "/streams/load/leases").await;
        if again["shards"] != first["shards"] && tries < 3 {
            continue;
        }
        for (r, other) in others {
            assert_eq!(other["shards"], first["shards"], "replica {r} disagrees");
        }
        break first;
    };
    let shards = first["shards"].as_array().unwrap();
    let workers = first["workers"].as_array().unwrap();
    let total: u64 = shards.iter().map(|s| s["weight"].as_u64().unwrap()).sum();
    let heaviest = shards
        .iter()
        .map(|s| s["weight"].as_u64().unwrap())
        .max()
        .unwrap();
    let loads: Vec<u64> = workers
        .iter()
        .map(|w| w["weight"].as_u64().unwrap())
        .collect();
    for &load in &loads {
        assert!(
            load * loads.len() as u64 <= total + heaviest * loads.len() as u64,
            "a worker holds {load} of {total} over {} workers (heaviest shard {heaviest})",
            loads.len()
        );
    }
    let live = workers.len();
    println!(
        "leases on {backend}: {WORKERS} workers ({live} live at the end) over {SHARDS} shards through 3 replicas, {} s: {heartbeats} heartbeats ({unanswered} unanswered, 503; slowest {} ms; longest beat {} ms), {checkpoints} checkpoints taken ({late} refused after the ttl), {fenced} stale ones refused (409), {hand_overs} hand-overs, no overlap, widest gap without a reader {} ms (ttl {} ms); final loads {:?} (total {total}, heaviest shard {heaviest})",
        RUN.as_secs(),
        slowest.as_millis(),
        longest_beat.as_millis(),
        widest_gap.as_millis(),
        TTL.as_millis(),
        {
            let mut l = loads.clone();
            l.sort();
            l
        }
    );
}
