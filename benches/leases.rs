//! Consumer leases at scale: a release `keyspread serve` on its default database (a fresh
//! SQLite file), a stream of S shards carrying weighted accounts, W workers joining over
//! the first heartbeat period and then heartbeating every 5 s (ttl 30 s). Prints the joins' and the steady
//! heartbeats' latency, the server's CPU over the steady window, and its CPU time per
//! heartbeat: a heartbeat costs O(its own leases), so that figure stays flat as the
//! stream grows with the group.
//!
//! ```text
//! cargo bench --bench leases                                  # 4,096 shards, 1,000 workers; then 1,024 and 250
//! cargo bench --bench leases -- --secs 30 --shards 4096 --workers 1000
//! cargo bench --bench leases -- --database-url postgres://postgres:postgres@127.0.0.1/postgres
//! ```
//!
//! Every loop is bounded in time; the server binds 127.0.0.1 and is killed at the end.

mod common;
use common::SplitMix64;

use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

const BEAT: Duration = Duration::from_secs(5);
const TTL_S: u64 = 30;
const ACCOUNTS_PER_SHARD: usize = 10;

struct Args {
    secs: u64,
    runs: Vec<(usize, usize)>,
    database_url: Option<String>,
}

fn args() -> Args {
    let mut out = Args {
        secs: 30,
        runs: Vec::new(),
        database_url: None,
    };
    let (mut shards, mut workers) = (None, None);
    let mut it = std::env::args().skip(1);
    let number = |v: Option<String>, flag: &str, max: u64| -> u64 {
        v.and_then(|s| s.parse().ok())
            .filter(|n| (1..=max).contains(n))
            .unwrap_or_else(|| panic!("{flag} takes a number in 1..={max}"))
    };
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--secs" => out.secs = number(it.next(), "--secs", 600),
            "--shards" => shards = Some(number(it.next(), "--shards", 10_000) as usize),
            "--workers" => workers = Some(number(it.next(), "--workers", 5_000) as usize),
            "--database-url" => out.database_url = it.next(),
            _ => {} // cargo passes --bench
        }
    }
    out.runs = match (shards, workers) {
        (Some(s), Some(w)) => vec![(s, w)],
        (None, None) => vec![(4096, 1000), (1024, 250)],
        _ => panic!("give both --shards and --workers, or neither"),
    };
    out
}

/// The release server, killed when dropped.
struct Server {
    child: Child,
    url: String,
    pid: u32,
    _dir: tempfile::TempDir,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start(database_url: Option<&str>) -> Server {
    let dir = tempfile::tempdir().unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = database_url
        .map(str::to_owned)
        .unwrap_or_else(|| format!("sqlite://{}/keyspread.db", dir.path().display()));
    let child = Command::new(env!("CARGO_BIN_EXE_keyspread"))
        .args(["serve", "--listen", &format!("127.0.0.1:{port}")])
        .args(["--database-url", &url])
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start keyspread");
    let pid = child.id();
    Server {
        child,
        url: format!("http://127.0.0.1:{port}"),
        pid,
        _dir: dir,
    }
}

/// User plus system CPU seconds of a process so far.
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("read /proc stat");
    // Fields after the command name (which ends at the last ')'): utime is the 12th, stime the 13th.
    let fields: Vec<&str> = stat[stat.rfind(')').unwrap() + 2..].split(' ').collect();
    let ticks: f64 = fields[11].parse::<f64>().unwrap() + fields[12].parse::<f64>().unwrap();
    ticks / 100.0
}

fn percentile(sorted: &[Duration], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i].as_secs_f64() * 1000.0
}

async fn call(
    client: &reqwest::Client,
    method: reqwest::Method,
    url: String,
    body: Value,
) -> Value {
    let response = client
        .request(method, &url)
        .json(&body)
        .send()
        .await
        .unwrap_or_else(|e| panic!("{url}: {e}"));
    let status = response.status();
    let text = response.text().await.unwrap();
    assert!(status.is_success(), "{url}: {status} {text}");
    serde_json::from_str(&text).unwrap_or(Value::Null)
}

async fn run(args: &Args, shards: usize, workers: usize) {
    let server = start(args.database_url.as_deref());
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .pool_max_idle_per_host(256)
        .build()
        .unwrap();
    let ready = Instant::now() + Duration::from_secs(30);
    while client
        .get(format!("{}/readyz", server.url))
        .send()
        .await
        .map_or(true, |r| !r.status().is_success())
    {
        assert!(Instant::now() < ready, "keyspread did not get ready");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let stream = format!("bench-{shards}");
    call(
        &client,
        reqwest::Method::PUT,
        format!("{}/streams/{stream}", server.url),
        json!({"shard_count": shards, "primary": true}),
    )
    .await;
    let mut rng = SplitMix64(shards as u64);
    let accounts: Vec<Value> = (0..shards * ACCOUNTS_PER_SHARD)
        .map(|n| json!({"account": format!("acct-{n}"), "weight": 1 + rng.next_u64() % 1000}))
        .collect();
    for batch in accounts.chunks(10_000) {
        call(
            &client,
            reqwest::Method::POST,
            format!("{}/keys/batch", server.url),
            json!({"accounts": batch}),
        )
        .await;
    }

    // Each worker joins at its own phase of the first period, then heartbeats every period.
    let began = Instant::now();
    let warm = BEAT * 3;
    let steady_until = began + BEAT + warm + Duration::from_secs(args.secs);
    let joins = Arc::new(Mutex::new(Vec::new()));
    let beats = Arc::new(Mutex::new(Vec::new()));
    let leases = Arc::new(Mutex::new(Vec::new()));
    let steady_from = began + BEAT + warm;
    let tasks: Vec<_> = (0..workers)
        .map(|w| {
            let (client, url) = (
                client.clone(),
                format!("{}/streams/{stream}/workers/worker-{w:04}", server.url),
            );
            let (joins, beats, leases) = (joins.clone(), beats.clone(), leases.clone());
            let phase = BEAT.mul_f64(w as f64 / workers as f64);
            tokio::spawn(async move {
                let mut at = began + phase;
                let mut first = true;
                while at < steady_until {
                    tokio::time::sleep_until(at.into()).await;
                    let sent = Instant::now();
                    let answer = call(
                        &client,
                        reqwest::Method::PUT,
                        url.clone(),
                        json!({"ttl_s": TTL_S}),
                    )
                    .await;
                    let took = sent.elapsed();
                    if first {
                        joins.lock().unwrap().push(took);
                        first = false;
                    } else if sent >= steady_from {
                        beats.lock().unwrap().push(took);
                        leases
                            .lock()
                            .unwrap()
                            .push(answer["leases"].as_array().map_or(0, Vec::len));
                    }
                    at += BEAT;
                }
            })
        })
        .collect();
    tokio::time::sleep_until(steady_from.into()).await;
    let cpu_before = cpu_seconds(server.pid);
    let wall = Instant::now();
    for task in tasks {
        task.await.unwrap();
    }
    let (cpu, wall) = (
        cpu_seconds(server.pid) - cpu_before,
        wall.elapsed().as_secs_f64(),
    );
    let group = call(
        &client,
        reqwest::Method::GET,
        format!("{}/streams/{stream}/leases", server.url),
        Value::Null,
    );
    let timed = Instant::now();
    let group = group.await;
    let view_ms = timed.elapsed().as_secs_f64() * 1000.0;
    let metrics = client
        .get(format!("{}/metrics", server.url))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let metric = |name: &str| -> f64 {
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
            .unwrap_or(f64::NAN)
    };
    let assignments = metric("keyspread_lease_assignments_total");
    let assign_ms = metric("keyspread_lease_assignment_seconds_sum") * 1000.0 / assignments;
    let counts: Vec<usize> = group["workers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w["shards"].as_array().unwrap().len())
        .collect();
    let mut joins = joins.lock().unwrap().clone();
    let mut beats = beats.lock().unwrap().clone();
    joins.sort();
    beats.sort();
    let own: Vec<usize> = leases.lock().unwrap().clone();
    let mean_own = own.iter().sum::<usize>() as f64 / own.len().max(1) as f64;
    let backend = if args
        .database_url
        .as_deref()
        .is_some_and(|u| u.starts_with("postgres"))
    {
        "postgres"
    } else {
        "sqlite"
    };
    println!(
        "{shards} shards, {workers} workers ({backend}, {} accounts): joins p50 {:.1} ms, p99 {:.1} ms; \
         {} steady heartbeats over {wall:.0} s ({:.0}/s, {mean_own:.1} leases each): p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms; \
         server CPU {:.1} % of one core, {:.3} ms per heartbeat; GET leases {view_ms:.0} ms; \
         leases per worker {}..={}; {assignments} assignments in all, {assign_ms:.0} ms each on average",
        shards * ACCOUNTS_PER_SHARD,
        percentile(&joins, 0.5),
        percentile(&joins, 0.99),
        beats.len(),
        beats.len() as f64 / wall,
        percentile(&beats, 0.5),
        percentile(&beats, 0.99),
        percentile(&beats, 1.0),
        cpu / wall * 100.0,
        cpu * 1000.0 / beats.len().max(1) as f64,
        counts.iter().min().unwrap_or(&0),
        counts.iter().max().unwrap_or(&0),
    );
}

#[tokio::main]
async fn main() {
    let args = args();
    for &(shards, workers) in &args.runs {
        run(&args, shards, workers).await;
    }
}
