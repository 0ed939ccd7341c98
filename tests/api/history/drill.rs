//! What clients saw through a drill's failovers, per kind: how long writes were refused,
//! and every answer that was not a plain success, counted.

use std::collections::BTreeMap;

use reqwest::Method;

use super::driver::History;
use super::failover::KINDS;
use super::{Call, FAULT_GRACE_MS};

/// Prints, per kind of failover, the figures README's "Running highly available" shows.
pub fn report(history: &History, backend: &str) {
    println!("drill on {backend}: {} failovers", history.failovers.len());
    for f in &history.failovers {
        println!(
            "  {} at +{} ms: {} -> {}, a new leader took writes after {} ms",
            f.kind,
            history.clock.rel(f.from),
            f.from_leader,
            f.to_leader,
            f.until - f.from
        );
    }
    let mut rows = BTreeMap::new();
    for kind in KINDS {
        let windows: Vec<(i64, i64)> = (history.failovers.iter())
            .filter(|f| f.kind == kind)
            .map(|f| (f.from, f.until + FAULT_GRACE_MS))
            .collect();
        let inside = |c: &&Call| {
            windows
                .iter()
                .any(|&(from, until)| from <= c.received && c.sent <= until)
        };
        let calls: Vec<&Call> = history.calls.iter().filter(inside).collect();
        let changes = || {
            calls
                .iter()
                .filter(|c| c.method != Method::GET && c.op != "settle")
        };
        let lookups = || {
            calls
                .iter()
                .filter(|c| c.method == Method::GET && c.path.starts_with("/keys/"))
        };
        let mut counted: Vec<f64> = (history.failovers.iter().zip(&history.unwritable_s))
            .filter(|(f, _)| f.kind == kind)
            .map(|(_, &s)| s)
            .collect();
        counted.sort_by(f64::total_cmp);
        let counted_median = counted.get(counted.len() / 2).copied().unwrap_or(0.0);
        let counted_max = counted.last().copied().unwrap_or(0.0);
        let mut unavailable: Vec<i64> = (history.failovers.iter())
            .filter(|f| f.kind == kind)
            .map(|f| {
                // From the failover's start to the first change sent after it and acknowledged.
                (history.calls.iter())
                    .filter(|c| c.method != Method::GET && c.sent >= f.from)
                    .filter(|c| (200..300).contains(&c.status))
                    .map(|c| c.received - f.from)
                    .min()
                    .unwrap_or(i64::MAX)
            })
            .collect();
        unavailable.sort_unstable();
        let median = unavailable.get(unavailable.len() / 2).copied().unwrap_or(0);
        let max = unavailable.last().copied().unwrap_or(0);
        let status = |s: u16| changes().filter(|c| c.status == s).count();
        let other_5xx = changes()
            .chain(lookups())
            .filter(|c| c.status >= 500 && !matches!(c.status, 503 | 504))
            .count();
        let failed_lookups = lookups().filter(|c| !matches!(c.status, 200 | 404)).count();
        let failed_mirror = (calls.iter())
            .filter(|c| c.op == "mirror" && !matches!(c.status, 200 | 404))
            .count();
        let unknown: Vec<&String> = (calls.iter())
            .filter(|c| c.status == 504 && c.op != "settle")
            .filter_map(|c| c.key.as_ref())
            .collect();
        let settled = (history.calls.iter())
            .filter(|c| c.op == "settle" && c.status < 500)
            .filter(|c| c.key.as_ref().is_some_and(|k| unknown.contains(&k)))
            .count();
        rows.insert(
            kind,
            format!(
                "| {kind} | {} | {:.1} s | {:.1} s | {counted_median:.1} s | {counted_max:.1} s | {} | {} | {} | {} | {} | {settled} | {other_5xx} |",
                windows.len(),
                median as f64 / 1000.0,
                max as f64 / 1000.0,
                changes().count(),
                status(503),
                status(504),
                failed_lookups,
                failed_mirror,
            ),
        );
    }
    println!("drill on {backend}, per kind of failover:");
    println!(
        "| failover | times | writes refused, median | max | unwritable seconds counted (metric), median | max | changes sent | 503 | 504 | lookups failed | mirror lookups failed | 504s settled by their key | other 5xx |"
    );
    println!(
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
    );
    for row in rows.values() {
        println!("{row}");
    }
    for (r, lines) in history.away_metrics.iter().enumerate() {
        println!("drill on {backend}: r{r}'s /metrics: {}", lines.join("; "));
    }
}
