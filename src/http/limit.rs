//! Per-client rate limit of mutations: a token bucket per client IP address (clients a
//! proxy could not name share one).
//!
//! Only mutations reach the map (each of them waits on a database commit anyway), so one
//! `std::sync::Mutex` around it costs nothing that matters; reads never touch it.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv6Addr};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::client::Client;

/// Most clients tracked at once. Past it, idle buckets are dropped first; if every bucket
/// is still in use, newcomers share one bucket, so memory stays bounded under a flood of
/// addresses.
const MAX_CLIENTS: usize = 100_000;

/// How often idle buckets are swept even when the map is not full.
const SWEEP_EVERY: Duration = Duration::from_secs(60);

/// Where clients past [`MAX_CLIENTS`] are counted together.
const OVERFLOW: Client = Client::Address(IpAddr::V6(Ipv6Addr::UNSPECIFIED));

#[derive(Debug, Clone, Copy)]
struct Bucket {
    tokens: f64,
    at: Instant,
}

#[derive(Debug)]
struct Buckets {
    clients: HashMap<Client, Bucket>,
    swept: Instant,
}

/// Token buckets: `rate` mutations per second per client, bursts of up to `burst`.
#[derive(Debug)]
pub struct MutationLimiter {
    rate: f64,
    burst: f64,
    buckets: Mutex<Buckets>,
}

impl MutationLimiter {
    /// `None` when `rate` is 0 (no limit). A burst below 1 is taken as 1.
    pub fn new(rate: u32, burst: u32) -> Option<MutationLimiter> {
        (rate > 0).then(|| MutationLimiter {
            rate: f64::from(rate),
            burst: f64::from(burst.max(1)),
            buckets: Mutex::new(Buckets {
                clients: HashMap::new(),
                swept: Instant::now(),
            }),
        })
    }

    /// Takes a token for `client`; when there is none, answers how long until there is.
    pub fn check(&self, client: Client) -> Result<(), Duration> {
        let client = match client {
            Client::Address(ip) => Client::Address(ip.to_canonical()),
            Client::Unknown => Client::Unknown,
            Client::Relayed(ip) => Client::Relayed(ip.to_canonical()),
        };
        self.check_at(client, Instant::now())
    }

    fn check_at(&self, client: Client, now: Instant) -> Result<(), Duration> {
        let mut buckets = self.buckets.lock().expect("rate limit lock poisoned");
        if now.duration_since(buckets.swept) >= SWEEP_EVERY {
            self.sweep(&mut buckets, now);
        }
        let mut key = client;
        if !buckets.clients.contains_key(&client) && buckets.clients.len() >= MAX_CLIENTS {
            self.sweep(&mut buckets, now);
            if buckets.clients.len() >= MAX_CLIENTS {
                key = OVERFLOW;
            }
        }
        let full = Bucket {
            tokens: self.burst,
            at: now,
        };
        let bucket = buckets.clients.entry(key).or_insert(full);
        let elapsed = now.duration_since(bucket.at).as_secs_f64();
        bucket.tokens = (bucket.tokens + elapsed * self.rate).min(self.burst);
        bucket.at = now;
        if bucket.tokens >= 1.0 {
            bucket.tokens -= 1.0;
            Ok(())
        } else {
            Err(Duration::from_secs_f64((1.0 - bucket.tokens) / self.rate))
        }
    }

    /// Drops the buckets that have refilled: a full bucket is the same as none.
    fn sweep(&self, buckets: &mut Buckets, now: Instant) {
        let (rate, burst) = (self.rate, self.burst);
        buckets
            .clients
            .retain(|_, b| b.tokens + now.duration_since(b.at).as_secs_f64() * rate < burst);
        buckets.swept = now;
    }

    /// Clients currently tracked.
    pub fn tracked(&self) -> usize {
        self.buckets
            .lock()
            .expect("rate limit lock poisoned")
            .clients
            .len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(n: u32) -> Client {
        Client::Address(IpAddr::V4(std::net::Ipv4Addr::from(n)))
    }

    #[test]
    fn bursts_then_the_rate() {
        let limiter = MutationLimiter::new(10, 3).unwrap();
        let t0 = Instant::now();
        for _ in 0..3 {
            assert!(limiter.check_at(ip(1), t0).is_ok());
        }
        let wait = limiter.check_at(ip(1), t0).unwrap_err();
        assert!(wait <= Duration::from_millis(100), "{wait:?}");
        // Another client has its own bucket, and so do the clients no proxy could name.
        assert!(limiter.check_at(ip(2), t0).is_ok());
        assert!(limiter.check_at(Client::Unknown, t0).is_ok());
        // A tenth of a second brings one token back.
        let t1 = t0 + Duration::from_millis(100);
        assert!(limiter.check_at(ip(1), t1).is_ok());
        assert!(limiter.check_at(ip(1), t1).is_err());
    }

    #[test]
    fn zero_rate_disables() {
        assert!(MutationLimiter::new(0, 10).is_none());
    }

    #[test]
    fn idle_clients_are_forgotten_and_memory_stays_bounded() {
        let limiter = MutationLimiter::new(1000, 2).unwrap();
        let t0 = Instant::now();
        for n in 0..MAX_CLIENTS as u32 + 10 {
            let _ = limiter.check_at(ip(n), t0);
        }
        assert!(limiter.tracked() <= MAX_CLIENTS + 1);
        // A second later every bucket has refilled: the next newcomer sweeps them away.
        let later = t0 + Duration::from_secs(1);
        assert!(limiter.check_at(ip(u32::MAX), later).is_ok());
        assert_eq!(limiter.tracked(), 1);
    }
}
