//! `/shard-of` and `/distribution`: where keys land on a stream's shards.

use std::sync::Arc;

use axum::Json;
use axum::extract::State;
use axum::response::Response;
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::error::{ApiError, Problem};
use super::extract::Utf8Query;
use crate::AppState;
use crate::keyspace::{self, AccountId, HashKey, Shard, ShardMap, Skew};
use crate::registry::{MapSpec, Registry};

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(shard_of))
        .routes(routes!(distribution))
}

/// Which key to place: exactly one of `hash_key`, `account`, `partition_key`.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ShardOfParams {
    /// A hash key (decimal, at most 2^128 - 1).
    #[param(pattern = r"^[0-9]{1,39}$")]
    pub hash_key: Option<String>,
    /// An account: its assigned hash key (key 0, or the one `index` or `sub_key` picks), as
    /// producers send it now: the old key until a pending move switches.
    #[param(value_type = Option<AccountId>)]
    pub account: Option<String>,
    /// With `account`: which of its keys, `0..fanout`.
    #[param(minimum = 0, maximum = 1023)]
    pub index: Option<u32>,
    /// With `account`: the key a record of this sub-key goes under (the jump hash of its
    /// MD5 over the account's fanout; see the README's "Hot accounts").
    pub sub_key: Option<String>,
    /// A partition key: its MD5 hash, as Kinesis computes it.
    pub partition_key: Option<String>,
    /// Number of shards of a uniform map, 1..=10000 (or give `stream`).
    #[param(minimum = 1, maximum = 10000)]
    pub shards: Option<u64>,
    /// A registered stream whose map to use (or give `shards`).
    pub stream: Option<String>,
}

/// The shard a hash key lands on.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct ShardOf {
    pub hash_key: HashKey,
    /// When `index` or `sub_key` chose among an account's keys: which one `hash_key` is.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub index: Option<u32>,
    pub shard_index: usize,
    pub shard_id: String,
    pub starting_hash_key: HashKey,
    pub ending_hash_key: HashKey,
}

/// The map to measure against: exactly one of `shards` and `stream`.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct MapParams {
    /// Number of shards of a uniform map, 1..=10000.
    #[param(minimum = 1, maximum = 10000)]
    pub shards: Option<u64>,
    /// A registered stream whose map to use.
    pub stream: Option<String>,
}

impl MapParams {
    pub fn spec(self) -> Result<MapSpec, ApiError> {
        map_spec(self.shards, self.stream)
    }
}

/// One shard's share of the keys (an account of fanout K holds K keys, each with its
/// share of the weight).
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct ShardLoad {
    pub shard_index: usize,
    pub shard_id: String,
    pub starting_hash_key: HashKey,
    pub ending_hash_key: HashKey,
    /// Keys keyspread handed out that land here: one per account, K for an account of
    /// fanout K.
    pub accounts: u64,
    /// Their weight.
    pub weight: u64,
    /// Keys that would land here if Kinesis MD5-hashed the account names as partition
    /// keys (`account#0` .. `account#K-1` for an account of fanout K).
    pub md5_accounts: u64,
    /// Their weight.
    pub md5_weight: u64,
}

/// How accounts spread over a map, with keyspread's keys and with MD5 of the names.
#[derive(Debug, Serialize, ToSchema)]
pub struct Distribution {
    pub shards: Vec<ShardLoad>,
    /// Spread with keyspread's keys.
    pub skew: Skew,
    /// Spread had the account names been used as partition keys.
    pub md5_skew: Skew,
}

/// The map a query names: `shards=N` (uniform) or `stream=NAME` (registered), not both.
fn map_spec(shards: Option<u64>, stream: Option<String>) -> Result<MapSpec, ApiError> {
    match (shards, stream) {
        (Some(n), None) => Ok(MapSpec::Uniform(n)),
        (None, Some(name)) => Ok(MapSpec::Stream(name)),
        _ => Err(ApiError::bad_request(
            "give exactly one of `shards` (a uniform map) and `stream` (a registered stream)",
        )),
    }
}

/// Find the shard a hash key, an account or a partition key lands on.
#[utoipa::path(
    get, path = "/shard-of", tag = "shards",
    params(ShardOfParams),
    responses(
        (status = 200, description = "The shard", body = ShardOf),
        (status = 400, description = "Not exactly one of hash_key, account, partition_key, or of shards and stream; or a bad value", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "The account has no hash key, or no such stream", body = Problem, content_type = "application/problem+json"),
    )
)]
async fn shard_of(
    State(state): State<AppState>,
    Utf8Query(q): Utf8Query<ShardOfParams>,
) -> Result<Json<ShardOf>, ApiError> {
    let keyspace = state.registry.keyspace();
    if q.account.is_none() && (q.index.is_some() || q.sub_key.is_some()) {
        return Err(ApiError::bad_request(
            "`index` and `sub_key` choose among an `account`'s keys: give the account",
        ));
    }
    let mut index = None;
    let key = match (q.hash_key, q.account, q.partition_key) {
        (Some(k), None, None) => keyspace.parse(&k)?,
        (None, Some(account), None) => {
            let account = AccountId::parse(account)?;
            state
                .registry
                .vouch(std::time::Duration::from_secs(
                    state.lookup_cache.lifetime(),
                ))
                .await?;
            let a = state
                .registry
                .lookup(account.as_str())
                .ok_or_else(|| ApiError::not_found(format!("account {account} has no hash key")))?;
            let asked = q.index.is_some() || q.sub_key.is_some();
            // The keys producers send now: the old one until a pending move switches, and
            // not yet the new keys of a fanout raised by load.
            let keys = a.keys_at(crate::registry::now_ms()).keys;
            let fanout = keys.len() as u32;
            let i = match (q.index, q.sub_key) {
                (None, None) => 0,
                (Some(i), None) if i < fanout => i,
                (Some(i), None) => {
                    return Err(ApiError::bad_request(format!(
                        "account {account} has {fanout} keys: index must be below that, got {i}"
                    )));
                }
                (None, Some(sub_key)) => keyspace::sub_key_index(&sub_key, fanout),
                (Some(_), Some(_)) => {
                    return Err(ApiError::bad_request("give `index` or `sub_key`, not both"));
                }
            };
            index = asked.then_some(i);
            keys.as_slice()[i as usize]
        }
        (None, None, Some(pk)) => keyspace::md5_hash(&pk, keyspace),
        _ => {
            return Err(ApiError::bad_request(
                "give exactly one of `hash_key`, `account`, `partition_key`",
            ));
        }
    };
    let map = state.registry.resolve(&map_spec(q.shards, q.stream)?)?;
    let key_index = index;
    let Shard {
        index,
        id,
        start,
        end,
    } = map.shard_of(key);
    Ok(Json(ShardOf {
        hash_key: key,
        index: key_index,
        shard_index: index,
        shard_id: id,
        starting_hash_key: start,
        ending_hash_key: end,
    }))
}

/// Count accounts per shard, and compare with what MD5 of the names would give.
#[utoipa::path(
    get, path = "/distribution", tag = "shards",
    params(MapParams),
    responses(
        (status = 200, description = "Per-shard counts and skew", body = Distribution),
        (status = 400, description = "Not exactly one of shards and stream, or a bad shard count", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such stream", body = Problem, content_type = "application/problem+json"),
    )
)]
async fn distribution(
    State(state): State<AppState>,
    Utf8Query(q): Utf8Query<MapParams>,
) -> Result<Response, ApiError> {
    let map = state.registry.resolve(&q.spec()?)?;
    let registry = Arc::clone(&state.registry);
    state
        .heavy
        .json(move || Ok(distribution_of(&registry, &map)))
        .await
}

/// Accounts per shard of `map`, with keyspread's keys and with MD5 of the names.
pub(super) fn distribution_of(registry: &Registry, map: &ShardMap) -> Distribution {
    let loads = registry.loads(map);
    let md5 = registry.md5_loads(map);
    let shards = map
        .iter()
        .map(|s| ShardLoad {
            shard_index: s.index,
            shard_id: s.id,
            starting_hash_key: s.start,
            ending_hash_key: s.end,
            accounts: loads[s.index].count,
            weight: loads[s.index].weight,
            md5_accounts: md5[s.index].count,
            md5_weight: md5[s.index].weight,
        })
        .collect();
    Distribution {
        shards,
        skew: Skew::of(&loads),
        md5_skew: Skew::of(&md5),
    }
}
