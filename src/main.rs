//! The `keyspread` binary: parse configuration, start telemetry, serve.

use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use keyspread::config::{ServeConfig, Token, TokenParser, redact_url};
use keyspread::keyspace::Keyspace;
use keyspread::registry::Registry;
use keyspread::store::Store;
use keyspread::{AppState, cli, http, serve, telemetry};

/// Requests allocate and free small buffers at a high rate from one or two threads;
/// mimalloc's thread-local free lists do that in a fraction of glibc malloc's time.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// The authoritative registry of account -> Kinesis ExplicitHashKey.
#[derive(Parser)]
#[command(version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

// Parsed once at start-up: the size of its largest variant costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand)]
enum Command {
    /// Run the HTTP service.
    Serve(ServeConfig),
    /// Tokens for --tokens-file.
    #[command(subcommand)]
    Token(TokenCommand),
    /// Create or upgrade the database schema, then exit (`serve` also does this).
    Migrate(DatabaseArgs),
    /// Move a table into keyspread: a CSV of account,weight[,hash_key[,fanout]] rows (rows
    /// that bring a hash key keep it, as key 0 of their fanout; the others get keys from
    /// the walk), or a snapshot `keyspread export` wrote.
    ///
    /// A snapshot comes back whole: every key of every account by index, and every pending
    /// switch with its next keys and its time (a switch whose time has passed is simply the
    /// new keys). Every line is checked before anything is written; nothing is written if
    /// one is refused (a malformed line, a key outside the keyspace, a key two accounts
    /// share). Into a database that already holds accounts it goes only if nothing
    /// conflicts: an account already there must hold exactly the keys, weight and switch
    /// the file gives it (it is left as it is), and no key of the file may be held by
    /// another account. Each write is logged, so running servers, their replicas and
    /// producers' mirrors see the accounts at once. A snapshot's created_at is kept; a CSV
    /// row's account is created at the time of the import.
    Import {
        /// The CSV file, or the snapshot file.
        file: PathBuf,
        #[command(flatten)]
        database: DatabaseArgs,
        /// Width of the keyspace in bits (as the server runs with).
        #[arg(long, env = "KEYSPREAD_KEYSPACE_BITS", default_value_t = 128,
              value_parser = clap::value_parser!(u32).range(1..=128))]
        keyspace_bits: u32,
    },
    /// Write the whole table as a snapshot (NDJSON: a head line, then one assignment a line,
    /// exactly as `GET /snapshot` answers it), from a running server (--from) or straight
    /// from its database (--database-url), as of one event. The backup `keyspread import`
    /// takes back with every key and every pending switch.
    Export {
        /// The running keyspread to read (`http://HOST:PORT`); without it the database is
        /// read directly.
        #[arg(long, env = "KEYSPREAD_EXPORT_FROM")]
        from: Option<String>,
        /// Bearer token, if the server's reads need one.
        #[arg(long, env = "KEYSPREAD_TOKEN", hide_env_values = true, value_parser = TokenParser)]
        token: Option<Token>,
        #[command(flatten)]
        database: DatabaseArgs,
        /// Read from the database: the lookups' `Cache-Control` the server runs with, whose
        /// lifetime the head's `max_age_s` gives (as `serve` takes it).
        #[arg(
            long,
            env = "KEYSPREAD_LOOKUP_CACHE_CONTROL",
            default_value = "max-age=60"
        )]
        lookup_cache_control: String,
        /// Where to write it; standard output if not given or `-`. A regular file (or a new
        /// one) appears only once the whole snapshot is in it, written beside and renamed
        /// over; a device or a FIFO is written where it is, never replaced.
        #[arg(long, short, env = "KEYSPREAD_EXPORT_OUTPUT")]
        output: Option<PathBuf>,
    },
    /// Print the OpenAPI document.
    Openapi {
        /// OpenAPI version: 3.1 (the document), or 3.0 (its 3.0.3 rendition, for
        /// generators that read 3.0 only).
        #[arg(long, value_enum, default_value_t = OpenapiVersion::V31)]
        version: OpenapiVersion,
    },
    /// Compare MD5 of account names with keyspread's keys over a uniform map.
    #[command(subcommand_negates_reqs = true, args_conflicts_with_subcommands = true)]
    Simulate {
        #[command(subcommand)]
        what: Option<SimulateCommand>,
        /// Accounts, named "1".."N"; with --fanout, the accounts whose load is compared
        /// (default 100).
        #[arg(long, required_unless_present = "fanout")]
        accounts: Option<u64>,
        /// Shards of the uniform map.
        #[arg(long, required = true)]
        shards: Option<u64>,
        /// Keys per account: compare MD5 of "account#0".."account#{K-1}" with keyspread's
        /// placement of an account's K keys.
        #[arg(long, value_parser = clap::value_parser!(u32).range(1..=1024))]
        fanout: Option<u32>,
        /// With --fanout, accounts tried for the share on distinct shards.
        #[arg(long, default_value_t = 10_000, requires = "fanout",
              value_parser = clap::value_parser!(u64).range(1..))]
        trials: u64,
    },
    /// Manage the streams a running keyspread knows.
    #[command(subcommand)]
    Streams(StreamsCommand),
}

/// Which OpenAPI version `openapi` prints.
#[derive(Clone, Copy, clap::ValueEnum)]
enum OpenapiVersion {
    #[value(name = "3.1")]
    V31,
    #[value(name = "3.0")]
    V30,
}

/// What else `simulate` compares.
#[derive(Subcommand)]
enum SimulateCommand {
    /// Shard leases over consumer workers: a hash ring, a KCL-style lease taker and keyspread,
    /// after a cold start and when one worker joins or leaves.
    Leases {
        /// Shards of the stream.
        #[arg(long, value_parser = clap::value_parser!(u64).range(1..=4096))]
        shards: u64,
        /// Workers at the start (one more joins, one leaves).
        #[arg(long, value_parser = clap::value_parser!(u64).range(2..=1000))]
        workers: u64,
        /// Streams tried (the ring hashes the stream's name; the taker's choices are random).
        #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u64).range(1..=1000))]
        trials: u64,
    },
    /// The closed loop at scale: accounts whose load follows a Zipf law, the hot ones
    /// changing every few rounds, over three schemes side by side: MD5 of the account names
    /// (Kinesis's default), keyspread's placement without the loop (never moves), and
    /// keyspread with the loop under the server's controller rules (each round: a plan by
    /// load, then fanout raised for hot accounts). Prints the busiest shard over the mean per
    /// round and a summary. Deterministic for a given --seed.
    Load(cli::LoadSimulation),
}

/// The database a subcommand works on directly. Not `Debug`: the URL may hold a password.
#[derive(clap::Args)]
struct DatabaseArgs {
    /// `sqlite://PATH` or `postgres://...`.
    #[arg(
        long,
        env = "DATABASE_URL",
        default_value = "sqlite://keyspread.db",
        hide_env_values = true
    )]
    database_url: String,
}

#[derive(Subcommand)]
enum TokenCommand {
    /// Draw a fresh token (256 random bits): prints the token once, on stdout, and on
    /// stderr the line to add to the tokens file (its digest, never the token). Send SIGHUP
    /// to the server after adding it.
    New {
        /// What the event log will call changes made with it: letters, digits, '-', '_',
        /// '.', '@' (the fleet or the person, e.g. `producers` or `ana@ops`).
        #[arg(long, value_parser = name_of_token)]
        name: String,
        /// read, produce, consume or admin; several joined by commas (`produce,consume`).
        #[arg(long, value_parser = roles_of_token)]
        role: keyspread::config::Roles,
    },
}

fn name_of_token(name: &str) -> Result<String, String> {
    keyspread::config::check_name(name)
}

fn roles_of_token(roles: &str) -> Result<keyspread::config::Roles, String> {
    keyspread::config::parse_roles(roles)
}

#[derive(Subcommand)]
enum StreamsCommand {
    /// Register a stream's map from `aws kinesis list-shards --stream-name NAME` output, or
    /// from any other body `PUT /streams/{name}` takes (`{"shard_count": 4}`).
    Put {
        /// The stream name.
        name: String,
        /// The JSON file: list-shards output, or `{"shard_count": N}`.
        #[arg(long = "from")]
        file: PathBuf,
        /// Balance new keys on this stream's shards.
        #[arg(long)]
        primary: bool,
        /// The keyspread to talk to.
        #[arg(long, env = "KEYSPREAD_URL", default_value = "http://127.0.0.1:8080")]
        url: String,
        /// Bearer token, if the server has one.
        #[arg(long, env = "KEYSPREAD_TOKEN", hide_env_values = true, value_parser = TokenParser)]
        token: Option<Token>,
    },
    /// Reshard a watched stream to a number of open shards cut where the accounts are:
    /// the server splits and merges its shards one call at a time, then registers its map
    /// and, on the primary stream, applies the rebalance (staged). Follows the job with a
    /// progress bar until it ends; exits non-zero if it is refused or fails. Interrupting
    /// this stops the following only: the job goes on (GET /streams/NAME/reshard).
    Reshard {
        /// The stream name.
        name: String,
        /// Open shards wanted, 1..=10000.
        #[arg(long, value_parser = clap::value_parser!(u64).range(1..=10_000))]
        target: u64,
        /// Seconds after the end until producers switch to the rebalance's keys (default:
        /// the server's lookup max-age).
        #[arg(long, value_parser = clap::value_parser!(u64).range(0..=86_400))]
        switch_after_s: Option<u64>,
        /// The keyspread to talk to.
        #[arg(long, env = "KEYSPREAD_URL", default_value = "http://127.0.0.1:8080")]
        url: String,
        /// Bearer token (admin role).
        #[arg(long, env = "KEYSPREAD_TOKEN", hide_env_values = true, value_parser = TokenParser)]
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
        Command::Token(TokenCommand::New { name, role }) => match cli::new_token() {
            Ok(token) => {
                print_err_line(&format!(
                    "# the line for the tokens file (the token is printed once, on stdout):\n{}",
                    keyspread::config::tokens_file_line(&name, role, &token)
                ));
                print_out(&format!("{token}\n"))
            }
            Err(err) => {
                print_err(&err);
                ExitCode::FAILURE
            }
        },
        Command::Migrate(DatabaseArgs { database_url }) => report(
            Store::connect(&database_url)
                .await
                .map(|_| format!("{} is up to date\n", redact_url(&database_url)))
                .map_err(|e| e.to_string()),
        ),
        Command::Import {
            file,
            database: DatabaseArgs { database_url },
            keyspace_bits,
        } => report(import(&file, &database_url, keyspace_bits).await),
        Command::Export {
            from,
            token,
            database: DatabaseArgs { database_url },
            lookup_cache_control,
            output,
        } => {
            let source = match from {
                Some(url) => Source::Server(url, token),
                None => Source::Database(database_url, lookup_cache_control),
            };
            report(export(source, output.as_deref()).await)
        }
        Command::Openapi { version } => print_out(&format!(
            "{}\n",
            match version {
                OpenapiVersion::V31 => http::openapi_json(),
                OpenapiVersion::V30 => http::openapi_30_json(),
            }
        )),
        Command::Simulate {
            what:
                Some(SimulateCommand::Leases {
                    shards,
                    workers,
                    trials,
                }),
            ..
        } => report(
            cli::simulate_leases(shards, workers as usize, trials).map_err(|e| e.to_string()),
        ),
        Command::Simulate {
            what: Some(SimulateCommand::Load(sim)),
            ..
        } => {
            let rounds = sim.rounds;
            let started = std::time::Instant::now();
            let mut progress = |round: u32| {
                if (round + 1).is_multiple_of(10) || round + 1 == rounds {
                    eprintln!(
                        "round {}/{rounds} done ({:.1} s)",
                        round + 1,
                        started.elapsed().as_secs_f64()
                    );
                }
            };
            report(cli::simulate_load(sim, &mut progress).map_err(|e| e.to_string()))
        }
        Command::Simulate {
            what: None,
            accounts,
            shards,
            fanout,
            trials,
        } => report(
            match (fanout, accounts, shards.expect("clap requires --shards")) {
                (Some(fanout), accounts, shards) => cli::simulate_fanout(
                    fanout,
                    shards,
                    accounts.unwrap_or(100),
                    trials,
                    Keyspace::KINESIS,
                ),
                (None, Some(accounts), shards) => {
                    cli::simulate(accounts, shards, Keyspace::KINESIS)
                }
                (None, None, _) => unreachable!("clap requires --accounts without --fanout"),
            }
            .map_err(|e| e.to_string()),
        ),
        Command::Streams(StreamsCommand::Put {
            name,
            file,
            primary,
            url,
            token,
        }) => report(cli::put_stream(&url, token.as_ref(), &name, &file, primary).await),
        Command::Streams(StreamsCommand::Reshard {
            name,
            target,
            switch_after_s,
            url,
            token,
        }) => report(reshard(&url, token.as_ref(), &name, target, switch_after_s).await),
    }
}

/// Runs `keyspread streams reshard`, showing the job's progress on stderr: one line
/// redrawn on a terminal, a line per change otherwise.
async fn reshard(
    url: &str,
    token: Option<&Token>,
    name: &str,
    target: u64,
    switch_after_s: Option<u64>,
) -> Result<String, String> {
    use std::io::IsTerminal;
    let terminal = std::io::stderr().is_terminal();
    let show = |progress: &cli::JobProgress| {
        let line = format!("reshard {name}: {}", progress.bar());
        if terminal {
            let _ = write!(std::io::stderr(), "\r{line}   ");
        } else {
            print_err_line(&line);
        }
    };
    let done = cli::reshard(url, token, name, target, switch_after_s, show).await;
    if terminal {
        let _ = writeln!(std::io::stderr());
    }
    done
}

/// Where `keyspread export` reads the table.
enum Source {
    /// A running server's URL, and its token.
    Server(String, Option<Token>),
    /// A database URL, and the lookups' `Cache-Control` the server runs with.
    Database(String, String),
}

/// Runs `keyspread export` to `output` (see `cli::export_to`).
async fn export(source: Source, output: Option<&std::path::Path>) -> Result<String, String> {
    let run = async |out: &mut dyn Write| match &source {
        Source::Server(url, token) => cli::export_server(url, token.as_ref(), out).await,
        Source::Database(url, cache_control) => {
            let header = axum::http::HeaderValue::from_str(cache_control)
                .map_err(|_| "--lookup-cache-control: not visible ASCII".to_owned())?;
            let cache = keyspread::config::LookupCache::parse(header)
                .map_err(|e| format!("--lookup-cache-control: {e}"))?;
            cli::export_database(url, cache.lifetime(), out).await
        }
    };
    let (done, to) = cli::export_to(output, run).await?;
    Ok(exported(&done, &to))
}

/// What `keyspread export` says it did (on stderr: its output may be the snapshot).
fn exported(done: &cli::Exported, to: &str) -> String {
    print_err_line(&format!(
        "exported {} accounts as of event {} ({} bytes) to {to}",
        done.accounts, done.event_id, done.bytes
    ));
    String::new()
}

/// Runs `keyspread import`, showing progress on stderr.
async fn import(file: &std::path::Path, database_url: &str, bits: u32) -> Result<String, String> {
    use std::io::IsTerminal;
    let started = std::time::Instant::now();
    let bytes = std::fs::read(file).map_err(|e| format!("cannot read {}: {e}", file.display()))?;
    // Refused before the database is opened: a mistyped SQLite path is not created.
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Err(format!(
            "{} is empty: nothing to import (a CSV of account,weight[,hash_key[,fanout]] rows, \
             or a snapshot keyspread export wrote)",
            file.display()
        ));
    }
    let total = bytecount_lines(&bytes);
    drop(bytes);
    let keyspace = Keyspace::new(bits).map_err(|e| e.to_string())?;
    let store = Store::connect(database_url)
        .await
        .map_err(|e| e.to_string())?;
    let registry = Registry::open(store, keyspace, None)
        .await
        .map_err(|e| e.to_string())?;
    let terminal = std::io::stderr().is_terminal();
    let mut shown = 0;
    let mut progress = |rows: u64, total: u64, what: &str| {
        let rate = rows as f64 / started.elapsed().as_secs_f64().max(1e-3);
        let line = format!(
            "imported {rows}/{total} {what} ({:.0}%), {rate:.0} {what}/s",
            100.0 * rows as f64 / total.max(1) as f64
        );
        if terminal {
            let _ = write!(std::io::stderr(), "\r{line}   ");
        } else if rows >= shown + 100_000 || rows >= total {
            let _ = writeln!(std::io::stderr(), "{line}");
            shown = rows;
        }
    };
    let open = || std::fs::File::open(file).map(std::io::BufReader::new);
    let mut first = String::new();
    let _ = std::io::BufRead::read_line(&mut open().map_err(|e| e.to_string())?, &mut first);
    if cli::is_snapshot(&first) {
        let accounts = total.saturating_sub(1);
        let summary = cli::restore(&registry, open, |n| progress(n, accounts, "accounts")).await?;
        if terminal {
            let _ = writeln!(std::io::stderr());
        }
        return restored(&summary, started.elapsed().as_secs_f64());
    }
    let summary = cli::import(&registry, open, |rows| progress(rows, total, "rows")).await?;
    if terminal {
        let _ = writeln!(std::io::stderr());
    }
    let seconds = started.elapsed().as_secs_f64();
    let mut out = format!(
        "{} rows in {seconds:.1} s ({:.0} rows/s): {} new keys from the walk, {} existing keys kept, {} accounts already present, {} rows refused\n",
        summary.rows,
        summary.rows as f64 / seconds.max(1e-3),
        summary.allocated,
        summary.kept,
        summary.present,
        summary.refused.len(),
    );
    for (line, why) in summary.refused.iter().take(20) {
        out.push_str(&format!("  line {line}: {why}\n"));
    }
    if summary.refused.len() > 20 {
        out.push_str(&format!("  ... and {} more\n", summary.refused.len() - 20));
    }
    if summary.refused.is_empty() {
        Ok(out)
    } else {
        Err(out)
    }
}

/// What an import of a snapshot did: `Err` when it refused lines (and wrote nothing).
fn restored(summary: &cli::RestoreSummary, seconds: f64) -> Result<String, String> {
    let mut out = format!(
        "snapshot of event {}: {} accounts in {seconds:.1} s: {} written with {} keys ({} \
         pending switches kept), {} already present, {} lines refused\n",
        summary.event_id,
        summary.accounts,
        summary.written,
        summary.keys,
        summary.pending,
        summary.present,
        summary.refused.len(),
    );
    if summary.refused.is_empty() {
        return Ok(out);
    }
    out.push_str("nothing was written:\n");
    for (line, why) in summary.refused.iter().take(20) {
        out.push_str(&format!("  line {line}: {why}\n"));
    }
    if summary.refused.len() > 20 {
        out.push_str(&format!("  ... and {} more\n", summary.refused.len() - 20));
    }
    Err(out)
}

/// Lines in a file, for the progress figure.
fn bytecount_lines(bytes: &[u8]) -> u64 {
    bytes.iter().filter(|b| **b == b'\n').count() as u64
}

/// Prints a subcommand's output, or its error on stderr.
fn report(result: Result<String, String>) -> ExitCode {
    match result {
        Ok(out) => print_out(&out),
        Err(err) => {
            print_err(&err);
            ExitCode::FAILURE
        }
    }
}

/// Writes a subcommand's output. A reader that stops early (`keyspread openapi | head`)
/// cuts it short quietly, with exit status 0, as tools that read a pipe expect.
fn print_out(text: &str) -> ExitCode {
    let mut stdout = std::io::stdout().lock();
    match stdout
        .write_all(text.as_bytes())
        .and_then(|()| stdout.flush())
    {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) if err.kind() == std::io::ErrorKind::BrokenPipe => ExitCode::SUCCESS,
        Err(err) => {
            print_err(&format!("cannot write the output: {err}"));
            ExitCode::FAILURE
        }
    }
}

/// Writes `keyspread: MESSAGE` on stderr; a closed stderr leaves nobody to tell.
fn print_err(message: &str) {
    let _ = writeln!(std::io::stderr(), "keyspread: {message}");
}

/// Writes a line of what a command did on stderr, when its output is data.
fn print_err_line(message: &str) {
    let _ = writeln!(std::io::stderr(), "{message}");
}

async fn run(config: ServeConfig) -> Result<(), Box<dyn std::error::Error>> {
    tracing::info!(
        listen = %config.listen,
        database = %redact_url(&config.database_url),
        keyspace_bits = config.keyspace_bits,
        token = config.token.is_some(),
        tokens_file = ?config.tokens_file,
        read_access = ?config.read_access,
        metrics_token = config.metrics_token.is_some(),
        trusted_proxies = ?config.trusted_proxies,
        "starting keyspread"
    );
    if config.token.is_none() && config.tokens_file.is_none() && !config.listen.ip().is_loopback() {
        tracing::warn!("no KEYSPREAD_TOKEN: only clients on this host may change assignments");
    }
    // The address first: a taken port is reported before the database is touched (no
    // file created, no migration run by a process that cannot serve).
    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .map_err(|err| cannot_listen(config.listen, &err))?;
    let shutdown = shutdown_signal()?;
    let state = AppState::open(&config).await?;
    tracing::info!(addr = %listener.local_addr()?, "listening");
    serve(listener, state, shutdown).await?;
    tracing::info!("stopped");
    Ok(())
}

/// Why `serve` cannot listen, naming the address (and, when it is taken, how to pick another).
fn cannot_listen(addr: SocketAddr, err: &std::io::Error) -> String {
    if err.kind() == std::io::ErrorKind::AddrInUse {
        format!(
            "cannot listen on {addr}: address already in use (another process listens there; \
             choose another address with --listen or KEYSPREAD_LISTEN)"
        )
    } else {
        format!("cannot listen on {addr}: {err}")
    }
}

/// A future that resolves on SIGINT or SIGTERM. The handlers are installed here, before
/// the first request is served: a signal that comes while `serve` has not yet polled the
/// future is kept, not lost to the default action (exit without draining).
#[cfg(unix)]
fn shutdown_signal() -> std::io::Result<impl Future<Output = ()>> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut interrupt = signal(SignalKind::interrupt())?;
    let mut terminate = signal(SignalKind::terminate())?;
    Ok(async move {
        tokio::select! {
            _ = interrupt.recv() => {},
            _ = terminate.recv() => {},
        }
        tracing::info!("shutdown signal received, draining requests");
    })
}

#[cfg(not(unix))]
fn shutdown_signal() -> std::io::Result<impl Future<Output = ()>> {
    Ok(async {
        let _ = tokio::signal::ctrl_c().await;
        tracing::info!("shutdown signal received, draining requests");
    })
}
