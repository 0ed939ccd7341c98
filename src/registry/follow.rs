//! Keeping the in-memory mirror in step with the event log.
//!
//! Every change, made here or by another replica, reaches memory the same way: as an
//! event applied in id order. Writers catch up inside their write transaction (so they
//! never decide on a stale tree); a background task catches up between writes, woken by
//! Postgres notifications or a short poll.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::log::{Found, found};
use super::streams::Stream;
use super::{Accounts, Error, Registry, Writer, retention};
use crate::keyspace::{self, Allocator};
use crate::store::{CHANNEL, Change, Event, Store, StoreError, StreamRow, Switch, Tx};

/// Longest a replica goes without looking for other replicas' changes.
pub const POLL: Duration = Duration::from_millis(250);

/// How long the follower may fail to apply the log before the replica says it is not
/// ready: a database outage passes in that time, a log this replica cannot apply does not.
pub(super) const FOLLOW_GRACE: Duration = Duration::from_secs(2);

/// How many follower rounds pass between looks at the database's schema version.
const SCHEMA_EVERY: u64 = 20;

/// Events a follower reads from the log in one query.
const FOLLOW_PAGE: i64 = 10_000;

/// Why a replica behind the log's horizon reads the table again.
const COMPACTED: &str = "this replica was behind the event log's horizon (events it had not applied were compacted away)";

impl Registry {
    /// Starts a write transaction, applies everything committed before it, and reads the
    /// database's clock: the time (Unix milliseconds) the transaction decides and logs by.
    /// Switches due by then are ended, so their old keys may be picked. A database that
    /// holds another log than memory follows is read again whole first.
    pub(super) async fn begin(&self, w: &mut Writer) -> Result<(Tx, i64), Error> {
        let started = std::time::Instant::now();
        w.tx_started = Some(started);
        let mut tx = loop {
            let mut tx = self.store.begin().await?;
            match found(w, tx.log_check(w.last_event).await?) {
                Found::Same => break tx,
                other => self.follow_anew(w, tx, other).await?,
            }
        };
        let mut events = tx.events_after(w.last_event).await?;
        if retention::gapped(w.last_event, events.iter().map(|e| e.id))
            && tx.event_horizon().await? > w.last_event
        {
            // Under the write lock: the table read now is the one this change decides on.
            self.reload(w, COMPACTED).await?;
            events = tx.events_after(w.last_event).await?;
        }
        let streams = if changes_streams(&events) {
            Some(self.parse_streams(tx.load_streams().await?)?)
        } else {
            None
        };
        self.apply_all(w, events, streams)?;
        self.synced.note(started);
        self.note_schema(tx.schema_version().await?);
        self.writable()?;
        let now = self.tx_clock(&mut tx).await?;
        self.end_switches(w, now)?;
        Ok((tx, now))
    }

    /// Applies what other replicas committed since the last look, unless a commit notice
    /// named event `logged` and this process has applied that far: the notice of its own
    /// commit, or of one it read already. Answers how many events it applied.
    pub(super) async fn catch_up(&self, logged: Option<i64>) -> Result<usize, Error> {
        let applied_here = |applied: i64| logged.is_some_and(|id| id <= applied);
        if applied_here(self.applied_event()) {
            return Ok(0);
        }
        let mut w = self.writer.lock().await;
        // The notice may have overtaken the answer of the commit it announces.
        if applied_here(w.last_event) {
            return Ok(0);
        }
        self.count_follow_read();
        let started = std::time::Instant::now();
        // A page may end inside a transaction (a batch, a fanout change of many keys): read
        // to the end of the log, then apply it all at once, so that a lookup sees each
        // transaction whole.
        let mut events: Vec<Event> = Vec::new();
        loop {
            let after = events.last().map_or(w.last_event, |e| e.id);
            let page = self.store.events_after(after, FOLLOW_PAGE).await?;
            let last_page = (page.len() as i64) < FOLLOW_PAGE;
            events.extend(page);
            if last_page {
                break;
            }
        }
        // Read after the events: a log renamed before they were read is found here.
        if found(&w, self.store.log_check(w.last_event).await?) != Found::Same {
            // Judged again under the write lock, where a rewound log is renamed.
            let mut tx = self.store.begin().await?;
            let found = found(&w, tx.log_check(w.last_event).await?);
            self.follow_anew(&mut w, tx, found).await?;
            self.synced.note(started);
            return Ok(events.len());
        }
        if events.is_empty() {
            self.synced.note(started);
            return Ok(0);
        }
        if retention::gapped(w.last_event, events.iter().map(|e| e.id))
            && self.store.event_horizon().await? > w.last_event
        {
            let applied = events.len();
            self.reload(&mut w, COMPACTED).await?;
            self.synced.note(started);
            return Ok(applied);
        }
        let streams = if changes_streams(&events) {
            Some(self.parse_streams(self.store.load_streams().await?)?)
        } else {
            None
        };
        let applied = events.len();
        self.apply_all(&mut w, events, streams)?;
        self.synced.note(started);
        Ok(applied)
    }

    /// Follows other writers until the process ends: woken by notifications on Postgres,
    /// and every [`POLL`] in any case.
    pub fn follow(self: &Arc<Self>) -> tokio::task::JoinHandle<()> {
        let this = Arc::clone(self);
        tokio::spawn(async move {
            let notices = notice_pool(&this.store);
            let mut listener = None;
            let mut poll_at = Instant::now() + POLL;
            let mut polls: u64 = 0;
            loop {
                if listener.is_none() {
                    listener = listen(notices.as_ref()).await;
                }
                // A notice, or the next poll, whichever comes first. A notice names an event
                // its transaction logged; the poll reads the log whatever notices said.
                let logged = match &mut listener {
                    Some(l) => match tokio::time::timeout_at(poll_at, l.try_recv()).await {
                        Ok(Ok(Some(notice))) => newest_announced(notice, l),
                        Ok(Ok(None)) | Err(_) => None,
                        Ok(Err(_)) => {
                            listener = None; // reconnect next round
                            None
                        }
                    },
                    None => {
                        tokio::time::sleep_until(poll_at).await;
                        None
                    }
                };
                if logged.is_none() {
                    poll_at = Instant::now() + POLL;
                }
                let followed = this.catch_up(logged).await;
                this.note_followed(followed);
                // A newer keyspread may migrate the database while this one runs.
                polls += 1;
                if polls.is_multiple_of(SCHEMA_EVERY)
                    && let Ok(found) = this.store.schema_version().await
                {
                    this.note_schema(found);
                    // The clocks drift apart: measured again as often.
                    let _ = this.db_clock().await;
                }
            }
        })
    }

    /// Remembers since when following has failed, until it succeeds again.
    fn note_followed(&self, followed: Result<usize, Error>) {
        let mut failing = self.follow_failing.lock().expect("follow lock poisoned");
        match followed {
            Ok(_) => *failing = None,
            Err(err) => {
                failing.get_or_insert_with(std::time::Instant::now);
                tracing::warn!(%err, "cannot follow the event log; retrying");
            }
        }
    }

    /// Applies events in order, then `streams`: the streams table as read with them, when
    /// any of them changed a stream.
    ///
    /// Callers read everything before applying anything, so a read that fails leaves the
    /// position before these events, and the next round reads them again rather than
    /// passing them with a stale map.
    fn apply_all(
        &self,
        w: &mut Writer,
        events: Vec<Event>,
        streams: Option<Streams>,
    ) -> Result<(), Error> {
        let times: Vec<i64> = events.iter().map(|e| e.at).collect();
        self.apply_events(w, events)?;
        for at in times {
            self.count_followed(at);
        }
        if let Some(streams) = streams {
            self.install_streams(w, streams);
        }
        Ok(())
    }

    /// Applies committed changes to memory, in order, all under one hold of the accounts
    /// lock: a lookup sees none of them or all (a transaction's keys of one account, say).
    /// Stream changes are applied by reloading the streams table (see
    /// [`Registry::reload_streams`]).
    pub(super) fn apply_events(&self, w: &mut Writer, events: Vec<Event>) -> Result<(), Error> {
        let Some(last) = events.last().map(|e| e.id) else {
            return Ok(());
        };
        let mut accounts = self.accounts.write().expect("accounts lock poisoned");
        for event in events {
            fold(&mut w.alloc, &mut accounts, event.change, event.at)?;
            w.last_event = event.id;
            w.last_at = event.at;
        }
        drop(accounts);
        self.count_applied(w, last);
        Ok(())
    }

    /// Replaces the in-memory streams with `rows` and balances on the primary one.
    pub(super) fn reload_streams(&self, w: &mut Writer, rows: Vec<StreamRow>) -> Result<(), Error> {
        let streams = self.parse_streams(rows)?;
        self.install_streams(w, streams);
        Ok(())
    }

    /// The streams of the table's `rows`, by name.
    fn parse_streams(&self, rows: Vec<StreamRow>) -> Result<Streams, Error> {
        rows.into_iter()
            .map(|row| Stream::from_row(row, self.keyspace).map(|s| (s.name.clone(), s)))
            .collect()
    }

    /// Replaces the in-memory streams and balances on the primary one.
    fn install_streams(&self, w: &mut Writer, streams: Streams) {
        let mut current = self.streams.write().expect("streams lock poisoned");
        *current = streams;
        let primary = current
            .values()
            .find(|s| s.primary)
            .map(|s| (*s.map).clone());
        let unchanged = match (&primary, w.alloc.balanced_map()) {
            (Some(new), Some(old)) => new == old,
            (None, None) => true,
            _ => false,
        };
        if !unchanged {
            drop(current);
            w.alloc.balance_on(primary);
            self.warn_unspread(w);
        }
    }

    /// Logs how many accounts with several keys the map new keys balance on leaves
    /// unspread: a rebalance over it mends them (its first `mends` moves).
    fn warn_unspread(&self, w: &Writer) {
        let accounts = self.accounts.read().expect("accounts lock poisoned");
        let spread = w.alloc.spread();
        let mut unspread = accounts
            .several()
            .filter(|(_, keys)| !spread.holds(keys))
            .map(|(id, _)| id.as_str());
        if let Some(first) = unspread.next() {
            let count = 1 + unspread.count();
            tracing::warn!(
                accounts = count,
                example = first,
                "the new primary map leaves accounts' keys sharing shards; a rebalance over it spreads them again"
            );
        }
    }
}

/// Ends the staged switches due by `now` (Unix milliseconds): their old keys become free.
pub(super) fn end_due(
    alloc: &mut Allocator,
    accounts: &mut Accounts,
    now: i64,
) -> Result<(), Error> {
    for switch in accounts.end_switches(now) {
        if let Some(from) = switch.from {
            alloc.unreserve(from)?;
        }
    }
    Ok(())
}

/// The one step every replica takes for each committed event, writer and follower alike:
/// the switches due by the event's time end first (the writer that logged it decided by
/// that time, so a key freed then may be the one it hands out), then the change applies.
/// Memory is thus a function of the log alone, whatever requests this replica served.
fn fold(
    alloc: &mut Allocator,
    accounts: &mut Accounts,
    change: Change,
    at: i64,
) -> Result<(), Error> {
    end_due(alloc, accounts, at)?;
    apply_change(alloc, accounts, change, at)
}

/// Applies one change about an account's key to the tree and the accounts.
///
/// An account's keys are `0..k` at every moment: keys are added at index k and released
/// from the top, and key 0 comes first and goes last.
fn apply_change(
    alloc: &mut Allocator,
    accounts: &mut Accounts,
    change: Change,
    at: i64,
) -> Result<(), Error> {
    let corrupt = |detail: String| Error::Store(StoreError::Corrupt(detail));
    match change {
        Change::Allocate {
            account,
            index,
            key,
            weight,
            switch_at,
        } => {
            alloc.insert(key, weight)?;
            accounts
                .add(account.clone(), index, key, weight, at)
                .map_err(corrupt)?;
            // A key a fanout raise added takes over at its switch; until then producers
            // send over the account's other keys. Its value is held from the start.
            if let Some(switch_at) = switch_at.filter(|&t| t > at) {
                let switch = Switch {
                    index,
                    from: None,
                    switch_at,
                };
                accounts.stage(&account, switch);
            }
        }
        Change::Release {
            account,
            index,
            key,
        } => {
            let weight = alloc.remove(key)?;
            accounts.release(&account, index, weight).map_err(corrupt)?;
            if let Some(Switch {
                from: Some(from), ..
            }) = accounts.unstage(&account, index)
            {
                alloc.unreserve(from)?;
            }
        }
        Change::Move {
            account,
            index,
            from,
            to,
            switch_at,
            reason: _,
        } => {
            let weight = alloc.remove(from)?;
            alloc.insert(to, weight)?;
            accounts.move_key(&account, index, to);
            // A key moved again before its switch (never by a plan, which leaves switching
            // accounts be) switches from where the table says it is: `from`.
            if let Some(Switch {
                from: Some(earlier),
                ..
            }) = accounts.unstage(&account, index)
            {
                alloc.unreserve(earlier)?;
            }
            // Held from the move's own time, so that every replica, and a replay of the
            // log, holds it alike; the first event or decision at or after the switch
            // frees it.
            if switch_at > at {
                alloc.reserve(from)?;
                let switch = Switch {
                    index,
                    from: Some(from),
                    switch_at,
                };
                accounts.stage(&account, switch);
            }
        }
        Change::Reweight {
            account,
            index,
            weight,
        } => {
            if let Some(key) = accounts.key(account.as_str(), index) {
                let before = alloc.weight(key).ok_or(keyspace::Error::KeyNotHeld(key))?;
                alloc.set_weight(key, weight)?;
                accounts.reweight(account.as_str(), before, weight);
            } else if accounts.get(account.as_str()).is_some() {
                return Err(corrupt(format!("reweight of key {index} of {account}")));
            }
        }
        Change::MaxFanout {
            account,
            max_fanout,
        } => accounts.set_max_fanout(&account, max_fanout),
        Change::StreamPut { .. } | Change::StreamDelete { .. } => {}
    }
    Ok(())
}

/// Registered streams by name, as memory holds them.
type Streams = BTreeMap<String, Stream>;

/// Whether any of `events` changed a stream (so the streams table must be read again).
fn changes_streams(events: &[Event]) -> bool {
    events.iter().any(|event| {
        matches!(
            event.change,
            Change::StreamPut { .. } | Change::StreamDelete { .. }
        )
    })
}

/// The newest event id named by `first` and the notices already received after it, or
/// `None` if one names none (then only reading the log tells).
fn newest_announced(
    first: sqlx::postgres::PgNotification,
    listener: &mut sqlx::postgres::PgListener,
) -> Option<i64> {
    let mut newest = announced(&first);
    while let Some(notice) = listener.next_buffered() {
        newest = newest.zip(announced(&notice)).map(|(a, b)| a.max(b));
    }
    newest
}

/// The event id a commit notice names (migration 0005's trigger sends one per transaction,
/// naming an event it logged).
fn announced(notice: &sqlx::postgres::PgNotification) -> Option<i64> {
    notice.payload().parse().ok()
}

/// A pool of one connection for commit notices (Postgres only), apart from the pool that
/// writes: a connection that has LISTENed, handed back to that pool by a listener given up
/// midway, would get its own transaction's notice inside a COMMIT and fail it, as if the
/// commit's outcome were unknown.
fn notice_pool(store: &Store) -> Option<sqlx::PgPool> {
    let Store::Postgres(pool) = store else {
        return None;
    };
    let options = (*pool.connect_options()).clone();
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .acquire_timeout(Duration::from_secs(1))
        .idle_timeout(None)
        .max_lifetime(None)
        .connect_lazy_with(options);
    Some(pool)
}

/// Subscribes to commit notices on `pool`'s connection.
async fn listen(pool: Option<&sqlx::PgPool>) -> Option<sqlx::postgres::PgListener> {
    let mut listener = sqlx::postgres::PgListener::connect_with(pool?).await.ok()?;
    listener.listen(CHANNEL).await.ok()?;
    Some(listener)
}
