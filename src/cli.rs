//! Subcommands other than `serve`: what an operator runs by hand.

use std::fmt::Write as _;
use std::path::Path;

use crate::config::Token;
use crate::keyspace::{self, Allocator, Keyspace, ListShards, Load, ShardMap, Skew};

mod rows;

pub use rows::{Row, Rows};

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

/// `keyspread streams put`: registers list-shards output with a running server.
pub async fn put_stream(
    url: &str,
    token: Option<&Token>,
    name: &str,
    file: &Path,
    primary: bool,
) -> Result<String, String> {
    let bytes = std::fs::read(file).map_err(|e| format!("cannot read {}: {e}", file.display()))?;
    // Check the file here first, so a typo is reported before anything is sent.
    ListShards::parse(&bytes)
        .and_then(|listed| listed.open_map(Keyspace::KINESIS))
        .map_err(|e| format!("{}: {e}", file.display()))?;
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
    fn simulate_reproduces_the_seed_figure() {
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

/// `keyspread import`: moves an existing table of `account,weight[,hash_key]` rows (a
/// header line is skipped) into keyspread, keeping the keys rows bring; one transaction
/// per 10,000 rows. `progress` is called after each chunk with the rows read so far.
pub async fn import(
    registry: &std::sync::Arc<crate::registry::Registry>,
    csv: impl std::io::Read,
    mut progress: impl FnMut(u64),
) -> Result<ImportSummary, String> {
    use crate::registry::{Allocated, NewAccount};

    let mut rows = Rows::new(csv, registry.keyspace());
    let mut summary = ImportSummary::default();
    let mut chunk: Vec<NewAccount> = Vec::with_capacity(IMPORT_CHUNK);
    loop {
        let next = rows.next().transpose()?;
        let more = next.is_some();
        if let Some(Row { line, parsed }) = next {
            summary.rows += 1;
            match parsed {
                Ok(row) if registry.lookup(row.account.as_str()).is_some() => summary.present += 1,
                Ok(row)
                    if row.key.is_some() && registry.is_held(row.key.expect("checked")).await =>
                {
                    let key = row.key.expect("checked");
                    summary.refused.push((
                        line,
                        format!("hash key {key} is already held by another account"),
                    ));
                }
                Ok(row) => chunk.push(row),
                Err(why) => summary.refused.push((line, why)),
            }
        }
        if chunk.len() >= IMPORT_CHUNK || (!more && !chunk.is_empty()) {
            let brought = chunk.iter().filter(|r| r.key.is_some()).count() as u64;
            let answers = registry
                .allocate_many(std::mem::take(&mut chunk))
                .await
                .map_err(|e| format!("import stopped after {} rows: {e}", summary.rows))?;
            let created = answers
                .iter()
                .filter(|a| matches!(a, Allocated::Created(_)))
                .count() as u64;
            summary.kept += brought;
            summary.allocated += created - brought;
            summary.present += answers.len() as u64 - created;
            progress(summary.rows);
        }
        if !more {
            return Ok(summary);
        }
    }
}
