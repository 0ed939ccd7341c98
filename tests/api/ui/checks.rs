//! The page's figures against the JSON routes': skew, the heaviest accounts with their
//! keys, pending moves, workers and lease states, observed load and hot accounts.

use reqwest::Method;
use serde_json::Value;

use super::dom::{Tag, one, text_after};
use super::{HOSTILE, encode, ok};
use crate::helpers::TestApp;

/// The skew card's figures, as `/distribution` answers them.
pub fn skew(card: &Tag, skew: &Value) {
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
pub async fn accounts(app: &TestApp, html: &str, page: &[Tag]) {
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
pub async fn moves(app: &TestApp, page: &[Tag]) {
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
        assert_eq!(row.get("data-applied-by"), m["applied_by"]);
    }
}

/// The live workers, their shards and weight, and how many shards are in each lease state.
pub async fn workers(app: &TestApp, page: &[Tag]) {
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
        let used: f64 = row.get("data-worker-utilisation").parse().unwrap();
        let answered = w["utilisation"].as_f64().unwrap();
        assert!(
            (used - answered).abs() <= 1e-3 * answered,
            "{used} {answered}"
        );
        assert!(answered > 0.0, "{leases}");
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

/// Each shard's observed utilisation and the hot accounts, as `GET /load` answers them
/// (rates decay between the two answers: by a day's half-life, a millionth a second).
pub async fn load(app: &TestApp, page: &[Tag]) {
    let close = |shown: &str, answered: &Value| {
        let shown: f64 = shown.parse().unwrap();
        let answered = answered.as_f64().unwrap();
        assert!(
            (shown - answered).abs() <= 1e-3 * answered.abs().max(1e-9),
            "page {shown}, GET /load {answered}"
        );
    };
    let load = ok(
        app,
        Method::GET,
        "/load?stream=orders&order=load&limit=10",
        None,
    )
    .await;
    let shards = load["shards"].as_array().unwrap();
    let rows: Vec<&Tag> = page.iter().filter(|t| t.has("data-utilisation")).collect();
    assert_eq!(rows.len(), shards.len(), "a utilisation per shard");
    for (row, shard) in rows.iter().zip(shards) {
        assert_eq!(row.get("data-shard-id"), shard["shard_id"]);
        close(row.get("data-utilisation"), &shard["utilisation"]);
    }
    let busiest = shards.iter().map(|s| s["utilisation"].as_f64().unwrap());
    assert!(busiest.fold(0.0, f64::max) > 0.9, "{load}");

    let hot: Vec<&Value> = (load["accounts"].as_array().unwrap().iter())
        .filter(|a| !a["suggested_fanout"].is_null())
        .collect();
    let names: Vec<&str> = hot.iter().map(|a| a["account"].as_str().unwrap()).collect();
    assert_eq!(
        names,
        ["big-co", HOSTILE],
        "the hot ones, heaviest first: {load}"
    );
    let rows: Vec<&Tag> = page.iter().filter(|t| t.has("data-hot-account")).collect();
    assert_eq!(rows.len(), hot.len());
    for (row, a) in rows.iter().zip(hot) {
        assert_eq!(row.get("data-hot-account"), a["account"]);
        close(row.get("data-load"), &a["load"]);
        assert_eq!(row.num("data-suggested-fanout"), a["suggested_fanout"]);
        assert_eq!(row.num("data-current-fanout"), a["fanout"]);
    }
}
