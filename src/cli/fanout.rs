//! `keyspread simulate --fanout K`: an account's K keys as MD5 of `account#i` (the suffix
//! of a suffixed partition key) against keyspread's placement, on a uniform map.

use std::fmt::Write as _;

use crate::keyspace::{self, Allocator, HashKey, Keyspace, ShardMap};

/// What `simulate --fanout` measures.
#[derive(Debug, Clone, PartialEq)]
pub struct FanoutFigures {
    /// Share of trial accounts whose keys lie on min(K, S) distinct shards, by MD5.
    pub md5_distinct: f64,
    /// The same share for keys keyspread placed.
    pub keyspread_distinct: f64,
    /// The probability for K uniformly random keys.
    pub chance_distinct: f64,
    /// Share of trial accounts whose keys lie ⌊K/S⌋ or ⌈K/S⌉ a shard, by MD5 (the same as
    /// on distinct shards when K ≤ S).
    pub md5_even: f64,
    /// The same share for keys keyspread placed.
    pub keyspread_even: f64,
    /// The probability for K uniformly random keys.
    pub chance_even: f64,
    /// Heaviest shard's weight over the mean, by MD5, for the load accounts.
    pub md5_max_over_mean: f64,
    /// The same ratio for keyspread.
    pub keyspread_max_over_mean: f64,
}

/// Measures `trials` accounts "acct-1".. for the shares on distinct shards and `accounts`
/// accounts of equal weight (`fanout`, 1 a key) for the load, each with `fanout` keys on a
/// uniform map of `shards`. keyspread's accounts are placed one after another on one
/// allocator balanced on that map, as a server with it as the primary stream places them.
pub fn fanout_figures(
    fanout: u32,
    shards: u64,
    accounts: u64,
    trials: u64,
    keyspace: Keyspace,
) -> Result<FanoutFigures, keyspace::Error> {
    let fanout = keyspace::check_fanout(u64::from(fanout))?;
    let map = ShardMap::uniform(keyspace, shards)?;
    let weight = u64::from(fanout);
    let weights: Vec<u64> = (0..fanout)
        .map(|i| keyspace::key_weight(weight, fanout, i))
        .collect();
    let md5_keys = |account: u64| -> Vec<HashKey> {
        (0..fanout)
            .map(|i| keyspace::md5_hash(&format!("acct-{account}#{i}"), keyspace))
            .collect()
    };
    let spread = (fanout as usize).min(map.len());
    let (fewest, most) = (
        fanout as usize / map.len(),
        (fanout as usize).div_ceil(map.len()),
    );
    // (on distinct shards, and fewest..=most a shard)
    let placed = |keys: &[HashKey]| -> [bool; 2] {
        let mut per_shard = vec![0usize; map.len()];
        keys.iter().for_each(|k| per_shard[map.index_of(*k)] += 1);
        [
            per_shard.iter().filter(|n| **n > 0).count() == spread,
            per_shard.iter().all(|n| (fewest..=most).contains(n)),
        ]
    };
    let balanced = || {
        let mut alloc = Allocator::new(keyspace);
        alloc.balance_on(Some(map.clone()));
        alloc
    };

    // hits[by][test]: by MD5, by keyspread; on distinct shards, evenly.
    let mut hits = [[0u64; 2]; 2];
    let mut trial_alloc = balanced();
    for account in 1..=trials {
        let keys = [md5_keys(account), trial_alloc.allocate_keys(&weights)?];
        for (hit, keys) in hits.iter_mut().zip(&keys) {
            for (count, ok) in hit.iter_mut().zip(placed(keys)) {
                *count += u64::from(ok);
            }
        }
    }

    let mut md5_loads = vec![0u64; map.len()];
    let mut load_alloc = balanced();
    for account in 1..=accounts {
        for (key, w) in md5_keys(account).into_iter().zip(&weights) {
            md5_loads[map.index_of(key)] += w;
        }
        load_alloc.allocate_keys(&weights)?;
    }
    let keyspread_loads: Vec<u64> = map
        .iter()
        .map(|s| load_alloc.load_in(s.start, s.end).weight)
        .collect();

    let share = |hits: u64| hits as f64 / trials.max(1) as f64;
    Ok(FanoutFigures {
        md5_distinct: share(hits[0][0]),
        keyspread_distinct: share(hits[1][0]),
        chance_distinct: chance_of_distinct(fanout, shards),
        md5_even: share(hits[0][1]),
        keyspread_even: share(hits[1][1]),
        chance_even: chance_of_even(fanout, shards),
        md5_max_over_mean: max_over_mean(&md5_loads),
        keyspread_max_over_mean: max_over_mean(&keyspread_loads),
    })
}

/// The heaviest load over the mean load (0 when there is none).
fn max_over_mean(loads: &[u64]) -> f64 {
    let total: u64 = loads.iter().sum();
    let max = loads.iter().copied().max().unwrap_or(0);
    if total == 0 {
        0.0
    } else {
        max as f64 * loads.len() as f64 / total as f64
    }
}

/// The probability that `fanout` uniformly random keys hit min(fanout, shards) shards.
fn chance_of_distinct(fanout: u32, shards: u64) -> f64 {
    let s = shards as f64;
    let target = u64::from(fanout).min(shards) as usize;
    // hit[d]: the probability that the keys drawn so far hit exactly d shards; never more
    // than `target`, as no more keys are drawn and no more shards exist.
    let mut hit = vec![0.0; target + 1];
    hit[0] = 1.0;
    for _ in 0..fanout {
        for d in (1..=target).rev() {
            hit[d] = hit[d] * d as f64 / s + hit[d - 1] * (s - (d - 1) as f64) / s;
        }
        hit[0] = 0.0;
    }
    hit[target]
}

/// The probability that `fanout` uniformly random keys hit every shard ⌊K/S⌋ or ⌈K/S⌉
/// times: which `r = K mod S` shards take one more, times the multinomial, over S^K.
fn chance_of_even(fanout: u32, shards: u64) -> f64 {
    let ln_factorial = |n: u64| (2..=n).map(|i| (i as f64).ln()).sum::<f64>();
    let (k, s) = (u64::from(fanout), shards);
    let (q, r) = (k / s, k % s);
    let ln_ways = ln_factorial(s) - ln_factorial(r) - ln_factorial(s - r) + ln_factorial(k)
        - r as f64 * ln_factorial(q + 1)
        - (s - r) as f64 * ln_factorial(q);
    (ln_ways - k as f64 * (s as f64).ln()).exp()
}

/// The report `simulate --fanout` prints.
pub fn simulate_fanout(
    fanout: u32,
    shards: u64,
    accounts: u64,
    trials: u64,
    keyspace: Keyspace,
) -> Result<String, keyspace::Error> {
    let f = fanout_figures(fanout, shards, accounts, trials, keyspace)?;
    let k = u64::from(fanout);
    let mut out = format!(
        "fanout {fanout} (keys \"account#0\"..\"account#{}\" by MD5) on a uniform map of {shards} shards\n",
        fanout - 1
    );
    let line = &mut out;
    let header = ("", "MD5", "keyspread", "random");
    writeln!(
        line,
        "{:<42}{:>10}{:>12}{:>10}",
        header.0, header.1, header.2, header.3
    )
    .expect("string");
    let mut shares = |label: String, [md5, ours, chance]: [f64; 3]| {
        let [md5, ours, chance] = [md5, ours, chance].map(|x| 100.0 * x);
        writeln!(line, "{label:<42}{md5:>8.2} %{ours:>10.2} %{chance:>8.2} %").expect("string");
    };
    shares(
        format!("on {} distinct shards, of {trials} accounts", k.min(shards)),
        [f.md5_distinct, f.keyspread_distinct, f.chance_distinct],
    );
    if k > shards {
        let (q, r) = (k / shards, k % shards);
        let each = if r == 0 {
            format!("{q}")
        } else {
            format!("{q} or {}", q + 1)
        };
        shares(
            format!("  and {each} keys on each"),
            [f.md5_even, f.keyspread_even, f.chance_even],
        );
    }
    let label = format!("heaviest shard / mean, {accounts} accounts");
    let (md5, ours) = (f.md5_max_over_mean, f.keyspread_max_over_mean);
    writeln!(line, "{label:<42}{md5:>10.3}{ours:>12.3}").expect("string");
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn figures(fanout: u32, shards: u64, trials: u64) -> FanoutFigures {
        fanout_figures(fanout, shards, 100, trials, Keyspace::KINESIS).unwrap()
    }

    #[test]
    fn chance_of_distinct_shards() {
        // 4!/4^4, the figure README gives; 16!/12!/16^4; and every one of 4 shards hit by 8 keys:
        // 4! S(8,4) / 4^8 with the Stirling number S(8,4) = 1701.
        for (fanout, shards, want) in [
            (4, 4, 24.0 / 256.0),
            (4, 16, 16.0 * 15.0 * 14.0 * 13.0 / 65536.0),
            (8, 4, 24.0 * 1701.0 / 65536.0),
            (1, 4, 1.0),
        ] {
            let got = chance_of_distinct(fanout, shards);
            assert!(
                (got - want).abs() < 1e-12,
                "{fanout} on {shards}: {got} vs {want}"
            );
        }
        // 2 keys a shard: 8!/(2!^4) of the 4^8 ways; 2, 2, 1: 3 * 5!/(2! 2! 1!) of 3^5.
        for (fanout, shards, want) in [
            (8, 4, 40320.0 / 16.0 / 65536.0),
            (5, 3, 3.0 * 30.0 / 243.0),
            (4, 4, 24.0 / 256.0),
            (4, 16, 16.0 * 15.0 * 14.0 * 13.0 / 65536.0),
        ] {
            let got = chance_of_even(fanout, shards);
            assert!(
                (got - want).abs() < 1e-12,
                "{fanout} on {shards}: {got} vs {want}"
            );
        }
    }

    #[test]
    fn md5_suffixes_land_on_distinct_shards_by_chance_only() {
        for (fanout, shards) in [(4, 4), (8, 4), (2, 16), (16, 8)] {
            let f = figures(fanout, shards, 10_000);
            // 10,000 trials: a standard deviation of at most 0.5 percentage points.
            assert!(
                (f.md5_distinct - f.chance_distinct).abs() < 0.02,
                "{fanout} on {shards}: {} vs chance {}",
                f.md5_distinct,
                f.chance_distinct
            );
            assert_eq!(f.keyspread_distinct, 1.0, "{fanout} on {shards}");
            assert!(
                (f.md5_even - f.chance_even).abs() < 0.02,
                "{fanout} on {shards}: {} vs chance {}",
                f.md5_even,
                f.chance_even
            );
            assert_eq!(f.keyspread_even, 1.0, "{fanout} on {shards}");
        }
        let seed = figures(4, 4, 10_000);
        assert!(
            (0.08..0.11).contains(&seed.md5_distinct),
            "{}",
            seed.md5_distinct
        );
    }

    #[test]
    fn keyspread_loads_shards_evenly_where_md5_does_not() {
        // 100 accounts of 4 keys: 400 keys, exactly 100 a shard.
        let f = figures(4, 4, 100);
        assert_eq!(f.keyspread_max_over_mean, 1.0);
        assert!(f.md5_max_over_mean > 1.05, "{}", f.md5_max_over_mean);
        // 100 accounts of 3 keys on 8 shards: 300 keys, at most 38 on one (mean 37.5).
        let f = figures(3, 8, 100);
        assert_eq!(f.keyspread_max_over_mean, 38.0 / 37.5);
    }

    #[test]
    fn output_names_both_sides() {
        let figures = |out: &str, label: &str| -> Vec<String> {
            let line = out.lines().find(|l| l.starts_with(label)).expect(label);
            line[42..].split_whitespace().map(str::to_owned).collect()
        };
        let out = simulate_fanout(4, 4, 100, 1000, Keyspace::KINESIS).unwrap();
        let distinct = figures(&out, "on 4 distinct shards, of 1000 accounts");
        assert_eq!(distinct[2..], ["100.00", "%", "9.38", "%"], "{out}");
        assert!(!out.contains("keys on each"), "{out}");
        let load = figures(&out, "heaviest shard / mean, 100 accounts");
        assert_eq!(load[1], "1.000", "{out}");
        let out = simulate_fanout(5, 3, 10, 1000, Keyspace::KINESIS).unwrap();
        let even = figures(&out, "  and 1 or 2 keys on each");
        assert_eq!(even[2..], ["100.00", "%", "37.04", "%"], "{out}");
    }
}
