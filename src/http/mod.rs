//! HTTP: routes, middleware, errors and the OpenAPI document.

mod error;
mod events;
mod extract;
mod health;
mod keys;
mod limit;
mod metrics;
mod middleware;
mod openapi;
mod rebalance;
mod shards;
mod streams;

use std::sync::Arc;

use axum::Router;
use axum::extract::Request;
use axum::http::{HeaderName, StatusCode};
use tower::ServiceBuilder;
use tower_http::catch_panic::CatchPanicLayer;
use tower_http::limit::RequestBodyLimitLayer;
use tower_http::request_id::{MakeRequestUuid, PropagateRequestIdLayer, SetRequestIdLayer};
use tower_http::timeout::TimeoutLayer;
use tower_http::trace::TraceLayer;
use utoipa::OpenApi as _;
use utoipa_axum::router::OpenApiRouter;
use utoipa_swagger_ui::SwaggerUi;

pub use error::{ApiError, PROBLEM_JSON, Problem};
pub use events::{EventBody, EventPage};
pub use keys::{Assignment, AssignmentPage};
pub use limit::MutationLimiter;
pub use metrics::HttpMetrics;
pub use shards::ShardOf;

use crate::AppState;

/// Largest request body accepted.
pub const BODY_LIMIT: usize = 64 * 1024;

/// Largest body `POST /keys/batch` accepts: 10,000 accounts of up to 256 bytes and more.
pub const BATCH_BODY_LIMIT: usize = 4 * 1024 * 1024;

const REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// Every documented route, with the document built from them.
fn api() -> OpenApiRouter<AppState> {
    // Bodies are refused with 413 from their length before they are read.
    let small = || RequestBodyLimitLayer::new(BODY_LIMIT);
    let mut api = OpenApiRouter::with_openapi(openapi::ApiDoc::openapi())
        .merge(keys::router().layer(small()))
        .merge(keys::batch_router().layer(RequestBodyLimitLayer::new(BATCH_BODY_LIMIT)))
        .merge(shards::router().layer(small()))
        .merge(rebalance::router().layer(small()))
        .merge(streams::router().layer(small()))
        .merge(health::router().layer(small()))
        .merge(metrics::router().layer(small()))
        .merge(events::router().layer(small()));
    openapi::optional_bodies(api.get_openapi_mut());
    openapi::rate_limited_mutations(api.get_openapi_mut());
    api
}

/// Paths the router serves besides the API's: the document and Swagger UI.
const DOC_PATHS: [&str; 4] = ["/openapi.json", "/docs", "/docs/", "/docs/{*rest}"];

impl HttpMetrics {
    /// Series for every route this service has.
    pub fn for_routes() -> HttpMetrics {
        let (_, doc) = api().split_for_parts();
        let api_paths = doc.paths.paths.into_keys();
        HttpMetrics::new(api_paths.chain(DOC_PATHS.map(String::from)))
    }
}

/// Unix milliseconds as RFC 3339.
fn timestamp(ms: i64) -> String {
    use time::format_description::well_known::Rfc3339;
    time::OffsetDateTime::from_unix_timestamp_nanos(i128::from(ms) * 1_000_000)
        .unwrap_or(time::OffsetDateTime::UNIX_EPOCH)
        .format(&Rfc3339)
        .unwrap_or_default()
}

/// The OpenAPI document, as served at `/openapi.json` and committed in `openapi/`.
pub fn openapi_json() -> String {
    let (_, doc) = api().split_for_parts();
    doc.to_pretty_json()
        .expect("the OpenAPI document serializes")
}

/// The application: routes, Swagger UI and the middleware stack.
pub fn router(state: AppState) -> Router {
    let timeout = state.request_timeout;
    let record = metrics::RecordLayer(Arc::clone(&state.http_metrics));
    let (routes, doc) = api()
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            middleware::guard_mutations,
        ))
        .split_for_parts();
    let trace = TraceLayer::new_for_http().make_span_with(|request: &Request| {
        let id = request
            .headers()
            .get(REQUEST_ID)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default();
        tracing::info_span!("request", method = %request.method(), path = %request.uri().path(), id)
    });
    routes
        .merge(SwaggerUi::new("/docs").url("/openapi.json", doc))
        .fallback(middleware::not_found)
        .method_not_allowed_fallback(middleware::method_not_allowed)
        .with_state(state)
        // Innermost first: each `layer` call wraps everything above it.
        .layer(ServiceBuilder::new().layer(CatchPanicLayer::new()).layer(
            TimeoutLayer::with_status_code(StatusCode::REQUEST_TIMEOUT, timeout),
        ))
        .layer(axum::middleware::map_response(
            middleware::problem_for_errors,
        ))
        .layer(
            ServiceBuilder::new()
                .layer(SetRequestIdLayer::new(REQUEST_ID, MakeRequestUuid))
                .layer(trace)
                .layer(PropagateRequestIdLayer::new(REQUEST_ID)),
        )
        // Outermost, so every answer is counted as the client gets it.
        .layer(record)
}
