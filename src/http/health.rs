//! Liveness and readiness.

use std::time::Duration;

use axum::Json;
use axum::extract::State;
use serde::Serialize;
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::error::{ApiError, Problem};
use crate::AppState;
use crate::store::Unwritable;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(healthz))
        .routes(routes!(readyz))
        .routes(routes!(readyz_writes))
}

/// Health summary.
#[derive(Debug, Serialize, ToSchema)]
pub struct Health {
    pub status: &'static str,
    /// Accounts held.
    pub accounts: usize,
}

/// Liveness: the process answers.
#[utoipa::path(get, path = "/healthz", tag = "health",
    responses((status = 200, description = "Alive", body = Health)))]
async fn healthz(State(state): State<AppState>) -> Json<Health> {
    Json(Health {
        status: "ok",
        accounts: state.registry.len(),
    })
}

/// Readiness: this replica answers lookups truthfully (in touch with the database, or out of
/// touch for less than the lookups' max-age), so a balancer keeps it through a database blip.
#[utoipa::path(get, path = "/readyz", tag = "health",
    responses(
        (status = 200, description = "Ready: lookups are answered truthfully", body = Health),
        (status = 503, description = "This replica has been out of touch with the database for longer than lookups may be cached, or cannot apply the event log", body = Problem, content_type = "application/problem+json",
            headers(("Retry-After" = u32, description = "Seconds to wait before asking again"))),
    ))]
async fn readyz(State(state): State<AppState>) -> Result<Json<Health>, ApiError> {
    // Bounded within: each look at the database has its own timeout.
    let max_age = Duration::from_secs(state.lookup_cache.lifetime());
    if state.registry.ready(max_age).await {
        Ok(Json(Health {
            status: "ready",
            accounts: state.registry.len(),
        }))
    } else {
        Err(ApiError::unavailable(
            "this replica cannot vouch for its lookups: out of touch with the database for \
             longer than they may be cached, or it cannot apply the event log (see its log)",
        ))
    }
}

/// Write readiness: whether a change can commit now (a writable primary; a SQLite disk with
/// room), so that writers can be routed to replicas that can make changes.
#[utoipa::path(get, path = "/readyz/writes", tag = "health",
    responses(
        (status = 200, description = "A change can commit now", body = Health),
        (status = 503, description = "No change can commit now: the problem's `reason` says why (`unreachable`, `read_only`, `in_recovery`, `disk_full`)", body = Problem, content_type = "application/problem+json",
            headers(("Retry-After" = u32, description = "Seconds to wait before asking again"))),
    ))]
async fn readyz_writes(State(state): State<AppState>) -> Result<Json<Health>, ApiError> {
    match state.registry.writes_ready().await {
        Ok(()) => Ok(Json(Health {
            status: "writable",
            accounts: state.registry.len(),
        })),
        Err(reason) => Err(ApiError::unavailable(format!(
            "no change can commit now: {}",
            describe(reason)
        ))
        .with("reason", reason.as_str())),
    }
}

/// What `reason` means, for the problem's detail.
fn describe(reason: Unwritable) -> &'static str {
    match reason {
        Unwritable::Unreachable => "the database does not answer",
        Unwritable::ReadOnly => "the database is read-only (no writable primary)",
        Unwritable::InRecovery => "the database is a standby in recovery (no writable primary)",
        Unwritable::DiskFull => "the disk holding the database is full, or failing",
    }
}
