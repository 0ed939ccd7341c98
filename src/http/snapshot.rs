//! `GET /snapshot`: the whole table as of one event, streamed as NDJSON, for a producer's
//! mirror to start from before it follows `GET /events` from that event on.

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
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
    /// The primary stream's name as of `event_id`, the one producers send to: mirrors
    /// report what they sent to it (`POST /load/producers`). Absent while none is
    /// registered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub stream: Option<String>,
}

/// The whole table as of one event: a first line [`SnapshotHead`], then one
/// [`Assignment`] per line by account (with `next` while a staged move is pending), all
/// read in one read transaction. The table is written to a spool (a temporary file) as fast
/// as it is read and sent from there as the client reads, so a slow client holds neither
/// the transaction nor a turn of the heavy pool. A client that stops reading for the
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
    let (spool, progress) = state
        .spools
        .open()
        .await
        .map_err(|e| ApiError::internal(&e))?;
    // Reading a table is heavy work: it takes a turn of the heavy pool until it is spooled.
    let turn = state.heavy.turn().await;
    let mut snapshot = state.registry.snapshot().await?;
    let head = SnapshotHead {
        event_id: snapshot.event_id,
        accounts: snapshot.accounts,
        max_age_s: state.lookup_cache.lifetime(),
        log_id: snapshot.log_id.to_string(),
        stream: snapshot.stream.clone(),
    };
    let log_id = snapshot.log_id;
    let first = line(&head).map_err(|e| ApiError::internal(&e))?;
    tokio::spawn(async move {
        let mut page = Ok(first);
        let result = loop {
            let written = match page {
                Ok(bytes) => spool.write(bytes).await,
                Err(err) => Err(err),
            };
            if let Err(err) = written {
                tracing::warn!(%err, "snapshot cut short");
                break Err(err.to_string());
            }
            if spool.abandoned() {
                return;
            }
            page = match snapshot.next_page().await {
                Ok(None) => break Ok(()),
                Ok(Some(assignments)) => page_lines(assignments),
                Err(err) => Err(std::io::Error::other(err.to_string())),
            };
        };
        // The transaction and the turn end here, whatever the client has read.
        drop((snapshot, turn));
        spool.finish(result);
    });
    let ndjson = HeaderValue::from_static(NDJSON);
    let body = progress.into_body(state.request_timeout);
    let response = ([(header::CONTENT_TYPE, ndjson)], body).into_response();
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
