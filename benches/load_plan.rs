//! A by-load plan at scale: 1,000,000 accounts over 1,024 shards, Zipf(1.1) loads at 0.7 of
//! capacity (hot accounts fanned out so no key carries more than half a shard), 1 % of the
//! accounts frozen, one round of at most 1 % of the keys: with the default band of 10 %, and
//! with no band (every move up to the cap, the most a round can cost). Prints the planner's
//! time per round (one core: the planner is single-threaded). Run with
//! `cargo bench --bench load_plan` (`-- --accounts N --shards S --runs R` for other sizes).

mod common;
use common::{SplitMix64, arg, zipf_loads};

use std::collections::HashSet;
use std::time::Instant;

use keyspread::keyspace::{
    Allocator, HashKey, KeyLoad, Keyspace, LoadPlanLimits, ShardMap, plan_by_load, suggested_fanout,
};

fn main() {
    let accounts = arg("--accounts", 1_000_000) as usize;
    let shards = arg("--shards", 1024);
    let runs = arg("--runs", 5).max(1);
    let map = ShardMap::uniform(Keyspace::KINESIS, shards).expect("shard count");
    let mut rng = SplitMix64(7);

    let loads = zipf_loads(accounts, shards, 0.7, &mut rng);

    let started = Instant::now();
    let names: Vec<String> = (1..=accounts).map(|i| format!("acct-{i:07}")).collect();
    let mut alloc = Allocator::new(Keyspace::KINESIS);
    alloc.balance_on(Some(map.clone()));
    let mut held: Vec<(usize, u32, u32, HashKey, f64)> = Vec::with_capacity(accounts + 1000);
    for (a, &load) in loads.iter().enumerate() {
        let fanout = suggested_fanout(load, 0.5);
        let keys = alloc
            .allocate_keys(&vec![1; fanout as usize])
            .expect("room");
        for (i, key) in keys.into_iter().enumerate() {
            held.push((a, i as u32, fanout, key, load / f64::from(fanout)));
        }
    }
    let keys: Vec<KeyLoad<'_>> = held
        .iter()
        .map(|&(a, index, fanout, key, load)| KeyLoad {
            account: &names[a],
            index,
            fanout,
            key,
            weight: 1,
            load,
        })
        .collect();
    let frozen: HashSet<&str> = names.iter().step_by(100).map(String::as_str).collect();
    eprintln!(
        "set up {} keys of {accounts} accounts in {:.1} s",
        keys.len(),
        started.elapsed().as_secs_f64()
    );
    for tolerance in [0.10, 0.0] {
        let limits = LoadPlanLimits {
            tolerance,
            max_moves: keys.len() / 100,
        };
        let mut times = Vec::new();
        let mut last = None;
        for _ in 0..runs {
            let started = Instant::now();
            let plan = plan_by_load(&mut alloc, &map, &keys, &frozen, limits);
            times.push(started.elapsed().as_secs_f64());
            last = Some(plan);
        }
        times.sort_by(f64::total_cmp);
        let plan = last.expect("one run");
        println!(
            "load_plan: {} keys, {shards} shards, band {tolerance}, cap {} moves: {} moves, \
             max ÷ mean {:.3} -> {:.3}; per round median {:.0} ms, min {:.0} ms, max {:.0} ms \
             ({runs} runs)",
            keys.len(),
            limits.max_moves,
            plan.moves.len(),
            plan.before.max_over_mean,
            plan.after.max_over_mean,
            times[times.len() / 2] * 1e3,
            times[0] * 1e3,
            times[times.len() - 1] * 1e3,
        );
    }
}
