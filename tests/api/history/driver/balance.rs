//! (f) When quiet, the leased stream's leases keep the balance DESIGN sets: by load once
//! every shard has been reported (the band's upper and lower edges over the utilisations
//! `GET /leases` shows), lease counts within one of each other before.

use std::collections::HashMap;
use std::time::Duration;

use keyspread::keyspace::leases::{balanced, inside_band};
use reqwest::Method;
use serde_json::json;

use super::super::Violation;
use super::{Driver, LEASED, TTL_S, WORKERS};

/// The replicas' `--load-tolerance` (see `faults::CONTROLLER`).
const TOLERANCE: f64 = 0.05;
/// Rounds of heartbeats after loads are checked again: one to assign, then the old owners
/// give their leases up and the new ones take them.
const ROUNDS: usize = 3;
/// Between those rounds (no worker joins then: those back from away joined at the report).
const PAUSE_MS: u64 = 100;

impl Driver {
    /// Every worker back and reporting what it read of each shard it holds; once loads
    /// are checked again (5 s on), heartbeats until the hand-overs are done; then the
    /// assignment `GET /leases` answers is judged. Answers how the check ended.
    pub(super) async fn leases_balanced(&mut self) -> Balance {
        let back = self.workers.iter().map(|w| w.away_until).max().unwrap_or(0);
        let wait = back - self.clock.now();
        if wait > 0 {
            tokio::time::sleep(Duration::from_millis(wait as u64)).await;
        }
        // A round first, so that each worker reports the shards it holds now.
        for w in 0..WORKERS {
            let r = self.pick(true);
            self.beat_with(w, r, None).await;
        }
        for w in 0..WORKERS {
            let load: Vec<_> = (self.workers[w].owned.clone().into_iter())
                .map(|(shard, epoch)| {
                    let records = 100 + self.below(5);
                    json!({"shard_id": shard, "epoch": epoch, "window_ms": 1000,
                           "records": records, "bytes": records * 100})
                })
                .collect();
            let r = self.pick(true);
            self.beat_with(w, r, Some(load)).await;
        }
        // Heartbeats a third of the ttl apart until loads are checked again (5 s on; the
        // joins of workers back from away are assigned meanwhile), then rounds that finish
        // the hand-overs.
        let recheck = self.clock.now() + keyspread::registry::WEIGHT_RECHECK_MS + 200;
        let mut rounds = 0;
        while rounds < ROUNDS {
            for w in 0..WORKERS {
                let r = self.pick(true);
                self.beat_with(w, r, None).await;
            }
            if self.clock.now() >= recheck {
                rounds += 1;
            }
            let pause = if rounds == 0 {
                TTL_S * 1000 / 3
            } else {
                PAUSE_MS
            };
            tokio::time::sleep(Duration::from_millis(pause)).await;
        }
        let r = self.pick(false);
        let path = format!("/streams/{LEASED}/leases");
        let (status, group) = self.call(r, "leases", Method::GET, path, None).await;
        if status != 200 {
            return Balance::Unsettled;
        }
        let workers: HashMap<&str, usize> = (group["workers"].as_array().into_iter().flatten())
            .enumerate()
            .map(|(i, w)| (w["worker"].as_str().unwrap_or_default(), i))
            .collect();
        let shards = group["shards"].as_array().cloned().unwrap_or_default();
        if workers.len() != WORKERS || shards.iter().any(|s| s["state"] != "held") {
            return Balance::Unsettled;
        }
        let owners: Vec<Option<usize>> = (shards.iter())
            .map(|s| s["owner"].as_str().and_then(|o| workers.get(o).copied()))
            .collect();
        let loads: Vec<f64> = (shards.iter())
            .map(|s| s["utilisation"].as_f64().unwrap_or(0.0))
            .collect();
        let (by, kept) = if loads.iter().all(|&l| l > 0.0) {
            ("load", inside_band(&loads, WORKERS, &owners, TOLERANCE))
        } else {
            ("count", balanced(&vec![1; loads.len()], WORKERS, &owners))
        };
        if kept {
            return Balance::Kept;
        }
        self.quiet_violations.push(Violation {
            check: "(f) leases balanced when quiet",
            what: format!(
                "by {by} at +{} ms, {ROUNDS} heartbeat rounds after the last report: utilisations {loads:?}, owners {owners:?} (ttl {TTL_S} s): {group}",
                self.clock.rel(self.clock.now())
            ),
        });
        Balance::Broken
    }
}

/// How a balance check ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Balance {
    Kept,
    Broken,
    /// A hand-over still pending, or a heartbeat refused: not judged.
    Unsettled,
}
