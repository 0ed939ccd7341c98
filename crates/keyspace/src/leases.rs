//! Which worker reads which shard (seed 004): balanced by weight, sticky, and moving as few
//! leases as restore the balance.
//!
//! Pure: shards and workers are indices here; the caller names them. A shard weighs what
//! the keys in its range weigh (at least 1); a lease *moves* when it is taken from one live
//! worker and given to another (giving out a shard nobody live holds moves nothing).
//!
//! The balance rule: no worker holds more than the mean plus the heaviest shard, nor less
//! than the mean less the heaviest shard, and no worker is idle while another holds two
//! shards or more (a worker that joins gets work); when every shard weighs the same, lease
//! counts differ by at most 1.
//!
//! Once a stream's readers report what they read, shards weigh their observed utilisation
//! instead, with a hysteresis band of two edges ([`assign_by_load`]).

mod by_load;

pub use by_load::{assign_by_load, band, inside_band};

/// The owner of each shard: `owners[s]` is the worker reading shard `s`, `None` only when
/// there is no worker.
pub type Owners = Vec<Option<usize>>;

/// The assignment of `weights.len()` shards to `workers` live workers that keeps as much of
/// `current` (each shard's live owner, if any) as the balance rule allows. An assignment
/// that already keeps the rule, with every shard owned, comes back unchanged.
///
/// With equal weights the number of leases moved is the least any balanced assignment
/// needs; with unequal weights, an overloaded worker gives up its heaviest shards first.
pub fn assign(weights: &[u64], workers: usize, current: &[Option<usize>]) -> Owners {
    assert_eq!(weights.len(), current.len(), "one current owner per shard");
    if workers == 0 {
        return vec![None; weights.len()];
    }
    // An owner that is not a live worker owns nothing.
    let current: Vec<Option<usize>> = current.iter().map(|o| o.filter(|&w| w < workers)).collect();
    let equal = weights.windows(2).all(|w| w[0] == w[1]);
    if equal {
        assign_counts(weights.len(), workers, &current)
    } else {
        assign_weights(weights, workers, &current)
    }
}

/// Whether `owners` keeps the balance rule for `weights` over `workers` workers, every shard
/// owned.
pub fn balanced(weights: &[u64], workers: usize, owners: &[Option<usize>]) -> bool {
    if workers == 0 {
        return weights.is_empty() || owners.iter().all(Option::is_none);
    }
    if owners.iter().any(|o| o.is_none_or(|w| w >= workers)) {
        return false;
    }
    let mut loads = vec![0u64; workers];
    let mut counts = vec![0u64; workers];
    for (s, owner) in owners.iter().enumerate() {
        let w = owner.expect("checked above");
        loads[w] += weights[s];
        counts[w] += 1;
    }
    if weights.windows(2).all(|w| w[0] == w[1]) {
        let (lo, hi) = (counts.iter().min(), counts.iter().max());
        return hi.zip(lo).is_none_or(|(hi, lo)| hi - lo <= 1);
    }
    let total: u64 = weights.iter().sum();
    let heaviest = weights.iter().copied().max().unwrap_or(0);
    // mean - heaviest <= load <= mean + heaviest, in integers.
    let w = workers as u64;
    let idle_beside_two = counts.contains(&0) && counts.iter().any(|&c| c >= 2);
    !idle_beside_two
        && loads
            .iter()
            .all(|&load| load * w <= total + heaviest * w && load * w + heaviest * w >= total)
}

/// How many leases go from one live worker to another between `before` and `after`.
pub fn moves(before: &[Option<usize>], after: &[Option<usize>]) -> usize {
    before
        .iter()
        .zip(after)
        .filter(|(b, a)| b.is_some() && a.is_some() && b != a)
        .count()
}

/// Equal weights: `n mod w` workers hold ⌈n/w⌉ leases, the rest ⌊n/w⌋. The larger quotas go
/// to the workers holding the most already, so the most leases stay where they are.
fn assign_counts(shards: usize, workers: usize, current: &[Option<usize>]) -> Owners {
    let (q, r) = (shards / workers, shards % workers);
    let mut held: Vec<Vec<usize>> = vec![Vec::new(); workers];
    for (s, owner) in current.iter().enumerate() {
        if let Some(w) = owner {
            held[*w].push(s);
        }
    }
    let mut by_holding: Vec<usize> = (0..workers).collect();
    by_holding.sort_by_key(|&w| (std::cmp::Reverse(held[w].len()), w));
    let mut quota = vec![q; workers];
    for &w in &by_holding[..r] {
        quota[w] = q + 1;
    }
    let mut owners: Owners = vec![None; shards];
    let mut free = Vec::new();
    for (w, shards) in held.iter().enumerate() {
        for (n, &s) in shards.iter().enumerate() {
            if n < quota[w] {
                owners[s] = Some(w);
            } else {
                free.push(s);
            }
        }
    }
    free.extend((0..shards).filter(|&s| current[s].is_none()));
    free.sort_unstable();
    let mut free = free.into_iter();
    for w in 0..workers {
        let short = quota[w] - held[w].len().min(quota[w]);
        for s in free.by_ref().take(short) {
            owners[s] = Some(w);
        }
    }
    owners
}

/// Unequal weights: a worker over the mean plus the heaviest shard gives up its heaviest
/// shards until it is not; every shard without an owner then goes, heaviest first, to the
/// worker holding the least weight (which holds at most the mean, so it ends within the
/// rule); then, while a worker holds less than the mean less the heaviest shard, the most
/// loaded worker gives it its heaviest shard (both stay within the rule, and the spread of
/// loads shrinks each time, so this ends).
fn assign_weights(weights: &[u64], workers: usize, current: &[Option<usize>]) -> Owners {
    let total: u64 = weights.iter().sum();
    let heaviest = weights.iter().copied().max().unwrap_or(0);
    let over = |load: u64| load * workers as u64 > total + heaviest * workers as u64;
    let mut owners: Owners = current.to_vec();
    let mut loads = vec![0u64; workers];
    let mut held: Vec<Vec<usize>> = vec![Vec::new(); workers];
    for (s, owner) in current.iter().enumerate() {
        if let Some(w) = owner {
            loads[*w] += weights[s];
            held[*w].push(s);
        }
    }
    for w in 0..workers {
        held[w].sort_by_key(|&s| (std::cmp::Reverse(weights[s]), s));
        let mut heaviest_first = held[w].iter();
        while over(loads[w]) {
            let s = *heaviest_first
                .next()
                .expect("an overloaded worker holds shards");
            owners[s] = None;
            loads[w] -= weights[s];
        }
    }
    let mut free: Vec<usize> = (0..weights.len())
        .filter(|&s| owners[s].is_none())
        .collect();
    free.sort_by_key(|&s| (std::cmp::Reverse(weights[s]), s));
    for s in free {
        let w = (0..workers)
            .min_by_key(|&w| (loads[w], w))
            .expect("at least one worker");
        owners[s] = Some(w);
        loads[w] += weights[s];
    }
    let w = workers as u64;
    let mut counts = vec![0usize; workers];
    owners.iter().flatten().for_each(|&w| counts[w] += 1);
    // An idle worker takes the heaviest shard of the most loaded worker holding two or more.
    while let Some(idle) = (0..workers).find(|&w| counts[w] == 0) {
        let Some(donor) = (0..workers)
            .filter(|&w| counts[w] >= 2)
            .max_by_key(|&w| (loads[w], std::cmp::Reverse(w)))
        else {
            break;
        };
        let s = (0..weights.len())
            .filter(|&s| owners[s] == Some(donor))
            .max_by_key(|&s| (weights[s], std::cmp::Reverse(s)))
            .expect("the donor holds shards");
        owners[s] = Some(idle);
        (loads[donor], loads[idle]) = (loads[donor] - weights[s], weights[s]);
        (counts[donor], counts[idle]) = (counts[donor] - 1, 1);
    }
    let under = |load: u64| (load + heaviest) * w < total;
    loop {
        let light = (0..workers)
            .min_by_key(|&w| (loads[w], w))
            .expect("a worker");
        if !under(loads[light]) {
            return owners;
        }
        let heavy = (0..workers)
            .max_by_key(|&w| (loads[w], std::cmp::Reverse(w)))
            .expect("a worker");
        let s = (0..weights.len())
            .filter(|&s| owners[s] == Some(heavy))
            .max_by_key(|&s| (weights[s], std::cmp::Reverse(s)))
            .expect("the most loaded worker holds a shard");
        owners[s] = Some(light);
        loads[heavy] -= weights[s];
        loads[light] += weights[s];
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Every assignment of `shards` shards to `workers` workers.
    /// Every assignment of `shards` shards to `workers` workers (workers^shards of them).
    pub(super) fn all_assignments(shards: usize, workers: usize) -> Vec<Owners> {
        let mut out = vec![Vec::new()];
        for _ in 0..shards {
            out = out
                .into_iter()
                .flat_map(|prefix: Owners| {
                    (0..workers).map(move |w| {
                        let mut next = prefix.clone();
                        next.push(Some(w));
                        next
                    })
                })
                .collect();
        }
        out
    }

    fn group() -> impl Strategy<Value = (Vec<u64>, usize, Vec<Option<usize>>)> {
        (0usize..=7, 1usize..=4, any::<bool>()).prop_flat_map(|(shards, workers, equal)| {
            let weight = if equal { 3u64..=3 } else { 1u64..=20 };
            (
                prop::collection::vec(weight, shards),
                Just(workers),
                // Owners among the live workers, a departed one (== workers), or none.
                prop::collection::vec(prop::option::of(0..=workers), shards),
            )
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        /// Balanced, every shard owned; sticky when the rule already held; and with equal
        /// weights no balanced assignment moves fewer leases (brute force over all of them).
        #[test]
        fn the_assignment_is_balanced_sticky_and_minimal((weights, workers, current) in group()) {
            let owners = assign(&weights, workers, &current);
            prop_assert!(balanced(&weights, workers, &owners), "{weights:?} {current:?} -> {owners:?}");
            let live: Owners = current.iter().map(|o| o.filter(|&w| w < workers)).collect();
            if balanced(&weights, workers, &live) {
                prop_assert_eq!(&owners, &live, "a balanced group moves nothing");
            }
            if weights.windows(2).all(|w| w[0] == w[1]) {
                let least = all_assignments(weights.len(), workers)
                    .into_iter()
                    .filter(|o| balanced(&weights, workers, o))
                    .map(|o| moves(&live, &o))
                    .min()
                    .unwrap_or(0);
                prop_assert_eq!(moves(&live, &owners), least, "{:?} -> {:?}", live, owners);
            }
        }

        /// Heartbeats change nothing: the assignment of an assignment is itself.
        #[test]
        fn assigning_again_changes_nothing((weights, workers, current) in group()) {
            let owners = assign(&weights, workers, &current);
            prop_assert_eq!(assign(&weights, workers, &owners), owners);
        }
    }

    /// One change to a group between assignments.
    #[derive(Debug, Clone)]
    enum Step {
        Join,
        /// Worker `i % workers` leaves or expires; the workers after it are renumbered.
        Leave(usize),
        /// Shard `i % shards` weighs this now (ignored when all weigh the same).
        Reweigh(usize, u64),
        /// A shard is added (a split's child, say) or shard `i % shards` removed.
        AddShard,
        RemoveShard(usize),
    }

    fn history() -> impl Strategy<Value = (bool, Vec<u64>, usize, Vec<Step>)> {
        let step = prop_oneof![
            Just(Step::Join),
            any::<usize>().prop_map(Step::Leave),
            (any::<usize>(), 1u64..=20).prop_map(|(i, w)| Step::Reweigh(i, w)),
            Just(Step::AddShard),
            any::<usize>().prop_map(Step::RemoveShard),
        ];
        (
            any::<bool>(),
            prop::collection::vec(1u64..=20, 1..=6),
            1usize..=3,
        )
            .prop_flat_map(move |(equal, weights, workers)| {
                (
                    Just(equal),
                    Just(weights),
                    Just(workers),
                    prop::collection::vec(step.clone(), 1..=8),
                )
            })
    }

    /// The fewest leases any balanced assignment moves from `live`, by brute force.
    fn least_moves(weights: &[u64], workers: usize, live: &[Option<usize>]) -> usize {
        all_assignments(weights.len(), workers)
            .into_iter()
            .filter(|o| balanced(weights, workers, o))
            .map(|o| moves(live, &o))
            .min()
            .unwrap_or(0)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(96))]

        /// Through any history of joins, leaves, weight changes and reshards, assigning
        /// after each step keeps the rule, changes nothing when the group was still
        /// balanced, is stable, and with equal weights moves exactly the fewest leases.
        #[test]
        fn every_step_of_a_history_is_balanced_sticky_and_minimal(
            (equal, mut weights, mut workers, steps) in history()
        ) {
            if equal {
                weights.iter_mut().for_each(|w| *w = 3);
            }
            let mut owners = assign(&weights, workers, &vec![None; weights.len()]);
            for step in steps {
                match step {
                    Step::Join => workers += 1,
                    Step::Leave(i) if workers > 0 => {
                        let gone = i % workers;
                        workers -= 1;
                        for o in &mut owners {
                            *o = match *o {
                                Some(w) if w == gone => None,
                                Some(w) if w > gone => Some(w - 1),
                                other => other,
                            };
                        }
                    }
                    Step::Leave(_) => {}
                    Step::Reweigh(i, w) if !equal => {
                        let n = weights.len();
                        weights[i % n] = w;
                    }
                    Step::Reweigh(..) => {}
                    Step::AddShard => {
                        weights.push(if equal { 3 } else { 1 + weights.len() as u64 % 7 });
                        owners.push(None);
                    }
                    Step::RemoveShard(i) if weights.len() > 1 => {
                        let n = weights.len();
                        weights.remove(i % n);
                        owners.remove(i % n);
                    }
                    Step::RemoveShard(_) => {}
                }
                let before = owners.clone();
                owners = assign(&weights, workers, &before);
                if workers == 0 {
                    prop_assert!(owners.iter().all(Option::is_none));
                    continue;
                }
                prop_assert!(balanced(&weights, workers, &owners), "{weights:?} {before:?} -> {owners:?}");
                if balanced(&weights, workers, &before) {
                    prop_assert_eq!(&owners, &before, "a balanced group moves nothing");
                }
                prop_assert_eq!(&assign(&weights, workers, &owners), &owners);
                if equal && weights.len() <= 7 && workers <= 4 {
                    prop_assert_eq!(
                        moves(&before, &owners),
                        least_moves(&weights, workers, &before),
                        "{:?} -> {:?}", before, owners
                    );
                }
            }
        }
    }

    #[test]
    fn a_cold_start_spreads_sixty_four_shards_over_ten_workers() {
        let owners = assign(&[1; 64], 10, &[None; 64]);
        let mut counts = [0; 10];
        for o in owners {
            counts[o.unwrap()] += 1;
        }
        assert!(counts.iter().all(|&c| c == 6 || c == 7), "{counts:?}");
    }

    #[test]
    fn a_joining_worker_takes_only_its_share() {
        let before = assign(&[1; 64], 10, &[None; 64]);
        let after = assign(&[1; 64], 11, &before);
        // 64 over 11: nine hold 6, two hold 5; the newcomer's 5 or 6 come from the others.
        let moved = moves(&before, &after);
        assert!((5..=6).contains(&moved), "{moved} moved");
    }

    #[test]
    fn no_worker_means_no_owner() {
        assert_eq!(assign(&[1, 2], 0, &[Some(0), None]), vec![None, None]);
    }
}
