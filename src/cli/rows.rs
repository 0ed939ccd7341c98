//! The rows of a `keyspread import` file, read and checked without touching a database.

use std::collections::HashSet;
use std::io::{self, Read};

use crate::keyspace::{self, AccountId, HashKey, Keyspace};
use crate::registry::NewAccount;

/// One data row of an import file: its line and the account it asks for, or why not.
#[derive(Debug)]
pub struct Row {
    pub line: u64,
    pub parsed: Result<NewAccount, String>,
}

/// Reads `account,weight[,hash_key[,fanout]]` rows: fields trimmed, blank lines and a header (a first
/// row whose second field is "weight") skipped, accounts and keys repeated in the file refused.
///
/// Yields `Err` once, and then nothing, when the file is not readable CSV (bad UTF-8).
pub struct Rows<R> {
    reader: csv::Reader<Kept<R>>,
    record: csv::StringRecord,
    keyspace: Keyspace,
    accounts_seen: HashSet<AccountId>,
    keys_seen: HashSet<HashKey>,
    /// Whether a record was read: only the first one may be the header.
    started: bool,
    failed: bool,
}

impl<R: Read> Rows<R> {
    /// Rows of `csv`, whose keys must lie in `keyspace`.
    pub fn new(csv: R, keyspace: Keyspace) -> Self {
        let reader = csv::ReaderBuilder::new()
            .has_headers(false)
            .flexible(true)
            .trim(csv::Trim::All)
            .from_reader(Kept {
                inner: csv,
                bytes: Vec::new(),
                from: 0,
            });
        Rows {
            reader,
            record: csv::StringRecord::new(),
            keyspace,
            accounts_seen: HashSet::new(),
            keys_seen: HashSet::new(),
            started: false,
            failed: false,
        }
    }

    /// The line the record just read starts on, counting the blank lines before it, which
    /// csv skips but leaves out of the record's position.
    fn start_line(&mut self) -> u64 {
        let (start, line) = self
            .record
            .position()
            .map_or((0, 1), |p| (p.byte(), p.line()));
        let end = self.reader.position().byte();
        let kept = self.reader.get_mut();
        let record = |offset: u64| usize::try_from(offset - kept.from).unwrap_or(usize::MAX);
        let mut before = &kept.bytes[record(start).min(kept.bytes.len())..];
        if start == 0 {
            // csv drops a byte-order mark that starts the file.
            before = before.strip_prefix(b"\xef\xbb\xbf").unwrap_or(before);
        }
        let blank = before
            .iter()
            .take_while(|b| matches!(b, b'\r' | b'\n'))
            .filter(|b| **b == b'\n')
            .count() as u64;
        let consumed = record(end).min(kept.bytes.len());
        kept.bytes.drain(..consumed);
        kept.from = end;
        line + blank
    }

    /// Checks one record against the rows before it.
    fn check(&mut self) -> Result<NewAccount, String> {
        let row = parse_record(&self.record, self.keyspace)?;
        // A refused row claims nothing: a later row may still bring its account or key.
        if self.accounts_seen.contains(&row.account) {
            return Err(format!("account {} appears twice in the file", row.account));
        }
        if let Some(key) = row.key
            && !self.keys_seen.insert(key)
        {
            return Err(format!("hash key {key} appears twice in the file"));
        }
        self.accounts_seen.insert(row.account.clone());
        Ok(row)
    }
}

impl<R: Read> Iterator for Rows<R> {
    type Item = Result<Row, String>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.failed {
            return None;
        }
        loop {
            match self.reader.read_record(&mut self.record) {
                Err(e) => {
                    self.failed = true;
                    return Some(Err(format!("cannot read the CSV: {e}")));
                }
                Ok(false) => return None,
                Ok(true) => {}
            }
            let first = !std::mem::replace(&mut self.started, true);
            let line = self.start_line();
            let header = first
                && self
                    .record
                    .get(1)
                    .is_some_and(|w| w.eq_ignore_ascii_case("weight"));
            if !header {
                let parsed = self.check();
                return Some(Ok(Row { line, parsed }));
            }
        }
    }
}

/// The input from the start of the current record on, as far as csv has read ahead.
struct Kept<R> {
    inner: R,
    bytes: Vec<u8>,
    /// The input offset of `bytes[0]`.
    from: u64,
}

impl<R: Read> Read for Kept<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.bytes.extend_from_slice(&buf[..n]);
        Ok(n)
    }
}

/// One record on its own: account, weight (empty: the fanout), optional hash key (key 0),
/// optional fanout (empty: 1); at most 4 columns.
fn parse_record(record: &csv::StringRecord, keyspace: Keyspace) -> Result<NewAccount, String> {
    let field = |i: usize| record.get(i).filter(|f| !f.is_empty());
    let account = AccountId::parse(field(0).unwrap_or_default()).map_err(|e| e.to_string())?;
    let whole = |what: &str, text: &str| {
        text.parse::<u64>()
            .ok()
            .filter(|_| text.bytes().all(|b| b.is_ascii_digit()))
            .ok_or_else(|| format!("{what} {text:?} is not a whole number"))
    };
    let fanout = match field(3) {
        None => 1,
        Some(k) => keyspace::check_fanout(whole("fanout", k)?).map_err(|e| e.to_string())?,
    };
    let weight = match field(1) {
        None => u64::from(fanout),
        Some(w) => whole("weight", w)?,
    };
    let weight = keyspace::check_weight(weight).map_err(|e| e.to_string())?;
    keyspace::check_shares(weight, fanout).map_err(|e| e.to_string())?;
    let key = field(2)
        .map(|k| keyspace.parse(k))
        .transpose()
        .map_err(|e| e.to_string())?;
    if record.len() > 4 {
        return Err(format!(
            "{} columns; expected account,weight[,hash_key[,fanout]]",
            record.len()
        ));
    }
    Ok(NewAccount {
        account,
        weight,
        fanout,
        key,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Line and account (or why not) of each row of a readable file.
    fn read(csv: &str) -> Vec<(u64, Result<String, String>)> {
        Rows::new(csv.as_bytes(), Keyspace::new(8).unwrap())
            .map(|r| r.expect("readable CSV"))
            .map(|row| (row.line, row.parsed.map(|a| a.account.into_string())))
            .collect()
    }

    #[test]
    fn skips_the_header_and_numbers_lines() {
        let rows = Rows::new(
            "Account,WEIGHT\n a , 2 ,7\n\"b\n\",,\nd\ne,,,4\nf,9,3,2".as_bytes(),
            Keyspace::new(8).unwrap(),
        )
        .map(|r| r.unwrap())
        .map(|r| (r.line, r.parsed.unwrap()))
        .map(|(line, a)| (line, a.account.into_string(), a.weight, a.key, a.fanout))
        .collect::<Vec<_>>();
        assert_eq!(
            rows,
            [
                (2, "a".to_owned(), 2, Some(HashKey(7)), 1),
                (3, "b".to_owned(), 1, None, 1),
                (5, "d".to_owned(), 1, None, 1),
                // The weight defaults to the fanout.
                (6, "e".to_owned(), 4, None, 4),
                (7, "f".to_owned(), 9, Some(HashKey(3)), 2),
            ]
        );
    }

    #[test]
    fn blank_lines_count_towards_the_line_a_row_is_on() {
        let lines: Vec<u64> = read("a,1\n\n\nb,1\r\n\r\n\"c\n\",1\n\nd\n\n")
            .into_iter()
            .map(|(line, _)| line)
            .collect();
        assert_eq!(lines, [1, 4, 6, 9]);
    }

    #[test]
    fn only_the_first_row_may_be_the_header() {
        assert_eq!(read("\naccount,weight\na\n"), [(3, Ok("a".to_owned()))]);
        assert_eq!(
            read("a,1\nb,weight\n")[1],
            (2, Err("weight \"weight\" is not a whole number".into()))
        );
    }

    #[test]
    fn refuses_repeats_and_bad_fields() {
        let rows =
            read("a,1,5\na,1\nb,1,5\nc,0\nd,1,256\ne,1,1,1,1\n,1\nf,3,,4\ng,,,1025\nh,,,x\n");
        let why: Vec<String> = rows
            .into_iter()
            .map(|r| r.1.err().unwrap_or_default())
            .collect();
        assert_eq!(why[0], "");
        assert_eq!(why[1], "account a appears twice in the file");
        assert_eq!(why[2], "hash key 5 appears twice in the file");
        assert!(why[3].starts_with("weight must be between 1"), "{}", why[3]);
        assert!(why[4].starts_with("hash key 256 is outside"), "{}", why[4]);
        assert_eq!(
            why[5],
            "5 columns; expected account,weight[,hash_key[,fanout]]"
        );
        assert!(
            why[6].starts_with("account id must be 1 to 256 bytes"),
            "{}",
            why[6]
        );
        assert!(
            why[7].starts_with("weight 3 is below fanout 4"),
            "{}",
            why[7]
        );
        assert_eq!(why[8], "fanout must be between 1 and 1024, got 1025");
        assert_eq!(why[9], "fanout \"x\" is not a whole number");
    }

    /// csv drops a byte-order mark that starts the file (spreadsheets write one).
    #[test]
    fn a_byte_order_mark_is_not_part_of_the_first_account() {
        assert_eq!(read("\u{feff}a,1\nb,1\n")[0], (1, Ok("a".to_owned())));
        assert_eq!(
            read("\u{feff}account,weight\nb\n"),
            [(2, Ok("b".to_owned()))]
        );
    }

    #[test]
    fn weights_are_plain_digits() {
        assert_eq!(
            read("a,+5\n")[0].1,
            Err("weight \"+5\" is not a whole number".into())
        );
    }

    #[test]
    fn a_refused_row_claims_nothing() {
        let rows = read("a,1,5\nb,1,5\nb,1,6\n");
        assert_eq!(
            rows[1].1,
            Err("hash key 5 appears twice in the file".into())
        );
        assert_eq!(rows[2].1, Ok("b".to_owned()));
    }

    #[test]
    fn stops_at_bad_utf8() {
        let bytes = b"a,1\nb\xff,1\nc,1\n";
        let rows: Vec<_> = Rows::new(&bytes[..], Keyspace::KINESIS).collect();
        assert_eq!(rows.len(), 2);
        assert!(
            rows[1]
                .as_ref()
                .is_err_and(|e| e.starts_with("cannot read the CSV"))
        );
    }
}
