//! The sample list-shards file in `examples/` registers through `keyspread streams put
//! --from` as the README says.

use std::path::Path;
use std::process::Output;

use crate::helpers::{TestApp, spawn_app};

/// Runs `keyspread streams put NAME --from FILE` against `app`, waiting for it without
/// blocking the runtime the server runs on.
async fn streams_put(app: &TestApp, name: &str, file: &Path) -> Output {
    tokio::process::Command::new(env!("CARGO_BIN_EXE_keyspread"))
        .args(["streams", "put", name, "--from"])
        .arg(file)
        .args(["--url", &app.url("")])
        .env_remove("KEYSPREAD_TOKEN")
        .output()
        .await
        .expect("run keyspread streams put")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sample_list_shards_file_registers_its_split() {
    let app = spawn_app().await;
    let file = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/list-shards.json");
    let out = streams_put(&app, "orders", &file).await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("registered stream orders: 3 open shards"),
        "{stdout}"
    );
    let stream = app.get("/streams/orders").await.body;
    let quarter = 1u128 << 126;
    let shards: Vec<(&str, String, String)> = stream["shards"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            (
                s["shard_id"].as_str().unwrap(),
                s["starting_hash_key"].as_str().unwrap().to_owned(),
                s["ending_hash_key"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert_eq!(
        shards,
        [
            (
                "shardId-000000000002",
                "0".into(),
                (quarter - 1).to_string()
            ),
            (
                "shardId-000000000003",
                quarter.to_string(),
                (2 * quarter - 1).to_string()
            ),
            (
                "shardId-000000000001",
                (2 * quarter).to_string(),
                u128::MAX.to_string()
            ),
        ]
    );
    assert_eq!(
        (&stream["kind"], &stream["next_shard_number"]),
        (&"explicit".into(), &4.into())
    );
    // The closed parent is still read first: its children wait for its SHARD_END.
    let leases = app.get("/streams/orders/leases").await.body;
    let parents = |id: &str| {
        leases["shards"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["shard_id"] == id)
            .unwrap_or_else(|| panic!("{id} in {leases}"))["parents"]
            .clone()
    };
    assert_eq!(parents("shardId-000000000000"), serde_json::json!([]));
    for child in ["shardId-000000000002", "shardId-000000000003"] {
        assert_eq!(parents(child), serde_json::json!(["shardId-000000000000"]));
    }
    let acme = app.post("/keys/acme", None).await.body["hash_key"].clone();
    let shard = app.get("/shard-of?account=acme&stream=orders").await.body;
    assert_eq!(shard["hash_key"], acme);
    // The walk's first key, 2^127, starts the unsplit second shard.
    assert_eq!(shard["shard_id"], "shardId-000000000001");
}
