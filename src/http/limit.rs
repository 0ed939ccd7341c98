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

use ipnet::IpNet;

use super::client::Client;

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

/// How long a grant that authenticated from a host still passes there over its budget.
const REMEMBERED: Duration = Duration::from_secs(600);

/// Most grants remembered per host (a host may run a producer, a consumer and a
/// dashboard); one more replaces the least recent.
const MAX_GRANTS: usize = 4;

/// The names of the grants that authenticated from one host, with when they last did.
#[derive(Debug, Default)]
struct Recent(Vec<(Box<str>, Instant)>);

impl Recent {
    fn remember(&mut self, name: &str, now: Instant) {
        if let Some(seen) = self.0.iter_mut().find(|(known, _)| **known == *name) {
            seen.1 = now;
            return;
        }
        if self.0.len() >= MAX_GRANTS
            && let Some(oldest) = (0..self.0.len()).min_by_key(|&i| self.0[i].1)
        {
            self.0.swap_remove(oldest);
        }
        self.0.push((name.into(), now));
    }

    /// Whether `name` authenticated within [`REMEMBERED`]; if so, it did again `now`.
    fn knows(&mut self, name: &str, now: Instant) -> bool {
        let seen = self.0.iter_mut().find(|(known, at)| {
            **known == *name && now.saturating_duration_since(*at) < REMEMBERED
        });
        seen.map(|seen| seen.1 = now).is_some()
    }
}

impl Extra for Recent {
    fn in_use(&self, now: Instant) -> bool {
        (self.0.iter()).any(|(_, at)| now.saturating_duration_since(*at) < REMEMBERED)
    }
}

/// The budget of refused credentials per host ([`Client::block`]): a try is taken before a
/// request's credentials are checked, kept when they are refused (401), given back when
/// they pass. Over budget, a host's credentials are not checked, but for the grants that
/// passed from it within the last [`REMEMBERED`]: if any other token were checked, a guess
/// that hits would stand out among the 429s, and the budget would not slow guessing at
/// all. The price, for hosts that share an address with a guesser (behind one NAT): a
/// token not used from it in that time waits for the budget like a guess, and the guesser
/// is not slowed on the tokens that were.
#[derive(Debug)]
pub struct CredentialBudget {
    buckets: Buckets<Option<IpNet>, Recent>,
}

/// A try taken from a host's budget, to keep (a refusal) or give back.
#[derive(Debug)]
#[must_use = "a try is kept only for a refusal: give it back otherwise"]
pub struct Try {
    block: Option<IpNet>,
}

impl CredentialBudget {
    /// `per_minute` refusals a minute per host, in bursts of `burst`; `None` when
    /// `per_minute` is 0 (no such budget).
    pub fn new(per_minute: u32, burst: u32) -> Option<CredentialBudget> {
        (per_minute > 0).then(|| CredentialBudget {
            buckets: Buckets::new(f64::from(per_minute) / 60.0, burst),
        })
    }

    /// Takes a try from `client`'s host; when it has none, answers how long until it has.
    pub fn take(&self, client: Client) -> Result<Try, Duration> {
        self.take_at(client.block(), Instant::now())
    }

    /// The credentials `taken` was for passed as `name`: the try goes back, and `name` will
    /// pass from that host over budget.
    pub fn passed(&self, taken: Try, name: &str) {
        self.settle(taken, Some(name), Instant::now());
    }

    /// The credentials `taken` was for were neither right nor wrong (a malformed header).
    pub fn give_back(&self, taken: Try) {
        self.settle(taken, None, Instant::now());
    }

    /// Whether `name` passed from `client`'s host within the last [`REMEMBERED`].
    pub fn knows(&self, client: Client, name: &str) -> bool {
        self.knows_at(client.block(), name, Instant::now())
    }

    fn take_at(&self, block: Option<IpNet>, now: Instant) -> Result<Try, Duration> {
        let rate = self.buckets.rate;
        (self.buckets).with(block, overflow(), now, |block, bucket| {
            bucket.take(rate).map(|()| Try { block })
        })
    }

    fn settle(&self, taken: Try, name: Option<&str>, now: Instant) {
        let burst = self.buckets.burst;
        (self.buckets).with(taken.block, overflow(), now, |block, entry| {
            entry.tokens = (entry.tokens + 1.0).min(burst);
            // Hosts counted together remember nothing: one would pass for the others.
            if let Some(name) = name.filter(|_| block != overflow()) {
                entry.extra.remember(name, now);
            }
        });
    }

    fn knows_at(&self, block: Option<IpNet>, name: &str, now: Instant) -> bool {
        (self.buckets).with(block, overflow(), now, |block, entry| {
            block != overflow() && entry.extra.knows(name, now)
        })
    }

    /// Hosts currently tracked.
    pub fn tracked(&self) -> usize {
        self.buckets.tracked()
    }
}

/// Where hosts past [`MAX_CLIENTS`] are counted together.
fn overflow() -> Option<IpNet> {
    Some(IpNet::from(OVERFLOW))
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
        assert!(CredentialBudget::new(0, 10).is_none());
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

    fn host(text: &str) -> Option<IpNet> {
        Client::Address(text.parse().unwrap()).block()
    }

    /// Refusals spend the budget; passes give their try back.
    #[test]
    fn only_refused_credentials_spend_the_budget() {
        let budget = CredentialBudget::new(60, 3).unwrap();
        let (a, t0) = (host("2001:db8::1"), Instant::now());
        for _ in 0..100 {
            let taken = budget.take_at(a, t0).unwrap();
            budget.settle(taken, Some("producers"), t0);
            let taken = budget.take_at(a, t0).unwrap();
            budget.settle(taken, None, t0);
        }
        for _ in 0..3 {
            drop(budget.take_at(a, t0).unwrap()); // refused: kept
        }
        let wait = budget.take_at(a, t0).unwrap_err();
        assert!(wait > Duration::from_millis(900) && wait <= Duration::from_secs(1));
        // Another host has its own budget; a second brings one try back.
        assert!(budget.take_at(host("2001:db8:0:1::1"), t0).is_ok());
        assert!(budget.take_at(a, t0 + Duration::from_secs(1)).is_ok());
    }

    /// Over budget, only names that passed from the host recently are let through, and only
    /// so many of them are kept.
    #[test]
    fn names_that_passed_are_remembered_for_a_while_and_a_few_per_host() {
        let budget = CredentialBudget::new(60, 1).unwrap();
        let (a, t0) = (host("198.51.100.7"), Instant::now());
        let pass = |name: &str, at: Instant| {
            let taken = budget.take_at(a, at).unwrap();
            budget.settle(taken, Some(name), at);
        };
        pass("producers", t0);
        assert!(budget.knows_at(a, "producers", t0));
        assert!(!budget.knows_at(a, "ops", t0));
        assert!(!budget.knows_at(host("198.51.100.8"), "producers", t0));
        // Still known while it keeps passing; forgotten once it has not for REMEMBERED.
        let later = t0 + REMEMBERED - Duration::from_secs(1);
        assert!(budget.knows_at(a, "producers", later));
        assert!(budget.knows_at(a, "producers", later + REMEMBERED / 2));
        assert!(!budget.knows_at(a, "producers", later + REMEMBERED * 2));
        // A fifth name replaces the least recent of four.
        let t1 = t0 + REMEMBERED * 3;
        for (i, name) in ["a", "b", "c", "d", "e"].into_iter().enumerate() {
            pass(name, t1 + Duration::from_secs(i as u64 + 1));
        }
        let t2 = t1 + Duration::from_secs(10);
        assert!(!budget.knows_at(a, "a", t2));
        for name in ["b", "c", "d", "e"] {
            assert!(budget.knows_at(a, name, t2), "{name}");
        }
    }

    /// Hosts that remember a name stay past a sweep; hosts past the cap share one budget
    /// and remember nothing, so none passes for another.
    #[test]
    fn memory_stays_bounded_and_crowded_hosts_remember_nothing() {
        let budget = CredentialBudget::new(60, 2).unwrap();
        let t0 = Instant::now();
        let known = host("2001:db8::1");
        let taken = budget.take_at(known, t0).unwrap();
        budget.settle(taken, Some("producers"), t0);
        for n in 0..MAX_CLIENTS as u32 + 10 {
            let _ = budget.take_at(ip(n).block(), t0);
        }
        assert!(budget.tracked() <= MAX_CLIENTS + 1);
        let crowded = ip(MAX_CLIENTS as u32 + 5).block();
        let taken = budget.take_at(crowded, t0);
        if let Ok(taken) = taken {
            budget.settle(taken, Some("ops"), t0);
        }
        assert!(!budget.knows_at(crowded, "ops", t0));
        // A minute later the refilled hosts are swept; the one that remembers stays.
        let later = t0 + Duration::from_secs(60);
        assert!(budget.take_at(host("2001:db8:9::1"), later).is_ok());
        assert_eq!(budget.tracked(), 2);
        assert!(budget.knows_at(known, "producers", later));
    }
}
