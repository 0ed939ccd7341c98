//! `keyspread streams put --from FILE` takes exactly the bodies `PUT /streams/{name}` takes,
//! and the sample list-shards file in `examples/` registers as the README says.

use std::path::Path;
use std::process::Output;

use serde_json::Value;

use crate::helpers::{TestApp, answer, spawn_app};

/// `examples/list-shards.json`: `aws kinesis list-shards` of a 2-shard stream after
/// shardId-000000000000 was split in half.
fn sample() -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/list-shards.json");
    std::fs::read_to_string(path).expect("examples/list-shards.json")
}

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

/// What a registered stream is, without when it was registered or its event id.
async fn registered(app: &TestApp, name: &str) -> Value {
    let mut stream = app.get(&format!("/streams/{name}")).await.body;
    let fields = stream.as_object_mut().unwrap();
    fields.remove("name");
    fields.remove("version");
    fields.remove("updated_at");
    stream
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_command_takes_exactly_the_bodies_the_route_takes() {
    let app = spawn_app().await;
    let listed: Value = serde_json::from_str(&sample()).unwrap();
    let mut gap = listed.clone();
    gap["Shards"][3]["HashKeyRange"]["StartingHashKey"] =
        "85070591730234615865843651857942052900".into();
    let mut paged = listed.clone();
    paged["NextToken"] = "AAAAAAAAAAE".into();
    let bodies = [
        r#"{"shard_count": 4}"#.to_owned(),
        r#"{"shard_count": 3, "primary": true}"#.to_owned(),
        r#"{"shard_count": 2.0}"#.to_owned(),
        r#"{"shard_count": 0}"#.to_owned(),
        r#"{"shard_count": 10001}"#.to_owned(),
        r#"{"shard_count": "4"}"#.to_owned(),
        r#"{"shard_count": 4, "primary": "yes"}"#.to_owned(),
        r#"{}"#.to_owned(),
        r#"[null, 4, null]"#.to_owned(),
        r#"{"shard_count": 4"#.to_owned(),
        sample(),
        paged.to_string(),
        gap.to_string(),
        serde_json::json!({"Shards": listed["Shards"], "shard_count": 3}).to_string(),
        serde_json::json!({"Shards": []}).to_string(),
    ];
    let file = app.dir().join("body.json");
    for (i, body) in bodies.iter().enumerate() {
        let route = answer(
            app.client
                .put(app.url(&format!("/streams/route-{i}")))
                .header("content-type", "application/json")
                .body(body.clone())
                .send()
                .await
                .unwrap(),
        )
        .await;
        // Read now: a later primary stream takes the role from this one.
        let by_route = registered(&app, &format!("route-{i}")).await;
        std::fs::write(&file, body).unwrap();
        let command = streams_put(&app, &format!("command-{i}"), &file).await;
        let stderr = String::from_utf8_lossy(&command.stderr);
        assert_eq!(
            command.status.success(),
            route.status < 300,
            "{body}\nroute: {} {}\ncommand: {stderr}",
            route.status,
            route.body
        );
        if route.status < 300 {
            assert_eq!(
                registered(&app, &format!("command-{i}")).await,
                by_route,
                "{body}"
            );
        } else {
            // The command says why, as the route does, before sending anything.
            assert!(
                stderr.contains(&format!("{}: ", file.display())),
                "{body}: {stderr}"
            );
            assert_eq!(app.get(&format!("/streams/command-{i}")).await.status, 404);
        }
    }
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
