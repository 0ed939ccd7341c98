//! Hash keys (Kinesis `ExplicitHashKey` values) and the keyspace they live in.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::Error;

/// A 128-bit hash key; travels as a decimal string, exactly what `ExplicitHashKey` takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct HashKey(pub u128);

impl HashKey {
    /// Big-endian bytes: the stored form, whose byte order is numeric order.
    pub fn to_be_bytes(self) -> [u8; 16] {
        self.0.to_be_bytes()
    }

    /// Reads the stored big-endian form.
    pub fn from_be_bytes(bytes: [u8; 16]) -> Self {
        HashKey(u128::from_be_bytes(bytes))
    }
}

impl fmt::Display for HashKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl FromStr for HashKey {
    type Err = Error;

    /// Accepts only ASCII digits: `u128::from_str` would also take a leading `+`.
    fn from_str(s: &str) -> Result<Self, Error> {
        if s.is_empty() || s.len() > 39 || !s.bytes().all(|b| b.is_ascii_digit()) {
            return Err(Error::HashKeySyntax);
        }
        s.parse::<u128>()
            .map(HashKey)
            .map_err(|_| Error::HashKeySyntax)
    }
}

impl Serialize for HashKey {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for HashKey {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = <std::borrow::Cow<'de, str>>::deserialize(deserializer)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(feature = "openapi")]
impl utoipa::PartialSchema for HashKey {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        use utoipa::openapi::schema::{ObjectBuilder, Type};
        ObjectBuilder::new()
            .schema_type(Type::String)
            .pattern(Some("^[0-9]{1,39}$"))
            .description(Some(
                "A 128-bit hash key as a decimal string, exactly what Kinesis' ExplicitHashKey takes",
            ))
            .examples([serde_json::json!("170141183460469231731687303715884105728")])
            .into()
    }
}

#[cfg(feature = "openapi")]
impl utoipa::ToSchema for HashKey {}

/// The keyspace `[0, 2^bits)`; 128 bits in production, fewer in experiments and tests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Keyspace {
    bits: u32,
}

impl Keyspace {
    /// The full Kinesis keyspace.
    pub const KINESIS: Keyspace = Keyspace { bits: 128 };

    /// A keyspace of `bits` bits, 1..=128.
    pub fn new(bits: u32) -> Result<Self, Error> {
        if (1..=128).contains(&bits) {
            Ok(Keyspace { bits })
        } else {
            Err(Error::KeyspaceBits(bits))
        }
    }

    pub fn bits(self) -> u32 {
        self.bits
    }

    /// The largest key, `2^bits - 1`.
    pub fn max(self) -> HashKey {
        HashKey(u128::MAX >> (128 - self.bits))
    }

    /// Checks that `key` lies in the keyspace.
    pub fn check(self, key: HashKey) -> Result<HashKey, Error> {
        if key <= self.max() {
            Ok(key)
        } else {
            Err(Error::HashKeyOutOfRange {
                key,
                max: self.max(),
            })
        }
    }

    /// Parses a decimal key and checks it lies in the keyspace.
    pub fn parse(self, text: &str) -> Result<HashKey, Error> {
        self.check(text.parse()?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_decimal_only() {
        assert_eq!("0".parse::<HashKey>(), Ok(HashKey(0)));
        assert_eq!(
            "340282366920938463463374607431768211455".parse::<HashKey>(),
            Ok(HashKey(u128::MAX))
        );
        for bad in [
            "",
            "+1",
            "-1",
            " 1",
            "1 ",
            "0x10",
            "1e3",
            "340282366920938463463374607431768211456",
            "0000000000000000000000000000000000000001",
        ] {
            assert_eq!(bad.parse::<HashKey>(), Err(Error::HashKeySyntax), "{bad:?}");
        }
    }

    #[test]
    fn serializes_as_string() {
        let key = HashKey(1 << 127);
        let json = serde_json::to_string(&key).unwrap();
        assert_eq!(json, "\"170141183460469231731687303715884105728\"");
        assert_eq!(serde_json::from_str::<HashKey>(&json).unwrap(), key);
        assert!(serde_json::from_str::<HashKey>("12").is_err());
    }

    #[test]
    fn byte_order_is_numeric_order() {
        let keys = [0u128, 1, 255, 256, 1 << 64, u128::MAX - 1, u128::MAX];
        for pair in keys.windows(2) {
            assert!(HashKey(pair[0]).to_be_bytes() < HashKey(pair[1]).to_be_bytes());
        }
        assert_eq!(
            HashKey::from_be_bytes(HashKey(42).to_be_bytes()),
            HashKey(42)
        );
    }

    #[test]
    fn keyspace_bounds() {
        assert_eq!(Keyspace::new(7).unwrap().max(), HashKey(127));
        assert_eq!(Keyspace::KINESIS.max(), HashKey(u128::MAX));
        assert_eq!(Keyspace::new(1).unwrap().max(), HashKey(1));
        assert!(Keyspace::new(0).is_err());
        assert!(Keyspace::new(129).is_err());
        let small = Keyspace::new(7).unwrap();
        assert_eq!(small.parse("127"), Ok(HashKey(127)));
        assert!(matches!(
            small.parse("128"),
            Err(Error::HashKeyOutOfRange { .. })
        ));
    }
}
