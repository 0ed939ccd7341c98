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
