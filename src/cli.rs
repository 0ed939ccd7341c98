//! Subcommands other than `serve`: what an operator runs by hand.

use std::fmt::Write as _;
use std::path::Path;

use crate::config::Token;
use crate::http::PutStream;
use crate::keyspace::{self, Allocator, Keyspace, Load, ShardMap, Skew};

mod export;
mod fanout;
mod import;
mod leases;
mod load;
mod reshard;
mod restore;
mod rows;

pub use export::{Exported, export_database, export_server, export_to};
pub use fanout::{FanoutFigures, fanout_figures, simulate_fanout};
pub use import::{ImportSummary, import};
pub use leases::{SchemeFigures, lease_figures, simulate_leases};
pub use load::{LoadRound, LoadSimulation, load_rounds, simulate_load};
pub use reshard::{JobProgress, reshard};
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
