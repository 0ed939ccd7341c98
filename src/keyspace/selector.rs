//! Which of an account's keys a record goes under: the jump hash of its sub-key.

use md5::{Digest, Md5};

/// Lamping and Veach's jump consistent hash: a bucket in `0..buckets` for `key`.
pub fn jump(mut key: u64, buckets: u32) -> u32 {
    let (mut b, mut j) = (-1i64, 0i64);
    while j < i64::from(buckets) {
        b = j;
        key = key.wrapping_mul(2862933555777941757).wrapping_add(1);
        j = ((b + 1) as f64 * (f64::from(1u32 << 31) / ((key >> 33) + 1) as f64)) as i64;
    }
    b as u32
}

/// The index of the key a record of `sub_key` goes under, for an account of `fanout` keys.
pub fn sub_key_index(sub_key: &str, fanout: u32) -> u32 {
    let digest: [u8; 16] = Md5::digest(sub_key.as_bytes()).into();
    jump(
        u64::from_be_bytes(digest[..8].try_into().expect("8 bytes")),
        fanout,
    )
}
