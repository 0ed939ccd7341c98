//! The model: the event log folded into each account's keys over time, as the server's
//! `keys_at` answers them; and the checks of answers against it.

use std::collections::{BTreeMap, HashMap};

use reqwest::Method;
use serde_json::Value;

use super::driver::History;
use super::events::Observed;
use super::{Call, Clock, FAULT_GRACE_MS, LAG_MS, Violation};

/// How far the test's clock may read behind the servers' (whole milliseconds of the
/// wall clock at its start, plus whole milliseconds of a monotonic clock since): an answer
/// switched by a server's clock may be received up to this much before the switch.
const CLOCK_MS: i64 = 2;

/// Key index -> (key, pending switch: (old key, or none for a key new at the switch,
/// switch_at)).
pub type Keys = BTreeMap<i64, (u128, Option<(Option<u128>, i64)>)>;

/// What a lookup answers: the keys in force and the next ones with their switch time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct View {
    pub keys: Vec<u128>,
    pub next: Option<(Vec<u128>, i64)>,
}

/// `keys` as producers must use them at `now`, exactly as the server's `keys_at`.
pub fn view(keys: &Keys, now: i64) -> View {
    let first = (keys.values())
        .filter_map(|(_, s)| s.filter(|s| s.1 > now).map(|s| s.1))
        .min();
    let after = |moment: i64| -> Vec<u128> {
        (keys.values())
            .filter_map(|(key, s)| match s {
                Some((from, at)) if *at > moment => *from,
                _ => Some(*key),
            })
            .collect()
    };
    View {
        keys: after(now),
        next: first.map(|at| (after(at), at)),
    }
}

/// An account's keys from one event on: committed within `[lo, hi]`.
#[derive(Debug, Clone)]
struct Version {
    lo: i64,
    hi: i64,
    keys: Option<Keys>,
}

pub struct Model {
    accounts: HashMap<String, Vec<Version>>,
    events: Vec<Observed>,
}

impl Model {
    pub fn fold(events: &[Observed]) -> Model {
        let mut accounts: HashMap<String, Vec<Version>> = HashMap::new();
        for e in events {
            let Some(account) = &e.account else { continue };
            let versions = accounts.entry(account.clone()).or_default();
            let mut keys = versions
                .last()
                .and_then(|v| v.keys.clone())
                .unwrap_or_default();
            match e.kind.as_str() {
                "allocate" => {
                    // A key a fanout raised by load added takes over at its switch.
                    let pending = (e.switch_at).filter(|&at| at > e.at).map(|at| (None, at));
                    keys.insert(e.index, (e.after.unwrap(), pending));
                }
                "release" => {
                    keys.remove(&e.index);
                }
                "move" => {
                    let switch_at = e.switch_at.unwrap_or(e.at);
                    let pending = (switch_at > e.at).then_some((e.before, switch_at));
                    keys.insert(e.index, (e.after.unwrap(), pending));
                }
                _ => continue,
            }
            let keys = (!keys.is_empty()).then_some(keys);
            versions.push(Version {
                lo: e.lo,
                hi: e.hi,
                keys,
            });
        }
        Model {
            accounts,
            events: events.to_vec(),
        }
    }

    /// The account's keys after every event.
    pub fn now(&self, account: &str) -> Option<&Keys> {
        self.accounts.get(account)?.last()?.keys.as_ref()
    }

    /// Every account the log ever named.
    pub fn names(&self) -> impl Iterator<Item = &String> {
        self.accounts.keys()
    }

    /// The largest instant in `[from, to]` at which the model could have answered `seen`
    /// for `account`, if any, by a replica whose clock runs up to `lead` ms ahead: it
    /// answers the keys in force at that instant as they stand by its own clock (DESIGN:
    /// lookups switch by the replica's clock; only who holds a key must not depend on it).
    fn matches(
        &self,
        account: &str,
        seen: &Option<View>,
        from: i64,
        to: i64,
        lead: i64,
    ) -> Option<i64> {
        let none = Vec::new();
        let versions = self.accounts.get(account).unwrap_or(&none);
        // Version j is in force from its commit (at the earliest lo) until the next one's
        // (at the latest hi); before the first, the account had no keys.
        for j in (0..=versions.len()).rev() {
            let start = if j == 0 { i64::MIN } else { versions[j - 1].lo };
            let end = versions.get(j).map_or(i64::MAX, |v| v.hi);
            let (a, b) = (start.max(from), end.min(to));
            if a > b {
                continue;
            }
            let keys = if j == 0 {
                None
            } else {
                versions[j - 1].keys.as_ref()
            };
            let Some(keys) = keys else {
                if seen.is_none() {
                    return Some(b);
                }
                continue;
            };
            // A replica that has not yet applied the next version answers this one with its
            // switches ended by its own clock, up to when it answered: a version superseded
            // before its switch may be answered switched.
            let clock = to.saturating_add(lead).saturating_add(CLOCK_MS);
            let mut moments = vec![clock, b.saturating_add(lead), b, a];
            for (_, s) in keys.values() {
                if let Some((_, at)) = s
                    && a < *at
                    && *at <= clock
                {
                    moments.extend([*at, *at - 1]);
                }
            }
            moments.sort_unstable_by(|x, y| y.cmp(x));
            if let Some(t) = moments.into_iter().find(|&t| Some(view(keys, t)) == *seen) {
                return Some(t.min(b));
            }
        }
        None
    }

    /// Which account held `key` (now or as a pending old key) at `at`, besides `but`.
    fn holder(&self, key: u128, at: i64, but: &str) -> Option<String> {
        self.accounts.iter().find_map(|(name, versions)| {
            let v = versions.iter().rev().find(|v| v.lo <= at)?;
            let held = v.keys.as_ref()?.values().any(|(k, s)| {
                *k == key || s.is_some_and(|(from, switch)| from == Some(key) && switch > at)
            });
            (held && name != but).then(|| name.clone())
        })
    }

    /// (a) The log itself: no key held by two accounts at once, pending old keys included
    /// until their switch (by true time: a commit that certainly came before the switch).
    pub fn exclusive(&self, clock: &Clock) -> Vec<Violation> {
        let mut current: HashMap<u128, (String, i64)> = HashMap::new();
        let mut pending: HashMap<u128, (String, i64)> = HashMap::new();
        let mut out = Vec::new();
        for e in &self.events {
            let Some(account) = &e.account else { continue };
            let take = |current: &mut HashMap<u128, (String, i64)>,
                        pending: &HashMap<u128, (String, i64)>,
                        key: u128,
                        out: &mut Vec<Violation>| {
                let holder = (current.get(&key).filter(|h| h.0 != *account).cloned())
                    .or_else(|| pending.get(&key).filter(|p| p.1 > e.hi).cloned());
                if let Some((other, _)) = holder {
                    out.push(Violation {
                        check: "(a) no key held by two accounts",
                        what: format!(
                            "event {} ({}) gave {account}#{} key {key} at +{} ms while {other} held it",
                            e.id,
                            e.kind,
                            e.index,
                            clock.rel(e.hi)
                        ),
                    });
                }
                current.insert(key, (account.clone(), e.index));
            };
            match e.kind.as_str() {
                "allocate" => take(&mut current, &pending, e.after.unwrap(), &mut out),
                "release" => {
                    current.remove(&e.before.unwrap());
                    pending.retain(|_, p| !(p.0 == *account && p.1 > e.hi));
                }
                "move" => {
                    let (from, to) = (e.before.unwrap(), e.after.unwrap());
                    current.remove(&from);
                    take(&mut current, &pending, to, &mut out);
                    let switch_at = e.switch_at.unwrap_or(e.at);
                    if switch_at > e.at {
                        pending.insert(from, (account.clone(), switch_at));
                    }
                }
                _ => {}
            }
        }
        out
    }
}

/// The view a keys answer states, if it is one (200 or 201 with keys), or `None` for a 404.
pub fn answered(call: &Call) -> Option<Option<View>> {
    let keys = |v: &Value| -> Option<Vec<u128>> {
        (v.as_array()?.iter())
            .map(|k| k.as_str()?.parse().ok())
            .collect()
    };
    match call.status {
        404 if call.method == reqwest::Method::GET => Some(None),
        200 | 201 => {
            let now = keys(&call.answer["hash_keys"])?;
            let next = match &call.answer["next"] {
                Value::Object(n) => {
                    Some((keys(&n["hash_keys"])?, millis(n["switch_at"].as_str()?)))
                }
                _ => None,
            };
            Some(Some(View { keys: now, next }))
        }
        _ => None,
    }
}

fn millis(rfc3339: &str) -> i64 {
    let t = time::OffsetDateTime::parse(rfc3339, &time::format_description::well_known::Rfc3339)
        .expect("an RFC 3339 switch_at");
    (t.unix_timestamp_nanos() / 1_000_000) as i64
}

/// The shards of `keys` on the uniform map of `shards`: i starts at i * floor(2^128 / N).
pub fn shards_of(keys: &[u128], shards: u64) -> Vec<u64> {
    let step = u128::MAX / u128::from(shards)
        + u128::from(u128::MAX % u128::from(shards) == shards as u128 - 1);
    keys.iter()
        .map(|k| ((k / step) as u64).min(shards - 1))
        .collect()
}

/// (d) `keys` lie on min(K, S) distinct shards, each with ⌊K/S⌋ or ⌈K/S⌉ of them.
pub fn spread(keys: &[u128], shards: u64) -> Result<(), Vec<u64>> {
    let on = shards_of(keys, shards);
    let mut per: BTreeMap<u64, u64> = BTreeMap::new();
    on.iter().for_each(|s| *per.entry(*s).or_default() += 1);
    let k = keys.len() as u64;
    let (low, high) = (k / shards, k.div_ceil(shards));
    let distinct = per.len() as u64 == k.min(shards);
    let even = per.values().all(|&n| n >= low.max(1) && n <= high);
    if distinct && even { Ok(()) } else { Err(on) }
}

pub struct Judged {
    pub violations: Vec<Violation>,
    pub checked: u64,
    pub spreads: u64,
    pub max_lag: i64,
}

/// (a) every keys answer equals the model at some instant of its request, allowing the
/// follow bound (and a fast replica's lead); (d) every answer's keys, now and next, spread.
pub fn judge(history: &History, model: &Model) -> Judged {
    let mut j = Judged {
        violations: Vec::new(),
        checked: 0,
        spreads: 0,
        max_lag: 0,
    };
    let clock = &history.clock;
    // A settled outcome replays an answer of its time, not of when it was asked again.
    for call in (history.calls.iter()).filter(|c| c.path.starts_with("/keys/") && c.op != "settle")
    {
        let Some(seen) = answered(call) else { continue };
        let account = call.path.trim_start_matches("/keys/");
        if let Some(view) = &seen {
            for keys in std::iter::once(&view.keys).chain(view.next.as_ref().map(|n| &n.0)) {
                j.spreads += 1;
                if let Err(on) = spread(keys, history.primary_shards) {
                    j.violations.push(Violation {
                        check: "(d) a hot account's keys on distinct shards",
                        what: format!(
                            "{} {} {} on r{} at +{} ms: keys on shards {on:?} of {} ({})",
                            call.method,
                            call.path,
                            call.body.as_ref().map_or(String::new(), Value::to_string),
                            call.replica,
                            clock.rel(call.sent),
                            history.primary_shards,
                            call.answer
                        ),
                    });
                }
            }
        }
        if call.op == "quiet" {
            continue;
        }
        j.checked += 1;
        let skew = history.skew_ms[call.replica];
        // A fault may hold a follower back (a killed connection, a restart) until it ends;
        // not a pause: a resumed replica reads the log before it answers.
        let disturbed = history.faults.iter().any(|f| {
            !f.kind.starts_with("pause")
                && f.replica.is_none_or(|r| r == call.replica)
                && f.from <= call.received
                && call.sent - LAG_MS <= f.until + FAULT_GRACE_MS
        });
        let lag = LAG_MS + if disturbed { FAULT_GRACE_MS } else { 0 };
        let (from, to) = (call.sent - lag, call.received);
        match model.matches(account, &seen, from, to, skew) {
            Some(t) => j.max_lag = j.max_lag.max(call.sent - t),
            None => {
                let lead = model
                    .matches(account, &seen, i64::MIN, to, skew)
                    .map(|t| call.sent - t);
                let others: Vec<String> = (seen.iter())
                    .flat_map(|v| v.keys.iter().chain(v.next.iter().flat_map(|n| n.0.iter())))
                    .filter_map(|k| {
                        model
                            .holder(*k, call.sent, account)
                            .map(|h| format!("{k} was {h}'s"))
                    })
                    .collect();
                j.violations.push(Violation {
                    check: "(a) every answer agrees with the log (no key answered for two accounts)",
                    what: format!(
                        "{} {} on r{} at +{} ms answered {} {}; the log says {:?}; {}; {}",
                        call.method,
                        call.path,
                        call.replica,
                        clock.rel(call.sent),
                        call.status,
                        call.answer,
                        model.now_at(account, call.sent),
                        match lead {
                            Some(ms) => format!("that was the log {ms} ms before"),
                            None => "the log never said so".to_owned(),
                        },
                        if others.is_empty() { "no other account held those keys".to_owned() } else { others.join(", ") }
                    ) + &story(history, account, &seen, call),
                });
            }
        }
    }
    j
}

/// What the log and the calls say around a wrong answer: the account's events and those
/// of any key it answered, and the calls that changed the account, up to 2 s after.
fn story(history: &History, account: &str, seen: &Option<View>, call: &Call) -> String {
    let clock = &history.clock;
    let keys: Vec<u128> = (seen.iter())
        .flat_map(|v| v.keys.iter().chain(v.next.iter().flat_map(|n| n.0.iter())))
        .copied()
        .collect();
    let until = call.received + 2_000;
    let touches = |e: &Observed| {
        e.account.as_deref() == Some(account)
            || [e.before, e.after]
                .iter()
                .flatten()
                .any(|k| keys.contains(k))
    };
    let mut events: Vec<String> = (history.events.iter())
        .filter(|e| e.lo <= until && touches(e))
        .map(|e| {
            format!(
                "#{} +{}..+{} {} {} [{}] {:?}->{:?} switch_at {:?}",
                e.id,
                clock.rel(e.lo),
                clock.rel(e.hi),
                e.kind,
                e.account.as_deref().unwrap_or("-"),
                e.index,
                e.before,
                e.after,
                e.switch_at.map(|t| clock.rel(t)),
            )
        })
        .collect();
    events.drain(..events.len().saturating_sub(16));
    let mut calls: Vec<String> = (history.calls.iter())
        .filter(|c| c.method != Method::GET && c.path.ends_with(&format!("/{account}")))
        .filter(|c| c.sent <= until)
        .map(|c| {
            format!(
                "{} {} {} on r{} +{}..+{}: {} {}",
                c.method,
                c.path,
                c.body.as_ref().map_or(String::new(), Value::to_string),
                c.replica,
                clock.rel(c.sent),
                clock.rel(c.received),
                c.status,
                c.answer
            )
        })
        .collect();
    calls.drain(..calls.len().saturating_sub(8));
    format!(
        "\n    the log's events for {account} and those keys:\n      {}\n    the calls that changed it:\n      {}",
        events.join("\n      "),
        calls.join("\n      ")
    )
}

impl Model {
    /// The account's view at `at` by the latest version committed for sure by then.
    pub fn now_at(&self, account: &str, at: i64) -> Option<View> {
        let v = self
            .accounts
            .get(account)?
            .iter()
            .rev()
            .find(|v| v.hi <= at)?;
        v.keys.as_ref().map(|k| view(k, at))
    }
}
