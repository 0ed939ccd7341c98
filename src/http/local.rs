//! The names under which a server without a token answers: loopback names and addresses,
//! and those the operator lists in `--allowed-hosts`.
//!
//! Without a token, being on the server's host is the only credential, and a browser on
//! that host carries pages of any site. A page elsewhere may post a form here (its
//! `Origin` gives it away), or rebind its own name to 127.0.0.1 and read the answers (its
//! name arrives as `Host`). Matching ignores case, ports and a final dot.

use std::net::IpAddr;

use axum::http::Uri;
use axum::http::uri::Authority;

use crate::config::{HostName, normalize_host as normalize};

/// The names this server answers under when it has no token.
#[derive(Debug, Clone, Default)]
pub struct LocalNames {
    allowed: Vec<HostName>,
}

impl LocalNames {
    pub fn new(allowed: Vec<HostName>) -> LocalNames {
        LocalNames { allowed }
    }

    /// Whether a `Host` value (`name`, `name:port`, `[v6]:port`) is one of them.
    pub fn host(&self, value: &[u8]) -> bool {
        Authority::try_from(value).is_ok_and(|a| !a.as_str().contains('@') && self.name(a.host()))
    }

    /// Whether an `Origin` value is a page served under one of them (`http` or `https`,
    /// any port). `null`, the origin of sandboxed and local-file pages, is not.
    pub fn origin(&self, value: &[u8]) -> bool {
        let Ok(uri) = Uri::try_from(value) else {
            return false;
        };
        let web = matches!(uri.scheme_str(), Some("http" | "https"));
        web && matches!(uri.path(), "" | "/")
            && uri
                .authority()
                .is_some_and(|a| self.host(a.as_str().as_bytes()))
    }

    fn name(&self, host: &str) -> bool {
        let host = normalize(host);
        is_loopback(&host) || self.allowed.iter().any(|allowed| allowed.as_str() == host)
    }
}

/// `localhost` and its subdomains (which resolve to loopback, RFC 6761), `127.0.0.0/8`, `::1`.
fn is_loopback(host: &str) -> bool {
    host == "localhost"
        || host.ends_with(".localhost")
        || host
            .parse::<IpAddr>()
            .is_ok_and(|ip| ip.to_canonical().is_loopback())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(allowed: &[&str]) -> LocalNames {
        LocalNames::new(allowed.iter().map(|a| a.parse().unwrap()).collect())
    }

    #[test]
    fn loopback_hosts_with_any_case_and_port() {
        let local = names(&[]);
        for host in [
            "localhost",
            "LOCALHOST:8080",
            "localhost.",
            "api.localhost:3000",
            "127.0.0.1",
            "127.9.8.7:80",
            "[::1]",
            "[::1]:8080",
            "[::ffff:127.0.0.1]:1",
        ] {
            assert!(local.host(host.as_bytes()), "{host}");
        }
        for host in [
            "evil.example",
            "localhost.evil.example",
            "127.0.0.1.evil.example",
            "0.0.0.0",
            "10.0.0.1:8080",
            "[::2]",
            "user@localhost",
            "",
            "local host",
            "\u{ff}",
        ] {
            assert!(!local.host(host.as_bytes()), "{host}");
        }
    }

    #[test]
    fn allowed_hosts_match_without_case_or_port() {
        let local = names(&["Keys.Internal", "10.0.0.5", "[fd00::1]", "fd00::2"]);
        for host in [
            "keys.internal",
            "KEYS.INTERNAL:443",
            "10.0.0.5:8080",
            "[fd00::1]:80",
            "[FD00::2]",
        ] {
            assert!(local.host(host.as_bytes()), "{host}");
        }
        assert!(!local.host(b"sub.keys.internal"));
        assert!(!local.host(b"10.0.0.6"));
        for bad in [
            "keys.internal:8080",
            "http://keys.internal",
            "a@b",
            "",
            "a/b",
        ] {
            assert!(bad.parse::<HostName>().is_err(), "{bad}");
        }
    }

    #[test]
    fn origins_are_local_pages_only() {
        let local = names(&["keys.internal"]);
        for origin in [
            "http://localhost",
            "https://localhost:8443",
            "http://127.0.0.1:8080",
            "http://[::1]:3000",
            "https://keys.internal",
        ] {
            assert!(local.origin(origin.as_bytes()), "{origin}");
        }
        for origin in [
            "null",
            "http://evil.example",
            "http://localhost.evil.example",
            "file://",
            "ftp://localhost",
            "http://localhost/path",
            "localhost",
            "http://user@localhost",
        ] {
            assert!(!local.origin(origin.as_bytes()), "{origin}");
        }
    }
}
