//! Resident memory of one allocator holding 1,000,000 keys the walk allocated, and of one
//! holding 1,000,000 imported random keys. Each case runs in a child process of its own so
//! its peak (VmHWM) is its own. Run with `cargo bench --bench memory` (Linux: reads /proc).

mod common;
use common::SplitMix64;

use std::hint::black_box;
use std::process::Command;
use std::time::Instant;

use keyspread::keyspace::{Allocator, HashKey, Keyspace};

const KEYS: u64 = 1_000_000;
/// Set in a child process to the case it measures.
const CASE_VAR: &str = "KEYSPREAD_MEMORY_CASE";
const CASES: [&str; 2] = ["allocated", "imported"];

/// Current and peak resident set size in KiB, from /proc/self/status.
fn resident_kib() -> (u64, u64) {
    let status = std::fs::read_to_string("/proc/self/status").expect("Linux /proc/self/status");
    let field = |name: &str| {
        status
            .lines()
            .find_map(|line| line.strip_prefix(name))
            .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or_else(|| panic!("{name} in /proc/self/status"))
    };
    (field("VmRSS:"), field("VmHWM:"))
}

fn measure(case: &str) {
    let (rss_before, hwm_before) = resident_kib();
    let mut alloc = Allocator::new(Keyspace::KINESIS);
    let start = Instant::now();
    match case {
        "allocated" => {
            for _ in 0..KEYS {
                alloc.allocate(1).expect("the keyspace is far from full");
            }
        }
        "imported" => {
            let mut rng = SplitMix64(1);
            while alloc.total().count < KEYS {
                let _ = alloc.insert(HashKey(rng.next_u128()), 1);
            }
        }
        other => panic!("unknown case {other}"),
    }
    let elapsed = start.elapsed();
    let (rss_after, hwm_after) = resident_kib();
    black_box(&alloc);
    let per_key = |kib: u64| (kib * 1024) as f64 / KEYS as f64;
    println!(
        "{case}: {KEYS} keys in {:.2} s; VmRSS {rss_before} -> {rss_after} KiB \
         ({:.0} bytes/key); VmHWM {hwm_before} -> {hwm_after} KiB ({:.0} bytes/key at peak)",
        elapsed.as_secs_f64(),
        per_key(rss_after - rss_before),
        per_key(hwm_after - hwm_before),
    );
}

fn main() {
    if let Ok(case) = std::env::var(CASE_VAR) {
        return measure(&case);
    }
    let exe = std::env::current_exe().expect("path of this bench binary");
    for case in CASES {
        let status = Command::new(&exe)
            .env(CASE_VAR, case)
            .status()
            .expect("run the bench binary for one case");
        assert!(status.success(), "case {case} failed: {status}");
    }
}
