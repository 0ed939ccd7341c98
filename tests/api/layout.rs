//! The shape of the code that keeps its parts apart: the pure core is a crate of its own
//! with no web server, database or async runtime, and the configuration is a leaf that the
//! rest reads (it imports none of the server's modules, so no import circle runs through it).

use std::path::Path;

fn manifest() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The `[dependencies]` table of a manifest, one name a line (`name = ...`).
fn dependencies(manifest: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut inside = false;
    for line in manifest.lines().map(str::trim) {
        if line.starts_with('[') {
            inside = line == "[dependencies]";
        } else if inside && let Some((name, _)) = line.split_once('=') {
            names.push(name.trim().to_owned());
        }
    }
    names
}

#[test]
fn the_core_crate_depends_on_no_server_database_or_runtime() {
    let text = std::fs::read_to_string(manifest().join("crates/keyspace/Cargo.toml")).unwrap();
    let names = dependencies(&text);
    assert!(
        names.contains(&"md5".to_owned()),
        "the table was read: {names:?}"
    );
    for banned in ["axum", "sqlx", "tokio", "hyper", "reqwest", "tower"] {
        assert!(
            !names.iter().any(|n| n.starts_with(banned)),
            "crates/keyspace depends on {banned}: {names:?}"
        );
    }
    let server = std::fs::read_to_string(manifest().join("Cargo.toml")).unwrap();
    assert!(
        dependencies(&server).contains(&"keyspace".to_owned()),
        "the server takes its core from crates/keyspace"
    );
    assert!(
        !manifest().join("src/keyspace").exists(),
        "no second copy of the core in src/"
    );
}

#[test]
fn the_configuration_imports_none_of_the_servers_modules() {
    let mut files = vec![manifest().join("src/config.rs")];
    for entry in std::fs::read_dir(manifest().join("src/config")).unwrap() {
        files.push(entry.unwrap().path());
    }
    assert!(files.len() > 1, "src/config/ holds the flags' own types");
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        for (n, line) in text.lines().enumerate() {
            assert!(
                !line.contains("crate::"),
                "{}:{}: configuration reaches into the server: {line}",
                file.display(),
                n + 1
            );
        }
    }
}
