//! The rows of `keyspread import`. On any bytes: an error exactly when the file is not
//! UTF-8, and then nothing more; lines increase (or stay, after a lone `\r`); accepted
//! rows are valid (account, weight 1..=1,000,000, key inside the keyspace) and share no
//! account and no key. On files without quotes or carriage returns, every row (and the
//! line it is on, blank lines counted) equals what a plain split on `\n` and `,` gives
//! under the import's rules.
#![no_main]

use std::collections::HashSet;

use keyspread::cli::Rows;
use keyspread::keyspace::{AccountId, Keyspace};
use libfuzzer_sys::fuzz_target;

/// `(line, Some((account, weight, key)) or None when refused)` per data row.
type Expected = Vec<(u64, Option<(String, u64, Option<u128>)>)>;

fn digits(text: &str) -> Option<u128> {
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    text.parse().ok()
}

/// The import's rules applied to lines split by hand.
fn reference(text: &str, max: u128) -> Expected {
    let mut accounts = HashSet::new();
    let mut keys = HashSet::new();
    let mut rows = Vec::new();
    // A leading byte-order mark is no part of the first field.
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let body = text.strip_suffix('\n').unwrap_or(text);
    let mut first = true;
    for (i, line) in body.split('\n').enumerate() {
        let number = i as u64 + 1;
        if line.is_empty() {
            continue; // blank lines are no records
        }
        let fields: Vec<&str> = line.split(',').map(str::trim).collect();
        let field = |i: usize| fields.get(i).copied().filter(|f| !f.is_empty());
        let header = first
            && fields
                .get(1)
                .is_some_and(|f| f.eq_ignore_ascii_case("weight"));
        first = false;
        if header {
            continue;
        }
        let row = (|| {
            let account = field(0)?;
            AccountId::parse(account).ok()?;
            // Weights are digits only (leading zeros allowed).
            let weight = match field(1) {
                None => 1,
                Some(w) => u64::try_from(digits(w)?).ok()?,
            };
            if !(1..=1_000_000).contains(&weight) {
                return None;
            }
            let key = match field(2) {
                None => None,
                Some(k) => Some(digits(k).filter(|v| k.len() <= 39 && *v <= max)?),
            };
            if fields.len() > 3 {
                return None;
            }
            // A refused row claims neither its account nor its key.
            if accounts.contains(account) {
                return None;
            }
            if let Some(key) = key
                && !keys.insert(key)
            {
                return None;
            }
            accounts.insert(account.to_owned());
            Some((account.to_owned(), weight, key))
        })();
        rows.push((number, row));
    }
    rows
}

fn check(data: &[u8], keyspace: Keyspace) {
    let max = keyspace.max().0;
    let mut got: Expected = Vec::new();
    let mut failed = false;
    let mut accounts = HashSet::new();
    let mut keys = HashSet::new();
    let cr = data.contains(&b'\r');
    for item in Rows::new(data, keyspace) {
        assert!(!failed, "rows after an error");
        let row = match item {
            Ok(row) => row,
            Err(_) => {
                failed = true;
                continue;
            }
        };
        // A lone carriage return ends a record but not a line.
        if let Some((last, _)) = got.last() {
            assert!(
                row.line > *last || (row.line == *last && cr),
                "line {} after {last}",
                row.line
            );
        }
        let parsed = row.parsed.ok().map(|a| {
            assert!(AccountId::parse(a.account.as_str()).is_ok());
            assert!((1..=1_000_000).contains(&a.weight));
            assert!(accounts.insert(a.account.clone()), "account twice");
            if let Some(key) = a.key {
                assert!(key.0 <= max, "key outside the keyspace");
                assert!(keys.insert(key), "key twice");
            }
            (a.account.into_string(), a.weight, a.key.map(|k| k.0))
        });
        got.push((row.line, parsed));
    }
    let text = std::str::from_utf8(data);
    assert_eq!(failed, text.is_err(), "an error exactly on bad UTF-8");
    if let Ok(text) = text
        && !text.contains(['"', '\r'])
    {
        assert_eq!(got, reference(text, max));
    }
}

fuzz_target!(|data: &[u8]| {
    check(data, Keyspace::KINESIS);
    check(data, Keyspace::new(4).expect("4 bits"));
});
