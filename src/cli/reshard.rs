//! `keyspread streams reshard`: starts a reshard on a running server and follows the job
//! until it ends, showing its calls as a progress bar.

use std::time::Duration;

use serde_json::Value;

use crate::config::Token;

/// How often the job is looked at.
const POLL: Duration = Duration::from_secs(1);

/// Looks in a row that may fail (the server restarting, say) before following gives up.
const MAX_MISSED_LOOKS: u32 = 60;

/// How a job stands, as the progress bar shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobProgress {
    pub state: String,
    pub done: u64,
    pub steps: u64,
    pub shard_count: u64,
    pub error: Option<String>,
}

impl JobProgress {
    fn of(job: &Value) -> JobProgress {
        JobProgress {
            state: job["state"].as_str().unwrap_or("unknown").to_owned(),
            done: job["done"].as_u64().unwrap_or(0),
            steps: job["steps"].as_array().map_or(0, |s| s.len() as u64),
            shard_count: job["shard_count"].as_u64().unwrap_or(0),
            error: job["error"].as_str().map(str::to_owned),
        }
    }

    /// `[#####---------------] 2/8 calls, 4 open shards (running)`.
    pub fn bar(&self) -> String {
        const WIDTH: u64 = 20;
        let total = self.steps.max(self.done);
        // No call to make is a full bar.
        let filled = (WIDTH * self.done).checked_div(total).unwrap_or(WIDTH);
        format!(
            "[{}{}] {}/{} calls, {} open shards ({})",
            "#".repeat(filled as usize),
            "-".repeat((WIDTH - filled) as usize),
            self.done,
            total,
            self.shard_count,
            self.state
        )
    }
}

/// Starts resharding `name` to `target` open shards on the server at `url`, then follows
/// the job, telling `show` each change, until it ends: `Ok` with a summary when it is done,
/// `Err` saying why when it was refused or failed.
pub async fn reshard(
    url: &str,
    token: Option<&Token>,
    name: &str,
    target: u64,
    switch_after_s: Option<u64>,
    mut show: impl FnMut(&JobProgress),
) -> Result<String, String> {
    let client = reqwest::Client::new();
    let path = format!("{}/streams/{name}/reshard", url.trim_end_matches('/'));
    let mut body = serde_json::json!({ "target": target });
    if let Some(s) = switch_after_s {
        body["switch_after_s"] = s.into();
    }
    let mut request = client.post(&path).json(&body);
    if let Some(token) = token {
        request = request.bearer_auth(token.expose());
    }
    let mut job = answer(request.send().await, url).await?;
    let id = job["id"].clone();
    let mut shown = None;
    let mut missed = 0;
    loop {
        let progress = JobProgress::of(&job);
        if shown.as_ref() != Some(&progress) {
            show(&progress);
            shown = Some(progress.clone());
        }
        match progress.state.as_str() {
            "running" => {}
            "done" => {
                return Ok(format!(
                    "stream {name}: {} open shards after {} calls; keyspread's map is Kinesis' \
                     (on the primary stream, the rebalance's moves switch {} s after the end)\n",
                    progress.shard_count, progress.done, job["switch_after_s"]
                ));
            }
            _ => {
                return Err(format!(
                    "the reshard of {name} failed after {} calls: {}",
                    progress.done,
                    progress.error.unwrap_or_default()
                ));
            }
        }
        tokio::time::sleep(POLL).await;
        let mut request = client.get(&path);
        if let Some(token) = token {
            request = request.bearer_auth(token.expose());
        }
        match answer(request.send().await, url).await {
            Ok(latest) if latest["id"] == id => (job, missed) = (latest, 0),
            Ok(_) => return Err(format!("another reshard of {name} started since job {id}")),
            Err(_) if missed < MAX_MISSED_LOOKS => missed += 1,
            Err(err) => return Err(format!("lost track of job {id}: {err}")),
        }
    }
}

/// The JSON of a successful answer, or what was wrong.
async fn answer(sent: reqwest::Result<reqwest::Response>, url: &str) -> Result<Value, String> {
    let response = sent.map_err(|e| format!("cannot reach {url}: {e}"))?;
    let status = response.status();
    let body: Value = response
        .json()
        .await
        .map_err(|e| format!("unreadable answer: {e}"))?;
    if status.is_success() {
        Ok(body)
    } else {
        Err(format!(
            "{status}: {}",
            body["detail"].as_str().unwrap_or_default()
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bar_fills_with_the_calls_made() {
        let at = |done, steps| JobProgress {
            state: "running".into(),
            done,
            steps,
            shard_count: 4,
            error: None,
        };
        assert_eq!(
            at(2, 8).bar(),
            "[#####---------------] 2/8 calls, 4 open shards (running)"
        );
        assert_eq!(
            at(0, 0).bar(),
            format!("[{}] 0/0 calls, 4 open shards (running)", "#".repeat(20))
        );
        assert!(at(8, 8).bar().starts_with(&format!("[{}]", "#".repeat(20))));
    }
}
