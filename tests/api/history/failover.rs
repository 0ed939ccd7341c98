//! The failovers a drill injects into a highly available Postgres (tests/ha/cluster.py,
//! `make ha-drill`): a planned switchover (Patroni's REST `POST /switchover`), the
//! leader's Postgres SIGKILLed (Patroni promotes a standby at once: the cluster is set up
//! with `primary_start_timeout: 0`), and the leader cut off (its Patroni and its Postgres
//! stopped with SIGSTOP until another node is promoted, then resumed: it comes back as a
//! standby). Each runs on a task of its own while the history goes on, and ends once a
//! leader other than the old one answers writes through HAProxy.

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use sqlx::Connection;

/// The three kinds, in the order a drill injects them.
pub const KINDS: [&str; 3] = ["switchover", "kill leader", "cut leader"];
/// How long a failover may take before the drill gives up on it.
const SETTLE_WITHIN: Duration = Duration::from_secs(90);

/// One node of the cluster, as cluster.py describes it (`KEYSPREAD_HA_NODES`).
#[derive(Debug, Clone)]
struct Node {
    name: String,
    rest: String,
    data: String,
    patroni_pid: i32,
}

/// The cluster under a drill.
#[derive(Debug, Clone)]
pub struct Ha {
    pub database_url: String,
    pub mode: String,
    nodes: Vec<Node>,
    client: reqwest::Client,
}

/// What one failover did: its kind, the leader before and after, and when (Unix ms by
/// the history's clock) it began and a new leader took writes.
#[derive(Debug, Clone)]
pub struct Failover {
    pub kind: &'static str,
    pub from_leader: String,
    pub to_leader: String,
    pub from: i64,
    pub until: i64,
}

impl Ha {
    /// The cluster `make ha-drill` started, if this process runs under it.
    pub fn from_env() -> Option<Ha> {
        let database_url = std::env::var("KEYSPREAD_HA_DATABASE_URL").ok()?;
        let nodes: Value = serde_json::from_str(&std::env::var("KEYSPREAD_HA_NODES").ok()?)
            .expect("KEYSPREAD_HA_NODES is cluster.py's JSON");
        let nodes = (nodes.as_array().expect("a list of nodes").iter())
            .map(|n| Node {
                name: n["name"].as_str().unwrap().to_owned(),
                rest: n["rest"].as_str().unwrap().to_owned(),
                data: n["data"].as_str().unwrap().to_owned(),
                patroni_pid: n["patroni_pid"].as_i64().unwrap() as i32,
            })
            .collect();
        Some(Ha {
            database_url,
            mode: std::env::var("KEYSPREAD_HA_MODE").unwrap_or_else(|_| "sync".into()),
            nodes,
            client: reqwest::Client::builder()
                .timeout(Duration::from_secs(2))
                .build()
                .unwrap(),
        })
    }

    /// A database of its own for the drill on the cluster: its URL.
    pub async fn database(&self) -> String {
        let name = format!("keyspread_drill_{}", uuid::Uuid::new_v4().simple());
        let mut admin = sqlx::PgConnection::connect(&self.database_url)
            .await
            .expect("connect to the HA cluster");
        sqlx::query(&format!("CREATE DATABASE {name}"))
            .execute(&mut admin)
            .await
            .expect("create the drill's database");
        let base = (self.database_url.rsplit_once('/')).map_or(&*self.database_url, |(b, _)| b);
        format!("{base}/{name}")
    }

    /// The node Patroni's REST API says is the leader (`GET /primary` answers 200).
    async fn leader(&self) -> Option<usize> {
        for (i, node) in self.nodes.iter().enumerate() {
            let answer = self
                .client
                .get(format!("{}/primary", node.rest))
                .send()
                .await;
            if answer.is_ok_and(|a| a.status() == 200) {
                return Some(i);
            }
        }
        None
    }

    /// Whether a change can commit through HAProxy now, on a node other than `old`.
    async fn writable_elsewhere(&self, old: usize, url: &str) -> bool {
        let Some(leader) = self.leader().await else {
            return false;
        };
        if leader == old {
            return false;
        }
        let tried = tokio::time::timeout(Duration::from_secs(2), async {
            let mut conn = sqlx::PgConnection::connect(url).await?;
            let recovering: bool = sqlx::query_scalar("SELECT pg_is_in_recovery()")
                .fetch_one(&mut conn)
                .await?;
            Ok::<_, sqlx::Error>(!recovering)
        })
        .await;
        matches!(tried, Ok(Ok(true)))
    }

    /// The PIDs of node `i`'s Postgres: the postmaster (`postmaster.pid`'s first line) and
    /// its children.
    fn postgres_pids(&self, i: usize) -> Vec<i32> {
        let pid_file = std::path::Path::new(&self.nodes[i].data).join("postmaster.pid");
        let Some(postmaster) = (std::fs::read_to_string(pid_file).ok())
            .and_then(|t| t.lines().next().and_then(|l| l.trim().parse::<i32>().ok()))
        else {
            return Vec::new();
        };
        let mut pids = vec![postmaster];
        for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
            let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
                continue;
            };
            let stat = std::fs::read_to_string(entry.path().join("stat")).unwrap_or_default();
            // The parent is the fourth field, after the command in parentheses.
            let parent = (stat.rsplit_once(')'))
                .and_then(|(_, rest)| rest.split_whitespace().nth(1))
                .and_then(|p| p.parse::<i32>().ok());
            if parent == Some(postmaster) {
                pids.push(pid);
            }
        }
        pids
    }

    /// Injects a failover of `kind` now and waits until a new leader takes writes through
    /// `url` (the drill's database, behind HAProxy); `clock` dates it.
    pub async fn fail_over(&self, kind: &'static str, url: &str, clock: super::Clock) -> Failover {
        // Each failover starts from a whole cluster: a leader, two standbys, one of them
        // synchronous in sync mode.
        let waited = Instant::now();
        while !self.settled().await {
            assert!(
                waited.elapsed() < SETTLE_WITHIN,
                "{kind}: the cluster did not settle within {SETTLE_WITHIN:?} before it: {}",
                self.members().await
            );
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        let old = self.leader().await.expect("a leader before the failover");
        let from = clock.now();
        let mut paused = Vec::new();
        match kind {
            "switchover" => {
                let body = json!({"leader": self.nodes[old].name});
                let answer = (self
                    .client
                    .post(format!("{}/switchover", self.nodes[old].rest)))
                .timeout(Duration::from_secs(30))
                .json(&body)
                .send()
                .await
                .expect("POST /switchover");
                let status = answer.status();
                let text = answer.text().await.unwrap_or_default();
                assert!(status.is_success(), "switchover refused: {status} {text}");
            }
            "kill leader" => {
                for pid in self.postgres_pids(old).into_iter().take(1) {
                    signal(pid, libc::SIGKILL);
                }
            }
            _ => {
                paused.push(self.nodes[old].patroni_pid);
                paused.extend(self.postgres_pids(old));
                for &pid in &paused {
                    signal(pid, libc::SIGSTOP);
                }
            }
        }
        let started = Instant::now();
        while !self.writable_elsewhere(old, url).await {
            assert!(
                started.elapsed() < SETTLE_WITHIN,
                "{kind}: no new leader took writes within {SETTLE_WITHIN:?}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let until = clock.now();
        for &pid in &paused {
            signal(pid, libc::SIGCONT);
        }
        let to = self.leader().await.unwrap_or(old);
        // Back to three nodes, the old leader a standby again, before the next.
        let rejoined = Instant::now();
        while !self.settled().await && rejoined.elapsed() < SETTLE_WITHIN {
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        Failover {
            kind,
            from_leader: self.nodes[old].name.clone(),
            to_leader: self.nodes[to].name.clone(),
            from,
            until,
        }
    }

    /// Patroni's view of the members, as its leader (or any node) says, for messages.
    async fn members(&self) -> Value {
        for node in &self.nodes {
            let answer = self
                .client
                .get(format!("{}/cluster", node.rest))
                .send()
                .await;
            if let Ok(answer) = answer {
                return answer.json().await.unwrap_or_default();
            }
        }
        Value::Null
    }

    /// A leader, both standbys replicating, and in sync mode one of them synchronous.
    async fn settled(&self) -> bool {
        let Some(leader) = self.leader().await else {
            return false;
        };
        let cluster = self
            .client
            .get(format!("{}/cluster", self.nodes[leader].rest))
            .send()
            .await;
        let Ok(cluster) = cluster else { return false };
        let cluster: Value = cluster.json().await.unwrap_or_default();
        let members = cluster["members"].as_array().cloned().unwrap_or_default();
        let standbys = (members.iter())
            .filter(|m| {
                matches!(m["role"].as_str(), Some("replica" | "sync_standby"))
                    && matches!(m["state"].as_str(), Some("running" | "streaming"))
            })
            .count();
        let synchronous = members.iter().any(|m| m["role"] == "sync_standby");
        standbys == self.nodes.len() - 1 && (synchronous || self.mode != "sync")
    }
}

fn signal(pid: i32, signal: i32) {
    // SAFETY: kill(2) with a PID the cluster's files name; a process gone meanwhile is ESRCH.
    unsafe {
        libc::kill(pid, signal);
    }
}
