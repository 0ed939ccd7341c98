//! The page over plain HTTP: where `/` leads, the error pages, headers, and a large map
//! summarised in groups whose figures are `GET /distribution`'s.

use reqwest::Method;
use serde_json::{Value, json};

use super::dom::{Tag, one, tags};
use super::{HOSTILE, encode, ok};
use crate::helpers::{TestApp, spawn_app};

/// What a GET answered, redirects not followed.
struct Got {
    status: u16,
    content_type: String,
    csp: String,
    location: String,
    body: String,
}

async fn page(app: &TestApp, path: &str) -> Got {
    let client = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let response = client.get(app.url(path)).send().await.unwrap();
    let header = |name: &str| {
        let value = response.headers().get(name);
        value.map_or(String::new(), |v| v.to_str().unwrap().to_owned())
    };
    Got {
        status: response.status().as_u16(),
        content_type: header("content-type"),
        csp: header("content-security-policy"),
        location: header("location"),
        body: response.text().await.unwrap(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_root_leads_to_the_page_which_defaults_to_a_uniform_map() {
    let app = spawn_app().await;
    let root = page(&app, "/").await;
    assert_eq!((root.status, root.location.as_str()), (303, "/ui"));
    let ui = page(&app, "/ui").await;
    assert_eq!(ui.status, 200, "{}", ui.body);
    assert_eq!(ui.content_type, "text/html; charset=utf-8");
    assert!(ui.csp.starts_with("default-src 'none'"), "{}", ui.csp);
    let html = ui.body;
    let found = tags(&html);
    assert_eq!(one(&found, "id", "shown").num("data-shards"), 4);
    assert!(found.iter().all(|t| t.name != "script" && t.name != "link"));
    assert!(!html.contains("http-equiv"), "no refresh unless asked");
    let refreshing = page(&app, "/ui?shards=2&refresh=10").await.body;
    assert!(refreshing.contains(r#"<meta http-equiv="refresh" content="10">"#));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_streams_and_bad_maps_answer_pages_that_say_so() {
    let app = spawn_app().await;
    let hostile = format!("/ui?stream={}", encode(HOSTILE));
    let cases: [(&str, u16, &str); 7] = [
        // The detail quotes the name as Rust's Debug does: quotes get a backslash.
        (
            &hostile,
            404,
            r"&lt;b id=\&quot;pwned\&quot;&gt;\&quot;hot\&quot; &amp; &#39;co&#39;&lt;/b&gt;",
        ),
        ("/ui?stream=nope", 404, "no stream named &quot;nope&quot;"),
        ("/ui?shards=0", 400, "shard"),
        ("/ui?shards=10001", 400, "shard"),
        ("/ui?shards=many", 400, "shards"),
        ("/ui?shards=4&stream=orders", 400, "exactly one"),
        ("/ui?refresh=1", 400, "refresh must be between 5 and 3600"),
    ];
    for (path, status, says) in cases {
        let got = page(&app, path).await;
        let html = got.body;
        assert_eq!(got.status, status, "{path}: {html}");
        assert_eq!(got.content_type, "text/html; charset=utf-8", "{path}");
        assert!(!got.csp.is_empty(), "{path}");
        let found = tags(&html);
        assert_eq!(
            one(&found, "id", "error").num("data-status"),
            u64::from(status)
        );
        assert!(html.contains(says), "{path}: {html}");
        assert!(
            found.iter().all(|t| t.attr("id") != Some("pwned")),
            "{path}: markup got in"
        );
        assert!(!html.contains("<b id"), "{path}: markup got in");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_map_is_summarised_in_groups_with_the_distribution_s_figures() {
    let app = spawn_app().await;
    let accounts: Vec<Value> = (0..300u64)
        .map(|i| json!({"account": format!("a{i}"), "weight": 1 + i % 7}))
        .collect();
    ok(
        &app,
        Method::POST,
        "/keys/batch",
        Some(json!({"accounts": accounts})),
    )
    .await;
    let got = page(&app, "/ui?shards=1000").await;
    assert_eq!(got.status, 200, "{}", got.body);
    let html = got.body;
    let found = tags(&html);
    let distribution = ok(&app, Method::GET, "/distribution?shards=1000", None).await;
    let shards = distribution["shards"].as_array().unwrap();
    let field = |s: &Value, f: &str| s[f].as_u64().unwrap();

    let groups: Vec<&Tag> = found
        .iter()
        .filter(|t| t.has("data-md5-max-keys"))
        .collect();
    assert!(groups.len() <= 64, "{} rows", groups.len());
    let mut next = 0;
    for g in &groups {
        let (first, last) = (g.num("data-first"), g.num("data-last"));
        assert_eq!(first, next, "groups cover every shard, in order");
        next = last + 1;
        let part = &shards[first as usize..=last as usize];
        for (attr, f) in [
            ("keys", "accounts"),
            ("weight", "weight"),
            ("md5-keys", "md5_accounts"),
            ("md5-weight", "md5_weight"),
        ] {
            let (lo, hi) = match attr.strip_prefix("md5-") {
                Some(rest) => (
                    format!("data-md5-min-{rest}"),
                    format!("data-md5-max-{rest}"),
                ),
                None => (format!("data-min-{attr}"), format!("data-max-{attr}")),
            };
            assert_eq!(g.num(&lo), part.iter().map(|s| field(s, f)).min().unwrap());
            assert_eq!(g.num(&hi), part.iter().map(|s| field(s, f)).max().unwrap());
        }
    }
    assert_eq!(next, 1000);

    let mut heaviest: Vec<&Value> = shards.iter().collect();
    heaviest.sort_by_key(|s| {
        (
            std::cmp::Reverse(field(s, "weight")),
            field(s, "shard_index"),
        )
    });
    let rows: Vec<&Tag> = found.iter().filter(|t| t.has("data-md5-keys")).collect();
    assert_eq!(rows.len(), 8);
    for (row, s) in rows.iter().zip(heaviest) {
        assert_eq!(row.num("data-shard"), s["shard_index"]);
        assert_eq!(row.num("data-weight"), s["weight"]);
    }
    let (keyspread, md5) = (
        one(&found, "id", "band").end,
        one(&found, "id", "md5-band").end,
    );
    let segments = |from: usize, to: usize| {
        let within = |t: &&Tag| t.end > from && t.end < to;
        found
            .iter()
            .filter(within)
            .filter(|t| t.name == "i" && t.has("data-first"))
            .count()
    };
    assert_eq!(
        segments(keyspread, md5),
        125,
        "1000 shards in segments of 8"
    );
    assert_eq!(segments(md5, usize::MAX), 125);
}
