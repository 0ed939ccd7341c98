//! What a mirror costs and how far behind it runs, against a running keyspread:
//!
//!     cargo run --release -p keyspread-client --example mirror_bench -- \
//!         --url http://127.0.0.1:8080 [--write-url http://127.0.0.1:8081] [--changes 200]
//!
//! Prints the time from `Mirror::start` to a ready table (the whole snapshot read and
//! indexed), in-process lookups per second on one thread (`keys` and `key_for` over the
//! first thousand accounts the server lists), and the latency from a committed change (the
//! answer to a `POST /keys/...` sent to `--write-url`, by default the mirror's own server;
//! another replica shows the follower's lag too) to the mirror answering it, p50 and p99.
//! Allocates `--changes` accounts named `mirror-bench-<pid>-<n>` and releases them again.

use std::time::{Duration, Instant};

use keyspread_client::Mirror;

fn arg(args: &[String], name: &str) -> Option<String> {
    let at = args.iter().position(|a| a == name)?;
    args.get(at + 1).cloned()
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let url = arg(&args, "--url").unwrap_or_else(|| "http://127.0.0.1:8080".into());
    let write_url = arg(&args, "--write-url").unwrap_or_else(|| url.clone());
    let changes: usize = arg(&args, "--changes").map_or(Ok(200), |n| n.parse())?;

    let started = Instant::now();
    let mirror = Mirror::start(&url).await?;
    let ready = started.elapsed();
    println!(
        "snapshot to a ready mirror: {:.3} s for {} accounts (event {})",
        ready.as_secs_f64(),
        mirror.len(),
        mirror.event_id()
    );

    let http = reqwest::Client::new();
    let page: serde_json::Value = (http.get(format!("{url}/keys?limit=1000")).send().await?)
        .json()
        .await?;
    let names: Vec<String> = (page["items"].as_array().ok_or("GET /keys: no items")?)
        .iter()
        .filter_map(|a| a["account"].as_str().map(str::to_owned))
        .collect();
    if names.is_empty() {
        return Err("the server holds no accounts to look up".into());
    }
    for (what, by_sub_key) in [("keys", false), ("key_for", true)] {
        let (mut n, mut found) = (0u64, 0u64);
        let until = Instant::now() + Duration::from_secs(2);
        let began = Instant::now();
        let cpu_began = thread_cpu();
        while Instant::now() < until {
            for name in &names {
                let hit = if by_sub_key {
                    mirror.key_for(name, "order-17")?.is_some()
                } else {
                    mirror.keys(name)?.is_some()
                };
                found += u64::from(hit);
                n += 1;
            }
        }
        let rate = n as f64 / began.elapsed().as_secs_f64();
        let per_cpu = n as f64 / (thread_cpu() - cpu_began).as_secs_f64();
        println!(
            "in-process {what}: {:.1} million lookups per CPU second of this thread ({:.1} million per wall second; {found} of {n} found)",
            per_cpu / 1e6,
            rate / 1e6
        );
    }

    let mut latencies = Vec::with_capacity(changes);
    let prefix = format!("mirror-bench-{}", std::process::id());
    for n in 0..changes {
        let account = format!("{prefix}-{n}");
        let response = http
            .post(format!("{write_url}/keys/{account}"))
            .send()
            .await?;
        if !response.status().is_success() {
            return Err(format!("POST /keys/{account}: {}", response.status()).into());
        }
        let committed = Instant::now();
        while mirror.keys(&account)?.is_none() {
            if committed.elapsed() > Duration::from_secs(10) {
                return Err(format!("{account} not mirrored within 10 s").into());
            }
            tokio::time::sleep(Duration::from_micros(200)).await;
        }
        latencies.push(committed.elapsed());
    }
    for n in 0..changes {
        http.delete(format!("{write_url}/keys/{prefix}-{n}"))
            .send()
            .await?;
    }
    latencies.sort();
    let at = |q: f64| latencies[((latencies.len() - 1) as f64 * q) as usize];
    println!(
        "commit to mirror ({} changes, written to {write_url}, mirrored from {url}): p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms",
        latencies.len(),
        at(0.5).as_secs_f64() * 1e3,
        at(0.99).as_secs_f64() * 1e3,
        latencies.last().unwrap().as_secs_f64() * 1e3
    );
    Ok(())
}

/// CPU time this thread has used: other processes on the machine do not count.
fn thread_cpu() -> Duration {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `t` is a valid timespec for the call to fill.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut t) };
    Duration::new(t.tv_sec as u64, t.tv_nsec as u32)
}
