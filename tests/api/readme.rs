//! README's walk through the API ("The API at a glance") runs as printed, in bash against a
//! fresh `keyspread serve`, and every answer it shows is the answer the server gives.
//!
//! A command's answer is shown on the comment lines right after it: the first starts with
//! `# {`, continuations with `#  `. In a shown answer, `"…"` stands for any value, `"8507…"`
//! for any string that starts so, a time such as `"2026-11-24T15:32:03.700Z"` for any time,
//! and `"…"` as an array's last item for any further items. Every other value, and every
//! object's set of fields, must be exactly as shown.

use std::time::Duration;

use serde_json::Value;

use crate::helpers::fresh_database;
use crate::process::Server;
use crate::sub_key::readme_block;

/// One command of the block and the answer shown under it, if any.
struct Step {
    command: String,
    shown: Option<String>,
}

fn steps(block: &str) -> Vec<Step> {
    let mut steps = Vec::new();
    let mut lines = block.lines().peekable();
    while let Some(line) = lines.next() {
        if line.trim().is_empty() || line.trim_start().starts_with('#') {
            continue;
        }
        let mut command = line.to_owned();
        while command.ends_with('\\') {
            command.push('\n');
            command.push_str(lines.next().expect("a continued command goes on"));
        }
        let mut shown = None;
        if let Some(answer) = lines.next_if(|l| l.starts_with("# {") || l.starts_with("# [")) {
            let mut text = answer[2..].to_owned();
            while let Some(more) = lines.next_if(|l| l.starts_with("#  ")) {
                text.push_str(&more[2..]);
            }
            shown = Some(text);
        }
        steps.push(Step { command, shown });
    }
    steps
}

/// RFC 3339 in UTC, as keyspread writes times: `2026-11-24T15:32:03.7Z`.
fn is_time(text: &str) -> bool {
    let shape = |s: &str, pattern: &str| {
        s.len() == pattern.len()
            && s.bytes().zip(pattern.bytes()).all(|(c, p)| match p {
                b'9' => c.is_ascii_digit(),
                _ => c == p,
            })
    };
    let Some(rest) = text.strip_suffix('Z') else {
        return false;
    };
    let (seconds, fraction) = rest.split_once('.').unwrap_or((rest, "0"));
    shape(seconds, "9999-99-99T99:99:99")
        && !fraction.is_empty()
        && fraction.bytes().all(|c| c.is_ascii_digit())
}

/// Whether `actual` is what `shown` shows (see the module's comment).
fn matches(shown: &Value, actual: &Value) -> bool {
    match (shown, actual) {
        (Value::String(s), _) if s == "…" => true,
        (Value::String(s), Value::String(a)) if is_time(s) => is_time(a),
        (Value::String(s), Value::String(a)) if s.ends_with('…') => {
            a.starts_with(s.trim_end_matches('…'))
        }
        (Value::Array(s), Value::Array(a)) => match s.split_last() {
            Some((Value::String(last), head)) if last == "…" => {
                a.len() >= head.len() && head.iter().zip(a).all(|(s, a)| matches(s, a))
            }
            _ => s.len() == a.len() && s.iter().zip(a).all(|(s, a)| matches(s, a)),
        },
        (Value::Object(s), Value::Object(a)) => {
            s.len() == a.len()
                && s.iter()
                    .all(|(k, v)| a.get(k).is_some_and(|a| matches(v, a)))
        }
        _ => shown == actual,
    }
}

#[test]
fn shown_answers_match_with_wildcards_only_where_marked() {
    let shown: Value = serde_json::from_str(
        r#"{"a":"…","b":"8507…","at":"2026-11-24T15:32:03.700Z","c":[1,"…"],"d":1.0}"#,
    )
    .unwrap();
    let actual: Value = serde_json::from_str(
        r#"{"a":[3],"b":"85070591","at":"2027-01-02T03:04:05.06Z","c":[1,2,3],"d":1.0}"#,
    )
    .unwrap();
    assert!(matches(&shown, &actual));
    for wrong in [
        r#"{"a":1,"b":"8607","at":"2027-01-02T03:04:05.06Z","c":[1],"d":1.0}"#,
        r#"{"a":1,"b":"8507","at":"yesterday","c":[1],"d":1.0}"#,
        r#"{"a":1,"b":"8507","at":"2027-01-02T03:04:05Z","c":[2],"d":1.0}"#,
        r#"{"a":1,"b":"8507","at":"2027-01-02T03:04:05Z","c":[1],"d":1.5}"#,
        r#"{"a":1,"b":"8507","at":"2027-01-02T03:04:05Z","c":[1],"d":1.0,"e":0}"#,
        r#"{"b":"8507","at":"2027-01-02T03:04:05Z","c":[1],"d":1.0}"#,
    ] {
        assert!(
            !matches(&shown, &serde_json::from_str(wrong).unwrap()),
            "{wrong}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_walk_through_runs_as_shown() {
    let block = readme_block("The API at a glance", "sh");
    let steps = steps(&block);
    assert!(
        steps.iter().filter(|s| s.shown.is_some()).count() >= 10,
        "{block}"
    );
    let dir = tempfile::tempdir().unwrap();
    let (database, _postgres) = fresh_database(dir.path()).await;
    let mut server = Server::spawn(&database, &dir.path().join("server.log"));
    server.wait_ready(&reqwest::Client::new()).await;
    let host = server.url.trim_start_matches("http://");

    let mut script = String::from("set -euo pipefail\n");
    for (i, step) in steps.iter().enumerate() {
        script.push_str(&format!("printf '\\n@@ step {i} @@\\n'\n"));
        script.push_str(&step.command.replace("localhost:8080", host));
        script.push('\n');
    }
    let run = tokio::process::Command::new("bash")
        .args(["-c", &script])
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(60), run)
        .await
        .expect("the walk-through finished within 60 s")
        .expect("run bash");
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let answers: Vec<&str> = stdout.split("\n@@ step ").skip(1).collect();
    assert_eq!(answers.len(), steps.len(), "{stdout}");
    for (step, answer) in steps.iter().zip(answers) {
        let answer = answer
            .split_once(" @@\n")
            .expect("a step's marker")
            .1
            .trim();
        let parsed: Option<Value> = serde_json::from_str(answer).ok();
        match &step.shown {
            Some(shown) => {
                let shown: Value = serde_json::from_str(shown)
                    .unwrap_or_else(|e| panic!("README shows no JSON under {}: {e}", step.command));
                let actual =
                    parsed.unwrap_or_else(|| panic!("{} answered {answer:?}", step.command));
                assert!(
                    matches(&shown, &actual),
                    "{}\nREADME shows: {shown}\nthe server answers: {actual}",
                    step.command
                );
            }
            // A command shown without an answer must not be answered with a problem.
            None => assert!(
                !parsed.is_some_and(|v| v["type"]
                    .as_str()
                    .is_some_and(|t| t.starts_with("urn:keyspread:problem:"))),
                "{} answered {answer}",
                step.command
            ),
        }
    }
}
