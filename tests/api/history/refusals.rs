//! (f) A refusal is final: no change answered 503 or 408 was ever made. Judged two ways: a
//! change sent with an Idempotency-Key and refused has no answer kept for its key (an answer
//! is kept in the change's own transaction, so a change made after its refusal would have
//! one); and each change of a pause (accounts no other operation names) is in the log if
//! and only if it was acknowledged.

use reqwest::Method;
use serde_json::Value;

use super::driver::{History, PAUSED};
use super::events::Observed;
use super::{Call, Violation};

const CHECK: &str = "(f) a refusal is final: no change answered 503 or 408 was made";

pub fn judge(history: &History) -> Vec<Violation> {
    let mut out = Vec::new();
    for call in &history.calls {
        let refused = matches!(call.status, 503 | 408);
        if refused
            && call
                .key
                .as_ref()
                .is_some_and(|k| history.kept_keys.contains(k))
        {
            out.push(violation(
                history,
                call,
                "its Idempotency-Key's answer was kept",
            ));
        }
        let Some(accounts) = paused_accounts(call) else {
            continue;
        };
        let made: Vec<bool> = (accounts.iter())
            .map(|a| logged(&history.events, call, a))
            .collect();
        let acknowledged = (200..300).contains(&call.status);
        if refused && made.iter().any(|&m| m) {
            out.push(violation(history, call, "the log holds its change"));
        } else if acknowledged && !made.iter().all(|&m| m) {
            out.push(violation(
                history,
                call,
                "the log lacks its acknowledged change",
            ));
        }
    }
    out
}

/// The accounts a pause's change names, if `call` is one (not the allocations that set
/// its accounts up before the pause, nor lookups).
fn paused_accounts(call: &Call) -> Option<Vec<String>> {
    if call.method == Method::GET {
        return None;
    }
    let names = |v: &Value| -> Vec<String> {
        (v["accounts"].as_array().into_iter().flatten())
            .filter_map(|i| i["account"].as_str().map(str::to_owned))
            .collect()
    };
    let accounts = match call.path.strip_prefix("/keys/") {
        Some("batch") => names(call.body.as_ref()?),
        Some(account) => vec![account.to_owned()],
        None => return None,
    };
    let setup = call.method == Method::POST && call.path.contains("-held-");
    (!setup && accounts.iter().all(|a| a.starts_with(PAUSED))).then_some(accounts)
}

/// Whether the log holds the change `call` asked for `account`.
fn logged(events: &[Observed], call: &Call, account: &str) -> bool {
    let kind = match call.method {
        Method::POST => "allocate",
        Method::DELETE => "release",
        _ => "reweight",
    };
    (events.iter()).any(|e| e.account.as_deref() == Some(account) && e.kind == kind)
}

fn violation(history: &History, call: &Call, why: &str) -> Violation {
    Violation {
        check: CHECK,
        what: format!(
            "{} {} {} on r{} at +{}..+{} ms answered {} {}: {why}",
            call.method,
            call.path,
            call.body.as_ref().map_or(String::new(), Value::to_string),
            call.replica,
            history.clock.rel(call.sent),
            history.clock.rel(call.received),
            call.status,
            call.answer
        ),
    }
}
