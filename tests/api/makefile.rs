//! `make help` (and `make` alone) lists every target the Makefile documents with `##`.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;

/// `make ARGS` in the repository, as a newcomer types it (not as a sub-make of `make test`).
fn make(args: &[&str]) -> String {
    let out = Command::new("make")
        .args(["--no-print-directory", "-C", env!("CARGO_MANIFEST_DIR")])
        .args(args)
        .env_remove("MAKEFLAGS")
        .env_remove("MFLAGS")
        .env_remove("MAKELEVEL")
        .output()
        .expect("run make");
    assert!(
        out.status.success(),
        "make {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// Each `.PHONY` target with the `##` lines above its rule (variable assignments and
/// blank lines may stand between them), in the Makefile's order.
fn documented_targets(makefile: &str) -> Vec<(String, Vec<String>)> {
    let lines: Vec<&str> = makefile.lines().collect();
    let phony: BTreeSet<&str> = lines
        .iter()
        .find_map(|l| l.strip_prefix(".PHONY:"))
        .expect("a .PHONY line")
        .split_whitespace()
        .collect();
    let mut documented = Vec::new();
    for (at, line) in lines.iter().enumerate() {
        let Some((target, _)) = line.split_once(':') else {
            continue;
        };
        if !phony.contains(target) || line[target.len()..].starts_with(":=") {
            continue;
        }
        let mut doc = Vec::new();
        for above in lines[..at].iter().rev() {
            if let Some(text) = above.strip_prefix("## ") {
                doc.insert(0, text.to_owned());
                continue;
            }
            // Until the comment starts, blank lines and variables may come between.
            let between = above.trim().is_empty() || above.contains('=');
            if !doc.is_empty() || !between || above.starts_with('\t') {
                break;
            }
        }
        if !doc.is_empty() {
            documented.push((target.to_owned(), doc));
        }
    }
    documented
}

#[test]
fn make_help_lists_every_documented_target() {
    let makefile =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("Makefile")).unwrap();
    let documented = documented_targets(&makefile);
    // The ones a newcomer needs first, so the parse above cannot pass by finding nothing.
    for needed in [
        "help", "run", "test", "proofs", "soak", "lint", "bench", "fuzz",
    ] {
        assert!(
            documented.iter().any(|(t, _)| t == needed),
            "{needed} has no ## comment"
        );
    }
    let help = make(&["help"]);
    let lines: Vec<&str> = help.lines().collect();
    for (target, doc) in &documented {
        let at = lines
            .iter()
            .position(|l| l.split_whitespace().next() == Some(target.as_str()))
            .unwrap_or_else(|| panic!("{target} is not listed:\n{help}"));
        let shown: Vec<&str> = lines[at..at + doc.len()]
            .iter()
            .enumerate()
            .map(|(i, l)| if i == 0 { &l[2 + target.len()..] } else { l })
            .map(|l| l.trim())
            .collect();
        assert_eq!(shown, *doc, "{target}:\n{help}");
    }
    // Nothing else is listed as a target: every line is the heading, a target's first line
    // (two spaces, then its name) or a continuation (only spaces before it).
    let listed: BTreeSet<&str> = lines[1..]
        .iter()
        .filter(|l| !l.starts_with("   "))
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    let documented_names: BTreeSet<&str> = documented.iter().map(|(t, _)| t.as_str()).collect();
    assert_eq!(listed, documented_names, "{help}");
    assert!(lines[0].starts_with("make TARGET"), "{help}");
    assert_eq!(make(&[]), help, "`make` alone prints the list");
}

/// A test that passes, one that lacks its tool (node, kept off PATH) and one for Postgres
/// only, run by this very binary on SQLite as `make test` runs it; the runner's summary of
/// that run counts the second as skipped with its reason and the third as another pass's,
/// neither as passed.
#[test]
fn make_test_sums_up_a_test_that_could_not_run_as_skipped_with_its_reason() {
    const PASSES: &str = "readme::shown_answers_match_with_wildcards_only_where_marked";
    const NO_NODE: &str = "typescript_client::generated_typescript_client_drives_the_live_server";
    const POSTGRES: &str =
        "secrets::a_password_with_url_delimiters_logs_in_and_stays_out_of_the_log";
    let work = tempfile::tempdir().unwrap();
    let skips = work.path().join("skips");
    let run = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", PASSES, NO_NODE, POSTGRES])
        .env("PATH", work.path())
        .env("KEYSPREAD_SKIP_LOG", &skips)
        .env_remove("CI")
        .env_remove("KEYSPREAD_TEST_POSTGRES")
        .output()
        .expect("run the test binary");
    let output = String::from_utf8(run.stdout).unwrap();
    assert!(run.status.success(), "{output}");
    assert!(output.contains("3 passed"), "libtest says ok: {output}");
    let saved = work.path().join("output");
    std::fs::write(&saved, &output).unwrap();

    let summary = Command::new("python3")
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/run"))
        .arg("--summarize")
        .args(["sqlite".as_ref(), saved.as_os_str(), skips.as_os_str()])
        .output()
        .expect("run tests/run");
    let text = String::from_utf8(summary.stdout).unwrap();
    assert!(summary.status.success(), "{text}");
    let why = "node is not installed";
    assert!(
        text.lines()
            .any(|l| l.contains(&format!("skipped {NO_NODE}: {why}"))),
        "{text}"
    );
    assert!(
        text.lines()
            .any(|l| l.contains(&format!("Postgres only: {POSTGRES}"))),
        "{text}"
    );
    assert_eq!(
        text.lines().last(),
        Some("1 passed, 0 failed, 1 skipped"),
        "{text}"
    );
}
