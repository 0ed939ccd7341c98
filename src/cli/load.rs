//! `keyspread simulate load`: Zipf-shaped load whose hot accounts rotate, over three schemes:
//! MD5 of the account names (Kinesis's default), keyspread's placement alone (balanced by
//! key count, never moved), and the closed loop under the server's controller rules (a
//! by-load plan each round under a move cap and a cooldown per account, then fanout raised
//! for hot accounts); and, to tell the two halves of the loop apart, the fanout changes
//! alone.

#[cfg(test)]
use std::collections::HashMap;
use std::collections::HashSet;
use std::fmt::Write as _;

use crate::keyspace::{
    self, Allocator, COLD_HALF_LIVES, HashKey, KeyLoad, Keyspace, LoadPlanLimits, LoadSkew,
    MAX_FANOUT, ShardMap, fanout_cold, fanout_target, plan_by_load,
};

/// Total load as a share of all shards' capacity: mean utilisation 0.7.
const UTILISATION: f64 = 0.7;
/// A key of an account above this share of a shard makes it hot (`--hot-account-share`).
const HOT_SHARE: f64 = 0.5;
/// The loop's band: the busiest shard within 10 % of the mean (`--load-tolerance`).
const TOLERANCE: f64 = 0.10;
/// Below this utilisation of its busiest shard the controller leaves a stream be
/// (`--load-floor`).
const FLOOR: f64 = 0.05;
/// Rounds after a round that moved an account during which it stays: `--move-cooldown-s`
/// (600) at 60-s rounds, counted inclusively as the server does (an account moved at `t` is
/// frozen while its move is at or after `now - 600 s`).
const COOLDOWN: u32 = 10;
/// Rounds the controller takes to act on a settled picture, after the smoothing has caught up.
pub const CONTROLLER_ROUNDS: u32 = 3;

/// What to simulate: `keyspread simulate load`'s arguments.
#[derive(Debug, Clone, Copy, clap::Args)]
pub struct LoadSimulation {
    /// Accounts, "acct-1".."acct-N", one key each to start with.
    #[arg(long, env = "KEYSPREAD_SIMULATE_LOAD_ACCOUNTS", default_value_t = 100_000,
          value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub accounts: u32,
    /// Shards of the uniform map.
    #[arg(long, env = "KEYSPREAD_SIMULATE_LOAD_SHARDS", default_value_t = 1024,
          value_parser = clap::value_parser!(u64).range(1..=u64::from(crate::keyspace::MAX_SHARDS)))]
    pub shards: u64,
    /// Zipf exponent s, 0 to 5: the account ranked r carries load in proportion to 1/r^s
    /// (0: all alike; 1.1: a few accounts carry most). Total load is 0.7 of the shards'
    /// capacity.
    #[arg(long, env = "KEYSPREAD_SIMULATE_LOAD_ZIPF", default_value_t = 1.1,
          value_parser = zipf_exponent, allow_negative_numbers = true)]
    pub zipf: f64,
    /// Rounds to run (a round is one controller interval).
    #[arg(long, env = "KEYSPREAD_SIMULATE_LOAD_ROUNDS", default_value_t = 60,
          value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub rounds: u32,
    /// Every this many rounds the ranks are dealt again: other accounts turn hot.
    #[arg(long, env = "KEYSPREAD_SIMULATE_LOAD_SHIFT_EVERY", default_value_t = 20,
          value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub shift_every: u32,
    /// Seed of the rank shuffles.
    #[arg(long, env = "KEYSPREAD_SIMULATE_LOAD_SEED", default_value_t = 1)]
    pub seed: u64,
    /// Half-life, in rounds, of the smoothing the loop's fanout and plans see, as the
    /// server smooths reports (120 s at 60-s rounds: 2); 0: each round's exact loads.
    #[arg(long, env = "KEYSPREAD_SIMULATE_LOAD_HALF_LIFE_ROUNDS", default_value_t = 2,
          value_parser = clap::value_parser!(u32).range(0..=1000))]
    pub half_life_rounds: u32,
}

/// A Zipf exponent: a finite number from 0 to 5.
fn zipf_exponent(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(x) if (0.0..=5.0).contains(&x) => Ok(x),
        _ => Err(format!("{s:?} is not a number from 0 to 5")),
    }
}

impl LoadSimulation {
    /// Rounds after the start and after each rotation before a round counts as converged:
    /// those the smoothed loads take to come within 5 % of the truth, ⌈log2 20 × half-life⌉,
    /// and the controller's rounds after that.
    pub fn settling(&self) -> u32 {
        (20f64.log2() * f64::from(self.half_life_rounds)).ceil() as u32 + CONTROLLER_ROUNDS
    }

    /// Whether `round` counts as converged.
    pub fn converged(&self, round: u32) -> bool {
        round % self.shift_every >= self.settling()
    }

    /// The share of a load the smoothing keeps from one round to the next.
    fn kept(&self) -> f64 {
        match self.half_life_rounds {
            0 => 0.0,
            h => 0.5f64.powf(1.0 / f64::from(h)),
        }
    }
}

/// One round: each scheme's busiest shard over the mean, and what the loop changed.
#[derive(Debug, Clone, PartialEq)]
pub struct LoadRound {
    pub md5: f64,
    pub placed: f64,
    /// keyspread with hot accounts' fanout raised (and lowered) as the loop does, no moves.
    pub fanned: f64,
    pub looped: f64,
    /// The loop's busiest shard over the mean as its plan saw it (smoothed loads).
    pub seen: f64,
    /// Keys the loop moved at the end of the round, and the accounts (by index) they belong
    /// to.
    pub moved: usize,
    pub accounts_moved: Vec<usize>,
    /// Keys added by raised fanouts and released by lowered ones at the end of the round.
    pub added: usize,
    pub released: usize,
    /// The loop's keys when it planned.
    pub keys: usize,
}

/// One account as a scheme holds it.
struct Account {
    keys: Vec<HashKey>,
    /// The last round the loop moved any of its keys in.
    moved_in: Option<u32>,
    /// Since which round it has been cold at several keys.
    cold_since: Option<u32>,
}

/// keyspread's keys for every account: placed one each by the allocator to start with.
struct Keys {
    alloc: Allocator,
    accounts: Vec<Account>,
}

impl Keys {
    fn new(map: &ShardMap, accounts: usize) -> Result<Self, keyspace::Error> {
        let mut alloc = Allocator::new(Keyspace::KINESIS);
        alloc.balance_on(Some(map.clone()));
        let accounts = (0..accounts)
            .map(|_| {
                Ok(Account {
                    keys: vec![alloc.allocate(1)?],
                    moved_in: None,
                    cold_since: None,
                })
            })
            .collect::<Result<_, keyspace::Error>>()?;
        Ok(Keys { alloc, accounts })
    }

    /// The busiest shard over the mean, each account's load split evenly over its keys.
    fn skew(&self, map: &ShardMap, loads: &[f64]) -> f64 {
        LoadSkew::of(&self.per_shard(map, loads)).max_over_mean
    }

    /// Each shard's load, each account's load split evenly over its keys.
    fn per_shard(&self, map: &ShardMap, loads: &[f64]) -> Vec<f64> {
        let mut per_shard = vec![0.0; map.len()];
        for (account, load) in self.accounts.iter().zip(loads) {
            let share = load / account.keys.len() as f64;
            for key in &account.keys {
                per_shard[map.index_of(*key)] += share;
            }
        }
        per_shard
    }

    fn len(&self) -> usize {
        self.accounts.iter().map(|a| a.keys.len()).sum()
    }
}

/// An exponentially weighted view of `truth`, as the server keeps of reports.
fn smooth(seen: &mut Vec<f64>, truth: &[f64], kept: f64) {
    if seen.is_empty() {
        // The stream steady at the first round's loads before the start.
        seen.extend_from_slice(truth);
    }
    for (s, t) in seen.iter_mut().zip(truth) {
        *s = *s * kept + t * (1.0 - kept);
    }
}

/// The simulation's per-round figures; `progress` hears of each round done.
pub fn load_rounds(
    sim: LoadSimulation,
    progress: &mut dyn FnMut(u32),
) -> Result<Vec<LoadRound>, keyspace::Error> {
    let map = ShardMap::uniform(Keyspace::KINESIS, sim.shards)?;
    let names: Vec<String> = (1..=sim.accounts).map(|i| format!("acct-{i}")).collect();
    let md5: Vec<usize> = names
        .iter()
        .map(|n| map.index_of(keyspace::md5_hash(n, Keyspace::KINESIS)))
        .collect();
    let placed = Keys::new(&map, names.len())?;
    let mut fanned = Keys::new(&map, names.len())?;
    let mut looped = Keys::new(&map, names.len())?;
    let mut zipf = Zipf::new(sim, map.len());
    let mut rounds = Vec::with_capacity(sim.rounds as usize);
    // What the server would hold from reports: each account's load, and each shard's
    // utilisation as the loop's keys brought it, folded in with the half-life.
    let (mut seen, mut shards_seen) = (Vec::new(), Vec::new());
    for round in 0..sim.rounds {
        if round.is_multiple_of(sim.shift_every) {
            zipf.shuffle();
        }
        let loads = &zipf.loads;
        let truth = looped.per_shard(&map, loads);
        smooth(&mut seen, loads, sim.kept());
        smooth(&mut shards_seen, &truth, sim.kept());
        let mut by_md5 = vec![0.0; map.len()];
        for (&shard, load) in md5.iter().zip(loads) {
            by_md5[shard] += load;
        }
        let keys = looped.len();
        let mut r = LoadRound {
            md5: LoadSkew::of(&by_md5).max_over_mean,
            placed: placed.skew(&map, loads),
            fanned: fanned.skew(&map, loads),
            looped: LoadSkew::of(&truth).max_over_mean,
            seen: looped.skew(&map, &seen),
            moved: 0,
            accounts_moved: Vec::new(),
            added: 0,
            released: 0,
            keys,
        };
        let cold_for = COLD_HALF_LIVES * i64::from(sim.half_life_rounds);
        let share =
            LoadSkew::of(&fanned.per_shard(&map, &seen)).key_share(HOT_SHARE, TOLERANCE, FLOOR);
        refan(&mut fanned, &seen, None, share, round, cold_for)?;
        // The controller's round: the fanout changes, their new keys placed by the shards'
        // measured utilisation; then a plan by load when those measurements are outside the
        // band, counting the new keys where they go (their accounts, switching, stay put).
        let measured = LoadSkew::of(&shards_seen);
        let share = measured.key_share(HOT_SHARE, TOLERANCE, FLOOR);
        let raised;
        (r.added, r.released, raised) = refan(
            &mut looped,
            &seen,
            Some(&shards_seen),
            share,
            round,
            cold_for,
        )?;
        if !measured.within(TOLERANCE) {
            (r.moved, r.accounts_moved) =
                rebalance(&mut looped, &map, &names, &seen, round, &raised)?;
        }
        rounds.push(r);
        progress(round);
    }
    Ok(rounds)
}

/// Changes fanouts as the server's controller does for accounts that opted in with
/// `max_fanout` (here every account, up to [`MAX_FANOUT`]), each by
/// [`keyspace::fanout_target`] over `share` (the hot share, or the band's width while out
/// of the band: see [`LoadSkew::key_share`]), cold for `cold_for` rounds before it comes
/// down. With `by_load`, new keys go to the least-utilised
/// shards by the measured utilisation (each counting its share for the next), else where
/// the key count is. Answers the keys added and released, and the accounts whose fanout
/// rose.
fn refan(
    scheme: &mut Keys,
    loads: &[f64],
    by_load: Option<&[f64]>,
    share: f64,
    round: u32,
    cold_for: i64,
) -> Result<(usize, usize, HashSet<usize>), keyspace::Error> {
    let (mut added, mut released) = (0, 0);
    let mut raised = HashSet::new();
    let mut utilisation = by_load.map(<[f64]>::to_vec);
    let Keys { alloc, accounts } = scheme;
    for (a, (account, &load)) in accounts.iter_mut().zip(loads).enumerate() {
        let have = account.keys.len();
        let fanout = have as u32;
        let since = if fanout_cold(load, fanout, share) {
            *account.cold_since.get_or_insert(round)
        } else {
            round
        };
        let cold = i64::from(round - since);
        let want = fanout_target(load, fanout, MAX_FANOUT, share, cold, cold_for) as usize;
        if !fanout_cold(load, want as u32, share) {
            account.cold_since = None;
        }
        if want < have {
            for key in account.keys.drain(want..) {
                alloc.remove(key)?;
            }
            released += have - want;
        } else if want > have {
            let new = vec![1; want - have];
            match &mut utilisation {
                Some(util) => {
                    alloc.extend_by_load(&mut account.keys, &new, util, load / want as f64)?
                }
                None => alloc.extend_keys(&mut account.keys, &new)?,
            }
            added += want - have;
            raised.insert(a);
        }
    }
    Ok((added, released, raised))
}

/// The loop's by-load plan at the end of `round`, applied as the server's controller does:
/// at most 1 % of the accounts' keys move (at least 1), none of an account moved in the
/// last `COOLDOWN` rounds, and nothing unless the plan lowers the busiest shard. Answers
/// the keys moved and the accounts they belong to, by index. Accounts in `switching` (a
/// fanout raised this round, its new keys not yet in force) stay put too.
fn rebalance(
    scheme: &mut Keys,
    map: &ShardMap,
    names: &[String],
    loads: &[f64],
    round: u32,
    switching: &HashSet<usize>,
) -> Result<(usize, Vec<usize>), keyspace::Error> {
    let Keys { alloc, accounts } = scheme;
    let mut keys = Vec::new();
    let mut frozen: HashSet<&str> = HashSet::new();
    for (a, account) in accounts.iter().enumerate() {
        if account.moved_in.is_some_and(|at| round - at <= COOLDOWN) || switching.contains(&a) {
            frozen.insert(&names[a]);
        }
        let fanout = account.keys.len() as u32;
        for (index, key) in account.keys.iter().enumerate() {
            keys.push(KeyLoad {
                account: &names[a],
                index: index as u32,
                fanout,
                key: *key,
                weight: 1,
                load: loads[a] / f64::from(fanout),
            });
        }
    }
    let limits = LoadPlanLimits {
        tolerance: TOLERANCE,
        max_moves: (accounts.len() / 100).max(1),
    };
    let plan = plan_by_load(alloc, map, &keys, &frozen, limits);
    if plan.after.max >= plan.before.max {
        return Ok((0, Vec::new()));
    }
    plan.apply(alloc)?;
    let mut moved = std::collections::BTreeSet::new();
    for m in &plan.moves {
        // Names are "acct-N", account N at N - 1.
        let a = m.account["acct-".len()..].parse::<usize>().expect("a name") - 1;
        accounts[a].keys[m.index as usize] = m.to;
        accounts[a].moved_in = Some(round);
        moved.insert(a);
    }
    Ok((plan.moves.len(), moved.into_iter().collect()))
}

/// Zipf loads over the accounts, summing to `UTILISATION` × shards, by rank; ranks drawn
/// again by [`Zipf::shuffle`].
struct Zipf {
    /// Load by rank, heaviest first.
    by_rank: Vec<f64>,
    /// Load by account.
    loads: Vec<f64>,
    ranks: Vec<u32>,
    rng: u64,
}

impl Zipf {
    fn new(sim: LoadSimulation, shards: usize) -> Self {
        let weights: Vec<f64> = (1..=sim.accounts)
            .map(|r| f64::from(r).powf(-sim.zipf))
            .collect();
        let total: f64 = weights.iter().sum();
        let scale = UTILISATION * shards as f64 / total;
        Zipf {
            by_rank: weights.into_iter().map(|w| w * scale).collect(),
            loads: vec![0.0; sim.accounts as usize],
            ranks: (0..sim.accounts).collect(),
            rng: sim.seed,
        }
    }

    /// Deals the ranks out again (Fisher–Yates): which accounts are hot changes.
    fn shuffle(&mut self) {
        for i in (1..self.ranks.len()).rev() {
            let j = (self.next() % (i as u64 + 1)) as usize;
            self.ranks.swap(i, j);
        }
        for (load, &rank) in self.loads.iter_mut().zip(&self.ranks) {
            *load = self.by_rank[rank as usize];
        }
    }

    /// splitmix64.
    fn next(&mut self) -> u64 {
        self.rng = self.rng.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.rng;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}

/// The per-round table and the summary, as Markdown.
pub fn simulate_load(
    sim: LoadSimulation,
    progress: &mut dyn FnMut(u32),
) -> Result<String, keyspace::Error> {
    let rounds = load_rounds(sim, progress)?;
    let settling = sim.settling();
    let mut out = format!(
        "{} accounts over {} shards, loads Zipf({}) at {UTILISATION} of capacity, the hot \
         accounts rotating every {} rounds (a round: one controller interval, 60 s).\n\
         Smoothing: {}.\n\
         Converged: rounds {settling} or more after the start and after each rotation \
         (⌈log2 20 × half-life⌉ = {} rounds for the smoothed loads to come within 5 % of \
         the truth, then {CONTROLLER_ROUNDS} controller rounds); rounds marked *.\n\
         The loop, as the server's controller: each round, when the measured shards are \
         outside the band {TOLERANCE}, a plan by load of at most 1 % of the accounts' \
         count of key moves (at least 1), no account moved within {COOLDOWN} rounds \
         before (600 s), applied only if it lowers the busiest shard; then every account \
         (all opted in, max_fanout {MAX_FANOUT}) above {HOT_SHARE} of a shard, or while the \
         measured shards are outside the band above the band's width ({TOLERANCE} × the mean) \
         when less, gets its fanout raised to keep each key within it (new keys on the \
         least-utilised shards as measured), one cold for ten half-lives and below 1/1024 of \
         that back to 1.\n\n\
         | round | MD5 of the names | keyspread without the loop | fanout alone | with the loop | as the loop saw it | keys moved | % of keys | accounts moved | keys added | keys released | keys |\n\
         | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n",
        sim.accounts,
        sim.shards,
        sim.zipf,
        sim.shift_every,
        match sim.half_life_rounds {
            0 => "none, fanout and plans see each round's exact loads".to_owned(),
            h => format!(
                "fanout and plans see loads smoothed with a half-life of {h} rounds, as \
                 the server's --load-half-life-s"
            ),
        },
        settling - CONTROLLER_ROUNDS,
    );
    for (i, r) in rounds.iter().enumerate() {
        let mark = if sim.converged(i as u32) { "*" } else { "" };
        let _ = writeln!(
            out,
            "| {i}{mark} | {:.2} | {:.2} | {:.3} | {:.3} | {:.3} | {} | {:.2} | {} | {} | {} | {} |",
            r.md5,
            r.placed,
            r.fanned,
            r.looped,
            r.seen,
            r.moved,
            share(r),
            r.accounts_moved.len(),
            r.added,
            r.released,
            r.keys
        );
    }
    let settled: Vec<&LoadRound> = (rounds.iter().enumerate())
        .filter(|(i, _)| sim.converged(*i as u32))
        .map(|(_, r)| r)
        .collect();
    if settled.is_empty() {
        let _ = writeln!(
            out,
            "\nno round counts as converged: {settling} rounds of settling need --shift-every \
             above {settling}"
        );
        return Ok(out);
    }
    let _ = write!(
        out,
        "\nbusiest shard ÷ mean after convergence ({} rounds); keys moved over all {} rounds, \
         as a share of the keys\n\n\
         | scheme | max ÷ mean, median | worst | keys moved per round, median | worst |\n\
         | --- | ---: | ---: | ---: | ---: |\n",
        settled.len(),
        rounds.len(),
    );
    let moved: Vec<f64> = rounds.iter().map(|r| r.moved as f64).collect();
    let shares: Vec<f64> = rounds.iter().map(share).collect();
    let none: &[f64] = &[0.0];
    let figure = |f: fn(&LoadRound) -> f64| -> Vec<f64> { settled.iter().map(|r| f(r)).collect() };
    let rows = [
        ("MD5 of the names", figure(|r| r.md5), [none, none]),
        (
            "keyspread without the loop",
            figure(|r| r.placed),
            [none, none],
        ),
        (
            "keyspread, fanout raised but no moves",
            figure(|r| r.fanned),
            [none, none],
        ),
        (
            "keyspread with the loop",
            figure(|r| r.looped),
            [&moved[..], &shares[..]],
        ),
    ];
    for (scheme, ratios, [moved, share]) in rows {
        let _ = writeln!(
            out,
            "| {scheme} | {:.3} | {:.3} | {} ({:.2} %) | {} ({:.2} %) |",
            median(&ratios),
            worst(&ratios),
            median(moved),
            median(share),
            worst(moved),
            worst(share),
        );
    }
    Ok(out)
}

/// Keys moved in a round as a percentage of the keys.
fn share(r: &LoadRound) -> f64 {
    100.0 * r.moved as f64 / r.keys as f64
}

fn median(xs: &[f64]) -> f64 {
    let mut sorted = xs.to_vec();
    sorted.sort_by(f64::total_cmp);
    sorted.get(sorted.len() / 2).copied().unwrap_or(f64::NAN)
}

fn worst(xs: &[f64]) -> f64 {
    xs.iter().copied().fold(f64::NAN, f64::max)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_loop_keeps_the_servers_cooldown_and_move_cap() {
        // A shape where accounts come due for a second move (5 do, by this seed).
        let sim = LoadSimulation {
            accounts: 3000,
            shards: 128,
            zipf: 1.1,
            rounds: 40,
            shift_every: 15,
            seed: 7,
            half_life_rounds: 2,
        };
        let rounds = load_rounds(sim, &mut |_| {}).unwrap();
        let mut last: HashMap<usize, usize> = HashMap::new();
        let mut again = 0;
        for (round, r) in rounds.iter().enumerate() {
            // At most 1 % of the accounts' count of keys moves (the server's default cap).
            assert!(r.moved <= 30, "round {round}: {} moves", r.moved);
            for &a in &r.accounts_moved {
                // An account moved in round t stays through round t + 10 (600 s), all of
                // its keys, however many of them moved.
                if let Some(&before) = last.get(&a) {
                    assert!(
                        round - before > 10,
                        "account {a} moved in {before} and {round}"
                    );
                    again += 1;
                }
                last.insert(a, round);
            }
        }
        assert!(
            again > 0,
            "no account moved twice: the cooldown was not exercised"
        );
    }
}
