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
    let (ring, ours) = (row("hash ring (seed 004)"), row("keyspread"));
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

/// The small instance of `simulate load` with `extra` flags: its output, the summary's row
/// of a scheme (| scheme | max ÷ mean median | worst | moved median | worst |) and the
/// per-round rows (round, MD5, alone, fanned, looped, moved, added, released, keys).
fn simulate_load(extra: &[&str]) -> (String, impl Fn(&str) -> Vec<f64>, Vec<Vec<f64>>) {
    let mut args = vec![
        "load",
        "--accounts",
        "5000",
        "--shards",
        "64",
        "--zipf",
        "1.1",
        "--rounds",
        "20",
        "--shift-every",
        "10",
    ];
    args.extend(extra);
    let out = simulate(&args);
    let rounds: Vec<Vec<f64>> = out
        .lines()
        .filter(|l| l.starts_with("| ") && l[2..].starts_with(|c: char| c.is_ascii_digit()))
        .map(|l| {
            (l.split('|').skip(1))
                .filter_map(|c| c.trim().parse().ok())
                .collect()
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

#[test]
fn load_compares_md5_the_placement_alone_and_the_loop() {
    let (out, row, rounds) = simulate_load(&["--half-life-rounds", "0"]);
    assert!(out.contains("see each round's exact loads"), "{out}");
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
    assert!(fanned[1] > 1.5 && fanned[3] == 0.0, "{out}");
    // Only the loop moves keys: per round at most 1 % of those it planned over.
    assert_eq!((md5[3], alone[3]), (0.0, 0.0), "{out}");
    assert!(closed[3] >= 1.0, "{out}");
    assert_eq!(rounds.len(), 20, "{out}");
    for r in &rounds {
        let (moved, keys) = (r[5], r[8]);
        assert!(moved <= (keys / 100.0).floor().max(1.0), "{r:?} in\n{out}");
    }
    assert!(
        rounds.iter().map(|r| r[5]).fold(0.0, f64::max) == closed[3],
        "{out}"
    );
}

#[test]
fn load_under_smoothed_reports_beats_fanout_alone_in_every_settled_round() {
    // By default fanout and plans see loads smoothed as the server smooths reports.
    let (out, row, rounds) = simulate_load(&[]);
    assert!(
        out.contains("smoothed with a half-life of 2 rounds"),
        "{out}"
    );
    let (closed, fanned) = (
        row("keyspread with the loop"),
        row("keyspread, fanout raised but no moves"),
    );
    // Hot accounts' new keys go where the smoothed loads are least, a moved key stays but
    // its account's other keys may move, and two heavy keys on one shard part: after
    // convergence the loop's median is within 1.2 × the mean and its worst (the lag of
    // the smoothing, three rounds after a rotation) within 1.6, below fanout alone in every
    // such round, moving at most 1 % of the keys per round.
    assert!(
        closed[0] <= 1.2 && closed[1] <= 1.6 && closed[1] < fanned[1],
        "{out}"
    );
    assert_eq!(rounds.len(), 20, "{out}");
    for r in rounds.iter().filter(|r| r[0] as u32 % 10 >= 3) {
        assert!(r[4] < r[3], "round {r:?} in\n{out}");
    }
    for r in &rounds {
        let (moved, keys) = (r[5], r[8]);
        assert!(moved <= (keys / 100.0).floor().max(1.0), "{r:?} in\n{out}");
    }
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
