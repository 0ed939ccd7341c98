//! Configuration: flags with environment twins, so containers need no arguments.

use std::fmt;
use std::net::SocketAddr;
use std::str::FromStr;
use std::time::Duration;

use keyspace::Limits;

mod controller;
mod kinesis;
mod lookup_cache;
mod net;
mod tokens;

pub use controller::ControllerConfig;
pub use kinesis::KinesisConfig;
pub use lookup_cache::{LookupCache, MAX_LIFETIME_S};
pub use net::{HostName, normalize_host, parse_network};
pub use tokens::{
    ADMIN_TOKEN_NAME, Grant, LineError, MAX_NAME_LEN, MAX_TOKEN_LEN, RESERVED_NAMES, Role, Roles,
    Tokens, TokensFileError, check_name, parse_roles,
};
pub use tokens::{digest as token_digest, line as tokens_file_line};

/// Joins within this many milliseconds of a stream's last assignment wait for the next
/// one, unless configured otherwise: a thousand workers starting together cost a few
/// assignments, not a thousand.
pub const DEFAULT_JOIN_BATCH_MS: i64 = 1000;

/// How reports are smoothed and weighed.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LoadConfig {
    /// Rates halve over this many milliseconds without reports.
    pub half_life_ms: i64,
    /// A shard's write limit: utilisation 1 uses all of it.
    pub limits: Limits,
    /// The share of a shard's limit one key of an account should carry at most: an
    /// account of load L is suggested ⌈L ÷ share⌉ keys.
    pub hot_account_share: f64,
}

impl Default for LoadConfig {
    fn default() -> Self {
        LoadConfig {
            half_life_ms: 120_000,
            limits: Limits::default(),
            hot_account_share: 0.5,
        }
    }
}

/// `keyspread serve` settings.
#[derive(Clone, clap::Args)]
pub struct ServeConfig {
    /// Address to listen on.
    #[arg(long, env = "KEYSPREAD_LISTEN", default_value = "127.0.0.1:8080")]
    pub listen: SocketAddr,

    /// `sqlite://PATH` (created if missing) or `postgres://USER:PASSWORD@HOST/DB`.
    #[arg(
        long,
        env = "DATABASE_URL",
        default_value = "sqlite://keyspread.db",
        hide_env_values = true
    )]
    pub database_url: String,

    /// One bearer token with the admin role (named `admin` in the event log). Without it or
    /// --tokens-file, only loopback clients may mutate.
    #[arg(long, env = "KEYSPREAD_TOKEN", hide_env_values = true, value_parser = TokenParser)]
    pub token: Option<Token>,

    /// A file of tokens with their roles, one a line: `NAME ROLE[,ROLE…] sha256:HEX` (roles:
    /// read, produce, consume, admin; `keyspread token new` prints a line). Only digests are
    /// kept; SIGHUP re-reads it, and a bad file keeps the tokens in force.
    #[arg(long, env = "KEYSPREAD_TOKENS_FILE")]
    pub tokens_file: Option<std::path::PathBuf>,

    /// `open`: reads need no token. `token`: every read but /healthz and /readyz[/writes] (and
    /// /metrics, which has --metrics-token) needs a token of any role, the page included
    /// (a browser asks for it: any user name, the token as the password).
    #[arg(long, env = "KEYSPREAD_READ_ACCESS", value_enum, default_value_t = ReadAccess::Open)]
    pub read_access: ReadAccess,

    /// Bearer token `GET /metrics` needs; without one, metrics are open to every client
    /// (they hold counts and latencies, never accounts or keys).
    #[arg(
        long,
        env = "KEYSPREAD_METRICS_TOKEN",
        hide_env_values = true,
        value_parser = TokenParser
    )]
    pub metrics_token: Option<Token>,

    /// Width of the keyspace in bits; 128 is Kinesis', fewer only for experiments.
    #[arg(long, env = "KEYSPREAD_KEYSPACE_BITS", default_value_t = 128,
          value_parser = clap::value_parser!(u32).range(1..=128))]
    pub keyspace_bits: u32,

    /// The stream whose shards new keys balance on (once it is registered).
    #[arg(long, env = "KEYSPREAD_PRIMARY_STREAM")]
    pub primary_stream: Option<String>,

    /// `Cache-Control` sent with lookups; producers and HTTP caches may reuse an answer
    /// this long, and revalidate it cheaply with its ETag afterwards. A rebalance's moves
    /// switch that long after they are applied (`max-age`, or `s-maxage` if longer, plus
    /// `stale-while-revalidate`) unless its `switch_after_s` says otherwise, and answers
    /// given while a switch is pending may be cached only until it.
    #[arg(
        long,
        env = "KEYSPREAD_LOOKUP_CACHE_CONTROL",
        default_value = "max-age=60",
        value_parser = lookup_cache_control
    )]
    pub lookup_cache_control: axum::http::HeaderValue,

    /// Milliseconds a consumer worker's join waits for other joins, so that they are assigned
    /// together: joins within this long of a stream's last assignment wait for the next one
    /// (a thousand workers starting at once cost a few assignments, not a thousand). 0
    /// assigns at every join.
    #[arg(
        long,
        env = "KEYSPREAD_LEASE_JOIN_BATCH_MS",
        default_value_t = DEFAULT_JOIN_BATCH_MS as u64,
        value_parser = clap::value_parser!(u64).range(0..=60_000)
    )]
    pub lease_join_batch_ms: u64,

    /// Seconds over which observed load (what consumer workers report reading) halves
    /// without new reports: the smoothing of every shard's and account's rate.
    #[arg(
        long,
        env = "KEYSPREAD_LOAD_HALF_LIFE_S",
        default_value_t = 120,
        value_parser = clap::value_parser!(u64).range(1..=86_400)
    )]
    pub load_half_life_s: u64,

    /// Records per second a shard takes (Kinesis: 1,000): a shard's utilisation is the
    /// larger of its records/s and bytes/s over these limits.
    #[arg(long, env = "KEYSPREAD_SHARD_RECORDS_PER_S", default_value_t = 1000.0,
          value_parser = positive_rate)]
    pub shard_records_per_s: f64,

    /// Bytes per second a shard takes (Kinesis: 1 MiB).
    #[arg(long, env = "KEYSPREAD_SHARD_BYTES_PER_S", default_value_t = 1_048_576.0,
          value_parser = positive_rate)]
    pub shard_bytes_per_s: f64,

    /// Share of a shard's limit one key of an account should carry at most, in (0, 1]: an
    /// account of load L is suggested a fanout of ⌈L ÷ share⌉.
    #[arg(long, env = "KEYSPREAD_HOT_ACCOUNT_SHARE", default_value_t = 0.5,
          value_parser = account_share)]
    pub hot_account_share: f64,

    /// Seconds a request may take before it is answered 408.
    #[arg(long, env = "KEYSPREAD_REQUEST_TIMEOUT_SECS", default_value_t = 10)]
    pub request_timeout_secs: u64,

    /// Seconds a client has to send a request's headers, and that an idle connection is
    /// kept open; a slower client's connection is closed.
    #[arg(long, env = "KEYSPREAD_HEADER_TIMEOUT_SECS", default_value_t = 10,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub header_timeout_secs: u64,

    /// Most connections served at once; more wait in the listen backlog until one closes. A
    /// long poll of the log (`GET /events?wait_s=`) gives its connection's place to another
    /// while it waits, up to as many long polls again (past those, a waiting one keeps its
    /// place), and takes a place back before it answers.
    #[arg(long, env = "KEYSPREAD_MAX_CONNECTIONS", default_value_t = 10_000,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub max_connections: u32,

    /// Seconds a stop (SIGTERM, SIGINT) gives requests in flight, clients still reading their
    /// answers included; then their connections are dropped and the process exits. 20 ends
    /// the process before the 30 s Kubernetes and ECS wait by default before SIGKILL.
    #[arg(long, env = "KEYSPREAD_SHUTDOWN_TIMEOUT_S", default_value_t = 20,
          value_parser = clap::value_parser!(u64).range(0..=3600))]
    pub shutdown_timeout_s: u64,

    /// Mutations (POST, PUT, PATCH, DELETE) per second each client IP may make; 0: no limit.
    #[arg(long, env = "KEYSPREAD_MUTATION_RATE", default_value_t = 1000)]
    pub mutation_rate: u32,

    /// Mutations a client may make at once before the per-second rate applies.
    #[arg(long, env = "KEYSPREAD_MUTATION_BURST", default_value_t = 2000)]
    pub mutation_burst: u32,

    /// Refused credentials (no token, or one this server does not take, where one is
    /// needed) a client address may send per minute, an IPv6 client's whole /64 counting as
    /// one address. Past them and the burst, tokens from that address are not checked, but
    /// for those that passed from it in the last 10 minutes: 429 with `Retry-After`. 0: no
    /// such budget (refusals count against --mutation-rate then).
    #[arg(long, env = "KEYSPREAD_AUTH_FAILURES_PER_MINUTE", default_value_t = 60,
          value_parser = clap::value_parser!(u32).range(0..=60_000))]
    pub auth_failures_per_minute: u32,

    /// Refused credentials an address may send at once before the per-minute rate applies.
    #[arg(long, env = "KEYSPREAD_AUTH_FAILURE_BURST", default_value_t = 20,
          value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub auth_failure_burst: u32,

    /// Rate-limit clients allowed to mutate too (holders of the token; without a token,
    /// clients on this host). Off by default: the limit is there for the others (wrong
    /// and missing tokens have --auth-failures-per-minute).
    #[arg(long, env = "KEYSPREAD_LIMIT_TOKEN_HOLDERS")]
    pub limit_token_holders: bool,

    /// Without a token, host names besides the loopback ones that requests may address
    /// (`Host`) and that pages allowed to mutate may come from (`Origin`), comma-separated,
    /// without ports. Ignored when a token is set.
    #[arg(long, env = "KEYSPREAD_ALLOWED_HOSTS", value_delimiter = ',')]
    pub allowed_hosts: Vec<HostName>,

    /// Proxies or load balancers in front of the service, as addresses or networks
    /// (`10.0.0.0/8,127.0.0.1`). A request from one of them is taken to come from the client
    /// its `X-Forwarded-For` names: the rate limit and the loopback rule apply to that client.
    /// None by default: the header is ignored.
    #[arg(long, env = "KEYSPREAD_TRUSTED_PROXIES", value_delimiter = ',',
          value_parser = parse_network)]
    pub trusted_proxies: Vec<ipnet::IpNet>,

    /// How much of the event log to keep, as `AGE,COUNT` (`7d,1000000`; AGE in s, m, h or
    /// d) or `off`. An event is dropped once it is older than AGE and more than COUNT newer
    /// events follow it; the newest event, and those a pending staged move or the load
    /// controller's cooldown still needs, always stay. Readers of `GET /events` behind what
    /// was dropped are answered 410 and start again from `GET /snapshot`.
    #[arg(
        long,
        env = "KEYSPREAD_EVENT_RETENTION",
        default_value = "7d,1000000",
        value_parser = parse_event_retention
    )]
    pub event_retention: EventRetention,

    /// Seconds between two compactions of the event log by this replica (see
    /// `--event-retention`).
    #[arg(
        long,
        env = "KEYSPREAD_EVENT_COMPACTION_INTERVAL_S",
        default_value_t = 60,
        value_parser = clap::value_parser!(u64).range(1..=86_400)
    )]
    pub event_compaction_interval_s: u64,

    /// The load controller (`--auto-rebalance` and its flags).
    #[command(flatten)]
    pub controller: ControllerConfig,

    /// Kinesis' endpoint instead of AWS's (kinesalite, LocalStack: `http://127.0.0.1:4567`).
    /// With it and no credentials in the AWS SDK's chain, keyspread signs with dummy
    /// credentials, which those take.
    #[arg(long, env = "KEYSPREAD_KINESIS_ENDPOINT")]
    pub kinesis_endpoint: Option<String>,

    /// The AWS region of the streams, instead of the SDK's chain's (AWS_REGION, the profile).
    #[arg(long, env = "KEYSPREAD_KINESIS_REGION")]
    pub kinesis_region: Option<String>,

    /// Seconds between two listings of each watched stream's shards (by one replica).
    #[arg(
        long,
        env = "KEYSPREAD_STREAM_SYNC_INTERVAL_S",
        default_value_t = 30,
        value_parser = clap::value_parser!(u64).range(1..=86_400)
    )]
    pub stream_sync_interval_s: u64,

    /// Seconds a replica holds a reshard job it drives before another may take it over (it
    /// renews the claim before each call): how long a job waits after its replica died.
    /// Keep it above a Kinesis call's timeout (8 s).
    #[arg(
        long,
        env = "KEYSPREAD_RESHARD_LEASE_S",
        default_value_t = 30,
        value_parser = clap::value_parser!(u64).range(1..=3600)
    )]
    pub reshard_lease_s: u64,
}

impl ServeConfig {
    /// Defaults for tests: loopback port 0, no token, 128 bits, mutations and refused
    /// credentials not rate-limited.
    pub fn for_tests(database_url: String) -> ServeConfig {
        ServeConfig {
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            database_url,
            token: None,
            tokens_file: None,
            read_access: ReadAccess::Open,
            metrics_token: None,
            keyspace_bits: 128,
            primary_stream: None,
            lookup_cache_control: axum::http::HeaderValue::from_static("max-age=60"),
            lease_join_batch_ms: DEFAULT_JOIN_BATCH_MS as u64,
            load_half_life_s: 120,
            shard_records_per_s: 1000.0,
            shard_bytes_per_s: 1_048_576.0,
            hot_account_share: 0.5,
            request_timeout_secs: 10,
            header_timeout_secs: 10,
            max_connections: 10_000,
            shutdown_timeout_s: 20,
            mutation_rate: 0,
            mutation_burst: 2000,
            auth_failures_per_minute: 0,
            auth_failure_burst: 20,
            limit_token_holders: false,
            allowed_hosts: Vec::new(),
            trusted_proxies: Vec::new(),
            event_retention: EventRetention::DEFAULT,
            event_compaction_interval_s: 60,
            controller: Default::default(),
            kinesis_endpoint: None,
            kinesis_region: None,
            stream_sync_interval_s: 30,
            reshard_lease_s: 30,
        }
    }

    /// How observed load is smoothed and weighed.
    pub fn load_config(&self) -> LoadConfig {
        LoadConfig {
            half_life_ms: self.load_half_life_s as i64 * 1000,
            limits: keyspace::Limits {
                records_per_s: self.shard_records_per_s,
                bytes_per_s: self.shard_bytes_per_s,
            },
            hot_account_share: self.hot_account_share,
        }
    }

    /// Where Kinesis is.
    pub fn kinesis_config(&self) -> KinesisConfig {
        KinesisConfig {
            endpoint: self.kinesis_endpoint.clone(),
            region: self.kinesis_region.clone(),
        }
    }

    pub fn request_timeout(&self) -> Duration {
        Duration::from_secs(self.request_timeout_secs)
    }

    pub fn header_timeout(&self) -> Duration {
        Duration::from_secs(self.header_timeout_secs)
    }

    pub fn shutdown_timeout(&self) -> Duration {
        Duration::from_secs(self.shutdown_timeout_s)
    }
}

/// Shows the database URL without its password, and the tokens only as set or not.
impl fmt::Debug for ServeConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ServeConfig")
            .field("listen", &self.listen)
            .field("database_url", &redact_url(&self.database_url))
            .field("token", &self.token)
            .field("metrics_token", &self.metrics_token)
            .field("keyspace_bits", &self.keyspace_bits)
            .field("primary_stream", &self.primary_stream)
            .field("trusted_proxies", &self.trusted_proxies)
            .field("event_retention", &self.event_retention)
            .field("kinesis_endpoint", &self.kinesis_endpoint)
            .field("kinesis_region", &self.kinesis_region)
            .finish_non_exhaustive()
    }
}

/// Who may read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ReadAccess {
    /// Anyone who reaches the port (a token is still needed to change anything).
    Open,
    /// A token of any role.
    Token,
}

/// A bearer token. Never printed: `Debug` and `Display` show only that one is set.
#[derive(Clone, PartialEq, Eq)]
pub struct Token(String);

/// Why a bearer token is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    #[error(
        "a token may hold visible ASCII characters only (letters, digits, punctuation; no \
         spaces, no accents): no HTTP client could send it in `Authorization: Bearer`"
    )]
    Unsendable,
    #[error(
        "the token ends with a line break (as `echo` or an editor adds to a file): no HTTP \
         client could send it in `Authorization: Bearer`; remove it"
    )]
    LineBreak,
    #[error("a token must be at least {} characters long", Token::MIN_LEN)]
    TooShort,
}

impl Token {
    pub const MIN_LEN: usize = 16;

    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl FromStr for Token {
    type Err = TokenError;

    /// Takes visible ASCII only: a header value with other bytes is not a string the server
    /// can compare, and spaces around it are dropped on the way.
    fn from_str(s: &str) -> Result<Self, TokenError> {
        if s.ends_with('\n') || s.ends_with('\r') {
            return Err(TokenError::LineBreak);
        }
        if !s.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(TokenError::Unsendable);
        }
        if s.len() < Self::MIN_LEN {
            return Err(TokenError::TooShort);
        }
        Ok(Token(s.to_owned()))
    }
}

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Token(<redacted>)")
    }
}

impl fmt::Display for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

/// Parses a token flag without repeating a refused value, which clap's own errors quote.
#[derive(Clone, Copy)]
pub struct TokenParser;

impl clap::builder::TypedValueParser for TokenParser {
    type Value = Token;

    fn parse_ref(
        &self,
        cmd: &clap::Command,
        arg: Option<&clap::Arg>,
        value: &std::ffi::OsStr,
    ) -> Result<Token, clap::Error> {
        let parsed = value.to_str().ok_or(TokenError::Unsendable);
        parsed.and_then(str::parse).map_err(|why| {
            let name = match arg {
                Some(arg) => match arg.get_env() {
                    Some(env) => format!("{arg} (or {})", env.to_string_lossy()),
                    None => arg.to_string(),
                },
                None => "the token".to_owned(),
            };
            let message = format!("invalid value (not shown) for '{name}': {why}\n");
            clap::Error::raw(clap::error::ErrorKind::ValueValidation, message).with_cmd(cmd)
        })
    }
}

/// Query parameters of a Postgres URL that sqlx reads (`PgConnectOptions`), and whether a
/// log may show their value.
const POSTGRES_PARAMETERS: [(&str, bool); 18] = [
    ("sslmode", true),
    ("ssl-mode", true),
    ("sslrootcert", true),
    ("ssl-root-cert", true),
    ("ssl-ca", true),
    ("sslcert", true),
    ("ssl-cert", true),
    ("sslkey", true),
    ("ssl-key", true),
    ("statement-cache-capacity", true),
    ("host", true),
    ("hostaddr", true),
    ("port", true),
    ("dbname", true),
    ("user", true),
    ("password", false),
    ("application_name", true),
    ("options", true),
];

/// Whether sqlx reads the Postgres URL parameter `name`, and may a log show its value.
fn postgres_parameter(name: &str) -> Option<bool> {
    if name.starts_with("options[") && name.ends_with(']') {
        return Some(true);
    }
    POSTGRES_PARAMETERS
        .iter()
        .find(|(known, _)| *known == name)
        .map(|(_, shown)| *shown)
}

/// The first query parameter of a Postgres URL that sqlx does not read. sqlx ignores such
/// a parameter and logs its value, which may be a secret (`sslpassword`, `PASSWORD`).
pub fn unread_parameter(url: &str) -> Option<String> {
    let url = url::Url::parse(url).ok()?;
    url.query_pairs()
        .map(|(name, _)| name)
        .find(|name| postgres_parameter(name).is_none())
        .map(|name| name.into_owned())
}

/// A database URL fit for logs: the password, wherever the URL holds it (userinfo or a
/// query parameter), and every query value not known to be harmless become `***`.
/// A URL that does not parse is not shown at all: where its password is cannot be told.
pub fn redact_url(raw: &str) -> String {
    // sqlx takes the rest of a SQLite URL as a file name and options, never credentials.
    if raw.starts_with("sqlite:") {
        return raw.to_owned();
    }
    let Ok(mut url) = url::Url::parse(raw) else {
        return "(a database URL that does not parse; not shown)".to_owned();
    };
    if url.password().is_some() {
        url.set_password(Some("***"))
            .expect("a URL with a password can have one");
    }
    let pairs: Vec<(String, String)> = url
        .query_pairs()
        .map(|(name, value)| {
            let value = match postgres_parameter(&name) {
                Some(true) => value.into_owned(),
                _ => "***".to_owned(),
            };
            (name.into_owned(), value)
        })
        .collect();
    url.set_query(None);
    url.set_fragment(None);
    if !pairs.is_empty() {
        url.query_pairs_mut().extend_pairs(pairs);
    }
    url.into()
}

/// A `Cache-Control` for lookups, refused here (before the database is touched) when
/// [`LookupCache::parse`] refuses it.
fn lookup_cache_control(text: &str) -> Result<axum::http::HeaderValue, String> {
    let header = axum::http::HeaderValue::from_str(text)
        .map_err(|_| "not a valid header value".to_owned())?;
    LookupCache::parse(header.clone())?;
    Ok(header)
}

/// A per-shard limit: a finite number above 0.
fn positive_rate(text: &str) -> Result<f64, String> {
    match text.trim().parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 => Ok(v),
        _ => Err(format!("must be a number above 0, got {text:?}")),
    }
}

/// How much of the event log a server keeps (`--event-retention`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventRetention {
    /// Every event stays.
    Off,
    /// Events older than `max_age_ms` with more than `keep` newer events after them go.
    Keep { max_age_ms: i64, keep: u64 },
}

impl EventRetention {
    /// Seven days, and at least the newest million events.
    pub const DEFAULT: EventRetention = EventRetention::Keep {
        max_age_ms: 7 * 86_400_000,
        keep: 1_000_000,
    };
}

impl fmt::Display for EventRetention {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EventRetention::Off => f.write_str("off"),
            EventRetention::Keep { max_age_ms, keep } => {
                write!(f, "{}s,{keep}", max_age_ms / 1000)
            }
        }
    }
}

/// `off`, or `AGE,COUNT`: AGE a whole number of s, m, h or d (`0` alone too), COUNT events.
fn parse_event_retention(text: &str) -> Result<EventRetention, String> {
    let text = text.trim();
    if text.eq_ignore_ascii_case("off") {
        return Ok(EventRetention::Off);
    }
    let Some((age, count)) = text.split_once(',') else {
        return Err(format!(
            "expected AGE,COUNT (such as 7d,1000000) or off, got {text:?}"
        ));
    };
    let age = age.trim();
    let (number, unit_ms) = match age.char_indices().last() {
        Some((i, 's')) => (&age[..i], 1_000),
        Some((i, 'm')) => (&age[..i], 60_000),
        Some((i, 'h')) => (&age[..i], 3_600_000),
        Some((i, 'd')) => (&age[..i], 86_400_000),
        _ if age == "0" => ("0", 0),
        _ => {
            return Err(format!(
                "the age {age:?} needs a unit: s, m, h or d (7d, 12h)"
            ));
        }
    };
    let max_age_ms = number
        .parse::<i64>()
        .ok()
        .and_then(|n| n.checked_mul(unit_ms))
        .filter(|ms| (0..=3650 * 86_400_000).contains(ms))
        .ok_or_else(|| format!("the age {age:?} is not a whole number of at most 3650 days"))?;
    let keep = count.trim().parse::<u64>().map_err(|_| {
        format!(
            "the count {:?} is not a whole number of events",
            count.trim()
        )
    })?;
    Ok(EventRetention::Keep { max_age_ms, keep })
}

/// A share of a shard's limit: above 0, at most 1.
fn account_share(text: &str) -> Result<f64, String> {
    match text.trim().parse::<f64>() {
        Ok(v) if v > 0.0 && v <= 1.0 => Ok(v),
        _ => Err(format!("must be above 0 and at most 1, got {text:?}")),
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[derive(clap::Parser)]
    struct Flags {
        #[command(flatten)]
        serve: ServeConfig,
    }

    #[test]
    fn event_retention_takes_an_age_and_a_count_or_off_and_says_what_is_wrong() {
        use clap::Parser as _;
        let parse = |args: &[&str]| {
            Flags::try_parse_from(std::iter::once("keyspread").chain(args.iter().copied()))
                .map(|f| f.serve.event_retention)
                .map_err(|e| e.to_string())
        };
        assert_eq!(parse(&[]).unwrap(), EventRetention::DEFAULT);
        let keep = |max_age_ms, keep| EventRetention::Keep { max_age_ms, keep };
        assert_eq!(parse(&["--event-retention=0,100"]).unwrap(), keep(0, 100));
        assert_eq!(
            parse(&["--event-retention=12h,5"]).unwrap(),
            keep(43_200_000, 5)
        );
        assert_eq!(
            parse(&["--event-retention=90s, 0"]).unwrap(),
            keep(90_000, 0)
        );
        assert_eq!(
            parse(&["--event-retention=OFF"]).unwrap(),
            EventRetention::Off
        );
        for (value, needle) in [
            ("7d", "expected AGE,COUNT"),
            ("7,100", "needs a unit"),
            ("-1d,100", "not a whole number of at most 3650 days"),
            ("4000d,100", "not a whole number of at most 3650 days"),
            ("7d,lots", "the count \"lots\" is not a whole number"),
        ] {
            let err = parse(&[&format!("--event-retention={value}")]).unwrap_err();
            assert!(err.contains(needle), "{value}: {err}");
        }
    }

    #[test]
    fn load_flags_default_to_kinesis_limits_and_refuse_what_cannot_be() {
        use clap::Parser as _;
        let parse = |args: &[&str]| {
            Flags::try_parse_from(std::iter::once("keyspread").chain(args.iter().copied()))
                .map(|f| f.serve.load_config())
                .map_err(|e| e.to_string())
        };
        assert_eq!(parse(&[]).unwrap(), LoadConfig::default());
        let set = parse(&[
            "--load-half-life-s=30",
            "--shard-records-per-s=50",
            "--shard-bytes-per-s=4096.5",
            "--hot-account-share=1",
        ])
        .unwrap();
        assert_eq!(set.half_life_ms, 30_000);
        assert_eq!(set.limits.records_per_s, 50.0);
        assert_eq!(set.limits.bytes_per_s, 4096.5);
        assert_eq!(set.hot_account_share, 1.0);
        for (flag, needle) in [
            ("--load-half-life-s=0", "1..=86400"),
            ("--load-half-life-s=86401", "1..=86400"),
            ("--shard-records-per-s=0", "must be a number above 0"),
            ("--shard-bytes-per-s=inf", "must be a number above 0"),
            ("--hot-account-share=0", "must be above 0 and at most 1"),
            ("--hot-account-share=1.5", "must be above 0 and at most 1"),
        ] {
            let err = parse(&[flag]).unwrap_err();
            assert!(err.contains(needle), "{flag}: {err}");
        }
    }

    #[test]
    fn tokens_are_never_printed() {
        let token: Token = "correct-horse-battery-staple".parse().unwrap();
        assert!(!format!("{token:?} {token}").contains("horse"));
    }

    #[test]
    fn tokens_are_what_a_client_can_send() {
        assert_eq!("short".parse::<Token>(), Err(TokenError::TooShort));
        for unsendable in [
            "has a space in the middle",
            "tökentökentökentöken",
            "tab\tin-the-middle-of-it",
            "del\u{7f}in-the-middle-of-it",
        ] {
            assert_eq!(unsendable.parse::<Token>(), Err(TokenError::Unsendable));
        }
        for sendable in ["abcDEF0123456789-._~+/=", "punctuation!#$%&*|^`{}"] {
            assert!(sendable.parse::<Token>().is_ok(), "{sendable}");
        }
    }

    #[test]
    fn urls_lose_their_passwords() {
        for (url, shown) in [
            (
                "postgres://app:s3cret@db:5432/keys",
                "postgres://app:***@db:5432/keys",
            ),
            (
                "postgres://app:s3cr@t-pass@host/db",
                "postgres://app:***@host/db",
            ),
            (
                "postgres://app@host/db?sslmode=require&password=s3cret&PassWord=x&sslpassword=y",
                "postgres://app@host/db?sslmode=require&password=***&PassWord=***&sslpassword=***",
            ),
            (
                "postgres://app:pa/ss@host/db",
                "(a database URL that does not parse; not shown)",
            ),
            ("sqlite://keyspread.db", "sqlite://keyspread.db"),
            ("sqlite:///tmp/my dir/k.db", "sqlite:///tmp/my dir/k.db"),
        ] {
            assert_eq!(redact_url(url), shown, "{url}");
        }
    }

    #[test]
    fn the_config_debug_shows_no_secret() {
        let mut config = ServeConfig::for_tests("postgres://app:s3cr@t-pass@db/keys".into());
        config.token = Some("the-token-itself-0123".parse().unwrap());
        let shown = format!("{config:?}");
        assert!(shown.contains("postgres://app:***@db/keys"), "{shown}");
        assert!(
            !shown.contains("s3cr") && !shown.contains("t-pass"),
            "{shown}"
        );
        assert!(!shown.contains("itself"), "{shown}");
    }

    #[test]
    fn parameters_sqlx_does_not_read_are_named() {
        let unread = |url: &str| unread_parameter(url);
        assert_eq!(unread("postgres://h/db?sslmode=require&password=x"), None);
        assert_eq!(unread("postgres://h/db?options[search_path]=a"), None);
        assert_eq!(
            unread("postgres://h/db?PASSWORD=x").as_deref(),
            Some("PASSWORD")
        );
        assert_eq!(
            unread("postgres://h/db?sslmode=disable&sslpassword=x").as_deref(),
            Some("sslpassword")
        );
    }

    /// A password whose every fragment is recognizable: upper case never appears in the
    /// URLs around it.
    fn password() -> impl Strategy<Value = String> {
        "[A-Z][A-Z@:/?%#&=+ ]{5,20}"
    }

    /// `s` percent-encoded as userinfo and query values need it.
    fn encoded(s: &str) -> String {
        s.bytes()
            .map(|b| match b {
                b'A'..=b'Z' => (b as char).to_string(),
                _ => format!("%{b:02X}"),
            })
            .collect()
    }

    proptest! {
        /// Wherever a URL puts a password, as typed or percent-encoded, the redacted text
        /// holds neither form of it.
        #[test]
        fn redacted_urls_never_hold_the_password(p in password(), case in 0usize..6) {
            let e = encoded(&p);
            let url = match case {
                0 => format!("postgres://app:{p}@host:5432/db"),
                1 => format!("postgres://app:{e}@host:5432/db?sslmode=disable"),
                2 => format!("postgres://app@host/db?password={e}&sslmode=disable"),
                3 => format!("postgres://app@host/db?sslmode=disable&password={p}"),
                4 => format!("postgres://app@host/db?PASSWORD={e}&sslpassword={p}"),
                _ => format!("postgres://app:{e}@host/db?password={e}"),
            };
            let shown = redact_url(&url);
            prop_assert!(!shown.contains(&p), "{} -> {}", url, shown);
            prop_assert!(!shown.contains(&e), "{} -> {}", url, shown);
            prop_assert!(!shown.contains(&p[..4]), "{} -> {}", url, shown);
        }
    }
}
