//! What the registry counts: the changes this process commits, the tree, the database's
//! latency, and how far this process trails the event log.

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use super::ticket::{self, Ticket};
use super::{Registry, Writer, now_ms};
use crate::metrics::{Counter, Gauge, Histogram, header, single};
use crate::store::{StoreError, Tx, Unwritable};

/// The registry's counters, gauges and histograms.
#[derive(Debug, Default)]
pub struct Metrics {
    allocations: Counter,
    releases: Counter,
    reweights: Counter,
    moves: Counter,
    tree_nodes: Gauge,
    transactions: Histogram,
    commits: Histogram,
    applied_event: Gauge,
    follow_delay: Histogram,
    last_follow_delay_ms: Gauge,
    follow_reads: Counter,
    events_dropped: Counter,
    event_horizon: Gauge,
    reloads: Counter,
    pub(super) lease_heartbeats: Counter,
    pub(super) lease_assignments: Counter,
    pub(super) lease_assign_time: Histogram,
    pub(super) controller_rounds: Counter,
    pub(super) controller_moves: Counter,
    pub(super) controller_fanouts: Counter,
    pub(super) outages: Outages,
}

/// Time without a writable database, by the reason a look at it found.
#[derive(Debug, Default)]
pub(super) struct Outages {
    /// When the database was last looked at, and why it took no writes then, if it did not.
    last: std::sync::Mutex<Option<(Instant, Option<Unwritable>)>>,
    /// Milliseconds, by [`Unwritable::ALL`]'s order.
    ms: [Counter; Unwritable::ALL.len()],
}

impl Outages {
    /// Counts the time since the last look to what that look found, and remembers `found`.
    pub(super) fn note(&self, found: Result<(), Unwritable>) {
        let now = Instant::now();
        let mut last = self.last.lock().expect("outages lock poisoned");
        if let Some((at, Some(reason))) = *last {
            let ms = now.duration_since(at).as_millis() as u64;
            self.ms[reason as usize].add(ms);
        }
        *last = Some((now, found.err()));
    }

    fn render(&self, out: &mut String) {
        const NAME: &str = "keyspread_database_unwritable_seconds_total";
        header(
            out,
            NAME,
            "counter",
            "Seconds without a database that takes writes, by what GET /readyz/writes found \
             (unreachable, read_only, in_recovery, disk_full).",
        );
        for reason in Unwritable::ALL {
            let seconds = self.ms[reason as usize].get() as f64 / 1e3;
            let _ = writeln!(out, "{NAME}{{reason=\"{}\"}} {seconds}", reason.as_str());
        }
    }
}

/// Commits `tx` at the commit point of the changes `tickets` stand for, timing the COMMIT
/// in `commits` if given: refused ([`super::Error::NotMade`], rolled back) when one of them was
/// refused or is past its deadline; when the database rolled it back, the tickets go back
/// before their commit point (the change was not made); when its result is unknowable,
/// they stay past it (their callers are answered that).
pub(super) async fn settle(
    tx: Tx,
    tickets: &[&Ticket],
    commits: Option<&Histogram>,
) -> Result<(), super::Error> {
    if ticket::commit_all(tickets).is_err() {
        drop(tx);
        return Err(super::Error::NotMade);
    }
    let committing = Instant::now();
    let done = tx.commit().await;
    if let Some(commits) = commits {
        commits.observe(committing.elapsed());
    }
    match done {
        Ok(()) => Ok(()),
        Err(err @ StoreError::OutcomeUnknown(_)) => Err(err.into()),
        Err(err) => {
            for ticket in tickets {
                ticket.rolled_back();
            }
            Err(err.into())
        }
    }
}

/// A change this process committed, for the counters.
#[derive(Debug, Clone, Copy)]
pub(super) enum Committed {
    Allocations(usize),
    Releases(usize),
    Reweight,
    Moves(usize),
    Stream,
}

impl Registry {
    /// Commits `tx` (begun by [`Registry::begin`]) for the changes `tickets` stand for,
    /// timing the commit and the whole transaction, and counts what it changed. Here, under
    /// the write lock, is each change's commit point (see [`Ticket::commit_point`]): if one
    /// was refused meanwhile, nothing commits.
    pub(super) async fn commit(
        &self,
        w: &mut Writer,
        tx: Tx,
        what: Committed,
        tickets: &[&Ticket],
    ) -> Result<(), super::Error> {
        let started = w.tx_started.take();
        settle(tx, tickets, Some(&self.metrics.commits)).await?;
        if let Some(started) = started {
            self.metrics.transactions.observe(started.elapsed());
        }
        self.count(what);
        Ok(())
    }

    /// Counts a change committed in one round trip begun at `started`: its transaction and
    /// its commit are the same wait.
    pub(super) fn count_committed(&self, started: Instant, what: Committed) {
        let elapsed = started.elapsed();
        self.metrics.commits.observe(elapsed);
        self.metrics.transactions.observe(elapsed);
        self.count(what);
    }

    fn count(&self, what: Committed) {
        let m = &self.metrics;
        match what {
            Committed::Allocations(n) => m.allocations.add(n as u64),
            Committed::Releases(n) => m.releases.add(n as u64),
            Committed::Reweight => m.reweights.add(1),
            Committed::Moves(n) => m.moves.add(n as u64),
            Committed::Stream => {}
        }
    }

    /// Write transactions this process has committed, or tried to.
    pub fn transactions(&self) -> u64 {
        self.metrics.commits.count()
    }

    /// Records that event `id` is applied to memory.
    pub(super) fn count_applied(&self, w: &Writer, id: i64) {
        self.metrics.applied_event.set(id);
        self.applied.send_if_modified(|a| {
            let newer = id > a.event;
            a.event = a.event.max(id);
            newer
        });
        self.metrics.tree_nodes.set(w.alloc.tree_nodes() as i64);
    }

    /// Counts a compaction: `dropped` events, leaving the log's horizon at `horizon`.
    pub(super) fn count_compacted(&self, dropped: u64, horizon: i64) {
        self.metrics.events_dropped.add(dropped);
        self.metrics.event_horizon.set(horizon);
    }

    /// Counts a reload of the whole table after compaction passed this process by.
    pub(super) fn count_reload(&self) {
        self.metrics.reloads.add(1);
    }

    /// The id of the newest event applied to memory, without waiting for the writer.
    pub(super) fn applied_event(&self) -> i64 {
        self.metrics.applied_event.get()
    }

    /// Counts a read of the event log by the follower.
    pub(super) fn count_follow_read(&self) {
        self.metrics.follow_reads.add(1);
    }

    /// Records how long after its commit (at `at`) an event of another writer got here.
    pub(super) fn count_followed(&self, at: i64) {
        // Clocks of different hosts may disagree a little: never below zero.
        let delay = u64::try_from(now_ms() - at).unwrap_or(0);
        self.metrics
            .follow_delay
            .observe(Duration::from_millis(delay));
        self.metrics.last_follow_delay_ms.set(delay as i64);
    }

    /// Keys a staged move is switching after `now` (Unix milliseconds): their old value is
    /// still the one producers send.
    pub fn switching_keys(&self, now: i64) -> usize {
        let accounts = self.accounts.read().expect("accounts lock poisoned");
        accounts.switching_after(now)
    }

    /// The registry's metrics in the Prometheus text format; reads the log's newest event
    /// id from the database (left out while the database does not answer).
    pub async fn render_metrics(&self, out: &mut String) {
        let m = &self.metrics;
        let counters = [
            (
                "keyspread_allocations_total",
                "Accounts given a new hash key by this process.",
                &m.allocations,
            ),
            (
                "keyspread_releases_total",
                "Hash keys released by this process.",
                &m.releases,
            ),
            (
                "keyspread_reweights_total",
                "Weight changes committed by this process.",
                &m.reweights,
            ),
            (
                "keyspread_rebalance_moves_total",
                "Accounts moved to another key by rebalances this process applied.",
                &m.moves,
            ),
            (
                "keyspread_controller_rounds_total",
                "Load controller rounds this process ran (acting or not).",
                &m.controller_rounds,
            ),
            (
                "keyspread_controller_moves_total",
                "Keys the load controller moved in this process's rounds.",
                &m.controller_moves,
            ),
            (
                "keyspread_controller_fanouts_total",
                "Fanouts the load controller raised or lowered in this process's rounds.",
                &m.controller_fanouts,
            ),
            (
                "keyspread_lease_heartbeats_total",
                "Consumer workers' joins and heartbeats this process answered.",
                &m.lease_heartbeats,
            ),
            (
                "keyspread_lease_assignments_total",
                "Times this process assigned a stream's leases again (a join, leave, expiry, \
                 SHARD_END, new map or moved weights); heartbeats in between assign nothing.",
                &m.lease_assignments,
            ),
            (
                "keyspread_follow_reads_total",
                "Reads of the event log between writes: at each poll, and at each commit \
                 notice of another writer (a notice of this process's own commit needs none).",
                &m.follow_reads,
            ),
            (
                "keyspread_events_compacted_total",
                "Events of the log this process's compactions dropped (--event-retention).",
                &m.events_dropped,
            ),
            (
                "keyspread_table_reloads_total",
                "Times this process read the whole table again because events it had not \
                 applied were compacted away.",
                &m.reloads,
            ),
        ];
        for (name, help, counter) in counters {
            single(out, name, "counter", help, counter.get());
        }
        single(
            out,
            "keyspread_accounts",
            "gauge",
            "Accounts holding a hash key.",
            self.len(),
        );
        let switching = self.switching_keys(super::now_ms());
        single(
            out,
            "keyspread_switching_keys",
            "gauge",
            "Keys a staged move is switching: their old value is still the one producers send.",
            switching,
        );
        single(
            out,
            "keyspread_tree_nodes",
            "gauge",
            "Nodes of the allocation tree in memory.",
            m.tree_nodes.get(),
        );
        header(
            out,
            "keyspread_db_transaction_seconds",
            "histogram",
            "Write transactions, from begin (the write lock included) to commit.",
        );
        m.transactions
            .render(out, "keyspread_db_transaction_seconds", "");
        header(
            out,
            "keyspread_db_commit_seconds",
            "histogram",
            "Commits of write transactions (for a one-round-trip allocation, the whole round trip).",
        );
        m.commits.render(out, "keyspread_db_commit_seconds", "");
        header(
            out,
            "keyspread_lease_assignment_seconds",
            "histogram",
            "Assignments of a stream's leases: reading its leases and workers, assigning, writing the changes.",
        );
        m.lease_assign_time
            .render(out, "keyspread_lease_assignment_seconds", "");
        single(
            out,
            "keyspread_event_horizon_id",
            "gauge",
            "The log's horizon as this process's last compaction left it: events at or below \
             it may be gone, and GET /events after an id below it answers 410.",
            m.event_horizon.get(),
        );
        let applied = m.applied_event.get();
        single(
            out,
            "keyspread_event_applied_id",
            "gauge",
            "Id of the newest event applied to this process's memory.",
            applied,
        );
        if let Ok(head) = self.store.last_event_id().await {
            single(
                out,
                "keyspread_event_log_id",
                "gauge",
                "Id of the newest event in the database's log.",
                head,
            );
            single(
                out,
                "keyspread_replica_lag_events",
                "gauge",
                "Events in the log not yet applied here.",
                (head - applied).max(0),
            );
        }
        header(
            out,
            "keyspread_replica_delay_seconds",
            "histogram",
            "From another writer's commit of an event to its application here.",
        );
        m.follow_delay
            .render(out, "keyspread_replica_delay_seconds", "");
        m.outages.render(out);
        single(
            out,
            "keyspread_replica_last_delay_seconds",
            "gauge",
            "Delay of the last event followed from another writer.",
            m.last_follow_delay_ms.get() as f64 / 1e3,
        );
    }
}
