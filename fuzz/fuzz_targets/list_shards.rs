//! `aws kinesis list-shards` JSON into a shard map. The map is accepted exactly when every
//! shard id (parents' included) is one Kinesis allows, the open shards have valid keys,
//! unique ids, are at most `MAX_SHARDS` and tile the keyspace (checked here by a
//! separate sort-and-walk); an accepted map tiles it (no gap, no overlap, in key order) and
//! its bisecting `index_of` agrees with a linear scan. Never panics.
#![no_main]

use std::collections::HashSet;

use keyspread::keyspace::{HashKey, Keyspace, ListShards, ShardMap};
use libfuzzer_sys::fuzz_target;

/// The open shards as `(id, start, end)` when they tile `[0, max]`; `None` otherwise.
fn reference(listed: &ListShards, max: u128) -> Option<Vec<(String, u128, u128)>> {
    let kinesis_id = |id: &str| {
        (1..=128).contains(&id.len())
            && id.bytes().all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b))
    };
    let ids = listed.shards.iter().flat_map(|s| {
        [Some(&s.shard_id), s.parent_shard_id.as_ref(), s.adjacent_parent_shard_id.as_ref()]
    });
    if !ids.flatten().all(|id| kinesis_id(id)) {
        return None;
    }
    let mut open = Vec::new();
    for s in listed.shards.iter().filter(|s| s.is_open()) {
        let range = &s.hash_key_range;
        let start = range.starting_hash_key.parse::<HashKey>().ok()?.0;
        let end = range.ending_hash_key.parse::<HashKey>().ok()?.0;
        open.push((s.shard_id.clone(), start, end));
    }
    if open.is_empty() || open.len() > 10_000 {
        return None;
    }
    let ids: HashSet<&str> = open.iter().map(|(id, _, _)| id.as_str()).collect();
    if ids.len() != open.len() {
        return None;
    }
    open.sort_by_key(|(_, start, _)| *start);
    // Each shard starts one past where the one before ended; the last ends at the top.
    let mut next = Some(0u128);
    for (_, start, end) in &open {
        if Some(*start) != next || start > end || *end > max {
            return None;
        }
        next = end.checked_add(1);
    }
    (open.last()?.2 == max).then_some(open)
}

fn check_map(map: &ShardMap, expected: &[(String, u128, u128)], max: u128, probes: &[u128]) {
    assert_eq!(map.len(), expected.len());
    let shards: Vec<_> = map.iter().collect();
    for (i, (shard, (id, start, end))) in shards.iter().zip(expected).enumerate() {
        assert_eq!(shard.index, i);
        assert_eq!((&shard.id, shard.start.0, shard.end.0), (id, *start, *end));
        assert_eq!(map.shard(i), *shard);
    }
    assert_eq!(shards[0].start.0, 0, "no gap at the bottom");
    assert_eq!(shards[shards.len() - 1].end.0, max, "no gap at the top");
    for pair in shards.windows(2) {
        assert_eq!(
            pair[0].end.0.checked_add(1),
            Some(pair[1].start.0),
            "no gap, no overlap"
        );
    }
    let scan = |key: u128| {
        shards
            .iter()
            .position(|s| s.start.0 <= key && key <= s.end.0)
    };
    let boundaries = shards.iter().flat_map(|s| {
        let (a, b) = (s.start.0, s.end.0);
        [a, b, a.wrapping_sub(1), b.wrapping_add(1), a + (b - a) / 2]
    });
    for key in boundaries
        .chain(probes.iter().copied())
        .filter(|k| *k <= max)
    {
        let index = map.index_of(HashKey(key));
        assert_eq!(Some(index), scan(key), "index_of({key})");
        let shard = map.shard_of(HashKey(key));
        assert!(shard.start.0 <= key && key <= shard.end.0);
    }
}

fuzz_target!(|data: &[u8]| {
    let Ok(listed) = ListShards::parse(data) else {
        return;
    };
    // Never panics, and numbers past every shard that has a number.
    let next = listed.next_shard_number();
    for number in listed.shards.iter().filter_map(|s| s.number()) {
        assert!(number < next, "shard number {number} not below {next}");
    }
    // Probe keys taken from the input's bytes, wherever they fall.
    let probes: Vec<u128> = data
        .chunks(16)
        .map(|c| {
            let mut bytes = [0u8; 16];
            bytes[..c.len()].copy_from_slice(c);
            u128::from_be_bytes(bytes)
        })
        .take(32)
        .collect();
    for bits in [128, 64, 8, 2, 1] {
        let keyspace = Keyspace::new(bits).expect("valid bits");
        let max = keyspace.max().0;
        let probes: Vec<u128> = probes.iter().map(|p| p & max).collect();
        match (listed.open_map(keyspace), reference(&listed, max)) {
            (Ok(map), Some(expected)) => check_map(&map, &expected, max, &probes),
            (Err(_), None) => {}
            (got, expected) => panic!("{bits} bits: open_map {got:?}, expected {expected:?}"),
        }
    }
});
