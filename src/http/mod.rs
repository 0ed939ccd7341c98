//! HTTP: routes, middleware, errors and the OpenAPI document.

mod auth;
mod aws_cli;
mod client;
mod error;
mod events;
mod extract;
mod health;
mod heavy;
pub mod idempotency;
mod keys;
mod leases;
mod limit;
mod linger;
mod load;
mod local;
mod metrics;
mod middleware;
mod openapi;
mod openapi30;
mod rebalance;
mod reshard;
pub mod roles;
mod shards;
mod snapshot;
mod spool;
mod streams;
mod ui;

use std::sync::Arc;

use axum::Router;
use axum::extract::Request;
use axum::http::{HeaderName, header};
use tower::ServiceBuilder;
use tower_http::catch_panic::CatchPanicLayer;
use tower_http::limit::RequestBodyLimitLayer;
use tower_http::request_id::{MakeRequestUuid, PropagateRequestIdLayer, SetRequestIdLayer};
use tower_http::trace::TraceLayer;
use utoipa::OpenApi as _;
use utoipa_axum::router::OpenApiRouter;
use utoipa_swagger_ui::SwaggerUi;

pub use auth::{Credentials, CredentialsError};
pub use client::{Client, TrustedProxies};
pub use error::{ApiError, PROBLEM_JSON, Problem};
pub use events::{EventBody, EventPage, long_poll};
pub use heavy::HeavyWork;
pub use idempotency::InFlight;
pub use keys::{Assignment, AssignmentPage};
pub use limit::{CredentialBudget, MutationLimiter};
pub use linger::Lingering;
pub use local::LocalNames;
pub use metrics::HttpMetrics;
pub use rebalance::MAX_SWITCH_AFTER_S;
pub use shards::ShardOf;
pub use snapshot::{NDJSON, SnapshotHead, line as ndjson_line, page_lines};
pub use spool::Spools;
pub use streams::{PutStream, StreamMap};

use crate::AppState;

/// Largest request body accepted.
pub const BODY_LIMIT: usize = 64 * 1024;

/// Largest body `POST /keys/batch` accepts: 10,000 accounts of up to 256 bytes and more.
pub const BATCH_BODY_LIMIT: usize = 4 * 1024 * 1024;

/// Largest body `PUT /streams/{name}` accepts. `aws kinesis list-shards` prints a stream of
/// 10,000 open shards split from 5,000 (their parents still listed) in 7.3 MB; this leaves
/// room for as many closed shards again.
pub const STREAM_BODY_LIMIT: usize = 16 * 1024 * 1024;

/// Largest body a consumer worker's heartbeat may carry: load entries of 1,000 accounts
/// (of up to 256 bytes) each, for a worker holding several shards.
pub const HEARTBEAT_BODY_LIMIT: usize = 4 * 1024 * 1024;

const REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// Every documented route, with the document built from them; with `state`, each change
/// also keeps its answer for an Idempotency-Key (the document needs no state).
fn api(state: Option<&AppState>) -> OpenApiRouter<AppState> {
    let limit = |routes, limit| limited(routes, limit, state);
    let mut api = OpenApiRouter::with_openapi(openapi::ApiDoc::openapi())
        .merge(limit(keys::router(), BODY_LIMIT))
        .merge(limit(keys::batch_router(), BATCH_BODY_LIMIT))
        .merge(limit(shards::router(), BODY_LIMIT))
        .merge(limit(rebalance::router(), BODY_LIMIT))
        .merge(limit(streams::router(), BODY_LIMIT))
        .merge(limit(streams::put_router(), STREAM_BODY_LIMIT))
        .merge(limit(reshard::router(), BODY_LIMIT))
        .merge(limit(leases::router(), BODY_LIMIT))
        .merge(limit(leases::heartbeat_router(), HEARTBEAT_BODY_LIMIT))
        .merge(limit(load::router(), BODY_LIMIT))
        .merge(limit(load::producers_router(), HEARTBEAT_BODY_LIMIT))
        .merge(limit(health::router(), BODY_LIMIT))
        .merge(limit(metrics::router(), BODY_LIMIT))
        .merge(limit(events::router(), BODY_LIMIT))
        .merge(limit(snapshot::router(), BODY_LIMIT))
        .merge(limit(ui::router(), BODY_LIMIT));
    openapi::optional_bodies(api.get_openapi_mut());
    openapi::guarded_mutations(api.get_openapi_mut());
    openapi::idempotent_mutations(api.get_openapi_mut());
    openapi::role_security(api.get_openapi_mut());
    api
}

/// `routes` with bodies up to `limit` bytes, refused with 413 from their length before they
/// are read (the extractors' own default, 2 MB, set to it too, or it would refuse a body
/// the limit allows); inside that limit, with `state`, the Idempotency-Key of each change.
fn limited(
    routes: OpenApiRouter<AppState>,
    limit: usize,
    state: Option<&AppState>,
) -> OpenApiRouter<AppState> {
    let routes = match state {
        Some(state) => routes.layer(axum::middleware::from_fn_with_state(
            state.clone(),
            idempotency::idempotent,
        )),
        None => routes,
    };
    routes
        .layer(RequestBodyLimitLayer::new(limit))
        .layer(axum::extract::DefaultBodyLimit::max(limit))
}

/// Paths the router serves besides the API's: the document, its 3.0 rendition and Swagger UI.
const DOC_PATHS: [&str; 5] = [
    "/openapi.json",
    OPENAPI_30_PATH,
    "/docs",
    "/docs/",
    "/docs/{*rest}",
];

/// Where the OpenAPI 3.0.3 rendition is served.
const OPENAPI_30_PATH: &str = "/openapi-3.0.json";

impl HttpMetrics {
    /// Series for every route this service has.
    pub fn for_routes() -> HttpMetrics {
        let (_, doc) = api(None).split_for_parts();
        let api_paths = doc.paths.paths.into_keys();
        HttpMetrics::new(api_paths.chain(DOC_PATHS.map(String::from)))
    }
}

/// At most the first 64 characters of something a client sent, for an error's detail.
fn clip(text: &str) -> String {
    match text.char_indices().nth(64) {
        Some((end, _)) => format!("{}...", &text[..end]),
        None => text.to_owned(),
    }
}

/// A paged route's `limit`: 100 when left out, else 1 to `max`.
fn page_limit(limit: Option<u32>, max: u32) -> Result<u32, ApiError> {
    let limit = limit.unwrap_or(100);
    if (1..=max).contains(&limit) {
        Ok(limit)
    } else {
        Err(ApiError::bad_request(format!(
            "limit must be between 1 and {max}, got {limit}"
        )))
    }
}

/// Unix milliseconds as RFC 3339 in UTC, such as `2026-11-21T22:42:19.12Z`: the fraction
/// only when it is not zero, without trailing zeros (as the `time` crate writes it).
fn timestamp(ms: i64) -> String {
    Timestamp(ms).to_string()
}

/// Unix milliseconds as RFC 3339 in UTC with exactly three digits of fraction, such as
/// `2026-11-21T22:42:19.120Z`: the instants clients act on to the millisecond (a switch).
fn timestamp_ms(ms: i64) -> String {
    TimestampMs(ms).to_string()
}

/// Unix milliseconds, displayed as [`timestamp_ms`] writes them.
#[derive(Debug, Clone, Copy)]
struct TimestampMs(i64);

impl std::fmt::Display for TimestampMs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let text = Timestamp(self.0).to_string();
        let Some(seconds) = text.strip_suffix('Z') else {
            return f.write_str(&text);
        };
        match seconds.split_once('.') {
            Some((whole, fraction)) => write!(f, "{whole}.{fraction:0<3}Z"),
            None => write!(f, "{seconds}.000Z"),
        }
    }
}

impl serde::Serialize for TimestampMs {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

/// Unix milliseconds, displayed as [`timestamp`] writes them. Written by hand for years
/// 1970 to 9999 (into the formatter, no allocation), since every lookup answer carries
/// one.
#[derive(Debug, Clone, Copy)]
struct Timestamp(i64);

impl std::fmt::Display for Timestamp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        const YEAR_10000: i64 = 253_402_300_800_000;
        let ms = self.0;
        if !(0..YEAR_10000).contains(&ms) {
            use time::format_description::well_known::Rfc3339;
            let text = time::OffsetDateTime::from_unix_timestamp_nanos(i128::from(ms) * 1_000_000)
                .unwrap_or(time::OffsetDateTime::UNIX_EPOCH)
                .format(&Rfc3339)
                .unwrap_or_default();
            return f.write_str(&text);
        }
        let (days, ms_of_day) = (ms / 86_400_000, ms % 86_400_000);
        let (year, month, day) = civil_from_days(days);
        let seconds = ms_of_day / 1000;
        let mut text = [0u8; 24];
        let mut at = 0;
        let mut push = |value: i64, width: u32, then: u8| {
            for place in (0..width).rev() {
                text[at] = b'0' + ((value / 10_i64.pow(place)) % 10) as u8;
                at += 1;
            }
            text[at] = then;
            at += 1;
        };
        push(year, 4, b'-');
        push(month, 2, b'-');
        push(day, 2, b'T');
        push(seconds / 3600, 2, b':');
        push(seconds / 60 % 60, 2, b':');
        let mut fraction = ms_of_day % 1000;
        if fraction == 0 {
            push(seconds % 60, 2, b'Z');
        } else {
            push(seconds % 60, 2, b'.');
            let mut width = 3;
            while fraction % 10 == 0 {
                fraction /= 10;
                width -= 1;
            }
            push(fraction, width, b'Z');
        }
        f.write_str(std::str::from_utf8(&text[..at]).expect("ASCII digits and separators"))
    }
}

impl serde::Serialize for Timestamp {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

/// Year, month and day of a count of days since 1970-01-01 (Howard Hinnant's algorithm).
fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let day_of_era = z.rem_euclid(146_097);
    let year_of_era =
        (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let shifted_month = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * shifted_month + 2) / 5 + 1;
    let month = if shifted_month < 10 {
        shifted_month + 3
    } else {
        shifted_month - 9
    };
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

/// The OpenAPI document, as served at `/openapi.json` and committed in `openapi/`.
pub fn openapi_json() -> String {
    let (_, doc) = api(None).split_for_parts();
    doc.to_pretty_json()
        .expect("the OpenAPI document serializes")
}

/// The same document in OpenAPI 3.0.3, for generators that read 3.0 only: as served at
/// `/openapi-3.0.json` and committed as `openapi/openapi-3.0.json`.
pub fn openapi_30_json() -> String {
    let (_, doc) = api(None).split_for_parts();
    rendition_30(&doc)
}

fn rendition_30(doc: &utoipa::openapi::OpenApi) -> String {
    let doc = serde_json::to_value(doc).expect("the OpenAPI document serializes");
    let doc = openapi30::downgrade(doc).unwrap_or_else(|e| panic!("no OpenAPI 3.0 rendition: {e}"));
    serde_json::to_string_pretty(&doc).expect("the OpenAPI 3.0 rendition serializes")
}

/// The application: routes, Swagger UI and the middleware stack.
pub fn router(state: AppState) -> Router {
    let timeout = state.request_timeout;
    let record = metrics::RecordLayer(Arc::clone(&state.http_metrics));
    let (routes, doc) = api(Some(&state)).split_for_parts();
    let trace = TraceLayer::new_for_http().make_span_with(|request: &Request| {
        let id = request
            .headers()
            .get(REQUEST_ID)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default();
        tracing::info_span!("request", method = %request.method(), path = %request.uri().path(), id)
    });
    let doc_30 = rendition_30(&doc);
    routes
        .route(
            OPENAPI_30_PATH,
            axum::routing::get(move || async move {
                ([(header::CONTENT_TYPE, "application/json")], doc_30)
            }),
        )
        .merge(SwaggerUi::new("/docs").url("/openapi.json", doc))
        // Every route, the documents and Swagger UI included; unknown paths get their 404.
        .route_layer(axum::middleware::from_fn_with_state(
            state.clone(),
            middleware::authorize,
        ))
        .fallback(middleware::not_found)
        .method_not_allowed_fallback(middleware::method_not_allowed)
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            middleware::guard_hosts,
        ))
        .with_state(state)
        // Innermost first: each `layer` call wraps everything above it.
        .layer(ServiceBuilder::new().layer(CatchPanicLayer::new()).layer(
            axum::middleware::from_fn_with_state(timeout, middleware::time_limit),
        ))
        .layer(axum::middleware::map_response(
            middleware::problem_for_errors,
        ))
        .layer(axum::middleware::from_fn(middleware::worded_for_reads))
        .layer(
            ServiceBuilder::new()
                .layer(SetRequestIdLayer::new(REQUEST_ID, MakeRequestUuid))
                .layer(trace)
                .layer(PropagateRequestIdLayer::new(REQUEST_ID)),
        )
        // Outermost, so every answer is counted as the client gets it.
        .layer(record)
}

#[cfg(test)]
mod tests {
    use super::timestamp;
    use proptest::prelude::*;
    use time::format_description::well_known::Rfc3339;

    fn reference(ms: i64) -> String {
        time::OffsetDateTime::from_unix_timestamp_nanos(i128::from(ms) * 1_000_000)
            .unwrap()
            .format(&Rfc3339)
            .unwrap()
    }

    #[test]
    fn timestamps_read_as_rfc_3339() {
        assert_eq!(timestamp(0), "1970-01-01T00:00:00Z");
        assert_eq!(timestamp(1_795_300_939_120), "2026-11-21T22:42:19.12Z");
        assert_eq!(timestamp(951_782_400_001), "2000-02-29T00:00:00.001Z");
        assert_eq!(timestamp(-1), reference(-1));
    }

    proptest! {
        #[test]
        fn timestamps_match_the_time_crate(ms in 0i64..253_402_300_800_000) {
            prop_assert_eq!(timestamp(ms), reference(ms));
        }
    }
}
