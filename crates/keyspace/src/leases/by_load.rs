//! Leases weighed by observed load: shards weigh their utilisation (an `f64`), and the
//! assignment keeps a hysteresis band so that load that wobbles moves nothing.
//!
//! The band: no worker holds more than `max((1 + tolerance) × mean, mean + heaviest
//! shard)`, and no worker is idle while another holds two shards or more (a worker that
//! joins gets work). While an assignment keeps both, it comes back unchanged; else an
//! overloaded worker gives up its heaviest shards, the fewest that bring it inside, and
//! they (with the shards nobody holds) go to the least loaded workers. Shards that carry
//! no load therefore never move for load's sake: at zero load every worker is inside.
//!
//! The band has a lower edge too, for the few-shards-a-worker case where the upper one is
//! wide: at two even shards a worker, three on one (1.5 × the mean) are inside `mean +
//! heaviest`, and a join that ended at three, two, two and one would stay so. So a worker
//! below `(1 - tolerance) × mean` takes a lease from a worker above `(1 + tolerance) ×
//! mean` when one fits: it keeps the taker within `(1 + tolerance) × mean` and no heavier
//! than the giver is left, and the giver's heaviest shard alone is within that too (a
//! worker above it by one hot shard gives nothing: moving its small shards would not bring
//! it down). Eight even shards over four workers end two apiece. Inside both edges a
//! heartbeat moves nothing; a wobble crosses the lower edge only where a whole lease fits.

use super::Owners;

/// Relative slack on the band's edge, so that a load summed in another order (a float
/// rounding) does not cross it: far below any load a report can tell apart.
const EDGE: f64 = 1e-9;

/// The most a worker may hold: `max((1 + tolerance) × mean, mean + heaviest)`, with the
/// rounding slack [`EDGE`].
pub fn band(loads: &[f64], workers: usize, tolerance: f64) -> f64 {
    if workers == 0 {
        return f64::INFINITY;
    }
    let total: f64 = loads.iter().copied().map(clean).sum();
    let heaviest = loads.iter().copied().map(clean).fold(0.0, f64::max);
    let mean = total / workers as f64;
    let edge = ((1.0 + clean(tolerance)) * mean).max(mean + heaviest);
    edge + EDGE * edge.max(1.0)
}

/// Whether `owners` keeps the band for `loads` over `workers` workers, every shard owned:
/// its upper edge, nobody idle beside two leases, and no lease its lower edge would move.
pub fn inside_band(
    loads: &[f64],
    workers: usize,
    owners: &[Option<usize>],
    tolerance: f64,
) -> bool {
    let loads: Vec<f64> = loads.iter().copied().map(clean).collect();
    inside_upper(&loads, workers, owners, tolerance) && {
        let (held, counts) = held_by(&loads, workers, owners);
        let edges = edges(&held, tolerance);
        lease_to_lift(&loads, owners, &held, &counts, edges).is_none()
    }
}

/// [`inside_band`] but for its lower edge.
fn inside_upper(loads: &[f64], workers: usize, owners: &[Option<usize>], tolerance: f64) -> bool {
    if workers == 0 {
        return owners.iter().all(Option::is_none);
    }
    if owners.iter().any(|o| o.is_none_or(|w| w >= workers)) {
        return false;
    }
    let (held, counts) = held_by(loads, workers, owners);
    let top = band(loads, workers, tolerance);
    let idle_beside_two = counts.contains(&0) && counts.iter().any(|&c| c >= 2);
    !idle_beside_two && held.iter().all(|&h| h <= top)
}

/// The assignment of `loads.len()` shards to `workers` live workers by load, keeping as much
/// of `current` (each shard's live owner, if any) as the band allows: an assignment already
/// inside the band, every shard owned, comes back unchanged; otherwise it moves the fewest
/// leases that bring every worker inside.
pub fn assign_by_load(
    loads: &[f64],
    workers: usize,
    current: &[Option<usize>],
    tolerance: f64,
) -> Owners {
    assert_eq!(loads.len(), current.len(), "one current owner per shard");
    if workers == 0 {
        return vec![None; loads.len()];
    }
    let loads: Vec<f64> = loads.iter().copied().map(clean).collect();
    let mut owners = assign_upper(&loads, workers, current, tolerance);
    // The lower edge: each lease taken lowers the sum of the squared loads (it carries load
    // and goes to a worker that ends lighter than its giver was), so this ends; no worker's
    // load rises but the taker's, which stays within `(1 + tolerance) × mean`.
    let (mut held, mut counts) = held_by(&loads, workers, &owners);
    let edges = edges(&held, tolerance);
    while let Some((s, from, to)) = lease_to_lift(&loads, &owners, &held, &counts, edges) {
        owners[s] = Some(to);
        (held[from], held[to]) = (held[from] - loads[s], held[to] + loads[s]);
        (counts[from], counts[to]) = (counts[from] - 1, counts[to] + 1);
    }
    owners
}

/// [`assign_by_load`] but for the band's lower edge: the fewest moves that bring every
/// worker within its upper edge, and nobody idle beside two leases. `loads` are clean.
fn assign_upper(
    loads: &[f64],
    workers: usize,
    current: &[Option<usize>],
    tolerance: f64,
) -> Owners {
    let mut owners: Owners = current.iter().map(|o| o.filter(|&w| w < workers)).collect();
    let top = band(loads, workers, tolerance);
    let heavier = |a: &usize, b: &usize| loads[*b].total_cmp(&loads[*a]).then(a.cmp(b));
    // An overloaded worker sheds its heaviest shards: k removals lower a load most when
    // they are the k heaviest, so it sheds the fewest that bring it inside.
    let (mut held, mut counts) = held_by(loads, workers, &owners);
    for w in 0..workers {
        if held[w] <= top {
            continue;
        }
        let mut own: Vec<usize> = (0..loads.len()).filter(|&s| owners[s] == Some(w)).collect();
        own.sort_by(heavier);
        for s in own {
            if held[w] <= top {
                break;
            }
            owners[s] = None;
            held[w] -= loads[s];
            counts[w] -= 1;
        }
    }
    // Heaviest first, each to the least loaded worker (idle ones first at equal load): it
    // holds at most the mean, so it ends at most at mean + heaviest.
    let mut free: Vec<usize> = (0..loads.len()).filter(|&s| owners[s].is_none()).collect();
    free.sort_by(heavier);
    for s in free {
        let w = least_loaded(&held, &counts);
        owners[s] = Some(w);
        held[w] += loads[s];
        counts[w] += 1;
    }
    // A worker still idle takes the heaviest shard of the most loaded worker holding two or
    // more: one lease each, and no worker's load rises but the idle one's.
    while let Some(idle) = (0..workers).find(|&w| counts[w] == 0) {
        let Some(donor) = (0..workers)
            .filter(|&w| counts[w] >= 2)
            .max_by(|&a, &b| held[a].total_cmp(&held[b]).then(b.cmp(&a)))
        else {
            break;
        };
        let s = (0..loads.len())
            .filter(|&s| owners[s] == Some(donor))
            .min_by(heavier)
            .expect("the donor holds shards");
        owners[s] = Some(idle);
        (held[donor], held[idle]) = (held[donor] - loads[s], loads[s]);
        (counts[donor], counts[idle]) = (counts[donor] - 1, 1);
    }
    owners
}

/// The band's lower edge for `held` at `tolerance`: below `low`, a worker takes a lease
/// from one above `high`, when the lease weighs at least `width`.
#[derive(Clone, Copy, Debug)]
struct Edges {
    /// `(1 - tolerance) × mean`, less the rounding slack [`EDGE`].
    low: f64,
    /// `(1 + tolerance) × mean`, plus the rounding slack.
    high: f64,
    /// `tolerance × mean`: a lease lighter than the band's width is not worth a hand-over.
    width: f64,
}

fn edges(held: &[f64], tolerance: f64) -> Edges {
    let mean = held.iter().sum::<f64>() / held.len().max(1) as f64;
    let tolerance = clean(tolerance);
    let (low, high) = ((1.0 - tolerance).max(0.0) * mean, (1.0 + tolerance) * mean);
    Edges {
        low: low - EDGE * low.max(1.0),
        high: high + EDGE * high.max(1.0),
        width: tolerance * mean,
    }
}

/// A lease that the band's lower edge moves, as `(shard, from, to)`: the least loaded
/// worker below `low` takes, from the most loaded worker above `high` (holding two leases
/// or more, its heaviest within `high`: one hot shard above it is not helped by moving its
/// small ones), the heaviest of its leases that weighs at least the band's width and keeps
/// the taker within `high` and no heavier than the giver is left; `None` when none fits.
fn lease_to_lift(
    loads: &[f64],
    owners: &[Option<usize>],
    held: &[f64],
    counts: &[usize],
    edges: Edges,
) -> Option<(usize, usize, usize)> {
    let Edges { low, high, width } = edges;
    let by_load = |a: &usize, b: &usize| held[*a].total_cmp(&held[*b]).then(a.cmp(b));
    let mut takers: Vec<usize> = (0..held.len()).filter(|&w| held[w] < low).collect();
    takers.sort_by(by_load);
    let mut heaviest = vec![0.0f64; held.len()];
    for (s, owner) in owners.iter().enumerate() {
        if let Some(w) = owner.filter(|&w| w < held.len()) {
            heaviest[w] = heaviest[w].max(loads[s]);
        }
    }
    let mut givers: Vec<usize> = (0..held.len())
        .filter(|&w| counts[w] >= 2 && held[w] > high && heaviest[w] <= high)
        .collect();
    givers.sort_by(|a, b| by_load(b, a));
    takers.iter().find_map(|&to| {
        givers.iter().find_map(|&from| {
            // Even shards end level: the taker no heavier than the giver, up to rounding.
            let slack = EDGE * held[from].max(1.0);
            (0..loads.len())
                .filter(|&s| owners[s] == Some(from) && loads[s] > slack && loads[s] >= width)
                .filter(|&s| {
                    let taker = held[to] + loads[s];
                    taker <= high && taker <= held[from] - loads[s] + slack
                })
                .max_by(|&a, &b| loads[a].total_cmp(&loads[b]).then(b.cmp(&a)))
                .map(|s| (s, from, to))
        })
    })
}

/// Each worker's summed load and lease count, summed in shard order.
fn held_by(loads: &[f64], workers: usize, owners: &[Option<usize>]) -> (Vec<f64>, Vec<usize>) {
    let mut held = vec![0.0; workers];
    let mut counts = vec![0usize; workers];
    for (s, owner) in owners.iter().enumerate() {
        if let Some(w) = owner.filter(|&w| w < workers) {
            held[w] += clean(loads[s]);
            counts[w] += 1;
        }
    }
    (held, counts)
}

fn least_loaded(held: &[f64], counts: &[usize]) -> usize {
    (0..held.len())
        .min_by(|&a, &b| {
            held[a]
                .total_cmp(&held[b])
                .then(counts[a].cmp(&counts[b]))
                .then(a.cmp(&b))
        })
        .expect("at least one worker")
}

/// A load as the band counts it: never negative, never NaN, never infinite.
fn clean(load: f64) -> f64 {
    if load.is_finite() { load.max(0.0) } else { 0.0 }
}

#[cfg(test)]
mod tests {
    use super::super::moves;
    use super::super::tests::all_assignments;
    use super::*;
    use proptest::prelude::*;

    const TOL: f64 = 0.10;

    /// Every assignment of `shards` shards to `workers` workers.
    /// Loads as reports give them: many shards idle or nearly, some hot.
    fn load() -> impl Strategy<Value = f64> {
        prop_oneof![Just(0.0), 0.0..0.02f64, 0.0..1.0f64, 1.0..3.0f64,]
    }

    fn group(
        max_shards: usize,
        max_workers: usize,
    ) -> impl Strategy<Value = (Vec<f64>, usize, Vec<Option<usize>>)> {
        (0..=max_shards, 1..=max_workers).prop_flat_map(|(shards, workers)| {
            (
                prop::collection::vec(load(), shards),
                Just(workers),
                // Owners among the live workers, a departed one (== workers), or none.
                prop::collection::vec(prop::option::of(0..=workers), shards),
            )
        })
    }

    fn live(current: &[Option<usize>], workers: usize) -> Owners {
        current.iter().map(|o| o.filter(|&w| w < workers)).collect()
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(1024))]

        /// Inside the band nothing moves; after an assignment every worker is inside it.
        #[test]
        fn inside_the_band_nothing_moves_and_every_assignment_ends_inside(
            (loads, workers, current) in group(24, 8)
        ) {
            let owners = assign_by_load(&loads, workers, &current, TOL);
            prop_assert!(inside_band(&loads, workers, &owners, TOL), "{loads:?} {current:?} -> {owners:?}");
            let live = live(&current, workers);
            if inside_band(&loads, workers, &live, TOL) {
                prop_assert_eq!(&owners, &live, "inside the band nothing moves");
            }
        }

        /// Assigning the same loads again moves nothing: no lease goes back and forth, at
        /// zero load least of all.
        #[test]
        fn assigning_again_moves_nothing((loads, workers, current) in group(24, 8)) {
            let owners = assign_by_load(&loads, workers, &current, TOL);
            let again = assign_by_load(&loads, workers, &owners, TOL);
            prop_assert_eq!(moves(&owners, &again), 0);
            prop_assert_eq!(again, owners);
        }

        /// No assignment inside the band's upper edge moves fewer leases to get there (brute
        /// force over all of them); the lower edge's moves come after (next property).
        #[test]
        fn the_moves_are_the_fewest_that_bring_every_worker_inside(
            (loads, workers, current) in group(6, 3)
        ) {
            let live = live(&current, workers);
            let loads: Vec<f64> = loads.into_iter().map(clean).collect();
            let owners = assign_upper(&loads, workers, &current, TOL);
            let least = all_assignments(loads.len(), workers)
                .into_iter()
                .filter(|o| inside_upper(&loads, workers, o, TOL))
                .map(|o| moves(&live, &o))
                .min()
                .expect("some assignment is inside the band");
            prop_assert_eq!(moves(&live, &owners), least, "{:?} {:?} -> {:?}", loads, live, owners);
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(1024))]

        /// The lower edge moves only leases worth the band's width, each to a worker that
        /// ends within `(1 + tolerance) × mean`; the busiest worker never rises for it.
        #[test]
        fn the_lower_edge_moves_whole_leases_and_never_raises_the_busiest(
            (loads, workers, current) in group(24, 8)
        ) {
            let clean: Vec<f64> = loads.iter().copied().map(clean).collect();
            let upper = assign_upper(&clean, workers, &current, TOL);
            let owners = assign_by_load(&loads, workers, &current, TOL);
            let (before, _) = held_by(&clean, workers, &upper);
            let (after, _) = held_by(&clean, workers, &owners);
            let mean = after.iter().sum::<f64>() / workers as f64;
            let busiest = |h: &[f64]| h.iter().copied().fold(0.0, f64::max);
            prop_assert!(busiest(&after) <= busiest(&before) + 1e-9, "{before:?} -> {after:?}");
            for s in (0..clean.len()).filter(|&s| upper[s] != owners[s]) {
                prop_assert!(clean[s] >= TOL * mean - 1e-12, "{clean:?} {upper:?} -> {owners:?}");
                let to = owners[s].expect("owned");
                prop_assert!(after[to] <= (1.0 + TOL) * mean + 1e-9, "{after:?}");
            }
        }

        /// A worker joins a fleet inside the band: the busiest worker does not rise and
        /// the joiner gets work.
        #[test]
        fn a_joining_worker_gets_work_and_the_busiest_does_not_rise(
            (loads, workers, current) in group(24, 7)
        ) {
            let before = assign_by_load(&loads, workers, &current, TOL);
            let after = assign_by_load(&loads, workers + 1, &before, TOL);
            prop_assert!(inside_band(&loads, workers + 1, &after, TOL));
            let (was, _) = held_by(&loads, workers, &before);
            let (held, counts) = held_by(&loads, workers + 1, &after);
            let busiest = |h: &[f64]| h.iter().copied().fold(0.0, f64::max);
            prop_assert!(busiest(&held) <= busiest(&was) + 1e-9, "{was:?} -> {held:?}");
            if loads.len() > workers {
                prop_assert!(counts[workers] >= 1, "{before:?} -> {after:?}");
            }
        }
    }

    /// Eight shards of nearly one load (their keys' counts differ by one) held three, three
    /// and two: a fourth worker that joins ends the fleet at two apiece, not at three, two,
    /// two and one (1.5 × the mean, inside the upper edge, where it would stay).
    #[test]
    fn a_joining_worker_takes_its_share_of_even_shards() {
        let loads = [0.37, 0.38, 0.37, 0.38, 0.37, 0.38, 0.37, 0.38];
        let current: Owners = [0, 0, 0, 1, 1, 1, 2, 2].map(Some).to_vec();
        assert_eq!(assign_by_load(&loads, 3, &current, TOL), current);
        let owners = assign_by_load(&loads, 4, &current, TOL);
        let (_, counts) = held_by(&loads, 4, &owners);
        assert_eq!(counts, [2, 2, 2, 2], "{owners:?}");
        assert_eq!(moves(&current, &owners), 2);
        assert_eq!(assign_by_load(&loads, 4, &owners, TOL), owners);
    }

    /// Three, two, two and one of eight equal shards, however it came about (a join under
    /// the keys' weights, before any report): one lease moves, and the workers end level
    /// though a float's sums of 0.1 are not.
    #[test]
    fn three_two_two_one_of_equal_shards_ends_two_apiece() {
        let loads = [0.1; 8];
        let current: Owners = [0, 0, 0, 1, 1, 2, 2, 3].map(Some).to_vec();
        let owners = assign_by_load(&loads, 4, &current, TOL);
        let (_, counts) = held_by(&loads, 4, &owners);
        assert_eq!(counts, [2, 2, 2, 2], "{owners:?}");
        assert_eq!(moves(&current, &owners), 1);
        assert!(inside_band(&loads, 4, &owners, TOL));
    }

    /// Loads that wobble between reports: a heartbeat moves nothing while every worker
    /// stays inside the band, though one is above the mean plus its heaviest shard.
    #[test]
    fn a_wobble_inside_the_band_moves_nothing() {
        // Eighty shards of 0.05 over four workers, twenty each; worker 0's then read 8 %
        // more: 1.08 against a mean of 1.02 (mean + heaviest 1.074, band 1.122).
        let current: Owners = (0..80).map(|s| Some(s / 20)).collect();
        let mut loads = [0.05; 80];
        loads[..20].iter_mut().for_each(|l| *l = 0.054);
        assert_eq!(assign_by_load(&loads, 4, &current, TOL), current);
        // Worker 0 at 20 % more: 1.2 against a band of 1.155; one lease brings it inside.
        loads[..20].iter_mut().for_each(|l| *l = 0.06);
        let owners = assign_by_load(&loads, 4, &current, TOL);
        assert_eq!(moves(&current, &owners), 1, "{owners:?}");
    }

    #[test]
    fn a_hot_worker_gives_up_its_hottest_shard_only() {
        // Worker 0 holds a hot shard (1.0) and a warm one (0.8); the rest idle along at 0.05.
        let loads = [1.0, 0.8, 0.05, 0.05, 0.05, 0.05, 0.05, 0.05];
        let current: Owners = [0, 0, 1, 1, 2, 2, 3, 3].map(Some).to_vec();
        let owners = assign_by_load(&loads, 4, &current, TOL);
        assert_eq!(moves(&current, &owners), 1, "{owners:?}");
        assert_ne!(owners[0], Some(0), "the hottest shard moved");
        assert!(inside_band(&loads, 4, &owners, TOL));
    }

    #[test]
    fn at_zero_load_a_joining_worker_gets_a_lease_and_nothing_else_moves() {
        let loads = [0.0; 6];
        let before = assign_by_load(&loads, 2, &[None; 6], TOL);
        let after = assign_by_load(&loads, 3, &before, TOL);
        assert_eq!(moves(&before, &after), 1, "{before:?} -> {after:?}");
        assert_eq!(assign_by_load(&loads, 3, &after, TOL), after);
    }
}
