//! `AccountId::parse` against its rules: 1..=256 bytes of UTF-8, no control character
//! (Unicode category Cc: U+0000..U+001F, U+007F..U+009F), not the reserved "batch"; checked
//! in that order. Accepted ids keep their text exactly and sort like it.
#![no_main]

use keyspread::keyspace::{AccountId, Error};
use libfuzzer_sys::fuzz_target;

fn reference(text: &str) -> Result<(), Error> {
    if text.is_empty() || text.len() > 256 {
        return Err(Error::AccountLength);
    }
    let control = |c: char| matches!(u32::from(c), 0..=0x1f | 0x7f..=0x9f);
    if text.chars().any(control) {
        return Err(Error::AccountControlChar);
    }
    if text == "batch" {
        return Err(Error::AccountReserved);
    }
    Ok(())
}

fn check(text: &str) -> Option<AccountId> {
    let parsed = AccountId::parse(text);
    assert_eq!(parsed.clone().map(|_| ()), reference(text), "{text:?}");
    let id = parsed.ok()?;
    assert_eq!(id.as_str(), text);
    assert_eq!(id.to_string(), text);
    assert_eq!(std::borrow::Borrow::<str>::borrow(&id), text);
    // Parsing is idempotent: an id's own text is an id, the same one.
    assert_eq!(AccountId::parse(id.as_str()).as_ref(), Ok(&id));
    assert_eq!(id.clone().into_string(), text);
    Some(id)
}

fuzz_target!(|data: &[u8]| {
    // The whole input, and its two halves around the first 0xff byte (never in UTF-8).
    let mut parts = data.splitn(2, |b| *b == 0xff);
    let first = parts.next().unwrap_or_default();
    let second = parts.next();
    if let Ok(text) = std::str::from_utf8(data) {
        check(text);
    }
    let (Some(second), Ok(a)) = (second, std::str::from_utf8(first)) else {
        return;
    };
    let Ok(b) = std::str::from_utf8(second) else {
        return;
    };
    if let (Some(x), Some(y)) = (check(a), check(b)) {
        assert_eq!(x.cmp(&y), a.cmp(b), "ids sort like their text");
        assert_eq!(x == y, a == b);
    }
});
