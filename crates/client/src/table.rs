//! The table a mirror keeps: each account's keys by index, with the staged switch each key
//! may be waiting for, built from a snapshot and changed by the log's events. Pure: no
//! I/O, no clock of its own (every lookup names its instant).

use std::collections::HashMap;
use std::sync::Arc;

use serde::Deserialize;

/// The keys of one account in force at some instant, by index, as decimal strings (what
/// Kinesis takes as `ExplicitHashKey`).
pub type Keys = Arc<[String]>;

/// One key of an account, as the server stores it: `key` is in force from `switch_at` on,
/// `prev` before it (none for a key a fanout raised by load added: not sent before).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Row {
    key: String,
    prev: Option<String>,
    switch_at: Option<i64>,
}

/// An account: its rows, and what they answer from each of their switches on.
#[derive(Debug, Clone)]
struct Account {
    rows: Vec<Option<Row>>,
    /// `(from, keys)`, by `from` (Unix milliseconds): the keys in force from `from` until
    /// the next stage's. The first stage is from the beginning of time; there is one more
    /// per distinct `switch_at` of the rows (usually none or one).
    stages: Vec<(i64, Keys)>,
}

impl Account {
    fn new(rows: Vec<Option<Row>>) -> Option<Account> {
        let mut account = Account {
            rows,
            stages: Vec::new(),
        };
        account.derive();
        (account.rows.iter().any(Option::is_some)).then_some(account)
    }

    /// The keys in force at `moment`: each row's new key from its switch on, its old key
    /// (if any) before it.
    fn in_force(&self, moment: i64) -> Keys {
        let keys: Vec<String> = (self.rows.iter().flatten())
            .filter_map(|r| match r.switch_at {
                Some(at) if at > moment => r.prev.clone(),
                _ => Some(r.key.clone()),
            })
            .collect();
        Keys::from(keys)
    }

    /// Recomputes the stages from the rows.
    fn derive(&mut self) {
        while matches!(self.rows.last(), Some(None)) {
            self.rows.pop();
        }
        let mut switches: Vec<i64> = self
            .rows
            .iter()
            .flatten()
            .filter_map(|r| r.switch_at)
            .collect();
        switches.sort_unstable();
        switches.dedup();
        let mut stages = vec![(i64::MIN, self.in_force(i64::MIN))];
        stages.extend(switches.into_iter().map(|at| (at, self.in_force(at))));
        self.stages = stages;
    }

    /// The stage in force at `now_ms`, and the one after it.
    fn at(&self, now_ms: i64) -> (&Keys, Option<&(i64, Keys)>) {
        let n = self
            .stages
            .partition_point(|(from, _)| *from <= now_ms)
            .max(1);
        (&self.stages[n - 1].1, self.stages.get(n))
    }

    fn keys_at(&self, now_ms: i64) -> &Keys {
        self.at(now_ms).0
    }
}

/// A staged switch as lookups answer it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Switch {
    /// The keys from `at` on.
    pub keys: Keys,
    /// Unix milliseconds.
    pub at: i64,
}

/// What a lookup answers: the keys in force at its instant, and the switch still ahead.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lookup {
    pub keys: Keys,
    pub next: Option<Switch>,
}

/// One line of `GET /snapshot` after the head, as far as a mirror needs it.
#[derive(Debug, Deserialize)]
pub struct SnapshotLine {
    pub account: String,
    pub hash_keys: Vec<String>,
    #[serde(default)]
    pub next: Option<SnapshotNext>,
}

#[derive(Debug, Deserialize)]
pub struct SnapshotNext {
    pub hash_keys: Vec<String>,
    /// RFC 3339.
    pub switch_at: String,
}

/// One event of `GET /events`, as far as a mirror needs it.
#[derive(Debug, Deserialize)]
pub struct Event {
    pub id: i64,
    pub kind: String,
    #[serde(default)]
    pub account: Option<String>,
    #[serde(default)]
    pub index: Option<u32>,
    #[serde(default)]
    pub key_before: Option<String>,
    #[serde(default)]
    pub key_after: Option<String>,
    /// RFC 3339.
    #[serde(default)]
    pub switch_at: Option<String>,
}

/// Why an event or a snapshot line could not be applied exactly: the mirror takes a new
/// snapshot rather than answer from a table it cannot vouch for.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Unapplied(pub String);

/// Every account's keys, as of one event id.
#[derive(Debug, Clone, Default)]
pub struct Table {
    accounts: HashMap<String, Account, foldhash::fast::RandomState>,
    event_id: i64,
}

/// RFC 3339 as Unix milliseconds.
pub fn unix_ms(text: &str) -> Result<i64, Unapplied> {
    use time::format_description::well_known::Rfc3339;
    let at = time::OffsetDateTime::parse(text, &Rfc3339)
        .map_err(|e| Unapplied(format!("switch_at {text:?}: {e}")))?;
    Ok((at.unix_timestamp_nanos() / 1_000_000) as i64)
}

impl Table {
    /// An empty table as of `event_id` (a snapshot's head), to be filled by [`Table::insert`].
    pub fn new(event_id: i64) -> Table {
        Table {
            accounts: HashMap::default(),
            event_id,
        }
    }

    /// The id of the last event the table reflects.
    pub fn event_id(&self) -> i64 {
        self.event_id
    }

    pub fn len(&self) -> usize {
        self.accounts.len()
    }

    pub fn is_empty(&self) -> bool {
        self.accounts.is_empty()
    }

    /// Adds one snapshot line.
    pub fn insert(&mut self, line: SnapshotLine) -> Result<(), Unapplied> {
        let next = match line.next {
            Some(next) => Some((next.hash_keys, unix_ms(&next.switch_at)?)),
            None => None,
        };
        let width = line
            .hash_keys
            .len()
            .max(next.as_ref().map_or(0, |n| n.0.len()));
        let rows = (0..width)
            .map(|i| {
                let now = line.hash_keys.get(i);
                match &next {
                    None => now.map(|key| Row {
                        key: key.clone(),
                        prev: None,
                        switch_at: None,
                    }),
                    Some((after, at)) => match (now, after.get(i)) {
                        (Some(now), Some(after)) if now == after => Some(Row {
                            key: now.clone(),
                            prev: None,
                            switch_at: None,
                        }),
                        (now, Some(after)) => Some(Row {
                            key: after.clone(),
                            prev: now.cloned(),
                            switch_at: Some(*at),
                        }),
                        // A key in force now that the switch ends: not staged by keyspread.
                        (Some(_), None) => None,
                        (None, None) => None,
                    },
                }
            })
            .collect();
        let account = Account::new(rows)
            .ok_or_else(|| Unapplied(format!("{:?} holds no key", line.account)))?;
        self.accounts.insert(line.account, account);
        Ok(())
    }

    /// Applies one event of the log after the table's event id.
    pub fn apply(&mut self, event: &Event) -> Result<(), Unapplied> {
        if event.id <= self.event_id {
            return Ok(());
        }
        let unapplied =
            |what: &str| Unapplied(format!("event {} ({}): {what}", event.id, event.kind));
        match event.kind.as_str() {
            "allocate" | "release" | "move" => {
                let account = (event.account.as_deref()).ok_or_else(|| unapplied("no account"))?;
                let index = event.index.unwrap_or(0) as usize;
                if index >= keyspace::MAX_FANOUT as usize {
                    return Err(unapplied("index beyond any fanout"));
                }
                let mut rows = match self.accounts.remove(account) {
                    Some(held) => held.rows,
                    None => Vec::new(),
                };
                if rows.len() <= index {
                    rows.resize(index + 1, None);
                }
                let switch_at = event.switch_at.as_deref().map(unix_ms).transpose()?;
                let after = || (event.key_after.clone()).ok_or_else(|| unapplied("no key_after"));
                rows[index] = match event.kind.as_str() {
                    "allocate" => Some(Row {
                        key: after()?,
                        prev: None,
                        switch_at,
                    }),
                    "move" => Some(Row {
                        key: after()?,
                        prev: Some(
                            (event.key_before.clone()).ok_or_else(|| unapplied("no key_before"))?,
                        ),
                        switch_at,
                    }),
                    _ => None,
                };
                if let Some(account_rows) = Account::new(rows) {
                    self.accounts.insert(account.to_owned(), account_rows);
                }
            }
            // Weights, caps on fanout, streams, and kinds newer than this mirror change no
            // key: skipped, so that a server that logs more never costs mirrors a snapshot.
            _ => {}
        }
        self.event_id = event.id;
        Ok(())
    }

    /// Moves the table's position on past events that changed nothing it holds (an empty
    /// page's `next`).
    pub fn advance(&mut self, event_id: i64) {
        self.event_id = self.event_id.max(event_id);
    }

    /// The keys of `account` in force at `now_ms` (Unix milliseconds), with the switch
    /// still ahead of it.
    pub fn lookup(&self, account: &str, now_ms: i64) -> Option<Lookup> {
        let (keys, next) = self.accounts.get(account)?.at(now_ms);
        Some(Lookup {
            keys: keys.clone(),
            next: next.map(|(at, keys)| Switch {
                keys: keys.clone(),
                at: *at,
            }),
        })
    }

    /// The keys of `account` in force at `now_ms`.
    pub fn keys(&self, account: &str, now_ms: i64) -> Option<Keys> {
        self.accounts
            .get(account)
            .map(|a| a.keys_at(now_ms).clone())
    }

    /// The key that records of `sub_key` use at `now_ms`: DESIGN's jump hash of the first
    /// 8 bytes of the sub-key's MD5 over the account's keys in force then.
    pub fn key_for(&self, account: &str, sub_key: &str, now_ms: i64) -> Option<String> {
        let keys = self.accounts.get(account)?.keys_at(now_ms);
        let index = keyspace::sub_key_index(sub_key, keys.len() as u32);
        keys.get(index as usize).cloned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(json: serde_json::Value) -> SnapshotLine {
        serde_json::from_value(json).unwrap()
    }

    fn event(json: serde_json::Value) -> Event {
        serde_json::from_value(json).unwrap()
    }

    const T: &str = "2026-11-27T10:00:00.000Z";
    const T_MS: i64 = 1_795_773_600_000;

    #[test]
    fn a_snapshot_line_answers_its_keys_and_its_switch() {
        let mut table = Table::new(7);
        table
            .insert(line(
                serde_json::json!({"account": "a", "hash_keys": ["1", "2"],
                "next": {"hash_keys": ["1", "3"], "switch_at": T}}),
            ))
            .unwrap();
        assert_eq!(unix_ms(T).unwrap(), T_MS);
        assert_eq!(&*table.keys("a", T_MS - 1).unwrap(), ["1", "2"]);
        assert_eq!(&*table.keys("a", T_MS).unwrap(), ["1", "3"]);
        let ahead = table.lookup("a", T_MS - 1).unwrap().next.unwrap();
        assert_eq!(
            (&*ahead.keys, ahead.at),
            (&["1".to_owned(), "3".to_owned()][..], T_MS)
        );
        assert_eq!(table.lookup("a", T_MS).unwrap().next, None);
        assert_eq!(table.keys("b", 0), None);
    }

    #[test]
    fn events_allocate_move_and_release_keys_by_index() {
        let mut table = Table::new(0);
        let apply = |table: &mut Table, json| table.apply(&event(json)).unwrap();
        apply(
            &mut table,
            serde_json::json!({"id": 1, "kind": "allocate", "account": "a", "index": 0, "key_after": "10"}),
        );
        apply(
            &mut table,
            serde_json::json!({"id": 2, "kind": "allocate", "account": "a", "index": 1, "key_after": "11"}),
        );
        assert_eq!(&*table.keys("a", 0).unwrap(), ["10", "11"]);
        apply(
            &mut table,
            serde_json::json!({"id": 3, "kind": "move", "account": "a", "index": 1,
            "key_before": "11", "key_after": "12", "switch_at": T}),
        );
        assert_eq!(&*table.keys("a", T_MS - 1).unwrap(), ["10", "11"]);
        assert_eq!(&*table.keys("a", T_MS).unwrap(), ["10", "12"]);
        // A key a raised fanout adds is not sent before its switch.
        apply(
            &mut table,
            serde_json::json!({"id": 4, "kind": "allocate", "account": "b", "index": 0, "key_after": "20"}),
        );
        apply(
            &mut table,
            serde_json::json!({"id": 5, "kind": "allocate", "account": "b", "index": 1,
            "key_after": "21", "switch_at": T}),
        );
        assert_eq!(&*table.keys("b", T_MS - 1).unwrap(), ["20"]);
        assert_eq!(&*table.keys("b", T_MS).unwrap(), ["20", "21"]);
        apply(
            &mut table,
            serde_json::json!({"id": 6, "kind": "release", "account": "a", "index": 1, "key_before": "12"}),
        );
        assert_eq!(&*table.keys("a", T_MS).unwrap(), ["10"]);
        apply(
            &mut table,
            serde_json::json!({"id": 7, "kind": "release", "account": "a", "index": 0, "key_before": "10"}),
        );
        assert_eq!(table.keys("a", 0), None);
        assert_eq!(table.event_id(), 7);
        // Events the table already reflects are skipped, and so are kinds it does not know
        // (a newer server's), past which the table moves on.
        apply(
            &mut table,
            serde_json::json!({"id": 2, "kind": "allocate", "account": "a", "index": 0, "key_after": "99"}),
        );
        assert_eq!(table.keys("a", 0), None);
        apply(
            &mut table,
            serde_json::json!({"id": 8, "kind": "merge", "account": "b", "key_after": "1"}),
        );
        assert_eq!(table.event_id(), 8);
        assert_eq!(&*table.keys("b", T_MS).unwrap(), ["20", "21"]);
    }

    #[test]
    fn a_switch_already_passed_stays_passed_when_another_key_starts_switching() {
        let mut table = Table::new(0);
        let apply = |table: &mut Table, json| table.apply(&event(json)).unwrap();
        apply(
            &mut table,
            serde_json::json!({"id": 1, "kind": "allocate", "account": "a", "index": 0, "key_after": "10"}),
        );
        apply(
            &mut table,
            serde_json::json!({"id": 2, "kind": "allocate", "account": "a", "index": 1, "key_after": "11"}),
        );
        // Key 0 switched at T; key 1 switches an hour later.
        apply(
            &mut table,
            serde_json::json!({"id": 3, "kind": "move", "account": "a", "index": 0,
            "key_before": "10", "key_after": "20", "switch_at": T}),
        );
        apply(
            &mut table,
            serde_json::json!({"id": 4, "kind": "move", "account": "a", "index": 1,
            "key_before": "11", "key_after": "21", "switch_at": "2026-11-27T11:00:00.000Z"}),
        );
        assert_eq!(&*table.keys("a", T_MS - 1).unwrap(), ["10", "11"]);
        assert_eq!(&*table.keys("a", T_MS).unwrap(), ["20", "11"]);
        let between = table.lookup("a", T_MS + 1).unwrap();
        assert_eq!(&*between.keys, ["20", "11"]);
        let next = between.next.unwrap();
        assert_eq!(
            (&*next.keys, next.at),
            (&["20".to_owned(), "21".to_owned()][..], T_MS + 3_600_000)
        );
        // Before T the next switch is T's, as the server answers `next`.
        assert_eq!(table.lookup("a", T_MS - 1).unwrap().next.unwrap().at, T_MS);
        assert_eq!(&*table.keys("a", T_MS + 3_600_000).unwrap(), ["20", "21"]);
    }

    #[test]
    fn key_for_picks_designs_jump_index_over_the_keys_in_force() {
        let mut table = Table::new(0);
        let keys: Vec<String> = (0..100).map(|i| format!("{i}")).collect();
        table
            .insert(line(
                serde_json::json!({"account": "hot", "hash_keys": keys}),
            ))
            .unwrap();
        // DESIGN.md: "order-1" -> 44 and "user-42" -> 45 for K = 100.
        assert_eq!(table.key_for("hot", "order-1", 0).unwrap(), "44");
        assert_eq!(table.key_for("hot", "user-42", 0).unwrap(), "45");
    }
}
