//! Subcommands other than `serve`: what an operator runs by hand.

use std::fmt::Write as _;
use std::path::Path;

use crate::config::Token;
use crate::http::PutStream;
use crate::keyspace::{self, Allocator, Keyspace, Load, ShardMap, Skew};

mod export;
mod fanout;
mod leases;
mod load;
mod restore;
mod rows;

pub use export::{Exported, export_database, export_server};
pub use fanout::{FanoutFigures, fanout_figures, simulate_fanout};
pub use leases::{SchemeFigures, lease_figures, simulate_leases};
pub use load::{LoadRound, LoadSimulation, load_rounds, simulate_load};
pub use restore::{RestoreSummary, is_snapshot, restore};
pub use rows::{Row, Rows};

/// `keyspread token new`: 256 bits from the operating system, in URL-safe base64 (43
/// characters a bearer header carries as they are).
pub fn new_token() -> Result<String, String> {
    use base64::Engine as _;
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes).map_err(|e| format!("no random bytes from the system: {e}"))?;
    Ok(base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes))
}

/// `keyspread simulate`: per-shard spread of `accounts` accounts named "1".."N" over a
/// uniform map of `shards`: MD5-hashed by Kinesis, allocated by keyspread's plain walk, and
/// allocated with that map as the primary stream.
pub fn simulate(accounts: u64, shards: u64, keyspace: Keyspace) -> Result<String, keyspace::Error> {
    let map = ShardMap::uniform(keyspace, shards)?;
    let mut md5 = vec![Load::default(); map.len()];
    let mut walk = Allocator::new(keyspace);
    let mut primary = Allocator::new(keyspace);
    primary.balance_on(Some(map.clone()));
    for i in 1..=accounts {
        let shard = map.index_of(keyspace::md5_hash(&i.to_string(), keyspace));
        md5[shard] = md5[shard] + Load::one(1);
        walk.allocate(1)?;
        primary.allocate(1)?;
    }
    let per_shard = |alloc: &Allocator| -> Vec<Load> {
        map.iter().map(|s| alloc.load_in(s.start, s.end)).collect()
    };
    let rows = [
        ("MD5 of the names", md5),
        ("keyspread", per_shard(&walk)),
        ("keyspread, primary stream", per_shard(&primary)),
    ];
    let mut out = format!("{accounts} accounts (\"1\"..\"{accounts}\") over {shards} shards\n");
    let header = ("", "max", "min", "max/mean");
    writeln!(
        out,
        "{:<28}{:>9}{:>9}{:>10}",
        header.0, header.1, header.2, header.3
    )
    .expect("string");
    for (label, loads) in &rows {
        let skew = Skew::of(loads);
        let (max, min, ratio) = (skew.max, skew.min, skew.max_over_mean);
        writeln!(out, "{label:<28}{max:>9}{min:>9}{ratio:>10.3}").expect("string");
    }
    Ok(out)
}

/// `keyspread streams put`: registers a stream's map with a running server, from a file
/// holding any body `PUT /streams/{name}` takes (list-shards output, or `{"shard_count": N}`).
pub async fn put_stream(
    url: &str,
    token: Option<&Token>,
    name: &str,
    file: &Path,
    primary: bool,
) -> Result<String, String> {
    let bytes = std::fs::read(file).map_err(|e| format!("cannot read {}: {e}", file.display()))?;
    // Check the file as the server will (the same body, the same checks), so a typo is
    // reported before anything is sent.
    serde_json::from_slice::<PutStream>(&bytes)
        .map_err(|e| format!("{}: {e}", file.display()))?
        .into_map(Keyspace::KINESIS)
        .map_err(|e| format!("{}: {}", file.display(), e.detail()))?;
    let mut body: serde_json::Value =
        serde_json::from_slice(&bytes).map_err(|e| format!("{}: {e}", file.display()))?;
    if primary {
        body["primary"] = serde_json::Value::Bool(true);
    }
    let mut request = reqwest::Client::new()
        .put(format!("{}/streams/{name}", url.trim_end_matches('/')))
        .json(&body);
    if let Some(token) = token {
        request = request.bearer_auth(token.expose());
    }
    let response = request
        .send()
        .await
        .map_err(|e| format!("cannot reach {url}: {e}"))?;
    let status = response.status();
    let answer: serde_json::Value = response
        .json()
        .await
        .map_err(|e| format!("unreadable answer: {e}"))?;
    if !status.is_success() {
        return Err(format!(
            "{status}: {}",
            answer["detail"].as_str().unwrap_or_default()
        ));
    }
    let counts = |side: &serde_json::Value| -> String {
        side.as_array().map_or("-".into(), |shards| {
            shards
                .iter()
                .map(|s| s["accounts"].to_string())
                .collect::<Vec<_>>()
                .join(" ")
        })
    };
    let plan = &answer["rebalance"];
    Ok(format!(
        "{} stream {name}: {} open shards{}\naccounts per shard before: {}\naccounts per shard after:  {}\n\
         rebalance to restore ceil(accounts/shards): {} moves (plan {}; apply with POST /rebalance)\n",
        if status == reqwest::StatusCode::CREATED {
            "registered"
        } else {
            "updated"
        },
        answer["stream"]["shard_count"],
        if answer["stream"]["primary"] == true {
            " (primary)"
        } else {
            ""
        },
        counts(&answer["before"]),
        counts(&answer["after"]),
        plan["moves"].as_array().map_or(0, Vec::len),
        plan["plan_id"].as_str().unwrap_or_default(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn simulate_reproduces_the_readme_figure() {
        let out = simulate(14, 2, Keyspace::KINESIS).unwrap();
        let md5: Vec<&str> = out.lines().nth(2).unwrap().split_whitespace().collect();
        let ours: Vec<&str> = out.lines().nth(3).unwrap().split_whitespace().collect();
        assert_eq!(md5[md5.len() - 3..], ["11", "3", "1.571"]);
        assert_eq!(ours[ours.len() - 3..], ["7", "7", "1.000"]);
        let odd = simulate(1000, 10, Keyspace::KINESIS).unwrap();
        let primary: Vec<&str> = odd.lines().nth(4).unwrap().split_whitespace().collect();
        assert_eq!(primary[primary.len() - 3..], ["100", "100", "1.000"]);
    }
}

/// What `keyspread import` did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct ImportSummary {
    pub rows: u64,
    /// Accounts given a key by the walk.
    pub allocated: u64,
    /// Accounts that brought their own key and kept it.
    pub kept: u64,
    /// Accounts keyspread already had (left as they were).
    pub present: u64,
    /// Rows refused, with their line numbers and why.
    pub refused: Vec<(u64, String)>,
}

/// Rows per transaction: large enough to amortize the commit, small enough to show progress.
const IMPORT_CHUNK: usize = 10_000;

/// Most keys one import transaction places, over its rows' fanouts.
const IMPORT_CHUNK_KEYS: u64 = 16_384;

/// The two passes over an import file. Rows that bring their key go first, so that no row
/// left to the walk takes a key a later row of the file brings.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Pass {
    /// Rows with a hash key, and every refused row.
    Keyed,
    /// Rows without one.
    Keyless,
}

/// `keyspread import`: moves an existing table of `account,weight[,hash_key[,fanout]]` rows
/// (a header line is skipped) into keyspread, keeping the keys rows bring; one transaction
/// per 10,000 rows. `open` is called twice: the rows that bring a key are placed in a first
/// pass over the file, the others in a second. A row that brings key 0 of several gets its
/// other keys once every brought key is placed, so that none of them takes one a later row
/// brings. `progress` is called after each transaction with the rows handled so far.
pub async fn import<R: std::io::Read>(
    registry: &std::sync::Arc<crate::registry::Registry>,
    open: impl Fn() -> std::io::Result<R>,
    mut progress: impl FnMut(u64),
) -> Result<ImportSummary, String> {
    let mut summary = ImportSummary::default();
    let mut grow_later = Vec::new();
    for pass in [Pass::Keyed, Pass::Keyless] {
        let csv = open().map_err(|e| format!("cannot read the file: {e}"))?;
        import_pass(
            registry,
            csv,
            pass,
            &mut summary,
            &mut grow_later,
            &mut progress,
        )
        .await?;
    }
    for (account, fanout) in grow_later {
        registry
            .update(
                account,
                crate::registry::Update {
                    weight: None,
                    fanout: Some(fanout),
                    max_fanout: None,
                    reason: crate::store::MoveReason::Admin,
                },
                &crate::store::Actor::new(crate::store::Actor::IMPORT),
                &crate::registry::Ticket::unbounded(),
            )
            .await
            .map_err(|e| format!("import stopped after {} rows: {e}", summary.rows))?;
    }
    Ok(summary)
}

/// One pass over the file: places the rows `pass` handles, in chunks of [`IMPORT_CHUNK`]
/// rows or [`IMPORT_CHUNK_KEYS`] keys.
async fn import_pass(
    registry: &std::sync::Arc<crate::registry::Registry>,
    csv: impl std::io::Read,
    pass: Pass,
    summary: &mut ImportSummary,
    grow_later: &mut Vec<(crate::keyspace::AccountId, u32)>,
    progress: &mut impl FnMut(u64),
) -> Result<(), String> {
    let mut rows = Rows::new(csv, registry.keyspace());
    let mut chunk = Vec::with_capacity(IMPORT_CHUNK);
    let mut keys = 0u64;
    loop {
        let next = rows.next().transpose()?;
        let more = next.is_some();
        if let Some(Row { line, parsed }) = next {
            match parsed {
                Ok(row) if row.key.is_some() != (pass == Pass::Keyed) => {}
                Err(why) if pass == Pass::Keyed => {
                    summary.rows += 1;
                    summary.refused.push((line, why));
                }
                Err(_) => {}
                Ok(row) => {
                    summary.rows += 1;
                    if registry.lookup(row.account.as_str()).is_some() {
                        summary.present += 1;
                    } else if let Some(key) = row.key
                        && registry.is_held(key).await
                    {
                        let why = format!("hash key {key} is already held by another account");
                        summary.refused.push((line, why));
                    } else if row.key.is_some() && row.fanout > 1 {
                        grow_later.push((row.account.clone(), row.fanout));
                        keys += 1;
                        chunk.push(crate::registry::NewAccount { fanout: 1, ..row });
                    } else {
                        keys += u64::from(row.fanout);
                        chunk.push(row);
                    }
                }
            }
        }
        let full = chunk.len() >= IMPORT_CHUNK || keys >= IMPORT_CHUNK_KEYS;
        if full || (!more && !chunk.is_empty()) {
            keys = 0;
            place(registry, std::mem::take(&mut chunk), pass, summary).await?;
            progress(summary.rows);
        }
        if !more {
            return Ok(());
        }
    }
}

/// Gives one chunk of rows their keys, in one transaction, and counts what it did.
async fn place(
    registry: &std::sync::Arc<crate::registry::Registry>,
    chunk: Vec<crate::registry::NewAccount>,
    pass: Pass,
    summary: &mut ImportSummary,
) -> Result<(), String> {
    use crate::registry::Allocated;

    let answers = registry
        .allocate_many(
            chunk,
            &crate::store::Actor::new(crate::store::Actor::IMPORT),
            &crate::registry::Ticket::unbounded(),
        )
        .await
        .map_err(|e| format!("import stopped after {} rows: {e}", summary.rows))?;
    let created = answers
        .iter()
        .filter(|a| matches!(a, Allocated::Created(_)))
        .count() as u64;
    match pass {
        Pass::Keyed => summary.kept += created,
        Pass::Keyless => summary.allocated += created,
    }
    summary.present += answers.len() as u64 - created;
    Ok(())
}

#[cfg(test)]
mod import_tests {
    use std::collections::HashSet;

    use proptest::prelude::*;

    use super::*;
    use crate::registry::Registry;
    use crate::store::Store;

    /// The first keys the walk hands out from empty: the ones a keyless row would take.
    fn first_picks(n: usize) -> Vec<u128> {
        let mut walk = Allocator::new(Keyspace::KINESIS);
        (0..n).map(|_| walk.allocate(1).unwrap().0).collect()
    }

    /// A file of keyed rows (distinct keys, most of them the walk's first picks) and keyless
    /// rows, shuffled: `(account, weight, key)` per row.
    fn files() -> impl Strategy<Value = Vec<(String, u64, Option<u128>)>> {
        let keys = prop::sample::subsequence(first_picks(16), 0..=12)
            .prop_flat_map(|keys| (Just(keys), prop::collection::vec(any::<u128>(), 0..3)));
        (keys, 0usize..12)
            .prop_flat_map(|((mut keys, random), keyless)| {
                keys.extend(random.into_iter().filter(|k| !first_picks(16).contains(k)));
                let rows = keys
                    .into_iter()
                    .map(Some)
                    .chain(std::iter::repeat_n(None, keyless))
                    .collect::<Vec<_>>();
                let weights = prop::collection::vec(1u64..=3, rows.len());
                (Just(rows), weights)
            })
            .prop_map(|(keys, weights)| {
                keys.into_iter()
                    .zip(weights)
                    .enumerate()
                    .map(|(i, (key, weight))| (format!("acct-{i}"), weight, key))
                    .collect::<Vec<_>>()
            })
            .prop_shuffle()
    }

    async fn import_file(
        rows: &[(String, u64, Option<u128>)],
    ) -> (ImportSummary, Vec<(String, u128)>) {
        let csv: String = rows
            .iter()
            .map(|(account, weight, key)| match key {
                Some(key) => format!("{account},{weight},{key}\n"),
                None => format!("{account},{weight}\n"),
            })
            .collect();
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}", dir.path().join("k.db").display());
        let store = Store::connect(&url).await.unwrap();
        let registry = Registry::open(store, Keyspace::KINESIS, None)
            .await
            .unwrap();
        let summary = import(&registry, || Ok(csv.as_bytes()), |_| {})
            .await
            .unwrap();
        let held = rows
            .iter()
            .filter_map(|(account, ..)| registry.lookup(account))
            .map(|a| (a.hash_key().0, a.account.into_string()))
            .map(|(key, account)| (account, key))
            .collect();
        (summary, held)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(32))]

        /// Whatever the order of the file, every row is placed, each keyed row on exactly its
        /// key, and no key twice.
        #[test]
        fn keyed_rows_keep_their_keys_in_any_order(rows in files()) {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            let (summary, held) = runtime.block_on(import_file(&rows));
            let keyed = rows.iter().filter(|r| r.2.is_some()).count() as u64;
            prop_assert_eq!(
                (summary.kept, summary.allocated, summary.present, summary.refused.len()),
                (keyed, rows.len() as u64 - keyed, 0, 0)
            );
            prop_assert_eq!(held.len(), rows.len());
            for ((account, _, brought), (held_by, key)) in rows.iter().zip(&held) {
                prop_assert_eq!(account, held_by);
                if let Some(brought) = brought {
                    prop_assert_eq!(brought, key);
                }
            }
            let distinct: HashSet<u128> = held.iter().map(|(_, key)| *key).collect();
            prop_assert_eq!(distinct.len(), held.len());
        }
    }
}
