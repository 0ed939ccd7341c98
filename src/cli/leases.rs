//! `keyspread simulate leases`: which worker reads which shard under a hash ring,
//! a taker modelled on the Kinesis Client Library's, and keyspread's assignment.
//!
//! The shards carry the weight of accounts placed on them by MD5 of their names (what
//! Kinesis does with partition keys), with a few heavy accounts among many light ones; the
//! ring and the taker see only lease counts, keyspread sees the weights.

use std::fmt::Write as _;

use crate::keyspace::leases::{self, Owners};
use crate::keyspace::{self, Keyspace, ShardMap};

/// One scheme's figures, averaged over the trials.
#[derive(Debug, Clone, PartialEq)]
pub struct SchemeFigures {
    pub scheme: &'static str,
    /// Most leases a worker holds over the mean, after a cold start.
    pub busiest_by_count: f64,
    /// Most weight a worker holds over the mean, after a cold start.
    pub busiest_by_weight: f64,
    /// Workers holding no lease, after a cold start.
    pub idle: f64,
    /// Leases taken from one live worker and given to another when one worker joins.
    pub moved_on_join: f64,
    /// The same when one worker leaves (its own leases, which must move, not counted).
    pub moved_on_leave: f64,
}

/// Shard weights: `10 × shards` accounts "acct-1".. of weights 1 to 1,000 (most light, a
/// few heavy), each on the shard MD5 of its name lands on; every shard weighs at least 1.
pub fn shard_weights(shards: u64) -> Result<Vec<u64>, keyspace::Error> {
    let map = ShardMap::uniform(Keyspace::KINESIS, shards)?;
    let mut weights = vec![0u64; map.len()];
    for i in 1..=10 * shards {
        let name = format!("acct-{i}");
        let key = keyspace::md5_hash(&name, Keyspace::KINESIS);
        // A Zipf-like weight from the name's hash: 1 for most, up to 1,000 for a few.
        let draw = (key.0 >> 64) as u64 % 1000;
        weights[map.index_of(key)] += 1000 / (1 + draw);
    }
    Ok(weights.into_iter().map(|w| w.max(1)).collect())
}

/// splitmix64: a small seeded generator for the taker's random choices.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: usize) -> usize {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        ((z ^ (z >> 31)) % n as u64) as usize
    }
}

/// The hash ring: the hash of stream and shard id, as a fraction of the hash space,
/// picks a worker from the sorted list of names. `workers` are the live workers' numbers.
fn ring(shards: usize, workers: &[usize], stream: &str) -> Owners {
    let mut names: Vec<String> = workers.iter().map(|w| format!("worker-{w:04}")).collect();
    names.sort();
    (0..shards)
        .map(|s| {
            let digest = md5_u64(&format!("{stream}/shardId-{s:012}"));
            let slot = ((u128::from(digest) * names.len() as u128) >> 64) as usize;
            let name = &names[slot];
            Some(name[7..].parse().expect("a worker number"))
        })
        .collect()
}

fn md5_u64(text: &str) -> u64 {
    (keyspace::md5_hash(text, Keyspace::KINESIS).0 >> 64) as u64
}

/// One lease-taking pass of worker `me`, as the KCL's lease taker makes it: workers are
/// those holding leases, plus `me`; the target is ⌈leases / workers⌉; `me` takes unowned
/// leases up to it, and only when none is left steals one from the most loaded worker
/// (if that one holds more than the target, or holds the target while `me` needs two).
fn take(owners: &mut Owners, me: usize, rng: &mut Rng) -> bool {
    let mut counts: std::collections::BTreeMap<usize, usize> = Default::default();
    owners
        .iter()
        .flatten()
        .for_each(|w| *counts.entry(*w).or_default() += 1);
    counts.entry(me).or_default();
    let n = owners.len();
    let target = if counts.len() >= n {
        1
    } else {
        n.div_ceil(counts.len())
    };
    let mine = counts[&me];
    if mine >= target {
        return false;
    }
    let needed = target - mine;
    let mut unowned: Vec<usize> = (0..n).filter(|&s| owners[s].is_none()).collect();
    if !unowned.is_empty() {
        for _ in 0..needed.min(unowned.len()) {
            let s = unowned.swap_remove(rng.below(unowned.len()));
            owners[s] = Some(me);
        }
        return true;
    }
    let (&most, &count) = counts
        .iter()
        .max_by_key(|(w, c)| (**c, std::cmp::Reverse(**w)))
        .expect("me at least");
    let mut steal = count.saturating_sub(target).min(needed);
    if count >= target && needed > 1 && steal == 0 {
        steal = 1;
    }
    if steal == 0 || most == me {
        return false;
    }
    let theirs: Vec<usize> = (0..n).filter(|&s| owners[s] == Some(most)).collect();
    owners[theirs[rng.below(theirs.len())]] = Some(me);
    true
}

/// Runs taker passes of `workers` (in order, each pass one worker) until a whole round
/// changes nothing, or 10,000 rounds; `starting` workers join one round apart.
fn settle(owners: &mut Owners, workers: &[usize], staggered: bool, rng: &mut Rng) {
    for round in 0..10_000 {
        let started = if staggered {
            (round + 1).min(workers.len())
        } else {
            workers.len()
        };
        let mut changed = false;
        for &w in &workers[..started] {
            changed |= take(owners, w, rng);
        }
        if !changed && started == workers.len() {
            return;
        }
    }
}

/// Leases moved between live workers from `before` to `after`; the leaver's excluded.
fn moved(before: &Owners, after: &Owners, leaver: Option<usize>) -> usize {
    before
        .iter()
        .zip(after)
        .filter(|(b, a)| b.is_some() && *b != &leaver && b != a)
        .count()
}

/// (busiest by count, by weight, over the mean; idle workers).
fn spread(weights: &[u64], workers: &[usize], owners: &Owners) -> (f64, f64, f64) {
    let (mut counts, mut loads) = (vec![0u64; workers.len()], vec![0u64; workers.len()]);
    for (s, owner) in owners.iter().enumerate() {
        let w = workers
            .iter()
            .position(|w| Some(*w) == *owner)
            .expect("a live owner");
        counts[w] += 1;
        loads[w] += weights[s];
    }
    let mean_count = weights.len() as f64 / workers.len() as f64;
    let mean_load = weights.iter().sum::<u64>() as f64 / workers.len() as f64;
    let max = |v: &[u64]| *v.iter().max().unwrap_or(&0) as f64;
    let idle = counts.iter().filter(|&&c| c == 0).count() as f64;
    (max(&counts) / mean_count, max(&loads) / mean_load, idle)
}

/// keyspread's assignment over live worker numbers, keeping what `current` allows.
fn keyspread(weights: &[u64], workers: &[usize], current: &Owners) -> Owners {
    let index: Vec<Option<usize>> = current
        .iter()
        .map(|o| o.and_then(|w| workers.iter().position(|x| *x == w)))
        .collect();
    leases::assign(weights, workers.len(), &index)
        .into_iter()
        .map(|o| o.map(|i| workers[i]))
        .collect()
}

/// Figures for the three schemes over `trials` streams (the ring hashes the stream's name,
/// the taker's random choices are seeded by the trial): cold start of `workers` workers,
/// then worker `workers` joins, and (from the cold start) worker 0 leaves.
pub fn lease_figures(
    shards: u64,
    workers: usize,
    trials: u64,
) -> Result<Vec<SchemeFigures>, keyspace::Error> {
    let weights = shard_weights(shards)?;
    let n = weights.len();
    let live: Vec<usize> = (0..workers).collect();
    let joined: Vec<usize> = (0..=workers).collect();
    let left: Vec<usize> = (1..workers).collect();
    let mut sums = [[0f64; 5]; 3];
    for t in 0..trials {
        let stream = format!("stream-{t}");
        let mut rng = Rng(t);
        let cold = [
            ring(n, &live, &stream),
            {
                let mut owners = vec![None; n];
                settle(&mut owners, &live, true, &mut rng);
                owners
            },
            keyspread(&weights, &live, &vec![None; n]),
        ];
        for (scheme, owners) in cold.iter().enumerate() {
            let (by_count, by_weight, idle) = spread(&weights, &live, owners);
            let (after_join, after_leave) = match scheme {
                0 => (ring(n, &joined, &stream), ring(n, &left, &stream)),
                1 => {
                    let mut join = owners.clone();
                    settle(&mut join, &joined, false, &mut rng);
                    let mut leave: Owners = owners.iter().map(|o| o.filter(|w| *w != 0)).collect();
                    settle(&mut leave, &left, false, &mut rng);
                    (join, leave)
                }
                _ => (
                    keyspread(&weights, &joined, owners),
                    keyspread(&weights, &left, owners),
                ),
            };
            let figures = [
                by_count,
                by_weight,
                idle,
                moved(owners, &after_join, None) as f64,
                moved(owners, &after_leave, Some(0)) as f64,
            ];
            for (sum, figure) in sums[scheme].iter_mut().zip(figures) {
                *sum += figure;
            }
        }
    }
    let names = ["hash ring", "KCL-style lease taker", "keyspread"];
    Ok(names
        .into_iter()
        .zip(sums)
        .map(|(scheme, s)| {
            let mean = |i: usize| s[i] / trials as f64;
            SchemeFigures {
                scheme,
                busiest_by_count: mean(0),
                busiest_by_weight: mean(1),
                idle: mean(2),
                moved_on_join: mean(3),
                moved_on_leave: mean(4),
            }
        })
        .collect())
}

/// The figures as a Markdown table.
pub fn simulate_leases(
    shards: u64,
    workers: usize,
    trials: u64,
) -> Result<String, keyspace::Error> {
    let rows = lease_figures(shards, workers, trials)?;
    let mut out = format!(
        "{shards} shards over {workers} workers (mean {:.1} leases each), weights of \
         {} accounts placed by MD5; means of {trials} trials\n\n\
         | scheme | busiest ÷ mean, leases | busiest ÷ mean, weight | idle workers | leases moved when one joins | when one leaves |\n\
         | --- | ---: | ---: | ---: | ---: | ---: |\n",
        shards as f64 / workers as f64,
        10 * shards,
    );
    let weights = shard_weights(shards)?;
    let mean = weights.iter().sum::<u64>() as f64 / workers as f64;
    let heaviest = *weights.iter().max().unwrap_or(&0) as f64;
    let _ = writeln!(
        out,
        "| (no assignment holds the busiest worker under) | {:.2} | {:.2} | | | |",
        (shards as f64 / workers as f64).ceil() / (shards as f64 / workers as f64),
        heaviest.max(mean) / mean,
    );
    for r in rows {
        let _ = writeln!(
            out,
            "| {} | {:.2} | {:.2} | {:.1} | {:.1} | {:.1} |",
            r.scheme,
            r.busiest_by_count,
            r.busiest_by_weight,
            r.idle,
            r.moved_on_join,
            r.moved_on_leave
        );
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keyspread_balances_by_weight_and_moves_least() {
        let rows = lease_figures(64, 10, 20).unwrap();
        let (ring, kcl, ours) = (&rows[0], &rows[1], &rows[2]);
        // Equal counts are not the goal with unequal weights: the weight is.
        assert!(ours.busiest_by_weight < ring.busiest_by_weight, "{rows:?}");
        assert!(ours.busiest_by_weight < kcl.busiest_by_weight, "{rows:?}");
        assert_eq!(ours.idle, 0.0);
        // A joining worker gets work without a reshuffle; the ring moves half the leases.
        assert!((1.0..=8.0).contains(&ours.moved_on_join), "{rows:?}");
        assert!(ours.moved_on_join < ring.moved_on_join, "{rows:?}");
    }

    #[test]
    fn a_joining_worker_gets_work_and_a_leaving_ones_leases_alone_move() {
        let rows = lease_figures(256, 41, 5).unwrap();
        let ours = &rows[2];
        assert_eq!((ours.idle, ours.moved_on_leave), (0.0, 0.0), "{rows:?}");
        assert!((1.0..=7.0).contains(&ours.moved_on_join), "{rows:?}");
    }
}
