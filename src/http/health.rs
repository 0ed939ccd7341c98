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

/// Longest `/readyz` waits for the database.
const READY_TIMEOUT: Duration = Duration::from_secs(2);

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(healthz))
        .routes(routes!(readyz))
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

/// Readiness: the database answers and takes writes, and this replica follows its log.
#[utoipa::path(get, path = "/readyz", tag = "health",
    responses(
        (status = 200, description = "Ready", body = Health),
        (status = 503, description = "The database does not answer, or does not take writes (a full disk), or this replica cannot apply the event log", body = Problem, content_type = "application/problem+json",
            headers(("Retry-After" = u32, description = "Seconds to wait before asking again"))),
    ))]
async fn readyz(State(state): State<AppState>) -> Result<Json<Health>, ApiError> {
    // A database that takes this long to answer a ping (a cut network drops packets
    // rather than refuse them) is not ready; the balancer must hear so in time.
    let answered = tokio::time::timeout(READY_TIMEOUT, state.registry.ready()).await;
    if answered.unwrap_or(false) {
        Ok(Json(Health {
            status: "ready",
            accounts: state.registry.len(),
        }))
    } else {
        Err(ApiError::unavailable(
            "the database does not answer, or does not take writes, or this replica cannot \
             apply the event log (see its log)",
        ))
    }
}
