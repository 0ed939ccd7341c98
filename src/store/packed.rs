//! A shard's account rates packed into one value, so that a report of a thousand accounts
//! writes one row: per row, the database's own work (a key seek to check the conflict,
//! another to write) cost more than the rest of a heartbeat.
//!
//! Layout, little-endian: the instant the rates are as of (i64, Unix milliseconds), then
//! per account, in byte order of its name: the name's length (u32), its UTF-8 bytes, its
//! records/s and bytes/s (f64 each).

use super::StoreError;

/// Bytes of the header: the instant.
const HEADER: usize = 8;

/// One account's rates in a packed value.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Entry<'a> {
    pub account: &'a str,
    pub records_per_s: f64,
    pub bytes_per_s: f64,
}

/// A packed value being written: entries must come in byte order of their names.
#[derive(Debug)]
pub struct Packer {
    bytes: Vec<u8>,
}

impl Packer {
    /// An empty value as of `at_ms`, with room for about `accounts` entries.
    pub fn new(at_ms: i64, accounts: usize) -> Self {
        let mut bytes = Vec::with_capacity(HEADER + accounts * 40);
        bytes.extend_from_slice(&at_ms.to_le_bytes());
        Packer { bytes }
    }

    pub fn push(&mut self, e: Entry<'_>) {
        let name = e.account.as_bytes();
        self.bytes
            .extend_from_slice(&(name.len() as u32).to_le_bytes());
        self.bytes.extend_from_slice(name);
        self.bytes.extend_from_slice(&e.records_per_s.to_le_bytes());
        self.bytes.extend_from_slice(&e.bytes_per_s.to_le_bytes());
    }

    pub fn finish(self) -> Vec<u8> {
        self.bytes
    }
}

/// The instant a packed value is as of, and its entries in order; refuses a value that is
/// cut short, not UTF-8, or out of order.
pub fn unpack(bytes: &[u8]) -> Result<(i64, Vec<Entry<'_>>), StoreError> {
    let corrupt = |why: &str| StoreError::Corrupt(format!("packed account rates: {why}"));
    let (at, mut rest) = bytes
        .split_first_chunk::<HEADER>()
        .ok_or_else(|| corrupt("no header"))?;
    let mut entries = Vec::with_capacity(rest.len() / 40);
    let mut last: Option<&str> = None;
    while !rest.is_empty() {
        let (len, tail) = rest
            .split_first_chunk::<4>()
            .ok_or_else(|| corrupt("cut short"))?;
        let len = u32::from_le_bytes(*len) as usize;
        if tail.len() < len + 16 {
            return Err(corrupt("cut short"));
        }
        let (name, tail) = tail.split_at(len);
        let account = std::str::from_utf8(name).map_err(|_| corrupt("a name is not UTF-8"))?;
        if last.is_some_and(|l| l >= account) {
            return Err(corrupt("names out of order"));
        }
        let (r, tail) = tail.split_first_chunk::<8>().expect("length checked");
        let (b, tail) = tail.split_first_chunk::<8>().expect("length checked");
        entries.push(Entry {
            account,
            records_per_s: f64::from_le_bytes(*r),
            bytes_per_s: f64::from_le_bytes(*b),
        });
        last = Some(account);
        rest = tail;
    }
    Ok((i64::from_le_bytes(*at), entries))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn entry(account: &str, r: f64, b: f64) -> Entry<'_> {
        Entry {
            account,
            records_per_s: r,
            bytes_per_s: b,
        }
    }

    #[test]
    fn a_packed_value_reads_back_exactly() {
        let mut p = Packer::new(-17, 3);
        let written = [
            entry("", 0.0, 0.0),
            entry("a\u{e9}", 1.0 / 3.0, 5e300),
            entry("z", f64::MIN_POSITIVE, 2.5),
        ];
        for e in written {
            p.push(e);
        }
        let bytes = p.finish();
        assert_eq!(unpack(&bytes).unwrap(), (-17, written.to_vec()));
        assert_eq!(unpack(&Packer::new(9, 0).finish()).unwrap(), (9, vec![]));
    }

    #[test]
    fn a_damaged_value_is_refused_saying_why() {
        let mut p = Packer::new(1, 2);
        p.push(entry("b", 1.0, 1.0));
        p.push(entry("a", 1.0, 1.0));
        let unordered = p.finish();
        let why = |bytes: &[u8]| match unpack(bytes) {
            Err(StoreError::Corrupt(why)) => why,
            other => panic!("accepted {bytes:?}: {other:?}"),
        };
        assert!(why(&unordered).ends_with("out of order"));
        assert!(why(&unordered[..unordered.len() - 1]).ends_with("cut short"));
        assert!(why(&unordered[..3]).ends_with("no header"));
        let mut bad = Packer::new(1, 1);
        bad.push(entry("x", 1.0, 1.0));
        let mut bad = bad.finish();
        bad[HEADER + 4] = 0xff;
        assert!(why(&bad).ends_with("not UTF-8"));
    }

    proptest! {
        #[test]
        fn any_sorted_rates_read_back(
            at in any::<i64>(),
            rates in proptest::collection::btree_map(".{0,20}", (0.0..1e12f64, 0.0..1e15f64), 0..50),
        ) {
            let mut p = Packer::new(at, rates.len());
            for (a, &(r, b)) in &rates {
                p.push(entry(a, r, b));
            }
            let bytes = p.finish();
            let (got_at, got) = unpack(&bytes).unwrap();
            prop_assert_eq!(got_at, at);
            let want: Vec<Entry<'_>> = rates.iter().map(|(a, &(r, b))| entry(a, r, b)).collect();
            prop_assert_eq!(got, want);
        }
    }
}
