//! What a mirror handed out, counted per account and key by [`crate::Mirror::record`], and
//! reported to `POST /load/producers` off the callers' path: every `report_interval`, and
//! once more on close.
//!
//! At most one cut report waits for the server at a time: a report the server did not
//! answer is sent again as it was (same numbers, so the server counts it once however
//! often it arrives), and what is recorded meanwhile adds up in the tally, so memory stays
//! bounded by the keys handed out, however long the server is away.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::Serialize;
use tokio::sync::watch;

use crate::{Shared, now_ms};

/// Most keys one report names: the server's cap (send more in several reports).
const MAX_KEYS: usize = 1000;
/// Longest window one report may cover (the server's cap): a longer one is reported as its
/// last hour, at its average rate.
const MAX_WINDOW_MS: u64 = 3_600_000;

/// Records and bytes handed out under one key.
#[derive(Debug, Default, Clone, Copy)]
struct Sent {
    records: u64,
    bytes: u64,
}

/// Counts since the last cut: account → key → what was handed out under it.
struct Counts {
    by_account: HashMap<String, HashMap<String, Sent>, foldhash::fast::RandomState>,
    since: Instant,
}

/// The counts [`crate::Mirror::record`] adds to, shared with the reporting task.
pub(crate) struct Tally(Mutex<Counts>);

impl Tally {
    pub(crate) fn new() -> Tally {
        Tally(Mutex::new(Counts {
            by_account: HashMap::default(),
            since: Instant::now(),
        }))
    }

    /// Counts one record of `size` bytes sent to `account` under `key`.
    pub(crate) fn count(&self, account: &str, key: &str, size: u64) {
        let mut counts = self.0.lock().expect("the tally lock");
        // Allocates only the first time an account or key is counted since the last cut.
        let keys = match counts.by_account.get_mut(account) {
            Some(keys) => keys,
            None => counts.by_account.entry(account.to_owned()).or_default(),
        };
        let sent = match keys.get_mut(key) {
            Some(sent) => sent,
            None => keys.entry(key.to_owned()).or_default(),
        };
        sent.records = sent.records.saturating_add(1);
        sent.bytes = sent.bytes.saturating_add(size);
    }

    /// Takes the counts and the milliseconds they cover, leaving an empty tally from now.
    fn cut(&self) -> (Vec<Key>, u64) {
        let mut counts = self.0.lock().expect("the tally lock");
        let now = Instant::now();
        let since = std::mem::replace(&mut counts.since, now);
        let by_account = std::mem::take(&mut counts.by_account);
        drop(counts);
        let window_ms = u64::try_from(now.duration_since(since).as_millis()).unwrap_or(u64::MAX);
        let keys = (by_account.into_iter())
            .flat_map(|(account, keys)| {
                keys.into_iter().map(move |(hash_key, sent)| Key {
                    account: account.clone(),
                    hash_key,
                    records: sent.records,
                    bytes: sent.bytes,
                })
            })
            .collect();
        (keys, window_ms.max(1))
    }
}

/// One key's line of a report.
#[derive(Debug, Serialize)]
struct Key {
    account: String,
    hash_key: String,
    records: u64,
    bytes: u64,
}

/// The body of `POST /load/producers`.
#[derive(Debug, Serialize)]
struct Report {
    stream: String,
    producer: String,
    seq: u64,
    window_ms: u64,
    keys: Vec<Key>,
}

/// What became of a report sent.
enum Outcome {
    /// Answered 200: counted now or before.
    Done,
    /// The server will never take it (a 4xx other than 408 and 429): dropped.
    Refused,
    /// No answer, or the server could not take it now: sent again later.
    Again,
}

/// The reporting task's state.
pub(crate) struct Reporter {
    pub(crate) shared: Arc<Shared>,
    pub(crate) tally: Arc<Tally>,
    pub(crate) client: reqwest::Client,
    pub(crate) base: String,
    pub(crate) producer: String,
    pub(crate) timeout: Duration,
    /// The number of the last report cut.
    seq: u64,
    /// Reports cut and not yet answered, in order.
    unsent: Vec<Report>,
}

impl Reporter {
    pub(crate) fn new(
        shared: Arc<Shared>,
        tally: Arc<Tally>,
        client: reqwest::Client,
        (base, producer): (String, String),
        timeout: Duration,
    ) -> Reporter {
        Reporter {
            shared,
            tally,
            client,
            base,
            producer,
            timeout,
            seq: 0,
            unsent: Vec::new(),
        }
    }

    /// Reports every `interval` (never, if zero) until `closing` says so, then once more.
    pub(crate) async fn run(mut self, interval: Duration, mut closing: watch::Receiver<bool>) {
        loop {
            let tick = async {
                if interval.is_zero() {
                    std::future::pending::<()>().await;
                }
                tokio::time::sleep(interval).await;
            };
            tokio::select! {
                () = tick => self.report().await,
                _ = closing.changed() => break,
            }
        }
        self.report().await;
    }

    /// Sends what waits from before, then, if all of it was answered, what was recorded
    /// since.
    async fn report(&mut self) {
        if !self.send_unsent().await {
            return;
        }
        let Some(stream) = self.shared.stream() else {
            // No primary stream to report on yet: the counts keep adding up.
            return;
        };
        let (keys, window_ms) = self.tally.cut();
        let (keys, window_ms) = last_hour(keys, window_ms);
        let mut keys = keys.into_iter().peekable();
        while keys.peek().is_some() {
            // Numbers from the clock on: a producer id reused after a restart numbers above
            // its reports before.
            self.seq = (self.seq + 1).max(u64::try_from(now_ms()).unwrap_or(0));
            self.unsent.push(Report {
                stream: stream.clone(),
                producer: self.producer.clone(),
                seq: self.seq,
                window_ms,
                keys: keys.by_ref().take(MAX_KEYS).collect(),
            });
        }
        self.send_unsent().await;
    }

    /// Sends the reports that wait, in order, until one gets no answer: answers whether
    /// none is left.
    async fn send_unsent(&mut self) -> bool {
        while let Some(report) = self.unsent.first() {
            match self.send(report).await {
                Outcome::Done | Outcome::Refused => {
                    self.unsent.remove(0);
                }
                Outcome::Again => return false,
            }
        }
        true
    }

    async fn send(&self, report: &Report) -> Outcome {
        let url = format!("{}/load/producers", self.base);
        let sent = (self.client.post(url).json(report))
            .timeout(self.timeout)
            .send()
            .await;
        match sent.map(|r| r.status().as_u16()) {
            Ok(200..=299) => Outcome::Done,
            Ok(408 | 429) | Ok(500..) | Err(_) => Outcome::Again,
            Ok(_) => Outcome::Refused,
        }
    }
}

/// `keys` counted over `window_ms`, as a window the server takes: over an hour, the last
/// hour's share at the same average rate.
fn last_hour(mut keys: Vec<Key>, window_ms: u64) -> (Vec<Key>, u64) {
    if window_ms <= MAX_WINDOW_MS {
        return (keys, window_ms);
    }
    let share = |n: u64| (u128::from(n) * u128::from(MAX_WINDOW_MS) / u128::from(window_ms)) as u64;
    for key in &mut keys {
        key.records = share(key.records);
        key.bytes = share(key.bytes);
    }
    (keys, MAX_WINDOW_MS)
}

/// Whether `id` is a producer id the server takes: 1 to 128 of `a-z A-Z 0-9 . _ : -`.
pub(crate) fn is_producer_id(id: &str) -> bool {
    (1..=128).contains(&id.len())
        && (id.bytes()).all(|b| b.is_ascii_alphanumeric() || b"._:-".contains(&b))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(records: u64, bytes: u64) -> Key {
        Key {
            account: "a".into(),
            hash_key: "1".into(),
            records,
            bytes,
        }
    }

    #[test]
    fn a_tally_adds_up_per_account_and_key_and_starts_over_when_cut() {
        let tally = Tally::new();
        tally.count("a", "1", 10);
        tally.count("a", "1", 5);
        tally.count("a", "2", 1);
        tally.count("b", "1", 7);
        let (mut keys, window_ms) = tally.cut();
        assert!(window_ms >= 1);
        keys.sort_by(|x, y| (&x.account, &x.hash_key).cmp(&(&y.account, &y.hash_key)));
        let got: Vec<(&str, &str, u64, u64)> = (keys.iter())
            .map(|k| (k.account.as_str(), k.hash_key.as_str(), k.records, k.bytes))
            .collect();
        assert_eq!(got, [("a", "1", 2, 15), ("a", "2", 1, 1), ("b", "1", 1, 7)]);
        assert!(tally.cut().0.is_empty());
    }

    #[test]
    fn a_window_over_an_hour_is_reported_as_its_last_hour_at_the_same_rate() {
        let (keys, window) = last_hour(vec![key(7200, 14_400)], 2 * MAX_WINDOW_MS);
        assert_eq!(
            (keys[0].records, keys[0].bytes, window),
            (3600, 7200, MAX_WINDOW_MS)
        );
        let (keys, window) = last_hour(vec![key(5, 6)], 1000);
        assert_eq!((keys[0].records, keys[0].bytes, window), (5, 6, 1000));
    }

    #[test]
    fn producer_ids_are_what_the_server_takes() {
        assert!(is_producer_id("mirror-0c6f:a.b_c"));
        assert!(!is_producer_id(""));
        assert!(!is_producer_id("a b"));
        assert!(!is_producer_id(&"p".repeat(129)));
    }
}
