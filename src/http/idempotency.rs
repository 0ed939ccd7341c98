//! `Idempotency-Key` on every change (the IETF httpapi draft; Stripe's convention): the
//! first committed answer to a request sent with a key is kept, per actor, for 24 h; the
//! same key with the same method, path and body is answered that again without the change
//! being applied again; with another request it is 422; while the first is still being
//! made on this replica, 409. Refusals for the moment (408, 429, 503, 504) are not kept, so
//! a retry after one is applied as new.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use axum::body::{Body, Bytes, to_bytes};
use axum::extract::{Request, State};
use axum::http::{HeaderName, HeaderValue, Method, Response, StatusCode, header};
use axum::middleware::Next;
use axum::response::IntoResponse;
use serde::Serialize;
use sha2::{Digest, Sha256};

use super::error::{ApiError, PROBLEM_JSON};
use crate::AppState;
use crate::keyspace;
use crate::registry::{self, KEPT_FOR_MS, Keep, Ticket};
use crate::store::{Actor, Kept};

/// The request header.
pub const IDEMPOTENCY_KEY: HeaderName = HeaderName::from_static("idempotency-key");

/// Marks an answer replayed from a kept one.
pub const REPLAYED: HeaderName = HeaderName::from_static("idempotent-replayed");

/// Longest key accepted.
pub const MAX_KEY_LEN: usize = 255;

/// What a key is: printable ASCII, not starting or ending with a space (which HTTP would
/// not keep).
pub const KEY_PATTERN: &str = "^[!-~]([ -~]*[!-~])?$";

/// Largest answer kept (a batch of 10,000 accounts answers a few MB).
const MAX_KEPT_BODY: usize = 16 * 1024 * 1024;

/// The keys whose first request is being made on this replica, by actor.
#[derive(Debug, Clone, Default)]
pub struct InFlight(Arc<Mutex<HashSet<(Actor, String)>>>);

/// A key taken in [`InFlight`] until dropped.
struct Flight {
    set: InFlight,
    entry: (Actor, String),
}

impl InFlight {
    fn enter(&self, actor: &Actor, key: &str) -> Option<Flight> {
        let entry = (actor.clone(), key.to_owned());
        let fresh = (self.0.lock().expect("in-flight lock poisoned")).insert(entry.clone());
        fresh.then(|| Flight {
            set: self.clone(),
            entry,
        })
    }
}

impl Drop for Flight {
    fn drop(&mut self) {
        (self.set.0.lock().expect("in-flight lock poisoned")).remove(&self.entry);
    }
}

/// On a change sent with an `Idempotency-Key`: replays the answer kept for it, refuses a
/// reuse with another request (422) or one while the first is being made here (409), or
/// lets the change through with the key on its [`Ticket`], where the change keeps its
/// answer in its own transaction. An answer decided without a change (an allocation the
/// account had already, a release of an account without a key, a refusal of the request
/// itself) is kept on its own afterwards.
pub async fn idempotent(
    State(state): State<AppState>,
    request: Request,
    next: Next,
) -> Response<Body> {
    let Some(value) = request.headers().get(&IDEMPOTENCY_KEY) else {
        return next.run(request).await;
    };
    if !is_change(request.method()) {
        return next.run(request).await;
    }
    let key = match parse_key(value) {
        Ok(key) => key,
        Err(refused) => return refused.into_response(),
    };
    let actor = (request.extensions().get::<Actor>().cloned()).unwrap_or_else(Actor::loopback);
    let Some(ticket) = request.extensions().get::<Ticket>().cloned() else {
        return ApiError::internal(&"a change without a ticket").into_response();
    };
    let (parts, body) = request.into_parts();
    let body = match to_bytes(body, usize::MAX).await {
        Ok(body) => body,
        // The route's body limit, or a client that stopped sending.
        Err(err) => return too_large_or_broken(err),
    };
    let fingerprint = fingerprint(&parts.method, parts.uri.path(), &body);
    let Some(_flight) = state.in_flight.enter(&actor, &key) else {
        return ApiError::from(&registry::Error::KeyInUse).into_response();
    };
    let since = crate::registry::now_ms() - KEPT_FOR_MS;
    match state.registry.kept(&actor, &key, since).await {
        Ok(Some(kept)) if kept.fingerprint == fingerprint => return replay(kept),
        Ok(Some(_)) => {
            return ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "idempotency-key-reused",
                "this Idempotency-Key was sent before with another request (method, path or \
                 body): a key names one request; use a new key for a new request",
            )
            .into_response();
        }
        Ok(None) => {}
        Err(err) => return ApiError::from(err).for_read().into_response(),
    }
    ticket.set_keep(Keep::new(key.clone(), fingerprint));
    let response = next.run(Request::from_parts(parts, Body::from(body))).await;
    if ticket.was_kept() || !keepable(&response) {
        return response;
    }
    // Decided without a change: nothing to keep it with.
    let (parts, body) = response.into_parts();
    let Ok(body) = to_bytes(body, MAX_KEPT_BODY).await else {
        return ApiError::internal(&"an answer too large to keep").into_response();
    };
    let kept = Kept {
        fingerprint,
        status: parts.status.as_u16(),
        content_type: content_type(&parts.headers),
        body: body.to_vec(),
    };
    if let Err(err) = state.registry.keep_alone(&actor, &key, &kept).await {
        tracing::warn!(%err, "an answer could not be kept for its Idempotency-Key");
    }
    Response::from_parts(parts, Body::from(body))
}

/// Tells the change's ticket how an `Ok` answer of type `A` is rendered (the route's own
/// rendering, so the kept answer is the one its client gets): refusals the registry decides
/// (404, 409, 422...) are rendered as the route answers them, refusals for the moment not at
/// all. Nothing happens when the request sent no key.
pub fn tell<A: 'static>(ticket: &Ticket, ok: impl Fn(&A) -> Kept + Send + Sync + 'static) {
    let Some(keep) = ticket.keep() else {
        return;
    };
    keep.render_by(move |answer: Result<&A, &registry::Error>| match answer {
        Ok(a) => Some(ok(a)),
        Err(err) if decided(err) => Some(kept_problem(ApiError::from(err))),
        Err(_) => None,
    });
}

/// [`tell`] for a route that answers `told(answer)`: the same function renders the kept
/// answer and the one its client gets.
pub fn tell_json<A: Clone + 'static, B: Serialize + 'static>(
    ticket: &Ticket,
    told: fn(A) -> (StatusCode, axum::Json<B>),
) {
    tell(ticket, move |a: &A| {
        let (status, axum::Json(body)) = told(a.clone());
        json(status, &body)
    });
}

/// An answer with a JSON body, as `Json(body)` with `status` answers it.
pub fn json(status: StatusCode, body: &impl Serialize) -> Kept {
    Kept {
        fingerprint: [0; 32],
        status: status.as_u16(),
        content_type: Some("application/json".to_owned()),
        body: serde_json::to_vec(body).unwrap_or_default(),
    }
}

/// An answer without a body.
pub fn empty(status: StatusCode) -> Kept {
    Kept {
        fingerprint: [0; 32],
        status: status.as_u16(),
        content_type: None,
        body: Vec::new(),
    }
}

/// Whether `err` is the registry's decision about the request (kept), not a refusal for the
/// moment (the database away, a deadline, a conflict with another writer: not kept).
fn decided(err: &registry::Error) -> bool {
    use registry::Error as E;
    !matches!(
        err,
        E::Unavailable
            | E::NotMade
            | E::OutcomeUnknown(_)
            | E::Stale { .. }
            | E::SchemaNewer { .. }
            | E::Conflict
            | E::KeyInUse
            | E::Compacted { .. }
            | E::Store(_)
            | E::Keyspace(keyspace::Error::KeyTaken(_) | keyspace::Error::KeyNotHeld(_))
    )
}

fn kept_problem(err: ApiError) -> Kept {
    Kept {
        fingerprint: [0; 32],
        status: err.status().as_u16(),
        content_type: Some(PROBLEM_JSON.to_owned()),
        body: err.problem_bytes(),
    }
}

/// Whether an answer is one a repeat is told again: a 2xx, or a 4xx about the request, but
/// not a refusal for the moment or of the caller (401, 403, 408, 429), nor a conflict with
/// another writer or request.
fn keepable(response: &Response<Body>) -> bool {
    let status = response.status();
    let passing = matches!(
        status,
        StatusCode::UNAUTHORIZED
            | StatusCode::FORBIDDEN
            | StatusCode::REQUEST_TIMEOUT
            | StatusCode::TOO_MANY_REQUESTS
    );
    (status.is_success() || status.is_client_error())
        && !passing
        && response
            .extensions()
            .get::<super::error::Passing>()
            .is_none()
}

fn is_change(method: &Method) -> bool {
    matches!(
        *method,
        Method::POST | Method::PUT | Method::PATCH | Method::DELETE
    )
}

/// The key in `value`: 1 to 255 printable ASCII characters (spaces inside only), bare, or a
/// structured-field string (`"..."`, as the draft writes it) whose inside is the key.
fn parse_key(value: &HeaderValue) -> Result<String, ApiError> {
    let refuse = || {
        ApiError::bad_request(format!(
            "Idempotency-Key must be 1 to {MAX_KEY_LEN} visible ASCII characters (a UUID, say)"
        ))
    };
    let text = value.to_str().map_err(|_| refuse())?;
    let quoted = (text.len() > 2 && text.starts_with('"') && text.ends_with('"'))
        .then(|| &text[1..text.len() - 1])
        .filter(|inside| !inside.contains(['"', '\\']));
    let text = quoted.unwrap_or(text);
    let visible = text.bytes().all(|b| (0x20..0x7f).contains(&b));
    if text.is_empty() || text.len() > MAX_KEY_LEN || !visible || text.trim() != text {
        return Err(refuse());
    }
    Ok(text.to_owned())
}

/// What "the same request" is: its method, path and body, digested.
fn fingerprint(method: &Method, path: &str, body: &Bytes) -> [u8; 32] {
    let mut digest = Sha256::new();
    for part in [
        method.as_str().as_bytes(),
        b"\n",
        path.as_bytes(),
        b"\n",
        body,
    ] {
        digest.update(part);
    }
    digest.finalize().into()
}

/// A kept answer, told again.
fn replay(kept: Kept) -> Response<Body> {
    let mut response = Response::new(Body::from(kept.body));
    *response.status_mut() = StatusCode::from_u16(kept.status).unwrap_or(StatusCode::OK);
    let headers = response.headers_mut();
    if let Some(content_type) = kept
        .content_type
        .and_then(|c| HeaderValue::try_from(c).ok())
    {
        headers.insert(header::CONTENT_TYPE, content_type);
    }
    headers.insert(REPLAYED, HeaderValue::from_static("true"));
    response
}

fn content_type(headers: &axum::http::HeaderMap) -> Option<String> {
    (headers.get(header::CONTENT_TYPE)).and_then(|v| v.to_str().ok().map(str::to_owned))
}

/// A body that could not be read whole: over the route's limit (413), or cut off.
fn too_large_or_broken(err: axum::Error) -> Response<Body> {
    let too_large =
        std::error::Error::source(&err).is_some_and(|e| e.is::<http_body_util::LengthLimitError>());
    if too_large {
        ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "body-too-large",
            "the body is larger than this route takes",
        )
        .into_response()
    } else {
        ApiError::bad_request("the body could not be read whole").into_response()
    }
}
