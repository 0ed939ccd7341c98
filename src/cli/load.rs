//! `keyspread simulate load`: Zipf-shaped load whose hot accounts rotate, over three schemes:
//! MD5 of the account names (Kinesis's default), keyspread's placement alone (balanced by
//! key count, never moved), and the closed loop (fanout raised for hot accounts, a by-load
//! plan each round under a move cap and a cooldown); and, to tell the two halves of the
//! loop apart, the fanout changes alone.

use std::collections::{HashMap, HashSet};
use std::fmt::Write as _;

use crate::keyspace::{
    self, Allocator, HashKey, KeyLoad, Keyspace, LoadPlanLimits, LoadSkew, MAX_FANOUT, ShardMap,
    plan_by_load_keys, suggested_fanout,
};

/// Total load as a share of all shards' capacity: mean utilisation 0.7.
const UTILISATION: f64 = 0.7;
/// A key of an account above this share of a shard makes it hot (`--hot-account-share`).
const HOT_SHARE: f64 = 0.5;
/// The loop's band: the busiest shard within 10 % of the mean (`--load-tolerance`).
const TOLERANCE: f64 = 0.10;
/// Rounds an account that moved stays put, and rounds an account stays cold before its
/// fanout is lowered.
const COOLDOWN: u32 = 10;
/// Rounds after each rotation (and the start) before the figures count as converged.
pub const SETTLING: u32 = 3;

/// What to simulate.
#[derive(Debug, Clone, Copy)]
pub struct LoadSimulation {
    pub accounts: u32,
    pub shards: u64,
    /// Account of rank r carries load ∝ 1 / r^zipf.
    pub zipf: f64,
    pub rounds: u32,
    /// Ranks are reshuffled at round 0 and every `shift_every` rounds after.
    pub shift_every: u32,
    pub seed: u64,
    /// Fanout and plans see loads smoothed as the server smooths reports (EWMA with this
    /// half-life, in rounds); 0: each round's exact loads. Figures always use exact loads.
    pub half_life_rounds: u32,
}

/// One round: each scheme's busiest shard over the mean, and what the loop changed.
#[derive(Debug, Clone, PartialEq)]
pub struct LoadRound {
    pub md5: f64,
    pub placed: f64,
    /// keyspread with hot accounts' fanout raised (and lowered) as the loop does, no moves.
    pub fanned: f64,
    pub looped: f64,
    /// Keys the loop moved at the end of the round.
    pub moved: usize,
    /// Keys added by raised fanouts and released by lowered ones at the end of the round.
    pub added: usize,
    pub released: usize,
    /// The loop's keys its plan moved some of (after the fanout changes).
    pub keys: usize,
}

/// One account as a scheme holds it.
struct Account {
    keys: Vec<HashKey>,
    cold_rounds: u32,
    /// `(index, round)` of each key that moved: a moved key stays for the cooldown; the
    /// account's other keys, and those a fanout raise adds, may move.
    moved_at: Vec<(u32, u32)>,
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
                    cold_rounds: 0,
                    moved_at: Vec::new(),
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
    // What the server would report: each round's loads folded in with the half-life (the
    // stream steady at round 0's loads before the start).
    let mut seen: Vec<f64> = Vec::new();
    let kept = match sim.half_life_rounds {
        0 => 0.0,
        h => 0.5f64.powf(1.0 / f64::from(h)),
    };
    for round in 0..sim.rounds {
        if round.is_multiple_of(sim.shift_every) {
            zipf.shuffle();
        }
        let loads = &zipf.loads;
        if seen.is_empty() {
            seen = loads.clone();
        }
        for (s, l) in seen.iter_mut().zip(loads) {
            *s = *s * kept + l * (1.0 - kept);
        }
        let mut by_md5 = vec![0.0; map.len()];
        for (&shard, load) in md5.iter().zip(loads) {
            by_md5[shard] += load;
        }
        let figures = (
            LoadSkew::of(&by_md5).max_over_mean,
            placed.skew(&map, loads),
            fanned.skew(&map, loads),
            looped.skew(&map, loads),
        );
        refan(&mut fanned, &seen, None)?;
        let (added, released) = refan(&mut looped, &seen, Some(&map))?;
        let keys = looped.len();
        let moved = rebalance(&mut looped, &map, &names, &seen, round)?;
        rounds.push(LoadRound {
            md5: figures.0,
            placed: figures.1,
            fanned: figures.2,
            looped: figures.3,
            moved,
            added,
            released,
            keys,
        });
        progress(round);
    }
    Ok(rounds)
}

/// Raises the fanout of every account whose keys would carry more than the hot share, and
/// lowers it for one whose fanout has been above what its load needs for `COOLDOWN` rounds.
/// With `by_load`, new keys go where the loads are least (heaviest keys first), else where
/// the key count is. Answers the keys added and released.
fn refan(
    scheme: &mut Keys,
    loads: &[f64],
    by_load: Option<&ShardMap>,
) -> Result<(usize, usize), keyspace::Error> {
    let (mut added, mut released) = (0, 0);
    let mut raised = Vec::new();
    for (a, (account, &load)) in scheme.accounts.iter_mut().zip(loads).enumerate() {
        let want = suggested_fanout(load, HOT_SHARE).min(MAX_FANOUT) as usize;
        let have = account.keys.len();
        if want > have {
            raised.push((load / want as f64, a, want));
            account.cold_rounds = 0;
        } else if want < have {
            account.cold_rounds += 1;
            if account.cold_rounds >= COOLDOWN {
                for key in account.keys.drain(want..) {
                    scheme.alloc.remove(key)?;
                }
                released += have - want;
                account.cold_rounds = 0;
                account
                    .moved_at
                    .retain(|&(index, _)| (index as usize) < want);
            }
        } else {
            account.cold_rounds = 0;
        }
    }
    raised.sort_by(|x, y| y.0.total_cmp(&x.0).then(x.1.cmp(&y.1)));
    let mut per_shard = by_load.map(|map| scheme.per_shard(map, loads));
    let Keys { alloc, accounts } = scheme;
    for (key_load, a, want) in raised {
        let account = &mut accounts[a];
        let have = account.keys.len();
        let new = vec![1; want - have];
        match (&mut per_shard, by_load) {
            (Some(per_shard), Some(map)) => {
                // The account's keys it holds now carry their new, smaller share.
                for key in &account.keys {
                    per_shard[map.index_of(*key)] += key_load - loads[a] / have as f64;
                }
                alloc.extend_by_load(&mut account.keys, &new, per_shard, key_load)?;
            }
            _ => alloc.extend_keys(&mut account.keys, &new)?,
        }
        added += want - have;
    }
    Ok((added, released))
}

/// The loop's by-load plan at the end of `round`, applied: at most 1 % of the keys move, no
/// account that moved in the last `COOLDOWN` rounds. Answers the keys moved.
fn rebalance(
    scheme: &mut Keys,
    map: &ShardMap,
    names: &[String],
    loads: &[f64],
    round: u32,
) -> Result<usize, keyspace::Error> {
    let Keys { alloc, accounts } = scheme;
    let mut keys = Vec::new();
    // The keys that stay: each moved within the cooldown.
    let mut frozen: HashSet<(&str, u32)> = HashSet::new();
    for (a, account) in accounts.iter().enumerate() {
        let fanout = account.keys.len() as u32;
        for &(index, at) in &account.moved_at {
            if round < at + COOLDOWN {
                frozen.insert((&names[a], index));
            }
        }
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
        max_moves: (keys.len() / 100).max(1),
    };
    let stays = |k: &KeyLoad| frozen.contains(&(k.account, k.index));
    let plan = plan_by_load_keys(alloc, map, &keys, &stays, limits);
    plan.apply(alloc)?;
    let by_name: HashMap<&str, usize> = (names.iter().enumerate())
        .map(|(a, name)| (name.as_str(), a))
        .collect();
    for m in &plan.moves {
        let a = by_name[m.account.as_str()];
        accounts[a].keys[m.index as usize] = m.to;
        let moved_at = &mut accounts[a].moved_at;
        moved_at.retain(|&(index, _)| index != m.index);
        moved_at.push((m.index, round));
    }
    Ok(plan.moves.len())
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

/// Whether `round` counts as converged: `SETTLING` rounds or more after the last rotation.
pub fn converged(round: u32, shift_every: u32) -> bool {
    round % shift_every >= SETTLING
}

/// The per-round table and the summary, as Markdown.
pub fn simulate_load(
    sim: LoadSimulation,
    progress: &mut dyn FnMut(u32),
) -> Result<String, keyspace::Error> {
    let rounds = load_rounds(sim, progress)?;
    let mut out = format!(
        "{} accounts over {} shards, loads Zipf({}) at {UTILISATION} of capacity, the hot \
         accounts rotating every {} rounds; {}; the loop: fanout up to {MAX_FANOUT} so no key \
         carries more than {HOT_SHARE} of a shard (new keys on the least-loaded shards), \
         then a plan by load, band {TOLERANCE}, at most 1 % of keys moved per round, a moved \
         key stays {COOLDOWN} rounds\n\n\
         | round | MD5 of the names | keyspread without the loop | fanout alone | with the loop | keys moved | keys added | keys released | keys planned over |\n\
         | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n",
        sim.accounts,
        sim.shards,
        sim.zipf,
        sim.shift_every,
        match sim.half_life_rounds {
            0 => "fanout and plans see each round's exact loads".to_owned(),
            h => format!("fanout and plans see loads smoothed with a half-life of {h} rounds"),
        },
    );
    for (i, r) in rounds.iter().enumerate() {
        let _ = writeln!(
            out,
            "| {i} | {:.2} | {:.2} | {:.3} | {:.3} | {} | {} | {} | {} |",
            r.md5, r.placed, r.fanned, r.looped, r.moved, r.added, r.released, r.keys
        );
    }
    let settled: Vec<&LoadRound> = (rounds.iter().enumerate())
        .filter(|(i, _)| converged(*i as u32, sim.shift_every))
        .map(|(_, r)| r)
        .collect();
    let _ = write!(
        out,
        "\nbusiest shard ÷ mean after convergence ({} rounds: those {SETTLING} or more after \
         the start and after each rotation); keys moved over all {} rounds\n\n\
         | scheme | max ÷ mean, median | worst | keys moved per round, median | worst |\n\
         | --- | ---: | ---: | ---: | ---: |\n",
        settled.len(),
        rounds.len(),
    );
    let moved: Vec<f64> = rounds.iter().map(|r| r.moved as f64).collect();
    let share: Vec<f64> = (rounds.iter())
        .map(|r| 100.0 * r.moved as f64 / r.keys as f64)
        .collect();
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
            [&moved[..], &share[..]],
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

fn median(xs: &[f64]) -> f64 {
    let mut sorted = xs.to_vec();
    sorted.sort_by(f64::total_cmp);
    sorted.get(sorted.len() / 2).copied().unwrap_or(f64::NAN)
}

fn worst(xs: &[f64]) -> f64 {
    xs.iter().copied().fold(f64::NAN, f64::max)
}
