//! `GET /metrics`, and the layer that counts every request by route template, method and
//! status. Series are laid out once at start-up, so recording a request is a read of a
//! fixed map and a few atomic adds: no lock, no allocation.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use axum::body::Body;
use axum::extract::{MatchedPath, Request, State};
use axum::http::{Method, Response, header};
use axum::response::IntoResponse;
use tower::{Layer, Service};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::Problem;
use crate::AppState;
use crate::metrics::{Counter, Histogram, escape, header as help_header};

/// The exposition format's media type.
pub const TEXT_FORMAT: &str = "text/plain; version=0.0.4; charset=utf-8";

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(metrics))
}

/// Prometheus metrics: requests, changes, the database, replica lag. When the server has a
/// metrics token, only requests that carry it.
#[utoipa::path(get, path = "/metrics", tag = "observability",
    responses((status = 200, description = "Metrics in the Prometheus text format 0.0.4", body = String,
               content_type = "text/plain; version=0.0.4"),
              (status = 401, description = "The server has a metrics token and the request did not carry it",
               body = Problem, content_type = "application/problem+json")))]
async fn metrics(State(state): State<AppState>) -> Response<Body> {
    // The metrics token is checked before, with every credential (`middleware::authorize`).
    let mut out = String::with_capacity(32 * 1024);
    state.http_metrics.render(&mut out);
    state.registry.render_metrics(&mut out).await;
    state.watch.render_metrics(&mut out);
    ([(header::CONTENT_TYPE, TEXT_FORMAT)], out).into_response()
}

const METHODS: [&str; 8] = [
    "GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "other",
];

fn method_slot(method: &Method) -> usize {
    match *method {
        Method::GET => 0,
        Method::HEAD => 1,
        Method::POST => 2,
        Method::PUT => 3,
        Method::PATCH => 4,
        Method::DELETE => 5,
        Method::OPTIONS => 6,
        _ => 7,
    }
}

/// Statuses counted on their own (sorted); any other is counted as "other".
const STATUSES: [u16; 27] = [
    200, 201, 204, 206, 301, 302, 304, 307, 308, 400, 401, 403, 404, 405, 406, 408, 409, 411, 413,
    414, 415, 422, 429, 431, 500, 503, 504,
];

fn status_slot(status: u16) -> usize {
    STATUSES.binary_search(&status).unwrap_or(STATUSES.len())
}

/// Label of requests whose path matched a route not laid out at start-up.
const OTHER_ROUTE: &str = "other";
/// Label of requests no route matched.
const UNMATCHED: &str = "unmatched";

/// One route and method: answers by status, and latency.
struct Series {
    statuses: [Counter; STATUSES.len() + 1],
    latency: Histogram,
}

struct RouteSeries {
    route: Box<str>,
    methods: [Series; METHODS.len()],
}

/// Request counts and latencies per route template and method.
pub struct HttpMetrics {
    index: HashMap<Box<str>, usize>,
    routes: Vec<RouteSeries>,
}

impl std::fmt::Debug for HttpMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpMetrics")
            .field("routes", &self.routes.len())
            .finish()
    }
}

impl HttpMetrics {
    /// Series for each of `templates` (such as `/keys/{account}`), plus "other" and
    /// "unmatched".
    pub fn new(templates: impl IntoIterator<Item = String>) -> HttpMetrics {
        let mut routes: Vec<String> = templates.into_iter().collect();
        routes.sort();
        routes.dedup();
        routes.push(OTHER_ROUTE.to_owned());
        routes.push(UNMATCHED.to_owned());
        let routes: Vec<RouteSeries> = routes
            .into_iter()
            .map(|route| RouteSeries {
                route: route.into_boxed_str(),
                methods: std::array::from_fn(|_| Series {
                    statuses: std::array::from_fn(|_| Counter::default()),
                    latency: Histogram::default(),
                }),
            })
            .collect();
        let index = routes
            .iter()
            .enumerate()
            .map(|(i, r)| (r.route.clone(), i))
            .collect();
        HttpMetrics { index, routes }
    }

    fn route_slot(&self, matched: Option<&MatchedPath>) -> usize {
        match matched {
            Some(path) => self
                .index
                .get(path.as_str())
                .copied()
                .unwrap_or(self.routes.len() - 2),
            None => self.routes.len() - 1,
        }
    }

    fn record(&self, route: usize, method: usize, status: u16, started: Instant) {
        let series = &self.routes[route].methods[method];
        series.statuses[status_slot(status)].add(1);
        series.latency.observe(started.elapsed());
    }

    /// Appends every series that has seen a request.
    pub fn render(&self, out: &mut String) {
        use std::fmt::Write as _;
        let requests = "keyspread_http_requests_total";
        help_header(
            out,
            requests,
            "counter",
            "HTTP requests answered, by route template, method and status.",
        );
        for (labels, series) in self.series() {
            for (i, counter) in series.statuses.iter().enumerate() {
                let n = counter.get();
                if n > 0 {
                    let status = STATUSES
                        .get(i)
                        .map_or_else(|| "other".to_owned(), u16::to_string);
                    let _ = writeln!(out, "{requests}{{{labels},status=\"{status}\"}} {n}");
                }
            }
        }
        let latency = "keyspread_http_request_duration_seconds";
        help_header(
            out,
            latency,
            "histogram",
            "Time to answer HTTP requests (up to the response head), by route template and method.",
        );
        for (labels, series) in self.series() {
            series.latency.render(out, latency, &labels);
        }
    }

    /// Labels and series of every route and method with at least one request.
    fn series(&self) -> impl Iterator<Item = (String, &Series)> {
        self.routes.iter().flat_map(|r| {
            r.methods
                .iter()
                .zip(METHODS)
                .filter(|(s, _)| s.latency.count() > 0)
                .map(|(s, method)| {
                    let labels = format!("route=\"{}\",method=\"{method}\"", escape(&r.route));
                    (labels, s)
                })
        })
    }
}

/// Counts the requests of the service it wraps into an [`HttpMetrics`].
#[derive(Clone)]
pub struct RecordLayer(pub Arc<HttpMetrics>);

impl<S> Layer<S> for RecordLayer {
    type Service = Record<S>;

    fn layer(&self, inner: S) -> Record<S> {
        Record {
            inner,
            metrics: Arc::clone(&self.0),
        }
    }
}

#[derive(Clone)]
pub struct Record<S> {
    inner: S,
    metrics: Arc<HttpMetrics>,
}

impl<S, B> Service<Request> for Record<S>
where
    S: Service<Request, Response = Response<B>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Recorded<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request) -> Self::Future {
        let route = self
            .metrics
            .route_slot(request.extensions().get::<MatchedPath>());
        let method = method_slot(request.method());
        let started = Instant::now();
        Recorded {
            inner: self.inner.call(request),
            metrics: Arc::clone(&self.metrics),
            route,
            method,
            started,
        }
    }
}

pin_project_lite::pin_project! {
    /// A response on its way, recorded when it is ready.
    pub struct Recorded<F> {
        #[pin]
        inner: F,
        metrics: Arc<HttpMetrics>,
        route: usize,
        method: usize,
        started: Instant,
    }
}

impl<F, B, E> Future for Recorded<F>
where
    F: Future<Output = Result<Response<B>, E>>,
{
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = self.project();
        let output = std::task::ready!(this.inner.poll(cx));
        let status = output.as_ref().map_or(500, |r| r.status().as_u16());
        this.metrics
            .record(*this.route, *this.method, status, *this.started);
        Poll::Ready(output)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_are_sorted_for_the_search() {
        assert!(STATUSES.windows(2).all(|w| w[0] < w[1]));
        assert_eq!(status_slot(200), 0);
        assert_eq!(status_slot(418), STATUSES.len());
    }
}
