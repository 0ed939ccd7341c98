//! The producer code README.md shows under "Hot accounts" picks the same key index as
//! keyspread's own `sub_key_index`.

use std::path::Path;
use std::process::Stdio;

use keyspread::keyspace::{jump, sub_key_index};
use proptest::strategy::{Strategy, ValueTree};
use proptest::test_runner::TestRunner;
use tokio::io::AsyncWriteExt;
use tokio::process::Command;

use crate::python_client::{assert_success, tool};

/// The sub-keys and fanouts of DESIGN.md's test vectors.
const VECTORS: [&str; 3] = ["order-1", "user-42", ""];
const FANOUTS: [u32; 8] = [1, 2, 3, 4, 5, 8, 16, 100];

/// The design vectors, then 1,000 random sub-keys (any Unicode) with random fanouts.
fn cases() -> Vec<(String, u32)> {
    let mut cases: Vec<(String, u32)> = VECTORS
        .iter()
        .flat_map(|s| FANOUTS.map(|k| (s.to_string(), k)))
        .collect();
    let mut runner = TestRunner::deterministic();
    let strategy = (".{0,40}", 1u32..=1024);
    for _ in 0..1000 {
        cases.push(strategy.new_tree(&mut runner).unwrap().current());
    }
    cases
}

/// The first fenced block in `language` of README.md's section `heading`.
pub(crate) fn readme_block(heading: &str, language: &str) -> String {
    let readme = std::fs::read_to_string(manifest().join("README.md")).unwrap();
    let start = readme
        .find(&format!("\n## {heading}\n"))
        .unwrap_or_else(|| panic!("README.md has no section {heading:?}"));
    let section = &readme[start + 1..];
    let section = &section[..section.find("\n## ").unwrap_or(section.len())];
    let fence = format!("\n```{language}\n");
    let open = section
        .find(&fence)
        .unwrap_or_else(|| panic!("no {language} block under {heading:?}"))
        + fence.len();
    let close = section[open..].find("\n```").unwrap();
    section[open..open + close + 1].to_owned()
}

/// Code lines only: trimmed, without blank lines and whole-line comments.
fn code_lines(text: &str, comment: &str) -> Vec<String> {
    text.lines()
        .map(str::trim)
        .filter(|line| !line.is_empty() && !line.starts_with(comment))
        .map(str::to_owned)
        .collect()
}

/// Whether `part`'s code lines appear, in one run, among `whole`'s.
fn is_excerpt(part: &[String], whole: &[String]) -> bool {
    !part.is_empty() && whole.windows(part.len()).any(|w| w == part)
}

fn manifest() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// Runs `program` with `args`, `input` on stdin; its stdout.
async fn run(program: &Path, args: &[&str], input: &[u8]) -> String {
    let mut child = Command::new(program)
        .args(args)
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("start python");
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(input).await.unwrap();
    drop(stdin);
    let output = child.wait_with_output().await.unwrap();
    assert_success(&format!("{} {args:?}", program.display()), &output);
    String::from_utf8(output.stdout).unwrap()
}

fn python() -> std::path::PathBuf {
    tool("KEYSPREAD_TEST_PYTHON", manifest().join(".venv/bin/python"))
}

#[tokio::test]
async fn readme_python_picks_the_same_index() {
    let block = readme_block("Hot accounts", "python");
    let driver = "\nimport json, sys\n\
                  cases = json.loads(sys.stdin.buffer.read())\n\
                  print(json.dumps([sub_key_index(s, k) for s, k in cases['sub_keys']]))\n\
                  print(json.dumps([jump(key, k) for key, k in cases['jumps']]))\n";
    let sub_keys = cases();
    // Where rounding (b + 1) * (2^31 / x) twice, as the paper does, answers 63 at K = 64.
    let jumps: Vec<(u64, u32)> = (62..=66)
        .map(|k| (1_673_232_497_983_283_878, k))
        .chain([(0, 1), (0, 1024), (u64::MAX, 1024)])
        .collect();
    let input = serde_json::json!({"sub_keys": sub_keys, "jumps": jumps});
    let out = run(
        &python(),
        &["-c", &format!("{block}{driver}")],
        &serde_json::to_vec(&input).unwrap(),
    )
    .await;
    let mut lines = out.lines();
    let got: Vec<u32> = serde_json::from_str(lines.next().unwrap()).unwrap();
    let want: Vec<u32> = sub_keys.iter().map(|(s, k)| sub_key_index(s, *k)).collect();
    assert_eq!(got.len(), want.len());
    for ((case, got), want) in sub_keys.iter().zip(got).zip(want) {
        assert_eq!(got, want, "{case:?}");
    }
    let got: Vec<u32> = serde_json::from_str(lines.next().unwrap()).unwrap();
    let want: Vec<u32> = jumps.iter().map(|(key, k)| jump(*key, *k)).collect();
    assert_eq!(got, want, "jump on {jumps:?}");
}

#[tokio::test]
async fn examples_sub_key_py_is_the_readme_code_and_runs() {
    let file = manifest().join("examples/sub_key.py");
    let example = std::fs::read_to_string(&file).unwrap();
    let block = readme_block("Hot accounts", "python");
    assert!(
        is_excerpt(&code_lines(&block, "#"), &code_lines(&example, "#")),
        "README.md's Hot accounts Python code is not the code of examples/sub_key.py"
    );
    for fanout in FANOUTS {
        let fanout_arg = fanout.to_string();
        let mut args = vec![fanout_arg.as_str()];
        args.extend(VECTORS);
        let out = run(
            &python(),
            &[&[file.to_str().unwrap()], &args[..]].concat(),
            b"",
        )
        .await;
        let want: String = VECTORS
            .iter()
            .map(|s| format!("{}\n", sub_key_index(s, fanout)))
            .collect();
        assert_eq!(out, want, "fanout {fanout}");
    }
}

#[test]
fn readme_rust_is_the_code_keyspread_runs() {
    let block = readme_block("Hot accounts", "rust");
    let source =
        std::fs::read_to_string(manifest().join("crates/keyspace/src/selector.rs")).unwrap();
    assert!(
        is_excerpt(&code_lines(&block, "//"), &code_lines(&source, "//")),
        "README.md's Hot accounts Rust code is not an excerpt of crates/keyspace/src/selector.rs"
    );
}
