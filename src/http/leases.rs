//! Consumer leases: `/streams/{name}/workers/{worker}` (join, heartbeat, leave),
//! `/streams/{name}/leases` (the whole assignment) and checkpoints.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::{Extension, Json};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::error::{ApiError, Problem, in_time, read_in_time};
use super::extract::{OptionalJson, whole_number};
use super::idempotency;
use super::load::{IgnoredLoadBody, LoadEntry};
use super::streams::StreamPath;
use crate::AppState;
use crate::keyspace::is_kinesis_name;
use crate::keyspace::lease_state::{HolderState, SHARD_END};
use crate::registry::{Checkpointed, Heartbeat, LeaseState, LeaseView, OwnLease, Ticket};
use crate::store::Actor;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(leases))
        .routes(routes!(checkpoint))
}

/// Joining, heartbeating and leaving: a heartbeat's load entries make for larger bodies.
pub fn heartbeat_router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(heartbeat, leave))
}

/// Longest `ttl_s` a worker may ask for: ten minutes.
pub const MAX_TTL_S: u64 = 600;

/// `ttl_s` when a worker names none.
pub const DEFAULT_TTL_S: u64 = 30;

/// A stream and one of its consumer group's workers.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Path)]
pub struct WorkerPath {
    /// Kinesis stream name: 1 to 128 of `a-z A-Z 0-9 _ . -`.
    #[param(pattern = r"^[a-zA-Z0-9_.-]{1,128}$")]
    pub name: String,
    /// Worker id: 1 to 128 of `a-z A-Z 0-9 . _ : -` (a host name and process id fit).
    #[param(pattern = r"^[a-zA-Z0-9._:-]{1,128}$")]
    pub worker: String,
}

/// A stream and one of its shards.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Path)]
pub struct ShardPath {
    /// Kinesis stream name: 1 to 128 of `a-z A-Z 0-9 _ . -`.
    #[param(pattern = r"^[a-zA-Z0-9_.-]{1,128}$")]
    pub name: String,
    /// Shard id, as list-shards names it.
    #[param(pattern = r"^[a-zA-Z0-9_.-]{1,128}$")]
    pub shard_id: String,
}

/// A heartbeat's settings.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(remote = "Self", deny_unknown_fields)]
pub struct HeartbeatRequest {
    /// Seconds the worker stays live without another heartbeat, 1..=600 (default 30).
    /// Heartbeat every third of it: a lease is the worker's only until the time it sent
    /// its last answered heartbeat plus `ttl_s`.
    #[schema(minimum = 1, maximum = 600)]
    #[serde(default, deserialize_with = "whole_number::optional")]
    pub ttl_s: Option<u64>,
    /// What the worker read from shards it holds since its last report. Entries count
    /// only from the worker holding the shard at that epoch; the answer's `ignored_load`
    /// lists the others.
    #[serde(default)]
    pub load: Vec<LoadEntry>,
}

super::extract::objects_only!(HeartbeatRequest);

/// How a lease stands for its owner.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum OwnLeaseState {
    /// Read it.
    Held,
    /// Stop reading it and checkpoint what was processed: the next heartbeat hands it over.
    Revoking,
}

/// One of a worker's leases.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct LeaseBody {
    pub shard_id: String,
    /// Checkpoints must name it; raised each time the lease passes to a worker.
    pub epoch: u64,
    pub state: OwnLeaseState,
    /// Where to resume: the last checkpointed sequence number (read after it), or null to
    /// read from the oldest record (TRIM_HORIZON).
    pub checkpoint: Option<String>,
}

impl From<OwnLease> for LeaseBody {
    fn from(l: OwnLease) -> Self {
        LeaseBody {
            shard_id: l.shard_id,
            epoch: l.epoch,
            state: match l.state {
                HolderState::Held => OwnLeaseState::Held,
                HolderState::Revoking => OwnLeaseState::Revoking,
            },
            checkpoint: l.checkpoint,
        }
    }
}

/// A worker's leases, as its heartbeat answers them.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct WorkerBody {
    pub worker: String,
    pub ttl_s: u64,
    /// When the worker stops being live without another heartbeat (RFC 3339, milliseconds,
    /// UTC); its leases then go to others.
    #[schema(format = DateTime)]
    pub expires_at: String,
    /// By shard id.
    pub leases: Vec<LeaseBody>,
    /// The request's load entries that were not counted, and why (empty when all were).
    pub ignored_load: Vec<IgnoredLoadBody>,
}

impl From<Heartbeat> for WorkerBody {
    fn from(h: Heartbeat) -> Self {
        WorkerBody {
            worker: h.worker,
            ttl_s: (h.ttl_ms / 1000) as u64,
            expires_at: super::timestamp_ms(h.expires_at),
            leases: h.leases.into_iter().map(LeaseBody::from).collect(),
            ignored_load: h.ignored_load.into_iter().map(Into::into).collect(),
        }
    }
}

/// How a shard's lease stands in the whole assignment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ShardLeaseState {
    /// A live worker reads it.
    Held,
    /// Its owner is told to stop; `next_owner` gets it after the owner's next heartbeat.
    Revoking,
    /// No live worker reads it (none is live, or its owner just expired).
    Free,
    /// A child shard: leased once every parent still listed is read to SHARD_END.
    Waiting,
    /// A closed shard read to its end.
    Done,
}

impl From<LeaseState> for ShardLeaseState {
    fn from(s: LeaseState) -> Self {
        match s {
            LeaseState::Held => ShardLeaseState::Held,
            LeaseState::Revoking => ShardLeaseState::Revoking,
            LeaseState::Free => ShardLeaseState::Free,
            LeaseState::Waiting => ShardLeaseState::Waiting,
            LeaseState::Done => ShardLeaseState::Done,
        }
    }
}

/// One shard's lease.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct ShardLeaseBody {
    pub shard_id: String,
    /// The live worker reading it.
    pub owner: Option<String>,
    /// While revoking: the worker it goes to.
    pub next_owner: Option<String>,
    pub epoch: u64,
    pub state: ShardLeaseState,
    /// The weights of the keys in its hash key range, at least 1.
    pub weight: u64,
    /// Its observed utilisation of the shard's write limit now, as `GET /load` answers it
    /// (0 when never reported). Once the stream has reports, leases are balanced by it.
    pub utilisation: f64,
    pub checkpoint: Option<String>,
    /// Its `ParentShardId` and `AdjacentParentShardId`, as list-shards named them.
    pub parents: Vec<String>,
    /// Closed by a split or a merge: read it to SHARD_END.
    pub closed: bool,
}

/// One live worker and what it reads.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct GroupWorkerBody {
    pub worker: String,
    /// The shards it reads (held or revoking).
    pub shards: Vec<String>,
    /// Their weight.
    pub weight: u64,
    /// Their summed utilisation.
    pub utilisation: f64,
    #[schema(format = DateTime)]
    pub expires_at: String,
}

/// A stream's whole assignment.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct LeasesBody {
    /// Every shard consumers read, in the stream's order (closed ones included).
    pub shards: Vec<ShardLeaseBody>,
    /// The live workers, by id.
    pub workers: Vec<GroupWorkerBody>,
}

impl From<LeaseView> for LeasesBody {
    fn from(v: LeaseView) -> Self {
        LeasesBody {
            shards: v
                .shards
                .into_iter()
                .map(|s| ShardLeaseBody {
                    shard_id: s.shard.id,
                    owner: s.owner,
                    next_owner: s.next_owner,
                    epoch: s.epoch,
                    state: s.state.into(),
                    weight: s.weight,
                    utilisation: s.utilisation,
                    checkpoint: s.checkpoint,
                    parents: s.shard.parents,
                    closed: s.shard.closed,
                })
                .collect(),
            workers: v
                .workers
                .into_iter()
                .map(|w| GroupWorkerBody {
                    worker: w.worker,
                    shards: w.shards,
                    weight: w.weight,
                    utilisation: w.utilisation,
                    expires_at: super::timestamp_ms(w.expires_at),
                })
                .collect(),
        }
    }
}

/// Progress on a shard.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(remote = "Self", deny_unknown_fields)]
pub struct CheckpointRequest {
    /// The worker holding the lease.
    #[schema(pattern = r"^[a-zA-Z0-9._:-]{1,128}$")]
    pub worker: String,
    /// The lease's epoch, as the worker's heartbeat answered it.
    #[serde(deserialize_with = "whole_number::required")]
    pub epoch: u64,
    /// The last sequence number processed (1 to 128 digits), or `SHARD_END` once a closed
    /// shard is read to its end.
    #[schema(pattern = r"^([0-9]{1,128}|SHARD_END)$")]
    pub sequence_number: String,
}

super::extract::objects_only!(CheckpointRequest);

/// A recorded checkpoint.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct CheckpointBody {
    pub shard_id: String,
    pub worker: String,
    pub epoch: u64,
    pub checkpoint: String,
}

impl From<Checkpointed> for CheckpointBody {
    fn from(c: Checkpointed) -> Self {
        CheckpointBody {
            shard_id: c.shard_id,
            worker: c.worker,
            epoch: c.epoch,
            checkpoint: c.checkpoint,
        }
    }
}

/// Whether `id` is a worker id: 1 to 128 of `a-z A-Z 0-9 . _ : -`.
pub fn is_worker_id(id: &str) -> bool {
    (1..=128).contains(&id.len())
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._:-".contains(&b))
}

fn worker_id(id: String) -> Result<String, ApiError> {
    if is_worker_id(&id) {
        Ok(id)
    } else {
        Err(ApiError::bad_request(format!(
            "worker id {:?} must be 1 to 128 characters of a-z, A-Z, 0-9, '.', '_', ':', '-'",
            super::clip(&id)
        )))
    }
}

fn stream_name(name: &str) -> Result<(), ApiError> {
    if is_kinesis_name(name) {
        Ok(())
    } else {
        Err(ApiError::bad_request(format!(
            "stream name {:?} must be 1 to 128 characters of a-z, A-Z, 0-9, '_', '.', '-'",
            super::clip(name)
        )))
    }
}

/// Join a stream's consumer group, or heartbeat: the answer lists the worker's leases.
///
/// Read every `held` shard from its checkpoint; stop reading a `revoking` one and
/// checkpoint it (the next heartbeat hands it over). Heartbeat every third of `ttl_s`.
#[utoipa::path(
    put, path = "/streams/{name}/workers/{worker}", tag = "leases",
    params(WorkerPath),
    request_body(content = Option<HeartbeatRequest>, description = "Optional (an empty body is fine): ttl_s defaults to 30"),
    responses(
        (status = 200, description = "The worker is live until `expires_at`; its leases", body = WorkerBody),
        (status = 400, description = "Invalid stream name or worker id, or a body that is not JSON", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such stream", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "A new worker, and the group already has 10000", body = Problem, content_type = "application/problem+json"),
        (status = 415, description = "A body sent without Content-Type: application/json", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "ttl_s outside 1..=600, or a load entry that is invalid (the detail names it, such as `load[2].window_ms`): a count that is not a whole number from 0, window_ms outside 1..=3600000, more than 1,000 accounts, an invalid account id, or a shard the stream's map does not list", body = Problem, content_type = "application/problem+json"),
    )
)]
async fn heartbeat(
    State(state): State<AppState>,
    Extension(actor): Extension<Actor>,
    Extension(ticket): Extension<Ticket>,
    Path(WorkerPath { name, worker }): Path<WorkerPath>,
    OptionalJson(body): OptionalJson<HeartbeatRequest>,
) -> Result<Json<WorkerBody>, ApiError> {
    stream_name(&name)?;
    let worker = worker_id(worker)?;
    let body = body.unwrap_or_default();
    let ttl_s = body.ttl_s.unwrap_or(DEFAULT_TTL_S);
    if !(1..=MAX_TTL_S).contains(&ttl_s) {
        return Err(ApiError::unprocessable(format!(
            "ttl_s must be between 1 and {MAX_TTL_S} seconds, got {ttl_s}"
        )));
    }
    let load = super::load::reports(body.load)?;
    idempotency::tell_json(&ticket, |h: Heartbeat| {
        (StatusCode::OK, Json(WorkerBody::from(h)))
    });
    let answer = in_time(
        &state,
        &ticket,
        (state.registry).heartbeat(&name, worker, ttl_s as i64 * 1000, load, &actor, &ticket),
    )
    .await?;
    Ok(Json(answer.into()))
}

/// Leave a stream's consumer group: the worker's leases go to the others at once.
///
/// Stop reading and checkpoint first.
#[utoipa::path(
    delete, path = "/streams/{name}/workers/{worker}", tag = "leases",
    params(WorkerPath),
    responses(
        (status = 204, description = "Left; its leases are the others'"),
        (status = 400, description = "Invalid stream name or worker id", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such stream, or the worker is not in its group (it left, or expired)", body = Problem, content_type = "application/problem+json"),
    )
)]
async fn leave(
    State(state): State<AppState>,
    Extension(actor): Extension<Actor>,
    Extension(ticket): Extension<Ticket>,
    Path(WorkerPath { name, worker }): Path<WorkerPath>,
) -> Result<StatusCode, ApiError> {
    stream_name(&name)?;
    let worker = worker_id(worker)?;
    idempotency::tell(&ticket, |_: &()| idempotency::empty(StatusCode::NO_CONTENT));
    let change = state.registry.leave(&name, worker, &actor, &ticket);
    in_time(&state, &ticket, change).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// The whole assignment: every shard's owner, epoch, state, weight and checkpoint, and
/// every live worker's shards and weight.
#[utoipa::path(
    get, path = "/streams/{name}/leases", tag = "leases",
    params(StreamPath),
    responses(
        (status = 200, description = "The assignment, as the database holds it now", body = LeasesBody),
        (status = 400, description = "Invalid stream name", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such stream", body = Problem, content_type = "application/problem+json"),
    )
)]
async fn leases(
    State(state): State<AppState>,
    Path(StreamPath { name }): Path<StreamPath>,
) -> Result<Json<LeasesBody>, ApiError> {
    Ok(Json(assignment(&state, &name).await?))
}

/// A stream's whole assignment, as `GET /streams/{name}/leases` answers it.
pub(super) async fn assignment(state: &AppState, name: &str) -> Result<LeasesBody, ApiError> {
    stream_name(name)?;
    let view = read_in_time(state, state.registry.lease_view(name)).await?;
    Ok(view.into())
}

/// Record a worker's progress on a shard it holds.
///
/// `SHARD_END` once a closed shard is read to its end: its lease ends, and its children
/// are leased once all their parents are done.
#[utoipa::path(
    put, path = "/streams/{name}/leases/{shard_id}/checkpoint", tag = "leases",
    params(ShardPath),
    request_body = CheckpointRequest,
    responses(
        (status = 200, description = "Recorded", body = CheckpointBody),
        (status = 400, description = "Invalid stream name, shard id or worker id, or a body that is not JSON", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such stream, or the stream lists no such shard", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "The worker does not hold this lease at this epoch: it passed to another worker (or ended); stop reading the shard. Or SHARD_END on a shard the stream's map does not name closed: it is still open", body = Problem, content_type = "application/problem+json"),
        (status = 415, description = "A body sent without Content-Type: application/json", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "A sequence number that is neither 1 to 128 digits nor SHARD_END, or a body missing a field", body = Problem, content_type = "application/problem+json"),
    )
)]
async fn checkpoint(
    State(state): State<AppState>,
    Extension(actor): Extension<Actor>,
    Extension(ticket): Extension<Ticket>,
    Path(ShardPath { name, shard_id }): Path<ShardPath>,
    Json(body): Json<CheckpointRequest>,
) -> Result<Json<CheckpointBody>, ApiError> {
    stream_name(&name)?;
    if !is_kinesis_name(&shard_id) {
        return Err(ApiError::bad_request(format!(
            "shard id {:?} must be 1 to 128 characters of a-z, A-Z, 0-9, '_', '.', '-'",
            super::clip(&shard_id)
        )));
    }
    let worker = worker_id(body.worker)?;
    let sequence = body.sequence_number;
    let digits =
        (1..=128).contains(&sequence.len()) && sequence.bytes().all(|b| b.is_ascii_digit());
    if !digits && sequence != SHARD_END {
        return Err(ApiError::unprocessable(format!(
            "sequence_number must be 1 to 128 digits or {SHARD_END}, got {:?}",
            super::clip(&sequence)
        )));
    }
    idempotency::tell_json(&ticket, |c: Checkpointed| {
        (StatusCode::OK, Json(CheckpointBody::from(c)))
    });
    let done = in_time(
        &state,
        &ticket,
        (state.registry).checkpoint(
            &name,
            Checkpointed {
                shard_id,
                worker,
                epoch: body.epoch,
                checkpoint: sequence,
            },
            &actor,
            &ticket,
        ),
    )
    .await?;
    Ok(Json(done.into()))
}
