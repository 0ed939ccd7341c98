//! Seeded random histories through 2–3 replica processes on one database, with faults
//! (the write lock held elsewhere, Postgres backends terminated, a replica SIGKILLed and
//! restarted, a replica whose clock runs ahead, replicas idle while a switch passes), and
//! the load controller acting on every replica over the load a reader of the primary stream
//! reports, moving keys and raising and lowering the fanouts of accounts that opted in. Every
//! invocation and completion is recorded, then judged against a model folded from the
//! event log: no key answered for two accounts, every replica equal to the database after
//! 1 s of quiet, no two live workers told `held` for one shard, a hot account's keys (now
//! and next) on distinct shards, no 5xx outside an injected fault, no controller round
//! claimed twice or sooner than its interval allows (the replicas' logs).
//!
//! `KEYSPREAD_HISTORY_SEED=N` replays a run's choices; `KEYSPREAD_HISTORY_SECS` (90) bounds
//! it (`make soak`: 600).

mod drill;
mod driver;
mod events;
mod failover;
mod faults;
mod leases;
mod model;
mod refusals;

use std::collections::BTreeMap;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use reqwest::Method;
use serde_json::Value;

use crate::helpers::{backend, fresh_database};

/// How long a replica may take to show a change (the documented follow bound).
const LAG_MS: i64 = 1_000;
/// After a fault ends, how long 503s (with `Retry-After`) are still its doing.
const FAULT_GRACE_MS: i64 = 3_000;
/// Operations at most, whatever the duration.
const MAX_OPS: usize = 60_000;

/// Unix milliseconds by the test's own (true) clock, monotonic through the run.
#[derive(Clone, Copy)]
pub struct Clock {
    start: Instant,
    unix0: i64,
}

impl Clock {
    fn new() -> Clock {
        let unix0 = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
        Clock {
            start: Instant::now(),
            unix0: unix0.as_millis() as i64,
        }
    }

    pub fn now(&self) -> i64 {
        self.unix0 + self.start.elapsed().as_millis() as i64
    }

    /// Milliseconds into the run, for messages.
    pub fn rel(&self, at: i64) -> i64 {
        at - self.unix0
    }

    /// When the run started (Unix ms): names what this run sends.
    pub fn start(&self) -> i64 {
        self.unix0
    }
}

/// One request and its answer, as a client saw them.
#[derive(Debug, Clone)]
pub struct Call {
    pub replica: usize,
    pub op: &'static str,
    pub method: Method,
    pub path: String,
    pub body: Option<Value>,
    /// 0 when no answer came (connection refused or reset, timeout).
    pub status: u16,
    pub answer: Value,
    pub retry_after: bool,
    pub sent: i64,
    pub received: i64,
    /// The Idempotency-Key it was sent with, if any.
    pub key: Option<String>,
}

/// An injected fault and when it may have disturbed answers.
#[derive(Debug, Clone)]
pub struct Fault {
    pub kind: &'static str,
    /// The replica it hit, or none for the database.
    pub replica: Option<usize>,
    pub from: i64,
    pub until: i64,
}

/// A broken promise, by check.
pub struct Violation {
    pub check: &'static str,
    pub what: String,
}

fn seed() -> u64 {
    std::env::var("KEYSPREAD_HISTORY_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
            now.as_nanos() as u64 % 1_000_000_007
        })
}

fn duration() -> Duration {
    let secs = std::env::var("KEYSPREAD_HISTORY_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(90);
    Duration::from_secs(secs)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_histories_keep_every_promise() {
    let seed = seed();
    let run_for = duration();
    let dir = tempfile::tempdir().unwrap();
    let (url, _postgres) = fresh_database(dir.path()).await;
    let backend = backend(&url);
    let replay = format!(
        "{}KEYSPREAD_HISTORY_SEED={seed} KEYSPREAD_HISTORY_SECS={} cargo test --test api history:: -- --nocapture",
        if backend == "postgres" {
            "KEYSPREAD_TEST_POSTGRES=$KEYSPREAD_TEST_POSTGRES "
        } else {
            ""
        },
        run_for.as_secs()
    );
    println!("history on {backend}: seed {seed}; replay with: {replay}");
    let started = Instant::now();
    let history = driver::run(seed, &url, dir.path(), run_for, None).await;
    conclude(history, backend, seed, &replay, dir.path(), started, true);
}

/// The failover drill (`make ha-drill`, on a cluster tests/ha/cluster.py starts): a history
/// through three replicas on a highly available Postgres, five failovers of each kind its
/// only faults, judged as every history is; prints per kind what clients saw. With
/// asynchronous replication, what a promotion lost is counted, not failed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "the failover drill: `make ha-drill` starts an HA Postgres and runs it"]
async fn a_failover_drill_keeps_every_promise() {
    let ha = failover::Ha::from_env()
        .expect("no HA Postgres in the environment: `make ha-drill` starts one and runs this");
    let seed = seed();
    let dir = tempfile::tempdir().unwrap();
    let url = ha.database().await;
    let ha_mode = ha.mode.clone();
    let backend = if ha.mode == "sync" {
        "HA Postgres (synchronous)"
    } else {
        "HA Postgres (asynchronous)"
    };
    let replay = format!(
        "KEYSPREAD_HISTORY_SEED={seed} make ha-drill{}",
        if ha.mode == "sync" {
            ""
        } else {
            " HA_MODE=async"
        }
    );
    println!("drill on {backend}: seed {seed}; replay with: {replay}");
    let started = Instant::now();
    let history = driver::run(seed, &url, dir.path(), Duration::from_secs(30), Some(ha)).await;
    drill::report(&history, backend);
    let strict = ha_mode == "sync";
    conclude(history, backend, seed, &replay, dir.path(), started, strict);
}

/// Judges `history` and prints what it did; panics on any broken promise.
fn conclude(
    mut history: driver::History,
    backend: &str,
    seed: u64,
    replay: &str,
    dir: &std::path::Path,
    started: Instant,
    strict: bool,
) {
    let mut violations = std::mem::take(&mut history.quiet_violations);
    let model = model::Model::fold(&history.events);
    let judged = model::judge(&history, &model);
    violations.extend(judged.violations);
    violations.extend(model.exclusive(&history.clock));
    violations.extend(leases::judge(&history));
    violations.extend(faults::judge(&history));
    violations.extend(events::judge_actors(&history.events));
    violations.extend(events::judge_rounds(
        &history.rounds_claimed,
        faults::CONTROLLER_INTERVAL_MS * 9 / 10,
    ));
    violations.extend(refusals::judge(&history));

    let mut ops: BTreeMap<&str, BTreeMap<u16, u64>> = BTreeMap::new();
    for call in &history.calls {
        *ops.entry(call.op)
            .or_default()
            .entry(call.status)
            .or_default() += 1;
    }
    let faults: Vec<String> = (history.faults.iter())
        .map(|f| match f.replica {
            Some(r) => format!("{}@r{r}+{}ms", f.kind, history.clock.rel(f.from)),
            None => format!("{}+{}ms", f.kind, history.clock.rel(f.from)),
        })
        .collect();
    println!(
        "history on {backend}: seed {seed}, {} replicas, primary stream of {} shards, {}; {} calls in {:.1?}; by operation and status: {ops:?}",
        history.replicas,
        history.primary_shards,
        history.clock_note,
        history.calls.len(),
        started.elapsed(),
    );
    println!(
        "history on {backend}: {} events; faults injected {}: {faults:?}; {} quiet checks; log lines per replica: \"cannot follow\" {:?} (\"already held\" {:?}), \"transaction is aborted\" {:?}",
        history.events.len(),
        faults.len(),
        history.quiet_checks,
        history.follow_errors,
        history.already_held,
        history.aborted,
    );
    println!(
        "history on {backend}: answers checked against the log {}, spreads checked {}, held periods {}, max lag seen {} ms, lease balances judged {} ({} not settled, not judged), controller rounds claimed per replica {:?}",
        judged.checked,
        judged.spreads,
        leases::periods(&history).len(),
        judged.max_lag,
        history.balance_judged,
        history.balance_unsettled,
        history
            .rounds_claimed
            .iter()
            .map(Vec::len)
            .collect::<Vec<_>>(),
    );
    let mut by_check: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for v in &violations {
        by_check.entry(v.check).or_default().push(&v.what);
    }
    for (check, list) in &by_check {
        eprintln!(
            "{backend} seed {seed}: {} violation(s) of {check}:",
            list.len()
        );
        for what in list.iter().take(6) {
            eprintln!("  {what}");
        }
    }
    if !violations.is_empty() {
        for (r, lines) in history.failures.iter().enumerate() {
            for line in lines {
                eprintln!("{backend} seed {seed}: r{r} logged: {line}");
            }
        }
        // The replicas' logs outlive the run, for whoever reads the failure.
        let kept = std::env::temp_dir().join(format!("keyspread-history-{backend}-{seed}"));
        let _ = std::fs::create_dir_all(&kept);
        for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            if entry.path().extension().is_some_and(|e| e == "log") {
                let _ = std::fs::copy(entry.path(), kept.join(entry.file_name()));
            }
        }
        eprintln!(
            "{backend} seed {seed}: the replicas' logs are kept in {}",
            kept.display()
        );
    }
    if !strict {
        // Asynchronous replication: a promotion may lose what the old leader acknowledged
        // last. What broke is the figure, counted above, not a failure.
        println!(
            "{backend}, seed {seed}: {} broken promise(s) measured ({})",
            violations.len(),
            (by_check.iter())
                .map(|(c, l)| format!("{c}: {}", l.len()))
                .collect::<Vec<_>>()
                .join(", ")
        );
        return;
    }
    assert!(
        violations.is_empty(),
        "{backend}, seed {seed}: {} broken promise(s) ({}); replay with: {replay}",
        violations.len(),
        by_check
            .iter()
            .map(|(c, l)| format!("{c}: {}", l.len()))
            .collect::<Vec<_>>()
            .join(", ")
    );
}
