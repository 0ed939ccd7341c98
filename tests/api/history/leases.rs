//! (c) Lease answers: no two live workers told `held` for one shard at once.
//!
//! A worker holds a shard, by the test's clock, from receiving an answer that says `held`
//! until receiving one that does not (or says another epoch), or sending its leave, or
//! (unanswered since) its last answered heartbeat's send time plus the ttl: the rule
//! tests/api/leases_replicas.rs holds workers to.

use std::collections::{BTreeMap, HashMap};

use reqwest::Method;
use serde_json::Value;

use super::Violation;
use super::driver::{History, LEASED};

#[derive(Debug, Clone)]
pub struct Period {
    pub worker: String,
    pub shard: String,
    pub epoch: u64,
    pub from: i64,
    pub until: i64,
}

/// Every held period the workers' answers imply.
pub fn periods(history: &History) -> Vec<Period> {
    let mut by_worker: BTreeMap<&str, Vec<&super::Call>> = BTreeMap::new();
    for call in &history.calls {
        // The leased stream's workers: the primary stream's reader holds shards of the same
        // names.
        if !call.path.starts_with(&format!("/streams/{LEASED}/")) {
            continue;
        }
        if let Some((_, worker)) = call.path.split_once("/workers/") {
            by_worker.entry(worker).or_default().push(call);
        }
    }
    let ttl = history.ttl_ms;
    let mut out = Vec::new();
    for (worker, mut calls) in by_worker {
        calls.sort_by_key(|c| c.sent);
        let mut h = Holding {
            worker,
            shards: HashMap::new(),
            out: &mut out,
        };
        let mut last: Option<i64> = None;
        for call in calls {
            if call.method == Method::DELETE {
                h.close_all(call.sent);
                last = None;
                continue;
            }
            if call.status != 200 {
                continue;
            }
            if let Some(prev) = last
                && call.received >= prev + ttl
            {
                h.close_all(prev + ttl);
            }
            let held: HashMap<String, u64> = (call.answer["leases"].as_array().unwrap().iter())
                .filter(|l| l["state"] == "held")
                .map(|l| {
                    let shard = l["shard_id"].as_str().unwrap().to_owned();
                    (shard, l["epoch"].as_u64().unwrap())
                })
                .collect();
            let was: Vec<(String, u64)> = (h.shards.iter())
                .map(|(s, (e, _))| (s.clone(), *e))
                .collect();
            for (shard, epoch) in was {
                if held.get(&shard) != Some(&epoch) {
                    h.close(&shard, call.received);
                }
            }
            last = Some(call.sent);
            if call.received < call.sent + ttl {
                for (shard, epoch) in held {
                    h.shards.entry(shard).or_insert((epoch, call.received));
                }
            }
        }
        h.close_all(last.map_or(history.end, |l| history.end.min(l + ttl)));
    }
    out
}

/// One worker's open periods: shard -> (epoch, since).
struct Holding<'a> {
    worker: &'a str,
    shards: HashMap<String, (u64, i64)>,
    out: &'a mut Vec<Period>,
}

impl Holding<'_> {
    fn close(&mut self, shard: &str, at: i64) {
        let (epoch, from) = self.shards.remove(shard).expect("held");
        self.out.push(Period {
            worker: self.worker.to_owned(),
            shard: shard.to_owned(),
            epoch,
            from,
            until: at,
        });
    }

    fn close_all(&mut self, at: i64) {
        let shards: Vec<String> = self.shards.keys().cloned().collect();
        for shard in shards {
            self.close(&shard, at);
        }
    }
}

pub fn judge(history: &History) -> Vec<Violation> {
    let mut by_shard: BTreeMap<String, Vec<Period>> = BTreeMap::new();
    for p in periods(history) {
        by_shard.entry(p.shard.clone()).or_default().push(p);
    }
    let mut out = Vec::new();
    for (shard, mut periods) in by_shard {
        periods.sort_by_key(|p| p.from);
        for (i, b) in periods.iter().enumerate() {
            if let Some(a) = periods[..i]
                .iter()
                .find(|a| a.worker != b.worker && a.until > b.from)
            {
                // What happened to the group in between: map changes, leaves, SHARD_END.
                let mut between: Vec<String> = (history.calls.iter())
                    .filter(|c| c.sent >= a.from - 1000 && c.sent <= b.from)
                    .filter(|c| {
                        let end = c
                            .body
                            .as_ref()
                            .is_some_and(|b| b["sequence_number"] == "SHARD_END");
                        (matches!(c.op, "stream" | "leave") || end)
                            && c.path.starts_with("/streams/l")
                    })
                    .map(|c| {
                        format!(
                            "{} {} on r{} at +{} ms: {}",
                            c.method,
                            c.path,
                            c.replica,
                            history.clock.rel(c.sent),
                            c.status
                        )
                    })
                    .collect();
                between.drain(..between.len().saturating_sub(4));
                // Every call on the shard meanwhile: what each worker was told of it.
                let on_shard: Vec<String> = (history.calls.iter())
                    .filter(|c| c.sent >= a.from - 1000 && c.sent <= b.from)
                    .filter_map(|c| {
                        let told = c.answer["leases"]
                            .as_array()
                            .and_then(|ls| ls.iter().find(|l| l["shard_id"] == shard.as_str()));
                        let told = match told {
                            Some(l) => format!("{} at epoch {}", l["state"], l["epoch"]),
                            None if c.path.contains("/workers/") => "not told of it".to_owned(),
                            None if c.path.contains(&format!("/{shard}/")) => {
                                c.body.as_ref().map_or(String::new(), Value::to_string)
                            }
                            None => return None,
                        };
                        // The database's clock as the heartbeat read it: its answer's
                        // expiry less the ttl. Outside +sent..+received, the clocks differ.
                        let server = (c.answer["expires_at"].as_str())
                            .and_then(|at| {
                                use time::format_description::well_known::Rfc3339;
                                time::OffsetDateTime::parse(at, &Rfc3339).ok()
                            })
                            .map_or(String::new(), |at| {
                                let ms = (at.unix_timestamp_nanos() / 1_000_000) as i64;
                                let now = ms - history.ttl_ms;
                                format!(" (database clock +{})", history.clock.rel(now))
                            });
                        Some(format!(
                            "{} {} on r{} +{}..+{}{server}: {} {told}",
                            c.method,
                            c.path,
                            c.replica,
                            history.clock.rel(c.sent),
                            history.clock.rel(c.received),
                            c.status,
                        ))
                    })
                    .collect();
                out.push(Violation {
                    check: "(c) no two live workers told held for one shard",
                    what: format!(
                        "{shard}: {} was told held at epoch {} at +{} ms while {} held it at epoch {} (+{}..+{} ms); before: {between:?}",
                        b.worker,
                        b.epoch,
                        history.clock.rel(b.from),
                        a.worker,
                        a.epoch,
                        history.clock.rel(a.from),
                        history.clock.rel(a.until),
                    ) + &format!("\n    calls on the shard meanwhile:\n      {}", on_shard.join("\n      ")),
                });
            }
        }
    }
    out
}
