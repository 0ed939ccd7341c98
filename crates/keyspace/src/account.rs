//! Account ids: who a hash key belongs to.

use std::fmt;

use compact_str::CompactString;

use super::Error;

/// 1..=256 bytes of UTF-8 without control characters; parsed at the edge, trusted inside.
///
/// Ids of up to 24 bytes (AWS account ids, most names) are kept inline: the registry's
/// map compares a looked-up id with the stored one without following a pointer, and a
/// million accounts take no million small allocations.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct AccountId(CompactString);

impl AccountId {
    pub const MAX_BYTES: usize = 256;

    /// `/keys/batch` is the bulk route, so no account may be called that.
    pub const RESERVED: &'static str = "batch";

    /// Validates an account id.
    pub fn parse(text: impl Into<String>) -> Result<Self, Error> {
        let text = text.into();
        if text.is_empty() || text.len() > Self::MAX_BYTES {
            return Err(Error::AccountLength);
        }
        if text.chars().any(char::is_control) {
            return Err(Error::AccountControlChar);
        }
        if text == Self::RESERVED {
            return Err(Error::AccountReserved);
        }
        Ok(AccountId(CompactString::from(text)))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    pub fn into_string(self) -> String {
        self.0.into_string()
    }
}

/// The OpenAPI schema of an account id, from the rules [`AccountId::parse`] applies.
#[cfg(feature = "openapi")]
impl utoipa::PartialSchema for AccountId {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        use utoipa::openapi::schema::{ObjectBuilder, Type};
        ObjectBuilder::new()
            .schema_type(Type::String)
            .min_length(Some(1))
            .max_length(Some(Self::MAX_BYTES))
            // No control characters (Unicode's Cc: what `char::is_control` matches).
            .pattern(Some(format!(
                r"^(?!{}$)[^\u0000-\u001f\u007f-\u009f]+$",
                Self::RESERVED
            )))
            .description(Some(format!(
                "Account id: 1..={} bytes of UTF-8 without control characters; not `{}`.",
                Self::MAX_BYTES,
                Self::RESERVED
            )))
            .into()
    }
}

#[cfg(feature = "openapi")]
impl utoipa::ToSchema for AccountId {}

impl fmt::Display for AccountId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::borrow::Borrow<str> for AccountId {
    fn borrow(&self) -> &str {
        &self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn accepts_ordinary_and_unicode_ids() {
        for ok in ["a", "acct-42", "ünïcødé 账户", &"x".repeat(256)] {
            assert_eq!(AccountId::parse(ok).unwrap().as_str(), ok);
        }
    }

    #[test]
    fn rejects_empty_long_and_control() {
        assert_eq!(AccountId::parse(""), Err(Error::AccountLength));
        assert_eq!(AccountId::parse("x".repeat(257)), Err(Error::AccountLength));
        // 129 two-byte characters: 258 bytes although only 129 chars.
        assert_eq!(AccountId::parse("é".repeat(129)), Err(Error::AccountLength));
        assert_eq!(AccountId::parse("batch"), Err(Error::AccountReserved));
        for bad in ["a\nb", "tab\t", "\u{0}", "del\u{7f}", "c1\u{85}"] {
            assert_eq!(
                AccountId::parse(bad),
                Err(Error::AccountControlChar),
                "{bad:?}"
            );
        }
    }

    proptest! {
        #[test]
        fn valid_iff_length_and_no_controls(s in "\\PC{0,300}|.{0,5}") {
            let expected = !s.is_empty() && s.len() <= 256 && !s.chars().any(char::is_control) && s != "batch";
            prop_assert_eq!(AccountId::parse(s.clone()).is_ok(), expected);
        }
    }
}
