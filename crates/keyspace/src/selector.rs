//! Which of an account's keys a record uses: its sub-key (an order id, a user id) picks an
//! index in `0..fanout` by jump consistent hash, so growing the fanout moves few sub-keys.

use md5::{Digest, Md5};

/// Lamping and Veach's jump consistent hash: the bucket in `0..buckets` for `key`. Going
/// from `buckets` to `buckets + 1` moves a key only into the new bucket. Panics on 0 buckets.
pub fn jump(mut key: u64, buckets: u32) -> u32 {
    assert!(buckets > 0, "jump needs at least one bucket");
    let (mut b, mut j) = (-1i64, 0i64);
    while j < i64::from(buckets) {
        b = j;
        key = key.wrapping_mul(2862933555777941757).wrapping_add(1);
        j = ((b + 1) as f64 * (1u64 << 31) as f64 / ((key >> 33) + 1) as f64) as i64;
    }
    b as u32
}

/// The index of the key that records with `sub_key` use, of an account holding `fanout` keys.
pub fn sub_key_index(sub_key: &str, fanout: u32) -> u32 {
    let digest = Md5::digest(sub_key.as_bytes());
    let head = u64::from_be_bytes(digest[..8].try_into().expect("a 16-byte digest"));
    jump(head, fanout)
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    const FANOUTS: [u32; 8] = [1, 2, 3, 4, 5, 8, 16, 100];

    #[test]
    fn design_test_vectors() {
        let vectors: [(&str, [u32; 8]); 3] = [
            ("order-1", [0, 0, 2, 3, 3, 3, 11, 44]),
            ("user-42", [0, 1, 2, 3, 3, 7, 7, 45]),
            ("", [0, 1, 1, 3, 3, 3, 11, 11]),
        ];
        for (sub_key, want) in vectors {
            let got = FANOUTS.map(|k| sub_key_index(sub_key, k));
            assert_eq!(got, want, "{sub_key:?}");
        }
    }

    #[test]
    fn jump_on_known_keys() {
        // The first 8 bytes of MD5("order-1"), big-endian, as sub_key_index reads them.
        let head = u64::from_be_bytes(Md5::digest(b"order-1")[..8].try_into().unwrap());
        assert_eq!(jump(head, 100), 44);
        assert_eq!(jump(0, 1), 0);
        // Key 0: the generator's first step gives 1, so j = 2^31 / 1 and bucket 0 stays.
        assert_eq!(jump(0, 1024), 0);
    }

    /// The quotient is taken as one f64 division of `(b + 1) * 2^31`, which is exact, so an
    /// exact integer stays one: here 49 * 2^31 / 1644167168 = 64 ends the walk at K = 64.
    /// The paper's `(b + 1) * (2^31 / x)` rounds twice, gets 63 and answers 63.
    #[test]
    fn exact_quotients_stay_exact() {
        let key = 1_673_232_497_983_283_878;
        assert_eq!([63, 64, 65].map(|k| jump(key, k)), [48, 48, 64]);
    }

    #[test]
    fn sub_keys_spread_evenly() {
        let fanout = 8;
        let mut counts = [0u32; 8];
        for i in 1..=80_000 {
            counts[sub_key_index(&format!("order-{i}"), fanout) as usize] += 1;
        }
        // 10,000 expected per index; a binomial standard deviation is about 94.
        assert!(
            counts.iter().all(|c| c.abs_diff(10_000) < 500),
            "{counts:?}"
        );
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        #[test]
        fn index_is_below_the_fanout(sub_key in ".{0,40}", fanout in 1u32..=1024) {
            prop_assert!(sub_key_index(&sub_key, fanout) < fanout);
        }

        /// Growing the fanout by one moves a sub-key only onto the new index.
        #[test]
        fn growing_moves_only_to_the_new_index(key in any::<u64>(), fanout in 1u32..1024) {
            let before = jump(key, fanout);
            let after = jump(key, fanout + 1);
            prop_assert!(after == before || after == fanout, "{before} -> {after}");
        }
    }
}
