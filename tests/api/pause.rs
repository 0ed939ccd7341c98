//! A replica paused (SIGSTOP: a long stall, a VM frozen) with changes in flight. Whatever it
//! answers when it resumes is the outcome: a change answered 503 or 408 was not made and is
//! never made later, and a lookup is never answered from the table it had before the pause
//! once another replica has changed it.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use reqwest::Method;
use serde_json::{Value, json};

use crate::helpers::{Db, backend, fresh_database};
use crate::process::Server;
use crate::replicas::Api;

/// Longer than the request timeout (10 s): every change in flight is past its deadline when
/// the server resumes.
const PAUSE: Duration = Duration::from_secs(14);

/// Long enough for any answer a paused server owes.
fn patient_client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(60))
        .build()
        .unwrap()
}

/// Status and body of one request; status 0 when no answer came.
async fn send(client: &reqwest::Client, url: String, method: Method, body: Option<Value>) -> u16 {
    let mut request = client.request(method, url);
    if let Some(body) = body {
        request = request.json(&body);
    }
    match request.send().await {
        Ok(response) => response.status().as_u16(),
        Err(_) => 0,
    }
}

/// What one change asked for, and how it was answered.
#[derive(Debug, Clone)]
enum Asked {
    Allocate(String),
    Batch(Vec<String>),
    Release(String),
    Weigh(String, u64),
}

/// Whether the table holds `asked`'s effect.
fn made(asked: &Asked, table: &BTreeMap<String, u64>) -> bool {
    match asked {
        Asked::Allocate(account) => table.contains_key(account),
        Asked::Batch(accounts) => {
            let held = accounts.iter().filter(|a| table.contains_key(*a)).count();
            assert!(
                held == 0 || held == accounts.len(),
                "a batch made in part: {held} of {accounts:?}"
            );
            held > 0
        }
        Asked::Release(account) => !table.contains_key(account),
        Asked::Weigh(account, weight) => table.get(account) == Some(weight),
    }
}

/// Every account in the database and its weight.
async fn table(api: &Api) -> BTreeMap<String, u64> {
    let mut table = BTreeMap::new();
    let mut after = String::new();
    loop {
        let path = match after.as_str() {
            "" => "/keys?limit=1000".to_owned(),
            after => format!("/keys?limit=1000&after={}", urlencode(after)),
        };
        let (status, page) = api.get(0, &path).await;
        assert_eq!(status, 200, "{page}");
        for item in page["items"].as_array().unwrap() {
            table.insert(
                item["account"].as_str().unwrap().to_owned(),
                item["weight"].as_u64().unwrap(),
            );
        }
        match page["next"].as_str() {
            Some(next) => after = next.to_owned(),
            None => return table,
        }
    }
}

fn urlencode(text: &str) -> String {
    text.bytes().map(|b| format!("%{b:02X}")).collect()
}

/// 64 clients send allocations, batches, releases and weight changes (each to accounts no
/// other request touches) through one server; it is paused for 14 s while they are in
/// flight. Every change answered 2xx is in the table afterwards, and every one answered 503
/// or 408 is not: none was committed after its answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changes_refused_around_a_pause_are_never_made() {
    let dir = tempfile::tempdir().unwrap();
    let (url, _postgres) = fresh_database(dir.path()).await;
    let client = patient_client();
    let mut server = Server::spawn(&url, &dir.path().join("server.log"));
    server.wait_ready(&client).await;
    let api = Api::new(client.clone(), vec![server.url.clone()]);
    const CLIENTS: usize = 64;
    const EACH: usize = 400;
    // Accounts to release and to weigh, one per request, allocated first in batches.
    let held: Vec<String> = (0..CLIENTS * EACH).map(|i| format!("held-{i}")).collect();
    for chunk in held.chunks(5000) {
        let accounts: Vec<Value> = chunk.iter().map(|a| json!({"account": a})).collect();
        let (status, body) = api
            .call(
                0,
                Method::POST,
                "/keys/batch",
                Some(json!({"accounts": accounts})),
            )
            .await;
        assert_eq!(status, 200, "{body}");
    }

    let stop = Arc::new(AtomicBool::new(false));
    let mut clients = tokio::task::JoinSet::new();
    for c in 0..CLIENTS {
        let (client, base, stop) = (client.clone(), server.url.clone(), Arc::clone(&stop));
        clients.spawn(async move {
            let mut answered = Vec::new();
            for n in 0..EACH {
                if stop.load(Ordering::SeqCst) {
                    break;
                }
                let i = c * EACH + n;
                let (asked, method, path, body) = match n % 4 {
                    0 => {
                        let account = format!("new-{i}");
                        let path = format!("/keys/{account}");
                        (Asked::Allocate(account), Method::POST, path, None)
                    }
                    1 => {
                        let accounts: Vec<String> =
                            (0..3).map(|k| format!("batch-{i}-{k}")).collect();
                        let items: Vec<Value> =
                            accounts.iter().map(|a| json!({"account": a})).collect();
                        let body = json!({"accounts": items});
                        let path = "/keys/batch".to_owned();
                        (Asked::Batch(accounts), Method::POST, path, Some(body))
                    }
                    2 => {
                        let account = format!("held-{i}");
                        let path = format!("/keys/{account}");
                        (Asked::Release(account), Method::DELETE, path, None)
                    }
                    _ => {
                        let (account, weight) = (format!("held-{i}"), 2 + i as u64);
                        let path = format!("/keys/{account}");
                        let body = json!({"weight": weight});
                        (
                            Asked::Weigh(account, weight),
                            Method::PATCH,
                            path,
                            Some(body),
                        )
                    }
                };
                let sent = Instant::now();
                let status = send(&client, format!("{base}{path}"), method, body).await;
                answered.push((asked, status, sent));
            }
            answered
        });
    }
    // Load flows, then the server stops with changes in flight, and resumes.
    tokio::time::sleep(Duration::from_secs(2)).await;
    server.signal("STOP");
    let resumed = Resume(&server);
    tokio::time::sleep(PAUSE).await;
    drop(resumed);
    let resumed_at = Instant::now();
    tokio::time::sleep(Duration::from_secs(3)).await;
    stop.store(true, Ordering::SeqCst);
    let mut answered = Vec::new();
    while let Some(done) = clients.join_next().await {
        answered.extend(done.unwrap());
    }

    let table = table(&api).await;
    let mut counts: BTreeMap<u16, usize> = BTreeMap::new();
    let mut wrong = Vec::new();
    for (asked, status, sent) in &answered {
        *counts.entry(*status).or_default() += 1;
        let made = made(asked, &table);
        match status {
            200..=299 if !made => wrong.push(format!("answered {status} but not made: {asked:?}")),
            503 | 408 if made => wrong.push(format!("answered {status} but made: {asked:?}")),
            // A request that reached an idle keep-alive connection of the stopped server
            // may be dropped unread when it resumes (its idle timer fires first): no
            // answer, which a client must take as unknown, never as a refusal.
            0 if *sent < resumed_at => {}
            0 => wrong.push(format!("no answer, sent after the pause: {asked:?}")),
            _ => {}
        }
    }
    let refused = counts.get(&503).unwrap_or(&0) + counts.get(&408).unwrap_or(&0);
    println!(
        "{}: {} changes around a {PAUSE:?} pause, answers {counts:?}",
        backend(&url),
        answered.len()
    );
    assert!(
        wrong.is_empty(),
        "{} answers are not the outcome, e.g. {:?}",
        wrong.len(),
        &wrong[..wrong.len().min(5)]
    );
    assert!(
        refused > 0,
        "no change was in flight during the pause: {counts:?}"
    );
    assert!(!counts.contains_key(&500), "{counts:?}");
}

/// Sends SIGCONT to a server stopped with SIGSTOP when dropped, so that a failing test does
/// not leave it stopped.
struct Resume<'a>(&'a Server);

impl Drop for Resume<'_> {
    fn drop(&mut self) {
        self.0.signal("CONT");
    }
}

/// Two replicas. Releases sent to replica A wait for the database's write lock, held by
/// another session, when A is paused for 14 s; the lock is freed meanwhile. A answers them
/// 503 or 408 when it resumes, and its client, told the release was not made, releases each
/// account through replica B and allocates it again there. No release of A's lands after
/// that: every account B allocated again is still there, with B's key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_refused_on_a_paused_replica_never_undoes_a_later_allocation() {
    let dir = tempfile::tempdir().unwrap();
    let (url, _postgres) = fresh_database(dir.path()).await;
    let client = patient_client();
    let (servers, api) = two_replicas(&url, dir.path(), &client).await;
    const ACCOUNTS: usize = 30;
    for i in 0..ACCOUNTS {
        let (status, body) = api
            .call(0, Method::POST, &format!("/keys/x-{i}"), None)
            .await;
        assert_eq!(status, 201, "{body}");
    }

    let mut lock = Db::connect(&url).await;
    lock.hold_write_lock().await;
    let mut releases = tokio::task::JoinSet::new();
    for i in 0..ACCOUNTS {
        let (client, base) = (client.clone(), servers[0].url.clone());
        releases.spawn(async move {
            let status = send(&client, format!("{base}/keys/x-{i}"), Method::DELETE, None).await;
            (i, status)
        });
    }
    // The releases reach A and wait for the lock; A stops; the lock is freed.
    tokio::time::sleep(Duration::from_millis(500)).await;
    servers[0].signal("STOP");
    let resumed = Resume(&servers[0]);
    tokio::time::sleep(Duration::from_millis(500)).await;
    lock.release_write_lock().await;
    tokio::time::sleep(PAUSE).await;
    drop(resumed);

    let mut again: BTreeMap<usize, String> = BTreeMap::new();
    let mut counts: BTreeMap<u16, usize> = BTreeMap::new();
    while let Some(done) = releases.join_next().await {
        let (i, status) = done.unwrap();
        *counts.entry(status).or_default() += 1;
        if matches!(status, 503 | 408) {
            // Not made: the client does it through B, and takes the account up again.
            let path = format!("/keys/x-{i}");
            let (status, body) = api.call(1, Method::DELETE, &path, None).await;
            assert_eq!(status, 204, "{body}");
            let (status, body) = api.call(1, Method::POST, &path, None).await;
            assert_eq!(status, 201, "{body}");
            again.insert(i, body["hash_key"].as_str().unwrap().to_owned());
        }
    }
    println!(
        "{}: releases through the paused replica answered {counts:?}; {} taken up again through the other",
        backend(&url),
        again.len()
    );
    assert!(!again.is_empty(), "no release was refused: {counts:?}");
    // Longer than any release of A's could still be on its way.
    tokio::time::sleep(Duration::from_secs(3)).await;
    for (i, key) in &again {
        for replica in 0..2 {
            let (status, body) = api.get(replica, &format!("/keys/x-{i}")).await;
            assert_eq!(
                (status, body["hash_key"].as_str()),
                (200, Some(key.as_str())),
                "x-{i} on replica {replica}: an allocation B acknowledged was undone"
            );
        }
    }
}

/// Two replicas; B is paused for 3 s while A releases an account and hands its key to a new
/// one. A lookup of the released account sent to B while it is stopped is answered when B
/// resumes: 404 (B looked at the log first) or 503, never the key A gave the other account.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resumed_replica_never_answers_from_the_table_it_had_before_the_pause() {
    let dir = tempfile::tempdir().unwrap();
    let (url, _postgres) = fresh_database(dir.path()).await;
    let client = patient_client();
    let (servers, api) = two_replicas(&url, dir.path(), &client).await;
    for round in 0..5 {
        let (old, new) = (format!("old-{round}"), format!("new-{round}"));
        let (status, body) = api
            .call(0, Method::POST, &format!("/keys/{old}"), None)
            .await;
        assert_eq!(status, 201, "{body}");
        let key = body["hash_key"].as_str().unwrap().to_owned();
        // B knows the account and its key.
        let known = Instant::now();
        loop {
            let (status, _) = api.get(1, &format!("/keys/{old}")).await;
            if status == 200 {
                break;
            }
            assert!(
                known.elapsed() < Duration::from_secs(5),
                "B never saw {old}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        servers[1].signal("STOP");
        let resumed = Resume(&servers[1]);
        let (status, _) = api
            .call(0, Method::DELETE, &format!("/keys/{old}"), None)
            .await;
        assert_eq!(status, 204);
        let (status, body) = api
            .call(0, Method::POST, &format!("/keys/{new}"), None)
            .await;
        assert_eq!(status, 201, "{body}");
        assert_eq!(
            body["hash_key"], key,
            "the walk hands the freed key out again at once"
        );
        // The lookup reaches B while it is stopped, and is read when it resumes.
        let lookup = tokio::spawn({
            let (client, url) = (client.clone(), format!("{}/keys/{old}", servers[1].url));
            async move {
                let answer = client.get(url).send().await.unwrap();
                let status = answer.status().as_u16();
                (status, answer.json::<Value>().await.unwrap_or(Value::Null))
            }
        });
        tokio::time::sleep(Duration::from_secs(3)).await;
        drop(resumed);
        let (status, body) = lookup.await.unwrap();
        assert!(
            matches!(status, 404 | 503),
            "round {round}: B answered {status} {body} for {old}, released before its pause \
             (its key now {new}'s)"
        );
    }
}

/// Replicas `a` and `b` on the database at `url`, ready, and an [`Api`] over them.
async fn two_replicas(
    url: &str,
    dir: &std::path::Path,
    client: &reqwest::Client,
) -> (Vec<Server>, Api) {
    let mut servers = Vec::new();
    for name in ["a", "b"] {
        let mut server = Server::spawn(url, &dir.join(format!("{name}.log")));
        server.wait_ready(client).await;
        servers.push(server);
    }
    let api = Api::new(
        client.clone(),
        servers.iter().map(|s| s.url.clone()).collect(),
    );
    (servers, api)
}
