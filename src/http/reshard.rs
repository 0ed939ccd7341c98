//! `/streams/{name}/reshard`: reshards keyspread carries out on a watched stream, and how
//! the latest one stands.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::{Extension, Json};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::MAX_SWITCH_AFTER_S;
use super::error::{ApiError, Problem};
use super::extract::whole_number;
use super::idempotency;
use super::streams::{ReshardCall, StreamPath};
use crate::AppState;
use crate::keyspace::Reshard;
use crate::kinesis::KinesisError;
use crate::registry::{ReshardError, ReshardView, Ticket};
use crate::store::{Actor, JobState};

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(start_reshard, reshard))
}

/// How many open shards to take the stream to.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(remote = "Self", deny_unknown_fields)]
pub struct ReshardRequest {
    /// Open shards wanted, 1..=10000.
    #[schema(minimum = 1, maximum = 10000)]
    #[serde(deserialize_with = "whole_number::required")]
    pub target: u64,
    /// Seconds after the job ends until producers switch to the keys of the rebalance it
    /// applies on the primary stream, 0..=86400. Default: the lookup answers' cache
    /// lifetime (`max-age`, 60 unless configured), as for `POST /rebalance`.
    #[schema(minimum = 0, maximum = 86400)]
    #[serde(default, deserialize_with = "whole_number::optional")]
    pub switch_after_s: Option<u64>,
}

super::extract::objects_only!(ReshardRequest);

/// Where a reshard job stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ReshardState {
    /// Calls are still being made (or will be, once the stream is ACTIVE again).
    Running,
    /// The stream has the wanted shards, keyspread's map is Kinesis', and on the primary
    /// stream the rebalance is applied (staged).
    Done,
    /// It stopped: `error` says where, and what the stream is now.
    Failed,
}

/// A reshard job.
#[derive(Debug, Serialize, ToSchema)]
pub struct ReshardJobBody {
    pub id: i64,
    pub stream: String,
    /// Open shards wanted.
    pub target: u32,
    pub state: ReshardState,
    /// The split plan's calls: those made (the first `done`), then, while it runs, those
    /// still to make from the map keyspread last registered. Each is worked out afresh from
    /// the stream's shards just before it is made.
    pub steps: Vec<ReshardCall>,
    /// Calls made.
    pub done: u32,
    /// Why it failed; while it runs, why its last step could not be taken (it is tried
    /// again); null otherwise.
    pub error: Option<String>,
    /// Who started it (a token's name, never a token).
    pub started_by: String,
    /// RFC 3339.
    #[schema(format = DateTime)]
    pub started_at: String,
    /// When it last moved on (RFC 3339).
    #[schema(format = DateTime)]
    pub updated_at: String,
    /// Seconds after the end until the rebalance's moves switch.
    pub switch_after_s: u64,
    /// Open shards of the stream's map as keyspread registered it last.
    pub shard_count: usize,
}

impl From<ReshardView> for ReshardJobBody {
    fn from(view: ReshardView) -> Self {
        let job = view.job;
        ReshardJobBody {
            id: job.id,
            stream: job.stream,
            target: job.target,
            state: match job.state {
                JobState::Running => ReshardState::Running,
                JobState::Done => ReshardState::Done,
                JobState::Failed => ReshardState::Failed,
            },
            steps: view.steps.into_iter().map(ReshardCall::from).collect(),
            done: job.done,
            error: job.error,
            started_by: job.started_by.to_string(),
            started_at: super::timestamp(job.started_at),
            updated_at: super::timestamp(job.updated_at),
            switch_after_s: (job.switch_after_ms / 1000) as u64,
            shard_count: view.open_shards,
        }
    }
}

impl From<Reshard> for ReshardCall {
    fn from(call: Reshard) -> Self {
        match call {
            Reshard::Split {
                shard,
                new_starting_hash_key,
                children,
            } => ReshardCall {
                action: "split".into(),
                shard_to_split: Some(shard),
                new_starting_hash_key: Some(new_starting_hash_key),
                shard_to_merge: None,
                adjacent_shard_to_merge: None,
                resulting_shards: children.to_vec(),
            },
            Reshard::Merge {
                shard,
                adjacent,
                merged,
            } => ReshardCall {
                action: "merge".into(),
                shard_to_split: None,
                new_starting_hash_key: None,
                shard_to_merge: Some(shard),
                adjacent_shard_to_merge: Some(adjacent),
                resulting_shards: vec![merged],
            },
        }
    }
}

/// Reshard a watched stream: split and merge its shards, one call at a time, until it has
/// `target` open shards cut where the accounts are (the split plan's), then register its
/// map and, on the primary stream, apply the rebalance, staged. The job lives in the
/// database: a replica that dies mid-job leaves it to another, which goes on from the
/// stream's real shards.
#[utoipa::path(
    post, path = "/streams/{name}/reshard", tag = "streams",
    params(StreamPath),
    request_body = ReshardRequest,
    responses(
        (status = 202, description = "Started: the job, its calls planned", body = ReshardJobBody),
        (status = 400, description = "The body is not JSON, or an invalid stream name", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such stream registered, or Kinesis has none of that name", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "The stream is not watched, is in on-demand mode, is not ACTIVE, or a reshard of it runs already", body = Problem, content_type = "application/problem+json"),
        (status = 415, description = "A body sent without Content-Type: application/json", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "A target outside 1..=10000 or past the account's shard limit (DescribeLimits), switch_after_s outside 0..=86400, or keys too close together for SplitShard to cut between them", body = Problem, content_type = "application/problem+json"),
        (status = 502, description = "Kinesis answered an error keyspread cannot act on (the detail has it)", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "Kinesis cannot be reached, throttles, or no region or credentials are configured (the detail says which)", body = Problem, content_type = "application/problem+json"),
    )
)]
async fn start_reshard(
    State(state): State<AppState>,
    Extension(actor): Extension<Actor>,
    Extension(ticket): Extension<Ticket>,
    Path(StreamPath { name }): Path<StreamPath>,
    Json(body): Json<ReshardRequest>,
) -> Result<(StatusCode, Json<ReshardJobBody>), ApiError> {
    let target = u32::try_from(body.target)
        .ok()
        .filter(|t| (1..=10_000).contains(t))
        .ok_or_else(|| {
            ApiError::unprocessable(format!(
                "target must be between 1 and 10000 open shards, got {}",
                body.target
            ))
        })?;
    let switch_after_s = body
        .switch_after_s
        .unwrap_or_else(|| state.lookup_cache.lifetime().min(MAX_SWITCH_AFTER_S));
    if switch_after_s > MAX_SWITCH_AFTER_S {
        return Err(ApiError::unprocessable(format!(
            "switch_after_s must be between 0 and {MAX_SWITCH_AFTER_S} seconds, got {switch_after_s}"
        )));
    }
    idempotency::tell_json(&ticket, started);
    let view = (state.registry)
        .start_reshard(
            &state.kinesis,
            name,
            target,
            switch_after_s as i64 * 1000,
            &actor,
            &ticket,
        )
        .await
        .map_err(problem)?;
    Ok(started(view))
}

/// What starting a job answers.
fn started(view: ReshardView) -> (StatusCode, Json<ReshardJobBody>) {
    (StatusCode::ACCEPTED, Json(view.into()))
}

/// Show a stream's latest reshard job.
#[utoipa::path(
    get, path = "/streams/{name}/reshard", tag = "streams",
    params(StreamPath),
    responses(
        (status = 200, description = "The stream's latest job", body = ReshardJobBody),
        (status = 404, description = "The stream was never resharded by keyspread", body = Problem, content_type = "application/problem+json"),
    )
)]
async fn reshard(
    State(state): State<AppState>,
    Path(StreamPath { name }): Path<StreamPath>,
) -> Result<Json<ReshardJobBody>, ApiError> {
    match state.registry.reshard(&name).await? {
        Some(view) => Ok(Json(view.into())),
        None => Err(ApiError::not_found(format!(
            "keyspread never resharded a stream named {name:?}"
        ))),
    }
}

/// A refused reshard as its client is told it.
fn problem(err: ReshardError) -> ApiError {
    let detail = err.to_string();
    match err {
        ReshardError::Registry(err) => err.into(),
        ReshardError::Kinesis(err) => kinesis_problem(err),
        ReshardError::NotWatched(_) => ApiError::new(StatusCode::CONFLICT, "not-watched", detail),
        ReshardError::OnDemand(_) => ApiError::new(StatusCode::CONFLICT, "on-demand", detail),
        ReshardError::ShardLimit { most, limit, .. } => {
            ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, "shard-limit", detail)
                .with("shard_limit", limit)
                .with("most", most)
        }
        ReshardError::Running { id, .. } => {
            ApiError::new(StatusCode::CONFLICT, "reshard-running", detail).with("job", id)
        }
    }
}

/// A Kinesis failure as a client is told it.
fn kinesis_problem(err: KinesisError) -> ApiError {
    let detail = err.to_string();
    match err {
        KinesisError::NotFound(_) => {
            ApiError::new(StatusCode::NOT_FOUND, "kinesis-not-found", detail)
        }
        KinesisError::InUse(_) => ApiError::new(StatusCode::CONFLICT, "stream-busy", detail),
        KinesisError::MissingRegion
        | KinesisError::MissingCredentials
        | KinesisError::Throttled(_)
        | KinesisError::LimitExceeded(_)
        | KinesisError::Failed(_)
        | KinesisError::Unreachable(_) => ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "kinesis-unavailable",
            detail,
        ),
        KinesisError::Other(_) => ApiError::new(StatusCode::BAD_GATEWAY, "kinesis-error", detail),
    }
}
