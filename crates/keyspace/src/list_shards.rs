//! The JSON `aws kinesis list-shards` prints, read into a shard map.

use serde::Deserialize;

use super::lease_state::LeaseShard;
use super::shards::{MAX_SHARDS, ShardMap};
use super::{Error, HashKey, Keyspace};

/// Whether `name` is a valid Kinesis stream name or shard id: 1 to 128 characters of
/// `a-z A-Z 0-9 _ . -` (the API reference's pattern for both).
pub fn is_kinesis_name(name: &str) -> bool {
    (1..=128).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b))
}

/// The number in `shardId-000000000042`, if the id has that form: exactly 12 digits, so the
/// next number always fits.
pub fn shard_number(id: &str) -> Option<u64> {
    let digits = id.strip_prefix("shardId-")?;
    if digits.len() != 12 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// `aws kinesis list-shards --stream-name X` output, as-is.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct ListShards {
    pub shards: Vec<ListedShard>,
}

/// One shard as list-shards prints it; closed shards included.
#[derive(Debug, Clone, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "PascalCase")]
pub struct ListedShard {
    #[cfg_attr(feature = "openapi", schema(pattern = r"^[a-zA-Z0-9_.-]{1,128}$"))]
    pub shard_id: String,
    #[cfg_attr(feature = "openapi", schema(pattern = r"^[a-zA-Z0-9_.-]{1,128}$"))]
    pub parent_shard_id: Option<String>,
    #[cfg_attr(feature = "openapi", schema(pattern = r"^[a-zA-Z0-9_.-]{1,128}$"))]
    pub adjacent_parent_shard_id: Option<String>,
    pub hash_key_range: HashKeyRange,
    pub sequence_number_range: SequenceNumberRange,
}

/// The hash keys a shard owns, inclusive, as decimal strings.
#[derive(Debug, Clone, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "PascalCase")]
pub struct HashKeyRange {
    pub starting_hash_key: String,
    pub ending_hash_key: String,
}

/// A shard is open while it has no ending sequence number.
#[derive(Debug, Clone, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "PascalCase")]
pub struct SequenceNumberRange {
    pub starting_sequence_number: Option<String>,
    pub ending_sequence_number: Option<String>,
}

impl ListedShard {
    /// The hash key range, parsed.
    fn range(&self) -> Result<(HashKey, HashKey), Error> {
        let key = |text: &str, field: &str| {
            text.parse::<HashKey>()
                .map_err(|e| Error::Tiling(format!("{}: {field} {text:?}: {e}", self.shard_id)))
        };
        let range = &self.hash_key_range;
        Ok((
            key(&range.starting_hash_key, "StartingHashKey")?,
            key(&range.ending_hash_key, "EndingHashKey")?,
        ))
    }

    /// Open shards have no ending sequence number.
    pub fn is_open(&self) -> bool {
        self.sequence_number_range.ending_sequence_number.is_none()
    }

    /// The number in its id (see [`shard_number`]).
    pub fn number(&self) -> Option<u64> {
        shard_number(&self.shard_id)
    }
}

impl ListShards {
    /// Parses list-shards output.
    pub fn parse(json: &[u8]) -> Result<Self, Error> {
        serde_json::from_slice(json).map_err(|e| Error::ListShards(e.to_string()))
    }

    /// The map of the open shards, checked to tile the keyspace, with ids Kinesis allows
    /// and at most [`MAX_SHARDS`] of them.
    pub fn open_map(&self, keyspace: Keyspace) -> Result<ShardMap, Error> {
        self.check_ids()?;
        let open = self
            .shards
            .iter()
            .filter(|s| s.is_open())
            .map(|s| {
                let (start, end) = s.range()?;
                Ok((s.shard_id.clone(), start, end))
            })
            .collect::<Result<Vec<_>, Error>>()?;
        if open.len() > MAX_SHARDS as usize {
            return Err(Error::ShardCount {
                got: open.len() as u64,
                max: u64::from(MAX_SHARDS),
            });
        }
        ShardMap::explicit(keyspace, open)
    }

    /// Every shard consumers read, closed ones included, with its parents; each id once,
    /// each range within the keyspace. Call after [`ListShards::open_map`] (which checks
    /// the ids and the open shards' tiling).
    pub fn lease_shards(&self, keyspace: Keyspace) -> Result<Vec<LeaseShard>, Error> {
        let mut seen = std::collections::HashSet::new();
        self.shards
            .iter()
            .map(|s| {
                if !seen.insert(s.shard_id.as_str()) {
                    return Err(Error::ListShards(format!(
                        "ShardId {:?} is listed twice",
                        s.shard_id
                    )));
                }
                let (start, end) = s.range()?;
                if start > end || end > keyspace.max() {
                    return Err(Error::Tiling(format!(
                        "{}: hash key range {start}..={end} is not within the keyspace",
                        s.shard_id
                    )));
                }
                let parents = [&s.parent_shard_id, &s.adjacent_parent_shard_id];
                Ok(LeaseShard {
                    id: s.shard_id.clone(),
                    start,
                    end,
                    parents: parents.into_iter().flatten().cloned().collect(),
                    closed: !s.is_open(),
                })
            })
            .collect()
    }

    /// Every shard id, parents' included, is one Kinesis could have given.
    fn check_ids(&self) -> Result<(), Error> {
        for s in &self.shards {
            let parents = [
                ("ParentShardId", &s.parent_shard_id),
                ("AdjacentParentShardId", &s.adjacent_parent_shard_id),
            ];
            let named = parents
                .into_iter()
                .filter_map(|(field, id)| Some((field, id.as_deref()?)));
            for (field, id) in std::iter::once(("ShardId", s.shard_id.as_str())).chain(named) {
                if !is_kinesis_name(id) {
                    return Err(Error::ListShards(format!(
                        "{field} {id:?} must be 1 to 128 characters of a-z, A-Z, 0-9, '_', '.', '-'"
                    )));
                }
            }
        }
        Ok(())
    }

    /// One past the highest shard number ever used: Kinesis numbers new shards upwards.
    pub fn next_shard_number(&self) -> u64 {
        self.shards
            .iter()
            .filter_map(ListedShard::number)
            .max()
            .map_or(0, |n| n + 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const AFTER_SPLIT: &str = r#"{
      "Shards": [
        {"ShardId": "shardId-000000000000",
         "HashKeyRange": {"StartingHashKey": "0", "EndingHashKey": "340282366920938463463374607431768211455"},
         "SequenceNumberRange": {"StartingSequenceNumber": "4959", "EndingSequenceNumber": "4960"}},
        {"ShardId": "shardId-000000000001", "ParentShardId": "shardId-000000000000",
         "HashKeyRange": {"StartingHashKey": "0", "EndingHashKey": "170141183460469231731687303715884105727"},
         "SequenceNumberRange": {"StartingSequenceNumber": "4961"}},
        {"ShardId": "shardId-000000000002", "ParentShardId": "shardId-000000000000",
         "HashKeyRange": {"StartingHashKey": "170141183460469231731687303715884105728", "EndingHashKey": "340282366920938463463374607431768211455"},
         "SequenceNumberRange": {"StartingSequenceNumber": "4962"}}
      ],
      "NextToken": null
    }"#;

    #[test]
    fn reads_the_open_shards_of_a_split_stream() {
        let listed = ListShards::parse(AFTER_SPLIT.as_bytes()).unwrap();
        let map = listed.open_map(Keyspace::KINESIS).unwrap();
        assert_eq!(map.len(), 2, "the closed parent is left out");
        assert_eq!(map.shard(1).id, "shardId-000000000002");
        assert_eq!(listed.next_shard_number(), 3);
    }

    #[test]
    fn names_the_shard_with_a_bad_key() {
        let bad = AFTER_SPLIT.replace(
            "\"170141183460469231731687303715884105728\"",
            "\"17014118346046923173168730371588410572x\"",
        );
        let err = ListShards::parse(bad.as_bytes())
            .unwrap()
            .open_map(Keyspace::KINESIS)
            .unwrap_err();
        assert!(
            err.to_string()
                .contains("shardId-000000000002: StartingHashKey"),
            "{err}"
        );
        assert!(ListShards::parse(b"{\"Streams\": []}").is_err());
    }

    #[test]
    fn shard_ids_are_what_kinesis_allows() {
        let listed = ListShards::parse(AFTER_SPLIT.as_bytes()).unwrap();
        let widest = format!("{}_.-", "aZ9".repeat(41));
        let long = "s".repeat(129);
        for (id, ok) in [
            (widest.as_str(), true),
            ("a$(touch x)", false),
            ("a b", false),
            ("", false),
            ("shard\nId", false),
            ("ü", false),
            ("a'b", false),
            (long.as_str(), false),
        ] {
            let mut own = listed.clone();
            own.shards[2].shard_id = id.to_owned();
            let mut parent = listed.clone();
            parent.shards[2].adjacent_parent_shard_id = Some(id.to_owned());
            for (field, listed) in [("ShardId", own), ("AdjacentParentShardId", parent)] {
                match listed.open_map(Keyspace::KINESIS) {
                    Ok(_) => assert!(ok, "{field} {id:?} accepted"),
                    Err(e) => {
                        assert!(!ok, "{field} {id:?}: {e}");
                        assert!(e.to_string().contains(&format!("{field} {id:?}")), "{e}");
                    }
                }
            }
        }
    }

    #[test]
    fn at_most_max_shards_are_open() {
        let max = u128::from(MAX_SHARDS);
        let shards: Vec<String> = (0..=max)
            .map(|i| {
                let end = if i == max { u128::MAX } else { i };
                format!(
                    r#"{{"ShardId": "shardId-{i:012}", "HashKeyRange": {{"StartingHashKey": "{i}", "EndingHashKey": "{end}"}}, "SequenceNumberRange": {{}}}}"#
                )
            })
            .collect();
        let json = format!(r#"{{"Shards": [{}]}}"#, shards.join(","));
        let err = ListShards::parse(json.as_bytes())
            .unwrap()
            .open_map(Keyspace::KINESIS)
            .unwrap_err();
        assert_eq!(
            err,
            Error::ShardCount {
                got: 10_001,
                max: 10_000
            }
        );
    }

    #[test]
    fn shard_numbers_have_kinesis_twelve_digits() {
        let listed = |id: &str| {
            let json = AFTER_SPLIT.replace("shardId-000000000002", id);
            ListShards::parse(json.as_bytes()).unwrap()
        };
        assert_eq!(listed("shardId-000000000041").next_shard_number(), 42);
        // Other forms are not numbered shards; the largest u64 used to overflow here.
        for id in [
            "shardId-18446744073709551615",
            "shardId-+00000000041",
            "shardId-41",
        ] {
            assert_eq!(listed(id).next_shard_number(), 2, "{id}");
        }
    }
}
