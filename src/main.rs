//! The `keyspread` binary: parse configuration, start telemetry, serve.

use std::process::ExitCode;

use std::path::PathBuf;

use clap::{Parser, Subcommand};
use keyspread::config::{ServeConfig, Token, redact_url};
use keyspread::keyspace::Keyspace;
use keyspread::store::Store;
use keyspread::{AppState, cli, http, serve, telemetry};

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
    /// Create or upgrade the database schema, then exit (`serve` also does this).
    Migrate {
        /// `sqlite://PATH` or `postgres://...`.
        #[arg(
            long,
            env = "DATABASE_URL",
            default_value = "sqlite://keyspread.db",
            hide_env_values = true
        )]
        database_url: String,
    },
    /// Print the OpenAPI document.
    Openapi,
    /// Compare MD5 of account names with keyspread's keys over a uniform map.
    Simulate {
        /// Accounts, named "1".."N" as in the seed example.
        #[arg(long)]
        accounts: u64,
        /// Shards of the uniform map.
        #[arg(long)]
        shards: u64,
    },
    /// Manage the streams a running keyspread knows.
    #[command(subcommand)]
    Streams(StreamsCommand),
}

#[derive(Debug, Subcommand)]
enum StreamsCommand {
    /// Register a stream's map from `aws kinesis list-shards --stream-name NAME` output.
    Put {
        /// The stream name.
        name: String,
        /// The list-shards JSON file.
        #[arg(long = "from")]
        file: PathBuf,
        /// Balance new keys on this stream's shards.
        #[arg(long)]
        primary: bool,
        /// The keyspread to talk to.
        #[arg(long, env = "KEYSPREAD_URL", default_value = "http://127.0.0.1:8080")]
        url: String,
        /// Bearer token, if the server has one.
        #[arg(long, env = "KEYSPREAD_TOKEN", hide_env_values = true)]
        token: Option<Token>,
    },
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
        Command::Migrate { database_url } => report(
            Store::connect(&database_url)
                .await
                .map(|_| format!("{} is up to date\n", redact_url(&database_url)))
                .map_err(|e| e.to_string()),
        ),
        Command::Openapi => {
            println!("{}", http::openapi_json());
            ExitCode::SUCCESS
        }
        Command::Simulate { accounts, shards } => {
            report(cli::simulate(accounts, shards, Keyspace::KINESIS).map_err(|e| e.to_string()))
        }
        Command::Streams(StreamsCommand::Put {
            name,
            file,
            primary,
            url,
            token,
        }) => report(cli::put_stream(&url, token.as_ref(), &name, &file, primary).await),
    }
}

/// Prints a subcommand's output, or its error on stderr.
fn report(result: Result<String, String>) -> ExitCode {
    match result {
        Ok(out) => {
            print!("{out}");
            ExitCode::SUCCESS
        }
        Err(err) => {
            eprintln!("keyspread: {err}");
            ExitCode::FAILURE
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
