//! `GET /ui` as a person sees it: Chromium renders the page over a real socket, and every
//! number it shows is checked against the JSON routes; names clients chose stay text.

mod browser;
mod dom;
mod plain;

use std::path::Path;

use reqwest::Method;
use serde_json::{Value, json};

use crate::helpers::{TestApp, spawn_app_with};
use browser::Browser;
use dom::{Tag, one, tags, text_after};

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_shows_what_the_api_answers() {
    let Some(browser) = Browser::find("ui::the_page_shows_what_the_api_answers") else {
        return;
    };
    let app = spawn_app_with(|c| c.lease_join_batch_ms = 0).await;
    fill(&app).await;
    let html = browser.dom(&app.url("/ui")).await;
    let page = tags(&html);
    assert_eq!(one(&page, "id", "shown").get("data-stream"), "orders");

    let distribution = ok(&app, Method::GET, "/distribution?stream=orders", None).await;
    check_skew(one(&page, "id", "skew"), &distribution["skew"]);
    check_skew(one(&page, "id", "md5-skew"), &distribution["md5_skew"]);
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

    check_accounts(&app, &html, &page).await;
    check_moves(&app, &page).await;
    check_workers(&app, &page).await;
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

fn check_skew(card: &Tag, skew: &Value) {
    for (attr, field) in [
        ("data-shards", "shards"),
        ("data-keys", "accounts"),
        ("data-max", "max"),
        ("data-min", "min"),
        ("data-weight", "weight"),
        ("data-max-weight", "max_weight"),
        ("data-min-weight", "min_weight"),
    ] {
        assert_eq!(card.num(attr), skew[field], "{attr}");
    }
    // serde_json reads floats to within an ulp, not always exactly.
    let ratio: f64 = card.get("data-max-over-mean").parse().unwrap();
    assert!(
        (ratio - skew["max_over_mean"].as_f64().unwrap()).abs() < 1e-12,
        "{ratio}"
    );
}

/// The heaviest accounts, in order, each key and its shard as the lookup and shard-of say.
async fn check_accounts(app: &TestApp, html: &str, page: &[Tag]) {
    let listed = ok(app, Method::GET, "/keys?limit=1000", None).await;
    let mut all: Vec<(u64, String)> = listed["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| {
            (
                a["weight"].as_u64().unwrap(),
                a["account"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    all.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
    assert_eq!(
        one(page, "id", "card-accounts").num("data-value") as usize,
        all.len()
    );
    let rows: Vec<&Tag> = page.iter().filter(|t| t.has("data-fanout")).collect();
    let expected: Vec<&str> = all.iter().take(10).map(|(_, a)| a.as_str()).collect();
    let shown: Vec<&str> = rows.iter().map(|r| r.get("data-account")).collect();
    assert_eq!(shown, expected);
    let hostile = rows
        .iter()
        .find(|r| r.get("data-account") == HOSTILE)
        .unwrap();
    let cell = page
        .iter()
        .find(|t| t.end > hostile.end && t.attr("class") == Some("acct"));
    assert_eq!(
        text_after(html, cell.unwrap()),
        HOSTILE,
        "the name reads as text"
    );
    for (i, row) in rows.iter().enumerate() {
        let account = encode(row.get("data-account"));
        let lookup = ok(app, Method::GET, &format!("/keys/{account}"), None).await;
        assert_eq!(row.num("data-weight"), lookup["weight"]);
        assert_eq!(row.num("data-fanout"), lookup["fanout"]);
        let next_row = rows.get(i + 1).map_or(usize::MAX, |r| r.end);
        let chips = page.iter().filter(|t| {
            t.end > row.end
                && t.end < next_row
                && t.attr("class") == Some("key")
                && t.has("data-hash-key")
        });
        let chips: Vec<&Tag> = chips.collect();
        assert_eq!(chips.len() as u64, row.num("data-fanout"));
        for chip in chips {
            let index = chip.num("data-index");
            assert_eq!(
                chip.get("data-hash-key"),
                lookup["hash_keys"][index as usize]
            );
            let path = format!("/shard-of?account={account}&index={index}&stream=orders");
            let on = ok(app, Method::GET, &path, None).await;
            assert_eq!(chip.num("data-shard"), on["shard_index"]);
        }
    }
}

/// The first page of pending moves, and how many keys are still to switch.
async fn check_moves(app: &TestApp, page: &[Tag]) {
    let all = ok(app, Method::GET, "/moves?limit=1000", None).await;
    let pending = all["items"].as_array().unwrap().len() as u64;
    assert!(
        pending > 10,
        "{pending} moves: the page shows 10 and says more follow"
    );
    assert_eq!(one(page, "id", "card-pending").num("data-value"), pending);
    let moves = ok(app, Method::GET, "/moves?limit=10", None).await;
    let items = moves["items"].as_array().unwrap();
    let rows: Vec<&Tag> = page.iter().filter(|t| t.has("data-event-id")).collect();
    let more = format!("/moves?after={}", moves["next"]);
    assert!(
        page.iter().any(|t| t.attr("href") == Some(more.as_str())),
        "{more}"
    );
    assert_eq!(rows.len(), items.len());
    for (row, m) in rows.iter().zip(items) {
        assert_eq!(row.num("data-event-id"), m["event_id"]);
        assert_eq!(row.get("data-account"), m["account"]);
        assert_eq!(row.num("data-index"), m["index"]);
        assert_eq!(row.get("data-from"), m["from"]);
        assert_eq!(row.get("data-to"), m["to"]);
        assert_eq!(row.get("data-switch-at"), m["switch_at"]);
    }
}

async fn check_workers(app: &TestApp, page: &[Tag]) {
    let leases = ok(app, Method::GET, "/streams/orders/leases", None).await;
    let workers = leases["workers"].as_array().unwrap();
    let rows: Vec<&Tag> = page.iter().filter(|t| t.has("data-worker")).collect();
    assert_eq!(rows.len(), 2);
    assert_eq!(rows.len(), workers.len());
    for (row, w) in rows.iter().zip(workers) {
        assert_eq!(row.get("data-worker"), w["worker"]);
        assert_eq!(
            row.num("data-shards") as usize,
            w["shards"].as_array().unwrap().len()
        );
        assert_eq!(row.num("data-weight"), w["weight"]);
        assert_eq!(row.get("data-expires-at"), w["expires_at"]);
    }
    let states = one(page, "id", "lease-states");
    for state in ["held", "revoking", "free", "waiting", "done"] {
        let n = leases["shards"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|s| s["state"] == state);
        assert_eq!(
            states.num(&format!("data-{state}")) as usize,
            n.count(),
            "{state}"
        );
    }
}
