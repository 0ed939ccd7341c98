//! The budget of refused credentials per host (`--auth-failures-per-minute`).

use std::time::{Duration, Instant};

use ipnet::IpNet;

use super::{Buckets, Extra, OVERFLOW};
use crate::http::client::Client;

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
/// passed from it within the last 10 minutes: if any other token were checked, a guess
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

    /// Whether `name` passed from `client`'s host within the last 10 minutes.
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

/// Where hosts past the most one limiter tracks are counted together.
fn overflow() -> Option<IpNet> {
    Some(IpNet::from(OVERFLOW))
}

#[cfg(test)]
mod tests {
    use std::net::IpAddr;

    use super::super::MAX_CLIENTS;
    use super::*;

    fn ip(n: u32) -> Client {
        Client::Address(IpAddr::V4(std::net::Ipv4Addr::from(n)))
    }

    #[test]
    fn zero_rate_disables() {
        assert!(CredentialBudget::new(0, 10).is_none());
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
