//! One load controller round's pure work at scale: 1,000,000 accounts over a uniform map of
//! 1,024 shards, Zipf(1.1) loads at 0.7 of the shards' capacity (accounts above half a shard
//! fanned out to ⌈load ÷ 0.5⌉ keys), every account named in the shards' reports, 1 % of the
//! accounts in cooldown, one in a thousand opted in to a raised fanout. The shards' rows are
//! built as the store holds them (each shard's accounts packed, in byte order of their
//! names). A round opens them into each account's total (`LoadTotals::open`, on the blocking
//! thread of its read), copies the accounts, weighs each key by its account's load
//! (`key_loads`), plans by load under the default band and cap (1 % of the accounts), and
//! decides the fanouts: what the controller runs on its blocking threads; fetching the rows
//! from the database is not counted. Single-threaded; run pinned to one core:
//! `taskset -c 1 cargo bench --bench controller_round` (`-- --accounts N` for other sizes).

mod common;
use common::{SplitMix64, arg, zipf_loads};

use std::collections::HashMap;
use std::time::{Duration, Instant};

use criterion::{Criterion, SamplingMode};
use keyspread::config::{ControllerConfig, LoadConfig};
use keyspread::keyspace::{
    AccountId, Allocator, Keyspace, Limits, Rate, ShardMap, suggested_fanout,
};
use keyspread::registry::{
    Held, LoadTotals, StreamLoad, capped_loads, fanout_targets, key_loads, plan_round,
};
use keyspread::store::load::LoadRows;
use keyspread::store::packed::{Entry, Packer};
use keyspread::store::{HashKeys, StreamRow};

/// The database's clock when the rows are read: every rate is as of it.
const NOW: i64 = 1_800_000_000_000;

/// Everything a round reads, as the controller holds it.
struct Round {
    alloc: Allocator,
    map: ShardMap,
    accounts: Vec<(AccountId, Held)>,
    stream: StreamRow,
    rows: LoadRows,
    cooling: Vec<String>,
    capped: Vec<(AccountId, u32, u64, u32)>,
}

fn set_up(accounts: usize, shards: u64) -> Round {
    let map = ShardMap::uniform(Keyspace::KINESIS, shards).expect("shard count");
    let mut rng = SplitMix64(7);
    let loads = zipf_loads(accounts, shards, 0.7, &mut rng);
    let mut alloc = Allocator::new(Keyspace::KINESIS);
    alloc.balance_on(Some(map.clone()));
    let mut held = Vec::with_capacity(accounts);
    let mut utilisation = vec![0.0; map.len()];
    // Per shard, its accounts' entries: (account, records/s).
    let mut entries: Vec<Vec<(String, f64)>> = vec![Vec::new(); map.len()];
    let mut capped = Vec::new();
    for (a, &load) in loads.iter().enumerate() {
        let fanout = suggested_fanout(load, 0.5);
        let keys = alloc
            .allocate_keys(&vec![1; fanout as usize])
            .expect("room");
        let id = AccountId::parse(format!("acct-{:07}", a + 1)).expect("an account id");
        // The account's entry on each shard its keys are on (its keys share its load).
        let mut on: Vec<usize> = keys.iter().map(|&k| map.index_of(k)).collect();
        for &s in &on {
            utilisation[s] += load / f64::from(fanout);
        }
        on.sort_unstable();
        for (s, n) in dedup_counts(&on) {
            let share = load * n as f64 / f64::from(fanout);
            entries[s].push((id.as_str().to_owned(), share));
        }
        if a % 1000 == 0 {
            capped.push((id.clone(), fanout, u64::from(fanout), 16));
        }
        held.push((
            id,
            Held {
                keys: HashKeys::from_vec(keys),
                weight: u64::from(fanout),
                created_at: 0,
                switching: Vec::new(),
                max_fanout: None,
            },
        ));
    }
    let rows = LoadRows::packed(entries.into_iter().enumerate().map(|(s, mut entries)| {
        entries.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        let mut packed = Packer::new(NOW, entries.len());
        for (account, records_per_s) in &entries {
            packed.push(Entry {
                account,
                records_per_s: *records_per_s,
                bytes_per_s: 0.0,
            });
        }
        let rate = Rate {
            records_per_s: utilisation[s],
            bytes_per_s: 0.0,
            at_ms: NOW,
        };
        (map.shard(s).id, rate, 5_000, packed.finish())
    }));
    let stream = StreamRow {
        name: "s".to_owned(),
        shards: map.iter().map(|s| (s.id, s.start, s.end)).collect(),
        next_shard: map.len() as u64,
        primary: true,
        updated_at: NOW,
        version: 1,
        listed: None,
        watch: false,
        kinesis: None,
        sync: Default::default(),
    };
    let cooling = (held.iter().step_by(100))
        .map(|(id, _)| id.as_str().to_owned())
        .collect();
    Round {
        alloc,
        map,
        accounts: held,
        stream,
        rows,
        cooling,
        capped,
    }
}

/// Each distinct value of sorted `xs` with how often it occurs.
fn dedup_counts(xs: &[usize]) -> Vec<(usize, usize)> {
    let mut out: Vec<(usize, usize)> = Vec::new();
    for &x in xs {
        match out.last_mut() {
            Some((last, n)) if *last == x => *n += 1,
            _ => out.push((x, 1)),
        }
    }
    out
}

fn main() {
    let accounts = arg("--accounts", 1_000_000) as usize;
    let shards = arg("--shards", 1024);
    let started = Instant::now();
    let mut r = set_up(accounts, shards);
    let keys: usize = r.accounts.iter().map(|(_, h)| h.keys.len()).sum();
    // A shard takes one record/s: the rows' rates are the loads themselves, to the bit.
    let config = LoadConfig {
        limits: Limits {
            records_per_s: 1.0,
            bytes_per_s: 1.0,
        },
        ..LoadConfig::default()
    };
    let open = |r: &Round| LoadTotals::open(&r.stream, &r.rows, NOW, &config).expect("rows");
    let load = open(&r);
    eprintln!(
        "set up {keys} keys of {accounts} accounts, {} accounts named, in {:.1} s",
        load.accounts.len(),
        started.elapsed().as_secs_f64()
    );
    let controller = ControllerConfig::default();
    let plan = plan_round(
        &mut r.alloc,
        &r.map,
        &load,
        &r.accounts,
        &r.cooling,
        &controller,
    );
    println!(
        "controller_round: {keys} keys, {shards} shards: {} moves, busiest ÷ mean {:.3} -> {:.3}",
        plan.moves.len(),
        plan.before.max_over_mean,
        plan.after.max_over_mean
    );
    // Where a round's time goes, part by part (3 runs each, the median), in wall-clock time
    // and in this thread's CPU time (what the part cost, whatever else the core ran).
    let part = |name: &str, mut run: Box<dyn FnMut() + '_>| {
        let mut times: Vec<(f64, f64)> = (0..3)
            .map(|_| {
                let (started, cpu) = (Instant::now(), cpu_ms());
                run();
                (started.elapsed().as_secs_f64() * 1e3, cpu_ms() - cpu)
            })
            .collect();
        times.sort_by(|a, b| a.0.total_cmp(&b.0));
        let wall = times[1].0;
        times.sort_by(|a, b| a.1.total_cmp(&b.1));
        println!(
            "controller_round part: {name} {wall:.0} ms ({:.0} ms CPU)",
            times[1].1
        );
    };
    part("open the rows into totals", Box::new(|| drop(open(&r))));
    part(
        "open the rows as GET /load lists them (not in a round)",
        Box::new(|| drop(StreamLoad::open(&r.stream, &r.rows, NOW, &config))),
    );
    part("copy the accounts", Box::new(|| drop(r.accounts.clone())));
    part(
        "key loads",
        Box::new(|| drop(key_loads(&r.map, &load, &r.accounts))),
    );
    part(
        "fanout decisions",
        Box::new(|| {
            let loads = capped_loads(&load, &r.capped);
            drop(fanout_targets(
                &loads,
                r.capped.clone(),
                0.5,
                &HashMap::new(),
                0,
                i64::MAX,
            ))
        }),
    );
    drop(load);
    part(
        "one round, all of it",
        Box::new(|| {
            round(&mut r, &config, &controller);
        }),
    );
    let mut c = Criterion::default().configure_from_args();
    let mut group = c.benchmark_group("controller_round");
    group
        .sampling_mode(SamplingMode::Flat)
        .sample_size(10)
        .warm_up_time(Duration::from_millis(1))
        .measurement_time(Duration::from_secs(1));
    group.bench_function(format!("{accounts}_accounts_{shards}_shards"), |b| {
        b.iter(|| round(&mut r, &config, &controller))
    });
    group.finish();
    c.final_summary();
}

/// One round: the round's read opens the rows, then the controller copies the accounts out
/// of their lock, plans, and decides the fanouts. Answers the moves and the fanout changes.
fn round(r: &mut Round, config: &LoadConfig, controller: &ControllerConfig) -> (usize, usize) {
    let load = LoadTotals::open(&r.stream, &r.rows, NOW, config).expect("rows");
    let accounts = r.accounts.clone();
    let plan = plan_round(
        &mut r.alloc,
        &r.map,
        &load,
        &accounts,
        &r.cooling,
        controller,
    );
    let loads = capped_loads(&load, &r.capped);
    let fanouts = fanout_targets(&loads, r.capped.clone(), 0.5, &HashMap::new(), 0, i64::MAX);
    (plan.moves.len(), fanouts.changes.len())
}

/// This thread's CPU time so far, in milliseconds.
fn cpu_ms() -> f64 {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime only writes the timespec it is given.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut t) };
    t.tv_sec as f64 * 1e3 + t.tv_nsec as f64 / 1e6
}
