//! `/streams`: register real shard maps, see what a reshard did, plan the next one.

use std::sync::Arc;

use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::aws_cli;
use super::error::{ApiError, Problem, in_time};
use super::extract::whole_number;
use super::idempotency;
use super::rebalance::RebalancePlan;
use crate::AppState;
use crate::keyspace::{
    HashKey, Keyspace, ListShards, ListedShard, Load, Reshard, Shard, ShardMap, Skew,
    is_kinesis_name,
};
use crate::registry;
pub use crate::registry::StreamMap;
use crate::registry::{Registry, Source, Stream, Ticket};
use crate::store::Actor;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(list_streams))
        .routes(routes!(get_stream, delete_stream))
        .routes(routes!(split_plan))
}

/// `PUT /streams/{name}`, apart: list-shards output of 10,000 shards is megabytes.
pub fn put_router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(put_stream))
}

/// A stream's map: list-shards output as-is, or a shard count for a uniform map.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(remote = "Self")]
pub struct PutStream {
    /// The shards exactly as `aws kinesis list-shards` prints them, closed ones included;
    /// the open ones must tile [0, 2^128).
    #[schema(min_items = 1)]
    #[serde(rename = "Shards")]
    pub shards: Option<Vec<ListedShard>>,
    /// Instead of `Shards`: a uniform map of this many shards, as CreateStream makes;
    /// at most 10000 (Kinesis' default limit per stream), as for `Shards`.
    #[schema(minimum = 1, maximum = 10000)]
    #[serde(default, deserialize_with = "whole_number::optional")]
    pub shard_count: Option<u64>,
    /// Whether new keys balance on this stream's shards; left out, the stream keeps its role.
    pub primary: Option<bool>,
    /// `true`: keyspread lists the stream from Kinesis itself (ListShards), registers that
    /// map and lists it again every `--stream-sync-interval-s` (no map in the body then).
    /// `false`: stops watching; with a map, registers it, without, keeps the current one.
    /// Left out, a map given to a watched stream is refused (409).
    pub watch: Option<bool>,
}

super::extract::objects_only!(PutStream);

impl PutStream {
    /// The map this body describes, checked as the route checks it (and as `keyspread
    /// streams put --from` does before sending a file); every refusal is a 422.
    pub fn into_map(self, keyspace: Keyspace) -> Result<StreamMap, ApiError> {
        let unprocessable = |e: crate::keyspace::Error| ApiError::unprocessable(e.to_string());
        match (self.shards, self.shard_count) {
            (Some(shards), None) => {
                let listed = ListShards { shards };
                Ok(StreamMap {
                    map: listed.open_map(keyspace).map_err(unprocessable)?,
                    lease_shards: Some(listed.lease_shards(keyspace).map_err(unprocessable)?),
                    next_shard: listed.next_shard_number(),
                })
            }
            (None, Some(count)) => {
                let uniform = ShardMap::uniform(keyspace, count).map_err(unprocessable)?;
                let open = uniform.iter().map(|s| (s.id, s.start, s.end)).collect();
                Ok(StreamMap {
                    map: ShardMap::explicit(keyspace, open)?,
                    lease_shards: None,
                    next_shard: count,
                })
            }
            _ => Err(ApiError::unprocessable(
                "give exactly one of `Shards` (list-shards output) and `shard_count`",
            )),
        }
    }
}

/// One open shard.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct ShardRange {
    pub shard_id: String,
    pub starting_hash_key: HashKey,
    pub ending_hash_key: HashKey,
}

/// How a stream's open shards divide the keyspace.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum MapKind {
    /// Equal ranges, as CreateStream and UNIFORM_SCALING make (whatever the shard ids).
    Uniform,
    /// Any other tiling, as SplitShard and MergeShards leave it.
    Explicit,
}

/// A registered stream without its shards: an entry of `GET /streams`.
#[derive(Debug, Serialize, ToSchema)]
pub struct StreamSummary {
    pub name: String,
    /// New keys balance on this stream's shards.
    pub primary: bool,
    pub shard_count: usize,
    pub kind: MapKind,
    /// The id of the `stream_put` event that registered this map.
    pub version: i64,
    /// The number Kinesis will give the next new shard.
    pub next_shard_number: u64,
    /// When the map was last registered (RFC 3339).
    #[schema(format = DateTime)]
    pub updated_at: String,
    /// Whether Kinesis is the map's source: listed again every sync interval.
    pub watch: bool,
    /// When a listing from Kinesis last succeeded (RFC 3339); null if it never did.
    #[schema(format = DateTime)]
    pub synced_at: Option<String>,
    /// Why the last listing from Kinesis failed (throttled, the stream deleted there,
    /// Kinesis unreachable: the map stays as last listed); null once one succeeds.
    pub sync_error: Option<String>,
}

impl From<&Stream> for StreamSummary {
    fn from(s: &Stream) -> Self {
        StreamSummary {
            name: s.name.clone(),
            primary: s.primary,
            shard_count: s.map.len(),
            kind: if s.uniform {
                MapKind::Uniform
            } else {
                MapKind::Explicit
            },
            version: s.version,
            next_shard_number: s.next_shard,
            updated_at: super::timestamp(s.updated_at),
            watch: s.watch,
            synced_at: s.sync.synced_at.map(super::timestamp),
            sync_error: s.sync.sync_error.clone(),
        }
    }
}

/// A registered stream with its open shards.
#[derive(Debug, Serialize, ToSchema)]
pub struct StreamBody {
    pub name: String,
    /// New keys balance on this stream's shards.
    pub primary: bool,
    pub shard_count: usize,
    pub kind: MapKind,
    /// The id of the `stream_put` event that registered this map.
    pub version: i64,
    pub shards: Vec<ShardRange>,
    /// The number Kinesis will give the next new shard.
    pub next_shard_number: u64,
    /// When the map was last registered (RFC 3339).
    #[schema(format = DateTime)]
    pub updated_at: String,
    /// Whether Kinesis is the map's source: listed again every sync interval.
    pub watch: bool,
    /// When a listing from Kinesis last succeeded (RFC 3339); null if it never did.
    #[schema(format = DateTime)]
    pub synced_at: Option<String>,
    /// Why the last listing from Kinesis failed (throttled, the stream deleted there,
    /// Kinesis unreachable: the map stays as last listed); null once one succeeds.
    pub sync_error: Option<String>,
}

impl From<&Stream> for StreamBody {
    fn from(s: &Stream) -> Self {
        let StreamSummary {
            name,
            primary,
            shard_count,
            kind,
            version,
            next_shard_number,
            updated_at,
            watch,
            synced_at,
            sync_error,
        } = StreamSummary::from(s);
        StreamBody {
            name,
            primary,
            shard_count,
            kind,
            version,
            shards: s
                .map
                .iter()
                .map(|sh| ShardRange {
                    shard_id: sh.id,
                    starting_hash_key: sh.start,
                    ending_hash_key: sh.end,
                })
                .collect(),
            next_shard_number,
            updated_at,
            watch,
            synced_at,
            sync_error,
        }
    }
}

/// Accounts on one shard.
#[derive(Debug, Serialize, ToSchema)]
pub struct ShardCount {
    pub shard_id: String,
    pub starting_hash_key: HashKey,
    pub ending_hash_key: HashKey,
    pub accounts: u64,
    pub weight: u64,
}

impl ShardCount {
    fn new(shard: Shard, load: Load) -> Self {
        ShardCount {
            shard_id: shard.id,
            starting_hash_key: shard.start,
            ending_hash_key: shard.end,
            accounts: load.count,
            weight: load.weight,
        }
    }

    fn of_map(map: &ShardMap, loads: &[Load]) -> Vec<ShardCount> {
        map.iter()
            .zip(loads)
            .map(|(s, l)| ShardCount::new(s, *l))
            .collect()
    }
}

/// What registering a map did to balance, and the plan that would restore it.
#[derive(Debug, Serialize, ToSchema)]
pub struct StreamChange {
    pub stream: StreamBody,
    /// Accounts per shard on the map this one replaced; null for a new stream.
    pub before: Option<Vec<ShardCount>>,
    pub before_skew: Option<Skew>,
    /// Accounts per shard on the new map.
    pub after: Vec<ShardCount>,
    pub after_skew: Skew,
    /// The moves that would bring every shard to at most ceil(keys / shards); not
    /// applied: `POST /rebalance` with its `plan_id` applies it.
    pub rebalance: RebalancePlan,
    /// Accounts with several keys that no longer lie on distinct shards of the primary
    /// map (a map change can leave them so): the rebalance plan's first `mends` moves
    /// spread them again. 0 when every account is spread.
    pub unspread_accounts: usize,
    /// Up to 20 of them, by name.
    pub unspread_sample: Vec<String>,
}

/// A stream name in a path.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Path)]
pub struct StreamPath {
    /// Kinesis stream name: 1 to 128 of `a-z A-Z 0-9 _ . -`.
    #[param(pattern = r"^[a-zA-Z0-9_.-]{1,128}$")]
    pub name: String,
}

/// Kinesis stream names: 1 to 128 of `a-z A-Z 0-9 _ . -`.
fn stream_name(name: String) -> Result<String, ApiError> {
    if is_kinesis_name(&name) {
        Ok(name)
    } else {
        Err(ApiError::bad_request(format!(
            "stream name {name:?} must be 1 to 128 characters of a-z, A-Z, 0-9, '_', '.', '-'"
        )))
    }
}

/// Most streams one page of `GET /streams` holds: each a summary of a few hundred bytes,
/// never its shards.
const MAX_STREAM_PAGE: u32 = 1000;

/// Paging through streams by name.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct StreamListParams {
    /// Start after this name (the last of the previous page): names sort bytewise.
    pub after: Option<String>,
    /// Page size, 1..=1000 (default 100).
    #[param(minimum = 1, maximum = 1000)]
    pub limit: Option<u32>,
}

/// List registered streams, paged by name.
#[utoipa::path(get, path = "/streams", tag = "streams",
    params(StreamListParams),
    responses(
        (status = 200, description = "One page of registered streams, by name, without their shards (`GET /streams/{name}` has them)", body = Vec<StreamSummary>,
         headers(("Link" = String, description = "`</streams?after=NAME&limit=N>; rel=\"next\"` when more streams follow"))),
        (status = 400, description = "Invalid paging parameters", body = Problem, content_type = "application/problem+json"),
    ))]
async fn list_streams(
    State(state): State<AppState>,
    Query(params): Query<StreamListParams>,
) -> Result<impl IntoResponse, ApiError> {
    let limit = super::page_limit(params.limit, MAX_STREAM_PAGE)?;
    let (streams, more) = state
        .registry
        .streams(params.after.as_deref(), limit as usize);
    let mut headers = HeaderMap::new();
    if more {
        let last = &streams.last().expect("a full page").name;
        // Stream names need no escaping in a URL.
        let link = format!("</streams?after={last}&limit={limit}>; rel=\"next\"");
        headers.insert(header::LINK, link.parse().expect("a valid header value"));
    }
    let page: Vec<StreamSummary> = streams.iter().map(StreamSummary::from).collect();
    Ok((headers, Json(page)))
}

/// Register or replace a stream's shard map, or watch it in Kinesis.
#[utoipa::path(
    put, path = "/streams/{name}", tag = "streams",
    params(StreamPath),
    request_body = PutStream,
    responses(
        (status = 201, description = "Registered", body = StreamChange),
        (status = 200, description = "Replaced; `before` shows the old map's balance", body = StreamChange),
        (status = 400, description = "Invalid stream name, or a body that is not JSON", body = Problem, content_type = "application/problem+json"),
        (status = 413, description = "Body over 16 MiB", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "`{\"watch\": false}` without a map for a stream not registered", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "A map given for a watched stream: Kinesis is its source (send `\"watch\": false` with it to stop watching)", body = Problem, content_type = "application/problem+json"),
        (status = 415, description = "A body sent without Content-Type: application/json", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Not list-shards output, a shard id Kinesis would not give, more than 10000 open shards, or open shards that do not tile the keyspace (the detail names the range); `\"watch\": true` with a map; a stream Kinesis does not have", body = Problem, content_type = "application/problem+json"),
        (status = 502, description = "`\"watch\": true`: Kinesis did not answer, or failed", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "`\"watch\": true`: no AWS region or no AWS credentials (the detail says which, and how to give it), or Kinesis throttles the listing", body = Problem, content_type = "application/problem+json",
         headers(("Retry-After" = u32, description = "Seconds to wait before trying again"))),
    )
)]
async fn put_stream(
    State(state): State<AppState>,
    Extension(actor): Extension<Actor>,
    Extension(ticket): Extension<Ticket>,
    Path(StreamPath { name }): Path<StreamPath>,
    Json(body): Json<PutStream>,
) -> Result<(StatusCode, Json<StreamChange>), ApiError> {
    let name = stream_name(name)?;
    let (primary, watch) = (body.primary, body.watch);
    let keyspace = state.registry.keyspace();
    let given = body.shards.is_some() || body.shard_count.is_some();
    let (map, source) = match (watch, given) {
        (Some(true), true) => {
            return Err(ApiError::unprocessable(
                "`\"watch\": true` takes no map: keyspread lists the stream's shards from \
                 Kinesis itself; leave out `Shards` and `shard_count`",
            ));
        }
        (Some(true), false) => {
            let (kinesis, map) = state.watch.list(&name, keyspace).await?;
            (Some(map), Source::Watched(kinesis))
        }
        (Some(false), false) => (None, Source::Unwatched),
        (Some(false), true) => (Some(body.into_map(keyspace)?), Source::Unwatched),
        (None, _) => (Some(body.into_map(keyspace)?), Source::Given),
    };
    idempotency::tell_json(&ticket, stream_changed);
    let change = (state.registry).put_stream_from(name, map, primary, source, &actor, &ticket);
    Ok(stream_changed(in_time(&state, &ticket, change).await?))
}

/// What registering a map answers: 201 for a new stream, 200 for a replaced map.
fn stream_changed(change: registry::StreamChange) -> (StatusCode, Json<StreamChange>) {
    let status = if change.before.is_some() {
        StatusCode::OK
    } else {
        StatusCode::CREATED
    };
    let (plan_id, plan) = change.rebalance;
    let mut unspread: Vec<String> = plan.moves[..plan.mends]
        .iter()
        .map(|m| m.account.clone())
        .collect();
    unspread.dedup();
    let unspread_accounts = unspread.len();
    unspread.truncate(20);
    (
        status,
        Json(StreamChange {
            stream: StreamBody::from(&change.stream),
            before_skew: change.before.as_ref().map(|(_, loads)| Skew::of(loads)),
            before: change
                .before
                .map(|(map, loads)| ShardCount::of_map(&map, &loads)),
            after_skew: Skew::of(&change.after),
            after: ShardCount::of_map(&change.stream.map, &change.after),
            rebalance: RebalancePlan::new(plan_id, plan),
            unspread_accounts,
            unspread_sample: unspread,
        }),
    )
}

/// Show a registered stream.
#[utoipa::path(
    get, path = "/streams/{name}", tag = "streams",
    params(StreamPath),
    responses(
        (status = 200, description = "The stream", body = StreamBody),
        (status = 404, description = "No such stream", body = Problem, content_type = "application/problem+json"),
    )
)]
async fn get_stream(
    State(state): State<AppState>,
    Path(StreamPath { name }): Path<StreamPath>,
) -> Result<Json<StreamBody>, ApiError> {
    state
        .registry
        .stream(&name)
        .map(|s| Json(StreamBody::from(&s)))
        .ok_or_else(|| ApiError::not_found(format!("no stream named {name:?} is registered")))
}

/// Forget a stream.
#[utoipa::path(
    delete, path = "/streams/{name}", tag = "streams",
    params(StreamPath),
    responses(
        (status = 204, description = "Forgotten; if it was primary, new keys use the plain walk"),
        (status = 404, description = "No such stream", body = Problem, content_type = "application/problem+json"),
    )
)]
async fn delete_stream(
    State(state): State<AppState>,
    Extension(actor): Extension<Actor>,
    Extension(ticket): Extension<Ticket>,
    Path(StreamPath { name }): Path<StreamPath>,
) -> Result<StatusCode, ApiError> {
    idempotency::tell(&ticket, |_: &()| idempotency::empty(StatusCode::NO_CONTENT));
    let change = state.registry.delete_stream(name, &actor, &ticket);
    in_time(&state, &ticket, change).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// How many open shards to plan for.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct SplitParams {
    /// Open shards wanted, 1..=10000.
    #[param(minimum = 1, maximum = 10000)]
    pub target: u64,
}

/// One SplitShard or MergeShards call.
#[derive(Debug, Serialize, ToSchema)]
pub struct ReshardCall {
    /// `split` or `merge`.
    pub action: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shard_to_split: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub new_starting_hash_key: Option<HashKey>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shard_to_merge: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub adjacent_shard_to_merge: Option<String>,
    /// The ids Kinesis will give the new shards (it numbers them upwards).
    pub resulting_shards: Vec<String>,
}

/// The same target reached with `update-shard-count --scaling-type UNIFORM_SCALING`.
#[derive(Debug, Serialize, ToSchema)]
pub struct UniformScaling {
    pub shards: Vec<ShardCount>,
    pub skew: Skew,
    /// Heaviest shard's weight minus the lightest's.
    pub spread: u64,
}

/// The calls that take a stream to `target` open shards of near-equal weight.
#[derive(Debug, Serialize, ToSchema)]
pub struct SplitPlanBody {
    pub stream: String,
    pub target: u64,
    /// Run in order, waiting for the stream to be ACTIVE after each.
    pub operations: Vec<ReshardCall>,
    /// The same, as ready-to-run AWS CLI commands.
    pub commands: Vec<String>,
    /// The open shards afterwards and what each will hold.
    pub shards: Vec<ShardCount>,
    pub skew: Skew,
    /// Heaviest shard's weight minus the lightest's: at most `heaviest_account`.
    pub spread: u64,
    /// Weight of the heaviest single key: an account's, or a hot account's share on one
    /// of its keys (plans cut between keys, so a hot account's keys may land apart).
    pub heaviest_account: u64,
    pub uniform_scaling: UniformScaling,
}

fn spread(loads: &[Load]) -> u64 {
    let max = loads.iter().map(|l| l.weight).max().unwrap_or(0);
    max - loads.iter().map(|l| l.weight).min().unwrap_or(0)
}

/// Plan SplitShard / MergeShards calls to reach `target` shards split where the accounts are.
#[utoipa::path(
    get, path = "/streams/{name}/split-plan", tag = "streams",
    params(StreamPath, SplitParams),
    responses(
        (status = 200, description = "The plan", body = SplitPlanBody),
        (status = 400, description = "A target outside 1..=10000 (or above the keyspace's size)", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such stream", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "The accounts' keys lie too close together for SplitShard to cut between them (the detail names the shard)", body = Problem, content_type = "application/problem+json"),
    )
)]
async fn split_plan(
    State(state): State<AppState>,
    Path(StreamPath { name }): Path<StreamPath>,
    Query(q): Query<SplitParams>,
) -> Result<Response, ApiError> {
    let uniform = ShardMap::uniform(state.registry.keyspace(), q.target)?;
    let registry = Arc::clone(&state.registry);
    state
        .heavy
        .json(move || split_plan_body(&registry, name, q.target, &uniform))
        .await
}

/// The split-plan answer: the calls, as AWS CLI commands too, and `uniform` for comparison.
fn split_plan_body(
    registry: &Registry,
    name: String,
    target: u64,
    uniform: &ShardMap,
) -> Result<SplitPlanBody, ApiError> {
    let (stream, plan, uniform_loads) = registry.split_plan(&name, target as usize)?;
    let (shards, loads): (Vec<Shard>, Vec<Load>) = plan.shards.into_iter().unzip();
    let mut commands = Vec::new();
    let operations = plan
        .operations
        .into_iter()
        .map(|op| {
            match &op {
                Reshard::Split {
                    shard,
                    new_starting_hash_key,
                    ..
                } => commands.push(aws_cli::kinesis(
                    &["split-shard"],
                    &[
                        ("--stream-name", &name),
                        ("--shard-to-split", shard),
                        (
                            "--new-starting-hash-key",
                            &new_starting_hash_key.to_string(),
                        ),
                    ],
                )),
                Reshard::Merge {
                    shard, adjacent, ..
                } => commands.push(aws_cli::kinesis(
                    &["merge-shards"],
                    &[
                        ("--stream-name", &name),
                        ("--shard-to-merge", shard),
                        ("--adjacent-shard-to-merge", adjacent),
                    ],
                )),
            }
            let call = ReshardCall::from(op);
            commands.push(aws_cli::kinesis(
                &["wait", "stream-exists"],
                &[("--stream-name", &name)],
            ));
            call
        })
        .collect();
    Ok(SplitPlanBody {
        stream: stream.name,
        target,
        operations,
        commands,
        skew: Skew::of(&loads),
        spread: spread(&loads),
        shards: shards
            .into_iter()
            .zip(&loads)
            .map(|(s, l)| ShardCount::new(s, *l))
            .collect(),
        heaviest_account: plan.heaviest_account,
        uniform_scaling: UniformScaling {
            shards: ShardCount::of_map(uniform, &uniform_loads),
            skew: Skew::of(&uniform_loads),
            spread: spread(&uniform_loads),
        },
    })
}
