//! A log has a name: every snapshot and page of events says which log its positions belong
//! to, a position past the log's end is 410, and a replica that finds the database holding
//! another log (or its own rewound) reads its table again instead of following on.

use std::time::{Duration, Instant};

use serde_json::Value;

use crate::helpers::{Answer, Db, TestApp, answer, assert_problem, spawn_app, spawn_app_with};
use crate::process::Server;

/// The `X-Keyspread-Log` header of `response`.
fn log_header(response: &reqwest::Response) -> String {
    let header = response.headers().get("x-keyspread-log");
    let header = header.unwrap_or_else(|| panic!("no X-Keyspread-Log: {response:?}"));
    header.to_str().unwrap().to_owned()
}

/// `GET {path}` of `app`: its `X-Keyspread-Log` header and the answer.
async fn named(app: &TestApp, path: &str) -> (String, Answer) {
    let response = app.client.get(app.url(path)).send().await.unwrap();
    (log_header(&response), answer(response).await)
}

/// The snapshot's head line and its `X-Keyspread-Log` header.
async fn snapshot_head(app: &TestApp) -> (Value, String) {
    let response = app.client.get(app.url("/snapshot")).send().await.unwrap();
    assert_eq!(response.status(), 200);
    let log = log_header(&response);
    let text = response.text().await.unwrap();
    let head = serde_json::from_str(text.lines().next().unwrap()).unwrap();
    (head, log)
}

/// The log's name as the database stores it.
async fn stored_log_id(db: &mut Db) -> String {
    const SQL: &str = "SELECT value FROM meta WHERE name = 'log_id'";
    match db {
        Db::Sqlite(c) => sqlx::query_scalar(SQL).fetch_one(c).await.unwrap(),
        Db::Postgres(c) => sqlx::query_scalar(SQL).fetch_one(c).await.unwrap(),
    }
}

fn is_uuid(text: &str) -> bool {
    uuid::Uuid::parse_str(text).is_ok_and(|u| u.hyphenated().to_string() == text)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_snapshot_and_page_of_events_names_the_log_it_belongs_to() {
    let app = spawn_app().await;
    app.allocate("acme").await;
    let log = stored_log_id(&mut app.db().await).await;
    assert!(is_uuid(&log), "{log}");

    let (head, header) = snapshot_head(&app).await;
    assert_eq!(head["log_id"], log.as_str(), "{head}");
    assert_eq!(header, log);

    let (header, page) = named(&app, "/events?after=0").await;
    assert_eq!(page.status, 200, "{}", page.body);
    assert_eq!(
        (header.as_str(), page.body["log_id"].as_str()),
        (log.as_str(), Some(log.as_str()))
    );
    // An empty page after a long-poll's wait names it too.
    let end = page.body["next"].as_i64().unwrap();
    let (header, page) = named(&app, &format!("/events?after={end}&wait_s=1")).await;
    assert_eq!(page.status, 200, "{}", page.body);
    assert_eq!(page.body["events"], Value::Array(vec![]), "{}", page.body);
    assert_eq!(
        (header.as_str(), page.body["log_id"].as_str()),
        (log.as_str(), Some(log.as_str()))
    );

    // Another database is another log.
    let other = spawn_app().await;
    let (head, _) = snapshot_head(&other).await;
    assert!(is_uuid(head["log_id"].as_str().unwrap()), "{head}");
    assert_ne!(head["log_id"], log.as_str());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_position_past_the_logs_end_is_410_with_the_log_and_its_end() {
    let app = spawn_app().await;
    for account in ["a", "b", "c"] {
        app.allocate(account).await;
    }
    let mut db = app.db().await;
    let (log, end) = (stored_log_id(&mut db).await, db.last_event_id().await);

    let (header, page) = named(&app, &format!("/events?after={end}")).await;
    assert_eq!(
        (page.status, page.body["next"].as_i64()),
        (200, Some(end)),
        "{}",
        page.body
    );
    assert_eq!(header, log);

    // Past the end, long-poll or not: answered at once.
    for wait in ["", "&wait_s=30"] {
        let started = Instant::now();
        let path = format!("/events?after={}{wait}", end + 1);
        let (header, gone) = named(&app, &path).await;
        assert_problem(&gone, 410, "past the end");
        let body = &gone.body;
        assert_eq!(body["type"], "urn:keyspread:problem:past-end", "{body}");
        assert_eq!(
            (body["log_id"].as_str(), body["end"].as_i64()),
            (Some(log.as_str()), Some(end))
        );
        assert_eq!(header, log);
        assert!(started.elapsed() < Duration::from_secs(5), "{path}");
    }

    // The database decides the end, not what this replica applied: an event logged behind
    // its back is within the log before its follower has read it.
    db.log_allocation("elsewhere", 7).await;
    let (_, page) = named(&app, &format!("/events?after={}", end + 1)).await;
    assert_eq!(page.status, 200, "{}", page.body);
}

/// Polls `check` every 50 ms until it answers true, for at most 10 s.
async fn within_10_s<F: Future<Output = bool>>(what: &str, mut check: impl FnMut() -> F) {
    let started = Instant::now();
    while !check().await {
        assert!(started.elapsed() < Duration::from_secs(10), "{what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// `status` of `GET /keys/{account}` on `app`.
async fn lookup(app: &TestApp, account: &str) -> u16 {
    app.get(&format!("/keys/{account}")).await.status
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_that_finds_another_log_in_its_database_reads_its_table_again() {
    let app = spawn_app().await;
    let old_key = app.allocate("old").await;
    let mut db = app.db().await;
    // Another database restored in its place, at once: other rows, another log.
    db.hold_write_lock().await;
    db.delete_assignment("old").await;
    db.execute("DELETE FROM events", &[]).await;
    db.log_allocation("restored", old_key.parse().unwrap())
        .await;
    let other = uuid::Uuid::new_v4().to_string();
    db.execute(
        "UPDATE meta SET value = $1 WHERE name = 'log_id'",
        &[&other],
    )
    .await;
    db.commit().await;

    within_10_s("the replica answers the other log's table", || async {
        lookup(&app, "restored").await == 200 && lookup(&app, "old").await == 404
    })
    .await;
    assert_eq!(app.metric("keyspread_table_reloads_total").await, 1.0);
    let (header, page) = named(&app, "/events?after=0").await;
    assert_eq!(
        (header.as_str(), page.body["log_id"].as_str()),
        (other.as_str(), Some(other.as_str()))
    );
    // It follows the other log on.
    app.allocate("after").await;
    assert_eq!(lookup(&app, "after").await, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_that_find_their_log_rewound_name_it_anew_and_read_their_table_again() {
    let first = spawn_app().await;
    let url = first.config.database_url.clone();
    let second = spawn_app_with(move |c| c.database_url = url).await;
    for account in ["a", "b", "c"] {
        first.allocate(account).await;
    }
    within_10_s("the second replica follows", || async {
        lookup(&second, "c").await == 200
    })
    .await;
    let mut db = first.db().await;
    let (log, end) = (stored_log_id(&mut db).await, db.last_event_id().await);

    // The database as it was before c: a point-in-time restore, or an older copy.
    db.hold_write_lock().await;
    db.delete_assignment("c").await;
    db.execute(&format!("DELETE FROM events WHERE id = {end}"), &[])
        .await;
    db.commit().await;
    within_10_s("both replicas read the rewound table", || async {
        lookup(&first, "c").await == 404 && lookup(&second, "c").await == 404
    })
    .await;
    let renamed = stored_log_id(&mut db).await;
    assert_ne!(renamed, log, "a rewound log is another log");
    for app in [&first, &second] {
        let (header, page) = named(app, "/events?after=0").await;
        assert_eq!(page.status, 200, "{}", page.body);
        assert_eq!(
            (header.as_str(), page.body["log_id"].as_str()),
            (renamed.as_str(), Some(renamed.as_str()))
        );
        assert_eq!(app.metric("keyspread_table_reloads_total").await, 1.0);
        // A reader that applied the lost event is past the end.
        let (_, gone) = named(app, &format!("/events?after={end}")).await;
        assert_eq!(
            (gone.status, gone.body["end"].as_i64()),
            (410, Some(end - 1)),
            "{}",
            gone.body
        );
    }
    assert_eq!(stored_log_id(&mut db).await, renamed, "named anew once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_that_finds_its_log_rewound_decides_on_the_table_the_database_holds() {
    use keyspread::keyspace::{AccountId, Keyspace};
    use keyspread::registry::{Allocated, Registry};
    use keyspread::store::{Actor, Store};

    let dir = tempfile::tempdir().unwrap();
    let (url, _postgres) = crate::helpers::fresh_database(dir.path()).await;
    let store = Store::connect(&url).await.unwrap();
    // No follower: only the writer can notice.
    let registry = Registry::open(store, Keyspace::new(128).unwrap(), None)
        .await
        .unwrap();
    let allocate = |account: &'static str| {
        let registry = registry.clone();
        async move {
            let account = AccountId::parse(account).unwrap();
            let unbounded = keyspread::registry::Ticket::unbounded();
            match registry
                .allocate(account, 1, 1, &Actor::loopback(), &unbounded)
                .await
            {
                Ok(Allocated::Created(a)) => a.hash_key(),
                other => panic!("{other:?}"),
            }
        }
    };
    allocate("a").await;
    allocate("b").await;
    let lost = allocate("c").await;
    let mut db = Db::connect(&url).await;
    let (log, end) = (stored_log_id(&mut db).await, db.last_event_id().await);
    db.delete_assignment("c").await;
    db.execute(&format!("DELETE FROM events WHERE id = {end}"), &[])
        .await;

    // The walk picks the key the rewound table has free, not the one memory had.
    assert_eq!(allocate("d").await, lost);
    assert!(
        registry.lookup("c").is_none(),
        "c is not in the database's log"
    );
    assert_ne!(stored_log_id(&mut db).await, log);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_older_copy_of_a_sqlite_file_is_a_new_log() {
    if !crate::skip::sqlite_only("an_older_copy_of_a_sqlite_file_is_a_new_log") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("keyspread.db");
    let url = format!("sqlite://{}", file.display());
    let log_file = dir.path().join("server.log");
    let client = reqwest::Client::new();
    let allocate = |server: &Server, account: String| {
        let request = client.post(format!("{}/keys/{account}", server.url));
        async move { assert_eq!(request.send().await.unwrap().status(), 201) }
    };
    let page = |server: &Server, after: i64| {
        let request = client.get(format!("{}/events?after={after}", server.url));
        async move { answer(request.send().await.unwrap()).await }
    };

    let mut server = Server::spawn(&url, &log_file);
    server.wait_ready(&client).await;
    for i in 0..3 {
        allocate(&server, format!("before-{i}")).await;
    }
    server.kill();
    let copy = dir.path().join("copy");
    std::fs::create_dir(&copy).unwrap();
    let files = ["keyspread.db", "keyspread.db-wal"];
    for name in files.iter().filter(|n| dir.path().join(n).exists()) {
        std::fs::copy(dir.path().join(name), copy.join(name)).unwrap();
    }

    let mut server = Server::spawn(&url, &log_file);
    server.wait_ready(&client).await;
    for i in 0..3 {
        allocate(&server, format!("after-{i}")).await;
    }
    let served = page(&server, 0).await.body;
    let (log, end) = (served["log_id"].clone(), served["next"].as_i64().unwrap());
    // The newest event served reaches the lineage within a few milliseconds.
    tokio::time::sleep(Duration::from_millis(300)).await;
    server.kill();
    for name in ["keyspread.db", "keyspread.db-wal", "keyspread.db-shm"] {
        let _ = std::fs::remove_file(dir.path().join(name));
    }
    for name in files.iter().filter(|n| copy.join(n).exists()) {
        std::fs::copy(copy.join(name), dir.path().join(name)).unwrap();
    }

    let mut server = Server::spawn(&url, &log_file);
    server.wait_ready(&client).await;
    let restored = page(&server, 0).await.body;
    assert_ne!(restored["log_id"], log, "{}", server.log_text());
    assert!(restored["next"].as_i64().unwrap() < end, "{restored}");
    assert!(
        server.log_text().contains("older copy of the file"),
        "{}",
        server.log_text()
    );
    let gone = page(&server, end).await;
    assert_eq!(
        (gone.status, &gone.body["type"]),
        (410, &Value::from("urn:keyspread:problem:past-end"))
    );
}
