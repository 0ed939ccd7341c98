//! Watches the event log from a connection of its own and notes, for each event, the
//! window of true time in which it was committed: after the last poll that did not see
//! it began, before the poll that saw it ended.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;

use super::Clock;
use crate::helpers::Db;

/// An event of the log with the window its commit fell in (Unix ms, true clock).
#[derive(Debug, Clone)]
pub struct Observed {
    pub id: i64,
    /// The writer's own timestamp (its clock, which may be skewed).
    pub at: i64,
    pub kind: String,
    pub account: Option<String>,
    pub index: i64,
    pub before: Option<u128>,
    pub after: Option<u128>,
    pub switch_at: Option<i64>,
    /// For a move: why it was made (`admin`, `load`).
    pub reason: Option<String>,
    /// Who made the change.
    pub actor: String,
    pub lo: i64,
    pub hi: i64,
}

type Row = (
    i64,
    i64,
    String,
    Option<String>,
    i64,
    Option<Vec<u8>>,
    Option<Vec<u8>>,
    Option<i64>,
    Option<String>,
    String,
);

const SQL: &str = "SELECT id, at, kind, account, idx, key_before, key_after, switch_at, reason, \
                   actor FROM events WHERE id > $1 ORDER BY id LIMIT 5000";

fn key(bytes: Option<Vec<u8>>) -> Option<u128> {
    bytes.map(|b| u128::from_be_bytes(b.try_into().expect("a 16-byte key")))
}

/// The watcher: polls every 20 ms until stopped.
pub struct Watcher {
    seen: Arc<Mutex<Vec<Observed>>>,
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl Watcher {
    pub fn start(database_url: &str, clock: Clock) -> Watcher {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let (stop, mut stopped) = watch::channel(false);
        let (url, out) = (database_url.to_owned(), seen.clone());
        let task = tokio::spawn(async move {
            let mut db: Option<Db> = None;
            let (mut last, mut lo) = (0i64, clock.now());
            while !*stopped.borrow() {
                let began = clock.now();
                if db.is_none() {
                    // A failover may leave no server to connect to for a while.
                    match Db::try_connect(&url).await {
                        Ok(connected) => db = Some(connected),
                        Err(_) => {
                            tokio::time::sleep(Duration::from_millis(100)).await;
                            continue;
                        }
                    }
                }
                match page(db.as_mut().unwrap(), last).await {
                    Ok(rows) => {
                        let hi = clock.now();
                        let mut out = out.lock().unwrap();
                        for r in rows {
                            last = r.0;
                            out.push(Observed {
                                id: r.0,
                                at: r.1,
                                kind: r.2,
                                account: r.3,
                                index: r.4,
                                before: key(r.5),
                                after: key(r.6),
                                switch_at: r.7,
                                reason: r.8,
                                actor: r.9,
                                lo,
                                hi,
                            });
                        }
                        lo = began;
                    }
                    // A terminated backend: connect again; the window stays open from the
                    // last poll that answered.
                    Err(_) => db = None,
                }
                let _ = tokio::time::timeout(Duration::from_millis(20), stopped.changed()).await;
            }
        });
        Watcher { seen, stop, task }
    }

    /// Every event seen so far.
    pub fn events(&self) -> Vec<Observed> {
        self.seen.lock().unwrap().clone()
    }

    /// Waits until the watcher has seen every event committed before now.
    pub async fn catch_up(&self, database_url: &str) {
        let mut db = Db::connect(database_url).await;
        let newest = db.last_event_id().await;
        for _ in 0..500 {
            let last = self.seen.lock().unwrap().last().map_or(0, |e| e.id);
            if last >= newest {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("the event watcher never reached event {newest}");
    }

    pub async fn stop(self) -> Vec<Observed> {
        let _ = self.stop.send(true);
        let _ = self.task.await;
        self.seen.lock().unwrap().clone()
    }
}

/// Every event names who made it: the load controller its moves for load, and the
/// replicas' clients (no token: `loopback`), the controller, or the configured primary
/// stream (`config`) everything else.
pub fn judge_actors(events: &[Observed]) -> Vec<super::Violation> {
    (events.iter())
        .filter(|e| {
            let by_load = e.reason.as_deref() == Some("load");
            match e.actor.as_str() {
                "controller" => false,
                "loopback" | "config" => by_load,
                _ => true,
            }
        })
        .map(|e| super::Violation {
            check: "actors",
            what: format!(
                "event {} ({} of {:?}, reason {:?}) by {:?}",
                e.id, e.kind, e.account, e.reason, e.actor
            ),
        })
        .collect()
}

async fn page(db: &mut Db, after: i64) -> Result<Vec<Row>, sqlx::Error> {
    match db {
        Db::Sqlite(c) => sqlx::query_as(SQL).bind(after).fetch_all(c).await,
        Db::Postgres(c) => sqlx::query_as(SQL).bind(after).fetch_all(c).await,
    }
}

/// One load controller round at a time: every round was claimed by one replica, once, and
/// each at least `min_gap_ms` after the one before it by the database's clock it was claimed
/// by, as the claim's own condition says (`rounds_claimed`: per replica, the (number, time)
/// of each round its log says it claimed). A claim lost with a commit (a promotion that lost
/// what the old primary acknowledged) lets a second replica claim its number again, acting
/// beside the first; a claim that did not hold would come too soon.
pub fn judge_rounds(rounds_claimed: &[Vec<(i64, i64)>], min_gap_ms: i64) -> Vec<super::Violation> {
    const CHECK: &str = "(i) one controller round at a time";
    let mut by: std::collections::BTreeMap<i64, Vec<(usize, i64)>> = Default::default();
    for (r, rounds) in rounds_claimed.iter().enumerate() {
        for &(round, at) in rounds {
            by.entry(round).or_default().push((r, at));
        }
    }
    let mut out = Vec::new();
    let mut before: Option<(i64, i64)> = None;
    for (round, claims) in by {
        if claims.len() > 1 {
            out.push(super::Violation {
                check: CHECK,
                what: format!("round {round} claimed more than once: (replica, at) {claims:?}"),
            });
        }
        let at = claims.iter().map(|c| c.1).min().unwrap_or_default();
        if let Some((previous, previous_at)) = before
            && previous + 1 == round
            && at - previous_at < min_gap_ms
        {
            out.push(super::Violation {
                check: CHECK,
                what: format!(
                    "round {round} claimed {} ms after round {previous} (at least {min_gap_ms})",
                    at - previous_at
                ),
            });
        }
        before = Some((round, claims.iter().map(|c| c.1).max().unwrap_or_default()));
    }
    out
}
