//! `keyspread simulate` as an operator runs it: the plain comparison, and with --fanout.

use std::process::Command;

fn simulate(args: &[&str]) -> String {
    let output = Command::new(env!("CARGO_BIN_EXE_keyspread"))
        .arg("simulate")
        .args(args)
        .output()
        .expect("run keyspread simulate");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).unwrap()
}

#[test]
fn without_fanout_the_seed_comparison_is_unchanged() {
    assert_eq!(
        simulate(&["--accounts", "14", "--shards", "2"]),
        "14 accounts (\"1\"..\"14\") over 2 shards\n\
         \x20                                 max      min  max/mean\n\
         MD5 of the names                   11        3     1.571\n\
         keyspread                           7        7     1.000\n\
         keyspread, primary stream           7        7     1.000\n"
    );
}

#[test]
fn fanout_compares_md5_suffixes_with_keyspread() {
    let out = simulate(&["--fanout", "4", "--shards", "4", "--trials", "2000"]);
    let row = |start: &str| -> Vec<String> {
        let line = out.lines().find(|l| l.starts_with(start)).expect(start);
        line[42..].split_whitespace().map(str::to_owned).collect()
    };
    let distinct = row("on 4 distinct shards, of 2000 accounts");
    assert_eq!(distinct[2..], ["100.00", "%", "9.38", "%"], "{out}");
    let md5: f64 = distinct[0].parse().unwrap();
    assert!((6.0..13.0).contains(&md5), "{out}");
    let load = row("heaviest shard / mean, 100 accounts");
    assert_eq!(load[1], "1.000", "{out}");
}

#[test]
fn leases_compares_the_ring_a_kcl_style_taker_and_keyspread() {
    let out = simulate(&[
        "leases",
        "--shards",
        "64",
        "--workers",
        "10",
        "--trials",
        "5",
    ]);
    let row = |scheme: &str| -> Vec<f64> {
        let line = out
            .lines()
            .find(|l| l.starts_with(&format!("| {scheme} |")))
            .expect(scheme);
        (line.split('|').skip(2))
            .filter_map(|cell| cell.trim().parse().ok())
            .collect()
    };
    let (ring, ours) = (row("hash ring"), row("keyspread"));
    assert_eq!((ring.len(), ours.len()), (5, 5), "{out}");
    // Busiest by weight, idle workers, leases moved when one joins and when one leaves.
    assert!(ours[1] < ring[1], "{out}");
    assert_eq!((ours[2], ours[4]), (0.0, 0.0), "{out}");
    assert!(ours[3] >= 1.0 && ours[3] < ring[3], "{out}");
    // Both forms of the command still need their arguments.
    let missing = Command::new(env!("CARGO_BIN_EXE_keyspread"))
        .args(["simulate", "leases", "--shards", "64"])
        .output()
        .unwrap();
    assert!(!missing.status.success());
    assert!(String::from_utf8_lossy(&missing.stderr).contains("--workers"));
}

/// A `simulate load` run of `shape` (accounts, shards, rounds, shift every) with `extra`
/// flags: its output, the summary's row of a scheme (| scheme | max ÷ mean median | worst |
/// moved median | worst |) and the per-round rows (round, MD5, alone, fanned, looped, as the
/// loop saw it, keys moved, % of keys, accounts moved, added, released, keys, and 1 when
/// the round counts as converged).
fn simulate_load(
    shape: [&str; 4],
    extra: &[&str],
) -> (String, impl Fn(&str) -> Vec<f64>, Vec<Vec<f64>>) {
    let [accounts, shards, rounds, shift_every] = shape;
    let mut args = vec![
        "load",
        "--accounts",
        accounts,
        "--shards",
        shards,
        "--zipf",
        "1.1",
        "--rounds",
        rounds,
        "--shift-every",
        shift_every,
    ];
    args.extend(extra);
    let out = simulate(&args);
    let rounds: Vec<Vec<f64>> = out
        .lines()
        .filter(|l| l.starts_with("| ") && l[2..].starts_with(|c: char| c.is_ascii_digit()))
        .map(|l| {
            let mut cells: Vec<f64> = (l.split('|').skip(1))
                .filter_map(|c| c.trim().trim_end_matches('*').parse().ok())
                .collect();
            cells.push(if l.contains("* |") { 1.0 } else { 0.0 });
            cells
        })
        .collect();
    let summary = out.clone();
    let row = move |scheme: &str| -> Vec<f64> {
        let line = (summary.lines())
            .find(|l| l.starts_with(&format!("| {scheme} |")))
            .unwrap_or_else(|| panic!("no row {scheme} in\n{summary}"));
        (line.split('|').skip(2))
            .filter_map(|cell| cell.split_whitespace().next()?.parse().ok())
            .collect()
    };
    (out, row, rounds)
}

/// The loop moves at most 1 % of the accounts' count of keys a round (the server's default
/// `--max-moves-per-round`), and says what share of the keys that is.
fn assert_moves_within_the_cap(rounds: &[Vec<f64>], accounts: f64, out: &str) {
    for r in rounds {
        let (moved, share, keys) = (r[6], r[7], r[11]);
        assert!(
            moved <= (accounts / 100.0).floor().max(1.0),
            "{r:?} in\n{out}"
        );
        assert!(
            (share - 100.0 * moved / keys).abs() < 0.01,
            "{r:?} in\n{out}"
        );
    }
}

#[test]
fn load_compares_md5_the_placement_alone_and_the_loop() {
    let small = ["5000", "64", "20", "10"];
    let (out, row, rounds) = simulate_load(small, &["--half-life-rounds", "0"]);
    assert!(
        out.contains("none, fanout and plans see each round's exact loads"),
        "{out}"
    );
    assert!(out.contains("Converged: rounds 3 or more after"), "{out}");
    let (md5, alone, closed) = (
        row("MD5 of the names"),
        row("keyspread without the loop"),
        row("keyspread with the loop"),
    );
    assert_eq!((md5.len(), alone.len(), closed.len()), (4, 4, 4), "{out}");
    // After convergence the loop keeps the busiest shard within 10 % of the mean; one
    // account carries more than a shard's mean by itself, so neither other scheme can.
    assert!(closed[1] <= 1.10, "{out}");
    assert!(md5[1] > 2.0 && alone[1] > 2.0, "{out}");
    // Raising the hot accounts' fanout alone leaves their new keys where the count puts them.
    let fanned = row("keyspread, fanout raised but no moves");
    assert!(fanned[1] > closed[1] + 0.1 && fanned[3] == 0.0, "{out}");
    // Only the loop moves keys.
    assert_eq!((md5[3], alone[3]), (0.0, 0.0), "{out}");
    assert!(closed[3] >= 1.0, "{out}");
    assert_eq!(rounds.len(), 20, "{out}");
    // Every round is printed, the settling ones unmarked: rounds 3..10 and 13..20 count.
    let marked: Vec<u32> = (rounds.iter())
        .filter(|r| r[12] == 1.0)
        .map(|r| r[0] as u32)
        .collect();
    assert_eq!(
        marked,
        [3, 4, 5, 6, 7, 8, 9, 13, 14, 15, 16, 17, 18, 19],
        "{out}"
    );
    assert_moves_within_the_cap(&rounds, 5000.0, &out);
    assert!(
        rounds.iter().map(|r| r[6]).fold(0.0, f64::max) == closed[3],
        "{out}"
    );
}

/// 20,000 accounts over 256 shards, 40 rounds, the hot accounts rotating at round 20.
const SETTLES: [&str; 4] = ["20000", "256", "40", "20"];

#[test]
fn load_under_smoothed_reports_beats_fanout_alone_in_every_converged_round() {
    // By default fanout and plans see loads smoothed as the server smooths reports, and a
    // round counts once they are within 5 % of the truth and the controller had 3 rounds.
    let (out, row, rounds) = simulate_load(SETTLES, &[]);
    assert!(
        out.contains("smoothed with a half-life of 2 rounds"),
        "{out}"
    );
    assert!(
        out.contains("Converged: rounds 12 or more after the start and after each rotation"),
        "{out}"
    );
    let (closed, fanned) = (
        row("keyspread with the loop"),
        row("keyspread, fanout raised but no moves"),
    );
    assert!(closed[0] <= 1.2 && closed[1] < fanned[1], "{out}");
    assert_eq!(rounds.len(), 40, "{out}");
    for r in rounds.iter().filter(|r| r[12] == 1.0) {
        assert!(r[4] < r[3], "round {r:?} in\n{out}");
        // The loop's own view is within a few % of the truth by then.
        assert!((r[5] - r[4]).abs() < 0.05 * r[4], "round {r:?} in\n{out}");
    }
    assert_moves_within_the_cap(&rounds, 20000.0, &out);
}

#[test]
fn load_under_smoothed_reports_reaches_the_goal_after_convergence() {
    let (out, row, rounds) = simulate_load(SETTLES, &[]);
    let closed = row("keyspread with the loop");
    assert!(
        closed[1] <= 1.10,
        "worst {} after convergence in\n{out}",
        closed[1]
    );
    for r in &rounds {
        assert!(
            r[7] <= 1.0,
            "more than 1 % of the keys moved: {r:?} in\n{out}"
        );
    }
}

#[test]
fn load_says_when_no_round_counts_as_converged() {
    let (out, ..) = simulate_load(["5000", "64", "12", "10"], &[]);
    assert!(
        out.contains(
            "no round counts as converged: 12 rounds of settling need --shift-every above 12"
        ),
        "{out}"
    );
    assert!(!out.contains("NaN"), "{out}");
}

#[test]
fn load_refuses_inputs_out_of_bounds_saying_which() {
    for (args, says) in [
        (&["--zipf", "-1"][..], "--zipf"),
        (&["--zipf", "nan"], "--zipf"),
        (&["--shift-every", "0"], "--shift-every"),
        (&["--accounts", "0"], "--accounts"),
        (&["--shards", "10001"], "--shards"),
        (&["--rounds", "100001"], "--rounds"),
        (&["--half-life-rounds", "1001"], "--half-life-rounds"),
    ] {
        let output = Command::new(env!("CARGO_BIN_EXE_keyspread"))
            .args(["simulate", "load"])
            .args(args)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "{args:?}");
        assert!(stderr.contains(says), "{args:?}: {stderr}");
    }
}
