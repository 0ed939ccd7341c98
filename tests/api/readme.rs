//! README's walk-throughs (the shell blocks of the sections in [`WALK`], in README's order)
//! run as printed, in bash against one fresh `keyspread serve`, and every answer they show is
//! the answer the server gives.
//!
//! A command's answer is shown on the comment lines right after it: the first starts with
//! `# {`, continuations with `#  `. In a shown answer, `"…"` stands for any value, `"8507…"`
//! for any string that starts so, a time such as `"2026-11-24T15:32:03.700Z"` for any time,
//! and `"…"` as an array's last item for any further items. Every other value, and every
//! object's set of fields, must be exactly as shown.

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::helpers::fresh_database;
use crate::process::Server;

/// The sections whose shell blocks are one walk-through, in README's order.
const WALK: [&str; 8] = [
    "The API at a glance",
    "Hot accounts",
    "Order-safe moves: producers and consumers",
    "Consumer leases: which worker reads which shard",
    "Streams: real shard maps",
    "Importing an existing table",
    "Backups: export and import",
    "Least privilege: who may do what",
];

fn readme() -> String {
    std::fs::read_to_string(manifest().join("README.md")).unwrap()
}

fn manifest() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// README's `## ` sections as (title, text), in order.
fn sections(readme: &str) -> Vec<(&str, &str)> {
    readme
        .split("\n## ")
        .skip(1)
        .map(|s| s.split_once('\n').unwrap_or((s, "")))
        .collect()
}

/// Every fenced `sh` block of `text`, in order.
fn sh_blocks(text: &str) -> Vec<&str> {
    let mut blocks = Vec::new();
    let mut rest = text;
    while let Some(open) = rest.find("```sh\n") {
        let body = &rest[open + "```sh\n".len()..];
        let close = body.find("\n```").expect("a closed block");
        blocks.push(&body[..close + 1]);
        rest = &body[close..];
    }
    blocks
}

/// The walk: every `sh` block of the [`WALK`] sections, which must come in README's order.
fn walk_blocks(readme: &str) -> Vec<&str> {
    let sections = sections(readme);
    let mut at = 0;
    let mut blocks = Vec::new();
    for title in WALK {
        let found = sections[at..]
            .iter()
            .position(|(t, _)| *t == title)
            .unwrap_or_else(|| panic!("README has no section {title:?} after the one before"));
        at += found;
        let found = sh_blocks(sections[at].1);
        assert!(!found.is_empty(), "no sh block under {title:?}");
        blocks.extend(found);
    }
    blocks
}

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

/// A block that talks to the server (or names its database) outside [`WALK`] would never
/// be run: every such block belongs to the walk.
#[test]
fn every_block_that_talks_to_the_server_is_walked() {
    let readme = readme();
    for (title, text) in sections(&readme) {
        for block in sh_blocks(text) {
            let talks = block.contains("localhost:8080")
                || block.contains("localhost:8181")
                || block.contains("sqlite://keyspread.db");
            assert!(
                !talks || WALK.contains(&title) || title == "Two commands",
                "{title:?} has a block the walk-through never runs:\n{block}"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_walk_through_runs_as_shown() {
    let readme = readme();
    let steps: Vec<Step> = walk_blocks(&readme).into_iter().flat_map(steps).collect();
    assert!(
        steps.iter().filter(|s| s.shown.is_some()).count() >= 12,
        "too few answers shown"
    );
    // The reader's terminal: the repository's examples at hand, the binary on PATH.
    let dir = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(manifest().join("examples"), dir.path().join("examples")).unwrap();
    let (database, _postgres) = fresh_database(dir.path()).await;
    let mut server = Server::spawn(&database, &dir.path().join("server.log"));
    server.wait_ready(&reqwest::Client::new()).await;
    let host = server.url.trim_start_matches("http://");
    // The second server a section starts itself (`--listen 127.0.0.1:8181`): a free port.
    let second = {
        let probe = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        format!("127.0.0.1:{}", probe.local_addr().unwrap().port())
    };
    let bin = Path::new(env!("CARGO_BIN_EXE_keyspread")).parent().unwrap();
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );

    let mut script = String::from("set -euo pipefail\n");
    for (i, step) in steps.iter().enumerate() {
        script.push_str(&format!("printf '\\n@@ step {i} @@\\n'\n"));
        let command = (step.command.replace("localhost:8080", host))
            .replace("sqlite://keyspread.db", &database)
            .replace("localhost:8181", &second)
            .replace("127.0.0.1:8181", &second);
        script.push_str(&command);
        script.push('\n');
    }
    let run = tokio::process::Command::new("bash")
        .args(["-c", &script])
        .current_dir(dir.path())
        .env("PATH", path)
        .env("KEYSPREAD_URL", &server.url)
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(120), run)
        .await
        .expect("the walk-through finished within 120 s")
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
    imported_as_the_file_says(&server.url).await;
}

/// Every row of examples/accounts.csv, which the walk imported, is served with its weight,
/// its fanout and the key it brought.
async fn imported_as_the_file_says(url: &str) {
    let csv = std::fs::read_to_string(manifest().join("examples/accounts.csv")).unwrap();
    let rows: Vec<Vec<&str>> = csv
        .lines()
        .skip(1)
        .map(|l| l.split(',').collect())
        .collect();
    assert!(rows.len() >= 12, "{csv}");
    assert!(
        rows.iter()
            .any(|r| r[3].parse::<u32>().is_ok_and(|k| k > 1))
    );
    assert!(rows.iter().any(|r| !r[2].is_empty()));
    let client = reqwest::Client::new();
    for row in rows {
        let fanout: u64 = row[3].parse().unwrap_or(1);
        let weight: u64 = row[1].parse().unwrap_or(fanout);
        // The running server follows the import's commits within a poll.
        let started = Instant::now();
        let found = loop {
            let answer = client
                .get(format!("{url}/keys/{}", row[0]))
                .send()
                .await
                .unwrap();
            if answer.status() == 200 {
                break answer.json::<Value>().await.unwrap();
            }
            assert!(
                started.elapsed() < Duration::from_secs(5),
                "{} is not served",
                row[0]
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        assert_eq!(found["fanout"], fanout, "{found}");
        assert_eq!(found["weight"], weight, "{found}");
        assert_eq!(
            found["hash_keys"].as_array().unwrap().len() as u64,
            fanout,
            "{found}"
        );
        if !row[2].is_empty() {
            assert_eq!(found["hash_key"], row[2], "{found}");
        }
    }
}

/// Names of design notes ("seed 001") mean nothing to a newcomer: neither README nor any
/// `--help` of the binary, subcommands included, uses them.
#[test]
fn no_text_a_newcomer_reads_names_a_design_note() {
    let named = |text: &str| {
        let lower = text.to_lowercase();
        lower.match_indices("seed ").find_map(|(at, _)| {
            let next = lower[at + 5..].chars().next();
            next.is_some_and(|c| c.is_ascii_digit())
                .then(|| lower[at..(at + 40).min(lower.len())].to_owned())
        })
    };
    assert_eq!(named(&readme()), None, "README.md");
    let mut commands: Vec<Vec<String>> = vec![vec![]];
    let mut seen = 0;
    while let Some(command) = commands.pop() {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_keyspread"))
            .args(&command)
            .arg("--help")
            .output()
            .unwrap();
        assert!(out.status.success(), "{command:?} --help");
        let help = String::from_utf8(out.stdout).unwrap();
        assert_eq!(named(&help), None, "keyspread {} --help", command.join(" "));
        seen += 1;
        // "Commands:" lists the subcommands, two spaces in, until a blank line.
        if let Some((_, list)) = help.split_once("Commands:\n") {
            for line in list.lines().take_while(|l| !l.trim().is_empty()) {
                let name = line.split_whitespace().next().unwrap();
                if name != "help" {
                    commands.push([command.clone(), vec![name.to_owned()]].concat());
                }
            }
        }
    }
    assert!(seen >= 8, "only {seen} commands' help read");
}

/// README's picture is the drawing of what `keyspread simulate` prints today.
#[test]
fn the_picture_is_drawn_from_simulate() {
    let drawn = std::process::Command::new("python3")
        .arg(manifest().join("docs/md5_vs_keyspread.py"))
        .arg(env!("CARGO_BIN_EXE_keyspread"))
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .output()
        .expect("run python3");
    assert!(
        drawn.status.success(),
        "{}",
        String::from_utf8_lossy(&drawn.stderr)
    );
    let committed = std::fs::read(manifest().join("docs/md5_vs_keyspread.svg")).unwrap();
    assert!(
        drawn.stdout == committed,
        "docs/md5_vs_keyspread.svg is stale: python3 docs/md5_vs_keyspread.py keyspread > docs/md5_vs_keyspread.svg"
    );
    assert!(readme().contains("![") && readme().contains("(docs/md5_vs_keyspread.svg)"));
}

/// Every `](#anchor)` link of README (the table of contents among them) leads to a heading,
/// by GitHub's rule: lower case, punctuation dropped, spaces as `-`.
#[test]
fn every_link_within_readme_leads_to_a_heading() {
    let readme = readme();
    let mut fenced = false;
    let mut titles = Vec::new();
    for line in readme.lines() {
        fenced ^= line.starts_with("```");
        if !fenced && line.starts_with('#') {
            titles.extend(line.trim_start_matches('#').strip_prefix(' '));
        }
    }
    let anchors: Vec<String> = (titles.into_iter())
        .map(|title| {
            (title.to_lowercase().chars())
                .filter(|c| c.is_alphanumeric() || matches!(c, ' ' | '-' | '_'))
                .map(|c| if c == ' ' { '-' } else { c })
                .collect()
        })
        .collect();
    let links: Vec<&str> = (readme.split("](#").skip(1))
        .map(|rest| &rest[..rest.find(')').unwrap()])
        .collect();
    assert!(links.len() >= 20, "{links:?}");
    for link in links {
        assert!(
            anchors.iter().any(|a| a == link),
            "#{link} names no heading"
        );
    }
}
