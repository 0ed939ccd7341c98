//! The crash test's clients: they allocate, release, look up and rebalance through kills
//! and restarts, retrying what got no answer, and record what they were promised.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use reqwest::Method;
use serde_json::{Value, json};

use crate::process::Rng;

/// Most accounts a client holds at once, so that rebalance plans stay small.
const LIVE: usize = 12;
/// How long one operation is retried while the server is down.
const RETRY_FOR: Duration = Duration::from_secs(10);
const RETRY_PAUSE: Duration = Duration::from_millis(20);
/// Fanouts clients ask for, on allocation and in `PATCH`.
const FANOUTS: [u32; 7] = [1, 2, 3, 4, 6, 8, 16];

/// Where the server is now (each restart has a new port), and whether to stop.
pub struct Target {
    url: RwLock<String>,
    stop: AtomicBool,
    /// Clients rebalancing now: the others start nothing new meanwhile, or every plan
    /// would be stale by the time it is applied.
    quiet: AtomicU32,
    pub client: reqwest::Client,
}

impl Target {
    pub fn new() -> Arc<Target> {
        Arc::new(Target {
            url: RwLock::new(String::new()),
            stop: AtomicBool::new(false),
            quiet: AtomicU32::new(0),
            client: reqwest::Client::builder()
                .timeout(Duration::from_secs(5))
                .build()
                .unwrap(),
        })
    }

    pub fn point_at(&self, url: &str) {
        *self.url.write().unwrap() = url.to_owned();
    }

    /// Clients finish the operation they are in and start no other.
    pub fn stop(&self) {
        self.stop.store(true, Ordering::SeqCst);
    }

    async fn send(&self, method: Method, path: &str, body: Option<Value>) -> Reply {
        let url = format!("{}{path}", self.url.read().unwrap());
        let mut request = self.client.request(method, url);
        if let Some(body) = body {
            request = request.json(&body);
        }
        match request.send().await {
            Ok(response) => {
                let status = response.status().as_u16();
                match response.json::<Value>().await {
                    Ok(body) => Reply::Answer(status, body),
                    Err(_) if status == 204 => Reply::Answer(status, Value::Null),
                    // The connection broke while the answer was read.
                    Err(_) => Reply::Lost { sent: true },
                }
            }
            // A refused connection never reached the server; anything else may have.
            Err(err) => Reply::Lost {
                sent: !err.is_connect(),
            },
        }
    }
}

enum Reply {
    Answer(u16, Value),
    Lost { sent: bool },
}

/// One thing a client asked about one of its accounts, and what it was told.
#[derive(Debug, Clone)]
pub enum Op {
    /// `keys` are the acknowledged hash keys, by index; `None` when no answer acknowledged
    /// them.
    Allocate {
        weight: u64,
        fanout: u32,
        keys: Option<Vec<u128>>,
    },
    /// A change of weight and fanout (`PATCH`), with the keys acknowledged after it.
    Resize {
        weight: u64,
        fanout: u32,
        keys: Option<Vec<u128>>,
    },
    /// `acked` when an answer said the account is released.
    Release { acked: bool },
}

/// What one client saw.
#[derive(Default)]
pub struct Record {
    /// Each account's operations in order; an account belongs to one client only.
    pub accounts: BTreeMap<String, Vec<Op>>,
    /// The moves of applied rebalances: account, key index, from, to.
    pub moves: Vec<(String, u32, u128, u128)>,
    /// Answers that broke a promise on the spot.
    pub anomalies: Vec<String>,
    /// Requests answered by nothing (the server was down) or by a 5xx.
    pub failed: u64,
    pub server_errors: u64,
    /// Rebalances applied, and refused as stale (409).
    pub rebalances: u64,
    pub stale_plans: u64,
    pub lookups: u64,
}

/// Runs client `n` until the target says stop.
pub async fn run(target: Arc<Target>, seed: u64, n: u64) -> Record {
    let mut rng = Rng::new(seed ^ n.wrapping_mul(0xA076_1D64_78BD_642F));
    let mut c = Client {
        target,
        record: Record::default(),
    };
    let (mut live, mut released) = (Vec::<String>::new(), Vec::<String>::new());
    let mut named = 0;
    while !c.target.stop.load(Ordering::SeqCst) {
        if c.target.quiet.load(Ordering::SeqCst) > 0 {
            tokio::time::sleep(Duration::from_millis(5)).await;
            continue;
        }
        let roll = rng.below(1000);
        if roll < 3 {
            // Moves that switch at once, and moves still pending when the kills come.
            c.rebalance([0, 1, 3][rng.below(3) as usize]).await;
        } else if roll < 50 && !live.is_empty() {
            // Grow or shrink: weight always given, so that it covers the fanout.
            let account = &live[rng.below(live.len() as u64) as usize];
            let fanout = FANOUTS[rng.below(FANOUTS.len() as u64) as usize];
            let weight = u64::from(fanout) + rng.below(8);
            c.resize(account, weight, fanout).await;
        } else if roll < 100 && !live.is_empty() {
            let account = &live[rng.below(live.len() as u64) as usize];
            c.lookup(account).await;
        } else if (roll < 450 && !live.is_empty()) || live.len() >= LIVE {
            let account = live.swap_remove(rng.below(live.len() as u64) as usize);
            if c.release(&account).await {
                released.push(account);
            }
        } else {
            // Now and then an account comes back after its release.
            let account = if !released.is_empty() && rng.below(5) == 0 {
                released.swap_remove(rng.below(released.len() as u64) as usize)
            } else {
                named += 1;
                format!("crash-{n}-{named}")
            };
            // A quarter of the accounts are hot: several keys from the start.
            let fanout = (rng.below(4) == 0).then(|| FANOUTS[1 + rng.below(5) as usize]);
            let least = u64::from(fanout.unwrap_or(1));
            let weight = (rng.below(3) == 0).then(|| least + rng.below(5));
            if c.allocate(&account, weight, fanout).await {
                live.push(account);
            }
        }
    }
    c.record
}

struct Client {
    target: Arc<Target>,
    record: Record,
}

impl Client {
    /// Sends until answered by a 2xx or 4xx, or for `RETRY_FOR`; answers the reply and
    /// whether an earlier attempt may have reached the server.
    async fn until_answered(
        &mut self,
        method: Method,
        path: &str,
        body: Option<Value>,
    ) -> Option<(u16, Value, bool)> {
        let started = Instant::now();
        let mut sent = false;
        while started.elapsed() < RETRY_FOR {
            match self.target.send(method.clone(), path, body.clone()).await {
                Reply::Answer(status, body) if status < 500 => return Some((status, body, sent)),
                Reply::Answer(..) => {
                    self.record.server_errors += 1;
                    sent = true;
                }
                Reply::Lost { sent: maybe } => {
                    self.record.failed += 1;
                    sent |= maybe;
                }
            }
            tokio::time::sleep(RETRY_PAUSE).await;
        }
        None
    }

    /// Allocates `account` with `fanout` keys (1 when `None`); answers whether its keys
    /// were acknowledged.
    async fn allocate(&mut self, account: &str, weight: Option<u64>, fanout: Option<u32>) -> bool {
        let path = format!("/keys/{account}");
        let mut body = json!({});
        if let Some(w) = weight {
            body["weight"] = json!(w);
        }
        if let Some(k) = fanout {
            body["fanout"] = json!(k);
        }
        let fanout = fanout.unwrap_or(1);
        let weight = weight.unwrap_or(u64::from(fanout));
        let ops = self.record.accounts.entry(account.to_owned()).or_default();
        ops.push(Op::Allocate {
            weight,
            fanout,
            keys: None,
        });
        let answer = self.until_answered(Method::POST, &path, Some(body)).await;
        let Some((status, body, retried)) = answer else {
            return false;
        };
        let keys = keys_of(&body, weight, fanout);
        let (200 | 201, Some(keys)) = (status, keys) else {
            let anomaly = format!("{account}: allocation answered {status} {body}");
            self.record.anomalies.push(anomaly);
            return false;
        };
        // The account had no key before this request: only a retry may find one.
        if status == 200 && !retried {
            let anomaly = format!("{account}: a first allocation found a key already held");
            self.record.anomalies.push(anomaly);
        }
        let ops = self.record.accounts.get_mut(account).expect("pushed above");
        *ops.last_mut().expect("pushed above") = Op::Allocate {
            weight,
            fanout,
            keys: Some(keys),
        };
        true
    }

    /// Changes a held account's weight and fanout.
    async fn resize(&mut self, account: &str, weight: u64, fanout: u32) {
        let path = format!("/keys/{account}");
        let body = json!({ "weight": weight, "fanout": fanout });
        let ops = self.record.accounts.entry(account.to_owned()).or_default();
        ops.push(Op::Resize {
            weight,
            fanout,
            keys: None,
        });
        let answer = self.until_answered(Method::PATCH, &path, Some(body)).await;
        let Some((status, body, _)) = answer else {
            return;
        };
        let (200, Some(keys)) = (status, keys_of(&body, weight, fanout)) else {
            let anomaly = format!("{account}: resizing a held account answered {status} {body}");
            self.record.anomalies.push(anomaly);
            return;
        };
        let ops = self.record.accounts.get_mut(account).expect("pushed above");
        *ops.last_mut().expect("pushed above") = Op::Resize {
            weight,
            fanout,
            keys: Some(keys),
        };
    }

    /// Releases `account`; answers whether it is gone for sure.
    async fn release(&mut self, account: &str) -> bool {
        let path = format!("/keys/{account}");
        let ops = self.record.accounts.entry(account.to_owned()).or_default();
        ops.push(Op::Release { acked: false });
        let Some((status, body, retried)) = self.until_answered(Method::DELETE, &path, None).await
        else {
            return false;
        };
        match status {
            // 404 to a retry: an earlier attempt released it and its answer was lost.
            204 => {}
            404 if retried => {}
            _ => {
                let anomaly =
                    format!("{account}: releasing an acknowledged key answered {status} {body}");
                self.record.anomalies.push(anomaly);
                return status == 404;
            }
        }
        let ops = self.record.accounts.get_mut(account).expect("pushed above");
        *ops.last_mut().expect("pushed above") = Op::Release { acked: true };
        true
    }

    /// Looks up an account whose key was acknowledged: it must be there.
    async fn lookup(&mut self, account: &str) {
        self.record.lookups += 1;
        let path = format!("/keys/{account}");
        if let Reply::Answer(status @ 400.., body) =
            self.target.send(Method::GET, &path, None).await
            && status < 500
        {
            let anomaly =
                format!("{account}: lookup of an acknowledged key answered {status} {body}");
            self.record.anomalies.push(anomaly);
        }
    }

    /// Previews a rebalance over 4 shards and applies it at once, while the other clients
    /// hold back; a few tries, as changes already in flight make the first plans stale.
    async fn rebalance(&mut self, switch_after_s: u64) {
        self.target.quiet.fetch_add(1, Ordering::SeqCst);
        for _ in 0..5 {
            tokio::time::sleep(Duration::from_millis(30)).await;
            if self.try_rebalance(switch_after_s).await {
                break;
            }
        }
        self.target.quiet.fetch_sub(1, Ordering::SeqCst);
    }

    /// One preview and apply; answers whether the plan was applied.
    async fn try_rebalance(&mut self, switch_after_s: u64) -> bool {
        let Reply::Answer(200, plan) = self
            .target
            .send(Method::GET, "/rebalance/preview?shards=4", None)
            .await
        else {
            self.record.failed += 1;
            return false;
        };
        let body = json!({ "plan_id": plan["plan_id"], "switch_after_s": switch_after_s });
        match self
            .target
            .send(Method::POST, "/rebalance", Some(body))
            .await
        {
            Reply::Answer(200, applied) => {
                self.record.rebalances += 1;
                let moves = applied["moves"].as_array().cloned().unwrap_or_default();
                for m in moves {
                    let key = |field: &str| m[field].as_str().and_then(|k| k.parse().ok());
                    let account = m["account"].as_str().unwrap_or_default().to_owned();
                    let index = m["index"].as_u64().unwrap_or_default() as u32;
                    let (Some(from), Some(to)) = (key("from"), key("to")) else {
                        self.record
                            .anomalies
                            .push(format!("a move without keys: {m}"));
                        continue;
                    };
                    self.record.moves.push((account, index, from, to));
                }
                return true;
            }
            Reply::Answer(409, _) => self.record.stale_plans += 1,
            Reply::Answer(500.., _) => self.record.server_errors += 1,
            Reply::Answer(status, body) => {
                let anomaly = format!("applying a fresh plan answered {status} {body}");
                self.record.anomalies.push(anomaly);
            }
            Reply::Lost { .. } => self.record.failed += 1,
        }
        false
    }
}

/// The keys an assignment answer gives the account, by index, if they are what was asked
/// for: `fanout` decimal keys, `hash_key` the first, and `weight`. While a move is pending
/// that is `next` (the table's keys; `hash_keys` are the old ones producers still send).
fn keys_of(body: &Value, weight: u64, fanout: u32) -> Option<Vec<u128>> {
    let held = match body.get("next") {
        Some(next) => next,
        None => body,
    };
    let keys: Vec<u128> = (held["hash_keys"].as_array()?.iter())
        .map(|k| k.as_str()?.parse().ok())
        .collect::<Option<_>>()?;
    let first = held["hash_key"].as_str()?.parse::<u128>().ok()?;
    let asked = keys.len() == fanout as usize
        && body["fanout"] == fanout
        && body["weight"] == weight
        && keys.first() == Some(&first);
    asked.then_some(keys)
}
