//! `GET /ui`: the operator's page, one self-contained HTML document rendered on the server
//! from the very calls the JSON routes answer with, so its numbers are theirs.

mod accounts;
mod band;
mod bars;
mod cards;
mod html;
mod load;
mod render;
mod style;
mod tables;

use std::sync::Arc;
use std::time::Instant;

use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use serde::Deserialize;
use utoipa::IntoParams;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::error::ApiError;
use super::keys::Assignment;
use super::leases::LeasesBody;
use super::rebalance::MovesPage;
use super::shards::{Distribution, MapParams};
use crate::AppState;
use crate::keyspace::ShardMap;
use crate::registry::{MapSpec, Stream, now_ms};

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(operator_page))
        .routes(routes!(to_operator_page))
}

/// Shards of the uniform map shown when no stream is named and none is primary.
pub const DEFAULT_SHARDS: u64 = 4;
/// Heaviest accounts listed.
const TOP_ACCOUNTS: usize = 10;
/// Pending moves listed: the first page of `GET /moves` of this size.
const MOVES_SHOWN: u32 = 10;
/// Registered streams linked from the page.
const STREAMS_LINKED: usize = 30;

/// Scripts, fonts, images and frames: none, from anywhere. The page needs only its own
/// inline style, and an injected tag could not load or run anything.
const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; style-src 'unsafe-inline'; \
     form-action 'self'; frame-ancestors 'none'; base-uri 'none'";

/// Which map the page shows.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct PageParams {
    /// A registered stream (default: the primary stream, else a uniform map).
    #[param(pattern = r"^[a-zA-Z0-9_.-]{1,128}$")]
    pub stream: Option<String>,
    /// Shards of a uniform map to show instead of a stream, 1..=10000.
    #[param(minimum = 1, maximum = 10000)]
    pub shards: Option<u64>,
    /// Load the page again every this many seconds, 5..=3600 (default: never).
    #[param(minimum = 5, maximum = 3600)]
    pub refresh: Option<u32>,
}

/// Everything the page shows, each part as its JSON route answers it.
struct View {
    /// Unix milliseconds, when the page was made.
    now: i64,
    refresh: Option<u32>,
    /// The stream shown, or `None` for a uniform map.
    stream: Option<Stream>,
    map: Arc<ShardMap>,
    /// Registered streams by name, and whether more follow.
    streams: (Vec<Stream>, bool),
    /// `GET /distribution` of the map.
    distribution: Distribution,
    /// Accounts holding keys, and keys still to switch (`keyspread_accounts` and
    /// `keyspread_switching_keys` in `GET /metrics`).
    accounts: usize,
    switching: usize,
    /// `GET /keys/{account}` of the heaviest accounts, heaviest first.
    heaviest: Vec<Assignment>,
    /// `GET /moves`, the first page.
    moves: MovesPage,
    /// `GET /streams/{name}/leases`, for a stream.
    leases: Option<LeasesBody>,
    /// `GET /load?stream={name}&order=load`, its heaviest accounts, for a stream.
    load: Option<crate::http::load::LoadPage>,
    /// `--hot-account-share`: an account above this load is hot.
    hot_share: f64,
}

/// The operator's page, in HTML.
///
/// The keyspace and its shards coloured by load; keys and weight per shard beside what MD5
/// of the account names would give, and on a stream its observed utilisation; the heaviest
/// accounts; the hot accounts with their suggested fanout; pending moves; and workers with
/// their leases. Every figure is the JSON routes' own.
#[utoipa::path(
    get, path = "/ui", tag = "page",
    params(PageParams),
    responses(
        (status = 200, description = "The page: HTML with its style inline, no script, no external resource", body = String, content_type = "text/html"),
        (status = 400, description = "Both stream and shards, or a bad shard count or refresh: a page saying so", body = String, content_type = "text/html"),
        (status = 404, description = "No such stream: a page saying so", body = String, content_type = "text/html"),
    )
)]
async fn operator_page(
    State(state): State<AppState>,
    params: Result<Query<PageParams>, QueryRejection>,
) -> Response {
    let started = Instant::now();
    let made = match params {
        Ok(Query(params)) => view(&state, params).await,
        Err(rejected) => Err(ApiError::bad_request(rejected.body_text())),
    };
    let (status, body) = match made {
        Ok(body) => (StatusCode::OK, body),
        Err(err) => (err.status(), render::error_page(&err)),
    };
    let mut response = (status, body).into_response();
    let headers = response.headers_mut();
    let fixed = [
        (header::CONTENT_TYPE, "text/html; charset=utf-8"),
        (header::CACHE_CONTROL, "no-store"),
        (header::CONTENT_SECURITY_POLICY, CONTENT_SECURITY_POLICY),
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        (header::REFERRER_POLICY, "no-referrer"),
    ];
    for (name, value) in fixed {
        headers.insert(name, HeaderValue::from_static(value));
    }
    // How long the server took, for benchmarks and browsers' developer tools.
    let took = format!("render;dur={:.1}", started.elapsed().as_secs_f64() * 1000.0);
    if let Ok(took) = HeaderValue::from_str(&took) {
        headers.insert("server-timing", took);
    }
    response
}

/// Where the operator's page is: `/ui`.
#[utoipa::path(
    get, path = "/", tag = "page",
    responses((status = 303, description = "The page is at /ui",
               headers(("location" = String, description = "/ui"))))
)]
async fn to_operator_page() -> Redirect {
    Redirect::to("/ui")
}

/// Gathers the page's parts from the routes' own calls, and renders it on a heavy-work
/// thread (the MD5 comparison hashes every account name).
async fn view(state: &AppState, params: PageParams) -> Result<String, ApiError> {
    if let Some(seconds) = params.refresh.filter(|s| !(5..=3600).contains(s)) {
        return Err(ApiError::bad_request(format!(
            "refresh must be between 5 and 3600 seconds, got {seconds}"
        )));
    }
    let spec = match (params.shards, params.stream) {
        (None, None) => match state.registry.primary_stream() {
            Some(primary) => MapSpec::Stream(primary.name),
            None => MapSpec::Uniform(DEFAULT_SHARDS),
        },
        (shards, stream) => MapParams { shards, stream }.spec()?,
    };
    let map = state.registry.resolve(&spec)?;
    let (stream, leases, load) = match &spec {
        MapSpec::Stream(name) => (
            state.registry.stream(name),
            Some(super::leases::assignment(state, name).await?),
            Some(load::of_stream(state, name).await?),
        ),
        MapSpec::Uniform(_) => (None, None, None),
    };
    let hot_share = state.registry.load_config().hot_account_share;
    let moves = super::rebalance::moves_page(state, 0, MOVES_SHOWN).await?;
    let streams = state.registry.streams(None, STREAMS_LINKED);
    let refresh = params.refresh;
    let registry = Arc::clone(&state.registry);
    state
        .heavy
        .run(move || {
            let distribution = super::shards::distribution_of(&registry, &map);
            let now = now_ms();
            let heaviest = registry.heaviest(TOP_ACCOUNTS);
            let view = View {
                now,
                refresh,
                stream,
                map,
                streams,
                distribution,
                accounts: registry.len(),
                switching: registry.switching_keys(now),
                heaviest: heaviest
                    .into_iter()
                    .map(|a| Assignment::at(a, now))
                    .collect(),
                moves,
                leases,
                load,
                hot_share,
            };
            Ok(render::page(&view))
        })
        .await
}
