//! `keyspread import` of a snapshot (what `keyspread export` and `GET /snapshot` write):
//! every account back with every key by index and every pending switch with its time.
//!
//! Two passes over the file: the first checks every line, against the others and against
//! the database, and writes nothing if any is refused; the second writes.

use std::collections::HashMap;
use std::io::BufRead;
use std::sync::Arc;

use crate::http::{Assignment, MAX_SWITCH_AFTER_S, SnapshotHead};
use crate::keyspace::{self, AccountId, HashKey, Keyspace};
use crate::registry::{Registry, Restored};

/// What an import of a snapshot did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct RestoreSummary {
    /// The event the snapshot was taken at, in the database it came from.
    pub event_id: i64,
    /// Account lines read.
    pub accounts: u64,
    /// Accounts written, and the keys they hold.
    pub written: u64,
    pub keys: u64,
    /// Keys whose switch is still ahead, written staged with their time.
    pub pending: u64,
    /// Accounts the database already held just so (left as they were).
    pub present: u64,
    /// Lines refused, with their numbers and why; then nothing was written.
    pub refused: Vec<(u64, String)>,
}

/// Most accounts, keys and moves one transaction writes.
const CHUNK_ACCOUNTS: usize = 10_000;
const CHUNK_KEYS: usize = 16_384;
const CHUNK_MOVES: usize = 1_000;

/// Whether `first_line` opens a snapshot: a JSON object with an `event_id`.
pub fn is_snapshot(first_line: &str) -> bool {
    serde_json::from_str::<serde_json::Value>(first_line.trim())
        .is_ok_and(|head| head.get("event_id").is_some())
}

/// Imports the snapshot `open` reads (called twice: a pass that checks, a pass that
/// writes). `progress` is called after each transaction with the accounts written so far.
pub async fn restore<R: BufRead>(
    registry: &Arc<Registry>,
    open: impl Fn() -> std::io::Result<R>,
    mut progress: impl FnMut(u64),
) -> Result<RestoreSummary, String> {
    let read = |e: std::io::Error| format!("cannot read the file: {e}");
    let mut summary = check(registry, open().map_err(read)?).await?;
    if !summary.refused.is_empty() {
        return Ok(summary);
    }
    // The writes count what the database already holds, as they find it.
    summary.present = 0;
    let mut lines = Lines::new(open().map_err(read)?);
    lines.next_line()?;
    let mut chunk = Chunk::default();
    loop {
        let line = lines.next_line()?;
        if let Some((n, text)) = &line {
            let r =
                parse_line(text, registry.keyspace()).map_err(|why| format!("line {n}: {why}"))?;
            chunk.push(*n, r);
        }
        if chunk.full() || (line.is_none() && !chunk.lines.is_empty()) {
            write(registry, std::mem::take(&mut chunk), &mut summary).await?;
            progress(summary.written + summary.present);
        }
        if line.is_none() {
            return Ok(summary);
        }
    }
}

/// The first pass: every line parsed and checked, nothing written.
async fn check(registry: &Arc<Registry>, file: impl BufRead) -> Result<RestoreSummary, String> {
    let mut summary = RestoreSummary::default();
    let mut lines = Lines::new(file);
    let head = match lines.next_line()? {
        None => return Err("the file is empty: a snapshot starts with its head line".into()),
        Some((_, text)) => serde_json::from_str::<SnapshotHead>(&text)
            .map_err(|e| format!("line 1: not the head of a snapshot: {e}"))?,
    };
    summary.event_id = head.event_id;
    let now = crate::registry::now_ms();
    let mut accounts: HashMap<AccountId, u64> = HashMap::new();
    let mut keys: HashMap<HashKey, u64> = HashMap::new();
    while let Some((n, text)) = lines.next_line()? {
        summary.accounts += 1;
        let r = match parse_line(&text, registry.keyspace()).and_then(|r| switch_in_reach(r, now)) {
            Ok(r) => r,
            Err(why) => {
                summary.refused.push((n, why));
                continue;
            }
        };
        if let Some(first) = accounts.insert(r.account.clone(), n) {
            let why = format!("account {} is also on line {first}", r.account);
            summary.refused.push((n, why));
            continue;
        }
        if let Some((key, other)) = every_key(&r).find_map(|k| keys.insert(k, n).map(|o| (k, o))) {
            summary
                .refused
                .push((n, format!("hash key {key} is also on line {other}")));
            continue;
        }
        if let Some(held) = registry.lookup(r.account.as_str()) {
            if r.matches(&held, now) {
                summary.present += 1;
            } else {
                let why = format!(
                    "account {} is already in the database with other keys, weight or max_fanout",
                    r.account
                );
                summary.refused.push((n, why));
            }
            continue;
        }
        for key in r.held_keys(now) {
            if registry.is_held(key).await {
                let why =
                    format!("hash key {key} is already held in the database by another account");
                summary.refused.push((n, why));
                break;
            }
        }
    }
    if summary.accounts != u64::try_from(head.accounts).unwrap_or(u64::MAX) {
        let why = format!(
            "announces {} accounts but {} lines follow: the file is not a whole snapshot",
            head.accounts, summary.accounts
        );
        summary.refused.push((1, why));
    }
    summary.refused.sort_by_key(|(n, _)| *n);
    Ok(summary)
}

/// `r`, unless its switch is further from `now` (the import's time, Unix milliseconds) than
/// any switch the server stages (`switch_after_s`): a pending move no rebalance could make.
fn switch_in_reach(r: Restored, now: i64) -> Result<Restored, String> {
    let most = MAX_SWITCH_AFTER_S as i64 * 1000;
    match &r.next {
        Some((_, switch_at)) if switch_at.saturating_sub(now) > most => Err(format!(
            "switch_at is {} s after the import's time; a switch is at most {MAX_SWITCH_AFTER_S} s ahead",
            switch_at.saturating_sub(now) / 1000
        )),
        _ => Ok(r),
    }
}

/// Every key a line names: its keys now and after its switch.
fn every_key(r: &Restored) -> impl Iterator<Item = HashKey> + '_ {
    let next = r.next.iter().flat_map(|(keys, _)| keys.iter());
    let mut seen = std::collections::HashSet::new();
    r.keys
        .iter()
        .chain(next)
        .copied()
        .filter(move |k| seen.insert(*k))
}

/// The accounts one transaction writes, with their line numbers.
#[derive(Default)]
struct Chunk {
    lines: Vec<u64>,
    accounts: Vec<Restored>,
    keys: usize,
    moves: usize,
}

impl Chunk {
    fn push(&mut self, line: u64, r: Restored) {
        let after = r.next.as_ref().map_or(&r.keys, |(next, _)| next);
        self.keys += after.len();
        self.moves += (r.keys.iter().zip(after)).filter(|(a, b)| a != b).count();
        self.lines.push(line);
        self.accounts.push(r);
    }

    fn full(&self) -> bool {
        self.accounts.len() >= CHUNK_ACCOUNTS
            || self.keys >= CHUNK_KEYS
            || self.moves >= CHUNK_MOVES
    }
}

/// Writes one chunk in one transaction and counts what it did.
async fn write(
    registry: &Arc<Registry>,
    chunk: Chunk,
    summary: &mut RestoreSummary,
) -> Result<(), String> {
    let Chunk {
        lines, accounts, ..
    } = chunk;
    let by_account: HashMap<AccountId, u64> = (accounts.iter().map(|r| r.account.clone()))
        .zip(lines)
        .collect();
    let import = crate::store::Actor::new(crate::store::Actor::IMPORT);
    let done = registry.restore(accounts, &import).await.map_err(|e| {
        format!(
            "import stopped after {} accounts: {e}",
            summary.written + summary.present
        )
    })?;
    if let Some((account, why)) = done.refused.first() {
        return Err(format!(
            "import stopped after {} accounts: line {}: {why} (the database changed while the \
             file was imported)",
            summary.written + summary.present,
            by_account[account],
        ));
    }
    summary.written += done.written;
    summary.keys += done.keys;
    summary.pending += done.pending;
    summary.present += done.present;
    Ok(())
}

/// One assignment line, checked as the server would hold it.
fn parse_line(text: &str, keyspace: Keyspace) -> Result<Restored, String> {
    let a: Assignment =
        serde_json::from_str(text).map_err(|e| format!("not an assignment: {e}"))?;
    let account = AccountId::parse(a.account).map_err(|e| e.to_string())?;
    let keys = a.hash_keys;
    if keys.first() != Some(&a.hash_key) {
        return Err("hash_key is not hash_keys[0]".into());
    }
    if a.fanout as usize != keys.len() {
        return Err(format!("fanout {} but {} hash_keys", a.fanout, keys.len()));
    }
    let next = match a.next {
        None => None,
        Some(next) => {
            if next.hash_keys.first() != Some(&next.hash_key) {
                return Err("next.hash_key is not next.hash_keys[0]".into());
            }
            if next.hash_keys.len() < keys.len() {
                return Err("next has fewer hash_keys than the account".into());
            }
            Some((next.hash_keys, switch_time(&next.switch_at)?))
        }
    };
    let after = next.as_ref().map_or(&keys, |(next, _)| next);
    let fanout = keyspace::check_fanout(after.len() as u64).map_err(|e| e.to_string())?;
    keyspace::check_weight(a.weight).map_err(|e| e.to_string())?;
    keyspace::check_shares(a.weight, fanout).map_err(|e| e.to_string())?;
    if let Some(cap) = a.max_fanout
        && !(fanout..=keyspace::MAX_FANOUT).contains(&cap)
    {
        return Err(format!(
            "max_fanout {cap} is not between the fanout {fanout} and 1024"
        ));
    }
    // A key sits at one index: unmoved, it is the same key now and after the switch.
    let mut index_of = HashMap::new();
    let now = keys.iter().enumerate();
    for (i, &key) in now.chain(next.iter().flat_map(|(n, _)| n.iter().enumerate())) {
        keyspace.check(key).map_err(|e| e.to_string())?;
        if *index_of.entry(key).or_insert(i) != i {
            return Err(format!("hash key {key} is held twice by the account"));
        }
    }
    Ok(Restored {
        account,
        weight: a.weight,
        keys,
        next,
        max_fanout: a.max_fanout,
        created_at: Some(unix_ms("created_at", &a.created_at)?),
    })
}

/// A `switch_at` (RFC 3339) as Unix milliseconds.
fn switch_time(text: &str) -> Result<i64, String> {
    unix_ms("switch_at", text)
}

/// An RFC 3339 time of field `what` in Unix milliseconds.
fn unix_ms(what: &str, text: &str) -> Result<i64, String> {
    use time::format_description::well_known::Rfc3339;
    let at = time::OffsetDateTime::parse(text, &Rfc3339)
        .map_err(|e| format!("{what} {text:?} is not an RFC 3339 time: {e}"))?;
    i64::try_from(at.unix_timestamp_nanos() / 1_000_000)
        .map_err(|_| format!("{what} {text:?} is out of range"))
}

/// A file's lines with their numbers (from 1).
struct Lines<R> {
    file: R,
    number: u64,
    text: String,
}

impl<R: BufRead> Lines<R> {
    fn new(file: R) -> Self {
        Lines {
            file,
            number: 0,
            text: String::new(),
        }
    }

    /// The next line without its end, or `None` at the end of the file.
    fn next_line(&mut self) -> Result<Option<(u64, String)>, String> {
        self.text.clear();
        self.number += 1;
        let n = self.number;
        match self.file.read_line(&mut self.text) {
            Ok(0) => Ok(None),
            Ok(_) => Ok(Some((
                n,
                self.text.trim_end_matches(['\n', '\r']).to_owned(),
            ))),
            Err(e) => Err(format!("line {n}: cannot read it: {e}")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const K: &str = "170141183460469231731687303715884105728";

    fn line(body: &str) -> Result<Restored, String> {
        parse_line(body, Keyspace::KINESIS)
    }

    #[test]
    fn a_line_keeps_its_keys_by_index_and_its_switch() {
        let r = line(&format!(
            r#"{{"account":"a","hash_key":"1","hash_keys":["1","2"],"fanout":2,"weight":3,"created_at":"2026-01-01T00:00:00Z","next":{{"hash_key":"1","hash_keys":["1","{K}","9"],"switch_at":"2026-11-21T22:42:19.120Z"}}}}"#
        ))
        .unwrap();
        assert_eq!(r.keys, [HashKey(1), HashKey(2)]);
        let (next, at) = r.next.unwrap();
        assert_eq!(next, [HashKey(1), HashKey(1 << 127), HashKey(9)]);
        assert_eq!(at, 1_795_300_939_120);
    }

    #[test]
    fn lines_that_cannot_be_held_say_why() {
        let head = r#""account":"a","weight":2,"created_at":"2026-01-01T00:00:00Z""#;
        for (body, why) in [
            ("{", "not an assignment"),
            (
                r#""hash_key":"1","hash_keys":["2"],"fanout":1"#,
                "hash_key is not hash_keys[0]",
            ),
            (
                r#""hash_key":"1","hash_keys":["1","1"],"fanout":2"#,
                "hash key 1 is held twice",
            ),
            (
                r#""hash_key":"1","hash_keys":["1","2","3"],"fanout":3"#,
                "weight 2 is below fanout 3",
            ),
            (
                r#""hash_key":"1","hash_keys":["1"],"fanout":2"#,
                "fanout 2 but 1 hash_keys",
            ),
            (
                r#""hash_key":"1","hash_keys":["1","2"],"fanout":2,"next":{"hash_key":"2","hash_keys":["2","3"],"switch_at":"2026-01-01T00:00:00Z"}"#,
                "hash key 2 is held twice",
            ),
            (
                r#""hash_key":"1","hash_keys":["1"],"fanout":1,"next":{"hash_key":"3","hash_keys":["3"],"switch_at":"soon"}"#,
                "is not an RFC 3339 time",
            ),
        ] {
            let text = if body == "{" {
                body.to_owned()
            } else {
                format!("{{{head},{body}}}")
            };
            let err = line(&text).unwrap_err();
            assert!(err.contains(why), "{body}: {err}");
        }
        let wide = format!(r#"{{{head},"hash_key":"{K}","hash_keys":["{K}"],"fanout":1}}"#);
        let err = parse_line(&wide, Keyspace::new(64).unwrap()).unwrap_err();
        assert!(err.contains("outside the keyspace"), "{err}");
    }

    #[test]
    fn a_snapshot_is_told_from_a_csv_by_its_first_line() {
        assert!(is_snapshot(r#"{"event_id":7,"accounts":1,"max_age_s":60}"#));
        assert!(!is_snapshot("account,weight,hash_key"));
        assert!(!is_snapshot(r#"{"accounts":1}"#));
    }
}
