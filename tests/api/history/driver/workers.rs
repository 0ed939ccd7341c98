//! The consumer side of a history: workers that join, heartbeat, checkpoint, leave and go
//! silent, and map changes of their stream followed at once by calls through a replica
//! that may not have seen the new map.

use reqwest::Method;
use serde_json::{Value, json};

use super::{Driver, LEASED, PRIMARY, TTL_S, WORKERS, send};

impl Driver {
    /// A worker that is not away, if any.
    pub(super) fn present(&mut self) -> Option<usize> {
        let now = self.clock.now();
        let here: Vec<usize> = (0..WORKERS)
            .filter(|&w| self.workers[w].away_until <= now)
            .collect();
        (!here.is_empty()).then(|| here[self.below(here.len() as u64) as usize])
    }

    /// A new map for the leased stream, and every present worker heartbeating on it
    /// through that replica; then, at once, a leave or a checkpoint through another
    /// replica, which may not have seen the new map yet. Or (where followers wake on a
    /// notification, as on Postgres, and catch up within milliseconds) a leave sent
    /// through another replica while the map is being put.
    pub(super) async fn change_map(&mut self, follow_up: bool) {
        let r = self.pick(true);
        let body = json!({"shard_count": 1 + self.below(8)});
        let path = format!("/streams/{LEASED}");
        let racing = match (self.below(2), self.other(r), self.present()) {
            (0, Some(other), Some(w)) if !follow_up => Some((other, w)),
            _ => None,
        };
        let status = match racing {
            Some((other, w)) => {
                let url = self.replicas.urls[other].clone();
                let leaving = format!("/streams/{LEASED}/workers/{}", self.workers[w].name);
                let (client, clock) = (self.client.clone(), self.clock);
                let leave = tokio::spawn(async move {
                    send(
                        &client,
                        clock,
                        &url,
                        other,
                        "leave",
                        Method::DELETE,
                        leaving,
                        None,
                    )
                    .await
                });
                let (status, _) = self.call(r, "stream", Method::PUT, path, Some(body)).await;
                self.beat_all(r, Some(w)).await;
                self.calls.push(leave.await.expect("the leave"));
                self.away(w);
                status
            }
            None => {
                self.call(r, "stream", Method::PUT, path, Some(body))
                    .await
                    .0
            }
        };
        if status != 200 || racing.is_some() || (self.below(4) == 0 && !follow_up) {
            return;
        }
        self.beat_all(r, None).await;
        let Some(other) = self.other(r) else { return };
        let Some(w) = self.present() else { return };
        if self.below(3) != 0 {
            self.leave(other, w).await;
        } else {
            self.checkpoint(other, w, true).await;
        }
    }

    /// Every present worker but `except` heartbeats through `r`, from a random one on.
    async fn beat_all(&mut self, r: usize, except: Option<usize>) {
        let (now, first) = (self.clock.now(), self.below(WORKERS as u64) as usize);
        for w in (0..WORKERS).map(|i| (first + i) % WORKERS) {
            if self.workers[w].away_until <= now && except != Some(w) {
                self.beat(w, r).await;
            }
        }
    }

    pub(super) async fn leave(&mut self, r: usize, w: usize) {
        let path = format!("/streams/{LEASED}/workers/{}", self.workers[w].name);
        self.call(r, "leave", Method::DELETE, path, None).await;
        self.away(w);
    }

    /// `w` has left: it comes back after a while.
    fn away(&mut self, w: usize) {
        let back = 500 + self.below(2000) as i64;
        let worker = &mut self.workers[w];
        worker.owned.clear();
        worker.away_until = self.clock.now() + back;
    }

    /// A checkpoint of one of `w`'s leases; `end` says `SHARD_END` (as a worker that
    /// believes the shard closed would).
    pub(super) async fn checkpoint(&mut self, r: usize, w: usize, end: bool) {
        if self.workers[w].owned.is_empty() {
            return;
        }
        let i = self.below(self.workers[w].owned.len() as u64) as usize;
        let end = end || self.below(25) == 0;
        let worker = &mut self.workers[w];
        worker.sequence += 1;
        let (shard, epoch) = worker.owned[i].clone();
        let sequence = if end {
            "SHARD_END".to_owned()
        } else {
            worker.sequence.to_string()
        };
        let body = json!({"worker": worker.name, "epoch": epoch, "sequence_number": sequence});
        let path = format!("/streams/{LEASED}/leases/{shard}/checkpoint");
        self.call(r, "checkpoint", Method::PUT, path, Some(body))
            .await;
    }

    /// Every worker due beats (a third of its ttl after its last answered heartbeat).
    pub(super) async fn heartbeats(&mut self) {
        std::mem::swap(&mut self.rng, &mut self.beats_rng);
        self.beat_due().await;
        std::mem::swap(&mut self.rng, &mut self.beats_rng);
    }

    async fn beat_due(&mut self) {
        // From a random worker on: who beats first decides who gets a free shard.
        let first = self.below(WORKERS as u64) as usize;
        for w in (0..WORKERS).map(|i| (first + i) % WORKERS) {
            let now = self.clock.now();
            let worker = &self.workers[w];
            if now >= worker.away_until && now >= worker.next_beat {
                let r = self.pick(true);
                self.beat(w, r).await;
            }
        }
    }

    /// The primary stream's reader reports what it read every 700 ms: most on its first
    /// shard, a few accounts named, so that the load controller moves keys and raises
    /// fanouts while the other operations go on.
    pub(super) async fn report_load(&mut self) {
        if self.clock.now() < self.reporter.next_beat {
            return;
        }
        std::mem::swap(&mut self.rng, &mut self.load_rng);
        self.report().await;
        std::mem::swap(&mut self.rng, &mut self.load_rng);
    }

    async fn report(&mut self) {
        let now = self.clock.now();
        let window_ms = (now - self.last_report).clamp(1, 3_600_000) as u64;
        let mut load = Vec::new();
        for (n, (shard, epoch)) in self.reporter.owned.clone().into_iter().enumerate() {
            let per_s = 80 / (n as u64 + 1) + self.below(20);
            let records = per_s * window_ms / 1000;
            let (mut named, mut left) = (Vec::<String>::new(), records);
            for _ in 0..self.below(4) {
                let account = self.account();
                if !named.contains(&account) {
                    named.push(account);
                }
            }
            let accounts: Vec<Value> = (named.into_iter())
                .map(|account| {
                    let records = left / 2;
                    left -= records;
                    json!({"account": account, "records": records, "bytes": records * 100})
                })
                .collect();
            load.push(json!({
                "shard_id": shard, "epoch": epoch, "window_ms": window_ms,
                "records": records, "bytes": records * 100, "accounts": accounts,
            }));
        }
        let r = self.pick(true);
        let path = format!("/streams/{PRIMARY}/workers/{}", self.reporter.name);
        let body = json!({"ttl_s": TTL_S, "load": load});
        let (status, answer) = self.call(r, "report", Method::PUT, path, Some(body)).await;
        if status == 200 {
            self.reporter.owned = (answer["leases"].as_array().into_iter().flatten())
                .filter(|l| l["state"] == "held")
                .map(|l| {
                    let shard = l["shard_id"].as_str().unwrap().to_owned();
                    (shard, l["epoch"].as_u64().unwrap())
                })
                .collect();
            self.last_report = now;
            self.reporter.next_beat = now + 700;
        } else {
            self.reporter.next_beat = now + 300;
        }
    }

    async fn beat(&mut self, w: usize, r: usize) {
        self.beat_with(w, r, None).await;
    }

    /// A heartbeat of `w` through `r`, reporting `load` if given.
    pub(super) async fn beat_with(&mut self, w: usize, r: usize, load: Option<Vec<Value>>) {
        let now = self.clock.now();
        let path = format!("/streams/{LEASED}/workers/{}", self.workers[w].name);
        let body = match load {
            Some(load) => json!({"ttl_s": TTL_S, "load": load}),
            None => json!({"ttl_s": TTL_S}),
        };
        let (status, answer) = self
            .call(r, "heartbeat", Method::PUT, path, Some(body))
            .await;
        let worker = &mut self.workers[w];
        if status == 200 {
            worker.owned = (answer["leases"].as_array().into_iter().flatten())
                .map(|l| {
                    let shard = l["shard_id"].as_str().unwrap().to_owned();
                    (shard, l["epoch"].as_u64().unwrap())
                })
                .collect();
            worker.next_beat = now + (TTL_S * 1000 / 3) as i64;
        } else {
            worker.next_beat = now + 300;
        }
    }
}
