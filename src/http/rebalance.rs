//! `/rebalance`: plan, then apply, the fewest moves that even out the shards.

use std::sync::Arc;

use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::Response;
use axum::{Extension, Json};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::error::{ApiError, Problem};
use super::events::MoveReasonBody;
use super::extract::whole_number;
use super::idempotency;
use super::shards::MapParams;
use crate::AppState;
use crate::keyspace::{HashKey, LoadSkew, Plan, Skew};
use crate::registry::{Applied, MapSpec, Planned, Ticket};
use crate::store::Actor;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(preview))
        .routes(routes!(apply))
        .routes(routes!(moves))
}

/// Longest wait before a staged move switches: a day.
pub const MAX_SWITCH_AFTER_S: u64 = crate::config::MAX_LIFETIME_S;

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
    /// Once applied: when producers switch from `from` to `to` (RFC 3339, milliseconds,
    /// UTC). Absent from previews.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false, format = DateTime)]
    pub switch_at: Option<String>,
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
    /// keys on one shard, or because the keys over it belong to accounts whose staged
    /// moves have not switched yet (they move again only after their switch).
    pub complete: bool,
    /// The first `mends` moves spread again the keys of accounts that no longer lie on
    /// distinct shards of the primary map (after a change of its map); the rest balance.
    pub mends: usize,
    pub moves: Vec<MoveBody>,
    pub before: Skew,
    pub after: Skew,
    /// Once applied: when every move switches (RFC 3339, milliseconds, UTC); until then
    /// lookups answer the old keys with the new ones as `next`. Absent from previews.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false, format = DateTime)]
    pub switch_at: Option<String>,
    /// Once applied: true when the preview had gone stale and the apply planned again
    /// under the writer lock (the answer is the plan applied, at most as many moves as the
    /// preview had, under its own `plan_id`). Absent from previews.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub replanned: Option<bool>,
    /// `load` for a plan by observed load (`by=load`); absent for a plan by keys and
    /// weights. A by-load plan moves keys off the busiest shards by utilisation: the
    /// `max_over_mean` of its `before` and `after` is the busiest shard's utilisation over
    /// the mean (their other fields still count keys), and `load_before` and `load_after`
    /// give the utilisation in full.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub by: Option<PlanBy>,
    /// For a by-load plan: the shards' utilisation before its moves.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub load_before: Option<LoadSkewBody>,
    /// For a by-load plan: the shards' utilisation once its moves switch.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub load_after: Option<LoadSkewBody>,
}

/// What a plan evens out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum PlanBy {
    /// Keys and their weights per shard.
    Count,
    /// Observed utilisation per shard.
    Load,
}

/// How even the shards' observed utilisation is.
#[derive(Debug, Clone, Copy, Serialize, ToSchema)]
pub struct LoadSkewBody {
    pub shards: usize,
    /// The busiest shard's utilisation (1.0 is Kinesis' write limit).
    pub max: f64,
    /// The mean utilisation per shard.
    pub mean: f64,
    /// `max` over `mean`; 1.0 is perfect, 0 when nothing was observed.
    pub max_over_mean: f64,
}

impl From<LoadSkew> for LoadSkewBody {
    fn from(s: LoadSkew) -> Self {
        LoadSkewBody {
            shards: s.shards,
            max: s.max,
            mean: s.mean,
            max_over_mean: s.max_over_mean,
        }
    }
}

impl RebalancePlan {
    pub(super) fn planned(plan_id: String, planned: Planned) -> Self {
        match planned {
            Planned::Count(plan) => RebalancePlan::new(plan_id, plan),
            Planned::Load(plan, counted) => {
                let as_plan = Plan {
                    cap: counted.cap,
                    moves: plan.moves,
                    mends: 0,
                    before: Skew {
                        max_over_mean: plan.before.max_over_mean,
                        ..counted.before
                    },
                    after: Skew {
                        max_over_mean: plan.after.max_over_mean,
                        ..counted.after
                    },
                    complete: counted.complete,
                };
                RebalancePlan {
                    by: Some(PlanBy::Load),
                    load_before: Some(plan.before.into()),
                    load_after: Some(plan.after.into()),
                    ..RebalancePlan::new(plan_id, as_plan)
                }
            }
        }
    }

    pub(super) fn new(plan_id: String, plan: Plan) -> Self {
        RebalancePlan {
            plan_id,
            switch_at: None,
            replanned: None,
            by: None,
            load_before: None,
            load_after: None,
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
                    switch_at: None,
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
    /// The `plan_id` of a preview: `EVENT.MAP.MOVES.DIGEST`.
    #[schema(
        pattern = r"^[0-9]{1,18}\.([1-9][0-9]{0,3}|10000|stream:[a-zA-Z0-9_.-]{1,128}|load:[a-zA-Z0-9_.-]{1,128})\.[0-9]{1,9}\.[0-9a-fA-F]{16}$"
    )]
    pub plan_id: String,
    /// Seconds until producers switch to the new keys, 0..=86400: until then lookups
    /// answer the old keys plus `next`. Default: the lookup answers' cache lifetime
    /// (`max-age`, 60 unless configured), so that no cached answer outlives an old key.
    /// 0 switches at once.
    #[schema(minimum = 0, maximum = 86400)]
    #[serde(default, deserialize_with = "whole_number::optional")]
    pub switch_after_s: Option<u64>,
    /// When anything changed since the preview: false (the default) refuses the plan as
    /// stale (409); true plans again under the writer lock and applies at most as many
    /// moves as the preview had, answering that plan with `replanned: true`.
    #[serde(default)]
    pub replan: bool,
}

super::extract::objects_only!(ApplyRequest);

/// What a preview evens out.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ByParams {
    /// `count` (the default): keys and their weights per shard; `load`: the observed
    /// utilisation per shard (a registered `stream` only).
    #[param(value_type = Option<PlanBy>)]
    pub by: Option<String>,
}

/// Plan a rebalance over a uniform or a registered stream's map, by keys and weights or by
/// observed load; changes nothing.
#[utoipa::path(
    get, path = "/rebalance/preview", tag = "rebalance",
    params(MapParams, ByParams),
    responses(
        (status = 200, description = "The plan", body = RebalancePlan),
        (status = 400, description = "Not exactly one of shards and stream, or a bad shard count", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such stream", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "`by` other than count or load, or by=load over a uniform map", body = Problem, content_type = "application/problem+json"),
    )
)]
async fn preview(
    State(state): State<AppState>,
    Query(q): Query<MapParams>,
    Query(by): Query<ByParams>,
) -> Result<Response, ApiError> {
    let spec = q.spec()?;
    let registry = Arc::clone(&state.registry);
    match by.by.as_deref().unwrap_or("count") {
        "count" => {
            state
                .heavy
                .json(move || {
                    let (plan_id, plan) = registry.preview(&spec)?;
                    Ok(RebalancePlan::new(plan_id, plan))
                })
                .await
        }
        "load" => {
            let MapSpec::Stream(name) = spec else {
                return Err(ApiError::unprocessable(
                    "by=load plans over a registered stream's observed load: give stream, not shards"
                        .to_owned(),
                ));
            };
            let load = registry.load_totals(&name).await?;
            state
                .heavy
                .json(move || {
                    let (plan_id, plan) = registry.preview_by_load(&name, &load)?;
                    Ok(RebalancePlan::planned(plan_id, plan))
                })
                .await
        }
        other => Err(ApiError::unprocessable(format!(
            "by must be count or load, got {other:?}"
        ))),
    }
}

/// Apply a previewed plan, in one transaction, staging its moves: each moved account keeps
/// its old key until `switch_at` (`switch_after_s` from now), then every producer switches.
/// With `replan`, a preview gone stale is planned again under the writer lock.
#[utoipa::path(
    post, path = "/rebalance", tag = "rebalance",
    request_body = ApplyRequest,
    responses(
        (status = 200, description = "The moves applied", body = RebalancePlan),
        (status = 400, description = "The body is not JSON", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "The plan's stream is no longer registered", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "Assignments or the map changed since the preview (and `replan` was not asked for)", body = Problem, content_type = "application/problem+json"),
        (status = 415, description = "A body sent without Content-Type: application/json", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Not a plan id, or switch_after_s outside 0..=86400", body = Problem, content_type = "application/problem+json"),
    )
)]
async fn apply(
    State(state): State<AppState>,
    Extension(actor): Extension<Actor>,
    Extension(ticket): Extension<Ticket>,
    Json(body): Json<ApplyRequest>,
) -> Result<(StatusCode, Json<RebalancePlan>), ApiError> {
    let switch_after_s = body
        .switch_after_s
        .unwrap_or_else(|| state.lookup_cache.lifetime().min(MAX_SWITCH_AFTER_S));
    if switch_after_s > MAX_SWITCH_AFTER_S {
        return Err(ApiError::unprocessable(format!(
            "switch_after_s must be between 0 and {MAX_SWITCH_AFTER_S} seconds, got {switch_after_s}"
        )));
    }
    idempotency::tell_json(&ticket, applied_answer);
    let applied = state
        .registry
        .apply(
            body.plan_id,
            switch_after_s as i64 * 1000,
            body.replan,
            &actor,
            &ticket,
        )
        .await?;
    Ok(applied_answer(applied))
}

/// What an apply answers: the moves applied, each with when it switches.
fn applied_answer(applied: Applied) -> (StatusCode, Json<RebalancePlan>) {
    let switch_at = applied.switch_at;
    let mut answer = RebalancePlan::planned(applied.plan_id, applied.plan);
    answer.replanned = Some(applied.replanned);
    if !answer.moves.is_empty() {
        let switch_at = super::timestamp_ms(switch_at);
        for m in &mut answer.moves {
            m.switch_at = Some(switch_at.clone());
        }
        answer.switch_at = Some(switch_at);
    }
    (StatusCode::OK, Json(answer))
}

/// Paging through pending moves by event id.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct MovesParams {
    /// Start after this event id (the `next` of the previous page); default 0.
    #[param(minimum = 0)]
    pub after: Option<i64>,
    /// Page size, 1..=1000 (default 100).
    #[param(minimum = 1, maximum = 1000)]
    pub limit: Option<u32>,
}

/// A move applied and not yet switched.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct PendingMoveBody {
    pub account: String,
    /// Which of the account's keys moves (0 unless it has several).
    pub index: u32,
    /// The key producers send until `switch_at`; for a new key (a fanout the load
    /// controller raised), the account's key 0.
    pub from: HashKey,
    /// The key producers send from `switch_at` on.
    pub to: HashKey,
    /// Whose shards a consumer reads up to `switch_at` before the account's records on
    /// `to`'s shard: `[from]` for a move; for a new key, every key the account sends until
    /// the switch (sub-keys come to the new key from any of them).
    pub from_keys: Vec<HashKey>,
    /// RFC 3339, milliseconds, UTC.
    #[schema(format = DateTime)]
    pub switch_at: String,
    /// Id of the move's event in `GET /events`.
    pub event_id: i64,
    /// When the move was applied (RFC 3339, milliseconds, UTC): records of the account a
    /// consumer reads from `to`'s shard after this belong after the switch.
    #[schema(format = DateTime)]
    pub applied_at: String,
    /// Who applied it: the move event's `actor` (see `GET /events`).
    #[schema(example = "loopback")]
    pub applied_by: String,
    /// Why it was made: the move event's `reason` (null for moves logged before reasons
    /// were).
    pub reason: Option<MoveReasonBody>,
}

/// One page of pending moves.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct MovesPage {
    pub items: Vec<PendingMoveBody>,
    /// Pass as `after` for the next page; null on the last page.
    pub next: Option<i64>,
}

/// Most pending moves one page holds.
const MAX_MOVES_PAGE: u32 = 1000;

/// Moves applied by a rebalance that have not switched yet, by event id: what consumers
/// hold records for, and what producers will switch to.
#[utoipa::path(
    get, path = "/moves", tag = "rebalance",
    params(MovesParams),
    responses(
        (status = 200, description = "One page of pending moves, by event id", body = MovesPage),
        (status = 400, description = "Invalid paging parameters", body = Problem, content_type = "application/problem+json"),
    )
)]
async fn moves(
    State(state): State<AppState>,
    Query(params): Query<MovesParams>,
) -> Result<Json<MovesPage>, ApiError> {
    let limit = super::page_limit(params.limit, MAX_MOVES_PAGE)?;
    let after = params.after.unwrap_or(0);
    if after < 0 {
        return Err(ApiError::bad_request(format!(
            "after must be an event id (0 or more), got {after}"
        )));
    }
    Ok(Json(moves_page(&state, after, limit).await?))
}

/// One page of pending moves after event `after`, as `GET /moves` answers it.
pub(super) async fn moves_page(
    state: &AppState,
    after: i64,
    limit: u32,
) -> Result<MovesPage, ApiError> {
    let now = crate::registry::now_ms();
    let mut rows = state.registry.moves(after, now, limit + 1).await?;
    let next = if rows.len() > limit as usize {
        rows.truncate(limit as usize);
        rows.last().map(|m| m.event_id)
    } else {
        None
    };
    let items = rows
        .into_iter()
        .map(|m| {
            let from_keys = match m.from {
                Some(from) => vec![from],
                None => (state.registry.lookup(m.account.as_str()))
                    .map(|a| a.keys_at(now).keys.as_slice().to_vec())
                    .unwrap_or_default(),
            };
            (m, from_keys)
        })
        .filter(|(_, from_keys)| !from_keys.is_empty())
        .map(|(m, from_keys)| PendingMoveBody {
            account: m.account.into_string(),
            index: m.index,
            from: from_keys[0],
            from_keys,
            to: m.to,
            switch_at: super::timestamp_ms(m.switch_at),
            event_id: m.event_id,
            applied_at: super::timestamp_ms(m.applied_at),
            applied_by: m.applied_by.to_string(),
            reason: m.reason.map(MoveReasonBody::from),
        })
        .collect();
    Ok(MovesPage { items, next })
}
