//! Configuration: flags with environment twins, so containers need no arguments.

use std::fmt;
use std::net::SocketAddr;
use std::str::FromStr;
use std::time::Duration;

/// `keyspread serve` settings.
#[derive(Debug, Clone, clap::Args)]
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

    /// Bearer token every mutation must carry; without one, only loopback clients may mutate.
    #[arg(long, env = "KEYSPREAD_TOKEN", hide_env_values = true)]
    pub token: Option<Token>,

    /// Bearer token `GET /metrics` needs; without one, metrics are open to every client
    /// (they hold counts and latencies, never accounts or keys).
    #[arg(long, env = "KEYSPREAD_METRICS_TOKEN", hide_env_values = true)]
    pub metrics_token: Option<Token>,

    /// Width of the keyspace in bits; 128 is Kinesis', fewer only for experiments.
    #[arg(long, env = "KEYSPREAD_KEYSPACE_BITS", default_value_t = 128,
          value_parser = clap::value_parser!(u32).range(1..=128))]
    pub keyspace_bits: u32,

    /// The stream whose shards new keys balance on (once it is registered).
    #[arg(long, env = "KEYSPREAD_PRIMARY_STREAM")]
    pub primary_stream: Option<String>,

    /// `Cache-Control` sent with lookups; producers and HTTP caches may reuse an answer
    /// this long, and revalidate it cheaply with its ETag afterwards.
    #[arg(
        long,
        env = "KEYSPREAD_LOOKUP_CACHE_CONTROL",
        default_value = "max-age=60"
    )]
    pub lookup_cache_control: axum::http::HeaderValue,

    /// Seconds a request may take before it is answered 408.
    #[arg(long, env = "KEYSPREAD_REQUEST_TIMEOUT_SECS", default_value_t = 10)]
    pub request_timeout_secs: u64,

    /// Seconds a client has to send a request's headers, and that an idle connection is
    /// kept open; a slower client's connection is closed.
    #[arg(long, env = "KEYSPREAD_HEADER_TIMEOUT_SECS", default_value_t = 10,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub header_timeout_secs: u64,

    /// Most connections served at once; more wait in the listen backlog until one closes.
    #[arg(long, env = "KEYSPREAD_MAX_CONNECTIONS", default_value_t = 10_000,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub max_connections: u32,

    /// Mutations (POST, PUT, PATCH, DELETE) per second each client IP may make; 0: no limit.
    #[arg(long, env = "KEYSPREAD_MUTATION_RATE", default_value_t = 1000)]
    pub mutation_rate: u32,

    /// Mutations a client may make at once before the per-second rate applies.
    #[arg(long, env = "KEYSPREAD_MUTATION_BURST", default_value_t = 2000)]
    pub mutation_burst: u32,

    /// Rate-limit clients allowed to mutate too (holders of the token; without a token,
    /// clients on this host). Off by default: the limit is there for the others, and to
    /// slow token guessing.
    #[arg(long, env = "KEYSPREAD_LIMIT_TOKEN_HOLDERS")]
    pub limit_token_holders: bool,

    /// Without a token, host names besides the loopback ones that requests may address
    /// (`Host`) and that pages allowed to mutate may come from (`Origin`), comma-separated,
    /// without ports. Ignored when a token is set.
    #[arg(long, env = "KEYSPREAD_ALLOWED_HOSTS", value_delimiter = ',')]
    pub allowed_hosts: Vec<crate::http::HostName>,

    /// Proxies or load balancers in front of the service, as addresses or networks
    /// (`10.0.0.0/8,127.0.0.1`). A request from one of them is taken to come from the client
    /// its `X-Forwarded-For` names: the rate limit and the loopback rule apply to that client.
    /// None by default: the header is ignored.
    #[arg(long, env = "KEYSPREAD_TRUSTED_PROXIES", value_delimiter = ',',
          value_parser = crate::http::parse_network)]
    pub trusted_proxies: Vec<ipnet::IpNet>,
}

impl ServeConfig {
    /// Defaults for tests: loopback port 0, no token, 128 bits, mutations not rate-limited.
    pub fn for_tests(database_url: String) -> ServeConfig {
        ServeConfig {
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            database_url,
            token: None,
            metrics_token: None,
            keyspace_bits: 128,
            primary_stream: None,
            lookup_cache_control: axum::http::HeaderValue::from_static("max-age=60"),
            request_timeout_secs: 10,
            header_timeout_secs: 10,
            max_connections: 10_000,
            mutation_rate: 0,
            mutation_burst: 2000,
            limit_token_holders: false,
            allowed_hosts: Vec::new(),
            trusted_proxies: Vec::new(),
        }
    }

    pub fn request_timeout(&self) -> Duration {
        Duration::from_secs(self.request_timeout_secs)
    }

    pub fn header_timeout(&self) -> Duration {
        Duration::from_secs(self.header_timeout_secs)
    }
}

/// A bearer token. Never printed: `Debug` and `Display` show only that one is set.
#[derive(Clone, PartialEq, Eq)]
pub struct Token(String);

impl Token {
    pub const MIN_LEN: usize = 16;

    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl FromStr for Token {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        if s.len() < Self::MIN_LEN || s.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(format!(
                "the token must be at least {} characters without spaces",
                Self::MIN_LEN
            ));
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

/// A database URL with any password replaced, fit for logs.
pub fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    match rest.split_once('@') {
        Some((userinfo, host)) => {
            let user = userinfo.split(':').next().unwrap_or_default();
            format!("{scheme}://{user}:***@{host}")
        }
        None => url.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_never_printed() {
        let token: Token = "correct-horse-battery-staple".parse().unwrap();
        assert!(!format!("{token:?} {token}").contains("horse"));
        assert!("short".parse::<Token>().is_err());
        assert!("has a space in the middle".parse::<Token>().is_err());
    }

    #[test]
    fn urls_lose_their_passwords() {
        assert_eq!(
            redact_url("postgres://app:s3cret@db:5432/keys"),
            "postgres://app:***@db:5432/keys"
        );
        assert_eq!(redact_url("sqlite://keyspread.db"), "sqlite://keyspread.db");
    }
}
