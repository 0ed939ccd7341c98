//! SIGKILL at random moments under load, 20 times over: every acknowledged change survives
//! (a fanned-out account's keys each at its index, with its share of the weight), no key is
//! handed out twice, and the event log still replays to exactly the table.
//!
//! `make crash` runs this alone with its figures shown; `KEYSPREAD_CRASH_SEED` repeats a
//! run's choices (the kill moments, and each client's operations).

mod client;
mod verdict;

use std::collections::BTreeSet;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use client::{Record, Target};

use crate::helpers::{Db, backend, fresh_database};
use crate::process::{Rng, Server};
use crate::replay::check_store;

const CLIENTS: u64 = 64;
const KILLS: u32 = 20;
/// How long the server runs under load between restart and kill, in milliseconds.
const UP_MS: std::ops::Range<u64> = 600..1800;
/// Load after the last restart, before the clients stop.
const TAIL: Duration = Duration::from_secs(1);

/// Where clients are sent while the server is down: a port nothing listens on.
const NOWHERE: &str = "http://127.0.0.1:1";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_changes_survive_sigkill() {
    let seed = std::env::var("KEYSPREAD_CRASH_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
        });
    let dir = tempfile::tempdir().unwrap();
    let (url, _postgres) = fresh_database(dir.path()).await;
    let backend = backend(&url);
    println!("{backend}: crash seed {seed} (KEYSPREAD_CRASH_SEED={seed} repeats its choices)");
    let started = Instant::now();

    let log = dir.path().join("keyspread.log");
    let target = Target::new();
    let mut server = Server::spawn(&url, &log);
    server.wait_ready(&target.client).await;
    target.point_at(&server.url);
    let clients: Vec<_> = (1..=CLIENTS)
        .map(|n| tokio::spawn(client::run(target.clone(), seed, n)))
        .collect();

    let mut rng = Rng::new(seed);
    let mut down = Duration::ZERO;
    let mut kill_times = Vec::new();
    for _ in 0..KILLS {
        let up = UP_MS.start + rng.below(UP_MS.end - UP_MS.start);
        tokio::time::sleep(Duration::from_millis(up)).await;
        server.kill();
        kill_times.push(crate::staged::now_ms());
        // Nothing may answer for the killed server: its port is free now, and another
        // test's server could take it. Clients meet a closed port until the restart.
        target.point_at(NOWHERE);
        let killed = Instant::now();
        server = Server::spawn(&url, &log);
        server.wait_ready(&target.client).await;
        target.point_at(&server.url);
        down += killed.elapsed();
    }
    tokio::time::sleep(TAIL).await;
    target.stop();
    let mut records = Vec::new();
    for handle in clients {
        let record = tokio::time::timeout(Duration::from_secs(60), handle)
            .await
            .expect("a client still retrying a minute after the load ended")
            .unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()));
        records.push(record);
    }
    let mut db = Db::connect(&url).await;
    // A request a client gave up on may still be committing: give it a moment to land in
    // both the table and the server's memory, which must then agree.
    let (mut held, mut stored) = (serde_json::Value::Null, 0);
    for _ in 0..20 {
        let health = target.client.get(format!("{}/healthz", server.url));
        let health: serde_json::Value = health.send().await.unwrap().json().await.unwrap();
        let accounts: BTreeSet<String> = db.key_rows().await.into_iter().map(|r| r.0).collect();
        (held, stored) = (health["accounts"].clone(), accounts.len());
        if held == stored {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    server.kill();
    let (rows, events) = (db.key_rows().await, db.indexed_events().await);
    let mut v = verdict::judge(&records, &rows, &events);
    if held != stored {
        let problem = format!("the last server holds {held} accounts, the table {stored}");
        v.problems.push(problem);
    }
    // Moves applied but not switched when a kill came: their old keys were held through
    // the restart (the replay below checks it).
    let pending_at_kills = (events.iter())
        .filter(|e| e.1 == "move")
        .filter(|e| {
            let (at, switch_at) = (e.0, e.7.unwrap_or(e.0));
            kill_times.iter().any(|&k| at <= k && k < switch_at)
        })
        .count();
    println!("{backend}: {pending_at_kills} moves were pending at a kill");
    if pending_at_kills == 0 {
        v.problems
            .push("no move was pending at any kill: the run tested no staged move".to_owned());
    }
    let sum = |f: fn(&Record) -> u64| records.iter().map(f).sum::<u64>();
    println!(
        "{backend}: {KILLS} kills, {down:.1?} down in all; {} lookups, {} requests unanswered \
         or 5xx ({} 5xx), {} rebalances applied, {} stale",
        sum(|r| r.lookups),
        sum(|r| r.failed + r.server_errors),
        sum(|r| r.server_errors),
        sum(|r| r.rebalances),
        sum(|r| r.stale_plans),
    );
    let accounts = rows.iter().map(|r| &r.0).collect::<BTreeSet<_>>().len();
    println!(
        "{backend}: acknowledged allocations {}, resizes {} ({} unanswered), {} of several \
         keys; found {} \
         ({} moved since), lost {}, duplicates {}, index gaps {}, wrong shares {}, \
         acknowledged releases {}, moves {} ({} acknowledged), kills {KILLS}; \
         {accounts} accounts held with {} keys, {} events, {:.1?} in all",
        v.acked_allocations,
        v.acked_resizes,
        v.unanswered_resizes,
        v.acked_fanned_out,
        v.found,
        v.found_moved,
        v.lost,
        v.duplicates,
        v.gaps,
        v.wrong_shares,
        v.acked_releases,
        v.moves,
        v.acked_moves,
        rows.len(),
        events.len(),
        started.elapsed(),
    );
    for problem in v.problems.iter().take(20) {
        eprintln!("{backend}: {problem}");
    }
    assert!(
        v.problems.is_empty(),
        "{} broken promises (seed {seed})",
        v.problems.len()
    );
    check_store(&rows, &events);
}
