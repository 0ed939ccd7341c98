//! The producers' mirror (crates/client) against the real server: it answers what lookups
//! answer, follows changes made elsewhere within a second, switches a staged move at its
//! `switch_at` by the local clock, refuses to answer once it could have missed a switch,
//! and resumes from its event id after a restart without a new snapshot.

use std::time::{Duration, Instant};

use keyspread_client::{Error, Mirror};
use serde_json::{Value, json};

use crate::helpers::{TestApp, spawn_app, spawn_app_with};
use crate::staged::{lopsided, now_ms, sleep_until, unix_ms};

/// `GET /keys/{account}` as the mirror would answer it at the same instant: the keys, or
/// `None` for 404.
async fn looked_up(app: &TestApp, account: &str) -> Option<Vec<String>> {
    let answer = app.get(&format!("/keys/{account}")).await;
    match answer.status {
        404 => None,
        200 => Some(strings(&answer.body["hash_keys"])),
        status => panic!("GET /keys/{account}: {status} {}", answer.body),
    }
}

fn strings(keys: &Value) -> Vec<String> {
    (keys
        .as_array()
        .unwrap_or_else(|| panic!("a list of keys: {keys}")))
    .iter()
    .map(|k| k.as_str().unwrap().to_owned())
    .collect()
}

fn mirrored(mirror: &Mirror, account: &str) -> Option<Vec<String>> {
    (mirror.keys(account).expect("a fresh mirror")).map(|keys| keys.to_vec())
}

/// Waits until the mirror answers `want` for `account`, at most `limit`; answers how long.
async fn seen_within(
    mirror: &Mirror,
    account: &str,
    want: &Option<Vec<String>>,
    limit: Duration,
) -> Duration {
    let started = Instant::now();
    loop {
        let got = mirrored(mirror, account);
        if &got == want {
            return started.elapsed();
        }
        assert!(
            started.elapsed() < limit,
            "the mirror answered {got:?} for {account}, not {want:?}, {limit:?} after the change"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mirror_answers_what_lookups_answer_and_follows_changes_made_elsewhere() {
    let app = spawn_app().await;
    for i in 0..20 {
        let body = json!({"fanout": 1 + i % 5, "weight": 10});
        let answer = app.post(&format!("/keys/before-{i}"), Some(body)).await;
        assert_eq!(answer.status, 201, "{}", answer.body);
    }
    let mirror = Mirror::start(&app.url("")).await.expect("a mirror");
    assert_eq!(mirror.len(), 20);
    for i in 0..20 {
        let account = format!("before-{i}");
        assert_eq!(
            mirrored(&mirror, &account),
            looked_up(&app, &account).await,
            "{account}"
        );
    }

    // Allocated through the mirror: answered from it, as the server answers.
    let keys = mirror.allocate("through-mirror").await.expect("allocated");
    assert_eq!(Some(keys.to_vec()), looked_up(&app, "through-mirror").await);

    // Changes made elsewhere: a new account, a grown and a shrunk fanout, a release.
    let mut slowest = Duration::ZERO;
    let changes = [
        (
            reqwest::Method::POST,
            "/keys/elsewhere",
            Some(json!({"fanout": 4, "weight": 8})),
        ),
        (
            reqwest::Method::PATCH,
            "/keys/before-1",
            Some(json!({"fanout": 9})),
        ),
        (
            reqwest::Method::PATCH,
            "/keys/before-4",
            Some(json!({"fanout": 1})),
        ),
        (reqwest::Method::DELETE, "/keys/before-2", None),
    ];
    for (method, path, body) in changes {
        let answer = app.call(method.clone(), path, body).await;
        assert!(answer.status < 300, "{method} {path}: {}", answer.body);
        let account = path.trim_start_matches("/keys/");
        let want = looked_up(&app, account).await;
        slowest = slowest.max(seen_within(&mirror, account, &want, Duration::from_secs(1)).await);
    }
    println!("changes made elsewhere reached the mirror within {slowest:?}");

    // The sub-key selector is the server's: the key `GET /shard-of` names for a sub-key.
    for sub_key in ["order-1", "user-42", "", "caf\u{e9}"] {
        let query = format!(
            "/shard-of?account=elsewhere&sub_key={}&shards=4",
            urlencode(sub_key)
        );
        let answer = app.get(&query).await;
        assert_eq!(answer.status, 200, "{}", answer.body);
        let index = answer.body["index"].as_u64().unwrap() as usize;
        let keys = looked_up(&app, "elsewhere").await.unwrap();
        assert_eq!(
            mirror.key_for("elsewhere", sub_key).unwrap(),
            Some(keys[index].clone()),
            "{sub_key:?}"
        );
    }
    assert_eq!(mirror.snapshots(), 1, "followed, never re-read whole");
}

fn urlencode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'-' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_staged_move_switches_in_the_mirror_at_switch_at_by_the_local_clock() {
    let app = spawn_app().await;
    lopsided(&app).await;
    let mirror = Mirror::start(&app.url("")).await.expect("a mirror");
    let preview = app.get("/rebalance/preview?shards=2").await.body;
    let moves = preview["moves"].as_array().unwrap().clone();
    assert!(!moves.is_empty(), "{preview}");
    let applied = app
        .post(
            "/rebalance",
            Some(json!({"plan_id": preview["plan_id"], "switch_after_s": 3})),
        )
        .await;
    assert_eq!(applied.status, 200, "{}", applied.body);
    let switch_at = unix_ms(applied.body["switch_at"].as_str().unwrap());
    let account = moves[0]["account"].as_str().unwrap();
    let lookup = app.get(&format!("/keys/{account}")).await.body;
    let old = strings(&lookup["hash_keys"]);
    let new = strings(&lookup["next"]["hash_keys"]);
    assert_ne!(old, new);

    // Before the switch: the old keys, and the switch ahead with the server's instant.
    // (The old keys were answered before the move too: wait for the move itself.)
    let started = Instant::now();
    let next = loop {
        let ahead = mirror.lookup(account).unwrap().expect("held throughout");
        assert_eq!(ahead.keys.to_vec(), old, "the old keys until the switch");
        if let Some(next) = ahead.next {
            break next;
        }
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "the move never reached the mirror"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    assert_eq!((next.keys.to_vec(), next.at), (new.clone(), switch_at));
    assert!(now_ms() < switch_at, "checked before the switch");

    // From switch_at on, by this machine's clock, with no event in between: the new keys.
    sleep_until(switch_at, 0).await;
    assert_eq!(mirrored(&mirror, account), Some(new.clone()));
    assert_eq!(mirror.lookup(account).unwrap().unwrap().next, None);
    assert_eq!(looked_up(&app, account).await, Some(new));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mirror_that_cannot_sync_for_max_age_refuses_to_answer_then_resumes_without_a_snapshot() {
    let mut app = spawn_app_with(|c| {
        c.lookup_cache_control = axum::http::HeaderValue::from_static("max-age=3");
    })
    .await;
    app.allocate("steady").await;
    let mirror = Mirror::start(&app.url("")).await.expect("a mirror");
    assert_eq!(mirror.max_age(), Duration::from_secs(3));
    let event_id = mirror.event_id();
    assert!(mirror.keys("steady").unwrap().is_some());

    // Quiet but reachable: the long-polls keep it synced past max_age.
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert!(
        mirror.keys("steady").is_ok(),
        "a quiet log is still a sync: {:?}",
        mirror.lag()
    );

    // The server away: answers go on from the table until max_age, then Stale.
    app.config.listen = app.addr;
    app.stop().await;
    let stopped = Instant::now();
    loop {
        match mirror.keys("steady") {
            Ok(keys) => assert!(keys.is_some()),
            Err(Error::Stale(lag)) => {
                assert!(lag > Duration::from_secs(3), "{lag:?}");
                break;
            }
            Err(other) => panic!("{other}"),
        }
        assert!(stopped.elapsed() < Duration::from_secs(8), "never stale");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(matches!(
        mirror.key_for("steady", "x"),
        Err(Error::Stale(_))
    ));
    assert!(matches!(mirror.lookup("steady"), Err(Error::Stale(_))));

    // Back on the same address: it resumes from its event id, no second snapshot, and
    // follows a change made after the restart.
    let app = app.restart().await;
    let account = "after-restart";
    app.allocate(account).await;
    let want = looked_up(&app, account).await;
    let started = Instant::now();
    while mirror.keys(account).ok().flatten().map(|k| k.to_vec()) != want {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "not resumed: {:?} {} {:?}",
            mirror.lag(),
            app.addr,
            looked_up(&app, "steady").await
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        mirror.snapshots(),
        1,
        "resumed from event {event_id}, not re-read"
    );
    assert!(mirror.event_id() > event_id);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mirror_agrees_with_every_lookup_after_a_history_of_changes() {
    let app = spawn_app().await;
    let mirror = Mirror::start(&app.url("")).await.expect("a mirror");
    // A deterministic mix: allocations of several fanouts, growth, shrinking, releases,
    // and staged moves (some switched, one still pending at the end).
    let mut seed: u64 = 0x5eed;
    let mut next = |n: u64| {
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (seed >> 33) % n
    };
    let mut moved = 0;
    for round in 0..4 {
        for _ in 0..60 {
            let account = format!("h-{}", next(60));
            let (method, body) = match next(20) {
                0..10 => (
                    reqwest::Method::POST,
                    Some(json!({"fanout": 1 + next(6), "weight": 40})),
                ),
                10..14 => (reqwest::Method::PATCH, Some(json!({"fanout": 1 + next(8)}))),
                14..17 => (
                    reqwest::Method::PATCH,
                    Some(json!({"weight": 8 + next(50)})),
                ),
                _ => (reqwest::Method::DELETE, None),
            };
            let answer = app.call(method, &format!("/keys/{account}"), body).await;
            assert!(answer.status < 500, "{}", answer.body);
        }
        if round == 3 {
            // Every account with key 0 on shard 0 of 4 released: the plan has moves to make.
            for i in 0..60 {
                let on = app.get(&format!("/shard-of?account=h-{i}&shards=4")).await;
                if on.status == 200 && on.body["shard_index"] == 0 {
                    assert_eq!(app.delete(&format!("/keys/h-{i}")).await.status, 204);
                }
            }
        }
        let preview = app.get("/rebalance/preview?shards=4").await.body;
        let moves = preview["moves"].as_array().unwrap().len();
        if moves > 0 {
            moved += moves;
            // Switched at once in the first rounds, still pending at the end.
            let switch_after_s = if round == 3 { 600 } else { 0 };
            let applied = app
                .post(
                    "/rebalance",
                    Some(json!({"plan_id": preview["plan_id"], "switch_after_s": switch_after_s})),
                )
                .await;
            assert_eq!(applied.status, 200, "{}", applied.body);
        }
    }
    let head = app.get("/events?after=0&limit=1").await;
    assert_eq!(head.status, 200);
    let page = app.get("/keys?limit=1000").await.body;
    let listed = page["items"].as_array().unwrap();
    assert!(listed.len() > 5, "{page}");
    // Followed: every account answered the same keys, and `next` the same switch.
    let last = listed.last().unwrap()["account"]
        .as_str()
        .unwrap()
        .to_owned();
    seen_within(
        &mirror,
        &last,
        &looked_up(&app, &last).await,
        Duration::from_secs(2),
    )
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut pending = 0;
    for held in listed {
        let account = held["account"].as_str().unwrap();
        let lookup = app.get(&format!("/keys/{account}")).await.body;
        let mine = mirror.lookup(account).unwrap().expect(account);
        assert_eq!(
            mine.keys.to_vec(),
            strings(&lookup["hash_keys"]),
            "{account}"
        );
        match (&mine.next, lookup.get("next")) {
            (None, None) => {}
            (Some(next), Some(theirs)) => {
                pending += 1;
                assert_eq!(
                    next.keys.to_vec(),
                    strings(&theirs["hash_keys"]),
                    "{account}"
                );
                assert_eq!(next.at, unix_ms(theirs["switch_at"].as_str().unwrap()));
            }
            (mine, theirs) => panic!("{account}: mirror {mine:?}, server {theirs:?}"),
        }
    }
    for i in 0..30 {
        let account = format!("h-{i}");
        if looked_up(&app, &account).await.is_none() {
            assert_eq!(mirrored(&mirror, &account), None, "{account} was released");
        }
    }
    println!(
        "{} accounts agree after {moved} moves, {pending} with a switch pending",
        listed.len()
    );
    assert!(pending > 0, "the history ends with a switch pending");
    assert_eq!(mirror.snapshots(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mirror_sends_its_token_and_says_why_an_allocation_was_refused() {
    const TOKEN: &str = "mirror-token-0123456789abcdef";
    let app = spawn_app_with(|c| c.token = Some(TOKEN.parse().unwrap())).await;
    let without = Mirror::start(&app.url("")).await.expect("reads are open");
    match without.allocate("acme").await {
        Err(Error::Refused { status, detail, .. }) => {
            assert_eq!(status, 401, "{detail}");
            assert!(!detail.is_empty());
        }
        other => panic!("allocated without the token: {other:?}"),
    }
    let options = keyspread_client::Options {
        token: Some(TOKEN.into()),
        ..Default::default()
    };
    let with = Mirror::start_with(&app.url(""), options)
        .await
        .expect("a mirror");
    let keys = with
        .allocate("acme")
        .await
        .expect("allocated with the token");
    assert_eq!(Some(keys.to_vec()), looked_up(&app, "acme").await);
    let shown = format!(
        "{:?}",
        keyspread_client::Options {
            token: Some(TOKEN.into()),
            ..Default::default()
        }
    );
    assert!(
        !shown.contains(TOKEN),
        "the token is never printed: {shown}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mirror_whose_position_was_compacted_away_takes_a_new_snapshot() {
    let mut app = spawn_app_with(|c| {
        c.event_retention = keyspread::config::EventRetention::Keep {
            max_age_ms: 0,
            keep: 10,
        };
        c.event_compaction_interval_s = 1;
    })
    .await;
    app.allocate("first").await;
    let mirror = Mirror::start(&app.url("")).await.expect("a mirror");
    let position = mirror.event_id();

    // Away from the mirror's address, 60 changes are made and compacted down to 10.
    let address = app.addr;
    app.config.listen = "127.0.0.1:0".parse().unwrap();
    let mut app = app.restart().await;
    for i in 0..30 {
        app.allocate(&format!("while-away-{i}")).await;
    }
    for i in 0..30 {
        assert_eq!(
            app.delete(&format!("/keys/while-away-{i}")).await.status,
            204
        );
    }
    app.allocate("after").await;
    let started = Instant::now();
    loop {
        let page = app.get(&format!("/events?after={position}")).await;
        if page.status == 410 {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "never compacted: {}",
            page.body
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // Back on the mirror's address: its next poll is below the horizon (410), so it takes a
    // new snapshot instead of skipping what it missed.
    app.config.listen = address;
    let app = app.restart().await;
    let want = looked_up(&app, "after").await;
    let started = Instant::now();
    while mirror.keys("after").ok().flatten().map(|k| k.to_vec()) != want {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "not caught up: {:?}",
            mirror.lag()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        mirror.snapshots(),
        2,
        "one snapshot at start, one after the 410"
    );
    assert_eq!(
        mirror.keys("while-away-3").unwrap(),
        None,
        "released while away"
    );
    assert!(mirror.keys("first").unwrap().is_some());
}
