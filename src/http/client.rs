//! Which client sent a request: the peer of the connection, or, when that peer is a proxy
//! the operator trusts, the client its `X-Forwarded-For` names.
//!
//! Each proxy appends the address it received the request from, so the header reads
//! `client, proxy1, proxy2` and the peer is the last proxy. Only entries added by trusted
//! proxies can be believed: walking from the right, the first address that is not a trusted
//! proxy is the client. Anything left of it was written by that client and may be forged.
//! An entry that is not an address stops the walk at an unknown, remote client.

use std::net::{IpAddr, SocketAddr};

use axum::http::HeaderMap;
use ipnet::IpNet;

const X_FORWARDED_FOR: &str = "x-forwarded-for";

/// Who sent a request, as far as it can be told.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Client {
    /// The peer, or the client a trusted proxy named.
    Address(IpAddr),
    /// A trusted proxy relayed the request for an entry that is not an address: a remote
    /// client that cannot be traced, never the proxy itself.
    Unknown,
    /// A peer that is not a trusted proxy says it relayed the request (it carries a
    /// forwarding header): the client is somewhere behind it, so remote, even when the
    /// peer is a proxy on this host. Counted against the peer's rate limit.
    Relayed(IpAddr),
}

impl Client {
    /// Whether the client is on the server's own host.
    pub fn is_loopback(self) -> bool {
        matches!(self, Client::Address(ip) if ip.is_loopback())
    }

    /// The addresses one host holds, where its refused credentials are counted: an IPv4
    /// address, or an IPv6 /64 (a host is given a whole /64 and may send from any address
    /// in it). `None` for the clients no proxy could name, who share one count.
    pub fn block(self) -> Option<IpNet> {
        let ip = match self {
            Client::Address(ip) | Client::Relayed(ip) => ip.to_canonical(),
            Client::Unknown => return None,
        };
        let prefix = if ip.is_ipv4() { 32 } else { 64 };
        IpNet::new(ip, prefix).ok().map(|net| net.trunc())
    }
}

/// The proxies and load balancers allowed to name the client in `X-Forwarded-For`.
#[derive(Debug, Clone, Default)]
pub struct TrustedProxies {
    networks: Vec<IpNet>,
}

impl TrustedProxies {
    pub fn new(networks: Vec<IpNet>) -> TrustedProxies {
        TrustedProxies { networks }
    }

    fn trusts(&self, address: IpAddr) -> bool {
        self.networks.iter().any(|net| net.contains(&address))
    }

    /// The client of a request that arrived from `peer` with `headers`.
    pub fn client(&self, peer: IpAddr, headers: &HeaderMap) -> Client {
        let mut client = peer.to_canonical();
        if !self.trusts(client) {
            return match says_relayed(headers) {
                true => Client::Relayed(client),
                false => Client::Address(client),
            };
        }
        // Every `X-Forwarded-For` line, in order, is one list. Split as bytes: an entry
        // that is not ASCII must not hide the readable ones beside it.
        let hops = headers
            .get_all(X_FORWARDED_FOR)
            .iter()
            .flat_map(|line| line.as_bytes().split(|byte| *byte == b','))
            .collect::<Vec<_>>();
        for hop in hops.iter().rev() {
            // A trusted proxy vouched for this entry, and it names no address: whoever
            // wrote it is somewhere beyond the proxy.
            let Some(address) = parse_hop(hop) else {
                return Client::Unknown;
            };
            client = address;
            if !self.trusts(address) {
                break;
            }
        }
        Client::Address(client)
    }
}

/// Whether a request says a proxy relayed it: `Forwarded`, `Via`, `X-Real-IP` or any
/// `X-Forwarded-*` (`-For`, `-Host`, `-Proto`...), the headers proxies add.
pub fn says_relayed(headers: &HeaderMap) -> bool {
    headers.keys().any(|name| {
        let name = name.as_str(); // lower case, as `http` keeps names
        matches!(name, "forwarded" | "via" | "x-real-ip") || name.starts_with("x-forwarded-")
    })
}

/// An `X-Forwarded-For` entry: an address, with a port as some proxies write it.
fn parse_hop(hop: &[u8]) -> Option<IpAddr> {
    let hop = std::str::from_utf8(hop).ok()?.trim();
    hop.parse::<IpAddr>()
        .or_else(|_| hop.parse::<SocketAddr>().map(|s| s.ip()))
        .ok()
        .map(|ip| ip.to_canonical())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::parse_network;
    use axum::http::HeaderValue;

    fn proxies(list: &[&str]) -> TrustedProxies {
        TrustedProxies::new(list.iter().map(|s| parse_network(s).unwrap()).collect())
    }

    fn forwarded(lines: &[&str]) -> HeaderMap {
        let mut headers = HeaderMap::new();
        for line in lines {
            headers.append(X_FORWARDED_FOR, line.parse().unwrap());
        }
        headers
    }

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    fn at(text: &str) -> Client {
        Client::Address(ip(text))
    }

    #[test]
    fn an_untrusted_peer_is_the_client_whatever_it_forwards() {
        let trusted = proxies(&["10.0.0.0/8"]);
        let headers = forwarded(&["127.0.0.1"]);
        let relayed = |text| Client::Relayed(ip(text));
        assert_eq!(
            trusted.client(ip("203.0.113.9"), &headers),
            relayed("203.0.113.9")
        );
        let nobody = TrustedProxies::default();
        assert_eq!(nobody.client(ip("10.0.0.1"), &headers), relayed("10.0.0.1"));
        // A proxy on this host that is not trusted relays remote clients, whatever it says.
        assert_eq!(
            nobody.client(ip("127.0.0.1"), &headers),
            relayed("127.0.0.1")
        );
        assert!(!nobody.client(ip("127.0.0.1"), &headers).is_loopback());
        assert_eq!(
            nobody.client(ip("127.0.0.1"), &HeaderMap::new()),
            at("127.0.0.1")
        );
    }

    #[test]
    fn any_forwarding_header_says_relayed() {
        for name in [
            "X-Forwarded-For",
            "x-forwarded-host",
            "X-Forwarded-Proto",
            "Forwarded",
            "Via",
            "X-Real-IP",
        ] {
            let mut headers = HeaderMap::new();
            headers.insert(
                axum::http::HeaderName::from_bytes(name.as_bytes()).unwrap(),
                HeaderValue::from_static("x"),
            );
            assert!(says_relayed(&headers), "{name}");
        }
        let mut headers = HeaderMap::new();
        headers.insert("x-request-id", HeaderValue::from_static("x"));
        headers.insert("origin", HeaderValue::from_static("http://127.0.0.1"));
        assert!(!says_relayed(&headers));
    }

    #[test]
    fn a_trusted_peer_names_the_first_untrusted_hop_from_the_right() {
        let trusted = proxies(&["10.0.0.0/8", "127.0.0.1"]);
        // The client forged the leftmost entry; the load balancer appended the real one.
        let headers = forwarded(&["192.0.2.1, 198.51.100.7, 10.1.2.3"]);
        assert_eq!(
            trusted.client(ip("127.0.0.1"), &headers),
            at("198.51.100.7")
        );
        // The same list over several header lines.
        let lines = forwarded(&["192.0.2.1", "198.51.100.7", "10.1.2.3"]);
        assert_eq!(trusted.client(ip("127.0.0.1"), &lines), at("198.51.100.7"));
    }

    #[test]
    fn when_every_hop_is_trusted_the_leftmost_is_the_client() {
        let trusted = proxies(&["10.0.0.0/8"]);
        let headers = forwarded(&["10.9.9.9, 10.1.1.1"]);
        assert_eq!(trusted.client(ip("10.0.0.1"), &headers), at("10.9.9.9"));
        // No header: the proxy itself.
        assert_eq!(
            trusted.client(ip("10.0.0.1"), &HeaderMap::new()),
            at("10.0.0.1")
        );
    }

    #[test]
    fn garbage_from_the_right_is_an_unknown_client_never_a_proxy() {
        let trusted = proxies(&["10.0.0.0/8"]);
        let headers = forwarded(&["198.51.100.7, unknown, 10.1.1.1"]);
        assert_eq!(trusted.client(ip("10.0.0.1"), &headers), Client::Unknown);
        let headers = forwarded(&["198.51.100.7, not-an-address"]);
        assert_eq!(trusted.client(ip("10.0.0.1"), &headers), Client::Unknown);
        // Garbage left of the first untrusted entry is never reached.
        let headers = forwarded(&["not-an-address, 198.51.100.7, 10.1.1.1"]);
        assert_eq!(trusted.client(ip("10.0.0.1"), &headers), at("198.51.100.7"));
    }

    #[test]
    fn an_unreadable_entry_is_a_remote_client_never_the_proxy() {
        let trusted = proxies(&["127.0.0.1"]);
        for (raw, expected) in [
            (&b"\xff, 203.0.113.9"[..], at("203.0.113.9")),
            (b"198.51.100.7, \xff", Client::Unknown),
            (b"\xff", Client::Unknown),
            (b"\xff, 127.0.0.1", Client::Unknown),
            (b"unknown", Client::Unknown),
            (b"", Client::Unknown),
            (b"203.0.113.9, , 127.0.0.1", Client::Unknown),
        ] {
            let mut headers = HeaderMap::new();
            headers.insert(X_FORWARDED_FOR, HeaderValue::from_bytes(raw).unwrap());
            let client = trusted.client(ip("127.0.0.1"), &headers);
            assert_eq!(client, expected, "{raw:?}");
            assert!(!client.is_loopback(), "{raw:?} made {client:?} local");
        }
    }

    #[test]
    fn ports_and_ipv6_are_understood() {
        let trusted = proxies(&["::1", "fd00::/8"]);
        let headers = forwarded(&["[2001:db8::5]:4711, 198.51.100.7:80, fd00::2"]);
        assert_eq!(trusted.client(ip("::1"), &headers), at("198.51.100.7"));
        // An IPv4 peer seen through an IPv6 socket is the same address.
        let v4 = proxies(&["127.0.0.1"]);
        let mapped = ip("::ffff:127.0.0.1");
        assert_eq!(
            v4.client(mapped, &forwarded(&["192.0.2.8"])),
            at("192.0.2.8")
        );
    }

    #[test]
    fn a_host_is_its_ipv4_address_or_its_ipv6_64() {
        let block = |text: &str| at(text).block().unwrap().to_string();
        assert_eq!(block("2001:db8:1:2::7"), "2001:db8:1:2::/64");
        assert_eq!(
            at("2001:db8:1:2::7").block(),
            at("2001:db8:1:2:ffff:ffff:ffff:ffff").block()
        );
        assert_ne!(at("2001:db8:1:2::7").block(), at("2001:db8:1:3::7").block());
        assert_ne!(at("2001:db8:1:2::7").block(), at("2001:db8:2:2::7").block());
        assert_eq!(block("198.51.100.7"), "198.51.100.7/32");
        assert_ne!(at("198.51.100.7").block(), at("198.51.100.8").block());
        // An IPv4 client seen through an IPv6 socket is that IPv4 address, not a /64.
        assert_eq!(
            at("::ffff:198.51.100.7").block(),
            at("198.51.100.7").block()
        );
        // A client relayed by an untrusted proxy counts as the proxy's address.
        assert_eq!(
            Client::Relayed(ip("2001:db8::1")).block(),
            at("2001:db8::2").block()
        );
        assert_eq!(Client::Unknown.block(), None);
    }

    #[test]
    fn networks_parse_with_or_without_a_prefix() {
        assert_eq!(
            parse_network("10.0.0.0/8").unwrap().to_string(),
            "10.0.0.0/8"
        );
        assert_eq!(
            parse_network(" 127.0.0.1 ").unwrap().to_string(),
            "127.0.0.1/32"
        );
        assert_eq!(parse_network("::1").unwrap().to_string(), "::1/128");
        assert!(parse_network("10.0.0.0/33").is_err());
        assert!(parse_network("localhost").is_err());
    }
}
