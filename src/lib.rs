//! keyspread: the authoritative registry of account -> Kinesis `ExplicitHashKey`.
//!
//! `main.rs` only boots; this crate exposes the pieces so tests run the real server.

pub mod cli;
pub mod config;
pub mod http;
pub mod kinesis;
/// The pure core (crates/keyspace), shared with the clients.
pub use ::keyspace;
pub mod metrics;
pub mod registry;
mod serve;
pub mod store;
pub mod telemetry;

use std::sync::Arc;
use std::time::Duration;

use crate::config::ServeConfig;
use crate::keyspace::Keyspace;
use crate::registry::Registry;
use crate::store::Store;

pub use http::router as app;
pub use serve::serve;

/// Everything a request handler needs.
#[derive(Clone)]
pub struct AppState {
    pub registry: Arc<Registry>,
    /// Who may change assignments and read metrics.
    pub access: Arc<Access>,
    pub request_timeout: Duration,
    /// `Cache-Control` of lookup answers.
    pub lookup_cache: config::LookupCache,
    /// Requests counted by route.
    pub http_metrics: Arc<http::HttpMetrics>,
    /// Limits on connections, applied by [`serve`].
    pub connections: ConnectionLimits,
    /// Where plans and distributions run: off the async workers, a few at once.
    pub heavy: http::HeavyWork,
    /// Idempotency-Keys whose first request is being made here.
    pub in_flight: http::InFlight,
    /// Where snapshots wait for their clients, a few at once.
    pub spools: http::Spools,
    /// Watched streams: the Kinesis client and the listings' counts.
    pub watch: Arc<registry::Watch>,
    /// Kinesis for reshard jobs, connected on first use.
    pub kinesis: Arc<kinesis::KinesisLink>,
}

/// Who may change assignments and read metrics (one `Arc` in [`AppState`], which every
/// request clones).
#[derive(Debug)]
pub struct Access {
    /// The tokens in force (`--token`, `--tokens-file`). Without any, only loopback clients
    /// may mutate, and only requests to this host's names from its own pages are served
    /// (`Host`, `Origin`); with them, those checks are off, since the tokens are the
    /// protection.
    pub credentials: Option<http::Credentials>,
    /// Whether reads need a token too.
    pub read_access: config::ReadAccess,
    /// Bearer token `GET /metrics` needs, if any.
    pub metrics_token: Option<config::Token>,
    /// Per-client rate limit of mutations, if any.
    pub mutation_limit: Option<http::MutationLimiter>,
    /// Per-host budget of refused credentials, if any: stricter than the mutation limit.
    pub credential_budget: Option<http::CredentialBudget>,
    /// Whether the limit applies to clients allowed to mutate too, not only to the others.
    pub limit_token_holders: bool,
    /// Without a token, the names requests may address and pages may come from.
    pub local_names: http::LocalNames,
    /// Proxies whose `X-Forwarded-For` names the client that the limit and the loopback
    /// rule apply to.
    pub trusted_proxies: http::TrustedProxies,
}

/// How long connections may dawdle, how many are served at once, and how long a stop waits
/// for them.
#[derive(Debug, Clone, Copy)]
pub struct ConnectionLimits {
    /// For a request's headers, and between requests on an idle connection.
    pub header_timeout: Duration,
    pub max_connections: usize,
    /// From the shutdown signal to dropping the connections still open.
    pub shutdown_timeout: Duration,
}

impl AppState {
    /// Connects to the database, runs migrations and rebuilds the tree from it.
    pub async fn open(config: &ServeConfig) -> Result<AppState, StartError> {
        let keyspace = Keyspace::new(config.keyspace_bits)?;
        let store = Store::connect(&config.database_url).await?;
        let registry = Registry::open(store, keyspace, config.primary_stream.clone()).await?;
        registry.set_lease_join_batch_ms(config.lease_join_batch_ms as i64);
        registry.set_load_config(config.load_config());
        // Other processes and replicas may write too: follow the event log.
        registry.follow();
        registry.forget_kept(std::time::Duration::from_secs(60));
        registry.retain(
            config.event_retention,
            std::time::Duration::from_secs(config.event_compaction_interval_s),
            config.controller.move_cooldown_s as i64 * 1000,
        );
        let lookup_cache = config::LookupCache::parse(config.lookup_cache_control.clone())
            .map_err(StartError::LookupCacheControl)?;
        let kinesis = Arc::new(kinesis::KinesisLink::new(config.kinesis_config()));
        registry.drive_reshards(
            Arc::clone(&kinesis),
            Duration::from_secs(config.reshard_lease_s),
        );
        registry.set_load_tolerance(config.controller.load_tolerance);
        let mut rebalance_after_ms = None;
        if config.controller.auto_rebalance {
            let mut controller = config.controller.clone();
            let lifetime_s = lookup_cache.lifetime().min(config::MAX_LIFETIME_S);
            let lifetime_ms = lifetime_s as i64 * 1000;
            rebalance_after_ms = Some(*controller.switch_after_ms.get_or_insert(lifetime_ms));
            registry.control(controller);
        }
        // One Kinesis client for the watch and the reshards: one connection pool, one look
        // at the credential chain.
        let watch = Arc::new(registry::Watch::new(
            Arc::clone(&kinesis),
            Duration::from_secs(config.stream_sync_interval_s),
            rebalance_after_ms,
        ));
        registry.sync_streams(Arc::clone(&watch));
        let credentials =
            http::Credentials::load(config.tokens_file.as_deref(), config.token.as_ref())?;
        if credentials.is_none() && config.read_access == config::ReadAccess::Token {
            return Err(StartError::ReadAccessWithoutTokens);
        }
        if let Some(credentials) = &credentials {
            let names = credentials.names();
            tracing::info!(tokens = names.len(), ?names, "tokens in force");
        }
        let access = Arc::new(Access {
            credentials,
            read_access: config.read_access,
            metrics_token: config.metrics_token.clone(),
            mutation_limit: http::MutationLimiter::new(config.mutation_rate, config.mutation_burst),
            credential_budget: http::CredentialBudget::new(
                config.auth_failures_per_minute,
                config.auth_failure_burst,
            ),
            limit_token_holders: config.limit_token_holders,
            local_names: http::LocalNames::new(config.allowed_hosts.clone()),
            trusted_proxies: http::TrustedProxies::new(config.trusted_proxies.clone()),
        });
        reload_tokens_on_hangup(&access);
        Ok(AppState {
            registry,
            access,
            request_timeout: config.request_timeout(),
            lookup_cache,
            http_metrics: Arc::new(http::HttpMetrics::for_routes()),
            connections: ConnectionLimits {
                header_timeout: config.header_timeout(),
                max_connections: config.max_connections as usize,
                shutdown_timeout: config.shutdown_timeout(),
            },
            heavy: http::HeavyWork::for_this_machine(),
            in_flight: http::InFlight::default(),
            spools: http::Spools::default(),
            watch,
            kinesis,
        })
    }
}

/// SIGHUP re-reads the tokens file: the new set is in force from the next request, and a
/// file that cannot be taken leaves the set in force, saying why. A server without a tokens
/// file takes SIGHUP too, and only says so: sent by habit, it must not end the process, as
/// SIGHUP's default action would.
fn reload_tokens_on_hangup(access: &Arc<Access>) {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let mut hangups = match signal(SignalKind::hangup()) {
            Ok(hangups) => hangups,
            Err(err) => {
                tracing::warn!(%err, "no SIGHUP handler: the tokens file is read at start-up only, and SIGHUP ends the server");
                return;
            }
        };
        let access = Arc::downgrade(access);
        tokio::spawn(async move {
            while hangups.recv().await.is_some() {
                let Some(access) = access.upgrade() else {
                    return;
                };
                let Some(credentials) = access.credentials.as_ref().filter(|c| c.file().is_some())
                else {
                    tracing::warn!(
                        "SIGHUP: this server has no tokens file (--tokens-file) to re-read; \
                         nothing changes"
                    );
                    continue;
                };
                match credentials.reload() {
                    Ok(count) => tracing::info!(
                        tokens = count,
                        names = ?credentials.names(),
                        "SIGHUP: tokens file re-read"
                    ),
                    Err(err) => tracing::error!("SIGHUP: {err}; the tokens in force stay"),
                }
            }
        });
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
    #[error("--lookup-cache-control: {0}")]
    LookupCacheControl(String),
    #[error(transparent)]
    Credentials(#[from] http::CredentialsError),
    #[error(
        "--read-access token (KEYSPREAD_READ_ACCESS) needs tokens to read with: set --token or \
         --tokens-file"
    )]
    ReadAccessWithoutTokens,
}
