//! Host names and networks as the flags give them (`--allowed-hosts`, `--trusted-proxies`).

use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;

use axum::http::uri::Authority;
use ipnet::IpNet;

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
        host.map(|host| HostName(normalize_host(host)))
            .ok_or_else(|| format!("{text:?} is not a host name or address without a port"))
    }
}

impl HostName {
    /// The name, normalized as [`normalize_host`] does.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for HostName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Lower case, without IPv6 brackets or one final dot.
pub fn normalize_host(host: &str) -> String {
    let host = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    host.strip_suffix('.').unwrap_or(host).to_ascii_lowercase()
}

/// A `--trusted-proxies` entry: a network (`10.0.0.0/8`) or one address (`127.0.0.1`).
pub fn parse_network(text: &str) -> Result<IpNet, String> {
    let text = text.trim();
    text.parse::<IpNet>()
        .or_else(|_| text.parse::<IpAddr>().map(IpNet::from))
        .map_err(|_| format!("{text:?} is neither an IP address nor a network such as 10.0.0.0/8"))
}
