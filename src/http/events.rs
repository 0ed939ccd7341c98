//! `GET /events`: the event log every replica follows, as a paged feed.

use axum::Json;
use axum::extract::{Query, State};
use axum::http::{HeaderName, HeaderValue};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::error::{ApiError, Problem};
use crate::AppState;
use crate::keyspace::{AccountId, HashKey};
use crate::store::{Change, LogId, LoggedEvent, MoveReason};

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(events))
}

/// Largest page of events. An event names at most an account (256 bytes) or a stream (128)
/// and a few numbers, never a map, so a full page stays well under a megabyte.
pub const MAX_EVENTS: u32 = 1000;

/// Paging through the event log by id.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct EventParams {
    /// Start after this event id (the `next` of the previous page); default 0.
    #[param(minimum = 0)]
    pub after: Option<i64>,
    /// Page size, 1..=1000 (default 100).
    #[param(minimum = 1, maximum = 1000)]
    pub limit: Option<u32>,
    /// Seconds to wait, 0..=60 (default 0), when no event after `after` exists yet: the
    /// answer comes as soon as one does (a long-poll), else empty when they pass.
    #[param(minimum = 0, maximum = 60)]
    pub wait_s: Option<u32>,
}

/// The longest a long-poll of the log waits (`wait_s`).
pub const MAX_WAIT_S: u32 = 60;

/// The `wait_s` a request to `uri` asks for, if it is a long-poll of the log: the request
/// may take that much longer than other requests. The query is read as the route's
/// extractor reads it (percent-encoded names too); a query it refuses, or a wait out of
/// range, counts as none (the request is refused).
pub fn long_poll(uri: &axum::http::Uri) -> std::time::Duration {
    let wait = (uri.path() == "/events")
        .then(|| Query::<EventParams>::try_from_uri(uri).ok())
        .flatten()
        .and_then(|Query(params)| params.wait_s)
        .filter(|&w| w <= MAX_WAIT_S)
        .unwrap_or(0);
    std::time::Duration::from_secs(u64::from(wait))
}

/// The header naming the log an answer of `GET /events` or `GET /snapshot` belongs to.
pub const LOG_HEADER: HeaderName = HeaderName::from_static("x-keyspread-log");

/// `response` with the [`LOG_HEADER`] naming `log_id`.
pub fn named(mut response: Response, log_id: LogId) -> Response {
    if let Ok(value) = HeaderValue::from_str(&log_id.to_string()) {
        response.headers_mut().insert(LOG_HEADER, value);
    }
    response
}

/// What an event did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum EventKind {
    Allocate,
    Release,
    Move,
    Reweight,
    StreamPut,
    StreamDelete,
    /// An account's cap on a fanout raised by load was set or cleared.
    MaxFanout,
}

/// Why a move was made.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum MoveReasonBody {
    /// An admin's rebalance or fanout change.
    Admin,
    /// The load controller.
    Load,
    /// The rebalance at the end of a reshard keyspread carried out.
    Reshard,
}

impl MoveReasonBody {
    /// As the JSON names it.
    pub fn as_str(self) -> &'static str {
        match self {
            MoveReasonBody::Admin => "admin",
            MoveReasonBody::Load => "load",
            MoveReasonBody::Reshard => "reshard",
        }
    }
}

impl From<MoveReason> for MoveReasonBody {
    fn from(reason: MoveReason) -> Self {
        match reason {
            MoveReason::Admin => MoveReasonBody::Admin,
            MoveReason::Load => MoveReasonBody::Load,
            MoveReason::Reshard => MoveReasonBody::Reshard,
        }
    }
}

/// One committed change.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct EventBody {
    /// Position in the log; ids only grow.
    pub id: i64,
    pub kind: EventKind,
    /// When it was committed (RFC 3339).
    #[schema(format = DateTime)]
    pub at: String,
    /// Who made the change: the name of the token it came with (`admin` for `--token`),
    /// `loopback` (a client on the server's host, no token configured), `controller` (the
    /// closed loop), `import` (`keyspread import`), `config` (the primary stream named at
    /// start-up), `kinesis` (a watched stream's map as listed from Kinesis, and the
    /// rebalance it called for), or `unrecorded` (logged before actors were). Never a token.
    #[schema(example = "loopback")]
    pub actor: String,
    /// The account, for account events.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub account: Option<String>,
    /// For account events: which of the account's keys changed (0 unless it has several).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub index: Option<u32>,
    /// The stream, for stream events.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stream: Option<String>,
    /// The account's key before the change (release, move, reweight).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key_before: Option<HashKey>,
    /// The account's key after the change (allocate, move, reweight).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key_after: Option<HashKey>,
    /// The key's weight (its share of the account's): the new one for allocate and
    /// reweight, the one it had for release and move.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub weight: Option<u64>,
    /// For `stream_put`: how many open shards the new map has. The map itself is not in
    /// the log: `GET /streams/{stream}` answers it while its `version` equals this `id`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shard_count: Option<u64>,
    /// For `move`: when producers switch from `key_before` to `key_after` (RFC 3339,
    /// milliseconds, UTC); the account holds both keys until then. For an `allocate` of a
    /// key a fanout raised by load added: when producers start sending it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false, format = DateTime)]
    pub switch_at: Option<String>,
    /// For `move`: why it was made (absent for moves logged before reasons were).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub reason: Option<MoveReasonBody>,
    /// For `max_fanout`: the account's new cap, null once cleared.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<u32>, minimum = 1, maximum = 1024)]
    pub max_fanout: Option<Option<u32>>,
}

impl From<LoggedEvent> for EventBody {
    fn from(logged: LoggedEvent) -> Self {
        let (switch_at, reason, max_fanout) = match &logged.event.change {
            Change::Move {
                switch_at, reason, ..
            } => {
                let reason = reason.map(MoveReasonBody::from);
                (Some(super::timestamp_ms(*switch_at)), reason, None)
            }
            Change::Allocate {
                switch_at: Some(switch_at),
                ..
            } => (Some(super::timestamp_ms(*switch_at)), None, None),
            Change::MaxFanout { max_fanout, .. } => (None, None, Some(*max_fanout)),
            _ => (None, None, None),
        };
        let (kind, account, stream) = match logged.event.change {
            Change::Allocate { account, index, .. } => {
                (EventKind::Allocate, Some((account, index)), None)
            }
            Change::Release { account, index, .. } => {
                (EventKind::Release, Some((account, index)), None)
            }
            Change::Move { account, index, .. } => (EventKind::Move, Some((account, index)), None),
            Change::Reweight { account, index, .. } => {
                (EventKind::Reweight, Some((account, index)), None)
            }
            Change::MaxFanout { account, .. } => (EventKind::MaxFanout, Some((account, 0)), None),
            Change::StreamPut { stream } => (EventKind::StreamPut, None, Some(stream)),
            Change::StreamDelete { stream } => (EventKind::StreamDelete, None, Some(stream)),
        };
        let (account, index) = account.unzip();
        EventBody {
            id: logged.event.id,
            kind,
            at: super::timestamp(logged.event.at),
            actor: logged.actor.to_string(),
            account: account.map(AccountId::into_string),
            index,
            stream,
            key_before: logged.key_before,
            key_after: logged.key_after,
            weight: logged.weight,
            shard_count: logged.shard_count,
            switch_at,
            reason,
            max_fanout,
        }
    }
}

/// One page of the event log.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct EventPage {
    /// Events in id order.
    pub events: Vec<EventBody>,
    /// Pass as `after` for the next page: the last event's id, or `after` itself when the
    /// page is empty (nothing newer yet; ask again later).
    pub next: i64,
    /// The log these events belong to (a UUID), read with them (and in the
    /// `X-Keyspread-Log` header). Event ids mean something only within one log: a reader whose position
    /// came from another log (the snapshot's `log_id`) takes a new `GET /snapshot`.
    pub log_id: String,
}

/// The event log, oldest first, paged by id. With `wait_s`, a long-poll: when no event after
/// `after` exists yet, the answer waits until one does (on a replica: until its follower
/// applies it) or `wait_s` passes, then answers empty with `next` = `after`. A reader whose
/// `after` is below the log's horizon (the events after it were compacted away), or past the
/// log's end (a position in another history), gets 410.
#[utoipa::path(
    get, path = "/events", tag = "observability",
    params(EventParams),
    responses(
        (status = 200, description = "Events after `after`, at most `limit` (waiting up to `wait_s` for the first)", body = EventPage,
            headers(("x-keyspread-log" = String, description = "The log the page belongs to (its `log_id`)"))),
        (status = 400, description = "Invalid paging parameters", body = Problem, content_type = "application/problem+json"),
        (status = 410, description = "Events after `after` were compacted away (`--event-retention`; `CompactedProblem`), or `after` is past the log's newest event (`PastEndProblem`: the position belongs to another log, such as the database's before a restore): take a new `GET /snapshot` and follow the log from its `event_id`", content_type = "application/problem+json",
            body = inline(GoneProblem),
            headers(("x-keyspread-log" = String, description = "The log `after` was read against"))),
    )
)]
async fn events(
    State(state): State<AppState>,
    Query(params): Query<EventParams>,
) -> Result<Response, ApiError> {
    let after = params.after.unwrap_or(0);
    if after < 0 {
        return Err(ApiError::bad_request(format!(
            "after must be 0 or more, got {after}"
        )));
    }
    let limit = super::page_limit(params.limit, MAX_EVENTS)?;
    let wait_s = params.wait_s.unwrap_or(0);
    if wait_s > MAX_WAIT_S {
        return Err(ApiError::bad_request(format!(
            "wait_s must be 0..={MAX_WAIT_S}, got {wait_s}"
        )));
    }
    let wait = std::time::Duration::from_secs(u64::from(wait_s));
    let page = match state.registry.wait_for_events(after, limit, wait).await {
        Ok(page) => page,
        Err(
            err @ (crate::registry::Error::Compacted { log_id, .. }
            | crate::registry::Error::PastEnd { log_id, .. }),
        ) => return Ok(named(ApiError::from(err).into_response(), log_id)),
        Err(err) => return Err(err.into()),
    };
    let next = page.events.last().map_or(after, |l| l.event.id);
    let body = EventPage {
        events: page.events.into_iter().map(EventBody::from).collect(),
        next,
        log_id: page.log_id.to_string(),
    };
    Ok(named(Json(body).into_response(), page.log_id))
}

/// The 410s of `GET /events`, told apart by their members.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(untagged)]
pub enum GoneProblem {
    Compacted(CompactedProblem),
    PastEnd(PastEndProblem),
}

/// The 410 problem: the events after `after` were compacted away.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct CompactedProblem {
    /// `urn:keyspread:problem:compacted`.
    #[serde(rename = "type")]
    pub kind: String,
    /// `Gone`.
    pub title: String,
    /// 410.
    pub status: u16,
    /// What was dropped, and what the reader does next.
    pub detail: String,
    /// The log's horizon: events at or below it may be gone, and `after` must be at least
    /// this. A reader behind it takes a new `GET /snapshot`.
    pub horizon: i64,
}

/// The 410 problem: `after` is past the log's newest event, so the reader's position
/// belongs to another history (a database restored, imported afresh or rewound).
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct PastEndProblem {
    /// `urn:keyspread:problem:past-end`.
    #[serde(rename = "type")]
    pub kind: String,
    /// `Gone`.
    pub title: String,
    /// 410.
    pub status: u16,
    /// Where the log ends, and what the reader does next.
    pub detail: String,
    /// The log the database holds (a UUID).
    pub log_id: String,
    /// Its newest event id: every position in it is at most this.
    pub end: i64,
}
