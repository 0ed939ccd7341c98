//! Cross-cutting request handling: authentication, the names a server without
//! a token answers under, and problem+json for every error, the framework's own rejections
//! included.

use std::net::SocketAddr;

use axum::body::{Body, to_bytes};
use axum::extract::connect_info::MockConnectInfo;
use axum::extract::{ConnectInfo, MatchedPath, Request, State};
use axum::http::{HeaderMap, Method, Response, StatusCode, header};
use axum::middleware::Next;
use axum::response::IntoResponse as _;

use super::auth::{Refused, permit};
use super::client::Client;
use super::error::{PROBLEM_JSON, problem};
use super::roles::{self, Need};
use crate::config::{Grant, ReadAccess, Role, Token};
use crate::registry::Ticket;
use crate::store::Actor;
use crate::{Access, AppState};

/// Answers 408 when a request takes longer than `limit`, or than `limit` plus the wait a
/// long-poll of the log asks for (`GET /events?wait_s=`), unless the change it asked for
/// is committing: then the commit's result is the answer. Every request carries the
/// [`Ticket`] its change commits by, due at the same `limit`, so a 408 to a change means
/// it was not made, and never will be.
pub async fn time_limit(
    State(limit): State<std::time::Duration>,
    mut request: Request,
    next: Next,
) -> Response<Body> {
    let ticket = Ticket::new(limit);
    request.extensions_mut().insert(ticket.clone());
    let limit = limit + super::events::long_poll(request.uri());
    let answer = next.run(request);
    tokio::pin!(answer);
    match tokio::time::timeout(limit, &mut answer).await {
        Ok(response) => response,
        Err(_) if ticket.refuse() => {
            let mut response = Response::new(Body::empty());
            *response.status_mut() = StatusCode::REQUEST_TIMEOUT;
            response
        }
        Err(_) => answer.await,
    }
}

/// Every operation needs what `roles::need` says. Without tokens (no `--token`, no
/// `--tokens-file`), changes are taken from loopback clients only, and no foreign `Origin`;
/// with them, a token whose role allows the operation, and reads too with `--read-access
/// token`; `/metrics` needs `--metrics-token` when there is one. Refused credentials spend
/// their host's budget ([`CredentialBudget`](super::CredentialBudget)), other refusals the
/// client's mutation limit; allowed changes are limited only with `--limit-token-holders`.
/// An allowed request carries its [`Actor`] to the handler. Behind a trusted proxy, the
/// client is the one its `X-Forwarded-For` names; a request another proxy relayed (it
/// carries a forwarding header) is from a remote client.
pub async fn authorize(
    State(state): State<AppState>,
    mut request: Request,
    next: Next,
) -> Response<Body> {
    let template = request
        .extensions()
        .get::<MatchedPath>()
        .map(|p| p.as_str().to_owned())
        .unwrap_or_default();
    let access = &state.access;
    let role = match roles::need(request.method(), &template) {
        Need::Nothing => return next.run(request).await,
        Need::MetricsToken => None,
        Need::Role(role) => Some(role),
    };
    let reads_open = access.read_access == ReadAccess::Open || access.credentials.is_none();
    if role == Some(Role::Read) && reads_open {
        return next.run(request).await;
    }
    let client =
        peer(&request).map(|addr| access.trusted_proxies.client(addr.ip(), request.headers()));
    let allowed = identify(access, client, request.headers(), role);
    let limited = match &allowed {
        Err(refusal) => !refusal.counted,
        Ok(_) => access.limit_token_holders && role.is_some_and(|r| r != Role::Read),
    };
    if limited
        && let (Some(limiter), Some(client)) = (&access.mutation_limit, client)
        && let Err(wait) = limiter.check(client)
    {
        return too_many(wait, "too many changes from this client");
    }
    match allowed {
        Ok(actor) => {
            if let Some(actor) = actor {
                request.extensions_mut().insert(actor);
            }
            next.run(request).await
        }
        Err(refusal) => *refusal.answer,
    }
}

/// Who a request that needs `role` (or, for `None`, the metrics token) is: its actor (none
/// for a scraper), or its refusal.
fn identify(
    access: &Access,
    client: Option<Client>,
    headers: &HeaderMap,
    role: Option<Role>,
) -> Result<Option<Actor>, Refusal> {
    match (role, &access.credentials) {
        (None, _) => match &access.metrics_token {
            Some(token) => {
                on_budget(access, client, |_| SCRAPER, || scraper(headers, token)).map(|()| None)
            }
            None => Ok(None),
        },
        (Some(role), Some(credentials)) => {
            let grant = on_budget(
                access,
                client,
                |g: &Grant| &g.name,
                || credentials.authenticate(headers, role),
            );
            grant.and_then(|grant| match permit(&grant, role) {
                Ok(()) => Ok(Some(Actor::new(&grant.name))),
                Err(answer) => Err(Refusal::uncounted(answer)),
            })
        }
        (Some(_), None) => match local_only(access, client, headers) {
            Some(answer) => Err(Refusal::uncounted(answer)),
            None => Ok(Some(Actor::loopback())),
        },
    }
}

/// What the budget of refused credentials remembers a metrics scraper by: no grant's name
/// (those have no `/`).
const SCRAPER: &str = "/metrics";

/// Nothing when the request carries the metrics token; else the 401.
fn scraper(headers: &HeaderMap, token: &Token) -> Result<(), Refused> {
    match carries(headers, token) {
        true => Ok(()),
        false => Err(Refused::Unknown(Box::new(unauthorized(
            "metrics need Authorization: Bearer <metrics token>",
        )))),
    }
}

/// A refused request's answer, and whether the budget of refused credentials counted it
/// (else the mutation limit does).
struct Refusal {
    answer: Box<Response<Body>>,
    counted: bool,
}

impl Refusal {
    fn uncounted(answer: Response<Body>) -> Refusal {
        Refusal {
            answer: Box::new(answer),
            counted: false,
        }
    }
}

/// Runs `authenticate` on the budget of refused credentials of `client`'s host: a refusal
/// keeps the try it took, a pass gives it back. Over budget nothing is checked but the
/// names that passed from that host recently: any other token, right or wrong, gets the
/// same 429 (see [`CredentialBudget`](super::CredentialBudget) for the trade-off).
fn on_budget<G>(
    access: &Access,
    client: Option<Client>,
    name: fn(&G) -> &str,
    authenticate: impl FnOnce() -> Result<G, Refused>,
) -> Result<G, Refusal> {
    let Some((budget, client)) = access.credential_budget.as_ref().zip(client) else {
        return authenticate().map_err(|refused| Refusal::uncounted(refused.into_answer()));
    };
    let taken = match budget.take(client) {
        Ok(taken) => taken,
        Err(wait) => {
            return match authenticate() {
                Ok(grant) if budget.knows(client, name(&grant)) => Ok(grant),
                _ => Err(Refusal {
                    answer: Box::new(too_many(
                        wait,
                        "too many refused credentials from this host, so no token from it is \
                         checked now but those that passed from it in the last 10 minutes",
                    )),
                    counted: true,
                }),
            };
        }
    };
    match authenticate() {
        Ok(grant) => {
            budget.passed(taken, name(&grant));
            Ok(grant)
        }
        Err(Refused::Unknown(answer)) => Err(Refusal {
            answer,
            counted: true,
        }),
        Err(refused @ Refused::Malformed(_)) => {
            budget.give_back(taken);
            Err(Refusal::uncounted(refused.into_answer()))
        }
    }
}

/// Without a token: the refusal of a mutation from another host, or from a page of
/// another site (a form posted from elsewhere by a browser on this host).
fn local_only(
    access: &Access,
    client: Option<Client>,
    headers: &HeaderMap,
) -> Option<Response<Body>> {
    if let Some(Client::Relayed(_)) = client {
        return Some(problem(
            StatusCode::FORBIDDEN,
            "forbidden",
            "no token is configured, so only clients on the server's own host may change \
             assignments, and this request came through a proxy (it carries Forwarded, Via, \
             X-Real-IP or X-Forwarded-*) not named in --trusted-proxies, so its client is \
             remote: name the proxy in --trusted-proxies (KEYSPREAD_TRUSTED_PROXIES), or start \
             keyspread with KEYSPREAD_TOKEN",
        ));
    }
    if !client.is_some_and(Client::is_loopback) {
        return Some(problem(
            StatusCode::FORBIDDEN,
            "forbidden",
            "no token is configured, so only clients on the server's own host may change \
             assignments; start keyspread with KEYSPREAD_TOKEN to allow others",
        ));
    }
    let origin = headers.get(header::ORIGIN)?;
    (!access.local_names.origin(origin.as_bytes())).then(|| {
        problem(
            StatusCode::FORBIDDEN,
            "foreign-origin",
            &format!(
                "no token is configured, so changes are taken only from pages of this host, \
                 and Origin {} is not one: list its host in --allowed-hosts \
                 (KEYSPREAD_ALLOWED_HOSTS) if it is this server's, or set a token with \
                 --token (KEYSPREAD_TOKEN)",
                quoted(origin.as_bytes())
            ),
        )
    })
}

/// Without a token, answers only requests addressed to a loopback name or one of
/// `--allowed-hosts`: a page that rebinds its own name to this host sends that name. A
/// request without `Host` (HTTP/1.0) does not come from a browser. With a token, the token
/// is the protection and every name is answered.
pub async fn guard_hosts(
    State(state): State<AppState>,
    request: Request,
    next: Next,
) -> Response<Body> {
    let access = &state.access;
    if access.credentials.is_some() {
        return next.run(request).await;
    }
    let names = &access.local_names;
    let headers = request.headers().get_all(header::HOST).iter();
    let absolute = request.uri().authority().map(|a| a.as_str().as_bytes());
    let foreign = headers
        .map(|v| v.as_bytes())
        .chain(absolute)
        .find(|host| !names.host(host));
    match foreign {
        Some(host) => problem(
            StatusCode::FORBIDDEN,
            "foreign-host",
            &format!(
                "no token is configured, so this server answers only requests to a loopback \
                 name or address, and Host {} is not one: list the name in --allowed-hosts \
                 (KEYSPREAD_ALLOWED_HOSTS), or set a token with --token (KEYSPREAD_TOKEN)",
                quoted(host)
            ),
        ),
        None => next.run(request).await,
    }
}

/// A header value for a message: quoted, escaped, at most 100 bytes of it.
fn quoted(value: &[u8]) -> String {
    let text = String::from_utf8_lossy(&value[..value.len().min(100)]);
    format!("{text:?}")
}

/// 429 with the whole seconds to wait in `Retry-After`.
fn too_many(wait: std::time::Duration, why: &str) -> Response<Body> {
    let seconds = (wait.as_secs() + u64::from(wait.subsec_nanos() > 0)).max(1);
    let mut refused = problem(
        StatusCode::TOO_MANY_REQUESTS,
        "rate-limited",
        &format!("{why}: try again in {seconds} s"),
    );
    refused
        .headers_mut()
        .insert(header::RETRY_AFTER, seconds.into());
    refused
}

/// The connection's peer, as the server saw it (or as a test mocks it).
fn peer(request: &Request) -> Option<SocketAddr> {
    let extensions = request.extensions();
    extensions
        .get::<ConnectInfo<SocketAddr>>()
        .map(|ConnectInfo(addr)| *addr)
        .or_else(|| {
            extensions
                .get::<MockConnectInfo<SocketAddr>>()
                .map(|MockConnectInfo(addr)| *addr)
        })
}

/// Whether `headers` carry `Authorization: Bearer <token>`.
fn carries(headers: &HeaderMap, token: &Token) -> bool {
    bearer(headers).is_some_and(|given| same_secret(given, token.expose()))
}

/// 401, asking for a bearer token.
fn unauthorized(detail: &str) -> Response<Body> {
    let mut denied = problem(StatusCode::UNAUTHORIZED, "unauthorized", detail);
    denied.headers_mut().insert(
        header::WWW_AUTHENTICATE,
        "Bearer".parse().expect("static header"),
    );
    denied
}

fn bearer(headers: &HeaderMap) -> Option<&str> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
}

/// Compares in time independent of where the inputs differ.
fn same_secret(given: &str, expected: &str) -> bool {
    let (a, b) = (given.as_bytes(), expected.as_bytes());
    let diff = a
        .iter()
        .zip(b)
        .fold(a.len() ^ b.len(), |acc, (x, y)| acc | usize::from(x ^ y));
    std::hint::black_box(diff) == 0
}

/// A read refused because the database cannot be reached is told so in a read's words (the
/// registry says it as a change's).
pub async fn worded_for_reads(request: Request, next: Next) -> Response<Body> {
    let read = matches!(*request.method(), Method::GET | Method::HEAD);
    let response = next.run(request).await;
    if read
        && response
            .extensions()
            .get::<super::error::DatabaseAway>()
            .is_some()
    {
        return super::ApiError::unavailable(super::error::READ_AWAY).into_response();
    }
    response
}

/// Turns any error response that is not already problem+json into one. The operator
/// page's own error pages stay HTML: a person reads them.
pub async fn problem_for_errors(response: Response<Body>) -> Response<Body> {
    let status = response.status();
    let kept = response
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| {
            let v = v.as_bytes();
            v.starts_with(PROBLEM_JSON.as_bytes()) || v.starts_with(b"text/html")
        });
    if !(status.is_client_error() || status.is_server_error()) || kept {
        return response;
    }
    let (parts, body) = response.into_parts();
    let detail = match status {
        StatusCode::PAYLOAD_TOO_LARGE => {
            "the request body is larger than this server accepts".to_owned()
        }
        StatusCode::REQUEST_TIMEOUT => "the request took longer than the server allows".to_owned(),
        s if s.is_server_error() => "the server could not complete the request".to_owned(),
        // Framework rejections carry a short plain-text reason: pass it on.
        _ => {
            let bytes = to_bytes(body, 4096).await.unwrap_or_default();
            let text = String::from_utf8_lossy(&bytes).trim().to_owned();
            if text.is_empty() {
                status.canonical_reason().unwrap_or("error").to_owned()
            } else {
                text
            }
        }
    };
    let slug = match status {
        StatusCode::BAD_REQUEST => "bad-request",
        StatusCode::NOT_FOUND => "not-found",
        StatusCode::METHOD_NOT_ALLOWED => "method-not-allowed",
        StatusCode::REQUEST_TIMEOUT => "timeout",
        StatusCode::PAYLOAD_TOO_LARGE => "body-too-large",
        StatusCode::UNSUPPORTED_MEDIA_TYPE => "unsupported-media-type",
        StatusCode::UNPROCESSABLE_ENTITY => "invalid-body",
        s if s.is_server_error() => "internal",
        _ => "client-error",
    };
    let mut converted = problem(status, slug, &detail);
    for (name, value) in &parts.headers {
        if name != header::CONTENT_TYPE && name != header::CONTENT_LENGTH {
            converted.headers_mut().insert(name, value.clone());
        }
    }
    converted
}

/// Unknown paths.
pub async fn not_found(request: Request) -> Response<Body> {
    problem(
        StatusCode::NOT_FOUND,
        "not-found",
        &format!("no route for {} {}", request.method(), request.uri().path()),
    )
}

/// Known paths, wrong method.
pub async fn method_not_allowed(request: Request) -> Response<Body> {
    problem(
        StatusCode::METHOD_NOT_ALLOWED,
        "method-not-allowed",
        &format!(
            "{} is not allowed on {}",
            request.method(),
            request.uri().path()
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_compare_whole() {
        assert!(same_secret("0123456789abcdef", "0123456789abcdef"));
        assert!(!same_secret("0123456789abcdeX", "0123456789abcdef"));
        assert!(!same_secret("0123456789abcdef0", "0123456789abcdef"));
        assert!(!same_secret("", "0123456789abcdef"));
    }

    #[test]
    fn bearer_scheme_is_case_insensitive() {
        let mut headers = HeaderMap::new();
        headers.insert(header::AUTHORIZATION, "bearer abc".parse().unwrap());
        assert_eq!(bearer(&headers), Some("abc"));
        headers.insert(header::AUTHORIZATION, "Basic abc".parse().unwrap());
        assert_eq!(bearer(&headers), None);
    }
}
