//! Drives one history: random operations through random replicas, with idle gaps while
//! switches pass, faults, and quiet checks; records every call.

use std::collections::VecDeque;
use std::path::Path;
use std::time::Duration;

use reqwest::Method;
use serde_json::{Value, json};

mod balance;
mod pause;
mod quiet;
mod workers;

pub use pause::PAUSED_OP;

use super::events::{Observed, Watcher};
use super::failover::{self, Failover, Ha};
use super::faults::{Replicas, hold_write_lock, terminate_backends};
use super::{Call, Clock, Fault, MAX_OPS, Violation};
use crate::process::Rng;
use crate::skip::ClockAhead;

/// Account names: few enough that allocations, releases and lookups meet.
const POOL: u64 = 40;
const WORKERS: usize = 4;
const TTL_S: u64 = 3;
const PRIMARY: &str = "p";
pub const LEASED: &str = "l";

/// What a run did, for the checks.
pub struct History {
    pub clock: Clock,
    pub calls: Vec<Call>,
    pub faults: Vec<Fault>,
    pub events: Vec<Observed>,
    /// Broken promises seen while it ran: at quiet checks, and restarts refused.
    pub quiet_violations: Vec<Violation>,
    pub quiet_checks: u32,
    /// Quiet checks of the leases' balance: judged, and left unjudged (not settled).
    pub balance_judged: u32,
    pub balance_unsettled: u32,
    pub replicas: usize,
    pub primary_shards: u64,
    pub clock_note: String,
    /// How far each replica's clock runs ahead, in ms.
    pub skew_ms: Vec<i64>,
    pub ttl_ms: i64,
    pub end: i64,
    /// Per replica, how many times its log says it could not follow the event log.
    pub follow_errors: Vec<usize>,
    /// ... of which saying a key is already held (a replica's tree out of step with the log).
    pub already_held: Vec<usize>,
    /// Per replica, log lines saying a pooled connection was left in an aborted transaction.
    pub aborted: Vec<usize>,
    /// Per replica, the load controller's rounds it claimed (its log): number, and the
    /// database's clock it claimed by (Unix ms).
    pub rounds_claimed: Vec<Vec<(i64, i64)>>,
    /// Per replica, the first log lines of requests that failed with a 5xx (their cause).
    pub failures: Vec<Vec<String>>,
    /// The Idempotency-Keys the database kept an answer for at the end.
    pub kept_keys: std::collections::HashSet<String>,
    /// A drill's failovers, in order.
    pub failovers: Vec<Failover>,
    /// Per replica at the end, the `/metrics` lines about the database's being away: seconds
    /// unwritable, and answers 503 and 504.
    pub away_metrics: Vec<Vec<String>>,
    /// Per failover of a drill, the seconds without a writable database that the replica
    /// that counted most counted from its start to the next one's (or the drill's end), by
    /// `keyspread_database_unwritable_seconds_total`.
    pub unwritable_s: Vec<f64>,
}

/// The lookups' Cache-Control in a drill: above a failover (14 s at the most seen) plus a
/// mirror's long poll, which a mirror's staleness counts from (20 s was not: 29 mirror
/// lookups refused as stale in one of fifteen failovers). The default is 60 s.
pub const DRILL_LOOKUP_CACHE: &str = "max-age=30";

/// A drill's failovers of each kind: 5, or `KEYSPREAD_DRILL_FAILOVERS_PER_KIND`.
pub fn failovers_per_kind() -> usize {
    (std::env::var("KEYSPREAD_DRILL_FAILOVERS_PER_KIND").ok())
        .and_then(|n| n.parse().ok())
        .unwrap_or(5)
}

struct Worker {
    name: String,
    next_beat: i64,
    away_until: i64,
    /// Leases the last answered heartbeat gave it: (shard, epoch).
    owned: Vec<(String, u64)>,
    sequence: u64,
}

struct Driver {
    rng: Rng,
    /// Faults and heartbeats draw from streams of their own, so that how many operations
    /// fit between them (which timing decides) does not change what they choose.
    faults_rng: Rng,
    beats_rng: Rng,
    /// Load reports and opting in to fanouts by load draw from a stream of their own too.
    load_rng: Rng,
    clock: Clock,
    client: reqwest::Client,
    url: String,
    postgres: bool,
    replicas: Replicas,
    calls: Vec<Call>,
    faults: Vec<Fault>,
    idle_until: Vec<i64>,
    reads_only_until: Vec<i64>,
    returning: Vec<bool>,
    quiet_at: Option<i64>,
    next_quiet: i64,
    next_fault: i64,
    next_rebalance: i64,
    next_map: i64,
    next_leave: i64,
    next_silence: i64,
    workers: Vec<Worker>,
    /// The one reader of the primary stream: it reports load there, for the controller.
    reporter: Worker,
    last_report: i64,
    recent: VecDeque<String>,
    locks: Vec<std::thread::JoinHandle<()>>,
    watcher: Watcher,
    /// Producers' mirrors (crates/client), mirror i following replica i (one; two in a
    /// drill): asked with every lookup and judged as that replica's answers are (op
    /// `mirror`), and at every quiet check; started anew when their replica is restarted
    /// (its address changes).
    mirrors: Vec<keyspread_client::Mirror>,
    quiet_violations: Vec<Violation>,
    quiet_checks: u32,
    balance_judged: u32,
    balance_unsettled: u32,
    /// How many pause faults so far: each names its accounts by its number.
    pauses: u32,
    /// A drill's cluster, its failover under way, and those done.
    ha: Option<Ha>,
    failing_over: Option<tokio::task::JoinHandle<Failover>>,
    failovers: Vec<Failover>,
    /// A drill's health checks of `/readyz/writes` (as a load balancer routing writers
    /// makes them), and each replica's unwritable seconds as at each failover's start.
    writes_checks: Option<tokio::task::JoinHandle<()>>,
    unwritable_marks: Vec<Vec<f64>>,
}

/// Runs a history for `run_for` on the database at `url`; with `ha`, a drill: three
/// replicas, every change with an Idempotency-Key, and failovers of the cluster
/// ([`failovers_per_kind`] of each kind) as its only faults, until they are done.
pub async fn run(seed: u64, url: &str, dir: &Path, run_for: Duration, ha: Option<Ha>) -> History {
    let mut rng = Rng::new(seed);
    let postgres = url.starts_with("postgres");
    let mut n = 2 + rng.below(2) as usize;
    let mut fast = (postgres && rng.below(2) == 0).then(|| (n - 1, 2 + rng.below(4)));
    if ha.is_some() {
        n = 3;
        fast = None;
        KEY_EVERY_CHANGE.store(true, std::sync::atomic::Ordering::Relaxed);
    }
    let primary_shards = 2 + rng.below(3);
    // The clock fault needs libfaketime: CI installs it; elsewhere the run says it went
    // without (the rest of the history still runs).
    let faketime = crate::skip::faketime_path();
    if faketime.is_none() && fast.is_some() {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "{}",
            crate::skip::FAKETIME_MISSING
        );
    }
    let fast = fast.filter(|_| faketime.is_some());
    let clock_note = match (postgres, fast, &faketime) {
        (false, ..) => "no clock skew (SQLite replicas share one host clock)".to_owned(),
        (true, _, None) => format!("no clock skew: {}", crate::skip::FAKETIME_MISSING),
        (true, None, _) => "no clock skew this seed".to_owned(),
        (true, Some((r, s)), _) => format!("r{r} runs {s} s ahead (libfaketime)"),
    };
    // Longer than the longest pause, and the request timeout after it.
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(25))
        .build()
        .unwrap();
    let fast_clock = (fast.zip(faketime)).map(|((r, secs), lib)| (r, ClockAhead::new(lib, secs)));
    // Lookups are answered while a replica is out of touch with the database for less than
    // their max-age: a drill's lasts longer than a failover (1 s elsewhere, so that the
    // controller's moves switch within a history).
    let more: &[(&str, &str)] = match ha {
        Some(_) => &[("KEYSPREAD_LOOKUP_CACHE_CONTROL", DRILL_LOOKUP_CACHE)],
        None => &[],
    };
    let replicas = Replicas::start(url, dir, n, fast_clock, more, &client).await;
    // Replica 0 keeps the host's clock (a fast one is the last, and a drill has none): the
    // mirrors' clock.
    let mut mirrors = Vec::new();
    for url in &replicas.urls[..if ha.is_some() { 2 } else { 1 }] {
        mirrors.push((keyspread_client::Mirror::start(url).await).expect("a mirror of a replica"));
    }
    let replicas_urls = replicas.urls.clone();
    let client_for_checks = client.clone();
    let clock = Clock::new();
    let now = clock.now();
    let mut d = Driver {
        workers: (0..WORKERS)
            .map(|i| Worker {
                name: format!("w{i}"),
                next_beat: now + rng.below(1000) as i64,
                away_until: 0,
                owned: Vec::new(),
                sequence: 0,
            })
            .collect(),
        rng,
        faults_rng: Rng::new(seed ^ 0xFA01_7000),
        beats_rng: Rng::new(seed ^ 0xBEA7_0000),
        load_rng: Rng::new(seed ^ 0x10AD_0000),
        clock,
        client,
        url: url.to_owned(),
        postgres,
        replicas,
        calls: Vec::new(),
        faults: Vec::new(),
        idle_until: vec![0; n],
        reads_only_until: vec![0; n],
        returning: vec![false; n],
        quiet_at: None,
        next_quiet: now + 8_000,
        next_fault: now + 3_000,
        next_rebalance: now + 500,
        next_map: now + 2_000,
        next_leave: now + 3_000,
        next_silence: now + 5_000,
        reporter: Worker {
            name: "reporter".to_owned(),
            next_beat: now,
            away_until: 0,
            owned: Vec::new(),
            sequence: 0,
        },
        last_report: now,
        recent: VecDeque::new(),
        locks: Vec::new(),
        watcher: Watcher::start(url, clock),
        mirrors,
        quiet_violations: Vec::new(),
        quiet_checks: 0,
        balance_judged: 0,
        balance_unsettled: 0,
        pauses: 0,
        writes_checks: ha
            .is_some()
            .then(|| check_writes(&replicas_urls, &client_for_checks)),
        ha,
        failing_over: None,
        failovers: Vec::new(),
        unwritable_marks: Vec::new(),
    };
    let body = json!({"shard_count": primary_shards, "primary": true});
    let (status, answer) = d
        .call(
            0,
            "stream",
            Method::PUT,
            format!("/streams/{PRIMARY}"),
            Some(body),
        )
        .await;
    assert_eq!(status, 201, "{answer}");
    let body = json!({"shard_count": 4});
    let (status, answer) = d
        .call(
            1,
            "stream",
            Method::PUT,
            format!("/streams/{LEASED}"),
            Some(body),
        )
        .await;
    assert_eq!(status, 201, "{answer}");

    let end = now + run_for.as_millis() as i64;
    // A drill runs until its last failover: fifteen of them with a settled cluster between
    // each are about 60,000 calls of two mirrors' and three replicas' traffic.
    let max_ops = if d.ha.is_some() { 3 * MAX_OPS } else { MAX_OPS };
    while (d.clock.now() < end || d.drilling()) && d.calls.len() < max_ops {
        d.heartbeats().await;
        d.report_load().await;
        d.failover_done().await;
        let now = d.clock.now();
        if now >= d.next_fault && d.failing_over.is_none() {
            d.fault().await;
        } else if d.failing_over.is_some() {
            // No quiet check while the cluster fails over: it reads the database.
            d.step().await;
        } else if now >= d.next_quiet || d.quiet_at.is_some_and(|q| now >= q) {
            d.quiet().await;
        } else if let Some(r) = (0..n).find(|&r| d.returning[r] && now >= d.idle_until[r]) {
            d.returning[r] = false;
            d.reads_after_idle(r).await;
        } else {
            d.step().await;
        }
    }
    if let Some(failing_over) = d.failing_over.take() {
        let failover = failing_over.await.expect("the failover's task");
        d.record_failover(failover);
    }
    d.quiet().await;
    d.settle_unknown_outcomes().await;
    if let Some(checks) = d.writes_checks.take() {
        let last = d.unwritable_now().await;
        d.unwritable_marks.push(last);
        checks.abort();
    }
    let unwritable_s = (d.unwritable_marks.windows(2))
        .map(|w| {
            (w[0].iter().zip(&w[1]))
                .map(|(a, b)| b - a)
                .fold(0.0, f64::max)
        })
        .collect();
    let mut away_metrics = Vec::new();
    for url in &d.replicas.urls {
        let text = match d.client.get(format!("{url}/metrics")).send().await {
            Ok(response) => response.text().await.unwrap_or_default(),
            Err(_) => String::new(),
        };
        away_metrics.push(
            (text.lines())
                .filter(|l| {
                    !l.starts_with('#')
                        && (l.contains("unwritable")
                            || l.contains("status=\"503\"")
                            || l.contains("status=\"504\""))
                })
                .map(str::to_owned)
                .collect(),
        );
    }
    let end = d.clock.now();
    let events = d.watcher.stop().await;
    let kept_keys = crate::helpers::Db::connect(url).await.kept_keys().await;
    let lines = |needle: &str| (0..n).map(|r| d.replicas.log_lines(r, needle)).collect();
    let follow_errors = lines("cannot follow");
    let already_held = lines("already held");
    let aborted = lines("transaction is aborted");
    // A number a log line gives as ` name=N`.
    let field = |line: &str, name: &str| -> Option<i64> {
        let (_, rest) = line.split_once(&format!(" {name}="))?;
        rest.split(' ').next()?.parse().ok()
    };
    let rounds_claimed = (0..n)
        .map(|r| {
            (d.replicas
                .log_matching(r, "load controller: round claimed", usize::MAX))
            .iter()
            .filter_map(|l| Some((field(l, "round")?, field(l, "at")?)))
            .collect()
        })
        .collect();
    // The causes of 5xx answers, which the server logs and never sends.
    let failures = (0..n)
        .map(|r| {
            let mut lines = d.replicas.log_matching(r, "request failed", 3);
            lines.extend(d.replicas.log_matching(r, "panicked", 3));
            lines
        })
        .collect();
    let skew_ms = (0..n)
        .map(|r| fast.filter(|f| f.0 == r).map_or(0, |f| f.1 as i64 * 1000))
        .collect();
    History {
        clock: d.clock,
        calls: d.calls,
        faults: d.faults,
        events,
        quiet_violations: d.quiet_violations,
        quiet_checks: d.quiet_checks,
        balance_judged: d.balance_judged,
        balance_unsettled: d.balance_unsettled,
        replicas: n,
        primary_shards,
        clock_note,
        skew_ms,
        ttl_ms: TTL_S as i64 * 1000,
        end,
        follow_errors,
        already_held,
        aborted,
        rounds_claimed,
        failures,
        kept_keys: kept_keys.into_iter().collect(),
        failovers: d.failovers,
        away_metrics,
        unwritable_s,
    }
}

/// Asks each replica's `GET /readyz/writes` every 500 ms until aborted, as a load balancer
/// routing writers does: the replica counts the time without a writable database by what
/// these checks find.
fn check_writes(urls: &[String], client: &reqwest::Client) -> tokio::task::JoinHandle<()> {
    let (urls, client) = (urls.to_vec(), client.clone());
    tokio::spawn(async move {
        loop {
            let mut checks = tokio::task::JoinSet::new();
            for url in &urls {
                let check = client.get(format!("{url}/readyz/writes"));
                checks.spawn(check.timeout(Duration::from_secs(3)).send());
            }
            checks.join_all().await;
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    })
}

impl Driver {
    async fn call(
        &mut self,
        replica: usize,
        op: &'static str,
        method: Method,
        path: String,
        body: Option<Value>,
    ) -> (u16, Value) {
        let url = self.replicas.urls[replica].clone();
        let call = send(
            &self.client,
            self.clock,
            &url,
            replica,
            op,
            method,
            path,
            body,
        )
        .await;
        let answer = (call.status, call.answer.clone());
        self.calls.push(call);
        answer
    }

    fn below(&mut self, n: u64) -> u64 {
        self.rng.below(n)
    }

    /// A replica to send to: not idle, and not serving reads only when `mutating`.
    fn pick(&mut self, mutating: bool) -> usize {
        let now = self.clock.now();
        let open: Vec<usize> = (0..self.replicas.len())
            .filter(|&r| {
                now >= self.idle_until[r] && (!mutating || now >= self.reads_only_until[r])
            })
            .collect();
        open[self.below(open.len() as u64) as usize]
    }

    /// Another replica than `r` that is not idle, if any.
    fn other(&mut self, r: usize) -> Option<usize> {
        let now = self.clock.now();
        let open: Vec<usize> = (0..self.replicas.len())
            .filter(|&o| o != r && now >= self.idle_until[o])
            .collect();
        (!open.is_empty()).then(|| open[self.below(open.len() as u64) as usize])
    }

    fn account(&mut self) -> String {
        if !self.recent.is_empty() && self.below(10) < 6 {
            let i = self.below(self.recent.len() as u64) as usize;
            return self.recent[i].clone();
        }
        format!("acct-{}", self.below(POOL))
    }

    async fn step(&mut self) {
        match self.below(100) {
            0..30 => {
                let (r, a) = (self.pick(false), self.account());
                self.call(r, "lookup", Method::GET, format!("/keys/{a}"), None)
                    .await;
                self.mirror_lookup(&a);
            }
            30..52 => self.allocate().await,
            52..60 => {
                let (r, a) = (self.pick(true), self.account());
                self.call(r, "release", Method::DELETE, format!("/keys/{a}"), None)
                    .await;
            }
            60..68 => {
                let a = self.account();
                self.patch(&a).await;
            }
            68..78 => {
                let (r, w) = (self.pick(true), self.below(WORKERS as u64) as usize);
                self.checkpoint(r, w, false).await;
            }
            78..86 => {
                // The rarer operations, each at its own pace.
                let now = self.clock.now();
                if now >= self.next_rebalance {
                    self.next_rebalance = now + 400 + self.below(1600) as i64;
                    self.rebalance().await;
                } else if now >= self.next_map {
                    self.next_map = now + 1_000 + self.below(2_000) as i64;
                    self.change_map(false).await;
                } else if now >= self.next_leave {
                    self.next_leave = now + 1_500 + self.below(2_500) as i64;
                    let (r, w) = (self.pick(true), self.present());
                    if let Some(w) = w {
                        self.leave(r, w).await;
                    }
                } else if now >= self.next_silence {
                    // Silent past its ttl, then back.
                    self.next_silence = now + 4_000 + self.below(4_000) as i64;
                    if let Some(w) = self.present() {
                        let away = (TTL_S * 1000 + 500 + self.below(1500)) as i64;
                        self.workers[w].away_until = now + away;
                    }
                }
            }
            _ => {
                let Some(a) = self.recent.back().cloned() else {
                    return;
                };
                let r = self.pick(false);
                self.call(r, "lookup", Method::GET, format!("/keys/{a}"), None)
                    .await;
                self.mirror_lookup(&a);
            }
        }
    }

    /// Asks each mirror for `account` and records its answer as its replica's would be
    /// (status 0 when it refused to answer: stale).
    fn mirror_lookup(&mut self, account: &str) {
        for replica in 0..self.mirrors.len() {
            self.mirror_lookup_of(replica, account);
        }
    }

    fn mirror_lookup_of(&mut self, replica: usize, account: &str) {
        let sent = self.clock.now();
        let (status, answer) = match self.mirrors[replica].lookup(account) {
            Ok(Some(lookup)) => (
                200,
                json!({
                    "hash_keys": lookup.keys.to_vec(),
                    "next": lookup.next.map(|n| json!({
                        "hash_keys": n.keys.to_vec(),
                        "switch_at": rfc3339_ms(n.at),
                    })),
                }),
            ),
            Ok(None) => (404, Value::Null),
            Err(e) => (0, json!(e.to_string())),
        };
        self.calls.push(Call {
            replica,
            op: "mirror",
            method: Method::GET,
            path: format!("/keys/{account}"),
            body: None,
            status,
            answer,
            retry_after: false,
            sent,
            received: self.clock.now(),
            key: None,
        });
    }

    async fn allocate(&mut self) {
        let r = self.pick(true);
        let account = format!("acct-{}", self.below(POOL));
        let fanout = 1 + self.below(4);
        let weight = fanout + self.below(12);
        let body = json!({"fanout": fanout, "weight": weight});
        let (status, _) = self
            .call(
                r,
                "allocate",
                Method::POST,
                format!("/keys/{account}"),
                Some(body),
            )
            .await;
        if status == 201 {
            self.recent.push_back(account);
            if self.recent.len() > 12 {
                self.recent.pop_front();
            }
        }
    }

    async fn patch(&mut self, account: &str) {
        let r = self.pick(true);
        let fanout = 1 + self.below(4);
        let weight = fanout + self.below(12);
        let mut body = match self.below(3) {
            0 => json!({"weight": weight}),
            1 => json!({"fanout": fanout}),
            _ => json!({"fanout": fanout, "weight": weight}),
        };
        // Opted in, the controller may raise its fanout (to 4 at most) while it is hot.
        if self.load_rng.below(3) == 0 {
            body["max_fanout"] = json!(4);
        }
        self.call(
            r,
            "patch",
            Method::PATCH,
            format!("/keys/{account}"),
            Some(body),
        )
        .await;
    }

    /// Plans on one replica, applies on another; sometimes leaves a replica idle while the
    /// switch passes, and changes a moving account's fanout before it switches.
    async fn rebalance(&mut self) {
        let r = self.pick(false);
        let (status, plan) = self
            .call(
                r,
                "preview",
                Method::GET,
                format!("/rebalance/preview?stream={PRIMARY}"),
                None,
            )
            .await;
        let moves: Vec<String> = (plan["moves"].as_array().into_iter().flatten())
            .filter_map(|m| m["account"].as_str().map(str::to_owned))
            .collect();
        if status != 200 || (moves.is_empty() && self.below(4) != 0) {
            return;
        }
        let (applier, switch) = (self.pick(true), self.below(3));
        let body = json!({"plan_id": plan["plan_id"], "switch_after_s": switch});
        let (status, _) = self
            .call(
                applier,
                "apply",
                Method::POST,
                "/rebalance".to_owned(),
                Some(body),
            )
            .await;
        if status != 200 || switch == 0 || moves.is_empty() {
            return;
        }
        let now = self.clock.now();
        let switch_at = now + switch as i64 * 1000;
        let none_idle = self.idle_until.iter().all(|&t| t <= now);
        if none_idle && self.below(3) != 0 {
            let idle = self.other(applier).expect("another replica");
            let gap = 1000 + self.below(2000) as i64;
            self.idle_until[idle] = (now + gap).max(switch_at + 300);
            self.reads_only_until[idle] = self.idle_until[idle] + 1500 + self.below(1000) as i64;
            self.returning[idle] = true;
            if self.below(2) == 0 {
                self.quiet_at = Some(self.idle_until[idle] + 800);
            }
        }
        if self.below(2) == 0 {
            let a = moves[self.below(moves.len() as u64) as usize].clone();
            self.patch(&a).await;
        }
    }

    /// Whether a drill still has failovers to make or wait for.
    fn drilling(&self) -> bool {
        self.ha.is_some()
            && (self.failing_over.is_some()
                || self.failovers.len() < failover::KINDS.len() * failovers_per_kind())
    }

    /// Records a drill's failover once its task has ended, and when the next may come.
    async fn failover_done(&mut self) {
        if !(self.failing_over.as_ref()).is_some_and(|f| f.is_finished()) {
            return;
        }
        let failover = (self.failing_over.take().unwrap())
            .await
            .expect("the failover's task");
        self.record_failover(failover);
    }

    fn record_failover(&mut self, failover: Failover) {
        self.faults.push(Fault {
            kind: failover.kind,
            replica: None,
            from: failover.from,
            until: failover.until,
        });
        self.failovers.push(failover);
        let now = self.clock.now();
        self.next_fault = now + 6_000 + self.faults_rng.below(6_000) as i64;
        self.next_quiet = now + 1_000;
    }

    /// Each replica's `keyspread_database_unwritable_seconds_total`, all reasons together
    /// (NaN where the replica did not answer).
    async fn unwritable_now(&self) -> Vec<f64> {
        let mut seconds = Vec::new();
        for url in &self.replicas.urls {
            let answer = self.client.get(format!("{url}/metrics")).send().await;
            let text = match answer {
                Ok(answer) => answer.text().await.unwrap_or_default(),
                Err(_) => String::new(),
            };
            let counted = (text.lines())
                .filter(|l| l.starts_with("keyspread_database_unwritable_seconds_total{"))
                .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
                .reduce(|a, b| a + b);
            seconds.push(counted.unwrap_or(f64::NAN));
        }
        seconds
    }

    /// Sends every change answered 504 `outcome-unknown` again with its Idempotency-Key,
    /// now that the cluster has a leader: its answer is the change's outcome (op `settle`).
    async fn settle_unknown_outcomes(&mut self) {
        let unknown: Vec<Call> = (self.calls.iter())
            .filter(|c| c.status == 504 && c.key.is_some())
            .cloned()
            .collect();
        for call in unknown {
            let url = self.replicas.urls[call.replica].clone();
            let settled = send_keyed(&self.client, self.clock, &url, &call).await;
            self.calls.push(settled);
        }
    }

    async fn fault(&mut self) {
        let now = self.clock.now();
        self.next_fault = now + 4_000 + self.faults_rng.below(8_000) as i64;
        if self.ha.is_some() {
            let mark = self.unwritable_now().await;
            self.unwritable_marks.push(mark);
        }
        if let Some(ha) = &self.ha {
            let kind = failover::KINDS[self.failovers.len() % failover::KINDS.len()];
            let (ha, url, clock) = (ha.clone(), self.url.clone(), self.clock);
            self.failing_over = Some(tokio::spawn(async move {
                ha.fail_over(kind, &url, clock).await
            }));
            return;
        }
        let kinds: &[&str] = if self.postgres {
            &["lock", "terminate", "kill", "pause"]
        } else {
            &["lock", "kill", "pause"]
        };
        let kind = kinds[self.faults_rng.below(kinds.len() as u64) as usize];
        let (replica, until) = match kind {
            "lock" => {
                let hold = 1000 + self.faults_rng.below(1000);
                let url = self.url.clone();
                // On a thread of its own: the lock outlives this call, and sqlx's
                // connection futures are not spawnable on this runtime as they are.
                self.locks.push(std::thread::spawn(move || {
                    let runtime = tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                        .unwrap();
                    runtime.block_on(hold_write_lock(url, Duration::from_millis(hold)));
                }));
                (None, now + hold as i64 + 500)
            }
            "terminate" => {
                terminate_backends(&self.url).await;
                let until = self.clock.now() + 500;
                // Followers that lost their connection (and the notification that would
                // wake them) catch up late: a map put now meets replicas that miss it.
                if self.faults_rng.below(2) == 0 {
                    self.change_map(true).await;
                }
                (None, until)
            }
            "pause" => {
                let (r, resumed) = self.pause().await;
                // Stopped inside a write, it holds the database's write lock: every
                // replica's changes may be refused until it resumes (or its session ends).
                self.faults.push(Fault {
                    kind: "paused writer",
                    replica: None,
                    from: now,
                    until: resumed,
                });
                (Some(r), resumed)
            }
            _ => {
                let r = self.faults_rng.below(self.replicas.len() as u64) as usize;
                let refused = self.replicas.kill_and_restart(r, &self.client).await;
                if r < self.mirrors.len() {
                    self.mirrors[r] = (keyspread_client::Mirror::start(&self.replicas.urls[r])
                        .await)
                        .expect("a mirror of the restarted replica");
                }
                for why in refused {
                    self.quiet_violations.push(Violation {
                        check: "(e) a killed replica starts again on the database",
                        what: format!("r{r} at +{} ms: {why}", self.clock.rel(now)),
                    });
                }
                (Some(r), self.clock.now())
            }
        };
        self.faults.push(Fault {
            kind,
            replica,
            from: now,
            until,
        });
    }
}

/// Sends one request and records it as a client sees it.
#[allow(clippy::too_many_arguments)]
async fn send(
    client: &reqwest::Client,
    clock: Clock,
    url: &str,
    replica: usize,
    op: &'static str,
    method: Method,
    path: String,
    body: Option<Value>,
) -> Call {
    let mut request = client.request(method.clone(), format!("{url}{path}"));
    if let Some(body) = &body {
        request = request.json(body);
    }
    // Every other change names itself: the others take the one-statement allocation (in a
    // drill every change does, so that each 504 is settled by its key).
    let every = KEY_EVERY_CHANGE.load(std::sync::atomic::Ordering::Relaxed);
    let key = (method != Method::GET)
        .then(|| SENT.fetch_add(1, std::sync::atomic::Ordering::Relaxed))
        .filter(|n| every || n % 2 == 0)
        .map(|n| format!("h{}-{n}", clock.start()));
    if let Some(key) = &key {
        request = request.header("Idempotency-Key", key);
    }
    let sent = clock.now();
    let (status, answer, retry_after) = match request.send().await {
        Ok(response) => {
            let status = response.status().as_u16();
            let retry = (response.headers()).contains_key(reqwest::header::RETRY_AFTER);
            let text = response.text().await.unwrap_or_default();
            let body = serde_json::from_str(&text).unwrap_or(Value::String(text));
            (status, body, retry)
        }
        Err(e) => (0, Value::String(causes(&e)), false),
    };
    Call {
        replica,
        op,
        method,
        path,
        body,
        status,
        answer,
        retry_after,
        sent,
        received: clock.now(),
        key,
    }
}

/// An error and the errors that caused it, each after a colon.
fn causes(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(&format!(": {cause}"));
        source = cause.source();
    }
    text
}

/// Changes sent so far (a key's serial number).
static SENT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
/// Whether every change carries an Idempotency-Key (a drill).
static KEY_EVERY_CHANGE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// `call` (a change with an Idempotency-Key) sent again with its key, as op `settle`.
async fn send_keyed(client: &reqwest::Client, clock: Clock, url: &str, call: &Call) -> Call {
    let mut request = client.request(call.method.clone(), format!("{url}{}", call.path));
    if let Some(body) = &call.body {
        request = request.json(body);
    }
    let key = call.key.clone().expect("a change with an Idempotency-Key");
    request = request.header("Idempotency-Key", &key);
    let sent = clock.now();
    let (status, answer, retry_after) = match request.send().await {
        Ok(response) => {
            let status = response.status().as_u16();
            let retry = (response.headers()).contains_key(reqwest::header::RETRY_AFTER);
            let text = response.text().await.unwrap_or_default();
            let body = serde_json::from_str(&text).unwrap_or(Value::String(text));
            (status, body, retry)
        }
        Err(e) => (0, Value::String(causes(&e)), false),
    };
    Call {
        op: "settle",
        status,
        answer,
        retry_after,
        sent,
        received: clock.now(),
        ..call.clone()
    }
}

/// Unix milliseconds as RFC 3339, as the server writes `switch_at`.
fn rfc3339_ms(ms: i64) -> String {
    let at = time::OffsetDateTime::from_unix_timestamp_nanos(i128::from(ms) * 1_000_000).unwrap();
    at.format(&time::format_description::well_known::Rfc3339)
        .unwrap()
}
