//! `GET /ui` as a person sees it: Chromium renders the page over a real socket, and every
//! number it shows is checked against the JSON routes; names clients chose stay text.

mod browser;
mod checks;
mod dom;
mod plain;

use std::path::Path;

use reqwest::Method;
use serde_json::{Value, json};

use crate::helpers::{TestApp, spawn_app_with};
use browser::Browser;
use dom::{Tag, one, tags};

/// An account name that would be markup if the page did not escape it.
const HOSTILE: &str = r#"<b id="pwned">"hot" & 'co'</b>"#;

/// Every byte but letters and digits percent-encoded, for a path segment or a query value.
fn encode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

async fn ok(app: &TestApp, method: Method, path: &str, body: Option<Value>) -> Value {
    let answer = app.call(method, path, body).await;
    assert!(
        (200..300).contains(&answer.status),
        "{path}: {}",
        answer.body
    );
    answer.body
}

/// A stream `orders` of 6 shards (primary) over accounts all placed in the lower half of
/// the keyspace, so that its rebalance has many moves: applied, to switch in a day. Two
/// workers hold its leases.
async fn fill(app: &TestApp) {
    let accounts: Vec<Value> = (0..240u64)
        .map(|i| json!({"account": format!("acct-{i:03}"), "weight": 1 + u64::from(i % 8 == 0)}))
        .collect();
    let placed = ok(
        app,
        Method::POST,
        "/keys/batch",
        Some(json!({"accounts": accounts})),
    )
    .await;
    for a in placed["items"].as_array().unwrap() {
        let key: u128 = a["hash_key"].as_str().unwrap().parse().unwrap();
        if key >= 1 << 127 {
            let path = format!("/keys/{}", a["account"].as_str().unwrap());
            assert_eq!(app.delete(&path).await.status, 204);
        }
    }
    let hot = [("big-co", 8, 64), (HOSTILE, 4, 40)];
    let hot: Vec<Value> = (hot.iter())
        .map(|(account, fanout, weight)| json!({"account": account, "fanout": fanout, "weight": weight}))
        .collect();
    ok(
        app,
        Method::POST,
        "/keys/batch",
        Some(json!({"accounts": hot})),
    )
    .await;
    let stream = json!({"shard_count": 6, "primary": true});
    ok(app, Method::PUT, "/streams/orders", Some(stream)).await;
    let plan = ok(app, Method::GET, "/rebalance/preview?stream=orders", None).await;
    assert!(!plan["moves"].as_array().unwrap().is_empty(), "{plan}");
    let apply = json!({"plan_id": plan["plan_id"], "switch_after_s": 86400});
    ok(app, Method::POST, "/rebalance", Some(apply)).await;
    // A revoked lease is handed over at its owner's next heartbeat.
    for _ in 0..20 {
        for worker in ["worker-a", "worker-b"] {
            let path = format!("/streams/orders/workers/{worker}");
            ok(app, Method::PUT, &path, Some(json!({"ttl_s": 600}))).await;
        }
        let leases = ok(app, Method::GET, "/streams/orders/leases", None).await;
        if leases["shards"]
            .as_array()
            .unwrap()
            .iter()
            .all(|s| s["state"] == "held")
        {
            return;
        }
    }
    panic!("the two workers never settled on their leases");
}

/// Half-life of observed load on the page's server: a day, so that rates barely decay
/// between the page and the `GET /load` it is checked against.
const HALF_LIFE_S: u64 = 86_400;

/// The workers report what they read from their shards: shard `i` at `(i + 1) × 10 %` of
/// its limit (the first two hotter), `big-co` at 90 % of a shard and the hostile name at
/// 60 % (both above the hot share of 50 %), and one cold account at 20 %.
async fn report_load(app: &TestApp) {
    // One report of an hour's window: the share of the observed rate it folds in.
    let window_s = 3600.0;
    let folded = 1.0 - (-window_s / HALF_LIFE_S as f64).exp2();
    let records = |utilisation: f64| (utilisation * 1000.0 * window_s / folded).round() as u64;
    let leases = ok(app, Method::GET, "/streams/orders/leases", None).await;
    let accounts = [
        vec![("big-co", 0.9)],
        vec![(HOSTILE, 0.6), ("acct-001", 0.2)],
    ];
    for (i, shard) in leases["shards"].as_array().unwrap().iter().enumerate() {
        let named = accounts.get(i).cloned().unwrap_or_default();
        let utilisation = 0.1 * (i + 1) as f64 + named.iter().map(|(_, u)| u).sum::<f64>();
        let named: Vec<Value> = (named.iter())
            .map(|(a, u)| json!({"account": a, "records": records(*u), "bytes": 0}))
            .collect();
        let entry = json!({"shard_id": shard["shard_id"], "epoch": shard["epoch"],
                           "window_ms": 3_600_000, "records": records(utilisation), "bytes": 0,
                           "accounts": named});
        let path = format!(
            "/streams/orders/workers/{}",
            shard["owner"].as_str().unwrap()
        );
        let beat = ok(
            app,
            Method::PUT,
            &path,
            Some(json!({"ttl_s": 600, "load": [entry]})),
        )
        .await;
        assert_eq!(beat["ignored_load"], json!([]), "{beat}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_shows_what_the_api_answers() {
    // The client drives the HTTP API, which either backend serves alike: once is enough.
    if !crate::skip::sqlite_only("the_page_shows_what_the_api_answers") {
        return;
    }
    let Some(browser) = Browser::find("ui::the_page_shows_what_the_api_answers") else {
        return;
    };
    let app = spawn_app_with(|c| {
        c.lease_join_batch_ms = 0;
        c.load_half_life_s = HALF_LIFE_S;
    })
    .await;
    fill(&app).await;
    report_load(&app).await;
    let html = browser.dom(&app.url("/ui")).await;
    let page = tags(&html);
    assert_eq!(one(&page, "id", "shown").get("data-stream"), "orders");

    let distribution = ok(&app, Method::GET, "/distribution?stream=orders", None).await;
    checks::skew(one(&page, "id", "skew"), &distribution["skew"]);
    checks::skew(one(&page, "id", "md5-skew"), &distribution["md5_skew"]);
    let rows: Vec<&Tag> = page.iter().filter(|t| t.has("data-md5-keys")).collect();
    let shards = distribution["shards"].as_array().unwrap();
    assert_eq!(rows.len(), shards.len());
    for (row, shard) in rows.iter().zip(shards) {
        assert_eq!(row.num("data-shard"), shard["shard_index"]);
        assert_eq!(row.num("data-keys"), shard["accounts"]);
        assert_eq!(row.num("data-weight"), shard["weight"]);
        assert_eq!(row.num("data-md5-keys"), shard["md5_accounts"]);
        assert_eq!(row.num("data-md5-weight"), shard["md5_weight"]);
    }
    let band: Vec<&Tag> = page
        .iter()
        .filter(|t| t.has("data-max-weight") && t.name == "i")
        .collect();
    assert_eq!(
        band.len(),
        2 * shards.len(),
        "a segment per shard, in each band"
    );
    for (segment, shard) in band.iter().zip(shards) {
        assert_eq!(segment.num("data-max-weight"), shard["weight"]);
    }

    checks::accounts(&app, &html, &page).await;
    checks::moves(&app, &page).await;
    checks::workers(&app, &page).await;
    checks::load(&app, &page).await;
    assert!(
        page.iter().all(|t| t.attr("id") != Some("pwned")),
        "markup got in"
    );

    let shot = match std::env::var("KEYSPREAD_UPDATE_SCREENSHOT").as_deref() {
        Ok("1") => Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/ui.png"),
        _ => app.dir().join("ui.png"),
    };
    browser
        .screenshot(&app.url("/ui"), &shot, (1280, 2000))
        .await;
    println!("screenshot: {}", shot.display());
}
