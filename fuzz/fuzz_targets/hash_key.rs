//! `HashKey`'s decimal parser and serde form against a reference: 1 to 39 ASCII digits
//! (no sign, no spaces, leading zeros allowed within the 39) whose value fits 128 bits.
#![no_main]

use keyspread::keyspace::{Error, HashKey, Keyspace};
use libfuzzer_sys::fuzz_target;

/// The rule written out digit by digit, without `u128::from_str` (which also takes `+`).
fn reference(text: &str) -> Option<u128> {
    if text.is_empty() || text.len() > 39 {
        return None;
    }
    text.bytes().try_fold(0u128, |value, b| {
        let digit = u128::from(b.checked_sub(b'0').filter(|d| *d <= 9)?);
        value.checked_mul(10)?.checked_add(digit)
    })
}

fn check_text(text: &str) {
    let parsed = text.parse::<HashKey>();
    match reference(text) {
        Some(value) => {
            assert_eq!(parsed, Ok(HashKey(value)), "{text:?}");
            // Display is canonical: no leading zeros, and parses back.
            let shown = HashKey(value).to_string();
            assert_eq!(shown, value.to_string());
            assert_eq!(shown.trim_start_matches('0'), text.trim_start_matches('0'));
        }
        None => assert_eq!(parsed, Err(Error::HashKeySyntax), "{text:?}"),
    }
    // The JSON form is the same string: accepted exactly when the text is.
    let json = serde_json::to_string(text).expect("a str serializes");
    let from_json = serde_json::from_str::<HashKey>(&json).ok();
    assert_eq!(from_json, reference(text).map(HashKey), "{json}");
    // A keyspace accepts the keys up to its top and no others.
    let bits = 1 + (text.len() as u32 * 7) % 128;
    let keyspace = Keyspace::new(bits).expect("1..=128 bits");
    let expected = reference(text).filter(|v| *v <= keyspace.max().0);
    assert_eq!(
        keyspace.parse(text).ok(),
        expected.map(HashKey),
        "{bits} bits"
    );
}

fn check_value(value: u128) {
    let key = HashKey(value);
    assert_eq!(key.to_string().parse::<HashKey>(), Ok(key));
    assert_eq!(HashKey::from_be_bytes(key.to_be_bytes()), key);
    let json = serde_json::to_string(&key).expect("serializes");
    assert_eq!(json, format!("\"{value}\""));
    assert_eq!(serde_json::from_str::<HashKey>(&json).ok(), Some(key));
    // A JSON number is never a hash key.
    assert!(serde_json::from_str::<HashKey>(&value.to_string()).is_err());
}

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        check_text(text);
    }
    // Any JSON document: a key only when it is a string the parser takes.
    if let Ok(key) = serde_json::from_slice::<HashKey>(data) {
        let value: serde_json::Value = serde_json::from_slice(data).expect("valid JSON");
        let text = value.as_str().expect("a hash key comes from a JSON string");
        assert_eq!(reference(text), Some(key.0));
    }
    let mut bytes = [0u8; 16];
    let n = data.len().min(16);
    bytes[..n].copy_from_slice(&data[..n]);
    check_value(u128::from_be_bytes(bytes));
    // Big-endian bytes sort like the numbers they hold.
    if data.len() >= 32 {
        let a: [u8; 16] = data[..16].try_into().expect("16 bytes");
        let b: [u8; 16] = data[16..32].try_into().expect("16 bytes");
        let (ka, kb) = (HashKey::from_be_bytes(a), HashKey::from_be_bytes(b));
        assert_eq!(ka.cmp(&kb), a.cmp(&b));
    }
});
