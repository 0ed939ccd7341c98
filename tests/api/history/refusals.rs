//! (f) A refusal is final: no change answered 503 or 408 was ever made. Judged two ways: a
//! change sent with an Idempotency-Key and refused has no answer kept for its key (an answer
//! is kept in the change's own transaction, so a change made after its refusal would have
//! one); and each change of a pause (on accounts of its own) is in the log if it was
//! acknowledged, and not if it was refused, unless another change of that account that was
//! not refused may have made it.

use reqwest::Method;
use serde_json::Value;

use super::driver::{History, PAUSED_OP};
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
        let explained = accounts.iter().any(|a| made_by_another(history, call, a));
        if refused && made.iter().any(|&m| m) && !explained {
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

/// The accounts a pause's change names, if `call` is one.
fn paused_accounts(call: &Call) -> Option<Vec<String>> {
    if call.op != PAUSED_OP {
        return None;
    }
    let names = |v: &Value| -> Vec<String> {
        (v["accounts"].as_array().into_iter().flatten())
            .filter_map(|i| i["account"].as_str().map(str::to_owned))
            .collect()
    };
    match call.path.strip_prefix("/keys/")? {
        "batch" => Some(names(call.body.as_ref()?)),
        account => Some(vec![account.to_owned()]),
    }
}

/// Whether a change other than `call` of the same kind on `account`, not refused, may have
/// made what the log holds (a rebalance weighs an account it moves).
fn made_by_another(history: &History, call: &Call, account: &str) -> bool {
    let path = format!("/keys/{account}");
    (history.calls.iter()).any(|other| {
        !std::ptr::eq(other, call)
            && other.method == call.method
            && other.path == path
            && !matches!(other.status, 503 | 408)
    })
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
