//! Raw insert ceilings of the database keyspread runs on, through the product's own
//! connection code (`Store::connect`: the connection and pragmas the server writes with).
//! One writer inserts rows shaped like `assignments` into a scratch table for a bounded time,
//! first one row per transaction, then 256 rows per transaction in one multi-row INSERT.
//! Then, for comparison, the server's own write of a group of allocations
//! (`Store::insert_if_current`: the log check, the rows and their `allocate` events) with
//! 64 accounts per transaction, the most a group holds under the load script's 64 clients.
//!
//! ```text
//! cargo bench --bench store_ceiling                          # a temporary SQLite file
//! cargo bench --bench store_ceiling -- --secs 5 sqlite:///tmp/x.db
//! cargo bench --bench store_ceiling -- postgres://postgres:postgres@127.0.0.1/postgres
//! ```
//!
//! A SQLite URL must name a file that does not exist yet. On Postgres the URL names a
//! server: the bench creates a scratch database beside the named one and drops it
//! afterwards. The last line printed is one JSON object, for
//! `benches/load.py`.

mod common;
use common::SplitMix64;

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use keyspread::keyspace::{AccountId, HashKey};
use keyspread::store::{Actor, Actors, KeyRow, Store};
use sqlx::Connection;

/// Rows per transaction in the batched mode (one multi-row INSERT).
const BATCH: usize = 256;
/// Accounts per transaction in the server's own write: one group of the load script's
/// 64 clients.
const GROUP: usize = 64;
const TABLE: &str = "ceiling_assignments";

struct Args {
    url: Option<String>,
    secs: f64,
}

fn args() -> Args {
    let mut out = Args {
        url: std::env::var("KEYSPREAD_BENCH_DATABASE_URL").ok(),
        secs: 5.0,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--secs" => {
                out.secs = it
                    .next()
                    .and_then(|s| s.parse().ok())
                    .filter(|s: &f64| *s > 0.0 && *s <= 600.0)
                    .expect("--secs takes a number of seconds in (0, 600]");
            }
            // Cargo passes --bench to every bench binary; other flags are not ours.
            flag if flag.starts_with("--") => {}
            url => out.url = Some(url.to_owned()),
        }
    }
    out
}

/// One generated row: account, 16-byte big-endian key, weight, created_at.
struct Rows {
    next: u64,
    rng: SplitMix64,
}

impl Rows {
    fn row(&mut self) -> (String, Vec<u8>, i64, i64) {
        self.next += 1;
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        (
            format!("ceiling-{:09}", self.next),
            self.rng.next_u128().to_be_bytes().to_vec(),
            1,
            now.as_millis() as i64,
        )
    }
}

fn insert_sql(rows: usize) -> String {
    let values: Vec<String> = (0..rows)
        .map(|r| {
            let p = r * 4;
            format!("(${}, ${}, ${}, ${})", p + 1, p + 2, p + 3, p + 4)
        })
        .collect();
    format!(
        "INSERT INTO {TABLE} (account, hash_key, weight, created_at) VALUES {}",
        values.join(", ")
    )
}

/// Inserts `rows_per_tx` rows per transaction until `secs` have passed; answers rows/s.
async fn run(store: &Store, rows: &mut Rows, rows_per_tx: usize, secs: f64) -> (u64, f64) {
    let sql = insert_sql(rows_per_tx);
    let deadline = Duration::from_secs_f64(secs);
    let start = Instant::now();
    let mut inserted = 0u64;
    // The same statement on either backend; SQLite takes the write lock up front as the
    // product does (BEGIN IMMEDIATE).
    macro_rules! one_tx {
        ($tx:expr) => {{
            let mut tx = $tx.expect("begin");
            let mut query = sqlx::query(&sql);
            for _ in 0..rows_per_tx {
                let (account, key, weight, at) = rows.row();
                query = query.bind(account).bind(key).bind(weight).bind(at);
            }
            query.execute(&mut *tx).await.expect("insert");
            tx.commit().await.expect("commit");
        }};
    }
    while start.elapsed() < deadline {
        match store {
            Store::Sqlite(pools) => one_tx!(pools.writes.begin_with("BEGIN IMMEDIATE").await),
            Store::Postgres(pool) => one_tx!(pool.begin().await),
        }
        inserted += rows_per_tx as u64;
    }
    let elapsed = start.elapsed().as_secs_f64();
    (inserted, inserted as f64 / elapsed)
}

/// Commits groups of `GROUP` new accounts the way the server does until `secs` have
/// passed; answers accounts/s.
async fn run_groups(store: &Store, rows: &mut Rows, secs: f64) -> (u64, f64) {
    let deadline = Duration::from_secs_f64(secs);
    let start = Instant::now();
    let mut seen = store.log_end().await.expect("the log's end");
    let mut inserted = 0u64;
    let loopback = Actor::loopback();
    let by = Actors::One(&loopback);
    while start.elapsed() < deadline {
        let group: Vec<KeyRow> = (0..GROUP)
            .map(|_| {
                let (account, key, weight, created_at) = rows.row();
                KeyRow {
                    account: AccountId::parse(account).expect("account"),
                    index: 0,
                    hash_key: HashKey::from_be_bytes(key.try_into().expect("16 bytes")),
                    weight: weight as u64,
                    created_at,
                }
            })
            .collect();
        let ids = store
            .insert_if_current(seen, &group, by, group[0].created_at)
            .await
            .expect("insert_if_current");
        seen.end = ids.into_iter().max().unwrap_or(seen.end);
        inserted += GROUP as u64;
    }
    let elapsed = start.elapsed().as_secs_f64();
    (inserted, inserted as f64 / elapsed)
}

async fn execute(store: &Store, sql: &str) {
    match store {
        Store::Sqlite(pools) => sqlx::query(sql).execute(&pools.writes).await.map(drop),
        Store::Postgres(pool) => sqlx::query(sql).execute(pool).await.map(drop),
    }
    .unwrap_or_else(|e| panic!("{sql}: {e}"));
}

/// `url` with its database name replaced by `name` (query string kept).
fn with_database(url: &str, name: &str) -> String {
    let (base, query) = url.split_once('?').map_or((url, ""), |(b, q)| (b, q));
    let scheme_end = base.find("://").map_or(0, |i| i + 3);
    let host_end = base[scheme_end..]
        .find('/')
        .map_or(base.len(), |i| scheme_end + i);
    let mut out = format!("{}/{name}", &base[..host_end]);
    if !query.is_empty() {
        out = format!("{out}?{query}");
    }
    out
}

async fn pg_admin(url: &str, sql: &str) {
    let mut conn = sqlx::PgConnection::connect(url)
        .await
        .unwrap_or_else(|e| panic!("cannot connect to Postgres: {e}"));
    sqlx::query(sql)
        .execute(&mut conn)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
}

async fn measure(url: &str, secs: f64) -> serde_json::Value {
    let store = Store::connect(url).await.expect("Store::connect");
    let blob = match store {
        Store::Sqlite(_) => "BLOB",
        Store::Postgres(_) => "BYTEA",
    };
    execute(&store, &format!("DROP TABLE IF EXISTS {TABLE}")).await;
    execute(
        &store,
        &format!(
            "CREATE TABLE {TABLE} (account TEXT NOT NULL PRIMARY KEY, \
             hash_key {blob} NOT NULL UNIQUE, weight BIGINT NOT NULL, created_at BIGINT NOT NULL)"
        ),
    )
    .await;
    let mut rows = Rows {
        next: 0,
        rng: SplitMix64(1),
    };
    let (one_rows, one_rate) = run(&store, &mut rows, 1, secs).await;
    println!("one row per transaction:    {one_rate:>9.0} rows/s ({one_rows} rows in {secs} s)");
    let (batch_rows, batch_rate) = run(&store, &mut rows, BATCH, secs).await;
    println!(
        "{BATCH} rows per transaction: {batch_rate:>9.0} rows/s ({batch_rows} rows in {secs} s)"
    );
    execute(&store, &format!("DROP TABLE {TABLE}")).await;
    let (group_rows, group_rate) = run_groups(&store, &mut rows, secs).await;
    println!(
        "server's write, {GROUP}/tx:  {group_rate:>9.0} accounts/s ({group_rows} in {secs} s)"
    );
    match &store {
        Store::Sqlite(pools) => {
            pools.writes.close().await;
            pools.reads.close().await;
        }
        Store::Postgres(pool) => pool.close().await,
    }
    serde_json::json!({
        "store_ceiling": {
            "backend": if blob == "BLOB" { "sqlite" } else { "postgres" },
            "secs_per_mode": secs,
            "batch_rows": BATCH,
            "one_per_tx_rows_per_s": one_rate.round(),
            "batched_rows_per_s": batch_rate.round(),
            "group_rows": GROUP,
            "group_write_rows_per_s": group_rate.round(),
        }
    })
}

fn main() {
    let args = args();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let scratch = tempfile::tempdir().expect("temporary directory");
    let url = args
        .url
        .unwrap_or_else(|| format!("sqlite://{}", scratch.path().join("ceiling.db").display()));
    let result = runtime.block_on(async {
        if url.starts_with("postgres") {
            let name = format!("keyspread_ceiling_{}", std::process::id());
            pg_admin(&url, &format!("CREATE DATABASE {name}")).await;
            let result = measure(&with_database(&url, &name), args.secs).await;
            pg_admin(&url, &format!("DROP DATABASE {name}")).await;
            result
        } else {
            // The bench writes accounts into the file's tables: never into an existing one.
            let path = url
                .strip_prefix("sqlite://")
                .or_else(|| url.strip_prefix("sqlite:"))
                .unwrap_or(&url)
                .split('?')
                .next()
                .unwrap_or("");
            assert!(
                !std::path::Path::new(path).exists(),
                "{path} exists: give the path of a new SQLite file, the bench writes into it"
            );
            measure(&url, args.secs).await
        }
    });
    println!("{result}");
}
