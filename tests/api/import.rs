//! `keyspread import`: an existing table moved in, keys kept, bad rows named.

use std::time::{Duration, Instant};

use crate::helpers::{TestApp, spawn_app};

/// Runs `keyspread import` on `csv` against `app`'s database.
async fn import(app: &TestApp, csv: &str) -> std::process::Output {
    let file = app.dir().join("table.csv");
    std::fs::write(&file, csv).unwrap();
    // The server runs on this test's runtime: wait for the command without blocking it.
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_keyspread"))
        .args([
            "import",
            file.to_str().unwrap(),
            "--database-url",
            &app.config.database_url,
        ])
        .output()
        .await
        .unwrap();
    caught_up(app).await;
    out
}

/// Waits until the running server has applied every event the database holds: an import
/// commits several transactions (keyed rows' other keys come in the last), and the server
/// follows them one poll at a time.
pub async fn caught_up(app: &TestApp) {
    let logged = app.db().await.last_event_id().await;
    let started = Instant::now();
    loop {
        let metrics = app.client.get(app.url("/metrics")).send().await.unwrap();
        let text = metrics.text().await.unwrap();
        let applied: i64 = text
            .lines()
            .find_map(|l| l.strip_prefix("keyspread_event_applied_id "))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(-1);
        if applied >= logged {
            return;
        }
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "the server applied events to {applied}, the log holds {logged}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits until the running server answers `account`, as it follows the event log.
async fn imported(app: &TestApp, account: &str) -> serde_json::Value {
    let started = Instant::now();
    loop {
        let answer = app.get(&format!("/keys/{account}")).await;
        if answer.status == 200 {
            return answer.body;
        }
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "the server never saw {account} imported"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn import_keeps_existing_keys_and_names_bad_rows() {
    let app = spawn_app().await;
    app.allocate("old").await;
    let half = 1u128 << 127;
    let csv = format!(
        "account,weight,hash_key\n\
         a,2\n\
         b,,{}\n\
         \"c, with a comma\",1,5\n\
         old,1\n\
         a,1\n\
         d,0\n\
         e,1,0x10\n\
         f,1,5\n\
         g,1,{half}\n",
        half + 1
    );
    let out = import(&app, &csv).await;
    let report = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "refused rows make the command fail: {report}"
    );
    assert!(report.contains("9 rows in"), "{report}");
    assert!(report.contains("1 new keys from the walk, 2 existing keys kept, 1 accounts already present, 5 rows refused"), "{report}");
    for expected in [
        "line 6: account a appears twice in the file",
        "line 7: weight must be between 1 and 1000000",
        "line 8: hash key must be a decimal integer",
        "line 9: hash key 5 appears twice in the file",
        "line 10: hash key 170141183460469231731687303715884105728 is already held",
    ] {
        assert!(
            report.contains(expected),
            "missing {expected:?} in {report}"
        );
    }
    // The running server follows the event log and answers the imported accounts.
    assert_eq!(
        imported(&app, "b").await["hash_key"],
        (half + 1).to_string()
    );
    assert_eq!(
        imported(&app, "c,%20with%20a%20comma").await["hash_key"],
        "5"
    );
    // Keyless rows are committed after the keyed ones: followed a moment later.
    assert_eq!(imported(&app, "a").await["weight"], 2);
    assert_eq!(app.get("/keys/g").await.status, 404);
}

/// Rows that bring a key are placed before the walk picks for the others, so a keyless row
/// never takes a key that a later row of the file brings (2^127 is the walk's first pick).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keyless_row_never_takes_a_key_a_later_row_brings() {
    let first_pick = (1u128 << 127).to_string();
    for csv in [
        format!("a,1\nb,1,{first_pick}\n"),
        format!("b,1,{first_pick}\na,1\n"),
    ] {
        let app = spawn_app().await;
        let out = import(&app, &csv).await;
        let report = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{csv:?}: {stderr}");
        assert!(
            report.contains("1 new keys from the walk, 1 existing keys kept, 0 accounts already present, 0 rows refused"),
            "{csv:?}: {report}"
        );
        assert_eq!(imported(&app, "b").await["hash_key"], first_pick, "{csv:?}");
        assert_ne!(imported(&app, "a").await["hash_key"], first_pick, "{csv:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn import_takes_a_fanout_column() {
    let app = spawn_app().await;
    let key = (1u128 << 127) + 12345;
    let csv = format!(
        "account,weight,hash_key,fanout\n\
         hot,10,,4\n\
         keyed,6,{key},3\n\
         plain,2\n\
         light,2,,3\n"
    );
    let out = import(&app, &csv).await;
    let report = String::from_utf8_lossy(&out.stderr);
    assert!(
        report.contains("line 5: weight 2 is below fanout 3"),
        "{report}"
    );
    let hot = imported(&app, "hot").await;
    assert_eq!(
        (&hot["fanout"], &hot["weight"]),
        (&4.into(), &10.into()),
        "{hot}"
    );
    assert_eq!(hot["hash_keys"].as_array().unwrap().len(), 4);
    let keyed = imported(&app, "keyed").await;
    assert_eq!(keyed["fanout"], 3, "{keyed}");
    assert_eq!(
        keyed["hash_keys"][0],
        key.to_string(),
        "key 0 is the row's own"
    );
    // Without a primary stream, keys 0 and 1 lie in distinct halves, 2 in a third quarter.
    let quarters: Vec<u128> = keyed["hash_keys"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| k.as_str().unwrap().parse::<u128>().unwrap() >> 126)
        .collect();
    assert_ne!(quarters[0] >> 1, quarters[1] >> 1, "{quarters:?}");
    assert!(!quarters[..2].contains(&quarters[2]), "{quarters:?}");
    assert_eq!(imported(&app, "plain").await["fanout"], 1);
}

/// An empty file, or one of blank lines or a header alone, is an error that says so, and
/// an empty one is refused before a SQLite database is created.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_import_of_no_rows_is_an_error() {
    let app = spawn_app().await;
    for (csv, says) in [
        ("", "is empty: nothing to import"),
        ("\n \n\r\n", "is empty: nothing to import"),
        ("account,weight,hash_key\n", "the file holds no rows"),
    ] {
        let out = import(&app, csv).await;
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{csv:?}: {stderr}");
        assert!(stderr.contains(says), "{csv:?}: {stderr}");
    }
    let dir = tempfile::tempdir().unwrap();
    let (file, db) = (dir.path().join("empty.csv"), dir.path().join("new.db"));
    std::fs::write(&file, "").unwrap();
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_keyspread"))
        .args(["import", file.to_str().unwrap(), "--database-url"])
        .arg(format!("sqlite://{}", db.display()))
        .output()
        .await
        .unwrap();
    assert!(!out.status.success());
    assert!(!db.exists(), "no database made for an empty file");
}
