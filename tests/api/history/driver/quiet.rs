//! Quiet checks: no requests until every switch has passed and 1 s more; then every
//! replica must answer as the log and the table do.

use std::collections::BTreeMap;
use std::time::Duration;

use reqwest::Method;

use super::super::events::Observed;
use super::super::model::{Model, View, answered, view};
use super::super::{Clock, Violation};
use super::balance::Balance;
use super::{Driver, POOL};
use crate::helpers::Db;

/// How many times a quiet check is made before what it found counts, when events keep
/// overtaking it: once reports stop, the controller's moves stop within a few half-lives
/// and its last fanouts come down within twelve (1 s each, see `faults::CONTROLLER`).
const QUIET_ATTEMPTS: u32 = 15;

impl Driver {
    /// A replica back from an idle gap serves reads first (as a read-only pool would).
    pub(super) async fn reads_after_idle(&mut self, r: usize) {
        for _ in 0..6 {
            let a = self.account();
            self.call(r, "lookup", Method::GET, format!("/keys/{a}"), None)
                .await;
        }
    }

    /// (b) No requests until every switch has passed and 1 s more; then every replica
    /// answers every account as the log and the table do.
    pub(super) async fn quiet(&mut self) {
        for lock in self.locks.drain(..) {
            let joined = tokio::task::spawn_blocking(move || lock.join())
                .await
                .unwrap();
            joined.expect("the lock holder");
        }
        self.quiet_checks += 1;
        // The load controller may still act while the last reports fade: a check that a
        // new event overtook is void, and made again once its switch has passed.
        for attempt in 1.. {
            let (found, logged) = self.compare_when_quiet().await;
            self.watcher.catch_up(&self.url).await;
            if self.watcher.events().len() == logged || attempt == QUIET_ATTEMPTS {
                self.quiet_violations.extend(found);
                break;
            }
        }
        match self.leases_balanced().await {
            Balance::Unsettled => self.balance_unsettled += 1,
            Balance::Kept | Balance::Broken => self.balance_judged += 1,
        }
        let now = self.clock.now();
        self.quiet_at = None;
        self.next_quiet = now + 10_000 + self.below(8_000) as i64;
        self.idle_until.iter_mut().for_each(|t| *t = 0);
    }

    /// Waits until every switch has passed and 1 s more, then compares the table and every
    /// replica's answers with the log: the broken promises found, and how many events the
    /// log they were judged by held (the watcher goes on reading meanwhile).
    async fn compare_when_quiet(&mut self) -> (Vec<Violation>, usize) {
        let mut found = Vec::new();
        // Until the last event and every switch logged are 1 s old: a controller round may
        // log more while waiting (at most ten waits).
        for _ in 0..10 {
            self.watcher.catch_up(&self.url).await;
            let events = self.watcher.events();
            let last_switch = (events.iter().filter_map(|e| e.switch_at).max()).unwrap_or(0);
            let last_event = events.iter().map(|e| e.hi).max().unwrap_or(0);
            let wait = (last_switch + 100).max(last_event) + 1000 - self.clock.now();
            if wait <= 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(wait as u64)).await;
        }
        let events = self.watcher.events();
        let model = Model::fold(&events);
        let at = self.clock.now();
        let mut db = Db::connect(&self.url).await;
        let mut table: BTreeMap<String, Vec<u128>> = BTreeMap::new();
        for row in db.key_rows().await {
            table
                .entry(row.0)
                .or_default()
                .push(u128::from_be_bytes(row.2.try_into().unwrap()));
        }
        let mut names: Vec<String> = (0..POOL).map(|i| format!("acct-{i}")).collect();
        names.extend(model.names().cloned());
        names.sort();
        names.dedup();
        for name in &names {
            let logged = model.now(name).map(|k| view(k, at));
            if logged.as_ref().map(|v| &v.keys) != table.get(name) {
                found.push(Violation {
                    check: "(b) every replica equal to the database after 1 s of quiet",
                    what: format!(
                        "{name}: the log says {logged:?}, the table {:?}",
                        table.get(name)
                    ),
                });
            }
        }
        for r in 0..self.replicas.len() {
            for name in &names {
                self.call(r, "quiet", Method::GET, format!("/keys/{name}"), None)
                    .await;
                let call = self.calls.last().unwrap();
                let expected = model.now(name).map(|k| view(k, at));
                if answered(call) != Some(expected.clone()) {
                    found.push(Violation {
                        check: "(b) every replica equal to the database after 1 s of quiet",
                        what: format!(
                            "quiet check at +{} ms: r{r} answers {name} {} {}; the log and the table say {expected:?}",
                            self.clock.rel(at),
                            call.status,
                            call.answer,
                        ),
                    });
                }
            }
        }
        for mirror in &self.mirrors {
            found.extend(
                Self::compare_mirror(mirror, &self.clock, &model, &names, &events, at).await,
            );
        }
        (found, events.len())
    }

    /// (g) A producer's mirror, once it has followed the log to its last event, answers
    /// every account as the log does.
    async fn compare_mirror(
        mirror: &keyspread_client::Mirror,
        clock: &Clock,
        model: &Model,
        names: &[String],
        events: &[Observed],
        at: i64,
    ) -> Vec<Violation> {
        const CHECK: &str = "(g) a producer's mirror equal to the log after 1 s of quiet";
        let last = events.iter().map(|e| e.id).max().unwrap_or(0);
        // Caught up, and by a sync sent since (a long-poll sent before a pause of its
        // replica and answered after counts from when it was sent).
        let mut waited = 0;
        while (mirror.event_id() < last || mirror.lag() > mirror.max_age()) && waited < 3_000 {
            tokio::time::sleep(Duration::from_millis(20)).await;
            waited += 20;
        }
        if mirror.event_id() < last {
            return vec![Violation {
                check: CHECK,
                what: format!(
                    "quiet check at +{} ms: the mirror is at event {} of {last} after 3 s",
                    clock.rel(at),
                    mirror.event_id()
                ),
            }];
        }
        let mut found = Vec::new();
        for name in names {
            let expected = model.now(name).map(|k| view(k, at));
            let mirrored = match mirror.lookup(name) {
                Ok(lookup) => lookup.map(|l| View {
                    keys: l.keys.iter().map(|k| k.parse().unwrap()).collect(),
                    next: l
                        .next
                        .map(|n| (n.keys.iter().map(|k| k.parse().unwrap()).collect(), n.at)),
                }),
                Err(e) => {
                    found.push(Violation {
                        check: CHECK,
                        what: format!("quiet check at +{} ms: {name}: {e}", clock.rel(at)),
                    });
                    continue;
                }
            };
            if mirrored != expected {
                found.push(Violation {
                    check: CHECK,
                    what: format!(
                        "quiet check at +{} ms: the mirror answers {name} {mirrored:?}; the log says {expected:?}",
                        clock.rel(at),
                    ),
                });
            }
        }
        found
    }
}
