//! keyspread's table inside the producer.
//!
//! A [`Mirror`] takes the whole account → keys table from `GET /snapshot`, then follows the
//! log with long-polled `GET /events`, and answers lookups from memory: no round trip per
//! account, and lookups go on while keyspread is away, until the table could be past a
//! switch it missed (`max_age_s` after the last successful sync), when they fail with
//! [`Error::Stale`].
//!
//! [`Mirror::record`] answers the same key as [`Mirror::key_for`] and counts the record:
//! the mirror reports what it handed out to `POST /load/producers` every
//! [`Options::report_interval`] and on [`Mirror::close`], so keyspread balances by what
//! producers send even where no consumer reports what it reads.
//!
//! ```no_run
//! # async fn produce() -> Result<(), keyspread_client::Error> {
//! let mirror = keyspread_client::Mirror::start("http://127.0.0.1:8080").await?;
//! mirror.allocate("acme").await?;
//! let data = b"{\"order\": 17}";
//! let key = mirror.record("acme", "order-17", data.len() as u64)?.expect("acme holds keys");
//! // PutRecord(..., ExplicitHashKey = key)
//! mirror.close().await;
//! # Ok(()) }
//! ```

mod follow;
mod report;
mod table;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use tokio::sync::watch;

pub use keyspace::sub_key_index;
pub use table::{Event, Keys, Lookup, SnapshotLine, Switch, Table, Unapplied};

/// What a mirror can fail with.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The last successful sync is older than the server's `max_age_s`: a staged switch may
    /// have passed unseen, so the table is not answered from.
    #[error("the mirror last synced {0:?} ago, longer than the server's max_age_s")]
    Stale(Duration),
    /// The server could not be reached or answered something other than expected.
    #[error("keyspread at {url}: {detail}")]
    Server { url: String, detail: String },
    /// The server refused a request (4xx), with its problem detail.
    #[error("keyspread refused {what}: {status} {detail}")]
    Refused {
        what: String,
        status: u16,
        detail: String,
    },
}

/// How a mirror talks to keyspread.
#[derive(Clone)]
pub struct Options {
    /// Bearer token, when the server has one: sent with every request.
    pub token: Option<String>,
    /// Longest one long-poll waits (`wait_s`, at most 60); capped at a third of the
    /// server's `max_age_s` so that a quiet log still counts as synced in time.
    pub wait: Duration,
    /// Longest a request may take beyond its long-poll wait; for a snapshot, the longest
    /// wait for its answer and between any two chunks of it.
    pub timeout: Duration,
    /// How often what [`Mirror::record`] counted is reported (10 s); zero: only on close.
    pub report_interval: Duration,
    /// The id reports carry (1 to 128 of `a-z A-Z 0-9 . _ : -`); none: a random one per
    /// mirror.
    pub producer: Option<String>,
}

/// Shows whether a token is set, never the token.
impl std::fmt::Debug for Options {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Options")
            .field("token", &self.token.as_ref().map(|_| "***"))
            .field("wait", &self.wait)
            .field("timeout", &self.timeout)
            .field("report_interval", &self.report_interval)
            .field("producer", &self.producer)
            .finish()
    }
}

impl Default for Options {
    fn default() -> Self {
        Options {
            token: None,
            wait: Duration::from_secs(20),
            timeout: Duration::from_secs(10),
            report_interval: Duration::from_secs(10),
            producer: None,
        }
    }
}

/// The table and when it was last known to be current.
struct Shared {
    table: RwLock<Table>,
    /// The instant `synced_ns` counts from.
    epoch: Instant,
    /// When the request of the last successful sync (a snapshot or an answered poll) was
    /// sent, in nanoseconds after `epoch`: on the monotonic clock, so that no change of the
    /// machine's clock makes an old table look fresh.
    synced_ns: AtomicU64,
    /// The `max_age_s` of the snapshot the table comes from, in milliseconds.
    max_age_ms: AtomicU64,
    snapshots: AtomicU64,
    /// The table's event id after each change, for `allocate` to wait on.
    applied: watch::Sender<i64>,
    /// The primary stream the last snapshot named: the one reports are about.
    stream: Mutex<Option<String>>,
}

impl Shared {
    /// Notes a successful sync whose request was sent at `sent`.
    fn synced(&self, sent: Instant) {
        let after = sent.saturating_duration_since(self.epoch).as_nanos();
        self.synced_ns
            .store(u64::try_from(after).unwrap_or(u64::MAX), Ordering::Relaxed);
    }

    /// How long since the request of the last successful sync was sent.
    fn lag(&self) -> Duration {
        let synced = Duration::from_nanos(self.synced_ns.load(Ordering::Relaxed));
        self.epoch.elapsed().saturating_sub(synced)
    }

    fn max_age(&self) -> Duration {
        Duration::from_millis(self.max_age_ms.load(Ordering::Relaxed))
    }

    fn set_max_age(&self, max_age: Duration) {
        let ms = u64::try_from(max_age.as_millis()).unwrap_or(u64::MAX);
        self.max_age_ms.store(ms, Ordering::Relaxed);
    }

    fn stream(&self) -> Option<String> {
        self.stream.lock().expect("the stream lock").clone()
    }

    fn set_stream(&self, stream: Option<String>) {
        *self.stream.lock().expect("the stream lock") = stream;
    }
}

/// The account → keys table, kept current by a task that follows the log.
pub struct Mirror {
    shared: Arc<Shared>,
    client: reqwest::Client,
    base: String,
    options: Options,
    follower: tokio::task::JoinHandle<()>,
    tally: Arc<report::Tally>,
    reporter: tokio::task::JoinHandle<()>,
    /// Tells the reporting task to report once more and end.
    closing: watch::Sender<bool>,
}

/// A mirror dropped without [`Mirror::close`] stops at once: what it counted since its
/// last report is not reported.
impl Drop for Mirror {
    fn drop(&mut self) {
        self.follower.abort();
        self.reporter.abort();
    }
}

/// Unix milliseconds by this machine's clock.
pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

impl Mirror {
    /// Takes a snapshot of the server at `url` and starts following its log.
    pub async fn start(url: &str) -> Result<Mirror, Error> {
        Mirror::start_with(url, Options::default()).await
    }

    pub async fn start_with(url: &str, options: Options) -> Result<Mirror, Error> {
        let base = url.trim_end_matches('/').to_owned();
        let producer = match &options.producer {
            Some(id) if !report::is_producer_id(id) => {
                return Err(server(
                    &base,
                    format!("producer id {id:?} must be 1 to 128 of a-z A-Z 0-9 . _ : -"),
                ));
            }
            Some(id) => id.clone(),
            None => format!("mirror-{}", uuid::Uuid::new_v4()),
        };
        let mut headers = reqwest::header::HeaderMap::new();
        if let Some(token) = &options.token {
            let mut bearer = reqwest::header::HeaderValue::from_str(&format!("Bearer {token}"))
                .map_err(|_| server(&base, "the token is not a valid header value"))?;
            bearer.set_sensitive(true);
            headers.insert(reqwest::header::AUTHORIZATION, bearer);
        }
        let client = reqwest::Client::builder()
            .connect_timeout(options.timeout)
            .default_headers(headers)
            .build()
            .map_err(|e| server(&base, e))?;
        let epoch = Instant::now();
        let first = follow::snapshot(&client, &base, options.timeout).await?;
        let (applied, _) = watch::channel(first.table.event_id());
        let shared = Arc::new(Shared {
            table: RwLock::new(first.table),
            epoch,
            synced_ns: 0.into(),
            max_age_ms: 0.into(),
            snapshots: 1.into(),
            applied,
            stream: Mutex::new(first.stream),
        });
        shared.set_max_age(first.max_age);
        let follower = tokio::spawn(follow::follow(
            shared.clone(),
            client.clone(),
            base.clone(),
            first.log_id,
            (options.wait, options.timeout),
        ));
        let tally = Arc::new(report::Tally::new());
        let (closing, closed) = watch::channel(false);
        let reporter = report::Reporter::new(
            shared.clone(),
            tally.clone(),
            client.clone(),
            (base.clone(), producer),
            options.timeout,
        );
        let reporter = tokio::spawn(reporter.run(options.report_interval, closed));
        Ok(Mirror {
            shared,
            client,
            base,
            options,
            follower,
            tally,
            reporter,
            closing,
        })
    }

    /// The table and the instant to answer for (Unix milliseconds), or [`Error::Stale`]
    /// when the table may be past a switch it missed.
    fn fresh(&self) -> Result<(std::sync::RwLockReadGuard<'_, Table>, i64), Error> {
        let lag = self.shared.lag();
        if lag > self.shared.max_age() {
            return Err(Error::Stale(lag));
        }
        Ok((self.shared.table.read().expect("the table lock"), now_ms()))
    }

    /// The keys of `account` in force now (by this machine's clock: a staged move's next
    /// keys from its `switch_at` on), by index; `None` when it holds none.
    pub fn keys(&self, account: &str) -> Result<Option<Keys>, Error> {
        let (table, now) = self.fresh()?;
        Ok(table.keys(account, now))
    }

    /// The keys of `account` in force now and the switch still ahead, for producers that
    /// hold records back just before a switch.
    pub fn lookup(&self, account: &str) -> Result<Option<Lookup>, Error> {
        let (table, now) = self.fresh()?;
        Ok(table.lookup(account, now))
    }

    /// The key records of `sub_key` use now: keys in force now, index by DESIGN's jump
    /// hash of the sub-key's MD5 (the same selector the server's `GET /shard-of` uses).
    pub fn key_for(&self, account: &str, sub_key: &str) -> Result<Option<String>, Error> {
        let (table, now) = self.fresh()?;
        Ok(table.key_for(account, sub_key, now))
    }

    /// The key a record of `sub_key` of `size` bytes goes under ([`Mirror::key_for`]'s),
    /// counted as sent: one record and `size` bytes for the account and key, reported with
    /// the next report. Nothing is counted when the account holds no key.
    pub fn record(&self, account: &str, sub_key: &str, size: u64) -> Result<Option<String>, Error> {
        let key = self.key_for(account, sub_key)?;
        if let Some(key) = &key {
            self.sent(account, key, size);
        }
        Ok(key)
    }

    /// Counts one record of `size` bytes sent to `account` under `key`, for producers that
    /// pick among [`Mirror::lookup`]'s keys themselves (holding records back before a
    /// switch, resending failed ones): reported with the next report, as
    /// [`Mirror::record`]'s are.
    pub fn sent(&self, account: &str, key: &str, size: u64) {
        self.tally.count(account, key, size);
    }

    /// Stops following the log and reports what was counted since the last report (the
    /// report waits at most [`Options::timeout`] for the server; one it does not answer is
    /// lost).
    pub async fn close(mut self) {
        self.follower.abort();
        self.closing.send_replace(true);
        // Its last report and the one before it may each take the timeout; past that, the
        // task is aborted when `self` drops.
        let last = tokio::time::timeout(2 * self.options.timeout, &mut self.reporter);
        let _ = last.await;
    }

    /// Allocates `account` (`POST /keys/{account}`; an account already held keeps its
    /// keys), then answers its keys from the mirror once the mirror has followed the change.
    /// The request carries an `Idempotency-Key` of its own.
    pub async fn allocate(&self, account: &str) -> Result<Keys, Error> {
        let url = format!("{}/keys/{}", self.base, encode(account));
        let request = (self.client.post(&url))
            .header("idempotency-key", uuid::Uuid::new_v4().to_string())
            .timeout(self.options.timeout);
        let response = request.send().await.map_err(|e| server(&self.base, e))?;
        let status = response.status().as_u16();
        let text = response.text().await.map_err(|e| server(&self.base, e))?;
        if !(200..300).contains(&status) {
            return Err(refused(format!("POST /keys/{account}"), status, &text));
        }
        let mut applied = self.shared.applied.subscribe();
        let until = tokio::time::Instant::now() + self.options.timeout;
        loop {
            if let Some(keys) = self.keys(account)? {
                return Ok(keys);
            }
            if tokio::time::timeout_at(until, applied.changed())
                .await
                .is_err()
            {
                return Err(Error::Server {
                    url: self.base.clone(),
                    detail: format!(
                        "{account:?} was allocated but the log did not show it within {:?}",
                        self.options.timeout
                    ),
                });
            }
        }
    }

    /// How long since the request that last confirmed the table current was sent.
    pub fn lag(&self) -> Duration {
        self.shared.lag()
    }

    /// The id of the last event the table reflects.
    pub fn event_id(&self) -> i64 {
        self.shared.table.read().expect("the table lock").event_id()
    }

    /// How many snapshots this mirror has taken (1 at start; more only when it had to).
    pub fn snapshots(&self) -> u64 {
        self.shared.snapshots.load(Ordering::Relaxed)
    }

    /// How many accounts the table holds.
    pub fn len(&self) -> usize {
        self.shared.table.read().expect("the table lock").len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The server's `max_age_s` (as of the last snapshot): how long without a sync lookups
    /// are still answered.
    pub fn max_age(&self) -> Duration {
        self.shared.max_age()
    }
}

fn server(base: &str, e: impl std::fmt::Display) -> Error {
    Error::Server {
        url: base.to_owned(),
        detail: e.to_string(),
    }
}

/// A 4xx answer's problem detail (or its text).
fn refused(what: String, status: u16, text: &str) -> Error {
    let detail = serde_json::from_str::<serde_json::Value>(text)
        .ok()
        .and_then(|v| v["detail"].as_str().map(str::to_owned))
        .unwrap_or_else(|| text.chars().take(200).collect());
    Error::Refused {
        what,
        status,
        detail,
    }
}

/// An account name as one path segment.
fn encode(account: &str) -> String {
    let mut out = String::with_capacity(account.len());
    for b in account.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}
