//! Least privilege: every operation of the OpenAPI document, called by every role, by no
//! token and by an unknown one, answers as the document's `x-keyspread-role` declares.

use std::collections::BTreeSet;
use std::path::Path;

use reqwest::Method;
use serde_json::{Value, json};

use crate::helpers::{TestApp, answer, content_type, spawn_app_with};
use crate::skip::sqlite_only;
use keyspread::config::{ReadAccess, Role, Roles, tokens_file_line};

const TOKENS: [(&str, Role); 4] = [
    ("reader", Role::Read),
    ("producers", Role::Produce),
    ("workers", Role::Consume),
    ("ops", Role::Admin),
];

pub fn token_of(name: &str) -> String {
    format!("{name}-token-0123456789abcdef")
}

/// A tokens file granting each of [`TOKENS`] its role, in `dir`.
pub fn write_tokens_file(dir: &Path) -> std::path::PathBuf {
    let lines: Vec<String> = TOKENS
        .iter()
        .map(|(name, role)| tokens_file_line(name, Roles::of(&[*role]), &token_of(name)))
        .collect();
    let path = dir.join("tokens");
    std::fs::write(&path, lines.join("\n") + "\n").unwrap();
    restrict(&path);
    path
}

/// A server of least privilege: the tokens file of [`TOKENS`] (written in `dir`) and
/// closed reads.
pub fn close(config: &mut keyspread::config::ServeConfig, dir: &Path) {
    config.tokens_file = Some(write_tokens_file(dir));
    config.read_access = ReadAccess::Token;
}

/// Gives a harness its tokens: each environment variable the token of a name of [`TOKENS`].
pub fn hand_out(command: &mut tokio::process::Command, tokens: &[(&str, &str)]) {
    for (variable, name) in tokens {
        command.env(variable, token_of(name));
    }
}

pub fn restrict(path: &Path) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).unwrap();
}

/// Who calls: no token, a token the server does not know, or one of [`TOKENS`].
#[derive(Debug, Clone, Copy)]
enum Caller {
    Anonymous,
    Unknown,
    Named(&'static str, Role),
}

impl Caller {
    fn all() -> Vec<Caller> {
        let mut all = vec![Caller::Anonymous, Caller::Unknown];
        all.extend(TOKENS.iter().map(|(n, r)| Caller::Named(n, *r)));
        all
    }

    fn token(self) -> Option<String> {
        match self {
            Caller::Anonymous => None,
            Caller::Unknown => Some(token_of("nobody")),
            Caller::Named(name, _) => Some(token_of(name)),
        }
    }
}

/// The roles the document declares, by `METHOD /template`.
fn declared() -> Vec<(String, String, String)> {
    let doc: Value = serde_json::from_str(&keyspread::http::openapi_json()).unwrap();
    let mut out = Vec::new();
    for (path, item) in doc["paths"].as_object().unwrap() {
        for (method, operation) in item.as_object().unwrap() {
            let role = operation["x-keyspread-role"]
                .as_str()
                .unwrap_or_else(|| panic!("{method} {path} states no role"));
            out.push((method.to_uppercase(), path.clone(), role.to_owned()));
        }
    }
    out
}

/// What a caller should get from an operation needing `role`.
fn expected(caller: Caller, role: &str, reads_closed: bool) -> Result<(), u16> {
    let needed = match role {
        "none" | "metrics" => return Ok(()),
        "read" if !reads_closed => return Ok(()),
        other => other.parse::<Role>().unwrap(),
    };
    match caller {
        Caller::Anonymous | Caller::Unknown => Err(401),
        Caller::Named(_, held) if Roles::of(&[held]).allow(needed) => Ok(()),
        Caller::Named(..) => Err(403),
    }
}

/// One server with the tokens file, a stream `s` of 2 shards, a stream `gone` to delete,
/// accounts `a` and `b`, and an admin's worker `w-admin` holding leases (for checkpoints).
async fn server(read_access: ReadAccess) -> (TestApp, Value) {
    let dir = tempfile::tempdir().unwrap();
    let tokens = write_tokens_file(dir.path());
    let app = spawn_app_with(|c| {
        c.tokens_file = Some(tokens);
        c.read_access = read_access;
    })
    .await;
    std::mem::forget(dir); // the tokens file outlives the test's server
    let admin = token_of("ops");
    let send = |method: Method, path: &str, body: Value| {
        app.client
            .request(method, app.url(path))
            .bearer_auth(&admin)
            .json(&body)
            .send()
    };
    for (method, path, body) in [
        (Method::PUT, "/streams/s", json!({"shard_count": 2})),
        (Method::PUT, "/streams/gone", json!({"shard_count": 2})),
        (Method::POST, "/keys/a", json!({})),
        (Method::POST, "/keys/b", json!({})),
    ] {
        let answer = answer(send(method, path, body).await.unwrap()).await;
        assert!(answer.status < 300, "{path}: {answer:?}");
    }
    let joined = answer(
        send(Method::PUT, "/streams/s/workers/w-admin", json!({}))
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(joined.status, 200, "{joined:?}");
    // A reshard of `s` that ended, for GET /streams/s/reshard: a job runs only against
    // Kinesis, which these servers do not reach.
    app.db()
        .await
        .execute(
            "INSERT INTO reshard_jobs (stream, target, starts, switch_after_ms, state, done, \
             started_by, started_at, updated_at, first_shard) \
             VALUES ('s', 1, X'', 0, 'done', 0, 'ops', 0, 0, 2)",
            &[],
        )
        .await;
    (app, joined.body)
}

/// Operations a caller allowed to make them is refused here for a reason past its role,
/// and what that refusal is: a reshard needs a stream keyspread lists from Kinesis.
fn refused_past_the_role(method: &str, template: &str) -> Option<(u16, &'static str)> {
    match (method, template) {
        ("POST", "/streams/{name}/reshard") => Some((409, "is not watched")),
        _ => None,
    }
}

/// A request for `method template` that succeeds for a caller allowed to make it.
async fn sample(app: &TestApp, method: &str, template: &str, joined: &Value) -> (String, Value) {
    let body = Value::Null;
    let admin = token_of("ops");
    match (method, template) {
        ("GET", "/shard-of") => ("/shard-of?account=a&shards=2".into(), body),
        ("GET", "/distribution") => ("/distribution?shards=2".into(), body),
        ("GET", "/load") => ("/load?stream=s".into(), body),
        ("GET", "/rebalance/preview") => ("/rebalance/preview?shards=2".into(), body),
        ("GET", "/streams/{name}/split-plan") => ("/streams/s/split-plan?target=4".into(), body),
        ("GET", "/events") => ("/events?after=0".into(), body),
        ("POST", "/keys/batch") => (
            "/keys/batch".into(),
            json!({"accounts": [{"account": "c"}]}),
        ),
        ("POST", "/keys/{account}") => ("/keys/new".into(), json!({})),
        ("POST", "/load/producers") => (
            "/load/producers".into(),
            json!({"stream": "s", "producer": "p", "seq": 1, "window_ms": 1000,
                   "keys": [{"account": "a", "hash_key": "1", "records": 1, "bytes": 1}]}),
        ),
        ("PATCH", "/keys/{account}") => ("/keys/a".into(), json!({"weight": 2})),
        ("DELETE", "/keys/{account}") => ("/keys/b".into(), body),
        ("PUT", "/streams/{name}") => ("/streams/t".into(), json!({"shard_count": 2})),
        ("DELETE", "/streams/{name}") => ("/streams/gone".into(), body),
        ("POST", "/streams/{name}/reshard") => ("/streams/s/reshard".into(), json!({"target": 3})),
        ("PUT", "/streams/{name}/workers/{worker}") => ("/streams/s/workers/w1".into(), json!({})),
        ("DELETE", "/streams/{name}/workers/{worker}") => {
            ("/streams/s/workers/w-admin".into(), body)
        }
        ("PUT", "/streams/{name}/leases/{shard_id}/checkpoint") => {
            let lease = &joined["leases"][0];
            let shard = lease["shard_id"].as_str().expect("a lease");
            (
                format!("/streams/s/leases/{shard}/checkpoint"),
                json!({"worker": "w-admin", "epoch": lease["epoch"], "sequence_number": "1"}),
            )
        }
        ("POST", "/rebalance") => {
            let preview: Value = app
                .client
                .get(app.url("/rebalance/preview?shards=2"))
                .bearer_auth(&admin)
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            ("/rebalance".into(), json!({"plan_id": preview["plan_id"]}))
        }
        (_, template) => {
            let path = template
                .replace("{account}", "a")
                .replace("{name}", "s")
                .replace("{worker}", "w1");
            assert!(!path.contains('{'), "no sample for {method} {template}");
            (path, body)
        }
    }
}

/// The order a caller goes through the operations: reads first, then changes, the
/// destructive ones last, so each finds what it needs.
fn rank(method: &str, template: &str) -> u8 {
    match (method, template) {
        ("GET", _) => 0,
        ("DELETE", "/streams/{name}/workers/{worker}") => 3,
        ("DELETE", _) => 4,
        ("POST", "/rebalance") => 2,
        _ => 1,
    }
}

/// An answer of any kind: JSON, HTML, NDJSON or metrics text.
struct Got {
    status: u16,
    content_type: String,
    text: String,
}

impl Got {
    async fn of(response: reqwest::Response) -> Got {
        let status = response.status().as_u16();
        let content_type = content_type(&response);
        let text = response.text().await.unwrap_or_default();
        Got {
            status,
            content_type,
            text,
        }
    }

    /// Whether the problem's detail mentions `needle`.
    fn says(&self, needle: &str) -> bool {
        let problem: Value = serde_json::from_str(&self.text).unwrap_or_default();
        problem["detail"]
            .as_str()
            .is_some_and(|d| d.contains(needle))
    }
}

async fn matrix(read_access: ReadAccess) {
    let reads_closed = read_access == ReadAccess::Token;
    let mut operations = declared();
    operations.sort_by_key(|(m, t, _)| (rank(m, t), m.clone(), t.clone()));
    let mut failures = Vec::new();
    let mut tried = BTreeSet::new();
    for caller in Caller::all() {
        let (app, joined) = server(read_access).await;
        for (method, template, role) in &operations {
            tried.insert(format!("{method} {template}"));
            let (path, body) = sample(&app, method, template, &joined).await;
            let mut request = app.client.request(method.parse().unwrap(), app.url(&path));
            if let Some(token) = caller.token() {
                request = request.bearer_auth(token);
            }
            if !body.is_null() {
                request = request.json(&body);
            }
            let got = Got::of(request.send().await.unwrap()).await;
            let want = expected(caller, role, reads_closed);
            let ok = match (want, refused_past_the_role(method, template)) {
                (Ok(()), Some((status, why))) => got.status == status && got.says(why),
                (Ok(()), None) => (200..400).contains(&got.status),
                (Err(status), _) => {
                    got.status == status
                        && got.content_type.starts_with("application/problem+json")
                        && (status != 403 || got.says(&format!("the {role} role")))
                }
            };
            if !ok {
                let body = &got.text;
                failures.push(format!(
                    "{caller:?} {method} {path} (role {role}): wanted {want:?}, got {} {}",
                    got.status,
                    &body[..body.len().min(300)]
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert_eq!(tried.len(), operations.len());
}

// The matrix runs on SQLite only: who may do what is decided before the store is touched,
// and twelve fresh Postgres databases would load the shared server for nothing. The store's
// part, the actor of each change, is tests/api/audit.rs's, on both backends.
#[tokio::test]
async fn every_role_gets_what_the_document_declares_with_reads_open() {
    if sqlite_only("every_role_gets_what_the_document_declares_with_reads_open") {
        matrix(ReadAccess::Open).await;
    }
}

#[tokio::test]
async fn every_role_gets_what_the_document_declares_with_reads_closed() {
    if sqlite_only("every_role_gets_what_the_document_declares_with_reads_closed") {
        matrix(ReadAccess::Token).await;
    }
}

/// The router and the document agree: every route the server answers is an operation of
/// the document stating its role, in both documents, and the 3.0 one keeps role lists
/// empty as 3.0 requires.
#[test]
fn every_operation_states_its_role_in_both_documents() {
    let roles = ["none", "metrics", "read", "produce", "consume", "admin"];
    for text in [
        keyspread::http::openapi_json(),
        keyspread::http::openapi_30_json(),
    ] {
        let doc: Value = serde_json::from_str(&text).unwrap();
        let v30 = doc["openapi"].as_str().unwrap().starts_with("3.0");
        for (path, item) in doc["paths"].as_object().unwrap() {
            for (method, operation) in item.as_object().unwrap() {
                let role = operation["x-keyspread-role"].as_str().unwrap_or_default();
                assert!(roles.contains(&role), "{method} {path}: role {role:?}");
                let security = operation["security"].as_array().expect("security");
                match role {
                    "none" => assert_eq!(security, &vec![json!({})], "{method} {path}"),
                    "metrics" => assert_eq!(security[1], json!({"metricsToken": []})),
                    _ => {
                        let listed = if v30 { json!([]) } else { json!([role]) };
                        assert_eq!(security[1], json!({"bearer": listed}), "{method} {path}");
                        assert!(operation["responses"]["401"].is_object(), "{method} {path}");
                    }
                }
            }
        }
    }
    // Every role-table entry is a documented operation, and each documented one is in it.
    let documented: BTreeSet<(String, String)> =
        declared().into_iter().map(|(m, t, _)| (m, t)).collect();
    let table: BTreeSet<(String, String)> = keyspread::http::roles::OPERATIONS
        .iter()
        .map(|(m, t, _)| ((*m).to_owned(), (*t).to_owned()))
        .collect();
    assert_eq!(documented, table);
}
