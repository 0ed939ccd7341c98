//! `keyspread streams put --from FILE` takes exactly the bodies `PUT /streams/{name}` takes,
//! and the sample list-shards file in `examples/` registers as the README says.

use std::path::Path;
use std::process::Output;

use serde_json::{Value, json};

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

/// `aws kinesis list-shards` as the CLI prints it (4-space indent) for a stream created
/// with `created` shards whose first `split` shards were each split in half: the parents
/// closed, their children open, ids numbered as Kinesis numbers them.
fn split_list_shards(created: u64, split: u64) -> Vec<u8> {
    let step = u128::MAX / u128::from(created) + 1;
    let range = |lo: u128, hi: u128| json!({"StartingHashKey": lo.to_string(), "EndingHashKey": hi.to_string()});
    let sequence = |n: u64| format!("4968052517601483457443813792586297797676550293273{n:07}");
    let bounds = |i: u64| {
        let lo = u128::from(i) * step;
        let hi = if i + 1 == created {
            u128::MAX
        } else {
            lo + step - 1
        };
        (lo, hi)
    };
    let mut shards = Vec::new();
    for i in 0..created {
        let (lo, hi) = bounds(i);
        let mut sequences = json!({"StartingSequenceNumber": sequence(i)});
        if i < split {
            sequences["EndingSequenceNumber"] = json!(sequence(i + created));
        }
        shards.push(json!({
            "ShardId": format!("shardId-{i:012}"),
            "HashKeyRange": range(lo, hi),
            "SequenceNumberRange": sequences,
        }));
    }
    let mut next = created;
    for i in 0..split {
        let (lo, hi) = bounds(i);
        let mid = lo + (hi - lo) / 2 + 1;
        for (a, b) in [(lo, mid - 1), (mid, hi)] {
            shards.push(json!({
                "ShardId": format!("shardId-{next:012}"),
                "ParentShardId": format!("shardId-{i:012}"),
                "HashKeyRange": range(a, b),
                "SequenceNumberRange": {"StartingSequenceNumber": sequence(next + 2 * created)},
            }));
            next += 1;
        }
    }
    let mut out = Vec::new();
    let indent = serde_json::ser::PrettyFormatter::with_indent(b"    ");
    let mut writer = serde_json::Serializer::with_formatter(&mut out, indent);
    serde::Serialize::serialize(&json!({"Shards": shards}), &mut writer).unwrap();
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_shards_of_10000_open_shards_after_splits_registers_by_route_and_command() {
    let app = spawn_app().await;
    // 5,000 shards each split in two: 10,000 open, 5,000 closed parents.
    let listed = split_list_shards(5_000, 5_000);
    assert!(listed.len() > 7_000_000, "{} bytes", listed.len());
    let put = app
        .client
        .put(app.url("/streams/big"))
        .header("content-type", "application/json")
        .body(listed.clone())
        .send()
        .await
        .unwrap();
    let put = answer(put).await;
    assert_eq!(put.status, 201, "{}", put.body);
    assert_eq!(put.body["stream"]["shard_count"], 10_000);
    // The last open shard is the second child of the last parent, shardId-000000014999.
    let on = app
        .get(&format!("/shard-of?hash_key={}&stream=big", u128::MAX))
        .await;
    assert_eq!(on.status, 200, "{}", on.body);
    assert_eq!(on.body["shard_id"], "shardId-000000014999");
    assert_eq!(on.body["shard_index"], 9_999);
    let on = app.get("/shard-of?hash_key=0&stream=big").await;
    assert_eq!(on.body["shard_id"], "shardId-000000005000");

    let file = app.dir().join("big.json");
    std::fs::write(&file, &listed).unwrap();
    let out = streams_put(&app, "big2", &file).await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        registered(&app, "big2").await,
        registered(&app, "big").await
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_body_over_its_limit_gets_413_and_other_routes_keep_theirs() {
    let app = spawn_app().await;
    let stream_limit = keyspread::http::STREAM_BODY_LIMIT;
    assert!(
        stream_limit > 8 << 20,
        "room for 10,000 open shards and their parents"
    );
    for (path, method, length, refused) in [
        ("/streams/big", "PUT", stream_limit + 1, true),
        ("/streams/big", "PUT", stream_limit, false),
        ("/keys/a", "POST", keyspread::http::BODY_LIMIT + 1, true),
        // Heartbeats carry load reports of up to 1,000 accounts a shard.
        (
            "/streams/big/workers/w1",
            "PUT",
            keyspread::http::HEARTBEAT_BODY_LIMIT + 1,
            true,
        ),
        (
            "/streams/big/workers/w1",
            "PUT",
            keyspread::http::HEARTBEAT_BODY_LIMIT,
            false,
        ),
    ] {
        // The length declared and no body sent: the limit answers from the length alone.
        let head = declared_length(&app, method, path, length).await;
        match refused {
            true => {
                assert!(head.starts_with("HTTP/1.1 413"), "{method} {path}: {head}");
                assert!(head.contains("application/problem+json"), "{head}");
            }
            false => assert!(!head.starts_with("HTTP/1.1 413"), "{method} {path}: {head}"),
        }
    }
}

/// The status line and headers the server answers to a request that declares a JSON body
/// of `length` bytes and sends none of it (within 2 s; empty if it waits for the body).
async fn declared_length(app: &TestApp, method: &str, path: &str, length: usize) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let address = app
        .url("")
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .to_owned();
    let mut socket = tokio::net::TcpStream::connect(&address).await.unwrap();
    let request = format!(
        "{method} {path} HTTP/1.1\r\nhost: {address}\r\ncontent-type: application/json\r\n\
         content-length: {length}\r\n\r\n"
    );
    socket.write_all(request.as_bytes()).await.unwrap();
    let mut head = vec![0; 4096];
    let read = tokio::time::timeout(std::time::Duration::from_secs(2), socket.read(&mut head));
    match read.await {
        Ok(Ok(n)) => String::from_utf8_lossy(&head[..n]).into_owned(),
        _ => String::new(),
    }
}
