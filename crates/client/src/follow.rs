//! Keeping a mirror's table current: the snapshot it starts from, the long-polls of the log
//! after it, and a new snapshot whenever the log it followed has ended (compacted past the
//! table, or another log on the server's address).

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use serde::Deserialize;

use crate::table::{Event, SnapshotLine, Table};
use crate::{Error, Shared, refused, server};

/// The header naming the log an answer of `GET /events` or `GET /snapshot` belongs to.
const LOG_HEADER: &str = "x-keyspread-log";

/// The first line of `GET /snapshot`.
#[derive(Debug, Deserialize)]
struct Head {
    event_id: i64,
    accounts: u64,
    max_age_s: u64,
    /// Absent from servers older than log names.
    #[serde(default)]
    log_id: Option<String>,
    /// The primary stream, which reports of what was sent name; absent while none is
    /// registered, and from servers older than producers' reports.
    #[serde(default)]
    stream: Option<String>,
}

/// A page of `GET /events`.
#[derive(Debug, Deserialize)]
struct Page {
    events: Vec<Event>,
    next: i64,
    #[serde(default)]
    log_id: Option<String>,
}

/// A table read whole from `GET /snapshot`, with what its head said.
pub(crate) struct Snapshot {
    pub table: Table,
    pub max_age: Duration,
    /// The log the table's event id belongs to.
    pub log_id: Option<String>,
    /// The primary stream the server names.
    pub stream: Option<String>,
}

/// Reads `GET /snapshot` line by line into a table, never holding the whole body. Neither
/// the answer's head nor any later chunk may take longer than `timeout` to come.
pub(crate) async fn snapshot(
    client: &reqwest::Client,
    base: &str,
    timeout: Duration,
) -> Result<Snapshot, Error> {
    let stalled = |what: &str| {
        server(
            base,
            format!("the snapshot's {what} stalled for {timeout:?}"),
        )
    };
    let sent = tokio::time::timeout(timeout, client.get(format!("{base}/snapshot")).send());
    let mut response = sent
        .await
        .map_err(|_| stalled("answer"))?
        .map_err(|e| server(base, e))?;
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
            .map_err(|_| stalled("body"))?
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
    Ok(Snapshot {
        table,
        max_age: Duration::from_secs(head.max_age_s),
        log_id: head.log_id,
        stream: head.stream,
    })
}

/// What one poll of the log found.
enum Polled {
    Page(Page),
    /// The log the table followed has ended for this mirror: 410 (compacted past the
    /// table's position, or the position is past the end of the server's log), or a page
    /// of another log.
    Ended,
}

/// Whether an answer naming `header` and `body` (either may be absent) belongs to the log
/// `ours`. A server older than log names names none, and neither does a table it made.
fn same_log(ours: Option<&str>, header: Option<&str>, body: Option<&str>) -> bool {
    match (header, body) {
        (None, None) => ours.is_none(),
        _ => [header, body]
            .into_iter()
            .flatten()
            .all(|l| Some(l) == ours),
    }
}

async fn poll(
    client: &reqwest::Client,
    base: &str,
    (after, log_id): (i64, Option<&str>),
    wait: Duration,
    timeout: Duration,
) -> Result<Polled, Error> {
    let url = format!(
        "{base}/events?after={after}&limit=1000&wait_s={}",
        wait.as_secs()
    );
    let response =
        (client.get(url).timeout(wait + timeout).send().await).map_err(|e| server(base, e))?;
    let header = (response.headers().get(LOG_HEADER))
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    match response.status().as_u16() {
        200 => {
            let page: Page = response.json().await.map_err(|e| server(base, e))?;
            if same_log(log_id, header.as_deref(), page.log_id.as_deref()) {
                Ok(Polled::Page(page))
            } else {
                Ok(Polled::Ended)
            }
        }
        410 => Ok(Polled::Ended),
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
/// snapshot when the log it followed has ended for it or an event cannot be applied, and
/// retries with backoff (from the same event id) while the server is away. A sync counts
/// from when its request was sent: the answer holds nothing newer than that.
pub(crate) async fn follow(
    shared: Arc<Shared>,
    client: reqwest::Client,
    base: String,
    mut log_id: Option<String>,
    (longest, timeout): (Duration, Duration),
) {
    let mut backoff = Duration::from_millis(100);
    loop {
        let pace = Pace::for_max_age(longest, shared.max_age());
        let after = shared.table.read().expect("the table lock").event_id();
        let sent = Instant::now();
        let position = (after, log_id.as_deref());
        let applied = match poll(&client, &base, position, pace.wait, timeout).await {
            Ok(Polled::Page(page)) => {
                if page.events.is_empty() && !pace.pause.is_zero() {
                    tokio::time::sleep(pace.pause).await;
                }
                let mut table = shared.table.write().expect("the table lock");
                let applied = (page.events.iter()).try_for_each(|event| table.apply(event));
                if applied.is_ok() {
                    table.advance(page.next);
                }
                applied.ok().map(|()| table.event_id())
            }
            Ok(Polled::Ended) => None,
            Err(_) => {
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(5));
                continue;
            }
        };
        if let Some(event_id) = applied {
            shared.synced(sent);
            shared.applied.send_replace(event_id);
            backoff = Duration::from_millis(100);
            continue;
        }
        // Until the new table is in, lookups answer the old one while it is fresh.
        let sent = Instant::now();
        match snapshot(&client, &base, timeout).await {
            Ok(fresh) => {
                log_id = fresh.log_id;
                let event_id = fresh.table.event_id();
                *shared.table.write().expect("the table lock") = fresh.table;
                shared.set_max_age(fresh.max_age);
                shared.set_stream(fresh.stream);
                shared.synced(sent);
                shared.snapshots.fetch_add(1, Ordering::Relaxed);
                shared.applied.send_replace(event_id);
                backoff = Duration::from_millis(100);
            }
            Err(_) => {
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(5));
            }
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

    #[test]
    fn an_answer_belongs_to_the_log_it_names() {
        let (a, b) = (Some("a"), Some("b"));
        assert!(same_log(a, a, a));
        assert!(same_log(a, None, a), "the body alone");
        assert!(same_log(a, a, None), "the header alone");
        assert!(!same_log(a, b, b));
        assert!(!same_log(a, a, b), "either naming another");
        assert!(
            !same_log(a, None, None),
            "a server that names none is another"
        );
        assert!(same_log(None, None, None), "an older server, as before");
        assert!(!same_log(None, a, a));
    }
}
