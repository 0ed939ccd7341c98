//! Proof on kinesalite that load reported by producers alone keeps a stream balanced while
//! its shards change under it. 300 accounts write at Zipf(1.1) rates through the order-safe
//! producer on a mirror, whose `record()` picks and counts each record's key and reports
//! to `POST /load/producers`; the hot accounts rotate at the midpoint; every account may
//! spread over 4 keys (`max_fanout`), as the top one (20 % of all records) must on 6 shards.
//! Consumers are plain readers (GetShardIterator and GetRecords, a parent read to its end
//! before its children) with the order-aware consumer's logic: no leases, no heartbeats, so
//! keyspread hears of load from the producers only. The stream starts at 4 shards; during
//! the run the harness splits one outside keyspread (as on-demand scaling does), and then
//! this reshards it to 6 with `keyspread streams reshard`, SIGKILLing the server once its
//! job's first call is made (held by a recording proxy in front of kinesalite) and starting
//! it again on the same database and port: the job must end `done` at 6 open shards that
//! tile the keyspace, each call made once.
//!
//! tests/python/producers_proof.py counts, per 10-s window from what the readers read, the
//! busiest shard's records over the mean of the shards open then. The changes are the
//! start, the split (from the call until keyspread's watch has registered it: keyspread
//! cannot act on a map it has not listed), the rotation, and the reshard (from the job's
//! start to its end). A window is judged when it starts three controller rounds plus the
//! lookup max-age (the last round's switch) after the end of every change before it and
//! ends before the next change begins; so only windows whose open shards did not change are
//! judged, and none splits a shard's records between a closing parent and its children.
//! Every judged window must be within 1.15 of the mean, with 0 records out of order per
//! (account, sub-key), 0 lost and 0 duplicates.
//!
//! `make proofs` (KEYSPREAD_PROOF_FULL=1) runs 300 s on SQLite with a controller round every
//! 10 s and writes docs/producers_proof.svg; `make test` runs 60 s, a round every 3 s, and judges
//! the two windows that fit (after the split, and after the rotation and the reshard).

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::Value;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;

use crate::helpers::fresh_database;
use crate::kinesalite::Kinesalite;
use crate::load_kinesis::{
    BOUND, MAX_AGE_S, MAX_MOVES_PER_ROUND, RATE, assert_in_order_and_whole, loop_env, ratios,
};
use crate::process::Server;
use crate::python_client::{assert_success, generate, tool};
use crate::reshard_job::{check_calls, check_map};
use crate::reshard_proxy::{Proxy, Rules};

const STREAM: &str = "producers";
/// Open shards the reshard takes the stream to.
const TARGET: u32 = 6;
/// The per-shard write limit scaled to the rate over the 6 shards (a mean utilisation of 0.8).
const SHARD_RECORDS_PER_S: u64 = 33;

/// How long a run lasts, when the stream changes, and how often the controller acts.
struct Shape {
    seconds: u64,
    split_at_s: u64,
    reshard_at_s: u64,
    interval_s: u64,
    half_life_s: u64,
    cooldown_s: u64,
    sync_interval_s: u64,
    report_interval_s: u64,
    /// Windows judged at the least.
    judged: usize,
    /// Where the plot goes: docs/ for the full run on SQLite, else beside the run's files.
    svg: Option<PathBuf>,
}

impl Shape {
    fn from_env(manifest: &Path) -> Shape {
        if std::env::var("KEYSPREAD_PROOF_FULL").as_deref() == Ok("1") {
            Shape {
                seconds: 300,
                split_at_s: 75,
                reshard_at_s: 205,
                interval_s: 10,
                half_life_s: 5,
                cooldown_s: 30,
                sync_interval_s: 5,
                report_interval_s: 2,
                judged: 10,
                svg: Some(manifest.join("docs/producers_proof.svg")),
            }
        } else {
            Shape {
                seconds: 60,
                split_at_s: 5,
                reshard_at_s: 31,
                interval_s: 3,
                half_life_s: 2,
                cooldown_s: 9,
                sync_interval_s: 2,
                report_interval_s: 1,
                judged: 2,
                svg: None,
            }
        }
    }

    /// Three controller rounds, and the last one's moves switched.
    fn settle_s(&self) -> u64 {
        3 * self.interval_s + MAX_AGE_S
    }

    /// The server's settings: the loop's, and Kinesis (through `endpoint`) listed often.
    fn env(&self, endpoint: &str) -> Vec<(&'static str, String)> {
        let mut env = loop_env(
            self.interval_s,
            self.half_life_s,
            self.cooldown_s,
            SHARD_RECORDS_PER_S,
        );
        env.extend([
            (
                "KEYSPREAD_LOOKUP_CACHE_CONTROL",
                format!("max-age={MAX_AGE_S}"),
            ),
            ("KEYSPREAD_KINESIS_ENDPOINT", endpoint.to_owned()),
            ("KEYSPREAD_KINESIS_REGION", "us-east-1".into()),
            (
                "KEYSPREAD_STREAM_SYNC_INTERVAL_S",
                self.sync_interval_s.to_string(),
            ),
            // The job of the killed process is taken up this soon by its restart.
            ("KEYSPREAD_RESHARD_LEASE_S", "1".into()),
            ("AWS_EC2_METADATA_DISABLED", "true".into()),
        ]);
        env
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn producers_reports_keep_a_stream_resharded_under_load_within_15_percent_of_the_mean() {
    let _quiet = crate::kinesalite::one_proof_at_a_time().await;
    // Judged through the HTTP API, which either backend serves alike: once, on SQLite, as
    // the closed loop's proof on consumers' reports (`make proofs` has 60 minutes in all).
    if !crate::skip::sqlite_only(
        "producers_reports_keep_a_stream_resharded_under_load_within_15_percent_of_the_mean",
    ) {
        return;
    }
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let shape = Shape::from_env(manifest);
    let begun = std::time::Instant::now();
    let kinesalite = Kinesalite::start().await;
    let proxy = Proxy::start(kinesalite.api.endpoint()).await;
    let work = tempfile::tempdir().unwrap();
    let client_dir = generate(work.path()).await;
    let (database_url, _postgres) = fresh_database(work.path()).await;
    let log = work.path().join("server.log");
    let env = shape.env(&proxy.endpoint);
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let client = reqwest::Client::new();
    let mut server = Server::spawn_with(&database_url, &log, &env);
    server.wait_ready(&client).await;

    let python = tool("KEYSPREAD_TEST_PYTHON", manifest.join(".venv/bin/python"));
    let out = work.path().join("figures.json");
    let mut driver = Command::new(&python)
        .arg(manifest.join("tests/python/producers_proof.py"))
        .arg("run")
        .arg("--client-dir")
        .arg(&client_dir)
        .args(["--keyspread", &server.url])
        .args(["--kinesis", kinesalite.api.endpoint()])
        .args(["--stream", STREAM])
        .args(["--seconds", &shape.seconds.to_string()])
        .args(["--split-at", &shape.split_at_s.to_string()])
        .args(["--rate", &RATE.to_string()])
        .args(["--report-interval-s", &shape.report_interval_s.to_string()])
        .args(["--settle-s", &shape.settle_s().to_string()])
        .args(["--cooldown-s", &shape.cooldown_s.to_string()])
        .arg("--out")
        .arg(&out)
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("run producers_proof.py");
    let mut lines = BufReader::new(driver.stdout.take().expect("piped stdout")).lines();
    let producing = loop {
        let line = tokio::time::timeout(Duration::from_secs(120), lines.next_line())
            .await
            .expect("producers_proof.py started no producer within 120 s")
            .expect("read producers_proof.py's output");
        match line.as_deref() {
            Some("producing") => {
                println!("producing {:.1} s in", begun.elapsed().as_secs_f64());
                break tokio::time::Instant::now();
            }
            Some(line) => println!("{line}"),
            None => panic!("producers_proof.py ended before producing"),
        }
    };
    // The rest of its output (the per-window lines, the figures) comes at the end.
    let rest = tokio::spawn(async move {
        let mut text = Vec::new();
        while let Ok(Some(line)) = lines.next_line().await {
            text.push(line);
        }
        text
    });
    tokio::time::sleep_until(producing + Duration::from_secs(shape.reshard_at_s)).await;
    let killed_at = reshard_killing_once(&mut server, &proxy, &database_url, &log, &env).await;

    let ran = tokio::time::timeout(
        Duration::from_secs(shape.seconds + 240),
        driver.wait_with_output(),
    )
    .await
    .expect("producers_proof.py did not end in time")
    .expect("wait for producers_proof.py");
    assert_success("producers_proof.py run", &ran);
    // The per-window lines; the figures' JSON line is read from the file.
    (rest.await.unwrap().iter())
        .filter(|l| !l.starts_with('{'))
        .for_each(|l| println!("{l}"));
    let text = std::fs::read_to_string(&out).expect("the run's figures");
    let figures: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
    let mut summary = figures.clone();
    summary["windows"] = Value::Null;
    println!(
        "figures {:.1} s in: {summary}",
        begun.elapsed().as_secs_f64()
    );
    let svg = (shape.svg.clone()).unwrap_or_else(|| work.path().join("producers_proof.svg"));
    plot(&python, &svg, &out, killed_at).await;

    // The job went on from the stream's real state after the kill: each call made once, the
    // open shards tiling the keyspace, keyspread's map Kinesis'.
    let made = check_calls(&proxy.calls());
    assert_eq!(figures["reshard"]["state"], "done", "{figures}");
    assert_eq!(figures["reshard"]["done"], made, "{figures}");
    let open = check_map(&client, &server.url, &kinesalite.api, STREAM).await;
    assert_eq!(open, TARGET as usize, "{figures}");
    assert_eq!(
        figures["open_shards"],
        serde_json::json!([4, 5, 6]),
        "{figures}"
    );
    assert_proven(&figures, &shape);
}

/// Reshards the stream to [`TARGET`] with the CLI, SIGKILLs `server` once the job's first
/// call is made in Kinesis (its answer held), and starts it again on the same database and
/// port; the CLI follows the job through the restart to its end. Answers when the server
/// was killed (Unix seconds).
async fn reshard_killing_once(
    server: &mut Server,
    proxy: &Proxy,
    database_url: &str,
    log: &Path,
    env: &[(&str, &str)],
) -> f64 {
    proxy.set(Rules {
        hold: Some(1),
        ..Rules::default()
    });
    let cli = Command::new(env!("CARGO_BIN_EXE_keyspread"))
        .args([
            "streams",
            "reshard",
            STREAM,
            "--target",
            &TARGET.to_string(),
        ])
        .args(["--url", &server.url])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("run keyspread streams reshard");
    proxy.held().await;
    server.kill();
    let killed_at = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
    let listen = server.url.trim_start_matches("http://").to_owned();
    let mut again = env.to_vec();
    again.push(("KEYSPREAD_LISTEN", &listen));
    *server = Server::spawn_with(database_url, log, &again);
    server.wait_ready(&reqwest::Client::new()).await;
    proxy.release();
    let followed = tokio::time::timeout(Duration::from_secs(120), cli.wait_with_output())
        .await
        .expect("the reshard did not end within 120 s")
        .expect("wait for keyspread streams reshard");
    assert_success("keyspread streams reshard", &followed);
    killed_at.as_secs_f64()
}

/// Draws the run to `svg` and prints its table.
async fn plot(python: &Path, svg: &Path, figures: &Path, killed_at: f64) {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let plot = Command::new(python)
        .arg(manifest.join("tests/python/producers_proof.py"))
        .arg("plot")
        .arg("--svg")
        .arg(svg)
        .args(["--killed-at", &killed_at.to_string()])
        .arg(figures)
        .output()
        .await
        .expect("run producers_proof.py plot");
    assert_success("producers_proof.py plot", &plot);
    print!("{}", String::from_utf8_lossy(&plot.stdout));
}

/// The contract: every judged window within the bound, every record read once and in
/// order, load known from the producers only, the hot accounts spread, the loop's brakes kept.
fn assert_proven(figures: &Value, shape: &Shape) {
    assert_in_order_and_whole(figures);
    let judged = ratios(figures, "shard", true);
    assert!(judged.len() >= shape.judged, "{figures}");
    for (t, ratio) in judged {
        assert!(
            ratio <= BOUND,
            "busiest shard / mean {ratio} > {BOUND} in the window at {t} s: {figures}"
        );
    }
    let load = &figures["load"];
    assert_eq!(
        load["sources"],
        serde_json::json!({"producers": TARGET}),
        "every shard's load from producers: {figures}"
    );
    let reported = load["records_per_s"].as_f64().unwrap_or(0.0);
    assert!(
        (0.6 * RATE..=1.4 * RATE).contains(&reported),
        "{reported} records/s reported for {RATE} written: {figures}"
    );
    // The hottest account after the rotation carries more than a shard's share: it spread.
    let hottest = figures["hottest_account"]
        .as_str()
        .expect("hottest_account");
    assert!(
        figures["hottest"][hottest].as_u64() > Some(1),
        "{hottest} kept one key: {figures}"
    );
    assert!(figures["moves"].as_u64() > Some(0), "{figures}");
    for n in figures["moves_per_round"].as_array().unwrap() {
        assert!(n.as_u64() <= Some(MAX_MOVES_PER_ROUND), "{figures}");
    }
    assert_eq!(
        figures["moved_within_cooldown"],
        serde_json::json!([]),
        "{figures}"
    );
}
