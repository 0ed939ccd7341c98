//! keyspread: the authoritative registry of account -> Kinesis `ExplicitHashKey`.
//!
//! `main.rs` only boots; this crate exposes the pieces so tests run the real server.

pub mod cli;
pub mod config;
pub mod http;
pub mod keyspace;
pub mod metrics;
pub mod registry;
pub mod store;
pub mod telemetry;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;

use crate::config::{ServeConfig, Token};
use crate::keyspace::Keyspace;
use crate::registry::Registry;
use crate::store::Store;

pub use http::router as app;

/// Everything a request handler needs.
#[derive(Clone)]
pub struct AppState {
    pub registry: Arc<Registry>,
    pub token: Option<Arc<Token>>,
    pub request_timeout: Duration,
    /// `Cache-Control` of lookup answers.
    pub lookup_cache_control: axum::http::HeaderValue,
    /// Requests counted by route.
    pub http_metrics: Arc<http::HttpMetrics>,
    /// Per-client rate limit of mutations, if any.
    pub mutation_limit: Option<Arc<http::MutationLimiter>>,
}

impl AppState {
    /// Connects to the database, runs migrations and rebuilds the tree from it.
    pub async fn open(config: &ServeConfig) -> Result<AppState, StartError> {
        let keyspace = Keyspace::new(config.keyspace_bits)?;
        let store = Store::connect(&config.database_url).await?;
        let registry = Registry::open(store, keyspace, config.primary_stream.clone()).await?;
        // Other processes and replicas may write too: follow the event log.
        registry.follow();
        Ok(AppState {
            registry,
            token: config.token.clone().map(Arc::new),
            request_timeout: config.request_timeout(),
            lookup_cache_control: config.lookup_cache_control.clone(),
            http_metrics: Arc::new(http::HttpMetrics::for_routes()),
            mutation_limit: http::MutationLimiter::new(config.mutation_rate, config.mutation_burst)
                .map(Arc::new),
        })
    }
}

/// Why the service could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(transparent)]
    Keyspace(#[from] keyspace::Error),
    #[error(transparent)]
    Store(#[from] store::StoreError),
    #[error(transparent)]
    Registry(#[from] registry::Error),
}

/// Serves `state` on `listener` until `shutdown` resolves, then drains in-flight requests.
pub async fn serve(
    listener: TcpListener,
    state: AppState,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let app = app(state).into_make_service_with_connect_info::<SocketAddr>();
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown)
        .await
}
