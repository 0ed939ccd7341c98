//! `GET /snapshot`: the whole table as of one event, streamed as NDJSON, for a producer's
//! mirror to start from before it follows `GET /events` from that event on.

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::error::{ApiError, Problem};
use super::keys::Assignment;
use crate::AppState;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(snapshot))
}

/// The media type of the answer: one JSON value per line.
pub const NDJSON: &str = "application/x-ndjson";

/// Pages of lines the server reads ahead of a client.
const READ_AHEAD: usize = 2;

/// The first line of `GET /snapshot`.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct SnapshotHead {
    /// The newest event the table below holds: follow `GET /events?after=` from it.
    pub event_id: i64,
    /// How many assignment lines follow.
    pub accounts: i64,
    /// How long an answer may be used without hearing from the server: staged switches
    /// come at least this long after they are logged (unless an admin asked for sooner),
    /// so a mirror that synced within it cannot have missed one whose time has come.
    pub max_age_s: u64,
    /// The log `event_id` belongs to, a UUID (also in the `X-Keyspread-Log` header): a page of
    /// `GET /events` naming another log, or a 410, means this table's history ended there.
    /// (Backups written before logs had names lack it, and still import.)
    #[serde(default)]
    #[schema(required = true)]
    pub log_id: String,
}

/// The whole table as of one event: a first line [`SnapshotHead`], then one
/// [`Assignment`] per line by account (with `next` while a staged move is pending), all
/// read in one read transaction and streamed as read. A client that stops reading for the
/// request timeout has its answer cut short; count the lines against `accounts`.
#[utoipa::path(
    get, path = "/snapshot", tag = "keys",
    responses(
        (status = 200, description = "NDJSON: a `SnapshotHead` line, then `accounts` `Assignment` lines", content_type = "application/x-ndjson", body = SnapshotHead,
            headers(("x-keyspread-log" = String, description = "The log the table comes from (its `log_id`)"))),
        (status = 503, description = "The database cannot be read", body = Problem, content_type = "application/problem+json"),
    )
)]
async fn snapshot(State(state): State<AppState>) -> Result<Response, ApiError> {
    // Streaming a table is heavy work: it takes a turn of the heavy pool while it runs.
    let turn = state.heavy.turn().await;
    let mut snapshot = state.registry.snapshot().await?;
    let head = SnapshotHead {
        event_id: snapshot.event_id,
        accounts: snapshot.accounts,
        max_age_s: state.lookup_cache.lifetime(),
        log_id: snapshot.log_id.to_string(),
    };
    let log_id = snapshot.log_id;
    let stall = state.request_timeout;
    let (lines, body) = mpsc::channel::<Result<Bytes, std::io::Error>>(READ_AHEAD);
    let first = line(&head).map_err(|e| ApiError::internal(&e))?;
    tokio::spawn(async move {
        let _turn = turn;
        let send = |chunk| async {
            // A client that stops reading releases the transaction after `stall`.
            matches!(
                tokio::time::timeout(stall, lines.send(chunk)).await,
                Ok(Ok(()))
            )
        };
        if !send(Ok(first)).await {
            return;
        }
        loop {
            let chunk = match snapshot.next_page().await {
                Ok(None) => return,
                Ok(Some(page)) => page_lines(page),
                Err(err) => Err(std::io::Error::other(err.to_string())),
            };
            let failed = chunk.is_err();
            if let Err(err) = &chunk {
                tracing::warn!(%err, "snapshot cut short");
            }
            if !send(chunk).await || failed {
                return;
            }
        }
    });
    let stream = tokio_stream::wrappers::ReceiverStream::new(body);
    let ndjson = HeaderValue::from_static(NDJSON);
    let response = ([(header::CONTENT_TYPE, ndjson)], Body::from_stream(stream)).into_response();
    Ok(super::events::named(response, log_id))
}

/// One NDJSON line: `value` and a newline (the head of a snapshot).
pub fn line<T: Serialize>(value: &T) -> Result<Bytes, serde_json::Error> {
    let mut out = serde_json::to_vec(value)?;
    out.push(b'\n');
    Ok(out.into())
}

/// A page of assignments as lines, each as producers must use it now: the body of
/// `GET /snapshot` and of `keyspread export`.
pub fn page_lines(page: Vec<crate::store::Assignment>) -> Result<Bytes, std::io::Error> {
    let now = crate::registry::now_ms();
    let mut out = Vec::with_capacity(page.len() * 160);
    for a in page {
        serde_json::to_writer(&mut out, &Assignment::at(a, now))?;
        out.push(b'\n');
    }
    Ok(out.into())
}
