//! `keyspread import` killed (SIGKILL) at random moments and run again ends with exactly the
//! table an uninterrupted import makes: every account, every key by index, every weight,
//! and each account's created_at kept from the run that created it.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::helpers::{Db, PgDatabase, fresh_database};
use crate::process::Rng;

/// Rows that bring key 0 of a fanout of 4 (three in four), and the others.
const FANNED: u64 = 6000;
const OTHERS: u64 = FANNED / 3;

/// Kills at least this many imports.
const KILLS: u32 = 20;

/// A CSV of [`FANNED`] rows that bring key 0 of four with weights of 4 to 13, and
/// [`OTHERS`] rows, half bringing a key of their own, half left to the walk with fanouts
/// of 1 to 3, all interleaved.
fn table(rng: &mut Rng) -> String {
    let mut csv = String::from("account,weight,hash_key,fanout\n");
    let mut keys = BTreeSet::new();
    let mut key = |rng: &mut Rng| loop {
        let key = (u128::from(rng.below(u64::MAX)) << 64) | u128::from(rng.below(u64::MAX));
        if keys.insert(key) {
            return key;
        }
    };
    for i in 0..FANNED + OTHERS {
        let account = format!("acct-{i:05}");
        let line = if i % 4 != 3 {
            format!("{account},{},{},4\n", 4 + rng.below(10), key(rng))
        } else if rng.below(2) == 0 {
            format!("{account},{},{}\n", 1 + rng.below(5), key(rng))
        } else {
            let fanout = 1 + rng.below(3);
            format!("{account},{},,{fanout}\n", fanout + rng.below(5))
        };
        csv.push_str(&line);
    }
    csv
}

fn import_command(file: &Path, url: &str) -> tokio::process::Command {
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_keyspread"));
    command
        .args(["import", file.to_str().unwrap(), "--database-url", url])
        .env_remove("DATABASE_URL")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true);
    command
}

/// Runs the import to its end, asserting success.
async fn import_whole(file: &Path, url: &str) {
    let out = import_command(file, url).output().await.unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
}

/// Starts the import and kills it with SIGKILL after `after`; false when it ended first.
async fn import_killed(file: &Path, url: &str, after: Duration) -> bool {
    let mut child = import_command(file, url).spawn().unwrap();
    tokio::select! {
        status = child.wait() => {
            assert!(status.unwrap().success(), "the import failed before it was killed");
            false
        }
        () = tokio::time::sleep(after) => {
            child.kill().await.unwrap();
            true
        }
    }
}

/// The table as `keyspread export` writes it, each line without its created_at.
async fn exported(url: &str, dir: &Path) -> Vec<Value> {
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_keyspread"))
        .args(["export", "--database-url", url])
        .env_remove("DATABASE_URL")
        .env_remove("KEYSPREAD_EXPORT_FROM")
        .current_dir(dir)
        .output()
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    (text.lines().skip(1))
        .map(|l| {
            let mut line: Value = serde_json::from_str(l).unwrap();
            line.as_object_mut().unwrap().remove("created_at");
            line
        })
        .collect()
}

/// Per account, the created_at of each of its key rows, by index (Unix milliseconds).
async fn created_at(url: &str) -> BTreeMap<String, Vec<i64>> {
    const SQL: &str = "SELECT account, created_at FROM assignments ORDER BY account, idx";
    let rows: Vec<(String, i64)> = match connect(url).await {
        Db::Sqlite(mut c) => sqlx::query_as(SQL).fetch_all(&mut c).await,
        Db::Postgres(mut c) => sqlx::query_as(SQL).fetch_all(&mut c).await,
    }
    .unwrap_or_else(not_yet_migrated);
    let mut by_account: BTreeMap<String, Vec<i64>> = BTreeMap::new();
    for (account, at) in rows {
        by_account.entry(account).or_default().push(at);
    }
    by_account
}

/// Accounts holding their fourth key: the fanned rows an import has grown so far.
async fn grown(url: &str) -> i64 {
    const SQL: &str = "SELECT COUNT(*) FROM assignments WHERE idx = 3";
    match connect(url).await {
        Db::Sqlite(mut c) => sqlx::query_scalar(SQL).fetch_one(&mut c).await,
        Db::Postgres(mut c) => sqlx::query_scalar(SQL).fetch_one(&mut c).await,
    }
    .unwrap_or_else(not_yet_migrated)
}

/// The database at `url`, an empty SQLite file made if an import killed early left none.
async fn connect(url: &str) -> Db {
    if url.starts_with("sqlite:") {
        Db::connect(&format!("{url}?mode=rwc")).await
    } else {
        Db::connect(url).await
    }
}

/// What a table not made yet holds (an import killed before or between its migrations,
/// each one transaction): nothing.
fn not_yet_migrated<T: Default>(err: sqlx::Error) -> T {
    let missing = err.to_string();
    assert!(
        ["no such table", "no such column", "does not exist"]
            .iter()
            .any(|m| missing.contains(m)),
        "{missing}"
    );
    T::default()
}

fn now_ms() -> i64 {
    let since = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
    since.unwrap().as_millis() as i64
}

/// Asserts that every key of an account has the account's created_at, within `window`;
/// answers each account's.
fn one_instant_each(
    created: &BTreeMap<String, Vec<i64>>,
    window: (i64, i64),
) -> BTreeMap<String, i64> {
    (created.iter())
        .map(|(account, at)| {
            assert!(at.iter().all(|t| *t == at[0]), "{account}: {at:?}");
            assert!(
                (window.0..=window.1).contains(&at[0]),
                "{account} created at {} outside the imports' {window:?}",
                at[0]
            );
            (account.clone(), at[0])
        })
        .collect()
}

/// A fresh database in a directory of its own (a SQLite file there, or on Postgres).
async fn database() -> (tempfile::TempDir, String, Option<PgDatabase>) {
    let dir = tempfile::tempdir().unwrap();
    let (url, db) = fresh_database(dir.path()).await;
    (dir, url, db)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_import_killed_at_random_moments_and_run_again_ends_as_an_uninterrupted_one() {
    let seed = std::env::var("KEYSPREAD_IMPORT_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| now_ms() as u64);
    println!("KEYSPREAD_IMPORT_SEED={seed}");
    let mut rng = Rng::new(seed);
    let work = tempfile::tempdir().unwrap();
    let file = work.path().join("table.csv");
    std::fs::write(&file, table(&mut rng)).unwrap();

    let (_dir, reference_url, _reference_db) = database().await;
    let started = (now_ms(), Instant::now());
    import_whole(&file, &reference_url).await;
    let whole = started.1.elapsed();
    let reference = exported(&reference_url, work.path()).await;
    assert_eq!(reference.len() as u64, FANNED + OTHERS);
    one_instant_each(&created_at(&reference_url).await, (started.0, now_ms()));

    let (mut kills, mut mid_grow, mut trials) = (0, 0, 0);
    while kills < KILLS || mid_grow == 0 {
        assert!(
            kills < 5 * KILLS,
            "{kills} kills, none while the import grew accounts"
        );
        trials += 1;
        let (_dir, url, _db) = database().await;
        let from = now_ms();
        for _ in 0..2 {
            let after = Duration::from_millis(rng.below(whole.as_millis() as u64 + 1));
            if !import_killed(&file, &url, after).await {
                break;
            }
            kills += 1;
            let n = grown(&url).await;
            mid_grow += u32::from(n > 0 && n < FANNED as i64);
        }
        let before = one_instant_each(&created_at(&url).await, (from, now_ms()));
        import_whole(&file, &url).await;
        let after = one_instant_each(&created_at(&url).await, (from, now_ms()));
        for (account, at) in &before {
            assert_eq!(
                after[account], *at,
                "{account}: created again by the run after"
            );
        }
        let table = exported(&url, work.path()).await;
        assert!(
            table == reference,
            "trial {trials}: the table differs from an uninterrupted import's (seed {seed})"
        );
    }
    println!(
        "{kills} kills in {trials} trials ({mid_grow} while the import grew accounts); an \
         uninterrupted import took {whole:?} on {}",
        crate::helpers::backend(&reference_url)
    );
}
