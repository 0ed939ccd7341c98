//! The names under which a server without a token answers: loopback names and addresses,
//! and those the operator lists in `--allowed-hosts`.
//!
//! Without a token, being on the server's host is the only credential, and a browser on
//! that host carries pages of any site. A page elsewhere may post a form here (its
//! `Origin` gives it away), or rebind its own name to 127.0.0.1 and read the answers (its
//! name arrives as `Host`). Matching ignores case, ports and a final dot.

use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;

use axum::http::Uri;
use axum::http::uri::Authority;

/// A name or address in `--allowed-hosts`, lower case, without brackets or port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostName(String);

impl FromStr for HostName {
    type Err = String;

    fn from_str(text: &str) -> Result<HostName, String> {
        let text = text.trim();
        // A bare IPv6 address would read as a host with a port.
        let bare_ipv6 = text.parse::<std::net::Ipv6Addr>().is_ok();
        let authority = Authority::from_str(text).ok().filter(|a| {
            bare_ipv6 || (a.port().is_none() && !a.as_str().contains('@') && !a.host().is_empty())
        });
        let host = if bare_ipv6 {
            Some(text)
        } else {
            authority.as_ref().map(Authority::host)
        };
        host.map(|host| HostName(normalize(host)))
            .ok_or_else(|| format!("{text:?} is not a host name or address without a port"))
    }
}

impl fmt::Display for HostName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Lower case, without IPv6 brackets or one final dot.
fn normalize(host: &str) -> String {
    let host = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    host.strip_suffix('.').unwrap_or(host).to_ascii_lowercase()
}

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
        is_loopback(&host) || self.allowed.iter().any(|allowed| allowed.0 == host)
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
