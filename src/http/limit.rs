//! Per-client rate limits as token buckets: refused mutations per client IP address
//! (`--mutation-rate`), and refused credentials per host (`--auth-failures-per-minute`),
//! stricter, so that tokens cannot be guessed quickly. Clients a proxy could not name share
//! one bucket.
//!
//! Each limiter keeps its map behind one `std::sync::Mutex`, held for a few arithmetic
//! operations and never across an `.await`.

use std::collections::HashMap;
use std::hash::Hash;
use std::net::{IpAddr, Ipv6Addr};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::client::Client;

mod credentials;

pub use credentials::CredentialBudget;

/// Most clients one limiter tracks at once. Past it, idle entries are dropped first; if
/// every entry is still in use, newcomers share one, so memory stays bounded under a flood
/// of addresses.
const MAX_CLIENTS: usize = 100_000;

/// How often idle entries are swept even when the map is not full.
const SWEEP_EVERY: Duration = Duration::from_secs(60);

/// How often a full map is swept at most: each sweep walks every entry, so a flood of
/// newcomers must not make every request pay for one.
const SWEEP_FULL_EVERY: Duration = Duration::from_secs(1);

/// Where clients past [`MAX_CLIENTS`] are counted together: no real client's address.
const OVERFLOW: IpAddr = IpAddr::V6(Ipv6Addr::UNSPECIFIED);

/// A bucket, and what its client's entry keeps beside it.
#[derive(Debug)]
struct Entry<E> {
    tokens: f64,
    at: Instant,
    extra: E,
}

impl<E> Entry<E> {
    /// Takes a token; when there is none, answers how long until there is.
    fn take(&mut self, rate: f64) -> Result<(), Duration> {
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            Ok(())
        } else {
            Err(Duration::from_secs_f64((1.0 - self.tokens) / rate))
        }
    }
}

/// What an entry keeps besides its bucket.
trait Extra: Default {
    /// Whether the entry must stay although its bucket is full.
    fn in_use(&self, now: Instant) -> bool;
}

impl Extra for () {
    fn in_use(&self, _: Instant) -> bool {
        false
    }
}

/// Buckets of `burst` tokens that refill at `rate` a second, one per key.
#[derive(Debug)]
struct Buckets<K, E> {
    rate: f64,
    burst: f64,
    table: Mutex<Table<K, E>>,
}

#[derive(Debug)]
struct Table<K, E> {
    entries: HashMap<K, Entry<E>>,
    swept: Instant,
}

impl<K: Hash + Eq + Copy, E: Extra> Buckets<K, E> {
    /// A burst below 1 is taken as 1.
    fn new(rate: f64, burst: u32) -> Self {
        Buckets {
            rate,
            burst: f64::from(burst.max(1)),
            table: Mutex::new(Table {
                entries: HashMap::new(),
                swept: Instant::now(),
            }),
        }
    }

    /// Runs `f` on the entry of `key` (or of `overflow`, for a newcomer past
    /// [`MAX_CLIENTS`]) refilled to `now`, with the key whose entry it is.
    fn with<R>(
        &self,
        key: K,
        overflow: K,
        now: Instant,
        f: impl FnOnce(K, &mut Entry<E>) -> R,
    ) -> R {
        let mut table = self.table.lock().expect("rate limit lock poisoned");
        if now.saturating_duration_since(table.swept) >= SWEEP_EVERY {
            self.sweep(&mut table, now);
        }
        let mut key = key;
        if !table.entries.contains_key(&key) && table.entries.len() >= MAX_CLIENTS {
            if now.saturating_duration_since(table.swept) >= SWEEP_FULL_EVERY {
                self.sweep(&mut table, now);
            }
            if table.entries.len() >= MAX_CLIENTS {
                key = overflow;
            }
        }
        let entry = table.entries.entry(key).or_insert_with(|| Entry {
            tokens: self.burst,
            at: now,
            extra: E::default(),
        });
        let elapsed = now.saturating_duration_since(entry.at).as_secs_f64();
        entry.tokens = (entry.tokens + elapsed * self.rate).min(self.burst);
        entry.at = entry.at.max(now);
        f(key, entry)
    }

    /// Drops the entries whose bucket has refilled and that keep nothing else in use: a
    /// full bucket is the same as none.
    fn sweep(&self, table: &mut Table<K, E>, now: Instant) {
        let (rate, burst) = (self.rate, self.burst);
        table.entries.retain(|_, e| {
            let elapsed = now.saturating_duration_since(e.at).as_secs_f64();
            e.tokens + elapsed * rate < burst || e.extra.in_use(now)
        });
        table.swept = now;
    }

    fn tracked(&self) -> usize {
        let table = self.table.lock().expect("rate limit lock poisoned");
        table.entries.len()
    }
}

/// Token buckets: `rate` mutations per second per client, bursts of up to `burst`.
#[derive(Debug)]
pub struct MutationLimiter {
    buckets: Buckets<Client, ()>,
}

impl MutationLimiter {
    /// `None` when `rate` is 0 (no limit). A burst below 1 is taken as 1.
    pub fn new(rate: u32, burst: u32) -> Option<MutationLimiter> {
        (rate > 0).then(|| MutationLimiter {
            buckets: Buckets::new(f64::from(rate), burst),
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
        let rate = self.buckets.rate;
        let overflow = Client::Address(OVERFLOW);
        (self.buckets).with(client, overflow, now, |_, bucket| bucket.take(rate))
    }

    /// Clients currently tracked.
    pub fn tracked(&self) -> usize {
        self.buckets.tracked()
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
