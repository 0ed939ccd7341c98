//! `/rebalance`: plan, then apply, the fewest moves that even out the shards.

use std::sync::Arc;

use axum::Json;
use axum::extract::{Query, State};
use axum::response::Response;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::error::{ApiError, Problem};
use super::shards::MapParams;
use crate::AppState;
use crate::keyspace::{HashKey, Plan, Skew};

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(preview))
        .routes(routes!(apply))
}

/// One of an account's keys moving to a key in another shard.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct MoveBody {
    pub account: String,
    /// Which of the account's keys moves (0 unless it has several).
    pub index: u32,
    pub from: HashKey,
    pub to: HashKey,
    pub from_shard: usize,
    pub to_shard: usize,
}

/// A rebalance plan.
#[derive(Debug, Serialize, ToSchema)]
pub struct RebalancePlan {
    /// Names this plan and the state it was computed on; pass it to `POST /rebalance`.
    pub plan_id: String,
    /// Most keys any shard holds after the plan: ceil(keys / shards) (one key per
    /// account, K for an account of fanout K).
    pub cap: u64,
    /// False when some shard stays above `cap` because any further move would have made
    /// the heaviest shard heavier (only with unequal weights) or stacked an account's
    /// keys on one shard.
    pub complete: bool,
    /// The first `mends` moves spread again the keys of accounts that no longer lie on
    /// distinct shards of the primary map (after a change of its map); the rest balance.
    pub mends: usize,
    pub moves: Vec<MoveBody>,
    pub before: Skew,
    pub after: Skew,
}

impl RebalancePlan {
    pub(super) fn new(plan_id: String, plan: Plan) -> Self {
        RebalancePlan {
            plan_id,
            cap: plan.cap,
            complete: plan.complete,
            mends: plan.mends,
            moves: plan
                .moves
                .into_iter()
                .map(|m| MoveBody {
                    account: m.account,
                    index: m.index,
                    from: m.from,
                    to: m.to,
                    from_shard: m.from_shard,
                    to_shard: m.to_shard,
                })
                .collect(),
            before: plan.before,
            after: plan.after,
        }
    }
}

/// Which previewed plan to apply.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(remote = "Self", deny_unknown_fields)]
pub struct ApplyRequest {
    /// The `plan_id` of a preview: `EVENT.MAP.DIGEST`.
    #[schema(
        pattern = r"^[0-9]{1,18}\.([1-9][0-9]{0,4}|100000|stream:[a-zA-Z0-9_.-]{1,128})\.[0-9a-fA-F]{16}$"
    )]
    pub plan_id: String,
}

super::extract::objects_only!(ApplyRequest);

/// Plan a rebalance over a uniform or a registered stream's map; changes nothing.
#[utoipa::path(
    get, path = "/rebalance/preview", tag = "rebalance",
    params(MapParams),
    responses(
        (status = 200, description = "The plan", body = RebalancePlan),
        (status = 400, description = "Not exactly one of shards and stream, or a bad shard count", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such stream", body = Problem, content_type = "application/problem+json"),
    )
)]
async fn preview(
    State(state): State<AppState>,
    Query(q): Query<MapParams>,
) -> Result<Response, ApiError> {
    let spec = q.spec()?;
    let registry = Arc::clone(&state.registry);
    state
        .heavy
        .json(move || {
            let (plan_id, plan) = registry.preview(&spec)?;
            Ok(RebalancePlan::new(plan_id, plan))
        })
        .await
}

/// Apply a previewed plan, in one transaction.
#[utoipa::path(
    post, path = "/rebalance", tag = "rebalance",
    request_body = ApplyRequest,
    responses(
        (status = 200, description = "The moves applied", body = RebalancePlan),
        (status = 400, description = "The body is not JSON", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "The plan's stream is no longer registered", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "Assignments or the map changed since the preview", body = Problem, content_type = "application/problem+json"),
        (status = 415, description = "A body sent without Content-Type: application/json", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Not a plan id", body = Problem, content_type = "application/problem+json"),
    ),
    security((), ("bearer" = []))
)]
async fn apply(
    State(state): State<AppState>,
    Json(body): Json<ApplyRequest>,
) -> Result<Json<RebalancePlan>, ApiError> {
    let plan = state.registry.apply(body.plan_id.clone()).await?;
    Ok(Json(RebalancePlan::new(body.plan_id, plan)))
}
