//! The replica processes and the faults a history injects into them and their database;
//! and the check that no 5xx came from anything but an injected fault.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::Value;
use sqlx::Connection;

use super::driver::History;
use super::{FAULT_GRACE_MS, Violation};
use crate::helpers::Db;
use crate::process::Server;
use crate::skip::ClockAhead;

/// The load controller's interval in a history, for its flag and for the judge.
const CONTROLLER_INTERVAL_S: &str = "1";
pub const CONTROLLER_INTERVAL_MS: i64 = 1_000;

/// The load controller on every replica, quick enough for a history to see it act: a round
/// every second over load that halves in a second, a few moves a round, each switching a
/// second on (the lookups' lifetime), and accounts that opted in fanning out when hot. A
/// quiet check, a few half-lives after the last report, finds it stopped.
const CONTROLLER: &[(&str, &str)] = &[
    ("KEYSPREAD_AUTO_REBALANCE", "true"),
    ("KEYSPREAD_AUTO_REBALANCE_INTERVAL_S", CONTROLLER_INTERVAL_S),
    ("KEYSPREAD_LOAD_HALF_LIFE_S", "1"),
    ("KEYSPREAD_LOAD_TOLERANCE", "0.05"),
    ("KEYSPREAD_LOAD_FLOOR", "0.05"),
    ("KEYSPREAD_MAX_MOVES_PER_ROUND", "3"),
    ("KEYSPREAD_MOVE_COOLDOWN_S", "2"),
    ("KEYSPREAD_SHARD_RECORDS_PER_S", "100"),
    ("KEYSPREAD_HOT_ACCOUNT_SHARE", "0.2"),
    ("KEYSPREAD_LOOKUP_CACHE_CONTROL", "max-age=1"),
];

/// The replicas of one history: processes that can be killed and restarted on one database,
/// one of them perhaps with its clock ahead.
pub struct Replicas {
    servers: Vec<Server>,
    pub urls: Vec<String>,
    env: Vec<Vec<(&'static str, String)>>,
    database_url: String,
    dir: PathBuf,
}

impl Replicas {
    /// Starts `n` replicas; `fast` puts one of them `secs` ahead of the host clock; `more`
    /// adds to (or overrides) their environment.
    pub async fn start(
        database_url: &str,
        dir: &Path,
        n: usize,
        fast: Option<(usize, ClockAhead)>,
        more: &[(&'static str, &str)],
        client: &reqwest::Client,
    ) -> Replicas {
        let env = (0..n)
            .map(|i| {
                let mut env: Vec<(&'static str, String)> = (CONTROLLER.iter())
                    .map(|&(k, v)| (k, v.to_owned()))
                    .collect();
                if let Some((r, ahead)) = &fast
                    && *r == i
                {
                    env.extend(ahead.env().iter().map(|&(k, v)| (k, v.to_owned())));
                }
                env.extend(more.iter().map(|&(k, v)| (k, v.to_owned())));
                env
            })
            .collect();
        let mut replicas = Replicas {
            servers: Vec::new(),
            urls: Vec::new(),
            env,
            database_url: database_url.to_owned(),
            dir: dir.to_owned(),
        };
        for i in 0..n {
            let server = replicas.spawn(i, client).await;
            replicas.urls.push(server.url.clone());
            replicas.servers.push(server);
        }
        replicas
    }

    async fn spawn(&self, i: usize, client: &reqwest::Client) -> Server {
        self.try_spawn(i, client)
            .await
            .unwrap_or_else(|why| panic!("replica {i} did not start: {why}"))
    }

    /// Starts replica `i`; why not, if it exits or is not ready within 30 s.
    async fn try_spawn(&self, i: usize, client: &reqwest::Client) -> Result<Server, String> {
        let log = self.dir.join(format!("replica-{i}.log"));
        let env: Vec<(&str, &str)> = self.env[i].iter().map(|(k, v)| (*k, v.as_str())).collect();
        let mut server = Server::spawn_with(&self.database_url, &log, &env);
        let client = client.clone();
        // `wait_ready` panics on failure; in a task of its own, that is an answer.
        let ready = tokio::spawn(async move {
            server.wait_ready(&client).await;
            server
        });
        ready.await.map_err(|e| match e.try_into_panic() {
            Ok(panic) => (panic.downcast_ref::<String>().cloned()).unwrap_or_default(),
            Err(e) => e.to_string(),
        })
    }

    /// SIGKILLs replica `i` and starts it again on the same database, trying for up to
    /// five times: the reasons it would not start meanwhile, if any.
    pub async fn kill_and_restart(&mut self, i: usize, client: &reqwest::Client) -> Vec<String> {
        self.servers[i].kill();
        let mut refused = Vec::new();
        for _ in 0..5 {
            match self.try_spawn(i, client).await {
                Ok(server) => {
                    self.urls[i] = server.url.clone();
                    self.servers[i] = server;
                    return refused;
                }
                Err(why) => refused.push(why),
            }
            tokio::time::sleep(Duration::from_secs(2)).await;
        }
        panic!("replica {i} did not start again: {refused:?}");
    }

    pub fn len(&self) -> usize {
        self.servers.len()
    }

    /// Sends `signal` (`STOP`, `CONT`) to replica `i`.
    pub fn signal(&self, i: usize, signal: &str) {
        self.servers[i].signal(signal);
    }

    /// How many log lines of replica `i` contain `needle`.
    pub fn log_lines(&self, i: usize, needle: &str) -> usize {
        self.log_matching(i, needle, usize::MAX).len()
    }

    /// The first `most` log lines of replica `i` that contain `needle`.
    pub fn log_matching(&self, i: usize, needle: &str, most: usize) -> Vec<String> {
        let log = self.dir.join(format!("replica-{i}.log"));
        let text = std::fs::read_to_string(log).unwrap_or_default();
        (text.lines().filter(|l| l.contains(needle)))
            .take(most)
            .map(str::to_owned)
            .collect()
    }
}

/// Holds the database's write lock from a connection of its own for `hold`, as another
/// writer (or an operator's `psql`) would.
pub async fn hold_write_lock(database_url: String, hold: Duration) {
    let mut db = Db::connect(&database_url).await;
    db.hold_write_lock().await;
    tokio::time::sleep(hold).await;
    db.release_write_lock().await;
}

/// Terminates every other Postgres backend of the database (the replicas' pooled
/// connections): how many.
pub async fn terminate_backends(database_url: &str) -> usize {
    let mut conn = sqlx::PgConnection::connect(database_url)
        .await
        .expect("connect to postgres");
    let killed: Vec<bool> = sqlx::query_scalar(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
         WHERE datname = current_database() AND pid <> pg_backend_pid()",
    )
    .fetch_all(&mut conn)
    .await
    .expect("terminate backends");
    killed.len()
}

/// (e) No 5xx and no unanswered request except inside a fault's window: a 503 with
/// `Retry-After` while the database is disturbed (or the mirror's refusal when stale);
/// never a 500.
pub fn judge(history: &History) -> Vec<Violation> {
    let mut out = Vec::new();
    for call in &history.calls {
        if (200..500).contains(&call.status) {
            continue;
        }
        let covered = history.faults.iter().any(|f| {
            f.from <= call.received
                && call.sent <= f.until + FAULT_GRACE_MS
                && f.replica.is_none_or(|r| r == call.replica)
        });
        // A mirror that could not sync for max_age_s refuses to answer (stale): honest
        // while its replica is disturbed, a broken promise otherwise.
        let stale_mirror = call.op == "mirror" && call.status == 0;
        // A change in flight on a paused replica may be answered 408 when it resumes past
        // the request timeout: a refusal, as a 503 is.
        let paused = history.faults.iter().any(|f| {
            f.kind == "pause"
                && f.replica == Some(call.replica)
                && f.from <= call.received
                && call.sent <= f.until
        });
        // A paused replica may also reset, when it resumes, the idle connection a request
        // reached it on (its idle timeout fires before it reads): no answer, not a wrong one.
        // A COMMIT lost with the leader is 504 `outcome-unknown` (settled afterwards by its
        // Idempotency-Key): honest during a failover.
        let failing_over = history.faults.iter().any(|f| {
            super::failover::KINDS.contains(&f.kind)
                && f.from <= call.received
                && call.sent <= f.until + FAULT_GRACE_MS
        });
        let unknown = call.status == 504
            && call.answer["type"]
                .as_str()
                .is_some_and(|t| t.ends_with("outcome-unknown"));
        // Lookups and mirrors never fail because the database is away: through a failover
        // shorter than the lookups' max-age, they are answered from what the replica holds.
        let lookup = call.op == "mirror"
            || call.method == reqwest::Method::GET && call.path.starts_with("/keys/");
        let excused = covered
            && !(failing_over && lookup)
            && (call.status == 503 && call.retry_after
                || stale_mirror
                || paused && matches!(call.status, 408 | 0)
                || failing_over && unknown);
        if !excused {
            out.push(Violation {
                check: "(e) no 5xx outside injected faults",
                what: format!(
                    "{} {} {} on r{} at +{} ms answered {} {}{}",
                    call.method,
                    call.path,
                    call.body.as_ref().map_or(String::new(), Value::to_string),
                    call.replica,
                    history.clock.rel(call.sent),
                    call.status,
                    call.answer,
                    if covered {
                        " (inside a fault window)"
                    } else {
                        ""
                    }
                ),
            });
        }
    }
    out
}
