//! keyspread's table inside the producer.
//!
//! A [`Mirror`] takes the whole account → keys table from `GET /snapshot`, then follows the
//! log with long-polled `GET /events`, and answers lookups from memory: no round trip per
//! account, and lookups go on while keyspread is away, until the table could be past a
//! switch it missed (`max_age_s` after the last successful sync), when they fail with
//! [`Error::Stale`].
//!
//! ```no_run
//! # async fn produce() -> Result<(), keyspread_client::Error> {
//! let mirror = keyspread_client::Mirror::start("http://127.0.0.1:8080").await?;
//! mirror.allocate("acme").await?;
//! let key = mirror.key_for("acme", "order-17")?.expect("acme holds keys");
//! // PutRecord(..., ExplicitHashKey = key)
//! # Ok(()) }
//! ```

mod table;

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::Deserialize;
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
    /// Longest a request may take beyond its long-poll wait.
    pub timeout: Duration,
}

/// Shows whether a token is set, never the token.
impl std::fmt::Debug for Options {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Options")
            .field("token", &self.token.as_ref().map(|_| "***"))
            .field("wait", &self.wait)
            .field("timeout", &self.timeout)
            .finish()
    }
}

impl Default for Options {
    fn default() -> Self {
        Options {
            token: None,
            wait: Duration::from_secs(20),
            timeout: Duration::from_secs(10),
        }
    }
}

/// The first line of `GET /snapshot`.
#[derive(Debug, Deserialize)]
struct Head {
    event_id: i64,
    accounts: u64,
    max_age_s: u64,
}

/// A page of `GET /events`.
#[derive(Debug, Deserialize)]
struct Page {
    events: Vec<Event>,
    next: i64,
}

/// The table and when it was last known to be current.
struct Shared {
    table: RwLock<Table>,
    /// When a request last confirmed the table current (a snapshot or an answered poll),
    /// Unix milliseconds: one clock read per lookup serves both the switch and the age.
    synced_ms: AtomicI64,
    max_age: Duration,
    snapshots: AtomicU64,
    /// The table's event id after each change, for `allocate` to wait on.
    applied: watch::Sender<i64>,
}

/// The account → keys table, kept current by a task that follows the log.
pub struct Mirror {
    shared: Arc<Shared>,
    client: reqwest::Client,
    base: String,
    options: Options,
    follower: tokio::task::JoinHandle<()>,
}

impl Drop for Mirror {
    fn drop(&mut self) {
        self.follower.abort();
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
        let (table, max_age) = snapshot(&client, &base, options.timeout).await?;
        let (applied, _) = watch::channel(table.event_id());
        let shared = Arc::new(Shared {
            table: RwLock::new(table),
            synced_ms: AtomicI64::new(now_ms()),
            max_age,
            snapshots: 1.into(),
            applied,
        });
        let follower = tokio::spawn(follow(
            shared.clone(),
            client.clone(),
            base.clone(),
            Pace::for_max_age(options.wait, max_age),
            options.timeout,
        ));
        Ok(Mirror {
            shared,
            client,
            base,
            options,
            follower,
        })
    }

    /// The table and the instant to answer for (Unix milliseconds), or [`Error::Stale`]
    /// when the table may be past a switch it missed.
    fn fresh(&self) -> Result<(std::sync::RwLockReadGuard<'_, Table>, i64), Error> {
        let now = now_ms();
        let lag = lag_ms(now, self.shared.synced_ms.load(Ordering::Relaxed));
        if lag > self.shared.max_age {
            return Err(Error::Stale(lag));
        }
        Ok((self.shared.table.read().expect("the table lock"), now))
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

    /// Allocates `account` (`POST /keys/{account}`; an account already held keeps its
    /// keys), then answers its keys from the mirror once the mirror has followed the change.
    pub async fn allocate(&self, account: &str) -> Result<Keys, Error> {
        let url = format!("{}/keys/{}", self.base, encode(account));
        let request = self.client.post(&url).timeout(self.options.timeout);
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

    /// How long since the table was last confirmed current.
    pub fn lag(&self) -> Duration {
        lag_ms(now_ms(), self.shared.synced_ms.load(Ordering::Relaxed))
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

    /// The server's `max_age_s`: how long without a sync lookups are still answered.
    pub fn max_age(&self) -> Duration {
        self.shared.max_age
    }
}

/// Time since `synced_ms`, none when the clock went back.
fn lag_ms(now_ms: i64, synced_ms: i64) -> Duration {
    Duration::from_millis(now_ms.saturating_sub(synced_ms).max(0) as u64)
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

/// Reads `GET /snapshot` line by line into a table, never holding the whole body.
async fn snapshot(
    client: &reqwest::Client,
    base: &str,
    timeout: Duration,
) -> Result<(Table, Duration), Error> {
    let mut response =
        (client.get(format!("{base}/snapshot")).send().await).map_err(|e| server(base, e))?;
    let status = response.status().as_u16();
    if status != 200 {
        let text = response.text().await.unwrap_or_default();
        return Err(refused("GET /snapshot".into(), status, &text));
    }
    let mut pending: Vec<u8> = Vec::new();
    let mut head: Option<Head> = None;
    let mut table = Table::new(0);
    let mut lines = 0u64;
    loop {
        let chunk = tokio::time::timeout(timeout, response.chunk())
            .await
            .map_err(|_| server(base, format!("the snapshot stalled for {timeout:?}")))?
            .map_err(|e| server(base, e))?;
        let Some(chunk) = chunk else { break };
        pending.extend_from_slice(&chunk);
        let mut start = 0;
        while let Some(end) = pending[start..].iter().position(|&b| b == b'\n') {
            let line = &pending[start..start + end];
            start += end + 1;
            lines += 1;
            let bad =
                |e: &dyn std::fmt::Display| server(base, format!("snapshot line {lines}: {e}"));
            match &head {
                None => {
                    let read: Head = serde_json::from_slice(line).map_err(|e| bad(&e))?;
                    table = Table::new(read.event_id);
                    head = Some(read);
                }
                Some(_) => {
                    let account: SnapshotLine =
                        serde_json::from_slice(line).map_err(|e| bad(&e))?;
                    table.insert(account).map_err(|e| bad(&e))?;
                }
            }
        }
        pending.drain(..start);
    }
    let head = head.ok_or_else(|| server(base, "the snapshot was empty"))?;
    if !pending.is_empty() || table.len() as u64 != head.accounts {
        return Err(server(
            base,
            format!(
                "the snapshot ended after {} of {} accounts",
                table.len(),
                head.accounts
            ),
        ));
    }
    Ok((table, Duration::from_secs(head.max_age_s)))
}

/// What one poll of the log found.
enum Polled {
    Page(Page),
    /// 410: the log no longer holds events after the table's position.
    Compacted,
}

async fn poll(
    client: &reqwest::Client,
    base: &str,
    after: i64,
    wait: Duration,
    timeout: Duration,
) -> Result<Polled, Error> {
    let url = format!(
        "{base}/events?after={after}&limit=1000&wait_s={}",
        wait.as_secs()
    );
    let response =
        (client.get(url).timeout(wait + timeout).send().await).map_err(|e| server(base, e))?;
    match response.status().as_u16() {
        200 => Ok(Polled::Page(
            response.json().await.map_err(|e| server(base, e))?,
        )),
        410 => Ok(Polled::Compacted),
        status => {
            let text = response.text().await.unwrap_or_default();
            Err(refused("GET /events".into(), status, &text))
        }
    }
}

/// How the log is polled: long-polls of whole seconds, at most a third of `max_age_s` so
/// that a quiet log is still confirmed well within it; under 3 s of `max_age_s`, polls
/// that answer at once, a quarter of it apart.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Pace {
    wait: Duration,
    pause: Duration,
}

impl Pace {
    fn for_max_age(longest: Duration, max_age: Duration) -> Pace {
        let third = longest.min(max_age / 3).min(Duration::from_secs(60));
        if third >= Duration::from_secs(1) {
            Pace {
                wait: Duration::from_secs(third.as_secs()),
                pause: Duration::ZERO,
            }
        } else {
            Pace {
                wait: Duration::ZERO,
                pause: (max_age / 4).max(Duration::from_millis(50)),
            }
        }
    }
}

/// Follows the log for as long as the mirror lives: applies each page, takes a new
/// snapshot when the log was compacted past its position or an event cannot be applied,
/// and retries with backoff (from the same event id) while the server is away.
async fn follow(
    shared: Arc<Shared>,
    client: reqwest::Client,
    base: String,
    pace: Pace,
    timeout: Duration,
) {
    let mut backoff = Duration::from_millis(100);
    loop {
        let after = shared.table.read().expect("the table lock").event_id();
        let outcome = match poll(&client, &base, after, pace.wait, timeout).await {
            Ok(Polled::Page(page)) => {
                if page.events.is_empty() && !pace.pause.is_zero() {
                    tokio::time::sleep(pace.pause).await;
                }
                let mut table = shared.table.write().expect("the table lock");
                let applied = (page.events.iter()).try_for_each(|event| table.apply(event));
                if applied.is_ok() {
                    table.advance(page.next);
                }
                applied.map(|()| table.event_id())
            }
            Ok(Polled::Compacted) => Err(Unapplied("the log was compacted".into())),
            Err(_) => {
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(5));
                continue;
            }
        };
        match outcome {
            Ok(event_id) => {
                shared.synced_ms.store(now_ms(), Ordering::Relaxed);
                shared.applied.send_replace(event_id);
                backoff = Duration::from_millis(100);
            }
            Err(_) => match snapshot(&client, &base, timeout).await {
                Ok((table, _)) => {
                    let event_id = table.event_id();
                    *shared.table.write().expect("the table lock") = table;
                    shared.synced_ms.store(now_ms(), Ordering::Relaxed);
                    shared.snapshots.fetch_add(1, Ordering::Relaxed);
                    shared.applied.send_replace(event_id);
                }
                Err(_) => {
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(5));
                }
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn polls_confirm_the_table_well_within_max_age() {
        let s = Duration::from_secs;
        let pace = |longest, max_age| Pace::for_max_age(longest, max_age);
        // The default lookup lifetime (60 s): long-polls of 20 s.
        assert_eq!(
            pace(s(20), s(60)),
            Pace {
                wait: s(20),
                pause: Duration::ZERO
            }
        );
        // Whole seconds, at most a third.
        assert_eq!(pace(s(20), s(10)).wait, s(3));
        assert_eq!(pace(s(20), s(3)).wait, s(1));
        // Under 3 s a long-poll of a whole second would reach max_age: short polls.
        let short = pace(s(20), s(1));
        assert_eq!(
            (short.wait, short.pause),
            (Duration::ZERO, Duration::from_millis(250))
        );
        assert_eq!(pace(s(20), Duration::ZERO).pause, Duration::from_millis(50));
    }
}
