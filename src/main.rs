//! The `keyspread` binary: parse configuration, start telemetry, serve.

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use keyspread::config::{ServeConfig, redact_url};
use keyspread::{AppState, http, serve, telemetry};

/// The authoritative registry of account -> Kinesis ExplicitHashKey.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the HTTP service.
    Serve(ServeConfig),
    /// Print the OpenAPI document.
    Openapi,
}

#[tokio::main]
async fn main() -> ExitCode {
    match Cli::parse().command {
        Command::Serve(config) => {
            telemetry::init();
            match run(config).await {
                Ok(()) => ExitCode::SUCCESS,
                Err(err) => {
                    tracing::error!("{err}");
                    ExitCode::FAILURE
                }
            }
        }
        Command::Openapi => {
            println!("{}", http::openapi_json());
            ExitCode::SUCCESS
        }
    }
}

async fn run(config: ServeConfig) -> Result<(), Box<dyn std::error::Error>> {
    tracing::info!(
        listen = %config.listen,
        database = %redact_url(&config.database_url),
        keyspace_bits = config.keyspace_bits,
        token = config.token.is_some(),
        "starting keyspread"
    );
    if config.token.is_none() && !config.listen.ip().is_loopback() {
        tracing::warn!("no KEYSPREAD_TOKEN: only clients on this host may change assignments");
    }
    let state = AppState::open(&config).await?;
    let listener = tokio::net::TcpListener::bind(config.listen).await?;
    tracing::info!(addr = %listener.local_addr()?, "listening");
    serve(listener, state, shutdown_signal()).await?;
    tracing::info!("stopped");
    Ok(())
}

/// Resolves on SIGINT or SIGTERM.
async fn shutdown_signal() {
    let ctrl_c = async {
        tokio::signal::ctrl_c()
            .await
            .expect("install SIGINT handler");
    };
    #[cfg(unix)]
    let terminate = async {
        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .expect("install SIGTERM handler")
            .recv()
            .await;
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {},
        () = terminate => {},
    }
    tracing::info!("shutdown signal received, draining requests");
}
