//! `keyspread export`: the table as a snapshot (NDJSON, exactly as `GET /snapshot` answers
//! it), from a running server or straight from its database: a backup that
//! `keyspread import` takes back with every key.

use std::io::Write;

use crate::config::Token;
use crate::http::{SnapshotHead, ndjson_line, page_lines};
use crate::registry::Snapshot;
use crate::store::Store;

/// What an export wrote.
#[derive(Debug, PartialEq, Eq)]
pub struct Exported {
    pub event_id: i64,
    pub accounts: i64,
    pub bytes: u64,
}

/// Longest first line taken for a snapshot's head.
const MAX_HEAD: usize = 4096;

/// Writes the snapshot of the database at `database_url` to `out`, read in one read
/// transaction page by page as the server reads it; `max_age_s` is the head's (the
/// lifetime of the server's lookup answers).
pub async fn export_database(
    database_url: &str,
    max_age_s: u64,
    out: &mut dyn Write,
) -> Result<Exported, String> {
    // Connecting creates a missing SQLite file: an export of a mistyped path would be an
    // empty backup.
    if let Some(file) = missing_sqlite_file(database_url) {
        return Err(format!("no database at {}", file.display()));
    }
    let store = Store::connect(database_url)
        .await
        .map_err(|e| e.to_string())?;
    let mut snapshot = Snapshot::of(&store).await.map_err(|e| e.to_string())?;
    let head = SnapshotHead {
        event_id: snapshot.event_id,
        accounts: snapshot.accounts,
        max_age_s,
        log_id: snapshot.log_id.to_string(),
    };
    let written = |e: std::io::Error| format!("cannot write the output: {e}");
    let first = ndjson_line(&head).map_err(|e| e.to_string())?;
    out.write_all(&first).map_err(written)?;
    let mut bytes = first.len() as u64;
    while let Some(page) = snapshot.next_page().await.map_err(|e| e.to_string())? {
        let lines = page_lines(page).map_err(|e| e.to_string())?;
        out.write_all(&lines).map_err(written)?;
        bytes += lines.len() as u64;
    }
    out.flush().map_err(written)?;
    Ok(Exported {
        event_id: head.event_id,
        accounts: head.accounts,
        bytes,
    })
}

/// The file of a SQLite URL that names none.
fn missing_sqlite_file(database_url: &str) -> Option<std::path::PathBuf> {
    use std::str::FromStr;
    if !database_url.starts_with("sqlite:") {
        return None;
    }
    let options = sqlx::sqlite::SqliteConnectOptions::from_str(database_url).ok()?;
    let file = options.get_filename();
    (!file.exists()).then(|| file.to_path_buf())
}

/// Writes the snapshot the server at `url` answers to `out` as it arrives, never holding
/// more than a chunk of it; fails if the answer is cut short (fewer lines than its head
/// announces).
pub async fn export_server(
    url: &str,
    token: Option<&Token>,
    out: &mut dyn Write,
) -> Result<Exported, String> {
    let mut request = reqwest::Client::new().get(format!("{}/snapshot", url.trim_end_matches('/')));
    if let Some(token) = token {
        request = request.bearer_auth(token.expose());
    }
    let mut response = request
        .send()
        .await
        .map_err(|e| format!("cannot reach {url}: {e}"))?;
    let status = response.status();
    if !status.is_success() {
        let answer: serde_json::Value = response.json().await.unwrap_or_default();
        let detail = answer["detail"].as_str().unwrap_or("no detail");
        return Err(format!("{url}/snapshot answered {status}: {detail}"));
    }
    let written = |e: std::io::Error| format!("cannot write the output: {e}");
    let cut = |e: reqwest::Error| format!("the snapshot was cut short: {e}");
    // The head first, checked before anything is written.
    let mut pending = Vec::new();
    let head = loop {
        if let Some(end) = pending.iter().position(|&b| b == b'\n') {
            let head: SnapshotHead = serde_json::from_slice(&pending[..end])
                .map_err(|e| format!("{url}/snapshot is not a snapshot: {e}"))?;
            break head;
        }
        if pending.len() > MAX_HEAD {
            return Err(format!("{url}/snapshot is not a snapshot: no head line"));
        }
        match response.chunk().await.map_err(cut)? {
            Some(chunk) => pending.extend_from_slice(&chunk),
            None => return Err(format!("{url}/snapshot is not a snapshot: no head line")),
        }
    };
    let mut lines = 0i64;
    let mut bytes = 0u64;
    let mut last = b'\n';
    let mut chunk = axum::body::Bytes::from(pending);
    loop {
        lines += chunk.iter().filter(|&&b| b == b'\n').count() as i64;
        if let Some(&end) = chunk.last() {
            last = end;
        }
        out.write_all(&chunk).map_err(written)?;
        out.flush().map_err(written)?;
        bytes += chunk.len() as u64;
        match response.chunk().await.map_err(cut)? {
            Some(next) => chunk = next,
            None => break,
        }
    }
    if lines != head.accounts + 1 || last != b'\n' {
        return Err(format!(
            "the snapshot was cut short: its head announces {} accounts, {} lines came",
            head.accounts,
            (lines - 1).max(0)
        ));
    }
    Ok(Exported {
        event_id: head.event_id,
        accounts: head.accounts,
        bytes,
    })
}
