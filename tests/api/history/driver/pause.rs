//! The pause fault: a replica stopped (SIGSTOP: a long stall, a VM frozen) with changes in
//! flight and lookups queued at it, while the others change the table; sometimes longer
//! than the lookups' max-age, sometimes longer than the request timeout. What it answers
//! when it resumes is judged as every answer is: refused changes never made (see
//! `refusals`), lookups against the log with no allowance for the pause.

use std::time::Duration;

use reqwest::Method;
use serde_json::json;
use tokio::task::JoinSet;

use super::{Driver, send};

/// Marks the accounts a pause's changes touch (a rebalance may move them, and weigh them).
pub const PAUSED: &str = "paused-";

/// The operation name of a pause's changes.
pub const PAUSED_OP: &str = "paused";

impl Driver {
    /// Pauses a replica for 2 to 7 s, or one time in three 10.5 to 12.5 s (past the 10 s
    /// request timeout); answers which, and when it resumed.
    pub(super) async fn pause(&mut self) -> (usize, i64) {
        let r = self.faults_rng.below(self.replicas.len() as u64) as usize;
        let tag = format!("{PAUSED}{}", self.pauses);
        self.pauses += 1;
        let held: Vec<String> = (0..2).map(|i| format!("{tag}-held-{i}")).collect();
        for account in &held {
            self.call(
                r,
                "allocate",
                Method::POST,
                format!("/keys/{account}"),
                None,
            )
            .await;
        }
        let batch: Vec<_> = (0..2)
            .map(|i| json!({"account": format!("{tag}-batch-{i}")}))
            .collect();
        let changes = [
            ("allocate", Method::POST, format!("/keys/{tag}-new-0"), None),
            ("allocate", Method::POST, format!("/keys/{tag}-new-1"), None),
            (
                "batch",
                Method::POST,
                "/keys/batch".to_owned(),
                Some(json!({"accounts": batch})),
            ),
            (
                "release",
                Method::DELETE,
                format!("/keys/{}", held[0]),
                None,
            ),
            (
                "patch",
                Method::PATCH,
                format!("/keys/{}", held[1]),
                Some(json!({"weight": 7})),
            ),
        ];
        let url = self.replicas.urls[r].clone();
        let mut flight = JoinSet::new();
        for (op, method, path, body) in changes {
            let (client, clock, url) = (self.client.clone(), self.clock, url.clone());
            flight
                .spawn(async move { send(&client, clock, &url, r, op, method, path, body).await });
        }
        let lead = 10 + self.faults_rng.below(60);
        tokio::time::sleep(Duration::from_millis(lead)).await;
        self.replicas.signal(r, "STOP");
        let stopped = self.clock.now();
        let long = self.faults_rng.below(3) == 0;
        let pause = if long {
            10_500 + self.faults_rng.below(2_000)
        } else {
            2_000 + self.faults_rng.below(5_000)
        };
        // The others release accounts it knows; more than the follow bound later, lookups
        // of them reach it stopped, answered when it resumes: from its old table they would
        // be the keys it had, which the walk hands out again at once.
        let recent: Vec<String> = self.recent.iter().rev().take(3).cloned().collect();
        if let Some(other) = self.other(r) {
            for account in &recent {
                let path = format!("/keys/{account}");
                self.call(other, "release", Method::DELETE, path, None)
                    .await;
            }
        }
        tokio::time::sleep(Duration::from_millis(1_100)).await;
        for account in &recent {
            let (client, clock, url) = (self.client.clone(), self.clock, url.clone());
            let path = format!("/keys/{account}");
            flight.spawn(async move {
                send(&client, clock, &url, r, "lookup", Method::GET, path, None).await
            });
        }
        let resume_at = stopped + pause as i64;
        let left = (resume_at - self.clock.now()).max(0) as u64;
        tokio::time::sleep(Duration::from_millis(left)).await;
        self.replicas.signal(r, "CONT");
        let resumed = self.clock.now();
        while let Some(call) = flight.join_next().await {
            self.calls.push(call.expect("a paused call's task"));
        }
        (r, resumed)
    }
}
