//! The snapshot is also the backup: `keyspread export` writes it (from a running server or
//! straight from the database, byte for byte the same), and `keyspread import` takes it
//! back with every key of every account by index and every pending switch with its time.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use reqwest::Method;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt};

use crate::helpers::{PgDatabase, TestApp, spawn_app, spawn_app_with};

/// Runs the keyspread binary with `args`, waiting without blocking the test's runtime.
pub(crate) async fn keyspread(args: &[&str]) -> std::process::Output {
    tokio::process::Command::new(env!("CARGO_BIN_EXE_keyspread"))
        .args(args)
        .env_remove("DATABASE_URL")
        .env_remove("KEYSPREAD_EXPORT_FROM")
        .output()
        .await
        .unwrap()
}

/// `keyspread export` of `app`, through its server and from its database: both files,
/// asserted identical byte for byte.
async fn export_both_ways(app: &TestApp, dir: &Path, name: &str) -> Vec<u8> {
    let served = dir.join(format!("{name}-served.ndjson"));
    let read = dir.join(format!("{name}-read.ndjson"));
    let from = app.url("");
    let out = keyspread(&["export", "--from", &from, "--output", path(&served)]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stderr(&out).contains("exported"), "{}", stderr(&out));
    let url = &app.config.database_url;
    let out = keyspread(&["export", "--database-url", url, "--output", path(&read)]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    let (served, read) = (
        std::fs::read(&served).unwrap(),
        std::fs::read(&read).unwrap(),
    );
    assert!(
        served == read,
        "{name}: the server's export and the database's differ:\n{}\n---\n{}",
        String::from_utf8_lossy(&served),
        String::from_utf8_lossy(&read)
    );
    served
}

pub(crate) fn path(p: &Path) -> &str {
    p.to_str().unwrap()
}

fn stderr(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// `keyspread import` of `file` into the database at `url`; answers its report.
pub(crate) async fn import(file: &Path, url: &str) -> String {
    let out = keyspread(&["import", path(file), "--database-url", url]).await;
    let report = String::from_utf8_lossy(&out.stdout).into_owned() + &stderr(&out);
    assert!(out.status.success(), "{report}");
    assert!(report.contains(" 0 lines refused"), "{report}");
    report
}

/// A snapshot's head and its lines by account.
fn lines_of(snapshot: &[u8]) -> (Value, BTreeMap<String, Value>) {
    let text = std::str::from_utf8(snapshot).unwrap();
    let mut lines = text
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap());
    let head = lines.next().unwrap();
    let by_account = lines
        .map(|l| (l["account"].as_str().unwrap().to_owned(), l))
        .collect::<BTreeMap<_, _>>();
    assert_eq!(head["accounts"], by_account.len(), "{head}");
    (head, by_account)
}

/// Every `GET /keys/{account}` answer of `accounts`.
async fn lookups(app: &TestApp, accounts: impl Iterator<Item = &String>) -> Vec<Value> {
    let mut answers = Vec::new();
    for account in accounts {
        let answer = app.get(&format!("/keys/{account}")).await;
        assert_eq!(answer.status, 200, "{account}: {}", answer.body);
        answers.push(answer.body);
    }
    answers
}

/// `GET /moves`, each move without the event that applied it (ids, times and actor of an
/// import).
async fn pending_moves(app: &TestApp) -> Vec<Value> {
    let page = app.get("/moves?limit=1000").await;
    assert_eq!(page.status, 200, "{}", page.body);
    let mut moves: Vec<Value> = (page.body["items"].as_array().unwrap().iter())
        .map(|m| {
            let mut m = m.clone();
            let fields = m.as_object_mut().unwrap();
            fields.remove("event_id");
            fields.remove("applied_at");
            fields.remove("applied_by");
            m
        })
        .collect();
    moves.sort_by_key(|m| (m["account"].to_string(), m["index"].as_u64()));
    moves
}

/// A server on the database at `url` (a SQLite file or a Postgres database).
async fn serve(url: &str) -> TestApp {
    let url = url.to_owned();
    spawn_app_with(move |c| c.database_url = url).await
}

fn sqlite_in(dir: &Path, name: &str) -> String {
    format!("sqlite://{}", dir.join(name).display())
}

/// Plain accounts, accounts on 3 and 16 keys heavier than their fanout (one with a cap on
/// its fanout), and staged moves (some of a fanned-out account's keys) a rebalance left
/// pending for an hour.
async fn table(app: &TestApp) {
    crate::fanout::primary_stream(app, "s", 2).await;
    for i in 0..20 {
        app.allocate(&format!("plain-{i:02}")).await;
    }
    for (account, fanout, weight) in [("hot-3", 3, 7), ("hot-16", 16, 40), ("warm-3", 3, 3)] {
        let body = json!({"fanout": fanout, "weight": weight});
        let made = app.post(&format!("/keys/{account}"), Some(body)).await;
        assert_eq!(made.status, 201, "{}", made.body);
    }
    let capped = (app.call(Method::PATCH, "/keys/hot-3", Some(json!({"max_fanout": 8})))).await;
    assert_eq!(capped.status, 200, "{}", capped.body);
    // The stream doubles: the plan spreads the fanned-out accounts' keys over 4 shards.
    let put = app
        .call(
            Method::PUT,
            "/streams/s",
            Some(json!({"shard_count": 4, "primary": true})),
        )
        .await;
    assert_eq!(put.status, 200, "{}", put.body);
    let preview = app.get("/rebalance/preview?stream=s").await;
    assert_eq!(preview.status, 200, "{}", preview.body);
    let body = json!({"plan_id": preview.body["plan_id"], "switch_after_s": 3600});
    let applied = app.post("/rebalance", Some(body)).await;
    assert_eq!(applied.status, 200, "{}", applied.body);
    assert!(!applied.body["moves"].as_array().unwrap().is_empty());
}

/// Writes the export, imports it into `to`, serves it, and checks that the server answers
/// every account and every pending move as `from` does; answers the server.
async fn hop(from: &TestApp, snapshot: &[u8], dir: &Path, to: &str) -> TestApp {
    let file = dir.join(format!("hop-{}.ndjson", crate::helpers::backend(to)));
    std::fs::write(&file, snapshot).unwrap();
    let report = import(&file, to).await;
    let (_, lines) = lines_of(snapshot);
    let pending = lines.values().filter(|l| l["next"].is_object()).count();
    assert!(pending > 0, "the table has pending moves");
    assert!(report.contains("pending switches kept"), "{report}");
    let target = serve(to).await;
    let (want, got) = (
        lookups(from, lines.keys()).await,
        lookups(&target, lines.keys()).await,
    );
    for (want, got) in want.iter().zip(&got) {
        assert_eq!(want, got, "GET /keys on {to} answers as on the source");
    }
    assert_eq!(pending_moves(from).await, pending_moves(&target).await);
    target
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_table_moves_from_sqlite_to_postgres_and_back_with_every_key() {
    let dir = tempfile::tempdir().unwrap();
    let source = serve(&sqlite_in(dir.path(), "source.db")).await;
    table(&source).await;
    let first = export_both_ways(&source, dir.path(), "sqlite").await;
    let (_, lines) = lines_of(&first);
    assert_eq!(lines["hot-16"]["hash_keys"].as_array().unwrap().len(), 16);
    assert_eq!(lines["hot-3"]["max_fanout"], 8);
    let next = &lines["hot-16"]["next"];
    assert_eq!(next["hash_keys"].as_array().unwrap().len(), 16, "{next}");

    // Into Postgres when there is one (else a second SQLite file: the same path, and the
    // Postgres half recorded as not run).
    let postgres =
        crate::skip::postgres_only("a_table_moves_from_sqlite_to_postgres_and_back_with_every_key");
    let middle_db = match &postgres {
        Some(server) => Some(PgDatabase::create(server).await),
        None => None,
    };
    let middle_url = match &middle_db {
        Some(db) => db.url.clone(),
        None => sqlite_in(dir.path(), "middle.db"),
    };
    let middle = hop(&source, &first, dir.path(), &middle_url).await;
    let second = export_both_ways(&middle, dir.path(), "middle").await;
    assert_eq!(
        lines_of(&second).1,
        lines,
        "the same lines, created_at included"
    );

    // And back into a fresh SQLite file.
    let last = hop(
        &source,
        &second,
        dir.path(),
        &sqlite_in(dir.path(), "back.db"),
    )
    .await;
    let third = export_both_ways(&last, dir.path(), "back").await;
    assert_eq!(lines_of(&third).1, lines);
    println!(
        "{} accounts, {} with a pending switch, through {}",
        lines.len(),
        lines.values().filter(|l| l["next"].is_object()).count(),
        crate::helpers::backend(&middle_url)
    );
}

/// A snapshot line, as `GET /snapshot` writes one.
pub(crate) fn line(
    account: &str,
    weight: u64,
    keys: &[u128],
    next: Option<(&[u128], &str)>,
) -> String {
    let strings = |keys: &[u128]| keys.iter().map(u128::to_string).collect::<Vec<_>>();
    let mut line = json!({
        "account": account, "hash_key": keys[0].to_string(), "hash_keys": strings(keys),
        "fanout": keys.len(), "weight": weight, "created_at": "2026-01-01T00:00:00Z",
    });
    if let Some((next, switch_at)) = next {
        line["next"] = json!({"hash_key": next[0].to_string(), "hash_keys": strings(next), "switch_at": switch_at});
    }
    line.to_string() + "\n"
}

/// The instant `secs` from now, as a snapshot writes a `switch_at` (RFC 3339, UTC, three
/// digits of fraction).
pub(crate) fn from_now(secs: i64) -> String {
    let format = time::macros::format_description!(
        "[year]-[month]-[day]T[hour]:[minute]:[second].[subsecond digits:3]Z"
    );
    (time::OffsetDateTime::now_utc() + time::Duration::seconds(secs))
        .format(&format)
        .unwrap()
}

pub(crate) fn snapshot_file(dir: &Path, lines: &[String]) -> PathBuf {
    let head = json!({"event_id": 42, "accounts": lines.len(), "max_age_s": 60});
    let file = dir.join("hand.ndjson");
    std::fs::write(&file, head.to_string() + "\n" + &lines.concat()).unwrap();
    file
}

/// A key a raised fanout adds waits for its switch; a switch whose time has passed is
/// simply the new keys.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn new_keys_wait_for_their_switch_and_past_switches_are_the_new_keys() {
    let dir = tempfile::tempdir().unwrap();
    let half = 1u128 << 127;
    let ahead = from_now(3600);
    let file = snapshot_file(
        dir.path(),
        &[
            line("growing", 4, &[half], Some((&[half, half + 1], &ahead))),
            line(
                "switched",
                1,
                &[5],
                Some((&[6], "2020-01-01T00:00:00.000Z")),
            ),
        ],
    );
    let app = spawn_app().await;
    let out = keyspread(&[
        "import",
        path(&file),
        "--database-url",
        &app.config.database_url,
    ])
    .await;
    assert!(out.status.success(), "{}", stderr(&out));
    crate::import::caught_up(&app).await;
    let growing = app.get("/keys/growing").await.body;
    assert_eq!(growing["hash_keys"], json!([half.to_string()]), "{growing}");
    assert_eq!(
        growing["next"]["hash_keys"],
        json!([half.to_string(), (half + 1).to_string()])
    );
    assert_eq!(growing["next"]["switch_at"], ahead);
    let moves = pending_moves(&app).await;
    assert_eq!(moves.len(), 1, "{moves:?}");
    assert_eq!(
        (&moves[0]["index"], &moves[0]["to"]),
        (&json!(1), &json!((half + 1).to_string()))
    );
    let switched = app.get("/keys/switched").await.body;
    assert_eq!(switched["hash_keys"], json!(["6"]), "{switched}");
    assert!(switched.get("next").is_none(), "{switched}");
}

/// Every refused line is named with its number, and then nothing is written; a file
/// that conflicts with nothing goes into a database that already holds accounts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn import_refuses_bad_lines_by_number_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let app = spawn_app().await;
    let held = app.allocate("held").await.parse::<u128>().unwrap();
    let bad = [
        line("a", 1, &[10], None),
        "{\"account\": \"b\", \"hash_key\": \n".to_owned(),
        line("c", 1, &[u128::MAX], None),
        line("d", 2, &[11, 10], None),
        line("held", 1, &[12], None),
        line("e", 1, &[held], None),
    ];
    let file = snapshot_file(dir.path(), &bad);
    let out = keyspread(&[
        "import",
        path(&file),
        "--database-url",
        &app.config.database_url,
    ])
    .await;
    let report = String::from_utf8_lossy(&out.stdout).into_owned() + &stderr(&out);
    assert!(!out.status.success(), "{report}");
    for expected in [
        "line 3: not an assignment",
        "line 5: hash key 10 is also on line 2",
        "line 6: account held is already in the database with other keys",
        &format!("line 7: hash key {held} is already held in the database by another account"),
        "nothing was written",
    ] {
        assert!(
            report.contains(expected),
            "missing {expected:?} in {report}"
        );
    }
    let out = keyspread(&[
        "import",
        path(&file),
        "--database-url",
        &sqlite_in(dir.path(), "narrow.db"),
        "--keyspace-bits",
        "64",
    ])
    .await;
    assert!(
        stderr(&out).contains(
            "line 4: hash key 340282366920938463463374607431768211455 is outside the keyspace"
        ),
        "{}",
        stderr(&out)
    );
    assert_eq!(app.get("/keys/a").await.status, 404, "nothing was written");

    // Cut short: the head announces more lines than follow.
    let mut cut = std::fs::read_to_string(snapshot_file(dir.path(), &bad[..1])).unwrap();
    cut = cut.replace("\"accounts\":1", "\"accounts\":2");
    std::fs::write(&file, cut).unwrap();
    let out = keyspread(&[
        "import",
        path(&file),
        "--database-url",
        &app.config.database_url,
    ])
    .await;
    assert!(
        stderr(&out).contains("line 1: announces 2 accounts but 1 lines follow"),
        "{}",
        stderr(&out)
    );

    // Without conflicts it goes in beside what is there, and the running server, which
    // follows the log, answers it.
    let good = [
        line("a", 1, &[10], Some((&[20], &from_now(86_000)))),
        line("b", 1, &[11], None),
    ];
    import(&snapshot_file(dir.path(), &good), &app.config.database_url).await;
    crate::import::caught_up(&app).await;
    let a = app.get("/keys/a").await.body;
    assert_eq!(
        (&a["hash_key"], &a["next"]["hash_key"]),
        (&json!("10"), &json!("20")),
        "{a}"
    );
    assert_eq!(
        app.get("/keys/held").await.body["hash_key"],
        held.to_string()
    );
    // Imported again, every account is already there just so: nothing changes; a file
    // that holds them and more (an import stopped midway, run again) adds the rest.
    let report = import(&snapshot_file(dir.path(), &good), &app.config.database_url).await;
    assert!(
        report.contains("0 written with 0 keys (0 pending switches kept), 2 already present"),
        "{report}"
    );
    let more = [
        good[0].clone(),
        good[1].clone(),
        line("c", 3, &[30, 31], None),
    ];
    let report = import(&snapshot_file(dir.path(), &more), &app.config.database_url).await;
    assert!(
        report.contains("1 written with 2 keys (0 pending switches kept), 2 already present"),
        "{report}"
    );
}

/// A pending switch further ahead than any the server stages (`switch_after_s` at most a
/// day from the import's time) is refused with the line it is on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_switch_further_ahead_than_the_server_allows_is_refused_by_line() {
    let dir = tempfile::tempdir().unwrap();
    let app = spawn_app().await;
    let lines = [
        line("near", 1, &[10], Some((&[20], &from_now(86_000)))),
        line("far", 1, &[11], Some((&[21], &from_now(86_400 + 600)))),
    ];
    let out = keyspread(&[
        "import",
        path(&snapshot_file(dir.path(), &lines)),
        "--database-url",
        &app.config.database_url,
    ])
    .await;
    let report = String::from_utf8_lossy(&out.stdout).into_owned() + &stderr(&out);
    assert!(!out.status.success(), "{report}");
    assert!(
        report.contains("line 3: switch_at is 87000 s after the import's time; a switch is at most 86400 s ahead")
            || report.contains("line 3: switch_at is 86999 s after"),
        "{report}"
    );
    assert!(!report.contains("line 2"), "{report}");
    assert_eq!(
        app.get("/keys/near").await.status,
        404,
        "nothing was written"
    );
}

/// A server that answers `GET /snapshot` with `first`, then waits for `go` before it sends
/// `rest` (or closes the connection when `rest` is `None`).
async fn stalling_server(
    first: Vec<u8>,
    rest: Option<Vec<u8>>,
    go: tokio::sync::oneshot::Receiver<()>,
) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move {
        let (mut socket, _) = listener.accept().await.unwrap();
        let mut request = [0u8; 4096];
        let _ = socket.read(&mut request).await.unwrap();
        let chunk = |bytes: &[u8]| {
            [
                format!("{:x}\r\n", bytes.len()).into_bytes(),
                bytes.to_vec(),
                b"\r\n".to_vec(),
            ]
            .concat()
        };
        let head = "HTTP/1.1 200 OK\r\nContent-Type: application/x-ndjson\r\nTransfer-Encoding: chunked\r\n\r\n";
        socket.write_all(head.as_bytes()).await.unwrap();
        socket.write_all(&chunk(&first)).await.unwrap();
        let _ = go.await;
        if let Some(rest) = rest {
            socket.write_all(&chunk(&rest)).await.unwrap();
            socket.write_all(b"0\r\n\r\n").await.unwrap();
        }
    });
    url
}

/// A 1,000-account export is written as it arrives: the first half is out before the
/// server sends the second. One cut short fails and leaves no file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_export_streams_and_one_cut_short_fails() {
    let dir = tempfile::tempdir().unwrap();
    let app = spawn_app().await;
    let accounts: Vec<Value> = (0..1000)
        .map(|i| json!({"account": format!("a-{i:04}")}))
        .collect();
    let batch = app
        .post("/keys/batch", Some(json!({"accounts": accounts})))
        .await;
    assert_eq!(batch.status, 200, "{}", batch.body);
    let whole = app.client.get(app.url("/snapshot")).send().await.unwrap();
    let whole = whole.bytes().await.unwrap().to_vec();
    let half_end = whole
        .iter()
        .enumerate()
        .filter(|(_, b)| **b == b'\n')
        .nth(500)
        .unwrap()
        .0
        + 1;
    let (first, rest) = whole.split_at(half_end);

    let (go, wait) = tokio::sync::oneshot::channel();
    let url = stalling_server(first.to_vec(), Some(rest.to_vec()), wait).await;
    let mut export = tokio::process::Command::new(env!("CARGO_BIN_EXE_keyspread"))
        .args(["export", "--from", &url])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut out = tokio::io::BufReader::new(export.stdout.take().unwrap());
    let mut written = Vec::new();
    let mut line = Vec::new();
    // The head and 500 accounts are out while the server holds the rest back.
    while written.len() < first.len() {
        line.clear();
        let read = tokio::time::timeout(Duration::from_secs(20), out.read_until(b'\n', &mut line))
            .await
            .expect("the first half written before the second is sent")
            .unwrap();
        assert!(read > 0, "the export ended early");
        written.extend_from_slice(&line);
    }
    assert_eq!(written, first);
    go.send(()).unwrap();
    out.read_to_end(&mut written).await.unwrap();
    let done = export.wait_with_output().await.unwrap();
    assert!(done.status.success(), "{}", stderr(&done));
    assert!(
        written == whole,
        "the export is the snapshot, byte for byte"
    );

    let (go, wait) = tokio::sync::oneshot::channel();
    let url = stalling_server(first.to_vec(), None, wait).await;
    drop(go);
    let file = dir.path().join("cut.ndjson");
    let out = keyspread(&["export", "--from", &url, "--output", path(&file)]).await;
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("the snapshot was cut short"),
        "{}",
        stderr(&out)
    );
    assert!(!file.exists(), "no file for a snapshot cut short");

    // A database that is not there is not backed up as an empty table.
    let missing = sqlite_in(dir.path(), "missing.db");
    let out = keyspread(&["export", "--database-url", &missing]).await;
    assert!(!out.status.success());
    assert!(stderr(&out).contains("no database at"), "{}", stderr(&out));
    assert!(!dir.path().join("missing.db").exists());
}

/// Runs `keyspread export` of the database at `url` in `dir` with `--output` `to`.
async fn export_to(dir: &Path, url: &str, to: &str) -> std::process::Output {
    tokio::process::Command::new(env!("CARGO_BIN_EXE_keyspread"))
        .args(["export", "--database-url", url, "--output", to])
        .env_remove("DATABASE_URL")
        .env_remove("KEYSPREAD_EXPORT_FROM")
        .current_dir(dir)
        .output()
        .await
        .unwrap()
}

/// The names in `dir`.
fn names_in(dir: &Path) -> std::collections::BTreeSet<String> {
    (std::fs::read_dir(dir).unwrap())
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect()
}

/// `-` is standard output; a regular file is replaced whole, through a link that stays a
/// link, keeping its permissions; files beside it that another program named are left as
/// they are.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn export_replaces_only_the_regular_file_it_names() {
    use std::os::unix::fs::PermissionsExt as _;
    let app = spawn_app().await;
    app.allocate("a").await;
    let url = &app.config.database_url;
    let dir = tempfile::tempdir().unwrap();
    let snapshot = keyspread(&["export", "--database-url", url]).await.stdout;
    assert!(snapshot.starts_with(b"{\"event_id\""), "{snapshot:?}");

    let out = export_to(dir.path(), url, "-").await;
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(out.stdout, snapshot);
    assert!(
        names_in(dir.path()).is_empty(),
        "{:?}",
        names_in(dir.path())
    );

    let real = dir.path().join("real.ndjson");
    std::fs::write(&real, "old").unwrap();
    std::fs::set_permissions(&real, std::fs::Permissions::from_mode(0o640)).unwrap();
    std::os::unix::fs::symlink(&real, dir.path().join("link")).unwrap();
    for theirs in ["link.partial", "real.ndjson.partial"] {
        std::fs::write(dir.path().join(theirs), "theirs").unwrap();
    }
    let before = names_in(dir.path());
    let out = export_to(dir.path(), url, "link").await;
    assert!(out.status.success(), "{}", stderr(&out));
    let link = std::fs::symlink_metadata(dir.path().join("link")).unwrap();
    assert!(link.file_type().is_symlink(), "the link stays a link");
    assert_eq!(std::fs::read(&real).unwrap(), snapshot);
    let mode = std::fs::metadata(&real).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o640, "{mode:o}");
    assert_eq!(
        names_in(dir.path()),
        before,
        "nothing left beside, nothing taken"
    );
    for theirs in ["link.partial", "real.ndjson.partial"] {
        assert_eq!(std::fs::read(dir.path().join(theirs)).unwrap(), b"theirs");
    }
    // A failed export leaves the file as it was.
    let out = export_to(dir.path(), &sqlite_in(dir.path(), "none.db"), "real.ndjson").await;
    assert!(!out.status.success());
    assert_eq!(std::fs::read(&real).unwrap(), snapshot);
    assert_eq!(names_in(dir.path()), before);
}

/// A FIFO is written where it is (a reader drains it), and, as root, so is a character
/// device made for the test (1, 3: what /dev/null is): a rename over it would replace the
/// device with a regular file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn export_writes_a_fifo_and_a_device_in_place() {
    use std::os::unix::fs::FileTypeExt as _;
    let app = spawn_app().await;
    app.allocate("a").await;
    let url = &app.config.database_url;
    let dir = tempfile::tempdir().unwrap();
    let snapshot = keyspread(&["export", "--database-url", url]).await.stdout;

    let fifo = dir.path().join("fifo");
    let made = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap();
    assert!(made.success());
    // The reader opens it by a second name, by which it is released should the export
    // not write it (or replace the name it was given).
    let kept = dir.path().join("fifo-kept");
    std::fs::hard_link(&fifo, &kept).unwrap();
    let reader = std::thread::spawn({
        let kept = kept.clone();
        move || std::fs::read(kept).unwrap()
    });
    let out = export_to(dir.path(), url, "fifo").await;
    use std::os::unix::fs::OpenOptionsExt as _;
    let _ = (std::fs::OpenOptions::new().write(true))
        .custom_flags(libc::O_NONBLOCK)
        .open(&kept);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(reader.join().unwrap(), snapshot);
    assert!(
        std::fs::symlink_metadata(&fifo)
            .unwrap()
            .file_type()
            .is_fifo()
    );

    let uid = std::process::Command::new("id").arg("-u").output().unwrap();
    if String::from_utf8_lossy(&uid.stdout).trim() != "0" {
        crate::skip::skipped(
            "export_writes_a_fifo_and_a_device_in_place",
            "making a character device (mknod) needs root",
        );
        return;
    }
    let device = dir.path().join("null");
    let made = std::process::Command::new("mknod")
        .args([device.to_str().unwrap(), "c", "1", "3"])
        .status()
        .unwrap();
    assert!(made.success(), "mknod");
    let out = export_to(dir.path(), url, "null").await;
    assert!(out.status.success(), "{}", stderr(&out));
    let kind = std::fs::symlink_metadata(&device).unwrap().file_type();
    assert!(kind.is_char_device(), "still a character device: {kind:?}");
    let names: Vec<String> = names_in(dir.path()).into_iter().collect();
    assert_eq!(
        names,
        ["fifo", "fifo-kept", "null"],
        "nothing written beside"
    );
}
