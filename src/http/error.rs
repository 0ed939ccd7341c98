//! Errors as `application/problem+json` (RFC 9457), mapped in one place.

use axum::Json;
use axum::body::Body;
use axum::http::{HeaderValue, Response, StatusCode, header};
use axum::response::IntoResponse;
use serde::Serialize;
use utoipa::ToSchema;

use crate::keyspace;
use crate::kinesis::KinesisError;
use crate::registry::{self, Ticket};

pub const PROBLEM_JSON: &str = "application/problem+json";

/// An RFC 9457 problem document.
#[derive(Debug, Serialize, serde::Deserialize, ToSchema)]
pub struct Problem {
    /// A URI naming the kind of problem.
    #[serde(rename = "type")]
    pub kind: String,
    /// Short summary of the kind of problem.
    pub title: String,
    /// The HTTP status code.
    pub status: u16,
    /// What was wrong with this request.
    pub detail: String,
    /// The members a problem type adds (RFC 9457 extensions), which its own schema names.
    #[serde(flatten, default, skip_serializing_if = "serde_json::Map::is_empty")]
    #[schema(ignore)]
    pub extensions: serde_json::Map<String, serde_json::Value>,
}

/// An error answered to a client.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    slug: &'static str,
    detail: String,
    extensions: serde_json::Map<String, serde_json::Value>,
    /// A database that cannot be reached (see [`DatabaseAway`]).
    away: bool,
}

impl ApiError {
    pub fn new(status: StatusCode, slug: &'static str, detail: impl Into<String>) -> Self {
        ApiError {
            status,
            slug,
            detail: detail.into(),
            extensions: serde_json::Map::new(),
            away: false,
        }
    }

    /// Marks the refusal as the database's being away (see [`DatabaseAway`]).
    fn away(mut self) -> Self {
        self.away = true;
        self
    }

    /// The problem with the extension member `name` set to `value`.
    pub fn with(mut self, name: &str, value: impl Into<serde_json::Value>) -> Self {
        self.extensions.insert(name.to_owned(), value.into());
        self
    }

    pub fn bad_request(detail: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "bad-request", detail)
    }

    pub fn unprocessable(detail: impl Into<String>) -> Self {
        Self::new(StatusCode::UNPROCESSABLE_ENTITY, "invalid-body", detail)
    }

    pub fn not_found(detail: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, "not-found", detail)
    }

    /// A 503: the database cannot take the request now; answered with `Retry-After`.
    pub fn unavailable(detail: impl Into<String>) -> Self {
        Self::new(StatusCode::SERVICE_UNAVAILABLE, "unavailable", detail)
    }

    /// A 5xx whose cause is logged here, once, inside the request span; the body stays generic.
    pub fn internal(cause: &dyn std::fmt::Display) -> Self {
        tracing::error!(%cause, "request failed");
        Self::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            "the server could not complete the request; it has been logged",
        )
    }

    pub fn status(&self) -> StatusCode {
        self.status
    }

    /// What was wrong, as the problem's `detail` says it.
    pub fn detail(&self) -> &str {
        &self.detail
    }

    /// The problem document's bytes, as the answer carries them.
    pub fn problem_bytes(&self) -> Vec<u8> {
        serde_json::to_vec(&self.problem()).unwrap_or_default()
    }

    /// The same refusal, worded for a read: a database that cannot be read now.
    pub fn for_read(self) -> ApiError {
        if self.slug == "unavailable" {
            ApiError::unavailable(READ_AWAY)
        } else {
            self
        }
    }

    fn problem(&self) -> Problem {
        problem_body(
            self.status,
            self.slug,
            &self.detail,
            self.extensions.clone(),
        )
    }
}

/// Marks a 503 of a database that cannot be reached, worded for a change: a read is
/// answered in its own words (see `middleware::worded_for_reads`).
#[derive(Debug, Clone, Copy)]
pub struct DatabaseAway;

/// Marks an answer that says nothing final about its request (a conflict with another
/// writer, or with another request of the same Idempotency-Key): never kept for a key.
#[derive(Debug, Clone, Copy)]
pub struct Passing;

/// A problem response for `status` of kind `slug`.
pub fn problem(status: StatusCode, slug: &str, detail: &str) -> Response<Body> {
    problem_with(status, slug, detail, serde_json::Map::new())
}

/// [`problem`] with extension members.
fn problem_with(
    status: StatusCode,
    slug: &str,
    detail: &str,
    extensions: serde_json::Map<String, serde_json::Value>,
) -> Response<Body> {
    let body = problem_body(status, slug, detail, extensions);
    let mut response = (status, Json(body)).into_response();
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON));
    response
}

fn problem_body(
    status: StatusCode,
    slug: &str,
    detail: &str,
    extensions: serde_json::Map<String, serde_json::Value>,
) -> Problem {
    Problem {
        kind: format!("urn:keyspread:problem:{slug}"),
        title: status.canonical_reason().unwrap_or("Error").to_owned(),
        status: status.as_u16(),
        detail: detail.to_owned(),
        extensions,
    }
}

/// What a read is told while the database cannot be reached.
pub const READ_AWAY: &str = "the database cannot be read right now (unreachable, or held up by another writer): \
     try again later";

/// Seconds a 503 asks the client to wait before trying again: about one lock timeout, the
/// time it takes to learn whether the database takes changes again.
pub const RETRY_AFTER_SECS: u32 = 2;

impl IntoResponse for ApiError {
    fn into_response(self) -> Response<Body> {
        let mut response = problem_with(self.status, self.slug, &self.detail, self.extensions);
        if self.status == StatusCode::SERVICE_UNAVAILABLE {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, RETRY_AFTER_SECS.into());
        }
        if matches!(self.slug, "conflict" | "idempotency-key-in-use") {
            response.extensions_mut().insert(Passing);
        }
        if self.away {
            response.extensions_mut().insert(DatabaseAway);
        }
        response
    }
}

/// Waits for a registry change. Past the store's change timeout (Postgres) its caller
/// gives up on it and answers 503, unless the change already passed its commit point (see
/// [`Ticket`]): then the answer is the commit's result, whenever it comes. So a 503 from
/// here means the change was not made, and never will be.
pub async fn in_time<T>(
    state: &crate::AppState,
    ticket: &Ticket,
    change: impl Future<Output = Result<T, registry::Error>>,
) -> Result<T, ApiError> {
    let Some(limit) = state.registry.change_timeout() else {
        return Ok(change.await?);
    };
    tokio::pin!(change);
    match tokio::time::timeout(limit, &mut change).await {
        Ok(done) => Ok(done?),
        Err(_) if ticket.refuse() => {
            tracing::warn!(?limit, "a change outlasted its time: refused");
            Err(ApiError::unavailable(format!(
                "the database did not take the change within {} s, so it was not made (and \
                 will not be): send it again later",
                limit.as_secs()
            )))
        }
        Err(_) => Ok(change.await?),
    }
}

/// Waits for a read of the database at most the store's change timeout, then answers 503.
pub async fn read_in_time<T>(
    state: &crate::AppState,
    read: impl Future<Output = Result<T, registry::Error>>,
) -> Result<T, ApiError> {
    let Some(limit) = state.registry.change_timeout() else {
        return Ok(read.await?);
    };
    match tokio::time::timeout(limit, read).await {
        Ok(done) => Ok(done?),
        Err(_) => Err(ApiError::unavailable(format!(
            "the database did not answer within {} s: try again later",
            limit.as_secs()
        ))),
    }
}

impl From<keyspace::Error> for ApiError {
    fn from(err: keyspace::Error) -> Self {
        match err {
            keyspace::Error::Full { .. } => {
                ApiError::new(StatusCode::CONFLICT, "keyspace-full", err.to_string())
            }
            keyspace::Error::KeyTaken(_) | keyspace::Error::KeyNotHeld(_) => {
                ApiError::internal(&err)
            }
            keyspace::Error::Tiling(_)
            | keyspace::Error::ListShards(_)
            | keyspace::Error::Weight { .. }
            | keyspace::Error::Fanout { .. }
            | keyspace::Error::WeightBelowFanout { .. } => ApiError::unprocessable(err.to_string()),
            _ => ApiError::bad_request(err.to_string()),
        }
    }
}

/// Kinesis' refusals as the client can act on them. A missing region or credentials is a
/// 503, not a 422: the request is sound, the server is not set up to make it (and a role's
/// credentials may come later).
impl From<KinesisError> for ApiError {
    fn from(err: KinesisError) -> Self {
        let said = err.to_string();
        match err {
            KinesisError::MissingRegion | KinesisError::MissingCredentials => ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "kinesis-not-configured",
                said,
            ),
            KinesisError::Throttled(_) => {
                ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "kinesis-throttled", said)
            }
            KinesisError::NotFound(_) => ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "kinesis-stream-not-found",
                said,
            ),
            KinesisError::InUse(_) => {
                ApiError::new(StatusCode::CONFLICT, "kinesis-stream-in-use", said)
            }
            KinesisError::Unreachable(_)
            | KinesisError::Failed(_)
            | KinesisError::LimitExceeded(_)
            | KinesisError::Other(_) => {
                tracing::warn!(%said, "a Kinesis call failed");
                ApiError::new(StatusCode::BAD_GATEWAY, "kinesis-failed", said)
            }
        }
    }
}

impl From<registry::Error> for ApiError {
    fn from(err: registry::Error) -> Self {
        ApiError::from(&err)
    }
}

impl From<&registry::Error> for ApiError {
    fn from(err: &registry::Error) -> Self {
        use registry::Error as E;
        match err {
            E::NotFound(_)
            | E::UnknownStream(_)
            | E::UnknownWorker { .. }
            | E::UnknownShard { .. } => ApiError::not_found(err.to_string()),
            E::GroupFull { .. } => {
                ApiError::new(StatusCode::CONFLICT, "group-full", err.to_string())
            }
            E::NotLeaseHolder { .. } => {
                ApiError::new(StatusCode::CONFLICT, "not-lease-holder", err.to_string())
            }
            E::ShardOpen { .. } => {
                ApiError::new(StatusCode::CONFLICT, "shard-open", err.to_string())
            }
            E::Keyspace(e) => e.clone().into(),
            E::StalePlan(_) => ApiError::new(StatusCode::CONFLICT, "stale-plan", err.to_string()),
            E::Watched(_) | E::NotWatched(_) | E::Overtaken(_) => {
                ApiError::new(StatusCode::CONFLICT, "stream-watched", err.to_string())
            }
            E::BadPlanId(_) | E::FanoutCap(_) | E::InvalidReport(_) => {
                ApiError::unprocessable(err.to_string())
            }
            E::Conflict => ApiError::new(StatusCode::CONFLICT, "conflict", err.to_string()),
            E::FanoutGrowing { account, switch_at } => ApiError::new(
                StatusCode::CONFLICT,
                "conflict",
                format!(
                    "account {account}'s fanout is growing: its new keys take over at {}; \
                     change its fanout after that",
                    super::timestamp_ms(*switch_at)
                ),
            ),
            E::Unavailable => ApiError::unavailable(
                "the database cannot take changes right now (unreachable, read-only while it \
                 fails over, or held up by another writer): send the change again later",
            )
            .away(),
            E::NotMade => ApiError::unavailable(format!("{err}: send it again later")),
            E::Stale { .. } => {
                ApiError::unavailable(format!("{err}: ask another replica, or again later"))
            }
            E::OutcomeUnknown(_) => ApiError::new(
                StatusCode::GATEWAY_TIMEOUT,
                "outcome-unknown",
                "the change was sent to the database, but the connection was lost before its \
                 answer came: it may or may not have been made. Send it again with the same \
                 Idempotency-Key to learn which, or read the account or stream back",
            ),
            E::SchemaNewer { .. } => ApiError::unavailable(err.to_string()),
            E::Compacted { horizon, .. } => {
                ApiError::new(StatusCode::GONE, "compacted", err.to_string())
                    .with("horizon", *horizon)
            }
            E::PastEnd { end, log_id, .. } => {
                ApiError::new(StatusCode::GONE, "past-end", err.to_string())
                    .with("log_id", log_id.to_string())
                    .with("end", *end)
            }
            E::KeyInUse => ApiError::new(
                StatusCode::CONFLICT,
                "idempotency-key-in-use",
                err.to_string(),
            ),
            E::Store(_) => ApiError::internal(err),
        }
    }
}
